//! The operations the pager's fault and reclaim paths will call must not
//! allocate: a fault served in a signal handler cannot call malloc.  A
//! counting global allocator proves it for every core structure, once
//! warmed up (construction allocates everything up front, by design).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::num::NonZeroU64;

use uswap::extent::{ExtentMap, ExtentMapKind};
use uswap::lru::{Lru, LruBatch, LruConfig};
use uswap::pager::{Swap, SwapDeviceSpec};
use uswap::stats::Registry;
use uswap::swap_cache::SwapCache;
use uswap::swap_space::{SlotDeviceConfig, SwapEntry, SwapSpace, Switches};

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: defers every call to the system allocator; it only counts, per
// thread, in a const-initialised thread local that never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: the caller upholds `alloc`'s contract, which is System's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from System through us with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: `ptr` came from System through us with this layout.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations_in(f: impl FnOnce()) -> u64 {
    let before = ALLOCS.with(|c| c.get());
    f();
    ALLOCS.with(|c| c.get()) - before
}

#[test]
fn the_counter_counts() {
    let n = allocations_in(|| {
        std::hint::black_box(vec![1u8; 10]);
        std::hint::black_box(Box::new(5u64));
    });
    assert_eq!(n, 2);
}

#[test]
fn swap_space_and_swap_cache_do_not_allocate() {
    let reg = Registry::new();
    for sw in Switches::all() {
        let space = SwapSpace::builder()
            .switches(sw)
            .device(SlotDeviceConfig::new(1 << 14).priority(1))
            .device(SlotDeviceConfig::new(1 << 13).priority(1).rotational(true))
            .build(&reg)
            .unwrap();
        let cache = SwapCache::new(&[1 << 14, 1 << 13], 1024, &reg).unwrap();
        let mut held = vec![SwapEntry::NONE; 4096];
        let mut batch = vec![SwapEntry::NONE; 64];
        let pages = [NonZeroU64::new(1).unwrap(); 512];
        // One operation before counting: what a first use sets up once is
        // not the path under test.  (Counter shards are per CPU: nothing
        // of theirs to warm.)
        let e = space.alloc().unwrap();
        space.free(e).unwrap();
        let n = allocations_in(|| {
            for slot in held.iter_mut() {
                *slot = space.alloc().unwrap();
                cache.add(*slot, NonZeroU64::new(7).unwrap()).unwrap();
                assert!(cache.lookup(*slot).is_some());
                assert_eq!(space.dup(*slot).unwrap(), 2);
                assert_eq!(space.free(*slot).unwrap(), 1);
            }
            if let Ok(h) = space.alloc_huge() {
                cache.add_batch(h, &pages).unwrap();
                cache.delete_batch(h, &mut [], 512);
                space.free_huge(h).unwrap();
            }
            let got = space.alloc_batch(&mut batch).unwrap();
            space.free_batch(&mut batch[..got]).unwrap();
            for slot in held.iter() {
                cache.delete(*slot);
                space.free(*slot).unwrap();
            }
            space.drain_slot_caches();
        });
        assert_eq!(n, 0, "swap space / swap cache allocated {n} times with {sw:?}");
        space.check_invariants().unwrap();
    }
}

#[test]
fn lru_does_not_allocate() {
    let reg = Registry::new();
    for batch in [LruBatch::Pages(31), LruBatch::Pages(15), LruBatch::Unbatched] {
        let lru = Lru::new(LruConfig::new(4096).batch(batch), &reg).unwrap();
        let mut victims = [0u32; 64];
        lru.add(0);
        lru.remove(0);
        let n = allocations_in(|| {
            for p in 0..4096 {
                lru.add(p);
            }
            for p in (0..4096).step_by(3) {
                lru.activate(p);
                lru.mark_referenced(p);
            }
            for p in (0..4096).step_by(5) {
                lru.deactivate(p);
            }
            lru.drain_all();
            assert!(lru.shrink_inactive(256, &mut victims) > 0);
            lru.age_active(128);
            for p in 0..4096 {
                lru.remove(p);
            }
        });
        assert_eq!(n, 0, "LRU allocated {n} times with {batch:?}");
    }
}

#[test]
fn extent_lookup_does_not_allocate() {
    for kind in [ExtentMapKind::Tree, ExtentMapKind::List] {
        let mut b = ExtentMap::builder(kind);
        for i in 0..2000u64 {
            // Gaps on the backing, so nothing merges.
            b.add(100, 0, i * 1_000_000, None).unwrap();
        }
        let map = b.build().unwrap();
        assert_eq!(map.len(), 2000);
        let n = allocations_in(|| {
            for s in (0..200_000u64).step_by(97) {
                assert_eq!(map.lookup(s), Some((0, (s / 100) * 1_000_000 + (s % 100) * 4096)));
            }
        });
        assert_eq!(n, 0, "extent lookup allocated {n} times ({kind:?})");
    }
}

