//! The gauges and counters of compressed devices, as zram's `mm_stat`
//! and `bd_stat` give them.

use std::sync::Arc;

use crate::stats::{Counter, CounterId, Gauge, GaugeId, Registry};

/// The gauges and counters of compressed devices, as zram's `mm_stat`
/// and `bd_stat` give them, summed over an instance's devices.
pub(super) struct Accounts {
    /// Bytes of the pages held in memory (stored or same-filled): zram's
    /// `orig_data_size`.
    pub(super) orig: Arc<Gauge>,
    /// Bytes they take compressed (whole pages count 4096):
    /// `compr_data_size`.
    pub(super) compr: Arc<Gauge>,
    pub(super) limit: Arc<Gauge>,
    pub(super) same: Arc<Gauge>,
    /// Pages stored whole (did not compress): `huge_pages`.
    pub(super) whole: Arc<Gauge>,
    /// Pages in the file behind.
    pub(super) file: Arc<Gauge>,
    pub(super) writebacks: Arc<Counter>,
    pub(super) writeback_errors: Arc<Counter>,
    pub(super) compacted: Arc<Counter>,
    pub(super) compactions: Arc<Counter>,
    pub(super) to_file: Arc<Counter>,
}

impl Accounts {
    pub(super) fn new(r: &Registry) -> Self {
        Accounts {
            orig: r.gauge(GaugeId::STORE_ORIG_BYTES),
            compr: r.gauge(GaugeId::STORE_COMPR_BYTES),
            limit: r.gauge(GaugeId::STORE_LIMIT_BYTES),
            same: r.gauge(GaugeId::STORE_SAME_PAGES),
            whole: r.gauge(GaugeId::STORE_WHOLE_PAGES),
            file: r.gauge(GaugeId::STORE_FILE_PAGES),
            writebacks: r.counter(CounterId::STORE_WRITEBACKS),
            writeback_errors: r.counter(CounterId::STORE_WRITEBACK_ERRORS),
            compacted: r.counter(CounterId::STORE_COMPACTED_BLOCKS),
            compactions: r.counter(CounterId::STORE_COMPACTIONS),
            to_file: r.counter(CounterId::STORE_INCOMPRESSIBLE_TO_FILE),
        }
    }
}
