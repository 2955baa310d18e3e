//! One instance's shared state ([`Inner`]), in named parts: its frames
//! (staging, bounce and unit pools), its budget (resident and staged
//! counts, the watermarks) and its backing (swap space, IO devices, swap
//! cache, writeback's pause).  And the operations on pages that both the
//! fault and the reclaim paths use: the userfaultfd moves and copies with
//! their test hooks, slot frees, the retry pause.
//!
//! `Inner`'s fields are private to this file.  The rest of the pager
//! reaches the parts through accessors, each part keeping its own rule;
//! the instance's own bookkeeping (page ids, handles alive, the process
//! it serves, the fork mark) changes only through the methods below,
//! named for what they do.  The builder hands its parts to [`Inner::new`].

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use crate::io::IoDevice;
use crate::lru::Lru;
use crate::pager::instance::budget::Budget;
use crate::pager::instance::counters::Counters;
use crate::pager::instance::frames::{FramePool, Mapping, UnitPool};
#[cfg(test)]
use crate::pager::instance::inject::Inject;
use crate::pager::instance::page::{self, PageClaim, PageState};
use crate::pager::instance::prefetch::Prefetch;
use crate::pager::instance::report;
use crate::pager::instance::seal::SealGate;
use crate::pager::instance::staged::StagedRing;
use crate::pager::instance::workingset::Workingset;
use crate::stats::{LockId, Registry, StatMutex};
use crate::swap_cache::SwapCache;
use crate::swap_space::SwapSpace;
use crate::uffd::Uffd;

/// The shared state of one instance.  Regions and the entry's threads
/// refer to it; it lives while the `Swap` handle or any region does.
pub(crate) struct Inner {
    uffd: Uffd,
    lru: Lru,
    /// Per page id: the page state word (see page.rs).
    states: Box<[PageState]>,
    /// Page id -> the page's address (0 when no region holds the id).
    addrs: crate::pager::instance::addrs::PageAddrs,
    /// Per page id: pins held on the page (`Region::pin`): a pinned page
    /// is resident and is not evicted.  The pinner raises it and then
    /// checks the state; an evictor claims the page and then checks it,
    /// each with a SeqCst fence between (`pinned`): one of the two sees
    /// the other.
    pins: Box<[AtomicU32]>,
    /// Which process's pins `pins` counts: bumped by a forked child as it
    /// adopts the instance, when it drops the pins its parent's threads
    /// held (they are not in the child to let go of them).  A pin let go
    /// under another epoch than the one it was taken in is not counted
    /// again (`Region::pin`'s guard): the child's count of it went with
    /// the rest.
    pin_epoch: AtomicU32,
    /// Page ids: free ranges and pages mapped; only map and unmap touch
    /// them.
    ids: StatMutex<PageIds>,
    frames: Frames,
    budget: Budget,
    backing: Backing,
    /// Swap-in readahead on (`SwapBuilder::readahead`).
    readahead: bool,
    /// Every small page evicted with its own `UFFDIO_MOVE`
    /// (`SwapBuilder::per_page_evict`), not in batches.
    per_page_evict: bool,
    /// Faults pace reclaim (`SwapBuilder::paced_reclaim`).
    paced: bool,
    /// First touches far below the budget fill a whole window
    /// (`SwapBuilder::wide_fault_around`).
    wide_fault_around: bool,
    /// The eviction clock and the refault decision
    /// (`SwapBuilder::refault_distance`).
    workingset: Workingset,
    /// Backward and strided walks read ahead (`SwapBuilder::trend_prefetch`).
    trend_prefetch: bool,
    /// A window's reads from swap files in flight together
    /// (`SwapBuilder::batched_reads`).
    batched_reads: bool,
    /// A fault's own read goes out with its window's where the faulting
    /// thread waits for both (`SwapBuilder::fault_read_in_batch`).
    fault_read_in_batch: bool,
    /// Whether pages a compressed device let go come in sealed
    /// (`SwapBuilder::adaptive_seal`).
    seal: SealGate,
    /// Whether pages read back from a device that keeps its copy come in
    /// clean (`SwapBuilder::adaptive_clean`).
    clean: SealGate,
    /// Held by the one fault evicting a batch for the pace (others write
    /// back, or go on: two batches at once would only contend on the LRU).
    pacing: AtomicBool,
    /// Drops clean victims in place, a batch per system call.
    discarder: crate::sys::Discarder,
    /// Readahead handed to the prefetcher thread (swap files).
    prefetch: Prefetch,
    /// Set when the last handle (the `Swap` or a region) goes: the threads
    /// stop.  A thread's own reference cannot tell, as several threads
    /// holding one each would keep each other alive forever.
    shutdown: AtomicBool,
    /// Handles alive: the `Swap` and every region.
    users: AtomicUsize,
    /// The process the instance serves: the one that built it, or a
    /// forked child that adopted its copy (fork.rs).  In a child that did
    /// not (a raw `clone`), the inherited descriptor still speaks for the
    /// parent's memory, so nothing may be done with it.
    pid: std::sync::atomic::AtomicI32,
    /// The instance's threads (handler, prefetcher, reclaimer), joined by
    /// the `Swap`'s drop; replaced in a forked child, which has none of
    /// its parent's threads.
    threads: StatMutex<Vec<crate::pager::instance::signals::UswapThread>>,
    /// What threads to start (at build, and again in a forked child).
    spawn: Spawn,
    /// Whether the background threads run, are wanted, or not yet.
    background: crate::pager::instance::background::Background,
    /// The instance itself, for the thread that starts the background
    /// threads from a plain reference (the SIGBUS handler finds `&Inner`
    /// by address); set once, at build.
    me: std::sync::OnceLock<Weak<Inner>>,
    /// Which once-only lines have been said.
    reports: Reports,
    /// This process has forked since the instance was built: a page
    /// `UFFDIO_MOVE` refuses as shared may be one the fork shared
    /// (batch.rs, `unshare`).
    forked: AtomicBool,
    /// This instance's membership of a budget domain: its reclaimer
    /// publishes what it holds there and takes its budget from there.
    member: Option<Arc<crate::domain::Member>>,
    /// Test hooks: failures to inject into the userfaultfd calls.
    #[cfg(test)]
    inject: Inject,
    counters: Counters,
    registry: Arc<Registry>,
}

