//! [`Swap`]: one instance, the handle a user holds: it maps regions,
//! reports statistics, and changes the budget at run time.

use std::sync::Arc;

use crate::pager::api::error::PagerError;
use crate::pager::api::region::Region;
use crate::pager::entry::sigbus;
use crate::pager::entry::sigbus::FaultMode;
use crate::pager::entry::threads;
use crate::pager::instance::addrs;
use crate::pager::instance::frames::Mapping;
use crate::pager::instance::gate;
use crate::pager::instance::inner::Inner;
use crate::pager::instance::page::{self, PageWord};
use crate::pager::instance::regions;
use crate::pager::instance::signals;
use crate::stats::Stats;
#[cfg(test)]
use crate::swap_space::SwapSpace;
use crate::uffd::RegisterMode;
use crate::PAGE_SIZE;

/// A swap instance: a memory budget, swap devices, and the regions mapped
/// through it.
pub struct Swap {
    pub(crate) inner: Arc<Inner>,
    pub(crate) mode: FaultMode,
}

impl Swap {
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
                owner: inner.owner(),
                // SAFETY: getpid has no preconditions.
                pid: unsafe { libc::getpid() },
            });
        }
        if len == 0 {
            return Err(PagerError::Config("cannot map an empty region".into()));
        }
        let _inside = gate::enter(0);
        if huge && inner.budget().limit() < 2 * page::UNIT_PAGES {
            // One unit being filled and one to evict: with less, a unit
            // would be evicted while it is being written, again and again.
            return Err(PagerError::Config(format!(
                "a budget of {} bytes is too small for 2 MB units: map_huge needs at least two units ({} bytes) of budget (one more for each further thread filling units at once keeps faults from overrunning it); raise the budget or use map",
                inner.budget().limit() * PAGE_SIZE,
                2 * page::UNIT_BYTES
            )));
        }
        if self.mode == FaultMode::Sigbus {
            if signals::sigbus_blocked_here() {
                return Err(PagerError::SigbusBlocked);
            }
            // A SIGBUS handler installed since the last look goes behind
            // ours before the region can fault.
            sigbus::watch(false, &self.inner);
        }
        let pages = len.div_ceil(PAGE_SIZE);
        // The page-id lock is one a program's signal handler could want
        // (through a fault's reclaim, no; but through a nested map, yes).
        let _blocked = signals::SignalsBlocked::asynchronous();
        // Whole chunks of ids (addrs.rs): a region's first id starts one.
        let ids = pages.next_multiple_of(addrs::CHUNK);
        let (id_base, fresh) = inner
            .take_ids(pages, ids)
            .map_err(|(max, free)| PagerError::TooManyPages { pages, max, free })?;
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
                PageWord::NEVER.unit()
            } else {
                PageWord::NEVER
            };
            let st = &inner.states()[id_base as usize + i];
            // Ids never used before read zero (NEVER) already: not
            // storing it leaves the table's untouched pages uncommitted
            // (8 bytes a page: 135 MiB for the 68 GiB heap of uswap run's
            // default at 50% of this machine).
            if st.load() != fresh {
                st.store(fresh);
            }
        }
        inner.addrs().publish(id_base, pages, map.addr());
        // An instance that stopped paging maps plain memory: the kernel
        // serves every fault of it (`Swap::stop_paging`).
        if !inner.budget().held_for_good() {
            if let Err(e) = inner.uffd().register(
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
        }
        let Some(slot) =
            regions::publish_region(map.addr(), map.len() as u64, id_base, Arc::as_ptr(inner), huge)
        else {
            // The mapping is unmapped as `map` drops, registration and all.
            inner.free_ids(id_base, ids as u32, pages);
            return Err(PagerError::TooManyRegions);
        };
        inner.add_user();
        if let Some(m) = inner.member() {
            // Its largest region is its heap, left out of what the
            // domain's arbiter counts as its other memory.
            m.publish_heap(map.addr(), map.addr() + map.len() as u64);
        }
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
        self.inner.registry().snapshot()
    }

    /// How this instance serves faults.
    pub fn fault_mode(&self) -> FaultMode {
        self.mode
    }

    /// Pages resident now, over all regions.
    pub fn resident_pages(&self) -> usize {
        self.inner.budget().resident()
    }

    /// The most pages resident at once, as the background reclaimer saw
    /// it (every pass, at least every millisecond; 0 without one).
    pub fn peak_resident_pages(&self) -> usize {
        self.inner.budget().peak(self.inner.budget().resident())
    }

    /// Whether faults are served through a userfaultfd for user-mode
    /// faults only: SIGBUS mode opened by a process without the privilege
    /// for more (see [`FaultMode::Sigbus`]).  Nothing changes for the
    /// program: a system call that touches a missing page fails with
    /// `EFAULT` in SIGBUS mode either way.
    pub fn user_mode_only(&self) -> bool {
        self.inner.uffd().user_mode_only()
    }

    /// The budget in pages (the one asked for, while the memory is held
    /// in for a reader: [`Swap::hold_in`]).
    pub fn budget_pages(&self) -> usize {
        self.inner.budget().wanted()
    }

    /// Bring every page that is out back in, up to `most_bytes`, and keep
    /// it in, the budget held open, until [`Swap::let_go`]: for a reader
    /// the fault path never sees (a debugger reading `/proc/PID/mem`, the
    /// kernel writing a core file; `fault/bring.rs`).  Returns the bytes
    /// brought in.  Allocation-free and lock-free outside the fault
    /// path's own locks: a fatal signal's handler may call it.
    pub fn hold_in(&self, most_bytes: u64) -> u64 {
        let most = usize::try_from(most_bytes / PAGE_SIZE as u64).unwrap_or(usize::MAX);
        crate::pager::fault::bring::hold_and_bring_in(&self.inner, most) as u64 * PAGE_SIZE as u64
    }

    /// Stop paging, for good: every page that is out brought in, the
    /// budget held open from now on, and the regions left to the kernel
    /// as ordinary private memory (no longer registered with the
    /// userfaultfd; regions mapped later are not either).  For a program
    /// whose buffers the kernel reads and writes later, from its own
    /// workers (io_uring, kernel AIO), where SIGBUS mode cannot serve a
    /// page that is out, or one never written (`uswap run`'s system-call
    /// guard calls it at the program's first `io_uring_setup` or
    /// `io_setup`).  Allocation-free: a signal handler may call it.
    /// Returns the bytes brought in; refused, with the pages still out,
    /// where an eviction's claim never settled (then nothing more goes
    /// out, but the regions stay registered).
    pub fn stop_paging(&self) -> Result<u64, PagerError> {
        crate::pager::fault::bring::unpage(&self.inner)
            .map(|pages| pages as u64 * PAGE_SIZE as u64)
            .map_err(|pages| PagerError::StillOut { pages })
    }

    /// Whether [`Swap::stop_paging`] was called (here, or in the parent
    /// this process was forked from).
    pub fn paging_stopped(&self) -> bool {
        self.inner.budget().held_for_good()
    }

    /// Let go of [`Swap::hold_in`]: the budget is the one asked for again,
    /// met by the reclaimer from its next pass.
    pub fn let_go(&self) {
        self.inner.budget().let_go();
        self.inner.background().want();
        threads::start_wanted(&self.inner);
        self.inner.background().kick();
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
            .min(self.inner.states().len().max(64));
        if pages < 2 * page::UNIT_PAGES && regions::has_huge_region(&self.inner) {
            return Err(PagerError::Config(format!(
                "a budget of {bytes} bytes is too small while 2 MB units are mapped: give at least {} bytes (two units)",
                2 * page::UNIT_BYTES
            )));
        }
        self.inner.budget().set(pages);
        // A budget cut below what is resident is the reclaimer's to meet
        // now, not at its next look: awake it, or have it started.
        if self.inner.budget().charged() > self.inner.budget().low() {
            self.inner.background().want();
            threads::start_wanted(&self.inner);
            self.inner.background().kick();
        }
        self.inner.counters().levels.budget.set(pages as u64);
        self.inner
            .registry()
            .event(crate::stats::EventKind::BudgetChanged, pages as u64);
        Ok(())
    }

    /// The file this instance's statistics are published as, if they are
    /// (`SwapBuilder::publish`).
    pub fn published_path(&self) -> Option<std::path::PathBuf> {
        self.inner.registry().published_path()
    }

    /// Remove the published statistics now (a process about to exit that
    /// will not drop its instance); they are read no more.
    pub fn unpublish(&self) {
        self.inner.registry().unpublish();
    }

    /// Free slots over all swap devices.
    pub fn free_slots(&self) -> u64 {
        self.inner.backing().space.nr_free()
    }

    /// Usable slots over all swap devices.
    pub fn total_slots(&self) -> u64 {
        self.inner.backing().space.total_slots()
    }

    /// The swap space, for the tests' invariant checks: its `alloc` and
    /// `free` could take a slot from under the pager, so no user gets it.
    #[cfg(test)]
    pub(crate) fn swap_space(&self) -> &SwapSpace {
        &self.inner.backing().space
    }

    /// Inject a one-shot IO error at slot `offset` of device `device` (for
    /// testing the error paths).
    #[cfg(test)]
    pub fn inject_io_error(&self, device: usize, offset: u64, op: crate::io::IoOp) {
        self.inner.backing().devices[device].inject_error(offset, op);
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
        self.inner.backing().devices[device].inject_errors_for(op, errno, duration);
    }
}

