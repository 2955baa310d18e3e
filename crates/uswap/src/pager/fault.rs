//! Fault service: [`serve`] for a page, [`serve_unit`] for a 2 MB unit,
//! called from the entry (the SIGBUS handler in the faulting thread, or a
//! handler thread reading the userfaultfd).
//!
//! Everything here may run in a signal handler, so it follows the rules of
//! one: no allocation (page tables, frame pools and the region table are
//! all preallocated), no lock that the interrupted code could hold (see
//! `entry.rs` for why none can be), and idempotence: a fault may be
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

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

use super::folio;
use super::instance::{Inner, Installed};
use super::page::{self, PageClaim, UNIT_PAGES};
use super::reclaim;
use crate::io::BackendKind;
use crate::swap_space::SwapEntry;
use crate::sys::page_mapped;
use crate::PAGE_SIZE;

const PAGE: u64 = PAGE_SIZE as u64;
const UNIT: u64 = page::UNIT_BYTES as u64;

/// What the kernel says of the faulting access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Access {
    /// The page was present (a write-protect fault) or not (a missing
    /// page); None when the architecture does not say.
    pub present: Option<bool>,
    /// The access was a write.
    pub write: bool,
}

/// Serve a fault at `addr` (page id `id`).  Returns whether the caller
/// must wake the faulting thread (handler mode): the ioctls that resolve
/// a fault wake it themselves, the paths that leave it to retry do not.
pub(super) fn serve(inner: &Inner, addr: u64, id: u32, access: Access) -> bool {
    let page = addr & !(PAGE - 1);
    let st = &inner.states[id as usize];
    inner.counters.faults.inc();
    loop {
        let w = page::wait_unbusy(st, &mut || inner.counters.busy_waits.inc());
        match page::kind(w) {
            page::RESIDENT => {
                // The page tables answer where the fault context does not.
                let present = access.present.unwrap_or_else(|| page_mapped(page));
                let Some(claim) = PageClaim::try_claim(st, w) else {
                    continue;
                };
                return if present {
                    unprotect(inner, claim, page, id)
                } else {
                    refill(inner, claim, page, access.write)
                };
            }
            kind @ (page::STAGED | page::NEVER | page::SWAPPED) => {
                if access.present == Some(true) {
                    // A write-protect fault on a page the reclaimer has
                    // taken since: retrying the access faults it in.
                    return true;
                }
                let Some(claim) = PageClaim::try_claim(st, w) else {
                    continue;
                };
                if kind == page::STAGED {
                    // A swap-cache hit: the page is still in memory, and
                    // moving it back does not grow the resident set.
                    return unstage(inner, claim, id, page);
                }
                reclaim::make_room(inner);
                return install(inner, claim, page, id, access.write);
            }
            // A poisoned page's access gets its SIGBUS from the kernel
            // (`serve_signal` passes it on; a handler thread never sees
            // it: the poison marker is not a missing page); a dead page's
            // region is being unmapped.  Nothing to serve.
            _ => return true,
        }
    }
}

