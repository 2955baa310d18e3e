//! `uswap stat`: the statistics of running paged programs, as
//! `memory.stat`, `memory.pressure` and `memory.events` lay out a
//! cgroup's; or JSON; or Prometheus's text exposition.

use std::fmt::Write as _;
use std::time::Duration;

use clap::Args;
use uswap::stats::EventKind;
use uswap::PAGE_SIZE;

use super::{gather, human, select, store_ratio, Group, Process};

#[derive(Args, Debug)]
pub struct StatArgs {
    /// A process paged by uswap, or the pid of a `uswap run` (its whole
    /// tree).  Without one: every paged process of this user.
    pub pid: Option<i32>,
    /// Every paged process of this user (the default without a PID).
    #[arg(long, conflicts_with = "pid")]
    pub all: bool,
    /// One JSON document: a list of groups (a tree, or an instance alone),
    /// each with its processes and every statistic of each.
    #[arg(long, conflicts_with = "prometheus")]
    pub json: bool,
    /// Prometheus's text exposition format: every metric with HELP and
    /// TYPE, one label set per process (pid, group, command).
    #[arg(long)]
    pub prometheus: bool,
    /// Repeat every SECONDS until interrupted.
    #[arg(short = 'w', long = "watch", value_name = "SECONDS")]
    pub watch: Option<f64>,
}

pub fn run(args: &StatArgs) -> anyhow::Result<()> {
    if let Some(s) = args.watch {
        if !(s.is_finite() && s > 0.0) {
            anyhow::bail!("-w {s}: give a number of seconds above 0, such as 1 or 0.5");
        }
    }
    loop {
        let groups = select(gather()?, args.pid)?;
        let out = if args.json {
            json(&groups)?
        } else if args.prometheus {
            super::prometheus::render(&groups)
        } else if groups.is_empty() {
            format!(
                "no program is paged by uswap for this user now (nothing in {})\n",
                uswap::stats::live::directory().display()
            )
        } else {
            groups.iter().map(text).collect::<Vec<_>>().join("\n")
        };
        print!("{out}");
        let Some(s) = args.watch else {
            return Ok(());
        };
        if !args.json && !args.prometheus {
            println!();
        }
        std::thread::sleep(Duration::from_secs_f64(s));
    }
}

