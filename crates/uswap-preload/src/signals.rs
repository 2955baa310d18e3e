//! The program's signal set-up, kept from getting in the way of uswap's
//! SIGBUS handler: `sigaction`, `signal`, `sigprocmask`,
//! `pthread_sigmask` and `sigaltstack`, interposed on libc's.
//!
//! # The SIGBUS disposition
//!
//! In SIGBUS mode uswap serves faults in its own SIGBUS handler, which
//! must stay first: a program that installs its own (Redis's crash
//! reporter, Python's `faulthandler`, a JVM) would otherwise receive
//! uswap's faults, and take a page that is merely swapped out for a
//! crash, until the watchdog put uswap's handler back (every 100 ms).  So
//! a program's SIGBUS action is recorded as its disposition instead of
//! being installed, and uswap's handler passes it every SIGBUS that is not
//! a uswap fault (`uswap::pager::program_sigbus_action`).  Other signals,
//! and SIGBUS where uswap's handler is not installed (handler-thread
//! mode), go to libc unchanged.
//!
//! # Masks
//!
//! A thread that blocks SIGBUS cannot have a fault served in SIGBUS mode:
//! the kernel kills the process at its first touch of a page that is out.
//! Programs block every signal as a matter of course: a server before it
//! starts its workers (`sigfillset` + `pthread_sigmask`, then `sigwait` in
//! one thread), Python before `vfork`, a handler installed with a full
//! `sa_mask`.  So in SIGBUS mode `sigprocmask` and `pthread_sigmask` never
//! block SIGBUS (nor SIGSYS) on a program's thread, though they report it
//! blocked where the program asked (`uswap::pager::program_sigmask`: a
//! SIGBUS sent meanwhile waits until unblocked), and `sigaction` takes
//! them out of every handler's `sa_mask`.  uswap's own calls, from this
//! library's code, pass through.
//!
//! # Alternate stacks
//!
//! The kernel delivers a signal of an `SA_ONSTACK` handler (uswap's SIGBUS
//! handler is one; Python's faulthandler installs others) onto the
//! thread's alternate stack, and cannot if a page of it is out: it kills
//! the thread with SIGSEGV instead.  An alternate stack in the paged heap
//! (Python allocates faulthandler's with malloc) is pinned while it is
//! installed: its pages stay in, writable, until the thread installs
//! another, disables it, or ends (handler-thread mode, and SIGBUS mode for
//! a stack of 64 KiB or more).
//!
//! A runtime that sets its alternate stacks with the raw system call puts
//! them where this library never sees them: the Go runtime gives each
//! thread a 32 KiB signal stack from its own heap, which `uswap run`
//! pages, and the first signal delivered while a page of it was out
//! killed the program (a cgo binary in SIGBUS mode: SIGSEGV, `SI_KERNEL`,
//! at its first SIGURG).  Go keeps a stack a thread already has (in a
//! cgo binary, whose threads C may have made).  So in SIGBUS mode every
//! thread of the program starts with an alternate stack of uswap's
//! ([`give_own_stack`]: the main thread at load, the others in
//! `pthread_create`'s start), ordinary memory outside the heap, which the
//! program cannot see through libc: `sigaltstack` reports none while it is
//! installed, and puts it back when the program disables its own.
//!
//! uswap's own handlers run on the alternate stack, nested: the system-call
//! guard's SIGSYS handler (`SA_ONSTACK` for Go's small goroutine stacks)
//! faults a buffer in, and the SIGBUS of that fault is delivered below it.
//! A program's alternate stack is often the smallest the kernel allows
//! (Rust's threads and Python's faulthandler take 8 and 16 KiB, of which a
//! signal frame with AVX-512 state is 3.4 KiB): two frames and the work
//! ran past its end.  So in SIGBUS mode a stack smaller than uswap's is
//! not installed: uswap's stands in for it (the program's handlers run on
//! it as they would on theirs), and `sigaltstack` reports the program's
//! own as set.

use std::cell::{Cell, RefCell};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};

use libc::{c_int, sighandler_t};
use uswap::pager::{program_sigbus_action, program_sigmask, serving_sigbus, Pinned, NEVER_BLOCKED};

use crate::callers::ours;

thread_local! {
    /// The pin on this thread's alternate stack, while it is one in the
    /// heap; let go when it is replaced, disabled, or the thread ends.
    static ALT_STACK: RefCell<Option<Pinned<'static>>> = const { RefCell::new(None) };
    /// The alternate stack uswap gave this thread (its lowest address,
    /// past the guard page; 0: none).  Freed at the thread's end, by the
    /// destructor of [`OWN_STACK_KEY`].
    static OWN_STACK: Cell<usize> = const { Cell::new(0) };
    /// The alternate stack the program set last while uswap's stands in
    /// for it: what `sigaltstack` reports.
    static PROGRAM_ALT: Cell<libc::stack_t> = const { Cell::new(DISABLED) };
}

