//! 2 MB units (seed 003): regions mapped with [`Swap::map_huge`] are paged
//! in and out 512 pages at a time, as one transparent huge page where the
//! kernel can give one.
//!
//! - Out: the unit is moved with one `UFFDIO_MOVE` of 2 MB into an "out"
//!   staging unit (a PMD move when it is a THP: it stays whole), written
//!   with one 2 MB IO to a whole cluster from `alloc_huge`, and discarded.
//!   When no cluster is wholly free the unit is split: 512 slots, 512 IOs,
//!   each page's slot in its own word (counted as a fallback).
//! - In: an "in" staging unit is populated (`MADV_POPULATE_WRITE`: a zeroed
//!   THP under `MADV_HUGEPAGE`), filled with one 2 MB read (or 512 after a
//!   split; a never-written unit stays zero), and moved into the region.
//!
//! Only the destination of `UFFDIO_MOVE` must be registered with the
//! userfaultfd, so the "in" units are not (they can be populated by
//! faulting them in) and the "out" units are (they receive moved pages and
//! are never touched).  A unit moved in is writable (a move drops write
//! protection), so units are always dirty: no clean drops, no soft
//! eviction; they go straight to their slots.
//!
//! [`Swap::map_huge`]: super::Swap::map_huge

use std::sync::atomic::Ordering;

use super::frames::Mapping;
use super::{page, Inner};
use crate::stats::{Registry, StatMutex};
use crate::swap_space::{SwapEntry, SwapError, CLUSTER_SLOTS};
use crate::PAGE_SIZE;

/// Bytes in a unit.
pub const UNIT_BYTES: usize = 2 << 20;
/// Pages in a unit.
pub const UNIT_PAGES: usize = UNIT_BYTES / PAGE_SIZE;
const MADV_POPULATE_WRITE: i32 = 23;

/// A few 2 MB staging units in one 2 MB-aligned mapping.
pub(super) struct UnitPool {
    map: Mapping,
    free: StatMutex<Vec<u32>>,
}

impl UnitPool {
    pub fn new(units: u32, registry: &Registry, site: &'static str) -> std::io::Result<UnitPool> {
        let map = Mapping::new(units as usize * UNIT_BYTES, UNIT_BYTES)?;
        map.advise_huge();
        Ok(UnitPool {
            map,
            free: StatMutex::new((0..units).rev().collect(), registry.lock_site(site)),
        })
    }

    pub fn mapping(&self) -> &Mapping {
        &self.map
    }

    fn get(&self) -> Option<u32> {
        self.free.lock().pop()
    }

    fn put(&self, u: u32) {
        self.free.lock().push(u);
    }

    fn addr(&self, u: u32) -> u64 {
        self.map.addr() + u as u64 * UNIT_BYTES as u64
    }

    /// Unit `u` as bytes.
    ///
    /// # Safety
    /// The caller holds unit `u` (from `get`) and it is populated.
    #[allow(clippy::mut_from_ref)]
    unsafe fn bytes(&self, u: u32) -> &mut [u8] {
        // SAFETY: held by the caller alone, inside the mapping, populated.
        unsafe { std::slice::from_raw_parts_mut(self.addr(u) as *mut u8, UNIT_BYTES) }
    }

    /// Fault unit `u` in, zeroed, as one THP where the kernel can.
    fn populate(&self, u: u32) -> bool {
        // SAFETY: advice on our own, unregistered mapping.
        unsafe { libc::madvise(self.addr(u) as *mut libc::c_void, UNIT_BYTES, MADV_POPULATE_WRITE) == 0 }
    }
}

fn take(pool: &UnitPool) -> u32 {
    loop {
        if let Some(u) = pool.get() {
            return u;
        }
        std::thread::yield_now();
    }
}

