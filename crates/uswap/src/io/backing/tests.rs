//! Tests of backings: what files and devices are taken, what refused, and the extent maps built over them.

use super::*;
use crate::extent::ExtentMapKind;
use std::io::Write;

const KINDS: [ExtentMapKind; 2] = [ExtentMapKind::Tree, ExtentMapKind::List];

fn write_file(path: &Path, bytes: usize) {
    let mut f = File::create(path).unwrap();
    f.write_all(&vec![0xA5u8; bytes]).unwrap();
    f.sync_all().unwrap();
}

#[test]
fn whole_sources_continue_slot_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    let b = dir.path().join("b");
    write_file(&a, 10 * PAGE_SIZE + 100); // rounds down to 10 pages
    write_file(&b, 3 * PAGE_SIZE);
    for kind in KINDS {
        let sources = [
            ExtentSource::Whole {
                path: a.clone(),
                len: None,
            },
            ExtentSource::Whole {
                path: b.clone(),
                len: None,
            },
            ExtentSource::Whole {
                path: a.clone(),
                len: Some(2 * PAGE + 5),
            },
        ];
        let (m, infos) = from_sources(kind, &sources).unwrap();
        assert_eq!(m.kind(), kind);
        assert_eq!(m.slots(), 15);
        assert_eq!(m.len(), 3);
        assert_eq!(
            infos,
            vec![
                BackingInfo {
                    path: a.clone(),
                    len: 10 * PAGE,
                    block_device: false
                },
                BackingInfo {
                    path: b.clone(),
                    len: 3 * PAGE,
                    block_device: false
                },
                BackingInfo {
                    path: a.clone(),
                    len: 2 * PAGE,
                    block_device: false
                },
            ]
        );
        assert_eq!(m.lookup(0), Some((0, 0)));
        assert_eq!(m.lookup(9), Some((0, 9 * PAGE)));
        assert_eq!(m.lookup(10), Some((1, 0)));
        assert_eq!(m.lookup(12), Some((1, 2 * PAGE)));
        assert_eq!(m.lookup(13), Some((2, 0)));
        assert_eq!(m.lookup(14), Some((2, PAGE)));
        assert_eq!(m.lookup(15), None);
    }
}

#[test]
fn unreadable_file_is_permission_denied() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("locked");
    write_file(&a, 4 * PAGE_SIZE);
    std::fs::set_permissions(&a, std::fs::Permissions::from_mode(0o000)).unwrap();
    // Root reads anything; so that this test means something as root
    // too, a helper thread drops its filesystem uid (setfsuid is per
    // thread at the syscall level, and leaving uid 0 drops the
    // filesystem capabilities), then tries both kinds of source.
    let a2 = a.clone();
    let errs = std::thread::spawn(move || {
        // SAFETY: setfsuid only changes this thread's credentials.
        unsafe { libc::syscall(libc::SYS_setfsuid, 65534) };
        [
            from_sources(
                ExtentMapKind::Tree,
                &[ExtentSource::Whole {
                    path: a2.clone(),
                    len: None,
                }],
            )
            .err(),
            from_sources(ExtentMapKind::Tree, &[ExtentSource::Fiemap { path: a2 }]).err(),
        ]
    })
    .join()
    .unwrap();
    for e in errs {
        let e = e.expect("an unreadable file must be refused");
        assert!(
            matches!(e, IoError::Extent(ExtentError::PermissionDenied { .. })),
            "{e}"
        );
        let msg = e.to_string();
        assert!(
            msg.contains(&*a.to_string_lossy()) && msg.contains("permission denied"),
            "{msg}"
        );
    }
}

