//! The calls through which the kernel touches the program's buffers,
//! interposed in SIGBUS mode: each pins the heap pages of its buffers for
//! the length of the call.
//!
//! In SIGBUS mode uswap serves the program's own accesses only: a system
//! call that meets a heap page that is out, or stores into a clean page
//! (clean pages are write-protected, to see the first write), fails with
//! `EFAULT` (and a user-mode-only userfaultfd, all an ordinary user gets,
//! could serve nothing else).  So before such a call its buffers' heap
//! pages are brought in as the program would bring them (a read, or a
//! write that changes nothing) and held against eviction
//! (`Region::pin`); the guard lets go when the call returns.
//!
//! Covered (each under its `_chk`, `64` and `_unlocked` names where glibc
//! has them): `read`, `pread`, `readv`, `preadv`, `write`, `pwrite`,
//! `writev`, `pwritev`, `recv`, `recvfrom`, `recvmsg`, `send`, `sendto`,
//! `sendmsg`, `fread`, `fwrite` (for large requests glibc's stdio moves
//! data between the file and the caller's buffer directly, by a system
//! call inside libc that no interposer sees), `getrandom`, `poll`,
//! `epoll_wait`; and the waits on futex words that glibc aborts on when
//! the kernel answers `EFAULT` (`pthread_mutex_lock`,
//! `pthread_cond_wait` and `_timedwait`, `sem_wait`).  libc's own
//! buffers (stdio's, `opendir`'s) are never in the heap (`heap.rs`,
//! routing by caller), so the calls libc makes on them need nothing.
//!
//! A long `read`, `write`, `pread`, `pwrite`, `fread` or `fwrite` is done
//! a chunk at a time (a quarter of the budget, at most 16 MiB), so that
//! pinning never holds more than the budget allows; reads go on past a
//! chunk only on regular files, where a full chunk means more is there (a
//! pipe's reader would wait for data the single call would not have).
//! Vectors, sockets (a datagram is one message) and the rest are pinned
//! whole.
//!
//! In handler-thread mode none of this runs: uswap's thread serves the
//! kernel's faults.

use std::ffi::c_void;

use uswap::pager::Pinned;

use crate::pins::chunk;
use crate::running::RUNNING;

/// Pin the heap pages of `[addr, addr + len)`: for the kernel to store
/// into them (`write`) or to read them.  None when pinning is off or no
/// byte of the span is in the heap.
pub(crate) fn pin(addr: *const c_void, len: usize, write: bool) -> Option<Pinned<'static>> {
    chunk()?;
    // Asked first: uswap's own reads and writes of its swap files come
    // here too (std's `read_at` calls the interposed `pread64`), from its
    // threads and from its fault handler on the program's, and a buffer
    // outside the heap has nothing to pin and no route to decide.
    if !in_heap(addr, len) {
        return None;
    }
    if crate::heap::to_libc() {
        // A thread that blocks SIGBUS cannot have a page brought in (the
        // kernel would end the process at the touch): its call fails with
        // EFAULT instead, as it would without uswap's help.
        return None;
    }
    crate::pins::span(addr as usize, len, write)
}

/// Whether any byte of `[addr, addr + len)` is in the heap while pinning
/// is on: only then is a long call cut into chunks.
pub(crate) fn in_heap(addr: *const c_void, len: usize) -> bool {
    let Some(r) = RUNNING.get() else {
        return false;
    };
    let base = r.region.as_ptr() as usize;
    let a = addr as usize;
    a < base + r.region.len() && a.saturating_add(len) > base
}

/// Do `call(at, len, done)` over `[buf, buf + n)`, where `at` is `buf +
/// done`, pinned a chunk at a time; as one call would: the bytes moved,
/// or the first call's error (with its errno).  `go_on` says whether a
/// full chunk may be followed by another.
fn chunked(
    buf: *const c_void,
    n: usize,
    store: bool,
    go_on: impl FnOnce() -> bool,
    mut call: impl FnMut(*const c_void, usize, usize) -> isize,
) -> isize {
    let chunk = match chunk() {
        Some(c) if n > c && in_heap(buf, n) => c,
        _ => {
            let _pinned = pin(buf, n, store);
            return call(buf, n, 0);
        }
    };
    let go_on = go_on();
    let mut done = 0usize;
    loop {
        let piece = (n - done).min(chunk);
        let at = buf.cast::<u8>().wrapping_add(done).cast::<c_void>();
        let got = {
            let _pinned = pin(at, piece, store);
            call(at, piece, done)
        };
        if got < 0 {
            // Bytes moved before the error: the call moved them.
            return if done > 0 { done as isize } else { got };
        }
        done += got as usize;
        if (got as usize) < piece || done == n || !go_on {
            return done as isize;
        }
    }
}

