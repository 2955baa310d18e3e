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

use crate::index_list::IndexLists;

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
pub struct ClusterLists {
    lists: IndexLists<4>,
    on: Box<[ListId]>,
    /// A cluster that becomes free goes to the head of the free list, not
    /// its tail (a device that grows: `SlotDeviceConfig::grows`), so that
    /// the clusters never used stay behind, in index order.
    freed_first: bool,
}

impl ClusterLists {
    /// `n` clusters, all on the `Free` list in index order (callers move the
    /// ones that are not free).
    pub fn new(n: u32) -> Self {
        let mut l = ClusterLists {
            lists: IndexLists::new(n as usize),
            on: vec![ListId::Free; n as usize].into_boxed_slice(),
            freed_first: false,
        };
        for c in 0..n {
            l.lists.push_tail(ListId::Free as usize, c);
        }
        l
    }

    /// The list cluster `c` is on.
    #[inline]
    pub fn list_of(&self, c: u32) -> ListId {
        self.on[c as usize]
    }

    /// The first cluster of `list`.
    #[inline]
    pub fn head(&self, list: ListId) -> Option<u32> {
        self.lists.head(list as usize)
    }

    /// Clusters on `list`.
    #[inline]
    pub fn len(&self, list: ListId) -> u32 {
        self.lists.len(list as usize) as u32
    }

    /// Move `c` to the tail of `to` (a no-op relink when already there
    /// moves it to the tail, which rotates a list).
    pub fn move_tail(&mut self, c: u32, to: ListId) {
        self.lists.unlink(self.on[c as usize] as usize, c);
        self.lists.push_tail(to as usize, c);
        self.on[c as usize] = to;
    }

    /// Clusters freed from now on are taken again before the rest.
    pub fn set_freed_first(&mut self, on: bool) {
        self.freed_first = on;
    }

    /// Move `c` to `to` unless it is already on it (keeps its position):
    /// to the tail, or, freed on a device that grows, to the head.
    #[inline]
    pub fn move_to(&mut self, c: u32, to: ListId) {
        if self.on[c as usize] != to {
            if to == ListId::Free && self.freed_first {
                self.lists.unlink(self.on[c as usize] as usize, c);
                self.lists.push_head(to as usize, c);
                self.on[c as usize] = to;
            } else {
                self.move_tail(c, to);
            }
        }
    }

    /// Iterate over the clusters of `list`, head first.
    pub fn iter(&self, list: ListId) -> impl Iterator<Item = u32> + '_ {
        self.lists.iter(list as usize)
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
                    if self.on[c as usize] != list {
                        return Err(format!(
                            "cluster {c} linked on {list:?} but marked {:?}",
                            self.on[c as usize]
                        ));
                    }
                    Ok(())
                })
                .map_err(|e| format!("{list:?}: {e}"))?;
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
        let mut l = ClusterLists::new(5);
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
}
