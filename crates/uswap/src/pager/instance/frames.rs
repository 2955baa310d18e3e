//! Pools of memory the pager maps for itself (on `sys::Mapping`): the
//! staging frames that evicted pages are moved into, the bounce frames
//! that swap-ins are read into, and the 2 MB staging units.  Bounce
//! frames and units are held through guards ([`HeldFrames`],
//! [`HeldUnit`]) that give their bytes out safely and return them when
//! dropped; a staging frame's bytes are its page's claim holder's
//! (staged.rs).  The raw `unsafe` byte views stay inside `instance/`.

use std::io;

pub(crate) use crate::sys::Mapping;
use crate::sys::{Discarder, DISCARD_BATCH};

use crate::pager::instance::page::{self, UNIT_BYTES};
use crate::stats::{LockId, Registry, StatMutex};
use crate::PAGE_SIZE;

const UNIT: u64 = UNIT_BYTES as u64;

/// A fixed pool of page frames in one mapping, handed out by index, one
/// at a time or as a run of neighbours (a batch of evicted neighbours is
/// moved into a run with one `UFFDIO_MOVE`).  The free set is a bitmap
/// sized for every frame at creation, so taking and returning never
/// allocate.
pub(crate) struct FramePool {
    map: Mapping,
    free: StatMutex<FreeFrames>,
    discarder: Discarder,
    /// Whether a free frame holds no page: true of the staging pool,
    /// whose frames receive pages by `UFFDIO_MOVE` and `UFFDIO_COPY`, which
    /// refuse a populated destination (`EEXIST`); false of the bounce
    /// pool, read into (each frame populated by its first read).  Checked
    /// in debug builds as each frame is handed out: a free frame that
    /// holds a page is one freed while a staged page still lived in it,
    /// whose contents the next discard would drop (docs/RELIABILITY.md).
    empty_when_free: bool,
}

/// Which frames are free: bit set = free.  `next` is where the last
/// search stopped: frames come back roughly in the order they went out
/// (writeback takes the oldest staged page first), so searching on from
/// there finds free runs without rescanning the busy part (next fit).
struct FreeFrames {
    bits: Vec<u64>,
    frames: u32,
    next: u32,
    /// Frames written back whose contents are still to be discarded, in
    /// one system call for [`DISCARD_BATCH`] of them (`retire`); neither
    /// free nor held.  A discard flushes the TLB of every CPU the
    /// program runs on (12 us on this machine kind): paid per frame, it
    /// cost a fault pacing reclaim more than its writeback.
    retired: [u32; DISCARD_BATCH],
    nretired: usize,
}

impl FreeFrames {
    fn all_free(frames: u32) -> FreeFrames {
        let mut free = FreeFrames {
            bits: vec![0; frames.div_ceil(64) as usize],
            frames,
            next: 0,
            retired: [0; DISCARD_BATCH],
            nretired: 0,
        };
        for f in 0..frames {
            free.set(f, true);
        }
        free
    }

    fn is_free(&self, f: u32) -> bool {
        self.bits[(f / 64) as usize] & (1 << (f % 64)) != 0
    }

    fn set(&mut self, f: u32, free: bool) {
        let (w, b) = ((f / 64) as usize, f % 64);
        if free {
            self.bits[w] |= 1 << b;
        } else {
            self.bits[w] &= !(1 << b);
        }
    }

    /// The first of `n` free neighbours, taken; None when there is no
    /// such run.  One pass over the bitmap at most, skipping full words.
    fn take_run(&mut self, n: u32) -> Option<u32> {
        if n == 0 || n > self.frames {
            return None;
        }
        let mut f = self.next % self.frames;
        let mut start = f;
        let mut len = 0;
        let mut seen = 0;
        // Up to frames + n - 1 frames: a run may wrap around the end of
        // the bitmap in the scan (not in memory): it restarts at 0.
        while seen < self.frames + n {
            if f == self.frames {
                f = 0;
                start = 0;
                len = 0;
            }
            if len == 0 && f.is_multiple_of(64) && self.bits[(f / 64) as usize] == 0 {
                let step = 64.min(self.frames - f);
                f += step;
                seen += step;
                start = f;
                continue;
            }
            if self.is_free(f) {
                len += 1;
                if len == n {
                    for g in start..start + n {
                        self.set(g, false);
                    }
                    self.next = start + n;
                    return Some(start);
                }
            } else {
                len = 0;
                start = f + 1;
            }
            f += 1;
            seen += 1;
        }
        None
    }
}

impl FramePool {
    pub fn new(frames: u32, registry: &Registry, site: LockId) -> io::Result<FramePool> {
        let map = Mapping::new(frames as usize * PAGE_SIZE, PAGE_SIZE)?;
        let free = FreeFrames::all_free(frames);
        Ok(FramePool {
            map,
            free: StatMutex::new(free, registry.lock_site(site)),
            discarder: Discarder::new(),
            empty_when_free: false,
        })
    }

