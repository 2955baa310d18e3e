//! `uswap bench pmbench | seq-write | activate`: the seeds' workloads on
//! uswap and on kernel swap, side by side, and uswap with each seed switch
//! flipped back (`--ablate`).
//!
//! Every (threads, backend, ablation, unit) combination runs `--rounds`
//! times, interleaved round by round, each run in a fresh worker process
//! ([`super::worker`]); kernel runs get a fresh cgroup and swap device
//! ([`super::kernel_swap`]).  Ratios are the median over rounds of the
//! ratio within a round.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{ensure, Context, Result};
use clap::Args;
use serde_json::json;

use super::ablation::ABLATIONS;
use super::kernel_swap::{self, interrupted, KernelSwap, MemCgroup};
use super::remote::{NbdPlugin, NbdServer};
use super::worker::{self, Backend, WorkerResult, WorkerSpec};
use super::workload::{DataKind, Pattern, Unit, Workload, HUGE, PAGE};
use super::{plot, tables};
use crate::parse_bytes;
use crate::report::{add_stats, interleave, median, paired_change, Common, Report, Variant};

/// Options shared by the three workloads.
#[derive(Args, Clone, Debug)]
pub struct SwapOpts {
    #[command(flatten)]
    pub common: Common,
    /// Who pages the memory, comma separated: uswap (RAM swap device),
    /// uswap-file, uswap-zram (compressed RAM), uswap-zram-file (compressed
    /// RAM of --store-limit with a swap file behind), uswap-nbd (an NBD
    /// export: nbdkit started for each run, --nbd-plugin, --nbd-delay-ms),
    /// uswap-zram-nbd (compressed RAM with the export behind), kernel-zram
    /// (/dev/zram0), kernel-file (a swap file), kernel-zswap (a swap file
    /// behind zswap, its pool limited as --store-limit).  Kernel backends
    /// run in a cgroup v1 memory cgroup with the same budget, set up and
    /// removed by the bench (root), and leave zram and zswap as they were.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "uswap")]
    pub backend: Vec<Backend>,
    /// Run every backend, interleaved, and compare like with like: each
    /// uswap backend against kernel swap on the same kind of device
    /// (uswap-zram / kernel-zram with the same codec, uswap-file /
    /// kernel-file, uswap-zram-file / kernel-zswap at the same store
    /// limit), with the pair's ratios of throughput and tail latency and
    /// the bytes each stored per page.  The RAM device runs too, as the
    /// pager's instrument: it saves no memory, so it has no pair.
    #[arg(long, conflicts_with_all = ["backend", "ablate"])]
    pub compare: bool,
    /// Run uswap once per switch, each flipped back to the behaviour before
    /// it (every seed's, no-readahead, per-page-evict, unpaced-reclaim,
    /// narrow-fault-around, activate-all-refaults, no-trend-prefetch, no-neighbour-evict, spread-slots and, for a compressed device, zram-keeps-copies, always-seal and reclaim-ahead; for a tier,
    /// incompressible-to-file; for a swap file,
    /// plaintext-files, always-clean, serial-reads and lone-fault-reads; pick some with --variants), against the default.
    #[arg(long)]
    pub ablate: bool,
    /// Working-set size: the region the workload maps.
    #[arg(long, value_parser = parse_bytes)]
    pub wss: u64,
    /// Memory budget: uswap's budget, the kernel cgroup's memory limit.
    #[arg(long, value_parser = parse_bytes)]
    pub budget: u64,
    /// Swap space [default: the working set plus 64 MiB].
    #[arg(long, value_parser = parse_bytes)]
    pub swap_size: Option<u64>,
    /// What the pages hold: zeros, text (compresses about 2x) or random.
    /// Matters to kernel-zram, which compresses.
    #[arg(long, value_enum, default_value = "text")]
    pub data: DataKind,
    /// Seed of the random accesses and data.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Directory for the swap files of uswap-file and kernel-file (on a
    /// disk file system; not tmpfs) [default: the temp dir].
    #[arg(long)]
    pub swap_dir: Option<PathBuf>,
    /// zram compressor for kernel-zram (e.g. lzo-rle, lz4, zstd)
    /// [default: uswap-zram's codec when both run and zram offers it,
    /// like for like; else the device's].
    #[arg(long)]
    pub zram_algorithm: Option<String>,
    /// Codec of uswap's compressed device: lz4, zstd or zstd:LEVEL.
    #[arg(long, default_value = "lz4", value_parser = parse_codec)]
    pub codec: String,
    /// Memory limit of the compressed store of a tier (uswap-zram-file)
    /// and of zswap's pool (kernel-zswap), which zswap takes in whole
    /// percent of RAM: both get the largest whole percent of RAM under
    /// this, at least 1% [default: a quarter of the swapped data, the
    /// working set less the budget].
    #[arg(long, value_parser = parse_bytes)]
    pub store_limit: Option<u64>,
    /// zswap's compressor for kernel-zswap (one the kernel's crypto API
    /// has: /proc/crypto; zswap has no LZ4 where only zram was built with
    /// it, as on this machine kind: lzo-rle is zram's default and LZ4's
    /// closest kin there).
    #[arg(long, default_value = "lzo-rle")]
    pub zswap_compressor: String,
    /// What the NBD server of uswap-nbd and uswap-zram-nbd keeps pages in
    /// (nbdkit, started by the bench for each run on a Unix socket): memory
    /// (another machine's RAM) or file (another machine's disk: a file in
    /// --swap-dir).
    #[arg(long, value_enum, default_value = "memory")]
    pub nbd_plugin: NbdPlugin,
    /// Milliseconds nbdkit's delay filter adds to each read and write of
    /// the remote backends, for a network's round trip (e.g. 0.05 for
    /// 50 us) [default: none, the local socket's own].
    #[arg(long, default_value_t = 0.0)]
    pub nbd_delay_ms: f64,
    /// Draw the latency CDF, throughput over time and per-variant bars to
    /// this file (.png or .svg).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
}

