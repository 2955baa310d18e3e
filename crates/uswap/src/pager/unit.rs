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
//! A unit mapped with small pages (no THP) can move part way: the move
//! stops at a page the program discarded (a hole), a pinned page or a
//! locked one.  Eviction then puts back what moved before it reads any of
//! the "out" unit (whose missing pages would fault on our own registered
//! memory), fills holes with zeros (the program discarded them: that is
//! what they read as) and tries again later; a pinned or locked page keeps
//! its unit resident.  A move in that stops part way is finished by
//! copying: a resident unit is always all there.
//!
//! [`Swap::map_huge`]: super::Swap::map_huge

use std::sync::atomic::Ordering;

use super::frames::Mapping;
use super::page::{self, PageClaim};
use super::reclaim::{self, Stage};
use super::signals::Access;
use super::{fault, Inner};
use crate::stats::{Registry, StatMutex};
use crate::swap_space::{SwapEntry, SwapError};
use crate::PAGE_SIZE;

/// Bytes in a unit.
pub const UNIT_BYTES: usize = 2 << 20;
/// Pages in a unit.
pub const UNIT_PAGES: usize = UNIT_BYTES / PAGE_SIZE;
const UNIT: u64 = UNIT_BYTES as u64;
const PAGE: u64 = PAGE_SIZE as u64;
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

    /// A free unit, waiting for one if all are in use (their holders hold
    /// a unit's claim and wait for nothing but IO, so one comes back).
    fn take(&self) -> u32 {
        loop {
            if let Some(u) = self.free.lock().pop() {
                return u;
            }
            fault::pause();
        }
    }

    fn get(&self) -> Option<u32> {
        self.free.lock().pop()
    }

    fn put(&self, u: u32) {
        self.free.lock().push(u);
    }

    fn addr(&self, u: u32) -> u64 {
        self.map.addr() + u as u64 * UNIT
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

    /// Drop what unit `u` holds: it reads as missing (zeros) again.
    fn discard(&self, u: u32) {
        self.map.discard(self.addr(u), UNIT_BYTES);
    }
}

/// Serve a fault at `addr` in the unit whose first page is `head` at
/// `base`.
pub(super) fn serve(inner: &Inner, base: u64, head: u32, addr: u64, access: Access) {
    let st = &inner.states[head as usize];
    inner.counters.faults.inc();
    loop {
        let w = page::wait_unbusy(st, &mut || inner.counters.busy_waits.inc());
        match page::kind(w) {
            page::NEVER | page::SWAPPED => {
                if access.present == Some(true) {
                    // Faulted on a page of the unit before it went out.
                    return;
                }
                let Some(claim) = PageClaim::try_claim(st, w) else {
                    continue;
                };
                install(inner, claim, base, head);
                return;
            }
            page::RESIDENT => {
                // The unit is in: a duplicate fault, or a page of it the
                // program discarded (MADV_DONTNEED), which reads as zeros.
                let page = addr & !(PAGE - 1);
                if access.present.unwrap_or_else(|| fault::mapped(page)) {
                    return;
                }
                let Some(claim) = PageClaim::try_claim(st, w) else {
                    continue;
                };
                match inner.copy_zero(page, false) {
                    Ok(()) => inner.counters.discarded.inc(),
                    Err(e) if e.errno() == Some(libc::EEXIST) => {}
                    Err(e) => {
                        fault::retry_later(inner, claim, e.errno());
                        return;
                    }
                }
                // Unchanged: resident, all there.
                drop(claim);
                return;
            }
            // Poisoned (its SIGBUS comes from the kernel) or dying.
            _ => return,
        }
    }
}

fn install(inner: &Inner, claim: PageClaim<'_>, base: u64, head: u32) {
    let w = claim.found();
    reclaim::make_room_for(inner, UNIT_PAGES);
    let pool = &inner.unit_in;
    let u = pool.take();
    if !pool.populate(u) {
        // No memory at all: leave the unit as it was; the access retries.
        pool.put(u);
        fault::retry_later(inner, claim, Some(libc::ENOMEM));
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
                let e = split_slot(inner, head, i, w);
                inner.devices[e.device() as usize]
                    .read(e.offset(), &mut buf[i * PAGE_SIZE..(i + 1) * PAGE_SIZE])
                    .map_err(|err| (e, err))
            })
        };
        if let Err((e, err)) = result {
            // Whatever was read is not zeros: the next install of a
            // never-written unit must find this one empty.
            pool.discard(u);
            pool.put(u);
            if err.is_transient() {
                inner.counters.swapin_retries.inc();
                drop(claim);
                fault::pause();
                return;
            }
            // Never zeros: poison the whole unit.
            if let Err(perr) = inner.uffd.poison(base, UNIT, true) {
                fault::retry_later(inner, claim, perr.errno());
                return;
            }
            fault::log_poison(base, UNIT, e, &err);
            inner.counters.read_errors.inc();
            free_slots(inner, head, w);
            claim.commit(page::POISONED | page::UNIT);
            return;
        }
    } else {
        inner.counters.zero_fills.inc();
    }
    #[cfg(test)]
    inner.inject.gate();
    let installed = put_in(inner, base, pool.addr(u), UNIT);
    if installed != Installed::Moved {
        // Copied pages leave their source behind: empty it.
        pool.discard(u);
    }
    pool.put(u);
    if installed == Installed::Gone {
        // The program unmapped the unit meanwhile: its memory went with
        // the mapping, and its slots are of no use to anyone.
        free_slots(inner, head, w);
        claim.commit(page::NEVER | page::UNIT);
        return;
    }
    if page::kind(w) == page::SWAPPED {
        free_slots(inner, head, w);
        inner.counters.huge_swapins.inc();
    }
    inner.resident.fetch_add(UNIT_PAGES, Ordering::Relaxed);
    claim.commit(page::RESIDENT | page::DIRTY | page::UNIT);
    inner.lru.add(head);
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Installed {
    /// All moved.
    Moved,
    /// Some moved and the rest copied.
    Copied,
    /// The destination is no longer mapped.
    Gone,
}

