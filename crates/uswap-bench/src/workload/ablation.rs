//! The ablations of `--ablate`: the switches a uswap run flips back, one
//! at a time, each to the behaviour before it (the seeds', and the
//! pager's own since), so that what each one gains is measured against
//! the default in the same invocation.

use anyhow::{bail, Result};
use uswap::extent::ExtentMapKind;
use uswap::lru::LruBatch;
use uswap::swap_space::{ScanBase, Switches};

/// The switches a run flips back: "default" or one ablation (the seeds',
/// and the pager's readahead and batched eviction).
pub const ABLATIONS: [&str; 23] = [
    "default",
    "no-slot-cache",
    "no-fragmented-scan",
    "shared-scan-base",
    "unbatched-lru",
    "no-huge-cluster",
    "extent-list",
    "no-readahead",
    "per-page-evict",
    "zram-keeps-copies",
    "plaintext-files",
    "unpaced-reclaim",
    "narrow-fault-around",
    "activate-all-refaults",
    "no-trend-prefetch",
    "always-seal",
    "always-clean",
    "no-neighbour-evict",
    "serial-reads",
    "lone-fault-reads",
    "spread-slots",
    "incompressible-to-file",
    "reclaim-ahead",
];

/// What an ablation sets.
pub struct Ablation {
    /// The swap space's seed switches.
    pub switches: Switches,
    /// LRU batching (seed 002).
    pub lru: LruBatch,
    /// The extent map of a swap file (seed 004).
    pub extent: ExtentMapKind,
    /// Swap-in readahead.
    pub readahead: bool,
    /// One `UFFDIO_MOVE` per evicted page instead of batches.
    pub per_page_evict: bool,
    /// A compressed device keeps the copy of a page read back.
    pub keep_copies: bool,
    /// Swap files are written in plaintext (encryption off).
    pub plaintext: bool,
    /// Faults pace reclaim; off: a normal-priority reclaimer
    /// and whole-batch direct reclaim, as before.
    pub paced: bool,
    /// First touches far below the budget fill a whole window.
    pub wide_fault_around: bool,
    /// Refaults activated by their distance; off: all of them.
    pub refault_distance: bool,
    /// Backward and strided walks read ahead.
    pub trend_prefetch: bool,
    /// Pages a compressed device let go come in sealed only while that
    /// pays; off: always.
    pub adaptive_seal: bool,
    /// Pages read back from a swap file come in clean only while that
    /// pays; off: always.
    pub adaptive_clean: bool,
    /// A victim's cold neighbours go with it; off: one by one.
    pub evict_neighbours: bool,
    /// A window's reads from a swap file in flight together; off: one
    /// after the other.
    pub batched_reads: bool,
    /// The fault's own read in its window's batch (SIGBUS mode); off:
    /// read alone before the window.
    pub fault_read_in_batch: bool,
    /// Every device takes its freed and partly used clusters before
    /// one never used; off: the kernel's order, a device swept whole.
    pub compact_slots: bool,
    /// A tier sends pages that do not compress straight to its file, as
    /// zswap did before Linux 6.18; off: stored whole, written back in
    /// their turn.
    pub incompressible_to_file: bool,
    /// On a device in memory the reclaimer keeps the low watermark ahead
    /// of the faults, as on a swap file; off: the faults reclaim at the
    /// budget themselves.
    pub reclaim_ahead_in_memory: bool,
}

/// The settings of ablation `name`.
pub fn ablation(name: &str) -> Result<Ablation> {
    let mut a = Ablation {
        switches: Switches::DEFAULT,
        lru: LruBatch::default(),
        extent: ExtentMapKind::Tree,
        readahead: true,
        per_page_evict: false,
        keep_copies: false,
        plaintext: false,
        paced: true,
        wide_fault_around: true,
        refault_distance: true,
        trend_prefetch: true,
        adaptive_seal: true,
        adaptive_clean: true,
        evict_neighbours: true,
        batched_reads: true,
        fault_read_in_batch: true,
        compact_slots: true,
        incompressible_to_file: false,
        reclaim_ahead_in_memory: false,
    };
    match name {
        "default" => {}
        "no-slot-cache" => a.switches.slot_cache = false,
        "no-fragmented-scan" => a.switches.fragmented_scan = false,
        "shared-scan-base" => a.switches.scan_base = ScanBase::Shared,
        "unbatched-lru" => a.lru = LruBatch::Unbatched,
        "no-huge-cluster" => a.switches.huge_cluster = false,
        "extent-list" => a.extent = ExtentMapKind::List,
        "no-readahead" => a.readahead = false,
        "per-page-evict" => a.per_page_evict = true,
        "zram-keeps-copies" => a.keep_copies = true,
        "plaintext-files" => a.plaintext = true,
        "unpaced-reclaim" => a.paced = false,
        "narrow-fault-around" => a.wide_fault_around = false,
        "activate-all-refaults" => a.refault_distance = false,
        "no-trend-prefetch" => a.trend_prefetch = false,
        "always-seal" => a.adaptive_seal = false,
        "always-clean" => a.adaptive_clean = false,
        "no-neighbour-evict" => a.evict_neighbours = false,
        "serial-reads" => a.batched_reads = false,
        "lone-fault-reads" => a.fault_read_in_batch = false,
        "spread-slots" => a.compact_slots = false,
        "incompressible-to-file" => a.incompressible_to_file = true,
        "reclaim-ahead" => a.reclaim_ahead_in_memory = true,
        other => bail!("unknown ablation {other:?}; there are: {}", ABLATIONS.join(", ")),
    }
    Ok(a)
}
