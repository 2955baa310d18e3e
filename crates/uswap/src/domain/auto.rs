//! A budget that finds itself (`uswap run --budget auto`): the tree's
//! budget lowered in bounded steps while its memory pressure stays under a
//! target, and raised at once when pressure passes it, after Meta's
//! Senpai (the user-space agent of TMO, ASPLOS'22) over a cgroup's
//! `memory.high` and PSI.
//!
//! Pressure here is the tree's "some" stall share: the time its members'
//! threads waited in uswap (a fault being served: a swap-in, or a reclaim
//! the fault had to make), summed over the members, per wall time of the
//! interval.  What it measures is what a lower budget costs the program:
//! pages it wanted that had gone.  Below the target the tree has memory it
//! does not use (cold pages, a cache it does not read), and the budget
//! comes down by a probe that shrinks as pressure nears the target; past
//! it, the budget goes back up by as much as the excess asks, at once,
//! up to `max`.
//!
//! Senpai's defaults are a 6 s interval, a target of 10 ms of stall in
//! it (0.17%), at most 1% of the limit a step down and 100% up.  They
//! suit fleets of long-lived services; a `uswap run` may last a minute.
//! The defaults here ([`Tuning::default`]) keep Senpai's shape and its
//! target share and move in shorter intervals with larger steps: 1 s, at
//! most 10% down.  They are a starting point, checked on one service
//! (300 MiB loaded, a tenth of it read: a fifth of the budget gone in
//! 9 s, its data intact), not yet the outcome of measuring several.
//!
//! The controller never takes the budget below what the tree faulted in
//! during its last interval (its working set, as far as uswap can see it:
//! it has no accessed bits), nor below `min`; `max` is a hard ceiling,
//! over that floor too.

use std::time::Duration;

/// How the controller moves.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tuning {
    /// Stall share the controller keeps the tree under (0.0017: 1.7 ms a
    /// second).
    pub target: f64,
    /// How often it decides.
    pub interval: Duration,
    /// The largest step down, a share of the budget.
    pub max_probe: f64,
    /// The largest step up, a share of the budget.
    pub max_backoff: f64,
    /// Bounds, in pages.
    pub min: u64,
    pub max: u64,
}

impl Default for Tuning {
    fn default() -> Tuning {
        Tuning {
            target: 0.0017,
            interval: Duration::from_secs(1),
            max_probe: 0.1,
            max_backoff: 1.0,
            min: 4096,
            max: u64::MAX,
        }
    }
}

/// One decision's input: what the tree did in the last interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Window {
    /// Stall share in the interval (stalled ns / wall ns).
    pub pressure: f64,
    /// Pages the tree faulted in during the interval: the floor.
    pub touched: u64,
}

/// The controller's state: the budget it set last.
#[derive(Clone, Debug, PartialEq)]
pub struct Controller {
    pub tuning: Tuning,
    budget: u64,
    /// The tree's charge at its peak: what the savings are counted from.
    peak: u64,
}

impl Controller {
    /// Starting at `budget` pages (the ceiling, unless `max` is lower).
    pub fn new(tuning: Tuning, budget: u64) -> Controller {
        let budget = budget.clamp(tuning.min, tuning.max.max(tuning.min));
        Controller {
            tuning,
            budget,
            peak: 0,
        }
    }

    /// The budget now, in pages.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Note what the tree is charged now (for [`Controller::saved`]).
    pub fn note_charge(&mut self, pages: u64) {
        self.peak = self.peak.max(pages);
    }

    /// A tree that stopped growing, charged `pages`: a budget far above it
    /// takes nothing from it, and probing down from there would only take
    /// time, so it comes down to the charge and a sixteenth at once (never
    /// below `min`).  Not while the tree grows: a budget just behind a
    /// growing tree makes its every fault reclaim.
    pub fn settle_at(&mut self, pages: u64) {
        let near = pages + pages / 16;
        if self.budget > near {
            self.budget = near.max(self.tuning.min);
        }
    }

