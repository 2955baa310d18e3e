//! The side-by-side benches' tables, printed from a report: one row per
//! variant (score, ratio to its baseline, swap throughput, latency
//! percentiles, lock wait), the compressed stores' sizes, and what each
//! seed switch costs (`--ablate`).

use serde_json::json;

use super::worker;
use super::workload::{DataKind, Workload};
use crate::report::{Report, Variant};

fn f(v: &Variant, k: &str) -> f64 {
    v.extra.get(k).and_then(|x| x.as_f64()).unwrap_or(0.0)
}

fn lat(v: &Variant, k: &str) -> f64 {
    v.extra["latency_ns"][k].as_f64().unwrap_or(0.0) / 1000.0
}

pub(super) fn print_table(
    report: &Report,
    workload: Workload,
    wss: u64,
    budget: u64,
    data: DataKind,
    ablate: bool,
) {
    let score = match workload {
        Workload::Pmbench { .. } => "accesses/s",
        Workload::SeqWrite => "write GB/s",
        Workload::Activate => "s/round",
    };
    println!(
        "bench {}: working set {} MiB, budget {} MiB, data {:?}{}",
        report.bench,
        wss >> 20,
        budget >> 20,
        data,
        if let Workload::Pmbench { read_pct, pattern } = workload {
            format!(", {read_pct}% reads, {pattern:?} pages")
        } else {
            String::new()
        }
    );
    println!(
        "{:<32} {:>3} {:>12} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8}",
        "variant", "thr", score, "vs base", "swapin", "swapout", "p50 us", "p99 us", "p99.9 us", "lockwait"
    );
    for v in &report.variants {
        let s = match workload {
            Workload::Pmbench { .. } => format!("{:.0}", v.throughput),
            Workload::SeqWrite => format!("{:.3}", f(v, "write_gbps")),
            Workload::Activate => format!("{:.3}", f(v, "s_per_iteration")),
        };
        let vs = if v.extra.get("baseline").is_some_and(|b| b != &json!(v.name)) {
            format!("{:.2}x", f(v, "vs_baseline"))
        } else {
            "-".into()
        };
        let lw = if v.extra["backend"]
            .as_str()
            .is_some_and(|b| b.starts_with("kernel"))
        {
            "-".to_string()
        } else {
            format!("{:.2}%", v.lock_wait * 100.0)
        };
        println!(
            "{:<32} {:>3} {:>12} {:>8} {:>9.3} {:>9.3} {:>9.1} {:>9.1} {:>9.1} {:>8}",
            v.name,
            v.threads,
            s,
            vs,
            f(v, "swapin_gbps"),
            f(v, "swapout_gbps"),
            lat(v, "p50"),
            lat(v, "p99"),
            lat(v, "p999"),
            lw
        );
    }
    println!("(vs base: throughput against kernel swap on the same kind of device where both ran (uswap-zram / kernel-zram, uswap-file / kernel-file, uswap-zram-file / kernel-zswap), else against the uswap default at the same threads and unit (2m: uswap 2m against 4k), median of per-round ratios; swapin/swapout: GB/s of swap IO; p50..p99.9: latency of one {}; lockwait: share of thread time waiting on uswap's locks)",
        match workload { Workload::Pmbench { .. } => "access", Workload::SeqWrite => "page write", Workload::Activate => "page touch" });
    print_pairs(report);
    print_stalls(report);
    if report.variants.iter().any(|v| v.extra.contains_key("store")) {
        print_store(report);
    }
    if ablate {
        print_ablation(report);
    }
    if workload == Workload::Activate {
        // Seed 002's statistics: how often the LRU lock was taken.
        println!("LRU lock (all rounds): acquisitions, share contended, wait; activations; adds");
        for v in report.variants.iter().filter(|v| v.locks.contains_key("lru")) {
            let l = &v.locks["lru"];
            println!(
                "  {:<30} x{:<2} {:>10} {:>6.2}% {:>9.1} ms {:>10} {:>10}",
                v.name,
                v.threads,
                l.acquisitions,
                100.0 * l.contended as f64 / l.acquisitions.max(1) as f64,
                l.wait_ns as f64 / 1e6,
                v.counters.get("lru_activate").copied().unwrap_or(0),
                v.counters.get("lru_add").copied().unwrap_or(0)
            );
        }
    }
}

/// Like for like: each uswap backend beside kernel swap on the same kind
/// of device, where both ran: the throughput ratio, the tails side by
/// side, and for compressed memory the codec and bytes stored per page
/// (a ratio means little if one side stored more per page).
fn print_pairs(report: &Report) {
    let pairs: Vec<(&Variant, &Variant)> = report
        .variants
        .iter()
        .filter_map(|v| {
            let b = v.extra.get("baseline")?.as_str()?;
            let k = report.variants.iter().find(|x| x.name == b)?;
            let kernel = k.extra["backend"].as_str()?.starts_with("kernel");
            let uswap = v.extra["backend"].as_str()?.starts_with("uswap");
            (kernel && uswap).then_some((v, k))
        })
        .collect();
    if pairs.is_empty() {
        return;
    }
    println!("like for like (uswap / kernel on the same kind of device):");
    println!(
        "{:<34} {:>3} {:>11} {:>19} {:>21} {:>15} {:>15}",
        "pair", "thr", "throughput", "p99 us (u / k)", "p99.9 us (u / k)", "B/page (u / k)", "codec (u / k)"
    );
    for (u, k) in pairs {
        let bpp = |v: &Variant| {
            v.extra
                .get("store_bytes_per_page")
                .and_then(|x| x.as_f64())
                .map_or("-".to_string(), |b| format!("{b:.0}"))
        };
        let codec = |v: &Variant| {
            v.extra
                .get("codec")
                .and_then(|x| x.as_str())
                .unwrap_or("-")
                .to_string()
        };
        println!(
            "{:<34} {:>3} {:>10.2}x {:>19} {:>21} {:>15} {:>15}",
            format!(
                "{} / {}",
                u.extra["backend"].as_str().unwrap_or("?"),
                k.extra["backend"].as_str().unwrap_or("?")
            ),
            u.threads,
            f(u, "vs_baseline"),
            format!("{:.1} / {:.1}", lat(u, "p99"), lat(k, "p99")),
            format!("{:.1} / {:.1}", lat(u, "p999"), lat(k, "p999")),
            format!("{} / {}", bpp(u), bpp(k)),
            format!("{} / {}", codec(u), codec(k)),
        );
    }
}

