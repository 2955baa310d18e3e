//! The prefetcher's queue: readahead windows that faulting threads hand
//! to the prefetcher thread (`threads.rs`), which reads them ahead
//! (`readahead.rs`) while they go on.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};

/// Readahead the prefetcher thread does while faulting threads go on:
/// the next window of a sequential reader of a swap file, read while the
/// program uses the window read before it (the kernel's asynchronous
/// readahead).  Requests are advice: when the queue is full a new one is
/// dropped.
pub(crate) struct Prefetch {
    /// Whether there is a prefetcher (a file device, readahead on).
    pub on: bool,
    /// Requests, oldest first; a plain mutex, a leaf: held only to push or
    /// pop, never while touching region memory, and only inside the fork
    /// gate (a child must not inherit it held).
    pub queue: std::sync::Mutex<PrefetchQueue>,
    /// Bumped by every post (and by shutdown): the prefetcher sleeps on
    /// it as a futex word, outside the gate and without the lock.
    pub posted: AtomicU32,
}

/// Requests: (first page id, its address, pages, whether the fault that
/// asked was a write), oldest first.  Never more than
/// [`PrefetchQueue::CAP`], which its allocation holds: posting from the
/// SIGBUS handler allocates nothing.
pub(crate) struct PrefetchQueue {
    reqs: VecDeque<(u32, u64, u32, bool)>,
}

impl PrefetchQueue {
    const CAP: usize = 16;
}

impl Prefetch {
    pub fn new(on: bool) -> Prefetch {
        Prefetch {
            on,
            queue: std::sync::Mutex::new(PrefetchQueue {
                reqs: VecDeque::with_capacity(PrefetchQueue::CAP),
            }),
            posted: AtomicU32::new(0),
        }
    }

    /// Ask for `pages` pages from page `id` at `addr` to be read ahead.
    /// Allocation-free: the SIGBUS handler calls it.
    pub fn post(&self, id: u32, addr: u64, pages: u32, write: bool) {
        let Ok(mut q) = self.queue.lock() else {
            return;
        };
        if q.reqs.len() == PrefetchQueue::CAP {
            return;
        }
        q.reqs.push_back((id, addr, pages, write));
        drop(q);
        self.wake();
    }

    /// Wake the prefetcher (a post, or shutdown).
    pub fn wake(&self) {
        self.posted.fetch_add(1, Ordering::Release);
        crate::sys::futex_wake(self.posted.as_ptr() as usize, 1);
    }

    /// The oldest request, waiting up to `wait` for one: popped inside the
    /// fork gate, waited for outside it.
    pub fn take(&self, wait: std::time::Duration) -> Option<(u32, u64, u32, bool)> {
        let seen = self.posted.load(Ordering::Acquire);
        let pop = || {
            let _inside = crate::pager::instance::gate::enter(0);
            self.queue.lock().ok()?.reqs.pop_front()
        };
        if let Some(r) = pop() {
            return Some(r);
        }
        let ts = libc::timespec {
            tv_sec: wait.as_secs() as libc::time_t,
            tv_nsec: wait.subsec_nanos() as libc::c_long,
        };
        // SAFETY: a live word, while it still reads `seen` (a post since
        // then returns at once), for at most `ts`.
        unsafe { crate::sys::futex_wait(self.posted.as_ptr(), seen, Some(&ts)) };
        pop()
    }
}
