//! What every benchmark prints: a progress bar while it runs, then a summary
//! table, or one JSON object with `--json`; and what every bench shares to
//! get there: the options it takes ([`Common`]) and the interleaved,
//! rotated rounds its variants run in ([`interleave`]).
//!
//! The JSON shape is shared by all benches:
//! `{"bench": NAME, "variants": [{"name", "threads", "throughput",
//! "lock_wait", "locks": {SITE: {"acquisitions", "contended", "wait_ns"}},
//! ...}]}`.

use std::collections::BTreeMap;
use std::time::Duration;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use uswap::stats::{LockStats, Stats};

/// One measured configuration.
#[derive(Clone, Debug, Serialize)]
pub struct Variant {
    /// "default", or the switch this variant flips.
    pub name: String,
    /// Worker threads.
    pub threads: usize,
    /// Operations per second, summed over threads (median of the rounds).
    pub throughput: f64,
    /// Fraction of thread time spent waiting on locks (median of the rounds).
    pub lock_wait: f64,
    /// Lock statistics per site, summed over the rounds.
    pub locks: BTreeMap<String, LockStats>,
    /// Operation counters, summed over the rounds.
    pub counters: BTreeMap<String, u64>,
    /// Throughput of each round, in run order.
    pub rounds: Vec<f64>,
    /// Bench-specific parameters and results.
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// A whole benchmark run.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub bench: String,
    pub variants: Vec<Variant>,
}

/// One timed run of one variant.
#[derive(Clone, Debug, Default)]
pub struct Round {
    pub ops: u64,
    pub elapsed: Duration,
    pub threads: usize,
    /// Statistics accumulated during the run.
    pub stats: Stats,
}

impl Round {
    pub fn throughput(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Lock wait as a fraction of all threads' time.
    pub fn lock_wait(&self) -> f64 {
        let thread_ns = self.elapsed.as_nanos() as f64 * self.threads.max(1) as f64;
        self.stats.total_wait_ns() as f64 / thread_ns.max(1.0)
    }
}

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

/// The median of `v` (0 when empty).
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Add one run's lock statistics and counters to a variant's totals.
pub fn add_stats<'a, K: ToString + 'a>(
    locks: &mut BTreeMap<String, LockStats>,
    counters: &mut BTreeMap<String, u64>,
    run_locks: impl IntoIterator<Item = (K, LockStats)>,
    run_counters: impl IntoIterator<Item = (K, u64)>,
) {
    // Sites never taken and counters never counted are left out: a
    // report lists what the run did.
    for (k, v) in run_locks.into_iter().filter(|(_, v)| v.acquisitions > 0) {
        let e = locks.entry(k.to_string()).or_default();
        e.acquisitions += v.acquisitions;
        e.contended += v.contended;
        e.wait_ns += v.wait_ns;
    }
    for (k, v) in run_counters.into_iter().filter(|(_, v)| *v > 0) {
        *counters.entry(k.to_string()).or_default() += v;
    }
}

/// Fold the rounds of one variant into its reported line.
pub fn summarize(name: &str, rounds: &[Round], extra: BTreeMap<String, serde_json::Value>) -> Variant {
    let mut locks: BTreeMap<String, LockStats> = BTreeMap::new();
    let mut counters: BTreeMap<String, u64> = BTreeMap::new();
    for r in rounds {
        add_stats(
            &mut locks,
            &mut counters,
            r.stats.locks.iter(),
            r.stats.counters.iter(),
        );
    }
    Variant {
        name: name.to_string(),
        threads: rounds.first().map_or(0, |r| r.threads),
        throughput: median(rounds.iter().map(Round::throughput).collect()),
        lock_wait: median(rounds.iter().map(Round::lock_wait).collect()),
        locks,
        counters,
        rounds: rounds.iter().map(Round::throughput).collect(),
        extra,
    }
}

/// A progress bar over `total` runs, hidden when output is JSON or not a
/// terminal (indicatif draws to stderr only when it is one).
pub fn progress(total: u64, bench: &str, quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} runs, {elapsed} {msg}")
            .expect("static template")
            .progress_chars("=> "),
    );
    pb.set_prefix(bench.to_string());
    pb
}

