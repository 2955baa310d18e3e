//! The table of heap blocks served as mappings: which pages of each the
//! program has mapped now, which it changed, which it asked to be wiped
//! in a forked child, and the blocks it unmapped whole, kept a while
//! before they go back to mimalloc.
//!
//! A plain data structure (the interposers in `mod.rs` hold its lock and
//! act on the memory); addresses are absolute, ranges half-open.

use std::collections::{BTreeMap, VecDeque};

/// Disjoint ranges `[lo, hi)`, sorted, neighbours merged.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Spans(Vec<(usize, usize)>);

impl Spans {
    pub(crate) fn one(lo: usize, hi: usize) -> Spans {
        Spans(if lo < hi { vec![(lo, hi)] } else { Vec::new() })
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.0.iter().copied()
    }

    /// Add `[lo, hi)`.
    pub(crate) fn insert(&mut self, lo: usize, hi: usize) {
        if lo >= hi {
            return;
        }
        // Every span touching or overlapping [lo, hi) merges into one.
        let first = self.0.partition_point(|&(_, e)| e < lo);
        let last = self.0.partition_point(|&(s, _)| s <= hi);
        let (mut l, mut h) = (lo, hi);
        if first < last {
            l = l.min(self.0[first].0);
            h = h.max(self.0[last - 1].1);
        }
        self.0.splice(first..last, [(l, h)]);
    }

    /// Take `[lo, hi)` out.
    pub(crate) fn remove(&mut self, lo: usize, hi: usize) {
        if lo >= hi {
            return;
        }
        let first = self.0.partition_point(|&(_, e)| e <= lo);
        let last = self.0.partition_point(|&(s, _)| s < hi);
        if first >= last {
            return;
        }
        let mut kept = Vec::with_capacity(2);
        if self.0[first].0 < lo {
            kept.push((self.0[first].0, lo));
        }
        if self.0[last - 1].1 > hi {
            kept.push((hi, self.0[last - 1].1));
        }
        self.0.splice(first..last, kept);
    }
}

/// A block served as a mapping.
#[derive(Clone, Debug)]
pub(crate) struct Served {
    pub len: usize,
    /// What of the block the program has mapped now: the block goes back
    /// (through the quarantine) once none of it is.  Counted by range, not
    /// by bytes, so that unmapping one range twice (the kernel allows it)
    /// is not taken for unmapping two.
    pub mapped: Spans,
    /// The program changed its protection or mapped something over it:
    /// put back fresh as it is unmapped.
    pub altered: bool,
    /// What the program asked to read as zeros in a forked child
    /// (`MADV_WIPEONFORK`).
    pub wipe: Spans,
}

/// Blocks unmapped whole stay out of mimalloc's hands for a while: a
/// program that mapped and unmapped to find free address space, then
/// asks for that address (`mmap(MAP_FIXED)`, `mremap(MREMAP_FIXED)`:
/// stress-ng's mremap stressor, address-space probes) gets it back as it
/// would from the kernel, instead of memory malloc has given out since.
/// Bounded in blocks and bytes (address space only: their pages were
/// discarded).
pub(crate) const QUARANTINE_BLOCKS: usize = 64;

/// Served blocks by start, and the quarantine.
#[derive(Default)]
pub(crate) struct Table {
    blocks: BTreeMap<usize, Served>,
    /// Starts of blocks with nothing mapped, oldest first.
    quarantine: VecDeque<usize>,
    quarantined_bytes: usize,
    /// The most bytes the quarantine holds (0: it holds nothing).
    quarantine_cap: usize,
}

impl Table {
    pub(crate) const fn new() -> Table {
        Table {
            blocks: BTreeMap::new(),
            quarantine: VecDeque::new(),
            quarantined_bytes: 0,
            quarantine_cap: 0,
        }
    }

    /// Hold at most `bytes` of unmapped blocks.
    pub(crate) fn set_quarantine_cap(&mut self, bytes: usize) {
        self.quarantine_cap = bytes;
    }

    /// A block just served, mapped whole.
    pub(crate) fn insert(&mut self, start: usize, len: usize, altered: bool) {
        self.blocks.insert(
            start,
            Served {
                len,
                mapped: Spans::one(start, start + len),
                altered,
                wipe: Spans::default(),
            },
        );
    }

    /// The block holding `addr`: its start.
    pub(crate) fn block_of(&self, addr: usize) -> Option<usize> {
        let (&start, b) = self.blocks.range(..=addr).next_back()?;
        (addr < start + b.len).then_some(start)
    }

    pub(crate) fn get(&self, start: usize) -> Option<&Served> {
        self.blocks.get(&start)
    }

    pub(crate) fn get_mut(&mut self, start: usize) -> Option<&mut Served> {
        self.blocks.get_mut(&start)
    }

    /// Blocks overlapping `[lo, hi)`, by start.
    pub(crate) fn overlapping(&self, lo: usize, hi: usize) -> Vec<usize> {
        let mut v: Vec<usize> = self
            .blocks
            .range(..hi)
            .rev()
            .take_while(|(&s, b)| s + b.len > lo)
            .map(|(&s, _)| s)
            .collect();
        v.reverse();
        v
    }

