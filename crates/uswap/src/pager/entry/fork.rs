//! `fork` without `exec`: a child that sees exactly the memory its parent
//! had, swapped-out pages included.
//!
//! Everything the pager maps is inherited as private memory is (no
//! `MADV_DONTFORK`): the child gets copy-on-write copies of the regions'
//! resident pages, of the staging frames, of RAM devices and of the
//! pager's own tables, so its copy of an instance describes its copy of
//! the memory exactly.  What it does not get is a way to serve faults:
//! the inherited userfaultfd speaks for the parent's memory, and only the
//! thread that forked exists in the child.  So `pthread_atfork` handlers,
//! installed with the first instance, do three things:
//!
//! - **Before** (`prepare`), the fork gate: no other thread may be in the
//!   middle of the pager's work when the address space is copied, or the
//!   child would inherit a claim or a lock that nobody will release.
//!   Every piece of work (a fault served, an eviction pass, a readahead, a
//!   region mapped or discarded) is done inside the gate ([`enter`]); the
//!   forking thread closes it and waits until no one is inside.  Its own
//!   faults meanwhile (a later `atfork` handler, glibc's fork itself
//!   touching heap memory) go through: the thread that forks is exempt,
//!   and so is a handler thread serving that thread's fault.
//! - **In the child** (`child`), adoption: a new userfaultfd (and pidfd)
//!   under the old descriptor numbers, every region, staging and unit
//!   area registered with it, and the instance's threads started anew.
//!   The inherited write protection is gone (the kernel drops it in a
//!   child whose mapping is not registered at fork), so a clean page
//!   would take writes unseen: clean pages are write-protected again (a
//!   run of neighbours per call) and stay clean, their slot with them,
//!   so the child can drop them without IO; a 2 MB unit, or a page the
//!   kernel will not protect, becomes dirty and forgets its slot.  Pins
//!   and claims of threads that are not in the child are dropped.
//! - **Slots** are shared as the kernel shares them at fork
//!   (`swap_duplicate`), and freed only when both sides are done.  A RAM
//!   device is private memory, so parent and child each have their own
//!   copy and nothing more is needed.  A swap file is one file: the parent
//!   keeps every slot the child may read (the slots its pages held at
//!   fork, [`Hold`]) out of circulation while the child lives (until the
//!   end of a pipe the child holds closes: at its exit or `exec`), and the
//!   child writes no new slots on it and frees none of its parent's: the
//!   first time it has pages to swap out, it makes files of its own
//!   beside it (io/file.rs, "A forked child's files of its own") and
//!   writes there; until then, or where it cannot (a compressed device
//!   with a file behind, a block device), its dirty pages stay resident,
//!   counted as swap full.
//!
//! After a fork, a page the two shared is refused by `UFFDIO_MOVE`
//! (`EBUSY`) until its next write fault, whether or not the child still
//! lives: the fork clears the kernel's mark that the page is this
//! process's alone, and only a write fault sets it again.  Eviction takes
//! that fault itself for a refused run (`MADV_POPULATE_WRITE`, batch.rs's
//! `unshare`: the page is kept if the child is gone, copied if not) and
//! moves it on the next pass.  Children made without `fork(3)` (a raw
//! `clone(2)`) are not adopted: their inherited instance stays inert
//! (`Inner::same_process`), and their copy of a region reads missing pages
//! as zeros; `vfork` and `posix_spawn` share the parent's memory and need
//! nothing.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, Once, Weak};

use crate::descriptors;
use crate::pager::entry::threads;
use crate::pager::instance::gate::{self, enter};
use crate::pager::instance::inner::Inner;
use crate::pager::instance::page::{Kind, PageWord, UNIT_PAGES};
use crate::pager::instance::regions;
use crate::pager::instance::report;
use crate::uffd::RegisterMode;
use crate::PAGE_SIZE;

/// The instances of this process.  Registered inside the gate, so that
/// the lock is never held at a fork.
static INSTANCES: Mutex<Vec<Weak<Inner>>> = Mutex::new(Vec::new());

