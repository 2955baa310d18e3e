//! `fork` without `exec`: the child sees its parent's memory as it was,
//! swaps to a file of its own, and publishes statistics of its own.
//!
//! Scenarios that died, hung or deadlocked before their fix run in a
//! child process under a watchdog (`child.rs`), so that a regression fails
//! its test with the child's output instead of taking the suite down.

use std::time::Duration;

use super::child;
use super::support::*;
use super::*;

const MIB: u64 = 1 << 20;

// Fork without exec: the child sees its parent's memory as it was,
// swapped-out pages included, and both stay consistent afterwards.

/// Write the pattern of `seed` over pages `pages` (a word in 512 bytes).
fn write_seeded(base: *mut u8, pages: std::ops::Range<usize>, seed: u64) {
    for p in pages {
        for at in (0..PAGE_SIZE).step_by(512) {
            // SAFETY: inside a live region the caller owns.
            unsafe { std::ptr::write_volatile(base.add(p * PAGE_SIZE + at), fill_byte(p, at, seed)) };
        }
    }
}

/// The first page in `pages` that does not hold the pattern of `seed`.
fn check_seeded(base: *const u8, pages: std::ops::Range<usize>, seed: u64) -> Option<(usize, usize, u8)> {
    for p in pages {
        for at in (0..PAGE_SIZE).step_by(512) {
            // SAFETY: inside a live region the caller owns.
            let v = unsafe { std::ptr::read_volatile(base.add(p * PAGE_SIZE + at)) };
            if v != fill_byte(p, at, seed) {
                return Some((p, at, v));
            }
        }
    }
    None
}

/// Parent: writes A over 8 MiB under a 1 MiB budget (most of it goes
/// out), forks, then writes C over the second half (freeing the slots the
/// child still needs: on a swap file they must wait for it).  Child: finds
/// A everywhere, writes B over the first half and reads it back through
/// its own evictions, maps a region of its own, and drops everything.
/// Parent, after: A and C; once the child is gone, every slot comes back.
fn fork_scenario(mode: FaultMode, device: SwapDeviceSpec) {
    let (swap, mut region) = filled_before_a_fork(mode, device);
    let base = region.as_mut_slice().as_mut_ptr();
    let pages = region.len() / PAGE_SIZE;
    let half = pages / 2;
    let out_before = swap.stats().counters.evictions;
    eprintln!("parent: {out_before} pages went out before the fork");
    // The child reads only once the parent has written C over the second
    // half, so that the slots the parent freed had every chance to be
    // reused.
    let mut go = [0i32; 2];
    // SAFETY: pipe fills `go`.
    assert_eq!(unsafe { libc::pipe(go.as_mut_ptr()) }, 0);
    // SAFETY: fork; the child only touches its copy of the region, maps
    // and drops handles, and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let mut b = 0u8;
        // SAFETY: reads one byte from our pipe into a local.
        unsafe { libc::read(go[0], (&mut b as *mut u8).cast(), 1) };
        if let Some(bad) = check_seeded(base, 0..pages, 0xa) {
            eprintln!("child: the parent's data differs at {bad:?}");
            child::exit(3);
        }
        write_seeded(base, 0..half, 0xb);
        if let Some(bad) = check_seeded(base, 0..half, 0xb) {
            eprintln!("child: its own data differs at {bad:?}");
            child::exit(4);
        }
        if let Some(bad) = check_seeded(base, half..pages, 0xa) {
            eprintln!("child: the parent's data differs after its writes at {bad:?}");
            child::exit(5);
        }
        match swap.map(64 * PAGE_SIZE) {
            Ok(mut r) => {
                r.as_mut_slice().fill(9);
                if r.as_slice().iter().any(|&b| b != 9) {
                    eprintln!("child: its own region lost data");
                    child::exit(6);
                }
            }
            Err(e) => {
                eprintln!("child: map refused: {e}");
                child::exit(7);
            }
        }
        eprintln!(
            "child: swap-ins {} evictions {}",
            swap.stats().counters.swapins,
            swap.stats().counters.evictions
        );
        drop(region);
        drop(swap);
        eprintln!("child: ok");
        child::exit(0);
    }
    write_seeded(base, half..pages, 0xc);
    // And once more, so that C's pages went out too, to slots that may be
    // the ones A's pages held.
    write_seeded(base, 0..half, 0xa);
    eprintln!(
        "parent: {} evictions after the fork",
        swap.stats().counters.evictions - out_before
    );
    // SAFETY: writes one byte to our pipe.
    unsafe { libc::write(go[1], b"g".as_ptr().cast(), 1) };
    match wait_child(pid, Duration::from_secs(30)) {
        None => {
            eprintln!("parent: the child hung");
            child::exit(8);
        }
        Some(0) => {}
        Some(code) => {
            eprintln!("parent: the child failed: {code}");
            child::exit(9);
        }
    }
    if let Some(bad) = check_seeded(base, 0..half, 0xa) {
        eprintln!("parent: its data differs after the fork at {bad:?}");
        child::exit(10);
    }
    if let Some(bad) = check_seeded(base, half..pages, 0xc) {
        eprintln!("parent: its new data differs at {bad:?}");
        child::exit(11);
    }
    drop(region);
    // The reclaimer lets go of the slots held for the child on its next
    // passes, once it sees the child's end of the pipe closed.
    let mut tries = 0;
    loop {
        swap.swap_space().drain_slot_caches();
        if swap.free_slots() == swap.total_slots() || tries > 500 {
            break;
        }
        tries += 1;
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_all_returned(&swap, "parent");
    eprintln!("parent: ok");
}

