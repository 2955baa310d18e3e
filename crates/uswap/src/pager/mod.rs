//! The pager: regions of memory whose pages are swapped out and in
//! transparently, under a memory budget (userfaultfd).
//!
//! ```no_run
//! use uswap::pager::{SwapDeviceSpec, Swap};
//!
//! let swap = Swap::builder()
//!     .budget(64 << 20)                          // 64 MiB resident at most
//!     .device(SwapDeviceSpec::ram(256 << 20))        // 256 MiB of RAM-backed swap
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
//! A child made by `fork(3)` inherits its parent's regions as they were,
//! swapped-out pages included, and its own copy of the instance, which it
//! adopts (fork.rs): a new userfaultfd, threads of its own, the slots it
//! shares with its parent counted as the kernel counts them.  In a child
//! made otherwise (a raw `clone`) a `Swap` and its regions are inert:
//! dropping them touches nothing of the parent's, and `map` refuses.
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
//! safe, is in `entry.rs`.

// The pager's files, from the top down; each calls only those below it.
mod addrs; // page id -> address, a word per chunk of ids
mod entry; // region table, SIGBUS handler, handler and reclaimer threads
mod evict; // small pages out in batches: clean drops, runs of moves
mod fault; // fault service, pages and 2 MB units
mod folio; // the unit of work: slots and IO of a run of 1 to 512 pages
mod fork; // fork without exec: the fork handlers, adoption in the child
mod frames; // frame and unit pools
mod gate; // the fork gate: no work in flight when a fork copies memory
mod held; // swap-file slots held for forked children
mod instance; // the shared state, in parts, and page operations
mod overrun; // the budget's bound: how far past it, then the OOM kill
mod page; // page states, claims
mod reclaim; // reclaim passes, per-page and 2 MB unit eviction
mod report; // one-line reports
mod signals; // signal masks, uswap's threads
mod writeback; // staged pages to their slots, in runs, through io_uring

pub use signals::starting_a_thread;

/// For a library that interposes `sigaction` on a program (`uswap run`):
/// `sigaction(SIGBUS, new, old)` as the program sees it while uswap's
/// SIGBUS handler is in front.  `old` receives the program's disposition
/// and `new` becomes it; uswap's handler stays installed and passes every
/// SIGBUS that is not a uswap fault on to it.  Installing the program's
/// handler in the kernel instead would send uswap's own faults to it
/// until the watchdog put uswap's back.  False, with nothing done, when
/// uswap's handler is not installed (no instance in SIGBUS mode): the
/// call is then the kernel's to make.
pub fn program_sigbus_action(new: Option<&libc::sigaction>, old: Option<&mut libc::sigaction>) -> bool {
    entry::program_sigbus_action(new, old)
}

/// Whether uswap's SIGBUS handler serves faults in this process (an
/// instance in SIGBUS mode was built): only then must SIGBUS never be
/// blocked in a program's thread.
pub fn serving_sigbus() -> bool {
    signals::serving_sigbus()
}

use crate::stats::LockId;
pub use signals::{program_sigmask, NEVER_BLOCKED};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::io::{CompressedOptions, FileOptions, IoDevice, IoError};
use crate::lru::{Lru, LruBatch, LruConfig, LruError};
use crate::stats::{Registry, StatMutex, Stats};
use crate::swap_cache::SwapCache;
use crate::swap_space::{SlotDeviceConfig, SwapError, SwapSpace, Switches};
use crate::table::{self, TableError};
use crate::uffd::{Features, Reach, RegisterMode, Uffd, UffdError};
use crate::PAGE_SIZE;
use frames::{FramePool, Mapping, UnitPool};
#[cfg(test)]
use instance::Inject;
use instance::{Backing, Backoff, Budget, Counters, Frames, Inner, Reports, StagedRing};

pub use entry::{FaultMode, MAX_REGIONS};
pub use overrun::{Overrun, OverrunError};

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
    /// A range that is not whole pages of the region (whole 2 MB units of
    /// a `map_huge` region).
    #[error("bytes {offset}..{} are not whole pages of this {len}-byte region; pass a page-aligned range inside it (2 MB units in a map_huge region)", .offset.saturating_add(*.bytes))]
    Range { offset: usize, bytes: usize, len: usize },
    /// `map` was called, in SIGBUS mode, on a thread that blocks SIGBUS.
    #[error("this thread blocks SIGBUS: in SIGBUS fault mode its first touch of swapped memory would kill the process; unblock SIGBUS here (pthread_sigmask), or build the Swap with FaultMode::HandlerThread")]
    SigbusBlocked,
}

/// A swap device of an instance; parsed from a swap spec string
/// (`"zram:1G:lz4,file:/var/tmp/t.swap:8G"`, see [`crate::spec`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SwapDeviceSpec {
    /// RAM: like the ram disks of the seeds' tests.
    Ram { bytes: u64, priority: i32 },
    /// A file or block device (`O_DIRECT` by default).
    File { options: FileOptions, priority: i32 },
    /// Compressed in memory (zram), maybe with a file behind (a tier).
    Compressed {
        options: CompressedOptions,
        priority: i32,
    },
}

impl SwapDeviceSpec {
    /// A RAM device of `bytes` (whole pages), priority 0.
    pub fn ram(bytes: u64) -> Self {
        SwapDeviceSpec::Ram { bytes, priority: 0 }
    }

    /// A file device, priority 0.
    pub fn file(options: FileOptions) -> Self {
        SwapDeviceSpec::File { options, priority: 0 }
    }

    /// A compressed device, priority 0.
    pub fn compressed(options: CompressedOptions) -> Self {
        SwapDeviceSpec::Compressed { options, priority: 0 }
    }

