//! The pager: regions of memory whose pages are swapped out and in
//! transparently, under a memory budget (userfaultfd).
//!
//! ```no_run
//! use uswap::pager::{SwapDeviceSpec, Swap};
//!
//! let swap = Swap::builder()
//!     .budget(64 << 20)                          // 64 MiB resident at most
//!     .device(SwapDeviceSpec::ram(256 << 20))        // 256 MiB of RAM-backed swap
//!     .build()?;
//! let mut region = swap.map(128 << 20)?;         // twice the budget
//! region.as_mut_slice().fill(7);                 // pages go out and come back
//! assert!(region.as_slice().iter().all(|&b| b == 7));
//! println!("{:?}", swap.stats().counters);
//! # Ok::<(), uswap::pager::PagerError>(())
//! ```
//!
//! How it works (see docs/DESIGN.md): each region is an anonymous mapping
//! registered with one userfaultfd for missing and write-protect faults.
//! A fault on a page never touched installs a zeroed page; on an evicted
//! page it reads the page from its slot; either way the page is installed
//! write-protected, so the first write faults once and marks it dirty.  A
//! reclaimer (a background thread, and the faulting thread itself when the
//! budget is exhausted) takes victims from the LRU and moves them out with
//! `UFFDIO_MOVE` into a staging frame, then drops clean pages that have a
//! slot without IO and writes dirty ones to a freshly allocated slot.
//!
//! Faults are served either by the faulting thread itself in a SIGBUS
//! handler ([`FaultMode::Sigbus`], the default: no cross-thread wake-up) or
//! by handler threads ([`FaultMode::HandlerThread`], which also serves
//! faults raised inside the kernel, such as `read(2)` into a region; in
//! SIGBUS mode those fail with `EFAULT`).
//!
//! A child made by `fork(3)` inherits its parent's regions as they were,
//! swapped-out pages included, and its own copy of the instance, which it
//! adopts (fork.rs): a new userfaultfd, threads of its own, the slots it
//! shares with its parent counted as the kernel counts them.  In a child
//! made otherwise (a raw `clone`) a `Swap` and its regions are inert:
//! dropping them touches nothing of the parent's, and `map` refuses.
//!
//! # Locks
//!
//! Besides the core's locks (docs/DESIGN.md: slot cache, device, cluster,
//! avail list, swap-cache trunk, LRU batch, LRU), the pager has these,
//! each a leaf: nothing else is taken while one is held.
//!
//! - `page_ids`: the free page-id ranges; `map` and `Region::drop` only.
//! - `staged_ring`: the ring of staged pages, oldest first (reclaim.rs).
//! - `staging_frames`, `bounce_frames`, `unit_in`, `unit_out`: the free
//!   lists of the frame and unit pools.
//!
//! Page claims (`page.rs`) come before all of them: a thread may take any
//! lock while it holds a claim, and never waits for a claim while it holds
//! a lock.  A thread waits for a claim only with nothing held (a fault, a
//! region being unmapped); the reclaimer only ever tries to claim.  So no
//! wait closes a cycle.  What the SIGBUS handler may take, and why that is
//! safe, is in `entry/sigbus.rs`.

// The pager's parts, from the top down; each calls only those below it.
mod api; // what a user holds: SwapBuilder, Swap, Region, PagerError
mod entry; // where work comes in: the SIGBUS handler, uswap's threads, fork
mod evict; // reclaim: victims out in batches and units, writeback
mod fault; // a fault served: a page or a 2 MB unit in, readahead
mod instance; // one instance's state, and the operations on it

pub use crate::spec::SwapDeviceSpec;
// The seeds' switches a builder takes, and the errors a `PagerError`
// carries, from the core.
pub use crate::extent::ExtentError;
pub use crate::io::IoError;
pub use crate::lru::{LruBatch, LruError};
pub use crate::swap_space::{ScanBase, SwapError, Switches};
pub use crate::table::TableError;
pub use crate::uffd::UffdError;
pub use api::builder::SwapBuilder;
pub use api::error::PagerError;
pub use api::region::{Pinned, PinnedShared, Region};
pub use api::swap::{expect_growth, start_wanted_threads, Swap};
pub use entry::sigbus::FaultMode;
pub use instance::overrun::{Overrun, OverrunError};
pub use instance::regions::MAX_REGIONS;
// For a library that interposes on a program's calls (`uswap run`'s):
// the pager's side of the program's signals.  The `internal` feature.
#[cfg(feature = "internal")]
#[doc(hidden)]
pub use instance::signals::{
    in_handler, on_uswap_thread, program_sigmask, starting_a_thread, HandlerScope, NEVER_BLOCKED,
};
// One line on stderr from a signal handler: a stack buffer, the system
// call itself.
#[cfg(feature = "internal")]
#[doc(hidden)]
pub use instance::report::line as say_line;

/// For a library that interposes `sigaction` on a program (`uswap run`):
/// `sigaction(SIGBUS, new, old)` as the program sees it while uswap's
/// SIGBUS handler is in front.  `old` receives the program's disposition
/// and `new` becomes it; uswap's handler stays installed and passes every
/// SIGBUS that is not a uswap fault on to it.  Installing the program's
/// handler in the kernel instead would send uswap's own faults to it
/// until the watchdog put uswap's back.  False, with nothing done, when
/// uswap's handler is not installed (no instance in SIGBUS mode): the
/// call is then the kernel's to make.
#[cfg(feature = "internal")]
#[doc(hidden)]
pub fn program_sigbus_action(new: Option<&libc::sigaction>, old: Option<&mut libc::sigaction>) -> bool {
    entry::sigbus::program_sigbus_action(new, old)
}

/// Whether uswap's SIGBUS handler serves faults in this process (an
/// instance in SIGBUS mode was built): only then must SIGBUS never be
/// blocked in a program's thread.
#[cfg(feature = "internal")]
#[doc(hidden)]
pub fn serving_sigbus() -> bool {
    instance::signals::serving_sigbus()
}

#[cfg(test)]
mod tests;
