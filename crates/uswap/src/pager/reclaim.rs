//! Reclaim: keep resident pages under the budget, in two steps.
//!
//! 1. Eviction of a batch of victims from the LRU's inactive tail (second
//!    chance for referenced pages), in `evict.rs`: clean pages are dropped
//!    where they are (their slot holds them, or they are zeros), one
//!    `process_madvise` for the batch; dirty pages are soft-evicted: moved
//!    out of their regions with `UFFDIO_MOVE` into staging frames,
//!    atomically, neighbours as one run.  A thread touching one from then
//!    on faults.  Each gets a slot and the swap cache maps the slot to its
//!    frame.  The page is still in memory: a touch finds it in the swap
//!    cache and moves it back without IO, and activates it through the
//!    LRU's per-CPU batches (seed 002): this is how the LRU learns, user
//!    space having no accessed bits.  (`SwapBuilder::per_page_evict`:
//!    every victim, clean ones too, moved alone, as before batching.)
//! 2. Writeback: staged pages, oldest first, are written to their slots
//!    and their frames discarded, a batch per `process_madvise`.  Only
//!    this frees the memory of a dirty page.
//!
//! A clean page that never had a slot is still all zeros: it goes straight
//! back to "never written", no slot, no IO.
//!
//! What `UFFDIO_MOVE` refuses stays where it is, as the kernel leaves such
//! pages alone: a pinned page (`EBUSY`: the pin holder, a device doing DMA
//! or an io_uring fixed buffer, writes the page itself, so a copy taken
//! for swap would go stale) and a locked or read-only one (`EINVAL`:
//! `mlock`, `mprotect`).  They are counted as unevictable, said once, and
//! put on the active list, to be tried again when they age.  A page the
//! program discarded itself (`ENOENT`: `MADV_DONTNEED`, `munmap`) has no
//! memory left to evict: it becomes "never written".
//!
//! When no slot can be had the page stays resident.  A write error that
//! says the block is bad (`EIO`) retires the slot for good and puts the
//! page back in its region; one that may pass (`ENOSPC`, `EAGAIN`, ...)
//! leaves the page staged and pauses writeback, 1 ms at first, doubling to
//! 1 s while the errors go on: a burst of them must not eat the swap
//! space.  Never lost, never zeros.  The background reclaimer keeps
//! resident pages (staged ones included) under the low watermark; a
//! faulting thread reclaims directly before it installs its page only when
//! the budget is exceeded by more than a batch (the reclaimer fell behind,
//! or there is none).
//!
//! 2 MB units (seed 003) go out whole: the unit is moved with one
//! `UFFDIO_MOVE` of 2 MB into an "out" staging unit (a PMD move when it is
//! a THP: it stays whole), written with one 2 MB IO to a whole cluster
//! from `alloc_huge`, and discarded.  When no cluster is wholly free the
//! unit is split: 512 slots, 512 IOs, each page's slot in its own word
//! (counted as a fallback).  The "out" units are registered with the
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

use std::sync::atomic::Ordering;

use super::evict::{self, enqueue, live, refused, Outcome, Stage};
use super::instance::Inner;
use super::instance::Installed;
use super::page::{self, PageClaim, UNIT_BYTES, UNIT_PAGES};
use super::report;
use crate::io::{monotonic_ns, IoError, WriteJob, WriteRing};
use crate::swap_cache::PageHandle;
use crate::swap_space::{SwapEntry, SwapError};
use crate::PAGE_SIZE;

const UNIT: u64 = UNIT_BYTES as u64;

const PAGE: u64 = PAGE_SIZE as u64;
/// Victims taken from the LRU per pass: one eviction batch.
const BATCH: usize = evict::BATCH;
/// Writeback pauses after a transient write error: from the first to the
/// longest, doubling while the errors go on.
const BACKOFF_MIN_NS: u64 = 1_000_000;
const BACKOFF_MAX_NS: u64 = 1_000_000_000;

/// How far past the budget faults may go before one reclaims itself, while
/// the background reclaimer runs: one batch.
pub(super) const SLACK: usize = BATCH;

