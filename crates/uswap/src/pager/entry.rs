//! The entry: where faults come in.  The table of published regions, the
//! process-wide SIGBUS handler that serves faults on the faulting thread
//! ([`FaultMode::Sigbus`]), the handler threads that read the userfaultfd
//! ([`FaultMode::HandlerThread`]), and the background reclaimer thread.
//! Everything below it (`fault.rs`, `reclaim.rs`, the instance) is called
//! from here and calls nothing back.
//!
//! # The SIGBUS handler
//!
//! It serves faults in SIGBUS mode and shares SIGBUS with the program
//! (below: the program's disposition, emulated).  The signal masks that
//! keep the pager's locks out of reach of the program's signal handlers
//! are `signals.rs`'s.
//!
//! # The rule for the handler
//!
//! The handler takes the pager's and the core's mutexes (LRU, slot cache,
//! device, cluster, trunk, frame pools, staged ring) and page claims.  A
//! thread interrupted while holding one of them, whose interrupting
//! handler then wanted the same one, would wait for itself forever.  That
//! cannot happen, because no thread ever holds one where a handler can
//! interrupt it:
//!
//! - inside the SIGBUS handler, every signal is blocked (`sa_mask`), so
//!   the program's SIGALRM or SIGPROF handler runs only after ours
//!   returns, with every lock released (and a fault of the handler's own,
//!   which would be a uswap bug, kills the process at once);
//! - uswap's own threads (the reclaimer, handler threads) block every
//!   signal from birth ([`signals::spawn`]): a process-directed signal is delivered
//!   to a program thread instead;
//! - the two calls that take them on a program's thread, `Swap::map` and
//!   `Region::drop`, block asynchronous signals for their duration
//!   ([`SignalsBlocked`]);
//! - no code that holds a lock or a claim touches region memory, so no
//!   synchronous fault (the only signal left) interrupts a holder either.
//!
//! And the locks never allocate (`StatMutex` is a futex), so a fault raised
//! inside the program's `malloc` can be served.  A SIGBUS handler of the
//! program that we pass a signal on to runs with SIGBUS unblocked: it may
//! itself touch region memory, and that fault must be served.
//!
//! # Stacks
//!
//! The handler is installed with `SA_ONSTACK`, so that a thread whose
//! stack is region memory (a coroutine's stack allocated from a region)
//! can be served: the kernel cannot push a signal frame onto a missing
//! page of the faulting stack.  But alternate stacks are small (Rust
//! gives each thread 8 KiB, of which the kernel's frame takes 3.4 KiB
//! with AVX-512 state), and serving a fault, direct reclaim and IO
//! included, takes more.  So where the kernel has put the handler on the
//! alternate stack, it moves before serving:
//!
//! - back onto the interrupted stack, below its red zone, when that is an
//!   ordinary stack: where it would run without `SA_ONSTACK`;
//! - onto one of 32 spare stacks of 64 KiB (mapped at installation, each
//!   above a guard page, taken with one atomic), when the interrupted code
//!   was on the alternate stack already (a signal handler of the program
//!   touching region memory) or a region lies within 64 KiB below its
//!   stack pointer; with all 32 in use, it stays where it is.
//!
//! Every signal is blocked meanwhile, so no delivery can reuse the
//! alternate stack under the handler's frame.  `tests/defects.rs`
//! measures what is left on the alternate stack: 3.7 KiB.  A thread that
//! runs on region memory still needs an alternate signal stack outside
//! regions, and its thread-local storage must not be region memory (the
//! handler saves `errno`, a thread-local): glibc puts a thread's TLS at
//! the top of a stack given by `pthread_attr_setstack`, so such a stack
//! cannot be a region; a stack the thread switches to (`swapcontext`, a

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Once, Weak};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

use super::fault::{self, Access};
use super::gate;
use super::instance::Inner;
use super::page::{self, UNIT_BYTES, UNIT_PAGES};
use super::signals::{self, SignalsBlocked, UswapThread};
use super::{reclaim, report};
use crate::io::{BackendKind, WriteRing};
use crate::PAGE_SIZE;

const PAGE: u64 = PAGE_SIZE as u64;

/// Most regions mapped at once in one process (all instances together).
pub const MAX_REGIONS: usize = 256;

/// How faults are served.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FaultMode {
    /// The faulting thread serves its own fault in a SIGBUS handler
    /// (`UFFD_FEATURE_SIGBUS`): no hand-off to another thread, which costs
    /// 30-120 us on a VM.  Faults raised inside the kernel (`read(2)` into a
    /// region) fail with `EFAULT` in this mode, and a thread that blocks
    /// SIGBUS cannot be served (the kernel kills the process).  Any user
    /// may use it: without the privilege for kernel faults the
    /// userfaultfd is opened for user-mode faults only
    /// (`UFFD_USER_MODE_ONLY`, Linux 5.11), which is all this mode serves.
    #[default]
    Sigbus,
    /// Handler threads read fault events and serve them; the faulting
    /// thread sleeps until woken.  Serves kernel-raised faults too, and
    /// threads that block SIGBUS; so it needs the privilege for kernel
    /// faults (root, `vm.unprivileged_userfaultfd=1`, or access to
    /// /dev/userfaultfd).
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

