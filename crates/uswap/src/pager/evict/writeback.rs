//! Writeback: staged pages to their slots, oldest first, and their
//! frames discarded, a batch per `process_madvise`.  Only this frees the
//! memory of a dirty page.
//!
//! A run staged together (neighbouring pages moved by one `UFFDIO_MOVE`
//! into neighbouring frames, on neighbouring slots) is popped from the
//! staged ring as a run and each segment of it whose frames are still
//! neighbours goes with one IO; the background reclaimer, when it owns an
//! io_uring (swap files), puts several runs in flight at once.  What does
//! not go that way (a page touched meanwhile, a page of zeros, a failed or
//! short write) goes page by page, where each page meets its own error
//! and gets its own treatment: a page of zeros goes back to "never
//! written" with no IO; a write error that says the block is bad retires
//! the slot and puts the page back in its region; one that may pass
//! leaves it staged and pauses writeback (1 ms, doubling to 1 s).

use std::sync::atomic::Ordering;

use crate::io::{IoError, WriteJob, WriteRing};
use crate::pager::evict::batch::{self as evict, enqueue, live};
use crate::pager::evict::folio;
use crate::pager::instance::inner::Inner;
use crate::pager::instance::page::{Kind, PageClaim, PageWord};
use crate::pager::instance::report;
use crate::pager::instance::staged;
use crate::swap_space::SwapEntry;
use crate::sys::monotonic_ns;
use crate::PAGE_SIZE;

const PAGE: u64 = PAGE_SIZE as u64;
const BATCH: usize = evict::BATCH;
/// Writeback pauses after a transient write error: from the first to the
/// longest, doubling while the errors go on.
const BACKOFF_MIN_NS: u64 = 1_000_000;
const BACKOFF_MAX_NS: u64 = 1_000_000_000;

/// Write back the oldest staged pages down to half the staging window
/// and those on probation (the younger pages stay in memory, where a
/// touch costs no IO: `Budget::keep`), at most a batch, until `done`
/// reaches `nr`.  A run staged together goes with one write.
pub(crate) fn write_back_oldest(inner: &Inner, nr: usize, done: &mut usize) {
    write_back_down_to(inner, inner.budget().keep(), nr, done);
}

/// `write_back_oldest` down to `keep` staged pages: 0 for a fault over
/// its limit that found nothing else to free (`reclaim.rs`'s
/// `throttle`), for which the younger half's saved IO is worth less than
/// its stall.
pub(crate) fn write_back_down_to(inner: &Inner, keep: usize, nr: usize, done: &mut usize) {
    let mut freed = [0u32; BATCH];
    let mut nfreed = 0;
    while nfreed < BATCH && more_to_write(inner, keep, nr, *done) {
        let mut run = [(0u32, 0u64); BATCH];
        // No more than asked: a fault pacing reclaim writes a page or two.
        let room = (BATCH - nfreed).min(nr - *done);
        let got = inner.backing().staged.lock().pop_run(&mut run[..room]);
        if got == 0 {
            break;
        }
        let k = writeback_run(inner, &run[..got], &mut freed[nfreed..]);
        nfreed += k;
        *done += k;
    }
    inner.retire_frames(&freed[..nfreed]);
}

/// Whether writeback goes on: reclaim still wants pages (`done` of `nr`),
/// more than `keep` pages are staged (half the staging frames, but for
/// a fault with nothing else to free), and writeback is not paused.
fn more_to_write(inner: &Inner, keep: usize, nr: usize, done: usize) -> bool {
    done < nr && inner.staged_count() > keep && !writeback_held(inner)
}

/// Runs one round of queued writeback takes, and pages: several writes in
/// flight, a few hundred KiB.
const QUEUE_RUNS: usize = 8;
const QUEUE_PAGES: usize = 4 * BATCH;

