//! Sealing that pays for itself: whether a page read back from a
//! compressed device comes in write-protected.
//!
//! A compressed device lets its copy of a page go when the page is read
//! back, as zram and zswap do: a copy of a resident page would hold memory
//! to save a compression.  So the page comes in dirty (evicted again, it is
//! compressed again), and it can come in two ways:
//!
//! - *sealed*: dirty but write-protected (page.rs, `SEALED`).  Evicted
//!   unwritten, it goes the way a clean page goes: copied into a staging
//!   frame, and the batch dropped with one `process_madvise`, one TLB
//!   flush for the batch, where moving dirty pages out costs a flush each
//!   (evict/batch.rs, `stage_sealed`).  Written, it costs a write-protect
//!   fault: a signal (or a hand-off to the handler thread) and an
//!   `UFFDIO_WRITEPROTECT`, each a flush of its own.
//! - *writable*: a write costs nothing; evicted, it is moved as any dirty
//!   page is.
//!
//! Which pays is the program's: a page read and let go (pmbench's reads,
//! a scan) is cheaper sealed, and a write-protect fault on a hot page
//! tells the LRU it is hot; a page read and then written (sqlite3's
//! B-tree pages, a hash table's buckets) pays a fault to save nothing.
//! sqlite3 building an index at three times its budget wrote 61% of the
//! pages it read back, and ran 1.35x faster with them writable
//! (docs/history/PERFORMANCE-LOG.md, "Sealing that pays for itself").
//!
//! So the instance measures it: of the pages that came in sealed, how many
//! were written before they went.  While fewer than one in
//! [`WRITTEN_MAX`] are, pages come in sealed; past it, writable, but for
//! one in [`PROBE`], sealed still, so that the measure follows the
//! program when it changes phase.  The counts decay by halves every
//! [`WINDOW`] sealed pages: the decision is the recent past's.  The bound
//! is measured, not derived: pmbench's zipf pattern writes 16% of its
//! sealed pages and runs as fast sealed as the default at one in three;
//! at one in five its bursts of hot writes tipped the measure back and
//! forth and it ran 11% slower than sealing every page.
//!
//! `SwapBuilder::adaptive_seal(false)` seals every page a compressed
//! device lets go, as before (`--ablate` `always-seal`).
//!
//! **Clean pages, the same way.**  A page read back from a device that
//! keeps its copy on a disk or across a network (a swap file, an NBD
//! export) came in clean: writable
//! only after a write-protect fault, its slot kept, so that evicted
//! unwritten it is dropped with no IO.  A program that writes what it
//! reads pays that fault on every page: Python writes an object's
//! reference count on every touch, and walking 1 GiB of records back in
//! from a swap file took 262,144 write-protect faults a pass, a
//! signal, an `UFFDIO_WRITEPROTECT` and its TLB flush each, where the
//! kernel's hardware dirty bit costs nothing.  A second gate measures it:
//! while fewer than one clean page in [`CLEAN_WRITTEN_MAX`] is written
//! before it goes, pages come in clean; past it, writable and dirty (the
//! slot's copy let go), but for one in [`PROBE`].  The bound is a half,
//! not a third: a writable page evicted unwritten costs a write the
//! reclaimer makes off the program's path, where a clean one written
//! costs the program a fault.  `SwapBuilder::adaptive_clean(false)` keeps
//! every such page clean, as before (`--ablate` `always-clean`).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Sealed pages a window counts before both counts are halved: small, so
/// that a program whose phase changes from writing what it reads back to
/// reading it alone gets sealing back within a few thousand probes (a
/// few tens of thousands of swap-ins).
const WINDOW: u64 = 1024;
/// Sealed pages counted before the measure decides anything: until then,
/// pages come in sealed.
const MIN_SAMPLE: u64 = 256;
/// The share of sealed pages written past which sealing stops paying:
/// one in `SEALED_WRITTEN_MAX` (see the module's note for how it was
/// chosen).
pub(crate) const SEALED_WRITTEN_MAX: u64 = 3;
/// The same for pages that come in clean from a device that keeps its
/// copy.
pub(crate) const CLEAN_WRITTEN_MAX: u64 = 2;
/// While sealing is off, one page in `PROBE` is sealed still.
const PROBE: u32 = 16;

/// One instance's measure of sealed pages, and the decision.
pub(crate) struct SealGate {
    /// Sealed pages that came in (high 32 bits) and those of them written
    /// (low 32 bits), in one word so that a halving takes both at once.
    /// Relaxed: a count a few pages off decides nothing differently.
    window: AtomicU64,
    /// Decisions made while sealing was off: every `PROBE`th seals.
    probes: AtomicU32,
    /// Off: every page comes in write-protected.
    adaptive: bool,
    /// One page in this many written, and write protection stops paying.
    written_max: u64,
}

