//! One workload run in its own process.
//!
//! Every run starts a fresh `uswap bench worker` process: for the kernel
//! backends it joins the run's memory cgroup before it maps anything, so
//! that the budget covers exactly its memory; for uswap it starts a fresh
//! instance.  Nothing a run leaves (a SIGBUS handler, resident pages,
//! swap contents, a fragmented swap map) reaches the next one, and a run
//! the cgroup's OOM killer ends is reported instead of ending the bench.
//!
//! The parent passes a [`WorkerSpec`] as JSON and reads a [`WorkerResult`]
//! back from a file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};
use uswap::io::FileOptions;
use uswap::pager::{Region, Swap, SwapDeviceSpec};
use uswap::stats::LockStats;

use super::ablation::ablation;
use super::kernel_swap::{interrupted, KernelDevice};
use super::workload::{self, Area, DataKind, Filler, Timed, Unit, Workload, HUGE, PAGE};

/// Who pages the workload's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    /// uswap with a RAM swap device.
    Uswap,
    /// uswap with an O_DIRECT swap file in --swap-dir.
    UswapFile,
    /// uswap with a compressed RAM device (--codec).
    UswapZram,
    /// uswap with a compressed RAM device of --store-limit with a swap
    /// file behind it (a tier).
    UswapZramFile,
    /// uswap with an NBD export (nbdkit, started for the run: --nbd-plugin,
    /// --nbd-delay).
    UswapNbd,
    /// uswap with a compressed RAM device of --store-limit with the NBD
    /// export behind it (a remote tier).
    UswapZramNbd,
    /// Kernel swap on /dev/zram0 (compressed RAM), in a memory cgroup.
    KernelZram,
    /// Kernel swap on a swap file in --swap-dir, in a memory cgroup.
    KernelFile,
    /// Kernel swap on a swap file with zswap on (--zswap-compressor, its
    /// pool limited as --store-limit), in a memory cgroup.
    KernelZswap,
}

impl Backend {
    /// What `--compare` runs: every backend on this machine's own devices.
    pub const COMPARE: [Backend; 7] = [
        Backend::Uswap,
        Backend::UswapFile,
        Backend::UswapZram,
        Backend::UswapZramFile,
        Backend::KernelZram,
        Backend::KernelFile,
        Backend::KernelZswap,
    ];

    /// Every backend.
    pub const ALL: [Backend; 9] = [
        Backend::Uswap,
        Backend::UswapFile,
        Backend::UswapZram,
        Backend::UswapZramFile,
        Backend::UswapNbd,
        Backend::UswapZramNbd,
        Backend::KernelZram,
        Backend::KernelFile,
        Backend::KernelZswap,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Backend::Uswap => "uswap",
            Backend::UswapFile => "uswap-file",
            Backend::UswapZram => "uswap-zram",
            Backend::UswapZramFile => "uswap-zram-file",
            Backend::UswapNbd => "uswap-nbd",
            Backend::UswapZramNbd => "uswap-zram-nbd",
            Backend::KernelZram => "kernel-zram",
            Backend::KernelFile => "kernel-file",
            Backend::KernelZswap => "kernel-zswap",
        }
    }

    pub fn is_kernel(self) -> bool {
        matches!(
            self,
            Backend::KernelZram | Backend::KernelFile | Backend::KernelZswap
        )
    }

    /// Whether the run swaps to an NBD server the bench starts for it.
    pub fn uses_nbd(self) -> bool {
        matches!(self, Backend::UswapNbd | Backend::UswapZramNbd)
    }

    /// Whether the run puts a swap file of uswap's in the swap directory.
    pub fn has_uswap_file(self) -> bool {
        matches!(self, Backend::UswapFile | Backend::UswapZramFile)
    }

    /// The kernel backend that pages to the same kind of device, the one
    /// this uswap backend is measured against like for like: compressed
    /// RAM against zram, a swap file against a swap file, a compressed
    /// store with a file behind it against zswap in front of one.  None for
    /// the RAM device, which saves no memory (it moves pages to another
    /// part of the process): an instrument for the pager, not a rival.
    pub fn kernel_pair(self) -> Option<Backend> {
        match self {
            Backend::UswapZram => Some(Backend::KernelZram),
            Backend::UswapFile => Some(Backend::KernelFile),
            Backend::UswapZramFile => Some(Backend::KernelZswap),
            // No kernel NBD client on this machine kind (no nbd module):
            // the export against a kernel swap file, the remote tier
            // against zswap in front of one.
            Backend::UswapNbd => Some(Backend::KernelFile),
            Backend::UswapZramNbd => Some(Backend::KernelZswap),
            _ => None,
        }
    }

    /// Whether swapped pages stay in memory (whole or compressed).
    pub fn swaps_to_ram(self) -> bool {
        matches!(self, Backend::Uswap | Backend::UswapZram | Backend::KernelZram)
    }
}

