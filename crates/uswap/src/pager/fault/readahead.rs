//! Readahead: on a swap-in, the pages after it that are out too, read in
//! the same IO (a run of slots) or, from a swap file, by the prefetcher
//! thread while the program uses the window before (the kernel's
//! asynchronous readahead).  Here: the per-thread windows, the reads, and
//! the prefetcher thread's loop; the queue between a fault and that
//! thread is a part of the instance (`instance/prefetch.rs`), and
//! `entry/threads.rs` starts the thread.

use crate::pager::evict::{folio, reclaim};
use crate::pager::fault::trend;
use crate::pager::instance::gate;
use crate::pager::instance::inner::Inner;
use crate::pager::instance::page::{Kind, PageClaim, PageWord};
use crate::swap_space::SwapEntry;
use crate::PAGE_SIZE;
use crossbeam_utils::CachePadded;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Weak;
use std::time::Duration;
const PAGE: u64 = PAGE_SIZE as u64;

/// Most pages one fault reads ahead.
pub(crate) const READAHEAD_MAX: u32 = 32;

/// The resident pages a process holds before a first touch fills the
/// whole window ahead (wide fault-around): 4 MiB.  A small process (a
/// shell, `make`, a compiler driver) touches a page here and there of
/// its allocator's 64 KiB pages, each a wide fill of zeros it never
/// uses, and it holds them while it waits for its children, idle, with
/// no reclaimer running to give them back: a gcc driver held 1.3 MiB of
/// heap where it uses 0.2.  In a tree at its budget (`make -j2` at 24
/// MiB on a swap file) every such page was one the compilers paged for:
/// 7.6-7.9 s, and 4.5-5.2 s with small processes filling nothing ahead
/// (docs/results/issue44/2026-12-03/make-j2-file.txt).  A program that
/// maps and touches memory in pieces (Python's arenas) is past this in
/// its first milliseconds; its malloc churn ran as fast either way.
pub(crate) const WIDE_FROM: usize = 1024;

/// A fault's own read from a swap file, waiting to go out with its
/// window's (`install`, serve.rs): read alone first, the page and then
/// its window were two disk round trips, where the kernel's
/// swapin_readahead puts the faulted page in the window's plug with the
/// rest.  The first batched read of the window takes `job`; `read` says
/// whether it was read whole there.  Left untaken (no window, or none read
/// in a batch), the fault reads its page itself.
pub(crate) struct Lead<'a> {
    pub job: Option<crate::io::ReadJob<'a>>,
    pub read: bool,
}

/// Most pages a fault reclaims to make room for its window (`make_room`):
/// about 75 us of lz4.  The reclaim a walk needs is the same whatever the
/// bound (a page out for each page in); the bound sets who pays it.
/// Without one the fault that reads 32 pages also compresses 32: pmbench's
/// linear and backward walks ran at p99 740-760 us, above kernel zram's;
/// at 8 their p99 is 360-370 us and their median access still takes no
/// fault; 16 gave 520-550 us for no more throughput (one run each).
const ROOM_PER_FAULT: usize = 8;

/// The prefetcher: reads ahead the windows that faulting threads hand it
/// (`Prefetch`), so that a sequential reader of a swap file finds its next
/// pages in while it uses the ones read before them.  Runs until the
/// instance goes.
pub(crate) fn prefetcher(weak: Weak<Inner>) {
    loop {
        let Some(inner) = Inner::upgrade(&weak) else {
            return;
        };
        if let Some((id, addr, pages, write)) = inner.prefetch().take(Duration::from_millis(100)) {
            let _inside = gate::enter(0);
            read_ahead_range(&inner, addr, id, pages, write);
        }
    }
}

