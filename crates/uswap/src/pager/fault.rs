//! Fault service: one routine, [`serve`], called from the SIGBUS handler
//! in the faulting thread (`signals.rs`) or from handler threads reading
//! the userfaultfd.
//!
//! Everything here may run in a signal handler, so it follows the rules of
//! one: no allocation (page tables, frame pools and the region table are
//! all preallocated), no lock that the interrupted code could hold (see
//! `signals.rs` for why none can be), and idempotence: a fault may be
//! delivered twice, or by two threads at once; the page's claim picks one
//! to serve it, and the others wait and retry the access.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Weak;
use std::thread::JoinHandle;

use super::page::{self, PageClaim};
use super::signals::{self, Access};
use super::{reclaim, report, Inner, MAX_REGIONS};
use crate::PAGE_SIZE;

const PAGE: u64 = PAGE_SIZE as u64;

/// How faults are served.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FaultMode {
    /// The faulting thread serves its own fault in a SIGBUS handler
    /// (`UFFD_FEATURE_SIGBUS`): no hand-off to another thread, which costs
    /// 30-120 us on a VM.  Faults raised inside the kernel (`read(2)` into a
    /// region) fail with `EFAULT` in this mode, and a thread that blocks
    /// SIGBUS cannot be served (the kernel kills the process).
    #[default]
    Sigbus,
    /// Handler threads read fault events and serve them; the faulting
    /// thread sleeps until woken.  Serves kernel-raised faults too, and
    /// threads that block SIGBUS.
    HandlerThread,
}

/// One published region: where it is and whose it is.  Set before the
/// region is usable and cleared before it is unmapped; the SIGBUS handler
/// reads it without locks.
struct RegionEntry {
    base: AtomicU64,
    end: AtomicU64,
    id_base: AtomicU32,
    /// Paged in 2 MB units.
    huge: AtomicBool,
    inner: AtomicPtr<Inner>,
}

static REGIONS: [RegionEntry; MAX_REGIONS] = [const {
    RegionEntry {
        base: AtomicU64::new(0),
        end: AtomicU64::new(0),
        id_base: AtomicU32::new(0),
        huge: AtomicBool::new(false),
        inner: AtomicPtr::new(std::ptr::null_mut()),
    }
}; MAX_REGIONS];

/// How many leading entries of `REGIONS` have ever been used: the scans
/// stop there instead of reading the whole table on every fault.  Only
/// grows; raised before an entry is filled in, so whoever can see the
/// entry's `base` sees the mark too.
static USED: AtomicUsize = AtomicUsize::new(0);

/// The entries that may be in use.
fn used_entries() -> &'static [RegionEntry] {
    &REGIONS[..USED.load(Ordering::Acquire).min(MAX_REGIONS)]
}

