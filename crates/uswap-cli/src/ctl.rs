//! `uswap ctl`: a running tree's budget changed live, as a memory cgroup's
//! `memory.max`, `memory.reclaim` and freezer are written.
//!
//! The supervisor of every `uswap run` listens on a Unix socket,
//! `ctl-PID.sock` (PID the supervisor's), in its user's statistics
//! directory (`uswap::stats::live::directory`: this user's alone, 0700, so
//! no other user reaches it; the peer's credentials are checked as well,
//! for root, which may).  A request is one line and so is its answer.
//! The supervisor serves requests between its arbiter's ticks, so that a
//! request never stops the budget being divided: one that waits (a lower
//! budget, a reclaim, a freeze: the answer says what the tree holds when
//! the members' reclaimers have followed) is answered from a later tick,
//! at the latest after [`WAIT_MOST`].
//!
//! The members follow a change as they follow the arbiter's shares: each
//! reclaims its own pages down to its new share in its own process, from
//! its reclaimer's next pass (`uswap::domain`).

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::autobudget::AutoBudget;
use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use uswap::domain::{Arbiter, MIN_SHARE};

/// How long a request that waits for the tree to follow is held before it
/// is answered with what the tree holds then.
const WAIT_MOST: Duration = Duration::from_secs(2);
/// How long the supervisor waits for a connected client's one line.
const READ_MOST: Duration = Duration::from_millis(50);

fn mib(pages: u64) -> u64 {
    (pages * uswap::PAGE_SIZE as u64) >> 20
}

fn socket_name(supervisor: i32) -> String {
    format!("ctl-{supervisor}.sock")
}

/// The supervisor's side: the socket, and the requests still waiting.
pub struct Control {
    listener: UnixListener,
    path: PathBuf,
    uid: u32,
    program: i32,
    waiting: Vec<Waiting>,
    /// The budget `thaw` returns to, while frozen.
    frozen_from: Option<u64>,
}

/// A request answered once the tree holds at most `resident` pages, or at
/// `until`.
struct Waiting {
    stream: UnixStream,
    resident: u64,
    since: Instant,
    until: Instant,
    /// The budget to put back when answered (a reclaim's).
    restore: Option<u64>,
    /// Resident pages when asked.
    before: u64,
    what: &'static str,
}

impl Control {
    /// Listen for `program`'s tree in this user's statistics directory.
    pub fn listen(program: i32) -> anyhow::Result<Control> {
        let dir = uswap::stats::live::ensure_directory().context("the control socket's directory")?;
        let path = dir.join(socket_name(std::process::id() as i32));
        // A socket left by a supervisor of this pid that was killed.
        let _ = std::fs::remove_file(&path);
        let listener =
            UnixListener::bind(&path).with_context(|| format!("listening on {}", path.display()))?;
        listener.set_nonblocking(true)?;
        Ok(Control {
            listener,
            path,
            uid: rustix::process::geteuid().as_raw(),
            program,
            waiting: Vec::new(),
            frozen_from: None,
        })
    }

    /// The descriptor to poll beside the supervisor's signals.
    pub fn raw_fd(&self) -> RawFd {
        self.listener.as_raw_fd()
    }

    /// Take new requests and answer those whose wait is over.
    pub fn serve(&mut self, arbiter: &mut Arbiter, auto: &mut Option<AutoBudget>, now: Instant) {
        while let Ok((stream, _)) = self.listener.accept() {
            self.request(stream, arbiter, auto, now);
        }
        if self.waiting.is_empty() {
            return;
        }
        let (resident, other) = arbiter.charged();
        let budget = arbiter.budget_pages();
        self.waiting.retain_mut(|w| {
            if resident > w.resident && now < w.until {
                return true;
            }
            let ms = now.duration_since(w.since).as_millis();
            let mut line = match w.what {
                "reclaim" => format!(
                    "reclaimed {} MiB in {ms} ms; the tree holds {} MiB resident",
                    mib(w.before.saturating_sub(resident)),
                    mib(resident)
                ),
                "freeze" => format!(
                    "frozen in {ms} ms: the tree holds {} MiB resident (and {} MiB it cannot page out); `thaw` returns it to its budget",
                    mib(resident),
                    mib(other)
                ),
                _ => format!(
                    "budget {} MiB; the tree holds {} MiB resident and {} MiB else, after {ms} ms",
                    mib(budget),
                    mib(resident),
                    mib(other)
                ),
            };
            if resident > w.resident {
                line.push_str(&format!(
                    ": {} MiB over, still being reclaimed, or memory uswap cannot page out",
                    mib(resident - w.resident)
                ));
            }
            if let Some(b) = w.restore {
                arbiter.set_budget(b);
            }
            answer(&mut w.stream, &line);
            false
        });
    }

