//! `uswap run` as a guest in someone else's process: it starts
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
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at several times its budget: run in the release pass (CI runs both)"
)]
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
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at several times its budget: run in the release pass (CI runs both)"
)]
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
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at several times its budget: run in the release pass (CI runs both)"
)]
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
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at several times its budget: run in the release pass (CI runs both)"
)]
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
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at several times its budget: run in the release pass (CI runs both)"
)]
fn vfork_children_exec_with_arguments_that_were_out() {
    let (plain, runs) = under_uswap("vfork", &["48", "30"], "16M", Some("ram:256M"), &Mode::all());
    assert_eq!(String::from_utf8_lossy(&plain), "ok\n");
    for (mode, err) in runs {
        let resident: f64 = number_after(&err, "resident now ");
        assert!(
            resident <= 16.5,
            "{mode:?}: {resident} MiB resident at the end: {err}"
        );
        assert_eq!(stat(&err, "over budget"), 0, "{mode:?}: {err}");
    }
}

/// The guard's table of system calls that take a buffer (the preload
/// library's own, compiled here too).
#[allow(dead_code)]
#[path = "../../uswap-preload/src/guard/table.rs"]
mod table;

/// Set in the child that `every_system_call_with_a_buffer_gets_it` runs
/// under `uswap run`: the test's body is the child's.
const CHILD: &str = "USWAP_GUEST_SYSCALLS";

/// Every x86-64 system call that takes a buffer (the guard's table, 240
/// calls), called from a program under `uswap run` in SIGBUS mode as an
/// ordinary user with its buffers in the paged heap, first swapped out,
/// then read back (clean: write-protected until written): each gives the
/// answer it gives with buffers that never left memory, none `EFAULT`.
/// Arguments are what makes each call harmless here (a temporary file or
/// a non-blocking socket for its descriptor, lengths of 64, empty paths,
/// zeroed structures): many calls then fail early with another error,
/// but every one reads or writes its buffers as the kernel does.  Without
/// the guard (`--syscall-guard off`) the same run must find calls that
/// fail with EFAULT: the test can fail.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at several times its budget: run in the release pass (CI runs both)"
)]
fn every_system_call_with_a_buffer_gets_it() {
    if std::env::var_os(CHILD).is_some() {
        return syscalls_child();
    }
    let exe = std::env::current_exe().unwrap();
    let dir = open_dir(true);
    for guard in ["on", "off"] {
        let out = uswap_in(
            Mode::Sigbus,
            &[
                "run",
                "--budget",
                "8M",
                "--swap",
                "ram:128M",
                "--syscall-guard",
                guard,
                "--",
                exe.to_str().unwrap(),
                "--exact",
                "every_system_call_with_a_buffer_gets_it",
                "--nocapture",
                "--test-threads",
                "1",
            ],
            &[(CHILD, "1"), ("TMPDIR", dir.path().to_str().unwrap())],
        );
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        let differ: u32 = number_after(&text, "calls differ: ");
        let calls: u32 = number_after(&text, "calls made: ");
        assert!(calls as usize >= table::CALLS.len() - 4, "guard {guard}: {text}");
        if guard == "on" {
            assert!(out.status.success(), "guard on: {:?}: {text}", out.status);
            assert_eq!(differ, 0, "guard on: {text}");
        } else {
            assert!(differ >= 20, "guard off: only {differ} calls failed: {text}");
        }
    }
}

