//! Signal masks: the guards that keep asynchronous signals away from a
//! thread while it holds the pager's locks, and uswap's own threads, born
//! with every signal blocked.  Why they are needed is "The rule for the
//! handler" in `entry/sigbus.rs`.

use crate::sys::Mapping;

/// The synchronous signals, left unblocked by [`SignalsBlocked`]: a
/// fault's signal arrives whatever the mask, and blocking it would only
/// turn a SIGBUS the handler could serve into a kill.
const SYNCHRONOUS: [i32; 6] = [
    libc::SIGBUS,
    libc::SIGSEGV,
    libc::SIGILL,
    libc::SIGFPE,
    libc::SIGTRAP,
    libc::SIGSYS,
];

/// Every signal but the synchronous ones.
fn async_signals() -> libc::sigset_t {
    // SAFETY: sigset operations on a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        for s in SYNCHRONOUS {
            libc::sigdelset(&mut set, s);
        }
        set
    }
}

/// Signals blocked on this thread while it lives.  `asynchronous()`: for
/// the calls that take the pager's locks on a program's thread (a fault of
/// theirs stays a fault).  `all()`: for updating the program's SIGBUS
/// disposition, which the handler reads and must not find half written on
/// its own thread, even for a SIGBUS sent with `kill`.
pub(crate) struct SignalsBlocked {
    old: libc::sigset_t,
    /// A thread's mask: restored on the thread that saved it.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl SignalsBlocked {
    pub fn asynchronous() -> Self {
        Self::block(&async_signals())
    }

    pub fn all() -> Self {
        // SAFETY: fills a local set.
        let set = unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut set);
            set
        };
        Self::block(&set)
    }

    fn block(set: &libc::sigset_t) -> Self {
        // SAFETY: zeroed is a valid sigset_t; pthread_sigmask fills `old`.
        let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: valid sets; only this thread's mask changes.
        unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, set, &mut old) };
        SignalsBlocked {
            old,
            _not_send: std::marker::PhantomData,
        }
    }
}

impl Drop for SignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved in `new`, on the same thread
        // (the guard is not Send).
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut()) };
    }
}

/// Signals a program's thread never really blocks while uswap serves
/// SIGBUS faults in the process: SIGBUS, through which its faults are
/// served (the kernel kills a thread that faults with SIGBUS blocked),
/// and SIGSYS, which a system-call guard may trap with the same way.
pub const NEVER_BLOCKED: [i32; 2] = [libc::SIGBUS, libc::SIGSYS];

/// Whether uswap's SIGBUS handler is installed in this process (set once,
/// by the handler's installation in `entry/sigbus.rs`): only then do the
/// program's masks need [`program_sigmask`].
static SERVING_SIGBUS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub(crate) fn set_serving_sigbus() {
    SERVING_SIGBUS.store(true, std::sync::atomic::Ordering::Release);
}

/// Whether uswap serves SIGBUS faults in this process.
#[cfg_attr(not(feature = "internal"), allow(dead_code))]
pub(crate) fn serving_sigbus() -> bool {
    SERVING_SIGBUS.load(std::sync::atomic::Ordering::Acquire)
}