/// Whether `fd` is a stream socket: a send there may be cut anywhere.
fn stream_socket(fd: i32) -> bool {
    let mut ty: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt into a local int.
    let ok = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TYPE,
            (&mut ty as *mut libc::c_int).cast(),
            &mut len,
        )
    } == 0;
    ok && ty == libc::SOCK_STREAM
}

/// Whether `fd` is a regular file: a read there that filled a chunk may
/// go on to the next without waiting for anything.
fn regular_file(fd: i32) -> bool {
    // SAFETY: fstat into a local struct.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        libc::fstat(fd, &mut st) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFREG
    }
}

/// Pin every buffer of an iovec array (for the kernel to store into them,
/// or to read them).
///
/// # Safety
/// `iov` points to `cnt` iovecs, as the call taking them requires.
pub(crate) unsafe fn pin_iov(iov: *const libc::iovec, cnt: i32, store: bool) -> Vec<Pinned<'static>> {
    if chunk().is_none() || iov.is_null() || cnt <= 0 {
        return Vec::new();
    }
    // The array itself, which the kernel reads.
    let array = pin(
        iov.cast(),
        cnt as usize * std::mem::size_of::<libc::iovec>(),
        false,
    );
    // SAFETY: per the contract (and pinned: the kernel will read it).
    let iov = unsafe { std::slice::from_raw_parts(iov, cnt as usize) };
    let mut pins: Vec<_> = iov
        .iter()
        .filter_map(|v| pin(v.iov_base, v.iov_len, store))
        .collect();
    pins.extend(array);
    pins
}

/// Pin what a `msghdr` points to: its name, its control data and its
/// vector (the kernel stores into all of them on receipt).
///
/// # Safety
/// `msg` is null or a valid `msghdr`, as the call taking it requires.
unsafe fn pin_msg(msg: *const libc::msghdr, store: bool) -> Vec<Pinned<'static>> {
    if chunk().is_none() || msg.is_null() {
        return Vec::new();
    }
    // SAFETY: per the contract.
    let m = unsafe { &*msg };
    // SAFETY: the message's own vector.
    let mut pins = unsafe { pin_iov(m.msg_iov, m.msg_iovlen as i32, store) };
    pins.extend(pin(msg.cast(), std::mem::size_of::<libc::msghdr>(), store));
    pins.extend(pin(m.msg_name, m.msg_namelen as usize, store));
    pins.extend(pin(m.msg_control, m.msg_controllen, store));
    pins
}

