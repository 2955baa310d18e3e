//! uswap's benchmarks, the code behind `uswap bench`: the seed experiments
//! on the core, the pager microbench, and workloads beside kernel swap.
//!
//! - [`micro`]: `alloc`, `extent`, `lru` and `huge`, one per seed
//!   experiment, on the core's structures in one process; and `fault`, the
//!   cost of one page fault served by the pager next to the kernel's own.
//! - [`workload`]: `pmbench`, `seq-write` and `activate` on memory paged by
//!   uswap or by kernel swap (zram, a swap file) under the same budget, and
//!   uswap with each seed switch flipped back (`--ablate`); `--plot`.
//! - [`report`]: what they share: the options every bench takes, the
//!   interleaved rounds, the progress bar, the table and the JSON.
//!
//! Every bench runs all its variants in one invocation, interleaved round by
//! round and rotated (A B C, B C A, C A B, ...), so that the machine's noise
//! lands on all of them alike and their ratios hold even where absolute
//! numbers drift.  The workload benches (pmbench, seq-write, activate) run
//! each variant in its own process, on uswap or on kernel swap.
//!
//! Each bench is a clap `Args` struct (its doc comments are the `--help`
//! text) and an entry function that the `uswap` binary (crate `uswap-cli`)
//! calls.  The workload benches start each run by re-executing the current
//! binary as `<exe> bench worker --spec JSON`: a binary that calls them
//! must have that subcommand call [`workload::worker::main`].

pub mod auto_spec;
pub mod micro;
pub mod report;
pub mod workload;

/// Parse a byte count with an optional binary suffix (K, M, G, ...): the
/// value parser of the size options of the benches and of `uswap demo`.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    parse_size::Config::new()
        .with_binary()
        .parse_size(s)
        .map_err(|e| format!("{s:?} is not a size ({e}); write e.g. 512M, 4G or 65536"))
}
