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
    /// Pages the tree is charged at its end.
    pub charge: u64,
}

/// The controller's state: the budget it set last, and what the last
/// back-off taught it.
#[derive(Clone, Debug, PartialEq)]
pub struct Controller {
    pub tuning: Tuning,
    budget: u64,
    /// The tree's charge at its peak: what the savings are counted from.
    peak: u64,
    /// The last budget that cost nothing before pressure passed the
    /// target: over the tree's working set, as far as a probe found it.
    /// Probes stop there for `hold` intervals.
    knee: u64,
    /// Intervals left before a probe may go under `knee` again.
    hold: u32,
    /// How long the next hold lasts: none after a first back-off (uswap
    /// learns a hot set by its refaults, and a probe that evicted pages
    /// the tree reads again has activated them: the next may cost
    /// nothing), then `HOLD_FIRST`, doubled by every back-off that follows
    /// a probe under the knee (the tree has no more to give), halved by
    /// every probe under it that costs nothing (it has again).
    hold_len: u32,
    /// The budget of the last interval without pressure: where the knee
    /// goes when the next one has it.
    good: u64,
}

/// The first hold, in intervals (after the second back-off at a knee),
/// and the longest: a tree with no cold memory is probed under its
/// working set at most once in `HOLD_MOST` intervals once it has shown it
/// a few times.
const HOLD_FIRST: u32 = 2;
const HOLD_MOST: u32 = 128;

impl Controller {
    /// Starting at `budget` pages (the ceiling, unless `max` is lower).
    pub fn new(tuning: Tuning, budget: u64) -> Controller {
        let budget = budget.clamp(tuning.min, tuning.max.max(tuning.min));
        Controller {
            tuning,
            budget,
            peak: 0,
            knee: 0,
            hold: 0,
            hold_len: 0,
            good: 0,
        }
    }

    /// The budget now, in pages.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Note what the tree is charged now (for [`Controller::peak`]).
    pub fn note_charge(&mut self, pages: u64) {
        self.peak = self.peak.max(pages);
    }

    /// A tree that stopped growing, charged `pages`: a budget far above it
    /// takes nothing from it, and probing down from there would only take
    /// time, so it comes down to the charge and a sixteenth at once (never
    /// below `min`, nor below the knee while it holds).  Not while the
    /// tree grows: a budget just behind a growing tree makes its every
    /// fault reclaim.
    pub fn settle_at(&mut self, pages: u64) {
        let near = pages + pages / 16;
        if self.budget > near {
            self.budget = near.max(self.tuning.min).max(self.held());
        }
    }

    /// The tree's charge at its peak, in pages.
    pub fn peak(&self) -> u64 {
        self.peak
    }

    /// The lowest budget a probe may set now: the knee while it holds.
    fn held(&self) -> u64 {
        if self.hold > 0 {
            self.knee
        } else {
            0
        }
    }

    /// One interval's decision: the new budget in pages.
    pub fn decide(&mut self, w: Window) -> u64 {
        let t = &self.tuning;
        let b = self.budget as f64;
        if w.pressure > t.target {
            return self.back_off(w);
        }
        let next = {
            // Probe: a full step with no pressure at all, shrinking as
            // pressure nears the target (Senpai's quadratic), and not
            // under the knee while it holds.
            let error = (t.target - w.pressure) / t.target;
            let step = (error * error).min(1.0) * t.max_probe;
            self.good = self.budget;
            if self.hold > 0 {
                self.hold -= 1;
            } else if self.knee > 0 && self.budget < self.knee {
                // Under the knee and no pressure: the tree gave memory
                // back since; probes may come sooner next time.
                self.hold_len = if self.hold_len > HOLD_FIRST {
                    self.hold_len / 2
                } else {
                    0
                };
                self.knee = 0;
            }
            ((b * (1.0 - step)) as u64).max(self.held())
        };
        self.budget = self.bounded(next, w.touched);
        self.budget
    }

