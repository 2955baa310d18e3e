//! `uswap run`: an unmodified program, and every process it starts,
//! paged by uswap under one budget.
//!
//! The command checks and resolves its options, puts them in the
//! environment with `LD_PRELOAD` naming the preload library (beside this
//! executable, or the copy inside it: `preload.rs`), makes the tree's budget
//! domain and starts the program as its child, which it supervises
//! (`supervisor.rs`): every process of the tree that loads the library
//! is paged (`crates/uswap-preload`).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Args;
use uswap::pager::SwapDeviceSpec;
use uswap::run_env as uswap_env;
use uswap_bench::parse_bytes;

/// `--mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RunMode {
    /// SIGBUS mode under the system-call guard; with `--syscall-guard
    /// off`, handler threads where this user may have the kernel's
    /// faults served, else SIGBUS.
    Auto,
    /// uswap's handler threads serve every fault.
    Handler,
    /// The faulting thread serves its own, in a signal handler.
    Sigbus,
}

/// `--syscall-guard`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Guard {
    On,
    Off,
}

fn parse_overrun(s: &str) -> Result<uswap::pager::Overrun, String> {
    s.parse().map_err(|e: uswap::pager::OverrunError| e.to_string())
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Memory budget of the program and every process it starts, as a
    /// memory cgroup's limit holds them: their paged memory and the
    /// anonymous memory uswap cannot page (its own tables and frames, a
    /// compressed store, what a program keeps outside the heap) together
    /// stay under it, within the overrun; a RAM device (`ram:`) is not
    /// counted (it saves no memory).  A size (K, M, G suffixes) or a
    /// share (`25%`) of the memory the tree may use: the memory cgroup's
    /// limit where one is set (a container's), else this machine's.
    /// `auto[:TARGET][,max=SIZE][,min=SIZE][,step=PCT][,interval=DURATION]`:
    /// a budget that finds itself, lowered in steps of at most step= (10%)
    /// every interval= (1s) while the tree's memory pressure (the share of
    /// time its threads wait on refaults: swap-ins, and more of a step's
    /// pages taken back than the step took) stays under TARGET (0.17%, after
    /// Senpai's), raised at once past it; from max= (else 50%), never
    /// above it, never below min= (16M) nor what the tree faulted in the
    /// last interval.  The pages a step takes stay in memory for an
    /// interval, written out only if nothing touched them (a touch takes
    /// one back at no cost), so the tree may hold the budget before the
    /// step meanwhile.  `uswap ctl PID status` shows it.
    #[arg(long, default_value = "50%")]
    pub budget: String,
    /// Swap device: `file:PATH:SIZE` (PATH a directory, or missing:
    /// created unnamed there, mode 0600: nothing is left behind, even
    /// after `kill -9`; an existing file or block device is used as is if it is
    /// this user's alone: mode 0600, not a symlink, not in use; pages
    /// encrypted and authenticated with a key held only in memory, unless
    /// `file:PATH:SIZE:plain`), `zram:SIZE[:lz4|zstd[:LEVEL]]`
    /// (compressed in memory, at most SIZE of it), `ram:SIZE`, an NBD
    /// export on another machine `nbd://HOST[:PORT]/EXPORT` or
    /// `nbd+unix:///EXPORT?socket=PATH` (served by e.g. `nbdkit memory
    /// 8G` there; pages encrypted and authenticated unless `?plain`; all
    /// of the export unless `size=SIZE`), or a tier
    /// `zram:SIZE[:CODEC],file:PATH:SIZE` or `zram:SIZE[:CODEC],nbd://...`
    /// (the store's oldest pages go to the file or export when it holds
    /// SIZE).  Repeat for several.  `file:DIR` with no size: a file in
    /// DIR that grows as pages go out, up to the free space there less a
    /// reserve kept free (a tenth of it, at least 1 GiB, at most half).
    /// Default: such a file in $TMPDIR (else /var/tmp, else /tmp), made unnamed there,
    /// sparse, its blocks allocated 2 MiB at a time as it is written, up
    /// to 64 times the budget (at least 16 GiB) or that free space, the
    /// less of the two; when the disk has no more room, one line says so
    /// and the pages wait in memory.  The heap holds the budget and the
    /// swap space together (and a little more, for the allocator's
    /// fragmentation); past that, malloc fails.
    #[arg(long = "swap")]
    pub swap: Vec<String>,
    /// Who serves faults.  `handler`: uswap's threads, which serve the
    /// kernel's faults on the heap too (`read(2)` into a buffer that is
    /// out), whatever call makes them; needs root,
    /// vm.unprivileged_userfaultfd=1 or access to /dev/userfaultfd.
    /// `sigbus`: the faulting thread itself, in a signal handler, several
    /// times faster a fault (no thread wake-ups) and open to any user; the kernel
    /// cannot have its faults served there, so the buffers of the calls
    /// that move data (read, write, recv, send, the stat family and their
    /// kin) are brought in and held for the call, and every other system
    /// call given a heap buffer is trapped and served the same way
    /// (--syscall-guard; docs/DESIGN.md lists every call).  A program's
    /// own io_uring or kernel AIO cannot be served there: at its first
    /// `io_uring_setup` or `io_setup` the process stops being paged (its
    /// memory brought back in and kept), said in one line.
    /// `auto` (the default): sigbus, under the guard, for every user; with
    /// `--syscall-guard off`, handler where allowed, else sigbus.  On
    /// whole programs at three times their budget on compressed RAM,
    /// sigbus was faster on every one (2026-12-02, one run each: OpenJDK
    /// 1.09x, Node 1.29x, Perl 1.31x, Python 1.32x, a sort pipeline
    /// 1.47x, sqlite3 1.66x, xz 1.96x; docs/PERFORMANCE.md): in handler
    /// mode each fault is a wake-up of a handler thread and one of the
    /// faulting thread, across CPUs.  Pick `--mode handler` (as root) for
    /// a program that does its IO through io_uring or kernel AIO and must
    /// stay paged.
    #[arg(long, value_enum, default_value_t = RunMode::Auto)]
    pub mode: RunMode,
    /// At exit, print what was swapped on stderr, one block: faults by
    /// kind and the time spent serving them, evictions, swap IO, resident
    /// memory now and at its peak.
    #[arg(long)]
    pub stats: bool,
    /// At exit, write the program's statistics to FILE as JSON (the
    /// fields `uswap stat --json` gives a process).  While it runs,
    /// `uswap stat` and `uswap top` show every process of the tree.
    #[arg(long, value_name = "FILE")]
    pub stats_json: Option<PathBuf>,
    /// With `--budget auto`: write each of the controller's decisions to
    /// FILE, a line each (seconds since the first, the budget set in MiB,
    /// what the tree was charged in MiB, the pressure, and the tree's
    /// faults, swap-ins, swap-cache hits and stall in ms so far), to see how it found the
    /// budget.
    #[arg(long, value_name = "FILE")]
    pub auto_log: Option<PathBuf>,
    /// How far past the budget the heap may stay resident when the swap
    /// is full: a share of the budget (10%), a size (64M), or unbounded.
    /// Past it the program is killed, as a memory cgroup's would be, with
    /// one line saying why; so is the process of a tree with the largest
    /// compressed store when the tree's stores stay past the budget, the
    /// overrun and 16 MiB for 2 s (data that does not compress enough to
    /// fit).  Other memory uswap cannot page (each process's data outside
    /// its heap, stacks) is left as it is past that, said once.
    #[arg(long, default_value = "10%", value_parser = parse_overrun)]
    pub overrun: uswap::pager::Overrun,
    /// Leave a compressed store's memory out of the budget, as a memory
    /// cgroup leaves out kernel zram's: the budget holds the resident
    /// pages (and what else uswap cannot page), and each `zram:SIZE`
    /// store may hold up to SIZE besides.  For comparing with kernel zram
    /// like for like (`uswap bench program`'s zram runners set it), or
    /// where the store's memory is budgeted elsewhere.  Off: the store is
    /// charged, and the budget bounds the tree's whole memory.
    #[arg(long)]
    pub store_outside_budget: bool,
    /// In SIGBUS mode, a seccomp filter traps the system calls given a
    /// heap buffer that the kernel could not read or write because it is
    /// out, and uswap brings the buffer in and makes the call (so no call
    /// fails with EFAULT; docs/DESIGN.md lists them).  It sets
    /// no-new-privileges for an ordinary user: a set-user-ID program the
    /// paged program starts runs without its privileges.  `off`: calls outside
    /// those uswap run interposes may fail with EFAULT instead.
    #[arg(long, value_enum, default_value_t = Guard::On)]
    pub syscall_guard: Guard,
    /// The program and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM"
    )]
    pub program: Vec<OsString>,
}