impl SealGate {
    pub fn new(adaptive: bool, written_max: u64) -> SealGate {
        SealGate {
            window: AtomicU64::new(0),
            probes: AtomicU32::new(0),
            adaptive,
            written_max,
        }
    }

    /// Whether the pages coming back now come in write-protected (sealed,
    /// or clean).
    #[inline]
    pub fn seal(&self) -> bool {
        if !self.adaptive {
            return true;
        }
        let (sealed, written) = split(self.window.load(Ordering::Relaxed));
        if sealed < MIN_SAMPLE || written * self.written_max < sealed {
            return true;
        }
        self.probes.fetch_add(1, Ordering::Relaxed).is_multiple_of(PROBE)
    }

    /// Whether the program writes most of what comes in write-protected
    /// now (past the bound, with enough counted to judge): the question
    /// `seal` answers, asked without taking a probe's turn.
    #[inline]
    pub fn written_mostly(&self) -> bool {
        let (sealed, written) = split(self.window.load(Ordering::Relaxed));
        self.adaptive && sealed >= MIN_SAMPLE && written * self.written_max >= sealed
    }

    /// `n` pages came in write-protected.
    #[inline]
    pub fn sealed(&self, n: u64) {
        let v = self.window.fetch_add(n << 32, Ordering::Relaxed) + (n << 32);
        let (s, w) = split(v);
        if s >= WINDOW {
            // One thread halves; a racing add lost to its exchange is a
            // page or two the measure does not count.
            let _ = self.window.compare_exchange(
                v,
                ((s / 2) << 32) | (w / 2),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }

    /// `n` pages that came in write-protected were written (a
    /// write-protect fault, and the neighbours it made writable).
    #[inline]
    pub fn written(&self, n: u64) {
        self.window.fetch_add(n, Ordering::Relaxed);
    }
}

/// (sealed, written) of a window word.
fn split(v: u64) -> (u64, u64) {
    (v >> 32, v & 0xffff_ffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seals_until_the_written_share_passes_the_bound_and_probes_after() {
        for bound in [SEALED_WRITTEN_MAX, CLEAN_WRITTEN_MAX] {
            let g = SealGate::new(true, bound);
            // Too few sealed pages to judge: sealed.
            g.sealed(MIN_SAMPLE - 1);
            (0..MIN_SAMPLE).for_each(|_| g.written(1));
            assert!(g.seal());
            g.sealed(1);
            // Every sealed page written: only one decision in PROBE seals.
            let n = 10 * PROBE;
            let sealed = (0..n).filter(|_| g.seal()).count() as u32;
            assert_eq!(sealed, n / PROBE);
            // Then the program stops writing them: the written share falls
            // under the bound as sealed pages come in, and sealing resumes.
            g.sealed(MIN_SAMPLE * bound);
            assert!((0..PROBE).all(|_| g.seal()));
        }
    }

    /// The bound decides: a third of the pages written stops sealing, and
    /// leaves clean pages clean.
    #[test]
    fn each_gate_has_its_bound() {
        let (sealed, clean) = (
            SealGate::new(true, SEALED_WRITTEN_MAX),
            SealGate::new(true, CLEAN_WRITTEN_MAX),
        );
        for g in [&sealed, &clean] {
            g.sealed(900);
            (0..350).for_each(|_| g.written(1));
        }
        assert!((0..2 * PROBE).filter(|_| sealed.seal()).count() < 2 * PROBE as usize);
        assert!((0..2 * PROBE).all(|_| clean.seal()));
    }

    #[test]
    fn the_window_halves_both_counts() {
        let g = SealGate::new(true, SEALED_WRITTEN_MAX);
        (0..100).for_each(|_| g.written(1));
        g.sealed(WINDOW - 1);
        assert_eq!(split(g.window.load(Ordering::Relaxed)), (WINDOW - 1, 100));
        g.sealed(1);
        assert_eq!(split(g.window.load(Ordering::Relaxed)), (WINDOW / 2, 50));
    }

    #[test]
    fn off_always_seals() {
        let g = SealGate::new(false, SEALED_WRITTEN_MAX);
        g.sealed(MIN_SAMPLE);
        (0..MIN_SAMPLE).for_each(|_| g.written(1));
        assert!((0..100).all(|_| g.seal()));
    }
}
