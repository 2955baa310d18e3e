use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::io::codec::Codec;
use crate::io::options::FileOptions;
use crate::io::device::{BackendKind, PageStore};
use crate::io::IoOp;
use crate::stats::Registry;

/// Page kinds the store treats differently.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Text,
    Random,
    Zeros,
    Same,
}

const KINDS: [Kind; 4] = [Kind::Text, Kind::Random, Kind::Zeros, Kind::Same];

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Page `seed` of `kind`: different seeds give different contents.
fn page(kind: Kind, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    match kind {
        Kind::Zeros => vec![0; PAGE_SIZE],
        Kind::Same => (seed | 1).to_ne_bytes().repeat(PAGE_SIZE / 8),
        Kind::Random => (0..PAGE_SIZE).map(|_| (xorshift(&mut x) >> 24) as u8).collect(),
        Kind::Text => {
            let words: [&[u8]; 8] = [
                b"swap ",
                b"cluster ",
                b"slot ",
                b"extent ",
                b"the ",
                b"page ",
                b"of ",
                b"trunk ",
            ];
            let mut s = format!("page {seed}: ").into_bytes();
            while s.len() < PAGE_SIZE {
                s.extend_from_slice(words[(xorshift(&mut x) % 8) as usize]);
            }
            s.truncate(PAGE_SIZE);
            s
        }
    }
}

/// A 4096-aligned page buffer (file devices read and write with O_DIRECT).
struct Buf(Mapping);

impl Buf {
    fn new(pages: usize) -> Buf {
        Buf(Mapping::new(pages * PAGE_SIZE, PAGE_SIZE).unwrap())
    }
    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: our own mapping, used by this thread alone.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_ptr(), self.0.len()) }
    }
}

fn write(dev: &IoDevice, slot: u64, data: &[u8]) -> Result<(), IoError> {
    let mut b = Buf::new(1);
    b.bytes().copy_from_slice(data);
    dev.write(slot, b.bytes())
}

fn read(dev: &IoDevice, slot: u64) -> Vec<u8> {
    let mut b = Buf::new(1);
    dev.read(slot, b.bytes())
        .unwrap_or_else(|e| panic!("slot {slot}: {e}"));
    b.bytes().to_vec()
}

/// The gauges of what a store holds: all zero once every slot is
/// discarded.
const HELD: [&str; 6] = [
    "store_same_pages",
    "store_whole_pages",
    "store_orig_bytes",
    "store_compr_bytes",
    "store_mem_bytes",
    "store_file_pages",
];

const CODECS: [Codec; 3] = [Codec::Lz4, Codec::Zstd { level: 1 }, Codec::Zstd { level: 9 }];

#[test]
fn every_codec_and_kind_of_page_reads_back_and_the_accounts_balance() {
    for codec in CODECS {
        let r = Registry::new();
        let dev = IoDevice::compressed(&CompressedOptions::new(4 << 20).codec(codec), &r).unwrap();
        assert_eq!(dev.kind(), BackendKind::Compressed);
        assert_eq!(dev.slots(), 1024);
        for slot in 0..400u64 {
            write(&dev, slot, &page(KINDS[slot as usize % 4], slot)).unwrap();
        }
        for slot in 0..400u64 {
            assert_eq!(
                read(&dev, slot),
                page(KINDS[slot as usize % 4], slot),
                "{codec} slot {slot}"
            );
        }
        // A slot never written reads zeros.
        assert_eq!(read(&dev, 900), vec![0; PAGE_SIZE]);
        let s = r.snapshot();
        assert_eq!(s.gauges.store_same_pages, 200, "{codec}: zeros and same-filled");
        assert_eq!(
            s.gauges.store_whole_pages, 100,
            "{codec}: random pages stored whole"
        );
        assert_eq!(s.gauges.store_orig_bytes, 400 * PAGE);
        let compr = s.gauges.store_compr_bytes;
        assert!(
            compr > 100 * PAGE && compr < 150 * PAGE,
            "{codec}: {compr} compressed bytes"
        );
        assert!(s.gauges.store_mem_bytes >= compr);
        dev.check_store().unwrap();
        // Rewriting a slot replaces its page; discarding frees it all.
        write(&dev, 3, &page(Kind::Text, 1000)).unwrap();
        assert_eq!(read(&dev, 3), page(Kind::Text, 1000));
        dev.slot_freed(0, 400);
        let s = r.snapshot();
        for g in HELD {
            assert_eq!(
                s.gauges
                    .iter()
                    .find(|&(n, _)| n == g)
                    .expect("a gauge of that name")
                    .1,
                0,
                "{codec}: {g} after discarding everything"
            );
        }
        assert!(s.gauges.store_mem_peak_bytes >= compr);
        assert_eq!(read(&dev, 5), vec![0; PAGE_SIZE], "a discarded slot reads zeros");
        dev.check_store().unwrap();
    }
}