#[test]
fn whole_source_errors() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    write_file(&a, 4 * PAGE_SIZE);
    let whole = |path: &Path, len| {
        from_sources(
            ExtentMapKind::Tree,
            &[ExtentSource::Whole {
                path: path.to_path_buf(),
                len,
            }],
        )
    };
    let e = whole(&a, Some(5 * PAGE)).unwrap_err();
    assert!(
        matches!(e, IoError::Extent(ExtentError::LenExceedsFile { len, actual, block_device: false, .. })
            if len == 5 * PAGE && actual == 4 * PAGE),
        "{e}"
    );
    assert!(e.to_string().contains("fallocate"), "{e}");
    let e = whole(&a, Some(100)).unwrap_err();
    assert!(
        matches!(e, IoError::Extent(ExtentError::TooSmall { len: 100, .. })),
        "{e}"
    );
    let missing = dir.path().join("nope");
    let e = whole(&missing, None).unwrap_err();
    assert!(matches!(e, IoError::Extent(ExtentError::NotFound { .. })), "{e}");
    assert!(e.to_string().contains(&*missing.to_string_lossy()), "{e}");
    let e = whole(dir.path(), None).unwrap_err();
    assert!(
        matches!(e, IoError::Extent(ExtentError::IsDirectory { .. })),
        "{e}"
    );
    assert!(matches!(
        from_sources(ExtentMapKind::Tree, &[]),
        Err(IoError::Extent(ExtentError::Empty))
    ));
}

