//! `uswap bench pmbench | seq-write | activate` end to end: the workloads
//! really swap, the switches of `--ablate` really change what runs, the
//! kernel backends set up and tear down their swap and cgroup (on Ctrl-C
//! too), and bad input or a busy machine gets one clear line.
//!
//! The kernel tests need root, zram0 and the cgroup v1 memory controller,
//! which this project's machines have; they take a process-wide lock since
//! the machine has one zram0 and only one swap may be on.

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;

static KERNEL: Mutex<()> = Mutex::new(());

fn uswap(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_uswap"))
        .args(args)
        .output()
        .expect("run uswap")
}

fn json_of(args: &[&str]) -> Value {
    let out = uswap(args);
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e})"))
}

fn variant<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["variants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == name)
        .unwrap_or_else(|| panic!("no variant {name} in {v}"))
}

fn num(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or_else(|| panic!("{k} missing in {v}"))
}

/// The fields every variant of these benches carries, with sane values.
fn check_variant(x: &Value) {
    assert!(num(x, "throughput") > 0.0, "{x}");
    assert!(x["threads"].as_u64().unwrap() >= 1);
    assert!(num(x, "lock_wait") >= 0.0);
    let l = &x["latency_ns"];
    assert!(num(l, "p50") > 0.0 && num(l, "p50") <= num(l, "p99"), "{x}");
    assert!(
        num(l, "p99") <= num(l, "p999") && num(l, "p999") <= num(l, "max"),
        "{x}"
    );
    let cdf = x["cdf"].as_array().unwrap();
    assert!(cdf.len() > 100);
    for w in cdf.windows(2) {
        assert!(
            w[0][0].as_f64() <= w[1][0].as_f64() && w[0][1].as_f64() <= w[1][1].as_f64(),
            "CDF not monotone: {w:?}"
        );
    }
    assert_eq!(cdf.last().unwrap()[1], 1.0);
    assert!(!x["timeline"].as_array().unwrap().is_empty(), "{x}");
}

/// The run's operations (throughput times time, of the one round) were
/// exactly `n`.
fn assert_ops(x: &Value, n: u64) {
    let ops = num(x, "throughput") * num(x, "elapsed_s");
    assert!(
        (ops - n as f64).abs() < 1e-6 * n as f64,
        "{ops} operations, not {n}: {x}"
    );
}

/// `uswap bench pmbench --json` on a small working set (64 MiB over a
/// 16 MiB budget, one half-second round), with `extra` arguments.
fn small_pmbench(extra: &[&str]) -> Value {
    let mut args = vec![
        "bench",
        "pmbench",
        "--json",
        "--wss",
        "64M",
        "--budget",
        "16M",
        "--seconds",
        "0.5",
        "--rounds",
        "1",
    ];
    args.extend_from_slice(extra);
    json_of(&args)
}

fn counter(x: &Value, k: &str) -> u64 {
    x["counters"][k].as_u64().unwrap_or(0)
}

#[test]
fn pmbench_on_uswap_swaps_and_reports() {
    let v = small_pmbench(&[]);
    assert_eq!(v["bench"], "pmbench");
    let x = variant(&v, "uswap");
    check_variant(x);
    // Three quarters of the working set cannot be resident: random
    // accesses fault and read pages back from the device.
    assert!(num(x, "swapin_gbps") > 0.0, "{x}");
    assert!(
        counter(x, "faults") > 1000 && counter(x, "io_read_pages") > 1000,
        "{x}"
    );
    assert_eq!(x["read_pct"], 80);
    assert_eq!(x["pattern"], "uniform");
    assert!(num(x, "populate_s") > 0.0);
    assert!(x["locks"]["lru"]["acquisitions"].as_u64().unwrap() > 0, "{x}");
}

/// `--pattern`: a zipf hot set mostly stays resident, so it faults far
/// less per access than uniform accesses over a working set four times
/// the budget; a linear walk is read ahead (more pages read ahead than
/// faulted).
#[test]
fn pmbench_patterns() {
    let run = |pattern: &str| {
        let v = small_pmbench(&["--threads", "1", "--pattern", pattern]);
        let x = variant(&v, "uswap").clone();
        check_variant(&x);
        assert_eq!(x["pattern"], pattern);
        x
    };
    let per_access = |x: &Value| counter(x, "faults") as f64 / num(x, "throughput").max(1.0);
    let (uniform, zipf, linear) = (run("uniform"), run("zipf"), run("linear"));
    assert!(
        per_access(&zipf) < per_access(&uniform) / 2.0,
        "faults per access/s: zipf {}, uniform {}",
        per_access(&zipf),
        per_access(&uniform)
    );
    assert!(
        counter(&linear, "readahead") > counter(&linear, "faults"),
        "{linear}"
    );
}

