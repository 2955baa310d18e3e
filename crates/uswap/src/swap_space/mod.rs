//! Swap space: devices of slots and the allocator that hands them out
//! (mm/swapfile.c and mm/swap_slots.c).
//!
//! ```ignore
//! // (run as the unit test `tests::the_module_example`: this module is
//! // public only with the `internal` feature)
//! use uswap::swap_space::{SlotDeviceConfig, SwapSpace};
//! use uswap::stats::Registry;
//!
//! let space = SwapSpace::builder()
//!     .device(SlotDeviceConfig::new(4096).priority(10))
//!     .device(SlotDeviceConfig::new(2048).priority(5))
//!     .build(&Registry::new())?;
//! let slot = space.alloc()?;
//! assert_eq!(space.count(slot)?, 1);
//! space.free(slot)?;
//! # Ok::<(), uswap::swap_space::SwapError>(())
//! ```
//!
//! Seed switches ([`Switches`]) restore the behaviour before each seed:
//! `slot_cache` (per-CPU slot caches), `fragmented_scan` (seed 000),
//! `scan_base` (seed 001), `huge_cluster` (seed 003).  `nonfull_clusters`
//! goes past the seeds to kernel 6.12's per-list cluster allocation.

mod avail;
mod cluster;
mod config;
mod device;
mod entry;
mod scan;
mod slot_cache;

use crate::stats::{CounterId, LockId};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;

pub use cluster::{ListId, CLUSTER_SLOTS};
pub use config::{ScanBase, SlotDeviceConfig, SwapSpaceBuilder, Switches};
use avail::SpaceShared;
pub use entry::{SwapEntry, SwapError, MAX_DEVICES, MAX_DEVICE_SLOTS, TRUNK_SLOTS};
pub use device::{SlotDevice, LATENCY_LIMIT, SWAP_MAP_MAX};
pub use slot_cache::SLOTS_CACHE_SIZE;

use crate::percpu::{possible_cpus, PerCpu};
use crate::stats::{Counter, Registry, StatMutex};
use device::{Put, SWAP_HAS_CACHE};
use slot_cache::{SlotCache, THRESHOLD_ACTIVATE, THRESHOLD_DEACTIVATE};

impl SwapSpaceBuilder {
    /// Validate and build.
    pub fn build(self, registry: &Registry) -> Result<SwapSpace, SwapError> {
        if self.devices.is_empty() {
            return Err(SwapError::NoDevices);
        }
        if self.devices.len() > MAX_DEVICES {
            return Err(SwapError::TooManyDevices(self.devices.len()));
        }
        for (i, d) in self.devices.iter().enumerate() {
            if d.slots < 2 {
                return Err(SwapError::BadSize {
                    device: i,
                    slots: d.slots,
                    problem: "too small",
                });
            }
            if d.slots > MAX_DEVICE_SLOTS {
                return Err(SwapError::BadSize {
                    device: i,
                    slots: d.slots,
                    problem: "too large",
                });
            }
        }
        if self.cpus == 0 || self.cpus > 4096 {
            return Err(SwapError::Config(format!(
                "cpus must be 1..=4096, got {}",
                self.cpus
            )));
        }
        if self.trunk_slots == 0 {
            return Err(SwapError::Config("trunk_slots must be at least 1".into()));
        }
        let shared = Arc::new(SpaceShared {
            avail: StatMutex::new(
                Vec::with_capacity(MAX_DEVICES),
                registry.lock_site(LockId::SWAP_AVAIL),
            ),
            nr_free: AtomicI64::new(0),
            priorities: self.devices.iter().map(|d| d.priority).collect(),
        });
        let devices: Vec<SlotDevice> = self
            .devices
            .iter()
            .enumerate()
            .map(|(i, d)| SlotDevice::new(i as u16, d, &self, shared.clone(), registry))
            .collect::<Result<_, _>>()?;
        for d in &devices {
            shared.nr_free.fetch_add(d.pages() as i64, Ordering::Relaxed);
            shared.avail_insert(d.index(), d.priority());
        }
        let total_slots = devices.iter().map(|d| d.pages()).sum();
        Ok(SwapSpace {
            caches: slot_cache::new_caches(self.cpus, registry),
            cache_active: AtomicBool::new(self.switches.slot_cache),
            devices,
            shared,
            switches: self.switches,
            trunk_slots: self.trunk_slots,
            total_slots,
            counters: Counters::new(registry),
        })
    }
}

