//! `uswap run`'s supervisor: the program's parent, for as long as it runs.
//!
//! It holds the process tree's budget domain (`uswap::domain`), which
//! every paged process of the tree joins, and runs its arbiter; it passes
//! on the signals sent to it, and ends as the program ends: with its exit
//! status, or killed by the same signal.  So `uswap run` stands where the
//! program would, for a shell, a service manager or a test runner:
//!
//! - A signal sent to `uswap run` (`kill`, `timeout`, systemd's stop) goes
//!   to the program.  One the terminal sends to its foreground process
//!   group (Ctrl-C, Ctrl-\, Ctrl-Z, a window resize: `SI_KERNEL`) reaches
//!   the program directly, in the same group, and is not sent twice.
//! - The program stopped (Ctrl-Z, SIGTSTP, SIGSTOP): the supervisor stops
//!   itself, so that the shell sees the job stop, and the `SIGCONT` that
//!   resumes the group resumes both.
//! - `kill -9` of the supervisor, which cannot be caught, takes the
//!   program with it (`PR_SET_PDEATHSIG`), as when they were one process.
//!
//! Every signal but those two is blocked in the supervisor and read from a
//! signalfd; the program starts with the mask `uswap run` was started
//! with, as it would have from the shell.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context;
use uswap::domain::Arbiter;

/// How often the arbiter divides the budget: faults between two ticks
/// may take the tree past it by what they bring in.
const TICK: Duration = Duration::from_millis(2);

/// The tree's compressed stores stayed past its budget, overrun and
/// slack: kill the member whose store is largest, as a memory cgroup would
/// a task of a group whose zswap pool cannot fit, and say so in one line.
fn out_of_memory(oom: uswap::domain::OutOfMemory) {
    let mib = |pages: u64| (pages * uswap::PAGE_SIZE as u64) >> 20;
    let name = std::fs::read_to_string(format!("/proc/{}/comm", oom.pid)).unwrap_or_default();
    eprintln!(
        "uswap run: the process tree's compressed stores held {} MiB for {} s, past its budget, overrun and {} MiB of overhead ({} MiB): its pages do not compress enough to fit; killed {} ({}, a store of {} MiB), as a memory cgroup would; give a larger --budget, a swap device that takes pages out of memory (a file, or a tier zram:SIZE,file:PATH:SIZE), or --store-outside-budget",
        mib(oom.total),
        uswap::domain::OOM_AFTER.as_secs(),
        mib(uswap::domain::OOM_SLACK),
        mib(oom.bound),
        oom.pid,
        name.trim(),
        mib(oom.charge)
    );
    // SAFETY: a signal to a member of the tree, which the arbiter saw
    // alive this tick (a reused pid would have a new start time, and its
    // slot would not have been charged).
    unsafe { libc::kill(oom.pid, libc::SIGKILL) };
}

/// The tree's memory uswap cannot page passed its budget, overrun and
/// slack: said once, and left as it is.
fn unpaged(held: u64, bound: u64) {
    let mib = |pages: u64| (pages * uswap::PAGE_SIZE as u64) >> 20;
    eprintln!(
        "uswap run: the process tree holds {} MiB that uswap cannot page (each process's memory outside its heap: an interpreter's data, thread stacks, uswap's own tables), past its budget, overrun and overhead ({} MiB): left as it is, and the paged memory gets 1 MiB a process; a larger --budget pages less",
        mib(held),
        mib(bound)
    );
}

/// How the program ended.
pub enum Ended {
    Exited(i32),
    Killed(i32),
}

