//! uswap's file descriptors, kept out of the program's way.
//!
//! An instance holds descriptors of its own for as long as it runs: the
//! userfaultfd, its swap files, a pidfd for batched discards, io_uring
//! rings, the pipes that tell a forked child's end.  The kernel hands out
//! the lowest free number, so in a process uswap shares with a program
//! (`uswap run`) they would be 3, 4, 5...: the numbers a shell's `exec 4>`
//! reuses and a daemon's `close_range(3, ~0U)` closes, after which
//! uswap's writes would go to the program's file, or its faults fail.
//!
//! So, where placement is on ([`keep_out_of_reach`], which the preload
//! library calls; a program linking the library directly need not), every
//! descriptor uswap makes is moved at once to the lowest free number at or
//! above a floor (`F_DUPFD_CLOEXEC`), and remembered here with the
//! identity of the file it names (device and inode).  The floor is well
//! above the program's soft descriptor limit where the hard limit leaves
//! room ([`placement`]): the program can then neither be given nor ask
//! for uswap's numbers, nor count them against its limit, nor find them
//! probing every number up to `sysconf(_SC_OPEN_MAX)` or a little past it
//! (CPython's subprocess tests do both).  Where the hard limit leaves no
//! room (a container's 1048576:1048576, `ulimit -n 29`), the soft limit
//! is lowered by [`RESERVE`] to make some; past 65,536 the floor stays at
//! 65,472, inside the program's range, since the kernel sizes a process's
//! table of descriptors by its highest number.
//!
//! The preload library's `close`, `close_range`, `closefrom`, `dup2` and
//! `dup3` ask [`is_uswaps`] and leave such a descriptor alone, and its
//! directory reads leave it out of `/proc/self/fd`; the identity makes an
//! entry that outlived its descriptor harmless (a number reused for
//! another file is not uswap's).  The table is a fixed array of atomics:
//! no lock, no allocation, readable from any interposed call.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};

/// The floor; 0: descriptors stay where the kernel put them.
static FLOOR: AtomicI32 = AtomicI32::new(0);

/// Descriptors remembered at once.  An instance has a handful, and one
/// more per forked child it holds slots for; one past the table is still
/// moved up, just not guarded.
const ENTRIES: usize = 256;

/// An entry: the descriptor (-1: free), and the device and inode of what
/// it named when placed.
struct Entry {
    fd: AtomicI32,
    dev: AtomicU64,
    ino: AtomicU64,
}

/// How many leading entries of `TABLE` have ever been used: the scans
/// (one per `close` of the program's) stop there instead of reading all
/// of it.  Only grows; raised before an entry's descriptor is stored.
static USED: AtomicUsize = AtomicUsize::new(0);

/// The entries that may be in use.
fn used() -> &'static [Entry] {
    &TABLE[..USED.load(Ordering::Acquire)]
}

static TABLE: [Entry; ENTRIES] = [const {
    Entry {
        fd: AtomicI32::new(-1),
        dev: AtomicU64::new(0),
        ino: AtomicU64::new(0),
    }
}; ENTRIES];

/// Move every descriptor uswap makes from now on to `floor` or above
/// (0: no placement).  Process-wide.
pub fn keep_above(floor: i32) {
    FLOOR.store(floor.max(0), Ordering::Relaxed);
}

/// Numbers kept for uswap above a program whose hard descriptor limit
/// leaves none: an instance holds a handful, and one pipe per forked
/// child whose slots it keeps.
pub const RESERVE: u64 = 64;

/// The highest number uswap places a descriptor under: the kernel sizes
/// a process's table of descriptors by its highest number (at a million,
/// 8 MiB of kernel memory per process).
const HIGHEST: u64 = 1 << 16;

/// The soft and hard descriptor limits.
fn limits() -> Option<(u64, u64)> {
    let l = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    Some((l.current?, l.maximum.unwrap_or(u64::MAX)))
}

/// Where uswap's descriptors go under the limits `soft` and `hard`: the
/// floor, and the soft limit to lower to first, if any.  Well above the
/// soft limit (eight times it, at least 8192), where a program probing
/// past its own limit still does not look (CPython's test lowers its
/// limit to 29, then checks every number up to its highest open one);
/// with no room under the hard limit for that, just under it, the soft
/// limit lowered to below the floor; past `HIGHEST`, at it, inside
/// the program's range.
pub fn placement(soft: u64, hard: u64) -> (u64, Option<u64>) {
    let top = hard.min(HIGHEST).min(soft.saturating_mul(8).max(8192));
    let reserve = if top >= 1024 { RESERVE } else { (top / 8).max(8) };
    let floor = top.saturating_sub(reserve).max(3);
    if floor >= soft || soft > HIGHEST {
        (floor, None)
    } else {
        (floor, Some(floor))
    }
}

