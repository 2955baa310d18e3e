//! The state of one virtual page of a region, in one atomic word, and the
//! claim that changes it.
//!
//! ```text
//! +----------------+------+-----+----+-------+------+------+------+
//! |  slot offset   | dev  |WHOLE|UNIT|HAS_SLOT|DIRTY| BUSY | kind |
//! +----------------+------+-----+----+-------+------+------+------+
//!   bits 63..32     23..8   7     6     5       4      3      2..0
//!   bit 31: WAITERS (only with BUSY); bit 24: SEALED (a dirty page
//!   still write-protected; dev is 0 then); offsets fit: a device has at most
//!   2^32 slots (`MAX_DEVICE_SLOTS`)
//! ```
//!
//! - `Never`: never touched, or discarded by the program; reads as zeros,
//!   holds no memory and no slot.
//! - `Resident`: mapped.  Installed write-protected ("clean"), it may keep
//!   the slot it was read from: a clean page with a slot is dropped without
//!   IO.  The first write faults once and sets `DIRTY` (the slot's copy is
//!   stale then and is freed).
//! - `Swapped`: not mapped; its contents are in `slot`.
//! - `Staged`: soft-evicted: moved out of the region into a staging frame
//!   that the swap cache holds under the page's slot, still in memory.  A
//!   touch moves it back without IO; the reclaimer writes staged pages
//!   back (`DIRTY`: the frame is newer than the slot) oldest first.
//! - `Poisoned`: its swap-in failed; the page is poisoned, an access gets
//!   SIGBUS, never zeros.
//! - `Dead`: its region is going away.
//!
//! What each state promises about the page tables is the invariant every
//! transition keeps: a `Resident` page (a `Resident` unit: all 512 of its
//! pages) is mapped, or the program discarded it itself (`MADV_DONTNEED`,
//! `munmap`), which the next fault or eviction finds and turns into
//! `Never`; a page in any other state is not mapped.
//!
//! # Claims
//!
//! `BUSY` marks a transition in progress (a fault installing the page, the
//! reclaimer evicting it).  It is taken only through a [`PageClaim`]: a
//! compare-and-swap of `BUSY` into a word that has none, which makes the
//! claimant the page's only owner.  The claim publishes the next state with
//! [`PageClaim::commit`]; dropped without a commit, it puts back the word
//! it found.  So a transition that fails half way (an ioctl refused, an IO
//! error) cannot publish a state that is not true: the page is what it was.
//!
//! That one rule is what makes eviction and faults on the same page safe:
//! a write cannot land on a page between the reclaimer's dirty check and
//! its eviction, because the write first takes a write-protect fault, and
//! that fault's handler must win the same compare-and-swap.
//!
//! Whoever finds a page `BUSY` and must have it (a fault on it, a region
//! being unmapped) waits: it spins briefly, then sets `WAITERS` and sleeps
//! on the word's low half with `FUTEX_WAIT`; the claim's release wakes
//! sleepers when it finds `WAITERS`.  Sleeping, not yielding, is what
//! lets a `SCHED_FIFO` waiter on the claimant's CPU give that CPU back
//! (`sched_yield` only yields to threads of its own priority).  The
//! reclaimer never waits for a claim: it tries, and moves on.
//!
//! A claim on a unit's first page covers the unit's other 511 words (which
//! hold slots after a split swap-out, and nothing else).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::pager::instance::report;
use crate::swap_space::SwapEntry;

pub const KIND_MASK: u64 = 0b111;
pub const NEVER: u64 = 0;
pub const RESIDENT: u64 = 1;
pub const SWAPPED: u64 = 2;
pub const POISONED: u64 = 3;
pub const DEAD: u64 = 4;
/// Moved out into a staging frame (the swap cache holds it under its
/// slot) but not yet written back: a touch moves it back with no IO.
pub const STAGED: u64 = 5;
pub const BUSY: u64 = 1 << 3;
pub const DIRTY: u64 = 1 << 4;
/// A slot is recorded (Resident: a clean copy is on it; Swapped: always).
pub const HAS_SLOT: u64 = 1 << 5;
/// The first page of a 2 MB unit: its word is the unit's state (the other
/// 511 words hold only slots, after a split swap-out).
pub const UNIT: u64 = 1 << 6;
/// A unit's slot is the first of a whole cluster (seed 003); without it a
/// swapped unit was split, each page on its own slot.
pub const WHOLE: u64 = 1 << 7;
/// Resident and dirty (its contents are on no slot), but installed
/// write-protected and not written since: read back from a compressed
/// device, whose copy was let go.  Nothing can have written it, not even
/// the kernel through a write pin, without a write-protect fault, which
/// clears this bit; so eviction may copy it out and drop it in place, as a
/// clean page is dropped, with no `UFFDIO_MOVE` (batch.rs).
pub const SEALED: u64 = 1 << 24;
/// Someone sleeps on this word until its claim is released.  In the low
/// half (the futex word), never set without `BUSY`.
pub(crate) const WAITERS: u64 = 1 << 31;

