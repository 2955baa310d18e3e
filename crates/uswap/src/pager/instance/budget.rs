//! The budget: how many pages may be resident, how many are, how many
//! are staged on their way out, and the watermarks the reclaimer keeps
//! under; and the probation a cut of the budget gives the pages it takes.
//!
//! **Probation** (`--budget auto`'s probes, `SwapBuilder::probation`).
//! User space sees no accessed bits, so a cut of the budget takes the
//! pages longest unfaulted, and a hot set that was loaded first is the
//! first to go: it came back as refaults from the device, at major
//! faults' cost, and the controller read them as pressure and backed off
//! (a 1 GiB Node cache: every probe of its first 20 s undone within a
//! tenth of a second, at 20-60% pressure).  Under probation the pages a
//! cut takes are staged, as every dirty victim is, but not written for a
//! dwell: a touch meanwhile takes one back from its frame (a swap-cache
//! hit: no IO, and no pressure, which counts swap-ins only) and
//! activates it, and only what stays untouched is written when the dwell
//! ends.  This is the kernel's inactive list with its second chance,
//! done with the fault that a moved-out page takes instead of an accessed
//! bit; the kernel's reclaim probes through its swap cache the same way.
//!
//! The cost is memory: for the dwell, the pages a cut took stay in
//! memory off the charge.  So `probation` is the sum of the cuts made
//! within the last dwell, and `charged()`, what every bound is held to,
//! leaves out that many staged pages; writeback keeps them (`keep()`),
//! newest first out of reach, so the oldest staged pages, those of cuts
//! whose dwell is over, are the ones written.  A raise gives back what it
//! covers.  The tree holds at most the budget it had before the cut, and
//! never more than the highest budget of the last dwell: under a hard
//! ceiling (`auto,max=`) still.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// The widest gap the background reclaimer keeps below the budget, in
/// pages: 32 MiB.  The gap is a sixteenth of the budget, which absorbs a
/// burst of faults while the reclaimer writes; past 512 MiB a sixteenth
/// is more than a burst needs and memory the program could have held
/// (128 MiB of a 2 GiB budget, half a GiB of 8 GiB), each page of it a
/// fault more for a program that touches more than its budget.
const MAX_GAP: usize = 8192;

