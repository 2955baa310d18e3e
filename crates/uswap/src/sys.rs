//! The OS layer: the memory and device calls uswap makes, in one place.
//!
//! Anonymous mappings ([`Mapping`]), advice on them, the batched discard
//! of `process_madvise`, the page-table query of `mincore`, and the two
//! ioctls on backing files (`BLKGETSIZE64`, `FS_IOC_FIEMAP`).  Through
//! rustix where it has the call (raw system calls, no `errno`: safe in
//! the SIGBUS handler too), libc where it does not.  The RAM device, the
//! pager's frame pools and regions, and the benches all map memory here;
//! userfaultfd has its own module (`uffd.rs`), signals stay with the
//! handler (`pager/entry/sigbus.rs`).

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::ioctl::{self, opcode};
use rustix::mm::{self, Advice, MapFlags, ProtFlags};

use crate::PAGE_SIZE;

/// `FUTEX_WAIT` on the 32-bit word at `word` while it reads `val`, for at
/// most `timeout`: returns when woken, at once if the word changed, or
/// early on a signal (the caller looks again either way).  Every argument
/// of the call is given, the unused ones zero: whatever a register held
/// is not taken for a pointer by a seccomp filter (the system-call guard
/// of `uswap run` traps a futex call whose second address points into
/// the program's heap, and a trap in the SIGBUS handler, where SIGSYS is
/// blocked, would end the process).  Async-signal-safe.
///
/// # Safety
/// `word` is a live, aligned 32-bit word (the kernel only reads it).
pub unsafe fn futex_wait(word: *const u32, val: u32, timeout: Option<&libc::timespec>) {
    let ts = timeout.map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: per the contract; the kernel reads the word and the timeout.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word,
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            val,
            ts,
            std::ptr::null::<u32>(),
            0u32,
        )
    };
}

/// `FUTEX_WAKE` of up to `n` waiters on the word at address `word`
/// (every argument given, as for [`futex_wait`]).  The kernel touches no
/// memory: any address will do.
pub fn futex_wake(word: usize, n: i32) {
    // SAFETY: FUTEX_WAKE only names the address.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word,
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            n,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        )
    };
}

/// uswap's own memory: every [`Mapping`] (regions, frames, RAM devices,
/// stores, thread stacks) and every large metadata table, as
/// `(start, length)`, so that a library sharing the process with a
/// program can keep the program's whole-process calls off it
/// (`mlockall(MCL_CURRENT)` would fault every page of it in and lock
/// it).  A fixed table of atomics: a range past its room is not listed.
static OWN: [(AtomicU64, AtomicU64); 1024] = [const { (AtomicU64::new(0), AtomicU64::new(0)) }; 1024];

/// List `[addr, addr + len)` as uswap's own.
pub(crate) fn remember_memory(addr: u64, len: u64) {
    if len == 0 {
        return;
    }
    for (a, l) in &OWN {
        if a.compare_exchange(0, addr, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            l.store(len, Ordering::Release);
            return;
        }
    }
}

/// Unlist the range that starts at `addr`.
pub(crate) fn forget_memory(addr: u64) {
    for (a, l) in &OWN {
        if a.load(Ordering::Acquire) == addr {
            l.store(0, Ordering::Release);
            a.store(0, Ordering::Release);
        }
    }
}

/// uswap's own memory ranges, sorted by start.
pub fn own_memory() -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = OWN
        .iter()
        .map(|(a, l)| (a.load(Ordering::Acquire), l.load(Ordering::Acquire)))
        .filter(|&(a, l)| a != 0 && l != 0)
        .collect();
    v.sort_unstable();
    v
}

/// A shared mapping of a whole file (`MAP_SHARED`), read and written by
/// every process that maps it; unmapped on drop.  Its memory is the
/// file's, zero where never written.
pub struct SharedMapping {
    addr: u64,
    len: usize,
}