    /// The file the device writes to, if any (a file device, or the file
    /// behind a compressed device).
    pub fn file_options(&self) -> Option<&FileOptions> {
        match self {
            SwapDeviceSpec::Ram { .. } => None,
            SwapDeviceSpec::File { options, .. } => Some(options),
            SwapDeviceSpec::Compressed { options, .. } => options.file_of(),
        }
    }

    /// The same device with its file's options changed by `f`.
    pub fn map_file(self, f: impl FnOnce(FileOptions) -> FileOptions) -> Self {
        match self {
            SwapDeviceSpec::File { options, priority } => SwapDeviceSpec::File {
                options: f(options),
                priority,
            },
            SwapDeviceSpec::Compressed { options, priority } => match options.file_of().cloned() {
                Some(file) => SwapDeviceSpec::Compressed {
                    options: options.file(f(file)),
                    priority,
                },
                None => SwapDeviceSpec::Compressed { options, priority },
            },
            d => d,
        }
    }

    /// The swap space the device gives, in bytes: its slots' pages.
    pub fn bytes(&self) -> u64 {
        match self {
            SwapDeviceSpec::Ram { bytes, .. } => bytes / PAGE_SIZE as u64 * PAGE_SIZE as u64,
            SwapDeviceSpec::File { options, .. } => options.slots() * PAGE_SIZE as u64,
            SwapDeviceSpec::Compressed { options, .. } => options.slots() * PAGE_SIZE as u64,
        }
    }

    /// Set the priority (higher is used first).
    pub fn priority(self, p: i32) -> Self {
        match self {
            SwapDeviceSpec::Ram { bytes, .. } => SwapDeviceSpec::Ram { bytes, priority: p },
            SwapDeviceSpec::File { options, .. } => SwapDeviceSpec::File { options, priority: p },
            SwapDeviceSpec::Compressed { options, .. } => SwapDeviceSpec::Compressed { options, priority: p },
        }
    }
}

/// Builds a [`Swap`] instance.
#[derive(Clone, Debug)]
pub struct SwapBuilder {
    budget: u64,
    devices: Vec<SwapDeviceSpec>,
    mode: FaultMode,
    handler_threads: usize,
    max_mapped: Option<u64>,
    /// None: sized from the budget at build.
    staging_frames: Option<u32>,
    switches: Switches,
    lru_batch: LruBatch,
    background: bool,
    readahead: bool,
    per_page_evict: bool,
    overrun: Overrun,
    domain: Option<Arc<crate::domain::Member>>,
    /// Publish statistics for `uswap stat` (`publish`), and the tree's
    /// supervisor to name in them.
    publish: bool,
    group: i32,
}

impl SwapBuilder {
    /// The memory budget in bytes: resident pages of all regions stay
    /// under it (default 256 MiB).
    pub fn budget(mut self, bytes: u64) -> Self {
        self.budget = bytes;
        self
    }