/// What is resident against what may be.  The four bounds change together
/// when the budget does (`Swap::set_budget`), each an atomic of its own:
/// a reader that sees a mix of old and new bounds for an instant reclaims
/// a little more or less than it would have, nothing worse.
pub(crate) struct Budget {
    /// Resident pages at most: a fault that finds `limit + slack` or more
    /// reclaims first, and the background reclaimer keeps them under
    /// `low`.
    limit: AtomicUsize,
    /// How far faults may run over `limit` before one reclaims itself:
    /// one eviction batch while the background reclaimer reclaims ahead
    /// (eviction stays off the fault path unless the reclaimer falls a
    /// batch behind), none where the faults reclaim for themselves.
    slack: AtomicUsize,
    /// The background reclaimer's target: resident pages down to this.
    /// Below `limit` when it reclaims ahead of the faults; `limit` itself
    /// where the faults reclaim for themselves (`ahead` false).
    low: AtomicUsize,
    /// Where a fault wakes the sleeping reclaimer: halfway from `low` to
    /// `limit`.  Woken at `low` itself, it would take a page or two a pass
    /// (as many as the faults put over) and write them back a run of one
    /// or two; woken here, it takes half the gap at least, in batches, as
    /// kswapd, woken at the low watermark, reclaims up to the high one.
    /// Without reclaim ahead, out of reach: the faults reclaim for
    /// themselves, and a fault that wakes the reclaimer puts it beside
    /// the program's CPU for nothing.
    wake: AtomicUsize,
    /// Whether the background reclaimer reclaims ahead of the faults, to
    /// `low` below the budget (`SwapBuilder::reclaim_ahead_in_memory`):
    /// where the swap waits on a disk.  Fixed at build.
    ahead: bool,
    /// How far past `limit` faults may take the resident set when nothing
    /// can be evicted, before the process is killed (`overrun.rs`);
    /// `usize::MAX`: no bound.
    max_overrun: AtomicUsize,
    /// What `max_overrun` is made from, for a new budget.
    pub overrun: crate::pager::instance::overrun::Overrun,
    /// The slack at most: an eviction batch where the reclaimer reclaims
    /// ahead (`ahead`), else 0.
    pub slack_max: usize,
    /// Pages resident now, staged ones included.
    resident: AtomicUsize,
    /// The most pages resident the background reclaimer has seen (it
    /// looks every pass, at least every millisecond).
    peak: AtomicUsize,
    /// Pages staged now; counted in `resident` too.
    staged: AtomicUsize,
    /// Staged pages kept in memory before writeback starts: half the
    /// staging frames.
    pub staging_target: usize,
    /// Held open for a reader outside the fault path (a debugger, a core
    /// dump: `fault/bring.rs`): the bounds are out of reach until let go,
    /// so that nothing brought in goes out again under the reader.
    held: std::sync::atomic::AtomicBool,
    /// Held for good: the instance pages nothing any more
    /// (`bring::unpage`, for a program's io_uring or AIO), and no
    /// [`Budget::let_go`] ends the hold.  Never cleared.
    for_good: std::sync::atomic::AtomicBool,
    /// The limit last asked for (`set`, `share`), held or not: what the
    /// bounds return to when let go.
    wanted: AtomicUsize,
    /// How long a cut's pages dwell staged before they are written, in
    /// nanoseconds; 0: no probation (a cut is followed at once).
    dwell_ns: AtomicU64,
    /// Pages the cuts of the current dwell took: that many staged pages
    /// are off the charge, at most `probation_max`.
    probation: AtomicUsize,
    /// When the current dwell ends (monotonic nanoseconds); the first
    /// cut after it starts the next.
    dwell_until: AtomicU64,
    /// The most pages on probation at once: what the staging frames
    /// hold besides the staging window.
    pub probation_max: usize,
}

/// The bounds while held: out of reach, and far from overflowing when a
/// batch or an overrun is added to them.
const HELD: usize = usize::MAX / 4;