/// `SS_AUTODISARM` (linux/signal.h), the one flag a stack may carry.
const SS_AUTODISARM: c_int = 1 << 31;

/// No alternate stack, as `sigaltstack` reports it.
const DISABLED: libc::stack_t = libc::stack_t {
    ss_sp: std::ptr::null_mut(),
    ss_flags: libc::SS_DISABLE,
    ss_size: 0,
};

fn set_errno(e: c_int) {
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() = e };
}

/// Bytes of the alternate stack uswap gives a thread: uswap's SIGBUS
/// handler (a fault served, decompression, a read from the device) and
/// the program's handlers nested on it (Go's own are 32 KiB).  Mapped
/// `MAP_NORESERVE`: a page costs memory once a signal touched it.
const OWN_STACK_BYTES: usize = 64 << 10;

/// The guard page below it: an overflow faults instead of writing into
/// whatever lies below.
const GUARD: usize = 4096;

/// The `pthread_key_t` whose destructor frees a thread's stack of
/// uswap's at its end (`pthread_exit` too); `u32::MAX` until made.
static OWN_STACK_KEY: AtomicU32 = AtomicU32::new(u32::MAX);

/// `rt_sigaltstack`, made directly (the system call, not this library's
/// interposed `sigaltstack`).
fn raw_sigaltstack(new: Option<&libc::stack_t>, old: Option<&mut libc::stack_t>) -> bool {
    let new = new.map_or(std::ptr::null(), |n| n as *const libc::stack_t);
    let old = old.map_or(std::ptr::null_mut(), |o| o as *mut libc::stack_t);
    // SAFETY: both null or valid, on this thread's stack.
    unsafe { libc::syscall(libc::SYS_sigaltstack, new, old) == 0 }
}

fn own_stack_t(base: usize) -> libc::stack_t {
    libc::stack_t {
        ss_sp: base as *mut c_void,
        ss_flags: 0,
        ss_size: OWN_STACK_BYTES,
    }
}

/// This thread's stack of uswap's, mapped now if it has none (0: none
/// could be mapped).
fn own_stack_base() -> usize {
    let have = OWN_STACK.with(Cell::get);
    if have != 0 {
        return have;
    }
    // SAFETY: a new private anonymous mapping, the system call itself
    // (libc's `mmap` is this library's, which would serve it from the
    // heap).
    let at = unsafe {
        libc::syscall(
            libc::SYS_mmap,
            0usize,
            GUARD + OWN_STACK_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0usize,
        )
    };
    if at < 0 {
        return 0;
    }
    let at = at as usize;
    // SAFETY: the first page of the mapping just made.
    unsafe { libc::syscall(libc::SYS_mprotect, at, GUARD, libc::PROT_NONE) };
    let base = at + GUARD;
    OWN_STACK.with(|o| o.set(base));
    let key = OWN_STACK_KEY.load(Ordering::Acquire);
    if key != u32::MAX {
        // SAFETY: a key made by `start_own_stacks`; the value is a number.
        unsafe { libc::pthread_setspecific(key, base as *const c_void) };
    }
    base
}

/// In SIGBUS mode, give this thread an alternate stack of uswap's if it
/// has none (module docs, "Alternate stacks").  Called by the thread
/// itself: at load for the main thread, at a new thread's start.
pub(crate) fn give_own_stack() {
    if !serving_sigbus() {
        return;
    }
    // SAFETY: zeroed is a valid stack_t.
    let mut cur: libc::stack_t = unsafe { std::mem::zeroed() };
    if !raw_sigaltstack(None, Some(&mut cur)) || cur.ss_flags & libc::SS_DISABLE == 0 {
        return;
    }
    let base = own_stack_base();
    if base != 0 {
        // No stack to give otherwise: the thread runs as it would have.
        raw_sigaltstack(Some(&own_stack_t(base)), None);
    }
}

