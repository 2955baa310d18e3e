//! One instance's shared state ([`Inner`]), in named parts: its frames
//! (staging, bounce and unit pools), its budget (resident and staged
//! counts, the watermarks) and its backing (swap space, IO devices, swap
//! cache, writeback's pause).  And the operations on pages that both the
//! fault and the reclaim paths use: the userfaultfd moves and copies with
//! their test hooks, slot frees, the retry pause.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use super::frames::{FramePool, Mapping, UnitPool};
use super::page::{self, PageClaim, UNIT_PAGES};
use super::report;
use crate::io::IoDevice;
use crate::lru::Lru;
use crate::stats::{Counter, CounterId, Gauge, GaugeId, Registry, StatMutex};
use crate::swap_cache::SwapCache;
use crate::swap_space::{SwapEntry, SwapSpace};
use crate::uffd::{Uffd, UffdError};
use crate::PAGE_SIZE;

pub(crate) struct Counters {
    pub faults: Arc<Counter>,
    pub zero_fills: Arc<Counter>,
    pub swapins: Arc<Counter>,
    pub huge_swapins: Arc<Counter>,
    pub huge_swapouts: Arc<Counter>,
    pub huge_fallbacks: Arc<Counter>,
    pub move_fallbacks: Arc<Counter>,
    pub staged: Arc<Counter>,
    pub evict_moves: Arc<Counter>,
    pub swapcache_hits: Arc<Counter>,
    pub wp_faults: Arc<Counter>,
    pub evictions: Arc<Counter>,
    pub evict_clean: Arc<Counter>,
    pub evict_write: Arc<Counter>,
    pub evict_zero: Arc<Counter>,
    pub install_retries: Arc<Counter>,
    pub overrun: Arc<Counter>,
    pub swap_full: Arc<Counter>,
    pub write_errors: Arc<Counter>,
    pub read_errors: Arc<Counter>,
    pub direct_reclaim: Arc<Counter>,
    pub busy_waits: Arc<Counter>,
    pub unevictable: Arc<Counter>,
    pub discarded: Arc<Counter>,
    pub swapout_retries: Arc<Counter>,
    /// Sealed pages copied out and dropped in a batch (evict.rs).
    pub evict_copies: Arc<Counter>,
    /// Runs of pages a fork had shared, made the process's own again
    /// before their eviction (evict.rs, `unshare`).
    pub evict_unshared: Arc<Counter>,
    pub swapin_retries: Arc<Counter>,
    pub readahead: Arc<Counter>,
    pub fault_around: Arc<Counter>,
    pub prefetched: Arc<Counter>,
    /// Nanoseconds spent serving faults: in the SIGBUS handler from the
    /// page's lookup to the install, or in a handler thread per event
    /// (neither counts the kernel's delivery or the wake-up).
    pub fault_ns: Arc<Counter>,
    /// The levels the background reclaimer publishes (`publish_levels`).
    pub levels: Levels,
}

/// Levels kept in the statistics block for readers in other processes,
/// set by the background reclaimer on each pass (the cheap ones) or every
/// 100 ms (those that take a lock or read /proc).
pub(crate) struct Levels {
    pub budget: Arc<Gauge>,
    pub share: Arc<Gauge>,
    pub resident: Arc<Gauge>,
    pub resident_peak: Arc<Gauge>,
    pub staged_now: Arc<Gauge>,
    pub mapped: Arc<Gauge>,
    pub swapped: Arc<Gauge>,
    pub swap_total: Arc<Gauge>,
    pub threads: Arc<Gauge>,
}

