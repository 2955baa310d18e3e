//! Statistics: operation counters and lock profiles, cheap enough to leave on.
//!
//! The seeds argue from `perf lock` profiles ("`get_swap_pages` 21.03% ->
//! gone"), so every lock in uswap is a [`StatMutex`] that reports, per lock
//! *site* (all cluster locks share the site `cluster`, all swap-cache trunks
//! the site `swap_cache_trunk`), how often it was taken, how often the taker
//! found it held, and how long it waited.
//!
//! Cost: an uncontended acquisition adds one relaxed increment to a counter
//! shard owned (in practice) by the calling thread, so counters never bounce
//! a cache line between CPUs.  The clock is read only when the lock was
//! found held, where the wait dwarfs it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_utils::CachePadded;
use serde::{Deserialize, Serialize};
use std::sync::{Mutex, MutexGuard, PoisonError, TryLockError};

/// Counter shards per site, one per CPU (the CPU number masked to their
/// count): threads on different CPUs never share a cache line; two
/// threads on one CPU share a shard, which costs nothing but an
/// uncontended atomic add, and a thread that migrates mid-increment only
/// adds to another shard: the sum is the same.  By CPU rather than by
/// thread because counters are bumped in the SIGBUS handler, which
/// touches no thread-local storage: a library preloaded into a program
/// (`uswap run`) reaches it through the thread's DTV, which glibc
/// allocates with the program's `calloc`, in paged memory.
///
/// As many as the machine has CPUs (a power of two, at most
/// [`MAX_SHARDS`]), not the most it could have: every process of a tree
/// under `uswap run` has its ninety sites, and at 64 shards of a cache
/// line each they took 700 KiB of its budget from its first instant, on
/// two CPUs.
const MAX_SHARDS: usize = 64;

/// The shard count: the possible CPUs, rounded up to a power of two.
fn shard_count() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| crate::percpu::possible_cpus().next_power_of_two().min(MAX_SHARDS))
}

/// The counter shard of the calling thread's CPU (`sched_getcpu`: the
/// rseq area glibc keeps in the thread's control block, or the vDSO),
/// of `len` (a power of two).
#[inline]
fn shard_index(len: usize) -> usize {
    crate::percpu::current_cpu() & (len - 1)
}

/// A monotonically increasing event count, sharded per thread.
pub struct Counter {
    name: &'static str,
    shards: Box<[CachePadded<AtomicU64>]>,
}

impl Counter {
    fn new(name: &'static str) -> Self {
        Counter {
            name,
            shards: (0..shard_count())
                .map(|_| CachePadded::new(AtomicU64::new(0)))
                .collect(),
        }
    }

    /// The name this counter is reported under.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Add `n` events.
    #[inline]
    pub fn add(&self, n: u64) {
        self.shards[shard_index(self.shards.len())].fetch_add(n, Ordering::Relaxed);
    }

    /// Add one event.
    #[inline]
    pub fn inc(&self) {
        self.add(1);
    }

    /// The sum over all shards.  Concurrent increments may or may not be
    /// included; a quiescent read is exact.
    pub fn get(&self) -> u64 {
        self.shards.iter().map(|s| s.load(Ordering::Relaxed)).sum()
    }
}

/// A level that goes up and down (bytes in a store, pages held), with
/// the highest it reached.  One word: levels change per page stored, not
/// per fault, and a reader wants one exact value.
pub struct Gauge {
    name: &'static str,
    value: AtomicI64,
}

impl Gauge {
    /// The name this gauge is reported under.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Move the level by `delta`.
    #[inline]
    pub fn add(&self, delta: i64) {
        self.value.fetch_add(delta, Ordering::Relaxed);
    }

    /// Set the level.
    pub fn set(&self, v: u64) {
        self.value.store(v as i64, Ordering::Relaxed);
    }

    /// Raise the level to `v` if it is below (a peak).
    #[inline]
    pub fn raise_to(&self, v: u64) {
        self.value.fetch_max(v as i64, Ordering::Relaxed);
    }

    /// The level (0 if updates racing a read left it below zero).
    pub fn get(&self) -> u64 {
        self.value.load(Ordering::Relaxed).max(0) as u64
    }
}

#[derive(Default)]
struct LockShard {
    acquisitions: AtomicU64,
    contended: AtomicU64,
    wait_ns: AtomicU64,
}

/// The statistics of one lock site: every lock of one kind (all cluster
/// locks, all LRU locks of an instance) reports into the same site.
pub struct LockSite {
    name: &'static str,
    shards: Box<[CachePadded<LockShard>]>,
}

