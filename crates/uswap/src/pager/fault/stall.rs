//! Stalls: faults that took [`STALL_NS`] or more to serve, each counted
//! under the cause that took most of its time, so that a tail in a
//! bench's latency percentiles comes with its reasons (`bench pmbench`'s
//! stall table, `uswap stat`).
//!
//! The causes are the waits a fault can meet besides its own work:
//! another thread's claim on the page (held across that thread's IO),
//! reclaim it had to do first (the budget exhausted, the background
//! reclaimer behind), and the budget's bound (nothing ready to evict:
//! writeback behind, or backing off after write errors).  The rest of the
//! fault's time is its own (its IO and install).  Only the waits read the
//! clock, so a fault that meets none pays for nothing here: its total is
//! the entry's, which it measures anyway.

use crate::pager::evict::reclaim::Room;
use crate::pager::instance::inner::Inner;

/// A fault this long or longer is a stall: 100 us, some 15 times a swap-in
/// from RAM and twice a read from a fast disk, where a program notices.
pub(crate) const STALL_NS: u64 = 100_000;

/// Where one fault's time went, besides its own work.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Stall {
    claim_wait_ns: u64,
    reclaim_ns: u64,
    bound_ns: u64,
}

impl Stall {
    pub const fn new() -> Stall {
        Stall {
            claim_wait_ns: 0,
            reclaim_ns: 0,
            bound_ns: 0,
        }
    }

    /// Waited for another thread's claim on the page for `ns`.
    pub fn waited(&mut self, ns: u64) {
        self.claim_wait_ns += ns;
    }

    /// Made room before installing (reclaim, and maybe the bound).
    pub fn room(&mut self, r: Room) {
        self.reclaim_ns += r.reclaim_ns;
        self.bound_ns += r.bound_ns;
    }

    /// The cause that took most of a fault of `took` ns.
    pub fn cause(&self, took: u64) -> Cause {
        let own = took.saturating_sub(self.claim_wait_ns + self.reclaim_ns + self.bound_ns);
        [
            (self.claim_wait_ns, Cause::ClaimWait),
            (self.reclaim_ns, Cause::Reclaim),
            (self.bound_ns, Cause::Bound),
            (own, Cause::Own),
        ]
        .into_iter()
        .max_by_key(|&(ns, _)| ns)
        .map_or(Cause::Own, |(_, c)| c)
    }

    /// The fault took `took` ns: a stall is counted, and under its cause.
    pub fn count(&self, inner: &Inner, took: u64) {
        if took < STALL_NS {
            return;
        }
        let c = inner.counters();
        c.stalls.inc();
        match self.cause(took) {
            Cause::ClaimWait => c.stall_claim_wait.inc(),
            Cause::Reclaim => c.stall_reclaim.inc(),
            Cause::Bound => c.stall_bound.inc(),
            Cause::Own => c.stall_own.inc(),
        }
    }
}

/// Why a fault stalled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cause {
    ClaimWait,
    Reclaim,
    Bound,
    Own,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stall_is_named_for_the_wait_that_took_most_of_it() {
        let mut s = Stall::new();
        assert_eq!(s.cause(500_000), Cause::Own);
        s.waited(300_000);
        assert_eq!(s.cause(500_000), Cause::ClaimWait);
        s.room(Room {
            reclaim_ns: 50_000,
            bound_ns: 400_000,
        });
        assert_eq!(s.cause(800_000), Cause::Bound);
        // A total shorter than the waits (clocks read at other points):
        // the fault's own share is none, not negative.
        assert_eq!(s.cause(100), Cause::Bound);
    }
}
