//! The compressed device: pages compressed into a packed store in memory
//! (zram), with an optional file behind it that the store's coldest pages
//! are written back to when it reaches its limit (zswap's shrinker,
//! zram's writeback).
//!
//! Each slot has one entry word saying where its page is:
//!
//! - `EMPTY`: nothing (reads zeros);
//! - `SAME`: a page of one repeated 8-byte word, kept as that word
//!   (zram's same-filled pages: zero pages above all), no store memory;
//! - `STORED(h)`: in the packed store, object `h` (compressed, or whole
//!   when it did not compress);
//! - `FILE`: in the file behind, at the same slot;
//! - `WB(h)`: being written back: in the store at `h` and on its way to
//!   the file; `WB_DEAD(h)` the same, but the slot was freed meanwhile;
//! - `BUSY`: its owner is writing it.
//!
//! Who moves an entry: the slot's owner (the pager, which writes, reads
//! and discards a slot, never two at once: the swap space gives a slot
//! one owner) and the store itself (writeback: `STORED -> WB -> FILE`;
//! compaction: `STORED(h) -> STORED(h')`).  Every move is a compare-and-
//! swap, so the two never undo each other:
//!
//! - The owner writes by first swapping any entry but `WB*` to `BUSY`
//!   (waiting out a writeback in flight, one IO at most), which keeps
//!   writeback off the slot while the file slot is written.
//! - Writeback only starts from `STORED`, and only the writeback that set
//!   `WB(h)` ends it: `FILE` when the write worked, `STORED(h)` again when
//!   it failed (the page stays in the store: never lost between tiers),
//!   `EMPTY` when the owner discarded it meanwhile (`WB_DEAD`); it frees
//!   `h` in the first and last case.
//! - Compaction moves only `STORED` objects, so a writeback's `h` stays
//!   put.
//! - A reader finds an object under its class's shared lock and checks
//!   the entry again there: compaction and frees hold that lock exclusive.
//!
//! With a file behind, stored slots are on an LRU list in the order they
//! were stored (oldest first: the coldest, as zswap's LRU), linked exactly
//! while their entry is `STORED`, under the `store_lru` lock.

mod accounts;
mod device;
mod entry;
mod sample;

use crate::stats::LockId;
use std::sync::atomic::{AtomicU64, Ordering};

use super::codec::Contexts;
use super::device::IoDevice;
use super::error::IoError;
use super::options::CompressedOptions;
use super::zpool::{self, Handle, Pool, BLOCK, HEADER, MAX_PACKED, WHOLE};
use crate::index_list::IndexLists;
use crate::stats::{Registry, StatMutex};
use crate::sys::Mapping;
use crate::PAGE_SIZE;

use accounts::Accounts;
use entry::{entry, handle, holds_object, tag, BUSY, EMPTY, FILE, SAME, STORED, TAG_SHIFT, WB, WB_DEAD};
use sample::{looks_incompressible, same_word};

const PAGE: u64 = PAGE_SIZE as u64;

/// The smallest store with a file behind: 1 MiB.
const MIN_BLOCKS: usize = 16;

/// Free bytes in part-used blocks that are never worth a compaction:
/// a part-used block for each of a hundred classes is normal.
const COMPACT_SLACK: usize = 64 * BLOCK;

/// How long writeback rests after a failure.
const WRITEBACK_HOLD_NS: u64 = 20_000_000;

/// Pages written back to the file per writeback pass.
const WRITEBACK_BATCH: usize = 64;

/// Where a page being written goes, decided before its slot is taken.
enum Placement {
    Same(u64),
    Packed { class: usize, len: usize },
    Whole,
    File,
}

/// The writeback pass's buffer, under the `store_writeback` lock.
struct WritebackBuf {
    /// `WRITEBACK_BATCH` pages, 4096-aligned for `O_DIRECT`.
    pages: Mapping,
    batch: [(u32, Handle); WRITEBACK_BATCH],
}