/// Print the report: JSON on stdout, or a table.  `baseline_of(v, all)`
/// picks, for variant `v`, the index in `all` of the variant its ratio is
/// taken against (usually "default" with the same parameters); see
/// [`same_params_default`].
pub fn emit(report: &Report, json: bool, baseline_of: impl Fn(&Variant, &[Variant]) -> Option<usize>) {
    if json {
        println!("{}", serde_json::to_string(report).expect("report serializes"));
        return;
    }
    println!("bench {}", report.bench);
    // A column per lock site that some variant waited on: a site taken
    // and never found held costs nothing worth a column.
    let mut sites: Vec<&String> = Vec::new();
    for v in &report.variants {
        for (k, l) in &v.locks {
            if l.wait_ns > 0 && !sites.contains(&k) {
                sites.push(k);
            }
        }
    }
    print!(
        "{:<28} {:>7} {:>14} {:>9} {:>9}",
        "variant", "threads", "ops/s", "vs base", "lock wait"
    );
    for s in &sites {
        print!(" {:>18}", format!("{s} wait%"));
    }
    println!();
    for v in &report.variants {
        let ratio = baseline_of(v, &report.variants)
            .map(|i| &report.variants[i])
            .map(|b| format!("{:+.1}%", paired_change(v, b) * 100.0))
            .unwrap_or_else(|| "-".into());
        print!(
            "{:<28} {:>7} {:>14.0} {:>9} {:>8.2}%",
            v.name,
            v.threads,
            v.throughput,
            ratio,
            v.lock_wait * 100.0
        );
        for s in &sites {
            let l = v.locks.get(*s).copied().unwrap_or_default();
            let pct = if l.acquisitions == 0 {
                0.0
            } else {
                l.contended as f64 / l.acquisitions as f64 * 100.0
            };
            print!(
                " {:>18}",
                format!("{:.2}% c{:.1}%", site_wait_share(v, s) * 100.0, pct)
            );
        }
        println!();
    }
    if sites.is_empty() {
        println!("(vs base: median over rounds of the change against the baseline in the same round; no lock was waited on)");
    } else {
        println!("(vs base: median over rounds of the change against the baseline in the same round; per lock site waited on: share of thread time spent waiting, and c = share of acquisitions that found the lock held)");
    }
}

/// The change of `v` against `base`, as the median over rounds of the
/// ratio within each round: the variants of one round ran back to back, so
/// a burst of noise that slows a whole round cancels out of its ratio.
/// Falls back to the ratio of medians when the rounds do not pair up.
pub fn paired_change(v: &Variant, base: &Variant) -> f64 {
    if v.rounds.len() == base.rounds.len() && !v.rounds.is_empty() {
        median(
            v.rounds
                .iter()
                .zip(&base.rounds)
                .map(|(a, b)| a / b.max(1e-9) - 1.0)
                .collect(),
        )
    } else {
        v.throughput / base.throughput.max(1e-9) - 1.0
    }
}

/// One site's share of the variant's total lock wait times its lock_wait:
/// i.e. the fraction of thread time spent waiting on this site.
fn site_wait_share(v: &Variant, site: &str) -> f64 {
    let total: u64 = v.locks.values().map(|l| l.wait_ns).sum();
    if total == 0 {
        return 0.0;
    }
    v.lock_wait * v.locks.get(site).map_or(0, |l| l.wait_ns) as f64 / total as f64
}

/// The usual baseline: the variant called "default" with the same thread
/// count and the same bench-specific parameters (`extra`).
pub fn same_params_default(v: &Variant, all: &[Variant]) -> Option<usize> {
    all.iter()
        .position(|x| x.name == "default" && x.threads == v.threads && x.extra == v.extra)
}