fn json(groups: &[Group]) -> anyhow::Result<String> {
    let doc: Vec<serde_json::Value> = groups
        .iter()
        .map(|g| {
            serde_json::json!({
                "group": g.id,
                "tree": g.tree,
                "command": g.root().id.command,
                "auto": g.auto,
                "processes": g.members.iter().map(|m| serde_json::json!({
                    "pid": m.id.pid,
                    "parent": m.id.parent,
                    "command": m.id.command,
                    "mode": m.id.mode,
                    "born_unix_ns": m.id.born_unix_ns,
                    "stats": m.stats,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    Ok(format!("{}\n", serde_json::to_string_pretty(&doc)?))
}

/// `uswap run --stats` for the members of its tree that ended without
/// running their exit handlers (a raw `exit_group`, or killed): their
/// last published statistics, as `uswap stat` shows a tree.
pub fn left_without_exit(group: i32, left: Vec<(uswap::stats::Identity, uswap::stats::Stats)>) -> String {
    let g = Group {
        id: group,
        tree: true,
        members: left
            .into_iter()
            .map(|(id, stats)| Process { id, stats })
            .collect(),
        auto: None,
    };
    format!(
        "uswap run: {} process{} ended without exit handlers (a raw exit_group, as Go's runtime makes, or killed); what {} published last:\n{}",
        g.members.len(),
        if g.members.len() == 1 { "" } else { "es" },
        if g.members.len() == 1 { "it" } else { "they" },
        text(&g)
    )
}

/// One group's block: key value lines in base units (bytes, counts,
/// microseconds where PSI has them), then pressure and events as the
/// kernel lays them out, then a row per process for a tree.
pub fn text(g: &Group) -> String {
    let page = PAGE_SIZE as u64;
    let c = g.counters();
    let gauges = g.gauges();
    let root = g.root();
    let mut o = String::new();
    let _ = writeln!(
        o,
        "# {} {}: {} ({} mode{})",
        if g.tree { "uswap run" } else { "process" },
        g.id,
        root.id.command,
        root.id.mode,
        if g.tree {
            format!(
                ", {} process{}",
                g.members.len(),
                if g.members.len() == 1 { "" } else { "es" }
            )
        } else {
            String::new()
        }
    );
    let mut kv = |k: &str, v: String| {
        let _ = writeln!(o, "{k} {v}");
    };
    kv("budget", (gauges.budget * page).to_string());
    // `--budget auto`: the controller's last interval, and the budget's
    // distance under the tree's peak charge.
    if let Some(a) = &g.auto {
        kv("auto", if a.on { "on" } else { "off" }.to_string());
        kv("auto_target", format!("{:.4}", a.target));
        kv("auto_pressure", format!("{:.4}", a.pressure));
        kv("auto_peak", a.peak.to_string());
        kv("auto_saved", a.saved.to_string());
    }
    kv("resident", (gauges.resident * page).to_string());
    if g.members.len() == 1 {
        kv("resident_peak", (gauges.resident_peak * page).to_string());
    }
    kv("staged", (gauges.staged_now * page).to_string());
    kv("swapped", (gauges.swapped * page).to_string());
    kv("swap_total", (gauges.swap_total * page).to_string());
    // Out by device: the same devices in every process of a tree (a
    // forked child's layers are counted on its parent's device).
    let mut devices: Vec<(String, u64, u64)> = Vec::new();
    for m in &g.members {
        for (i, d) in m.stats.devices.iter().enumerate() {
            match devices.get_mut(i) {
                Some(e) => {
                    e.2 += d.used;
                    e.1 = e.1.max(d.slots);
                }
                None => devices.push((d.kind.to_string(), d.slots, d.used)),
            }
        }
    }
    for (i, (kind, _, used)) in devices.iter().enumerate() {
        kv(&format!("swapped_dev{i}_{kind}"), (used * page).to_string());
    }
    if gauges.store_limit_bytes > 0 {
        kv("store_orig_bytes", gauges.store_orig_bytes.to_string());
        kv("store_compr_bytes", gauges.store_compr_bytes.to_string());
        kv("store_mem_bytes", gauges.store_mem_bytes.to_string());
        kv("store_mem_peak_bytes", gauges.store_mem_peak_bytes.to_string());
        kv("store_limit_bytes", gauges.store_limit_bytes.to_string());
        // Two ratios, labelled: what the store holds over the memory it
        // uses now, and over the most it has used (zram's mem_used_max):
        // what holding these pages cost at its worst.
        kv(
            "store_ratio_now",
            store_ratio(&gauges).map_or("-".into(), |r| format!("{r:.2}")),
        );
        kv(
            "store_ratio_vs_peak_mem",
            if gauges.store_mem_peak_bytes > 0 {
                format!(
                    "{:.2}",
                    gauges.store_orig_bytes as f64 / gauges.store_mem_peak_bytes as f64
                )
            } else {
                "-".into()
            },
        );
        kv("store_same_pages", gauges.store_same_pages.to_string());
        kv("store_written_back", c.store_writebacks.to_string());
    }
    kv("faults", c.faults.to_string());
    kv("faults_zero_fill", c.zero_fills.to_string());
    kv("faults_swapin", c.swapins.to_string());
    kv("faults_swapcache", c.swapcache_hits.to_string());
    kv("faults_write_protect", c.wp_faults.to_string());
    kv("faults_busy_wait", c.busy_waits.to_string());
    kv("fault_usec", (c.fault_ns / 1000).to_string());
    let lat = g.latency();
    kv(
        "fault_p50_usec_at_most",
        format!("{:.1}", lat.quantile_ns(0.5) as f64 / 1e3),
    );
    kv(
        "fault_p99_usec_at_most",
        format!("{:.1}", lat.quantile_ns(0.99) as f64 / 1e3),
    );
    kv(
        "fault_max_usec_at_most",
        format!("{:.1}", lat.quantile_ns(1.0) as f64 / 1e3),
    );
    kv("evictions", c.evictions.to_string());
    kv("evict_clean", c.evict_clean.to_string());
    kv("evict_write", c.evict_write.to_string());
    kv("evict_zero", c.evict_zero.to_string());
    kv("io_read_bytes", (c.io_read_pages * page).to_string());
    kv("io_write_bytes", (c.io_write_pages * page).to_string());
    kv("io_reads", c.io_reads.to_string());
    kv("io_writes", c.io_writes.to_string());
    kv("readahead_pages", c.readahead.to_string());
    kv("prefetched_pages", c.prefetched.to_string());
    kv("fault_around_pages", c.fault_around.to_string());
    kv("direct_reclaim", c.direct_reclaim.to_string());
    // memory.stat's names for the refault distance's two counts.
    kv("workingset_refault_anon", c.workingset_refault.to_string());
    kv("workingset_activate_anon", c.workingset_activate.to_string());
    kv("swap_full", c.swap_full.to_string());
    kv("overrun", c.budget_overrun.to_string());
    kv("unevictable_pages", c.unevictable.to_string());
    kv("io_errors_read", c.swapin_errors.to_string());
    kv("io_errors_write", c.swapout_errors.to_string());
    kv("poisoned", c.swapin_errors.to_string());
    let p = &g.most_stalled().stats.pressure;
    for (name, l) in [("some", &p.some), ("full", &p.full)] {
        let _ = writeln!(
            o,
            "{name} avg10={:.2} avg60={:.2} avg300={:.2} total={}",
            l.avg10, l.avg60, l.avg300, l.total_us
        );
    }
    for k in EventKind::ALL {
        let n: u64 = g.members.iter().map(|m| m.stats.events.count(k)).sum();
        let _ = writeln!(o, "{} {n}", k.name());
    }
    let mut recent: Vec<(i32, uswap::stats::Event)> = g
        .members
        .iter()
        .flat_map(|m| m.stats.events.recent.iter().map(|e| (m.id.pid, *e)))
        .collect();
    recent.sort_by_key(|(_, e)| e.unix_ns);
    for (pid, e) in recent.iter().rev().take(5).rev() {
        let _ = writeln!(
            o,
            "event {} pid={pid} {} value={}",
            time_of_day(e.unix_ns),
            e.kind.name(),
            e.value
        );
    }
    if g.tree {
        let _ = writeln!(
            o,
            "{:>8} {:>8} {:>9} {:>9} {:>9} {:>10} {:>6}  COMMAND",
            "PID", "PARENT", "RESIDENT", "PEAK", "SWAPPED", "FAULTS", "SOME10"
        );
        for m in &g.members {
            o.push_str(&row(m));
        }
    }
    o
}

fn row(m: &Process) -> String {
    let page = PAGE_SIZE as u64;
    let g = &m.stats.gauges;
    let swapped: u64 = m.stats.devices.iter().map(|d| d.used).sum();
    format!(
        "{:>8} {:>8} {:>9} {:>9} {:>9} {:>10} {:>6.2}  {}\n",
        m.id.pid,
        m.id.parent,
        human(g.resident * page),
        human(g.resident_peak * page),
        human(swapped * page),
        m.stats.counters.faults,
        m.stats.pressure.some.avg10,
        m.id.command
    )
}

/// HH:MM:SS.mmm (UTC) of a time in ns since the epoch.
pub fn time_of_day(unix_ns: u64) -> String {
    let s = unix_ns / 1_000_000_000;
    let ms = (unix_ns / 1_000_000) % 1000;
    format!(
        "{:02}:{:02}:{:02}.{ms:03}Z",
        (s / 3600) % 24,
        (s / 60) % 60,
        s % 60
    )
}
