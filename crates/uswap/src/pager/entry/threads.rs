//! uswap's threads in a process, one set per instance, all born with
//! every signal blocked (`signals::spawn`): the handler threads that read
//! the userfaultfd and serve its faults ([`FaultMode::HandlerThread`]),
//! the prefetcher that reads ahead for them, and the background reclaimer
//! that keeps the resident set under the budget's low watermark and, in
//! SIGBUS mode, watches the program's signal set-up (`sigbus::watch`).
//!
//! [`FaultMode::HandlerThread`]: super::FaultMode::HandlerThread

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::io::{LentRing, ReadRing, WriteRing};
use crate::pager::entry::sigbus::watch;
use crate::pager::evict::reclaim;
use crate::pager::fault::readahead;
use crate::pager::fault::serve::{self as fault, Access};
use crate::pager::fault::stall::Stall;
use crate::pager::instance::gate;
use crate::pager::instance::inner::Inner;
use crate::pager::instance::page::UNIT_BYTES;
use crate::pager::instance::regions::{lookup, Hit};
use crate::pager::instance::report;
use crate::pager::instance::signals::{self, UswapThread};
use crate::PAGE_SIZE;

const PAGE: u64 = PAGE_SIZE as u64;

/// Start an instance's threads (`Inner::spawn`); a forked child calls
/// this again, its parent's threads being absent there: their handles are
/// forgotten, not joined or detached.  Handler threads start now; the
/// background ones too, unless they start on need (`background.rs`).
pub(crate) fn start_threads(inner: &Arc<Inner>) {
    let mut threads = inner.threads().lock();
    std::mem::forget(std::mem::take(&mut *threads));
    let weak = Arc::downgrade(inner);
    for _ in 0..inner.spawn().handlers {
        threads.push(spawn_handler(weak.clone()));
    }
    inner.background().reset(inner.spawn().on_need);
    if !inner.spawn().on_need {
        start_background(inner, &mut threads);
    }
}

/// The prefetcher (a swap file's readahead) and the reclaimer.
fn start_background(inner: &Arc<Inner>, threads: &mut Vec<UswapThread>) {
    let weak = Arc::downgrade(inner);
    if inner.prefetch().on {
        threads.push(spawn_prefetcher(weak.clone()));
    }
    if inner.spawn().reclaimer {
        threads.push(spawn_reclaimer(weak, inner.spawn().watching));
    }
}

/// Start the background threads if they are wanted and not started: at a
/// safe point (`background.rs` lists them), in the process the instance
/// serves (a vfork child shares its memory and must start nothing).
pub(crate) fn start_wanted(inner: &Inner) {
    if !inner.background().wanted() || !inner.same_process() || !inner.background().take_start() {
        return;
    }
    let Some(me) = inner.me() else {
        return;
    };
    let mut threads = inner.threads().lock();
    start_background(&me, &mut threads);
}

/// The program is about to take `pages` more: past the low watermark with
/// them, want the background threads (started at the caller's safe point,
/// `expect_growth`).
///
/// Only for a device that waits on the disk.  There a fault's own
/// reclaim waits for each batch it writes, and a reclaimer that writes
/// ahead is the difference (xz -9 at 24 MiB on a swap file: 63 s
/// without, 54 s with).  On compressed RAM the fault's reclaim is a
/// compression on the CPU the program already runs on, its TLB flush
/// local; a reclaimer started early moves the program's pages from the
/// other CPU, and each move is a shootdown the program's CPU must take
/// (the same xz on zram: 25 s and 9 s of system time without it, 30-36 s
/// and 35-42 s with it).  There the reclaimer waits for the safe point
/// after a fault has found the need, and then takes nothing ahead of the
/// faults (`SwapBuilder::reclaim_ahead_in_memory`).
pub(crate) fn expect(inner: &Inner, pages: usize) {
    if !inner.background().running()
        && inner.backing().devices.iter().any(|d| d.waits_on_disk())
        && inner.budget().charged() + pages > inner.budget().low()
    {
        inner.background().want();
    }
}