/// Everything one run needs.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkerSpec {
    pub workload: Workload,
    pub backend: Backend,
    pub ablation: String,
    pub unit: Unit,
    pub threads: usize,
    pub wss: u64,
    pub budget: u64,
    pub swap_bytes: u64,
    pub seconds: f64,
    pub data: DataKind,
    pub seed: u64,
    /// The codec of uswap's compressed device, as the swap spec writes it
    /// (`lz4`, `zstd:1`).
    pub codec: String,
    /// The memory limit of the compressed store of a tier (and of zswap's
    /// pool), bytes.
    pub store_limit: u64,
    pub swap_dir: PathBuf,
    /// The memory cgroup to join first (kernel backends).
    pub cgroup: Option<PathBuf>,
    /// The NBD export's URI (the remote backends), set by the run.
    #[serde(default)]
    pub nbd: Option<String>,
    /// Where to write the [`WorkerResult`].
    pub result: PathBuf,
}

/// Latency percentiles, nanoseconds.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Percentiles {
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub mean: f64,
}

/// What a run measured.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct WorkerResult {
    /// Operations of the timed phase: accesses (pmbench), pages written
    /// (seq-write), page touches (activate).
    pub ops: u64,
    pub elapsed_s: f64,
    /// The untimed write of the whole working set before pmbench's phase.
    pub populate_s: f64,
    pub swapin_bytes: u64,
    pub swapout_bytes: u64,
    /// Activate: regions mapped, touched by all threads and unmapped.
    pub iterations: u64,
    pub latency: Percentiles,
    /// (latency ns, fraction of operations at or below it).
    pub cdf: Vec<(f64, f64)>,
    /// (seconds, operations per second).
    pub timeline: Vec<(f64, f64)>,
    /// uswap's lock sites during the timed phase (none for the kernel).
    pub locks: BTreeMap<String, LockStats>,
    pub counters: BTreeMap<String, u64>,
    /// What the compressed store held at the end of the timed phase
    /// (uswap's compressed devices, zram, zswap).
    pub store: Option<StoreUse>,
}

/// The memory a compressed swap store used, read in the run: uswap's
/// gauges, zram's `mm_stat`, zswap's lines of /proc/meminfo and
/// /proc/vmstat.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct StoreUse {
    /// Pages the store held in memory (same-filled included).
    pub pages: u64,
    /// Bytes of memory the store took for them, fragmentation included.
    pub mem_bytes: u64,
    /// The most it took.
    pub mem_peak_bytes: u64,
    /// Their compressed bytes.
    pub compr_bytes: u64,
    /// Pages stored as one repeated word.
    pub same_pages: u64,
    /// Pages stored whole (did not compress).
    pub whole_pages: u64,
    /// Pages written back to a file behind the store (during the timed
    /// phase, for zswap: `zswpwb`).
    pub written_back: u64,
}

impl StoreUse {
    /// Memory per page held: the store's cost of one swapped page.
    pub fn bytes_per_page(&self) -> f64 {
        self.mem_bytes as f64 / self.pages.max(1) as f64
    }

    fn of_uswap(s: &uswap::stats::Stats) -> Option<StoreUse> {
        (s.gauges.store_limit_bytes > 0).then(|| StoreUse {
            pages: s.gauges.store_orig_bytes / PAGE as u64,
            mem_bytes: s.gauges.store_mem_bytes,
            mem_peak_bytes: s.gauges.store_mem_peak_bytes,
            compr_bytes: s.gauges.store_compr_bytes,
            same_pages: s.gauges.store_same_pages,
            whole_pages: s.gauges.store_whole_pages,
            written_back: s.counters.store_writebacks,
        })
    }