/// The destructor of [`OWN_STACK_KEY`]: the thread is ending; its stack of
/// uswap's is disabled if installed, and unmapped.
unsafe extern "C" fn free_own_stack(base: *mut c_void) {
    let base = base as usize;
    // SAFETY: zeroed is a valid stack_t.
    let mut cur: libc::stack_t = unsafe { std::mem::zeroed() };
    if raw_sigaltstack(None, Some(&mut cur)) && cur.ss_sp as usize == base {
        if cur.ss_flags & libc::SS_ONSTACK != 0 {
            // Ending inside a handler on it: left mapped (64 KiB).
            return;
        }
        raw_sigaltstack(Some(&DISABLED), None);
    }
    OWN_STACK.with(|o| o.set(0));
    PROGRAM_ALT.with(|p| p.set(DISABLED));
    // SAFETY: the mapping `give_own_stack` made on this thread, which no
    // longer delivers signals onto it.
    unsafe { libc::syscall(libc::SYS_munmap, base - GUARD, GUARD + OWN_STACK_BYTES) };
}

/// Make the key that frees stacks of uswap's at threads' ends, and give the
/// calling (main) thread one; in SIGBUS mode only.
pub(crate) fn start_own_stacks() {
    if !serving_sigbus() {
        return;
    }
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: a valid out pointer and destructor.
    if unsafe { libc::pthread_key_create(&mut key, Some(free_own_stack)) } == 0 {
        OWN_STACK_KEY.store(key, Ordering::Release);
    }
    give_own_stack();
}

/// Keep a forking thread's alternate stack pinned in its child: the
/// child, adopting the instance, drops every pin its parent's threads
/// held (`uswap::pager`'s fork epoch), this thread's too, though it is
/// the child's one thread and its stack the one the kernel delivers the
/// child's signals onto.  Unpinned, it was taken out at the next reclaim,
/// and the next signal (uswap's own SIGBUS among them) or its return
/// found no frame: stress-ng's workers, forked from a process whose
/// 64 KiB alternate stack is a mapping in the heap, died of SIGSEGV
/// ("bad frame in rt_sigreturn") hundreds of times a second.
pub(crate) fn keep_alt_stack_across_fork() {
    extern "C" fn child() {
        ALT_STACK.with(|a| {
            let mut a = a.borrow_mut();
            if a.is_none() {
                return;
            }
            // SAFETY: zeroed is a valid stack_t.
            let mut cur: libc::stack_t = unsafe { std::mem::zeroed() };
            // The old guard goes (it lets go of nothing: its pins went
            // with the parent's epoch); the stack installed is pinned anew.
            *a = if raw_sigaltstack(None, Some(&mut cur)) && cur.ss_flags & libc::SS_DISABLE == 0 {
                pin_stack(cur.ss_sp, cur.ss_size)
            } else {
                None
            };
        });
    }
    // Registered after the pager's own handlers (the instance was built
    // first), so this child handler runs after the adoption.
    // SAFETY: registers a function with no preconditions.
    unsafe { libc::pthread_atfork(None, None, Some(child)) };
}

/// Whether `ss` is this thread's stack of uswap's.
fn is_own(ss: &libc::stack_t) -> bool {
    ss.ss_flags & libc::SS_DISABLE == 0
        && ss.ss_sp as usize == OWN_STACK.with(Cell::get)
        && !ss.ss_sp.is_null()
}

/// A new thread's start, as `pthread_create` was asked for it.
struct ThreadStart {
    routine: extern "C" fn(*mut c_void) -> *mut c_void,
    arg: *mut c_void,
}

/// Every thread the program makes in SIGBUS mode starts here: a stack of
/// uswap's, then the program's routine.
extern "C" fn thread_start(start: *mut c_void) -> *mut c_void {
    // SAFETY: boxed by `pthread_create` below for this thread alone.
    let s = unsafe { Box::from_raw(start.cast::<ThreadStart>()) };
    let ThreadStart { routine, arg } = *s;
    give_own_stack();
    routine(arg)
}

/// `act` with [`NEVER_BLOCKED`] taken out of its mask, where uswap serves
/// SIGBUS faults.
fn unmasked(act: &libc::sigaction) -> libc::sigaction {
    let mut a = *act;
    if serving_sigbus() {
        for s in NEVER_BLOCKED {
            // SAFETY: a valid set, ours.
            unsafe { libc::sigdelset(&mut a.sa_mask, s) };
        }
    }
    a
}

/// Pin `[sp, sp + size)` where it is in the heap; None elsewhere.
fn pin_stack(sp: *const libc::c_void, size: usize) -> Option<Pinned<'static>> {
    crate::pins::span(sp as usize, size, true)
}

/// The interposed calls.  Their callers are C programs: each function's
/// contract is the C one (its manual page).
#[allow(clippy::missing_safety_doc)] // the contract is the C one, above
mod interpose {
    use super::*;