    /// Pressure past the target: the budget goes back up at once, as far
    /// as the excess asks (twice the target asks for a tenth more, ten
    /// times for all of it), and the last budget that cost nothing is the
    /// knee probes hold at.
    ///
    /// Only where the budget binds (the tree charged within a sixteenth
    /// of it): under a budget it does not reach, the stall is pages coming
    /// back that went out before, and a higher budget would not bring one
    /// of them sooner.  Without this rule every look of a refill doubled
    /// the budget again, to thousands of times the tree.  Nor above the
    /// tree's peak and a sixteenth: a budget it never reached holds
    /// nothing back.
    pub fn back_off(&mut self, w: Window) -> u64 {
        let t = &self.tuning;
        if w.charge + self.budget / 16 < self.budget {
            self.budget = self.bounded(self.budget, w.touched);
            return self.budget;
        }
        let top = self.peak.max(w.charge);
        let cap = top + top / 16;
        let error = (w.pressure - t.target).max(0.0) / t.target;
        let step = (error / 10.0).min(t.max_backoff);
        let next = ((self.budget as f64 * (1.0 + step)).ceil() as u64 + 1)
            .min(cap)
            .max(self.budget);
        // The last budget that cost nothing, or, without one over this
        // budget, a sixteenth over it (the slack each member keeps over
        // its share).
        let knee = if self.good > self.budget {
            self.good
        } else {
            self.budget + self.budget / 16
        };
        if self.hold == 0 && self.knee > 0 {
            // Probed under the knee again, and it cost: hold, longer
            // each time.
            self.hold_len = (self.hold_len * 2).clamp(HOLD_FIRST, HOLD_MOST);
        }
        self.knee = knee.min(cap);
        self.hold = self.hold_len;
        self.budget = self.bounded(next, w.touched);
        self.budget
    }

    /// `next` within the bounds: over what the tree touched and `min`,
    /// under the ceiling, which is hard (`max=`) and wins over the floor.
    fn bounded(&self, next: u64, touched: u64) -> u64 {
        let t = &self.tuning;
        next.max(t.min.max(touched)).min(t.max.max(t.min))
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
    /// Of them, staged pages taken back (swap-cache hits).
    pub hits: u64,
}

/// A [`Controller`] fed once an interval: turns two readings of
/// [`Counts`] into a [`Window`] and a decision.  Between decisions it
/// looks at every tenth of an interval, for one thing: pressure far past
/// the target (a probe that went under the working set) is answered at
/// once, not at the interval's end.  A probe under a tree's working set
/// is how the controller finds it, and this bounds what finding it costs
/// the tree.
#[derive(Clone, Debug)]
pub struct Driver {
    pub controller: Controller,
    /// When the last interval began, and the counts then.
    last: Option<(std::time::Instant, Counts)>,
    /// When the last look began, and the counts then.
    look: Option<(std::time::Instant, Counts)>,
    /// The last interval's pressure.
    pressure: f64,
    /// Pages the last decision cut from the tree's charge: as many
    /// swap-cache hits a window are no pressure (see [`pressure`]).
    forgiven: u64,
}

/// A look's pressure answered at once: this many times the target.  A
/// tenth of an interval holds a few swap-ins at most when all is well,
/// and one look's share is noisy; ten times the target is a probe that
/// cut into the working set.
const LOOK_FACTOR: f64 = 10.0;

/// The stall a smaller budget caused, as a share of `wall_ns`: the
/// refaults' part of the stall (a first touch, a zero fill, waits too,
/// and a growing tree is not short of memory for it).  A refault is a
/// swap-in, or a swap-cache hit past `forgiven`, the pages the last probe
/// cut: the cut stays staged for its dwell (probation), and a page of it
/// taken back once is how the controller learns it is in use, at a few
/// microseconds, not pressure (a Node cache whose hot keys were loaded
/// first, and are cut first, saved 25% of plain's mean with every hit
/// counted, 71% with none).  More hits than the cut are pages cut again
/// and taken back again, the budget under the working set: a tree of
/// 1.4 GiB read whole 15 times a second took each probe back by 40,000
/// hits a second, 45% of its time stalled in handler-thread mode, and
/// with no hit counted it read as no pressure and ran at 2x.
fn pressure(before: &Counts, now: &Counts, wall_ns: f64, forgiven: u64) -> (f64, u64) {
    let stall = now.stall_ns.saturating_sub(before.stall_ns) as f64;
    let faults = now.faults.saturating_sub(before.faults);
    let hits = now.hits.saturating_sub(before.hits);
    let refaults = now.swapins.saturating_sub(before.swapins) + hits.saturating_sub(forgiven);
    let share = if faults == 0 {
        0.0
    } else {
        refaults.min(faults) as f64 / faults as f64
    };
    (stall * share / wall_ns.max(1.0), faults)
}

impl Driver {
    pub fn new(tuning: Tuning, budget: u64) -> Driver {
        Driver {
            controller: Controller::new(tuning, budget),
            last: None,
            look: None,
            pressure: 0.0,
            forgiven: 0,
        }
    }

    /// The last interval's pressure (stall share).
    pub fn pressure(&self) -> f64 {
        self.pressure
    }

    /// Whether a tenth of an interval has passed since the last look
    /// (or none was made yet): when [`Driver::step`] wants counts.
    pub fn due(&self, now: std::time::Instant) -> bool {
        self.look
            .is_none_or(|(t, _)| now.duration_since(t) >= self.controller.tuning.interval / 10)
    }

