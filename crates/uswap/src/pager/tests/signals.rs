//! Signals and stacks: SIGBUS blocked in a thread, a SIGBUS handler
//! installed after uswap's, the program's handlers touching region memory
//! at any moment, `kill -BUS`, errno across a fault, uswap's threads
//! blocking every signal, small alternate stacks, a region as a coroutine
//! stack, and SIGBUS mode as an ordinary user.
//!
//! Scenarios that died, hung or deadlocked before their fix run in a
//! child process under a watchdog (`child.rs`), so that a regression fails
//! its test with the child's output instead of taking the suite down.

use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use super::child;
use super::support::*;
use super::*;

const MIB: u64 = 1 << 20;

// SIGBUS blocked in a thread, or a SIGBUS handler installed later.

fn block_sigbus() {
    // SAFETY: plain signal-mask calls on this thread.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGBUS);
        assert_eq!(
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()),
            0
        );
    }
}

/// `map` refuses, in one line, on a thread that blocks SIGBUS in SIGBUS
/// mode: the first touch of swapped memory there would kill the process.
#[test]
fn map_refuses_when_sigbus_is_blocked() {
    let swap = ram_swap(MIB, 16 * MIB, FaultMode::Sigbus);
    let e = std::thread::scope(|s| {
        s.spawn(|| {
            block_sigbus();
            swap.map(PAGE_SIZE).err()
        })
        .join()
        .unwrap()
    });
    let e = e.expect("map on a thread that blocks SIGBUS must be refused");
    assert!(e.to_string().contains("blocks SIGBUS"), "{e}");
    // Handler-thread mode serves such threads.
    let swap = ram_swap(MIB, 16 * MIB, FaultMode::HandlerThread);
    std::thread::scope(|s| {
        s.spawn(|| {
            block_sigbus();
            let mut r = swap.map((4 * MIB) as usize).unwrap();
            let base = r.as_mut_slice().as_mut_ptr();
            write_pages(base, 0..1024);
            assert_eq!(check_pages(base, 0..1024), None);
        });
    });
}

/// A thread that blocks SIGBUS after its regions were mapped is reported
/// in one line by the instance's watchdog.
#[test]
fn a_thread_blocking_sigbus_is_reported() {
    if child::scenario().is_some() {
        let swap = ram_swap(MIB, 16 * MIB, FaultMode::Sigbus);
        let mut region = swap.map((2 * MIB) as usize).unwrap();
        write_pages(region.as_mut_slice().as_mut_ptr(), 0..512);
        std::thread::Builder::new()
            .name("sigwaiter".into())
            .spawn(|| {
                block_sigbus();
                std::thread::sleep(Duration::from_secs(60));
            })
            .unwrap();
        // It is named after four scans in a row (two seconds).  Meanwhile
        // three threads thrash (the region is twice the budget),
        // spending much of their time inside the handler, where SIGBUS is
        // blocked too: none of them may be named.
        let base = region.as_mut_slice().as_mut_ptr() as usize;
        let end = std::time::Instant::now() + Duration::from_secs(5);
        std::thread::scope(|s| {
            for t in 0..3 {
                s.spawn(move || {
                    while std::time::Instant::now() < end {
                        let pages = if t == 0 { 0..512 } else { 256 * (t - 1)..256 * t };
                        assert_eq!(check_pages(base as *const u8, pages), None);
                    }
                });
            }
        });
        child::exit(0);
    }
    let out = child::run(
        "pager::tests::signals::a_thread_blocking_sigbus_is_reported",
        "go",
        Duration::from_secs(30),
    );
    out.assert_success();
    let lines: Vec<_> = out
        .stderr
        .lines()
        .filter(|l| l.contains("blocks SIGBUS"))
        .collect();
    assert_eq!(lines.len(), 1, "one line, once: {out:?}");
    assert!(lines[0].contains("sigwaiter"), "{out:?}");
}

