//! `uswap bench extent`: seed 004's experiment.
//!
//! Seed 004 fragmented a 20G swapfile into 20K extents and measured swap
//! throughput with 1, 4 and 8 tasks: the linear list with its one-entry
//! `curr_swap_extent` cache was as good as the tree with one task (the cache
//! hits), and several times slower with 4 or 8, where the tasks keep moving
//! the shared cursor away from each other.  Here the device is always
//! 5,242,880 slots (20 GiB of pages), split into `--extents` equal extents
//! with a gap after each on the backing so none merge, and each thread
//! models a task swapping out: it translates consecutive slots of its own
//! region, starting at its own random slot and wrapping at the end.
//! Throughput is lookups per second summed over threads.
//!
//! The list only loses when the threads really run at once: on a machine
//! with fewer free cores than threads, time slicing runs the tasks one after
//! another, each slice re-warms the one-entry cache after one long walk, and
//! the list looks as good as with one task.  Run with at most as many
//! threads as idle cores to see the seed's effect.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::Args;
use uswap::extent::{ExtentMap, ExtentMapKind};

use super::{fresh_registry, run_timed};
use crate::report::{emit, interleave, same_params_default, summarize, Common, Report, Variant};

/// Slots on the device: the seed's 20G swapfile in 4 KiB pages.
const TOTAL_SLOTS: u64 = 5_242_880;

/// Lookups between checks of the stop flag.
const BATCH: u64 = 64;

#[derive(Args, Debug)]
// The seed measured 1, 4 and 8 tasks; give the bench that default instead
// of Common's 1,2,4,8.
#[command(mut_arg("threads", |a| a.default_value("1,4,8")))]
pub struct ExtentArgs {
    #[command(flatten)]
    pub common: Common,
    /// Extent counts to measure, comma separated (the seed: 2 for a clean
    /// swapfile, 20,000 for the fragmented one).
    #[arg(long, value_delimiter = ',', default_value = "2,2000,20000")]
    pub extents: Vec<u64>,
}

/// A device of `TOTAL_SLOTS` slots in `extents` near-equal extents (the
/// first `TOTAL_SLOTS % extents` one slot longer), each followed by a
/// one-page gap on backing 0 so the builder cannot merge them.
fn build_map(kind: ExtentMapKind, extents: u64) -> anyhow::Result<ExtentMap> {
    let mut b = ExtentMap::builder(kind);
    let (base, extra) = (TOTAL_SLOTS / extents, TOTAL_SLOTS % extents);
    let mut offset = 0u64;
    for i in 0..extents {
        let n = base + u64::from(i < extra);
        b.add(n, 0, offset, None)?;
        offset += (n + 1) * uswap::PAGE_SIZE as u64;
    }
    let map = b.build()?;
    anyhow::ensure!(
        map.len() as u64 == extents && map.slots() == TOTAL_SLOTS,
        "built {} extents of {} slots, wanted {extents} of {TOTAL_SLOTS}",
        map.len(),
        map.slots()
    );
    Ok(map)
}

/// A start slot for thread `t` of round `round`: xorshift64 of a seed
/// mixed from both, so threads land in different regions.
fn start_slot(round: usize, t: usize) -> u64 {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ ((round as u64) << 32) ^ (t as u64 + 1);
    for _ in 0..4 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    x % TOTAL_SLOTS
}

/// One thread's swap-out walk: consecutive slots from its start until
/// `stop`.  Returns the lookups done.
fn walk(map: &ExtentMap, mut slot: u64, stop: &AtomicBool) -> u64 {
    let mut ops = 0;
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..BATCH {
            black_box(map.lookup(black_box(slot)));
            slot += 1;
            if slot == TOTAL_SLOTS {
                slot = 0;
            }
        }
        ops += BATCH;
    }
    ops
}

pub fn run(args: &ExtentArgs) -> anyhow::Result<()> {
    let common = &args.common;
    common.validate()?;
    anyhow::ensure!(!args.extents.is_empty(), "--extents needs at least one count");
    anyhow::ensure!(
        args.extents.iter().all(|&e| (1..=TOTAL_SLOTS).contains(&e)),
        "--extents counts must be between 1 and {TOTAL_SLOTS}, got {:?}",
        args.extents
    );

    let all = [
        ("default", ExtentMapKind::Tree),
        ("extent-list", ExtentMapKind::List),
    ];
    let variants: Vec<(&str, ExtentMapKind)> = common
        .selected(&all.map(|(n, _)| n))?
        .into_iter()
        .map(|i| all[i])
        .collect();
    // One map per (extent count, kind), built before timing starts.
    let mut maps = Vec::new();
    for &e in &args.extents {
        for &(_, kind) in &variants {
            maps.push(build_map(kind, e)?);
        }
    }
    // Combinations in report order: extents, then threads, then variant.
    let mut combos = Vec::new();
    for (ei, &e) in args.extents.iter().enumerate() {
        for &threads in &common.threads {
            for (vi, &(name, _)) in variants.iter().enumerate() {
                combos.push((name, e, threads, &maps[ei * variants.len() + vi]));
            }
        }
    }

    let registry = fresh_registry();
    let rounds = interleave(
        common,
        "extent",
        &combos,
        |&(name, extents, threads, _)| format!("{name} extents={extents} threads={threads}"),
        |round, &(_, _, threads, map)| {
            Ok(run_timed(threads, common.duration(), &registry, |t, stop| {
                walk(map, start_slot(round, t), stop)
            }))
        },
    )?;

    let variants: Vec<Variant> = combos
        .iter()
        .zip(&rounds)
        .map(|(&(name, extents, _, _), r)| {
            let extra = BTreeMap::from([("extents".to_string(), serde_json::json!(extents))]);
            summarize(name, r, extra)
        })
        .collect();
    let report = Report {
        bench: "extent".into(),
        variants,
    };
    common.save(&report)?;
    if common.json {
        emit(&report, true, same_params_default);
    } else {
        // The table has no column for bench parameters, so print one table
        // per extent count, its count in the title.
        for &e in &args.extents {
            let part = Report {
                bench: format!("extent ({e} extents)"),
                variants: report
                    .variants
                    .iter()
                    .filter(|v| v.extra.get("extents") == Some(&serde_json::json!(e)))
                    .cloned()
                    .collect(),
            };
            emit(&part, false, same_params_default);
        }
    }
    Ok(())
}
