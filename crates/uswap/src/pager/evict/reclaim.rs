//! Reclaim: keep resident pages under the budget, in two steps.
//!
//! 1. Eviction of a batch of victims from the LRU's inactive tail (second
//!    chance for referenced pages), in `batch.rs`: clean pages are dropped
//!    where they are (their slot holds them, or they are zeros), one
//!    `process_madvise` for the batch; dirty pages are soft-evicted: moved
//!    out of their regions with `UFFDIO_MOVE` into staging frames,
//!    atomically, neighbours as one run.  A thread touching one from then
//!    on faults.  Each gets a slot and the swap cache maps the slot to its
//!    frame.  The page is still in memory: a touch finds it in the swap
//!    cache and moves it back without IO, and activates it through the
//!    LRU's per-CPU batches (seed 002): this is how the LRU learns, user
//!    space having no accessed bits.  (`SwapBuilder::per_page_evict`:
//!    every victim, clean ones too, moved alone, as before batching.)
//! 2. Writeback (`writeback.rs`): staged pages, oldest first, are written
//!    to their slots and their frames discarded, a batch per
//!    `process_madvise`.  Only this frees the memory of a dirty page.
//!
//! A clean page that never had a slot is still all zeros: it goes straight
//! back to "never written", no slot, no IO.
//!
//! What `UFFDIO_MOVE` refuses stays where it is, as the kernel leaves such
//! pages alone: a pinned page (`EBUSY`: the pin holder, a device doing DMA
//! or an io_uring fixed buffer, writes the page itself, so a copy taken
//! for swap would go stale) and a locked or read-only one (`EINVAL`:
//! `mlock`, `mprotect`).  They are counted as unevictable, said once, and
//! put on the active list, to be tried again when they age.  A page the
//! program discarded itself (`ENOENT`: `MADV_DONTNEED`, `munmap`) has no
//! memory left to evict: it becomes "never written".
//!
//! When no slot can be had the page stays resident.  A write error that
//! says the block is bad (`EIO`) retires the slot for good and puts the
//! page back in its region; one that may pass (`ENOSPC`, `EAGAIN`, ...)
//! leaves the page staged and pauses writeback, 1 ms at first, doubling to
//! 1 s while the errors go on: a burst of them must not eat the swap
//! space.  Never lost, never zeros.
//!
//! Who reclaims depends on where the swap is.  Where it waits on a disk,
//! the background reclaimer keeps resident pages (staged ones included)
//! under the low watermark, writing ahead, and a faulting thread
//! reclaims a whole batch itself only when the budget is exceeded by
//! more than a batch (the reclaimer fell behind, or there is none).  On
//! devices in memory the faults reclaim for themselves, at the budget,
//! as a memory cgroup's charge does: a move out of the program's address
//! space from a reclaimer on another CPU is a TLB shootdown the
//! program's CPU takes, where the fault's own is a local flush
//! (`SwapBuilder::reclaim_ahead_in_memory`); the reclaimer takes back
//! only what the faults leave past the budget.  Faults pace reclaim with
//! devices in memory: within a batch of the budget, each fault that
//! installs a page first does a page or two of the work (`pace`).
//!
//! 2 MB units (seed 003) go out whole (`unit.rs`).

use std::sync::atomic::Ordering;

use crate::io::WriteRing;
use crate::pager::evict::batch::{self as evict, enqueue, Evicted, Outcome};
use crate::pager::evict::unit;
use crate::pager::evict::writeback::{
    write_back_down_to, write_back_oldest, write_back_queued, writeback, writeback_held, writes_failing,
};
use crate::pager::instance::inner::Inner;
use crate::pager::instance::overrun;
use crate::pager::instance::page::{Kind, PageWord, UNIT_PAGES};
use crate::pager::instance::report;
use crate::pager::instance::staged;
use crate::swap_space::SwapError;
use crate::sys::monotonic_ns;
use crate::PAGE_SIZE;

const PAGE: u64 = PAGE_SIZE as u64;
/// Victims taken from the LRU per pass: one eviction batch.
const BATCH: usize = evict::BATCH;

/// How far past the budget faults may go before one reclaims itself, where
/// the background reclaimer reclaims ahead: one batch (`Budget::slack`).
pub(crate) const SLACK: usize = BATCH;