static APP_HANDLER_CALLS: AtomicUsize = AtomicUsize::new(0);

extern "C" fn app_sigbus(_sig: i32, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    APP_HANDLER_CALLS.fetch_add(1, Ordering::Relaxed);
    // SAFETY: the kernel passes a valid siginfo.
    let code = unsafe { (*info).si_code };
    let sent = code <= 0;
    let msg: &[u8] = if sent {
        b"app handler: kill\n"
    } else {
        b"app handler: a fault reached the program's handler\n"
    };
    // SAFETY: write(2) and _exit(2) are async-signal-safe.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
        libc::_exit(if sent { 7 } else { 9 });
    }
}

fn current_sigbus_handler() -> usize {
    // SAFETY: queries the current action only.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old);
        old.sa_sigaction
    }
}

/// A crash reporter installing its SIGBUS handler after uswap's: uswap
/// puts its own back in front, faults keep being served, and every other
/// SIGBUS reaches the program's handler.
#[test]
fn a_later_sigbus_handler_is_chained() {
    if child::scenario().is_some() {
        let swap = ram_swap(MIB, 16 * MIB, FaultMode::Sigbus);
        let mut region = swap.map((4 * MIB) as usize).unwrap();
        let base = region.as_mut_slice().as_mut_ptr();
        write_pages(base, 0..1024);
        // SAFETY: installs a handler that is async-signal-safe.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = app_sigbus as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO;
            libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
        }
        let app = app_sigbus as *const () as usize;
        let mut waited = 0;
        while current_sigbus_handler() == app {
            waited += 1;
            if waited > 1000 {
                eprintln!("uswap never put its handler back");
                child::exit(3);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(check_pages(base, 0..1024), None);
        assert_eq!(APP_HANDLER_CALLS.load(Ordering::Relaxed), 0);
        eprintln!("verified");
        // SAFETY: a signal to this thread.
        unsafe { libc::raise(libc::SIGBUS) };
        eprintln!("the kill did not reach the program's handler");
        child::exit(4);
    }
    let out = child::run(
        "pager::tests::signals::a_later_sigbus_handler_is_chained",
        "go",
        Duration::from_secs(30),
    );
    assert_eq!(out.code, Some(7), "{out:?}");
    assert!(out.stderr.contains("verified"), "{out:?}");
    assert!(out.stderr.contains("installed after uswap"), "{out:?}");
}

// A program's signal handler touching region memory, at any moment.

static ALARM_BASE: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());

static ALARM_PAGES: AtomicUsize = AtomicUsize::new(0);

static ALARM_RNG: AtomicU64 = AtomicU64::new(0x9e37_79b9_7f4a_7c15);

static ALARM_READS: AtomicU64 = AtomicU64::new(0);

static ALARM_BAD: AtomicU64 = AtomicU64::new(0);

/// Handlers running now: the timer's signal is process-directed, so it
/// also lands on libtest's main thread, concurrently with the scenario.
static ALARM_ACTIVE: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_alarm(_sig: i32) {
    ALARM_ACTIVE.fetch_add(1, Ordering::SeqCst);
    alarm_read();
    ALARM_ACTIVE.fetch_sub(1, Ordering::SeqCst);
}

fn alarm_read() {
    let base = ALARM_BASE.load(Ordering::SeqCst);
    let pages = ALARM_PAGES.load(Ordering::SeqCst);
    if base.is_null() || pages == 0 {
        return;
    }
    let mut x = ALARM_RNG.load(Ordering::Relaxed);
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    ALARM_RNG.store(x, Ordering::Relaxed);
    let p = (x % pages as u64) as usize;
    let at = ((x >> 32) as usize % (PAGE_SIZE / 512)) * 512;
    // SAFETY: a byte of the live region the scenario published.
    let v = unsafe { std::ptr::read_volatile(base.add(p * PAGE_SIZE + at)) };
    ALARM_READS.fetch_add(1, Ordering::Relaxed);
    if v != pattern(p, at) {
        ALARM_BAD.fetch_add(1, Ordering::Relaxed);
    }
}