/// The store of a compressed device.  See the module documentation.
pub(crate) struct CompressedStore {
    entries: Box<[AtomicU64]>,
    /// The word of each `SAME` slot.
    words: Box<[AtomicU64]>,
    pool: Pool,
    codec: Contexts,
    file: Option<IoDevice>,
    incompressible_to_file: bool,
    sample_check: bool,
    keep_copies: bool,
    /// Stored slots, oldest first, while a file is behind.
    lru: StatMutex<IndexLists<1>>,
    writeback: StatMutex<WritebackBuf>,
    /// After a writeback failed, none is tried before this
    /// `CLOCK_MONOTONIC` nanosecond: a full or failing file is not asked
    /// again for every page (the pager backs off on the `ENOSPC` the
    /// store then returns).
    writeback_held_until: AtomicU64,
    /// Compact when the part-used blocks hold this many free bytes: set
    /// after each compaction above what it left, so that a store whose
    /// free bytes no compaction can gather (every class keeps one
    /// part-used block) is not compacted again and again.
    compact_at: AtomicU64,
    compacting: std::sync::atomic::AtomicBool,
    acct: Accounts,
}

impl CompressedStore {
    pub fn new(opts: &CompressedOptions, registry: &Registry) -> Result<CompressedStore, IoError> {
        // The file (or NBD export) behind keeps its own IO counters out
        // of the instance's: its writes are writebacks, counted as such.
        // Opened first: an export's size is its server's to say.
        let file = match (&opts.file, &opts.nbd) {
            (Some(f), _) => Some(IoDevice::file(f, &Registry::new())?),
            (None, Some(t)) => Some(IoDevice::nbd(t, &Registry::new())?),
            (None, None) => None,
        };
        let slots = file.as_ref().map_or(opts.limit / PAGE, |f| f.slots());
        if slots == 0 {
            return Err(IoError::ZeroSize);
        }
        if slots > u32::MAX as u64 {
            return Err(IoError::Range {
                offset: 0,
                pages: slots,
                slots: u32::MAX as u64,
            });
        }
        // Alone, room for every slot's page stored whole, plus a part-used
        // block per class; with a file, the limit (at least a megabyte:
        // a class that finds no block free gets one by writing back).
        let blocks = match &file {
            None => (slots * PAGE).div_ceil(BLOCK as u64) as usize + zpool::CLASSES,
            Some(_) => ((opts.limit / BLOCK as u64) as usize).max(MIN_BLOCKS),
        };
        let pool = Pool::new(blocks, registry)?;
        let codec = Contexts::new(opts.codec)?;
        let table = |what| crate::table::zeroed::<AtomicU64>(slots as usize, what);
        let lru_len = if file.is_some() { slots as usize } else { 0 };
        let acct = Accounts::new(registry);
        acct.limit.add((blocks * BLOCK) as i64);
        Ok(CompressedStore {
            entries: table("compressed slot entries")?,
            words: table("same-filled words")?,
            pool,
            codec,
            file,
            incompressible_to_file: opts.incompressible_to_file,
            sample_check: opts.samples(),
            keep_copies: opts.keep_copies,
            lru: StatMutex::new(
                IndexLists::new_lazy(lru_len, "compressed store LRU")?,
                registry.lock_site(LockId::STORE_LRU),
            ),
            writeback: StatMutex::new(
                WritebackBuf {
                    pages: Mapping::new(WRITEBACK_BATCH * PAGE_SIZE, PAGE_SIZE).map_err(|source| {
                        IoError::Mmap {
                            what: "a compressed swap device",
                            source,
                        }
                    })?,
                    batch: [(
                        0,
                        Handle {
                            class: 0,
                            block: 0,
                            index: 0,
                        },
                    ); WRITEBACK_BATCH],
                },
                registry.lock_site(LockId::STORE_WRITEBACK),
            ),
            writeback_held_until: AtomicU64::new(0),
            compact_at: AtomicU64::new(COMPACT_SLACK as u64),
            compacting: std::sync::atomic::AtomicBool::new(false),
            acct,
        })
    }

    fn entry(&self, slot: u64) -> &AtomicU64 {
        &self.entries[slot as usize]
    }