/// Called by a faulting thread before it installs a page: reclaim when the
/// budget is exhausted by more than the slack (the background reclaimer
/// fell behind).  When nothing can be evicted the page is installed anyway
/// (the overrun is counted): a fault must always be served, up to the
/// overrun's bound, past which the process is killed (`overrun.rs`).
pub(crate) fn make_room(inner: &Inner) -> Room {
    let b = &inner.budget();
    // Held to the budget: resident pages less those on probation.
    let resident = b.charged();
    need_background(inner, resident);
    if resident < b.limit() + b.slack() {
        // Within a batch of the budget, not from the low watermark: the
        // pace keeps the program's memory where the budget puts it (from
        // the low watermark, 6% of the budget went unused and the faults
        // that it would have saved cost 10-20% of pmbench's throughput).
        if inner.paced() && resident + BATCH > b.limit() {
            let start = monotonic_ns();
            pace(inner);
            return Room {
                reclaim_ns: monotonic_ns() - start,
                bound_ns: 0,
            };
        }
        return Room::default();
    }
    inner.counters().direct_reclaim.inc();
    // A batch, or what is past the budget up to four (one call's most): a
    // cut of the budget (a share the tree's other processes took, the
    // store's own growth) is followed by the faults after it in a few of
    // them, where the faults reclaim for themselves.
    let want = resident.saturating_sub(b.limit()).clamp(BATCH, 4 * BATCH);
    reclaim_for_fault(inner, want, 1, 1, || {
        inner.budget().charged() >= b.limit() + b.slack()
    })
}

/// Pages a fault pays for when it paces reclaim: more than the one it
/// adds, so that the resident set comes down while the program faults.
const PACE: usize = 2;

/// A fault's share of reclaim while the resident set is within a batch
/// of the budget (`SwapBuilder::paced_reclaim`): write back [`PACE`] staged
/// pages, the oldest; with none to write back (the staged ones are all
/// in the younger half the swap cache keeps), evict one batch, whose
/// clean pages leave at once and whose dirty ones are staged for the
/// faults after it to write back.  One fault evicts at a time; another
/// that finds nothing to write back goes on.
///
/// Why pace: a background reclaimer that competes with the program's
/// threads for busy CPUs preempts one of them for a scheduler tick (4 ms
/// at HZ 250) whenever it runs, and a fault that waits for a whole batch
/// to be compressed waits about 600 us (64 pages of lz4).  Paced, each
/// fault carries a page or two of the work (about 20 us of lz4), the
/// batch's fixed costs (its LRU scan, its one TLB flush) fall on one
/// fault in a batch, and the reclaimer, at nice 19, runs on what the
/// program leaves idle.
fn pace(inner: &Inner) {
    inner.counters().paced.inc();
    let mut done = 0;
    // Paced only with devices in memory (`SwapBuilder::paced_reclaim`):
    // no fault waits here for the write of another page to a disk.
    write_back_oldest(inner, PACE, &mut done);
    if done >= PACE {
        return;
    }
    let Some(_one) = inner.start_pacing() else {
        return;
    };
    evict_batch(inner, BATCH, BATCH, &mut done);
}

/// Faults between two publications of the levels and two looks at the
/// domain's share, while no reclaimer does it.
const TICK: u32 = 64;

/// What a fault tells the background: past the wake mark (`Budget::wake`)
/// the reclaimer is kicked awake, or wanted where it has not started
/// (`background.rs`); while it has not, the faults publish the levels and
/// the domain's share every [`TICK`] of them, as its loop would.
/// `charged`: what the budget holds the instance to now.
#[inline]
fn need_background(inner: &Inner, charged: usize) {
    let bg = inner.background();
    let running = bg.running();
    if running {
        if charged >= inner.budget().wake() {
            bg.kick();
        }
    } else if charged >= inner.budget().low() || inner.backing().hold.waiting() || driven_live(inner, charged)
    {
        bg.want();
    }
    if !bg.tick(TICK) {
        return;
    }
    let resident = inner.budget().resident();
    // The high-water mark, which a reclaimer that sleeps while the faults
    // reclaim for themselves (or none yet) does not see.
    inner.budget().note_peak(resident);
    if !running {
        inner.publish_levels(resident, false);
    }
    // What it holds, for the arbiter (a reclaimer asleep says it at most
    // every 100 ms, and shares made from a figure that old let two
    // compilers of a `make -j2` grow past the tree's bound together), and
    // the domain's share, taken by the faults too while a reclaimer runs
    // (a process that faults at full speed grows tens of MiB past a share
    // cut under it in 100 ms: a spawned pool worker starts with the whole
    // tree's budget).  Where the faults reclaim for themselves (no reclaim
    // ahead), they follow the cut too, from this one on.
    if inner.tell_domain(resident, running)
        && running
        && inner.budget().ahead()
        && inner.budget().charged() > inner.budget().low()
    {
        bg.kick();
    }
}