#[derive(Args, Debug)]
#[command(mut_arg("threads", |a| a.default_value("2")))]
#[command(mut_arg("seconds", |a| a.default_value("8")))]
#[command(mut_arg("rounds", |a| a.default_value("2")))]
#[command(mut_arg("wss", |a| a.default_value("2G").required(false)))]
#[command(mut_arg("budget", |a| a.default_value("512M").required(false)))]
pub struct PmbenchArgs {
    #[command(flatten)]
    pub opts: SwapOpts,
    /// Percent of accesses that read (the rest write one word).
    #[arg(long, default_value_t = 80)]
    pub read_pct: u32,
    /// Which pages the accesses go to: uniform (every page alike), linear
    /// (each thread walks the pages in order: readahead's case), zipf
    /// (a skewed hot set, YCSB's zipfian with theta 0.99), backward and
    /// stride (walks down, and 7 pages a step: the trend prefetch's
    /// cases).
    #[arg(long, value_enum, default_value_t = Pattern::Uniform)]
    pub pattern: Pattern,
}

#[derive(Args, Debug)]
#[command(mut_arg("threads", |a| a.default_value("2")))]
#[command(mut_arg("seconds", |a| a.default_value("60")))]
#[command(mut_arg("rounds", |a| a.default_value("2")))]
#[command(mut_arg("wss", |a| a.default_value("2G").required(false)))]
#[command(mut_arg("budget", |a| a.default_value("512M").required(false)))]
pub struct SeqWriteArgs {
    #[command(flatten)]
    pub opts: SwapOpts,
    /// Units to page in, comma separated: 4k pages, 2m units (seed 003).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "4k,2m")]
    pub units: Vec<Unit>,
}

#[derive(Args, Debug)]
#[command(mut_arg("threads", |a| a.default_value("2")))]
#[command(mut_arg("seconds", |a| a.default_value("5")))]
#[command(mut_arg("rounds", |a| a.default_value("2")))]
#[command(mut_arg("wss", |a| a.default_value("256M").required(false)))]
#[command(mut_arg("budget", |a| a.default_value("128M").required(false)))]
pub struct ActivateArgs {
    #[command(flatten)]
    pub opts: SwapOpts,
}

/// One combination a bench measures.
#[derive(Clone, Debug)]
struct Combo {
    threads: usize,
    backend: Backend,
    ablation: &'static str,
    unit: Unit,
}

impl Combo {
    fn name(&self) -> String {
        let mut n = self.backend.name().to_string();
        if self.ablation != "default" {
            n = format!("{n}/{}", self.ablation);
        }
        if self.unit == Unit::Huge {
            n.push_str(" 2m");
        }
        n
    }
}

