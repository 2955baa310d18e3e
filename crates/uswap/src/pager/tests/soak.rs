//! The soak: many short runs, each a random configuration
//! (fault mode, 4 KiB pages or 2 MB units, seed switches, device, thread
//! count) under random injected faults (write errors at random slots,
//! swap writes failing for a while, `EAGAIN`/`EBUSY`/`ENOMEM` from the
//! moves and copies uswap issues, a swap space too small to hold the
//! region), with every byte checked.  Each run is a child process with a
//! watchdog of its own: a worker that stops making progress gets its
//! stuck page dumped (state word decoded, slot, its page-table entry
//! from /proc/self/pagemap, staging and budget counts) with every
//! thread's kernel and user stacks (gdb), and the run fails.
//!
//! `soak_a_few_runs` runs a handful in every test run; `soak` runs for
//! `USWAP_SOAK_SECONDS` (default 60) from seed `USWAP_SOAK_SEED`:
//!
//! ```sh
//! USWAP_SOAK_SECONDS=3600 cargo test --release -p uswap --lib soak -- --ignored --nocapture
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::child;
use super::*;
use crate::io::IoOp;
use crate::lru::LruBatch;
use crate::swap_space::{ScanBase, Switches};

const MIB: u64 = 1 << 20;

/// How long a worker may go without finishing an operation.
const STALL: Duration = Duration::from_secs(20);

/// A small, seedable generator (xorshift64*): runs are replayed by seed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }
}

/// One run's configuration, drawn from its seed.
#[derive(Debug)]
struct Plan {
    mode: FaultMode,
    huge: bool,
    device: &'static str,
    switches: Switches,
    lru: LruBatch,
    readahead: bool,
    per_page_evict: bool,
    background: bool,
    threads: usize,
    budget: u64,
    region: u64,
    /// Swap smaller than the region less the budget: it fills.
    full: bool,
    /// Faults to inject, one kind per draw: "budget" (a new budget, half
    /// to all of the first, for units never under the units the threads
    /// fill at once), "write-eio", "write-enospc",
    /// "move-out", "move-in", "copy-in".
    inject: Vec<&'static str>,
    ops: u64,
}

fn plan(seed: u64) -> Plan {
    let mut r = Rng::new(seed);
    let huge = r.chance(25);
    let device = ["ram", "file", "file-plain", "zram", "tier"][r.below(5) as usize];
    let threads = 1 + r.below(4) as usize;
    let budget = if huge {
        (8 + 2 * threads as u64) * MIB
    } else {
        (4 + r.below(8)) * MIB
    };
    let region = budget * (2 + r.below(4));
    let kinds = [
        "write-eio",
        "write-enospc",
        "move-out",
        "move-in",
        "copy-in",
        "budget",
    ];
    let inject = (0..r.below(4))
        .map(|_| kinds[r.below(kinds.len() as u64) as usize])
        .collect();
    Plan {
        mode: if r.chance(50) {
            FaultMode::Sigbus
        } else {
            FaultMode::HandlerThread
        },
        huge,
        device,
        switches: Switches {
            slot_cache: r.chance(80),
            fragmented_scan: r.chance(80),
            scan_base: if r.chance(80) {
                ScanBase::PerCpu
            } else {
                ScanBase::Shared
            },
            huge_cluster: r.chance(80),
            ..Switches::DEFAULT
        },
        lru: if r.chance(80) {
            LruBatch::default()
        } else {
            LruBatch::Unbatched
        },
        readahead: r.chance(80),
        per_page_evict: r.chance(15),
        background: r.chance(85),
        threads,
        budget,
        region,
        full: !huge && device != "tier" && r.chance(15),
        inject,
        ops: 1_000 + r.below(3_000),
    }
}

fn device(plan: &Plan, dir: &std::path::Path) -> SwapDeviceSpec {
    let swap = if plan.full {
        (plan.region - plan.budget) / 2
    } else {
        plan.region + 16 * MIB
    };
    let file = || FileOptions::new(dir.join("swap"), swap / PAGE_SIZE as u64);
    match plan.device {
        "ram" => SwapDeviceSpec::ram(swap),
        "file" => SwapDeviceSpec::file(file()),
        "file-plain" => SwapDeviceSpec::file(file().encrypt(false)),
        "zram" => SwapDeviceSpec::compressed(crate::io::CompressedOptions::new(swap)),
        _ => SwapDeviceSpec::compressed(crate::io::CompressedOptions::new(plan.budget).file(file())),
    }
}