#[test]
fn seq_write_pages_and_units() {
    let v = json_of(&[
        "bench",
        "seq-write",
        "--json",
        "--wss",
        "64M",
        "--budget",
        "16M",
        "--rounds",
        "1",
    ]);
    let page = variant(&v, "uswap");
    let unit = variant(&v, "uswap 2m");
    for x in [page, unit] {
        check_variant(x);
        // The whole region written once: 16384 pages, 48 MiB of it
        // beyond the budget and so written out.
        assert_ops(x, 16384);
        assert!(num(x, "swapout_gbps") > 0.0, "{x}");
        assert!(counter(x, "io_write_pages") >= 48 * 256 - 1024, "{x}");
    }
    assert!(counter(unit, "huge_swapouts") > 0, "{unit}");
    assert_eq!(counter(page, "huge_swapouts"), 0, "{page}");
    // The 2 MB row is compared with the 4 KiB one (seed 003's figure).
    assert_eq!(unit["baseline"], "uswap");
}

#[test]
fn activate_maps_touches_unmaps() {
    let v = json_of(&[
        "bench",
        "activate",
        "--json",
        "--wss",
        "32M",
        "--budget",
        "16M",
        "--seconds",
        "0.2",
        "--rounds",
        "1",
        "--threads",
        "3",
    ]);
    let x = variant(&v, "uswap");
    check_variant(x);
    let rounds = x["iterations"].as_u64().unwrap();
    assert!(rounds >= 1);
    // Every thread touched every page of every round.
    assert_ops(x, rounds * 3 * 8192);
    // Touches after eviction came back and were activated.
    assert!(counter(x, "lru_activate") > 0, "{x}");
    assert!(x["locks"]["lru"]["acquisitions"].as_u64().unwrap() > 0);
}

/// An ablation really flips its switch: without LRU batches the LRU lock
/// is taken many times more often per fault.
#[test]
fn ablate_flips_the_switch() {
    let v = small_pmbench(&["--ablate", "--variants", "unbatched-lru"]);
    let per_fault =
        |x: &Value| x["locks"]["lru"]["acquisitions"].as_u64().unwrap() as f64 / counter(x, "faults") as f64;
    let (d, u) = (variant(&v, "uswap"), variant(&v, "uswap/unbatched-lru"));
    check_variant(u);
    assert_eq!(u["baseline"], "uswap");
    assert!(num(u, "vs_baseline") > 0.0);
    assert!(
        per_fault(u) > 3.0 * per_fault(d),
        "default {} vs unbatched {}",
        per_fault(d),
        per_fault(u)
    );
}

/// A tier's switch for pages that do not compress: by default the store
/// keeps them whole and writes them back in their turn; flipped back,
/// they go straight to the file, as zswap sent them before Linux 6.18.
#[test]
fn ablate_sends_a_tiers_random_pages_straight_to_its_file() {
    let v = small_pmbench(&[
        "--backend",
        "uswap-zram-file",
        "--data",
        "random",
        "--ablate",
        "--variants",
        "incompressible-to-file",
    ]);
    let (d, a) = (
        variant(&v, "uswap-zram-file"),
        variant(&v, "uswap-zram-file/incompressible-to-file"),
    );
    check_variant(a);
    let whole = |x: &Value| x["store"]["whole_pages"].as_u64().unwrap();
    assert_eq!(counter(d, "store_incompressible_to_file"), 0, "{d}");
    assert!(whole(d) > 1000, "the default's store kept none whole: {d}");
    assert!(counter(a, "store_incompressible_to_file") > 1000, "{a}");
    assert_eq!(whole(a), 0, "{a}");
}

