//! Fault service: [`serve`] for a page, [`serve_unit`] for a 2 MB unit,
//! called from the entry (the SIGBUS handler in the faulting thread, or a
//! handler thread reading the userfaultfd).
//!
//! Everything here may run in a signal handler, so it follows the rules of
//! one: no allocation (page tables, frame pools and the region table are
//! all preallocated), no lock that the interrupted code could hold (see
//! `entry/sigbus.rs` for why none can be), and idempotence: a fault may be
//! delivered twice, or by two threads at once; the page's claim picks one
//! to serve it, and the others wait and retry the access.
//!
//! 2 MB units (seed 003) come in whole: an "in" staging unit is populated
//! (`MADV_POPULATE_WRITE`: a zeroed THP under `MADV_HUGEPAGE`), filled
//! with one 2 MB read (after a split, one read per segment of neighbouring
//! slots: `folio.rs`; a never-written unit stays zero), and moved into the region with one `UFFDIO_MOVE`.  Only the
//! destination of a move must be registered with the userfaultfd, so the
//! "in" units are not: they can be populated by faulting them in.  A move
//! in that stops part way is finished by copying: a resident unit is
//! always all there.  How units go out is in `reclaim.rs`.

use crate::pager::evict::folio;
use crate::pager::evict::reclaim;
use crate::pager::fault::readahead::{read_ahead, Lead};
use crate::pager::fault::stall::Stall;
use crate::pager::instance::inner::Inner;
use crate::pager::instance::moves::Installed;
use crate::pager::instance::page::{self, Kind, PageClaim, PageWord, UNIT_PAGES};
use crate::swap_space::SwapEntry;
use crate::sys::{monotonic_ns, page_mapped};
use crate::PAGE_SIZE;

const PAGE: u64 = PAGE_SIZE as u64;
const UNIT: u64 = page::UNIT_BYTES as u64;

/// What the kernel says of the faulting access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Access {
    /// The page was present (a write-protect fault) or not (a missing
    /// page); None when the architecture does not say.
    pub present: Option<bool>,
    /// The access was a write.
    pub write: bool,
    /// The faulting thread resumes only once the fault is served whole,
    /// its readahead window included (SIGBUS mode; a walk bringing pages
    /// in): the fault's own read may go out with its window's.  A handler
    /// thread's fault is woken as its page goes in, before the window.
    pub waits_for_window: bool,
}

/// Wait until the page's word is not claimed, noting in `stall` how long
/// (the clock is read only when there is a wait).
#[inline]
fn wait_unbusy(inner: &Inner, st: &page::PageState, stall: &mut Stall) -> PageWord {
    let mut from = 0;
    let w = st.wait_unbusy(&mut || {
        inner.counters().busy_waits.inc();
        if from == 0 {
            from = monotonic_ns();
        }
    });
    if from != 0 {
        stall.waited(monotonic_ns().saturating_sub(from));
    }
    w
}

/// Serve a fault at `addr` (page id `id`).  Returns whether the caller
/// must wake the faulting thread (handler mode): the ioctls that resolve
/// a fault wake it themselves, the paths that leave it to retry do not.
/// Where its time went besides its own work goes to `stall`.
pub(crate) fn serve(inner: &Inner, addr: u64, id: u32, access: Access, stall: &mut Stall) -> bool {
    let page = addr & !(PAGE - 1);
    let st = &inner.states()[id as usize];
    inner.counters().faults.inc();
    loop {
        let w = wait_unbusy(inner, st, stall);
        match w.kind() {
            Kind::Resident => {
                // The page tables answer where the fault context does not.
                let present = access.present.unwrap_or_else(|| page_mapped(page));
                let Some(claim) = st.try_claim(w) else {
                    continue;
                };
                return if present {
                    unprotect(inner, claim, page, id)
                } else {
                    refill(inner, claim, page, access.write)
                };
            }
            kind @ (Kind::Staged | Kind::Never | Kind::Swapped) => {
                if access.present == Some(true) {
                    // A write-protect fault on a page the reclaimer has
                    // taken since: retrying the access faults it in.
                    return true;
                }
                let Some(claim) = st.try_claim(w) else {
                    continue;
                };
                if kind == Kind::Staged {
                    // A swap-cache hit: the page is still in memory, and
                    // moving it back does not grow the resident set.
                    return unstage(inner, claim, id, page);
                }
                stall.room(reclaim::make_room(inner));
                return install(inner, claim, page, id, access);
            }
            // A poisoned page's access gets its SIGBUS from the kernel
            // (`serve_signal` passes it on; a handler thread never sees
            // it: the poison marker is not a missing page); a dead page's
            // region is being unmapped.  Nothing to serve.
            _ => return true,
        }
    }
}

