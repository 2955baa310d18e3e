//! The process's own descriptor listings without uswap's descriptors.
//!
//! A program that lists its open descriptors (a close-everything loop, a
//! descriptor-leak check in a test suite, `ls -l /proc/self/fd`) reads the
//! directory `/proc/self/fd` (`/dev/fd` is a link to it, and so are the
//! per-thread `/proc/self/task/TID/fd`), or `fdinfo` beside it.  uswap's
//! descriptors are above the program's descriptor limit already
//! (`uswap::descriptors`), so nothing probing numbers finds them; a
//! listing would.  So the directory reads are interposed: `readdir`,
//! `readdir64` and their `_r` forms skip an entry naming one of uswap's
//! descriptors when the directory is this process's `fd` or `fdinfo`;
//! `scandir`, `scandir64` and `scandirat` (whose reads inside libc no
//! interposer sees) have such entries taken out of their answer; and
//! `getdents64`, the function and the raw call through `syscall(2)`, has
//! them taken out of its buffer.  A runtime that makes the system call
//! itself (Go) still lists them.
//!
//! Whether a directory is such a listing is decided once per `DIR`, by
//! its descriptor (a `/proc` file system, a link naming this process's
//! `fd` or `fdinfo`), and forgotten at `closedir`: a `readdir` over any
//! other directory costs a lookup in a small table.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use libc::{c_char, c_int, c_long, dirent, dirent64, DIR};
use uswap::descriptors::is_uswaps;

/// `statfs`'s type of `/proc`.
const PROC_SUPER_MAGIC: i64 = 0x9fa0;

/// Whether descriptor `fd` is a directory listing this process's
/// descriptors: `/proc/PID/fd`, `/proc/PID/fdinfo`, or the same under
/// `/proc/PID/task/TID/`.
fn lists_descriptors(fd: c_int) -> bool {
    // SAFETY: zeroed is a valid statfs; the raw call fills it.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: the system call itself, into a local struct.
    if unsafe { libc::syscall(libc::SYS_fstatfs, fd, &mut fs) } != 0 || fs.f_type != PROC_SUPER_MAGIC {
        return false;
    }
    let mut link = [0u8; 64];
    let path = format!("/proc/self/fd/{fd}\0");
    // SAFETY: the system call itself, into a local buffer of its length.
    let n = unsafe {
        libc::syscall(
            libc::SYS_readlinkat,
            libc::AT_FDCWD,
            path.as_ptr(),
            link.as_mut_ptr(),
            link.len(),
        )
    };
    let Ok(n) = usize::try_from(n) else {
        return false;
    };
    let Ok(link) = std::str::from_utf8(&link[..n.min(link.len())]) else {
        return false;
    };
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let Some(rest) = link.strip_prefix(&format!("/proc/{pid}/")) else {
        return false;
    };
    let last = match rest.strip_prefix("task/") {
        Some(t) => t.split_once('/').map_or("", |(_, l)| l),
        None => rest,
    };
    last == "fd" || last == "fdinfo"
}

/// Whether `name` (a directory entry's, NUL-terminated) is one of uswap's
/// descriptor numbers.
fn names_ours(name: *const c_char) -> bool {
    // SAFETY: a directory entry's name, NUL-terminated.
    let name = unsafe { std::ffi::CStr::from_ptr(name) };
    name.to_str()
        .ok()
        .and_then(|s| s.parse::<c_int>().ok())
        .is_some_and(is_uswaps)
}

/// `DIR`s looked at, and what they are: 0 unknown, 1 another directory,
/// 2 a listing of descriptors.  Open directories are few; past the
/// table's room a directory is looked at on every read.
const ROOM: usize = 64;
static DIRS: [(AtomicUsize, AtomicU8); ROOM] = [const { (AtomicUsize::new(0), AtomicU8::new(0)) }; ROOM];

/// Whether `dir` lists this process's descriptors, decided once.
fn is_listing(dir: *mut DIR) -> bool {
    let key = dir as usize;
    let start = (key >> 4) % ROOM;
    let mut free = None;
    for i in 0..ROOM {
        let (d, kind) = &DIRS[(start + i) % ROOM];
        match d.load(Ordering::Acquire) {
            k if k == key => match kind.load(Ordering::Acquire) {
                0 => break,
                k => return k == 2,
            },
            0 if free.is_none() => free = Some((start + i) % ROOM),
            _ => {}
        }
    }
    // SAFETY: a DIR the caller opened.
    let listing = lists_descriptors(unsafe { libc::dirfd(dir) });
    if let Some(i) = free {
        let (d, kind) = &DIRS[i];
        if d.compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            kind.store(if listing { 2 } else { 1 }, Ordering::Release);
        }
    }
    listing
}

