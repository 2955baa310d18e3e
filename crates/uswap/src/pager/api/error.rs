//! What can go wrong building a swap instance or mapping a region: one
//! error type, each variant a line naming the cause and the remedy.

use crate::io::IoError;
use crate::lru::LruError;
use crate::pager::instance::regions::MAX_REGIONS;
use crate::swap_space::SwapError;
use crate::table::TableError;
use crate::uffd::UffdError;

/// What can go wrong building a swap instance or mapping a region.
#[derive(Debug, thiserror::Error)]
pub enum PagerError {
    /// userfaultfd is unavailable or lacks a feature.
    #[error(transparent)]
    Uffd(#[from] UffdError),
    /// A swap device could not be set up.
    #[error(transparent)]
    Io(#[from] IoError),
    /// The swap space configuration was refused.
    #[error(transparent)]
    Swap(#[from] SwapError),
    /// The LRU configuration was refused.
    #[error(transparent)]
    Lru(#[from] LruError),
    /// Mapping memory failed.
    #[error("mapping {bytes} bytes failed: {source}")]
    Mmap {
        /// How much was asked for.
        bytes: usize,
        /// Why `mmap` refused.
        source: std::io::Error,
    },
    /// A configuration value out of range.
    #[error("invalid swap configuration: {0}")]
    Config(String),
    /// No more regions can be mapped.
    #[error("too many regions: {MAX_REGIONS} are mapped already; unmap some or map fewer, larger ones")]
    TooManyRegions,
    /// The instance's page table is full.
    #[error("cannot map {pages} more pages: this instance manages at most {max} pages ({free} free); raise `max_mapped`")]
    TooManyPages {
        /// Pages asked for.
        pages: usize,
        /// Pages the instance manages at most.
        max: usize,
        /// Pages it has left.
        free: usize,
    },
    /// The page tables of the instance could not be allocated.
    #[error(transparent)]
    Metadata(#[from] TableError),
    /// `map` was called in a forked child.
    #[error("this Swap belongs to process {owner}, and this is its forked child {pid}: a child inherits neither the regions nor the userfaultfd; build a new Swap in the child")]
    Forked {
        /// The process that built the `Swap`.
        owner: i32,
        /// This process, its forked child.
        pid: i32,
    },
    /// A range that is not whole pages of the region (whole 2 MB units of
    /// a `map_huge` region).
    #[error("bytes {offset}..{} are not whole pages of this {len}-byte region; pass a page-aligned range inside it (2 MB units in a map_huge region)", .offset.saturating_add(*.bytes))]
    Range {
        /// Where the range starts in the region.
        offset: usize,
        /// Its length.
        bytes: usize,
        /// The region's length.
        len: usize,
    },
    /// `stop_paging` could not bring every page in.
    #[error("{pages} pages stayed out (an eviction's claim did not settle): paging stopped, but the regions stay registered with the userfaultfd, and a call of the kernel's that meets one of those pages fails with EFAULT")]
    StillOut {
        /// Pages still out.
        pages: usize,
    },
    /// `map` was called, in SIGBUS mode, on a thread that blocks SIGBUS.
    #[error("this thread blocks SIGBUS: in SIGBUS fault mode its first touch of swapped memory would kill the process; unblock SIGBUS here (pthread_sigmask), or build the Swap with FaultMode::HandlerThread")]
    SigbusBlocked,
}