/// A thread's readahead state: where a fault counts as in order (from
/// just past what the thread read itself to the end of what it handed the
/// prefetcher), and the window; and for the trend prefetch (trend.rs), its
/// last fault, the deltas of its recent ones, and how far and how much
/// its last window read.  Per thread, as threads walk their own
/// parts of a region.
///
/// Not in thread-local storage: the fault path touches none.  A library
/// preloaded into a program (`uswap run`) reaches its thread-locals
/// through the thread's DTV, which glibc allocates for a new thread with
/// the program's `calloc`, that is in the paged heap: a SIGBUS handler
/// touching a DTV that is out would fault inside itself.  So the state
/// lives in a fixed table, a slot per hash of `pthread_self` (the thread's
/// control block, reached through the thread pointer itself), tagged with
/// its owner; a thread finding another's tag starts afresh and takes the
/// slot over.  Readahead is advice: two threads sharing a slot only read
/// ahead less well, and a torn read of a slot only mistakes the window.
/// (In handler-thread mode the handler thread serves every thread's
/// faults, so they share its slot: their walks interleave in one
/// history.)
struct Readahead {
    owner: AtomicU64,
    lo: AtomicU64,
    hi: AtomicU64,
    window: AtomicU32,
    /// The trend's window, stride and pages read last, a byte each.
    trend: AtomicU32,
    last: AtomicU64,
    history: AtomicU64,
    reach: AtomicU64,
}

/// One thread's readahead state, as loaded (all zeros: none yet).
#[derive(Clone, Copy, Default)]
struct State {
    lo: u64,
    hi: u64,
    window: u32,
    /// Trend prefetch: the window, stride and pages read by the last
    /// prefetch; the last fault; the deltas; the steps the last window
    /// reached (0: no trend window out).
    twindow: u32,
    stride: i8,
    tpages: u32,
    last: u64,
    history: u64,
    reach: u64,
}

impl State {
    /// A fault at `addr`, `delta` pages on in the history: no trend
    /// window out any more.
    fn step(&mut self, addr: u64, delta: i8) {
        self.history = trend::push(self.history, delta);
        self.last = addr;
        self.reach = 0;
        self.tpages = 0;
    }
}

const READAHEAD_SLOTS: usize = 64;

static READAHEAD: [CachePadded<Readahead>; READAHEAD_SLOTS] = [const {
    CachePadded::new(Readahead {
        owner: AtomicU64::new(0),
        lo: AtomicU64::new(0),
        hi: AtomicU64::new(0),
        window: AtomicU32::new(0),
        trend: AtomicU32::new(0),
        last: AtomicU64::new(0),
        history: AtomicU64::new(0),
        reach: AtomicU64::new(0),
    })
}; READAHEAD_SLOTS];

impl Readahead {
    /// The calling thread's slot, and its tag.
    fn mine() -> (&'static Readahead, u64) {
        // SAFETY: pthread_self has no preconditions (it reads the thread
        // pointer).
        let me = unsafe { libc::pthread_self() } as u64;
        let slot = (me.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 58) as usize % READAHEAD_SLOTS;
        (&READAHEAD[slot], me)
    }

    /// This thread's state; zeros if the slot is another's.
    fn get() -> State {
        let (r, me) = Self::mine();
        if r.owner.load(Ordering::Relaxed) != me {
            return State::default();
        }
        let t = r.trend.load(Ordering::Relaxed);
        State {
            lo: r.lo.load(Ordering::Relaxed),
            hi: r.hi.load(Ordering::Relaxed),
            window: r.window.load(Ordering::Relaxed),
            twindow: t & 0xff,
            stride: (t >> 8) as u8 as i8,
            tpages: t >> 16,
            last: r.last.load(Ordering::Relaxed),
            history: r.history.load(Ordering::Relaxed),
            reach: r.reach.load(Ordering::Relaxed),
        }
    }

    fn set(s: &State) {
        let (r, me) = Self::mine();
        r.owner.store(me, Ordering::Relaxed);
        r.lo.store(s.lo, Ordering::Relaxed);
        r.hi.store(s.hi, Ordering::Relaxed);
        r.window.store(s.window.min(READAHEAD_MAX), Ordering::Relaxed);
        let t = s.twindow.min(READAHEAD_MAX) | u32::from(s.stride as u8) << 8 | s.tpages.min(0xff) << 16;
        r.trend.store(t, Ordering::Relaxed);
        r.last.store(s.last, Ordering::Relaxed);
        r.history.store(s.history, Ordering::Relaxed);
        r.reach.store(s.reach, Ordering::Relaxed);
    }
}