fn alarm_scenario(mode: FaultMode) {
    let swap = ram_swap(MIB, 32 * MIB, mode);
    let mut region = swap.map((8 * MIB) as usize).unwrap();
    let base = region.as_mut_slice().as_mut_ptr();
    let pages = region.len() / PAGE_SIZE;
    write_pages(base, 0..pages);
    ALARM_BASE.store(base, Ordering::Release);
    ALARM_PAGES.store(pages, Ordering::Release);
    // SAFETY: installs an async-signal-safe handler and a 20 us timer.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_alarm as *const () as usize;
        // On the alternate stack, as Rust's own handlers run: a fault in
        // it is delivered on top of it, and served on a spare stack.
        sa.sa_flags = libc::SA_RESTART | libc::SA_ONSTACK;
        libc::sigaction(libc::SIGALRM, &sa, std::ptr::null_mut());
        let t = libc::itimerval {
            it_interval: libc::timeval {
                tv_sec: 0,
                tv_usec: 20,
            },
            it_value: libc::timeval {
                tv_sec: 0,
                tv_usec: 20,
            },
        };
        libc::setitimer(libc::ITIMER_REAL, &t, std::ptr::null_mut());
    }
    // Map and unmap other regions meanwhile: those calls take the pager's
    // locks on this thread.
    for round in 0..6 {
        write_pages(base, 0..pages);
        if let Some(bad) = check_pages(base, 0..pages) {
            panic!("round {round}: {bad:?}");
        }
        let mut other = swap.map((2 * MIB) as usize).unwrap();
        write_pages(other.as_mut_slice().as_mut_ptr(), 0..512);
        drop(other);
    }
    // SAFETY: stops the timer.
    unsafe {
        let t: libc::itimerval = std::mem::zeroed();
        libc::setitimer(libc::ITIMER_REAL, &t, std::ptr::null_mut());
    }
    let reads = ALARM_READS.load(Ordering::Relaxed);
    let bad = ALARM_BAD.load(Ordering::Relaxed);
    eprintln!("{reads} reads from the SIGALRM handler, {bad} wrong");
    assert!(reads > 100 && bad == 0);
    // No handler may read the region once it goes: none starts reading
    // after this store, and those reading already finish first.
    ALARM_PAGES.store(0, Ordering::SeqCst);
    while ALARM_ACTIVE.load(Ordering::SeqCst) != 0 {
        std::hint::spin_loop();
    }
    drop(region);
    assert_all_returned(&swap, mode_name(mode));
}

#[test]
fn signal_handlers_touching_regions_do_not_deadlock() {
    if let Some(arg) = child::scenario() {
        alarm_scenario(mode_from(&arg));
        child::exit(0);
    }
    for mode in both_modes() {
        let out = child::run(
            "pager::tests::signals::signal_handlers_touching_regions_do_not_deadlock",
            mode_name(mode),
            // A deadlock never ends; a loaded machine makes the handler-
            // thread run (a wake-up per fault, a signal every 20 us) take
            // minutes: 4 copies of this test at once ran past 120 s.
            Duration::from_secs(300),
        );
        assert!(out.code == Some(0), "{mode:?}: {out:?}");
    }
}

/// uswap's own threads take none of the program's signals: a
/// process-directed signal must land on a program thread.  SIGSYS alone
/// stays open: the system-call guard's trap of a call glibc makes them
/// repeat (a credential change) would end the process on a thread that
/// blocks it.
#[test]
fn uswap_threads_block_every_signal() {
    for mode in both_modes() {
        let swap = ram_swap(MIB, 16 * MIB, mode);
        // A new thread names itself when it first runs, which on a busy
        // machine may be a while after `build` returns: look until then.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut seen = 0;
        while seen == 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
            seen = check_uswap_thread_masks(mode);
        }
        assert!(seen >= 1, "{mode:?}: no uswap thread found");
        drop(swap);
    }
}

