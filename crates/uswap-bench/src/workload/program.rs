//! `uswap bench program -- PROGRAM ARGS`: an unmodified program, larger
//! than its budget, run under `uswap run` (each device kind: RAM,
//! compressed, a file, a tier) and under kernel swap (a memory cgroup of
//! the same budget with zram, a swap file, or zswap in front of one), and
//! without any limit, interleaved round by round.
//!
//! Like for like: every run is a process tree in a cgroup v1 memory group
//! of its own (a limit of the budget for the kernel's runners, none for
//! the others), and what is reported is the tree's anonymous memory at
//! its peak (all its processes, sampled every 5 ms), not the largest
//! process's RSS; beside it the kernel's zram store at its peak, which no
//! memory group holds (uswap's compressed store is the program's memory,
//! in the tree's).  An OOM kill by the group is a result, counted, not an
//! error.  Wall and CPU seconds per run; every run's output must be the
//! same as the unlimited run's (a paging bug would show as a different
//! answer).

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use serde::Serialize;

use super::kernel_auto::{self, GroupAuto};
use super::kernel_swap::{self, interrupted, KernelDevice, KernelSwap, MemCgroup, Zswap};
use crate::parse_bytes;
use crate::report::median;

/// Who limits the program's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Runner {
    /// No limit: the reference (its output is what the others must print).
    Plain,
    /// `uswap run --mode handler` with a RAM swap device.
    Uswap,
    /// `uswap run --mode handler` with a swap file in --swap-dir.
    UswapFile,
    /// `uswap run --mode sigbus` with a RAM swap device.
    UswapSigbus,
    /// `uswap run --mode sigbus` with a swap file in --swap-dir.
    UswapSigbusFile,
    /// `uswap run --mode sigbus --syscall-guard off` with a RAM swap
    /// device: beside uswap-sigbus, what the system-call guard costs.
    UswapSigbusNoguard,
    /// A memory cgroup with kernel swap on /dev/zram0.
    KernelZram,
    /// A memory cgroup with kernel swap on a swap file in --swap-dir.
    KernelFile,
    /// `uswap run --mode handler` with a compressed device (`zram:SIZE`),
    /// its store left out of the budget as kernel-zram's is
    /// (`--store-outside-budget`).
    UswapZram,
    /// `uswap run --mode sigbus` with a compressed device, its store left
    /// out of the budget.
    UswapSigbusZram,
    /// `uswap run --mode auto` (the default mode) with a compressed
    /// device, its store left out of the budget: what a user who names
    /// no mode gets, beside the two modes named.
    UswapDefaultZram,
    /// `uswap run --mode handler` with a tier: a compressed store of
    /// --store-size in front of a swap file in --swap-dir.
    UswapTier,
    /// A memory cgroup with kernel swap on a swap file in --swap-dir and
    /// zswap in front of it, its pool limited to --store-size as near as
    /// zswap's unit allows (a percent of RAM, at least 1%): the tier's
    /// like; the pool is charged to the group.
    KernelZswap,
    /// The program itself, which uses uswap as a library: no limit from
    /// outside; it is given the budget and a compressed device in
    /// `USWAP_BENCH_BUDGET` and `USWAP_BENCH_SWAP` (the Python package's
    /// bench, `crates/uswap-python/bench/`).  kernel-zram's like.
    LibraryZram,
    /// As library-zram with a swap file in --swap-dir (made there with
    /// no name): kernel-file's like.
    LibraryFile,
    /// A memory cgroup of the budget and no swap at all: file-backed
    /// memory (`numpy.memmap`, the page cache) is all it can reclaim.
    Memcg,
    /// `uswap run --budget auto,max=BUDGET` and nothing else (the default
    /// mode and swap file): the budget finds itself under the ceiling.
    UswapAuto,
    /// `uswap run --mode sigbus --budget auto,max=BUDGET`: uswap-auto
    /// with the mode named (`--mode auto` is SIGBUS mode too, under the
    /// guard; it was handler-thread mode for root before 2026-12-03).
    UswapSigbusAuto,
    /// A memory cgroup over a kernel swap file in --swap-dir, its limit
    /// driven from the budget down by the same controller
    /// (`kernel_auto.rs`): uswap-auto's like.
    KernelAuto,
}