    /// `sigaction(2)`.
    #[no_mangle]
    pub unsafe extern "C" fn sigaction(
        sig: c_int,
        act: *const libc::sigaction,
        old: *mut libc::sigaction,
    ) -> c_int {
        // SAFETY: the C contract: `act` and `old` are null or valid.
        if sig == libc::SIGBUS && program_sigbus_action(unsafe { act.as_ref() }, unsafe { old.as_mut() }) {
            return 0;
        }
        if sig == libc::SIGSYS {
            // SAFETY: as above.
            let (act, old) = unsafe { (act.as_ref(), old.as_mut()) };
            if crate::guard::program_action(act, old) {
                return 0;
            }
        }
        // SAFETY: as above.
        if crate::core_dump::program_action(sig, unsafe { act.as_ref() }, unsafe { old.as_mut() }) {
            return 0;
        }
        let f = next!("sigaction" as fn(c_int, *const libc::sigaction, *mut libc::sigaction) -> c_int);
        // SAFETY: the C contract: `act` is null or valid.
        let Some(act) = (unsafe { act.as_ref() }) else {
            // SAFETY: the C contract.
            return unsafe { f(sig, act, old) };
        };
        let act = unmasked(act);
        // SAFETY: the C contract.
        unsafe { f(sig, &act, old) }
    }

    with_caller!(sigprocmask(how: c_int, set: *const libc::sigset_t, old: *mut libc::sigset_t) -> c_int, "rcx", sigprocmask_from);
    with_caller!(pthread_sigmask(how: c_int, set: *const libc::sigset_t, old: *mut libc::sigset_t) -> c_int, "rcx", pthread_sigmask_from);

    unsafe extern "C" fn sigprocmask_from(
        how: c_int,
        set: *const libc::sigset_t,
        old: *mut libc::sigset_t,
        caller: usize,
    ) -> c_int {
        let f = next!("sigprocmask" as fn(c_int, *const libc::sigset_t, *mut libc::sigset_t) -> c_int);
        // SAFETY: the C contract; `f` is libc's (-1 and errno).
        unsafe { mask(f, how, set, old, caller) }
    }

    unsafe extern "C" fn pthread_sigmask_from(
        how: c_int,
        set: *const libc::sigset_t,
        old: *mut libc::sigset_t,
        caller: usize,
    ) -> c_int {
        let f = next!("pthread_sigmask" as fn(c_int, *const libc::sigset_t, *mut libc::sigset_t) -> c_int);
        // SAFETY: the C contract; `f` is libc's (an error number back).
        unsafe { mask(f, how, set, old, caller) }
    }

    /// A mask call `f` (libc's `sigprocmask` or `pthread_sigmask`) made
    /// from `caller`: uswap's own pass through, the program's go through
    /// `program_sigmask`.
    ///
    /// # Safety
    /// As `f`'s: `set` and `old` null or valid.
    unsafe fn mask(
        f: unsafe extern "C" fn(c_int, *const libc::sigset_t, *mut libc::sigset_t) -> c_int,
        how: c_int,
        set: *const libc::sigset_t,
        old: *mut libc::sigset_t,
        caller: usize,
    ) -> c_int {
        if ours(caller) {
            // SAFETY: per the contract.
            return unsafe { f(how, set, old) };
        }
        // SAFETY: per the contract; `f` keeps it.
        unsafe { program_sigmask(how, set, old, |h, s, o| f(h, s, o)) }
    }

