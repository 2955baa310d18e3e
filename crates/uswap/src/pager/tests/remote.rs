//! The pager on an NBD export (nbdkit on a Unix socket, started by the
//! test): a region four times its budget in both fault modes, every byte
//! checked; a compressed tier with the export behind; the server gone
//! and back within the deadline (nothing lost), and gone for good (what
//! it held poisoned, the rest intact).

use super::child;
use super::support::*;
use super::*;
use crate::io::nbd::server::Server;

const MIB: u64 = 1 << 20;

#[test]
fn a_region_four_times_its_budget_on_an_nbd_export() {
    let server = Server::start(&["memory", "64M"]);
    for mode in both_modes() {
        for encrypt in [true, false] {
            let what = format!("{mode:?} encrypt {encrypt}");
            let swap = Swap::builder()
                .budget(4 * MIB)
                .device(SwapDeviceSpec::nbd(server.target(encrypt)))
                .fault_mode(mode)
                .build()
                .unwrap();
            let mut region = swap.map((16 * MIB) as usize).unwrap();
            fill(&mut region, 1);
            verify(&region, 1);
            fill(&mut region, 2);
            verify(&region, 2);
            let st = swap.stats();
            assert!(
                st.counters.evictions > 4096 && st.counters.swapout_errors == 0,
                "{what}: {:?}",
                st.counters
            );
            assert!(
                st.counters.swapins + st.counters.readahead > 2048,
                "{what}: {:?}",
                st.counters
            );
            assert!(st.counters.io_write_pages > 4096, "{what}: {:?}", st.counters);
            drop(region);
            assert_all_returned(&swap, &what);
        }
    }
}

#[test]
fn a_compressed_tier_with_an_nbd_export_behind() {
    let server = Server::start(&["memory", "64M"]);
    let socket = server.socket().display().to_string();
    // Pages that do not compress stored whole and written back in their
    // turn (the default) in one mode, sent straight on in the other.
    for (mode, to_export) in both_modes().into_iter().zip([false, true]) {
        let spec = format!("zram:1M,nbd+unix:///?socket={socket}");
        let device: SwapDeviceSpec = spec.parse().unwrap();
        assert_eq!(
            device.to_string(),
            format!("zram:1048576:lz4,nbd+unix:///?socket={socket}")
        );
        let device = match device {
            SwapDeviceSpec::Compressed { options, priority } => SwapDeviceSpec::Compressed {
                options: options.incompressible_to_file(to_export),
                priority,
            },
            d => panic!("{d} is not a tier"),
        };
        let swap = Swap::builder()
            .budget(4 * MIB)
            .device(device)
            .fault_mode(mode)
            .build()
            .unwrap();
        assert_eq!(swap.total_slots(), 64 * MIB / PAGE_SIZE as u64 - 1);
        let mut region = swap.map((16 * MIB) as usize).unwrap();
        // Half the pages compress to about half (random bytes, then a
        // run of one), half do not: both kinds reach the export, written
        // back from the 1 MiB store, or the second kind sent straight on.
        let byte = |p: usize, at: usize| {
            if p.is_multiple_of(2) && at >= PAGE_SIZE / 2 {
                p as u8
            } else {
                fill_byte(p, at, 7)
            }
        };
        for (p, page) in region.as_mut_slice().chunks_mut(PAGE_SIZE).enumerate() {
            for (at, b) in page.iter_mut().enumerate() {
                *b = byte(p, at);
            }
        }
        for (p, page) in region.as_slice().chunks(PAGE_SIZE).enumerate() {
            assert!(
                page.iter().enumerate().all(|(at, &b)| b == byte(p, at)),
                "{mode:?} page {p}"
            );
        }
        let st = swap.stats();
        assert!(
            st.counters.store_writebacks > 0 && (st.counters.store_incompressible_to_file > 0) == to_export,
            "{mode:?} to_export={to_export}: {:?}",
            st.counters
        );
        drop(region);
        assert_all_returned(&swap, &format!("{mode:?}"));
    }
}