impl Runner {
    fn name(self) -> &'static str {
        match self {
            Runner::Plain => "plain",
            Runner::Uswap => "uswap",
            Runner::UswapFile => "uswap-file",
            Runner::UswapSigbus => "uswap-sigbus",
            Runner::UswapSigbusFile => "uswap-sigbus-file",
            Runner::UswapSigbusNoguard => "uswap-sigbus-noguard",
            Runner::KernelZram => "kernel-zram",
            Runner::KernelFile => "kernel-file",
            Runner::UswapZram => "uswap-zram",
            Runner::UswapSigbusZram => "uswap-sigbus-zram",
            Runner::UswapDefaultZram => "uswap-default-zram",
            Runner::UswapTier => "uswap-tier",
            Runner::KernelZswap => "kernel-zswap",
            Runner::LibraryZram => "library-zram",
            Runner::LibraryFile => "library-file",
            Runner::Memcg => "memcg",
            Runner::UswapAuto => "uswap-auto",
            Runner::UswapSigbusAuto => "uswap-sigbus-auto",
            Runner::KernelAuto => "kernel-auto",
        }
    }
}

#[derive(Args, Debug)]
pub struct ProgramArgs {
    /// Memory budget: `uswap run --budget`, the cgroup's memory limit;
    /// for the auto runners the ceiling they start from.
    #[arg(long, value_parser = parse_bytes)]
    pub budget: u64,
    /// Swap space for every limited runner [default: eight times the budget].
    #[arg(long, value_parser = parse_bytes)]
    pub swap_size: Option<u64>,
    /// Runners, comma separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "plain,uswap,kernel-zram"
    )]
    pub runner: Vec<Runner>,
    /// Each runner runs this many times, interleaved.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Where swap files go (uswap-file, uswap-tier, kernel-file,
    /// kernel-zswap).
    #[arg(long, default_value = "/var/tmp")]
    pub swap_dir: PathBuf,
    /// The compressed store's limit in a tier (uswap-tier) and zswap's
    /// pool's (kernel-zswap) [default: a quarter of the budget].
    #[arg(long, value_parser = parse_bytes)]
    pub store_size: Option<u64>,
    /// zswap's compressor (kernel-zswap): the kernel's default, as the
    /// crypto API here offers no lz4 to zswap (zram has its own).
    #[arg(long, default_value = "lzo-rle")]
    pub zswap_compressor: String,
    /// zram's compressor (kernel-zram): lz4, as uswap's compressed
    /// device, so that both store about the same bytes a page.
    #[arg(long, default_value = "lz4")]
    pub zram_algorithm: String,
    /// The auto runners' budget (uswap-auto, uswap-sigbus-auto, and
    /// kernel-auto's controller, the same): `uswap run --budget`'s
    /// `auto[:TARGET][,min=SIZE][,step=PCT][,interval=DURATION]`, its
    /// ceiling --budget.
    #[arg(long, default_value = "auto", value_parser = parse_auto)]
    pub auto: String,
    /// Environment for the program, NAME=VALUE (repeat).
    #[arg(long = "env", value_parser = parse_env)]
    pub env: Vec<(String, String)>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also write the JSON report to this file.
    #[arg(long)]
    pub json_out: Option<PathBuf>,
    /// Draw each runner's memory over time (its first run) to this
    /// file, PNG or SVG by its extension.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// The program and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM"
    )]
    pub program: Vec<String>,
}

/// `--auto`: an auto budget without `max=` (the ceiling is --budget).
fn parse_auto(s: &str) -> Result<String, String> {
    match crate::auto_spec::parse(s) {
        Ok(Some(spec)) if spec.start.is_none() => Ok(s.to_string()),
        Ok(Some(_)) => Err(format!("{s}: the ceiling is --budget, not max=")),
        Ok(None) => Err(format!("{s}: an auto budget, such as auto:0.5%,step=20%")),
        Err(e) => Err(e.to_string()),
    }
}