#[test]
fn a_forked_child_sees_its_parents_memory() {
    if let Some(arg) = child::scenario() {
        let dir = tempfile::tempdir().unwrap();
        if arg.contains("nbd") {
            // The child reads its parent's slots over connections of its
            // own; the parent's stay the parent's.
            let server = crate::io::nbd::server::Server::start(&["memory", "64M"]);
            fork_scenario(mode_from(&arg), SwapDeviceSpec::nbd(server.target(true)));
        } else {
            fork_scenario(mode_from(&arg), ram_or_file(arg.contains("file"), &dir, "fork"));
        }
        child::exit(0);
    }
    let nbd = [(FaultMode::Sigbus, "-nbd"), (FaultMode::HandlerThread, "-nbd")];
    let devices = MODES_AND_DEVICES
        .iter()
        .map(|&(mode, file)| (mode, if file { "-file" } else { "" }))
        .chain(nbd);
    for (mode, device) in devices {
        let arg = format!("{}{device}", mode_name(mode));
        let out = child::run(
            "pager::tests::fork::a_forked_child_sees_its_parents_memory",
            &arg,
            Duration::from_secs(90),
        );
        assert!(out.code == Some(0), "{arg}: {out:?}");
        assert!(out.stderr.contains("child: ok"), "{arg}: {out:?}");
        assert!(out.stderr.contains("parent: ok"), "{arg}: {out:?}");
    }
}

/// A swap of a 1 MiB budget on `device` and an 8 MiB region of it filled
/// with seed A (most of it gone out): where the fork scenarios start.
fn filled_before_a_fork(mode: FaultMode, device: SwapDeviceSpec) -> (Swap, Region) {
    let swap = Swap::builder()
        .budget(MIB)
        .device(device)
        .fault_mode(mode)
        .build()
        .unwrap();
    let mut region = swap.map((8 * MIB) as usize).unwrap();
    let pages = region.len() / PAGE_SIZE;
    write_seeded(region.as_mut_slice().as_mut_ptr(), 0..pages, 0xa);
    (swap, region)
}

/// Wait up to `within` for forked child `pid`: its exit code (128 + the
/// signal that ended it), or `None` if it hung (then killed).
fn wait_child(pid: libc::pid_t, within: Duration) -> Option<i32> {
    let mut status = 0;
    for _ in 0..within.as_millis() / 10 {
        // SAFETY: waits for our own child.
        if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
            return Some(if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                128 + libc::WTERMSIG(status)
            });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: our own child.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    // SAFETY: as above.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    None
}

