//! The LRU against a reference model, and many threads against its
//! invariants.

use super::*;
use proptest::prelude::*;
use std::collections::VecDeque;

const MODES: [LruBatch; 4] = [
    LruBatch::Pages(31),
    LruBatch::Pages(15),
    LruBatch::Pages(1),
    LruBatch::Unbatched,
];

fn lru(capacity: u32, batch: LruBatch) -> (Lru, Arc<Registry>) {
    let reg = Registry::new();
    let lru = Lru::new(LruConfig::new(capacity).batch(batch), &reg).unwrap();
    (lru, reg)
}

#[test]
fn lru_is_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<Lru>();
}

#[test]
fn lru_config_validation() {
    let reg = Registry::new();
    assert_eq!(
        Lru::new(LruConfig::new(0), &reg).unwrap_err(),
        LruError::ZeroCapacity
    );
    for bad in [0, MAX_BATCH + 1] {
        assert_eq!(
            Lru::new(LruConfig::new(8).batch(LruBatch::Pages(bad)), &reg).unwrap_err(),
            LruError::BadBatch(bad)
        );
    }
    assert_eq!(
        Lru::new(LruConfig::new(8).cpus(0), &reg).unwrap_err(),
        LruError::ZeroCpus
    );
    let l = Lru::new(LruConfig::new(8).batch(LruBatch::Pages(MAX_BATCH)), &reg).unwrap();
    assert_eq!(l.batch_mode(), LruBatch::Pages(MAX_BATCH));
    assert_eq!(LruConfig::new(8).batch, LruBatch::Pages(31));
    assert!(LruConfig::new(8).cpus >= 1);
}

#[test]
fn lru_add_goes_inactive_after_drain() {
    for mode in MODES {
        let (l, reg) = lru(16, mode);
        assert!(l.add(3));
        assert!(l.is_resident(3));
        assert!(!l.add(3), "double add must be refused");
        l.drain_all();
        assert!(l.on_lru(3) && !l.is_active(3));
        assert_eq!((l.nr_inactive(), l.nr_active()), (1, 0));
        assert_eq!(reg.snapshot().counters.lru_add, 1);
        l.check_invariants().unwrap();
    }
}

#[test]
fn lru_batched_add_waits_for_drain_or_full_batch() {
    // One batch slot, so the thread's CPU does not matter.
    let reg = Registry::new();
    let l = Lru::new(LruConfig::new(64).batch(LruBatch::Pages(4)).cpus(1), &reg).unwrap();
    for p in 0..3 {
        l.add(p);
    }
    assert_eq!(l.nr_inactive(), 0, "three adds sit in the batch");
    assert!(!l.on_lru(0));
    l.add(3);
    assert_eq!(l.nr_inactive(), 4, "the fourth fills and flushes it");
    assert_eq!(reg.snapshot().counters.lru_drain, 1);
    // Flushed in order: the last added is at the head.
    assert_eq!(l.lists_snapshot().0, vec![3, 2, 1, 0]);
}

#[test]
fn lru_activate_moves_to_active() {
    for mode in MODES {
        let (l, reg) = lru(16, mode);
        for p in 0..4 {
            l.add(p);
        }
        l.drain_all();
        l.activate(1);
        l.activate(2);
        l.activate(2);
        l.drain_all();
        assert!(l.is_active(1) && l.is_active(2) && !l.is_active(0));
        assert_eq!((l.nr_inactive(), l.nr_active()), (2, 2));
        assert_eq!(l.lists_snapshot(), (vec![3, 0], vec![2, 1]));
        assert_eq!(reg.snapshot().counters.lru_activate, 2);
        // Absent pages: no-op.
        l.activate(9);
        l.drain_all();
        assert!(!l.on_lru(9));
        l.check_invariants().unwrap();
    }
}

#[test]
fn lru_activate_while_queued_for_add_adds_active() {
    let (l, _reg) = lru(16, LruBatch::Pages(31));
    l.add(5);
    l.activate(5);
    l.drain_all();
    assert!(l.is_active(5));
    // And deactivate while queued undoes it.
    l.add(6);
    l.activate(6);
    l.deactivate(6);
    l.drain_all();
    assert!(l.on_lru(6) && !l.is_active(6));
    l.check_invariants().unwrap();
}