/// Held past this many pages, a member of a domain whose budget is driven
/// live wants its reclaimer before it nears its share.
const LIVE_MIN: usize = (32 << 20) / PAGE_SIZE;

/// Whether an instance holding `charged` pages should run its reclaimer
/// now because its domain's budget moves under it (`--budget auto`, whose
/// dwell the domain carries): the budget will come down past it, and in
/// SIGBUS mode a process that neither faults nor allocates has no other
/// thread of uswap's to follow it.  A tree of 1.4 GiB read whole and
/// allocating nothing held all of it while the controller lowered its
/// budget to 16 MiB.  Under 32 MiB a process (a shell, a compiler's
/// driver) is not worth a thread.
#[inline]
fn driven_live(inner: &Inner, charged: usize) -> bool {
    charged >= LIVE_MIN && inner.member().is_some_and(|m| m.dwell().is_some())
}

/// Reclaim before installing `n` pages at once (a 2 MB unit).
pub(crate) fn make_room_for(inner: &Inner, n: usize) -> Room {
    let resident = inner.budget().charged();
    need_background(inner, resident + n);
    if resident + n <= inner.budget().limit() + inner.budget().slack() {
        return Room::default();
    }
    inner.counters().direct_reclaim.inc();
    // From the one load: a second could see others' evictions and come
    // in under the limit (the soak found the subtraction overflowing,
    // and a release build would have asked reclaim for 2^64 pages); and
    // saturating, as the budget may have grown since the check.
    let want = (resident + n).saturating_sub(inner.budget().limit());
    if want == 0 {
        return Room::default();
    }
    // Short only when it could not free what it installs: the rest of
    // `want` is a share the domain cut under this process (a newcomer's
    // room, `domain.rs`), which the reclaimer and the faults after this
    // one close.  Reclaim takes at most four batches a call, and a cut
    // of a few MiB over small pages is more than that: counted as the
    // process running over its budget, it was reported as one (a vfork
    // test under load, 1 run in 3).
    reclaim_for_fault(inner, want, want.min(n), n, || {
        inner.budget().charged() + n > inner.budget().limit()
    })
}

/// A fault's direct reclaim of `want` pages before it installs `n`: when
/// reclaim frees fewer than `enough` and `still_over()` says the install
/// still does not fit, the fault waits for the reclaimer's writes under
/// way (`throttle`); if that brings no room, the overrun is counted and
/// the fault held to the budget's bound.  Both steps timed, for the
/// fault's stall.
fn reclaim_for_fault(
    inner: &Inner,
    want: usize,
    enough: usize,
    n: usize,
    still_over: impl Fn() -> bool,
) -> Room {
    let start = monotonic_ns();
    let short =
        reclaim(inner, want, None) < enough && still_over() && !throttle(inner, want, enough, &still_over);
    let reclaimed = monotonic_ns();
    let mut room = Room {
        reclaim_ns: reclaimed - start,
        bound_ns: 0,
    };
    if short {
        inner.counters().overrun.inc();
        hold_to_bound(inner, n);
        room.bound_ns = monotonic_ns() - reclaimed;
    }
    room
}

/// Naps, a millisecond each, a fault whose reclaim found nothing may take
/// while the reclaimer's writes are under way, as the kernel's direct
/// reclaim waits on writeback (`reclaim_throttle`).
const THROTTLE_NAPS: u32 = 20;

/// Whether a fault whose reclaim freed nothing finds room after all.  Its
/// reclaim stages dirty pages, which stay resident until written, and
/// writes back only the staged pages past the younger half the swap
/// cache keeps; the rest were the reclaimer's (runs it popped for writes
/// in flight, a batch it took off the LRU).  So first the younger half
/// goes too, as the kernel's direct reclaim writes the pages it takes;
/// then, while the reclaimer holds pages, the fault waits for them.  On a
/// busy machine the reclaimer, at nice 19, can be preempted holding them
/// for a scheduler tick or more.  Counted over budget without this, the
/// process was reported past a budget it did not pass (a vfork test
/// under load, about 1 run in 3).  Bounded: a reclaimer that frees nothing in
/// 20 ms is not catching up.
fn throttle(inner: &Inner, want: usize, enough: usize, still_over: &impl Fn() -> bool) -> bool {
    let mut naps = 0;
    loop {
        let mut done = 0;
        write_back_down_to(inner, 0, want, &mut done);
        if done >= enough || !still_over() {
            return true;
        }
        // Writes paused (failing for now: `EFBIG` under a lowered file
        // size limit, `ENOSPC`): no wait brings room, and the pages wait
        // in memory as designed, within the bound (`hold_to_bound`); a
        // fault that napped here crawled at 20 ms.
        if naps == THROTTLE_NAPS
            || !inner.background().running()
            || inner.budget().staged() == 0
            || writes_failing(inner)
            || writeback_held(inner)
        {
            return false;
        }
        nap();
        naps += 1;
        if !still_over() || reclaim(inner, want, None) >= enough {
            return true;
        }
    }
}