/// `write_back_oldest` for the background reclaimer, which owns an
/// io_uring: the segments of up to [`QUEUE_RUNS`] runs are written in
/// flight together (`io::WriteRing`); what is not written that way (a page
/// left out of its run's segment, a failed or short write) goes page by
/// page, synchronously, as in `write_back_oldest`.
pub(crate) fn write_back_queued(inner: &Inner, ring: &mut WriteRing, nr: usize, done: &mut usize) {
    let mut freed = [0u32; QUEUE_PAGES];
    let mut nfreed = 0;
    while nfreed < QUEUE_PAGES && more_to_write(inner, inner.budget().keep(), nr, *done) {
        let mut runs = [[(0u32, 0u64); BATCH]; QUEUE_RUNS];
        let mut lens = [0usize; QUEUE_RUNS];
        let mut nruns = 0;
        let mut pages = 0;
        {
            let mut ring = inner.backing().staged.lock();
            while nruns < QUEUE_RUNS && nfreed + pages < QUEUE_PAGES {
                let room = (QUEUE_PAGES - nfreed - pages).min(BATCH);
                let got = ring.pop_run(&mut runs[nruns][..room]);
                if got == 0 {
                    break;
                }
                lens[nruns] = got;
                pages += got;
                nruns += 1;
            }
        }
        if nruns == 0 {
            break;
        }
        let mut segs: [Segment<'_>; QUEUE_RUNS] = std::array::from_fn(|_| Segment::empty());
        for q in 0..nruns {
            segs[q] = claim_segment(inner, &runs[q][..lens[q]]);
        }
        // One write per claimed segment, in flight together (None for a
        // run with nothing claimed: not written here).
        let mut each = segs.iter_mut();
        let jobs: [Option<WriteJob<'_>>; QUEUE_RUNS] = std::array::from_fn(|_| {
            let seg = each.next().expect("one segment a job");
            (seg.len() > 0).then(|| WriteJob {
                device: &inner.backing().devices[seg.first_slot().device() as usize],
                offset: seg.first_slot().offset(),
                buf: seg.bytes(&inner.frames().staging),
            })
        });
        let mut written = [false; QUEUE_RUNS];
        ring.write_batch(&jobs[..nruns], &mut written[..nruns]);
        for q in 0..nruns {
            let seg = std::mem::replace(&mut segs[q], Segment::empty());
            let from = if written[q] {
                let n = seg.len();
                writeback_worked(inner);
                commit_segment(inner, seg, &mut freed[nfreed..]);
                nfreed += n;
                *done += n;
                n
            } else {
                // Dropped: the claims go back, nothing changed.
                drop(seg);
                0
            };
            let k = writeback_run(inner, &runs[q][from..lens[q]], &mut freed[nfreed..]);
            nfreed += k;
            *done += k;
        }
    }
    for chunk in freed[..nfreed].chunks(BATCH) {
        inner.discard_frames(chunk);
    }
}

/// Whether writeback is paused: after transient write errors, or in a
/// forked child whose swap files are still its parent's (`closed`).  The
/// pages that child inherited staged have its parent's slots, which only
/// its files of its own (`Inner::open_layers`, made by its reclaimer)
/// may take; written before, each failed, and the failure was said on
/// the program's stderr once per child of a fork pool.
pub(crate) fn writeback_held(inner: &Inner) -> bool {
    if inner.backing().closed.load(Ordering::Acquire) {
        return true;
    }
    let until = inner.backing().writeback.hold_until.load(Ordering::Relaxed);
    until != 0 && monotonic_ns() < until
}

/// Whether swap writes have been failing with errors that may pass
/// (the backoff is reset by the first write that works).
pub(crate) fn writes_failing(inner: &Inner) -> bool {
    inner.backing().writeback.backoff_ns.load(Ordering::Relaxed) != 0
}

/// A write failed with an error that may pass: pause writeback, longer
/// each time while it goes on.
pub(crate) fn writeback_failed(inner: &Inner, err: &IoError) {
    inner.counters().swapout_retries.inc();
    let b = &inner.backing().writeback;
    let prev = b.backoff_ns.load(Ordering::Relaxed);
    let next = (prev * 2).clamp(BACKOFF_MIN_NS, BACKOFF_MAX_NS);
    b.backoff_ns.store(next, Ordering::Relaxed);
    b.hold_until.store(monotonic_ns() + next, Ordering::Relaxed);
    if prev == 0 {
        inner.registry().event(
            crate::stats::EventKind::WritebackPaused,
            err.errno().unwrap_or(0) as u64,
        );
        if !b.said.swap(true, Ordering::Relaxed) {
            report::line(format_args!(
                "uswap: swap writes fail for now ({err}); writeback pauses (1 ms, doubling to 1 s while it goes on) and the pages wait in memory"
            ));
        }
    }
}