/// Faults of 100 us or more in uswap's runs, by the cause that took most
/// of each (the pager's `stall_*` counters, all rounds).
fn print_stalls(report: &Report) {
    let causes = [
        ("stall_claim_wait", "claim wait"),
        ("stall_reclaim", "reclaim"),
        ("stall_bound", "bound"),
        ("stall_own", "own IO"),
    ];
    let rows: Vec<&Variant> = report
        .variants
        .iter()
        .filter(|v| v.counters.contains_key("faults"))
        .collect();
    if rows.is_empty() {
        return;
    }
    println!("stalls (faults of 100 us or more, all rounds), by the cause that took most of each:");
    print!("{:<32} {:>3} {:>10} {:>9}", "variant", "thr", "faults", "stalls");
    for (_, name) in &causes {
        print!(" {:>11}", name);
    }
    println!();
    for v in rows {
        let n = |k: &str| v.counters.get(k).copied().unwrap_or(0);
        let stalls = n("stalls");
        print!(
            "{:<32} {:>3} {:>10} {:>8.3}%",
            v.name,
            v.threads,
            n("faults"),
            100.0 * stalls as f64 / n("faults").max(1) as f64
        );
        for (k, _) in &causes {
            print!(" {:>10.1}%", 100.0 * n(k) as f64 / stalls.max(1) as f64);
        }
        println!();
    }
    println!("(stalls: share of faults; each cause: share of the stalls. claim wait: another thread was serving the page; reclaim: the fault reclaimed first, the budget exhausted; bound: held at the budget's bound with nothing ready to evict; own IO: the fault's own read and install)");
}

/// What each compressed store held at the end of its last run, as zram's
/// mm_stat gives it.
fn print_store(report: &Report) {
    println!("compressed stores (last round, at the end of the timed phase):");
    println!(
        "{:<32} {:>3} {:>8} {:>10} {:>10} {:>10} {:>9} {:>8} {:>8} {:>11}",
        "variant",
        "thr",
        "codec",
        "pages",
        "MiB used",
        "limit MiB",
        "B/page",
        "same",
        "whole",
        "written back"
    );
    for v in report.variants.iter().filter(|v| v.extra.contains_key("store")) {
        let st: worker::StoreUse = serde_json::from_value(v.extra["store"].clone()).unwrap_or_default();
        let limit = v.extra.get("store_limit").and_then(|x| x.as_u64());
        println!(
            "{:<32} {:>3} {:>8} {:>10} {:>10.1} {:>10} {:>9.0} {:>8} {:>8} {:>11}",
            v.name,
            v.threads,
            v.extra.get("codec").and_then(|x| x.as_str()).unwrap_or("-"),
            st.pages,
            st.mem_bytes as f64 / (1 << 20) as f64,
            limit.map_or("-".into(), |l| format!("{:.0}", l as f64 / (1 << 20) as f64)),
            f(v, "store_bytes_per_page"),
            st.same_pages,
            st.whole_pages,
            st.written_back
        );
    }
    println!("(B/page: the store's memory, fragmentation included, per page it held: median over rounds; kernel-zram's codec is its comp_algorithm, --zram-algorithm)");
}

/// The seeds' table: each ablation's score, swap-in and swap-out against
/// the default, and the lock wait per site.
fn print_ablation(report: &Report) {
    let mut sites: Vec<String> = Vec::new();
    for v in &report.variants {
        if let Some(m) = v.extra["lock_wait_by_site"].as_object() {
            for (k, w) in m {
                if w.as_f64().unwrap_or(0.0) >= 0.0005 && !sites.contains(k) {
                    sites.push(k.clone());
                }
            }
        }
    }
    let change = |v: &Variant, k: &str| match v.extra.get(k).and_then(|x| x.as_f64()) {
        Some(r) if v.extra.get("baseline").is_some_and(|b| b != &json!(v.name)) => {
            format!("{:+.1}%", (r - 1.0) * 100.0)
        }
        _ => "-".into(),
    };
    println!("against the default (and lock wait per site, share of thread time):");
    print!(
        "{:<32} {:>3} {:>8} {:>8} {:>8}",
        "variant", "thr", "score", "swapin", "swapout"
    );
    for s in &sites {
        print!(" {:>16}", truncate(s, 16));
    }
    println!();
    for v in &report.variants {
        print!(
            "{:<32} {:>3} {:>8} {:>8} {:>8}",
            v.name,
            v.threads,
            change(v, "vs_baseline"),
            change(v, "swapin_gbps_vs_baseline"),
            change(v, "swapout_gbps_vs_baseline")
        );
        for s in &sites {
            let w = v.extra["lock_wait_by_site"]
                .get(s)
                .and_then(|x| x.as_f64())
                .unwrap_or(0.0);
            print!(" {:>15.2}%", w * 100.0);
        }
        println!();
    }
}

fn truncate(s: &str, n: usize) -> &str {
    &s[..s.len().min(n)]
}
