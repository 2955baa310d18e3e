//! The swap workloads themselves: loops over plain memory, the same code
//! whichever backend (uswap or kernel swap) pages that memory.
//!
//! - pmbench: random page accesses, a read/write mix, over a working set
//!   well above the budget; every access timed.
//! - seq-write (vm-scalability's swap-w-seq, usemem): threads write their
//!   own slices of the region once, sequentially, filling the budget and
//!   then swap.
//! - activate (seed 002's experiment): every round, one region is mapped,
//!   all threads touch all of it, and it is unmapped.
//!
//! Each thread publishes its count of completed operations so that a
//! sampler can draw throughput over time, and keeps an HDR histogram of
//! its operation latencies, merged at the end.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use clap::ValueEnum;
use crossbeam_utils::CachePadded;
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

pub const PAGE: usize = uswap::PAGE_SIZE;
pub const HUGE: usize = 2 << 20;

/// What the pages hold: it decides how well kernel-zram compresses them
/// (uswap and a swap file store every page whole).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DataKind {
    /// All zero: Linux 6.12+ swaps such pages out as a bit in a map, with
    /// no IO, on any swap device; uswap returns them to never-written.
    Zeros,
    /// English-like words: zram's lzo-rle stores them in about half their
    /// size.
    Text,
    /// Pseudo-random bytes: incompressible.
    Random,
}

/// The unit a region is paged in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
pub enum Unit {
    /// 4 KiB pages.
    #[value(name = "4k")]
    #[serde(rename = "4k")]
    Page,
    /// 2 MB units: uswap's `map_huge`; for the kernel, MADV_HUGEPAGE
    /// (transparent huge pages).
    #[value(name = "2m")]
    #[serde(rename = "2m")]
    Huge,
}

impl Unit {
    pub fn bytes(self) -> usize {
        match self {
            Unit::Page => PAGE,
            Unit::Huge => HUGE,
        }
    }
}

/// Which workload, with its own parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    Pmbench { read_pct: u32 },
    SeqWrite,
    Activate,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::Pmbench { .. } => "pmbench",
            Workload::SeqWrite => "seq-write",
            Workload::Activate => "activate",
        }
    }
}

/// xorshift64*: fast, and seeded so that runs repeat.
#[derive(Clone, Copy)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64, stream: u64) -> Rng {
        // splitmix64 of (seed, stream), never zero.
        let mut z = seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)) | 1)
    }

    // Not an `Iterator`: the stream never ends, and `next` is its name in
    // every xorshift.
    #[allow(clippy::should_implement_trait)]
    #[inline]
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// Fills pages and produces written words of one [`DataKind`].
pub struct Filler {
    kind: DataKind,
    seed: u64,
    /// 64 KiB of generated text that pages are cut from, at offsets that
    /// differ page to page.
    text: Vec<u8>,
}

const TEXT_LEN: usize = 64 << 10;
const WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on",
    "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had", "they",
    "you", "were", "their", "one", "all", "we", "can", "her", "has", "there", "been", "if", "more", "when",
    "will", "would", "who", "so", "no", "memory", "page", "swap", "cluster", "slot", "kernel", "process",
    "thread", "budget", "device", "latency", "reclaim", "fault", "map", "region",
];

impl Filler {
    pub fn new(kind: DataKind, seed: u64) -> Filler {
        let mut text = Vec::with_capacity(TEXT_LEN + 16);
        if kind == DataKind::Text {
            let mut rng = Rng::new(seed, 0x7e47);
            while text.len() < TEXT_LEN {
                let r = rng.next();
                text.extend_from_slice(WORDS[(r % WORDS.len() as u64) as usize].as_bytes());
                text.push(match (r >> 32) % 16 {
                    0 => b'.',
                    1 => b',',
                    2 => b'\n',
                    _ => b' ',
                });
            }
            text.truncate(TEXT_LEN);
        }
        Filler { kind, seed, text }
    }

    /// Write a whole page of this kind at `addr`; `index` varies the
    /// content page to page.
    ///
    /// # Safety
    /// `addr..addr + PAGE` must be writable memory.
    #[inline]
    pub unsafe fn fill(&self, addr: usize, index: u64) {
        match self.kind {
            // SAFETY: the caller guarantees the page is writable.
            DataKind::Zeros => unsafe { std::ptr::write_bytes(addr as *mut u8, 0, PAGE) },
            DataKind::Text => {
                let off = (index as usize).wrapping_mul(4099) % (TEXT_LEN - PAGE);
                // SAFETY: the source is inside `text`; the caller
                // guarantees the destination page.
                unsafe { std::ptr::copy_nonoverlapping(self.text.as_ptr().add(off), addr as *mut u8, PAGE) }
            }
            DataKind::Random => {
                let mut rng = Rng::new(self.seed, index);
                for w in 0..PAGE / 8 {
                    // SAFETY: inside the page the caller guarantees.
                    unsafe { std::ptr::write((addr + w * 8) as *mut u64, rng.next()) }
                }
            }
        }
    }

