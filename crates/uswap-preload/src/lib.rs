//! The library `uswap run` preloads into a program (`LD_PRELOAD`): the
//! program's malloc heap, and the anonymous memory it maps itself
//! (`maps.rs`), live in a uswap region, paged under a budget.
//!
//! The heap is mimalloc (built from source by `libmimalloc-sys`): this
//! library exports `malloc`, `free` and the rest of the family, each
//! forwarding to mimalloc's, so they interpose on libc's (a static
//! library's own exports would be hidden by a cdylib's version script).
//! At load, before the program's `main`, `init` reads the configuration
//! `uswap run` left in the environment, starts a `Swap`, maps one region
//! (what the budget and the swap space hold together, and a margin for
//! mimalloc's fragmentation), and hands it to mimalloc as an arena
//! (`mi_manage_os_memory_ex`); from then on mimalloc takes memory from
//! that arena alone (`disallow_os_alloc`).  What was allocated before (the
//! loader's and libc's start-up, a few KiB) stays in ordinary memory:
//! `uswap run` sets `MIMALLOC_ARENA_RESERVE=0`, so that it is not a
//! 1 GiB arena of mimalloc's own that later allocations would fill first.
//!
//! Freed memory goes back as the kernel's `munmap` would give it: mimalloc
//! purges what stays free for `heap::PURGE_DELAY_MS` with
//! `MADV_DONTNEED`, which the interposed `madvise` turns into uswap's
//! discard (the kernel's call would reach neither a page uswap has
//! swapped out nor its slot).  Purging was off before: freed memory
//! stayed resident, charged to the budget, until uswap wrote it to swap
//! like any cold page.
//!
//! uswap's own memory (its page tables, LRU, frame pools) must not be in
//! the region it pages: its Rust code allocates through glibc's own
//! allocator (`__libc_malloc`, `LibcMalloc`), never through the
//! interposed `malloc`; and what C code allocates in uswap's threads
//! (glibc's own bookkeeping) goes there too (`heap::to_libc`).
//!
//! Which process is paged: every image that finds `uswap run`'s settings
//! in its environment: the program, every image it `exec`s, and every
//! process it starts that keeps `LD_PRELOAD` (a shell's commands, a
//! pipeline's, Python's `spawn` workers), each with an instance of its
//! own, all joined to the tree's budget domain (`uswap::domain`) that
//! `uswap run`, their supervisor, holds.
//!
//! Nothing is left behind: a swap file uswap creates has no name
//! (`O_TMPFILE`; its descriptor closes at `exec` and exit), and threads
//! and the userfaultfd go with the process.

use std::ffi::c_void;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::OnceLock;

use libmimalloc_sys::mi_option_set;
use uswap::pager::{FaultMode, Swap, SwapDeviceSpec};
use uswap::run_env as env;

/// The next definition of a symbol after this library's (libc's), looked
/// up once.
macro_rules! next {
    ($name:literal as fn($($arg:ty),* $(,)?) -> $ret:ty) => {{
        static AT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let mut at = AT.load(std::sync::atomic::Ordering::Relaxed);
        if at == 0 {
            // SAFETY: a symbol lookup with a C string.
            at = unsafe { libc::dlsym(libc::RTLD_NEXT, concat!($name, "\0").as_ptr().cast()) } as usize;
            if at == 0 {
                crate::running::fatal(concat!("uswap run: libc has no ", $name));
            }
            AT.store(at, std::sync::atomic::Ordering::Relaxed);
        }
        // SAFETY: libc's function of that name has this C signature.
        unsafe { std::mem::transmute::<usize, unsafe extern "C" fn($($arg),*) -> $ret>(at) }
    }};
}

#[macro_use]
mod callers;
mod calls;
mod core_dump;
mod credentials;
mod descriptors;
mod guard;
mod heap;
mod listing;
mod maps;
mod paths;
mod pins;
mod running;
mod signals;
mod syscalls;

use heap::{MI_OPTION_ARENA_MAX_OBJECT_SIZE, MI_OPTION_DISALLOW_OS_ALLOC, MI_OPTION_PURGE_DELAY};
use running::{say, Running, RUNNING};