#[test]
fn text_pages_take_less_than_their_size_and_zstd_less_than_lz4() {
    let mut mem = Vec::new();
    for codec in [Codec::Lz4, Codec::Zstd { level: 1 }] {
        let r = Registry::new();
        let dev = IoDevice::compressed(&CompressedOptions::new(8 << 20).codec(codec), &r).unwrap();
        for slot in 0..1024u64 {
            write(&dev, slot, &page(Kind::Text, slot)).unwrap();
        }
        let s = r.snapshot();
        assert!(
            s.gauges.store_mem_bytes < 1024 * PAGE * 3 / 4,
            "{codec}: {}",
            s.gauges.store_mem_bytes
        );
        mem.push(s.gauges.store_mem_bytes);
    }
    assert!(mem[1] < mem[0], "zstd {} bytes, lz4 {}", mem[1], mem[0]);
}

#[test]
fn compaction_gathers_part_used_blocks_and_keeps_every_page() {
    let r = Registry::new();
    let dev = IoDevice::compressed(&CompressedOptions::new(8 << 20), &r).unwrap();
    for slot in 0..2000u64 {
        write(&dev, slot, &page(Kind::Text, slot)).unwrap();
    }
    let before = r.snapshot().gauges.store_mem_bytes;
    for slot in (0..2000u64).filter(|s| s % 4 != 0) {
        dev.slot_freed(slot, 1);
    }
    let holey = r.snapshot().gauges.store_mem_bytes;
    let freed = dev.compact();
    assert!(freed > 0, "nothing compacted");
    let after = r.snapshot().gauges.store_mem_bytes;
    assert!(
        after < holey && after < before / 3,
        "{before} -> {holey} -> {after} bytes"
    );
    assert_eq!(r.snapshot().counters.store_compacted_blocks, freed as u64);
    dev.check_store().unwrap();
    for slot in (0..2000u64).step_by(4) {
        assert_eq!(
            read(&dev, slot),
            page(Kind::Text, slot),
            "slot {slot} after compaction"
        );
    }
}

#[test]
fn a_full_store_without_a_file_refuses_with_a_transient_error() {
    let r = Registry::new();
    let store = CompressedStore::new(&CompressedOptions::new(1 << 20), &r).unwrap();
    // Fill every block with random pages stored whole.
    let blocks = store.pool.capacity_blocks();
    let fit = blocks * (BLOCK / PAGE_SIZE);
    // A store alone has room for every slot's page whole: it never fills.
    assert!(fit >= 256);
    let mut b = Buf::new(1);
    for slot in 0..200u64 {
        b.bytes().copy_from_slice(&page(Kind::Random, slot));
        store.write(slot, b.bytes()).unwrap();
    }
    // As if its limit were lower: use up the rest of the blocks.
    let mut filler = Vec::new();
    while let Some(h) = store.pool.alloc(WHOLE, u32::MAX, &page(Kind::Random, 0)) {
        filler.push(h);
    }
    b.bytes().copy_from_slice(&page(Kind::Random, 5000));
    let e = store.write(250, b.bytes()).unwrap_err();
    assert!(e.is_transient(), "{e}");
    assert!(e.to_string().contains("slot 250"), "{e}");
    // The refused write left the slot empty, and nothing else changed.
    let mut back = Buf::new(1);
    store.read(250, back.bytes()).unwrap();
    assert_eq!(back.bytes(), &vec![0; PAGE_SIZE][..]);
    store.read(1, back.bytes()).unwrap();
    assert_eq!(back.bytes(), &page(Kind::Random, 1)[..]);
    filler.into_iter().for_each(|h| {
        store.pool.free(h);
    });
    store.pool.check().unwrap();
}

fn tier(dir: &tempfile::TempDir, limit: u64, slots: u64, codec: Codec) -> CompressedOptions {
    CompressedOptions::new(limit)
        .codec(codec)
        .file(FileOptions::new(dir.path().join("tier"), slots))
}