/// Check the mask of every uswap thread of the process; returns how many.
fn check_uswap_thread_masks(mode: FaultMode) -> usize {
    let mut seen = 0;
    {
        for t in std::fs::read_dir("/proc/self/task").unwrap() {
            let t = t.unwrap().path();
            let comm = std::fs::read_to_string(t.join("comm")).unwrap_or_default();
            if !matches!(comm.trim(), "uswap-reclaim" | "uswap-fault") {
                continue;
            }
            let status = std::fs::read_to_string(t.join("status")).unwrap_or_default();
            let blk = status
                .lines()
                .find_map(|l| l.strip_prefix("SigBlk:"))
                .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
                .unwrap_or(0);
            // Everything but SIGKILL and SIGSTOP, which cannot be blocked
            // (bits 8 and 18), SIGSYS (bit 30), and the two glibc reserves.
            assert_eq!(
                blk & 0xffff_fffe_3ffb_feff,
                0xffff_fffe_3ffb_feff,
                "{mode:?}: {} blocks {blk:#x}",
                comm.trim()
            );
            assert_eq!(blk & (1 << 30), 0, "{mode:?}: {} blocks SIGSYS", comm.trim());
            seen += 1;
        }
    }
    seen
}

/// errno is the interrupted code's: a fault served in between must not
/// change it.
#[test]
fn faults_preserve_errno() {
    let swap = ram_swap(MIB, 32 * MIB, FaultMode::Sigbus);
    let mut region = swap.map((8 * MIB) as usize).unwrap();
    let base = region.as_mut_slice().as_mut_ptr() as usize;
    let pages = region.len() / PAGE_SIZE;
    write_pages(base as *mut u8, 0..pages);
    std::thread::scope(|s| {
        for t in 0..4 {
            s.spawn(move || {
                for p in 0..pages {
                    // SAFETY: errno is this thread's.
                    unsafe { *libc::__errno_location() = 4321 + t };
                    // SAFETY: a byte of a live region.
                    let v = unsafe { std::ptr::read_volatile((base as *const u8).add(p * PAGE_SIZE)) };
                    // SAFETY: as above.
                    let e = unsafe { *libc::__errno_location() };
                    assert_eq!(e, 4321 + t, "page {p}: errno changed by the fault");
                    assert_eq!(v, pattern(p, 0));
                }
            });
        }
    });
}

/// `kill -BUS` is not a fault: it goes to the program's disposition (here
/// Rust's own handler, which resets the action to the default), and
/// uswap keeps serving faults after it.
#[test]
fn kill_bus_is_not_a_fault() {
    if child::scenario().is_some() {
        let swap = ram_swap(MIB, 16 * MIB, FaultMode::Sigbus);
        let mut region = swap.map((4 * MIB) as usize).unwrap();
        let base = region.as_mut_slice().as_mut_ptr();
        write_pages(base, 0..1024);
        // Sent to this thread (tgkill, as `kill -BUS` reaches one thread of
        // the process), so that it is handled before the next access.
        // SAFETY: a signal to ourselves.
        unsafe { libc::raise(libc::SIGBUS) };
        eprintln!("alive after the first kill");
        assert_eq!(check_pages(base, 0..1024), None);
        eprintln!("verified");
        // The program's disposition is the default now: this one kills.
        // SAFETY: as above.
        unsafe { libc::raise(libc::SIGBUS) };
        eprintln!("alive after the second kill");
        child::exit(0);
    }
    let out = child::run(
        "pager::tests::signals::kill_bus_is_not_a_fault",
        "go",
        Duration::from_secs(30),
    );
    assert!(out.stderr.contains("verified"), "{out:?}");
    assert_eq!(out.signal, Some(libc::SIGBUS), "{out:?}");
    assert!(!out.stderr.contains("second kill"), "{out:?}");
}

