//! What the `uswap run` test binaries share: running `uswap` as this user
//! or as `nobody`, in each fault mode, compiling the small C programs, and
//! reading the `--stats` block.
#![allow(dead_code)] // each test binary uses some of it

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub const PYTHON: &str = "/usr/bin/python3";

/// The preload library beside the `uswap` under test, built (or found up
/// to date) once per test binary: `cargo test` builds the command line and
/// the library's test harness, not the library itself, and a stale one
/// left by an earlier build would test old code.
pub fn preload_built() {
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

pub fn uswap(args: &[&str], env: &[(&str, &str)]) -> Output {
    preload_built();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_uswap"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run uswap")
}

/// A fault mode a test runs `uswap run` in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// As an ordinary user: this one, or `nobody` when this is root.
    Sigbus,
    /// As this user, who has the privilege for kernel faults.
    Handler,
}

impl Mode {
    /// The modes this user can test: SIGBUS mode always; handler-thread
    /// mode where the privilege is there (else its refusal is checked).
    pub fn all() -> Vec<Mode> {
        let sysctl = std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd").unwrap_or_default();
        if root() || sysctl.trim() == "1" {
            vec![Mode::Sigbus, Mode::Handler]
        } else {
            assert!(refused_without_privilege());
            vec![Mode::Sigbus]
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Mode::Sigbus => "sigbus",
            Mode::Handler => "handler",
        }
    }
}

/// `uswap run` in `mode`: `args` start with "run"; `--mode` goes after it.
pub fn uswap_in(mode: Mode, args: &[&str], env: &[(&str, &str)]) -> Output {
    use std::os::unix::process::CommandExt;
    preload_built();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_uswap"));
    cmd.args(&args[..1])
        .args(["--mode", mode.name()])
        .args(&args[1..]);
    if mode == Mode::Sigbus && root() {
        cmd.uid(NOBODY).gid(NOBODY);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run uswap")
}

pub const NOBODY: u32 = 65534;

/// A temporary directory `nobody` may read and run programs from (and,
/// with `writable`, write to).
pub fn open_dir(writable: bool) -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let mode = if writable { 0o1777 } else { 0o755 };
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(mode)).unwrap();
    dir
}

pub fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A count from the `--stats` block, e.g. `swap-ins 123`.
pub fn stat(err: &str, name: &str) -> u64 {
    number_after(err, &format!("{name} "))
}

