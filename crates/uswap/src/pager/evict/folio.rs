//! The pager's unit of work, the folio: a run of 1 to 512 neighbouring
//! pages of one region that goes in or out as one, and reaches the swap
//! devices here, with one IO for each stretch of it whose slots are
//! neighbours (the kernel's folio, and its swap IO).
//!
//! Folios come in three kinds:
//!
//! - a page alone: a fault's own page, a victim with no neighbour;
//! - a run of small pages gathered for one step: neighbours evicted with
//!   one `UFFDIO_MOVE` (batch.rs), written back together (writeback.rs),
//!   read ahead and installed with one `UFFDIO_COPY` (fault/serve.rs).  Each page
//!   keeps its own state word and claim, so a thread writing one page of a
//!   run waits for that page alone, and a run is cut short at any page
//!   (a move that stops, a page touched meanwhile) with the rest kept;
//! - a 2 MB unit (seed 003): one word and one claim for its 512 pages,
//!   because they are mapped as one (a transparent huge page moves as one
//!   PMD) and so can only come and go together.
//!
//! Whatever the kind, [`read`] and [`write`] take its slots page by page
//! and do one IO per segment, the longest stretch of pages whose slots are
//! neighbours on one device: a run staged onto fresh slots of one cluster,
//! a unit on a whole cluster (one 2 MB IO), a unit split over single slots
//! when no cluster was free (seed 003's fallback: one IO per break in its
//! slots, where each of its 512 pages once had its own), pages read ahead
//! from wherever they were written.  [`alloc_slots`] gives a folio its
//! slots: a whole cluster for a unit where seed 003 can, else slot by slot
//! from the per-CPU slot cache, which hands out neighbours from one
//! cluster (seed 000), so that the slots of a run are mostly one segment.
//!
//! Nothing here allocates memory: segments are found by walking the slots,
//! so a unit's 512 need no list (this runs in the SIGBUS handler, whose
//! stack may be a small alternate one).

use crate::io::IoError;
use crate::pager::instance::inner::Inner;
use crate::swap_space::{SwapEntry, SwapError};
use crate::PAGE_SIZE;

/// A folio's IO failed at `slot`, the page `done` pages in: the pages
/// before it went through, that one did not.
#[derive(Debug)]
pub(crate) struct IoFailed {
    pub done: usize,
    pub slot: SwapEntry,
    pub err: IoError,
}

/// Whether slot `b` follows slot `a` on the same device.
#[inline]
fn follows(a: SwapEntry, b: SwapEntry) -> bool {
    a.device() == b.device() && b.offset() == a.offset() + 1
}

/// The segments of `pages` pages whose slots are `slot(0..pages)`: calls
/// `io(first page, pages, first slot)` for each, in order, until one
/// fails.
pub(crate) fn segments(
    pages: usize,
    slot: impl Fn(usize) -> SwapEntry,
    mut io: impl FnMut(usize, usize, SwapEntry) -> Result<(), IoFailed>,
) -> Result<(), IoFailed> {
    let mut start = 0;
    while start < pages {
        let first = slot(start);
        let mut end = start + 1;
        let mut last = first;
        while end < pages {
            let next = slot(end);
            if !follows(last, next) {
                break;
            }
            last = next;
            end += 1;
        }
        io(start, end - start, first)?;
        start = end;
    }
    Ok(())
}

/// Read `buf.len() / 4096` pages, page `i` from `slot(i)`, one IO per
/// segment.  On failure the failing segment is not read (`done` and
/// `slot`: its first page and slot); the pages before it are.
pub(crate) fn read(inner: &Inner, slot: impl Fn(usize) -> SwapEntry, buf: &mut [u8]) -> Result<(), IoFailed> {
    let pages = buf.len() / PAGE_SIZE;
    segments(pages, slot, |i, n, e| {
        inner.backing().devices[e.device() as usize]
            .read(e.offset(), &mut buf[i * PAGE_SIZE..(i + n) * PAGE_SIZE])
            .map_err(|err| IoFailed {
                done: i,
                slot: e,
                err,
            })
    })
}

/// Write `buf.len() / 4096` pages, page `i` to `slot(i)`, one IO per
/// segment; stops at the first segment whose write fails (`done` and
/// `slot`: its first page and slot), which the caller then takes page by
/// page, where each page meets its own error (writeback.rs).
pub(crate) fn write(inner: &Inner, slot: impl Fn(usize) -> SwapEntry, buf: &[u8]) -> Result<(), IoFailed> {
    write_segments(inner, slot, buf, false)
}

/// As [`write`], for a folio whose pages share one fate (a 2 MB unit
/// stays or goes whole): a segment whose write fails is tried again page
/// by page, and the error, if it stays, names the one page whose slot
/// failed (a bad block among good ones), where [`write`]'s names its
/// segment's first.
pub(crate) fn write_blaming(
    inner: &Inner,
    slot: impl Fn(usize) -> SwapEntry,
    buf: &[u8],
) -> Result<(), IoFailed> {
    write_segments(inner, slot, buf, true)
}

