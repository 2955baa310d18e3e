//! Bringing swapped memory in for a reader the fault path never sees.
//!
//! A debugger reads another process's memory through `/proc/PID/mem`,
//! `process_vm_readv` or ptrace, and the kernel writes a core file by
//! reading the dying process's pages itself: each a get_user_pages
//! without `FAULT_FLAG_ALLOW_RETRY`, which a userfaultfd-registered page
//! that is missing fails at once (EIO, EFAULT; a hole in the core file),
//! in either fault mode.  Under kernel swap the same reads swap the page
//! in.  Here the pages are brought in first, each served as a fault of
//! the program's would be, with the budget held open (`Budget::hold`) so
//! that nothing brought in goes out again while the reader reads:
//!
//! - on request, for `uswap gdb` and `uswap gcore` (the reclaimer sees
//!   the request in the statistics block, `entry/threads.rs`);
//! - in the handler of a fatal signal whose default action dumps core,
//!   before the dump (`uswap run`'s preload), up to `RLIMIT_CORE`.
//!
//! Allocation-free and lock-free outside the fault path's own locks, as
//! a SIGBUS handler is: a fatal signal's handler runs it.

use std::sync::atomic::Ordering;

use crate::pager::fault::serve::{self, Access};
use crate::pager::fault::stall::Stall;
use crate::pager::instance::inner::Inner;
use crate::pager::instance::page::{self, Kind};
use crate::pager::instance::regions;
use crate::PAGE_SIZE;

const PAGE: u64 = PAGE_SIZE as u64;

/// Table pages looked at per `mincore` call: a stack buffer of this many
/// bytes.
const WINDOW: usize = 256;

/// How long a walk waits for a claimed page to settle, in
/// [`page::pause`]s of 50 us: 100 ms, far more than an eviction takes.
const SETTLE_PAUSES: u32 = 2000;

/// Bring in every page of `inner`'s regions that is swapped out or
/// staged, up to `most` pages; the budget must be held (`Budget::hold`)
/// or the pages go out again as they come in.  With `whole`, pages never
/// written (or discarded) on table pages in use are served as read
/// faults too (the zero page: no memory), and each span of the regions
/// whose table pages were never written goes to `untouched`.  Returns
/// the pages brought in (what the resident set grew by: staged pages were
/// in already).  A page that cannot be read (a failed device) stays out,
/// poisoned as a fault of the program's would leave it.  A page claimed
/// as the walk meets it is waited for; a walk that brought something in
/// or met a claim is followed by another (three at most), for a page a
/// reclaim pass begun before the hold took behind it (a debugger read one
/// such page as EIO: `held_in_memory_reads_through_proc_mem`, beside the
/// whole suite).
fn bring_in(inner: &Inner, most: usize, whole: bool, untouched: &mut dyn FnMut(u64, u64)) -> usize {
    let mut served = 0;
    let before = inner.budget().resident();
    let access = Access {
        present: Some(false),
        write: false,
        waits_for_window: true,
    };
    // A second walk finds what a pass begun before the hold took behind
    // the first (a page it claimed after the walk had passed it); a third
    // only if the second still met claims or pages to bring in.
    for walk in 0..3 {
        let served_before = served;
        let mut busy = false;
        regions::for_each_region(inner, |r| {
            let pages = ((r.end - r.base) / PAGE) as usize;
            let ids = r.id_base as usize..r.id_base as usize + pages;
            let serve_one = |p: usize| {
                if served >= most {
                    return false;
                }
                let id = r.id_base as usize + p;
                let st = &inner.states()[id];
                let mut w = st.load();
                // A page claimed now may be on its way out (a reclaim pass
                // begun before the hold takes up to a batch more): wait for
                // its claim to settle and look again.  Bounded, as a fatal
                // signal's handler runs this too, on a thread that may hold
                // the claim itself: not `wait_unbusy`, which waits for as
                // long as the claim is held.
                let mut pauses = 0;
                while w.is_busy() && pauses < SETTLE_PAUSES {
                    page::pause();
                    w = st.load();
                    pauses += 1;
                }
                busy |= w.is_busy();
                match w.kind() {
                    Kind::Swapped | Kind::Staged => {}
                    Kind::Never if whole && walk == 0 => {}
                    _ => return true,
                }
                let addr = r.base + p as u64 * PAGE;
                let mut stall = Stall::new();
                if r.huge {
                    let unit = crate::pager::instance::page::UNIT_PAGES;
                    let head = r.id_base as usize + p / unit * unit;
                    let base = r.base + (p / unit * unit) as u64 * PAGE;
                    serve::serve_unit(inner, base, head as u32, addr, access, &mut stall);
                } else {
                    serve::serve(inner, addr, id as u32, access, &mut stall);
                }
                if inner.spawn().handlers > 0 {
                    // A thread of the program may be waiting on the page.
                    let _ = inner.uffd().wake(addr & !(PAGE - 1), PAGE);
                }
                served += 1;
                true
            };
            let mut serve_one = serve_one;
            for_each_written(&inner.states()[ids], &mut serve_one, &mut |first, last| {
                if walk == 0 {
                    untouched(r.base + first as u64 * PAGE, r.base + last as u64 * PAGE);
                }
            });
        });
        if served == served_before && !busy {
            break;
        }
    }
    // Readahead brings neighbours in with a page: what came in is what
    // the resident set grew by (staged pages were counted already).
    let brought = inner.budget().resident().saturating_sub(before);
    inner.counters().brought_in.add(brought as u64);
    brought
}

