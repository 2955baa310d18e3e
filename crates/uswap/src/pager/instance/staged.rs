//! Staged pages: evicted pages moved out of their regions into staging
//! frames, waiting, oldest first, for writeback to write them to their
//! slots.

use crate::pager::instance::page::{Kind, PageState};
use crate::swap_cache::PageHandle;
use crate::swap_space::SwapEntry;
use std::collections::VecDeque;

/// Staged pages in FIFO order, each with the slot it was staged to.  An
/// entry is live while its page is staged to that slot; it goes stale when
/// the page is touched (moved back) or its region goes away, and popping
/// skips stale entries.  The ring holds twice the staging frames; when it
/// fills with stale entries it is compacted.
pub(crate) struct StagedRing {
    /// Oldest first: (page id, raw slot).  Never grows past `cap`, which
    /// its allocation holds: pushing allocates nothing.
    ids: VecDeque<(u32, u64)>,
    cap: usize,
}

impl StagedRing {
    pub fn new(cap: usize) -> Self {
        let cap = cap.max(2);
        StagedRing {
            ids: VecDeque::with_capacity(cap),
            cap,
        }
    }

    pub fn pop(&mut self) -> Option<(u32, u64)> {
        self.ids.pop_front()
    }

    /// Pop the oldest entry and those after it that continue it as a run:
    /// the next page id on the next slot (a run staged together), as many
    /// as `out` holds.  Returns how many.
    pub fn pop_run(&mut self, out: &mut [(u32, u64)]) -> usize {
        let mut n = 0;
        while n < out.len() {
            let Some(&e) = self.ids.front() else {
                break;
            };
            if n > 0 && (e.0 != out[n - 1].0 + 1 || e.1 != out[n - 1].1 + 1) {
                break;
            }
            out[n] = e;
            n += 1;
            self.ids.pop_front();
        }
        n
    }

    /// Put staged pages on the ring, in order (their states say staged
    /// already, so each entry is live when anyone can pop it).  A full
    /// ring is compacted first: live entries never outnumber the staging
    /// frames, half the ring.
    pub fn enqueue(&mut self, states: &[PageState], pages: impl Iterator<Item = (u32, SwapEntry)>) {
        for (id, e) in pages {
            if !self.push(id, e) {
                self.ids.retain(|&(id, slot)| live(states, id, slot));
                assert!(self.push(id, e), "staged ring full of live entries");
            }
        }
    }

    fn push(&mut self, id: u32, slot: SwapEntry) -> bool {
        if self.ids.len() == self.cap {
            return false;
        }
        self.ids.push_back((id, slot.raw()));
        true
    }
}

/// Whether `(id, slot)` is a live ring entry: page `id` is staged to
/// that slot (not touched and moved back since, nor its region gone).
pub(crate) fn live(states: &[PageState], id: u32, slot: u64) -> bool {
    let w = states[id as usize].load();
    w.is(Kind::Staged) && w.slot().map(|e| e.raw()) == Some(slot)
}

/// The swap cache's handle for a page staged in frame `f`: the frame plus
/// one, as a handle is never zero.  This and [`frame`] are the encoding's
/// only two places.
#[inline]
pub(crate) fn handle(f: u32) -> PageHandle {
    PageHandle::new(f as u64 + 1).expect("frame + 1 is not zero")
}

/// The staging frame a swap cache handle names.
#[inline]
pub(crate) fn frame(h: PageHandle) -> u32 {
    (h.get() - 1) as u32
}
