//! What the pager chooses.  Which pages reclaim takes: the refault
//! distance (workingset.rs) keeps a small hot set resident through a scan
//! of cold pages several times the budget, where activating every refault
//! cycles the hot pages out with the cold ones.  Which pages it reads
//! ahead: the trend prefetch (trend.rs) follows backward and strided
//! walks, which forward readahead does not.  How pages come back: sealed
//! (seal.rs) while the program leaves them unwritten, writable while it
//! writes what it reads.

use super::support::*;
use super::*;
use crate::stats::Stats;

const MIB: u64 = 1 << 20;

/// Pages of the hot set, and the cold pages read between two touches of
/// it.
const HOT: usize = 128;
const COLD_BETWEEN: usize = 64;

/// An instance of a 4 MiB budget on a RAM device in `mode`, as
/// `configure` sets it, and a region four budgets long, every page
/// written (most swapped out since): `walk` gets the instance, the
/// region's base and its pages.  Returns what the walk returns and the
/// stats after it, the region dropped and everything checked returned.
fn on_four_budgets<T>(
    mode: FaultMode,
    configure: impl FnOnce(SwapBuilder) -> SwapBuilder,
    walk: impl FnOnce(&Swap, *mut u8, usize) -> T,
) -> (T, Stats) {
    on_four_budgets_of(SwapDeviceSpec::ram(32 * MIB), mode, configure, walk)
}

/// [`on_four_budgets`] on `device`.
fn on_four_budgets_of<T>(
    device: SwapDeviceSpec,
    mode: FaultMode,
    configure: impl FnOnce(SwapBuilder) -> SwapBuilder,
    walk: impl FnOnce(&Swap, *mut u8, usize) -> T,
) -> (T, Stats) {
    let swap = configure(Swap::builder().budget(4 * MIB).device(device).fault_mode(mode))
        .build()
        .unwrap();
    let mut region = swap.map((16 * MIB) as usize).unwrap();
    let base = region.as_mut_slice().as_mut_ptr();
    let pages = region.len() / PAGE_SIZE;
    write_pages(base, 0..pages);
    let out = walk(&swap, base, pages);
    let st = swap.stats();
    drop(region);
    assert_all_returned(&swap, mode_name(mode));
    (out, st)
}

/// A hot set of 128 pages, touched after every 64 cold pages of a scan
/// over four budgets, eight times over: how many touches of a hot page
/// found it swapped out.  All reads check the data written first.
fn hot_touches_missed(mode: FaultMode, refault_distance: bool) -> (usize, Stats) {
    let configure = |b: SwapBuilder| {
        // One page per fault and reclaim at the budget only: what the
        // LRU chooses decides alone what stays.
        b.readahead(false)
            .background_reclaim(false)
            .refault_distance(refault_distance)
    };
    on_four_budgets(mode, configure, |_, base, pages| {
        let mut missed = 0;
        for _ in 0..8 {
            for cold in (HOT..pages).step_by(COLD_BETWEEN) {
                let end = (cold + COLD_BETWEEN).min(pages);
                assert_eq!(check_pages(base, cold..end), None);
                for hot in 0..HOT {
                    // SAFETY: page `hot` of the region.
                    let page = unsafe { base.add(hot * PAGE_SIZE) };
                    if !crate::sys::page_mapped(page as u64) {
                        missed += 1;
                    }
                    assert_eq!(check_pages(base, hot..hot + 1), None);
                }
            }
        }
        missed
    })
}

#[test]
fn refault_distance_keeps_a_hot_set_through_a_cold_scan() {
    for mode in both_modes() {
        let (on, st_on) = hot_touches_missed(mode, true);
        let (off, st_off) = hot_touches_missed(mode, false);
        // Off, the hot pages go round the active list with every cold
        // page that came back, and out every 1,024 evictions or so: each
        // of 128 pages about 30 times in 8 scans of 3,968 cold pages.
        // On, they are the only refaults back within half a budget: once
        // each, when the first scan pushes them out of the inactive list.
        assert!(
            on * 8 < off,
            "{mode:?}: hot touches that missed: {on} with refault distance, {off} without"
        );
        // Every cold page came back from farther than half a budget.
        let c = &st_on.counters;
        assert!(c.workingset_refault > 8 * 3_000, "{mode:?}: {c:?}");
        assert!(
            c.workingset_activate < c.workingset_refault / 8,
            "{mode:?}: {c:?}"
        );
        assert_eq!(
            st_off.counters.workingset_refault, 0,
            "{mode:?}: off measures nothing"
        );
    }
}