/// A forked child on a swap file writes its pages to a file of its own
/// (io/file.rs, "A forked child's files of its own"), and a child of that
/// child to another, each reading its parents' slots through them: the
/// parent fills 8 MiB (8x its budget) with A; the child writes B over all
/// of it, staying within its budget (before, its dirty pages stayed
/// resident: its parent's file was not its to write); its child writes C
/// over the first half and reads B in the second through the child's
/// file; then the child reads B in all of it and the parent A.
fn fork_layers_scenario(mode: FaultMode) {
    let dir = tempfile::tempdir().unwrap();
    let (swap, mut region) = filled_before_a_fork(mode, ram_or_file(true, &dir, "layers"));
    let base = region.as_mut_slice().as_mut_ptr();
    let pages = region.len() / PAGE_SIZE;
    let half = pages / 2;
    let shared = swap.resident_pages();
    eprintln!("parent: {shared} pages resident at the fork");
    // SAFETY: fork; the child touches its copy of the region and leaves
    // with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let written = swap.stats().counters.evict_write;
        write_seeded(base, 0..pages, 0xb);
        if let Some(bad) = check_seeded(base, 0..pages, 0xb) {
            eprintln!("child: its data differs at {bad:?}");
            child::exit(3);
        }
        let out = swap.stats().counters.evict_write - written;
        let (peak, budget) = (swap.peak_resident_pages(), swap.budget_pages());
        eprintln!("child: {out} pages written out, resident at most {peak} of a budget of {budget}");
        if out < half as u64 {
            eprintln!("child: its pages did not go out");
            child::exit(4);
        }
        // SAFETY: as above, one level down.
        let grandchild = unsafe { libc::fork() };
        assert!(grandchild >= 0);
        if grandchild == 0 {
            write_seeded(base, 0..half, 0xc);
            if let Some(bad) = check_seeded(base, 0..half, 0xc) {
                eprintln!("grandchild: its data differs at {bad:?}");
                child::exit(5);
            }
            if let Some(bad) = check_seeded(base, half..pages, 0xb) {
                eprintln!("grandchild: its parent's data differs at {bad:?}");
                child::exit(6);
            }
            eprintln!("grandchild: ok");
            child::exit(0);
        }
        if wait_child(grandchild, Duration::from_secs(60)) != Some(0) {
            eprintln!("child: the grandchild failed");
            child::exit(7);
        }
        if let Some(bad) = check_seeded(base, 0..pages, 0xb) {
            eprintln!("child: its data differs after its child at {bad:?}");
            child::exit(8);
        }
        eprintln!("child: ok");
        child::exit(0);
    }
    let status = wait_child(pid, Duration::from_secs(60));
    if status != Some(0) {
        eprintln!("parent: the child failed: {status:?}");
        child::exit(9);
    }
    if let Some(bad) = check_seeded(base, 0..pages, 0xa) {
        eprintln!("parent: its data differs after the fork at {bad:?}");
        child::exit(10);
    }
    drop(region);
    eprintln!("parent: ok");
}

#[test]
fn a_forked_child_swaps_to_a_file_of_its_own() {
    if let Some(arg) = child::scenario() {
        fork_layers_scenario(mode_from(&arg));
        child::exit(0);
    }
    for mode in [FaultMode::HandlerThread, FaultMode::Sigbus] {
        let arg = mode_name(mode).to_string();
        let out = child::run(
            "pager::tests::fork::a_forked_child_swaps_to_a_file_of_its_own",
            &arg,
            Duration::from_secs(120),
        );
        assert!(out.code == Some(0), "{arg}: {out:?}");
        for who in ["grandchild: ok", "child: ok", "parent: ok"] {
            assert!(out.stderr.contains(who), "{arg}: {out:?}");
        }
        // Within the budget and its overrun (10%), the pages it shares
        // with its parent since the fork (each is copied before it can
        // go out: `batch.rs`'s `unshare`, a pass behind the faults; the
        // child held up to 400 pages of a 256-page budget meanwhile), and
        // the pages of a fault or two.  Without a file of its own it held
        // all 2048.
        let line = out
            .stderr
            .lines()
            .find(|l| l.contains("resident at most"))
            .unwrap();
        let n = |text: &str, after: &str| -> usize {
            text.split(after)
                .nth(1)
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap()
                .parse()
                .unwrap()
        };
        let (peak, budget) = (n(line, "resident at most "), n(line, "budget of "));
        let shared = n(&out.stderr, "parent: ");
        assert!(
            peak <= budget + budget / 10 + shared + 64,
            "{arg}: the child held {peak} pages ({shared} shared at the fork): {line}"
        );
    }
}

