//! Reclaim: keep resident pages under the budget, in two steps.
//!
//! 1. Soft eviction: victims from the LRU's inactive tail (second chance
//!    for referenced pages) are moved out of their regions with
//!    `UFFDIO_MOVE` into staging frames, atomically: a thread touching one
//!    from then on faults.  Each gets a slot and the swap cache maps the
//!    slot to its frame.  The page is still in memory: a touch finds it in
//!    the swap cache and moves it back without IO, and activates it
//!    through the LRU's per-CPU batches (seed 002): this is how the LRU
//!    learns, user space having no accessed bits.
//! 2. Writeback: staged pages, oldest first, are written to their slots
//!    (a clean page's slot already holds it: no IO) and their frames
//!    discarded, a batch per `process_madvise`.  Only this frees memory.
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
//! faulting thread that finds the budget exhausted reclaims directly
//! before it installs its page.

use std::sync::atomic::Ordering;
use std::sync::Weak;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::page::{self, PageClaim};
use super::{fault, report, signals, Inner};
use crate::io::{monotonic_ns, IoError};
use crate::swap_cache::PageHandle;
use crate::swap_space::{SwapEntry, SwapError};
use crate::uffd::UffdError;
use crate::PAGE_SIZE;

const PAGE: u64 = PAGE_SIZE as u64;
/// Victims taken from the LRU per pass.
const BATCH: usize = 32;
/// Writeback pauses after a transient write error: from the first to the
/// longest, doubling while the errors go on.
const BACKOFF_MIN_NS: u64 = 1_000_000;
const BACKOFF_MAX_NS: u64 = 1_000_000_000;

/// Staged pages in FIFO order, each with the slot it was staged to.  An
/// entry is live while its page is staged to that slot; it goes stale when
/// the page is touched (moved back) or its region goes away, and popping
/// skips stale entries.  The ring holds twice the staging frames; when it
/// fills with stale entries it is compacted.
pub(super) struct StagedRing {
    ids: Box<[(u32, u64)]>,
    head: usize,
    len: usize,
}

impl StagedRing {
    pub fn new(cap: usize) -> Self {
        StagedRing {
            ids: vec![(0, 0); cap.max(2)].into_boxed_slice(),
            head: 0,
            len: 0,
        }
    }

    fn push(&mut self, id: u32, slot: SwapEntry) -> bool {
        if self.len == self.ids.len() {
            return false;
        }
        let i = (self.head + self.len) % self.ids.len();
        self.ids[i] = (id, slot.raw());
        self.len += 1;
        true
    }

    fn pop(&mut self) -> Option<(u32, u64)> {
        if self.len == 0 {
            return None;
        }
        let e = self.ids[self.head];
        self.head = (self.head + 1) % self.ids.len();
        self.len -= 1;
        Some(e)
    }

    /// Keep only the entries `live` accepts, in order.
    fn compact(&mut self, live: impl Fn(u32, u64) -> bool) {
        let n = self.len;
        let mut kept = 0;
        for k in 0..n {
            let e = self.ids[(self.head + k) % self.ids.len()];
            if live(e.0, e.1) {
                self.ids[(self.head + kept) % self.ids.len()] = e;
                kept += 1;
            }
        }
        self.len = kept;
    }
}

/// Whether `(id, slot)` is a live ring entry: the page is staged to that slot.
fn live(inner: &Inner, id: u32, slot: u64) -> bool {
    let w = inner.states[id as usize].load(Ordering::Acquire);
    page::kind(w) == page::STAGED && page::slot(w).map(|e| e.raw()) == Some(slot)
}

/// Put a staged page on the ring (its state says staged already, so the
/// entry is live when anyone can pop it).
fn enqueue(inner: &Inner, id: u32, e: SwapEntry) {
    let mut ring = inner.staged.lock();
    if !ring.push(id, e) {
        ring.compact(|i, s| live(inner, i, s));
        // Live entries never outnumber the staging frames, half the ring.
        assert!(ring.push(id, e), "staged ring full of live entries");
    }
}

