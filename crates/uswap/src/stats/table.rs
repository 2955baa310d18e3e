//! Every statistic uswap keeps, by name, in one table.
//!
//! The table is the one place a statistic is declared: it gives the id a
//! module counts with (`CounterId::FAULTS`), the field a reader reads
//! (`stats.counters.faults`), the name and unit it is exported under
//! (`uswap stat`, Prometheus) and the line of help that says what it
//! counts.  A misspelled name does not compile, on either side.
//!
//! Its order is the order of the words in the shared block
//! (`block.rs`): a reader of another build, whose table differs, is told
//! apart by the block's layout hash and refused, not misread.

use serde::{Deserialize, Serialize};

/// What a statistic's number counts, for its exported name and unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Events (faults, calls, batches).
    Events,
    /// Pages of `PAGE_SIZE` bytes: exported as bytes.
    Pages,
    /// Bytes.
    Bytes,
    /// Nanoseconds: exported as seconds.
    Nanos,
}

/// Id constants numbered in order: `ids!(CounterId; 0u16; A B)` makes
/// `A = CounterId(0)`, `B = CounterId(1)`.
macro_rules! ids {
    ($ty:ident; $n:expr;) => {};
    ($ty:ident; $n:expr; $id:ident $($rest:ident)*) => {
        pub const $id: $ty = $ty($n);
        ids!($ty; $n + 1u16; $($rest)*);
    };
}

macro_rules! counters {
    ($(#[doc = $doc:literal] $field:ident $id:ident $unit:ident;)*) => {
        /// A counter's index in the shared block.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub struct CounterId(pub(crate) u16);

        #[allow(missing_docs)]
        impl CounterId {
            ids!(CounterId; 0u16; $($id)*);
        }

        /// Every counter, summed over the CPUs' shards: events since the
        /// instance began (a forked child's: since its fork).
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
        pub struct Counters {
            $(#[doc = $doc] pub $field: u64,)*
        }

        impl Counters {
            /// How many counters there are.
            pub const LEN: usize = [$(stringify!($field)),*].len();
            /// Their names, units and help, in the block's order.
            pub const TABLE: &'static [(&'static str, Unit, &'static str)] = &[
                $((stringify!($field), Unit::$unit, $doc),)*
            ];

            pub(crate) fn from_words(w: &[u64; Self::LEN]) -> Counters {
                let mut i = 0;
                Counters { $($field: { i += 1; w[i - 1] },)* }
            }

            /// Each counter with its name, in the table's order.
            pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
                [$(self.$field),*].into_iter().zip(Self::TABLE).map(|(v, t)| (t.0, v))
            }

            /// Field-wise difference, for an interval.
            pub fn since(&self, earlier: &Counters) -> Counters {
                Counters { $($field: self.$field.saturating_sub(earlier.$field),)* }
            }

            /// Field-wise sum (a tree's processes).
            pub fn plus(&self, other: &Counters) -> Counters {
                Counters { $($field: self.$field + other.$field,)* }
            }
        }
    };
}

macro_rules! gauges {
    ($(#[doc = $doc:literal] $field:ident $id:ident $unit:ident;)*) => {
        /// A gauge's index in the shared block.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub struct GaugeId(pub(crate) u16);

        #[allow(missing_docs)]
        impl GaugeId {
            ids!(GaugeId; 0u16; $($id)*);
        }

        /// Levels now (the `*_peak` ones: the highest reached).
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
        pub struct Gauges {
            $(#[doc = $doc] pub $field: u64,)*
        }

        impl Gauges {
            /// How many gauges there are.
            pub const LEN: usize = [$(stringify!($field)),*].len();
            /// Their names, units and help, in the block's order.
            pub const TABLE: &'static [(&'static str, Unit, &'static str)] = &[
                $((stringify!($field), Unit::$unit, $doc),)*
            ];

            pub(crate) fn from_words(w: &[u64; Self::LEN]) -> Gauges {
                let mut i = 0;
                Gauges { $($field: { i += 1; w[i - 1] },)* }
            }

            /// Each gauge with its name, in the table's order.
            pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
                [$(self.$field),*].into_iter().zip(Self::TABLE).map(|(v, t)| (t.0, v))
            }

            /// Field-wise sum (a tree's processes).
            pub fn plus(&self, other: &Gauges) -> Gauges {
                Gauges { $($field: self.$field + other.$field,)* }
            }
        }
    };
}

