//! Refault distance (after mm/workingset.c): which pages that come back
//! from swap are the working set, and go on the active list, and which
//! were touched once in a long while, and go on the inactive list to be
//! evicted first again.
//!
//! The instance keeps an eviction clock: pages that have left the LRU for
//! swap.  A page swapped out keeps in its word a *shadow*: the clock's
//! value then, in buckets (page.rs, `SHADOW`).  When the page faults back
//! in, the clock has advanced by the *refault distance*: the evictions
//! between its leaving and its return, which is how much more memory it
//! would have needed to stay resident.
//!
//! The kernel activates a refault whose distance is within its workingset
//! size, the active list it competes with; its active list fills from the
//! accessed bits it reads in the page tables.  uswap cannot see accesses to
//! resident pages (the page tables are the kernel's; idle page tracking,
//! which would show them, is not built into this kernel and needs root),
//! so its active list fills only from what it activates itself, and a
//! comparison with the active list's length would never start: nothing
//! refaults into an empty active list.  So the bound is fixed instead:
//! half the budget.  A page that comes back within half a budget's worth
//! of evictions is reused more often than the pages evicted around it and
//! goes on the active list, which reclaim ages only when the inactive
//! list is empty; one that comes back later is a page of the cold tail
//! and is evicted again first.  A simulation of pmbench's zipf pattern
//! (YCSB theta 0.99, a quarter of the pages resident) put the fault rate
//! at 21.3% activating every refault, 17.4% with this bound, 18.0% with
//! a whole budget and 18.6% for an exact LRU (DESIGN.md, "Refault
//! distance").  The real pager's fault rate on that pattern did not move
//! (its write-protect faults and staged-page touches tell the LRU some of
//! what the simulation's did not know); what the bound removes there is
//! 70% of the LRU's activations.
//!
//! The shadow has [`SHADOW_BITS`] bits, counting buckets of
//! `2^bucket_shift` evictions, the shift chosen at build so that the
//! buckets span eight budgets.  A page that stays out longer than that
//! reads a distance modulo the span; one in sixteen of those is taken for
//! working set (half a budget out of eight), which costs it nothing worse
//! than the activation every refault got before.  Shadow 0 means none: a
//! page swapped out by a path that records none (a 2 MB unit) is
//! activated as before.  A forked child keeps its parent's shadows with
//! its copy of the clock, which goes on from where the parent's was.
//!
//! `SwapBuilder::refault_distance(false)` restores activating every
//! refault (`--ablate` `activate-all-refaults`).

use std::sync::atomic::{AtomicU64, Ordering};

/// Bits of a shadow in a page word (page.rs).
pub(crate) const SHADOW_BITS: u32 = 15;
/// Buckets a shadow tells apart: values 1..=SPAN, 0 being "no shadow".
const SPAN: u64 = (1 << SHADOW_BITS) - 1;
/// Budgets the buckets span before distances wrap.
const SPAN_BUDGETS: u64 = 8;

/// One instance's eviction clock and the refault decision.
pub(crate) struct Workingset {
    /// Pages evicted from the LRU since the instance was built.  Relaxed:
    /// a distance a few pages off decides nothing differently.
    clock: AtomicU64,
    /// log2 of the evictions one shadow bucket counts.
    bucket_shift: u32,
    /// Off: every refault is activated, as before (the ablation).
    on: bool,
}

impl Workingset {
    /// A clock for a budget of `limit` pages.
    pub fn new(limit: usize, on: bool) -> Workingset {
        let span = (limit as u64).max(1) * SPAN_BUDGETS;
        // The least shift whose buckets cover the span.
        let bucket_shift = span.div_ceil(SPAN).next_power_of_two().trailing_zeros();
        Workingset {
            clock: AtomicU64::new(0),
            bucket_shift,
            on,
        }
    }

    /// `n` pages left the LRU for eviction.
    #[inline]
    pub fn evicted(&self, n: usize) {
        if self.on {
            self.clock.fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    /// The shadow a page being evicted now keeps: never 0.
    #[inline]
    pub fn shadow(&self) -> u16 {
        if !self.on {
            return 0;
        }
        ((self.clock.load(Ordering::Relaxed) >> self.bucket_shift) % SPAN + 1) as u16
    }

    /// Whether a page swapped out with `shadow` and faulting back in now
    /// is working set (to the active list), the budget being `limit`
    /// pages.  `None` when the switch is off or the page kept no shadow.
    #[inline]
    pub fn refault_distance(&self, shadow: u16) -> Option<u64> {
        if !self.on || shadow == 0 {
            return None;
        }
        let now = (self.clock.load(Ordering::Relaxed) >> self.bucket_shift) % SPAN;
        let then = u64::from(shadow) - 1;
        Some(((now + SPAN - then) % SPAN) << self.bucket_shift)
    }

    /// Whether a refault at `distance` (see `refault_distance`) is the
    /// working set of a budget of `limit` pages.
    #[inline]
    pub fn is_workingset(distance: u64, limit: usize) -> bool {
        distance <= limit as u64 / 2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distance_is_the_evictions_since_the_shadow() {
        let ws = Workingset::new(131_072, true);
        // 8 budgets over 2^15 - 1 buckets: just over 32 evictions a
        // bucket, so 64.
        assert_eq!(ws.bucket_shift, 6);
        ws.evicted(1000);
        let s = ws.shadow();
        assert_ne!(s, 0);
        ws.evicted(64_000);
        let d = ws.refault_distance(s).unwrap();
        // Within a bucket of the truth.
        assert!(d.abs_diff(64_000) <= 64, "{d}");
        assert!(Workingset::is_workingset(d, 131_072));
        ws.evicted(10_000);
        let d = ws.refault_distance(s).unwrap();
        assert!(!Workingset::is_workingset(d, 131_072), "{d}");
    }

    #[test]
    fn distances_wrap_after_the_span() {
        let ws = Workingset::new(1024, true);
        let s = ws.shadow();
        let span = SPAN << ws.bucket_shift;
        assert!(span >= 8 * 1024, "{span}");
        ws.evicted(span as usize + 100);
        let d = ws.refault_distance(s).unwrap();
        assert!(d <= 100 + (1 << ws.bucket_shift), "{d}");
    }

    #[test]
    fn off_or_no_shadow_decides_nothing() {
        let off = Workingset::new(1024, false);
        off.evicted(10);
        assert_eq!(off.shadow(), 0);
        assert_eq!(off.refault_distance(5), None);
        let on = Workingset::new(1024, true);
        assert_eq!(on.refault_distance(0), None);
        // A tiny budget still gets a shift that covers eight of it.
        assert!(SPAN << Workingset::new(1, true).bucket_shift >= 8);
    }
}
