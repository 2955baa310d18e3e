//! [`Region`]: a mapping whose pages the instance pages, and what a user
//! may do to its pages besides touching them (restore, discard, pin); its
//! drop gives back every page, slot and page id.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::pager::api::error::PagerError;
use crate::pager::evict::writeback;
use crate::pager::instance::addrs;
use crate::pager::instance::frames::Mapping;
use crate::pager::instance::gate;
use crate::pager::instance::inner::Inner;
use crate::pager::instance::page::{self, Kind, PageWord};
use crate::pager::instance::regions;
use crate::pager::instance::report;
use crate::pager::instance::signals;
use crate::uffd::RegisterMode;
use crate::PAGE_SIZE;

/// A region of swapped memory.  Dropping it unmaps it and frees its slots.
pub struct Region {
    pub(crate) inner: Arc<Inner>,
    pub(crate) map: Mapping,
    pub(crate) id_base: u32,
    pub(crate) pages: usize,
    pub(crate) slot: usize,
}

impl Region {
    /// The first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.addr() as *mut u8
    }

    /// Length in bytes (whole pages).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Always false: regions are never empty.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Put `bytes` bytes at `offset` (page aligned) back as the region's
    /// own, fresh: whatever the program mapped over them (`mmap` with
    /// `MAP_FIXED`) or changed their protection to (`mprotect`) is
    /// replaced by private anonymous memory, readable and writable,
    /// registered again, its pages discarded (they read as zeros).  For a
    /// library that serves a program's mappings from a region and gets one
    /// back (`munmap`).  Small-page regions only.
    pub fn restore(&self, offset: usize, bytes: usize) -> Result<(), PagerError> {
        let huge = self.inner.states()[self.id_base as usize].load().is_unit();
        if huge
            || !offset.is_multiple_of(PAGE_SIZE)
            || !bytes.is_multiple_of(PAGE_SIZE)
            || offset.checked_add(bytes).is_none_or(|end| end > self.len())
        {
            return Err(PagerError::Range {
                offset,
                bytes,
                len: self.len(),
            });
        }
        let addr = self.map.addr() + offset as u64;
        // SAFETY: a range of this region (checked above), replaced by
        // fresh memory: its contents are the caller's to drop, and nothing
        // of uswap's lives there.
        let p = unsafe {
            rustix::mm::mmap_anonymous(
                addr as *mut _,
                bytes,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::PRIVATE | rustix::mm::MapFlags::NORESERVE | rustix::mm::MapFlags::FIXED,
            )
        }
        .map_err(|e| PagerError::Mmap {
            bytes,
            source: e.into(),
        })?;
        debug_assert_eq!(p as u64, addr);
        // Under `mlockall(MCL_FUTURE)` the fresh mapping came locked (and
        // filled): its pages are uswap's to keep in or out.
        // SAFETY: unlocks a range of this region; contents unchanged.
        let _ = unsafe { rustix::mm::munlock(addr as *mut _, bytes) };
        if self.inner.budget().held_for_good() {
            // Plain memory, as the rest of the region is now
            // (`Swap::stop_paging`): fresh, and the kernel's to fill.
            return self.discard(offset, bytes);
        }
        self.inner.uffd().register(
            addr,
            bytes as u64,
            RegisterMode {
                missing: true,
                wp: true,
            },
        )?;
        // Registered, then discarded: a page the kernel filled in before
        // the registration goes too, and every state reads NEVER.
        self.discard(offset, bytes)
    }

    /// Discard `bytes` bytes at `offset` (page aligned): those pages read
    /// as zeros from now on and give up their memory, their slots and
    /// their swap-cache frames.  This is `madvise(MADV_DONTNEED)` for a
    /// region: the plain call drops only what is mapped, and a page uswap
    /// has swapped out or staged would come back with its old contents.
    /// In a `map_huge` region, whole 2 MB units only.
    pub fn discard(&self, offset: usize, bytes: usize) -> Result<(), PagerError> {
        let inner = &self.inner;
        let huge = inner.states()[self.id_base as usize].load().is_unit();
        let unit = if huge { page::UNIT_BYTES } else { PAGE_SIZE };
        if !offset.is_multiple_of(unit)
            || !bytes.is_multiple_of(unit)
            || offset.checked_add(bytes).is_none_or(|end| end > self.len())
        {
            return Err(PagerError::Range {
                offset,
                bytes,
                len: self.len(),
            });
        }
        // The LRU, slot and frame locks taken below are ones a program's
        // signal handler could want too, through a fault.
        let _blocked = signals::SignalsBlocked::asynchronous();
        let _inside = gate::enter(0);
        // A batch of pages at a time: their claims held across one
        // MADV_DONTNEED, so that no eviction moves a page out between the
        // drop and the new state (it would keep the old contents staged).
        const BATCH: usize = 64;
        let first = offset / PAGE_SIZE;
        let end = first + bytes / PAGE_SIZE;
        let mut at = first;
        while at < end {
            let n = (end - at).min(if huge { page::UNIT_PAGES } else { BATCH });
            let step = if huge { page::UNIT_PAGES } else { 1 };
            let mut claims: [Option<page::PageClaim<'_>>; BATCH] = [const { None }; BATCH];
            for (k, i) in (at..at + n).step_by(step).enumerate() {
                let id = self.id_base as usize + i;
                claims[k] = Some(inner.states()[id].wait_claim(|| inner.counters().busy_waits.inc()));
            }
            let addr = self.map.addr() + (at * PAGE_SIZE) as u64;
            // SAFETY: pages of this region whose claims we hold: their
            // contents are being discarded on the program's word.
            if let Err(e) = unsafe { crate::sys::discard_pages(addr, n * PAGE_SIZE) } {
                // Locked (mlock) or not ours any more: nothing changed.
                drop(claims);
                return Err(PagerError::Mmap {
                    bytes: n * PAGE_SIZE,
                    source: e,
                });
            }
            let mut resident = 0;
            let mut gone = [0u32; BATCH];
            let mut ngone = 0;
            for (k, claim) in claims.iter_mut().enumerate() {
                let Some(claim) = claim.take() else {
                    break;
                };
                let id = self.id_base + ((at + k * step) as u32);
                let w = claim.found();
                match (w.kind(), w.is_unit()) {
                    (Kind::Resident, true) => resident += page::UNIT_PAGES,
                    (Kind::Swapped, true) => inner.free_unit_slots(id, w),
                    (Kind::Resident, false) => resident += 1,
                    (Kind::Staged, false) => {
                        inner.budget().free_staged();
                        writeback::drop_staged(inner, w);
                    }
                    _ => {}
                }
                if !w.is_unit() {
                    if let Some(e) = w.slot() {
                        inner.free_slot(e);
                    }
                }
                if w.is(Kind::Resident) {
                    gone[ngone] = id;
                    ngone += 1;
                }
                if !w.is(Kind::Never) {
                    inner.counters().discarded.inc();
                }
                claim.commit(PageWord::NEVER.unit_if(w.is_unit()));
            }
            inner.lru().remove_batch(&gone[..ngone]);
            inner.budget().uncharge(resident);
            at += n;
        }
        Ok(())
    }

    /// Pin `bytes` bytes at `offset` for a system call that will read them
    /// (`write` false: `write(2)`, `send`) or store into them (`write`
    /// true: `read(2)`, `recv`): every page is brought in (and made
    /// writable, when the kernel is to store into it) and is not evicted
    /// until the returned guard drops.  The kernel's own accesses to such
    /// pages then find them there: in SIGBUS mode a system call that met a
    /// missing or write-protected page of a region would fail with
    /// `EFAULT`.  Pages are brought in by touching them from this thread,
    /// as the program would (a read, or a compare-exchange of a byte with
    /// itself, which changes nothing); a page evicted between its touch and its pin is
    /// touched again.  Small-page regions only.
    ///
    /// A page the program itself dropped with a plain `madvise`
    /// (`MADV_DONTNEED`, not [`Region::discard`]) still counts as resident
    /// until a fault or an eviction finds it gone, and so is not brought
    /// back by a pin.
    pub fn pin(&self, offset: usize, bytes: usize, write: bool) -> Result<Pinned<'_>, PagerError> {
        let inner = &self.inner;
        let huge = inner.states()[self.id_base as usize].load().is_unit();
        let end = offset.checked_add(bytes).filter(|&e| e <= self.len() && !huge);
        let Some(end) = end else {
            return Err(PagerError::Range {
                offset,
                bytes,
                len: self.len(),
            });
        };
        let first = offset / PAGE_SIZE;
        let last = end.div_ceil(PAGE_SIZE);
        if inner.budget().held_for_good() {
            // Nothing goes out any more and the kernel serves every fault
            // (`Swap::stop_paging`): nothing to pin, and the page states
            // no longer follow the pages (one never written stays `Never`
            // after the kernel fills it), so none is waited for.
            return Ok(Pinned {
                region: self,
                first,
                last: first,
                epoch: inner.pin_epoch(),
            });
        }
        for p in first..last {
            let id = self.id_base as usize + p;
            let addr = self.as_ptr() as usize + p * PAGE_SIZE;
            loop {
                inner.pins()[id].fetch_add(1, Ordering::Relaxed);
                // Pairs with the fence in `Inner::pinned`: an evictor that
                // claimed the page before this sees the pin, or this sees
                // its claim (BUSY) and lets go.
                std::sync::atomic::fence(Ordering::SeqCst);
                let w = inner.states()[id].load();
                // Writable for the kernel: dirty, and not sealed (a page
                // that came back from a compressed device dirty but
                // write-protected: the kernel's write would fail with
                // EFAULT in SIGBUS mode; the touch below unprotects it).
                let writable = w.is_dirty() && !w.is_sealed();
                if w.is(Kind::Resident) && !w.is_busy() && (!write || writable) {
                    break;
                }
                inner.pins()[id].fetch_sub(1, Ordering::Release);
                // SAFETY: a byte of this region, mapped for the region's
                // life; a volatile read, or a compare-exchange of the byte
                // with itself, faults the page in as the program's own
                // access would.  The exchange writes (a locked
                // compare-exchange is a write access even when it fails,
                // and a racing writer's store is never lost); an atomic
                // add of zero would not: LLVM turns such an idempotent
                // update into a fenced load on x86.
                unsafe {
                    if write {
                        let b = std::sync::atomic::AtomicU8::from_ptr(addr as *mut u8);
                        let v = b.load(Ordering::Relaxed);
                        let _ = b.compare_exchange(v, v, Ordering::Relaxed, Ordering::Relaxed);
                    } else {
                        std::ptr::read_volatile(addr as *const u8);
                    }
                }
            }
        }
        Ok(Pinned {
            region: self,
            first,
            last,
            epoch: inner.pin_epoch(),
        })
    }

    /// The region as bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping lives as long as `self`; every byte is
        // readable (missing pages fault in); shared access only reads.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len()) }
    }

    /// The region as mutable bytes.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.as_ptr(), self.len()) }
    }
}

