//! Watching paged programs while they run: `uswap stat` and `uswap top`.
//!
//! Both read what each instance publishes (`uswap::stats::live`): a
//! block of statistics per process, mapped read-only here, read with
//! plain loads.  Nothing here calls into a paged process or takes a lock
//! of its pager, so watching never slows paging.
//!
//! A process tree under `uswap run` is one group (its blocks name the
//! supervisor's pid), shown as one block with a row per process; an
//! instance alone (a library's) is a group of one.

pub mod prometheus;
pub mod stat;
pub mod top;

use std::collections::BTreeMap;

use anyhow::Context;

use crate::autobudget::AutoState;
use uswap::stats::live::{self, Entry};
use uswap::stats::{Counters, Gauges, Identity, Latency, Stats};

/// One process's published statistics, read now.
pub struct Process {
    /// Who it is.
    pub id: Identity,
    /// Its statistics.
    pub stats: Stats,
}

/// A tree under one `uswap run`, or an instance alone.
pub struct Group {
    /// The supervisor's pid, or the process's own when alone.
    pub id: i32,
    /// Whether it is a tree (its blocks name a supervisor).
    pub tree: bool,
    /// Its processes, oldest first.
    pub members: Vec<Process>,
    /// For a tree under `--budget auto`, what its controller published
    /// last.
    pub auto: Option<AutoState>,
}

impl Group {
    /// The process the tree began with (the supervisor's child), or the
    /// oldest.
    pub fn root(&self) -> &Process {
        self.members
            .iter()
            .find(|m| m.id.parent == self.id)
            .unwrap_or(&self.members[0])
    }

    /// Counters summed over the members (each counts its own events since
    /// its start or fork, so the sum is the tree's).
    pub fn counters(&self) -> Counters {
        self.members
            .iter()
            .fold(Counters::default(), |a, m| a.plus(&m.stats.counters))
    }

    /// Levels summed over the members; the budget is the tree's (each
    /// member names the same one).
    pub fn gauges(&self) -> Gauges {
        let mut g = self
            .members
            .iter()
            .fold(Gauges::default(), |a, m| a.plus(&m.stats.gauges));
        g.budget = self
            .members
            .iter()
            .map(|m| m.stats.gauges.budget)
            .max()
            .unwrap_or(0);
        g
    }

    /// Fault latency bands summed over the members.
    pub fn latency(&self) -> Latency {
        self.members
            .iter()
            .fold(Latency::default(), |a, m| a.plus(&m.stats.fault_latency))
    }

    /// The member whose threads stalled most over the last 10 s: a tree's
    /// pressure is reported as its most stalled process's (the union of
    /// several processes' stalls is not known from their totals).
    pub fn most_stalled(&self) -> &Process {
        self.members
            .iter()
            .max_by(|a, b| {
                a.stats
                    .pressure
                    .some
                    .avg10
                    .total_cmp(&b.stats.pressure.some.avg10)
                    .then(
                        a.stats
                            .pressure
                            .some
                            .total_us
                            .cmp(&b.stats.pressure.some.total_us),
                    )
            })
            .unwrap_or(&self.members[0])
    }
}

/// Every live instance of this user, grouped; an empty list when the
/// directory does not exist yet (nothing has run).
pub fn gather() -> anyhow::Result<Vec<Group>> {
    let dir = live::directory();
    if !dir.exists() {
        return Ok(Vec::new());
    }
    let entries = live::scan(&dir).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut groups = group(entries);
    for g in groups.iter_mut().filter(|g| g.tree) {
        g.auto = AutoState::read(&dir, g.id);
    }
    Ok(groups)
}

fn group(entries: Vec<Entry>) -> Vec<Group> {
    let mut groups: BTreeMap<(i32, bool), Vec<Process>> = BTreeMap::new();
    for e in entries {
        let stats = e.stats();
        let key = if e.identity.group != 0 {
            (e.identity.group, true)
        } else {
            (e.identity.pid, false)
        };
        groups.entry(key).or_default().push(Process {
            id: e.identity,
            stats,
        });
    }
    groups
        .into_iter()
        .map(|((id, tree), members)| Group {
            id,
            tree,
            members,
            auto: None,
        })
        .collect()
}

/// The groups `pid` selects: the tree it supervises, or the process
/// itself (alone, or as a row of its tree); an error naming why when
/// there is none.
pub fn select(groups: Vec<Group>, pid: Option<i32>) -> anyhow::Result<Vec<Group>> {
    let Some(pid) = pid else {
        return Ok(groups);
    };
    let mut out = Vec::new();
    for g in groups {
        if g.id == pid && g.tree {
            out.push(g);
        } else if let Some(i) = g.members.iter().position(|m| m.id.pid == pid) {
            let mut g = g;
            let m = g.members.swap_remove(i);
            out.push(Group {
                id: m.id.pid,
                tree: false,
                members: vec![m],
                auto: None,
            });
        }
    }
    if out.is_empty() {
        let dir = live::directory();
        let owner = std::fs::metadata(format!("/proc/{pid}"))
            .ok()
            .map(|m| std::os::unix::fs::MetadataExt::uid(&m));
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        return Err(match owner {
            None => anyhow::anyhow!("no process {pid}"),
            Some(uid) if uid != me => anyhow::anyhow!(
                "process {pid} is user {uid}'s: its statistics are in that user's directory, which only it may read; run uswap stat as that user"
            ),
            Some(_) => anyhow::anyhow!(
                "process {pid} publishes no uswap statistics in {} (it is not paged by uswap, or runs with another USWAP_RUNTIME_DIR or XDG_RUNTIME_DIR)",
                dir.display()
            ),
        })
        .context("uswap stat");
    }
    Ok(out)
}

/// Bytes as a person reads them: 1.5G, 640M, 12K.
pub fn human(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)];
    for (u, n) in UNITS {
        if bytes >= n {
            let v = bytes as f64 / n as f64;
            return if v < 10.0 {
                format!("{v:.1}{u}")
            } else {
                format!("{v:.0}{u}")
            };
        }
    }
    format!("{bytes}B")
}

/// The store's ratio now: bytes of pages it holds over the memory it
/// uses for them (fragmentation and tables included); None without a
/// store or while it is empty.
pub fn store_ratio(g: &Gauges) -> Option<f64> {
    (g.store_mem_bytes > 0 && g.store_orig_bytes > 0)
        .then(|| g.store_orig_bytes as f64 / g.store_mem_bytes as f64)
}