/// A published region, as `regions_of` lists it.
pub(super) struct Published {
    pub base: u64,
    pub end: u64,
    pub id_base: u32,
    pub huge: bool,
}

/// The regions of instance `inner` (a forked child adopting it).
pub(super) fn regions_of(inner: &Inner) -> Vec<Published> {
    used_entries()
        .iter()
        .filter(|r| {
            std::ptr::eq(r.inner.load(Ordering::Acquire), inner) && r.base.load(Ordering::Acquire) != 0
        })
        .map(|r| Published {
            base: r.base.load(Ordering::Acquire),
            end: r.end.load(Ordering::Relaxed),
            id_base: r.id_base.load(Ordering::Relaxed),
            huge: r.huge.load(Ordering::Relaxed),
        })
        .collect()
}

/// Whether instance `inner` has a region of 2 MB units mapped.
pub(super) fn has_huge_region(inner: &Inner) -> bool {
    regions_of(inner).iter().any(|r| r.huge)
}

/// Start an instance's threads (`Inner::spawn`); a forked child calls
/// this again, its parent's threads being absent there: their handles are
/// forgotten, not joined or detached.
pub(super) fn start_threads(inner: &Arc<Inner>) {
    let mut threads = inner.threads.lock();
    std::mem::forget(std::mem::take(&mut *threads));
    let weak = Arc::downgrade(inner);
    for _ in 0..inner.spawn.handlers {
        threads.push(spawn_handler(weak.clone()));
    }
    if inner.prefetch.on {
        threads.push(spawn_prefetcher(weak.clone()));
    }
    if inner.spawn.reclaimer {
        threads.push(spawn_reclaimer(weak, inner.spawn.watching));
    }
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
            let u = (addr - base) / UNIT_BYTES as u64;
            id = r.id_base.load(Ordering::Relaxed) + (u as usize * UNIT_PAGES) as u32;
            unit = Some(base + u * UNIT_BYTES as u64);
        }
        return Some(Hit { inner, id, unit });
    }
    None
}

/// Serve a SIGBUS fault at `addr`; false when it is not in a region (the
/// signal is then the program's).
pub(super) fn serve_signal(addr: u64, access: Access, tid: i32) -> bool {
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
    let start = crate::sys::monotonic_ns();
    inner.registry.stall_begin(tid);
    match unit {
        Some(base) => {
            fault::serve_unit(inner, base, id, addr, access);
        }
        None => {
            fault::serve(inner, addr, id, access);
        }
    }
    inner.registry.stall_end();
    let took = crate::sys::monotonic_ns().saturating_sub(start);
    inner.counters.fault_ns.add(took);
    inner.registry.fault_latency(took);
    true
}

/// A handler thread: reads fault events and serves them until the instance
/// is gone.
pub(super) fn spawn_handler(weak: Weak<Inner>) -> UswapThread {
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
                address,
                wp,
                write,
                thread,
            } = ev
            else {
                continue;
            };
            // For a thread that is forking, through the closed gate.
            let _inside = gate::enter(thread as i32);
            let page_addr = address & !(PAGE - 1);
            let access = Access {
                present: Some(wp),
                write: write && !wp,
            };
            let start = crate::sys::monotonic_ns();
            // The faulting thread waits from its fault to its wake-up; what
            // is seen here is the serving of it (not the kernel's delivery).
            inner.registry.stall_begin(thread as i32);
            let wake = match lookup(address) {
                Some(Hit {
                    inner: owner,
                    id,
                    unit: Some(base),
                }) if std::ptr::eq(owner, &*inner) => {
                    fault::serve_unit(&inner, base, id, address, access);
                    // Every thread waiting in the unit may go on.
                    Some((base, UNIT_BYTES as u64))
                }
                Some(Hit {
                    inner: owner,
                    id,
                    unit: None,
                }) if std::ptr::eq(owner, &*inner) => {
                    fault::serve(&inner, address, id, access).then_some((page_addr, PAGE))
                }
                // Not a region (a region being unmapped, the staging
                // area): let the thread retry.
                _ => Some((page_addr, PAGE)),
            };
            let took = crate::sys::monotonic_ns().saturating_sub(start);
            inner.counters.fault_ns.add(took);
            inner.registry.fault_latency(took);
            if let Some((at, len)) = wake {
                // A failed wake means the range is gone (unmapped): the
                // thread waiting there was woken by the unmap.
                let _ = inner.uffd.wake(at, len);
            }
            inner.registry.stall_end();
        }
    })
}