/// The tuning `--auto` asked for (checked when parsed).
fn auto_tuning(spec: &str) -> uswap::domain::auto::Tuning {
    crate::auto_spec::parse(spec)
        .ok()
        .flatten()
        .map(|a| a.tuning)
        .unwrap_or_default()
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{s:?}: write NAME=VALUE"))
}

/// One run.
#[derive(Clone, Debug, Serialize)]
pub struct Run {
    pub wall_s: f64,
    pub user_s: f64,
    pub sys_s: f64,
    /// The largest process's peak RSS (`ru_maxrss` of the tree).
    pub peak_rss_mib: f64,
    /// The tree's anonymous memory at its peak (the memory group's
    /// `total_rss`, sampled every 5 ms); None without a memory group
    /// (not root, or no cgroup v1 memory controller).
    pub tree_peak_mib: Option<f64>,
    /// The tree's anonymous memory over the run, the time-weighted mean
    /// of the same samples: what a budget that finds itself saves.
    pub tree_mean_mib: Option<f64>,
    /// The same samples every 100 ms: (seconds, MiB), for `--plot`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub memory: Vec<(f64, f64)>,
    /// The kernel's zram store at its peak (`mem_used_max`), outside any
    /// memory group: kernel-zram's memory past its group's.
    pub zram_peak_mib: Option<f64>,
    /// The memory group killed the program (OOM): a result, not an error.
    pub oom_killed: bool,
}

#[derive(Debug, Serialize)]
pub struct RunnerReport {
    pub runner: Runner,
    pub runs: Vec<Run>,
    /// Over the runs that finished (0 when none did).
    pub median_wall_s: f64,
    /// Runs the memory group killed.
    pub oom_kills: usize,
    /// Median over rounds of this runner's wall time over uswap's in the
    /// same round (absent without a uswap runner).
    pub vs_uswap: Option<f64>,
    /// The same over plain's (absent without a plain runner).
    pub vs_plain: Option<f64>,
}

/// Run `cmd`, waited for with its resource use, sampling `group`'s
/// anonymous memory meanwhile (and moving its limit with `auto`); its
/// stdout is returned.
fn timed(
    mut cmd: Command,
    group: Option<&MemCgroup>,
    mut auto: Option<GroupAuto>,
) -> Result<(Run, Vec<u8>, std::process::ExitStatus)> {
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let sampler = group.map(|g| {
            let done = &done;
            let auto = auto.as_mut();
            s.spawn(move || {
                let mut auto = auto;
                let start = Instant::now();
                let (mut peak, mut area, mut last) = (0u64, 0.0f64, (0.0f64, 0u64));
                let mut memory = Vec::new();
                loop {
                    let now = Instant::now();
                    let t = now.duration_since(start).as_secs_f64();
                    let b = g.anon_bytes();
                    peak = peak.max(b);
                    // The trapezoid between two samples.
                    area += (t - last.0) * (b + last.1) as f64 / 2.0;
                    if memory.last().is_none_or(|&(s, _): &(f64, f64)| t - s >= 0.1) {
                        memory.push((t, b as f64 / (1 << 20) as f64));
                    }
                    last = (t, b);
                    if let Some(a) = auto.as_deref_mut() {
                        a.tick(now);
                    }
                    if done.load(std::sync::atomic::Ordering::Relaxed) {
                        let mean = if t > 0.0 { area / t } else { b as f64 };
                        return (peak, mean, memory);
                    }
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
            })
        });
        let r = timed_child(&mut cmd);
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        let sampled = sampler.and_then(|t| t.join().ok());
        r.map(|(mut run, out, st)| {
            let mib = |b: f64| b / (1 << 20) as f64;
            if let Some((peak, mean, memory)) = sampled {
                run.tree_peak_mib = Some(mib(peak as f64));
                run.tree_mean_mib = Some(mib(mean));
                run.memory = memory;
            }
            (run, out, st)
        })
    })
}

