//! Pressure, as the kernel's PSI measures it, in the statistics block:
//! one word holds how many threads are stalled now and when the first
//! began; the "some" and "full" intervals are added to counters when
//! the last one ends, and the averages over 10, 60 and 300 s are moved
//! every 2 s.  "Full" is every thread that waited in uswap in the last
//! two seconds (the block's `active` buckets) stalled at once.  A stall's
//! begin and end are async-signal-safe: the SIGBUS handler makes them.

use super::block::{monotonic_us, Block, ACTIVE_BUCKETS, STALL_MASK, STALL_SHIFT};
use std::sync::atomic::Ordering;

impl Block {
    /// Buckets with a thread that waited in the last `within_us`.
    pub(crate) fn active_threads(&self, within_us: u64) -> u64 {
        let now = monotonic_us();
        self.head()
            .active
            .iter()
            .filter(|t| {
                let t = t.load(Ordering::Relaxed);
                t != 0 && now.saturating_sub(t) < within_us
            })
            .count() as u64
    }

    /// Thread `tid` of the process begins to wait in uswap (a fault
    /// being served for it, reclaim, IO), with `threads` the threads
    /// "full" asks to be stalled.  Its bucket of `active` takes the time,
    /// written only when it moved on by a millisecond (a line not written
    /// per fault).  One clock read for both.  Async-signal-safe.
    pub(crate) fn stall_begin(&self, tid: i32, threads: u64) {
        let h = self.head();
        let now = monotonic_us() & STALL_MASK;
        let slot = &h.active[tid as u32 as usize % ACTIVE_BUCKETS];
        if now.saturating_sub(slot.load(Ordering::Relaxed)) > 1000 {
            slot.store(now, Ordering::Relaxed);
        }
        let mut s = h.some.load(Ordering::Relaxed);
        let n = loop {
            let n = s >> STALL_SHIFT;
            let since = if n == 0 { now } else { s & STALL_MASK };
            let next = ((n + 1).min(0xffff) << STALL_SHIFT) | since;
            match h
                .some
                .compare_exchange_weak(s, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => break n + 1,
                Err(x) => s = x,
            }
        };
        // Every thread of the program stalled at once: PSI's "full".
        if n >= threads.max(1) {
            let _ = h
                .full
                .compare_exchange(0, (1 << STALL_SHIFT) | now, Ordering::AcqRel, Ordering::Relaxed);
        }
    }

    /// The wait [`stall_begin`] began is over.
    pub(crate) fn stall_end(&self, some_id: u16, full_id: u16) {
        let h = self.head();
        let now = monotonic_us() & STALL_MASK;
        // One thread running again ends "full".
        let f = h.full.load(Ordering::Relaxed);
        if f != 0
            && h.full
                .compare_exchange(f, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            self.count(full_id, now.saturating_sub(f & STALL_MASK) * 1000);
        }
        let mut s = h.some.load(Ordering::Relaxed);
        loop {
            let n = s >> STALL_SHIFT;
            if n == 0 {
                // Begun before a fork zeroed the clock: nothing to end.
                return;
            }
            let since = s & STALL_MASK;
            let next = if n == 1 {
                0
            } else {
                ((n - 1) << STALL_SHIFT) | since
            };
            match h
                .some
                .compare_exchange_weak(s, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    if n == 1 {
                        self.count(some_id, now.saturating_sub(since) * 1000);
                    }
                    return;
                }
                Err(x) => s = x,
            }
        }
    }

    /// Move the pressure averages on, as the kernel's PSI does every 2 s:
    /// each decays toward the share of the last period stalled, with the
    /// period over 10, 60 and 300 s as its weight.  Called by the
    /// background reclaimer; a call sooner than 2 s after the last does
    /// nothing.
    pub(crate) fn update_pressure(&self, some_id: u16, full_id: u16) {
        const PERIOD_US: u64 = 2_000_000;
        let now = monotonic_us();
        let Ok(mut last) = self.last_avg.try_lock() else {
            return;
        };
        let elapsed = now.saturating_sub(last.2);
        if elapsed < PERIOD_US {
            return;
        }
        let (some, full) = self.stall_totals(some_id, full_id);
        let period_ns = (elapsed * 1000) as f64;
        let shares = [
            (some.saturating_sub(last.0) as f64 / period_ns).min(1.0),
            (full.saturating_sub(last.1) as f64 / period_ns).min(1.0),
        ];
        let h = self.head();
        for (k, share) in shares.iter().enumerate() {
            for (j, window) in [10.0f64, 60.0, 300.0].iter().enumerate() {
                let e = (-(elapsed as f64 / 1e6) / window).exp();
                let a = &h.avg[k * 3 + j];
                let old = f64::from_bits(a.load(Ordering::Relaxed));
                a.store((old * e + share * (1.0 - e)).to_bits(), Ordering::Relaxed);
            }
        }
        *last = (some, full, now);
    }
}
