//! The swap cache: swap slot -> the page staged for it (mm/swap_state.c).
//!
//! A page being swapped out is added here under its slot before the write,
//! and found here by a fault that races with the write or comes before the
//! page's memory is reused, so no IO is needed.  As in Linux since 4.11 the
//! cache of each device is split into trunks of 16384 slots (64 MB), each
//! with its own lock, because one lock per device was the most contended
//! lock of the swap-out path; seed 001 then spreads CPUs over different
//! trunks.  The trunk size is configurable: 512 slots gives one lock per
//! cluster, which is where the kernel's "swap table" went in 6.18.
//!
//! Entries are atomic words: writers (add, delete) take the trunk lock, so
//! two writers never race on one slot, while lookups read without locking,
//! as `find_get_page` reads the xarray under RCU.  A lookup sees either the
//! old or the new value of a slot.  Every trunk's table is allocated up
//! front (8 bytes per slot), so no operation allocates.

use crate::stats::{CounterId, LockId};
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_utils::CachePadded;

use crate::stats::{Counter, Registry, StatMutex};
use crate::swap_space::SwapEntry;
use crate::table::{self, TableError};

/// What the swap cache stores for a slot: an opaque, non-zero handle to the
/// staged page (the pager's frame number plus one, say).
pub type PageHandle = NonZeroU64;

/// Swap-cache errors.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum SwapCacheError {
    /// `add_to_swap_cache` found the slot already cached (`-EEXIST`).
    #[error("swap cache already holds device {device} slot {offset}")]
    Exists { device: u16, offset: u64 },
    /// The entry is outside every device this cache was built for.
    #[error("swap cache has no device {device} slot {offset}")]
    OutOfRange { device: u16, offset: u64 },
    /// Bad configuration.
    #[error("invalid swap cache configuration: {0}")]
    Config(String),
    /// Its tables could not be allocated.
    #[error(transparent)]
    Table(#[from] TableError),
}

/// Per-trunk state under the trunk lock.
struct Trunk {
    /// Cached slots in this trunk.
    nr: u64,
}

struct DeviceCache {
    /// One lock per trunk, each on its own cache line: trunks exist to be
    /// locked by different CPUs at once, which false sharing would undo.
    trunks: Box<[CachePadded<StatMutex<Trunk>>]>,
    entries: Box<[AtomicU64]>,
}

struct Counters {
    add: Arc<Counter>,
    delete: Arc<Counter>,
    lookup: Arc<Counter>,
    hit: Arc<Counter>,
}

/// The swap cache of a swap space.
pub struct SwapCache {
    devices: Vec<DeviceCache>,
    trunk_slots: u64,
    counters: Counters,
}

impl SwapCache {
    /// A cache for devices of `device_slots[i]` slots each, in trunks of
    /// `trunk_slots` slots.
    pub fn new(device_slots: &[u64], trunk_slots: u64, registry: &Registry) -> Result<Self, SwapCacheError> {
        if trunk_slots == 0 {
            return Err(SwapCacheError::Config(
                "trunk size must be at least 1 slot".into(),
            ));
        }
        let site = registry.lock_site(LockId::SWAP_CACHE_TRUNK);
        // Entries are 8 bytes a slot, committed as slots are used.
        let devices = device_slots
            .iter()
            .map(|&n| {
                let trunks = n.div_ceil(trunk_slots) as usize;
                let mut t = Vec::new();
                table::reserve(&mut t, trunks, "swap cache trunks")?;
                t.extend(
                    (0..trunks).map(|_| CachePadded::new(StatMutex::new(Trunk { nr: 0 }, site.clone()))),
                );
                Ok(DeviceCache {
                    trunks: t.into_boxed_slice(),
                    entries: table::zeroed(n as usize, "swap cache entries")?,
                })
            })
            .collect::<Result<_, TableError>>()?;
        Ok(SwapCache {
            devices,
            trunk_slots,
            counters: Counters {
                add: registry.counter(CounterId::SWAP_CACHE_ADD),
                delete: registry.counter(CounterId::SWAP_CACHE_DELETE),
                lookup: registry.counter(CounterId::SWAP_CACHE_LOOKUP),
                hit: registry.counter(CounterId::SWAP_CACHE_HIT),
            },
        })
    }