/// The memory the pager maps for itself, besides regions.
pub(crate) struct Frames {
    /// Staging frames: evicted pages are moved into them (registered with
    /// the userfaultfd, as a move's destination must be) and stay there,
    /// in the swap cache, until written back.
    pub staging: FramePool,
    /// Bounce frames: swap-ins are read into them, then copied in.
    pub bounce: FramePool,
    /// 2 MB staging units: populated and moved into regions (unregistered)
    /// and receiving units moved out (registered).
    pub unit_in: UnitPool,
    pub unit_out: UnitPool,
    /// Pages of zeros (as many as one readahead installs), the source of
    /// zero-fill copies.
    pub zero: Mapping,
}

/// Page ids, handed to regions.
struct PageIds {
    /// Free id ranges (start, len), sorted and merged: at most one more
    /// than there are regions.  A region takes whole chunks of ids
    /// (addrs.rs), so a range's start is a chunk's.
    free: Vec<(u32, u32)>,
    /// Pages the regions span now, and at most (`max_mapped`): the limit
    /// counts pages, not the chunks' ids.
    mapped: usize,
    max: usize,
    /// Ids from here on were never handed to a region: their states read
    /// zero (NEVER) still, and `map` need not look at them.  Reading the
    /// state of every page of a fresh heap the size of the machine's
    /// memory (6 M pages, 48 MiB of table, 12 K faults on the zero page)
    /// was most of a process's start under `uswap run`: 20 ms of each
    /// `/bin/true` a shell ran.
    fresh: u32,
}