fn instances() -> Vec<Arc<Inner>> {
    let mut list = INSTANCES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    list.retain(|w| w.strong_count() > 0);
    list.iter().filter_map(Weak::upgrade).collect()
}

/// The instances of this process, for a caller that must not wait: none
/// while another thread registers one (the list's lock is held briefly,
/// and this may be called from an allocation anywhere).
pub(crate) fn live_instances() -> Vec<Arc<Inner>> {
    let Ok(list) = INSTANCES.try_lock() else {
        return Vec::new();
    };
    list.iter().filter_map(Weak::upgrade).collect()
}

/// The pipe of the fork being made: the child keeps its write end open
/// for as long as it may read its parent's slots; the parent sees the end
/// of it.  -1 when none.
static PIPE: [AtomicI32; 2] = [AtomicI32::new(-1), AtomicI32::new(-1)];

static HANDLERS: Once = Once::new();

/// Put a new instance on the list the fork handlers adopt, installing
/// them with the first.
pub(crate) fn register(inner: &Arc<Inner>) {
    HANDLERS.call_once(|| {
        // SAFETY: registers three functions with no preconditions.
        unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    });
    let _inside = enter(0);
    let mut list = INSTANCES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    list.retain(|w| w.strong_count() > 0);
    list.push(Arc::downgrade(inner));
}

extern "C" fn prepare() {
    gate::close();
    let insts = instances();
    if insts.iter().any(|i| i.has_file_device()) {
        let mut fds = [-1; 2];
        // SAFETY: pipe2 fills `fds`.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } == 0 {
            // Both ends out of the program's way: the child keeps the
            // write end, and a child that closes "every" descriptor must
            // not end its parent's hold on the slots it still reads.
            PIPE[0].store(descriptors::place_raw(fds[0]), Ordering::Relaxed);
            PIPE[1].store(descriptors::place_raw(fds[1]), Ordering::Relaxed);
        }
    }
    for inner in &insts {
        if inner.has_file_device() {
            let devices = &inner.backing().devices;
            inner
                .backing()
                .hold
                .snapshot(inner.states(), |d| devices[d as usize].has_file());
        }
    }
}

extern "C" fn parent() {
    let (r, w) = (
        PIPE[0].swap(-1, Ordering::Relaxed),
        PIPE[1].swap(-1, Ordering::Relaxed),
    );
    for inner in instances() {
        // Pages shared with the child are refused by UFFDIO_MOVE (EBUSY)
        // until written again, after the child is gone too: eviction makes
        // them the process's own first (batch.rs, `unshare`).
        inner.note_fork();
        // A reader's hold (`uswap gdb`) is the parent's: the child's block
        // has none, and no reclaimer of its would ever let go.
        inner.budget().let_go();
        inner.reports().pinned.store(true, Ordering::Relaxed);
        // The reclaimer frees the held slots once the child is done:
        // started now if it waits for its first need (a fork's handler is
        // a safe point), where any slot is held.
        if inner.has_file_device() && inner.backing().hold.activate(r) {
            inner.background().want();
            threads::start_wanted(&inner);
        }
    }
    for fd in [r, w] {
        if fd >= 0 {
            descriptors::forget(fd);
            // SAFETY: descriptors made in `prepare`, ours to close (the
            // holds took duplicates).
            unsafe { libc::close(fd) };
        }
    }
    gate::open();
}

extern "C" fn child() {
    gate::reset();
    // The parent's threads are not here; this child starts its own.
    crate::pager::instance::signals::forget_threads();
    let r = PIPE[0].swap(-1, Ordering::Relaxed);
    // The write end stays open, close-on-exec: the parent's sign that
    // this child may still read its slots.
    PIPE[1].store(-1, Ordering::Relaxed);
    if r >= 0 {
        descriptors::forget(r);
        // SAFETY: the read end, the parent's business.
        unsafe { libc::close(r) };
    }
    for inner in instances() {
        // Statistics of its own, published under its own pid.
        inner.registry().reopen_here();
        inner.backing().hold.forget();
        inner.reports().pinned.store(true, Ordering::Relaxed);
        if let Some(m) = inner.member() {
            // Its own slot, so that the domain charges it its own memory;
            // without one it keeps its budget as it was.
            let _ = m.rejoin();
        }
        if let Err(e) = adopt(&inner) {
            // The child's memory cannot be served: reading it would give
            // zeros where the program's data was.  End here, saying why.
            report::line(format_args!(
                "uswap: a forked child cannot take over its parent's swapped memory: {e}; ending it"
            ));
            // SAFETY: ends this process at once.
            unsafe { libc::_exit(127) };
        }
    }
    gate::open();
}

