//! The allocator's scan (mm/swapfile.c's `scan_swap_map_slots`): on a
//! solid-state device, free slots come from this CPU's current cluster
//! (a free one, or a fragmented one tried a bounded number of times,
//! `FRAG_TRIES`); with no cluster to take, the map is scanned from this
//! CPU's scan base (seed 001; one shared base with the switch off, and on
//! rotational devices, which allocate in sequential runs); after the
//! first slot, seed 000 keeps scanning a little for a slot cache's batch.
//! And a whole free cluster for a 2 MB unit (seed 003).  Every slot taken
//! turns from free to used under the device lock, so the cluster lists
//! agree with the counts (`device.rs`).

use std::sync::atomic::Ordering;

use super::cluster::{ListId, CLUSTER_SLOTS};
use super::config::ScanBase;
use super::device::{xorshift, DeviceInner, PercpuCluster, SlotDevice, FRAG_TRIES, LATENCY_LIMIT};
use super::entry::SwapEntry;

impl SlotDevice {
    /// `set_cluster_next`: remember where this CPU (or everyone) scans next.
    /// Per the review of seed 001, a per-CPU base that crosses into another
    /// trunk jumps to a random trunk, so CPUs that drift into each other's
    /// trunk separate again instead of fighting over its lock.
    fn set_cluster_next(&self, si: &mut DeviceInner, cpu: usize, next: u64) {
        if self.rotational || self.switches.scan_base == ScanBase::Shared {
            si.cluster_next = next;
            return;
        }
        let prev = si.cluster_next_cpu[cpu];
        let mut next = next;
        if prev / self.trunk_slots != next / self.trunk_slots {
            if si.highest_bit <= si.lowest_bit {
                return;
            }
            let span = si.highest_bit - si.lowest_bit + 1;
            next = si.lowest_bit + xorshift(&mut si.rng) % span;
            next -= next % self.trunk_slots;
            next = next.max(si.lowest_bit);
        }
        si.cluster_next_cpu[cpu] = next;
    }

    /// Whether a partly used cluster no CPU works through is on the
    /// nonfull or frag lists (with the nonfull lists switched on): a
    /// compact device takes one before a cluster never used.
    fn has_partly_used(&self, si: &DeviceInner) -> bool {
        self.switches.nonfull_clusters
            && si
                .lists
                .iter(ListId::Nonfull)
                .chain(si.lists.iter(ListId::Frag))
                .take(FRAG_TRIES)
                .any(|c| !si.percpu_cluster.iter().any(|p| p.index == Some(c)))
    }

    /// A compact device, without the nonfull lists: a cluster below
    /// the frontier with a quarter of its slots free or more, that no CPU
    /// works through, from a cursor that goes round the used clusters, a
    /// few looked at per call.  Without it every cluster switch took a
    /// cluster never used while freed slots lay in used ones: a compiler
    /// at a small budget, its live swap a few MiB, had written 216,000
    /// slots of a 16 GiB file, and committed 5 MiB of their per-slot
    /// metadata (an encrypted file's seals).
    fn partly_used_below_fresh(&self, si: &mut DeviceInner) -> Option<u32> {
        const LOOKS: u32 = 8;
        if si.fresh == 0 {
            return None;
        }
        for _ in 0..LOOKS.min(si.fresh) {
            let c = si.reuse_next % si.fresh;
            si.reuse_next = c + 1;
            if si.percpu_cluster.iter().any(|p| p.index == Some(c)) {
                continue;
            }
            let count = self.clusters.lock(c as usize).count as u64;
            if count <= CLUSTER_SLOTS * 3 / 4 {
                return Some(c);
            }
        }
        None
    }

