//! The ioctls against the running kernel: these need userfaultfd, which on
//! this project's machines means root (CI runs as root).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::*;
use crate::PAGE_SIZE;

const PAGE: u64 = PAGE_SIZE as u64;

/// An anonymous private mapping (the OS layer's), with page accessors.
struct Mapping(crate::sys::Mapping);

impl Mapping {
    fn new(pages: usize) -> Mapping {
        Mapping(crate::sys::Mapping::new(pages * PAGE_SIZE, PAGE_SIZE).expect("mmap"))
    }

    fn page(&self, i: usize) -> u64 {
        self.0.addr() + (i * PAGE_SIZE) as u64
    }

    fn read(&self, i: usize, at: usize) -> u8 {
        assert!(i * PAGE_SIZE + at < self.0.len());
        // SAFETY: in bounds of the mapping; volatile so the access happens.
        unsafe { std::ptr::read_volatile(self.0.as_ptr().add(i * PAGE_SIZE + at)) }
    }

    fn write(&self, i: usize, at: usize, v: u8) {
        assert!(i * PAGE_SIZE + at < self.0.len());
        // SAFETY: in bounds of the mapping; volatile so the access happens.
        unsafe { std::ptr::write_volatile(self.0.as_ptr().add(i * PAGE_SIZE + at), v) }
    }
}

