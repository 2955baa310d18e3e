//! Tests of the statistics: counters, gauges, latency, locks and the registry published to readers.

use super::*;
use std::thread;
use std::time::Duration;

#[test]
fn counters_sum_over_threads() {
    let reg = Registry::new();
    let c = reg.counter(CounterId::FAULTS);
    thread::scope(|s| {
        for _ in 0..8 {
            let c = c.clone();
            s.spawn(move || {
                for _ in 0..10_000 {
                    c.inc();
                }
            });
        }
    });
    assert_eq!(reg.snapshot().counters.faults, 80_000);
    // The same id yields the same counter.
    reg.counter(CounterId::FAULTS).add(5);
    assert_eq!(c.get(), 80_005);
    assert_eq!(c.name(), "faults");
    // Every other counter is untouched.
    assert_eq!(
        reg.snapshot().counters.iter().map(|(_, v)| v).sum::<u64>(),
        80_005
    );
}

#[test]
fn lock_counts_acquisitions_and_contention() {
    let reg = Registry::new();
    let m = Arc::new(StatMutex::new(0u64, reg.lock_site(LockId::CLUSTER)));
    {
        let _g = m.lock();
        let m2 = m.clone();
        let h = thread::spawn(move || {
            *m2.lock() += 1;
        });
        // Hold the lock long enough that the other thread must wait.
        thread::sleep(Duration::from_millis(50));
        drop(_g);
        h.join().unwrap();
    }
    let s = reg.snapshot().locks.cluster;
    assert_eq!(s.acquisitions, 2);
    assert_eq!(s.contended, 1);
    assert!(s.wait_ns >= 10_000_000, "waited only {} ns", s.wait_ns);
    assert_eq!(*m.lock(), 1);
    assert!(m.try_lock().is_some());
    assert_eq!(reg.snapshot().locks.cluster.acquisitions, 4);
    assert_eq!(
        reg.snapshot().locks.get("cluster"),
        Some(reg.snapshot().locks.cluster)
    );
}

#[test]
fn snapshot_difference() {
    let reg = Registry::new();
    let c = reg.counter(CounterId::SWAPINS);
    c.add(3);
    let before = reg.snapshot();
    c.add(4);
    let d = reg.snapshot().since(&before);
    assert_eq!(d.counters.swapins, 4);
    assert_eq!(d.counters.faults, 0);
}

#[test]
fn gauges_share_a_word_and_keep_peaks() {
    let reg = Registry::new();
    let (a, b) = (
        reg.gauge(GaugeId::STORE_MEM_BYTES),
        reg.gauge(GaugeId::STORE_MEM_BYTES),
    );
    a.add(100);
    b.add(50);
    b.add(-30);
    let p = reg.gauge(GaugeId::STORE_MEM_PEAK_BYTES);
    p.raise_to(120);
    p.raise_to(90);
    let g = reg.snapshot().gauges;
    assert_eq!(g.store_mem_bytes, 120);
    assert_eq!(g.store_mem_peak_bytes, 120);
}

#[test]
fn latency_bands_and_quantiles() {
    let reg = Registry::new();
    for _ in 0..99 {
        reg.fault_latency(3_000); // band [2048, 4096)
    }
    reg.fault_latency(1_000_000); // band [524288, 1048576)
    let l = reg.snapshot().fault_latency;
    assert_eq!(l.count(), 100);
    assert_eq!(l.quantile_ns(0.5), 4096);
    assert_eq!(l.quantile_ns(0.99), 4096);
    assert_eq!(l.quantile_ns(1.0), 1 << 20);
    assert_eq!(Latency::default().quantile_ns(0.5), 0);
}

/// Stalls overlapping in two threads count once for "some"; "full"
/// only while every thread of the process is stalled.
#[test]
fn stall_clock_counts_overlaps_once() {
    let reg = Registry::new();
    reg.gauge(GaugeId::THREADS).set(2);
    reg.stall_begin(101);
    thread::sleep(Duration::from_millis(20));
    reg.stall_begin(102); // the second thread: now both ("full")
    thread::sleep(Duration::from_millis(20));
    reg.stall_end(); // one runs again: "full" over
    thread::sleep(Duration::from_millis(20));
    let open = reg.snapshot().pressure;
    reg.stall_end();
    let p = reg.snapshot().pressure;
    // Some: ~60 ms, counted once; full: ~20 ms.
    assert!((55_000..200_000).contains(&p.some.total_us), "{p:?}");
    assert!(
        (18_000..p.some.total_us - 30_000).contains(&p.full.total_us),
        "{p:?}"
    );
    // An open stall is in the total read while it lasts.
    assert!(open.some.total_us >= 55_000, "{open:?}");
    thread::sleep(Duration::from_millis(10));
    assert_eq!(
        reg.snapshot().pressure.some.total_us,
        p.some.total_us,
        "closed stays closed"
    );
    // An end without a begin (a fork zeroed the clock) does nothing.
    reg.stall_end();
    assert_eq!(reg.snapshot().pressure.some.total_us, p.some.total_us);
}