#[test]
fn lru_last_request_wins_while_batched() {
    for mode in MODES {
        let (lru, _) = lru(64, mode);
        for p in 0..8 {
            lru.add(p);
        }
        lru.drain_all();
        lru.activate(1);
        lru.drain_all();
        // Deactivate then activate before any drain: stays active.
        lru.deactivate(1);
        lru.activate(1);
        // Activate then deactivate before any drain: stays inactive.
        lru.activate(2);
        lru.deactivate(2);
        // Cancel and re-request: one move, no double queueing.
        lru.activate(3);
        lru.deactivate(3);
        lru.activate(3);
        lru.drain_all();
        assert!(lru.is_active(1), "{mode:?}");
        assert!(!lru.is_active(2), "{mode:?}");
        assert!(lru.is_active(3), "{mode:?}");
        assert_eq!(lru.nr_active(), 2);
        lru.check_invariants().unwrap();
    }
}

#[test]
fn lru_deactivate_moves_to_inactive_head() {
    for mode in MODES {
        let (l, _reg) = lru(16, mode);
        for p in 0..4 {
            l.add(p);
            l.activate(p);
        }
        l.drain_all();
        assert_eq!(l.nr_active(), 4);
        l.mark_referenced(2);
        l.deactivate(2);
        l.deactivate(7); // absent: no-op
        l.drain_all();
        assert!(!l.is_active(2) && l.on_lru(2));
        assert!(!l.is_referenced(2), "deactivation clears referenced");
        assert_eq!(l.lists_snapshot(), (vec![2], vec![3, 1, 0]));
        l.check_invariants().unwrap();
    }
}

/// A batch removal equals removing one by one: linked pages unlinked,
/// queued adds withdrawn, absent pages skipped, under one acquisition.
#[test]
fn lru_remove_batch() {
    for mode in MODES {
        let (l, reg) = lru(32, mode);
        for p in 0..10 {
            l.add(p);
        }
        l.drain_all();
        l.activate(3);
        l.drain_all();
        for p in 10..13 {
            l.add(p); // queued (batched modes) or linked
        }
        let before = reg.snapshot();
        assert_eq!(l.remove_batch(&[0, 3, 5, 11, 20, 21]), 4, "{mode:?}");
        let acq = reg.snapshot().since(&before).locks.lru.acquisitions;
        assert_eq!(acq, 1, "{mode:?}: one lock acquisition");
        for p in [0, 3, 5, 11] {
            assert!(!l.on_lru(p), "{mode:?}: {p}");
        }
        l.drain_all();
        assert!(!l.on_lru(11), "{mode:?}: the withdrawn add stays withdrawn");
        assert_eq!(l.nr_active() + l.nr_inactive(), 9, "{mode:?}");
        l.check_invariants().unwrap();
        // Removed pages can come back.
        assert!(l.add(3));
    }
}

/// Pin the calling thread to `cpu`.
fn pin(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET and
    // sched_setaffinity only read and write it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set), 0);
    }
}

/// The local shrink drains only this CPU's batch: pages another CPU
/// has batched stay there (the kernel's `lru_add_drain`), and the full
/// shrink finds them.
#[test]
fn lru_local_shrink_leaves_other_cpus_batches() {
    let cpus = crate::percpu::possible_cpus();
    let (l, _) = lru(64, LruBatch::Pages(31));
    std::thread::scope(|s| {
        s.spawn(|| {
            pin(0);
            for p in 0..5 {
                l.add(p);
            }
            let mut v = [0; 16];
            assert_eq!(l.shrink_inactive_local(16, &mut v), 5, "its own batch is drained");
            if cpus < 2 {
                return;
            }
            std::thread::scope(|s2| {
                s2.spawn(|| {
                    pin(1);
                    for p in 10..15 {
                        l.add(p);
                    }
                });
            });
            assert_eq!(l.shrink_inactive_local(16, &mut v), 0, "CPU 1's batch is not");
            assert_eq!(l.shrink_inactive(16, &mut v), 5, "the full shrink drains it");
            assert_eq!(&v[..5], &[10, 11, 12, 13, 14]);
            l.check_invariants().unwrap();
        });
    });
}

