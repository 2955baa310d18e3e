//! The `uswap bench` commands end to end: each runs briefly, prints the
//! documented JSON shape, and refuses bad input with one clear line.

use std::process::Command;

use serde_json::Value;

fn uswap(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_uswap"))
        .args(args)
        .output()
        .expect("run uswap")
}

fn bench_json(args: &[&str]) -> Value {
    let out = uswap(args);
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{args:?}: not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// Every variant carries the shared fields, with sane values.
fn check_shape(v: &Value, bench: &str, names: &[&str]) {
    assert_eq!(v["bench"], bench);
    let variants = v["variants"].as_array().expect("variants array");
    for name in names {
        assert!(
            variants.iter().any(|x| x["name"] == *name),
            "{bench}: no variant {name}"
        );
    }
    for x in variants {
        assert!(x["threads"].as_u64().unwrap() >= 1);
        assert!(x["throughput"].as_f64().unwrap() > 0.0, "{bench}: {x}");
        let w = x["lock_wait"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&w) || w >= 0.0, "{bench}: lock_wait {w}");
        assert!(x["locks"].is_object());
        for (_, site) in x["locks"].as_object().unwrap() {
            assert!(site["acquisitions"].as_u64().unwrap() >= site["contended"].as_u64().unwrap());
            assert!(site["wait_ns"].is_u64());
        }
    }
}