    /// zram0's `mm_stat`: orig_data_size compr_data_size mem_used_total
    /// mem_limit mem_used_max same_pages pages_compacted huge_pages.
    fn of_zram() -> Option<StoreUse> {
        let s = std::fs::read_to_string("/sys/block/zram0/mm_stat").ok()?;
        let v: Vec<u64> = s.split_whitespace().filter_map(|x| x.parse().ok()).collect();
        Some(StoreUse {
            pages: *v.first()? / PAGE as u64,
            compr_bytes: *v.get(1)?,
            mem_bytes: *v.get(2)?,
            mem_peak_bytes: *v.get(4)?,
            same_pages: *v.get(5)?,
            whole_pages: *v.get(7)?,
            written_back: 0,
        })
    }

    /// zswap: `Zswap` (pool bytes) and `Zswapped` (bytes of the pages in
    /// it) in /proc/meminfo.
    fn of_zswap(written_back: u64) -> Option<StoreUse> {
        let m = std::fs::read_to_string("/proc/meminfo").ok()?;
        let kb = |k: &str| -> Option<u64> {
            m.lines()
                .find_map(|l| {
                    l.strip_prefix(k)?
                        .trim()
                        .strip_suffix("kB")?
                        .trim()
                        .parse::<u64>()
                        .ok()
                })
                .map(|v| v << 10)
        };
        let pool = kb("Zswap:")?;
        Some(StoreUse {
            pages: kb("Zswapped:")? / PAGE as u64,
            mem_bytes: pool,
            mem_peak_bytes: pool,
            compr_bytes: pool,
            same_pages: 0,
            whole_pages: 0,
            written_back,
        })
    }
}

/// A counter of /proc/vmstat.
fn vmstat(key: &str) -> u64 {
    let vm = std::fs::read_to_string("/proc/vmstat").unwrap_or_default();
    vm.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse::<u64>().ok())
        .unwrap_or(0)
}

/// The hidden `uswap bench worker` command.
#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// The run, as JSON.
    #[arg(long)]
    pub spec: String,
}

/// The memory a workload runs on: a uswap region or a plain anonymous
/// mapping, which the kernel pages under the cgroup's limit.
pub(crate) enum Mapping {
    Uswap(Region),
    Kernel(uswap::sys::Mapping),
}

impl Mapping {
    /// A plain private anonymous mapping of `len` bytes, which the kernel
    /// pages (and swaps, under a memory cgroup's limit); for 2 MB units,
    /// 2 MB aligned and advised for transparent huge pages.
    pub(crate) fn kernel(len: usize, unit: Unit) -> Result<Mapping> {
        let align = if unit == Unit::Huge { HUGE } else { PAGE };
        let m = uswap::sys::Mapping::new(len, align).with_context(|| format!("mmap of {len} bytes"))?;
        if unit == Unit::Huge {
            m.advise_huge()
                .context("madvise(MADV_HUGEPAGE); is transparent_hugepage disabled?")?;
        }
        Ok(Mapping::Kernel(m))
    }

    pub(crate) fn base(&self) -> usize {
        match self {
            Mapping::Uswap(r) => r.as_ptr() as usize,
            Mapping::Kernel(m) => m.addr() as usize,
        }
    }
}

/// Who pages this worker's memory.
enum Pager {
    Uswap(Swap),
    Kernel,
}

