//! uswap: a swap subsystem in user space.
//!
//! A process gets more memory than its budget: the pages of the regions
//! uswap maps are swapped out to swap devices and back in on access,
//! transparently (userfaultfd), by the design of the Linux swap
//! subsystem as five kernel patches, "the seeds", describe it (numbered 000
//! to 004 in `docs/SEEDS.md`, which says what each does; the design is
//! `docs/DESIGN.md`).
//!
//! What a user needs:
//!
//! - [`pager`]: [`Swap`](pager::Swap), built with
//!   [`SwapBuilder`](pager::SwapBuilder), maps [`Region`](pager::Region)s
//!   whose pages stay under a budget; its errors.
//! - [`spec`]: swap devices, as values ([`SwapDeviceSpec`](spec::SwapDeviceSpec)
//!   and its options) and as the text `uswap run --swap` takes (`ram:`,
//!   `file:`, `zram:`, tiers).
//! - [`stats`]: what an instance has done, typed: counters, gauges, lock
//!   sites, fault latency, pressure, events; and the published blocks
//!   `uswap stat` reads.
//!
//! ```no_run
//! use uswap::pager::Swap;
//! use uswap::spec::SwapDeviceSpec;
//!
//! let swap = Swap::builder()
//!     .budget(64 << 20)
//!     .device(SwapDeviceSpec::ram(256 << 20))
//!     .build()?;
//! let mut region = swap.map(128 << 20)?;
//! region.as_mut_slice().fill(7);
//! assert!(region.as_slice().iter().all(|&b| b == 7));
//! # Ok::<(), uswap::pager::PagerError>(())
//! ```
//!
//! # The core, inside
//!
//! Built with the `internal` feature (uswap's own CLI, benches and
//! preloaded library turn it on), the core's modules are public too: not
//! a stable API, and not in these docs.
//!
//! - `swap_space`: swap devices of slots with per-slot use counts,
//!   clusters of 512 slots on free / nonfull / frag / full lists, per-CPU
//!   current clusters and slot caches (seed 000), per-CPU scan bases
//!   (seed 001), whole-cluster allocation of 2 MB units (seed 003), several
//!   devices by priority.
//! - `extent`: swap offset -> (backing, byte offset), a balanced tree
//!   (seed 004) or the old linear list with a one-entry cache.
//! - `swap_cache`: slot -> staged page, split into trunks with a lock each
//!   (seed 001).
//! - `lru`: active and inactive lists with per-CPU add/activate batches
//!   (seed 002).
//! - `io`: the swap devices' page stores (RAM, files, compressed).
//! - `sys`: the OS layer: mappings, advice, the ioctls on backing files;
//!   `uffd`: userfaultfd, the kernel interface the pager is built on.
//! - `domain`: a process tree's budget, shared by its members;
//!   `run_env`: what `uswap run` tells its preload library;
//!   `descriptors`: uswap's file descriptors, kept out of a program's way
//!   when it shares the process.
//!
//! Every seed mechanism is a switch in the configuration, so that its effect
//! can be measured against the behaviour before it.

#![deny(missing_docs)]

pub mod pager;
pub mod spec;
pub mod stats;

/// The core's modules: public with the `internal` feature (uswap's own
/// crates), hidden from the docs and not a stable API; private without it.
macro_rules! internal {
    ($($name:ident,)*) => {$(
        #[cfg(feature = "internal")]
        #[doc(hidden)]
        pub mod $name;
        #[cfg(not(feature = "internal"))]
        #[allow(dead_code, unused_imports)]
        mod $name;
    )*};
}

internal! {
    descriptors,
    domain,
    extent,
    io,
    lru,
    percpu,
    run_env,
    swap_cache,
    swap_space,
    sys,
    table,
    uffd,
}
mod index_list;

/// The size of a page, the unit of swapping: one slot holds one page.
pub const PAGE_SIZE: usize = 4096;

// The README's examples are compiled and run as doctests (its core
// example needs the `internal` feature, which the workspace's tests have).
#[doc = include_str!("../../../README.md")]
#[cfg(all(doctest, feature = "internal"))]
pub struct ReadmeDoctests;