/// Publish a region; returns its table slot, or None when the table is full.
pub(super) fn publish_region(
    base: u64,
    len: u64,
    id_base: u32,
    inner: *const Inner,
    huge: bool,
) -> Option<usize> {
    for (i, r) in REGIONS.iter().enumerate() {
        // Claim a free entry by its `inner` pointer, then fill it in;
        // `base` goes last, so a reader that sees it sees the rest.
        if r.inner
            .compare_exchange(
                std::ptr::null_mut(),
                inner as *mut Inner,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
        {
            USED.fetch_max(i + 1, Ordering::AcqRel);
            r.id_base.store(id_base, Ordering::Relaxed);
            r.huge.store(huge, Ordering::Relaxed);
            r.end.store(base + len, Ordering::Relaxed);
            r.base.store(base, Ordering::Release);
            return Some(i);
        }
    }
    None
}

/// Withdraw a region's entry.
pub(super) fn unpublish_region(slot: usize) {
    let r = &REGIONS[slot];
    r.base.store(0, Ordering::Release);
    r.end.store(0, Ordering::Relaxed);
    r.inner.store(std::ptr::null_mut(), Ordering::Release);
}

/// Whether a published region overlaps `[base, base + len)`.
pub(super) fn overlaps_a_region(base: u64, len: u64) -> bool {
    used_entries().iter().any(|r| {
        let b = r.base.load(Ordering::Acquire);
        b != 0 && b < base + len && base < r.end.load(Ordering::Relaxed)
    })
}

/// What a fault address is in.
struct Hit {
    inner: *const Inner,
    /// The page id of the address, or of its unit's first page.
    id: u32,
    /// Some(unit start) for a 2 MB-unit region.
    unit: Option<u64>,
}

/// The region holding `addr`: its instance and the page id of `addr`.
fn lookup(addr: u64) -> Option<Hit> {
    for r in used_entries() {
        let base = r.base.load(Ordering::Acquire);
        if base == 0 || addr < base || addr >= r.end.load(Ordering::Relaxed) {
            continue;
        }
        let inner = r.inner.load(Ordering::Acquire);
        if inner.is_null() {
            continue;
        }
        let mut id = r.id_base.load(Ordering::Relaxed) + ((addr - base) / PAGE) as u32;
        let mut unit = None;
        if r.huge.load(Ordering::Relaxed) {
            let u = (addr - base) / super::unit::UNIT_BYTES as u64;
            id = r.id_base.load(Ordering::Relaxed) + (u as usize * super::unit::UNIT_PAGES) as u32;
            unit = Some(base + u * super::unit::UNIT_BYTES as u64);
        }
        return Some(Hit { inner, id, unit });
    }
    None
}

/// Serve a SIGBUS fault at `addr`; false when it is not in a region (the
/// signal is then the program's).
pub(super) fn serve_signal(addr: u64, access: Access) -> bool {
    let Some(Hit { inner, id, unit }) = lookup(addr) else {
        return false;
    };
    // SAFETY: an entry is published only while its region, which holds
    // the instance alive, exists; a fault in a region means it exists.
    let inner = unsafe { &*inner };
    // A poisoned page (or unit) faults as a missing one where the kernel
    // has no memory-failure support (CONFIG_MEMORY_FAILURE off, as on this
    // machine kind: BUS_ADRERR instead of BUS_MCEERR_AR).  Its SIGBUS is
    // the program's: serving it would repeat the access forever.
    if page::kind(inner.states[id as usize].load(Ordering::Acquire)) == page::POISONED {
        return false;
    }
    match unit {
        Some(base) => {
            super::unit::serve(inner, base, id, addr, access);
        }
        None => {
            serve(inner, addr, id, access);
        }
    }
    true
}

/// Whether the page at `page` is mapped, from the page tables: for the
/// architectures whose fault context does not say.
pub(super) fn mapped(page: u64) -> bool {
    let mut v = 0u8;
    // SAFETY: mincore writes one byte for one page and reads no memory.
    unsafe { libc::mincore(page as *mut libc::c_void, PAGE_SIZE, &mut v) == 0 && v & 1 != 0 }
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
                let present = access.present.unwrap_or_else(|| mapped(page));
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
                    return reclaim::unstage(inner, claim, id, page);
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
        return retry_later(inner, claim, e.errno());
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
        Err(e) => retry_later(inner, claim, e.errno()),
    }
}

/// A transition could not be done now (the kernel refused an install for
/// the moment: a persistent `EAGAIN`, `ENOMEM`): the claim goes, the page
/// stays as it was, and the access retries after a pause.
#[cold]
pub(super) fn retry_later(inner: &Inner, claim: PageClaim<'_>, errno: Option<i32>) -> bool {
    drop(claim);
    retry_pause(inner, errno);
    true
}

/// Count, say once, and pause before an install is tried again.
#[cold]
pub(super) fn retry_pause(inner: &Inner, errno: Option<i32>) {
    inner.counters.install_retries.inc();
    report::once(
        &inner.reports.install_retry,
        format_args!(
            "uswap: installing a page failed for now (errno {}); the access is retried",
            errno.unwrap_or(0)
        ),
    );
    pause();
}

