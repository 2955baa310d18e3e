//! `uswap gdb` and `uswap gcore`: a debugger that sees all of a paged
//! program's memory.
//!
//! A debugger reads another process through `/proc/PID/mem`, ptrace or
//! `process_vm_readv`, each a read the kernel makes without waiting for a
//! fault to be served: a page uswap has out fails it (gdb's "Cannot access
//! memory at address", EIO), in either fault mode.  So these commands ask
//! the process, through its statistics block, to bring everything in and
//! keep it in (the budget held open: `Swap::hold_in`), run the debugger,
//! and withdraw the request when it ends; the process then goes back to
//! its budget.  A request whose reader died is dropped by the process at
//! its next look (100 ms).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use uswap::stats::{HoldRequest, MappedBlock};

#[derive(Args, Debug)]
pub struct GdbArgs {
    /// The process to attach to: one paged by uswap (`uswap stat` lists
    /// them).
    pub pid: i32,
    /// How long to wait for the process to bring its memory in.
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    pub wait: u64,
    /// Further arguments for gdb, after `--` (as `-batch -ex 'x/4gx ADDR'`).
    #[arg(last = true)]
    pub gdb_args: Vec<String>,
}

#[derive(Args, Debug)]
pub struct GcoreArgs {
    /// The process to dump: one paged by uswap.
    pub pid: i32,
    /// The core file's name is PREFIX.PID, as gcore's `-o`.
    #[arg(short = 'o', long, value_name = "PREFIX", default_value = "core")]
    pub output: String,
    /// How long to wait for the process to bring its memory in.
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    pub wait: u64,
}

pub fn gdb(a: &GdbArgs) -> Result<()> {
    let mut cmd = Command::new("gdb");
    cmd.arg("-p").arg(a.pid.to_string()).args(&a.gdb_args);
    with_memory_in(a.pid, a.wait, cmd)
}

pub fn gcore(a: &GcoreArgs) -> Result<()> {
    let mut cmd = Command::new("gcore");
    cmd.arg("-o").arg(&a.output).arg(a.pid.to_string());
    with_memory_in(a.pid, a.wait, cmd)
}

/// Run `cmd` while process `pid` holds its memory in; end as it does.
fn with_memory_in(pid: i32, wait: u64, mut cmd: Command) -> Result<()> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let (path, block) = find_block(pid)?;
    let stats = block.stats();
    let out = stats.gauges.swapped + stats.gauges.staged_now;
    let request = HoldRequest::ask(&path).with_context(|| {
        format!(
            "asking process {pid} to hold its memory in through {}",
            path.display()
        )
    })?;
    if out > 0 {
        eprintln!(
            "uswap: bringing {} MiB of process {pid} in while {program} runs",
            (out * uswap::PAGE_SIZE as u64) >> 20
        );
        let deadline = Instant::now() + Duration::from_secs(wait);
        while !request.met() {
            if Instant::now() >= deadline {
                bail!(
                    "process {pid} did not bring its memory in within {wait} s (its reclaimer has not started, or is stopped with the process): wait longer with --wait, or continue the process (kill -CONT {pid})"
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    // The debugger takes the terminal's interrupts (gdb stops the program
    // on ^C); this waits for it, and withdraws the request after.  An
    // ignored signal stays ignored across exec, so the debugger's child
    // sets them back to their defaults first.
    let status = {
        use std::os::unix::process::CommandExt;
        // SAFETY: `pre_exec`'s closure makes async-signal-safe calls only
        // (between fork and exec); the two `signal` calls change this
        // process's dispositions, which nothing else here relies on.
        unsafe {
            cmd.pre_exec(|| {
                libc::signal(libc::SIGINT, libc::SIG_DFL);
                libc::signal(libc::SIGQUIT, libc::SIG_DFL);
                Ok(())
            });
            libc::signal(libc::SIGINT, libc::SIG_IGN);
            libc::signal(libc::SIGQUIT, libc::SIG_IGN);
        }
        let s = cmd.status();
        drop(request);
        s
    };
    let status = match status {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("{program} not found: install gdb (as root: apt-get install gdb), then run this again")
        }
        Err(e) => return Err(e).with_context(|| format!("running {program}")),
    };
    std::process::exit(
        status
            .code()
            .unwrap_or(128 + std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0)),
    );
}

/// The statistics block of process `pid`: in this user's directory, or,
/// for root, in the directory of the process's own user.
fn find_block(pid: i32) -> Result<(PathBuf, MappedBlock)> {
    if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
        bail!("no process {pid}");
    }
    let mut dirs = vec![uswap::stats::live::directory()];
    if let Some(d) = directory_of(pid) {
        dirs.push(d);
    }
    for dir in &dirs {
        let Ok(rd) = std::fs::read_dir(dir) else {
            continue;
        };
        for ent in rd.flatten() {
            let path = ent.path();
            let name = ent.file_name().to_string_lossy().into_owned();
            if !(name.starts_with(&format!("{pid}-")) && name.ends_with(".stats")) {
                continue;
            }
            if let Ok(Some(b)) = MappedBlock::open(&path) {
                if b.identity().pid == pid {
                    return Ok((path, b));
                }
            }
        }
    }
    bail!(
        "process {pid} is not paged by uswap (no statistics block of it in {}): attach the debugger directly",
        dirs.iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(" or ")
    )
}

/// Where process `pid` publishes its block, as its own environment and
/// user name it (`live::directory_for`).
fn directory_of(pid: i32) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    let var = |name: &str| {
        env.split(|&b| b == 0).find_map(|kv| {
            kv.strip_prefix(format!("{name}=").as_bytes())
                .map(|v| std::ffi::OsStr::from_bytes(v).to_os_string())
        })
    };
    Some(uswap::stats::live::directory_for(var, uid))
}
