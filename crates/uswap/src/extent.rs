//! Swap extents: swap offset -> (backing, byte offset).
//!
//! A swap device is a run of page-sized slots, but what backs it need not be
//! one contiguous thing: the device may be assembled from several backing
//! files or block devices, and a swap file on a filesystem is wherever the
//! filesystem put its blocks.  Like the kernel's `struct swap_extent`, each
//! [`Extent`] maps a run of consecutive slots to a contiguous run of bytes on
//! one backing, and every read or write of a slot first translates the slot
//! through the map ([`ExtentMap::lookup`], the kernel's `map_swap_entry()`).
//!
//! How that translation finds the extent is seed 004's point.  Before it the
//! kernel kept the extents on a linked list and walked it from a one-entry
//! cache, `sis->curr_swap_extent`, which the walk updated at every step.  One
//! task swapping out sequentially hits that cache almost every time, but
//! several tasks working in different parts of the device keep moving the
//! shared cursor away from each other, so each lookup walks half the list and
//! writes a cache line every other task reads.  With 20K extents that put
//! `map_swap_entry()` at 90% of the CPU.  Seed 004 replaced the list with a
//! balanced tree keyed by the first slot of each extent: O(log n) per lookup
//! and no shared writes.  Both are here, as [`ExtentMapKind::Tree`] (the
//! default) and [`ExtentMapKind::List`] (the behaviour before seed 004), so
//! the difference can be measured (`uswap bench extent`).
//!
//! Maps are built with [`ExtentMapBuilder`], which merges adjacent extents as
//! `add_swap_extent()` does, or from files and devices with
//! [`io::from_sources`](crate::io::from_sources) (`io/backing/`),
//! which can map a regular file by its physical extents (FIEMAP) so that a
//! fragmented swap file yields as many extents as it would in the kernel.
//! uswap always does its IO through the file, never to the raw disk, so the
//! offset an extent maps to is the file's *logical* offset; the physical
//! address is kept alongside only to break extents where the kernel would.

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;

use crate::PAGE_SIZE;

const PAGE: u64 = PAGE_SIZE as u64;

/// One run of consecutive slots mapped to a contiguous run of bytes on one
/// backing: the kernel's `struct swap_extent`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// First slot of the run.
    pub start_slot: u64,
    /// Number of slots (pages) in the run, at least 1.
    pub nr_slots: u64,
    /// Which backing holds the run: an index into the caller's backings (for
    /// [`crate::io::from_sources`], the position of the source).
    pub backing: u32,
    /// Byte offset in the backing of `start_slot`; slot `start_slot + i` is
    /// at `byte_offset + i * PAGE_SIZE`.
    pub byte_offset: u64,
    /// Physical byte address of `byte_offset` on the underlying disk, when
    /// known (FIEMAP).  Only used to keep extents apart where the physical
    /// layout breaks; IO never goes there.
    pub physical: Option<u64>,
}

impl Extent {
    /// The slot after the last slot of this extent.
    pub fn end_slot(&self) -> u64 {
        self.start_slot + self.nr_slots
    }

    /// Translate `slot`, which the caller has checked lies in this extent.
    #[inline]
    fn translate(&self, slot: u64) -> (u32, u64) {
        (self.backing, self.byte_offset + (slot - self.start_slot) * PAGE)
    }

    /// Whether `slot` lies in this extent.
    #[inline]
    fn contains(&self, slot: u64) -> bool {
        slot.wrapping_sub(self.start_slot) < self.nr_slots
    }
}

/// How an `ExtentMap` finds the extent of a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ExtentMapKind {
    /// A balanced ordered tree keyed by first slot (seed 004): O(log n)
    /// lookups that write nothing shared.
    #[default]
    Tree,
    /// The behaviour before seed 004: a linear list walked from a one-entry
    /// "current extent" cache shared by every lookup, which the walk moves
    /// at every step.
    List,
}

