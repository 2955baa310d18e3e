//! What reclaim asks of the LRU (mm/vmscan.c): the inactive list shrunk
//! for victims, a referenced page given its second chance
//! (`shrink_inactive_list`), the active list aged (`shrink_active_list`);
//! and the counts and the invariant check that read the lists.

use std::sync::atomic::Ordering;


use crate::index_list::NIL;
use super::lists::*;

impl Lru {
    /// `shrink_inactive_list`: drain all batches, then scan up to
    /// `nr_to_scan` pages from the inactive tail.  A referenced page gets a
    /// second chance (bit cleared, moved to the active head); an
    /// unreferenced page is isolated (leaves the LRU) and written to
    /// `victims`.  Scanning stops early when `victims` is full or the
    /// inactive list is empty.  Returns the number isolated.
    pub fn shrink_inactive(&self, nr_to_scan: usize, victims: &mut [PageId]) -> usize {
        self.drain_all();
        self.shrink_inactive_drained(nr_to_scan, victims)
    }

    /// [`Lru::shrink_inactive`] draining only the calling CPU's batches,
    /// as the kernel's reclaim does (`lru_add_drain`, not `_all`): draining
    /// every CPU's batch on every reclaim pass would flush them a page or
    /// two at a time and undo seed 002's batching.  Pages still in other
    /// CPUs' batches are not seen; a caller that finds nothing should
    /// fall back to [`Lru::shrink_inactive`].
    pub fn shrink_inactive_local(&self, nr_to_scan: usize, victims: &mut [PageId]) -> usize {
        self.drain_local();
        self.shrink_inactive_drained(nr_to_scan, victims)
    }

