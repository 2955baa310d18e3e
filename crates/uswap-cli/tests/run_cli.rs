//! `uswap run`: unmodified programs with their malloc heap paged by uswap,
//! their output compared with a run without it, in both fault modes:
//! SIGBUS mode as an ordinary user (as `nobody` when the suite runs as
//! root: a user-mode-only userfaultfd, all such a user gets), and
//! handler-thread mode (`--mode handler`) where this user has the
//! privilege for kernel faults (root, as the suite runs in CI); without
//! it, the one-line refusal is checked instead.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use uswap_bench::workload::remote::{NbdPlugin, NbdServer};

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
/// `PYTHONMALLOC=malloc`, malloc.  In both modes: in SIGBUS mode the
/// modules Python reads at start-up land in fresh heap buffers through
/// `read(2)`, which pinning lets through.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at several times its budget: run in the release pass (CI runs both)"
)]
fn python_builds_a_dict_four_times_the_budget() {
    assert!(
        Path::new(PYTHON).exists(),
        "{PYTHON} is missing: install Debian's python3 (scripts/check does)"
    );
    let n = "400000";
    let plain = Command::new(PYTHON).args(["-c", DICT, n]).output().unwrap();
    assert!(plain.status.success());
    for mode in Mode::all() {
        for allocator in ["pymalloc", "malloc"] {
            let out = uswap_in(
                mode,
                &[
                    "run", "--budget", "24M", "--swap", "ram:256M", "--stats", "--", PYTHON, "-c", DICT, n,
                ],
                &[("PYTHONMALLOC", allocator)],
            );
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{mode:?} {allocator}: {err}");
            assert_eq!(out.stdout, plain.stdout, "{mode:?} {allocator}: {err}");
            assert!(
                stat(&err, "swap-ins") + stat(&err, "pages read ahead") > 5000,
                "{mode:?} {allocator}: {err}"
            );
            assert!(stat(&err, "evictions") > 10000, "{mode:?} {allocator}: {err}");
            assert_eq!(stat(&err, "over budget"), 0, "{mode:?} {allocator}: {err}");
        }
    }
}

/// A C program's own anonymous mappings, four times the budget
/// (`programs/maps.c`): fresh ones read as zeros, written data reads back
/// after going out, `madvise(MADV_DONTNEED)` zeroes, `mremap` grows
/// (moving) with the contents kept and the new tail zero, `munmap` in
/// pieces, and a new mapping reads as zeros again.
#[test]
fn a_programs_own_mappings_are_paged() {
    same_under_uswap("maps", &["32"], "8M", &Mode::all(), 8000);
}

/// A runtime's reservations (`programs/reserve.c`, as OpenJDK and V8 use
/// them): reserved inaccessible at a hint or trimmed to an alignment,
/// committed by `mmap(MAP_FIXED)` over them or by `mprotect`, uncommitted
/// by `mmap(MAP_FIXED, PROT_NONE)` or `madvise`: written data reads back
/// after going out, uncommitted memory reads as zeros, and the memory is
/// paged (the program mallocs nothing: what goes out is the reservations').
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at several times its budget: run in the release pass (CI runs both)"
)]
fn reservations_are_paged_as_runtimes_commit_them() {
    same_under_uswap("reserve", &["32"], "8M", &Mode::all(), 10000);
}

/// Four threads, started after uswap, each allocating, writing, checking,
/// freeing and reallocating 16 MiB of small blocks under a 16 MiB budget
/// (`programs/threads.c`).
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at several times its budget: run in the release pass (CI runs both)"
)]
fn threads_allocate_four_times_the_budget() {
    same_under_uswap("threads", &["16"], "16M", &Mode::all(), 20000);
}

/// In SIGBUS mode, a thread that blocks SIGBUS before its first
/// allocation: its `pthread_sigmask` keeps SIGBUS open (before,
/// its blocks were routed to glibc's allocator, outside the paged heap,
/// for the kernel would end the process at its first fault), so it
/// allocates from the heap and its faults are served, as the other three
/// threads'.  As any user: SIGBUS mode needs no privilege.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at several times its budget: run in the release pass (CI runs both)"
)]
fn a_thread_blocking_sigbus_is_served() {
    same_under_uswap("threads", &["16", "block-sigbus"], "16M", &[Mode::Sigbus], 10000);
}

