//! `uswap bench alloc`: slot allocation on a fragmented device, with the
//! swap-cache traffic that goes with it (seeds 000 and 001).
//!
//! Setup, untimed, per run: fill every device, then free random slots until
//! `--occupancy` of them remain in use, as pmbench's random 80/20 accesses
//! leave a swap device: slots are free everywhere, but no cluster is wholly
//! free.  The slots still in use are dealt out to the threads.
//!
//! Timed: each thread, like `add_to_swap` followed later by the page's
//! swap-in, allocates a slot, adds it to the swap cache and looks it up; then
//! retires a random slot it holds: deletes it from the swap cache and frees
//! it.  Occupancy stays constant and frees stay random, so the device stays
//! fragmented.
//!
//! Seed 000 predicts that the fragmented scan cuts the device lock's wait
//! (refills return a batch instead of one slot); seed 001 that per-CPU scan
//! bases cut the swap-cache trunk locks' wait (CPUs allocate in different
//! trunks).

use std::collections::BTreeMap;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use anyhow::Context;
use clap::Args;
use uswap::stats::Registry;
use uswap::swap_cache::SwapCache;
use uswap::swap_space::{ScanBase, SlotDeviceConfig, SwapEntry, SwapSpace, Switches, TRUNK_SLOTS};

use super::{run_timed, threads_by_variant};
use crate::report::{emit, interleave, same_params_default, summarize, Common, Report};

#[derive(Args, Debug)]
pub struct AllocArgs {
    #[command(flatten)]
    pub common: Common,
    /// Slots per device (4 KiB each; 1048576 = 4 GiB of swap).
    #[arg(long, default_value_t = 1 << 20)]
    pub slots: u64,
    /// Devices, all of one priority (round-robin), like the seeds' ram disks.
    #[arg(long, default_value_t = 1)]
    pub devices: usize,
    /// Fraction of slots in use after fragmenting, and kept in use.
    #[arg(long, default_value_t = 0.5)]
    pub occupancy: f64,
    /// Swap-cache trunk size in slots (16384 = the seeds' 64 MB; 512 = one
    /// lock per cluster, as with the kernel's swap table).
    #[arg(long, default_value_t = TRUNK_SLOTS)]
    pub trunk_slots: u64,
}

/// The variants: the shipped switches, then each switch flipped.
pub fn variants() -> Vec<(&'static str, Switches)> {
    let d = Switches::DEFAULT;
    vec![
        ("default", d),
        (
            "no-fragmented-scan",
            Switches {
                fragmented_scan: false,
                ..d
            },
        ),
        (
            "shared-scan-base",
            Switches {
                scan_base: ScanBase::Shared,
                ..d
            },
        ),
        (
            "no-slot-cache",
            Switches {
                slot_cache: false,
                ..d
            },
        ),
        (
            if d.nonfull_clusters {
                "linear-scan"
            } else {
                "nonfull-clusters"
            },
            Switches {
                nonfull_clusters: !d.nonfull_clusters,
                ..d
            },
        ),
    ]
}

pub(crate) fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// A space and its swap cache, fragmented as pmbench leaves them, and the
/// in-use slots dealt out to `threads` queues.
struct Setup {
    space: SwapSpace,
    cache: SwapCache,
    queues: Vec<Mutex<Vec<SwapEntry>>>,
}