/// Run `cmd` under supervision with `arbiter`'s domain (its budget driven
/// by `auto`, if given); returns when the program has ended.
pub fn supervise(
    mut cmd: Command,
    mut arbiter: Arbiter,
    mut auto: Option<crate::autobudget::AutoBudget>,
) -> anyhow::Result<Ended> {
    // SAFETY: zeroed is a valid sigset_t, filled in by sigprocmask.
    let mut mask: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: sigset operations on local sets, then this (single-threaded)
    // process's own mask.
    let signals = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        if libc::sigprocmask(libc::SIG_BLOCK, &all, &mut mask) != 0 {
            return Err(std::io::Error::last_os_error()).context("blocking signals in the supervisor");
        }
        let fd = libc::signalfd(-1, &all, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).context("signalfd");
        }
        OwnedFd::from_raw_fd(fd)
    };
    let parent = std::process::id() as i32;
    // SAFETY: the hook calls sigprocmask, prctl and getppid alone, all
    // async-signal-safe, in the child before its exec.
    unsafe {
        cmd.pre_exec(move || {
            // The mask uswap run was given, not the supervisor's.
            libc::sigprocmask(libc::SIG_SETMASK, &mask, std::ptr::null_mut());
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
            // The supervisor ended between the fork and the prctl.
            if libc::getppid() != parent {
                libc::_exit(137);
            }
            Ok(())
        })
    };
    let child = cmd
        .spawn()
        .with_context(|| format!("running {}", cmd.get_program().to_string_lossy()))?;
    let pid = child.id() as i32;
    // `uswap ctl`'s way in.  A tree without it (no statistics directory
    // of this user's to put the socket in) runs as well; `uswap ctl` then
    // says it finds none.
    let mut control = crate::ctl::Control::listen(pid).ok();
    loop {
        let now = Instant::now();
        if let Some(oom) = arbiter.tick(now) {
            out_of_memory(oom);
        }
        if let Some((held, bound)) = arbiter.take_unpaged() {
            unpaged(held, bound);
        }
        if let Some(a) = auto.as_mut() {
            a.tick(&mut arbiter, now);
        }
        if let Some(c) = control.as_mut() {
            c.serve(&mut arbiter, &mut auto, now);
        }
        let mut pfd = [
            libc::pollfd {
                fd: signals.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: control.as_ref().map_or(-1, |c| c.raw_fd()),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two pollfds of ours (a negative descriptor is skipped).
        unsafe { libc::poll(pfd.as_mut_ptr(), 2, TICK.as_millis() as i32) };
        loop {
            // SAFETY: zeroed is a valid siginfo record.
            let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
            let size = std::mem::size_of::<libc::signalfd_siginfo>();
            // SAFETY: reads one record into ours.
            let n = unsafe {
                libc::read(
                    signals.as_raw_fd(),
                    (&mut info as *mut libc::signalfd_siginfo).cast(),
                    size,
                )
            };
            if n != size as isize {
                break;
            }
            let sig = info.ssi_signo as i32;
            if sig == libc::SIGCHLD || info.ssi_code == libc::SI_KERNEL {
                continue;
            }
            // SAFETY: a signal to our own child, which we have not reaped.
            unsafe { libc::kill(pid, sig) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child, without blocking.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG | libc::WUNTRACED) };
        if r == pid {
            if libc::WIFEXITED(status) {
                return Ok(Ended::Exited(libc::WEXITSTATUS(status)));
            }
            if libc::WIFSIGNALED(status) {
                return Ok(Ended::Killed(libc::WTERMSIG(status)));
            }
            if libc::WIFSTOPPED(status) {
                // The job stops as the program did; the SIGCONT that
                // resumes us is passed on (or reached it already).
                // SAFETY: stops this process.
                unsafe { libc::kill(std::process::id() as i32, libc::SIGSTOP) };
                // SAFETY: as above, our own child.
                unsafe { libc::kill(pid, libc::SIGCONT) };
            }
        }
    }
}

/// End this process as the program ended: its exit status, or killed by
/// its signal (after no core dump of our own: the program's is the one
/// that matters).
pub fn end_as(ended: Ended) -> ! {
    match ended {
        Ended::Exited(code) => std::process::exit(code),
        Ended::Killed(sig) => {
            // SAFETY: resource and signal calls on this process alone,
            // which is about to end.
            unsafe {
                let none = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: 0,
                };
                libc::setrlimit(libc::RLIMIT_CORE, &none);
                libc::signal(sig, libc::SIG_DFL);
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, sig);
                libc::kill(std::process::id() as i32, sig);
                libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            }
            std::process::exit(128 + sig)
        }
    }
}