/// In SIGBUS mode, a thread whose first call into uswap is a fault
/// (`programs/first_touch.c`: it reads its parent's swapped-out memory
/// before it allocates, then allocates as much again): its blocks come
/// from the paged heap and go out, as every thread's.  Before, the route
/// was decided inside the fault handler, where every signal is blocked,
/// and the thread was taken for one that blocks SIGBUS: its 48 MiB were
/// glibc's, outside the budget (9.5 K evictions, not the 20 K+ that
/// paging both halves through a 16 MiB budget makes: 35 K here).  What a Go
/// program's threads met (`runtimes::go_with_cgo`, now and then, under
/// load: a tree at 126 MiB under a 40 MiB budget).
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at several times its budget: run in the release pass (CI runs both)"
)]
fn a_thread_whose_first_touch_is_a_fault_allocates_from_the_heap() {
    // The default swap device, a file: the fault reads the page back
    // with `pread`, which the library interposes (the RAM device reads
    // none).
    for (mode, err) in under_uswap("first_touch", &["48"], "16M", None, &[Mode::Sigbus]).1 {
        assert!(
            stat(&err, "evictions") > 20000,
            "{mode:?}: the thread's blocks did not go out: {err}"
        );
    }
}

/// The kernel touching swapped-out heap memory (`programs/kernel_io.c`):
/// `read(2)` into a buffer that is out, `send(2)` from one that is out
/// through a socket pair (to a forked child that touches no heap), and the
/// program's own SIGBUS handler, which still gets the program's SIGBUS.
/// Handler-thread mode serves the kernel's faults; SIGBUS mode pins the
/// buffers of `read` and `send` for the call.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at several times its budget: run in the release pass (CI runs both)"
)]
fn the_kernel_reads_and_writes_swapped_out_buffers() {
    same_under_uswap("kernel_io", &["8"], "8M", &Mode::all(), 8000);
}

/// GNU sort of a file three times the budget (its 12 MiB of lines and
/// their pointers, under 8 MiB, which holds the process's whole anonymous
/// memory, uswap's own included), its
/// buffer (-S) as large as the file, reading it with `fread` into a heap buffer that may be out
/// (stdio reads straight into the caller's buffer when it is large: the
/// kernel's fault, served by a handler thread, or pinned by the
/// interposed `fread_unlocked` in SIGBUS mode), with two threads whose
/// mutexes live in the heap: the output is the same as without uswap.  The default swap device, a file in $TMPDIR,
/// leaves nothing behind.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at several times its budget: run in the release pass (CI runs both)"
)]
fn sort_of_a_file_three_times_the_budget() {
    let dir = open_dir(false);
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
    for mode in Mode::all() {
        let tmp = open_dir(true);
        let out = uswap_in(
            mode,
            &[
                "run", "--budget", "8M", "--stats", "--", "sort", "-S", "12M", input,
            ],
            &[("LC_ALL", "C"), ("TMPDIR", tmp.path().to_str().unwrap())],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{mode:?}: {err}");
        assert!(
            out.stdout == plain.stdout,
            "{mode:?}: sort's output differs under uswap: {err}"
        );
        assert!(stat(&err, "evictions") > 1000, "{mode:?}: {err}");
        assert_eq!(
            std::fs::read_dir(tmp.path()).unwrap().count(),
            0,
            "{mode:?}: the default swap file was left in $TMPDIR"
        );
    }
}

#[test]
fn an_ordinary_user_is_told_what_handler_mode_needs() {
    assert!(refused_without_privilege());
}

/// Without `--mode`, every user gets SIGBUS mode under the system-call
/// guard (the faster mode; the guard covers what handler-thread mode was
/// picked for); with `--syscall-guard off`, handler-thread mode where the
/// privilege for kernel faults is there, else SIGBUS mode: the statistics
/// at exit say which.
#[test]
fn the_default_mode_is_sigbus_under_the_guard() {
    use std::os::unix::process::CommandExt;
    preload_built();
    let sysctl = std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd").unwrap_or_default();
    let mut users = vec![(NOBODY, sysctl.trim() == "1")];
    if root() {
        users.push((0, true));
    }
    let sigbus = "SIGBUS mode (user-mode faults only)";
    for (user, privileged) in users {
        for guard in ["on", "off"] {
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_uswap"));
            if root() {
                cmd.uid(user).gid(user);
            }
            let out = cmd
                .args([
                    "run",
                    "--budget",
                    "8M",
                    "--swap",
                    "ram:32M",
                    "--syscall-guard",
                    guard,
                    "--stats",
                    "--",
                    "true",
                ])
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success(),
                "uid {user}, guard {guard}: {:?}: {err}",
                out.status
            );
            let says = match (guard, privileged) {
                ("off", true) => "handler-thread mode",
                // Root's userfaultfd serves kernel faults too: SIGBUS
                // mode without "user-mode faults only".
                (_, true) => "SIGBUS mode",
                _ => sigbus,
            };
            assert!(
                err.contains("uswap run: budget 8 MiB") && err.contains(says),
                "uid {user}, guard {guard}: {err}"
            );
            if says == "handler-thread mode" {
                assert!(!err.contains("SIGBUS mode"), "uid {user}, guard {guard}: {err}");
            } else {
                assert!(
                    !err.contains("handler-thread mode"),
                    "uid {user}, guard {guard}: {err}"
                );
            }
        }
    }
}