    /// A pool whose free frames hold no page (the staging pool's rule).
    pub fn kept_empty(mut self) -> FramePool {
        self.empty_when_free = true;
        self
    }

    pub fn mapping(&self) -> &Mapping {
        &self.map
    }

    /// A free frame, if any.
    pub fn get(&self) -> Option<u32> {
        self.get_run(1)
    }

    /// The first of `n` free neighbouring frames, if there are such.  When
    /// there are none, the frames retired so far are discarded and
    /// returned first: a small pool (256 frames under a small budget, half
    /// of them kept staged) must not run short for want of a batch that
    /// is not full yet: every dirty victim refused a frame, a fault could
    /// find nothing to evict (the likely cause of an over-budget count a
    /// `uswap run` test saw once; docs/RELIABILITY.md).
    pub fn get_run(&self, n: u32) -> Option<u32> {
        // Two statements: the first lock must be dropped before
        // `flush_retired` takes it again.
        let mut got = self.free.lock().take_run(n);
        if got.is_none() {
            self.flush_retired();
            got = self.free.lock().take_run(n);
        }
        #[cfg(debug_assertions)]
        if let (Some(first), true) = (got, self.empty_when_free) {
            for f in first..first + n {
                assert!(
                    !crate::sys::page_mapped(self.addr(f)),
                    "staging frame {f} handed out holding a page: freed while a staged page lived in it"
                );
            }
        }
        got
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

    /// A free frame, held until the guard drops, waiting for one if all
    /// are in use (see `get_waiting`).
    pub fn hold_waiting(&self) -> HeldFrames<'_> {
        HeldFrames {
            pool: self,
            first: self.get_waiting(),
            n: 1,
        }
    }

    /// `n` free neighbouring frames, held until the guard drops, if there
    /// are such.
    pub fn hold_run(&self, n: u32) -> Option<HeldFrames<'_>> {
        self.get_run(n).map(|first| HeldFrames { pool: self, first, n })
    }

    /// Return a frame.
    pub fn put(&self, f: u32) {
        let mut free = self.free.lock();
        debug_assert!(!free.is_free(f), "frame {f} returned twice");
        free.set(f, true);
    }

    /// Return frames whose pages were written back, their contents to be
    /// discarded: with the frames retired before them once a batch is
    /// full, one system call (and one TLB flush) for the batch.  Until
    /// then a retired frame keeps its memory: at most a batch, 256 KiB,
    /// the budget's fixed overhead (and `flush_retired` when the
    /// reclaimer goes idle).
    pub fn retire(&self, frames: &[u32]) {
        for chunk in frames.chunks(DISCARD_BATCH) {
            let mut batch = [0u32; DISCARD_BATCH];
            let n = {
                let mut free = self.free.lock();
                let room = DISCARD_BATCH - free.nretired;
                if chunk.len() < room {
                    let at = free.nretired;
                    free.retired[at..at + chunk.len()].copy_from_slice(chunk);
                    free.nretired += chunk.len();
                    continue;
                }
                // The batch is full with this chunk: take it all out and
                // keep what does not fit for the next.
                let at = free.nretired;
                batch[..at].copy_from_slice(&free.retired[..at]);
                batch[at..].copy_from_slice(&chunk[..room]);
                let rest = &chunk[room..];
                free.retired[..rest.len()].copy_from_slice(rest);
                free.nretired = rest.len();
                DISCARD_BATCH
            };
            self.discard_and_put(&batch[..n]);
        }
    }

    /// Discard the frames retired so far and return them to the pool.
    pub fn flush_retired(&self) {
        let mut batch = [0u32; DISCARD_BATCH];
        let n = {
            let mut free = self.free.lock();
            let n = free.nretired;
            batch[..n].copy_from_slice(&free.retired[..n]);
            free.nretired = 0;
            n
        };
        self.discard_and_put(&batch[..n]);
    }

    /// Drop the contents of `frames` (at most 64) in one system call and
    /// return them, under one take of the lock.
    pub fn discard_and_put(&self, frames: &[u32]) {
        if frames.is_empty() {
            return;
        }
        self.discard_batch(frames);
        let mut free = self.free.lock();
        for &f in frames {
            debug_assert!(!free.is_free(f), "frame {f} returned twice");
            free.set(f, true);
        }
    }

    /// In a forked child: discards act on this process (`Discarder`).
    pub fn reopen_here(&self) {
        self.discarder.reopen_here();
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

    /// Frame `f` as bytes: for the guards that prove they hold it
    /// ([`HeldFrames`], and a staged page's claim in staged.rs).
    ///
    /// # Safety
    /// The caller must hold frame `f` (from `get`) and the frame must be
    /// populated or about to be filled by IO.
    // Exclusive access comes from holding the frame index (the pool hands
    // each frame to one holder at a time), not from `&mut self`: this is
    // an allocator, and its frames are used from many threads at once.
    #[allow(clippy::mut_from_ref)]
    pub(in crate::pager::instance) unsafe fn bytes(&self, f: u32) -> &mut [u8] {
        // SAFETY: the caller owns the frame, so nobody else reads or writes
        // these bytes while the slice lives; they lie inside the mapping.
        unsafe { std::slice::from_raw_parts_mut(self.addr(f) as *mut u8, PAGE_SIZE) }
    }
}