impl Region {
    /// The slot page `index` of this region is on, when it has one (for
    /// tests of the error paths).
    #[doc(hidden)]
    pub fn slot_of(&self, index: usize) -> Option<crate::swap_space::SwapEntry> {
        self.inner.states()[self.id_base as usize + index].load().slot()
    }

    /// Whether page `index` is resident.
    pub fn is_resident(&self, index: usize) -> bool {
        self.inner.states()[self.id_base as usize + index]
            .load()
            .is(Kind::Resident)
    }

    /// Whether page `index` is soft-evicted: in the swap cache, not yet
    /// written back (a touch costs no IO).
    pub fn is_staged(&self, index: usize) -> bool {
        self.inner.states()[self.id_base as usize + index]
            .load()
            .is(Kind::Staged)
    }
}

/// Pages of a region pinned by [`Region::pin`]; unpinned on drop.
#[must_use = "the pages are unpinned when this drops"]
pub struct Pinned<'a> {
    region: &'a Region,
    first: usize,
    last: usize,
    /// The instance's pin epoch when taken: a forked child that adopted
    /// the instance since has dropped these pins already.
    epoch: u32,
}

impl Drop for Pinned<'_> {
    fn drop(&mut self) {
        unpin(self.region, self.first, self.last, self.epoch);
    }
}