struct Config {
    budget: u64,
    /// The process tree's budget domain (`uswap::domain`), as the
    /// environment names it.
    domain: Option<String>,
    /// This is the program `uswap run` started (its child), not a process
    /// the program started: `--stats` is its to print.
    root: bool,
    heap: u64,
    /// One swap spec per line of `USWAP_RUN_SWAP`.
    devices: Vec<SwapDeviceSpec>,
    mode: FaultMode,
    overrun: uswap::pager::Overrun,
    stats: bool,
    /// `--stats-json`: where to write the statistics at exit.
    stats_json: Option<std::path::PathBuf>,
    /// Where the heap goes, under the system-call guard.
    guard: Option<env::GuardLayout>,
}

impl Config {
    /// What the environment asks of this process; None when it is not
    /// part of a run, or a child of it with nothing to do.
    fn read() -> Result<Option<Start>, String> {
        let guard = match std::env::var(env::GUARD) {
            Ok(g) => Some(
                env::GuardLayout::parse(&g)
                    .ok_or_else(|| format!("{}={g}: not a guard layout", env::GUARD))?,
            ),
            Err(_) => None,
        };
        let Ok(budget) = std::env::var(env::BUDGET) else {
            // Not part of a run (the program's own LD_PRELOAD passed on
            // without uswap run's settings): nothing to page; the
            // guard's trampoline where its filter was inherited.
            return Ok(guard.map(Start::Inherited));
        };
        let num = |name: &str, v: &str| v.trim().parse::<u64>().map_err(|e| format!("{name}={v}: {e}"));
        let budget = num(env::BUDGET, &budget)?;
        let heap = num(env::HEAP, &std::env::var(env::HEAP).unwrap_or_default())?;
        let mut devices = Vec::new();
        for line in std::env::var(env::SWAP).unwrap_or_default().lines() {
            devices.push(
                line.parse::<SwapDeviceSpec>()
                    .map_err(|e| format!("{}: {e}", env::SWAP))?,
            );
        }
        let mode = match std::env::var(env::MODE).as_deref() {
            Ok("sigbus") => FaultMode::Sigbus,
            // A process of the run that may not have what handler-thread
            // mode needs (a program that dropped privileges, `runuser -u
            // nobody`, `subprocess.run(user=...)`, then exec'd: the
            // userfaultfd that serves the kernel's faults is root's) is
            // paged as its user may be, in SIGBUS mode, under the guard
            // whose layout `uswap run` passes in either mode.
            Ok("handler") | Err(_) if !uswap::uffd::Uffd::kernel_faults_allowed() && guard.is_some() => {
                FaultMode::Sigbus
            }
            Ok("handler") | Err(_) => FaultMode::HandlerThread,
            Ok(other) => return Err(format!("{}={other}: sigbus or handler", env::MODE)),
        };
        let stats = std::env::var_os(env::STATS).is_some();
        let stats_json = std::env::var_os(env::STATS_JSON).map(std::path::PathBuf::from);
        let overrun = match std::env::var(env::OVERRUN) {
            Ok(v) => v.parse().map_err(|e| format!("{}: {e}", env::OVERRUN))?,
            Err(_) => uswap::pager::Overrun::default(),
        };
        let domain = std::env::var(env::DOMAIN).ok();
        // The program itself (or a later image of it): the supervisor's
        // child.  Its children have other parents.
        // SAFETY: getppid has no preconditions.
        let parent = unsafe { libc::getppid() };
        let root = domain
            .as_deref()
            .and_then(|d| d.split_once(':'))
            .is_some_and(|(pid, _)| pid.parse::<i32>() == Ok(parent));
        Ok(Some(Start::Paged(Config {
            budget,
            domain,
            root,
            heap,
            devices,
            mode,
            overrun,
            stats,
            stats_json,
            guard: guard.filter(|_| mode == FaultMode::Sigbus),
        })))
    }
}

