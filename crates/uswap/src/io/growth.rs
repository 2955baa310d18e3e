//! A swap file that grows as it is written.
//!
//! `uswap run`'s default swap is a file with no fixed size: a program
//! that needs twenty times its budget runs with the defaults, as it would
//! under kernel swap in a memory cgroup, where no multiple of the budget
//! caps what goes out.  The file is made as long as its most (what its
//! file system could spare at start, less a reserve) but sparse, and its
//! blocks are allocated a chunk at a time (`fallocate`), before the first
//! write into the chunk: no write ever needs the file system to allocate,
//! as with a file preallocated whole, and the disk holds what swap holds.
//! The swap space takes clusters freed before fresh ones for such a device
//! (`SlotDeviceConfig::grows`), so that the allocated part stays near
//! what is in use.
//!
//! A chunk is allocated only while the file system keeps its reserve
//! free: past that, or when the disk is full, the write fails with
//! `ENOSPC`, writeback pauses and says so once, and the pages wait in
//! memory, over the budget, until the overrun's bound ends the process as
//! a memory cgroup would (`pager/instance/overrun.rs`).

use std::fs::File;
use std::io;
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// The unit of allocation: a cluster of slots (512 pages).
pub(crate) const CHUNK: u64 = 2 << 20;

/// A file's allocated chunks, and what the file system must keep free.
pub(crate) struct Growth {
    /// One bit a chunk: allocated.  Set once, under `lock`, after the
    /// `fallocate` succeeded; read without it.
    chunks: Box<[AtomicU64]>,
    /// Held while a chunk is allocated (one `fallocate` at a time: two
    /// writers of one chunk allocate it once).
    lock: Mutex<()>,
    /// Bytes of the file system to leave free.
    reserve: u64,
    /// The last allocation failed (no room): the slots past what is
    /// allocated cannot be written, and the swap space is as good as
    /// full (`IoDevice::cannot_grow`).  Cleared by the next that works.
    stopped: AtomicBool,
}

impl Growth {
    /// A file of `len` bytes with nothing allocated, leaving `reserve`
    /// bytes of its file system free.
    pub fn new(len: u64, reserve: u64) -> Result<Growth, crate::table::TableError> {
        let chunks = len.div_ceil(CHUNK).div_ceil(64) as usize;
        Ok(Growth {
            chunks: crate::table::zeroed(chunks, "a growing swap file's chunk map")?,
            lock: Mutex::new(()),
            reserve,
            stopped: AtomicBool::new(false),
        })
    }

    fn has(&self, chunk: u64) -> bool {
        self.chunks[(chunk / 64) as usize].load(Ordering::Acquire) & (1 << (chunk % 64)) != 0
    }

    /// Make sure `[pos, pos + len)` of `file` is allocated before a write
    /// there: each chunk not yet allocated is, if the file system keeps
    /// its reserve after it.  An error says why not (`ENOSPC`).
    pub fn ensure(&self, file: &File, pos: u64, len: u64) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        let (first, last) = (pos / CHUNK, (pos + len - 1) / CHUNK);
        for chunk in first..=last {
            if self.has(chunk) {
                continue;
            }
            let _one = self.lock.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if self.has(chunk) {
                continue;
            }
            let free = free_bytes(file)?;
            if free < self.reserve + CHUNK {
                self.stopped.store(true, Ordering::Relaxed);
                return Err(io::Error::new(
                    io::ErrorKind::StorageFull,
                    format!(
                        "the swap file grows no further: its file system has {} MiB free and keeps {} MiB in reserve",
                        free >> 20,
                        self.reserve >> 20
                    ),
                ));
            }
            loop {
                // SAFETY: fallocate on a descriptor we hold open, within
                // the file's length (mode 0: blocks allocated, zeros).
                let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, (chunk * CHUNK) as i64, CHUNK as i64) };
                if rc == 0 {
                    break;
                }
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    self.stopped.store(true, Ordering::Relaxed);
                    return Err(e);
                }
            }
            self.stopped.store(false, Ordering::Relaxed);
            self.chunks[(chunk / 64) as usize].fetch_or(1 << (chunk % 64), Ordering::Release);
        }
        Ok(())
    }

    /// Whether the last allocation found no room.
    pub fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }

    /// Bytes of the file allocated so far (statistics and tests).
    pub fn allocated(&self) -> u64 {
        self.chunks
            .iter()
            .map(|w| u64::from(w.load(Ordering::Relaxed).count_ones()))
            .sum::<u64>()
            * CHUNK
    }
}

/// Bytes an unprivileged writer may still take on `file`'s file system.
fn free_bytes(file: &File) -> io::Result<u64> {
    // SAFETY: zeroed is a valid statvfs; fstatvfs fills it.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a descriptor we hold open, a local out-parameter.
    if unsafe { libc::fstatvfs(file.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// The reserve a growing file keeps free on a file system that has
/// `free` bytes free now: a tenth of it, at least 1 GiB, at most half.
pub fn reserve_for(free: u64) -> u64 {
    (free / 10).max(1 << 30).min(free / 2)
}

/// Bytes free on the file system of `file` now (for the reserve).
pub(crate) fn free_now(file: &File) -> io::Result<u64> {
    free_bytes(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Chunks are allocated once each, on their first write, and a file
    /// system short of its reserve refuses with `StorageFull`.
    #[test]
    fn chunks_are_allocated_once_and_the_reserve_is_kept() {
        let f = tempfile::tempfile().unwrap();
        f.set_len(64 * CHUNK).unwrap();
        let g = Growth::new(64 * CHUNK, 0).unwrap();
        g.ensure(&f, 3 * CHUNK + 4096, 8192).unwrap();
        g.ensure(&f, CHUNK - 4096, 8192).unwrap();
        assert_eq!(g.allocated(), 3 * CHUNK);
        use std::os::unix::fs::MetadataExt;
        assert!(f.metadata().unwrap().blocks() * 512 >= 3 * CHUNK);
        let tight = Growth::new(64 * CHUNK, u64::MAX / 2).unwrap();
        let e = tight.ensure(&f, 10 * CHUNK, 4096).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::StorageFull, "{e}");
        assert!(e.to_string().contains("reserve"), "{e}");
        assert_eq!(tight.allocated(), 0);
    }
}