impl Pager {
    fn start(spec: &WorkerSpec) -> Result<Pager> {
        if spec.backend.is_kernel() {
            let cg = spec.cgroup.as_ref().context("kernel backend without a cgroup")?;
            std::fs::write(cg.join("cgroup.procs"), std::process::id().to_string())
                .with_context(|| format!("joining the memory cgroup {}", cg.display()))?;
            return Ok(Pager::Kernel);
        }
        let a = ablation(&spec.ablation)?;
        // The compressed devices are written as swap specs: the grammar
        // `uswap demo` and `uswap run` take.
        let spec_of = |s: String| {
            s.parse::<SwapDeviceSpec>()
                .with_context(|| format!("the swap spec {s:?}"))
        };
        let device = match spec.backend {
            Backend::UswapFile => SwapDeviceSpec::file(
                FileOptions::new(uswap_file(spec), spec.swap_bytes / PAGE as u64)
                    .extent_kind(a.extent)
                    .encrypt(!a.plaintext),
            ),
            Backend::UswapZram => spec_of(format!("zram:{}:{}", spec.swap_bytes, spec.codec))?,
            Backend::UswapZramFile => spec_of(format!(
                "zram:{}:{},file:{}:{}{}",
                spec.store_limit,
                spec.codec,
                uswap_file(spec).display(),
                spec.swap_bytes,
                if a.plaintext { ":plain" } else { "" }
            ))?,
            Backend::UswapNbd | Backend::UswapZramNbd => {
                let uri = spec
                    .nbd
                    .as_deref()
                    .context("a remote backend without its server")?;
                let plain = if a.plaintext { "&plain" } else { "" };
                if spec.backend == Backend::UswapNbd {
                    spec_of(format!("{uri}{plain}"))?
                } else {
                    spec_of(format!("zram:{}:{},{uri}{plain}", spec.store_limit, spec.codec))?
                }
            }
            _ => SwapDeviceSpec::ram(spec.swap_bytes),
        };
        let device = match device {
            SwapDeviceSpec::Compressed { options, priority } => SwapDeviceSpec::Compressed {
                options: options
                    .keep_copies(a.keep_copies)
                    .incompressible_to_file(a.incompressible_to_file),
                priority,
            },
            d => d,
        };
        let swap = Swap::builder()
            .budget(spec.budget)
            .device(device)
            .switches(a.switches)
            .lru_batch(a.lru)
            .readahead(a.readahead)
            .per_page_evict(a.per_page_evict)
            .paced_reclaim(a.paced)
            .reclaim_ahead_in_memory(a.reclaim_ahead_in_memory)
            .wide_fault_around(a.wide_fault_around)
            .refault_distance(a.refault_distance)
            .trend_prefetch(a.trend_prefetch)
            .adaptive_seal(a.adaptive_seal)
            .adaptive_clean(a.adaptive_clean)
            .batched_reads(a.batched_reads)
            .fault_read_in_batch(a.fault_read_in_batch)
            .compact_slots(a.compact_slots)
            .evict_neighbours(a.evict_neighbours)
            // Published, as `uswap run` publishes.
            .publish(true)
            .build()
            .context("starting uswap")?;
        Ok(Pager::Uswap(swap))
    }

    fn map(&self, len: usize, unit: Unit) -> Result<Mapping> {
        match self {
            Pager::Uswap(s) => {
                let r = match unit {
                    Unit::Page => s.map(len),
                    Unit::Huge => s.map_huge(len),
                };
                Ok(Mapping::Uswap(r.context("mapping the region")?))
            }
            Pager::Kernel => Mapping::kernel(len, unit),
        }
    }

    /// Bytes read from and written to swap so far.
    fn io_bytes(&self) -> (u64, u64) {
        match self {
            Pager::Uswap(s) => {
                let st = s.stats();
                (
                    st.counters.io_read_pages * PAGE as u64,
                    st.counters.io_write_pages * PAGE as u64,
                )
            }
            Pager::Kernel => (vmstat("pswpin") * PAGE as u64, vmstat("pswpout") * PAGE as u64),
        }
    }

    fn snapshot(&self) -> uswap::stats::Stats {
        match self {
            Pager::Uswap(s) => s.stats(),
            Pager::Kernel => Default::default(),
        }
    }
}

/// uswap-file's swap file for this run.
fn uswap_file(spec: &WorkerSpec) -> PathBuf {
    spec.swap_dir
        .join(format!("uswap-bench-{}.swap", std::process::id()))
}