fn write_segments(
    inner: &Inner,
    slot: impl Fn(usize) -> SwapEntry,
    buf: &[u8],
    blame: bool,
) -> Result<(), IoFailed> {
    let pages = buf.len() / PAGE_SIZE;
    let range = |j: usize, n: usize| &buf[j * PAGE_SIZE..(j + n) * PAGE_SIZE];
    segments(pages, &slot, |i, n, e| {
        let dev = &inner.backing().devices[e.device() as usize];
        match dev.write(e.offset(), range(i, n)) {
            Ok(()) => Ok(()),
            Err(_) if blame && n > 1 => (i..i + n).try_for_each(|j| {
                let e = slot(j);
                dev.write(e.offset(), range(j, 1)).map_err(|err| IoFailed {
                    done: j,
                    slot: e,
                    err,
                })
            }),
            Err(err) => Err(IoFailed {
                done: i,
                slot: e,
                err,
            }),
        }
    })
}

/// The slots [`alloc_slots`] gave a folio.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FolioSlots {
    /// A whole cluster (seed 003): page `i` on `base + i`, freed as one.
    Cluster(SwapEntry),
    /// One slot per page, each handed to the caller as it was taken.
    Each,
}

/// Slots for a folio of `pages` pages: for a 2 MB unit a whole cluster,
/// where seed 003 is on and a cluster is free (counted as a fallback
/// when not); else one slot per page, `slot_taken(i, e)` told of each in
/// order.  When the space runs out part way, `Err` says how many were
/// taken (the caller frees them) and why.
pub(crate) fn alloc_slots(
    inner: &Inner,
    pages: usize,
    mut slot_taken: impl FnMut(usize, SwapEntry),
) -> Result<FolioSlots, (usize, SwapError)> {
    if pages == crate::pager::instance::page::UNIT_PAGES {
        match inner.alloc_unit_slots() {
            Ok(base) => return Ok(FolioSlots::Cluster(base)),
            Err(SwapError::NoFreeCluster) => inner.counters().huge_fallbacks.inc(),
            Err(err) => return Err((0, err)),
        }
    }
    for i in 0..pages {
        match inner.alloc_slot() {
            Ok(e) => slot_taken(i, e),
            Err(err) => return Err((i, err)),
        }
    }
    Ok(FolioSlots::Each)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(slots: &[SwapEntry]) -> Vec<(usize, usize, SwapEntry)> {
        let mut out = Vec::new();
        segments(
            slots.len(),
            |i| slots[i],
            |i, n, e| {
                out.push((i, n, e));
                Ok(())
            },
        )
        .unwrap();
        out
    }

    #[test]
    fn segments_break_where_slots_stop_being_neighbours() {
        let e = SwapEntry::new;
        assert_eq!(collect(&[e(0, 7)]), vec![(0, 1, e(0, 7))]);
        // A whole cluster: one segment.
        let cluster: Vec<_> = (0..512).map(|i| e(1, 1024 + i)).collect();
        assert_eq!(collect(&cluster), vec![(0, 512, e(1, 1024))]);
        // Breaks: a gap, a step back, another device at the same offset.
        let slots = [e(0, 4), e(0, 5), e(0, 7), e(0, 6), e(1, 7), e(1, 8), e(0, 9)];
        assert_eq!(
            collect(&slots),
            vec![
                (0, 2, e(0, 4)),
                (2, 1, e(0, 7)),
                (3, 1, e(0, 6)),
                (4, 2, e(1, 7)),
                (6, 1, e(0, 9)),
            ]
        );
    }

    proptest::proptest! {
        /// Segments cover the pages in order, once each, and within a
        /// segment every slot follows the one before; between segments
        /// none does (they are as long as they can be).
        #[test]
        fn segments_are_maximal_and_cover_every_page(
            raw in proptest::collection::vec((0u16..3, 0u64..24), 1..80)
        ) {
            let slots: Vec<_> = raw.iter().map(|&(d, o)| SwapEntry::new(d, o)).collect();
            let segs = collect(&slots);
            let mut next = 0;
            for &(i, n, first) in &segs {
                proptest::prop_assert_eq!(i, next);
                proptest::prop_assert!(n >= 1);
                proptest::prop_assert_eq!(first, slots[i]);
                for j in i + 1..i + n {
                    proptest::prop_assert!(follows(slots[j - 1], slots[j]));
                }
                if i + n < slots.len() {
                    proptest::prop_assert!(!follows(slots[i + n - 1], slots[i + n]));
                }
                next = i + n;
            }
            proptest::prop_assert_eq!(next, slots.len());
        }
    }
}