/// The prefetcher: reads ahead the windows that faulting threads hand it
/// (`Prefetch`), so that a sequential reader of a swap file finds its next
/// pages in while it uses the ones read before them.
pub(super) fn spawn_prefetcher(weak: Weak<Inner>) -> UswapThread {
    signals::spawn("uswap-readahead", move || loop {
        let Some(inner) = Inner::upgrade(&weak) else {
            return;
        };
        if let Some((id, addr, pages, write)) = inner.prefetch.take(Duration::from_millis(100)) {
            let _inside = gate::enter(0);
            fault::read_ahead_range(&inner, addr, id, pages, write);
        }
    })
}

/// The background reclaimer: keeps resident pages under the low watermark,
/// and, in SIGBUS mode, watches the process's signal set-up.
pub(super) fn spawn_reclaimer(weak: Weak<Inner>, watching: bool) -> UswapThread {
    const WATCH_EVERY: Duration = Duration::from_millis(100);
    const SCAN_EVERY: u32 = 5;
    signals::spawn("uswap-reclaim", move || {
        let mut last_watch = Instant::now();
        let mut watches = 0u32;
        // The levels that cost a lock or a read of /proc, for readers of
        // the statistics block: every 100 ms, the first pass included.
        const LEVELS_EVERY: Duration = Duration::from_millis(100);
        let mut last_levels = Instant::now() - LEVELS_EVERY;
        // Swap files are written back through an io_uring of this
        // thread's, several writes in flight; without one (no io_uring in
        // the kernel, or `kernel.io_uring_disabled`), one `pwrite` at a
        // time, said once.
        let mut ring = match Inner::upgrade(&weak) {
            Some(inner)
                if inner
                    .backing
                    .devices
                    .iter()
                    .any(|d| d.kind() == BackendKind::File) =>
            {
                match WriteRing::new() {
                    Ok(r) => Some(r),
                    Err(e) => {
                        report::line(format_args!(
                            "uswap: no io_uring here ({e}); swap file writes go one pwrite at a time"
                        ));
                        None
                    }
                }
            }
            _ => None,
        };
        loop {
            let Some(inner) = Inner::upgrade(&weak) else {
                return;
            };
            let inside = gate::enter(0);
            if watching && last_watch.elapsed() >= WATCH_EVERY {
                last_watch = Instant::now();
                watches += 1;
                watch(watches % SCAN_EVERY == 1, &inner);
            }
            if let Some((slots, units)) = inner.backing.hold.release_if_done() {
                slots.into_iter().for_each(|e| inner.free_slot(e));
                units.into_iter().for_each(|e| inner.free_huge(e));
            }
            let resident = inner.budget.resident.load(Ordering::Relaxed);
            inner.budget.peak.fetch_max(resident, Ordering::Relaxed);
            let slow = last_levels.elapsed() >= LEVELS_EVERY;
            if slow {
                last_levels = Instant::now();
            }
            inner.publish_levels(resident, slow);
            if resident > inner.budget.low() && inner.backing.closed.load(Ordering::Relaxed) {
                inner.open_layers();
            }
            if let Some(m) = &inner.member {
                let ram = inner.backing.devices.iter().map(|d| d.ram_pages()).sum();
                m.publish(resident, inner.counters.faults.get(), ram);
                if let Some(share) = m.share() {
                    if share != inner.budget.limit() {
                        inner.budget.share(share);
                    }
                }
            }
            if resident > inner.budget.low()
                && reclaim::reclaim(&inner, resident - inner.budget.low(), ring.as_mut()) > 0
            {
                continue;
            }
            drop(inside);
            drop(inner);
            std::thread::sleep(Duration::from_millis(1));
        }
    })
}

/// The access that raised this SIGBUS, from bits 0 (present) and 1 (write)
/// of the page-fault error code the kernel saves in the signal context
/// (x86-64).
#[cfg(target_arch = "x86_64")]
fn access(ctx: *mut libc::c_void) -> Access {
    if ctx.is_null() {
        return Access {
            present: None,
            write: false,
        };
    }
    // SAFETY: an SA_SIGINFO handler's third argument is its ucontext_t.
    let err = unsafe { (*(ctx as *const libc::ucontext_t)).uc_mcontext.gregs[libc::REG_ERR as usize] };
    Access {
        present: Some(err & 1 != 0),
        write: err & 2 != 0,
    }
}

/// Elsewhere the fault path asks the page tables (`mincore`), and a
/// write takes one more (write-protect) fault.
#[cfg(not(target_arch = "x86_64"))]
fn access(_ctx: *mut libc::c_void) -> Access {
    Access {
        present: None,
        write: false,
    }
}

/// The program's disposition for SIGBUS: the action it would have without
/// uswap.  Read by the handler, written by [`install`], the watchdog and
/// the handler itself, under a sequence lock made of atomics, so a reader
/// never sees half of an update and nobody allocates.
struct Disposition {
    seq: AtomicU64,
    handler: AtomicUsize,
    flags: AtomicI32,
    mask: [AtomicU64; MASK_WORDS],
}

const MASK_WORDS: usize = std::mem::size_of::<libc::sigset_t>() / 8;
const _: () = assert!(std::mem::size_of::<libc::sigset_t>().is_multiple_of(8));

