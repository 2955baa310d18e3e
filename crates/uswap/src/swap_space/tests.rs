//! Tests of the swap space: edges, a model test against a reference model
//! for every switch combination, and a many-thread stress with a full
//! invariant check at the end.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU8, Ordering};

use proptest::prelude::*;

use super::*;

/// The module documentation's example.
#[test]
fn the_module_example() -> Result<(), SwapError> {
    let space = SwapSpace::builder()
        .device(SlotDeviceConfig::new(4096).priority(10))
        .device(SlotDeviceConfig::new(2048).priority(5))
        .build(&crate::stats::Registry::new())?;
    let free = space.nr_free();
    let slot = space.alloc()?;
    assert_eq!(space.count(slot)?, 1);
    // Less by the slot, and the rest of the batch its CPU's slot cache took.
    assert!(space.nr_free() < free);
    space.free(slot)?;
    space.drain_slot_caches();
    assert_eq!(space.nr_free(), free);
    Ok(())
}

fn space(devs: &[SlotDeviceConfig], sw: Switches, cpus: usize) -> SwapSpace {
    let mut b = SwapSpace::builder().switches(sw).cpus(cpus).trunk_slots(1024);
    for d in devs {
        b = b.device(d.clone());
    }
    b.build(&Registry::new()).expect("valid config")
}

#[test]
fn alloc_free_roundtrip_every_switch() {
    for sw in Switches::all() {
        let s = space(&[SlotDeviceConfig::new(5000)], sw, 2);
        let mut got = HashSet::new();
        for _ in 0..3000 {
            let e = s.alloc().unwrap();
            assert!(e.offset() >= 1 && e.offset() < 5000);
            assert!(got.insert(e), "{e:?} handed out twice with {sw:?}");
            assert_eq!(s.count(e).unwrap(), 1);
        }
        s.check_invariants().unwrap();
        for e in &got {
            assert_eq!(s.free(*e).unwrap(), 0);
        }
        s.drain_slot_caches();
        s.check_invariants().unwrap();
        assert_eq!(s.nr_free(), 4999);
    }
}

/// Pinned to one CPU: a thread that migrates meets its own current
/// cluster owned by the CPU it left, which the nonfull-cluster policy
/// skips, and falls back to the linear scan (one slot a lock), which is
/// not what is counted here.
#[test]
fn alloc_batch_takes_a_batch_per_device_lock() {
    std::thread::spawn(alloc_batch_pinned).join().unwrap();
}

fn alloc_batch_pinned() {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET and
    // sched_setaffinity only read and write it, for this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        assert_eq!(libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set), 0);
    }
    for sw in Switches::all() {
        let reg = Registry::new();
        let s = SwapSpace::builder()
            .switches(sw)
            .device(SlotDeviceConfig::new(3000))
            .build(&reg)
            .unwrap();
        let mut out = [SwapEntry::NONE; 64];
        let mut all = HashSet::new();
        loop {
            match s.alloc_batch(&mut out) {
                Ok(n) => {
                    assert!((1..=64).contains(&n));
                    for e in &out[..n] {
                        assert!(all.insert(*e), "{e:?} twice");
                        assert_eq!(s.count(*e).unwrap(), 1);
                    }
                }
                Err(e) => {
                    assert_eq!(e, SwapError::Full { slots: 2999 });
                    break;
                }
            }
        }
        assert_eq!(all.len(), 2999);
        s.check_invariants().unwrap();
        // Four clusters are free: their 2048 slots come 64 per device-lock
        // acquisition.  The other 951 (cluster 0 beside the header, and
        // the partial tail cluster) come from the linear scan: batched too
        // with seed 000's fragmented scan (or from nonfull clusters), one
        // per acquisition without it.
        let acq = reg.snapshot().locks.swap_info.acquisitions;
        if sw.fragmented_scan || sw.nonfull_clusters {
            assert!(acq < 2999 / 8, "{sw:?}: {acq}");
        } else {
            assert!(acq > 900, "{sw:?}: {acq}");
        }
    }
}