#[test]
fn plots_png_and_svg() {
    let dir = tempfile::tempdir().unwrap();
    for ext in ["png", "svg"] {
        let p = dir.path().join(format!("p.{ext}"));
        let out = uswap(&[
            "bench",
            "activate",
            "--wss",
            "16M",
            "--budget",
            "16M",
            "--seconds",
            "0.1",
            "--rounds",
            "1",
            "--plot",
            p.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let bytes = std::fs::read(&p).unwrap();
        if ext == "png" {
            assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
            assert!(bytes.len() > 20_000, "a real picture, not an empty canvas");
        } else {
            let s = String::from_utf8(bytes).unwrap();
            assert!(
                s.contains("<svg") && s.contains("latency CDF") && s.contains("uswap x2"),
                "{s:.300}"
            );
        }
    }
}

/// A font that cannot be had fails `--plot` in one line before anything
/// runs (a run would take the 30 s asked for).
#[test]
fn plot_without_a_font_fails_before_running() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("p.png");
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_uswap"))
        .args([
            "bench",
            "pmbench",
            "--wss",
            "16M",
            "--budget",
            "16M",
            "--seconds",
            "30",
        ])
        .arg("--plot")
        .arg(&p)
        .env("USWAP_PLOT_FONT", dir.path().join("missing.ttf"))
        .output()
        .expect("run uswap");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("USWAP_PLOT_FONT="), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(started.elapsed() < Duration::from_secs(10), "it ran first");
    assert!(!p.exists());
}

#[test]
fn bad_input_gets_one_line() {
    let cases: &[(&[&str], &str)] = &[
        (&["--wss", "0"], "--wss must be a positive multiple"),
        (&["--wss", "1000000"], "--wss must be a positive multiple"),
        (&["--budget", "1M"], "--budget must be at least 16M"),
        (
            &["--wss", "1G", "--budget", "16M", "--swap-size", "64M"],
            "raise --swap-size",
        ),
        (
            &["--ablate", "--backend", "kernel-zram"],
            "--ablate flips uswap's seed switches",
        ),
        (&["--variants", "no-slot-cache"], "give it with --ablate"),
        (&["--ablate", "--variants", "nope"], "unknown variant \"nope\""),
        (&["--plot", "x.txt"], "must end in .png or .svg"),
        (&["--plot", "/nonexistent/x.png"], "does not exist"),
        (&["--read-pct", "101"], "--read-pct must be 0..=100"),
        (&["--wss", "lots"], "is not a size"),
        (&["--wss", "100T"], "more than this machine can hold"),
    ];
    for (args, want) in cases {
        let mut a = vec!["bench", "pmbench", "--seconds", "0.1"];
        a.extend_from_slice(args);
        let out = uswap(&a);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{a:?} succeeded");
        assert!(err.contains(want), "{a:?}: {err}");
        // clap's own parse errors add a pointer to --help; ours are one line.
        if !err.contains("For more information") {
            assert_eq!(err.trim().lines().count(), 1, "{a:?}: {err}");
        }
    }
}

/// Nothing of a kernel run is left: no swap on, zram0 reset, no cgroup,
/// no swap file.
fn assert_clean(swap_dir: &Path) {
    let swaps = std::fs::read_to_string("/proc/swaps").unwrap();
    assert_eq!(swaps.lines().count(), 1, "swap left on: {swaps}");
    assert_eq!(
        std::fs::read_to_string("/sys/block/zram0/disksize")
            .unwrap()
            .trim(),
        "0"
    );
    let cgroups: Vec<_> = std::fs::read_dir("/sys/fs/cgroup/memory")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("uswap-bench-"))
        .collect();
    assert!(cgroups.is_empty(), "cgroups left: {cgroups:?}");
    let files: Vec<_> = std::fs::read_dir(swap_dir).unwrap().flatten().collect();
    assert!(files.is_empty(), "files left in the swap dir: {files:?}");
}

