//! The budget is a promise: how far past it pages may stay resident when
//! nothing can be evicted, and what happens beyond.
//!
//! A fault must be served, so a full swap space (or a budget's worth of
//! pinned pages) keeps pages resident past the budget.  Unchecked, that
//! grows until the machine runs out of memory: `uswap demo --size 1T
//! --budget 1G` on 512 MiB of swap did.  A memory cgroup would OOM-kill
//! the process instead, and so does uswap, past a bounded overrun
//! ([`Overrun`], by default 10% of the budget): the faulting access that
//! would go further tries reclaim for a while (the background reclaimer,
//! writeback or another thread's free may yet make room), and when none
//! comes, says so in one line on stderr and kills the process with
//! SIGKILL, as the kernel's OOM killer does a cgroup's task.  Only a full
//! swap space counts: pages uswap cannot evict while swap is free (shared
//! with a forked child, pinned), and the dirty pages of a forked child
//! that may not write its parent's swap file, are uswap's limits, not the
//! program's overrun.
//! The bound is kept by `reclaim::hold_to_bound`.
//! [`Overrun::Unbounded`] keeps the old behaviour, for those who would
//! rather have the machine's memory than the promise.

use std::str::FromStr;

use crate::pager::instance::page::UNIT_PAGES;

/// How far past its budget an instance keeps pages resident when nothing
/// can be evicted (swap full, pages pinned); past it, the process is
/// killed, as a memory cgroup's OOM killer would.  Parsed from `10%`,
/// a size (`64M`) or `unbounded`; written back the same way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Overrun {
    /// A share of the budget, in percent (the default, 10).
    Percent(u32),
    /// Bytes.
    Bytes(u64),
    /// No bound: the resident set grows as far as the machine allows.
    Unbounded,
}

impl Default for Overrun {
    fn default() -> Self {
        Overrun::Percent(10)
    }
}

/// Room for the faults' slack over the budget before they reclaim (one
/// eviction batch at most; `reclaim.rs` asserts it fits).
pub(crate) const SLACK_ROOM: usize = 64;

/// What a bound must leave room for whatever it is: the faults' slack
/// and a 2 MB unit coming in whole.
pub(crate) const FLOOR_PAGES: usize = UNIT_PAGES + SLACK_ROOM;

impl Overrun {
    /// The bound in pages for a budget of `budget` pages (`usize::MAX`:
    /// none), at least `FLOOR_PAGES`.
    pub fn pages(self, budget: usize) -> usize {
        let page = crate::PAGE_SIZE as u64;
        let p = match self {
            Overrun::Unbounded => return usize::MAX,
            Overrun::Percent(pct) => (budget as u64).saturating_mul(pct as u64) / 100,
            Overrun::Bytes(b) => b / page,
        };
        usize::try_from(p).unwrap_or(usize::MAX).max(FLOOR_PAGES)
    }
}

/// An overrun that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("overrun {0:?}: give a share of the budget (10%), a size (64M), or unbounded")]
pub struct OverrunError(pub String);

impl FromStr for Overrun {
    type Err = OverrunError;

    fn from_str(s: &str) -> Result<Self, OverrunError> {
        let bad = || OverrunError(s.to_string());
        let t = s.trim();
        if t.eq_ignore_ascii_case("unbounded") {
            return Ok(Overrun::Unbounded);
        }
        if let Some(p) = t.strip_suffix('%') {
            return p.trim().parse::<u32>().map(Overrun::Percent).map_err(|_| bad());
        }
        parse_size::Config::new()
            .with_binary()
            .parse_size(t)
            .map(Overrun::Bytes)
            .map_err(|_| bad())
    }
}

impl std::fmt::Display for Overrun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Overrun::Percent(p) => write!(f, "{p}%"),
            Overrun::Bytes(b) => write!(f, "{b}"),
            Overrun::Unbounded => f.write_str("unbounded"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overruns_parse_and_print_back() {
        for (s, o) in [
            ("10%", Overrun::Percent(10)),
            ("0%", Overrun::Percent(0)),
            ("250%", Overrun::Percent(250)),
            ("64M", Overrun::Bytes(64 << 20)),
            ("unbounded", Overrun::Unbounded),
            ("Unbounded", Overrun::Unbounded),
        ] {
            assert_eq!(s.parse::<Overrun>(), Ok(o), "{s}");
            assert_eq!(o.to_string().parse::<Overrun>(), Ok(o), "{o}");
        }
        for s in ["", "%", "-1%", "ten%", "lots", "10%%"] {
            let e = s.parse::<Overrun>().unwrap_err().to_string();
            assert!(e.contains("unbounded") && !e.contains('\n'), "{s}: {e}");
        }
        assert_eq!(Overrun::default().pages(100_000), 10_000);
        assert_eq!(Overrun::Percent(0).pages(100_000), FLOOR_PAGES);
        assert_eq!(Overrun::Bytes(1 << 30).pages(10), 1 << 18);
        assert_eq!(Overrun::Unbounded.pages(10), usize::MAX);
    }
}