    fn shrink_inactive_drained(&self, nr_to_scan: usize, victims: &mut [PageId]) -> usize {
        let mut l = self.lists.lock();
        let (mut isolated, mut rotated, mut scanned) = (0, 0u64, 0);
        while scanned < nr_to_scan && isolated < victims.len() {
            let Some(page) = l.tail(INACTIVE_LIST) else {
                break;
            };
            scanned += 1;
            let old = self
                .word(page)
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |x| {
                    Some(if x & REFERENCED != 0 {
                        (x & !REFERENCED) | ACTIVE
                    } else {
                        departed(x)
                    })
                })
                .expect("closure always updates");
            l.unlink(INACTIVE_LIST, page);
            if old & REFERENCED != 0 {
                l.push_head(ACTIVE_LIST, page);
                rotated += 1;
            } else {
                victims[isolated] = page;
                isolated += 1;
                if self.neighbours > 1 {
                    isolated += self.isolate_neighbours(&mut l, page, &mut victims[isolated..]);
                }
            }
        }
        self.publish(&l);
        drop(l);
        self.counters.rotated.add(rotated);
        self.counters.isolated.add(isolated as u64);
        isolated
    }

    /// Isolate the cold neighbours of victim `page` into `out`: the pages
    /// of its aligned window ([`LruConfig::neighbours`]) on the inactive
    /// list with no reference and nothing queued, as cold as the victim
    /// by all the LRU knows.  Why: user space has no batched unmap, and a
    /// scattered dirty victim costs the pager a TLB flush of its own, a
    /// cross-CPU shootdown whenever another CPU runs the program (10-12 us
    /// on this machine kind, against 0.9); neighbours go out together, a
    /// run per `UFFDIO_MOVE` and one flush for it, as the kernel's large
    /// folios go out whole.  The check and the isolation are one
    /// compare-and-swap of the page's word under the LRU lock, so a
    /// reference or a queued activation that lands first keeps the page.
    /// Returns how many were isolated.
    fn isolate_neighbours(&self, l: &mut Lists, page: PageId, out: &mut [PageId]) -> usize {
        let first = page & !(self.neighbours - 1);
        let end = first.saturating_add(self.neighbours).min(self.capacity);
        let mut n = 0;
        for nb in first..end {
            if n == out.len() {
                break;
            }
            if nb == page {
                continue;
            }
            let cold = self
                .word(nb)
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |x| {
                    (x & (LRU | ACTIVE | REFERENCED | ADD_QUEUED | ACT_QUEUED | DEACT_QUEUED) == LRU)
                        .then(|| departed(x))
                })
                .is_ok();
            if cold {
                l.unlink(INACTIVE_LIST, nb);
                out[n] = nb;
                n += 1;
            }
        }
        n
    }

    /// `shrink_active_list`: drain all batches, then scan up to
    /// `nr_to_scan` pages (at most the active list's length, so each page
    /// once) from the active tail.  A referenced page has its bit cleared
    /// and rotates to the active head; an unreferenced one moves to the
    /// inactive head.  Returns the pages deactivated.
    pub fn age_active(&self, nr_to_scan: usize) -> usize {
        self.drain_all();
        let mut l = self.lists.lock();
        let n = nr_to_scan.min(l.len(ACTIVE_LIST));
        let (mut rotated, mut deactivated) = (0u64, 0usize);
        for _ in 0..n {
            let page = l
                .tail(ACTIVE_LIST)
                .expect("n is at most the active list's length");
            let old = self
                .word(page)
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |x| {
                    Some(if x & REFERENCED != 0 {
                        x & !REFERENCED
                    } else {
                        x & !ACTIVE
                    })
                })
                .expect("closure always updates");
            l.unlink(ACTIVE_LIST, page);
            if old & REFERENCED != 0 {
                l.push_head(ACTIVE_LIST, page);
                rotated += 1;
            } else {
                l.push_head(INACTIVE_LIST, page);
                deactivated += 1;
            }
        }
        self.publish(&l);
        drop(l);
        self.counters.rotated.add(rotated);
        self.counters.deactivate.add(deactivated as u64);
        deactivated
    }

    /// Pages on the active list (batched operations not yet drained are
    /// not counted).
    pub fn nr_active(&self) -> usize {
        self.nr[ACTIVE_LIST].load(Ordering::Relaxed)
    }

    /// Pages on the inactive list.
    pub fn nr_inactive(&self) -> usize {
        self.nr[INACTIVE_LIST].load(Ordering::Relaxed)
    }

    /// Whether the page is on the active list.
    pub fn is_active(&self, page: PageId) -> bool {
        self.word(page).load(Ordering::Acquire) & (LRU | ACTIVE) == LRU | ACTIVE
    }

    /// Whether the page is on one of the lists (a page still waiting in an
    /// add batch is not yet; see [`Lru::is_resident`]).
    pub fn on_lru(&self, page: PageId) -> bool {
        self.word(page).load(Ordering::Acquire) & LRU != 0
    }

    /// Whether the page is on or queued for the LRU.
    pub fn is_resident(&self, page: PageId) -> bool {
        self.word(page).load(Ordering::Acquire) & (LRU | ADD_QUEUED) != 0
    }

    /// Whether the page's referenced bit is set.
    pub fn is_referenced(&self, page: PageId) -> bool {
        self.word(page).load(Ordering::Acquire) & REFERENCED != 0
    }

    /// Quiescent consistency check (drains first): both lists well formed
    /// (links agree, no cycles, lengths match the counts), every page's
    /// flags match its list membership, no page on both lists, no page
    /// left queued.  Allocates; not for hot paths.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.drain_all();
        let l = self.lists.lock();
        let cap = self.capacity as usize;
        let mut seen = vec![u8::MAX; cap];
        for (list, name) in [(INACTIVE_LIST, "inactive"), (ACTIVE_LIST, "active")] {
            let n = l
                .check(list, |page| {
                    let p = page as usize;
                    if seen[p] != u8::MAX {
                        return Err(format!("page {page} linked twice (second time on {name})"));
                    }
                    seen[p] = list as u8;
                    let w = self.pages[p].load(Ordering::Acquire);
                    // After a drain no request is pending: every queued
                    // entry was applied (clearing its flag) or found stale.
                    if w & LRU == 0 || w & (ADD_QUEUED | ACT_QUEUED | DEACT_QUEUED) != 0 || list_of(w) != list
                    {
                        return Err(format!(
                            "page {page} on the {name} list has flags {:#x}",
                            w & FLAGS
                        ));
                    }
                    Ok(())
                })
                .map_err(|e| format!("{name} {e}"))?;
            let published = self.nr[list].load(Ordering::Relaxed);
            if published != n {
                return Err(format!("{name} list: published length {published} but {n} nodes"));
            }
        }
        for (p, &s) in seen.iter().enumerate() {
            if s != u8::MAX {
                continue;
            }
            let w = self.pages[p].load(Ordering::Acquire);
            if w & FLAGS != 0 {
                return Err(format!(
                    "page {p} on no list has flags {:#x}{}",
                    w & FLAGS,
                    if w & ADD_QUEUED != 0 {
                        " (queued for add after a drain: lost)"
                    } else {
                        ""
                    }
                ));
            }
            if l.prev(p as u32) != NIL || l.next(p as u32) != NIL {
                return Err(format!("page {p} on no list has links"));
            }
        }
        Ok(())
    }

    /// The lists, head first (drains first).  For tests.
    #[cfg(test)]
    pub(super) fn lists_snapshot(&self) -> (Vec<PageId>, Vec<PageId>) {
        self.drain_all();
        let l = self.lists.lock();
        let walk = |list: usize| l.iter(list).collect::<Vec<_>>();
        (walk(INACTIVE_LIST), walk(ACTIVE_LIST))
    }
}
