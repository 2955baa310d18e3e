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
//! back to "never written", no slot, no IO.  When no slot can be had, or a
//! write fails, the page goes back where it was: it stays resident, never
//! lost.  The background reclaimer keeps resident pages (staged ones
//! included) under the low watermark; a faulting thread that finds the
//! budget exhausted reclaims directly before it installs its page.

use std::sync::atomic::Ordering;
use std::sync::Weak;
use std::thread::JoinHandle;
use std::time::Duration;

use super::{page, Inner};
use crate::swap_cache::PageHandle;
use crate::swap_space::{SwapEntry, SwapError};
use crate::PAGE_SIZE;

const PAGE: u64 = PAGE_SIZE as u64;
/// Victims taken from the LRU per pass.
const BATCH: usize = 32;

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
    // dirty page) go back on the LRU and would come up again; a few passes
    // are all one call may spend.
    for _ in 0..4 {
        if done >= nr {
            break;
        }
        let want = (nr - done).min(BATCH);
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
                if super::unit::evict(inner, id) {
                    done += super::unit::UNIT_PAGES;
                } else if page::kind(inner.states[id as usize].load(Ordering::Acquire)) == page::RESIDENT {
                    inner.lru.add(id);
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
                Stage::Not => {
                    if page::kind(inner.states[id as usize].load(Ordering::Acquire)) == page::RESIDENT {
                        // Still resident: back on the LRU, tried again later.
                        inner.lru.add(id);
                    }
                }
            }
        }
        inner.discard_frames(&freed[..nfreed]);
        // Write back the oldest staged pages down to half the frames: the
        // younger half stays in memory, where a touch costs no IO.
        nfreed = 0;
        while done < nr && nfreed < BATCH && inner.staged_count() > inner.staging_target {
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
    }
    done
}

enum Stage {
    /// Gone from memory with nothing left to discard (the copy fallback).
    Gone,
    /// Moved to staging, still in memory.
    InMemory,
    /// Dropped outright (clean, never written: zeros); its frame is to be
    /// discarded and returned.
    Dropped(u32),
    /// Not now.
    Not,
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
    if st
        .compare_exchange(w, w | page::BUSY, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return Stage::Not;
    }
    let Some(f) = frame(inner) else {
        st.store(w, Ordering::Release);
        return Stage::Not;
    };
    let addr = inner.addrs[id as usize].load(Ordering::Relaxed);
    let frame_addr = inner.staging.addr(f);
    // A clean page that never had a slot holds zeros still: drop it.
    if !dirty && page::slot(w).is_none() {
        if let Err(err) = inner.move_out(frame_addr, addr) {
            inner.staging.put(f);
            return copy_out_or_keep(inner, id, addr, w, err);
        }
        inner.counters.evict_clean.inc();
        inner.counters.evictions.inc();
        inner.resident.fetch_sub(1, Ordering::Relaxed);
        st.store(page::NEVER, Ordering::Release);
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
                st.store(w, Ordering::Release);
                return Stage::Not;
            }
        },
    };
    // A dirty page's old slot (if any) is stale: it gets the new one.
    let old = if new_slot { page::slot(w) } else { None };
    let moved = match inner
        .swap_cache
        .add(e, PageHandle::new(f as u64 + 1).expect("non-zero"))
    {
        Ok(()) => inner.move_out(frame_addr, addr),
        Err(_) => Err(crate::uffd::UffdError::Ioctl {
            op: "swap cache add",
            errno: libc::EEXIST,
        }),
    };
    if let Err(err) = moved {
        inner.swap_cache.delete(e);
        if new_slot {
            let _ = inner.space.free(e);
        }
        inner.staging.put(f);
        return copy_out_or_keep(inner, id, addr, w, err);
    }
    if let Some(o) = old {
        let _ = inner.space.free(o);
    }
    inner.counters.staged.inc();
    inner.nr_staged.fetch_add(1, Ordering::Relaxed);
    let staged = page::with_slot(page::STAGED | (w & page::DIRTY), e);
    // The state goes in before the ring entry, so the entry is live when
    // anyone can pop it.
    st.store(staged, Ordering::Release);
    let mut ring = inner.staged.lock();
    if !ring.push(id, e) {
        ring.compact(|i, s| live(inner, i, s));
        // Live entries never outnumber the staging frames, half the ring.
        assert!(ring.push(id, e), "staged ring full of live entries");
    }
    drop(ring);
    Stage::InMemory
}