pub fn pmbench(a: &PmbenchArgs) -> Result<()> {
    ensure!(
        a.read_pct <= 100,
        "--read-pct must be 0..=100, got {}",
        a.read_pct
    );
    run(
        &a.opts,
        Workload::Pmbench {
            read_pct: a.read_pct,
            pattern: a.pattern,
        },
        &[Unit::Page],
    )
}

pub fn seq_write(a: &SeqWriteArgs) -> Result<()> {
    ensure!(!a.units.is_empty(), "--units needs at least one of 4k, 2m");
    run(&a.opts, Workload::SeqWrite, &a.units)
}

pub fn activate(a: &ActivateArgs) -> Result<()> {
    run(&a.opts, Workload::Activate, &[Unit::Page])
}

/// A codec as the swap spec writes it, checked by the spec's parser.
fn parse_codec(s: &str) -> std::result::Result<String, String> {
    format!("zram:1M:{s}")
        .parse::<uswap::pager::SwapDeviceSpec>()
        .map(|_| s.to_string())
        .map_err(|e| {
            e.to_string()
                .replace("swap spec \"zram:1M:", "\"")
                .replacen(&format!("{s}\": "), "", 1)
        })
}

fn validate(o: &SwapOpts, units: &[Unit], swap_bytes: u64) -> Result<()> {
    o.common.validate()?;
    let align = units
        .iter()
        .map(|u| u.bytes() as u64)
        .max()
        .unwrap_or(PAGE as u64);
    ensure!(
        o.wss >= align && o.wss.is_multiple_of(align),
        "--wss must be a positive multiple of {} (the unit), got {}",
        if align == HUGE as u64 { "2 MiB" } else { "4 KiB" },
        o.wss
    );
    ensure!(
        o.budget >= 16 << 20,
        "--budget must be at least 16M, got {}",
        o.budget
    );
    ensure!(
        swap_bytes + o.budget >= o.wss + (16 << 20),
        "the swap space ({swap_bytes} bytes) and the budget together must hold the working set ({} bytes) with 16 MiB to spare; raise --swap-size",
        o.wss
    );
    if let Some(avail) = mem_available() {
        // RAM swap (uswap's RAM device, zram) keeps swapped pages in
        // memory too: the whole working set must fit.
        let ram = o.compare || o.backend.iter().any(|b| b.swaps_to_ram());
        ensure!(
            !ram || o.wss < avail * 9 / 10,
            "--wss {} is more than this machine can hold with swap in RAM ({} available); lower it, or use only the file backends",
            o.wss,
            avail
        );
    }
    Ok(())
}

fn mem_available() -> Option<u64> {
    kernel_swap::meminfo("MemAvailable:")
}