    /// Add a swap device.
    pub fn device(mut self, d: SwapDeviceSpec) -> Self {
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
    /// (default: the swap space plus the budget), rounded up to pages as
    /// a region's length is.
    pub fn max_mapped(mut self, bytes: u64) -> Self {
        self.max_mapped = Some(bytes);
        self
    }

    /// Staging frames: pages soft-evicted and not yet written back, a
    /// touch of which costs no IO; half of them are kept staged before
    /// writeback starts, and the other half is what runs of dirty pages
    /// are moved into and written back from, several writes in flight.
    /// Default: a 128th of the budget, at least 256 (1 MiB) and at most
    /// 4096 (16 MiB): 1024 for a 512 MiB budget, where a swap file's
    /// sequential writeback ran 1.55x faster than with 256 (docs/
    /// PERFORMANCE.md).
    pub fn staging_frames(mut self, n: u32) -> Self {
        self.staging_frames = Some(n);
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

    /// Swap-in readahead (default on): a fault that reads a page back also
    /// reads the swapped-out pages after it, as many as a window that
    /// doubles (to 32) while faults come in order and halves when they do
    /// not (the kernel's `swap_vma_readahead`).  Off: one page per fault.
    pub fn readahead(mut self, on: bool) -> Self {
        self.readahead = on;
        self
    }

    /// Evict every small page with its own `UFFDIO_MOVE` (off by default),
    /// as uswap did before batched eviction: one TLB flush per page.  By
    /// default a batch of victims costs one flush for its clean pages
    /// (dropped in place with one `process_madvise`) and one per run of
    /// neighbouring dirty pages (moved with one `UFFDIO_MOVE`).  For
    /// measuring what batching gains.
    pub fn per_page_evict(mut self, on: bool) -> Self {
        self.per_page_evict = on;
        self
    }

    /// How far past the budget pages may stay resident when nothing can
    /// be evicted (swap full, pages pinned), before the process is killed
    /// as a memory cgroup's would be, with one line on stderr saying why
    /// (default [`Overrun::Percent`]`(10)`; at least a 2 MB unit and the
    /// faults' slack).  [`Overrun::Unbounded`]: never killed, the
    /// resident set grows as far as the machine allows.
    pub fn overrun(mut self, o: Overrun) -> Self {
        self.overrun = o;
        self
    }

    /// Share a budget with the other processes of a domain
    /// (`crate::domain`): the instance publishes what it holds, and its
    /// budget follows the share the domain's arbiter gives it.  The
    /// builder's budget is the instance's until the first share, and what
    /// its overrun is measured against.  A background reclaimer (the
    /// default) does the publishing; without one, the budget stays put.
    pub fn domain(mut self, member: crate::domain::Member) -> Self {
        self.domain = Some(Arc::new(member));
        self
    }

    /// Publish the instance's statistics while it runs, for `uswap stat`
    /// and `uswap top` (default off; `uswap run` and `uswap demo` turn it
    /// on): its statistics block becomes a file in this user's directory
    /// (`stats::live`), removed when the instance goes.  Publishing costs
    /// the pager nothing: the block is the memory it counts in anyway.
    /// Where the directory cannot be used the instance runs unpublished,
    /// saying why in one line.
    pub fn publish(mut self, on: bool) -> Self {
        self.publish = on;
        self
    }

    /// The process tree the instance's statistics are shown under: the pid
    /// of its supervisor (`uswap run`'s), 0 for none (the default).
    pub fn group(mut self, supervisor: i32) -> Self {
        self.group = supervisor;
        self
    }

    /// Check the configuration and start the instance.
    pub fn build(self) -> Result<Swap, PagerError> {
        let page = PAGE_SIZE as u64;
        if self.devices.is_empty() {
            return Err(PagerError::Config(
                "no swap device: add one with `.device(SwapDeviceSpec::ram(bytes))` or a file".into(),
            ));
        }
        if self.budget < 64 * page {
            return Err(PagerError::Config(format!(
                "a budget of {} bytes is too small: give at least {} bytes (64 pages)",
                self.budget,
                64 * page
            )));
        }
        let staging_frames = self
            .staging_frames
            .unwrap_or_else(|| ((self.budget / page / 128) as u32).clamp(256, 4096));
        if !(16..=1 << 20).contains(&staging_frames) {
            return Err(PagerError::Config(format!(
                "staging_frames must be 16..=1048576, got {staging_frames}"
            )));
        }
        if self.mode == FaultMode::HandlerThread && !(1..=64).contains(&self.handler_threads) {
            return Err(PagerError::Config(format!(
                "handler_threads must be 1..=64, got {}",
                self.handler_threads
            )));
        }
        let label = crate::stats::Label {
            group: self.group,
            mode: u64::from(self.mode != FaultMode::HandlerThread),
        };
        let registry = match self.publish.then(crate::stats::live::ensure_directory) {
            Some(Ok(dir)) => match Registry::published(&dir, &label) {
                Ok(r) => Some(r),
                Err(e) => {
                    report::line(format_args!(
                        "uswap: statistics not published ({}: {e}); the program runs as it would",
                        dir.display()
                    ));
                    None
                }
            },
            Some(Err(e)) => {
                report::line(format_args!(
                    "uswap: statistics not published: {e}; the program runs as it would"
                ));
                None
            }
            None => None,
        };
        let registry = match registry {
            Some(r) => r,
            None => Registry::try_new().map_err(|source| PagerError::Mmap {
                bytes: crate::PAGE_SIZE,
                source,
            })?,
        };
        let mut features = Features::MOVE
            .with(Features::PAGEFAULT_FLAG_WP)
            .with(Features::POISON);
        if self.mode == FaultMode::Sigbus {
            features = features.with(Features::SIGBUS);
        } else {
            // The faulting thread's id, so that a handler thread serves a
            // fault of a thread that is forking through the fork gate.
            features = features.with(Features::THREAD_ID);
        }
        // SIGBUS mode serves the faulting thread's own accesses only, so a
        // user-mode-only descriptor (any user may open one) is all it
        // needs; handler-thread mode serves the kernel's faults too.
        let uffd = match self.mode {
            FaultMode::Sigbus => Uffd::open_reaching(features, false, Reach::UserFaults)?,
            FaultMode::HandlerThread => Uffd::open(features, true)?,
        };

        let mut devices = Vec::new();
        let mut space = SwapSpace::builder().switches(self.switches);
        for d in &self.devices {
            let (dev, prio) = match d {
                SwapDeviceSpec::Ram { bytes, priority } => {
                    (IoDevice::ram(bytes / page, &registry)?, *priority)
                }
                SwapDeviceSpec::File { options, priority } => {
                    (IoDevice::file(options, &registry)?, *priority)
                }
                SwapDeviceSpec::Compressed { options, priority } => {
                    (IoDevice::compressed(options, &registry)?, *priority)
                }
            };
            space = space.device(SlotDeviceConfig::new(dev.slots()).priority(prio));
            devices.push(dev);
        }
        let space = space.build(&registry)?;
        let budget = (self.budget / page) as usize;
        let max_pages = self
            .max_mapped
            // A region of `b` bytes spans `b` rounded up to pages (`map`
            // rounds so): the limit rounds the same way.
            .map_or(space.total_slots() as usize + budget, |b| {
                b.div_ceil(page) as usize
            });
        if max_pages == 0 {
            return Err(PagerError::Config(format!(
                "max_mapped of {} bytes is less than a page: give at least {page} bytes, or leave it to its default (the swap space plus the budget)",
                self.max_mapped.unwrap_or(0)
            )));
        }
        let max_user = max_pages;
        // Whole chunks of ids (addrs.rs): each region leaves less than a
        // chunk unused at its end, so `max_mapped` pages in any number of
        // regions (at most one a page, and at most MAX_REGIONS) always find
        // ids.  The tables are committed as ids are used: the spare ones
        // cost address space only.
        let max_pages =
            max_pages.next_multiple_of(addrs::CHUNK) + addrs::CHUNK * max_pages.min(entry::MAX_REGIONS);
        let max_pages = u32::try_from(max_pages)
            .map_err(|_| PagerError::Config(format!("max_mapped of {max_pages} pages exceeds 2^32 pages")))?;
        let lru = Lru::new(LruConfig::new(max_pages).batch(self.lru_batch), &registry)?;
        let staging =
            FramePool::new(staging_frames, &registry, LockId::STAGING_FRAMES).map_err(|source| {
                PagerError::Mmap {
                    bytes: staging_frames as usize * PAGE_SIZE,
                    source,
                }
            })?;
        // Bounce frames: one per fault reading a page in, a run per
        // readahead (runs shrink to the frames free; a fault waits for
        // one).  Populated at start, so they are memory every process
        // pays for from its first instant, inside its budget: 256 (1 MiB)
        // is many more than faults in flight at once, and at the budgets
        // of a tree's small members (a shell, `sha256sum`, a compiler
        // pass) a quarter of their memory; one frame per 256 pages of the
        // budget, 64 (two full readahead runs) at the least.
        let bounce_frames = staging_frames.min(((self.budget / page / 256) as u32).clamp(64, 256));
        let bounce = FramePool::new(bounce_frames, &registry, LockId::BOUNCE_FRAMES).map_err(|source| {
            PagerError::Mmap {
                bytes: bounce_frames as usize * PAGE_SIZE,
                source,
            }
        })?;
        // Bounce frames are read into and copied from: populate them now,
        // not on the fault path.
        for f in 0..bounce_frames {
            // SAFETY: nobody holds any frame yet.
            unsafe { bounce.bytes(f) }.fill(0);
        }
        let zero_bytes = fault::READAHEAD_MAX as usize * PAGE_SIZE;
        let zero = Mapping::new(zero_bytes, PAGE_SIZE).map_err(|source| PagerError::Mmap {
            bytes: zero_bytes,
            source,
        })?;
        for at in (0..zero_bytes).step_by(PAGE_SIZE) {
            // SAFETY: fresh private pages of our own.  Reading maps each
            // to the kernel's one zero page: copies from them never fault,
            // and read one cache-hot page, not 32.
            unsafe { std::ptr::read_volatile((zero.addr() as usize + at) as *const u8) };
        }
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
            SwapCache::new(&device_slots, space.trunk_slots(), &registry).map_err(|e| match e {
                crate::swap_cache::SwapCacheError::Table(t) => PagerError::Metadata(t),
                e => PagerError::Config(e.to_string()),
            })?;
        let unit_pool = |site| {
            UnitPool::new(4, &registry, site).map_err(|source| PagerError::Mmap {
                bytes: 4 * page::UNIT_BYTES,
                source,
            })
        };
        let unit_in = unit_pool(LockId::UNIT_IN)?;
        let unit_out = unit_pool(LockId::UNIT_OUT)?;
        uffd.register(
            unit_out.mapping().addr(),
            unit_out.mapping().len() as u64,
            RegisterMode {
                missing: true,
                wp: false,
            },
        )?;
        let prefetch = self.readahead && devices.iter().any(|d| d.kind() == crate::io::BackendKind::File);
        let inner = Arc::new(Inner {
            counters: Counters::new(&registry),
            uffd,
            lru,
            // Zeroed (NEVER, no address) and committed as ids are used.
            states: table::zeroed(max_pages as usize, "page states")?,
            addrs: addrs::PageAddrs::new(max_pages as usize)?,
            pins: table::zeroed(max_pages as usize, "page pins")?,
            // SAFETY: getpid has no preconditions.
            pid: std::sync::atomic::AtomicI32::new(unsafe { libc::getpid() }),
            threads: StatMutex::new(Vec::new(), registry.lock_site(LockId::THREADS)),
            spawn: instance::Spawn {
                handlers: if self.mode == FaultMode::HandlerThread {
                    self.handler_threads
                } else {
                    0
                },
                reclaimer: self.background,
                watching: self.mode == FaultMode::Sigbus,
            },
            ids: StatMutex::new(
                instance::PageIds {
                    free: vec![(0, max_pages)],
                    mapped: 0,
                    max: max_user,
                    fresh: 0,
                },
                registry.lock_site(LockId::PAGE_IDS),
            ),
            frames: Frames {
                staging,
                bounce,
                unit_in,
                unit_out,
                zero,
            },
            budget: Budget::new(
                budget,
                if self.background { reclaim::SLACK } else { 0 },
                self.overrun,
                staging_frames as usize / 2,
            ),
            backing: Backing {
                space,
                devices,
                swap_cache,
                staged: StatMutex::new(
                    StagedRing::new(2 * staging_frames as usize),
                    registry.lock_site(LockId::STAGED_RING),
                ),
                writeback: Backoff::default(),
                hold: held::Hold::new(&device_slots, registry.lock_site(LockId::FORK_HOLD)),
                closed: AtomicBool::new(false),
                layerable: AtomicBool::new(false),
                layers_tried: AtomicBool::new(false),
            },
            readahead: self.readahead,
            per_page_evict: self.per_page_evict,
            discarder: crate::sys::Discarder::new(),
            prefetch: instance::Prefetch::new(prefetch),
            shutdown: AtomicBool::new(false),
            users: AtomicUsize::new(1),
            reports: Reports::default(),
            forked: AtomicBool::new(false),
            member: self.domain.clone(),
            #[cfg(test)]
            inject: Inject::default(),
            registry,
        });
        inner.counters.levels.budget.set(self.budget / page);
        inner.registry.label(&crate::stats::Label {
            group: self.group,
            mode: match (self.mode, inner.uffd.user_mode_only()) {
                (FaultMode::HandlerThread, _) => 0,
                (_, false) => 1,
                (_, true) => 2,
            },
        });
        if self.mode == FaultMode::Sigbus {
            entry::install();
        }
        entry::start_threads(&inner);
        fork::register(&inner);
        Ok(Swap {
            inner,
            mode: self.mode,
        })
    }
}

/// A swap instance: a memory budget, swap devices, and the regions mapped
/// through it.
pub struct Swap {
    inner: Arc<Inner>,
    mode: FaultMode,
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
            staging_frames: None,
            switches: Switches::DEFAULT,
            lru_batch: LruBatch::default(),
            background: true,
            readahead: true,
            per_page_evict: false,
            overrun: Overrun::default(),
            domain: None,
            publish: false,
            group: 0,
        }
    }