/// The child's part: call every call of the table three ways, compare.
fn syscalls_child() {
    use table::{Buf, CALLS};
    // Calls that would end or stop this process, or trace it.
    const SKIP: [&str; 4] = ["rt_sigsuspend", "ptrace", "seccomp", "reboot"];
    const PAGE: usize = 4096;
    let dir = std::env::var("TMPDIR").unwrap();
    let path = std::ffi::CString::new(format!("{dir}/syscalls-{}", std::process::id())).unwrap();
    // SAFETY: plain calls with valid arguments.
    let (file, sock) = unsafe {
        let f = libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CREAT, 0o600);
        assert!(f >= 0);
        assert_eq!(libc::write(f, [7u8; PAGE].as_ptr().cast(), PAGE), PAGE as isize);
        let mut sv = [0; 2];
        assert_eq!(
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_DGRAM | libc::SOCK_NONBLOCK,
                0,
                sv.as_mut_ptr()
            ),
            0
        );
        (f, sv[0])
    };
    let fd_first = [
        "read",
        "write",
        "pread64",
        "pwrite64",
        "readv",
        "writev",
        "preadv",
        "pwritev",
        "preadv2",
        "pwritev2",
        "fstat",
        "fstatfs",
        "getdents",
        "getdents64",
        "ioctl",
        "fcntl",
        "fgetxattr",
        "fsetxattr",
        "flistxattr",
        "fremovexattr",
        "sendfile",
        "copy_file_range",
    ];
    let socket_first = [
        "connect",
        "accept",
        "accept4",
        "sendto",
        "recvfrom",
        "sendmsg",
        "recvmsg",
        "sendmmsg",
        "recvmmsg",
        "bind",
        "getsockname",
        "getpeername",
        "setsockopt",
        "getsockopt",
    ];
    let sigset_size = |name: &str| {
        name.starts_with("rt_sig")
            || ["epoll_pwait", "epoll_pwait2", "ppoll", "signalfd", "signalfd4"].contains(&name)
    };
    /// One call's buffers, in the heap: the arguments' blocks.
    struct Bufs {
        blocks: Vec<Vec<u8>>,
    }
    // Build a call's arguments over `blocks` (allocated here: heap).
    let build = |c: &table::Call, bufs: &mut Bufs| -> [i64; 6] {
        let mut a = [0i64; 6];
        if fd_first.contains(&c.name) {
            a[0] = file as i64;
            if c.name == "sendfile" || c.name == "copy_file_range" {
                a[1] = 0;
                a[2] = file as i64;
            }
        }
        if socket_first.contains(&c.name) {
            a[0] = sock as i64;
        }
        for &(i, b) in c.args {
            let refs = b.length_arg();
            if let Some(j) = refs {
                a[usize::from(j)] = if sigset_size(c.name) {
                    8
                } else if matches!(b, Buf::Iov { .. } | Buf::MMsg { .. }) {
                    2
                } else {
                    64
                };
            }
            let mut block = vec![0u8; 2 * PAGE];
            let base = block.as_mut_ptr() as i64;
            match b {
                Buf::Iov { .. } => {
                    // Two iovecs at the start, each over 64 bytes further in.
                    let v = block.as_mut_ptr().cast::<libc::iovec>();
                    // SAFETY: within the block.
                    unsafe {
                        *v = libc::iovec {
                            iov_base: block.as_mut_ptr().add(PAGE).cast(),
                            iov_len: 64,
                        };
                        *v.add(1) = libc::iovec {
                            iov_base: block.as_mut_ptr().add(PAGE + 512).cast(),
                            iov_len: 64,
                        };
                    }
                }
                Buf::Msg { .. } | Buf::MMsg { .. } => {
                    // One (or two) msghdr, each with one iovec further in.
                    let n = if matches!(b, Buf::MMsg { .. }) { 2 } else { 1 };
                    for k in 0..n {
                        // SAFETY: within the block (64-byte mmsghdr strides).
                        unsafe {
                            let m = block.as_mut_ptr().add(64 * k).cast::<libc::msghdr>();
                            let iov = block.as_mut_ptr().add(1024 + 16 * k).cast::<libc::iovec>();
                            *iov = libc::iovec {
                                iov_base: block.as_mut_ptr().add(PAGE + 256 * k).cast(),
                                iov_len: 64,
                            };
                            (*m).msg_iov = iov;
                            (*m).msg_iovlen = 1;
                        }
                    }
                }
                _ => {}
            }
            a[usize::from(i)] = base;
            bufs.blocks.push(block);
        }
        match c.name {
            // A wait on a word that is not the value: EAGAIN at once.
            "futex" => a[2] = 1,
            "futex_wait" => {
                a[1] = 1;
                a[2] = !0;
                a[3] = 2 | 128;
            }
            // The descriptor limit, set to what it is: no change.
            "setrlimit" | "prlimit64" => {
                let (res, new) = if c.name == "setrlimit" { (0, 1) } else { (1, 2) };
                a[res] = libc::RLIMIT_NOFILE as i64;
                // SAFETY: getrlimit into the buffer (an rlimit, 16 bytes).
                unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, a[new] as *mut libc::rlimit) };
            }
            "rt_sigaction" => a[0] = libc::SIGUSR2 as i64,
            _ => {}
        }
        a
    };
    let call = |nr: i64, a: [i64; 6]| -> i64 {
        // SAFETY: the call with arguments built above (harmless ones).
        let r = unsafe { libc::syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]) };
        if r == -1 {
            -(std::io::Error::last_os_error().raw_os_error().unwrap_or(0) as i64)
        } else {
            r
        }
    };
    let calls: Vec<&table::Call> = CALLS.iter().filter(|c| !SKIP.contains(&c.name)).collect();
    // Answers with buffers that never left memory.
    let mut want = Vec::new();
    for c in &calls {
        let mut b = Bufs { blocks: Vec::new() };
        let a = build(c, &mut b);
        want.push(call(c.nr, a));
        // A set-up of asynchronous IO that succeeded would stop this
        // process's paging (`table::UNPAGING`), and the rounds below
        // would test nothing: with no entries asked for, it is refused.
        if table::UNPAGING.contains(&c.nr) {
            assert_eq!(want[want.len() - 1], -(libc::EINVAL as i64), "{}", c.name);
        }
    }
    let churn = || {
        let mut v = vec![1u8; 48 << 20];
        for i in (0..v.len()).step_by(PAGE) {
            v[i] = v[i].wrapping_add(1);
        }
        std::hint::black_box(&v);
    };
    let mut differ = 0;
    let mut made = 0;
    for state in ["swapped out", "clean"] {
        // The calls' buffers, fresh, all built first, then pushed out.
        let mut bufs: Vec<Bufs> = calls.iter().map(|_| Bufs { blocks: Vec::new() }).collect();
        let args: Vec<[i64; 6]> = calls
            .iter()
            .zip(bufs.iter_mut())
            .map(|(c, b)| build(c, b))
            .collect();
        churn();
        if state == "clean" {
            // Read back: in, write-protected until written.
            let mut sum = 0u64;
            for b in &bufs {
                for block in &b.blocks {
                    for i in (0..block.len()).step_by(64) {
                        sum += u64::from(std::hint::black_box(block[i]));
                    }
                }
            }
            std::hint::black_box(sum);
        }
        for (k, c) in calls.iter().enumerate() {
            let got = call(c.nr, args[k]);
            made += 1;
            let same = got == want[k]
                // Calls whose success returns a fresh descriptor or a count
                // that may differ: compare success with success.
                || (got >= 0 && want[k] >= 0);
            if !same || (got == -(libc::EFAULT as i64) && want[k] != got) {
                differ += 1;
                println!("{} ({state}): {got}, with buffers in memory {}", c.name, want[k]);
            }
        }
    }
    // SAFETY: the temporary file's name, ours.
    unsafe { libc::unlink(path.as_ptr()) };
    println!("calls made: {}", made / 2);
    println!("calls differ: {differ}");
    std::process::exit(if differ == 0 { 0 } else { 1 });
}