/// Keep uswap's descriptors out of the program's reach from now on: above
/// its soft descriptor limit ([`placement`]).  Returns the floor.
pub fn keep_out_of_reach() -> i32 {
    let Some((soft, hard)) = limits() else {
        return 0;
    };
    let (floor, lower_to) = placement(soft, hard);
    if let Some(lowered) = lower_to {
        let l = rustix::process::Rlimit {
            current: Some(lowered),
            maximum: Some(hard),
        };
        if rustix::process::setrlimit(rustix::process::Resource::Nofile, l).is_err() {
            return 0;
        }
    }
    let floor = floor.min(i32::MAX as u64) as i32;
    keep_above(floor);
    floor
}

/// Run `f` with the soft descriptor limit above `fd` (up to the hard
/// limit): numbers at or past the soft limit can be neither made
/// (`F_DUPFD`) nor made to name another file (`dup3`), and uswap's are
/// there.  The limit is put back after, unless the program changed it
/// meanwhile.
pub(crate) fn with_room_for<T>(fd: RawFd, f: impl FnOnce() -> T) -> T {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let Some((soft, hard)) = limits() else {
        return f();
    };
    if (fd as u64) < soft || hard <= soft {
        return f();
    }
    let raised = Rlimit {
        current: Some(hard),
        maximum: Some(hard),
    };
    if setrlimit(Resource::Nofile, raised).is_err() {
        return f();
    }
    let r = f();
    if getrlimit(Resource::Nofile).current == Some(hard) {
        let _ = setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(soft),
                maximum: Some(hard),
            },
        );
    }
    r
}

/// Make `dst`, one of uswap's numbers, name what `src` names
/// (close-on-exec), and remember it: a forked child putting its own
/// userfaultfd or pidfd under the number its parent's had, so that
/// everything holding the number acts on the child.  The number may be
/// past the soft limit (the program lowered it, as PAM does for
/// `runuser` and `su`): the limit is raised for the call.
pub(crate) fn dup_onto(src: RawFd, dst: RawFd) -> std::io::Result<()> {
    // SAFETY: replaces `dst`, a descriptor the caller owns, with a copy
    // of `src`; nothing else is touched.
    let rc = with_room_for(dst, || unsafe { libc::dup3(src, dst, libc::O_CLOEXEC) });
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    remember(dst);
    Ok(())
}

/// The floor in force (0 when none).
pub fn floor() -> i32 {
    FLOOR.load(Ordering::Relaxed)
}

/// The identity of the file `fd` names, from the kernel (rustix's raw
/// system call: no interposed `fstat`).
fn identity(fd: RawFd) -> Option<(u64, u64)> {
    // SAFETY: `fd` is only borrowed for the call; an invalid one is an
    // error, not undefined behaviour, for the system call.
    let fd = unsafe { rustix::fd::BorrowedFd::borrow_raw(fd) };
    rustix::fs::fstat(fd).ok().map(|st| (st.st_dev, st.st_ino))
}

/// Move `fd` (owned by the caller, close-on-exec or not) to the floor or
/// above, close-on-exec, and remember it.  Without a floor, or where the
/// move fails (out of descriptors, a limit lowered under the floor), the
/// descriptor stays where it is, still remembered.
pub fn place_raw(fd: RawFd) -> RawFd {
    let floor = floor();
    if floor == 0 || fd < 0 {
        return fd;
    }
    let mut at = fd;
    if fd < floor {
        // SAFETY: duplicates a descriptor the caller owns; the copy is
        // the caller's now, the original is closed below.
        let moved = with_room_for(floor, || unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, floor) });
        if moved >= 0 {
            // SAFETY: the original, which nothing else holds.
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
            at = moved;
        }
    }
    remember(at);
    at
}

/// [`place_raw`] for an owned descriptor.
pub(crate) fn place(fd: OwnedFd) -> OwnedFd {
    // SAFETY: `place_raw` returns a descriptor the caller owns.
    unsafe { OwnedFd::from_raw_fd(place_raw(fd.into_raw_fd())) }
}

/// [`place_raw`] for a file.
pub(crate) fn place_file(f: File) -> File {
    File::from(place(OwnedFd::from(f)))
}