/// This machine's memory, from /proc/meminfo.
pub(crate) fn mem_total() -> anyhow::Result<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").context("reading /proc/meminfo")?;
    info.lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|kb| kb.trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .context("no MemTotal in /proc/meminfo")
}

/// The memory this process (and what it starts) may use: the machine's,
/// or less where a memory cgroup limits it, with where that limit is.
pub(crate) fn memory_available() -> anyhow::Result<(u64, Option<String>)> {
    let total = mem_total()?;
    Ok(match crate::cgroup::memory_limit() {
        Some((limit, at)) if limit < total => (limit, Some(at)),
        _ => (total, None),
    })
}

fn parse_budget(s: &str) -> anyhow::Result<u64> {
    let (total, limited) = memory_available()?;
    let what = match &limited {
        Some(at) => format!("the memory cgroup's limit ({at})"),
        None => "this machine's memory".to_string(),
    };
    let bytes = if let Some(pct) = s.strip_suffix('%') {
        let pct: f64 = pct
            .trim()
            .parse()
            .ok()
            .filter(|p| *p > 0.0 && *p <= 100.0)
            .with_context(|| format!("--budget {s:?}: a share is 1% to 100%"))?;
        (total as f64 * pct / 100.0) as u64
    } else {
        parse_bytes(s).map_err(|e| anyhow::anyhow!("--budget: {e}"))?
    };
    let page = uswap::PAGE_SIZE as u64;
    if bytes < 1 << 20 {
        bail!("--budget {s}: at least 1M, so that a batch of pages fits");
    }
    if bytes > total {
        bail!(
            "--budget {s} is more than {what}, {:.1} GiB: a budget it cannot hold pages nothing out; give at most {}M, or a share such as 50%",
            total as f64 / (1u64 << 30) as f64,
            total >> 20
        );
    }
    Ok(bytes / page * page)
}

