//! The pager on an NBD export (nbdkit on a Unix socket, started by the
//! test): a region four times its budget in both fault modes, every byte
//! checked, and a compressed tier with the export behind.

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
    for mode in both_modes() {
        let spec = format!("zram:1M,nbd+unix:///?socket={socket}");
        let device: SwapDeviceSpec = spec.parse().unwrap();
        assert_eq!(
            device.to_string(),
            format!("zram:1048576:lz4,nbd+unix:///?socket={socket}")
        );
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
        // back from the 1 MiB store or sent straight on.
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
            st.counters.store_writebacks > 0 && st.counters.store_incompressible_to_file > 0,
            "{mode:?}: {:?}",
            st.counters
        );
        drop(region);
        assert_all_returned(&swap, &format!("{mode:?}"));
    }
}