static PROGRAM: Disposition = Disposition {
    seq: AtomicU64::new(0),
    handler: AtomicUsize::new(libc::SIG_DFL),
    flags: AtomicI32::new(0),
    mask: [const { AtomicU64::new(0) }; MASK_WORDS],
};

impl Disposition {
    fn load(&self) -> libc::sigaction {
        loop {
            let s = self.seq.load(Ordering::Acquire);
            if s & 1 != 0 {
                std::hint::spin_loop();
                continue;
            }
            // SAFETY: zeroed is a valid sigaction.
            let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
            sa.sa_sigaction = self.handler.load(Ordering::Relaxed);
            sa.sa_flags = self.flags.load(Ordering::Relaxed);
            let words: [u64; MASK_WORDS] = std::array::from_fn(|i| self.mask[i].load(Ordering::Relaxed));
            // SAFETY: sigset_t is plain bits of exactly this size.
            sa.sa_mask = unsafe { std::mem::transmute::<[u64; MASK_WORDS], libc::sigset_t>(words) };
            std::sync::atomic::fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == s {
                return sa;
            }
        }
    }

    /// Writers run with every signal blocked (`take_front` blocks them;
    /// the handler's own store after an `SA_RESETHAND` handler runs under
    /// its full mask), so no handler on the writer's own thread can spin
    /// in `load` waiting for it: the spins only ever wait for another
    /// thread.
    fn store(&self, sa: &libc::sigaction) {
        let s = loop {
            let s = self.seq.load(Ordering::Relaxed);
            if s & 1 == 0
                && self
                    .seq
                    .compare_exchange(s, s + 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                break s;
            }
            std::hint::spin_loop();
        };
        self.handler.store(sa.sa_sigaction, Ordering::Relaxed);
        self.flags.store(sa.sa_flags, Ordering::Relaxed);
        // SAFETY: as in `load`.
        let words = unsafe { std::mem::transmute::<libc::sigset_t, [u64; MASK_WORDS]>(sa.sa_mask) };
        for (m, w) in self.mask.iter().zip(words) {
            m.store(w, Ordering::Relaxed);
        }
        self.seq.store(s + 2, Ordering::Release);
    }
}

fn ours() -> libc::sigaction {
    // SAFETY: zeroed is a valid sigaction; the fields are filled in.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = on_sigbus as *const () as usize;
    sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART | libc::SA_ONSTACK;
    // Every signal blocked while the handler runs (SIGBUS included: no
    // SA_NODEFER); see "The rule for the handler" and "Stacks".
    // SAFETY: fills a local set.
    unsafe { libc::sigfillset(&mut sa.sa_mask) };
    sa
}

fn is_ours(sa: &libc::sigaction) -> bool {
    sa.sa_sigaction == on_sigbus as *const () as usize
}

fn current() -> libc::sigaction {
    // SAFETY: queries the action into a local struct.
    unsafe {
        let mut cur: libc::sigaction = std::mem::zeroed();
        kernel_sigaction(libc::SIGBUS, std::ptr::null(), &mut cur);
        cur
    }
}

/// Put uswap's handler in front, recording the action it replaces as the
/// program's disposition.  Allocation-free and async-signal-safe.
fn take_front() {
    let _blocked = SignalsBlocked::all();
    let mut old: libc::sigaction = current();
    if is_ours(&old) {
        return;
    }
    // The window between the query and the install is closed by checking
    // what the install replaced: if it was not what we recorded, record it.
    PROGRAM.store(&old);
    // SAFETY: installs a valid action; `old` receives the replaced one.
    unsafe { kernel_sigaction(libc::SIGBUS, &ours(), &mut old) };
    if !is_ours(&old) {
        PROGRAM.store(&old);
    }
}

static INSTALL: Once = Once::new();

/// libc's `sigaction`, found past this object (`RTLD_NEXT`) when the
/// handler is installed: where uswap is built into a preloaded library
/// that interposes `sigaction` on the program (`uswap run`), a plain call
/// would reach that interposer, which keeps the program's SIGBUS action
/// behind uswap's handler instead of installing it.  Looked up outside
/// any signal handler (`dlsym` is not async-signal-safe); 0 until then.
static KERNEL_SIGACTION: AtomicUsize = AtomicUsize::new(0);

fn find_kernel_sigaction() {
    // SAFETY: a symbol lookup with a C string.
    let f = unsafe { libc::dlsym(libc::RTLD_NEXT, c"sigaction".as_ptr()) };
    KERNEL_SIGACTION.store(f as usize, Ordering::Release);
}

