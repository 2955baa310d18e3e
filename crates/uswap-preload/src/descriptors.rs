//! The program's descriptor calls, kept off uswap's descriptors.
//!
//! uswap's descriptors (the userfaultfd, swap files, pidfd, io_uring
//! rings, a forked child's pipe) sit above the program's soft descriptor
//! limit (`uswap::descriptors`), out of reach of the numbers the kernel
//! gives the program and of every number it may probe.  What is left is a
//! program that lists them (`/proc/self/fd`, `/dev/fd`), or closes or
//! replaces numbers it never opened: a daemon's `close_range(3, ~0U, 0)`
//! or `closefrom(3)`, a `dup2` onto a number it chose.  These calls are
//! interposed here (the listings in `listing.rs`):
//!
//! - `close` of one of uswap's fails with `EBADF`, as a number the
//!   program never opened would (it is not the program's);
//! - `close_range` and `closefrom` close everything in the range around
//!   uswap's (each piece one `close_range`; `CLOSE_RANGE_UNSHARE` on the
//!   first only);
//! - `dup2` and `dup3` onto one of uswap's fail with `EBADF`, with one
//!   line saying so: the program would otherwise write its data into a
//!   swap file, or uswap its pages into the program's file.
//!
//! uswap's own code in this library closes its own descriptors through
//! the same symbols; a call whose return address is in this library's
//! code passes through.  So do the raw system calls made through libc's
//! `syscall(2)`, interposed here too.

use libc::{c_int, c_long, c_uint};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::callers::ours;

use uswap::descriptors::{is_uswaps, uswaps_in, MAX};

/// Move uswap's descriptors out of the program's reach from now on:
/// above its soft descriptor limit (`uswap::descriptors::keep_out_of_reach`).
pub(crate) fn start() {
    uswap::descriptors::keep_out_of_reach();
}

fn set_errno(e: i32) {
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() = e };
}

/// Say once that the program tried to take one of uswap's numbers.
fn refused_dup(fd: c_int) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        crate::running::say(&format!(
            "uswap run: the program asked for descriptor {fd}, which uswap holds (its swap device or userfaultfd); refused with EBADF so that neither writes into the other's file. uswap keeps its descriptors from {} up: have the program use lower numbers",
            uswap::descriptors::floor()
        ));
    }
}

/// `close_range(first, last, flags)` around uswap's descriptors: one
/// call per piece between them.
fn close_around(first: c_uint, last: c_uint, flags: c_uint) -> c_int {
    let clamp = |v: c_uint| v.min(i32::MAX as c_uint) as i32;
    let mut mine = [0; MAX];
    let n = uswaps_in(clamp(first), clamp(last), &mut mine);
    let mut flags = flags;
    let mut rc = 0;
    let mut piece = |from: c_uint, to: c_uint| {
        // SAFETY: the system call, on numbers none of which is uswap's.
        if unsafe { crate::syscalls::raw(libc::SYS_close_range, [from as _, to as _, flags as _, 0, 0, 0]) }
            < 0
        {
            rc = -1;
        }
        // The table is unshared once, by the first piece.
        flags &= !(libc::CLOSE_RANGE_UNSHARE as c_uint);
    };
    let mut from = first;
    for &fd in &mine[..n] {
        let fd = fd as c_uint;
        if fd > from {
            piece(from, fd - 1);
        }
        from = fd + 1;
    }
    if from <= last {
        piece(from, last);
    }
    rc
}

/// The interposed calls, entered through a shim that passes the return
/// address on as one more argument (`heap.rs` does the same for malloc).
/// Their callers are C programs: each function's contract is C's.
#[allow(clippy::missing_safety_doc)] // the contract is the C one, above
mod interpose {
    use super::*;

    with_caller!(close(fd: c_int) -> c_int, "rsi", close_from);
    with_caller!(dup2(old: c_int, new: c_int) -> c_int, "rdx", dup2_from);
    with_caller!(dup3(old: c_int, new: c_int, flags: c_int) -> c_int, "rcx", dup3_from);
    with_caller!(close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int, "rcx", close_range_from);
    with_caller!(closefrom(low: c_int) -> (), "rsi", closefrom_from);