#[test]
fn device_smaller_than_a_cluster() {
    for sw in Switches::all() {
        let s = space(&[SlotDeviceConfig::new(100)], sw, 2);
        let mut all = Vec::new();
        for _ in 0..99 {
            all.push(s.alloc().unwrap());
        }
        assert_eq!(s.alloc(), Err(SwapError::Full { slots: 99 }));
        assert_eq!(s.alloc_huge(), Err(SwapError::NoFreeCluster));
        s.check_invariants().unwrap();
        let set: HashSet<_> = all.iter().collect();
        assert_eq!(set.len(), 99);
        for e in all {
            s.free(e).unwrap();
        }
        s.drain_slot_caches();
        s.check_invariants().unwrap();
        assert_eq!(s.nr_free(), 99);
    }
}

#[test]
fn size_not_a_multiple_of_the_cluster() {
    // 3 clusters and a 7-slot tail: the tail cluster can never hold a huge
    // unit, but its 7 slots are usable.
    let n = 3 * CLUSTER_SLOTS + 7;
    for sw in Switches::all() {
        let s = space(&[SlotDeviceConfig::new(n)], sw, 2);
        let mut huge = Vec::new();
        while let Ok(h) = s.alloc_huge() {
            assert_eq!(h.offset() % CLUSTER_SLOTS, 0);
            assert!(h.offset() + CLUSTER_SLOTS <= n);
            huge.push(h);
        }
        // Cluster 0 holds the header slot, so only clusters 1 and 2 are whole.
        assert_eq!(huge.len(), if sw.huge_cluster { 2 } else { 0 }, "{sw:?}");
        let mut singles = Vec::new();
        while let Ok(e) = s.alloc() {
            singles.push(e);
        }
        assert_eq!(singles.len() as u64 + huge.len() as u64 * CLUSTER_SLOTS, n - 1);
        assert!(
            singles.iter().any(|e| e.offset() >= 3 * CLUSTER_SLOTS),
            "tail slots are used"
        );
        s.check_invariants().unwrap();
        for h in huge {
            s.free_huge(h).unwrap();
        }
        s.free_batch(&mut singles).unwrap();
        s.drain_slot_caches();
        s.check_invariants().unwrap();
        assert_eq!(s.nr_free(), n - 1);
    }
}

#[test]
fn full_device_is_a_clean_error_and_recovers() {
    let s = space(&[SlotDeviceConfig::new(2 * CLUSTER_SLOTS)], Switches::DEFAULT, 4);
    let mut all = Vec::new();
    loop {
        match s.alloc() {
            Ok(e) => all.push(e),
            Err(e) => {
                assert_eq!(
                    e,
                    SwapError::Full {
                        slots: 2 * CLUSTER_SLOTS - 1
                    }
                );
                assert!(e.to_string().contains("swap space is full"));
                break;
            }
        }
    }
    assert_eq!(all.len() as u64, 2 * CLUSTER_SLOTS - 1);
    s.check_invariants().unwrap();
    // Repeated failures change nothing.
    for _ in 0..10 {
        assert!(s.alloc().is_err());
    }
    s.check_invariants().unwrap();
    let e = all.pop().unwrap();
    s.free(e).unwrap();
    assert_eq!(s.alloc().unwrap(), e, "the one freed slot is found again");
    all.push(e);
    for e in all {
        assert_eq!(s.count(e).unwrap(), 1);
    }
}

#[test]
fn count_overflow_and_continuation() {
    let s = space(&[SlotDeviceConfig::new(1000)], Switches::DEFAULT, 1);
    let e = s.alloc().unwrap();
    // Past SWAP_MAP_MAX the count continues in the continuation array.
    for i in 2..=200u32 {
        assert_eq!(s.dup(e).unwrap(), i);
    }
    s.check_invariants().unwrap();
    for i in (0..200u32).rev() {
        assert_eq!(s.free(e).unwrap(), i);
    }
    assert_eq!(s.count(e).unwrap(), 0);
    assert!(matches!(s.free(e), Err(SwapError::BadEntry { .. })));
    assert!(matches!(s.dup(e), Err(SwapError::BadEntry { .. })));
    // The hard limit.
    let e = s.alloc().unwrap();
    s.devices()[0].set_continued_for_test(e.offset(), u32::MAX - SWAP_MAP_MAX as u32);
    assert_eq!(s.count(e).unwrap(), u32::MAX);
    assert_eq!(
        s.dup(e),
        Err(SwapError::CountOverflow {
            device: 0,
            offset: e.offset()
        })
    );
    assert_eq!(s.count(e).unwrap(), u32::MAX, "a failed dup changes nothing");
    s.check_invariants().unwrap();
}