struct Counters {
    alloc: Arc<Counter>,
    alloc_fail: Arc<Counter>,
    refill: Arc<Counter>,
    refill_slots: Arc<Counter>,
    free: Arc<Counter>,
    free_batch: Arc<Counter>,
    dup: Arc<Counter>,
    huge_alloc: Arc<Counter>,
    huge_fallback: Arc<Counter>,
    huge_free: Arc<Counter>,
    cache_drain: Arc<Counter>,
}

impl Counters {
    fn new(r: &Registry) -> Self {
        Counters {
            alloc: r.counter(CounterId::ALLOC),
            alloc_fail: r.counter(CounterId::ALLOC_FAIL),
            refill: r.counter(CounterId::SLOT_CACHE_REFILL),
            refill_slots: r.counter(CounterId::SLOT_CACHE_REFILL_SLOTS),
            free: r.counter(CounterId::FREE),
            free_batch: r.counter(CounterId::FREE_BATCH),
            dup: r.counter(CounterId::DUP),
            huge_alloc: r.counter(CounterId::HUGE_ALLOC),
            huge_fallback: r.counter(CounterId::HUGE_FALLBACK),
            huge_free: r.counter(CounterId::HUGE_FREE),
            cache_drain: r.counter(CounterId::SLOT_CACHE_DRAIN),
        }
    }
}

/// A swap space: one or more devices, allocated by priority.
pub struct SwapSpace {
    devices: Vec<SlotDevice>,
    shared: Arc<SpaceShared>,
    caches: PerCpu<SlotCache>,
    /// `swap_slot_cache_active`: the caches switch off when free slots run
    /// low (see slot_cache.rs).
    cache_active: AtomicBool,
    switches: Switches,
    /// The swap-cache trunk size the scan bases spread CPUs over: the
    /// swap cache built beside this space takes it from here.
    trunk_slots: u64,
    total_slots: u64,
    counters: Counters,
}

impl SwapSpace {
    /// Start configuring a swap space.
    pub fn builder() -> SwapSpaceBuilder {
        SwapSpaceBuilder {
            devices: Vec::new(),
            switches: Switches::DEFAULT,
            cpus: possible_cpus(),
            trunk_slots: TRUNK_SLOTS,
            seed: 0x5eed_f00d_cafe_d00d,
        }
    }

    /// The switches this space was built with.
    pub fn switches(&self) -> Switches {
        self.switches
    }

    /// The devices, by index.
    pub fn devices(&self) -> &[SlotDevice] {
        &self.devices
    }

    /// Slots per swap-cache trunk (`SWAP_ADDRESS_SPACE_PAGES`): a swap
    /// cache for this space must use the same, or the per-CPU scan bases
    /// no longer keep CPUs in different trunks.
    pub fn trunk_slots(&self) -> u64 {
        self.trunk_slots
    }

    /// Usable slots over all devices.
    pub fn total_slots(&self) -> u64 {
        self.total_slots
    }

    /// Free slots over all devices (slots held in slot caches are not free).
    pub fn nr_free(&self) -> u64 {
        self.shared.nr_free.load(Ordering::Relaxed).max(0) as u64
    }

    fn device(&self, e: SwapEntry) -> Result<&SlotDevice, SwapError> {
        self.devices.get(e.device() as usize).ok_or(SwapError::BadEntry {
            device: e.device(),
            offset: e.offset(),
            reason: "no such device",
        })
    }

    /// `get_swap_pages`: fill `out` with slots set to `usage` from the first
    /// device, in priority order, that has any.
    fn get_swap_pages(&self, cpu: usize, usage: u8, out: &mut [SwapEntry]) -> usize {
        let mut order = [0u16; MAX_DEVICES];
        let n = self.shared.avail_order(&mut order);
        for &d in &order[..n] {
            let got = self.devices[d as usize].scan_swap_map_slots(cpu, usage, out);
            if got > 0 {
                return got;
            }
        }
        0
    }

