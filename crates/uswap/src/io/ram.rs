//! RAM devices: slots in an anonymous private mapping of our own, like
//! the RAM disks the seeds' tests swap on.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use super::device::{BackendKind, IoDevice, PageStore};
use super::error::IoError;
use crate::stats::Registry;
use crate::sys::Mapping;
use crate::PAGE_SIZE;

/// The memory of a RAM device: `slots * 4096` bytes mapped with
/// `MAP_NORESERVE` (pages are only allocated when first written) and
/// inherited by a forked child as private memory (its own copy),
/// unmapped on drop.  Unwritten slots read as zeros.
///
/// Invariant: every access to the mapping goes through [`ram_write`] and
/// [`ram_read`] (their `copy`).
pub(crate) struct RamStore {
    map: Mapping,
    /// A bit per slot: written at least once (its page of the mapping is
    /// memory from then on).
    written: Box<[AtomicU64]>,
    /// Slots written at least once: the device's memory, in pages.
    touched: AtomicU64,
}

impl RamStore {
    pub fn new(slots: u64) -> Result<RamStore, IoError> {
        let len = slots
            .checked_mul(PAGE_SIZE as u64)
            .and_then(|b| usize::try_from(b).ok())
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(|| IoError::Mmap {
                what: "a RAM swap device",
                source: io::Error::new(io::ErrorKind::InvalidInput, "size overflows the address space"),
            })?;
        let map = Mapping::new(len, PAGE_SIZE).map_err(|source| IoError::Mmap {
            what: "a RAM swap device",
            source,
        })?;
        let written = crate::table::zeroed(slots.div_ceil(64) as usize, "a RAM device's written slots")
            .map_err(|e| IoError::Mmap {
                what: "a RAM swap device",
                source: io::Error::other(e),
            })?;
        Ok(RamStore {
            map,
            written,
            touched: AtomicU64::new(0),
        })
    }
}

impl PageStore for RamStore {
    fn kind(&self) -> BackendKind {
        BackendKind::Ram
    }

    fn write(&self, offset: u64, buf: &[u8]) -> Result<(), IoError> {
        ram_write(&self.map, offset as usize * PAGE_SIZE, buf);
        for s in offset..offset + (buf.len() / PAGE_SIZE) as u64 {
            let bit = 1u64 << (s % 64);
            if self.written[(s / 64) as usize].fetch_or(bit, Ordering::Relaxed) & bit == 0 {
                self.touched.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    fn ram_pages(&self) -> u64 {
        self.touched.load(Ordering::Relaxed)
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), IoError> {
        ram_read(&self.map, offset as usize * PAGE_SIZE, buf);
        Ok(())
    }
}

/// Copy `src` (a whole number of words) into the region at byte `at`.
///
/// Racing callers (one that broke the one-owner-per-slot contract) get
/// torn pages, never undefined behaviour: every access to the region is
/// either `rep movsb` in inline assembly (x86-64), which the compiler
/// treats as an opaque call and the hardware as plain byte moves, or a
/// relaxed atomic word (elsewhere).  `rep movsb` moves a cache-cold page
/// in about 0.5 us, where the atomic word loop took 0.58 us to write and
/// 0.75 us to read one (random pages of 256 MiB, this machine kind).
#[inline]
fn ram_write(region: &Mapping, at: usize, src: &[u8]) {
    assert!(at.is_multiple_of(8) && src.len().is_multiple_of(8) && at + src.len() <= region.len());
    // SAFETY: `at + src.len() <= len` (asserted), so the destination is
    // inside the live mapping, 8-aligned (page-aligned base, `at` a
    // multiple of 8); the region is only ever accessed through these two
    // functions (RamStore's invariant).
    unsafe { to_region(region.as_ptr().add(at), src) }
}

/// Copy from the region at byte `at` into `dst` (a whole number of words);
/// see [`ram_write`].
#[inline]
fn ram_read(region: &Mapping, at: usize, dst: &mut [u8]) {
    assert!(at.is_multiple_of(8) && dst.len().is_multiple_of(8) && at + dst.len() <= region.len());
    // SAFETY: as in `ram_write`, the other way round.
    unsafe { from_region(dst, region.as_ptr().add(at)) }
}

/// `rep movsb` of `len` bytes from `src` to `dst`.
///
/// # Safety
/// Both ranges valid for `len` bytes and not overlapping.
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn movsb(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: the caller's ranges; `rep movsb` reads `len` bytes at rsi
    // and writes them at rdi, forwards (the ABI keeps the direction flag
    // clear), and clobbers only rcx, rdi and rsi.
    unsafe {
        std::arch::asm!(
            "rep movsb",
            inout("rcx") len => _,
            inout("rdi") dst => _,
            inout("rsi") src => _,
            options(nostack, preserves_flags)
        );
    }
}

/// # Safety
/// `region` valid for `src.len()` bytes, 8-aligned, accessed only through
/// these functions.
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn to_region(region: *mut u8, src: &[u8]) {
    // SAFETY: the caller's region range; `src` is a borrowed slice, which
    // cannot overlap the store's own mapping.
    unsafe { movsb(region, src.as_ptr(), src.len()) }
}

/// # Safety
/// As [`to_region`].
#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn from_region(dst: &mut [u8], region: *const u8) {
    // SAFETY: as in `to_region`; `dst` is borrowed mutably.
    unsafe { movsb(dst.as_mut_ptr(), region, dst.len()) }
}

/// Elsewhere: relaxed atomic words on the region's side.
///
/// # Safety
/// As the x86-64 version.
#[cfg(not(target_arch = "x86_64"))]
#[inline]
unsafe fn to_region(region: *mut u8, src: &[u8]) {
    for (i, w) in src.chunks_exact(8).enumerate() {
        let v = u64::from_ne_bytes(w.try_into().expect("chunks of 8"));
        // SAFETY: in bounds and 8-aligned (the caller's); atomic-only.
        let word = unsafe { AtomicU64::from_ptr(region.add(8 * i).cast::<u64>()) };
        word.store(v, Ordering::Relaxed);
    }
}

/// # Safety
/// As the x86-64 version.
#[cfg(not(target_arch = "x86_64"))]
#[inline]
unsafe fn from_region(dst: &mut [u8], region: *const u8) {
    for (i, w) in dst.chunks_exact_mut(8).enumerate() {
        // SAFETY: as in `to_region`.
        let word = unsafe { AtomicU64::from_ptr(region.add(8 * i).cast_mut().cast::<u64>()) };
        w.copy_from_slice(&word.load(Ordering::Relaxed).to_ne_bytes());
    }
}

impl IoDevice {
    /// A RAM device of `slots` pages: an anonymous private mapping of
    /// `slots * 4096` bytes with `MAP_NORESERVE` (pages are only allocated
    /// when first written), inherited by a forked child as its own copy,
    /// unmapped on drop.  Unwritten slots read as zeros.
    pub fn ram(slots: u64, registry: &Registry) -> Result<IoDevice, IoError> {
        if slots == 0 {
            return Err(IoError::ZeroSize);
        }
        Ok(IoDevice::with_store(
            slots,
            Box::new(RamStore::new(slots)?),
            registry,
        ))
    }
}