    /// `scan_swap_map_try_ssd_cluster`: the next free slot of this CPU's
    /// current cluster, taking a new cluster when it is used up.  Returns
    /// `None` when the CPU has no cluster and none can be had: then the
    /// caller falls back to scanning the map linearly.
    fn try_ssd_cluster(&self, si: &mut DeviceInner, cpu: usize) -> Option<u64> {
        loop {
            if si.percpu_cluster[cpu].index.is_none() {
                // A compact device takes a freed cluster (they are at
                // the head of the free list), then a partly used one, and
                // a cluster never used (which grows a growing backing and
                // commits its slots' metadata) last.
                let free = si
                    .lists
                    .head(ListId::Free)
                    .filter(|&c| !self.compact || c < si.fresh || !self.has_partly_used(si));
                // Compact, with only a cluster never used at the head and
                // no nonfull lists to say which are partly used: one of
                // those below the frontier, if a few looked at have room.
                let reused = match free {
                    Some(c) if self.compact && c >= si.fresh && !self.switches.nonfull_clusters => {
                        self.partly_used_below_fresh(si)
                    }
                    _ => None,
                };
                let c = if let Some(c) = reused {
                    c
                } else if let Some(c) = free {
                    si.fresh = si.fresh.max(c + 1);
                    c
                } else if self.switches.nonfull_clusters {
                    // Kernel 6.12: prefer a partly used cluster that no CPU
                    // has scanned since it became partly free, then the
                    // fragmented ones, rotating through them.  Skip a
                    // cluster another CPU is working through: two CPUs in
                    // one cluster take each other's slots and both give it
                    // up after a few (the kernel takes a CPU's cluster off
                    // the lists for the same reason).  Look at a few
                    // only, as 6.18 scans one frag cluster, then fall back
                    // to the linear scan.
                    let owned = |c: u32| si.percpu_cluster.iter().any(|p| p.index == Some(c));
                    let c = si
                        .lists
                        .iter(ListId::Nonfull)
                        .chain(si.lists.iter(ListId::Frag))
                        .take(FRAG_TRIES)
                        .find(|&c| !owned(c))?;
                    si.lists.move_tail(c, ListId::Frag);
                    c
                } else if let Some(c) = si.lists.head(ListId::Free) {
                    // Compact, without the nonfull lists: a fresh one.
                    si.fresh = si.fresh.max(c + 1);
                    c
                } else {
                    return None;
                };
                self.counters.cluster_switch.inc();
                si.percpu_cluster[cpu] = PercpuCluster {
                    index: Some(c),
                    next: c as u64 * CLUSTER_SLOTS,
                };
            }
            let pc = si.percpu_cluster[cpu];
            let c = pc.index.expect("set above");
            let max = ((c as u64 + 1) * CLUSTER_SLOTS).min(self.max);
            let mut tmp = pc.next;
            // Other CPUs may have taken slots of our cluster (they scan the
            // whole map when they find no free cluster): look again.
            if tmp < max {
                let _cl = self.clusters.lock(c as usize);
                while tmp < max && self.map[tmp as usize].load(Ordering::Relaxed) != 0 {
                    tmp += 1;
                }
            }
            if tmp >= max {
                si.percpu_cluster[cpu].index = None;
                continue;
            }
            si.percpu_cluster[cpu].next = tmp + 1;
            return Some(tmp);
        }
    }

