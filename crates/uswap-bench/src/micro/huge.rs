//! `uswap bench huge`: swapping 2 MB units whole or as 512 pages (seed 003).
//!
//! Each thread swaps 2 MB units out and back in, keeping `--inflight` units
//! swapped out: allocate swap space for the unit, add its 512 pages to the
//! swap cache; later delete them from the swap cache and free the space.
//!
//! - "default": one whole cluster per unit (`alloc_huge`), one swap-cache
//!   batch per unit, and the whole cluster freed in one step: seed 003's
//!   batching of every lock of the path.
//! - "no-huge-cluster": the behaviour before seed 003, the unit split first:
//!   512 slots from the slot cache, 512 swap-cache adds, 512 frees.
//!
//! No IO is done here: the bench measures the locking and bookkeeping that
//! seed 003 batches, not the sequential 2 MB write it also buys.

use std::collections::{BTreeMap, VecDeque};
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use clap::Args;
use uswap::stats::Registry;
use uswap::swap_cache::{PageHandle, SwapCache};
use uswap::swap_space::{SlotDeviceConfig, SwapEntry, SwapError, SwapSpace, Switches, CLUSTER_SLOTS};

use super::{run_timed, threads_by_variant};
use crate::report::{emit, interleave, summarize, Common, Report};

#[derive(Args, Debug)]
pub struct HugeArgs {
    #[command(flatten)]
    pub common: Common,
    /// Slots per device (1048576 = 4 GiB of swap, 2048 clusters).
    #[arg(long, default_value_t = 1 << 20)]
    pub slots: u64,
    /// 2 MB units each thread keeps swapped out at a time.
    #[arg(long, default_value_t = 16)]
    pub inflight: usize,
}

/// A swapped-out unit: whole (one cluster) or split (512 slots).
enum Unit {
    Whole(SwapEntry),
    Split(Box<[SwapEntry; CLUSTER_SLOTS as usize]>),
}

struct Setup {
    space: SwapSpace,
    cache: SwapCache,
}

fn swap_out(s: &Setup, pages: &[PageHandle]) -> Option<Unit> {
    match s.space.alloc_huge() {
        Ok(base) => {
            s.cache
                .add_batch(base, pages)
                .expect("fresh cluster is not cached");
            Some(Unit::Whole(base))
        }
        Err(SwapError::NoFreeCluster) => {
            let mut slots = [SwapEntry::NONE; CLUSTER_SLOTS as usize];
            for (i, slot) in slots.iter_mut().enumerate() {
                match s.space.alloc() {
                    Ok(e) => *slot = e,
                    Err(_) => {
                        // Out of space mid-unit: give back what was taken.
                        let mut taken = slots[..i].to_vec();
                        for e in &taken {
                            s.cache.delete(*e);
                        }
                        s.space.free_batch(&mut taken).expect("own slots");
                        return None;
                    }
                }
                s.cache.add(*slot, pages[i]).expect("fresh slot is not cached");
            }
            Some(Unit::Split(Box::new(slots)))
        }
        Err(e) => panic!("unexpected: {e}"),
    }
}

fn swap_in(s: &Setup, u: Unit) {
    match u {
        Unit::Whole(base) => {
            let got = s.cache.delete_batch(base, &mut [], CLUSTER_SLOTS);
            debug_assert_eq!(got, CLUSTER_SLOTS);
            s.space.free_huge(base).expect("own unit");
        }
        Unit::Split(slots) => {
            for e in *slots {
                s.cache.delete(e);
                s.space.free(e).expect("own slot");
            }
        }
    }
}

fn work(s: &Setup, inflight: usize, stop: &AtomicBool) -> u64 {
    let pages: Vec<PageHandle> = (1..=CLUSTER_SLOTS)
        .map(|i| NonZeroU64::new(i).expect("non-zero"))
        .collect();
    let mut out: VecDeque<Unit> = VecDeque::with_capacity(inflight + 1);
    let mut units = 0u64;
    while !stop.load(Ordering::Relaxed) {
        match swap_out(s, &pages) {
            Some(u) => out.push_back(u),
            None => {
                if let Some(u) = out.pop_front() {
                    swap_in(s, u);
                }
                continue;
            }
        }
        if out.len() > inflight {
            swap_in(s, out.pop_front().expect("non-empty"));
        }
        units += 1;
    }
    for u in out {
        swap_in(s, u);
    }
    units
}

pub fn run(args: &HugeArgs) -> anyhow::Result<()> {
    let c = &args.common;
    c.validate()?;
    anyhow::ensure!(
        args.slots >= 4 * CLUSTER_SLOTS,
        "--slots must be at least {} (four clusters), got {}",
        4 * CLUSTER_SLOTS,
        args.slots
    );
    anyhow::ensure!(
        (1..=4096).contains(&args.inflight),
        "--inflight must be 1..=4096, got {}",
        args.inflight
    );
    let all = [
        ("default", Switches::DEFAULT),
        (
            "no-huge-cluster",
            Switches {
                huge_cluster: false,
                ..Switches::DEFAULT
            },
        ),
    ];
    let variants: Vec<(&str, Switches)> = c
        .selected(&all.map(|(n, _)| n))?
        .into_iter()
        .map(|i| all[i])
        .collect();
    let combos = threads_by_variant(c, &variants);
    let rounds = interleave(
        c,
        "huge",
        &combos,
        |(threads, (name, _))| format!("{name} x{threads}"),
        |_, &(threads, (name, sw))| {
            let reg = Registry::new();
            let space = SwapSpace::builder()
                .switches(sw)
                .device(SlotDeviceConfig::new(args.slots))
                .build(&reg)
                .context("building the swap space")?;
            let cache = SwapCache::new(&[args.slots], space.trunk_slots(), &reg)
                .context("building the swap cache")?;
            let s = Setup { space, cache };
            let r = run_timed(threads, c.duration(), &reg, |_, stop| {
                work(&s, args.inflight, stop)
            });
            s.space.drain_slot_caches();
            anyhow::ensure!(
                s.space.nr_free() == s.space.total_slots() && s.cache.is_empty(),
                "{name}: space or cache not empty after the run: a leak"
            );
            Ok(r)
        },
    )?;
    let mut out = Vec::new();
    for ((_, (name, _)), r) in combos.iter().zip(&rounds) {
        let mut extra = BTreeMap::new();
        extra.insert("unit_bytes".into(), serde_json::json!(CLUSTER_SLOTS * 4096));
        extra.insert("inflight".into(), serde_json::json!(args.inflight));
        let mut v = summarize(name, r, extra);
        // Report GB/s of 2 MB units swapped out (and back) beside units/s.
        v.extra.insert(
            "gb_per_s".into(),
            serde_json::json!(v.throughput * (CLUSTER_SLOTS * 4096) as f64 / 1e9),
        );
        out.push(v);
    }
    let report = Report {
        bench: "huge".into(),
        variants: out,
    };
    c.save(&report)?;
    emit(&report, c.json, |v, all| {
        all.iter()
            .position(|x| x.name == "default" && x.threads == v.threads)
    });
    Ok(())
}