#[test]
fn bench_alloc_json() {
    let v = bench_json(&[
        "bench",
        "alloc",
        "--json",
        "--seconds",
        "0.05",
        "--rounds",
        "1",
        "--threads",
        "1,2",
        "--slots",
        "65536",
    ]);
    check_shape(
        &v,
        "alloc",
        &[
            "default",
            "no-fragmented-scan",
            "shared-scan-base",
            "no-slot-cache",
        ],
    );
    let d = v["variants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == "default" && x["threads"] == 2)
        .unwrap();
    // The device lock and the swap-cache trunks were exercised and reported.
    assert!(d["locks"]["swap_info"]["acquisitions"].as_u64().unwrap() > 0);
    assert!(d["locks"]["swap_cache_trunk"]["acquisitions"].as_u64().unwrap() > 0);
    // Batched refills: many slots per device-lock acquisition.
    let c = &d["counters"];
    assert!(c["slot_cache_refill_slots"].as_u64().unwrap() > 8 * c["slot_cache_refill"].as_u64().unwrap());
}

#[test]
fn bench_huge_json() {
    let v = bench_json(&[
        "bench",
        "huge",
        "--json",
        "--seconds",
        "0.05",
        "--rounds",
        "1",
        "--threads",
        "1",
        "--slots",
        "16384",
    ]);
    check_shape(&v, "huge", &["default", "no-huge-cluster"]);
    let vs = v["variants"].as_array().unwrap();
    let d = vs.iter().find(|x| x["name"] == "default").unwrap();
    assert!(d["counters"]["huge_alloc"].as_u64().unwrap() > 0);
    let n = vs.iter().find(|x| x["name"] == "no-huge-cluster").unwrap();
    assert_eq!(n["counters"]["huge_alloc"].as_u64().unwrap_or(0), 0);
    assert!(n["counters"]["huge_fallback"].as_u64().unwrap() > 0);
}

#[test]
fn bench_lru_json() {
    let v = bench_json(&[
        "bench",
        "lru",
        "--json",
        "--rounds",
        "1",
        "--threads",
        "1,2",
        "--pages",
        "4096",
        "--passes",
        "1",
    ]);
    check_shape(&v, "lru", &["default", "batch-15", "unbatched-lru"]);
    let vs = v["variants"].as_array().unwrap();
    let acq = |name: &str| {
        vs.iter()
            .find(|x| x["name"] == name && x["threads"] == 1)
            .unwrap()["locks"]["lru"]["acquisitions"]
            .as_u64()
            .unwrap()
    };
    // Batching takes the LRU lock about once per batch instead of per page.
    assert!(
        acq("unbatched-lru") > 10 * acq("default"),
        "{} vs {}",
        acq("unbatched-lru"),
        acq("default")
    );
}

#[test]
fn bench_extent_json() {
    let v = bench_json(&[
        "bench",
        "extent",
        "--json",
        "--seconds",
        "0.05",
        "--rounds",
        "1",
        "--threads",
        "1",
        "--extents",
        "2,200",
    ]);
    check_shape(&v, "extent", &["default", "extent-list"]);
    assert_eq!(v["variants"].as_array().unwrap().len(), 4);
}

#[test]
fn bad_input_is_one_clear_line() {
    for (args, needle) in [
        (vec!["bench", "alloc", "--threads", "0"], "--threads"),
        (vec!["bench", "alloc", "--seconds=0"], "--seconds"),
        (vec!["bench", "alloc", "--occupancy", "1.5"], "--occupancy"),
        (vec!["bench", "alloc", "--slots", "10"], "--slots"),
        (vec!["bench", "alloc", "--variants", "nope"], "unknown variant"),
        (vec!["bench", "huge", "--inflight", "0"], "--inflight"),
        (vec!["bench", "lru", "--pages", "0"], "--pages"),
        (vec!["bench", "nosuch"], "unrecognized subcommand"),
    ] {
        let out = uswap(&args);
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    }
}

#[test]
fn help_teaches() {
    let out = uswap(&["bench", "--help"]);
    let s = String::from_utf8_lossy(&out.stdout);
    for b in ["alloc", "extent", "lru", "huge"] {
        assert!(s.contains(b), "bench --help lacks {b}: {s}");
    }
}

#[test]
fn demo_swaps_and_verifies() {
    for mode in ["sigbus", "handler"] {
        let out = uswap(&[
            "demo", "--size", "16M", "--budget", "4M", "--swap", "ram:64M", "--mode", mode,
        ]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{mode}: {}\n{text}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("every byte read back as written"), "{text}");
        // It really swapped: some pages went to swap and came back, by
        // their own faults or read ahead of them.
        let count = |after: &str| -> u64 {
            text.split(after)
                .nth(1)
                .and_then(|r| r.split(' ').next())
                .and_then(|n| n.parse().ok())
                .expect("counts in the summary")
        };
        let swapins = count("zero fills, ") + count("clean pages; ");
        assert!(swapins > 1000, "{text}");
    }
    // 2 MB units: whole units out and in.
    let out = uswap(&[
        "demo", "--size", "32M", "--budget", "8M", "--swap", "ram:64M", "--huge",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("every byte read back as written") && text.contains("2 MB units: "),
        "{text}"
    );
    let dir = tempfile::tempdir().unwrap();
    let file = format!("file:{}:32M", dir.path().join("swap").display());
    let out = uswap(&["demo", "--size", "8M", "--budget", "2M", "--swap", &file]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The default device compresses: the benches' text pages take about
    // two thirds of their size (LZ4 64%, and a small store's part-used
    // blocks).
    let out = uswap(&["demo", "--size", "16M", "--budget", "4M"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let share: f64 = text
        .split("bytes a page (")
        .nth(1)
        .and_then(|r| r.split('%').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no store line: {text}"));
    assert!(
        share < 85.0 && text.contains("every byte read back as written"),
        "{text}"
    );
    // A tier: a 1 MiB store in front of a file, most pages written back.
    let tier = format!("zram:1M,file:{}:64M", dir.path().join("tier").display());
    let out = uswap(&["demo", "--size", "16M", "--budget", "4M", "--swap", &tier]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let written: u64 = text
        .split("stored whole; ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no store line: {text}"));
    assert!(
        written > 1000 && text.contains("every byte read back as written"),
        "{text}"
    );
    for (args, needle) in [
        (vec!["demo", "--swap", "zram:1G:gzip"], "\"gzip\" is not a codec"),
        (
            vec!["demo", "--swap", "ram:1G,file:/tmp/x:1G"],
            "a tier is a compressed device and then a file",
        ),
        (
            vec!["demo", "--budget", "4K"],
            "budget of 4096 bytes is too small",
        ),
        (vec!["demo", "--swap", "ram:zz"], "is not a size"),
        (
            vec!["demo", "--swap", "file:/nonexistent-dir/x:1M"],
            "/nonexistent-dir/x",
        ),
    ] {
        let out = uswap(&args);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
        assert_eq!(
            err.trim().lines().count(),
            if needle.contains("size") || needle.contains("codec") || needle.contains("tier") {
                3
            } else {
                1
            },
            "{args:?}: {err}"
        );
    }
}

/// A run killed with SIGKILL leaves no swap file: a created one never has
/// a name.
#[test]
fn a_killed_demo_leaves_no_swap_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = format!("file:{}:1G", dir.path().join("swap").display());
    let mut child = Command::new(env!("CARGO_BIN_EXE_uswap"))
        .args(["demo", "--size", "1G", "--budget", "16M", "--swap", &file])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Swapping by now: the file is open and written.
    std::thread::sleep(std::time::Duration::from_millis(700));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the demo ended before the kill"
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "a name while it runs"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "left after kill -9"
    );
}

/// `uswap bench fault --json`, one round, one thread, 8 MiB, with `extra`
/// arguments.
/// A small `bench fault` run's arguments, `extra` after them.
fn small_fault_args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "bench",
        "fault",
        "--json",
        "--rounds",
        "1",
        "--threads",
        "1",
        "--mib",
        "8",
    ];
    args.extend_from_slice(extra);
    args
}

fn small_fault(extra: &[&str]) -> Value {
    bench_json(&small_fault_args(extra))
}

#[test]
fn bench_fault_json() {
    let v = small_fault(&[]);
    check_shape(
        &v,
        "fault",
        &[
            "kernel-anon",
            "bare-uffd",
            "zero-fill",
            "first-touch",
            "zero-fill-2m",
            "swapcache-hit",
            "swapin-ram",
            "swapin-ram-2m",
            "swapin-file",
            "swapin-file-2m",
        ],
    );
    for x in v["variants"].as_array().unwrap() {
        let us = x["us_per_fault"].as_f64().unwrap();
        assert!(us > 0.0 && us < 10_000.0, "{x}");
        let name = x["name"].as_str().unwrap();
        if name.ends_with("-2m") {
            // 2 MB units: a fault per unit, four units in 8 MiB.
            let c = &x["counters"];
            assert!(c["faults"].as_u64().unwrap() >= 1, "{x}");
            if name.starts_with("swapin") {
                assert!(c["huge_swapins"].as_u64().unwrap() >= 1, "{x}");
            }
        } else if x["name"] == "swapcache-hit" {
            // Every touch was a hit: moved back from staging, no IO.
            let c = &x["counters"];
            assert!(c["swapcache_hits"].as_u64().unwrap() > 500, "{x}");
            assert_eq!(c["swapcache_hits"], c["faults"], "{x}");
            assert_eq!(c["swapins"].as_u64().unwrap_or(0), 0, "{x}");
        } else if name == "first-touch" {
            // Far below the budget a fault fills a window of zero pages:
            // 2,048 pages in 8 MiB, a fault for many of them.
            let c = &x["counters"];
            assert!(c["faults"].as_u64().unwrap() * 8 <= 2048, "{x}");
            assert!(c["fault_around"].as_u64().unwrap() >= 1500, "{x}");
        } else if name == "bare-uffd" {
            // The floor: every uswap variant is given as a multiple of it.
            assert!(x.get("vs_kernel").is_some(), "{x}");
        } else if x["name"] != "kernel-anon" {
            // The faults really went through uswap: every page but the
            // (at most 512, the 2 MiB budget) still resident ones.
            assert!(x["counters"]["faults"].as_u64().unwrap() >= 2048 - 512, "{x}");
        }
        if name.starts_with("swapin") && !name.ends_with("-2m") {
            assert!(x["counters"]["swapins"].as_u64().unwrap() > 1024, "{x}");
        }
        if name != "kernel-anon" {
            assert!(x["vs_bare_uffd"].as_f64().unwrap() > 0.0, "{x}");
        }
        if !matches!(name, "kernel-anon" | "bare-uffd") {
            // How often a fault reclaimed first: a share of the faults.
            let pct = x["direct_reclaim_pct"].as_f64().unwrap();
            assert!((0.0..=100.0).contains(&pct), "{x}");
        }
    }
}

/// `--mode sigbus,handler` runs each uswap variant under both fault modes
/// side by side; the floors run once.
#[test]
fn bench_fault_both_modes() {
    let v = small_fault(&["--mode", "sigbus,handler", "--variants", "bare-uffd,swapin-ram"]);
    check_shape(&v, "fault", &["bare-uffd", "swapin-ram", "swapin-ram/handler"]);
    for x in v["variants"].as_array().unwrap() {
        match x["name"].as_str().unwrap() {
            "bare-uffd" => assert!(x.get("mode").is_none(), "{x}"),
            "swapin-ram" => assert_eq!(x["mode"], "Sigbus", "{x}"),
            _ => assert_eq!(x["mode"], "HandlerThread", "{x}"),
        }
        if x["name"] != "bare-uffd" {
            assert!(x["counters"]["swapins"].as_u64().unwrap() > 1024, "{x}");
        }
    }
}

/// An ordinary user (with the default `vm.unprivileged_userfaultfd=0` and
/// a root-only /dev/userfaultfd) runs the demo and the uswap benches in
/// SIGBUS mode, on a RAM device and a swap file: uswap opens its
/// userfaultfd for user-mode faults only.  Handler-thread mode, which
/// serves the kernel's faults too, is refused in one line that says what
/// to do.  As `nobody` when this is root; as this user otherwise.
#[test]
fn an_ordinary_user_runs_the_demo_and_benches() {
    use std::os::unix::process::CommandExt;
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let dir = tempfile::tempdir().unwrap();
    if root {
        std::os::unix::fs::chown(dir.path(), Some(65534), Some(65534)).unwrap();
    }
    let run = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_uswap"));
        if root {
            cmd.uid(65534).gid(65534);
        }
        cmd.args(args).output().expect("run uswap")
    };
    let file = format!("file:{}:64M", dir.path().join("swap").display());
    for swap in ["ram:64M", file.as_str()] {
        let out = run(&["demo", "--size", "16M", "--budget", "4M", "--swap", swap]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{swap}: {}\n{text}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("every byte read back as written"), "{text}");
    }
    let out = run(&small_fault_args(&["--variants", "bare-uffd,swapin-ram"]));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let swap_dir = dir.path().to_str().unwrap();
    let out = run(&[
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
        "--backend",
        "uswap,uswap-file",
        "--swap-dir",
        swap_dir,
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Whether the user these ran as may serve kernel faults anyway.
    let sysctl =
        std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd").is_ok_and(|s| s.trim() == "1");
    let dev = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/dev/userfaultfd").is_ok_and(|m| m.mode() & 0o006 == 0o006)
            || !root
                && std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open("/dev/userfaultfd")
                    .is_ok()
    };
    if sysctl || dev {
        return;
    }
    let out = run(&["demo", "--size", "16M", "--budget", "4M", "--mode", "handler"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("handler-thread mode")
            && err.contains("vm.unprivileged_userfaultfd")
            && err.contains("SIGBUS mode"),
        "{err}"
    );
}
