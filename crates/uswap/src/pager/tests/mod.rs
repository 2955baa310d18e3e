//! The pager end to end, against the running kernel (root: userfaultfd).

use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering as AtOrd};

use super::instance::page::{self, Kind, PageWord};
use super::*;
use crate::io::FileOptions;
use crate::PAGE_SIZE;
use support::*;

mod child;
mod compressed;
mod encrypted;
mod fork;
mod injected;
mod limits;
mod memory;
mod policy;
mod races;
mod remote;
mod signals;
mod soak;
mod support;

const MIB: u64 = 1 << 20;

/// 4 threads write patterns over a region four times the budget, then
/// every byte is checked; then the region is dropped and every slot must
/// come back.
fn integrity(swap: Swap, region_bytes: usize) {
    let mut region = swap.map(region_bytes).unwrap();
    let pages = region.len() / PAGE_SIZE;
    fill(&mut region, 1);
    let st = swap.stats();
    assert!(st.counters.evictions > pages as u64 / 2, "{:?}", st.counters);
    verify(&region, 1);
    let st = swap.stats();
    // Read back by faults, or ahead of them.
    assert!(
        st.counters.swapins + st.counters.readahead > pages as u64 / 2,
        "{:?}",
        st.counters
    );
    assert!(st.counters.swapin_errors == 0 && st.counters.swapout_errors == 0);
    // Resident stays near the budget (faults overrun it only while
    // nothing is evictable).
    assert!(
        swap.resident_pages() <= swap.budget_pages() + 64,
        "{} > {}",
        swap.resident_pages(),
        swap.budget_pages()
    );
    drop(region);
    assert_all_returned(&swap, "");
}

#[test]
fn integrity_ram_sigbus_mode() {
    let swap = ram_swap(4 * MIB, 64 * MIB, FaultMode::Sigbus);
    assert_eq!(swap.fault_mode(), FaultMode::Sigbus);
    integrity(swap, (16 * MIB) as usize);
}

#[test]
fn integrity_ram_handler_thread_mode() {
    let swap = Swap::builder()
        .budget(4 * MIB)
        .device(SwapDeviceSpec::ram(64 * MIB))
        .fault_mode(FaultMode::HandlerThread)
        .handler_threads(2)
        .build()
        .unwrap();
    integrity(swap, (16 * MIB) as usize);
}

#[test]
fn integrity_file_backend() {
    for mode in [FaultMode::Sigbus, FaultMode::HandlerThread] {
        let dir = tempfile::tempdir().unwrap();
        integrity(swap_64m(4 * MIB, Some(&dir), mode), (16 * MIB) as usize);
    }
}

#[test]
fn never_written_pages_are_zero_without_io_or_slots() {
    let swap = ram_swap(MIB, 16 * MIB, FaultMode::Sigbus);
    let region = swap.map((8 * MIB) as usize).unwrap();
    assert!(region.as_slice().iter().all(|&b| b == 0));
    let st = swap.stats();
    // Each page zero-filled once: by its own fault, or around another's.
    assert_eq!(
        st.counters.zero_fills + st.counters.fault_around,
        8 * MIB / PAGE_SIZE as u64,
        "{:?}",
        st.counters
    );
    assert!(st.counters.fault_around > 0, "a sequential read faults around");
    assert!(st.counters.evictions > 0);
    assert_eq!(
        st.counters.evict_write + st.counters.swapins,
        0,
        "no IO for zero pages"
    );
    swap.swap_space().drain_slot_caches();
    assert_eq!(swap.free_slots(), swap.total_slots(), "no slot for zero pages");
}

/// Pages written full of zeros leave without IO or a slot and come back
/// as zero fills; pages with data beside them are written and read as
/// ever.
#[test]
fn written_zero_pages_are_dropped_without_io() {
    let swap = ram_swap(MIB, 16 * MIB, FaultMode::Sigbus);
    let mut region = swap.map((8 * MIB) as usize).unwrap();
    let pages = region.len() / PAGE_SIZE;
    let data = |i: usize| if i.is_multiple_of(2) { 0 } else { (i as u8) | 1 };
    for (i, page) in region.as_mut_slice().chunks_mut(PAGE_SIZE).enumerate() {
        page.fill(data(i));
    }
    let st = swap.stats();
    assert!(st.counters.evict_zero > pages as u64 / 4, "{:?}", st.counters);
    assert!(
        st.counters.io_write_pages <= pages as u64 / 2,
        "only pages with data are written: {:?}",
        st.counters
    );
    for (i, page) in region.as_slice().chunks(PAGE_SIZE).enumerate() {
        assert!(page.iter().all(|&b| b == data(i)), "page {i}");
    }
    let st = swap.stats();
    assert!(st.counters.io_read_pages <= pages as u64 / 2, "{:?}", st.counters);
    assert!(
        st.counters.zero_fills + st.counters.fault_around >= pages as u64 + st.counters.evict_zero / 2,
        "{:?}",
        st.counters
    );
    drop(region);
    assert_all_returned(&swap, "zero pages");
}

/// Writers increment per-page counters while a tight budget keeps the
/// reclaimer evicting the same pages: no increment may be lost.
#[test]
fn no_write_is_lost_to_eviction() {
    let dir = tempfile::tempdir().unwrap();
    for (mode, file) in MODES_AND_DEVICES {
        let what = format!("{mode:?} file {file}");
        let swap = Swap::builder()
            .budget(256 * 1024)
            .device(ram_or_file(file, &dir, &format!("lost-{mode:?}")))
            .fault_mode(mode)
            .build()
            .unwrap();
        let mut region = swap.map((2 * MIB) as usize).unwrap();
        let pages = region.len() / PAGE_SIZE;
        hammer_counters(&mut region, 20, &what);
        let st = swap.stats();
        assert!(st.counters.evictions > pages as u64, "{what}: {:?}", st.counters);
        assert!(st.counters.wp_faults > 0, "{what}");
    }
}

/// Swap-in readahead: reading a swapped-out region in order reads pages
/// ahead (fewer faults than pages), every byte comes back, and switched
/// off it reads none.  Two regions side by side: the walk of the first
/// runs into its end (and, where the second follows it in memory, on
/// into that one's pages, which is as good a read), both verify.
#[test]
fn readahead_reads_ahead_in_order_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    for (mode, file) in MODES_AND_DEVICES {
        for on in [true, false] {
            let device = ram_or_file(file, &dir, &format!("{mode:?}-{on}"));
            let swap = Swap::builder()
                .budget(MIB)
                .device(device)
                .fault_mode(mode)
                .readahead(on)
                .build()
                .unwrap();
            let mut a = swap.map((4 * MIB) as usize).unwrap();
            let mut b = swap.map((4 * MIB) as usize).unwrap();
            fill(&mut a, 11);
            fill(&mut b, 12);
            let before = swap.stats();
            verify(&a, 11);
            verify(&b, 12);
            let st = swap.stats().since(&before);
            let pages = (a.len() + b.len()) / PAGE_SIZE;
            let (ra, faults) = (st.counters.readahead, st.counters.faults);
            if on && mode == FaultMode::Sigbus {
                // Each verifying thread's walk is its own stream.
                assert!(ra > pages as u64 / 4, "{mode:?}: {ra} read ahead of {pages}");
                if file {
                    // Part of it by the prefetcher, while the walk went on.
                    assert!(st.counters.prefetched > 0, "{mode:?}: {:?}", st.counters);
                }
                assert!(
                    faults < pages as u64 * 3 / 4,
                    "{mode:?}: {faults} faults for {pages} pages"
                );
            } else if on {
                // One handler thread sees the four walks interleaved, and
                // the window follows one stream per serving thread.
                assert!(ra > 0, "{mode:?}: nothing read ahead");
            } else {
                assert_eq!(ra, 0, "{mode:?}: readahead off");
            }
            drop((a, b));
            assert_all_returned(&swap, &format!("{mode:?} readahead {on}"));
        }
    }
}