/// Write `pages` of `kind(slot)` at `first..` with one call, as the
/// pager hands over a folio's run of slots.
fn write_run(dev: &IoDevice, first: u64, pages: u64, kind: impl Fn(u64) -> Kind) -> Result<(), IoError> {
    let mut b = Buf::new(pages as usize);
    for (i, p) in b.bytes().chunks_exact_mut(PAGE_SIZE).enumerate() {
        let slot = first + i as u64;
        p.copy_from_slice(&page(kind(slot), slot));
    }
    dev.write(first, b.bytes())
}

/// Read `pages` at `first..` with one call and check each.
fn check_run(dev: &IoDevice, first: u64, pages: u64, kind: impl Fn(u64) -> Kind, what: &str) {
    let mut b = Buf::new(pages as usize);
    dev.read(first, b.bytes())
        .unwrap_or_else(|e| panic!("{what}: slots {first}+{pages}: {e}"));
    for (i, p) in b.bytes().chunks_exact(PAGE_SIZE).enumerate() {
        let slot = first + i as u64;
        assert_eq!(p, &page(kind(slot), slot)[..], "{what}: slot {slot}");
    }
}

/// A store of 1 MiB over 64 MiB of slots, written in runs of 16: the
/// oldest pages go to the file, every page reads back (in runs across
/// pages in the file and in the store, and one by one), and the
/// accounts balance.  Pages that do not compress are stored whole and
/// written back in their turn (zswap since Linux 6.18), or, switched,
/// sent straight to the file (zswap before it).
#[test]
fn a_full_store_spills_its_oldest_pages_to_the_file_and_loses_none() {
    const N: u64 = 16384;
    const RUN: u64 = 16;
    let kind = |slot: u64| KINDS[slot as usize % 4];
    for to_file in [false, true] {
        for codec in [Codec::Lz4, Codec::Zstd { level: 3 }] {
            let what = format!("{codec} incompressible_to_file={to_file}");
            let dir = tempfile::tempdir().unwrap();
            let r = Registry::new();
            // 1 MiB of store (the least), 64 MiB of slots.
            let opts = tier(&dir, 0, N, codec).incompressible_to_file(to_file);
            let dev = IoDevice::compressed(&opts, &r).unwrap();
            assert!(dev.has_file());
            for first in (0..N).step_by(RUN as usize) {
                write_run(&dev, first, RUN, kind).unwrap();
            }
            let s = r.snapshot();
            assert!(s.gauges.store_mem_bytes <= s.gauges.store_limit_bytes, "{what}");
            let straight = if to_file { N / 4 } else { 0 };
            assert_eq!(
                s.counters.store_incompressible_to_file, straight,
                "{what}: random pages straight to the file"
            );
            assert!(s.counters.store_writebacks > 0, "{what}: no writeback: {s:?}");
            assert_eq!(s.gauges.store_file_pages, straight + s.counters.store_writebacks, "{what}");
            if !to_file {
                assert!(s.gauges.store_whole_pages > 0, "{what}: {s:?}");
            }
            // The oldest went first: slot 0's text page is in the file.
            assert_eq!(tag(dev_entry(&dev, 0)), FILE, "{what}");
            // Runs that start in the file and end in the store, and runs
            // the switch left half in the file (its random pages).
            for first in (0..N).step_by(64) {
                check_run(&dev, first, 64, kind, &what);
            }
            for slot in 0..N {
                assert_eq!(read(&dev, slot), page(kind(slot), slot), "{what} slot {slot}");
            }
            dev.check_store().unwrap();
            dev.slot_freed(0, N);
            let s = r.snapshot();
            assert_eq!(s.gauges.store_file_pages, 0, "{what}");
            assert_eq!(s.gauges.store_orig_bytes, 0, "{what}");
        }
    }
}

