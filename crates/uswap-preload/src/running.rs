//! What every part of this library shares, on its ground floor: the
//! running instance (set once, at load, by `init`), and the two ways it
//! speaks, one line on stderr through the system call itself (libc's
//! `write` is interposed).

use std::sync::OnceLock;

use uswap::pager::{FaultMode, Region, Swap};

/// The running instance, and its region (both live until the process
/// ends: the program's heap is in the region).
pub(crate) struct Running {
    pub(crate) swap: Swap,
    pub(crate) region: Region,
    pub(crate) mode: FaultMode,
    /// The process `uswap run` started (a forked child inherits this).
    pub(crate) pid: i32,
    /// The budget `uswap run` was given: the process tree's.
    pub(crate) budget: u64,
}

pub(crate) static RUNNING: OnceLock<Running> = OnceLock::new();

/// End the process with one line on stderr: something this library
/// cannot go on without is missing.
pub(crate) fn fatal(line: &str) -> ! {
    // SAFETY: the system calls themselves (libc's `write` is interposed),
    // with our own bytes; then the end of the process.
    unsafe {
        libc::syscall(libc::SYS_write, 2, line.as_ptr(), line.len());
        libc::syscall(libc::SYS_write, 2, b"\n".as_ptr(), 1usize);
        libc::_exit(uswap::run_env::RUN_FAILED)
    }
}

/// Say one line on stderr (the system call itself: libc's `write` is
/// interposed).
pub(crate) fn say(line: &str) {
    // SAFETY: the system call, with our own bytes.
    unsafe {
        libc::syscall(libc::SYS_write, 2, line.as_ptr(), line.len());
        libc::syscall(libc::SYS_write, 2, b"\n".as_ptr(), 1usize);
    }
}

/// This process, for a line about it: its pid, program and user (a
/// process of the run may have changed its user before its `exec`).
pub(crate) fn who() -> String {
    let exe = std::fs::read_link("/proc/self/exe")
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "?".into());
    // SAFETY: getpid and geteuid have no preconditions.
    let (pid, uid) = unsafe { (libc::getpid(), libc::geteuid()) };
    format!("pid {pid}, {exe}, uid {uid}")
}
