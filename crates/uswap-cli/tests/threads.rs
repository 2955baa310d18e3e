//! uswap's threads in a program's process: never the reason it lives on,
//! never there before they are needed, and never the cause of a lost
//! wake-up between the program's threads and processes.
//!
//! The programs are in `tests/programs/` (`ends.c`, `handoff.c`); each
//! runs in SIGBUS mode as an ordinary user (`nobody` when this is root)
//! and, where this user may, in handler-thread mode.

mod common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// Run `uswap run` in `mode` with a deadline: the output, or a panic that
/// names the program as hung (its process tree killed).
fn run_within(mode: Mode, args: &[&str], within: Duration) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    preload_built();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_uswap"));
    cmd.args(&args[..1])
        .args(["--mode", mode.name()])
        .args(&args[1..])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    if mode == Mode::Sigbus && root() {
        cmd.uid(NOBODY).gid(NOBODY);
    }
    let mut child = cmd.spawn().expect("run uswap");
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if start.elapsed() > within {
            // SAFETY: kills the test's own process group.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let out = child.wait_with_output().unwrap();
            panic!(
                "{mode:?} {args:?}: still running after {within:?}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A process ends when its program's last thread does (`programs/ends.c`):
/// a child forked from a thread other than main, whose one thread then
/// returns; a main thread that calls `pthread_exit` before its other
/// thread returns.  Each after 64 MiB went through a 16 MiB budget, so
/// that uswap's threads run.  Before, uswap's threads kept both alive
/// with a zombie leader, for ever (CPython's test_threading waited on the
/// first).
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at several times its budget: run in the release pass (CI runs both)"
)]
fn a_process_ends_with_its_programs_last_thread() {
    let dir = open_dir(false);
    let bin = compile("ends", dir.path());
    let bin = bin.to_str().unwrap();
    for mode in Mode::all() {
        for what in ["fork-from-thread", "main-exits"] {
            let out = run_within(
                mode,
                &[
                    "run", "--budget", "16M", "--swap", "ram:256M", "--", bin, what, "64",
                ],
                Duration::from_secs(60),
            );
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{mode:?} {what}: {:?} {text}", out.status);
            if what == "fork-from-thread" {
                assert_eq!(text, "child ended: status 0\n", "{mode:?}");
            }
        }
    }
}

/// A SIGTERM sent to a process whose main thread has ended (`ends term`:
/// its other thread waits in `pause`) ends it, as it would without
/// uswap: it stayed pending, every thread left blocking it.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at several times its budget: run in the release pass (CI runs both)"
)]
fn a_signal_to_the_process_reaches_the_programs_thread() {
    use std::os::unix::process::CommandExt;
    let dir = open_dir(false);
    let bin = compile("ends", dir.path());
    for mode in Mode::all() {
        preload_built();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_uswap"));
        cmd.args([
            "run",
            "--mode",
            mode.name(),
            "--budget",
            "16M",
            "--swap",
            "ram:256M",
            "--",
        ])
        .arg(&bin)
        .args(["term", "64"])
        .stdout(Stdio::piped())
        .process_group(0);
        if mode == Mode::Sigbus && root() {
            cmd.uid(NOBODY).gid(NOBODY);
        }
        let mut child = cmd.spawn().unwrap();
        let mut line = [0u8; 16];
        let n = child.stdout.as_mut().unwrap().read(&mut line).unwrap();
        let pid: i32 = String::from_utf8_lossy(&line[..n]).trim().parse().unwrap();
        // SAFETY: signals the program uswap run started.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        let start = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if start.elapsed() > Duration::from_secs(30) {
                // SAFETY: kills the test's own process group.
                unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
                panic!("{mode:?}: the SIGTERM did not end the process");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // uswap run ends as its program did: by SIGTERM.
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGTERM), "{mode:?}: {status:?}");
    }
}

