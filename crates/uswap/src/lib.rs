//! uswap: a swap subsystem in user space.
//!
//! This crate is the core of the design of the Linux swap subsystem as the
//! seed patches describe it (see `docs/DESIGN.md`):
//!
//! - [`swap_space`]: swap devices of slots with per-slot use counts,
//!   clusters of 512 slots on free / nonfull / frag / full lists, per-CPU
//!   current clusters and slot caches (seed 000), per-CPU scan bases
//!   (seed 001), whole-cluster allocation of 2 MB units (seed 003), several
//!   devices by priority.
//! - [`extent`]: swap offset -> (backing, byte offset), a balanced tree
//!   (seed 004) or the old linear list with a one-entry cache.
//! - [`swap_cache`]: slot -> staged page, split into trunks with a lock each
//!   (seed 001).
//! - [`lru`]: active and inactive lists with per-CPU add/activate batches
//!   (seed 002).
//! - [`stats`]: counters and per-site lock profiles.
//! - [`sys`]: the OS layer: mappings, advice, the ioctls on backing files.
//! - [`uffd`]: userfaultfd, the kernel interface the pager is built on.
//! - [`pager`]: regions paged under a budget, on all of the above.
//! - [`spec`]: the swap spec grammar (`ram:`, `file:`, `zram:`, tiers).
//! - [`run_env`]: what `uswap run` tells its preload library.
//! - [`descriptors`]: uswap's file descriptors, kept out of a program's
//!   way when it shares the process.
//!
//! Every seed mechanism is a switch in the configuration, so that its effect
//! can be measured against the behaviour before it.

pub mod descriptors;
pub mod domain;
pub mod extent;
mod index_list;
pub mod io;
pub mod lru;
pub mod pager;
pub mod percpu;
pub mod run_env;
pub mod spec;
pub mod stats;
pub mod swap_cache;
pub mod swap_space;
pub mod sys;
pub mod table;
pub mod uffd;

/// The size of a page, the unit of swapping: one slot holds one page.
pub const PAGE_SIZE: usize = 4096;

// The README's example is compiled and run as a doctest.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