#[test]
fn lru_shrink_gives_referenced_pages_a_second_chance() {
    for mode in MODES {
        let (l, reg) = lru(16, mode);
        for p in 0..6 {
            l.add(p);
        }
        // Inactive, head first: 5 4 3 2 1 0; page 0 is the tail.
        l.mark_referenced(0);
        l.mark_referenced(2);
        let mut victims = [0; 8];
        let n = l.shrink_inactive(4, &mut victims);
        assert_eq!(&victims[..n], &[1, 3], "{mode:?}");
        assert!(l.is_active(0) && l.is_active(2));
        assert!(!l.is_referenced(0) && !l.is_referenced(2));
        assert!(!l.on_lru(1) && !l.is_resident(1));
        assert_eq!(l.lists_snapshot(), (vec![5, 4], vec![2, 0]));
        let s = reg.snapshot();
        assert_eq!(s.counters.lru_rotated, 2);
        assert_eq!(s.counters.lru_isolated, 2);
        // Victims buffer bounds the isolation.
        let n = l.shrink_inactive(100, &mut victims[..1]);
        assert_eq!((n, victims[0]), (1, 4));
        // An isolated page can come back.
        assert!(l.add(1));
        l.check_invariants().unwrap();
        assert!(!l.remove(4), "isolated pages are off the LRU");
    }
}

#[test]
fn lru_age_active() {
    for mode in MODES {
        let (l, reg) = lru(16, mode);
        for p in 0..4 {
            l.add(p);
            l.activate(p);
        }
        // Active, head first: 3 2 1 0.
        l.mark_referenced(0);
        l.mark_referenced(3);
        assert_eq!(l.age_active(100), 2, "{mode:?}");
        // 0 rotated first, then 1 and 2 deactivated, then 3 rotated.
        assert_eq!(l.lists_snapshot(), (vec![2, 1], vec![3, 0]));
        assert!(!l.is_referenced(0) && !l.is_referenced(3));
        assert_eq!(reg.snapshot().counters.lru_rotated, 2);
        assert_eq!(l.age_active(1), 1);
        assert_eq!(l.lists_snapshot(), (vec![0, 2, 1], vec![3]));
        assert_eq!(l.age_active(0), 0);
        l.check_invariants().unwrap();
    }
}

#[test]
fn lru_remove_of_page_still_in_a_batch() {
    for mode in MODES {
        let (l, reg) = lru(16, mode);
        // Queued for add, then removed: the stale entry is skipped.
        l.add(1);
        assert!(l.remove(1));
        assert!(!l.remove(1));
        l.drain_all();
        assert!(!l.on_lru(1));
        // Queued for activation, removed, re-added: the old activation
        // does not apply to the new residency.
        l.add(2);
        l.drain_all();
        l.activate(2);
        assert!(l.remove(2));
        assert!(l.add(2));
        l.drain_all();
        assert!(l.on_lru(2) && !l.is_active(2), "{mode:?}");
        // Removed and re-added while the add is queued: linked once.
        l.add(3);
        assert!(l.remove(3));
        assert!(l.add(3));
        l.drain_all();
        assert!(l.on_lru(3));
        assert_eq!(l.nr_inactive(), 2);
        l.check_invariants().unwrap();
        assert_eq!(reg.snapshot().counters.lru_remove, 3);
    }
}