/// One device as the library reads it: its swap spec, in the canonical
/// form, with the file's path made absolute; and its bytes.
fn device_line(spec: &str) -> anyhow::Result<(String, u64)> {
    let d: SwapDeviceSpec = spec
        .parse()
        .map_err(|e: uswap::spec::SpecError| anyhow::anyhow!("--swap: {e}"))?;
    let d = match d.file_options().map(|f| std::path::absolute(f.path())) {
        Some(Err(e)) => bail!("--swap {spec}: the path: {e}"),
        Some(Ok(path)) if memory_backed(&path).is_some() => bail!(
            "--swap {spec}: {} is on {}, which keeps its files in memory: pages swapped there would use as much memory as they free; give a path on a disk, or use zram:SIZE to compress in memory",
            path.display(),
            memory_backed(&path).unwrap_or_default()
        ),
        Some(Ok(path)) => d.map_file(|f| f.with_path(path)),
        None => d,
    };
    let d = match d.nbd_target().cloned() {
        Some(mut t) => {
            // A socket path the program's processes find wherever they
            // run from, and a size every one of them agrees on: asked of
            // the server now, so that a server not there, or not willing,
            // is said before the program starts.
            if let uswap::spec::Endpoint::Unix { path } = &mut t.endpoint {
                *path =
                    std::path::absolute(&*path).with_context(|| format!("--swap {spec}: the socket path"))?;
            }
            let export = uswap::io::nbd::probe(&t).map_err(|e| anyhow::anyhow!("--swap: {e}"))?;
            let size = match t.size {
                Some(s) if s > export => bail!(
                    "--swap {spec}: the export is {export} bytes, less than the size={s} asked for; ask for less, or give the server a larger export"
                ),
                Some(s) => s,
                None => export,
            };
            let page = uswap::PAGE_SIZE as u64;
            t.size = Some(size / page * page);
            match d {
                SwapDeviceSpec::Compressed { options, priority } => SwapDeviceSpec::Compressed {
                    options: options.nbd(t),
                    priority,
                },
                SwapDeviceSpec::Remote { priority, .. } => SwapDeviceSpec::Remote { target: t, priority },
                d => d,
            }
        }
        None => d,
    };
    let line = d.to_string();
    if line.contains('\n') {
        bail!("--swap {spec}: give a path without newlines");
    }
    Ok((line, d.bytes()))
}