    /// A word to store, keeping the page's kind: zero, text, or random.
    #[inline]
    pub fn word(&self, r: u64) -> u64 {
        match self.kind {
            DataKind::Zeros => 0,
            DataKind::Text => {
                let off = (r as usize % (TEXT_LEN - 8)) & !7;
                u64::from_ne_bytes(self.text[off..off + 8].try_into().expect("8 bytes"))
            }
            DataKind::Random => r,
        }
    }
}

/// A histogram of operation latencies in nanoseconds: 1 ns to 100 s at two
/// significant digits (1% resolution is plenty for percentiles, and keeps
/// each thread's histogram near 60 KiB).
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000_000, 2).expect("static bounds")
}

/// What the threads of one run share: the stop flag, and each thread's
/// published count of completed operations for the sampler.
pub struct Progress {
    pub stop: AtomicBool,
    pub done: Vec<CachePadded<AtomicU64>>,
}

impl Progress {
    pub fn new(threads: usize) -> Progress {
        Progress {
            stop: AtomicBool::new(false),
            done: (0..threads)
                .map(|_| CachePadded::new(AtomicU64::new(0)))
                .collect(),
        }
    }

    pub fn total(&self) -> u64 {
        self.done.iter().map(|d| d.load(Ordering::Relaxed)).sum()
    }
}

/// What the timed phase of a run produced.
pub struct Timed {
    pub ops: u64,
    pub elapsed: Duration,
    pub latency: Histogram<u64>,
    /// (seconds since start, operations per second over the interval).
    pub timeline: Vec<(f64, f64)>,
    /// Activate: regions mapped, touched and unmapped.
    pub iterations: u64,
}

/// Run `thread_body(t, progress, hist)` on `threads` threads released
/// together, sampling throughput every `sample` until all return.  The
/// workers stop by themselves (seq-write) or when `progress.stop` is set,
/// which happens after `duration`.
pub fn run_threads<F>(threads: usize, duration: Duration, sample: Duration, thread_body: F) -> Timed
where
    F: Fn(usize, &Progress, &mut Histogram<u64>) + Sync,
{
    let progress = Progress::new(threads);
    let barrier = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (body, progress, barrier) = (&thread_body, &progress, &barrier);
                s.spawn(move || {
                    let mut h = new_histogram();
                    barrier.wait();
                    body(t, progress, &mut h);
                    h
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        let mut timeline = Vec::new();
        let (mut last_t, mut last_ops) = (0.0, 0u64);
        while !handles.iter().all(|h| h.is_finished()) {
            std::thread::sleep(sample.min(Duration::from_millis(10)));
            let now = start.elapsed();
            if now >= duration {
                progress.stop.store(true, Ordering::Relaxed);
            }
            let t = now.as_secs_f64();
            if t - last_t >= sample.as_secs_f64() {
                let ops = progress.total();
                timeline.push((t, (ops - last_ops) as f64 / (t - last_t)));
                (last_t, last_ops) = (t, ops);
            }
        }
        // The last interval, however short: a run shorter than one
        // sample still has a point.
        let t = start.elapsed().as_secs_f64();
        if t > last_t {
            timeline.push((t, (progress.total() - last_ops) as f64 / (t - last_t)));
        }
        let mut latency = new_histogram();
        for h in handles {
            latency
                .add(h.join().expect("workload thread panicked"))
                .expect("same bounds");
        }
        let elapsed = start.elapsed();
        Timed {
            ops: progress.total(),
            elapsed,
            latency,
            timeline,
            iterations: 0,
        }
    })
}

/// A mapped range the workload threads run over.
#[derive(Clone, Copy, Debug)]
pub struct Area {
    pub base: usize,
    pub len: usize,
}

/// Write every page of the area once, the range split into
/// `threads` contiguous slices on `unit` boundaries (untimed populate, and
/// the body of seq-write).  Returns when done or when `stop` is set.
pub fn write_slice(
    area: Area,
    unit: Unit,
    threads: usize,
    t: usize,
    filler: &Filler,
    p: &Progress,
    h: &mut Histogram<u64>,
) {
    let (base, units) = (area.base, area.len / unit.bytes());
    let per = units.div_ceil(threads);
    let (from, to) = ((t * per).min(units), ((t + 1) * per).min(units));
    let pages_per_unit = unit.bytes() / PAGE;
    let mut done = 0u64;
    for page in from * pages_per_unit..to * pages_per_unit {
        let t0 = Instant::now();
        // SAFETY: `page` lies inside the region the caller mapped.
        unsafe { filler.fill(base + page * PAGE, page as u64) };
        h.saturating_record(t0.elapsed().as_nanos() as u64);
        done += 1;
        if done % 64 == 0 {
            p.done[t].store(done, Ordering::Relaxed);
            if p.stop.load(Ordering::Relaxed) {
                break;
            }
        }
    }
    p.done[t].store(done, Ordering::Relaxed);
}