#[test]
fn bad_input_is_refused_with_a_reason() {
    let r = Registry::new();
    assert_eq!(SwapSpace::builder().build(&r).err(), Some(SwapError::NoDevices));
    let e = SwapSpace::builder()
        .device(SlotDeviceConfig::new(0))
        .build(&r)
        .err()
        .unwrap();
    assert!(e.to_string().contains("0 slots is too small"), "{e}");
    let e = SwapSpace::builder()
        .device(SlotDeviceConfig::new(MAX_DEVICE_SLOTS + 1))
        .build(&r)
        .err()
        .unwrap();
    assert!(e.to_string().contains("too large"), "{e}");
    let mut b = SwapSpace::builder();
    for _ in 0..=MAX_DEVICES {
        b = b.device(SlotDeviceConfig::new(10));
    }
    assert_eq!(
        b.build(&r).err(),
        Some(SwapError::TooManyDevices(MAX_DEVICES + 1))
    );
    assert!(SwapSpace::builder()
        .device(SlotDeviceConfig::new(10))
        .cpus(0)
        .build(&r)
        .is_err());
    let s = space(&[SlotDeviceConfig::new(10)], Switches::DEFAULT, 1);
    assert!(matches!(
        s.free(SwapEntry::new(3, 1)),
        Err(SwapError::BadEntry {
            reason: "no such device",
            ..
        })
    ));
    assert!(matches!(
        s.count(SwapEntry::new(0, 10)),
        Err(SwapError::BadEntry { .. })
    ));
    assert!(matches!(
        s.free_huge(SwapEntry::new(0, 1)),
        Err(SwapError::BadEntry { .. })
    ));
}

#[test]
fn priorities_and_round_robin() {
    let s = space(
        &[
            SlotDeviceConfig::new(CLUSTER_SLOTS * 2).priority(1),
            SlotDeviceConfig::new(CLUSTER_SLOTS * 2).priority(9),
            SlotDeviceConfig::new(CLUSTER_SLOTS * 2).priority(9),
        ],
        Switches {
            slot_cache: false,
            ..Switches::DEFAULT
        },
        1,
    );
    let mut per_dev = [0u32; 3];
    let mut all = Vec::new();
    for _ in 0..200 {
        let e = s.alloc().unwrap();
        per_dev[e.device() as usize] += 1;
        all.push(e);
    }
    assert_eq!(per_dev[0], 0, "the low-priority device waits");
    assert_eq!(per_dev[1], 100, "equal priorities take turns");
    assert_eq!(per_dev[2], 100);
    // Fill both high-priority devices: allocation moves on to device 0.
    while all.iter().filter(|e| e.device() != 0).count() < 2 * (2 * CLUSTER_SLOTS as usize - 1) {
        let e = s.alloc().unwrap();
        assert_ne!(e.device(), 0, "device 0 used before the others filled");
        all.push(e);
    }
    assert!(s.devices()[1].is_full() && s.devices()[2].is_full());
    assert_eq!(s.alloc().unwrap().device(), 0);
    s.check_invariants().unwrap();
    // A freed slot puts its device back on the avail list, ahead of device 0.
    let e = *all.iter().find(|e| e.device() == 2).unwrap();
    s.free(e).unwrap();
    s.check_invariants().unwrap();
    assert_eq!(s.alloc().unwrap(), e);
}

#[test]
fn huge_units_take_whole_clusters_and_fall_back() {
    let s = space(&[SlotDeviceConfig::new(4 * CLUSTER_SLOTS)], Switches::DEFAULT, 2);
    let h = s.alloc_huge().unwrap();
    assert_eq!(h.offset() % CLUSTER_SLOTS, 0);
    for o in h.offset()..h.offset() + CLUSTER_SLOTS {
        assert_eq!(s.count(SwapEntry::new(0, o)).unwrap(), 1);
    }
    assert_eq!(s.devices()[0].cluster_list_lens()[ListId::Full as usize], 1);
    // A dup on one slot forces the slot-by-slot free; that slot survives.
    let kept = SwapEntry::new(0, h.offset() + 7);
    s.dup(kept).unwrap();
    s.free_huge(h).unwrap();
    assert_eq!(s.count(kept).unwrap(), 1);
    s.free(kept).unwrap();
    s.drain_slot_caches();
    s.check_invariants().unwrap();
    // Fragment every cluster: huge allocation fails cleanly.
    let mut held = Vec::new();
    for c in 0..4 {
        let e = SwapEntry::new(0, c * CLUSTER_SLOTS + 100);
        held.push(e);
    }
    let mut all = Vec::new();
    while let Ok(e) = s.alloc() {
        all.push(e);
    }
    let keep: HashSet<_> = held.iter().copied().collect();
    let (keep, rest): (Vec<_>, Vec<_>) = all.into_iter().partition(|e| keep.contains(e));
    let mut rest = rest;
    s.free_batch(&mut rest).unwrap();
    assert_eq!(keep.len(), 4);
    assert_eq!(s.alloc_huge(), Err(SwapError::NoFreeCluster));
    s.check_invariants().unwrap();
}