/// The word at `w` of page `p`'s generation `gen`: the page says which
/// page and which write it is, all over, and compresses a little.
fn word(p: usize, gen: u64, w: usize) -> u64 {
    ((p as u64) << 32 | gen) ^ ((w as u64 % 7) << 56)
}

fn write(region: &Region, p: usize, gen: u64) {
    let base = region.as_ptr() as usize + p * PAGE_SIZE;
    for w in 0..PAGE_SIZE / 8 {
        // SAFETY: a word of the region, which this worker alone writes.
        unsafe { std::ptr::write_volatile((base + w * 8) as *mut u64, word(p, gen, w)) };
    }
}

fn check(region: &Region, p: usize, gen: u64) -> Result<(), String> {
    let base = region.as_ptr() as usize + p * PAGE_SIZE;
    for w in 0..PAGE_SIZE / 8 {
        // SAFETY: a word of the region.
        let got = unsafe { std::ptr::read_volatile((base + w * 8) as *const u64) };
        if got != word(p, gen, w) {
            return Err(format!(
                "page {p} word {w}: read {got:#x}, wrote {:#x} (generation {gen})",
                word(p, gen, w)
            ));
        }
    }
    Ok(())
}

/// What a worker is doing, for the watchdog.
struct Progress {
    ops: AtomicU64,
    page: AtomicUsize,
}

/// The stuck page, and the threads, as a diagnosis needs them.
fn dump(region: &Region, swap: &Swap, worker: usize, p: usize) {
    let inner = &region.inner;
    let w = inner.states()[region.id_base as usize + p].load();
    let addr = region.as_ptr() as u64 + (p * PAGE_SIZE) as u64;
    let pte = std::fs::File::open("/proc/self/pagemap")
        .and_then(|f| {
            use std::os::unix::fs::FileExt;
            let mut b = [0u8; 8];
            f.read_exact_at(&mut b, addr / PAGE_SIZE as u64 * 8)?;
            Ok(u64::from_le_bytes(b))
        })
        .map_or_else(
            |e| format!("unreadable: {e}"),
            |e| {
                format!(
                    "{e:#018x} (present {}, swapped {}, uffd-wp {}, exclusive {})",
                    e >> 63 & 1,
                    e >> 62 & 1,
                    e >> 57 & 1,
                    e >> 56 & 1
                )
            },
        );
    eprintln!(
        "soak: STALL: worker {worker} made no progress for {STALL:?} on page {p} at {addr:#x}\n\
         \x20 state word {:#018x}: {w:?}\n\
         \x20 page-table entry {pte}\n\
         \x20 resident {} of budget {}, staged {}, free slots {} of {}\n\
         \x20 counters {:?}",
        w.raw(),
        inner.budget().resident(),
        inner.budget().limit(),
        inner.staged_count(),
        swap.free_slots(),
        swap.total_slots(),
        swap.stats().counters,
    );
    let me = std::process::id();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{me}/task")) {
        for t in tasks.flatten() {
            let p = t.path();
            let comm = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
            let wchan = std::fs::read_to_string(p.join("wchan")).unwrap_or_default();
            let stack = std::fs::read_to_string(p.join("stack")).unwrap_or_default();
            eprintln!(
                "soak: thread {:?} {} wchan {wchan}\n{stack}",
                t.file_name(),
                comm.trim()
            );
        }
    }
    // User stacks: gdb attaches to this process from a child of its own.
    let gdb = std::process::Command::new("timeout")
        .args([
            "30",
            "gdb",
            "-p",
            &me.to_string(),
            "-batch",
            "-nx",
            "-ex",
            "thread apply all bt",
        ])
        .stdin(std::process::Stdio::null())
        .output();
    match gdb {
        Ok(o) => eprintln!("soak: gdb:\n{}", String::from_utf8_lossy(&o.stdout)),
        Err(e) => eprintln!("soak: no user stacks (gdb: {e})"),
    }
}