/// A walk over a region four budgets long, every page written and most
/// swapped out first: each page read (and checked) in the order `order`
/// gives.  Returns the walk's swap-ins (faults that read a page) and the
/// stats after it.
fn walk_swapins(mode: FaultMode, trend: bool, order: &dyn Fn(usize) -> Vec<usize>) -> (u64, Stats) {
    // The background reclaimer on, as a program runs with it.
    let (before, st) = on_four_budgets(
        mode,
        |b| b.trend_prefetch(trend),
        |swap, base, pages| {
            let before = swap.stats().counters.swapins;
            for p in order(pages) {
                assert_eq!(check_pages(base, p..p + 1), None, "{mode:?} trend {trend}");
            }
            before
        },
    );
    (st.counters.swapins - before, st)
}

#[test]
fn trend_prefetch_follows_backward_and_strided_walks() {
    let backward = |pages: usize| (0..pages).rev().collect::<Vec<_>>();
    let stride = |pages: usize| (0..7).flat_map(|r| (r..pages).step_by(7)).collect::<Vec<_>>();
    for mode in both_modes() {
        for (name, order) in [
            ("backward", &backward as &dyn Fn(usize) -> Vec<usize>),
            ("stride 7", &stride),
        ] {
            let (on, st) = walk_swapins(mode, true, order);
            let (off, st_off) = walk_swapins(mode, false, order);
            // Off, forward readahead reads the pages the walk has just
            // left: nearly every page is a fault.  On, one fault a window
            // of up to 32 once the trend is seen.
            assert!(off > 3_000, "{mode:?} {name}: {off} swap-ins without the trend");
            assert!(
                on * 8 < off,
                "{mode:?} {name}: {on} swap-ins with the trend, {off} without"
            );
            let c = &st.counters;
            assert!(c.trend_issued > 2_500, "{mode:?} {name}: {c:?}");
            assert!(c.trend_hits > c.trend_issued * 3 / 4, "{mode:?} {name}: {c:?}");
            assert!(c.trend_wasted < c.trend_issued / 8, "{mode:?} {name}: {c:?}");
            assert_eq!(st_off.counters.trend_issued, 0, "{mode:?} {name}");
        }
    }
}

/// A backward and a forward walk over four budgets of a swap file
/// (plaintext and encrypted), every page checked: with batched reads the
/// runs of a window go out together through the read ring, in SIGBUS mode
/// with the fault's own read (`fault_read_in_batch`), and nothing read
/// that way is lost or wrong; switched off, no read goes that way.
#[test]
fn batched_reads_of_a_window_read_every_page_right() {
    let backward = |pages: usize| (0..pages).rev().collect::<Vec<_>>();
    for mode in both_modes() {
        for encrypt in [false, true] {
            for (batched, lead) in [(true, true), (true, false), (false, true)] {
                let what = format!("{mode:?} encrypt {encrypt} batched {batched} lead {lead}");
                let dir = tempfile::tempdir().unwrap();
                let device = SwapDeviceSpec::file(
                    FileOptions::new(dir.path().join("swap"), 64 * MIB / PAGE_SIZE as u64).encrypt(encrypt),
                );
                let (reads, st) = on_four_budgets_of(
                    device,
                    mode,
                    |b| b.batched_reads(batched).fault_read_in_batch(lead),
                    |swap, base, pages| {
                        let before = swap.stats().counters.io_read_pages;
                        // Twice: the second walk of each reads what the
                        // first left clean, from the same slots.
                        for _ in 0..2 {
                            for p in backward(pages) {
                                assert_eq!(check_pages(base, p..p + 1), None, "{what}");
                            }
                        }
                        for _ in 0..2 {
                            assert_eq!(check_pages(base, 0..pages), None, "{what}");
                        }
                        swap.stats().counters.io_read_pages - before
                    },
                );
                let c = &st.counters;
                assert!(reads > 3_000, "{what}: {reads} pages read");
                if batched {
                    assert!(c.io_reads_batched > 100, "{what}: {c:?}");
                    assert!(c.io_reads_batched <= c.io_reads, "{what}: {c:?}");
                } else {
                    assert_eq!(c.io_reads_batched, 0, "{what}");
                }
                // The fault's own read goes with its window's where the
                // faulting thread waits for both: SIGBUS mode.
                if batched && lead && mode == FaultMode::Sigbus {
                    assert!(c.swapins_batched * 4 > c.swapins, "{what}: {c:?}");
                } else {
                    assert_eq!(c.swapins_batched, 0, "{what}");
                }
                assert_eq!(c.swapin_errors, 0, "{what}");
            }
        }
    }
}