/// System calls given heap buffers that are out, as programs make them
/// (`programs/buffers.c`): pipe, uname, nanosleep, waitpid's status, an
/// `fflush` of a `setvbuf` buffer (the write is libc's own), `system`
/// with a command built at run time and after `putenv` of a heap string,
/// preadv and the raw preadv2, getdents64, readlink, getrandom,
/// socketpair and recvmmsg.  In SIGBUS mode most failed with EFAULT.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at several times its budget: run in the release pass (CI runs both)"
)]
fn calls_given_buffers_that_are_out_work() {
    let dir = open_dir(true);
    let d = dir.path().to_str().unwrap();
    same_under_uswap("buffers", &["16", d], "4M", &Mode::all(), 2000);
}

/// What fiber libraries, JITs and file mappers do with memory they map
/// (`programs/protect.c`): a stack with a `PROT_NONE` guard page, unmapped
/// and mapped again; code made `PROT_READ | PROT_EXEC`, unmapped, mapped
/// again and written; a file mapped `MAP_SHARED | MAP_FIXED` over mapped
/// memory and unmapped, the heap used after (the file must not change).
/// A served block is put back fresh when unmapped: before, each of these
/// crashed (SIGSEGV) or wrote heap data into the file.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at several times its budget: run in the release pass (CI runs both)"
)]
fn mapped_memory_comes_back_fresh_after_munmap() {
    let dir = open_dir(true);
    let d = dir.path().to_str().unwrap();
    same_under_uswap("protect", &["32", d], "8M", &Mode::all(), 2000);
}

