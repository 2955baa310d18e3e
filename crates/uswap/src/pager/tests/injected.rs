//! Transitions that fail half way, by injection: a move into a region
//! (a swap-cache hit, a 2 MB unit coming in), the move back of a page
//! whose writeback failed, a unit's eviction.  After each, in both fault
//! modes, every page's data is intact and its state is true: a page the
//! state word calls resident is mapped, and no other is.

use std::sync::atomic::Ordering;

use super::support::*;
use super::*;

const MIB: u64 = 1 << 20;

fn pattern(p: usize) -> u8 {
    (p as u8).wrapping_mul(13) ^ 0xa5
}

fn write_page(region: &mut Region, p: usize) {
    region.as_mut_slice()[p * PAGE_SIZE..(p + 1) * PAGE_SIZE].fill(pattern(p));
}

fn check_page(region: &Region, p: usize) {
    let page = &region.as_slice()[p * PAGE_SIZE..(p + 1) * PAGE_SIZE];
    assert!(
        page.iter().all(|&b| b == pattern(p)),
        "page {p} reads {:#x}",
        page[0]
    );
}

fn present(region: &Region, p: usize) -> bool {
    crate::sys::page_mapped(region.as_ptr() as u64 + (p * PAGE_SIZE) as u64)
}

/// The state word of page `p`.
fn word(region: &Region, p: usize) -> PageWord {
    region.inner.states()[region.id_base as usize + p].load()
}

/// Every page's state is true of the page tables.
fn assert_states_true(region: &Region, huge: bool) {
    settle(region);
    let pages = region.len() / PAGE_SIZE;
    let step = if huge { page::UNIT_PAGES } else { 1 };
    for head in (0..pages).step_by(step) {
        let w = word(region, head);
        assert!(!w.is_busy(), "page {head} left claimed");
        let resident = w.is(Kind::Resident);
        for p in head..head + step {
            assert_eq!(
                present(region, p),
                resident,
                "page {p}: state {w:?} but {}mapped",
                if resident { "not " } else { "" }
            );
        }
    }
}

fn swap(mode: FaultMode, budget: u64) -> Swap {
    Swap::builder()
        .budget(budget)
        .device(SwapDeviceSpec::ram(64 * MIB))
        .fault_mode(mode)
        .background_reclaim(false)
        .build()
        .unwrap()
}

fn staged_page(region: &Region, skip: usize) -> usize {
    (0..region.len() / PAGE_SIZE)
        .filter(|&p| region.is_staged(p))
        .nth(skip)
        .expect("a staged page")
}

fn inject_move(
    f: &(
        std::sync::atomic::AtomicUsize,
        std::sync::atomic::AtomicUsize,
        std::sync::atomic::AtomicI32,
    ),
    n: usize,
    partial: usize,
    errno: i32,
) {
    f.1.store(partial, Ordering::Relaxed);
    f.2.store(errno, Ordering::Relaxed);
    f.0.store(n, Ordering::Release);
}

/// The next `n` copies that finish a failed move in fail too.
fn inject_copy(swap: &Swap, n: usize, errno: i32) {
    swap.inner.inject().copy_in.1.store(errno, Ordering::Relaxed);
    swap.inner.inject().copy_in.0.store(n, Ordering::Release);
}

/// A swap-cache hit whose move back into the region fails: the page is
/// copied in instead; when the copy fails too, it stays staged and the
/// access retries until it goes in.
#[test]
fn a_failed_move_in_keeps_the_page() {
    for mode in [FaultMode::Sigbus, FaultMode::HandlerThread] {
        let swap = swap(mode, MIB);
        let mut region = swap.map(512 * PAGE_SIZE).unwrap();
        for p in 0..512 {
            write_page(&mut region, p);
        }
        let p = staged_page(&region, 0);
        inject_move(&swap.inner.inject().move_in, 1, 0, libc::ENOMEM);
        check_page(&region, p);
        settle(&region);
        let st = swap.stats();
        assert_eq!(
            st.counters.move_fallbacks, 1,
            "{mode:?}: copied in: {:?}",
            st.counters
        );
        assert!(region.is_resident(p));
        assert_states_true(&region, false);

        let q = staged_page(&region, 0);
        inject_move(&swap.inner.inject().move_in, 1, 0, libc::ENOMEM);
        inject_copy(&swap, 1, libc::ENOMEM);
        let retries = swap.stats().counters.install_retries;
        check_page(&region, q);
        settle(&region);
        assert!(
            swap.stats().counters.install_retries > retries,
            "{mode:?}: retried"
        );
        assert!(region.is_resident(q));
        assert_states_true(&region, false);
        for p in 0..512 {
            check_page(&region, p);
        }
        drop(region);
        assert_all_returned(&swap, &format!("{mode:?}"));
    }
}

