//! Debuggers and core files see all of a paged program's memory
//! (docs/DESIGN.md, "Readers the fault path never sees").
//!
//! Python holds 300,000 objects, each a bytes object that begins with
//! its index (`OBJ0123456`), 70 MB at a 16 MiB budget: most are out.
//! gdb attached plainly cannot read them ("Cannot access memory"); under
//! `uswap gdb` it reads every one; `uswap gcore` writes a core file that
//! holds every one; and the core file the kernel writes for the program
//! killed by SIGSEGV or SIGABRT holds every one.

mod common;

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use common::*;

const OBJECTS: usize = 300_000;

/// The program: its objects, then (with `wait`) the addresses of every
/// thousandth object's bytes, after touching 100 MB of other memory so
/// that they go out, and a wait; or a signal that dumps core.
const HOLDER: &str = r#"
import os, sys, time
objs = [b"OBJ%07d" % i + bytes(200) for i in range(300_000)]
if sys.argv[1] == "wait":
    addrs = " ".join(hex(id(objs[i]) + 32) for i in range(0, 300_000, 1000))
    junk = [bytes([i % 251]) * 1000 for i in range(100_000)]
    print(os.getpid(), addrs, flush=True)
    time.sleep(600)
elif sys.argv[1] == "segv":
    os.kill(os.getpid(), 11)
else:
    os.abort()
"#;

/// `uswap run` of the program in `mode`, in `dir`, through `sh -c` with
/// `ulimit -c unlimited` (a core file wanted).
fn holder(mode: Mode, dir: &Path, how: &str) -> Command {
    use std::os::unix::process::CommandExt;
    preload_built();
    std::fs::write(dir.join("holder.py"), HOLDER).unwrap();
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!(
            "ulimit -c unlimited; exec {} run --mode {} --budget 16M -- {PYTHON} holder.py {how}",
            env!("CARGO_BIN_EXE_uswap"),
            mode.name()
        ))
        .current_dir(dir);
    if mode == Mode::Sigbus && root() {
        cmd.uid(NOBODY).gid(NOBODY);
    }
    cmd
}

/// A running holder: its pid and the addresses it printed.
struct Running {
    child: Child,
    pid: i32,
    addrs: Vec<String>,
}

impl Running {
    fn start(mode: Mode, dir: &Path) -> Running {
        let mut child = holder(mode, dir, "wait").stdout(Stdio::piped()).spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let mut words = line.split_whitespace();
        let pid = words.next().expect("the holder's pid").parse().unwrap();
        let addrs: Vec<String> = words.map(String::from).collect();
        assert_eq!(addrs.len(), OBJECTS / 1000, "{line}");
        Running { child, pid, addrs }
    }