    /// `check_cache_active`: whether the slot caches are in use, turning
    /// them on or off by the number of free slots.
    fn cache_active(&self) -> bool {
        if !self.switches.slot_cache {
            return false;
        }
        let free = self.shared.nr_free.load(Ordering::Relaxed);
        let cpus = self.caches.len() as i64;
        if !self.cache_active.load(Ordering::Relaxed) {
            if free > cpus * THRESHOLD_ACTIVATE {
                self.cache_active.store(true, Ordering::Relaxed);
            }
            return false;
        }
        if free < cpus * THRESHOLD_DEACTIVATE {
            self.cache_active.store(false, Ordering::Relaxed);
            self.drain_slot_caches();
            return false;
        }
        true
    }

    /// Allocate one slot with use count 1.
    pub fn alloc(&self) -> Result<SwapEntry, SwapError> {
        self.counters.alloc.inc();
        let cpu = self.caches.this_index();
        if self.cache_active() {
            let refill = |slots: &mut [SwapEntry]| {
                let got = self.get_swap_pages(cpu, SWAP_HAS_CACHE, slots);
                self.counters.refill.inc();
                self.counters.refill_slots.add(got as u64);
                got
            };
            if let Some(e) = self.caches.get(cpu).alloc(refill) {
                self.devices[e.device() as usize].claim_reserved(e.offset());
                return Ok(e);
            }
        }
        let mut one = [SwapEntry::NONE];
        if self.get_swap_pages(cpu, 1, &mut one) == 1 {
            return Ok(one[0]);
        }
        // Slots parked in other CPUs' caches are not lost: take them back
        // and try once more before calling the space full.
        if self.switches.slot_cache
            && self.drain_slot_caches() > 0
            && self.get_swap_pages(cpu, 1, &mut one) == 1
        {
            return Ok(one[0]);
        }
        self.counters.alloc_fail.inc();
        Err(SwapError::Full {
            slots: self.total_slots,
        })
    }

    /// `get_swap_pages`: fill `out` with slots of count 1 straight from the
    /// devices (not through the slot cache), as many as the first device
    /// with free slots yields in one scan, up to `out.len()`.  Returns how
    /// many; [`SwapError::Full`] when none is free.
    pub fn alloc_batch(&self, out: &mut [SwapEntry]) -> Result<usize, SwapError> {
        self.counters.alloc.add(out.len() as u64);
        let n = self.get_swap_pages(self.caches.this_index(), 1, out);
        if n == 0 && !out.is_empty() {
            self.counters.alloc_fail.inc();
            return Err(SwapError::Full {
                slots: self.total_slots,
            });
        }
        Ok(n)
    }

    /// Allocate 512 contiguous, cluster-aligned slots for a 2 MB unit, each
    /// with use count 1 (seed 003).  [`SwapError::NoFreeCluster`] when no
    /// device has a free cluster (or the switch is off): allocate the pages
    /// singly then.
    pub fn alloc_huge(&self) -> Result<SwapEntry, SwapError> {
        if self.switches.huge_cluster {
            let mut order = [0u16; MAX_DEVICES];
            let n = self.shared.avail_order(&mut order);
            for &d in &order[..n] {
                if let Some(e) = self.devices[d as usize].alloc_cluster() {
                    self.counters.huge_alloc.inc();
                    return Ok(e);
                }
            }
        }
        self.counters.huge_fallback.inc();
        Err(SwapError::NoFreeCluster)
    }

    /// Free a 2 MB unit from [`alloc_huge`](Self::alloc_huge): whole in one
    /// step when no slot of it was duplicated or freed alone, else slot by
    /// slot (each dropping one reference).
    pub fn free_huge(&self, base: SwapEntry) -> Result<(), SwapError> {
        let dev = self.device(base)?;
        if !base.offset().is_multiple_of(CLUSTER_SLOTS) || base.offset() + CLUSTER_SLOTS > dev.max() {
            return Err(SwapError::BadEntry {
                device: base.device(),
                offset: base.offset(),
                reason: "not the first slot of a whole cluster",
            });
        }
        self.counters.huge_free.inc();
        if dev.free_cluster(base.offset()) {
            return Ok(());
        }
        for off in base.offset()..base.offset() + CLUSTER_SLOTS {
            self.free(SwapEntry::new(base.device(), off))?;
        }
        Ok(())
    }

    /// `swap_duplicate`: add a reference to an allocated slot; returns the
    /// new count.
    pub fn dup(&self, e: SwapEntry) -> Result<u32, SwapError> {
        self.counters.dup.inc();
        self.device(e)?.dup(e.offset())
    }

