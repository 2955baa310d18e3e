//! Swap slots as the instance takes and gives them: allocated from the
//! swap space, freed (with the notice a store wants, zram's
//! `swap_slot_free_notify`), held for a forked child, split out of a 2 MB
//! unit's run.

use std::sync::atomic::Ordering;

use crate::pager::instance::page::{Kind, PageWord, UNIT_PAGES};
use crate::pager::instance::staged;
use crate::swap_space::SwapEntry;

use crate::pager::instance::inner::Inner;

impl Inner {
    /// Free slot `e`.  Every slot the pager frees is one it allocated and
    /// holds one reference to, so a refusal is a bookkeeping bug.  Around
    /// a fork (fork.rs): a slot on a swap file that a child may still read
    /// waits for the child; a forked child leaves the swap files' slots to
    /// its parent.
    pub fn free_slot(&self, e: SwapEntry) {
        if self.parents_slot(e) || self.backing().hold.defer(e, false) {
            return;
        }
        self.notify_if_last(e, 1);
        let freed = self.backing().space.free(e);
        debug_assert!(freed.is_ok(), "freeing {e:?}: {freed:?}");
    }

    /// Before the last reference to slots `e..e + pages` goes, let a
    /// device that keeps memory per slot (compressed) drop it, and an
    /// encrypted file forget the slot's seal (its block is then noise to
    /// everyone: how freed slots are scrubbed): before, so that no one
    /// has the slot allocated again meanwhile.  A slot still
    /// referenced elsewhere (a forked child's share) keeps its page.
    fn notify_if_last(&self, e: SwapEntry, pages: u64) {
        let dev = &self.backing().devices[e.device() as usize];
        if !dev.wants_slot_freed() {
            return;
        }
        for off in e.offset()..e.offset() + pages {
            let slot = SwapEntry::new(e.device(), off);
            if self.backing().space.count(slot) == Ok(1) {
                dev.slot_freed(off, 1);
            }
        }
    }

    /// Free the whole cluster of a 2 MB unit, as `free_slot` does a slot.
    pub fn free_huge(&self, e: SwapEntry) {
        if self.parents_slot(e) || self.backing().hold.defer(e, true) {
            return;
        }
        self.notify_if_last(e, crate::swap_space::CLUSTER_SLOTS);
        let freed = self.backing().space.free_huge(e);
        debug_assert!(freed.is_ok(), "freeing unit {e:?}: {freed:?}");
    }

    /// Whether `e` is a swap-file slot of this forked child's parent
    /// (all of them until the child has files of its own; then those it
    /// did not write there), which the child never frees.
    fn parents_slot(&self, e: SwapEntry) -> bool {
        let d = &self.backing().devices[e.device() as usize];
        d.has_file() && (self.backing().closed.load(Ordering::Relaxed) || !d.owns(e.offset()))
    }

    /// In a forked child whose swap files are its parent's and that has
    /// pages to swap out: make it files of its own, and open allocation
    /// (io/file.rs, "A forked child's files of its own").  Once: a
    /// failure (no room for the files) is said in one line, and the
    /// child's dirty pages stay resident as before.  From the reclaimer,
    /// never the fault path: it creates files and allocates.
    pub fn open_layers(&self) {
        if self.backing().layers_tried.swap(true, Ordering::Relaxed) {
            return;
        }
        if !self.backing().layerable.load(Ordering::Relaxed) {
            // Too many generations deep, or a swap file that is not a
            // regular file: none can be made, and writeback stays held.
            self.registry().event(crate::stats::EventKind::ChildFileFailed, 0);
            crate::pager::instance::report::line(format_args!(
                "uswap: a forked child more than {} forks deep, or on swap that is not a regular file, cannot have swap files of its own; its memory stays resident",
                crate::io::MAX_LAYERS
            ));
            return;
        }
        for d in self.backing().devices.iter().filter(|d| d.has_file()) {
            if let Err(e) = d.open_layer() {
                self.registry().event(crate::stats::EventKind::ChildFileFailed, 0);
                crate::pager::instance::report::line(format_args!(
                    "uswap: a forked child cannot make a swap file of its own ({e}); its memory stays resident"
                ));
                // Faults waiting for it (reclaim.rs's `hold_to_bound`) go on.
                self.backing().layerable.store(false, Ordering::Release);
                return;
            }
        }
        self.backing().closed.store(false, Ordering::Release);
    }

    /// A slot for a page going out; `Full` in a forked child whose
    /// swap files are its parent's.
    pub fn alloc_slot(&self) -> Result<SwapEntry, crate::swap_space::SwapError> {
        if self.backing().closed.load(Ordering::Relaxed) {
            return Err(crate::swap_space::SwapError::Full {
                slots: self.backing().space.total_slots(),
            });
        }
        let e = self.backing().space.alloc()?;
        self.backing().devices[e.device() as usize].allocated(e.offset(), 1);
        Ok(e)
    }

    /// A whole cluster for a 2 MB unit, as `alloc_slot`.
    pub fn alloc_unit_slots(&self) -> Result<SwapEntry, crate::swap_space::SwapError> {
        if self.backing().closed.load(Ordering::Relaxed) {
            return Err(crate::swap_space::SwapError::Full {
                slots: self.backing().space.total_slots(),
            });
        }
        let e = self.backing().space.alloc_huge()?;
        self.backing().devices[e.device() as usize].allocated(e.offset(), crate::swap_space::CLUSTER_SLOTS);
        Ok(e)
    }

    /// Whether no slot is to be had for a page going out.
    pub fn no_free_slots(&self) -> bool {
        self.backing().closed.load(Ordering::Relaxed) || self.backing().space.nr_free() == 0
    }

    /// The staging frame a staged page's slot `e` holds (claimed by the
    /// caller, so the entry is there).
    pub fn staged_frame(&self, e: SwapEntry) -> u32 {
        let h = self
            .backing()
            .swap_cache
            .lookup(e)
            .expect("a staged page is in the swap cache");
        staged::frame(h)
    }

    /// The slot of page `i` of a split unit whose head word is `w`.
    pub fn split_slot(&self, head: u32, i: usize, w: PageWord) -> SwapEntry {
        // The head's own word is claimed by the caller (its slot is in `w`);
        // the others hold only their slots.
        let word = if i == 0 {
            w
        } else {
            self.states()[head as usize + i].load()
        };
        word.slot().expect("a split unit has a slot per page")
    }

    /// Free the slots of swapped unit `head` (state `w`).
    pub fn free_unit_slots(&self, head: u32, w: PageWord) {
        if !w.is(Kind::Swapped) {
            return;
        }
        if w.is_whole() {
            if let Some(e) = w.slot() {
                self.free_huge(e);
            }
            return;
        }
        for i in 0..UNIT_PAGES {
            let word = if i == 0 {
                w
            } else {
                self.states()[head as usize + i].load()
            };
            if let Some(e) = word.slot() {
                self.free_slot(e);
            }
            if i > 0 {
                self.states()[head as usize + i].store(PageWord::NEVER);
            }
        }
    }
}
