//! [`SwapBuilder`]: a swap instance's configuration, with sane defaults,
//! and `build`, which sets the instance up: the swap space and its
//! devices, the userfaultfd, the frame pools, the LRU, the threads.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::io::IoDevice;
use crate::lru::{Lru, LruBatch, LruConfig};
use crate::pager::api::error::PagerError;
use crate::pager::api::swap::Swap;
use crate::pager::entry::fork;
use crate::pager::entry::sigbus;
use crate::pager::entry::sigbus::FaultMode;
use crate::pager::entry::threads;
use crate::pager::instance::addrs;
use crate::pager::instance::budget::Budget;
use crate::pager::instance::frames::{FramePool, Mapping, UnitPool};
use crate::pager::instance::held;
use crate::pager::instance::inner as instance;
use crate::pager::instance::inner::{Backing, Backoff, Frames, Inner};
use crate::pager::instance::overrun::Overrun;
use crate::pager::instance::page;
use crate::pager::instance::regions;
use crate::pager::instance::report;
use crate::pager::instance::staged::StagedRing;
use crate::spec::SwapDeviceSpec;
use crate::stats::{LockId, Registry, StatMutex};
use crate::swap_cache::SwapCache;
use crate::swap_space::{SlotDeviceConfig, SwapSpace, Switches};
use crate::table::{self};
use crate::uffd::{Features, Reach, RegisterMode, Uffd};
use crate::PAGE_SIZE;

/// The window of page ids a victim's cold neighbours come from
/// ([`SwapBuilder::evict_neighbours`]): 8 pages, 32 KiB.  sqlite3 at 20
/// MiB ran 12.9-14.1 s with 8 and 13.0-14.9 s with 16, against 16.5-20.5
/// s with none; Python's uniform touches over 6 GiB, 43-44 s with 16
/// against 49-51 with none.
pub(crate) const NEIGHBOURS: u32 = 8;

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
    /// How long the pages a cut of the budget takes dwell staged before
    /// they are written (`probation`); None: no probation.
    probation: Option<std::time::Duration>,
    switches: Switches,
    lru_batch: LruBatch,
    background: bool,
    threads_on_need: bool,
    readahead: bool,
    per_page_evict: bool,
    paced_reclaim: bool,
    reclaim_ahead_in_memory: bool,
    wide_fault_around: bool,
    refault_distance: bool,
    trend_prefetch: bool,
    batched_reads: bool,
    fault_read_in_batch: bool,
    compact_slots: bool,
    adaptive_seal: bool,
    adaptive_clean: bool,
    evict_neighbours: bool,
    overrun: Overrun,
    domain: Option<Arc<crate::domain::Member>>,
    /// Publish statistics for `uswap stat` (`publish`), and the tree's
    /// supervisor to name in them.
    publish: bool,
    group: i32,
}

impl Swap {
    /// Start configuring an instance.
    pub fn builder() -> SwapBuilder {
        SwapBuilder::default()
    }
}

/// The defaults: a 256 MiB budget, SIGBUS mode, one handler thread where
/// handler threads serve, the seeds' switches on, background reclaim and
/// readahead on, a 10% overrun, no devices (`build` asks for one).
impl Default for SwapBuilder {
    fn default() -> Self {
        SwapBuilder {
            budget: 256 << 20,
            devices: Vec::new(),
            mode: FaultMode::Sigbus,
            handler_threads: 1,
            max_mapped: None,
            staging_frames: None,
            probation: None,
            switches: Switches::DEFAULT,
            lru_batch: LruBatch::default(),
            background: true,
            threads_on_need: false,
            readahead: true,
            per_page_evict: false,
            paced_reclaim: true,
            reclaim_ahead_in_memory: false,
            wide_fault_around: true,
            refault_distance: true,
            trend_prefetch: true,
            batched_reads: true,
            fault_read_in_batch: true,
            compact_slots: true,
            adaptive_seal: true,
            adaptive_clean: true,
            evict_neighbours: true,
            overrun: Overrun::default(),
            domain: None,
            publish: false,
            group: 0,
        }
    }
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
    /// docs/history/PERFORMANCE-LOG.md).
    pub fn staging_frames(mut self, n: u32) -> Self {
        self.staging_frames = Some(n);
        self
    }