/// `Region::discard` (MADV_DONTNEED for a region): the pages in the range
/// read as zeros afterwards whatever they were (resident, staged, swapped
/// out, never written), their slots and frames go back, and every other
/// page keeps its data; in both modes, on RAM and on a swap file.  Then a
/// `map_huge` region's unit, and ranges that are refused.
#[test]
fn discard_zeros_pages_wherever_they_are() {
    let dir = tempfile::tempdir().unwrap();
    for (mode, file) in MODES_AND_DEVICES {
        let device = ram_or_file(file, &dir, &format!("discard-{mode:?}"));
        let swap = Swap::builder()
            .budget(MIB)
            .device(device)
            .fault_mode(mode)
            .build()
            .unwrap();
        let mut region = swap.map((4 * MIB) as usize).unwrap();
        fill(&mut region, 21);
        let pages = region.len() / PAGE_SIZE;
        // Pages of every state: the oldest are written out, the youngest
        // resident, some staged between.
        let kinds = |r: &Region| {
            (0..pages).fold([0usize; 3], |mut k, p| {
                k[if r.is_resident(p) {
                    0
                } else if r.is_staged(p) {
                    1
                } else {
                    2
                }] += 1;
                k
            })
        };
        let before = kinds(&region);
        assert!(before[0] > 0 && before[2] > 0, "{mode:?}: {before:?}");
        let (lo, hi) = (pages / 8, pages - pages / 8);
        let free_before = swap.free_slots();
        region.discard(lo * PAGE_SIZE, (hi - lo) * PAGE_SIZE).unwrap();
        assert!(
            swap.free_slots() > free_before,
            "{mode:?} file {file}: the discarded pages' slots went back"
        );
        let st = swap.stats();
        assert!(st.counters.discarded >= (hi - lo) as u64 / 2, "{:?}", st.counters);
        for p in 0..pages {
            let page = &region.as_slice()[p * PAGE_SIZE..(p + 1) * PAGE_SIZE];
            if (lo..hi).contains(&p) {
                assert!(
                    page.iter().all(|&b| b == 0),
                    "{mode:?}: discarded page {p} reads {:#x}",
                    page[0]
                );
            } else {
                for (at, &b) in page.iter().enumerate() {
                    assert_eq!(b, fill_byte(p, at, 21), "{mode:?}: kept page {p} byte {at}");
                }
            }
        }
        // Discarded pages are never-written pages: reading them took no IO.
        drop(region);
        assert_all_returned(&swap, &format!("{mode:?} file {file}: discard"));
        // Not whole pages, or past the end: refused, nothing changed.
        let region = swap.map((2 * MIB) as usize).unwrap();
        for (off, len) in [(1, PAGE_SIZE), (0, PAGE_SIZE + 1), (0, 3 * MIB as usize)] {
            let e = region.discard(off, len).unwrap_err();
            assert!(matches!(e, PagerError::Range { .. }), "{e}");
        }
    }
    // A 2 MB unit, in and out.
    let swap = ram_swap(4 * MIB, 64 * MIB, FaultMode::Sigbus);
    let mut region = swap.map_huge((16 * MIB) as usize).unwrap();
    fill(&mut region, 22);
    let unit = page::UNIT_BYTES;
    assert!(region.discard(PAGE_SIZE, unit).is_err(), "part of a unit");
    for u in 0..region.len() / unit {
        region.discard(u * unit, unit).unwrap();
    }
    assert!(region.as_slice().iter().step_by(509).all(|&b| b == 0));
    drop(region);
    assert_all_returned(&swap, "huge discard");
}

/// Writers racing readahead: each thread walks its quarter in order,
/// reading a page and then writing it (so it comes in clean, often read
/// ahead, and the write is a write-protect fault), while the reclaimer
/// evicts; no increment is lost, in either mode.
#[test]
fn writes_racing_readahead_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    for (mode, file) in MODES_AND_DEVICES {
        // Readahead from a file goes in clean, some of it through the
        // prefetcher thread, racing the writers' write-protect faults.
        let device = ram_or_file(file, &dir, &format!("{mode:?}"));
        let swap = Swap::builder()
            .budget(2 * MIB)
            .device(device)
            .fault_mode(mode)
            .build()
            .unwrap();
        let mut region = swap.map((8 * MIB) as usize).unwrap();
        hammer_counters(&mut region, 12, &format!("{mode:?} file={file} readahead"));
        assert!(
            swap.stats().counters.readahead > 0,
            "{mode:?}: nothing read ahead"
        );
        drop(region);
        assert_all_returned(&swap, &format!("{mode:?}"));
    }
}

/// In handler-thread mode a fault raised inside the kernel is served too:
/// `read(2)` into swapped-out memory.
#[test]
fn read_syscall_into_a_swapped_out_region() {
    let swap = ram_swap(MIB, 32 * MIB, FaultMode::HandlerThread);
    let mut region = swap.map((8 * MIB) as usize).unwrap();
    // Write the region once so its pages are swapped out, not just missing.
    region.as_mut_slice().fill(0xEE);
    let (_dir, f, data) = pattern_file(region.len(), 7);
    let mut done = 0;
    while done < region.len() {
        let n = f
            .read_at(&mut region.as_mut_slice()[done..], done as u64)
            .unwrap();
        assert!(n > 0);
        done += n;
    }
    assert!(region.as_slice() == &data[..], "read(2) data landed intact");
}

