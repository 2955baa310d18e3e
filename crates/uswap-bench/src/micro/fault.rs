//! `uswap bench fault`: what one page fault costs, served by uswap, next to
//! the kernel's own anonymous page fault measured in the same run.
//!
//! Each run touches (reads one byte of) every page of a fresh region once,
//! from T threads over disjoint slices, and the time per page is the fault
//! cost (plus, for uswap, its share of the reclaim that keeps the region
//! under the budget):
//!
//! - `kernel-anon`: an ordinary anonymous mapping, no uswap: the kernel maps
//!   its zero page.  The baseline.
//! - `bare-uffd`: the floor under every uswap variant: a mapping registered
//!   with a userfaultfd in SIGBUS mode whose handler does nothing but one
//!   `UFFDIO_COPY` of a prepared page.  What userfaultfd itself costs; each
//!   uswap variant is also given as a multiple of it.
//! - `zero-fill`: a uswap region never written: a zero page installed.
//! - `first-touch`: the same far below the budget (four times the
//!   region), readahead on, as a program's first touches of fresh heap
//!   meet uswap: under half the budget a fault fills a whole window
//!   (wide fault-around), so the time per page is a fault's cost shared
//!   by the pages it filled.
//! - `swapin-ram`: every page written once beforehand (untimed) under a
//!   budget a quarter of the region, so most of them are on a RAM
//!   swap device: each touch reads the page back.
//! - `swapin-file`: the same from an O_DIRECT swap file in the temp dir.
//! - `swapin-nbd`: the same from an NBD export, nbdkit's memory plugin on
//!   a Unix socket (started for the run): a network swap device's fault
//!   without the network, beside FluidMem's 24.9 us.
//! - `zero-fill-2m`, `swapin-ram-2m`, `swapin-file-2m`: the same in a region of 2 MB units
//!   (`map_huge`): the first touch of a unit brings in all 512 pages (one
//!   `UFFDIO_MOVE`, one 2 MB read), the other 511 touches cost nothing; the
//!   time per page is the unit's cost over 512 (seed 003).
//! - `swapcache-hit`: the region written once, then only the pages still
//!   staged (soft-evicted, in the swap cache, not yet written back) are
//!   touched: each is moved back with no IO.  8192 staging frames, no
//!   background reclaimer, so they stay staged until touched.
//!
//! Readahead is off but for `first-touch`: the touches go in page order,
//! and it would serve most of them without a fault (`bench pmbench --pattern linear
//! --ablate` measures it).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use uswap::io::FileOptions;
use uswap::pager::{FaultMode, Swap, SwapDeviceSpec};
use uswap::stats::Stats;
use uswap::uffd::{Features, Reach, RegisterMode, Uffd};

use super::threads_by_variant;
use crate::report::{emit, interleave, summarize, Common, Report, Round, Variant};
use crate::workload::remote::{NbdPlugin, NbdServer};

const PAGE: usize = uswap::PAGE_SIZE;

#[derive(Args, Debug)]
#[command(mut_arg("threads", |a| a.default_value("1,2")))]
pub struct FaultArgs {
    #[command(flatten)]
    pub common: Common,
    /// Region size in MiB per run.
    #[arg(long, default_value_t = 64)]
    pub mib: usize,
    /// Who serves uswap's faults, one or both side by side: the faulting
    /// thread in a SIGBUS handler (`sigbus`), or handler threads reading
    /// the userfaultfd (`handler`, which programs not written against
    /// uswap may need).  Handler-mode variants are named `NAME/handler`.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "sigbus")]
    pub mode: Vec<ModeArg>,
    /// The same as `--mode handler`.
    #[arg(long, hide = true, conflicts_with = "mode")]
    pub handler_threads: bool,
    /// Reclaim only in faulting threads (no background reclaimer thread).
    #[arg(long)]
    pub no_background_reclaim: bool,
}

/// Who serves faults (`--mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum ModeArg {
    Sigbus,
    Handler,
}

impl ModeArg {
    fn fault_mode(self) -> FaultMode {
        match self {
            ModeArg::Sigbus => FaultMode::Sigbus,
            ModeArg::Handler => FaultMode::HandlerThread,
        }
    }
}

