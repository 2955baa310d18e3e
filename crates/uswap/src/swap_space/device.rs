//! One swap device: `struct swap_info_struct` and the allocator of
//! mm/swapfile.c as of Linux 5.8, where seeds 000 and 001 landed: here
//! the device, its counts and its frees; its scan for free slots is
//! `scan.rs`.
//!
//! Locking, outermost first:
//!
//! - `inner` (site `swap_info`, the kernel's `si->lock`) protects the cluster
//!   lists, the lowest/highest free hints, `inuse_pages`, the scan bases and
//!   the per-CPU current clusters.  Every change that turns a slot from free
//!   to used or back happens under it, so the lists always agree with the
//!   cluster counts.
//! - a cluster lock (site `cluster`) protects the `swap_map` bytes of its 512
//!   slots and its count.  Counts that move between 1 and many (dup, put)
//!   take only this lock, as the kernel's `lock_cluster_or_swap_info` does.
//! - the space's avail list lock (site `swap_avail`) is taken under `inner`
//!   when a device becomes full or stops being full.
//!
//! `swap_map` bytes are atomics so that the linear scan can read them with
//! the device lock dropped, as the kernel does; a slot found free there is
//! re-checked under its cluster lock before it is taken.

use crate::stats::{CounterId, LockId};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use crossbeam_utils::CachePadded;

use super::cluster::{ClusterLists, ListId, CLUSTER_SLOTS};
use super::avail::SpaceShared;
use super::config::{SlotDeviceConfig, SwapSpaceBuilder, Switches};
use super::entry::{SwapEntry, SwapError};
use crate::stats::{Counter, Registry, StatMutex};
use crate::table::{self, LockGuard, LockTable, TableError, Zeroed};

/// Highest use count kept in the map byte itself (`SWAP_MAP_MAX`); beyond
/// it the count continues in the cluster's continuation array.
pub const SWAP_MAP_MAX: u8 = 0x3e;
/// A slot that can never be used: the header slot 0, the slots past the end
/// of a device whose size is not a multiple of the cluster, bad slots.
pub const SWAP_MAP_BAD: u8 = 0x3f;
/// Reserved but not handed out: sitting in a per-CPU slot cache, or freed
/// and waiting in a return cache.  (The kernel's `SWAP_HAS_CACHE` with a
/// zero count, the state these slots have there.)
pub const SWAP_HAS_CACHE: u8 = 0x40;
/// The count continues in the continuation array (`COUNT_CONTINUED`).
pub const COUNT_CONTINUED: u8 = 0x80;
/// The most slots one allocation call may scan before it counts as having
/// "scanned many" (and, with the lock held, before it takes a break).
pub const LATENCY_LIMIT: i32 = 256;

const COUNT_MASK: u8 = 0x3f;
/// Partly used clusters looked at for one not owned by another CPU before
/// falling back to the linear scan (`nonfull_clusters` policy).
pub(super) const FRAG_TRIES: usize = 4;

/// Per-cluster state under the cluster lock.
pub(crate) struct Cluster {
    /// Slots in this cluster that are not free (used, reserved or bad).
    pub(super) count: u32,
    /// Use counts above `SWAP_MAP_MAX`, allocated the first time a slot of
    /// this cluster overflows: the kernel's swap continuation page.
    pub(super) continued: Option<Box<[u32; CLUSTER_SLOTS as usize]>>,
}

// SAFETY: a zero count, and `None`: all-zero bytes are `None` for an
// `Option<Box<U>>` of a sized `U` (std's documented representation).
unsafe impl Zeroed for Cluster {}

/// A CPU's current cluster (`struct percpu_cluster`): allocations on this
/// CPU take consecutive free slots of it, so that a CPU's slots, and the
/// swap-cache trunk they land in, stay together.
#[derive(Clone, Copy, Default)]
pub(super) struct PercpuCluster {
    pub(super) index: Option<u32>,
    pub(super) next: u64,
}