/// A forked child publishes statistics of its own: a file for
/// its pid, beside its parent's; its counters from zero and its levels as
/// they were at the fork; what it does counted there and not in its
/// parent's block; its file gone when it leaves, its parent's still there.
fn fork_publishes_scenario(dir: &str) {
    // SAFETY: this scenario's process runs one test thread and no other
    // thread reads the environment yet (the instance is built after).
    unsafe { std::env::set_var(crate::stats::live::DIR_ENV, dir) };
    let swap = Swap::builder()
        .budget(MIB)
        .device(SwapDeviceSpec::ram(32 * MIB))
        .publish(true)
        .build()
        .unwrap();
    let mut region = swap.map((8 * MIB) as usize).unwrap();
    let pages = region.len() / PAGE_SIZE;
    let base = region.as_mut_slice().as_mut_ptr();
    write_seeded(base, 0..pages, 0xd);
    let parent_path = swap.published_path().expect("published");
    let read = |p: &std::path::Path| {
        crate::stats::MappedBlock::open(p)
            .unwrap()
            .unwrap_or_else(|| panic!("{} is a block", p.display()))
    };
    let before = read(&parent_path).stats();
    if before.counters.evictions == 0 {
        eprintln!("parent: nothing went out");
        child::exit(2);
    }
    // SAFETY: fork; the child reads its copy and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let me = std::process::id() as i32;
        let path = swap.published_path().expect("the child publishes too");
        let block = read(&path);
        let (id, at_fork) = (block.identity(), block.stats());
        let named = path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with(&format!("{me}-"));
        if path == parent_path || !named || id.pid != me || id.parent == me {
            eprintln!("child: not its own block: {} {id:?}", path.display());
            child::exit(3);
        }
        if at_fork.counters.faults > 16 || at_fork.gauges.budget != before.gauges.budget {
            eprintln!("child: counters not from zero or levels lost: {at_fork:?}");
            child::exit(4);
        }
        if let Some(bad) = check_seeded(base, 0..pages, 0xd) {
            eprintln!("child: its data differs at {bad:?}");
            child::exit(5);
        }
        let after = block.stats();
        // Read back by faults and the readahead around them.
        if after.counters.swapins == 0 || after.counters.io_read_pages < (pages / 2) as u64 {
            eprintln!(
                "child: its swap-ins not counted in its block: {:?}",
                after.counters
            );
            child::exit(6);
        }
        swap.unpublish();
        if path.exists() {
            eprintln!("child: its file stayed");
            child::exit(7);
        }
        eprintln!("child: ok");
        child::exit(0);
    }
    let status = wait_child(pid, Duration::from_secs(60));
    if status != Some(0) {
        eprintln!("parent: the child failed: {status:?}");
        child::exit(8);
    }
    let now = read(&parent_path).stats();
    // The child read all 2048 pages back; none of that is the parent's.
    if now.counters.io_read_pages > before.counters.io_read_pages + 64 {
        eprintln!(
            "parent: the child's swap-ins counted here: {:?} then {:?}",
            before.counters, now.counters
        );
        child::exit(9);
    }
    let files = std::fs::read_dir(dir).unwrap().count();
    if files != 1 {
        eprintln!("parent: {files} files, not its own alone");
        child::exit(10);
    }
    drop(region);
    drop(swap);
    if parent_path.exists() {
        eprintln!("parent: its file stayed after the instance went");
        child::exit(11);
    }
    eprintln!("parent: ok");
}