/// Variants that do not go through uswap, run once whatever `--mode`.
fn mode_free(name: &str) -> bool {
    matches!(name, "kernel-anon" | "bare-uffd")
}

/// A variant's name in a report: handler mode's carry `/handler`.
fn variant_name(name: &str, mode: ModeArg) -> String {
    match mode {
        ModeArg::Handler if !mode_free(name) => format!("{name}/handler"),
        _ => name.to_string(),
    }
}

const VARIANTS: [&str; 11] = [
    "kernel-anon",
    "bare-uffd",
    "zero-fill",
    "first-touch",
    "zero-fill-2m",
    "swapcache-hit",
    "swapin-ram",
    "swapin-ram-2m",
    "swapin-file",
    "swapin-file-2m",
    "swapin-nbd",
];

/// Touch one byte of every page of `[base, base + len)` from `threads`
/// threads; the time from their release to the last one done.
fn touch_all(base: usize, len: usize, threads: usize) -> Duration {
    let pages: Vec<usize> = (0..len / PAGE).collect();
    touch_pages(base, &pages, threads)
}

/// Touch one byte of each of `pages` (page indices from `base`), the list
/// split between `threads` threads.
fn touch_pages(base: usize, pages: &[usize], threads: usize) -> Duration {
    let per = pages.len().div_ceil(threads);
    let barrier = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    let mut sum = 0u64;
                    for &p in &pages[(t * per).min(pages.len())..((t + 1) * per).min(pages.len())] {
                        // SAFETY: inside the mapping the caller owns.
                        sum += unsafe { std::ptr::read_volatile((base + p * PAGE) as *const u8) } as u64;
                    }
                    std::hint::black_box(sum);
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        for h in hs {
            h.join().expect("toucher");
        }
        start.elapsed()
    })
}

fn kernel_anon(len: usize, threads: usize) -> anyhow::Result<Round> {
    // The same plain mapping the workload benches' kernel backends use.
    let m = crate::workload::worker::Mapping::kernel(len, crate::workload::workload::Unit::Page)?;
    let elapsed = touch_all(m.base(), len, threads);
    drop(m);
    Ok(Round {
        ops: (len / PAGE) as u64,
        elapsed,
        threads,
        stats: Stats::default(),
    })
}

/// The uffd and the source page of the `bare-uffd` run in progress, for
/// its SIGBUS handler (null between runs).
static BARE_UFFD: AtomicPtr<Uffd> = AtomicPtr::new(std::ptr::null_mut());
static BARE_SRC: AtomicU64 = AtomicU64::new(0);

/// The whole of `bare-uffd`'s fault service: one `UFFDIO_COPY` of the
/// prepared page at the faulting page.
extern "C" fn on_bare_sigbus(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: an SA_SIGINFO handler gets a valid siginfo.
    let addr = unsafe { (*info).si_addr() } as u64 & !(PAGE as u64 - 1);
    let uffd = BARE_UFFD.load(Ordering::Acquire);
    if uffd.is_null() {
        // Not ours: nothing to serve, and returning would fault forever.
        std::process::abort();
    }
    // SAFETY: the Uffd lives while the run that published it does; the
    // destination is a missing page of the run's own registered mapping,
    // the source the run's prepared page.
    let _ = unsafe {
        (*uffd).copy(
            addr,
            BARE_SRC.load(Ordering::Acquire) as *const u8,
            PAGE as u64,
            false,
            false,
        )
    };
}