impl FramePool {
    /// Frames `f..f + n` as bytes, one buffer.
    ///
    /// # Safety
    /// As for [`FramePool::bytes`], for each of the `n` frames.
    #[allow(clippy::mut_from_ref)]
    pub(in crate::pager::instance) unsafe fn run_bytes(&self, f: u32, n: usize) -> &mut [u8] {
        assert!(
            f as usize + n <= self.map.len() / PAGE_SIZE,
            "frames past the pool"
        );
        // SAFETY: the caller holds the frames, which lie in the mapping.
        unsafe { std::slice::from_raw_parts_mut(self.addr(f) as *mut u8, n * PAGE_SIZE) }
    }
}

/// Neighbouring frames taken from a pool, given back when the guard drops:
/// while it lives its holder alone reads and writes them, so their bytes
/// are handed out without `unsafe`.  For frames held within one call (a
/// swap-in's bounce frames); a staging frame outlives the call that took
/// it (the swap cache holds it for its page), and stays an index.
pub(crate) struct HeldFrames<'p> {
    pool: &'p FramePool,
    first: u32,
    n: u32,
}

impl HeldFrames<'_> {
    /// The first frame's address.
    pub fn addr(&self) -> u64 {
        self.pool.addr(self.first)
    }

    /// The frames as one buffer.
    pub fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: the pool handed frames `first..first + n` to this guard
        // alone, until it drops; `&mut self` makes this slice the only one.
        unsafe { self.pool.run_bytes(self.first, self.n as usize) }
    }
}

impl Drop for HeldFrames<'_> {
    fn drop(&mut self) {
        for f in self.first..self.first + self.n {
            self.pool.put(f);
        }
    }
}

/// A few 2 MB staging units in one 2 MB-aligned mapping.
pub(crate) struct UnitPool {
    map: Mapping,
    free: StatMutex<Vec<u32>>,
}

impl UnitPool {
    pub fn new(units: u32, registry: &Registry, site: LockId) -> std::io::Result<UnitPool> {
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

    /// A free unit, held until the guard drops, waiting for one if all
    /// are in use (their holders hold a unit's claim and wait for nothing
    /// but IO, so one comes back).
    pub fn hold_waiting(&self) -> HeldUnit<'_> {
        loop {
            if let Some(u) = self.hold() {
                return u;
            }
            page::pause();
        }
    }

    /// A free unit, held until the guard drops, if there is one.
    pub fn hold(&self) -> Option<HeldUnit<'_>> {
        let u = self.free.lock().pop()?;
        Some(HeldUnit { pool: self, u })
    }

    fn addr(&self, u: u32) -> u64 {
        self.map.addr() + u as u64 * UNIT
    }
}

/// A 2 MB staging unit taken from its pool, given back when the guard
/// drops: while it lives its holder alone reads and writes it, so its
/// bytes are handed out without `unsafe`.  Given back as it is: a unit
/// that holds pages must be emptied ([`HeldUnit::discard`]) first, as
/// the next holder takes it to read as zeros.
pub(crate) struct HeldUnit<'p> {
    pool: &'p UnitPool,
    u: u32,
}

impl HeldUnit<'_> {
    pub fn addr(&self) -> u64 {
        self.pool.addr(self.u)
    }

    /// The unit as bytes.  Populate it first (or have pages moved into it):
    /// a missing page of the receiving pool, which is registered, would
    /// fault to the pager itself.
    pub fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: the pool handed unit `u` to this guard alone, until it
        // drops; it lies in the mapping; `&mut self` makes this slice the
        // only one.
        unsafe { std::slice::from_raw_parts_mut(self.addr() as *mut u8, UNIT_BYTES) }
    }

    /// Fault the unit in, zeroed, as one THP where the kernel can.
    pub fn populate(&self) -> bool {
        self.pool.map.populate(self.addr(), UNIT_BYTES)
    }

    /// Drop what the unit holds: it reads as missing (zeros) again.
    pub fn discard(&self) {
        self.pool.map.discard(self.addr(), UNIT_BYTES);
    }
}