// Stacks: the handler runs on the thread's alternate signal stack
// (SA_ONSTACK), which is how a region can be a coroutine's stack, and
// moves back onto an ordinary interrupted stack to serve, which is how it
// fits in Rust's 8 KiB alternate stacks.

/// Run `f` on this thread with an alternate signal stack of `size` bytes
/// painted with a known byte; returns how many bytes of it were used.
fn altstack_use(size: usize, f: impl FnOnce()) -> usize {
    const PAINT: u8 = 0xa5;
    let mut alt = vec![PAINT; size];
    let ss = libc::stack_t {
        ss_sp: alt.as_mut_ptr().cast(),
        ss_flags: 0,
        ss_size: size,
    };
    // SAFETY: zeroed is a valid stack_t to receive the old one.
    let mut old: libc::stack_t = unsafe { std::mem::zeroed() };
    // SAFETY: `alt` outlives its use: the old stack is put back below.
    assert_eq!(unsafe { libc::sigaltstack(&ss, &mut old) }, 0);
    f();
    // SAFETY: restores what this thread had.
    assert_eq!(unsafe { libc::sigaltstack(&old, std::ptr::null_mut()) }, 0);
    size - alt.iter().position(|&b| b != PAINT).unwrap_or(size)
}

/// Faults on an ordinary stack use little of the alternate stack (the
/// kernel's frame and the handler's first steps): the rest runs on the
/// interrupted stack.  Rust gives its threads 8 KiB.
#[test]
fn faults_fit_in_a_small_alternate_stack() {
    let dir = tempfile::tempdir().unwrap();
    let mut worst = 0;
    for (name, huge, file) in [
        ("ram", false, false),
        ("file", false, true),
        ("ram-units", true, false),
        ("file-units", true, true),
    ] {
        let path = dir.path().join(name);
        let used = std::thread::spawn(move || {
            altstack_use(256 << 10, || {
                let dev = if file {
                    SwapDeviceSpec::file(FileOptions::new(path, 64 * MIB / PAGE_SIZE as u64))
                } else {
                    SwapDeviceSpec::ram(64 * MIB)
                };
                // Direct reclaim and IO on the faulting thread.
                let swap = Swap::builder()
                    .budget(4 * MIB)
                    .device(dev)
                    .background_reclaim(false)
                    .build()
                    .unwrap();
                let mut region = if huge {
                    swap.map_huge((16 * MIB) as usize).unwrap()
                } else {
                    swap.map((16 * MIB) as usize).unwrap()
                };
                let pages = region.len() / PAGE_SIZE;
                let base = region.as_mut_slice().as_mut_ptr();
                write_pages(base, 0..pages);
                assert_eq!(check_pages(base, 0..pages), None);
            })
        })
        .join()
        .unwrap();
        eprintln!("{name}: {used} bytes of the alternate signal stack");
        worst = worst.max(used);
    }
    assert!(
        worst <= 7 << 10,
        "{worst} bytes: too close to Rust's 8 KiB alternate stacks"
    );
}

static CO_DEPTH: AtomicUsize = AtomicUsize::new(0);

static CO_BAD: AtomicU64 = AtomicU64::new(u64::MAX);

static CO_MAIN: AtomicPtr<libc::ucontext_t> = AtomicPtr::new(std::ptr::null_mut());

static CO_SELF: AtomicPtr<libc::ucontext_t> = AtomicPtr::new(std::ptr::null_mut());

/// Recurse `depth` frames of 1 KiB, switch back to the main context at
/// the bottom (which evicts this stack meanwhile), and check every frame
/// on the way up.
#[inline(never)]
fn descend(depth: usize) -> u64 {
    let mut frame = [0u8; 1024];
    for (i, b) in frame.iter_mut().enumerate() {
        *b = (depth as u8) ^ (i as u8);
    }
    std::hint::black_box(&mut frame);
    let below = if depth == 0 {
        // SAFETY: both contexts are live: CO_SELF is this one, CO_MAIN the
        // thread's, which switches back here.
        unsafe { libc::swapcontext(CO_SELF.load(Ordering::Acquire), CO_MAIN.load(Ordering::Acquire)) };
        0
    } else {
        descend(depth - 1)
    };
    std::hint::black_box(&mut frame);
    let ok = frame
        .iter()
        .enumerate()
        .all(|(i, &b)| b == (depth as u8) ^ (i as u8));
    below + u64::from(!ok)
}

