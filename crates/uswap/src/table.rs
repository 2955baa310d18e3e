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
