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

/// Which pages pmbench's accesses go to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pattern {
    /// Every page equally likely (pmbench's default).
    #[default]
    Uniform,
    /// Each thread walks the pages in order from its own start, one page
    /// a step, wrapping: what swap-in readahead is for.
    Linear,
    /// Page popularity by rank `1/rank^0.99` (YCSB's zipfian), the ranks
    /// scattered over the region: a hot set much smaller than the budget
    /// and a long cold tail.
    Zipf,
    /// Each thread walks the pages downwards from its own start, one page
    /// a step, wrapping: a backward scan.
    Backward,
    /// Each thread walks the pages from its own start 7 pages a step
    /// (a column of a row-major table, a field of an array of large
    /// records), wrapping to the next page over at the end.
    Stride,
}

/// The step of `Pattern::Stride`, in pages: not a power of two, so that
/// its pages fall on every offset of a cluster in turn.
pub const STRIDE_PAGES: u64 = 7;

/// Which workload, with its own parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    Pmbench {
        read_pct: u32,
        #[serde(default)]
        pattern: Pattern,
    },
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
        if done.is_multiple_of(64) {
            p.done[t].store(done, Ordering::Relaxed);
            if p.stop.load(Ordering::Relaxed) {
                break;
            }
        }
    }
    p.done[t].store(done, Ordering::Relaxed);
}

/// YCSB's zipfian generator over ranks `0..n` (Gray et al., "Quickly
/// generating billion-record synthetic databases"): O(n) set-up once, O(1)
/// per draw.
#[derive(Clone, Copy, Debug)]
pub struct Zipf {
    n: f64,
    theta: f64,
    alpha: f64,
    zetan: f64,
    eta: f64,
}

impl Zipf {
    pub const THETA: f64 = 0.99;

    pub fn new(n: u64) -> Zipf {
        let theta = Self::THETA;
        let zeta = |n: u64| (1..=n).map(|i| 1.0 / (i as f64).powf(theta)).sum::<f64>();
        let (zetan, zeta2) = (zeta(n), zeta(2.min(n)));
        let nf = n as f64;
        Zipf {
            n: nf,
            theta,
            alpha: 1.0 / (1.0 - theta),
            zetan,
            eta: (1.0 - (2.0 / nf).powf(1.0 - theta)) / (1.0 - zeta2 / zetan),
        }
    }

    /// A rank, 0 the most popular, from a uniform 64-bit draw.
    pub fn rank(&self, r: u64) -> u64 {
        let u = (r >> 11) as f64 / (1u64 << 53) as f64;
        let uz = u * self.zetan;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return 1.min(self.n as u64 - 1);
        }
        ((self.n * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64).min(self.n as u64 - 1)
    }
}

/// Which page access `i` of thread `t` goes to, for `pattern`.
#[derive(Clone, Copy, Debug)]
pub struct PageChooser {
    pattern: Pattern,
    pages: u64,
    next: u64,
    zipf: Option<Zipf>,
}

impl PageChooser {
    pub fn new(pattern: Pattern, pages: u64, t: usize, threads: usize) -> PageChooser {
        PageChooser {
            pattern,
            pages,
            // Linear walkers start spread over the region.
            next: pages * t as u64 / threads.max(1) as u64,
            zipf: (pattern == Pattern::Zipf).then(|| Zipf::new(pages)),
        }
    }

    #[inline]
    pub fn page(&mut self, r: u64) -> u64 {
        match self.pattern {
            Pattern::Uniform => r % self.pages,
            Pattern::Linear => {
                let p = self.next;
                self.next = if p + 1 == self.pages { 0 } else { p + 1 };
                p
            }
            Pattern::Backward => {
                let p = self.next;
                self.next = if p == 0 { self.pages - 1 } else { p - 1 };
                p
            }
            Pattern::Stride => {
                let p = self.next;
                let n = p + STRIDE_PAGES;
                // Past the end: on to the next page of the first stride.
                self.next = if n < self.pages {
                    n
                } else {
                    (n + 1) % STRIDE_PAGES % self.pages
                };
                p
            }
            Pattern::Zipf => {
                let rank = self.zipf.expect("set for zipf").rank(r);
                // Scatter the ranks (a fixed hash): the hot pages are not
                // neighbours, as hot data in a heap is not.
                rank.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29) % self.pages
            }
        }
    }
}