#[test]
fn lru_capacity_edges() {
    for mode in MODES {
        let (l, _reg) = lru(1, mode);
        assert!(l.add(0));
        l.activate(0);
        l.drain_all();
        assert!(l.is_active(0));
        assert_eq!(l.age_active(5), 1);
        let mut v = [PageId::MAX; 2];
        assert_eq!(l.shrink_inactive(5, &mut v), 1);
        assert_eq!(v[0], 0);
        assert_eq!(l.shrink_inactive(5, &mut v), 0);
        l.check_invariants().unwrap();

        let cap = 1000;
        let (l, _reg) = lru(cap, mode);
        let last = cap - 1;
        assert!(l.add(last));
        assert!(l.add(0));
        l.activate(last);
        l.drain_all();
        assert!(l.is_active(last));
        assert!(l.remove(last));
        assert!(l.add(last));
        l.drain_all();
        assert_eq!(l.lists_snapshot(), (vec![last, 0], vec![]));
        l.check_invariants().unwrap();
    }
}

#[test]
#[should_panic]
fn lru_page_beyond_capacity_panics() {
    let (l, _reg) = lru(4, LruBatch::Pages(31));
    l.add(4);
}

// ---- Model test ----------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum St {
    Absent,
    Queued { active: bool },
    Inactive,
    Active,
}

/// The reference model: two deques (front = head), per-page state, and
/// the batched semantics spelt out: each kind of operation waits in its
/// own batch of `batch` entries (0: applied at once), tagged with the
/// page's generation; a full batch is applied alone; a drain applies
/// adds, then deactivations, then activations.
struct Model {
    batch: usize,
    /// The neighbour window (`LruConfig::neighbours`).
    neighbours: u32,
    st: Vec<St>,
    referenced: Vec<bool>,
    /// A request waiting in a batch (the ACT_QUEUED / DEACT_QUEUED bits).
    intent: Vec<Option<Kind>>,
    gen: Vec<u32>,
    inactive: VecDeque<PageId>,
    active: VecDeque<PageId>,
    add: Vec<(PageId, u32)>,
    activate: Vec<(PageId, u32)>,
    deactivate: Vec<(PageId, u32)>,
}

impl Model {
    fn new(capacity: usize, batch: usize, neighbours: u32) -> Self {
        Model {
            batch,
            neighbours,
            st: vec![St::Absent; capacity],
            referenced: vec![false; capacity],
            intent: vec![None; capacity],
            gen: vec![0; capacity],
            inactive: VecDeque::new(),
            active: VecDeque::new(),
            add: Vec::new(),
            activate: Vec::new(),
            deactivate: Vec::new(),
        }
    }

    fn take(list: &mut VecDeque<PageId>, p: PageId) {
        let i = list.iter().position(|&x| x == p).expect("on list");
        list.remove(i);
    }

    fn apply(&mut self, kind: Kind, (p, g): (PageId, u32)) {
        let i = p as usize;
        if self.gen[i] != g {
            return;
        }
        match (kind, self.st[i]) {
            (Kind::Add, St::Queued { active }) => {
                if active {
                    self.active.push_front(p);
                    self.st[i] = St::Active;
                } else {
                    self.inactive.push_front(p);
                    self.st[i] = St::Inactive;
                }
            }
            (Kind::Activate, st) if self.intent[i] == Some(Kind::Activate) => {
                self.intent[i] = None;
                if st == St::Inactive {
                    Self::take(&mut self.inactive, p);
                    self.active.push_front(p);
                    self.st[i] = St::Active;
                }
            }
            (Kind::Deactivate, st) if self.intent[i] == Some(Kind::Deactivate) => {
                self.intent[i] = None;
                self.referenced[i] = false;
                if st == St::Active {
                    Self::take(&mut self.active, p);
                    self.inactive.push_front(p);
                    self.st[i] = St::Inactive;
                }
            }
            _ => {}
        }
    }

    fn queue(&mut self, kind: Kind, p: PageId) {
        let e = (p, self.gen[p as usize]);
        if self.batch == 0 {
            return self.apply(kind, e);
        }
        let b = match kind {
            Kind::Add => &mut self.add,
            Kind::Activate => &mut self.activate,
            Kind::Deactivate => &mut self.deactivate,
        };
        b.push(e);
        if b.len() == self.batch {
            let full = std::mem::take(b);
            for e in full {
                self.apply(kind, e);
            }
        }
    }