/// Why an extent map could not be built.  Every message is one line naming
/// the file or device and what to do about it.
#[derive(thiserror::Error, Debug)]
pub enum ExtentError {
    /// The path does not exist.
    #[error("{}: no such file or device; create it first (e.g. `fallocate -l 1G {}`) or fix the path", .path.display(), .path.display())]
    NotFound {
        /// The path as given.
        path: PathBuf,
    },
    /// The path exists but may not be opened.
    #[error("{}: permission denied; make it readable and writable by this user, or run as one who can", .path.display())]
    PermissionDenied {
        /// The path as given.
        path: PathBuf,
    },
    /// The path is a directory.
    #[error("{}: is a directory; give a regular file or a block device to swap on", .path.display())]
    IsDirectory {
        /// The path as given.
        path: PathBuf,
    },
    /// The path is neither a regular file nor a block device (or, for a
    /// FIEMAP source, not a regular file).
    #[error("{}: is {what}; give a regular file or a block device (FIEMAP sources: a regular file)", .path.display())]
    NotSwappable {
        /// The path as given.
        path: PathBuf,
        /// What it is instead.
        what: &'static str,
    },
    /// Any other IO error on the path.
    #[error("{}: {source}; check the file and the filesystem it is on", .path.display())]
    Io {
        /// The path as given.
        path: PathBuf,
        /// What the system call said.
        #[source]
        source: io::Error,
    },
    /// Less than one page would be usable.
    #[error("{}: {len} bytes is less than one {PAGE_SIZE}-byte page; make it at least one page (e.g. `fallocate -l 1G {}`)", .path.display(), .path.display())]
    TooSmall {
        /// The path as given.
        path: PathBuf,
        /// Its length in bytes.
        len: u64,
    },
    /// A regular file has a hole: swapping into it would need the
    /// filesystem to allocate blocks at swap-out time, which the kernel
    /// refuses ("swapfile has holes").
    #[error("{}: file has holes (first at byte offset {offset}); preallocate it (e.g. `fallocate -l SIZE {}`) or write it full, then retry", .path.display(), .path.display())]
    Holes {
        /// The path as given.
        path: PathBuf,
        /// The byte offset in the file.
        offset: u64,
    },
    /// A FIEMAP extent carries a flag the kernel's swapfile activation
    /// refuses, or is not page aligned.
    #[error("{}: extent at byte offset {offset} is {flag}: {}", .path.display(), flag_advice(.flag))]
    BadExtentFlags {
        /// The path as given.
        path: PathBuf,
        /// The byte offset in the file.
        offset: u64,
        /// The extent flag that makes it unusable.
        flag: &'static str,
    },
    /// The filesystem cannot report extents.
    #[error("{}: the filesystem does not support FIEMAP; use a whole-file source (ExtentSource::Whole) instead", .path.display())]
    FiemapUnsupported {
        /// The path as given.
        path: PathBuf,
    },
    /// Nothing to map: no sources, or a builder with no extents.
    #[error("no swap extents: give at least one backing of at least one {PAGE_SIZE}-byte page")]
    Empty,
    /// A length was asked for that the file or device does not have.
    #[error("{}: requested length {len} bytes exceeds its size of {actual} bytes; {}", .path.display(), if *.block_device { "give a length no larger than the device" } else { "preallocate the file to that size first (e.g. `fallocate -l SIZE FILE`) or ask for less" })]
    LenExceedsFile {
        /// The path as given.
        path: PathBuf,
        /// Its length in bytes.
        len: u64,
        /// The length it has.
        actual: u64,
        /// Whether it is a block device.
        block_device: bool,
    },
    /// A builder call that cannot describe an extent (zero length, or slot
    /// or byte numbers past `u64`).
    #[error("invalid extent: {reason}; fix the caller")]
    InvalidExtent {
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// What to do about an extent flag swap refuses.
fn flag_advice(flag: &str) -> &'static str {
    match flag {
        "UNKNOWN" => "its location is not known yet; fsync the file or preallocate it with fallocate, and retry",
        "DELALLOC" => "delayed allocation, not on disk yet; fsync the file or preallocate it with fallocate, and retry",
        "ENCODED" => "compressed or otherwise encoded; create the swap file without compression (e.g. `chattr +m`, or on btrfs `chattr +C` before writing it)",
        "DATA_INLINE" => "stored inline in filesystem metadata; make the file several pages long and preallocate it with fallocate",
        "NOT_ALIGNED" => "not aligned to a 4096-byte page (filesystem block size below the page size, or tail packing); put the swap file on a filesystem with 4096-byte blocks, or use a whole-file source",
        "SHARED" => "shared with another file (reflink or snapshot); make an unshared copy (`cp --reflink=never`) and swap on that",
        _ => "the swap file cannot be mapped; preallocate it with fallocate on a plain filesystem",
    }
}

/// Collects extents in ascending slot order, merging as it goes, then
/// builds an [`ExtentMap`].  Made by [`ExtentMap::builder`].
#[derive(Debug)]
pub struct ExtentMapBuilder {
    kind: ExtentMapKind,
    extents: Vec<Extent>,
    next_slot: u64,
}

impl ExtentMapBuilder {
    /// Append the next `nr_slots` slots (ascending slot order, like
    /// `add_swap_extent()`), mapped to `backing` at `byte_offset`.
    ///
    /// Merges into the previous extent when the backing is the same and
    /// `byte_offset` continues it (and `physical` does too, when both are
    /// known): a file the filesystem laid out in one piece should cost one
    /// extent however its mapping was reported.
    pub fn add(
        &mut self,
        nr_slots: u64,
        backing: u32,
        byte_offset: u64,
        physical: Option<u64>,
    ) -> Result<&mut Self, ExtentError> {
        if nr_slots == 0 {
            return Err(ExtentError::InvalidExtent {
                reason: "an extent needs at least one slot",
            });
        }
        let end_slot = self
            .next_slot
            .checked_add(nr_slots)
            .ok_or(ExtentError::InvalidExtent {
                reason: "slot numbers overflow u64",
            })?;
        let bytes = nr_slots.checked_mul(PAGE).ok_or(ExtentError::InvalidExtent {
            reason: "extent length in bytes overflows u64",
        })?;
        // Every byte of the extent must be addressable, so that lookup's
        // arithmetic can never overflow.
        byte_offset.checked_add(bytes).ok_or(ExtentError::InvalidExtent {
            reason: "byte offsets overflow u64",
        })?;
        if let Some(p) = physical {
            p.checked_add(bytes).ok_or(ExtentError::InvalidExtent {
                reason: "physical addresses overflow u64",
            })?;
        }

        if let Some(last) = self.extents.last_mut() {
            let last_bytes = last.nr_slots * PAGE;
            let offset_follows = last.byte_offset + last_bytes == byte_offset;
            // Where only one side's physical address is known we cannot
            // tell whether the disk is contiguous, and a merge would lose
            // the known address: keep them apart.
            let physical_follows = match (last.physical, physical) {
                (Some(a), Some(b)) => a.checked_add(last_bytes) == Some(b),
                (None, None) => true,
                _ => false,
            };
            if last.backing == backing && offset_follows && physical_follows {
                last.nr_slots += nr_slots;
                self.next_slot = end_slot;
                return Ok(self);
            }
        }
        self.extents.push(Extent {
            start_slot: self.next_slot,
            nr_slots,
            backing,
            byte_offset,
            physical,
        });
        self.next_slot = end_slot;
        Ok(self)
    }