/// Where a fault's making room went: nanoseconds reclaiming, and held at
/// the budget's bound after reclaim freed too little.  Both 0 when there
/// was room (the fast path reads no clock).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Room {
    pub reclaim_ns: u64,
    pub bound_ns: u64,
}

// The faults' slack fits the room the overrun's floor leaves for it.
const _: () = assert!(SLACK <= overrun::SLACK_ROOM);

/// Tries of reclaim, a millisecond apart, before a fault past the bound
/// gives up: long enough for a compressed tier's writeback rest (20 ms)
/// or a forked child to let its slots go, short enough that a process
/// truly out of memory is told soon.  While swap writes fail with an
/// error that may pass (`ENOSPC`, `EAGAIN`: writeback backs off, up to a
/// second at a time), the swap is not full, only slow: those waits do
/// not count, up to [`PATIENCE_MS`] in all.  A growing swap file at its
/// file system's reserve is full, not slow (its writes fail because it
/// may not grow): those tries count, as a memory cgroup whose swap is
/// full is told at once (`tests/default_swap.rs`'s full disk ran 99 s,
/// every thread of its program stalled, before the kill; 17 s now).
const TRIES: u32 = 200;
/// The longest a fault past the bound waits on failing writes.
const PATIENCE_MS: u32 = 60_000;

/// A millisecond's sleep, from a fault (a signal handler included):
/// `nanosleep` is async-signal-safe, `std::thread::sleep` is not promised
/// to be.
fn nap() {
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 1_000_000,
    };
    // SAFETY: nanosleep reads the timespec.
    unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
}

/// Called by a fault about to install `n` pages when reclaim freed
/// nothing: returns once they fit under the budget and its overrun, or
/// ends the process.
fn hold_to_bound(inner: &Inner, n: usize) {
    let b = &inner.budget();
    if b.max_overrun() == usize::MAX {
        return;
    }
    if inner.backing().closed.load(Ordering::Relaxed) {
        // A forked child of an instance with a swap file, which writes no
        // slots there (fork.rs): its reclaimer is making it a file of its
        // own (`Inner::open_layers`), which the fault waits for, within
        // the budget, as it waits for writeback (a debug build's child
        // ran 50% past its budget meanwhile).
        let mut waited = 0;
        while inner.background().running()
            && inner.spawn().reclaimer
            && inner.backing().closed.load(Ordering::Acquire)
            && inner.backing().layerable.load(Ordering::Relaxed)
            && waited < PATIENCE_MS
        {
            nap();
            waited += 1;
        }
        if inner.backing().closed.load(Ordering::Acquire) {
            // No file of its own (none can be made here): its dirty pages
            // stay resident for want of a way out, not for want of swap.
            return;
        }
    }
    let space = &inner.backing().space;
    // Over the bound with the swap full (less than a 2 MB unit free:
    // what a unit needs, and a pass that freed nothing had small pages
    // to evict if it could).  Pages that cannot be evicted
    // for a reason of uswap's own while swap is free (shared with a
    // forked child, which `UFFDIO_MOVE` refuses; pinned) are not the
    // program's overrun: the kernel could swap them, so no kill.
    // A swap file that can grow no further (its file system at its
    // reserve) is as full as one without free slots: what it cannot take
    // waits in memory, up to the bound.
    let at_reserve = || inner.backing().devices.iter().any(|d| d.cannot_grow());
    let full = || space.nr_free() < UNIT_PAGES as u64 || at_reserve();
    let over = || b.charged() + n > b.limit().saturating_add(b.max_overrun()) && full();
    let mut tries = 0;
    let mut waited = 0;
    while tries < TRIES && waited < PATIENCE_MS {
        if !over() {
            return;
        }
        if writes_failing(inner) && !at_reserve() {
            waited += 1;
        } else {
            tries += 1;
        }
        if reclaim(inner, n.max(SLACK), None) == 0 {
            nap();
        }
    }
    if !over() {
        return;
    }
    // One line, one event, one kill: faults of other threads that come
    // to the same end meanwhile wait for the SIGKILL (the 1 TiB demo
    // printed the line once per thread).
    static KILLING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if KILLING.swap(true, Ordering::AcqRel) {
        loop {
            // SAFETY: pause has no preconditions; the SIGKILL is on its way.
            unsafe { libc::pause() };
        }
    }
    inner
        .registry()
        .event(crate::stats::EventKind::OomKill, b.resident() as u64);
    let why = if at_reserve() {
        "the swap file can grow no further: its file system is at its reserve".to_string()
    } else {
        format!("{} of {} swap slots free", space.nr_free(), space.total_slots())
    };
    report::line(format_args!(
        "uswap: out of memory: {} pages resident, past the budget of {} pages and its overrun of {}, and nothing can be evicted ({why}); killing the process, as a memory cgroup would: raise the budget, add swap (or room for it), or allow an unbounded overrun",
        b.resident(),
        b.limit(),
        b.max_overrun(),
    ));
    // SAFETY: kill and getpid have no memory-safety preconditions; this
    // process ends here.
    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    loop {
        // SAFETY: as above; SIGKILL is on its way.
        unsafe { libc::pause() };
    }
}

