//! The packed store of the compressed device: compressed pages in size
//! classes, as zsmalloc keeps them for zram and zswap.
//!
//! The store is one anonymous mapping cut into blocks of [`BLOCK`] bytes
//! (zsmalloc's zspage, here 16 pages for every class: an object never
//! straddles a block, and a class wastes at most one object's size per
//! block, under 5% for the largest packed class).  A block is free or
//! belongs to one class; a class's blocks hold objects of its size, each
//! a 6-byte header (the slot that owns it, the compressed length) and
//! the compressed bytes.  Classes step by 16 bytes up to [`MAX_PACKED`];
//! a page that would not fit in that is stored whole, 4096 bytes without
//! a header (its owner kept beside the block), in the last class.
//!
//! Memory is what the blocks in use take: a block is committed as its
//! first object is written and handed back to the kernel
//! (`MADV_DONTNEED`) when its last object goes.  Objects freed here and
//! there leave blocks part-used: [`Pool::compact`] moves objects from the
//! emptiest blocks of a class into the fullest until whole blocks empty
//! (zsmalloc's `zs_compact`), telling the owner of each object where it
//! went.
//!
//! # Fullness groups
//!
//! A class's part-used blocks are on [`GROUPS`] lists by how full they
//! are (zsmalloc's fullness groups), its full blocks on one more.  So
//! the emptiest and the fullest part-used blocks are a list head away:
//! compaction takes its source from the emptiest group and its
//! destination from the fullest, and allocation fills the fullest block
//! first, which packs a class into few blocks and leaves fewer holes
//! to compact.  Compaction chose both ends by walking the class's blocks
//! with room, twice a round, under the lock every class shares: a store
//! of 1.3 GB holds 20,000 blocks, and Python touching 6 GiB under a
//! 2 GiB budget spent 10-12% of all its samples there while it filled,
//! with every other class's allocations and frees waiting behind it.
//!
//! # Locks
//!
//! - Each class has a reader-writer lock.  Readers (a fault or a
//!   writeback reading a page) hold it shared while they copy an object
//!   out, and decompress it after; allocating, freeing and compacting
//!   hold it exclusive.  So an object neither moves nor is reused while
//!   it is copied, and a block leaves a class only under that class's
//!   exclusive lock.  Decompressing under the lock held a class's
//!   writers for 4 us a read: pmbench's two threads on compressed RAM
//!   spent 0.7 of their 16 thread-seconds waiting on class locks.
//! - `lists` (the blocks of each class by fullness, and the free blocks)
//!   is taken inside a class lock, never the other way round, and
//!   nothing is taken inside it; every list operation under it is O(1).
//!
//! A block's object bitmap and counts are atomics only so that they can
//! sit in a shared table: they change under the class's exclusive lock.

use crate::stats::{GaugeId, LockId};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::index_list::IndexLists;
use crate::stats::{Gauge, Registry, StatMutex};
use crate::sys::Mapping;
use crate::PAGE_SIZE;

/// Bytes per block: 16 pages.
pub const BLOCK: usize = 64 << 10;
/// Class sizes step by this much (zsmalloc's `ZS_SIZE_CLASS_DELTA` for 4
/// KiB pages): a page wastes half a step on average.
const STEP: usize = 16;
/// An object's header: the owning slot (u32) and the compressed length
/// (u16), little-endian, unaligned (objects are copied and decompressed
/// bytewise, never read as words).
pub const HEADER: usize = 6;
/// The largest packed object, header included (zram's `huge_class_size`
/// for 4 KiB pages is about this): a page whose object would be larger
/// is stored whole, which takes 4096 bytes but costs no decompression.
pub const MAX_PACKED: usize = 3264;
/// Packed classes, then the class of whole pages.
pub const CLASSES: usize = MAX_PACKED / STEP + 1;
/// The class of pages stored whole.
pub const WHOLE: usize = CLASSES - 1;
/// Objects in a block of the smallest class.
const MAX_OBJECTS: usize = BLOCK / STEP;
/// Fullness groups of a class's part-used blocks, each an eighth of a
/// block's objects (every class has at least 16 a block).
pub const GROUPS: usize = 8;
/// Lists a class has: its groups, then its full blocks.
const CLASS_LISTS: usize = GROUPS + 1;
/// The list of free blocks, after each class's lists.
const FREE: usize = CLASS_LISTS * CLASSES;
const LISTS: usize = CLASS_LISTS * CLASSES + 1;