    fn request(
        &mut self,
        mut stream: UnixStream,
        arbiter: &mut Arbiter,
        auto: &mut Option<AutoBudget>,
        now: Instant,
    ) {
        let _ = stream.set_nonblocking(false);
        let _ = stream.set_read_timeout(Some(READ_MOST));
        let peer = rustix::net::sockopt::socket_peercred(stream.as_fd()).map(|c| c.uid.as_raw());
        if peer.is_ok_and(|uid| uid != self.uid && uid != 0) || peer.is_err() {
            let who = peer.map(|u| u.to_string()).unwrap_or_else(|_| "unknown".into());
            answer(
                &mut stream,
                &format!(
                    "error: refused: uid {who} is not this tree's user (uid {})",
                    self.uid
                ),
            );
            return;
        }
        let mut line = String::new();
        if BufReader::new(&stream).read_line(&mut line).is_err() || line.is_empty() {
            answer(&mut stream, "error: no request line");
            return;
        }
        let mut words = line.split_whitespace();
        let (verb, arg) = (words.next().unwrap_or(""), words.next());
        let (resident, other) = arbiter.charged();
        let budget = arbiter.budget_pages();
        let members = arbiter.members().len() as u64;
        // What a freeze leaves each member: a batch's room.
        let floor = members.max(1) * MIN_SHARE;
        let page = uswap::PAGE_SIZE as u64;
        // A request that waits keeps its connection (a duplicate of it:
        // none when descriptors ran out, and the change is then made
        // without an answer rather than taking the supervisor down).
        let wait = |resident_at_most: u64, restore: Option<u64>, what| {
            stream.try_clone().ok().map(|stream| Waiting {
                stream,
                resident: resident_at_most,
                since: now,
                until: now + WAIT_MOST,
                restore,
                before: resident,
                what,
            })
        };
        let bytes = |arg: Option<&str>| -> Result<u64, String> {
            let a = arg.ok_or("a size is missing (e.g. 512M)")?;
            uswap_bench::parse_bytes(a).map_err(|e| format!("{a}: {e}"))
        };
        let reply = match verb {
            "status" => Ok(format!(
                "tree of process {} (supervisor {}): budget {} MiB{}, overrun {}, {} processes holding {} MiB resident and {} MiB else",
                self.program,
                std::process::id(),
                mib(budget),
                self.frozen_from
                    .map(|b| format!(" (frozen; thaw returns to {} MiB)", mib(b)))
                    .unwrap_or_default(),
                match arbiter.overrun_pages() {
                    u64::MAX => "unbounded".to_string(),
                    o => format!("{} MiB", mib(o)),
                },
                members,
                mib(resident),
                mib(other)
            ) + &auto.as_ref().map(|a| format!("; {}", a.describe(budget))).unwrap_or_default()),
            "auto" => match (arg, auto.as_mut()) {
                (Some("on"), Some(a)) => {
                    a.set_on(true, arbiter);
                    Ok("auto on: the budget follows the tree's pressure from here".into())
                }
                (Some("off"), Some(a)) => {
                    a.set_on(false, arbiter);
                    Ok(format!("auto off: the budget stays at {} MiB", mib(budget)))
                }
                (_, None) => Err("this tree was not started with --budget auto".into()),
                _ => Err("auto on or auto off".into()),
            },
            "budget" | "reclaim" | "freeze" if auto.as_ref().is_some_and(AutoBudget::on) => {
                Err(format!("the budget is driven by --budget auto: `uswap ctl {} auto off` first", self.program))
            }
            "budget" => match bytes(arg) {
                Ok(b) if b < 1 << 20 => Err("a budget is at least 1M, room for a batch of pages".into()),
                Ok(b) => {
                    let pages = b / page;
                    if let Some(f) = self.frozen_from.as_mut() {
                        *f = pages;
                        Ok(format!("frozen; thaw returns to a budget of {} MiB", mib(pages)))
                    } else {
                        arbiter.set_budget(pages);
                        if pages >= resident + other {
                            Ok(format!("budget {} MiB (was {} MiB)", mib(pages), mib(budget)))
                        } else {
                            // Followed once within a sixteenth of the budget
                            // (an instance's slack over its share).
                            self.waiting.extend(wait(pages.saturating_sub(other) + pages / 16, None, "budget"));
                            return;
                        }
                    }
                }
                Err(e) => Err(e),
            },
            "reclaim" => match bytes(arg) {
                Ok(b) => {
                    let target = resident.saturating_sub(b / page).max(floor);
                    // Only with a connection to answer on: it holds the
                    // budget to put back.
                    if let Some(w) = wait(target, Some(budget), "reclaim") {
                        arbiter.set_budget(target + other);
                        self.waiting.push(w);
                        return;
                    }
                    Err("out of descriptors: nothing reclaimed".into())
                }
                Err(e) => Err(e),
            },
            "freeze" => {
                if self.frozen_from.is_none() {
                    self.frozen_from = Some(budget);
                }
                arbiter.set_budget(floor + other);
                // A member keeps a batch in flight and its slack: followed
                // within 4 MiB a process.
                self.waiting.extend(wait(4 * floor, None, "freeze"));
                return;
            }
            "thaw" => match self.frozen_from.take() {
                Some(b) => {
                    arbiter.set_budget(b);
                    Ok(format!("thawed: budget {} MiB again", mib(b)))
                }
                None => Err("not frozen".into()),
            },
            "overrun" => match arg {
                Some("unbounded") => {
                    arbiter.set_overrun(u64::MAX);
                    Ok("overrun unbounded".into())
                }
                _ => bytes(arg).map(|b| {
                    arbiter.set_overrun(b / page);
                    format!("overrun {} MiB: past budget and overrun for 2 s, the largest process is killed", mib(b / page))
                }),
            },
            other => Err(format!(
                "unknown request {other:?}: status, budget SIZE, reclaim SIZE, overrun SIZE|unbounded, freeze, thaw, auto on|off"
            )),
        };
        match reply {
            Ok(l) => answer(&mut stream, &l),
            Err(e) => answer(&mut stream, &format!("error: {e}")),
        }
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn answer(stream: &mut UnixStream, line: &str) {
    // A client that went away misses its answer; nothing else to do.
    let _ = stream.write_all(format!("{line}\n").as_bytes());
}

/// Change a running tree's budget live, as a memory cgroup's files are
/// written.
///
/// `uswap ctl PID budget 256M`: PID is any process of a `uswap run` tree
/// (the program, a child, or `uswap run` itself).  Lowering the budget,
/// `reclaim` and `freeze` answer when the tree's reclaimers have followed
/// (within 2 s, saying what the tree then holds).  Only the tree's user
/// (or root) may; the answer is one line.
#[derive(Args, Debug)]
pub struct CtlArgs {
    /// A process of the tree.
    pub pid: i32,
    #[command(subcommand)]
    pub action: Action,
}

#[derive(Subcommand, Debug)]
pub enum Action {
    /// The budget, the overrun, and what the tree holds.
    Status,
    /// Set the budget (as `memory.max`): lowering it reclaims down to it now.
    Budget {
        /// A size: 256M, 2G.
        size: String,
    },
    /// Push this much of the tree's resident memory out now, as
    /// `memory.reclaim` does; the budget stays.
    Reclaim {
        /// A size: 100M.
        size: String,
    },
    /// How far past the budget the tree may stay, in memory uswap cannot
    /// page, before its largest process is killed: a size, or `unbounded`.
    Overrun {
        /// A size, or `unbounded`.
        value: String,
    },
    /// Everything out but what the tree touches meanwhile (a batch's room
    /// a process), until `thaw`.
    Freeze,
    /// Back to the budget before `freeze`.
    Thaw,
    /// Whether `--budget auto` drives the budget: `off` leaves it where
    /// it is, for `budget`, `reclaim` and `freeze`; `on` resumes from it.
    Auto {
        #[arg(value_parser = ["on", "off"])]
        state: String,
    },
}

/// `uswap ctl`.
pub fn run(a: &CtlArgs) -> anyhow::Result<()> {
    let line = match &a.action {
        Action::Status => "status".to_string(),
        Action::Budget { size } => format!("budget {size}"),
        Action::Reclaim { size } => format!("reclaim {size}"),
        Action::Overrun { value } => format!("overrun {value}"),
        Action::Freeze => "freeze".into(),
        Action::Thaw => "thaw".into(),
        Action::Auto { state } => format!("auto {state}"),
    };
    println!("{}", request(a.pid, &line)?);
    Ok(())
}

/// Send one request line to the tree `pid` is in; its answer, or the
/// error it gave.
pub fn request(pid: i32, line: &str) -> anyhow::Result<String> {
    let socket = find(pid)?;
    let mut stream = UnixStream::connect(&socket).with_context(|| {
        format!(
            "the tree of process {pid} has ended (its control socket {} does not answer)",
            socket.display()
        )
    })?;
    stream.write_all(format!("{line}\n").as_bytes())?;
    stream.set_read_timeout(Some(WAIT_MOST + Duration::from_secs(5)))?;
    let mut reply = String::new();
    BufReader::new(&stream)
        .read_line(&mut reply)
        .context("no answer from the tree's supervisor")?;
    let reply = reply.trim_end();
    if reply.is_empty() {
        bail!("the tree of process {pid} ended before it answered");
    }
    if let Some(e) = reply.strip_prefix("error: ") {
        bail!("{e}");
    }
    Ok(reply.to_string())
}

/// The control socket of the tree `pid` is in: that of the nearest
/// ancestor (or `pid` itself) that supervises a tree.
fn find(pid: i32) -> anyhow::Result<PathBuf> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|_| {
        anyhow::anyhow!("no process {pid}: the tree it was in has ended, or the pid is wrong")
    })?;
    let field = |s: &str, name: &str| -> Option<u32> {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
    };
    let owner = field(&status, "Uid:").unwrap_or(u32::MAX);
    let me = rustix::process::geteuid().as_raw();
    if owner != me && me != 0 {
        bail!("process {pid} is uid {owner}'s: only its user (or root) may control its tree");
    }
    let dir = if owner == me {
        uswap::stats::live::directory()
    } else {
        // Root, for another user's tree: that user's directory, as the
        // tree's processes name it in their environment.
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let var = |name: &str| {
            environ.split(|&b| b == 0).find_map(|kv| {
                let kv = std::str::from_utf8(kv).ok()?;
                kv.strip_prefix(name)?
                    .strip_prefix('=')
                    .map(std::ffi::OsString::from)
            })
        };
        uswap::stats::live::directory_for(var, owner)
    };
    let mut p = pid;
    for _ in 0..64 {
        let path = dir.join(socket_name(p));
        if path.exists() {
            return Ok(path);
        }
        match std::fs::read_to_string(format!("/proc/{p}/status"))
            .ok()
            .and_then(|s| field(&s, "PPid:"))
        {
            Some(pp) if pp > 1 => p = pp as i32,
            _ => break,
        }
    }
    bail!(
        "process {pid} is not in a running `uswap run` tree of this user (no control socket of it or an ancestor in {})",
        in_dir(&dir)
    )
}

fn in_dir(dir: &Path) -> String {
    dir.display().to_string()
}