/// Hold the memory in for a reader that reads whole mappings (gdb's
/// `gcore` and `dump`, which give up a mapping at its first unreadable
/// MiB; `uswap gdb`): every page out brought in, every page never
/// written on table pages in use made the zero page, and the spans never
/// used at all (most of `uswap run`'s heap region: address space held
/// for the heap to grow into, unreadable in a userfaultfd region) marked
/// `MADV_DONTDUMP`, which debuggers and core dumps skip.  Returns those
/// spans, for [`let_go_for_reader`].
pub(crate) fn hold_for_reader(inner: &Inner) -> Vec<(u64, u64)> {
    inner.budget().hold();
    std::sync::atomic::fence(Ordering::SeqCst);
    let mut spans = Vec::new();
    bring_in(inner, usize::MAX, true, &mut |lo, hi| spans.push((lo, hi)));
    spans.retain(|&(lo, hi)| {
        // SAFETY: advice on address space of a region of this instance's
        // (its pages never written): it changes what a dump writes only.
        unsafe { libc::madvise(lo as *mut libc::c_void, (hi - lo) as usize, libc::MADV_DONTDUMP) == 0 }
    });
    spans
}

/// The reader is done: the spans [`hold_for_reader`] marked are dumped
/// again, and the budget is the one asked for.
pub(crate) fn let_go_for_reader(inner: &Inner, spans: Vec<(u64, u64)>) {
    for (lo, hi) in spans {
        // SAFETY: as in `hold_for_reader`.
        unsafe { libc::madvise(lo as *mut libc::c_void, (hi - lo) as usize, libc::MADV_DODUMP) };
    }
    inner.budget().let_go();
}

/// Call `f(index)` for each entry of `entries` on a table page that is in
/// memory (`mincore`), in order, while it returns true, and `untouched(first,
/// last)` for each run of entries on table pages never written: a table
/// of a heap region of tens of GiB is mostly such pages, which hold only
/// zero (`Never`) entries and are skipped without being read.
fn for_each_written<T>(
    entries: &[T],
    f: &mut dyn FnMut(usize) -> bool,
    untouched: &mut dyn FnMut(usize, usize),
) {
    let size = std::mem::size_of::<T>();
    if entries.is_empty() || size == 0 {
        return;
    }
    let base = entries.as_ptr() as u64;
    let end = base + std::mem::size_of_val(entries) as u64;
    let mut page = base & !(PAGE - 1);
    let mut vec = [0u8; WINDOW];
    // The first entry of the run of untouched table pages being gathered.
    let mut run: Option<usize> = None;
    while page < end {
        let n = (end - page).div_ceil(PAGE).min(WINDOW as u64) as usize;
        // SAFETY: mincore reads no memory; it writes one byte per page of
        // the range into `vec`, which has room for `n`.  The range is the
        // table's own, mapped while `entries` lives.
        let ok = unsafe { libc::mincore(page as *mut libc::c_void, n * PAGE_SIZE, vec.as_mut_ptr()) } == 0;
        for (i, &v) in vec[..n].iter().enumerate() {
            let lo = (page + i as u64 * PAGE).max(base);
            let hi = (page + (i as u64 + 1) * PAGE).min(end);
            let first = ((lo - base) as usize).div_ceil(size);
            let last = ((hi - base) as usize).div_ceil(size).min(entries.len());
            if ok && v & 1 == 0 {
                run.get_or_insert(first);
                continue;
            }
            if let Some(r) = run.take() {
                untouched(r, first);
            }
            for e in first..last {
                if !f(e) {
                    return;
                }
            }
        }
        page += n as u64 * PAGE;
    }
    if let Some(r) = run {
        untouched(r, entries.len());
    }
}