/// A program that forks once (runs a command) after writing a heap twice
/// the budget, then reads it in passes (`programs/forkchurn.c`): the fork
/// made every page it had then shared, which `UFFDIO_MOVE` refuses until
/// the page is written again; such pages stayed resident as unevictable
/// (each pass went through direct reclaim, three times as slow).  Now the
/// refused runs are written out in place (or, where that fails, made the
/// program's own again) and evicted: none is left unevictable.  With
/// twenty forks too.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at several times its budget: run in the release pass (CI runs both)"
)]
fn a_program_that_forked_pages_as_one_that_did_not() {
    for forks in ["1", "20"] {
        for (mode, err) in under_uswap(
            "forkchurn",
            &["48", "3", forks],
            "24M",
            Some("ram:256M"),
            &Mode::all(),
        )
        .1
        {
            assert_eq!(stat(&err, "unevictable"), 0, "{mode:?} {forks}: {err}");
            assert!(
                stat(&err, "written in place") + stat(&err, "unshared") > 0,
                "{mode:?} {forks}: {err}"
            );
        }
    }
}

/// The malloc family behaves as glibc's (`programs/alloc.c`): aligned
/// allocations at every power of two up to 64 MiB (NULL past 64 KiB
/// before), ENOMEM in errno on failure (0 before), `realloc(p, 0)` frees
/// and returns NULL.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at several times its budget: run in the release pass (CI runs both)"
)]
fn the_allocator_behaves_as_glibcs() {
    let (plain, _) = under_uswap("alloc", &[], "64M", Some("ram:1G"), &Mode::all());
    assert_eq!(String::from_utf8_lossy(&plain), "ok\n");
}

/// A forked child's signals on its parent's alternate stack, a 64 KiB
/// mapping in the heap (`programs/altfork.c`): stress-ng's workers died
/// of SIGSEGV, hundreds a second, because the child, adopting the
/// instance, dropped every pin, its own thread's on that stack too.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at several times its budget: run in the release pass (CI runs both)"
)]
fn a_forked_childs_signals_on_a_heap_alternate_stack_are_delivered() {
    let (out, _) = under_uswap("altfork", &["3", "64"], "16M", Some("ram:512M"), &Mode::all());
    assert_eq!(String::from_utf8_lossy(&out), "ok\n");
}