/// `sigaction(2)` as libc makes it (see `KERNEL_SIGACTION`).
///
/// # Safety
/// As `sigaction(2)`: `act` and `old` are null or valid.
unsafe fn kernel_sigaction(
    sig: libc::c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> libc::c_int {
    match KERNEL_SIGACTION.load(Ordering::Acquire) {
        // SAFETY: per the contract.
        0 => unsafe { libc::sigaction(sig, act, old) },
        f => {
            // SAFETY: libc's `sigaction`, whose C signature this is.
            let f: unsafe extern "C" fn(
                libc::c_int,
                *const libc::sigaction,
                *mut libc::sigaction,
            ) -> libc::c_int = unsafe { std::mem::transmute(f) };
            // SAFETY: per the contract.
            unsafe { f(sig, act, old) }
        }
    }
}

/// `sigaction(SIGBUS, new, old)` as a program sees it while uswap's handler
/// is in front: `old` receives the program's disposition, `new` becomes
/// it, and uswap's handler stays installed, passing on to it every SIGBUS
/// that is not a uswap fault.  False (nothing done) when uswap's handler
/// is not installed: the call is then the kernel's to make.
pub(super) fn program_sigbus_action(
    new: Option<&libc::sigaction>,
    old: Option<&mut libc::sigaction>,
) -> bool {
    if !INSTALL.is_completed() {
        return false;
    }
    let _blocked = SignalsBlocked::all();
    if let Some(old) = old {
        *old = PROGRAM.load();
    }
    if let Some(new) = new {
        PROGRAM.store(new);
    }
    true
}

/// Install the process-wide SIGBUS handler once; the action that was there
/// before is the program's disposition.
pub(super) fn install() {
    INSTALL.call_once(|| {
        find_kernel_sigaction();
        spare::map();
        take_front();
        signals::set_serving_sigbus();
    });
}

/// The watchdog, called every few milliseconds by an instance's
/// reclaimer (and by `Swap::map`): a SIGBUS handler installed after
/// uswap's is put behind it, and a thread that blocks SIGBUS is named.
/// `inner` is the watching instance: a thread found blocking SIGBUS is
/// an event of its statistics.
pub(super) fn watch(scan_threads: bool, inner: &Inner) {
    if !INSTALL.is_completed() {
        return;
    }
    let cur = current();
    if !is_ours(&cur) {
        take_front();
        report::line(format_args!(
            "uswap: a SIGBUS handler (at {:#x}) was installed after uswap's; uswap put its own back in front and passes every SIGBUS that is not a uswap fault on to it. Install signal handlers before building a Swap, so that no uswap fault reaches them meanwhile",
            cur.sa_sigaction
        ));
    }
    if scan_threads {
        scan_blocked_threads(inner);
    }
}

/// What the thread scan remembers between scans.
struct Watched {
    /// Threads seen blocking SIGBUS, with how many scans in a row.
    seen: Vec<(i32, u32)>,
    /// Threads already named, so each is reported once.
    reported: Vec<i32>,
}

static WATCHED: Mutex<Watched> = Mutex::new(Watched {
    seen: Vec::new(),
    reported: Vec::new(),
});

/// Scans in a row (every 500 ms) a thread must be seen blocking SIGBUS,
/// outside the handler, before it is named.  A thread inside the handler
/// blocks SIGBUS too, and the handler's count of itself cannot cover the
/// moments between the kernel's delivery and its first instruction, or
/// its last and the return, where a preempted thread can sit for a
/// scheduler slice; no thread sits there for two seconds.
const SCANS_TO_REPORT: u32 = 4;

/// Threads inside the handler, counted per bucket of thread ids (the low
/// 32 bits), and entries into it (the high 32, wrapping).  While a thread
/// is in it, its mask blocks SIGBUS (the handler's `sa_mask` blocks
/// everything), which the thread scan must not take for the program's
/// doing; and since a scan reads a thread's mask and this count at two
/// moments, a thread that entered the handler between them was in it
/// too (a thread serving faults most of the time was named as blocking
/// SIGBUS).  Buckets, not a table of ids: two atomic adds per fault, no
/// search; a shared bucket only makes the scan look again later.
const BUCKETS: usize = 64;
static IN_HANDLER: [CachePadded<AtomicU64>; BUCKETS] =
    [const { CachePadded::new(AtomicU64::new(0)) }; BUCKETS];
/// One more thread inside, one more entry.
const HANDLER_ENTRY: u64 = (1 << 32) + 1;

/// The bucket of thread `tid`.  The handler asks `gettid`, a system call
/// each time, not an id cached in thread-local storage: nothing on the
/// fault path touches thread-local storage (see `fault::Readahead`).
fn handler_bucket(tid: i32) -> &'static AtomicU64 {
    &IN_HANDLER[tid as usize % BUCKETS]
}