/// The list of `class`'s part-used blocks in fullness group `g`.
fn group_list(class: usize, g: usize) -> usize {
    debug_assert!(g < GROUPS);
    CLASS_LISTS * class + g
}

/// The list of a class's full blocks.
fn full(class: usize) -> usize {
    CLASS_LISTS * class + GROUPS
}

/// The list a block of `class` holding `used` objects (1 or more) is on:
/// a group by the eighth of its objects in use, or the full list.
fn list_of(class: usize, used: usize) -> usize {
    let n = per_block(class);
    debug_assert!(used >= 1 && used <= n);
    if used == n {
        full(class)
    } else {
        group_list(class, used * GROUPS / n)
    }
}

/// Bytes per object of `class`.
pub fn class_size(class: usize) -> usize {
    if class == WHOLE {
        PAGE_SIZE
    } else {
        (class + 1) * STEP
    }
}

/// The class of a packed object of `len` compressed bytes, or `None` when
/// the page is to be stored whole.
pub fn packed_class(len: usize) -> Option<usize> {
    let object = len + HEADER;
    (object <= MAX_PACKED).then(|| object.div_ceil(STEP) - 1)
}

fn per_block(class: usize) -> usize {
    BLOCK / class_size(class)
}

/// Where an object is: its class, block and index in the block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handle {
    pub class: u8,
    pub block: u32,
    pub index: u16,
}

/// A block's objects in use.  Changed under its class's exclusive lock.
/// All zeros is a free block's (`table::zeroed`: the table of a large
/// store costs memory only for the blocks used).
struct BlockMeta {
    used: AtomicU32,
    map: [AtomicU64; MAX_OBJECTS / 64],
    /// The owners of whole pages (the class without headers).
    whole_owner: [AtomicU32; BLOCK / PAGE_SIZE],
}

// SAFETY: atomics only; zero is a valid value of each.
unsafe impl crate::table::Zeroed for BlockMeta {}

impl BlockMeta {
    fn is_set(&self, i: usize) -> bool {
        self.map[i / 64].load(Ordering::Relaxed) & (1 << (i % 64)) != 0
    }

    fn set(&self, i: usize, on: bool) {
        let w = &self.map[i / 64];
        let bit = 1u64 << (i % 64);
        let old = w.load(Ordering::Relaxed);
        w.store(if on { old | bit } else { old & !bit }, Ordering::Relaxed);
    }

    /// The first free object below `n`.
    fn first_free(&self, n: usize) -> Option<usize> {
        for (wi, w) in self.map.iter().enumerate().take(n.div_ceil(64)) {
            let free = !w.load(Ordering::Relaxed);
            if free != 0 {
                let i = wi * 64 + free.trailing_zeros() as usize;
                return (i < n).then_some(i);
            }
        }
        None
    }
}

/// A class's totals, under its lock.
#[derive(Default)]
struct ClassState {
    blocks: usize,
    objects: usize,
}

/// The packed store.  See the module documentation.
pub struct Pool {
    arena: Mapping,
    blocks: usize,
    meta: Box<[BlockMeta]>,
    classes: Box<[RwLock<ClassState>]>,
    lists: StatMutex<IndexLists<LISTS>>,
    used_blocks: AtomicUsize,
    /// Bytes of the objects stored, at their class's size: what the blocks
    /// in use hold, less the free objects in part-used blocks.
    object_bytes: AtomicUsize,
    /// Blocks in use, in bytes, summed over an instance's stores (zram's
    /// `mem_used_total`), and the most that ever were (`mem_used_max`).
    mem: Arc<Gauge>,
    mem_peak: Arc<Gauge>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("blocks", &self.blocks)
            .field("used_blocks", &self.used_blocks())
            .finish()
    }
}