/// Removes a file when dropped: a run's swap file goes when the run ends
/// (the device leaves files it was given in place), so that a bench of
/// many runs does not hold one swap file per run until it finishes.
struct RemoveOnDrop(Option<PathBuf>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(p) = &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// The body of `uswap bench worker`.
pub fn main(args: &WorkerArgs) -> Result<()> {
    let spec: WorkerSpec = serde_json::from_str(&args.spec).context("bad worker spec")?;
    // Declared before the pager, so dropped after it (and its device).
    let _swap_file = RemoveOnDrop(spec.backend.has_uswap_file().then(|| uswap_file(&spec)));
    let pager = Pager::start(&spec)?;
    let wss = spec.wss as usize;
    let filler = Filler::new(spec.data, spec.seed);
    let duration = Duration::from_secs_f64(spec.seconds);
    let sample = Duration::from_secs_f64((spec.seconds / 100.0).clamp(0.02, 0.25));
    let threads = spec.threads;
    let mut result = WorkerResult::default();

    // The region pmbench and seq-write run on (activate maps its own).
    let region = match spec.workload {
        Workload::Activate => None,
        _ => Some(pager.map(wss, spec.unit)?),
    };
    if let (Workload::Pmbench { .. }, Some(m)) = (spec.workload, &region) {
        // Untimed: write the whole working set once so that accesses find
        // data, most of it already swapped out.
        let t0 = Instant::now();
        let base = m.base();
        workload::run_threads(threads, Duration::MAX, sample, |t, p, h| {
            workload::write_slice(Area { base, len: wss }, spec.unit, threads, t, &filler, p, h)
        });
        result.populate_s = t0.elapsed().as_secs_f64();
    }

    let (in0, out0) = pager.io_bytes();
    let before = pager.snapshot();
    let zswap_wb0 = vmstat("zswpwb");
    let timed: Timed = match spec.workload {
        Workload::Pmbench { read_pct, pattern } => {
            let base = region.as_ref().expect("mapped").base();
            workload::run_threads(threads, duration, sample, |t, p, h| {
                workload::pmbench_thread(
                    Area { base, len: wss },
                    read_pct,
                    pattern,
                    spec.seed,
                    (t, threads),
                    &filler,
                    p,
                    h,
                )
            })
        }
        Workload::SeqWrite => {
            let base = region.as_ref().expect("mapped").base();
            workload::run_threads(threads, duration, sample, |t, p, h| {
                workload::write_slice(Area { base, len: wss }, spec.unit, threads, t, &filler, p, h)
            })
        }
        Workload::Activate => activate(&pager, &spec, duration, sample)?,
    };
    let (in1, out1) = pager.io_bytes();
    let stats = pager.snapshot().since(&before);
    result.store = match spec.backend {
        Backend::KernelZram => StoreUse::of_zram(),
        Backend::KernelZswap => StoreUse::of_zswap(vmstat("zswpwb").saturating_sub(zswap_wb0)),
        Backend::UswapZram | Backend::UswapZramFile | Backend::UswapZramNbd => StoreUse::of_uswap(&stats),
        _ => None,
    };

    result.ops = timed.ops;
    result.elapsed_s = timed.elapsed.as_secs_f64();
    result.iterations = timed.iterations;
    result.swapin_bytes = in1.saturating_sub(in0);
    result.swapout_bytes = out1.saturating_sub(out0);
    let h = &timed.latency;
    result.latency = Percentiles {
        p50: h.value_at_quantile(0.5) as f64,
        p99: h.value_at_quantile(0.99) as f64,
        p999: h.value_at_quantile(0.999) as f64,
        max: h.max() as f64,
        mean: h.mean(),
    };
    let mut qs: Vec<f64> = (0..100).map(|i| i as f64 / 100.0).collect();
    qs.extend((1..10).map(|i| 0.99 + i as f64 / 1000.0));
    qs.extend([0.9995, 0.9999, 1.0]);
    result.cdf = qs.iter().map(|&q| (h.value_at_quantile(q) as f64, q)).collect();
    result.timeline = timed.timeline;
    result.locks = stats
        .locks
        .iter()
        .filter(|(_, v)| v.acquisitions > 0)
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    result.counters = stats
        .counters
        .iter()
        .filter(|(_, v)| *v > 0)
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    drop(region);
    let text = serde_json::to_string(&result)?;
    std::fs::write(&spec.result, text).with_context(|| format!("writing {}", spec.result.display()))
}

/// Seed 002's experiment: map one region, have every thread touch all of
/// it, unmap; again until the time is up (a round in progress finishes).
fn activate(pager: &Pager, spec: &WorkerSpec, duration: Duration, sample: Duration) -> Result<Timed> {
    let threads = spec.threads;
    let len = spec.wss as usize;
    let mut total = Timed {
        ops: 0,
        elapsed: Duration::ZERO,
        latency: workload::new_histogram(),
        timeline: Vec::new(),
        iterations: 0,
    };
    let start = Instant::now();
    while total.iterations == 0 || start.elapsed() < duration {
        let m = pager.map(len, spec.unit)?;
        let base = m.base();
        let t0 = start.elapsed().as_secs_f64();
        let round = workload::run_threads(threads, Duration::MAX, sample, |t, p, h| {
            let mut done = 0;
            workload::touch_all(base, len, threads, t, p, &mut done, h)
        });
        drop(m);
        total.ops += round.ops;
        total.latency.add(&round.latency).expect("same bounds");
        total
            .timeline
            .extend(round.timeline.iter().map(|&(t, r)| (t0 + t, r)));
        total.iterations += 1;
    }
    total.elapsed = start.elapsed();
    Ok(total)
}

/// Run one worker process for `spec` (its `result` path is filled in
/// here), waiting for it while watching for Ctrl-C.
pub fn spawn(mut spec: WorkerSpec, scratch: &Path) -> Result<WorkerResult> {
    spec.result = scratch.join("result.json");
    let _ = std::fs::remove_file(&spec.result);
    let stderr_path = scratch.join("worker.stderr");
    let stderr = std::fs::File::create(&stderr_path).context("creating the worker's stderr file")?;
    let exe = std::env::current_exe().context("locating the uswap binary")?;
    let mut child = Command::new(exe)
        .args(["bench", "worker", "--spec", &serde_json::to_string(&spec)?])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .context("starting a worker process")?;
    // A run that hangs (a bug, or a device that stopped answering) must
    // not hang the bench: past a generous deadline the worker is killed
    // and the run reported.
    let limit = Duration::from_secs_f64(300.0 + 20.0 * spec.seconds);
    let started = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().context("waiting for the worker")? {
            break st;
        }
        if started.elapsed() > limit {
            let pid = child.id();
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "{} {} run (worker pid {pid}) did not finish within {:.0} s and was killed: a hang; please report it with the command line",
                spec.backend.name(),
                spec.workload.name(),
                limit.as_secs_f64()
            );
        }
        if interrupted().is_err() {
            let _ = child.kill();
            let _ = child.wait();
            interrupted()?;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    interrupted()?;
    if !status.success() {
        let err = std::fs::read_to_string(&stderr_path).unwrap_or_default();
        let last = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim();
        use std::os::unix::process::ExitStatusExt;
        let why = match status.signal() {
            Some(libc::SIGKILL) if spec.backend.is_kernel() => {
                "killed (SIGKILL): the cgroup's OOM killer, most likely; give more swap (--swap-size) or a larger --budget".to_string()
            }
            Some(sig) => format!("killed by signal {sig}"),
            None => last.strip_prefix("error: ").unwrap_or(last).to_string(),
        };
        bail!(
            "{} {} run failed: {why}",
            spec.backend.name(),
            spec.workload.name()
        );
    }
    let text = std::fs::read_to_string(&spec.result).context("reading the worker's result")?;
    serde_json::from_str(&text).context("parsing the worker's result")
}

/// The kernel device a kernel backend runs on.
pub fn kernel_device(
    backend: Backend,
    swap_bytes: u64,
    swap_dir: &Path,
    algorithm: Option<&str>,
    zswap: &super::kernel_swap::Zswap,
) -> Option<KernelDevice> {
    match backend {
        Backend::KernelZswap => Some(KernelDevice::Zswap {
            dir: swap_dir.to_path_buf(),
            bytes: swap_bytes,
            zswap: zswap.clone(),
        }),
        Backend::KernelZram => Some(KernelDevice::Zram {
            bytes: swap_bytes,
            algorithm: algorithm.map(str::to_string),
        }),
        Backend::KernelFile => Some(KernelDevice::File {
            dir: swap_dir.to_path_buf(),
            bytes: swap_bytes,
        }),
        _ => None,
    }
}
