//! The per-CPU swap slot cache (mm/swap_slots.c, seed 000's setting).
//!
//! Allocation takes slots one at a time from a per-CPU array refilled 64 at
//! a time from the devices, so the device lock is taken once per batch
//! rather than once per slot; freed slots gather in a per-CPU return array
//! and go back 64 at a time, sorted, one device lock per batch.  Slots in
//! either array are reserved in the map (`SWAP_HAS_CACHE`) and belong to
//! nobody else.
//!
//! The cache pins slots: with many CPUs a nearly full device could fail an
//! allocation while other CPUs hold spare slots.  So, as the kernel does, the
//! caches switch themselves off (and give everything back) when free slots
//! fall below `2 * 64` per CPU, and on again above `5 * 64` per CPU.

use super::entry::SwapEntry;
use crate::percpu::PerCpu;
use crate::stats::LockId;
use crate::stats::{Registry, StatMutex};

/// Slots per cache refill and per return batch (`SWAP_SLOTS_CACHE_SIZE`,
/// which is `SWAP_BATCH`).
pub const SLOTS_CACHE_SIZE: usize = 64;
/// Caches turn on above this many free slots per CPU.
pub const THRESHOLD_ACTIVATE: i64 = 5 * SLOTS_CACHE_SIZE as i64;
/// Caches turn off below this many free slots per CPU.
pub const THRESHOLD_DEACTIVATE: i64 = 2 * SLOTS_CACHE_SIZE as i64;

/// Slots ready to hand out (`cache->slots`, under `alloc_lock`):
/// `slots[cur..cur + nr]`.
pub(crate) struct AllocCache {
    slots: [SwapEntry; SLOTS_CACHE_SIZE],
    cur: usize,
    nr: usize,
}

/// Freed slots waiting to go back (`cache->slots_ret`, under `free_lock`):
/// `slots[..n]`.
pub(crate) struct RetCache {
    slots: [SwapEntry; SLOTS_CACHE_SIZE],
    n: usize,
}

/// One CPU's cache: separate locks for the two directions, as in the
/// kernel, so a CPU allocating never waits for one freeing.  The fast
/// paths are here; where slots come from and go to (the devices, under
/// their locks) is the caller's, passed in as `refill` and `flush`.
pub(crate) struct SlotCache {
    alloc: StatMutex<AllocCache>,
    ret: StatMutex<RetCache>,
}

impl SlotCache {
    /// `get_swap_page`'s fast path: a slot from this cache, refilled first
    /// when empty (`refill` fills the array from the devices, reserved, and
    /// says how many).  None when the devices had none either.
    pub fn alloc(&self, refill: impl FnOnce(&mut [SwapEntry]) -> usize) -> Option<SwapEntry> {
        let mut c = self.alloc.lock();
        if c.nr == 0 {
            let got = refill(&mut c.slots);
            c.cur = 0;
            c.nr = got;
        }
        if c.nr == 0 {
            return None;
        }
        let e = c.slots[c.cur];
        c.cur += 1;
        c.nr -= 1;
        Some(e)
    }

    /// `free_swap_slot`'s fast path: park a reserved slot here; a full
    /// return array goes back first (`flush`, under this cache's lock, as
    /// in the kernel).
    pub fn free(&self, e: SwapEntry, flush: impl FnOnce(&mut [SwapEntry])) {
        let mut r = self.ret.lock();
        if r.n == SLOTS_CACHE_SIZE {
            flush(&mut r.slots);
            r.n = 0;
        }
        let n = r.n;
        r.slots[n] = e;
        r.n += 1;
    }

    /// Give back every slot parked here, in both arrays, through `flush`;
    /// returns how many.
    pub fn drain(&self, mut flush: impl FnMut(&mut [SwapEntry])) -> usize {
        let mut total = 0;
        {
            let mut a = self.alloc.lock();
            let (cur, nr) = (a.cur, a.nr);
            flush(&mut a.slots[cur..cur + nr]);
            total += nr;
            a.nr = 0;
            a.cur = 0;
        }
        let mut r = self.ret.lock();
        let n = r.n;
        flush(&mut r.slots[..n]);
        r.n = 0;
        total + n
    }

    /// Every slot parked here (for the invariant check).
    pub fn for_each_parked(&self, mut f: impl FnMut(SwapEntry)) {
        let a = self.alloc.lock();
        a.slots[a.cur..a.cur + a.nr].iter().for_each(|&e| f(e));
        drop(a);
        let r = self.ret.lock();
        r.slots[..r.n].iter().for_each(|&e| f(e));
    }
}

pub(crate) fn new_caches(cpus: usize, registry: &Registry) -> PerCpu<SlotCache> {
    let alloc_site = registry.lock_site(LockId::SLOT_CACHE);
    let ret_site = registry.lock_site(LockId::SLOT_CACHE_RET);
    PerCpu::new(cpus, |_| SlotCache {
        alloc: StatMutex::new(
            AllocCache {
                slots: [SwapEntry::NONE; SLOTS_CACHE_SIZE],
                cur: 0,
                nr: 0,
            },
            alloc_site.clone(),
        ),
        ret: StatMutex::new(
            RetCache {
                slots: [SwapEntry::NONE; SLOTS_CACHE_SIZE],
                n: 0,
            },
            ret_site.clone(),
        ),
    })
}
