//! The state of one virtual page of a region, in one atomic word, and the
//! claim that changes it.
//!
//! ```text
//! +-------------+---+--------+---+-----+---+---+---+---+---+------+
//! | slot offset | W | shadow | S | dev | H | U | A | D | B | kind |
//! +-------------+---+--------+---+-----+---+---+---+---+---+------+
//!    63..32      31   30..16  15  14..8  7   6   5   4   3   2..0
//!   W WAITERS, S SEALED, H WHOLE, U UNIT, A HAS_SLOT, D DIRTY, B BUSY
//! ```
//!
//! `WAITERS` only with `BUSY`; `SEALED` (a dirty page still write-protected)
//! only on a resident page, `dev` 0 then; the shadow (workingset.rs) only
//! on a swapped or staged one.  Offsets fit: a device has at most 2^32
//! slots (`MAX_DEVICE_SLOTS`), and there are at most 32 devices
//! (`MAX_DEVICES`) for the 128 the field holds.
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

const KIND_MASK: u64 = 0b111;
const NEVER: u64 = 0;
const RESIDENT: u64 = 1;
const SWAPPED: u64 = 2;
const POISONED: u64 = 3;
const DEAD: u64 = 4;
const STAGED: u64 = 5;
const BUSY: u64 = 1 << 3;
const DIRTY: u64 = 1 << 4;
/// A slot is recorded (Resident: a clean copy is on it; Swapped: always).
const HAS_SLOT: u64 = 1 << 5;
/// The first page of a 2 MB unit: its word is the unit's state (the other
/// 511 words hold only slots, after a split swap-out).
const UNIT: u64 = 1 << 6;
/// A unit's slot is the first of a whole cluster (seed 003); without it a
/// swapped unit was split, each page on its own slot.
const WHOLE: u64 = 1 << 7;
/// Resident and dirty (its contents are on no slot), but installed
/// write-protected and not written since: read back from a compressed
/// device, whose copy was let go.  Nothing can have written it, not even
/// the kernel through a write pin, without a write-protect fault, which
/// clears this bit; so eviction may copy it out and drop it in place, as a
/// clean page is dropped, with no `UFFDIO_MOVE` (batch.rs).
const SEALED: u64 = 1 << 15;
/// A swapped or staged page's shadow: the eviction clock, in buckets,
/// when it left the LRU (workingset.rs); 0 for none.
const SHADOW_SHIFT: u32 = 16;
const SHADOW_MASK: u64 = (1 << crate::pager::instance::workingset::SHADOW_BITS) - 1;
/// Someone sleeps on this word until its claim is released.  In the low
/// half (the futex word), never set without `BUSY`.
const WAITERS: u64 = 1 << 31;

const DEV_SHIFT: u32 = 8;
const OFF_SHIFT: u32 = 32;
const DEV_MASK: u64 = 0x7f;
const _: () = assert!(crate::swap_space::MAX_DEVICES as u64 <= DEV_MASK + 1);
const _: () = assert!(SHADOW_SHIFT + crate::pager::instance::workingset::SHADOW_BITS <= 31);

/// What a page is: the word's low three bits (see the module
/// documentation for each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Never,
    Resident,
    Swapped,
    Poisoned,
    Dead,
    /// Moved out into a staging frame (the swap cache holds it under its
    /// slot) but not yet written back: a touch moves it back with no IO.
    Staged,
}

impl Kind {
    const fn bits(self) -> u64 {
        match self {
            Kind::Never => NEVER,
            Kind::Resident => RESIDENT,
            Kind::Swapped => SWAPPED,
            Kind::Poisoned => POISONED,
            Kind::Dead => DEAD,
            Kind::Staged => STAGED,
        }
    }
}

/// One page's state, as loaded from its word: a kind, flags, and maybe a
/// slot.  A value: changing one makes another, which a [`PageClaim`]
/// publishes.  Every bit of the layout is read and written here and
/// nowhere else.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(transparent)]
pub(crate) struct PageWord(u64);

impl PageWord {
    /// Never touched: no flags, no slot.  All-zero, as a fresh table is.
    pub const NEVER: PageWord = PageWord(NEVER);

    /// A page of `kind`, no flags, no slot.
    #[inline]
    pub const fn of(kind: Kind) -> PageWord {
        PageWord(kind.bits())
    }