/// Put `len` bytes of pages from `src` (ours) into the region at `dst`
/// (missing there), all of them: a move, finished by copying what does
/// not move, and retried while the kernel refuses for now (ENOMEM).  Half
/// a unit in place is no state to leave: the faulting thread waits for
/// memory, as a faulting thread in the kernel would.
fn put_in(inner: &Inner, dst: u64, src: u64, len: u64) -> Installed {
    let mut done = 0;
    let mut copied = false;
    loop {
        match inner.move_in(dst + done, src + done, len - done) {
            Ok(c) => {
                return if copied || c {
                    Installed::Copied
                } else {
                    Installed::Moved
                }
            }
            Err((n, err)) => {
                copied = true;
                if Inner::region_gone(&err) {
                    return Installed::Gone;
                }
                done += n;
                fault::retry_pause(inner, err.errno());
            }
        }
    }
}

/// The slot of page `i` of a split unit whose head word is `w`.
fn split_slot(inner: &Inner, head: u32, i: usize, w: u64) -> SwapEntry {
    // The head's own word is claimed by the caller (its slot is in `w`);
    // the others hold only their slots.
    let word = if i == 0 {
        w
    } else {
        inner.states[head as usize + i].load(Ordering::Acquire)
    };
    page::slot(word).expect("a split unit has a slot per page")
}

/// Free the slots of swapped unit `head` (state `w`).
pub(super) fn free_slots(inner: &Inner, head: u32, w: u64) {
    if page::kind(w) != page::SWAPPED {
        return;
    }
    if w & page::WHOLE != 0 {
        if let Some(e) = page::slot(w) {
            inner.free_huge(e);
        }
        return;
    }
    for i in 0..UNIT_PAGES {
        if let Some(e) = page::slot(if i == 0 {
            w
        } else {
            inner.states[head as usize + i].load(Ordering::Acquire)
        }) {
            inner.free_slot(e);
        }
        if i > 0 {
            inner.states[head as usize + i].store(page::NEVER, Ordering::Release);
        }
    }
}

/// Evict the unit whose first page is `head`: `Stage::Gone` when it left
/// memory; otherwise it is still resident (`Refused`: unevictable).
pub(super) fn evict(inner: &Inner, head: u32) -> Stage {
    let st = &inner.states[head as usize];
    let w = st.load(Ordering::Acquire);
    if page::kind(w) != page::RESIDENT || w & page::BUSY != 0 || reclaim::writes_held(inner) {
        return Stage::Not;
    }
    let Some(claim) = PageClaim::try_claim(st, w) else {
        return Stage::Not;
    };
    let addr = inner.addrs[head as usize].load(Ordering::Relaxed);
    let pool = &inner.unit_out;
    let Some(u) = pool.get() else {
        return Stage::Not;
    };
    if let Err((moved, err)) = inner.move_out(pool.addr(u), addr, UNIT) {
        // Part of it (or none) moved: put that back before anything reads
        // the "out" unit, whose missing pages would fault.
        if moved > 0 && put_in(inner, addr, pool.addr(u), moved) == Installed::Gone {
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
    let next = match inner.space.alloc_huge() {
        Ok(base) => match inner.devices[base.device() as usize].write(base.offset(), buf) {
            Ok(()) => {
                reclaim::writeback_worked(inner);
                Some(page::with_slot(page::SWAPPED | page::UNIT | page::WHOLE, base))
            }
            Err(err) if err.is_transient() => {
                inner.free_huge(base);
                reclaim::writeback_failed(inner, &err);
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
        let gone = put_in(inner, addr, pool.addr(u), UNIT) == Installed::Gone;
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
    inner.resident.fetch_sub(UNIT_PAGES, Ordering::Relaxed);
    claim.commit(next);
    Stage::Gone
}

/// The unit's memory went with the program's unmap or discard: nothing
/// to keep, and it reads as zeros.
fn unit_gone(inner: &Inner, claim: PageClaim<'_>) -> Stage {
    inner.counters.discarded.inc();
    inner.resident.fetch_sub(UNIT_PAGES, Ordering::Relaxed);
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
        let failed = match inner.space.alloc() {
            Ok(e) => match inner.devices[e.device() as usize]
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
                    reclaim::writeback_failed(inner, &err);
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