// ---- model test ----

#[derive(Clone, Debug)]
enum Op {
    Alloc(u8),
    AllocHuge,
    Free(usize),
    FreeBatch(u8),
    Dup(usize),
    DupHuge(usize, u16),
    FreeHuge(usize),
    Drain,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1u8..80).prop_map(Op::Alloc),
        1 => Just(Op::AllocHuge),
        4 => any::<usize>().prop_map(Op::Free),
        1 => (1u8..100).prop_map(Op::FreeBatch),
        2 => any::<usize>().prop_map(Op::Dup),
        1 => (any::<usize>(), 0u16..512).prop_map(|(a, b)| Op::DupHuge(a, b)),
        1 => any::<usize>().prop_map(Op::FreeHuge),
        1 => Just(Op::Drain),
    ]
}

/// The reference model: a count per allocated slot; huge units kept apart
/// until freed.
#[derive(Default)]
struct Model {
    counts: BTreeMap<SwapEntry, u32>,
    huge: Vec<SwapEntry>,
}

impl Model {
    fn allocated(&self) -> u64 {
        self.counts.len() as u64
    }
}

fn run_model(devs: &[SlotDeviceConfig], sw: Switches, ops: &[Op]) -> Result<(), TestCaseError> {
    let s = space(devs, sw, 3);
    let total: u64 = devs.iter().map(|d| d.slots - 1).sum();
    let mut m = Model::default();
    let key = |m: &Model, i: usize| -> Option<SwapEntry> {
        let singles: Vec<_> = m
            .counts
            .keys()
            .copied()
            .filter(|e| {
                !m.huge.iter().any(|h| {
                    h.device() == e.device() && (e.offset() / CLUSTER_SLOTS) == h.offset() / CLUSTER_SLOTS
                })
            })
            .collect();
        (!singles.is_empty()).then(|| singles[i % singles.len()])
    };
    for op in ops {
        match *op {
            Op::Alloc(n) => {
                for _ in 0..n {
                    match s.alloc() {
                        Ok(e) => {
                            prop_assert!(!m.counts.contains_key(&e), "{:?} handed out twice", e);
                            prop_assert!(e.offset() >= 1 && e.offset() < devs[e.device() as usize].slots);
                            m.counts.insert(e, 1);
                        }
                        Err(err) => {
                            prop_assert_eq!(err, SwapError::Full { slots: total });
                            prop_assert_eq!(m.allocated(), total, "Full while slots are free");
                        }
                    }
                }
            }
            Op::AllocHuge => match s.alloc_huge() {
                Ok(h) => {
                    prop_assert!(sw.huge_cluster);
                    prop_assert_eq!(h.offset() % CLUSTER_SLOTS, 0);
                    for o in h.offset()..h.offset() + CLUSTER_SLOTS {
                        let e = SwapEntry::new(h.device(), o);
                        prop_assert!(!m.counts.contains_key(&e), "huge slot {:?} handed out twice", e);
                        m.counts.insert(e, 1);
                    }
                    m.huge.push(h);
                }
                Err(err) => prop_assert_eq!(err, SwapError::NoFreeCluster),
            },
            Op::Free(i) => {
                if let Some(e) = key(&m, i) {
                    let c = m.counts.get_mut(&e).unwrap();
                    *c -= 1;
                    let left = *c;
                    if left == 0 {
                        m.counts.remove(&e);
                    }
                    prop_assert_eq!(s.free(e).unwrap(), left);
                }
            }
            Op::FreeBatch(n) => {
                let mut batch = Vec::new();
                for i in 0..n as usize {
                    if let Some(e) = key(&m, i * 7919) {
                        if batch.contains(&e) {
                            continue;
                        }
                        let c = m.counts.get_mut(&e).unwrap();
                        *c -= 1;
                        if *c == 0 {
                            m.counts.remove(&e);
                        }
                        batch.push(e);
                    }
                }
                s.free_batch(&mut batch).unwrap();
            }
            Op::Dup(i) => {
                if let Some(e) = key(&m, i) {
                    let c = m.counts.get_mut(&e).unwrap();
                    *c += 1;
                    prop_assert_eq!(s.dup(e).unwrap(), *c);
                }
            }
            Op::DupHuge(i, k) => {
                if !m.huge.is_empty() {
                    let h = m.huge[i % m.huge.len()];
                    let e = SwapEntry::new(h.device(), h.offset() + k as u64);
                    let c = m.counts.get_mut(&e).unwrap();
                    *c += 1;
                    prop_assert_eq!(s.dup(e).unwrap(), *c);
                }
            }
            Op::FreeHuge(i) => {
                if !m.huge.is_empty() {
                    let h = m.huge.swap_remove(i % m.huge.len());
                    for o in h.offset()..h.offset() + CLUSTER_SLOTS {
                        let e = SwapEntry::new(h.device(), o);
                        let c = m.counts.get_mut(&e).unwrap();
                        *c -= 1;
                        if *c == 0 {
                            m.counts.remove(&e);
                        }
                    }
                    s.free_huge(h).unwrap();
                }
            }
            Op::Drain => {
                s.drain_slot_caches();
                prop_assert_eq!(s.nr_free(), total - m.allocated(), "free count after drain");
            }
        }
        if let Err(e) = s.check_invariants() {
            return Err(TestCaseError::fail(format!("after {op:?}: {e}")));
        }
    }
    // Every count matches the model; then free everything: all free again.
    for (e, c) in &m.counts {
        prop_assert_eq!(s.count(*e).unwrap(), *c);
    }
    s.drain_slot_caches();
    prop_assert_eq!(s.nr_free(), total - m.allocated());
    let mut rest: Vec<SwapEntry> = Vec::new();
    for (e, c) in &m.counts {
        for _ in 0..*c {
            rest.push(*e);
        }
    }
    for e in rest {
        s.free(e).unwrap();
    }
    s.drain_slot_caches();
    prop_assert_eq!(s.nr_free(), total);
    s.check_invariants().map_err(TestCaseError::fail)?;
    Ok(())
}