    #[inline]
    pub fn kind(self) -> Kind {
        match self.0 & KIND_MASK {
            NEVER => Kind::Never,
            RESIDENT => Kind::Resident,
            SWAPPED => Kind::Swapped,
            POISONED => Kind::Poisoned,
            DEAD => Kind::Dead,
            // STAGED; 6 and 7 are never written (`Kind::bits`).
            _ => Kind::Staged,
        }
    }

    #[inline]
    pub fn is(self, kind: Kind) -> bool {
        self.0 & KIND_MASK == kind.bits()
    }

    /// A transition is in progress (a claim holds the word).
    #[inline]
    pub fn is_busy(self) -> bool {
        self.0 & BUSY != 0
    }

    /// Someone sleeps on the word until its claim is released.
    #[inline]
    pub fn has_waiters(self) -> bool {
        self.0 & WAITERS != 0
    }

    /// Written since its slot's copy (a resident page), or newer than its
    /// slot (a staged one).
    #[inline]
    pub fn is_dirty(self) -> bool {
        self.0 & DIRTY != 0
    }

    /// The first page of a 2 MB unit, whose word is the unit's.
    #[inline]
    pub fn is_unit(self) -> bool {
        self.0 & UNIT != 0
    }

    /// A swapped unit on a whole cluster (not split over single slots).
    #[inline]
    pub fn is_whole(self) -> bool {
        self.0 & WHOLE != 0
    }

    /// Dirty but write-protected and unwritten since it was read from a
    /// compressed device (see `SEALED`).
    #[inline]
    pub fn is_sealed(self) -> bool {
        self.0 & SEALED != 0
    }

    /// The slot recorded, if any.
    #[inline]
    pub fn slot(self) -> Option<SwapEntry> {
        (self.0 & HAS_SLOT != 0)
            .then(|| SwapEntry::new(((self.0 >> DEV_SHIFT) & DEV_MASK) as u16, self.0 >> OFF_SHIFT))
    }

    /// With `e` as its slot; kind, dirt and unit flags kept, sealing and
    /// shadow lost.
    #[inline]
    pub fn with_slot(self, e: SwapEntry) -> PageWord {
        debug_assert!(e.offset() < 1 << 32);
        debug_assert!(u64::from(e.device()) <= DEV_MASK);
        PageWord(
            (self.0 & (KIND_MASK | DIRTY | UNIT | WHOLE))
                | HAS_SLOT
                | (e.device() as u64) << DEV_SHIFT
                | e.offset() << OFF_SHIFT,
        )
    }

    /// Without its slot (nor `WHOLE`, nor sealing): kind, dirt, unit.
    #[inline]
    pub fn without_slot(self) -> PageWord {
        PageWord(self.0 & (KIND_MASK | DIRTY | UNIT))
    }

    /// Dirty as well.
    #[inline]
    pub fn dirty(self) -> PageWord {
        PageWord(self.0 | DIRTY)
    }

    /// With `flag` set as well, when `on`.
    #[inline]
    fn with_if(self, flag: u64, on: bool) -> PageWord {
        PageWord(self.0 | if on { flag } else { 0 })
    }

    /// Dirty as well, when `dirty`.
    #[inline]
    pub fn dirty_if(self, dirty: bool) -> PageWord {
        self.with_if(DIRTY, dirty)
    }

    /// Sealed as well, when `sealed` (a dirty page read back from a
    /// compressed device that let its copy go).
    #[inline]
    pub fn sealed_if(self, sealed: bool) -> PageWord {
        self.with_if(SEALED, sealed)
    }

    /// A unit's word, when `unit`.
    #[inline]
    pub fn unit_if(self, unit: bool) -> PageWord {
        self.with_if(UNIT, unit)
    }

    /// A unit's word.
    #[inline]
    pub fn unit(self) -> PageWord {
        PageWord(self.0 | UNIT)
    }

    /// A unit swapped to a whole cluster.
    #[inline]
    pub fn whole(self) -> PageWord {
        PageWord(self.0 | WHOLE)
    }

    /// With `shadow` (workingset.rs) as its shadow: set on a page leaving
    /// the LRU for a slot, after its slot.
    #[inline]
    pub fn with_shadow(self, shadow: u16) -> PageWord {
        debug_assert!(!self.is(Kind::Resident));
        PageWord(
            (self.0 & !(SHADOW_MASK << SHADOW_SHIFT)) | (u64::from(shadow) & SHADOW_MASK) << SHADOW_SHIFT,
        )
    }

