//! Memory the pager maps for itself: regions, the staging area that
//! evicted pages are moved into, and bounce pages that swap-ins are read
//! into.  All of the unsafe `mmap` handling of the pager is here.

use std::io;

use super::page::{self, UNIT_BYTES};
use crate::stats::{Registry, StatMutex};
use crate::PAGE_SIZE;

const UNIT: u64 = UNIT_BYTES as u64;
const MADV_POPULATE_WRITE: i32 = 23;

/// An anonymous private mapping, unmapped on drop by the process that
/// made it.
pub(crate) struct Mapping {
    addr: u64,
    len: usize,
    /// The process that mapped it.  A forked child inherits this value
    /// but not the mapping (`MADV_DONTFORK`): whatever sits at the address
    /// in the child is the child's, and it must not be unmapped.
    pid: libc::pid_t,
}

impl Mapping {
    /// `len` bytes (a multiple of the page size), aligned to `align` bytes
    /// (a power of two, at least a page), never inherited by a child
    /// process (`MADV_DONTFORK`: a forked child sharing or copying swapped
    /// memory could not be paged for, and `UFFDIO_MOVE` refuses pages a
    /// child shares).
    pub fn new(len: usize, align: usize) -> io::Result<Mapping> {
        debug_assert!(len % PAGE_SIZE == 0 && align.is_power_of_two() && align >= PAGE_SIZE);
        // Over-allocate by `align` and trim, for alignment.
        let total = len + align - PAGE_SIZE;
        // SAFETY: a fresh anonymous mapping at an address of the kernel's
        // choosing; nothing else refers to it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let start = p as usize;
        let aligned = (start + align - 1) & !(align - 1);
        // SAFETY: both trims lie inside the mapping just made and are page
        // aligned; unmapping them leaves exactly [aligned, aligned + len).
        unsafe {
            if aligned > start {
                libc::munmap(p, aligned - start);
            }
            let end = start + total;
            if end > aligned + len {
                libc::munmap((aligned + len) as *mut libc::c_void, end - (aligned + len));
            }
        }
        let m = Mapping {
            addr: aligned as u64,
            len,
            // SAFETY: getpid has no preconditions.
            pid: unsafe { libc::getpid() },
        };
        // SAFETY: advice on our own mapping.
        if unsafe { libc::madvise(aligned as *mut libc::c_void, len, libc::MADV_DONTFORK) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(m)
    }

    pub fn addr(&self) -> u64 {
        self.addr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Ask for transparent huge pages (2 MB units).
    pub fn advise_huge(&self) {
        // SAFETY: advice on our own mapping; failure only means no THP.
        unsafe { libc::madvise(self.addr as *mut libc::c_void, self.len, libc::MADV_HUGEPAGE) };
    }

    /// Drop the pages of `[addr, addr + len)` (inside this mapping): they
    /// read as missing again.
    pub fn discard(&self, addr: u64, len: usize) {
        debug_assert!(addr >= self.addr && addr + len as u64 <= self.addr + self.len as u64);
        // SAFETY: a range of our own mapping; its contents are not referred
        // to by anything once the caller discards them.
        unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_DONTNEED) };
    }

    /// Leave the range mapped when this value goes: it is not ours any
    /// more (the program unmapped it and something else sits there).
    pub fn forget(&mut self) {
        self.len = 0;
    }

    /// Whether this process made the mapping (false in a forked child).
    pub fn ours(&self) -> bool {
        // SAFETY: getpid has no preconditions.
        self.pid == unsafe { libc::getpid() }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.len == 0 || !self.ours() {
            return;
        }
        // SAFETY: unmaps exactly the range this Mapping owns.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

/// A fixed pool of page frames in one mapping, handed out by index.
/// The free list has room for every frame, so push and pop never allocate.
pub(crate) struct FramePool {
    map: Mapping,
    free: StatMutex<Vec<u32>>,
    /// A pidfd of this process, for `process_madvise` (-1: none).
    pidfd: i32,
}

impl FramePool {
    pub fn new(frames: u32, registry: &Registry, site: &'static str) -> io::Result<FramePool> {
        let map = Mapping::new(frames as usize * PAGE_SIZE, PAGE_SIZE)?;
        let free: Vec<u32> = (0..frames).rev().collect();
        // SAFETY: pidfd_open of our own pid; the descriptor is closed on drop.
        let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) } as i32;
        Ok(FramePool {
            map,
            free: StatMutex::new(free, registry.lock_site(site)),
            pidfd,
        })
    }

    pub fn mapping(&self) -> &Mapping {
        &self.map
    }

    /// A free frame, if any.
    pub fn get(&self) -> Option<u32> {
        self.free.lock().pop()
    }