/// `UFFDIO_MOVE` refused page `id` (BUSY held, state `w`).  `EBUSY` means
/// the page is shared or pinned (KSM, a DMA pin): fall back to
/// write-protect + copy + zap + wake, writing it straight to a slot.  Any
/// other error: leave it resident.
fn copy_out_or_keep(inner: &Inner, id: u32, addr: u64, w: u64, err: crate::uffd::UffdError) -> Stage {
    let st = &inner.states[id as usize];
    if err.errno() != Some(libc::EBUSY) {
        st.store(w, Ordering::Release);
        return Stage::Not;
    }
    // Writers now take a write-protect fault and wait for BUSY to clear,
    // so the copy below is the page's last contents.
    if inner.uffd.writeprotect(addr, PAGE, true, false).is_err() {
        st.store(w, Ordering::Release);
        return Stage::Not;
    }
    let b = loop {
        match inner.bounce.get() {
            Some(b) => break b,
            None => std::thread::yield_now(),
        }
    };
    // SAFETY: we hold bounce frame `b`; the page at `addr` is present and
    // readable (only writes are blocked), and nobody writes it meanwhile.
    let buf = unsafe { inner.bounce.bytes(b) };
    // SAFETY: `addr` is a present page of a live region (we hold it BUSY).
    buf.copy_from_slice(unsafe { std::slice::from_raw_parts(addr as *const u8, PAGE_SIZE) });
    let dirty = w & page::DIRTY != 0;
    let next = match (dirty, page::slot(w)) {
        (false, Some(e)) => Some(page::with_slot(page::SWAPPED, e)),
        (false, None) => Some(page::NEVER),
        (true, _) => match inner.space.alloc() {
            Ok(e) => match inner.devices[e.device() as usize].write(e.offset(), buf) {
                Ok(()) => Some(page::with_slot(page::SWAPPED, e)),
                Err(_) => {
                    inner.counters.write_errors.inc();
                    None
                }
            },
            Err(_) => {
                inner.counters.swap_full.inc();
                None
            }
        },
    };
    inner.bounce.put(b);
    let Some(next) = next else {
        // Keep it: unprotect (waking the writers) and carry on resident.
        let _ = inner.uffd.writeprotect(addr, PAGE, false, true);
        st.store(w, Ordering::Release);
        return Stage::Not;
    };
    super::frames::zap(addr, PAGE_SIZE);
    // MADV_DONTNEED does not wake threads waiting on the page: wake them,
    // to fault again and find it swapped.
    let _ = inner.uffd.wake(addr, PAGE);
    inner.counters.move_fallbacks.inc();
    inner.counters.evictions.inc();
    if dirty {
        inner.counters.evict_write.inc();
    } else {
        inner.counters.evict_clean.inc();
    }
    inner.resident.fetch_sub(1, Ordering::Relaxed);
    st.store(next, Ordering::Release);
    Stage::Gone
}

/// A free staging frame, writing back the oldest staged page if none is.
fn frame(inner: &Inner) -> Option<u32> {
    if let Some(f) = inner.staging.get() {
        return Some(f);
    }
    for _ in 0..8 {
        let (id, slot) = inner.staged.lock().pop()?;
        if let Some(f) = writeback(inner, id, slot) {
            inner.staging.discard_batch(&[f]);
            return Some(f);
        }
    }
    None
}