macro_rules! locks {
    ($(#[doc = $doc:literal] $field:ident $id:ident;)*) => {
        /// A lock site's index in the shared block.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub struct LockId(pub(crate) u16);

        #[allow(missing_docs)]
        impl LockId {
            ids!(LockId; 0u16; $($id)*);
        }

        /// The lock sites' `perf lock` columns: every lock of one kind
        /// reports to one site.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
        pub struct Locks {
            $(#[doc = $doc] pub $field: LockStats,)*
        }

        impl Locks {
            /// How many sites there are.
            pub const LEN: usize = [$(stringify!($field)),*].len();
            /// Their names and help, in the block's order.
            pub const TABLE: &'static [(&'static str, &'static str)] = &[
                $((stringify!($field), $doc),)*
            ];

            pub(crate) fn from_sites(w: &[LockStats; Self::LEN]) -> Locks {
                let mut i = 0;
                Locks { $($field: { i += 1; w[i - 1] },)* }
            }

            /// Each site with its name, in the table's order.
            pub fn iter(&self) -> impl Iterator<Item = (&'static str, LockStats)> + '_ {
                [$(self.$field),*].into_iter().zip(Self::TABLE).map(|(v, t)| (t.0, v))
            }

            /// The site called `name` (the benches name their columns).
            pub fn get(&self, name: &str) -> Option<LockStats> {
                self.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
            }

            /// Field-wise difference, for an interval.
            pub fn since(&self, earlier: &Locks) -> Locks {
                Locks { $($field: self.$field.since(&earlier.$field),)* }
            }

            /// Total nanoseconds waited on all sites.
            pub fn total_wait_ns(&self) -> u64 {
                self.iter().map(|(_, l)| l.wait_ns).sum()
            }
        }
    };
}

counters! {
    /// Faults served (every kind).
    faults FAULTS Events;
    /// Faults served with a page of zeros (first touch).
    zero_fills ZERO_FILLS Events;
    /// Faults served by reading the page back from swap.
    swapins SWAPINS Events;
    /// Of the swap-ins, those whose read went out with their readahead window's (one submission; fault/readahead.rs).
    swapins_batched SWAPINS_BATCHED Events;
    /// 2 MB units read back whole.
    huge_swapins HUGE_SWAPINS Events;
    /// 2 MB units written out whole.
    huge_swapouts HUGE_SWAPOUTS Events;
    /// 2 MB units split into pages for want of a free cluster.
    huge_fallbacks HUGE_FALLBACKS Events;
    /// Evictions that copied a page where UFFDIO_MOVE was refused.
    move_fallbacks MOVE_FALLBACKS Events;
    /// Pages staged for writeback (moved out, in the swap cache).
    staged STAGED Pages;
    /// UFFDIO_MOVE calls made by eviction.
    evict_moves EVICT_MOVES Events;
    /// Faults served from the swap cache (no IO).
    swapcache_hits SWAPCACHE_HITS Events;
    /// Write-protect faults (first write to a clean page).
    wp_faults WP_FAULTS Events;
    /// Clean pages made writable beside a written one, with its write-protect fault (fault/serve.rs).
    unprotected_around UNPROTECTED_AROUND Pages;
    /// Pages evicted.
    evictions EVICTIONS Pages;
    /// Pages evicted clean: dropped, their slot still holding them.
    evict_clean EVICT_CLEAN Pages;
    /// Pages evicted and written to swap.
    evict_write EVICT_WRITE Pages;
    /// Pages evicted as zero pages (no slot, no IO).
    evict_zero EVICT_ZERO Pages;
    /// Installs retried after a race.
    install_retries INSTALL_RETRIES Events;
    /// Faults that found the heap past its budget and overrun.
    budget_overrun BUDGET_OVERRUN Events;
    /// Evictions refused for want of a free slot.
    swap_full SWAP_FULL Events;
    /// Swap-out writes that failed.
    swapout_errors SWAPOUT_ERRORS Events;
    /// Swap-in reads that failed (the memory is poisoned).
    swapin_errors SWAPIN_ERRORS Events;
    /// Faults that reclaimed before they could install (the background reclaimer behind).
    direct_reclaim DIRECT_RECLAIM Events;
    /// Faults that did their share of reclaim first, the resident set within a batch of the budget (paced reclaim).
    paced PACED Events;
    /// Pages swapped in whose refault distance was measured (the evictions since they left: workingset.rs).
    workingset_refault WORKINGSET_REFAULT Pages;
    /// Of those, pages back within half a budget's evictions: working set, activated.
    workingset_activate WORKINGSET_ACTIVATE Pages;
    /// Pages read ahead along a thread's trend: a backward walk or a stride (trend prefetch).
    trend_issued TREND_ISSUED Pages;
    /// Of those, pages the walk passed over without a fault: its next fault came where the trend said.
    trend_hits TREND_HITS Pages;
    /// Of those, pages of a window after which the walk went elsewhere.
    trend_wasted TREND_WASTED Pages;
    /// Pages read back from a compressed device that came in sealed: dirty, write-protected (seal.rs).
    sealed_in SEALED_IN Pages;
    /// Of those, pages the program wrote before they went: a write-protect fault each.
    sealed_written SEALED_WRITTEN Pages;
    /// Faults that waited for a page another thread was serving.
    busy_waits BUSY_WAITS Events;
    /// Stalls: faults that took 100 us or more to serve (each counted again under its cause below).
    stalls STALLS Events;
    /// Stalls spent mostly waiting for a page another thread was serving (its claim held across that thread's IO).
    stall_claim_wait STALL_CLAIM_WAIT Events;
    /// Stalls spent mostly reclaiming first: the budget was exhausted and the background reclaimer behind.
    stall_reclaim STALL_RECLAIM Events;
    /// Stalls spent mostly held at the budget's bound: nothing was ready to evict (writeback behind, or backing off after write errors).
    stall_bound STALL_BOUND Events;
    /// Stalls spent mostly in the fault's own work: its swap-in IO and install.
    stall_own STALL_OWN Events;
    /// Victims that could not be evicted (pinned, locked, refused).
    unevictable UNEVICTABLE Pages;
    /// Pages discarded by the program (MADV_DONTNEED, munmap).
    discarded DISCARDED Pages;
    /// Swap-outs retried after a failed write.
    swapout_retries SWAPOUT_RETRIES Events;
    /// Sealed pages copied out and dropped in a batch.
    evict_copies EVICT_COPIES Pages;
    /// Runs of pages a fork had shared, made the process's own before eviction.
    evict_unshared EVICT_UNSHARED Events;
    /// Pages a fork had shared, copied out in place and their mapping dropped.
    evict_shared EVICT_SHARED Pages;
    /// Pages brought in for a debugger or a core dump.
    brought_in BROUGHT_IN Pages;
    /// Swap-ins retried after a failed read.
    swapin_retries SWAPIN_RETRIES Events;
    /// Pages read ahead with a swap-in.
    readahead READAHEAD Pages;
    /// Zero pages filled around a first touch.
    fault_around FAULT_AROUND Pages;
    /// Pages read ahead by the prefetcher thread.
    prefetched PREFETCHED Pages;
    /// Time spent serving faults.
    fault_ns FAULT_NS Nanos;
    /// Time some thread of the process was stalled in uswap (PSI "some").
    stall_some_ns STALL_SOME_NS Nanos;
    /// Time every thread of the process was stalled in uswap at once (PSI "full").
    stall_full_ns STALL_FULL_NS Nanos;
    /// LRU: pages added.
    lru_add LRU_ADD Events;
    /// LRU: pages activated.
    lru_activate LRU_ACTIVATE Events;
    /// LRU: pages deactivated.
    lru_deactivate LRU_DEACTIVATE Events;
    /// LRU: per-CPU batches drained.
    lru_drain LRU_DRAIN Events;
    /// LRU: referenced pages rotated by reclaim.
    lru_rotated LRU_ROTATED Events;
    /// LRU: pages taken off as victims.
    lru_isolated LRU_ISOLATED Events;
    /// LRU: pages removed.
    lru_remove LRU_REMOVE Events;
    /// Swap cache: pages added.
    swap_cache_add SWAP_CACHE_ADD Events;
    /// Swap cache: pages deleted.
    swap_cache_delete SWAP_CACHE_DELETE Events;
    /// Swap cache: look-ups.
    swap_cache_lookup SWAP_CACHE_LOOKUP Events;
    /// Swap cache: look-ups that found the page.
    swap_cache_hit SWAP_CACHE_HIT Events;
    /// Swap space: slots allocated.
    alloc ALLOC Events;
    /// Swap space: allocations that found no slot.
    alloc_fail ALLOC_FAIL Events;
    /// Swap space: slots freed.
    free FREE Events;
    /// Swap space: slot frees batched.
    free_batch FREE_BATCH Events;
    /// Swap space: slots shared by a fork (swap_duplicate).
    dup DUP Events;
    /// Swap space: a CPU moved to another cluster.
    cluster_switch CLUSTER_SWITCH Events;
    /// Swap space: slots scanned.
    scan_slots SCAN_SLOTS Events;
    /// Swap space: slots scanned on a fragmented device (seed 000's bounded scan).
    fragmented_scan_slots FRAGMENTED_SCAN_SLOTS Events;
    /// Swap space: 2 MB clusters allocated whole.
    huge_alloc HUGE_ALLOC Events;
    /// Swap space: 2 MB allocations that fell back to pages.
    huge_fallback HUGE_FALLBACK Events;
    /// Swap space: 2 MB clusters freed.
    huge_free HUGE_FREE Events;
    /// Slot cache: drains.
    slot_cache_drain SLOT_CACHE_DRAIN Events;
    /// Slot cache: refills.
    slot_cache_refill SLOT_CACHE_REFILL Events;
    /// Slot cache: slots taken by refills.
    slot_cache_refill_slots SLOT_CACHE_REFILL_SLOTS Events;
    /// IO: read requests.
    io_reads IO_READS Events;
    /// IO: pages read.
    io_read_pages IO_READ_PAGES Pages;
    /// IO: of the read requests, those a readahead window put in flight together (one io_uring submission a window).
    io_reads_batched IO_READS_BATCHED Events;
    /// IO: read errors.
    io_read_errors IO_READ_ERRORS Events;
    /// IO: write requests.
    io_writes IO_WRITES Events;
    /// IO: pages written.
    io_write_pages IO_WRITE_PAGES Pages;
    /// IO: write errors.
    io_write_errors IO_WRITE_ERRORS Events;
    /// Compressed store: pages written back to its file.
    store_writebacks STORE_WRITEBACKS Pages;
    /// Compressed store: write-backs that failed.
    store_writeback_errors STORE_WRITEBACK_ERRORS Events;
    /// Compressed store: pages that did not compress, sent to its file.
    store_incompressible_to_file STORE_INCOMPRESSIBLE_TO_FILE Pages;
    /// Compressed store: compaction passes.
    store_compactions STORE_COMPACTIONS Events;
    /// Compressed store: blocks freed by compaction.
    store_compacted_blocks STORE_COMPACTED_BLOCKS Events;
}

gauges! {
    /// The budget the instance was given (a tree's: the whole tree's).
    budget BUDGET Pages;
    /// The resident pages it may hold now (its share of a tree's budget).
    share SHARE Pages;
    /// Pages resident now, staged ones included.
    resident RESIDENT Pages;
    /// The most pages resident at once.
    resident_peak RESIDENT_PEAK Pages;
    /// Pages staged for writeback now.
    staged_now STAGED_NOW Pages;
    /// Pages the heap regions span.
    mapped MAPPED Pages;
    /// Swap slots in use (pages out, over all devices).
    swapped SWAPPED Pages;
    /// Swap slots over all devices.
    swap_total SWAP_TOTAL Pages;
    /// Threads that waited in uswap in the last 2 s (PSI "full" asks all of them stalled).
    threads THREADS Events;
    /// Compressed store: bytes of pages it holds, before compression.
    store_orig_bytes STORE_ORIG_BYTES Bytes;
    /// Compressed store: bytes they compressed to.
    store_compr_bytes STORE_COMPR_BYTES Bytes;
    /// Compressed store: memory it uses now (blocks and tables).
    store_mem_bytes STORE_MEM_BYTES Bytes;
    /// Compressed store: the most memory it used at once.
    store_mem_peak_bytes STORE_MEM_PEAK_BYTES Bytes;
    /// Compressed store: memory it may use.
    store_limit_bytes STORE_LIMIT_BYTES Bytes;
    /// Compressed store: same-filled pages (kept as one word).
    store_same_pages STORE_SAME_PAGES Pages;
    /// Compressed store: pages kept whole (did not compress).
    store_whole_pages STORE_WHOLE_PAGES Pages;
    /// Compressed store: pages in its file.
    store_file_pages STORE_FILE_PAGES Pages;
}

locks! {
    /// A cluster of the swap space.
    cluster CLUSTER;
    /// A swap device's own lock (swap_info_struct's).
    swap_info SWAP_INFO;
    /// The list of devices with free slots.
    swap_avail SWAP_AVAIL;
    /// A per-CPU slot cache (allocation side).
    slot_cache SLOT_CACHE;
    /// A per-CPU slot cache (return side).
    slot_cache_ret SLOT_CACHE_RET;
    /// A trunk of the swap cache.
    swap_cache_trunk SWAP_CACHE_TRUNK;
    /// The LRU lists.
    lru LRU;
    /// A per-CPU LRU batch.
    lru_batch LRU_BATCH;
    /// Page ids (region map and unmap).
    page_ids PAGE_IDS;
    /// The ring of staged pages.
    staged_ring STAGED_RING;
    /// Slots held for a forked child.
    fork_hold FORK_HOLD;
    /// The instance's threads.
    threads THREADS;
    /// Staging frames.
    staging_frames STAGING_FRAMES;
    /// Bounce frames.
    bounce_frames BOUNCE_FRAMES;
    /// 2 MB units coming in.
    unit_in UNIT_IN;
    /// 2 MB units going out.
    unit_out UNIT_OUT;
    /// Compressed store: its blocks.
    store_blocks STORE_BLOCKS;
    /// Compressed store: its LRU.
    store_lru STORE_LRU;
    /// Compressed store: its write-back.
    store_writeback STORE_WRITEBACK;
}

/// What happened, now and then, that a person watching wants to know of
/// (as `memory.events` lists a cgroup's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum EventKind {
    /// Past the budget and its overrun with nothing to evict: killed.
    OomKill = 0,
    /// The budget was changed (`Swap::set_budget`); value: the new one, in pages.
    BudgetChanged = 1,
    /// Swap writes failed: writeback paused; value: the errno.
    WritebackPaused = 2,
    /// A swap slot failed a write and was retired; value: the slot.
    SlotRetired = 3,
    /// A swap-in failed: the memory is poisoned; value: the address.
    PagePoisoned = 4,
    /// A thread blocks SIGBUS (SIGBUS mode); value: its thread id.
    SigbusBlocked = 5,
    /// A page could not be evicted (pinned, locked, refused); value: its address.
    Unevictable = 6,
    /// A forked child could not make a swap file of its own.
    ChildFileFailed = 7,
    /// No io_uring for swap-file writes (a seccomp profile or
    /// `kernel.io_uring_disabled` refused it): one `pwrite` at a time;
    /// value: the errno.
    NoIoUring = 8,
}

impl EventKind {
    /// Every kind, in the block's order.
    pub const ALL: [EventKind; 9] = [
        EventKind::OomKill,
        EventKind::BudgetChanged,
        EventKind::WritebackPaused,
        EventKind::SlotRetired,
        EventKind::PagePoisoned,
        EventKind::SigbusBlocked,
        EventKind::Unevictable,
        EventKind::ChildFileFailed,
        EventKind::NoIoUring,
    ];

    /// The kind's exported name.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::OomKill => "oom_kill",
            EventKind::BudgetChanged => "budget_changed",
            EventKind::WritebackPaused => "writeback_paused",
            EventKind::SlotRetired => "slot_retired",
            EventKind::PagePoisoned => "page_poisoned",
            EventKind::SigbusBlocked => "sigbus_blocked",
            EventKind::Unevictable => "unevictable",
            EventKind::ChildFileFailed => "child_file_failed",
            EventKind::NoIoUring => "no_io_uring",
        }
    }

    pub(crate) fn from_u8(v: u8) -> Option<EventKind> {
        EventKind::ALL.get(v as usize).copied()
    }
}