    /// The shadow kept when the page left the LRU; 0 for none (and for
    /// any resident page).
    #[inline]
    pub fn shadow(self) -> u16 {
        if self.is(Kind::Resident) {
            return 0;
        }
        ((self.0 >> SHADOW_SHIFT) & SHADOW_MASK) as u16
    }

    /// Without sealing.
    #[inline]
    pub fn unsealed(self) -> PageWord {
        PageWord(self.0 & !SEALED)
    }

    /// As a word no one claims: without `BUSY` and `WAITERS` (what a
    /// forked child finds of a claim its parent's thread held).
    #[inline]
    pub fn unclaimed(self) -> PageWord {
        PageWord(self.0 & !(BUSY | WAITERS))
    }

    /// The bits, for a dump.
    #[cfg(test)]
    pub fn raw(self) -> u64 {
        self.0
    }
}

impl std::fmt::Debug for PageWord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.kind())?;
        for (on, name) in [
            (self.is_busy(), "busy"),
            (self.has_waiters(), "waiters"),
            (self.is_dirty(), "dirty"),
            (self.is_unit(), "unit"),
            (self.is_whole(), "whole"),
            (self.is_sealed(), "sealed"),
        ] {
            if on {
                write!(f, "|{name}")?;
            }
        }
        if let Some(e) = self.slot() {
            write!(f, " slot {}:{}", e.device(), e.offset())?;
        }
        Ok(())
    }
}

/// One page's state word in a region's table: loaded as a [`PageWord`],
/// changed by a [`PageClaim`] (and, where nothing else can touch it, a
/// store: a unit's other 511 words, a fresh region, a forked child's
/// adoption).
#[repr(transparent)]
pub(crate) struct PageState(AtomicU64);

// SAFETY: a transparent AtomicU64, for which zero is valid: `Never`.
unsafe impl crate::table::Zeroed for PageState {}

impl PageState {
    #[inline]
    pub fn load(&self) -> PageWord {
        PageWord(self.0.load(Ordering::Acquire))
    }

    /// Where no claim can be in progress (a region being set up, a
    /// forked child adopting its pages) or for a word no claim covers
    /// (a unit's other 511).
    #[inline]
    pub fn store(&self, w: PageWord) {
        debug_assert!(!w.is_busy() && !w.has_waiters());
        self.0.store(w.0, Ordering::Release);
    }

    /// Claim the word if it still holds `expect` (which has no `BUSY`).
    #[inline]
    pub fn try_claim(&self, expect: PageWord) -> Option<PageClaim<'_>> {
        PageClaim::try_claim(&self.0, expect)
    }

    /// Claim the word whatever it holds, waiting out a claim in progress.
    pub fn wait_claim(&self, waited: impl FnMut()) -> PageClaim<'_> {
        PageClaim::wait_claim(&self.0, waited)
    }

    /// Wait until no claim is on the word, and return it.  `waited` is
    /// called once when the wait turns into sleeping.
    pub fn wait_unbusy(&self, waited: &mut impl FnMut()) -> PageWord {
        wait_unbusy(&self.0, waited)
    }
}

/// Exclusive ownership of one page's state for one transition.  See the
/// module documentation.
#[must_use = "a claim dropped at once puts the page back as it was"]
pub(crate) struct PageClaim<'a> {
    word: &'a AtomicU64,
    found: PageWord,
}