/// Map one file with FIEMAP; `None` if the filesystem cannot, after
/// checking that the error says so.
fn fiemap_map(kind: ExtentMapKind, path: &Path) -> Option<ExtentMap> {
    match from_sources(
        kind,
        &[ExtentSource::Fiemap {
            path: path.to_path_buf(),
        }],
    ) {
        Ok((m, infos)) => {
            assert_eq!(infos[0].len, m.slots() * PAGE);
            Some(m)
        }
        Err(e @ IoError::Extent(ExtentError::FiemapUnsupported { .. })) => {
            assert!(e.to_string().contains("whole-file"), "{e}");
            eprintln!("FIEMAP unsupported here, checked the error only: {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

/// Physically discontiguous runs in a raw FIEMAP read (one extent per
/// ioctl, to exercise the continuation loop differently from the map).
fn raw_runs(path: &Path, len: u64) -> usize {
    let f = File::open(path).unwrap();
    let raw = fiemap_extents::<1>(&f, path, len).unwrap();
    let mut runs = 0;
    let mut prev_end: Option<(u64, u64)> = None;
    for fe in &raw {
        if prev_end != Some((fe.fe_logical, fe.fe_physical)) {
            runs += 1;
        }
        prev_end = Some((fe.fe_logical + fe.fe_length, fe.fe_physical + fe.fe_length));
    }
    runs
}

#[test]
fn fiemap_maps_fragmented_file() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    let b = dir.path().join("b");
    // Grow two files in alternate 4 KiB chunks, syncing each, so the
    // filesystem interleaves their blocks.
    const CHUNKS: usize = 512; // 2 MiB each
    {
        let mut fa = File::create(&a).unwrap();
        let mut fb = File::create(&b).unwrap();
        let chunk = vec![0x5Au8; PAGE_SIZE];
        for _ in 0..CHUNKS {
            for f in [&mut fa, &mut fb] {
                f.write_all(&chunk).unwrap();
                f.sync_all().unwrap();
            }
        }
    }
    for kind in KINDS {
        let Some(m) = fiemap_map(kind, &a) else {
            return;
        };
        assert_eq!(m.slots(), CHUNKS as u64);
        for slot in 0..CHUNKS as u64 {
            assert_eq!(m.lookup(slot), Some((0, slot * PAGE)));
        }
        assert_eq!(m.lookup(CHUNKS as u64), None);
        assert!(m.extents().all(|e| e.physical.is_some()));
        let runs = raw_runs(&a, CHUNKS as u64 * PAGE);
        eprintln!(
            "{kind:?}: fragmented file has {runs} physical runs, map has {} extents",
            m.len()
        );
        assert!(runs >= 1);
        assert_eq!(m.len(), runs);
    }
}

#[test]
fn fiemap_accepts_fallocated_file() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    // std has no fallocate; use the util-linux command when present.
    match std::process::Command::new("fallocate")
        .args(["-l", "1M"])
        .arg(&a)
        .status()
    {
        Ok(s) if s.success() => {}
        _ => {
            eprintln!("no fallocate command; skipping the unwritten-extent check");
            return;
        }
    }
    if let Some(m) = fiemap_map(ExtentMapKind::Tree, &a) {
        assert_eq!(m.slots(), 256);
        assert_eq!(m.lookup(255), Some((0, 255 * PAGE)));
    }
}

#[test]
fn fiemap_refuses_holes() {
    let dir = tempfile::tempdir().unwrap();
    // Entirely sparse.
    let sparse = dir.path().join("sparse");
    File::create(&sparse).unwrap().set_len(1 << 20).unwrap();
    // Data, then a hole to the end.
    let tail = dir.path().join("tail");
    write_file(&tail, 16 * PAGE_SIZE);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&tail)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    for (path, offset) in [(&sparse, 0), (&tail, 16 * PAGE)] {
        match from_sources(
            ExtentMapKind::Tree,
            &[ExtentSource::Fiemap { path: path.clone() }],
        ) {
            Err(IoError::Extent(ExtentError::Holes { offset: o, .. })) => assert_eq!(o, offset),
            Err(e @ IoError::Extent(ExtentError::FiemapUnsupported { .. })) => eprintln!("{e}"),
            other => panic!("{path:?}: expected Holes, got {other:?}"),
        }
    }
    let e = from_sources(
        ExtentMapKind::Tree,
        &[ExtentSource::Fiemap { path: sparse.clone() }],
    )
    .unwrap_err();
    if let IoError::Extent(ExtentError::Holes { .. }) = e {
        let msg = e.to_string();
        assert!(msg.contains("holes") && msg.contains("fallocate"), "{msg}");
        assert!(msg.contains(&*sparse.to_string_lossy()), "{msg}");
    }
}

#[test]
fn fiemap_source_errors() {
    let dir = tempfile::tempdir().unwrap();
    let fiemap = |path: &Path| {
        from_sources(
            ExtentMapKind::List,
            &[ExtentSource::Fiemap {
                path: path.to_path_buf(),
            }],
        )
        .unwrap_err()
    };
    let missing = dir.path().join("missing");
    let e = fiemap(&missing);
    assert!(matches!(e, IoError::Extent(ExtentError::NotFound { .. })), "{e}");
    assert!(e.to_string().contains(&*missing.to_string_lossy()), "{e}");
    let e = fiemap(dir.path());
    assert!(
        matches!(e, IoError::Extent(ExtentError::IsDirectory { .. })),
        "{e}"
    );
    assert!(e.to_string().contains("is a directory"), "{e}");
    let empty = dir.path().join("empty");
    File::create(&empty).unwrap();
    let e = fiemap(&empty);
    assert!(
        matches!(e, IoError::Extent(ExtentError::TooSmall { len: 0, .. })),
        "{e}"
    );
    let e = fiemap(Path::new("/dev/null"));
    assert!(
        matches!(e, IoError::Extent(ExtentError::NotSwappable { .. })),
        "{e}"
    );
}

/// A temporary directory on tmpfs (/dev/shm), for the tests of what
/// tmpfs refuses; None, said on stderr, where there is none to use.
pub(crate) fn tmpfs_tempdir() -> Option<tempfile::TempDir> {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let shm_is_tmpfs = mounts.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 2 && f[1] == "/dev/shm" && f[2] == "tmpfs"
    });
    if !shm_is_tmpfs {
        eprintln!("/dev/shm is not tmpfs here; skipping");
        return None;
    }
    let dir = tempfile::tempdir_in("/dev/shm");
    if dir.is_err() {
        eprintln!("cannot write /dev/shm; skipping");
    }
    dir.ok()
}

/// tmpfs has no FIEMAP: the error must say so and point at Whole.
#[test]
fn fiemap_unsupported_on_tmpfs() {
    let Some(dir) = tmpfs_tempdir() else {
        return;
    };
    let a = dir.path().join("a");
    write_file(&a, 4 * PAGE_SIZE);
    let e = from_sources(ExtentMapKind::Tree, &[ExtentSource::Fiemap { path: a }]).unwrap_err();
    assert!(
        matches!(e, IoError::Extent(ExtentError::FiemapUnsupported { .. })),
        "{e}"
    );
    assert!(e.to_string().contains("whole-file"), "{e}");
}