fn bare_uffd(len: usize, threads: usize) -> anyhow::Result<Round> {
    let uffd =
        Uffd::open_reaching(Features::SIGBUS, false, Reach::UserFaults).context("opening a userfaultfd")?;
    let region = uswap::sys::Mapping::new(len, PAGE).context("mapping the region")?;
    let src = uswap::sys::Mapping::new(PAGE, PAGE).context("mapping the source page")?;
    // SAFETY: our own fresh page.
    unsafe { src.as_ptr().write_volatile(1) };
    uffd.register(
        region.addr(),
        len as u64,
        RegisterMode {
            missing: true,
            wp: false,
        },
    )
    .context("registering the region")?;
    BARE_SRC.store(src.addr(), Ordering::Release);
    BARE_UFFD.store(&uffd as *const Uffd as *mut Uffd, Ordering::Release);
    // SAFETY: zeroed is a valid sigaction; the fields are filled in.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = on_bare_sigbus as *const () as usize;
    sa.sa_flags = libc::SA_SIGINFO;
    // SAFETY: fills a local set.
    unsafe { libc::sigfillset(&mut sa.sa_mask) };
    // SAFETY: zeroed is a valid sigaction, filled by the call.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // No uswap instance is alive between the runs of other variants, so
    // taking SIGBUS over for this run and giving it back after takes
    // nothing from anyone.
    // SAFETY: installs a valid action and saves the old one.
    unsafe { libc::sigaction(libc::SIGBUS, &sa, &mut old) };
    let elapsed = touch_all(region.addr() as usize, len, threads);
    // SAFETY: puts back the action saved above.
    unsafe { libc::sigaction(libc::SIGBUS, &old, std::ptr::null_mut()) };
    BARE_UFFD.store(std::ptr::null_mut(), Ordering::Release);
    drop(uffd);
    Ok(Round {
        ops: (len / PAGE) as u64,
        elapsed,
        threads,
        stats: Stats::default(),
    })
}

fn uswap_run(
    variant: &str,
    len: usize,
    threads: usize,
    mode: FaultMode,
    background: bool,
) -> anyhow::Result<Round> {
    let dir = tempfile::tempdir().context("temp dir for the swap file")?;
    let swap_bytes = (len as u64) * 2;
    let mut _server = None;
    let device = if variant.starts_with("swapin-file") {
        SwapDeviceSpec::file(FileOptions::new(
            dir.path().join("swap"),
            swap_bytes / PAGE as u64,
        ))
    } else if variant == "swapin-nbd" {
        let server = NbdServer::start(NbdPlugin::Memory, swap_bytes, 0.0, dir.path())?;
        let device = server.uri().parse().context("the export's URI")?;
        _server = Some(server);
        device
    } else {
        SwapDeviceSpec::ram(swap_bytes)
    };
    let hit = variant == "swapcache-hit";
    let first = variant == "first-touch";
    let huge = variant.ends_with("-2m");
    // A quarter of the region; for 2 MB units at least the two units
    // `map_huge` asks for (it refuses less), which small `--mib` runs hit.
    let floor = if huge { 4 << 20 } else { 1 << 20 };
    let budget = if first {
        len as u64 * 4
    } else {
        (len as u64 / 4).max(floor)
    };
    let swap = Swap::builder()
        .budget(budget)
        .device(device)
        .fault_mode(mode)
        .background_reclaim(background && !hit)
        .staging_frames(if hit { 8192 } else { 256 })
        // The cost of a fault, not of a page: the touches go in order, and
        // readahead would serve most of them without one.  `first-touch`
        // measures the page's, fault-around on.
        .readahead(first)
        // Published, as `uswap run` publishes: what a fault costs with
        // `uswap stat` able to read it.
        .publish(true)
        .build()
        .context("starting uswap")?;
    let mut region = if huge { swap.map_huge(len) } else { swap.map(len) }.context("mapping the region")?;
    if !variant.starts_with("zero-fill") && !first {
        // Untimed: write every page once, so nearly all are swapped out.
        for (i, page) in region.as_mut_slice().chunks_mut(PAGE).enumerate() {
            page[0] = i as u8 | 1;
        }
    }
    let pages: Vec<usize> = if hit {
        (0..region.len() / PAGE)
            .filter(|&p| region.is_staged(p))
            .collect()
    } else {
        (0..region.len() / PAGE).collect()
    };
    anyhow::ensure!(!pages.is_empty(), "{variant}: no page to touch (none staged)");
    let before = swap.stats();
    let elapsed = touch_pages(region.as_ptr() as usize, &pages, threads);
    let stats = swap.stats().since(&before);
    Ok(Round {
        ops: pages.len() as u64,
        elapsed,
        threads,
        stats,
    })
}

