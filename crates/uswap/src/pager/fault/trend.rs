//! Trend prefetch (after Leap, ATC'20): a thread's recent faults, as
//! deltas in pages, vote; a delta that holds a majority of the last
//! [`HISTORY`] is the thread's trend, and the pages along it are read in
//! before they are touched.  The kernel's swap readahead reads a window
//! around the fault, which serves a forward walk (uswap's own forward path
//! does too: readahead.rs) but wastes most of its window on a strided
//! walk and half of it on a backward one.  Along a trend, a backward walk
//! reads the run below the fault with one IO; a stride of 2 to 127 pages
//! either way reads the pages the stride will land on, one each.
//!
//! Installed pages take no fault when touched, so the faults of a walk
//! that the prefetch keeps up with come one window apart, not one stride:
//! a fault that lands on the trend's own steps within the window's reach
//! (`on_trend`) counts as one stride in the history, and the window's
//! pages as *hits*, passed over or about to be; one just past the reach
//! doubles the window, from 2 to `READAHEAD_MAX`, and one off the trend
//! starts it over.  The pages of a window after which the walk went
//! elsewhere are counted *wasted* (a proxy: uswap sees no accesses, only
//! faults, so a page the program touches later, after the walk moved on,
//! counts as wasted too).
//!
//! This module is the vote and the window; the walk that reads along a
//! trend is readahead's (`readahead::prefetch_trend`), as its runs are.
//!
//! `SwapBuilder::trend_prefetch(false)` (`--ablate` `no-trend-prefetch`)
//! leaves the forward path alone: readahead's own.

use crate::PAGE_SIZE;

const PAGE: u64 = PAGE_SIZE as u64;

/// Faults a thread remembers: the last eight deltas, a byte each.
pub(crate) const HISTORY: u32 = 8;
/// A delta that does not fit a byte, or no delta (the first fault): it
/// never wins the vote.
pub(crate) const FAR: i8 = i8::MIN;

/// `delta` pushed onto `hist`, the oldest falling off.
#[inline]
pub(crate) fn push(hist: u64, delta: i8) -> u64 {
    (hist << 8) | u64::from(delta as u8)
}

/// The delta of a fault at `addr` after one at `last`, in pages: `FAR`
/// beyond a byte, or with no `last`.
#[inline]
pub(crate) fn delta(last: u64, addr: u64) -> i8 {
    if last == 0 {
        return FAR;
    }
    let d = (addr as i64).wrapping_sub(last as i64) / PAGE as i64;
    if d > i64::from(i8::MAX) || d <= i64::from(FAR) {
        FAR
    } else {
        d as i8
    }
}

/// The delta that holds a strict majority of `hist` (Boyer-Moore's vote,
/// then a count), if any; never `FAR` or 0.
pub(crate) fn majority(hist: u64) -> Option<i8> {
    let bytes = hist.to_ne_bytes();
    let (mut cand, mut n) = (FAR, 0u32);
    for &b in &bytes {
        let d = b as i8;
        if n == 0 {
            (cand, n) = (d, 1);
        } else if d == cand {
            n += 1;
        } else {
            n -= 1;
        }
    }
    let count = bytes.iter().filter(|&&b| b as i8 == cand).count() as u32;
    (count > HISTORY / 2 && cand != FAR && cand != 0).then_some(cand)
}

/// Where a fault at `addr` falls on a walk of `stride` that last faulted
/// at `last` and was read ahead `reach` steps: `Some(q)`, q steps on, for
/// 1 <= q <= reach + 1 (within the window or just past it); `None` off
/// the trend.
#[inline]
pub(crate) fn on_trend(last: u64, addr: u64, stride: i8, reach: u32) -> Option<u32> {
    let step = i64::from(stride) * PAGE as i64;
    let moved = (addr as i64).wrapping_sub(last as i64);
    if step == 0 || moved % step != 0 {
        return None;
    }
    let q = moved / step;
    (1..=i64::from(reach) + 1).contains(&q).then_some(q as u32)
}

/// The window after a fault: doubled on a hit, from 2 to `max`.
#[inline]
pub(crate) fn next_window(window: u32, hit: bool, max: u32) -> u32 {
    if hit {
        (window * 2).clamp(2, max)
    } else {
        2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A history of nothing but `FAR`.  (A thread's first history is all
    /// zeros, eight repeats of one page: no more a trend than this.)
    const EMPTY: u64 = u64::from_ne_bytes([FAR as u8; 8]);

    fn hist_of(ds: &[i8]) -> u64 {
        ds.iter().fold(EMPTY, |h, &d| push(h, d))
    }

    #[test]
    fn a_strict_majority_wins() {
        assert_eq!(majority(hist_of(&[5, 5, 5, 5, 5])), Some(5));
        assert_eq!(majority(hist_of(&[-1, 3, -1, 9, -1, -1, 2, -1])), Some(-1));
        // Four of eight is not a majority.
        assert_eq!(majority(hist_of(&[7, 1, 7, 1, 7, 1, 7, 1])), None);
        // Nor is a history of nothing, or of repeats of one page.
        assert_eq!(majority(EMPTY), None);
        assert_eq!(majority(hist_of(&[0; 8])), None);
        // The oldest fall off.
        let h = hist_of(&[3, 3, 3, 3, 3, 3, 3, 3, -2, -2, -2, -2, -2]);
        assert_eq!(majority(h), Some(-2));
    }

    #[test]
    fn deltas_beyond_a_byte_are_far() {
        let p = PAGE;
        assert_eq!(delta(0, 5 * p), FAR);
        assert_eq!(delta(100 * p, 103 * p), 3);
        assert_eq!(delta(100 * p, 99 * p), -1);
        assert_eq!(delta(1000 * p, 1127 * p), 127);
        assert_eq!(delta(1000 * p, 1128 * p), FAR);
        assert_eq!(delta(1000 * p, 872 * p), FAR);
        assert_eq!(delta(1000 * p, 873 * p), -127);
    }

    #[test]
    fn faults_on_the_trend_within_its_reach() {
        let p = PAGE;
        // A stride of 7 read 4 steps ahead from page 100.
        assert_eq!(on_trend(100 * p, 107 * p, 7, 4), Some(1));
        assert_eq!(on_trend(100 * p, 135 * p, 7, 4), Some(5));
        assert_eq!(on_trend(100 * p, 142 * p, 7, 4), None, "past the reach");
        assert_eq!(on_trend(100 * p, 108 * p, 7, 4), None, "off the steps");
        assert_eq!(on_trend(100 * p, 93 * p, 7, 4), None, "the wrong way");
        // Backwards.
        assert_eq!(on_trend(100 * p, 99 * p, -1, 0), Some(1));
        assert_eq!(on_trend(100 * p, 67 * p, -1, 32), Some(33));
        assert_eq!(on_trend(100 * p, 101 * p, -1, 32), None);
    }

    #[test]
    fn windows_double_on_hits_and_start_over() {
        let mut w = 2;
        for _ in 0..10 {
            w = next_window(w, true, 32);
        }
        assert_eq!(w, 32);
        assert_eq!(next_window(w, false, 32), 2);
    }
}