/// A short sleep for a thread that must retry: sleeping, unlike
/// `sched_yield`, lets a thread of lower priority on this CPU run.
pub(super) fn pause() {
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 50_000,
    };
    // SAFETY: nanosleep reads the timespec; async-signal-safe.
    unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
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
            return retry_later(inner, claim, err.errno());
        }
        inner.counters.zero_fills.inc();
        inner.resident.fetch_add(1, Ordering::Relaxed);
        claim.commit(if write {
            page::RESIDENT | page::DIRTY
        } else {
            page::RESIDENT
        });
        inner.lru.add(id);
        return false;
    };
    let b = inner.bounce.get_waiting();
    // SAFETY: we hold bounce frame `b`.
    let buf = unsafe { inner.bounce.bytes(b) };
    let read = inner.devices[e.device() as usize].read(e.offset(), buf);
    match read {
        Ok(()) => {
            let copied = inner.copy(addr, buf.as_ptr(), PAGE, !write);
            inner.bounce.put(b);
            if let Err((_, err)) = copied {
                return retry_later(inner, claim, err.errno());
            }
            inner.counters.swapins.inc();
            inner.resident.fetch_add(1, Ordering::Relaxed);
            if write {
                // About to change: the slot's copy is stale already.
                inner.free_slot(e);
                claim.commit(page::RESIDENT | page::DIRTY);
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
            false
        }
        Err(err) if err.is_transient() => {
            // The device is busy or short of memory: try again, the data
            // is still on its slot.
            inner.bounce.put(b);
            inner.counters.swapin_retries.inc();
            drop(claim);
            pause();
            true
        }
        Err(err) => {
            inner.bounce.put(b);
            // Never zeros: poison the page so an access gets SIGBUS.
            if let Err(perr) = inner.uffd.poison(addr, PAGE, true) {
                // Not even that: leave it swapped, and the access retries
                // the read.
                return retry_later(inner, claim, perr.errno());
            }
            inner.counters.read_errors.inc();
            log_poison(addr, PAGE, e, &err);
            inner.free_slot(e);
            claim.commit(page::POISONED);
            false
        }
    }
}

/// A handler thread: reads fault events and serves them until the instance
/// is gone.
pub(super) fn spawn_handler(weak: Weak<Inner>) -> JoinHandle<()> {
    signals::spawn("uswap-fault", move || loop {
        let Some(inner) = Inner::upgrade(&weak) else {
            return;
        };
        // A poll error (EINTR cannot happen: every signal is blocked here)
        // is taken as "nothing yet"; the loop polls again.
        let ready = inner.uffd.poll(50).unwrap_or(false);
        if !ready {
            continue;
        }
        while let Ok(Some(ev)) = inner.uffd.read_event() {
            let crate::uffd::Event::PageFault {
                address, wp, write, ..
            } = ev
            else {
                continue;
            };
            let page_addr = address & !(PAGE - 1);
            let access = Access {
                present: Some(wp),
                write: write && !wp,
            };
            let wake = match lookup(address) {
                Some(Hit {
                    inner: owner,
                    id,
                    unit: Some(base),
                }) if std::ptr::eq(owner, &*inner) => {
                    super::unit::serve(&inner, base, id, address, access);
                    // Every thread waiting in the unit may go on.
                    Some((base, super::unit::UNIT_BYTES as u64))
                }
                Some(Hit {
                    inner: owner,
                    id,
                    unit: None,
                }) if std::ptr::eq(owner, &*inner) => {
                    serve(&inner, address, id, access).then_some((page_addr, PAGE))
                }
                // Not a region (a region being unmapped, the staging
                // area): let the thread retry.
                _ => Some((page_addr, PAGE)),
            };
            if let Some((at, len)) = wake {
                // A failed wake means the range is gone (unmapped): the
                // thread waiting there was woken by the unmap.
                let _ = inner.uffd.wake(at, len);
            }
        }
    })
}

/// Say why a page is poisoned, on stderr, from wherever the swap-in failed
/// (a signal handler included).
pub(super) fn log_poison(addr: u64, len: u64, e: crate::swap_space::SwapEntry, err: &crate::io::IoError) {
    report::line(format_args!(
        "uswap: swap-in of {len} bytes at {addr:#x} failed: device {} slot {} gave errno {}; the memory is poisoned and touching it raises SIGBUS",
        e.device(),
        e.offset(),
        err.errno().unwrap_or(0)
    ));
}