/// Readahead after the fault on page `id` at `addr` (the kernel's
/// `swap_vma_readahead`, and fault-around for never-written pages): the
/// window doubles, from 2 to [`READAHEAD_MAX`], while faults come where
/// the last readahead ended, and halves otherwise; up to that many of the
/// following pages that are swapped out or never written are installed,
/// under their own claims, a run of alike pages (a run of neighbouring
/// slots read with one IO) with one `UFFDIO_COPY`.  A page is only ever
/// installed where it is missing and claimed, so a program's write to it
/// waits for the install and then takes its write-protect fault if it
/// went in clean: nothing it writes is overwritten.  It stops at the first
/// page that is neither, not this region's next page, claimed by someone
/// else, or would take the resident set over budget (readahead never
/// reclaims), and on any error (the page stays as it was; a fault on it
/// does the work and handles the error).
///
/// How a page goes in: read from RAM, writable and dirty (a program's
/// write to it then costs nothing, where a clean page's first write is a
/// write-protect fault and a TLB flush: pmbench's linear walk at 80% reads
/// ran 9% slower with clean read-ahead pages than with none, and writing
/// it back to RAM costs half a microsecond); read from a file, clean,
/// keeping its slot (writing it back would be an IO); never written, as
/// the fault's own page went in (a write fault: writable and dirty, so a
/// sequential writer takes one fault per run, not per page).
///
/// A first touch (`first_touch`: the fault installed zeros) while the
/// resident set is under half the budget and past [`WIDE_FROM`] fills
/// the whole window ([`READAHEAD_MAX`]) whatever the order of the faults
/// (`SwapBuilder::wide_fault_around`): a program far from its budget pays
/// one fault per run of fresh pages, not one per page, as it maps and
/// touches memory (Python maps arenas afresh and touches them in pieces,
/// out of order).  Zeros cost nothing to evict if they stay unused:
/// clean ones are dropped, dirty ones are found all zero at writeback and
/// go back to "never written", no slot.
pub(crate) fn read_ahead(
    inner: &Inner,
    addr: u64,
    id: u32,
    write: bool,
    from_file: bool,
    first_touch: bool,
    lead: Option<&mut Lead<'_>>,
) {
    let mut st = Readahead::get();
    let in_order = st.lo != 0 && st.lo <= addr && addr <= st.hi;
    let wide = first_touch
        && inner.wide_fault_around()
        && inner.budget().charged() < inner.budget().limit() / 2
        && inner.budget().charged() >= WIDE_FROM;
    if inner.trend_prefetch() && !in_order && !wide {
        // The trend's turn (trend.rs).  A fault on the trend's steps
        // within its window's reach is one step of it; just past the
        // reach, the whole window was passed over.
        let q = if st.stride != 0 {
            trend::on_trend(st.last, addr, st.stride, st.reach as u32)
        } else {
            None
        };
        if st.reach != 0 {
            let c = if q.is_some() {
                &inner.counters().trend_hits
            } else {
                &inner.counters().trend_wasted
            };
            c.add(u64::from(st.tpages));
        }
        let d = if q.is_some() {
            st.stride
        } else {
            trend::delta(st.last, addr)
        };
        let passed = q == Some(st.reach as u32 + 1);
        st.step(addr, d);
        st.stride = 0;
        if let Some(stride) = trend::majority(st.history).filter(|&t| t != 1) {
            st.twindow = match q {
                Some(_) if !passed => st.twindow.max(2),
                _ => trend::next_window(st.twindow, passed, READAHEAD_MAX),
            };
            st.stride = stride;
            let (pages, reach) = prefetch_trend(inner, addr, id, stride, st.twindow, write, lead);
            (st.tpages, st.reach) = (pages, u64::from(reach));
            (st.lo, st.hi, st.window) = (0, 0, 0);
            Readahead::set(&st);
            return;
        }
    } else {
        // In order (or filling fresh memory): the forward path's step.
        st.step(addr, 1);
    }
    let window = if in_order {
        (st.window * 2).clamp(2, READAHEAD_MAX)
    } else {
        st.window / 2
    };
    let window = if wide { READAHEAD_MAX } else { window };
    // After a read from a swap file, this thread reads a quarter of the
    // window itself and hands the prefetcher the window after it, to be
    // read while the program uses what is in already.  (Zero fills and
    // reads from RAM cost less than the hand-over: done here, whole.)
    // Handed over only to a prefetcher that runs; one that starts on need
    // is wanted now (until then this thread reads the whole window).
    let handed = from_file && inner.prefetch().on && window >= 4;
    if handed && !inner.background().running() {
        inner.background().want();
    }
    let prefetch = handed && inner.background().running();
    let sync = if prefetch { window / 4 } else { window };
    // Only a window that grew from faults in order: a first touch's
    // window fills fresh memory, far below the budget or not at all.
    if in_order {
        make_room(inner, sync);
    }
    let done = read_ahead_span(inner, addr + PAGE, id + 1, sync, write, lead);
    let end = addr + PAGE * (1 + done as u64);
    st.window = window;
    if prefetch && done == sync {
        inner.prefetch().post(id + 1 + done, end, window, write);
        (st.lo, st.hi) = (end, end + PAGE * window as u64);
    } else {
        (st.lo, st.hi) = (end, end);
    }
    Readahead::set(&st);
}

