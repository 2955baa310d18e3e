//! The NBD device against nbdkit: pages read back as written, pipelined
//! past the server's largest request, sealed on the server, trimmed when
//! freed and never after a rewrite, a server lost and back within the
//! deadline, lost for good, and its own errors.

use std::time::{Duration, Instant};

use super::server::Server;
use super::*;
use crate::stats::Registry;

const PAGE: usize = PAGE_SIZE;

fn page_of(slot: u64, seed: u8) -> Vec<u8> {
    (0..PAGE).map(|i| (slot as u8).wrapping_mul(13) ^ (i as u8).wrapping_mul(7) ^ seed).collect()
}

fn run_of(first: u64, pages: u64, seed: u8) -> Vec<u8> {
    (first..first + pages).flat_map(|s| page_of(s, seed)).collect()
}

fn write(dev: &IoDevice, slot: u64, bytes: &[u8]) -> Result<(), IoError> {
    dev.write(slot, bytes)
}

fn read(dev: &IoDevice, slot: u64, pages: u64) -> Result<Vec<u8>, IoError> {
    let mut b = vec![0u8; pages as usize * PAGE];
    dev.read(slot, &mut b)?;
    Ok(b)
}

#[test]
fn pages_read_back_as_written_in_pieces_the_server_takes() {
    // Requests over 64 KiB refused: a 2 MB run must go as 32 pieces, in
    // flight together.
    let server = Server::start(&[
        "--filter=blocksize-policy",
        "memory",
        "64M",
        "blocksize-maximum=65536",
        "blocksize-error-policy=error",
    ]);
    for encrypt in [true, false] {
        let dev = IoDevice::nbd(&server.target(encrypt), &Registry::new()).unwrap();
        assert_eq!(dev.slots(), (64 << 20) / PAGE as u64);
        assert_eq!(dev.kind(), BackendKind::Remote);
        assert!(dev.waits_on_disk() && dev.has_file());
        assert_eq!(dev.encrypts(), encrypt);
        let seed = encrypt as u8;
        for (slot, pages) in [(0u64, 1u64), (1, 3), (7, 1), (512, 512), (16383, 1)] {
            write(&dev, slot, &run_of(slot, pages, seed)).unwrap();
        }
        for (slot, pages) in [(0u64, 1u64), (1, 3), (7, 1), (512, 512), (16383, 1)] {
            assert!(read(&dev, slot, pages).unwrap() == run_of(slot, pages, seed), "slots {slot}+{pages}");
        }
        // Across runs written apart: one read of 8 pages.
        let mut want = run_of(0, 4, seed);
        want.extend(vec![0u8; 3 * PAGE]);
        want.extend(page_of(7, seed));
        if !encrypt {
            assert!(read(&dev, 0, 8).unwrap() == want);
        } else {
            // Slots 4..7 were never sealed: refused, never read as data.
            assert!(matches!(read(&dev, 0, 8), Err(IoError::Integrity { offset: 4, .. })));
        }
        assert!(matches!(
            dev.read(16383, &mut [0u8; 2 * PAGE]),
            Err(IoError::Range { .. })
        ));
    }
}

#[test]
fn the_server_stores_only_ciphertext() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk");
    std::fs::File::create(&disk).unwrap().set_len(16 << 20).unwrap();
    let server = Server::start_in(dir, &["file", disk.to_str().unwrap()]);
    let secret: Vec<u8> = b"the program's secret page "
        .iter()
        .cycle()
        .take(PAGE)
        .copied()
        .collect();
    let raw = || std::fs::read(&disk).unwrap();
    let sealed = IoDevice::nbd(&server.target(true), &Registry::new()).unwrap();
    write(&sealed, 5, &secret).unwrap();
    let on_disk = raw();
    assert!(on_disk[5 * PAGE..6 * PAGE] != secret[..], "the server holds the page in clear");
    assert!(
        !on_disk.windows(26).any(|w| w == b"the program's secret page "),
        "a piece of the page in clear on the server"
    );
    assert!(read(&sealed, 5, 1).unwrap() == secret);
    drop(sealed);
    // `plain` writes what it is given: the check above can see a page.
    let plain = IoDevice::nbd(&server.target(false), &Registry::new()).unwrap();
    write(&plain, 6, &secret).unwrap();
    assert!(raw()[6 * PAGE..7 * PAGE] == secret[..]);
}