    unsafe extern "C" fn close_from(fd: c_int, caller: usize) -> c_int {
        if !ours(caller) && is_uswaps(fd) {
            set_errno(libc::EBADF);
            return -1;
        }
        let f = next!("close" as fn(c_int) -> c_int);
        // SAFETY: the C contract.
        unsafe { f(fd) }
    }

    unsafe extern "C" fn dup2_from(old: c_int, new: c_int, caller: usize) -> c_int {
        if !ours(caller) && old != new && is_uswaps(new) {
            refused_dup(new);
            set_errno(libc::EBADF);
            return -1;
        }
        let f = next!("dup2" as fn(c_int, c_int) -> c_int);
        // SAFETY: the C contract.
        unsafe { f(old, new) }
    }

    unsafe extern "C" fn dup3_from(old: c_int, new: c_int, flags: c_int, caller: usize) -> c_int {
        if !ours(caller) && old != new && is_uswaps(new) {
            refused_dup(new);
            set_errno(libc::EBADF);
            return -1;
        }
        let f = next!("dup3" as fn(c_int, c_int, c_int) -> c_int);
        // SAFETY: the C contract.
        unsafe { f(old, new, flags) }
    }

    unsafe extern "C" fn close_range_from(first: c_uint, last: c_uint, flags: c_int, caller: usize) -> c_int {
        if ours(caller) || first > last {
            let f = next!("close_range" as fn(c_uint, c_uint, c_int) -> c_int);
            // SAFETY: the C contract.
            return unsafe { f(first, last, flags) };
        }
        close_around(first, last, flags as c_uint)
    }

    unsafe extern "C" fn closefrom_from(low: c_int, caller: usize) {
        if ours(caller) {
            let f = next!("closefrom" as fn(c_int) -> ());
            // SAFETY: the C contract.
            return unsafe { f(low) };
        }
        // glibc's closefrom falls back to closing one by one where the
        // system call fails; this one closes what it can and is done.
        close_around(low.max(0) as c_uint, c_uint::MAX, 0);
    }
}

/// The raw `close`, `close_range`, `dup2` and `dup3` system calls, as the
/// interposed `syscall` sees them: None to pass the call on, else the
/// result (-1 with errno set).
pub(crate) fn raw(nr: libc::c_long, a: [libc::c_long; 3]) -> Option<libc::c_long> {
    match nr {
        libc::SYS_close if is_uswaps(a[0] as c_int) => {
            set_errno(libc::EBADF);
            Some(-1)
        }
        libc::SYS_dup2 | libc::SYS_dup3 if a[0] != a[1] && is_uswaps(a[1] as c_int) => {
            refused_dup(a[1] as c_int);
            set_errno(libc::EBADF);
            Some(-1)
        }
        libc::SYS_close_range if a[0] as c_uint <= a[1] as c_uint => {
            Some(close_around(a[0] as c_uint, a[1] as c_uint, a[2] as c_uint) as libc::c_long)
        }
        _ => None,
    }
}

/// The interposed `syscall(2)`: how a program makes a call libc has no
/// function for, or makes one around libc (`syscall(SYS_close_range, 3,
/// ~0U, 0)`); the descriptor calls among them are kept off uswap's
/// descriptors as `close` and the rest are.  Variadic in C; on x86-64 the six
/// arguments any call can have are in their registers and on the stack
/// whether or not the caller passed them, and unused ones are ignored by
/// the kernel.
#[allow(clippy::missing_safety_doc)] // the contract is the C one
mod interpose_syscall {
    use super::*;

    #[no_mangle]
    pub unsafe extern "C" fn syscall(
        nr: c_long,
        a1: c_long,
        a2: c_long,
        a3: c_long,
        a4: c_long,
        a5: c_long,
        a6: c_long,
    ) -> c_long {
        if let Some(r) = raw(nr, [a1, a2, a3]).or_else(|| crate::listing::raw(nr, [a1, a2, a3])) {
            return r;
        }
        let f = next!("syscall" as fn(c_long, c_long, c_long, c_long, c_long, c_long, c_long) -> c_long);
        // SAFETY: the C contract: the arguments pass through.
        unsafe { f(nr, a1, a2, a3, a4, a5, a6) }
    }
}