#[test]
fn a_forked_child_publishes_statistics_of_its_own() {
    if let Some(arg) = child::scenario() {
        fork_publishes_scenario(&arg);
        child::exit(0);
    }
    let dir = tempfile::tempdir().unwrap();
    let stats = dir.path().join("stats");
    let out = child::run(
        "pager::tests::fork::a_forked_child_publishes_statistics_of_its_own",
        stats.to_str().unwrap(),
        Duration::from_secs(120),
    );
    out.assert_success();
    for who in ["child: ok", "parent: ok"] {
        assert!(out.stderr.contains(who), "{out:?}");
    }
}

/// Dirty pages a fork shares with a child that still maps them go out in
/// place (`batch.rs`'s `stage_shared`: copied into their frames, this
/// process's mapping dropped), and read back.  Part of the region is
/// locked (`mlock`) from a page that is not at a batch's edge, so that a
/// run of neighbours spans the lock: its drop stops at the locked mapping
/// after dropping the pages before it, which come back from their frames,
/// and the run's frames are emptied before they are given back (one
/// given back holding a copy refused the next move into it, `EEXIST`).
#[test]
fn pages_shared_with_a_forked_child_go_out_in_place() {
    for mode in both_modes() {
        let swap = Swap::builder()
            .budget(8 * MIB)
            .device(SwapDeviceSpec::ram(64 * MIB))
            .fault_mode(mode)
            .build()
            .unwrap();
        let region = swap.map((4 * MIB) as usize).unwrap();
        let base = region.as_ptr();
        let pages = region.len() / PAGE_SIZE;
        write_seeded(base, 0..pages, 0x5e);
        // Pages 700..800.
        // SAFETY: inside the live region.
        let (locked, locked_len) = (unsafe { base.add(700 * PAGE_SIZE) }.cast(), 100 * PAGE_SIZE);
        // SAFETY: pages of the live region, resident (written above).
        let lock = unsafe { libc::mlock(locked, locked_len) };
        assert_eq!(lock, 0, "mlock: {}", std::io::Error::last_os_error());
        let mut go = [0i32; 2];
        // SAFETY: pipe fills `go`.
        assert_eq!(unsafe { libc::pipe(go.as_mut_ptr()) }, 0);
        // SAFETY: the child only blocks on the pipe and exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let mut b = 0u8;
            // SAFETY: reads one byte into `b`, then leaves without unwinding.
            unsafe {
                libc::close(go[1]);
                libc::read(go[0], (&mut b as *mut u8).cast(), 1);
                libc::_exit(0);
            }
        }
        // SAFETY: our end of the pipe.
        unsafe { libc::close(go[0]) };
        // Over the new budget: the faults of a second region reclaim, the
        // shared pages first (the oldest).
        swap.set_budget(MIB).unwrap();
        let other = swap.map((2 * MIB) as usize).unwrap();
        write_seeded(other.as_ptr(), 0..other.len() / PAGE_SIZE, 0x0e);
        settle(&region);
        let st = swap.stats().counters;
        let bad = check_seeded(base, 0..pages, 0x5e);
        // SAFETY: the write end: the child exits on its close.
        unsafe { libc::close(go[1]) };
        assert_eq!(wait_child(pid, Duration::from_secs(10)), Some(0));
        assert_eq!(
            bad,
            None,
            "{}: a page read back wrong while shared: {st:?}",
            mode_name(mode)
        );
        assert!(
            st.evict_shared > 0,
            "{}: nothing went out in place: {st:?}",
            mode_name(mode)
        );
        // SAFETY: as for the mlock.
        unsafe { libc::munlock(locked, locked_len) };
        swap.set_budget(MIB / 2).unwrap();
        assert_eq!(check_seeded(base, 0..pages, 0x5e), None, "{}", mode_name(mode));
        assert_eq!(
            check_seeded(other.as_ptr(), 0..other.len() / PAGE_SIZE, 0x0e),
            None
        );
        drop((region, other));
        assert_all_returned(&swap, mode_name(mode));
    }
}