    /// Build the map; an error if no extent was added.
    pub fn build(self) -> Result<ExtentMap, ExtentError> {
        if self.extents.is_empty() {
            return Err(ExtentError::Empty);
        }
        let repr = match self.kind {
            ExtentMapKind::Tree => Repr::Tree(self.extents.into_iter().map(|e| (e.start_slot, e)).collect()),
            ExtentMapKind::List => Repr::List {
                extents: self.extents,
                curr: CachePadded::new(AtomicUsize::new(0)),
            },
        };
        Ok(ExtentMap {
            kind: self.kind,
            slots: self.next_slot,
            repr,
        })
    }
}

/// How the extents are kept, per [`ExtentMapKind`].
#[derive(Debug)]
enum Repr {
    /// Keyed by first slot; the extent lives in the tree node, as the
    /// kernel's `swap_extent` embeds its `rb_node`.
    Tree(BTreeMap<u64, Extent>),
    /// In slot order, with the shared cursor `curr_swap_extent`: an index
    /// into `extents`, always in range.  It is on a cache line of its own so
    /// that what the list variant pays for is the cursor itself (every
    /// lookup that misses writes it), not false sharing with the read-only
    /// fields beside it.
    List {
        extents: Vec<Extent>,
        curr: CachePadded<AtomicUsize>,
    },
}

/// Slot -> (backing, byte offset), immutable once built and shared by all
/// threads (`Send + Sync`).
#[derive(Debug)]
pub struct ExtentMap {
    kind: ExtentMapKind,
    slots: u64,
    repr: Repr,
}

impl ExtentMap {
    /// An empty builder for a map of `kind`.
    pub fn builder(kind: ExtentMapKind) -> ExtentMapBuilder {
        ExtentMapBuilder {
            kind,
            extents: Vec::new(),
            next_slot: 0,
        }
    }

