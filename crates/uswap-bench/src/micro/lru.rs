//! `uswap bench lru`: seed 002's experiment.
//!
//! "64 processes map one sparse file, each reads the whole file then exits:
//! 58% less total time."  Process exit unmaps the file and calls
//! `activate_page()` on every page, all CPUs at once, all on one LRU lock.
//! Here: an LRU of `--pages` inactive pages; T threads each activate and
//! then deactivate their disjoint slice `--passes` times (soft eviction
//! followed by the faults that reactivate), then activate it once more; the
//! run ends when the last thread is done and the batches are drained.
//! Fixed work, so what is timed is the total time (reported as `time_ms`);
//! throughput is LRU operations per second.
//!
//! Variants: "default" (per-CPU batches of 31, kernel 6.9+), "batch-15"
//! (the seed-era `PAGEVEC_SIZE`), "unbatched-lru" (one LRU lock per page,
//! the behaviour before seed 002).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use clap::Args;
use uswap::lru::{Lru, LruBatch, LruConfig, PageId};
use uswap::stats::Registry;

use super::{fresh_registry, run_timed, threads_by_variant};
use crate::report::{emit, interleave, same_params_default, summarize, Common, Report, Round, Variant};

#[derive(Args, Debug)]
pub struct LruArgs {
    /// (`--seconds` is used only with `--sustained`: by default every run
    /// does a fixed amount of work, activating every page once.)
    #[command(flatten)]
    pub common: Common,
    /// Pages on the LRU, all activated in each run (1,048,576 pages = 4 GiB).
    #[arg(long, default_value_t = 1 << 20)]
    pub pages: u32,
    /// Activate-then-deactivate passes before the final activation pass:
    /// enough work that a run lasts long enough to time on a noisy machine.
    #[arg(long, default_value_t = 8)]
    pub passes: u32,
    /// Instead of one timed pass, each thread alternates activate and
    /// deactivate passes over its slice for `--seconds` (throughput only,
    /// no `time_ms`).
    #[arg(long)]
    pub sustained: bool,
}

const VARIANTS: [(&str, LruBatch); 3] = [
    ("default", LruBatch::Pages(31)),
    ("batch-15", LruBatch::Pages(15)),
    ("unbatched-lru", LruBatch::Unbatched),
];

/// An LRU of `pages` inactive pages (setup, never timed).
fn setup(batch: LruBatch, pages: u32, registry: &Registry) -> anyhow::Result<Lru> {
    let lru = Lru::new(LruConfig::new(pages).batch(batch), registry)?;
    for p in 0..pages {
        lru.add(p);
    }
    lru.drain_all();
    anyhow::ensure!(lru.nr_inactive() == pages as usize, "setup lost pages");
    Ok(lru)
}

/// Thread `t`'s slice of `0..pages`.
fn slice(t: usize, threads: usize, pages: u32) -> std::ops::Range<PageId> {
    let per = (pages as usize).div_ceil(threads);
    let lo = (t * per).min(pages as usize) as PageId;
    let hi = ((t + 1) * per).min(pages as usize) as PageId;
    lo..hi
}

/// `--sustained`: activate / deactivate passes over each thread's slice
/// for the duration.
fn run_sustained(threads: usize, batch: LruBatch, pages: u32, duration: Duration) -> anyhow::Result<Round> {
    let registry = fresh_registry();
    let lru = setup(batch, pages, &registry)?;
    let round = run_timed(threads, duration, &registry, |t, stop| {
        let mut ops = 0u64;
        let range = slice(t, threads, pages);
        'run: loop {
            for pass in 0..2 {
                for (i, p) in range.clone().enumerate() {
                    if pass == 0 {
                        lru.activate(p);
                    } else {
                        lru.deactivate(p);
                    }
                    ops += 1;
                    if i % 1024 == 0 && stop.load(Ordering::Relaxed) {
                        break 'run;
                    }
                }
            }
        }
        ops
    });
    lru.check_invariants()
        .map_err(|e| anyhow::anyhow!("{batch:?}: {e}"))?;
    Ok(round)
}

