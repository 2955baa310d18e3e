//! The program's signal set-up, kept from getting in the way of uswap's
//! SIGBUS handler: `sigaction`, `signal`, `sigprocmask`,
//! `pthread_sigmask` and `sigaltstack`, interposed on libc's.
//!
//! # The SIGBUS disposition
//!
//! In SIGBUS mode uswap serves faults in its own SIGBUS handler, which
//! must stay first: a program that installs its own (Redis's crash
//! reporter, Python's `faulthandler`, a JVM) would otherwise receive
//! uswap's faults, and take a page that is merely swapped out for a
//! crash, until the watchdog put uswap's handler back (every 100 ms).  So
//! a program's SIGBUS action is recorded as its disposition instead of
//! being installed, and uswap's handler passes it every SIGBUS that is not
//! a uswap fault (`uswap::pager::program_sigbus_action`).  Other signals,
//! and SIGBUS where uswap's handler is not installed (handler-thread
//! mode), go to libc unchanged.
//!
//! # Masks
//!
//! A thread that blocks SIGBUS cannot have a fault served in SIGBUS mode:
//! the kernel kills the process at its first touch of a page that is out.
//! Programs block every signal as a matter of course: a server before it
//! starts its workers (`sigfillset` + `pthread_sigmask`, then `sigwait` in
//! one thread), Python before `vfork`, a handler installed with a full
//! `sa_mask`.  So in SIGBUS mode `sigprocmask` and `pthread_sigmask` never
//! block SIGBUS (nor SIGSYS) on a program's thread, though they report it
//! blocked where the program asked (`uswap::pager::program_sigmask`: a
//! SIGBUS sent meanwhile waits until unblocked), and `sigaction` takes
//! them out of every handler's `sa_mask`.  uswap's own calls, from this
//! library's code, pass through.
//!
//! # Alternate stacks
//!
//! The kernel delivers a signal of an `SA_ONSTACK` handler (uswap's SIGBUS
//! handler is one; Python's faulthandler installs others) onto the
//! thread's alternate stack, and cannot if a page of it is out: it kills
//! the thread with SIGSEGV instead.  An alternate stack in the paged heap
//! (Python allocates faulthandler's with malloc) is pinned while it is
//! installed: its pages stay in, writable, until the thread installs
//! another, disables it, or ends.

use std::cell::RefCell;

use libc::{c_int, sighandler_t};
use uswap::pager::{program_sigbus_action, program_sigmask, serving_sigbus, Pinned, NEVER_BLOCKED};

use crate::callers::ours;

thread_local! {
    /// The pin on this thread's alternate stack, while it is one in the
    /// heap; let go when it is replaced, disabled, or the thread ends.
    static ALT_STACK: RefCell<Option<Pinned<'static>>> = const { RefCell::new(None) };
}

/// `act` with [`NEVER_BLOCKED`] taken out of its mask, where uswap serves
/// SIGBUS faults.
fn unmasked(act: &libc::sigaction) -> libc::sigaction {
    let mut a = *act;
    if serving_sigbus() {
        for s in NEVER_BLOCKED {
            // SAFETY: a valid set, ours.
            unsafe { libc::sigdelset(&mut a.sa_mask, s) };
        }
    }
    a
}

/// Pin `[sp, sp + size)` where it is in the heap; None elsewhere.
fn pin_stack(sp: *const libc::c_void, size: usize) -> Option<Pinned<'static>> {
    crate::pins::span(sp as usize, size, true)
}

/// The interposed calls.  Their callers are C programs: each function's
/// contract is the C one (its manual page).
#[allow(clippy::missing_safety_doc)] // the contract is the C one, above
mod interpose {
    use super::*;

    /// `sigaction(2)`.
    #[no_mangle]
    pub unsafe extern "C" fn sigaction(
        sig: c_int,
        act: *const libc::sigaction,
        old: *mut libc::sigaction,
    ) -> c_int {
        // SAFETY: the C contract: `act` and `old` are null or valid.
        if sig == libc::SIGBUS && program_sigbus_action(unsafe { act.as_ref() }, unsafe { old.as_mut() }) {
            return 0;
        }
        if sig == libc::SIGSYS {
            // SAFETY: as above.
            let (act, old) = unsafe { (act.as_ref(), old.as_mut()) };
            if crate::guard::program_action(act, old) {
                return 0;
            }
        }
        let f = next!("sigaction" as fn(c_int, *const libc::sigaction, *mut libc::sigaction) -> c_int);
        // SAFETY: the C contract: `act` is null or valid.
        let Some(act) = (unsafe { act.as_ref() }) else {
            // SAFETY: the C contract.
            return unsafe { f(sig, act, old) };
        };
        let act = unmasked(act);
        // SAFETY: the C contract.
        unsafe { f(sig, &act, old) }
    }