thread_local! {
    /// How deep this thread is in uswap's signal handlers (the SIGBUS
    /// fault handler, and a host library's own, such as `uswap run`'s
    /// system-call guard).  There every signal is blocked, SIGBUS too: the
    /// mask says nothing of the program's, so a decision taken from it
    /// (which allocator a thread's blocks come from) must not be taken
    /// there.  A `Cell` with a const initializer: no allocation, no
    /// destructor, safe to touch from a handler.
    static IN_HANDLER: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// This thread runs one of uswap's signal handlers while it lives.
pub struct HandlerScope(());

impl HandlerScope {
    /// Entered at the top of a handler.
    pub fn enter() -> HandlerScope {
        IN_HANDLER.with(|d| d.set(d.get() + 1));
        HandlerScope(())
    }
}

impl Drop for HandlerScope {
    fn drop(&mut self) {
        IN_HANDLER.with(|d| d.set(d.get() - 1));
    }
}

/// Whether this thread is inside one of uswap's signal handlers: its
/// signal mask is the handler's (everything blocked), not the program's.
/// (Used by the preload library, through the `internal` feature.)
#[cfg_attr(not(feature = "internal"), allow(dead_code))]
pub fn in_handler() -> bool {
    IN_HANDLER.with(std::cell::Cell::get) > 0
}

thread_local! {
    /// Of [`NEVER_BLOCKED`], bit i: the program's mask on this thread
    /// blocks it (bits 0-1), and one was sent meanwhile (bits 2-3).  A
    /// `Cell` with a const initializer: no allocation, no destructor.
    static PROGRAM_MASK: std::cell::Cell<u8> = const { std::cell::Cell::new(0) };
}

fn never_blocked_bit(sig: i32) -> Option<u8> {
    NEVER_BLOCKED.iter().position(|&s| s == sig).map(|i| 1 << i)
}

/// `pthread_sigmask(how, set, old)` as a program sees it while uswap
/// serves SIGBUS faults: `real` (libc's) is called with [`NEVER_BLOCKED`]
/// taken out of `set`, so that a thread that blocks "every signal" (the
/// `sigwait` pattern, a vfork child) can still have its faults served;
/// what the program asked is remembered for the thread and shown in
/// `old`, and a SIGBUS sent to it while it asked for it blocked waits
/// until it unblocks it (then it is raised).  Where uswap serves no
/// SIGBUS faults the call is `real`'s unchanged.
///
/// # Safety
/// As `pthread_sigmask(3)`: `set` and `old` are null or valid.
#[cfg_attr(not(feature = "internal"), allow(dead_code))]
pub unsafe fn program_sigmask(
    how: i32,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
    real: impl FnOnce(i32, *const libc::sigset_t, *mut libc::sigset_t) -> i32,
) -> i32 {
    if !serving_sigbus() {
        return real(how, set, old);
    }
    let before = PROGRAM_MASK.with(std::cell::Cell::get);
    let mut asked = before & 0b11;
    let mut set_copy: libc::sigset_t;
    let mut set_arg = set;
    if !set.is_null() {
        // SAFETY: `set` is valid per the contract; the copy is ours.
        set_copy = unsafe { *set };
        for (i, &s) in NEVER_BLOCKED.iter().enumerate() {
            // SAFETY: a valid set.
            let member = unsafe { libc::sigismember(&set_copy, s) } == 1;
            let bit = 1u8 << i;
            match how {
                libc::SIG_BLOCK if member => asked |= bit,
                libc::SIG_UNBLOCK if member => asked &= !bit,
                libc::SIG_SETMASK => asked = (asked & !bit) | if member { bit } else { 0 },
                _ => {}
            }
            if how != libc::SIG_UNBLOCK {
                // SAFETY: as above.
                unsafe { libc::sigdelset(&mut set_copy, s) };
            }
        }
        set_arg = &set_copy;
    }
    // The old set through a copy of ours: the call is not the system-call
    // guard's to trap (a signal's return would undo it), and the
    // program's set may be heap memory that is out; written here, it is
    // the program's own access, served.
    // SAFETY: zeroed is a valid sigset_t.
    let mut prev: libc::sigset_t = unsafe { std::mem::zeroed() };
    let rc = real(how, set_arg, if old.is_null() { old } else { &mut prev });
    if rc != 0 {
        return rc;
    }
    if !old.is_null() {
        for (i, &s) in NEVER_BLOCKED.iter().enumerate() {
            if before & (1 << i) != 0 {
                // SAFETY: a valid set, ours.
                unsafe { libc::sigaddset(&mut prev, s) };
            }
        }
        // SAFETY: `old` is valid per the contract.
        unsafe { *old = prev };
    }
    let pending = before >> 2;
    PROGRAM_MASK.with(|m| m.set(asked | ((pending & asked) << 2)));
    for (i, &s) in NEVER_BLOCKED.iter().enumerate() {
        if pending & (1 << i) != 0 && asked & (1 << i) == 0 {
            // Sent while blocked, unblocked now: delivered, as the kernel
            // would deliver a pending signal.
            // SAFETY: sends a signal to this thread.
            unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), libc::gettid(), s) };
        }
    }
    0
}

/// Whether signal `sig`, just sent to this thread, is one the program's
/// mask blocks: then it is remembered as pending (and delivered when the
/// program unblocks it) instead of acted on now.
pub(crate) fn held_for_program(sig: i32) -> bool {
    let Some(bit) = never_blocked_bit(sig) else {
        return false;
    };
    PROGRAM_MASK.with(|m| {
        let v = m.get();
        if v & bit == 0 {
            return false;
        }
        m.set(v | (bit << 2));
        true
    })
}

