//! The instance's counters and levels: a handle to each statistic the
//! pager counts with, taken from its registry once, at build time, so
//! that the fault path adds to an atomic and looks nothing up.

use crate::stats::{Counter, CounterId, Gauge, GaugeId, Registry};
use std::sync::Arc;

pub(crate) struct Counters {
    pub faults: Arc<Counter>,
    pub zero_fills: Arc<Counter>,
    pub swapins: Arc<Counter>,
    pub huge_swapins: Arc<Counter>,
    pub huge_swapouts: Arc<Counter>,
    pub huge_fallbacks: Arc<Counter>,
    pub move_fallbacks: Arc<Counter>,
    pub staged: Arc<Counter>,
    pub evict_moves: Arc<Counter>,
    pub swapcache_hits: Arc<Counter>,
    pub wp_faults: Arc<Counter>,
    /// Swap-ins whose read went out with their window's (fault/readahead.rs).
    pub swapins_batched: Arc<Counter>,
    /// Clean pages made writable beside a written one (fault/serve.rs).
    pub unprotected_around: Arc<Counter>,
    pub evictions: Arc<Counter>,
    pub evict_clean: Arc<Counter>,
    pub evict_write: Arc<Counter>,
    pub evict_zero: Arc<Counter>,
    pub install_retries: Arc<Counter>,
    pub overrun: Arc<Counter>,
    pub swap_full: Arc<Counter>,
    pub write_errors: Arc<Counter>,
    pub read_errors: Arc<Counter>,
    pub direct_reclaim: Arc<Counter>,
    /// Faults that paced reclaim (reclaim.rs).
    pub paced: Arc<Counter>,
    /// Pages swapped in that kept a shadow, and those of them activated
    /// (workingset.rs).
    pub workingset_refault: Arc<Counter>,
    pub workingset_activate: Arc<Counter>,
    /// Trend prefetch (trend.rs): pages read in, and of those passed over
    /// by the walk (hits) or left behind when it broke (wasted).
    pub trend_issued: Arc<Counter>,
    pub trend_hits: Arc<Counter>,
    pub trend_wasted: Arc<Counter>,
    /// Pages that came in sealed, and those of them written (seal.rs).
    pub sealed_in: Arc<Counter>,
    pub sealed_written: Arc<Counter>,
    pub busy_waits: Arc<Counter>,
    /// Faults of 100 us or more, and each by its cause (fault/stall.rs).
    pub stalls: Arc<Counter>,
    pub stall_claim_wait: Arc<Counter>,
    pub stall_reclaim: Arc<Counter>,
    pub stall_bound: Arc<Counter>,
    pub stall_own: Arc<Counter>,
    pub unevictable: Arc<Counter>,
    pub discarded: Arc<Counter>,
    pub swapout_retries: Arc<Counter>,
    /// Sealed pages copied out and dropped in a batch (batch.rs).
    pub evict_copies: Arc<Counter>,
    /// Runs of pages a fork had shared, made the process's own again
    /// before their eviction (batch.rs, `unshare`).
    pub evict_unshared: Arc<Counter>,
    /// Pages a fork had shared, written out in place (batch.rs,
    /// `stage_shared`).
    pub evict_shared: Arc<Counter>,
    /// Pages brought in for a reader outside the fault path (a debugger,
    /// a core dump: `fault/bring.rs`).
    pub brought_in: Arc<Counter>,
    pub swapin_retries: Arc<Counter>,
    pub readahead: Arc<Counter>,
    pub fault_around: Arc<Counter>,
    pub prefetched: Arc<Counter>,
    /// Nanoseconds spent serving faults: in the SIGBUS handler from the
    /// page's lookup to the install, or in a handler thread per event
    /// (neither counts the kernel's delivery or the wake-up).
    pub fault_ns: Arc<Counter>,
    /// The levels the background reclaimer publishes (`publish_levels`).
    pub levels: Levels,
}

/// Levels kept in the statistics block for readers in other processes,
/// set by the background reclaimer on each pass (the cheap ones) or every
/// 100 ms (those that take a lock or read /proc).
pub(crate) struct Levels {
    pub budget: Arc<Gauge>,
    pub share: Arc<Gauge>,
    pub resident: Arc<Gauge>,
    pub resident_peak: Arc<Gauge>,
    pub staged_now: Arc<Gauge>,
    pub mapped: Arc<Gauge>,
    pub swapped: Arc<Gauge>,
    pub swap_total: Arc<Gauge>,
    pub threads: Arc<Gauge>,
}