/// A write worked: writeback goes at full speed again.
pub(crate) fn writeback_worked(inner: &Inner) {
    let b = &inner.backing().writeback;
    if b.backoff_ns.load(Ordering::Relaxed) != 0 {
        b.backoff_ns.store(0, Ordering::Relaxed);
        b.hold_until.store(0, Ordering::Relaxed);
    }
}

/// Whether unit eviction, which writes at once, must wait.
pub(crate) fn writes_held(inner: &Inner) -> bool {
    writeback_held(inner)
}

/// Write back the staged pages `run` (ring entries, oldest first); their
/// frames, to be discarded and returned, go to `freed`.  Returns how many.
/// Pages staged together (neighbouring frames) go with one IO; the rest,
/// and a segment whose write fails, page by page, where each page meets
/// its own error and gets its own treatment.
fn writeback_run(inner: &Inner, run: &[(u32, u64)], freed: &mut [u32]) -> usize {
    let mut k = 0;
    let mut s = 0;
    while s < run.len() {
        if let Some(n) = write_segment(inner, &run[s..], &mut freed[k..]) {
            k += n;
            s += n;
            continue;
        }
        if let Some(f) = writeback(inner, run[s].0, run[s].1) {
            freed[k] = f;
            k += 1;
        }
        s += 1;
    }
    k
}

/// The longest segment at the start of a run (consecutive ids and slots
/// already) whose pages are still staged, dirty, not all zeros and in
/// neighbouring frames, claimed: one write can take it.
/// A segment: staged pages claimed for one write.
type Segment<'a> = staged::StagedRun<'a, BATCH>;

fn claim_segment<'a>(inner: &'a Inner, run: &[(u32, u64)]) -> Segment<'a> {
    let mut seg = Segment::empty();
    for &(id, slot) in run {
        let st = &inner.states()[id as usize];
        let w = st.load();
        if w.is_busy() || !w.is_dirty() || !live(inner, id, slot) {
            break;
        }
        let Some(claim) = st.try_claim(w) else {
            break;
        };
        // Not in the frame after the last one's: the segment ends.
        if seg.push(&inner.backing().swap_cache, claim).is_err() {
            break;
        }
        if is_zero(seg.last_bytes(&inner.frames().staging)) {
            seg.pop();
            break;
        }
    }
    seg
}

/// A segment's write worked: its pages are swapped out; their frames go
/// to `freed`.
fn commit_segment(inner: &Inner, seg: Segment<'_>, freed: &mut [u32]) {
    assert!(freed.len() >= seg.len(), "room for every frame the segment frees");
    let f0 = seg.first_frame();
    for (j, (claim, freed)) in seg.into_claims().zip(freed.iter_mut()).enumerate() {
        let e = claim.found().slot().expect("a staged page has a slot");
        inner.backing().swap_cache.delete(e);
        inner.budget().free_staged();
        inner.counters().evict_write.inc();
        inner.counters().evictions.inc();
        let shadow = claim.found().shadow();
        claim.commit(PageWord::of(Kind::Swapped).with_slot(e).with_shadow(shadow));
        *freed = f0 + j as u32;
    }
}

/// Write the segment at the start of `run` with one IO.  None, with
/// nothing changed, when it is fewer than two pages or the write fails.
fn write_segment(inner: &Inner, run: &[(u32, u64)], freed: &mut [u32]) -> Option<usize> {
    let mut seg = claim_segment(inner, run);
    let n = seg.len();
    if n < 2 {
        return None;
    }
    let e0 = seg.first_slot();
    let buf = seg.bytes(&inner.frames().staging);
    if folio::write(
        inner,
        |j| SwapEntry::new(e0.device(), e0.offset() + j as u64),
        buf,
    )
    .is_err()
    {
        return None;
    }
    writeback_worked(inner);
    commit_segment(inner, seg, freed);
    Some(n)
}