/// Free up to `nr` pages of memory; returns how many.
pub(crate) fn reclaim(inner: &Inner, nr: usize, mut ring: Option<&mut WriteRing>) -> usize {
    let mut done = 0;
    // Bounded: victims that cannot be staged (busy, no free slot for a
    // dirty page, unevictable) go back on the LRU and would come up
    // again; a few passes are all one call may spend.
    for _ in 0..4 {
        if done >= nr {
            break;
        }
        let want = (nr - done).min(BATCH);
        // Writeback first, so that the batch finds free staging frames
        // for its runs of dirty pages.
        match ring.as_deref_mut() {
            Some(ring) => write_back_queued(inner, ring, nr, &mut done),
            None => write_back_oldest(inner, nr, &mut done),
        }
        if done >= nr {
            break;
        }
        evict_batch(inner, want, nr, &mut done);
    }
    done
}

/// Evict one batch of up to `want` victims from the LRU's inactive tail;
/// what leaves memory is added to `done`, and no 2 MB unit is taken once
/// `done` reaches `nr`.
fn evict_batch(inner: &Inner, want: usize, nr: usize, done: &mut usize) {
    let mut victims = [0u32; BATCH];
    let mut freed = [0u32; BATCH];
    let before = *done;
    let mut n = inner.lru().shrink_inactive_local(want * 2, &mut victims[..want]);
    if n == 0 {
        // Nothing this CPU can see: pages may wait in other CPUs'
        // batches.  Drain them all, as the kernel does when reclaim
        // struggles, and look again.
        n = inner.lru().shrink_inactive(want * 2, &mut victims[..want]);
    }
    if n == 0 {
        // Inactive list empty or all referenced: age the active list.
        inner.lru().age_active(want * 4);
    }
    // The eviction clock counts what leaves the LRU (a victim put back
    // counts too: a distance a few pages long decides nothing).
    inner.workingset().evicted(n);
    let mut nfreed = 0;
    let mut small = [0u32; BATCH];
    let mut nsmall = 0;
    for &id in &victims[..n] {
        if inner.states()[id as usize].load().is_unit() {
            if *done >= nr {
                // Enough already: another unit would free 512 pages
                // more than asked (a batch can hold several).
                back_on_lru(inner, id, Evicted::Not);
                continue;
            }
            // A 2 MB unit goes straight to its slots.
            match unit::evict_unit(inner, id) {
                Evicted::Gone => *done += UNIT_PAGES,
                other => back_on_lru(inner, id, other),
            }
            continue;
        }
        if !inner.per_page_evict() {
            small[nsmall] = id;
            nsmall += 1;
            continue;
        }
        match stage(inner, id) {
            Evicted::InMemory => {}
            Evicted::Gone | Evicted::Probation => *done += 1,
            Evicted::Dropped(f) => {
                freed[nfreed] = f;
                nfreed += 1;
                *done += 1;
            }
            other => back_on_lru(inner, id, other),
        }
    }
    if nsmall > 0 {
        let mut out = Outcome::new();
        evict::evict(inner, &small[..nsmall], &mut out);
        *done += out.gone + out.probation;
        for &(id, refused) in &out.back[..out.nback] {
            back_on_lru(inner, id, if refused { Evicted::Refused } else { Evicted::Not });
        }
    }
    inner.discard_frames(&freed[..nfreed]);
    if n > 0 && *done == before {
        // Every victim refused (unevictable, busy): refill the
        // inactive list from the active one, or the same pages come
        // back on every pass and nothing else is ever tried.
        inner.lru().age_active(want * 4);
    }
}