    /// Where `slot` lives: (backing, byte offset in it); `None` past the
    /// last slot.  Safe to call from any number of threads; never allocates.
    #[inline]
    pub fn lookup(&self, slot: u64) -> Option<(u32, u64)> {
        if slot >= self.slots {
            return None;
        }
        match &self.repr {
            Repr::Tree(tree) => {
                // The extent with the greatest first slot not above `slot`:
                // the slots are covered without gaps from 0, so it holds it.
                let (_, se) = tree.range(..=slot).next_back()?;
                debug_assert!(se.contains(slot));
                Some(se.translate(slot))
            }
            Repr::List { extents, curr } => Some(list_lookup(extents, curr, slot)),
        }
    }

    /// The kind this map was built as.
    pub fn kind(&self) -> ExtentMapKind {
        self.kind
    }

    /// Number of extents (after merging).
    pub fn len(&self) -> usize {
        match &self.repr {
            Repr::Tree(t) => t.len(),
            Repr::List { extents, .. } => extents.len(),
        }
    }

    /// Whether the map has no extents; a built map never is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of slots the map covers: slots `0..slots()` translate.
    pub fn slots(&self) -> u64 {
        self.slots
    }

    /// The extents in slot order.
    pub fn extents(&self) -> impl Iterator<Item = &Extent> + '_ {
        let (tree, list) = match &self.repr {
            Repr::Tree(t) => (Some(t.values()), None),
            Repr::List { extents, .. } => (None, Some(extents.iter())),
        };
        tree.into_iter().flatten().chain(list.into_iter().flatten())
    }
}