/// The number that follows the first `marker` in `text`, up to a
/// separator.
pub fn number_after<T: std::str::FromStr>(text: &str, marker: &str) -> T {
    text.split(marker)
        .nth(1)
        .and_then(|r| r.split([',', ')', ';', ' ', '\n']).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number after {marker:?} in {text}"))
}

/// Compile `tests/programs/NAME.c` into `dir`.
pub fn compile(name: &str, dir: &Path) -> PathBuf {
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
/// with `budget`, swap device `swap` (None: the default, a file in
/// $TMPDIR) and `--stats`, in each of `modes`:
/// every run succeeds with the plain run's output, and no thread of
/// uswap's is named as the program's.  Returns the plain output and each
/// mode's stderr (the statistics), for the caller's own checks.
pub fn under_uswap(
    name: &str,
    args: &[&str],
    budget: &str,
    swap: Option<&str>,
    modes: &[Mode],
) -> (Vec<u8>, Vec<(Mode, String)>) {
    let dir = open_dir(false);
    let bin = compile(name, dir.path());
    let bin = bin.to_str().unwrap();
    let plain = Command::new(bin).args(args).output().unwrap();
    assert!(
        plain.status.success(),
        "{name} plain: {}",
        String::from_utf8_lossy(&plain.stderr)
    );
    let mut errs = Vec::new();
    for &mode in modes {
        let mut run = vec!["run", "--budget", budget, "--stats"];
        if let Some(swap) = swap {
            run.extend_from_slice(&["--swap", swap]);
        }
        run.extend_from_slice(&["--", bin]);
        run.extend_from_slice(args);
        let out = uswap_in(mode, &run, &[]);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{name} {mode:?}: {:?}: {err}", out.status);
        assert_eq!(out.stdout, plain.stdout, "{name} {mode:?}: {err}");
        // uswap's own threads are not the program's to be warned of.
        assert!(!err.contains("blocks SIGBUS"), "{name} {mode:?}: {err}");
        errs.push((mode, err));
    }
    (plain.stdout, errs)
}

/// [`under_uswap`] on a 256 MiB RAM swap device, where at least
/// `evictions` pages went out in every mode.
pub fn same_under_uswap(name: &str, args: &[&str], budget: &str, modes: &[Mode], evictions: u64) {
    for (mode, err) in under_uswap(name, args, budget, Some("ram:256M"), modes).1 {
        assert!(
            stat(&err, "evictions") > evictions,
            "{name} {mode:?}: too little went out: {err}"
        );
    }
}

/// Handler-thread mode without the privilege for kernel faults: refused,
/// in one line that says what to do.  Checked as this user, or as
/// `nobody` when this is root.
pub fn refused_without_privilege() -> bool {
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
        .args([
            "run", "--mode", "handler", "--budget", "8M", "--swap", "ram:32M", "--", "true",
        ])
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

/// A cgroup v1 memory group the test makes (as root, where the v1 memory
/// controller is mounted at /sys/fs/cgroup/memory), to hold a process tree
/// and measure it as a whole: its anonymous memory at its peak (sampled
/// from `memory.stat` every 5 ms), and the OOM kills a limit caused.
/// Removed at drop.
pub struct MemoryGroup {
    dir: PathBuf,
}

impl MemoryGroup {
    /// A new group, with `limit` bytes as its limit (None: none); None
    /// where this is not root or there is no v1 memory controller.
    pub fn new(limit: Option<u64>) -> Option<MemoryGroup> {
        use std::os::unix::fs::chown;
        let base = Path::new("/sys/fs/cgroup/memory");
        if !root() || !base.join("memory.limit_in_bytes").exists() {
            return None;
        }
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = base.join(format!("uswap-test-{}-{n}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        let g = MemoryGroup { dir };
        if let Some(l) = limit {
            std::fs::write(g.dir.join("memory.limit_in_bytes"), l.to_string()).unwrap();
        }
        // So that a process that became `nobody` may move itself in.
        chown(g.dir.join("cgroup.procs"), Some(NOBODY), Some(NOBODY)).unwrap();
        Some(g)
    }

    /// Run `cmd` in the group (it moves itself in before its `exec`),
    /// sampling the group's anonymous memory while it runs; returns its
    /// output and the peak in bytes.
    pub fn run(&self, cmd: &mut Command) -> (Output, u64) {
        use std::os::unix::process::CommandExt;
        let procs = std::ffi::CString::new(self.dir.join("cgroup.procs").to_str().unwrap()).unwrap();
        // SAFETY: open, write and close, all async-signal-safe, in the
        // child before its exec.
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
                if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(fd);
                Ok(())
            })
        };
        let stat = self.dir.join("memory.stat");
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let sampler = s.spawn(|| {
                let mut peak = 0;
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Ok(t) = std::fs::read_to_string(&stat) {
                        peak = peak.max(number_after::<u64>(&t, "total_rss "));
                    }
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                peak
            });
            let out = cmd.output().expect("run the command");
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            (out, sampler.join().unwrap())
        })
    }

    /// OOM kills in the group (`memory.oom_control`'s `oom_kill`).
    pub fn oom_kills(&self) -> u64 {
        let t = std::fs::read_to_string(self.dir.join("memory.oom_control")).unwrap();
        number_after(&t, "oom_kill ")
    }

    /// Times the group's limit refused a charge (`memory.failcnt`): 0
    /// when the tree never pressed on it.
    pub fn failcnt(&self) -> u64 {
        std::fs::read_to_string(self.dir.join("memory.failcnt"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }
}

impl Drop for MemoryGroup {
    fn drop(&mut self) {
        // Its processes are gone (the test waited for them); the kernel
        // may take a moment to let go of the group.
        for _ in 0..100 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

/// What the tree may hold past budget + overrun: the supervisor, and what
/// the members fault in between two ticks of the arbiter (docs/DESIGN.md).
pub const OVERHEAD: u64 = 16 << 20;

/// Run `sh -c script` plainly and under `uswap run --budget budget`
/// (with `extra` options) in each mode, each in a memory group of its
/// own: the same output every time, the plain tree at least three times
/// the budget, and the paged tree within budget + 10% + [`OVERHEAD`].
/// Returns each mode's stderr.
pub fn tree_within_budget(
    script: &str,
    budget_mib: u64,
    extra: &[&str],
    dir: &std::path::Path,
) -> Vec<String> {
    let Some(g) = MemoryGroup::new(None) else {
        eprintln!("not root, or no cgroup v1 memory controller: the tree's memory is not measured");
        return Vec::new();
    };
    let budget = budget_mib << 20;
    // The plain tree's peak depends on how its members overlap (`make
    // -j2`'s two large compilers may start apart on a busy machine): up
    // to three runs, the highest peak kept, before it is called too small.
    let mut runs = Vec::new();
    for _ in 0..3 {
        let (out, peak) = g.run(Command::new("sh").args(["-c", script]).current_dir(dir));
        assert!(
            out.status.success(),
            "plain: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        runs.push((out, peak));
        if peak >= 3 * budget {
            break;
        }
    }
    drop(g);
    let (plain, plain_peak) = runs.into_iter().max_by_key(|r| r.1).expect("one run at least");
    assert!(
        plain_peak >= 3 * budget,
        "the plain tree holds {} MiB, not three times the {budget_mib} MiB budget: the test pages too little",
        plain_peak >> 20
    );
    let mut errs = Vec::new();
    for mode in Mode::all() {
        let g = MemoryGroup::new(None).unwrap();
        let b = format!("{budget_mib}M");
        // `--stats`: each member's counters on stderr at its exit, so that
        // a tree past its bound says whether uswap saw it there (resident
        // at most, over budget, unevictable) or the memory was not its.
        let mut args = vec!["run", "--stats", "--mode", mode.name(), "--budget", &b];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "sh", "-c", script]);
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_uswap"));
        cmd.args(&args).current_dir(dir);
        if mode == Mode::Sigbus {
            use std::os::unix::process::CommandExt;
            cmd.uid(NOBODY).gid(NOBODY);
        }
        preload_built();
        let (out, peak) = g.run(&mut cmd);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{mode:?}: {:?}: {err}", out.status);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&plain.stdout),
            "{mode:?}: {err}"
        );
        let bound = budget + budget / 10 + OVERHEAD;
        assert!(
            peak <= bound,
            "{mode:?}: the tree held {} MiB at its peak, past {} MiB (budget {budget_mib} MiB, plain {} MiB): {err}",
            peak >> 20,
            bound >> 20,
            plain_peak >> 20
        );
        eprintln!(
            "{mode:?}: tree peak {} MiB under a {budget_mib} MiB budget (plain {} MiB)",
            peak >> 20,
            plain_peak >> 20
        );
        errs.push(err);
    }
    errs
}