/// Room under the budget for a window of `pages` read ahead: on devices
/// in memory (paced, where reclaim waits on no disk), up to
/// [`ROOM_PER_FAULT`] pages reclaimed as a paced fault would, the coldest
/// for pages a walk is about to touch; elsewhere left to the reclaimer.
/// Without it a window reads nothing at the budget (a read ahead never
/// goes past it), and a walk near its budget, where a paced program
/// spends its time, faulted on every other page: pmbench's linear walk
/// swapped in on 50% of its accesses, p50 27 us.  The kernel's readahead
/// allocates its pages, and so reclaims, the same way.
fn make_room(inner: &Inner, pages: u32) {
    let room = room(inner);
    if room < pages as usize && inner.paced() {
        reclaim::reclaim(inner, (pages as usize - room).min(ROOM_PER_FAULT), None);
    }
}

/// Pages a read ahead may install before the resident set meets the
/// budget (`read_ahead_run` stops there).
fn room(inner: &Inner) -> usize {
    let b = inner.budget();
    b.limit().saturating_sub(b.charged() + 1)
}

/// Install up to `pages` pages from page `id` at `addr` on, run by run,
/// stopping at the first that cannot go in: how many went in.  With the
/// read ring free, the runs' reads go out together, with the fault's own
/// (`lead`) where it waits ([`read_ahead_batched`]).
fn read_ahead_span(
    inner: &Inner,
    addr: u64,
    id: u32,
    pages: u32,
    write: bool,
    lead: Option<&mut Lead<'_>>,
) -> u32 {
    if pages > 1 || (pages == 1 && lead.is_some()) {
        if let Some(mut ring) = inner.backing().read_ring.get().and_then(|r| r.borrow()) {
            return read_ahead_batched(inner, &mut ring, addr, id, pages, write, lead);
        }
    }
    let mut done = 0;
    while done < pages {
        let k = read_ahead_run(
            inner,
            addr + PAGE * u64::from(done),
            id + done,
            pages - done,
            write,
        );
        if k == 0 {
            break;
        }
        done += k;
    }
    done
}

/// Read in up to `window` pages along `stride` from the fault on page `id`
/// at `addr`.  Returns how many went in and the steps the window reached
/// (pages in already are stepped over; a page not this region's, or that
/// another thread is serving, ends it).
fn prefetch_trend(
    inner: &Inner,
    addr: u64,
    id: u32,
    stride: i8,
    window: u32,
    write: bool,
    lead: Option<&mut Lead<'_>>,
) -> (u32, u32) {
    let s = i64::from(stride);
    let at = |k: i64| ((id as i64) + k * s, (addr as i64) + k * s * PAGE as i64);
    let mut done = 0;
    let mut reach = 0;
    make_room(inner, window);
    if stride == -1 {
        // A backward walk: the run below the fault, read upwards with
        // one IO per run of neighbouring slots.  First how far down the
        // pages are out (or never written) and this region's.
        let mut n = 0;
        while n < window {
            let (nid, naddr) = at(i64::from(n) + 1);
            if !eligible(inner, nid, naddr) {
                break;
            }
            n += 1;
        }
        // No more than the budget has room for, or the run would go in
        // from its far end and leave a gap below the fault.
        n = n.min(room(inner) as u32);
        reach = n;
        let (lo_id, lo_addr) = at(i64::from(n));
        done = read_ahead_span(inner, lo_addr as u64, lo_id as u32, n, write, lead);
    } else {
        for k in 1..=i64::from(window) {
            let (nid, naddr) = at(k);
            if nid < 0 || naddr <= 0 || !ours(inner, nid, naddr) {
                break;
            }
            if eligible(inner, nid, naddr) {
                let k = read_ahead_run(inner, naddr as u64, nid as u32, 1, write);
                if k == 0 {
                    // At the budget (readahead never reclaims), or taken
                    // meanwhile.
                    break;
                }
                done += k;
            }
            // Else in already (or being served): stepped over.
            reach = k as u32;
        }
    }
    inner.counters().trend_issued.add(u64::from(done));
    (done, reach)
}