/// What this process does at load.
enum Start {
    /// It is the one `uswap run` started: page it.
    Paged(Config),
    /// Another process of the run (past an `exec`), which inherited the
    /// system-call guard's filter: the guard's trampoline and handler
    /// only (`guard::start_inherited`).
    Inherited(env::GuardLayout),
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

/// Start paging before the program's `main`.  A failure of the process
/// `uswap run` started ends it with one line: the program was asked to
/// run under uswap, and running it without would hide that it is not.
/// Another process of the run (a child that changed its user and cannot
/// create the swap file where its parent's went, `subprocess.run(...,
/// user=...)`, `runuser`) is the program's own, which must not fail for
/// uswap's sake: it runs unpaged, said in one line, when nothing of its
/// own has changed yet ([`StartError::Unpaged`]).
extern "C" fn init() {
    let started = match Config::read() {
        Ok(Some(Start::Paged(c))) => {
            let (root, guard) = (c.root, c.guard);
            match start(c) {
                Err(StartError::Unpaged(e)) if !root => {
                    say(&format!(
                        "uswap run: {e}; this process ({}) runs unpaged",
                        running::who()
                    ));
                    if let Some(g) = guard {
                        guard::start_inherited(&g);
                    }
                    Ok(())
                }
                Err(StartError::Unpaged(e) | StartError::Fatal(e)) => Err(e),
                Ok(()) => Ok(()),
            }
        }
        Ok(Some(Start::Inherited(g))) => {
            guard::start_inherited(&g);
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(e) => Err(e),
    };
    if let Err(e) = started {
        eprintln!("uswap run: {e}");
        // SAFETY: ends the process at once, before the program started.
        unsafe { libc::_exit(env::RUN_FAILED) }
    }
}

/// Why a process did not start paging.
enum StartError {
    /// Before its heap was given and its guard started: the process is
    /// as it was without uswap, and may run on so.
    Unpaged(String),
    /// Past that point.
    Fatal(String),
}

impl From<String> for StartError {
    fn from(e: String) -> StartError {
        StartError::Fatal(e)
    }
}

fn start(c: Config) -> Result<(), StartError> {
    // mimalloc's own process state first (its page map above all, which
    // every `free` reads): made now, it is ordinary memory from the
    // kernel; made later, with the region there, it would land in the
    // region and be paged like the program's data.
    // SAFETY: mimalloc's initializer, idempotent.
    heap::mimalloc(|| unsafe { libmimalloc_sys::mi_process_init() });
    callers::start();
    heap::keep_runtime_blocks_out();
    // Before the instance opens any: its descriptors go above the floor.
    descriptors::start();
    // The tree's supervisor, whose pid the domain's name begins with: the
    // statistics of every process of the tree are shown under it.
    let group = c
        .domain
        .as_deref()
        .and_then(|d| d.split_once(':'))
        .and_then(|(pid, _)| pid.parse().ok())
        .unwrap_or(0);
    let mut builder = Swap::builder()
        .budget(c.budget)
        .fault_mode(c.mode)
        .max_mapped(c.heap)
        .overrun(c.overrun)
        // Not paced: the system-call guard touches a call's buffers and
        // exec arguments, then makes the call, and needs what it touched
        // to stay in until the kernel reads it.  Paced, every fault near
        // the budget evicts a batch, which at a small share (a tree's
        // budget split among its processes) took the pages touched just
        // before: a vfork child's execve failed with EFAULT through all
        // of its sixteen tries (the guest tests).
        .paced_reclaim(false)
        // A guest starts no thread it does not need (background.rs).
        .threads_on_need(true)
        .publish(true)
        .group(group);
    // A swap file this creates has no name (uswap creates it unnamed,
    // `O_TMPFILE`): nothing to unlink, nothing left if the program is
    // killed.
    for d in &c.devices {
        builder = builder.device(d.clone());
    }
    if let Some(d) = &c.domain {
        // A process started after the supervisor ended (a background job
        // that outlived the program) finds no domain: it keeps the whole
        // budget to itself, as its own.
        if let Ok(member) = uswap::domain::Member::join(d) {
            builder = builder.domain(member);
        }
    }
    heap::find_libc_usable_size();
    // glibc's allocator holds uswap's own memory here (and the C
    // runtime's blocks): tables of 64 KiB and more each get a mapping of
    // their own, committed as they are used.  glibc's threshold otherwise
    // rises to the size of any mapped block freed, and the tables made
    // after it (a 512 KiB swap cache, a swap map) came from the brk heap,
    // zeroed by `calloc` and resident from the start: 850 KiB of every
    // process's budget.
    // SAFETY: a glibc tunable, set before uswap's allocations.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 10) };
    let swap = builder.build().map_err(|e| StartError::Unpaged(e.to_string()))?;
    let region = match &c.guard {
        None => swap.map(c.heap as usize),
        Some(g) => swap.map_at(g.base as usize, c.heap as usize),
    }
    .map_err(|e| StartError::Unpaged(e.to_string()))?;
    if let Some(g) = &c.guard {
        guard::place(g)?;
    }
    let (start, len) = (region.as_ptr() as *mut c_void, region.len());
    if RUNNING
        .set(Running {
            swap,
            region,
            mode: c.mode,
            // SAFETY: getpid has no preconditions.
            pid: unsafe { libc::getpid() },
            budget: c.budget,
        })
        .is_err()
    {
        return Err(StartError::Fatal("started twice".into()));
    }
    // Marked as calls into mimalloc: any mapping it makes meanwhile goes
    // to the kernel, not to the heap being set up (`maps.rs`).
    // SAFETY: the region is ours for the life of the process (RUNNING is
    // never dropped), mapped, zero, and usable (uswap serves its faults).
    heap::mimalloc(|| unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, heap::PURGE_DELAY_MS) });
    // Blocks as large as an arena (mimalloc caps the option at its
    // arena's size less its metadata): `malloc(4 GiB)` and a JVM's heap
    // reservation would fail at mimalloc's default of 2 GiB.
    // SAFETY: an option setter.
    heap::mimalloc(|| unsafe {
        mi_option_set(MI_OPTION_ARENA_MAX_OBJECT_SIZE, (heap::ARENA_PIECE >> 10) as _)
    });
    // The first arena now, the rest of the region as allocations need it
    // (heap.rs, `give_more`).
    heap::give_first(start.cast(), len)?;
    // SAFETY: an option setter.
    heap::mimalloc(|| unsafe { mi_option_set(MI_OPTION_DISALLOW_OS_ALLOC, 1) });
    pins::start(c.mode, c.budget as usize);
    if let Some(g) = &c.guard {
        guard::start(g)?;
    }
    maps::hold_across_fork();
    signals::keep_alt_stack_across_fork();
    signals::start_own_stacks();
    core_dump::start();
    if c.stats && c.root {
        // A descriptor of its own: programs close stderr on the way out
        // (GNU tools' `close_stdout`, an atexit handler that runs before
        // ours, registered earlier).
        // SAFETY: duplicates descriptor 2.
        unsafe {
            let fd = libc::fcntl(2, libc::F_DUPFD_CLOEXEC, 3);
            STATS_FD.store(uswap::descriptors::place_raw(fd), Ordering::Relaxed);
        }
    }
    if c.root {
        if let Some(p) = c.stats_json {
            let _ = STATS_JSON.set(p);
        }
    }
    // At exit: the statistics said (the program's, if asked) and the
    // published block removed, so that `uswap stat` does not list a
    // process that is gone.  A process killed outright leaves it to the
    // readers, who find it stale.
    // SAFETY: registers a function with no preconditions.
    unsafe { libc::atexit(leave) };
    Ok(())
}