/// The domain's budget was changed from outside (`uswap ctl`): past the
/// new budget, want the reclaimer (started at the caller's safe point).
/// Not the share alone: a process with no reclaimer says it keeps what it
/// holds (`Demand::kept`), and the arbiter leaves its share at that until
/// a reclaimer of its runs.
pub(crate) fn follow_domain(inner: &Inner) {
    let Some(m) = inner.member() else {
        return;
    };
    let charged = inner.budget().charged();
    if charged as u64 > m.budget_pages() || charged > inner.budget().low() {
        inner.background().want();
    }
    inner.tell_domain(inner.budget().resident(), inner.background().running());
}

/// How long a handler thread keeps reading after its last event before it
/// sleeps in `poll`: faults come in bursts (a program touching fresh or
/// swapped memory), and a handler that slept must be woken by the next
/// fault, a cross-CPU wake-up that costs microseconds on this machine
/// kind, on top of the faulting thread's own.  Bounded so that a program
/// whose threads fill the CPUs loses at most this much to a handler with
/// nothing to do.
const HANDLER_SPIN_NS: u64 = 20_000;

/// A handler thread: reads fault events and serves them until the instance
/// is gone.
pub(crate) fn spawn_handler(weak: Weak<Inner>) -> UswapThread {
    signals::spawn("uswap-fault", move || loop {
        let Some(inner) = Inner::upgrade(&weak) else {
            return;
        };
        // A poll error (EINTR cannot happen: every signal is blocked here)
        // is taken as "nothing yet"; the loop polls again.
        let ready = inner.uffd().poll(50).unwrap_or(false);
        if !ready {
            // Idle: a budget lowered from outside (`uswap ctl`) is
            // followed from here, a safe point, within a poll's 50 ms.
            if crate::domain::budget_changed() {
                for other in crate::pager::entry::fork::live_instances() {
                    follow_domain(&other);
                }
                start_wanted(&inner);
            }
            continue;
        }
        let mut last = crate::sys::monotonic_ns();
        loop {
            let ev = match inner.uffd().read_event() {
                Ok(Some(ev)) => ev,
                Ok(None) if crate::sys::monotonic_ns() - last < HANDLER_SPIN_NS => {
                    std::hint::spin_loop();
                    continue;
                }
                _ => break,
            };
            let crate::uffd::Event::PageFault {
                address,
                wp,
                write,
                thread,
            } = ev
            else {
                continue;
            };
            // For a thread that is forking, through the closed gate.
            let _inside = gate::enter(thread as i32);
            let page_addr = address & !(PAGE - 1);
            let access = Access {
                present: Some(wp),
                write: write && !wp,
                waits_for_window: false,
            };
            let start = crate::sys::monotonic_ns();
            // The faulting thread waits from its fault to its wake-up; what
            // is seen here is the serving of it (not the kernel's delivery).
            inner.registry().stall_begin(thread as i32);
            let mut stall = Stall::new();
            let wake = match lookup(address) {
                Some(Hit {
                    inner: owner,
                    id,
                    unit: Some(base),
                }) if std::ptr::eq(owner, &*inner) => {
                    fault::serve_unit(&inner, base, id, address, access, &mut stall);
                    // Every thread waiting in the unit may go on.
                    Some((base, UNIT_BYTES as u64))
                }
                Some(Hit {
                    inner: owner,
                    id,
                    unit: None,
                }) if std::ptr::eq(owner, &*inner) => {
                    fault::serve(&inner, address, id, access, &mut stall).then_some((page_addr, PAGE))
                }
                // Not a region (a region being unmapped, the staging
                // area): let the thread retry.
                _ => Some((page_addr, PAGE)),
            };
            let took = crate::sys::monotonic_ns().saturating_sub(start);
            inner.counters().fault_ns.add(took);
            inner.registry().fault_latency(took);
            stall.count(&inner, took);
            if let Some((at, len)) = wake {
                // A failed wake means the range is gone (unmapped): the
                // thread waiting there was woken by the unmap.
                let _ = inner.uffd().wake(at, len);
            }
            inner.registry().stall_end();
            // A handler thread is a safe point: no program lock is held
            // here, and this is no signal handler.
            start_wanted(&inner);
            // The spin counts from the end of the last service.
            last = crate::sys::monotonic_ns();
        }
    })
}

