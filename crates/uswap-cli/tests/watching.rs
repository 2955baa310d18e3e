//! Watching programs while they run: `uswap stat` (text, JSON and
//! Prometheus's exposition format, read by the Prometheus project's own
//! parser) and `uswap top` (driven in tmux as a person would), on real
//! programs under `uswap run`; stale entries of killed programs; and the
//! statistics of another user's program kept from this one.
//!
//! Each test publishes into a directory of its own (`USWAP_RUNTIME_DIR`),
//! so that tests running side by side do not see each other's programs.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// A Python program that fills MIB MiB in 1 MiB buffers, then keeps
/// touching pages of them at random until STOP exists or SECONDS pass.
const HOG: &str = r#"
import os, random, sys, time
mib, seconds, stop = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
bufs = [bytearray(os.urandom(64) * (1 << 14)) for _ in range(mib)]
end = time.time() + seconds
i = 0
while time.time() < end and not os.path.exists(stop):
    for _ in range(2000):
        b = bufs[random.randrange(mib)]
        j = random.randrange(1 << 20)
        b[j] = (b[j] + 1) & 255
    i += 1
print("done", i)
"#;

const PAGE: u64 = 4096;

/// A place for one test: its statistics directory (made by the paged
/// program), its Python program, its stop file.
struct Scene {
    /// Open to `nobody` too (the other-user test runs the program so).
    dir: tempfile::TempDir,
}

impl Scene {
    fn new() -> Scene {
        let dir = open_dir(true);
        std::fs::write(dir.path().join("hog.py"), HOG).unwrap();
        Scene { dir }
    }

    fn stats_dir(&self) -> PathBuf {
        self.dir.path().join("stats")
    }

    fn hog(&self) -> String {
        self.dir.path().join("hog.py").display().to_string()
    }

    fn stop_file(&self) -> String {
        self.dir.path().join("stop").display().to_string()
    }

    /// `uswap run` of `program` in the background, publishing here.
    fn start(&self, run_args: &[&str], program: &[&str], as_nobody: bool) -> Child {
        use std::os::unix::process::CommandExt;
        preload_built();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_uswap"));
        cmd.arg("run")
            .args(run_args)
            .arg("--")
            .args(program)
            .env("USWAP_RUNTIME_DIR", self.stats_dir())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if as_nobody {
            cmd.uid(NOBODY).gid(NOBODY);
        }
        cmd.spawn().expect("start uswap run")
    }

    /// `uswap ARGS` reading this scene's statistics.
    fn uswap(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_uswap"))
            .args(args)
            .env("USWAP_RUNTIME_DIR", self.stats_dir())
            .output()
            .expect("run uswap")
    }

