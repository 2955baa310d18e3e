//! Scenarios that may kill or hang their process (a SIGBUS, a deadlock, a
//! fork) run in a child: this test binary re-executed on one test, with
//! the scenario switched on by an environment variable, under a watchdog.
//! A hang then fails its test with what the child printed, instead of
//! hanging the suite.

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SCENARIO: &str = "USWAP_TEST_SCENARIO";

/// How a child run ended.
#[derive(Debug)]
pub struct Outcome {
    /// The exit code, when it exited.
    pub code: Option<i32>,
    /// The signal that killed it, when one did (SIGKILL from the watchdog
    /// included).
    pub signal: Option<i32>,
    /// The watchdog killed it.
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Outcome {
    /// Panics with everything the child said unless it exited 0.
    #[track_caller]
    pub fn assert_success(&self) {
        assert!(
            self.code == Some(0) && !self.timed_out,
            "child failed: exit code {:?}, signal {:?}, timed out {}\n--- stdout\n{}\n--- stderr\n{}",
            self.code,
            self.signal,
            self.timed_out,
            self.stdout,
            self.stderr
        );
    }
}

/// The scenario this process is to run, when it is a child.
pub fn scenario() -> Option<String> {
    std::env::var(SCENARIO).ok()
}

/// Run test `test` (its full path, e.g. `pager::tests::signals::x`) in a
/// child with scenario `arg`; kill it after `timeout`.
pub fn run(test: &str, arg: &str, timeout: Duration) -> Outcome {
    run_as(test, arg, timeout, None)
}

/// As [`run`], the child as user and group `ids` when given (this process
/// must be root: `Command::uid` drops the supplementary groups too).
pub fn run_as(test: &str, arg: &str, timeout: Duration, ids: Option<(u32, u32)>) -> Outcome {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    if let Some((uid, gid)) = ids {
        cmd.uid(uid).gid(gid);
    }
    let mut child = cmd
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(SCENARIO, arg)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Drain both pipes on threads, so a chatty child cannot block.
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + timeout;
    let mut timed_out = false;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            timed_out = true;
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Outcome {
        code: status.code(),
        signal: status.signal(),
        timed_out,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// End a child scenario: flush and exit with `code` without running the
/// rest of the test harness (or anything a fork left behind).
pub fn exit(code: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: _exit ends the process at once; nothing runs after it.
    unsafe { libc::_exit(code) }
}