/// A write to a clean (write-protected) page: it is dirty from now on,
/// and the copy on its slot is stale.
fn unprotect(inner: &Inner, claim: PageClaim<'_>, page: u64, id: u32) -> bool {
    let w = claim.found();
    if let Err(e) = inner.uffd.writeprotect(page, PAGE, false, true) {
        // The page keeps its slot and stays clean; the access retries.
        return inner.retry_later(claim, e.errno());
    }
    if let Some(e) = page::slot(w) {
        inner.free_slot(e);
    }
    inner.counters.wp_faults.inc();
    inner.lru.mark_referenced(id);
    claim.commit(page::without_slot(w) | page::DIRTY);
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
            if let Some(e) = page::slot(w) {
                inner.free_slot(e);
            }
            inner.counters.discarded.inc();
            claim.commit(if write {
                page::RESIDENT | page::DIRTY
            } else {
                page::RESIDENT
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
fn install(inner: &Inner, claim: PageClaim<'_>, addr: u64, id: u32, write: bool) -> bool {
    let w = claim.found();
    #[cfg(test)]
    inner.inject.gate();
    let Some(e) = page::slot(w) else {
        // Never written: zeros, no IO, no slot.
        if let Err(err) = inner.copy_zero(addr, !write) {
            return inner.retry_later(claim, err.errno());
        }
        inner.counters.zero_fills.inc();
        inner.budget.resident.fetch_add(1, Ordering::Relaxed);
        claim.commit(if write {
            page::RESIDENT | page::DIRTY
        } else {
            page::RESIDENT
        });
        inner.lru.add(id);
        if inner.readahead {
            read_ahead(inner, addr, id, write, false);
        }
        return false;
    };
    let b = inner.frames.bounce.get_waiting();
    // SAFETY: we hold bounce frame `b`.
    let buf = unsafe { inner.frames.bounce.bytes(b) };
    let from_file = inner.backing.devices[e.device() as usize].kind() == BackendKind::File;
    let read = folio::read(inner, |_| e, buf).map_err(|failed| failed.err);
    match read {
        Ok(()) => {
            // A page whose copy costs the device memory (compressed) comes
            // in dirty, its slot freed, but write-protected (sealed) for a
            // read: evicted again, it is copied out without a move.
            let sealed = !write && inner.backing.devices[e.device() as usize].frees_on_swapin(e.offset());
            let dirty = write || sealed;
            let copied = inner.copy(addr, buf.as_ptr(), PAGE, !write);
            inner.frames.bounce.put(b);
            if let Err((_, err)) = copied {
                return inner.retry_later(claim, err.errno());
            }
            inner.counters.swapins.inc();
            inner.budget.resident.fetch_add(1, Ordering::Relaxed);
            if dirty {
                // About to change: the slot's copy is stale already (or
                // the device lets its copy go).
                inner.free_slot(e);
                claim.commit(page::RESIDENT | page::DIRTY | if sealed { page::SEALED } else { 0 });
            } else {
                // Clean, and its slot still holds a valid copy.
                claim.commit(page::with_slot(page::RESIDENT, e));
            }
            // A refault: the page was needed again after it was evicted.
            // The kernel activates refaults that come back soon enough
            // (mm/workingset.c); uswap activates all of them, as it does
            // swap-cache hits, so that pages touched once go first.  These
            // activations are what seed 002 batches.
            inner.lru.add(id);
            inner.lru.activate(id);
            if inner.readahead {
                read_ahead(inner, addr, id, write, from_file);
            }
            false
        }
        Err(err) if err.is_transient() => {
            // The device is busy or short of memory: try again, the data
            // is still on its slot.
            inner.frames.bounce.put(b);
            inner.counters.swapin_retries.inc();
            drop(claim);
            page::pause();
            true
        }
        Err(err) => {
            inner.frames.bounce.put(b);
            // Never zeros: poison the page so an access gets SIGBUS.
            // SAFETY: a missing page of a region whose claim we hold.
            // Not woken yet: the reason is said before the access can
            // kill the process (a handler thread's line raced the SIGBUS
            // it woke the faulting thread into).
            if let Err(perr) = unsafe { inner.uffd.poison(addr, PAGE, false) } {
                // Not even that: leave it swapped, and the access retries
                // the read.
                return inner.retry_later(claim, perr.errno());
            }
            inner.counters.read_errors.inc();
            page::log_poison(addr, PAGE, e, &err);
            inner.registry.event(crate::stats::EventKind::PagePoisoned, addr);
            let _ = inner.uffd.wake(addr, PAGE);
            inner.free_slot(e);
            claim.commit(page::POISONED);
            false
        }
    }
}

/// A touch on a staged page (claimed by the caller): move it back from its
/// frame, no IO.  The moved-back page is writable, so it is taken as dirty
/// from here on and its slot freed.  Returns whether the faulting thread
/// must be woken (handler mode).
fn unstage(inner: &Inner, claim: PageClaim<'_>, id: u32, addr: u64) -> bool {
    let e: SwapEntry = page::slot(claim.found()).expect("a staged page has a slot");
    let f = inner.staged_frame(e);
    match inner.move_in(addr, inner.frames.staging.addr(f), PAGE) {
        Ok(copied) => {
            inner.backing.swap_cache.delete(e);
            if copied {
                inner.counters.move_fallbacks.inc();
                inner.frames.staging.discard_batch(&[f]);
            }
            // The frame is empty again: reusable.
            inner.frames.staging.put(f);
            inner.free_slot(e);
            inner.counters.swapcache_hits.inc();
            inner.budget.staged.fetch_sub(1, Ordering::Relaxed);
            // Back on the LRU, active: it was touched while on its way out.
            inner.lru.add(id);
            inner.lru.activate(id);
            claim.commit(page::RESIDENT | page::DIRTY);
            false
        }
        Err((_, err)) if Inner::region_gone(&err) => {
            inner.backing.swap_cache.delete(e);
            inner.frames.staging.discard_batch(&[f]);
            inner.frames.staging.put(f);
            inner.free_slot(e);
            inner.budget.staged.fetch_sub(1, Ordering::Relaxed);
            inner.budget.resident.fetch_sub(1, Ordering::Relaxed);
            claim.commit(page::NEVER);
            true
        }
        // Neither moved nor copied: it stays staged (its cache entry and
        // ring entry with it), and the access retries.
        Err((_, err)) => inner.retry_later(claim, err.errno()),
    }
}

/// Serve a fault at `addr` in the unit whose first page is `head` at
/// `base`.
pub(super) fn serve_unit(inner: &Inner, base: u64, head: u32, addr: u64, access: Access) {
    let st = &inner.states[head as usize];
    inner.counters.faults.inc();
    loop {
        let w = page::wait_unbusy(st, &mut || inner.counters.busy_waits.inc());
        match page::kind(w) {
            page::NEVER | page::SWAPPED => {
                if access.present == Some(true) {
                    // Faulted on a page of the unit before it went out.
                    return;
                }
                let Some(claim) = PageClaim::try_claim(st, w) else {
                    continue;
                };
                install_unit(inner, claim, base, head);
                return;
            }
            page::RESIDENT => {
                // The unit is in: a duplicate fault, or a page of it the
                // program discarded (MADV_DONTNEED), which reads as zeros.
                let page = addr & !(PAGE - 1);
                if access.present.unwrap_or_else(|| page_mapped(page)) {
                    return;
                }
                let Some(claim) = PageClaim::try_claim(st, w) else {
                    continue;
                };
                match inner.copy_zero(page, false) {
                    Ok(()) => inner.counters.discarded.inc(),
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

fn install_unit(inner: &Inner, claim: PageClaim<'_>, base: u64, head: u32) {
    let w = claim.found();
    reclaim::make_room_for(inner, UNIT_PAGES);
    let pool = &inner.frames.unit_in;
    let u = pool.take();
    if !pool.populate(u) {
        // No memory at all: leave the unit as it was; the access retries.
        pool.put(u);
        inner.retry_later(claim, Some(libc::ENOMEM));
        return;
    }
    if page::kind(w) == page::SWAPPED {
        // SAFETY: we hold unit `u`, populated just now.
        let buf = unsafe { pool.bytes(u) };
        // One folio of 512 pages: one IO from a whole cluster, one per
        // segment of neighbouring slots from a split one.
        let e = page::slot(w).expect("a swapped unit has a slot");
        let result = if w & page::WHOLE != 0 {
            folio::read(inner, |i| SwapEntry::new(e.device(), e.offset() + i as u64), buf)
        } else {
            folio::read(inner, |i| inner.split_slot(head, i, w), buf)
        };
        if let Err(folio::IoFailed { slot: e, err, .. }) = result {
            // Whatever was read is not zeros: the next install of a
            // never-written unit must find this one empty.
            pool.discard(u);
            pool.put(u);
            if err.is_transient() {
                inner.counters.swapin_retries.inc();
                drop(claim);
                page::pause();
                return;
            }
            // Never zeros: poison the whole unit.
            // SAFETY: a missing unit of a region whose claim we hold.
            // Not woken until the reason is said (as for a page).
            if let Err(perr) = unsafe { inner.uffd.poison(base, UNIT, false) } {
                inner.retry_later(claim, perr.errno());
                return;
            }
            page::log_poison(base, UNIT, e, &err);
            inner.registry.event(crate::stats::EventKind::PagePoisoned, base);
            let _ = inner.uffd.wake(base, UNIT);
            inner.counters.read_errors.inc();
            inner.free_unit_slots(head, w);
            claim.commit(page::POISONED | page::UNIT);
            return;
        }
    } else {
        inner.counters.zero_fills.inc();
    }
    #[cfg(test)]
    inner.inject.gate();
    let installed = inner.put_in(base, pool.addr(u), UNIT);
    if installed != Installed::Moved {
        // Copied pages leave their source behind: empty it.
        pool.discard(u);
    }
    pool.put(u);
    if installed == Installed::Gone {
        // The program unmapped the unit meanwhile: its memory went with
        // the mapping, and its slots are of no use to anyone.
        inner.free_unit_slots(head, w);
        claim.commit(page::NEVER | page::UNIT);
        return;
    }
    if page::kind(w) == page::SWAPPED {
        inner.free_unit_slots(head, w);
        inner.counters.huge_swapins.inc();
    }
    inner.budget.resident.fetch_add(UNIT_PAGES, Ordering::Relaxed);
    claim.commit(page::RESIDENT | page::DIRTY | page::UNIT);
    inner.lru.add(head);
}

/// Most pages one fault reads ahead.
pub(super) const READAHEAD_MAX: u32 = 32;

/// A thread's readahead state: where a fault counts as in order (from
/// just past what the thread read itself to the end of what it handed the
/// prefetcher), and the window.  Per thread, as threads walk their own
/// parts of a region.
///
/// Not in thread-local storage: the fault path touches none.  A library
/// preloaded into a program (`uswap run`) reaches its thread-locals
/// through the thread's DTV, which glibc allocates for a new thread with
/// the program's `calloc`, that is in the paged heap: a SIGBUS handler
/// touching a DTV that is out would fault inside itself.  So the state
/// lives in a fixed table, a slot per hash of `pthread_self` (the thread's
/// control block, reached through the thread pointer itself), tagged with
/// its owner; a thread finding another's tag starts afresh and takes the
/// slot over.  Readahead is advice: two threads sharing a slot only read
/// ahead less well, and a torn read of a slot only mistakes the window.
struct Readahead {
    owner: AtomicU64,
    lo: AtomicU64,
    hi: AtomicU64,
    window: AtomicU32,
}

const READAHEAD_SLOTS: usize = 64;
static READAHEAD: [CachePadded<Readahead>; READAHEAD_SLOTS] = [const {
    CachePadded::new(Readahead {
        owner: AtomicU64::new(0),
        lo: AtomicU64::new(0),
        hi: AtomicU64::new(0),
        window: AtomicU32::new(0),
    })
}; READAHEAD_SLOTS];

impl Readahead {
    /// The calling thread's slot, and its tag.
    fn mine() -> (&'static Readahead, u64) {
        // SAFETY: pthread_self has no preconditions (it reads the thread
        // pointer).
        let me = unsafe { libc::pthread_self() } as u64;
        let slot = (me.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 58) as usize % READAHEAD_SLOTS;
        (&READAHEAD[slot], me)
    }

    /// This thread's (lo, hi, window); zeros if the slot is another's.
    fn get() -> (u64, u64, u32) {
        let (r, me) = Self::mine();
        if r.owner.load(Ordering::Relaxed) != me {
            return (0, 0, 0);
        }
        (
            r.lo.load(Ordering::Relaxed),
            r.hi.load(Ordering::Relaxed),
            r.window.load(Ordering::Relaxed),
        )
    }

    fn set(lo: u64, hi: u64, window: u32) {
        let (r, me) = Self::mine();
        r.owner.store(me, Ordering::Relaxed);
        r.lo.store(lo, Ordering::Relaxed);
        r.hi.store(hi, Ordering::Relaxed);
        r.window.store(window.min(READAHEAD_MAX), Ordering::Relaxed);
    }
}

/// Readahead after the fault on page `id` at `addr` (the kernel's
/// `swap_vma_readahead`, and fault-around for never-written pages): the
/// window doubles, from 2 to [`READAHEAD_MAX`], while faults come where
/// the last readahead ended, and halves otherwise; up to that many of the
/// following pages that are swapped out or never written are installed,
/// under their own claims, a run of alike pages (a run of neighbouring
/// slots read with one IO) with one `UFFDIO_COPY`.  A page is only ever
/// installed where it is missing and claimed, so a program's write to it
/// waits for the install and then takes its write-protect fault if it
/// went in clean: nothing it writes is overwritten.  It stops at the first
/// page that is neither, not this region's next page, claimed by someone
/// else, or would take the resident set over budget (readahead never
/// reclaims), and on any error (the page stays as it was; a fault on it
/// does the work and handles the error).
///
/// How a page goes in: read from RAM, writable and dirty (a program's
/// write to it then costs nothing, where a clean page's first write is a
/// write-protect fault and a TLB flush: pmbench's linear walk at 80% reads
/// ran 9% slower with clean read-ahead pages than with none, and writing
/// it back to RAM costs half a microsecond); read from a file, clean,
/// keeping its slot (writing it back would be an IO); never written, as
/// the fault's own page went in (a write fault: writable and dirty, so a
/// sequential writer takes one fault per run, not per page).
fn read_ahead(inner: &Inner, addr: u64, id: u32, write: bool, from_file: bool) {
    let (lo, hi, window) = Readahead::get();
    let window = if lo != 0 && lo <= addr && addr <= hi {
        (window * 2).clamp(2, READAHEAD_MAX)
    } else {
        window / 2
    };
    // After a read from a swap file, this thread reads a quarter of the
    // window itself and hands the prefetcher the window after it, to be
    // read while the program uses what is in already.  (Zero fills and
    // reads from RAM cost less than the hand-over: done here, whole.)
    let prefetch = from_file && inner.prefetch.on && window >= 4;
    let sync = if prefetch { window / 4 } else { window };
    let mut done = 0;
    while done < sync {
        let k = read_ahead_run(
            inner,
            addr + PAGE * (1 + done as u64),
            id + 1 + done,
            sync - done,
            write,
        );
        if k == 0 {
            break;
        }
        done += k;
    }
    let end = addr + PAGE * (1 + done as u64);
    if prefetch && done == sync {
        inner.prefetch.post(id + 1 + done, end, window, write);
        Readahead::set(end, end + PAGE * window as u64, window);
    } else {
        Readahead::set(end, end, window);
    }
}

/// The prefetcher's part: read ahead `pages` pages from page `id` at
/// `addr`, run by run, stepping over pages that are in already.
pub(super) fn read_ahead_range(inner: &Inner, addr: u64, id: u32, pages: u32, write: bool) {
    let mut done = 0;
    while done < pages {
        let k = read_ahead_run(inner, addr + PAGE * done as u64, id + done, pages - done, write);
        if k == 0 {
            // In already, claimed, another region's, or over budget: one
            // page on (a claimed page is being served by its fault).
            let nid = (id + done) as usize;
            if inner.addrs.get(nid as u32) != addr + PAGE * done as u64
                || inner.budget.resident.load(Ordering::Relaxed) + 1 >= inner.budget.limit()
            {
                return;
            }
            done += 1;
            continue;
        }
        inner.counters.prefetched.add(u64::from(k));
        done += k;
    }
}

/// Install the run of alike pages at `addr` (page `id` on), at most `max`:
/// returns how many went in.
fn read_ahead_run(inner: &Inner, addr: u64, id: u32, max: u32, write: bool) -> u32 {
    const MAX: usize = READAHEAD_MAX as usize;
    let mut claims: [Option<PageClaim<'_>>; MAX] = [const { None }; MAX];
    let mut slots = [SwapEntry::NONE; MAX];
    let (mut never, mut dirty, mut device) = (false, false, 0);
    let mut n = 0;
    while n < max as usize {
        let (nid, naddr) = (id as usize + n, addr + PAGE * n as u64);
        if nid >= inner.states.len()
            || inner.addrs.get(nid as u32) != naddr
            || inner.budget.resident.load(Ordering::Relaxed) + n + 1 >= inner.budget.limit()
        {
            break;
        }
        let st = &inner.states[nid];
        let w = st.load(Ordering::Acquire);
        let kind = page::kind(w);
        if (kind != page::SWAPPED && kind != page::NEVER) || w & (page::BUSY | page::UNIT) != 0 {
            break;
        }
        let e = page::slot(w);
        let this_never = kind == page::NEVER;
        let this_device = e.map_or(0, |e| e.device());
        let this_dirty = match e {
            None => write,
            Some(e) => {
                let dev = &inner.backing.devices[e.device() as usize];
                dev.kind() == BackendKind::Ram || dev.frees_on_swapin(e.offset())
            }
        };
        if n > 0 && (this_never != never || this_dirty != dirty || this_device != device) {
            break;
        }
        let Some(claim) = PageClaim::try_claim(st, w) else {
            break;
        };
        (never, dirty, device) = (this_never, this_dirty, this_device);
        slots[n] = e.unwrap_or(SwapEntry::NONE);
        claims[n] = Some(claim);
        n += 1;
    }
    if n == 0 {
        return 0;
    }
    // Pages let go by a compressed device come in sealed (see serve).
    let sealed = !never && dirty && inner.backing.devices[device as usize].kind() == BackendKind::Compressed;
    // Neighbouring bounce frames for a swapped run (as many as there
    // are: the run shrinks to fit), read with one IO where its slots are
    // neighbours too; a never-written run copies from the zero pages.
    let mut frames = None;
    let src = if never {
        inner.frames.zero.addr()
    } else {
        let pool = &inner.frames.bounce;
        let mut nb = n;
        let b0 = loop {
            if let Some(b0) = pool.get_run(nb as u32) {
                break Some(b0);
            }
            nb /= 2;
            if nb == 0 {
                break None;
            }
        };
        let Some(b0) = b0 else {
            return 0;
        };
        frames = Some((b0, nb));
        n = nb;
        // SAFETY: we hold bounce frames `b0..b0 + nb`.
        let buf = unsafe { pool.run_bytes(b0, nb) };
        // One IO per segment of neighbouring slots; a failed one ends the
        // run where it starts.
        if let Err(failed) = folio::read(inner, |j| slots[j], buf) {
            n = failed.done;
        }
        pool.addr(b0)
    };
    let copied = if n == 0 {
        0
    } else {
        match inner.copy(addr, src as *const u8, n as u64 * PAGE, !dirty || sealed) {
            Ok(()) => n,
            Err((done, _)) => (done / PAGE) as usize,
        }
    };
    if let Some((b0, nb)) = frames {
        for b in b0..b0 + nb as u32 {
            inner.frames.bounce.put(b);
        }
    }
    // What went in is committed; the claims of the rest are dropped,
    // leaving those pages as they were.
    for (j, claim) in claims.iter_mut().enumerate().take(copied) {
        let claim = claim.take().expect("claimed");
        let nid = id + j as u32;
        inner.budget.resident.fetch_add(1, Ordering::Relaxed);
        let next = if never {
            inner.counters.fault_around.inc();
            if dirty {
                page::RESIDENT | page::DIRTY
            } else {
                page::RESIDENT
            }
        } else {
            inner.counters.readahead.inc();
            if dirty {
                inner.free_slot(slots[j]);
                page::RESIDENT | page::DIRTY | if sealed { page::SEALED } else { 0 }
            } else {
                page::with_slot(page::RESIDENT, slots[j])
            }
        };
        claim.commit(next);
        // Inactive: read ahead, not yet used; the first to go if unused.
        inner.lru.add(nid);
    }
    copied as u32
}
