//! Programs that change who they run as, under `uswap run`: credential
//! changes reach uswap's threads too (glibc makes every thread repeat
//! them), a forked child that drops privileges and execs is paged as its
//! new user may be, and its paged memory outlives the change.
//!
//! The changes need root: as another user these tests check what that
//! user sees (`setgroups` refused as plainly, `PermissionError`).

mod common;

use common::*;

/// Python's `os.setgroups` in a forked child (`PermissionError` as an
/// ordinary user, done as root), in each mode: it died of SIGSYS, a
/// thread of uswap's made to repeat the call with a list in the heap,
/// which the system-call guard traps.
#[test]
fn setgroups_in_a_forked_child_is_as_plain() {
    let script = "import os\n\
        p = os.fork()\n\
        if p == 0:\n\
        \x20   try:\n\
        \x20       os.setgroups([1, 2, 3]); os.setgroups([]); print('done', flush=True)\n\
        \x20   except PermissionError:\n\
        \x20       print('refused', flush=True)\n\
        \x20   os._exit(0)\n\
        print('status', os.waitpid(p, 0)[1])\n";
    for mode in Mode::all() {
        let as_nobody = mode == Mode::Sigbus && root();
        let want = if root() && !as_nobody {
            "done\nstatus 0\n"
        } else {
            "refused\nstatus 0\n"
        };
        // Enough memory for uswap's threads to be running at the fork.
        let out = uswap_in(
            mode,
            &[
                "run",
                "--budget",
                "16M",
                "--",
                PYTHON,
                "-c",
                &format!("keep = [bytes(4096) for _ in range(16384)]\n{script}"),
            ],
            &[],
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            want,
            "{mode:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Root's program drops to `nobody` and execs, as `runuser`, `su` and
/// `subprocess.run(user=...)` do, in each mode: it exited 127 ("dup3
/// failed": PAM had lowered the descriptor limit under uswap's numbers;
/// in handler-thread mode, `nobody` may not have its userfaultfd), and is
/// now paged as `nobody` may be (SIGBUS mode).
#[test]
fn a_program_that_drops_privileges_runs() {
    if !root() {
        eprintln!("skipped: dropping privileges needs root");
        return;
    }
    for mode in Mode::all() {
        let run = |cmd: &[&str]| {
            let mut args = vec!["run", "--budget", "64M", "--"];
            args.extend_from_slice(cmd);
            let out = uswap(&[&args[..1], &["--mode", mode.name()], &args[1..]].concat(), &[]);
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).to_string(),
                String::from_utf8_lossy(&out.stderr).to_string(),
            )
        };
        let (code, out, err) = run(&["runuser", "-u", "nobody", "--", "/bin/sh", "-c", "id -u"]);
        assert_eq!(
            (code, out.as_str()),
            (Some(0), "65534\n"),
            "{mode:?} runuser: {err}"
        );
        let (code, out, err) = run(&["su", "nobody", "-s", "/bin/sh", "-c", "id -u"]);
        assert_eq!((code, out.as_str()), (Some(0), "65534\n"), "{mode:?} su: {err}");
        let (code, out, err) = run(&[
            PYTHON,
            "-c",
            "import subprocess; print(subprocess.run(['id', '-u'], user=65534, capture_output=True, text=True).stdout, end='')",
        ]);
        assert_eq!(
            (code, out.as_str()),
            (Some(0), "65534\n"),
            "{mode:?} subprocess: {err}"
        );
    }
}

/// Root's swap file where `nobody` may not create one (the default,
/// in a `TMPDIR` of root's that is 0700, as scripts/real-suites runs
/// CPython's tests): a child that drops to `nobody` and execs cannot
/// start paging, and runs unpaged with one line saying why.  It exited
/// 127 before, and 4 of test_subprocess's cases failed in handler mode.
#[test]
fn a_child_that_cannot_page_as_its_new_user_runs_unpaged() {
    use std::os::unix::fs::PermissionsExt;
    if !root() {
        eprintln!("skipped: dropping privileges needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let tmp = dir.path().to_str().unwrap();
    let script = "import subprocess\n\
        r = subprocess.run(['python3', '-c', 'print(len(bytes(64 << 20)))'], user=65534, capture_output=True, text=True)\n\
        print(r.returncode, r.stdout, end='')\n\
        print(r.stderr, end='', file=__import__('sys').stderr)\n";
    // Both modes as root: the parent is root's in each.
    for mode in ["handler", "sigbus"] {
        let out = uswap(
            &[
                "run", "--mode", mode, "--budget", "32M", "--", PYTHON, "-c", script,
            ],
            &[("TMPDIR", tmp)],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{mode}: {:?}: {err}", out.status);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "0 67108864\n",
            "{mode}: {err}"
        );
        assert_eq!(err.matches("runs unpaged").count(), 1, "{mode}: {err}");
        assert!(
            err.contains("uid 65534") && err.contains("Permission denied"),
            "{mode}: {err}"
        );
    }
}

/// A forked child of root's program drops to `nobody` without an exec,
/// then reads its 240 MiB of swapped-out memory and swaps 120 MiB more,
/// under a 64 MiB budget: every byte as written, in parent and child.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at several times its budget: run in the release pass (CI runs both)"
)]
fn paged_memory_outlives_a_change_of_user() {
    if !root() {
        eprintln!("skipped: changing user needs root");
        return;
    }
    let script = r#"
import os, hashlib
blob = [bytes([i % 251]) * 4096 for i in range(60000)]
h = hashlib.sha256(b"".join(blob[::97])).hexdigest()
pid = os.fork()
if pid == 0:
    os.setgroups([]); os.setgid(65534); os.setuid(65534)
    more = [bytes([(i * 7) % 251]) * 4096 for i in range(30000)]
    ok = hashlib.sha256(b"".join(blob[::97])).hexdigest() == h and all(m[0] == (i * 7) % 251 for i, m in enumerate(more))
    print("child", os.getuid(), ok, flush=True)
    os._exit(0 if ok else 1)
_, st = os.waitpid(pid, 0)
print("parent", hashlib.sha256(b"".join(blob[::97])).hexdigest() == h, st)
"#;
    for mode in [Mode::Sigbus, Mode::Handler] {
        let out = uswap(
            &[
                "run",
                "--mode",
                mode.name(),
                "--budget",
                "64M",
                "--",
                PYTHON,
                "-c",
                script,
            ],
            &[],
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "child 65534 True\nparent True 0\n",
            "{mode:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