/// Free bytes in the file system holding `dir`.
fn free_space(dir: &Path) -> anyhow::Result<u64> {
    let st = rustix::fs::statvfs(dir).with_context(|| format!("{}: statvfs", dir.display()))?;
    Ok(st.f_bavail * st.f_frsize)
}

/// The file system `path` (or the nearest directory above it that
/// exists) is on, when that keeps its files in memory: "tmpfs" or
/// "ramfs".
fn memory_backed(path: &Path) -> Option<&'static str> {
    const TMPFS: i64 = 0x0102_1994;
    const RAMFS: i64 = 0x8584_58f6;
    let dir = path.ancestors().find(|p| p.exists())?;
    let st = rustix::fs::statfs(dir).ok()?;
    match st.f_type as i64 {
        TMPFS => Some("tmpfs"),
        RAMFS => Some("ramfs"),
        _ => None,
    }
}

/// The default swap device: a file that grows as pages go out
/// ([`growing_file`]) in the first of $TMPDIR, /var/tmp and /tmp that is a
/// directory this user may write and is not memory (a swap file on tmpfs
/// would be memory: a container's /tmp often is, and a distroless image
/// has no /var/tmp).  Where none is, a compressed store of four times the
/// budget (its memory counts against the budget).
fn default_swap(budget: u64) -> anyhow::Result<(String, u64)> {
    let writable = |d: &Path| {
        d.is_dir()
            && rustix::fs::access(d, rustix::fs::Access::WRITE_OK | rustix::fs::Access::EXEC_OK).is_ok()
    };
    let dir = std::env::var_os("TMPDIR")
        .map(PathBuf::from)
        .into_iter()
        .chain(["/var/tmp", "/tmp"].map(PathBuf::from))
        .find(|d| writable(d) && memory_backed(d).is_none());
    match dir {
        Some(dir) => growing_file(&dir, DEFAULT_MOST.max(DEFAULT_TIMES * budget)),
        None => device_line(&format!("zram:{}", 4 * budget)),
    }
}

/// The most swap a file that grows may hold: what uswap run's heap holds
/// less room for the budget.
const GROWING_MOST: u64 = 1 << 40;

/// The default swap file grows to 64 times the budget, at least 16 GiB,
/// and no further than its file system can spare.  Not a limit a program
/// meets in use (kernel swap in a memory cgroup has none; the 8 times of
/// before killed a 100 MB dict at 16 MiB) but one on the metadata every
/// process of a tree keeps for it: a cluster's lock and list links per 2
/// MiB of swap, written when the device is made (56 GiB, a disk's free
/// space, cost each process 1.4 MiB, and a `make -j2` tree of a dozen
/// past its bound).  `--swap file:DIR` grows to all the disk can spare.
const DEFAULT_MOST: u64 = 16 << 30;
const DEFAULT_TIMES: u64 = 64;

