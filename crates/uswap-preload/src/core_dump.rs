//! Core files that hold the whole program.
//!
//! The kernel writes a core file by reading the dying process's pages
//! itself, and a page uswap has out (swapped, or staged) is a missing
//! page of a userfaultfd region to it: a read that may not wait, so a
//! hole in the file (14,000 of 300,000 objects of a Python program were
//! there).  So for each signal whose default action dumps core, where the
//! program leaves that default, uswap installs a handler of its own
//! (`SA_RESETHAND`: the default is back as it runs) that brings the
//! memory in, up to `RLIMIT_CORE`, with the budget held open
//! (`Swap::hold_in`), then lets the signal take its default action: a
//! fault (SIGSEGV, SIGBUS, SIGILL, SIGFPE raised by an instruction) by
//! returning to the instruction, which faults again; a signal sent (kill,
//! `abort`, `raise`, a breakpoint already past) by sending it again,
//! delivered as the handler returns.
//!
//! The program sees none of it: `sigaction` and `signal` report the
//! default where uswap's handler stands in for it, a handler the program
//! installs replaces uswap's, and setting the default again puts uswap's
//! back.  No core file is wanted (`RLIMIT_CORE` 0, a process not
//! dumpable) and nothing is brought in.

use std::sync::atomic::{AtomicBool, Ordering};

use libc::c_int;

/// The signals whose default action dumps core (signal(7)), but SIGBUS
/// and SIGSYS: their dispositions are uswap's fault path's and the
/// system-call guard's, which pass a signal of the program's on
/// (`program_sigbus_action`, `guard::program_action`).
pub(crate) const DUMPING: [c_int; 8] = [
    libc::SIGQUIT,
    libc::SIGILL,
    libc::SIGTRAP,
    libc::SIGABRT,
    libc::SIGFPE,
    libc::SIGSEGV,
    libc::SIGXCPU,
    libc::SIGXFSZ,
];

/// Per signal number: uswap's handler stands in for the program's
/// default.
static OURS: [AtomicBool; 65] = [const { AtomicBool::new(false) }; 65];

fn dumping(sig: c_int) -> bool {
    DUMPING.contains(&sig)
}

/// libc's `sigaction`, past this library's.
fn libc_sigaction(sig: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int {
    let f = next!("sigaction" as fn(c_int, *const libc::sigaction, *mut libc::sigaction) -> c_int);
    // SAFETY: `act` and `old` are null or valid, as the callers pass them.
    unsafe { f(sig, act, old) }
}

/// uswap's handler for `sig`.
fn install(sig: c_int) -> bool {
    // SAFETY: zeroed is a valid sigaction (an empty mask).
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = before_dump as *const () as usize;
    act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESETHAND | libc::SA_RESTART;
    let ok = libc_sigaction(sig, &act, std::ptr::null_mut()) == 0;
    OURS[sig as usize].store(ok, Ordering::Release);
    ok
}

/// At start: uswap's handler for each dumping signal the program leaves
/// at its default (all of them, at a program's start; a process `exec`ed
/// keeps only ignored ones, which stay so).
pub(crate) fn start() {
    for sig in DUMPING {
        // SAFETY: zeroed is a valid sigaction.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        if libc_sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_DFL {
            install(sig);
        }
    }
}

/// The program's `sigaction` for a dumping signal: true when handled here
/// (the caller returns 0), false for libc's as it is.
pub(crate) fn program_action(
    sig: c_int,
    act: Option<&libc::sigaction>,
    old: Option<&mut libc::sigaction>,
) -> bool {
    if !dumping(sig) || crate::running::RUNNING.get().is_none() {
        return false;
    }
    let ours = OURS[sig as usize].load(Ordering::Acquire);
    let to_default = act.is_some_and(|a| a.sa_sigaction == libc::SIG_DFL);
    if !ours && !to_default {
        return false;
    }
    // What the program is told it had: the default where uswap's stood in.
    // SAFETY: zeroed is a valid sigaction (SIG_DFL, an empty mask).
    let mut prev: libc::sigaction = unsafe { std::mem::zeroed() };
    if !ours && libc_sigaction(sig, std::ptr::null(), &mut prev) != 0 {
        return false;
    }
    if let Some(a) = act {
        if to_default {
            // The default, with uswap's handler standing in (installed now
            // where it was not).
            if !ours && !install(sig) {
                return false;
            }
        } else {
            // The program's own handler (or SIG_IGN) replaces uswap's.
            if libc_sigaction(sig, a, std::ptr::null_mut()) != 0 {
                return false;
            }
            OURS[sig as usize].store(false, Ordering::Release);
        }
    }
    if let Some(o) = old {
        *o = prev;
    }
    true
}

/// uswap's handler for a dumping signal the program left at its default
/// (`SA_RESETHAND`: the default is back as this runs).
extern "C" fn before_dump(sig: c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    OURS[sig as usize].store(false, Ordering::Relaxed);
    // SAFETY: errno is this thread's; kept for the code interrupted.
    let errno = unsafe { *libc::__errno_location() };
    let limit = core_limit();
    if limit > 0 {
        if let Some(r) = crate::running::RUNNING.get() {
            r.swap.hold_in(limit);
        }
    }
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let code = unsafe { (*info).si_code };
    let fault = matches!(sig, libc::SIGSEGV | libc::SIGILL | libc::SIGFPE) && code > 0;
    if !fault {
        // Sent, not raised by the instruction: sent again, to this thread,
        // delivered to the default action when this handler returns.
        // SAFETY: system calls with no memory-safety preconditions.
        unsafe {
            libc::syscall(libc::SYS_tgkill, libc::getpid(), libc::gettid(), sig);
        }
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// The most bytes a core file of this process may hold: 0 where none is
/// written (`RLIMIT_CORE` 0, a process not dumpable after a change of
/// credentials).
fn core_limit() -> u64 {
    // SAFETY: prctl and getrlimit write only the struct given.
    unsafe {
        if libc::prctl(libc::PR_GET_DUMPABLE) <= 0 {
            return 0;
        }
        let mut rl: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_CORE, &mut rl) != 0 {
            return 0;
        }
        if rl.rlim_cur == libc::RLIM_INFINITY {
            u64::MAX
        } else {
            rl.rlim_cur
        }
    }
}
