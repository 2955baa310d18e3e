//! Clusters and the lists that sort them.
//!
//! A cluster is 512 consecutive slots: one 2 MB huge unit, and the unit in
//! which a device hands slots to CPUs.  Every cluster sits on exactly one of
//! four lists, and which one is a function of its count (the slots in it
//! that are not free, counting the header and bad slots):
//!
//! - `Free`: count == 0; a whole cluster is available (huge units and new
//!   per-CPU clusters come from here).
//! - `Nonfull`: 0 < count < 512, and a slot of it was freed since a CPU
//!   last took it as its current cluster (oldest first).
//! - `Frag`: 0 < count < 512, handed to a CPU as its current cluster and
//!   not freed into since: what free slots it has are the few that CPU
//!   left, so it is tried only after the nonfull ones (kernel 6.12's
//!   `frag_clusters`).
//! - `Full`: count == 512.
//!
//! The lists are intrusive (`index_list.rs`: links in arrays indexed by
//! cluster number), so moving a cluster is O(1) and never allocates.  They are protected by the
//! device lock.

/// Slots per cluster: one 2 MB unit of 4 KiB pages (`SWAPFILE_CLUSTER`).
pub const CLUSTER_SLOTS: u64 = 512;

use crate::index_list::{IndexLists, NIL};
use crate::table::{self, TableError};

/// Which list a cluster is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ListId {
    Free = 0,
    Nonfull = 1,
    Frag = 2,
    Full = 3,
}

impl ListId {
    pub const ALL: [ListId; 4] = [ListId::Free, ListId::Nonfull, ListId::Frag, ListId::Full];
}

/// The four cluster lists of one device, sharing one set of link arrays,
/// and which list each cluster is on.
///
/// The clusters of `implicit` have never left the free list since the
/// device was made: they are its tail, in index order, and nothing is
/// written for them (links and list ids read zero: no list).  A device
/// of 8,192 clusters (the default 16 GiB swap file) wrote 72 KiB of
/// links and ids when made, in every process of a tree; now each
/// cluster's are written when it first moves.  The range shrinks from
/// its front as allocation takes clusters in order, and from its back
/// for the last cluster, which a device whose size is not a whole
/// number of clusters moves off the free list when it is made (it holds
/// the slots past the end, marked bad): taking it from the back links
/// nothing, where linking up to it would write every cluster's links.
/// The lists then hold exactly what they held with every cluster linked
/// at start.
pub struct ClusterLists {
    lists: IndexLists<4>,
    /// The list of each cluster outside `implicit` (a `ListId`).
    on: Box<[u8]>,
    implicit: std::ops::Range<u32>,
    /// A cluster that becomes free goes to the head of the free list, not
    /// its tail (a compact device: `SlotDeviceConfig::compact`), so that
    /// the clusters never used stay behind, in index order.
    freed_first: bool,
}

impl ClusterLists {
    /// `n` clusters, all on the `Free` list in index order (callers move the
    /// ones that are not free).
    pub fn new(n: u32) -> Result<Self, TableError> {
        Ok(ClusterLists {
            lists: IndexLists::new_lazy(n as usize, "cluster lists")?,
            on: table::zeroed(n as usize, "cluster lists")?,
            implicit: 0..n,
            freed_first: false,
        })
    }

    /// Link the implicit clusters up to `c` (included) at the free
    /// list's tail, where they are, in order.
    fn link_through(&mut self, c: u32) {
        while self.implicit.start <= c && !self.implicit.is_empty() {
            let i = self.implicit.start;
            self.lists.push_tail(ListId::Free as usize, i);
            self.on[i as usize] = ListId::Free as u8;
            self.implicit.start += 1;
        }
    }

    /// The list cluster `c` is on.
    #[inline]
    pub fn list_of(&self, c: u32) -> ListId {
        if self.implicit.contains(&c) {
            return ListId::Free;
        }
        ListId::ALL[self.on[c as usize] as usize]
    }