/// pmbench's access loop: random pages of the region, `read_pct` percent
/// reads, the rest writes of one word, until `stop`.  Each access is timed.
pub fn pmbench_thread(
    area: Area,
    read_pct: u32,
    seed: u64,
    t: usize,
    filler: &Filler,
    p: &Progress,
    h: &mut Histogram<u64>,
) {
    let (base, pages) = (area.base, (area.len / PAGE) as u64);
    let mut rng = Rng::new(seed, 1 + t as u64);
    let mut done = 0u64;
    let mut sum = 0u64;
    while !p.stop.load(Ordering::Relaxed) {
        for _ in 0..64 {
            let r = rng.next();
            let page = r % pages;
            let word = (r >> 52) as usize % (PAGE / 8);
            let addr = base + page as usize * PAGE + word * 8;
            let read = (rng.next() % 100) < read_pct as u64;
            let t0 = Instant::now();
            if read {
                // SAFETY: inside the mapped region, 8-aligned.
                sum = sum.wrapping_add(unsafe { std::ptr::read_volatile(addr as *const u64) });
            } else {
                // SAFETY: as above.
                unsafe { std::ptr::write_volatile(addr as *mut u64, filler.word(r)) };
            }
            h.saturating_record(t0.elapsed().as_nanos() as u64);
        }
        done += 64;
        p.done[t].store(done, Ordering::Relaxed);
    }
    std::hint::black_box(sum);
}

/// Activate's touch: write one byte of every page of the region, starting
/// at this thread's own offset and wrapping, so that all threads touch all
/// pages but not in lockstep.
pub fn touch_all(
    base: usize,
    len: usize,
    threads: usize,
    t: usize,
    p: &Progress,
    done: &mut u64,
    h: &mut Histogram<u64>,
) {
    let pages = len / PAGE;
    let start = t * pages / threads;
    for i in 0..pages {
        let page = (start + i) % pages;
        let t0 = Instant::now();
        // SAFETY: inside the mapped region.
        unsafe { std::ptr::write_volatile((base + page * PAGE) as *mut u8, (t + 1) as u8) };
        h.saturating_record(t0.elapsed().as_nanos() as u64);
        *done += 1;
        if *done % 64 == 0 {
            p.done[t].store(*done, Ordering::Relaxed);
        }
    }
    p.done[t].store(*done, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page_of(kind: DataKind, index: u64) -> Vec<u8> {
        let f = Filler::new(kind, 7);
        let mut buf = vec![0xffu8; PAGE * 2];
        let addr = (buf.as_mut_ptr() as usize + PAGE - 1) & !(PAGE - 1);
        // SAFETY: one aligned page inside `buf`.
        unsafe { f.fill(addr, index) };
        let off = addr - buf.as_ptr() as usize;
        buf[off..off + PAGE].to_vec()
    }

    #[test]
    fn fillers_make_their_kind() {
        assert!(page_of(DataKind::Zeros, 3).iter().all(|&b| b == 0));
        let text = page_of(DataKind::Text, 3);
        assert!(text
            .iter()
            .all(|b| b.is_ascii_lowercase() || b" .,\n".contains(b)));
        assert_ne!(text, page_of(DataKind::Text, 4), "pages differ");
        let random = page_of(DataKind::Random, 3);
        let mut seen = [false; 256];
        random.iter().for_each(|&b| seen[b as usize] = true);
        assert!(
            seen.iter().filter(|&&s| s).count() > 200,
            "random bytes cover the byte range"
        );
        assert_eq!(random, page_of(DataKind::Random, 3), "seeded: repeatable");
        assert_ne!(random, page_of(DataKind::Random, 4));
    }

    #[test]
    fn slices_cover_the_region_once() {
        // Three threads, a region of 10 units: every page written exactly
        // once, counts published.
        for unit in [Unit::Page, Unit::Huge] {
            let len = 10 * unit.bytes();
            let mut buf = vec![0xffu8; len + HUGE];
            let base = (buf.as_mut_ptr() as usize + HUGE - 1) & !(HUGE - 1);
            let f = Filler::new(DataKind::Zeros, 1);
            let p = Progress::new(3);
            let mut h = new_histogram();
            for t in 0..3 {
                write_slice(Area { base, len }, unit, 3, t, &f, &p, &mut h);
            }
            assert_eq!(p.total(), (len / PAGE) as u64);
            assert_eq!(h.len(), (len / PAGE) as u64);
            let off = base - buf.as_ptr() as usize;
            assert!(buf[off..off + len].iter().all(|&b| b == 0));
            assert!(
                buf[off + len..].iter().all(|&b| b == 0xff),
                "nothing past the region"
            );
        }
    }
}
