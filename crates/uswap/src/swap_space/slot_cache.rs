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

use super::SwapEntry;
use crate::percpu::PerCpu;
use crate::stats::{Registry, StatMutex};

/// Slots per cache refill and per return batch (`SWAP_SLOTS_CACHE_SIZE`,
/// which is `SWAP_BATCH`).
pub const SLOTS_CACHE_SIZE: usize = 64;
/// Caches turn on above this many free slots per CPU.
pub const THRESHOLD_ACTIVATE: i64 = 5 * SLOTS_CACHE_SIZE as i64;
/// Caches turn off below this many free slots per CPU.
pub const THRESHOLD_DEACTIVATE: i64 = 2 * SLOTS_CACHE_SIZE as i64;

/// Slots ready to hand out (`cache->slots`, under `alloc_lock`).
pub(crate) struct AllocCache {
    pub slots: [SwapEntry; SLOTS_CACHE_SIZE],
    pub cur: usize,
    pub nr: usize,
}

/// Freed slots waiting to go back (`cache->slots_ret`, under `free_lock`).
pub(crate) struct RetCache {
    pub slots: [SwapEntry; SLOTS_CACHE_SIZE],
    pub n: usize,
}

/// One CPU's cache: separate locks for the two directions, as in the
/// kernel, so a CPU allocating never waits for one freeing.
pub(crate) struct SlotCache {
    pub alloc: StatMutex<AllocCache>,
    pub ret: StatMutex<RetCache>,
}

pub(crate) fn new_caches(cpus: usize, registry: &Registry) -> PerCpu<SlotCache> {
    let alloc_site = registry.lock_site("slot_cache");
    let ret_site = registry.lock_site("slot_cache_ret");
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