    /// The first cluster of `list`.
    #[inline]
    pub fn head(&self, list: ListId) -> Option<u32> {
        match self.lists.head(list as usize) {
            None if list == ListId::Free && !self.implicit.is_empty() => Some(self.implicit.start),
            h => h,
        }
    }

    /// Clusters on `list`.
    #[inline]
    pub fn len(&self, list: ListId) -> u32 {
        let implicit = if list == ListId::Free {
            self.implicit.len() as u32
        } else {
            0
        };
        self.lists.len(list as usize) as u32 + implicit
    }

    /// Move `c` to the tail of `to` (a no-op relink when already there
    /// moves it to the tail, which rotates a list).
    pub fn move_tail(&mut self, c: u32, to: ListId) {
        if to != ListId::Free && self.implicit.len() > 1 && c == self.implicit.end - 1 {
            // The free list's last cluster: it leaves the range's back.
            self.implicit.end -= 1;
        } else {
            // The free list's tail is past its implicit clusters.
            let through = if to == ListId::Free { u32::MAX } else { c };
            self.link_through(through);
            self.lists.unlink(self.on[c as usize] as usize, c);
        }
        self.lists.push_tail(to as usize, c);
        self.on[c as usize] = to as u8;
    }

    /// Clusters freed from now on are taken again before the rest.
    pub fn set_freed_first(&mut self, on: bool) {
        self.freed_first = on;
    }

    /// Move `c` to `to` unless it is already on it (keeps its position):
    /// to the tail, or, freed on a compact device, to the head.
    #[inline]
    pub fn move_to(&mut self, c: u32, to: ListId) {
        let from = self.list_of(c);
        if from != to {
            if to == ListId::Free && self.freed_first {
                // Not free, so linked (outside `implicit`).
                self.lists.unlink(from as usize, c);
                self.lists.push_head(to as usize, c);
                self.on[c as usize] = to as u8;
            } else {
                self.move_tail(c, to);
            }
        }
    }

