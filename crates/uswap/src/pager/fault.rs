//! Fault service: one routine, [`serve`], called from a SIGBUS handler in
//! the faulting thread or from handler threads reading the userfaultfd.
//!
//! Everything here runs in a signal handler in SIGBUS mode, so it follows
//! the rules of one: no allocation (all memory is preallocated: page
//! tables, frame pools, the region table), no lock that the interrupted
//! code could hold (the interrupted code is the application touching its
//! own memory, which holds no uswap lock), and idempotence (a fault may be
//! delivered twice, or by two threads at once: the page's BUSY bit picks
//! one to serve it, and the others wait and retry the access).

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::{Once, Weak};
use std::thread::JoinHandle;

use super::{page, reclaim, Inner, MAX_REGIONS};
use crate::PAGE_SIZE;

const PAGE: u64 = PAGE_SIZE as u64;

/// How faults are served.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FaultMode {
    /// The faulting thread serves its own fault in a SIGBUS handler
    /// (`UFFD_FEATURE_SIGBUS`): no hand-off to another thread, which costs
    /// 30-120 us on a VM.  Faults raised inside the kernel (`read(2)` into a
    /// region) fail with `EFAULT` in this mode.
    #[default]
    Sigbus,
    /// Handler threads read fault events and serve them; the faulting
    /// thread sleeps until woken.  Serves kernel-raised faults too.
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
    for r in REGIONS.iter() {
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

/// Wait for a page's transition to finish.
#[inline]
fn wait_busy(inner: &Inner, spins: &mut u32) {
    *spins += 1;
    if *spins < 64 {
        std::hint::spin_loop();
    } else {
        if *spins == 64 {
            inner.counters.busy_waits.inc();
        }
        std::thread::yield_now();
    }
}

/// Serve a fault at `addr` (page id `id`).  `wp` is Some(true) when the
/// kernel said this is a write-protect fault, Some(false) a missing-page
/// fault, None when unknown (SIGBUS mode: the page state tells).  `write`:
/// the access was a write, so a missing page is installed writable and
/// dirty at once, sparing the write-protect fault that would follow.
/// Returns whether the caller must wake the faulting thread (handler mode;
/// the ioctls that resolve a fault wake it themselves).
pub(super) fn serve(inner: &Inner, addr: u64, id: u32, wp: Option<bool>, write: bool) -> bool {
    let page_addr = addr & !(PAGE - 1);
    let st = &inner.states[id as usize];
    let mut spins = 0;
    inner.counters.faults.inc();
    loop {
        let w = st.load(Ordering::Acquire);
        if w & page::BUSY != 0 {
            wait_busy(inner, &mut spins);
            continue;
        }
        match page::kind(w) {
            page::RESIDENT => {
                if wp == Some(false) {
                    // A missing fault on a page that is back: a duplicate.
                    return true;
                }
                // A write to a clean (write-protected) page: it is dirty
                // from now on, and the copy on its slot is stale.
                let dirty = page::without_slot(w) | page::DIRTY;
                if st
                    .compare_exchange(w, dirty | page::BUSY, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
                {
                    continue;
                }
                inner.counters.wp_faults.inc();
                if let Some(e) = page::slot(w) {
                    let _ = inner.space.free(e);
                }
                let _ = inner.uffd.writeprotect(page_addr, PAGE, false, true);
                inner.lru.mark_referenced(id);
                st.store(dirty, Ordering::Release);
                return false;
            }
            page::STAGED | page::NEVER | page::SWAPPED => {
                if wp == Some(true) {
                    // A write-protect fault on a page the reclaimer has
                    // taken since: retrying the access faults it in.
                    return true;
                }
                if st
                    .compare_exchange(w, w | page::BUSY, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
                {
                    continue;
                }
                if page::kind(w) == page::STAGED {
                    // A swap-cache hit: the page is still in memory, and
                    // moving it back does not grow the resident set.
                    reclaim::unstage(inner, id, page_addr, w);
                    return false;
                }
                reclaim::make_room(inner);
                return install(inner, page_addr, id, w, write);
            }
            // A poisoned page's access must fail: in SIGBUS mode the
            // caller passes the signal on.  A dead page's region is being
            // unmapped.  Nothing to serve either way.
            page::POISONED => return true,
            _ => return true,
        }
    }
}

/// Installing page `id` failed: put its state back as it was (`w`, BUSY
/// released), so that nothing claims it is mapped when it is not, and let
/// the access fault again.  `EEXIST` cannot happen while we hold BUSY; any
/// error here is the kernel refusing for now (a persistent `EAGAIN`,
/// `ENOMEM`), so the page is kept and the caller retries.
#[cold]
fn install_failed(inner: &Inner, id: u32, w: u64, e: crate::uffd::UffdError) -> bool {
    inner.counters.install_retries.inc();
    let _ = e;
    inner.states[id as usize].store(w, Ordering::Release);
    std::thread::yield_now();
    true
}

/// Install page `id` (state `w`, BUSY held): zeros for a never-touched
/// page, its slot's contents for a swapped one.  A read installs it
/// write-protected (clean); a write installs it writable and dirty.
fn install(inner: &Inner, addr: u64, id: u32, w: u64, write: bool) -> bool {
    let st = &inner.states[id as usize];
    let Some(e) = page::slot(w) else {
        // Never written: zeros, no IO, no slot.
        if let Err(e) = inner
            .uffd
            .copy(addr, inner.zero.addr() as *const u8, PAGE, !write, true)
        {
            return install_failed(inner, id, w, e);
        }
        inner.counters.zero_fills.inc();
        inner.resident.fetch_add(1, Ordering::Relaxed);
        st.store(
            if write {
                page::RESIDENT | page::DIRTY
            } else {
                page::RESIDENT
            },
            Ordering::Release,
        );
        inner.lru.add(id);
        return false;
    };
    let b = loop {
        match inner.bounce.get() {
            Some(b) => break b,
            None => std::thread::yield_now(),
        }
    };
    // SAFETY: we hold bounce frame `b`.
    let buf = unsafe { inner.bounce.bytes(b) };
    match inner.devices[e.device() as usize].read(e.offset(), buf) {
        Ok(()) => {
            let copied = inner.uffd.copy(addr, buf.as_ptr(), PAGE, !write, true);
            inner.bounce.put(b);
            if let Err(e) = copied {
                return install_failed(inner, id, w, e);
            }
            inner.counters.swapins.inc();
            inner.resident.fetch_add(1, Ordering::Relaxed);
            if write {
                // About to change: the slot's copy is stale already.
                let _ = inner.space.free(e);
                st.store(page::RESIDENT | page::DIRTY, Ordering::Release);
            } else {
                // Clean, and its slot still holds a valid copy.
                st.store(page::with_slot(page::RESIDENT, e), Ordering::Release);
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
        Err(err) => {
            // Never zeros: poison the page so an access gets SIGBUS.
            inner.bounce.put(b);
            inner.counters.read_errors.inc();
            log_poison(addr, PAGE, e, &err);
            let _ = inner.space.free(e);
            let _ = inner.uffd.poison(addr, PAGE, true);
            st.store(page::POISONED, Ordering::Release);
            false
        }
    }
}

/// A handler thread: reads fault events and serves them until the instance
/// is gone.
pub(super) fn spawn_handler(weak: Weak<Inner>) -> JoinHandle<()> {
    std::thread::Builder::new()
        .name("uswap-fault".into())
        .spawn(move || loop {
            let Some(inner) = Inner::upgrade(&weak) else {
                return;
            };
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
                match lookup(address) {
                    Some(Hit {
                        inner: owner,
                        id,
                        unit: Some(base),
                    }) if std::ptr::eq(owner, &*inner) => {
                        super::unit::serve(&inner, base, id);
                        // Every thread waiting in the unit may go on.
                        let _ = inner.uffd.wake(base, super::unit::UNIT_BYTES as u64);
                    }
                    Some(Hit {
                        inner: owner,
                        id,
                        unit: None,
                    }) if std::ptr::eq(owner, &*inner) => {
                        if serve(&inner, address, id, Some(wp), write && !wp) {
                            let _ = inner.uffd.wake(page_addr, PAGE);
                        }
                    }
                    // Not a region (a region being unmapped, the staging
                    // area): let the thread retry.
                    _ => {
                        let _ = inner.uffd.wake(page_addr, PAGE);
                    }
                }
            }
        })
        .expect("spawn a fault handler thread")
}

static OLD_SIGBUS: AtomicPtr<libc::sigaction> = AtomicPtr::new(std::ptr::null_mut());
static INSTALL: Once = Once::new();

/// Install the process-wide SIGBUS handler once; the handler that was
/// there before keeps every SIGBUS that is not a uswap fault.
pub(super) fn install_sigbus_handler() {
    INSTALL.call_once(|| {
        // SAFETY: sigaction with a zeroed struct filled in below; the old
        // action is leaked into a static so the handler can chain to it
        // for as long as the process lives.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigbus as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART | libc::SA_NODEFER;
            libc::sigemptyset(&mut sa.sa_mask);
            let old: *mut libc::sigaction = Box::into_raw(Box::new(std::mem::zeroed()));
            libc::sigaction(libc::SIGBUS, &sa, old);
            OLD_SIGBUS.store(old, Ordering::Release);
        }
    });
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as u64;
    if let Some(Hit { inner, id, unit }) = lookup(addr) {
        // SAFETY: an entry is published only while its region, which holds
        // the instance alive, exists; a fault in a region means it exists.
        let inner = unsafe { &*inner };
        // A poisoned page (its swap-in failed) is the application's SIGBUS
        // to have: serving it would only repeat the fault forever.
        if page::kind(inner.states[id as usize].load(Ordering::Acquire)) != page::POISONED {
            match unit {
                Some(base) => super::unit::serve(inner, base, id),
                None => {
                    serve(inner, addr, id, None, fault_was_write(ctx));
                }
            }
            return;
        }
    }
    // Not ours: hand it to whoever had SIGBUS before.
    let old = OLD_SIGBUS.load(Ordering::Acquire);
    // SAFETY: `old` was written by sigaction before our handler could run.
    unsafe {
        let old = &*old;
        if old.sa_flags & libc::SA_SIGINFO != 0 && old.sa_sigaction > 1 {
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                std::mem::transmute(old.sa_sigaction);
            f(sig, info, ctx);
        } else if old.sa_sigaction > 1 {
            let f: extern "C" fn(libc::c_int) = std::mem::transmute(old.sa_sigaction);
            f(sig);
        } else {
            // Default (or ignored): restore the default action and return;
            // the faulting access repeats and the default action kills the
            // process, as it would have without uswap.
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
        }
    }
}

/// Whether the access that raised this SIGBUS was a write: bit 1 of the
/// page-fault error code the kernel saves in the signal context (x86-64).
/// Elsewhere unknown: false, and a write takes one more (write-protect)
/// fault.
#[cfg(target_arch = "x86_64")]
fn fault_was_write(ctx: *mut libc::c_void) -> bool {
    if ctx.is_null() {
        return false;
    }
    // SAFETY: an SA_SIGINFO handler's third argument is its ucontext_t.
    let err = unsafe { (*(ctx as *const libc::ucontext_t)).uc_mcontext.gregs[libc::REG_ERR as usize] };
    err & 2 != 0
}

#[cfg(not(target_arch = "x86_64"))]
fn fault_was_write(_ctx: *mut libc::c_void) -> bool {
    false
}

/// Say why a page is poisoned, on stderr, from wherever the swap-in failed
/// (a signal handler included): formatted into a stack buffer with
/// `core::fmt` (no allocation) and written with one write(2).
pub(super) fn log_poison(addr: u64, len: u64, e: crate::swap_space::SwapEntry, err: &crate::io::IoError) {
    use std::fmt::Write as _;
    struct Line {
        buf: [u8; 320],
        len: usize,
    }
    impl std::fmt::Write for Line {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            let n = s.len().min(self.buf.len() - self.len);
            self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
            self.len += n;
            Ok(())
        }
    }
    let errno = match err {
        crate::io::IoError::Read { source, .. } => source.raw_os_error().unwrap_or(0),
        _ => 0,
    };
    let mut line = Line {
        buf: [0; 320],
        len: 0,
    };
    let _ = writeln!(
        line,
        "uswap: swap-in of {len} bytes at {addr:#x} failed: device {} slot {} gave errno {errno}; the memory is poisoned and touching it raises SIGBUS",
        e.device(),
        e.offset()
    );
    // SAFETY: writes our own stack buffer to stderr; write(2) is
    // async-signal-safe.
    unsafe { libc::write(2, line.buf.as_ptr().cast(), line.len) };
}