extern "C" fn coroutine() {
    CO_BAD.store(descend(CO_DEPTH.load(Ordering::Acquire)), Ordering::Release);
}

/// A coroutine whose stack is region memory, evicted while it is
/// suspended deep down, comes back up it intact; its faults are delivered
/// on the thread's alternate stack and served on a spare stack, so they
/// use as little of the alternate stack as any other fault.
#[test]
fn a_region_can_be_a_coroutine_stack() {
    if child::scenario().is_some() {
        let swap = ram_swap(MIB, 32 * MIB, FaultMode::Sigbus);
        let mut stack = swap.map((2 * MIB) as usize).unwrap();
        let mut flood = swap.map((8 * MIB) as usize).unwrap();
        let stack_base = stack.as_mut_slice().as_mut_ptr();
        let stack_len = stack.len();
        let flood_base = flood.as_mut_slice().as_mut_ptr() as usize;
        let used = altstack_use(256 << 10, || {
            // SAFETY: zeroed ucontext_t values, filled by getcontext; the
            // coroutine's stack is the region, alive until after it ends;
            // uc_link brings it back here when it returns.
            unsafe {
                let main: *mut libc::ucontext_t = Box::into_raw(Box::new(std::mem::zeroed()));
                let co: *mut libc::ucontext_t = Box::into_raw(Box::new(std::mem::zeroed()));
                assert_eq!(libc::getcontext(co), 0);
                (*co).uc_stack.ss_sp = stack_base.cast();
                (*co).uc_stack.ss_size = stack_len;
                (*co).uc_link = main;
                libc::makecontext(co, coroutine, 0);
                CO_MAIN.store(main, Ordering::Release);
                CO_SELF.store(co, Ordering::Release);
                CO_DEPTH.store(600, Ordering::Release);
                // Down 600 frames (600 KiB of region stack), and back here.
                assert_eq!(libc::swapcontext(main, co), 0);
                // Evict the coroutine's stack.
                for _ in 0..3 {
                    write_pages(flood_base as *mut u8, 0..2048);
                }
                eprintln!("stack evicted: {} swap-ins so far", swap.stats().counters.swapins);
                // Up again, to the end, and back here through uc_link.
                assert_eq!(libc::swapcontext(main, co), 0);
                drop(Box::from_raw(main));
                drop(Box::from_raw(co));
            }
        });
        let bad = CO_BAD.load(Ordering::Acquire);
        assert_eq!(bad, 0, "{bad} frames came back wrong");
        let st = swap.stats();
        assert!(
            st.counters.swapins + st.counters.swapcache_hits > 0,
            "{:?}",
            st.counters
        );
        eprintln!("up the swapped stack: {used} bytes of the alternate stack");
        assert!(
            used <= 7 << 10,
            "{used} bytes: too close to Rust's 8 KiB alternate stacks"
        );
        drop(flood);
        drop(stack);
        child::exit(0);
    }
    let out = child::run(
        "pager::tests::signals::a_region_can_be_a_coroutine_stack",
        "go",
        Duration::from_secs(60),
    );
    out.assert_success();
    let line = out.stderr.lines().find(|l| l.contains("up the swapped stack"));
    eprintln!("{}", line.unwrap_or_else(|| panic!("{out:?}")));
}

