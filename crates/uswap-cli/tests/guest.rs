//! `uswap run` as a guest in someone else's process (issue 22): it starts
//! at every size, and nothing the program does with its descriptors,
//! signal masks, stacks, mappings or system calls costs it a byte or a
//! crash.  Each test is a short program doing what ordinary programs do
//! (daemons closing every descriptor, shells reusing numbers, Python's
//! faulthandler and subprocess, a thread blocking every signal), run in
//! SIGBUS mode as an ordinary user and, where this user may, in
//! handler-thread mode, with its output compared to a plain run.

mod common;

use std::process::Command;

use common::*;

/// `uswap run -- /bin/true` with its defaults and with budgets from 64M
/// to 90% of the machine: it starts, runs the program and exits 0 (the
/// heap region is rounded to what the allocator and the pager both take,
/// and handed to mimalloc in arenas it accepts); a budget over the
/// machine's memory is refused in one line.
#[test]
fn it_starts_at_every_size() {
    for mode in Mode::all() {
        for budget in [
            None,
            Some("64M"),
            Some("1G"),
            Some("2G"),
            Some("8G"),
            Some("25%"),
            Some("50%"),
            Some("90%"),
        ] {
            let tmp = open_dir(true);
            let mut args = vec!["run"];
            if let Some(b) = budget {
                args.extend(["--budget", b]);
            }
            args.extend(["--", "/bin/true"]);
            let out = uswap_in(mode, &args, &[("TMPDIR", tmp.path().to_str().unwrap())]);
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success(),
                "{mode:?} --budget {budget:?}: {:?}: {err}",
                out.status
            );
            assert!(err.is_empty(), "{mode:?} --budget {budget:?}: {err}");
        }
    }
    let out = uswap(&["run", "--budget", "1T", "--", "/bin/true"], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("more than this machine's memory"), "{err}");
}

/// A program that closes every descriptor it did not open, four ways
/// (`close_range(3, ~0U, 0)`, `closefrom(3)`, `close` of every number up to
/// the limit, the raw system calls), or puts a file of its own under every
/// number, between writing 48 MiB of heap (three times the budget) and
/// reading it back, three rounds (`programs/descriptors.c`).  uswap's
/// descriptors are above the program's and survive, every byte reads
/// back, and the program's file holds nothing of uswap's.  On the default
/// swap device, an (encrypted) swap file.
#[test]
fn a_program_closing_or_reusing_every_descriptor_loses_nothing() {
    let dir = open_dir(true);
    let bin = compile("descriptors", dir.path());
    let bin = bin.to_str().unwrap();
    for mode in Mode::all() {
        for how in ["close_range", "closefrom", "close_loop", "syscall", "dup2"] {
            let tmp = open_dir(true);
            let file = tmp.path().join("program-file");
            let file = file.to_str().unwrap();
            let out = uswap_in(
                mode,
                &["run", "--budget", "16M", "--stats", "--", bin, "48", how, file],
                &[("TMPDIR", tmp.path().to_str().unwrap())],
            );
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{mode:?} {how}: {:?}: {err}", out.status);
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                "ok\n",
                "{mode:?} {how}: {err}"
            );
            assert!(stat(&err, "evictions") > 10000, "{mode:?} {how}: {err}");
        }
    }
}

