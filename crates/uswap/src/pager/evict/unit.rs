//! Eviction of 2 MB units, whole.
//!
//! 2 MB units (seed 003) go out whole: the unit is moved with one
//! `UFFDIO_MOVE` of 2 MB into an "out" staging unit (a PMD move when it is
//! a THP: it stays whole), written with one 2 MB IO to a whole cluster
//! from `alloc_huge`, and discarded.  When no cluster is wholly free the
//! unit is split over 512 single slots, each page's in its own word
//! (counted as a fallback), and still written as one folio: one IO per
//! segment of neighbouring slots (`folio.rs`).  A write that fails for
//! good retires only the bad block's slot, found by trying the failed
//! segment again page by page.  The "out" units are registered with the
//! userfaultfd (they receive moved pages) and never touched.  A unit moved
//! in is writable (a move drops write protection), so units are always
//! dirty: no clean drops, no soft eviction; they go straight to their
//! slots.
//!
//! A unit mapped with small pages (no THP) can move part way: the move
//! stops at a page the program discarded (a hole), a pinned page or a
//! locked one.  Eviction then puts back what moved before it reads any of
//! the "out" unit (whose missing pages would fault on our own registered
//! memory), fills holes with zeros (the program discarded them: that is
//! what they read as) and tries again later; a pinned or locked page keeps
//! its unit resident.

use crate::pager::evict::batch::Evicted;
use crate::pager::evict::folio::{self, FolioSlots};
use crate::pager::evict::writeback::{writeback_failed, writeback_worked, writes_held};
use crate::pager::instance::inner::Inner;
use crate::pager::instance::moves::Installed;
use crate::pager::instance::page::{Kind, PageClaim, PageWord, UNIT_BYTES, UNIT_PAGES};
use crate::swap_space::{SwapEntry, SwapError};
use crate::PAGE_SIZE;

const UNIT: u64 = UNIT_BYTES as u64;

const PAGE: u64 = PAGE_SIZE as u64;
/// Evict the unit whose first page is `head`: `Evicted::Gone` when it left
/// memory; otherwise it is still resident (`Refused`: unevictable).
pub(crate) fn evict_unit(inner: &Inner, head: u32) -> Evicted {
    let st = &inner.states()[head as usize];
    let w = st.load();
    if !w.is(Kind::Resident) || w.is_busy() || writes_held(inner) {
        return Evicted::Not;
    }
    let Some(claim) = st.try_claim(w) else {
        return Evicted::Not;
    };
    if inner.paging_stopped() {
        // Kept for good, claim and all undone (`Inner::pinned`).
        return Evicted::Not;
    }
    let addr = inner.addrs().get(head);
    let Some(mut unit) = inner.frames().unit_out.hold() else {
        return Evicted::Not;
    };
    if let Err((moved, err)) = inner.move_out(unit.addr(), addr, UNIT) {
        // Part of it (or none) moved: put that back before anything reads
        // the "out" unit, whose missing pages would fault.
        let gone = moved > 0 && inner.put_in(addr, unit.addr(), moved) == Installed::Gone;
        unit.discard();
        drop(unit);
        if gone {
            return unit_gone(inner, claim);
        }
        return match err.errno() {
            // Holes the program made (MADV_DONTNEED), which read as zeros:
            // fill them, and the unit moves whole next time.  None left
            // at all (the program discarded or unmapped the whole unit):
            // there is nothing to evict.
            Some(libc::ENOENT) => match fill_holes(inner, addr) {
                Holes::Filled => Evicted::Not,
                Holes::All => unit_gone(inner, claim),
            },
            errno => {
                drop(claim);
                inner.unevictable(addr + moved, errno);
                Evicted::Refused
            }
        };
    }
    // The unit holds the 512 pages just moved out.
    let next = write_unit(inner, head, unit.bytes());
    let Some(next) = next else {
        let gone = inner.put_in(addr, unit.addr(), UNIT) == Installed::Gone;
        unit.discard();
        drop(unit);
        if gone {
            return unit_gone(inner, claim);
        }
        return Evicted::Not;
    };
    unit.discard();
    drop(unit);
    inner.counters().huge_swapouts.inc();
    inner.counters().evictions.inc();
    inner.budget().uncharge(UNIT_PAGES);
    claim.commit(next);
    Evicted::Gone
}

/// The unit's memory went with the program's unmap or discard: nothing
/// to keep, and it reads as zeros.
fn unit_gone(inner: &Inner, claim: PageClaim<'_>) -> Evicted {
    inner.counters().discarded.inc();
    inner.budget().uncharge(UNIT_PAGES);
    claim.commit(PageWord::NEVER.unit());
    Evicted::Gone
}

