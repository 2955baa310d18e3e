//! Statistics: operation counters and lock profiles, cheap enough to leave on.
//!
//! The seeds argue from `perf lock` profiles ("`get_swap_pages` 21.03% ->
//! gone"), so every lock in uswap is a [`StatMutex`] (or, for the cluster
//! locks, an entry of a `table::LockTable`, committed as it is used) that
//! reports, per lock *site* (all cluster locks share the site `cluster`,
//! all swap-cache trunks the site `swap_cache_trunk`), how often it was
//! taken, how often the taker found it held, and how long it waited.
//!
//! Cost: an uncontended acquisition adds one relaxed increment to a counter
//! shard owned (in practice) by the calling thread, so counters never bounce
//! a cache line between CPUs.  The clock is read only when the lock was
//! found held, where the wait dwarfs it.
//!
//! Every statistic is declared once, in `table.rs`, and read by field
//! ([`Stats`], with the other values a reader gets, in `snapshot.rs`):
//! `stats.counters.faults`, never by a string.  They live in
//! one block of memory per instance (`block.rs`): CPU-major shards of
//! counters and lock sites, and a head of gauges, pressure and events;
//! published, it is a file in the user's directory (`live.rs`) that
//! `uswap stat` and `uswap top` map and read while the program runs,
//! taking no lock the pager takes.
//!
//! Shards are by CPU rather than by thread because counters are bumped
//! in the SIGBUS handler, which touches no thread-local storage: a
//! library preloaded into a program (`uswap run`) reaches it through the
//! thread's DTV, which glibc allocates with the program's `calloc`, in
//! paged memory.  As many as the machine has CPUs (a power of two): every
//! process of a tree under `uswap run` has a block, and at 64 shards it
//! would take a part of its budget from its first instant, on two CPUs.

mod block;
pub mod live;
mod mapped;
mod pressure;
mod snapshot;
mod table;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};
use std::time::Instant;

use block::Block;
pub use block::{Identity, Label};
pub use mapped::{HoldRequest, MappedBlock};
pub use snapshot::{
    DeviceLevel, Event, Events, Latency, Pressure, PressureLine, Stats, EVENT_RING, LATENCY_BUCKETS,
};
pub use table::{Counters, EventKind, Gauges, LockStats, Locks, Unit};
// What the pager counts with, and the bench reads a registry by: not a
// user's (the typed `Stats` is).
#[doc(hidden)]
pub use table::{CounterId, GaugeId, LockId};

/// A monotonically increasing event count: a word in each CPU's shard of
/// the instance's block.
#[doc(hidden)]
pub struct Counter {
    block: Arc<Block>,
    id: CounterId,
}

impl Counter {
    /// The name this counter is reported under.
    pub fn name(&self) -> &'static str {
        Counters::TABLE[self.id.0 as usize].0
    }

    /// Add `n` events.
    #[inline]
    pub fn add(&self, n: u64) {
        self.block.count(self.id.0, n);
    }

    /// Add one event.
    #[inline]
    pub fn inc(&self) {
        self.add(1);
    }

    /// The sum over all shards.  Concurrent increments may or may not be
    /// included; a quiescent read is exact.
    pub fn get(&self) -> u64 {
        self.block.counter_total(self.id.0)
    }
}

/// A level that goes up and down (bytes in a store, pages held), with
/// the highest it reached.  One word of the block's head: levels change
/// per page stored, not per fault, and a reader wants one exact value.
#[doc(hidden)]
pub struct Gauge {
    block: Arc<Block>,
    id: GaugeId,
}

impl Gauge {
    /// The name this gauge is reported under.
    pub fn name(&self) -> &'static str {
        Gauges::TABLE[self.id.0 as usize].0
    }

    /// Move the level by `delta`.
    #[inline]
    pub fn add(&self, delta: i64) {
        self.block.gauge(self.id.0).fetch_add(delta, Ordering::Relaxed);
    }

    /// Set the level.
    pub fn set(&self, v: u64) {
        self.block.gauge(self.id.0).store(v as i64, Ordering::Relaxed);
    }

    /// Raise the level to `v` if it is below (a peak).
    #[inline]
    pub fn raise_to(&self, v: u64) {
        self.block.gauge(self.id.0).fetch_max(v as i64, Ordering::Relaxed);
    }

    /// The level (0 if updates racing a read left it below zero).
    pub fn get(&self) -> u64 {
        self.block.gauge(self.id.0).load(Ordering::Relaxed).max(0) as u64
    }
}

/// The statistics of one lock site: every lock of one kind (all cluster
/// locks, all LRU locks of an instance) reports into the same site.
#[doc(hidden)]
pub struct LockSite {
    block: Arc<Block>,
    id: LockId,
}

impl LockSite {
    /// One acquisition of a lock of this site, and how long its taker
    /// waited when it had to (a lock other than a [`StatMutex`]:
    /// `table::LockTable`'s).
    #[inline]
    pub(crate) fn acquired(&self, waited_ns: Option<u64>) {
        self.block.lock_acquired(self.id.0, waited_ns);
    }

