//! The pager: regions of memory whose pages are swapped out and in
//! transparently, under a memory budget (userfaultfd).
//!
//! ```no_run
//! use uswap::pager::{DeviceSpec, Swap};
//!
//! let swap = Swap::builder()
//!     .budget(64 << 20)                          // 64 MiB resident at most
//!     .device(DeviceSpec::ram(256 << 20))        // 256 MiB of RAM-backed swap
//!     .build()?;
//! let mut region = swap.map(128 << 20)?;         // twice the budget
//! region.as_mut_slice().fill(7);                 // pages go out and come back
//! assert!(region.as_slice().iter().all(|&b| b == 7));
//! println!("{:?}", swap.stats().counters);
//! # Ok::<(), uswap::pager::PagerError>(())
//! ```
//!
//! How it works (see docs/DESIGN.md): each region is an anonymous mapping
//! registered with one userfaultfd for missing and write-protect faults.
//! A fault on a page never touched installs a zeroed page; on an evicted
//! page it reads the page from its slot; either way the page is installed
//! write-protected, so the first write faults once and marks it dirty.  A
//! reclaimer (a background thread, and the faulting thread itself when the
//! budget is exhausted) takes victims from the LRU and moves them out with
//! `UFFDIO_MOVE` into a staging frame, then drops clean pages that have a
//! slot without IO and writes dirty ones to a freshly allocated slot.
//!
//! Faults are served either by the faulting thread itself in a SIGBUS
//! handler ([`FaultMode::Sigbus`], the default: no cross-thread wake-up) or
//! by handler threads ([`FaultMode::HandlerThread`], which also serves
//! faults raised inside the kernel, such as `read(2)` into a region; in
//! SIGBUS mode those fail with `EFAULT`).
//!
//! Regions are `MADV_DONTFORK`: a child process does not inherit them,
//! and in a forked child a `Swap` and its regions are inert: dropping them
//! touches nothing of the parent's, and `map` refuses.
//!
//! # Locks
//!
//! Besides the core's locks (docs/DESIGN.md: slot cache, device, cluster,
//! avail list, swap-cache trunk, LRU batch, LRU), the pager has these,
//! each a leaf: nothing else is taken while one is held.
//!
//! - `page_ids`: the free page-id ranges; `map` and `Region::drop` only.
//! - `staged_ring`: the ring of staged pages, oldest first (reclaim.rs).
//! - `staging_frames`, `bounce_frames`, `unit_in`, `unit_out`: the free
//!   lists of the frame and unit pools.
//!
//! Page claims (`page.rs`) come before all of them: a thread may take any
//! lock while it holds a claim, and never waits for a claim while it holds
//! a lock.  A thread waits for a claim only with nothing held (a fault, a
//! region being unmapped); the reclaimer only ever tries to claim.  So no
//! wait closes a cycle.  What the SIGBUS handler may take, and why that is
//! safe, is in `signals.rs`.

mod fault;
mod frames;
mod page;
mod reclaim;
mod report;
mod signals;
mod unit;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;

use crate::swap_space::SwapEntry;
use crate::table::{self, TableError};

use crate::io::{FileOptions, IoDevice, IoError};
use crate::lru::{Lru, LruBatch, LruConfig, LruError};
use crate::stats::{Counter, Registry, Snapshot, StatMutex};
use crate::swap_cache::{SwapCache, DEFAULT_TRUNK_SLOTS};
use crate::swap_space::{DeviceConfig, SwapError, SwapSpace, Switches};
use crate::uffd::{Features, RegisterMode, Uffd, UffdError};
use crate::PAGE_SIZE;
use frames::{FramePool, Mapping};

pub use fault::FaultMode;

/// Most regions mapped at once in one process (all instances together).
pub const MAX_REGIONS: usize = 256;