/// One run, in this (child) process: exits 0 with a summary line, or
/// fails (a panic, a wrong byte, the watchdog).
fn run(seed: u64) -> ! {
    let plan = plan(seed);
    eprintln!("soak: seed {seed}: {plan:?}");
    let dir = tempfile::tempdir().unwrap();
    let swap = Swap::builder()
        .budget(plan.budget)
        .device(device(&plan, dir.path()))
        .fault_mode(plan.mode)
        .handler_threads(1 + (seed % 2) as usize)
        .switches(plan.switches)
        .lru_batch(plan.lru)
        .readahead(plan.readahead)
        .per_page_evict(plan.per_page_evict)
        .background_reclaim(plan.background)
        .max_mapped(plan.region * 2)
        .overrun(if plan.full {
            Overrun::Unbounded
        } else {
            Overrun::default()
        })
        .build()
        .unwrap();
    let region = if plan.huge {
        swap.map_huge(plan.region as usize).unwrap()
    } else {
        swap.map(plan.region as usize).unwrap()
    };
    let pages = region.len() / PAGE_SIZE;
    let progress: Vec<Progress> = (0..plan.threads)
        .map(|_| Progress {
            ops: AtomicU64::new(0),
            page: AtomicUsize::new(usize::MAX),
        })
        .collect();
    let done = AtomicBool::new(false);
    let injected = AtomicU64::new(0);
    let verified = AtomicU64::new(0);
    let region = Arc::new(region);
    std::thread::scope(|s| {
        // The watchdog.
        s.spawn(|| {
            let mut last: Vec<(u64, Instant)> = progress
                .iter()
                .map(|p| (p.ops.load(Ordering::Relaxed), Instant::now()))
                .collect();
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(100));
                for (i, p) in progress.iter().enumerate() {
                    let ops = p.ops.load(Ordering::Relaxed);
                    if ops != last[i].0 || ops == u64::MAX {
                        last[i] = (ops, Instant::now());
                    } else if last[i].1.elapsed() > STALL {
                        dump(&region, &swap, i, p.page.load(Ordering::Relaxed));
                        child::exit(7);
                    }
                }
            }
        });
        // The injector: a fault of the plan's kinds every few ms.
        s.spawn(|| {
            let mut r = Rng::new(seed ^ 0xfa17);
            let slots = swap.total_slots();
            while !plan.inject.is_empty() && !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(2 + r.below(20)));
                let kind = plan.inject[r.below(plan.inject.len() as u64) as usize];
                let dev = &swap.inner.backing().devices[0];
                let dev = dev.file_behind().unwrap_or(dev);
                match kind {
                    "budget" => {
                        let floor = if plan.huge {
                            (2 + plan.threads as u64) * 2 * MIB
                        } else {
                            plan.budget / 2
                        };
                        let to =
                            floor + r.below(plan.budget - floor + 1) / PAGE_SIZE as u64 * PAGE_SIZE as u64;
                        swap.set_budget(to.max(floor)).unwrap();
                    }
                    "write-eio" => dev.inject_error(r.below(slots), IoOp::Write),
                    "write-enospc" => dev.inject_errors_for(
                        IoOp::Write,
                        libc::ENOSPC,
                        Duration::from_millis(1 + r.below(30)),
                    ),
                    "move-out" | "move-in" => {
                        let f = if kind == "move-out" {
                            &swap.inner.inject().move_out
                        } else {
                            &swap.inner.inject().move_in
                        };
                        let errno = [libc::EAGAIN, libc::EBUSY, libc::ENOMEM][r.below(3) as usize];
                        f.2.store(errno, Ordering::Relaxed);
                        f.1.store(r.below(3) as usize, Ordering::Relaxed);
                        f.0.store(1 + r.below(3) as usize, Ordering::Release);
                    }
                    _ => {
                        let errno = [libc::EAGAIN, libc::ENOMEM][r.below(2) as usize];
                        swap.inner.inject().copy_in.1.store(errno, Ordering::Relaxed);
                        swap.inner.inject().copy_in.0.store(1, Ordering::Release);
                    }
                }
                injected.fetch_add(1, Ordering::Relaxed);
            }
        });
        // The workers: each owns a stripe of the region, writes random
        // pages of it and checks others against what it wrote.
        let workers: Vec<_> = (0..plan.threads)
            .map(|t| {
                let region = Arc::clone(&region);
                let (progress, verified, plan) = (&progress[t], &verified, &plan);
                s.spawn(move || {
                    let mine: Vec<usize> = (t..pages).step_by(plan.threads).collect();
                    let mut gens = vec![0u64; mine.len()];
                    let mut r = Rng::new(seed ^ t as u64);
                    for _ in 0..plan.ops {
                        let i = r.below(mine.len() as u64) as usize;
                        let p = mine[i];
                        progress.page.store(p, Ordering::Relaxed);
                        if r.chance(60) || gens[i] == 0 {
                            gens[i] += 1;
                            write(&region, p, gens[i]);
                        } else {
                            check(&region, p, gens[i]).unwrap();
                            verified.fetch_add(PAGE_SIZE as u64, Ordering::Relaxed);
                        }
                        progress.ops.fetch_add(1, Ordering::Relaxed);
                    }
                    for (i, &p) in mine.iter().enumerate() {
                        progress.page.store(p, Ordering::Relaxed);
                        if gens[i] == 0 {
                            // Never written: reads zeros.
                            // SAFETY: a word of the region, which lives.
                            let v = unsafe {
                                std::ptr::read_volatile(
                                    (region.as_ptr() as usize + p * PAGE_SIZE) as *const u64,
                                )
                            };
                            assert_eq!(v, 0, "page {p} was never written");
                        } else {
                            check(&region, p, gens[i]).unwrap();
                            verified.fetch_add(PAGE_SIZE as u64, Ordering::Relaxed);
                        }
                        progress.ops.fetch_add(1, Ordering::Relaxed);
                    }
                    progress.ops.store(u64::MAX, Ordering::Relaxed);
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        done.store(true, Ordering::Relaxed);
    });
    let st = swap.stats();
    drop(Arc::try_unwrap(region).ok().expect("the workers are done"));
    swap.swap_space().drain_slot_caches();
    let retired = st.counters.swapout_errors;
    let kept = swap.total_slots() - swap.free_slots();
    assert!(kept <= retired, "{kept} slots not returned, {retired} retired");
    assert_eq!(swap.resident_pages(), 0);
    swap.swap_space().check_invariants().unwrap();
    println!(
        "soak: seed {seed} ok: {} bytes verified, {} faults injected, {} evictions, {} swap-ins",
        verified.load(Ordering::Relaxed),
        injected.load(Ordering::Relaxed),
        st.counters.evictions,
        st.counters.swapins,
    );
    child::exit(0);
}

/// Run seeds from `first` for `seconds` (or `max_runs`), each in a child;
/// the first failure fails the test with its seed and output.
fn soak_for(first: u64, seconds: u64, max_runs: u64) {
    let start = Instant::now();
    let (mut runs, mut bytes, mut faults) = (0u64, 0u64, 0u64);
    let mut seed = first;
    while runs < max_runs && start.elapsed() < Duration::from_secs(seconds) {
        let out = child::run(
            "pager::tests::soak::soak_a_few_runs",
            &format!("soak:{seed}"),
            Duration::from_secs(120),
        );
        if out.code != Some(0) || out.timed_out {
            panic!(
                "soak: seed {seed} failed after {runs} clean runs (replay: USWAP_SOAK_SEED={seed}): exit {:?}, signal {:?}, timed out {}\n--- stdout\n{}\n--- stderr\n{}",
                out.code, out.signal, out.timed_out, out.stdout, out.stderr
            );
        }
        let line = out
            .stdout
            .lines()
            // The harness may have printed the test's name on the line.
            .find_map(|l| l.find("soak: seed").map(|at| &l[at..]))
            .unwrap_or_default()
            .to_string();
        let num = |after: &str| {
            line.split(after)
                .next()
                .and_then(|s| s.rsplit(' ').next())
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0)
        };
        bytes += num(" bytes verified");
        faults += num(" faults injected");
        runs += 1;
        seed += 1;
    }
    eprintln!(
        "soak: {runs} runs clean in {:.0} s from seed {first}: {bytes} bytes verified, {faults} faults injected and survived",
        start.elapsed().as_secs_f64()
    );
}

/// A few runs in every test run (the soak's own code kept working).
#[test]
fn soak_a_few_runs() {
    if let Some(s) = child::scenario() {
        if let Some(seed) = s.strip_prefix("soak:") {
            run(seed.parse().unwrap());
        }
        return;
    }
    soak_for(1, 600, 3);
}

/// The soak itself: `USWAP_SOAK_SECONDS` (default 60) from
/// `USWAP_SOAK_SEED` (default: the time).
#[test]
#[ignore]
fn soak() {
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    let seed = env("USWAP_SOAK_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    });
    soak_for(seed, env("USWAP_SOAK_SECONDS").unwrap_or(60), u64::MAX);
}