fn run(o: &SwapOpts, workload: Workload, units: &[Unit]) -> Result<()> {
    let swap_bytes = o.swap_size.unwrap_or(o.wss + (64 << 20));
    validate(o, units, swap_bytes)?;
    let c = &o.common;
    let backends: Vec<Backend> = if o.compare {
        Backend::COMPARE.to_vec()
    } else {
        let mut b = o.backend.clone();
        b.dedup();
        b
    };
    let mut ablations: Vec<&'static str> = if o.ablate {
        ensure!(
            backends.iter().all(|b| !b.is_kernel()),
            "--ablate flips uswap's seed switches: use it with --backend uswap or uswap-file"
        );
        c.selected(&ABLATIONS)?
            .into_iter()
            .map(|i| ABLATIONS[i])
            .collect()
    } else {
        ensure!(
            c.variants.is_empty(),
            "--variants picks ablations: give it with --ablate (there are: {})",
            ABLATIONS.join(", ")
        );
        vec!["default"]
    };
    // Every ablation is measured against the default, so it always runs.
    if !ablations.contains(&"default") {
        ablations.insert(0, "default");
    }
    if let Some(p) = &o.plot {
        plot::check_path(p)?;
    }

    let zram_algorithm = o
        .zram_algorithm
        .clone()
        .or_else(|| like_codec(&o.codec, &backends));
    let swap_dir = o.swap_dir.clone().unwrap_or_else(std::env::temp_dir);
    let (pool_pct, store_limit) =
        kernel_swap::Zswap::pool_for(o.store_limit.unwrap_or(o.wss.saturating_sub(o.budget) / 4));
    let zswap = kernel_swap::Zswap {
        compressor: o.zswap_compressor.clone(),
        max_pool_percent: pool_pct,
    };
    let kernel_devices: Vec<_> = backends
        .iter()
        .filter_map(|&b| worker::kernel_device(b, swap_bytes, &swap_dir, zram_algorithm.as_deref(), &zswap))
        .collect();
    kernel_swap::catch_interrupts();
    if !kernel_devices.is_empty() {
        kernel_swap::preflight(&kernel_devices.iter().collect::<Vec<_>>())?;
    }
    // uswap-file's swap files go in a directory of their own, removed at
    // the end whatever happens.
    let uswap_dir = tempfile::Builder::new()
        .prefix("uswap-bench-")
        .tempdir_in(&swap_dir)
        .with_context(|| format!("creating a directory in --swap-dir {}", swap_dir.display()))?;
    let scratch = tempfile::tempdir().context("creating a scratch directory")?;

    let mut combos = Vec::new();
    for &threads in &c.threads {
        for &unit in units {
            for &backend in &backends {
                for &ablation in &ablations {
                    combos.push(Combo {
                        threads,
                        backend,
                        ablation,
                        unit,
                    });
                }
            }
        }
    }
    let rounds = interleave(c, workload.name(), &combos, Combo::name, |_, combo| {
        interrupted()?;
        let mut spec = WorkerSpec {
            workload,
            backend: combo.backend,
            ablation: combo.ablation.to_string(),
            unit: combo.unit,
            threads: combo.threads,
            wss: o.wss,
            budget: o.budget,
            swap_bytes,
            seconds: c.seconds,
            data: o.data,
            seed: o.seed,
            codec: o.codec.clone(),
            store_limit,
            swap_dir: uswap_dir.path().to_path_buf(),
            cgroup: None,
            nbd: None,
            result: PathBuf::new(),
        };
        // The remote backends' server, fresh for the run, gone after it.
        let server = match combo.backend.uses_nbd() {
            true => Some(NbdServer::start(
                o.nbd_plugin,
                swap_bytes,
                o.nbd_delay_ms,
                uswap_dir.path(),
            )?),
            false => None,
        };
        spec.nbd = server.as_ref().map(|s| s.uri().to_string());
        let result = run_one(spec, &swap_dir, zram_algorithm.as_deref(), &zswap, scratch.path());
        drop(server);
        result
    })?;

    // What kernel-zram compressed with: the one given it, else zram's own.
    let zram_codec = zram_algorithm
        .clone()
        .or_else(|| kernel_swap::zram_algorithms().1)
        .unwrap_or_else(|| "-".into());
    let variants: Vec<Variant> = combos
        .iter()
        .zip(&rounds)
        .map(|(combo, r)| summarize(combo, r, o, workload, swap_bytes, store_limit, &zram_codec))
        .collect();
    let mut report = Report {
        bench: workload.name().to_string(),
        variants,
    };
    add_ratios(&mut report);
    c.save(&report)?;
    if c.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        tables::print_table(&report, workload, o.wss, o.budget, o.data, o.ablate);
    }
    if let Some(p) = &o.plot {
        plot::draw(&report, p)?;
        if !c.json {
            println!("plot written to {}", p.display());
        }
    }
    Ok(())
}

/// The zram compressor that matches uswap-zram's codec, when both
/// uswap-zram and kernel-zram run and zram offers it: compressed memory is
/// compared at the same codec (a zstd level is uswap's alone: zram gets
/// its zstd).  None leaves zram's own default.
fn like_codec(codec: &str, backends: &[Backend]) -> Option<String> {
    if !(backends.contains(&Backend::UswapZram) && backends.contains(&Backend::KernelZram)) {
        return None;
    }
    let name = codec.split(':').next().unwrap_or(codec);
    kernel_swap::zram_algorithms()
        .0
        .contains(&name.to_string())
        .then(|| name.to_string())
}