/// What a lock site reports: the seeds' `perf lock` columns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockStats {
    /// Times the lock was taken.
    pub acquisitions: u64,
    /// Times the taker found the lock held and had to wait.
    pub contended: u64,
    /// Total nanoseconds spent waiting for the lock.
    pub wait_ns: u64,
}

impl LockStats {
    /// Field-wise difference, for measuring an interval.
    pub fn since(&self, earlier: &LockStats) -> LockStats {
        LockStats {
            acquisitions: self.acquisitions.saturating_sub(earlier.acquisitions),
            contended: self.contended.saturating_sub(earlier.contended),
            wait_ns: self.wait_ns.saturating_sub(earlier.wait_ns),
        }
    }
}

impl LockSite {
    fn new(name: &'static str) -> Self {
        LockSite {
            name,
            shards: (0..shard_count())
                .map(|_| CachePadded::new(LockShard::default()))
                .collect(),
        }
    }

    /// The name this site is reported under.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The totals over all shards.
    pub fn get(&self) -> LockStats {
        let mut t = LockStats::default();
        for s in self.shards.iter() {
            t.acquisitions += s.acquisitions.load(Ordering::Relaxed);
            t.contended += s.contended.load(Ordering::Relaxed);
            t.wait_ns += s.wait_ns.load(Ordering::Relaxed);
        }
        t
    }
}

/// A mutex that reports to a [`LockSite`].
///
/// It is the standard library's mutex, which on Linux is a futex word:
/// it spins briefly, then sleeps in the kernel, and never allocates, not
/// even the first time a thread waits.  That matters because the pager
/// takes these locks inside its SIGBUS handler, which may interrupt a
/// thread in the middle of `malloc` (`parking_lot`, which it replaced,
/// allocates per-thread parking state on a thread's first wait).  A
/// panic while holding one does not poison it for everyone else: the
/// data it protects is kept consistent at every step by its users, as
/// with a kernel spinlock.
pub struct StatMutex<T> {
    lock: Mutex<T>,
    site: Arc<LockSite>,
}

impl<T> StatMutex<T> {
    /// A mutex holding `value`, reporting to `site`.
    pub fn new(value: T, site: Arc<LockSite>) -> Self {
        StatMutex {
            lock: Mutex::new(value),
            site,
        }
    }

    /// Take the lock, counting the acquisition and any wait.
    #[inline]
    pub fn lock(&self) -> MutexGuard<'_, T> {
        let shard = &self.site.shards[shard_index(self.site.shards.len())];
        if let Some(g) = self.try_lock_uncounted() {
            shard.acquisitions.fetch_add(1, Ordering::Relaxed);
            return g;
        }
        let start = Instant::now();
        let g = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        let waited = start.elapsed().as_nanos() as u64;
        shard.acquisitions.fetch_add(1, Ordering::Relaxed);
        shard.contended.fetch_add(1, Ordering::Relaxed);
        shard.wait_ns.fetch_add(waited, Ordering::Relaxed);
        g
    }

    #[inline]
    fn try_lock_uncounted(&self) -> Option<MutexGuard<'_, T>> {
        match self.lock.try_lock() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// Take the lock only if it is free; counts an acquisition on success.
    #[inline]
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        let g = self.try_lock_uncounted()?;
        self.site.shards[shard_index(self.site.shards.len())]
            .acquisitions
            .fetch_add(1, Ordering::Relaxed);
        Some(g)
    }

    /// Access without locking through exclusive ownership.
    pub fn get_mut(&mut self) -> &mut T {
        self.lock.get_mut().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The counters and lock sites of one uswap instance, by name.
///
/// Modules ask for their sites and counters once, at construction, and keep
/// the `Arc`s; the registry's own lock is never taken on a hot path.
#[derive(Default)]
pub struct Registry {
    inner: Mutex<RegistryInner>,
}

#[derive(Default)]
struct RegistryInner {
    counters: BTreeMap<&'static str, Arc<Counter>>,
    gauges: BTreeMap<&'static str, Arc<Gauge>>,
    locks: BTreeMap<&'static str, Arc<LockSite>>,
}

/// A point-in-time copy of a registry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Snapshot {
    /// Operation counters by name.
    pub counters: BTreeMap<&'static str, u64>,
    /// Levels by name (memory of a compressed store, pages it holds).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub gauges: BTreeMap<&'static str, u64>,
    /// Lock statistics by site.
    pub locks: BTreeMap<&'static str, LockStats>,
}

