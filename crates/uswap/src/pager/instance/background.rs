//! The background threads' state: whether the reclaimer and the
//! prefetcher run, are wanted, or are not needed yet; and the word the
//! idle reclaimer sleeps on.
//!
//! An instance built to start them on need (`SwapBuilder::threads_on_need`,
//! which `uswap run` sets) starts neither until it has something for them:
//! a process that never nears its budget runs no thread of uswap's at all
//! (but under `--budget auto`, whose budget comes down under every process
//! past 32 MiB: there each such process wants its reclaimer, to follow
//! the budget when it neither faults nor allocates, `reclaim::driven_live`).
//! Under `uswap run` uswap is a guest in the program's process, and a
//! thread of its own is seen: CPython warns at every `fork` of a process
//! with more than one thread ("use of fork() may lead to deadlocks"), and
//! an error under `-W error`; a short-lived process of a shell pipeline
//! pays for two thread starts; an idle reclaimer woke every millisecond.
//!
//! The need is found where it arises, on the fault path (resident pages
//! past the low watermark, a readahead handed over), often in a SIGBUS
//! handler, where a thread cannot be started (the interrupted code may
//! hold the locks `pthread_create` takes, or be inside the allocator):
//! [`Background::want`] only marks it.  The threads start at the next
//! safe point (`entry/threads.rs`, `start_wanted`): a handler thread
//! between faults, a fork's parent handler, `Swap::set_budget`, or an
//! allocation or mapping the program makes from its own code (`uswap
//! run`'s `malloc`, `calloc`, `realloc` and `mmap`).  Until then faults
//! reclaim for themselves, as they do whenever the reclaimer falls
//! behind, and always on devices in memory, where the reclaimer takes
//! nothing ahead of them (`SwapBuilder::reclaim_ahead_in_memory`).  A
//! program may reach no safe point after the need: one that allocates
//! its working set and then only computes over it.  So where
//! the swap waits on a disk, a large allocation that would carry the
//! process past its low watermark wants the threads itself, before it is
//! touched, and starts them there (`pager::expect_growth`; on compressed
//! RAM a fault's own reclaim is cheaper for the program than a reclaimer
//! on the other CPU, `entry/threads.rs`'s `expect`).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};

/// Not needed yet.
const IDLE: u8 = 0;
/// Needed: to be started at the next safe point.
const WANTED: u8 = 1;
/// Started (or being started by the one caller that took it).
const RUNNING: u8 = 2;

/// Some instance of this process wants its threads started: the one load
/// `uswap run`'s `malloc` makes.
static ANY_WANTED: AtomicBool = AtomicBool::new(false);

/// Whether any instance of this process waits for its threads.
#[inline]
pub fn any_wanted() -> bool {
    ANY_WANTED.load(Ordering::Relaxed)
}

pub(crate) struct Background {
    /// IDLE, WANTED or RUNNING.
    state: AtomicU8,
    /// Bumped to wake the reclaimer from its idle sleep, its futex word.
    kick: AtomicU32,
    /// The reclaimer is asleep (or about to be): a fault past the low
    /// watermark kicks it.  Set before the reclaimer's last look at the
    /// resident count, read after the fault's charge, both SeqCst: one of
    /// the two sees the other.
    sleeping: AtomicBool,
    /// Faults since the last publication of the levels, while no
    /// reclaimer publishes them.
    ticks: AtomicU32,
}

impl Background {
    /// Background threads started at build (`on_need` false) or on need.
    pub fn new(on_need: bool) -> Background {
        Background {
            state: AtomicU8::new(if on_need { IDLE } else { RUNNING }),
            kick: AtomicU32::new(0),
            sleeping: AtomicBool::new(false),
            ticks: AtomicU32::new(0),
        }
    }

    /// Whether the background threads run (or are starting).
    #[inline]
    pub fn running(&self) -> bool {
        self.state.load(Ordering::Acquire) == RUNNING
    }

    /// Ask for the threads: allocation-free, from any context.
    #[inline]
    pub fn want(&self) {
        if self.state.load(Ordering::Relaxed) == IDLE
            && self
                .state
                .compare_exchange(IDLE, WANTED, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            ANY_WANTED.store(true, Ordering::Relaxed);
        }
    }

    /// Whether they are wanted and not started: cheap, for the start points.
    #[inline]
    pub fn wanted(&self) -> bool {
        self.state.load(Ordering::Relaxed) == WANTED
    }

    /// Take the start: true for the one caller that starts them now.
    pub fn take_start(&self) -> bool {
        let took = self
            .state
            .compare_exchange(WANTED, RUNNING, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok();
        if took {
            ANY_WANTED.store(false, Ordering::Relaxed);
        }
        took
    }

    /// In a forked child, whose parent's threads are not there: started
    /// again at build's terms (`on_need`: when needed).
    pub fn reset(&self, on_need: bool) {
        self.state
            .store(if on_need { IDLE } else { RUNNING }, Ordering::Release);
        self.sleeping.store(false, Ordering::Relaxed);
    }

    /// The reclaimer's idle sleep, up to `most`: returns when kicked, or
    /// at once when `busy()` says there is work after all (checked after
    /// saying it sleeps, so that a kick is never lost).
    pub fn sleep(&self, most: std::time::Duration, busy: impl FnOnce() -> bool) {
        let seen = self.kick.load(Ordering::Acquire);
        self.sleeping.store(true, Ordering::SeqCst);
        // Pairs with the fence in `kick`: this sees the fault's charge, or
        // the fault sees this sleeping.
        std::sync::atomic::fence(Ordering::SeqCst);
        if !busy() {
            let ts = libc::timespec {
                tv_sec: most.as_secs() as libc::time_t,
                tv_nsec: most.subsec_nanos() as libc::c_long,
            };
            // SAFETY: a live word, while it still reads `seen` (a kick
            // since returns at once), for at most `ts`.
            unsafe { crate::sys::futex_wait(self.kick.as_ptr(), seen, Some(&ts)) };
        }
        self.sleeping.store(false, Ordering::Relaxed);
    }

    /// Wake the reclaimer if it sleeps: a fault past the wake mark,
    /// a new budget.  Allocation-free; a system call only when it sleeps.
    #[inline]
    pub fn kick(&self) {
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) && self.sleeping.swap(false, Ordering::AcqRel) {
            self.kick.fetch_add(1, Ordering::Release);
            crate::sys::futex_wake(self.kick.as_ptr() as usize, 1);
        }
    }

    /// Count a fault; true once every `every` (the levels and the domain
    /// are kept up to date by the faults while no reclaimer does it).
    #[inline]
    pub fn tick(&self, every: u32) -> bool {
        self.ticks.fetch_add(1, Ordering::Relaxed).is_multiple_of(every)
    }
}