/// `--stats-json`: where the program writes its statistics at exit.
static STATS_JSON: OnceLock<std::path::PathBuf> = OnceLock::new();

extern "C" fn leave() {
    print_stats();
    write_stats_json();
    if let Some(r) = RUNNING.get() {
        r.swap.unpublish();
    }
}

/// `--stats-json FILE`: the statistics, as `uswap stat --json` gives a
/// process's, with the budget and mode.
fn write_stats_json() {
    let (Some(r), Some(path)) = (RUNNING.get(), STATS_JSON.get()) else {
        return;
    };
    // SAFETY: getpid has no preconditions.
    if r.pid != unsafe { libc::getpid() } {
        return;
    }
    let doc = serde_json::json!({
        "pid": r.pid,
        "budget_bytes": r.budget,
        "mode": match (r.mode, r.swap.user_mode_only()) {
            (FaultMode::HandlerThread, _) => "handler",
            (_, true) => "sigbus-user",
            _ => "sigbus",
        },
        "stats": r.swap.stats(),
    });
    if let Err(e) = std::fs::write(path, format!("{doc:#}\n")) {
        say(&format!("uswap run: --stats-json {}: {e}", path.display()));
    }
}

/// Where `--stats` goes: stderr as it was at start.
static STATS_FD: AtomicI32 = AtomicI32::new(-1);