/// An ordinary user pages memory too: without the privilege for kernel
/// faults (not root, `vm.unprivileged_userfaultfd=0`, no access to
/// /dev/userfaultfd) SIGBUS mode opens its userfaultfd for user-mode faults
/// only, which any user may, and every page written reads back after
/// eviction, on a RAM device and on a swap file; handler-thread mode,
/// which must serve the kernel's faults too, is refused in one line that
/// says what to do.  Run as `nobody` in a child when this is root; as
/// this user otherwise.
#[test]
fn an_ordinary_user_swaps_in_sigbus_mode() {
    if let Some(dir) = child::scenario() {
        // SAFETY: no preconditions.
        let (uid, euid) = unsafe { (libc::getuid(), libc::geteuid()) };
        eprintln!("uid {uid} euid {euid}");
        for device in [
            SwapDeviceSpec::ram(64 * MIB),
            SwapDeviceSpec::file(crate::io::FileOptions::new(
                std::path::Path::new(&dir).join("swap"),
                64 * MIB / 4096,
            )),
        ] {
            let swap = Swap::builder().budget(4 * MIB).device(device).build().unwrap();
            if euid != 0 && privileged_uffd_refused() {
                assert!(
                    swap.user_mode_only(),
                    "an unprivileged SIGBUS-mode uffd is user-mode only"
                );
            }
            let mut region = swap.map((16 * MIB) as usize).unwrap();
            for (p, page) in region.as_mut_slice().chunks_mut(PAGE_SIZE).enumerate() {
                page.fill(p as u8 ^ 0x3c);
            }
            for (p, page) in region.as_slice().chunks(PAGE_SIZE).enumerate() {
                assert!(
                    page.iter().all(|&b| b == p as u8 ^ 0x3c),
                    "page {p} lost its data"
                );
            }
            let st = swap.stats();
            assert!(st.counters.evictions > 2048, "{:?}", st.counters);
            assert!(
                st.counters.swapins + st.counters.readahead > 1024,
                "{:?}",
                st.counters
            );
            drop(region);
            assert_all_returned(&swap, "unprivileged");
        }
        if euid != 0 && privileged_uffd_refused() {
            let e = Swap::builder()
                .budget(4 * MIB)
                .device(SwapDeviceSpec::ram(16 * MIB))
                .fault_mode(FaultMode::HandlerThread)
                .build()
                .err()
                .expect("handler-thread mode needs kernel faults");
            let msg = e.to_string();
            assert!(
                msg.contains("handler-thread mode") && msg.contains("SIGBUS mode"),
                "{msg}"
            );
            eprintln!("handler-thread mode refused: {msg}");
        }
        eprintln!("unprivileged run done");
        child::exit(0);
    }
    let dir = tempfile::tempdir().unwrap();
    // SAFETY: no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let nobody = (65534, 65534);
    if root {
        std::os::unix::fs::chown(dir.path(), Some(nobody.0), Some(nobody.1)).unwrap();
    }
    let out = child::run_as(
        "pager::tests::signals::an_ordinary_user_swaps_in_sigbus_mode",
        dir.path().to_str().unwrap(),
        std::time::Duration::from_secs(120),
        root.then_some(nobody),
    );
    out.assert_success();
    assert!(out.stderr.contains("unprivileged run done"), "{out:?}");
    if root && privileged_uffd_refused_to(nobody.0) {
        assert!(out.stderr.contains("handler-thread mode refused"), "{out:?}");
    }
}

/// Whether this process would be refused a userfaultfd that serves kernel
/// faults (so gets a user-mode-only one).
fn privileged_uffd_refused() -> bool {
    crate::uffd::Uffd::open(crate::uffd::Features::NONE, false).is_err()
}

/// Whether a process of user `uid` would be: the sysctl, and /dev/userfaultfd's
/// owner and mode (root only, on a stock system).
fn privileged_uffd_refused_to(uid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    let sysctl = std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd").unwrap_or_default();
    let dev_open =
        std::fs::metadata("/dev/userfaultfd").is_ok_and(|m| m.uid() == uid || m.mode() & 0o006 == 0o006);
    sysctl.trim() == "0" && !dev_open
}