enum Holes {
    /// Some pages were missing and are zeros now.
    Filled,
    /// Every page was missing, or the range is not mapped any more.
    All,
}

/// Fill the holes of the resident unit at `addr` with zeros (the program
/// discarded those pages).
fn fill_holes(inner: &Inner, addr: u64) -> Holes {
    let mut present = [0u8; UNIT_PAGES];
    // SAFETY: mincore writes one byte per page of the range into
    // `present`; it fails (ENOMEM) where the range is not mapped.
    if unsafe { libc::mincore(addr as *mut libc::c_void, UNIT_BYTES, present.as_mut_ptr()) } != 0
        || present.iter().all(|p| p & 1 == 0)
    {
        return Holes::All;
    }
    for (i, p) in present.iter().enumerate() {
        // An error leaves the hole, to be found on the next eviction;
        // EEXIST (a page appeared meanwhile) cannot happen under the
        // claim, and would be fine.
        if p & 1 == 0 && inner.copy_zero(addr + i as u64 * PAGE, false).is_ok() {
            inner.counters().discarded.inc();
        }
    }
    Holes::Filled
}

/// Write a unit moved out into `buf` to slots of its own, as one folio
/// (`folio.rs`): a whole cluster, one 2 MB IO (seed 003); when no cluster
/// is free, 512 single slots, each page's recorded in its own word (the
/// head's in the returned word, which says "split"), written one IO per
/// segment of neighbouring slots.  Returns the unit's next word; None
/// when nothing was kept: every slot taken is freed, but for one whose
/// write failed for good, which is retired (the failed segment is tried
/// again page by page to find it: a bad block costs its slot, not its
/// cluster).
fn write_unit(inner: &Inner, head: u32, buf: &[u8]) -> Option<PageWord> {
    let words = &inner.states()[head as usize..head as usize + UNIT_PAGES];
    let mut first = SwapEntry::NONE;
    let taken = folio::alloc_slots(inner, UNIT_PAGES, |i, e| {
        if i == 0 {
            first = e;
        } else {
            words[i].store(PageWord::NEVER.with_slot(e));
        }
    });
    let split_slot = |i: usize| {
        if i == 0 {
            first
        } else {
            words[i].load().slot().expect("a split unit has a slot per page")
        }
    };
    // How many pages of a split unit have slots to undo, and which slot
    // of them is retired.
    let (taken, bad) = match taken {
        Ok(FolioSlots::Cluster(base)) => {
            let slot_of = |i: usize| SwapEntry::new(base.device(), base.offset() + i as u64);
            return match folio::write_blaming(inner, slot_of, buf) {
                Ok(()) => {
                    writeback_worked(inner);
                    Some(PageWord::of(Kind::Swapped).unit().whole().with_slot(base))
                }
                Err(failed) => {
                    match unit_write_failed(inner, &failed) {
                        None => inner.free_huge(base),
                        // The cluster's other slots go back one by one.
                        Some(bad) => (0..UNIT_PAGES)
                            .map(slot_of)
                            .filter(|&e| e != bad)
                            .for_each(|e| inner.free_slot(e)),
                    }
                    None
                }
            };
        }
        Ok(FolioSlots::Each) => match folio::write_blaming(inner, split_slot, buf) {
            Ok(()) => {
                writeback_worked(inner);
                return Some(PageWord::of(Kind::Swapped).unit().with_slot(first));
            }
            Err(failed) => (UNIT_PAGES, unit_write_failed(inner, &failed)),
        },
        Err((taken, err)) => {
            if matches!(err, SwapError::Full { .. }) {
                inner.counters().swap_full.inc();
            }
            (taken, None)
        }
    };
    // Split, and not kept: free the slots taken (but a retired one) and
    // clear the words that recorded them.
    for (i, word) in words.iter().enumerate().take(taken) {
        let e = split_slot(i);
        if i > 0 {
            word.store(PageWord::NEVER);
        }
        if Some(e) != bad {
            inner.free_slot(e);
        }
    }
    None
}

/// A unit's write failed: count it; returns the slot to retire when the
/// failure is for good (the block is bad), None when it may pass (the
/// slot is fine, writeback pauses).
fn unit_write_failed(inner: &Inner, failed: &folio::IoFailed) -> Option<SwapEntry> {
    if failed.err.is_transient() {
        writeback_failed(inner, &failed.err);
        return None;
    }
    inner.counters().write_errors.inc();
    Some(failed.slot)
}