impl<'a> PageClaim<'a> {
    /// Claim `word` if it still holds `expect` (which has no `BUSY`).
    #[inline]
    fn try_claim(word: &'a AtomicU64, expect: PageWord) -> Option<PageClaim<'a>> {
        debug_assert!(!expect.is_busy());
        word.compare_exchange(expect.0, expect.0 | BUSY, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| PageClaim { word, found: expect })
    }

    /// Claim `word` whatever it holds, waiting out a claim in progress.
    fn wait_claim(word: &'a AtomicU64, waited: impl FnMut()) -> PageClaim<'a> {
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
    pub fn found(&self) -> PageWord {
        self.found
    }

    /// Publish `next` as the page's state and release the claim.
    #[inline]
    pub fn commit(self, next: PageWord) {
        debug_assert!(!next.is_busy() && !next.has_waiters());
        release(self.word, next.0);
        std::mem::forget(self);
    }
}

impl Drop for PageClaim<'_> {
    /// Without a commit, the page is what it was.
    #[inline]
    fn drop(&mut self) {
        release(self.word, self.found.0);
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
fn wait_unbusy(word: &AtomicU64, waited: &mut impl FnMut()) -> PageWord {
    // A claim is held for an ioctl or two, or for a swap-in's IO: spin for
    // the first, sleep for the second.
    const SPINS: u32 = 64;
    let mut spins = 0;
    let mut slept = false;
    loop {
        let w = word.load(Ordering::Acquire);
        if w & BUSY == 0 {
            return PageWord(w);
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
    if err.errno() == Some(libc::EHOSTDOWN) {
        // An NBD device whose server stayed gone past its deadline.
        report::line(format_args!(
            "uswap: swap-in of {len} bytes at {addr:#x} failed: device {} slot {}: its server stayed unreachable past the device's deadline (errno {}); the memory is poisoned and touching it raises SIGBUS",
            e.device(),
            e.offset(),
            libc::EHOSTDOWN
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
        let w = PageWord::of(Kind::Resident).dirty().with_slot(e);
        assert_eq!(w.kind(), Kind::Resident);
        assert_eq!(w.slot(), Some(e));
        assert!(w.is_dirty());
        assert!(!w.is_busy() && !w.has_waiters() && !w.is_unit() && !w.is_sealed());
        assert_eq!(w.without_slot().slot(), None);
        assert_eq!(w.without_slot().kind(), Kind::Resident);
        assert!(w.without_slot().is_dirty());
        // A unit's flags survive a slot; sealing does not.
        let u = PageWord::of(Kind::Swapped).unit().whole().with_slot(e);
        assert!(u.is_unit() && u.is_whole() && u.is(Kind::Swapped));
        let sealed = PageWord::of(Kind::Resident).dirty().sealed_if(true);
        assert!(sealed.is_sealed() && !sealed.with_slot(e).is_sealed());
        assert_eq!(
            format!("{u:?}"),
            format!("Swapped|unit|whole slot 31:{}", (1u64 << 31) + 5)
        );
        // Every kind reads back as itself.
        for k in [
            Kind::Never,
            Kind::Resident,
            Kind::Swapped,
            Kind::Poisoned,
            Kind::Dead,
            Kind::Staged,
        ] {
            assert_eq!(PageWord::of(k).kind(), k);
            assert!(PageWord::of(k).is(k));
        }
    }

    #[test]
    fn a_dropped_claim_restores_and_a_commit_publishes() {
        let resident = PageWord::of(Kind::Resident);
        let word = PageState(AtomicU64::new(resident.raw()));
        {
            let c = word.try_claim(resident).unwrap();
            assert!(word.try_claim(resident).is_none(), "one owner");
            assert!(word.load().is_busy());
            assert_eq!(c.found(), resident);
        }
        assert_eq!(word.load(), resident);
        word.try_claim(resident)
            .unwrap()
            .commit(PageWord::of(Kind::Swapped));
        assert_eq!(word.load(), PageWord::of(Kind::Swapped));
        assert!(word.try_claim(resident).is_none(), "stale expectation");
    }

    /// Many threads each claim the page, increment a counter that only the
    /// owner may touch, and commit: no increment is lost, waiters sleep
    /// and are woken, and the word ends without BUSY or WAITERS.
    #[test]
    fn claims_exclude_each_other_and_wake_sleepers() {
        let word = Arc::new(PageState(AtomicU64::new(NEVER)));
        let count = Arc::new(AtomicU64::new(0));
        let sleeps = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (word, count, sleeps) = (word.clone(), count.clone(), sleeps.clone());
                std::thread::spawn(move || {
                    for _ in 0..2000 {
                        let c = word.wait_claim(|| {
                            sleeps.fetch_add(1, Ordering::Relaxed);
                        });
                        // Not atomic as a whole: only the owner does this.
                        let v = count.load(Ordering::Relaxed);
                        if v % 97 == 0 {
                            std::thread::yield_now();
                        }
                        count.store(v + 1, Ordering::Relaxed);
                        let found = c.found();
                        let next = if found.is_dirty() {
                            PageWord::NEVER
                        } else {
                            found.dirty()
                        };
                        c.commit(next);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(count.load(Ordering::Relaxed), 16000);
        assert!(!word.load().is_busy() && !word.load().has_waiters());
        assert!(sleeps.load(Ordering::Relaxed) > 0, "some waiter slept");
    }
}
