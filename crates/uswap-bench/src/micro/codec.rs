//! `uswap bench codec`: the compressed device's codecs on the benches'
//! pages: how small a page gets, and what compressing and decompressing one
//! costs.  The numbers the default codec and zstd's default level were
//! chosen by (docs/history/PERFORMANCE-LOG.md, "Compressed RAM").
//!
//! Each thread takes pages of `--data` (the same generator as the workload
//! benches) in turn and compresses and decompresses each with the
//! compressed device's own contexts (`uswap::io::codec`), checking the round
//! trip.  Throughput is pages per second, both ways together; the
//! per-page costs and the compressed size are in the table's extra columns.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use clap::Args;
use uswap::io::codec::{Codec, Contexts};

use super::{fresh_registry, run_timed};
use crate::report::{interleave, summarize, Common, Report, Variant};
use crate::workload::workload::{DataKind, Filler, PAGE};

/// The codecs measured, as the swap spec writes them.
pub const VARIANTS: [&str; 6] = ["lz4", "zstd:-3", "zstd:-1", "zstd:1", "zstd:3", "zstd:9"];

/// Pages each thread cycles through: more than a cache's worth, as a
/// reclaimer's pages are.
const PAGES: usize = 1024;

#[derive(Args, Debug)]
#[command(mut_arg("threads", |a| a.default_value("1")))]
#[command(mut_arg("seconds", |a| a.default_value("1")))]
pub struct CodecArgs {
    #[command(flatten)]
    pub common: Common,
    /// What the pages hold: text (the benches' English-like words) or
    /// random (incompressible).
    #[arg(long, value_enum, default_value = "text")]
    pub data: DataKind,
}

fn codec(name: &str) -> Codec {
    match name.strip_prefix("zstd:") {
        Some(l) => Codec::Zstd {
            level: l.parse().expect("a level"),
        },
        None => Codec::Lz4,
    }
}

pub fn run(args: &CodecArgs) -> anyhow::Result<()> {
    let common = &args.common;
    common.validate()?;
    let selected: Vec<&str> = common
        .selected(&VARIANTS)?
        .into_iter()
        .map(|i| VARIANTS[i])
        .collect();
    let filler = Filler::new(args.data, 1);
    let mut pages = vec![0u8; PAGES * PAGE];
    for (i, p) in pages.chunks_mut(PAGE).enumerate() {
        // SAFETY: a page of our own vector.
        unsafe { filler.fill(p.as_mut_ptr() as usize, i as u64) };
    }
    let contexts: Vec<Contexts> = selected
        .iter()
        .map(|n| Contexts::new(codec(n)))
        .collect::<Result<_, _>>()?;
    let combos: Vec<(usize, usize)> = common
        .threads
        .iter()
        .flat_map(|&t| (0..selected.len()).map(move |v| (t, v)))
        .collect();
    let registry = fresh_registry();
    // Per combination and round: nanoseconds compressing, decompressing,
    // and compressed bytes, summed over threads.
    let sums: Vec<[AtomicU64; 3]> = combos.iter().map(|_| Default::default()).collect();
    let rounds = interleave(
        common,
        "codec",
        &combos,
        |&(t, v)| format!("{} threads={t}", selected[v]),
        |_, &(threads, v)| {
            let i = combos
                .iter()
                .position(|&c| c == (threads, v))
                .expect("a combination");
            let cx = &contexts[v];
            let pages = &pages;
            let sum = &sums[i];
            Ok(run_timed(threads, common.duration(), &registry, |t, stop| {
                let mut out = vec![0u8; PAGE];
                let mut back = vec![0u8; PAGE];
                let (mut c_ns, mut d_ns, mut bytes, mut ops) = (0u64, 0u64, 0u64, 0u64);
                let mut p = t * 97;
                while !stop.load(Ordering::Relaxed) {
                    let page = &pages[(p % PAGES) * PAGE..][..PAGE];
                    let t0 = Instant::now();
                    let n = cx.compress(page, &mut out).unwrap_or(PAGE);
                    let t1 = Instant::now();
                    if n < PAGE {
                        let ok = cx.decompress(&out[..n], &mut back);
                        // The decompression alone: the check below is
                        // the bench's, not the store's.
                        d_ns += t1.elapsed().as_nanos() as u64;
                        assert!(ok, "{} round trip", cx.codec());
                        assert!(back == page, "{} round trip", cx.codec());
                    }
                    c_ns += (t1 - t0).as_nanos() as u64;
                    bytes += n as u64;
                    ops += 1;
                    p += 1;
                }
                sum[0].fetch_add(c_ns, Ordering::Relaxed);
                sum[1].fetch_add(d_ns, Ordering::Relaxed);
                sum[2].fetch_add(bytes, Ordering::Relaxed);
                ops
            }))
        },
    )?;
    let variants: Vec<Variant> = combos
        .iter()
        .zip(&rounds)
        .zip(&sums)
        .map(|((&(_, v), r), sum)| {
            let ops: u64 = r.iter().map(|r| r.ops).sum::<u64>().max(1);
            let get = |k: usize| sum[k].load(Ordering::Relaxed) as f64 / ops as f64;
            let extra = BTreeMap::from([
                ("data".to_string(), serde_json::json!(args.data)),
                ("compress_ns".to_string(), serde_json::json!(get(0))),
                ("decompress_ns".to_string(), serde_json::json!(get(1))),
                ("bytes_per_page".to_string(), serde_json::json!(get(2))),
            ]);
            summarize(selected[v], r, extra)
        })
        .collect();
    let report = Report {
        bench: "codec".into(),
        variants,
    };
    common.save(&report)?;
    if common.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    println!("bench codec: {:?} pages, {} distinct", args.data, PAGES);
    println!(
        "{:<10} {:>3} {:>12} {:>12} {:>14} {:>14}",
        "codec", "thr", "pages/s", "bytes/page", "compress ns", "decompress ns"
    );
    for v in &report.variants {
        let f = |k: &str| v.extra[k].as_f64().unwrap_or(0.0);
        println!(
            "{:<10} {:>3} {:>12.0} {:>12.0} {:>14.0} {:>14.0}",
            v.name,
            v.threads,
            v.throughput,
            f("bytes_per_page"),
            f("compress_ns"),
            f("decompress_ns")
        );
    }
    println!("(a page that does not compress counts 4096 bytes and is not decompressed, as the store keeps it whole)");
    Ok(())
}