/// State under the device lock.
pub(super) struct DeviceInner {
    /// No free slot below this (a hint; never above the lowest free slot).
    pub(super) lowest_bit: u64,
    /// No free slot above this; 0 when the device is full.
    pub(super) highest_bit: u64,
    /// Slots in use or reserved (not counting bad slots).
    pub(super) inuse_pages: u64,
    /// The shared scan base: rotational devices, and solid-state ones with
    /// the per-CPU bases switched off (the behaviour before seed 001).
    pub(super) cluster_next: u64,
    /// Rotational devices: slots left in the current sequential run.
    pub(super) cluster_nr: u64,
    pub(super) lists: ClusterLists,
    pub(super) percpu_cluster: Box<[PercpuCluster]>,
    /// Seed 001's `cluster_next_cpu`: each CPU scans from its own base, so
    /// CPUs work in different swap-cache trunks.
    pub(super) cluster_next_cpu: Box<[u64]>,
    pub(super) rng: u64,
    /// A compact device: the first cluster never used (the backing is
    /// written, and the per-slot metadata committed, below it only).
    pub(super) fresh: u32,
    /// A compact device: where the next look for a partly used cluster
    /// below `fresh` starts (`partly_used_below_fresh`).
    pub(super) reuse_next: u32,
}

/// Why a put of a slot's count did or did not free it.
pub(crate) enum Put {
    /// Count dropped to zero: the slot is now reserved (`SWAP_HAS_CACHE`)
    /// and must go through `free_entries`.
    Reserved,
    Still(u32),
}

pub(super) struct DeviceCounters {
    pub(super) scanned: Arc<Counter>,
    pub(super) frag_scan_slots: Arc<Counter>,
    pub(super) cluster_switch: Arc<Counter>,
}

/// A swap device.
pub struct SlotDevice {
    pub(super) index: u16,
    pub(super) priority: i32,
    pub(super) rotational: bool,
    /// Slots are taken from the clusters used so far while any has room
    /// (`SlotDeviceConfig::compact`, and every device that grows).
    pub(super) compact: bool,
    /// Slots the device has, header included (`si->max`).
    pub(super) max: u64,
    /// Usable slots: `max` less the header (`si->pages`).
    pub(super) pages: u64,
    pub(super) switches: Switches,
    pub(super) trunk_slots: u64,
    pub(super) map: Box<[AtomicU8]>,
    pub(super) clusters: LockTable<Cluster>,
    /// The device lock, on its own cache line so that taking it does not
    /// bounce the read-mostly fields above between CPUs.
    pub(super) inner: CachePadded<StatMutex<DeviceInner>>,
    pub(super) shared: Arc<SpaceShared>,
    pub(super) counters: DeviceCounters,
}

#[inline]
pub(super) fn xorshift(state: &mut u64) -> u64 {
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    x
}