impl Counters {
    pub fn new(r: &Registry) -> Self {
        Counters {
            faults: r.counter(CounterId::FAULTS),
            zero_fills: r.counter(CounterId::ZERO_FILLS),
            swapins: r.counter(CounterId::SWAPINS),
            huge_swapins: r.counter(CounterId::HUGE_SWAPINS),
            huge_swapouts: r.counter(CounterId::HUGE_SWAPOUTS),
            huge_fallbacks: r.counter(CounterId::HUGE_FALLBACKS),
            move_fallbacks: r.counter(CounterId::MOVE_FALLBACKS),
            staged: r.counter(CounterId::STAGED),
            evict_moves: r.counter(CounterId::EVICT_MOVES),
            swapcache_hits: r.counter(CounterId::SWAPCACHE_HITS),
            wp_faults: r.counter(CounterId::WP_FAULTS),
            swapins_batched: r.counter(CounterId::SWAPINS_BATCHED),
            unprotected_around: r.counter(CounterId::UNPROTECTED_AROUND),
            evictions: r.counter(CounterId::EVICTIONS),
            evict_clean: r.counter(CounterId::EVICT_CLEAN),
            evict_write: r.counter(CounterId::EVICT_WRITE),
            evict_zero: r.counter(CounterId::EVICT_ZERO),
            install_retries: r.counter(CounterId::INSTALL_RETRIES),
            overrun: r.counter(CounterId::BUDGET_OVERRUN),
            swap_full: r.counter(CounterId::SWAP_FULL),
            write_errors: r.counter(CounterId::SWAPOUT_ERRORS),
            read_errors: r.counter(CounterId::SWAPIN_ERRORS),
            direct_reclaim: r.counter(CounterId::DIRECT_RECLAIM),
            paced: r.counter(CounterId::PACED),
            workingset_refault: r.counter(CounterId::WORKINGSET_REFAULT),
            workingset_activate: r.counter(CounterId::WORKINGSET_ACTIVATE),
            trend_issued: r.counter(CounterId::TREND_ISSUED),
            trend_hits: r.counter(CounterId::TREND_HITS),
            trend_wasted: r.counter(CounterId::TREND_WASTED),
            sealed_in: r.counter(CounterId::SEALED_IN),
            sealed_written: r.counter(CounterId::SEALED_WRITTEN),
            busy_waits: r.counter(CounterId::BUSY_WAITS),
            stalls: r.counter(CounterId::STALLS),
            stall_claim_wait: r.counter(CounterId::STALL_CLAIM_WAIT),
            stall_reclaim: r.counter(CounterId::STALL_RECLAIM),
            stall_bound: r.counter(CounterId::STALL_BOUND),
            stall_own: r.counter(CounterId::STALL_OWN),
            unevictable: r.counter(CounterId::UNEVICTABLE),
            discarded: r.counter(CounterId::DISCARDED),
            swapout_retries: r.counter(CounterId::SWAPOUT_RETRIES),
            evict_copies: r.counter(CounterId::EVICT_COPIES),
            evict_unshared: r.counter(CounterId::EVICT_UNSHARED),
            evict_shared: r.counter(CounterId::EVICT_SHARED),
            brought_in: r.counter(CounterId::BROUGHT_IN),
            swapin_retries: r.counter(CounterId::SWAPIN_RETRIES),
            readahead: r.counter(CounterId::READAHEAD),
            fault_around: r.counter(CounterId::FAULT_AROUND),
            prefetched: r.counter(CounterId::PREFETCHED),
            fault_ns: r.counter(CounterId::FAULT_NS),
            levels: Levels {
                budget: r.gauge(GaugeId::BUDGET),
                share: r.gauge(GaugeId::SHARE),
                resident: r.gauge(GaugeId::RESIDENT),
                resident_peak: r.gauge(GaugeId::RESIDENT_PEAK),
                staged_now: r.gauge(GaugeId::STAGED_NOW),
                mapped: r.gauge(GaugeId::MAPPED),
                swapped: r.gauge(GaugeId::SWAPPED),
                swap_total: r.gauge(GaugeId::SWAP_TOTAL),
                threads: r.gauge(GaugeId::THREADS),
            },
        }
    }
}