/// In SIGBUS mode the kernel's own store into a swapped-out (or clean,
/// write-protected) page fails the system call with EFAULT; pinned
/// (`Region::pin`), the same `pread(2)`s land, chunk by chunk, and every
/// byte reads back.  The unpinned call's EFAULT is checked first, so that
/// the test shows what the pin is for.
#[test]
fn pinned_pages_take_the_kernels_stores_in_sigbus_mode() {
    use std::os::fd::AsRawFd;
    let swap = ram_swap(MIB, 32 * MIB, FaultMode::Sigbus);
    let mut region = swap.map((8 * MIB) as usize).unwrap();
    region.as_mut_slice().fill(0xEE);
    let (dir, f, data) = pattern_file(region.len(), 9);
    // Page 0 went out long ago (the budget is an eighth).
    assert!(!region.is_resident(0));
    let base = region.as_ptr();
    // SAFETY: pread into the region's first page, which is not resident;
    // no Rust reference to it is alive.
    let n = unsafe { libc::pread(f.as_raw_fd(), base.cast(), PAGE_SIZE, 0) };
    assert_eq!(n, -1, "an unpinned pread into a swapped-out page");
    assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EFAULT));
    const CHUNK: usize = 64 << 10;
    for off in (0..region.len()).step_by(CHUNK) {
        let pin = region.pin(off, CHUNK, true).unwrap();
        // SAFETY: pread into pinned pages of the region; no Rust
        // reference to them is alive.
        let n = unsafe { libc::pread(f.as_raw_fd(), base.add(off).cast(), CHUNK, off as i64) };
        assert_eq!(
            n,
            CHUNK as isize,
            "pinned pread at {off}: {}",
            std::io::Error::last_os_error()
        );
        drop(pin);
    }
    assert!(region.as_slice() == &data[..], "every pinned read landed");
    // And the other way: write(2) from pinned pages that had gone out.
    let out = dir.path().join("out");
    let g = std::fs::File::create(&out).unwrap();
    for off in (0..region.len()).step_by(CHUNK) {
        let pin = region.pin(off, CHUNK, false).unwrap();
        g.write_all_at(&region.as_slice()[off..off + CHUNK], off as u64)
            .unwrap();
        drop(pin);
    }
    assert!(std::fs::read(&out).unwrap() == data);
    assert!(matches!(
        region.pin(region.len(), 1, false),
        Err(PagerError::Range { .. })
    ));
    drop(region);
    assert_all_returned(&swap, "pin");
}

/// `stop_paging` in SIGBUS mode while another thread keeps writing the
/// region and the reclaimer keeps taking its pages out: after it, every
/// page holds what was written last, nothing more goes out however much
/// is written, and the kernel's own stores land unpinned, into pages
/// that had gone out and into pages never written, where before the
/// same `pread(2)` failed with EFAULT (a program's io_uring, whose
/// workers store into its buffers later, is what it is for).
#[test]
fn stopped_paging_leaves_every_page_to_the_kernel() {
    use std::os::fd::AsRawFd;
    let swap = ram_swap(MIB, 64 * MIB, FaultMode::Sigbus);
    let len = (16 * MIB) as usize;
    let written = len / 2;
    let region = swap.map(len).unwrap();
    let base = region.as_ptr() as usize;
    let (_dir, f, data) = pattern_file(written, 7);
    // SAFETY: pread into a page of the region never written; no Rust
    // reference to the region's memory is alive while this test runs.
    let n = unsafe { libc::pread(f.as_raw_fd(), (base + written) as *mut libc::c_void, PAGE_SIZE, 0) };
    assert_eq!(n, -1, "an unpinned pread into a page never written");
    assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EFAULT));
    let pages = written / PAGE_SIZE;
    let stamp = |round: u64, p: usize| round << 32 | p as u64;
    let stop = AtomicBool::new(false);
    let rounds = std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let mut round = 0u64;
            // At least three rounds before the stop and one after.
            while round < 3 || !stop.load(AtOrd::Acquire) {
                for p in 0..pages {
                    // SAFETY: the region's pages, written by this thread
                    // alone while the scope lives.
                    unsafe { ((base + p * PAGE_SIZE) as *mut u64).write_volatile(stamp(round, p)) };
                }
                round += 1;
            }
            for p in 0..pages {
                // SAFETY: as above.
                unsafe { ((base + p * PAGE_SIZE) as *mut u64).write_volatile(stamp(round, p)) };
            }
            round
        });
        while swap.stats().counters.evictions < 2 * pages as u64 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let brought = swap.stop_paging().expect("every page brought in");
        assert!(brought > 0, "pages were out when paging stopped");
        stop.store(true, AtOrd::Release);
        writer.join().unwrap()
    });
    assert!(swap.paging_stopped());
    for p in 0..pages {
        // SAFETY: the region's pages; the writer is done.
        let v = unsafe { ((base + p * PAGE_SIZE) as *const u64).read_volatile() };
        assert_eq!(v, stamp(rounds, p), "page {p} after the stop");
    }
    let evictions = swap.stats().counters.evictions;
    // Four times the budget written again, and read through the kernel:
    // nothing goes out, and every store lands.
    for off in (0..written).step_by(64 << 10) {
        // SAFETY: pread into the region's written half, unpinned.
        let n = unsafe {
            libc::pread(
                f.as_raw_fd(),
                (base + off) as *mut libc::c_void,
                64 << 10,
                off as i64,
            )
        };
        assert_eq!(n, 64 << 10, "pread at {off}: {}", std::io::Error::last_os_error());
    }
    // SAFETY: pread into the never-written half, unpinned.
    let n = unsafe { libc::pread(f.as_raw_fd(), (base + written) as *mut libc::c_void, PAGE_SIZE, 0) };
    assert_eq!(n, PAGE_SIZE as isize, "{}", std::io::Error::last_os_error());
    assert!(
        region.as_slice()[..written] == data[..],
        "every kernel store landed"
    );
    // A pin (a system call's, `uswap run`'s) over pages never written
    // returns at once: their states no longer follow them.
    drop(region.pin(written, written, true).unwrap());
    assert!(region.as_slice()[written..written + PAGE_SIZE] == data[..PAGE_SIZE]);
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert_eq!(
        swap.stats().counters.evictions,
        evictions,
        "nothing went out after the stop"
    );
    // A hold let go (a debugger's) does not start paging again.
    swap.let_go();
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert_eq!(swap.stats().counters.evictions, evictions);
    // A region mapped now is plain memory: the kernel fills it.
    let later = swap.map(PAGE_SIZE * 16).unwrap();
    // SAFETY: pread into the new region's first page, unpinned.
    let n = unsafe { libc::pread(f.as_raw_fd(), later.as_ptr().cast(), PAGE_SIZE, 0) };
    assert_eq!(n, PAGE_SIZE as isize, "{}", std::io::Error::last_os_error());
    assert!(later.as_slice()[..PAGE_SIZE] == data[..PAGE_SIZE]);
}

/// A page read back from a compressed device comes in dirty but sealed
/// (write-protected): a pin for the kernel's store must unprotect it, or
/// the kernel's write fails with EFAULT in SIGBUS mode (Python's imports
/// under `uswap run` on zram at a small share did).
#[test]
fn a_pin_for_a_store_unseals_a_page_from_a_compressed_device() {
    use std::os::fd::AsRawFd;
    let swap = Swap::builder()
        .budget(MIB)
        .device(SwapDeviceSpec::compressed(crate::io::CompressedOptions::new(
            32 * MIB,
        )))
        .fault_mode(FaultMode::Sigbus)
        .build()
        .unwrap();
    let mut region = swap.map((8 * MIB) as usize).unwrap();
    fill(&mut region, 41);
    let (_dir, f, data) = pattern_file(region.len(), 43);
    let base = region.as_ptr();
    let mut sealed = 0;
    for off in (0..region.len()).step_by(PAGE_SIZE) {
        // A read brings the page in from the store: sealed.
        let _ = region.as_slice()[off];
        let pin = region.pin(off, PAGE_SIZE, true).unwrap();
        // SAFETY: pread into a pinned page of the region; no Rust
        // reference to it is alive.
        let n = unsafe { libc::pread(f.as_raw_fd(), base.add(off).cast(), PAGE_SIZE, off as i64) };
        assert_eq!(
            n,
            PAGE_SIZE as isize,
            "pinned pread at {off}: {}",
            std::io::Error::last_os_error()
        );
        drop(pin);
        sealed += 1;
    }
    assert!(sealed > 1000);
    assert!(region.as_slice() == &data[..], "every pinned read landed");
    drop(region);
    assert_all_returned(&swap, "sealed pin");
}