    /// `sigaltstack(2)`.  In SIGBUS mode a stack smaller than uswap's
    /// is not installed: uswap's stands in for it, and the program is told
    /// of its own (module docs); a larger one is installed, and pinned
    /// where it is in the heap.  Made through copies of ours, both ways:
    /// `rt_sigaltstack` is not the system-call guard's to trap (a signal's
    /// return would undo it), and the program's own structures may be
    /// heap memory that is out; read and written here, they are its own
    /// accesses, served.
    #[no_mangle]
    pub unsafe extern "C" fn sigaltstack(ss: *const libc::stack_t, old: *mut libc::stack_t) -> c_int {
        let f = next!("sigaltstack" as fn(*const libc::stack_t, *mut libc::stack_t) -> c_int);
        // SAFETY: the C contract: `ss` is null or valid.
        let new = unsafe { ss.as_ref() }.copied();
        // SAFETY: zeroed is a valid stack_t.
        let mut prev: libc::stack_t = unsafe { std::mem::zeroed() };
        if !serving_sigbus() {
            let pin = new
                .filter(|n| n.ss_flags & libc::SS_DISABLE == 0)
                .and_then(|n| pin_stack(n.ss_sp, n.ss_size));
            let new_ptr = new
                .as_ref()
                .map_or(std::ptr::null(), |n| n as *const libc::stack_t);
            // SAFETY: the C contract, on our copies.
            let rc = unsafe { f(new_ptr, &mut prev) };
            if rc != 0 {
                return rc;
            }
            if new.is_some() {
                // The old stack's pin goes, the new one's stays.
                ALT_STACK.with(|a| *a.borrow_mut() = pin);
            }
        } else {
            if !raw_sigaltstack(None, Some(&mut prev)) {
                return -1;
            }
            if is_own(&prev) {
                let mut shown = PROGRAM_ALT.with(Cell::get);
                shown.ss_flags |= prev.ss_flags & libc::SS_ONSTACK;
                prev = shown;
            }
            if let Some(n) = new {
                let disable = n.ss_flags & libc::SS_DISABLE != 0;
                if !disable && n.ss_flags & !SS_AUTODISARM != 0 {
                    set_errno(libc::EINVAL);
                    return -1;
                }
                if !disable && n.ss_size < libc::MINSIGSTKSZ {
                    set_errno(libc::ENOMEM);
                    return -1;
                }
                let base = if disable || n.ss_size < OWN_STACK_BYTES {
                    own_stack_base()
                } else {
                    0
                };
                if base != 0 {
                    // SAFETY: uswap's stack, mapped for this thread.
                    if unsafe { f(&own_stack_t(base), std::ptr::null_mut()) } != 0 {
                        return -1;
                    }
                    let shown = if disable { DISABLED } else { n };
                    PROGRAM_ALT.with(|p| p.set(shown));
                    ALT_STACK.with(|a| *a.borrow_mut() = None);
                } else {
                    let pin = if disable {
                        None
                    } else {
                        pin_stack(n.ss_sp, n.ss_size)
                    };
                    // SAFETY: the C contract, on our copy.
                    if unsafe { f(&n, std::ptr::null_mut()) } != 0 {
                        return -1;
                    }
                    ALT_STACK.with(|a| *a.borrow_mut() = pin);
                }
            }
        }
        if !old.is_null() {
            // SAFETY: the C contract: `old` is valid.
            unsafe { *old = prev };
        }
        0
    }

    /// `pthread_create(3)`: in SIGBUS mode the thread starts in
    /// [`thread_start`], which gives it an alternate stack of uswap's.
    #[no_mangle]
    pub unsafe extern "C" fn pthread_create(
        thread: *mut libc::pthread_t,
        attr: *const libc::pthread_attr_t,
        routine: extern "C" fn(*mut c_void) -> *mut c_void,
        arg: *mut c_void,
    ) -> c_int {
        let f = next!(
            "pthread_create"
                as fn(
                    *mut libc::pthread_t,
                    *const libc::pthread_attr_t,
                    extern "C" fn(*mut c_void) -> *mut c_void,
                    *mut c_void,
                ) -> c_int
        );
        if !serving_sigbus() {
            // SAFETY: the C contract.
            return unsafe { f(thread, attr, routine, arg) };
        }
        // In glibc's heap (this library's allocator), freed by the thread.
        let start = Box::into_raw(Box::new(ThreadStart { routine, arg }));
        // SAFETY: the C contract; `thread_start` takes `start` once.
        let rc = unsafe { f(thread, attr, thread_start, start.cast()) };
        if rc != 0 {
            // SAFETY: not taken: no thread was made.
            drop(unsafe { Box::from_raw(start) });
        }
        rc
    }

    /// `signal(2)`, glibc's: BSD semantics (`SA_RESTART`, the handler
    /// stays installed).
    #[no_mangle]
    pub unsafe extern "C" fn signal(sig: c_int, handler: sighandler_t) -> sighandler_t {
        if sig == libc::SIGBUS || sig == libc::SIGSYS || crate::core_dump::DUMPING.contains(&sig) {
            // SAFETY: zeroed is a valid sigaction (empty mask).
            let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
            new.sa_sigaction = handler;
            new.sa_flags = libc::SA_RESTART;
            // SAFETY: as above.
            let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
            let kept = if sig == libc::SIGBUS {
                program_sigbus_action(Some(&new), Some(&mut old))
            } else if sig == libc::SIGSYS {
                crate::guard::program_action(Some(&new), Some(&mut old))
            } else {
                crate::core_dump::program_action(sig, Some(&new), Some(&mut old))
            };
            if kept {
                return old.sa_sigaction;
            }
        }
        let f = next!("signal" as fn(c_int, sighandler_t) -> sighandler_t);
        // SAFETY: the C contract.
        unsafe { f(sig, handler) }
    }
}
