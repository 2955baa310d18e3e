//! `uswap run --budget auto[:TARGET][,max=SIZE][,min=SIZE][,step=PCT][,interval=DURATION]`: the tree's
//! budget driven by its memory pressure (`uswap::domain::auto`), from the
//! supervisor's loop.
//!
//! Every tenth of an interval (a look) the supervisor reads the members'
//! stall time, faults and swap-ins from the domain (one pass over its
//! slots); the driver turns them into the tree's stall share for want of
//! memory (the swap-ins' part of the stall: a first touch waits too, and
//! says nothing of the budget) and the pages it faulted in, and the
//! supervisor writes the budget the controller decides; the members
//! follow it as they follow any change (`ctl.rs`).  Its cost did not show
//! against the supervisor's own loop: 0.25 s of CPU over 15 s with it,
//! 0.27 s without (`uswap run --budget auto -- sleep 15` against
//! `--budget 1G`, two runs each).

use std::path::{Path, PathBuf};
use std::time::Instant;

use uswap::domain::auto::{Counts, Driver, Tuning};
use uswap::domain::{Activity, Arbiter};

/// What the controller last decided, published beside the members'
/// statistics as `auto-PID.state` (PID the supervisor's), so that `uswap
/// stat`, `uswap top` and the Prometheus output read a file and never call
/// into the tree.  Rewritten once an interval (a write and a rename): a
/// few lines a second.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct AutoState {
    /// Whether the controller drives the budget (`uswap ctl auto`).
    pub on: bool,
    /// The stall share it keeps the tree under.
    pub target: f64,
    /// The stall share of its last interval.
    pub pressure: f64,
    /// The budget it set last, in bytes.
    pub budget: u64,
    /// The tree's charge at its peak, in bytes.
    pub peak: u64,
    /// The budget's distance under that peak, in bytes.
    pub saved: u64,
}

impl AutoState {
    fn text(&self) -> String {
        format!(
            "on {}\ntarget {}\npressure {}\nbudget {}\npeak {}\nsaved {}\n",
            self.on as u8, self.target, self.pressure, self.budget, self.peak, self.saved
        )
    }

    /// Parse what [`AutoState::text`] wrote; None when it is not whole.
    fn parse(s: &str) -> Option<AutoState> {
        let get = |k: &str| {
            s.lines()
                .find_map(|l| l.strip_prefix(k)?.strip_prefix(' '))
                .map(str::trim)
        };
        Some(AutoState {
            on: get("on")? == "1",
            target: get("target")?.parse().ok()?,
            pressure: get("pressure")?.parse().ok()?,
            budget: get("budget")?.parse().ok()?,
            peak: get("peak")?.parse().ok()?,
            saved: get("saved")?.parse().ok()?,
        })
    }

    /// The file of the tree supervised by `supervisor`, in `dir`.
    pub fn path(dir: &Path, supervisor: i32) -> PathBuf {
        dir.join(format!("auto-{supervisor}.state"))
    }

    /// What the controller of `supervisor`'s tree published last; None
    /// for a tree without `--budget auto` (or before its first interval).
    pub fn read(dir: &Path, supervisor: i32) -> Option<AutoState> {
        AutoState::parse(&std::fs::read_to_string(AutoState::path(dir, supervisor)).ok()?)
    }
}

/// The controller in the supervisor's loop.
pub struct AutoBudget {
    driver: Driver,
    on: bool,
    /// Where its state is published (`AutoState`); None without a
    /// statistics directory, where the tree runs all the same.
    published: Option<PathBuf>,
    /// Every decision, a line each (`uswap run --auto-log`), and when the
    /// first was made.
    log: Option<(std::io::BufWriter<std::fs::File>, Instant)>,
}

/// The first line of an `--auto-log` file: what each column is.
const LOG_HEADER: &str =
    "# seconds budget_mib charge_mib pressure faults swapins hits stall_ms (one line a decision)";

impl AutoBudget {
    /// A controller starting at `start_pages`, over `arbiter`'s domain,
    /// whose members it puts on probation for an interval at each cut
    /// (`SwapBuilder::probation`): made before the program starts, so
    /// that every member sets staging frames aside for it.
    pub fn new(tuning: Tuning, start_pages: u64, arbiter: &Arbiter) -> AutoBudget {
        let published = uswap::stats::live::ensure_directory()
            .ok()
            .map(|d| AutoState::path(&d, std::process::id() as i32));
        arbiter.set_dwell(Some(tuning.interval));
        AutoBudget {
            driver: Driver::new(tuning, start_pages),
            on: true,
            published,
            log: None,
        }
    }

    /// Write every decision to `file` (`uswap run --auto-log`).
    pub fn log_to(&mut self, file: std::fs::File) -> std::io::Result<()> {
        use std::io::Write;
        let mut w = std::io::BufWriter::new(file);
        writeln!(w, "{LOG_HEADER}")?;
        w.flush()?;
        self.log = Some((w, Instant::now()));
        Ok(())
    }

