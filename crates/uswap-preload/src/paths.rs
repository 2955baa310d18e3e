//! The interposed calls that take paths and argument vectors: the
//! path, a heap string as often as not (Redis's file names, Python's
//! `os.stat` argument), is read by the kernel, and so are an `exec`'s
//! `argv` and `envp`.  Each pins its strings (and any buffer the kernel
//! stores into) for the call, as `calls.rs` does for buffers; `open` and
//! `openat` are variadic in C: the mode is read from its register whether
//! or not the caller passed it, and libc reads it only with
//! `O_CREAT`/`O_TMPFILE`, as the kernel does.
#![allow(clippy::missing_safety_doc)] // the contract is the C one

use uswap::pager::Pinned;

use crate::calls::{in_heap, pin, pinned_call};
use crate::pins::chunk;

/// Pin the NUL-terminated string at `s` (a path, an argument) for the
/// kernel to read: its length is found first, which brings it in.
fn pin_str(s: *const libc::c_char) -> Option<Pinned<'static>> {
    if s.is_null() || chunk().is_none() || !in_heap(s.cast(), 1) {
        return None;
    }
    // SAFETY: a C string, per the caller's contract.
    let n = unsafe { libc::strlen(s) } + 1;
    pin(s.cast(), n, false)
}

/// Pin a NULL-terminated array of strings (`argv`, `envp`) and each
/// string.
fn pin_strs(v: *const *const libc::c_char) -> Vec<Pinned<'static>> {
    let mut pins = Vec::new();
    if v.is_null() || chunk().is_none() {
        return pins;
    }
    let mut n = 0;
    // SAFETY: a NULL-terminated array, per the caller's contract.
    while !unsafe { *v.add(n) }.is_null() {
        n += 1;
    }
    pins.extend(pin(
        v.cast(),
        (n + 1) * std::mem::size_of::<*const libc::c_char>(),
        false,
    ));
    for i in 0..n {
        // SAFETY: within the array just measured.
        pins.extend(pin_str(unsafe { *v.add(i) }));
    }
    pins
}

/// Read every byte of the C string at `s` (a path, an argument) where it
/// is in the heap: its pages come in, as the program's own read would
/// bring them, and are not held.
fn touch_str(s: *const libc::c_char) {
    if !s.is_null() && chunk().is_some() && in_heap(s.cast(), 1) {
        // SAFETY: a C string, per the caller's contract; strlen reads it.
        std::hint::black_box(unsafe { libc::strlen(s) });
    }
}

extern "C" {
    static environ: *const *const libc::c_char;
}

/// The process's environment (`environ`), as `execv` passes it.
fn current_environ() -> *const *const libc::c_char {
    // SAFETY: libc's variable, read once.
    unsafe { std::ptr::read_volatile(&raw const environ) }
}

/// [`touch_str`] for a NULL-terminated array of strings and the array.
fn touch_strs(v: *const *const libc::c_char) {
    if v.is_null() || chunk().is_none() {
        return;
    }
    let mut i = 0;
    loop {
        // SAFETY: a NULL-terminated array, per the caller's contract.
        let s = unsafe { std::ptr::read_volatile(v.add(i)) };
        if s.is_null() {
            return;
        }
        touch_str(s);
        i += 1;
    }
}

/// An `exec` of `path` with `argv` and `envp` (each may be null): their
/// pages brought in, then `call`, again while it fails with EFAULT (a
/// page taken out before the kernel read it), a few times.
fn exec_touched(
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    call: impl Fn() -> libc::c_int,
) -> libc::c_int {
    let mut tries = 0;
    loop {
        touch_str(path);
        touch_strs(argv);
        touch_strs(envp);
        let rc = call();
        // SAFETY: errno is this thread's.
        let efault = rc == -1 && unsafe { *libc::__errno_location() } == libc::EFAULT;
        tries += 1;
        if !efault || chunk().is_none() || tries == 16 {
            return rc;
        }
    }
}

use libc::{c_char, c_int, c_uint, mode_t, size_t, ssize_t, DIR, FILE};

pinned_call!("open", fn open(p: *const c_char, flags: c_int, mode: c_uint) -> c_int, paths [p],
    sys [libc::SYS_openat, libc::AT_FDCWD, p, flags, mode]);
pinned_call!("open64", fn open64(p: *const c_char, flags: c_int, mode: c_uint) -> c_int, paths [p],
    sys [libc::SYS_openat, libc::AT_FDCWD, p, flags, mode]);
pinned_call!("openat", fn openat(d: c_int, p: *const c_char, flags: c_int, mode: c_uint) -> c_int, paths [p],
    sys [libc::SYS_openat, d, p, flags, mode]);
pinned_call!("openat64", fn openat64(d: c_int, p: *const c_char, flags: c_int, mode: c_uint) -> c_int, paths [p],
    sys [libc::SYS_openat, d, p, flags, mode]);