    /// Called as often as the caller likes: once an interval has passed
    /// since the last decision, decides from `now`'s counts and returns
    /// the budget in pages, or sooner when a look finds pressure far past
    /// the target; None between.  The first call only reads.
    pub fn step(&mut self, now: std::time::Instant, c: Counts) -> Option<u64> {
        if !self.due(now) {
            return None;
        }
        self.controller.note_charge(c.charge);
        let target = self.controller.tuning.target;
        if let Some((t, before)) = self.look.replace((now, c)) {
            let (p, touched) = pressure(&before, &c, now.duration_since(t).as_nanos() as f64, self.forgiven);
            if p > LOOK_FACTOR * target {
                // The interval starts again from here: the next decision
                // sees what the new budget did.
                self.last = Some((now, c));
                self.pressure = p;
                self.forgiven = 0;
                return Some(self.controller.back_off(Window {
                    pressure: p,
                    touched,
                    charge: c.charge,
                }));
            }
        }
        let interval = self.controller.tuning.interval;
        if self.last.is_some_and(|(t, _)| now.duration_since(t) < interval) {
            return None;
        }
        let decided = self.last.map(|(t, before)| {
            // Not growing (by more than a sixty-fourth an interval: staged
            // pages and the other memory /proc shows move a little).
            if c.charge <= before.charge + before.charge / 64 {
                self.controller.settle_at(c.charge);
            }
            let (p, touched) = pressure(&before, &c, now.duration_since(t).as_nanos() as f64, self.forgiven);
            self.pressure = p;
            let b = self.controller.decide(Window {
                pressure: p,
                touched,
                charge: c.charge,
            });
            self.forgiven = c.charge.saturating_sub(b);
            b
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
        c.note_charge(100_000);
        let b = c.decide(Window {
            pressure: 0.0,
            touched: 0,
            charge: 100_000,
        });
        assert_eq!(b, 90_000);
        // Ten times the target, under a budget that binds: back over the
        // peak by a sixteenth at once, and no further.
        let up = c.decide(Window {
            pressure: 10.0 * 0.0017,
            touched: 0,
            charge: 90_000,
        });
        assert_eq!(up, 106_250);
        // Under a budget the tree does not reach, pressure is pages coming
        // back: the budget stays.
        let mut c = Controller::new(tuning(100, 1 << 20), 100_000);
        let same = c.decide(Window {
            pressure: 0.5,
            touched: 0,
            charge: 50_000,
        });
        assert_eq!(same, 100_000);
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
            hits: 0,
        };
        assert_eq!(d.step(t, at(10_000, 0, 0, 0)), None, "the first call reads");
        assert_eq!(d.step(t + s / 2, at(10_000, 0, 0, 0)), None, "within the interval");
        // Not growing, no stall: settled at the charge and a sixteenth,
        // then a full probe down.
        assert_eq!(d.step(t + s, at(10_000, 0, 0, 0)), Some(10_625 * 9 / 10));
        // 100 ms of stall in a second, all swap-ins: 10% against 0.17%,
        // and the budget binds: back to the peak and a sixteenth.
        let b = d.step(t + 2 * s, at(10_000, 100_000_000, 50, 50)).unwrap();
        assert_eq!(b, 10_625);
        assert!((d.pressure() - 0.1).abs() < 1e-3, "{}", d.pressure());
        // The same stall from first touches (no swap-in): no pressure,
        // and the probes go on (a first back-off holds nothing).
        let c = d.step(t + 3 * s, at(10_000, 200_000_000, 100, 50)).unwrap();
        assert!(c < b && d.pressure() == 0.0, "{c} {b}");
    }

    /// A probe that cuts into the working set is answered at the next
    /// look, a tenth of an interval later, not at the interval's end.
    #[test]
    fn pressure_far_past_the_target_is_answered_within_a_look() {
        let t = std::time::Instant::now();
        let s = Duration::from_secs(1);
        let mut d = Driver::new(tuning(100, 1 << 30), 20_000);
        let at = |stall_ns, n| Counts {
            charge: 10_000,
            stall_ns,
            faults: n,
            swapins: n,
            hits: 0,
        };
        d.step(t, at(0, 0));
        let low = d.step(t + s, at(0, 0)).unwrap();
        assert_eq!(None, d.step(t + s + s / 20, at(0, 0)), "not a look yet");
        assert_eq!(low, 10_625 * 9 / 10);
        // 20 ms of swap-ins in the next tenth: 20% against 0.17%.
        let up = d.step(t + s + s / 10, at(20_000_000, 300)).unwrap();
        assert_eq!(up, 10_625, "back to the peak and a sixteenth");
        // The refill goes on at the next look: no higher (it compounded
        // to thousands of times the tree once).
        let again = d.step(t + s + s / 5, at(40_000_000, 600));
        assert!(again.is_none_or(|b| b == up), "{again:?}");
        // The interval starts again from the back-off.
        assert_eq!(None, d.step(t + s + 3 * s / 10, at(40_000_000, 600)));
    }

    /// A probe's cut, staged on probation, taken back by swap-cache hits:
    /// as many hits as the cut are how the controller learns the pages
    /// are in use, no pressure; more are pages cut and taken back again,
    /// pressure at their stall.
    #[test]
    fn hits_past_the_cut_are_pressure_and_the_cut_itself_is_not() {
        let t = std::time::Instant::now();
        let s = Duration::from_secs(1);
        let at = |stall_ns, faults, hits| Counts {
            charge: 10_000,
            stall_ns,
            faults,
            swapins: 0,
            hits,
        };
        for (hits, pressed) in [(400, false), (438, false), (4_000, true)] {
            let mut d = Driver::new(tuning(100, 1 << 30), 20_000);
            d.step(t, at(0, 0, 0));
            // Settled at 10,625, probed down to 9,562: 438 pages cut from
            // the charge of 10,000.
            let low = d.step(t + s, at(0, 0, 0)).unwrap();
            assert_eq!(low, 10_625 * 9 / 10);
            // A look later: `hits` faults, all hits, 5 ms of stall (5%).
            let b = d.step(t + s + s / 10, at(5_000_000, hits, hits));
            if pressed {
                assert_eq!(b, Some(10_625), "{hits} hits: back up at once");
            } else {
                assert_eq!(b, None, "{hits} hits within the cut");
            }
        }
    }

    /// A tree whose every page is in use (pressure whenever the budget is
    /// under its working set): probes stop at the knee the first back-off
    /// found, and come back under it less and less often.
    #[test]
    fn a_tree_without_cold_memory_is_probed_less_and_less() {
        let ws = 100_000;
        let mut c = Controller::new(tuning(100, 1 << 30), 2 * ws);
        c.note_charge(ws);
        let (mut under, mut backoffs) = (0, 0);
        for _ in 0..300 {
            let short = c.budget() < ws;
            under += short as u32;
            let b = c.decide(Window {
                pressure: if short { 0.5 } else { 0.0 },
                touched: 0,
                charge: c.budget().min(ws),
            });
            if short {
                backoffs += 1;
                assert!(b > ws, "a back-off goes over the working set: {b}");
            }
        }
        // The first back-off after the descent, one more probe, then
        // holds of 2, 4, 8, 16, 32, 64 and 128 intervals.
        assert!(backoffs <= 9, "{backoffs} back-offs in 300 intervals");
        assert!(under <= 9, "under the working set {under} of 300 intervals");
        assert!(c.budget() >= ws, "{}", c.budget());
    }

    #[test]
    fn a_tree_without_cold_memory_stops_the_descent() {
        // Pressure just at the target: the probe is zero.
        let mut c = Controller::new(tuning(100, 1 << 20), 50_000);
        let b = c.decide(Window {
            pressure: 0.0017,
            touched: 0,
            charge: 50_000,
        });
        assert_eq!(b, 50_000);
    }

    proptest! {
        /// Whatever the tree does, the budget stays within its bounds and
        /// above what the tree touched, moves down by at most a probe, and
        /// goes up when pressure passes the target under a budget that
        /// binds, to the tree's charge and a sixteenth at most.
        #[test]
        fn the_budget_stays_bounded_and_moves_as_pressure_says(
            start in 1u64..1 << 24,
            min in 1u64..1 << 12,
            max in 1u64 << 12..1 << 26,
            windows in proptest::collection::vec((0.0f64..0.05, 0u64..1 << 22, 0u64..1 << 24), 1..64),
        ) {
            let mut c = Controller::new(tuning(min, max), start);
            prop_assert!(c.budget() >= min.min(max) && c.budget() <= max.max(min));
            for (pressure, touched, charge) in windows {
                let before = c.budget();
                let b = c.decide(Window { pressure, touched, charge });
                let ceiling = max.max(min);
                let floor = min.max(touched).min(ceiling);
                prop_assert!(b >= floor);
                prop_assert!(b <= ceiling);
                if pressure > c.tuning.target {
                    let binds = charge + before / 16 >= before;
                    let cap = charge + charge / 16;
                    if binds && before < ceiling.min(cap) {
                        prop_assert!(b > before);
                    }
                    prop_assert!(b <= before.max(cap).max(floor));
                }
                if b < before {
                    prop_assert!((before - b) as f64 <= before as f64 * c.tuning.max_probe + 1.0);
                }
            }
        }
    }
}