/// uswap's threads, by name, in a Python process that allocates `mib` MiB.
fn uswap_threads_in_python(mode: Mode, budget: &str, mib: u32) -> Vec<String> {
    let script = format!(
        "import os\nkeep = [bytes(4096) for _ in range({mib} * 256)]\n\
         names = sorted(open(f'/proc/self/task/{{t}}/comm').read().strip() for t in os.listdir('/proc/self/task'))\n\
         print(' '.join(n for n in names if n.startswith('uswap-')))\n"
    );
    let out = uswap_in(
        mode,
        &["run", "--budget", budget, "--", PYTHON, "-c", &script],
        &[],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// A process that never nears its budget runs no thread of uswap's (in
/// SIGBUS mode; handler-thread mode has its one handler, which every fault
/// needs): CPython 3.12 warns at every `fork` of a process with more than
/// one thread, an error under `-W error`.  One that swaps has its
/// reclaimer.
#[test]
fn threads_start_when_first_needed() {
    for mode in Mode::all() {
        let idle = uswap_threads_in_python(mode, "512M", 8);
        let handlers: Vec<String> = match mode {
            Mode::Sigbus => vec![],
            Mode::Handler => vec!["uswap-fault".into()],
        };
        assert_eq!(
            idle, handlers,
            "{mode:?}: threads of a process far under its budget"
        );
        let busy = uswap_threads_in_python(mode, "32M", 128);
        assert!(
            busy.iter().any(|t| t == "uswap-reclaim"),
            "{mode:?}: no reclaimer in a process at four times its budget: {busy:?}"
        );
    }
}

/// A program that allocates its working set in one `malloc` and then only
/// touches it (`programs/upfront.c`) reaches no safe point after that
/// allocation, so the allocation starts the reclaimer, as it carries the
/// process past its budget (`uswap::pager::expect_growth`) when its swap
/// is on a disk.  Before, the need was found only by the faults, in a
/// signal handler where no thread can start, and every page went out by
/// a fault's own reclaim: xz -9 at 24 MiB on a swap file wrote each batch
/// synchronously, 1.8x the kernel's time.  Every page reads back what its
/// last pass wrote.
#[test]
fn a_program_that_allocates_up_front_gets_its_reclaimer() {
    // World-writable: in SIGBUS mode as root the program runs as nobody,
    // and its swap file is made in here.
    let dir = open_dir(true);
    let bin = compile("upfront", dir.path());
    for mode in Mode::all() {
        let swap = format!(
            "file:{}:256M",
            dir.path().join(format!("swap-{mode:?}")).display()
        );
        let out = uswap_in(
            mode,
            &[
                "run",
                "--budget",
                "16M",
                "--swap",
                &swap,
                "--",
                bin.to_str().unwrap(),
                "64",
                "2",
            ],
            &[],
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.starts_with("ok 16384"),
            "{mode:?}: {:?} {text} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            text.split_whitespace().any(|t| t == "uswap-reclaim"),
            "{mode:?}: no reclaimer in a process that allocated four times its budget at once: {text}"
        );
    }
}

/// Hand-offs between threads and between forked processes
/// (`programs/handoff.c`: semaphores, condition variables, raw futex
/// words, pipes, a fork pair, timed waits, every word and buffer in the
/// heap), 3000 round trips per pair, 18,000 in all, with the heap
/// churned through a budget a third its size and both CPUs busy, under
/// the system-call guard: none stops.  A pair that stops for 20 s is
/// reported with every thread's stack (gdb attached from outside).
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at several times its budget: run in the release pass (CI runs both)"
)]
fn hand_offs_between_threads_and_processes_never_stop() {
    let dir = open_dir(false);
    let bin = compile("handoff", dir.path());
    let bin = bin.to_str().unwrap();
    let dump = "gdb -batch -p %d -ex 'thread apply all bt' >&2";
    for mode in Mode::all() {
        let out = run_within(
            mode,
            &[
                "run",
                "--budget",
                "24M",
                "--swap",
                "ram:256M",
                "--",
                "env",
                &format!("HANDOFF_DUMP={dump}"),
                bin,
                "3000",
                "64",
            ],
            Duration::from_secs(600),
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{mode:?}: {:?}\n{text}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("handoffs 18000"), "{mode:?}: {text}");
    }
}