/// Where evicted pages go: slots on the swap devices, and the swap cache
/// that finds a staged page's frame by its slot.
pub(crate) struct Backing {
    pub space: SwapSpace,
    /// The IO devices, indexed by a slot's device number.
    pub devices: Vec<IoDevice>,
    /// Slot -> staging frame of each staged page.
    pub swap_cache: SwapCache,
    /// Staged pages oldest first (see reclaim.rs).
    pub staged: StatMutex<StagedRing>,
    /// Writeback's pause after transient write errors (reclaim.rs).
    pub writeback: Backoff,
    /// Slots on swap files that a forked child may read, held (held.rs).
    pub hold: crate::pager::instance::held::Hold,
    /// In a forked child with swap files, until it has files of its own
    /// (`open_layers`): no new slots (the parent allocates on the same
    /// files), and frees of swap-file slots are the parent's to make.
    pub closed: AtomicBool,
    /// In a forked child: every swap file can give it files of its own
    /// (io/file.rs, "A forked child's files of its own"); false again if
    /// making them failed.  A fault past the budget waits for them while
    /// this holds and `closed` does.
    pub layerable: AtomicBool,
    /// Whether the reclaimer set out to make them (once).
    pub layers_tried: AtomicBool,
    /// The io_uring a fault reads its window from swap files through
    /// (`readahead.rs`), made by the reclaimer as it starts; until then,
    /// where io_uring is refused, and in a forked child, windows are
    /// read one run after the other.
    pub read_ring: std::sync::OnceLock<crate::io::LentRing>,
}

/// The threads an instance runs.
pub(crate) struct Spawn {
    /// Handler threads (handler-thread mode), 0 in SIGBUS mode.
    pub handlers: usize,
    /// A background reclaimer.
    pub reclaimer: bool,
    /// The reclaimer watches signal set-up (SIGBUS mode).
    pub watching: bool,
    /// The reclaimer and prefetcher start when first needed, not at build
    /// (`background.rs`).
    pub on_need: bool,
}

/// Writeback's pause after transient write errors.
#[derive(Default)]
pub(crate) struct Backoff {
    /// No writes before this `CLOCK_MONOTONIC` nanosecond (0: none).
    pub hold_until: AtomicU64,
    /// The current pause; 0 while writes work.
    pub backoff_ns: AtomicU64,
    /// The pause has been said (once a process: writes that fail now and
    /// then, a swap file that cannot grow among ones that can, would
    /// otherwise say it at every turn).
    pub said: AtomicBool,
}

/// One-line reports said once per instance.
#[derive(Default)]
pub(crate) struct Reports {
    pub pinned: AtomicBool,
    pub locked: AtomicBool,
    pub refused: AtomicBool,
    pub install_retry: AtomicBool,
    pub bad_slot: AtomicBool,
    pub not_ours: AtomicBool,
    pub full_frame: AtomicBool,
    pub unreported_move: AtomicBool,
}

/// What the builder made for an instance: the parts it configured.
/// [`Inner::new`] adds the instance's own bookkeeping.
pub(crate) struct Parts {
    pub uffd: Uffd,
    pub lru: Lru,
    pub states: Box<[PageState]>,
    pub addrs: crate::pager::instance::addrs::PageAddrs,
    pub pins: Box<[AtomicU32]>,
    pub spawn: Spawn,
    /// Page ids there are (the tables' length).
    pub ids: u32,
    /// Pages the regions may span at most.
    pub max_mapped: usize,
    pub frames: Frames,
    pub budget: Budget,
    pub backing: Backing,
    pub readahead: bool,
    pub per_page_evict: bool,
    pub paced: bool,
    pub wide_fault_around: bool,
    pub refault_distance: bool,
    pub trend_prefetch: bool,
    pub batched_reads: bool,
    pub fault_read_in_batch: bool,
    pub adaptive_seal: bool,
    pub adaptive_clean: bool,
    /// Readahead goes to a prefetcher thread (swap files).
    pub prefetch: bool,
    pub member: Option<Arc<crate::domain::Member>>,
    pub registry: Arc<Registry>,
}

