//! Encrypted swap files seen from outside: what is on disk
//! while a region is swapped out holds none of its bytes, and a block
//! changed on disk (a flipped bit, two blocks swapped, an old block put
//! back) ends in SIGBUS with the reason, never in wrong data.

use std::collections::HashSet;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::child;
use crate::io::FileOptions;
use crate::pager::{FaultMode, Region, Swap, SwapDeviceSpec};
use crate::PAGE_SIZE;

const MIB: u64 = 1 << 20;

/// Secret-looking pages, `len` bytes of them: text naming the page and
/// the 64-byte chunk, so every chunk of every page is distinct and easy
/// to look for.
fn secrets(len: usize, seed: u64) -> Vec<u8> {
    let mut out = vec![0u8; len];
    for (p, page) in out.chunks_exact_mut(PAGE_SIZE).enumerate() {
        for (c, chunk) in page.chunks_exact_mut(64).enumerate() {
            let text = format!("password of page {p:06} chunk {c:02} seed {seed:04}: hunter2 correct horse");
            chunk.copy_from_slice(&text.as_bytes()[..64]);
        }
    }
    out
}

/// Page by page, in order, so the first pages are the first evicted (one
/// large copy may write several pages at once, out of order).
fn write_secrets(region: &mut Region, seed: u64) {
    let s = secrets(region.len(), seed);
    for (to, from) in region
        .as_mut_slice()
        .chunks_exact_mut(PAGE_SIZE)
        .zip(s.chunks_exact(PAGE_SIZE))
    {
        to.copy_from_slice(from);
    }
}

fn check_secrets(region: &Region, seed: u64) {
    assert!(
        region.as_slice() == &secrets(region.len(), seed)[..],
        "a page read back differs"
    );
}

/// The swap file uswap made in `dir`: unnamed (`O_TMPFILE`), so found
/// through this process's descriptors, as `/proc/self/fd/N`.
fn unnamed_swap_file(dir: &Path) -> PathBuf {
    let dir = dir.canonicalize().unwrap();
    for fd in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        let Ok(target) = std::fs::read_link(fd.path()) else {
            continue;
        };
        let t = target.to_string_lossy();
        if t.starts_with(&*dir.to_string_lossy()) && t.ends_with("(deleted)") {
            return fd.path();
        }
    }
    panic!(
        "no unnamed file of {} among this process's descriptors",
        dir.display()
    );
}

fn file_swap(dir: &Path, budget: u64, encrypt: bool, mode: FaultMode) -> Swap {
    Swap::builder()
        .budget(budget)
        .device(SwapDeviceSpec::file(
            FileOptions::new(dir.join("swap"), 64 * MIB / PAGE_SIZE as u64).encrypt(encrypt),
        ))
        .fault_mode(mode)
        .build()
        .unwrap()
}

/// The region is swapped out to a private file; reading that file
/// through /proc/self/fd finds no 64 bytes of what was written, and the
/// region reads back whole.  Plaintext (the ablation) finds them: the
/// test can see what it looks for.
#[test]
fn a_swapped_out_region_leaves_no_plaintext_in_its_file() {
    for (encrypt, mode) in [
        (true, FaultMode::Sigbus),
        (true, FaultMode::HandlerThread),
        (false, FaultMode::Sigbus),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let swap = file_swap(dir.path(), 2 * MIB, encrypt, mode);
        let mut region = swap.map((16 * MIB) as usize).unwrap();
        write_secrets(&mut region, 1);
        let pages = region.len() / PAGE_SIZE;
        let out: Vec<usize> = (0..pages)
            .filter(|&i| region.slot_of(i).is_some() && !region.is_resident(i))
            .collect();
        assert!(
            out.len() > pages / 2,
            "only {} of {pages} pages swapped out",
            out.len()
        );
        // Every 64-byte block the file holds, as it is on disk now.
        let raw = std::fs::read(unnamed_swap_file(dir.path())).unwrap();
        let on_disk: HashSet<&[u8]> = raw.chunks_exact(64).collect();
        let bytes = region.as_slice();
        let found = out
            .iter()
            .filter(|&&i| {
                bytes[i * PAGE_SIZE..(i + 1) * PAGE_SIZE]
                    .chunks_exact(64)
                    .any(|c| on_disk.contains(c))
            })
            .count();
        // (Reading `bytes` faults the pages back in; the file was read
        // before that, while they were out.)
        if encrypt {
            assert_eq!(
                found, 0,
                "{mode:?}: {found} swapped-out pages are in the file in plaintext"
            );
        } else {
            assert!(
                found > out.len() / 2,
                "plaintext: only {found} of {} pages seen in the file",
                out.len()
            );
        }
        check_secrets(&region, 1);
    }
}