/// Called by a faulting thread before it installs a page: reclaim when the
/// budget is exhausted by more than the slack (the background reclaimer
/// fell behind).  When nothing can be evicted the page is installed anyway
/// (the overrun is counted): a fault must always be served.
pub(super) fn make_room(inner: &Inner) {
    let b = &inner.budget;
    if b.resident.load(Ordering::Relaxed) < b.limit + b.slack {
        return;
    }
    inner.counters.direct_reclaim.inc();
    if reclaim(inner, BATCH, None) == 0 && inner.budget.resident.load(Ordering::Relaxed) >= b.limit + b.slack
    {
        inner.counters.overrun.inc();
    }
}

/// Reclaim before installing `n` pages at once (a 2 MB unit).
pub(super) fn make_room_for(inner: &Inner, n: usize) {
    if inner.budget.resident.load(Ordering::Relaxed) + n <= inner.budget.limit + inner.budget.slack {
        return;
    }
    inner.counters.direct_reclaim.inc();
    let want = inner.budget.resident.load(Ordering::Relaxed) + n - inner.budget.limit;
    if reclaim(inner, want, None) < want
        && inner.budget.resident.load(Ordering::Relaxed) + n > inner.budget.limit
    {
        inner.counters.overrun.inc();
    }
}

/// Free up to `nr` pages of memory; returns how many.
pub(super) fn reclaim(inner: &Inner, nr: usize, mut ring: Option<&mut WriteRing>) -> usize {
    let mut victims = [0u32; BATCH];
    let mut freed = [0u32; BATCH];
    let mut done = 0;
    // Bounded: victims that cannot be staged (busy, no free slot for a
    // dirty page, unevictable) go back on the LRU and would come up
    // again; a few passes are all one call may spend.
    for _ in 0..4 {
        if done >= nr {
            break;
        }
        let want = (nr - done).min(BATCH);
        let before = done;
        // Writeback first, so that the batch finds free staging frames
        // for its runs of dirty pages.
        match ring.as_deref_mut() {
            Some(ring) => write_back_queued(inner, ring, nr, &mut done),
            None => write_back_oldest(inner, nr, &mut done),
        }
        if done >= nr {
            break;
        }
        // Evict a batch of victims.
        let mut n = inner.lru.shrink_inactive_local(want * 2, &mut victims[..want]);
        if n == 0 {
            // Nothing this CPU can see: pages may wait in other CPUs'
            // batches.  Drain them all, as the kernel does when reclaim
            // struggles, and look again.
            n = inner.lru.shrink_inactive(want * 2, &mut victims[..want]);
        }
        if n == 0 {
            // Inactive list empty or all referenced: age the active list.
            inner.lru.age_active(want * 4);
        }
        let mut nfreed = 0;
        let mut small = [0u32; BATCH];
        let mut nsmall = 0;
        for &id in &victims[..n] {
            if inner.states[id as usize].load(Ordering::Acquire) & page::UNIT != 0 {
                // A 2 MB unit goes straight to its slots.
                match evict_unit(inner, id) {
                    Stage::Gone => done += UNIT_PAGES,
                    other => back_on_lru(inner, id, other),
                }
                continue;
            }
            if !inner.per_page_evict {
                small[nsmall] = id;
                nsmall += 1;
                continue;
            }
            match stage(inner, id) {
                Stage::InMemory => {}
                Stage::Gone => done += 1,
                Stage::Dropped(f) => {
                    freed[nfreed] = f;
                    nfreed += 1;
                    done += 1;
                }
                other => back_on_lru(inner, id, other),
            }
        }
        if nsmall > 0 {
            let mut out = Outcome::new();
            evict::evict(inner, &small[..nsmall], &mut out);
            done += out.gone;
            for &(id, refused) in &out.back[..out.nback] {
                back_on_lru(inner, id, if refused { Stage::Refused } else { Stage::Not });
            }
        }
        inner.discard_frames(&freed[..nfreed]);
        if n > 0 && done == before {
            // Every victim refused (unevictable, busy): refill the
            // inactive list from the active one, or the same pages come
            // back on every pass and nothing else is ever tried.
            inner.lru.age_active(want * 4);
        }
    }
    done
}

