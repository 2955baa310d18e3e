//! The benches that run in one process: the seeds' experiments on the
//! core's structures (`alloc`, `extent`, `lru`, `huge`), `fault`, the
//! pager's fault cost next to the kernel's, and `codec`, the compressed
//! device's codecs.

pub mod alloc;
pub mod codec;
pub mod extent;
pub mod fault;
pub mod huge;
pub mod lru;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use uswap::stats::Registry;

use crate::report::{Common, Round};

/// Each thread count crossed with each variant: the combinations of the
/// benches that vary nothing else.
pub fn threads_by_variant<V: Copy>(common: &Common, variants: &[V]) -> Vec<(usize, V)> {
    common
        .threads
        .iter()
        .flat_map(|&t| variants.iter().map(move |&v| (t, v)))
        .collect()
}

/// Run `work` on `threads` threads for `duration`, all released together.
/// `work(thread_index, stop)` runs until `stop` turns true and returns the
/// operations it completed.  Statistics are those `registry` gathered
/// between the release and the last thread's return.
pub fn run_timed<F>(threads: usize, duration: Duration, registry: &Registry, work: F) -> Round
where
    F: Fn(usize, &AtomicBool) -> u64 + Sync,
{
    let stop = AtomicBool::new(false);
    let barrier = Barrier::new(threads + 1);
    let (ops, elapsed, stats) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (work, stop, barrier) = (&work, &stop, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    work(t, stop)
                })
            })
            .collect();
        barrier.wait();
        let before = registry.snapshot();
        let start = Instant::now();
        std::thread::sleep(duration);
        stop.store(true, Ordering::Relaxed);
        let ops: u64 = handles
            .into_iter()
            .map(|h| h.join().expect("bench worker panicked"))
            .sum();
        let elapsed = start.elapsed();
        (ops, elapsed, registry.snapshot().since(&before))
    });
    Round {
        ops,
        elapsed,
        threads,
        stats,
    }
}

/// A registry handle that a bench builds its structures on.
pub fn fresh_registry() -> Arc<Registry> {
    Registry::new()
}