/// Pages of the aligned window around a written clean page that may be
/// made writable with it (`unprotect`).
const UNPROTECT_AROUND: u32 = 16;

/// A write to a clean (write-protected) page: it is dirty from now on,
/// and the copy on its slot is stale.
///
/// While the program writes most of the clean pages it reads back from a
/// swap file (the clean gate, seal.rs), the clean neighbours of the page
/// in its aligned window of [`UNPROTECT_AROUND`] are made writable with
/// it, one `UFFDIO_WRITEPROTECT` a run: a program that reads everything
/// and then writes it (Python's exit: its collector reads every object,
/// then each is freed) took a fault a page, 229,000 at the exit of a
/// 1 GiB service.  Each neighbour is claimed first, as a clean page is
/// claimed by a write to it: nothing else can change or evict it while its
/// protection goes.  A dirty neighbour (writable already) is claimed too,
/// so that a run spans it, and left as it was.
fn unprotect(inner: &Inner, claim: PageClaim<'_>, page: u64, id: u32) -> bool {
    let w = claim.found();
    let from_disk = w
        .slot()
        .is_some_and(|e| inner.backing().devices[e.device() as usize].waits_on_disk());
    if from_disk && inner.clean_gate().written_mostly() {
        return unprotect_around(inner, claim, page, id);
    }
    if let Err(e) = inner.uffd().writeprotect(page, PAGE, false, true) {
        // The page keeps its slot and stays clean; the access retries.
        return inner.retry_later(claim, e.errno());
    }
    if let Some(e) = w.slot() {
        // A clean page, written after all.
        if from_disk {
            inner.clean_gate().written(1);
        }
        inner.free_slot(e);
    }
    if w.is_sealed() {
        inner.seal_gate().written(1);
        inner.counters().sealed_written.inc();
    }
    inner.counters().wp_faults.inc();
    inner.lru().mark_referenced(id);
    claim.commit(w.without_slot().dirty());
    false
}

