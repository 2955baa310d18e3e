//! Limits and errors: write errors that must not eat the swap space,
//! writeback through errors and short writes, metadata paid for as it is
//! used, budgets too small refused.
//!
//! Scenarios that died, hung or deadlocked before their fix run in a
//! child process under a watchdog (`child.rs`), so that a regression fails
//! its test with the child's output instead of taking the suite down.

use std::time::Duration;

use super::child;
use super::support::*;
use super::*;

const MIB: u64 = 1 << 20;

// Transient write errors must not eat the swap space.

#[test]
fn transient_write_errors_retire_nothing() {
    let swap = ram_swap(MIB, 16 * MIB, FaultMode::Sigbus);
    let mut region = swap.map((8 * MIB) as usize).unwrap();
    let base = region.as_mut_slice().as_mut_ptr();
    let pages = region.len() / PAGE_SIZE;
    let start = std::time::Instant::now();
    swap.inject_io_errors(0, crate::io::IoOp::Write, libc::ENOSPC, Duration::from_secs(1));
    while start.elapsed() < Duration::from_millis(1500) {
        write_pages(base, 0..pages);
    }
    write_pages(base, 0..pages);
    assert_eq!(check_pages(base, 0..pages), None);
    let st = swap.stats();
    assert!(st.counters.io_write_errors > 0, "{:?}", st.counters);
    assert_eq!(
        st.counters.swapout_errors, 0,
        "no slot retired: {:?}",
        st.counters
    );
    assert!(st.counters.swapout_retries > 0, "{:?}", st.counters);
    drop(region);
    assert_all_returned(&swap, "after ENOSPC");
}

// Metadata is paid for as it is used; budgets too small are refused.

fn vm_rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn metadata_costs_memory_only_as_used() {
    if let Some(arg) = child::scenario() {
        if arg == "rlimit" {
            // An address-space limit the tables cannot fit: a clear error,
            // not an abort.
            // SAFETY: lowers this process's own limit.
            unsafe {
                let lim = libc::rlimit {
                    rlim_cur: 8 << 30,
                    rlim_max: 8 << 30,
                };
                libc::setrlimit(libc::RLIMIT_AS, &lim);
            }
            let r = Swap::builder()
                .budget(MIB)
                .device(SwapDeviceSpec::ram(16 * MIB))
                .max_mapped(4 << 40)
                .build();
            match r {
                Ok(_) => eprintln!("built"),
                Err(e) => eprintln!("refused: {e}"),
            }
            child::exit(0);
        }
        let before = vm_rss_kib();
        let swap = ram_swap(MIB, 64 << 30, FaultMode::Sigbus);
        let after = vm_rss_kib();
        eprintln!("a 64 GiB device: RSS grew by {} KiB", after - before);
        let mut region = swap.map((8 * MIB) as usize).unwrap();
        write_pages(region.as_mut_slice().as_mut_ptr(), 0..2048);
        assert!(after - before < 32 << 10, "RSS grew by {} KiB", after - before);
        child::exit(0);
    }
    let out = child::run(
        "pager::tests::limits::metadata_costs_memory_only_as_used",
        "rss",
        Duration::from_secs(60),
    );
    out.assert_success();
    let out = child::run(
        "pager::tests::limits::metadata_costs_memory_only_as_used",
        "rlimit",
        Duration::from_secs(60),
    );
    out.assert_success();
    assert!(
        out.stderr.contains("refused: ") && out.stderr.contains("metadata"),
        "{out:?}"
    );
}

#[test]
fn map_huge_refuses_a_budget_under_two_units() {
    let swap = ram_swap(3 * MIB, 64 * MIB, FaultMode::Sigbus);
    let e = swap.map_huge(16 * MIB as usize).err().expect("refused");
    assert!(e.to_string().contains("2 MB units"), "{e}");
    assert!(swap.map((16 * MIB) as usize).is_ok(), "4 KiB pages are fine");
}

/// Writeback of a swap file through the background reclaimer's io_uring:
/// an injected EIO keeps its page and retires one slot, writes cut short
/// are written again page by page, and no data is lost.
#[test]
fn queued_writeback_keeps_pages_through_errors_and_short_writes() {
    let dir = tempfile::tempdir().unwrap();
    let swap = Swap::builder()
        .budget(MIB)
        .device(SwapDeviceSpec::file(FileOptions::new(
            dir.path().join("swap"),
            32 * MIB / PAGE_SIZE as u64,
        )))
        .build()
        .unwrap();
    let mut region = swap.map((8 * MIB) as usize).unwrap();
    let base = region.as_mut_slice().as_mut_ptr();
    let pages = region.len() / PAGE_SIZE;
    swap.inner.backing().devices[0].inject_short_writes(4);
    swap.inject_io_error(0, crate::io::ANY_SLOT, crate::io::IoOp::Write);
    write_pages(base, 0..pages);
    assert_eq!(check_pages(base, 0..pages), None);
    // The short writes are the background reclaimer's (its io_uring); on a
    // loaded machine the faulting thread may have done all the writeback
    // itself (pwrite): pass again until they are met.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while swap.inner.backing().devices[0].short_writes_pending() > 0 {
        assert!(std::time::Instant::now() < deadline, "short writes never met");
        write_pages(base, 0..pages);
        assert_eq!(check_pages(base, 0..pages), None);
    }
    let st = swap.stats();
    assert_eq!(st.counters.swapout_errors, 1, "{:?}", st.counters);
    assert!(
        st.counters.io_writes * 2 < st.counters.io_write_pages,
        "{:?}",
        st.counters
    );
    drop(region);
    assert_all_returned_but(&swap, 1, "queued writeback");
}