    /// Slots per trunk.
    pub fn trunk_slots(&self) -> u64 {
        self.trunk_slots
    }

    fn device(&self, e: SwapEntry, n: u64) -> Result<&DeviceCache, SwapCacheError> {
        let err = SwapCacheError::OutOfRange {
            device: e.device(),
            offset: e.offset(),
        };
        let d = self.devices.get(e.device() as usize).ok_or(err.clone())?;
        if e.offset()
            .checked_add(n)
            .is_none_or(|end| end > d.entries.len() as u64)
        {
            return Err(err);
        }
        Ok(d)
    }

    /// `add_to_swap_cache`: cache `page` under `e`.
    pub fn add(&self, e: SwapEntry, page: PageHandle) -> Result<(), SwapCacheError> {
        self.add_batch(e, std::slice::from_ref(&page))
    }

    /// Cache `pages[i]` under the slot `e + i`, all or nothing: the batch of
    /// a 2 MB unit (seed 003) takes each trunk lock once.
    pub fn add_batch(&self, e: SwapEntry, pages: &[PageHandle]) -> Result<(), SwapCacheError> {
        let d = self.device(e, pages.len() as u64)?;
        let mut i = 0u64;
        let n = pages.len() as u64;
        while i < n {
            let off = e.offset() + i;
            let t = off / self.trunk_slots;
            let run = ((t + 1) * self.trunk_slots - off).min(n - i);
            let mut trunk = d.trunks[t as usize].lock();
            let range = off as usize..(off + run) as usize;
            if let Some(k) = d.entries[range.clone()]
                .iter()
                .position(|x| x.load(Ordering::Relaxed) != 0)
            {
                drop(trunk);
                // Undo what earlier trunks of this batch added.
                if i > 0 {
                    self.delete_batch(e, &mut [None; 0][..], i);
                }
                return Err(SwapCacheError::Exists {
                    device: e.device(),
                    offset: off + k as u64,
                });
            }
            for (slot, p) in d.entries[range]
                .iter()
                .zip(&pages[i as usize..(i + run) as usize])
            {
                slot.store(p.get(), Ordering::Release);
            }
            trunk.nr += run;
            i += run;
        }
        self.counters.add.add(n);
        Ok(())
    }

    /// `lookup_swap_cache`: the page cached under `e`, without locking.
    #[inline]
    pub fn lookup(&self, e: SwapEntry) -> Option<PageHandle> {
        self.counters.lookup.inc();
        let d = self.device(e, 1).ok()?;
        let v = NonZeroU64::new(d.entries[e.offset() as usize].load(Ordering::Acquire));
        if v.is_some() {
            self.counters.hit.inc();
        }
        v
    }

    /// `delete_from_swap_cache`: remove and return what is cached under `e`.
    pub fn delete(&self, e: SwapEntry) -> Option<PageHandle> {
        let mut out = [None];
        self.delete_batch(e, &mut out, 1);
        out[0]
    }

    /// Remove the `n` slots from `e`, writing what each held into `out`
    /// (when `out` is long enough); returns how many were cached.  Each trunk
    /// lock is taken once.
    pub fn delete_batch(&self, e: SwapEntry, out: &mut [Option<PageHandle>], n: u64) -> u64 {
        let Ok(d) = self.device(e, n) else { return 0 };
        let mut removed = 0;
        let mut i = 0u64;
        while i < n {
            let off = e.offset() + i;
            let t = off / self.trunk_slots;
            let run = ((t + 1) * self.trunk_slots - off).min(n - i);
            let mut trunk = d.trunks[t as usize].lock();
            for k in 0..run {
                let v = NonZeroU64::new(d.entries[(off + k) as usize].swap(0, Ordering::AcqRel));
                if v.is_some() {
                    trunk.nr -= 1;
                    removed += 1;
                }
                if let Some(o) = out.get_mut((i + k) as usize) {
                    *o = v;
                }
            }
            i += run;
        }
        self.counters.delete.add(removed);
        removed
    }