    /// Pages the budget holds under the tree's peak.
    pub fn saved(&self) -> u64 {
        self.peak.saturating_sub(self.budget)
    }

    /// One interval's decision: the new budget in pages.
    pub fn decide(&mut self, w: Window) -> u64 {
        let t = &self.tuning;
        let b = self.budget as f64;
        let next = if w.pressure <= t.target {
            // Probe: a full step with no pressure at all, shrinking as
            // pressure nears the target (Senpai's quadratic).
            let error = (t.target - w.pressure) / t.target;
            let step = (error * error).min(1.0) * t.max_probe;
            (b * (1.0 - step)) as u64
        } else {
            // Back off at once, as far as the excess asks: twice the
            // target asks for a tenth more, ten times for all of it.
            let error = (w.pressure - t.target) / t.target;
            let step = (error / 10.0).min(t.max_backoff);
            (b * (1.0 + step)).ceil() as u64 + 1
        };
        // The ceiling is hard (`max=`): it wins over the floor.
        let floor = t.min.max(w.touched);
        self.budget = next.max(floor).min(t.max.max(t.min));
        self.budget
    }
}

/// What a tree has done so far, as counters that only grow: the input of
/// a [`Driver`], read from a domain's members (`uswap run`) or from a
/// memory cgroup and the kernel's PSI (`uswap bench program`'s
/// kernel-auto runner), so that both are driven by the same logic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Pages the tree is charged now.
    pub charge: u64,
    /// Nanoseconds its threads stalled.
    pub stall_ns: u64,
    /// Faults: pages it touched that were not mapped.
    pub faults: u64,
    /// Of them, pages brought back from swap.
    pub swapins: u64,
}

/// A [`Controller`] fed once an interval: turns two readings of
/// [`Counts`] into a [`Window`] and a decision.
#[derive(Clone, Debug)]
pub struct Driver {
    pub controller: Controller,
    /// When the last interval began, and the counts then.
    last: Option<(std::time::Instant, Counts)>,
    /// The last interval's pressure.
    pressure: f64,
}

impl Driver {
    pub fn new(tuning: Tuning, budget: u64) -> Driver {
        Driver {
            controller: Controller::new(tuning, budget),
            last: None,
            pressure: 0.0,
        }
    }

    /// The last interval's pressure (stall share).
    pub fn pressure(&self) -> f64 {
        self.pressure
    }

    /// Whether an interval has passed since the last decision (or none
    /// was made yet).
    pub fn due(&self, now: std::time::Instant) -> bool {
        self.last
            .is_none_or(|(t, _)| now.duration_since(t) >= self.controller.tuning.interval)
    }

