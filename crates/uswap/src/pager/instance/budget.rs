//! The budget: how many pages may be resident, how many are, how many
//! are staged on their way out, and the watermarks the reclaimer keeps
//! under.

use std::sync::atomic::{AtomicUsize, Ordering};

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
    /// Where a fault wakes the sleeping reclaimer: halfway from `low` to
    /// `limit`.  Woken at `low` itself, it would take a page or two a pass
    /// (as many as the faults put over) and write them back a run of one
    /// or two; woken here, it takes half the gap at least, in batches, as
    /// kswapd, woken at the low watermark, reclaims up to the high one.
    wake: AtomicUsize,
    /// How far past `limit` faults may take the resident set when nothing
    /// can be evicted, before the process is killed (`overrun.rs`);
    /// `usize::MAX`: no bound.
    max_overrun: AtomicUsize,
    /// What `max_overrun` is made from, for a new budget.
    pub overrun: crate::pager::instance::overrun::Overrun,
    /// The slack at most: an eviction batch while a background reclaimer
    /// runs, else 0.
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
    /// The limit last asked for (`set`, `share`), held or not: what the
    /// bounds return to when let go.
    wanted: AtomicUsize,
}

/// The bounds while held: out of reach, and far from overflowing when a
/// batch or an overrun is added to them.
const HELD: usize = usize::MAX / 4;

impl Budget {
    /// A budget of `limit` pages (at least 64).
    pub fn new(
        limit: usize,
        slack_max: usize,
        overrun: crate::pager::instance::overrun::Overrun,
        staging_target: usize,
    ) -> Budget {
        let b = Budget {
            limit: AtomicUsize::new(0),
            slack: AtomicUsize::new(0),
            low: AtomicUsize::new(0),
            wake: AtomicUsize::new(0),
            held: std::sync::atomic::AtomicBool::new(false),
            wanted: AtomicUsize::new(0),
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
        self.wanted.store(limit, Ordering::Relaxed);
        if self.held.load(Ordering::Acquire) {
            return;
        }
        self.slack
            .store(self.slack_max.min(limit / 16), Ordering::Relaxed);
        let low = limit - (limit / 16).max(32).min(limit / 2);
        self.low.store(low, Ordering::Relaxed);
        self.wake.store(low + (limit - low) / 2, Ordering::Relaxed);
        self.limit.store(limit, Ordering::Release);
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

    /// Back to the limit last asked for; the reclaimer takes the resident
    /// set down to it from the next pass.
    pub fn let_go(&self) {
        self.held.store(false, Ordering::Release);
        self.share(self.wanted.load(Ordering::Relaxed));
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
    #[inline]
    pub fn stage(&self) {
        self.staged.fetch_add(1, Ordering::Relaxed);
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
