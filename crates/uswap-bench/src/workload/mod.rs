//! The workload benches beside kernel swap: `pmbench`, `seq-write` and
//! `activate`, the same loops over memory paged by uswap or by the kernel
//! (zram, a swap file) under the same budget, each run in a fresh worker
//! process, and uswap with each seed switch flipped back (`--ablate`).
//!
//! - [`side_by_side`]: the benches' options, combinations, table and ratios.
//! - [`worker`]: one run in its own process (`uswap bench worker`).
//! - [`ablation`]: the switches `--ablate` flips back, one at a time.
//! - [`workload`]: the access loops themselves, the data they write, the
//!   latency histograms.
//! - [`kernel_swap`]: the memory cgroup and the kernel swap device of a
//!   kernel run, set up and torn down around it.
//! - [`plot`]: `--plot FILE.png|svg`.
//! - [`program`]: `uswap bench program`: an unmodified program under
//!   `uswap run` beside the same program in a memory cgroup with kernel
//!   swap.

pub mod ablation;
pub mod kernel_auto;
pub mod kernel_swap;
pub mod plot;
pub mod program;
pub mod remote;
pub mod side_by_side;
mod tables;
pub mod worker;
// `workload::workload`: the loops themselves, beside the benches that run them.
#[allow(clippy::module_inception)]
pub mod workload;