    with_caller!(sigprocmask(how: c_int, set: *const libc::sigset_t, old: *mut libc::sigset_t) -> c_int, "rcx", sigprocmask_from);
    with_caller!(pthread_sigmask(how: c_int, set: *const libc::sigset_t, old: *mut libc::sigset_t) -> c_int, "rcx", pthread_sigmask_from);

    unsafe extern "C" fn sigprocmask_from(
        how: c_int,
        set: *const libc::sigset_t,
        old: *mut libc::sigset_t,
        caller: usize,
    ) -> c_int {
        let f = next!("sigprocmask" as fn(c_int, *const libc::sigset_t, *mut libc::sigset_t) -> c_int);
        // SAFETY: the C contract; `f` is libc's (-1 and errno).
        unsafe { mask(f, how, set, old, caller) }
    }

    unsafe extern "C" fn pthread_sigmask_from(
        how: c_int,
        set: *const libc::sigset_t,
        old: *mut libc::sigset_t,
        caller: usize,
    ) -> c_int {
        let f = next!("pthread_sigmask" as fn(c_int, *const libc::sigset_t, *mut libc::sigset_t) -> c_int);
        // SAFETY: the C contract; `f` is libc's (an error number back).
        unsafe { mask(f, how, set, old, caller) }
    }

    /// A mask call `f` (libc's `sigprocmask` or `pthread_sigmask`) made
    /// from `caller`: uswap's own pass through, the program's go through
    /// `program_sigmask`.
    ///
    /// # Safety
    /// As `f`'s: `set` and `old` null or valid.
    unsafe fn mask(
        f: unsafe extern "C" fn(c_int, *const libc::sigset_t, *mut libc::sigset_t) -> c_int,
        how: c_int,
        set: *const libc::sigset_t,
        old: *mut libc::sigset_t,
        caller: usize,
    ) -> c_int {
        if ours(caller) {
            // SAFETY: per the contract.
            return unsafe { f(how, set, old) };
        }
        // SAFETY: per the contract; `f` keeps it.
        unsafe { program_sigmask(how, set, old, |h, s, o| f(h, s, o)) }
    }

    /// `sigaltstack(2)`: an alternate stack in the heap is pinned while
    /// installed.  Made through copies of ours, both ways:
    /// `rt_sigaltstack` is not the system-call guard's to trap (a signal's
    /// return would undo it), and the program's own structures may be
    /// heap memory that is out; read and written here, they are its own
    /// accesses, served.
    #[no_mangle]
    pub unsafe extern "C" fn sigaltstack(ss: *const libc::stack_t, old: *mut libc::stack_t) -> c_int {
        let f = next!("sigaltstack" as fn(*const libc::stack_t, *mut libc::stack_t) -> c_int);
        // SAFETY: the C contract: `ss` is null or valid.
        let new = unsafe { ss.as_ref() }.copied();
        let pin = new
            .filter(|n| n.ss_flags & libc::SS_DISABLE == 0)
            .and_then(|n| pin_stack(n.ss_sp, n.ss_size));
        // SAFETY: zeroed is a valid stack_t.
        let mut prev: libc::stack_t = unsafe { std::mem::zeroed() };
        let new_ptr = new
            .as_ref()
            .map_or(std::ptr::null(), |n| n as *const libc::stack_t);
        // SAFETY: the C contract, on our copies.
        let rc = unsafe { f(new_ptr, &mut prev) };
        if rc != 0 {
            return rc;
        }
        if !old.is_null() {
            // SAFETY: the C contract: `old` is valid.
            unsafe { *old = prev };
        }
        if new.is_some() {
            // The old stack's pin goes, the new one's stays.
            ALT_STACK.with(|a| *a.borrow_mut() = pin);
        }
        0
    }

    /// `signal(2)`, glibc's: BSD semantics (`SA_RESTART`, the handler
    /// stays installed).
    #[no_mangle]
    pub unsafe extern "C" fn signal(sig: c_int, handler: sighandler_t) -> sighandler_t {
        if sig == libc::SIGBUS || sig == libc::SIGSYS {
            // SAFETY: zeroed is a valid sigaction (empty mask).
            let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
            new.sa_sigaction = handler;
            new.sa_flags = libc::SA_RESTART;
            // SAFETY: as above.
            let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
            let kept = if sig == libc::SIGBUS {
                program_sigbus_action(Some(&new), Some(&mut old))
            } else {
                crate::guard::program_action(Some(&new), Some(&mut old))
            };
            if kept {
                return old.sa_sigaction;
            }
        }
        let f = next!("signal" as fn(c_int, sighandler_t) -> sighandler_t);
        // SAFETY: the C contract.
        unsafe { f(sig, handler) }
    }
}