/// A swap file in directory `dir` with no size given: made there with no
/// name (nothing another user put there can stand in its way), sparse,
/// and allocated as pages go out (`:grow`), up to what its file system can
/// spare: the free space now less a reserve kept free (a tenth of it, at
/// least 1 GiB, at most half), at most `most`.
fn growing_file(dir: &Path, most: u64) -> anyhow::Result<(String, u64)> {
    let page = uswap::PAGE_SIZE as u64;
    let free = free_space(dir)?;
    let reserve = uswap::io::reserve_for(free);
    let bytes = free.saturating_sub(reserve).min(most) / page * page;
    if bytes < 1 << 20 {
        bail!(
            "{}: {} MiB free, less the {} MiB kept in reserve, leaves no room for a swap file; free some, or give --swap file:PATH:SIZE elsewhere",
            dir.display(),
            free >> 20,
            reserve >> 20
        );
    }
    device_line(&format!("file:{}:{bytes}:grow", dir.display()))
}

/// Where `program` is: itself with a slash, else the first executable of
/// that name on `PATH`, as `exec` finds it.
fn resolve(program: &std::ffi::OsStr) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let p = Path::new(program);
    if program.as_encoded_bytes().contains(&b'/') {
        return Some(p.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(p))
        .find(|c| std::fs::metadata(c).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

/// Whether the ELF file at `path` has no program interpreter: statically
/// linked, so the loader (and with it `LD_PRELOAD`) never runs.  A script
/// is judged by its interpreter.  None when it cannot be read as either.
fn statically_linked(path: &Path, depth: u32) -> Option<bool> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).ok()?;
    let mut head = [0u8; 256];
    let n = f.read(&mut head).ok()?;
    if head[..n].starts_with(b"#!") && depth < 4 {
        let line = head[2..n].split(|&b| b == b'\n').next()?;
        let interp = std::str::from_utf8(line).ok()?.split_whitespace().next()?;
        return statically_linked(Path::new(interp), depth + 1);
    }
    if n < 64 || &head[..4] != b"\x7fELF" || head[4] != 2 {
        return None;
    }
    let u16_at = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
    let phoff = u64::from_le_bytes(head[32..40].try_into().ok()?);
    let (phentsize, phnum) = (u16_at(&head, 54) as u64, u16_at(&head, 56) as u64);
    let mut ph = vec![0u8; (phentsize * phnum) as usize];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut ph, phoff).ok()?;
    const PT_INTERP: u32 = 3;
    let interp = ph
        .chunks_exact(phentsize as usize)
        .any(|h| u32::from_le_bytes([h[0], h[1], h[2], h[3]]) == PT_INTERP);
    Some(!interp)
}

/// A program the preload library cannot enter (statically linked: a Go
/// binary, a musl build) is refused in one line before it starts: none of
/// its memory could be paged or counted, and the budget would be a
/// promise nothing keeps.  One that runs with privileges (set-user-ID or
/// set-group-ID) runs unpaged, said in one line.  (A set-user-ID program
/// the paged program runs later, under the system-call guard's
/// no-new-privileges, runs without its privileges; a static one it runs
/// later runs unpaged.)
fn name_the_program(program: &std::ffi::OsStr) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let Some(path) = resolve(program) else {
        return Ok(());
    };
    let shown = path.display();
    if statically_linked(&path, 0) == Some(true) {
        bail!(
            "{shown} is statically linked: uswap's library cannot be loaded into it, so none of its memory could be paged or held to the budget; run it without uswap run, or use a dynamically linked build (for Go, CGO_ENABLED=1 with -linkmode external)"
        );
    }
    let Ok(meta) = std::fs::metadata(&path) else {
        return Ok(());
    };
    // Set-user-ID (0o4000) to another user, or set-group-ID (0o2000) to
    // another group: the exec changes who the program is.
    let elevates = (meta.mode() & 0o4000 != 0 && meta.uid() != rustix::process::getuid().as_raw())
        || (meta.mode() & 0o2000 != 0 && meta.gid() != rustix::process::getgid().as_raw());
    if elevates {
        eprintln!(
            "uswap run: {shown} is set-user-ID or set-group-ID: the loader ignores LD_PRELOAD for it, so it runs unpaged, with its privileges"
        );
    }
    Ok(())
}