    fn stat_json(&self) -> Value {
        let out = self.uswap(&["stat", "--json"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("uswap stat --json gives JSON")
    }

    /// Poll `uswap stat --json` until `ready` holds of it, for at most
    /// `secs` seconds.
    fn wait_until(&self, secs: u64, what: &str, ready: impl Fn(&Value) -> bool) -> Value {
        let until = Instant::now() + Duration::from_secs(secs);
        loop {
            let v = self.stat_json();
            if ready(&v) {
                return v;
            }
            assert!(Instant::now() < until, "{what} within {secs} s; last read: {v:#}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Stop the program and check it ended well, leaving no statistics
    /// behind.
    fn finish(&self, child: Child) {
        std::fs::write(self.stop_file(), b"").unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let left: Vec<_> = std::fs::read_dir(self.stats_dir())
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        assert!(
            left.is_empty(),
            "statistics left after the program ended: {left:?}"
        );
    }
}

fn processes(v: &Value) -> Vec<&Value> {
    v.as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["processes"].as_array().unwrap())
        .collect()
}

fn sum(v: &Value, section: &str, key: &str) -> u64 {
    processes(v)
        .iter()
        .map(|p| {
            p["stats"][section][key]
                .as_u64()
                .unwrap_or_else(|| panic!("{section}.{key} in {p}"))
        })
        .sum()
}

/// Paging at work: faults and evictions counted in every process listed.
fn paging(v: &Value, members: usize) -> bool {
    let ps = processes(v);
    ps.len() == members
        && ps.iter().all(|p| {
            p["stats"]["counters"]["faults"].as_u64() > Some(0)
                && p["stats"]["counters"]["evictions"].as_u64() > Some(0)
        })
}

/// `uswap stat --json` on a program three times its budget, read twice:
/// resident within the budget, counters growing, every section there;
/// the text block as memory.stat lays it out; `--prometheus` read by the
/// Prometheus project's parser with every metric typed; and at the
/// program's end, nothing left in the directory.
#[test]
fn stat_reads_a_running_program() {
    let s = Scene::new();
    let budget: u64 = 128 << 20;
    let json_out = s.dir.path().join("at-exit.json");
    let child = s.start(
        &["--budget", "128M", "--stats-json", json_out.to_str().unwrap()],
        &[PYTHON, &s.hog(), "384", "120", &s.stop_file()],
        false,
    );
    let a = s.wait_until(120, "the program paging", |v| {
        paging(v, 1) && sum(v, "gauges", "swapped") > 0
    });
    std::thread::sleep(Duration::from_millis(1500));
    let b = s.stat_json();
    let g = &b[0];
    assert_eq!(g["tree"], true, "{g}");
    assert!(g["command"].as_str().unwrap().contains("hog.py"), "{g}");
    let p = &g["processes"][0];
    let gauges = &p["stats"]["gauges"];
    let resident = gauges["resident"].as_u64().unwrap() * PAGE;
    // Within the budget and its overrun (10% by default).
    assert!(
        resident <= budget + budget / 10,
        "resident {resident} over budget {budget}: {gauges}"
    );
    assert_eq!(gauges["budget"].as_u64().unwrap() * PAGE, budget);
    assert!(gauges["swapped"].as_u64().unwrap() * PAGE > 64 << 20, "{gauges}");
    for key in ["faults", "evictions", "swapins"] {
        assert!(
            sum(&b, "counters", key) > sum(&a, "counters", key),
            "{key} did not grow: {a} then {b}"
        );
    }
    let st = &p["stats"];
    assert!(st["pressure"]["some"]["total_us"].as_u64() > Some(0), "{st}");
    let latency: u64 = st["fault_latency"]["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert!(latency > 0, "{st}");
    assert_eq!(st["devices"][0]["kind"], "file", "{st}");
    assert!(st["devices"][0]["used"].as_u64() > Some(0), "{st}");

    // Text: key value lines, pressure and events as the kernel's files.
    let out = s.uswap(&["stat"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains(&format!("\nbudget {budget}\n")), "{text}");
    for key in [
        "resident ",
        "swapped_dev0_file ",
        "faults_swapin ",
        "some avg10=",
        "full avg10=",
        "oom_kill 0",
    ] {
        assert!(text.contains(key), "{key:?} in {text}");
    }
    // By pid: the program's own block.
    let pid = p["pid"].as_i64().unwrap().to_string();
    let one = s.uswap(&["stat", &pid, "--json"]);
    assert!(one.status.success(), "{}", String::from_utf8_lossy(&one.stderr));

    let prom = s.uswap(&["stat", "--prometheus"]);
    assert!(prom.status.success());
    let parsed = parse_exposition(&prom.stdout);
    assert_eq!(
        parsed["untyped"],
        serde_json::json!([]),
        "metrics without a type: {parsed}"
    );
    assert!(parsed["families"].as_u64() > Some(50), "{parsed}");
    let faults = parsed["faults_total"].as_f64().unwrap();
    assert!(faults >= sum(&b, "counters", "faults") as f64, "{parsed}");
    assert!(parsed["histogram_count"].as_f64() > Some(0.0), "{parsed}");

    s.finish(child);
    // `--stats-json`: the program's statistics at its exit, the same
    // fields, and at least what was read while it ran.
    let at_exit: Value = serde_json::from_slice(&std::fs::read(&json_out).unwrap()).unwrap();
    assert_eq!(at_exit["pid"].as_i64(), p["pid"].as_i64(), "{at_exit}");
    assert_eq!(at_exit["budget_bytes"].as_u64(), Some(budget));
    let faults = at_exit["stats"]["counters"]["faults"].as_u64().unwrap();
    assert!(faults >= sum(&b, "counters", "faults"), "{at_exit}");
}

/// The exposition parsed by `prometheus_client` (the Prometheus project's
/// Python client), summarized: families, those without a known type, the
/// faults counter and the latency histogram's count.
fn parse_exposition(text: &[u8]) -> Value {
    const PARSE: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
fams = list(text_string_to_metric_families(sys.stdin.read()))
out = {"families": len(fams), "untyped": [f.name for f in fams if f.type not in ("counter", "gauge", "histogram")]}
for f in fams:
    for s in f.samples:
        if s.name == "uswap_faults_total":
            out["faults_total"] = out.get("faults_total", 0) + s.value
        if s.name == "uswap_fault_latency_seconds_count":
            out["histogram_count"] = out.get("histogram_count", 0) + s.value
print(json.dumps(out))
"#;
    let have = Command::new(PYTHON)
        .args(["-c", "import prometheus_client"])
        .status()
        .is_ok_and(|s| s.success());
    if !have && root() {
        let _ = Command::new("apt-get")
            .args([
                "install",
                "-y",
                "-qq",
                "--no-install-recommends",
                "python3-prometheus-client",
            ])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status();
    }
    use std::io::Write;
    let mut child = Command::new(PYTHON)
        .args(["-c", PARSE])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(text).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the Prometheus parser refused the exposition (python3-prometheus-client is needed; scripts/check installs it): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A shell and two Python programs it starts, under one budget: one
/// group with a row per process, their parents as they are, resident
/// together within the budget, and counters growing.
#[test]
fn a_tree_of_three_is_one_group() {
    let s = Scene::new();
    let budget: u64 = 128 << 20;
    let script = format!(
        "{py} {hog} 128 120 {stop} & {py} {hog} 128 120 {stop} & wait",
        py = PYTHON,
        hog = s.hog(),
        stop = s.stop_file()
    );
    let child = s.start(&["--budget", "128M"], &["/bin/sh", "-c", &script], false);
    let supervisor = child.id() as i64;
    let a = s.wait_until(120, "three processes paging", |v| {
        processes(v).len() == 3
            && processes(v)
                .iter()
                .filter(|p| p["stats"]["counters"]["evictions"].as_u64() > Some(0))
                .count()
                >= 2
    });
    std::thread::sleep(Duration::from_millis(1500));
    let b = s.stat_json();
    let groups = b.as_array().unwrap();
    assert_eq!(groups.len(), 1, "{b:#}");
    assert_eq!(groups[0]["group"].as_i64(), Some(supervisor));
    let ps = processes(&b);
    let shell = ps
        .iter()
        .find(|p| p["parent"].as_i64() == Some(supervisor))
        .expect("the shell, the supervisor's child");
    let shell_pid = shell["pid"].as_i64();
    let pythons = ps.iter().filter(|p| p["parent"].as_i64() == shell_pid).count();
    assert_eq!(pythons, 2, "{b:#}");
    let resident = sum(&b, "gauges", "resident") * PAGE;
    // The tree's budget, its overrun and the domain's slack (16 MiB).
    assert!(
        resident <= budget + budget / 10 + (16 << 20),
        "resident {resident}: {b:#}"
    );
    for key in ["faults", "evictions"] {
        assert!(
            sum(&b, "counters", key) > sum(&a, "counters", key),
            "{key} did not grow"
        );
    }
    let out = s.uswap(&["stat"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("3 processes"), "{text}");
    let rows = text
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains("hog.py 128"))
        .count();
    assert_eq!(rows, 3, "the shell's and two Pythons' rows: {text}");
    s.finish(child);
}

/// `uswap run` killed outright (SIGKILL; its program goes with it): the
/// files nobody removed are not listed, and the first reader removes them.
#[test]
fn stale_entries_of_a_killed_program_are_ignored_and_removed() {
    let s = Scene::new();
    let child = s.start(
        &["--budget", "64M"],
        &[PYTHON, &s.hog(), "128", "120", &s.stop_file()],
        false,
    );
    let v = s.wait_until(120, "the program paging", |v| paging(v, 1));
    let pid = processes(&v)[0]["pid"].as_i64().unwrap() as i32;
    let files = || -> Vec<PathBuf> {
        std::fs::read_dir(s.stats_dir())
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect()
    };
    // Its statistics, and its supervisor's control socket (`uswap ctl`).
    assert_eq!(files().len(), 2, "{:?}", files());
    // SAFETY: kills the supervisor we started; its child dies with it
    // (PR_SET_PDEATHSIG).
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait_with_output();
    let until = Instant::now() + Duration::from_secs(10);
    while Path::new(&format!("/proc/{pid}")).exists() {
        assert!(Instant::now() < until, "the program outlived its supervisor");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        files().len(),
        2,
        "a killed program cannot remove its files: {:?}",
        files()
    );
    assert_eq!(s.stat_json(), serde_json::json!([]));
    assert!(
        files().is_empty(),
        "the reader removes the stale files: {:?}",
        files()
    );
    // A file that is not a block, in a directory of this user's, is left
    // alone and not listed.
    std::fs::write(s.stats_dir().join("notes.txt"), b"mine").unwrap();
    assert_eq!(s.stat_json(), serde_json::json!([]));
    assert!(s.stats_dir().join("notes.txt").exists());
}

/// A program of `nobody`'s publishes in a directory only `nobody` may
/// open: `nobody` reads it; root is refused it (not `nobody`'s directory
/// to trust), and so is another ordinary user (not theirs to open); asked
/// by pid, `uswap stat` says whose it is.
#[test]
fn another_users_program_is_not_readable() {
    if !root() {
        eprintln!("needs root to run programs as other users; CI runs as root");
        return;
    }
    let s = Scene::new();
    let child = s.start(
        &["--mode", "sigbus", "--budget", "64M"],
        &[PYTHON, &s.hog(), "128", "120", &s.stop_file()],
        true,
    );
    let as_user = |uid: u32, args: &[&str]| {
        use std::os::unix::process::CommandExt;
        Command::new(env!("CARGO_BIN_EXE_uswap"))
            .args(args)
            .env("USWAP_RUNTIME_DIR", s.stats_dir())
            .uid(uid)
            .gid(uid)
            .output()
            .unwrap()
    };
    // Its own user reads it.
    let until = Instant::now() + Duration::from_secs(120);
    let pid = loop {
        let out = as_user(NOBODY, &["stat", "--json"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        if paging(&v, 1) {
            assert_eq!(processes(&v)[0]["mode"], "sigbus-user");
            break processes(&v)[0]["pid"].as_i64().unwrap();
        }
        assert!(Instant::now() < until, "nobody's program paging: {v}");
        std::thread::sleep(Duration::from_millis(200));
    };
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(s.stats_dir()).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o777), (NOBODY, 0o700));
    // Root: refused, in one line naming the owner.
    let out = s.uswap(&["stat"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("owned by user 65534"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    // Another ordinary user (daemon, uid 1): refused too, and could not
    // open it if it tried (mode 0700).
    let out = as_user(1, &["stat", "--json"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("owned by user 65534"),
        "{err}"
    );
    // By pid, from root's own directory: whose it is.
    let out = Command::new(env!("CARGO_BIN_EXE_uswap"))
        .args(["stat", &pid.to_string()])
        .env("USWAP_RUNTIME_DIR", s.dir.path().join("roots"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("is user 65534's"), "{err}");
    s.finish(child);
}

/// Nothing running: one line and success, for `stat` and `top`; a pid
/// that is no process, one line and failure.
#[test]
fn nothing_running_is_one_line() {
    let s = Scene::new();
    for args in [&["stat"][..], &["top"][..]] {
        let out = s.uswap(args);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(text.lines().count(), 1, "{args:?}: {text}");
        assert!(text.contains("no program is paged"), "{text}");
    }
    assert_eq!(s.stat_json(), serde_json::json!([]));
    let out = s.uswap(&["stat", "2147483646"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("no process 2147483646"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1);
    let out = s.uswap(&["stat", "-w", "0"]);
    assert!(!out.status.success());
}

/// `uswap top` in tmux, as a person runs it: the program's row with its
/// numbers; a terminal made too small says so and goes on (no panic);
/// made larger again, the table is back; `q` quits with status 0.
#[test]
fn top_in_tmux_shows_the_program_and_quits_on_q() {
    let s = Scene::new();
    let have = Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have && root() {
        let _ = Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends", "tmux"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status();
    }
    let child = s.start(
        &["--budget", "64M"],
        &[PYTHON, &s.hog(), "192", "120", &s.stop_file()],
        false,
    );
    let v = s.wait_until(120, "the program paging", |v| paging(v, 1));
    let pid = processes(&v)[0]["pid"].as_i64().unwrap().to_string();
    let socket = format!("uswap-top-test-{}", std::process::id());
    let tmux = |args: &[&str]| -> String {
        let out = Command::new("tmux")
            .args(["-L", &socket, "-f", "/dev/null"])
            .args(args)
            .output()
            .expect("tmux (scripts/check installs it)");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let shell = format!(
        "USWAP_RUNTIME_DIR={} {} top --delay 0.5; echo top-exited-$?; sleep 60",
        s.stats_dir().display(),
        env!("CARGO_BIN_EXE_uswap")
    );
    tmux(&["new-session", "-d", "-s", "t", "-x", "160", "-y", "24", &shell]);
    let screen = |want: &str| -> String {
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            let text = tmux(&["capture-pane", "-p", "-t", "t"]);
            if text.contains(want) {
                return text;
            }
            if Instant::now() > until {
                tmux(&["kill-server"]);
                panic!("{want:?} not on the screen:\n{text}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let text = screen(&pid);
    let row = text.lines().find(|l| l.contains(&pid)).unwrap();
    assert!(
        row.contains("hog.py") && row.contains('%') && row.contains("64M"),
        "{text}"
    );
    assert!(
        text.contains("RESIDENT/SHARE") && text.contains("FAULTS/S"),
        "{text}"
    );
    tmux(&["resize-window", "-t", "t", "-x", "24", "-y", "3"]);
    screen("uswap top: term");
    tmux(&["resize-window", "-t", "t", "-x", "160", "-y", "24"]);
    screen(&pid);
    tmux(&["send-keys", "-t", "t", "q"]);
    let text = screen("top-exited-");
    tmux(&["kill-server"]);
    assert!(text.contains("top-exited-0"), "{text}");
    s.finish(child);
}