/// pmbench's access loop: pages of the region chosen by `pattern`,
/// `read_pct` percent reads, the rest writes of one word, until `stop`.
/// Each access is timed.
#[allow(clippy::too_many_arguments)]
pub fn pmbench_thread(
    area: Area,
    read_pct: u32,
    pattern: Pattern,
    seed: u64,
    (t, threads): (usize, usize),
    filler: &Filler,
    p: &Progress,
    h: &mut Histogram<u64>,
) {
    let (base, pages) = (area.base, (area.len / PAGE) as u64);
    let mut rng = Rng::new(seed, 1 + t as u64);
    let mut chooser = PageChooser::new(pattern, pages, t, threads);
    let mut done = 0u64;
    let mut sum = 0u64;
    while !p.stop.load(Ordering::Relaxed) {
        for _ in 0..64 {
            let r = rng.next();
            let page = chooser.page(r);
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
        if (*done).is_multiple_of(64) {
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

    /// Draws of each pattern over 10,000 pages: uniform is flat, linear
    /// walks in order from each thread's start and wraps, zipf puts most
    /// accesses on a few pages.
    #[test]
    fn patterns_choose_the_pages_they_say() {
        let pages = 10_000u64;
        let draws = 200_000;
        let counts = |pattern| {
            let mut rng = Rng::new(7, 1);
            let mut c = PageChooser::new(pattern, pages, 0, 1);
            let mut n = vec![0u32; pages as usize];
            for _ in 0..draws {
                let p = c.page(rng.next());
                assert!(p < pages);
                n[p as usize] += 1;
            }
            n.sort_unstable_by(|a, b| b.cmp(a));
            n
        };
        // The hottest 1% of pages: about 1% of uniform's accesses, most of
        // zipf's.
        let top = |n: &[u32]| n[..100].iter().map(|&x| x as f64).sum::<f64>() / draws as f64;
        let (uniform, zipf) = (counts(Pattern::Uniform), counts(Pattern::Zipf));
        assert!(top(&uniform) < 0.02, "uniform's top 1%: {}", top(&uniform));
        assert!(top(&zipf) > 0.4, "zipf's top 1%: {}", top(&zipf));
        assert!(zipf.iter().filter(|&&x| x > 0).count() > 1000, "zipf has a tail");
        let mut c = PageChooser::new(Pattern::Linear, pages, 1, 2);
        let walk: Vec<u64> = (0..pages + 2).map(|_| c.page(0)).collect();
        assert_eq!(walk[0], pages / 2, "the second of two threads starts half way");
        assert!(walk.windows(2).all(|w| w[1] == (w[0] + 1) % pages));
        let mut c = PageChooser::new(Pattern::Backward, pages, 0, 2);
        let walk: Vec<u64> = (0..pages + 2).map(|_| c.page(0)).collect();
        assert!(walk.windows(2).all(|w| w[1] == (w[0] + pages - 1) % pages));
        // A stride walk visits every page once a cycle, 7 apart but where
        // it wraps to the next offset.
        for pages in [pages, 7 * 1000, 7 * 1000 + 3] {
            let mut c = PageChooser::new(Pattern::Stride, pages, 0, 1);
            let walk: Vec<u64> = (0..pages).map(|_| c.page(0)).collect();
            let mut seen = vec![false; pages as usize];
            walk.iter().for_each(|&p| seen[p as usize] = true);
            assert!(seen.iter().all(|&s| s), "{pages}: every page once");
            let steps = walk.windows(2).filter(|w| w[1] == w[0] + STRIDE_PAGES).count() as u64;
            assert!(steps >= pages - 7, "{pages}: {steps} strides");
            assert_eq!(c.page(0), 0, "{pages}: the cycle starts over");
        }
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