#[test]
fn a_page_changed_on_the_server_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk");
    std::fs::File::create(&disk).unwrap().set_len(4 << 20).unwrap();
    let server = Server::start_in(dir, &["file", disk.to_str().unwrap()]);
    let dev = IoDevice::nbd(&server.target(true), &Registry::new()).unwrap();
    write(&dev, 2, &page_of(2, 1)).unwrap();
    write(&dev, 3, &page_of(3, 1)).unwrap();
    // The server's copy of slot 3 moved to slot 2 (a replay elsewhere).
    let mut raw = std::fs::read(&disk).unwrap();
    raw.copy_within(3 * PAGE..4 * PAGE, 2 * PAGE);
    std::fs::write(&disk, &raw).unwrap();
    assert!(matches!(read(&dev, 2, 1), Err(IoError::Integrity { offset: 2, sealed: true })));
    assert!(read(&dev, 3, 1).unwrap() == page_of(3, 1));
}

/// The requests nbdkit's log filter saw, as (command, offset, count).
fn logged(path: &std::path::Path, cmd: &str) -> Vec<(u64, u64)> {
    let log = std::fs::read_to_string(path).unwrap_or_default();
    let field = |l: &str, k: &str| -> Option<u64> {
        let v = l.split(&format!(" {k}=")).nth(1)?.split(' ').next()?;
        let v = v.trim_start_matches("0x");
        u64::from_str_radix(v, 16).ok()
    };
    log.lines()
        .filter(|l| l.contains(&format!(" {cmd} ")) && !l.contains("...return"))
        .filter_map(|l| Some((field(l, "offset")?, field(l, "count")?)))
        .collect()
}

#[test]
fn freed_slots_are_trimmed_and_never_after_their_rewrite() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let logarg = format!("logfile={}", log.display());
    let server = Server::start_in(dir, &["--filter=log", "memory", "16M", &logarg]);
    let dev = IoDevice::nbd(&server.target(true), &Registry::new()).unwrap();
    assert!(dev.wants_slot_freed());
    write(&dev, 0, &run_of(0, 8, 3)).unwrap();
    // Slots 2 and 3 freed in order: one trim of two pages, sent with the
    // next write.
    dev.slot_freed(2, 1);
    dev.slot_freed(3, 1);
    assert!(logged(&server.path("log"), "Trim").is_empty(), "a trim before any write");
    write(&dev, 10, &page_of(10, 3)).unwrap();
    let trims = logged(&server.path("log"), "Trim");
    assert_eq!(trims, vec![(2 * PAGE as u64, 2 * PAGE as u64)]);
    // Slot 5 freed, then allocated again and rewritten before any other
    // write: its trim is cancelled, the new page stays.
    dev.slot_freed(5, 1);
    write(&dev, 5, &page_of(5, 9)).unwrap();
    write(&dev, 11, &page_of(11, 3)).unwrap();
    assert_eq!(logged(&server.path("log"), "Trim").len(), 1, "slot 5's trim was sent");
    assert!(read(&dev, 5, 1).unwrap() == page_of(5, 9));
    // A run freed, then its middle rewritten: the ends are trimmed.
    dev.slot_freed(0, 1);
    dev.slot_freed(1, 1);
    dev.slot_freed(2, 1);
    write(&dev, 1, &page_of(1, 4)).unwrap();
    let mut trims = logged(&server.path("log"), "Trim");
    trims.sort_unstable();
    let p = PAGE as u64;
    assert_eq!(trims, [(0, p), (2 * p, p), (2 * p, 2 * p)]);
    assert!(read(&dev, 1, 1).unwrap() == page_of(1, 4));
}