    /// `[lo, hi)` of block `start` mapped again (a fixed mapping over it):
    /// out of the quarantine if it was there.
    pub(crate) fn map(&mut self, start: usize, lo: usize, hi: usize) {
        let Some(b) = self.blocks.get_mut(&start) else {
            return;
        };
        let was_empty = b.mapped.is_empty();
        b.mapped.insert(lo, hi);
        if was_empty && !b.mapped.is_empty() {
            let len = b.len;
            if let Some(i) = self.quarantine.iter().position(|&s| s == start) {
                self.quarantine.remove(i);
                self.quarantined_bytes -= len;
            }
        }
    }

    /// `[lo, hi)` of block `start` unmapped.  A block with nothing mapped
    /// goes into the quarantine; blocks pushed out of it are returned, to
    /// be freed by the caller (outside this table's lock).
    pub(crate) fn unmap(&mut self, start: usize, lo: usize, hi: usize) -> Vec<usize> {
        let Some(b) = self.blocks.get_mut(&start) else {
            return Vec::new();
        };
        let was_empty = b.mapped.is_empty();
        b.mapped.remove(lo, hi);
        b.wipe.remove(lo, hi);
        if was_empty || !b.mapped.is_empty() {
            return Vec::new();
        }
        let len = b.len;
        self.quarantine.push_back(start);
        self.quarantined_bytes += len;
        self.trim(self.quarantine_cap, QUARANTINE_BLOCKS)
    }

    /// Empty the quarantine down to `bytes` and `blocks`: the blocks taken
    /// out of the table, to be freed.
    pub(crate) fn trim(&mut self, bytes: usize, blocks: usize) -> Vec<usize> {
        let mut gone = Vec::new();
        while self.quarantined_bytes > bytes || self.quarantine.len() > blocks {
            let Some(s) = self.quarantine.pop_front() else {
                break;
            };
            if let Some(b) = self.blocks.remove(&s) {
                self.quarantined_bytes -= b.len;
            }
            gone.push(s);
        }
        gone
    }

    /// Every range to be wiped in a forked child.
    pub(crate) fn wipes(&self) -> Vec<(usize, usize)> {
        self.blocks.values().flat_map(|b| b.wipe.iter()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // Spans against a page-by-page model.
    proptest! {
        #[test]
        fn spans_agree_with_a_set_of_pages(ops in prop::collection::vec((any::<bool>(), 0usize..64, 0usize..16), 1..64)) {
            let mut spans = Spans::default();
            let mut model = [false; 80];
            for (add, lo, n) in ops {
                let hi = lo + n;
                if add { spans.insert(lo, hi) } else { spans.remove(lo, hi) }
                for m in &mut model[lo..hi] { *m = add; }
                // Sorted, disjoint, never touching (merged), never empty.
                for w in spans.0.windows(2) {
                    prop_assert!(w[0].1 < w[1].0);
                }
                prop_assert!(spans.0.iter().all(|&(s, e)| s < e));
                let mut got = [false; 80];
                for (s, e) in spans.iter() {
                    for g in &mut got[s..e] { *g = true; }
                }
                prop_assert_eq!(got, model);
            }
        }
    }

    #[test]
    fn a_block_unmapped_twice_in_one_place_stays() {
        let mut t = Table::new();
        t.set_quarantine_cap(1 << 30);
        t.insert(0x1000, 0x4000, false);
        assert!(t.unmap(0x1000, 0x1000, 0x2000).is_empty());
        assert!(t.unmap(0x1000, 0x1000, 0x2000).is_empty());
        // Three pages of four still mapped: not in the quarantine.
        assert!(!t.get(0x1000).unwrap().mapped.is_empty());
        assert_eq!(t.quarantine.len(), 0);
        t.unmap(0x1000, 0x2000, 0x5000);
        assert_eq!(t.quarantine.len(), 1);
        // Mapped again at a fixed address: out of the quarantine.
        t.map(0x1000, 0x3000, 0x4000);
        assert_eq!(t.quarantine.len(), 0);
        assert_eq!(t.quarantined_bytes, 0);
    }

    #[test]
    fn the_quarantine_lets_the_oldest_go() {
        let mut t = Table::new();
        t.set_quarantine_cap(3 * 0x1000);
        for i in 0..5 {
            t.insert(0x10000 * (i + 1), 0x1000, false);
        }
        let mut freed = Vec::new();
        for i in 0..5 {
            let s = 0x10000 * (i + 1);
            freed.extend(t.unmap(s, s, s + 0x1000));
        }
        assert_eq!(freed, vec![0x10000, 0x20000]);
        assert!(t.get(0x10000).is_none() && t.get(0x30000).is_some());
        assert_eq!(t.trim(0, 0), vec![0x30000, 0x40000, 0x50000]);
        assert!(t.blocks.is_empty());
    }
}