    fn drain(&mut self) {
        for e in std::mem::take(&mut self.add) {
            self.apply(Kind::Add, e);
        }
        for e in std::mem::take(&mut self.deactivate) {
            self.apply(Kind::Deactivate, e);
        }
        for e in std::mem::take(&mut self.activate) {
            self.apply(Kind::Activate, e);
        }
    }

    fn add(&mut self, p: PageId) -> bool {
        if self.st[p as usize] != St::Absent {
            return false;
        }
        if self.batch == 0 {
            self.inactive.push_front(p);
            self.st[p as usize] = St::Inactive;
        } else {
            self.st[p as usize] = St::Queued { active: false };
            self.queue(Kind::Add, p);
        }
        true
    }

    /// The last request wins: a pending opposite request is cancelled,
    /// and a request is queued only when the page is on the other list
    /// with no request of its kind pending.
    fn request(&mut self, p: PageId, kind: Kind) {
        let i = p as usize;
        let (want, other) = match kind {
            Kind::Activate => (St::Active, Kind::Deactivate),
            _ => (St::Inactive, Kind::Activate),
        };
        match self.st[i] {
            St::Queued { .. } => {
                let active = want == St::Active;
                self.st[i] = St::Queued { active };
                if !active {
                    self.referenced[i] = false;
                }
                return;
            }
            St::Absent => return,
            _ => {}
        }
        if self.intent[i] == Some(other) {
            self.intent[i] = None;
        }
        if self.st[i] == want || self.intent[i] == Some(kind) {
            return;
        }
        self.intent[i] = Some(kind);
        self.queue(kind, p);
    }

    fn activate(&mut self, p: PageId) {
        self.request(p, Kind::Activate)
    }

    fn deactivate(&mut self, p: PageId) {
        self.request(p, Kind::Deactivate)
    }

    fn mark_referenced(&mut self, p: PageId) {
        if self.st[p as usize] != St::Absent {
            self.referenced[p as usize] = true;
        }
    }

    fn depart(&mut self, p: PageId) {
        let i = p as usize;
        self.st[i] = St::Absent;
        self.referenced[i] = false;
        self.intent[i] = None;
        self.gen[i] = self.gen[i].wrapping_add(1);
    }

    fn remove(&mut self, p: PageId) -> bool {
        match self.st[p as usize] {
            St::Absent => return false,
            St::Inactive => Self::take(&mut self.inactive, p),
            St::Active => Self::take(&mut self.active, p),
            St::Queued { .. } => {}
        }
        self.depart(p);
        true
    }

    fn shrink(&mut self, nr_to_scan: usize, room: usize) -> Vec<PageId> {
        self.drain();
        let mut victims = Vec::new();
        let mut scanned = 0;
        while scanned < nr_to_scan && victims.len() < room {
            let Some(p) = self.inactive.pop_back() else {
                break;
            };
            scanned += 1;
            if self.referenced[p as usize] {
                self.referenced[p as usize] = false;
                self.active.push_front(p);
                self.st[p as usize] = St::Active;
            } else {
                self.depart(p);
                victims.push(p);
                // Its cold neighbours: inactive, unreferenced, nothing
                // queued, in id order, while there is room.
                let first = p / self.neighbours * self.neighbours;
                for q in first..(first + self.neighbours).min(self.st.len() as u32) {
                    if victims.len() >= room {
                        break;
                    }
                    let i = q as usize;
                    if q != p && self.st[i] == St::Inactive && !self.referenced[i] && self.intent[i].is_none() {
                        Self::take(&mut self.inactive, q);
                        self.depart(q);
                        victims.push(q);
                    }
                }
            }
        }
        victims
    }

    fn age(&mut self, nr_to_scan: usize) -> usize {
        self.drain();
        let mut deactivated = 0;
        for _ in 0..nr_to_scan.min(self.active.len()) {
            let p = self.active.pop_back().unwrap();
            if self.referenced[p as usize] {
                self.referenced[p as usize] = false;
                self.active.push_front(p);
            } else {
                self.inactive.push_front(p);
                self.st[p as usize] = St::Inactive;
                deactivated += 1;
            }
        }
        deactivated
    }
}