/// The program finds only its own descriptors (`programs/fdlist.c`),
/// however it looks: readdir of /proc/self/fd and /dev/fd, scandir, the
/// raw getdents64, fcntl on every number to 64 past its limit; and with
/// its limit lowered to 29 before an exec, probing to 64 (CPython's
/// test_subprocess does both).  Before, the userfaultfd, the swap file,
/// three pidfds and an io_uring were in every list.
#[test]
fn the_program_finds_only_its_own_descriptors() {
    let dir = open_dir(false);
    let bin = compile("fdlist", dir.path());
    // At this user's limits, probing up to the limit.  Where the hard
    // limit leaves uswap no room above the soft one, the soft one is
    // lowered by 64 to make some: the program sees a limit at most that
    // much lower.
    let plain = std::process::Command::new(&bin).arg("0").output().unwrap();
    let without_limit = |o: &[u8]| -> (String, i64) {
        let text = String::from_utf8_lossy(o).to_string();
        let limit = number_after::<i64>(&text, "limit ");
        (
            text.lines()
                .filter(|l| !l.starts_with("limit"))
                .collect::<Vec<_>>()
                .join("\n"),
            limit,
        )
    };
    let (want, plain_limit) = without_limit(&plain.stdout);
    for mode in Mode::all() {
        let b = bin.to_str().unwrap();
        let out = uswap_in(mode, &["run", "--budget", "64M", "--", b, "0"], &[]);
        assert!(
            out.status.success(),
            "{mode:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (got, limit) = without_limit(&out.stdout);
        assert_eq!(got, want, "{mode:?}");
        assert!(
            limit <= plain_limit && limit >= plain_limit - 64,
            "{mode:?}: limit {limit}"
        );
    }
    let lowered = format!("ulimit -Sn 29 && exec {} 35", bin.display());
    let plain = std::process::Command::new("sh")
        .args(["-c", &lowered])
        .output()
        .unwrap();
    for mode in Mode::all() {
        let out = uswap_in(mode, &["run", "--budget", "64M", "--", "sh", "-c", &lowered], &[]);
        assert!(
            out.status.success(),
            "{mode:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&plain.stdout),
            "{mode:?}: limit lowered to 29"
        );
    }
}

/// `mremap` and `madvise` on mapped memory as the kernel has them
/// (`programs/remap.c`, 64 MiB through a 16 MiB budget): `MREMAP_FIXED`
/// to an address found by mapping and unmapping (EINVAL before: stress-ng's
/// mremap stressor failed), `MREMAP_DONTUNMAP` (the old address came
/// back), `MADV_POPULATE_*` (EFAULT in SIGBUS mode), `MADV_WIPEONFORK` (a
/// child read its parent's data), `munmap` of one range twice.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at several times its budget: run in the release pass (CI runs both)"
)]
fn mremap_and_madvise_behave_as_the_kernels() {
    let (out, _) = under_uswap("remap", &["64"], "16M", Some("ram:512M"), &Mode::all());
    assert_eq!(String::from_utf8_lossy(&out), "ok\n");
}

/// `mlockall(MCL_CURRENT | MCL_FUTURE)` and one `send` of a buffer four
/// times the budget over a stream socket (`programs/locks.c`): uswap's
/// memory stays unlocked (mlockall faulted the whole heap region in,
/// 260 MB resident on a 16 MiB budget) and the send goes a chunk at a
/// time (it pinned the whole buffer: 128 MiB resident); the resident set
/// stays within the budget's reach.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at several times its budget: run in the release pass (CI runs both)"
)]
fn mlockall_and_long_sends_keep_to_the_budget() {
    for (mode, err) in under_uswap("locks", &["64"], "16M", Some("ram:512M"), &Mode::all()).1 {
        let peak: f64 = number_after(&err, "at most ");
        assert!(peak < 24.0, "{mode:?}: {peak} MiB resident at the peak: {err}");
    }
}

/// IO the kernel's workers do later, into heap buffers
/// (`programs/async_io.c`, buffers of 64 MiB in 384 MiB at a 16 MiB
/// budget): kernel AIO reading into a buffer that went out, an io_uring
/// reading into one never written and writing from one that went out.
/// Handler-thread mode serves the workers' faults and keeps paging; in
/// SIGBUS mode the guard traps the first set-up call and the process
/// stops paging, said in one line, and every byte lands.  Without the
/// guard the same program fails there with EFAULT: what the trap is for.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at several times its budget: run in the release pass (CI runs both)"
)]
fn async_io_into_the_heap_lands_in_both_modes() {
    let said = "is no longer paged";
    for (mode, err) in under_uswap("async_io", &["64"], "16M", Some("ram:1G"), &Mode::all()).1 {
        match mode {
            Mode::Sigbus => {
                assert_eq!(err.matches(said).count(), 1, "{mode:?}: {err}");
                assert!(err.contains("set up kernel AIO (io_setup)"), "{mode:?}: {err}");
                assert!(err.contains("--mode handler (as root)"), "{mode:?}: {err}");
            }
            Mode::Handler => {
                assert!(!err.contains(said), "{mode:?}: {err}");
                // Still paged after the set-up: the buffers went out and
                // came back through the kernel's own faults.
                assert!(stat(&err, "evictions") > 30_000, "{mode:?}: {err}");
            }
        }
    }
    let dir = open_dir(false);
    let bin = compile("async_io", dir.path());
    let out = uswap_in(
        Mode::Sigbus,
        &[
            "run",
            "--budget",
            "16M",
            "--swap",
            "ram:1G",
            "--syscall-guard",
            "off",
            "--",
            bin.to_str().unwrap(),
            "64",
        ],
        &[],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("AIO read at 0: Bad address"), "{err}");
}