/// Threads being started by uswap now (`spawn`): see
/// [`starting_a_thread`].
static STARTING: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Whether uswap is starting one of its threads now.  What is allocated
/// for a new thread while it is created (its TLS blocks, which the loader
/// takes with the process's `calloc`) must not land in memory uswap pages:
/// a thread whose thread-local storage is swapped out would fault on
/// its first access to it, and a fault handler thread so would wait on
/// itself.  An allocator interposed by a preload (`uswap run`) asks here.
#[cfg_attr(not(feature = "internal"), allow(dead_code))]
pub fn starting_a_thread() -> bool {
    STARTING.load(std::sync::atomic::Ordering::Relaxed) != 0
}

/// One of uswap's threads, joined (or, dropped unjoined, detached).
pub(crate) struct UswapThread {
    id: libc::pthread_t,
    /// Its stack, ours: unmapped once the thread is joined.
    stack: Option<Mapping>,
}

impl UswapThread {
    /// Wait for the thread to end.
    pub fn join(mut self) {
        // SAFETY: a thread this value started and nobody joined.
        unsafe { libc::pthread_join(self.id, std::ptr::null_mut()) };
        self.stack.take();
    }
}

impl Drop for UswapThread {
    fn drop(&mut self) {
        if let Some(mut stack) = self.stack.take() {
            // Not joined: the thread may still run on its stack, which
            // then stays mapped for the life of the process.
            stack.forget();
            // SAFETY: a thread this value started, neither joined nor
            // detached.
            unsafe { libc::pthread_detach(self.id) };
        }
    }
}

// SAFETY: a pthread id and a mapping, both usable from any thread.
unsafe impl Send for UswapThread {}

/// The stack of a uswap thread (and a guard page below it).
const STACK: usize = 2 << 20;

/// Spawn a uswap thread with every signal blocked from its first
/// instruction (a new thread inherits its creator's mask, so the creator
/// blocks them around the spawn), on a stack of uswap's own.  All but
/// SIGSYS: a system call is trapped there only when it names heap memory,
/// which uswap's threads never do of their own accord but may be made to
/// by glibc (a credential change makes every thread repeat the program's
/// call, arguments and all), and a trap on a thread that blocks SIGSYS
/// ends the process; the guard's handler makes such a call as it is.
///
/// Why not `std::thread`: glibc gives a new thread a stack from its cache
/// of stacks of threads that ended, and clears the thread-local storage
/// that stack's last thread had (`get_cached_stack`), reading and freeing
/// blocks that, under `uswap run`, are in the paged heap; in a forked
/// child that adopts an instance (fork.rs) they may be out, and the
/// creator has SIGBUS blocked here, which makes such a fault the end of
/// the process.  A stack given with `pthread_attr_setstack` is never a
/// cached one; what glibc allocates for the thread besides is allocated
/// while [`starting_a_thread`] says so.
pub(crate) fn spawn<F: FnOnce() + Send + 'static>(name: &'static str, f: F) -> UswapThread {
    let fail = |what: &str| -> ! { panic!("cannot start the {name} thread: {what}") };
    let stack = Mapping::new(STACK + crate::PAGE_SIZE, crate::PAGE_SIZE)
        .unwrap_or_else(|e| fail(&format!("no stack: {e}")));
    // SAFETY: the guard page is the mapping's first page, not yet in use.
    unsafe { libc::mprotect(stack.as_ptr().cast(), crate::PAGE_SIZE, libc::PROT_NONE) };
    let body: Box<Box<dyn FnOnce() + Send>> = Box::new(Box::new(move || {
        remember_thread();
        if let Ok(c) = std::ffi::CString::new(name) {
            // SAFETY: names this thread; a name over 15 bytes is refused,
            // which only leaves it unnamed.
            unsafe { libc::pthread_setname_np(libc::pthread_self(), c.as_ptr()) };
        }
        f()
    }));
    extern "C" fn start(arg: *mut libc::c_void) -> *mut libc::c_void {
        // SAFETY: the box `spawn` leaked for this thread, taken once.
        let body = unsafe { Box::from_raw(arg.cast::<Box<dyn FnOnce() + Send>>()) };
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).is_err() {
            // The panic message is out already; the pager cannot go on
            // without its thread.
            std::process::abort();
        }
        // Counted again on the way out, for glibc's own decrement.
        live_threads::count();
        std::ptr::null_mut()
    }
    // SAFETY: sigfillset on a local set; pthread_sigmask on this thread;
    // an attribute object set up, used for one create and destroyed; the
    // stack lies in a mapping this value keeps until the thread is
    // joined.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::sigdelset(&mut all, libc::SIGSYS);
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        libc::pthread_attr_init(&mut attr);
        libc::pthread_attr_setstack(&mut attr, stack.as_ptr().add(crate::PAGE_SIZE).cast(), STACK);
        let mut id: libc::pthread_t = 0;
        let arg = Box::into_raw(body).cast::<libc::c_void>();
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        STARTING.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let rc = libc::pthread_create(&mut id, &attr, start, arg);
        STARTING.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        libc::pthread_attr_destroy(&mut attr);
        if rc != 0 {
            drop(Box::from_raw(arg.cast::<Box<dyn FnOnce() + Send>>()));
            fail(&std::io::Error::from_raw_os_error(rc).to_string());
        }
        live_threads::uncount();
        UswapThread {
            id,
            stack: Some(stack),
        }
    }
}