/// `dir` is closed: its entry goes.
fn forget(dir: *mut DIR) {
    let key = dir as usize;
    for (d, kind) in &DIRS {
        if d.load(Ordering::Acquire) == key {
            kind.store(0, Ordering::Release);
            d.store(0, Ordering::Release);
        }
    }
}

/// Take uswap's descriptors out of a `getdents64` answer of `len` bytes
/// in `buf` read from `fd`: the new length.
///
/// # Safety
/// `buf` holds `len` bytes of `linux_dirent64` records, as the kernel
/// wrote them.
unsafe fn compact(fd: c_int, buf: *mut u8, len: usize) -> usize {
    if len == 0 || !lists_descriptors(fd) {
        return len;
    }
    let (mut from, mut to) = (0usize, 0usize);
    // linux_dirent64: u64 ino, i64 off, u16 reclen, u8 type, name.
    const RECLEN_AT: usize = 16;
    const NAME_AT: usize = 19;
    while from < len {
        // SAFETY: within the records the kernel wrote (the caller's
        // contract); `reclen` steps from one record to the next.
        unsafe {
            let rec = buf.add(from);
            let reclen = usize::from(std::ptr::read_unaligned(rec.add(RECLEN_AT).cast::<u16>()));
            if reclen == 0 {
                return len;
            }
            if !names_ours(rec.add(NAME_AT).cast()) {
                if to != from {
                    std::ptr::copy(rec, buf.add(to), reclen);
                }
                to += reclen;
            }
            from += reclen;
        }
    }
    to
}

/// The raw `getdents64` through the interposed `syscall(2)`: None to pass
/// it on.
pub(crate) fn raw(nr: c_long, a: [c_long; 3]) -> Option<c_long> {
    if nr != libc::SYS_getdents64 {
        return None;
    }
    // libc's `syscall`, not the trampoline's: the system-call guard traps
    // it there and pins a heap buffer, as it did before this listing.
    let f = next!("syscall" as fn(c_long, c_long, c_long, c_long) -> c_long);
    loop {
        // SAFETY: the program's call, as it made it.
        let n = unsafe { f(nr, a[0], a[1], a[2]) };
        if n < 0 {
            return Some(n);
        }
        // SAFETY: the kernel wrote `n` bytes of records into the buffer.
        let kept = unsafe { compact(a[0] as c_int, a[1] as *mut u8, n as usize) };
        // A buffer of nothing but uswap's is read past: an empty answer
        // would say the directory ended.
        if n == 0 || kept > 0 {
            return Some(kept as c_long);
        }
    }
}

/// Take uswap's descriptors out of a `scandir` answer of `n` entries:
/// the new count.
///
/// # Safety
/// `list` holds `n` entries `scandir` allocated with `malloc`.
unsafe fn prune<T>(list: *mut *mut T, n: c_int, name_at: usize) -> c_int {
    if n <= 0 || list.is_null() {
        return n;
    }
    // SAFETY: the array scandir returned, of `n` entries.
    let entries = unsafe { std::slice::from_raw_parts_mut(list, n as usize) };
    let mut kept = 0;
    for i in 0..entries.len() {
        let e = entries[i];
        // SAFETY: an entry scandir allocated; its name at `name_at`.
        if unsafe { names_ours(e.cast::<u8>().add(name_at).cast()) } {
            // SAFETY: allocated by scandir with malloc; ours to free now.
            unsafe { libc::free(e.cast()) };
        } else {
            entries[kept] = e;
            kept += 1;
        }
    }
    kept as c_int
}

/// Whether `path` (relative to `dirfd`) lists this process's descriptors.
fn path_lists_descriptors(dirfd: c_int, path: *const c_char) -> bool {
    // SAFETY: the system call itself, with the caller's path.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat,
            dirfd,
            path,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    } as c_int;
    if fd < 0 {
        return false;
    }
    let yes = lists_descriptors(fd);
    // SAFETY: the descriptor just opened.
    unsafe { libc::syscall(libc::SYS_close, fd) };
    yes
}

/// The interposed calls; their callers are C programs, each function's
/// contract the C one (its manual page).
#[allow(clippy::missing_safety_doc)]
mod interpose {
    use super::*;

