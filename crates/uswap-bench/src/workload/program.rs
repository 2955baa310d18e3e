//! `uswap bench program -- PROGRAM ARGS`: an unmodified program, larger
//! than its budget, run under `uswap run` and under kernel swap (a memory
//! cgroup of the same budget with zram or a swap file), and without any
//! limit, interleaved round by round.  Wall and CPU seconds and peak
//! resident memory per run; every run's output must be the same as the
//! unlimited run's (a paging bug would show as a different answer).

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use serde::Serialize;

use super::kernel_swap::{self, interrupted, KernelDevice, KernelSwap, MemCgroup};
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
        }
    }
}

#[derive(Args, Debug)]
pub struct ProgramArgs {
    /// Memory budget: `uswap run --budget`, the cgroup's memory limit.
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
    /// Where swap files go (uswap-file, kernel-file).
    #[arg(long, default_value = "/var/tmp")]
    pub swap_dir: PathBuf,
    /// Environment for the program, NAME=VALUE (repeat).
    #[arg(long = "env", value_parser = parse_env)]
    pub env: Vec<(String, String)>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also write the JSON report to this file.
    #[arg(long)]
    pub json_out: Option<PathBuf>,
    /// The program and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM"
    )]
    pub program: Vec<String>,
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
    pub peak_rss_mib: f64,
}

#[derive(Debug, Serialize)]
pub struct RunnerReport {
    pub runner: Runner,
    pub runs: Vec<Run>,
    pub median_wall_s: f64,
    /// Median over rounds of this runner's wall time over uswap's in the
    /// same round (absent without a uswap runner).
    pub vs_uswap: Option<f64>,
}

/// Run `cmd`, waited for with its resource use; its stdout is returned.
fn timed(mut cmd: Command) -> Result<(Run, Vec<u8>, std::process::ExitStatus)> {
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
    };
    Ok((run, out, std::process::ExitStatus::from_raw(status)))
}

fn one(a: &ProgramArgs, r: Runner, swap: u64) -> Result<(Run, Vec<u8>)> {
    let page = uswap::PAGE_SIZE as u64;
    let swap = swap / page * page;
    let exe = std::env::current_exe().context("finding this executable")?;
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
            "--",
        ]);
        c.args(&a.program);
        c
    };
    let file = a
        .swap_dir
        .join(format!("uswap-bench-program-{}.swap", std::process::id()));
    let kernel = |dev: KernelDevice| -> Result<(Command, KernelSwap, MemCgroup)> {
        let ks = KernelSwap::on(&dev)?;
        let cg = MemCgroup::create(a.budget)?;
        // The shell joins the cgroup, then becomes the program.
        let mut c = Command::new("/bin/sh");
        c.arg("-c")
            .arg("echo $$ > \"$0\" && exec \"$@\"")
            .arg(cg.path().join("cgroup.procs"))
            .args(&a.program);
        Ok((c, ks, cg))
    };
    let mut held = None;
    let mut cmd = match r {
        Runner::Plain => {
            let mut c = Command::new(&a.program[0]);
            c.args(&a.program[1..]);
            c
        }
        Runner::Uswap => uswap_run("handler", format!("ram:{swap}")),
        Runner::UswapFile => uswap_run("handler", format!("file:{}:{swap}", file.display())),
        Runner::UswapSigbus => uswap_run("sigbus", format!("ram:{swap}")),
        Runner::UswapSigbusFile => uswap_run("sigbus", format!("file:{}:{swap}", file.display())),
        Runner::UswapSigbusNoguard => uswap_run("sigbus,off", format!("ram:{swap}")),
        Runner::KernelZram => {
            let (c, ks, cg) = kernel(KernelDevice::Zram {
                bytes: swap,
                algorithm: None,
            })?;
            held = Some((ks, cg));
            c
        }
        Runner::KernelFile => {
            let (c, ks, cg) = kernel(KernelDevice::File {
                dir: a.swap_dir.clone(),
                bytes: swap,
            })?;
            held = Some((ks, cg));
            c
        }
    };
    for (k, v) in &a.env {
        cmd.env(k, v);
    }
    let (run, out, status) = timed(cmd)?;
    // The cgroup goes before the swap (drop order), the program gone.
    if let Some((ks, cg)) = held {
        drop(cg);
        drop(ks);
    }
    if !status.success() {
        bail!("{} under {}: {status}", a.program.join(" "), r.name());
    }
    Ok((run, out))
}

pub fn run(a: &ProgramArgs) -> Result<()> {
    if a.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    let swap = a.swap_size.unwrap_or(8 * a.budget);
    let kernel: Vec<_> = a
        .runner
        .iter()
        .filter_map(|r| match r {
            Runner::KernelZram => Some(KernelDevice::Zram {
                bytes: swap,
                algorithm: None,
            }),
            Runner::KernelFile => Some(KernelDevice::File {
                dir: a.swap_dir.clone(),
                bytes: swap,
            }),
            _ => None,
        })
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
            match &reference {
                None => reference = Some((r, out)),
                Some((first, want)) if *want != out => bail!(
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
    let reports: Vec<RunnerReport> = a
        .runner
        .iter()
        .zip(runs)
        .map(|(&runner, runs)| RunnerReport {
            runner,
            median_wall_s: median(runs.iter().map(|x| x.wall_s).collect()),
            vs_uswap: uswap_walls
                .as_ref()
                .map(|u| median(runs.iter().zip(u).map(|(x, u)| x.wall_s / u.max(1e-9)).collect())),
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
        "{:<18} {:>10} {:>9} {:>9} {:>9} {:>10}",
        "runner", "wall s", "vs uswap", "user s", "sys s", "peak MiB"
    );
    for r in &reports {
        let med = |f: &dyn Fn(&Run) -> f64| median(r.runs.iter().map(f).collect());
        println!(
            "{:<18} {:>10.2} {:>9} {:>9.2} {:>9.2} {:>10.1}",
            r.runner.name(),
            r.median_wall_s,
            r.vs_uswap.map_or("-".into(), |v| format!("{v:.2}x")),
            med(&|x| x.user_s),
            med(&|x| x.sys_s),
            med(&|x| x.peak_rss_mib),
        );
    }
    println!("(medians over rounds; vs uswap: median of the per-round ratio of wall times, above 1 is slower than uswap)");
    Ok(())
}
