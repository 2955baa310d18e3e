//! Signal masks: the guards that keep asynchronous signals away from a
//! thread while it holds the pager's locks, and uswap's own threads, born
//! with every signal blocked.  Why they are needed is "The rule for the
//! handler" in `entry.rs`.

use std::thread::JoinHandle;

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
pub(super) struct SignalsBlocked {
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

/// Spawn a uswap thread with every signal blocked from its first
/// instruction (a new thread inherits its creator's mask, so the creator
/// blocks them around the spawn).
pub(super) fn spawn<F: FnOnce() + Send + 'static>(name: &str, f: F) -> JoinHandle<()> {
    // SAFETY: sigfillset on a local set; pthread_sigmask on this thread.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
    }
    let t = std::thread::Builder::new().name(name.into()).spawn(f);
    // SAFETY: restores this thread's mask.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    t.unwrap_or_else(|e| panic!("cannot start the {name} thread: {e}"))
}

/// Whether the calling thread blocks SIGBUS.
pub(super) fn sigbus_blocked_here() -> bool {
    // SAFETY: reads this thread's mask into a local set.
    unsafe {
        let mut cur: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut cur);
        libc::sigismember(&cur, libc::SIGBUS) == 1
    }
}