    /// Decide where `page` goes: same-filled, packed (compressed into
    /// `out`), whole, or straight to the file.
    fn place(&self, page: &[u8], out: &mut [u8]) -> Placement {
        if let Some(w) = same_word(page) {
            return Placement::Same(w);
        }
        if !(self.sample_check && looks_incompressible(page)) {
            if let Some(len) = self.codec.compress(page, &mut out[..MAX_PACKED - HEADER]) {
                return Placement::Packed {
                    class: zpool::packed_class(len).expect("fits by the buffer's size"),
                    len,
                };
            }
        }
        // Does not compress: whole, or to the file.
        if self.file.is_some() && self.incompressible_to_file {
            Placement::File
        } else {
            Placement::Whole
        }
    }

    /// Take slot `slot` for its owner to write: `BUSY`, after any
    /// writeback in flight on it ended.  Returns the old entry, whose
    /// object (if any) is the caller's to free.
    fn take(&self, slot: u64) -> u64 {
        let e = self.entry(slot);
        loop {
            let old = e.load(Ordering::Acquire);
            match tag(old) {
                WB | WB_DEAD => {
                    // One write of a batch at most; rare (a slot written
                    // again while its old copy goes to the file).
                    std::thread::yield_now();
                    continue;
                }
                BUSY => {
                    // Two owners at once: the caller's bug.  Wait rather
                    // than corrupt (this may run in a signal handler).
                    debug_assert!(false, "slot {slot} written by two owners at once");
                    std::thread::yield_now();
                    continue;
                }
                _ => {
                    if self.replace(slot, old, BUSY << TAG_SHIFT) {
                        return old;
                    }
                }
            }
        }
    }

    /// Compare-and-swap `slot`'s entry from `cur` to `new`, keeping the
    /// LRU exact: an entry leaving `STORED` is unlinked under the same
    /// lock (with a file behind; alone, the store keeps no LRU).
    fn replace(&self, slot: u64, cur: u64, new: u64) -> bool {
        let cas = || {
            self.entry(slot)
                .compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        };
        if tag(cur) != STORED || self.file.is_none() {
            return cas();
        }
        let mut l = self.lru.lock();
        let ok = cas();
        if ok {
            l.unlink(0, slot as u32);
        }
        ok
    }

    /// Account for, and free, what an old entry held (its slot no longer
    /// refers to it).
    fn release(&self, old: u64) {
        match tag(old) {
            SAME => {
                self.acct.same.add(-1);
                self.acct.orig.add(-(PAGE as i64));
            }
            FILE => self.acct.file.add(-1),
            STORED => self.free_object(handle(old)),
            _ => {}
        }
    }

    fn free_object(&self, h: Handle) {
        let compr = self.pool.free(h);
        self.acct.compr.add(-(compr as i64));
        self.acct.orig.add(-(PAGE as i64));
        if h.class as usize == WHOLE {
            self.acct.whole.add(-1);
        }
    }

    /// Compact when fragmented: when the free bytes in part-used blocks
    /// are an eighth of the store and past the mark the last compaction
    /// set.  One thread at a time; from the write path (reclaim), never
    /// from a fault.
    fn maybe_compact(&self) {
        let frag = self.pool.fragmented_bytes() as u64;
        let mem = (self.pool.used_blocks() * BLOCK) as u64;
        if frag < mem / 8 || frag < self.compact_at.load(Ordering::Relaxed) {
            return;
        }
        if self.compacting.swap(true, Ordering::Acquire) {
            return;
        }
        self.compact();
        let left = self.pool.fragmented_bytes() as u64;
        let mem = (self.pool.used_blocks() * BLOCK) as u64;
        self.compact_at
            .store(left + mem / 16 + COMPACT_SLACK as u64, Ordering::Relaxed);
        self.compacting.store(false, Ordering::Release);
    }