/// `--stats`: what was swapped, one block on stderr, at exit.
fn print_stats() {
    let (Some(r), fd) = (RUNNING.get(), STATS_FD.load(Ordering::Relaxed)) else {
        return;
    };
    // SAFETY: getpid has no preconditions.
    if fd < 0 || r.pid != unsafe { libc::getpid() } {
        // A forked child leaving through `exit`: the block is the
        // program's, said once, by the process `uswap run` started.
        return;
    }
    let st = r.swap.stats();
    let c = &st.counters;
    let mib = |pages: u64| pages as f64 * uswap::PAGE_SIZE as f64 / (1 << 20) as f64;
    let text = format!(
        "uswap run: budget {:.0} MiB (this process's share at its end {:.0} MiB), heap region {:.0} MiB, {}\n  \
         faults {} (zero fills {}, swap-ins {}, swap-cache hits {}, write-protect {}), {:.3} s serving them; \
         pages read ahead {}, zero pages filled around {}\n  \
         evictions {} (clean drops {}, written {}, zero pages {}); swap IO: {:.1} MiB written, {:.1} MiB read\n  \
         resident now {:.1} MiB, at most {:.1} MiB; direct reclaim {}, over budget {}; unevictable {}; shared with a fork: written in place {}, unshared {}\n  \
         stalled in uswap {:.3} s (some thread), {:.3} s (every thread); fault latency p50 <= {:.1} us, p99 <= {:.1} us, max band {:.1} us\n",
        r.budget as f64 / (1 << 20) as f64,
        mib(r.swap.budget_pages() as u64),
        r.region.len() as f64 / (1 << 20) as f64,
        match (r.mode, r.swap.user_mode_only()) {
            (FaultMode::HandlerThread, _) => "handler-thread mode",
            (_, true) => "SIGBUS mode (user-mode faults only)",
            _ => "SIGBUS mode",
        },
        c.faults,
        c.zero_fills,
        c.swapins,
        c.swapcache_hits,
        c.wp_faults,
        c.fault_ns as f64 / 1e9,
        c.readahead,
        c.fault_around,
        c.evictions,
        c.evict_clean,
        c.evict_write,
        c.evict_zero,
        mib(c.io_write_pages),
        mib(c.io_read_pages),
        mib(r.swap.resident_pages() as u64),
        mib(r.swap.peak_resident_pages() as u64),
        c.direct_reclaim,
        c.budget_overrun,
        c.unevictable,
        c.evict_shared,
        c.evict_unshared,
        st.pressure.some.total_us as f64 / 1e6,
        st.pressure.full.total_us as f64 / 1e6,
        st.fault_latency.quantile_ns(0.5) as f64 / 1e3,
        st.fault_latency.quantile_ns(0.99) as f64 / 1e3,
        st.fault_latency.quantile_ns(1.0) as f64 / 1e3,
    );
    let mut text = text;
    if st.gauges.store_limit_bytes > 0 {
        let g = &st.gauges;
        let pages = g.store_orig_bytes / uswap::PAGE_SIZE as u64;
        text.push_str(&format!(
            "  compressed store: {} pages in {:.1} MiB ({:.0} bytes a page; at most {:.1} MiB), {} same-filled, {} stored whole, {} written back to the file\n",
            pages,
            g.store_mem_bytes as f64 / (1 << 20) as f64,
            g.store_mem_bytes as f64 / pages.max(1) as f64,
            g.store_mem_peak_bytes as f64 / (1 << 20) as f64,
            g.store_same_pages,
            g.store_whole_pages,
            c.store_writebacks,
        ));
    }
    // SAFETY: writes our own buffer to our own descriptor.
    unsafe { libc::write(fd, text.as_ptr().cast(), text.len()) };
}