impl Pool {
    /// A store of `blocks` blocks (address space now, memory as used).
    pub fn new(blocks: usize, registry: &Registry) -> Result<Pool, super::error::IoError> {
        assert!(blocks > 0 && blocks < u32::MAX as usize);
        let arena =
            Mapping::new(blocks * BLOCK, PAGE_SIZE).map_err(|source| super::error::IoError::Mmap {
                what: "a compressed swap device",
                source,
            })?;
        let mut lists = IndexLists::new(blocks);
        for b in 0..blocks as u32 {
            lists.push_tail(FREE, b);
        }
        Ok(Pool {
            arena,
            blocks,
            meta: crate::table::zeroed(blocks, "compressed store blocks")?,
            classes: (0..CLASSES).map(|_| RwLock::new(ClassState::default())).collect(),
            lists: StatMutex::new(lists, registry.lock_site(LockId::STORE_BLOCKS)),
            used_blocks: AtomicUsize::new(0),
            object_bytes: AtomicUsize::new(0),
            mem: registry.gauge(GaugeId::STORE_MEM_BYTES),
            mem_peak: registry.gauge(GaugeId::STORE_MEM_PEAK_BYTES),
        })
    }

    /// Blocks this store may use.
    pub fn capacity_blocks(&self) -> usize {
        self.blocks
    }

    /// Blocks in use (holding at least one object).
    pub fn used_blocks(&self) -> usize {
        self.used_blocks.load(Ordering::Relaxed)
    }

    /// Bytes of free objects in part-used blocks: what compaction could
    /// give back, at most.
    pub fn fragmented_bytes(&self) -> usize {
        (self.used_blocks() * BLOCK).saturating_sub(self.object_bytes.load(Ordering::Relaxed))
    }

    fn write_lock(&self, class: usize) -> RwLockWriteGuard<'_, ClassState> {
        self.classes[class]
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn read_lock(&self, class: usize) -> RwLockReadGuard<'_, ClassState> {
        self.classes[class].read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The address of object `index` of `block` in `class`.
    fn object_addr(&self, class: usize, block: u32, index: usize) -> *mut u8 {
        debug_assert!((block as usize) < self.blocks && index < per_block(class));
        (self.arena.addr() as usize + block as usize * BLOCK + index * class_size(class)) as *mut u8
    }

    /// Store `data` for slot `owner` in `class` (`data` is a whole page
    /// for [`WHOLE`], else at most `class_size - HEADER` bytes).  `None`
    /// when the class has no free object and no block is free.
    pub fn alloc(&self, class: usize, owner: u32, data: &[u8]) -> Option<Handle> {
        let mut cs = self.write_lock(class);
        let (block, index) = {
            let mut l = self.lists.lock();
            // The fullest part-used block, else a free one.
            let fullest = (0..GROUPS).rev().find_map(|g| l.head(group_list(class, g)));
            let (block, from) = match fullest {
                Some(b) => (b, Some(list_of(class, self.meta[b as usize].used.load(Ordering::Relaxed) as usize))),
                None => {
                    let b = l.head(FREE)?;
                    l.unlink(FREE, b);
                    cs.blocks += 1;
                    self.used_blocks.fetch_add(1, Ordering::Relaxed);
                    self.mem.add(BLOCK as i64);
                    self.mem_peak.raise_to(self.mem.get());
                    (b, None)
                }
            };
            let m = &self.meta[block as usize];
            let n = per_block(class);
            let index = m.first_free(n).expect("a part-used block has a free object");
            m.set(index, true);
            let used = m.used.load(Ordering::Relaxed) + 1;
            m.used.store(used, Ordering::Relaxed);
            let to = list_of(class, used as usize);
            if from != Some(to) {
                if let Some(from) = from {
                    l.unlink(from, block);
                }
                // At the head: the next allocation fills it further.
                l.push_head(to, block);
            }
            (block, index)
        };
        cs.objects += 1;
        self.object_bytes.fetch_add(class_size(class), Ordering::Relaxed);
        self.put(class, block, index, owner, data);
        Some(Handle {
            class: class as u8,
            block,
            index: index as u16,
        })
    }