    /// Cached slots over all devices (a quiescent read is exact).
    pub fn len(&self) -> u64 {
        self.devices
            .iter()
            .flat_map(|d| d.trunks.iter())
            .map(|t| t.lock().nr)
            .sum()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn h(v: u64) -> PageHandle {
        PageHandle::new(v).unwrap()
    }

    #[test]
    fn add_lookup_delete() {
        let c = SwapCache::new(&[100, 50], 16, &Registry::new()).unwrap();
        let e = SwapEntry::new(1, 7);
        assert_eq!(c.lookup(e), None);
        c.add(e, h(42)).unwrap();
        assert_eq!(c.lookup(e), Some(h(42)));
        assert_eq!(
            c.add(e, h(43)),
            Err(SwapCacheError::Exists { device: 1, offset: 7 })
        );
        assert_eq!(c.len(), 1);
        assert_eq!(c.delete(e), Some(h(42)));
        assert_eq!(c.delete(e), None);
        assert!(c.is_empty());
        assert!(matches!(
            c.add(SwapEntry::new(1, 50), h(1)),
            Err(SwapCacheError::OutOfRange { .. })
        ));
        assert!(matches!(
            c.add(SwapEntry::new(2, 0), h(1)),
            Err(SwapCacheError::OutOfRange { .. })
        ));
        assert!(SwapCache::new(&[10], 0, &Registry::new()).is_err());
    }

    #[test]
    fn batches_cross_trunks_all_or_nothing() {
        let reg = Registry::new();
        let c = SwapCache::new(&[2048], 512, &reg).unwrap();
        let pages: Vec<_> = (1..=600).map(h).collect();
        c.add_batch(SwapEntry::new(0, 300), &pages).unwrap();
        // Two trunk locks for a batch spanning two trunks.
        assert_eq!(reg.snapshot().locks.swap_cache_trunk.acquisitions, 2);
        assert_eq!(c.len(), 600);
        // A batch that collides in its second trunk leaves nothing behind.
        let more: Vec<_> = (1000..1500).map(h).collect();
        assert_eq!(
            c.add_batch(SwapEntry::new(0, 0), &more),
            Err(SwapCacheError::Exists {
                device: 0,
                offset: 300
            })
        );
        assert_eq!(c.len(), 600);
        assert_eq!(c.lookup(SwapEntry::new(0, 0)), None);
        let mut out = vec![None; 600];
        assert_eq!(c.delete_batch(SwapEntry::new(0, 300), &mut out, 600), 600);
        assert_eq!(out[599], Some(h(600)));
        assert!(c.is_empty());
    }

    #[test]
    fn many_threads_own_disjoint_slots() {
        let c = SwapCache::new(&[1 << 16], 1024, &Registry::new()).unwrap();
        std::thread::scope(|s| {
            for t in 0..8u64 {
                let c = &c;
                s.spawn(move || {
                    let mut mine = HashMap::new();
                    for i in 0..20_000u64 {
                        let off = (i * 8 + t) % (1 << 16);
                        let e = SwapEntry::new(0, off);
                        if let std::collections::hash_map::Entry::Vacant(v) = mine.entry(off) {
                            c.add(e, h(off * 10 + t + 1)).unwrap();
                            v.insert(());
                        } else {
                            assert_eq!(c.lookup(e), Some(h(off * 10 + t + 1)));
                            assert_eq!(c.delete(e), Some(h(off * 10 + t + 1)));
                            mine.remove(&off);
                        }
                    }
                    for off in mine.keys() {
                        assert!(c.delete(SwapEntry::new(0, *off)).is_some());
                    }
                });
            }
        });
        assert!(c.is_empty());
    }
}
