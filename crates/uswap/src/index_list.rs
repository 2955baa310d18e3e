//! Intrusive doubly linked lists of indices (cluster numbers, page ids):
//! the links live in two arrays indexed by the element, so linking and
//! unlinking are O(1), never allocate, and an element is on at most one
//! of the `N` lists sharing the arrays (the kernel's `list_head` embedded
//! in `swap_cluster_info` and in `struct folio`).  Which list an element
//! is on is the owner's to record (a cluster's list id, a page's LRU
//! flags); the lists only keep the links, heads, tails and lengths, and
//! the owner's lock protects them.
//!
//! Links are stored complemented, so the zeroed memory a fresh table
//! starts as reads as [`NIL`]: with [`IndexLists::new_lazy`] lists over
//! millions of ids cost memory only for the ids that have been linked.

use crate::table::{self, TableError};

/// "No element" in links, heads and tails.
pub const NIL: u32 = u32::MAX;

/// One link per element, complemented (zero reads as `NIL`).
struct Links(Box<[u32]>);

impl Links {
    #[inline]
    fn at(&self, i: u32) -> u32 {
        !self.0[i as usize]
    }

    #[inline]
    fn set(&mut self, i: u32, v: u32) {
        self.0[i as usize] = !v;
    }
}

/// `N` lists over one pair of link arrays.
///
/// Invariant: `head`, `tail` and `len` describe the lists exactly; an
/// element on no list has both links `NIL` (unless it was unlinked with
/// a link left stale: `unlink` clears them).
pub struct IndexLists<const N: usize> {
    prev: Links,
    next: Links,
    head: [u32; N],
    tail: [u32; N],
    len: [usize; N],
}

impl<const N: usize> IndexLists<N> {
    /// Lists for elements `0..capacity`, links allocated now.
    pub fn new(capacity: usize) -> Self {
        Self::with_links(
            vec![0; capacity].into_boxed_slice(),
            vec![0; capacity].into_boxed_slice(),
        )
    }

    /// Lists for elements `0..capacity`, links committed as they are used
    /// (`table::zeroed`).
    pub fn new_lazy(capacity: usize, what: &'static str) -> Result<Self, TableError> {
        Ok(Self::with_links(
            table::zeroed(capacity, what)?,
            table::zeroed(capacity, what)?,
        ))
    }

    fn with_links(prev: Box<[u32]>, next: Box<[u32]>) -> Self {
        IndexLists {
            prev: Links(prev),
            next: Links(next),
            head: [NIL; N],
            tail: [NIL; N],
            len: [0; N],
        }
    }

    /// Elements the links have room for.
    pub fn capacity(&self) -> usize {
        self.prev.0.len()
    }

    #[inline]
    pub fn head(&self, list: usize) -> Option<u32> {
        let h = self.head[list];
        (h != NIL).then_some(h)
    }

    #[inline]
    pub fn tail(&self, list: usize) -> Option<u32> {
        let t = self.tail[list];
        (t != NIL).then_some(t)
    }

    #[inline]
    pub fn len(&self, list: usize) -> usize {
        self.len[list]
    }

    /// The element after `i` on its list ([`NIL`] at the tail).
    #[inline]
    pub fn next(&self, i: u32) -> u32 {
        self.next.at(i)
    }

    /// The element before `i` on its list ([`NIL`] at the head).
    #[inline]
    pub fn prev(&self, i: u32) -> u32 {
        self.prev.at(i)
    }

    /// Link `i` (on no list) at the head of `list`.
    #[inline]
    pub fn push_head(&mut self, list: usize, i: u32) {
        let old = self.head[list];
        self.prev.set(i, NIL);
        self.next.set(i, old);
        if old == NIL {
            self.tail[list] = i;
        } else {
            self.prev.set(old, i);
        }
        self.head[list] = i;
        self.len[list] += 1;
    }