    /// One decision's line: when, the budget set, what the tree was
    /// charged and did.  Flushed at once, for a reader following it (a
    /// lost line is a lost line: the tree runs on).
    fn log(&mut self, now: Instant, budget: u64, c: &Counts) {
        use std::io::Write;
        let pressure = self.driver.pressure();
        let Some((w, t0)) = &mut self.log else {
            return;
        };
        let mib = |p: u64| (p * uswap::PAGE_SIZE as u64) >> 20;
        let _ = writeln!(
            w,
            "{:.2} {} {} {:.5} {} {} {} {}",
            now.duration_since(*t0).as_secs_f64(),
            mib(budget),
            mib(c.charge),
            pressure,
            c.faults,
            c.swapins,
            c.hits,
            c.stall_ns / 1_000_000
        )
        .and_then(|()| w.flush());
    }

    /// The state as published.
    pub fn state(&self, budget_pages: u64) -> AutoState {
        let page = uswap::PAGE_SIZE as u64;
        let c = &self.driver.controller;
        AutoState {
            on: self.on,
            target: c.tuning.target,
            pressure: self.driver.pressure(),
            budget: budget_pages * page,
            peak: c.peak() * page,
            saved: c.peak().saturating_sub(budget_pages) * page,
        }
    }

    fn publish(&self, budget_pages: u64) {
        let Some(path) = &self.published else { return };
        // Written whole beside it, then renamed over it: a reader sees
        // the last state or this one, never half of one.
        let tmp = path.with_extension("tmp");
        if std::fs::write(&tmp, self.state(budget_pages).text()).is_ok() {
            let _ = std::fs::rename(&tmp, path);
        }
    }

    /// Whether it drives the budget.
    pub fn on(&self) -> bool {
        self.on
    }

    /// Stop or start driving the budget (`uswap ctl auto off|on`).
    /// Started again, it begins from the budget as it is.
    pub fn set_on(&mut self, on: bool, arbiter: &Arbiter) {
        if on && !self.on {
            self.driver = Driver::new(self.driver.controller.tuning, arbiter.budget_pages());
        }
        self.on = on;
        // Off, a cut (`uswap ctl budget`) is followed at once.
        arbiter.set_dwell(on.then_some(self.driver.controller.tuning.interval));
        self.publish(arbiter.budget_pages());
    }

    /// One supervisor tick: a look every tenth of an interval, a decision
    /// once an interval has passed.
    pub fn tick(&mut self, arbiter: &mut Arbiter, now: Instant) {
        if !self.on {
            return;
        }
        // The members' counts are a pass over the domain's slots: read
        // at each look, a tenth of an interval, not every tick.
        if !self.driver.due(now) {
            return;
        }
        let act: Activity = arbiter.activity();
        let (resident, other) = arbiter.charged();
        let counts = Counts {
            charge: resident + other,
            stall_ns: act.stall_ns,
            faults: act.faults,
            swapins: act.swapins,
            hits: act.hits,
        };
        // Published with each decision (once an interval, or a look's
        // back-off), not with every look.
        if let Some(b) = self.driver.step(now, counts) {
            self.log(now, b, &counts);
            if b != arbiter.budget_pages() {
                arbiter.set_budget(b);
            }
            self.publish(arbiter.budget_pages());
        }
    }

    /// One line for `uswap ctl status`, from the state as published (the
    /// savings against the budget as it is, `budget_pages`, which `uswap
    /// ctl budget` may have set while the controller was off).
    pub fn describe(&self, budget_pages: u64) -> String {
        let mib = |p: u64| (p * uswap::PAGE_SIZE as u64) >> 20;
        let t = &self.driver.controller.tuning;
        let s = self.state(budget_pages);
        format!(
            "auto {}: pressure {:.2}% against a target of {:.2}%, {} MiB saved under the peak, between {} and {} MiB",
            if s.on { "on" } else { "off" },
            s.pressure * 100.0,
            s.target * 100.0,
            s.saved >> 20,
            mib(t.min),
            if t.max == u64::MAX { "no".to_string() } else { mib(t.max).to_string() },
        )
    }
}

impl Drop for AutoBudget {
    fn drop(&mut self) {
        if let Some(p) = &self.published {
            let _ = std::fs::remove_file(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_published_state_reads_back_and_a_torn_one_does_not() {
        let s = AutoState {
            on: true,
            target: 0.0017,
            pressure: 0.000_25,
            budget: 300 << 20,
            peak: 2 << 30,
            saved: (2 << 30) - (300 << 20),
        };
        assert_eq!(AutoState::parse(&s.text()), Some(s.clone()));
        let text = s.text();
        assert_eq!(AutoState::parse(&text[..text.len() / 2]), None);
    }
}