    /// Store `buf`'s pages at `offset..`: each where [`place`](Self::place)
    /// puts it, a run of neighbouring pages placed in the file with one
    /// write (the pager hands over a folio's run of slots at once, and a
    /// page at a time would be a synchronous IO each).
    fn write_pages(&self, offset: u64, buf: &[u8]) -> Result<(), IoError> {
        // Pages placed in the file, their slots taken (`BUSY`) and not yet
        // written: page indexes `run.0..run.0 + run.1` of `buf`.
        let mut run: Option<(usize, usize)> = None;
        let flush = |(s, n): (usize, usize)| {
            self.write_file_run(offset + s as u64, &buf[s * PAGE_SIZE..(s + n) * PAGE_SIZE])
        };
        for (i, page) in buf.chunks_exact(PAGE_SIZE).enumerate() {
            let slot = offset + i as u64;
            self.maybe_compact();
            let mut out = [0u8; MAX_PACKED];
            let placement = self.place(page, &mut out);
            if let Placement::File = placement {
                let old = self.take(slot);
                self.release(old);
                run = Some(run.map_or((i, 1), |(s, n)| (s, n + 1)));
                continue;
            }
            if let Some(r) = run.take() {
                flush(r)?;
            }
            self.store_page(slot, page, placement, &out)?;
        }
        run.map_or(Ok(()), flush)
    }

    /// Write a run of pages placed in the file, their slots `BUSY`: all
    /// `FILE` when the write worked, all `EMPTY` when it failed (the
    /// caller keeps the pages and tries again).
    fn write_file_run(&self, first: u64, pages: &[u8]) -> Result<(), IoError> {
        let n = (pages.len() / PAGE_SIZE) as u64;
        let file = self.file.as_ref().expect("placed in a file");
        let written = file.write(first, pages);
        let new = if written.is_ok() { FILE << TAG_SHIFT } else { EMPTY };
        for slot in first..first + n {
            self.entry(slot).store(new, Ordering::Release);
        }
        if written.is_ok() {
            self.acct.to_file.add(n);
            self.acct.file.add(n as i64);
        }
        written
    }

    /// Store one page at `slot`, placed in memory: same-filled, or an
    /// object (`out` holds its compressed bytes).
    fn store_page(&self, slot: u64, page: &[u8], placement: Placement, out: &[u8]) -> Result<(), IoError> {
        let old = self.take(slot);
        self.release(old);
        let e = self.entry(slot);
        let new = match placement {
            Placement::Same(w) => {
                self.words[slot as usize].store(w, Ordering::Relaxed);
                self.acct.same.add(1);
                self.acct.orig.add(PAGE as i64);
                SAME << TAG_SHIFT
            }
            Placement::Packed { .. } | Placement::Whole => {
                let (class, data) = match placement {
                    Placement::Packed { class, len } => (class, &out[..len]),
                    _ => (WHOLE, page),
                };
                let Some(h) = self.alloc(slot, class, data) else {
                    e.store(EMPTY, Ordering::Release);
                    return Err(full(slot));
                };
                entry(STORED, h)
            }
            Placement::File => unreachable!("a file run is written by write_file_run"),
        };
        if tag(new) == STORED && self.file.is_some() {
            let mut l = self.lru.lock();
            e.store(new, Ordering::Release);
            l.push_tail(0, slot as u32);
        } else {
            e.store(new, Ordering::Release);
        }
        Ok(())
    }

    /// An object in `class` for `data`, making room when the store is
    /// full: compaction first, then writeback to the file.
    fn alloc(&self, slot: u64, class: usize, data: &[u8]) -> Option<Handle> {
        loop {
            if let Some(h) = self.pool.alloc(class, slot as u32, data) {
                self.acct
                    .compr
                    .add(if class == WHOLE { PAGE_SIZE } else { data.len() } as i64);
                self.acct.orig.add(PAGE as i64);
                if class == WHOLE {
                    self.acct.whole.add(1);
                }
                return Some(h);
            }
            if !self.make_room() {
                return None;
            }
        }
    }

    /// Free at least a block: compact, else write the oldest pages back.
    fn make_room(&self) -> bool {
        if self.compact() > 0 {
            return true;
        }
        if self.file.is_none()
            || crate::sys::monotonic_ns() < self.writeback_held_until.load(Ordering::Relaxed)
        {
            return false;
        }
        let wrote = self.write_back();
        // Pages written back leave holes in their blocks; gather them.
        self.compact();
        wrote > 0 || self.pool.used_blocks() < self.pool.capacity_blocks()
    }