    /// gdb's `x/s` of every address, through `uswap gdb` or plainly: how
    /// many objects it read, in order.
    fn read_with_gdb(&self, mode: Mode, through_uswap: bool) -> usize {
        use std::os::unix::process::CommandExt;
        let mut cmd = if through_uswap {
            let mut c = Command::new(env!("CARGO_BIN_EXE_uswap"));
            c.args(["gdb", &self.pid.to_string(), "--", "-batch"]);
            c
        } else {
            let mut c = Command::new("gdb");
            c.args(["-p", &self.pid.to_string(), "-batch"]);
            c
        };
        for a in &self.addrs {
            cmd.args(["-ex", &format!("x/s {a}")]);
        }
        if mode == Mode::Sigbus && root() {
            cmd.uid(NOBODY).gid(NOBODY);
        }
        let out = cmd.output().expect("gdb (the check script installs it)");
        let text = String::from_utf8_lossy(&out.stdout);
        (0..self.addrs.len())
            .filter(|i| text.contains(&format!("\"OBJ{:07}\"", i * 1000)))
            .count()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(self.pid, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

/// The distinct objects a core file holds, read in its data (a core file
/// of a process with a heap region of tens of GiB is sparse: its holes
/// are skipped with SEEK_DATA and SEEK_HOLE).
fn objects_in(core: &Path) -> usize {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(core).unwrap();
    let size = f.metadata().unwrap().len() as i64;
    let mut seen = HashSet::new();
    let mut off = 0i64;
    let mut buf = vec![0u8; 64 << 20];
    while off < size {
        // SAFETY: lseek on a descriptor of ours.
        let data = unsafe { libc::lseek(f.as_raw_fd(), off, libc::SEEK_DATA) };
        if data < 0 {
            break;
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(f.as_raw_fd(), data, libc::SEEK_HOLE) };
        let mut at = data;
        while at < hole {
            let n = ((hole - at) as usize).min(buf.len() - 16);
            let got = f.read_at(&mut buf[..n + 16], at as u64).unwrap();
            let b = &buf[..got];
            let mut i = 0;
            while let Some(p) = b[i..].windows(3).position(|w| w == b"OBJ") {
                let s = i + p + 3;
                if s + 7 <= b.len() && b[s..s + 7].iter().all(u8::is_ascii_digit) {
                    seen.insert(std::str::from_utf8(&b[s..s + 7]).unwrap().to_string());
                }
                i = s;
            }
            at += n as i64;
        }
        off = hole;
    }
    seen.len()
}

/// gdb attached to the running program reads a swapped-out object under
/// `uswap gdb`, every one of them, where plainly it reads almost none;
/// afterwards the process is back under its budget.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at 4x its budget: run in the release pass (CI runs both)"
)]
fn gdb_reads_swapped_objects_through_uswap_gdb() {
    for mode in Mode::all() {
        let dir = open_dir(true);
        let r = Running::start(mode, dir.path());
        let plain = r.read_with_gdb(mode, false);
        assert!(
            plain < r.addrs.len() / 2,
            "{mode:?}: plain gdb read {plain} swapped objects"
        );
        let held = r.read_with_gdb(mode, true);
        assert_eq!(held, r.addrs.len(), "{mode:?}: uswap gdb read {held}");
        // Let go: the reclaimer takes the process back to its budget (the
        // held memory was 90 MB).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let status = std::fs::read_to_string(format!("/proc/{}/status", r.pid)).unwrap();
            let kib: u64 = status
                .lines()
                .find_map(|l| l.strip_prefix("RssAnon:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|n| n.parse().ok())
                .expect("RssAnon in /proc/PID/status");
            if kib <= 40 << 10 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{mode:?}: {kib} KiB anonymous after uswap gdb"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        eprintln!(
            "{mode:?}: plain gdb read {plain} of {}, uswap gdb all",
            r.addrs.len()
        );
    }
}

/// `uswap gcore` of the running program: a core file with every object.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at 4x its budget: run in the release pass (CI runs both)"
)]
fn uswap_gcore_holds_every_object() {
    for mode in Mode::all() {
        let dir = open_dir(true);
        let r = Running::start(mode, dir.path());
        let prefix = dir.path().join("gcore");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_uswap"));
        cmd.args(["gcore", "-o", prefix.to_str().unwrap(), &r.pid.to_string()]);
        if mode == Mode::Sigbus && root() {
            use std::os::unix::process::CommandExt;
            cmd.uid(NOBODY).gid(NOBODY);
        }
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{mode:?}: {err}");
        let core = dir.path().join(format!("gcore.{}", r.pid));
        assert_eq!(objects_in(&core), OBJECTS, "{mode:?}: {err}");
    }
}

/// The program killed by SIGSEGV (sent) and by SIGABRT (`abort`): the
/// kernel's core file holds every object, in both modes.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at 4x its budget: run in the release pass (CI runs both)"
)]
fn the_core_file_of_a_killed_program_holds_every_object() {
    let pattern = std::fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap_or_default();
    if pattern.starts_with('|') || pattern.contains('/') {
        // The core goes to a program (systemd-coredump, apport) or a
        // directory of the machine's: not a file this test can find.
        eprintln!("NOT RUN: kernel.core_pattern is {pattern:?}, not a file name in the working directory");
        return;
    }
    for mode in Mode::all() {
        for (how, sig) in [("segv", libc::SIGSEGV), ("abort", libc::SIGABRT)] {
            let dir = open_dir(true);
            let out = holder(mode, dir.path(), how).output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            // `sh` exec'ed `uswap run`, which ends as the program did (and
            // leaves no core file of its own).
            assert_eq!(
                std::os::unix::process::ExitStatusExt::signal(&out.status),
                Some(sig),
                "{mode:?} {how}: {:?}: {err}",
                out.status
            );
            let core = std::fs::read_dir(dir.path())
                .unwrap()
                .flatten()
                .map(|e| e.path())
                .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("core"))
                .unwrap_or_else(|| panic!("{mode:?} {how}: no core file in {}: {err}", dir.path().display()));
            assert_eq!(objects_in(&core), OBJECTS, "{mode:?} {how}: {err}");
        }
    }
}