/// Pinned pages stay mapped however hard reclaim pushes: two threads fill
/// and refill the rest of a region four times the budget while the main
/// thread holds pins on a range and checks, again and again, that every
/// pinned page is mapped (`mincore`) and holds what it held; in both
/// modes.
#[test]
fn pinned_pages_are_not_evicted() {
    for mode in [FaultMode::Sigbus, FaultMode::HandlerThread] {
        let swap = ram_swap(MIB, 32 * MIB, mode);
        let mut region = swap.map((4 * MIB) as usize).unwrap();
        fill(&mut region, 31);
        let pages = region.len() / PAGE_SIZE;
        let pinned = 0..32;
        let base = region.as_ptr() as usize;
        let region = &region;
        let stop = AtomicBool::new(false);
        let mut gone = None;
        let evictions = swap.stats().counters.evictions;
        std::thread::scope(|s| {
            for t in 0..2 {
                let stop = &stop;
                s.spawn(move || {
                    let mut round = 0u8;
                    while !stop.load(AtOrd::Relaxed) {
                        for p in (32 + t..pages).step_by(2) {
                            // SAFETY: a page of the region outside the pinned
                            // range, written by this thread alone.
                            unsafe { ((base + p * PAGE_SIZE + 8) as *mut u8).write_volatile(round) };
                        }
                        round = round.wrapping_add(1);
                    }
                });
            }
            let pin = region.pin(0, pinned.len() * PAGE_SIZE, false).unwrap();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            // Failures are noted, not asserted here: the writers must be
            // stopped before the scope can end.
            while gone.is_none() && swap.stats().counters.evictions < evictions + 4 * pages as u64 {
                gone = pinned
                    .clone()
                    .find(|p| !crate::sys::page_mapped((base + p * PAGE_SIZE) as u64));
                if std::time::Instant::now() > deadline {
                    break;
                }
            }
            drop(pin);
            stop.store(true, AtOrd::Relaxed);
        });
        assert_eq!(gone, None, "{mode:?}: a pinned page went out");
        assert!(
            swap.stats().counters.evictions >= evictions + 4 * pages as u64,
            "{mode:?}: reclaim did not run while the pins were held"
        );
        for p in pinned {
            let page = &region.as_slice()[p * PAGE_SIZE..(p + 1) * PAGE_SIZE];
            for (at, &b) in page.iter().enumerate() {
                assert_eq!(b, fill_byte(p, at, 31), "{mode:?}: pinned page {p} byte {at}");
            }
        }
    }
}

/// A swap device too small for the region: pages that cannot be written
/// out stay resident (the overrun is counted), never zeros.
#[test]
fn full_swap_keeps_pages_resident() {
    // Unbounded: the bound (and the kill past it) is tested below.
    let swap = Swap::builder()
        .budget(MIB)
        .device(SwapDeviceSpec::ram(MIB))
        .max_mapped(4 * MIB)
        .overrun(crate::pager::Overrun::Unbounded)
        .build()
        .unwrap();
    let mut region = swap.map((3 * MIB) as usize).unwrap();
    for (p, page) in region.as_mut_slice().chunks_mut(PAGE_SIZE).enumerate() {
        page.fill(p as u8 | 1);
    }
    for (p, page) in region.as_slice().chunks(PAGE_SIZE).enumerate() {
        assert!(page.iter().all(|&b| b == p as u8 | 1), "page {p}");
    }
    let st = swap.stats();
    assert!(st.counters.swap_full > 0, "{:?}", st.counters);
    assert!(swap.resident_pages() > swap.budget_pages());
}

/// The budget is a promise: with the swap full, pages stay resident past
/// the budget only as far as the overrun allows (10% by default, at
/// least a unit and the slack); the access that would go further ends
/// the process with SIGKILL after one line saying why, as a memory
/// cgroup's OOM kill would.  In a child, in both fault modes, with small
/// pages and with 2 MB units.
#[test]
fn past_the_overrun_the_process_is_killed() {
    if let Some(s) = child::scenario() {
        let mode = if s.starts_with("handler") {
            FaultMode::HandlerThread
        } else {
            FaultMode::Sigbus
        };
        let swap = Swap::builder()
            .budget(8 * MIB)
            .device(SwapDeviceSpec::ram(8 * MIB))
            .fault_mode(mode)
            .max_mapped(128 * MIB)
            .build()
            .unwrap();
        let bound = swap.budget_pages() + super::instance::overrun::FLOOR_PAGES.max(swap.budget_pages() / 10);
        let mut region = if s.ends_with("huge") {
            swap.map_huge((64 * MIB) as usize).unwrap()
        } else {
            swap.map((64 * MIB) as usize).unwrap()
        };
        // 16 MiB fit (budget and swap); the bound is 2 MiB past the
        // budget: writing on must end in the kill, never past the bound.
        for (p, page) in region.as_mut_slice().chunks_mut(PAGE_SIZE).enumerate() {
            page[0] = 1;
            let r = swap.resident_pages();
            if r > bound + super::evict::reclaim::SLACK {
                eprintln!("resident {r} pages, past the bound of {bound}, at page {p}");
                child::exit(4);
            }
        }
        eprintln!("wrote 64 MiB into 8 MiB of budget and 8 MiB of swap");
        child::exit(3);
    }
    for scenario in ["sigbus", "handler", "sigbus-huge"] {
        let out = child::run(
            "pager::tests::past_the_overrun_the_process_is_killed",
            scenario,
            std::time::Duration::from_secs(60),
        );
        assert_eq!(out.signal, Some(libc::SIGKILL), "{scenario}: {out:?}");
        assert!(!out.timed_out, "{scenario}: {out:?}");
        let lines: Vec<&str> = out
            .stderr
            .lines()
            .filter(|l| l.contains("uswap: out of memory"))
            .collect();
        assert_eq!(lines.len(), 1, "{scenario}: {out:?}");
        assert!(
            lines[0].contains("killing the process") && lines[0].contains("add swap"),
            "{scenario}: {out:?}"
        );
    }
}