/// [`unprotect`] for page `id` (claimed, clean, from a swap file) and
/// the clean pages beside it in its window.
fn unprotect_around(inner: &Inner, claim: PageClaim<'_>, page: u64, id: u32) -> bool {
    const N: usize = UNPROTECT_AROUND as usize;
    let first = id & !(UNPROTECT_AROUND - 1);
    let mut claims: [Option<PageClaim<'_>>; N] = [const { None }; N];
    let me = (id - first) as usize;
    claims[me] = Some(claim);
    // The address of window slot `k`.
    let addr_of = |k: usize| (page as i64 + (k as i64 - me as i64) * PAGE as i64) as u64;
    for (j, c) in claims.iter_mut().enumerate() {
        let nid = first + j as u32;
        if j == me || nid as usize >= inner.states().len() {
            continue;
        }
        // This region's page beside it, resident and not being served.
        if inner.addrs().get(nid) != addr_of(j) {
            continue;
        }
        let st = &inner.states()[nid as usize];
        let nw = st.load();
        if !nw.is(Kind::Resident) || nw.is_busy() || nw.is_unit() || nw.is_sealed() {
            continue;
        }
        *c = st.try_claim(nw);
    }
    // One call a run of claimed pages; the faulting page's run wakes it.
    let mut made = 0u64;
    let mut j = 0;
    while j < N {
        if claims[j].is_none() {
            j += 1;
            continue;
        }
        let start = j;
        while j < N && claims[j].is_some() {
            j += 1;
        }
        let lo = addr_of(start);
        let len = (j - start) as u64 * PAGE;
        let has_me = (start..j).contains(&me);
        if let Err(e) = inner.uffd().writeprotect(lo, len, false, has_me) {
            if has_me {
                // The page keeps its slot and stays clean; the access
                // retries.  The neighbours' claims go back untouched.
                let c = claims[me].take().expect("claimed");
                return inner.retry_later(c, e.errno());
            }
            // The neighbours stay as they were.
            for c in &mut claims[start..j] {
                c.take();
            }
            continue;
        }
        for (k, c) in claims.iter_mut().enumerate().take(j).skip(start) {
            let c = c.take().expect("claimed");
            let cw = c.found();
            if cw.is_dirty() {
                // Writable already.
                drop(c);
                continue;
            }
            if let Some(e) = cw.slot() {
                inner.free_slot(e);
            }
            made += 1;
            if k == me {
                inner.counters().wp_faults.inc();
                inner.lru().mark_referenced(id);
            } else {
                inner.counters().unprotected_around.inc();
            }
            c.commit(cw.without_slot().dirty());
        }
    }
    // Counted as written, all of them: made writable because the program
    // writes such pages, they are the gate's measure too.
    inner.clean_gate().written(made);
    false
}

/// A missing-page fault on a page that is resident: a duplicate of a fault
/// served meanwhile (the page is there: `EEXIST`), or the program
/// discarded the page itself (`MADV_DONTNEED`, `MADV_FREE`), after which
/// it reads as zeros, as a fresh anonymous page does.
fn refill(inner: &Inner, claim: PageClaim<'_>, page: u64, write: bool) -> bool {
    let w = claim.found();
    match inner.copy_zero(page, !write) {
        Ok(()) => {
            // Still resident (now a page of zeros) and on the LRU; the
            // slot's copy is of contents the program threw away.
            if let Some(e) = w.slot() {
                inner.free_slot(e);
            }
            inner.counters().discarded.inc();
            claim.commit(if write {
                PageWord::of(Kind::Resident).dirty()
            } else {
                PageWord::of(Kind::Resident)
            });
            false
        }
        Err(e) if e.errno() == Some(libc::EEXIST) => true,
        Err(e) => inner.retry_later(claim, e.errno()),
    }
}

/// Install page `id` (claimed, never written or swapped): zeros for a
/// never-touched page, its slot's contents for a swapped one.  A read
/// installs it write-protected (clean); a write installs it writable and
/// dirty.
fn install(inner: &Inner, claim: PageClaim<'_>, addr: u64, id: u32, access: Access) -> bool {
    let write = access.write;
    let w = claim.found();
    #[cfg(test)]
    inner.inject().gate();
    let Some(e) = w.slot() else {
        // Never written: zeros, no IO, no slot.
        if let Err(err) = inner.copy_zero(addr, !write) {
            return inner.retry_later(claim, err.errno());
        }
        inner.counters().zero_fills.inc();
        inner.budget().charge(1);
        claim.commit(if write {
            PageWord::of(Kind::Resident).dirty()
        } else {
            PageWord::of(Kind::Resident)
        });
        inner.lru().add(id);
        if inner.readahead() {
            read_ahead(inner, addr, id, write, false, true, None);
        }
        return false;
    };
    let mut bounce = inner.frames().bounce.hold_waiting();
    let device = &inner.backing().devices[e.device() as usize];
    let from_file = device.waits_on_disk();
    // Where the faulting thread waits for its window anyway, the page's
    // read from a swap file goes out with the window's (readahead.rs,
    // `Lead`): the window is planned and read first, this page's read the
    // first of its batch, and the window's pages go in before this one.
    let ahead = from_file && access.waits_for_window && inner.readahead() && inner.fault_read_in_batch();
    let mut read_in = false;
    if ahead {
        let mut lead = Lead {
            job: Some(crate::io::ReadJob {
                device,
                offset: e.offset(),
                buf: bounce.bytes(),
            }),
            read: false,
        };
        read_ahead(inner, addr, id, write, true, false, Some(&mut lead));
        read_in = lead.read;
    }
    let buf = bounce.bytes();
    let read = if read_in {
        inner.counters().swapins_batched.inc();
        Ok(())
    } else {
        folio::read(inner, |_| e, buf).map_err(|failed| failed.err)
    };
    match read {
        Ok(()) => {
            // A page whose copy costs the device memory (compressed) comes
            // in dirty, its slot freed; for a read, write-protected
            // (sealed) while sealed pages mostly go unwritten, so that
            // evicted again it is copied out without a move, else
            // writable (seal.rs).  A page from a swap file (or an NBD
            // export), which keeps its copy, comes in clean (its slot
            // kept) while clean pages mostly go unwritten, else writable
            // too, its copy let go: the program writes what it reads
            // (seal.rs, "Clean pages").
            let frees = !write && inner.backing().devices[e.device() as usize].frees_on_swapin(e.offset());
            let sealed = frees && inner.seal_gate().seal();
            let writable = !write && !frees && from_file && !inner.clean_gate().seal();
            let dirty = write || frees || writable;
            let shadow = claim.found().shadow();
            let copied = inner.copy(addr, buf.as_ptr(), PAGE, !dirty || sealed);
            drop(bounce);
            if let Err((_, err)) = copied {
                return inner.retry_later(claim, err.errno());
            }
            inner.counters().swapins.inc();
            inner.budget().charge(1);
            if dirty {
                // About to change: the slot's copy is stale already (or
                // the device lets its copy go).
                inner.free_slot(e);
                claim.commit(PageWord::of(Kind::Resident).dirty().sealed_if(sealed));
                if sealed {
                    inner.seal_gate().sealed(1);
                    inner.counters().sealed_in.inc();
                }
            } else {
                // Clean, and its slot still holds a valid copy.
                claim.commit(PageWord::of(Kind::Resident).with_slot(e));
                if from_file {
                    inner.clean_gate().sealed(1);
                }
            }
            // A refault: the page was needed again after it was evicted.
            // Activated when it came back soon enough to be working set
            // (workingset.rs, after mm/workingset.c); the rest go on the
            // inactive list with the pages touched once.  These
            // activations are what seed 002 batches.
            inner.lru().add(id);
            if inner.refault_activates(shadow) {
                inner.lru().activate(id);
            }
            if inner.readahead() && !ahead {
                read_ahead(inner, addr, id, write, from_file, false, None);
            }
            false
        }
        Err(err) if err.is_transient() => {
            // The device is busy or short of memory: try again, the data
            // is still on its slot.
            drop(bounce);
            inner.counters().swapin_retries.inc();
            drop(claim);
            page::pause();
            true
        }
        Err(err) => {
            drop(bounce);
            // Never zeros: poison the page so an access gets SIGBUS.
            // SAFETY: a missing page of a region whose claim we hold.
            // Not woken yet: the reason is said before the access can
            // kill the process (a handler thread's line raced the SIGBUS
            // it woke the faulting thread into).
            if let Err(perr) = unsafe { inner.uffd().poison(addr, PAGE, false) } {
                // Not even that: leave it swapped, and the access retries
                // the read.
                return inner.retry_later(claim, perr.errno());
            }
            inner.counters().read_errors.inc();
            page::log_poison(addr, PAGE, e, &err);
            inner
                .registry()
                .event(crate::stats::EventKind::PagePoisoned, addr);
            let _ = inner.uffd().wake(addr, PAGE);
            inner.free_slot(e);
            claim.commit(PageWord::of(Kind::Poisoned));
            false
        }
    }
}

/// A touch on a staged page (claimed by the caller): move it back from its
/// frame, no IO.  The moved-back page is writable, so it is taken as dirty
/// from here on and its slot freed.  Returns whether the faulting thread
/// must be woken (handler mode).
fn unstage(inner: &Inner, claim: PageClaim<'_>, id: u32, addr: u64) -> bool {
    let e: SwapEntry = claim.found().slot().expect("a staged page has a slot");
    let f = inner.staged_frame(e);
    match inner.move_in(addr, inner.frames().staging.addr(f), PAGE) {
        Ok(copied) => {
            inner.backing().swap_cache.delete(e);
            if copied {
                inner.counters().move_fallbacks.inc();
                inner.frames().staging.discard_batch(&[f]);
            }
            // The frame is empty again: reusable.
            inner.frames().staging.put(f);
            inner.free_slot(e);
            inner.counters().swapcache_hits.inc();
            inner.budget().unstage();
            // Back on the LRU, active: it was touched while on its way out.
            inner.lru().add(id);
            inner.lru().activate(id);
            claim.commit(PageWord::of(Kind::Resident).dirty());
            false
        }
        Err((_, err)) if Inner::region_gone(&err) => {
            inner.backing().swap_cache.delete(e);
            inner.discard_frames(&[f]);
            inner.free_slot(e);
            inner.budget().free_staged();
            claim.commit(PageWord::NEVER);
            true
        }
        // Neither moved nor copied: it stays staged (its cache entry and
        // ring entry with it), and the access retries.
        Err((_, err)) => inner.retry_later(claim, err.errno()),
    }
}

/// Serve a fault at `addr` in the unit whose first page is `head` at
/// `base`.
pub(crate) fn serve_unit(inner: &Inner, base: u64, head: u32, addr: u64, access: Access, stall: &mut Stall) {
    let st = &inner.states()[head as usize];
    inner.counters().faults.inc();
    loop {
        let w = wait_unbusy(inner, st, stall);
        match w.kind() {
            Kind::Never | Kind::Swapped => {
                if access.present == Some(true) {
                    // Faulted on a page of the unit before it went out.
                    return;
                }
                let Some(claim) = st.try_claim(w) else {
                    continue;
                };
                install_unit(inner, claim, base, head, stall);
                return;
            }
            Kind::Resident => {
                // The unit is in: a duplicate fault, or a page of it the
                // program discarded (MADV_DONTNEED), which reads as zeros.
                let page = addr & !(PAGE - 1);
                if access.present.unwrap_or_else(|| page_mapped(page)) {
                    return;
                }
                let Some(claim) = st.try_claim(w) else {
                    continue;
                };
                match inner.copy_zero(page, false) {
                    Ok(()) => inner.counters().discarded.inc(),
                    Err(e) if e.errno() == Some(libc::EEXIST) => {}
                    Err(e) => {
                        inner.retry_later(claim, e.errno());
                        return;
                    }
                }
                // Unchanged: resident, all there.
                drop(claim);
                return;
            }
            // Poisoned (its SIGBUS comes from the kernel) or dying.
            _ => return,
        }
    }
}

fn install_unit(inner: &Inner, claim: PageClaim<'_>, base: u64, head: u32, stall: &mut Stall) {
    let w = claim.found();
    stall.room(reclaim::make_room_for(inner, UNIT_PAGES));
    let mut unit = inner.frames().unit_in.hold_waiting();
    if !unit.populate() {
        // No memory at all: leave the unit as it was; the access retries.
        drop(unit);
        inner.retry_later(claim, Some(libc::ENOMEM));
        return;
    }
    if w.is(Kind::Swapped) {
        // Populated just now.
        let buf = unit.bytes();
        // One folio of 512 pages: one IO from a whole cluster, one per
        // segment of neighbouring slots from a split one.
        let e = w.slot().expect("a swapped unit has a slot");
        let result = if w.is_whole() {
            folio::read(inner, |i| SwapEntry::new(e.device(), e.offset() + i as u64), buf)
        } else {
            folio::read(inner, |i| inner.split_slot(head, i, w), buf)
        };
        if let Err(folio::IoFailed { slot: e, err, .. }) = result {
            // Whatever was read is not zeros: the next install of a
            // never-written unit must find this one empty.
            unit.discard();
            drop(unit);
            if err.is_transient() {
                inner.counters().swapin_retries.inc();
                drop(claim);
                page::pause();
                return;
            }
            // Never zeros: poison the whole unit.
            // SAFETY: a missing unit of a region whose claim we hold.
            // Not woken until the reason is said (as for a page).
            if let Err(perr) = unsafe { inner.uffd().poison(base, UNIT, false) } {
                inner.retry_later(claim, perr.errno());
                return;
            }
            page::log_poison(base, UNIT, e, &err);
            inner
                .registry()
                .event(crate::stats::EventKind::PagePoisoned, base);
            let _ = inner.uffd().wake(base, UNIT);
            inner.counters().read_errors.inc();
            inner.free_unit_slots(head, w);
            claim.commit(PageWord::of(Kind::Poisoned).unit());
            return;
        }
    } else {
        inner.counters().zero_fills.inc();
    }
    #[cfg(test)]
    inner.inject().gate();
    let installed = inner.put_in(base, unit.addr(), UNIT);
    if installed != Installed::Moved {
        // Copied pages leave their source behind: empty it.
        unit.discard();
    }
    drop(unit);
    if installed == Installed::Gone {
        // The program unmapped the unit meanwhile: its memory went with
        // the mapping, and its slots are of no use to anyone.
        inner.free_unit_slots(head, w);
        claim.commit(PageWord::NEVER.unit());
        return;
    }
    if w.is(Kind::Swapped) {
        inner.free_unit_slots(head, w);
        inner.counters().huge_swapins.inc();
    }
    inner.budget().charge(UNIT_PAGES);
    claim.commit(PageWord::of(Kind::Resident).dirty().unit());
    inner.lru().add(head);
}