/// Writeback fails for good (EIO): the page goes back into its region,
/// copied when the move fails, and its slot is retired; when neither
/// works, the page stays staged on its slot (not retired) and is written
/// later.
#[test]
fn a_failed_move_back_after_a_write_error_keeps_the_page() {
    for mode in [FaultMode::Sigbus, FaultMode::HandlerThread] {
        for copy_fails in [false, true] {
            let swap = swap(mode, MIB);
            let mut region = swap.map(2048 * PAGE_SIZE).unwrap();
            for p in 0..512 {
                write_page(&mut region, p);
            }
            swap.inject_io_error(0, crate::io::ANY_SLOT, crate::io::IoOp::Write);
            inject_move(&swap.inner.inject().move_in, 1, 0, libc::ENOMEM);
            if copy_fails {
                inject_copy(&swap, 1, libc::ENOMEM);
            }
            for p in 512..2048 {
                write_page(&mut region, p);
            }
            settle(&region);
            let st = swap.stats();
            // The failed call; when it was a run, the bad page fails each
            // retry that covers it (a segment, a queued write) until it is
            // written alone.
            assert!(
                (1..=3).contains(&st.counters.io_write_errors),
                "{mode:?}: {:?}",
                st.counters
            );
            assert_eq!(
                st.counters.swapout_errors,
                u64::from(!copy_fails),
                "{mode:?}: {:?}",
                st.counters
            );
            assert_states_true(&region, false);
            for p in 0..2048 {
                check_page(&region, p);
            }
            drop(region);
            assert_all_returned_but(
                &swap,
                u64::from(!copy_fails),
                &format!("{mode:?} copy_fails={copy_fails}: only a slot given up on stays retired"),
            );
        }
    }
}

/// A 2 MB unit whose move in stops part way (after 100 pages) is finished
/// by copying; when the copy fails for now too, the faulting thread waits
/// and retries: a resident unit is always all there.
#[test]
fn a_unit_move_in_that_stops_part_way_is_finished() {
    for mode in [FaultMode::Sigbus, FaultMode::HandlerThread] {
        for copy_failures in [0, 2] {
            let swap = swap(mode, 4 * MIB);
            let mut region = swap.map_huge(16 * MIB as usize).unwrap();
            let pages = region.len() / PAGE_SIZE;
            for p in 0..pages {
                write_page(&mut region, p);
            }
            // A unit that went out (the oldest, as a rule; the LRU's
            // per-CPU batches do not promise it).
            settle(&region);
            let u = (0..pages)
                .step_by(page::UNIT_PAGES)
                .find(|&h| !region.is_resident(h))
                .expect("a unit went out");
            // Each failed copy ends one try; the next try moves on from
            // where the last one stopped, and stops again.
            inject_move(
                &swap.inner.inject().move_in,
                copy_failures.max(1),
                100,
                libc::ENOMEM,
            );
            inject_copy(&swap, copy_failures, libc::ENOMEM);
            check_page(&region, u + 7);
            settle(&region);
            assert!(region.is_resident(u), "{mode:?}: unit at page {u} came in");
            assert_states_true(&region, true);
            let st = swap.stats();
            assert!(
                st.counters.install_retries >= copy_failures as u64,
                "{:?}",
                st.counters
            );
            for p in 0..pages {
                check_page(&region, p);
            }
            drop(region);
            assert_all_returned(&swap, &format!("{mode:?}"));
        }
    }
}