impl Snapshot {
    /// Counter `name`, or 0 when no such counter exists.
    pub fn counter(&self, name: &str) -> u64 {
        self.counters.get(name).copied().unwrap_or(0)
    }

    /// Gauge `name`, or 0 when no such gauge exists.
    pub fn gauge(&self, name: &str) -> u64 {
        self.gauges.get(name).copied().unwrap_or(0)
    }

    /// Lock site `name`, or zeros when no such site exists.
    pub fn lock(&self, name: &str) -> LockStats {
        self.locks.get(name).copied().unwrap_or_default()
    }

    /// Total nanoseconds waited on all lock sites.
    pub fn total_wait_ns(&self) -> u64 {
        self.locks.values().map(|l| l.wait_ns).sum()
    }

    /// The events between `earlier` and `self` (gauges: their levels now).
    pub fn since(&self, earlier: &Snapshot) -> Snapshot {
        Snapshot {
            counters: self
                .counters
                .iter()
                .map(|(k, v)| (*k, v.saturating_sub(earlier.counter(k))))
                .collect(),
            gauges: self.gauges.clone(),
            locks: self
                .locks
                .iter()
                .map(|(k, v)| (*k, v.since(&earlier.lock(k))))
                .collect(),
        }
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Arc<Self> {
        Arc::new(Registry::default())
    }

    /// The counter called `name`, created on first use.
    pub fn counter(&self, name: &'static str) -> Arc<Counter> {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        g.counters
            .entry(name)
            .or_insert_with(|| Arc::new(Counter::new(name)))
            .clone()
    }

    /// The gauge called `name`, created on first use; devices that ask for
    /// one name share it, so it reports their sum.
    pub fn gauge(&self, name: &'static str) -> Arc<Gauge> {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        g.gauges
            .entry(name)
            .or_insert_with(|| {
                Arc::new(Gauge {
                    name,
                    value: AtomicI64::new(0),
                })
            })
            .clone()
    }

    /// The lock site called `name`, created on first use.
    pub fn lock_site(&self, name: &'static str) -> Arc<LockSite> {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        g.locks
            .entry(name)
            .or_insert_with(|| Arc::new(LockSite::new(name)))
            .clone()
    }

    /// Copy every counter and lock site.
    pub fn snapshot(&self) -> Snapshot {
        let g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        Snapshot {
            counters: g.counters.iter().map(|(k, c)| (*k, c.get())).collect(),
            gauges: g.gauges.iter().map(|(k, c)| (*k, c.get())).collect(),
            locks: g.locks.iter().map(|(k, l)| (*k, l.get())).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;
    use std::time::Duration;

    #[test]
    fn counters_sum_over_threads() {
        let reg = Registry::new();
        let c = reg.counter("ops");
        thread::scope(|s| {
            for _ in 0..8 {
                let c = c.clone();
                s.spawn(move || {
                    for _ in 0..10_000 {
                        c.inc();
                    }
                });
            }
        });
        assert_eq!(reg.snapshot().counter("ops"), 80_000);
        // The same name yields the same counter.
        reg.counter("ops").add(5);
        assert_eq!(c.get(), 80_005);
    }

    #[test]
    fn lock_counts_acquisitions_and_contention() {
        let reg = Registry::new();
        let m = Arc::new(StatMutex::new(0u64, reg.lock_site("site")));
        {
            let _g = m.lock();
            let m2 = m.clone();
            let h = thread::spawn(move || {
                *m2.lock() += 1;
            });
            // Hold the lock long enough that the other thread must wait.
            thread::sleep(Duration::from_millis(50));
            drop(_g);
            h.join().unwrap();
        }
        let s = reg.snapshot().lock("site");
        assert_eq!(s.acquisitions, 2);
        assert_eq!(s.contended, 1);
        assert!(s.wait_ns >= 10_000_000, "waited only {} ns", s.wait_ns);
        assert_eq!(*m.lock(), 1);
        assert!(m.try_lock().is_some());
        assert_eq!(reg.snapshot().lock("site").acquisitions, 4);
    }

    #[test]
    fn snapshot_difference() {
        let reg = Registry::new();
        let c = reg.counter("a");
        c.add(3);
        let before = reg.snapshot();
        c.add(4);
        let d = reg.snapshot().since(&before);
        assert_eq!(d.counter("a"), 4);
        assert_eq!(d.counter("missing"), 0);
    }
}
