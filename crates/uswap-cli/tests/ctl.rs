//! `uswap ctl`: a running tree's budget changed live, in both fault modes
//! (SIGBUS mode as `nobody` when the suite runs as root), with the
//! program's data checked at its end.

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// 300 MiB in 1 MiB blocks of their own bytes; "ready"; then, for
/// `seconds`, the work of a running service: a few hot blocks read and
/// small objects made (each a `malloc`), until every block is checked.
const SERVICE: &str = r#"
import hashlib, sys, time
n, seconds = 300, float(sys.argv[1])
blocks = [hashlib.sha256(i.to_bytes(4, 'little')).digest() * 32768 for i in range(n)]
print("ready", flush=True)
end = time.time() + seconds
while time.time() < end:
    for b in blocks[:8]:
        scratch = bytes(b[:4096])
    time.sleep(0.01)
bad = sum(b != hashlib.sha256(i.to_bytes(4, 'little')).digest() * 32768 for i, b in enumerate(blocks))
print(f"{n} MiB, {bad} bad", flush=True)
"#;

/// One tree at a time: each test times how fast a tree follows, which
/// another's 300 MiB of reclaim beside it would slow.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `uswap ctl` as `uid`, with `dir` as the statistics directory.
fn ctl(uid: u32, dir: &str, args: &[&str]) -> (bool, String, String) {
    uswap(uid, dir, "ctl", args)
}

/// `uswap VERB ARGS...` as `uid`, with `dir` as the statistics directory.
fn uswap(uid: u32, dir: &str, verb: &str, args: &[&str]) -> (bool, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_uswap"));
    cmd.arg(verb).args(args).env("USWAP_RUNTIME_DIR", dir);
    // SAFETY: geteuid has no preconditions.
    if uid != unsafe { libc::geteuid() } {
        cmd.uid(uid).gid(uid);
    }
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).trim().to_string(),
    )
}

/// The MiB resident in a `status` answer.
fn resident(status: &str) -> u64 {
    let at = status.find(" MiB resident").unwrap_or_else(|| panic!("{status}"));
    status[..at].rsplit(' ').next().unwrap().parse().unwrap()
}

/// `script` (Python, with `args`) under `uswap run --budget BUDGET` in
/// `mode`, once it has printed `ready`: its pid, its user, the statistics
/// directory, and the process.
fn start(
    mode: Mode,
    budget: &str,
    script: &str,
    args: &[&str],
    ready: &str,
) -> (i32, u32, tempfile::TempDir, std::process::Child) {
    start_with(mode, budget, &[], script, args, ready)
}

/// [`start`] with more options of `uswap run` (`run_args`).
fn start_with(
    mode: Mode,
    budget: &str,
    run_args: &[&str],
    script: &str,
    args: &[&str],
    ready: &str,
) -> (i32, u32, tempfile::TempDir, std::process::Child) {
    preload_built();
    let dir = tempfile::tempdir().unwrap();
    // The statistics directory is its user's alone, or not used.
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let nobody = mode == Mode::Sigbus && root();
    if nobody {
        std::os::unix::fs::chown(dir.path(), Some(NOBODY), Some(NOBODY)).unwrap();
    }
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_uswap"));
    cmd.args(["run", "--mode", mode.name(), "--budget", budget])
        .args(run_args)
        .args(["--", PYTHON, "-c", script])
        .args(args)
        .env("USWAP_RUNTIME_DIR", dir.path())
        .env("TMPDIR", "/var/tmp")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let uid = if nobody {
        cmd.uid(NOBODY).gid(NOBODY);
        NOBODY
    } else {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() }
    };
    let mut child = cmd.spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    if line.trim() != ready {
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        panic!("{mode:?}: {line:?} {}", String::from_utf8_lossy(&out.stderr));
    }
    (child.id() as i32, uid, dir, child)
}

/// The program ends well, having read back every one of its 300 MiB.
fn ends_with_its_data(child: std::process::Child, mode: Mode) {
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{mode:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "300 MiB, 0 bad",
        "{mode:?}"
    );
}