pinned_call!("creat", fn creat(p: *const c_char, mode: mode_t) -> c_int, paths [p]);
pinned_call!("fopen", fn fopen(p: *const c_char, m: *const c_char) -> *mut FILE, paths [p, m]);
pinned_call!("fopen64", fn fopen64(p: *const c_char, m: *const c_char) -> *mut FILE, paths [p, m]);
pinned_call!("opendir", fn opendir(p: *const c_char) -> *mut DIR, paths [p]);
pinned_call!("stat", fn stat(p: *const c_char, st: *mut libc::stat) -> c_int,
    paths [p], stores [(st, std::mem::size_of::<libc::stat>())],
    sys [libc::SYS_newfstatat, libc::AT_FDCWD, p, st, 0]);
pinned_call!("stat64", fn stat64(p: *const c_char, st: *mut libc::stat) -> c_int,
    paths [p], stores [(st, std::mem::size_of::<libc::stat>())],
    sys [libc::SYS_newfstatat, libc::AT_FDCWD, p, st, 0]);
pinned_call!("lstat", fn lstat(p: *const c_char, st: *mut libc::stat) -> c_int,
    paths [p], stores [(st, std::mem::size_of::<libc::stat>())],
    sys [libc::SYS_newfstatat, libc::AT_FDCWD, p, st, libc::AT_SYMLINK_NOFOLLOW]);
pinned_call!("lstat64", fn lstat64(p: *const c_char, st: *mut libc::stat) -> c_int,
    paths [p], stores [(st, std::mem::size_of::<libc::stat>())],
    sys [libc::SYS_newfstatat, libc::AT_FDCWD, p, st, libc::AT_SYMLINK_NOFOLLOW]);
pinned_call!("fstatat", fn fstatat(d: c_int, p: *const c_char, st: *mut libc::stat, fl: c_int) -> c_int,
    paths [p], stores [(st, std::mem::size_of::<libc::stat>())],
    sys [libc::SYS_newfstatat, d, p, st, fl]);
pinned_call!("fstatat64", fn fstatat64(d: c_int, p: *const c_char, st: *mut libc::stat, fl: c_int) -> c_int,
    paths [p], stores [(st, std::mem::size_of::<libc::stat>())],
    sys [libc::SYS_newfstatat, d, p, st, fl]);
pinned_call!("fstat", fn fstat(fd: c_int, st: *mut libc::stat) -> c_int,
    paths [], stores [(st, std::mem::size_of::<libc::stat>())],
    sys [libc::SYS_fstat, fd, st]);
pinned_call!("fstat64", fn fstat64(fd: c_int, st: *mut libc::stat) -> c_int,
    paths [], stores [(st, std::mem::size_of::<libc::stat>())],
    sys [libc::SYS_fstat, fd, st]);
pinned_call!("statx", fn statx(d: c_int, p: *const c_char, fl: c_int, mask: c_uint, st: *mut libc::statx) -> c_int,
    paths [p], stores [(st, std::mem::size_of::<libc::statx>())],
    sys [libc::SYS_statx, d, p, fl, mask, st]);
pinned_call!("access", fn access(p: *const c_char, m: c_int) -> c_int, paths [p],
    sys [libc::SYS_faccessat, libc::AT_FDCWD, p, m]);
pinned_call!("faccessat", fn faccessat(d: c_int, p: *const c_char, m: c_int, fl: c_int) -> c_int, paths [p]);
pinned_call!("rename", fn rename(a: *const c_char, b: *const c_char) -> c_int, paths [a, b]);
pinned_call!("renameat", fn renameat(da: c_int, a: *const c_char, db: c_int, b: *const c_char) -> c_int,
    paths [a, b]);
pinned_call!("renameat2", fn renameat2(da: c_int, a: *const c_char, db: c_int, b: *const c_char, fl: c_uint) -> c_int,
    paths [a, b]);
pinned_call!("unlink", fn unlink(p: *const c_char) -> c_int, paths [p]);
pinned_call!("unlinkat", fn unlinkat(d: c_int, p: *const c_char, fl: c_int) -> c_int, paths [p]);
pinned_call!("rmdir", fn rmdir(p: *const c_char) -> c_int, paths [p]);
pinned_call!("mkdir", fn mkdir(p: *const c_char, m: mode_t) -> c_int, paths [p]);
pinned_call!("mkdirat", fn mkdirat(d: c_int, p: *const c_char, m: mode_t) -> c_int, paths [p]);
pinned_call!("chdir", fn chdir(p: *const c_char) -> c_int, paths [p]);
pinned_call!("chmod", fn chmod(p: *const c_char, m: mode_t) -> c_int, paths [p]);
pinned_call!("truncate", fn truncate(p: *const c_char, n: libc::off_t) -> c_int, paths [p]);
pinned_call!("symlink", fn symlink(a: *const c_char, b: *const c_char) -> c_int, paths [a, b]);
pinned_call!("link", fn link(a: *const c_char, b: *const c_char) -> c_int, paths [a, b]);
pinned_call!("readlink", fn readlink(p: *const c_char, buf: *mut c_char, n: size_t) -> ssize_t,
    paths [p], stores [(buf, n)]);
