//! Pools of memory the pager maps for itself (on `sys::Mapping`): the
//! staging frames that evicted pages are moved into, the bounce frames
//! that swap-ins are read into, and the 2 MB staging units.

use std::io;

pub(crate) use crate::sys::Mapping;
use crate::sys::{Discarder, DISCARD_BATCH};

use super::page::{self, UNIT_BYTES};
use crate::stats::{Registry, StatMutex};
use crate::PAGE_SIZE;

const UNIT: u64 = UNIT_BYTES as u64;

/// A fixed pool of page frames in one mapping, handed out by index.
/// The free list has room for every frame, so push and pop never allocate.
pub(crate) struct FramePool {
    map: Mapping,
    free: StatMutex<Vec<u32>>,
    discarder: Discarder,
}

impl FramePool {
    pub fn new(frames: u32, registry: &Registry, site: &'static str) -> io::Result<FramePool> {
        let map = Mapping::new(frames as usize * PAGE_SIZE, PAGE_SIZE)?;
        let free: Vec<u32> = (0..frames).rev().collect();
        Ok(FramePool {
            map,
            free: StatMutex::new(free, registry.lock_site(site)),
            discarder: Discarder::new(),
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
        debug_assert!(frames.len() <= DISCARD_BATCH);
        let frames = &frames[..frames.len().min(DISCARD_BATCH)];
        if !self
            .discarder
            .discard(frames.iter().map(|&f| (self.addr(f), PAGE_SIZE)))
        {
            // No process_madvise, or no DONTNEED through it on this
            // kernel: one madvise per frame.
            for &f in frames {
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

/// A few 2 MB staging units in one 2 MB-aligned mapping.
pub(crate) struct UnitPool {
    map: Mapping,
    free: StatMutex<Vec<u32>>,
}

impl UnitPool {
    pub fn new(units: u32, registry: &Registry, site: &'static str) -> std::io::Result<UnitPool> {
        let map = Mapping::new(units as usize * UNIT_BYTES, UNIT_BYTES)?;
        // Without THP, units still go whole, just as 512 small pages.
        let _ = map.advise_huge();
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
        self.map.populate(self.addr(u), UNIT_BYTES)
    }

    /// Drop what unit `u` holds: it reads as missing (zeros) again.
    pub fn discard(&self, u: u32) {
        self.map.discard(self.addr(u), UNIT_BYTES);
    }
}