    /// Compact the store; the blocks freed.
    pub fn compact(&self) -> usize {
        let freed = self.pool.compact(|owner, from, to| {
            self.entry(owner as u64)
                .compare_exchange(
                    entry(STORED, from),
                    entry(STORED, to),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
        });
        self.acct.compacted.add(freed as u64);
        self.acct.compactions.inc();
        freed
    }

    /// Write the oldest stored pages back to the file, one pass of up to
    /// [`WRITEBACK_BATCH`]; the pages written.  A page whose write fails
    /// stays in the store.
    fn write_back(&self) -> usize {
        let file = self.file.as_ref().expect("a file is behind");
        let mut wb = self.writeback.lock();
        let wb = &mut *wb;
        let mut n = 0;
        {
            let mut l = self.lru.lock();
            while n < WRITEBACK_BATCH {
                let Some(slot) = l.head(0) else {
                    break;
                };
                let e = self.entry(slot as u64);
                // Linked means STORED (compaction may still move it).
                let cur = loop {
                    let cur = e.load(Ordering::Acquire);
                    debug_assert_eq!(tag(cur), STORED, "slot {slot} on the LRU is {cur:x}");
                    let h = handle(cur);
                    if e.compare_exchange(cur, entry(WB, h), Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
                    {
                        break cur;
                    }
                };
                l.unlink(0, slot);
                wb.batch[n] = (slot, handle(cur));
                n += 1;
            }
        }
        let batch = &mut wb.batch[..n];
        batch.sort_unstable_by_key(|&(slot, _)| slot);
        let base = wb.pages.as_ptr();
        // SAFETY: the writeback buffer is ours under the writeback lock;
        // `n` pages of it.
        let pages = unsafe { std::slice::from_raw_parts_mut(base, n * PAGE_SIZE) };
        let mut decoded = [true; WRITEBACK_BATCH];
        for (i, &(_, h)) in batch.iter().enumerate() {
            let dst = &mut pages[i * PAGE_SIZE..(i + 1) * PAGE_SIZE];
            decoded[i] = self.decode(h, dst);
        }
        // Runs of neighbouring slots go with one write each.
        let mut written = 0;
        let mut i = 0;
        while i < n {
            let mut j = i + 1;
            while j < n && batch[j].0 == batch[j - 1].0 + 1 && decoded[j] {
                j += 1;
            }
            let ok = decoded[i]
                && file
                    .write(batch[i].0 as u64, &pages[i * PAGE_SIZE..j * PAGE_SIZE])
                    .is_ok();
            for &(slot, h) in &batch[i..j] {
                self.end_writeback(slot, h, ok);
                written += ok as usize;
            }
            if !ok {
                self.acct.writeback_errors.inc();
                self.writeback_held_until
                    .store(crate::sys::monotonic_ns() + WRITEBACK_HOLD_NS, Ordering::Relaxed);
            }
            i = j;
        }
        self.acct.writebacks.add(written as u64);
        written
    }

    /// Decompress object `h` (held by a writeback) into a page.
    fn decode(&self, h: Handle, dst: &mut [u8]) -> bool {
        let class = h.class as usize;
        self.pool
            .read(
                class,
                || Some(h),
                |bytes| {
                    if class == WHOLE {
                        dst.copy_from_slice(bytes);
                        true
                    } else {
                        self.codec.decompress(bytes, dst)
                    }
                },
            )
            .unwrap_or(false)
    }

    /// End the writeback of `slot`'s object `h`: `FILE` when written, back
    /// to `STORED` (and the LRU's head) when not, `EMPTY` when its owner
    /// freed it meanwhile.
    fn end_writeback(&self, slot: u32, h: Handle, written: bool) {
        let e = self.entry(slot as u64);
        if written {
            if e.compare_exchange(
                entry(WB, h),
                FILE << TAG_SHIFT,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
            {
                self.acct.file.add(1);
            } else {
                debug_assert_eq!(e.load(Ordering::Relaxed), entry(WB_DEAD, h));
                e.store(EMPTY, Ordering::Release);
            }
            self.free_object(h);
            return;
        }
        let mut l = self.lru.lock();
        if e.compare_exchange(
            entry(WB, h),
            entry(STORED, h),
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_ok()
        {
            l.push_head(0, slot);
        } else {
            drop(l);
            e.store(EMPTY, Ordering::Release);
            self.free_object(h);
        }
    }

    /// Read `buf`'s pages from `offset..`: a run of neighbouring slots in
    /// the file with one read, the rest one by one from the store.  A
    /// `FILE` entry stays while its owner reads it (only the owner moves a
    /// slot out of `FILE`), so the run is the file's to read whole.
    fn read_pages(&self, offset: u64, buf: &mut [u8]) -> Result<(), IoError> {
        let pages = buf.len() / PAGE_SIZE;
        let in_file = |i: usize| tag(self.entry(offset + i as u64).load(Ordering::Acquire)) == FILE;
        let mut i = 0;
        while i < pages {
            if let Some(file) = self.file.as_ref().filter(|_| in_file(i)) {
                let j = (i + 1..pages).find(|&j| !in_file(j)).unwrap_or(pages);
                file.read(offset + i as u64, &mut buf[i * PAGE_SIZE..j * PAGE_SIZE])?;
                i = j;
            } else {
                self.read_page(offset + i as u64, &mut buf[i * PAGE_SIZE..(i + 1) * PAGE_SIZE])?;
                i += 1;
            }
        }
        Ok(())
    }

    /// Read one page at `slot`.
    fn read_page(&self, slot: u64, buf: &mut [u8]) -> Result<(), IoError> {
        let e = self.entry(slot);
        loop {
            let cur = e.load(Ordering::Acquire);
            match tag(cur) {
                EMPTY | BUSY => {
                    buf.fill(0);
                    return Ok(());
                }
                SAME => {
                    let w = self.words[slot as usize].load(Ordering::Relaxed).to_ne_bytes();
                    for c in buf.chunks_exact_mut(8) {
                        c.copy_from_slice(&w);
                    }
                    return Ok(());
                }
                FILE => return self.file.as_ref().expect("a file is behind").read(slot, buf),
                _ => {
                    let class = handle(cur).class as usize;
                    let locate = || {
                        let now = e.load(Ordering::Acquire);
                        (holds_object(now) && handle(now).class as usize == class).then(|| handle(now))
                    };
                    let got = self.pool.read(class, locate, |bytes| {
                        if class == WHOLE {
                            buf.copy_from_slice(bytes);
                            true
                        } else {
                            self.codec.decompress(bytes, buf)
                        }
                    });
                    match got {
                        Some(true) => return Ok(()),
                        Some(false) => {
                            return Err(IoError::Read {
                                offset: slot,
                                source: std::io::Error::new(
                                    std::io::ErrorKind::InvalidData,
                                    "the compressed page does not decompress",
                                ),
                            })
                        }
                        // Moved to another class or to the file: again.
                        None => continue,
                    }
                }
            }
        }
    }

    /// The owner freed `slot`: drop what it holds.
    fn discard_slot(&self, slot: u64) {
        let e = self.entry(slot);
        loop {
            let cur = e.load(Ordering::Acquire);
            let new = match tag(cur) {
                EMPTY | WB_DEAD => return,
                BUSY => {
                    debug_assert!(false, "slot {slot} freed while its owner writes it");
                    return;
                }
                WB => entry(WB_DEAD, handle(cur)),
                _ => EMPTY,
            };
            let done = self.replace(slot, cur, new);
            if done {
                if tag(cur) != WB {
                    self.release(cur);
                }
                if tag(cur) == FILE {
                    // The encrypted file forgets the slot's seal too.
                    if let Some(f) = &self.file {
                        f.slot_freed(slot, 1);
                    }
                }
                return;
            }
        }
    }
}

/// `ENOSPC` for a page the full store could not take (no file behind, or
/// the file's writes failing): transient, the pager keeps the page.
fn full(slot: u64) -> IoError {
    IoError::Write {
        offset: slot,
        source: std::io::Error::from_raw_os_error(libc::ENOSPC),
    }
}

#[cfg(test)]
mod tests;