impl SlotDevice {
    pub(crate) fn new(
        index: u16,
        cfg: &SlotDeviceConfig,
        space: &SwapSpaceBuilder,
        shared: Arc<SpaceShared>,
        registry: &Registry,
    ) -> Result<Self, TableError> {
        let (switches, cpus, trunk_slots, seed) = (space.switches, space.cpus, space.trunk_slots, space.seed);
        let max = cfg.slots;
        let nr_clusters = max.div_ceil(CLUSTER_SLOTS);
        let map_len = nr_clusters * CLUSTER_SLOTS;
        // One byte a slot, zero (free) until used: committed as used.
        let map: Box<[AtomicU8]> = table::zeroed(map_len as usize, "swap_map")?;
        // Committed as clusters are used: written here, only the first
        // and the last.
        let mut clusters = LockTable::<Cluster>::zeroed(
            nr_clusters as usize,
            registry.lock_site(LockId::CLUSTER),
            "cluster locks",
        )?;
        // The header slot and the tail past `max` are never usable: mark
        // them bad and count them in their cluster, so that cluster never
        // looks free (the kernel does the same in setup_clusters).  The
        // tail lies in the last cluster alone (`max` is past the one
        // before it).
        for off in std::iter::once(0).chain(max..map_len) {
            map[off as usize].store(SWAP_MAP_BAD, Ordering::Relaxed);
            clusters.get_mut(Self::cluster_of(off)).count += 1;
        }
        let mut lists = ClusterLists::new(nr_clusters as u32)?;
        let compact = cfg.grows || cfg.compact;
        lists.set_freed_first(compact);
        let last = nr_clusters as usize - 1;
        for c in std::iter::once(0).chain((last > 0).then_some(last)) {
            let n = clusters.get_mut(c).count;
            if n as u64 == CLUSTER_SLOTS {
                lists.move_to(c as u32, ListId::Full);
            } else if n > 0 {
                lists.move_to(c as u32, ListId::Nonfull);
            }
        }
        let pages = max - 1;
        let mut rng = seed ^ (0x9e37_79b9_7f4a_7c15u64.wrapping_mul(index as u64 + 1)) | 1;
        let highest_bit = max - 1;
        let cluster_next_cpu = (0..cpus).map(|_| 1 + xorshift(&mut rng) % highest_bit).collect();
        // Rotational devices start at the front for sequential IO; before
        // seed 001, solid-state devices started their one base at random.
        let cluster_next = if cfg.rotational {
            1
        } else {
            1 + xorshift(&mut rng) % highest_bit
        };
        let inner = DeviceInner {
            lowest_bit: 1,
            highest_bit,
            inuse_pages: 0,
            cluster_next,
            cluster_nr: 0,
            lists,
            percpu_cluster: vec![PercpuCluster::default(); cpus].into_boxed_slice(),
            cluster_next_cpu,
            rng,
            fresh: 0,
            reuse_next: 0,
        };
        Ok(SlotDevice {
            index,
            priority: cfg.priority,
            rotational: cfg.rotational,
            compact,
            max,
            pages,
            switches,
            trunk_slots,
            map,
            clusters,
            inner: CachePadded::new(StatMutex::new(inner, registry.lock_site(LockId::SWAP_INFO))),
            shared,
            counters: DeviceCounters {
                scanned: registry.counter(CounterId::SCAN_SLOTS),
                frag_scan_slots: registry.counter(CounterId::FRAGMENTED_SCAN_SLOTS),
                cluster_switch: registry.counter(CounterId::CLUSTER_SWITCH),
            },
        })
    }

    /// This device's index in its swap space (`si->type`).
    pub fn index(&self) -> u16 {
        self.index
    }

    /// Allocation priority: higher is used first.
    pub fn priority(&self) -> i32 {
        self.priority
    }

    /// Whether this device is rotational (one shared scan base, sequential
    /// allocation) rather than solid-state.
    pub fn rotational(&self) -> bool {
        self.rotational
    }

    /// Usable slots (the header slot 0 excluded).
    pub fn pages(&self) -> u64 {
        self.pages
    }

    /// Slots the device has, the header included.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// Slots in use or reserved.
    pub fn inuse(&self) -> u64 {
        self.inner.lock().inuse_pages
    }

    /// Clusters on each list: (free, nonfull, frag, full).
    pub fn cluster_list_lens(&self) -> [u32; 4] {
        let g = self.inner.lock();
        ListId::ALL.map(|l| g.lists.len(l))
    }

    #[inline]
    pub(super) fn cluster_of(off: u64) -> usize {
        (off / CLUSTER_SLOTS) as usize
    }

    #[inline]
    pub(super) fn entry(&self, off: u64) -> SwapEntry {
        SwapEntry::new(self.index, off)
    }

    /// A slot went from free to not free: count it, move its cluster.
    #[inline]
    pub(super) fn inc_cluster(lists: &mut ClusterLists, c: usize, cl: &mut Cluster) {
        cl.count += 1;
        if cl.count as u64 == CLUSTER_SLOTS {
            lists.move_to(c as u32, ListId::Full);
        } else if cl.count == 1 {
            lists.move_to(c as u32, ListId::Nonfull);
        }
    }

    /// A slot went from not free to free.  A cluster that had been full,
    /// or scanned by a CPU (frag), has news now: it goes to the tail of the
    /// nonfull list, so that list holds, oldest first, the clusters with
    /// frees since their last scan, and the one at its head has had the
    /// longest time to gather them (kernel 6.12's `partial_free_cluster`).
    #[inline]
    pub(super) fn dec_cluster(lists: &mut ClusterLists, c: usize, cl: &mut Cluster) {
        debug_assert!(cl.count > 0);
        cl.count -= 1;
        if cl.count == 0 {
            lists.move_to(c as u32, ListId::Free);
        } else {
            lists.move_to(c as u32, ListId::Nonfull);
        }
    }

