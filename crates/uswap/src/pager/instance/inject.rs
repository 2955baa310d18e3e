//! Test hooks: failures of the userfaultfd moves and copies, and a pause
//! in the fork gate, injected at chosen moments (`pager/tests/injected.rs`
//! and the soak). Built only for tests.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::PAGE_SIZE;

/// Test hooks: the next `n` userfaultfd calls of a kind fail, after doing
/// part of their work for real, as the kernel fails them.
#[derive(Default)]
pub(crate) struct Inject {
    /// Moves out of regions: count, pages moved before failing, errno.
    pub move_out: (AtomicUsize, AtomicUsize, std::sync::atomic::AtomicI32),
    /// Pages a failed move out moves past what it reports (a move the
    /// caller would not know of: docs/RELIABILITY.md's sightings).
    pub move_out_unreported: AtomicUsize,
    /// Moves into regions.
    pub move_in: (AtomicUsize, AtomicUsize, std::sync::atomic::AtomicI32),
    /// The copies that finish a move in that failed.
    pub copy_in: (AtomicUsize, std::sync::atomic::AtomicI32),
    /// 1: the next install stops, claim held, at 2 until this is 0.
    pub gate: std::sync::atomic::AtomicU32,
}

impl Inject {
    /// Take one injected failure of `(count, partial pages, errno)`.
    pub fn take_move(f: &(AtomicUsize, AtomicUsize, std::sync::atomic::AtomicI32)) -> Option<(u64, i32)> {
        f.0.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .ok()
            .map(|_| {
                (
                    f.1.load(Ordering::Relaxed) as u64 * PAGE_SIZE as u64,
                    f.2.load(Ordering::Relaxed),
                )
            })
    }

    /// The install gate: spin here, claim held, while a test looks on.
    pub fn gate(&self) {
        if self
            .gate
            .compare_exchange(1, 2, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            while self.gate.load(Ordering::Acquire) != 0 {
                std::hint::spin_loop();
            }
        }
    }
}