/// A unit whose move out stops part way (after 100 pages; `EBUSY`, as at
/// a pinned page) is put back whole, the move back itself failing once and
/// copied; it stays resident, counted, and goes out later.  A unit whose
/// write fails (EIO) is put back whole too, and only the bad slot retired.
#[test]
fn a_failed_unit_eviction_keeps_the_unit() {
    for mode in [FaultMode::Sigbus, FaultMode::HandlerThread] {
        let swap = swap(mode, 4 * MIB);
        let mut region = swap.map_huge(16 * MIB as usize).unwrap();
        let pages = region.len() / PAGE_SIZE;
        // Units 0 and 1 fill the budget; the fault on unit 2 must evict
        // one, and the first try (unit 0, the oldest) fails.
        for p in 0..1024 {
            write_page(&mut region, p);
        }
        inject_move(&swap.inner.inject().move_out, 1, 100, libc::EBUSY);
        inject_move(&swap.inner.inject().move_in, 1, 10, libc::ENOMEM);
        for p in 1024..1536 {
            write_page(&mut region, p);
        }
        settle(&region);
        let st = swap.stats();
        assert_eq!(st.counters.unevictable, 1, "{mode:?}: {:?}", st.counters);
        // The refused unit (the oldest, unit 0, as a rule) stayed.
        assert!(
            region.is_resident(0) || region.is_resident(page::UNIT_PAGES),
            "{mode:?}: the refused unit stayed: heads {:x?} {:?}",
            (0..4).map(|u| word(&region, u * 512)).collect::<Vec<_>>(),
            st.counters
        );
        assert_states_true(&region, true);
        // The unit that could not go is still all there.
        let kept = (0..pages)
            .step_by(512)
            .find(|&h| region.is_resident(h))
            .expect("a unit is resident");
        for p in kept..kept + 512 {
            check_page(&region, p);
        }
        swap.inject_io_error(0, crate::io::ANY_SLOT, crate::io::IoOp::Write);
        for p in 1536..pages {
            write_page(&mut region, p);
        }
        settle(&region);
        let st = swap.stats();
        assert_eq!(st.counters.swapout_errors, 1, "{mode:?}: {:?}", st.counters);
        assert_states_true(&region, true);
        for p in 0..pages {
            check_page(&region, p);
        }
        drop(region);
        // The failed 2 MB write is tried again page by page: the bad
        // block costs its own slot, and the cluster's 511 others go back.
        assert_all_returned_but(&swap, 1, &format!("{mode:?}: one slot retired"));
    }
}

/// A unit split over single slots (seed 003 off) is one folio still: its
/// pages go out and come in one IO per segment of neighbouring slots.  A
/// bad block among them fails the unit's write, and the segment is tried
/// again page by page: only that page's slot is retired, the other 511 go
/// back, and the unit stays resident, whole, to go out later.
#[test]
fn a_split_unit_goes_in_segments_and_a_bad_block_costs_one_slot() {
    for mode in [FaultMode::Sigbus, FaultMode::HandlerThread] {
        let swap = Swap::builder()
            .budget(4 * MIB)
            .device(SwapDeviceSpec::ram(64 * MIB))
            .fault_mode(mode)
            .background_reclaim(false)
            .switches(crate::swap_space::Switches {
                huge_cluster: false,
                ..crate::swap_space::Switches::DEFAULT
            })
            .build()
            .unwrap();
        let mut region = swap.map_huge(16 * MIB as usize).unwrap();
        let pages = region.len() / PAGE_SIZE;
        for p in 0..1024 {
            write_page(&mut region, p);
        }
        // The next unit's fault must evict one, whose write fails.
        swap.inject_io_error(0, crate::io::ANY_SLOT, crate::io::IoOp::Write);
        for p in 1024..1536 {
            write_page(&mut region, p);
        }
        settle(&region);
        let st = swap.stats();
        assert_eq!(st.counters.swapout_errors, 1, "{mode:?}: {:?}", st.counters);
        assert_states_true(&region, true);
        for p in 1536..pages {
            write_page(&mut region, p);
        }
        settle(&region);
        let st = swap.stats();
        assert!(st.counters.huge_swapouts >= 2, "{mode:?}: {:?}", st.counters);
        // Split, yet nowhere near one IO a page.
        assert!(
            st.counters.io_writes * 32 < st.counters.io_write_pages,
            "{mode:?}: {:?}",
            st.counters
        );
        for p in 0..pages {
            check_page(&region, p);
        }
        assert!(
            st.counters.io_reads * 32 < st.counters.io_read_pages + 1,
            "{mode:?}: {:?}",
            st.counters
        );
        assert_states_true(&region, true);
        drop(region);
        assert_all_returned_but(&swap, 1, &format!("{mode:?}: one bad block retired"));
    }
}