impl Inner {
    pub fn new(p: Parts) -> Inner {
        Inner {
            counters: Counters::new(&p.registry),
            uffd: p.uffd,
            lru: p.lru,
            states: p.states,
            addrs: p.addrs,
            pins: p.pins,
            pin_epoch: AtomicU32::new(0),
            // SAFETY: getpid has no preconditions.
            pid: std::sync::atomic::AtomicI32::new(unsafe { libc::getpid() }),
            threads: StatMutex::new(Vec::new(), p.registry.lock_site(LockId::THREADS)),
            background: crate::pager::instance::background::Background::new(p.spawn.on_need),
            me: std::sync::OnceLock::new(),
            spawn: p.spawn,
            ids: StatMutex::new(
                PageIds {
                    free: vec![(0, p.ids)],
                    mapped: 0,
                    max: p.max_mapped,
                    fresh: 0,
                },
                p.registry.lock_site(LockId::PAGE_IDS),
            ),
            frames: p.frames,
            workingset: Workingset::new(p.budget.limit(), p.refault_distance),
            trend_prefetch: p.trend_prefetch,
            batched_reads: p.batched_reads,
            fault_read_in_batch: p.fault_read_in_batch,
            seal: SealGate::new(p.adaptive_seal, crate::pager::instance::seal::SEALED_WRITTEN_MAX),
            clean: SealGate::new(p.adaptive_clean, crate::pager::instance::seal::CLEAN_WRITTEN_MAX),
            budget: p.budget,
            backing: p.backing,
            readahead: p.readahead,
            per_page_evict: p.per_page_evict,
            paced: p.paced,
            wide_fault_around: p.wide_fault_around,
            pacing: AtomicBool::new(false),
            discarder: crate::sys::Discarder::new(),
            prefetch: Prefetch::new(p.prefetch),
            shutdown: AtomicBool::new(false),
            users: AtomicUsize::new(1),
            reports: Reports::default(),
            forked: AtomicBool::new(false),
            member: p.member,
            #[cfg(test)]
            inject: Inject::default(),
            registry: p.registry,
        }
    }
}

/// The parts, for the paths outside this module that work on them: each
/// part keeps its own rule (the budget's counts move only by `Budget`'s
/// methods, a page word only by a claim), and no one outside replaces a
/// part or the instance's own bookkeeping (its ids, users, pid, threads).
impl Inner {
    #[inline]
    pub fn uffd(&self) -> &Uffd {
        &self.uffd
    }
    #[inline]
    pub fn lru(&self) -> &Lru {
        &self.lru
    }
    /// Per page id: the page state word.
    #[inline]
    pub fn states(&self) -> &[PageState] {
        &self.states
    }
    #[inline]
    pub fn addrs(&self) -> &crate::pager::instance::addrs::PageAddrs {
        &self.addrs
    }
    /// Per page id: pins held (see the field, and `pinned`).
    #[inline]
    pub fn pins(&self) -> &[AtomicU32] {
        &self.pins
    }
    /// The epoch pins are counted in now (see the field).
    #[inline]
    pub fn pin_epoch(&self) -> u32 {
        self.pin_epoch.load(Ordering::Acquire)
    }
    /// A forked child, before it drops its parent's pins: pins taken
    /// before this are no longer counted.
    pub fn new_pin_epoch(&self) {
        self.pin_epoch.fetch_add(1, Ordering::AcqRel);
    }
    #[inline]
    pub fn frames(&self) -> &Frames {
        &self.frames
    }
    #[inline]
    pub fn budget(&self) -> &Budget {
        &self.budget
    }
    #[inline]
    pub fn backing(&self) -> &Backing {
        &self.backing
    }
    #[inline]
    pub fn readahead(&self) -> bool {
        self.readahead
    }
    #[inline]
    pub fn per_page_evict(&self) -> bool {
        self.per_page_evict
    }
    #[inline]
    pub fn paced(&self) -> bool {
        self.paced
    }
    #[inline]
    pub fn wide_fault_around(&self) -> bool {
        self.wide_fault_around
    }
    #[inline]
    pub fn trend_prefetch(&self) -> bool {
        self.trend_prefetch
    }
    #[inline]
    pub fn read_ahead_batched(&self) -> bool {
        self.batched_reads
    }
    #[inline]
    pub fn fault_read_in_batch(&self) -> bool {
        self.batched_reads && self.fault_read_in_batch
    }
    #[inline]
    pub fn seal_gate(&self) -> &SealGate {
        &self.seal
    }

