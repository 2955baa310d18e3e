//! `uswap bench`: the seeds' experiments on the core.
//!
//! Every bench runs all its variants in one invocation, interleaved round by
//! round and rotated (A B C, B C A, C A B, ...), so that the machine's noise
//! lands on all of them alike and their ratios hold even where absolute
//! numbers drift.  The workload benches (pmbench, seq-write, activate) run
//! each variant in its own process, on uswap or on kernel swap.

pub mod alloc;
pub mod extent;
pub mod fault;
pub mod huge;
pub mod kernel_swap;
pub mod lru;
pub mod plot;
pub mod report;
pub mod side_by_side;
pub mod worker;
pub mod workload;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use clap::Args;
use uswap::stats::Registry;

pub use report::{emit, progress, same_params_default, summarize, Report, Round, Variant};

/// Options every bench takes.
#[derive(Args, Clone, Debug)]
pub struct Common {
    /// Worker thread counts to measure, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    pub threads: Vec<usize>,
    /// Seconds each variant runs per round.
    #[arg(long, default_value_t = 1.0)]
    pub seconds: f64,
    /// Rounds: each variant runs this many times, interleaved with the others.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also write the JSON report to this file (the table still prints).
    #[arg(long, value_name = "FILE")]
    pub json_out: Option<std::path::PathBuf>,
    /// Run only these variants (comma separated; default: all).
    #[arg(long, value_delimiter = ',')]
    pub variants: Vec<String>,
}

impl Common {
    pub fn duration(&self) -> Duration {
        Duration::from_secs_f64(self.seconds.max(0.01))
    }

    /// The indices in `names` of the variants `--variants` asks for, in
    /// the order given; all of them when it is not given.
    pub fn selected(&self, names: &[&str]) -> anyhow::Result<Vec<usize>> {
        if self.variants.is_empty() {
            return Ok((0..names.len()).collect());
        }
        self.variants
            .iter()
            .map(|v| {
                names.iter().position(|n| n == v).ok_or_else(|| {
                    anyhow::anyhow!("unknown variant {v:?}; this bench has: {}", names.join(", "))
                })
            })
            .collect()
    }

    /// Write `report` to `--json-out`, when given.
    pub fn save(&self, report: &Report) -> anyhow::Result<()> {
        if let Some(path) = &self.json_out {
            let text = serde_json::to_string_pretty(report)?;
            std::fs::write(path, text + "\n")
                .map_err(|e| anyhow::anyhow!("cannot write --json-out {}: {e}", path.display()))?;
        }
        Ok(())
    }

    /// Reject option values that cannot run, with the reason.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(!self.threads.is_empty(), "--threads needs at least one count");
        anyhow::ensure!(
            self.threads.iter().all(|&t| (1..=1024).contains(&t)),
            "--threads counts must be between 1 and 1024, got {:?}",
            self.threads
        );
        anyhow::ensure!(self.rounds >= 1, "--rounds must be at least 1");
        anyhow::ensure!(
            self.seconds.is_finite() && self.seconds > 0.0 && self.seconds <= 3600.0,
            "--seconds must be in (0, 3600], got {}",
            self.seconds
        );
        Ok(())
    }
}

/// Run every combination (of thread count, variant, and whatever else a
/// bench varies) `--rounds` times, interleaved round by round and rotated
/// (A B C, B C A, ...), under a progress bar labelled by `label`.  `run(round, combo)`
/// does one timed run.  Returns each combination's rounds, in the order of
/// `combos`.
pub fn interleave<C, R>(
    common: &Common,
    bench: &str,
    combos: &[C],
    label: impl Fn(&C) -> String,
    mut run: impl FnMut(usize, &C) -> anyhow::Result<R>,
) -> anyhow::Result<Vec<Vec<R>>> {
    let pb = progress((combos.len() * common.rounds) as u64, bench, common.json);
    let mut out: Vec<Vec<R>> = combos.iter().map(|_| Vec::with_capacity(common.rounds)).collect();
    for round in 0..common.rounds {
        // Each round starts one combination further on (A B C, B C A,
        // C A B, ...): a run that suffers from the one before it (memory
        // the previous process left to be freed, a device still writing
        // back) is then not always the same variant.
        let n = combos.len();
        for k in 0..n {
            let i = (k + round) % n;
            let combo = &combos[i];
            pb.set_message(label(combo));
            out[i].push(run(round, combo)?);
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    Ok(out)
}

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
