//! The pager on compressed devices and tiers, end to end.

use std::time::Duration;

use super::*;
use crate::io::IoOp;

/// What page `p` holds under `seed`: a third same-filled (one word), a
/// third text-like (compresses about 2x), a third random (does not).
fn mixed_page(p: usize, seed: u64, page: &mut [u8]) {
    const WORDS: [&[u8]; 16] = [
        b"slot ",
        b"cluster ",
        b"swap ",
        b"extent ",
        b"trunk ",
        b"page ",
        b"the ",
        b"of ",
        b"batch ",
        b"folio ",
        b"fault ",
        b"reclaim ",
        b"budget ",
        b"device ",
        b"zram ",
        b"store ",
    ];
    match p % 3 {
        0 => {
            let w = (p as u64 ^ seed).to_ne_bytes();
            page.chunks_exact_mut(8).for_each(|c| c.copy_from_slice(&w));
        }
        1 => {
            let mut x = (p as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed;
            let mut at = 0;
            while at < page.len() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let w = WORDS[(x % 16) as usize];
                let n = w.len().min(page.len() - at);
                page[at..at + n].copy_from_slice(&w[..n]);
                if x.is_multiple_of(3) {
                    page[at + n - 1] = b'0' + (x >> 8) as u8 % 10;
                }
                at += n;
            }
        }
        _ => page
            .iter_mut()
            .enumerate()
            .for_each(|(at, b)| *b = fill_byte(p, at, seed)),
    }
}

/// 4 threads write (or, `check`, verify) the mixed pages of `seed`.
fn mixed(region: &mut Region, seed: u64, check: bool) {
    let chunk = region.len() / 4;
    std::thread::scope(|s| {
        for (t, part) in region.as_mut_slice().chunks_mut(chunk).enumerate() {
            s.spawn(move || {
                let mut want = vec![0u8; PAGE_SIZE];
                for (i, page) in part.chunks_mut(PAGE_SIZE).enumerate() {
                    let p = t * (chunk / PAGE_SIZE) + i;
                    mixed_page(p, seed, &mut want);
                    if check {
                        assert!(page == &want[..], "page {p} differs");
                    } else {
                        page.copy_from_slice(&want);
                    }
                }
            });
        }
    });
}

/// After the last region goes: every slot back, and the stores hold
/// nothing (every freed slot was discarded in the device).
fn assert_stores_empty(swap: &Swap, what: &str) {
    assert_all_returned(swap, what);
    let st = swap.stats();
    for g in [
        "store_orig_bytes",
        "store_compr_bytes",
        "store_mem_bytes",
        "store_same_pages",
        "store_whole_pages",
        "store_file_pages",
    ] {
        assert_eq!(
            st.gauges
                .iter()
                .find(|&(n, _)| n == g)
                .expect("a gauge of that name")
                .1,
            0,
            "{what}: {g} left in the store: {:?}",
            st.gauges
        );
    }
    for d in &swap.inner.backing().devices {
        d.check_store().unwrap();
    }
}

fn specs(dir: &tempfile::TempDir) -> Vec<(String, &'static str)> {
    vec![
        ("zram:32M".into(), "lz4"),
        ("zram:32M:zstd:1".into(), "zstd"),
        // A store of 1 MiB in front of a file: most pages go through it
        // to the file.
        (
            format!("zram:1M:lz4,file:{}:32M", dir.path().join("tier").display()),
            "tier",
        ),
    ]
}

/// Every kind of page, in both fault modes, on each compressed device:
/// written over a region four times the budget, read back twice (the
/// second time after rewriting), and nothing left in the store once the
/// region is gone.
#[test]
fn compressed_devices_keep_every_page_in_both_modes() {
    let dir = tempfile::tempdir().unwrap();
    for mode in [FaultMode::Sigbus, FaultMode::HandlerThread] {
        for (spec, what) in specs(&dir) {
            let what = format!("{what} {mode:?}");
            let swap = Swap::builder()
                .budget(4 * MIB)
                .device(spec.parse().unwrap())
                .fault_mode(mode)
                .build()
                .unwrap();
            let mut region = swap.map((16 * MIB) as usize).unwrap();
            mixed(&mut region, 1, false);
            mixed(&mut region, 1, true);
            mixed(&mut region, 2, false);
            mixed(&mut region, 2, true);
            let st = swap.stats();
            assert!(
                st.counters.evictions > 4096 && st.counters.swapout_errors == 0,
                "{what}: {:?}",
                st.counters
            );
            assert!(
                st.counters.swapins + st.counters.readahead > 2048,
                "{what}: {:?}",
                st.counters
            );
            assert!(st.gauges.store_same_pages > 0, "{what}: {:?}", st.gauges);
            if mode == FaultMode::Sigbus {
                // Pages read back come in sealed and leave by copy.
                assert!(st.counters.evict_copies > 1000, "{what}: {:?}", st.counters);
            }
            if what.starts_with("tier") {
                assert!(
                    // Random pages too: stored whole, written back in
                    // their turn.
                    st.counters.store_writebacks > 0 && st.counters.store_incompressible_to_file == 0,
                    "{what}: {st:?}"
                );
                assert!(st.gauges.store_mem_peak_bytes <= MIB, "{what}: {:?}", st.gauges);
            } else {
                assert!(st.gauges.store_whole_pages > 0, "{what}: {:?}", st.gauges);
                // Text pages compress: the store holds its pages in less
                // than their size.
                assert!(
                    st.gauges.store_compr_bytes < st.gauges.store_orig_bytes * 3 / 4,
                    "{what}: {:?}",
                    st.gauges
                );
            }
            drop(region);
            assert_stores_empty(&swap, &what);
        }
    }
}