    /// `swap_range_alloc`: `n` slots from `off` were taken.
    #[inline]
    pub(super) fn range_alloc(&self, si: &mut DeviceInner, off: u64, n: u64) {
        let end = off + n - 1;
        if off == si.lowest_bit {
            si.lowest_bit += n;
        }
        if end == si.highest_bit {
            si.highest_bit -= n;
        }
        si.inuse_pages += n;
        self.shared.nr_free.fetch_sub(n as i64, Ordering::Relaxed);
        if si.inuse_pages == self.pages {
            si.lowest_bit = self.max;
            si.highest_bit = 0;
            self.shared.avail_remove(self.index);
        }
    }

    /// `swap_range_free`: `n` slots from `off` were freed.
    #[inline]
    pub(super) fn range_free(&self, si: &mut DeviceInner, off: u64, n: u64) {
        let end = off + n - 1;
        if off < si.lowest_bit {
            si.lowest_bit = off;
        }
        if end > si.highest_bit {
            let was_full = si.highest_bit == 0;
            si.highest_bit = end;
            if was_full {
                self.shared.avail_insert(self.index, self.priority);
            }
        }
        si.inuse_pages -= n;
        self.shared.nr_free.fetch_add(n as i64, Ordering::Relaxed);
    }

    /// `swapcache_free_cluster`: free a whole 2 MB unit in one step when
    /// every slot still has count 1.  Returns false (and changes nothing)
    /// when some slot was duplicated or freed alone: the caller then frees
    /// slot by slot.
    pub(crate) fn free_cluster(&self, base: u64) -> bool {
        debug_assert_eq!(base % CLUSTER_SLOTS, 0);
        let c = Self::cluster_of(base);
        let mut si = self.inner.lock();
        {
            let mut cl = self.clusters.lock(c);
            if cl.count as u64 != CLUSTER_SLOTS
                || (base..base + CLUSTER_SLOTS).any(|o| self.map[o as usize].load(Ordering::Relaxed) != 1)
            {
                return false;
            }
            for off in base..base + CLUSTER_SLOTS {
                self.map[off as usize].store(0, Ordering::Relaxed);
            }
            cl.count = 0;
            si.lists.move_to(c as u32, ListId::Free);
        }
        self.range_free(&mut si, base, CLUSTER_SLOTS);
        true
    }

    /// `swapcache_free_entries` for this device: `offsets` (sorted, all
    /// reserved) become free.  The device lock is taken once, and each
    /// cluster's lock once per run of its slots.
    pub(crate) fn free_entries(&self, offsets: &[SwapEntry]) {
        if offsets.is_empty() {
            return;
        }
        let mut si = self.inner.lock();
        let mut i = 0;
        while i < offsets.len() {
            let c = Self::cluster_of(offsets[i].offset());
            let mut cl = self.clusters.lock(c);
            while i < offsets.len() && Self::cluster_of(offsets[i].offset()) == c {
                let off = offsets[i].offset();
                let prev = self.map[off as usize].swap(0, Ordering::Relaxed);
                assert_eq!(
                    prev, SWAP_HAS_CACHE,
                    "freeing slot {off} of device {} in state {prev:#x}",
                    self.index
                );
                Self::dec_cluster(&mut si.lists, c, &mut cl);
                i += 1;
            }
            drop(cl);
        }
        for e in offsets {
            self.range_free(&mut si, e.offset(), 1);
        }
    }

    /// Check that `off` names a slot of this device.
    fn check_offset(&self, off: u64) -> Result<(), SwapError> {
        if off == 0 || off >= self.max {
            return Err(SwapError::BadEntry {
                device: self.index,
                offset: off,
                reason: "offset outside the device",
            });
        }
        Ok(())
    }

    /// The use count of slot `off` (0 when free or only reserved).
    pub(crate) fn count(&self, off: u64) -> Result<u32, SwapError> {
        self.check_offset(off)?;
        let cl = self.clusters.lock(Self::cluster_of(off));
        Ok(self.count_locked(&cl, off))
    }