const DEV_SHIFT: u32 = 8;
const OFF_SHIFT: u32 = 32;
const DEV_MASK: u64 = 0xffff;

#[inline]
pub fn kind(w: u64) -> u64 {
    w & KIND_MASK
}

/// The word with `e` as its slot.
#[inline]
pub fn with_slot(w: u64, e: SwapEntry) -> u64 {
    debug_assert!(e.offset() < 1 << 32);
    (w & (KIND_MASK | DIRTY | UNIT | WHOLE))
        | HAS_SLOT
        | (e.device() as u64) << DEV_SHIFT
        | e.offset() << OFF_SHIFT
}

/// The slot recorded in `w`, if any.
#[inline]
pub fn slot(w: u64) -> Option<SwapEntry> {
    (w & HAS_SLOT != 0).then(|| SwapEntry::new(((w >> DEV_SHIFT) & DEV_MASK) as u16, w >> OFF_SHIFT))
}

/// `w` without its slot.
#[inline]
pub fn without_slot(w: u64) -> u64 {
    w & (KIND_MASK | DIRTY | UNIT)
}

/// Exclusive ownership of one page's state for one transition.  See the
/// module documentation.
#[must_use = "a claim dropped at once puts the page back as it was"]
pub(crate) struct PageClaim<'a> {
    word: &'a AtomicU64,
    found: u64,
}

impl<'a> PageClaim<'a> {
    /// Claim `word` if it still holds `expect` (which has no `BUSY`).
    #[inline]
    pub fn try_claim(word: &'a AtomicU64, expect: u64) -> Option<PageClaim<'a>> {
        debug_assert!(expect & BUSY == 0);
        word.compare_exchange(expect, expect | BUSY, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| PageClaim { word, found: expect })
    }

    /// Claim `word` whatever it holds, waiting out a claim in progress.
    pub fn wait_claim(word: &'a AtomicU64, waited: impl FnMut()) -> PageClaim<'a> {
        let mut waited = waited;
        loop {
            let w = wait_unbusy(word, &mut waited);
            if let Some(c) = PageClaim::try_claim(word, w) {
                return c;
            }
        }
    }

    /// The word as it was claimed (without `BUSY`).
    #[inline]
    pub fn found(&self) -> u64 {
        self.found
    }

    /// Publish `next` as the page's state and release the claim.
    #[inline]
    pub fn commit(self, next: u64) {
        debug_assert!(next & (BUSY | WAITERS) == 0);
        release(self.word, next);
        std::mem::forget(self);
    }
}

impl Drop for PageClaim<'_> {
    /// Without a commit, the page is what it was.
    #[inline]
    fn drop(&mut self) {
        release(self.word, self.found);
    }
}

#[inline]
fn release(word: &AtomicU64, next: u64) {
    if word.swap(next, Ordering::AcqRel) & WAITERS != 0 {
        futex_wake(word);
    }
}

/// Wait until `word` has no claim on it, and return it.  `waited` is
/// called once when the wait turns into sleeping.
pub(crate) fn wait_unbusy(word: &AtomicU64, waited: &mut impl FnMut()) -> u64 {
    // A claim is held for an ioctl or two, or for a swap-in's IO: spin for
    // the first, sleep for the second.
    const SPINS: u32 = 64;
    let mut spins = 0;
    let mut slept = false;
    loop {
        let w = word.load(Ordering::Acquire);
        if w & BUSY == 0 {
            return w;
        }
        if spins < SPINS {
            spins += 1;
            std::hint::spin_loop();
            continue;
        }
        if w & WAITERS == 0
            && word
                .compare_exchange(w, w | WAITERS, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            continue;
        }
        if !slept {
            slept = true;
            waited();
        }
        futex_wait(word, (w | WAITERS) as u32);
    }
}

/// The futex word of a state word: its low half, which holds `BUSY` and
/// `WAITERS`, so every release changes it.
#[inline]
fn futex_addr(word: &AtomicU64) -> *const u32 {
    let p = (word as *const AtomicU64).cast::<u32>();
    if cfg!(target_endian = "big") {
        p.wrapping_add(1)
    } else {
        p
    }
}

fn futex_wait(word: &AtomicU64, low: u32) {
    // SAFETY: the aligned 32-bit half of a live AtomicU64, which the
    // kernel only reads; sleeps while it equals `low`.
    unsafe { crate::sys::futex_wait(futex_addr(word).cast(), low, None) };
}

fn futex_wake(word: &AtomicU64) {
    crate::sys::futex_wake(futex_addr(word) as usize, i32::MAX);
}

/// Bytes in a 2 MB unit (`Swap::map_huge`).
pub const UNIT_BYTES: usize = 2 << 20;
/// Pages in a unit.
pub const UNIT_PAGES: usize = UNIT_BYTES / crate::PAGE_SIZE;

/// A short sleep for a thread that must retry: sleeping, unlike
/// `sched_yield`, lets a thread of lower priority on this CPU run.
pub(crate) fn pause() {
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 50_000,
    };
    // SAFETY: nanosleep reads the timespec; async-signal-safe.
    unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
}

