//! What a program does to its own paged memory: pins it for DMA, maps
//! over part of a 2 MB unit, discards it (`MADV_DONTNEED`), locks or
//! protects it, maps something else where a dropped region was; each made
//! to happen, in both fault modes where both apply.
//!
//! Scenarios that died, hung or deadlocked before their fix run in a
//! child process under a watchdog (`child.rs`), so that a regression fails
//! its test with the child's output instead of taking the suite down.

use std::time::Duration;

use super::child;
use super::support::*;
use super::*;

const MIB: u64 = 1 << 20;

// A pinned page must stay resident: the pin holder writes the page
// itself, and a copy taken for swap would go stale.

#[test]
fn pinned_pages_stay_resident() {
    for mode in both_modes() {
        let swap = ram_swap(MIB, 32 * MIB, mode);
        let mut region = swap.map((8 * MIB) as usize).unwrap();
        let base = region.as_mut_slice().as_mut_ptr();
        let pages = region.len() / PAGE_SIZE;
        write_pages(base, 0..pages);
        let mut ring = io_uring::IoUring::new(4).unwrap();
        pin_page(&ring, base);
        // Stream over the rest three times: page 0, never touched again,
        // comes up for eviction.
        for _ in 0..3 {
            write_pages(base, 1..pages);
        }
        let dir = tempfile::tempdir().unwrap();
        let file = page_file(&dir, 0x5b);
        read_fixed(&mut ring, &file, base);
        ring.submitter().unregister_buffers().unwrap();
        let st = swap.stats();
        // SAFETY: page 0 of the region.
        let page0 = unsafe { std::slice::from_raw_parts(base, PAGE_SIZE) };
        assert!(
            page0.iter().all(|&b| b == 0x5b),
            "{mode:?}: the data the pin holder wrote is lost: page 0 reads {:#x} ({:?})",
            page0[0],
            st.counters
        );
        assert!(st.counters.unevictable > 0, "{mode:?}: {:?}", st.counters);
        assert_eq!(check_pages(base, 1..pages), None, "{mode:?}");
        drop(region);
        assert_all_returned(&swap, mode_name(mode));
    }
}

// A unit that `UFFDIO_MOVE` moves only part of (a hole, a pinned page).

fn unit_scenario(arg: &str) {
    let mode = mode_from(arg);
    let dir = tempfile::tempdir().unwrap();
    let swap = Swap::builder()
        .budget(4 * MIB)
        .device(ram_or_file_of(64 * MIB, arg.contains("file"), &dir, "unit"))
        .fault_mode(mode)
        .build()
        .unwrap();
    let mut region = swap.map_huge(16 * MIB as usize).unwrap();
    let base = region.as_mut_slice().as_mut_ptr();
    let pages = region.len() / PAGE_SIZE;
    madvise(base, region.len(), libc::MADV_NOHUGEPAGE);
    write_pages(base, 0..512);
    let mut ring = io_uring::IoUring::new(4).unwrap();
    let odd = if arg.contains("pin") {
        // SAFETY: page 7 of unit 0.
        pin_page(&ring, unsafe { base.add(7 * PAGE_SIZE) });
        7
    } else {
        // SAFETY: page 5 of unit 0.
        madvise(unsafe { base.add(5 * PAGE_SIZE) }, PAGE_SIZE, libc::MADV_DONTNEED);
        5
    };
    // Fill the other units twice: unit 0 comes up for eviction.
    for _ in 0..2 {
        write_pages(base, 512..pages);
    }
    eprintln!("filled");
    // SAFETY: page `odd` of unit 0.
    let odd_page = unsafe { base.add(odd * PAGE_SIZE) };
    if arg.contains("pin") {
        let file = page_file(&dir, 0x5b);
        read_fixed(&mut ring, &file, odd_page);
        ring.submitter().unregister_buffers().unwrap();
    }
    // SAFETY: one page of unit 0.
    let odd_bytes = unsafe { std::slice::from_raw_parts(odd_page, PAGE_SIZE) };
    let want = if arg.contains("pin") { 0x5b } else { 0 };
    assert!(
        odd_bytes.iter().all(|&b| b == want),
        "page {odd} reads {:#x}",
        odd_bytes[0]
    );
    assert_eq!(check_pages(base, 0..odd), None);
    assert_eq!(check_pages(base, odd + 1..pages), None);
    let st = swap.stats();
    eprintln!("{:?}", st.counters);
    assert!(st.counters.huge_swapouts > 4, "{:?}", st.counters);
    drop(region);
    assert_all_returned(&swap, arg);
}

