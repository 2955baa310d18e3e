//! What the pager's tests share: the patterns they write and check,
//! the swaps they page on (one helper per shape: a RAM device, a RAM
//! device or a swap file, each in either fault mode), and the check that
//! a dropped region gave everything back.

use std::os::fd::AsRawFd;

use super::*;

pub(super) fn fill_byte(page: usize, at: usize, seed: u64) -> u8 {
    let x = (page as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed ^ (at as u64).wrapping_mul(0x2545_f491);
    (x ^ (x >> 29)) as u8
}

/// 4 threads write the pattern of `seed` over every byte of the region.
pub(super) fn fill(region: &mut Region, seed: u64) {
    let chunk = region.len() / 4;
    std::thread::scope(|s| {
        for (t, part) in region.as_mut_slice().chunks_mut(chunk).enumerate() {
            s.spawn(move || {
                for (i, page) in part.chunks_mut(PAGE_SIZE).enumerate() {
                    let p = t * (chunk / PAGE_SIZE) + i;
                    for (at, b) in page.iter_mut().enumerate() {
                        *b = fill_byte(p, at, seed);
                    }
                }
            });
        }
    });
}

/// 4 threads check every byte of the region against the pattern of `seed`.
pub(super) fn verify(region: &Region, seed: u64) {
    let chunk = region.len() / 4;
    std::thread::scope(|s| {
        for (t, part) in region.as_slice().chunks(chunk).enumerate() {
            s.spawn(move || {
                for (i, page) in part.chunks(PAGE_SIZE).enumerate() {
                    let p = t * (chunk / PAGE_SIZE) + i;
                    for (at, b) in page.iter().enumerate() {
                        assert_eq!(*b, fill_byte(p, at, seed), "page {p} byte {at}");
                    }
                }
            });
        }
    });
}

/// 4 threads each increment a counter in every page of their quarter,
/// `rounds` times, reading the page first on odd rounds (so it comes in
/// clean and the write is a write-protect fault racing the reclaimer);
/// then every counter must read `rounds`.
pub(super) fn hammer_counters(region: &mut Region, rounds: u64, what: &str) {
    let chunk = region.len() / 4;
    std::thread::scope(|s| {
        for part in region.as_mut_slice().chunks_mut(chunk) {
            s.spawn(move || {
                for round in 0..rounds {
                    for page in part.chunks_mut(PAGE_SIZE) {
                        if round % 2 == 1 {
                            // SAFETY: a byte of our own page.
                            std::hint::black_box(unsafe { std::ptr::read_volatile(&page[100]) });
                        }
                        // A u64 counter at the start and end of each page.
                        for at in [0, PAGE_SIZE - 8] {
                            let c = u64::from_ne_bytes(page[at..at + 8].try_into().unwrap());
                            page[at..at + 8].copy_from_slice(&(c + 1).to_ne_bytes());
                        }
                    }
                }
            });
        }
    });
    for (p, page) in region.as_slice().chunks(PAGE_SIZE).enumerate() {
        for at in [0, PAGE_SIZE - 8] {
            let c = u64::from_ne_bytes(page[at..at + 8].try_into().unwrap());
            assert_eq!(c, rounds, "{what}: page {p} offset {at} lost writes");
        }
    }
}

/// A file of `len` bytes holding the pattern of `seed` (as `fill` writes
/// it), open for reading, in a directory that lives as long as the
/// returned guard; and the bytes.
pub(super) fn pattern_file(len: usize, seed: u64) -> (tempfile::TempDir, std::fs::File, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let data: Vec<u8> = (0..len)
        .map(|i| fill_byte(i / PAGE_SIZE, i % PAGE_SIZE, seed))
        .collect();
    std::fs::write(&path, &data).unwrap();
    let f = std::fs::File::open(&path).unwrap();
    (dir, f, data)
}

/// An instance of `budget` bytes with a RAM swap device of `ram` bytes,
/// in `mode` (the shape most tests need).
pub(super) fn ram_swap(budget: u64, ram: u64, mode: FaultMode) -> Swap {
    Swap::builder()
        .budget(budget)
        .device(SwapDeviceSpec::ram(ram))
        .fault_mode(mode)
        .build()
        .unwrap()
}

/// Both fault modes, each with a RAM device and with a swap file (true).
pub(super) const MODES_AND_DEVICES: [(FaultMode, bool); 4] = [
    (FaultMode::Sigbus, false),
    (FaultMode::HandlerThread, false),
    (FaultMode::Sigbus, true),
    (FaultMode::HandlerThread, true),
];

/// A 32 MiB swap device: RAM, or a file named after `what` in `dir`.
pub(super) fn ram_or_file(file: bool, dir: &tempfile::TempDir, what: &str) -> SwapDeviceSpec {
    ram_or_file_of(32 * MIB, file, dir, what)
}

/// [`ram_or_file`] of `bytes`.
pub(super) fn ram_or_file_of(bytes: u64, file: bool, dir: &tempfile::TempDir, what: &str) -> SwapDeviceSpec {
    if file {
        SwapDeviceSpec::file(FileOptions::new(
            dir.path().join(format!("swap-{what}")),
            bytes / PAGE_SIZE as u64,
        ))
    } else {
        SwapDeviceSpec::ram(bytes)
    }
}

/// After the last region of `swap` is dropped: every slot is free again
/// (slot caches drained), nothing is resident, and the swap space's
/// invariants hold.
pub(super) fn assert_all_returned(swap: &Swap, what: &str) {
    assert_all_returned_but(swap, 0, what);
}

/// `assert_all_returned`, but for `retired` slots that a write error
/// retired for good.
pub(super) fn assert_all_returned_but(swap: &Swap, retired: u64, what: &str) {
    swap.swap_space().drain_slot_caches();
    assert_eq!(
        swap.free_slots(),
        swap.total_slots() - retired,
        "{what}: region drop returns every slot but {retired} retired"
    );
    assert_eq!(swap.resident_pages(), 0, "{what}: resident count off");
    swap.swap_space().check_invariants().unwrap();
}

/// An instance of `budget` bytes on a 64 MiB device, in `mode`: a swap
/// file in `dir`, or RAM without one.
pub(super) fn swap_64m(budget: u64, file: Option<&tempfile::TempDir>, mode: FaultMode) -> Swap {
    let device = match file {
        Some(dir) => SwapDeviceSpec::file(FileOptions::new(
            dir.path().join("swap"),
            64 * MIB / PAGE_SIZE as u64,
        )),
        None => SwapDeviceSpec::ram(64 * MIB),
    };
    Swap::builder()
        .budget(budget)
        .device(device)
        .fault_mode(mode)
        .build()
        .unwrap()
}

// What the scenario tests (memory, fork, signals, races, limits) share.

/// The byte every page `p` of these tests holds at offset `at`.
pub(super) fn pattern(p: usize, at: usize) -> u8 {
    (p as u8).wrapping_mul(31) ^ (at as u8) ^ 0x5a
}

/// Write `pattern` over pages `pages` of the region at `base`, a word at a
/// time through raw pointers (threads share regions in these tests).
pub(super) fn write_pages(base: *mut u8, pages: std::ops::Range<usize>) {
    for p in pages {
        for at in (0..PAGE_SIZE).step_by(512) {
            // SAFETY: inside a live region the caller owns.
            unsafe { std::ptr::write_volatile(base.add(p * PAGE_SIZE + at), pattern(p, at)) };
        }
    }
}

/// The first page in `pages` whose bytes differ from `pattern`.
pub(super) fn check_pages(base: *const u8, pages: std::ops::Range<usize>) -> Option<(usize, usize, u8)> {
    for p in pages {
        for at in (0..PAGE_SIZE).step_by(512) {
            // SAFETY: inside a live region the caller owns.
            let v = unsafe { std::ptr::read_volatile(base.add(p * PAGE_SIZE + at)) };
            if v != pattern(p, at) {
                return Some((p, at, v));
            }
        }
    }
    None
}

pub(super) fn both_modes() -> [FaultMode; 2] {
    [FaultMode::Sigbus, FaultMode::HandlerThread]
}

pub(super) fn mode_name(m: FaultMode) -> &'static str {
    match m {
        FaultMode::Sigbus => "sigbus",
        FaultMode::HandlerThread => "handler",
    }
}