#[test]
fn compare_runs_kernel_swap_and_cleans_up() {
    let _k = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir_in(std::env::current_dir().unwrap()).unwrap();
    let v = json_of(&[
        "bench",
        "pmbench",
        "--json",
        "--compare",
        "--wss",
        "256M",
        "--budget",
        "128M",
        "--seconds",
        "0.5",
        "--rounds",
        "1",
        "--threads",
        "1",
        "--swap-dir",
        dir.path().to_str().unwrap(),
    ]);
    for name in ["uswap", "uswap-file", "uswap-zram", "kernel-zram", "kernel-file"] {
        let x = variant(&v, name);
        check_variant(x);
        // Under the budget's limit the populate pushed half the working
        // set out and the accesses brought pages back: the cgroup's
        // limit and the swap device were really in force.
        assert!(num(x, "swapin_gbps") > 0.0, "{name}: {x}");
    }
    // Like for like: a uswap backend against kernel swap on the same kind
    // of device; the kernel rows carry no ratio of their own (it is on
    // their pair's row); the RAM device, which has no pair, against the
    // uswap default, itself.
    for (uswap, kernel) in [
        ("uswap-file", "kernel-file"),
        ("uswap-zram", "kernel-zram"),
        ("uswap-zram-file", "kernel-zswap"),
    ] {
        let u = variant(&v, uswap);
        assert_eq!(u["baseline"], kernel, "{uswap}: {u}");
        assert!(num(u, "vs_baseline") > 0.0, "{uswap}: {u}");
        assert!(variant(&v, kernel).get("baseline").is_none(), "{kernel}");
    }
    assert_eq!(variant(&v, "uswap")["baseline"], "uswap");
    // Compressed memory at the same codec: zram is given uswap-zram's
    // (lz4) when it offers it.
    let offered = std::fs::read_to_string("/sys/block/zram0/comp_algorithm").unwrap_or_default();
    if offered
        .split_whitespace()
        .any(|a| a.trim_matches(|c| c == '[' || c == ']') == "lz4")
    {
        assert_eq!(variant(&v, "kernel-zram")["codec"], "lz4");
        assert_eq!(variant(&v, "uswap-zram")["codec"], "lz4");
    }
    assert!(variant(&v, "kernel-zram")["locks"]
        .as_object()
        .unwrap()
        .is_empty());
    assert_clean(dir.path());
}

#[test]
fn refuses_while_another_swap_is_on() {
    let _k = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir_in(std::env::current_dir().unwrap()).unwrap();
    let swap = dir.path().join("other.swap");
    // A 16 MiB swap file with a version-1 header, as mkswap writes.
    let mut b = vec![0u8; 16 << 20];
    b[1024..1028].copy_from_slice(&1u32.to_ne_bytes());
    b[1028..1032].copy_from_slice(&((16u32 << 8) - 1).to_ne_bytes());
    b[4086..4096].copy_from_slice(b"SWAPSPACE2");
    std::fs::write(&swap, &b).unwrap();
    std::fs::set_permissions(&swap, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let c = std::ffi::CString::new(swap.to_str().unwrap()).unwrap();
    struct Off(std::ffi::CString);
    impl Drop for Off {
        fn drop(&mut self) {
            // SAFETY: a valid path string.
            unsafe { libc::swapoff(self.0.as_ptr()) };
        }
    }
    // SAFETY: a valid path string.
    let rc = unsafe { libc::swapon(c.as_ptr(), 0) };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    let off = Off(c);
    let out = uswap(&[
        "bench",
        "pmbench",
        "--backend",
        "kernel-zram",
        "--wss",
        "64M",
        "--budget",
        "32M",
    ]);
    drop(off);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("another swap is already active") && err.contains("other.swap"),
        "{err}"
    );
    std::fs::remove_file(&swap).unwrap();
    assert_clean(dir.path());
}

#[test]
fn ctrl_c_tears_kernel_swap_down() {
    let _k = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir_in(std::env::current_dir().unwrap()).unwrap();
    for backend in ["kernel-zram", "kernel-file"] {
        let child = Command::new(env!("CARGO_BIN_EXE_uswap"))
            .args([
                "bench",
                "pmbench",
                "--backend",
                backend,
                "--wss",
                "256M",
                "--budget",
                "128M",
                "--seconds",
                "60",
            ])
            .args(["--threads", "1", "--swap-dir", dir.path().to_str().unwrap()])
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Wait until the run is under way: its swap is on.
        let start = Instant::now();
        while std::fs::read_to_string("/proc/swaps").unwrap().lines().count() < 2 {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{backend}: swap never came on"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: signals our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(err.contains("interrupted"), "{backend}: {err}");
        assert_clean(dir.path());
    }
}

#[test]
fn kernel_backends_need_root() {
    use std::os::unix::process::CommandExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        let out = uswap(&["bench", "pmbench", "--backend", "kernel-zram"]);
        assert!(String::from_utf8_lossy(&out.stderr).contains("need root"));
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_uswap"))
        .args([
            "bench",
            "pmbench",
            "--backend",
            "kernel-file",
            "--swap-dir",
            "/tmp",
        ])
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("kernel swap backends need root"), "{err}");
}