#[test]
fn units_with_a_hole_or_a_pin_are_handled() {
    if let Some(arg) = child::scenario() {
        unit_scenario(&arg);
        child::exit(0);
    }
    for mode in both_modes() {
        for case in ["hole-ram", "hole-file", "pin-ram"] {
            let arg = format!("{case}-{}", mode_name(mode));
            let out = child::run(
                "pager::tests::memory::units_with_a_hole_or_a_pin_are_handled",
                &arg,
                Duration::from_secs(60),
            );
            assert!(out.code == Some(0), "{arg}: {out:?}");
        }
    }
}

// The program's own MADV_DONTNEED on a resident page: the page reads
// as zeros, as a fresh anonymous page would, instead of faulting
// forever.

fn dontneed_scenario(mode: FaultMode) {
    let swap = ram_swap(MIB, 16 * MIB, mode);
    let mut region = swap.map((4 * MIB) as usize).unwrap();
    let base = region.as_mut_slice().as_mut_ptr();
    let pages = region.len() / PAGE_SIZE;
    // Page 0: written (dirty), then discarded by the program.
    write_pages(base, 0..1);
    madvise(base, PAGE_SIZE, libc::MADV_DONTNEED);
    eprintln!("reading a discarded dirty page");
    // SAFETY: page 0 of the region.
    assert_eq!(unsafe { std::ptr::read_volatile(base) }, 0);
    // Page 1: swapped out, read back clean (it keeps its slot), then
    // discarded.
    write_pages(base, 1..pages);
    assert_eq!(check_pages(base, 1..2), None);
    // SAFETY: page 1 of the region.
    let p1 = unsafe { base.add(PAGE_SIZE) };
    madvise(p1, PAGE_SIZE, libc::MADV_DONTNEED);
    eprintln!("reading a discarded clean page");
    // SAFETY: page 1 of the region.
    assert_eq!(unsafe { std::ptr::read_volatile(p1.add(100)) }, 0);
    // Discarded again and written: a write fault on a hole.
    madvise(p1, PAGE_SIZE, libc::MADV_DONTNEED);
    // SAFETY: page 1 of the region.
    unsafe { std::ptr::write_volatile(p1.add(8), 0x11) };
    // SAFETY: as above.
    assert_eq!(unsafe { std::ptr::read_volatile(p1.add(8)) }, 0x11);
    // Discarded pages the reclaimer meets later are dropped, not written.
    // Only a resident page's discard can be seen (uswap does not see the
    // madvise itself): a page resident and unclaimed before and after its
    // madvise was in place throughout (the reclaimer moves a page out only
    // under its claim, and commits it STAGED, never back to RESIDENT), so
    // the madvise dropped it.  A claimed page may be on its way out
    // already: its contents safe in a staging frame, not discarded.
    let settled = |p: usize| {
        let w = region.inner.states()[region.id_base as usize + p].load();
        w.is(Kind::Resident) && !w.is_busy()
    };
    let discarded_before = swap.stats().counters.discarded;
    let mut gone = Vec::new();
    for p in 2..pages {
        if settled(p) {
            // SAFETY: page p of the region.
            madvise(unsafe { base.add(p * PAGE_SIZE) }, PAGE_SIZE, libc::MADV_DONTNEED);
            if settled(p) {
                gone.push(p);
            }
        }
    }
    assert!(gone.len() >= 32, "only {} resident pages to discard", gone.len());
    // Push them all out, then read them back.
    for p in 2..pages {
        if gone.binary_search(&p).is_err() {
            write_pages(base, p..p + 1);
        }
    }
    for &p in &gone {
        // SAFETY: page p of the region.
        let page = unsafe { std::slice::from_raw_parts(base.add(p * PAGE_SIZE), PAGE_SIZE) };
        assert!(page.iter().all(|&b| b == 0), "discarded page {p} is not zeros");
    }
    let discarded = swap.stats().counters.discarded - discarded_before;
    assert!(
        discarded >= gone.len() as u64,
        "{discarded} of {} discards counted",
        gone.len()
    );
    drop(region);
    assert_all_returned(&swap, mode_name(mode));
}