/// Page `nid` is this region's page at `naddr`.
fn ours(inner: &Inner, nid: i64, naddr: i64) -> bool {
    nid >= 0 && (nid as usize) < inner.states().len() && inner.addrs().get(nid as u32) == naddr as u64
}

/// Page `nid` at `naddr` is this region's and out (or never written), so
/// a read ahead may install it.
fn eligible(inner: &Inner, nid: i64, naddr: i64) -> bool {
    if !ours(inner, nid, naddr) {
        return false;
    }
    let w = inner.states()[nid as usize].load();
    matches!(w.kind(), Kind::Swapped | Kind::Never) && !w.is_busy() && !w.is_unit()
}

/// The prefetcher's part: read ahead `pages` pages from page `id` at
/// `addr`, run by run, stepping over pages that are in already.
pub(crate) fn read_ahead_range(inner: &Inner, addr: u64, id: u32, pages: u32, write: bool) {
    let mut done = 0;
    while done < pages {
        let k = read_ahead_run(inner, addr + PAGE * done as u64, id + done, pages - done, write);
        if k == 0 {
            // In already, claimed, another region's, or over budget: one
            // page on (a claimed page is being served by its fault).
            let nid = (id + done) as usize;
            if inner.addrs().get(nid as u32) != addr + PAGE * done as u64
                || inner.budget().charged() + 1 >= inner.budget().limit()
            {
                return;
            }
            done += 1;
            continue;
        }
        inner.counters().prefetched.add(u64::from(k));
        done += k;
    }
}

/// Install the run of alike pages at `addr` (page `id` on), at most `max`:
/// returns how many went in.
fn read_ahead_run(inner: &Inner, addr: u64, id: u32, max: u32, write: bool) -> u32 {
    let Some(mut run) = plan_run(inner, addr, id, max, write, 0) else {
        return 0;
    };
    read_run(inner, &mut run);
    finish_run(inner, run)
}

/// Read a planned run's swapped pages into its frames, one IO per segment
/// of neighbouring slots; a failed one ends the run where it starts.
fn read_run(inner: &Inner, run: &mut Run<'_>) {
    if let Some(held) = run.bounce.as_mut() {
        if let Err(failed) = folio::read(inner, |j| run.slots[j], held.bytes()) {
            run.n = failed.done;
        }
    }
}

/// Most runs a batched window plans before its reads go out together.
const BATCH_RUNS: usize = 8;
/// Most reads a batched window puts in flight: a segment of neighbouring
/// slots each.
const BATCH_READS: usize = 32;