    /// Iterate over the clusters of `list`, head first.
    pub fn iter(&self, list: ListId) -> impl Iterator<Item = u32> + '_ {
        let implicit = if list == ListId::Free {
            self.implicit.clone()
        } else {
            0..0
        };
        self.lists.iter(list as usize).chain(implicit)
    }

    /// Check that every list is well formed and the membership array agrees
    /// with the links.
    pub fn check(&self) -> Result<(), String> {
        let mut seen = vec![false; self.on.len()];
        for list in ListId::ALL {
            self.lists
                .check(list as usize, |c| {
                    if std::mem::replace(&mut seen[c as usize], true) {
                        return Err(format!("cluster {c} reached twice walking the lists"));
                    }
                    if self.implicit.contains(&c) {
                        return Err(format!("cluster {c} linked, inside the implicit {:?}", self.implicit));
                    }
                    if self.list_of(c) != list {
                        return Err(format!("cluster {c} linked on {list:?} but marked {:?}", self.list_of(c)));
                    }
                    Ok(())
                })
                .map_err(|e| format!("{list:?}: {e}"))?;
        }
        for c in self.implicit.clone() {
            seen[c as usize] = true;
            if self.lists.next(c) != NIL || self.lists.prev(c) != NIL {
                return Err(format!("implicit cluster {c} has links"));
            }
        }
        if let Some(c) = seen.iter().position(|s| !s) {
            return Err(format!("cluster {c} is on no list"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_keep_lists_consistent() {
        let mut l = ClusterLists::new(5).unwrap();
        assert_eq!(l.len(ListId::Free), 5);
        assert_eq!(l.head(ListId::Free), Some(0));
        l.move_to(0, ListId::Full);
        l.move_to(3, ListId::Nonfull);
        l.move_to(3, ListId::Nonfull);
        l.move_to(4, ListId::Frag);
        l.check().unwrap();
        assert_eq!(l.iter(ListId::Free).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(l.list_of(3), ListId::Nonfull);
        // Rotation: moving the head to the tail of its own list.
        l.move_tail(1, ListId::Free);
        assert_eq!(l.iter(ListId::Free).collect::<Vec<_>>(), vec![2, 1]);
        l.move_to(2, ListId::Full);
        l.move_to(1, ListId::Full);
        assert_eq!(l.head(ListId::Free), None);
        assert_eq!(l.iter(ListId::Full).collect::<Vec<_>>(), vec![0, 2, 1]);
        l.check().unwrap();
    }

    /// A device made with its first and last clusters partly used links
    /// those two and no other: the rest stay implicit, in order.
    #[test]
    fn a_new_device_links_only_its_ends() {
        let n = 8192;
        let mut l = ClusterLists::new(n).unwrap();
        l.move_to(0, ListId::Nonfull);
        l.move_to(n - 1, ListId::Nonfull);
        assert_eq!(l.implicit, 1..n - 1);
        assert_eq!(l.iter(ListId::Nonfull).collect::<Vec<_>>(), vec![0, n - 1]);
        assert_eq!(l.head(ListId::Free), Some(1));
        assert_eq!(l.len(ListId::Free), n - 2);
        l.check().unwrap();
    }

    /// Every list kept in full, in order: what the lists were when every
    /// cluster was linked at start.
    struct Model {
        lists: [Vec<u32>; 4],
        freed_first: bool,
    }

    impl Model {
        fn list_of(&self, c: u32) -> ListId {
            ListId::ALL[self.lists.iter().position(|l| l.contains(&c)).unwrap()]
        }
        fn take(&mut self, c: u32) {
            let l = &mut self.lists[self.list_of(c) as usize];
            l.retain(|&x| x != c);
        }
        fn move_tail(&mut self, c: u32, to: ListId) {
            self.take(c);
            self.lists[to as usize].push(c);
        }
        fn move_to(&mut self, c: u32, to: ListId) {
            if self.list_of(c) == to {
                return;
            }
            if to == ListId::Free && self.freed_first {
                self.take(c);
                self.lists[to as usize].insert(0, c);
            } else {
                self.move_tail(c, to);
            }
        }
    }

    proptest::proptest! {
        /// The lists with their implicit tail against the model of every
        /// cluster linked at start, under any moves, on a device that
        /// grows (freed clusters first) or not: each cluster's list, each
        /// list's head, length and order, and the links' own check.
        #[test]
        fn implicit_free_clusters_match_a_fully_linked_model(
            n in 1u32..40,
            freed_first in proptest::bool::ANY,
            made_as_a_device in proptest::bool::ANY,
            ops in proptest::collection::vec((proptest::bool::ANY, 0u32..40, 0usize..4), 0..120),
        ) {
            let mut l = ClusterLists::new(n).unwrap();
            l.set_freed_first(freed_first);
            let mut m = Model { lists: [(0..n).collect(), vec![], vec![], vec![]], freed_first };
            // As `SlotDevice::new` does: the header's cluster and the
            // last (the slots past the end) are partly used.
            let made = if made_as_a_device { vec![0, n - 1] } else { vec![] };
            let made = made.into_iter().map(|c| (false, c, ListId::Nonfull as usize));
            for (tail, c, to) in made.chain(ops) {
                let (c, to) = (c % n, ListId::ALL[to]);
                if tail {
                    l.move_tail(c, to);
                    m.move_tail(c, to);
                } else {
                    l.move_to(c, to);
                    m.move_to(c, to);
                }
                for list in ListId::ALL {
                    let want = &m.lists[list as usize];
                    proptest::prop_assert_eq!(&l.iter(list).collect::<Vec<_>>(), want);
                    proptest::prop_assert_eq!(l.len(list) as usize, want.len());
                    proptest::prop_assert_eq!(l.head(list), want.first().copied());
                }
                for k in 0..n {
                    proptest::prop_assert_eq!(l.list_of(k), m.list_of(k));
                }
                proptest::prop_assert_eq!(l.check(), Ok(()));
            }
        }
    }
}