/// The prefetcher thread (its loop is readahead's, `fault/readahead.rs`).
pub(crate) fn spawn_prefetcher(weak: Weak<Inner>) -> UswapThread {
    signals::spawn("uswap-readahead", move || readahead::prefetcher(weak))
}

/// The longest an idle reclaimer sleeps: the levels it publishes, the
/// domain's share it takes, the forked children whose slots it frees and
/// the signal set-up it watches are looked at this often when nothing
/// else wakes it.
const IDLE_SLEEP: Duration = Duration::from_millis(100);

/// The reclaimer's pause over the low watermark when a pass took nothing.
const STUCK_SLEEP: Duration = Duration::from_millis(1);

/// The background reclaimer: keeps resident pages under the low watermark,
/// and, in SIGBUS mode, watches the process's signal set-up.
pub(crate) fn spawn_reclaimer(weak: Weak<Inner>, watching: bool) -> UswapThread {
    const WATCH_EVERY: Duration = Duration::from_millis(100);
    const SCAN_EVERY: u32 = 5;
    signals::spawn("uswap-reclaim", move || {
        let mut last_watch = Instant::now();
        let mut watches = 0u32;
        // The levels that cost a lock or a read of /proc, for readers of
        // the statistics block: every 100 ms, the first pass included.
        const LEVELS_EVERY: Duration = Duration::from_millis(100);
        let mut last_levels = Instant::now() - LEVELS_EVERY;
        // The reader (`uswap gdb`) whose request to hold the memory in
        // this thread has met, 0 for none.
        let mut held = (0, Vec::new());
        if Inner::upgrade(&weak).is_some_and(|inner| inner.paced()) {
            // Paced reclaim: the faults carry what the program's CPUs
            // must, and this thread runs on what they leave (see
            // `reclaim::pace`).  Raising one's own nice needs no
            // privilege; a failure leaves the thread as it was.
            // SAFETY: gettid and setpriority have no memory-safety
            // preconditions; they change this thread's priority only.
            unsafe {
                let tid = libc::gettid();
                libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19);
            }
        }
        // Swap files are written back through an io_uring of this
        // thread's, several writes in flight; without one, one `pwrite` at
        // a time.  A refusal by policy (ENOSYS from a seccomp profile, as
        // Podman's default; EPERM from `kernel.io_uring_disabled`) is the
        // environment's choice, and the fallback is as correct: an event
        // for `uswap stat`, not a line on the program's stderr in every
        // process of the tree.  Anything else is said once.
        let mut ring = match Inner::upgrade(&weak) {
            Some(inner) if inner.backing().devices.iter().any(|d| d.waits_on_disk()) => {
                // And one for the faults' reads (readahead.rs), refused
                // as this one would be; once (a forked child's is its
                // parent's, which it leaves alone).
                if inner.read_ahead_batched() && inner.backing().read_ring.get().is_none() {
                    if let Ok(r) = ReadRing::new() {
                        let _ = inner.backing().read_ring.set(LentRing::new(r));
                    }
                }
                match WriteRing::new() {
                    Ok(r) => Some(r),
                    Err(e) => {
                        let errno = e.raw_os_error().unwrap_or(0);
                        inner
                            .registry()
                            .event(crate::stats::EventKind::NoIoUring, errno as u64);
                        if errno != libc::ENOSYS && errno != libc::EPERM {
                            report::line(format_args!(
                                "uswap: no io_uring here ({e}); swap file writes go one pwrite at a time"
                            ));
                        }
                        None
                    }
                }
            }
            _ => None,
        };
        // The unnamed files' last close is a ring's, after the exit
        // (`WriteRing::hold_files`): the write ring's, or where there is
        // none (a tier: its store writes its file itself) one that only
        // holds them, for as long as this thread runs.  A refusal leaves
        // it to the exit, as before.
        let _hold = Inner::upgrade(&weak).and_then(|inner| {
            let fds: Vec<_> = inner
                .backing()
                .devices
                .iter()
                .flat_map(|d| d.unlinked_files())
                .collect();
            if fds.is_empty() {
                return None;
            }
            match ring.as_mut() {
                Some(r) => {
                    let _ = r.hold_files(&fds);
                    None
                }
                None => crate::io::FileHold::new(&fds).ok(),
            }
        });
        loop {
            let Some(inner) = Inner::upgrade(&weak) else {
                return;
            };
            let inside = gate::enter(0);
            if watching && last_watch.elapsed() >= WATCH_EVERY {
                last_watch = Instant::now();
                watches += 1;
                watch(watches % SCAN_EVERY == 1, &inner);
            }
            tend_hold(&inner, &mut held);
            if let Some((slots, units)) = inner.backing().hold.release_if_done() {
                slots.into_iter().for_each(|e| inner.free_slot(e));
                units.into_iter().for_each(|e| inner.free_huge(e));
            }
            let resident = inner.budget().resident();
            inner.budget().note_peak(resident);
            let slow = last_levels.elapsed() >= LEVELS_EVERY;
            if slow {
                last_levels = Instant::now();
            }
            inner.publish_levels(resident, slow);
            if resident > inner.budget().low() && inner.backing().closed.load(Ordering::Relaxed) {
                inner.open_layers();
            }
            inner.tell_domain(resident, true);
            // Held to the budget: resident pages less those on probation.
            let charged = inner.budget().charged();
            let over = charged > inner.budget().low();
            if over && reclaim::reclaim(&inner, charged - inner.budget().low(), ring.as_mut()) > 0 {
                continue;
            }
            // Idle: the frames written back and not yet discarded (a
            // batch waits to be full) go now.
            inner.frames().staging.flush_retired();
            drop(inside);
            if over {
                // Over the low watermark with nothing to take (pinned,
                // shared, unevictable, writeback paused): a millisecond
                // before the next look, deaf to kicks, which would come
                // with every fault and find nothing either.
                drop(inner);
                std::thread::sleep(STUCK_SLEEP);
                continue;
            }
            // Asleep until a fault past the wake mark (or a new budget)
            // kicks it, or the next look at the levels, the domain, the
            // forked children and the signal set-up.  It slept a
            // millisecond at a time once, a thousand wake-ups a second in
            // an idle process.
            inner
                .background()
                .sleep(IDLE_SLEEP, || inner.budget().charged() >= inner.budget().wake());
            drop(inner);
        }
    })
}

/// Meet a reader's request to hold the memory in (`uswap gdb`: the
/// statistics block's `hold_by`), or let go when it is withdrawn or its
/// reader has died.  `held` is the reader met and the spans marked not
/// to be dumped meanwhile (`bring::hold_for_reader`).
fn tend_hold(inner: &Inner, held: &mut (i32, Vec<(u64, u64)>)) {
    let asked = inner.registry().hold_asked();
    // A reader of another user (root reading a process of nobody's) is
    // alive where the signal is refused.
    // SAFETY: kill with signal 0 sends nothing; it checks the pid.
    let alive = asked > 0
        && (unsafe { libc::kill(asked, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM));
    let want = if alive { asked } else { 0 };
    if want == held.0 {
        return;
    }
    let spans = std::mem::take(&mut held.1);
    if held.0 != 0 {
        crate::pager::fault::bring::let_go_for_reader(inner, spans);
    }
    if want != 0 {
        held.1 = crate::pager::fault::bring::hold_for_reader(inner);
    }
    held.0 = want;
    inner.registry().set_held_for(want);
}