/// A budget changed while a region is in use: a smaller one is reached
/// (by the background reclaimer), a larger one lets the whole region
/// stay resident, no byte is lost either way, and one too small is a
/// one-line error that changes nothing.
#[test]
fn the_budget_changes_at_run_time() {
    for mode in [FaultMode::Sigbus, FaultMode::HandlerThread] {
        let swap = ram_swap(16 * MIB, 64 * MIB, mode);
        let mut region = swap.map((32 * MIB) as usize).unwrap();
        fill(&mut region, 5);
        assert_eq!(swap.budget_pages(), 4096);
        swap.set_budget(4 * MIB).unwrap();
        assert_eq!(swap.budget_pages(), 1024);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while swap.resident_pages() > 1024 {
            assert!(
                std::time::Instant::now() < deadline,
                "{mode:?}: {} pages resident",
                swap.resident_pages()
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        verify(&region, 5);
        assert!(
            swap.resident_pages() <= 1024 + 64,
            "{mode:?}: {}",
            swap.resident_pages()
        );
        let before = swap.stats().counters.evictions;
        swap.set_budget(64 * MIB).unwrap();
        // A batch the reclaimer chose under the cut may still go out: at
        // nice 19 it can be off the CPU for a whole verify while four
        // readers run (the CI saw 8 pages go after two).  One batch at
        // most, and then nothing more while the region fits.
        let mut evictions = before;
        for _ in 0..5 {
            verify(&region, 5);
            let now = swap.stats().counters.evictions;
            if now == evictions {
                break;
            }
            evictions = now;
        }
        assert!(
            evictions - before <= super::evict::batch::BATCH as u64,
            "{mode:?}: {} evictions under a larger budget",
            evictions - before
        );
        for _ in 0..3 {
            verify(&region, 5);
        }
        assert_eq!(
            swap.stats().counters.evictions,
            evictions,
            "{mode:?}: evicting under a larger budget"
        );
        assert_eq!(swap.resident_pages(), 8192);
        swap.set_budget(u64::MAX).unwrap();
        verify(&region, 5);
        swap.set_budget(64 * MIB).unwrap();
        let e = swap.set_budget(4096).unwrap_err().to_string();
        assert!(e.contains("too small") && !e.contains('\n'), "{e}");
        assert_eq!(swap.budget_pages(), 16384);
        drop(region);
        assert_all_returned(&swap, "set_budget");
    }
}

/// A reader the fault path never sees (`/proc/self/mem`, as a debugger
/// reads it; a core dump) fails on pages that are out, in both modes.
/// `hold_in` brings them all in and keeps them in, the budget held open,
/// until `let_go`: then every page reads through `/proc/self/mem` with
/// its data, and afterwards the reclaimer takes the resident set back to
/// the budget.
#[test]
fn held_in_memory_reads_through_proc_mem() {
    use std::os::unix::fs::FileExt;
    for mode in [FaultMode::Sigbus, FaultMode::HandlerThread] {
        let swap = ram_swap(4 * MIB, 64 * MIB, mode);
        let mut region = swap.map((32 * MIB) as usize).unwrap();
        fill(&mut region, 9);
        let mem = std::fs::File::open("/proc/self/mem").unwrap();
        let base = region.as_slice().as_ptr() as u64;
        let pages = region.len() / PAGE_SIZE;
        let read = |p: usize| {
            let mut b = [0u8; 8];
            mem.read_exact_at(&mut b, base + (p * PAGE_SIZE) as u64)
                .map(|_| b)
        };
        let failed = (0..pages).filter(|&p| read(p).is_err()).count();
        assert!(
            failed > pages / 2,
            "{mode:?}: only {failed} of {pages} pages failed before"
        );
        let brought = swap.hold_in(u64::MAX);
        // Staged pages were resident already (in their frames): what the
        // resident set grew by is at most what failed.
        assert!(
            brought > 0 && brought <= (failed * PAGE_SIZE) as u64,
            "{mode:?}: {brought} bytes for {failed} pages"
        );
        for p in 0..pages {
            let b = read(p).unwrap_or_else(|e| panic!("{mode:?}: page {p} after hold_in: {e}"));
            let want = region.as_slice()[p * PAGE_SIZE..p * PAGE_SIZE + 8].to_vec();
            assert_eq!(b.to_vec(), want, "{mode:?}: page {p}");
        }
        // Held: a while later, nothing went out again.
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert_eq!(swap.resident_pages(), pages, "{mode:?}: held pages went out");
        assert_eq!(swap.budget_pages(), 1024, "{mode:?}: the budget asked for");
        swap.let_go();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while swap.resident_pages() > 1024 + 64 {
            assert!(
                std::time::Instant::now() < deadline,
                "{mode:?}: {} resident after let_go",
                swap.resident_pages()
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        verify(&region, 9);
        assert_eq!(
            swap.stats().counters.brought_in as usize * PAGE_SIZE,
            brought as usize,
            "{mode:?}"
        );
        drop(region);
        assert_all_returned(&swap, "hold_in");
    }
}

#[test]
fn bad_configuration_is_refused() {
    let e = Swap::builder().build().err().unwrap();
    assert!(e.to_string().contains("no swap device"), "{e}");
    let e = Swap::builder()
        .budget(4096)
        .device(SwapDeviceSpec::ram(MIB))
        .build()
        .err()
        .unwrap();
    assert!(e.to_string().contains("too small"), "{e}");
    let swap = Swap::builder()
        .budget(MIB)
        .device(SwapDeviceSpec::ram(MIB))
        .max_mapped(MIB)
        .build()
        .unwrap();
    assert!(swap.map(0).is_err());
    let e = swap.map((2 * MIB) as usize).err().unwrap();
    assert!(matches!(e, PagerError::TooManyPages { .. }), "{e}");
    let _ = AtomicBool::new(false);
    let _ = AtomicU64::new(0).load(AtOrd::Relaxed);
}

/// A swap-in that fails poisons the page: the access gets SIGBUS, never
/// zeros.  The access kills the process, so it runs in a child: this test
/// binary re-run on just this test, with the scenario switched on.
#[test]
fn read_error_poisons_the_page() {
    if child::scenario().is_some() {
        let swap = ram_swap(MIB, 16 * MIB, FaultMode::Sigbus);
        let mut region = swap.map((4 * MIB) as usize).unwrap();
        region.as_mut_slice().fill(0x42);
        // Page 0 is long evicted by now (the budget is a quarter).
        let e = region.slot_of(0).expect("page 0 was written out");
        assert!(!region.is_resident(0));
        swap.inject_io_error(e.device() as usize, e.offset(), crate::io::IoOp::Read);
        eprintln!("touching the poisoned page");
        let v = region.as_slice()[0];
        // Not reached: SIGBUS.  Never zeros.
        eprintln!("read {v:#x} from a page whose swap-in failed");
        std::process::exit(3);
    }
    assert_poisoned_child(
        "read_error_poisons_the_page",
        "touching the poisoned page",
        PAGE_SIZE,
    );
}

/// Run test `test`'s child scenario, which prints `reached` and then
/// touches memory whose swap-in fails: it dies of SIGBUS, never reading
/// zeros, and the reason is logged, naming `bytes` bytes (a page, a unit)
/// and the errno.
fn assert_poisoned_child(test: &str, reached: &str, bytes: usize) {
    let out = child::run(
        &format!("pager::tests::{test}"),
        "poison",
        std::time::Duration::from_secs(60),
    );
    let err = &out.stderr;
    assert!(err.contains(reached), "the child did not get there: {out:?}");
    assert!(
        err.contains(&format!("uswap: swap-in of {bytes} bytes at 0x")) && err.contains("gave errno 5"),
        "{out:?}"
    );
    assert_eq!(out.signal, Some(libc::SIGBUS), "{out:?}");
}

/// A split unit's swap-in (seed 003 off: 512 single slots, read one IO
/// per segment) that fails poisons the whole unit: the access gets
/// SIGBUS, never zeros.  In a child, as above.
#[test]
fn a_split_unit_read_error_poisons_the_unit() {
    if child::scenario().is_some() {
        let swap = Swap::builder()
            .budget(4 * MIB)
            .device(SwapDeviceSpec::ram(64 * MIB))
            .switches(crate::swap_space::Switches {
                huge_cluster: false,
                ..crate::swap_space::Switches::DEFAULT
            })
            .build()
            .unwrap();
        let mut region = swap.map_huge((16 * MIB) as usize).unwrap();
        region.as_mut_slice().fill(0x42);
        let out = (0..region.len() / PAGE_SIZE)
            .step_by(page::UNIT_PAGES)
            .find(|&h| !region.is_resident(h))
            .expect("a unit went out");
        // A page in the middle of the unit's slots: the segment that
        // covers it fails.
        let e = region
            .slot_of(out + 300)
            .expect("a split unit has a slot per page");
        swap.inject_io_error(e.device() as usize, e.offset(), crate::io::IoOp::Read);
        eprintln!("touching the poisoned unit");
        let v = region.as_slice()[(out + 5) * PAGE_SIZE];
        eprintln!("read {v:#x} from a unit whose swap-in failed");
        std::process::exit(3);
    }
    assert_poisoned_child(
        "a_split_unit_read_error_poisons_the_unit",
        "touching the poisoned unit",
        page::UNIT_BYTES,
    );
}

/// A failed swap-out keeps the page resident (its data intact) and the
/// slot out of use for good (a bad slot is never handed out again).
#[test]
fn write_error_keeps_the_page_and_retires_the_slot() {
    let swap = ram_swap(MIB, 16 * MIB, FaultMode::Sigbus);
    let mut region = swap.map((4 * MIB) as usize).unwrap();
    swap.inject_io_error(0, crate::io::ANY_SLOT, crate::io::IoOp::Write);
    for (p, page) in region.as_mut_slice().chunks_mut(PAGE_SIZE).enumerate() {
        page.fill(p as u8 ^ 0x5a);
    }
    for (p, page) in region.as_slice().chunks(PAGE_SIZE).enumerate() {
        assert!(
            page.iter().all(|&b| b == p as u8 ^ 0x5a),
            "page {p} lost its data"
        );
    }
    let st = swap.stats();
    assert_eq!(st.counters.swapout_errors, 1, "{:?}", st.counters);
    // The failed call; when it was a run, the bad page fails each retry
    // that covers it until it is written alone.
    assert!(
        (1..=3).contains(&st.counters.io_write_errors),
        "{:?}",
        st.counters
    );
    drop(region);
    assert_all_returned_but(&swap, 1, "the failed slot stays retired");
}

/// A working set just over the budget: most evictions are caught while the
/// page is still staged, and come back from the swap cache with no IO,
/// activated on the LRU (the fault stream is how the LRU learns).
#[test]
fn touches_of_staged_pages_hit_the_swap_cache() {
    for mode in [FaultMode::Sigbus, FaultMode::HandlerThread] {
        let swap = ram_swap(MIB, 16 * MIB, mode);
        // 256 pages of budget, 300 pages of working set.
        let mut region = swap.map(300 * PAGE_SIZE).unwrap();
        for (p, page) in region.as_mut_slice().chunks_mut(PAGE_SIZE).enumerate() {
            page.fill(p as u8);
        }
        let mut rng = 0x1234_5678u64;
        for _ in 0..20_000 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let p = (rng % 300) as usize;
            let page = &mut region.as_mut_slice()[p * PAGE_SIZE..(p + 1) * PAGE_SIZE];
            assert_eq!(
                page[(rng >> 20) as usize % PAGE_SIZE],
                p as u8,
                "{mode:?}: page {p}"
            );
            page[0] = p as u8;
        }
        let st = swap.stats();
        assert!(st.counters.swapcache_hits > 100, "{mode:?}: {:?}", st.counters);
        assert!(st.counters.lru_activate > 0, "{mode:?}");
        drop(region);
        assert_all_returned(&swap, &format!("{mode:?}"));
    }
}

/// Many threads, many regions, one budget: each thread maps its own
/// regions, writes and rewrites random pages, checks every read against its
/// own copy, and unmaps and remaps, while all compete for one budget and
/// one swap space.  At the end every slot must be back and nothing resident.
#[test]
fn stress_many_threads_and_regions() {
    for mode in [FaultMode::Sigbus, FaultMode::HandlerThread] {
        let swap = Swap::builder()
            .budget(2 * MIB)
            .device(SwapDeviceSpec::ram(32 * MIB).priority(1))
            .device(SwapDeviceSpec::ram(32 * MIB).priority(1))
            .fault_mode(mode)
            .handler_threads(2)
            .build()
            .unwrap();
        std::thread::scope(|s| {
            for t in 0..8u64 {
                let swap = &swap;
                s.spawn(move || {
                    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (t + 1);
                    let mut next = move || {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        rng
                    };
                    for _ in 0..3 {
                        let pages = 128 + (next() % 256) as usize;
                        let mut region = swap.map(pages * PAGE_SIZE).unwrap();
                        // Our own copy of one word per page: what it must read.
                        let mut model = vec![0u64; pages];
                        for _ in 0..pages * 6 {
                            let p = (next() % pages as u64) as usize;
                            let at = p * PAGE_SIZE + 8 * (p % 500);
                            let word = &mut region.as_mut_slice()[at..at + 8];
                            let now = u64::from_ne_bytes(word.try_into().unwrap());
                            assert_eq!(now, model[p], "{mode:?} thread {t} page {p}");
                            if next() % 3 != 0 {
                                model[p] = next();
                                word.copy_from_slice(&model[p].to_ne_bytes());
                            }
                        }
                        for (p, want) in model.iter().enumerate() {
                            let at = p * PAGE_SIZE + 8 * (p % 500);
                            let got = u64::from_ne_bytes(region.as_slice()[at..at + 8].try_into().unwrap());
                            assert_eq!(got, *want, "{mode:?} thread {t} page {p} at the end");
                        }
                    }
                });
            }
        });
        let st = swap.stats();
        assert!(
            st.counters.evictions > 1000 && st.counters.swapins > 100,
            "{mode:?}: {:?}",
            st.counters
        );
        assert_all_returned(&swap, &format!("{mode:?}"));
    }
}

/// Dropping the `Swap` handle while a region lives keeps the instance (and
/// its userfaultfd: closing it would turn evicted pages into zeros) alive
/// for the region; the instance's threads go when the last region does.
#[test]
fn regions_outlive_the_swap_handle() {
    // Thread counts are process-wide: run alone, in a child process, so
    // other tests' handler threads cannot interfere.
    if std::env::var_os("USWAP_OUTLIVE_CHILD").is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "pager::tests::regions_outlive_the_swap_handle",
                "--test-threads=1",
            ])
            .env("USWAP_OUTLIVE_CHILD", "1")
            .output()
            .unwrap();
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("1 passed"),
            "child: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    fn uswap_threads() -> usize {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|c| c.trim() == "uswap-fault")
            .count()
    }
    let before = uswap_threads();
    let swap = Swap::builder()
        .budget(MIB)
        .device(SwapDeviceSpec::ram(16 * MIB))
        .fault_mode(FaultMode::HandlerThread)
        .handler_threads(3)
        .build()
        .unwrap();
    let mut region = swap.map((4 * MIB) as usize).unwrap();
    for (p, page) in region.as_mut_slice().chunks_mut(PAGE_SIZE).enumerate() {
        page.fill(p as u8 ^ 0x3c);
    }
    drop(swap);
    // Evicted pages still come back: the descriptor is alive.
    for (p, page) in region.as_slice().chunks(PAGE_SIZE).enumerate() {
        assert!(page.iter().all(|&b| b == p as u8 ^ 0x3c), "page {p}");
    }
    assert!(
        uswap_threads() >= before + 3,
        "handler threads serve the orphaned region"
    );
    drop(region);
    // The handler threads notice within a poll interval (50 ms).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while uswap_threads() > before && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(
        uswap_threads() <= before,
        "handler threads outlived their instance"
    );
}