/// Lowering the budget under a running program: its resident memory
/// follows within a second; `freeze` takes it down to a few MiB while it
/// runs, `thaw` gives the budget back, and every byte reads back at its
/// end.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at several times its budget, timed: run in the release pass (CI runs both)"
)]
fn a_lower_budget_freeze_and_thaw_are_followed_live_and_the_data_reads_back() {
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for mode in Mode::all() {
        let (pid, uid, dir, child) = start(mode, "1G", SERVICE, &["6"], "ready");
        let d = dir.path().to_str().unwrap().to_string();
        let (ok, status, err) = ctl(uid, &d, &[&pid.to_string(), "status"]);
        assert!(ok, "{mode:?}: {err}");
        assert!(status.contains("budget 1024 MiB"), "{mode:?}: {status}");
        assert!(
            resident(&status) >= 280,
            "{mode:?}: the data is not resident: {status}"
        );

        let asked = Instant::now();
        let (ok, answer, err) = ctl(uid, &d, &[&pid.to_string(), "budget", "64M"]);
        assert!(ok, "{mode:?}: {err}");
        assert!(answer.starts_with("budget 64 MiB"), "{mode:?}: {answer}");
        let followed = loop {
            let (_, status, _) = ctl(uid, &d, &[&pid.to_string(), "status"]);
            if resident(&status) <= 64 {
                break asked.elapsed();
            }
            assert!(
                asked.elapsed() < Duration::from_secs(3),
                "{mode:?}: not followed: {status}"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(
            followed < Duration::from_secs(1),
            "{mode:?}: followed after {followed:?}"
        );

        let (ok, answer, err) = ctl(uid, &d, &[&pid.to_string(), "freeze"]);
        assert!(ok && answer.starts_with("frozen"), "{mode:?}: {answer} {err}");
        let (_, status, _) = ctl(uid, &d, &[&pid.to_string(), "status"]);
        assert!(resident(&status) <= 8, "{mode:?}: frozen at {status}");
        assert!(
            status.contains("frozen; thaw returns to 64 MiB"),
            "{mode:?}: {status}"
        );
        let (ok, answer, _) = ctl(uid, &d, &[&pid.to_string(), "thaw"]);
        assert!(
            ok && answer == "thawed: budget 64 MiB again",
            "{mode:?}: {answer}"
        );
        let (ok, _, err) = ctl(uid, &d, &[&pid.to_string(), "thaw"]);
        assert!(!ok && err == "uswap ctl: not frozen", "{mode:?}: {err}");

        ends_with_its_data(child, mode);
        // The tree has ended: named, in one line.
        let (ok, _, err) = ctl(uid, &d, &[&pid.to_string(), "status"]);
        assert!(
            !ok && err.lines().count() == 1 && err.contains(&format!("no process {pid}")),
            "{err}"
        );
    }
}

/// Another user may not reach a tree; a process in no tree is named as
/// such; bad requests are one line each.
#[test]
fn another_user_is_refused_and_a_process_in_no_tree_is_named() {
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mode = if root() { Mode::Handler } else { Mode::Sigbus };
    let (pid, uid, dir, child) = start(mode, "1G", SERVICE, &["2"], "ready");
    let d = dir.path().to_str().unwrap().to_string();
    if root() {
        let (ok, _, err) = ctl(NOBODY, &d, &[&pid.to_string(), "budget", "1M"]);
        assert!(!ok && err.lines().count() == 1, "{err}");
        assert!(
            err.contains("only its user (or root) may control its tree"),
            "{err}"
        );
    }
    for (args, why) in [
        (vec!["budget", "1k"], "a budget is at least 1M"),
        (vec!["budget", "lots"], "lots:"),
        (vec!["reclaim", "lots"], "lots:"),
    ] {
        let mut all = vec![pid.to_string()];
        all.extend(args.iter().map(|s| s.to_string()));
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        let (ok, _, err) = ctl(uid, &d, &all);
        assert!(
            !ok && err.lines().count() == 1 && err.contains(why),
            "{args:?}: {err}"
        );
    }
    // This test's own process is in no tree.
    let me = std::process::id().to_string();
    let (ok, _, err) = ctl(uid, &d, &[&me, "status"]);
    assert!(
        !ok && err.contains("is not in a running `uswap run` tree"),
        "{err}"
    );
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "300 MiB, 0 bad");
}

/// `--budget auto` with its defaults: a service that loaded 300 MiB and
/// serves from a tenth of it has its budget lowered under its peak while
/// it runs, and reads every byte back at its end.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at several times its budget, timed: run in the release pass (CI runs both)"
)]
fn an_auto_budget_comes_down_under_a_service_with_cold_memory() {
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for mode in Mode::all() {
        let service = r#"
import hashlib, random, sys, time
n = 300
blocks = [hashlib.sha256(i.to_bytes(4, 'little')).digest() * 32768 for i in range(n)]
print("loaded", flush=True)
hot, rnd, served = blocks[: n // 10], random.Random(1), 0
end = time.time() + 24
while time.time() < end:
    b = hot[rnd.randrange(len(hot))]
    served += b[rnd.randrange(len(b))] & 1
bad = sum(b != hashlib.sha256(i.to_bytes(4, 'little')).digest() * 32768 for i, b in enumerate(blocks))
print(f"{n} MiB, {bad} bad", flush=True)
"#;
        // Its decisions logged (`--auto-log`), in a file of its user's.
        let logs = tempfile::tempdir().unwrap();
        if mode == Mode::Sigbus && root() {
            std::os::unix::fs::chown(logs.path(), Some(NOBODY), Some(NOBODY)).unwrap();
        }
        let log = logs.path().join("auto.log");
        let (pid, uid, dir, child) = start_with(
            mode,
            "auto",
            &["--auto-log", log.to_str().unwrap()],
            service,
            &[],
            "loaded",
        );
        let d = dir.path().to_str().unwrap().to_string();
        let pid = pid.to_string();
        // While it serves, the budget comes down a fifth under the
        // resident set the load left (some 340 MiB, the data and Python):
        // in 9 s on a quiet machine, given 20 s here (the probe slows as
        // the faults it causes near the target).  And the tree follows it:
        // after its load it neither allocates nor faults (it reads what is
        // in), which in SIGBUS mode left it no thread of uswap's running
        // and every page resident under any budget, until every member of
        // an auto domain past 32 MiB ran its reclaimer.
        let since = Instant::now();
        loop {
            let (ok, status, err) = ctl(uid, &d, &[&pid, "status"]);
            assert!(ok, "{mode:?}: {err}");
            assert!(status.contains("auto on"), "{mode:?}: {status}");
            let budget: u64 = status
                .split("budget ")
                .nth(1)
                .and_then(|b| b.split(' ').next())
                .and_then(|b| b.parse().ok())
                .unwrap_or_else(|| panic!("{status}"));
            if budget < 272 && resident(&status) <= budget + 8 {
                break;
            }
            assert!(
                since.elapsed() < Duration::from_secs(20),
                "{mode:?}: the budget stayed at {budget} MiB, or the tree above it: {status}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        // `uswap stat` and its Prometheus output show the controller:
        // on, and the budget's distance under the tree's peak.
        let (ok, stat, err) = uswap(uid, &d, "stat", &[&pid]);
        assert!(ok, "{mode:?}: {err}");
        assert!(stat.contains("\nauto on\n"), "{mode:?}: {stat}");
        let saved: u64 = stat
            .lines()
            .find_map(|l| l.strip_prefix("auto_saved "))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{mode:?}: {stat}"));
        assert!(saved > 40 << 20, "{mode:?}: saved {saved}: {stat}");
        let (ok, prom, err) = uswap(uid, &d, "stat", &["--prometheus", &pid]);
        assert!(ok, "{mode:?}: {err}");
        assert!(
            prom.contains(&format!("uswap_auto_on{{group=\"{pid}\""))
                && prom.contains("# TYPE uswap_auto_saved_bytes gauge"),
            "{mode:?}: {prom}"
        );
        let (ok, _, err) = ctl(uid, &d, &[&pid, "budget", "64M"]);
        assert!(!ok && err.contains("auto off"), "{mode:?}: {err}");
        // Turned off, the state says so.
        let (ok, _, err) = ctl(uid, &d, &[&pid, "auto", "off"]);
        assert!(ok, "{mode:?}: {err}");
        let (_, stat, _) = uswap(uid, &d, "stat", &[&pid]);
        assert!(stat.contains("\nauto off\n"), "{mode:?}: {stat}");
        ends_with_its_data(child, mode);
        // The log: its header, then a line a decision, the budget (MiB)
        // in the second column, which came under 272 MiB.
        let text = std::fs::read_to_string(&log).unwrap();
        let mut lines = text.lines();
        assert!(
            lines
                .next()
                .is_some_and(|h| h.starts_with("# seconds budget_mib")),
            "{mode:?}: {text}"
        );
        let budgets: Vec<u64> = lines
            .map(|l| {
                l.split(' ')
                    .nth(1)
                    .and_then(|b| b.parse().ok())
                    .unwrap_or_else(|| panic!("{l}"))
            })
            .collect();
        assert!(budgets.len() >= 5, "{mode:?}: {text}");
        assert!(budgets.iter().any(|&b| b < 272), "{mode:?}: {text}");
    }
}