/// A victim that did not leave memory goes back on the LRU, if it is
/// still resident: an unevictable one on the active list, to come back
/// to the inactive list (and be tried again) only as it ages.
fn back_on_lru(inner: &Inner, id: u32, how: Evicted) {
    if !inner.states()[id as usize].load().is(Kind::Resident) {
        return;
    }
    inner.lru().add(id);
    if matches!(how, Evicted::Refused) {
        inner.lru().activate(id);
    }
}

/// Soft-evict page `id` into a staging frame.
fn stage(inner: &Inner, id: u32) -> Evicted {
    let st = &inner.states()[id as usize];
    let w = st.load();
    if !w.is(Kind::Resident) || w.is_busy() {
        return Evicted::Not;
    }
    let dirty = w.is_dirty();
    if dirty && w.slot().is_none() && inner.no_free_slots() {
        // Nowhere to write it: do not move it out just to move it back.
        inner.counters().swap_full.inc();
        return Evicted::Not;
    }
    let Some(claim) = st.try_claim(w) else {
        return Evicted::Not;
    };
    if inner.pinned(id) {
        return Evicted::Refused;
    }
    let Some(f) = frame(inner) else {
        return Evicted::Not;
    };
    let addr = inner.addrs().get(id);
    let frame_addr = inner.frames().staging.addr(f);
    // A clean page that never had a slot holds zeros still: drop it.
    if !dirty && w.slot().is_none() {
        inner.counters().evict_moves.inc();
        if let Err((_, err)) = inner.move_out(frame_addr, addr, PAGE) {
            return evict::not_moved(inner, claim, f, addr, err);
        }
        inner.counters().evict_clean.inc();
        inner.counters().evictions.inc();
        inner.budget().uncharge(1);
        claim.commit(PageWord::NEVER);
        return Evicted::Dropped(f);
    }
    // The slot it will be written to (a clean page keeps its own).
    let (e, new_slot) = match w.slot() {
        Some(e) if !dirty => (e, false),
        _ => match inner.alloc_slot() {
            Ok(e) => (e, true),
            Err(err) => {
                if matches!(err, SwapError::Full { .. }) {
                    inner.counters().swap_full.inc();
                }
                inner.frames().staging.put(f);
                return Evicted::Not;
            }
        },
    };
    let handle = staged::handle(f);
    if inner.backing().swap_cache.add(e, handle).is_err() {
        // The slot is ours alone (fresh, or this clean page's): it cannot
        // be cached already.  Nothing changed; give up on this one.
        debug_assert!(false, "slot {e:?} already in the swap cache");
        if new_slot {
            inner.free_slot(e);
        }
        inner.frames().staging.put(f);
        return Evicted::Not;
    }
    inner.counters().evict_moves.inc();
    if let Err((_, err)) = inner.move_out(frame_addr, addr, PAGE) {
        inner.backing().swap_cache.delete(e);
        if new_slot {
            inner.free_slot(e);
        }
        return evict::not_moved(inner, claim, f, addr, err);
    }
    // A dirty page's old slot (if any) is stale: it has the new one.
    if new_slot {
        if let Some(o) = w.slot() {
            inner.free_slot(o);
        }
    }
    inner.counters().staged.inc();
    let probation = inner.budget().stage();
    claim.commit(
        PageWord::of(Kind::Staged)
            .dirty_if(w.is_dirty())
            .with_slot(e)
            .with_shadow(inner.workingset().shadow()),
    );
    enqueue(inner, id, e);
    if probation {
        Evicted::Probation
    } else {
        Evicted::InMemory
    }
}

/// A free staging frame, writing back the oldest staged page if none is.
fn frame(inner: &Inner) -> Option<u32> {
    if let Some(f) = inner.frames().staging.get() {
        return Some(f);
    }
    for _ in 0..8 {
        if writeback_held(inner) {
            return None;
        }
        let (id, slot) = inner.backing().staged.lock().pop()?;
        if let Some(f) = writeback(inner, id, slot) {
            inner.frames().staging.discard_batch(&[f]);
            return Some(f);
        }
    }
    None
}
