//! The process-wide SIGBUS handler that serves faults on the faulting
//! thread ([`FaultMode::Sigbus`]), and what it keeps of the program's:
//! the program's own SIGBUS disposition, emulated behind it, and the
//! watch for handlers installed after it and threads that block SIGBUS.
//! Everything it calls (`fault/`, `evict/`, the instance) calls
//! nothing back.
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

//! Where the handler runs, and the stacks it moves to, are `altstack.rs`'s.

use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, Once};

use crossbeam_utils::CachePadded;

use crate::pager::entry::altstack::{call_on_stack, spare, stack_to_serve_on, ServeOn};
use crate::pager::fault::serve::{self as fault, Access};
use crate::pager::fault::stall::Stall;
use crate::pager::instance::gate;
use crate::pager::instance::inner::Inner;
use crate::pager::instance::page::Kind;
use crate::pager::instance::regions::{lookup, Hit};
use crate::pager::instance::report;
use crate::pager::instance::signals::{self, SignalsBlocked};

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

/// Serve a SIGBUS fault at `addr`; false when it is not in a region (the
/// signal is then the program's).
pub(crate) fn serve_signal(addr: u64, access: Access, tid: i32) -> bool {
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
    if inner.states()[id as usize].load().is(Kind::Poisoned) {
        return false;
    }
    let start = crate::sys::monotonic_ns();
    inner.registry().stall_begin(tid);
    let mut stall = Stall::new();
    match unit {
        Some(base) => {
            fault::serve_unit(inner, base, id, addr, access, &mut stall);
        }
        None => {
            fault::serve(inner, addr, id, access, &mut stall);
        }
    }
    inner.registry().stall_end();
    let took = crate::sys::monotonic_ns().saturating_sub(start);
    inner.counters().fault_ns.add(took);
    inner.registry().fault_latency(took);
    stall.count(inner, took);
    true
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
            waits_for_window: true,
        };
    }
    // SAFETY: an SA_SIGINFO handler's third argument is its ucontext_t.
    let err = unsafe { (*(ctx as *const libc::ucontext_t)).uc_mcontext.gregs[libc::REG_ERR as usize] };
    Access {
        present: Some(err & 1 != 0),
        write: err & 2 != 0,
        waits_for_window: true,
    }
}

/// Elsewhere the fault path asks the page tables (`mincore`), and a
/// write takes one more (write-protect) fault.
#[cfg(not(target_arch = "x86_64"))]
fn access(_ctx: *mut libc::c_void) -> Access {
    Access {
        present: None,
        write: false,
        waits_for_window: true,
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
#[cfg_attr(not(feature = "internal"), allow(dead_code))]
pub(crate) fn program_sigbus_action(
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
pub(crate) fn install() {
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
pub(crate) fn watch(scan_threads: bool, inner: &Inner) {
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
            .registry()
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
        // Around uswap's own work only: the program's handler (below)
        // may leave by `siglongjmp`, and would leave the mark behind.
        let _scope = signals::HandlerScope::enter();
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