/// Serve a fault in the unit whose first page is `head` at `addr`.
pub(super) fn serve(inner: &Inner, addr: u64, head: u32) {
    let st = &inner.states[head as usize];
    inner.counters.faults.inc();
    let mut spins = 0u32;
    loop {
        let w = st.load(Ordering::Acquire);
        if w & page::BUSY != 0 {
            spins += 1;
            if spins > 64 {
                std::thread::yield_now();
            }
            continue;
        }
        match page::kind(w) {
            page::NEVER | page::SWAPPED => {
                if st
                    .compare_exchange(w, w | page::BUSY, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
                {
                    continue;
                }
                install(inner, addr, head, w);
                return;
            }
            // Present (a duplicate fault), poisoned or dying: nothing to do.
            _ => return,
        }
    }
}

fn install(inner: &Inner, addr: u64, head: u32, w: u64) {
    let st = &inner.states[head as usize];
    super::reclaim::make_room_for(inner, UNIT_PAGES);
    let pool = &inner.unit_in;
    let u = take(pool);
    if !pool.populate(u) {
        // No memory at all: leave the unit as it was; the access retries.
        pool.put(u);
        st.store(w, Ordering::Release);
        return;
    }
    if page::kind(w) == page::SWAPPED {
        // SAFETY: we hold unit `u`, populated just now.
        let buf = unsafe { pool.bytes(u) };
        let result = if w & page::WHOLE != 0 {
            let e = page::slot(w).expect("a whole unit has its cluster");
            inner.devices[e.device() as usize]
                .read(e.offset(), buf)
                .map_err(|err| (e, err))
        } else {
            (0..UNIT_PAGES).try_for_each(|i| {
                let e =
                    page::slot(inner.states[head as usize + i].load(Ordering::Acquire)).expect("split slot");
                inner.devices[e.device() as usize]
                    .read(e.offset(), &mut buf[i * PAGE_SIZE..(i + 1) * PAGE_SIZE])
                    .map_err(|err| (e, err))
            })
        };
        if let Err((e, err)) = result {
            super::fault::log_poison(addr, UNIT_BYTES as u64, e, &err);
            // Never zeros: poison the whole unit.
            inner.counters.read_errors.inc();
            pool.put(u);
            let _ = inner.uffd.poison(addr, UNIT_BYTES as u64, true);
            free_slots(inner, head, w);
            st.store(page::POISONED | page::UNIT, Ordering::Release);
            return;
        }
        free_slots(inner, head, w);
        inner.counters.huge_swapins.inc();
    } else {
        inner.counters.zero_fills.inc();
    }
    let _ = inner
        .uffd
        .move_pages(addr, pool.addr(u), UNIT_BYTES as u64, true, false);
    // The "in" unit is empty again (its pages moved): reusable as it is.
    pool.put(u);
    inner.resident.fetch_add(UNIT_PAGES, Ordering::Relaxed);
    st.store(page::RESIDENT | page::DIRTY | page::UNIT, Ordering::Release);
    inner.lru.add(head);
}

/// Free the slots of swapped unit `head` (state `w`).
pub(super) fn free_slots(inner: &Inner, head: u32, w: u64) {
    if w & page::WHOLE != 0 {
        if let Some(e) = page::slot(w) {
            let _ = inner.space.free_huge(e);
        }
        return;
    }
    for i in 0..UNIT_PAGES {
        let m = &inner.states[head as usize + i];
        // The head's own word may have moved on already (the caller holds
        // it busy, or a dying region has marked it dead): use `w`.
        let mw = if i == 0 { w } else { m.load(Ordering::Acquire) };
        if let Some(e) = page::slot(mw) {
            let _ = inner.space.free(e);
        }
        if i > 0 {
            m.store(page::NEVER, Ordering::Release);
        }
    }
}

/// Evict the unit whose first page is `head`; true when it left memory.
pub(super) fn evict(inner: &Inner, head: u32) -> bool {
    let st = &inner.states[head as usize];
    let w = st.load(Ordering::Acquire);
    if page::kind(w) != page::RESIDENT || w & page::BUSY != 0 {
        return false;
    }
    if st
        .compare_exchange(w, w | page::BUSY, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return false;
    }
    let addr = inner.addrs[head as usize].load(Ordering::Relaxed);
    let pool = &inner.unit_out;
    let Some(u) = pool.get() else {
        st.store(w, Ordering::Release);
        return false;
    };
    if inner
        .uffd
        .move_pages(pool.addr(u), addr, UNIT_BYTES as u64, false, false)
        .is_err()
    {
        pool.put(u);
        st.store(w, Ordering::Release);
        return false;
    }
    // SAFETY: we hold unit `u`, which holds the pages just moved out.
    let buf = unsafe { pool.bytes(u) };
    let next = match inner.space.alloc_huge() {
        Ok(base) => match inner.devices[base.device() as usize].write(base.offset(), buf) {
            Ok(()) => Some(page::with_slot(page::SWAPPED | page::UNIT | page::WHOLE, base)),
            Err(_) => {
                // Retire the cluster (never freed) and keep the unit.
                inner.counters.write_errors.inc();
                None
            }
        },
        Err(SwapError::NoFreeCluster) => {
            // Seed 003's fallback: split into 512 slots.
            inner.counters.huge_fallbacks.inc();
            split_out(inner, head, buf)
        }
        Err(_) => None,
    };
    let Some(next) = next else {
        let _ = inner
            .uffd
            .move_pages(addr, pool.addr(u), UNIT_BYTES as u64, true, false);
        pool.put(u);
        st.store(w, Ordering::Release);
        return false;
    };
    pool.mapping().discard(pool.addr(u), UNIT_BYTES);
    pool.put(u);
    inner.counters.huge_swapouts.inc();
    inner.counters.evictions.inc();
    inner.resident.fetch_sub(UNIT_PAGES, Ordering::Relaxed);
    st.store(next, Ordering::Release);
    true
}

/// Write a unit's pages to 512 single slots, recorded in the pages' own
/// words; the unit's word says "split".  None (nothing kept) when the swap
/// space runs out midway or a write fails.
fn split_out(inner: &Inner, head: u32, buf: &[u8]) -> Option<u64> {
    let mut slots = [SwapEntry::NONE; CLUSTER_SLOTS as usize];
    for i in 0..UNIT_PAGES {
        let ok = match inner.space.alloc() {
            Ok(e) => {
                slots[i] = e;
                inner.devices[e.device() as usize]
                    .write(e.offset(), &buf[i * PAGE_SIZE..(i + 1) * PAGE_SIZE])
                    .is_ok()
            }
            Err(_) => false,
        };
        if !ok {
            let n = if slots[i] == SwapEntry::NONE { i } else { i + 1 };
            let _ = inner.space.free_batch(&mut slots[..n]);
            inner.counters.swap_full.inc();
            return None;
        }
    }
    for (i, e) in slots.iter().enumerate().skip(1) {
        inner.states[head as usize + i].store(page::with_slot(page::NEVER, *e), Ordering::Release);
    }
    Some(page::with_slot(page::SWAPPED | page::UNIT, slots[0]))
}