    /// A free frame, waiting for one if all are in use: their holders hold
    /// a page claim and wait for nothing but IO, so one comes back.  The
    /// wait sleeps (a `SCHED_FIFO` waiter must let a holder on its CPU run).
    pub fn get_waiting(&self) -> u32 {
        loop {
            if let Some(f) = self.get() {
                return f;
            }
            page::pause();
        }
    }

    /// Return a frame.
    pub fn put(&self, f: u32) {
        self.free.lock().push(f);
    }

    /// Drop the contents of `frames` (at most 64) in one system call.
    pub fn discard_batch(&self, frames: &[u32]) {
        const MAX: usize = 64;
        debug_assert!(frames.len() <= MAX);
        let mut iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; MAX];
        let n = frames.len().min(MAX);
        for (v, &f) in iov.iter_mut().zip(&frames[..n]) {
            *v = libc::iovec {
                iov_base: self.addr(f) as *mut libc::c_void,
                iov_len: PAGE_SIZE,
            };
        }
        let done = if self.pidfd >= 0 {
            // SAFETY: the iovecs name frames of our own mapping whose
            // contents the caller no longer needs; the pidfd is ours.
            unsafe {
                libc::syscall(
                    libc::SYS_process_madvise,
                    self.pidfd,
                    iov.as_ptr(),
                    n,
                    libc::MADV_DONTNEED,
                    0,
                )
            }
        } else {
            -1
        };
        if done < (n * PAGE_SIZE) as i64 {
            // No process_madvise, or no DONTNEED through it on this
            // kernel: one madvise per frame.
            for &f in &frames[..n] {
                self.map.discard(self.addr(f), PAGE_SIZE);
            }
        }
    }

    /// The address of frame `f`.
    pub fn addr(&self, f: u32) -> u64 {
        self.map.addr() + f as u64 * PAGE_SIZE as u64
    }

    /// Frame `f` as bytes.
    ///
    /// # Safety
    /// The caller must hold frame `f` (from `get`) and the frame must be
    /// populated or about to be filled by IO.
    // Exclusive access comes from holding the frame index (the pool hands
    // each frame to one holder at a time), not from `&mut self`: this is
    // an allocator, and its frames are used from many threads at once.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn bytes(&self, f: u32) -> &mut [u8] {
        // SAFETY: the caller owns the frame, so nobody else reads or writes
        // these bytes while the slice lives; they lie inside the mapping.
        unsafe { std::slice::from_raw_parts_mut(self.addr(f) as *mut u8, PAGE_SIZE) }
    }
}

impl Drop for FramePool {
    fn drop(&mut self) {
        if self.pidfd >= 0 {
            // SAFETY: our own descriptor, closed once.
            unsafe { libc::close(self.pidfd) };
        }
    }
}

/// A few 2 MB staging units in one 2 MB-aligned mapping.
pub(crate) struct UnitPool {
    map: Mapping,
    free: StatMutex<Vec<u32>>,
}

impl UnitPool {
    pub fn new(units: u32, registry: &Registry, site: &'static str) -> std::io::Result<UnitPool> {
        let map = Mapping::new(units as usize * UNIT_BYTES, UNIT_BYTES)?;
        map.advise_huge();
        Ok(UnitPool {
            map,
            free: StatMutex::new((0..units).rev().collect(), registry.lock_site(site)),
        })
    }

    pub fn mapping(&self) -> &Mapping {
        &self.map
    }

    /// A free unit, waiting for one if all are in use (their holders hold
    /// a unit's claim and wait for nothing but IO, so one comes back).
    pub fn take(&self) -> u32 {
        loop {
            if let Some(u) = self.free.lock().pop() {
                return u;
            }
            page::pause();
        }
    }

    pub fn get(&self) -> Option<u32> {
        self.free.lock().pop()
    }

    pub fn put(&self, u: u32) {
        self.free.lock().push(u);
    }

    pub fn addr(&self, u: u32) -> u64 {
        self.map.addr() + u as u64 * UNIT
    }

    /// Unit `u` as bytes.
    ///
    /// # Safety
    /// The caller holds unit `u` (from `get`) and it is populated.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn bytes(&self, u: u32) -> &mut [u8] {
        // SAFETY: held by the caller alone, inside the mapping, populated.
        unsafe { std::slice::from_raw_parts_mut(self.addr(u) as *mut u8, UNIT_BYTES) }
    }

    /// Fault unit `u` in, zeroed, as one THP where the kernel can.
    pub fn populate(&self, u: u32) -> bool {
        // SAFETY: advice on our own, unregistered mapping.
        unsafe { libc::madvise(self.addr(u) as *mut libc::c_void, UNIT_BYTES, MADV_POPULATE_WRITE) == 0 }
    }

    /// Drop what unit `u` holds: it reads as missing (zeros) again.
    pub fn discard(&self, u: u32) {
        self.map.discard(self.addr(u), UNIT_BYTES);
    }
}
