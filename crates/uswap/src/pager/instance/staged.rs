//! Staged pages: evicted pages moved out of their regions into staging
//! frames, waiting, oldest first, for writeback to write them to their
//! slots.  Here: the ring that keeps their order, the swap cache's
//! encoding of their frames, and the one way to their bytes.
//!
//! A staged page's frame is read and written only by whoever holds the
//! page's claim: eviction fills it holding the claim, and a touch,
//! writeback and a region's unmap each claim the page before they read
//! the frame or free it.  So the frame's bytes are handed out against the
//! claim ([`claimed_frame`], [`StagedRun`]) and borrow it: while they
//! live, the claim can be neither committed nor dropped, and no one else
//! can reach the frame.

use crate::pager::instance::frames::FramePool;
use crate::pager::instance::page::{Kind, PageClaim, PageState};
use crate::swap_cache::{PageHandle, SwapCache};
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

/// The frame of the staged page whose claim is `claim`: its index and its
/// bytes, which borrow the claim (see the head of this file).
pub(crate) fn claimed_frame<'c>(
    staging: &'c FramePool,
    cache: &SwapCache,
    claim: &'c mut PageClaim<'_>,
) -> (u32, &'c mut [u8]) {
    let f = frame_of(cache, claim);
    // SAFETY: the frame is the claimed staged page's, so its claim holder
    // alone reaches it, and the slice borrows that claim mutably.
    (f, unsafe { staging.bytes(f) })
}

/// The frame a claimed staged page sits in.
fn frame_of(cache: &SwapCache, claim: &PageClaim<'_>) -> u32 {
    let w = claim.found();
    assert!(
        w.is(Kind::Staged),
        "the frame of a page not staged ({:?})",
        w.kind()
    );
    let e = w.slot().expect("a staged page has a slot");
    frame(cache.lookup(e).expect("a staged page is in the swap cache"))
}

/// Up to `N` staged pages in neighbouring frames on neighbouring slots,
/// claimed together so that one write takes them all: the run holds each
/// page's claim, so their frames' bytes are its own, as one buffer.
/// Dropping the run drops the claims left in it: those pages are what
/// they were.
pub(crate) struct StagedRun<'a, const N: usize> {
    claims: [Option<PageClaim<'a>>; N],
    /// The first page's frame and slot.
    f0: u32,
    e0: SwapEntry,
    n: usize,
}

impl<'a, const N: usize> StagedRun<'a, N> {
    pub fn empty() -> Self {
        StagedRun {
            claims: [const { None }; N],
            f0: 0,
            e0: SwapEntry::NONE,
            n: 0,
        }
    }

    /// Add the next page, claimed and staged: given back unless its frame
    /// follows the last one's and its slot the last one's slot.
    pub fn push(&mut self, cache: &SwapCache, claim: PageClaim<'a>) -> Result<(), PageClaim<'a>> {
        if self.n == N {
            return Err(claim);
        }
        let f = frame_of(cache, &claim);
        let e = claim.found().slot().expect("a staged page has a slot");
        if self.n == 0 {
            (self.f0, self.e0) = (f, e);
        } else if f != self.f0 + self.n as u32
            || e.device() != self.e0.device()
            || e.offset() != self.e0.offset() + self.n as u64
        {
            return Err(claim);
        }
        self.claims[self.n] = Some(claim);
        self.n += 1;
        Ok(())
    }

    /// Give back the last page's claim (its page is what it was).
    pub fn pop(&mut self) {
        if self.n > 0 {
            self.n -= 1;
            self.claims[self.n] = None;
        }
    }

    pub fn len(&self) -> usize {
        self.n
    }

    /// The first page's slot: the run's slots follow it.
    pub fn first_slot(&self) -> SwapEntry {
        self.e0
    }

    /// The first page's frame: the run's frames follow it.
    pub fn first_frame(&self) -> u32 {
        self.f0
    }

    /// The last page's frame, as bytes.
    pub fn last_bytes<'s>(&'s mut self, staging: &'s FramePool) -> &'s mut [u8] {
        assert!(self.n > 0, "the last page of an empty run");
        // SAFETY: the run holds the claim of the staged page in this frame
        // (`push` checked), and `&mut self` makes this slice the only one.
        unsafe { staging.bytes(self.f0 + self.n as u32 - 1) }
    }

    /// The run's frames, as one buffer.
    pub fn bytes<'s>(&'s mut self, staging: &'s FramePool) -> &'s mut [u8] {
        // SAFETY: the run holds the claims of the staged pages in frames
        // `f0..f0 + n` (`push` checked each), and `&mut self` makes this
        // slice the only one.
        unsafe { staging.run_bytes(self.f0, self.n) }
    }

    /// The run's claims, in order, to commit them: the run is gone, and
    /// with it every view of its frames.
    pub fn into_claims(mut self) -> impl Iterator<Item = PageClaim<'a>> {
        let n = self.n;
        let claims = std::mem::replace(&mut self.claims, [const { None }; N]);
        claims.into_iter().take(n).map(|c| c.expect("claimed"))
    }
}
