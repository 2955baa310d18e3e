//! System calls made by hand: [`raw`] is one `syscall` instruction at a
//! known address, what this library's interposed calls use where libc's
//! own function would reach an interposer again, and the one the
//! system-call guard's filter lets through (from its trampoline page).

use libc::c_long;

#[cfg(target_arch = "x86_64")]
std::arch::global_asm!(
    ".pushsection .text.uswap_raw_syscall,\"ax\",@progbits",
    ".globl uswap_raw_syscall",
    ".hidden uswap_raw_syscall",
    ".type uswap_raw_syscall,@function",
    "uswap_raw_syscall:",
    // C arguments (nr, a1..a5 in rdi, rsi, rdx, rcx, r8, r9; a6 on the
    // stack) into the kernel's (rax; rdi, rsi, rdx, r10, r8, r9).
    "mov rax, rdi",
    "mov rdi, rsi",
    "mov rsi, rdx",
    "mov rdx, rcx",
    "mov r10, r8",
    "mov r8, r9",
    "mov r9, [rsp + 8]",
    "syscall",
    ".globl uswap_raw_syscall_end",
    ".hidden uswap_raw_syscall_end",
    "uswap_raw_syscall_end:",
    "ret",
    ".size uswap_raw_syscall, . - uswap_raw_syscall",
    ".popsection",
);

/// The system-call guard's trampoline page (`guard/`): a copy of
/// `uswap_raw_syscall` at a place every process of the run knows, the
/// one `syscall` instruction the guard's filter lets through.  Null: no
/// guard, and [`raw`] uses this library's own copy.
pub(crate) static TRAMPOLINE: std::sync::atomic::AtomicPtr<libc::c_void> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

type RawFn = unsafe extern "C" fn(c_long, c_long, c_long, c_long, c_long, c_long, c_long) -> c_long;

#[cfg(target_arch = "x86_64")]
extern "C" {
    fn uswap_raw_syscall(
        nr: c_long,
        a1: c_long,
        a2: c_long,
        a3: c_long,
        a4: c_long,
        a5: c_long,
        a6: c_long,
    ) -> c_long;
    fn uswap_raw_syscall_end();
}

/// The raw call's code, to copy: its start and length (through its
/// `ret`, one byte past the end label).  Position-independent.
#[cfg(target_arch = "x86_64")]
pub(crate) fn raw_code() -> (*const u8, usize) {
    let start = uswap_raw_syscall as *const u8;
    (
        start,
        uswap_raw_syscall_end as *const () as usize - start as usize + 1,
    )
}

/// Where, in the raw call's code, its `syscall` instruction returns to.
#[cfg(target_arch = "x86_64")]
pub(crate) fn raw_return_offset() -> usize {
    uswap_raw_syscall_end as *const () as usize - uswap_raw_syscall as *const () as usize
}

/// System call `nr` with `a`: the kernel's answer as it gives it (a
/// negative errno on failure; errno is not touched).  From the guard's
/// trampoline when there is one (the one place its filter lets any call
/// through), else from this library's copy of the same code.
///
/// # Safety
/// As the system call's: the arguments must be what it takes.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn raw(nr: c_long, a: [c_long; 6]) -> c_long {
    let t = TRAMPOLINE.load(std::sync::atomic::Ordering::Acquire);
    let f: RawFn = if t.is_null() {
        uswap_raw_syscall
    } else {
        // SAFETY: the trampoline page holds a copy of that function.
        unsafe { std::mem::transmute::<*mut libc::c_void, RawFn>(t) }
    };
    // SAFETY: per the contract; `f` is the code above.
    unsafe { f(nr, a[0], a[1], a[2], a[3], a[4], a[5]) }
}

/// libc's convention for a raw answer: -1 with errno set on failure.
pub(crate) fn libc_ret(r: c_long) -> c_long {
    if (-4095..0).contains(&r) {
        // SAFETY: errno is this thread's.
        unsafe { *libc::__errno_location() = -r as i32 };
        -1
    } else {
        r
    }
}

/// Elsewhere libc's, with its errno turned back into the kernel's form.
///
/// # Safety
/// As the system call's.
#[cfg(not(target_arch = "x86_64"))]
pub(crate) unsafe fn raw(nr: c_long, a: [c_long; 6]) -> c_long {
    // SAFETY: per the contract.
    let r = unsafe { libc::syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]) };
    if r == -1 {
        // SAFETY: errno is this thread's.
        -(unsafe { *libc::__errno_location() }) as c_long
    } else {
        r
    }
}