    /// The use count of a slot (0 when free).
    pub fn count(&self, e: SwapEntry) -> Result<u32, SwapError> {
        self.device(e)?.count(e.offset())
    }

    /// `swap_free`: drop a reference; the last one frees the slot (through
    /// the per-CPU return cache when it is on).  Returns the count left.
    pub fn free(&self, e: SwapEntry) -> Result<u32, SwapError> {
        self.counters.free.inc();
        match self.device(e)?.put(e.offset())? {
            Put::Still(n) => Ok(n),
            Put::Reserved => {
                self.free_swap_slot(e);
                Ok(0)
            }
        }
    }

    /// Drop one reference from each entry; the slots that become free go
    /// back in one batch: sorted, one device lock per device and one cluster
    /// lock per cluster touched.  Reorders `entries`.  On a bad entry the
    /// entries before it have been dropped and the rest untouched.
    pub fn free_batch(&self, entries: &mut [SwapEntry]) -> Result<(), SwapError> {
        let mut n = 0;
        let mut result = Ok(());
        for i in 0..entries.len() {
            let e = entries[i];
            self.counters.free.inc();
            match self.device(e).and_then(|d| d.put(e.offset())) {
                Ok(Put::Reserved) => {
                    entries[n] = e;
                    n += 1;
                }
                Ok(Put::Still(_)) => {}
                Err(err) => {
                    result = Err(err);
                    break;
                }
            }
        }
        self.free_entries(&mut entries[..n]);
        result
    }

    /// `free_swap_slot`: a reserved slot goes to this CPU's return cache,
    /// or straight back when the caches are off.
    fn free_swap_slot(&self, e: SwapEntry) {
        if self.cache_active() {
            self.caches.this().free(e, |full| self.free_entries(full));
            return;
        }
        self.free_entries(&mut [e]);
    }

    /// `swapcache_free_entries`: reserved slots become free, sorted so each
    /// device and each cluster is locked once.
    fn free_entries(&self, entries: &mut [SwapEntry]) {
        if entries.is_empty() {
            return;
        }
        self.counters.free_batch.inc();
        entries.sort_unstable();
        let mut i = 0;
        while i < entries.len() {
            let d = entries[i].device();
            let j = i + entries[i..]
                .iter()
                .position(|e| e.device() != d)
                .unwrap_or(entries.len() - i);
            self.devices[d as usize].free_entries(&entries[i..j]);
            i = j;
        }
    }

    /// Give every slot parked in a per-CPU cache back to its device;
    /// returns how many.  Reclaim and `swapoff` do this; so does an
    /// allocation that would otherwise fail.
    pub fn drain_slot_caches(&self) -> usize {
        self.counters.cache_drain.inc();
        self.caches
            .iter()
            .map(|c| c.drain(|slots| self.free_entries(slots)))
            .sum()
    }

    /// Quiescent consistency check of everything: call with no operation in
    /// flight.  Checks per-slot states against cluster counts, cluster list
    /// membership, the free hints, in-use and free totals, slot-cache
    /// contents, and the avail list.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut reserved: Vec<Vec<u64>> = vec![Vec::new(); self.devices.len()];
        for c in self.caches.iter() {
            c.for_each_parked(|e| reserved[e.device() as usize].push(e.offset()));
        }
        let mut free_total = 0u64;
        let mut not_full = Vec::new();
        for (d, res) in self.devices.iter().zip(reserved.iter_mut()) {
            let (_, free) = d.check(res)?;
            free_total += free;
            if free > 0 {
                not_full.push(d.index());
            }
        }
        let nr_free = self.shared.nr_free.load(Ordering::Relaxed);
        if nr_free != free_total as i64 {
            return Err(format!("nr_free is {nr_free} but {free_total} slots are free"));
        }
        let avail = self.shared.avail.lock().clone();
        let mut sorted = avail.clone();
        sorted.sort_unstable();
        if sorted != not_full {
            return Err(format!(
                "avail list {avail:?} but devices with free slots are {not_full:?}"
            ));
        }
        if avail
            .windows(2)
            .any(|w| self.devices[w[0] as usize].priority() < self.devices[w[1] as usize].priority())
        {
            return Err(format!("avail list {avail:?} is not in priority order"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