impl Counters {
    pub fn new(r: &Registry) -> Self {
        Counters {
            faults: r.counter(CounterId::FAULTS),
            zero_fills: r.counter(CounterId::ZERO_FILLS),
            swapins: r.counter(CounterId::SWAPINS),
            huge_swapins: r.counter(CounterId::HUGE_SWAPINS),
            huge_swapouts: r.counter(CounterId::HUGE_SWAPOUTS),
            huge_fallbacks: r.counter(CounterId::HUGE_FALLBACKS),
            move_fallbacks: r.counter(CounterId::MOVE_FALLBACKS),
            staged: r.counter(CounterId::STAGED),
            evict_moves: r.counter(CounterId::EVICT_MOVES),
            swapcache_hits: r.counter(CounterId::SWAPCACHE_HITS),
            wp_faults: r.counter(CounterId::WP_FAULTS),
            evictions: r.counter(CounterId::EVICTIONS),
            evict_clean: r.counter(CounterId::EVICT_CLEAN),
            evict_write: r.counter(CounterId::EVICT_WRITE),
            evict_zero: r.counter(CounterId::EVICT_ZERO),
            install_retries: r.counter(CounterId::INSTALL_RETRIES),
            overrun: r.counter(CounterId::BUDGET_OVERRUN),
            swap_full: r.counter(CounterId::SWAP_FULL),
            write_errors: r.counter(CounterId::SWAPOUT_ERRORS),
            read_errors: r.counter(CounterId::SWAPIN_ERRORS),
            direct_reclaim: r.counter(CounterId::DIRECT_RECLAIM),
            busy_waits: r.counter(CounterId::BUSY_WAITS),
            unevictable: r.counter(CounterId::UNEVICTABLE),
            discarded: r.counter(CounterId::DISCARDED),
            swapout_retries: r.counter(CounterId::SWAPOUT_RETRIES),
            evict_copies: r.counter(CounterId::EVICT_COPIES),
            evict_unshared: r.counter(CounterId::EVICT_UNSHARED),
            swapin_retries: r.counter(CounterId::SWAPIN_RETRIES),
            readahead: r.counter(CounterId::READAHEAD),
            fault_around: r.counter(CounterId::FAULT_AROUND),
            prefetched: r.counter(CounterId::PREFETCHED),
            fault_ns: r.counter(CounterId::FAULT_NS),
            levels: Levels {
                budget: r.gauge(GaugeId::BUDGET),
                share: r.gauge(GaugeId::SHARE),
                resident: r.gauge(GaugeId::RESIDENT),
                resident_peak: r.gauge(GaugeId::RESIDENT_PEAK),
                staged_now: r.gauge(GaugeId::STAGED_NOW),
                mapped: r.gauge(GaugeId::MAPPED),
                swapped: r.gauge(GaugeId::SWAPPED),
                swap_total: r.gauge(GaugeId::SWAP_TOTAL),
                threads: r.gauge(GaugeId::THREADS),
            },
        }
    }
}