/// [`read_ahead_span`] with the runs' reads in flight together, through
/// the instance's read ring (`io::ReadRing`): the runs are planned (their
/// pages claimed and frames held) one after the other as far as the
/// window, up to [`BATCH_RUNS`], their segments read with one submission,
/// and each run installed as it would be alone.  A run whose reads did
/// not all work is read again the ordinary way, where it meets its own
/// error.  The fault's own read (`lead`), where it waits to go with the
/// window, is the batch's first.  Returns the pages installed before the
/// first run that fell short.
fn read_ahead_batched(
    inner: &Inner,
    ring: &mut crate::io::ReadRing,
    addr: u64,
    id: u32,
    pages: u32,
    write: bool,
    lead: Option<&mut Lead<'_>>,
) -> u32 {
    let mut runs: [Option<Run<'_>>; BATCH_RUNS] = [const { None }; BATCH_RUNS];
    let (mut planned, mut at) = (0, 0u32);
    while planned < BATCH_RUNS && at < pages {
        let Some(run) = plan_run(
            inner,
            addr + PAGE * u64::from(at),
            id + at,
            pages - at,
            write,
            at as usize,
        ) else {
            break;
        };
        at += run.n as u32;
        runs[planned] = Some(run);
        planned += 1;
    }
    if planned == 0 {
        // No window after all: the fault reads its page alone.
        return 0;
    }
    // Each run's segments, as jobs on the ring; a run whose segments do
    // not all fit is left to be read alone.
    let mut read = [false; BATCH_RUNS];
    {
        let mut jobs: [Option<crate::io::ReadJob<'_>>; BATCH_READS] = [const { None }; BATCH_READS];
        let mut run_of = [0u8; BATCH_READS];
        let mut ok = [false; BATCH_READS];
        let mut nj = 0;
        // The fault's page first: no run's (`LEAD`).
        const LEAD: u8 = u8::MAX;
        let mut lead = lead;
        if let Some(job) = lead.as_mut().and_then(|l| l.job.take()) {
            jobs[0] = Some(job);
            run_of[0] = LEAD;
            nj = 1;
        }
        for (r, run) in runs.iter_mut().enumerate().take(planned) {
            let Some(run) = run.as_mut() else { continue };
            let Some(held) = run.bounce.as_mut() else {
                continue;
            };
            let (n, slots) = (run.n, &run.slots);
            let mut segments = 0;
            let _ = folio::segments(
                n,
                |j| slots[j],
                |_, _, _| {
                    segments += 1;
                    Ok(())
                },
            );
            if nj + segments > BATCH_READS {
                continue;
            }
            let mut rest: &mut [u8] = held.bytes();
            let _ = folio::segments(
                n,
                |j| slots[j],
                |_, pages, e| {
                    let (buf, tail) = std::mem::take(&mut rest).split_at_mut(pages * PAGE_SIZE);
                    rest = tail;
                    jobs[nj] = Some(crate::io::ReadJob {
                        device: &inner.backing().devices[e.device() as usize],
                        offset: e.offset(),
                        buf,
                    });
                    run_of[nj] = r as u8;
                    nj += 1;
                    Ok(())
                },
            );
            read[r] = true;
        }
        ring.read_batch(&mut jobs[..nj], &mut ok[..nj]);
        for j in 0..nj {
            if run_of[j] == LEAD {
                if let Some(l) = lead.as_mut() {
                    l.read = ok[j];
                }
            } else if !ok[j] {
                read[run_of[j] as usize] = false;
            }
        }
    }
    let mut done = 0;
    let mut short = false;
    for (r, run) in runs.iter_mut().enumerate().take(planned) {
        let mut run = run.take().expect("planned");
        let want = run.n as u32;
        if !read[r] {
            read_run(inner, &mut run);
        }
        let k = finish_run(inner, run);
        if !short {
            done += k;
        }
        short |= k < want;
    }
    done
}

/// A run of alike pages claimed for reading ahead, and the frames it is
/// read into (none for pages never written, which copy from the zero
/// pages).
struct Run<'a> {
    id: u32,
    addr: u64,
    n: usize,
    claims: [Option<PageClaim<'a>>; READAHEAD_MAX as usize],
    slots: [SwapEntry; READAHEAD_MAX as usize],
    never: bool,
    dirty: bool,
    device: u16,
    sealed: bool,
    bounce: Option<crate::pager::instance::frames::HeldFrames<'a>>,
}

/// Claim the run of alike pages at `addr` (page `id` on), at most `max`,
/// with `reserved` pages of runs claimed before it still to be charged,
/// and hold its frames: the run, or `None` where no page can go in.
fn plan_run<'a>(
    inner: &'a Inner,
    addr: u64,
    id: u32,
    max: u32,
    write: bool,
    reserved: usize,
) -> Option<Run<'a>> {
    const MAX: usize = READAHEAD_MAX as usize;
    let mut run = Run {
        id,
        addr,
        n: 0,
        claims: [const { None }; MAX],
        slots: [SwapEntry::NONE; MAX],
        never: false,
        dirty: false,
        device: 0,
        sealed: false,
        bounce: None,
    };
    let (mut never, mut dirty, mut device) = (false, false, 0);
    // Whether pages whose device keeps its copy come in writable this
    // run: the program writes what it reads (seal.rs, "Clean pages").
    let mut writable = None;
    let mut n = 0;
    while n < (max as usize).min(MAX) {
        let (nid, naddr) = (id as usize + n, addr + PAGE * n as u64);
        if nid >= inner.states().len()
            || inner.addrs().get(nid as u32) != naddr
            || inner.budget().charged() + reserved + n + 1 >= inner.budget().limit()
        {
            break;
        }
        let st = &inner.states()[nid];
        let w = st.load();
        let kind = w.kind();
        if (kind != Kind::Swapped && kind != Kind::Never) || w.is_busy() || w.is_unit() {
            break;
        }
        let e = w.slot();
        let this_never = kind == Kind::Never;
        let this_device = e.map_or(0, |e| e.device());
        let this_dirty = match e {
            None => write,
            Some(e) => {
                let d = &inner.backing().devices[e.device() as usize];
                d.read_ahead_dirty(e.offset())
                    || (d.waits_on_disk() && *writable.get_or_insert_with(|| !inner.clean_gate().seal()))
            }
        };
        if n > 0 && (this_never != never || this_dirty != dirty || this_device != device) {
            break;
        }
        let Some(claim) = st.try_claim(w) else {
            break;
        };
        (never, dirty, device) = (this_never, this_dirty, this_device);
        run.slots[n] = e.unwrap_or(SwapEntry::NONE);
        run.claims[n] = Some(claim);
        n += 1;
    }
    if n == 0 {
        return None;
    }
    // Pages let go by a compressed device come in sealed while that pays
    // (seal.rs; see serve).
    run.sealed = !never
        && dirty
        && inner.backing().devices[device as usize].lets_copies_go()
        && inner.seal_gate().seal();
    (run.never, run.dirty, run.device) = (never, dirty, device);
    if !never {
        // Neighbouring bounce frames for a swapped run (as many as there
        // are: the run shrinks to fit), read with one IO where its slots
        // are neighbours too.
        let pool = &inner.frames().bounce;
        let mut nb = n;
        let held = loop {
            if let Some(held) = pool.hold_run(nb as u32) {
                break held;
            }
            nb /= 2;
            if nb == 0 {
                return None;
            }
        };
        // The pages past what the frames hold are let go now, not after
        // the reads: a fault on one need not wait for them.
        for claim in run.claims.iter_mut().take(n).skip(nb) {
            drop(claim.take());
        }
        n = nb;
        run.bounce = Some(held);
    }
    run.n = n;
    Some(run)
}

