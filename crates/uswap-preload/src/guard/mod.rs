//! The system-call guard: no system call fails with `EFAULT` because a
//! buffer of the heap is out, in SIGBUS mode.
//!
//! In SIGBUS mode uswap serves the program's own accesses only: the
//! kernel, meeting a heap page that is out (or storing into a clean page,
//! which is write-protected to see the first write), fails the call with
//! `EFAULT`, and no user-mode-only userfaultfd could serve it anyway.
//! Interposing libc's functions one by one leaves a long tail (a hundred
//! and fifty calls take buffers) and misses the calls libc makes inside
//! itself (`fflush` writing a `setvbuf` buffer, `system`, `getaddrinfo`)
//! and raw `syscall(2)`s.  So the kernel is asked to tell us instead:
//!
//! - the heap lives at a known place: whole 4 GiB blocks at a random
//!   address between 64 and 68 TiB, far below where the kernel puts
//!   mappings and above where V8 and Go put theirs ([`place`]); the rest
//!   of its last block is reserved, inaccessible;
//! - a seccomp filter (`filter.rs`) traps every call of the table
//!   (`table.rs`) one of whose buffer arguments points into those blocks,
//!   and every call whose buffers hide behind a vector (`readv`,
//!   `sendmsg`), with SIGSYS; everything else passes at the cost of the
//!   filter (a binary search, about ten BPF instructions);
//! - the SIGSYS handler ([`on_sigsys`]) brings the buffers in and pins
//!   them (as the interposed calls do, `calls.rs`), makes the call itself
//!   from the one `syscall` instruction the filter lets through (a page
//!   of its own, [`TRAMPOLINE`]), with the interrupted code's signal mask
//!   (a blocking call stays interruptible, and `SA_RESTART` restarts it),
//!   unpins, and returns its result as the call's.
//!
//! The hot calls (`read`, `write`, `recv`, `send`, the `stat` family)
//! are interposed and issued from the trampoline directly (`calls.rs`):
//! no signal.  The rest cost one signal each when they meet the heap.
//!
//! A filter cannot be taken back and passes to every child, through
//! `exec`: a child that is not paged maps the trampoline at the same
//! place and passes its traps straight through ([`start_inherited`]); a
//! program that maps nothing at 64 TiB (none does) never sees one.  An
//! ordinary user may install a filter only with no-new-privileges set
//! (`PR_SET_NO_NEW_PRIVS`), which passes to children too: set-user-ID
//! programs run under `uswap run` in SIGBUS mode run without their
//! privileges (`exec` says so, `calls.rs`); `--syscall-guard off` turns
//! the guard off.

pub(crate) mod filter;
pub(crate) mod table;

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

use libc::{c_int, c_long, c_void};
use uswap::pager::Pinned;

use table::{Buf, Len};
use uswap::run_env::GuardLayout;

/// The guarded range `[lo << 32, hi << 32)` (0, 0: no guard).
static RANGE: (AtomicU64, AtomicU64) = (AtomicU64::new(0), AtomicU64::new(0));

use crate::syscalls::TRAMPOLINE;

/// Whether the guard runs in this process, paging its heap: the
/// interposed calls then make their system calls from its trampoline.
pub(crate) fn active() -> bool {
    RANGE.1.load(Ordering::Relaxed) != 0 && crate::running::RUNNING.get().is_some()
}

/// The guarded layout around a heap mapped at `g.base`: the rest of its
/// last block reserved, inaccessible, and the trampoline page below it.
/// An error says which mapping failed.
pub(crate) fn place(g: &GuardLayout) -> Result<(), String> {
    let end = u64::from(g.hi()) << 32;
    let tail = (g.base + g.len).next_multiple_of(uswap::PAGE_SIZE as u64);
    if end > tail {
        reserve(tail, end - tail)
            .map_err(|e| format!("reserving the heap's guarded tail at {tail:#x}: {e}"))?;
    }
    map_trampoline(g.trampoline())
        .map_err(|e| format!("mapping the system-call trampoline at {:#x}: {e}", g.trampoline()))
}