pub(super) fn mode_from(s: &str) -> FaultMode {
    if s.contains("handler") {
        FaultMode::HandlerThread
    } else {
        FaultMode::Sigbus
    }
}

pub(super) fn madvise(addr: *mut u8, len: usize, advice: i32) {
    // SAFETY: advice on memory of a region the test owns.
    let rc = unsafe { libc::madvise(addr.cast(), len, advice) };
    assert_eq!(rc, 0, "madvise {advice}: {}", std::io::Error::last_os_error());
}

/// A file of one page of `byte`, for reads into pinned buffers.
pub(super) fn page_file(dir: &tempfile::TempDir, byte: u8) -> std::fs::File {
    let path = dir.path().join("page");
    std::fs::write(&path, vec![byte; PAGE_SIZE]).unwrap();
    std::fs::File::open(path).unwrap()
}

/// Pin the page at `addr` the way a program doing DMA does: register it
/// as an io_uring fixed buffer (a long-term `FOLL_PIN`).  The page is
/// written just before, so it is present and writable; if the reclaimer
/// takes it in between, try again.
pub(super) fn pin_page(ring: &io_uring::IoUring, addr: *mut u8) {
    for _ in 0..1000 {
        // SAFETY: a byte of a live region page the caller owns.
        unsafe { std::ptr::write_volatile(addr, std::ptr::read_volatile(addr)) };
        let iov = libc::iovec {
            iov_base: addr.cast(),
            iov_len: PAGE_SIZE,
        };
        // SAFETY: the buffer stays mapped until it is unregistered.
        match unsafe { ring.submitter().register_buffers(&[iov]) } {
            Ok(()) => return,
            Err(e) if e.raw_os_error() == Some(libc::EFAULT) => continue,
            Err(e) => panic!("register_buffers: {e}"),
        }
    }
    panic!("could not pin the page");
}

