use super::backing::{Access, Backing};
use super::*;
use crate::extent::{ExtentError, ExtentMapKind};
use crate::stats::Registry;
use crate::PAGE_SIZE;
use std::io;

const PAGE: u64 = PAGE_SIZE as u64;
use std::alloc::{alloc_zeroed, dealloc, handle_alloc_error, Layout};
use std::fs::File;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::ptr::NonNull;

/// A zeroed buffer of whole pages, 4096-byte aligned as O_DIRECT needs.
struct AlignedBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl AlignedBuf {
    fn new(pages: usize) -> AlignedBuf {
        let layout = Layout::from_size_align(pages * PAGE_SIZE, PAGE_SIZE).unwrap();
        assert!(layout.size() > 0);
        // SAFETY: the layout has a nonzero size.
        let p = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(p).unwrap_or_else(|| handle_alloc_error(layout));
        AlignedBuf { ptr, layout }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` is a live, initialised (zeroed) allocation of
        // `layout.size()` bytes that we own.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes it exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated by `alloc_zeroed` with this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// The word `w` of the page that generation `gen` writes to `slot`:
/// distinct per slot, generation and position, never zero.
fn word(slot: u64, gen: u64, w: u64) -> u64 {
    ((slot << 40) ^ (gen << 16) ^ w ^ 0x9E37_79B9_7F4A_7C15).wrapping_mul(0xBF58_476D_1CE4_E5B9) | 1
}

/// Fill `buf` with the pages generation `gen` writes to slots from
/// `first`.
fn fill(buf: &mut [u8], first: u64, gen: u64) {
    for (p, page) in buf.chunks_exact_mut(PAGE_SIZE).enumerate() {
        for (w, b) in page.chunks_exact_mut(8).enumerate() {
            b.copy_from_slice(&word(first + p as u64, gen, w as u64).to_le_bytes());
        }
    }
}

/// Check `buf`, read from slots from `first`, against the model: the
/// generation last written to each slot, or zeros if none.
fn verify(buf: &[u8], first: u64, model: &[Option<u64>]) {
    for (p, page) in buf.chunks_exact(PAGE_SIZE).enumerate() {
        let slot = first + p as u64;
        match model[slot as usize] {
            None => assert!(page.iter().all(|&b| b == 0), "slot {slot} should read zeros"),
            Some(gen) => {
                for (w, b) in page.chunks_exact(8).enumerate() {
                    let got = u64::from_le_bytes(b.try_into().unwrap());
                    assert_eq!(got, word(slot, gen, w as u64), "slot {slot} gen {gen} word {w}");
                }
            }
        }
    }
}

/// Write zeros over every slot of an encrypted device, whose never
/// written slots cannot be read (no seal), so that the shared tests'
/// model (a fresh device reads zeros) holds for it too.
fn zero_if_sealed(dev: &IoDevice) {
    if !dev.encrypts() {
        return;
    }
    let zeros = AlignedBuf::new(64);
    let mut slot = 0;
    while slot < dev.slots() {
        let n = (dev.slots() - slot).min(64) as usize;
        dev.write(slot, &zeros[..n * PAGE_SIZE]).unwrap();
        slot += n as u64;
    }
}

fn counter(reg: &Registry, name: &str) -> u64 {
    reg.snapshot()
        .counters
        .iter()
        .find(|&(n, _)| n == name)
        .expect("a counter of that name")
        .1
}

/// Zeros everywhere, then single pages and runs of several sizes,
/// rewrites, and every slot checked against the model.
/// Returns the model: the generation last written to each slot.
fn round_trip(dev: &IoDevice, reg: &Registry) -> Vec<Option<u64>> {
    let slots = dev.slots();
    assert!(slots >= 600);
    let mut model = vec![None; slots as usize];
    let mut buf = AlignedBuf::new(130);
    zero_if_sealed(dev);
    let writes_before = counter(reg, "io_write_pages");
    // A fresh device reads zeros, in runs and pages.
    dev.read(0, &mut buf[..128 * PAGE_SIZE]).unwrap();
    verify(&buf[..128 * PAGE_SIZE], 0, &model);
    for slot in 128..slots {
        dev.read(slot, &mut buf[..PAGE_SIZE]).unwrap();
        verify(&buf[..PAGE_SIZE], slot, &model);
    }
    let mut written = 0;
    let mut gen = 0;
    // Single pages.
    for slot in (1..300).step_by(3) {
        gen += 1;
        fill(&mut buf[..PAGE_SIZE], slot, gen);
        dev.write(slot, &buf[..PAGE_SIZE]).unwrap();
        model[slot as usize] = Some(gen);
        written += 1;
    }
    // Runs, some over pages written above, one ending at the last slot.
    for (first, n) in [(300, 16), (400, 129), (590, 10), (2, 7), (150, 2), (440, 3)] {
        gen += 1;
        let n = n.min(130) as usize;
        let first = first.min(slots - n as u64);
        fill(&mut buf[..n * PAGE_SIZE], first, gen);
        dev.write(first, &buf[..n * PAGE_SIZE]).unwrap();
        for s in first..first + n as u64 {
            model[s as usize] = Some(gen);
        }
        written += n as u64;
    }
    assert_eq!(counter(reg, "io_write_pages") - writes_before, written);
    // Everything back, page by page and in runs crossing written and
    // unwritten slots.
    for slot in 0..slots {
        buf[..PAGE_SIZE].fill(0xEE);
        dev.read(slot, &mut buf[..PAGE_SIZE]).unwrap();
        verify(&buf[..PAGE_SIZE], slot, &model);
    }
    let mut first = 0;
    while first < slots {
        let n = (slots - first).min(97) as usize;
        dev.read(first, &mut buf[..n * PAGE_SIZE]).unwrap();
        verify(&buf[..n * PAGE_SIZE], first, &model);
        first += n as u64;
    }
    assert_eq!(
        counter(reg, "io_write_errors") + counter(reg, "io_read_errors"),
        0
    );
    assert!(counter(reg, "io_read_pages") >= 2 * slots);
    model
}

#[test]
fn ram_round_trip() {
    let reg = Registry::new();
    let dev = IoDevice::ram(640, &reg).unwrap();
    assert_eq!(dev.kind(), BackendKind::Ram);
    assert_eq!(dev.slots(), 640);
    assert!(dev.extent_map().is_none());
    round_trip(&dev, &reg);
}

#[test]
fn file_round_trip_direct() {
    let dir = tempfile::tempdir().unwrap();
    for (kind, encrypt) in [
        (ExtentMapKind::Tree, false),
        (ExtentMapKind::List, false),
        (ExtentMapKind::Tree, true),
    ] {
        let reg = Registry::new();
        // A file of the user's (a created one has no name to read back).
        let path = dir.path().join(format!("swap-{kind:?}-{encrypt}"));
        private_file(&path, &vec![0u8; 640 * PAGE_SIZE]);
        let opts = FileOptions::new(&path, 640).extent_kind(kind).encrypt(encrypt);
        let dev = IoDevice::file(&opts, &reg).unwrap();
        assert_eq!(dev.encrypts(), encrypt);
        assert_eq!(dev.kind(), BackendKind::File);
        assert_eq!(dev.slots(), 640);
        let map = dev.extent_map().unwrap();
        assert_eq!((map.kind(), map.len(), map.slots()), (kind, 1, 640));
        let model = round_trip(&dev, &reg);
        // The file has the data too, where the slots say, or (encrypted)
        // none of it.
        drop(dev);
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len(), 640 * PAGE_SIZE);
        if encrypt {
            let mut plain = vec![0u8; 640 * PAGE_SIZE];
            for (slot, gen) in model.iter().enumerate() {
                if let Some(g) = gen {
                    fill(
                        &mut plain[slot * PAGE_SIZE..(slot + 1) * PAGE_SIZE],
                        slot as u64,
                        *g,
                    );
                }
            }
            let written: Vec<u8> = plain
                .chunks_exact(PAGE_SIZE)
                .filter(|p| p.iter().any(|&b| b != 0))
                .flatten()
                .copied()
                .collect();
            assert!(!written.is_empty() && !holds_plaintext(&bytes, &written));
        } else {
            verify(&bytes, 0, &model);
        }
    }
}

#[test]
fn zero_slots_refused() {
    let reg = Registry::new();
    assert!(matches!(IoDevice::ram(0, &reg), Err(IoError::ZeroSize)));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("swap");
    let e = IoDevice::file(&FileOptions::new(&path, 0), &reg).unwrap_err();
    assert!(matches!(e, IoError::ZeroSize), "{e}");
    assert!(!path.exists());
}

/// The open files of this process whose link in /proc/self/fd names a
/// deleted file in `dir` (an `O_TMPFILE` file, or one unlinked at once).
fn unnamed_files_in(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path()).is_ok_and(|t| {
                let t = t.to_string_lossy().into_owned();
                t.starts_with(&*dir.to_string_lossy()) && t.ends_with("(deleted)")
            })
        })
        .map(|e| e.path())
        .collect()
}

/// A path that does not exist gets a private file: no name in the
/// directory while it lives or after (`O_TMPFILE`), mode 0600, all its
/// blocks allocated, and FIEMAP accepts them.
#[test]
fn created_file_is_private_and_preallocated() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("swap");
    let reg = Registry::new();
    let dev = IoDevice::file(&FileOptions::new(&path, 1000), &reg).unwrap();
    assert!(!path.exists(), "the swap file has a name");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    let open = unnamed_files_in(dir.path());
    assert_eq!(open.len(), 1, "{open:?}");
    let meta = std::fs::metadata(&open[0]).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o600);
    assert_eq!(meta.len(), 1000 * PAGE);
    assert!(
        meta.blocks() * 512 >= 1000 * PAGE,
        "{} blocks: not preallocated",
        meta.blocks()
    );
    round_trip(&dev, &reg);
    drop(dev);
    assert!(unnamed_files_in(dir.path()).is_empty(), "still open");
    // Preallocated blocks are whole extents FIEMAP accepts.
    let dev = IoDevice::file(&FileOptions::new(&path, 1000).fiemap(true), &reg).unwrap();
    assert!(dev.extent_map().unwrap().slots() >= 1000);
    drop(dev);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    // A file in a directory that does not exist cannot be created.
    let bad = dir.path().join("no/such/dir/swap");
    let e = IoDevice::file(&FileOptions::new(&bad, 10), &reg).unwrap_err();
    assert!(matches!(e, IoError::Open { .. } | IoError::Create { .. }), "{e}");
    assert!(e.to_string().contains(&*bad.to_string_lossy()), "{e}");
    // A dangling symbolic link is not a name to create a file through.
    let link = dir.path().join("dangling");
    std::os::unix::fs::symlink(dir.path().join("elsewhere"), &link).unwrap();
    let e = IoDevice::file(&FileOptions::new(&link, 10), &reg).unwrap_err();
    assert!(matches!(e, IoError::Symlink { .. }), "{e}");
    assert!(!dir.path().join("elsewhere").exists());
}

/// Write `bytes` to a new file at `path`, mode 0600: a file a swap device
/// may use (its owner's alone).
fn private_file(path: &std::path::Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

#[test]
fn existing_file_too_small() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("swap");
    private_file(&path, &vec![7u8; 10 * PAGE_SIZE]);
    let reg = Registry::new();
    let e = IoDevice::file(&FileOptions::new(&path, 11), &reg).unwrap_err();
    assert!(
        matches!(e, IoError::TooSmall { have, need, .. } if have == 10 * PAGE && need == 11 * PAGE),
        "{e}"
    );
    let msg = e.to_string();
    for want in [
        &*path.to_string_lossy(),
        &(10 * PAGE).to_string(),
        &(11 * PAGE).to_string(),
        "fallocate",
    ] {
        assert!(msg.contains(want), "{msg} lacks {want}");
    }
    // Left alone.
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 10 * PAGE);
    // A directory gets a file of its own in it, with no name: nothing new
    // is listed there.
    let d = IoDevice::file(&FileOptions::new(dir.path(), 4), &reg).unwrap();
    let mut page = AlignedBuf::new(1);
    page.fill(9);
    d.write(0, &page).unwrap();
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    drop(d);
    // A character device will not do.
    let e = IoDevice::file(&FileOptions::new("/dev/null", 1), &reg).unwrap_err();
    assert!(
        matches!(e, IoError::Extent(ExtentError::NotSwappable { .. })),
        "{e}"
    );
}

#[test]
fn existing_file_used_as_is() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("swap");
    std::fs::write(&path, vec![0xA5u8; 20 * PAGE_SIZE]).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let reg = Registry::new();
    // Plaintext, so that its bytes are the slots' contents.
    let dev = IoDevice::file(&FileOptions::new(&path, 10).encrypt(false), &reg).unwrap();
    assert_eq!(dev.slots(), 10);
    let mut buf = AlignedBuf::new(10);
    dev.read(0, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0xA5));
    fill(&mut buf[..PAGE_SIZE], 9, 1);
    dev.write(9, &buf[..PAGE_SIZE]).unwrap();
    drop(dev);
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.len(), 20 * PAGE, "truncated");
    assert_eq!(meta.mode() & 0o777, 0o600, "chmodded");
    let bytes = std::fs::read(&path).unwrap();
    assert!(bytes[..9 * PAGE_SIZE].iter().all(|&b| b == 0xA5));
    assert_eq!(&bytes[9 * PAGE_SIZE..10 * PAGE_SIZE], &buf[..PAGE_SIZE]);
    assert!(bytes[10 * PAGE_SIZE..].iter().all(|&b| b == 0xA5));
}

#[test]
fn fiemap_fragmented_runs_span_extents() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    let b = dir.path().join("b");
    // Grow two files in alternate 4 KiB chunks, syncing each, so the
    // filesystem interleaves their blocks.
    const CHUNKS: u64 = 512;
    {
        let mut fa = File::create(&a).unwrap();
        let mut fb = File::create(&b).unwrap();
        for p in [&a, &b] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        let chunk = vec![0u8; PAGE_SIZE];
        for _ in 0..CHUNKS {
            for f in [&mut fa, &mut fb] {
                f.write_all(&chunk).unwrap();
                f.sync_all().unwrap();
            }
        }
    }
    for kind in [ExtentMapKind::Tree, ExtentMapKind::List] {
        let reg = Registry::new();
        // Plaintext: the file's bytes are checked at their offsets below.
        let opts = FileOptions::new(&a, CHUNKS)
            .fiemap(true)
            .extent_kind(kind)
            .encrypt(false);
        let dev = match IoDevice::file(&opts, &reg) {
            Ok(dev) => dev,
            Err(e @ IoError::Extent(ExtentError::FiemapUnsupported { .. })) => {
                eprintln!("FIEMAP unsupported here: {e}");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let map = dev.extent_map().unwrap();
        assert_eq!(map.slots(), CHUNKS);
        let boundaries: Vec<u64> = map.extents().map(|e| e.start_slot).filter(|&s| s > 0).collect();
        eprintln!("{kind:?}: fragmented file maps to {} extents", map.len());
        let mut model = vec![None; CHUNKS as usize];
        let mut buf = AlignedBuf::new(64);
        let mut gen = 0;
        // Runs across every boundary (capped), and long runs across many.
        let mut runs: Vec<(u64, u64)> = boundaries
            .iter()
            .take(200)
            .map(|&s| (s.saturating_sub(2), 5))
            .collect();
        runs.extend([(0, 64), (100, 64), (CHUNKS - 64, 64), (33, 17)]);
        for (first, n) in runs {
            let n = n.min(CHUNKS - first);
            gen += 1;
            let bytes = n as usize * PAGE_SIZE;
            fill(&mut buf[..bytes], first, gen);
            dev.write(first, &buf[..bytes]).unwrap();
            for s in first..first + n {
                model[s as usize] = Some(gen);
            }
        }
        // Model says zeros for slots never written: the file is zeros.
        let mut first = 0;
        while first < CHUNKS {
            let n = (CHUNKS - first).min(61);
            let bytes = n as usize * PAGE_SIZE;
            dev.read(first, &mut buf[..bytes]).unwrap();
            verify(&buf[..bytes], first, &model);
            first += n;
        }
        // And the file holds them at their logical offsets.
        drop(dev);
        let bytes = std::fs::read(&a).unwrap();
        verify(&bytes, 0, &model);
    }
}

/// Two backings: runs crossing from one to the other are split and land
/// in the right file at the right place.
#[test]
fn runs_split_across_backings() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    let b = dir.path().join("b");
    private_file(&a, &vec![0u8; 5 * PAGE_SIZE]);
    private_file(&b, &vec![0u8; 9 * PAGE_SIZE]);
    let reg = Registry::new();
    let backings = vec![
        Backing::open(&a, Access::ReadWrite { direct: true }).unwrap(),
        Backing::open(&b, Access::ReadWrite { direct: true }).unwrap(),
    ];
    // Slots 0..5 are a's pages, 5..14 b's.
    let sources = [
        ExtentSource::Whole {
            path: a.clone(),
            len: None,
        },
        ExtentSource::Whole {
            path: b.clone(),
            len: None,
        },
    ];
    // Plaintext: the files' bytes are checked below.
    let dev = IoDevice::from_backings(14, backings, &sources, ExtentMapKind::Tree, false, vec![None, None], &reg).unwrap();
    assert_eq!(dev.extent_map().unwrap().len(), 2);
    let mut model = vec![None; 14];
    let mut buf = AlignedBuf::new(14);
    fill(&mut buf[..14 * PAGE_SIZE], 0, 1);
    dev.write(0, &buf).unwrap();
    model.iter_mut().for_each(|m| *m = Some(1));
    fill(&mut buf[..4 * PAGE_SIZE], 3, 2);
    dev.write(3, &buf[..4 * PAGE_SIZE]).unwrap();
    model[3..7].iter_mut().for_each(|m| *m = Some(2));
    dev.read(0, &mut buf).unwrap();
    verify(&buf, 0, &model);
    dev.read(4, &mut buf[..2 * PAGE_SIZE]).unwrap();
    verify(&buf[..2 * PAGE_SIZE], 4, &model);
    drop(dev);
    let fa = std::fs::read(&a).unwrap();
    let fb = std::fs::read(&b).unwrap();
    verify(&fa, 0, &model[..5]);
    // b's page i is slot 5 + i.
    let mut expect_b = vec![None; 5];
    expect_b.extend_from_slice(&model[5..]);
    let mut b_as_slots = vec![0u8; 5 * PAGE_SIZE];
    b_as_slots.extend_from_slice(&fb);
    verify(&b_as_slots[5 * PAGE_SIZE..], 5, &expect_b);
}

#[test]
fn unaligned_buffers_and_ranges() {
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::new();
    let file = IoDevice::file(&FileOptions::new(dir.path().join("swap"), 16), &reg).unwrap();
    let buffered = IoDevice::file(
        &FileOptions::new(dir.path().join("swap2"), 16).direct(false),
        &reg,
    )
    .unwrap();
    let ram = IoDevice::ram(16, &reg).unwrap();
    let mut buf = AlignedBuf::new(3);
    for dev in [&file, &buffered] {
        // Misaligned address.
        let e = dev.write(1, &buf[8..8 + PAGE_SIZE]).unwrap_err();
        assert!(matches!(e, IoError::Unaligned { .. }), "{e}");
        assert!(e.to_string().contains("aligned"), "{e}");
        let e = dev.read(1, &mut buf[512..512 + PAGE_SIZE]).unwrap_err();
        assert!(matches!(e, IoError::Unaligned { .. }), "{e}");
    }
    for dev in [&file, &buffered, &ram] {
        // Lengths that are not whole pages, or nothing.
        for len in [0, 100, PAGE_SIZE + 512] {
            let e = dev.write(1, &buf[..len]).unwrap_err();
            assert!(matches!(e, IoError::Unaligned { .. }), "{e}");
            let e = dev.read(1, &mut buf[..len]).unwrap_err();
            assert!(matches!(e, IoError::Unaligned { .. }), "{e}");
        }
        // Past the end, including offsets that overflow.
        let e = dev.write(15, &buf[..2 * PAGE_SIZE]).unwrap_err();
        assert!(
            matches!(
                e,
                IoError::Range {
                    offset: 15,
                    pages: 2,
                    slots: 16
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("16 slots"), "{e}");
        let e = dev.read(16, &mut buf[..PAGE_SIZE]).unwrap_err();
        assert!(matches!(e, IoError::Range { .. }), "{e}");
        let e = dev.read(u64::MAX, &mut buf[..PAGE_SIZE]).unwrap_err();
        assert!(matches!(e, IoError::Range { .. }), "{e}");
        // The last slot is fine.
        dev.write(15, &buf[..PAGE_SIZE]).unwrap();
    }
    assert_eq!(
        counter(&reg, "io_write_errors") + counter(&reg, "io_read_errors"),
        0
    );
    // RAM takes any buffer.
    let mut v = vec![0u8; 2 * PAGE_SIZE + 3];
    fill(&mut v[3..], 4, 9);
    ram.write(4, &v[3..]).unwrap();
    let mut back = vec![0u8; 2 * PAGE_SIZE + 5];
    ram.read(4, &mut back[5..]).unwrap();
    let mut model = vec![None; 16];
    model[4] = Some(9);
    model[5] = Some(9);
    verify(&back[5..], 4, &model);
}

/// In `dir`, on a filesystem that refuses O_DIRECT: the error says so
/// and what to do, a file the call created is removed, an existing one
/// left alone, and buffered IO works.
fn check_direct_unsupported(dir: &Path) {
    let reg = Registry::new();
    let path = dir.join("swap");
    let e = IoDevice::file(&FileOptions::new(&path, 64), &reg).unwrap_err();
    assert!(matches!(e, IoError::DirectUnsupported { .. }), "{e}");
    let msg = e.to_string();
    for want in [
        &*path.to_string_lossy(),
        "does not support O_DIRECT",
        "direct(false)",
    ] {
        assert!(msg.contains(want), "{msg} lacks {want}");
    }
    assert!(!path.exists(), "the file this call created is left behind");
    std::fs::write(&path, vec![1u8; 64 * PAGE_SIZE]).unwrap();
    let e = IoDevice::file(&FileOptions::new(&path, 64), &reg).unwrap_err();
    assert!(matches!(e, IoError::DirectUnsupported { .. }), "{e}");
    assert_eq!(std::fs::read(&path).unwrap(), vec![1u8; 64 * PAGE_SIZE]);
    std::fs::remove_file(&path).unwrap();
    let dev = IoDevice::file(&FileOptions::new(&path, 640).direct(false), &reg).unwrap();
    assert!(!path.exists(), "a created swap file has no name");
    round_trip(&dev, &reg);
}

/// tmpfs refused O_DIRECT until Linux 6.6 and accepts it since; either
/// way the device must do what the kernel allows and say why not.
#[test]
fn direct_on_tmpfs_follows_the_kernel() {
    let Some(dir) = super::backing::tests::tmpfs_tempdir() else {
        return;
    };
    let probe = dir.path().join("probe");
    std::fs::write(&probe, b"").unwrap();
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&probe)
    {
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            eprintln!("tmpfs refuses O_DIRECT here");
            check_direct_unsupported(dir.path());
        }
        Err(e) => panic!("{e}"),
        Ok(_) => {
            eprintln!("tmpfs accepts O_DIRECT here (Linux >= 6.6)");
            let reg = Registry::new();
            let dev = IoDevice::file(&FileOptions::new(dir.path().join("swap"), 640), &reg).unwrap();
            round_trip(&dev, &reg);
            let reg = Registry::new();
            let opts = FileOptions::new(dir.path().join("swap2"), 640).direct(false);
            round_trip(&IoDevice::file(&opts, &reg).unwrap(), &reg);
        }
    }
}

/// ramfs has never supported O_DIRECT (and creates the file before
/// refusing the open).  Mount one where only a helper thread sees it:
/// the thread unshares its mount namespace, makes every mount in it
/// private so nothing propagates back, and mounts ramfs over a
/// temporary directory; the namespace dies with the thread.  Needs
/// CAP_SYS_ADMIN; skipped without.
#[test]
fn direct_unsupported_on_ramfs() {
    use std::ffi::CString;
    let dir = tempfile::tempdir().unwrap();
    let target = CString::new(dir.path().as_os_str().as_encoded_bytes()).unwrap();
    let dir_path = dir.path().to_path_buf();
    std::thread::spawn(move || {
        // SAFETY: unshare has no memory-safety preconditions; it gives
        // this thread (only) its own fs_struct and mount namespace.
        if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
            eprintln!(
                "cannot unshare the mount namespace ({}); skipping",
                io::Error::last_os_error()
            );
            return;
        }
        // SAFETY: the strings are NUL-terminated and outlive the calls;
        // null source, type and data are allowed for MS_PRIVATE.
        let rc = unsafe {
            libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            )
        };
        assert_eq!(rc, 0, "make mounts private: {}", io::Error::last_os_error());
        // SAFETY: as above; ramfs takes no data.
        let rc = unsafe {
            libc::mount(
                c"uswap-test".as_ptr(),
                target.as_ptr(),
                c"ramfs".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if rc != 0 {
            eprintln!("cannot mount ramfs ({}); skipping", io::Error::last_os_error());
            return;
        }
        check_direct_unsupported(&dir_path);
        // SAFETY: as above.
        unsafe { libc::umount2(target.as_ptr(), 0) };
    })
    .join()
    .unwrap();
}

fn injected_errors(dev: &IoDevice, reg: &Registry) {
    use std::error::Error as _;
    zero_if_sealed(dev);
    let mut buf = AlignedBuf::new(4);
    fill(&mut buf[..PAGE_SIZE], 5, 1);
    dev.write(5, &buf[..PAGE_SIZE]).unwrap();
    let pages_before = counter(reg, "io_write_pages");
    // A write covering the armed slot fails, naming it.
    dev.inject_error(7, IoOp::Write);
    // One not covering it does not, and leaves it armed.
    dev.write(8, &buf[..PAGE_SIZE]).unwrap();
    dev.read(6, &mut buf[..2 * PAGE_SIZE]).unwrap();
    fill(&mut buf[..3 * PAGE_SIZE], 6, 2);
    let e = dev.write(6, &buf[..3 * PAGE_SIZE]).unwrap_err();
    assert!(matches!(e, IoError::Write { offset: 7, .. }), "{e}");
    assert!(e.to_string().contains("slot 7"), "{e}");
    assert_eq!(
        e.source()
            .and_then(|s| s.downcast_ref::<io::Error>())
            .and_then(|s| s.raw_os_error()),
        Some(libc::EIO)
    );
    assert_eq!(counter(reg, "io_write_errors"), 1);
    assert_eq!(counter(reg, "io_write_pages"), pages_before + 1);
    // One-shot: the same write now succeeds.
    dev.write(6, &buf[..3 * PAGE_SIZE]).unwrap();
    assert_eq!(counter(reg, "io_write_errors"), 1);
    assert_eq!(counter(reg, "io_write_pages"), pages_before + 4);

    let reads_before = counter(reg, "io_read_pages");
    dev.inject_error(5, IoOp::Read);
    dev.write(5, &buf[..PAGE_SIZE]).unwrap(); // writes are not armed
    let e = dev.read(5, &mut buf[..PAGE_SIZE]).unwrap_err();
    assert!(matches!(e, IoError::Read { offset: 5, .. }), "{e}");
    assert!(e.to_string().contains("slot 5"), "{e}");
    assert_eq!(counter(reg, "io_read_errors"), 1);
    assert_eq!(counter(reg, "io_read_pages"), reads_before);
    // The read after succeeds.  Slot 5 holds what was last written
    // there: buf's first page, filled for slot 6 (generation 2).
    let mut expect = AlignedBuf::new(1);
    fill(&mut expect, 6, 2);
    dev.read(5, &mut buf[..PAGE_SIZE]).unwrap();
    assert_eq!(&buf[..PAGE_SIZE], &expect[..]);
    let mut model = vec![None; dev.slots() as usize];
    model[6] = Some(2);
    model[7] = Some(2);
    model[8] = Some(2);
    dev.read(6, &mut buf[..3 * PAGE_SIZE]).unwrap();
    verify(&buf[..3 * PAGE_SIZE], 6, &model);
    assert_eq!(counter(reg, "io_read_errors"), 1);
    assert_eq!(counter(reg, "io_read_pages"), reads_before + 4);
}

#[test]
fn inject_error_is_one_shot_and_counted() {
    let reg = Registry::new();
    injected_errors(&IoDevice::ram(32, &reg).unwrap(), &reg);
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::new();
    injected_errors(
        &IoDevice::file(&FileOptions::new(dir.path().join("swap"), 32), &reg).unwrap(),
        &reg,
    );
}

/// 8 threads, each owning 256 slots, write, read back and verify 5,000
/// pages each, in single pages and runs of 4.
fn concurrent(dev: &IoDevice, reg: &Registry) {
    const THREADS: u64 = 8;
    const OWN: u64 = 256;
    const OPS: u64 = 5_000;
    assert!(dev.slots() > THREADS * OWN);
    zero_if_sealed(dev);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            s.spawn(move || {
                let base = 1 + t * OWN;
                let mut model = vec![None; dev.slots() as usize];
                let mut buf = AlignedBuf::new(4);
                let mut x = 0x2545_F491_4F6C_DD1Du64 ^ (t + 1);
                let mut pages = 0;
                let mut gen = 0;
                while pages < OPS {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let n = if x.is_multiple_of(5) { 4 } else { 1 };
                    let first = base + (x >> 8) % (OWN - n + 1);
                    let bytes = n as usize * PAGE_SIZE;
                    gen += 1;
                    fill(&mut buf[..bytes], first, gen);
                    dev.write(first, &buf[..bytes]).unwrap();
                    for s in first..first + n {
                        model[s as usize] = Some(gen);
                    }
                    // Read back this run and one other owned slot.
                    buf[..bytes].fill(0);
                    dev.read(first, &mut buf[..bytes]).unwrap();
                    verify(&buf[..bytes], first, &model);
                    let other = base + (x >> 24) % OWN;
                    dev.read(other, &mut buf[..PAGE_SIZE]).unwrap();
                    verify(&buf[..PAGE_SIZE], other, &model);
                    pages += n;
                }
                for slot in base..base + OWN {
                    dev.read(slot, &mut buf[..PAGE_SIZE]).unwrap();
                    verify(&buf[..PAGE_SIZE], slot, &model);
                }
            });
        }
    });
    assert!(counter(reg, "io_write_pages") >= THREADS * OPS);
    assert_eq!(
        counter(reg, "io_write_errors") + counter(reg, "io_read_errors"),
        0
    );
}

#[test]
fn concurrent_disjoint_slots_ram() {
    let reg = Registry::new();
    concurrent(&IoDevice::ram(2049, &reg).unwrap(), &reg);
}

#[test]
fn concurrent_disjoint_slots_file() {
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::new();
    concurrent(
        &IoDevice::file(&FileOptions::new(dir.path().join("swap"), 2049), &reg).unwrap(),
        &reg,
    );
}

#[test]
fn device_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<IoDevice>();
    let reg = Registry::new();
    let dev = IoDevice::ram(4, &reg).unwrap();
    assert!(format!("{dev:?}").contains("Ram"));
}

/// Jobs written through an io_uring in flight together read back as
/// written; a job whose write is refused (an injected EIO) or comes back
/// short is reported as not written, and the others are not disturbed;
/// RAM jobs are written in the call.
/// One write job per buffer, to `dev` from slot `firsts[i]`.
fn jobs_for<'a>(dev: &'a IoDevice, bufs: &'a [AlignedBuf], firsts: &[u64]) -> Vec<Option<WriteJob<'a>>> {
    bufs.iter()
        .zip(firsts)
        .map(|(b, &offset)| {
            Some(WriteJob {
                device: dev,
                offset,
                buf: b,
            })
        })
        .collect()
}

#[test]
fn write_ring_writes_jobs_and_reports_each_failure() {
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::new();
    let dev = IoDevice::file(&FileOptions::new(dir.path().join("swap"), 256), &reg).unwrap();
    let ram = IoDevice::ram(256, &reg).unwrap();
    let mut ring = WriteRing::new().unwrap();
    let mut bufs: Vec<AlignedBuf> = [3usize, 16, 1, 8].iter().map(|&n| AlignedBuf::new(n)).collect();
    let firsts = [0u64, 10, 40, 100];
    let write = |ring: &mut WriteRing, bufs: &mut [AlignedBuf], gen: u64, ram_too: bool| {
        for (b, &first) in bufs.iter_mut().zip(&firsts) {
            fill(b, first, gen);
        }
        let mut jobs = jobs_for(&dev, bufs, &firsts);
        if ram_too {
            jobs.push(Some(WriteJob {
                device: &ram,
                offset: 7,
                buf: &bufs[1],
            }));
        }
        jobs.push(None);
        let mut ok = vec![false; jobs.len()];
        ring.write_batch(&jobs, &mut ok);
        ok
    };
    let read_back = |gen: u64, which: &[bool]| {
        let model = vec![Some(gen); 256];
        for ((&n, &first), &expect) in [3usize, 16, 1, 8].iter().zip(&firsts).zip(which) {
            let mut got = AlignedBuf::new(n);
            let read = dev.read(first, &mut got);
            if expect {
                read.unwrap();
                verify(&got, first, &model);
            } else {
                // Not all of it is this generation's: on an encrypted
                // device, a block not written fails its check.
                assert!(
                    read.is_err() || std::panic::catch_unwind(|| verify(&got, first, &model)).is_err(),
                    "slots from {first}: a write reported failed wrote everything"
                );
            }
        }
    };
    let writes = counter(&reg, "io_writes");
    let ok = write(&mut ring, &mut bufs, 1, true);
    assert_eq!(ok, [true, true, true, true, true, false]);
    read_back(1, &[true; 4]);
    assert_eq!(
        counter(&reg, "io_writes") - writes,
        5,
        "four file writes and one RAM write counted"
    );

    // An EIO armed for slot 12 (inside the second job).
    dev.inject_error(12, IoOp::Write);
    let ok = write(&mut ring, &mut bufs, 2, false);
    assert_eq!(ok, [true, false, true, true, false]);
    read_back(2, &[true, false, true, true]);

    // A short write: the first piece queued writes half.
    dev.inject_short_writes(1);
    let ok = write(&mut ring, &mut bufs, 3, false);
    assert_eq!(ok, [false, true, true, true, false]);
    read_back(3, &[false, true, true, true]);
}

/// An existing path is used only if it is this process's alone: not a
/// symbolic link, owned by this user, mode 0600, not sparse, and not held
/// by another device.  Each refusal is one line that names the
/// path and says what to do; nothing is changed.
#[test]
fn existing_files_that_others_could_reach_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::new();
    let good = dir.path().join("good");
    private_file(&good, &vec![0u8; 8 * PAGE_SIZE]);
    let refused = |path: &std::path::Path, says: &str| {
        let e = IoDevice::file(&FileOptions::new(path, 8), &reg).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains(says) && msg.contains(&*path.to_string_lossy()),
            "{says}: {msg}"
        );
        assert!(!msg.contains('\n'), "{msg}");
        e
    };
    // A symbolic link, even to a good file.
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&good, &link).unwrap();
    assert!(matches!(refused(&link, "symbolic link"), IoError::Symlink { .. }));
    // Open to the group or to everyone.
    let open = dir.path().join("open");
    private_file(&open, &vec![0u8; 8 * PAGE_SIZE]);
    for mode in [0o640, 0o604, 0o660] {
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(mode)).unwrap();
        assert!(matches!(
            refused(&open, "chmod 600"),
            IoError::OpenToOthers { .. }
        ));
        assert_eq!(
            std::fs::metadata(&open).unwrap().mode() & 0o777,
            mode,
            "left as it was"
        );
    }
    // Owned by another user (root can make one).
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let theirs = dir.path().join("theirs");
        private_file(&theirs, &vec![0u8; 8 * PAGE_SIZE]);
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        assert!(matches!(
            refused(&theirs, "owned by uid 65534"),
            IoError::NotOwner { .. }
        ));
    }
    // Sparse: as long as needed, but holes.
    let sparse = dir.path().join("sparse");
    private_file(&sparse, &[]);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&sparse)
        .unwrap()
        .set_len(8 * PAGE)
        .unwrap();
    assert!(matches!(refused(&sparse, "is sparse"), IoError::Sparse { .. }));
    // The same file for two devices: the second is refused while the
    // first lives, and may have it after.
    let first = IoDevice::file(&FileOptions::new(&good, 8), &reg).unwrap();
    assert!(matches!(refused(&good, "is in use"), IoError::InUse { .. }));
    drop(first);
    IoDevice::file(&FileOptions::new(&good, 8), &reg).unwrap();
}

/// Whether `hay` (a file of whole blocks) holds any aligned 64 bytes of
/// `needle`'s pages where a block could hold them.
fn holds_plaintext(hay: &[u8], needle: &[u8]) -> bool {
    let chunks: std::collections::HashSet<&[u8]> = hay.chunks_exact(64).collect();
    needle.chunks_exact(64).any(|w| chunks.contains(w))
}

/// An encrypted device on a named, preallocated file the test can read
/// and tamper with beside it; `encrypt` false for the plaintext ablation.
fn sealed_device(dir: &Path, slots: u64, encrypt: bool) -> (std::path::PathBuf, IoDevice) {
    let path = dir.join("swap");
    private_file(&path, &vec![0u8; slots as usize * PAGE_SIZE]);
    let dev = IoDevice::file(&FileOptions::new(&path, slots).encrypt(encrypt), &Registry::new()).unwrap();
    (path, dev)
}

fn raw_block(path: &Path, slot: u64) -> Vec<u8> {
    let bytes = std::fs::read(path).unwrap();
    bytes[slot as usize * PAGE_SIZE..(slot as usize + 1) * PAGE_SIZE].to_vec()
}

fn put_raw_block(path: &Path, slot: u64, block: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(block, slot * PAGE).unwrap();
    f.sync_all().unwrap();
}

/// What reading `slot` alone gives: the page, or the error (the buffer
/// must then be zeros, never what the block decrypted to).
fn read_one(dev: &IoDevice, slot: u64) -> Result<Vec<u8>, IoError> {
    let mut buf = AlignedBuf::new(1);
    buf.fill(0x5A);
    match dev.read(slot, &mut buf) {
        Ok(()) => Ok(buf.to_vec()),
        Err(e) => {
            assert!(buf.iter().all(|&b| b == 0), "a failed page left bytes behind");
            Err(e)
        }
    }
}

#[test]
fn encrypted_file_holds_no_plaintext_and_reads_back() {
    for encrypt in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let (path, dev) = sealed_device(dir.path(), 64, encrypt);
        let mut buf = AlignedBuf::new(40);
        fill(&mut buf, 3, 1);
        dev.write(3, &buf).unwrap();
        // The same page twice, to two slots: two different blocks.
        dev.write(50, &buf[..PAGE_SIZE]).unwrap();
        let raw = std::fs::read(&path).unwrap();
        assert_eq!(
            holds_plaintext(&raw, &buf),
            !encrypt,
            "encrypt {encrypt}: the plaintext is on disk or the test cannot see it"
        );
        if encrypt {
            assert_ne!(
                raw_block(&path, 3),
                raw_block(&path, 50),
                "one page, two slots, one block"
            );
        }
        let mut back = AlignedBuf::new(40);
        dev.read(3, &mut back).unwrap();
        assert_eq!(&back[..], &buf[..]);
        assert_eq!(read_one(&dev, 50).unwrap(), &buf[..PAGE_SIZE]);
    }
}

#[test]
fn tampered_blocks_fail_their_check() {
    let dir = tempfile::tempdir().unwrap();
    let (path, dev) = sealed_device(dir.path(), 16, true);
    let mut buf = AlignedBuf::new(8);
    fill(&mut buf, 0, 1);
    dev.write(0, &buf).unwrap();
    let sealed = |r: Result<Vec<u8>, IoError>, slot: u64| match r {
        Err(e @ IoError::Integrity { offset, sealed: true }) if offset == slot => {
            assert!(e.to_string().contains("failed its authentication check"), "{e}");
            assert_eq!(e.errno(), Some(libc::EBADMSG));
        }
        other => panic!("slot {slot}: {other:?}"),
    };
    // A flipped bit, anywhere in the block.
    for bit in [0usize, 7, 12_345, PAGE_SIZE * 8 - 1] {
        let good = raw_block(&path, 1);
        let mut bad = good.clone();
        bad[bit / 8] ^= 1 << (bit % 8);
        put_raw_block(&path, 1, &bad);
        sealed(read_one(&dev, 1), 1);
        put_raw_block(&path, 1, &good);
        assert_eq!(read_one(&dev, 1).unwrap(), &buf[PAGE_SIZE..2 * PAGE_SIZE]);
    }
    // Two blocks swapped.
    let (a, b) = (raw_block(&path, 2), raw_block(&path, 3));
    put_raw_block(&path, 2, &b);
    put_raw_block(&path, 3, &a);
    sealed(read_one(&dev, 2), 2);
    sealed(read_one(&dev, 3), 3);
    // A multi-page read names the first page that fails.
    let mut many = AlignedBuf::new(8);
    match dev.read(0, &mut many) {
        Err(IoError::Integrity { offset: 2, .. }) => {}
        other => panic!("{other:?}"),
    }
    // An old block of the slot put back after a newer write.
    let old = raw_block(&path, 4);
    fill(&mut buf[..PAGE_SIZE], 4, 2);
    dev.write(4, &buf[..PAGE_SIZE]).unwrap();
    assert_eq!(read_one(&dev, 4).unwrap(), &buf[..PAGE_SIZE]);
    put_raw_block(&path, 4, &old);
    sealed(read_one(&dev, 4), 4);
    // A block from another device, the same slot and contents.
    let dir2 = tempfile::tempdir().unwrap();
    let (path2, dev2) = sealed_device(dir2.path(), 16, true);
    fill(&mut buf[..PAGE_SIZE], 5, 1);
    dev.write(5, &buf[..PAGE_SIZE]).unwrap();
    dev2.write(5, &buf[..PAGE_SIZE]).unwrap();
    put_raw_block(&path, 5, &raw_block(&path2, 5));
    sealed(read_one(&dev, 5), 5);
    // Untouched slots still read.
    assert_eq!(read_one(&dev, 6).unwrap(), {
        let mut p = AlignedBuf::new(8);
        fill(&mut p, 0, 1);
        p[6 * PAGE_SIZE..7 * PAGE_SIZE].to_vec()
    });
}

#[test]
fn freed_slots_cannot_be_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let (_path, dev) = sealed_device(dir.path(), 16, true);
    let mut buf = AlignedBuf::new(4);
    fill(&mut buf, 0, 1);
    dev.write(0, &buf).unwrap();
    dev.slot_freed(1, 2);
    assert_eq!(read_one(&dev, 0).unwrap(), &buf[..PAGE_SIZE]);
    for slot in [1, 2, 9] {
        match read_one(&dev, slot) {
            Err(IoError::Integrity {
                offset,
                sealed: false,
            }) if offset == slot => {}
            other => panic!("slot {slot}: {other:?}"),
        }
    }
    // Written again, readable again.
    dev.write(1, &buf[..PAGE_SIZE]).unwrap();
    assert_eq!(read_one(&dev, 1).unwrap(), &buf[..PAGE_SIZE]);
}

#[test]
fn queued_writes_are_sealed_too() {
    let dir = tempfile::tempdir().unwrap();
    let (path, dev) = sealed_device(dir.path(), 2048, true);
    let mut ring = WriteRing::new().unwrap();
    // More than the ring's bounce holds: what does not fit is reported
    // not written, and written by the caller.
    let sizes = [100usize, 120, 60, 16];
    let mut bufs: Vec<AlignedBuf> = sizes.iter().map(|&n| AlignedBuf::new(n)).collect();
    let firsts = [0u64, 300, 600, 1000];
    for (b, &f) in bufs.iter_mut().zip(&firsts) {
        fill(b, f, 7);
    }
    let jobs = jobs_for(&dev, &bufs, &firsts);
    let mut ok = vec![false; jobs.len()];
    ring.write_batch(&jobs, &mut ok);
    assert_eq!(ok, [true, true, false, true], "the bounce holds 256 pages");
    dev.write(firsts[2], &bufs[2]).unwrap();
    let raw = std::fs::read(&path).unwrap();
    for (b, &f) in bufs.iter().zip(&firsts) {
        assert!(!holds_plaintext(&raw, b));
        let mut back = AlignedBuf::new(b.len() / PAGE_SIZE);
        dev.read(f, &mut back).unwrap();
        assert_eq!(&back[..], &b[..]);
    }
}

/// A write that stopped short with no error from the kernel (no errno)
/// is transient, not a bad block: the pager tries it again instead of
/// retiring the slot (it said "failed (errno 0): the slot is retired").
/// EIO is a bad block; ENOSPC transient; a short read (a truncated file)
/// is not transient.
#[test]
fn a_write_cut_short_without_an_errno_is_transient() {
    let write = |e: std::io::Error| IoError::Write { offset: 3, source: e };
    assert!(write(std::io::Error::from(std::io::ErrorKind::WriteZero)).is_transient());
    assert!(write(std::io::Error::from_raw_os_error(libc::ENOSPC)).is_transient());
    // A file size limit the program lowered, and may raise again.
    let efbig = write(std::io::Error::from_raw_os_error(libc::EFBIG));
    assert!(efbig.is_transient());
    assert!(efbig.to_string().contains("RLIMIT_FSIZE"), "{efbig}");
    assert!(!write(std::io::Error::from_raw_os_error(libc::EIO)).is_transient());
    let read = IoError::Read {
        offset: 3,
        source: std::io::Error::from(std::io::ErrorKind::UnexpectedEof),
    };
    assert!(!read.is_transient());
}

/// The files uswap made unnamed are freed at their last close, which a
/// write ring takes over (`WriteRing::hold_files`): a device names them
/// (a file behind a compressed store too), not a file that has a name,
/// and once held they outlive their device until the ring goes.
#[test]
fn a_write_ring_holds_the_unnamed_swap_files_past_their_device() {
    let dir = tempfile::tempdir().unwrap();
    let reg = Registry::new();
    let named = dir.path().join("named");
    private_file(&named, &vec![0u8; 16 * PAGE_SIZE]);
    let named = IoDevice::file(&FileOptions::new(&named, 16), &reg).unwrap();
    assert!(named.unlinked_files().is_empty(), "a named file is not held");
    let tier = IoDevice::compressed(
        &CompressedOptions::new(1 << 20).file(FileOptions::new(dir.path(), 16)),
        &reg,
    )
    .unwrap();
    let fds = tier.unlinked_files();
    assert_eq!(fds.len(), 1, "the file behind a store");
    // Where there is no write ring, a ring that only holds them.
    let hold = FileHold::new(&fds).unwrap();
    drop(tier);
    assert!(unnamed_files_in(dir.path()).is_empty(), "the tier's descriptor is closed");
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", hold.raw_fd())).unwrap();
    assert!(info.contains("UserFiles:\t1"), "the hold holds no file:\n{info}");
    drop(hold);
    let dev = IoDevice::file(&FileOptions::new(dir.path(), 64), &reg).unwrap();
    let fds = dev.unlinked_files();
    assert_eq!(fds.len(), 1);
    let mut page = AlignedBuf::new(1);
    page.fill(5);
    dev.write(3, &page).unwrap();
    let mut ring = WriteRing::new().unwrap();
    ring.hold_files(&fds).unwrap();
    let fdinfo = || std::fs::read_to_string(format!("/proc/self/fdinfo/{}", ring.raw_fd())).unwrap();
    drop(dev);
    assert!(unnamed_files_in(dir.path()).is_empty(), "the device's descriptor is closed");
    let info = fdinfo();
    assert!(
        info.contains("UserFiles:\t1") && info.contains(&*dir.path().to_string_lossy()),
        "the ring holds no file of the device:\n{info}"
    );
    drop(ring);
    drop(named);
}
