//! The `uswap` command line.

mod autobudget;
mod cgroup;
mod ctl;
mod debug;
mod demo;
mod preload;
mod run;
mod seccomp;
mod supervisor;
mod watch;

use anyhow::Result;
use clap::{CommandFactory, Parser, Subcommand};
use uswap_bench::{micro, workload};

/// uswap: a swap subsystem in user space, after the Linux swap design.
///
/// `uswap run --budget 1G -- PROGRAM` runs a program, and all it starts,
/// paged under a budget; `uswap stat` and `uswap top` show what it holds
/// while it runs.  `uswap demo` maps memory larger than a budget and
/// pages it out and in transparently.
/// `uswap bench` reproduces the seed patches' experiments on uswap's core:
/// every seed mechanism is a switch, and each bench measures the shipped
/// configuration ("default") against each switch flipped back to the
/// behaviour before its seed, interleaved in one run.
#[derive(Parser, Debug)]
#[command(name = "uswap", version = env!("USWAP_VERSION"), propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once at startup: the size of the larger variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Command {
    /// Map a region larger than a memory budget, fill it from several
    /// threads, verify every byte, and show what was swapped.
    ///
    /// Any user may run it: in SIGBUS mode (the default) uswap opens its
    /// userfaultfd for user-mode faults only when it lacks the privilege
    /// for more (Linux 5.11+; uswap itself needs 6.8+ for UFFDIO_MOVE).
    /// `--mode handler` serves the kernel's faults too and needs root,
    /// vm.unprivileged_userfaultfd=1 or access to /dev/userfaultfd.
    Demo(demo::DemoArgs),
    /// Run a program, and every process it starts, paged by uswap under one budget.
    ///
    /// `uswap run --budget 1G -- python3 big.py`: the program's malloc
    /// family is mimalloc over a uswap region (a library preloaded with
    /// LD_PRELOAD, carried inside this executable); what
    /// the heap holds beyond the budget goes to swap and comes back on
    /// access.  Paged: the malloc heap of a dynamically linked program
    /// and its threads, and the private anonymous memory it maps itself,
    /// however its runtime maps it (mmap, reservations committed later
    /// as OpenJDK, V8 and Go's cgo runtime do, munmap, mremap, madvise),
    /// for any user (SIGBUS mode, the default) or, with the privilege
    /// for kernel faults, by handler threads (`--mode handler`).  Every process
    /// the program starts (a shell's commands, a pipeline, make, Python's
    /// spawn workers, a child that forks without exec) is paged too, the
    /// whole tree under the one budget, as a memory cgroup holds it;
    /// `uswap run` stays as its supervisor and ends as the program does.
    /// Not paged: statically linked programs (refused; started by the
    /// program, they run unpaged), set-user-ID ones, shared and file
    /// mappings.
    ///
    /// Exit status: the program's (128+N when a signal N ended it); 125
    /// when `uswap run` itself fails before the program starts, with one
    /// line saying why and how to fix it.
    Run(run::RunArgs),
    /// What running paged programs hold and do, read while they run:
    /// resident against the budget, swapped by device, the store's ratio,
    /// faults by kind and their latency, evictions, IO, pressure (PSI's
    /// some and full) and events.
    ///
    /// Every instance publishes its statistics in a directory of its
    /// user's ($USWAP_RUNTIME_DIR, else $XDG_RUNTIME_DIR/uswap, else
    /// /tmp/uswap-$UID; mode 0700), read here without a call into the
    /// program and without a lock its pager takes.  A tree under one
    /// `uswap run` is one block, with a row per process.  Text is
    /// `key value` in bytes and counts, as a cgroup's memory.stat;
    /// `--json` and `--prometheus` give every statistic.
    Stat(watch::stat::StatArgs),
    /// A live view of every paged process of this user: resident against
    /// its budget, swapped, store ratio, faults per second and pressure,
    /// refreshed every second; `s` changes the sort, `q` quits.
    Top(watch::top::TopArgs),
    Ctl(ctl::CtlArgs),
    /// gdb attached to a paged program, its swapped memory brought in.
    ///
    /// `uswap gdb PID -- -batch -ex 'x/4gx ADDR'`.  A debugger's reads
    /// (/proc/PID/mem, ptrace, process_vm_readv) fail on a page uswap has
    /// out ("Cannot access memory"), in either fault mode: this asks the
    /// process to bring everything in and hold it there, its budget open,
    /// while gdb runs, then to return to its budget.  The same user as the
    /// process, or root.
    Gdb(debug::GdbArgs),
    /// A core file of a paged program, with its swapped memory: gcore run
    /// while the process holds everything in (see `uswap gdb`).
    ///
    /// A paged program killed by a signal that dumps core writes a whole
    /// core file by itself (uswap brings its memory in first, within
    /// RLIMIT_CORE); this is for one that runs.
    Gcore(debug::GcoreArgs),
    SeccompProfile(seccomp::SeccompArgs),
    /// Print a shell's completions for uswap: `uswap completions bash >
    /// /etc/bash_completion.d/uswap` (zsh: a file `_uswap` on $fpath;
    /// fish: ~/.config/fish/completions/uswap.fish).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print uswap's manual page (roff): `uswap man | man -l -`, or save it
    /// as /usr/local/share/man/man1/uswap.1.  Each command's page with
    /// `uswap man COMMAND` (uswap-run.1 and so on).
    Man {
        /// A command's own page, e.g. `run`.
        command: Option<String>,
    },
    /// Benchmarks of the core, one per seed experiment.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// Slot allocation on a fragmented device with swap-cache traffic
    /// (seeds 000 and 001).
    ///
    /// Each device is filled, then random slots are freed down to
    /// --occupancy, as pmbench's random accesses leave it: free slots
    /// everywhere, no free cluster.  Each thread then allocates a slot,
    /// adds it to the swap cache, and frees a random slot it holds.
    /// Variants: default; no-fragmented-scan (before seed 000: a refill on
    /// a fragmented device returns one slot); shared-scan-base (before seed
    /// 001: all CPUs scan from one base, into one swap-cache trunk);
    /// no-slot-cache (every allocation takes the device lock);
    /// nonfull-clusters (kernel 6.12's cluster lists instead of the linear
    /// scan).  Watch the swap_info and swap_cache_trunk lock columns.
    Alloc(micro::alloc::AllocArgs),
    /// Extent lookups: balanced tree vs linear list with a one-entry cache
    /// (seed 004).
    ///
    /// A 20 GiB device split into --extents extents; each thread looks up
    /// consecutive slots from its own start, as swap-out does.  With one
    /// thread the list's one-entry cache always hits; with several, they
    /// move the shared cursor under each other and the list is walked.
    Extent(micro::extent::ExtentArgs),
    /// The compressed device's codecs on the benches' pages:
    /// bytes a page compresses to, and nanoseconds to compress and to
    /// decompress one, for lz4 and zstd levels.
    Codec(micro::codec::CodecArgs),
    /// LRU activation: per-CPU batches vs one lock per page (seed 002).
    ///
    /// Threads activate and deactivate disjoint slices of --pages pages,
    /// --passes times; the total time is compared.  Variants: default
    /// (batches of 31), batch-15 (the seed's pagevec), unbatched-lru
    /// (before seed 002: the LRU lock for every page).
    Lru(micro::lru::LruArgs),
    /// Microseconds per page fault served by uswap (zero fill, swap-in from
    /// RAM and from a file) next to the kernel's own anonymous fault and
    /// the floor of userfaultfd itself (bare-uffd: a SIGBUS handler doing
    /// one UFFDIO_COPY and nothing else).
    ///
    /// Needs userfaultfd (root).  Each run touches every page of a fresh
    /// --mib region once; swap-in variants write the region first under a
    /// budget a quarter of its size, so the touches read pages back; the
    /// swap-cache-hit variant touches only pages still staged (no IO).
    Fault(micro::fault::FaultArgs),
    /// 2 MB units: one whole cluster vs 512 single slots (seed 003).
    ///
    /// Threads swap 2 MB units out (allocate, add to the swap cache) and
    /// back in (delete, free), keeping --inflight units out each.
    /// no-huge-cluster is the behaviour before seed 003: the unit split
    /// into 512 pages, each allocated, cached and freed alone.  No IO.
    Huge(micro::huge::HugeArgs),
    /// pmbench: random page accesses (80% reads) over a working set well
    /// above the budget; accesses/s, swap GB/s, latency percentiles.
    ///
    /// The seeds' score (000, 001).  --compare runs uswap (RAM device),
    /// uswap-file, kernel-zram and kernel-file on the same workload,
    /// interleaved; the kernel runs get a memory cgroup with the same budget
    /// and a fresh zram0 or swap file, removed afterwards (root; refused
    /// while another swap is on).  --ablate runs uswap once per seed switch
    /// flipped back.  Defaults fit a 2-core, 24 GB machine: 2 GiB working
    /// set, 512 MiB budget, 8 s per run.
    Pmbench(workload::side_by_side::PmbenchArgs),
    /// seq-write (vm-scalability swap-w-seq): threads write their slices of
    /// the region once, sequentially, through the budget into swap; with
    /// 4 KiB pages and 2 MB units (seed 003).
    ///
    /// Reports write and swap-out GB/s.  Same backends, --compare and
    /// --ablate as pmbench.
    SeqWrite(workload::side_by_side::SeqWriteArgs),
    /// activate (seed 002): each round maps one region, every thread
    /// touches all of it, and it is unmapped; seconds per round and the LRU
    /// lock's statistics.
    ///
    /// With the budget below the region, pages touched again after
    /// eviction come back and are activated; --ablate --variants
    /// unbatched-lru is the behaviour before seed 002.
    Activate(workload::side_by_side::ActivateArgs),
    /// An unmodified program larger than its budget: under `uswap run`
    /// (RAM or file swap), in a memory cgroup with kernel swap (zram or a
    /// swap file), and without a limit, interleaved round by round.
    ///
    /// `uswap bench program --budget 64M -- python3 big.py`.  Wall, user and
    /// system seconds and peak RSS per runner; every run's output must
    /// match the unlimited run's.  Kernel runners need root and set up and
    /// remove their cgroup and swap around each run.
    Program(workload::program::ProgramArgs),
    /// Internal: one workload run in its own process.
    #[command(hide = true)]
    Worker(workload::worker::WorkerArgs),
}