/// Bad input: one line each, saying what is wrong.
#[test]
fn bad_input_gets_one_line() {
    for (args, says) in [
        (&["run", "--budget", "7%x", "--", "true"][..], "--budget"),
        (&["run", "--budget", "100K", "--", "true"], "at least 1M"),
        (
            &["run", "--swap", "disk:1G", "--", "true"],
            "a swap device is ram:SIZE, file:PATH:SIZE[:grow][:plain] (or file:DIR, a file there that grows), zram:SIZE",
        ),
        (
            &["run", "--swap", "zram:1G:zstd:99", "--", "true"],
            "zstd level \"99\" is not a level",
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

const MULTIPROCESSING: &str = r#"
import hashlib, multiprocessing as mp, sys
n = int(sys.argv[1])
data = [("%d-" % i) * 20 for i in range(n)]
def digest(rng):
    h = hashlib.sha256()
    for i in range(*rng):
        h.update(data[i].encode())
    return h.hexdigest()
if __name__ == "__main__":
    mp.set_start_method("fork")
    k = 4
    parts = [(j * n // k, (j + 1) * n // k) for j in range(k)]
    with mp.Pool(k) as p:
        got = p.map(digest, parts)
    assert got == [digest(r) for r in parts], "a child saw other data"
    print(hashlib.sha256("".join(got).encode()).hexdigest())
"#;

/// `fork` without `exec`: Python's multiprocessing with the fork start
/// method, four children reading slices of a list about four times the
/// budget that the parent built (most of it swapped out at the fork) and
/// returning digests, which must be the parent's.  The default swap
/// device, a file: the slots the children may read are held by the parent
/// until they are done, and nothing is left in $TMPDIR.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at several times its budget: run in the release pass (CI runs both)"
)]
fn multiprocessing_children_read_their_parents_memory() {
    let n = "400000";
    let dir = open_dir(false);
    let script = dir.path().join("mp.py");
    std::fs::write(&script, MULTIPROCESSING).unwrap();
    let script = script.to_str().unwrap();
    let plain = Command::new(PYTHON).args([script, n]).output().unwrap();
    assert!(
        plain.status.success(),
        "{}",
        String::from_utf8_lossy(&plain.stderr)
    );
    for mode in Mode::all() {
        let tmp = open_dir(true);
        let out = uswap_in(
            mode,
            &["run", "--budget", "24M", "--stats", "--", PYTHON, script, n],
            &[("TMPDIR", tmp.path().to_str().unwrap())],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{mode:?}: {err}");
        assert_eq!(out.stdout, plain.stdout, "{mode:?}: {err}");
        assert!(stat(&err, "evictions") > 10000, "{mode:?}: {err}");
        assert_eq!(
            std::fs::read_dir(tmp.path()).unwrap().count(),
            0,
            "{mode:?}: the default swap file was left in $TMPDIR"
        );
    }
}

/// Compressed swap under `uswap run`: the dict on a compressed device, and
/// multiprocessing's forked children reading their parent's memory from a
/// tier (a small store in front of a file: the file's slots the children
/// may read are held for them), in both modes.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at several times its budget: run in the release pass (CI runs both)"
)]
fn python_on_compressed_swap_and_a_tier() {
    let n = "400000";
    let dir = open_dir(false);
    let script = dir.path().join("mp.py");
    std::fs::write(&script, MULTIPROCESSING).unwrap();
    let script = script.to_str().unwrap();
    let plain_dict = Command::new(PYTHON).args(["-c", DICT, n]).output().unwrap();
    let plain_mp = Command::new(PYTHON).args([script, n]).output().unwrap();
    assert!(plain_dict.status.success() && plain_mp.status.success());
    for mode in Mode::all() {
        let out = uswap_in(
            mode,
            &[
                "run",
                "--budget",
                "24M",
                "--swap",
                "zram:256M",
                "--stats",
                "--",
                PYTHON,
                "-c",
                DICT,
                n,
            ],
            &[],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{mode:?}: {err}");
        assert_eq!(out.stdout, plain_dict.stdout, "{mode:?}: {err}");
        assert!(stat(&err, "evictions") > 10000, "{mode:?}: {err}");
        // Python's objects compress: the store at its largest took less
        // than half of what went through it.
        let store = err
            .split("compressed store:")
            .nth(1)
            .unwrap_or_else(|| panic!("{mode:?}: no store line: {err}"));
        let peak: f64 = number_after(store, "at most ");
        let written: f64 = number_after(&err, "swap IO: ");
        assert!(peak > 1.0 && peak < written / 2.0, "{mode:?}: {err}");
        let tmp = open_dir(true);
        let tier = format!("zram:4M,file:{}:256M", tmp.path().join("tier").display());
        let out = uswap_in(
            mode,
            &[
                "run", "--budget", "24M", "--swap", &tier, "--stats", "--", PYTHON, script, n,
            ],
            &[],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{mode:?} tier: {err}");
        assert_eq!(out.stdout, plain_mp.stdout, "{mode:?} tier: {err}");
        assert!(stat(&err, "evictions") > 10000, "{mode:?} tier: {err}");
        assert_eq!(
            std::fs::read_dir(tmp.path()).unwrap().count(),
            0,
            "{mode:?}: the tier's file was left"
        );
    }
}

/// nbdkit's memory plugin (the bench's server) on a socket in `dir`
/// that every user may use (SIGBUS mode's runs are `nobody`'s).
fn nbdkit_in(dir: &Path) -> NbdServer {
    use std::os::unix::fs::PermissionsExt;
    let server = NbdServer::start(NbdPlugin::Memory, 1 << 30, 0.0, dir)
        .expect("nbdkit is missing: install it (apt-get install nbdkit; scripts/check does)");
    std::fs::set_permissions(server.socket(), std::fs::Permissions::from_mode(0o777)).unwrap();
    server
}

/// Swap on another machine's memory, here nbdkit on a socket: Python's
/// dict four times the budget on the export alone, and multiprocessing's
/// forked children reading their parent's memory through a compressed
/// tier with the export behind (each child over connections of its own),
/// in both modes; the output is the plain run's.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at several times its budget: run in the release pass (CI runs both)"
)]
fn python_swaps_to_an_nbd_export() {
    let n = "400000";
    let dir = open_dir(false);
    let server = nbdkit_in(dir.path());
    let uri = server.uri().to_string();
    let script = dir.path().join("mp.py");
    std::fs::write(&script, MULTIPROCESSING).unwrap();
    let script = script.to_str().unwrap();
    let plain_dict = Command::new(PYTHON).args(["-c", DICT, n]).output().unwrap();
    let plain_mp = Command::new(PYTHON).args([script, n]).output().unwrap();
    assert!(plain_dict.status.success() && plain_mp.status.success());
    for mode in Mode::all() {
        let out = uswap_in(
            mode,
            &[
                "run", "--budget", "24M", "--swap", &uri, "--stats", "--", PYTHON, "-c", DICT, n,
            ],
            &[],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{mode:?}: {err}");
        assert_eq!(out.stdout, plain_dict.stdout, "{mode:?}: {err}");
        assert!(stat(&err, "evictions") > 10000, "{mode:?}: {err}");
        assert!(
            stat(&err, "swap-ins") + stat(&err, "pages read ahead") > 5000,
            "{mode:?}: {err}"
        );
        let tier = format!("zram:4M,{uri}");
        let out = uswap_in(
            mode,
            &[
                "run", "--budget", "24M", "--swap", &tier, "--stats", "--", PYTHON, script, n,
            ],
            &[],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{mode:?} tier: {err}");
        assert_eq!(out.stdout, plain_mp.stdout, "{mode:?} tier: {err}");
        assert!(stat(&err, "evictions") > 10000, "{mode:?} tier: {err}");
    }
    // A server that is not there: one line, before the program starts.
    drop(server);
    let out = uswap_in(
        Mode::Sigbus,
        &["run", "--budget", "24M", "--swap", &uri, "--", "true"],
        &[],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("cannot connect") && err.lines().count() == 1,
        "{err}"
    );
}

/// A shell's command substitutions and pipelines: `bash` forks, and the
/// child runs shell code on the heap before it `exec`s or exits.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at several times its budget: run in the release pass (CI runs both)"
)]
fn a_shell_forks_and_its_children_run() {
    let script = r#"x=$(echo hello); y=$( (echo a; echo b) | wc -l ); for i in 1 2 3; do z="$z$(printf %s $i)"; done; echo "$x $y $z""#;
    for mode in Mode::all() {
        let out = uswap_in(
            mode,
            &[
                "run", "--budget", "8M", "--swap", "ram:64M", "--", "bash", "-c", script,
            ],
            &[],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{mode:?}: {err}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "hello 2 123\n",
            "{mode:?}: {err}"
        );
    }
}

/// `--stats` names the processes of the tree that ended without exit
/// handlers (killed, or a raw `exit_group`): a process that only `exec`ed
/// another program did not end, and is not among them (a forked child
/// that `exec`s, as every pyenv shim and command substitution does, once
/// was).  The one killed is.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a process tree under uswap run: run in the release pass (CI runs both)"
)]
fn only_processes_that_ended_unheard_are_said_to() {
    let script = r#"x=$(/bin/echo a); y=$(bash -c "exec /bin/echo b"); bash -c "exec /bin/true"; sh -c 'kill -9 $$'; echo "$x $y""#;
    for mode in Mode::all() {
        let out = uswap_in(
            mode,
            &[
                "run", "--budget", "8M", "--swap", "ram:64M", "--stats", "--", "bash", "-c", script,
            ],
            &[],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{mode:?}: {err}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "a b\n", "{mode:?}: {err}");
        assert!(
            err.contains("uswap run: 1 process ended without exit handlers"),
            "{mode:?}: only the killed sh should be named: {err}"
        );
        let rows: Vec<&str> = err
            .lines()
            .skip_while(|l| !l.contains("ended without exit handlers"))
            .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
            .collect();
        assert!(
            rows.len() == 1 && rows[0].ends_with("sh -c kill -9 $$"),
            "{mode:?}: {rows:?}"
        );
    }
}