/// The fault path, in SIGBUS mode, runs in the faulting thread: its zero
/// fills, swap-ins and their readahead, write-protect faults and direct
/// reclaim must not allocate (a signal handler cannot call malloc).  Background reclaim is
/// off, so all eviction happens here, in this thread, too: whole batches
/// when the budget is exhausted, and, paced (the default), a fault's share
/// of writeback and eviction while within a batch of the budget.
#[test]
fn fault_path_does_not_allocate() {
    for paced in [false, true] {
        fault_path_does_not_allocate_when(paced);
    }
}

fn fault_path_does_not_allocate_when(paced: bool) {
    let swap = Swap::builder()
        .budget(1 << 20)
        .device(SwapDeviceSpec::ram(32 << 20))
        .background_reclaim(false)
        .paced_reclaim(paced)
        .build()
        .unwrap();
    let mut region = swap.map(8 << 20).unwrap();
    // One fault before counting, as above.
    region.as_mut_slice()[0] = 1;
    let mut sum = 0u64;
    let n = allocations_in(|| {
        for pass in 0..2u8 {
            for page in region.as_mut_slice().chunks_mut(4096) {
                page[17] = page[17].wrapping_add(pass + 1);
            }
        }
        // A pass of reads: clean installs, and clean pages dropped in
        // batches as they are evicted.
        for page in region.as_slice().chunks(4096) {
            sum += u64::from(page[17]);
        }
    });
    assert!(sum >= 3 * 2048);
    let st = swap.stats();
    assert!(
        st.counters.evictions > 2000
            && st.counters.swapins > 50
            && st.counters.swapins + st.counters.readahead > 1000
            && st.counters.evict_clean > 20
            && st.counters.fault_around > 100,
        "{:?}",
        st.counters
    );
    if paced {
        // Nearly every fault paces; readahead windows make their own
        // room, so there are a few hundred faults, not thousands.
        assert!(
            st.counters.paced > 300 && st.counters.paced * 2 > st.counters.faults,
            "{:?}",
            st.counters
        );
    } else {
        assert!(st.counters.direct_reclaim > 0);
        assert_eq!(st.counters.paced, 0);
    }
    assert_eq!(n, 0, "the fault path allocated {n} times (paced: {paced})");
    assert!(region.as_slice().chunks(4096).all(|p| p[17] == 3 || p[17] == 4));
    drop(region);
}

#[test]
fn file_and_unit_fault_paths_do_not_allocate() {
    // A swap file: O_DIRECT reads and writes, and sequential reads that
    // hand windows to the prefetcher thread.
    let dir = tempfile::tempdir().unwrap();
    let swap = Swap::builder()
        .budget(1 << 20)
        .device(SwapDeviceSpec::file(uswap::io::FileOptions::new(
            dir.path().join("swap"),
            8192,
        )))
        .background_reclaim(false)
        .build()
        .unwrap();
    let mut region = swap.map(8 << 20).unwrap();
    region.as_mut_slice()[0] = 1;
    let mut sum = 0u64;
    let n = allocations_in(|| {
        for page in region.as_mut_slice().chunks_mut(4096) {
            page[17] = 5;
        }
        for page in region.as_slice().chunks(4096) {
            sum += u64::from(page[17]);
        }
    });
    assert_eq!(sum, 5 * 2048);
    let st = swap.stats();
    assert!(
        st.counters.readahead > 100 && st.counters.io_write_pages > 1000,
        "{:?}",
        st.counters
    );
    assert_eq!(n, 0, "the fault path allocated {n} times (swap file)");
    drop(region);

    // 2 MB units: whole-unit installs, evictions and swap-ins, under the
    // smallest budget `map_huge` takes (two units).
    drop(swap);
    let swap = Swap::builder()
        .budget(4 << 20)
        .device(SwapDeviceSpec::ram(64 << 20))
        .background_reclaim(false)
        .build()
        .unwrap();
    let mut units = swap.map_huge(16 << 20).unwrap();
    units.as_mut_slice()[0] = 1;
    let n = allocations_in(|| {
        for pass in 0..2u8 {
            for page in units.as_mut_slice().chunks_mut(4096) {
                page[5] = page[5].wrapping_add(pass + 1);
            }
        }
    });
    let st = swap.stats();
    assert!(
        st.counters.huge_swapouts > 4 && st.counters.huge_swapins > 2,
        "{:?}",
        st.counters
    );
    assert_eq!(n, 0, "the 2 MB unit fault path allocated {n} times");
}