    /// Called as often as the caller likes: once an interval has passed
    /// since the last decision, decides from `now`'s counts and returns
    /// the budget in pages; None between.  The first call only reads.
    pub fn step(&mut self, now: std::time::Instant, c: Counts) -> Option<u64> {
        if !self.due(now) {
            return None;
        }
        self.controller.note_charge(c.charge);
        let decided = self.last.map(|(t, before)| {
            // Not growing (by more than a sixty-fourth an interval: staged
            // pages and the other memory /proc shows move a little).
            if c.charge <= before.charge + before.charge / 64 {
                self.controller.settle_at(c.charge);
            }
            let wall = now.duration_since(t).as_nanos().max(1) as f64;
            let stall = c.stall_ns.saturating_sub(before.stall_ns) as f64;
            let faults = c.faults.saturating_sub(before.faults);
            let swapins = c.swapins.saturating_sub(before.swapins);
            // The stall a smaller budget caused: its swap-ins' part of
            // it (a first touch, a zero fill, waits too, and a growing
            // tree is not short of memory for it).
            let share = if faults == 0 {
                0.0
            } else {
                swapins.min(faults) as f64 / faults as f64
            };
            self.pressure = stall * share / wall;
            self.controller.decide(Window {
                pressure: self.pressure,
                touched: faults,
            })
        });
        self.last = Some((now, c));
        decided
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tuning(min: u64, max: u64) -> Tuning {
        Tuning {
            min,
            max,
            ..Tuning::default()
        }
    }

    #[test]
    fn no_pressure_lowers_by_the_largest_probe_and_pressure_raises_at_once() {
        let mut c = Controller::new(tuning(100, 1 << 20), 100_000);
        let b = c.decide(Window {
            pressure: 0.0,
            touched: 0,
        });
        assert_eq!(b, 90_000);
        // Ten times the target: back to where it was and more.
        let up = c.decide(Window {
            pressure: 10.0 * 0.0017,
            touched: 0,
        });
        assert!(up >= 90_000 * 19 / 10 - 1, "{up}");
    }

    /// The driver decides once an interval from the counts' differences:
    /// a tree that stopped growing is settled at its charge and probed
    /// down; stall from swap-ins past the target raises it; stall from
    /// first touches alone (no swap-in) is no pressure.
    #[test]
    fn the_driver_decides_once_an_interval_from_the_differences() {
        let t = std::time::Instant::now();
        let s = Duration::from_secs(1);
        let mut d = Driver::new(tuning(100, 1 << 30), 1 << 20);
        let at = |charge, stall_ns, faults, swapins| Counts {
            charge,
            stall_ns,
            faults,
            swapins,
        };
        assert_eq!(d.step(t, at(10_000, 0, 0, 0)), None, "the first call reads");
        assert_eq!(d.step(t + s / 2, at(10_000, 0, 0, 0)), None, "within the interval");
        // Not growing, no stall: settled at the charge and a sixteenth,
        // then a full probe down.
        assert_eq!(d.step(t + s, at(10_000, 0, 0, 0)), Some(10_625 * 9 / 10));
        // 100 ms of stall in a second, all swap-ins: 10% against 0.17%.
        let b = d.step(t + 2 * s, at(10_000, 100_000_000, 50, 50)).unwrap();
        assert!(b > 10_625 * 9 / 10 * 3 / 2, "{b}");
        assert!((d.pressure() - 0.1).abs() < 1e-3, "{}", d.pressure());
        // The same stall from first touches (no swap-in): no pressure.
        let c = d.step(t + 3 * s, at(10_000, 200_000_000, 100, 50)).unwrap();
        assert!(c < b && d.pressure() == 0.0, "{c} {b}");
    }

    #[test]
    fn a_tree_without_cold_memory_stops_the_descent() {
        // Pressure just at the target: the probe is zero.
        let mut c = Controller::new(tuning(100, 1 << 20), 50_000);
        let b = c.decide(Window {
            pressure: 0.0017,
            touched: 0,
        });
        assert_eq!(b, 50_000);
    }

    proptest! {
        /// Whatever the tree does, the budget stays within its bounds and
        /// above what the tree touched, moves down by at most a probe, and
        /// goes up whenever pressure passes the target.
        #[test]
        fn the_budget_stays_bounded_and_moves_as_pressure_says(
            start in 1u64..1 << 24,
            min in 1u64..1 << 12,
            max in 1u64 << 12..1 << 26,
            windows in proptest::collection::vec((0.0f64..0.05, 0u64..1 << 22), 1..64),
        ) {
            let mut c = Controller::new(tuning(min, max), start);
            prop_assert!(c.budget() >= min.min(max) && c.budget() <= max.max(min));
            for (pressure, touched) in windows {
                let before = c.budget();
                let b = c.decide(Window { pressure, touched });
                let ceiling = max.max(min);
                prop_assert!(b >= min.max(touched).min(ceiling));
                prop_assert!(b <= ceiling);
                if pressure > c.tuning.target && before < ceiling {
                    prop_assert!(b > before);
                }
                if b < before {
                    prop_assert!((before - b) as f64 <= before as f64 * c.tuning.max_probe + 1.0);
                }
            }
        }
    }
}