/// glibc's count of the process's live threads, which uswap's threads
/// stay out of.
///
/// glibc ends the process when its last thread ends: the thread whose
/// return (or `pthread_exit`, the main thread's too) takes the count
/// `__nptl_nthreads` to zero calls `exit(0)`.  Counted, uswap's threads
/// kept a process alive after the program's last thread was gone: a
/// child forked from a thread other than the main one, returning from
/// that thread, stayed with a zombie leader and uswap's threads, and its
/// parent waited for it forever (CPython's test_threading); a signal sent
/// to it stayed pending, every thread left blocking it.  Out of the count,
/// the program's last thread ends the process, as it would without
/// uswap: its threads go with the process (`exit_group`).
///
/// The count is glibc's private symbol, the one its debugger interface
/// reads (`libthread_db`), changed with the atomic operations glibc uses
/// on it.  Where it is not found (another C library), uswap's threads are
/// counted as before.
mod live_threads {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::OnceLock;

    fn counter() -> Option<&'static AtomicU32> {
        static AT: OnceLock<usize> = OnceLock::new();
        let at = *AT.get_or_init(|| {
            // SAFETY: a symbol lookup with a C string.
            unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"__nptl_nthreads".as_ptr()) as usize }
        });
        // SAFETY: glibc's `unsigned int __nptl_nthreads`, static data that
        // lives as long as the process, only ever changed atomically.
        (at != 0).then(|| unsafe { AtomicU32::from_ptr(at as *mut u32) })
    }

    /// A thread of uswap's just made (`pthread_create` counted it): out
    /// of the count.  Its creator is a thread of the program's, counted,
    /// so this never takes the count to zero.
    pub(super) fn uncount() {
        if let Some(c) = counter() {
            c.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// A thread of uswap's ending: counted again, for the decrement glibc
    /// makes as it ends (which, if the program's threads are gone, ends
    /// the process, as it should).
    pub(super) fn count() {
        if let Some(c) = counter() {
            c.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// The thread ids of uswap's threads in this process (0: free entry), for
/// the watchdog that names program threads blocking SIGBUS: by id, not
/// by name (a program may name a thread anything; and the kernel's
/// io_uring workers, named `iou-wrk-N`, run no user code).
static THREADS: [std::sync::atomic::AtomicI32; 64] = [const { std::sync::atomic::AtomicI32::new(0) }; 64];

fn remember_thread() {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    for t in &THREADS {
        if t.compare_exchange(
            0,
            tid,
            std::sync::atomic::Ordering::Relaxed,
            std::sync::atomic::Ordering::Relaxed,
        )
        .is_ok()
        {
            return;
        }
    }
}

/// In a forked child: the threads remembered are the parent's.
pub(crate) fn forget_threads() {
    for t in &THREADS {
        t.store(0, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Whether the calling thread is one of uswap's own.
#[cfg_attr(not(feature = "internal"), allow(dead_code))]
pub fn on_uswap_thread() -> bool {
    // SAFETY: gettid has no preconditions.
    is_uswap_thread(unsafe { libc::gettid() })
}

/// Whether thread `tid` of this process is one of uswap's own.
pub(crate) fn is_uswap_thread(tid: i32) -> bool {
    THREADS
        .iter()
        .any(|t| t.load(std::sync::atomic::Ordering::Relaxed) == tid)
}

/// Whether the calling thread blocks SIGBUS.
pub(crate) fn sigbus_blocked_here() -> bool {
    // SAFETY: reads this thread's mask into a local set.
    unsafe {
        let mut cur: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut cur);
        libc::sigismember(&cur, libc::SIGBUS) == 1
    }
}