    /// Link `i` (on no list) at the tail of `list`.
    #[inline]
    pub fn push_tail(&mut self, list: usize, i: u32) {
        let old = self.tail[list];
        self.next.set(i, NIL);
        self.prev.set(i, old);
        if old == NIL {
            self.head[list] = i;
        } else {
            self.next.set(old, i);
        }
        self.tail[list] = i;
        self.len[list] += 1;
    }

    /// Take `i` off `list` (which it must be on); its links become `NIL`.
    #[inline]
    pub fn unlink(&mut self, list: usize, i: u32) {
        let (p, n) = (self.prev.at(i), self.next.at(i));
        if p == NIL {
            self.head[list] = n;
        } else {
            self.next.set(p, n);
        }
        if n == NIL {
            self.tail[list] = p;
        } else {
            self.prev.set(n, p);
        }
        self.prev.set(i, NIL);
        self.next.set(i, NIL);
        self.len[list] -= 1;
    }

    /// The elements of `list`, head first.
    pub fn iter(&self, list: usize) -> impl Iterator<Item = u32> + '_ {
        let mut cur = self.head[list];
        std::iter::from_fn(move || {
            if cur == NIL {
                return None;
            }
            let i = cur;
            cur = self.next.at(i);
            Some(i)
        })
    }

    /// Walk `list` checking its links: every element in range, each
    /// `prev` the element walked from, no cycle, the tail the last element
    /// and the length the count.  `visit` sees each element (and may
    /// refuse it).  Returns the count.
    pub fn check(
        &self,
        list: usize,
        mut visit: impl FnMut(u32) -> Result<(), String>,
    ) -> Result<usize, String> {
        let cap = self.capacity();
        let (mut prev, mut i, mut n) = (NIL, self.head[list], 0usize);
        while i != NIL {
            if i as usize >= cap {
                return Err(format!("list {list}: link to {i} >= capacity {cap}"));
            }
            if n >= cap {
                return Err(format!("list {list}: more than {cap} elements (a cycle)"));
            }
            if self.prev.at(i) != prev {
                return Err(format!(
                    "list {list}: element {i} has prev {} but was reached from {prev}",
                    self.prev.at(i)
                ));
            }
            visit(i)?;
            prev = i;
            i = self.next.at(i);
            n += 1;
        }
        if self.tail[list] != prev {
            return Err(format!(
                "list {list}: tail {} but last element {prev}",
                self.tail[list]
            ));
        }
        if self.len[list] != n {
            return Err(format!("list {list}: length {} but {n} elements", self.len[list]));
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Against a model (a Vec per list): any sequence of pushes and
        /// unlinks leaves the same lists, well formed.
        #[test]
        fn lists_match_a_model(ops in prop::collection::vec((0u8..3, 0usize..2, 0u32..16), 0..200)) {
            let mut l = IndexLists::<2>::new(16);
            let mut model: [Vec<u32>; 2] = [Vec::new(), Vec::new()];
            let on = |m: &[Vec<u32>; 2], i: u32| m.iter().position(|v| v.contains(&i));
            for (op, list, i) in ops {
                match (op, on(&model, i)) {
                    (0, None) => { l.push_head(list, i); model[list].insert(0, i); }
                    (1, None) => { l.push_tail(list, i); model[list].push(i); }
                    (_, Some(at)) => {
                        l.unlink(at, i);
                        model[at].retain(|&x| x != i);
                        prop_assert_eq!(l.next(i), NIL);
                        prop_assert_eq!(l.prev(i), NIL);
                    }
                    _ => {}
                }
            }
            for (list, want) in model.iter().enumerate() {
                prop_assert_eq!(l.iter(list).collect::<Vec<_>>(), want.clone());
                prop_assert_eq!(l.check(list, |_| Ok(())), Ok(want.len()));
                prop_assert_eq!(l.head(list), want.first().copied());
                prop_assert_eq!(l.tail(list), want.last().copied());
            }
        }
    }

    #[test]
    fn lazy_links_read_as_nil() {
        let l = IndexLists::<1>::new_lazy(1 << 20, "test links").unwrap();
        assert_eq!((l.next(12345), l.prev(12345)), (NIL, NIL));
        assert_eq!(l.head(0), None);
    }
}