impl SharedMapping {
    /// The first `len` bytes of `file` (which holds them), shared.
    pub fn new(file: &File, len: usize) -> io::Result<SharedMapping> {
        // SAFETY: a fresh mapping at an address of the kernel's choosing;
        // nothing else in this process refers to it.
        let p = unsafe {
            mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                file.as_fd(),
                0,
            )
        }?;
        remember_memory(p as u64, len as u64);
        Ok(SharedMapping { addr: p as u64, len })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.addr as *mut u8
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for SharedMapping {
    fn drop(&mut self) {
        forget_memory(self.addr);
        // SAFETY: our own mapping; what pointed into it went with the
        // borrows of the value being dropped.
        let _ = unsafe { mm::munmap(self.addr as *mut _, self.len) };
    }
}

/// A fresh private anonymous mapping of `len` bytes with no access yet
/// (`at` a hint, or the place with `MAP_FIXED_NOREPLACE`): made so, a
/// program's `mlockall(MCL_FUTURE)` locks it without filling it (the
/// kernel fills only what may be accessed), where a readable and writable
/// one would be faulted in whole at `mmap`, a swap device's worth.
fn map_inaccessible(at: *mut libc::c_void, len: usize, flags: MapFlags) -> io::Result<*mut libc::c_void> {
    // SAFETY: a fresh anonymous mapping, where the kernel chooses or where
    // nothing is mapped (`MAP_FIXED_NOREPLACE`); nothing refers to it.
    Ok(unsafe { mm::mmap_anonymous(at, len, ProtFlags::empty(), MapFlags::PRIVATE | MapFlags::NORESERVE | flags) }?)
}

/// Make `[p, p + len)`, from [`map_inaccessible`], uswap's to page: not
/// locked (under `mlockall(MCL_FUTURE)` it came locked, and a locked range
/// refuses `MADV_DONTNEED` and takes no page by `UFFDIO_MOVE` from an
/// unlocked one: a staging frame could not be emptied or filled), then
/// readable and writable, still empty.
fn open_unlocked(p: *mut libc::c_void, len: usize) -> io::Result<()> {
    // SAFETY: the caller's fresh mapping: unlocking it and opening it
    // change no contents (it has none) and nothing refers to it yet.
    unsafe {
        mm::munlock(p, len)?;
        mm::mprotect(p, len, mm::MprotectFlags::READ | mm::MprotectFlags::WRITE)?;
    }
    Ok(())
}

/// An anonymous private mapping, unmapped on drop.  A forked child
/// inherits a copy, as it does any private memory (the pager adopts it
/// there, `pager/fork.rs`): dropping the value in the child unmaps the
/// child's copy.  Mapped with `MAP_NORESERVE`: its pages are committed as
/// they are touched, and a swap device or a region larger than memory is
/// the point.
pub struct Mapping {
    addr: u64,
    len: usize,
}

impl Mapping {
    /// `len` bytes (rounded up to pages), aligned to `align` bytes (a
    /// power of two, at least a page).
    pub fn new(len: usize, align: usize) -> io::Result<Mapping> {
        assert!(
            align.is_power_of_two() && align >= PAGE_SIZE,
            "alignment {align} is not a power of two of at least a page"
        );
        let len = len.div_ceil(PAGE_SIZE) * PAGE_SIZE;
        if len == 0 {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        // Over-allocate by `align` and trim, for alignment.
        let total = len + align - PAGE_SIZE;
        let p = map_inaccessible(std::ptr::null_mut(), total, MapFlags::empty())?;
        let start = p as usize;
        let aligned = (start + align - 1) & !(align - 1);
        let end = start + total;
        // SAFETY: both trims lie inside the mapping just made and are page
        // aligned; unmapping them leaves exactly [aligned, aligned + len).
        // A failed trim only leaves unused address space mapped.
        unsafe {
            if aligned > start {
                let _ = mm::munmap(p, aligned - start);
            }
            if end > aligned + len {
                let _ = mm::munmap((aligned + len) as *mut _, end - (aligned + len));
            }
        }
        if let Err(e) = open_unlocked(aligned as *mut _, len) {
            // SAFETY: the mapping just made, which nothing refers to.
            let _ = unsafe { mm::munmap(aligned as *mut _, len) };
            return Err(e);
        }
        remember_memory(aligned as u64, len as u64);
        Ok(Mapping {
            addr: aligned as u64,
            len,
        })
    }

    /// `len` bytes (rounded up to pages) at exactly `addr` (page aligned),
    /// where nothing is mapped yet (`MAP_FIXED_NOREPLACE`): `EEXIST` says
    /// something is.
    pub fn new_at(addr: u64, len: usize) -> io::Result<Mapping> {
        let len = len.div_ceil(PAGE_SIZE) * PAGE_SIZE;
        if len == 0 || !addr.is_multiple_of(PAGE_SIZE as u64) {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        // The kernel refuses an address that is taken.
        let p = map_inaccessible(addr as *mut _, len, MapFlags::FIXED_NOREPLACE)?;
        if p as u64 != addr {
            // A kernel before 4.17 takes the flag for a hint.
            // SAFETY: the mapping just made, nobody else's.
            let _ = unsafe { mm::munmap(p, len) };
            return Err(io::Error::from_raw_os_error(libc::EEXIST));
        }
        if let Err(e) = open_unlocked(p, len) {
            // SAFETY: as above.
            let _ = unsafe { mm::munmap(p, len) };
            return Err(e);
        }
        remember_memory(addr, len as u64);
        Ok(Mapping { addr, len })
    }

    pub fn addr(&self) -> u64 {
        self.addr
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.addr as *mut u8
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Ask for transparent huge pages (`MADV_HUGEPAGE`).  An error means
    /// none: THP disabled, or no kernel support.
    pub fn advise_huge(&self) -> io::Result<()> {
        // SAFETY: advice on our own whole mapping; it changes no contents.
        Ok(unsafe { mm::madvise(self.addr as *mut _, self.len, Advice::LinuxHugepage) }?)
    }

    /// Leave the mapping out of core dumps (`MADV_DONTDUMP`): it holds a
    /// secret.  Best effort: an old kernel without the advice dumps it.
    pub fn exclude_from_dumps(&self) {
        let _ = self.advise(self.addr, self.len, Advice::LinuxDontDump);
    }

    /// Lock the mapping in memory (`mlock`), so that it never reaches
    /// kernel swap; false where `RLIMIT_MEMLOCK` does not allow it.
    pub fn lock(&self) -> bool {
        // SAFETY: locks our own whole mapping; it changes no contents.
        unsafe { mm::mlock(self.addr as *mut _, self.len) }.is_ok()
    }

    /// Drop the pages of `[addr, addr + len)` (inside this mapping): they
    /// read as zeros (missing) again.
    pub fn discard(&self, addr: u64, len: usize) -> bool {
        self.advise(addr, len, Advice::LinuxDontNeed)
    }

    /// Fault `[addr, addr + len)` (inside this mapping) in, writable and
    /// zeroed (`MADV_POPULATE_WRITE`): one THP where the kernel gives one.
    pub fn populate(&self, addr: u64, len: usize) -> bool {
        self.advise(addr, len, Advice::LinuxPopulateWrite)
    }

    fn advise(&self, addr: u64, len: usize, advice: Advice) -> bool {
        assert!(
            addr >= self.addr && addr + len as u64 <= self.addr + self.len as u64,
            "advice outside the mapping"
        );
        // SAFETY: a range of our own mapping; discarding its contents is
        // what the caller asks, and no reference into it outlives that.
        unsafe { mm::madvise(addr as *mut _, len, advice) }.is_ok()
    }

    /// Leave the range mapped when this value goes: it is not ours any
    /// more (the program unmapped it and something else sits there).
    pub fn forget(&mut self) {
        forget_memory(self.addr);
        self.len = 0;
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.len == 0 {
            return;
        }
        forget_memory(self.addr);
        // SAFETY: unmaps exactly the range this Mapping owns; `&mut self`
        // means no reference into it is live.
        let _ = unsafe { mm::munmap(self.addr as *mut _, self.len) };
    }
}

// SAFETY: a Mapping is an address range owned by this value; what is read
// or written in it is governed by its users (frame pools hand each frame
// to one holder), not by the thread that made it.
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` only gives out the address and advice.
unsafe impl Sync for Mapping {}

/// Map `count` stacks of `size` bytes, each above a guard page of
/// `guard` bytes (`PROT_NONE`: an overflow faults at once), for the
/// process's lifetime; returns the base of the first guard.  None when
/// the mapping fails.  A guard that cannot be set only loses the clean
/// crash an overflow would give.
pub fn map_stacks(count: u64, size: u64, guard: u64) -> Option<u64> {
    let len = (count * (size + guard)) as usize;
    // SAFETY: a fresh private anonymous mapping at an address of the
    // kernel's choosing; nothing else refers to it.
    let p = unsafe {
        mm::mmap_anonymous(
            std::ptr::null_mut(),
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::PRIVATE | MapFlags::NORESERVE | MapFlags::STACK,
        )
    }
    .ok()?;
    for i in 0..count {
        // SAFETY: each guard lies inside the mapping just made, which
        // nothing uses yet.
        let _ = unsafe {
            mm::mprotect(
                p.cast::<u8>().add((i * (size + guard)) as usize).cast(),
                guard as usize,
                mm::MprotectFlags::empty(),
            )
        };
    }
    remember_memory(p as u64, len as u64);
    Some(p as u64)
}

/// Whether the page at `page` is mapped, from the page tables.
pub fn page_mapped(page: u64) -> bool {
    let mut v = 0u8;
    // SAFETY: mincore writes one byte for one page and reads no memory.
    // (rustix has no mincore; libc's is a plain system call.)
    unsafe { libc::mincore(page as *mut libc::c_void, PAGE_SIZE, &mut v) == 0 && v & 1 != 0 }
}

/// The spans of `[addr, addr + len)` (page-aligned) of this process's
/// memory that hold data: pages present other than the shared zero page,
/// or swapped out by the kernel, as `(start, end)` addresses in order.
/// What is outside them was never written: a zeroed table's entries there
/// are all zero, and a scan may skip them without reading (a read maps
/// the zero page: a fault per 4 KiB, and the page then counts as present
/// to `mincore` and pagemap's plain entries, which is why this asks
/// `PAGEMAP_SCAN`, Linux 6.7, to leave zero-page entries out).  None
/// where the call is refused: then everything may hold data.
pub fn written_spans(addr: u64, len: u64) -> Option<Vec<(u64, u64)>> {
    // linux/fs.h: _IOWR('f', 16, struct pm_scan_arg), and categories.
    const PAGEMAP_SCAN: libc::c_ulong = 0xC060_6610;
    const PAGE_IS_PRESENT: u64 = 1 << 3;
    const PAGE_IS_SWAPPED: u64 = 1 << 4;
    const PAGE_IS_PFNZERO: u64 = 1 << 5;
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct PageRegion {
        start: u64,
        end: u64,
        categories: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct PmScanArg {
        size: u64,
        flags: u64,
        start: u64,
        end: u64,
        walk_end: u64,
        vec: u64,
        vec_len: u64,
        max_pages: u64,
        category_inverted: u64,
        category_mask: u64,
        category_anyof_mask: u64,
        return_mask: u64,
    }
    const _: () = assert!(std::mem::size_of::<PmScanArg>() == 96);
    // Out of the program's way while it is open (descriptors.rs): a
    // thread of the program may `dup2` onto a low number meanwhile.
    let f = crate::descriptors::Placed::new(OwnedFd::from(File::open("/proc/self/pagemap").ok()?));
    let mut regions = [PageRegion::default(); 64];
    let mut out = Vec::new();
    let mut at = addr;
    let scanned = loop {
        let mut arg = PmScanArg {
            size: std::mem::size_of::<PmScanArg>() as u64,
            start: at,
            end: addr + len,
            vec: regions.as_mut_ptr() as u64,
            vec_len: regions.len() as u64,
            // Not the zero page, and present or swapped.
            category_inverted: PAGE_IS_PFNZERO,
            category_mask: PAGE_IS_PFNZERO,
            category_anyof_mask: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
            return_mask: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
            ..Default::default()
        };
        // SAFETY: PAGEMAP_SCAN reads `arg` and writes at most `vec_len`
        // regions into `regions`, both ours; it reads no other memory.
        let n = unsafe { libc::ioctl(f.as_raw_fd(), PAGEMAP_SCAN, &mut arg) };
        if n < 0 {
            break false;
        }
        out.extend(regions[..n as usize].iter().map(|r| (r.start, r.end)));
        if arg.walk_end >= addr + len || arg.walk_end <= at {
            break arg.walk_end >= addr + len;
        }
        at = arg.walk_end;
    };
    scanned.then_some(out)
}

/// Drop the pages of `[addr, addr + len)` (`MADV_DONTNEED`), whoever's
/// memory it is.  `EINVAL` says the range is locked (`mlock`) or not
/// ordinary memory; `ENOMEM` that it is not mapped.
///
/// # Safety
/// The range's contents must be the caller's to drop: nothing may read
/// them again expecting what was there (they read as missing after).
pub unsafe fn discard_pages(addr: u64, len: usize) -> io::Result<()> {
    // SAFETY: the caller owns the contents; madvise reads no memory.
    unsafe { mm::madvise(addr as *mut _, len, Advice::LinuxDontNeed) }.map_err(io::Error::from)
}

/// Whether the page at `addr` of this process is in the kernel's own
/// swap (its page-table entry a swap entry: `/proc/self/pagemap` bit 62),
/// rather than not there at all.  Raw system calls, nothing allocated: a
/// fault's copy asks (`Inner::copy`, handler-thread mode).  False when the
/// map cannot be read.
pub fn in_kernel_swap(addr: u64) -> bool {
    const SWAPPED: u64 = 1 << 62;
    // SAFETY: opens a file of /proc by a constant path, reads one entry
    // into a local and closes it; no memory of the caller's is touched.
    unsafe {
        let fd = libc::syscall(
            libc::SYS_openat,
            libc::AT_FDCWD,
            c"/proc/self/pagemap".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        ) as i32;
        if fd < 0 {
            return false;
        }
        let mut entry = 0u64;
        let n = libc::syscall(
            libc::SYS_pread64,
            fd,
            &mut entry as *mut u64,
            8usize,
            (addr / PAGE_SIZE as u64) * 8,
        );
        libc::syscall(libc::SYS_close, fd);
        n == 8 && entry & SWAPPED != 0
    }
}

/// Most ranges one [`Discarder::discard`] takes: the kernel's `UIO_FASTIOV`
/// is 8, anything to `IOV_MAX` works; 64 keeps the vector on the stack.
pub const DISCARD_BATCH: usize = 64;

/// The process's pidfd of itself, for `process_madvise` (-1: none yet,
/// or none to be had: no pidfds, or refused), shared by every
/// [`Discarder`] of the process and kept for its life: each used to open
/// its own, three descriptors an instance, in the program's way.
static SELF_PIDFD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

/// The process [`SELF_PIDFD`] names.  A forked child inherits the
/// descriptor, which still names its parent: a discard through it would
/// drop the parent's pages, so none is made unless this is still that
/// process (the child's adoption points the number at the child,
/// [`Discarder::reopen_here`]).
static SELF_PID: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// [`SELF_PIDFD`], opened now if it is not yet.
fn self_pidfd() -> Option<RawFd> {
    use std::sync::atomic::Ordering;
    let fd = SELF_PIDFD.load(Ordering::Acquire);
    if fd >= 0 {
        return Some(fd);
    }
    let pid = rustix::process::getpid();
    let fresh = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()?;
    let placed = crate::descriptors::place(fresh).into_raw_fd();
    match SELF_PIDFD.compare_exchange(-1, placed, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {
            SELF_PID.store(pid.as_raw_nonzero().get(), Ordering::Release);
            Some(placed)
        }
        Err(theirs) => {
            // Another thread opened it first: this one goes.
            crate::descriptors::forget(placed);
            // SAFETY: the descriptor just made, which nothing else holds.
            drop(unsafe { OwnedFd::from_raw_fd(placed) });
            Some(theirs)
        }
    }
}

/// Discards ranges of this process's memory in one system call
/// (`process_madvise(MADV_DONTNEED)` on the process's pidfd of itself):
/// one TLB flush for a batch instead of one per range.
pub struct Discarder {
    /// Whether the kernel gave a pidfd (and so may take `process_madvise`).
    on: bool,
}

impl Discarder {
    pub fn new() -> Discarder {
        Discarder {
            on: self_pidfd().is_some(),
        }
    }

    /// Drop the pages of `ranges` (at most [`DISCARD_BATCH`], each inside
    /// a mapping of ours whose contents nobody needs any more).  Returns
    /// false when the kernel did not do it all: the caller discards them
    /// one by one.
    pub fn discard(&self, ranges: impl IntoIterator<Item = (u64, usize)>) -> bool {
        use std::sync::atomic::Ordering;
        let pidfd = SELF_PIDFD.load(Ordering::Acquire);
        if !self.on
            || pidfd < 0
            || SELF_PID.load(Ordering::Acquire) != rustix::process::getpid().as_raw_nonzero().get()
        {
            return false;
        }
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; DISCARD_BATCH];
        let mut n = 0;
        let mut bytes = 0;
        for (v, (addr, len)) in iov.iter_mut().zip(ranges) {
            *v = libc::iovec {
                iov_base: addr as *mut libc::c_void,
                iov_len: len,
            };
            n += 1;
            bytes += len;
        }
        // SAFETY: the iovecs name ranges of our own mappings whose
        // contents the caller no longer needs; the pidfd names this
        // process (checked above).  (Neither rustix nor libc wraps
        // process_madvise.)
        let done = unsafe {
            libc::syscall(
                libc::SYS_process_madvise,
                pidfd,
                iov.as_ptr(),
                n,
                libc::MADV_DONTNEED,
                0,
            )
        };
        done == bytes as i64
    }

    /// In a forked child: the inherited pidfd names the parent, and a
    /// discard through it would drop the parent's pages.  Point the same
    /// descriptor number at this process (once, for every discarder).
    pub fn reopen_here(&self) {
        use std::sync::atomic::Ordering;
        let fd = SELF_PIDFD.load(Ordering::Acquire);
        let pid = rustix::process::getpid();
        if fd < 0 || SELF_PID.load(Ordering::Acquire) == pid.as_raw_nonzero().get() {
            return;
        }
        // Without a pidfd of our own, discards stay refused here (the
        // pid check), and callers discard range by range.
        let mine = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty());
        if mine.is_ok_and(|m| crate::descriptors::dup_onto(m.as_raw_fd(), fd).is_ok()) {
            SELF_PID.store(pid.as_raw_nonzero().get(), Ordering::Release);
        }
    }
}

impl Default for Discarder {
    fn default() -> Self {
        Self::new()
    }
}

/// The size in bytes of block device `file` (`BLKGETSIZE64`).
pub fn block_device_size(file: &File) -> io::Result<u64> {
    // `_IOR(0x12, 114, size_t)`: the size in the number is that of
    // `size_t`, though the kernel writes a u64 (include/uapi/linux/fs.h).
    const BLKGETSIZE64: ioctl::Opcode = opcode::read::<usize>(0x12, 114);
    // SAFETY: BLKGETSIZE64 writes one u64 into the getter's output.
    let size = unsafe { ioctl::ioctl(file.as_fd(), ioctl::Getter::<BLKGETSIZE64, u64>::new()) }?;
    Ok(size)
}

/// `struct fiemap_extent`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FiemapExtent {
    pub fe_logical: u64,
    pub fe_physical: u64,
    pub fe_length: u64,
    pub fe_reserved64: [u64; 2],
    pub fe_flags: u32,
    pub fe_reserved: [u32; 3],
}

/// The last extent of the file.
pub const FIEMAP_EXTENT_LAST: u32 = 0x0001;
/// Allocated, not yet written (fallocate).
pub const FIEMAP_EXTENT_UNWRITTEN: u32 = 0x0800;

/// The header of `struct fiemap`, whose size the ioctl number encodes.
#[repr(C)]
#[derive(Default)]
struct FiemapHeader {
    fm_start: u64,
    fm_length: u64,
    /// `FIEMAP_FLAG_*` in, flags the kernel did not know out.
    fm_flags: u32,
    fm_mapped_extents: u32,
    fm_extent_count: u32,
    fm_reserved: u32,
}

/// `struct fiemap` with room for `N` extents, as one buffer.
#[repr(C)]
struct FiemapBuf<const N: usize> {
    header: FiemapHeader,
    extents: [FiemapExtent; N],
}

const _: () = assert!(std::mem::size_of::<FiemapHeader>() == 32);
const _: () = assert!(std::mem::size_of::<FiemapExtent>() == 56);

/// `FS_IOC_FIEMAP`: the extents of `file` from logical byte `start` on,
/// `length` bytes at most, into `out`; returns how many were filled in.
/// (Sync the file first: delayed allocation leaves extents unassigned.)
pub fn fiemap<const N: usize>(
    file: &File,
    start: u64,
    length: u64,
    out: &mut [FiemapExtent; N],
) -> io::Result<usize> {
    // `_IOWR('f', 11, struct fiemap)`: the size encoded is the header's.
    const FS_IOC_FIEMAP: ioctl::Opcode = opcode::read_write::<FiemapHeader>(b'f', 11);
    let mut buf = FiemapBuf::<N> {
        header: FiemapHeader {
            fm_start: start,
            fm_length: length,
            fm_extent_count: N as u32,
            ..FiemapHeader::default()
        },
        extents: [FiemapExtent::default(); N],
    };
    // SAFETY: `buf` is a `struct fiemap` followed by room for exactly
    // `fm_extent_count` extents, #[repr(C)] with the kernel's layout; the
    // kernel writes only within it.
    unsafe {
        ioctl::ioctl(
            file.as_fd(),
            ioctl::Updater::<FS_IOC_FIEMAP, FiemapBuf<N>>::new(&mut buf),
        )
    }?;
    let n = (buf.header.fm_mapped_extents as usize).min(N);
    out[..n].copy_from_slice(&buf.extents[..n]);
    Ok(n)
}

/// `CLOCK_MONOTONIC` in nanoseconds (a vDSO call; allocation-free).
pub(crate) fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// CLOCK_REALTIME, in ns since the epoch (the vDSO: async-signal-safe).
pub(crate) fn realtime_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A process's start time and state, from `/proc/PID/stat`, read into a
/// buffer on the stack (a forked child's handler calls it): its start
/// time tells it from another process under a reused pid.
pub(crate) fn start_time(pid: i32) -> Option<(u64, u8)> {
    let mut path = [0u8; 32];
    let mut w = std::io::Cursor::new(&mut path[..]);
    std::io::Write::write_fmt(&mut w, format_args!("/proc/{pid}/stat\0")).ok()?;
    let mut buf = [0u8; 1024];
    // SAFETY: a NUL-terminated path on the stack; a buffer we own.
    let n = unsafe {
        let fd = libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return None;
        }
        let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(fd);
        n
    };
    let text = buf.get(..usize::try_from(n).ok()?)?;
    // The command name may hold anything, spaces and parentheses too: the
    // fields that follow it start after its last ')'.
    let close = text.iter().rposition(|&b| b == b')')?;
    let mut fields = text[close + 1..].split(|&b| b == b' ').filter(|f| !f.is_empty());
    let state = *fields.next()?.first()?;
    // Field 3 was the state; the start time is field 22.
    let start = fields.nth(18)?;
    let start = std::str::from_utf8(start).ok()?.trim().parse().ok()?;
    Some((start, state))
}