    /// Probation for the pages a cut of the budget takes
    /// ([`Swap::set_budget`] lower, or a domain's smaller share): they are
    /// staged (moved out of their regions, kept in memory) and written
    /// only if nothing touched them for `dwell`; a touch meanwhile takes
    /// one back with no IO and marks it in use.  User space sees no
    /// accessed bits, and without probation a cut takes the pages longest
    /// unfaulted, hot ones that were loaded first among them, which then
    /// come back from the device.  For the dwell the instance holds up to
    /// the budget it had before the cut (what the cuts of one dwell take
    /// is bounded by an eighth of the budget, in staging frames set aside
    /// for it).  `uswap run --budget auto` turns it on with the
    /// controller's interval; a budget lowered as a hard limit wants it
    /// off (the default).
    pub fn probation(mut self, dwell: std::time::Duration) -> Self {
        self.probation = Some(dwell);
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

    /// Start the background threads (the reclaimer; the prefetcher of a
    /// swap file) only when first needed, not at build (default off):
    /// a process that never nears its budget runs no thread of uswap's.
    /// `uswap run` turns it on, where uswap is a guest in the program's
    /// process (a runtime counts its threads: CPython warns at every
    /// `fork` of a process with more than one).  Until they start, faults
    /// reclaim for themselves; they start at the first safe point after
    /// the need (a fault in the program's own code, an allocation, a
    /// handler thread's turn).  Handler threads always start at build:
    /// every fault needs them.
    pub fn threads_on_need(mut self, on: bool) -> Self {
        self.threads_on_need = on;
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

    /// Reclaim paced by the faults (on by default, for devices in memory:
    /// RAM and compressed ones with no file behind): while the resident set
    /// is within a batch (64 pages) of the budget, each fault that installs a page first
    /// writes back a page or two of the staged ones (or, with none ready,
    /// evicts one batch), so that the work of making room is spread over
    /// the faults that need it, a few microseconds each, and the
    /// background reclaimer runs at the lowest priority (nice 19), on
    /// what CPU time the program leaves.  Off: the reclaimer runs at the
    /// program's priority and a fault reclaims a whole batch only when
    /// the reclaimer has fallen a batch behind (uswap before paced reclaim:
    /// a 4 ms p99.9 when the program's threads fill the CPUs).
    pub fn paced_reclaim(mut self, on: bool) -> Self {
        self.paced_reclaim = on;
        self
    }

    /// Background reclaim ahead of the faults where the swap is in memory
    /// (off by default).  Where a device waits on a disk (a swap file, an
    /// NBD export, a compressed store with either behind it) the
    /// reclaimer keeps the resident set under a low watermark, a
    /// sixteenth of the budget (at most 32 MiB) below it, writing ahead
    /// so that a fault seldom waits for a write.  On devices in memory
    /// (RAM, a compressed store alone) the faults reclaim for themselves
    /// when they find the budget used, as the kernel's memory cgroup
    /// reclaims in the task it charges, and the reclaimer takes back only
    /// what they leave past it (a cut of the budget no fault follows).
    ///
    /// Why: a page moved out of the program's address space is a TLB
    /// flush on every CPU that runs it.  From a fault it is local (0.9 us
    /// here); from a reclaimer thread on another CPU it is an
    /// inter-processor interrupt to the program's CPU and a wait for it
    /// (10 us on a VM), and the pages a reclaimer takes ahead leave no
    /// fault less to take, only later.  Python over 6 GiB at a 2 GiB
    /// budget on compressed RAM: 93 CPU-seconds and 55 s with the
    /// reclaimer ahead, 44 and 44 s without (docs/PERFORMANCE.md).
    /// On: the reclaimer keeps the low watermark on every device, as
    /// uswap did before.
    pub fn reclaim_ahead_in_memory(mut self, on: bool) -> Self {
        self.reclaim_ahead_in_memory = on;
        self
    }

    /// Wide fault-around (on by default, with readahead): while the
    /// resident set is under half the budget, a fault on a never-written
    /// page fills the 32 pages from it on (those never written and
    /// missing), whatever the order of the faults; off, only faults that
    /// come in order widen the run, 2 pages doubling to 32, as for
    /// swap-ins.
    pub fn wide_fault_around(mut self, on: bool) -> Self {
        self.wide_fault_around = on;
        self
    }

    /// Refault distance (on by default): a page that comes back from
    /// swap within half a budget's worth of evictions is working set and
    /// goes on the active list, which reclaim ages only when the inactive
    /// one runs empty; one that comes back later goes on the inactive
    /// list, to be evicted first again (after the kernel's
    /// mm/workingset.c; uswap sees no accessed bits, so the bound is half
    /// the budget rather than the active list).  Off: every page that
    /// comes back is activated, as before refault distance.
    pub fn refault_distance(mut self, on: bool) -> Self {
        self.refault_distance = on;
        self
    }

    /// Trend prefetch (on by default, with readahead): a thread whose
    /// recent faults step by one delta (a majority of its last eight),
    /// backwards or by a stride of 2 to 127 pages either way, has the
    /// pages along it read in before it touches them, the window
    /// doubling from 2 to 32 while the walk keeps to it (after Leap,
    /// ATC'20).  Off: only forward walks are read ahead, as
    /// readahead alone does.
    pub fn trend_prefetch(mut self, on: bool) -> Self {
        self.trend_prefetch = on;
        self
    }

    /// Batched reads (on by default): a readahead window from a swap
    /// file, whose runs of slots the file holds apart, has its reads in
    /// flight together through an io_uring, where io_uring is allowed
    /// (`io::ReadRing`).  Off: one read after the other.
    pub fn batched_reads(mut self, on: bool) -> Self {
        self.batched_reads = on;
        self
    }

    /// The fault's own read in its window's batch (on by default, with
    /// [`batched_reads`](Self::batched_reads)): where the faulting thread
    /// waits for its readahead window anyway (SIGBUS mode, and the walks
    /// of `Swap::hold_in`), the faulted page's read from a swap file goes
    /// out with the window's, one disk round trip where there were two.
    /// Off: the page is read alone first, then its window.
    pub fn fault_read_in_batch(mut self, on: bool) -> Self {
        self.fault_read_in_batch = on;
        self
    }

    /// Compact slot allocation (on by default): every device hands out
    /// slots from its freed clusters, then its partly used ones, and
    /// takes a cluster never used last, as a swap file that grows does
    /// (`SlotDeviceConfig::compact`).  Each slot's metadata (a file's
    /// seal, the swap cache's word) is committed at its first use, in
    /// the paged process and within its budget; swept whole in the
    /// kernel's order, a device commits all of it whatever its live
    /// swap.  Off: the kernel's order, but for a file that grows.
    pub fn compact_slots(mut self, on: bool) -> Self {
        self.compact_slots = on;
        self
    }

    /// Adaptive sealing (on by default): a page read back from a
    /// compressed device, which lets its copy go, comes in dirty but
    /// write-protected (sealed), so that evicted unwritten it is dropped
    /// with its batch rather than moved; while more than one such page in
    /// three is written before it goes (each write a write-protect fault
    /// that saves nothing), they come in writable instead, one in sixteen
    /// still sealed to keep measuring.  Off: every such page is sealed.
    pub fn adaptive_seal(mut self, on: bool) -> Self {
        self.adaptive_seal = on;
        self
    }

    /// Pages read back from a device that keeps its copy (a swap file,
    /// an NBD export) come in clean (write-protected, the slot's copy
    /// kept) while most of them go unwritten, and writable while the
    /// program writes what it reads (instance/seal.rs); off, always clean,
    /// as before.  Default on.
    pub fn adaptive_clean(mut self, on: bool) -> Self {
        self.adaptive_clean = on;
        self
    }

    /// Cold neighbours go with a victim (on by default): reclaim takes
    /// with each page from the inactive tail the pages of its aligned
    /// window of 8 (`NEIGHBOURS`) that are inactive and unreferenced too,
    /// so that scattered dirty victims leave as runs, one `UFFDIO_MOVE`
    /// and one TLB flush per run instead of per page (a cross-CPU
    /// shootdown, 10-12 us on a VM, whenever another CPU runs the
    /// program).  sqlite3 building an index at 20 MiB: 1.3x faster and 5%
    /// fewer swap-ins (docs/history/PERFORMANCE-LOG.md).  Off: victims one by one,
    /// in LRU order.
    pub fn evict_neighbours(mut self, on: bool) -> Self {
        self.evict_neighbours = on;
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
    /// For `uswap run`'s supervisor and its preloaded library (the
    /// `internal` feature).
    #[cfg(feature = "internal")]
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
        let window_frames = self
            .staging_frames
            .unwrap_or_else(|| ((self.budget / page / 128) as u32).clamp(256, 4096));
        if !(16..=1 << 20).contains(&window_frames) {
            return Err(PagerError::Config(format!(
                "staging_frames must be 16..=1048576, got {window_frames}"
            )));
        }
        // A domain whose budget finds itself asks for probation itself
        // (`Member::dwell`), from the start: its frames are set aside
        // here, and the dwell follows the domain's from then on.
        let dwell = self
            .probation
            .or_else(|| self.domain.as_ref().and_then(|m| m.dwell()));
        // An eighth of the budget, more than a probe's cut (a tenth):
        // address space and a bit each until used.
        let probation_frames = match dwell {
            Some(_) => ((self.budget / page / 8) as u32).min((1 << 20) - window_frames),
            None => 0,
        };
        let staging_frames = window_frames + probation_frames;
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
                SwapDeviceSpec::Remote { target, priority } => (IoDevice::nbd(target, &registry)?, *priority),
            };
            space = space.device(
                SlotDeviceConfig::new(dev.slots())
                    .priority(prio)
                    .grows(dev.grows())
                    .compact(self.compact_slots),
            );
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
            max_pages.next_multiple_of(addrs::CHUNK) + addrs::CHUNK * max_pages.min(regions::MAX_REGIONS);
        let max_pages = u32::try_from(max_pages)
            .map_err(|_| PagerError::Config(format!("max_mapped of {max_pages} pages exceeds 2^32 pages")))?;
        let neighbours = if self.evict_neighbours { NEIGHBOURS } else { 1 };
        let lru = Lru::new(
            LruConfig::new(max_pages)
                .batch(self.lru_batch)
                .neighbours(neighbours),
            &registry,
        )?;
        let staging = FramePool::new(staging_frames, &registry, LockId::STAGING_FRAMES)
            .map_err(|source| PagerError::Mmap {
                bytes: staging_frames as usize * PAGE_SIZE,
                source,
            })?
            .kept_empty();
        // Bounce frames: one per fault reading a page in, a run per
        // readahead (runs shrink to the frames free; a fault waits for
        // one).  Memory inside the budget once used: 256 (1 MiB) is many
        // more than faults in flight at once, and at the budgets of a
        // tree's small members (a shell, `sha256sum`, a compiler pass) a
        // quarter of their memory; one frame per 256 pages of the
        // budget, 64 (two full readahead runs) at the least.  Each frame
        // is populated by the first read into it, a minor fault of the
        // kernel's (about a microsecond, once a frame), not at start:
        // populated then, 256 KiB at the least, they were the largest
        // part of what each process of a tree that never swaps in (a
        // shell, `make`, a compiler driver) paid for uswap.
        let bounce_frames = window_frames.min(((self.budget / page / 256) as u32).clamp(64, 256));
        let bounce = FramePool::new(bounce_frames, &registry, LockId::BOUNCE_FRAMES).map_err(|source| {
            PagerError::Mmap {
                bytes: bounce_frames as usize * PAGE_SIZE,
                source,
            }
        })?;
        let zero_bytes = crate::pager::fault::readahead::READAHEAD_MAX as usize * PAGE_SIZE;
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
        let prefetch = self.readahead && devices.iter().any(|d| d.waits_on_disk());
        // Paced only where writeback stays in memory: a swap file's pages
        // (a tier's too, when its store makes room) are written by the
        // reclaimer, several in flight, while the faults wait on reads.
        let paced = self.paced_reclaim && !devices.iter().any(|d| d.has_file());
        // Ahead of the faults where a write may wait on a disk: a swap
        // file, an export, a tier's file behind its store.
        let in_memory = !devices.iter().any(|d| d.has_file() || d.waits_on_disk());
        let ahead = self.background && (!in_memory || self.reclaim_ahead_in_memory);
        let inner = Arc::new(Inner::new(instance::Parts {
            uffd,
            lru,
            // Zeroed (NEVER, no address) and committed as ids are used.
            states: table::zeroed(max_pages as usize, "page states")?,
            addrs: addrs::PageAddrs::new(max_pages as usize)?,
            pins: table::zeroed(max_pages as usize, "page pins")?,
            spawn: instance::Spawn {
                handlers: if self.mode == FaultMode::HandlerThread {
                    self.handler_threads
                } else {
                    0
                },
                reclaimer: self.background,
                watching: self.mode == FaultMode::Sigbus,
                on_need: self.threads_on_need,
            },
            ids: max_pages,
            max_mapped: max_user,
            frames: Frames {
                staging,
                bounce,
                unit_in,
                unit_out,
                zero,
            },
            budget: Budget::new(
                budget,
                ahead,
                self.overrun,
                window_frames as usize / 2,
                probation_frames as usize,
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
                read_ring: std::sync::OnceLock::new(),
            },
            readahead: self.readahead,
            per_page_evict: self.per_page_evict,
            paced,
            wide_fault_around: self.wide_fault_around,
            refault_distance: self.refault_distance,
            trend_prefetch: self.trend_prefetch,
            batched_reads: self.batched_reads,
            fault_read_in_batch: self.fault_read_in_batch,
            adaptive_seal: self.adaptive_seal,
            adaptive_clean: self.adaptive_clean,
            prefetch,
            member: self.domain.clone(),
            registry,
        }));
        inner.counters().levels.budget.set(self.budget / page);
        if let Some(d) = dwell {
            inner.budget().set_dwell(d.as_nanos() as u64);
        }
        inner.registry().label(&crate::stats::Label {
            group: self.group,
            mode: match (self.mode, inner.uffd().user_mode_only()) {
                (FaultMode::HandlerThread, _) => 0,
                (_, false) => 1,
                (_, true) => 2,
            },
        });
        inner.set_me(Arc::downgrade(&inner));
        if self.mode == FaultMode::Sigbus {
            sigbus::install();
        }
        threads::start_threads(&inner);
        fork::register(&inner);
        Ok(Swap {
            inner,
            mode: self.mode,
        })
    }
}
