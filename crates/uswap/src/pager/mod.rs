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
//! Regions are `MADV_DONTFORK`: a child process does not inherit them.

mod fault;
mod frames;
mod page;
mod reclaim;
mod unit;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;

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
        let swap_cache = SwapCache::new(&device_slots, DEFAULT_TRUNK_SLOTS, &registry)
            .map_err(|e| PagerError::Config(e.to_string()))?;
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
            states: (0..max_pages).map(|_| AtomicU64::new(page::NEVER)).collect(),
            addrs: (0..max_pages).map(|_| AtomicU64::new(0)).collect(),
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
            inject_move_busy: AtomicUsize::new(0),
            registry,
        });
        let mut threads = Vec::new();
        if self.mode == FaultMode::HandlerThread {
            for _ in 0..self.handler_threads {
                threads.push(fault::spawn_handler(Arc::downgrade(&inner)));
            }
        } else {
            fault::install_sigbus_handler();
        }
        if self.background {
            threads.push(reclaim::spawn_reclaimer(Arc::downgrade(&inner)));
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
    /// Test hook: this many coming evictions find `UFFDIO_MOVE` refusing
    /// with `EBUSY`, as for a pinned page.
    inject_move_busy: AtomicUsize,
    counters: Counters,
    registry: Arc<Registry>,
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
        if len == 0 {
            return Err(PagerError::Config("cannot map an empty region".into()));
        }
        let pages = len.div_ceil(PAGE_SIZE);
        let inner = &self.inner;
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
            let _ = inner.uffd.unregister(map.addr(), map.len() as u64);
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

    /// Make the next `n` evictions find `UFFDIO_MOVE` refusing with `EBUSY`
    /// (as for a pinned page), to test the copy fallback.
    #[doc(hidden)]
    pub fn inject_move_busy(&self, n: usize) {
        self.inner.inject_move_busy.store(n, Ordering::Relaxed);
    }

    /// Inject a one-shot IO error at slot `offset` of device `device` (for
    /// testing the error paths).
    #[doc(hidden)]
    pub fn inject_io_error(&self, device: usize, offset: u64, op: crate::io::IoOp) {
        self.inner.devices[device].inject_error(offset, op);
    }
}

impl Drop for Swap {
    fn drop(&mut self) {
        // While regions live the threads keep serving them (they hold only
        // weak references, upgraded per pass); the last region stops them.
        if self.inner.release_user() {
            for t in self.threads.drain(..) {
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

    /// Move a page out of a region (`dst` a staging frame), or the
    /// injected `EBUSY` of the test hook.
    fn move_out(&self, dst: u64, src: u64) -> Result<u64, UffdError> {
        if self.inject_move_busy.load(Ordering::Relaxed) > 0
            && self
                .inject_move_busy
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok()
        {
            return Err(UffdError::Ioctl {
                op: "UFFDIO_MOVE",
                errno: libc::EBUSY,
            });
        }
        self.uffd.move_pages(dst, src, PAGE_SIZE as u64, false, false)
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
        fault::unpublish_region(self.slot);
        // Take every page out of circulation, waiting out transitions in
        // flight (a reclaimer may be writing one of them out).
        let mut resident = 0;
        let mut slots = 0;
        // Pages leave the LRU a batch at a time, one lock acquisition per
        // batch (`release_pages`).  A dead page still on the LRU meanwhile
        // is harmless: reclaim skips what is not resident.
        let mut gone = [0u32; 64];
        let mut ngone = 0;
        for i in 0..self.pages {
            let id = self.id_base as usize + i;
            let st = &inner.states[id];
            let w = loop {
                let w = st.load(Ordering::Acquire);
                if w & page::BUSY != 0 {
                    std::thread::yield_now();
                    continue;
                }
                if st
                    .compare_exchange(w, page::DEAD, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    break w;
                }
            };
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
                let _ = inner.space.free(e);
                slots += 1;
            }
            inner.addrs[id].store(0, Ordering::Relaxed);
        }
        inner.lru.remove_batch(&gone[..ngone]);
        let _ = slots;
        inner.resident.fetch_sub(resident, Ordering::Relaxed);
        let _ = inner.uffd.unregister(self.map.addr(), self.map.len() as u64);
        inner.free_ids(self.id_base, self.pages as u32);
        inner.release_user();
        // The mapping itself is unmapped when `self.map` drops.
    }
}

// SAFETY: a Region is plain memory plus an Arc; concurrent access to the
// bytes is governed by the borrows `as_slice`/`as_mut_slice` hand out.
unsafe impl Send for Region {}
// SAFETY: as above; `&Region` only reads.
unsafe impl Sync for Region {}

#[cfg(test)]
mod tests;