/// Take over an inherited instance in a forked child.
fn adopt(inner: &Arc<Inner>) -> Result<(), String> {
    inner.serve_this_process();
    // Every page resident at the fork is shared with the parent, in the
    // child as in the parent (where `parent()` says so after the fork,
    // too late for this copy of the flag): `UFFDIO_MOVE`'s EBUSY on one
    // is the sharing, not a pin (`batch.rs`'s `stage_shared`).
    inner.note_fork();
    // The pins below are dropped; guards taken before this let go of
    // nothing (the forking thread's among them: a pin it still needs,
    // its alternate stack's, it takes again after this).
    inner.new_pin_epoch();
    inner.uffd().reopen_here().map_err(|e| e.to_string())?;
    inner.discarder().reopen_here();
    inner.frames().staging.reopen_here();
    inner.frames().bounce.reopen_here();
    let missing = RegisterMode {
        missing: true,
        wp: false,
    };
    for m in [
        inner.frames().staging.mapping(),
        inner.frames().unit_out.mapping(),
    ] {
        inner
            .uffd()
            .register(m.addr(), m.len() as u64, missing)
            .map_err(|e| e.to_string())?;
    }
    let closed = inner.has_file_device();
    if closed {
        // Until the child has files of its own, made when it first has
        // pages to swap out (`Inner::open_layers`).
        inner.backing().closed.store(true, Ordering::Relaxed);
        // Every device hears of the fork (each counts its depth), so no
        // short cut.
        let mut layerable = true;
        for d in inner.backing().devices.iter().filter(|d| d.has_file()) {
            layerable &= d.forked();
        }
        inner.backing().layerable.store(layerable, Ordering::Relaxed);
        inner.backing().layers_tried.store(false, Ordering::Relaxed);
    }
    // An instance that stopped paging left its regions to the kernel
    // (`Swap::stop_paging`): so does its child, whose copy of them is
    // plain memory too, every page in.
    let regions = if inner.budget().held_for_good() {
        Vec::new()
    } else {
        regions::regions_of(inner)
    };
    for r in regions {
        inner
            .uffd()
            .register(
                r.base,
                r.end - r.base,
                RegisterMode {
                    missing: true,
                    wp: true,
                },
            )
            .map_err(|e| e.to_string())?;
        let pages = ((r.end - r.base) / PAGE_SIZE as u64) as usize;
        // Only the pages whose entries were ever written (others are
        // `Never` with no pin: nothing to settle).
        let spans = written_ids(inner, r.id_base as usize, pages);
        if r.huge {
            let mut next = 0;
            for span in &spans {
                let from = (span.start / UNIT_PAGES * UNIT_PAGES).max(next);
                for p in (from..span.end).step_by(UNIT_PAGES) {
                    let id = r.id_base as usize + p;
                    for q in 0..UNIT_PAGES {
                        if inner.pins()[id + q].load(Ordering::Relaxed) != 0 {
                            inner.pins()[id + q].store(0, Ordering::Relaxed);
                        }
                    }
                    dirty_if_clean(inner, id, true);
                    next = p + UNIT_PAGES;
                }
            }
            continue;
        }
        // Small pages: clean ones are write-protected again, a run of
        // neighbours per call, and stay clean with their slot (dropped
        // without IO when they go, shared with the parent or not); where
        // the kernel refuses, they become dirty.
        let mut run: Option<(usize, usize)> = None;
        for span in spans {
            // A page between spans is not clean: a run ends there.
            if run.is_some_and(|(first, n)| first + n < span.start) {
                if let Some((first, n)) = run.take() {
                    protect_run(inner, &r, first, n);
                }
            }
            for p in span {
                let id = r.id_base as usize + p;
                // Stored only where they change: a store to every entry
                // would commit pages of zeros in every forked child (a
                // shell's pipeline children held 70 MiB each of it).
                if inner.pins()[id].load(Ordering::Relaxed) != 0 {
                    inner.pins()[id].store(0, Ordering::Relaxed);
                }
                let st = &inner.states()[id];
                // A sealed page's write protection is not the child's
                // (fork copies page tables without it): plain dirty here.
                // A claim a thread of the parent held is no one's here.
                let old = st.load();
                let w = old.unclaimed().unsealed();
                if w != old {
                    st.store(w);
                }
                let clean = w.is(Kind::Resident) && !w.is_dirty();
                match (&mut run, clean) {
                    (Some((_, n)), true) => *n += 1,
                    (None, true) => run = Some((p, 1)),
                    (Some((first, n)), false) => {
                        let (first, n) = (*first, *n);
                        run = None;
                        protect_run(inner, &r, first, n);
                    }
                    (None, false) => {}
                }
            }
        }
        if let Some((first, n)) = run {
            protect_run(inner, &r, first, n);
        }
    }
    threads::start_threads(inner);
    Ok(())
}