/// The shared state of one instance.  Regions and the entry's threads
/// refer to it; it lives while the `Swap` handle or any region does.
pub(crate) struct Inner {
    pub uffd: Uffd,
    pub lru: Lru,
    /// Per page id: the page state word (see page.rs).
    pub states: Box<[AtomicU64]>,
    /// Page id -> the page's address (0 when no region holds the id).
    pub addrs: super::addrs::PageAddrs,
    /// Per page id: pins held on the page (`Region::pin`): a pinned page
    /// is resident and is not evicted.  The pinner raises it and then
    /// checks the state; an evictor claims the page and then checks it,
    /// each with a SeqCst fence between (`pinned`): one of the two sees
    /// the other.
    pub pins: Box<[AtomicU32]>,
    /// Page ids: free ranges and pages mapped; only map and unmap touch
    /// them.
    pub ids: StatMutex<PageIds>,
    pub frames: Frames,
    pub budget: Budget,
    pub backing: Backing,
    /// Swap-in readahead on (`SwapBuilder::readahead`).
    pub readahead: bool,
    /// Every small page evicted with its own `UFFDIO_MOVE`
    /// (`SwapBuilder::per_page_evict`), not in batches.
    pub per_page_evict: bool,
    /// Drops clean victims in place, a batch per system call.
    pub discarder: crate::sys::Discarder,
    /// Readahead handed to the prefetcher thread (swap files).
    pub prefetch: Prefetch,
    /// Set when the last handle (the `Swap` or a region) goes: the threads
    /// stop.  A thread's own reference cannot tell, as several threads
    /// holding one each would keep each other alive forever.
    pub shutdown: AtomicBool,
    /// Handles alive: the `Swap` and every region.
    pub users: AtomicUsize,
    /// The process the instance serves: the one that built it, or a
    /// forked child that adopted its copy (fork.rs).  In a child that did
    /// not (a raw `clone`), the inherited descriptor still speaks for the
    /// parent's memory, so nothing may be done with it.
    pub pid: std::sync::atomic::AtomicI32,
    /// The instance's threads (handler, prefetcher, reclaimer), joined by
    /// the `Swap`'s drop; replaced in a forked child, which has none of
    /// its parent's threads.
    pub threads: StatMutex<Vec<super::signals::UswapThread>>,
    /// What threads to start (at build, and again in a forked child).
    pub spawn: Spawn,
    /// Which once-only lines have been said.
    pub reports: Reports,
    /// This process has forked since the instance was built: a page
    /// `UFFDIO_MOVE` refuses as shared may be one the fork shared
    /// (evict.rs, `unshare`).
    pub forked: AtomicBool,
    /// This instance's membership of a budget domain: its reclaimer
    /// publishes what it holds there and takes its budget from there.
    pub member: Option<Arc<crate::domain::Member>>,
    /// Test hooks: failures to inject into the userfaultfd calls.
    #[cfg(test)]
    pub inject: Inject,
    pub counters: Counters,
    pub registry: Arc<Registry>,
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
pub(crate) struct PageIds {
    /// Free id ranges (start, len), sorted and merged: at most one more
    /// than there are regions.  A region takes whole chunks of ids
    /// (addrs.rs), so a range's start is a chunk's.
    pub free: Vec<(u32, u32)>,
    /// Pages the regions span now, and at most (`max_mapped`): the limit
    /// counts pages, not the chunks' ids.
    pub mapped: usize,
    pub max: usize,
    /// Ids from here on were never handed to a region: their states read
    /// zero (NEVER) still, and `map` need not look at them.  Reading the
    /// state of every page of a fresh heap the size of the machine's
    /// memory (6 M pages, 48 MiB of table, 12 K faults on the zero page)
    /// was most of a process's start under `uswap run`: 20 ms of each
    /// `/bin/true` a shell ran.
    pub fresh: u32,
}

/// What is resident against what may be.  The four bounds change together
/// when the budget does (`Swap::set_budget`), each an atomic of its own:
/// a reader that sees a mix of old and new bounds for an instant reclaims
/// a little more or less than it would have, nothing worse.
pub(crate) struct Budget {
    /// Resident pages at most: the background reclaimer keeps them
    /// under `low`, and a fault that finds `limit + slack` or more
    /// reclaims first.
    limit: AtomicUsize,
    /// How far faults may run over `limit` before one reclaims itself:
    /// one eviction batch while the background reclaimer runs (eviction
    /// stays off the fault path unless the reclaimer falls a batch
    /// behind), none without it.
    slack: AtomicUsize,
    /// The background reclaimer's target: resident pages down to this.
    low: AtomicUsize,
    /// How far past `limit` faults may take the resident set when nothing
    /// can be evicted, before the process is killed (`overrun.rs`);
    /// `usize::MAX`: no bound.
    max_overrun: AtomicUsize,
    /// What `max_overrun` is made from, for a new budget.
    pub overrun: super::overrun::Overrun,
    /// The slack at most: an eviction batch while a background reclaimer
    /// runs, else 0.
    pub slack_max: usize,
    /// Pages resident now, staged ones included.
    pub resident: AtomicUsize,
    /// The most pages resident the background reclaimer has seen (it
    /// looks every pass, at least every millisecond).
    pub peak: AtomicUsize,
    /// Pages staged now; counted in `resident` too.
    pub staged: AtomicUsize,
    /// Staged pages kept in memory before writeback starts: half the
    /// staging frames.
    pub staging_target: usize,
}

impl Budget {
    /// A budget of `limit` pages (at least 64).
    pub fn new(
        limit: usize,
        slack_max: usize,
        overrun: super::overrun::Overrun,
        staging_target: usize,
    ) -> Budget {
        let b = Budget {
            limit: AtomicUsize::new(0),
            slack: AtomicUsize::new(0),
            low: AtomicUsize::new(0),
            max_overrun: AtomicUsize::new(0),
            overrun,
            slack_max,
            resident: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            staged: AtomicUsize::new(0),
            staging_target,
        };
        b.set(limit);
        b
    }