/// Install a planned run, its frames read (`run.n` cut to the pages read
/// where a read failed): returns how many went in.
fn finish_run(inner: &Inner, mut run: Run<'_>) -> u32 {
    let (never, dirty, sealed, device, n) = (run.never, run.dirty, run.sealed, run.device, run.n);
    let src = match run.bounce.as_ref() {
        Some(held) => held.addr(),
        None => inner.frames().zero.addr(),
    };
    let copied = if n == 0 {
        0
    } else {
        match inner.copy(run.addr, src as *const u8, n as u64 * PAGE, !dirty || sealed) {
            Ok(()) => n,
            Err((done, _)) => (done / PAGE) as usize,
        }
    };
    drop(run.bounce.take());
    // What went in is committed; the claims of the rest are dropped (with
    // the run), leaving those pages as they were.
    let slots = run.slots;
    for (j, claim) in run.claims.iter_mut().enumerate().take(copied) {
        let claim = claim.take().expect("claimed");
        let nid = run.id + j as u32;
        inner.budget().charge(1);
        let next = if never {
            inner.counters().fault_around.inc();
            if dirty {
                PageWord::of(Kind::Resident).dirty()
            } else {
                PageWord::of(Kind::Resident)
            }
        } else {
            inner.counters().readahead.inc();
            if dirty {
                inner.free_slot(slots[j]);
                PageWord::of(Kind::Resident).dirty().sealed_if(sealed)
            } else {
                if inner.backing().devices[device as usize].waits_on_disk() {
                    inner.clean_gate().sealed(1);
                }
                PageWord::of(Kind::Resident).with_slot(slots[j])
            }
        };
        claim.commit(next);
        // Inactive: read ahead, not yet used; the first to go if unused.
        inner.lru().add(nid);
    }
    if sealed && copied > 0 {
        inner.seal_gate().sealed(copied as u64);
        inner.counters().sealed_in.add(copied as u64);
    }
    copied as u32
}