/// 2 MB units: a region four times the budget, written and verified from 4
/// threads, moved out and in whole, one cluster and one IO per unit; with
/// the seed's switch off, every unit falls back to 512 single slots.
fn huge_integrity(swap: Swap, expect_fallback: bool) {
    let mut region = swap.map_huge((32 * MIB) as usize).unwrap();
    assert_eq!(region.as_ptr() as usize % (2 << 20), 0, "units are 2 MB aligned");
    fill(&mut region, 3);
    verify(&region, 3);
    let st = swap.stats();
    assert!(
        st.counters.huge_swapouts > 8 && st.counters.huge_swapins > 4,
        "{:?}",
        st.counters
    );
    if expect_fallback {
        // Every unit went out split (the background reclaimer may be in
        // the middle of one more).
        assert!(
            st.counters.huge_fallbacks >= st.counters.huge_swapouts,
            "{:?}",
            st.counters
        );
        assert_eq!(st.counters.huge_alloc, 0);
        // Split over single slots, a unit still goes as one folio: one IO
        // per segment of neighbouring slots (the per-CPU slot cache hands
        // out neighbours), not one per page, both ways.
        let c = &st.counters;
        for (ios, pages) in [(c.io_writes, c.io_write_pages), (c.io_reads, c.io_read_pages)] {
            assert!(
                ios * 32 < pages,
                "{ios}: {} for {} pages: {:?}",
                ios,
                pages,
                st.counters
            );
        }
    } else {
        assert_eq!(st.counters.huge_fallbacks, 0, "{:?}", st.counters);
        assert!(st.counters.huge_alloc > 8);
        // Whole clusters: one 2 MB IO a unit, each way.
        let c = &st.counters;
        for (ios, pages) in [(c.io_writes, c.io_write_pages), (c.io_reads, c.io_read_pages)] {
            assert_eq!(ios * 512, pages, "{ios}: {:?}", st.counters);
        }
    }
    // Four threads may each install a unit on the same look at the budget,
    // so the last faults can leave it up to three units over; the
    // background reclaimer then brings it back to within one unit.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while swap.resident_pages() > swap.budget_pages() + 512 {
        assert!(
            std::time::Instant::now() < deadline,
            "resident {} pages, budget {}: not reclaimed",
            swap.resident_pages(),
            swap.budget_pages()
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    drop(region);
    assert_all_returned(&swap, "");
}

#[test]
fn huge_units_on_ram() {
    for mode in [FaultMode::Sigbus, FaultMode::HandlerThread] {
        huge_integrity(swap_64m(8 * MIB, None, mode), false);
    }
}

#[test]
fn huge_units_fall_back_to_single_slots() {
    let swap = Swap::builder()
        .budget(8 * MIB)
        .device(SwapDeviceSpec::ram(64 * MIB))
        .switches(crate::swap_space::Switches {
            huge_cluster: false,
            ..crate::swap_space::Switches::DEFAULT
        })
        .build()
        .unwrap();
    huge_integrity(swap, true);
}

#[test]
fn huge_units_on_a_file() {
    for mode in [FaultMode::Sigbus, FaultMode::HandlerThread] {
        let dir = tempfile::tempdir().unwrap();
        huge_integrity(swap_64m(8 * MIB, Some(&dir), mode), false);
    }
}

/// When `UFFDIO_MOVE` refuses pages (`EBUSY`, as for pinned ones, injected
/// for the first 3000 tries: a run refused whole is tried again with its
/// first page alone, so at least 1500 pages), they stay resident and
/// counted, writers keep
/// hammering them meanwhile and no write is lost, in either fault mode;
/// once the refusals stop, eviction goes on.
#[test]
fn refused_moves_keep_pages_resident() {
    for mode in [FaultMode::Sigbus, FaultMode::HandlerThread] {
        let swap = ram_swap(256 * 1024, 16 * MIB, mode);
        swap.inner.inject().move_out.2.store(libc::EBUSY, AtOrd::Relaxed);
        swap.inner.inject().move_out.0.store(3000, AtOrd::Relaxed);
        let mut region = swap.map((2 * MIB) as usize).unwrap();
        hammer_counters(&mut region, 10, &format!("{mode:?}"));
        let st = swap.stats();
        assert!(st.counters.unevictable >= 1500, "{mode:?}: {:?}", st.counters);
        assert!(
            st.counters.staged > 100,
            "{mode:?}: eviction went on: {:?}",
            st.counters
        );
        drop(region);
        assert_all_returned(&swap, &format!("{mode:?}"));
    }
}

/// Many threads fault on the same pages at once (each page swapped out,
/// then read by 8 threads in the same order): one serves each fault, the
/// others wait or find it served; every thread reads the right bytes.
#[test]
fn many_threads_fault_on_one_page() {
    for mode in [FaultMode::Sigbus, FaultMode::HandlerThread] {
        for huge in [false, true] {
            let swap = ram_swap(4 * MIB, 64 * MIB, mode);
            let mut region = if huge {
                swap.map_huge((16 * MIB) as usize)
            } else {
                swap.map((16 * MIB) as usize)
            }
            .unwrap();
            for (p, page) in region.as_mut_slice().chunks_mut(PAGE_SIZE).enumerate() {
                page[7] = p as u8 | 1;
                page[4000] = (p >> 8) as u8;
            }
            let region = &region;
            let barrier = std::sync::Barrier::new(8);
            std::thread::scope(|s| {
                for _ in 0..8 {
                    let barrier = &barrier;
                    s.spawn(move || {
                        barrier.wait();
                        for (p, page) in region.as_slice().chunks(PAGE_SIZE).enumerate() {
                            assert_eq!(
                                (page[7], page[4000]),
                                (p as u8 | 1, (p >> 8) as u8),
                                "{mode:?} huge={huge}: page {p}"
                            );
                        }
                    });
                }
            });
            let st = swap.stats();
            let ins = st.counters.swapins
                + st.counters.readahead
                + st.counters.huge_swapins * 512
                + st.counters.swapcache_hits;
            assert!(ins > 1000, "{mode:?} huge={huge}: {:?}", st.counters);
        }
    }
}

/// Any configuration the builder takes (sizes 0, 1, unaligned, up to 64
/// GiB; budgets smaller than a batch; devices of every kind, compressed
/// ones with a zero limit or a bad level) is an instance or an error of
/// one line, never a panic; and any region size asked of an instance
/// (0, 1, unaligned, more than it may map) the same.
mod bad_input {
    use super::*;
    use proptest::prelude::*;

    fn size() -> impl Strategy<Value = u64> {
        prop_oneof![
            Just(0u64),
            Just(1),
            Just(4095),
            Just(4097),
            0u64..(64 * MIB),
            (0u64..16).prop_map(|s| 1u64 << (20 + s)),
        ]
    }

    /// Mostly sizes that work, now and then one that should not.
    fn mostly(lo: u64, hi: u64) -> impl Strategy<Value = u64> {
        prop_oneof![1 => size(), 3 => lo..hi]
    }

    fn device(dir: std::path::PathBuf) -> impl Strategy<Value = SwapDeviceSpec> {
        (
            0..4u8,
            mostly(MIB, 64 * MIB),
            mostly(MIB, 64 * MIB),
            -30i32..30,
            any::<u16>(),
        )
            .prop_map(move |(kind, a, b, level, n)| {
                let file = || FileOptions::new(dir.join(format!("f{n}")), b / PAGE_SIZE as u64);
                let codec = if level == 0 {
                    crate::io::Codec::Lz4
                } else {
                    crate::io::Codec::Zstd { level }
                };
                match kind {
                    0 => SwapDeviceSpec::ram(a),
                    1 => SwapDeviceSpec::file(file()),
                    2 => SwapDeviceSpec::compressed(crate::io::CompressedOptions::new(a).codec(codec)),
                    _ => SwapDeviceSpec::compressed(
                        crate::io::CompressedOptions::new(a).codec(codec).file(file()),
                    ),
                }
            })
    }

    /// The address space this process has mapped now, bytes.
    fn vm_size() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let kb = status
            .lines()
            .find_map(|l| l.strip_prefix("VmSize:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap();
        kb << 10
    }

    /// Under `RLIMIT_AS` a little above what the process uses, large
    /// devices, metadata and regions are refused in one line each, never
    /// an abort; with `RLIMIT_MEMLOCK` at 0 an encrypted file device still
    /// works (its key page is locked where the limit allows); more
    /// regions than uswap's table holds are refused in one line.  In a
    /// child: the limits are the process's.
    #[test]
    fn limits_are_errors_not_aborts() {
        if child::scenario().is_some() {
            let one_line = |what: &str, e: &dyn std::fmt::Display| {
                let m = e.to_string();
                assert!(!m.is_empty() && !m.contains('\n'), "{what}: {m}");
                eprintln!("{what}: {m}");
            };
            // RLIMIT_MEMLOCK 0 first (it only loosens nothing).
            let zero = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: setrlimit reads the struct.
            assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &zero) }, 0);
            let dir = tempfile::tempdir().unwrap();
            {
                let swap = Swap::builder()
                    .budget(MIB)
                    .device(SwapDeviceSpec::file(FileOptions::new(dir.path().join("s"), 2048)))
                    .build()
                    .unwrap();
                let mut r = swap.map((4 * MIB) as usize).unwrap();
                fill(&mut r, 9);
                verify(&r, 9);
            }
            // More regions than the table holds.
            {
                let swap = ram_swap(MIB, 4 * MIB, FaultMode::Sigbus);
                let mut regions = Vec::new();
                let e = loop {
                    match swap.map(PAGE_SIZE) {
                        Ok(r) => regions.push(r),
                        Err(e) => break e,
                    }
                    assert!(regions.len() <= crate::pager::MAX_REGIONS, "no limit on regions");
                };
                one_line("regions", &e);
            }
            let limit = vm_size() + 256 * MIB;
            let lim = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            // SAFETY: as above.
            assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &lim) }, 0);
            let tb = 1u64 << 40;
            let tries: [(&str, crate::pager::SwapBuilder); 4] = [
                (
                    "a RAM device of 1 TiB",
                    Swap::builder().device(SwapDeviceSpec::ram(tb)),
                ),
                (
                    "a compressed device of 1 TiB",
                    Swap::builder().device(SwapDeviceSpec::compressed(crate::io::CompressedOptions::new(tb))),
                ),
                (
                    "max_mapped of 1 TiB",
                    Swap::builder().device(SwapDeviceSpec::ram(MIB)).max_mapped(tb),
                ),
                (
                    "an encrypted swap file of 1 TiB",
                    Swap::builder().device(SwapDeviceSpec::file(FileOptions::new(
                        dir.path().join("big"),
                        tb >> 12,
                    ))),
                ),
            ];
            for (what, b) in tries {
                match b.budget(MIB).build() {
                    Ok(_) => panic!("{what}: built under RLIMIT_AS of {limit}"),
                    Err(e) => one_line(what, &e),
                }
            }
            let swap = ram_swap(MIB, 4 * MIB, FaultMode::Sigbus);
            match swap.map(tb as usize) {
                Ok(_) => panic!("a 1 TiB region mapped under RLIMIT_AS"),
                Err(e) => one_line("a region of 1 TiB", &e),
            }
            child::exit(0);
        }
        let out = child::run(
            "pager::tests::bad_input::limits_are_errors_not_aborts",
            "limits",
            std::time::Duration::from_secs(120),
        );
        out.assert_success();
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        #[test]
        fn any_configuration_is_an_instance_or_one_line(
            budget in mostly(256 << 10, 256 * MIB),
            devices in proptest::collection::vec(device(std::env::temp_dir().join("uswap-bad-input")), 0..3),
            staging in proptest::option::of(0u32..5000),
            max_mapped in proptest::option::of(mostly(MIB, 512 * MIB)),
            region in mostly(0, 256 * MIB),
        ) {
            std::fs::create_dir_all(std::env::temp_dir().join("uswap-bad-input")).unwrap();
            let mut b = Swap::builder().budget(budget);
            for d in devices {
                b = b.device(d);
            }
            if let Some(n) = staging {
                b = b.staging_frames(n);
            }
            if let Some(m) = max_mapped {
                b = b.max_mapped(m);
            }
            match b.build() {
                Ok(swap) => match swap.map(region as usize) {
                    Ok(r) => prop_assert!(r.len() >= region as usize),
                    Err(e) => prop_assert!(!e.to_string().contains('\n'), "{e}"),
                },
                Err(e) => prop_assert!(!e.to_string().contains('\n') && !e.to_string().is_empty(), "{e}"),
            }
        }
    }
}
