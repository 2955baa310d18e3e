//! Metadata tables: one entry per page or per slot, allocated zeroed.
//!
//! A large zeroed allocation comes from fresh anonymous memory (calloc
//! maps it and skips the clearing), which the kernel commits a page at a
//! time when it is first written.  So a table for a terabyte of swap costs
//! address space up front and memory only for the entries in use: one 4
//! KiB page of a table of 8-byte entries covers 512 slots, 2 MB of swap.
//! Every per-page and per-slot table is therefore of a type whose all-zero
//! bytes are its empty value (`Zeroed`), and is allocated here, fallibly:
//! a table that the address space (or `RLIMIT_AS`, or strict overcommit)
//! cannot hold is a [`TableError`] that says so, not an abort.

use std::alloc::Layout;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8};

/// A type for which all-zero bytes are a valid value.
///
/// # Safety
/// Implement it only for types where that holds.
pub(crate) unsafe trait Zeroed {}

// SAFETY: zero is a valid integer, atomic or not.
unsafe impl Zeroed for AtomicU64 {}
// SAFETY: as above.
unsafe impl Zeroed for AtomicU32 {}
// SAFETY: as above.
unsafe impl Zeroed for AtomicU8 {}
// SAFETY: as above.
unsafe impl Zeroed for u32 {}

/// A metadata table could not be allocated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot reserve {bytes} bytes of metadata for {what}: the address space (RLIMIT_AS) or the kernel's overcommit limit refused it; ask for fewer pages (max_mapped) or a smaller swap device")]
pub struct TableError {
    /// What the table is for.
    pub what: &'static str,
    /// Its size.
    pub bytes: usize,
}

/// A table of `n` zeroed entries, committed by the kernel as it is used.
pub(crate) fn zeroed<T: Zeroed>(n: usize, what: &'static str) -> Result<Box<[T]>, TableError> {
    let too_big = || TableError {
        what,
        bytes: n.saturating_mul(std::mem::size_of::<T>()),
    };
    if n == 0 {
        return Ok(Vec::new().into_boxed_slice());
    }
    let layout = Layout::array::<T>(n).map_err(|_| too_big())?;
    // SAFETY: a non-zero-sized layout (n > 0, and every `Zeroed` type has
    // a size).
    let p = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
    if p.is_null() {
        return Err(too_big());
    }
    if layout.size() >= 1 << 20 {
        // A table this large is a mapping of its own: uswap's memory.
        // (Listed for good: an instance's tables live as long as it.)
        crate::sys::remember_memory(p as u64, layout.size() as u64);
    }
    // SAFETY: `p` is a fresh allocation of exactly `Layout::array::<T>(n)`
    // from the global allocator, which is what `Box<[T]>` frees with; its
    // bytes are zero, a valid `T` by `Zeroed`.
    Ok(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, n)) })
}

/// The ranges of `entries`' indexes that may hold other than zero: those
/// on pages of the table ever written (`sys::written_spans`), in order.
/// A scan of a table mostly untouched (a per-page table of `uswap run`'s
/// heap region, tens of GiB of address space) reads these and skips the
/// rest, which are zero, without faulting the zero page into every page
/// of it.  Everything when the page map cannot say.
pub(crate) fn written_entries<T>(entries: &[T]) -> Vec<std::ops::Range<usize>> {
    let size = std::mem::size_of::<T>();
    let n = entries.len();
    if n == 0 || size == 0 {
        return Vec::new();
    }
    let base = entries.as_ptr() as u64;
    let page = crate::PAGE_SIZE as u64;
    let lo = base / page * page;
    let hi = (base + std::mem::size_of_val(entries) as u64).div_ceil(page) * page;
    let Some(spans) = crate::sys::written_spans(lo, hi - lo) else {
        #[allow(clippy::single_range_in_vec_init)] // one range: all of it
        return vec![0..n];
    };
    let mut out: Vec<std::ops::Range<usize>> = Vec::with_capacity(spans.len());
    for (s, e) in spans {
        // Entries that start before `e` and end after `s`.
        let first = (s.saturating_sub(base) / size as u64) as usize;
        let last = (e.saturating_sub(base).div_ceil(size as u64) as usize).min(n);
        if first >= last {
            continue;
        }
        match out.last_mut() {
            Some(r) if r.end >= first => r.end = r.end.max(last),
            _ => out.push(first..last),
        }
    }
    out
}

/// Reserve room for `n` entries in a table built by pushing, fallibly.
pub(crate) fn reserve<T>(v: &mut Vec<T>, n: usize, what: &'static str) -> Result<(), TableError> {
    v.try_reserve_exact(n).map_err(|_| TableError {
        what,
        bytes: n.saturating_mul(std::mem::size_of::<T>()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    /// `written_entries` finds every entry written, and leaves out the
    /// pages only read (the zero page) and those never touched: of a
    /// 128 MiB table with two entries written, a few MiB at most (a huge
    /// page each where the kernel backs the table with them).
    #[test]
    fn written_entries_are_those_on_pages_written() {
        let n = 16 << 20;
        let t: Box<[AtomicU64]> = zeroed(n, "test").unwrap();
        let written = [1_000_000usize, 10_000_000];
        let read = [5_000_000usize, 14_000_000];
        for &i in &written {
            t[i].store(i as u64, Ordering::Relaxed);
        }
        for &i in &read {
            assert_eq!(t[i].load(Ordering::Relaxed), 0);
        }
        let spans = written_entries(&t);
        let inside = |i: usize| spans.iter().any(|r| r.contains(&i));
        for &i in &written {
            assert!(inside(i), "entry {i} was written: {spans:?}");
        }
        for &i in &read {
            assert!(!inside(i), "entry {i} was only read: {spans:?}");
        }
        let covered: usize = spans.iter().map(|r| r.len()).sum();
        assert!(covered <= 4 * (2 << 20) / 8, "{covered} entries: {spans:?}");
        assert!(spans.windows(2).all(|w| w[0].end < w[1].start), "{spans:?}");
        // Every entry outside the spans is zero.
        let mut at = 0;
        for r in spans.iter().chain(std::iter::once(&(n..n))) {
            assert!(t[at..r.start].iter().all(|w| w.load(Ordering::Relaxed) == 0));
            at = r.end;
        }
    }

    #[test]
    fn tables_are_zeroed_and_refuse_what_cannot_fit() {
        let t: Box<[AtomicU64]> = zeroed(1 << 20, "test").unwrap();
        assert!(t.iter().all(|w| w.load(Ordering::Relaxed) == 0));
        t[5].store(7, Ordering::Relaxed);
        let e = zeroed::<AtomicU64>(usize::MAX / 4, "a table too large").unwrap_err();
        assert!(e.to_string().contains("a table too large"), "{e}");
        assert!(zeroed::<u32>(0, "empty").unwrap().is_empty());
    }
}