const MODEL_PAGES: u32 = 64;

#[derive(Clone, Debug)]
enum Op {
    Add(PageId),
    Activate(PageId),
    Deactivate(PageId),
    MarkReferenced(PageId),
    Remove(PageId),
    Drain,
    Shrink(usize, usize),
    Age(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let page = 0..MODEL_PAGES;
    prop_oneof![
        6 => page.clone().prop_map(Op::Add),
        5 => page.clone().prop_map(Op::Activate),
        2 => page.clone().prop_map(Op::Deactivate),
        3 => page.clone().prop_map(Op::MarkReferenced),
        2 => page.prop_map(Op::Remove),
        1 => Just(Op::Drain),
        1 => (0..24usize, 0..12usize).prop_map(|(n, r)| Op::Shrink(n, r)),
        1 => (0..24usize).prop_map(Op::Age),
    ]
}

fn run_model(mode: LruBatch, neighbours: u32, ops: &[Op]) -> Result<(), TestCaseError> {
    let reg = Registry::new();
    // One batch slot: the thread may migrate between CPUs, and the
    // model's batch-fill timing must be the implementation's.
    let l = Lru::new(
        LruConfig::new(MODEL_PAGES).batch(mode).cpus(1).neighbours(neighbours),
        &reg,
    )
    .unwrap();
    let batch = match mode {
        LruBatch::Unbatched => 0,
        LruBatch::Pages(n) => n,
    };
    let mut m = Model::new(MODEL_PAGES as usize, batch, neighbours);
    let mut victims = [0; 16];
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Add(p) => prop_assert_eq!(l.add(p), m.add(p), "op {}: {:?}", i, op),
            Op::Activate(p) => {
                l.activate(p);
                m.activate(p);
            }
            Op::Deactivate(p) => {
                l.deactivate(p);
                m.deactivate(p);
            }
            Op::MarkReferenced(p) => {
                l.mark_referenced(p);
                m.mark_referenced(p);
            }
            Op::Remove(p) => prop_assert_eq!(l.remove(p), m.remove(p), "op {}: {:?}", i, op),
            Op::Drain => {
                l.drain_all();
                m.drain();
            }
            Op::Shrink(n, room) => {
                let got = l.shrink_inactive(n, &mut victims[..room]);
                let want = m.shrink(n, room);
                prop_assert_eq!(&victims[..got], &want[..], "op {}: {:?}", i, op);
            }
            Op::Age(n) => prop_assert_eq!(l.age_active(n), m.age(n), "op {}: {:?}", i, op),
        }
        // The applied state is visible without draining.
        for p in 0..MODEL_PAGES {
            let st = m.st[p as usize];
            prop_assert_eq!(
                l.on_lru(p),
                matches!(st, St::Inactive | St::Active),
                "op {}: {:?}: page {} on_lru",
                i,
                op,
                p
            );
            prop_assert_eq!(l.is_active(p), st == St::Active, "op {}: page {}", i, p);
            prop_assert_eq!(l.is_resident(p), st != St::Absent);
            prop_assert_eq!(l.is_referenced(p), m.referenced[p as usize]);
        }
        prop_assert_eq!(l.nr_active(), m.active.len());
        prop_assert_eq!(l.nr_inactive(), m.inactive.len());
        if matches!(op, Op::Drain | Op::Shrink(..) | Op::Age(..)) {
            prop_assert_eq!(l.check_invariants(), Ok(()));
        }
    }
    l.drain_all();
    m.drain();
    let (inactive, active) = l.lists_snapshot();
    prop_assert_eq!(inactive, m.inactive.iter().copied().collect::<Vec<_>>());
    prop_assert_eq!(active, m.active.iter().copied().collect::<Vec<_>>());
    prop_assert_eq!(l.check_invariants(), Ok(()));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    #[test]
    fn lru_model_batch_31(ops in prop::collection::vec(op(), 1..400)) {
        run_model(LruBatch::Pages(31), 1, &ops)?;
    }

    #[test]
    fn lru_model_batch_31_neighbours_8(ops in prop::collection::vec(op(), 1..400)) {
        run_model(LruBatch::Pages(31), 8, &ops)?;
    }

    #[test]
    fn lru_model_unbatched_neighbours_4(ops in prop::collection::vec(op(), 1..400)) {
        run_model(LruBatch::Unbatched, 4, &ops)?;
    }

    #[test]
    fn lru_model_batch_15(ops in prop::collection::vec(op(), 1..400)) {
        run_model(LruBatch::Pages(15), 1, &ops)?;
    }

    #[test]
    fn lru_model_batch_1(ops in prop::collection::vec(op(), 1..400)) {
        run_model(LruBatch::Pages(1), 1, &ops)?;
    }

    #[test]
    fn lru_model_unbatched(ops in prop::collection::vec(op(), 1..400)) {
        run_model(LruBatch::Unbatched, 1, &ops)?;
    }
}