    /// Map a region of `len` bytes (rounded up to pages), zero-filled, whose
    /// pages are swapped as needed.
    pub fn map(&self, len: usize) -> Result<Region, PagerError> {
        self.map_with(len, false, None)
    }

    /// [`map`](Self::map) at exactly `addr` (page aligned), where nothing
    /// is mapped yet: a region whose place is known in advance (`uswap
    /// run` puts the heap where its system-call guard looks for it).  An
    /// address taken is an [`PagerError::Mmap`] with `EEXIST`.
    pub fn map_at(&self, addr: usize, len: usize) -> Result<Region, PagerError> {
        self.map_with(len, false, Some(addr as u64))
    }

    /// Map a region of `len` bytes (rounded up to 2 MB) paged in and out in
    /// 2 MB units (seed 003): one whole cluster, one 2 MB IO and one
    /// `UFFDIO_MOVE` per unit, a transparent huge page where the kernel can
    /// give one.  When no cluster is wholly free a unit goes out as 512
    /// single pages (counted as `huge_fallbacks`).
    pub fn map_huge(&self, len: usize) -> Result<Region, PagerError> {
        self.map_with(len.div_ceil(page::UNIT_BYTES) * page::UNIT_BYTES, true, None)
    }

    fn map_with(&self, len: usize, huge: bool, at: Option<u64>) -> Result<Region, PagerError> {
        let inner = &self.inner;
        if !inner.same_process() {
            return Err(PagerError::Forked {
                owner: inner.pid.load(Ordering::Relaxed),
                // SAFETY: getpid has no preconditions.
                pid: unsafe { libc::getpid() },
            });
        }
        if len == 0 {
            return Err(PagerError::Config("cannot map an empty region".into()));
        }
        let _inside = gate::enter(0);
        if huge && inner.budget.limit() < 2 * page::UNIT_PAGES {
            // One unit being filled and one to evict: with less, a unit
            // would be evicted while it is being written, again and again.
            return Err(PagerError::Config(format!(
                "a budget of {} bytes is too small for 2 MB units: map_huge needs at least two units ({} bytes) of budget (one more for each further thread filling units at once keeps faults from overrunning it); raise the budget or use map",
                inner.budget.limit() * PAGE_SIZE,
                2 * page::UNIT_BYTES
            )));
        }
        if self.mode == FaultMode::Sigbus {
            if signals::sigbus_blocked_here() {
                return Err(PagerError::SigbusBlocked);
            }
            // A SIGBUS handler installed since the last look goes behind
            // ours before the region can fault.
            entry::watch(false, &self.inner);
        }
        let pages = len.div_ceil(PAGE_SIZE);
        // The page-id lock is one a program's signal handler could want
        // (through a fault's reclaim, no; but through a nested map, yes).
        let _blocked = signals::SignalsBlocked::asynchronous();
        // Whole chunks of ids (addrs.rs): a region's first id starts one.
        let ids = pages.next_multiple_of(addrs::CHUNK);
        let id_base = {
            let mut guard = inner.ids.lock();
            let (mapped, max) = (guard.mapped, guard.max);
            let free_ids = &mut guard.free;
            let at = free_ids.iter().position(|r| r.1 as usize >= ids);
            let Some(i) = at.filter(|_| mapped + pages <= max) else {
                return Err(PagerError::TooManyPages {
                    pages,
                    max,
                    free: max - mapped,
                });
            };
            let start = free_ids[i].0;
            free_ids[i].0 += ids as u32;
            free_ids[i].1 -= ids as u32;
            if free_ids[i].1 == 0 {
                free_ids.remove(i);
            }
            guard.mapped += pages;
            // Ids at or past `fresh` read NEVER already.
            let fresh = guard.fresh.max(start);
            guard.fresh = guard.fresh.max(start + ids as u32);
            (start, fresh)
        };
        let (id_base, fresh) = id_base;
        let align = if huge { page::UNIT_BYTES } else { PAGE_SIZE };
        let map = match at.map_or_else(
            || Mapping::new(pages * PAGE_SIZE, align),
            |a| Mapping::new_at(a, pages * PAGE_SIZE),
        ) {
            Ok(m) => m,
            Err(source) => {
                inner.free_ids(id_base, ids as u32, pages);
                return Err(PagerError::Mmap {
                    bytes: pages * PAGE_SIZE,
                    source,
                });
            }
        };
        if huge {
            // Without THP, units still go whole, just as 512 small pages.
            let _ = map.advise_huge();
        }
        // Ids never handed out read NEVER: only a unit's head needs its
        // mark there, and below them each state is looked at.
        let seen = (fresh - id_base) as usize;
        let heads = if huge { seen..pages } else { pages..pages }.step_by(page::UNIT_PAGES);
        for i in (0..seen.min(pages)).chain(heads) {
            let head = huge && i % page::UNIT_PAGES == 0;
            let fresh = if head {
                page::NEVER | page::UNIT
            } else {
                page::NEVER
            };
            let st = &inner.states[id_base as usize + i];
            // Ids never used before read zero (NEVER) already: not
            // storing it leaves the table's untouched pages uncommitted
            // (8 bytes a page: 135 MiB for the 68 GiB heap of uswap run's
            // default at 50% of this machine).
            if st.load(Ordering::Relaxed) != fresh {
                st.store(fresh, Ordering::Relaxed);
            }
        }
        inner.addrs.publish(id_base, pages, map.addr());
        if let Err(e) = inner.uffd.register(
            map.addr(),
            map.len() as u64,
            RegisterMode {
                missing: true,
                wp: true,
            },
        ) {
            inner.free_ids(id_base, ids as u32, pages);
            return Err(e.into());
        }
        let Some(slot) =
            entry::publish_region(map.addr(), map.len() as u64, id_base, Arc::as_ptr(inner), huge)
        else {
            // The mapping is unmapped as `map` drops, registration and all.
            inner.free_ids(id_base, ids as u32, pages);
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
    pub fn stats(&self) -> Stats {
        let _inside = gate::enter(0);
        self.inner.registry.snapshot()
    }

    /// How this instance serves faults.
    pub fn fault_mode(&self) -> FaultMode {
        self.mode
    }

    /// Pages resident now, over all regions.
    pub fn resident_pages(&self) -> usize {
        self.inner.budget.resident.load(Ordering::Relaxed)
    }

    /// The most pages resident at once, as the background reclaimer saw
    /// it (every pass, at least every millisecond; 0 without one).
    pub fn peak_resident_pages(&self) -> usize {
        self.inner
            .budget
            .peak
            .load(Ordering::Relaxed)
            .max(self.inner.budget.resident.load(Ordering::Relaxed))
    }

    /// Whether faults are served through a userfaultfd for user-mode
    /// faults only: SIGBUS mode opened by a process without the privilege
    /// for more (see [`FaultMode::Sigbus`]).  Nothing changes for the
    /// program: a system call that touches a missing page fails with
    /// `EFAULT` in SIGBUS mode either way.
    pub fn user_mode_only(&self) -> bool {
        self.inner.uffd.user_mode_only()
    }

    /// The budget in pages.
    pub fn budget_pages(&self) -> usize {
        self.inner.budget.limit()
    }

    /// Change the budget to `bytes` while regions are in use: a smaller
    /// one is reached by the background reclaimer (and by faults, which
    /// reclaim before they install past it), a larger one lets more stay
    /// resident.  The overrun's bound follows the budget.  Refused, in one
    /// line, under 64 pages, or under two 2 MB units while a region of
    /// units is mapped.
    pub fn set_budget(&self, bytes: u64) -> Result<(), PagerError> {
        let page = PAGE_SIZE as u64;
        if bytes < 64 * page {
            return Err(PagerError::Config(format!(
                "a budget of {bytes} bytes is too small: give at least {} bytes (64 pages)",
                64 * page
            )));
        }
        // More than the instance can map is as good as all of it (and
        // keeps `limit + slack` far from overflowing).
        let pages = usize::try_from(bytes / page)
            .unwrap_or(usize::MAX)
            .min(self.inner.states.len().max(64));
        if pages < 2 * page::UNIT_PAGES && entry::has_huge_region(&self.inner) {
            return Err(PagerError::Config(format!(
                "a budget of {bytes} bytes is too small while 2 MB units are mapped: give at least {} bytes (two units)",
                2 * page::UNIT_BYTES
            )));
        }
        self.inner.budget.set(pages);
        self.inner.counters.levels.budget.set(pages as u64);
        self.inner
            .registry
            .event(crate::stats::EventKind::BudgetChanged, pages as u64);
        Ok(())
    }

    /// The file this instance's statistics are published as, if they are
    /// (`SwapBuilder::publish`).
    pub fn published_path(&self) -> Option<std::path::PathBuf> {
        self.inner.registry.published_path()
    }

    /// Remove the published statistics now (a process about to exit that
    /// will not drop its instance); they are read no more.
    pub fn unpublish(&self) {
        self.inner.registry.unpublish();
    }

    /// Free slots over all swap devices.
    pub fn free_slots(&self) -> u64 {
        self.inner.backing.space.nr_free()
    }

    /// Usable slots over all swap devices.
    pub fn total_slots(&self) -> u64 {
        self.inner.backing.space.total_slots()
    }

    /// The swap space, for its statistics and invariant checks.
    pub fn swap_space(&self) -> &SwapSpace {
        &self.inner.backing.space
    }

    /// Inject a one-shot IO error at slot `offset` of device `device` (for
    /// testing the error paths).
    #[cfg(test)]
    pub fn inject_io_error(&self, device: usize, offset: u64, op: crate::io::IoOp) {
        self.inner.backing.devices[device].inject_error(offset, op);
    }

    /// Make every IO of `op` on device `device` fail with `errno` for
    /// `duration` (for testing the error paths).
    #[cfg(test)]
    pub fn inject_io_errors(
        &self,
        device: usize,
        op: crate::io::IoOp,
        errno: i32,
        duration: std::time::Duration,
    ) {
        self.inner.backing.devices[device].inject_errors_for(op, errno, duration);
    }
}

impl Drop for Swap {
    fn drop(&mut self) {
        if !self.inner.same_process() {
            // A child not adopted (a raw `clone`): the threads are the
            // parent's (a child has only the thread that forked), and so
            // is everything else.
            std::mem::forget(std::mem::take(&mut *self.inner.threads.lock()));
            return;
        }
        // While regions live the threads keep serving them (they hold only
        // weak references, upgraded per pass); the last region stops them.
        if self.inner.release_user() {
            let threads = std::mem::take(&mut *self.inner.threads.lock());
            for t in threads {
                t.join();
            }
        }
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

    /// Put `bytes` bytes at `offset` (page aligned) back as the region's
    /// own, fresh: whatever the program mapped over them (`mmap` with
    /// `MAP_FIXED`) or changed their protection to (`mprotect`) is
    /// replaced by private anonymous memory, readable and writable,
    /// registered again, its pages discarded (they read as zeros).  For a
    /// library that serves a program's mappings from a region and gets one
    /// back (`munmap`).  Small-page regions only.
    pub fn restore(&self, offset: usize, bytes: usize) -> Result<(), PagerError> {
        let huge = self.inner.states[self.id_base as usize].load(Ordering::Acquire) & page::UNIT != 0;
        if huge
            || !offset.is_multiple_of(PAGE_SIZE)
            || !bytes.is_multiple_of(PAGE_SIZE)
            || offset.checked_add(bytes).is_none_or(|end| end > self.len())
        {
            return Err(PagerError::Range {
                offset,
                bytes,
                len: self.len(),
            });
        }
        let addr = self.map.addr() + offset as u64;
        // SAFETY: a range of this region (checked above), replaced by
        // fresh memory: its contents are the caller's to drop, and nothing
        // of uswap's lives there.
        let p = unsafe {
            rustix::mm::mmap_anonymous(
                addr as *mut _,
                bytes,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::PRIVATE | rustix::mm::MapFlags::NORESERVE | rustix::mm::MapFlags::FIXED,
            )
        }
        .map_err(|e| PagerError::Mmap {
            bytes,
            source: e.into(),
        })?;
        debug_assert_eq!(p as u64, addr);
        // Under `mlockall(MCL_FUTURE)` the fresh mapping came locked (and
        // filled): its pages are uswap's to keep in or out.
        // SAFETY: unlocks a range of this region; contents unchanged.
        let _ = unsafe { rustix::mm::munlock(addr as *mut _, bytes) };
        self.inner.uffd.register(
            addr,
            bytes as u64,
            RegisterMode {
                missing: true,
                wp: true,
            },
        )?;
        // Registered, then discarded: a page the kernel filled in before
        // the registration goes too, and every state reads NEVER.
        self.discard(offset, bytes)
    }

    /// Discard `bytes` bytes at `offset` (page aligned): those pages read
    /// as zeros from now on and give up their memory, their slots and
    /// their swap-cache frames.  This is `madvise(MADV_DONTNEED)` for a
    /// region: the plain call drops only what is mapped, and a page uswap
    /// has swapped out or staged would come back with its old contents.
    /// In a `map_huge` region, whole 2 MB units only.
    pub fn discard(&self, offset: usize, bytes: usize) -> Result<(), PagerError> {
        let inner = &self.inner;
        let huge = inner.states[self.id_base as usize].load(Ordering::Acquire) & page::UNIT != 0;
        let unit = if huge { page::UNIT_BYTES } else { PAGE_SIZE };
        if !offset.is_multiple_of(unit)
            || !bytes.is_multiple_of(unit)
            || offset.checked_add(bytes).is_none_or(|end| end > self.len())
        {
            return Err(PagerError::Range {
                offset,
                bytes,
                len: self.len(),
            });
        }
        // The LRU, slot and frame locks taken below are ones a program's
        // signal handler could want too, through a fault.
        let _blocked = signals::SignalsBlocked::asynchronous();
        let _inside = gate::enter(0);
        // A batch of pages at a time: their claims held across one
        // MADV_DONTNEED, so that no eviction moves a page out between the
        // drop and the new state (it would keep the old contents staged).
        const BATCH: usize = 64;
        let first = offset / PAGE_SIZE;
        let end = first + bytes / PAGE_SIZE;
        let mut at = first;
        while at < end {
            let n = (end - at).min(if huge { page::UNIT_PAGES } else { BATCH });
            let step = if huge { page::UNIT_PAGES } else { 1 };
            let mut claims: [Option<page::PageClaim<'_>>; BATCH] = [const { None }; BATCH];
            for (k, i) in (at..at + n).step_by(step).enumerate() {
                let id = self.id_base as usize + i;
                claims[k] = Some(page::PageClaim::wait_claim(&inner.states[id], || {
                    inner.counters.busy_waits.inc()
                }));
            }
            let addr = self.map.addr() + (at * PAGE_SIZE) as u64;
            // SAFETY: pages of this region whose claims we hold: their
            // contents are being discarded on the program's word.
            if let Err(e) = unsafe { crate::sys::discard_pages(addr, n * PAGE_SIZE) } {
                // Locked (mlock) or not ours any more: nothing changed.
                drop(claims);
                return Err(PagerError::Mmap {
                    bytes: n * PAGE_SIZE,
                    source: e,
                });
            }
            let mut resident = 0;
            let mut gone = [0u32; BATCH];
            let mut ngone = 0;
            for (k, claim) in claims.iter_mut().enumerate() {
                let Some(claim) = claim.take() else {
                    break;
                };
                let id = self.id_base + ((at + k * step) as u32);
                let w = claim.found();
                match (page::kind(w), w & page::UNIT != 0) {
                    (page::RESIDENT, true) => resident += page::UNIT_PAGES,
                    (page::SWAPPED, true) => inner.free_unit_slots(id, w),
                    (page::RESIDENT, false) => resident += 1,
                    (page::STAGED, false) => {
                        resident += 1;
                        inner.budget.staged.fetch_sub(1, Ordering::Relaxed);
                        writeback::drop_staged(inner, w);
                    }
                    _ => {}
                }
                if w & page::UNIT == 0 {
                    if let Some(e) = page::slot(w) {
                        inner.free_slot(e);
                    }
                }
                if page::kind(w) == page::RESIDENT {
                    gone[ngone] = id;
                    ngone += 1;
                }
                if page::kind(w) != page::NEVER {
                    inner.counters.discarded.inc();
                }
                claim.commit(page::NEVER | (w & page::UNIT));
            }
            inner.lru.remove_batch(&gone[..ngone]);
            inner.budget.resident.fetch_sub(resident, Ordering::Relaxed);
            at += n;
        }
        Ok(())
    }

    /// Pin `bytes` bytes at `offset` for a system call that will read them
    /// (`write` false: `write(2)`, `send`) or store into them (`write`
    /// true: `read(2)`, `recv`): every page is brought in (and made
    /// writable, when the kernel is to store into it) and is not evicted
    /// until the returned guard drops.  The kernel's own accesses to such
    /// pages then find them there: in SIGBUS mode a system call that met a
    /// missing or write-protected page of a region would fail with
    /// `EFAULT`.  Pages are brought in by touching them from this thread,
    /// as the program would (a read, or a compare-exchange of a byte with
    /// itself, which changes nothing); a page evicted between its touch and its pin is
    /// touched again.  Small-page regions only.
    ///
    /// A page the program itself dropped with a plain `madvise`
    /// (`MADV_DONTNEED`, not [`Region::discard`]) still counts as resident
    /// until a fault or an eviction finds it gone, and so is not brought
    /// back by a pin.
    pub fn pin(&self, offset: usize, bytes: usize, write: bool) -> Result<Pinned<'_>, PagerError> {
        let inner = &self.inner;
        let huge = inner.states[self.id_base as usize].load(Ordering::Acquire) & page::UNIT != 0;
        let end = offset.checked_add(bytes).filter(|&e| e <= self.len() && !huge);
        let Some(end) = end else {
            return Err(PagerError::Range {
                offset,
                bytes,
                len: self.len(),
            });
        };
        let first = offset / PAGE_SIZE;
        let last = end.div_ceil(PAGE_SIZE);
        for p in first..last {
            let id = self.id_base as usize + p;
            let addr = self.as_ptr() as usize + p * PAGE_SIZE;
            loop {
                inner.pins[id].fetch_add(1, Ordering::Relaxed);
                // Pairs with the fence in `Inner::pinned`: an evictor that
                // claimed the page before this sees the pin, or this sees
                // its claim (BUSY) and lets go.
                std::sync::atomic::fence(Ordering::SeqCst);
                let w = inner.states[id].load(Ordering::Relaxed);
                // Writable for the kernel: dirty, and not sealed (a page
                // that came back from a compressed device dirty but
                // write-protected: the kernel's write would fail with
                // EFAULT in SIGBUS mode; the touch below unprotects it).
                let writable = w & page::DIRTY != 0 && w & page::SEALED == 0;
                if page::kind(w) == page::RESIDENT && w & page::BUSY == 0 && (!write || writable) {
                    break;
                }
                inner.pins[id].fetch_sub(1, Ordering::Release);
                // SAFETY: a byte of this region, mapped for the region's
                // life; a volatile read, or a compare-exchange of the byte
                // with itself, faults the page in as the program's own
                // access would.  The exchange writes (a locked
                // compare-exchange is a write access even when it fails,
                // and a racing writer's store is never lost); an atomic
                // add of zero would not: LLVM turns such an idempotent
                // update into a fenced load on x86.
                unsafe {
                    if write {
                        let b = std::sync::atomic::AtomicU8::from_ptr(addr as *mut u8);
                        let v = b.load(Ordering::Relaxed);
                        let _ = b.compare_exchange(v, v, Ordering::Relaxed, Ordering::Relaxed);
                    } else {
                        std::ptr::read_volatile(addr as *const u8);
                    }
                }
            }
        }
        Ok(Pinned {
            region: self,
            first,
            last,
        })
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

/// Pages of a region pinned by [`Region::pin`]; unpinned on drop.
#[must_use = "the pages are unpinned when this drops"]
pub struct Pinned<'a> {
    region: &'a Region,
    first: usize,
    last: usize,
}

impl Drop for Pinned<'_> {
    fn drop(&mut self) {
        for p in self.first..self.last {
            self.region.inner.pins[self.region.id_base as usize + p].fetch_sub(1, Ordering::Release);
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        let inner = &self.inner;
        if !inner.same_process() {
            // A child that did not adopt the instance (a raw `clone`):
            // the page states, slots and registration are the parent's
            // (the inherited descriptor acts on the parent's memory).
            // Leave it all.
            return;
        }
        // The LRU, slot and frame locks taken below are ones a program's
        // signal handler could want too, through a fault.
        let _blocked = signals::SignalsBlocked::asynchronous();
        let _inside = gate::enter(0);
        entry::unpublish_region(self.slot);
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
                    page::RESIDENT => resident += page::UNIT_PAGES,
                    page::SWAPPED => inner.free_unit_slots(id as u32, w),
                    _ => {}
                }
                continue;
            }
            match page::kind(w) {
                page::RESIDENT => resident += 1,
                page::STAGED => {
                    resident += 1;
                    inner.budget.staged.fetch_sub(1, Ordering::Relaxed);
                    writeback::drop_staged(inner, w);
                }
                _ => {}
            }
            if let Some(e) = page::slot(w) {
                inner.free_slot(e);
            }
        }
        inner.addrs.clear(self.id_base, self.pages);
        inner.lru.remove_batch(&gone[..ngone]);
        inner.budget.resident.fetch_sub(resident, Ordering::Relaxed);
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
        inner.free_ids(
            self.id_base,
            self.pages.next_multiple_of(addrs::CHUNK) as u32,
            self.pages,
        );
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
        if entry::overlaps_a_region(addr, len) {
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