/// A shell script that builds a 6 MB string under a 2 MiB budget, then
/// opens files under descriptors 3 to 9 (`exec 4>log4.txt`), and uses the
/// string again: the same output as without uswap, and the files hold
/// only what the script wrote to them.
#[test]
fn a_shell_reusing_descriptor_numbers_loses_nothing() {
    let dir = open_dir(true);
    let script = r#"
printf -v s '%*s' 6000000 x
for fd in 3 4 5 6 7 8 9; do eval "exec $fd>\"$D/log$fd.txt\""; done
echo "${#s}"
t="${s}y"
echo "${#t}" >&4
echo "${t: -3}|"
"#;
    let d = dir.path().to_str().unwrap();
    let plain = Command::new("bash")
        .args(["-c", script])
        .env("D", d)
        .output()
        .unwrap();
    assert!(plain.status.success());
    let log4 = std::fs::read(dir.path().join("log4.txt")).unwrap();
    for mode in Mode::all() {
        for f in std::fs::read_dir(dir.path()).unwrap() {
            std::fs::remove_file(f.unwrap().path()).unwrap();
        }
        let tmp = open_dir(true);
        let swap = format!("file:{}/swap:512M", tmp.path().display());
        let out = uswap_in(
            mode,
            &[
                "run", "--budget", "2M", "--swap", &swap, "--stats", "--", "bash", "-c", script,
            ],
            &[("D", d)],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{mode:?}: {:?}: {err}", out.status);
        assert_eq!(out.stdout, plain.stdout, "{mode:?}: {err}");
        assert_eq!(
            std::fs::read(dir.path().join("log4.txt")).unwrap(),
            log4,
            "{mode:?}: {err}"
        );
        for fd in [3, 5, 6, 7, 8, 9] {
            let len = std::fs::metadata(dir.path().join(format!("log{fd}.txt")))
                .unwrap()
                .len();
            assert_eq!(
                len, 0,
                "{mode:?}: log{fd}.txt holds {len} bytes the script never wrote: {err}"
            );
        }
        assert!(stat(&err, "evictions") > 1000, "{mode:?}: {err}");
    }
}

/// Signal set-ups ordinary programs make, then touching a heap four times
/// the budget (`programs/signals.c`): every signal blocked in main before
/// starting workers, one of them in `sigwait` (a server's pattern); a
/// handler installed with a full `sa_mask` reading swapped-out memory; an
/// alternate signal stack from `malloc` under an `SA_ONSTACK` handler,
/// raised after it could have gone out; SIGBUS blocked and sent with
/// `raise`, which waits until it is unblocked (and the old mask says it
/// was blocked).  In SIGBUS mode each killed the program before: a fault
/// with SIGBUS blocked, a signal frame on a stack that was out.
#[test]
fn signal_masks_and_alternate_stacks_are_the_programs_own() {
    for how in ["block_all", "handler_mask", "altstack", "pending"] {
        same_under_uswap("signals", &["32", how], "8M", &Mode::all(), 5000);
    }
}

const FAULTHANDLER: &str = r#"
import faulthandler, hashlib, sys
assert faulthandler.is_enabled()
d = {i: ("%d-" % i) * 20 for i in range(int(sys.argv[1]))}
print(hashlib.sha256("".join(d.values()).encode()).hexdigest())
"#;

/// `python3 -X faulthandler` (pytest turns it on too): faulthandler's
/// alternate signal stack comes from the heap, and uswap's SIGBUS handler
/// is delivered on it; it stays in while installed.  Killed with SIGSEGV
/// at the first fault before.
#[test]
fn python_with_faulthandler_runs() {
    let n = "200000";
    let plain = Command::new(PYTHON)
        .args(["-X", "faulthandler", "-c", FAULTHANDLER, n])
        .output()
        .unwrap();
    assert!(plain.status.success());
    for mode in Mode::all() {
        let out = uswap_in(
            mode,
            &[
                "run",
                "--budget",
                "16M",
                "--swap",
                "ram:256M",
                "--stats",
                "--",
                PYTHON,
                "-X",
                "faulthandler",
                "-c",
                FAULTHANDLER,
                n,
            ],
            &[],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{mode:?}: {:?}: {err}", out.status);
        assert_eq!(out.stdout, plain.stdout, "{mode:?}: {err}");
        assert!(stat(&err, "evictions") > 5000, "{mode:?}: {err}");
    }
}

/// Python's subprocess pattern in C (`programs/vfork.c`): argument lists of
/// about 1 MB built in the heap and pushed out, every signal blocked,
/// `vfork`, and the child `execv`s with them, 30 times, the lists kept.
/// The child's faults are served (it died of SIGBUS before: its mask
/// blocked it), and the exec leaves nothing held in the parent (each
/// exec's pins stayed before: 30 MiB resident on a 16 MiB budget).
#[test]
fn vfork_children_exec_with_arguments_that_were_out() {
    let dir = open_dir(false);
    let bin = compile("vfork", dir.path());
    for mode in Mode::all() {
        let out = uswap_in(
            mode,
            &["run", "--budget", "16M", "--swap", "ram:256M", "--stats", "--", bin.to_str().unwrap(), "48", "30"],
            &[],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{mode:?}: {:?}: {err}", out.status);
        assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n", "{mode:?}: {err}");
        let resident: f64 = number_after(&err, "resident now ");
        assert!(resident <= 16.5, "{mode:?}: {resident} MiB resident at the end: {err}");
        assert_eq!(stat(&err, "over budget"), 0, "{mode:?}: {err}");
    }
}