/// One run: for a kernel backend, a fresh swap device and cgroup around
/// the worker, removed after it (drop order: the cgroup, then the swap).
fn run_one(
    mut spec: WorkerSpec,
    swap_dir: &std::path::Path,
    algorithm: Option<&str>,
    zswap: &kernel_swap::Zswap,
    scratch: &std::path::Path,
) -> Result<WorkerResult> {
    let device = worker::kernel_device(spec.backend, spec.swap_bytes, swap_dir, algorithm, zswap);
    let _swap = device.as_ref().map(KernelSwap::on).transpose()?;
    let cgroup = if spec.backend.is_kernel() {
        Some(MemCgroup::create(spec.budget)?)
    } else {
        None
    };
    spec.cgroup = cgroup.as_ref().map(|c| c.path().to_path_buf());
    worker::spawn(spec, scratch)
}

fn gbps(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / secs.max(1e-9) / 1e9
}

fn summarize(
    combo: &Combo,
    rounds: &[WorkerResult],
    o: &SwapOpts,
    workload: Workload,
    swap_bytes: u64,
    store_limit: u64,
    zram_codec: &str,
) -> Variant {
    let tput = |r: &WorkerResult| r.ops as f64 / r.elapsed_s.max(1e-9);
    let mut locks: BTreeMap<String, uswap::stats::LockStats> = BTreeMap::new();
    let mut counters: BTreeMap<String, u64> = BTreeMap::new();
    for r in rounds {
        add_stats(
            &mut locks,
            &mut counters,
            r.locks.iter().map(|(k, v)| (k, *v)),
            r.counters.iter().map(|(k, v)| (k, *v)),
        );
    }
    let thread_ns: f64 = rounds
        .iter()
        .map(|r| r.elapsed_s * 1e9 * combo.threads as f64)
        .sum();
    let wait: u64 = locks.values().map(|l| l.wait_ns).sum();
    let site_wait: BTreeMap<String, f64> = locks
        .iter()
        .filter(|(_, l)| l.wait_ns > 0)
        .map(|(k, l)| (k.clone(), l.wait_ns as f64 / thread_ns.max(1.0)))
        .collect();
    let last = rounds.last().cloned().unwrap_or_default();
    let med = |f: &dyn Fn(&WorkerResult) -> f64| median(rounds.iter().map(f).collect());
    let mut extra = BTreeMap::new();
    extra.insert("backend".into(), json!(combo.backend.name()));
    extra.insert("ablation".into(), json!(combo.ablation));
    extra.insert("unit".into(), json!(combo.unit));
    extra.insert("wss".into(), json!(o.wss));
    extra.insert("budget".into(), json!(o.budget));
    extra.insert("swap_size".into(), json!(swap_bytes));
    extra.insert("data".into(), json!(o.data));
    extra.insert("seconds".into(), json!(o.common.seconds));
    if let Workload::Pmbench { read_pct, pattern } = workload {
        extra.insert("read_pct".into(), json!(read_pct));
        extra.insert("pattern".into(), json!(pattern));
        extra.insert("populate_s".into(), json!(med(&|r| r.populate_s)));
    }
    extra.insert("elapsed_s".into(), json!(med(&|r| r.elapsed_s)));
    extra.insert(
        "swapin_gbps".into(),
        json!(med(&|r| gbps(r.swapin_bytes, r.elapsed_s))),
    );
    extra.insert(
        "swapout_gbps".into(),
        json!(med(&|r| gbps(r.swapout_bytes, r.elapsed_s))),
    );
    extra.insert(
        "write_gbps".into(),
        json!(med(&|r| gbps(r.ops * PAGE as u64, r.elapsed_s))),
    );
    if workload == Workload::Activate {
        extra.insert(
            "iterations".into(),
            json!(rounds.iter().map(|r| r.iterations).sum::<u64>()),
        );
        extra.insert(
            "s_per_iteration".into(),
            json!(med(&|r| r.elapsed_s / r.iterations.max(1) as f64)),
        );
    }
    extra.insert(
        "latency_ns".into(),
        json!({
            "p50": med(&|r| r.latency.p50),
            "p99": med(&|r| r.latency.p99),
            "p999": med(&|r| r.latency.p999),
            "max": med(&|r| r.latency.max),
            "mean": med(&|r| r.latency.mean),
        }),
    );
    extra.insert("lock_wait_by_site".into(), json!(site_wait));
    if let Some(st) = last.store.as_ref() {
        // The last round's store, and the median memory per page held.
        extra.insert("store".into(), json!(st));
        extra.insert(
            "store_bytes_per_page".into(),
            json!(median(
                rounds
                    .iter()
                    .filter_map(|r| r.store.as_ref())
                    .map(|s| s.bytes_per_page())
                    .collect()
            )),
        );
    }
    match combo.backend {
        Backend::UswapZram | Backend::UswapZramFile | Backend::UswapZramNbd => {
            extra.insert("codec".into(), json!(o.codec));
        }
        Backend::KernelZram => {
            extra.insert("codec".into(), json!(zram_codec));
        }
        Backend::KernelZswap => {
            extra.insert("codec".into(), json!(o.zswap_compressor));
        }
        _ => {}
    }
    if matches!(
        combo.backend,
        Backend::UswapZramFile | Backend::UswapZramNbd | Backend::KernelZswap
    ) {
        extra.insert("store_limit".into(), json!(store_limit));
    }
    extra.insert("cdf".into(), json!(last.cdf));
    extra.insert("timeline".into(), json!(last.timeline));
    Variant {
        name: combo.name(),
        threads: combo.threads,
        throughput: med(&tput),
        lock_wait: wait as f64 / thread_ns.max(1.0),
        locks,
        counters,
        rounds: rounds.iter().map(tput).collect(),
        extra,
    }
}

