use super::*;
use proptest::prelude::*;

fn demand() -> impl Strategy<Value = Demand> {
    (0u64..200_000, 0u64..50_000, any::<bool>()).prop_map(|(resident, other, active)| Demand {
        resident,
        other,
        active,
        fixed: false,
        faulting: active,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// The shares keep the budget, cut only the members over the level
    /// (evenly, by weight), and never go under the floor.
    #[test]
    fn shares_fill_the_budget_from_the_top(
        budget in 1u64..1_000_000,
        members in prop::collection::vec(demand(), 1..12),
    ) {
        let (s, newcomer) = shares(budget, &members);
        prop_assert_eq!(s.len(), members.len());
        prop_assert!(s.iter().all(|&x| x >= MIN_SHARE));
        let total: u64 = members.iter().map(Demand::charged).sum();
        if total <= budget {
            // Nobody is cut, and what is left is split by weight: the
            // members growing at once into all of it hold no more than
            // the budget, but for the floors; the newcomers' part is at
            // most what is left.
            let room = budget - total;
            let grown: u64 = members.iter().zip(&s).map(|(m, x)| x - m.resident).sum::<u64>();
            let floors = members.len() as u64 * MIN_SHARE;
            prop_assert!(grown <= room.max(floors), "grown {grown} of room {room}");
            // Less only the rounding: a page for each.
            prop_assert!(grown + members.len() as u64 >= room, "grown {grown} of room {room}");
            prop_assert!(newcomer <= room);
            for (m, x) in members.iter().zip(&s) {
                prop_assert!(*x >= m.resident);
                for (n, y) in members.iter().zip(&s) {
                    if m.faulting && !n.faulting && *y > MIN_SHARE {
                        // A growing member's part is the larger.
                        prop_assert!(x - m.resident >= y - n.resident);
                    }
                }
            }
            return Ok(());
        }
        // Every member growing into its share at once holds the budget,
        // but for what the floors add.
        let grown: u64 = members.iter().zip(&s).map(|(m, x)| x + m.other).sum();
        let floor: u64 = members
            .iter()
            .zip(&s)
            .filter(|(_, x)| **x == MIN_SHARE)
            .map(|(m, _)| MIN_SHARE + m.other)
            .sum();
        prop_assert!(grown <= budget + floor, "grown {grown} of {budget} (floor {floor})");
        // The members cut are cut to one level, by weight; the others keep
        // all they hold.
        let cut: Vec<(usize, u64)> = members
            .iter()
            .zip(&s)
            .enumerate()
            .filter(|(_, (m, x))| **x > MIN_SHARE && m.resident > **x)
            .map(|(i, (m, x))| (i, x + m.other))
            .collect();
        let Some(&(first, c)) = cut.first() else {
            // Past the budget someone is cut, or floored.
            prop_assert!(floor > 0, "nobody cut past the budget");
            return Ok(());
        };
        prop_assert_eq!(c % members[first].weight(), 0);
        let level = c / members[first].weight();
        for (m, x) in members.iter().zip(&s) {
            if *x == MIN_SHARE {
                continue;
            }
            if m.charged() > m.weight() * level {
                prop_assert_eq!(x + m.other, m.weight() * level, "cut to the level");
            } else {
                prop_assert!(*x >= m.resident, "under the level, it keeps what it holds");
            }
        }
        // The level is as high as the budget allows: one step more for
        // every member's cap would pass it.
        if floor == 0 {
            let more: u64 = members.iter().map(|m| m.charged().min(m.weight() * (level + 1))).sum();
            prop_assert!(more > budget, "the level could rise: {more} <= {budget}");
        }
    }
}

#[test]
fn one_idle_member_gives_way_to_an_active_one() {
    let idle = Demand {
        resident: 60_000,
        other: 0,
        active: false,
        fixed: false,
        faulting: false,
    };
    let active = Demand {
        resident: 60_000,
        other: 1_000,
        active: true,
        fixed: false,
        faulting: false,
    };
    let (s, _) = shares(100_000, &[idle, active]);
    // The level L: min(60000, L) + min(61000, 8 L) = 100000 at L = 39000.
    // The active member's cap, 312000, passes all it holds: it keeps that
    // and grows by nothing, the budget being full (its cap was its share,
    // and it grew into memory the budget did not have).
    assert_eq!(s, vec![39_000, 60_000]);
    assert!(s[0] < idle.resident, "the idle member reclaims");
    assert!(s[1] >= active.resident, "the active one keeps what it holds");
}

#[test]
fn members_join_publish_get_shares_and_leave() {
    let mut arb = Arbiter::create(64 << 20).unwrap();
    assert_eq!(arb.budget_pages(), (64 << 20) / PAGE_SIZE as u64);
    let a = Member::join(&arb.env_value()).unwrap();
    assert_eq!(a.budget_pages(), arb.budget_pages());
    assert_eq!(a.share(), None, "no share before the arbiter's first tick");
    a.publish(&Holding { resident: 10, faults: 5, reclaims: true, ..Holding::default() });
    arb.tick(Instant::now());
    let m = arb.members();
    assert_eq!(m.len(), 1);
    assert_eq!(m[0].pid, std::process::id() as i32);
    assert_eq!(m[0].resident, 10);
    // Its share: what it holds and the rest of the budget, less what the
    // test process holds besides (its other anonymous memory).
    let other = m[0].other;
    assert!(other > 0, "a process holds some anonymous memory of its own");
    let share = a.share().unwrap() as u64;
    let room = arb.budget_pages().saturating_sub(10 + other);
    assert_eq!(share, (room + 10).max(MIN_SHARE));
    // The same process joining again is a new image (exec): the old slot
    // goes.  The new one, not seen yet, takes half the newcomers' part
    // and keeps it; the next newcomer would find half of that.
    let b = Member::join(&arb.env_value()).unwrap();
    assert_eq!(a.share(), None, "the earlier image's slot is gone");
    let pool = room;
    assert_eq!(b.share(), Some(pool.div_ceil(2).max(MIN_SHARE) as usize));
    assert_eq!(b.share(), Some(pool.div_ceil(2).max(MIN_SHARE) as usize), "kept");
    assert_eq!(arb.members().len(), 1);
    drop(a);
    assert_eq!(
        arb.members().len(),
        1,
        "dropping a slot no longer held frees nothing"
    );
    drop(b);
    assert!(arb.members().is_empty());
}

#[test]
fn the_slot_of_a_process_that_is_gone_is_freed() {
    let mut arb = Arbiter::create(64 << 20).unwrap();
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id() as i32;
    child.wait().unwrap();
    // A member that ended without leaving (killed): its pid, a start time.
    let put = |arb: &Arbiter, pid: i32, start: u64| {
        let s = &shared(&arb.map).slots[7];
        s.pid.store(pid, Ordering::Relaxed);
        s.resident.store(5000, Ordering::Relaxed);
        s.start.store(start, Ordering::Release);
    };
    put(&arb, pid, 12345);
    assert_eq!(arb.members().len(), 1);
    arb.tick(Instant::now());
    assert!(arb.members().is_empty(), "{:?}", arb.members());
    assert!(slots_free(&arb));
    // A live process under another start time is another process: freed
    // too.
    put(&arb, std::process::id() as i32, 1);
    arb.tick(Instant::now() + LOOK_EVERY);
    assert!(arb.members().is_empty());
    assert!(slots_free(&arb));
}

#[test]
fn joining_says_what_is_wrong() {
    for bad in ["", "12", "x:3", "3:y"] {
        let e = Member::join(bad).unwrap_err();
        assert!(matches!(e, DomainError::Malformed { .. }), "{bad}: {e}");
    }
    let e = Member::join("999999999:3").unwrap_err().to_string();
    assert!(
        e.contains("/proc/999999999/fd/3") && e.contains("supervisor"),
        "{e}"
    );
    // A descriptor that is not a domain.
    let f = File::open("/dev/null").unwrap();
    let e = Member::join(&format!("{}:{}", std::process::id(), f.as_raw_fd()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a budget domain"), "{e}");
}

/// Many threads join, publish and leave at once while the arbiter ticks:
/// no slot is held twice, and every slot is free at the end.
#[test]
fn concurrent_joins_never_share_a_slot() {
    let arb = std::sync::Mutex::new(Arbiter::create(1 << 30).unwrap());
    let env = arb.lock().unwrap().env_value();
    let map_env = env.clone();
    // Threads share a pid, so each claims through a slot it names itself:
    // the claim's compare-and-swap is what is tested, with distinct fake
    // pids written straight into the shared slots.
    let m = Member::join(&map_env).unwrap();
    drop(m);
    let shared_map = Member::join(&env).unwrap();
    let slots = &shared(&shared_map.map).slots;
    let taken: Vec<AtomicU64> = (0..SLOTS).map(|_| AtomicU64::new(0)).collect();
    std::thread::scope(|sc| {
        for t in 0..8i32 {
            let taken = &taken;
            sc.spawn(move || {
                for round in 0..2000 {
                    let fake = 1_000_000 + t * 10_000 + round % 100;
                    let Some(i) = slots.iter().position(|s| {
                        s.pid
                            .compare_exchange(0, fake, Ordering::Acquire, Ordering::Relaxed)
                            .is_ok()
                    }) else {
                        continue;
                    };
                    assert_eq!(taken[i].fetch_add(1, Ordering::Relaxed), 0, "slot {i} held twice");
                    taken[i].fetch_sub(1, Ordering::Relaxed);
                    free(&slots[i], fake);
                }
            });
        }
        sc.spawn(|| {
            for _ in 0..200 {
                arb.lock().unwrap().tick(Instant::now());
            }
        });
    });
    let held: Vec<i32> = slots
        .iter()
        .map(|s| s.pid.load(Ordering::Relaxed))
        .filter(|&p| p != 0)
        .collect();
    assert_eq!(
        held,
        vec![std::process::id() as i32],
        "only the real member's slot is held"
    );
    drop(shared_map);
    assert!(slots_free(&arb.lock().unwrap()));
}

fn slots_free(arb: &Arbiter) -> bool {
    shared(&arb.map)
        .slots
        .iter()
        .all(|s| s.pid.load(Ordering::Relaxed) == 0)
}

/// The tree's compressed stores, alone past the budget, overrun and slack
/// for OOM_AFTER on end: the member whose store is largest is named; a
/// tree that comes back under in time, one over by resident pages alone
/// (uswap's own limits: a forked child's dirty pages on its parent's
/// file), one over by memory it cannot page outside any store (each
/// process's cost: said once, never named), or one without a bound, is
/// not.
#[test]
fn a_compressed_store_is_charged_unless_left_outside_the_budget() {
    let ballast = vec![1u8; 64 << 20];
    for outside in [false, true] {
        let mut arb = Arbiter::create(8 << 20).unwrap().store_outside(outside);
        let a = Member::join(&arb.env_value()).unwrap();
        // All this process's anonymous memory (64 MiB and more) said to
        // be its compressed store's.
        a.publish(&Holding { faults: 1, store: 1 << 40, reclaims: true, ..Holding::default() });
        arb.tick(Instant::now());
        let other = arb.members()[0].other;
        if outside {
            assert_eq!(other, 0, "a store left outside is not charged");
        } else {
            assert!(other >= (64 << 20) / PAGE_SIZE as u64, "charged: {other}");
        }
        // Its share follows: the budget less what is charged.
        let share = a.share().unwrap() as u64;
        assert_eq!(share, arb.budget_pages().saturating_sub(other).max(MIN_SHARE));
    }
    assert_eq!(ballast[12345], 1);
}

#[test]
fn a_tree_over_its_bound_names_its_largest_member() {
    // This process's anonymous memory, at least 64 MiB, becomes the
    // member's other memory when it publishes no RAM pages; so large a
    // RAM count as NO_OTHER leaves it none (a RAM device's pages are not
    // charged: other = anonymous - resident - RAM).
    const NO_OTHER: u64 = 1 << 40;
    let ballast = vec![1u8; 64 << 20];
    let budget = 8u64 << 20;
    let pages = budget / PAGE_SIZE as u64;
    let mut arb = Arbiter::create(budget).unwrap().overrun(pages / 10);
    let a = Member::join(&arb.env_value()).unwrap();
    let t0 = Instant::now();
    // Under the bound: nothing, however long.
    a.publish(&Holding { faults: 1, ram: NO_OTHER, reclaims: true, ..Holding::default() });
    assert_eq!(arb.tick(t0), None);
    assert_eq!(arb.tick(t0 + OOM_AFTER * 2), None);
    // Over it by resident pages alone: never named.
    let over = (pages + pages / 10 + OOM_SLACK) as usize * 4;
    a.publish(&Holding { resident: over, faults: 2, ram: NO_OTHER, reclaims: true, ..Holding::default() });
    assert_eq!(arb.tick(t0 + OOM_AFTER * 3), None);
    assert_eq!(arb.tick(t0 + OOM_AFTER * 6), None, "resident pages alone");
    // Over it by memory uswap cannot page, outside any store (this
    // process's 64 MiB): said once, never named.
    a.publish(&Holding { faults: 3, reclaims: true, ..Holding::default() });
    assert_eq!(arb.tick(t0 + OOM_AFTER * 7), None);
    assert_eq!(arb.tick(t0 + OOM_AFTER * 10), None, "memory outside the pager alone");
    let (held, said_bound) = arb.take_unpaged().expect("said");
    assert!(held > said_bound && said_bound == pages + pages / 10 + OOM_SLACK, "{held} {said_bound}");
    assert_eq!(arb.take_unpaged(), None, "said once");
    // Over it by its compressed store: named after OOM_AFTER.
    let store = pages + pages / 10 + OOM_SLACK + 1;
    a.publish(&Holding { faults: 4, ram: NO_OTHER, store, reclaims: true, ..Holding::default() });
    let t1 = t0 + OOM_AFTER * 11;
    assert_eq!(arb.tick(t1), None, "over for an instant");
    // Back under in time: the clock starts again.
    a.publish(&Holding { faults: 5, ram: NO_OTHER, reclaims: true, ..Holding::default() });
    assert_eq!(arb.tick(t1 + OOM_AFTER / 2), None);
    a.publish(&Holding { faults: 6, ram: NO_OTHER, store, reclaims: true, ..Holding::default() });
    assert_eq!(arb.tick(t1 + OOM_AFTER), None, "over again, from now");
    let v = arb.tick(t1 + OOM_AFTER * 2).expect("over for OOM_AFTER");
    assert_eq!(v.pid, std::process::id() as i32);
    assert_eq!((v.charge, v.total), (store, store), "{v:?}");
    assert_eq!(v.bound, pages + pages / 10 + OOM_SLACK);
    // Unbounded: never named.
    let mut free = Arbiter::create(budget).unwrap();
    let b = Member::join(&free.env_value()).unwrap();
    b.publish(&Holding { faults: 1, reclaims: true, ..Holding::default() });
    assert_eq!(free.tick(t0), None);
    assert_eq!(free.tick(t0 + OOM_AFTER * 10), None);
    drop((a, b));
    assert_eq!(ballast[12345], 1);
}

/// Past the budget, a member that cannot reclaim (`fixed`: no reclaimer
/// of its runs) keeps what it holds, and the others divide the rest:
/// the shares with it still fill the budget, not the budget plus it.
#[test]
fn a_member_that_cannot_reclaim_keeps_its_pages_and_the_rest_divide_what_is_left() {
    let parent = Demand {
        resident: 3_000,
        other: 0,
        active: false,
        fixed: true,
        faulting: false,
    };
    let worker = Demand {
        resident: 6_000,
        other: 500,
        active: true,
        fixed: false,
        faulting: false,
    };
    let (s, _) = shares(10_000, &[parent, worker, worker]);
    assert_eq!(s[0], 3_000, "it keeps what it holds");
    // The workers: 7,000 pages between them, 3,500 charged each, 500 of
    // it their other memory (to the level's step: 8 pages, their weight).
    assert!(s[1] == s[2] && (2_992..=3_000).contains(&s[1]), "{s:?}");
    let charged: u64 = s[0] + s[1] + s[2] + 2 * 500;
    assert!((9_984..=10_000).contains(&charged), "{s:?}");
    // Under the budget, nobody is cut, and the 90,500 pages left are
    // split by weight: the parent's 1 and the worker's 1 (neither faults
    // now).  A newcomer's part would be 8 times theirs: all of it.
    assert_eq!(
        shares(100_000, &[parent, worker]),
        (vec![3_000 + 45_250, 6_000 + 45_250], 90_500)
    );
    // The worker grows: 8 ninths are its.
    let growing = Demand {
        faulting: true,
        ..worker
    };
    assert_eq!(
        shares(100_000, &[parent, growing]),
        (vec![3_000 + 10_055, 6_000 + 80_444], 80_444)
    );
}

/// The supervisor's dwell reaches the members, and the pages a member
/// has on probation are left out of its charge, its share and the tree's
/// charge: it is cut no further for what a cut of its own keeps staged.
#[test]
fn pages_on_probation_are_left_out_of_the_charge() {
    let mut arb = Arbiter::create(64 << 20).unwrap();
    let a = Member::join(&arb.env_value()).unwrap();
    assert_eq!(a.dwell(), None);
    arb.set_dwell(Some(Duration::from_secs(1)));
    assert_eq!(a.dwell(), Some(Duration::from_secs(1)));
    let held = Holding {
        resident: 5000,
        staged: 1500,
        faults: 5,
        reclaims: true,
        ..Holding::default()
    };
    a.publish(&held);
    arb.tick(Instant::now());
    let share = a.share().unwrap();
    assert_eq!(arb.members()[0].resident, 5000);
    a.publish(&Holding { probation: 1000, ..held });
    arb.tick(Instant::now());
    let m = arb.members();
    assert_eq!(m[0].resident, 4000, "resident less what is on probation");
    assert_eq!(arb.charged().0, 4000);
    // The other memory is read as before (the staged frames are resident
    // pages, not other memory), so the share is as large as before.
    assert_eq!(a.share().unwrap(), share);
    arb.set_dwell(None);
    assert_eq!(a.dwell(), None);
}