/// Name every thread of the process that blocks SIGBUS (not uswap's own).
///
/// The descriptors it reads through are moved above the program's at once
/// (`descriptors::Placed`): a program closing every descriptor meanwhile
/// (`close_range`, `closefrom`, the raw system call) must not pull one
/// from under the scan (std's directory stream panics when its `closedir`
/// fails), nor may the scan's close hit a number the program reused.
fn scan_blocked_threads(inner: &Inner) {
    let Some(dir) = open_placed("/proc/self/task", true) else {
        return;
    };
    let mut tids = Vec::new();
    let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
    let mut entries = rustix::fs::RawDir::new(std::os::fd::AsFd::as_fd(&dir), &mut buf);
    while let Some(Ok(e)) = entries.next() {
        if let Some(tid) = e.file_name().to_str().ok().and_then(|s| s.parse::<i32>().ok()) {
            tids.push(tid);
        }
    }
    drop(dir);
    let mut watched = WATCHED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut seen = Vec::new();
    for tid in tids {
        let before = handler_bucket(tid).load(Ordering::Acquire);
        let Some(status) = read_placed(&format!("/proc/self/task/{tid}/status")) else {
            continue;
        };
        let after = handler_bucket(tid).load(Ordering::Acquire);
        // In the handler when the mask was read, or through it meanwhile.
        let handling = before as u32 != 0 || after as u32 != 0 || before >> 32 != after >> 32;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_string())
                .unwrap_or_default()
        };
        let name = field("Name:");
        let blocked = u64::from_str_radix(&field("SigBlk:"), 16).unwrap_or(0);
        if signals::is_uswap_thread(tid)
            || name.starts_with("iou-")
            || blocked & (1 << (libc::SIGBUS - 1)) == 0
            || handling
        {
            continue;
        }
        let scans = watched
            .seen
            .iter()
            .find(|&&(t, _)| t == tid)
            .map_or(0, |&(_, n)| n)
            + 1;
        seen.push((tid, scans));
        if scans < SCANS_TO_REPORT || watched.reported.contains(&tid) {
            continue;
        }
        watched.reported.push(tid);
        inner
            .registry
            .event(crate::stats::EventKind::SigbusBlocked, tid as u64);
        report::line(format_args!(
            "uswap: thread {tid} ({name}) blocks SIGBUS: in SIGBUS fault mode its first touch of swapped memory kills the process; unblock SIGBUS in that thread, or build the Swap with FaultMode::HandlerThread"
        ));
    }
    // A thread not seen blocking this time starts again from zero.
    watched.seen = seen;
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // The interrupted code's errno is its own: the calls below may set it.
    // SAFETY: errno is this thread's.
    let errno = unsafe { *libc::__errno_location() };
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    let inside = handler_bucket(tid);
    inside.fetch_add(HANDLER_ENTRY, Ordering::AcqRel);
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as u64) };
    // Only a fault the kernel raised for a missing or write-protected page
    // of a registered range (`BUS_ADRERR`) can be ours; a SIGBUS sent with
    // `kill` has a garbage address, and a poisoned page is `BUS_MCEERR_AR`
    // (or `BUS_ADRERR` on a kernel without memory-failure support, which
    // `serve_signal` tells from the page's state).
    // Served inside the fork gate (gate.rs); a SIGBUS that is not ours
    // goes to the program's handler outside it, which may fault again.
    let served = code == libc::BUS_ADRERR && {
        let _inside = gate::enter_as(tid, 0);
        serve(addr, ctx, tid)
    };
    if !served {
        pass_on(sig, info, ctx);
    }
    inside.fetch_sub(1, Ordering::AcqRel);
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Open `path` read-only, its descriptor moved above the program's at
/// once (see `scan_blocked_threads`).
fn open_placed(path: &str, dir: bool) -> Option<crate::descriptors::Placed> {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::RDONLY | OFlags::CLOEXEC | if dir { OFlags::DIRECTORY } else { OFlags::empty() };
    let fd = rustix::fs::open(path, flags, Mode::empty()).ok()?;
    Some(crate::descriptors::Placed::new(fd))
}

/// A small file of /proc, read through a placed descriptor.
fn read_placed(path: &str) -> Option<String> {
    let fd = open_placed(path, false)?;
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match rustix::io::read(std::os::fd::AsFd::as_fd(&fd), &mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(_) => return None,
        }
    }
    String::from_utf8(out).ok()
}

/// A fault handed to [`serve_fault`] across a stack switch.
struct Fault {
    addr: u64,
    access: Access,
    /// The faulting thread.
    tid: i32,
    served: bool,
}

extern "C" fn serve_fault(arg: *mut libc::c_void) {
    // SAFETY: `arg` is the `Fault` of `serve`, alive across this call.
    let f = unsafe { &mut *arg.cast::<Fault>() };
    f.served = serve_signal(f.addr, f.access, f.tid);
}