#[test]
fn many_threads_write_free_and_rewrite_with_nothing_lost() {
    // Four connections (the memory plugin allows several), eight threads,
    // each on slots of its own: write, read back, free, rewrite.
    let server = Server::start(&["memory", "64M"]);
    let dev = IoDevice::nbd(&server.target(true), &Registry::new()).unwrap();
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let dev = &dev;
            s.spawn(move || {
                for round in 0..40u8 {
                    let first = t * 1000 + (round as u64 % 5) * 17;
                    let pages = 1 + round as u64 % 4;
                    write(dev, first, &run_of(first, pages, round)).unwrap();
                    assert!(read(dev, first, pages).unwrap() == run_of(first, pages, round), "thread {t} round {round}");
                    dev.slot_freed(first, pages);
                }
            });
        }
    });
}

#[test]
fn a_server_back_within_the_deadline_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk");
    std::fs::File::create(&disk).unwrap().set_len(8 << 20).unwrap();
    let mut server = Server::start_in(dir, &["file", disk.to_str().unwrap()]);
    let dev = IoDevice::nbd_with_deadline(&server.target(true), Duration::from_secs(20), &Registry::new()).unwrap();
    write(&dev, 0, &run_of(0, 16, 5)).unwrap();
    server.kill();
    std::thread::scope(|s| {
        // Both wait for the server, then work.
        let calls = s.spawn(|| {
            assert!(read(&dev, 0, 16).unwrap() == run_of(0, 16, 5));
            write(&dev, 16, &page_of(16, 5)).unwrap();
        });
        std::thread::sleep(Duration::from_millis(300));
        assert!(!calls.is_finished(), "served with no server");
        // From this thread: nbdkit ends with the thread that started it
        // (`--exit-with-parent` is the parent thread's death signal).
        server.restart();
        calls.join().unwrap();
    });
    assert!(read(&dev, 16, 1).unwrap() == page_of(16, 5));
}

#[test]
fn a_server_gone_for_good_fails_the_call_after_the_deadline() {
    let mut server = Server::start(&["memory", "8M"]);
    let dev = IoDevice::nbd_with_deadline(&server.target(true), Duration::from_millis(500), &Registry::new()).unwrap();
    write(&dev, 0, &page_of(0, 1)).unwrap();
    server.kill();
    let start = Instant::now();
    // A write gives up at once, with an error that may pass: the pager
    // keeps the page and tries later.
    let e = write(&dev, 1, &page_of(1, 1)).unwrap_err();
    assert!(matches!(e, IoError::Write { offset: 1, .. }) && e.is_transient(), "{e}");
    assert!(start.elapsed() < Duration::from_millis(400), "{:?}", start.elapsed());
    // A read waits out the deadline, then fails.
    let e = read(&dev, 0, 1).unwrap_err();
    assert!(matches!(&e, IoError::Read { offset: 0, source } if source.raw_os_error() == Some(libc::EHOSTDOWN)), "{e}");
    assert!(start.elapsed() >= Duration::from_millis(500), "{:?}", start.elapsed());
    assert!(start.elapsed() < Duration::from_secs(8), "{:?}", start.elapsed());
}

#[test]
fn errors_the_server_returns_are_the_requests_own() {
    let dir = tempfile::tempdir().unwrap();
    let trigger = dir.path().join("fail");
    let trig = format!("error-file={}", trigger.display());
    let server = Server::start_in(dir, &["--filter=error", "memory", "8M", "error=EIO", "error-rate=100%", &trig]);
    let dev = IoDevice::nbd(&server.target(true), &Registry::new()).unwrap();
    write(&dev, 0, &page_of(0, 1)).unwrap();
    std::fs::write(&trigger, b"").unwrap();
    let e = write(&dev, 1, &page_of(1, 1)).unwrap_err();
    match &e {
        IoError::Write { offset: 1, source } => assert_eq!(source.raw_os_error(), Some(libc::EIO)),
        e => panic!("{e}"),
    }
    let e = read(&dev, 0, 1).unwrap_err();
    assert!(matches!(&e, IoError::Read { source, .. } if source.raw_os_error() == Some(libc::EIO)), "{e}");
    std::fs::remove_file(&trigger).unwrap();
    // The connection stayed in step: the next calls work.
    assert!(read(&dev, 0, 1).unwrap() == page_of(0, 1));
    write(&dev, 1, &page_of(1, 1)).unwrap();
}