/// An interposed call: its paths (C strings the kernel reads), the
/// buffers the kernel stores into (`stores`) or reads (`reads`), its
/// iovec arrays (with whether the kernel stores into their buffers) and
/// its NULL-terminated string arrays (`strs`: `argv`, `envp`), each
/// pinned for the call; then libc's function of the same name, with the
/// arguments unchanged.
macro_rules! pinned_call {
    ($name:literal, fn $fname:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty
     $(, paths [$($p:ident),*])?
     $(, stores [$(($b:expr, $len:expr)),*])?
     $(, reads [$(($rb:expr, $rlen:expr)),*])?
     $(, iovs [$(($iov:ident, $cnt:ident, $st:expr)),*])?
     $(, strs [$($a:ident),*])?
     $(, sys [$nr:expr $(, $sa:expr)*])? $(,)?) => {
        #[no_mangle]
        pub unsafe extern "C" fn $fname($($arg: $ty),*) -> $ret {
            let f = next!($name as fn($($ty),*) -> $ret);
            let _paths: &[Option<Pinned<'static>>] = &[$($(pin_str($p.cast())),*)?];
            let _stores: &[Option<Pinned<'static>>] = &[$($($crate::calls::pin($b.cast(), $len, true)),*)?];
            let _reads: &[Option<Pinned<'static>>] = &[$($($crate::calls::pin($rb.cast(), $rlen, false)),*)?];
            // SAFETY: the C contract: `cnt` iovecs.
            let _iovs: &[Vec<Pinned<'static>>] = &[$($(unsafe { $crate::calls::pin_iov($iov, $cnt, $st) }),*)?];
            let _strs: &[Vec<Pinned<'static>>] = &[$($(pin_strs($a.cast())),*)?];
            $(
                // SAFETY: the system call libc's function makes, with its
                // arguments.
                if let Some(r) = unsafe { $crate::calls::direct($nr, [$($sa as libc::c_long),*]) } {
                    return r as $ret;
                }
            )?
            // SAFETY: the C contract: the arguments pass through.
            unsafe { f($($arg),*) }
        }
    };
}
pub(crate) use pinned_call;

/// Under the system-call guard, system call `nr` with `args` (up to six)
/// from its trampoline, in libc's convention (-1 and errno): the buffers
/// are pinned already, and through libc the call would be trapped and
/// pinned again, at the cost of a signal.  None without the guard: the
/// caller calls libc.  Not a cancellation point, as libc's would be.
///
/// # Safety
/// As the system call's.
#[inline]
pub(crate) unsafe fn direct<const N: usize>(
    nr: libc::c_long,
    args: [libc::c_long; N],
) -> Option<libc::c_long> {
    if !crate::guard::active() {
        return None;
    }
    let mut a = [0; 6];
    a[..N].copy_from_slice(&args);
    // SAFETY: per the contract.
    Some(crate::syscalls::libc_ret(unsafe { crate::syscalls::raw(nr, a) }))
}

/// The interposed calls.  Their callers are C programs: each function's
/// contract is the C one (its manual page); each passes its arguments on
/// to libc's function of the same name unchanged, after pinning.
#[allow(clippy::missing_safety_doc)] // the contract is the C one, above
mod interpose {
    use super::*;
    use libc::{c_int, iovec, msghdr, off_t, size_t, sockaddr, socklen_t, ssize_t, FILE};

    // ---- read family: the kernel stores into the buffer.

    #[no_mangle]
    pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
        let f = next!("read" as fn(c_int, *mut c_void, size_t) -> ssize_t);
        // SAFETY: the caller's buffer, in pieces.
        chunked(
            buf,
            n,
            true,
            || regular_file(fd),
            |at, len, _| unsafe {
                direct(libc::SYS_read, [fd as _, at as _, len as _])
                    .map_or_else(|| f(fd, at.cast_mut(), len), |r| r as ssize_t)
            },
        )
    }

    pinned_call!("__read_chk", fn __read_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t) -> ssize_t,
        stores [(buf, n.min(buflen))]);

    #[no_mangle]
    pub unsafe extern "C" fn pread(fd: c_int, buf: *mut c_void, n: size_t, off: off_t) -> ssize_t {
        let f = next!("pread" as fn(c_int, *mut c_void, size_t, off_t) -> ssize_t);
        // SAFETY: the caller's buffer, in pieces, at the matching offsets.
        chunked(
            buf,
            n,
            true,
            || regular_file(fd),
            |at, len, done| unsafe {
                let off = off + done as off_t;
                direct(libc::SYS_pread64, [fd as _, at as _, len as _, off as _])
                    .map_or_else(|| f(fd, at.cast_mut(), len, off), |r| r as ssize_t)
            },
        )
    }

    #[no_mangle]
    pub unsafe extern "C" fn pread64(fd: c_int, buf: *mut c_void, n: size_t, off: off_t) -> ssize_t {
        // SAFETY: the same call on 64-bit.
        unsafe { pread(fd, buf, n, off) }
    }

    pinned_call!("__pread64_chk", fn __pread64_chk(fd: c_int, buf: *mut c_void, n: size_t, off: off_t, buflen: size_t) -> ssize_t,
        stores [(buf, n.min(buflen))]);

    pinned_call!("readv", fn readv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t, iovs [(iov, cnt, true)],
        sys [libc::SYS_readv, fd, iov, cnt]);

    pinned_call!("preadv", fn preadv(fd: c_int, iov: *const iovec, cnt: c_int, off: off_t) -> ssize_t,
        iovs [(iov, cnt, true)],
        sys [libc::SYS_preadv, fd, iov, cnt, off, 0]);

    #[no_mangle]
    pub unsafe extern "C" fn preadv64(fd: c_int, iov: *const iovec, cnt: c_int, off: off_t) -> ssize_t {
        // SAFETY: the same call on 64-bit.
        unsafe { preadv(fd, iov, cnt, off) }
    }

    pinned_call!("recv", fn recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t, stores [(buf, n)],
        sys [libc::SYS_recvfrom, fd, buf, n, flags, 0, 0]);

    pinned_call!("__recv_chk", fn __recv_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t, flags: c_int) -> ssize_t,
        stores [(buf, n.min(buflen))]);

    #[no_mangle]
    pub unsafe extern "C" fn recvfrom(
        fd: c_int,
        buf: *mut c_void,
        n: size_t,
        flags: c_int,
        from: *mut sockaddr,
        fromlen: *mut socklen_t,
    ) -> ssize_t {
        let f = next!(
            "recvfrom" as fn(c_int, *mut c_void, size_t, c_int, *mut sockaddr, *mut socklen_t) -> ssize_t
        );
        let _buf = pin(buf, n, true);
        let _len = pin(fromlen.cast(), std::mem::size_of::<socklen_t>(), true);
        // `fromlen`, when given, says how long `from` is.
        let room = if fromlen.is_null() {
            0
        } else {
            // SAFETY: the C contract: a valid `socklen_t`.
            (unsafe { *fromlen }) as usize
        };
        let _from = pin(from.cast(), room, true);
        // SAFETY: the C contract (the system call libc's makes).
        if let Some(r) = unsafe {
            direct(
                libc::SYS_recvfrom,
                [fd as _, buf as _, n as _, flags as _, from as _, fromlen as _],
            )
        } {
            return r as ssize_t;
        }
        // SAFETY: the C contract.
        unsafe { f(fd, buf, n, flags, from, fromlen) }
    }

    #[no_mangle]
    pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
        let f = next!("recvmsg" as fn(c_int, *mut msghdr, c_int) -> ssize_t);
        // SAFETY: the C contract: a valid msghdr.
        let _pinned = unsafe { pin_msg(msg, true) };
        // SAFETY: the C contract.
        if let Some(r) = unsafe { direct(libc::SYS_recvmsg, [fd as _, msg as _, flags as _]) } {
            return r as ssize_t;
        }
        // SAFETY: the C contract.
        unsafe { f(fd, msg, flags) }
    }

    #[no_mangle]
    pub unsafe extern "C" fn fread(buf: *mut c_void, size: size_t, n: size_t, fp: *mut FILE) -> size_t {
        let f = next!("fread" as fn(*mut c_void, size_t, size_t, *mut FILE) -> size_t);
        // SAFETY: the caller's buffer of `n` items, in whole items.
        stdio_chunked(buf, size, n, true, |at, items| unsafe {
            f(at.cast_mut(), size, items, fp)
        })
    }

    #[no_mangle]
    pub unsafe extern "C" fn fread_unlocked(
        buf: *mut c_void,
        size: size_t,
        n: size_t,
        fp: *mut FILE,
    ) -> size_t {
        let f = next!("fread_unlocked" as fn(*mut c_void, size_t, size_t, *mut FILE) -> size_t);
        // SAFETY: the caller's buffer of `n` items, in whole items.
        stdio_chunked(buf, size, n, true, |at, items| unsafe {
            f(at.cast_mut(), size, items, fp)
        })
    }

    pinned_call!("__fread_chk", fn __fread_chk(buf: *mut c_void, buflen: size_t, size: size_t, n: size_t, fp: *mut FILE) -> size_t,
        stores [(buf, buflen.min(size.saturating_mul(n)))]);

    pinned_call!("__fread_unlocked_chk", fn __fread_unlocked_chk(buf: *mut c_void, buflen: size_t, size: size_t, n: size_t, fp: *mut FILE) -> size_t,
        stores [(buf, buflen.min(size.saturating_mul(n)))]);

    pinned_call!("getrandom", fn getrandom(buf: *mut c_void, n: size_t, flags: u32) -> ssize_t, stores [(buf, n)],
        sys [libc::SYS_getrandom, buf, n, flags]);

    pinned_call!("poll", fn poll(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: c_int) -> c_int,
        stores [(fds, n as usize * std::mem::size_of::<libc::pollfd>())],
        sys [libc::SYS_poll, fds, n, timeout]);

    pinned_call!("epoll_wait", fn epoll_wait(ep: c_int, events: *mut libc::epoll_event, max: c_int, timeout: c_int) -> c_int,
        stores [(events, max.max(0) as usize * std::mem::size_of::<libc::epoll_event>())],
        sys [libc::SYS_epoll_wait, ep, events, max, timeout]);

    // ---- write family: the kernel reads the buffer.

    #[no_mangle]
    pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
        let f = next!("write" as fn(c_int, *const c_void, size_t) -> ssize_t);
        // SAFETY: the caller's buffer, in pieces.
        chunked(
            buf,
            n,
            false,
            || true,
            |at, len, _| unsafe {
                direct(libc::SYS_write, [fd as _, at as _, len as _])
                    .map_or_else(|| f(fd, at, len), |r| r as ssize_t)
            },
        )
    }

    #[no_mangle]
    pub unsafe extern "C" fn pwrite(fd: c_int, buf: *const c_void, n: size_t, off: off_t) -> ssize_t {
        let f = next!("pwrite" as fn(c_int, *const c_void, size_t, off_t) -> ssize_t);
        // SAFETY: the caller's buffer, in pieces, at the matching offsets.
        chunked(
            buf,
            n,
            false,
            || true,
            |at, len, done| unsafe {
                let off = off + done as off_t;
                direct(libc::SYS_pwrite64, [fd as _, at as _, len as _, off as _])
                    .map_or_else(|| f(fd, at, len, off), |r| r as ssize_t)
            },
        )
    }

    #[no_mangle]
    pub unsafe extern "C" fn pwrite64(fd: c_int, buf: *const c_void, n: size_t, off: off_t) -> ssize_t {
        // SAFETY: the same call on 64-bit.
        unsafe { pwrite(fd, buf, n, off) }
    }

    pinned_call!("writev", fn writev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t, iovs [(iov, cnt, false)],
        sys [libc::SYS_writev, fd, iov, cnt]);

    pinned_call!("pwritev", fn pwritev(fd: c_int, iov: *const iovec, cnt: c_int, off: off_t) -> ssize_t,
        iovs [(iov, cnt, false)],
        sys [libc::SYS_pwritev, fd, iov, cnt, off, 0]);

    #[no_mangle]
    pub unsafe extern "C" fn pwritev64(fd: c_int, iov: *const iovec, cnt: c_int, off: off_t) -> ssize_t {
        // SAFETY: the same call on 64-bit.
        unsafe { pwritev(fd, iov, cnt, off) }
    }

    #[no_mangle]
    pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t {
        // SAFETY: the same call with no address.
        unsafe { sendto(fd, buf, n, flags, std::ptr::null(), 0) }
    }

    /// `sendto(2)`: on a stream socket a long buffer goes a chunk at a
    /// time, as `write` does (a stream takes any split); a datagram is
    /// one message, pinned whole.
    #[no_mangle]
    pub unsafe extern "C" fn sendto(
        fd: c_int,
        buf: *const c_void,
        n: size_t,
        flags: c_int,
        to: *const sockaddr,
        tolen: socklen_t,
    ) -> ssize_t {
        let f =
            next!("sendto" as fn(c_int, *const c_void, size_t, c_int, *const sockaddr, socklen_t) -> ssize_t);
        let _to = pin(to.cast(), tolen as usize, false);
        let one = |at: *const c_void, len: usize| -> ssize_t {
            // SAFETY: the C contract, on a piece of the caller's buffer.
            unsafe {
                direct(
                    libc::SYS_sendto,
                    [fd as _, at as _, len as _, flags as _, to as _, tolen as _],
                )
                .map_or_else(|| f(fd, at, len, flags, to, tolen), |r| r as ssize_t)
            }
        };
        if chunk().is_some_and(|c| n > c) && stream_socket(fd) {
            return chunked(buf, n, false, || true, |at, len, _| one(at, len));
        }
        let _buf = pin(buf, n, false);
        one(buf, n)
    }

    #[no_mangle]
    pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
        let f = next!("sendmsg" as fn(c_int, *const msghdr, c_int) -> ssize_t);
        // SAFETY: the C contract: a valid msghdr.
        let _pinned = unsafe { pin_msg(msg, false) };
        // SAFETY: the C contract.
        if let Some(r) = unsafe { direct(libc::SYS_sendmsg, [fd as _, msg as _, flags as _]) } {
            return r as ssize_t;
        }
        // SAFETY: the C contract.
        unsafe { f(fd, msg, flags) }
    }

    #[no_mangle]
    pub unsafe extern "C" fn fwrite(buf: *const c_void, size: size_t, n: size_t, fp: *mut FILE) -> size_t {
        let f = next!("fwrite" as fn(*const c_void, size_t, size_t, *mut FILE) -> size_t);
        // SAFETY: the caller's buffer of `n` items, in whole items.
        stdio_chunked(buf, size, n, false, |at, items| unsafe { f(at, size, items, fp) })
    }

    #[no_mangle]
    pub unsafe extern "C" fn fwrite_unlocked(
        buf: *const c_void,
        size: size_t,
        n: size_t,
        fp: *mut FILE,
    ) -> size_t {
        let f = next!("fwrite_unlocked" as fn(*const c_void, size_t, size_t, *mut FILE) -> size_t);
        // SAFETY: the caller's buffer of `n` items, in whole items.
        stdio_chunked(buf, size, n, false, |at, items| unsafe { f(at, size, items, fp) })
    }

    // ---- waits on futex words: glibc aborts when the kernel cannot read
    // one (`EFAULT`), so the word's page is held in, writable (a robust
    // or priority-inheriting mutex has the kernel store into it).

    pinned_call!("pthread_mutex_lock", fn pthread_mutex_lock(m: *mut libc::pthread_mutex_t) -> c_int,
        stores [(m, std::mem::size_of::<libc::pthread_mutex_t>())]);

    pinned_call!("pthread_cond_wait", fn pthread_cond_wait(c: *mut libc::pthread_cond_t, m: *mut libc::pthread_mutex_t) -> c_int,
        stores [(c, std::mem::size_of::<libc::pthread_cond_t>()), (m, std::mem::size_of::<libc::pthread_mutex_t>())]);

    pinned_call!("pthread_cond_timedwait", fn pthread_cond_timedwait(c: *mut libc::pthread_cond_t, m: *mut libc::pthread_mutex_t, t: *const libc::timespec) -> c_int,
        stores [(c, std::mem::size_of::<libc::pthread_cond_t>()), (m, std::mem::size_of::<libc::pthread_mutex_t>())],
        reads [(t, std::mem::size_of::<libc::timespec>())]);

    pinned_call!("sem_wait", fn sem_wait(s: *mut libc::sem_t) -> c_int, stores [(s, std::mem::size_of::<libc::sem_t>())]);
}

/// `fread` (`store`: the kernel or stdio stores into the buffer) or
/// `fwrite` of `n` items of `size` bytes, a chunk of whole items at a
/// time: stdio loops until the request is met or the file ends, so a
/// short piece ends it, as it would end the single call.  Only `f`
/// touches the buffer.
fn stdio_chunked(
    buf: *const c_void,
    size: usize,
    n: usize,
    store: bool,
    f: impl Fn(*const c_void, usize) -> usize,
) -> usize {
    let bytes = size.saturating_mul(n);
    let per = match chunk() {
        Some(c) if size > 0 && bytes > c && in_heap(buf, bytes) => (c / size).max(1),
        _ => {
            let _pinned = pin(buf, bytes, store);
            return f(buf, n);
        }
    };
    let mut done = 0;
    while done < n {
        let items = (n - done).min(per);
        let at = buf.cast::<u8>().wrapping_add(done * size).cast::<c_void>();
        let got = {
            let _pinned = pin(at, items * size, store);
            f(at, items)
        };
        done += got;
        if got < items {
            break;
        }
    }
    done
}
