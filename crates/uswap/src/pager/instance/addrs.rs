//! Page id -> address: where in memory each page id of an instance is.
//!
//! Ids are handed to a region in one run, and its pages are consecutive
//! in memory, so the map is affine within a region.  A word per page
//! would say it too, but it is written for every page a region spans
//! when the region is mapped: 8 bytes a page, 135 MiB for the 68 GiB heap
//! of `uswap run`'s default, committed at start by every process of a
//! run, the smallest `sh` included.  So a region's ids start at a chunk
//! boundary (of [`CHUNK`] ids, one 2 MiB stretch of memory), and one word
//! per chunk says where the chunk's first page is and how many of its ids
//! the region uses: a 68 GiB region writes 270 KiB of it.  The ids past a
//! region's end in its last chunk are never handed to another region
//! (`map` takes whole chunks), so a lookup past the end says "no region"
//! as a word per page said.
//!
//! A chunk word still cost 160 KiB of every process of a run for its
//! heap of tens of GiB (budget and swap), most of the rest of its fixed
//! cost once the bounce frames and the cluster table became lazy.  So
//! the stretches of a region that cover whole spans (of [`SPAN`] ids, 1
//! GiB of memory) take one word per span instead, in a second table, and
//! a chunk word of 0 defers to its span's: 40 words for a 40 GiB heap,
//! and at most a page of chunk words at each of its ragged ends.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::table::{self, TableError};
use crate::PAGE_SIZE;

/// Ids per chunk: a region's first id is a multiple of it.
pub(crate) const CHUNK: usize = 512;
/// The low bits of a chunk's word: how many of its ids are used, less
/// one (an address is page-aligned, so they are free).
const COUNT: u64 = CHUNK as u64 - 1;
/// Ids per span: 512 chunks, 1 GiB of memory.
pub(crate) const SPAN: usize = 512 * CHUNK;

pub(crate) struct PageAddrs {
    /// Per chunk: its first page's address with the used ids' count less
    /// one in the low bits; 0 when no region holds the chunk, or when its
    /// span's word says where it is.
    chunks: Box<[AtomicU64]>,
    /// Per span: its first page's address when one region holds all of
    /// it; else 0.  A region's ids are disjoint from every other's, so a
    /// chunk of a span said here has a word of 0.
    spans: Box<[AtomicU64]>,
}

/// Where the words of a region go: for each stretch, from its first id
/// on, whether it is a whole span, and how many ids it takes.
fn stretches(id_base: u32, pages: usize) -> impl Iterator<Item = (usize, bool, usize)> {
    debug_assert_eq!(id_base as usize % CHUNK, 0);
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= pages {
            return None;
        }
        let id = id_base as usize + start;
        let whole = id.is_multiple_of(SPAN) && pages - start >= SPAN;
        let n = if whole { SPAN } else { (pages - start).min(CHUNK) };
        let s = (start, whole, n);
        start += if whole { SPAN } else { CHUNK };
        Some(s)
    })
}

impl PageAddrs {
    /// For `max_pages` ids (a multiple of [`CHUNK`]).
    pub fn new(max_pages: usize) -> Result<PageAddrs, TableError> {
        debug_assert_eq!(max_pages % CHUNK, 0);
        Ok(PageAddrs {
            chunks: table::zeroed(max_pages / CHUNK, "page addresses")?,
            spans: table::zeroed(max_pages.div_ceil(SPAN), "page addresses")?,
        })
    }

    /// Ids `id_base..id_base + pages` are the pages from `addr` on.
    pub fn publish(&self, id_base: u32, pages: usize, addr: u64) {
        for (start, whole, n) in stretches(id_base, pages) {
            let id = id_base as usize + start;
            // Never 0: no region is mapped at address 0.
            let at = addr + (start * PAGE_SIZE) as u64;
            if whole {
                self.spans[id / SPAN].store(at, Ordering::Relaxed);
            } else {
                self.chunks[id / CHUNK].store(at | (n as u64 - 1), Ordering::Relaxed);
            }
        }
    }

