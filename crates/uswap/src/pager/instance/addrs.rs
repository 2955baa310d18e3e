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

use std::sync::atomic::{AtomicU64, Ordering};

use crate::table::{self, TableError};
use crate::PAGE_SIZE;

/// Ids per chunk: a region's first id is a multiple of it.
pub(crate) const CHUNK: usize = 512;
/// The low bits of a chunk's word: how many of its ids are used, less
/// one (an address is page-aligned, so they are free).
const COUNT: u64 = CHUNK as u64 - 1;

pub(crate) struct PageAddrs {
    /// Per chunk: its first page's address with the used ids' count less
    /// one in the low bits; 0 when no region holds the chunk.
    chunks: Box<[AtomicU64]>,
}

impl PageAddrs {
    /// For `max_pages` ids (a multiple of [`CHUNK`]).
    pub fn new(max_pages: usize) -> Result<PageAddrs, TableError> {
        debug_assert_eq!(max_pages % CHUNK, 0);
        Ok(PageAddrs {
            chunks: table::zeroed(max_pages / CHUNK, "page addresses")?,
        })
    }

    /// Ids `id_base..id_base + pages` are the pages from `addr` on.
    pub fn publish(&self, id_base: u32, pages: usize, addr: u64) {
        debug_assert_eq!(id_base as usize % CHUNK, 0);
        let first = id_base as usize / CHUNK;
        for (c, start) in (0..pages).step_by(CHUNK).enumerate() {
            let used = (pages - start).min(CHUNK) as u64;
            let at = addr + (start * PAGE_SIZE) as u64;
            self.chunks[first + c].store(at | (used - 1), Ordering::Relaxed);
        }
    }

    /// No region holds ids `id_base..id_base + pages` any more.
    pub fn clear(&self, id_base: u32, pages: usize) {
        let first = id_base as usize / CHUNK;
        for c in 0..pages.div_ceil(CHUNK) {
            self.chunks[first + c].store(0, Ordering::Relaxed);
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
        let off = id as u64 % CHUNK as u64;
        if w == 0 || off > w & COUNT {
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
}
