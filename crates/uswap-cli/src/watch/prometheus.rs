//! Prometheus's text exposition format (version 0.0.4): every family
//! once, with its HELP and TYPE, and a sample per process, labelled with
//! its pid, its group (the `uswap run` it belongs to, or its own pid) and
//! its command.  Units as Prometheus names them: bytes (pages are
//! converted), seconds (nanoseconds are), counters ending in `_total`.

use std::fmt::Write as _;

use uswap::stats::{Counters, EventKind, Gauges, Unit, LATENCY_BUCKETS};
use uswap::PAGE_SIZE;

use super::{Group, Process};
use crate::autobudget::AutoState;

/// One metric family: its samples, each a label set (beyond the
/// process's) and a value.
struct Family {
    name: String,
    kind: &'static str,
    help: String,
    samples: Vec<(String, String)>,
}

/// A label value, escaped as the format asks (backslash, quote, newline).
fn escape(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for ch in v.chars() {
        match ch {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

fn labels(g: &Group, p: &Process, extra: &str) -> String {
    let mut l = format!(
        "pid=\"{}\",group=\"{}\",command=\"{}\"",
        p.id.pid,
        g.id,
        escape(&p.id.command)
    );
    if !extra.is_empty() {
        l.push(',');
        l.push_str(extra);
    }
    l
}

/// A float as the format writes it.
fn num(v: f64) -> String {
    if v.is_finite() {
        format!("{v}")
    } else {
        "NaN".into()
    }
}

/// The exported name and scale of a statistic kept in `unit`.
fn exported(name: &str, unit: Unit, counter: bool) -> (String, f64) {
    let page = PAGE_SIZE as f64;
    let total = if counter { "_total" } else { "" };
    match unit {
        Unit::Pages => {
            let base = name.strip_suffix("_pages").unwrap_or(name);
            (format!("uswap_{base}_bytes{total}"), page)
        }
        Unit::Nanos => {
            let base = name.strip_suffix("_ns").unwrap_or(name);
            (format!("uswap_{base}_seconds{total}"), 1e-9)
        }
        Unit::Bytes => {
            let base = name.strip_suffix("_bytes").unwrap_or(name);
            (format!("uswap_{base}_bytes{total}"), 1.0)
        }
        Unit::Events => (format!("uswap_{name}{total}"), 1.0),
    }
}

/// The exposition of every process of `groups`.
pub fn render(groups: &[Group]) -> String {
    let procs: Vec<(&Group, &Process)> = groups
        .iter()
        .flat_map(|g| g.members.iter().map(move |p| (g, p)))
        .collect();
    let mut fams: Vec<Family> = Vec::new();

    fams.push(Family {
        name: "uswap_info".into(),
        kind: "gauge",
        help: "A process paged by uswap (always 1), with its fault mode.".into(),
        samples: procs
            .iter()
            .map(|(g, p)| (labels(g, p, &format!("mode=\"{}\"", p.id.mode)), "1".into()))
            .collect(),
    });

    // Every counter and gauge of the table: each process's values read
    // once, in the table's order.
    let counters: Vec<Vec<u64>> = procs
        .iter()
        .map(|(_, p)| p.stats.counters.iter().map(|c| c.1).collect())
        .collect();
    let gauges: Vec<Vec<u64>> = procs
        .iter()
        .map(|(_, p)| p.stats.gauges.iter().map(|c| c.1).collect())
        .collect();
    for (table, values, counter) in [
        (Counters::TABLE, &counters, true),
        (Gauges::TABLE, &gauges, false),
    ] {
        for (i, (name, unit, help)) in table.iter().enumerate() {
            // Stalled time is exported as pressure, below.
            if name.starts_with("stall_") {
                continue;
            }
            let (fname, scale) = exported(name, *unit, counter);
            fams.push(Family {
                name: fname,
                kind: if counter { "counter" } else { "gauge" },
                help: help.trim().to_string(),
                samples: procs
                    .iter()
                    .zip(values)
                    .map(|((g, p), v)| (labels(g, p, ""), num(v[i] as f64 * scale)))
                    .collect(),
            });
        }
    }
    let per_site = |f: &dyn Fn(uswap::stats::LockStats) -> f64| {
        procs
            .iter()
            .flat_map(|(g, p)| {
                p.stats
                    .locks
                    .iter()
                    .map(|(site, l)| (labels(g, p, &format!("site=\"{site}\"")), num(f(l))))
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
    };
    fams.push(Family {
        name: "uswap_lock_acquisitions_total".into(),
        kind: "counter",
        help: "Times a lock of the site was taken.".into(),
        samples: per_site(&|l| l.acquisitions as f64),
    });
    fams.push(Family {
        name: "uswap_lock_contended_total".into(),
        kind: "counter",
        help: "Times a lock of the site was found held.".into(),
        samples: per_site(&|l| l.contended as f64),
    });
    fams.push(Family {
        name: "uswap_lock_wait_seconds_total".into(),
        kind: "counter",
        help: "Time spent waiting for locks of the site.".into(),
        samples: per_site(&|l| l.wait_ns as f64 * 1e-9),
    });

    // Fault latency as a histogram: cumulative buckets at the bands'
    // upper bounds, in seconds.
    let mut hist = Vec::new();
    for (g, p) in &procs {
        let b = &p.stats.fault_latency.buckets;
        let mut cum = 0u64;
        for (i, n) in b.iter().enumerate().take(LATENCY_BUCKETS - 1) {
            cum += n;
            let le = (1u64 << i) as f64 * 1e-9;
            hist.push((
                format!(
                    "uswap_fault_latency_seconds_bucket{{{}}}",
                    labels(g, p, &format!("le=\"{}\"", num(le)))
                ),
                cum.to_string(),
            ));
        }
        let count = p.stats.fault_latency.count();
        hist.push((
            format!(
                "uswap_fault_latency_seconds_bucket{{{}}}",
                labels(g, p, "le=\"+Inf\"")
            ),
            count.to_string(),
        ));
        hist.push((
            format!("uswap_fault_latency_seconds_sum{{{}}}", labels(g, p, "")),
            num(p.stats.counters.fault_ns as f64 * 1e-9),
        ));
        hist.push((
            format!("uswap_fault_latency_seconds_count{{{}}}", labels(g, p, "")),
            count.to_string(),
        ));
    }

    let pressure = |line: &str| {
        procs
            .iter()
            .flat_map(|(g, p)| {
                let l = if line == "some" {
                    p.stats.pressure.some
                } else {
                    p.stats.pressure.full
                };
                [("10", l.avg10), ("60", l.avg60), ("300", l.avg300)]
                    .into_iter()
                    .map(|(w, v)| (labels(g, p, &format!("window=\"{w}s\"")), num(v / 100.0)))
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
    };
    let stalled = |full: bool| {
        procs
            .iter()
            .map(|(g, p)| {
                let l = if full {
                    p.stats.pressure.full
                } else {
                    p.stats.pressure.some
                };
                (labels(g, p, ""), num(l.total_us as f64 * 1e-6))
            })
            .collect::<Vec<_>>()
    };
    fams.push(Family {
        name: "uswap_pressure_some_ratio".into(),
        kind: "gauge",
        help: "Share of wall time some thread was stalled in uswap, averaged over the window (PSI some avgN / 100).".into(),
        samples: pressure("some"),
    });
    fams.push(Family {
        name: "uswap_pressure_full_ratio".into(),
        kind: "gauge",
        help: "Share of wall time every thread was stalled in uswap at once, averaged over the window (PSI full avgN / 100).".into(),
        samples: pressure("full"),
    });
    fams.push(Family {
        name: "uswap_pressure_some_seconds_total".into(),
        kind: "counter",
        help: "Time some thread of the process was stalled in uswap (PSI some total).".into(),
        samples: stalled(false),
    });
    fams.push(Family {
        name: "uswap_pressure_full_seconds_total".into(),
        kind: "counter",
        help: "Time every thread of the process was stalled in uswap at once (PSI full total).".into(),
        samples: stalled(true),
    });
    fams.push(Family {
        name: "uswap_events_total".into(),
        kind: "counter",
        help: "Events, as memory.events counts a cgroup's: oom_kill, budget_changed, writeback_paused, slot_retired, page_poisoned, sigbus_blocked, unevictable, child_file_failed, no_io_uring.".into(),
        samples: procs
            .iter()
            .flat_map(|(g, p)| {
                EventKind::ALL
                    .iter()
                    .map(|k| {
                        (
                            labels(g, p, &format!("kind=\"{}\"", k.name())),
                            p.stats.events.count(*k).to_string(),
                        )
                    })
                    .collect::<Vec<_>>()
            })
            .collect(),
    });
    let device = |used: bool| {
        procs
            .iter()
            .flat_map(|(g, p)| {
                p.stats
                    .devices
                    .iter()
                    .enumerate()
                    .map(|(i, d)| {
                        let v = if used { d.used } else { d.slots };
                        (
                            labels(g, p, &format!("device=\"{i}\",kind=\"{}\"", d.kind)),
                            (v * PAGE_SIZE as u64).to_string(),
                        )
                    })
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
    };
    fams.push(Family {
        name: "uswap_device_swapped_bytes".into(),
        kind: "gauge",
        help: "Bytes out on the swap device (its slots in use).".into(),
        samples: device(true),
    });
    fams.push(Family {
        name: "uswap_device_size_bytes".into(),
        kind: "gauge",
        help: "Bytes the swap device can hold.".into(),
        samples: device(false),
    });

    // `--budget auto`: one sample a tree, labelled with its group and the
    // command it began with (the controller is the tree's, not a
    // process's).
    let auto = |f: &dyn Fn(&AutoState) -> f64| {
        groups
            .iter()
            .filter_map(|g| {
                let a = g.auto.as_ref()?;
                Some((
                    format!("group=\"{}\",command=\"{}\"", g.id, escape(&g.root().id.command)),
                    num(f(a)),
                ))
            })
            .collect::<Vec<_>>()
    };
    for (name, help, value) in [
        (
            "uswap_auto_on",
            "Whether --budget auto drives the tree's budget (uswap ctl auto on|off).",
            &(|a: &AutoState| a.on as u8 as f64) as &dyn Fn(&AutoState) -> f64,
        ),
        (
            "uswap_auto_budget_bytes",
            "The budget --budget auto set last.",
            &|a: &AutoState| a.budget as f64,
        ),
        (
            "uswap_auto_pressure_ratio",
            "The tree's stall share for want of memory over the controller's last interval.",
            &|a: &AutoState| a.pressure,
        ),
        (
            "uswap_auto_target_ratio",
            "The stall share the controller keeps the tree under.",
            &|a: &AutoState| a.target,
        ),
        (
            "uswap_auto_peak_bytes",
            "The tree's charge at its peak.",
            &|a: &AutoState| a.peak as f64,
        ),
        (
            "uswap_auto_saved_bytes",
            "The budget's distance under the tree's peak charge.",
            &|a: &AutoState| a.saved as f64,
        ),
    ] {
        let samples = auto(value);
        if !samples.is_empty() {
            fams.push(Family {
                name: name.into(),
                kind: "gauge",
                help: help.into(),
                samples,
            });
        }
    }

    let mut o = String::new();
    for f in &fams {
        let _ = writeln!(
            o,
            "# HELP {} {}",
            f.name,
            f.help.replace('\\', "\\\\").replace('\n', " ")
        );
        let _ = writeln!(o, "# TYPE {} {}", f.name, f.kind);
        for (l, v) in &f.samples {
            let _ = writeln!(o, "{}{{{l}}} {v}", f.name);
        }
    }
    let _ = writeln!(
        o,
        "# HELP uswap_fault_latency_seconds Time to serve a fault (upper bounds of power-of-two bands)."
    );
    let _ = writeln!(o, "# TYPE uswap_fault_latency_seconds histogram");
    for (k, v) in hist {
        let _ = writeln!(o, "{k} {v}");
    }
    o
}