    fn count_locked(&self, cl: &Cluster, off: u64) -> u32 {
        let v = self.map[off as usize].load(Ordering::Relaxed);
        if v == SWAP_MAP_BAD || v & SWAP_HAS_CACHE != 0 {
            return 0;
        }
        let mut n = (v & COUNT_MASK) as u32;
        if v & COUNT_CONTINUED != 0 {
            n += cl
                .continued
                .as_ref()
                .expect("continued count without continuation")[(off % CLUSTER_SLOTS) as usize];
        }
        n
    }

    /// Lock the cluster of `off` and read the slot: its map byte and use
    /// count, refusing a slot that is not allocated.
    fn lock_allocated(&self, off: u64) -> Result<(LockGuard<'_, Cluster>, u8, u32), SwapError> {
        self.check_offset(off)?;
        let cl = self.clusters.lock(Self::cluster_of(off));
        let v = self.map[off as usize].load(Ordering::Relaxed);
        let count = self.count_locked(&cl, off);
        if count == 0 {
            return Err(SwapError::BadEntry {
                device: self.index,
                offset: off,
                reason: "slot is not allocated",
            });
        }
        Ok((cl, v, count))
    }

    /// `swap_duplicate`: one more reference to an allocated slot.
    pub(crate) fn dup(&self, off: u64) -> Result<u32, SwapError> {
        let (mut cl, v, count) = self.lock_allocated(off)?;
        if count == u32::MAX {
            return Err(SwapError::CountOverflow {
                device: self.index,
                offset: off,
            });
        }
        if v & COUNT_MASK < SWAP_MAP_MAX {
            self.map[off as usize].store(v + 1, Ordering::Relaxed);
        } else {
            let cont = cl.continued.get_or_insert_with(|| Box::new([0; CLUSTER_SLOTS as usize]));
            cont[(off % CLUSTER_SLOTS) as usize] += 1;
            self.map[off as usize].store(v | COUNT_CONTINUED, Ordering::Relaxed);
        }
        Ok(count + 1)
    }

    /// Drop one reference to `off`; at zero the slot turns reserved and the
    /// caller must free it through `free_entries` (directly or batched).
    pub(crate) fn put(&self, off: u64) -> Result<Put, SwapError> {
        let (mut cl, v, count) = self.lock_allocated(off)?;
        if v & COUNT_CONTINUED != 0 {
            let cont = cl.continued.as_mut().expect("continued");
            let i = (off % CLUSTER_SLOTS) as usize;
            cont[i] -= 1;
            if cont[i] == 0 {
                self.map[off as usize].store(v & !COUNT_CONTINUED, Ordering::Relaxed);
            }
            return Ok(Put::Still(count - 1));
        }
        if count == 1 {
            self.map[off as usize].store(SWAP_HAS_CACHE, Ordering::Relaxed);
            return Ok(Put::Reserved);
        }
        self.map[off as usize].store(v - 1, Ordering::Relaxed);
        Ok(Put::Still(count - 1))
    }

    /// A reserved slot from a slot cache is handed to its user: count 1.
    /// Only the cache that reserved it can name it, so no lock is needed
    /// beyond the atomic store.
    pub(crate) fn claim_reserved(&self, off: u64) {
        let prev = self.map[off as usize].swap(1, Ordering::Relaxed);
        debug_assert_eq!(prev, SWAP_HAS_CACHE);
    }

    #[cfg(test)]
    pub(crate) fn set_continued_for_test(&self, off: u64, extra: u32) {
        let mut cl = self.clusters.lock(Self::cluster_of(off));
        let cont = cl.continued.get_or_insert_with(|| Box::new([0; CLUSTER_SLOTS as usize]));
        cont[(off % CLUSTER_SLOTS) as usize] = extra;
        self.map[off as usize].store(SWAP_MAP_MAX | COUNT_CONTINUED, Ordering::Relaxed);
    }

    /// Whether the device is full (`highest_bit == 0`).
    pub fn is_full(&self) -> bool {
        self.inner.lock().highest_bit == 0
    }