// ---- Concurrency stress --------------------------------------------

/// xorshift64*: a tiny deterministic generator per thread.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

const STRESS_PAGES: u32 = 1024;
const STRESS_THREADS: usize = 8;
/// Operations per worker thread (7 workers + 1 reclaimer).
const STRESS_OPS: usize = 150_000;

/// 7 workers hammer overlapping pages (every page is reachable from
/// every thread) with activate / deactivate / mark_referenced /
/// remove + re-add / drain_local; one reclaimer shrinks and ages,
/// re-adding most of its victims.  Ownership: a page is owned by the
/// LRU while resident; whoever removes or isolates it owns it until
/// re-adding it.  So the final resident set is known exactly.
fn stress(mode: LruBatch) {
    stress_with(mode, 1);
}

fn stress_with(mode: LruBatch, neighbours: u32) {
    let reg = Registry::new();
    let l = Lru::new(LruConfig::new(STRESS_PAGES).batch(mode).neighbours(neighbours), &reg).unwrap();
    for p in 0..STRESS_PAGES {
        assert!(l.add(p));
    }
    l.drain_all();
    let (held, ops): (Vec<Vec<PageId>>, Vec<u64>) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..STRESS_THREADS)
            .map(|t| {
                let l = &l;
                s.spawn(move || {
                    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((t as u64 + 1) * 0x1234_5678_9abc));
                    let mut held: Vec<PageId> = Vec::new();
                    let mut ops = 0u64;
                    if t == 0 {
                        let mut victims = [0; 32];
                        for i in 0..STRESS_OPS / 8 {
                            if i % 3 == 0 {
                                l.age_active(48);
                            } else {
                                let n = l.shrink_inactive(48, &mut victims);
                                held.extend_from_slice(&victims[..n]);
                            }
                            // Re-add all but a few of the victims.
                            while held.len() > 8 {
                                let p = held.swap_remove(rng.next() as usize % held.len());
                                assert!(l.add(p), "owned page {p} refused");
                                ops += 1;
                            }
                            ops += 1;
                        }
                    } else {
                        for _ in 0..STRESS_OPS {
                            let r = rng.next();
                            let p = ((r >> 16) % STRESS_PAGES as u64) as PageId;
                            match r % 32 {
                                0..=9 => l.activate(p),
                                10..=15 => l.deactivate(p),
                                16..=23 => l.mark_referenced(p),
                                24..=26 => {
                                    if l.remove(p) {
                                        held.push(p);
                                    }
                                }
                                27..=29 => {
                                    if let Some(q) = held.pop() {
                                        assert!(l.add(q), "owned page {q} refused");
                                        // Touch it right away, racing its add.
                                        if r & (1 << 40) != 0 {
                                            l.activate(q);
                                        }
                                    }
                                }
                                30 => l.drain_local(),
                                _ => {
                                    l.is_active(p);
                                    l.on_lru(p);
                                }
                            }
                            ops += 1;
                        }
                    }
                    (held, ops)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("stress thread panicked"))
            .unzip()
    });
    let total_ops: u64 = ops.iter().sum();
    assert!(total_ops >= 1_000_000, "only {total_ops} ops");
    l.drain_all();
    l.check_invariants().unwrap_or_else(|e| panic!("{mode:?}: {e}"));
    let mut out = vec![false; STRESS_PAGES as usize];
    for &p in held.iter().flatten() {
        assert!(!out[p as usize], "{mode:?}: page {p} owned by two threads");
        out[p as usize] = true;
    }
    let nr_out = out.iter().filter(|&&o| o).count();
    for p in 0..STRESS_PAGES {
        assert_eq!(
            l.on_lru(p),
            !out[p as usize],
            "{mode:?}: page {p} resident mismatch"
        );
        assert!(l.is_resident(p) == l.on_lru(p), "page {p} still queued");
    }
    assert_eq!(
        l.nr_active() + l.nr_inactive(),
        STRESS_PAGES as usize - nr_out,
        "{mode:?}"
    );
    // Every page that joined the LRU left it or is still there.
    let s = reg.snapshot();
    assert_eq!(
        s.counters.lru_add - s.counters.lru_remove - s.counters.lru_isolated,
        (STRESS_PAGES as usize - nr_out) as u64,
        "{mode:?}: {s:?}"
    );
    assert!(s.counters.lru_isolated > 0 && s.counters.lru_remove > 0);
    assert!(s.counters.lru_activate > 0 && s.counters.lru_deactivate > 0);
}