/// A run of pages placed in the file goes with one write; when the
/// file refuses it, none of its slots keeps an entry (each reads as
/// never written), the error names the cause, and the same run written
/// again once the file takes writes reads back.
#[test]
fn a_run_the_file_refuses_leaves_none_of_its_slots() {
    let dir = tempfile::tempdir().unwrap();
    let r = Registry::new();
    let opts = tier(&dir, 0, 4096, Codec::Lz4).incompressible_to_file(true);
    let dev = IoDevice::compressed(&opts, &r).unwrap();
    let file = dev.store.file_behind().unwrap();
    let random = |_| Kind::Random;
    file.inject_errors_for(IoOp::Write, libc::EIO, Duration::from_secs(3600));
    let err = write_run(&dev, 100, 8, random).unwrap_err();
    assert!(
        matches!(&err, IoError::Write { offset: 100, source } if source.raw_os_error() == Some(libc::EIO)),
        "{err:?}"
    );
    for slot in 100..108 {
        assert_eq!(dev_entry(&dev, slot), EMPTY, "slot {slot}");
        assert_eq!(read(&dev, slot), vec![0; PAGE_SIZE], "slot {slot}");
    }
    assert_eq!(r.snapshot().gauges.store_file_pages, 0);
    file.inject_errors_for(IoOp::Write, libc::EIO, Duration::ZERO);
    write_run(&dev, 100, 8, random).unwrap();
    let s = r.snapshot();
    assert_eq!((s.gauges.store_file_pages, s.counters.store_incompressible_to_file), (8, 8));
    // One write for the run, one read for it read back as a run.
    assert_eq!(file.calls(), (1, 0));
    check_run(&dev, 100, 8, random, "after the file took writes again");
    assert_eq!(file.calls(), (1, 1));
    dev.slot_freed(100, 8);
    assert_eq!(r.snapshot().gauges.store_file_pages, 0);
}

fn dev_entry(dev: &IoDevice, slot: u64) -> u64 {
    dev.store.entry_of(slot)
}

#[test]
fn a_failed_writeback_leaves_the_page_in_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let r = Registry::new();
    let dev =
        IoDevice::compressed(&tier(&dir, 0, 4096, Codec::Lz4).incompressible_to_file(false), &r).unwrap();
    let file = dev.store.file_behind().unwrap();
    // Fill the store with random pages (whole, 16 a block) until a
    // writeback has to happen, the file failing meanwhile.
    file.inject_errors_for(IoOp::Write, libc::EIO, Duration::from_secs(3600));
    let mut refused = None;
    for slot in 0..4096u64 {
        if let Err(e) = write(&dev, slot, &page(Kind::Random, slot)) {
            refused = Some((slot, e));
            break;
        }
    }
    let (slot, e) = refused.expect("the store never filled");
    let failed_at = std::time::Instant::now();
    // Writeback rests a moment after a failure: the same write is
    // refused again at once, without trying the file (unless a loaded
    // machine let the rest run out meanwhile: then not checked).
    let tried = r.snapshot().counters.store_writeback_errors;
    assert!(write(&dev, slot, &page(Kind::Random, slot))
        .unwrap_err()
        .is_transient());
    if failed_at.elapsed() < Duration::from_nanos(WRITEBACK_HOLD_NS) {
        assert_eq!(r.snapshot().counters.store_writeback_errors, tried);
    }
    assert!(e.is_transient(), "a full store is transient: {e}");
    let s = r.snapshot();
    assert!(s.counters.store_writeback_errors > 0);
    assert_eq!(s.counters.store_writebacks, 0);
    assert_eq!(s.gauges.store_file_pages, 0);
    // Every page written before is still there, in the store.
    for i in 0..slot {
        assert_eq!(read(&dev, i), page(Kind::Random, i), "slot {i}");
        assert_eq!(tag(dev_entry(&dev, i)), STORED);
    }
    dev.check_store().unwrap();
    // The file comes back: the same write now goes through, the oldest
    // going to the file.
    file.inject_errors_for(IoOp::Write, libc::EIO, Duration::ZERO);
    std::thread::sleep(Duration::from_nanos(WRITEBACK_HOLD_NS));
    write(&dev, slot, &page(Kind::Random, slot)).unwrap();
    assert!(r.snapshot().counters.store_writebacks > 0);
    for i in 0..=slot {
        assert_eq!(read(&dev, i), page(Kind::Random, i), "slot {i}");
    }
}