/// The server stops and comes back (its file plugin keeps what it was
/// given) while the program runs: faults wait for it, writeback backs off
/// and goes on, and every page reads back.
#[test]
fn a_server_back_within_the_deadline_loses_no_page() {
    for mode in both_modes() {
        let dir = tempfile::tempdir().unwrap();
        let disk = dir.path().join("disk");
        std::fs::File::create(&disk).unwrap().set_len(64 * MIB).unwrap();
        let mut server = Server::start_in(dir, &["file", disk.to_str().unwrap()]);
        let mut target = server.target(true);
        target.deadline = Some(std::time::Duration::from_secs(30));
        let swap = Swap::builder()
            .budget(MIB)
            .device(SwapDeviceSpec::nbd(target))
            .fault_mode(mode)
            .build()
            .unwrap();
        let mut region = swap.map((8 * MIB) as usize).unwrap();
        let base = region.as_mut_slice().as_mut_ptr() as usize;
        let pages = region.len() / PAGE_SIZE;
        write_pages(base as *mut u8, 0..pages);
        server.kill();
        std::thread::scope(|s| {
            // Reads and writes all over the region, most of it out.
            let program = s.spawn(move || {
                let bad = check_pages(base as *const u8, 0..pages);
                write_pages(base as *mut u8, 0..pages);
                bad
            });
            std::thread::sleep(std::time::Duration::from_millis(300));
            // From this thread: nbdkit ends with the thread that started it.
            server.restart();
            assert_eq!(program.join().unwrap(), None, "{mode:?}");
        });
        assert_eq!(check_pages(base as *const u8, 0..pages), None, "{mode:?}");
        assert_eq!(swap.stats().counters.swapin_errors, 0, "{mode:?}");
        drop(region);
        assert_all_returned(&swap, &format!("{mode:?}"));
    }
}

/// The server gone for good: pages still in memory read as written, and
/// a page only the server held, once the deadline has passed, is poisoned
/// (SIGBUS, the reason on stderr), never read as zeros.
fn server_gone_scenario(mode: FaultMode) {
    let mut server = Server::start(&["memory", "64M"]);
    let mut target = server.target(true);
    target.deadline = Some(std::time::Duration::from_millis(300));
    let swap = Swap::builder()
        .budget(MIB)
        .device(SwapDeviceSpec::nbd(target))
        .fault_mode(mode)
        .background_reclaim(false)
        .build()
        .unwrap();
    let mut region = swap.map((8 * MIB) as usize).unwrap();
    let base = region.as_mut_slice().as_mut_ptr();
    let pages = region.len() / PAGE_SIZE;
    write_pages(base, 0..pages);
    let resident: Vec<usize> = (0..pages).filter(|&i| region.is_resident(i)).collect();
    let victim = (0..pages)
        .find(|&i| !region.is_resident(i) && region.slot_of(i).is_some())
        .expect("a page swapped out");
    server.kill();
    for &i in &resident {
        if let Some(bad) = check_pages(base, i..i + 1) {
            eprintln!("a resident page changed: {bad:?}");
            child::exit(2);
        }
    }
    eprintln!(
        "{} resident pages intact; touching page {victim}, which only the server held",
        resident.len()
    );
    // SAFETY: a byte of the live region.
    let v = unsafe { std::ptr::read_volatile(base.add(victim * PAGE_SIZE)) };
    // Not reached: SIGBUS.
    eprintln!("read {v:#x} from a page the server lost");
    child::exit(3);
}

#[test]
fn a_server_gone_for_good_poisons_only_what_it_held() {
    if let Some(arg) = child::scenario() {
        server_gone_scenario(mode_from(&arg));
    }
    for mode in both_modes() {
        let out = child::run(
            "pager::tests::remote::a_server_gone_for_good_poisons_only_what_it_held",
            mode_name(mode),
            std::time::Duration::from_secs(60),
        );
        assert!(out.stderr.contains("resident pages intact"), "{mode:?}: {out:?}");
        assert!(
            out.stderr
                .contains("its server stayed unreachable past the device's deadline")
                && out.stderr.contains("the memory is poisoned"),
            "{mode:?}: {out:?}"
        );
        assert_eq!(out.signal, Some(libc::SIGBUS), "{mode:?}: {out:?}");
    }
}