/// Called by a faulting thread before it installs a page: reclaim when the
/// budget is exhausted.  When nothing can be evicted the page is installed
/// anyway (the overrun is counted): a fault must always be served.
pub(super) fn make_room(inner: &Inner) {
    if inner.resident.load(Ordering::Relaxed) < inner.budget {
        return;
    }
    inner.counters.direct_reclaim.inc();
    if reclaim(inner, BATCH) == 0 && inner.resident.load(Ordering::Relaxed) >= inner.budget {
        inner.counters.overrun.inc();
    }
}

/// Reclaim before installing `n` pages at once (a 2 MB unit).
pub(super) fn make_room_for(inner: &Inner, n: usize) {
    if inner.resident.load(Ordering::Relaxed) + n <= inner.budget {
        return;
    }
    inner.counters.direct_reclaim.inc();
    let want = inner.resident.load(Ordering::Relaxed) + n - inner.budget;
    if reclaim(inner, want) < want && inner.resident.load(Ordering::Relaxed) + n > inner.budget {
        inner.counters.overrun.inc();
    }
}

/// Free up to `nr` pages of memory; returns how many.
pub(super) fn reclaim(inner: &Inner, nr: usize) -> usize {
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
        // Soft-evict a batch of victims.
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
        for &id in &victims[..n] {
            if inner.states[id as usize].load(Ordering::Acquire) & page::UNIT != 0 {
                // A 2 MB unit goes straight to its slots.
                match super::unit::evict(inner, id) {
                    Stage::Gone => done += super::unit::UNIT_PAGES,
                    other => back_on_lru(inner, id, other),
                }
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
        inner.discard_frames(&freed[..nfreed]);
        // Write back the oldest staged pages down to half the frames: the
        // younger half stays in memory, where a touch costs no IO.
        nfreed = 0;
        while done < nr
            && nfreed < BATCH
            && inner.staged_count() > inner.staging_target
            && !writeback_held(inner)
        {
            let Some((id, slot)) = inner.staged.lock().pop() else {
                break;
            };
            if let Some(f) = writeback(inner, id, slot) {
                freed[nfreed] = f;
                nfreed += 1;
                done += 1;
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

pub(super) enum Stage {
    /// Gone from memory with nothing left to discard.
    Gone,
    /// Moved to staging, still in memory.
    InMemory,
    /// Dropped outright (clean, never written: zeros); its frame is to be
    /// discarded and returned.
    Dropped(u32),
    /// Not now (busy, no slot, no frame).
    Not,
    /// `UFFDIO_MOVE` refused it: pinned, locked or read-only.
    Refused,
}

/// Soft-evict page `id` into a staging frame.
fn stage(inner: &Inner, id: u32) -> Stage {
    let st = &inner.states[id as usize];
    let w = st.load(Ordering::Acquire);
    if page::kind(w) != page::RESIDENT || w & page::BUSY != 0 {
        return Stage::Not;
    }
    let dirty = w & page::DIRTY != 0;
    if dirty && page::slot(w).is_none() && inner.space.nr_free() == 0 {
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
    let frame_addr = inner.staging.addr(f);
    // A clean page that never had a slot holds zeros still: drop it.
    if !dirty && page::slot(w).is_none() {
        if let Err((_, err)) = inner.move_out(frame_addr, addr, PAGE) {
            inner.staging.put(f);
            return refused(inner, claim, addr, err);
        }
        inner.counters.evict_clean.inc();
        inner.counters.evictions.inc();
        inner.resident.fetch_sub(1, Ordering::Relaxed);
        claim.commit(page::NEVER);
        return Stage::Dropped(f);
    }
    // The slot it will be written to (a clean page keeps its own).
    let (e, new_slot) = match page::slot(w) {
        Some(e) if !dirty => (e, false),
        _ => match inner.space.alloc() {
            Ok(e) => (e, true),
            Err(err) => {
                if matches!(err, SwapError::Full { .. }) {
                    inner.counters.swap_full.inc();
                }
                inner.staging.put(f);
                return Stage::Not;
            }
        },
    };
    let handle = PageHandle::new(f as u64 + 1).expect("frame + 1 is not zero");
    if inner.swap_cache.add(e, handle).is_err() {
        // The slot is ours alone (fresh, or this clean page's): it cannot
        // be cached already.  Nothing changed; give up on this one.
        debug_assert!(false, "slot {e:?} already in the swap cache");
        if new_slot {
            inner.free_slot(e);
        }
        inner.staging.put(f);
        return Stage::Not;
    }
    if let Err((_, err)) = inner.move_out(frame_addr, addr, PAGE) {
        inner.swap_cache.delete(e);
        if new_slot {
            inner.free_slot(e);
        }
        inner.staging.put(f);
        return refused(inner, claim, addr, err);
    }
    // A dirty page's old slot (if any) is stale: it has the new one.
    if new_slot {
        if let Some(o) = page::slot(w) {
            inner.free_slot(o);
        }
    }
    inner.counters.staged.inc();
    inner.nr_staged.fetch_add(1, Ordering::Relaxed);
    claim.commit(page::with_slot(page::STAGED | (w & page::DIRTY), e));
    enqueue(inner, id, e);
    Stage::InMemory
}

/// `UFFDIO_MOVE` would not move page `addr` out (claimed; nothing else
/// changed yet).  See the module documentation for what each refusal
/// means.
fn refused(inner: &Inner, claim: PageClaim<'_>, addr: u64, err: UffdError) -> Stage {
    match err.errno() {
        Some(libc::ENOENT) => {
            // The program discarded the page (MADV_DONTNEED) or unmapped
            // it: its memory is gone already, and it reads as zeros.
            if let Some(o) = page::slot(claim.found()) {
                inner.free_slot(o);
            }
            inner.counters.discarded.inc();
            inner.resident.fetch_sub(1, Ordering::Relaxed);
            claim.commit(page::NEVER);
            Stage::Gone
        }
        errno => {
            drop(claim);
            inner.unevictable(addr, errno);
            Stage::Refused
        }
    }
}

/// A free staging frame, writing back the oldest staged page if none is.
fn frame(inner: &Inner) -> Option<u32> {
    if let Some(f) = inner.staging.get() {
        return Some(f);
    }
    for _ in 0..8 {
        if writeback_held(inner) {
            return None;
        }
        let (id, slot) = inner.staged.lock().pop()?;
        if let Some(f) = writeback(inner, id, slot) {
            inner.staging.discard_batch(&[f]);
            return Some(f);
        }
    }
    None
}

/// Whether writeback is paused after transient write errors.
fn writeback_held(inner: &Inner) -> bool {
    let until = inner.writeback.hold_until.load(Ordering::Relaxed);
    until != 0 && monotonic_ns() < until
}

/// A write failed with an error that may pass: pause writeback, longer
/// each time while it goes on.
pub(super) fn writeback_failed(inner: &Inner, err: &IoError) {
    inner.counters.swapout_retries.inc();
    let b = &inner.writeback;
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
    let b = &inner.writeback;
    if b.backoff_ns.load(Ordering::Relaxed) != 0 {
        b.backoff_ns.store(0, Ordering::Relaxed);
        b.hold_until.store(0, Ordering::Relaxed);
    }
}

/// Whether unit eviction, which writes at once, must wait.
pub(super) fn writes_held(inner: &Inner) -> bool {
    writeback_held(inner)
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
        let buf = unsafe { inner.staging.bytes(f) };
        if is_zero(buf) {
            // A page of zeros needs neither IO nor a slot: it goes back to
            // never-written, and its next touch zero-fills it.  Linux 6.12
            // does the same with a bit per slot (the swap zeromap); without
            // it such pages cost uswap a write and a read each.
            inner.swap_cache.delete(e);
            inner.free_slot(e);
            inner.nr_staged.fetch_sub(1, Ordering::Relaxed);
            inner.counters.evict_zero.inc();
            inner.counters.evictions.inc();
            inner.resident.fetch_sub(1, Ordering::Relaxed);
            claim.commit(page::NEVER);
            return Some(f);
        }
        match inner.devices[e.device() as usize].write(e.offset(), buf) {
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
    inner.swap_cache.delete(e);
    inner.nr_staged.fetch_sub(1, Ordering::Relaxed);
    inner.counters.evictions.inc();
    inner.resident.fetch_sub(1, Ordering::Relaxed);
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
    match inner.move_in(addr, inner.staging.addr(f), PAGE) {
        Ok(copied) => {
            // `e` stays allocated, never to be handed out again.
            inner.counters.write_errors.inc();
            inner.swap_cache.delete(e);
            if copied {
                inner.staging.discard_batch(&[f]);
            }
            inner.staging.put(f);
            inner.nr_staged.fetch_sub(1, Ordering::Relaxed);
            inner.lru.add(id);
            claim.commit(page::RESIDENT | page::DIRTY);
            None
        }
        Err((_, err)) if Inner::region_gone(&err) => {
            // The program unmapped the page meanwhile: nothing to keep.
            inner.counters.write_errors.inc();
            inner.swap_cache.delete(e);
            inner.nr_staged.fetch_sub(1, Ordering::Relaxed);
            inner.resident.fetch_sub(1, Ordering::Relaxed);
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

/// A touch on a staged page (claimed by the caller): move it back from its
/// frame, no IO.  The moved-back page is writable, so it is taken as dirty
/// from here on and its slot freed.  Returns whether the faulting thread
/// must be woken (handler mode).
pub(super) fn unstage(inner: &Inner, claim: PageClaim<'_>, id: u32, addr: u64) -> bool {
    let e: SwapEntry = page::slot(claim.found()).expect("a staged page has a slot");
    let f = inner.staged_frame(e);
    match inner.move_in(addr, inner.staging.addr(f), PAGE) {
        Ok(copied) => {
            inner.swap_cache.delete(e);
            if copied {
                inner.counters.move_fallbacks.inc();
                inner.staging.discard_batch(&[f]);
            }
            // The frame is empty again: reusable.
            inner.staging.put(f);
            inner.free_slot(e);
            inner.counters.swapcache_hits.inc();
            inner.nr_staged.fetch_sub(1, Ordering::Relaxed);
            // Back on the LRU, active: it was touched while on its way out.
            inner.lru.add(id);
            inner.lru.activate(id);
            claim.commit(page::RESIDENT | page::DIRTY);
            false
        }
        Err((_, err)) if Inner::region_gone(&err) => {
            inner.swap_cache.delete(e);
            inner.staging.discard_batch(&[f]);
            inner.staging.put(f);
            inner.free_slot(e);
            inner.nr_staged.fetch_sub(1, Ordering::Relaxed);
            inner.resident.fetch_sub(1, Ordering::Relaxed);
            claim.commit(page::NEVER);
            true
        }
        // Neither moved nor copied: it stays staged (its cache entry and
        // ring entry with it), and the access retries.
        Err((_, err)) => fault::retry_later(inner, claim, err.errno()),
    }
}

/// Drop a staged page whose region is going away: its frame and its swap
/// cache entry.  (Its slot is freed by the caller.)
pub(super) fn drop_staged(inner: &Inner, w: u64) {
    let e = page::slot(w).expect("a staged page has a slot");
    if let Some(h) = inner.swap_cache.delete(e) {
        let f = (h.get() - 1) as u32;
        inner.staging.discard_batch(&[f]);
        inner.staging.put(f);
    }
}

/// The background reclaimer: keeps resident pages under the low watermark,
/// and, in SIGBUS mode, watches the process's signal set-up.
pub(super) fn spawn_reclaimer(weak: Weak<Inner>, watch: bool) -> JoinHandle<()> {
    const WATCH_EVERY: Duration = Duration::from_millis(100);
    const SCAN_EVERY: u32 = 5;
    signals::spawn("uswap-reclaim", move || {
        let mut last_watch = Instant::now();
        let mut watches = 0u32;
        loop {
            let Some(inner) = Inner::upgrade(&weak) else {
                return;
            };
            if watch && last_watch.elapsed() >= WATCH_EVERY {
                last_watch = Instant::now();
                watches += 1;
                signals::watch(watches % SCAN_EVERY == 1);
            }
            let resident = inner.resident.load(Ordering::Relaxed);
            if resident > inner.low && reclaim(&inner, resident - inner.low) > 0 {
                continue;
            }
            drop(inner);
            std::thread::sleep(Duration::from_millis(1));
        }
    })
}
