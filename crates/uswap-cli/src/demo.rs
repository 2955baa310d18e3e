//! `uswap demo`: map a region larger than the memory budget, fill it from
//! several threads, verify every byte, and show what was swapped.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use uswap::io::FileOptions;
use uswap::pager::{FaultMode, Swap, SwapDeviceSpec};
use uswap_bench::parse_bytes;

const PAGE: usize = uswap::PAGE_SIZE;

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Memory budget: resident pages stay under it (K, M, G suffixes).
    #[arg(long, default_value = "64M", value_parser = parse_bytes)]
    pub budget: u64,
    /// Size of the region to map, larger than the budget.
    #[arg(long, default_value = "256M", value_parser = parse_bytes)]
    pub size: u64,
    /// Swap device: `ram:SIZE`, or `file:PATH:SIZE` (created with mode
    /// 0600 and preallocated if missing; O_DIRECT).  Repeat for several.
    #[arg(long = "swap", default_value = "ram:512M", value_parser = parse_device)]
    pub swap: Vec<SwapDeviceSpec>,
    /// Who serves faults: the faulting thread (sigbus) or handler threads.
    #[arg(long, value_enum, default_value_t = Mode::Sigbus)]
    pub mode: Mode,
    /// Threads filling and verifying the region.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Page the region in 2 MB units (seed 003): one move, one cluster and
    /// one 2 MB IO per unit, a transparent huge page where the kernel has one.
    #[arg(long)]
    pub huge: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Mode {
    Sigbus,
    Handler,
}

fn parse_device(s: &str) -> Result<SwapDeviceSpec, String> {
    let page = PAGE as u64;
    if let Some(size) = s.strip_prefix("ram:") {
        return Ok(SwapDeviceSpec::ram(parse_bytes(size)?));
    }
    if let Some(rest) = s.strip_prefix("file:") {
        let (path, size) = rest
            .rsplit_once(':')
            .ok_or_else(|| format!("{s:?}: write file:PATH:SIZE, e.g. file:/var/tmp/uswap.swap:4G"))?;
        let bytes = parse_bytes(size)?;
        return Ok(SwapDeviceSpec::file(FileOptions::new(
            PathBuf::from(path),
            bytes / page,
        )));
    }
    Err(format!("{s:?}: a swap device is ram:SIZE or file:PATH:SIZE"))
}

fn pattern(page: usize, at: usize) -> u8 {
    let x =
        (page as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (at as u64).wrapping_mul(0x2545_f491_4f6c_dd1d);
    (x ^ (x >> 31)) as u8
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1 << 20) as f64)
}