/// Write staged page `id` back to its slot; returns its frame, to be
/// discarded and returned.  None when the page is no longer staged (a touch
/// moved it back) or its write failed (then it is back in its region).
fn writeback(inner: &Inner, id: u32, slot: u64) -> Option<u32> {
    let st = &inner.states[id as usize];
    let w = st.load(Ordering::Acquire);
    if w & page::BUSY != 0 || !live(inner, id, slot) {
        return None;
    }
    if st
        .compare_exchange(w, w | page::BUSY, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return None;
    }
    let e = page::slot(w).expect("a staged page has a slot");
    let f = (inner
        .swap_cache
        .lookup(e)
        .expect("a staged page is in the swap cache")
        .get()
        - 1) as u32;
    if w & page::DIRTY != 0 {
        // SAFETY: the staged page's frame is ours while we hold BUSY.
        let buf = unsafe { inner.staging.bytes(f) };
        if is_zero(buf) {
            // A page of zeros needs neither IO nor a slot: it goes back to
            // never-written, and its next touch zero-fills it.  Linux 6.12
            // does the same with a bit per slot (the swap zeromap); without
            // it such pages cost uswap a write and a read each.
            inner.swap_cache.delete(e);
            let _ = inner.space.free(e);
            inner.nr_staged.fetch_sub(1, Ordering::Relaxed);
            inner.counters.evict_zero.inc();
            inner.counters.evictions.inc();
            inner.resident.fetch_sub(1, Ordering::Relaxed);
            st.store(page::NEVER, Ordering::Release);
            return Some(f);
        }
        if inner.devices[e.device() as usize].write(e.offset(), buf).is_err() {
            // The slot is suspect: keep it allocated for good (a bad slot)
            // and put the page back where it was, resident and dirty.
            inner.counters.write_errors.inc();
            inner.swap_cache.delete(e);
            let addr = inner.addrs[id as usize].load(Ordering::Relaxed);
            let _ = inner
                .uffd
                .move_pages(addr, inner.staging.addr(f), PAGE, true, false);
            inner.staging.put(f);
            inner.nr_staged.fetch_sub(1, Ordering::Relaxed);
            inner.lru.add(id);
            st.store(page::RESIDENT | page::DIRTY, Ordering::Release);
            return None;
        }
        inner.counters.evict_write.inc();
    } else {
        inner.counters.evict_clean.inc();
    }
    inner.swap_cache.delete(e);
    inner.nr_staged.fetch_sub(1, Ordering::Relaxed);
    inner.counters.evictions.inc();
    inner.resident.fetch_sub(1, Ordering::Relaxed);
    st.store(page::with_slot(page::SWAPPED, e), Ordering::Release);
    Some(f)
}

/// Whether a page holds only zeros.  Word by word: a page with data stops
/// at its first non-zero word, so the check costs next to nothing there.
fn is_zero(page: &[u8]) -> bool {
    page.chunks_exact(8)
        .all(|w| u64::from_ne_bytes(w.try_into().expect("8 bytes")) == 0)
}

/// A touch on a staged page (BUSY held by the caller, state `w`): move it
/// back from its frame, no IO.  The moved-back page is writable, so it is
/// taken as dirty from here on and its slot freed.
pub(super) fn unstage(inner: &Inner, id: u32, addr: u64, w: u64) {
    let e: SwapEntry = page::slot(w).expect("a staged page has a slot");
    let h = inner
        .swap_cache
        .delete(e)
        .expect("a staged page is in the swap cache");
    let f = (h.get() - 1) as u32;
    if inner
        .uffd
        .move_pages(addr, inner.staging.addr(f), PAGE, true, false)
        .is_err()
    {
        // The move back failed (it should not: we hold BUSY and the
        // region's page is missing).  The page must not be lost with its
        // frame: copy it in instead, or, failing that too, leave it staged
        // for the access to try again.
        // SAFETY: the frame is ours while we hold BUSY.
        let buf = unsafe { inner.staging.bytes(f) };
        if inner.uffd.copy(addr, buf.as_ptr(), PAGE, false, true).is_err() {
            inner
                .swap_cache
                .add(e, h)
                .expect("the slot's cache entry was ours a moment ago");
            inner.states[id as usize].store(w, Ordering::Release);
            return;
        }
        inner.counters.move_fallbacks.inc();
        inner.staging.discard_batch(&[f]);
    }
    // The frame is empty again (its page moved, or discarded): reusable.
    inner.staging.put(f);
    let _ = inner.space.free(e);
    inner.counters.swapcache_hits.inc();
    inner.nr_staged.fetch_sub(1, Ordering::Relaxed);
    // Back on the LRU, active: it was touched while on its way out.
    inner.lru.add(id);
    inner.lru.activate(id);
    inner.states[id as usize].store(page::RESIDENT | page::DIRTY, Ordering::Release);
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

/// The background reclaimer: keeps resident pages under the low watermark.
pub(super) fn spawn_reclaimer(weak: Weak<Inner>) -> JoinHandle<()> {
    std::thread::Builder::new()
        .name("uswap-reclaim".into())
        .spawn(move || loop {
            let Some(inner) = Inner::upgrade(&weak) else {
                return;
            };
            let resident = inner.resident.load(Ordering::Relaxed);
            if resident > inner.low {
                if reclaim(&inner, resident - inner.low) == 0 {
                    drop(inner);
                    std::thread::sleep(Duration::from_millis(1));
                }
            } else {
                drop(inner);
                std::thread::sleep(Duration::from_millis(1));
            }
        })
        .expect("spawn the reclaimer thread")
}