fn timed_child(cmd: &mut Command) -> Result<(Run, Vec<u8>, std::process::ExitStatus)> {
    let start = Instant::now();
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the program")?;
    let mut out = Vec::new();
    if let Some(mut so) = child.stdout.take() {
        std::io::Read::read_to_end(&mut so, &mut out).context("reading the program's output")?;
    }
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child, writing its status and usage.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut ru) };
    if pid < 0 {
        bail!("waiting for the program: {}", std::io::Error::last_os_error());
    }
    let wall_s = start.elapsed().as_secs_f64();
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let run = Run {
        wall_s,
        user_s: tv(ru.ru_utime),
        sys_s: tv(ru.ru_stime),
        peak_rss_mib: ru.ru_maxrss as f64 / 1024.0,
        tree_peak_mib: None,
        tree_mean_mib: None,
        memory: Vec::new(),
        zram_peak_mib: None,
        oom_killed: false,
    };
    Ok((run, out, std::process::ExitStatus::from_raw(status)))
}

/// One run of `r`; the output is None when the memory group killed it.
fn one(a: &ProgramArgs, r: Runner, swap: u64) -> Result<(Run, Option<Vec<u8>>)> {
    let page = uswap::PAGE_SIZE as u64;
    let swap = swap / page * page;
    let exe = std::env::current_exe().context("finding this executable")?;
    // Like for like with kernel-zram, whose store a memory group does not
    // charge: a compressed store alone stays out of the budget.
    let store_outside = matches!(
        r,
        Runner::UswapZram | Runner::UswapSigbusZram | Runner::UswapDefaultZram
    );
    let uswap_run = |mode: &str, spec: String| {
        let mut c = Command::new(&exe);
        let (mode, guard) = match mode.split_once(',') {
            Some((m, g)) => (m, g),
            None => (mode, "on"),
        };
        c.args([
            "run",
            "--syscall-guard",
            guard,
            "--mode",
            mode,
            "--budget",
            &a.budget.to_string(),
            "--swap",
            &spec,
        ]);
        if store_outside {
            c.arg("--store-outside-budget");
        }
        c.arg("--");
        c.args(&a.program);
        c
    };
    let file = a
        .swap_dir
        .join(format!("uswap-bench-program-{}.swap", std::process::id()));
    let store = store_bytes(a);
    let kernel = |dev: KernelDevice| -> Result<KernelSwap> { KernelSwap::on(&dev) };
    let mut held = None;
    let program = || {
        let mut c = Command::new(&a.program[0]);
        c.args(&a.program[1..]);
        c
    };
    let library = |spec: String| {
        let mut c = program();
        c.env("USWAP_BENCH_BUDGET", a.budget.to_string())
            .env("USWAP_BENCH_SWAP", spec);
        c
    };
    let cmd = match r {
        Runner::LibraryZram => library(format!("zram:{swap}")),
        Runner::LibraryFile => library(format!("file:{}:{swap}", a.swap_dir.display())),
        Runner::Memcg => program(),
        Runner::Plain => program(),
        Runner::Uswap => uswap_run("handler", format!("ram:{swap}")),
        Runner::UswapFile => uswap_run("handler", format!("file:{}:{swap}", file.display())),
        Runner::UswapSigbus => uswap_run("sigbus", format!("ram:{swap}")),
        Runner::UswapSigbusFile => uswap_run("sigbus", format!("file:{}:{swap}", file.display())),
        Runner::UswapSigbusNoguard => uswap_run("sigbus,off", format!("ram:{swap}")),
        Runner::UswapZram => uswap_run("handler", format!("zram:{swap}")),
        Runner::UswapSigbusZram => uswap_run("sigbus", format!("zram:{swap}")),
        Runner::UswapDefaultZram => uswap_run("auto", format!("zram:{swap}")),
        Runner::UswapTier => uswap_run("handler", format!("zram:{store},file:{}:{swap}", file.display())),
        Runner::UswapAuto | Runner::UswapSigbusAuto => {
            let mut c = Command::new(&exe);
            if r == Runner::UswapSigbusAuto {
                c.args(["run", "--mode", "sigbus"]);
            } else {
                c.arg("run");
            }
            c.args(["--budget", &format!("{},max={}", a.auto, a.budget), "--"]);
            c.args(&a.program);
            c
        }
        Runner::KernelZram | Runner::KernelFile | Runner::KernelZswap | Runner::KernelAuto => {
            held = Some(kernel(kernel_device(a, r, swap).expect("a kernel runner"))?);
            program()
        }
    };
    let limited = held.is_some() || r == Runner::Memcg;
    // Every run in a memory group of its own: the kernel's (and memcg's)
    // with the budget as its limit, the others unlimited, measured alike.
    // Without the privilege (or the controller) a uswap or plain run goes
    // unmeasured; a limited runner cannot.
    let group = match MemCgroup::create(limited.then_some(a.budget)) {
        Ok(g) => Some(g),
        Err(e) if limited => return Err(e),
        Err(_) => None,
    };
    // memcg means no swap even where the machine has some on: the group
    // reclaims file pages only.
    if let (Runner::Memcg, Some(g)) = (r, &group) {
        std::fs::write(g.path().join("memory.swappiness"), "0")
            .with_context(|| format!("{}: setting memory.swappiness", g.path().display()))?;
    }
    let mut cmd = match &group {
        // The shell joins the group, then becomes the command.
        Some(g) => {
            let mut c = Command::new("/bin/sh");
            c.arg("-c")
                .arg("echo $$ > \"$0\" && exec \"$@\"")
                .arg(g.path().join("cgroup.procs"))
                .arg(cmd.get_program())
                .args(cmd.get_args());
            for (k, v) in cmd.get_envs() {
                if let Some(v) = v {
                    c.env(k, v);
                }
            }
            c
        }
        None => cmd,
    };
    // A program that chooses its own way to hold its memory (uswap as a
    // library, numpy.memmap) reads which runner this is.
    cmd.env("USWAP_BENCH_RUNNER", r.name());
    for (k, v) in &a.env {
        cmd.env(k, v);
    }
    let auto = match (r, &group) {
        (Runner::KernelAuto, Some(g)) => Some(GroupAuto::new(g, a.budget, auto_tuning(&a.auto))),
        _ => None,
    };
    // Nor this run for anything before it.
    settle_disk(&a.swap_dir);
    let (mut run, out, status) = timed(cmd, group.as_ref(), auto)?;
    if r == Runner::KernelZram {
        run.zram_peak_mib = kernel_swap::zram_peak_bytes().map(|b| b as f64 / (1 << 20) as f64);
    }
    // A kill in the tree is the run's result whatever the status says (a
    // pipeline's is its last command's: `sort` killed under `| sha256sum`
    // exits 0 with another digest).
    run.oom_killed = group.as_ref().is_some_and(|g| g.oom_kills() > 0);
    // The group goes before the swap (drop order), the program gone.
    drop(group);
    drop(held);
    settle_disk(&a.swap_dir);
    if run.oom_killed {
        return Ok((run, None));
    }
    if !status.success() {
        bail!("{} under {}: {status}", a.program.join(" "), r.name());
    }
    Ok((run, Some(out)))
}