    /// Make `limit` pages the budget; the bounds made from it follow.
    pub fn set(&self, limit: usize) {
        self.max_overrun
            .store(self.overrun.pages(limit), Ordering::Relaxed);
        self.share(limit);
    }

    /// Make `limit` pages this instance's share of a domain's budget: the
    /// watermarks follow, the overrun stays the domain budget's (a share
    /// cut to a few pages must not make a full swap space fatal at once).
    pub fn share(&self, limit: usize) {
        self.slack
            .store(self.slack_max.min(limit / 16), Ordering::Relaxed);
        self.low
            .store(limit - (limit / 16).max(32).min(limit / 2), Ordering::Relaxed);
        self.limit.store(limit, Ordering::Release);
    }

    pub fn limit(&self) -> usize {
        self.limit.load(Ordering::Relaxed)
    }

    pub fn slack(&self) -> usize {
        self.slack.load(Ordering::Relaxed)
    }

    pub fn low(&self) -> usize {
        self.low.load(Ordering::Relaxed)
    }

    pub fn max_overrun(&self) -> usize {
        self.max_overrun.load(Ordering::Relaxed)
    }
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
    pub hold: super::held::Hold,
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
}

/// The threads an instance runs.
pub(crate) struct Spawn {
    /// Handler threads (handler-thread mode), 0 in SIGBUS mode.
    pub handlers: usize,
    /// A background reclaimer.
    pub reclaimer: bool,
    /// The reclaimer watches signal set-up (SIGBUS mode).
    pub watching: bool,
}

/// Writeback's pause after transient write errors.
#[derive(Default)]
pub(crate) struct Backoff {
    /// No writes before this `CLOCK_MONOTONIC` nanosecond (0: none).
    pub hold_until: AtomicU64,
    /// The current pause; 0 while writes work.
    pub backoff_ns: AtomicU64,
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
    pub move_out: (AtomicUsize, AtomicUsize, std::sync::atomic::AtomicI32),
    /// Moves into regions.
    pub move_in: (AtomicUsize, AtomicUsize, std::sync::atomic::AtomicI32),
    /// The copies that finish a move in that failed.
    pub copy_in: (AtomicUsize, std::sync::atomic::AtomicI32),
    /// 1: the next install stops, claim held, at 2 until this is 0.
    pub gate: std::sync::atomic::AtomicU32,
}

#[cfg(test)]
impl Inject {
    /// Take one injected failure of `(count, partial pages, errno)`.
    pub fn take_move(f: &(AtomicUsize, AtomicUsize, std::sync::atomic::AtomicI32)) -> Option<(u64, i32)> {
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
    pub fn gate(&self) {
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

impl Inner {
    /// Publish the levels a reader of the statistics block wants: each
    /// pass the cheap ones (atomics this instance keeps anyway); with
    /// `slow`, every 100 ms, those that take a device lock or read
    /// `/proc`.  Also moves the pressure averages on.
    pub fn publish_levels(&self, resident: usize, slow: bool) {
        let l = &self.counters.levels;
        l.resident.set(resident as u64);
        l.resident_peak
            .set(self.budget.peak.load(Ordering::Relaxed).max(resident) as u64);
        l.share.set(self.budget.limit() as u64);
        l.staged_now
            .set(self.budget.staged.load(Ordering::Relaxed) as u64);
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
            };
            // Less the header slot, which is never handed out.
            self.registry
                .device_level(i, kind, d.pages(), d.inuse().saturating_sub(1));
        }
        // The program's threads that touch swapped memory, for "full".
        l.threads.set(self.registry.active_threads());
    }

    /// Whether page `id`, whose claim the caller (an evictor) has just
    /// taken, is pinned: then it must stay.  The fence pairs with the one
    /// in `Region::pin`: either this sees the pin, or the pinner sees the
    /// claim and lets go.
    #[inline]
    pub fn pinned(&self, id: u32) -> bool {
        std::sync::atomic::fence(Ordering::SeqCst);
        self.pins[id as usize].load(Ordering::Relaxed) != 0
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
        self.budget.staged.load(Ordering::Relaxed)
    }

    /// Discard staging frames (their contents are on swap or were clean)
    /// and return them to the pool: one `process_madvise` for the batch,
    /// so one TLB flush instead of one per frame.
    pub fn discard_frames(&self, frames: &[u32]) {
        if frames.is_empty() {
            return;
        }
        self.frames.staging.discard_batch(frames);
        for &f in frames {
            self.frames.staging.put(f);
        }
    }

    /// Move `len` bytes of pages from region memory at `src` into our
    /// staging memory at `dst`: all of them, or `Err((moved, why))` with
    /// the prefix that did move.
    pub fn move_out(&self, dst: u64, src: u64, len: u64) -> Result<(), (u64, UffdError)> {
        self.move_all(Dir::Out, dst, src, len)
    }

    /// Put `len` bytes of pages from our memory at `src` back into a region
    /// at `dst` (missing there): moved, and what will not move copied.
    /// `Ok(true)` when some were copied (their source still holds them and
    /// must be discarded before it is reused); `Err((done, why))` when
    /// neither worked past `done` bytes.
    pub fn move_in(&self, dst: u64, src: u64, len: u64) -> Result<bool, (u64, UffdError)> {
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
        #[cfg(test)]
        {
            let f = match dir {
                Dir::Out => &self.inject.move_out,
                Dir::In => &self.inject.move_in,
            };
            if let Some((partial, errno)) = Inject::take_move(f) {
                // A failed move stops short of its end, as the kernel's
                // does (a whole move is a success): the soak found a hook
                // that "failed" after moving everything.
                let partial = partial.min(len.saturating_sub(PAGE_SIZE as u64));
                if partial > 0 {
                    self.move_run(dst, src, partial)?;
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
        self.move_run(dst, src, len)
    }

    /// `UFFDIO_MOVE` of `len` bytes, continued past partial moves.
    fn move_run(&self, dst: u64, src: u64, len: u64) -> Result<(), (u64, UffdError)> {
        let mut done = 0;
        while done < len {
            // SAFETY: the pager moves only pages it holds the claim of
            // (region pages, whose contents are the pager's to move while
            // claimed) to or from its own staging memory, which no one
            // else refers to.
            let moved = unsafe {
                self.uffd
                    .move_pages(dst + done, src + done, len - done, true, false)
            };
            match moved {
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

    /// `UFFDIO_COPY` of `len` bytes into a region (missing there), to the
    /// end, write-protected when `wp`; wakes the threads waiting there.
    /// On failure, how far it got and why.
    pub fn copy(&self, dst: u64, src: *const u8, len: u64, wp: bool) -> Result<(), (u64, UffdError)> {
        let mut done = 0;
        while done < len {
            // SAFETY: the pager copies only into missing pages it holds
            // the claim of, from its own frames (readable for `len`).
            let copied = unsafe {
                self.uffd
                    .copy(dst + done, src.wrapping_add(done as usize), len - done, wp, true)
            };
            match copied {
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
    pub fn copy_zero(&self, page: u64, wp: bool) -> Result<(), UffdError> {
        self.copy(page, self.frames.zero.addr() as *const u8, PAGE_SIZE as u64, wp)
            .map_err(|(_, e)| e)
    }

    /// Whether an install into a region failed because the program
    /// unmapped the destination (`ENOENT` from a copy: no registered
    /// mapping there any more).
    pub fn region_gone(e: &UffdError) -> bool {
        e.errno() == Some(libc::ENOENT)
    }

    /// Free slot `e`.  Every slot the pager frees is one it allocated and
    /// holds one reference to, so a refusal is a bookkeeping bug.  Around
    /// a fork (fork.rs): a slot on a swap file that a child may still read
    /// waits for the child; a forked child leaves the swap files' slots to
    /// its parent.
    pub fn free_slot(&self, e: SwapEntry) {
        if self.parents_slot(e) || self.backing.hold.defer(e, false) {
            return;
        }
        self.discard_if_last(e, 1);
        let freed = self.backing.space.free(e);
        debug_assert!(freed.is_ok(), "freeing {e:?}: {freed:?}");
    }

    /// Before the last reference to slots `e..e + pages` goes, let a
    /// device that keeps memory per slot (compressed) drop it, and an
    /// encrypted file forget the slot's seal (its block is then noise to
    /// everyone: how freed slots are scrubbed): before, so that no one
    /// has the slot allocated again meanwhile.  A slot still
    /// referenced elsewhere (a forked child's share) keeps its page.
    fn discard_if_last(&self, e: SwapEntry, pages: u64) {
        let dev = &self.backing.devices[e.device() as usize];
        if !dev.discards() {
            return;
        }
        for off in e.offset()..e.offset() + pages {
            let slot = SwapEntry::new(e.device(), off);
            if self.backing.space.count(slot) == Ok(1) {
                dev.discard(off, 1);
            }
        }
    }

    /// Free the whole cluster of a 2 MB unit, as `free_slot` does a slot.
    pub fn free_huge(&self, e: SwapEntry) {
        if self.parents_slot(e) || self.backing.hold.defer(e, true) {
            return;
        }
        self.discard_if_last(e, crate::swap_space::CLUSTER_SLOTS);
        let freed = self.backing.space.free_huge(e);
        debug_assert!(freed.is_ok(), "freeing unit {e:?}: {freed:?}");
    }

    /// Whether `e` is a swap-file slot of this forked child's parent
    /// (all of them until the child has files of its own; then those it
    /// did not write there), which the child never frees.
    fn parents_slot(&self, e: SwapEntry) -> bool {
        let d = &self.backing.devices[e.device() as usize];
        d.has_file() && (self.backing.closed.load(Ordering::Relaxed) || !d.owns(e.offset()))
    }

    /// In a forked child whose swap files are its parent's and that has
    /// pages to swap out: make it files of its own, and open allocation
    /// (io/file.rs, "A forked child's files of its own").  Once: a
    /// failure (no room for the files) is said in one line, and the
    /// child's dirty pages stay resident as before.  From the reclaimer,
    /// never the fault path: it creates files and allocates.
    pub fn open_layers(&self) {
        if !self.backing.layerable.load(Ordering::Relaxed)
            || self.backing.layers_tried.swap(true, Ordering::Relaxed)
        {
            return;
        }
        for d in self.backing.devices.iter().filter(|d| d.has_file()) {
            if let Err(e) = d.open_layer() {
                self.registry.event(crate::stats::EventKind::ChildFileFailed, 0);
                super::report::line(format_args!(
                    "uswap: a forked child cannot make a swap file of its own ({e}); its memory stays resident"
                ));
                // Faults waiting for it (reclaim.rs's `hold_to_bound`) go on.
                self.backing.layerable.store(false, Ordering::Release);
                return;
            }
        }
        self.backing.closed.store(false, Ordering::Release);
    }

    /// A slot for a page going out; `Full` in a forked child whose
    /// swap files are its parent's.
    pub fn alloc_slot(&self) -> Result<SwapEntry, crate::swap_space::SwapError> {
        if self.backing.closed.load(Ordering::Relaxed) {
            return Err(crate::swap_space::SwapError::Full {
                slots: self.backing.space.total_slots(),
            });
        }
        let e = self.backing.space.alloc()?;
        self.backing.devices[e.device() as usize].allocated(e.offset(), 1);
        Ok(e)
    }

    /// A whole cluster for a 2 MB unit, as `alloc_slot`.
    pub fn alloc_unit_slots(&self) -> Result<SwapEntry, crate::swap_space::SwapError> {
        if self.backing.closed.load(Ordering::Relaxed) {
            return Err(crate::swap_space::SwapError::Full {
                slots: self.backing.space.total_slots(),
            });
        }
        let e = self.backing.space.alloc_huge()?;
        self.backing.devices[e.device() as usize].allocated(e.offset(), crate::swap_space::CLUSTER_SLOTS);
        Ok(e)
    }

    /// Whether no slot is to be had for a page going out.
    pub fn no_free_slots(&self) -> bool {
        self.backing.closed.load(Ordering::Relaxed) || self.backing.space.nr_free() == 0
    }

    /// Whether a device is a swap file.
    pub fn has_file_device(&self) -> bool {
        self.backing.devices.iter().any(|d| d.has_file())
    }

    /// The staging frame a staged page's slot `e` holds (claimed by the
    /// caller, so the entry is there).
    pub fn staged_frame(&self, e: SwapEntry) -> u32 {
        let h = self
            .backing
            .swap_cache
            .lookup(e)
            .expect("a staged page is in the swap cache");
        (h.get() - 1) as u32
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

    /// The slot of page `i` of a split unit whose head word is `w`.
    pub fn split_slot(&self, head: u32, i: usize, w: u64) -> SwapEntry {
        // The head's own word is claimed by the caller (its slot is in `w`);
        // the others hold only their slots.
        let word = if i == 0 {
            w
        } else {
            self.states[head as usize + i].load(Ordering::Acquire)
        };
        page::slot(word).expect("a split unit has a slot per page")
    }

    /// Free the slots of swapped unit `head` (state `w`).
    pub fn free_unit_slots(&self, head: u32, w: u64) {
        if page::kind(w) != page::SWAPPED {
            return;
        }
        if w & page::WHOLE != 0 {
            if let Some(e) = page::slot(w) {
                self.free_huge(e);
            }
            return;
        }
        for i in 0..UNIT_PAGES {
            if let Some(e) = page::slot(if i == 0 {
                w
            } else {
                self.states[head as usize + i].load(Ordering::Acquire)
            }) {
                self.free_slot(e);
            }
            if i > 0 {
                self.states[head as usize + i].store(page::NEVER, Ordering::Release);
            }
        }
    }
}

/// Staged pages in FIFO order, each with the slot it was staged to.  An
/// entry is live while its page is staged to that slot; it goes stale when
/// the page is touched (moved back) or its region goes away, and popping
/// skips stale entries.  The ring holds twice the staging frames; when it
/// fills with stale entries it is compacted.
pub(crate) struct StagedRing {
    /// Oldest first: (page id, raw slot).  Never grows past `cap`, which
    /// its allocation holds: pushing allocates nothing.
    ids: VecDeque<(u32, u64)>,
    cap: usize,
}

impl StagedRing {
    pub fn new(cap: usize) -> Self {
        let cap = cap.max(2);
        StagedRing {
            ids: VecDeque::with_capacity(cap),
            cap,
        }
    }

    pub fn push(&mut self, id: u32, slot: SwapEntry) -> bool {
        if self.ids.len() == self.cap {
            return false;
        }
        self.ids.push_back((id, slot.raw()));
        true
    }

    pub fn pop(&mut self) -> Option<(u32, u64)> {
        self.ids.pop_front()
    }

    /// Pop the oldest entry and those after it that continue it as a run:
    /// the next page id on the next slot (a run staged together), as many
    /// as `out` holds.  Returns how many.
    pub fn pop_run(&mut self, out: &mut [(u32, u64)]) -> usize {
        let mut n = 0;
        while n < out.len() {
            let Some(&e) = self.ids.front() else {
                break;
            };
            if n > 0 && (e.0 != out[n - 1].0 + 1 || e.1 != out[n - 1].1 + 1) {
                break;
            }
            out[n] = e;
            n += 1;
            self.ids.pop_front();
        }
        n
    }

    /// Keep only the entries `live` accepts, in order.
    pub fn compact(&mut self, live: impl Fn(u32, u64) -> bool) {
        self.ids.retain(|&(id, slot)| live(id, slot));
    }
}

/// Readahead the prefetcher thread does while faulting threads go on:
/// the next window of a sequential reader of a swap file, read while the
/// program uses the window read before it (the kernel's asynchronous
/// readahead).  Requests are advice: when the queue is full a new one is
/// dropped.
pub(crate) struct Prefetch {
    /// Whether there is a prefetcher (a file device, readahead on).
    pub on: bool,
    /// Requests, oldest first; a plain mutex, a leaf: held only to push or
    /// pop, never while touching region memory, and only inside the fork
    /// gate (a child must not inherit it held).
    pub queue: std::sync::Mutex<PrefetchQueue>,
    /// Bumped by every post (and by shutdown): the prefetcher sleeps on
    /// it as a futex word, outside the gate and without the lock.
    pub posted: AtomicU32,
}

/// Requests: (first page id, its address, pages, whether the fault that
/// asked was a write), oldest first.  Never more than
/// [`PrefetchQueue::CAP`], which its allocation holds: posting from the
/// SIGBUS handler allocates nothing.
pub(crate) struct PrefetchQueue {
    reqs: VecDeque<(u32, u64, u32, bool)>,
}

impl PrefetchQueue {
    const CAP: usize = 16;
}

impl Prefetch {
    pub fn new(on: bool) -> Prefetch {
        Prefetch {
            on,
            queue: std::sync::Mutex::new(PrefetchQueue {
                reqs: VecDeque::with_capacity(PrefetchQueue::CAP),
            }),
            posted: AtomicU32::new(0),
        }
    }

    /// Ask for `pages` pages from page `id` at `addr` to be read ahead.
    /// Allocation-free: the SIGBUS handler calls it.
    pub fn post(&self, id: u32, addr: u64, pages: u32, write: bool) {
        let Ok(mut q) = self.queue.lock() else {
            return;
        };
        if q.reqs.len() == PrefetchQueue::CAP {
            return;
        }
        q.reqs.push_back((id, addr, pages, write));
        drop(q);
        self.wake();
    }

    /// Wake the prefetcher (a post, or shutdown).
    pub fn wake(&self) {
        self.posted.fetch_add(1, Ordering::Release);
        crate::sys::futex_wake(self.posted.as_ptr() as usize, 1);
    }

    /// The oldest request, waiting up to `wait` for one: popped inside the
    /// fork gate, waited for outside it.
    pub fn take(&self, wait: std::time::Duration) -> Option<(u32, u64, u32, bool)> {
        let seen = self.posted.load(Ordering::Acquire);
        let pop = || {
            let _inside = super::gate::enter(0);
            self.queue.lock().ok()?.reqs.pop_front()
        };
        if let Some(r) = pop() {
            return Some(r);
        }
        let ts = libc::timespec {
            tv_sec: wait.as_secs() as libc::time_t,
            tv_nsec: wait.subsec_nanos() as libc::c_long,
        };
        // SAFETY: a live word, while it still reads `seen` (a post since
        // then returns at once), for at most `ts`.
        unsafe { crate::sys::futex_wait(self.posted.as_ptr(), seen, Some(&ts)) };
        pop()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Installed {
    /// All moved.
    Moved,
    /// Some moved and the rest copied.
    Copied,
    /// The destination is no longer mapped.
    Gone,
}

impl Inner {
    /// Put `len` bytes of pages from `src` (ours) into the region at `dst`
    /// (missing there), all of them: a move, finished by copying what does
    /// not move, and retried while the kernel refuses for now (ENOMEM).  Half
    /// a unit in place is no state to leave: the faulting thread waits for
    /// memory, as a faulting thread in the kernel would.
    pub fn put_in(&self, dst: u64, src: u64, len: u64) -> Installed {
        let mut done = 0;
        let mut copied = false;
        loop {
            match self.move_in(dst + done, src + done, len - done) {
                Ok(c) => {
                    return if copied || c {
                        Installed::Copied
                    } else {
                        Installed::Moved
                    }
                }
                Err((n, err)) => {
                    copied = true;
                    if Self::region_gone(&err) {
                        return Installed::Gone;
                    }
                    done += n;
                    self.retry_pause(err.errno());
                }
            }
        }
    }
}