    /// The name this site is reported under.
    pub fn name(&self) -> &'static str {
        Locks::TABLE[self.id.0 as usize].0
    }

    /// The totals over all shards.
    pub fn get(&self) -> LockStats {
        self.block.lock_total(self.id.0)
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
#[doc(hidden)]
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
        if let Some(g) = self.try_lock_uncounted() {
            self.site.block.lock_acquired(self.site.id.0, None);
            return g;
        }
        let start = Instant::now();
        let g = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        let waited = start.elapsed().as_nanos() as u64;
        self.site.block.lock_acquired(self.site.id.0, Some(waited));
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
        self.site.block.lock_acquired(self.site.id.0, None);
        Some(g)
    }

    /// Access without locking through exclusive ownership.
    pub fn get_mut(&mut self) -> &mut T {
        self.lock.get_mut().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The statistics of one uswap instance: its block (`block.rs`), and the
/// handles its modules count through.
///
/// Modules ask for their counters, gauges and lock sites once, at
/// construction, by typed id, and keep the handles; nothing here is
/// looked up by name, on any path.
#[doc(hidden)]
pub struct Registry {
    block: Arc<Block>,
}

impl Registry {
    /// A registry whose block is anonymous memory: read in this process
    /// only.  Panics if the kernel refuses a mapping of a few KiB (the
    /// pager uses [`Registry::try_new`] and says so instead).
    pub fn new() -> Arc<Self> {
        Self::try_new().expect("mapping a statistics block")
    }

    /// A registry whose block is a file in `dir` (mode 0600), read by
    /// `uswap stat` from other processes of this user.
    pub fn published(dir: &std::path::Path, label: &Label) -> std::io::Result<Arc<Self>> {
        Ok(Arc::new(Registry {
            block: Arc::new(Block::published(dir, label)?),
        }))
    }

    /// A registry in anonymous memory, or an error for a failed mapping.
    pub fn try_new() -> std::io::Result<Arc<Self>> {
        Ok(Arc::new(Registry {
            block: Arc::new(Block::anonymous()?),
        }))
    }

    /// The counter `id`.
    pub fn counter(&self, id: CounterId) -> Arc<Counter> {
        Arc::new(Counter {
            block: self.block.clone(),
            id,
        })
    }

    /// The gauge `id`; devices that ask for one share it, so it reports
    /// their sum.
    pub fn gauge(&self, id: GaugeId) -> Arc<Gauge> {
        Arc::new(Gauge {
            block: self.block.clone(),
            id,
        })
    }

    /// The lock site `id`.
    pub fn lock_site(&self, id: LockId) -> Arc<LockSite> {
        Arc::new(LockSite {
            block: self.block.clone(),
            id,
        })
    }

    /// The pid of a reader (`uswap gdb`) asking for the memory to be
    /// held in, 0 for none.
    pub fn hold_asked(&self) -> i32 {
        self.block.hold_asked()
    }

    /// Say the memory is in and held for reader `pid` (0: let go).
    pub fn set_held_for(&self, pid: i32) {
        self.block.set_held_for(pid);
    }

    /// Everything, read now.
    pub fn snapshot(&self) -> Stats {
        self.block
            .snapshot(CounterId::STALL_SOME_NS.0, CounterId::STALL_FULL_NS.0)
    }

    /// A fault served in `ns`: counted in its latency band.
    #[inline]
    pub fn fault_latency(&self, ns: u64) {
        self.block.latency(ns);
    }

    /// Thread `tid` of the process begins to wait in uswap (a fault of
    /// its being served).  Async-signal-safe.
    #[inline]
    pub fn stall_begin(&self, tid: i32) {
        let threads = self
            .block
            .gauge(GaugeId::THREADS.0)
            .load(Ordering::Relaxed)
            .max(1) as u64;
        self.block.stall_begin(tid, threads);
    }

    /// The threads that waited in uswap in the last 2 s (told apart by
    /// their thread ids in 64 buckets: a shared bucket counts once), at
    /// least 1: the threads "full" pressure asks to be stalled at once.
    pub fn active_threads(&self) -> u64 {
        self.block.active_threads(2_000_000).max(1)
    }

    /// The wait `stall_begin` began is over.
    #[inline]
    pub fn stall_end(&self) {
        self.block
            .stall_end(CounterId::STALL_SOME_NS.0, CounterId::STALL_FULL_NS.0);
    }

    /// Nanoseconds this instance's threads have waited in uswap ("some").
    pub fn stall_some_ns(&self) -> u64 {
        self.block.counter_total(CounterId::STALL_SOME_NS.0)
    }

    /// Move the pressure averages on (every 2 s at most; the background
    /// reclaimer calls it every pass).
    pub fn update_pressure(&self) {
        self.block
            .update_pressure(CounterId::STALL_SOME_NS.0, CounterId::STALL_FULL_NS.0);
    }

    /// Set swap device `i`'s levels (kind 1 ram, 2 file, 3 compressed).
    pub fn device_level(&self, i: usize, kind: u64, slots: u64, used: u64) {
        self.block.device(i, kind, slots, used);
    }

    /// Note an event.  Async-signal-safe.
    pub fn event(&self, kind: EventKind, value: u64) {
        self.block.event(kind, value);
    }

    /// Say who the instance is: its tree and its fault mode.
    pub fn label(&self, label: &Label) {
        self.block.label(label);
    }

    /// The file the block is published as, if it is.
    pub fn published_path(&self) -> Option<std::path::PathBuf> {
        self.block.path()
    }

    /// Remove the published file (the process is leaving).
    pub fn unpublish(&self) {
        self.block.unpublish();
    }

    /// In a forked child: a block of its own (see `Block::reopen_here`).
    pub(crate) fn reopen_here(&self) {
        self.block.reopen_here();
    }
}

#[cfg(test)]
mod tests;