fn devices() -> impl Strategy<Value = Vec<SlotDeviceConfig>> {
    prop::collection::vec(
        ((2u64..5 * CLUSTER_SLOTS), 0i32..3, any::<bool>(), any::<bool>(), any::<bool>()).prop_map(
            |(n, p, r, g, c)| SlotDeviceConfig::new(n).priority(p).rotational(r).grows(g).compact(c),
        ),
        1..4,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn model_every_switch_combination(devs in devices(), ops in prop::collection::vec(op(), 1..120)) {
        for sw in Switches::all() {
            run_model(&devs, sw, &ops)?;
        }
    }
}

/// A device whose backing grows as it is written, and any compact one,
/// takes a cluster never used only when no freed or partly used one is
/// left: filled, half freed, filled again, the slots handed out stay in
/// the clusters used before; a device that is neither moves on to fresh
/// ones (the kernel's order).
#[test]
fn a_compact_device_takes_freed_clusters_before_fresh_ones() {
    for (grows, compact) in [(true, false), (false, true), (true, true), (false, false)] {
        let cfg = SlotDeviceConfig::new(64 * CLUSTER_SLOTS).grows(grows).compact(compact);
        let s = space(&[cfg], Switches::DEFAULT, 1);
        let first: Vec<SwapEntry> = (0..8 * CLUSTER_SLOTS).map(|_| s.alloc().unwrap()).collect();
        let highest = first.iter().map(|e| e.offset()).max().unwrap();
        // Free every other cluster's slots whole, and half of the others.
        for (i, e) in first.iter().enumerate() {
            let cluster = e.offset() / CLUSTER_SLOTS;
            if cluster.is_multiple_of(2) || i.is_multiple_of(2) {
                s.free(*e).unwrap();
            }
        }
        s.drain_slot_caches();
        let again: Vec<SwapEntry> = (0..4 * CLUSTER_SLOTS).map(|_| s.alloc().unwrap()).collect();
        let past = again.iter().filter(|e| e.offset() > highest + CLUSTER_SLOTS).count();
        if grows || compact {
            assert_eq!(past, 0, "grows {grows}, compact {compact}: {past} slots of fresh clusters");
        } else {
            assert!(past > 0, "the fifo free list moves on to fresh clusters");
        }
        s.check_invariants().unwrap();
    }
}

/// A growing device under churn (slots freed at random, so that
/// clusters seldom empty whole, as a program's pages go at a small
/// budget) keeps to the clusters it has used while a quarter or more of
/// one is free: the span of slots ever written stays near the live
/// count, not the number of allocations made.  So does a compact device
/// that does not grow; one in the kernel's order sweeps the device.
#[test]
fn a_compact_device_reuses_partly_used_clusters_under_churn() {
    for (grows, compact) in [(true, false), (false, true), (false, false)] {
        let cfg = SlotDeviceConfig::new(1024 * CLUSTER_SLOTS).grows(grows).compact(compact);
        let highest = churn(cfg, 2 * CLUSTER_SLOTS as usize, 100 * CLUSTER_SLOTS);
        // 100 clusters' worth of allocations, 2 live: the slots stay
        // within a few clusters of the live count (8 would be 4x it).
        if grows || compact {
            assert!(highest < 8 * CLUSTER_SLOTS, "grows {grows}, compact {compact}: slots up to {highest}");
        } else {
            assert!(highest > 90 * CLUSTER_SLOTS, "the kernel's order stopped at {highest}");
        }
    }
}

/// `allocs` allocations on a device of `cfg`, `live` held at once and a
/// random one freed for each past that; the highest slot handed out.
fn churn(cfg: SlotDeviceConfig, live: usize, allocs: u64) -> u64 {
    let s = space(&[cfg], Switches::DEFAULT, 1);
    let mut held: Vec<SwapEntry> = Vec::new();
    let mut highest = 0;
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..allocs {
        let e = s.alloc().unwrap();
        highest = highest.max(e.offset());
        held.push(e);
        if held.len() > live {
            // A random one goes: clusters seldom empty whole.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let i = (x % held.len() as u64) as usize;
            s.free(held.swap_remove(i)).unwrap();
        }
    }
    s.check_invariants().unwrap();
    highest
}

// ---- concurrency stress ----

/// `threads` threads doing `ops_total` random operations between them on a
/// space small enough to fill up and fragment; every handed-out slot is
/// claimed in a side table, so a slot handed out twice is caught at once.
fn stress(sw: Switches, threads: usize, ops_total: usize) {
    let devs = [
        SlotDeviceConfig::new(6 * CLUSTER_SLOTS + 100).priority(2),
        SlotDeviceConfig::new(3 * CLUSTER_SLOTS).priority(2),
        SlotDeviceConfig::new(2 * CLUSTER_SLOTS + 1)
            .priority(1)
            .rotational(true),
    ];
    let reg = Registry::new();
    let mut b = SwapSpace::builder().switches(sw).cpus(4).trunk_slots(1024);
    for d in &devs {
        b = b.device(d.clone());
    }
    let s = b.build(&reg).unwrap();
    let owner: Vec<Vec<AtomicU8>> = devs
        .iter()
        .map(|d| (0..d.slots).map(|_| AtomicU8::new(0)).collect())
        .collect();
    let total: u64 = devs.iter().map(|d| d.slots - 1).sum();
    // Threads start together and hold what they have until all are done,
    // so they overlap even where the scheduler would run them one by one.
    let start = std::sync::Barrier::new(threads);
    let end = std::sync::Barrier::new(threads);
    std::thread::scope(|sc| {
        for t in 0..threads {
            let (s, owner, start, end) = (&s, &owner, &start, &end);
            sc.spawn(move || {
                start.wait();
                let mut rng = 0x1234_5678_9abc_def1u64 ^ (t as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                let mut next = move || {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng
                };
                let claim = |e: SwapEntry| {
                    let prev =
                        owner[e.device() as usize][e.offset() as usize].fetch_add(1, Ordering::Relaxed);
                    assert_eq!(prev, 0, "{e:?} handed out twice");
                };
                let release = |e: SwapEntry| {
                    owner[e.device() as usize][e.offset() as usize].store(0, Ordering::Relaxed)
                };
                let mut mine: Vec<SwapEntry> = Vec::new();
                let mut huge: Vec<SwapEntry> = Vec::new();
                // Allocations outnumber frees until each thread holds its
                // share plus a fifth: the space runs full and fragments.
                let limit = (total as usize / threads) * 6 / 5;
                // A 2 MB unit while clusters are still free (later, random
                // frees rarely empty a whole cluster again).
                if let Ok(h) = s.alloc_huge() {
                    for o in 0..CLUSTER_SLOTS {
                        claim(SwapEntry::new(h.device(), h.offset() + o));
                    }
                    huge.push(h);
                }
                // Fill to the limit first; eight threads asking for 120% of
                // the space between them run it full.
                while mine.len() < limit {
                    match s.alloc() {
                        Ok(e) => {
                            claim(e);
                            mine.push(e);
                        }
                        Err(SwapError::Full { .. }) => break,
                        Err(e) => panic!("{e}"),
                    }
                }
                for _ in 0..ops_total / threads {
                    let r = next() % 100;
                    if r < 60 {
                        if mine.len() >= limit {
                            continue;
                        }
                        if let Ok(e) = s.alloc() {
                            claim(e);
                            mine.push(e);
                        }
                    } else if r < 61 && huge.len() < 2 {
                        if let Ok(h) = s.alloc_huge() {
                            for o in 0..CLUSTER_SLOTS {
                                claim(SwapEntry::new(h.device(), h.offset() + o));
                            }
                            huge.push(h);
                        }
                    } else if r < 62 {
                        if let Some(h) = huge.pop() {
                            for o in 0..CLUSTER_SLOTS {
                                release(SwapEntry::new(h.device(), h.offset() + o));
                            }
                            s.free_huge(h).unwrap();
                        }
                    } else if r < 67 && !mine.is_empty() {
                        // dup then drop: the count must come back.
                        let e = mine[next() as usize % mine.len()];
                        assert_eq!(s.dup(e).unwrap(), 2);
                        assert_eq!(s.free(e).unwrap(), 1);
                    } else if r < 68 && mine.len() > 8 {
                        let mut batch: Vec<SwapEntry> = mine.drain(..8).collect();
                        for e in &batch {
                            release(*e);
                        }
                        s.free_batch(&mut batch).unwrap();
                    } else if !mine.is_empty() {
                        let e = mine.swap_remove(next() as usize % mine.len());
                        release(e);
                        assert_eq!(s.free(e).unwrap(), 0);
                    }
                }
                end.wait();
                for e in &mine {
                    assert_eq!(s.count(*e).unwrap(), 1);
                }
                for h in huge {
                    for o in 0..CLUSTER_SLOTS {
                        release(SwapEntry::new(h.device(), h.offset() + o));
                    }
                    s.free_huge(h).unwrap();
                }
                for e in mine {
                    release(e);
                    s.free(e).unwrap();
                }
            });
        }
    });
    s.drain_slot_caches();
    s.check_invariants().unwrap_or_else(|e| panic!("{sw:?}: {e}"));
    assert_eq!(s.nr_free(), total, "{sw:?}: slots leaked");
    let st = reg.snapshot();
    eprintln!(
        "{sw:?}: alloc {} (failed {}), free {}, huge {} (fallback {}), dup {}",
        st.counters.alloc,
        st.counters.alloc_fail,
        st.counters.free,
        st.counters.huge_alloc,
        st.counters.huge_fallback,
        st.counters.dup
    );
    // The run must have exercised the paths it claims to.
    assert!(st.counters.alloc - st.counters.alloc_fail > ops_total as u64 / 4);
    assert!(st.counters.alloc_fail > 0, "the space never ran full");
    assert!(st.counters.free > ops_total as u64 / 4);
    if sw.huge_cluster {
        assert!(st.counters.huge_alloc > 0);
    }
}

#[test]
fn stress_every_switch_combination() {
    // A million operations per combination, in debug and release builds.
    let ops = 1_000_000;
    for sw in Switches::all() {
        stress(sw, 8, ops);
    }
}