pub fn run(args: &FaultArgs) -> anyhow::Result<()> {
    let c = &args.common;
    c.validate()?;
    anyhow::ensure!(
        (4..=4096).contains(&args.mib),
        "--mib must be 4..=4096, got {}",
        args.mib
    );
    let len = args.mib << 20;
    let mut modes = if args.handler_threads {
        vec![ModeArg::Handler]
    } else {
        args.mode.clone()
    };
    modes.sort();
    modes.dedup();
    let chosen = c.selected(&VARIANTS)?;
    let combos: Vec<(usize, usize, ModeArg)> = threads_by_variant(c, &chosen)
        .into_iter()
        .flat_map(|(t, v)| {
            let ms = if mode_free(VARIANTS[v]) {
                &modes[..1]
            } else {
                &modes[..]
            };
            ms.iter().map(move |&m| (t, v, m))
        })
        .collect();
    let rounds = interleave(
        c,
        "fault",
        &combos,
        |&(t, v, m)| format!("{} x{t}", variant_name(VARIANTS[v], m)),
        |_, &(threads, v, m)| match VARIANTS[v] {
            "kernel-anon" => kernel_anon(len, threads),
            "bare-uffd" => bare_uffd(len, threads),
            name => uswap_run(name, len, threads, m.fault_mode(), !args.no_background_reclaim),
        },
    )?;
    let mut variants: Vec<Variant> = combos
        .iter()
        .zip(&rounds)
        .map(|(&(_, v, m), r)| {
            let mut extra = BTreeMap::new();
            extra.insert("mib".to_string(), serde_json::json!(args.mib));
            if !mode_free(VARIANTS[v]) {
                extra.insert(
                    "mode".to_string(),
                    serde_json::json!(format!("{:?}", m.fault_mode())),
                );
            }
            summarize(&variant_name(VARIANTS[v], m), r, extra)
        })
        .collect();
    // Microseconds per fault, per thread (a thread's own fault latency),
    // and the ratio to the kernel's anonymous fault in the same run.
    for i in 0..variants.len() {
        let us = 1e6 * variants[i].threads as f64 / variants[i].throughput.max(1e-9);
        variants[i]
            .extra
            .insert("us_per_fault".into(), serde_json::json!(us));
        let base = variants
            .iter()
            .find(|x| x.name == "kernel-anon" && x.threads == variants[i].threads);
        if let Some(b) = base {
            let ratio = b.throughput / variants[i].throughput.max(1e-9);
            variants[i]
                .extra
                .insert("vs_kernel".into(), serde_json::json!(ratio));
        }
        // How often a fault had to reclaim before it could install its
        // page (direct reclaim): the background reclaimer's misses.
        let faults = variants[i].counters.get("faults").copied().unwrap_or(0);
        if faults > 0 {
            let direct = variants[i].counters.get("direct_reclaim").copied().unwrap_or(0);
            variants[i].extra.insert(
                "direct_reclaim_pct".into(),
                serde_json::json!(100.0 * direct as f64 / faults as f64),
            );
        }
        let bare = variants
            .iter()
            .find(|x| x.name == "bare-uffd" && x.threads == variants[i].threads);
        if let Some(b) = bare {
            let ratio = b.throughput / variants[i].throughput.max(1e-9);
            variants[i]
                .extra
                .insert("vs_bare_uffd".into(), serde_json::json!(ratio));
        }
    }
    let report = Report {
        bench: "fault".into(),
        variants,
    };
    c.save(&report)?;
    emit(&report, c.json, |v, all| {
        all.iter()
            .position(|x| x.name == "kernel-anon" && x.threads == v.threads)
    });
    if !c.json {
        println!("microseconds per fault, per thread (times the kernel's anonymous fault; times bare userfaultfd; faults that reclaimed first):");
        for v in &report.variants {
            let us = v.extra["us_per_fault"].as_f64().unwrap_or(0.0);
            let ratio = |k: &str, what: &str| {
                v.extra
                    .get(k)
                    .and_then(|r| r.as_f64())
                    .map_or(String::new(), |x| format!("  {x:.1}x {what}"))
            };
            let direct = v
                .extra
                .get("direct_reclaim_pct")
                .and_then(|r| r.as_f64())
                .map_or(String::new(), |p| format!("  {p:.2}% reclaimed"));
            println!(
                "  {:<22} x{:<2} {:>7.2} us{}{}{}",
                v.name,
                v.threads,
                us,
                ratio("vs_kernel", "kernel"),
                ratio("vs_bare_uffd", "bare uffd"),
                direct
            );
        }
    }
    Ok(())
}
