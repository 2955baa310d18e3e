//! What a reader of the statistics gets: an instance's [`Stats`] at one
//! instant, by field, with the fault latency bands, pressure, events and
//! device levels.  Values only: the block that counts them (block.rs)
//! builds them, and the registry and `uswap stat` hand them out.

use serde::{Deserialize, Serialize};

use super::table::{Counters, EventKind, Gauges, Locks};

/// Recent events kept (the counts are kept for every kind).
pub const EVENT_RING: usize = 16;
/// Fault latency buckets: bucket `b` counts faults served in
/// `[2^(b-1), 2^b)` ns (bucket 0: under 1 ns; the last: 1 s and more).
pub const LATENCY_BUCKETS: usize = 32;

/// Fault latency: how many faults were served in each power-of-two band
/// of nanoseconds (bucket `b`: `[2^(b-1), 2^b)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Latency {
    /// Faults per band.
    pub buckets: [u64; LATENCY_BUCKETS],
}

impl Default for Latency {
    fn default() -> Self {
        Latency {
            buckets: [0; LATENCY_BUCKETS],
        }
    }
}

impl Latency {
    /// Faults counted.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// The upper bound, in ns, of the band that holds quantile `q`
    /// (0 to 1): within a factor of two of the true value.  0 when no
    /// fault was counted.
    pub fn quantile_ns(&self, q: f64) -> u64 {
        let n = self.count();
        if n == 0 {
            return 0;
        }
        let want = ((n as f64 * q).ceil() as u64).clamp(1, n);
        let mut seen = 0;
        for (b, c) in self.buckets.iter().enumerate() {
            seen += c;
            if seen >= want {
                return 1u64 << b;
            }
        }
        1 << (LATENCY_BUCKETS - 1)
    }

    /// Field-wise difference.
    pub fn since(&self, earlier: &Latency) -> Latency {
        let mut l = *self;
        for (a, b) in l.buckets.iter_mut().zip(&earlier.buckets) {
            *a = a.saturating_sub(*b);
        }
        l
    }

    /// Field-wise sum.
    pub fn plus(&self, other: &Latency) -> Latency {
        let mut l = *self;
        for (a, b) in l.buckets.iter_mut().zip(&other.buckets) {
            *a += b;
        }
        l
    }
}

/// One line of pressure, as PSI's `memory.pressure` has it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PressureLine {
    /// Percent of wall time stalled, averaged over 10 s.
    pub avg10: f64,
    /// Over 60 s.
    pub avg60: f64,
    /// Over 300 s.
    pub avg300: f64,
    /// Microseconds stalled in all.
    pub total_us: u64,
}

/// The share of wall time the process's threads were stalled in uswap:
/// waiting for a fault to be served (a swap-in's IO, reclaim a fault had
/// to do first, a page another thread was bringing in).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Pressure {
    /// Some thread was stalled.
    pub some: PressureLine,
    /// Every thread of the process was stalled at once.
    pub full: PressureLine,
}

/// An event, as the ring of recent ones keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// What happened.
    pub kind: EventKind,
    /// When, in ns since the epoch.
    pub unix_ns: u64,
    /// What it concerns (see [`EventKind`]).
    pub value: u64,
}

/// Events: how many of each kind, and the last few.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Events {
    /// Every kind with its count.
    pub counts: Vec<(EventKind, u64)>,
    /// The most recent, oldest first (at most [`EVENT_RING`]).
    pub recent: Vec<Event>,
}

impl Events {
    /// How many events of `kind` there were.
    pub fn count(&self, kind: EventKind) -> u64 {
        self.counts.iter().find(|(k, _)| *k == kind).map_or(0, |c| c.1)
    }
}

/// An instance's statistics at one instant: every counter, gauge and lock
/// site by field, the fault latency bands, pressure and events.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Stats {
    /// Operation counters.
    pub counters: Counters,
    /// Levels (memory of a compressed store, pages resident).
    pub gauges: Gauges,
    /// Lock statistics by site.
    pub locks: Locks,
    /// How long faults took to serve.
    pub fault_latency: Latency,
    /// Stalled time, as PSI reports it.
    pub pressure: Pressure,
    /// Events.
    pub events: Events,
    /// Each swap device's slots and those in use (pages out on it).
    pub devices: Vec<DeviceLevel>,
}

/// A swap device's levels.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DeviceLevel {
    /// "ram", "file" or "compressed".
    pub kind: &'static str,
    /// Its slots (pages it can hold).
    pub slots: u64,
    /// Slots in use.
    pub used: u64,
}

impl Stats {
    /// Total nanoseconds waited on all lock sites.
    pub fn total_wait_ns(&self) -> u64 {
        self.locks.total_wait_ns()
    }

    /// The events between `earlier` and `self` (gauges, pressure and
    /// events: as they are now).
    pub fn since(&self, earlier: &Stats) -> Stats {
        Stats {
            counters: self.counters.since(&earlier.counters),
            gauges: self.gauges,
            locks: self.locks.since(&earlier.locks),
            fault_latency: self.fault_latency.since(&earlier.fault_latency),
            pressure: self.pressure,
            events: self.events.clone(),
            devices: self.devices.clone(),
        }
    }
}