/// Threads own disjoint slots and write, read back and discard them at
/// random, while another compacts without pause; the store is small, so
/// writeback to the file runs all along.  Every read sees the page last
/// written; at the end the bookkeeping holds and the accounts are zero.
#[test]
fn faults_race_compaction_and_writeback() {
    for codec in [Codec::Lz4, Codec::Zstd { level: 1 }] {
        let dir = tempfile::tempdir().unwrap();
        let r = Registry::new();
        let dev = Arc::new(IoDevice::compressed(&tier(&dir, 0, 8192, codec), &r).unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let compactor = {
            let (dev, stop) = (dev.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    n += dev.compact();
                    std::thread::yield_now();
                }
                n
            })
        };
        let threads = 4u64;
        let per = 8192 / threads;
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let dev = dev.clone();
                std::thread::spawn(move || {
                    let mut x = t + 1;
                    let mut version = vec![None::<(Kind, u64)>; per as usize];
                    let mut b = Buf::new(1);
                    for step in 0..6000u64 {
                        let i = xorshift(&mut x) % per;
                        let slot = t * per + i;
                        match (xorshift(&mut x) % 8, version[i as usize]) {
                            (0, Some(_)) => {
                                dev.slot_freed(slot, 1);
                                version[i as usize] = None;
                            }
                            (1..=3, Some((k, seed))) => {
                                dev.read(slot, b.bytes()).unwrap();
                                assert_eq!(b.bytes(), &page(k, seed)[..], "slot {slot} step {step}");
                            }
                            _ => {
                                let k = KINDS[(xorshift(&mut x) % 4) as usize];
                                let seed = step * 8192 + slot;
                                b.bytes().copy_from_slice(&page(k, seed));
                                dev.write(slot, b.bytes()).unwrap();
                                version[i as usize] = Some((k, seed));
                            }
                        }
                    }
                    for (i, v) in version.iter().enumerate() {
                        let slot = t * per + i as u64;
                        if let Some((k, seed)) = v {
                            dev.read(slot, b.bytes()).unwrap();
                            assert_eq!(b.bytes(), &page(*k, *seed)[..], "slot {slot} at the end");
                            dev.slot_freed(slot, 1);
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        compactor.join().unwrap();
        dev.check_store().unwrap();
        let s = r.snapshot();
        assert!(s.counters.store_writebacks > 0, "{codec}: the store never filled");
        for g in HELD {
            assert_eq!(
                s.gauges
                    .iter()
                    .find(|&(n, _)| n == g)
                    .expect("a gauge of that name")
                    .1,
                0,
                "{codec}: {g} left after every slot was discarded"
            );
        }
    }
}

#[test]
fn the_sample_check_tells_random_from_text_and_numbers() {
    assert!(looks_incompressible(&page(Kind::Random, 3)));
    assert!(!looks_incompressible(&page(Kind::Text, 3)));
    let numbers: Vec<u8> = (0..PAGE_SIZE as u32 / 4)
        .flat_map(|i| (i * 7).to_le_bytes())
        .collect();
    assert!(!looks_incompressible(&numbers));
    assert_eq!(same_word(&page(Kind::Zeros, 0)), Some(0));
    assert_eq!(same_word(&page(Kind::Same, 6)), Some(7));
    let mut almost = page(Kind::Zeros, 0);
    almost[2000] = 1;
    assert_eq!(same_word(&almost), None);
}

#[test]
fn the_sample_check_is_on_by_default_only_for_a_codec_slow_to_give_up() {
    let on = |codec, set: Option<bool>| {
        let opts = CompressedOptions::new(1 << 20).codec(codec);
        let opts = match set {
            Some(s) => opts.sample_check(s),
            None => opts,
        };
        let store = CompressedStore::new(&opts, &Registry::new()).unwrap();
        assert_eq!(store.sample_check, opts.samples(), "{codec}");
        store.sample_check
    };
    assert!(!on(Codec::Lz4, None));
    assert!(!on(Codec::Zstd { level: -1 }, None));
    assert!(on(Codec::Zstd { level: 1 }, None));
    assert!(on(Codec::Zstd { level: 9 }, None));
    assert!(on(Codec::Lz4, Some(true)));
    assert!(!on(Codec::Zstd { level: 3 }, Some(false)));
    // Either way a random page goes in whole and comes back the same.
    for set in [true, false] {
        let r = Registry::new();
        let dev = IoDevice::compressed(&CompressedOptions::new(1 << 20).sample_check(set), &r).unwrap();
        write(&dev, 3, &page(Kind::Random, 5)).unwrap();
        assert!(read(&dev, 3) == page(Kind::Random, 5), "sample check {set}: read back different");
        assert_eq!(r.snapshot().gauges.store_whole_pages, 1, "sample check {set}");
    }
}