/// Read one page of `file` into fixed buffer 0 (at `addr`), as a device
/// would by DMA: the kernel writes the pinned page, whatever maps it now.
pub(super) fn read_fixed(ring: &mut io_uring::IoUring, file: &std::fs::File, addr: *mut u8) {
    let e =
        io_uring::opcode::ReadFixed::new(io_uring::types::Fd(file.as_raw_fd()), addr, PAGE_SIZE as u32, 0)
            .offset(0)
            .build();
    // SAFETY: the buffer is registered and outlives the operation.
    unsafe { ring.submission().push(&e).unwrap() };
    ring.submit_and_wait(1).unwrap();
    let cqe = ring.completion().next().unwrap();
    assert_eq!(cqe.result(), PAGE_SIZE as i32, "READ_FIXED");
}

/// Wait for the last fault's transition to end.  In handler-thread mode
/// the ioctl that resolves a fault wakes the faulting thread before the
/// handler thread publishes the page's state and counts it: a test that
/// reads the counters or the states once its own threads are done waits
/// here first.
pub(super) fn settle(region: &Region) {
    settle_span(region, 0..region.len() / PAGE_SIZE);
}

/// [`settle`] for the region's pages `pages`.  A reclaimer at work may
/// claim them meanwhile; its claims end too.
pub(super) fn settle_span(region: &Region, pages: std::ops::Range<usize>) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let states = &region.inner.states()[region.id_base as usize..];
    while pages.clone().any(|p| states[p].load().is_busy()) {
        assert!(
            std::time::Instant::now() < deadline,
            "a page stayed claimed for 10 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}
