//! What a page is before it is compressed: one word repeated (stored as
//! the word, zram's same-filled pages), or likely not to compress (sent
//! to the file behind whole, when there is one).

/// The word a page repeats, if it is one word repeated (zram's
/// `page_same_filled`).
#[inline]
pub(super) fn same_word(page: &[u8]) -> Option<u64> {
    let mut words = page
        .chunks_exact(8)
        .map(|c| u64::from_ne_bytes(c.try_into().unwrap()));
    let first = words.next()?;
    // The last word first: most pages that are not same-filled differ
    // there already.
    let last = u64::from_ne_bytes(page[page.len() - 8..].try_into().unwrap());
    (last == first && words.all(|w| w == first)).then_some(first)
}

/// Whether a sample of the page looks like it will not compress: more
/// distinct byte values in 512 sampled bytes than text or numbers show
/// (random bytes give about 220; English text under 60, arrays of small
/// numbers fewer), btrfs's byte-set heuristic.  About 0.2 us.
#[inline]
pub(super) fn looks_incompressible(page: &[u8]) -> bool {
    let mut seen = [0u64; 4];
    for chunk in page.chunks_exact(64) {
        // Eight bytes from every 64: 512 samples, spread over the page.
        for &b in &chunk[..8] {
            seen[(b >> 6) as usize] |= 1 << (b & 63);
        }
    }
    let distinct: u32 = seen.iter().map(|w| w.count_ones()).sum();
    distinct > 200
}