/// Swap-ins, pages that came in sealed and sealed pages written over
/// `passes` calls of `touch`.
fn sealed_over(swap: &Swap, passes: usize, mut touch: impl FnMut()) -> (u64, u64, u64) {
    let before = swap.stats().counters;
    (0..passes).for_each(|_| touch());
    let after = swap.stats().counters;
    (
        after.swapins - before.swapins,
        after.sealed_in - before.sealed_in,
        after.sealed_written - before.sealed_written,
    )
}

#[test]
fn sealing_stops_while_the_program_writes_what_it_reads_back_and_resumes_after() {
    for mode in both_modes() {
        for adaptive in [true, false] {
            let what = format!("{mode:?} adaptive {adaptive}");
            let device = SwapDeviceSpec::compressed(crate::io::CompressedOptions::new(64 * MIB));
            // One page per fault: each swap-in is the decision's.
            let configure = |b: SwapBuilder| b.readahead(false).adaptive_seal(adaptive);
            on_four_budgets_of(device, mode, configure, |swap, base, pages| {
                // Every page read back, then written (the same bytes: a write
                // all the same), as sqlite3's B-tree pages are.
                let (swapins, sealed, written) = sealed_over(swap, 4, || {
                    for p in 0..pages {
                        assert_eq!(check_pages(base, p..p + 1), None, "{what}");
                        write_pages(base, p..p + 1);
                    }
                });
                assert!(swapins > 4 * 2_500, "{what}: {swapins} swap-ins");
                // A page that came in sealed and was written: all of them.
                assert!(
                    written * 10 >= sealed * 9,
                    "{what}: {written} of {sealed} sealed written"
                );
                if adaptive {
                    // 256 to judge, then one in sixteen.
                    assert!(sealed * 4 < swapins, "{what}: {sealed} of {swapins} sealed");
                } else {
                    assert!(sealed * 10 >= swapins * 9, "{what}: {sealed} of {swapins} sealed");
                }
                // Then read alone: the probes find the sealed pages left
                // unwritten, and sealing comes back.  Judged from the second
                // pass on: a handler thread counts the last write after it
                // has woken the writer, so the first may see it.
                let mut last = (0, 0, 0);
                for pass in 0..30 {
                    last = sealed_over(swap, 1, || {
                        assert_eq!(check_pages(base, 0..pages), None, "{what}");
                    });
                    if pass > 0 && last.1 * 10 >= last.0 * 9 {
                        break;
                    }
                }
                let (swapins, sealed, written) = last;
                assert_eq!(written, 0, "{what}");
                assert!(
                    sealed * 10 >= swapins * 9,
                    "{what}: sealing did not come back: {sealed} of {swapins} sealed in the last pass"
                );
                assert_eq!(check_pages(base, 0..pages), None, "{what}");
            });
        }
    }
}

/// Swap-ins, write-protect faults and pages written out over `passes`
/// calls of `touch`.
fn clean_over(swap: &Swap, passes: usize, mut touch: impl FnMut()) -> (u64, u64, u64) {
    let before = swap.stats().counters;
    (0..passes).for_each(|_| touch());
    let after = swap.stats().counters;
    (
        after.swapins - before.swapins,
        after.wp_faults - before.wp_faults,
        after.evict_write - before.evict_write,
    )
}