    /// The gate of clean pages (seal.rs).
    #[inline]
    pub fn clean_gate(&self) -> &SealGate {
        &self.clean
    }
    #[inline]
    pub fn workingset(&self) -> &Workingset {
        &self.workingset
    }
    /// Whether a page swapped out with `shadow` and coming back now goes
    /// on the active list (workingset.rs): always, with the switch off or
    /// no shadow kept.  Counts the refaults measured and those activated.
    pub fn refault_activates(&self, shadow: u16) -> bool {
        let Some(distance) = self.workingset.refault_distance(shadow) else {
            return true;
        };
        self.counters.workingset_refault.inc();
        let hot = Workingset::is_workingset(distance, self.budget.limit());
        if hot {
            self.counters.workingset_activate.inc();
        }
        hot
    }
    /// Become the fault that evicts a batch for the pace; `None` while
    /// another one is.
    pub fn start_pacing(&self) -> Option<Pacing<'_>> {
        (!self.pacing.swap(true, Ordering::Acquire)).then_some(Pacing(&self.pacing))
    }
    #[inline]
    pub fn discarder(&self) -> &crate::sys::Discarder {
        &self.discarder
    }
    #[inline]
    pub fn prefetch(&self) -> &Prefetch {
        &self.prefetch
    }
    #[inline]
    pub fn spawn(&self) -> &Spawn {
        &self.spawn
    }
    #[inline]
    pub fn reports(&self) -> &Reports {
        &self.reports
    }
    #[inline]
    pub fn member(&self) -> Option<&Arc<crate::domain::Member>> {
        self.member.as_ref()
    }
    #[cfg(test)]
    pub fn inject(&self) -> &Inject {
        &self.inject
    }
    #[inline]
    pub fn counters(&self) -> &Counters {
        &self.counters
    }
    #[inline]
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }
    /// Remember the instance's own `Arc` (once, at build).
    pub fn set_me(&self, me: Weak<Inner>) {
        let _ = self.me.set(me);
    }
    /// The instance's own `Arc`, while it lives.
    pub fn me(&self) -> Option<Arc<Inner>> {
        self.me.get()?.upgrade()
    }
    /// The background threads' state.
    #[inline]
    pub fn background(&self) -> &crate::pager::instance::background::Background {
        &self.background
    }
    /// The instance's threads, joined by the `Swap`'s drop.
    pub fn threads(&self) -> &StatMutex<Vec<crate::pager::instance::signals::UswapThread>> {
        &self.threads
    }

    /// The process the instance serves.
    pub fn owner(&self) -> i32 {
        self.pid.load(Ordering::Relaxed)
    }

    /// In a forked child that adopts the instance: it serves this process
    /// from now on.
    pub fn serve_this_process(&self) {
        // SAFETY: getpid has no preconditions.
        self.pid.store(unsafe { libc::getpid() }, Ordering::Relaxed);
    }

    /// This process forked: pages may be shared with the child from now
    /// on (`shared_after_fork`).
    pub fn note_fork(&self) {
        self.forked.store(true, Ordering::Relaxed);
    }

    /// A new handle (a region) keeps the instance alive.
    pub fn add_user(&self) {
        self.users.fetch_add(1, Ordering::Relaxed);
    }

    /// Take ids for a region of `pages` pages, `ids` of them (whole
    /// chunks): the first id, and the first id of them that was never
    /// handed out before (from there on, states read NEVER already).
    /// Refused, with the most pages and the pages free, past the limit on
    /// mapped pages or when no free range is long enough.
    pub fn take_ids(&self, pages: usize, ids: usize) -> Result<(u32, u32), (usize, usize)> {
        let mut guard = self.ids.lock();
        let (mapped, max) = (guard.mapped, guard.max);
        let free_ids = &mut guard.free;
        let at = free_ids.iter().position(|r| r.1 as usize >= ids);
        let Some(i) = at.filter(|_| mapped + pages <= max) else {
            return Err((max, max - mapped));
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
        Ok((start, fresh))
    }
}