#[test]
fn stall_clock_balances_under_many_threads() {
    let reg = Registry::new();
    reg.gauge(GaugeId::THREADS).set(8);
    thread::scope(|s| {
        for t in 0..8 {
            let reg = &reg;
            s.spawn(move || {
                for _ in 0..20_000 {
                    reg.stall_begin(t);
                    reg.stall_end();
                }
            });
        }
    });
    let a = reg.snapshot().pressure;
    thread::sleep(Duration::from_millis(20));
    // Every stall ended: nothing open, nothing grows.
    assert_eq!(reg.snapshot().pressure, a);
    assert!(a.full.total_us <= a.some.total_us);
}

/// "Full" asks for the threads that waited lately: told apart by
/// their ids, one bucket each.
#[test]
fn active_threads_are_those_that_waited() {
    let reg = Registry::new();
    assert_eq!(reg.active_threads(), 1, "at least one");
    for tid in [1000, 1001, 1002, 1000] {
        reg.stall_begin(tid);
        reg.stall_end();
    }
    assert_eq!(reg.active_threads(), 3);
    // Thread 1064 shares thread 1000's bucket: counted once.
    reg.stall_begin(1064);
    reg.stall_end();
    assert_eq!(reg.active_threads(), 3);
}

#[test]
fn events_keep_counts_and_the_last_few() {
    let reg = Registry::new();
    for i in 0..(EVENT_RING as u64 + 5) {
        reg.event(EventKind::SlotRetired, i);
    }
    reg.event(EventKind::BudgetChanged, 777);
    let e = reg.snapshot().events;
    assert_eq!(e.count(EventKind::SlotRetired), EVENT_RING as u64 + 5);
    assert_eq!(e.count(EventKind::BudgetChanged), 1);
    assert_eq!(e.count(EventKind::OomKill), 0);
    assert_eq!(e.recent.len(), EVENT_RING);
    let last = e.recent.last().unwrap();
    assert_eq!((last.kind, last.value), (EventKind::BudgetChanged, 777));
    // Oldest first, in order.
    let values: Vec<u64> = e.recent[..EVENT_RING - 1].iter().map(|e| e.value).collect();
    assert_eq!(values, (6..EVENT_RING as u64 + 5).collect::<Vec<_>>());
    assert!(e.recent.windows(2).all(|w| w[0].unix_ns <= w[1].unix_ns));
}

/// A published block is read from its file by another mapping as the
/// pager's own snapshot reads it, and its file goes with the registry.
#[test]
fn published_block_reads_back_from_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::published(dir.path(), &Label { group: 7, mode: 1 }).unwrap();
    reg.counter(CounterId::EVICTIONS).add(42);
    reg.gauge(GaugeId::RESIDENT).set(1000);
    reg.lock_site(LockId::LRU);
    reg.event(EventKind::PagePoisoned, 0x1000);
    let path = reg.published_path().unwrap();
    assert!(path
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with(&format!("{}-", std::process::id())));
    let m = MappedBlock::open(&path).unwrap().expect("a block");
    let id = m.identity();
    assert_eq!(
        (id.pid, id.group, id.mode),
        (std::process::id() as i32, 7, "sigbus")
    );
    assert!(!id.command.is_empty());
    let s = m.stats();
    assert_eq!(s.counters.evictions, 42);
    assert_eq!(s.gauges.resident, 1000);
    assert_eq!(s.events.count(EventKind::PagePoisoned), 1);
    // Live: later counts show through the other mapping.
    reg.counter(CounterId::EVICTIONS).add(1);
    assert_eq!(m.stats().counters.evictions, 43);
    drop(reg);
    assert!(!path.exists(), "the file goes with the instance");
}

#[test]
fn a_file_that_is_not_a_block_is_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("1-0.stats");
    std::fs::write(&p, vec![0u8; 8192]).unwrap();
    assert!(MappedBlock::open(&p).unwrap().is_none());
    std::fs::write(&p, b"short").unwrap();
    assert!(MappedBlock::open(&p).unwrap().is_none());
}