/// `uswap bench program` tells the program which runner it is under, and
/// a library runner the budget and device to build its own Swap with
/// (the Python package's numpy bench reads them); memcg is a limited
/// group with no swap.
#[test]
fn program_tells_the_program_its_runner() {
    let _k = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir_in(std::env::current_dir().unwrap()).unwrap();
    let d = dir.path().to_str().unwrap();
    let log = dir.path().join("seen");
    let script = format!(
        "g=$(grep :memory: /proc/self/cgroup | cut -d: -f3); echo \"$USWAP_BENCH_RUNNER|$USWAP_BENCH_BUDGET|$USWAP_BENCH_SWAP|$g|$(cat /sys/fs/cgroup/memory$g/memory.swappiness)\" >> {}",
        log.display()
    );
    let args = [
        "bench",
        "program",
        "--json",
        "--budget",
        "16M",
        "--swap-size",
        "64M",
        "--rounds",
        "1",
        "--swap-dir",
        d,
        "--runner",
        "plain,library-zram,library-file,memcg",
        "--",
        "/bin/sh",
        "-c",
        &script,
    ];
    let v = json_of(&args);
    assert_eq!(v["runners"].as_array().unwrap().len(), 4, "{v}");
    let seen = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<Vec<&str>> = seen.lines().map(|l| l.split('|').collect()).collect();
    let got: Vec<[&str; 3]> = lines.iter().map(|f| [f[0], f[1], f[2]]).collect();
    let file = format!("file:{d}:67108864");
    assert_eq!(
        got,
        [
            ["plain", "", ""],
            ["library-zram", "16777216", "zram:67108864"],
            ["library-file", "16777216", &file],
            ["memcg", "", ""],
        ],
        "{seen}"
    );
    // Each in a group of its own; memcg's swaps nothing.
    assert!(lines.iter().all(|f| f[3].starts_with("/uswap-bench-")), "{seen}");
    assert_eq!(lines[3][4], "0", "{seen}");
    std::fs::remove_file(&log).unwrap();
    assert_clean(dir.path());
}

/// `uswap bench program`: a Python program of 60 MiB under 16 MiB, each
/// runner in a memory group of its own, the same output from each (the
/// bench checks it); uswap's compressed device holds the tree within the
/// budget with the store inside it, the kernel's groups within their
/// limit; with too little kernel swap the group's OOM kill is counted as
/// the run's result, not an error; nothing is left behind.
#[test]
fn program_runs_each_runner_in_a_memory_group_and_counts_oom_kills() {
    let _k = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    common::preload_built();
    let dir = tempfile::tempdir_in(std::env::current_dir().unwrap()).unwrap();
    let d = dir.path().to_str().unwrap();
    let prog = [
        "--",
        common::PYTHON,
        "-c",
        "x = bytearray(60 << 20)\nfor i in range(0, len(x), 512): x[i] = i % 251\nprint(sum(x[::512]))",
    ];
    let runners = "plain,uswap-zram,uswap-tier,kernel-zram,kernel-file";
    let mut args = vec![
        "bench",
        "program",
        "--json",
        "--budget",
        "16M",
        "--rounds",
        "1",
        "--swap-dir",
        d,
    ];
    args.extend(["--runner", runners]);
    args.extend(prog);
    let v = json_of(&args);
    let runner = |v: &Value, name: &str| -> Value {
        v["runners"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["runner"] == name)
            .unwrap_or_else(|| panic!("no runner {name}: {v}"))
            .clone()
    };
    let peak = |r: &Value| r["runs"][0]["tree_peak_mib"].as_f64().unwrap();
    assert!(peak(&runner(&v, "plain")) >= 48.0, "{v}");
    for name in ["uswap-zram", "uswap-tier"] {
        let r = runner(&v, name);
        assert_eq!(r["oom_kills"], 0, "{r}");
        // Budget, overrun and the fixed overhead (docs/DESIGN.md).
        assert!(peak(&r) <= 16.0 * 1.1 + 16.0, "{name}: {r}");
    }
    for name in ["kernel-zram", "kernel-file"] {
        let r = runner(&v, name);
        assert_eq!(r["oom_kills"], 0, "{r}");
        assert!(peak(&r) <= 16.0, "{name}: {r}");
    }
    assert!(
        runner(&v, "kernel-zram")["runs"][0]["zram_peak_mib"]
            .as_f64()
            .unwrap()
            > 0.0,
        "{v}"
    );
    assert_clean(dir.path());
    // 4 MiB of kernel swap for 60 MB under 16 MiB: the group kills it.
    let mut args = vec![
        "bench",
        "program",
        "--json",
        "--budget",
        "16M",
        "--swap-size",
        "4M",
        "--rounds",
        "1",
    ];
    args.extend(["--swap-dir", d, "--runner", "plain,kernel-file"]);
    args.extend(prog);
    let v = json_of(&args);
    let r = runner(&v, "kernel-file");
    assert_eq!(r["oom_kills"], 1, "{r}");
    assert_eq!(r["runs"][0]["oom_killed"], true, "{r}");
    assert_clean(dir.path());
}