pinned_call!("readlinkat", fn readlinkat(d: c_int, p: *const c_char, buf: *mut c_char, n: size_t) -> ssize_t,
    paths [p], stores [(buf, n)]);
pinned_call!("realpath", fn realpath(p: *const c_char, out: *mut c_char) -> *mut c_char,
    paths [p], stores [(out, libc::PATH_MAX as usize)]);
pinned_call!("getcwd", fn getcwd(buf: *mut c_char, n: size_t) -> *mut c_char, stores [(buf, n)]);

// `execve(2)` and its kin: the path, and every argument and
// environment string with the arrays that hold them, read by the
// kernel (a program's argument lists live in its heap: Python's
// `subprocess` builds them there).  Brought in, not pinned: a
// successful exec never returns to let go of a pin, and the caller
// is often a vfork child, whose pins would be its parent's for good.
// A page taken out between the touch and the kernel's copy fails the
// call with EFAULT before it changes anything: touched and tried
// again.  `posix_spawn`'s child shares this memory until it `exec`s,
// reading them while this thread waits: pinned for the call.
#[no_mangle]
pub unsafe extern "C" fn execve(
    p: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let f = next!("execve" as fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int);
    // SAFETY: the C contract: the arguments pass through.
    exec_touched(p, argv, envp, || unsafe { f(p, argv, envp) })
}

#[no_mangle]
pub unsafe extern "C" fn execv(p: *const c_char, argv: *const *const c_char) -> c_int {
    let f = next!("execv" as fn(*const c_char, *const *const c_char) -> c_int);
    // SAFETY: the C contract: the arguments pass through.
    exec_touched(p, argv, current_environ(), || unsafe { f(p, argv) })
}

#[no_mangle]
pub unsafe extern "C" fn execvp(p: *const c_char, argv: *const *const c_char) -> c_int {
    let f = next!("execvp" as fn(*const c_char, *const *const c_char) -> c_int);
    // SAFETY: the C contract: the arguments pass through.
    exec_touched(p, argv, current_environ(), || unsafe { f(p, argv) })
}

// `system(3)` and `popen(3)`: libc spawns `sh -c COMMAND` with the
// environment (both may hold heap strings: a command built at run
// time, `putenv` of a heap string) and waits for the exec.
#[no_mangle]
pub unsafe extern "C" fn system(cmd: *const c_char) -> c_int {
    let f = next!("system" as fn(*const c_char) -> c_int);
    let _cmd = pin_str(cmd);
    let _env = pin_strs(current_environ());
    // SAFETY: the C contract: the argument passes through.
    unsafe { f(cmd) }
}

#[no_mangle]
pub unsafe extern "C" fn popen(cmd: *const c_char, mode: *const c_char) -> *mut FILE {
    let f = next!("popen" as fn(*const c_char, *const c_char) -> *mut FILE);
    let _cmd = pin_str(cmd);
    let _mode = pin_str(mode);
    let _env = pin_strs(current_environ());
    // SAFETY: the C contract: the arguments pass through.
    unsafe { f(cmd, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn execvpe(
    p: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let f = next!("execvpe" as fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int);
    // SAFETY: the C contract: the arguments pass through.
    exec_touched(p, argv, envp, || unsafe { f(p, argv, envp) })
}

#[no_mangle]
pub unsafe extern "C" fn fexecve(fd: c_int, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
    let f = next!("fexecve" as fn(c_int, *const *const c_char, *const *const c_char) -> c_int);
    // SAFETY: the C contract: the arguments pass through.
    exec_touched(std::ptr::null(), argv, envp, || unsafe { f(fd, argv, envp) })
}

#[no_mangle]
pub unsafe extern "C" fn execveat(
    d: c_int,
    p: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
    flags: c_int,
) -> c_int {
    let f = next!(
        "execveat" as fn(c_int, *const c_char, *const *const c_char, *const *const c_char, c_int) -> c_int
    );
    // SAFETY: the C contract: the arguments pass through.
    exec_touched(p, argv, envp, || unsafe { f(d, p, argv, envp, flags) })
}
pinned_call!("posix_spawn", fn posix_spawn(pid: *mut libc::pid_t, p: *const c_char,
    fa: *const libc::posix_spawn_file_actions_t, at: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char, envp: *const *mut c_char) -> c_int, paths [p], strs [argv, envp]);
pinned_call!("posix_spawnp", fn posix_spawnp(pid: *mut libc::pid_t, p: *const c_char,
    fa: *const libc::posix_spawn_file_actions_t, at: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char, envp: *const *mut c_char) -> c_int, paths [p], strs [argv, envp]);