    /// Write an object into its place; the class's exclusive lock is held.
    fn put(&self, class: usize, block: u32, index: usize, owner: u32, data: &[u8]) {
        let at = self.object_addr(class, block, index);
        if class == WHOLE {
            assert_eq!(data.len(), PAGE_SIZE);
            self.meta[block as usize].whole_owner[index].store(owner, Ordering::Relaxed);
            // SAFETY: `at` is a free object of PAGE_SIZE bytes in our
            // mapping, which no reader reads (readers hold the class lock
            // shared; we hold it exclusive).
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), at, PAGE_SIZE) };
            return;
        }
        assert!(data.len() + HEADER <= class_size(class));
        let mut header = [0u8; HEADER];
        header[..4].copy_from_slice(&owner.to_le_bytes());
        header[4..6].copy_from_slice(&(data.len() as u16).to_le_bytes());
        // SAFETY: as above: `class_size` bytes at `at` are ours to write,
        // and header plus data fit in them (asserted).
        unsafe {
            std::ptr::copy_nonoverlapping(header.as_ptr(), at, HEADER);
            std::ptr::copy_nonoverlapping(data.as_ptr(), at.add(HEADER), data.len());
        }
    }

    /// The owner and bytes of an object; its class's lock is held.
    fn object(&self, h: Handle) -> (u32, &[u8]) {
        let class = h.class as usize;
        let at = self.object_addr(class, h.block, h.index as usize);
        if class == WHOLE {
            let owner = self.meta[h.block as usize].whole_owner[h.index as usize].load(Ordering::Relaxed);
            // SAFETY: a live object of PAGE_SIZE bytes; no writer while
            // the caller holds the class lock.
            return (owner, unsafe { std::slice::from_raw_parts(at, PAGE_SIZE) });
        }
        let mut header = [0u8; HEADER];
        // SAFETY: the object's header, inside the mapping, no writer.
        unsafe { std::ptr::copy_nonoverlapping(at, header.as_mut_ptr(), HEADER) };
        let owner = u32::from_le_bytes(header[..4].try_into().unwrap());
        let len =
            (u16::from_le_bytes(header[4..6].try_into().unwrap()) as usize).min(class_size(class) - HEADER);
        // SAFETY: the object's bytes, inside its `class_size`, no writer.
        (owner, unsafe { std::slice::from_raw_parts(at.add(HEADER), len) })
    }

    /// Run `f` on the bytes of the object `locate` names, `locate` being
    /// called with `class`'s lock held shared, so that the object it finds
    /// stays put while it is read.  A packed object is copied out under
    /// the lock and `f` runs on the copy after it is released (a
    /// decompression holds no writer of the class); a whole page is
    /// handed to `f` in place, under the lock, as copying it is all `f`
    /// does with it.  `None` when `locate` finds nothing (the owner's
    /// object moved to another class or went).
    pub fn read<R>(
        &self,
        class: usize,
        locate: impl FnOnce() -> Option<Handle>,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Option<R> {
        let mut copy = [0u8; MAX_PACKED];
        let len = {
            let _shared = self.read_lock(class);
            let h = locate()?;
            debug_assert_eq!(h.class as usize, class);
            let bytes = self.object(h).1;
            if class == WHOLE {
                return Some(f(bytes));
            }
            copy[..bytes.len()].copy_from_slice(bytes);
            bytes.len()
        };
        Some(f(&copy[..len]))
    }

    /// Free the object `h`; returns the bytes it held (4096 for a whole
    /// page).  A block left empty goes back to the kernel and to the free
    /// blocks.
    pub fn free(&self, h: Handle) -> usize {
        let class = h.class as usize;
        let mut cs = self.write_lock(class);
        let len = self.object(h).1.len();
        cs.objects -= 1;
        self.object_bytes.fetch_sub(class_size(class), Ordering::Relaxed);
        let m = &self.meta[h.block as usize];
        debug_assert!(m.is_set(h.index as usize), "freeing a free object {h:?}");
        m.set(h.index as usize, false);
        let used = m.used.load(Ordering::Relaxed);
        m.used.store(used - 1, Ordering::Relaxed);
        let from = list_of(class, used as usize);
        let mut l = self.lists.lock();
        if used == 1 {
            l.unlink(from, h.block);
            drop(l);
            cs.blocks -= 1;
            self.release(h.block);
        } else {
            let to = list_of(class, used as usize - 1);
            if to != from {
                l.unlink(from, h.block);
                l.push_tail(to, h.block);
            }
        }
        len
    }

    /// Hand an empty block (on no list; its class's lock held) back to
    /// the kernel, then to the free list: in that order, so that no other
    /// class writes into it before its old pages are dropped.
    fn release(&self, block: u32) {
        let addr = self.arena.addr() + block as u64 * BLOCK as u64;
        self.arena.discard(addr, BLOCK);
        self.used_blocks.fetch_sub(1, Ordering::Relaxed);
        self.mem.add(-(BLOCK as i64));
        self.lists.lock().push_tail(FREE, block);
    }

    /// Move objects out of the emptiest blocks of each class into the
    /// fullest, until no class could free a block by moving more.  Each
    /// move asks `relocate(owner, from, to)` to repoint the owner; an
    /// owner that refuses (its object is being written back) keeps its
    /// object where it is.  Returns the blocks freed.
    pub fn compact(&self, mut relocate: impl FnMut(u32, Handle, Handle) -> bool) -> usize {
        let mut freed = 0;
        for class in 0..CLASSES {
            freed += self.compact_class(class, &mut relocate);
        }
        freed
    }

    fn compact_class(&self, class: usize, relocate: &mut impl FnMut(u32, Handle, Handle) -> bool) -> usize {
        let n = per_block(class);
        let mut freed = 0;
        // Each round empties one block or fills one, so it ends; a round
        // that moves nothing (every object refused) ends it too.  The
        // class lock is taken per round, so that faults reading this class
        // wait for one block's moves at most, not the whole class's.
        loop {
            let mut cs = self.write_lock(class);
            if cs.blocks * n - cs.objects < n {
                break; // the objects would not fit in fewer blocks
            }
            let (src, dst) = {
                let l = self.lists.lock();
                // The head of the emptiest group, and of the fullest, or
                // the one after it where both are the same block.
                let Some(src) = (0..GROUPS).find_map(|g| l.head(group_list(class, g))) else {
                    break;
                };
                let after = |b: u32| Some(l.next(b)).filter(|&n| n != crate::index_list::NIL);
                let dst = (0..GROUPS)
                    .rev()
                    .find_map(|g| l.head(group_list(class, g)))
                    .and_then(|d| if d == src { after(d) } else { Some(d) });
                let Some(dst) = dst else {
                    break;
                };
                (src, dst)
            };
            let lists_of = |b: u32| list_of(class, self.meta[b as usize].used.load(Ordering::Relaxed) as usize);
            let (src_list, dst_list) = (lists_of(src), lists_of(dst));
            let (sm, dm) = (&self.meta[src as usize], &self.meta[dst as usize]);
            let mut moved = 0;
            for i in 0..n {
                if !sm.is_set(i) {
                    continue;
                }
                let Some(j) = dm.first_free(n) else {
                    break;
                };
                let from = Handle {
                    class: class as u8,
                    block: src,
                    index: i as u16,
                };
                let to = Handle {
                    class: class as u8,
                    block: dst,
                    index: j as u16,
                };
                let owner = self.object(from).0;
                // The whole object, header and all, to its new place: two
                // objects of one class never overlap, and no reader is in
                // this class.
                let size = class_size(class);
                // SAFETY: both are objects of this class inside the arena
                // (`object_addr`), distinct (another block), and we hold
                // the class's exclusive lock.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.object_addr(class, src, i),
                        self.object_addr(class, dst, j),
                        size,
                    )
                };
                if class == WHOLE {
                    dm.whole_owner[j].store(owner, Ordering::Relaxed);
                }
                if !relocate(owner, from, to) {
                    continue;
                }
                dm.set(j, true);
                dm.used.fetch_add(1, Ordering::Relaxed);
                sm.set(i, false);
                sm.used.fetch_sub(1, Ordering::Relaxed);
                moved += 1;
            }
            let mut l = self.lists.lock();
            let dst_now = lists_of(dst);
            if dst_now != dst_list {
                l.unlink(dst_list, dst);
                l.push_head(dst_now, dst);
            }
            if sm.used.load(Ordering::Relaxed) == 0 {
                l.unlink(src_list, src);
                drop(l);
                cs.blocks -= 1;
                self.release(src);
                freed += 1;
            } else {
                let src_now = lists_of(src);
                if src_now != src_list {
                    l.unlink(src_list, src);
                    l.push_tail(src_now, src);
                }
                if moved == 0 {
                    break;
                }
            }
        }
        freed
    }

    /// Check the store's bookkeeping: every block on exactly one list,
    /// each list's blocks of the right fullness, counts that add up.
    pub fn check(&self) -> Result<(), String> {
        let guards: Vec<_> = (0..CLASSES).map(|c| self.write_lock(c)).collect();
        let l = self.lists.lock();
        let mut seen = vec![false; self.blocks];
        let mut used_blocks = 0;
        for (c, cs) in guards.iter().enumerate() {
            let n = per_block(c);
            let (mut blocks, mut objects) = (0, 0);
            for list in (0..GROUPS).map(|g| group_list(c, g)).chain([full(c)]) {
                for b in l.iter(list) {
                    if std::mem::replace(&mut seen[b as usize], true) {
                        return Err(format!("block {b} on two lists"));
                    }
                    let m = &self.meta[b as usize];
                    let used = m.used.load(Ordering::Relaxed) as usize;
                    let bits = (0..n).filter(|&i| m.is_set(i)).count();
                    if used != bits || used == 0 || list_of(c, used) != list {
                        return Err(format!(
                            "class {c} block {b}: used {used}, {bits} objects set, on list {} of its {CLASS_LISTS}",
                            list - CLASS_LISTS * c
                        ));
                    }
                    blocks += 1;
                    objects += used;
                }
            }
            if blocks != cs.blocks || objects != cs.objects {
                return Err(format!(
                    "class {c}: {blocks} blocks and {objects} objects, counted {} and {}",
                    cs.blocks, cs.objects
                ));
            }
            used_blocks += blocks;
        }
        for b in l.iter(FREE) {
            if std::mem::replace(&mut seen[b as usize], true) {
                return Err(format!("free block {b} on two lists"));
            }
        }
        if let Some(b) = seen.iter().position(|s| !s) {
            return Err(format!("block {b} on no list"));
        }
        if used_blocks != self.used_blocks() {
            return Err(format!(
                "{used_blocks} blocks in use, counted {}",
                self.used_blocks()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// The bytes owner `o` stores: `len` of them, a pattern of its own.
    fn bytes(o: u32, len: usize) -> Vec<u8> {
        (0..len).map(|i| (o as usize * 31 + i * 7) as u8).collect()
    }

    /// What a stored object should read back as.
    fn read_back(p: &Pool, h: Handle) -> Vec<u8> {
        p.read(h.class as usize, || Some(h), |b| b.to_vec()).unwrap()
    }

    proptest::proptest! {
        /// Allocations, frees and compactions in any order, against a
        /// map of what each owner stored: every object reads back as
        /// written (compaction's relocations included), each block is
        /// on the list of its fullness, the counts add up, and a store
        /// emptied gives every block back.
        #[test]
        fn objects_survive_any_allocs_frees_and_compactions(
            ops in proptest::collection::vec((0u8..10, 0usize..4, 0u32..400), 1..300),
        ) {
            let reg = crate::stats::Registry::new();
            // Few blocks, so that the store fills and compaction has work.
            let p = Pool::new(48, &reg).unwrap();
            // Four sizes: two classes of many objects a block, one near
            // the largest packed class, and whole pages.
            let sizes = [40usize, 300, MAX_PACKED - HEADER, PAGE_SIZE];
            let mut live: HashMap<u32, (Handle, Vec<u8>)> = HashMap::new();
            let mut next = 0u32;
            for (op, size, pick) in ops {
                match op {
                    0..=5 => {
                        let len = sizes[size];
                        let class = if len == PAGE_SIZE { WHOLE } else { packed_class(len).unwrap() };
                        let data = bytes(next, len);
                        if let Some(h) = p.alloc(class, next, &data) {
                            live.insert(next, (h, data));
                        }
                        next += 1;
                    }
                    6..=8 => {
                        let mut owners: Vec<u32> = live.keys().copied().collect();
                        owners.sort_unstable();
                        if let Some(&o) = owners.get(pick as usize % owners.len().max(1)) {
                            let (h, data) = live.remove(&o).unwrap();
                            let len = if h.class as usize == WHOLE { PAGE_SIZE } else { data.len() };
                            proptest::prop_assert_eq!(p.free(h), len);
                        }
                    }
                    _ => {
                        // Refuse every fifth move, as a writeback in
                        // flight does.
                        let mut k = 0;
                        p.compact(|owner, from, to| {
                            k += 1;
                            if k % 5 == 0 {
                                return false;
                            }
                            let e = live.get_mut(&owner).expect("a live owner");
                            assert_eq!(e.0, from, "owner {owner} relocated from where it is not");
                            e.0 = to;
                            true
                        });
                    }
                }
                proptest::prop_assert_eq!(p.check(), Ok(()));
                for (o, (h, data)) in &live {
                    let got = read_back(&p, *h);
                    proptest::prop_assert!(got == *data, "owner {o} at {h:?} reads back other bytes");
                }
            }
            for (_, (h, _)) in live.drain() {
                p.free(h);
            }
            proptest::prop_assert_eq!(p.check(), Ok(()));
            proptest::prop_assert_eq!(p.used_blocks(), 0);
        }
    }

    /// Compaction gathers a class's scattered objects into the fewest
    /// blocks they fit in, taking from the emptiest and filling the
    /// fullest.
    #[test]
    fn compaction_leaves_the_fewest_blocks() {
        let reg = crate::stats::Registry::new();
        let p = Pool::new(64, &reg).unwrap();
        let class = packed_class(300).unwrap();
        let n = per_block(class);
        let mut hs = Vec::new();
        for o in 0..(8 * n) as u32 {
            hs.push((o, p.alloc(class, o, &bytes(o, 300)).unwrap()));
        }
        assert_eq!(p.used_blocks(), 8);
        // Free all but every third object: each block keeps a third.
        let mut keep = Vec::new();
        for (o, h) in hs {
            if o % 3 == 0 {
                keep.push((o, h));
            } else {
                p.free(h);
            }
        }
        let objects = keep.len();
        let mut at: HashMap<u32, Handle> = keep.into_iter().collect();
        let freed = p.compact(|o, from, to| {
            assert_eq!(at.insert(o, to), Some(from));
            true
        });
        p.check().unwrap();
        assert_eq!(p.used_blocks(), objects.div_ceil(n), "{freed} freed");
        for (o, h) in at {
            assert_eq!(read_back(&p, h), bytes(o, 300));
        }
    }
}