#[test]
fn huge_units_on_a_compressed_device() {
    let swap = Swap::builder()
        .budget(8 * MIB)
        .device("zram:64M:lz4".parse().unwrap())
        .build()
        .unwrap();
    huge_integrity(swap, false);
}

/// The file behind a tier is full for a while (`ENOSPC` on every write):
/// the store fills, refuses pages (transiently: they stay resident or
/// staged, no slot is retired), and once the file takes writes again
/// everything goes out and comes back intact.
#[test]
fn a_tier_whose_file_fails_loses_no_page() {
    let dir = tempfile::tempdir().unwrap();
    for mode in [FaultMode::Sigbus, FaultMode::HandlerThread] {
        // Random pages stored whole (the default), so that the store
        // fills at once.
        let opts = crate::io::CompressedOptions::new(MIB).file(FileOptions::new(
            dir.path().join(format!("tier-{mode:?}")),
            32 * MIB / PAGE_SIZE as u64,
        ));
        let swap = Swap::builder()
            .budget(4 * MIB)
            .device(SwapDeviceSpec::compressed(opts))
            .fault_mode(mode)
            .build()
            .unwrap();
        let file = swap.inner.backing().devices[0].file_behind().unwrap();
        file.inject_errors_for(IoOp::Write, libc::ENOSPC, Duration::from_millis(300));
        let mut region = swap.map((16 * MIB) as usize).unwrap();
        mixed(&mut region, 7, false);
        mixed(&mut region, 7, true);
        // Pages that found no room stayed resident; once the window is
        // over and the pager's writeback backoff has run out, passes go
        // out through the store to the file.
        std::thread::sleep(Duration::from_millis(350));
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut seed = 8;
        while swap.stats().counters.store_writebacks == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "{mode:?}: writeback never resumed"
            );
            mixed(&mut region, seed, false);
            mixed(&mut region, seed, true);
            seed += 1;
        }
        let st = swap.stats();
        assert!(
            st.counters.store_writeback_errors > 0,
            "{mode:?}: no writeback failed: {st:?}"
        );
        assert!(st.counters.store_writebacks > 0, "{mode:?}: {st:?}");
        // No slot retired: the drop below finds every one free.
        drop(region);
        assert_stores_empty(&swap, &format!("{mode:?}"));
    }
}

/// Writes racing the eviction of sealed pages: every page is read (it
/// comes in sealed: dirty, its copy let go, write-protected) and then
/// written, from four threads, while the reclaimer copies sealed pages
/// out and drops them; no write may be lost, in either mode.  Every page
/// sealed: a program that writes all it reads would have them come in
/// writable (seal.rs), and the race would not be run.
#[test]
fn writes_racing_sealed_eviction_are_kept() {
    for mode in [FaultMode::Sigbus, FaultMode::HandlerThread] {
        let swap = Swap::builder()
            .budget(2 * MIB)
            .device("zram:32M".parse().unwrap())
            .fault_mode(mode)
            .adaptive_seal(false)
            .build()
            .unwrap();
        let mut region = swap.map((8 * MIB) as usize).unwrap();
        hammer_counters(&mut region, 6, &format!("{mode:?}"));
        let st = swap.stats();
        if mode == FaultMode::Sigbus {
            assert!(st.counters.evict_copies > 100, "{mode:?}: {:?}", st.counters);
        }
        assert!(st.counters.wp_faults > 100, "{mode:?}: {:?}", st.counters);
        drop(region);
        assert_stores_empty(&swap, &format!("{mode:?}"));
    }
}