/// The preload library beside this executable.
pub fn run(args: &RunArgs) -> anyhow::Result<()> {
    let auto = uswap_bench::auto_spec::parse(&args.budget)?;
    let budget = match &auto {
        Some(a) => match a.start {
            Some(b) => b / uswap::PAGE_SIZE as u64 * uswap::PAGE_SIZE as u64,
            None => parse_budget("50%")?,
        },
        None => parse_budget(&args.budget)?,
    };
    let lib = crate::preload::library()?;
    let mut lines = Vec::new();
    let mut swap_bytes = 0;
    if args.swap.is_empty() {
        let (line, b) = default_swap(budget)?;
        lines.push(line);
        swap_bytes += b;
    }
    for spec in &args.swap {
        // `file:DIR` with no size: a file there that grows, as the default.
        let (line, b) = match spec.strip_prefix("file:").map(Path::new) {
            Some(dir) if dir.is_dir() => growing_file(dir, GROWING_MOST)?,
            _ => device_line(spec)?,
        };
        lines.push(line);
        swap_bytes += b;
    }
    // Address space for the heap: what the budget and the swap space hold
    // together, a quarter more and 64 MiB, so that mimalloc finds room for
    // a large block (it places one in whole 64 KiB slices of its arena,
    // which fragments: a 64 MiB block did not fit in a 128 MiB arena that
    // held a 32 MiB one).  Past it malloc fails, as memory runs out under
    // kernel swap; just short of it, pages that find no slot stay
    // resident, counted over budget.
    //
    // And at least the memory the tree may use (this machine's, or the
    // cgroup's) and the swap space: programs reserve more than they touch
    // (`xz -9` allocates 674 MiB and touches what its input needs), which
    // the kernel's overcommit allows, so the heap's address space must
    // not be what refuses them.  Address space costs nothing here: the
    // pager's tables are committed as pages are used.
    let whole = budget + swap_bytes;
    let reserve = memory_available()?.0 + swap_bytes;
    let heap = (whole + whole / 4 + (64 << 20))
        .max(reserve)
        .min(uswap_env::HEAP_MAX.max(whole))
        .next_multiple_of(uswap_env::HEAP_ALIGN);
    if heap > uswap_env::HEAP_MAX {
        bail!(
            "a heap for a budget of {} MiB and {} MiB of swap would be {} GiB, past the {} GiB uswap run's allocator can hold: give less swap (--swap)",
            budget >> 20,
            swap_bytes >> 20,
            heap >> 30,
            uswap_env::HEAP_MAX >> 30
        );
    }
    let preload = match std::env::var_os("LD_PRELOAD") {
        Some(old) if !old.is_empty() => {
            let mut p = lib.into_os_string();
            p.push(":");
            p.push(old);
            p
        }
        _ => lib.into_os_string(),
    };
    let mode = match args.mode {
        // The guard covers what handler-thread mode was chosen for: the
        // kernel's accesses to the heap on the program's behalf, and a
        // program's own io_uring or AIO by ending its paging (said once),
        // where handler-thread mode costs a cross-CPU wake-up pair a fault.
        RunMode::Auto if args.syscall_guard == Guard::On => RunMode::Sigbus,
        RunMode::Auto if uswap::uffd::Uffd::kernel_faults_allowed() => RunMode::Handler,
        RunMode::Auto => RunMode::Sigbus,
        // Asked for by a user who may not have it: refused here, in one
        // line (a process of the tree that later runs as another user is
        // paged in SIGBUS mode instead, by the preload library).
        RunMode::Handler if !uswap::uffd::Uffd::kernel_faults_allowed() => {
            bail!("{}", uswap::uffd::UffdError::Permission)
        }
        m => m,
    };
    name_the_program(&args.program[0])?;
    let page = uswap::PAGE_SIZE as u64;
    let overrun = match args.overrun.pages((budget / page) as usize) {
        usize::MAX => u64::MAX,
        p => p as u64,
    };
    let arbiter = uswap::domain::Arbiter::create(budget)
        .context("the process tree's budget")?
        .overrun(overrun)
        .store_outside(args.store_outside_budget);
    let mut cmd = std::process::Command::new(&args.program[0]);
    cmd.args(&args.program[1..])
        .env("LD_PRELOAD", preload)
        // mimalloc reserves no arena of its own before uswap's is there
        // (what is allocated before stays in ordinary memory).
        .env("MIMALLOC_ARENA_RESERVE", "0")
        .env(uswap_env::DOMAIN, arbiter.env_value())
        .env(uswap_env::BUDGET, budget.to_string())
        .env(uswap_env::HEAP, heap.to_string())
        .env(uswap_env::SWAP, lines.join("\n"))
        .env(uswap_env::OVERRUN, args.overrun.to_string())
        .env(
            uswap_env::MODE,
            match mode {
                RunMode::Handler => "handler",
                _ => "sigbus",
            },
        );
    if args.stats {
        cmd.env(uswap_env::STATS, "1");
    }
    if let Some(p) = &args.stats_json {
        let p = std::path::absolute(p).with_context(|| format!("--stats-json {}", p.display()))?;
        // Said now, not at the program's end: a file that cannot be
        // written there would lose the run's numbers.
        std::fs::File::create(&p).with_context(|| format!("--stats-json {}", p.display()))?;
        cmd.env(uswap_env::STATS_JSON, p);
    }
    // In handler-thread mode too: a process of the tree that runs as a
    // user who may not have that mode (a privilege drop, then an exec) is
    // paged in SIGBUS mode, under the guard, at this layout.
    if args.syscall_guard == Guard::On {
        let mut random = [0u8; 8];
        rustix::rand::getrandom(&mut random, rustix::rand::GetRandomFlags::empty()).context("getrandom")?;
        let layout =
            uswap_env::GuardLayout::new(u64::from_ne_bytes(random), heap, uswap_env::seccomp_filters());
        cmd.env(uswap_env::GUARD, layout.to_env());
    }
    let mut auto = auto.map(|a| crate::autobudget::AutoBudget::new(a.tuning, budget / page, &arbiter));
    if let Some(p) = &args.auto_log {
        let Some(a) = auto.as_mut() else {
            bail!(
                "--auto-log {}: the controller's log is --budget auto's; give --budget auto",
                p.display()
            );
        };
        let f = std::fs::File::create(p).with_context(|| format!("--auto-log {}", p.display()))?;
        a.log_to(f)
            .with_context(|| format!("--auto-log {}", p.display()))?;
    }
    let ended = crate::supervisor::supervise(cmd, arbiter, auto)?;
    // What members killed outright, or gone through a raw `exit_group`
    // (Go's runtime leaves that way: no exit handler of the library
    // runs), left in the statistics directory.  With `--stats` their
    // last numbers are said here, since they could not say them.
    let left = uswap::stats::live::remove_group(&uswap::stats::live::directory(), std::process::id() as i32);
    if args.stats && !left.is_empty() {
        eprint!(
            "{}",
            crate::watch::stat::left_without_exit(std::process::id() as i32, left)
        );
    }
    crate::supervisor::end_as(ended)
}
