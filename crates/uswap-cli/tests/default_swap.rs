//! `uswap run`'s default swap: a file that grows as pages go out, up to
//! what its file system can spare less a reserve, with no multiple of the
//! budget capping what a program may hold.

mod common;

use std::process::Command;

use common::*;

/// A dict of `n` entries and its digest, in Python (about 200 bytes each).
const DICT: &str = "import sys, hashlib\n\
    n = int(sys.argv[1])\n\
    d = {i: (b'%08d' % i) * 12 for i in range(n)}\n\
    h = hashlib.sha256()\n\
    for i in range(0, n, 7): h.update(d[i])\n\
    print(len(d), h.hexdigest())\n";

/// A Python program of about 400 MB under a 16 MiB budget, with the
/// default options, in each mode: the same output as a plain run.  The
/// default swap was a file of eight times the budget (128 MiB), and the
/// program was killed with "0 of 32767 swap slots free".
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at several times its budget: run in the release pass (CI runs both)"
)]
fn a_program_twenty_five_times_its_budget_runs_with_the_defaults() {
    let plain = Command::new(PYTHON)
        .args(["-c", DICT, "1600000"])
        .output()
        .unwrap();
    assert!(plain.status.success());
    for mode in Mode::all() {
        let out = uswap_in(
            mode,
            &["run", "--budget", "16M", "--", PYTHON, "-c", DICT, "1600000"],
            &[],
        );
        assert!(
            out.status.success(),
            "{mode:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.stdout, plain.stdout, "{mode:?}");
    }
}

/// The default file holds what swap holds: after six rounds of 200 MB
/// allocated and freed under a 16 MiB budget, the file's allocated blocks
/// (found by probing above the descriptor limit, where uswap keeps its
/// descriptors) are under twice the largest round, though it may grow to
/// what the disk can spare.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at several times its budget: run in the release pass (CI runs both)"
)]
fn the_default_file_holds_what_swap_holds() {
    let script = "import os, resource\n\
        for r in range(6):\n\
        \x20   a = [bytes([r]) * 4000 for _ in range(50000)]\n\
        \x20   del a\n\
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n\
        for fd in range(soft, min(hard, 70000)):\n\
        \x20   try:\n\
        \x20       st = os.fstat(fd)\n\
        \x20   except OSError:\n\
        \x20       continue\n\
        \x20   if st.st_size > 1 << 30:\n\
        \x20       print(st.st_size, st.st_blocks * 512)\n";
    let out = uswap_in(
        Mode::Sigbus,
        &["run", "--budget", "16M", "--", PYTHON, "-c", script],
        &[],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut fields = text.split_whitespace().map(|v| v.parse::<u64>().unwrap());
    let (size, allocated) = (fields.next().expect("the swap file"), fields.next().unwrap());
    assert!(size > 1 << 30, "{text}");
    assert!(
        allocated < 400 << 20,
        "{} MiB allocated of {} MiB",
        allocated >> 20,
        size >> 20
    );
}

/// A disk with no room left for the default file (a 600 MB file system
/// of its own as $TMPDIR): one line says the file grows no further, then
/// the program is killed past its budget's bound, as a memory cgroup
/// whose swap is full would, in one more line.  Needs root (a loop
/// mount); CI runs as root.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at several times its budget: run in the release pass (CI runs both)"
)]
fn a_full_disk_is_said_in_one_line() {
    if !root() {
        eprintln!("skipped: a loop mount needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("small.img");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    std::fs::File::create(&img).unwrap().set_len(600 << 20).unwrap();
    let ok = |c: &mut Command| assert!(c.status().unwrap().success(), "{c:?}");
    ok(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&img));
    ok(Command::new("mount").arg("-o").arg("loop").arg(&img).arg(&mnt));
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _mounted = Unmount(mnt.clone());
    let m = mnt.to_str().unwrap();
    let out = uswap(
        &["run", "--budget", "16M", "--", PYTHON, "-c", DICT, "2000000"],
        &[("TMPDIR", m)],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert_eq!(err.matches("the swap file grows no further").count(), 1, "{err}");
    assert_eq!(err.matches("uswap: out of memory").count(), 1, "{err}");
    assert!(err.contains("its file system is at its reserve"), "{err}");
    assert!(!err.contains("dmesg"), "{err}");
}