#[test]
fn lru_stress_batch_31() {
    stress(LruBatch::Pages(31));
}

#[test]
fn lru_stress_batch_15() {
    stress(LruBatch::Pages(15));
}

#[test]
fn lru_stress_batch_1() {
    stress(LruBatch::Pages(1));
}

#[test]
fn lru_stress_unbatched() {
    stress(LruBatch::Unbatched);
}

/// Victims taken with their cold neighbours while other threads activate,
/// reference and remove those very pages: no page lost or owned twice.
#[test]
fn lru_stress_batch_31_neighbours_8() {
    stress_with(LruBatch::Pages(31), 8);
}

/// A victim's cold neighbours go with it, in id order within its aligned
/// window; an active, referenced or absent one stays; a full buffer
/// stops it; a window that is not a power of two is refused.
#[test]
fn neighbours_go_with_their_victim_when_cold() {
    let reg = Registry::new();
    assert_eq!(
        Lru::new(LruConfig::new(64).neighbours(3), &reg).unwrap_err(),
        LruError::BadNeighbours(3)
    );
    assert!(Lru::new(LruConfig::new(64).neighbours(1024), &reg).is_err());
    for mode in MODES {
        let reg = Registry::new();
        let l = Lru::new(LruConfig::new(64).batch(mode).cpus(1).neighbours(8), &reg).unwrap();
        for p in (0..24).filter(|&p| p != 14) {
            l.add(p);
        }
        l.drain_all();
        l.activate(10);
        l.mark_referenced(12);
        l.drain_all();
        let mut v = [0; 16];
        // Page 0 is the tail: it and its window.
        let n = l.shrink_inactive(1, &mut v);
        assert_eq!(&v[..n], &[0, 1, 2, 3, 4, 5, 6, 7], "{mode:?}");
        // Page 8 next: 10 is active, 12 referenced, 14 was never added.
        let n = l.shrink_inactive(1, &mut v);
        assert_eq!(&v[..n], &[8, 9, 11, 13, 15], "{mode:?}");
        assert!(l.is_active(10) && l.on_lru(12) && l.is_referenced(12) && !l.on_lru(14));
        assert!(!l.is_active(12));
        // 12, referenced, is the tail now: its second chance, then 16;
        // room for three: 16 and two of its neighbours.
        let n = l.shrink_inactive(2, &mut v[..3]);
        assert_eq!(&v[..n], &[16, 17, 18], "{mode:?}");
        assert!((19..24).all(|p| l.on_lru(p)) && l.is_active(12));
        assert_eq!(reg.snapshot().counters.lru_isolated, 16);
        l.check_invariants().unwrap();
    }
}
