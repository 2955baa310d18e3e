//! The program's SIGBUS handler, kept behind uswap's: `sigaction` and
//! `signal`, interposed on libc's.
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

use libc::{c_int, sighandler_t};
use uswap::pager::program_sigbus_action;

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
        let f = next!("sigaction" as fn(c_int, *const libc::sigaction, *mut libc::sigaction) -> c_int);
        // SAFETY: the C contract.
        unsafe { f(sig, act, old) }
    }

    /// `signal(2)`, glibc's: BSD semantics (`SA_RESTART`, the handler
    /// stays installed).
    #[no_mangle]
    pub unsafe extern "C" fn signal(sig: c_int, handler: sighandler_t) -> sighandler_t {
        if sig == libc::SIGBUS {
            // SAFETY: zeroed is a valid sigaction (empty mask).
            let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
            new.sa_sigaction = handler;
            new.sa_flags = libc::SA_RESTART;
            // SAFETY: as above.
            let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
            if program_sigbus_action(Some(&new), Some(&mut old)) {
                return old.sa_sigaction;
            }
        }
        let f = next!("signal" as fn(c_int, sighandler_t) -> sighandler_t);
        // SAFETY: the C contract.
        unsafe { f(sig, handler) }
    }
}