    /// Quiescent consistency check.  `reserved` lists the offsets that the
    /// space's slot caches hold for this device; every `SWAP_HAS_CACHE` slot
    /// must be among them and vice versa.  Returns (in use, free) slots.
    pub(crate) fn check(&self, reserved: &mut [u64]) -> Result<(u64, u64), String> {
        let si = self.inner.lock();
        si.lists.check()?;
        reserved.sort_unstable();
        if let Some(w) = reserved.windows(2).find(|w| w[0] == w[1]) {
            return Err(format!(
                "device {}: slot {} is in two slot caches",
                self.index, w[0]
            ));
        }
        let mut inuse = 0u64;
        let mut free = 0u64;
        let mut nreserved = 0usize;
        for c in 0..self.clusters.len() {
            let cl = self.clusters.lock(c);
            let base = c as u64 * CLUSTER_SLOTS;
            let mut count = 0u32;
            for off in base..base + CLUSTER_SLOTS {
                let v = self.map[off as usize].load(Ordering::Relaxed);
                let bad_expected = off == 0 || off >= self.max;
                if bad_expected != (v == SWAP_MAP_BAD) {
                    return Err(format!(
                        "device {}: slot {off} bad={}, expected {bad_expected}",
                        self.index,
                        v == SWAP_MAP_BAD
                    ));
                }
                if v == 0 {
                    free += 1;
                    if off < si.lowest_bit || off > si.highest_bit {
                        return Err(format!(
                            "device {}: free slot {off} outside the hints [{}, {}]",
                            self.index, si.lowest_bit, si.highest_bit
                        ));
                    }
                    continue;
                }
                count += 1;
                if v == SWAP_MAP_BAD {
                    continue;
                }
                inuse += 1;
                let is_reserved = v == SWAP_HAS_CACHE;
                if is_reserved != reserved.binary_search(&off).is_ok() {
                    return Err(format!(
                        "device {}: slot {off} reserved={is_reserved} but in a slot cache={}",
                        self.index, !is_reserved
                    ));
                }
                nreserved += is_reserved as usize;
                if !is_reserved {
                    let inline = v & COUNT_MASK;
                    if inline == 0 || inline > SWAP_MAP_MAX {
                        return Err(format!("device {}: slot {off} has map byte {v:#x}", self.index));
                    }
                    let cont = cl
                        .continued
                        .as_ref()
                        .map_or(0, |c| c[(off % CLUSTER_SLOTS) as usize]);
                    if (v & COUNT_CONTINUED != 0) != (cont > 0) || (cont > 0 && inline != SWAP_MAP_MAX) {
                        return Err(format!(
                            "device {}: slot {off} continuation {cont} vs map byte {v:#x}",
                            self.index
                        ));
                    }
                }
            }
            if count != cl.count {
                return Err(format!(
                    "device {}: cluster {c} counts {} but holds {count}",
                    self.index, cl.count
                ));
            }
            let list = si.lists.list_of(c as u32);
            let ok = match list {
                ListId::Free => count == 0,
                ListId::Full => count as u64 == CLUSTER_SLOTS,
                ListId::Nonfull | ListId::Frag => count > 0 && (count as u64) < CLUSTER_SLOTS,
            };
            if !ok {
                return Err(format!(
                    "device {}: cluster {c} with count {count} is on the {list:?} list",
                    self.index
                ));
            }
        }
        if nreserved != reserved.len() {
            return Err(format!(
                "device {}: slot caches hold {} slots but {nreserved} are reserved",
                self.index,
                reserved.len()
            ));
        }
        if inuse != si.inuse_pages {
            return Err(format!(
                "device {}: inuse_pages {} but {inuse} slots in use",
                self.index, si.inuse_pages
            ));
        }
        if inuse + free != self.pages {
            return Err(format!(
                "device {}: {inuse} used + {free} free != {} pages",
                self.index, self.pages
            ));
        }
        if (si.highest_bit == 0) != (free == 0) {
            return Err(format!(
                "device {}: highest_bit {} with {free} free",
                self.index, si.highest_bit
            ));
        }
        Ok((inuse, free))
    }
}
