//! Stacks for the SIGBUS handler.
//!
//! The handler is installed with `SA_ONSTACK`, so that a thread whose
//! stack is region memory (a coroutine's stack allocated from a region)
//! can be served: the kernel cannot push a signal frame onto a missing
//! page of the faulting stack.  But alternate stacks are small (Rust
//! gives each thread 8 KiB, of which the kernel's frame takes 3.4 KiB
//! with AVX-512 state), and serving a fault, direct reclaim and IO
//! included, takes more.  So where the kernel has put the handler on the
//! alternate stack, it moves before serving:
//!
//! - back onto the interrupted stack, below its red zone, when that is an
//!   ordinary stack: where it would run without `SA_ONSTACK`;
//! - onto one of 32 spare stacks of 64 KiB (mapped at installation, each
//!   above a guard page, taken with one atomic), when the interrupted code
//!   was on the alternate stack already (a signal handler of the program
//!   touching region memory) or a region lies within 64 KiB below its
//!   stack pointer; with all 32 in use, it stays where it is.
//!
//! Every signal is blocked meanwhile, so no delivery can reuse the
//! alternate stack under the handler's frame.  `tests/signals.rs`
//! measures what is left on the alternate stack: 3.7 KiB.  A thread that
//! runs on region memory still needs an alternate signal stack outside
//! regions, and its thread-local storage must not be region memory (the
//! handler saves `errno`, a thread-local): glibc puts a thread's TLS at
//! the top of a stack given by `pthread_attr_setstack`, so such a stack
//! cannot be a region; a stack the thread switches to (`swapcontext`, a coroutine's) may be.

use crate::pager::instance::regions::overlaps_a_region;

/// Where a fault is served.
// Elsewhere only `Here` is used: no stack switch (see `call_on_stack`).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) enum ServeOn {
    /// On the interrupted code's stack, from this stack pointer down.
    Interrupted(u64),
    /// On a spare stack of uswap's, if one is free (else here).
    Spare,
    /// Where the kernel put the handler.
    Here,
}

/// How far below the interrupted stack pointer the handler starts when it
/// moves onto the interrupted stack: the x86-64 red zone (128 bytes, which
/// leaf code may be using) and a margin.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const BELOW_SP: u64 = 256;

/// A region within this distance below the interrupted stack pointer may
/// be the stack itself: the handler's frames there could fault on pages
/// of the region.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const HANDLER_STACK: u64 = 64 << 10;

/// Where to serve: `here` is an address on the handler's stack.  Not on
/// the alternate stack: the kernel ran the handler on the interrupted
/// stack, which has room.  On it, over code on an ordinary stack: back
/// onto that stack.  On it, over code that was on it already (a signal
/// handler of the program) or on region memory: a spare stack.
#[cfg(target_arch = "x86_64")]
pub(crate) fn stack_to_serve_on(ctx: *mut libc::c_void, here: u64) -> ServeOn {
    if ctx.is_null() {
        return ServeOn::Here;
    }
    // SAFETY: an SA_SIGINFO handler's third argument is its ucontext_t.
    let uc = unsafe { &*(ctx as *const libc::ucontext_t) };
    // The kernel saves the thread's alternate stack here.
    if uc.uc_stack.ss_flags & libc::SS_DISABLE != 0 {
        return ServeOn::Here;
    }
    let alt = uc.uc_stack.ss_sp as u64;
    let on_alt = |p: u64| p >= alt && p < alt + uc.uc_stack.ss_size as u64;
    if !on_alt(here) {
        return ServeOn::Here;
    }
    let sp = uc.uc_mcontext.gregs[libc::REG_RSP as usize] as u64;
    if on_alt(sp) || sp < HANDLER_STACK || overlaps_a_region(sp - HANDLER_STACK, HANDLER_STACK) {
        return ServeOn::Spare;
    }
    ServeOn::Interrupted((sp - BELOW_SP) & !15)
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn stack_to_serve_on(_ctx: *mut libc::c_void, _here: u64) -> ServeOn {
    ServeOn::Here
}

/// Spare stacks for faults that cannot be served on the interrupted
/// stack: a region used as a stack, or a program's signal handler running
/// on the alternate stack.  Mapped once, when the handler is installed
/// (lazily committed: a stack costs memory only once used); taken and
/// given back with one atomic each, so the handler allocates nothing.
pub(crate) mod spare {
    use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

    const STACKS: u32 = 32;
    const SIZE: u64 = 64 << 10;
    const GUARD: u64 = 4096;

    /// The mapping's start; 0 when there is none.
    static BASE: AtomicU64 = AtomicU64::new(0);
    /// Bit i set: stack i is free.
    static FREE: AtomicU32 = AtomicU32::new(u32::MAX);

    /// A spare stack, owned until given back.
    pub struct Stack(u32);

    impl Stack {
        /// Its top, where a call starts.
        pub fn top(&self) -> u64 {
            BASE.load(Ordering::Acquire) + (u64::from(self.0) + 1) * (SIZE + GUARD)
        }
    }

    /// Map the stacks, each above a guard page.  A failure leaves none:
    /// faults are then served where the kernel put the handler.
    pub fn map() {
        if let Some(base) = crate::sys::map_stacks(u64::from(STACKS), SIZE, GUARD) {
            BASE.store(base, Ordering::Release);
        }
    }

    /// Take a free stack, if there is one.
    pub fn take() -> Option<Stack> {
        if BASE.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut free = FREE.load(Ordering::Acquire);
        loop {
            if free == 0 {
                return None;
            }
            let i = free.trailing_zeros();
            match FREE.compare_exchange_weak(free, free & !(1 << i), Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(Stack(i)),
                Err(now) => free = now,
            }
        }
    }

    pub fn give_back(s: Stack) {
        FREE.fetch_or(1 << s.0, Ordering::Release);
    }
}

/// Call `f(arg)` with the stack pointer at `sp`, and come back.
///
/// # Safety
/// `sp` must be 16-byte aligned, with enough free, mapped stack below it
/// for `f`, none of it in use.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn call_on_stack(sp: u64, f: extern "C" fn(*mut libc::c_void), arg: *mut libc::c_void) {
    // SAFETY: per the contract; r12 is callee-saved, so it still holds the
    // old stack pointer when `f` returns; `clobber_abi` covers the rest.
    unsafe {
        std::arch::asm!(
            "mov r12, rsp",
            "mov rsp, {sp}",
            "call {f}",
            "mov rsp, r12",
            sp = in(reg) sp,
            f = in(reg) f,
            in("rdi") arg,
            out("r12") _,
            clobber_abi("C"),
        );
    }
}

/// Elsewhere no stack switch: `stack_to_serve_on` never asks for one, and
/// `f` runs where the handler is.
///
/// # Safety
/// None beyond `f`'s own; `sp` is ignored.
#[cfg(not(target_arch = "x86_64"))]
pub(crate) unsafe fn call_on_stack(_sp: u64, f: extern "C" fn(*mut libc::c_void), arg: *mut libc::c_void) {
    f(arg)
}
