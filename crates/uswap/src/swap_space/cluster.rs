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
//! The lists are intrusive (links in arrays indexed by cluster number), so
//! moving a cluster is O(1) and never allocates.  They are protected by the
//! device lock.

/// Slots per cluster: one 2 MB unit of 4 KiB pages (`SWAPFILE_CLUSTER`).
pub const CLUSTER_SLOTS: u64 = 512;

/// Cluster indices are u32; this marks "no cluster" in links.
const NIL: u32 = u32::MAX;

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

/// The four cluster lists of one device, sharing one set of link arrays.
pub struct ClusterLists {
    next: Box<[u32]>,
    prev: Box<[u32]>,
    on: Box<[ListId]>,
    head: [u32; 4],
    tail: [u32; 4],
    len: [u32; 4],
}

impl ClusterLists {
    /// `n` clusters, all on the `Free` list in index order (callers move the
    /// ones that are not free).
    pub fn new(n: u32) -> Self {
        let mut l = ClusterLists {
            next: vec![NIL; n as usize].into_boxed_slice(),
            prev: vec![NIL; n as usize].into_boxed_slice(),
            on: vec![ListId::Free; n as usize].into_boxed_slice(),
            head: [NIL; 4],
            tail: [NIL; 4],
            len: [0; 4],
        };
        for c in 0..n {
            l.link_tail(ListId::Free, c);
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
        let h = self.head[list as usize];
        (h != NIL).then_some(h)
    }

    /// Clusters on `list`.
    #[inline]
    pub fn len(&self, list: ListId) -> u32 {
        self.len[list as usize]
    }

    /// Move `c` to the tail of `to` (a no-op relink when already there
    /// moves it to the tail, which rotates a list).
    pub fn move_tail(&mut self, c: u32, to: ListId) {
        self.unlink(c);
        self.link_tail(to, c);
    }

    /// Move `c` to `to` unless it is already on it (keeps its position).
    #[inline]
    pub fn move_to(&mut self, c: u32, to: ListId) {
        if self.on[c as usize] != to {
            self.move_tail(c, to);
        }
    }

    /// Iterate over the clusters of `list`, head first.
    pub fn iter(&self, list: ListId) -> impl Iterator<Item = u32> + '_ {
        let mut cur = self.head[list as usize];
        std::iter::from_fn(move || {
            if cur == NIL {
                return None;
            }
            let c = cur;
            cur = self.next[c as usize];
            Some(c)
        })
    }

    fn unlink(&mut self, c: u32) {
        let l = self.on[c as usize] as usize;
        let (p, n) = (self.prev[c as usize], self.next[c as usize]);
        if p == NIL {
            self.head[l] = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail[l] = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.len[l] -= 1;
    }

    fn link_tail(&mut self, list: ListId, c: u32) {
        let l = list as usize;
        let t = self.tail[l];
        self.prev[c as usize] = t;
        self.next[c as usize] = NIL;
        if t == NIL {
            self.head[l] = c;
        } else {
            self.next[t as usize] = c;
        }
        self.tail[l] = c;
        self.on[c as usize] = list;
        self.len[l] += 1;
    }

    /// Check that every list is well formed and the membership array agrees
    /// with the links.
    pub fn check(&self) -> Result<(), String> {
        let n = self.on.len();
        let mut seen = vec![false; n];
        for list in ListId::ALL {
            let mut count = 0u32;
            let mut prev = NIL;
            for c in self.iter(list) {
                if seen[c as usize] {
                    return Err(format!("cluster {c} reached twice walking the lists"));
                }
                seen[c as usize] = true;
                if self.on[c as usize] != list {
                    return Err(format!(
                        "cluster {c} linked on {list:?} but marked {:?}",
                        self.on[c as usize]
                    ));
                }
                if self.prev[c as usize] != prev {
                    return Err(format!("cluster {c} on {list:?}: prev link broken"));
                }
                prev = c;
                count += 1;
                if count as usize > n {
                    return Err(format!("{list:?} list has a cycle"));
                }
            }
            if prev != self.tail[list as usize] {
                return Err(format!("{list:?} tail is stale"));
            }
            if count != self.len[list as usize] {
                return Err(format!(
                    "{list:?} holds {count} clusters but counts {}",
                    self.len[list as usize]
                ));
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
