//! The `uswap` command line.

mod bench;

use anyhow::Result;
use clap::{Parser, Subcommand};

/// uswap: a swap subsystem in user space, after the Linux swap design.
///
/// `uswap bench` reproduces the seed patches' experiments on uswap's core:
/// every seed mechanism is a switch, and each bench measures the shipped
/// configuration ("default") against each switch flipped back to the
/// behaviour before its seed, interleaved in one run.
#[derive(Parser, Debug)]
#[command(name = "uswap", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Benchmarks of the core, one per seed experiment.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// Slot allocation on a fragmented device with swap-cache traffic
    /// (seeds 000 and 001).
    Alloc(bench::alloc::AllocArgs),
    /// Extent lookups: balanced tree vs linear list with a one-entry cache
    /// (seed 004).
    Extent(bench::extent::ExtentArgs),
    /// LRU activation: per-CPU batches vs one lock per page (seed 002).
    Lru(bench::lru::LruArgs),
    /// 2 MB units: one whole cluster vs 512 single slots (seed 003).
    Huge(bench::huge::HugeArgs),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Bench(b) => match b {
            BenchCommand::Alloc(a) => bench::alloc::run(&a),
            BenchCommand::Extent(a) => bench::extent::run(&a),
            BenchCommand::Lru(a) => bench::lru::run(&a),
            BenchCommand::Huge(a) => bench::huge::run(&a),
        },
    }
}