/// Write back the oldest staged pages down to half the staging frames
/// (the younger half stays in memory, where a touch costs no IO), at most
/// a batch, until `done` reaches `nr`.  A run staged together goes with one
/// write.
fn write_back_oldest(inner: &Inner, nr: usize, done: &mut usize) {
    let mut freed = [0u32; BATCH];
    let mut nfreed = 0;
    while *done < nr
        && nfreed < BATCH
        && inner.staged_count() > inner.budget.staging_target
        && !writeback_held(inner)
    {
        let mut run = [(0u32, 0u64); BATCH];
        let got = inner.backing.staged.lock().pop_run(&mut run[..BATCH - nfreed]);
        if got == 0 {
            break;
        }
        let k = writeback_run(inner, &run[..got], &mut freed[nfreed..]);
        nfreed += k;
        *done += k;
    }
    inner.discard_frames(&freed[..nfreed]);
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
fn write_back_queued(inner: &Inner, ring: &mut WriteRing, nr: usize, done: &mut usize) {
    let mut freed = [0u32; QUEUE_PAGES];
    let mut nfreed = 0;
    while *done < nr
        && nfreed < QUEUE_PAGES
        && inner.staged_count() > inner.budget.staging_target
        && !writeback_held(inner)
    {
        let mut runs = [[(0u32, 0u64); BATCH]; QUEUE_RUNS];
        let mut lens = [0usize; QUEUE_RUNS];
        let mut nruns = 0;
        let mut pages = 0;
        {
            let mut ring = inner.backing.staged.lock();
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
        // One write per claimed segment, in flight together.
        let mut jobs: [Option<WriteJob<'_>>; QUEUE_RUNS] = [const { None }; QUEUE_RUNS];
        let mut of_job = [0usize; QUEUE_RUNS];
        let mut nq = 0;
        for (q, seg) in segs[..nruns].iter().enumerate() {
            if seg.n == 0 {
                continue;
            }
            jobs[nq] = Some(WriteJob {
                device: &inner.backing.devices[seg.e0.device() as usize],
                offset: seg.e0.offset(),
                // SAFETY: we hold the claims of the pages these frames hold.
                buf: unsafe { inner.frames.staging.run_bytes(seg.f0, seg.n) },
            });
            of_job[nq] = q;
            nq += 1;
        }
        let mut ok = [false; QUEUE_RUNS];
        ring.write_batch(&jobs[..nq], &mut ok[..nq]);
        let mut written = [false; QUEUE_RUNS];
        for k in 0..nq {
            written[of_job[k]] = ok[k];
        }
        for q in 0..nruns {
            let seg = std::mem::replace(&mut segs[q], Segment::empty());
            let from = if written[q] {
                let n = seg.n;
                if n > 0 {
                    writeback_worked(inner);
                }
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

/// A victim that did not leave memory goes back on the LRU, if it is
/// still resident: an unevictable one on the active list, to come back
/// to the inactive list (and be tried again) only as it ages.
fn back_on_lru(inner: &Inner, id: u32, how: Stage) {
    if page::kind(inner.states[id as usize].load(Ordering::Acquire)) != page::RESIDENT {
        return;
    }
    inner.lru.add(id);
    if matches!(how, Stage::Refused) {
        inner.lru.activate(id);
    }
}

/// Soft-evict page `id` into a staging frame.
fn stage(inner: &Inner, id: u32) -> Stage {
    let st = &inner.states[id as usize];
    let w = st.load(Ordering::Acquire);
    if page::kind(w) != page::RESIDENT || w & page::BUSY != 0 {
        return Stage::Not;
    }
    let dirty = w & page::DIRTY != 0;
    if dirty && page::slot(w).is_none() && inner.backing.space.nr_free() == 0 {
        // Nowhere to write it: do not move it out just to move it back.
        inner.counters.swap_full.inc();
        return Stage::Not;
    }
    let Some(claim) = PageClaim::try_claim(st, w) else {
        return Stage::Not;
    };
    let Some(f) = frame(inner) else {
        return Stage::Not;
    };
    let addr = inner.addrs[id as usize].load(Ordering::Relaxed);
    let frame_addr = inner.frames.staging.addr(f);
    // A clean page that never had a slot holds zeros still: drop it.
    if !dirty && page::slot(w).is_none() {
        inner.counters.evict_moves.inc();
        if let Err((_, err)) = inner.move_out(frame_addr, addr, PAGE) {
            inner.frames.staging.put(f);
            return refused(inner, claim, addr, err);
        }
        inner.counters.evict_clean.inc();
        inner.counters.evictions.inc();
        inner.budget.resident.fetch_sub(1, Ordering::Relaxed);
        claim.commit(page::NEVER);
        return Stage::Dropped(f);
    }
    // The slot it will be written to (a clean page keeps its own).
    let (e, new_slot) = match page::slot(w) {
        Some(e) if !dirty => (e, false),
        _ => match inner.backing.space.alloc() {
            Ok(e) => (e, true),
            Err(err) => {
                if matches!(err, SwapError::Full { .. }) {
                    inner.counters.swap_full.inc();
                }
                inner.frames.staging.put(f);
                return Stage::Not;
            }
        },
    };
    let handle = PageHandle::new(f as u64 + 1).expect("frame + 1 is not zero");
    if inner.backing.swap_cache.add(e, handle).is_err() {
        // The slot is ours alone (fresh, or this clean page's): it cannot
        // be cached already.  Nothing changed; give up on this one.
        debug_assert!(false, "slot {e:?} already in the swap cache");
        if new_slot {
            inner.free_slot(e);
        }
        inner.frames.staging.put(f);
        return Stage::Not;
    }
    inner.counters.evict_moves.inc();
    if let Err((_, err)) = inner.move_out(frame_addr, addr, PAGE) {
        inner.backing.swap_cache.delete(e);
        if new_slot {
            inner.free_slot(e);
        }
        inner.frames.staging.put(f);
        return refused(inner, claim, addr, err);
    }
    // A dirty page's old slot (if any) is stale: it has the new one.
    if new_slot {
        if let Some(o) = page::slot(w) {
            inner.free_slot(o);
        }
    }
    inner.counters.staged.inc();
    inner.budget.staged.fetch_add(1, Ordering::Relaxed);
    claim.commit(page::with_slot(page::STAGED | (w & page::DIRTY), e));
    enqueue(inner, id, e);
    Stage::InMemory
}

/// A free staging frame, writing back the oldest staged page if none is.
fn frame(inner: &Inner) -> Option<u32> {
    if let Some(f) = inner.frames.staging.get() {
        return Some(f);
    }
    for _ in 0..8 {
        if writeback_held(inner) {
            return None;
        }
        let (id, slot) = inner.backing.staged.lock().pop()?;
        if let Some(f) = writeback(inner, id, slot) {
            inner.frames.staging.discard_batch(&[f]);
            return Some(f);
        }
    }
    None
}

/// Whether writeback is paused after transient write errors.
fn writeback_held(inner: &Inner) -> bool {
    let until = inner.backing.writeback.hold_until.load(Ordering::Relaxed);
    until != 0 && monotonic_ns() < until
}

/// A write failed with an error that may pass: pause writeback, longer
/// each time while it goes on.
pub(super) fn writeback_failed(inner: &Inner, err: &IoError) {
    inner.counters.swapout_retries.inc();
    let b = &inner.backing.writeback;
    let prev = b.backoff_ns.load(Ordering::Relaxed);
    let next = (prev * 2).clamp(BACKOFF_MIN_NS, BACKOFF_MAX_NS);
    b.backoff_ns.store(next, Ordering::Relaxed);
    b.hold_until.store(monotonic_ns() + next, Ordering::Relaxed);
    if prev == 0 {
        report::line(format_args!(
            "uswap: swap writes fail for now (errno {}); writeback pauses (1 ms, doubling to 1 s while it goes on) and the pages wait in memory",
            err.errno().unwrap_or(0)
        ));
    }
}

/// A write worked: writeback goes at full speed again.
pub(super) fn writeback_worked(inner: &Inner) {
    let b = &inner.backing.writeback;
    if b.backoff_ns.load(Ordering::Relaxed) != 0 {
        b.backoff_ns.store(0, Ordering::Relaxed);
        b.hold_until.store(0, Ordering::Relaxed);
    }
}

/// Whether unit eviction, which writes at once, must wait.
pub(super) fn writes_held(inner: &Inner) -> bool {
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
struct Segment<'a> {
    claims: [Option<PageClaim<'a>>; BATCH],
    /// The first page's frame and slot.
    f0: u32,
    e0: SwapEntry,
    n: usize,
}

impl Segment<'_> {
    fn empty() -> Self {
        Segment {
            claims: [const { None }; BATCH],
            f0: 0,
            e0: SwapEntry::NONE,
            n: 0,
        }
    }
}

fn claim_segment<'a>(inner: &'a Inner, run: &[(u32, u64)]) -> Segment<'a> {
    let mut seg = Segment::empty();
    let pool = &inner.frames.staging;
    for (j, &(id, slot)) in run.iter().enumerate() {
        let st = &inner.states[id as usize];
        let w = st.load(Ordering::Acquire);
        if w & page::BUSY != 0 || w & page::DIRTY == 0 || !live(inner, id, slot) {
            break;
        }
        let Some(claim) = PageClaim::try_claim(st, w) else {
            break;
        };
        let e = page::slot(w).expect("a staged page has a slot");
        let f = inner.staged_frame(e);
        if j == 0 {
            (seg.f0, seg.e0) = (f, e);
        } else if f != seg.f0 + j as u32 {
            break;
        }
        // SAFETY: the staged page's frame is ours while we hold its claim.
        if is_zero(unsafe { pool.bytes(f) }) {
            break;
        }
        seg.claims[j] = Some(claim);
        seg.n += 1;
    }
    seg
}

/// A segment's write worked: its pages are swapped out; their frames go
/// to `freed`.
fn commit_segment(inner: &Inner, mut seg: Segment<'_>, freed: &mut [u32]) {
    for (j, claim) in seg.claims[..seg.n].iter_mut().enumerate() {
        let claim = claim.take().expect("claimed");
        let e = page::slot(claim.found()).expect("a staged page has a slot");
        inner.backing.swap_cache.delete(e);
        inner.budget.staged.fetch_sub(1, Ordering::Relaxed);
        inner.counters.evict_write.inc();
        inner.counters.evictions.inc();
        inner.budget.resident.fetch_sub(1, Ordering::Relaxed);
        claim.commit(page::with_slot(page::SWAPPED, e));
        freed[j] = seg.f0 + j as u32;
    }
}

/// Write the segment at the start of `run` with one IO.  None, with
/// nothing changed, when it is fewer than two pages or the write fails.
fn write_segment(inner: &Inner, run: &[(u32, u64)], freed: &mut [u32]) -> Option<usize> {
    let seg = claim_segment(inner, run);
    let n = seg.n;
    if n < 2 {
        return None;
    }
    // SAFETY: we hold the claims of the pages these frames hold.
    let buf = unsafe { inner.frames.staging.run_bytes(seg.f0, n) };
    if inner.backing.devices[seg.e0.device() as usize]
        .write(seg.e0.offset(), buf)
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
fn writeback(inner: &Inner, id: u32, slot: u64) -> Option<u32> {
    let st = &inner.states[id as usize];
    let w = st.load(Ordering::Acquire);
    if w & page::BUSY != 0 || !live(inner, id, slot) {
        return None;
    }
    let claim = PageClaim::try_claim(st, w)?;
    let e = page::slot(w).expect("a staged page has a slot");
    let f = inner.staged_frame(e);
    if w & page::DIRTY != 0 {
        // SAFETY: the staged page's frame is ours while we hold its claim.
        let buf = unsafe { inner.frames.staging.bytes(f) };
        if is_zero(buf) {
            // A page of zeros needs neither IO nor a slot: it goes back to
            // never-written, and its next touch zero-fills it.  Linux 6.12
            // does the same with a bit per slot (the swap zeromap); without
            // it such pages cost uswap a write and a read each.
            inner.backing.swap_cache.delete(e);
            inner.free_slot(e);
            inner.budget.staged.fetch_sub(1, Ordering::Relaxed);
            inner.counters.evict_zero.inc();
            inner.counters.evictions.inc();
            inner.budget.resident.fetch_sub(1, Ordering::Relaxed);
            claim.commit(page::NEVER);
            return Some(f);
        }
        match inner.backing.devices[e.device() as usize].write(e.offset(), buf) {
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
        inner.counters.evict_write.inc();
    } else {
        inner.counters.evict_clean.inc();
    }
    inner.backing.swap_cache.delete(e);
    inner.budget.staged.fetch_sub(1, Ordering::Relaxed);
    inner.counters.evictions.inc();
    inner.budget.resident.fetch_sub(1, Ordering::Relaxed);
    claim.commit(page::with_slot(page::SWAPPED, e));
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
    report::once(
        &inner.reports.bad_slot,
        format_args!(
            "uswap: writing swap slot {} of device {} failed (errno {}): the slot is retired, and so is every slot that fails so from now on",
            e.offset(),
            e.device(),
            err.errno().unwrap_or(0)
        ),
    );
    let addr = inner.addrs[id as usize].load(Ordering::Relaxed);
    match inner.move_in(addr, inner.frames.staging.addr(f), PAGE) {
        Ok(copied) => {
            // `e` stays allocated, never to be handed out again.
            inner.counters.write_errors.inc();
            inner.backing.swap_cache.delete(e);
            if copied {
                inner.frames.staging.discard_batch(&[f]);
            }
            inner.frames.staging.put(f);
            inner.budget.staged.fetch_sub(1, Ordering::Relaxed);
            inner.lru.add(id);
            claim.commit(page::RESIDENT | page::DIRTY);
            None
        }
        Err((_, err)) if Inner::region_gone(&err) => {
            // The program unmapped the page meanwhile: nothing to keep.
            inner.counters.write_errors.inc();
            inner.backing.swap_cache.delete(e);
            inner.budget.staged.fetch_sub(1, Ordering::Relaxed);
            inner.budget.resident.fetch_sub(1, Ordering::Relaxed);
            claim.commit(page::NEVER);
            Some(f)
        }
        Err(_) => {
            // Not retired: it is the page's key.  Written again later.
            inner.counters.swapout_retries.inc();
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
pub(super) fn drop_staged(inner: &Inner, w: u64) {
    let e = page::slot(w).expect("a staged page has a slot");
    if let Some(h) = inner.backing.swap_cache.delete(e) {
        let f = (h.get() - 1) as u32;
        inner.frames.staging.discard_batch(&[f]);
        inner.frames.staging.put(f);
    }
}

/// Evict the unit whose first page is `head`: `Stage::Gone` when it left
/// memory; otherwise it is still resident (`Refused`: unevictable).
fn evict_unit(inner: &Inner, head: u32) -> Stage {
    let st = &inner.states[head as usize];
    let w = st.load(Ordering::Acquire);
    if page::kind(w) != page::RESIDENT || w & page::BUSY != 0 || writes_held(inner) {
        return Stage::Not;
    }
    let Some(claim) = PageClaim::try_claim(st, w) else {
        return Stage::Not;
    };
    let addr = inner.addrs[head as usize].load(Ordering::Relaxed);
    let pool = &inner.frames.unit_out;
    let Some(u) = pool.get() else {
        return Stage::Not;
    };
    if let Err((moved, err)) = inner.move_out(pool.addr(u), addr, UNIT) {
        // Part of it (or none) moved: put that back before anything reads
        // the "out" unit, whose missing pages would fault.
        if moved > 0 && inner.put_in(addr, pool.addr(u), moved) == Installed::Gone {
            pool.discard(u);
            pool.put(u);
            return unit_gone(inner, claim);
        }
        pool.discard(u);
        pool.put(u);
        return match err.errno() {
            // Holes the program made (MADV_DONTNEED), which read as zeros:
            // fill them, and the unit moves whole next time.  None left
            // at all (the program discarded or unmapped the whole unit):
            // there is nothing to evict.
            Some(libc::ENOENT) => match fill_holes(inner, addr) {
                Holes::Filled => Stage::Not,
                Holes::All => unit_gone(inner, claim),
            },
            errno => {
                drop(claim);
                inner.unevictable(addr + moved, errno);
                Stage::Refused
            }
        };
    }
    // SAFETY: we hold unit `u`, which holds the 512 pages just moved out.
    let buf = unsafe { pool.bytes(u) };
    let next = match inner.backing.space.alloc_huge() {
        Ok(base) => match inner.backing.devices[base.device() as usize].write(base.offset(), buf) {
            Ok(()) => {
                writeback_worked(inner);
                Some(page::with_slot(page::SWAPPED | page::UNIT | page::WHOLE, base))
            }
            Err(err) if err.is_transient() => {
                inner.free_huge(base);
                writeback_failed(inner, &err);
                None
            }
            Err(_) => {
                // The cluster is suspect: retired (never freed).
                inner.counters.write_errors.inc();
                None
            }
        },
        Err(SwapError::NoFreeCluster) => {
            // Seed 003's fallback: split into 512 slots.
            inner.counters.huge_fallbacks.inc();
            split_out(inner, head, buf)
        }
        Err(_) => {
            inner.counters.swap_full.inc();
            None
        }
    };
    let Some(next) = next else {
        let gone = inner.put_in(addr, pool.addr(u), UNIT) == Installed::Gone;
        pool.discard(u);
        pool.put(u);
        if gone {
            return unit_gone(inner, claim);
        }
        return Stage::Not;
    };
    pool.discard(u);
    pool.put(u);
    inner.counters.huge_swapouts.inc();
    inner.counters.evictions.inc();
    inner.budget.resident.fetch_sub(UNIT_PAGES, Ordering::Relaxed);
    claim.commit(next);
    Stage::Gone
}

/// The unit's memory went with the program's unmap or discard: nothing
/// to keep, and it reads as zeros.
fn unit_gone(inner: &Inner, claim: PageClaim<'_>) -> Stage {
    inner.counters.discarded.inc();
    inner.budget.resident.fetch_sub(UNIT_PAGES, Ordering::Relaxed);
    claim.commit(page::NEVER | page::UNIT);
    Stage::Gone
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
            inner.counters.discarded.inc();
        }
    }
    Holes::Filled
}

/// Write a unit's pages to 512 single slots, each recorded in its page's
/// own word (the head's slot goes in the returned word); the unit's word
/// says "split".  None (nothing kept: every slot taken is freed, or
/// retired if its write failed for good) when the swap space runs out
/// midway or a write fails.
fn split_out(inner: &Inner, head: u32, buf: &[u8]) -> Option<u64> {
    let mut first = SwapEntry::NONE;
    for i in 0..UNIT_PAGES {
        let failed = match inner.backing.space.alloc() {
            Ok(e) => match inner.backing.devices[e.device() as usize]
                .write(e.offset(), &buf[i * PAGE_SIZE..(i + 1) * PAGE_SIZE])
            {
                Ok(()) => {
                    if i == 0 {
                        first = e;
                    } else {
                        inner.states[head as usize + i]
                            .store(page::with_slot(page::NEVER, e), Ordering::Release);
                    }
                    continue;
                }
                Err(err) if err.is_transient() => {
                    inner.free_slot(e);
                    writeback_failed(inner, &err);
                    true
                }
                Err(_) => {
                    // Retired: never freed.
                    inner.counters.write_errors.inc();
                    true
                }
            },
            Err(_) => {
                inner.counters.swap_full.inc();
                true
            }
        };
        debug_assert!(failed);
        // Undo the pages done so far.
        if i > 0 {
            inner.free_slot(first);
        }
        for j in 1..i {
            let word = &inner.states[head as usize + j];
            if let Some(e) = page::slot(word.load(Ordering::Acquire)) {
                inner.free_slot(e);
            }
            word.store(page::NEVER, Ordering::Release);
        }
        return None;
    }
    Some(page::with_slot(page::SWAPPED | page::UNIT, first))
}