#[test]
fn exports_that_cannot_be_used_are_one_line_each() {
    let registry = Registry::new();
    let nobody = NbdTarget {
        endpoint: Endpoint::Unix {
            path: "/nonexistent/nbd.sock".into(),
        },
        export: String::new(),
        size: None,
        deadline: None,
        encrypt: true,
    };
    let mut said = Vec::new();
    let e = IoDevice::nbd(&nobody, &registry).unwrap_err().to_string();
    assert!(e.contains("cannot connect") && e.contains("nbdkit --unix"), "{e}");
    said.push(e);
    let ro = Server::start(&["-r", "memory", "8M"]);
    let e = IoDevice::nbd(&ro.target(true), &registry).unwrap_err().to_string();
    assert!(e.contains("read-only"), "{e}");
    said.push(e);
    let small = Server::start(&["memory", "8M"]);
    let mut t = small.target(true);
    t.size = Some(16 << 20);
    let e = IoDevice::nbd(&t, &registry).unwrap_err().to_string();
    assert!(e.contains("less than the 16777216 asked for"), "{e}");
    said.push(e);
    let strict = Server::start(&["--filter=exportname", "memory", "8M", "exportname-strict=true", "exportname=swap"]);
    let mut t = strict.target(true);
    t.export = "other".into();
    let e = IoDevice::nbd(&t, &registry).unwrap_err().to_string();
    assert!(e.contains("refused"), "{e}");
    said.push(e);
    for e in &said {
        assert!(!e.contains('\n') && e.starts_with("nbd+unix:///"), "{e}");
    }
    t.export = "swap".into();
    assert_eq!(IoDevice::nbd(&t, &registry).unwrap().slots(), (8 << 20) / PAGE as u64);
}

/// Interoperability: the same client against qemu-nbd (QEMU's server, the
/// one that also exports Ceph RBD images), a raw image on this disk:
/// pages read back as written, a 2 MB run in pieces, what it stored is
/// ciphertext, trims accepted, and the server's restart survived.
#[test]
fn qemu_nbd_serves_the_same_client() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.raw");
    std::fs::File::create(&disk).unwrap().set_len(16 << 20).unwrap();
    let sock = dir.path().join("qemu.sock");
    let start = || {
        let child = std::process::Command::new("qemu-nbd")
            .args(["--persistent", "--shared=4", "--format=raw", "--discard=unmap", "--socket"])
            .arg(&sock)
            .arg(&disk)
            .stdin(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start qemu-nbd ({e}): install it with `apt-get install qemu-utils` (scripts/check does)")
            });
        let t0 = Instant::now();
        // Listening, not only bound (a connect between the two is refused).
        while std::os::unix::net::UnixStream::connect(&sock).is_err() {
            assert!(t0.elapsed() < Duration::from_secs(10), "qemu-nbd made no socket");
            std::thread::sleep(Duration::from_millis(5));
        }
        child
    };
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut server = Kill(start());
    let target = NbdTarget {
        endpoint: Endpoint::Unix { path: sock.clone() },
        export: String::new(),
        size: None,
        deadline: Some(Duration::from_secs(20)),
        encrypt: true,
    };
    let dev = IoDevice::nbd(&target, &Registry::new()).unwrap();
    assert_eq!(dev.slots(), (16 << 20) / PAGE as u64);
    for (slot, pages) in [(0u64, 1u64), (3, 5), (512, 512), (4095, 1)] {
        write(&dev, slot, &run_of(slot, pages, 11)).unwrap();
    }
    for (slot, pages) in [(0u64, 1u64), (3, 5), (512, 512), (4095, 1)] {
        assert!(read(&dev, slot, pages).unwrap() == run_of(slot, pages, 11), "slots {slot}+{pages}");
    }
    let raw = std::fs::read(&disk).unwrap();
    assert!(raw[3 * PAGE..4 * PAGE] != page_of(3, 11)[..], "qemu-nbd holds a page in clear");
    // Trims with the next write, which qemu-nbd accepts.
    dev.slot_freed(3, 5);
    write(&dev, 100, &page_of(100, 11)).unwrap();
    // Restarted under the client: the image kept what it was given.
    drop(server);
    server = Kill(start());
    assert!(read(&dev, 512, 512).unwrap() == run_of(512, 512, 11));
    assert!(read(&dev, 100, 1).unwrap() == page_of(100, 11));
    drop(server);
}