/// Bumped when the block's shape (`block.rs`) changes beyond the table's
/// names.
pub(crate) const BLOCK_VERSION: u32 = 2;

/// A hash of the table (names and order), kept in every block: a reader
/// whose table differs does not misread it.
pub(crate) fn layout_hash() -> u64 {
    // FNV-1a over the names, with the section lengths.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |s: &str| {
        for b in s.bytes().chain([0]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    Counters::TABLE.iter().for_each(|t| eat(t.0));
    Gauges::TABLE.iter().for_each(|t| eat(t.0));
    Locks::TABLE.iter().for_each(|t| eat(t.0));
    EventKind::ALL.iter().for_each(|k| eat(k.name()));
    eat(&BLOCK_VERSION.to_string());
    h
}

/// What a lock site reports: the seeds' `perf lock` columns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockStats {
    /// Times the lock was taken.
    pub acquisitions: u64,
    /// Times the taker found the lock held and had to wait.
    pub contended: u64,
    /// Total nanoseconds spent waiting for the lock.
    pub wait_ns: u64,
}

impl LockStats {
    /// Field-wise difference, for measuring an interval.
    pub fn since(&self, earlier: &LockStats) -> LockStats {
        LockStats {
            acquisitions: self.acquisitions.saturating_sub(earlier.acquisitions),
            contended: self.contended.saturating_sub(earlier.contended),
            wait_ns: self.wait_ns.saturating_sub(earlier.wait_ns),
        }
    }
}