/// Write-protect the run of `n` clean pages from page `first` of region
/// `r` again, or make them dirty where the kernel refuses.
fn protect_run(inner: &Inner, r: &regions::Published, first: usize, n: usize) {
    let addr = r.base + (first * PAGE_SIZE) as u64;
    let len = (n * PAGE_SIZE) as u64;
    if inner.uffd().writeprotect(addr, len, true, false).is_err() {
        for q in first..first + n {
            dirty_if_clean(inner, r.id_base as usize + q, false);
        }
    }
}

/// The pages of a region (`pages` from id `id_base`, counted from the
/// region's first) whose state or pin entries may be other than zero, as
/// ranges in order.  `uswap run`'s heap region spans tens of GiB of
/// address space (6 M pages and more) of which a shell uses a few MiB:
/// reading every entry made each forked child fault the zero page into
/// 50-80 MiB of untouched tables, 20-30 ms per `$(...)`, where the
/// tables' page map says which of their pages were ever written.
fn written_ids(inner: &Inner, id_base: usize, pages: usize) -> Vec<std::ops::Range<usize>> {
    let mut spans = crate::table::written_entries(&inner.states()[id_base..id_base + pages]);
    spans.extend(crate::table::written_entries(
        &inner.pins()[id_base..id_base + pages],
    ));
    spans.sort_by_key(|r| r.start);
    let mut out: Vec<std::ops::Range<usize>> = Vec::with_capacity(spans.len());
    for r in spans {
        match out.last_mut() {
            Some(o) if o.end >= r.start => o.end = o.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

/// A clean resident page (or unit) of the child becomes dirty and lets
/// go of its slot: nothing write-protects it any more.
fn dirty_if_clean(inner: &Inner, id: usize, unit: bool) {
    let st = &inner.states()[id];
    let old = st.load();
    let w = old.unclaimed();
    if !w.is(Kind::Resident) || w.is_dirty() {
        if w != old {
            st.store(w);
        }
        return;
    }
    if unit {
        match w.slot() {
            Some(base) if w.is_whole() => inner.free_huge(base),
            _ => {
                for q in 0..UNIT_PAGES {
                    let o = &inner.states()[id + q];
                    if q > 0 {
                        if let Some(e) = o.load().slot() {
                            inner.free_slot(e);
                        }
                        o.store(PageWord::NEVER);
                    }
                }
                if let Some(e) = w.slot() {
                    inner.free_slot(e);
                }
            }
        }
    } else if let Some(e) = w.slot() {
        inner.free_slot(e);
    }
    st.store(w.without_slot().dirty());
}