/// An inaccessible reservation of `[at, at + len)`.
fn reserve(at: u64, len: u64) -> std::io::Result<()> {
    // SAFETY: a fresh mapping where nothing is (refused otherwise).
    let p = unsafe {
        libc::mmap(
            at as *mut c_void,
            len as usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Map the trampoline page at `at`: a copy of this library's raw system
/// call (position-independent), read-only and executable.
fn map_trampoline(at: u64) -> std::io::Result<()> {
    let (code, len) = crate::syscalls::raw_code();
    // SAFETY: a fresh page where nothing is; the code is copied into it
    // before it becomes executable, and never written again.
    unsafe {
        let p = libc::mmap(
            at as *mut c_void,
            uswap::PAGE_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        std::ptr::copy_nonoverlapping(code, p.cast::<u8>(), len);
        if libc::mprotect(p, uswap::PAGE_SIZE, libc::PROT_READ | libc::PROT_EXEC) != 0 {
            let e = std::io::Error::last_os_error();
            libc::munmap(p, uswap::PAGE_SIZE);
            return Err(e);
        }
        TRAMPOLINE.store(p, Ordering::Release);
    }
    Ok(())
}

/// The address after the trampoline's `syscall` instruction: where the
/// kernel says the call came from.
fn allowed_ip() -> u64 {
    TRAMPOLINE.load(Ordering::Acquire) as u64 + crate::syscalls::raw_return_offset() as u64
}

/// Install the SIGSYS handler, and the filter on this thread unless this
/// process has it already (a later image of it: one filter more than
/// `g.filters`).  On the main thread, before the program runs: its
/// threads inherit the filter; uswap's, started already, do not.
pub(crate) fn start(g: &GuardLayout) -> Result<(), String> {
    RANGE.1.store(u64::from(g.hi()), Ordering::Relaxed);
    RANGE.0.store(u64::from(g.lo()), Ordering::Relaxed);
    install_handler()?;
    if uswap::run_env::seccomp_filters() > g.filters {
        return Ok(());
    }
    let prog = filter::program(table::CALLS, g.lo(), g.hi(), allowed_ip());
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    let install = || {
        // SAFETY: the seccomp system call with a valid program.
        unsafe {
            crate::syscalls::raw(
                libc::SYS_seccomp,
                [
                    libc::SECCOMP_SET_MODE_FILTER as c_long,
                    0,
                    &fprog as *const _ as c_long,
                    0,
                    0,
                    0,
                ],
            )
        }
    };
    let mut rc = install();
    if rc == -(libc::EACCES as c_long) {
        // Without CAP_SYS_ADMIN a filter needs no-new-privileges.
        // SAFETY: a prctl with constant arguments.
        if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
            return Err(format!(
                "cannot set no-new-privileges for the system-call guard: {}",
                std::io::Error::last_os_error()
            ));
        }
        rc = install();
    }
    if rc < 0 {
        return Err(format!(
            "the kernel refused the system-call guard's seccomp filter ({}); run with --syscall-guard off",
            std::io::Error::from_raw_os_error(-rc as i32)
        ));
    }
    Ok(())
}

/// A process of the run that is not paged (past an `exec`), which has
/// the filter: the trampoline at its place, and a handler that makes its
/// trapped calls there (none of its memory is paged, nothing is pinned).
/// Best effort: nothing of its own maps at 64 TiB, so it sees no traps.
pub(crate) fn start_inherited(g: &GuardLayout) {
    if uswap::run_env::seccomp_filters() <= g.filters || map_trampoline(g.trampoline()).is_err() {
        return;
    }
    RANGE.1.store(u64::from(g.hi()), Ordering::Relaxed);
    RANGE.0.store(u64::from(g.lo()), Ordering::Relaxed);
    let _ = install_handler();
}

fn install_handler() -> Result<(), String> {
    // SAFETY: zeroed is a valid sigaction; the fields are filled in.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = on_sigsys as *const () as usize;
    // On the alternate stack: a trap from code on a small stack (a Go
    // goroutine's is 2 KiB to start with) would otherwise push the frame
    // and this handler's work past its end (a cgo binary's first `write`
    // of a heap buffer corrupted the goroutine below it).  In SIGBUS mode
    // every thread has one (`signals::give_own_stack`, 64 KiB) unless the
    // program set its own.
    sa.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER | libc::SA_ONSTACK;
    // Every signal blocked while the buffers are brought in, but SIGBUS,
    // through which they are (and SIGSYS: a trap while it is blocked
    // would kill).
    // SAFETY: sigset operations on a local set.
    unsafe {
        libc::sigfillset(&mut sa.sa_mask);
        libc::sigdelset(&mut sa.sa_mask, libc::SIGBUS);
        libc::sigdelset(&mut sa.sa_mask, libc::SIGSYS);
    }
    let f = next!("sigaction" as fn(c_int, *const libc::sigaction, *mut libc::sigaction) -> c_int);
    // SAFETY: installs a valid action.
    if unsafe { f(libc::SIGSYS, &sa, std::ptr::null_mut()) } != 0 {
        return Err(format!(
            "installing the SIGSYS handler: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// The program's SIGSYS action, while the guard's handler is in front:
/// a leaked copy (a program changes it once or never); null: SIG_DFL.
static PROGRAM: AtomicPtr<libc::sigaction> = AtomicPtr::new(std::ptr::null_mut());

/// `sigaction(SIGSYS, new, old)` while the guard's handler is in front:
/// the program's disposition, kept behind it.  False when there is no
/// guard (the call is the kernel's).
pub(crate) fn program_action(new: Option<&libc::sigaction>, old: Option<&mut libc::sigaction>) -> bool {
    if RANGE.1.load(Ordering::Relaxed) == 0 {
        return false;
    }
    if let Some(old) = old {
        let p = PROGRAM.load(Ordering::Acquire);
        *old = if p.is_null() {
            // SAFETY: zeroed is SIG_DFL with no flags.
            unsafe { std::mem::zeroed() }
        } else {
            // SAFETY: a leaked copy, never freed.
            unsafe { *p }
        };
    }
    if let Some(new) = new {
        PROGRAM.store(Box::into_raw(Box::new(*new)), Ordering::Release);
    }
    true
}

/// The SIGSYS handler.
extern "C" fn on_sigsys(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // SAFETY: errno is this thread's.
    let errno = unsafe { *libc::__errno_location() };
    // SAFETY: an SA_SIGINFO handler's siginfo; for SIGSYS, `si_errno` is
    // the filter's data.
    let (code, data) = unsafe { ((*info).si_code, (*info).si_errno) };
    const SYS_SECCOMP: c_int = 1;
    if code != SYS_SECCOMP || data != c_int::from(filter::MARK) || ctx.is_null() {
        pass_on(sig, info, ctx);
    } else {
        // SAFETY: the ucontext of this delivery, ours to change: its
        // registers are what the interrupted code resumes with.
        let uc = unsafe { &mut *ctx.cast::<libc::ucontext_t>() };
        let g = &mut uc.uc_mcontext.gregs;
        // After a trap the kernel restores the number into rax.
        let nr = g[libc::REG_RAX as usize];
        let args = [
            g[libc::REG_RDI as usize],
            g[libc::REG_RSI as usize],
            g[libc::REG_RDX as usize],
            g[libc::REG_R10 as usize],
            g[libc::REG_R8 as usize],
            g[libc::REG_R9 as usize],
        ];
        let mask = uc.uc_sigmask;
        // Around the guard's own work only (not the program's handler in
        // `pass_on`, which may leave by `siglongjmp`).
        let _scope = uswap::pager::HandlerScope::enter();
        uc.uc_mcontext.gregs[libc::REG_RAX as usize] = if uswap::pager::on_uswap_thread() {
            // One of uswap's threads, made to repeat a call of the
            // program's (glibc's credential broadcast): it cannot bring
            // a page in (it blocks SIGBUS), so the call goes as it is.
            call_unmasked(nr, args, &mask)
        } else {
            serve(nr, args, &mask)
        };
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// A SIGSYS that is not the guard's: the program's disposition.
fn pass_on(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    let p = PROGRAM.load(Ordering::Acquire);
    // SAFETY: a leaked copy, or null.
    let action = if p.is_null() { None } else { Some(unsafe { *p }) };
    match action.map_or(libc::SIG_DFL, |a| a.sa_sigaction) {
        libc::SIG_IGN => {}
        libc::SIG_DFL => {
            // The kernel's default: the end, with a core.
            let f = next!("sigaction" as fn(c_int, *const libc::sigaction, *mut libc::sigaction) -> c_int);
            // SAFETY: zeroed is SIG_DFL; then the signal again, unblocked.
            unsafe {
                let dfl: libc::sigaction = std::mem::zeroed();
                f(libc::SIGSYS, &dfl, std::ptr::null_mut());
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, libc::SIGSYS);
                libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
                libc::raise(libc::SIGSYS);
            }
        }
        handler => {
            let a = action.expect("a handler is an action");
            // SAFETY: the program installed this function as a SIGSYS
            // handler of the kind its flags say; called as the kernel would.
            unsafe {
                if a.sa_flags & libc::SA_SIGINFO != 0 {
                    let f: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) =
                        std::mem::transmute(handler);
                    f(sig, info, ctx);
                } else {
                    let f: extern "C" fn(c_int) = std::mem::transmute(handler);
                    f(sig);
                }
            }
        }
    }
}

/// Pins held for one call: on the stack of the handler (it allocates
/// nothing).  Past its room, buffers are brought in without a pin (the
/// call may then, rarely, still meet one taken out meanwhile).
struct PinSet {
    pins: [Option<Pinned<'static>>; 64],
    n: usize,
}

impl PinSet {
    fn new() -> PinSet {
        PinSet {
            pins: [const { None }; 64],
            n: 0,
        }
    }

    /// Pin `[addr, addr + len)` where it is in the heap.
    fn add(&mut self, addr: u64, len: u64, write: bool) {
        let Some(p) = crate::pins::span(addr as usize, len as usize, write) else {
            return;
        };
        if self.n < self.pins.len() {
            self.pins[self.n] = Some(p);
            self.n += 1;
        }
        // Else `p` drops here: brought in, not held.
    }
}

/// Whether `addr` is in the guarded range.
fn guarded(addr: u64) -> bool {
    let hi32 = addr >> 32;
    hi32 >= RANGE.0.load(Ordering::Relaxed) && hi32 < RANGE.1.load(Ordering::Relaxed)
}

/// Read a `T` the program passed (it may be in the heap: reading it is
/// the program's own access, served as one).
fn read<T: Copy>(at: u64) -> T {
    // SAFETY: the program's argument, read as the kernel would; a bad
    // pointer faults here as it would have failed the call.
    unsafe { std::ptr::read_unaligned(at as *const T) }
}

/// Calls that may return less than asked (`getrandom` past 256 bytes,
/// `getdents64`): a buffer past the pinning chunk is cut to it, so that
/// it is not pinned whole.
const SHORTENABLE: [i64; 2] = [libc::SYS_getrandom, libc::SYS_getdents64];

/// Calls whose buffer past the pinning chunk is transferred a chunk at a
/// time, as `calls.rs`'s `read` and `write` do, whole: (number, buffer
/// argument, length argument, offset argument or 6, stores).
const CHUNKED: [(i64, usize, usize, usize, bool); 4] = [
    (libc::SYS_read, 1, 2, 6, true),
    (libc::SYS_write, 1, 2, 6, false),
    (libc::SYS_pread64, 1, 2, 3, true),
    (libc::SYS_pwrite64, 1, 2, 3, false),
];

/// Make trapped call `nr` with `args`, its buffers pinned, under the
/// interrupted `mask`: the kernel's answer.
fn serve(nr: i64, mut args: [i64; 6], mask: &libc::sigset_t) -> i64 {
    let chunk = crate::pins::chunk().unwrap_or(usize::MAX) as i64;
    if let Some(&(_, buf, len, off, store)) = CHUNKED.iter().find(|c| c.0 == nr) {
        if args[len] > chunk && guarded(args[buf] as u64) {
            return chunked(nr, args, (buf, len, off, store), chunk, mask);
        }
    }
    let mut pins = PinSet::new();
    if let Some(call) = table::lookup(nr) {
        if SHORTENABLE.contains(&nr) {
            let (buf, len) = if nr == libc::SYS_getrandom { (0, 1) } else { (1, 2) };
            if guarded(args[buf] as u64) {
                args[len] = args[len].min(chunk);
            }
        }
        for &(i, b) in call.args {
            pin_arg(&mut pins, b, args[usize::from(i)] as u64, &args);
        }
    }
    let r = call_unmasked(nr, args, mask);
    drop(pins);
    if r >= 0 && table::UNPAGING.contains(&nr) {
        stop_paging(nr);
    }
    r
}

/// The program set up IO that the kernel's workers do later (an
/// io_uring, a kernel AIO context), into buffers no pin or trap will see
/// (`io_submit`'s, an io_uring's submission queue, which it fills without
/// a call): SIGBUS mode's userfaultfd would fail such a worker's access
/// to a page that is out, or never written, with `EFAULT`.  So, before
/// the set-up call returns, the process stops paging (`Swap::stop_paging`:
/// every page in, the heap plain memory from now on), and says so once.
/// After the call, not before: a call refused (a container's seccomp
/// profile refuses `io_uring_setup`) leaves the process paged.  A second
/// thread's set-up meanwhile waits for the first's to finish: its IO must
/// not start while pages are still out.  A forked child inherits both
/// flags, and an instance that stopped paging.
fn stop_paging(nr: i64) {
    static STARTED: AtomicBool = AtomicBool::new(false);
    static DONE: AtomicBool = AtomicBool::new(false);
    let Some(run) = crate::running::RUNNING.get() else {
        return;
    };
    if STARTED.swap(true, Ordering::AcqRel) {
        while !DONE.load(Ordering::Acquire) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        return;
    }
    let what = if nr == libc::SYS_io_uring_setup {
        "an io_uring"
    } else {
        "kernel AIO (io_setup)"
    };
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    match run.swap.stop_paging() {
        Ok(bytes) => uswap::pager::say_line(format_args!(
            "uswap run: pid {pid} set up {what}, whose buffers the kernel reads and writes later, where SIGBUS mode cannot bring a page in: its memory is no longer paged ({} MiB brought back in); to keep it paged, run it with --mode handler (as root)",
            bytes >> 20
        )),
        Err(e) => uswap::pager::say_line(format_args!(
            "uswap run: pid {pid} set up {what}, whose buffers the kernel reads and writes later, where SIGBUS mode cannot bring a page in: {e}; run it with --mode handler (as root)"
        )),
    }
    DONE.store(true, Ordering::Release);
}

/// The call itself, from the trampoline, under the interrupted code's
/// `mask` (the kernel's 8-byte set is the first word of libc's): a
/// blocking call stays interruptible by the program's signals.
fn call_unmasked(nr: i64, args: [i64; 6], mask: &libc::sigset_t) -> i64 {
    let mut saved = [0u64; 1];
    // SAFETY: this thread's mask, set for the call and restored after;
    // the call with the program's own arguments.
    unsafe {
        crate::syscalls::raw(
            libc::SYS_rt_sigprocmask,
            [
                libc::SIG_SETMASK as i64,
                mask as *const _ as i64,
                saved.as_mut_ptr() as i64,
                8,
                0,
                0,
            ],
        );
        let r = crate::syscalls::raw(nr, args);
        crate::syscalls::raw(
            libc::SYS_rt_sigprocmask,
            [libc::SIG_SETMASK as i64, saved.as_ptr() as i64, 0, 8, 0, 0],
        );
        r
    }
}

/// A `read`, `write`, `pread64` or `pwrite64` of a heap buffer longer than
/// the pinning chunk, a chunk at a time, each pinned for its piece, as
/// one call would: the bytes moved, or the first piece's error.  Reads go
/// on past a full chunk only on regular files, where more is there (a
/// pipe's reader would wait for data the single call would not have);
/// writes go on until done or cut short.
fn chunked(
    nr: i64,
    args: [i64; 6],
    (buf, len, off, store): (usize, usize, usize, bool),
    chunk: i64,
    mask: &libc::sigset_t,
) -> i64 {
    let go_on = !store || {
        // SAFETY: zeroed is a valid stat.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat of the call's descriptor into a local.
        let r =
            unsafe { crate::syscalls::raw(libc::SYS_fstat, [args[0], &mut st as *mut _ as i64, 0, 0, 0, 0]) };
        r == 0 && st.st_mode & libc::S_IFMT == libc::S_IFREG
    };
    let mut done = 0i64;
    loop {
        let piece = (args[len] - done).min(chunk);
        let mut a = args;
        a[buf] += done;
        a[len] = piece;
        if off < 6 {
            a[off] += done;
        }
        let r = {
            let mut pins = PinSet::new();
            pins.add(a[buf] as u64, piece as u64, store);
            call_unmasked(nr, a, mask)
        };
        if r < 0 {
            return if done > 0 { done } else { r };
        }
        done += r;
        if r < piece || done == args[len] || !go_on {
            return done;
        }
    }
}

/// The length `len` of a buffer at `at`, given the call's arguments.
fn length(len: Len, at: u64, args: &[i64; 6]) -> u64 {
    let a = |j: u8| args[usize::from(j)] as u64;
    match len {
        Len::Bytes(n) => n as u64,
        Len::Arg(j) => a(j),
        Len::ArgTimes(j, m) => a(j).saturating_mul(m as u64),
        Len::ArgPlus(j, m) => a(j).saturating_add(m as u64),
        Len::AtArg(j) if a(j) != 0 => u64::from(read::<u32>(a(j))),
        Len::AtArg(_) => 0,
        Len::Bits(j) => a(j).div_ceil(64) * 8,
        Len::PagesOf(j) => a(j).div_ceil(uswap::PAGE_SIZE as u64),
        Len::Page => uswap::PAGE_SIZE as u64 - at % uswap::PAGE_SIZE as u64,
        Len::Ioctl => {
            let req = a(1) as u32;
            let (dir, size) = (req >> 30, (req >> 16) & 0x3fff);
            if dir != 0 && size != 0 {
                u64::from(size)
            } else {
                uswap::PAGE_SIZE as u64 - at % uswap::PAGE_SIZE as u64
            }
        }
    }
}

/// Pin what argument `v`, a `b`, makes the kernel touch.
fn pin_arg(pins: &mut PinSet, b: Buf, v: u64, args: &[i64; 6]) {
    if v == 0 {
        return;
    }
    match b {
        Buf::Read(len) if guarded(v) => pins.add(v, length(len, v, args), false),
        Buf::Write(len) if guarded(v) => pins.add(v, length(len, v, args), true),
        Buf::Str if guarded(v) => {
            // SAFETY: the program's C string; reading it is its access.
            let n = unsafe { libc::strlen(v as *const libc::c_char) } as u64 + 1;
            pins.add(v, n, false);
        }
        Buf::Iov { count, store } => pin_iov(pins, v, args[usize::from(count)] as u64, store),
        Buf::Msg { store } => pin_msg(pins, v, store),
        Buf::MMsg { count, store } => {
            let n = (args[usize::from(count)] as u64).min(1024);
            if guarded(v) {
                pins.add(v, n * 64, true);
            }
            for k in 0..n {
                pin_msg(pins, v + 64 * k, store);
            }
        }
        _ => {}
    }
}

/// Pin an iovec array of `n` entries at `v` and its buffers.
fn pin_iov(pins: &mut PinSet, v: u64, n: u64, store: bool) {
    let n = n.min(1024);
    if guarded(v) {
        pins.add(v, n * 16, false);
    }
    for k in 0..n {
        let iov: libc::iovec = read(v + 16 * k);
        if guarded(iov.iov_base as u64) {
            pins.add(iov.iov_base as u64, iov.iov_len as u64, store);
        }
    }
}

/// Pin a `msghdr` at `v`: itself (the kernel writes its lengths and flags
/// on receipt), its name, its vector, its control data.
fn pin_msg(pins: &mut PinSet, v: u64, store: bool) {
    if guarded(v) {
        pins.add(v, std::mem::size_of::<libc::msghdr>() as u64, store);
    }
    let m: libc::msghdr = read(v);
    if guarded(m.msg_name as u64) {
        pins.add(m.msg_name as u64, u64::from(m.msg_namelen), store);
    }
    if guarded(m.msg_control as u64) {
        pins.add(m.msg_control as u64, m.msg_controllen as u64, store);
    }
    pin_iov(pins, m.msg_iov as u64, m.msg_iovlen as u64, store);
}

#[cfg(test)]
mod tests {
    use super::filter::{program, run, trap, ALLOW};
    use super::table::CALLS;

    /// The filter, run by a small BPF interpreter on every call of the
    /// table and some that are not in it: a buffer argument in the range
    /// traps, anywhere else passes, the allowed address always passes,
    /// vectors always trap, futex wakes pass.
    #[test]
    fn the_filter_traps_exactly_the_buffers_in_the_range() {
        let (lo, hi) = (0x4000u32, 0x4003u32);
        let ip = 0x3fff_ffff_f01au64;
        let prog = program(CALLS, lo, hi, ip);
        // The kernel takes at most 4096; room is left for the table to grow.
        assert!(prog.len() < 2048, "{} instructions", prog.len());
        eprintln!("filter: {} instructions", prog.len());
        let inside = (u64::from(lo) << 32) + 0x1234;
        let last = (u64::from(hi) << 32) - 1;
        let outside = [
            0x7fff_0000_0000u64,
            (u64::from(hi) << 32),
            (u64::from(lo) << 32) - 1,
            1 << 20,
        ];
        for c in CALLS {
            let nr = c.nr as i32;
            let base = [0u64; 6];
            if c.always() {
                assert_eq!(run(&prog, nr, 0x1000, base), trap(), "{}", c.name);
                assert_eq!(run(&prog, nr, ip, base), ALLOW, "{} from the trampoline", c.name);
                continue;
            }
            assert_eq!(
                run(&prog, nr, 0x1000, base),
                ALLOW,
                "{} with null buffers",
                c.name
            );
            for &(i, _) in c.args {
                for p in [inside, last] {
                    let mut a = base;
                    a[usize::from(i)] = p;
                    if c.nr == libc::SYS_futex {
                        // An operation that uses the argument.
                        a[1] = if i == 4 {
                            libc::FUTEX_CMP_REQUEUE
                        } else {
                            libc::FUTEX_WAIT
                        } as u64;
                    }
                    assert_eq!(
                        run(&prog, nr, 0x1000, a),
                        trap(),
                        "{} argument {i} at {p:#x}",
                        c.name
                    );
                    assert_eq!(run(&prog, nr, ip, a), ALLOW, "{} from the trampoline", c.name);
                }
                for p in outside {
                    let mut a = base;
                    a[usize::from(i)] = p;
                    assert_eq!(
                        run(&prog, nr, 0x1000, a),
                        ALLOW,
                        "{} argument {i} at {p:#x}",
                        c.name
                    );
                }
            }
        }
        let mut wake = [0u64; 6];
        wake[0] = inside;
        wake[1] = (libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG) as u64;
        assert_eq!(run(&prog, libc::SYS_futex as i32, 0x1000, wake), ALLOW);
        // A wait whose unused fifth register happens to point into the
        // range (uswap's own waits once left it unset): not a pointer.
        let mut wait = [0u64; 6];
        wait[0] = 0x7000_0000;
        wait[1] = (libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG) as u64;
        wait[4] = inside;
        assert_eq!(run(&prog, libc::SYS_futex as i32, 0x1000, wait), ALLOW);
        wait[3] = inside;
        assert_eq!(
            run(&prog, libc::SYS_futex as i32, 0x1000, wait),
            trap(),
            "a wait's timeout"
        );
        let mut requeue = [0u64; 6];
        requeue[1] = libc::FUTEX_CMP_REQUEUE as u64;
        requeue[4] = inside;
        assert_eq!(
            run(&prog, libc::SYS_futex as i32, 0x1000, requeue),
            trap(),
            "a requeue's second word"
        );
        let mut any = [inside; 6];
        for nr in [
            libc::SYS_mmap,
            libc::SYS_close,
            libc::SYS_getpid,
            libc::SYS_rt_sigprocmask,
            libc::SYS_execve,
            999,
        ] {
            assert_eq!(run(&prog, nr as i32, 0x1000, any), ALLOW, "{nr}");
        }
        any[0] = 0;
        assert_eq!(run(&prog, libc::SYS_read as i32, 0x1000, any), trap());
    }
}
