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
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::stats::LockSite;

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
// SAFETY: as above.
unsafe impl Zeroed for u8 {}

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

/// A table of `n` locks, each over an entry whose all-zero bytes are its
/// first value (the kernel's `swap_cluster_info`: a lock and a count per
/// 2 MiB of swap), committed as entries are used, like the tables above.
/// A table of `StatMutex`es is written whole when it is made, each entry
/// a mutex and a handle on its lock site: a 16 GiB swap device's cost
/// each process of a tree 324 KiB before its first page went out.
///
/// Each lock is one futex word (0 free, 1 held, 2 held and perhaps
/// waited on), and every lock of the table reports to one site, as a
/// [`StatMutex`](crate::stats::StatMutex) does.  Taking one allocates
/// nothing and is async-signal-safe: the SIGBUS handler takes cluster
/// locks.  Not poisoned by a panic, as a kernel spinlock is not: the
/// data is kept consistent at every step by its users.
pub(crate) struct LockTable<T> {
    cells: Box<[LockCell<T>]>,
    site: Arc<LockSite>,
}

#[repr(C)]
struct LockCell<T> {
    word: AtomicU32,
    value: UnsafeCell<T>,
}

// SAFETY: a zero `AtomicU32` is a free lock, and `T`'s zero bytes are a
// valid `T` by its own `Zeroed`.
unsafe impl<T: Zeroed> Zeroed for LockCell<T> {}

// SAFETY: a cell's value is reached only through a `LockGuard`, which
// holds the cell's lock (one thread at a time, as for `Mutex<T>`), or
// through `&mut`.
unsafe impl<T: Send> Sync for LockCell<T> {}

/// A held lock of a [`LockTable`]; released on drop.
pub(crate) struct LockGuard<'a, T> {
    cell: &'a LockCell<T>,
}

/// Tries of a contended lock before its taker sleeps on the word: its
/// holders hold it for a few map bytes' worth of work.
const SPINS: u32 = 100;

impl<T: Zeroed> LockTable<T> {
    /// `n` free locks over zeroed entries, reporting to `site`.
    pub(crate) fn zeroed(n: usize, site: Arc<LockSite>, what: &'static str) -> Result<Self, TableError> {
        Ok(LockTable {
            cells: zeroed(n, what)?,
            site,
        })
    }
}

impl<T> LockTable<T> {
    pub(crate) fn len(&self) -> usize {
        self.cells.len()
    }

    /// Take lock `i`, counting the acquisition and any wait.
    #[inline]
    pub(crate) fn lock(&self, i: usize) -> LockGuard<'_, T> {
        let cell = &self.cells[i];
        if cell.word.compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed).is_ok() {
            self.site.acquired(None);
        } else {
            let start = Instant::now();
            cell.lock_contended();
            self.site.acquired(Some(start.elapsed().as_nanos() as u64));
        }
        LockGuard { cell }
    }

    /// Entry `i`, through exclusive ownership of the table.
    pub(crate) fn get_mut(&mut self, i: usize) -> &mut T {
        self.cells[i].value.get_mut()
    }
}

impl<T> LockCell<T> {
    #[cold]
    fn lock_contended(&self) {
        for _ in 0..SPINS {
            if self.word.load(Ordering::Relaxed) == 0
                && self.word.compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed).is_ok()
            {
                return;
            }
            std::hint::spin_loop();
        }
        // Marked 2 whoever holds it, so that its release wakes a sleeper.
        while self.word.swap(2, Ordering::Acquire) != 0 {
            // SAFETY: this cell's word, live and aligned while `self` is.
            unsafe { crate::sys::futex_wait(self.word.as_ptr(), 2, None) };
        }
    }
}

impl<T> std::ops::Deref for LockGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the cell's lock: nobody else reaches
        // the value meanwhile.
        unsafe { &*self.cell.value.get() }
    }
}

impl<T> std::ops::DerefMut for LockGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as for `deref`, and `&mut self` makes this the one
        // reference the guard gives out.
        unsafe { &mut *self.cell.value.get() }
    }
}

impl<T> Drop for LockGuard<'_, T> {
    fn drop(&mut self) {
        if self.cell.word.swap(0, Ordering::Release) == 2 {
            crate::sys::futex_wake(self.cell.word.as_ptr() as usize, 1);
        }
    }
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

    /// A lock table under contention: eight threads add to a few shared
    /// entries (two words each, written apart, so that an unlocked
    /// interleaving would leave them unequal or short) while others stay
    /// untouched.  At the end every entry holds every thread's adds, the
    /// words agree, and the site counted each acquisition once.  Whether
    /// the eight collide is the scheduler's affair (CI once saw none), so
    /// a wait is then made certain: a taker finds the lock held, marks
    /// its word waited-on and sleeps until the holder lets it go, and
    /// that acquisition is counted as contended.
    #[test]
    fn lock_table_entries_take_every_add_under_contention() {
        struct Pair {
            a: u64,
            b: u64,
        }
        // SAFETY: two integers.
        unsafe impl Zeroed for Pair {}
        const THREADS: usize = 8;
        const ADDS: usize = 20_000;
        const HOT: usize = 3;
        let reg = crate::stats::Registry::new();
        let site = reg.lock_site(crate::stats::LockId::CLUSTER);
        let t = LockTable::<Pair>::zeroed(1 << 16, site.clone(), "test").unwrap();
        let before = site.get();
        std::thread::scope(|s| {
            for k in 0..THREADS {
                let t = &t;
                s.spawn(move || {
                    for i in 0..ADDS {
                        let mut e = t.lock((k + i) % HOT);
                        let a = e.a;
                        std::hint::black_box(&mut *e);
                        e.a = a + 1;
                        e.b += 1;
                    }
                });
            }
        });
        let mut total = 0;
        for i in 0..HOT {
            let e = t.lock(i);
            assert_eq!(e.a, e.b, "entry {i}");
            total += e.a;
        }
        assert_eq!(total as usize, THREADS * ADDS);
        assert_eq!(t.lock(HOT).a, 0, "an entry nobody locked");
        let d = site.get().since(&before);
        assert_eq!(d.acquisitions as usize, THREADS * ADDS + HOT + 1, "{d:?}");

        let before = site.get();
        let held = t.lock(0);
        let seen = held.a;
        std::thread::scope(|s| {
            let taker = s.spawn(|| t.lock(0).a);
            // The taker has spun, found the lock still held, and gone to
            // sleep on the word (or is about to): 2 is its mark.
            while t.cells[0].word.load(Ordering::Relaxed) != 2 {
                std::thread::yield_now();
            }
            drop(held);
            assert_eq!(taker.join().unwrap(), seen);
        });
        let d = site.get().since(&before);
        assert_eq!((d.acquisitions, d.contended), (2, 1), "{d:?}");
        assert!(d.wait_ns > 0, "{d:?}");
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