#[test]
fn discarded_resident_pages_read_as_zeros() {
    if let Some(arg) = child::scenario() {
        dontneed_scenario(mode_from(&arg));
        child::exit(0);
    }
    for mode in both_modes() {
        let out = child::run(
            "pager::tests::memory::discarded_resident_pages_read_as_zeros",
            mode_name(mode),
            Duration::from_secs(30),
        );
        assert!(out.code == Some(0), "{mode:?}: {out:?}");
    }
}

/// A page whose region the program unmapped and replaced: dropping the
/// region leaves the new mapping alone.  No background reclaimer: uswap
/// does not see the munmap (UFFD_EVENT_UNMAP is `uswap run`'s), so a
/// reclaimer evicting the old region's pages meanwhile would move the new
/// mapping's pages out from under the program; that is not what this
/// test is about.
#[test]
fn region_drop_spares_what_the_program_mapped_there() {
    let swap = Swap::builder()
        .budget(MIB)
        .device(SwapDeviceSpec::ram(16 * MIB))
        .background_reclaim(false)
        .build()
        .unwrap();
    let mut region = swap.map((4 * MIB) as usize).unwrap();
    let base = region.as_mut_slice().as_mut_ptr();
    let len = region.len();
    write_pages(base, 0..1024);
    // SAFETY: the program unmaps region memory and maps its own there,
    // which is what this test is about.
    let p = unsafe {
        assert_eq!(libc::munmap(base.cast(), len), 0);
        libc::mmap(
            base.cast(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    assert_eq!(p, base.cast(), "{}", std::io::Error::last_os_error());
    // SAFETY: our own new mapping.
    unsafe { std::ptr::write_bytes(base, 0x33, len) };
    drop(region);
    let mut v = vec![0u8; len / PAGE_SIZE];
    // SAFETY: mincore only reports, or fails with ENOMEM if unmapped.
    let rc = unsafe { libc::mincore(base.cast(), len, v.as_mut_ptr()) };
    assert_eq!(rc, 0, "the program's mapping was unmapped by Region::drop");
    // SAFETY: still our own mapping.
    let bytes = unsafe { std::slice::from_raw_parts(base, len) };
    assert!(bytes.iter().all(|&b| b == 0x33));
    // SAFETY: ours to unmap.
    unsafe { libc::munmap(base.cast(), len) };
    swap.swap_space().drain_slot_caches();
    assert_eq!(swap.free_slots(), swap.total_slots());
}

/// The program's own mprotect or mlock on region memory: those pages stay
/// resident, counted and reported once, and eviction goes on around them.
#[test]
fn locked_and_read_only_pages_are_unevictable() {
    if let Some(arg) = child::scenario() {
        let swap = Swap::builder()
            .budget(MIB)
            .device(SwapDeviceSpec::ram(32 * MIB))
            .fault_mode(mode_from(&arg))
            .build()
            .unwrap();
        let mut region = swap.map((8 * MIB) as usize).unwrap();
        let base = region.as_mut_slice().as_mut_ptr();
        let pages = region.len() / PAGE_SIZE;
        write_pages(base, 0..64);
        // SAFETY: the program's own calls on its region, as under test.
        unsafe {
            assert_eq!(libc::mlock(base.cast(), 32 * PAGE_SIZE), 0);
            assert_eq!(
                libc::mprotect(base.add(32 * PAGE_SIZE).cast(), 32 * PAGE_SIZE, libc::PROT_READ),
                0
            );
        }
        let before = swap.stats().counters.evictions;
        for _ in 0..3 {
            write_pages(base, 64..pages);
        }
        let st = swap.stats();
        assert!(
            st.counters.evictions - before > 2000,
            "eviction goes on: {:?}",
            st.counters
        );
        assert!(st.counters.unevictable >= 64, "{:?}", st.counters);
        assert_eq!(check_pages(base, 0..pages), None);
        // SAFETY: undo them before the region goes.
        unsafe {
            libc::munlock(base.cast(), 32 * PAGE_SIZE);
            libc::mprotect(
                base.add(32 * PAGE_SIZE).cast(),
                32 * PAGE_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
            );
        }
        drop(region);
        assert_all_returned(&swap, &arg);
        child::exit(0);
    }
    for mode in both_modes() {
        let out = child::run(
            "pager::tests::memory::locked_and_read_only_pages_are_unevictable",
            mode_name(mode),
            Duration::from_secs(60),
        );
        assert!(out.code == Some(0), "{mode:?}: {out:?}");
        let lines = out
            .stderr
            .lines()
            .filter(|l| l.contains("cannot be evicted"))
            .count();
        assert_eq!(lines, 1, "{mode:?}: reported once: {out:?}");
    }
}

// Batched eviction: clean pages dropped in place, dirty
// neighbours moved as runs.

/// A clean page (read back, write-protected) that the program discards
/// itself must read as zeros after the reclaimer drops it in a batch, not
/// as its slot's old copy; its neighbours keep their data.  (Only pages
/// still resident when the program discards them: uswap does not see a
/// discard of a page it has evicted already, as it does not see munmap;
/// no background reclaimer, so nothing is evicted between the look and
/// the discard.)
#[test]
fn discarded_clean_pages_read_as_zeros_after_batched_eviction() {
    for mode in both_modes() {
        let swap = Swap::builder()
            .budget(MIB)
            .device(SwapDeviceSpec::ram(32 * MIB))
            .fault_mode(mode)
            // Pages read back come in clean, one per fault.
            .readahead(false)
            .background_reclaim(false)
            // Reclaim only at the budget, in whole batches: paced
            // eviction takes a batch back every few faults, and how many
            // of the pages read stay resident then depends on where its
            // batches fall (CI once saw 3 of 128).
            .paced_reclaim(false)
            .build()
            .unwrap();
        let mut region = swap.map((4 * MIB) as usize).unwrap();
        let base = region.as_mut_slice().as_mut_ptr();
        let pages = region.len() / PAGE_SIZE;
        write_pages(base, 0..pages);
        // Read the first 128 back: clean, each with its slot.
        assert_eq!(check_pages(base, 0..128), None, "{mode:?}");
        let mut gone = [false; 128];
        for p in (0..128).step_by(2) {
            // SAFETY: page p of the region.
            let page = unsafe { base.add(p * PAGE_SIZE) };
            if crate::sys::page_mapped(page as u64) {
                madvise(page, PAGE_SIZE, libc::MADV_DONTNEED);
                gone[p] = true;
            }
        }
        let discards = gone.iter().filter(|&&g| g).count() as u64;
        // Eviction at the budget takes the oldest first, pages beyond
        // 128 among them: about half of the even pages stay.
        assert!(
            discards >= 32,
            "{mode:?}: only {discards} of pages 0..128 stayed resident"
        );
        for _ in 0..2 {
            write_pages(base, 256..pages);
        }
        let st = swap.stats();
        for (p, &gone) in gone.iter().enumerate() {
            if gone {
                // SAFETY: page p of the region.
                let page = unsafe { std::slice::from_raw_parts(base.add(p * PAGE_SIZE), PAGE_SIZE) };
                assert!(
                    page.iter().all(|&b| b == 0),
                    "{mode:?}: discarded page {p} reads old data ({:?})",
                    st.counters
                );
            } else {
                assert_eq!(check_pages(base, p..p + 1), None, "{mode:?}");
            }
        }
        assert!(st.counters.discarded >= discards, "{mode:?}: {:?}", st.counters);
        assert!(st.counters.evict_clean >= 32, "{mode:?}: {:?}", st.counters);
        assert_eq!(check_pages(base, 256..pages), None, "{mode:?}");
        drop(region);
        assert_all_returned(&swap, mode_name(mode));
    }
}

/// Wide fault-around: far below the budget, and once past its first
/// `WIDE_FROM` pages (until then as with it off), first touches out of
/// order fill runs of fresh pages, so most touches take no fault; off,
/// nearly every out-of-order touch faults.  Every page reads zeros before
/// it is written and what was written after, and the resident count is
/// the pages that went in, in both fault modes.
#[test]
fn first_touches_far_below_the_budget_fill_runs() {
    use crate::pager::fault::readahead::WIDE_FROM;
    // The second part 2048 pages: a stride of 97 over 3072 wraps 32
    // pages on, onto the pages each fill ended at.
    const PAGES: usize = WIDE_FROM + 2048;
    for mode in both_modes() {
        for wide in [true, false] {
            let what = format!("{mode:?} wide={wide}");
            let swap = Swap::builder()
                .budget(64 * MIB)
                .device(SwapDeviceSpec::ram(8 * MIB))
                .fault_mode(mode)
                .wide_fault_around(wide)
                // The touches step 97 pages: the trend prefetch would
                // follow them (policy.rs tests that), this test is the
                // fault-around's alone.
                .trend_prefetch(false)
                .build()
                .unwrap();
            let mut region = swap.map(PAGES * PAGE_SIZE).unwrap();
            let s = region.as_mut_slice();
            // The first WIDE_FROM pages, then the rest, each part in an
            // order whose stride is coprime with its length: every page
            // once, never two neighbours in a row.
            let first = (0..WIDE_FROM).map(|k| (k * 97) % WIDE_FROM);
            let rest = (0..PAGES - WIDE_FROM).map(|k| WIDE_FROM + (k * 97) % (PAGES - WIDE_FROM));
            for (k, p) in first.chain(rest).enumerate() {
                if k == WIDE_FROM - 1 {
                    // A small process fills ahead as it would with the
                    // setting off (the next touch holds WIDE_FROM pages
                    // with its own): only where its faults come in order.
                    let c = swap.stats().counters;
                    assert!(c.zero_fills * 4 > 3 * k as u64, "{what}: {c:?}");
                }
                let page = &mut s[p * PAGE_SIZE..(p + 1) * PAGE_SIZE];
                assert!(page.iter().all(|&b| b == 0), "{what}: page {p} not fresh");
                page[p % PAGE_SIZE] = (p % 251) as u8 + 1;
            }
            for (p, page) in region.as_slice().chunks(PAGE_SIZE).enumerate() {
                assert_eq!(page[p % PAGE_SIZE], (p % 251) as u8 + 1, "{what}: page {p}");
            }
            let st = swap.stats();
            let c = &st.counters;
            assert_eq!(c.zero_fills + c.fault_around, PAGES as u64, "{what}: {c:?}");
            assert_eq!(swap.resident_pages(), PAGES, "{what}");
            if wide {
                // Past WIDE_FROM, a fault for every four pages at most.
                let past = c.zero_fills - WIDE_FROM as u64;
                assert!(past * 4 < (PAGES - WIDE_FROM) as u64, "{what}: {c:?}");
            } else {
                assert!(c.zero_fills * 4 > 3 * PAGES as u64, "{what}: {c:?}");
            }
        }
    }
}

// A program that locks its future memory (`mlockall(MCL_FUTURE)`, as a
// latency-minded service does at start) and then makes an instance: the
// instance's own mappings (staging frames, bounce frames, the store) come
// locked, and a locked staging frame can neither take a page
// (`UFFDIO_MOVE` wants both sides locked or neither: `EINVAL`) nor be
// emptied (`MADV_DONTNEED` refuses a locked range).

fn locked_future_scenario(arg: &str) {
    let flags = if arg.contains("onfault") {
        libc::MCL_FUTURE | libc::MCL_ONFAULT
    } else {
        libc::MCL_FUTURE
    };
    // SAFETY: changes how this child's later mappings are made.
    let locked = unsafe { libc::mlockall(flags) };
    assert_eq!(locked, 0, "{}", std::io::Error::last_os_error());
    let mode = mode_from(arg);
    let swap = Swap::builder()
        .budget(4 * MIB)
        .device(SwapDeviceSpec::compressed(crate::io::CompressedOptions::new(
            64 * MIB,
        )))
        .fault_mode(mode)
        .build()
        .unwrap();
    let region = swap.map((32 * MIB) as usize).unwrap();
    let pages = region.len() / PAGE_SIZE;
    write_pages(region.as_ptr(), 0..pages);
    assert_eq!(check_pages(region.as_ptr(), 0..pages), None);
    let st = swap.stats().counters;
    eprintln!("{arg}: {st:?}");
    assert!(
        st.evictions > pages as u64 / 2,
        "{arg}: {} evictions",
        st.evictions
    );
    assert_eq!(st.unevictable, 0, "{arg}");
    assert!(swap.resident_pages() <= swap.budget_pages() + 64, "{arg}");
    drop(region);
    assert_all_returned(&swap, arg);
}

#[test]
fn an_instance_made_under_mlockall_future_pages() {
    if let Some(arg) = child::scenario() {
        locked_future_scenario(&arg);
        child::exit(0);
    }
    for mode in both_modes() {
        for lock in ["future", "future-onfault"] {
            let arg = format!("{lock}-{}", mode_name(mode));
            let out = child::run(
                "pager::tests::memory::an_instance_made_under_mlockall_future_pages",
                &arg,
                Duration::from_secs(60),
            );
            assert!(out.code == Some(0), "{arg}: {out:?}");
        }
    }
}