impl Drop for Swap {
    fn drop(&mut self) {
        if !self.inner.same_process() {
            // A child not adopted (a raw `clone`): the threads are the
            // parent's (a child has only the thread that forked), and so
            // is everything else.
            std::mem::forget(std::mem::take(&mut *self.inner.threads().lock()));
            return;
        }
        // While regions live the threads keep serving them (they hold only
        // weak references, upgraded per pass); the last region stops them.
        if self.inner.release_user() {
            let threads = std::mem::take(&mut *self.inner.threads().lock());
            for t in threads {
                t.join();
            }
        }
    }
}

/// The least a single allocation takes for [`expect_growth`] to look at
/// the budget: smaller ones are left to the faults that follow them.
const GROWTH_LOOK: usize = 1 << 20;

/// The program takes `bytes` more memory, from its own code, outside any
/// handler of uswap's (`uswap run`'s `malloc`, `calloc`, `realloc` and
/// `mmap`): a safe point, as for [`start_wanted_threads`], which this
/// ends with.  An instance that an allocation of a MiB or more would
/// carry past its low watermark wants its background threads now, and
/// gets them here.  The need is otherwise found by the fault that
/// passes the watermark, in a signal handler, where no thread can
/// start; a program that allocates its working set first and then only
/// computes (xz's match finder, an array filled and swept) reaches no
/// safe point after it, and every page it sent out went by its own
/// faults' reclaim: xz -9 at 24 MiB on a swap file wrote 470,000 pages
/// in 7,381 batches of synchronous writes, its faults waiting on each.
/// Only an instance whose swap waits on a disk wants them so early
/// (`threads::expect` says why).
pub fn expect_growth(bytes: usize) {
    if bytes >= GROWTH_LOOK {
        for inner in crate::pager::entry::fork::live_instances() {
            threads::expect(&inner, bytes / crate::PAGE_SIZE);
        }
    }
    start_wanted_threads();
}

/// Start every instance's background threads that wait for their first
/// need (`SwapBuilder::threads_on_need`), from a safe point the pager
/// cannot see: `uswap run`'s `malloc` and `mmap`, called by the program's
/// own code, outside any handler of uswap's.  One load when none waits.
pub fn start_wanted_threads() {
    // A budget changed from outside (`uswap ctl`): each instance over its
    // new share wants its reclaimer, which an idle process in SIGBUS mode
    // does not run (it follows from here, its next allocation).
    if crate::domain::budget_changed() {
        for inner in crate::pager::entry::fork::live_instances() {
            threads::follow_domain(&inner);
        }
    }
    if crate::pager::instance::background::any_wanted() {
        for inner in crate::pager::entry::fork::live_instances() {
            threads::start_wanted(&inner);
        }
    }
}