/// Pages read back from a swap file come in clean (write-protected, the
/// file's copy kept) while the program leaves them unwritten: evicted
/// again, they are dropped with no write.  A program that writes what it
/// reads pays a write-protect fault a page for that; while it does, the
/// pages come in writable (`adaptive_clean`), and when it goes back to
/// reading alone, clean pages come back.  Every read checks the data.
#[test]
fn clean_pages_stop_while_the_program_writes_what_it_reads_back_and_resume_after() {
    for mode in both_modes() {
        for adaptive in [true, false] {
            let what = format!("{mode:?} adaptive {adaptive}");
            let dir = tempfile::tempdir().unwrap();
            let device = ram_or_file(true, &dir, "clean");
            // One page per fault: each swap-in is the decision's.
            let configure = |b: SwapBuilder| b.readahead(false).adaptive_clean(adaptive);
            on_four_budgets_of(device, mode, configure, |swap, base, pages| {
                // Every page read back, then written, as Python's objects
                // are (a reference count on every touch).
                let (swapins, wp, _) = clean_over(swap, 4, || {
                    for p in 0..pages {
                        assert_eq!(check_pages(base, p..p + 1), None, "{what}");
                        write_pages(base, p..p + 1);
                    }
                });
                assert!(swapins > 4 * 2_500, "{what}: {swapins} swap-ins");
                if adaptive {
                    // 256 to judge, then one in sixteen still clean.
                    assert!(
                        wp * 4 < swapins,
                        "{what}: {wp} write-protect faults, {swapins} swap-ins"
                    );
                } else {
                    assert!(
                        wp * 10 >= swapins * 9,
                        "{what}: {wp} write-protect faults, {swapins} swap-ins"
                    );
                }
                // Then read alone: the clean pages the probes bring in go
                // unwritten, and clean pages come back, to be dropped
                // with no write.  Judged from the second pass on.
                let mut last = (0, 0, 0);
                for pass in 0..30 {
                    last = clean_over(swap, 1, || {
                        assert_eq!(check_pages(base, 0..pages), None, "{what}");
                    });
                    if pass > 0 && last.2 * 10 <= last.0 {
                        break;
                    }
                }
                let (swapins, wp, written) = last;
                assert_eq!(wp, 0, "{what}: write-protect faults with nothing written");
                assert!(
                    written * 10 <= swapins,
                    "{what}: clean pages did not come back: {written} pages written for {swapins} read back"
                );
                assert_eq!(check_pages(base, 0..pages), None, "{what}");
            });
        }
    }
}