/// Compressed devices: compression in (direct) reclaim, decompression in
/// the fault path, same-filled pages, compaction and writeback to a file
/// behind the store: no allocation from Rust, none from zstd's contexts
/// (counted through the allocator uswap hands zstd) once warmed up.
#[test]
fn compressed_fault_path_does_not_allocate() {
    let dir = tempfile::tempdir().unwrap();
    for (spec, what) in [
        ("zram:32M:lz4".to_string(), "lz4"),
        ("zram:32M:zstd:3".to_string(), "zstd"),
        (
            format!("zram:1M:zstd,file:{}:32M", dir.path().join("tier").display()),
            "tier",
        ),
    ] {
        let swap = Swap::builder()
            .budget(1 << 20)
            .device(spec.parse::<SwapDeviceSpec>().unwrap())
            .background_reclaim(false)
            .build()
            .unwrap();
        let mut region = swap.map(8 << 20).unwrap();
        region.as_mut_slice()[0] = 1;
        let c_before = uswap::io::codec::c_allocations();
        let mut sum = 0u64;
        let n = allocations_in(|| {
            for pass in 0..2u8 {
                for (i, page) in region.as_mut_slice().chunks_mut(4096).enumerate() {
                    if i % 3 == 0 {
                        // Same-filled.
                        page.fill(pass + 1);
                    } else {
                        text_page(i, pass, page);
                    }
                }
            }
            for page in region.as_slice().chunks(4096) {
                sum += u64::from(page[4095]);
            }
        });
        let st = swap.stats();
        assert!(
            st.counters.evictions > 2000 && st.counters.swapins > 50 && st.gauges.store_orig_bytes > 0,
            "{what}: {st:?}"
        );
        if what == "tier" {
            assert!(st.counters.store_writebacks > 100, "{what}: {st:?}");
        }
        assert!(sum > 0);
        assert_eq!(n, 0, "{what}: the fault path allocated {n} times");
        assert_eq!(
            uswap::io::codec::c_allocations(),
            c_before,
            "{what}: zstd allocated in the fault path"
        );
        let mut want = vec![0u8; 4096];
        for (i, page) in region.as_slice().chunks(4096).enumerate() {
            if i % 3 == 0 {
                assert!(page.iter().all(|&b| b == 2), "{what}: page {i}");
            } else {
                text_page(i, 1, &mut want);
                assert_eq!(page, &want[..], "{what}: page {i}");
            }
        }
    }
}

/// An NBD export (nbdkit's memory plugin on a socket of the test's, its
/// trims on), alone and behind a compressed store: requests, replies,
/// trims of freed slots, seals; no allocation once connected.
#[test]
fn nbd_fault_path_does_not_allocate() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nbd.sock");
    let mut server = std::process::Command::new("nbdkit")
        .args(["--foreground", "--exit-with-parent", "--unix"])
        .arg(&sock)
        .args(["memory", "64M"])
        .spawn()
        .expect("nbdkit is missing: install it (apt-get install nbdkit; scripts/check does)");
    // Listening, not only bound (a connect between the two is refused).
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let uri = format!("nbd+unix:///?socket={}", sock.display());
    for (spec, what) in [(uri.clone(), "nbd"), (format!("zram:1M,{uri}"), "tier")] {
        let swap = Swap::builder()
            .budget(1 << 20)
            .device(spec.parse::<SwapDeviceSpec>().unwrap())
            .background_reclaim(false)
            .build()
            .unwrap();
        let mut region = swap.map(8 << 20).unwrap();
        region.as_mut_slice()[0] = 1;
        let mut sum = 0u64;
        let n = allocations_in(|| {
            for pass in 0..2u8 {
                for (i, page) in region.as_mut_slice().chunks_mut(4096).enumerate() {
                    text_page(i, pass, page);
                }
            }
            for page in region.as_slice().chunks(4096) {
                sum += u64::from(page[4095]);
            }
        });
        let st = swap.stats();
        assert!(
            st.counters.evictions > 2000 && st.counters.swapins > 50,
            "{what}: {st:?}"
        );
        assert!(sum > 0);
        assert_eq!(n, 0, "{what}: the fault path allocated {n} times");
        let mut want = vec![0u8; 4096];
        for (i, page) in region.as_slice().chunks(4096).enumerate() {
            text_page(i, 1, &mut want);
            assert_eq!(page, &want[..], "{what}: page {i}");
        }
    }
    let _ = server.kill();
    let _ = server.wait();
}

/// Page `i`'s words on `pass`: text that compresses about 2x, different
/// on every page.
fn text_page(i: usize, pass: u8, page: &mut [u8]) {
    const WORDS: [&[u8]; 16] = [
        b"slot ",
        b"cluster ",
        b"swap ",
        b"extent ",
        b"trunk ",
        b"page ",
        b"the ",
        b"of ",
        b"batch ",
        b"folio ",
        b"fault ",
        b"reclaim ",
        b"budget ",
        b"device ",
        b"zram ",
        b"store ",
    ];
    let mut x = (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ pass as u64;
    let mut at = 0;
    while at < page.len() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let w = WORDS[(x % 16) as usize];
        let n = w.len().min(page.len() - at);
        page[at..at + n].copy_from_slice(&w[..n]);
        // A number now and then, as text has.
        if x.is_multiple_of(5) && at + n < page.len() {
            page[at + n - 1] = b'0' + (x >> 8) as u8 % 10;
        }
        at += n;
    }
}