/// Remember `fd` (again): after uswap put another file under a number it
/// holds (`dup3` onto it, a forked child's fresh pidfd).
pub(crate) fn remember(fd: RawFd) {
    let Some((dev, ino)) = identity(fd) else {
        return;
    };
    for (i, e) in TABLE.iter().enumerate() {
        let cur = e.fd.load(Ordering::Acquire);
        if cur == fd
            || (cur == -1
                && e.fd
                    .compare_exchange(-1, -2, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok())
        {
            // -2: being written; never matches a descriptor.
            USED.fetch_max(i + 1, Ordering::AcqRel);
            e.dev.store(dev, Ordering::Relaxed);
            e.ino.store(ino, Ordering::Relaxed);
            e.fd.store(fd, Ordering::Release);
            return;
        }
    }
}

/// Forget `fd`: uswap is about to close it.
pub(crate) fn forget(fd: RawFd) {
    if fd < 0 {
        return;
    }
    for e in used() {
        if e.fd.load(Ordering::Acquire) == fd {
            e.fd.store(-1, Ordering::Release);
        }
    }
}

/// Whether `fd` is one of uswap's: remembered, and still naming the file
/// it named then.
pub fn is_uswaps(fd: RawFd) -> bool {
    if fd < 0 || floor() == 0 {
        return false;
    }
    used().iter().any(|e| {
        e.fd.load(Ordering::Acquire) == fd
            && identity(fd) == Some((e.dev.load(Ordering::Relaxed), e.ino.load(Ordering::Relaxed)))
    })
}

/// uswap's descriptors in `[first, last]`, in ascending order, into
/// `out`; returns how many.  For a `close_range` that must go around them.
pub fn uswaps_in(first: RawFd, last: RawFd, out: &mut [RawFd; ENTRIES]) -> usize {
    let mut n = 0;
    for e in used() {
        let fd = e.fd.load(Ordering::Acquire);
        if fd >= first && fd <= last && is_uswaps(fd) && !out[..n].contains(&fd) {
            out[n] = fd;
            n += 1;
        }
    }
    out[..n].sort_unstable();
    n
}

/// The most descriptors [`uswaps_in`] can return.
pub const MAX: usize = ENTRIES;

/// A descriptor of uswap's that is forgotten before it closes.
#[derive(Debug)]
pub(crate) struct Placed(OwnedFd);

impl Placed {
    /// Place `fd` ([`place`]) and own it.
    pub fn new(fd: OwnedFd) -> Placed {
        Placed(place(fd))
    }
}

impl std::os::fd::AsFd for Placed {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl AsRawFd for Placed {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl Drop for Placed {
    fn drop(&mut self) {
        forget(self.0.as_raw_fd());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Placed descriptors land at the floor or above, are recognised while
    /// they name what they named, and not once the number names another
    /// file; without a floor nothing moves.  One test: the floor is
    /// process-wide.
    #[test]
    fn placement_is_well_above_the_soft_limit_where_the_hard_limit_allows() {
        // The usual limits: far above 1024, a small table.
        assert_eq!(placement(1024, 1 << 20), (8192 - RESERVE, None));
        // A limit lowered to 29 under a hard limit of 20000.
        assert_eq!(placement(29, 20_000), (8192 - RESERVE, None));
        // No room: the soft limit lowered to make some.
        assert_eq!(placement(20_000, 20_000), (20_000 - RESERVE, Some(20_000 - RESERVE)));
        assert_eq!(placement(29, 29), (21, Some(21)));
        // A container's million: inside, at the highest floor.
        assert_eq!(placement(1 << 20, 1 << 20), (HIGHEST - RESERVE, None));
        // Room above a large soft limit, up to the highest floor.
        assert_eq!(placement(10_000, 1 << 20), (HIGHEST - RESERVE, None));
    }

    #[test]
    fn placed_descriptors_are_above_the_floor_and_recognised() {
        let open = || File::open("/proc/self/exe").unwrap();
        let f = place_file(open());
        assert!(!is_uswaps(f.as_raw_fd()), "no floor: nothing remembered");
        keep_above(600);
        let f = place_file(open());
        let fd = f.as_raw_fd();
        assert!(fd >= 600, "{fd}");
        assert!(is_uswaps(fd));
        let mut out = [0; MAX];
        let n = uswaps_in(3, 10_000, &mut out);
        assert_eq!(&out[..n], &[fd]);
        assert_eq!(uswaps_in(0, fd - 1, &mut out), 0);
        // The number reused for another file: not uswap's any more.
        let other = File::open("/proc/self/cmdline").unwrap();
        // SAFETY: replaces `fd` with a copy of `other` (both ours).
        assert!(unsafe { libc::dup2(other.as_raw_fd(), fd) } == fd);
        assert!(!is_uswaps(fd), "another file under the same number");
        drop(f);
        let p = Placed::new(OwnedFd::from(open()));
        let pfd = p.as_raw_fd();
        assert!(pfd >= 600 && is_uswaps(pfd));
        drop(p);
        assert!(!is_uswaps(pfd), "forgotten on drop");
        keep_above(0);
        assert!(!is_uswaps(pfd));
    }
}