fn main() {
    let cli = Cli::parse();
    let name = match &cli.command {
        Command::Demo(_) => "uswap demo",
        Command::Run(_) => "uswap run",
        Command::Stat(_) => "uswap stat",
        Command::Top(_) => "uswap top",
        Command::Ctl(_) => "uswap ctl",
        Command::Gdb(_) => "uswap gdb",
        Command::Gcore(_) => "uswap gcore",
        Command::SeccompProfile(_) => "uswap seccomp-profile",
        Command::Completions { .. } => "uswap completions",
        Command::Man { .. } => "uswap man",
        Command::Bench(_) => "uswap bench",
    };
    if let Err(e) = run(cli) {
        // One line, named for the command: what failed, then why (`{:#}`
        // joins the causes), as the lines the preload library says are.
        eprintln!("{name}: {e:#}");
        std::process::exit(match name {
            "uswap run" => uswap::run_env::RUN_FAILED,
            _ => 1,
        });
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Demo(a) => demo::run(&a),
        Command::Run(a) => run::run(&a),
        Command::Stat(a) => watch::stat::run(&a),
        Command::Top(a) => watch::top::run(&a),
        Command::Ctl(a) => ctl::run(&a),
        Command::Gdb(a) => debug::gdb(&a),
        Command::Gcore(a) => debug::gcore(&a),
        Command::SeccompProfile(a) => seccomp::run(&a),
        Command::Completions { shell } => {
            // Into a buffer first: clap_complete panics on a failed write
            // (`| head`), where a command should stop quietly.
            let mut text = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "uswap", &mut text);
            print_quietly(&text)
        }
        Command::Man { command } => man(command.as_deref()),
        Command::Bench(b) => match b {
            BenchCommand::Alloc(a) => micro::alloc::run(&a),
            BenchCommand::Extent(a) => micro::extent::run(&a),
            BenchCommand::Codec(a) => micro::codec::run(&a),
            BenchCommand::Lru(a) => micro::lru::run(&a),
            BenchCommand::Huge(a) => micro::huge::run(&a),
            BenchCommand::Fault(a) => micro::fault::run(&a),
            BenchCommand::Pmbench(a) => workload::side_by_side::pmbench(&a),
            BenchCommand::SeqWrite(a) => workload::side_by_side::seq_write(&a),
            BenchCommand::Activate(a) => workload::side_by_side::activate(&a),
            BenchCommand::Program(a) => workload::program::run(&a),
            BenchCommand::Worker(a) => workload::worker::main(&a),
        },
    }
}

/// The manual page of uswap, or of one of its commands, on stdout.
fn man(command: Option<&str>) -> Result<()> {
    let mut cli = Cli::command();
    cli.build();
    let page = match command {
        None => cli,
        Some(name) => {
            let Some(sub) = cli.find_subcommand(name) else {
                let names: Vec<_> = cli.get_subcommands().map(|c| c.get_name().to_owned()).collect();
                anyhow::bail!("no command {name}: one of {}", names.join(", "));
            };
            // Named as man(1) pages of subcommands are: uswap-run(1).  (A
            // name is `&'static` without clap's `string` feature; this
            // runs once, at the end of the process.)
            let full: &'static str = Box::leak(format!("uswap-{name}").into_boxed_str());
            sub.clone().name(full).bin_name(full)
        }
    };
    let mut text = Vec::new();
    clap_mangen::Man::new(page).render(&mut text)?;
    print_quietly(&text)
}

/// Write `text` to stdout; a reader that went away (EPIPE) is not an
/// error.
fn print_quietly(text: &[u8]) -> Result<()> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}
