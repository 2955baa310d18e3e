//! The table of published regions: where each region of every instance
//! lies, and whose it is.  Filled in before a region is usable and cleared
//! before it is unmapped; the SIGBUS handler and the handler threads read
//! it without locks ([`lookup`]), a forked child lists its instance's
//! regions from it to adopt them.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use crate::pager::instance::inner::Inner;
use crate::pager::instance::page::{UNIT_BYTES, UNIT_PAGES};
use crate::PAGE_SIZE;

const PAGE: u64 = PAGE_SIZE as u64;

/// Most regions mapped at once in one process (all instances together).
///
/// Why a bound, and why this one: a fault finds its region by scanning
/// the entries ever used (`lookup`), without a lock, so the cost of a
/// fault grows with the regions alive (all of them, in the worst case of
/// a fault in the newest): a few nanoseconds an entry, about 1 us at a
/// thousand (docs/history/PERFORMANCE-LOG.md, "numpy on uswap").  1,024 is past the
/// ~900 at which UMap's users ran out, and the table is 40 KiB of static
/// memory; ids for a region's unused tail are reserved per region
/// (builder.rs), address space only.
pub const MAX_REGIONS: usize = 1024;

/// One published region: where it is and whose it is.  Set before the
/// region is usable and cleared before it is unmapped; the SIGBUS handler
/// reads it without locks.
struct RegionEntry {
    base: AtomicU64,
    end: AtomicU64,
    id_base: AtomicU32,
    /// Paged in 2 MB units.
    huge: AtomicBool,
    inner: AtomicPtr<Inner>,
}

static REGIONS: [RegionEntry; MAX_REGIONS] = [const {
    RegionEntry {
        base: AtomicU64::new(0),
        end: AtomicU64::new(0),
        id_base: AtomicU32::new(0),
        huge: AtomicBool::new(false),
        inner: AtomicPtr::new(std::ptr::null_mut()),
    }
}; MAX_REGIONS];

/// How many leading entries of `REGIONS` have ever been used: the scans
/// stop there instead of reading the whole table on every fault.  Only
/// grows; raised before an entry is filled in, so whoever can see the
/// entry's `base` sees the mark too.
static USED: AtomicUsize = AtomicUsize::new(0);

/// The entries that may be in use.
fn used_entries() -> &'static [RegionEntry] {
    &REGIONS[..USED.load(Ordering::Acquire).min(MAX_REGIONS)]
}

/// A published region, as `regions_of` lists it.
pub(crate) struct Published {
    pub base: u64,
    pub end: u64,
    pub id_base: u32,
    pub huge: bool,
}

/// The regions of instance `inner` (a forked child adopting it).
pub(crate) fn regions_of(inner: &Inner) -> Vec<Published> {
    used_entries()
        .iter()
        .filter(|r| {
            std::ptr::eq(r.inner.load(Ordering::Acquire), inner) && r.base.load(Ordering::Acquire) != 0
        })
        .map(|r| Published {
            base: r.base.load(Ordering::Acquire),
            end: r.end.load(Ordering::Relaxed),
            id_base: r.id_base.load(Ordering::Relaxed),
            huge: r.huge.load(Ordering::Relaxed),
        })
        .collect()
}

/// Each region of instance `inner`, as `regions_of` lists them, without
/// allocating (a fatal signal's handler walks them).
pub(crate) fn for_each_region(inner: &Inner, mut f: impl FnMut(Published)) {
    for r in used_entries() {
        let base = r.base.load(Ordering::Acquire);
        if base == 0 || !std::ptr::eq(r.inner.load(Ordering::Acquire), inner) {
            continue;
        }
        f(Published {
            base,
            end: r.end.load(Ordering::Relaxed),
            id_base: r.id_base.load(Ordering::Relaxed),
            huge: r.huge.load(Ordering::Relaxed),
        });
    }
}

/// Whether instance `inner` has a region of 2 MB units mapped.
pub(crate) fn has_huge_region(inner: &Inner) -> bool {
    regions_of(inner).iter().any(|r| r.huge)
}

/// Publish a region; returns its table slot, or None when the table is full.
pub(crate) fn publish_region(
    base: u64,
    len: u64,
    id_base: u32,
    inner: *const Inner,
    huge: bool,
) -> Option<usize> {
    for (i, r) in REGIONS.iter().enumerate() {
        // Claim a free entry by its `inner` pointer, then fill it in;
        // `base` goes last, so a reader that sees it sees the rest.
        if r.inner
            .compare_exchange(
                std::ptr::null_mut(),
                inner as *mut Inner,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
        {
            USED.fetch_max(i + 1, Ordering::AcqRel);
            r.id_base.store(id_base, Ordering::Relaxed);
            r.huge.store(huge, Ordering::Relaxed);
            r.end.store(base + len, Ordering::Relaxed);
            r.base.store(base, Ordering::Release);
            return Some(i);
        }
    }
    None
}

/// Withdraw a region's entry.
pub(crate) fn unpublish_region(slot: usize) {
    let r = &REGIONS[slot];
    r.base.store(0, Ordering::Release);
    r.end.store(0, Ordering::Relaxed);
    r.inner.store(std::ptr::null_mut(), Ordering::Release);
}

/// Whether a published region overlaps `[base, base + len)`.
pub(crate) fn overlaps_a_region(base: u64, len: u64) -> bool {
    used_entries().iter().any(|r| {
        let b = r.base.load(Ordering::Acquire);
        b != 0 && b < base + len && base < r.end.load(Ordering::Relaxed)
    })
}

/// What a fault address is in.
pub(crate) struct Hit {
    pub inner: *const Inner,
    /// The page id of the address, or of its unit's first page.
    pub id: u32,
    /// Some(unit start) for a 2 MB-unit region.
    pub unit: Option<u64>,
}

/// The region holding `addr`: its instance and the page id of `addr`.
pub(crate) fn lookup(addr: u64) -> Option<Hit> {
    for r in used_entries() {
        let base = r.base.load(Ordering::Acquire);
        if base == 0 || addr < base || addr >= r.end.load(Ordering::Relaxed) {
            continue;
        }
        let inner = r.inner.load(Ordering::Acquire);
        if inner.is_null() {
            continue;
        }
        let mut id = r.id_base.load(Ordering::Relaxed) + ((addr - base) / PAGE) as u32;
        let mut unit = None;
        if r.huge.load(Ordering::Relaxed) {
            let u = (addr - base) / UNIT_BYTES as u64;
            id = r.id_base.load(Ordering::Relaxed) + (u as usize * UNIT_PAGES) as u32;
            unit = Some(base + u * UNIT_BYTES as u64);
        }
        return Some(Hit { inner, id, unit });
    }
    None
}