/// A cut of the budget on probation (`SwapBuilder::probation`) stages the
/// pages it takes and writes none of them for the dwell; a hot set loaded
/// first, which is what such a cut takes first (uswap's LRU is in fault
/// order), comes back from the frames with no IO and stays in memory;
/// when the dwell ends only the untouched pages are written, and the
/// resident set comes down to the new budget.  Every read checks the data.
#[test]
fn a_cut_on_probation_writes_only_what_the_dwell_left_untouched() {
    const DWELL: std::time::Duration = std::time::Duration::from_secs(4);
    for mode in both_modes() {
        let what = mode_name(mode);
        let swap = Swap::builder()
            .budget(32 * MIB)
            .device(SwapDeviceSpec::ram(64 * MIB))
            .fault_mode(mode)
            .probation(DWELL)
            .build()
            .unwrap();
        let mut region = swap.map((30 * MIB) as usize).unwrap();
        let base = region.as_mut_slice().as_mut_ptr();
        let pages = region.len() / PAGE_SIZE;
        // The hot set: the first pages loaded, the oldest in the LRU.
        let hot = 0..256;
        write_pages(base, 0..pages);
        assert_eq!(swap.stats().counters.staged, 0, "{what}: staged under the budget");
        // 7,680 pages under a budget of 7,168: 512 pages to take (on a
        // device in memory the reclaimer takes the resident set to the
        // budget itself, the faults reclaiming at it), within the cut's
        // 1,024 and the eighth of the budget (1,024 pages) probation may
        // hold.
        let cut = std::time::Instant::now();
        swap.set_budget(28 * MIB).unwrap();
        let deadline = cut + DWELL / 2;
        while swap.stats().counters.staged < 450 {
            assert!(
                std::time::Instant::now() < deadline,
                "{what}: {:?}",
                swap.stats().counters.staged
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // Staged, on probation: nothing written, still all resident.
        let st = swap.stats();
        assert_eq!(st.counters.evict_write, 0, "{what}: written during the dwell");
        assert_eq!(swap.resident_pages(), pages, "{what}");
        // The hot set, touched during the dwell: what the cut took of it
        // comes back from its frames (swap-cache hits), none from the
        // device.
        assert_eq!(check_pages(base, hot.clone()), None, "{what}");
        let touched = swap.stats();
        assert!(
            touched.counters.swapcache_hits >= 200,
            "{what}: {} swap-cache hits for the hot set",
            touched.counters.swapcache_hits
        );
        assert_eq!(
            touched.counters.swapins, 0,
            "{what}: read from the device during the dwell"
        );
        assert!(
            std::time::Instant::now() < cut + DWELL,
            "{what}: the checks outlived the dwell"
        );
        // Past the dwell: the untouched pages are written and the
        // resident set comes down to the new budget (and a batch).
        let deadline = cut + DWELL + std::time::Duration::from_secs(20);
        while swap.resident_pages() > 7168 + 64 {
            assert!(
                std::time::Instant::now() < deadline,
                "{what}: {} resident",
                swap.resident_pages()
            );
            assert_eq!(check_pages(base, hot.clone()), None, "{what}");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let after = swap.stats();
        assert!(
            after.counters.evict_write >= 400,
            "{what}: {} written",
            after.counters.evict_write
        );
        // The hot set was activated by its touches: still in memory.
        for _ in 0..3 {
            assert_eq!(check_pages(base, hot.clone()), None, "{what}");
        }
        assert_eq!(swap.stats().counters.swapins, 0, "{what}: the hot set went out");
        assert_eq!(check_pages(base, 0..pages), None, "{what}");
        drop(region);
        assert_all_returned(&swap, what);
    }
}

/// While the program writes most of the clean pages it reads back from a
/// swap file, a write-protect fault makes the clean pages of its window
/// writable with it: a program that reads a span first and writes it
/// after (Python's exit: its collector reads every object, then frees
/// each) takes a fault a window, not a page.  Off (`adaptive_clean`
/// false), a fault a page, as before.  Four threads write the span's
/// pages in turn, so that a fault makes writable neighbours that other
/// threads are writing: each page becomes dirty exactly once, and every
/// byte written reads back after the pages went out again.
#[test]
fn a_written_clean_page_takes_its_clean_neighbours_with_it() {
    for mode in both_modes() {
        for adaptive in [true, false] {
            let what = format!("{mode:?} adaptive {adaptive}");
            let dir = tempfile::tempdir().unwrap();
            let swap = Swap::builder()
                .budget(8 * MIB)
                .device(ram_or_file(true, &dir, "around"))
                .fault_mode(mode)
                .readahead(false)
                .adaptive_clean(adaptive)
                .build()
                .unwrap();
            let mut region = swap.map((24 * MIB) as usize).unwrap();
            let base = region.as_mut_slice().as_mut_ptr();
            let pages = region.len() / PAGE_SIZE;
            write_pages(base, 0..pages);
            // Read alone: the pages go out and come back clean.
            for _ in 0..2 {
                assert_eq!(check_pages(base, 0..pages), None, "{what}");
            }
            // A span read (it fits the budget), then written.
            let span = 0..1024;
            let read_from = swap.stats().counters;
            assert_eq!(check_pages(base, span.clone()), None, "{what}");
            let before = swap.stats().counters;
            // A page the reclaimer took while it was being read came back
            // from the swap cache, and such a page comes back writable.
            let dirty = before.swapcache_hits - read_from.swapcache_hits;
            let at = base as usize;
            std::thread::scope(|s| {
                for t in 0..4 {
                    let span = span.clone();
                    s.spawn(move || {
                        for p in span.filter(|p| p % 4 == t) {
                            // A byte no page had: this write is what must
                            // survive.
                            // SAFETY: inside the live region.
                            unsafe {
                                std::ptr::write_volatile(
                                    (at as *mut u8).add(p * PAGE_SIZE + 8),
                                    !pattern(p, 8),
                                )
                            };
                        }
                    });
                }
            });
            settle_span(&region, span.clone());
            let after = swap.stats().counters;
            let (wp, around) = (
                after.wp_faults - before.wp_faults,
                after.unprotected_around - before.unprotected_around,
            );
            // The span fits the budget, but the reclaimer may still take
            // a few of its pages (the clock had not seen them referenced)
            // before their write: those come back by the write's own
            // fault, writable, and take no write-protect fault.
            let back =
                (after.swapins - before.swapins) + (after.swapcache_hits - before.swapcache_hits) + dirty;
            assert!(
                back < 128,
                "{what}: {back} of the span's pages went out under their reads or writes"
            );
            if adaptive {
                // The gate first sees the span's writes go one fault a
                // page, until they are most of what came in clean.
                assert!(wp < 700, "{what}: {wp} write-protect faults for 1024 pages");
                assert!(around > 300, "{what}: {around} made writable around them");
                // Every page made writable once; a thread whose fault met
                // a page another's fault had just made writable counts a
                // fault of its own besides (it was one).
                assert!(wp + around < 1024 + 64, "{what}: {wp} + {around}");
                assert!(wp + around + back >= 1024, "{what}: {wp} + {around} + {back}");
            } else {
                assert_eq!(around, 0, "{what}");
                assert!(wp <= 1024 && wp + back >= 1024, "{what}: {wp} + {back}");
            }
            // Out again (a walk of the rest), then every written byte back.
            assert_eq!(check_pages(base, 1024..pages), None, "{what}");
            for p in span.clone() {
                // SAFETY: inside the live region.
                let v = unsafe { std::ptr::read_volatile(base.add(p * PAGE_SIZE + 8)) };
                assert_eq!(v, !pattern(p, 8), "{what}: page {p}");
            }
            drop(region);
            assert_all_returned(&swap, &what);
        }
    }
}

/// Who reclaims.  On a device in memory the faults do, at the budget, as
/// a memory cgroup's charge does: the resident set stays at the budget,
/// and the reclaimer (whose every move out, from another CPU, is a TLB
/// shootdown the program's CPU takes) leaves it there.  On a swap file,
/// and with `reclaim_ahead_in_memory`, the reclaimer writes ahead, down
/// to its low watermark a sixteenth below the budget.  Every page reads
/// back either way.
#[test]
fn in_memory_the_faults_reclaim_at_the_budget_on_a_file_the_reclaimer_ahead() {
    // 16,384 pages; the low watermark 1,024 below.
    const BUDGET: usize = 16_384;
    const LOW: usize = BUDGET - 1_024;
    let batch = crate::pager::evict::batch::BATCH;
    for mode in both_modes() {
        for (file, ahead_in_memory) in [(false, false), (false, true), (true, false)] {
            let what = format!(
                "{} file {file} ahead in memory {ahead_in_memory}",
                mode_name(mode)
            );
            let dir = tempfile::tempdir().unwrap();
            let swap = Swap::builder()
                .budget((BUDGET * PAGE_SIZE) as u64)
                .device(ram_or_file_of(128 * MIB, file, &dir, "ahead"))
                .fault_mode(mode)
                .reclaim_ahead_in_memory(ahead_in_memory)
                .build()
                .unwrap();
            let mut region = swap.map(128 * MIB as usize).unwrap();
            let base = region.as_mut_slice().as_mut_ptr();
            let pages = region.len() / PAGE_SIZE;
            write_pages(base, 0..pages);
            if file || ahead_in_memory {
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
                while swap.resident_pages() > LOW {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "{what}: {} resident, the low watermark {LOW}",
                        swap.resident_pages()
                    );
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
            } else {
                // Left alone for a while: the reclaimer's looks (one every
                // 100 ms) take nothing the faults left within the budget.
                std::thread::sleep(std::time::Duration::from_millis(300));
                let resident = swap.resident_pages();
                assert!(
                    (BUDGET - 2 * batch..=BUDGET + batch).contains(&resident),
                    "{what}: {resident} resident, the budget {BUDGET}"
                );
                // Paced (`SwapBuilder::paced_reclaim`): near the budget a
                // fault does a share of the work, and a whole batch past it.
                let c = swap.stats().counters;
                assert!(c.paced + c.direct_reclaim > 0, "{what}: no fault reclaimed");
            }
            assert_eq!(check_pages(base, 0..pages), None, "{what}");
            drop(region);
            assert_all_returned(&swap, &what);
        }
    }
}