/// `uswap bench program`'s auto runners: a service that loads 120 MiB
/// and then reads a tenth of it (the tenth loaded last: uswap evicts in
/// fault order, without accessed bits, and a hot set loaded first is the
/// case it cannot learn yet, DESIGN.md), under `uswap run --budget auto`
/// and in a memory group whose limit the same controller drives over
/// kernel swap: the same output as plain (the bench checks it), memory
/// sampled over the run, under the ceiling, and while the service serves
/// after the descent both hold less than three quarters of their peak
/// and less than plain's mean.  The service serves for about 11 s: the
/// controller lowers the budget a tenth a second at most, and uswap's
/// tree starts a third above plain's (mimalloc's 5 KiB size class holds
/// each 4 KiB record), so a shorter run on a faster machine left the
/// window before the descent had passed plain (CI, 2026-12-03: 123 MiB
/// against 123; here 75-78 against 127).  Release only: a minute of
/// paging.
#[test]
#[cfg_attr(debug_assertions, ignore = "a minute of paging: run in the release pass")]
fn program_auto_runners_give_back_cold_memory() {
    let _k = KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    common::preload_built();
    let dir = tempfile::tempdir_in(std::env::current_dir().unwrap()).unwrap();
    let service = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/results/auto/service.py");
    let v = json_of(&[
        "bench",
        "program",
        "--json",
        "--budget",
        "512M",
        "--rounds",
        "1",
        "--swap-dir",
        dir.path().to_str().unwrap(),
        "--runner",
        "plain,uswap-auto,uswap-sigbus-auto,kernel-auto",
        "--",
        common::PYTHON,
        service,
        "120",
        "1000000",
        "last",
    ]);
    let run = |name: &str| -> Value {
        v["runners"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["runner"] == name)
            .unwrap_or_else(|| panic!("no runner {name}: {v}"))["runs"][0]
            .clone()
    };
    let mean = |r: &Value| r["tree_mean_mib"].as_f64().unwrap();
    let plain = run("plain");
    assert!(mean(&plain) >= 100.0, "{plain}");
    for name in ["uswap-auto", "uswap-sigbus-auto", "kernel-auto"] {
        let r = run(name);
        assert_eq!(r["oom_killed"], false, "{name}: {r}");
        assert!(
            r["memory"].as_array().is_some_and(|m| m.len() > 20),
            "{name}: {r}"
        );
        assert!(r["tree_peak_mib"].as_f64().unwrap() <= 512.0, "{name}: {r}");
        let memory: Vec<f64> = r["memory"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p[1].as_f64().unwrap())
            .collect();
        // From half the run to five sixths: serving, after the descent
        // and before the exit, which frees every record and so brings
        // back all that went out, on both sides.
        let late = &memory[memory.len() / 2..memory.len() * 5 / 6];
        let late = late.iter().sum::<f64>() / late.len() as f64;
        let peak = r["tree_peak_mib"].as_f64().unwrap();
        assert!(
            late < peak * 0.75 && late < mean(&plain),
            "{name} held {late:.0} MiB from half the run to five sixths, against its peak of {peak:.0} and plain's mean of {:.0}",
            mean(&plain)
        );
    }
    assert_clean(dir.path());
}