/// Wait (up to 30 s) until the disk under `dir` is quiet: no IO in
/// flight and none done in 20 ms, three times running, so that no run
/// pays for the one before.  A uswap run's unnamed swap file is freed
/// after the program has gone, by the kernel's io_uring teardown
/// (`WriteRing::hold_files`), its discards (one after another) still on
/// the disk when the run's time is taken, where the kernel runners' swap
/// file is removed before this, in the time between runs.  Nothing to
/// wait for where the disk's counters cannot be read.
fn settle_disk(dir: &std::path::Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(dev) = std::fs::metadata(dir).map(|m| m.dev()) else {
        return;
    };
    let sys = format!("/sys/dev/block/{}:{}", libc::major(dev), libc::minor(dev));
    let look = || {
        let inflight = std::fs::read_to_string(format!("{sys}/inflight")).ok()?;
        let done = std::fs::read_to_string(format!("{sys}/stat")).ok()?;
        Some((inflight.split_whitespace().all(|n| n == "0"), done))
    };
    let start = std::time::Instant::now();
    let Some(mut last) = look() else {
        return;
    };
    let mut quiet = 0;
    while quiet < 3 && start.elapsed() < std::time::Duration::from_secs(30) {
        std::thread::sleep(std::time::Duration::from_millis(20));
        let Some(now) = look() else {
            return;
        };
        quiet = if now.0 && now.1 == last.1 { quiet + 1 } else { 0 };
        last = now;
    }
}