fn setup(args: &AllocArgs, sw: Switches, threads: usize, reg: &Registry, seed: u64) -> anyhow::Result<Setup> {
    let mut b = SwapSpace::builder()
        .switches(sw)
        .trunk_slots(args.trunk_slots)
        .seed(seed);
    for _ in 0..args.devices {
        b = b.device(SlotDeviceConfig::new(args.slots));
    }
    let space = b.build(reg).context("building the swap space")?;
    let cache = SwapCache::new(&vec![args.slots; args.devices], space.trunk_slots(), reg)
        .context("building the swap cache")?;
    // Fill: slots taken straight from the devices, not via slot caches, so
    // every slot is in use and none is parked.
    let mut all = Vec::with_capacity(space.total_slots() as usize);
    while let Ok(e) = space.alloc() {
        all.push(e);
    }
    space.drain_slot_caches();
    while let Ok(e) = space.alloc() {
        all.push(e);
    }
    // Free a random subset (Fisher-Yates prefix) down to the occupancy.
    let keep = ((all.len() as f64) * args.occupancy) as usize;
    let mut rng = seed | 1;
    for i in 0..all.len() {
        let j = i + (xorshift(&mut rng) as usize) % (all.len() - i);
        all.swap(i, j);
    }
    let mut freed: Vec<SwapEntry> = all.split_off(keep);
    space.free_batch(&mut freed).context("fragmenting")?;
    space.drain_slot_caches();
    let mut queues: Vec<Vec<SwapEntry>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, e) in all.into_iter().enumerate() {
        queues[i % threads].push(e);
    }
    Ok(Setup {
        space,
        cache,
        queues: queues.into_iter().map(Mutex::new).collect(),
    })
}

/// One thread's timed loop.
fn work(s: &Setup, t: usize, stop: &AtomicBool) -> u64 {
    let mut q = s.queues[t].lock().expect("queue");
    let mut ops = 0u64;
    let page = NonZeroU64::new(t as u64 + 1).expect("non-zero");
    let mut rng = 0x2545_f491_4f6c_dd1d ^ (t as u64 + 1);
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..32 {
            let Ok(e) = s.space.alloc() else {
                // Only the occupancy we keep could make this happen; stop
                // rather than spin.
                return ops;
            };
            s.cache.add(e, page).expect("fresh slot is not cached");
            std::hint::black_box(s.cache.lookup(e));
            // Retire a random held slot, as a random access swaps in a
            // random page: frees stay scattered and the device fragmented
            // (retiring the oldest would free whole clusters again).
            let i = (xorshift(&mut rng) % q.len() as u64) as usize;
            let old = std::mem::replace(&mut q[i], e);
            s.cache.delete(old);
            s.space.free(old).expect("own slot");
            ops += 1;
        }
    }
    ops
}

pub fn run(args: &AllocArgs) -> anyhow::Result<()> {
    args.common.validate()?;
    anyhow::ensure!(
        args.slots >= 2 * 512,
        "--slots must be at least 1024 (two clusters), got {}",
        args.slots
    );
    anyhow::ensure!(
        (1..=32).contains(&args.devices),
        "--devices must be 1..=32, got {}",
        args.devices
    );
    anyhow::ensure!(
        args.occupancy > 0.0 && args.occupancy < 0.95,
        "--occupancy must be in (0, 0.95): the rest is what the allocator searches; got {}",
        args.occupancy
    );
    let all = variants();
    let names: Vec<&str> = all.iter().map(|(n, _)| *n).collect();
    let chosen: Vec<(&str, Switches)> = args
        .common
        .selected(&names)?
        .into_iter()
        .map(|i| all[i])
        .collect();
    let c = &args.common;
    let combos = threads_by_variant(c, &chosen);
    let rounds = interleave(
        c,
        "alloc",
        &combos,
        |(threads, (name, _))| format!("{name} x{threads}"),
        |round, &(threads, (_, sw))| {
            let reg = Registry::new();
            let s = setup(args, sw, threads, &reg, 0x9e37_79b9 ^ round as u64)?;
            Ok(run_timed(threads, c.duration(), &reg, |t, stop| {
                work(&s, t, stop)
            }))
        },
    )?;
    let mut variants = Vec::new();
    for ((_, (name, _)), r) in combos.iter().zip(&rounds) {
        let mut extra = BTreeMap::new();
        extra.insert(
            "slots".into(),
            serde_json::json!(args.slots * args.devices as u64),
        );
        extra.insert("occupancy".into(), serde_json::json!(args.occupancy));
        extra.insert("trunk_slots".into(), serde_json::json!(args.trunk_slots));
        variants.push(summarize(name, r, extra));
    }
    let report = Report {
        bench: "alloc".into(),
        variants,
    };
    c.save(&report)?;
    emit(&report, c.json, same_params_default);
    Ok(())
}
