//! `uswap demo`: map a region larger than the memory budget, fill it from
//! several threads, verify every byte, and show what was swapped.

use std::time::Instant;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use uswap::pager::{FaultMode, Overrun, Swap, SwapDeviceSpec};
use uswap_bench::parse_bytes;
use uswap_bench::workload::workload::{DataKind, Filler};

const PAGE: usize = uswap::PAGE_SIZE;

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Memory budget: resident pages stay under it (K, M, G suffixes).
    #[arg(long, default_value = "64M", value_parser = parse_bytes)]
    pub budget: u64,
    /// Size of the region to map, larger than the budget.
    #[arg(long, default_value = "256M", value_parser = parse_bytes)]
    pub size: u64,
    /// Swap device: `zram:SIZE[:lz4|zstd[:LEVEL]]` (compressed in memory,
    /// at most SIZE of it), `ram:SIZE` (pages kept whole in memory),
    /// `file:PATH:SIZE` (created private and preallocated if missing;
    /// O_DIRECT; encrypted with a key held only in memory, `:plain` to
    /// write plaintext), an NBD export `nbd://HOST[:PORT]/EXPORT` or
    /// `nbd+unix:///EXPORT?socket=PATH` (e.g. `nbdkit memory 8G` on
    /// another machine; sealed unless `?plain`), or a tier
    /// `zram:SIZE[:CODEC],file:PATH:SIZE` or `zram:SIZE[:CODEC],nbd://...`
    /// (the store's oldest pages go to the file or export when it holds
    /// SIZE).  Repeat for several devices.
    #[arg(long = "swap", default_value = "zram:512M", value_parser = parse_device)]
    pub swap: Vec<SwapDeviceSpec>,
    /// What the pages hold: text (compresses about 2x), random (does
    /// not), or zeros.
    #[arg(long, value_enum, default_value_t = DataKind::Text)]
    pub data: DataKind,
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
    /// How far past the budget pages may stay resident when the swap is
    /// full: a share of the budget (10%), a size (64M), or unbounded.
    /// Past it the process is killed, as a memory cgroup's would be, with
    /// one line saying why.
    #[arg(long, default_value = "10%", value_parser = parse_overrun)]
    pub overrun: Overrun,
}

fn parse_overrun(s: &str) -> Result<Overrun, String> {
    s.parse().map_err(|e: uswap::pager::OverrunError| e.to_string())
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Mode {
    Sigbus,
    Handler,
}

/// The swap spec grammar of `uswap::spec`, shared with the benches and
/// `uswap run`.
fn parse_device(s: &str) -> Result<SwapDeviceSpec, String> {
    s.parse().map_err(|e: uswap::spec::SpecError| e.to_string())
}

/// Page `page` of the demo's data, written into `out`: the benches'
/// pages (text compresses about 2x with LZ4, each page cut from another
/// place of the text).
fn fill_page(filler: &Filler, page: usize, out: &mut [u8]) {
    assert_eq!(out.len(), PAGE);
    // SAFETY: `out` is a whole page of writable memory.
    unsafe { filler.fill(out.as_mut_ptr() as usize, page as u64) };
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
        .max_mapped(args.size.max(1 << 20) * 2)
        .overrun(args.overrun)
        // `uswap stat` and `uswap top` show it while it runs.
        .publish(true);
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

    let filler = &Filler::new(args.data, 1);
    let start = Instant::now();
    let pb = bar("fill");
    std::thread::scope(|s| {
        for (t, part) in region.as_mut_slice().chunks_mut(per).enumerate() {
            let pb = pb.clone();
            s.spawn(move || {
                for (i, page) in part.chunks_mut(PAGE).enumerate() {
                    fill_page(filler, t * (per / PAGE) + i, page);
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
                let mut want = vec![0u8; PAGE];
                for (i, page) in part.chunks(PAGE).enumerate() {
                    fill_page(filler, t * (per / PAGE) + i, &mut want);
                    if page != &want[..] {
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
    let c = &st.counters;
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
        c.faults,
        c.zero_fills,
        c.swapins,
        c.swapcache_hits,
        c.wp_faults,
        c.readahead
    );
    println!(
        "evictions {}: {} written to swap ({}), {} clean, dropped without IO; {} direct reclaims",
        c.evictions,
        c.evict_write,
        mib(c.evict_write * PAGE as u64),
        c.evict_clean,
        c.direct_reclaim
    );
    if args.huge {
        println!(
            "2 MB units: {} swapped out ({} split into single slots for want of a free cluster), {} swapped in; {} of the process is in transparent huge pages now",
            c.huge_swapouts,
            c.huge_fallbacks,
            c.huge_swapins,
            anon_huge()
        );
    }
    println!(
        "resident now {} of a {} budget; swap in use {}",
        mib(swap.resident_pages() as u64 * PAGE as u64),
        mib(args.budget),
        mib((swap.total_slots() - swap.free_slots()) * PAGE as u64)
    );
    if st.gauges.store_limit_bytes > 0 {
        let g = &st.gauges;
        let pages = g.store_orig_bytes / PAGE as u64;
        println!(
            "compressed store: {} pages ({}) held in {} of memory, {:.0} bytes a page ({:.0}% of their size; {} compressed, the rest fragmentation and headers); {} same-filled, {} stored whole; {} written back to a file",
            pages,
            mib(g.store_orig_bytes),
            mib(g.store_mem_bytes),
            g.store_mem_bytes as f64 / pages.max(1) as f64,
            100.0 * g.store_mem_bytes as f64 / g.store_orig_bytes.max(1) as f64,
            mib(g.store_compr_bytes),
            g.store_same_pages,
            g.store_whole_pages,
            c.store_writebacks
        );
    }
    if c.swap_full > 0 {
        println!(
            "swap space full: {} eviction attempts found no free slot and left their pages resident; add swap with --swap",
            c.swap_full
        );
    }
    if c.budget_overrun > 0 {
        println!(
            "{} faults found the budget exhausted with nothing ready to evict and went over it for a moment",
            c.budget_overrun
        );
    }
    if c.swapout_errors + c.swapin_errors > 0 {
        println!(
            "IO errors: {} swap-outs failed (pages kept, slots retired), {} swap-ins failed (pages poisoned)",
            c.swapout_errors, c.swapin_errors
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
