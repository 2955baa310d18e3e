//! `uswap run --budget auto[:TARGET][,max=SIZE][,min=SIZE]`: the tree's
//! budget driven by its memory pressure (`uswap::domain::auto`), from the
//! supervisor's loop.
//!
//! Every interval the supervisor reads the members' stall time, faults and
//! swap-ins from the domain (one pass over its slots), turns them into the
//! tree's stall share for want of memory (the swap-ins' part of the stall:
//! a first touch waits too, and says nothing of the budget) and the pages
//! it faulted in, and writes the budget the
//! controller decides; the members follow it as they follow any change
//! (`ctl.rs`).  Between intervals it costs nothing.

use std::time::Instant;

use anyhow::{bail, Context};
use uswap::domain::auto::{Counts, Driver, Tuning};
use uswap::domain::{Activity, Arbiter};

/// What `--budget auto...` asked for: the tuning, and the budget to start
/// from (`max=`, else the default share of memory).
pub struct AutoSpec {
    pub tuning: Tuning,
    pub start: Option<u64>,
}

/// Parse `auto[:TARGET][,max=SIZE][,min=SIZE]`; None when `s` is not an
/// auto budget.  TARGET is a stall share: `0.2%`.
pub fn parse(s: &str) -> anyhow::Result<Option<AutoSpec>> {
    let Some(rest) = s.strip_prefix("auto") else {
        return Ok(None);
    };
    let page = uswap::PAGE_SIZE as u64;
    let mut tuning = Tuning::default();
    let mut start = None;
    let mut parts = rest.split(',');
    let head = parts.next().unwrap_or("");
    if let Some(t) = head.strip_prefix(':') {
        let pct: f64 = t
            .strip_suffix('%')
            .and_then(|p| p.trim().parse().ok())
            .filter(|p: &f64| *p > 0.0 && *p < 100.0)
            .with_context(|| format!("--budget {s}: the target is a stall share such as 0.2%"))?;
        tuning.target = pct / 100.0;
    } else if !head.is_empty() {
        bail!("--budget {s}: auto, auto:TARGET, then ,max=SIZE and ,min=SIZE (e.g. auto:0.2%,max=4G)");
    }
    for p in parts {
        let (k, v) = p
            .split_once('=')
            .with_context(|| format!("--budget {s}: {p:?} is not max=SIZE or min=SIZE"))?;
        let bytes = uswap_bench::parse_bytes(v).map_err(|e| anyhow::anyhow!("--budget {s}: {v}: {e}"))?;
        match k {
            "max" => {
                tuning.max = bytes / page;
                start = Some(bytes);
            }
            "min" => tuning.min = (bytes / page).max(1),
            _ => bail!("--budget {s}: {k}= is not max= or min="),
        }
    }
    if tuning.min > tuning.max {
        bail!("--budget {s}: min= is above max=");
    }
    Ok(Some(AutoSpec { tuning, start }))
}

/// The controller in the supervisor's loop.
pub struct AutoBudget {
    driver: Driver,
    on: bool,
}

impl AutoBudget {
    pub fn new(tuning: Tuning, start_pages: u64) -> AutoBudget {
        AutoBudget {
            driver: Driver::new(tuning, start_pages),
            on: true,
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
    }

    /// One supervisor tick: a decision once an interval has passed.
    pub fn tick(&mut self, arbiter: &mut Arbiter, now: Instant) {
        if !self.on {
            return;
        }
        // The members' counts are a pass over the domain's slots: read
        // once an interval, not every tick.
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
        };
        if let Some(b) = self.driver.step(now, counts) {
            if b != arbiter.budget_pages() {
                arbiter.set_budget(b);
            }
        }
    }

    /// One line for `uswap ctl status`.
    pub fn describe(&self) -> String {
        let mib = |p: u64| (p * uswap::PAGE_SIZE as u64) >> 20;
        let t = &self.driver.controller.tuning;
        format!(
            "auto {}: pressure {:.2}% against a target of {:.2}%, {} MiB saved under the peak, between {} and {} MiB",
            if self.on { "on" } else { "off" },
            self.driver.pressure() * 100.0,
            t.target * 100.0,
            mib(self.driver.controller.saved()),
            mib(t.min),
            if t.max == u64::MAX { "no".to_string() } else { mib(t.max).to_string() },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_budgets_parse_and_bad_ones_say_why() {
        assert!(parse("1G").unwrap().is_none());
        let a = parse("auto").unwrap().unwrap();
        assert_eq!(a.tuning, Tuning::default());
        assert!(a.start.is_none());
        let a = parse("auto:0.5%,max=4G,min=256M").unwrap().unwrap();
        assert_eq!(a.tuning.target, 0.005);
        assert_eq!(a.tuning.max, (4u64 << 30) / uswap::PAGE_SIZE as u64);
        assert_eq!(a.tuning.min, (256u64 << 20) / uswap::PAGE_SIZE as u64);
        assert_eq!(a.start, Some(4 << 30));
        for (bad, why) in [
            ("auto:fast", "a stall share such as 0.2%"),
            ("autox", "auto, auto:TARGET"),
            ("auto,max=lots", "lots"),
            ("auto,size=1G", "size= is not"),
            ("auto,max=1G,min=2G", "min= is above max="),
        ] {
            let e = parse(bad).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
