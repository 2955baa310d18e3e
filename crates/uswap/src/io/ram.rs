//! RAM devices: slots in an anonymous private mapping of our own, like
//! the RAM disks the seeds' tests swap on.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{BackendKind, IoError, PageStore};
use crate::sys::Mapping;
use crate::PAGE_SIZE;

/// The memory of a RAM device: `slots * 4096` bytes mapped with
/// `MAP_NORESERVE` (pages are only allocated when first written) and
/// `MADV_DONTFORK` (a forked child neither shares nor copies it),
/// unmapped on drop.  Unwritten slots read as zeros.
///
/// Invariant: every access to the mapping goes through the atomic word
/// copies in [`ram_write`] and [`ram_read`].
pub(crate) struct RamStore {
    map: Mapping,
}

impl RamStore {
    pub fn new(slots: u64) -> Result<RamStore, IoError> {
        let len = slots
            .checked_mul(PAGE_SIZE as u64)
            .and_then(|b| usize::try_from(b).ok())
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(|| IoError::Mmap {
                source: io::Error::new(io::ErrorKind::InvalidInput, "size overflows the address space"),
            })?;
        let map = Mapping::new(len, PAGE_SIZE).map_err(|source| IoError::Mmap { source })?;
        Ok(RamStore { map })
    }
}

impl PageStore for RamStore {
    fn kind(&self) -> BackendKind {
        BackendKind::Ram
    }

    fn write(&self, offset: u64, buf: &[u8]) -> Result<(), IoError> {
        ram_write(&self.map, offset as usize * PAGE_SIZE, buf);
        Ok(())
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), IoError> {
        ram_read(&self.map, offset as usize * PAGE_SIZE, buf);
        Ok(())
    }
}

/// Copy `src` (a whole number of words) into the region at byte `at`.
///
/// The region is written with relaxed atomic stores, one 8-byte word at a
/// time: a caller that broke the one-owner-per-slot contract gets torn
/// pages, not a data race.
#[inline]
fn ram_write(region: &Mapping, at: usize, src: &[u8]) {
    assert!(at % 8 == 0 && src.len() % 8 == 0 && at + src.len() <= region.len());
    for (i, w) in src.chunks_exact(8).enumerate() {
        let v = u64::from_ne_bytes(w.try_into().expect("chunks of 8"));
        // SAFETY: `at + 8 * i + 8 <= len` (asserted above), so the word is
        // inside the live mapping; the base is page aligned and `at` a
        // multiple of 8, so it is aligned for AtomicU64; the region is only
        // ever accessed atomically (RamStore's invariant).
        let word = unsafe { AtomicU64::from_ptr(region.as_ptr().add(at + 8 * i).cast::<u64>()) };
        word.store(v, Ordering::Relaxed);
    }
}

/// Copy from the region at byte `at` into `dst` (a whole number of words),
/// with relaxed atomic loads; see [`ram_write`].
#[inline]
fn ram_read(region: &Mapping, at: usize, dst: &mut [u8]) {
    assert!(at % 8 == 0 && dst.len() % 8 == 0 && at + dst.len() <= region.len());
    for (i, w) in dst.chunks_exact_mut(8).enumerate() {
        // SAFETY: as in `ram_write`: in bounds, aligned, atomic-only.
        let word = unsafe { AtomicU64::from_ptr(region.as_ptr().add(at + 8 * i).cast::<u64>()) };
        w.copy_from_slice(&word.load(Ordering::Relaxed).to_ne_bytes());
    }
}