/// A statically linked program (the preload library cannot enter it) and
/// a set-user-ID one (the loader ignores `LD_PRELOAD` for it) are named
/// in one line each before they run, unpaged; they ran without a word.
#[test]
fn static_programs_are_refused_and_set_user_id_ones_named() {
    let dir = open_dir(false);
    let src = dir.path().join("st.c");
    std::fs::write(&src, "int main(void) { return 0; }\n").unwrap();
    let st = dir.path().join("static");
    let cc = Command::new("cc")
        .args(["-static", "-o"])
        .arg(&st)
        .arg(&src)
        .output()
        .unwrap();
    assert!(
        cc.status.success(),
        "cc -static: {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    // Refused before it starts: nothing of it could be paged.
    let marker = dir.path().join("ran");
    std::fs::write(
        &src,
        format!(
            "#include <stdio.h>\nint main(void) {{ fclose(fopen({:?}, \"w\")); return 0; }}\n",
            marker.to_str().unwrap()
        ),
    )
    .unwrap();
    let cc = Command::new("cc")
        .args(["-static", "-o"])
        .arg(&st)
        .arg(&src)
        .output()
        .unwrap();
    assert!(cc.status.success(), "{}", String::from_utf8_lossy(&cc.stderr));
    let out = uswap(&["run", "--budget", "64M", "--", st.to_str().unwrap()], &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("is statically linked") && err.contains("run it without uswap run"),
        "{err}"
    );
    assert!(!marker.exists(), "the static program ran");
    if root() {
        use std::os::unix::fs::PermissionsExt;
        // A program set-user-ID to another user than the one running it.
        let su = dir.path().join("su-true");
        std::fs::copy("/bin/true", &su).unwrap();
        std::os::unix::fs::chown(&su, Some(NOBODY), None).unwrap();
        std::fs::set_permissions(&su, std::fs::Permissions::from_mode(0o4755)).unwrap();
        let out = uswap(&["run", "--budget", "64M", "--", su.to_str().unwrap()], &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(
            err.contains("set-user-ID") && err.contains("runs unpaged"),
            "{err}"
        );
    }
}

/// The default swap file is made with no name in `$TMPDIR`: a file
/// another user put there under any name (the name the default used to
/// be, `uswap-run-PID.swap`, stopped uswap run from starting) stands in
/// nothing's way, and nothing is left there after.
#[test]
fn the_default_swap_file_cannot_be_blocked() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = open_dir(true);
    // Files of another user's (root's, when the run is nobody's) under
    // the names the default used to take, for the next few pids.
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() } as u32;
    for pid in me..me + 200 {
        let f = tmp.path().join(format!("uswap-run-{pid}.swap"));
        std::fs::write(&f, b"planted").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let before = std::fs::read_dir(tmp.path()).unwrap().count();
    let out = uswap_in(
        Mode::Sigbus,
        &["run", "--budget", "16M", "--", "/bin/true"],
        &[("TMPDIR", tmp.path().to_str().unwrap())],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), before, "{err}");
}

/// docs/DESIGN.md's table of system calls with buffers lists every call
/// of the guard's table, by number and name: the documentation says what
/// the code does.
#[test]
fn the_design_lists_every_guarded_call() {
    let design =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/DESIGN.md")).unwrap();
    for c in table::CALLS {
        let row = format!("| {} | `{}` |", c.nr, c.name);
        assert!(design.contains(&row), "docs/DESIGN.md has no row {row}");
    }
}