/// Pages of a shared region pinned by [`Region::pin_shared`]: a
/// [`Pinned`] that holds its region instead of borrowing it, for a binding
/// whose pin and region are separate objects (Python's `Region.pin`).
#[must_use = "the pages are unpinned when this drops"]
pub struct PinnedShared {
    region: Arc<Region>,
    first: usize,
    last: usize,
    epoch: u32,
}

impl Drop for PinnedShared {
    fn drop(&mut self) {
        unpin(&self.region, self.first, self.last, self.epoch);
    }
}

/// Let go of one pin on each of pages `first..last` of `region`, taken
/// in pin epoch `epoch`.  A pin of an earlier epoch is a forked child's
/// copy of one its parent took: the child dropped its count when it
/// adopted the instance, and taking it off again would take another
/// holder's (or wrap the count, pinning the page for good).
fn unpin(region: &Region, first: usize, last: usize, epoch: u32) {
    if region.inner.pin_epoch() != epoch {
        return;
    }
    for p in first..last {
        region.inner.pins()[region.id_base as usize + p].fetch_sub(1, Ordering::Release);
    }
}

impl Region {
    /// [`pin`](Self::pin), the guard holding the region alive.
    pub fn pin_shared(
        self: &Arc<Self>,
        offset: usize,
        bytes: usize,
        write: bool,
    ) -> Result<PinnedShared, PagerError> {
        let pinned = self.pin(offset, bytes, write)?;
        let (first, last, epoch) = (pinned.first, pinned.last, pinned.epoch);
        // The pins are handed over to the shared guard, which lets them go.
        std::mem::forget(pinned);
        Ok(PinnedShared {
            region: Arc::clone(self),
            first,
            last,
            epoch,
        })
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        let inner = &self.inner;
        if !inner.same_process() {
            // A child that did not adopt the instance (a raw `clone`):
            // the page states, slots and registration are the parent's
            // (the inherited descriptor acts on the parent's memory).
            // Leave it all.
            return;
        }
        // The LRU, slot and frame locks taken below are ones a program's
        // signal handler could want too, through a fault.
        let _blocked = signals::SignalsBlocked::asynchronous();
        let _inside = gate::enter(0);
        regions::unpublish_region(self.slot);
        // Take every page out of circulation, waiting out transitions in
        // flight (a reclaimer may be writing one of them out).
        let mut resident = 0;
        // Pages leave the LRU a batch at a time, one lock acquisition per
        // batch (`release_pages`).  A dead page still on the LRU meanwhile
        // is harmless: reclaim skips what is not resident.
        let mut gone = [0u32; 64];
        let mut ngone = 0;
        for i in 0..self.pages {
            let id = self.id_base as usize + i;
            let claim = inner.states()[id].wait_claim(|| inner.counters().busy_waits.inc());
            let w = claim.found();
            claim.commit(PageWord::of(Kind::Dead));
            gone[ngone] = id as u32;
            ngone += 1;
            if ngone == gone.len() {
                inner.lru().remove_batch(&gone);
                ngone = 0;
            }
            if w.is_unit() {
                match w.kind() {
                    Kind::Resident => resident += page::UNIT_PAGES,
                    Kind::Swapped => inner.free_unit_slots(id as u32, w),
                    _ => {}
                }
                continue;
            }
            match w.kind() {
                Kind::Resident => resident += 1,
                Kind::Staged => {
                    inner.budget().free_staged();
                    writeback::drop_staged(inner, w);
                }
                _ => {}
            }
            if let Some(e) = w.slot() {
                inner.free_slot(e);
            }
        }
        inner.addrs().clear(self.id_base, self.pages);
        inner.lru().remove_batch(&gone[..ngone]);
        inner.budget().uncharge(resident);
        if !self.still_mapped_here() {
            // The program unmapped (part of) the region and something else
            // sits in its range now: that is not ours to unmap.
            report::once(
                &inner.reports().not_ours,
                format_args!(
                    "uswap: the region at {:#x} was unmapped or replaced by the program before it was dropped; uswap leaves that address range alone",
                    self.map.addr()
                ),
            );
            self.map.forget();
        }
        inner.free_ids(
            self.id_base,
            self.pages.next_multiple_of(addrs::CHUNK) as u32,
            self.pages,
        );
        inner.release_user();
        // The mapping itself is unmapped, registration and all, when
        // `self.map` drops.
    }
}

impl Region {
    /// Whether everything mapped in this region's range is still this
    /// region: no other region overlaps it, and every mapping in it is
    /// registered for write-protect faults (a mapping the program put
    /// there is not).  Write-protecting the range asks exactly that of
    /// the kernel, and is harmless to pages about to be unmapped.
    fn still_mapped_here(&self) -> bool {
        let (addr, len) = (self.map.addr(), self.map.len() as u64);
        if regions::overlaps_a_region(addr, len) {
            return false;
        }
        // An instance that stopped paging registers nothing any more
        // (`Swap::stop_paging`): the kernel cannot be asked, and the range
        // is taken for the region's.
        self.inner.budget().held_for_good() || self.inner.uffd().writeprotect(addr, len, true, false).is_ok()
    }
}

// SAFETY: a Region is plain memory plus an Arc; concurrent access to the
// bytes is governed by the borrows `as_slice`/`as_mut_slice` hand out.
unsafe impl Send for Region {}

// SAFETY: as above; `&Region` only reads.
unsafe impl Sync for Region {}