pub fn run(args: &DemoArgs) -> anyhow::Result<()> {
    if !(1..=256).contains(&args.threads) {
        bail!("--threads must be 1..=256, got {}", args.threads);
    }
    if args.size == 0 {
        bail!("--size must be more than 0");
    }
    let mut b = Swap::builder()
        .budget(args.budget)
        .fault_mode(match args.mode {
            Mode::Sigbus => FaultMode::Sigbus,
            Mode::Handler => FaultMode::HandlerThread,
        })
        .max_mapped(args.size.max(1 << 20) * 2);
    for d in &args.swap {
        b = b.device(d.clone());
    }
    let swap = b.build().context("starting uswap")?;
    let swap_bytes = swap.total_slots() * PAGE as u64;
    println!(
        "uswap demo: a {} region under a {} budget, {} of swap ({:?} mode, {} threads)",
        mib(args.size),
        mib(args.budget),
        mib(swap_bytes),
        args.mode,
        args.threads
    );
    if args.size > swap_bytes + args.budget {
        println!("note: the region is larger than swap plus budget; pages that find no slot stay resident");
    }
    let mut region = if args.huge {
        swap.map_huge(args.size as usize)
    } else {
        swap.map(args.size as usize)
    }
    .context("mapping the region")?;
    let pages = region.len() / PAGE;
    let per = pages.div_ceil(args.threads) * PAGE;
    let bar = |what: &str| {
        let pb = ProgressBar::new(pages as u64);
        pb.set_style(
            ProgressStyle::with_template("{prefix:>7} [{bar:30}] {pos}/{len} pages {elapsed}")
                .expect("static template")
                .progress_chars("=> "),
        );
        pb.set_prefix(what.to_string());
        pb
    };

    let start = Instant::now();
    let pb = bar("fill");
    std::thread::scope(|s| {
        for (t, part) in region.as_mut_slice().chunks_mut(per).enumerate() {
            let pb = pb.clone();
            s.spawn(move || {
                for (i, page) in part.chunks_mut(PAGE).enumerate() {
                    let p = t * (per / PAGE) + i;
                    for (at, b) in page.iter_mut().enumerate() {
                        *b = pattern(p, at);
                    }
                    pb.inc(1);
                }
            });
        }
    });
    pb.finish_and_clear();
    let fill = start.elapsed();

    let start = Instant::now();
    let pb = bar("verify");
    let bad = std::sync::atomic::AtomicUsize::new(0);
    let region_ref = &region;
    std::thread::scope(|s| {
        for (t, part) in region_ref.as_slice().chunks(per).enumerate() {
            let (pb, bad) = (pb.clone(), &bad);
            s.spawn(move || {
                for (i, page) in part.chunks(PAGE).enumerate() {
                    let p = t * (per / PAGE) + i;
                    if page.iter().enumerate().any(|(at, b)| *b != pattern(p, at)) {
                        bad.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    pb.inc(1);
                }
            });
        }
    });
    pb.finish_and_clear();
    let verify = start.elapsed();

    let st = swap.stats();
    let c = |n: &str| st.counter(n);
    println!(
        "filled   {} in {:.2}s ({:.0} MiB/s)",
        mib(args.size),
        fill.as_secs_f64(),
        args.size as f64 / (1 << 20) as f64 / fill.as_secs_f64()
    );
    println!(
        "verified {} in {:.2}s ({:.0} MiB/s)",
        mib(args.size),
        verify.as_secs_f64(),
        args.size as f64 / (1 << 20) as f64 / verify.as_secs_f64()
    );
    println!(
        "faults {}: {} zero fills, {} swap-ins, {} swap-cache hits (no IO), {} first writes to clean pages; {} pages read ahead",
        c("faults"),
        c("zero_fills"),
        c("swapins"),
        c("swapcache_hits"),
        c("wp_faults"),
        c("readahead")
    );
    println!(
        "evictions {}: {} written to swap ({}), {} clean, dropped without IO; {} direct reclaims",
        c("evictions"),
        c("evict_write"),
        mib(c("evict_write") * PAGE as u64),
        c("evict_clean"),
        c("direct_reclaim")
    );
    if args.huge {
        println!(
            "2 MB units: {} swapped out ({} split into single slots for want of a free cluster), {} swapped in; {} of the process is in transparent huge pages now",
            c("huge_swapouts"),
            c("huge_fallbacks"),
            c("huge_swapins"),
            anon_huge()
        );
    }
    println!(
        "resident now {} of a {} budget; swap in use {}",
        mib(swap.resident_pages() as u64 * PAGE as u64),
        mib(args.budget),
        mib((swap.total_slots() - swap.free_slots()) * PAGE as u64)
    );
    if c("swap_full") > 0 || c("budget_overrun") > 0 {
        println!(
            "swap space full: {} eviction attempts found no free slot and left their pages resident; {} faults found the budget exhausted with nothing evictable; add swap with --swap",
            c("swap_full"),
            c("budget_overrun")
        );
    }
    if c("swapout_errors") + c("swapin_errors") > 0 {
        println!(
            "IO errors: {} swap-outs failed (pages kept, slots retired), {} swap-ins failed (pages poisoned)",
            c("swapout_errors"),
            c("swapin_errors")
        );
    }
    let bad = bad.into_inner();
    if bad > 0 {
        bail!("{bad} of {pages} pages read back wrong: data was lost");
    }
    println!("every byte read back as written");
    Ok(())
}

/// AnonHugePages of this process, from /proc/self/smaps_rollup.
fn anon_huge() -> String {
    std::fs::read_to_string("/proc/self/smaps_rollup")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("AnonHugePages:"))
                .map(|l| l["AnonHugePages:".len()..].trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}