/// The compressed store's limit in a tier and zswap's pool's, whole
/// pages: --store-size, or a quarter of the budget.
fn store_bytes(a: &ProgramArgs) -> u64 {
    let page = uswap::PAGE_SIZE as u64;
    a.store_size.unwrap_or(a.budget / 4) / page * page
}

/// The kernel swap device runner `r` uses; None for the others.
fn kernel_device(a: &ProgramArgs, r: Runner, swap: u64) -> Option<KernelDevice> {
    let store = store_bytes(a);
    match r {
        Runner::KernelZram => Some(KernelDevice::Zram {
            bytes: swap,
            algorithm: Some(a.zram_algorithm.clone()),
        }),
        Runner::KernelFile | Runner::KernelAuto => Some(KernelDevice::File {
            dir: a.swap_dir.clone(),
            bytes: swap,
        }),
        Runner::KernelZswap => Some(KernelDevice::Zswap {
            dir: a.swap_dir.clone(),
            bytes: swap,
            zswap: Zswap {
                compressor: a.zswap_compressor.clone(),
                max_pool_percent: Zswap::pool_for(store).0,
            },
        }),
        _ => None,
    }
}

pub fn run(a: &ProgramArgs) -> Result<()> {
    if a.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    if let Some(p) = &a.plot {
        super::plot::check_path(p)?;
    }
    if a.runner.contains(&Runner::KernelAuto) && !kernel_auto::psi_available() {
        bail!("the kernel-auto runner needs the kernel's memory pressure, /proc/pressure/memory: boot with psi=1 (CONFIG_PSI), or leave kernel-auto out of --runner");
    }
    let swap = a.swap_size.unwrap_or(8 * a.budget);
    let kernel: Vec<_> = a
        .runner
        .iter()
        .filter_map(|&r| kernel_device(a, r, swap))
        .collect();
    if !kernel.is_empty() {
        kernel_swap::preflight(&kernel.iter().collect::<Vec<_>>())?;
        kernel_swap::catch_interrupts();
    }
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); a.runner.len()];
    let mut reference: Option<(Runner, Vec<u8>)> = None;
    for round in 0..a.rounds {
        for (i, &r) in a.runner.iter().enumerate() {
            interrupted()?;
            if !a.json {
                eprintln!("round {}/{}: {}", round + 1, a.rounds, r.name());
            }
            let (run, out) = one(a, r, swap)?;
            if !a.json && run.oom_killed {
                eprintln!(
                    "round {}/{}: {} was OOM-killed by its memory group",
                    round + 1,
                    a.rounds,
                    r.name()
                );
            }
            match (&reference, out) {
                (_, None) => {}
                (None, Some(out)) => reference = Some((r, out)),
                (Some((first, want)), Some(out)) if *want != out => bail!(
                    "the program printed something else under {} than under {}: paging changed its answer",
                    r.name(),
                    first.name()
                ),
                _ => {}
            }
            runs[i].push(run);
        }
    }
    let uswap_walls: Option<Vec<f64>> = a
        .runner
        .iter()
        .position(|&r| r == Runner::Uswap)
        .map(|u| runs[u].iter().map(|x| x.wall_s).collect());
    let plain_walls: Option<Vec<f64>> = a
        .runner
        .iter()
        .position(|&r| r == Runner::Plain)
        .map(|u| runs[u].iter().map(|x| x.wall_s).collect());
    let versus = |runs: &[Run], base: &Option<Vec<f64>>| {
        base.as_ref().map(|u| {
            median(
                runs.iter()
                    .zip(u)
                    .filter(|(x, _)| !x.oom_killed)
                    .map(|(x, u)| x.wall_s / u.max(1e-9))
                    .collect(),
            )
        })
    };
    let reports: Vec<RunnerReport> = a
        .runner
        .iter()
        .zip(runs)
        .map(|(&runner, runs)| RunnerReport {
            runner,
            median_wall_s: median(runs.iter().filter(|x| !x.oom_killed).map(|x| x.wall_s).collect()),
            oom_kills: runs.iter().filter(|x| x.oom_killed).count(),
            vs_uswap: versus(&runs, &uswap_walls),
            vs_plain: versus(&runs, &plain_walls),
            runs,
        })
        .collect();
    let report = serde_json::json!({
        "bench": "program",
        "program": a.program,
        "env": a.env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
        "budget": a.budget,
        "swap_size": swap,
        "rounds": a.rounds,
        "runners": reports,
    });
    if let Some(p) = &a.json_out {
        std::fs::write(p, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if a.json {
        println!("{report}");
        return Ok(());
    }
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "bench program: `{}`, budget {:.0} MiB, swap {:.0} MiB, {} rounds; the same output in every run",
        a.program.join(" "),
        mib(a.budget),
        mib(swap),
        a.rounds
    );
    println!(
        "{:<20} {:>9} {:>9} {:>9} {:>8} {:>8} {:>10} {:>9} {:>9} {:>10} {:>5}",
        "runner",
        "wall s",
        "vs plain",
        "vs uswap",
        "user s",
        "sys s",
        "tree MiB",
        "mean MiB",
        "+zram",
        "1-proc MiB",
        "OOM"
    );
    for r in &reports {
        let done: Vec<&Run> = r.runs.iter().filter(|x| !x.oom_killed).collect();
        let med = |f: &dyn Fn(&Run) -> f64| median(done.iter().map(|x| f(x)).collect());
        let opt = |f: &dyn Fn(&Run) -> Option<f64>| {
            let v: Vec<f64> = r.runs.iter().filter_map(f).collect();
            if v.is_empty() {
                "-".to_string()
            } else {
                format!("{:.1}", median(v))
            }
        };
        let some = !done.is_empty();
        println!(
            "{:<20} {:>9} {:>9} {:>9} {:>8} {:>8} {:>10} {:>9} {:>9} {:>10} {:>5}",
            r.runner.name(),
            if some {
                format!("{:.2}", r.median_wall_s)
            } else {
                "-".into()
            },
            r.vs_plain
                .filter(|_| some)
                .map_or("-".into(), |v| format!("{v:.3}x")),
            r.vs_uswap
                .filter(|_| some)
                .map_or("-".into(), |v| format!("{v:.2}x")),
            if some {
                format!("{:.2}", med(&|x| x.user_s))
            } else {
                "-".into()
            },
            if some {
                format!("{:.2}", med(&|x| x.sys_s))
            } else {
                "-".into()
            },
            opt(&|x| x.tree_peak_mib),
            opt(&|x| x.tree_mean_mib),
            opt(&|x| x.zram_peak_mib),
            if some {
                format!("{:.1}", med(&|x| x.peak_rss_mib))
            } else {
                "-".into()
            },
            format!("{}/{}", r.oom_kills, r.runs.len()),
        );
    }
    println!("(medians over rounds; tree MiB: the tree's anonymous memory at its peak, all processes, sampled every 5 ms in a memory group of its own; +zram: kernel zram's store at its peak, held outside the group; mean MiB: the same, its time-weighted mean over the run; 1-proc MiB: the largest process's peak RSS; OOM: runs the memory group killed, left out of the times; vs plain, vs uswap: median of the per-round ratio of wall times, above 1 is slower)");
    if let Some(p) = &a.plot {
        let lines: Vec<(String, Vec<(f64, f64)>)> = reports
            .iter()
            .filter_map(|r| {
                r.runs
                    .first()
                    .map(|x| (r.runner.name().to_string(), x.memory.clone()))
            })
            .filter(|(_, m)| !m.is_empty())
            .collect();
        let title = format!("{} (budget {:.0} MiB)", a.program.join(" "), mib(a.budget));
        super::plot::draw_memory(&title, &lines, p)?;
        println!("plot: {}", p.display());
    }
    Ok(())
}
