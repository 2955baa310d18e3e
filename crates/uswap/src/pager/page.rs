//! The state of one virtual page of a region, in one atomic word.
//!
//! ```text
//!  63            24 23  8 7     5 4      3      2..0
//! +----------------+------+-------+------+------+------+
//! |  slot offset   | dev  |   -   | DIRTY| BUSY | kind |
//! +----------------+------+-------+------+------+------+
//! ```
//!
//! - `Never`: never touched; reads as zeros, holds no memory and no slot.
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
//! `BUSY` marks a transition in progress (a fault installing the page, the
//! reclaimer evicting it): whoever sets it with a compare-and-swap owns the
//! page until it stores the next state, and everyone else waits.  That one
//! rule is what makes eviction and faults on the same page safe: a write
//! cannot land on a page between the reclaimer's dirty check and its
//! eviction, because the write first takes a write-protect fault, and that
//! fault's handler must win the same compare-and-swap.

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

const DEV_SHIFT: u32 = 8;
const OFF_SHIFT: u32 = 24;

#[inline]
pub fn kind(w: u64) -> u64 {
    w & KIND_MASK
}

/// The word with `e` as its slot.
#[inline]
pub fn with_slot(w: u64, e: SwapEntry) -> u64 {
    debug_assert!(e.offset() < 1 << 40);
    (w & (KIND_MASK | BUSY | DIRTY | UNIT | WHOLE))
        | HAS_SLOT
        | (e.device() as u64) << DEV_SHIFT
        | e.offset() << OFF_SHIFT
}

/// The slot recorded in `w`, if any.
#[inline]
pub fn slot(w: u64) -> Option<SwapEntry> {
    (w & HAS_SLOT != 0).then(|| SwapEntry::new(((w >> DEV_SHIFT) & 0xffff) as u16, w >> OFF_SHIFT))
}

/// `w` without its slot.
#[inline]
pub fn without_slot(w: u64) -> u64 {
    w & (KIND_MASK | BUSY | DIRTY | UNIT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_round_trip() {
        let e = SwapEntry::new(31, (1 << 36) + 5);
        let w = with_slot(RESIDENT | DIRTY, e);
        assert_eq!(kind(w), RESIDENT);
        assert_eq!(slot(w), Some(e));
        assert_eq!(w & DIRTY, DIRTY);
        assert_eq!(slot(without_slot(w)), None);
        assert_eq!(kind(without_slot(w)), RESIDENT);
    }
}