/// Serve a fault at `addr` on a stack with room (see "Stacks" above).
/// Returns whether it was a uswap fault.
fn serve(addr: u64, ctx: *mut libc::c_void, tid: i32) -> bool {
    let mut f = Fault {
        addr,
        access: access(ctx),
        tid,
        served: false,
    };
    let arg = (&mut f as *mut Fault).cast();
    match stack_to_serve_on(ctx, arg as u64) {
        // SAFETY: `sp` is 16-byte aligned and below everything the
        // interrupted code keeps on its stack (red zone included), on a
        // stack that is not region memory; every signal is blocked, so
        // nothing is delivered onto the alternate stack meanwhile.
        ServeOn::Interrupted(sp) => unsafe { call_on_stack(sp, serve_fault, arg) },
        ServeOn::Spare => match spare::take() {
            Some(stack) => {
                // SAFETY: the top of a spare stack this thread now owns,
                // 16-byte aligned, with a guard page below it.
                unsafe { call_on_stack(stack.top(), serve_fault, arg) };
                spare::give_back(stack);
            }
            None => serve_fault(arg),
        },
        ServeOn::Here => serve_fault(arg),
    }
    f.served
}

/// Where a fault is served.
// Elsewhere only `Here` is used: no stack switch (see `call_on_stack`).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
enum ServeOn {
    /// On the interrupted code's stack, from this stack pointer down.
    Interrupted(u64),
    /// On a spare stack of uswap's, if one is free (else here).
    Spare,
    /// Where the kernel put the handler.
    Here,
}

/// How far below the interrupted stack pointer the handler starts when it
/// moves onto the interrupted stack: the x86-64 red zone (128 bytes, which
/// leaf code may be using) and a margin.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const BELOW_SP: u64 = 256;
/// A region within this distance below the interrupted stack pointer may
/// be the stack itself: the handler's frames there could fault on pages
/// of the region.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const HANDLER_STACK: u64 = 64 << 10;

/// Where to serve: `here` is an address on the handler's stack.  Not on
/// the alternate stack: the kernel ran the handler on the interrupted
/// stack, which has room.  On it, over code on an ordinary stack: back
/// onto that stack.  On it, over code that was on it already (a signal
/// handler of the program) or on region memory: a spare stack.
#[cfg(target_arch = "x86_64")]
fn stack_to_serve_on(ctx: *mut libc::c_void, here: u64) -> ServeOn {
    if ctx.is_null() {
        return ServeOn::Here;
    }
    // SAFETY: an SA_SIGINFO handler's third argument is its ucontext_t.
    let uc = unsafe { &*(ctx as *const libc::ucontext_t) };
    // The kernel saves the thread's alternate stack here.
    if uc.uc_stack.ss_flags & libc::SS_DISABLE != 0 {
        return ServeOn::Here;
    }
    let alt = uc.uc_stack.ss_sp as u64;
    let on_alt = |p: u64| p >= alt && p < alt + uc.uc_stack.ss_size as u64;
    if !on_alt(here) {
        return ServeOn::Here;
    }
    let sp = uc.uc_mcontext.gregs[libc::REG_RSP as usize] as u64;
    if on_alt(sp) || sp < HANDLER_STACK || overlaps_a_region(sp - HANDLER_STACK, HANDLER_STACK) {
        return ServeOn::Spare;
    }
    ServeOn::Interrupted((sp - BELOW_SP) & !15)
}

#[cfg(not(target_arch = "x86_64"))]
fn stack_to_serve_on(_ctx: *mut libc::c_void, _here: u64) -> ServeOn {
    ServeOn::Here
}

/// Spare stacks for faults that cannot be served on the interrupted
/// stack: a region used as a stack, or a program's signal handler running
/// on the alternate stack.  Mapped once, when the handler is installed
/// (lazily committed: a stack costs memory only once used); taken and
/// given back with one atomic each, so the handler allocates nothing.
mod spare {
    use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

    const STACKS: u32 = 32;
    const SIZE: u64 = 64 << 10;
    const GUARD: u64 = 4096;

    /// The mapping's start; 0 when there is none.
    static BASE: AtomicU64 = AtomicU64::new(0);
    /// Bit i set: stack i is free.
    static FREE: AtomicU32 = AtomicU32::new(u32::MAX);

    /// A spare stack, owned until given back.
    pub struct Stack(u32);

    impl Stack {
        /// Its top, where a call starts.
        pub fn top(&self) -> u64 {
            BASE.load(Ordering::Acquire) + (u64::from(self.0) + 1) * (SIZE + GUARD)
        }
    }

    /// Map the stacks, each above a guard page.  A failure leaves none:
    /// faults are then served where the kernel put the handler.
    pub fn map() {
        if let Some(base) = crate::sys::map_stacks(u64::from(STACKS), SIZE, GUARD) {
            BASE.store(base, Ordering::Release);
        }
    }

    /// Take a free stack, if there is one.
    pub fn take() -> Option<Stack> {
        if BASE.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut free = FREE.load(Ordering::Acquire);
        loop {
            if free == 0 {
                return None;
            }
            let i = free.trailing_zeros();
            match FREE.compare_exchange_weak(free, free & !(1 << i), Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(Stack(i)),
                Err(now) => free = now,
            }
        }
    }

    pub fn give_back(s: Stack) {
        FREE.fetch_or(1 << s.0, Ordering::Release);
    }
}