    type Filter<T> = Option<unsafe extern "C" fn(*const T) -> c_int>;
    type Compar<T> = Option<unsafe extern "C" fn(*mut *const T, *mut *const T) -> c_int>;

    macro_rules! readdir {
        ($name:ident, $sym:literal, $t:ty) => {
            #[no_mangle]
            pub unsafe extern "C" fn $name(dir: *mut DIR) -> *mut $t {
                let f = next!($sym as fn(*mut DIR) -> *mut $t);
                loop {
                    // SAFETY: the C contract.
                    let e = unsafe { f(dir) };
                    // SAFETY: an entry readdir returned: its name is there.
                    if e.is_null() || !is_listing(dir) || !names_ours(unsafe { (*e).d_name.as_ptr() }) {
                        return e;
                    }
                }
            }
        };
    }
    readdir!(readdir, "readdir", dirent);
    readdir!(readdir64, "readdir64", dirent64);

    macro_rules! readdir_r {
        ($name:ident, $sym:literal, $t:ty) => {
            #[no_mangle]
            pub unsafe extern "C" fn $name(dir: *mut DIR, entry: *mut $t, result: *mut *mut $t) -> c_int {
                let f = next!($sym as fn(*mut DIR, *mut $t, *mut *mut $t) -> c_int);
                loop {
                    // SAFETY: the C contract.
                    let rc = unsafe { f(dir, entry, result) };
                    // SAFETY: as the C contract: `*result` is null or `entry`.
                    let e = unsafe { *result };
                    if rc != 0 || e.is_null() || !is_listing(dir) {
                        return rc;
                    }
                    // SAFETY: the entry readdir_r filled: its name is there.
                    if !names_ours(unsafe { (*e).d_name.as_ptr() }) {
                        return rc;
                    }
                }
            }
        };
    }
    readdir_r!(readdir_r, "readdir_r", dirent);
    readdir_r!(readdir64_r, "readdir64_r", dirent64);

    #[no_mangle]
    pub unsafe extern "C" fn closedir(dir: *mut DIR) -> c_int {
        forget(dir);
        let f = next!("closedir" as fn(*mut DIR) -> c_int);
        // SAFETY: the C contract.
        unsafe { f(dir) }
    }

    macro_rules! scandir {
        ($name:ident, $sym:literal, $t:ty) => {
            #[no_mangle]
            pub unsafe extern "C" fn $name(
                path: *const c_char,
                list: *mut *mut *mut $t,
                filter: Filter<$t>,
                compar: Compar<$t>,
            ) -> c_int {
                let f = next!($sym as fn(*const c_char, *mut *mut *mut $t, Filter<$t>, Compar<$t>) -> c_int);
                // SAFETY: the C contract.
                let n = unsafe { f(path, list, filter, compar) };
                if n > 0 && path_lists_descriptors(libc::AT_FDCWD, path) {
                    // SAFETY: scandir's answer, `n` entries.
                    return unsafe { prune(*list, n, std::mem::offset_of!($t, d_name)) };
                }
                n
            }
        };
    }
    scandir!(scandir, "scandir", dirent);
    scandir!(scandir64, "scandir64", dirent64);

    #[no_mangle]
    pub unsafe extern "C" fn scandirat(
        dirfd: c_int,
        path: *const c_char,
        list: *mut *mut *mut dirent,
        filter: Filter<dirent>,
        compar: Compar<dirent>,
    ) -> c_int {
        let f = next!(
            "scandirat"
                as fn(c_int, *const c_char, *mut *mut *mut dirent, Filter<dirent>, Compar<dirent>) -> c_int
        );
        // SAFETY: the C contract.
        let n = unsafe { f(dirfd, path, list, filter, compar) };
        if n > 0 && path_lists_descriptors(dirfd, path) {
            // SAFETY: scandir's answer, `n` entries.
            return unsafe { prune(*list, n, std::mem::offset_of!(dirent, d_name)) };
        }
        n
    }

    #[no_mangle]
    pub unsafe extern "C" fn getdents64(fd: c_int, buf: *mut libc::c_void, len: usize) -> isize {
        let f = next!("getdents64" as fn(c_int, *mut libc::c_void, usize) -> isize);
        loop {
            // SAFETY: the C contract.
            let n = unsafe { f(fd, buf, len) };
            if n <= 0 {
                return n;
            }
            // SAFETY: the kernel wrote `n` bytes of records into `buf`.
            let kept = unsafe { compact(fd, buf.cast(), n as usize) };
            // As `raw`: never an empty answer before the end.
            if kept > 0 {
                return kept as isize;
            }
        }
    }
}