impl Inner {
    /// Tell the domain, if any, what this process holds (`reclaims`: a
    /// reclaimer of its runs), and take the share it gives.  True when
    /// the share changed.
    ///
    /// Also where a dwell of probation ends (`Budget::end_dwell`), for an
    /// instance in a domain or not: the reclaimer comes here every pass,
    /// faults every 64th fault.
    pub fn tell_domain(&self, resident: usize, reclaims: bool) -> bool {
        let ended = self.budget().end_dwell_if_due();
        let Some(m) = self.member() else {
            return ended;
        };
        // The domain's dwell, which `--budget auto` turns on and off.
        self.budget()
            .set_dwell(m.dwell().map_or(0, |d| d.as_nanos() as u64));
        let devices = &self.backing().devices;
        m.publish(&crate::domain::Holding {
            resident,
            staged: self.budget().staged(),
            probation: self.budget().on_probation_now(),
            faults: self.counters().faults.get(),
            ram: devices.iter().map(|d| d.ram_pages()).sum(),
            store: devices.iter().map(|d| d.store_pages()).sum(),
            stall_ns: self.registry.stall_some_ns(),
            swapins: self.counters().swapins.get(),
            hits: self.counters().swapcache_hits.get(),
            reclaims,
        });
        match m.share() {
            Some(share) if share != self.budget().wanted() => {
                self.budget().share(share);
                true
            }
            _ => false,
        }
    }

    /// Publish the levels a reader of the statistics block wants: each
    /// pass the cheap ones (atomics this instance keeps anyway); with
    /// `slow`, every 100 ms, those that take a device lock or read
    /// `/proc`.  Also moves the pressure averages on.
    pub fn publish_levels(&self, resident: usize, slow: bool) {
        let l = &self.counters.levels;
        l.resident.set(resident as u64);
        l.resident_peak.set(self.budget.peak(resident) as u64);
        l.share.set(self.budget.wanted() as u64);
        l.staged_now.set(self.budget.staged() as u64);
        self.registry.update_pressure();
        if !slow {
            return;
        }
        let space = &self.backing.space;
        l.swapped.set(space.total_slots().saturating_sub(space.nr_free()));
        l.swap_total.set(space.total_slots());
        l.mapped.set(self.ids.lock().mapped as u64);
        for (i, (d, io)) in space
            .devices()
            .iter()
            .zip(self.backing.devices.iter())
            .enumerate()
        {
            let kind = match io.kind() {
                crate::io::BackendKind::Ram => 1,
                crate::io::BackendKind::File => 2,
                crate::io::BackendKind::Compressed => 3,
                crate::io::BackendKind::Remote => 4,
            };
            // Less the header slot, which is never handed out.
            self.registry
                .device_level(i, kind, d.pages(), d.inuse().saturating_sub(1));
        }
        // The program's threads that touch swapped memory, for "full".
        l.threads.set(self.registry.active_threads());
    }

    /// Whether page `id`, whose claim the caller (an evictor) has just
    /// taken, is pinned, or the instance stopped paging: then it must
    /// stay.  The fence pairs with the one in `Region::pin`: either this
    /// sees the pin, or the pinner sees the claim and lets go.
    #[inline]
    pub fn pinned(&self, id: u32) -> bool {
        // The fence is `paging_stopped`'s, before both loads.
        self.paging_stopped() || self.pins[id as usize].load(Ordering::Relaxed) != 0
    }

    /// Whether this instance stopped paging (`bring::unpage`), for an
    /// evictor that has just taken a claim: then every page stays.  Its
    /// flag is stored, then fenced, before the walk that brings pages
    /// in, so that a claim either sees it here or is seen by the walk,
    /// as a pin is.  A 2 MB unit's evictor, which looks at no pin, asks
    /// this alone.
    #[inline]
    pub fn paging_stopped(&self) -> bool {
        std::sync::atomic::fence(Ordering::SeqCst);
        self.budget().held_for_good()
    }