/// Over TCP (`nbd://localhost:PORT/`): the name resolved once, the
/// connections made with `TCP_NODELAY`, pages read back, the server's
/// restart survived.
#[test]
fn pages_go_over_tcp_too() {
    let mut server = Server::start_tcp(&["memory", "16M"]);
    let mut t = server.target(true);
    t.deadline = Some(Duration::from_secs(20));
    assert!(t.to_string().starts_with("nbd://localhost:"), "{t}");
    let dev = IoDevice::nbd(&t, &Registry::new()).unwrap();
    write(&dev, 0, &run_of(0, 600, 2)).unwrap();
    assert!(read(&dev, 0, 600).unwrap() == run_of(0, 600, 2));
    // The memory plugin starts empty again: what it held is gone, and a
    // read of it fails its check rather than returning zeros.
    server.kill();
    server.restart();
    assert!(matches!(read(&dev, 7, 1), Err(IoError::Integrity { offset: 7, sealed: true })));
    write(&dev, 7, &page_of(7, 3)).unwrap();
    assert!(read(&dev, 7, 1).unwrap() == page_of(7, 3));
}

/// TLS on the wire, as DESIGN.md and the README tell it: the server
/// requires TLS (`nbdkit --tls=require`, a pre-shared key), and a local
/// nbdkit's nbd plugin (libnbd, which speaks TLS) re-exports it on a Unix
/// socket that uswap's client uses.  Pages go through and read back.
#[test]
fn tls_through_a_local_nbdkit_proxy() {
    let remote_dir = tempfile::tempdir().unwrap();
    let psk = remote_dir.path().join("psk");
    std::fs::write(&psk, "alice:4e4244206b657920666f72207573776170277320746c732074657374\n").unwrap();
    let psk_arg = format!("--tls-psk={}", psk.display());
    let remote = Server::start_tcp(&["--tls=require", &psk_arg, "memory", "16M"]);
    let port = match remote.target(true).endpoint {
        Endpoint::Tcp { port, .. } => port,
        Endpoint::Unix { .. } => unreachable!(),
    };
    // A plain client is turned away by the server.
    let e = IoDevice::nbd(&remote.target(true), &Registry::new()).unwrap_err().to_string();
    assert!(e.contains("requires TLS"), "{e}");
    let proxy = Server::start(&[
        "nbd",
        "hostname=127.0.0.1",
        &format!("port={port}"),
        "tls=require",
        &format!("tls-psk={}", psk.display()),
        "tls-username=alice",
    ]);
    let dev = IoDevice::nbd(&proxy.target(true), &Registry::new()).unwrap();
    assert_eq!(dev.slots(), (16 << 20) / PAGE as u64);
    write(&dev, 0, &run_of(0, 512, 4)).unwrap();
    assert!(read(&dev, 0, 512).unwrap() == run_of(0, 512, 4));
}