    /// `scan_swap_map_slots`: take up to `out.len()` free slots, each set to
    /// `usage`.  Returns how many were taken.
    ///
    /// Solid-state devices take slots from the CPU's current cluster; when no
    /// free cluster is left they scan the map from their scan base.  After
    /// the first slot, seed 000 keeps scanning a little (bounded by
    /// `LATENCY_LIMIT`, and not at all when the search for the first slot
    /// already scanned many) so that a slot-cache refill still returns a
    /// batch on a fragmented device.
    pub(crate) fn scan_swap_map_slots(&self, cpu: usize, usage: u8, out: &mut [SwapEntry]) -> usize {
        let nr = out.len();
        let mut n_ret = 0usize;
        let mut latency_ration = LATENCY_LIMIT;
        let mut scanned_many = false;
        let mut scanned = 0u64;
        let mut si = self.inner.lock();
        if si.highest_bit == 0 || nr == 0 {
            return 0;
        }
        let shared_base = self.rotational || self.switches.scan_base == ScanBase::Shared;
        let mut scan_base = if shared_base {
            si.cluster_next
        } else {
            si.cluster_next_cpu[cpu]
        };
        let mut offset = scan_base;
        let mut go_scan = false;

        if !self.rotational {
            match self.try_ssd_cluster(&mut si, cpu) {
                Some(o) => {
                    offset = o;
                    scan_base = o;
                }
                None => go_scan = true,
            }
        } else if si.cluster_nr == 0 {
            // Rotational: start a new sequential run at the first free
            // cluster, to keep the allocated span short for the disk head.
            if let Some(c) = si.lists.head(ListId::Free) {
                offset = c as u64 * CLUSTER_SLOTS;
                scan_base = offset;
                si.cluster_next = offset;
            }
            si.cluster_nr = CLUSTER_SLOTS - 1;
        } else {
            si.cluster_nr -= 1;
        }

        'outer: loop {
            if !go_scan {
                // checks:
                if si.highest_bit == 0 {
                    break 'outer;
                }
                if offset > si.highest_bit {
                    offset = si.lowest_bit;
                    scan_base = offset;
                }
                let c = Self::cluster_of(offset);
                {
                    let mut cl = self.clusters.lock(c);
                    if self.map[offset as usize].load(Ordering::Relaxed) != 0 {
                        drop(cl);
                        if n_ret == 0 {
                            go_scan = true;
                            continue 'outer;
                        }
                        break 'outer;
                    }
                    self.map[offset as usize].store(usage, Ordering::Relaxed);
                    Self::inc_cluster(&mut si.lists, c, &mut cl);
                }
                self.range_alloc(&mut si, offset, 1);
                self.set_cluster_next(&mut si, cpu, offset + 1);
                out[n_ret] = self.entry(offset);
                n_ret += 1;
                if n_ret == nr || offset >= si.highest_bit {
                    break 'outer;
                }
                // Time to take a break?
                latency_ration -= 1;
                if latency_ration < 0 {
                    break 'outer;
                }
                // Try to get more slots in the cluster.
                if !self.rotational {
                    if let Some(o) = self.try_ssd_cluster(&mut si, cpu) {
                        offset = o;
                        scan_base = o;
                        continue 'outer;
                    }
                } else if si.cluster_nr > 0
                    && offset + 1 < self.max
                    && self.map[offset as usize + 1].load(Ordering::Relaxed) == 0
                {
                    si.cluster_nr -= 1;
                    offset += 1;
                    continue 'outer;
                }
                // Seed 000: even when fragmented, scan a little more with
                // the lock held, unless we already scanned many slots.
                if self.switches.fragmented_scan && !scanned_many {
                    let scan_limit = if offset < scan_base {
                        scan_base
                    } else {
                        si.highest_bit
                    };
                    while offset <= scan_limit {
                        latency_ration -= 1;
                        if latency_ration <= 0 {
                            break;
                        }
                        scanned += 1;
                        if self.map[offset as usize].load(Ordering::Relaxed) == 0 {
                            self.counters.frag_scan_slots.inc();
                            continue 'outer;
                        }
                        offset += 1;
                    }
                }
                break 'outer;
            }

            // scan: look for a free slot with the device lock dropped.
            go_scan = false;
            let (lowest, highest) = (si.lowest_bit, si.highest_bit);
            drop(si);
            // Up from the slot after this one to the top, then, unlike the
            // kernel, from the bottom up to and including the scan base: a
            // device whose only free slot sits at the base would otherwise
            // look full.
            let hit = self
                .scan_free(
                    offset + 1..=highest,
                    &mut latency_ration,
                    &mut scanned_many,
                    &mut scanned,
                )
                .or_else(|| {
                    self.scan_free(
                        lowest..=scan_base.min(highest),
                        &mut latency_ration,
                        &mut scanned_many,
                        &mut scanned,
                    )
                });
            let found = hit.is_some();
            if let Some(o) = hit {
                offset = o;
            }
            si = self.inner.lock();
            if !found {
                break 'outer;
            }
        }
        drop(si);
        self.counters.scanned.add(scanned);
        n_ret
    }

    /// The first free slot in `range`, read without the device lock,
    /// charging each slot looked at against the latency budget; a budget
    /// used up is renewed and marks the search as having scanned many.
    fn scan_free(
        &self,
        range: std::ops::RangeInclusive<u64>,
        latency_ration: &mut i32,
        scanned_many: &mut bool,
        scanned: &mut u64,
    ) -> Option<u64> {
        for off in range {
            *scanned += 1;
            if self.map[off as usize].load(Ordering::Relaxed) == 0 {
                return Some(off);
            }
            *latency_ration -= 1;
            if *latency_ration < 0 {
                *latency_ration = LATENCY_LIMIT;
                *scanned_many = true;
            }
        }
        None
    }

    /// `swap_alloc_cluster`: a whole free cluster for one 2 MB unit, every
    /// slot with count 1.  `None` when no cluster is wholly free: the caller
    /// falls back to single slots.
    pub(crate) fn alloc_cluster(&self) -> Option<SwapEntry> {
        let mut si = self.inner.lock();
        let c = si.lists.head(ListId::Free)?;
        si.fresh = si.fresh.max(c + 1);
        let base = c as u64 * CLUSTER_SLOTS;
        {
            let mut cl = self.clusters.lock(c as usize);
            debug_assert_eq!(cl.count, 0);
            for off in base..base + CLUSTER_SLOTS {
                self.map[off as usize].store(1, Ordering::Relaxed);
            }
            cl.count = CLUSTER_SLOTS as u32;
            si.lists.move_to(c, ListId::Full);
        }
        self.range_alloc(&mut si, base, CLUSTER_SLOTS);
        Some(self.entry(base))
    }
}
