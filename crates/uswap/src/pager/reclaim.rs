//! Reclaim: keep resident pages under the budget.
//!
//! The background reclaimer keeps them under the low watermark; a faulting
//! thread that finds the budget exhausted reclaims directly before it
//! installs its page.  Victims come from the LRU's inactive tail (second
//! chance for referenced pages); each is moved out of its region with
//! `UFFDIO_MOVE` into a staging frame, atomically: a thread touching it
//! from then on faults and waits for the eviction to finish.  A clean page
//! that still has its slot is dropped without IO; a clean page that never
//! had one is still all zeros and goes back to "never written"; a dirty
//! page is written to a new slot.  When no slot can be had, or the write
//! fails, the page is moved back: it stays resident, never lost.

use std::sync::atomic::Ordering;
use std::sync::Weak;
use std::thread::JoinHandle;
use std::time::Duration;

use super::{page, Inner};
use crate::io::IoError;
use crate::swap_space::SwapError;
use crate::PAGE_SIZE;

const PAGE: u64 = PAGE_SIZE as u64;
/// Victims taken from the LRU per pass.
const BATCH: usize = 32;

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

/// Evict up to `nr` pages; returns how many left memory.
pub(super) fn reclaim(inner: &Inner, nr: usize) -> usize {
    let mut victims = [0u32; BATCH];
    let mut done = 0;
    // Bounded: when victims cannot be evicted (busy, or no free slot for a
    // dirty page) they go back on the LRU and would come up again; a few
    // passes are all one call may spend.
    for _ in 0..4 {
        if done >= nr {
            break;
        }
        let want = (nr - done).min(BATCH);
        let n = inner.lru.shrink_inactive(want * 2, &mut victims[..want]);
        if n == 0 {
            // Inactive list empty or all referenced: age the active list.
            inner.lru.age_active(want * 4);
            continue;
        }
        // Frames of pages evicted in this pass, discarded together below:
        // one TLB flush for the batch instead of one per page.
        let mut frames = [0u32; BATCH];
        let mut nframes = 0;
        for &id in &victims[..n] {
            if let Some(f) = evict(inner, id) {
                frames[nframes] = f;
                nframes += 1;
                done += 1;
            } else if page::kind(inner.states[id as usize].load(Ordering::Acquire)) == page::RESIDENT {
                // Still resident (busy, or no room on the devices): back
                // on the LRU, to be tried again later.
                inner.lru.add(id);
            }
        }
        inner.discard_frames(&frames[..nframes]);
    }
    done
}

/// Evict page `id`; returns the staging frame its contents went through
/// (for the caller to discard and return), or None when the page was not
/// evictable right now.
fn evict(inner: &Inner, id: u32) -> Option<u32> {
    let st = &inner.states[id as usize];
    let w = st.load(Ordering::Acquire);
    if page::kind(w) != page::RESIDENT || w & page::BUSY != 0 {
        return None;
    }
    if w & page::DIRTY != 0 && inner.space.nr_free() == 0 {
        // Nowhere to write it: do not move it out just to move it back.
        inner.counters.swap_full.inc();
        return None;
    }
    if st
        .compare_exchange(w, w | page::BUSY, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return None;
    }
    let addr = inner.addrs[id as usize].load(Ordering::Relaxed);
    let Some(f) = inner.staging.get() else {
        st.store(w, Ordering::Release);
        return None;
    };
    let frame = inner.staging.addr(f);
    if inner.uffd.move_pages(frame, addr, PAGE, false, false).is_err() {
        // Shared or pinned (EBUSY), or not present: leave it resident.
        inner.staging.put(f);
        st.store(w, Ordering::Release);
        return None;
    }
    let clean = w & page::DIRTY == 0;
    let next = match (clean, page::slot(w)) {
        (true, Some(e)) => {
            inner.counters.evict_clean.inc();
            page::with_slot(page::SWAPPED, e)
        }
        (true, None) => {
            // Installed as zeros and never written: still zeros.
            inner.counters.evict_clean.inc();
            page::NEVER
        }
        (false, _) => match write_out(inner, f) {
            Ok(e) => {
                inner.counters.evict_write.inc();
                page::with_slot(page::SWAPPED, e)
            }
            Err(()) => {
                // Keep the page: move it back where it was.
                let _ = inner.uffd.move_pages(addr, frame, PAGE, true, false);
                inner.staging.put(f);
                st.store(w, Ordering::Release);
                return None;
            }
        },
    };
    inner.resident.fetch_sub(1, Ordering::Relaxed);
    inner.counters.evictions.inc();
    st.store(next, Ordering::Release);
    Some(f)
}

/// Write staging frame `f` to a new slot.
fn write_out(inner: &Inner, f: u32) -> Result<crate::swap_space::SwapEntry, ()> {
    let e = match inner.space.alloc() {
        Ok(e) => e,
        Err(SwapError::Full { .. }) => {
            inner.counters.swap_full.inc();
            return Err(());
        }
        Err(_) => return Err(()),
    };
    // SAFETY: we hold frame `f`, which holds the page just moved out.
    let buf = unsafe { inner.staging.bytes(f) };
    match inner.devices[e.device() as usize].write(e.offset(), buf) {
        Ok(()) => Ok(e),
        Err(IoError::Write { .. }) | Err(_) => {
            // The slot is suspect: keep it allocated so it is never used
            // again (a bad slot), and keep the page resident.
            inner.counters.write_errors.inc();
            Err(())
        }
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