/// Say why a page is poisoned, on stderr, from wherever the swap-in failed
/// (a signal handler included).
pub(crate) fn log_poison(addr: u64, len: u64, e: crate::swap_space::SwapEntry, err: &crate::io::IoError) {
    // An io::Error's own message allocates (strerror into a String): the
    // errno is said instead, and an authentication failure in its words.
    if let crate::io::IoError::Integrity { .. } = err {
        report::line(format_args!(
            "uswap: swap-in of {len} bytes at {addr:#x} failed: device {}: {err}; the memory is poisoned and touching it raises SIGBUS",
            e.device(),
        ));
        return;
    }
    report::line(format_args!(
        "uswap: swap-in of {len} bytes at {addr:#x} failed: device {} slot {} gave errno {}; the memory is poisoned and touching it raises SIGBUS",
        e.device(),
        e.offset(),
        err.errno().unwrap_or(0)
    ));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn slots_round_trip() {
        let e = SwapEntry::new(31, (1 << 31) + 5);
        let w = with_slot(RESIDENT | DIRTY, e);
        assert_eq!(kind(w), RESIDENT);
        assert_eq!(slot(w), Some(e));
        assert_eq!(w & DIRTY, DIRTY);
        assert_eq!(w & (BUSY | WAITERS), 0);
        assert_eq!(slot(without_slot(w)), None);
        assert_eq!(kind(without_slot(w)), RESIDENT);
    }

    #[test]
    fn a_dropped_claim_restores_and_a_commit_publishes() {
        let word = AtomicU64::new(RESIDENT);
        {
            let c = PageClaim::try_claim(&word, RESIDENT).unwrap();
            assert!(PageClaim::try_claim(&word, RESIDENT).is_none(), "one owner");
            assert_eq!(word.load(Ordering::Relaxed), RESIDENT | BUSY);
            assert_eq!(c.found(), RESIDENT);
        }
        assert_eq!(word.load(Ordering::Relaxed), RESIDENT);
        PageClaim::try_claim(&word, RESIDENT).unwrap().commit(SWAPPED);
        assert_eq!(word.load(Ordering::Relaxed), SWAPPED);
        assert!(
            PageClaim::try_claim(&word, RESIDENT).is_none(),
            "stale expectation"
        );
    }

    /// Many threads each claim the page, increment a counter that only the
    /// owner may touch, and commit: no increment is lost, waiters sleep
    /// and are woken, and the word ends without BUSY or WAITERS.
    #[test]
    fn claims_exclude_each_other_and_wake_sleepers() {
        let word = Arc::new(AtomicU64::new(NEVER));
        let count = Arc::new(AtomicU64::new(0));
        let sleeps = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (word, count, sleeps) = (word.clone(), count.clone(), sleeps.clone());
                std::thread::spawn(move || {
                    for _ in 0..2000 {
                        let c = PageClaim::wait_claim(&word, || {
                            sleeps.fetch_add(1, Ordering::Relaxed);
                        });
                        // Not atomic as a whole: only the owner does this.
                        let v = count.load(Ordering::Relaxed);
                        if v % 97 == 0 {
                            std::thread::yield_now();
                        }
                        count.store(v + 1, Ordering::Relaxed);
                        let next = c.found() ^ DIRTY;
                        c.commit(next);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(count.load(Ordering::Relaxed), 16000);
        assert_eq!(word.load(Ordering::Relaxed) & (BUSY | WAITERS), 0);
        assert!(sleeps.load(Ordering::Relaxed) > 0, "some waiter slept");
    }
}