    /// No region holds ids `id_base..id_base + pages` any more: the words
    /// `publish` wrote for them are cleared, and no other.
    pub fn clear(&self, id_base: u32, pages: usize) {
        for (start, whole, _) in stretches(id_base, pages) {
            let id = id_base as usize + start;
            if whole {
                self.spans[id / SPAN].store(0, Ordering::Relaxed);
            } else {
                self.chunks[id / CHUNK].store(0, Ordering::Relaxed);
            }
        }
    }

    /// Page `id`'s address; 0 when no region holds it (or it is past the
    /// table).
    #[inline]
    pub fn get(&self, id: u32) -> u64 {
        let Some(w) = self.chunks.get(id as usize / CHUNK) else {
            return 0;
        };
        let w = w.load(Ordering::Relaxed);
        if w == 0 {
            let s = self.spans[id as usize / SPAN].load(Ordering::Relaxed);
            if s == 0 {
                return 0;
            }
            return s + (id as usize % SPAN * PAGE_SIZE) as u64;
        }
        let off = id as u64 % CHUNK as u64;
        if off > w & COUNT {
            return 0;
        }
        (w & !COUNT) + off * PAGE_SIZE as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_maps_its_ids_and_nothing_past_them() {
        let a = PageAddrs::new(4 * CHUNK).unwrap();
        let p = PAGE_SIZE as u64;
        a.publish(0, CHUNK + 3, 0x7000_0000_0000);
        a.publish(2 * CHUNK as u32, 1, 0x1000);
        assert_eq!(a.get(0), 0x7000_0000_0000);
        assert_eq!(a.get(CHUNK as u32 + 2), 0x7000_0000_0000 + (CHUNK as u64 + 2) * p);
        assert_eq!(a.get(CHUNK as u32 + 3), 0, "past the region's end");
        assert_eq!(a.get(2 * CHUNK as u32), 0x1000);
        assert_eq!(a.get(2 * CHUNK as u32 + 1), 0);
        assert_eq!(a.get(3 * CHUNK as u32), 0);
        assert_eq!(a.get(u32::MAX), 0, "past the table");
        a.clear(0, CHUNK + 3);
        assert_eq!(a.get(5), 0);
        assert_eq!(a.get(CHUNK as u32 + 1), 0);
        assert_eq!(a.get(2 * CHUNK as u32), 0x1000);
    }

    /// A region over whole spans writes a word per span there and chunk
    /// words only at its ragged ends; every id maps as a chunk word per
    /// chunk would map it, and a clear leaves nothing behind.
    #[test]
    fn whole_spans_take_one_word_each() {
        let a = PageAddrs::new(4 * SPAN).unwrap();
        let p = PAGE_SIZE as u64;
        // From the span's last chunk on, over two whole spans, into a
        // third's first chunk and three pages past it.
        let base = (SPAN - CHUNK) as u32;
        let pages = CHUNK + 2 * SPAN + CHUNK + 3;
        let addr = 0x4000_0000_0000u64;
        a.publish(base, pages, addr);
        let written = |t: &[AtomicU64]| t.iter().filter(|w| w.load(Ordering::Relaxed) != 0).count();
        assert_eq!((written(&a.chunks), written(&a.spans)), (3, 2));
        for k in [
            0,
            CHUNK - 1,
            CHUNK,
            CHUNK + 1,
            CHUNK + SPAN,
            CHUNK + 2 * SPAN - 1,
            pages - 1,
        ] {
            assert_eq!(
                a.get(base + k as u32),
                addr + k as u64 * p,
                "id {}",
                base as usize + k
            );
        }
        assert_eq!(a.get(base + pages as u32), 0, "past the region's end");
        assert_eq!(a.get(base - 1), 0, "before its start");
        a.clear(base, pages);
        assert_eq!((written(&a.chunks), written(&a.spans)), (0, 0));
        assert_eq!(a.get(base + CHUNK as u32 + 7), 0);
    }
}