/// Python doing what Python programs do (`programs/guest.py`) in a heap
/// four times the budget: subprocess with large argument lists from the
/// heap (vfork + exec), os.preadv and os.pwritev into heap buffers, a
/// pipe read with poll while a thread that blocks every signal writes
/// it, faulthandler on; the same digest as without uswap, both modes.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at several times its budget: run in the release pass (CI runs both)"
)]
fn python_subprocess_preadv_and_threads_blocking_signals() {
    // Copied where `nobody` may read it (the checkout may be in a home).
    let dir = open_dir(false);
    let script = dir.path().join("guest.py");
    std::fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/programs/guest.py"),
        &script,
    )
    .unwrap();
    let script = script.to_str().unwrap();
    let plain = Command::new(PYTHON).args([script, "200000"]).output().unwrap();
    assert!(
        plain.status.success(),
        "{}",
        String::from_utf8_lossy(&plain.stderr)
    );
    for mode in Mode::all() {
        let tmp = open_dir(true);
        let out = uswap_in(
            mode,
            &[
                "run", "--budget", "12M", "--swap", "ram:256M", "--stats", "--", PYTHON, script, "200000",
            ],
            &[("TMPDIR", tmp.path().to_str().unwrap())],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{mode:?}: {:?}: {err}", out.status);
        assert_eq!(out.stdout, plain.stdout, "{mode:?}: {err}");
        assert!(stat(&err, "evictions") > 5000, "{mode:?}: {err}");
        assert!(!err.contains("blocks SIGBUS"), "{mode:?}: {err}");
    }
}

/// Python frees a 96 MiB buffer, then goes on allocating small objects.
const FREED: &str = r#"
import time
def anon():
    for l in open('/proc/self/status'):
        if l.startswith('RssAnon'): return int(l.split()[1]) >> 10
b = bytearray(96 << 20)
for i in range(0, len(b), 4096): b[i] = 1
held = anon()
del b
t = time.monotonic()
while time.monotonic() - t < 0.3:
    junk = [bytes(100) for _ in range(1000)]
print("held", held, "after", anon())
"#;

/// Memory the program frees leaves its resident set, as it does plainly
/// (glibc unmaps a large block at `free`): mimalloc purges a span free
/// for 10 ms, and its `MADV_DONTNEED` is served as uswap's discard.
/// Before, purging was off and the freed 96 MiB stayed resident (110 MiB
/// held after the free), charged to the budget until written to swap.
#[test]
fn freed_memory_leaves_the_resident_set() {
    for mode in Mode::all() {
        let out = uswap_in(
            mode,
            &[
                "run", "--budget", "256M", "--swap", "ram:256M", "--", PYTHON, "-c", FREED,
            ],
            &[],
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{mode:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (held, after) = (
            number_after::<u64>(&text, "held "),
            number_after::<u64>(&text, "after "),
        );
        assert!(held >= 96, "{mode:?}: {text}");
        assert!(
            after + 64 <= held,
            "{mode:?}: freed memory still resident: {text}"
        );
    }
}

/// A program that lowers its file size limit, then builds 100 MB.
const FSIZE: &str = r#"
import resource, hashlib
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
d = [bytes([i % 251]) * 1000 for i in range(100000)]
h = hashlib.sha256()
for b in d: h.update(b)
print(h.hexdigest())
"#;

/// A program's `RLIMIT_FSIZE` (CPython's test_resource lowers it; so does
/// `ulimit -f` in a shell) holds for uswap's threads too: its swap file
/// cannot be written past it.  The writes that fail with `EFBIG` pause
/// and their pages wait in memory, said in one line that names the limit;
/// before, every slot past the limit was retired as a bad block and the
/// program killed as out of memory.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "a program paged at several times its budget: run in the release pass (CI runs both)"
)]
fn a_lowered_file_size_limit_costs_the_program_nothing() {
    let plain = Command::new(PYTHON).args(["-c", FSIZE]).output().unwrap();
    assert!(plain.status.success());
    for mode in Mode::all() {
        let out = uswap_in(mode, &["run", "--budget", "16M", "--", PYTHON, "-c", FSIZE], &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{mode:?}: {:?}: {err}", out.status);
        assert_eq!(out.stdout, plain.stdout, "{mode:?}: {err}");
        assert!(err.contains("RLIMIT_FSIZE"), "{mode:?}: {err}");
        assert!(!err.contains("retired"), "{mode:?}: {err}");
    }
}