/// What can go wrong building a swap instance or mapping a region.
#[derive(Debug, thiserror::Error)]
pub enum PagerError {
    /// userfaultfd is unavailable or lacks a feature.
    #[error(transparent)]
    Uffd(#[from] UffdError),
    /// A swap device could not be set up.
    #[error(transparent)]
    Io(#[from] IoError),
    /// The swap space configuration was refused.
    #[error(transparent)]
    Swap(#[from] SwapError),
    /// The LRU configuration was refused.
    #[error(transparent)]
    Lru(#[from] LruError),
    /// Mapping memory failed.
    #[error("mapping {bytes} bytes failed: {source}")]
    Mmap { bytes: usize, source: std::io::Error },
    /// A configuration value out of range.
    #[error("invalid swap configuration: {0}")]
    Config(String),
    /// No more regions can be mapped.
    #[error("too many regions: {MAX_REGIONS} are mapped already; unmap some or map fewer, larger ones")]
    TooManyRegions,
    /// The instance's page table is full.
    #[error("cannot map {pages} more pages: this instance manages at most {max} pages ({free} free); raise `max_mapped`")]
    TooManyPages { pages: usize, max: usize, free: usize },
    /// The page tables of the instance could not be allocated.
    #[error(transparent)]
    Metadata(#[from] TableError),
    /// `map` was called in a forked child.
    #[error("this Swap belongs to process {owner}, and this is its forked child {pid}: a child inherits neither the regions nor the userfaultfd; build a new Swap in the child")]
    Forked { owner: i32, pid: i32 },
    /// `map` was called, in SIGBUS mode, on a thread that blocks SIGBUS.
    #[error("this thread blocks SIGBUS: in SIGBUS fault mode its first touch of swapped memory would kill the process; unblock SIGBUS here (pthread_sigmask), or build the Swap with FaultMode::HandlerThread")]
    SigbusBlocked,
}

/// A swap device of an instance.
#[derive(Clone, Debug)]
pub enum DeviceSpec {
    /// RAM: like the ram disks of the seeds' tests.
    Ram { bytes: u64, priority: i32 },
    /// A file or block device (`O_DIRECT` by default).
    File { options: FileOptions, priority: i32 },
}

impl DeviceSpec {
    /// A RAM device of `bytes` (whole pages), priority 0.
    pub fn ram(bytes: u64) -> Self {
        DeviceSpec::Ram { bytes, priority: 0 }
    }

    /// A file device, priority 0.
    pub fn file(options: FileOptions) -> Self {
        DeviceSpec::File { options, priority: 0 }
    }

    /// Set the priority (higher is used first).
    pub fn priority(self, p: i32) -> Self {
        match self {
            DeviceSpec::Ram { bytes, .. } => DeviceSpec::Ram { bytes, priority: p },
            DeviceSpec::File { options, .. } => DeviceSpec::File { options, priority: p },
        }
    }
}

/// Builds a [`Swap`] instance.
#[derive(Clone, Debug)]
pub struct SwapBuilder {
    budget: u64,
    devices: Vec<DeviceSpec>,
    mode: FaultMode,
    handler_threads: usize,
    max_mapped: Option<u64>,
    staging_frames: u32,
    switches: Switches,
    lru_batch: LruBatch,
    background: bool,
}

impl SwapBuilder {
    /// The memory budget in bytes: resident pages of all regions stay
    /// under it (default 256 MiB).
    pub fn budget(mut self, bytes: u64) -> Self {
        self.budget = bytes;
        self
    }

    /// Add a swap device.
    pub fn device(mut self, d: DeviceSpec) -> Self {
        self.devices.push(d);
        self
    }

    /// How faults are served (default: SIGBUS in the faulting thread).
    pub fn fault_mode(mut self, m: FaultMode) -> Self {
        self.mode = m;
        self
    }

    /// Handler threads in [`FaultMode::HandlerThread`] (default 1).
    pub fn handler_threads(mut self, n: usize) -> Self {
        self.handler_threads = n;
        self
    }

    /// The most bytes all regions of this instance may span at once
    /// (default: the swap space plus the budget).
    pub fn max_mapped(mut self, bytes: u64) -> Self {
        self.max_mapped = Some(bytes);
        self
    }

    /// Staging frames: pages soft-evicted and not yet written back, a
    /// touch of which costs no IO (default 256, 1 MiB; half of them are
    /// kept staged before writeback starts).
    pub fn staging_frames(mut self, n: u32) -> Self {
        self.staging_frames = n;
        self
    }

    /// The seed switches of the swap space.
    pub fn switches(mut self, s: Switches) -> Self {
        self.switches = s;
        self
    }

    /// How LRU adds and activations reach the LRU lock (seed 002; default
    /// per-CPU batches of 31, [`LruBatch::Unbatched`] restores the lock per
    /// page of before the seed).
    pub fn lru_batch(mut self, b: LruBatch) -> Self {
        self.lru_batch = b;
        self
    }

    /// Run the background reclaimer (default on).  Off, only faulting
    /// threads reclaim, when the budget is exhausted.
    pub fn background_reclaim(mut self, on: bool) -> Self {
        self.background = on;
        self
    }

    /// Check the configuration and start the instance.
    pub fn build(self) -> Result<Swap, PagerError> {
        let page = PAGE_SIZE as u64;
        if self.devices.is_empty() {
            return Err(PagerError::Config(
                "no swap device: add one with `.device(DeviceSpec::ram(bytes))` or a file".into(),
            ));
        }
        if self.budget < 64 * page {
            return Err(PagerError::Config(format!(
                "a budget of {} bytes is too small: give at least {} bytes (64 pages)",
                self.budget,
                64 * page
            )));
        }
        if !(16..=1 << 20).contains(&self.staging_frames) {
            return Err(PagerError::Config(format!(
                "staging_frames must be 16..=1048576, got {}",
                self.staging_frames
            )));
        }
        if self.mode == FaultMode::HandlerThread && !(1..=64).contains(&self.handler_threads) {
            return Err(PagerError::Config(format!(
                "handler_threads must be 1..=64, got {}",
                self.handler_threads
            )));
        }
        let registry = Registry::new();
        let mut features = Features::MOVE
            .with(Features::PAGEFAULT_FLAG_WP)
            .with(Features::POISON);
        if self.mode == FaultMode::Sigbus {
            features = features.with(Features::SIGBUS);
        }
        let uffd = Uffd::open(features, self.mode == FaultMode::HandlerThread)?;

        let mut devices = Vec::new();
        let mut space = SwapSpace::builder().switches(self.switches);
        for d in &self.devices {
            let (dev, prio) = match d {
                DeviceSpec::Ram { bytes, priority } => (IoDevice::ram(bytes / page, &registry)?, *priority),
                DeviceSpec::File { options, priority } => (IoDevice::file(options, &registry)?, *priority),
            };
            space = space.device(DeviceConfig::new(dev.slots()).priority(prio));
            devices.push(dev);
        }
        let space = space.build(&registry)?;
        let budget = (self.budget / page) as usize;
        let max_pages = self
            .max_mapped
            .map_or(space.total_slots() as usize + budget, |b| (b / page) as usize);
        let max_pages = u32::try_from(max_pages)
            .map_err(|_| PagerError::Config(format!("max_mapped of {max_pages} pages exceeds 2^32 pages")))?;
        let lru = Lru::new(LruConfig::new(max_pages).batch(self.lru_batch), &registry)?;
        let staging = FramePool::new(self.staging_frames, &registry, "staging_frames").map_err(|source| {
            PagerError::Mmap {
                bytes: self.staging_frames as usize * PAGE_SIZE,
                source,
            }
        })?;
        let bounce = FramePool::new(self.staging_frames, &registry, "bounce_frames").map_err(|source| {
            PagerError::Mmap {
                bytes: self.staging_frames as usize * PAGE_SIZE,
                source,
            }
        })?;
        // Bounce frames are read into and copied from: populate them now,
        // not on the fault path.
        for f in 0..self.staging_frames {
            // SAFETY: nobody holds any frame yet.
            unsafe { bounce.bytes(f) }.fill(0);
        }
        let zero = Mapping::new(PAGE_SIZE, PAGE_SIZE).map_err(|source| PagerError::Mmap {
            bytes: PAGE_SIZE,
            source,
        })?;
        // SAFETY: a fresh private page of our own; reading it populates it.
        unsafe { std::ptr::write_volatile(zero.addr() as *mut u8, 0) };
        // MOVE needs its destination registered with the same descriptor.
        uffd.register(
            staging.mapping().addr(),
            staging.mapping().len() as u64,
            RegisterMode {
                missing: true,
                wp: false,
            },
        )?;

        let device_slots: Vec<u64> = devices.iter().map(|d| d.slots()).collect();
        let swap_cache =
            SwapCache::new(&device_slots, DEFAULT_TRUNK_SLOTS, &registry).map_err(|e| match e {
                crate::swap_cache::SwapCacheError::Table(t) => PagerError::Metadata(t),
                e => PagerError::Config(e.to_string()),
            })?;
        let unit_pool = |site| {
            unit::UnitPool::new(4, &registry, site).map_err(|source| PagerError::Mmap {
                bytes: 4 * unit::UNIT_BYTES,
                source,
            })
        };
        let unit_in = unit_pool("unit_in")?;
        let unit_out = unit_pool("unit_out")?;
        uffd.register(
            unit_out.mapping().addr(),
            unit_out.mapping().len() as u64,
            RegisterMode {
                missing: true,
                wp: false,
            },
        )?;
        let inner = Arc::new(Inner {
            counters: Counters::new(&registry),
            uffd,
            mode: self.mode,
            space,
            devices,
            lru,
            // Zeroed (NEVER, no address) and committed as ids are used.
            states: table::zeroed(max_pages as usize, "page states")?,
            addrs: table::zeroed(max_pages as usize, "page addresses")?,
            // SAFETY: getpid has no preconditions.
            pid: unsafe { libc::getpid() },
            ids: StatMutex::new(vec![(0, max_pages)], registry.lock_site("page_ids")),
            staged: StatMutex::new(
                reclaim::StagedRing::new(2 * self.staging_frames as usize),
                registry.lock_site("staged_ring"),
            ),
            nr_staged: AtomicUsize::new(0),
            staging_target: self.staging_frames as usize / 2,
            swap_cache,
            staging,
            bounce,
            unit_in,
            unit_out,
            zero,
            budget,
            low: budget - (budget / 16).max(32).min(budget / 2),
            resident: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            users: AtomicUsize::new(1),
            writeback: Backoff::default(),
            reports: Reports::default(),
            #[cfg(test)]
            inject: Inject::default(),
            registry,
        });
        let mut threads = Vec::new();
        if self.mode == FaultMode::HandlerThread {
            for _ in 0..self.handler_threads {
                threads.push(fault::spawn_handler(Arc::downgrade(&inner)));
            }
        } else {
            signals::install();
        }
        if self.background {
            threads.push(reclaim::spawn_reclaimer(
                Arc::downgrade(&inner),
                self.mode == FaultMode::Sigbus,
            ));
        }
        Ok(Swap { inner, threads })
    }
}

struct Counters {
    faults: Arc<Counter>,
    zero_fills: Arc<Counter>,
    swapins: Arc<Counter>,
    huge_swapins: Arc<Counter>,
    huge_swapouts: Arc<Counter>,
    huge_fallbacks: Arc<Counter>,
    move_fallbacks: Arc<Counter>,
    staged: Arc<Counter>,
    swapcache_hits: Arc<Counter>,
    wp_faults: Arc<Counter>,
    evictions: Arc<Counter>,
    evict_clean: Arc<Counter>,
    evict_write: Arc<Counter>,
    evict_zero: Arc<Counter>,
    install_retries: Arc<Counter>,
    overrun: Arc<Counter>,
    swap_full: Arc<Counter>,
    write_errors: Arc<Counter>,
    read_errors: Arc<Counter>,
    direct_reclaim: Arc<Counter>,
    busy_waits: Arc<Counter>,
    unevictable: Arc<Counter>,
    discarded: Arc<Counter>,
    swapout_retries: Arc<Counter>,
    swapin_retries: Arc<Counter>,
}

impl Counters {
    fn new(r: &Registry) -> Self {
        Counters {
            faults: r.counter("faults"),
            zero_fills: r.counter("zero_fills"),
            swapins: r.counter("swapins"),
            huge_swapins: r.counter("huge_swapins"),
            huge_swapouts: r.counter("huge_swapouts"),
            huge_fallbacks: r.counter("huge_fallbacks"),
            move_fallbacks: r.counter("move_fallbacks"),
            staged: r.counter("staged"),
            swapcache_hits: r.counter("swapcache_hits"),
            wp_faults: r.counter("wp_faults"),
            evictions: r.counter("evictions"),
            evict_clean: r.counter("evict_clean"),
            evict_write: r.counter("evict_write"),
            evict_zero: r.counter("evict_zero"),
            install_retries: r.counter("install_retries"),
            overrun: r.counter("budget_overrun"),
            swap_full: r.counter("swap_full"),
            write_errors: r.counter("swapout_errors"),
            read_errors: r.counter("swapin_errors"),
            direct_reclaim: r.counter("direct_reclaim"),
            busy_waits: r.counter("busy_waits"),
            unevictable: r.counter("unevictable"),
            discarded: r.counter("discarded"),
            swapout_retries: r.counter("swapout_retries"),
            swapin_retries: r.counter("swapin_retries"),
        }
    }
}

/// The shared state of one instance.  Regions and handler threads refer
/// to it; it lives while the `Swap` handle or any region does.
pub(crate) struct Inner {
    uffd: Uffd,
    mode: FaultMode,
    space: SwapSpace,
    devices: Vec<IoDevice>,
    lru: Lru,
    /// Per page id: the page state word (see page.rs).
    states: Box<[AtomicU64]>,
    /// Per page id: the page's address, 0 when no region holds the id.
    addrs: Box<[AtomicU64]>,
    /// Free page-id ranges (start, len); capacity never grows past the
    /// number of regions, and it is only touched by map and unmap.
    ids: StatMutex<Vec<(u32, u32)>>,
    staging: FramePool,
    /// Staged pages oldest first (see reclaim.rs).
    staged: StatMutex<reclaim::StagedRing>,
    /// Pages staged now; counted in `resident` too.
    nr_staged: AtomicUsize,
    /// Staged pages kept in memory before writeback starts: half the
    /// staging frames.
    staging_target: usize,
    /// Slot -> staging frame of each staged page.
    swap_cache: SwapCache,
    bounce: FramePool,
    /// 2 MB staging units: populated and moved into regions (unregistered)
    /// and receiving units moved out (registered).  See unit.rs.
    unit_in: unit::UnitPool,
    unit_out: unit::UnitPool,
    zero: Mapping,
    budget: usize,
    low: usize,
    resident: AtomicUsize,
    /// Set when the last handle (the `Swap` or a region) goes: the threads
    /// stop.  A thread's own reference cannot tell, as several threads
    /// holding one each would keep each other alive forever.
    shutdown: AtomicBool,
    /// Handles alive: the `Swap` and every region.
    users: AtomicUsize,
    /// The process that built the instance.  In a forked child (another
    /// pid) the inherited descriptor still speaks for the parent's memory,
    /// so nothing may be done with it.
    pid: libc::pid_t,
    /// Writeback's pause after transient write errors (reclaim.rs).
    writeback: Backoff,
    /// Which once-only lines have been said.
    reports: Reports,
    /// Test hooks: failures to inject into the userfaultfd calls.
    #[cfg(test)]
    inject: Inject,
    counters: Counters,
    registry: Arc<Registry>,
}

/// Writeback's pause after transient write errors.
#[derive(Default)]
struct Backoff {
    /// No writes before this `CLOCK_MONOTONIC` nanosecond (0: none).
    hold_until: AtomicU64,
    /// The current pause; 0 while writes work.
    backoff_ns: AtomicU64,
}

/// One-line reports said once per instance.
#[derive(Default)]
struct Reports {
    pinned: AtomicBool,
    locked: AtomicBool,
    refused: AtomicBool,
    install_retry: AtomicBool,
    bad_slot: AtomicBool,
    not_ours: AtomicBool,
}

/// Which way `UFFDIO_MOVE` moves a page: out of a region into our staging
/// memory, or back in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dir {
    Out,
    In,
}

/// Test hooks: the next `n` userfaultfd calls of a kind fail, after doing
/// part of their work for real, as the kernel fails them.
#[cfg(test)]
#[derive(Default)]
pub(crate) struct Inject {
    /// Moves out of regions: count, pages moved before failing, errno.
    move_out: (AtomicUsize, AtomicUsize, std::sync::atomic::AtomicI32),
    /// Moves into regions.
    move_in: (AtomicUsize, AtomicUsize, std::sync::atomic::AtomicI32),
    /// The copies that finish a move in that failed.
    copy_in: (AtomicUsize, std::sync::atomic::AtomicI32),
    /// 1: the next install stops, claim held, at 2 until this is 0.
    gate: std::sync::atomic::AtomicU32,
}

#[cfg(test)]
impl Inject {
    /// Take one injected failure of `(count, partial pages, errno)`.
    fn take_move(f: &(AtomicUsize, AtomicUsize, std::sync::atomic::AtomicI32)) -> Option<(u64, i32)> {
        f.0.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .ok()
            .map(|_| {
                (
                    f.1.load(Ordering::Relaxed) as u64 * PAGE_SIZE as u64,
                    f.2.load(Ordering::Relaxed),
                )
            })
    }

    /// The install gate: spin here, claim held, while a test looks on.
    fn gate(&self) {
        if self
            .gate
            .compare_exchange(1, 2, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            while self.gate.load(Ordering::Acquire) != 0 {
                std::hint::spin_loop();
            }
        }
    }
}

/// A swap instance: a memory budget, swap devices, and the regions mapped
/// through it.
pub struct Swap {
    inner: Arc<Inner>,
    threads: Vec<JoinHandle<()>>,
}

impl Swap {
    /// Start configuring an instance.
    pub fn builder() -> SwapBuilder {
        SwapBuilder {
            budget: 256 << 20,
            devices: Vec::new(),
            mode: FaultMode::Sigbus,
            handler_threads: 1,
            max_mapped: None,
            staging_frames: 256,
            switches: Switches::DEFAULT,
            lru_batch: LruBatch::default(),
            background: true,
        }
    }

    /// Map a region of `len` bytes (rounded up to pages), zero-filled, whose
    /// pages are swapped as needed.
    pub fn map(&self, len: usize) -> Result<Region, PagerError> {
        self.map_with(len, false)
    }

    /// Map a region of `len` bytes (rounded up to 2 MB) paged in and out in
    /// 2 MB units (seed 003): one whole cluster, one 2 MB IO and one
    /// `UFFDIO_MOVE` per unit, a transparent huge page where the kernel can
    /// give one.  When no cluster is wholly free a unit goes out as 512
    /// single pages (counted as `huge_fallbacks`).
    pub fn map_huge(&self, len: usize) -> Result<Region, PagerError> {
        self.map_with(len.div_ceil(unit::UNIT_BYTES) * unit::UNIT_BYTES, true)
    }

    fn map_with(&self, len: usize, huge: bool) -> Result<Region, PagerError> {
        let inner = &self.inner;
        if !inner.same_process() {
            return Err(PagerError::Forked {
                owner: inner.pid,
                // SAFETY: getpid has no preconditions.
                pid: unsafe { libc::getpid() },
            });
        }
        if len == 0 {
            return Err(PagerError::Config("cannot map an empty region".into()));
        }
        if huge && inner.budget < 2 * unit::UNIT_PAGES {
            // One unit being filled and one to evict: with less, a unit
            // would be evicted while it is being written, again and again.
            return Err(PagerError::Config(format!(
                "a budget of {} bytes is too small for 2 MB units: map_huge needs at least two units ({} bytes) of budget (one more for each further thread filling units at once keeps faults from overrunning it); raise the budget or use map",
                inner.budget * PAGE_SIZE,
                2 * unit::UNIT_BYTES
            )));
        }
        if inner.mode == FaultMode::Sigbus {
            if signals::sigbus_blocked_here() {
                return Err(PagerError::SigbusBlocked);
            }
            // A SIGBUS handler installed since the last look goes behind
            // ours before the region can fault.
            signals::watch(false);
        }
        let pages = len.div_ceil(PAGE_SIZE);
        // The page-id lock is one a program's signal handler could want
        // (through a fault's reclaim, no; but through a nested map, yes).
        let _blocked = signals::SignalsBlocked::asynchronous();
        let id_base = {
            let mut ids = inner.ids.lock();
            let free: usize = ids.iter().map(|r| r.1 as usize).sum();
            let Some(i) = ids.iter().position(|r| r.1 as usize >= pages) else {
                return Err(PagerError::TooManyPages {
                    pages,
                    max: inner.states.len(),
                    free,
                });
            };
            let start = ids[i].0;
            ids[i].0 += pages as u32;
            ids[i].1 -= pages as u32;
            if ids[i].1 == 0 {
                ids.remove(i);
            }
            start
        };
        let align = if huge { unit::UNIT_BYTES } else { PAGE_SIZE };
        let map = match Mapping::new(pages * PAGE_SIZE, align) {
            Ok(m) => m,
            Err(source) => {
                inner.free_ids(id_base, pages as u32);
                return Err(PagerError::Mmap {
                    bytes: pages * PAGE_SIZE,
                    source,
                });
            }
        };
        if huge {
            map.advise_huge();
        }
        for i in 0..pages {
            let head = huge && i % unit::UNIT_PAGES == 0;
            inner.states[id_base as usize + i].store(
                if head {
                    page::NEVER | page::UNIT
                } else {
                    page::NEVER
                },
                Ordering::Relaxed,
            );
            inner.addrs[id_base as usize + i].store(map.addr() + (i * PAGE_SIZE) as u64, Ordering::Relaxed);
        }
        if let Err(e) = inner.uffd.register(
            map.addr(),
            map.len() as u64,
            RegisterMode {
                missing: true,
                wp: true,
            },
        ) {
            inner.free_ids(id_base, pages as u32);
            return Err(e.into());
        }
        let Some(slot) =
            fault::publish_region(map.addr(), map.len() as u64, id_base, Arc::as_ptr(inner), huge)
        else {
            // The mapping is unmapped as `map` drops, registration and all.
            inner.free_ids(id_base, pages as u32);
            return Err(PagerError::TooManyRegions);
        };
        inner.users.fetch_add(1, Ordering::Relaxed);
        Ok(Region {
            inner: inner.clone(),
            map,
            id_base,
            pages,
            slot,
        })
    }

    /// The instance's counters and lock statistics.
    pub fn stats(&self) -> Snapshot {
        self.inner.registry.snapshot()
    }

    /// How this instance serves faults.
    pub fn fault_mode(&self) -> FaultMode {
        self.inner.mode
    }

    /// Pages resident now, over all regions.
    pub fn resident_pages(&self) -> usize {
        self.inner.resident.load(Ordering::Relaxed)
    }

    /// The budget in pages.
    pub fn budget_pages(&self) -> usize {
        self.inner.budget
    }

    /// Free slots over all swap devices.
    pub fn free_slots(&self) -> u64 {
        self.inner.space.nr_free()
    }

    /// Usable slots over all swap devices.
    pub fn total_slots(&self) -> u64 {
        self.inner.space.total_slots()
    }

    /// The swap space, for its statistics and invariant checks.
    pub fn swap_space(&self) -> &SwapSpace {
        &self.inner.space
    }

    /// Inject a one-shot IO error at slot `offset` of device `device` (for
    /// testing the error paths).
    #[doc(hidden)]
    pub fn inject_io_error(&self, device: usize, offset: u64, op: crate::io::IoOp) {
        self.inner.devices[device].inject_error(offset, op);
    }

    /// Make every IO of `op` on device `device` fail with `errno` for
    /// `duration` (for testing the error paths).
    #[doc(hidden)]
    pub fn inject_io_errors(
        &self,
        device: usize,
        op: crate::io::IoOp,
        errno: i32,
        duration: std::time::Duration,
    ) {
        self.inner.devices[device].inject_errors_for(op, errno, duration);
    }
}

impl Drop for Swap {
    fn drop(&mut self) {
        if !self.inner.same_process() {
            // A forked child: the threads are the parent's (a child has
            // only the thread that forked), and so is everything else.
            std::mem::forget(std::mem::take(&mut self.threads));
            return;
        }
        // While regions live the threads keep serving them (they hold only
        // weak references, upgraded per pass); the last region stops them.
        if self.inner.release_user() {
            for t in self.threads.drain(..) {
                // A thread that panicked has said why on stderr already;
                // the instance is going away either way.
                let _ = t.join();
            }
        }
    }
}

impl Inner {
    fn free_ids(&self, start: u32, len: u32) {
        let mut ids = self.ids.lock();
        ids.push((start, len));
        ids.sort_unstable();
        // Merge neighbours.
        let mut i = 0;
        while i + 1 < ids.len() {
            if ids[i].0 + ids[i].1 == ids[i + 1].0 {
                ids[i].1 += ids[i + 1].1;
                ids.remove(i + 1);
            } else {
                i += 1;
            }
        }
    }

    /// Pages staged now.
    fn staged_count(&self) -> usize {
        self.nr_staged.load(Ordering::Relaxed)
    }

    /// Discard staging frames (their contents are on swap or were clean)
    /// and return them to the pool: one `process_madvise` for the batch,
    /// so one TLB flush instead of one per frame.
    fn discard_frames(&self, frames: &[u32]) {
        if frames.is_empty() {
            return;
        }
        self.staging.discard_batch(frames);
        for &f in frames {
            self.staging.put(f);
        }
    }

    /// Move `len` bytes of pages from region memory at `src` into our
    /// staging memory at `dst`: all of them, or `Err((moved, why))` with
    /// the prefix that did move.
    fn move_out(&self, dst: u64, src: u64, len: u64) -> Result<(), (u64, UffdError)> {
        self.move_all(Dir::Out, dst, src, len)
    }

    /// Put `len` bytes of pages from our memory at `src` back into a region
    /// at `dst` (missing there): moved, and what will not move copied.
    /// `Ok(true)` when some were copied (their source still holds them and
    /// must be discarded before it is reused); `Err((done, why))` when
    /// neither worked past `done` bytes.
    fn move_in(&self, dst: u64, src: u64, len: u64) -> Result<bool, (u64, UffdError)> {
        let Err((moved, _)) = self.move_all(Dir::In, dst, src, len) else {
            return Ok(false);
        };
        let mut at = moved;
        #[cfg(test)]
        if self
            .inject
            .copy_in
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
        {
            let errno = self.inject.copy_in.1.load(Ordering::Relaxed);
            return Err((
                at,
                UffdError::Ioctl {
                    op: "UFFDIO_COPY",
                    errno,
                },
            ));
        }
        while at < len {
            match self.copy(dst + at, (src + at) as *const u8, len - at, false) {
                Ok(()) => break,
                // A page is there already: it cannot be, under the claim,
                // but if it were, what is there stays.
                Err((n, e)) if e.errno() == Some(libc::EEXIST) => at += n + PAGE_SIZE as u64,
                Err((n, e)) => return Err((at + n, e)),
            }
        }
        Ok(true)
    }

    /// `UFFDIO_MOVE` of `len` bytes, to the end: a partial move (the
    /// kernel's `EAGAIN` with a count) is continued, and the error of the
    /// page that stopped it comes back with how far it got.
    // `dir` picks the injected failure, in tests only.
    #[cfg_attr(not(test), allow(unused_variables))]
    fn move_all(&self, dir: Dir, dst: u64, src: u64, len: u64) -> Result<(), (u64, UffdError)> {
        let mut done = 0;
        #[cfg(test)]
        {
            let f = match dir {
                Dir::Out => &self.inject.move_out,
                Dir::In => &self.inject.move_in,
            };
            if let Some((partial, errno)) = Inject::take_move(f) {
                let partial = partial.min(len);
                if partial > 0 {
                    self.move_all_real(dst, src, partial)?;
                }
                return Err((
                    partial,
                    UffdError::Ioctl {
                        op: "UFFDIO_MOVE",
                        errno,
                    },
                ));
            }
        }
        while done < len {
            match self
                .uffd
                .move_pages(dst + done, src + done, len - done, true, false)
            {
                Ok(n) if n > 0 => done += n,
                Ok(_) => {
                    return Err((
                        done,
                        UffdError::Ioctl {
                            op: "UFFDIO_MOVE",
                            errno: libc::EAGAIN,
                        },
                    ))
                }
                Err(e) => return Err((done, e)),
            }
        }
        Ok(())
    }

    #[cfg(test)]
    fn move_all_real(&self, dst: u64, src: u64, len: u64) -> Result<(), (u64, UffdError)> {
        let mut done = 0;
        while done < len {
            match self
                .uffd
                .move_pages(dst + done, src + done, len - done, true, false)
            {
                Ok(n) if n > 0 => done += n,
                Ok(_) => unreachable!("a move that moved nothing succeeded"),
                Err(e) => return Err((done, e)),
            }
        }
        Ok(())
    }

    /// `UFFDIO_COPY` of `len` bytes into a region (missing there), to the
    /// end, write-protected when `wp`; wakes the threads waiting there.
    /// On failure, how far it got and why.
    fn copy(&self, dst: u64, src: *const u8, len: u64, wp: bool) -> Result<(), (u64, UffdError)> {
        let mut done = 0;
        while done < len {
            match self
                .uffd
                .copy(dst + done, src.wrapping_add(done as usize), len - done, wp, true)
            {
                Ok(n) if n > 0 => done += n,
                Ok(_) => {
                    let e = UffdError::Ioctl {
                        op: "UFFDIO_COPY",
                        errno: libc::EAGAIN,
                    };
                    return Err((done, e));
                }
                Err(e) => return Err((done, e)),
            }
        }
        Ok(())
    }

    /// Install a page of zeros at `page` (missing there).
    fn copy_zero(&self, page: u64, wp: bool) -> Result<(), UffdError> {
        self.copy(page, self.zero.addr() as *const u8, PAGE_SIZE as u64, wp)
            .map_err(|(_, e)| e)
    }

    /// Whether an install into a region failed because the program
    /// unmapped the destination (`ENOENT` from a copy: no registered
    /// mapping there any more).
    fn region_gone(e: &UffdError) -> bool {
        e.errno() == Some(libc::ENOENT)
    }

    /// Free slot `e`.  Every slot the pager frees is one it allocated and
    /// holds one reference to, so a refusal is a bookkeeping bug.
    fn free_slot(&self, e: SwapEntry) {
        let freed = self.space.free(e);
        debug_assert!(freed.is_ok(), "freeing {e:?}: {freed:?}");
    }

    /// Free the whole cluster of a 2 MB unit, as `free_slot` does a slot.
    fn free_huge(&self, e: SwapEntry) {
        let freed = self.space.free_huge(e);
        debug_assert!(freed.is_ok(), "freeing unit {e:?}: {freed:?}");
    }

    /// The staging frame a staged page's slot `e` holds (claimed by the
    /// caller, so the entry is there).
    fn staged_frame(&self, e: SwapEntry) -> u32 {
        let h = self
            .swap_cache
            .lookup(e)
            .expect("a staged page is in the swap cache");
        (h.get() - 1) as u32
    }

    /// `UFFDIO_MOVE` refused to move the page at `addr` out: count it, and
    /// say once per reason why such pages stay resident.
    fn unevictable(&self, addr: u64, errno: Option<i32>) {
        self.counters.unevictable.inc();
        match errno {
            Some(libc::EBUSY) => report::once(
                &self.reports.pinned,
                format_args!("uswap: the page at {addr:#x} cannot be evicted: it is pinned (O_DIRECT IO, io_uring fixed buffers, RDMA) or shared (KSM); pages like it stay resident while they are, counted as unevictable"),
            ),
            Some(libc::EINVAL) => report::once(
                &self.reports.locked,
                format_args!("uswap: the page at {addr:#x} cannot be evicted: the program locked it (mlock) or changed its protection (mprotect); pages like it stay resident, counted as unevictable"),
            ),
            e => report::once(
                &self.reports.refused,
                format_args!("uswap: the page at {addr:#x} cannot be evicted: UFFDIO_MOVE failed with errno {}; pages like it stay resident, counted as unevictable", e.unwrap_or(0)),
            ),
        }
    }

    /// Whether this is the process that built the instance (false in a
    /// forked child).
    fn same_process(&self) -> bool {
        // SAFETY: getpid has no preconditions.
        self.pid == unsafe { libc::getpid() }
    }

    /// A handle went away; true when it was the last, and the threads are
    /// told to stop.
    fn release_user(&self) -> bool {
        if self.users.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.shutdown.store(true, Ordering::Release);
            return true;
        }
        false
    }

    fn upgrade(w: &Weak<Inner>) -> Option<Arc<Inner>> {
        let a = w.upgrade()?;
        (!a.shutdown.load(Ordering::Relaxed)).then_some(a)
    }
}

/// A region of swapped memory.  Dropping it unmaps it and frees its slots.
pub struct Region {
    inner: Arc<Inner>,
    map: Mapping,
    id_base: u32,
    pages: usize,
    slot: usize,
}

impl Region {
    /// The first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.addr() as *mut u8
    }

    /// Length in bytes (whole pages).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Always false: regions are never empty.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The region as bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping lives as long as `self`; every byte is
        // readable (missing pages fault in); shared access only reads.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len()) }
    }

    /// The region as mutable bytes.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.as_ptr(), self.len()) }
    }
}