    /// Ids `start..start + len` are free again, and the `pages` pages of
    /// the region that held them no longer mapped.
    pub fn free_ids(&self, start: u32, len: u32, pages: usize) {
        let mut guard = self.ids.lock();
        guard.mapped -= pages;
        let ids = &mut guard.free;
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
    pub fn staged_count(&self) -> usize {
        self.budget.staged()
    }

    /// Discard staging frames (their contents are on swap or were clean)
    /// and return them to the pool: one `process_madvise` for the batch,
    /// so one TLB flush instead of one per frame.
    pub fn retire_frames(&self, frames: &[u32]) {
        self.frames.staging.retire(frames);
    }

    pub fn discard_frames(&self, frames: &[u32]) {
        self.frames.staging.discard_and_put(frames);
    }

    /// Whether a device is a swap file.
    pub fn has_file_device(&self) -> bool {
        self.backing.devices.iter().any(|d| d.has_file())
    }

    /// `UFFDIO_MOVE` refused to move the page at `addr` out: count it, and
    /// say once per reason why such pages stay resident.
    pub fn unevictable(&self, addr: u64, errno: Option<i32>) {
        self.counters.unevictable.inc();
        let first = match errno {
            Some(libc::EBUSY) => &self.reports.pinned,
            Some(libc::EINVAL) => &self.reports.locked,
            _ => &self.reports.refused,
        };
        if !first.load(Ordering::Relaxed) {
            // The first of its kind, as the line below says it.
            self.registry.event(crate::stats::EventKind::Unevictable, addr);
        }
        match errno {
            Some(libc::EBUSY) => report::once(
                &self.reports.pinned,
                format_args!("uswap: the page at {addr:#x} cannot be evicted: it is pinned (O_DIRECT IO, io_uring fixed buffers, RDMA) or shared (with a forked child, or by KSM); pages like it stay resident while they are, counted as unevictable"),
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

    /// Whether this process has forked since the instance was built.
    pub fn shared_after_fork(&self) -> bool {
        self.forked.load(Ordering::Relaxed)
    }

    /// Whether this is the process the instance serves (false in a child
    /// that did not adopt it, fork.rs).
    pub fn same_process(&self) -> bool {
        // SAFETY: getpid has no preconditions.
        self.pid.load(Ordering::Relaxed) == unsafe { libc::getpid() }
    }

    /// A handle went away; true when it was the last, and the threads are
    /// told to stop.
    pub fn release_user(&self) -> bool {
        if self.users.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.shutdown.store(true, Ordering::Release);
            // The prefetcher may be waiting for work: it stops now.
            self.prefetch.wake();
            return true;
        }
        false
    }

    pub fn upgrade(w: &Weak<Inner>) -> Option<Arc<Inner>> {
        let a = w.upgrade()?;
        (!a.shutdown.load(Ordering::Relaxed)).then_some(a)
    }
}

impl Inner {
    /// A transition could not be done now (the kernel refused an install for
    /// the moment: a persistent `EAGAIN`, `ENOMEM`): the claim goes, the page
    /// stays as it was, and the access retries after a pause.
    #[cold]
    pub fn retry_later(&self, claim: PageClaim<'_>, errno: Option<i32>) -> bool {
        drop(claim);
        self.retry_pause(errno);
        true
    }

    /// Count, say once, and pause before an install is tried again.
    #[cold]
    pub fn retry_pause(&self, errno: Option<i32>) {
        self.counters.install_retries.inc();
        report::once(
            &self.reports.install_retry,
            format_args!(
                "uswap: installing a page failed for now (errno {}); the access is retried",
                errno.unwrap_or(0)
            ),
        );
        page::pause();
    }
}

/// The pace's batch eviction, one fault at a time: released on drop.
pub(crate) struct Pacing<'a>(&'a AtomicBool);

impl Drop for Pacing<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}