/// Call `f(arg)` with the stack pointer at `sp`, and come back.
///
/// # Safety
/// `sp` must be 16-byte aligned, with enough free, mapped stack below it
/// for `f`, none of it in use.
#[cfg(target_arch = "x86_64")]
unsafe fn call_on_stack(sp: u64, f: extern "C" fn(*mut libc::c_void), arg: *mut libc::c_void) {
    // SAFETY: per the contract; r12 is callee-saved, so it still holds the
    // old stack pointer when `f` returns; `clobber_abi` covers the rest.
    unsafe {
        std::arch::asm!(
            "mov r12, rsp",
            "mov rsp, {sp}",
            "call {f}",
            "mov rsp, r12",
            sp = in(reg) sp,
            f = in(reg) f,
            in("rdi") arg,
            out("r12") _,
            clobber_abi("C"),
        );
    }
}

/// Elsewhere no stack switch: `stack_to_serve_on` never asks for one, and
/// `f` runs where the handler is.
///
/// # Safety
/// None beyond `f`'s own; `sp` is ignored.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn call_on_stack(_sp: u64, f: extern "C" fn(*mut libc::c_void), arg: *mut libc::c_void) {
    f(arg)
}

/// Hand a SIGBUS that is not a uswap fault to the program's disposition.
fn pass_on(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let program = PROGRAM.load();
    // SAFETY: as in `on_sigbus`.
    let sent = unsafe { (*info).si_code } <= 0;
    if sent && signals::held_for_program(sig) {
        // Sent while the program's mask blocks it (a mask uswap keeps
        // SIGBUS out of, `program_sigmask`): pending until it unblocks.
        return;
    }
    match program.sa_sigaction {
        libc::SIG_IGN if sent => {}
        libc::SIG_DFL | libc::SIG_IGN => default_action(sent),
        handler => {
            // Run it as the kernel would have: with the interrupted mask
            // plus its own; but SIGBUS stays unblocked even without
            // SA_NODEFER, so that a uswap fault inside it is served (a
            // second SIGBUS of its own re-enters it, where the kernel
            // would have killed the process).
            // SAFETY: zeroed is a valid sigset_t; the union is filled below.
            let mut mask: libc::sigset_t = unsafe { std::mem::zeroed() };
            if !ctx.is_null() {
                // SAFETY: `ctx` is the ucontext of this delivery.
                mask = unsafe { (*(ctx as *const libc::ucontext_t)).uc_sigmask };
            }
            // SAFETY: sigset_t is plain bits of MASK_WORDS words.
            let (mut m, theirs) = unsafe {
                (
                    std::mem::transmute::<libc::sigset_t, [u64; MASK_WORDS]>(mask),
                    std::mem::transmute::<libc::sigset_t, [u64; MASK_WORDS]>(program.sa_mask),
                )
            };
            for (a, b) in m.iter_mut().zip(theirs) {
                *a |= b;
            }
            // SAFETY: as above.
            mask = unsafe { std::mem::transmute::<[u64; MASK_WORDS], libc::sigset_t>(m) };
            // SAFETY: removes a member from a local set.
            unsafe { libc::sigdelset(&mut mask, libc::SIGBUS) };
            // SAFETY: zeroed is a valid sigset_t.
            let mut saved: libc::sigset_t = unsafe { std::mem::zeroed() };
            // SAFETY: changes this thread's mask; restored below.
            unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &mask, &mut saved) };
            // SAFETY: the program installed this function as a SIGBUS
            // handler of the kind its flags say; we call it as the kernel
            // would.
            unsafe {
                if program.sa_flags & libc::SA_SIGINFO != 0 {
                    let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                        std::mem::transmute(handler);
                    f(sig, info, ctx);
                } else {
                    let f: extern "C" fn(libc::c_int) = std::mem::transmute(handler);
                    f(sig);
                }
                libc::pthread_sigmask(libc::SIG_SETMASK, &saved, std::ptr::null_mut());
            }
            if program.sa_flags & libc::SA_RESETHAND != 0 {
                // SAFETY: zeroed is SIG_DFL with no flags.
                PROGRAM.store(&unsafe { std::mem::zeroed() });
            }
            // A handler that changed SIGBUS's action changed the program's
            // disposition: record it, and put ours back in front.
            take_front();
        }
    }
}

/// SIGBUS's default action, the end of the process with a core dump, as
/// it would come without uswap.
fn default_action(sent: bool) {
    // SAFETY: zeroed is SIG_DFL with no flags and an empty mask.
    let dfl: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: plain signal calls on this process and thread.
    unsafe {
        kernel_sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
        if sent {
            // Sent, not raised by an access: it would not come again by
            // itself.  Raise it under the default action, unblocked.
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGBUS);
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::raise(libc::SIGBUS);
            // Still here (a debugger, a stopped-and-continued process):
            // the program goes on, and so does uswap.
            kernel_sigaction(libc::SIGBUS, &ours(), std::ptr::null_mut());
        }
        // A fault returns: the access repeats under SIG_DFL and the
        // kernel's default action applies, with the real siginfo.
    }
}