impl Region {
    /// The slot page `index` of this region is on, when it has one (for
    /// tests of the error paths).
    #[doc(hidden)]
    pub fn slot_of(&self, index: usize) -> Option<crate::swap_space::SwapEntry> {
        page::slot(self.inner.states[self.id_base as usize + index].load(Ordering::Acquire))
    }

    /// Whether page `index` is resident.
    pub fn is_resident(&self, index: usize) -> bool {
        page::kind(self.inner.states[self.id_base as usize + index].load(Ordering::Acquire)) == page::RESIDENT
    }

    /// Whether page `index` is soft-evicted: in the swap cache, not yet
    /// written back (a touch costs no IO).
    pub fn is_staged(&self, index: usize) -> bool {
        page::kind(self.inner.states[self.id_base as usize + index].load(Ordering::Acquire)) == page::STAGED
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        let inner = &self.inner;
        if !inner.same_process() {
            // A forked child: the page states, slots and registration are
            // the parent's (the inherited descriptor acts on the parent's
            // memory), and the mapping was not inherited.  Leave it all.
            return;
        }
        // The LRU, slot and frame locks taken below are ones a program's
        // signal handler could want too, through a fault.
        let _blocked = signals::SignalsBlocked::asynchronous();
        fault::unpublish_region(self.slot);
        // Take every page out of circulation, waiting out transitions in
        // flight (a reclaimer may be writing one of them out).
        let mut resident = 0;
        // Pages leave the LRU a batch at a time, one lock acquisition per
        // batch (`release_pages`).  A dead page still on the LRU meanwhile
        // is harmless: reclaim skips what is not resident.
        let mut gone = [0u32; 64];
        let mut ngone = 0;
        for i in 0..self.pages {
            let id = self.id_base as usize + i;
            let claim = page::PageClaim::wait_claim(&inner.states[id], || inner.counters.busy_waits.inc());
            let w = claim.found();
            claim.commit(page::DEAD);
            gone[ngone] = id as u32;
            ngone += 1;
            if ngone == gone.len() {
                inner.lru.remove_batch(&gone);
                ngone = 0;
            }
            if w & page::UNIT != 0 {
                match page::kind(w) {
                    page::RESIDENT => resident += unit::UNIT_PAGES,
                    page::SWAPPED => unit::free_slots(inner, id as u32, w),
                    _ => {}
                }
                inner.addrs[id].store(0, Ordering::Relaxed);
                continue;
            }
            match page::kind(w) {
                page::RESIDENT => resident += 1,
                page::STAGED => {
                    resident += 1;
                    inner.nr_staged.fetch_sub(1, Ordering::Relaxed);
                    reclaim::drop_staged(inner, w);
                }
                _ => {}
            }
            if let Some(e) = page::slot(w) {
                inner.free_slot(e);
            }
            inner.addrs[id].store(0, Ordering::Relaxed);
        }
        inner.lru.remove_batch(&gone[..ngone]);
        inner.resident.fetch_sub(resident, Ordering::Relaxed);
        if !self.still_mapped_here() {
            // The program unmapped (part of) the region and something else
            // sits in its range now: that is not ours to unmap.
            report::once(
                &inner.reports.not_ours,
                format_args!(
                    "uswap: the region at {:#x} was unmapped or replaced by the program before it was dropped; uswap leaves that address range alone",
                    self.map.addr()
                ),
            );
            self.map.forget();
        }
        inner.free_ids(self.id_base, self.pages as u32);
        inner.release_user();
        // The mapping itself is unmapped, registration and all, when
        // `self.map` drops.
    }
}

impl Region {
    /// Whether everything mapped in this region's range is still this
    /// region: no other region overlaps it, and every mapping in it is
    /// registered for write-protect faults (a mapping the program put
    /// there is not).  Write-protecting the range asks exactly that of
    /// the kernel, and is harmless to pages about to be unmapped.
    fn still_mapped_here(&self) -> bool {
        let (addr, len) = (self.map.addr(), self.map.len() as u64);
        if fault::overlaps_a_region(addr, len) {
            return false;
        }
        self.inner.uffd.writeprotect(addr, len, true, false).is_ok()
    }
}

// SAFETY: a Region is plain memory plus an Arc; concurrent access to the
// bytes is governed by the borrows `as_slice`/`as_mut_slice` hand out.
unsafe impl Send for Region {}
// SAFETY: as above; `&Region` only reads.
unsafe impl Sync for Region {}

#[cfg(test)]
mod tests;