/// One run: set up (untimed) an LRU with every page inactive, then time
/// `threads` threads activating disjoint slices, up to the final drain.
fn run_once(threads: usize, batch: LruBatch, pages: u32, passes: u32) -> anyhow::Result<Round> {
    let registry = fresh_registry();
    let lru = setup(batch, pages, &registry)?;
    let barrier = Barrier::new(threads + 1);
    let (elapsed, stats) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (lru, barrier) = (&lru, &barrier);
                let range = slice(t, threads, pages);
                s.spawn(move || {
                    barrier.wait();
                    for _ in 0..passes {
                        for p in range.clone() {
                            lru.activate(p);
                        }
                        for p in range.clone() {
                            lru.deactivate(p);
                        }
                    }
                    for p in range {
                        lru.activate(p);
                    }
                })
            })
            .collect();
        let before = registry.snapshot();
        barrier.wait();
        let start = Instant::now();
        for h in handles {
            h.join().expect("bench worker panicked");
        }
        lru.drain_all();
        let elapsed = start.elapsed();
        (elapsed, registry.snapshot().since(&before))
    });
    anyhow::ensure!(
        lru.nr_active() == pages as usize && lru.nr_inactive() == 0,
        "{batch:?}: {} of {pages} pages active after the run",
        lru.nr_active()
    );
    Ok(Round {
        ops: pages as u64 * (2 * passes as u64 + 1),
        elapsed,
        threads,
        stats,
    })
}

fn median_ms(rounds: &[Round]) -> f64 {
    crate::report::median(rounds.iter().map(|r| r.elapsed.as_secs_f64() * 1e3).collect())
}

/// Baseline: [`same_params_default`] over the parameters only, i.e. with
/// each variant's measured `time_ms` and its own `batch` left out of `extra`.
fn default_of(v: &Variant, all: &[Variant]) -> Option<usize> {
    let params = |x: &Variant| {
        let mut x = x.clone();
        x.extra.remove("time_ms");
        x.extra.remove("batch");
        x
    };
    let all: Vec<Variant> = all.iter().map(params).collect();
    same_params_default(&params(v), &all)
}

pub fn run(args: &LruArgs) -> anyhow::Result<()> {
    args.common.validate()?;
    anyhow::ensure!(args.pages >= 1, "--pages must be at least 1");
    let c = &args.common;
    let chosen = c.selected(&VARIANTS.map(|(n, _)| n))?;
    let combos = threads_by_variant(c, &chosen);
    let results = interleave(
        c,
        "lru",
        &combos,
        |&(threads, v)| format!("{} x{threads}", VARIANTS[v].0),
        |_, &(threads, v)| {
            let (batch, pages) = (VARIANTS[v].1, args.pages);
            if args.sustained {
                run_sustained(threads, batch, pages, c.duration())
            } else {
                run_once(threads, batch, pages, args.passes)
            }
        },
    )?;

    let variants: Vec<Variant> = combos
        .iter()
        .zip(&results)
        .map(|(&(_, v), rounds)| {
            let mut extra = BTreeMap::new();
            extra.insert("pages".to_string(), serde_json::json!(args.pages));
            extra.insert(
                "batch".to_string(),
                serde_json::json!(format!("{:?}", VARIANTS[v].1)),
            );
            if !args.sustained {
                extra.insert("time_ms".to_string(), serde_json::json!(median_ms(rounds)));
            }
            summarize(VARIANTS[v].0, rounds, extra)
        })
        .collect();
    let report = Report {
        bench: "lru".into(),
        variants,
    };
    c.save(&report)?;
    emit(&report, c.json, default_of);
    if !c.json && !args.sustained {
        print_times(&report);
    }
    Ok(())
}

/// The seed's measure: total time per thread count, and how much less of
/// it each batched variant takes than "unbatched-lru".
fn print_times(report: &Report) {
    println!(
        "total time for the activation passes over {} pages (median ms; vs unbatched-lru):",
        report.variants.first().map_or(serde_json::json!(0), |v| v
            .extra
            .get("pages")
            .cloned()
            .unwrap_or_default())
    );
    let time = |v: &Variant| v.extra.get("time_ms").and_then(|t| t.as_f64());
    let mut threads: Vec<usize> = report.variants.iter().map(|v| v.threads).collect();
    threads.dedup();
    for t in threads {
        let of_t: Vec<&Variant> = report.variants.iter().filter(|v| v.threads == t).collect();
        let base = of_t
            .iter()
            .find(|v| v.name == "unbatched-lru")
            .and_then(|v| time(v));
        print!("  threads {t:>3}:");
        for v in &of_t {
            let Some(ms) = time(v) else { continue };
            print!("  {} {ms:.1} ms", v.name);
            if let (Some(b), true) = (base, v.name != "unbatched-lru") {
                print!(" ({:+.0}%)", (ms / b - 1.0) * 100.0);
            }
        }
        println!();
    }
}