/// The variant each one is compared with: a uswap backend's kernel pair
/// (`Backend::kernel_pair`) at the same threads and unit when it ran (and
/// then none for that kernel backend: the ratio is on its pair's row);
/// else the uswap default at the same threads and unit (for an ablation:
/// on the same backend); the uswap default in 2 MB units against the one
/// in 4 KiB pages (seed 003).  Without a uswap run, the first backend
/// measured stands in.
fn baseline(v: &Variant, all: &[Variant]) -> Option<usize> {
    let is = |x: &Variant, k: &str, val: &serde_json::Value| &x.extra[k] == val;
    let default = json!("default");
    // Like for like: a uswap backend against its kernel pair; a kernel
    // backend whose pair ran shows its ratio on the pair's row.
    if v.extra["ablation"] == default {
        let mine = Backend::ALL
            .into_iter()
            .find(|b| v.extra["backend"] == json!(b.name()));
        let twin = |b: Backend| {
            all.iter().position(|x| {
                x.threads == v.threads
                    && is(x, "unit", &v.extra["unit"])
                    && is(x, "ablation", &default)
                    && is(x, "backend", &json!(b.name()))
            })
        };
        if let Some(k) = mine.and_then(Backend::kernel_pair).and_then(twin) {
            return Some(k);
        }
        if let Some(kernel) = mine.filter(|b| b.is_kernel()) {
            let uswap_ran = Backend::ALL
                .into_iter()
                .filter(|u| u.kernel_pair() == Some(kernel))
                .find_map(twin)
                .is_some();
            if uswap_ran {
                return None;
            }
        }
    }
    let same = |x: &Variant| {
        x.threads == v.threads && is(x, "unit", &v.extra["unit"]) && is(x, "ablation", &default)
    };
    let backend = if v.extra["ablation"] != default {
        v.extra["backend"].clone()
    } else {
        json!("uswap")
    };
    let found = all.iter().position(|x| same(x) && is(x, "backend", &backend));
    if found.is_some_and(|i| all[i].name == v.name) && v.extra["unit"] == json!(Unit::Huge) {
        let page = json!(Unit::Page);
        if let Some(i) = all.iter().position(|x| {
            x.threads == v.threads
                && is(x, "unit", &page)
                && is(x, "ablation", &default)
                && is(x, "backend", &v.extra["backend"])
        }) {
            return Some(i);
        }
    }
    found.or_else(|| all.iter().position(same))
}

fn add_ratios(report: &mut Report) {
    let all = report.variants.clone();
    for v in &mut report.variants {
        let Some(b) = baseline(v, &all) else { continue };
        let base = &all[b];
        v.extra.insert("baseline".into(), json!(base.name));
        v.extra
            .insert("vs_baseline".into(), json!(1.0 + paired_change(v, base)));
        for k in ["swapin_gbps", "swapout_gbps"] {
            let (x, y) = (
                v.extra[k].as_f64().unwrap_or(0.0),
                base.extra[k].as_f64().unwrap_or(0.0),
            );
            if y > 0.0 {
                v.extra.insert(format!("{k}_vs_baseline"), json!(x / y));
            }
        }
    }
}
