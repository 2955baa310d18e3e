//! The fork gate: no thread may be in the middle of the pager's work when
//! a fork copies the address space, or the child would inherit a claim or
//! a lock that nobody will release (fork.rs).  Every piece of work (a
//! fault served, an eviction pass, a readahead, a region mapped or
//! discarded) is done inside the gate ([`enter`]); the forking thread
//! closes it ([`close`]) and waits until no one is inside.  Its own faults
//! meanwhile (a later `atfork` handler, glibc's fork itself touching heap
//! memory) go through: the forking thread is exempt, and so is a handler
//! thread serving that thread's fault.

use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};

use crossbeam_utils::CachePadded;

use crate::pager::instance::page;

/// 1 while a fork is being prepared: work waits at the gate.  A futex
/// word.
static FORKING: AtomicU32 = AtomicU32::new(0);
/// The thread that forks: its own work goes through the gate.
static FORKER: AtomicI32 = AtomicI32::new(0);

const BUCKETS: usize = 64;
/// Threads inside the gate, counted per bucket of thread ids (as the
/// SIGBUS handler's count is): two atomic adds per piece of work, no
/// shared line for all CPUs to fight over.
static INSIDE: [CachePadded<AtomicU32>; BUCKETS] = [const { CachePadded::new(AtomicU32::new(0)) }; BUCKETS];

/// Inside the gate until dropped.
pub(crate) struct Inside(&'static AtomicU32);

impl Drop for Inside {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

/// Enter the gate, waiting while a fork is prepared, unless the work is
/// for `for_tid`, the forking thread (0: for no thread in particular).
pub(crate) fn enter(for_tid: i32) -> Inside {
    // SAFETY: gettid has no preconditions.
    enter_as(unsafe { libc::gettid() }, for_tid)
}

/// [`enter`] for a caller that knows its thread id `tid` already (the
/// SIGBUS handler: a system call less per fault).  Allocation-free and
/// async-signal-safe.
pub(crate) fn enter_as(tid: i32, for_tid: i32) -> Inside {
    let bucket = &INSIDE[tid as usize % BUCKETS];
    loop {
        bucket.fetch_add(1, Ordering::SeqCst);
        // Pairs with the fence in `prepare`: either the forker sees this
        // count, or this sees its flag.
        std::sync::atomic::fence(Ordering::SeqCst);
        if FORKING.load(Ordering::SeqCst) == 0 {
            return Inside(bucket);
        }
        let forker = FORKER.load(Ordering::SeqCst);
        if forker != 0 && (forker == tid || forker == for_tid) {
            return Inside(bucket);
        }
        bucket.fetch_sub(1, Ordering::SeqCst);
        while FORKING.load(Ordering::Acquire) != 0 {
            // SAFETY: a live static word, while it is 1.
            unsafe { crate::sys::futex_wait(FORKING.as_ptr(), 1, None) };
        }
    }
}

/// Open the gate and wake whoever waits at it.
pub(crate) fn open() {
    FORKER.store(0, Ordering::SeqCst);
    FORKING.store(0, Ordering::SeqCst);
    crate::sys::futex_wake(FORKING.as_ptr() as usize, i32::MAX);
}

/// Close the gate (the forking thread, before the fork) and wait until no
/// other thread is inside.
pub(crate) fn close() {
    // SAFETY: gettid has no preconditions.
    FORKER.store(unsafe { libc::gettid() }, Ordering::SeqCst);
    FORKING.store(1, Ordering::SeqCst);
    std::sync::atomic::fence(Ordering::SeqCst);
    let mut spins = 0u32;
    while INSIDE.iter().any(|b| b.load(Ordering::SeqCst) != 0) {
        spins += 1;
        if spins < 100 {
            std::hint::spin_loop();
        } else {
            page::pause();
        }
    }
}

/// In a forked child: nobody else is inside (only the forking thread
/// exists); counts of threads that are not here are dropped.
pub(crate) fn reset() {
    for b in &INSIDE {
        b.store(0, Ordering::Relaxed);
    }
    // The gate stays closed until the child's handler is done; this
    // thread (the child's only one) is the forker now.
    // SAFETY: gettid has no preconditions.
    FORKER.store(unsafe { libc::gettid() }, Ordering::SeqCst);
}