fn pattern(seed: u8) -> Vec<u8> {
    (0..PAGE_SIZE)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Serve faults of `uffd` from a closure until `stop`; returns the faults.
fn serve(
    uffd: Arc<Uffd>,
    stop: Arc<AtomicBool>,
    mut on_fault: impl FnMut(&Uffd, u64, bool, bool) + Send + 'static,
) -> std::thread::JoinHandle<usize> {
    std::thread::spawn(move || {
        let mut n = 0;
        while !stop.load(Ordering::Relaxed) {
            if !uffd.poll(20).unwrap() {
                continue;
            }
            while let Some(ev) = uffd.read_event().unwrap() {
                if let Event::PageFault {
                    address, write, wp, ..
                } = ev
                {
                    on_fault(&uffd, address & !(PAGE - 1), write, wp);
                    n += 1;
                }
            }
        }
        n
    })
}

#[test]
fn features_of_this_kernel_and_a_missing_one() {
    let all = Features::MOVE
        .with(Features::POISON)
        .with(Features::SIGBUS)
        .with(Features::PAGEFAULT_FLAG_WP)
        .with(Features::WP_UNPOPULATED)
        .with(Features::THREAD_ID);
    let u = Uffd::open(all, true).expect("userfaultfd with MOVE (Linux 6.8+) as root");
    assert!(u.features().contains(all));
    assert!(u.nonblocking());
    assert_eq!(u.read_event().unwrap(), None, "nothing to read yet");
    // A feature no kernel has yet: a clear error naming it.
    let e = Uffd::open(Features(1 << 40), false).unwrap_err();
    assert!(matches!(e, UffdError::MissingFeature { .. }), "{e}");
    assert!(e.to_string().contains("first appeared in Linux"), "{e}");
    assert!(UffdError::Permission
        .to_string()
        .contains("vm.unprivileged_userfaultfd"));
}

#[test]
fn handler_thread_serves_missing_faults_with_copy_and_zeropage() {
    let uffd = Arc::new(Uffd::open(Features::THREAD_ID, true).unwrap());
    let m = Arc::new(Mapping::new(4));
    uffd.register(
        m.page(0),
        4 * PAGE,
        RegisterMode {
            missing: true,
            wp: false,
        },
    )
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let base = m.page(0);
    let h = serve(uffd.clone(), stop.clone(), move |u, page, _, _| {
        let i = ((page - base) / PAGE) as u8;
        if i == 3 {
            // SAFETY: pages of this test's own mappings, which nothing else refers to.
            unsafe { u.zeropage(page, PAGE, true) }.unwrap();
        } else {
            let p = pattern(i);
            // SAFETY: pages of this test's own mappings, which nothing else refers to.
            let n = unsafe { u.copy(page, p.as_ptr(), PAGE, false, true) }.unwrap();
            assert_eq!(n, PAGE);
        }
    });
    for i in 0..3 {
        let p = pattern(i as u8);
        for at in [0, 1, 4095] {
            assert_eq!(m.read(i, at), p[at]);
        }
    }
    assert_eq!(m.read(3, 100), 0, "a never-written page reads zero");
    // Installing over a present page is EEXIST: a duplicate fault.
    let p = pattern(9);
    // SAFETY: pages of this test's own mappings, which nothing else refers to.
    let e = unsafe { uffd.copy(m.page(0), p.as_ptr(), PAGE, false, true) }.unwrap_err();
    assert_eq!(e.errno(), Some(libc::EEXIST));
    stop.store(true, Ordering::Relaxed);
    assert_eq!(h.join().unwrap(), 4, "one fault per page");
}

#[test]
fn move_out_to_staging_and_back_keeps_the_data() {
    let uffd = Arc::new(Uffd::open(Features::MOVE, true).unwrap());
    let region = Arc::new(Mapping::new(2));
    let staging = Mapping::new(2);
    uffd.register(
        region.page(0),
        2 * PAGE,
        RegisterMode {
            missing: true,
            wp: false,
        },
    )
    .unwrap();
    uffd.register(
        staging.page(0),
        2 * PAGE,
        RegisterMode {
            missing: true,
            wp: false,
        },
    )
    .unwrap();
    // Populate page 0 through a fault, then write to it.
    let stop = Arc::new(AtomicBool::new(false));
    let staged = staging.page(0);
    let moved_back = Arc::new(AtomicBool::new(false));
    let mb = moved_back.clone();
    let h = serve(uffd.clone(), stop.clone(), move |u, page, _, _| {
        if mb.load(Ordering::Relaxed) {
            // SAFETY: pages of this test's own mappings, which nothing else refers to.
            let n = unsafe { u.move_pages(page, staged, PAGE, true, false) }.unwrap();
            assert_eq!(n, PAGE);
        } else {
            let p = pattern(1);
            // SAFETY: pages of this test's own mappings, which nothing else refers to.
            unsafe { u.copy(page, p.as_ptr(), PAGE, false, true) }.unwrap();
        }
    });
    region.write(0, 7, 0xAB);
    assert_eq!(region.read(0, 8), pattern(1)[8]);
    // Evict: move the page out; the region's page is missing again.
    moved_back.store(true, Ordering::Relaxed);
    assert_eq!(
        // SAFETY: pages of this test's own mappings, which nothing else refers to.
        unsafe { uffd.move_pages(staged, region.page(0), PAGE, false, false) }.unwrap(),
        PAGE
    );
    assert_eq!(staging.read(0, 7), 0xAB, "the page itself moved");
    // Touching it faults; the handler moves it back.
    assert_eq!(region.read(0, 7), 0xAB);
    assert_eq!(region.read(0, 8), pattern(1)[8]);
    stop.store(true, Ordering::Relaxed);
    assert_eq!(h.join().unwrap(), 2);
}

#[test]
fn write_protect_faults_mark_the_first_write() {
    let uffd = Arc::new(Uffd::open(Features::PAGEFAULT_FLAG_WP, true).unwrap());
    let m = Arc::new(Mapping::new(1));
    uffd.register(
        m.page(0),
        PAGE,
        RegisterMode {
            missing: true,
            wp: true,
        },
    )
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let wp_faults = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let w = wp_faults.clone();
    let h = serve(uffd.clone(), stop.clone(), move |u, page, write, wp| {
        if wp {
            assert!(write);
            w.fetch_add(1, Ordering::Relaxed);
            u.writeprotect(page, PAGE, false, true).unwrap();
        } else {
            // Installed clean: write-protected until the first write.
            let p = pattern(5);
            // SAFETY: pages of this test's own mappings, which nothing else refers to.
            unsafe { u.copy(page, p.as_ptr(), PAGE, true, true) }.unwrap();
        }
    });
    assert_eq!(m.read(0, 3), pattern(5)[3]);
    assert_eq!(wp_faults.load(Ordering::Relaxed), 0, "reads do not fault");
    m.write(0, 3, 0x5A);
    assert_eq!(
        wp_faults.load(Ordering::Relaxed),
        1,
        "the first write faults once"
    );
    m.write(0, 4, 0x5B);
    assert_eq!(wp_faults.load(Ordering::Relaxed), 1, "later writes do not");
    assert_eq!((m.read(0, 3), m.read(0, 4)), (0x5A, 0x5B));
    stop.store(true, Ordering::Relaxed);
    assert_eq!(h.join().unwrap(), 2);
}

/// Whether a write-protected page stays write-protected across a move out
/// and back (the pager relies on the answer: see pager::reclaim::unstage).
#[test]
fn write_protect_survives_move_out_and_back() {
    let uffd = Arc::new(Uffd::open(Features::PAGEFAULT_FLAG_WP.with(Features::MOVE), true).unwrap());
    let m = Arc::new(Mapping::new(1));
    let staging = Mapping::new(1);
    uffd.register(
        m.page(0),
        PAGE,
        RegisterMode {
            missing: true,
            wp: true,
        },
    )
    .unwrap();
    uffd.register(
        staging.page(0),
        PAGE,
        RegisterMode {
            missing: true,
            wp: true,
        },
    )
    .unwrap();
    let p = pattern(3);
    // SAFETY: pages of this test's own mappings, which nothing else refers to.
    unsafe { uffd.copy(m.page(0), p.as_ptr(), PAGE, true, false) }.unwrap();
    assert_eq!(
        // SAFETY: pages of this test's own mappings, which nothing else refers to.
        unsafe { uffd.move_pages(staging.page(0), m.page(0), PAGE, false, false) }.unwrap(),
        PAGE
    );
    assert_eq!(
        // SAFETY: pages of this test's own mappings, which nothing else refers to.
        unsafe { uffd.move_pages(m.page(0), staging.page(0), PAGE, false, false) }.unwrap(),
        PAGE
    );
    let stop = Arc::new(AtomicBool::new(false));
    let wp_faults = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let w = wp_faults.clone();
    let h = serve(uffd.clone(), stop.clone(), move |u, page, _, wp| {
        if wp {
            w.fetch_add(1, Ordering::Relaxed);
            u.writeprotect(page, PAGE, false, true).unwrap();
        }
    });
    m.write(0, 9, 0x77);
    stop.store(true, Ordering::Relaxed);
    h.join().unwrap();
    // The move drops the write protection (Linux 6.18): the pager takes a
    // page moved back from staging as dirty for this reason.  Were it kept,
    // the pager would still be right, only more conservative than needed.
    assert_eq!(
        wp_faults.load(Ordering::Relaxed),
        0,
        "UFFDIO_MOVE now keeps uffd-wp: pager::reclaim::unstage could keep clean pages clean"
    );
    assert_eq!(m.read(0, 9), 0x77);
    assert_eq!(m.read(0, 10), p[10]);
}

/// What batched eviction's copy step rests on (docs/DESIGN.md, "Batched
/// eviction"): in SIGBUS mode, a read through the kernel
/// (`process_vm_readv` on our own pid) of a missing registered page fails
/// with `EFAULT` or stops short, raising no signal; present pages read.
#[test]
fn kernel_reads_of_missing_pages_fail_in_sigbus_mode() {
    let uffd = Uffd::open(Features::SIGBUS, false).unwrap();
    let m = Mapping::new(3);
    uffd.register(
        m.page(0),
        3 * PAGE,
        RegisterMode {
            missing: true,
            wp: false,
        },
    )
    .unwrap();
    let p = pattern(5);
    // SAFETY: pages of this test's own mappings, which nothing else refers to.
    unsafe { uffd.copy(m.page(0), p.as_ptr(), PAGE, false, false) }.unwrap();
    // Page 0 present, page 1 missing.
    let mut buf = vec![0u8; 2 * PAGE as usize];
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: m.page(0) as *mut libc::c_void,
        iov_len: 2 * PAGE as usize,
    };
    // SAFETY: one local iovec over `buf`, one remote over our own mapping;
    // the kernel writes only into `buf`.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    assert_eq!(
        n, PAGE as isize,
        "the present page reads, the missing one stops the read"
    );
    assert_eq!(&buf[..PAGE as usize], &p[..]);
    // Only the missing page: EFAULT.
    let remote = libc::iovec {
        iov_base: m.page(1) as *mut libc::c_void,
        iov_len: PAGE as usize,
    };
    // SAFETY: as above.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    assert_eq!(n, -1);
    assert_eq!(io::Error::last_os_error().raw_os_error(), Some(libc::EFAULT));
}