/// How a child scenario damages the swap file.
fn tamper(scenario: &str, mode: FaultMode) {
    let dir = tempfile::tempdir().unwrap();
    let swap = file_swap(dir.path(), MIB, true, mode);
    let mut region = swap.map((8 * MIB) as usize).unwrap();
    write_secrets(&mut region, 1);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(unnamed_swap_file(dir.path()))
        .unwrap();
    let block = |slot: u64| {
        let mut b = vec![0u8; PAGE_SIZE];
        file.read_exact_at(&mut b, slot * PAGE_SIZE as u64).unwrap();
        b
    };
    let put = |slot: u64, b: &[u8]| file.write_all_at(b, slot * PAGE_SIZE as u64).unwrap();
    let slot = |region: &Region, i: usize| {
        assert!(!region.is_resident(i), "page {i} should be swapped out");
        region.slot_of(i).expect("swapped out").offset()
    };
    let victim = match scenario {
        "bitflip" => {
            let s = slot(&region, 3);
            let mut b = block(s);
            b[1234] ^= 0x10;
            put(s, &b);
            3
        }
        "swap" => {
            let (s3, s4) = (slot(&region, 3), slot(&region, 4));
            let (b3, b4) = (block(s3), block(s4));
            put(s3, &b4);
            put(s4, &b3);
            4
        }
        "replay" => {
            // Page 3's block now, then page 3 written anew and swapped
            // out again, then the old block put back where it now is.
            let old = block(slot(&region, 3));
            region.as_mut_slice()[3 * PAGE_SIZE..4 * PAGE_SIZE].fill(0x77);
            for b in region.as_mut_slice()[8 * PAGE_SIZE..].chunks_mut(PAGE_SIZE) {
                b[0] ^= 1;
            }
            put(slot(&region, 3), &old);
            3
        }
        other => panic!("no scenario {other}"),
    };
    file.sync_all().unwrap();
    eprintln!("touching the damaged page");
    let v = region.as_slice()[victim * PAGE_SIZE + 100];
    // Not reached: SIGBUS.  Never wrong data, never zeros.
    eprintln!("read {v:#x} from a page whose block was damaged");
    child::exit(3);
}

fn assert_damage_is_caught(test: &str, scenario: &str) {
    let out = child::run(
        &format!("pager::tests::encrypted::{test}"),
        scenario,
        std::time::Duration::from_secs(60),
    );
    let err = &out.stderr;
    assert!(
        err.contains("touching the damaged page"),
        "the child did not get there: {out:?}"
    );
    assert!(
        err.contains("failed its authentication check") && err.contains("the memory is poisoned"),
        "{out:?}"
    );
    assert_eq!(out.signal, Some(libc::SIGBUS), "{out:?}");
}

#[test]
fn a_flipped_bit_in_the_swap_file_is_caught() {
    if let Some(s) = child::scenario() {
        tamper(&s, FaultMode::Sigbus);
    }
    assert_damage_is_caught("a_flipped_bit_in_the_swap_file_is_caught", "bitflip");
}

#[test]
fn swapped_blocks_in_the_swap_file_are_caught() {
    if let Some(s) = child::scenario() {
        tamper(&s, FaultMode::HandlerThread);
    }
    assert_damage_is_caught("swapped_blocks_in_the_swap_file_are_caught", "swap");
}

#[test]
fn a_replayed_block_in_the_swap_file_is_caught() {
    if let Some(s) = child::scenario() {
        tamper(&s, FaultMode::Sigbus);
    }
    assert_damage_is_caught("a_replayed_block_in_the_swap_file_is_caught", "replay");
}