impl Budget {
    /// A budget of `limit` pages (at least 64).
    pub fn new(
        limit: usize,
        ahead: bool,
        overrun: crate::pager::instance::overrun::Overrun,
        staging_target: usize,
        probation_max: usize,
    ) -> Budget {
        let b = Budget {
            limit: AtomicUsize::new(0),
            slack: AtomicUsize::new(0),
            low: AtomicUsize::new(0),
            wake: AtomicUsize::new(0),
            ahead,
            held: std::sync::atomic::AtomicBool::new(false),
            for_good: std::sync::atomic::AtomicBool::new(false),
            wanted: AtomicUsize::new(0),
            max_overrun: AtomicUsize::new(0),
            overrun,
            slack_max: if ahead {
                crate::pager::evict::reclaim::SLACK
            } else {
                0
            },
            resident: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            staged: AtomicUsize::new(0),
            staging_target,
            dwell_ns: AtomicU64::new(0),
            probation: AtomicUsize::new(0),
            dwell_until: AtomicU64::new(0),
            probation_max,
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
        self.share_at(limit, crate::sys::monotonic_ns());
    }

    /// [`Budget::share`] at `now` (monotonic nanoseconds).
    fn share_at(&self, limit: usize, now: u64) {
        let before = self.wanted.swap(limit, Ordering::Relaxed);
        self.on_probation(before, limit, now);
        if self.held.load(Ordering::Acquire) {
            return;
        }
        self.slack
            .store(self.slack_max.min(limit / 16), Ordering::Relaxed);
        let (low, wake) = if self.ahead {
            let low = limit - (limit / 16).clamp(32, MAX_GAP).min(limit / 2);
            (low, low + (limit - low) / 2)
        } else {
            // A fault never wakes it (out of reach, as while held).
            (limit, HELD)
        };
        self.low.store(low, Ordering::Relaxed);
        self.wake.store(wake, Ordering::Relaxed);
        self.limit.store(limit, Ordering::Release);
    }

    /// Give the cuts of the budget a dwell of `ns` nanoseconds from now
    /// on (0: none, and what is on probation now is charged again).
    pub fn set_dwell(&self, ns: u64) {
        if self.dwell_ns.load(Ordering::Relaxed) == ns {
            return;
        }
        self.dwell_ns.store(ns, Ordering::Relaxed);
        if ns == 0 {
            self.probation.store(0, Ordering::Relaxed);
        }
    }

    /// The limit moved from `before` to `after` at `now`: a cut puts its
    /// pages on probation (added to the current dwell's, or starting the
    /// next dwell), a raise gives back what it covers.
    fn on_probation(&self, before: usize, after: usize, now: u64) {
        let dwell = self.dwell_ns.load(Ordering::Relaxed);
        if dwell == 0 || before == after {
            return;
        }
        if after > before {
            let _ = self
                .probation
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| {
                    Some(p.saturating_sub(after - before))
                });
            return;
        }
        if now >= self.dwell_until.load(Ordering::Relaxed) {
            // The last dwell is over: its pages are charged again, and
            // this cut's dwell begins.
            self.probation.store(0, Ordering::Relaxed);
            self.dwell_until.store(now + dwell, Ordering::Relaxed);
        }
        let cut = before - after;
        let _ = self
            .probation
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| {
                Some((p + cut).min(self.probation_max))
            });
    }

    /// End the dwell if it is over at `now`: its pages are charged again
    /// (the reclaimer writes them, oldest first).  True when it ended.
    /// Called by the reclaimer each pass and at the domain's looks, so
    /// that the fault path reads no clock for it.
    pub fn end_dwell(&self, now: u64) -> bool {
        if self.probation.load(Ordering::Relaxed) == 0 || now < self.dwell_until.load(Ordering::Relaxed) {
            return false;
        }
        self.probation.store(0, Ordering::Relaxed);
        true
    }

    /// [`Budget::end_dwell`] now, reading the clock only while pages are
    /// on probation.
    #[inline]
    pub fn end_dwell_if_due(&self) -> bool {
        self.probation.load(Ordering::Relaxed) != 0 && self.end_dwell(crate::sys::monotonic_ns())
    }

    /// Pages on probation now: staged, and off the charge for the
    /// current dwell.
    #[inline]
    pub fn on_probation_now(&self) -> usize {
        self.staged().min(self.probation.load(Ordering::Relaxed))
    }

    /// What the bounds are held to: the resident pages less those on
    /// probation.  Without probation, `resident()`.
    #[inline]
    pub fn charged(&self) -> usize {
        self.resident().saturating_sub(self.on_probation_now())
    }

    /// Staged pages writeback keeps in memory: the staging window's, and
    /// those on probation.
    #[inline]
    pub fn keep(&self) -> usize {
        self.staging_target + self.probation.load(Ordering::Relaxed)
    }

    /// Hold the bounds open (`held`).  Allocation-free and lock-free: a
    /// fatal signal's handler holds them before the core dump.
    pub fn hold(&self) {
        self.held.store(true, Ordering::Release);
        self.slack.store(0, Ordering::Relaxed);
        self.low.store(HELD, Ordering::Relaxed);
        self.wake.store(HELD, Ordering::Relaxed);
        self.limit.store(HELD, Ordering::Release);
    }

    /// [`Budget::hold`], never let go: the instance stops paging.  The
    /// flag is stored before the bounds are, SeqCst, for the evictors'
    /// check after a claim (`Inner::pinned`).
    pub fn hold_for_good(&self) {
        self.for_good.store(true, Ordering::SeqCst);
        self.hold();
    }

    /// Whether [`Budget::hold_for_good`] was called.
    #[inline]
    pub fn held_for_good(&self) -> bool {
        self.for_good.load(Ordering::Relaxed)
    }

    /// Back to the limit last asked for; the reclaimer takes the resident
    /// set down to it from the next pass.  Nothing, once held for good.
    pub fn let_go(&self) {
        if self.for_good.load(Ordering::Acquire) {
            return;
        }
        self.held.store(false, Ordering::Release);
        self.share(self.wanted.load(Ordering::Relaxed));
        // A hold for good taken meanwhile stays: its bounds again (the
        // evictors refuse every page anyway, `Inner::pinned`).
        if self.for_good.load(Ordering::SeqCst) {
            self.hold();
        }
    }

    /// The limit asked for, held or not (what statistics report).
    pub fn wanted(&self) -> usize {
        self.wanted.load(Ordering::Relaxed)
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

    pub fn wake(&self) -> usize {
        self.wake.load(Ordering::Relaxed)
    }

    /// Whether the reclaimer reclaims ahead of the faults (`ahead`).
    pub fn ahead(&self) -> bool {
        self.ahead
    }

    pub fn max_overrun(&self) -> usize {
        self.max_overrun.load(Ordering::Relaxed)
    }

    // The counts move only here, one method per transition of a page, so
    // that the pairs (a staged page freed is one fewer staged and one
    // fewer resident) cannot drift apart at a call site.

    /// Pages resident now (staged ones included: their frames hold them).
    #[inline]
    pub fn resident(&self) -> usize {
        self.resident.load(Ordering::Relaxed)
    }

    /// Pages staged now: moved out of their regions, not yet written.
    #[inline]
    pub fn staged(&self) -> usize {
        self.staged.load(Ordering::Relaxed)
    }

    /// The most pages ever resident (as of the reclaimer's last look),
    /// `resident` included.
    #[inline]
    pub fn peak(&self, resident: usize) -> usize {
        self.peak.load(Ordering::Relaxed).max(resident)
    }

    /// The reclaimer's look: `resident` is the newest high-water mark if
    /// it is one.
    #[inline]
    pub fn note_peak(&self, resident: usize) {
        self.peak.fetch_max(resident, Ordering::Relaxed);
    }

    /// `n` pages came into memory (a fault installed them).
    #[inline]
    pub fn charge(&self, n: usize) {
        self.resident.fetch_add(n, Ordering::Relaxed);
    }

    /// `n` pages left memory (dropped, written and discarded, unmapped).
    #[inline]
    pub fn uncharge(&self, n: usize) {
        self.resident.fetch_sub(n, Ordering::Relaxed);
    }

    /// A page moved out into a staging frame: staged, still resident.
    /// True when it is on probation, off the charge (`charged`).
    #[inline]
    pub fn stage(&self) -> bool {
        self.staged.fetch_add(1, Ordering::Relaxed) < self.probation.load(Ordering::Relaxed)
    }

    /// A staged page moved back into its region: resident as before.
    #[inline]
    pub fn unstage(&self) {
        self.staged.fetch_sub(1, Ordering::Relaxed);
    }

    /// A staged page's frame freed (written to its slot, or dropped): no
    /// longer staged, no longer resident.
    #[inline]
    pub fn free_staged(&self) {
        self.staged.fetch_sub(1, Ordering::Relaxed);
        self.resident.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pager::instance::overrun::Overrun;
    use proptest::prelude::*;

    const DWELL: u64 = 1_000_000_000;

    #[derive(Clone, Debug)]
    enum Op {
        /// A new limit, after `dt` nanoseconds.
        Share {
            limit: usize,
            dt: u64,
        },
        Stage,
        Unstage,
        FreeStaged,
        Charge(usize),
        /// The reclaimer's look, after `dt`.
        Look {
            dt: u64,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (1000usize..20_000, 0u64..2 * DWELL).prop_map(|(limit, dt)| Op::Share { limit, dt }),
            Just(Op::Stage),
            Just(Op::Unstage),
            Just(Op::FreeStaged),
            (0usize..64).prop_map(Op::Charge),
            (0u64..2 * DWELL).prop_map(|dt| Op::Look { dt }),
        ]
    }

    /// The reclaimer's gap below the budget: a sixteenth, at least 32
    /// pages and at most half the budget, and never more than 32 MiB
    /// (a budget of 2 GiB keeps 32 MiB free, not 128); the wake mark
    /// halfway up it.
    #[test]
    fn the_gap_is_a_sixteenth_of_the_budget_up_to_32_mib() {
        let b = Budget::new(10_000, true, Overrun::default(), 128, 0);
        for (limit, low) in [
            (40, 20),
            (1_000, 1_000 - 62),
            (131_072, 131_072 - 8192),
            (524_288, 524_288 - 8192),
            (4 << 20, (4 << 20) - 8192),
        ] {
            b.share(limit);
            assert_eq!((b.limit(), b.low()), (limit, low), "budget of {limit} pages");
            assert_eq!(b.wake(), low + (limit - low) / 2, "budget of {limit} pages");
        }
    }

    /// Where the faults reclaim for themselves (devices in memory), the
    /// reclaimer's target is the budget itself, no fault wakes it, and
    /// the faults get no slack.
    #[test]
    fn without_reclaim_ahead_the_reclaimer_keeps_the_budget_itself() {
        let b = Budget::new(10_000, false, Overrun::default(), 128, 0);
        for limit in [40, 1_000, 131_072, 4 << 20] {
            b.share(limit);
            assert_eq!(
                (b.limit(), b.low(), b.slack()),
                (limit, limit, 0),
                "budget of {limit} pages"
            );
            assert_eq!(b.wake(), HELD, "budget of {limit} pages");
        }
    }

    proptest! {
        /// The budget's probation against a model: what is off the charge
        /// is the staged pages up to the cuts of the current dwell (never
        /// more than `probation_max`); a raise gives back what it covers;
        /// a look past the dwell's end charges everything again; writeback
        /// keeps the staging window and the pages on probation.  Without
        /// a dwell nothing is ever off the charge.
        #[test]
        fn probation_is_the_cuts_of_the_current_dwell(
            dwell in prop_oneof![Just(0u64), Just(DWELL)],
            ops in proptest::collection::vec(op(), 1..200),
        ) {
            let max = 3000;
            let b = Budget::new(10_000, true, Overrun::default(), 128, max);
            b.set_dwell(dwell);
            let (mut now, mut until, mut model) = (0u64, 0u64, 0usize);
            let mut wanted = 10_000usize;
            for op in ops {
                match op {
                    Op::Share { limit, dt } => {
                        now += dt;
                        if dwell > 0 && limit < wanted {
                            if now >= until {
                                model = 0;
                                until = now + dwell;
                            }
                            model = (model + (wanted - limit)).min(max);
                        } else if dwell > 0 && limit > wanted {
                            model = model.saturating_sub(limit - wanted);
                        }
                        wanted = limit;
                        b.share_at(limit, now);
                        prop_assert_eq!(b.limit(), limit);
                    }
                    Op::Stage => {
                        if b.staged() < b.resident() {
                            let staged = b.staged();
                            prop_assert_eq!(b.stage(), staged < model);
                        }
                    }
                    Op::Unstage => if b.staged() > 0 { b.unstage() },
                    Op::FreeStaged => if b.staged() > 0 { b.free_staged() },
                    Op::Charge(n) => b.charge(n),
                    Op::Look { dt } => {
                        now += dt;
                        let ended = b.end_dwell(now);
                        if model > 0 && now >= until {
                            prop_assert!(ended);
                            model = 0;
                        } else {
                            prop_assert!(!ended);
                        }
                    }
                }
                prop_assert!(model <= max);
                prop_assert_eq!(b.keep(), 128 + model);
                prop_assert_eq!(b.on_probation_now(), b.staged().min(model));
                prop_assert_eq!(b.charged(), b.resident() - b.staged().min(model));
                if dwell == 0 {
                    prop_assert_eq!(b.charged(), b.resident());
                }
            }
            // Turned off, whatever was on probation is charged again.
            b.set_dwell(0);
            prop_assert_eq!(b.charged(), b.resident());
        }
    }
}