/// A server the test started, killed if the test ends before stopping it
/// (a failed assertion), so that none is left running.
struct Server(Option<std::process::Child>);

impl Server {
    /// The process, stopped by the test from here on.
    fn take(mut self) -> std::process::Child {
        self.0.take().expect("taken once")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A free TCP port on the loopback interface.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli (Debian's redis-tools, which redis-server brings)");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A Redis server's arguments: `port`, its RDB file in `dir`, no
/// snapshots of its own, `DEBUG` from the loopback, the log on stdout.
fn redis_args(port: u16, dir: &str) -> Vec<String> {
    let mut a: Vec<String> = [
        "--port",
        &port.to_string(),
        "--save",
        "",
        "--enable-debug-command",
        "local",
    ]
    .map(String::from)
    .to_vec();
    a.extend(["--dir", dir, "--dbfilename", "dump.rdb", "--logfile", ""].map(String::from));
    a
}

/// Wait until the server on `port` answers PONG (not LOADING).
fn redis_ready(port: u16) {
    for _ in 0..300 {
        if redis_cli(port, &["ping"]) == "PONG" {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("redis on port {port} did not come up");
}

/// Redis (Debian's package) holding a dataset about 3.6 times the budget,
/// then `BGSAVE`, a fork whose child writes every key to an RDB file
/// while the parent serves on; a plain Redis restarted from that file has
/// the same `DEBUG DIGEST`.  Redis installs its own SIGBUS handler (its
/// crash report), which uswap keeps behind its own in SIGBUS mode.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at several times its budget: run in the release pass (CI runs both)"
)]
fn redis_bgsave_forks_and_the_rdb_holds_every_key() {
    assert!(
        Path::new("/usr/bin/redis-server").exists(),
        "redis-server is missing: install Debian's redis-server (scripts/check does)"
    );
    use std::os::unix::process::CommandExt;
    preload_built();
    for mode in Mode::all() {
        let dir = open_dir(true);
        let d = dir.path().to_str().unwrap();
        let port = free_port();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_uswap"));
        cmd.args([
            "run",
            "--mode",
            mode.name(),
            "--budget",
            "16M",
            "--swap",
            "ram:256M",
            "--stats",
            "--",
        ])
        .arg("redis-server")
        .args(redis_args(port, d))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
        if mode == Mode::Sigbus && root() {
            cmd.uid(NOBODY).gid(NOBODY);
        }
        let server = Server(Some(cmd.spawn().unwrap()));
        redis_ready(port);
        assert_eq!(
            redis_cli(port, &["debug", "populate", "150000", "key", "256"]),
            "OK"
        );
        let before = redis_cli(port, &["debug", "digest"]);
        assert_eq!(
            redis_cli(port, &["bgsave"]),
            "Background saving started",
            "{mode:?}"
        );
        for _ in 0..1200 {
            if !redis_cli(port, &["info", "persistence"]).contains("rdb_bgsave_in_progress:1") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let info = redis_cli(port, &["info", "persistence"]);
        assert!(info.contains("rdb_last_bgsave_status:ok"), "{mode:?}: {info}");
        assert_eq!(
            redis_cli(port, &["debug", "digest"]),
            before,
            "{mode:?}: the parent's data changed"
        );
        redis_cli(port, &["shutdown", "nosave"]);
        let out = server.take().wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(stat(&err, "evictions") > 10000, "{mode:?}: {err}");
        // A plain Redis on the file the child wrote.
        let port2 = free_port();
        let plain = Server(Some(
            Command::new("redis-server")
                .args(redis_args(port2, d))
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        ));
        redis_ready(port2);
        let after = redis_cli(port2, &["debug", "digest"]);
        redis_cli(port2, &["shutdown", "nosave"]);
        let _ = plain.take().wait();
        assert_eq!(after, before, "{mode:?}: the RDB differs from the dataset");
    }
}

/// A seccomp filter that refuses the `userfaultfd` call, as Docker's and
/// Podman's default profiles do (`programs/nouffd.c`), with EPERM and
/// with ENOSYS: where this user may open /dev/userfaultfd (root here),
/// uswap opens its descriptor there and pages the program (4x its
/// budget); where not (`nobody`), one line names the filter and the fix,
/// and `uswap run` exits 125, its own status, not a shell's 127.  With
/// ENOSYS uswap took the kernel for one without userfaultfd and never
/// tried the device before.
#[test]
fn a_filter_that_refuses_userfaultfd_is_named_and_the_device_is_the_way_round() {
    use std::os::unix::process::CommandExt;
    preload_built();
    let dir = open_dir(false);
    let wrap = compile("nouffd", dir.path());
    let script = "print(len(bytes(64 << 20)))";
    let dev = Path::new("/dev/userfaultfd").exists();
    for errno in ["-eperm", "-enosys"] {
        let mut users = vec![NOBODY];
        if root() && dev {
            users.push(0);
        }
        for user in users {
            let mut cmd = Command::new(&wrap);
            if errno == "-enosys" {
                cmd.arg("-enosys");
            }
            cmd.args([
                env!("CARGO_BIN_EXE_uswap"),
                "run",
                "--mode",
                "sigbus",
                "--budget",
                "16M",
            ])
            .args(["--swap", "ram:256M", "--", PYTHON, "-c", script]);
            if root() && user != 0 {
                cmd.uid(user).gid(user);
            }
            let out = cmd.output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            if user == 0 {
                assert!(out.status.success(), "{errno} root: {:?}: {err}", out.status);
                assert_eq!(
                    String::from_utf8_lossy(&out.stdout),
                    "67108864\n",
                    "{errno}: {err}"
                );
            } else {
                assert_eq!(out.status.code(), Some(125), "{errno} uid {user}: {err}");
                assert!(
                    // The filter, or the container this suite may run in.
                    err.contains("refused") && err.contains("seccomp") && err.contains("/dev/userfaultfd"),
                    "{errno} uid {user}: {err}"
                );
                assert_eq!(err.trim_end().lines().count(), 1, "{errno}: one line: {err}");
            }
        }
    }
}

/// `uswap run`'s own failures (here a budget it cannot read) exit 125, as
/// `docker run`'s do: a wrapper tells them from the program's status.
#[test]
fn uswap_runs_own_failure_has_its_own_exit_status() {
    let out = uswap(&["run", "--budget", "lots", "--", "true"], &[]);
    assert_eq!(
        out.status.code(),
        Some(125),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = uswap(
        &[
            "run", "--budget", "16M", "--swap", "ram:64M", "--", "sh", "-c", "exit 127",
        ],
        &[],
    );
    assert_eq!(
        out.status.code(),
        Some(127),
        "the program's own: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `uswap --version` names the commit it was built from (in a git
/// checkout, as every test run here is).
#[test]
fn the_version_names_the_commit() {
    let out = uswap(&["--version"], &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output();
    if let Some(h) = head.ok().filter(|h| h.status.success()) {
        let commit = String::from_utf8_lossy(&h.stdout).trim().to_string();
        assert!(text.contains(&format!("({commit})")), "{text}");
    }
    assert!(text.starts_with("uswap "), "{text}");
}

/// One copied file runs programs: `uswap` alone in a directory (as
/// `cargo install` or an image leaves it), run from an empty directory,
/// installs the preload library it carries and pages a program 4 times
/// its budget, in handler mode as root and in SIGBUS mode as `nobody`
/// (whose loader must read what it installed).
#[test]
fn one_copied_uswap_runs_programs_from_an_empty_directory() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::os::unix::process::CommandExt;
    let bin = open_dir(false);
    let exe = bin.path().join("uswap");
    std::fs::copy(env!("CARGO_BIN_EXE_uswap"), &exe).unwrap();
    let empty = open_dir(false);
    let tmp = open_dir(true);
    let mut modes = vec![Mode::Sigbus];
    if root() {
        modes.push(Mode::Handler);
    }
    for mode in modes {
        let mut cmd = Command::new(&exe);
        cmd.args([
            "run",
            "--budget",
            "64M",
            "--mode",
            mode.name(),
            "--stats",
            "--",
            "/usr/bin/python3",
            "-c",
        ])
        .arg("d = [bytes([i % 256]) * 4096 for i in range(65536)]; print(sum(b[0] for b in d))")
        .current_dir(empty.path())
        .env("TMPDIR", tmp.path());
        let uid = if mode == Mode::Sigbus && root() {
            cmd.uid(NOBODY).gid(NOBODY);
            NOBODY
        } else {
            // SAFETY: geteuid has no preconditions.
            unsafe { libc::geteuid() }
        };
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{mode:?}: {err}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "8355840",
            "{mode:?}: {err}"
        );
        assert!(
            stat(&err, "swap-ins") > 0,
            "{mode:?}: nothing came back from swap: {err}"
        );
        // The library it installed: this user's, readable by all, named by
        // its hash; nothing was put beside the executable.
        let dir = tmp.path().join(format!("uswap-preload-{uid}"));
        let libs: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(libs.len(), 1, "{libs:?}");
        let m = std::fs::metadata(&libs[0]).unwrap();
        assert_eq!((m.uid(), m.mode() & 0o777), (uid, 0o644), "{libs:?}");
        assert_eq!(
            std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o755
        );
        assert_eq!(std::fs::read_dir(bin.path()).unwrap().count(), 1);
    }
}

/// The manual pages and completions a package installs come from the
/// command's own definition: every command is in them.
#[test]
fn man_pages_and_completions_cover_every_command() {
    let page = uswap(&["man"], &[]);
    let text = String::from_utf8_lossy(&page.stdout);
    assert!(page.status.success() && text.contains(".TH uswap 1"), "{text}");
    for command in [
        "run",
        "stat",
        "top",
        "gdb",
        "seccomp-profile",
        "completions",
        "bench",
    ] {
        // roff escapes every hyphen of the name.
        let listed = format!("uswap-{command}(1)").replace('-', "\\-");
        assert!(text.contains(&listed), "{command} is not in uswap(1)");
        let sub = uswap(&["man", command], &[]);
        let sub_text = String::from_utf8_lossy(&sub.stdout);
        assert!(sub_text.contains(&format!(".TH uswap-{command} 1")), "{sub_text}");
    }
    assert!(String::from_utf8_lossy(&uswap(&["man", "run"], &[]).stdout).contains("budget"));
    let bad = uswap(&["man", "nosuch"], &[]);
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("one of demo, run"));
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef uswap"),
        ("fish", "complete -c uswap"),
    ] {
        let out = uswap(&["completions", shell], &[]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && text.contains(marker), "{shell}: {text}");
        assert!(
            text.contains("seccomp-profile") && text.contains("--budget"),
            "{shell}"
        );
    }
}