/// Write staged page `id` back to its slot; returns its frame, to be
/// discarded and returned.  None when the page is no longer staged (a touch
/// moved it back), or stays staged (its write failed for now), or its
/// write failed for good (then it is back in its region).
pub(crate) fn writeback(inner: &Inner, id: u32, slot: u64) -> Option<u32> {
    let st = &inner.states()[id as usize];
    let w = st.load();
    if w.is_busy() || !live(inner, id, slot) {
        return None;
    }
    let mut claim = st.try_claim(w)?;
    let e = w.slot().expect("a staged page has a slot");
    let (f, buf) = staged::claimed_frame(&inner.frames().staging, &inner.backing().swap_cache, &mut claim);
    if w.is_dirty() {
        if is_zero(buf) {
            // A page of zeros needs neither IO nor a slot: it goes back to
            // never-written, and its next touch zero-fills it.  Linux 6.12
            // does the same with a bit per slot (the swap zeromap); without
            // it such pages cost uswap a write and a read each.
            inner.backing().swap_cache.delete(e);
            inner.free_slot(e);
            inner.budget().free_staged();
            inner.counters().evict_zero.inc();
            inner.counters().evictions.inc();
            claim.commit(PageWord::NEVER);
            return Some(f);
        }
        match folio::write(inner, |_| e, buf).map_err(|failed| failed.err) {
            Ok(()) => writeback_worked(inner),
            Err(err) if err.is_transient() => {
                // It stays staged, on its slot, to be written after a
                // pause; the slot is fine.
                writeback_failed(inner, &err);
                drop(claim);
                enqueue(inner, id, e);
                return None;
            }
            Err(err) => return write_failed(inner, claim, id, e, f, &err),
        }
        inner.counters().evict_write.inc();
    } else {
        inner.counters().evict_clean.inc();
    }
    inner.backing().swap_cache.delete(e);
    inner.budget().free_staged();
    inner.counters().evictions.inc();
    let shadow = claim.found().shadow();
    claim.commit(PageWord::of(Kind::Swapped).with_slot(e).with_shadow(shadow));
    Some(f)
}

/// Writing staged page `id` to slot `e` failed for good (the block is
/// bad): the slot is retired (kept allocated, never handed out again) and
/// the page goes back into its region, resident and dirty.  If it cannot
/// go back now, it stays staged on `e` (not retired after all: it is the
/// page's key) and is tried again later.
fn write_failed(
    inner: &Inner,
    claim: PageClaim<'_>,
    id: u32,
    e: SwapEntry,
    f: u32,
    err: &IoError,
) -> Option<u32> {
    inner
        .registry()
        .event(crate::stats::EventKind::SlotRetired, e.offset());
    report::once(
        &inner.reports().bad_slot,
        format_args!(
            "uswap: writing swap slot {} of device {} failed ({err}): the slot is retired, and so is every slot that fails so from now on",
            e.offset(),
            e.device(),
        ),
    );
    let addr = inner.addrs().get(id);
    match inner.move_in(addr, inner.frames().staging.addr(f), PAGE) {
        Ok(copied) => {
            // `e` stays allocated, never to be handed out again.
            inner.counters().write_errors.inc();
            inner.backing().swap_cache.delete(e);
            if copied {
                inner.frames().staging.discard_batch(&[f]);
            }
            inner.frames().staging.put(f);
            inner.budget().unstage();
            inner.lru().add(id);
            claim.commit(PageWord::of(Kind::Resident).dirty());
            None
        }
        Err((_, err)) if Inner::region_gone(&err) => {
            // The program unmapped the page meanwhile: nothing to keep.
            inner.counters().write_errors.inc();
            inner.backing().swap_cache.delete(e);
            inner.budget().free_staged();
            claim.commit(PageWord::NEVER);
            Some(f)
        }
        Err(_) => {
            // Not retired: it is the page's key.  Written again later.
            inner.counters().swapout_retries.inc();
            drop(claim);
            enqueue(inner, id, e);
            None
        }
    }
}

/// Whether a page holds only zeros.  Word by word: a page with data stops
/// at its first non-zero word, so the check costs next to nothing there.
fn is_zero(page: &[u8]) -> bool {
    page.chunks_exact(8)
        .all(|w| u64::from_ne_bytes(w.try_into().expect("8 bytes")) == 0)
}

/// Drop a staged page whose region is going away: its frame and its swap
/// cache entry.  (Its slot is freed by the caller.)
pub(crate) fn drop_staged(inner: &Inner, w: PageWord) {
    let e = w.slot().expect("a staged page has a slot");
    if let Some(h) = inner.backing().swap_cache.delete(e) {
        inner.discard_frames(&[staged::frame(h)]);
    }
}