/// The budget held open and the pages brought in, up to `most`: a fatal
/// signal's handler before its core dump, a debugger's request.
pub(crate) fn hold_and_bring_in(inner: &Inner, most: usize) -> usize {
    inner.budget().hold();
    // Pairs with the reclaimer's loads of the bounds: a pass begun before
    // the hold takes at most a batch more.
    std::sync::atomic::fence(Ordering::SeqCst);
    bring_in(inner, most, false, &mut |_, _| {})
}

/// Walks of [`unpage`] at most: each waits up to 100 ms a page for a
/// claim to settle, and a claim taken before the hold is the only thing
/// that can leave a page out after one.
const UNPAGE_WALKS: usize = 8;

/// Stop paging `inner` for good, for a program whose buffers the kernel
/// will read and write later, from its own workers, where no fault of
/// the program's can be served (its io_uring, its kernel AIO: SIGBUS
/// mode's userfaultfd fails such an access with `EFAULT`): the budget
/// held open for good (`Budget::hold_for_good`; every evictor's check
/// after a claim then keeps the page, `Inner::pinned`), every page that
/// is out brought in, and each region unregistered from the
/// userfaultfd, so that the kernel fills a page never written, and
/// takes a store into a clean one, as in any private mapping (the
/// write protection of clean pages goes with the registration).  A page
/// poisoned by a failed swap-in stays poisoned: its marker is the page
/// table's, not the registration's.
///
/// Returns the pages brought in, or, where some stay out (a claim that
/// never settled), how many: the regions then stay registered, as a
/// page missing there would read as zeros once they are not.  Regions
/// mapped after this are not registered (`Swap::map_at`,
/// `Region::restore`), nor are a forked child's (`fork.rs`).
pub(crate) fn unpage(inner: &Inner) -> Result<usize, usize> {
    inner.budget().hold_for_good();
    // Pairs with the fence after each evictor's claim (`Inner::pinned`):
    // a claim that did not see the flag is seen by the walks below, busy
    // until it settles, then brought back.
    std::sync::atomic::fence(Ordering::SeqCst);
    let mut brought = 0;
    let mut left = 0;
    for _ in 0..UNPAGE_WALKS {
        brought += bring_in(inner, usize::MAX, false, &mut |_, _| {});
        left = out_now(inner);
        if left == 0 {
            break;
        }
    }
    if left > 0 {
        return Err(left);
    }
    regions::for_each_region(inner, |r| {
        // A failure leaves the region registered: its pages are all in,
        // so only a page never written, or a store into a clean one, can
        // still fail a call of the kernel's, as before.
        let _ = inner.uffd().unregister(r.base, r.end - r.base);
    });
    Ok(brought)
}

/// Pages of `inner`'s regions out now (swapped or staged), or claimed.
fn out_now(inner: &Inner) -> usize {
    let mut out = 0;
    regions::for_each_region(inner, |r| {
        let pages = ((r.end - r.base) / PAGE) as usize;
        let states = &inner.states()[r.id_base as usize..r.id_base as usize + pages];
        for_each_written(
            states,
            &mut |p| {
                let w = states[p].load();
                if w.is_busy() || matches!(w.kind(), Kind::Swapped | Kind::Staged) {
                    out += 1;
                }
                true
            },
            &mut |_, _| {},
        );
    });
    out
}
