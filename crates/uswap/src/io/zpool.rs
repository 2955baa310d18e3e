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
//! # Locks
//!
//! - Each class has a reader-writer lock.  Readers (a fault decompressing
//!   a page) hold it shared while they read an object; allocating,
//!   freeing and compacting hold it exclusive.  So an object neither moves
//!   nor is reused while it is read, and a block leaves a class only under
//!   that class's exclusive lock.
//! - `lists` (the blocks of each class, with room or full, and the free
//!   blocks) is taken inside a class lock, never the other way round, and
//!   nothing is taken inside it.
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
/// The list of free blocks, after each class's two lists.
const FREE: usize = 2 * CLASSES;
const LISTS: usize = 2 * CLASSES + 1;

/// The list of a class's blocks that have a free object.
fn room(class: usize) -> usize {
    2 * class
}

/// The list of a class's full blocks.
fn full(class: usize) -> usize {
    2 * class + 1
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
            let block = match l.head(room(class)) {
                Some(b) => b,
                None => {
                    let b = l.head(FREE)?;
                    l.unlink(FREE, b);
                    l.push_tail(room(class), b);
                    cs.blocks += 1;
                    self.used_blocks.fetch_add(1, Ordering::Relaxed);
                    self.mem.add(BLOCK as i64);
                    self.mem_peak.raise_to(self.mem.get());
                    b
                }
            };
            let m = &self.meta[block as usize];
            let n = per_block(class);
            let index = m.first_free(n).expect("a block on a room list has a free object");
            m.set(index, true);
            let used = m.used.load(Ordering::Relaxed) + 1;
            m.used.store(used, Ordering::Relaxed);
            if used as usize == n {
                l.unlink(room(class), block);
                l.push_tail(full(class), block);
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
    /// stays put until `f` returns.  `None` when `locate` finds nothing
    /// (the owner's object moved to another class or went).
    pub fn read<R>(
        &self,
        class: usize,
        locate: impl FnOnce() -> Option<Handle>,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Option<R> {
        let _shared = self.read_lock(class);
        let h = locate()?;
        debug_assert_eq!(h.class as usize, class);
        Some(f(self.object(h).1))
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
        let was_full = used as usize == per_block(class);
        let mut l = self.lists.lock();
        if used == 1 {
            l.unlink(if was_full { full(class) } else { room(class) }, h.block);
            drop(l);
            cs.blocks -= 1;
            self.release(h.block);
        } else if was_full {
            l.unlink(full(class), h.block);
            l.push_tail(room(class), h.block);
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
                let used = |b: u32| self.meta[b as usize].used.load(Ordering::Relaxed);
                let Some(src) = l.iter(room(class)).min_by_key(|&b| used(b)) else {
                    break;
                };
                let Some(dst) = l.iter(room(class)).filter(|&b| b != src).max_by_key(|&b| used(b)) else {
                    break;
                };
                (src, dst)
            };
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
            if dm.used.load(Ordering::Relaxed) as usize == n {
                l.unlink(room(class), dst);
                l.push_tail(full(class), dst);
            }
            if sm.used.load(Ordering::Relaxed) == 0 {
                l.unlink(room(class), src);
                drop(l);
                cs.blocks -= 1;
                self.release(src);
                freed += 1;
            } else if moved == 0 {
                break;
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
            for (list, is_full) in [(room(c), false), (full(c), true)] {
                for b in l.iter(list) {
                    if std::mem::replace(&mut seen[b as usize], true) {
                        return Err(format!("block {b} on two lists"));
                    }
                    let m = &self.meta[b as usize];
                    let used = m.used.load(Ordering::Relaxed) as usize;
                    let bits = (0..n).filter(|&i| m.is_set(i)).count();
                    if used != bits || used == 0 || (used == n) != is_full {
                        return Err(format!(
                            "class {c} block {b}: used {used}, {bits} objects set, on the {} list",
                            if is_full { "full" } else { "room" }
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