/// The pre-seed-004 `map_swap_entry()`: start at the shared current extent
/// and walk the circular list until the slot's extent turns up, storing the
/// cursor at every step (`sis->curr_swap_extent = se`) as the kernel did.
/// The caller has checked that `slot` is in range, so the walk ends within
/// one lap.
#[inline]
fn list_lookup(extents: &[Extent], curr: &AtomicUsize, slot: u64) -> (u32, u64) {
    let n = extents.len();
    // The cursor is only a hint: any in-range index gives the right answer,
    // so relaxed ordering is enough, as the kernel's plain stores were.
    let start = curr.load(Ordering::Relaxed);
    let mut i = start;
    loop {
        let se = &extents[i];
        if se.contains(slot) {
            return se.translate(slot);
        }
        i += 1;
        if i == n {
            i = 0;
        }
        curr.store(i, Ordering::Relaxed);
        // It *must* be present.
        assert!(i != start, "slot {slot} in range but on no extent");
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    const KINDS: [ExtentMapKind; 2] = [ExtentMapKind::Tree, ExtentMapKind::List];

    #[test]
    fn map_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<ExtentMap>();
    }

    #[test]
    fn builder_merges_only_contiguous_runs() {
        for kind in KINDS {
            let mut b = ExtentMap::builder(kind);
            // Contiguous on backing 0: merges into one.
            b.add(4, 0, 0, None).unwrap();
            b.add(2, 0, 4 * PAGE, None).unwrap();
            // Gap in byte offset: new extent.
            b.add(3, 0, 10 * PAGE, None).unwrap();
            // Different backing at the continuing offset: new extent.
            b.add(1, 1, 13 * PAGE, None).unwrap();
            // Contiguous offset but only this side's physical address
            // known: new extent (it cannot tell, and would lose it).
            b.add(2, 1, 14 * PAGE, Some(1 << 20)).unwrap();
            // Same backing, contiguous offset and physical: merges.
            b.add(2, 1, 16 * PAGE, Some((1 << 20) + 2 * PAGE)).unwrap();
            // Contiguous offset, physical discontiguous: new extent.
            b.add(5, 1, 18 * PAGE, Some(1 << 30)).unwrap();
            // Contiguous offset, physical contiguous, other backing: new.
            b.add(1, 2, 23 * PAGE, Some((1 << 30) + 5 * PAGE)).unwrap();
            let m = b.build().unwrap();
            let got: Vec<(u64, u64, u32, u64, Option<u64>)> = m
                .extents()
                .map(|e| (e.start_slot, e.nr_slots, e.backing, e.byte_offset, e.physical))
                .collect();
            assert_eq!(
                got,
                vec![
                    (0, 6, 0, 0, None),
                    (6, 3, 0, 10 * PAGE, None),
                    (9, 1, 1, 13 * PAGE, None),
                    (10, 4, 1, 14 * PAGE, Some(1 << 20)),
                    (14, 5, 1, 18 * PAGE, Some(1 << 30)),
                    (19, 1, 2, 23 * PAGE, Some((1 << 30) + 5 * PAGE)),
                ],
                "{kind:?}"
            );
            assert_eq!(m.len(), 6);
            assert!(!m.is_empty());
            assert_eq!(m.slots(), 20);
            assert_eq!(m.kind(), kind);
        }
    }

    #[test]
    fn builder_rejects_bad_input() {
        assert!(matches!(
            ExtentMap::builder(ExtentMapKind::Tree).build(),
            Err(ExtentError::Empty)
        ));
        let mut b = ExtentMap::builder(ExtentMapKind::List);
        assert!(matches!(
            b.add(0, 0, 0, None),
            Err(ExtentError::InvalidExtent { .. })
        ));
        assert!(matches!(
            b.add(2, 0, u64::MAX - PAGE, None),
            Err(ExtentError::InvalidExtent { .. })
        ));
        b.add(u64::MAX / PAGE - 1, 0, 0, None).unwrap();
        assert!(matches!(
            b.add(u64::MAX, 1, 0, None),
            Err(ExtentError::InvalidExtent { .. })
        ));
    }

    /// Three extents on two backings; checks the first and last slot of
    /// each, and past the end, for both kinds.
    #[test]
    fn lookup_at_extent_edges() {
        let maps: Vec<ExtentMap> = KINDS
            .iter()
            .map(|&k| {
                let mut b = ExtentMap::builder(k);
                b.add(3, 0, 100 * PAGE, None).unwrap();
                b.add(1, 1, 0, None).unwrap();
                b.add(7, 0, 50 * PAGE, None).unwrap();
                b.build().unwrap()
            })
            .collect();
        let want = [
            (0, Some((0, 100 * PAGE))),
            (2, Some((0, 102 * PAGE))),
            (3, Some((1, 0))),
            (4, Some((0, 50 * PAGE))),
            (10, Some((0, 56 * PAGE))),
            (11, None),
            (u64::MAX, None),
        ];
        for m in &maps {
            assert_eq!(m.len(), 3);
            // Look up in an order that makes the list walk forwards,
            // backwards (wrapping) and stay put.
            for &(slot, expect) in want.iter().chain(want.iter().rev()) {
                assert_eq!(m.lookup(slot), expect, "{:?} slot {slot}", m.kind());
            }
        }
        for slot in 0..12 {
            assert_eq!(maps[0].lookup(slot), maps[1].lookup(slot));
        }
    }

    /// Reference: one (backing, offset) per slot, straight from the adds.
    fn naive(adds: &[(u64, u32, u64)]) -> Vec<(u32, u64)> {
        let mut v = Vec::new();
        for &(n, backing, off) in adds {
            for i in 0..n {
                v.push((backing, off + i * PAGE));
            }
        }
        v
    }

    proptest! {
        #[test]
        fn tree_list_and_reference_agree(
            layout in prop::collection::vec((1u64..40, 0u32..3, 0u64..3, any::<bool>()), 1..300),
            probes in prop::collection::vec(any::<u64>(), 1..200),
        ) {
            // Each add continues the byte offset of its backing after a
            // random gap (0 = contiguous, so some merge).
            let mut next_off = [0u64; 3];
            let mut adds = Vec::new();
            let mut builders: Vec<ExtentMapBuilder> =
                KINDS.iter().map(|&k| ExtentMap::builder(k)).collect();
            for &(n, backing, gap, phys) in &layout {
                let off = next_off[backing as usize] + gap * PAGE;
                next_off[backing as usize] = off + n * PAGE;
                let physical = phys.then_some(off + (1 << 40));
                adds.push((n, backing, off));
                for b in &mut builders {
                    b.add(n, backing, off, physical).unwrap();
                }
            }
            let reference = naive(&adds);
            let maps: Vec<ExtentMap> = builders.into_iter().map(|b| b.build().unwrap()).collect();
            let total = reference.len() as u64;
            prop_assert_eq!(maps[0].len(), maps[1].len());
            prop_assert!(maps[0].len() <= layout.len());
            for m in &maps {
                prop_assert_eq!(m.slots(), total);
                // The extents tile 0..total in order.
                let mut next = 0;
                for e in m.extents() {
                    prop_assert_eq!(e.start_slot, next);
                    next = e.end_slot();
                }
                prop_assert_eq!(next, total);
            }
            for &p in &probes {
                // Mostly in range, sometimes just past it, sometimes far.
                let slot = match p % 8 {
                    0 => total + p % 4,
                    1 => p,
                    _ => p % total,
                };
                let want = reference.get(slot as usize).copied();
                prop_assert_eq!(maps[0].lookup(slot), want);
                prop_assert_eq!(maps[1].lookup(slot), want);
            }
        }
    }

    /// 20,000 extents of 7 slots, extent i at byte (i * 8 + 3) pages on
    /// backing i % 5: arithmetic gives the truth for any slot.
    fn big_map(kind: ExtentMapKind) -> ExtentMap {
        let mut b = ExtentMap::builder(kind);
        for i in 0..20_000u64 {
            b.add(7, (i % 5) as u32, (i * 8 + 3) * PAGE, None).unwrap();
        }
        b.build().unwrap()
    }

    fn big_truth(slot: u64) -> Option<(u32, u64)> {
        if slot >= 140_000 {
            return None;
        }
        let (i, r) = (slot / 7, slot % 7);
        Some(((i % 5) as u32, (i * 8 + 3 + r) * PAGE))
    }

    #[test]
    fn concurrent_lookups_are_right() {
        for kind in KINDS {
            let m = big_map(kind);
            assert_eq!(m.len(), 20_000);
            // Random lookups on the list walk ~10,000 extents each; keep
            // its count modest so the test stays quick unoptimised.
            let per_thread: u64 = match kind {
                ExtentMapKind::Tree => 200_000,
                ExtentMapKind::List => 1_500,
            };
            std::thread::scope(|s| {
                for t in 0..8u64 {
                    let m = &m;
                    s.spawn(move || {
                        let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (t + 1);
                        for _ in 0..per_thread {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            let slot = x % 140_010;
                            assert_eq!(m.lookup(slot), big_truth(slot), "{kind:?} slot {slot}");
                        }
                    });
                }
            });
        }
    }
}