impl Drop for HeldUnit<'_> {
    fn drop(&mut self) {
        self.pool.free.lock().push(self.u);
    }
}

#[cfg(test)]
mod tests {
    use super::{FramePool, FreeFrames};
    use crate::stats::{LockId, Registry};
    use proptest::prelude::*;

    fn count_free(pool: &FramePool) -> usize {
        let free = pool.free.lock();
        (0..free.frames).filter(|&f| free.is_free(f)).count()
    }

    /// Frames retired after writeback come back, their contents discarded:
    /// a full batch at once, fewer when the pool runs short (`get_run`) or
    /// on `flush_retired`; none is handed out twice, none is lost.
    #[test]
    fn retired_frames_come_back_discarded() {
        let reg = Registry::new();
        let pool = FramePool::new(80, &reg, LockId::STAGING_FRAMES)
            .unwrap()
            .kept_empty();
        let mut held: Vec<u32> = (0..80).map(|_| pool.get().unwrap()).collect();
        assert_eq!(pool.get(), None);
        for &f in &held {
            // SAFETY: frame f is held (from get), inside the pool's mapping.
            unsafe { *(pool.addr(f) as *mut u8) = 7 };
        }
        // Fewer than a batch: pending, neither free nor held.
        let ten: Vec<u32> = held.drain(..10).collect();
        pool.retire(&ten);
        assert_eq!(pool.free.lock().nretired, 10);
        assert_eq!(count_free(&pool), 0);
        // The pool is short: a get discards what is pending and hands it out.
        let mut again: Vec<u32> = std::iter::from_fn(|| pool.get()).collect();
        again.sort_unstable();
        assert_eq!(again, ten);
        for &f in &again {
            // SAFETY: as above; discarded, the page reads as zeros.
            let first = unsafe { *(pool.addr(f) as *const u8) };
            assert_eq!(first, 0, "frame {f} not discarded");
        }
        held.extend(again);
        // A full batch goes at once; the rest waits for the next.
        let seventy: Vec<u32> = held.drain(..70).collect();
        pool.retire(&seventy);
        assert_eq!(pool.free.lock().nretired, 6);
        assert_eq!(count_free(&pool), 64);
        pool.flush_retired();
        assert_eq!(pool.free.lock().nretired, 0);
        assert_eq!(count_free(&pool), 70);
        for &f in &seventy {
            // SAFETY: as above: every retired frame was discarded.
            let first = unsafe { *(pool.addr(f) as *const u8) };
            assert_eq!(first, 0, "frame {f} not discarded");
        }
    }

    /// A staging frame given back while it still holds a page is caught
    /// as it is handed out again, in debug builds: the next `UFFDIO_MOVE`
    /// into it would fail with `EEXIST`, and the next discard of it would
    /// drop a page someone still owns.
    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "handed out holding a page")]
    fn a_free_staging_frame_that_holds_a_page_is_caught() {
        let reg = Registry::new();
        let pool = FramePool::new(4, &reg, LockId::STAGING_FRAMES)
            .unwrap()
            .kept_empty();
        let f = pool.get().unwrap();
        // SAFETY: frame f is held (from get), inside the pool's mapping.
        unsafe { *(pool.addr(f) as *mut u8) = 7 };
        pool.put(f);
        let _ = pool.get_run(4);
    }

    proptest! {
        /// Runs taken from the bitmap against a plain model: a run is
        /// free in the model and inside the pool; None only when the model
        /// has no free run that long; returned frames are free again.
        #[test]
        fn runs_match_a_model(frames in 1u32..300, ops in prop::collection::vec((any::<bool>(), 1u32..70, any::<u32>()), 1..200)) {
            let mut f = FreeFrames::all_free(frames);
            let mut model = vec![true; frames as usize];
            let mut taken: Vec<(u32, u32)> = Vec::new();
            for (take, n, pick) in ops {
                if take || taken.is_empty() {
                    let has_run = model.windows(n as usize).any(|w| w.iter().all(|&b| b));
                    match f.take_run(n) {
                        Some(s) => {
                            prop_assert!(s + n <= frames);
                            for i in s..s + n {
                                prop_assert!(model[i as usize], "frame {} handed out twice", i);
                                model[i as usize] = false;
                            }
                            taken.push((s, n));
                        }
                        None => prop_assert!(!has_run, "a free run of {} was missed", n),
                    }
                } else {
                    let (s, n) = taken.swap_remove(pick as usize % taken.len());
                    for i in s..s + n {
                        f.set(i, true);
                        model[i as usize] = true;
                    }
                }
                for i in 0..frames {
                    prop_assert_eq!(f.is_free(i), model[i as usize]);
                }
            }
        }
    }
}