/// A staging frame handed out holding a page (a populated free frame, the
/// sign of a bug: docs/RELIABILITY.md) refuses the page moved into it
/// (`EEXIST`) and is set aside, not given back: the first eviction meets
/// it, every later one gets other frames, and no page is lost.  Release
/// builds only: a debug build's pool stops at the hand-out (frames.rs).
#[test]
#[cfg(not(debug_assertions))]
fn a_staging_frame_handed_out_holding_a_page_is_set_aside() {
    for mode in both_modes() {
        let swap = ram_swap(MIB, 32 * MIB, mode);
        let inner = &swap.inner;
        // The pool hands out from frame 0 first (next fit from the
        // start): fill it, as no free frame may be.
        let page = [0x77u8; PAGE_SIZE];
        inner
            .copy(
                inner.frames().staging.addr(0),
                page.as_ptr(),
                PAGE_SIZE as u64,
                false,
            )
            .unwrap();
        let mut region = swap.map((8 * MIB) as usize).unwrap();
        let pages = region.len() / PAGE_SIZE;
        for p in 0..pages {
            write_page(&mut region, p);
        }
        for p in 0..pages {
            check_page(&region, p);
        }
        settle(&region);
        assert_states_true(&region, false);
        let st = swap.stats().counters;
        assert!(st.evictions > pages as u64 / 2, "{}: {st:?}", mode_name(mode));
        assert_eq!(st.unevictable, 1, "{}: the frame is met once", mode_name(mode));
        // SAFETY: frame 0 is set aside: nobody else reads it.
        let kept = unsafe { std::ptr::read_volatile(inner.frames().staging.addr(0) as *const u8) };
        assert_eq!(
            kept,
            0x77,
            "{}: the frame set aside keeps what it held",
            mode_name(mode)
        );
        drop(region);
        assert_all_returned(&swap, mode_name(mode));
    }
}

/// A move out that fails having moved more than it says (3 pages past
/// its count, with `EBUSY`): the pages gone from their region into their
/// frames count as moved and the run goes on, so no page is lost and no
/// frame is given back full.  Taken for a move that did nothing, each of
/// those pages stayed resident by its word, missing from its region (read
/// as zeros), and its frame refused the next page (`EEXIST`): the
/// signature of docs/RELIABILITY.md's sightings.
#[test]
fn a_move_out_that_moved_more_than_it_said_loses_nothing() {
    for mode in both_modes() {
        let swap = swap(mode, 4 * MIB);
        let mut region = swap.map((16 * MIB) as usize).unwrap();
        let pages = region.len() / PAGE_SIZE;
        for p in 0..pages / 2 {
            write_page(&mut region, p);
        }
        swap.inner
            .inject()
            .move_out_unreported
            .store(3, Ordering::Relaxed);
        inject_move(&swap.inner.inject().move_out, 4, 1, libc::EBUSY);
        for p in pages / 2..pages {
            write_page(&mut region, p);
        }
        settle(&region);
        assert_eq!(
            swap.inner.inject().move_out.0.load(Ordering::Relaxed),
            0,
            "{}: every injected move was made",
            mode_name(mode)
        );
        assert_states_true(&region, false);
        for p in 0..pages {
            check_page(&region, p);
        }
        let st = swap.stats().counters;
        assert_eq!(st.unevictable, 0, "{}: {st:?}", mode_name(mode));
        drop(region);
        assert_all_returned(&swap, mode_name(mode));
    }
}
