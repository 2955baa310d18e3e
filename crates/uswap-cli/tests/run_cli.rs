//! `uswap run`: unmodified programs with their malloc heap paged by uswap,
//! their output compared with a run without it.  Handler-thread mode (the
//! default) needs the privilege for kernel faults: these run as root, as
//! the suite does; as an ordinary user they check the one-line refusal.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const PYTHON: &str = "/usr/bin/python3";

/// The preload library beside the `uswap` under test, built (or found up
/// to date) once per test binary: `cargo test` builds the command line and
/// the library's test harness, not the library itself, and a stale one
/// left by an earlier build would test old code.
fn preload_built() {
    static BUILT: std::sync::Once = std::sync::Once::new();
    BUILT.call_once(|| {
        let exe = PathBuf::from(env!("CARGO_BIN_EXE_uswap"));
        let release = exe.parent().is_some_and(|d| d.ends_with("release"));
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-p", "uswap-preload"]);
        if release {
            cmd.arg("--release");
        }
        let out = cmd.output().expect("run cargo");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let lib = exe.with_file_name("libuswap_preload.so");
        assert!(lib.exists(), "{} after the build", lib.display());
    });
}

fn uswap(args: &[&str], env: &[(&str, &str)]) -> Output {
    preload_built();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_uswap"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run uswap")
}

fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A count from the `--stats` block, e.g. `swap-ins 123`.
fn stat(err: &str, name: &str) -> u64 {
    err.split(&format!("{name} "))
        .nth(1)
        .and_then(|r| r.split([',', ')', ';', ' ', '\n']).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {err}"))
}

const DICT: &str = r#"
import hashlib, sys
n = int(sys.argv[1])
d = {}
for i in range(n):
    d[i] = ("%d-" % i) * 20
h = hashlib.sha256()
for i in range(n):
    h.update(d[i].encode())
print(h.hexdigest(), len(d))
"#;

/// Python building a dict of about four times the budget, then a digest of
/// it: the same as without uswap, and the memory really went out and came
/// back, both ways Python allocates: its small-object arenas, which it
/// maps itself (`mmap`, served from the paged heap), and with
/// `PYTHONMALLOC=malloc`, malloc.
#[test]
fn python_builds_a_dict_four_times_the_budget() {
    if !root() {
        assert!(refused_without_privilege());
        return;
    }
    assert!(
        Path::new(PYTHON).exists(),
        "{PYTHON} is missing: install Debian's python3 (scripts/check does)"
    );
    let n = "400000";
    let plain = Command::new(PYTHON).args(["-c", DICT, n]).output().unwrap();
    assert!(plain.status.success());
    for allocator in ["pymalloc", "malloc"] {
        let out = uswap(
            &[
                "run", "--budget", "24M", "--swap", "ram:256M", "--stats", "--", PYTHON, "-c", DICT, n,
            ],
            &[("PYTHONMALLOC", allocator)],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{allocator}: {err}");
        assert_eq!(out.stdout, plain.stdout, "{allocator}: {err}");
        assert!(
            stat(&err, "swap-ins") + stat(&err, "pages read ahead") > 5000,
            "{allocator}: {err}"
        );
        assert!(stat(&err, "evictions") > 10000, "{allocator}: {err}");
        assert_eq!(stat(&err, "over budget"), 0, "{allocator}: {err}");
    }
}

/// Compile `tests/programs/NAME.c` into `dir`.
fn compile(name: &str, dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/programs")
        .join(format!("{name}.c"));
    let bin = dir.join(name);
    let cc = Command::new("cc")
        .args(["-O1", "-pthread", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .expect("cc (a C compiler builds mimalloc too)");
    assert!(cc.status.success(), "{}", String::from_utf8_lossy(&cc.stderr));
    bin
}

/// Run compiled program `name` with `args`, plainly and under `uswap run`
/// with `budget`, a 256 MiB RAM swap device and `options`: both succeed
/// with the same output, and under uswap at least `evictions` pages went
/// out.
fn same_under_uswap(name: &str, args: &[&str], budget: &str, options: &[&str], evictions: u64) {
    let dir = tempfile::tempdir().unwrap();
    let bin = compile(name, dir.path());
    let bin = bin.to_str().unwrap();
    let plain = Command::new(bin).args(args).output().unwrap();
    assert!(
        plain.status.success(),
        "{name} plain: {}",
        String::from_utf8_lossy(&plain.stderr)
    );
    let mut run = vec!["run", "--budget", budget, "--swap", "ram:256M", "--stats"];
    run.extend_from_slice(options);
    run.extend_from_slice(&["--", bin]);
    run.extend_from_slice(args);
    let out = uswap(&run, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{name}: exit {:?}: {err}",
        out.status.code()
    );
    assert_eq!(out.stdout, plain.stdout, "{name}: {err}");
    assert!(
        stat(&err, "evictions") > evictions,
        "{name}: too little went out: {err}"
    );
}

/// A C program's own anonymous mappings, four times the budget
/// (`programs/maps.c`): fresh ones read as zeros, written data reads back
/// after going out, `madvise(MADV_DONTNEED)` zeroes, `mremap` grows
/// (moving) with the contents kept and the new tail zero, `munmap` in
/// pieces, and a new mapping reads as zeros again.
#[test]
fn a_programs_own_mappings_are_paged() {
    if !root() {
        assert!(refused_without_privilege());
        return;
    }
    same_under_uswap("maps", &["32"], "8M", &[], 8000);
}

/// Four threads, started after uswap, each allocating, writing, checking,
/// freeing and reallocating 16 MiB of small blocks under a 16 MiB budget
/// (`programs/threads.c`).
#[test]
fn threads_allocate_four_times_the_budget() {
    if !root() {
        assert!(refused_without_privilege());
        return;
    }
    same_under_uswap("threads", &["16"], "16M", &[], 20000);
}

/// In SIGBUS mode, a thread that blocks SIGBUS could not have a page of
/// the heap served (the kernel ends the process at its first fault): its
/// blocks come from glibc's allocator, outside the paged heap, as do
/// those of uswap's own threads, which block every signal.  The other
/// three threads' blocks are paged.  As any user: SIGBUS mode needs no
/// privilege.
#[test]
fn a_thread_blocking_sigbus_allocates_outside_the_heap() {
    same_under_uswap(
        "threads",
        &["16", "block-sigbus"],
        "16M",
        &["--mode", "sigbus"],
        10000,
    );
}

/// The kernel touching swapped-out heap memory (`programs/kernel_io.c`):
/// `read(2)` into a buffer that is out, `send(2)` from one that is out
/// through a socket pair (to a forked child that touches no heap), and the
/// program's own SIGBUS handler, which still gets the program's SIGBUS.
/// Handler-thread mode serves the kernel's faults.
#[test]
fn the_kernel_reads_and_writes_swapped_out_buffers() {
    if !root() {
        assert!(refused_without_privilege());
        return;
    }
    same_under_uswap("kernel_io", &["8"], "8M", &[], 8000);
}

/// GNU sort of a file three times the budget, its buffer (-S) as large as
/// the file, reading it with read(2) into a heap buffer that may be out
/// (the kernel's fault, served by a handler thread): the output is the
/// same as without uswap.  The default swap device, a file in $TMPDIR,
/// leaves nothing behind.
#[test]
fn sort_of_a_file_three_times_the_budget() {
    if !root() {
        assert!(refused_without_privilege());
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.txt");
    let mut text = String::new();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    while text.len() < 12 << 20 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        text.push_str(&format!("{x:x} line\n"));
    }
    std::fs::write(&input, &text).unwrap();
    let input = input.to_str().unwrap();
    let plain = Command::new("sort")
        .args(["-S", "12M", input])
        .env("LC_ALL", "C")
        .output()
        .unwrap();
    assert!(plain.status.success());
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let out = uswap(
        &[
            "run", "--budget", "4M", "--stats", "--", "sort", "-S", "12M", input,
        ],
        &[("LC_ALL", "C"), ("TMPDIR", tmp.to_str().unwrap())],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        out.stdout == plain.stdout,
        "sort's output differs under uswap: {err}"
    );
    assert!(stat(&err, "evictions") > 1000, "{err}");
    assert_eq!(
        std::fs::read_dir(&tmp).unwrap().count(),
        0,
        "the default swap file was left in $TMPDIR"
    );
}

/// Handler-thread mode without the privilege for kernel faults: refused,
/// in one line that says what to do.  Checked as this user, or as
/// `nobody` when this is root.
fn refused_without_privilege() -> bool {
    use std::os::unix::process::CommandExt;
    preload_built();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_uswap"));
    if root() {
        cmd.uid(65534).gid(65534);
    }
    let sysctl = std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd").unwrap_or_default();
    if sysctl.trim() == "1" {
        return true;
    }
    let out = cmd
        .args(["run", "--budget", "8M", "--swap", "ram:32M", "--", "true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("uswap run:") && err.contains("handler-thread mode"),
        "{err}"
    );
    true
}

#[test]
fn an_ordinary_user_is_told_what_handler_mode_needs() {
    assert!(refused_without_privilege());
}

/// SIGBUS mode starts for any user (a user-mode-only userfaultfd when
/// there is no privilege for more), and says in one line what it cannot
/// do yet.  As `nobody` when this is root.
#[test]
fn sigbus_mode_runs_as_any_user_and_says_its_limit() {
    use std::os::unix::process::CommandExt;
    preload_built();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_uswap"));
    if root() {
        cmd.uid(65534).gid(65534);
    }
    let out = cmd
        .args([
            "run", "--mode", "sigbus", "--budget", "8M", "--swap", "ram:32M", "--stats", "--", "true",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {err}", out.status);
    assert!(
        err.contains("SIGBUS mode: a system call given a heap buffer"),
        "{err}"
    );
    // The preload started (its statistics at exit), in SIGBUS mode.
    assert!(
        err.contains("uswap run: budget 8 MiB") && err.contains("SIGBUS mode"),
        "{err}"
    );
}

/// Bad input: one line each, saying what is wrong.
#[test]
fn bad_input_gets_one_line() {
    for (args, says) in [
        (&["run", "--budget", "7%x", "--", "true"][..], "--budget"),
        (&["run", "--budget", "100K", "--", "true"], "at least 1M"),
        (
            &["run", "--swap", "disk:1G", "--", "true"],
            "ram:SIZE or file:PATH:SIZE",
        ),
        (
            &["run", "--swap", "ram:8M", "--", "/nonexistent/program"],
            "running /nonexistent/program",
        ),
    ] {
        let out = uswap(args, &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
