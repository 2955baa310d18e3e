//! The malloc family, interposed on libc's (mimalloc's, one call each),
//! and glibc's own allocator for this library's Rust code.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::Mutex;

use uswap::pager::starting_a_thread;

use libmimalloc_sys::{
    mi_aligned_alloc, mi_calloc, mi_free, mi_is_in_heap_region, mi_malloc, mi_posix_memalign, mi_realloc,
};

extern "C" {
    fn __libc_malloc(size: usize) -> *mut c_void;
    fn __libc_calloc(n: usize, size: usize) -> *mut c_void;
    fn __libc_realloc(p: *mut c_void, size: usize) -> *mut c_void;
    fn __libc_memalign(align: usize, size: usize) -> *mut c_void;
    fn __libc_free(p: *mut c_void);
    fn __libc_valloc(size: usize) -> *mut c_void;
    fn __libc_pvalloc(size: usize) -> *mut c_void;
    // mimalloc's, which libmimalloc-sys does not bind.
    fn mi_memalign(align: usize, size: usize) -> *mut c_void;
    fn mi_reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void;
    fn mi_valloc(size: usize) -> *mut c_void;
    fn mi_pvalloc(size: usize) -> *mut c_void;
    fn mi_malloc_usable_size(p: *const c_void) -> usize;
}

/// The malloc family, interposed on libc's: mimalloc's, one call each.
/// Their callers are C programs: each function's contract is C's (its
/// manual page), which mimalloc's function of the same name keeps; the
/// arguments pass through unchanged.
#[allow(clippy::missing_safety_doc)] // the contract is the C one, above
mod interpose {
    use super::*;

    // malloc, calloc and realloc are entered through a shim that passes
    // the caller's return address on, as one more argument: the blocks
    // the C runtime takes for itself stay out of the heap (`from_libc`).

    /// `malloc(3)`.
    #[cfg(target_arch = "x86_64")]
    #[unsafe(naked)]
    #[no_mangle]
    pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
        // On entry the return address is at the top of the stack.
        std::arch::naked_asm!("mov rsi, [rsp]", "jmp {f}", f = sym malloc_from)
    }

    /// `calloc(3)`.
    #[cfg(target_arch = "x86_64")]
    #[unsafe(naked)]
    #[no_mangle]
    pub unsafe extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
        std::arch::naked_asm!("mov rdx, [rsp]", "jmp {f}", f = sym calloc_from)
    }

    /// `realloc(3)`.
    #[cfg(target_arch = "x86_64")]
    #[unsafe(naked)]
    #[no_mangle]
    pub unsafe extern "C" fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
        std::arch::naked_asm!("mov rdx, [rsp]", "jmp {f}", f = sym realloc_from)
    }

    /// Elsewhere no shim: every caller counts as the program.
    #[cfg(not(target_arch = "x86_64"))]
    #[no_mangle]
    pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
        // SAFETY: the C contract (module documentation).
        unsafe { malloc_from(size, 0) }
    }

    #[cfg(not(target_arch = "x86_64"))]
    #[no_mangle]
    pub unsafe extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
        // SAFETY: the C contract (module documentation).
        unsafe { calloc_from(n, size, 0) }
    }

    #[cfg(not(target_arch = "x86_64"))]
    #[no_mangle]
    pub unsafe extern "C" fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
        // SAFETY: the C contract (module documentation).
        unsafe { realloc_from(p, size, 0) }
    }

    /// `malloc` for code at `caller`.
    unsafe extern "C" fn malloc_from(size: usize, caller: usize) -> *mut c_void {
        // SAFETY: the C contract (module documentation).
        unsafe {
            if to_libc() || from_libc(caller) || starting_a_thread() {
                return __libc_malloc(size);
            }
            program_allocates(size);
            enomem_if_null(or_more(|| mi_malloc(size)))
        }
    }

    /// `calloc` for code at `caller`.
    unsafe extern "C" fn calloc_from(n: usize, size: usize, caller: usize) -> *mut c_void {
        // SAFETY: the C contract (module documentation).
        unsafe {
            if to_libc() || from_libc(caller) || starting_a_thread() {
                return __libc_calloc(n, size);
            }
            program_allocates(n.saturating_mul(size));
            enomem_if_null(or_more(|| mi_calloc(n, size)))
        }
    }

    /// `realloc` for code at `caller`: a block stays with the allocator
    /// that gave it.
    unsafe extern "C" fn realloc_from(p: *mut c_void, size: usize, caller: usize) -> *mut c_void {
        // SAFETY: the C contract (module documentation).
        unsafe {
            if libc_block(p) || (p.is_null() && (to_libc() || from_libc(caller) || starting_a_thread())) {
                return __libc_realloc(p, size);
            }
            if !p.is_null() && size == 0 {
                // glibc's: the block is freed, and nothing comes back.
                free_block(p);
                return std::ptr::null_mut();
            }
            if !to_libc() && !from_libc(caller) && !starting_a_thread() {
                program_allocates(size);
            }
            if let Some(q) = realloc_big_aligned(p, size) {
                return q;
            }
            enomem_if_null(or_more(|| mi_realloc(p, size)))
        }
    }

    /// `reallocarray(3)`.
    #[no_mangle]
    pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void {
        // SAFETY: the C contract (module documentation).
        unsafe {
            if libc_block(p) || (p.is_null() && to_libc()) {
                return match n.checked_mul(size) {
                    Some(bytes) => __libc_realloc(p, bytes),
                    None => {
                        *libc::__errno_location() = libc::ENOMEM;
                        std::ptr::null_mut()
                    }
                };
            }
            if !p.is_null() && n.checked_mul(size) == Some(0) {
                free_block(p);
                return std::ptr::null_mut();
            }
            match n
                .checked_mul(size)
                .and_then(|bytes| realloc_big_aligned(p, bytes))
            {
                Some(q) => q,
                None => enomem_if_null(or_more(|| mi_reallocarray(p, n, size))),
            }
        }
    }

    /// `free(3)`.
    #[no_mangle]
    pub unsafe extern "C" fn free(p: *mut c_void) {
        // SAFETY: the C contract (module documentation).
        unsafe { free_block(p) }
    }

    /// `cfree`, an old alias of `free`.
    #[no_mangle]
    pub unsafe extern "C" fn cfree(p: *mut c_void) {
        // SAFETY: the C contract (module documentation).
        unsafe { free_block(p) }
    }

    /// `posix_memalign(3)`.
    #[no_mangle]
    pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> i32 {
        // SAFETY: the C contract (module documentation).
        unsafe {
            if to_libc() {
                return libc_posix_memalign(out, align, size);
            }
            if align > MI_ALIGN_MAX && align.is_power_of_two() {
                let p = big_aligned(align, size);
                if p.is_null() {
                    return libc::ENOMEM;
                }
                *out = p;
                return 0;
            }
            let mut rc = mimalloc(|| mi_posix_memalign(out, align, size));
            while rc == libc::ENOMEM && give_more(GIVEN.load(Ordering::Acquire)) {
                rc = mimalloc(|| mi_posix_memalign(out, align, size));
            }
            rc
        }
    }

    /// `memalign(3)`.
    #[no_mangle]
    pub unsafe extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
        // SAFETY: the C contract (module documentation).
        unsafe {
            if to_libc() {
                return __libc_memalign(align, size);
            }
            let Some(align) = as_glibc_aligns(align) else {
                *libc::__errno_location() = libc::EINVAL;
                return std::ptr::null_mut();
            };
            if align > MI_ALIGN_MAX {
                return big_aligned(align, size);
            }
            enomem_if_null(or_more(|| mi_memalign(align, size)))
        }
    }

    /// `aligned_alloc(3)`.
    #[no_mangle]
    pub unsafe extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
        // SAFETY: the C contract (module documentation).
        unsafe {
            if to_libc() {
                return __libc_memalign(align, size);
            }
            let Some(align) = as_glibc_aligns(align) else {
                *libc::__errno_location() = libc::EINVAL;
                return std::ptr::null_mut();
            };
            if align > MI_ALIGN_MAX {
                return big_aligned(align, size);
            }
            enomem_if_null(or_more(|| mi_aligned_alloc(align, size)))
        }
    }

    /// `valloc(3)`.
    #[no_mangle]
    pub unsafe extern "C" fn valloc(size: usize) -> *mut c_void {
        // SAFETY: the C contract (module documentation).
        unsafe {
            if to_libc() {
                return __libc_valloc(size);
            }
            or_more(|| mi_valloc(size))
        }
    }

    /// `pvalloc(3)`.
    #[no_mangle]
    pub unsafe extern "C" fn pvalloc(size: usize) -> *mut c_void {
        // SAFETY: the C contract (module documentation).
        unsafe {
            if to_libc() {
                return __libc_pvalloc(size);
            }
            or_more(|| mi_pvalloc(size))
        }
    }

    /// `malloc_usable_size(3)`.
    #[no_mangle]
    pub unsafe extern "C" fn malloc_usable_size(p: *const c_void) -> usize {
        // SAFETY: the C contract (module documentation).
        unsafe {
            if libc_block(p) {
                return libc_usable_size(p);
            }
            if let Some(base) = big_aligned_base(p as usize, false) {
                return mimalloc(|| mi_malloc_usable_size(base as *const c_void)) - (p as usize - base);
            }
            mimalloc(|| mi_malloc_usable_size(p))
        }
    }
}

/// The largest arena the heap region is handed to mimalloc in: about the
/// largest it takes (it refuses an arena whose metadata, a page
/// descriptor per 64 KiB slice, passes its largest block: 16 GiB was
/// refused here, 12 taken).  A block never spans two arenas, so this is
/// near the largest block the heap gives (`malloc`, a mapping or a
/// runtime's reservation): 12 GiB less the arena's metadata.
pub(crate) const ARENA_PIECE: usize = 12 << 30;

/// The first arena: small, so that a small process (a shell, a compiler
/// driver, `make`) pays little for its metadata.  Each next arena is as
/// large as all given before (64 MiB, 64 MiB, 128 MiB, ... up to
/// [`ARENA_PIECE`]), so that a large block finds an arena that takes it
/// after a few: a `malloc(4 GiB)` first gives seven, each of them usable.
pub(crate) const FIRST_ARENA: usize = 64 << 20;

/// The heap region, and how much of it mimalloc has been given: it is
/// handed over an arena at a time, as allocations need it, not whole at
/// start.  mimalloc initialises an arena's metadata when given it, about
/// 1.2 MiB of the region per 12 GiB arena, resident, and the heap is as
/// large as the budget and the swap together: with a default swap that
/// grows up to what the disk can spare (tens of GiB), every process of a
/// tree held 10 MiB more for arenas it never used, and took longer to
/// start.
static HEAP_AT: AtomicUsize = AtomicUsize::new(0);
static HEAP_LEN: AtomicUsize = AtomicUsize::new(0);
static GIVEN: AtomicUsize = AtomicUsize::new(0);
/// Held while an arena is handed over (one at a time).
static GIVING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Hand `[at, at + n)` of the region to mimalloc as an arena (committed,
/// zero: uswap serves its faults).
fn give(at: usize, n: usize) -> Result<(), String> {
    // SAFETY: a piece of the heap region, ours for the life of the
    // process (RUNNING is never dropped), mapped and zero, given once.
    let managed = mimalloc(|| unsafe {
        libmimalloc_sys::mi_manage_os_memory_ex(
            at as *mut c_void,
            n,
            true,
            false,
            true,
            -1,
            false,
            std::ptr::null_mut(),
        )
    });
    if managed {
        Ok(())
    } else {
        Err(format!(
            "mimalloc refused {n} bytes at {at:#x} of the heap region as an arena"
        ))
    }
}

/// Give mimalloc the heap region `[start, start + len)`'s first arena.
pub(crate) fn give_first(start: *mut u8, len: usize) -> Result<(), String> {
    HEAP_AT.store(start as usize, Ordering::Relaxed);
    HEAP_LEN.store(len, Ordering::Relaxed);
    let n = FIRST_ARENA.min(len);
    give(start as usize, n)?;
    GIVEN.store(n, Ordering::Release);
    Ok(())
}

/// An allocation found no room after mimalloc had been given `since`
/// bytes of the region: give it the next arena, unless another thread did
/// meanwhile.  False when the whole region is mimalloc's already (the
/// heap is full, as memory is under kernel swap).
fn give_more(since: usize) -> bool {
    let _one = GIVING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let given = GIVEN.load(Ordering::Acquire);
    if given > since {
        return true;
    }
    let len = HEAP_LEN.load(Ordering::Relaxed);
    if given >= len {
        return false;
    }
    let n = given.clamp(FIRST_ARENA, ARENA_PIECE).min(len - given);
    if give(HEAP_AT.load(Ordering::Relaxed) + given, n).is_err() {
        return false;
    }
    GIVEN.store(given + n, Ordering::Release);
    true
}

/// `alloc`, a call into mimalloc that answers null without room, tried
/// again while the region has arenas left to give.
pub(crate) fn or_more(alloc: impl Fn() -> *mut c_void) -> *mut c_void {
    loop {
        let since = GIVEN.load(Ordering::Acquire);
        let p = mimalloc(&alloc);
        if !p.is_null() || !give_more(since) {
            return p;
        }
    }
}

/// How long a freed span of the heap stays resident before mimalloc
/// purges it (`maps.rs`'s `madvise` discards it).  Off (-1) before: a
/// Python pool worker's 60 MB of freed strings stayed charged to the
/// tree until written to swap.  mimalloc's default is a second, which a
/// process between two tasks may not reach; at 10 ms Python's malloc
/// churn ran 1.02x the time with no purging (7 whole-process runs, paired;
/// 1.12x at 0, purging at every free).
pub(crate) const PURGE_DELAY_MS: std::ffi::c_long = 10;

// mimalloc v3's option numbers (`mi_option_t` in mimalloc.h).
pub(crate) const MI_OPTION_PURGE_DELAY: i32 = 15;
pub(crate) const MI_OPTION_DISALLOW_OS_ALLOC: i32 = 17;
/// The largest block an arena gives, in KiB: 2 GiB unless set; past it
/// mimalloc asks the OS, which it may not here, and the call fails.
pub(crate) const MI_OPTION_ARENA_MAX_OBJECT_SIZE: i32 = 45;

thread_local! {
    /// How deep this thread is in mimalloc.  mimalloc maps its own
    /// metadata with `mmap`, which reaches the interposed one (`maps.rs`):
    /// that must hand such calls to the kernel, not serve them from the
    /// heap, which would call back into mimalloc while it holds its locks.
    /// A `Cell` with a const initializer: no allocation, no destructor.
    static IN_MIMALLOC: Cell<u32> = const { Cell::new(0) };
}

/// Whether this thread is inside a mimalloc call.
pub(crate) fn in_mimalloc() -> bool {
    IN_MIMALLOC.with(Cell::get) > 0
}

/// Run `f`, a call into mimalloc, marked as one.
#[inline]
pub(crate) fn mimalloc<R>(f: impl FnOnce() -> R) -> R {
    IN_MIMALLOC.with(|d| d.set(d.get() + 1));
    let r = f();
    IN_MIMALLOC.with(|d| d.set(d.get() - 1));
    r
}

thread_local! {
    /// Where this thread's new blocks come from: decided at its first
    /// allocation once uswap runs (`UNDECIDED` until then), and kept.
    static ROUTE: Cell<u8> = const { Cell::new(UNDECIDED) };
}

const UNDECIDED: u8 = 0;
const HEAP: u8 = 1;
const LIBC: u8 = 2;

/// Whether this thread's new blocks come from glibc's allocator rather
/// than the paged heap: whether it blocked SIGBUS at its first allocation.
///
/// uswap's own threads (the reclaimer, the fault handler) block every
/// signal from their first instruction, and glibc allocates for them
/// before any of uswap's code runs in them (the list of thread-local
/// destructors, at thread start): such memory must not be paged, as
/// uswap's never is, or the thread that serves faults would wait on its
/// own.  In SIGBUS mode the same test keeps out a thread of the program
/// that blocks SIGBUS (glibc's helper threads, a server's workers): its
/// first touch of a swapped-out page would end the process.
#[inline]
pub(crate) fn to_libc() -> bool {
    match ROUTE.with(Cell::get) {
        HEAP => false,
        LIBC => true,
        _ => decide_route(),
    }
}

#[cold]
fn decide_route() -> bool {
    if crate::running::RUNNING.get().is_none() {
        // Not started (or not the paged process): mimalloc over ordinary
        // memory, and no decision kept, so that one is made once it runs.
        return false;
    }
    if uswap::pager::in_handler() {
        // Inside uswap's SIGBUS handler or the system-call guard's, where
        // every signal is blocked whatever the program's mask: a thread
        // whose first call here is a fault (a new thread touching memory
        // that is out before it allocates, as a Go program's do) would be
        // taken for one that blocks SIGBUS, and every block it allocated
        // after, its heap arenas included, would be glibc's and the
        // kernel's, outside the budget.  glibc's for now, nothing kept:
        // the decision is made at its first call outside.
        return true;
    }
    // SAFETY: reads this thread's signal mask into a local set.
    let blocked = unsafe {
        let mut cur: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut cur);
        libc::sigismember(&cur, libc::SIGBUS) == 1
    };
    ROUTE.with(|r| r.set(if blocked { LIBC } else { HEAP }));
    blocked
}

/// The C runtime's code, `[start, end)` each: libc's and the dynamic
/// loader's.  Empty until uswap runs.
static RUNTIME_TEXT: [(AtomicUsize, AtomicUsize); 2] = [
    (AtomicUsize::new(0), AtomicUsize::new(0)),
    (AtomicUsize::new(0), AtomicUsize::new(0)),
];

/// Whether `caller`, a return address, is in the C runtime: libc or the
/// dynamic loader.  Their own blocks stay out of the heap, in both modes.
///
/// libc and the loader touch their own data where uswap cannot serve a
/// fault on it, or cannot let one happen:
/// - in SIGBUS mode, the system calls libc makes inside itself cannot be
///   pinned: stdio reading into a `FILE`'s buffer, `readdir` into a
///   `DIR`'s, `getcwd` and `realpath` into their results;
/// - a thread starting (glibc's `start_thread` reads the locale's tables,
///   which `setlocale` allocated) before any code of uswap's runs in it,
///   which in a forked child that adopts an instance in handler-thread
///   mode includes the very thread that is to serve faults;
/// - `dlsym`, the TLS of modules loaded later, from any thread.
///
/// So blocks asked for by their code come from glibc's allocator: small,
/// and not the program's data (what libc allocates on the program's
/// behalf, `strdup`'s copy or `getline`'s line, is the exception, and
/// stays resident).
#[inline]
fn from_libc(caller: usize) -> bool {
    RUNTIME_TEXT
        .iter()
        .any(|(start, end)| caller >= start.load(Ordering::Relaxed) && caller < end.load(Ordering::Relaxed))
}

extern "C" {
    /// The dynamic loader's (its address finds the loader's code).
    fn __tls_get_addr();
}

/// Keep the C runtime's own blocks out of the heap from now on: find the
/// executable segments of the objects that hold `__libc_malloc` (libc)
/// and `__tls_get_addr` (the loader).
pub(crate) fn keep_runtime_blocks_out() {
    let found = [
        crate::callers::text_of(__libc_malloc as *const () as usize),
        crate::callers::text_of(__tls_get_addr as *const () as usize),
    ];
    for (slot, &(lo, hi)) in RUNTIME_TEXT.iter().zip(&found) {
        slot.1.store(hi, Ordering::Relaxed);
        slot.0.store(lo, Ordering::Relaxed);
    }
}

/// Whether `p`, a block the malloc family gave, came from glibc's
/// allocator (a thread routed there) rather than mimalloc's.  Every block
/// that reaches `free` came from one of the two: the loader's own early
/// blocks are never freed through `malloc`'s interposer.
#[inline]
fn libc_block(p: *const c_void) -> bool {
    if p.is_null() {
        return false;
    }
    if let Some(r) = crate::running::RUNNING.get() {
        let base = r.region.as_ptr() as usize;
        if (base..base + r.region.len()).contains(&(p as usize)) {
            return false;
        }
    }
    // A call into mimalloc like any other (its first lookup may map the
    // page map, which must come from the kernel, not the heap).
    // SAFETY: a page-map lookup; any address may be asked.
    !mimalloc(|| unsafe { mi_is_in_heap_region(p) })
}

/// `free`: to the allocator that gave the block.
unsafe fn free_block(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    if libc_block(p) {
        // SAFETY: a block of glibc's allocator (`libc_block`).
        unsafe { __libc_free(p) }
    } else {
        let p = big_aligned_base(p as usize, true).map_or(p, |base| base as *mut c_void);
        if any_protected() {
            // Protection the program gave it goes with it.
            // SAFETY: a live block of mimalloc's.
            freeing(p as usize, unsafe { mimalloc(|| mi_malloc_usable_size(p)) });
        }
        // SAFETY: a block of mimalloc's, or null.
        unsafe { mimalloc(|| mi_free(p)) }
    }
}

/// Heap memory `malloc` gave whose protection the program changed:
/// start -> end, page aligned.  Put back to read-write when freed.
static PROTECTED: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());
/// Whether `PROTECTED` holds anything: `free` looks only then.
static ANY_PROTECTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn protected_map() -> std::sync::MutexGuard<'static, BTreeMap<usize, usize>> {
    PROTECTED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether any heap memory `malloc` gave is protected: only then does
/// `free` look (one load on its path).
#[inline]
pub(crate) fn any_protected() -> bool {
    ANY_PROTECTED.load(std::sync::atomic::Ordering::Relaxed)
}

/// A heap block of `len` bytes at `p` is being freed: whatever of it the
/// program protected becomes readable and writable again, as mimalloc
/// will hand it out.
pub(crate) fn freeing(p: usize, len: usize) {
    let lo = p / uswap::PAGE_SIZE * uswap::PAGE_SIZE;
    let hi = (p + len).next_multiple_of(uswap::PAGE_SIZE);
    let mut map = protected_map();
    let hits: Vec<(usize, usize)> = map
        .range(..hi)
        .filter(|&(_, &e)| e > lo)
        .map(|(&s, &e)| (s, e))
        .collect();
    for (s, e) in hits {
        map.remove(&s);
        let (a, b) = (s.max(lo), e.min(hi));
        // SAFETY: heap pages of the block being freed, made usable again.
        unsafe { libc::syscall(libc::SYS_mprotect, a, b - a, libc::PROT_READ | libc::PROT_WRITE) };
        if s < a {
            map.insert(s, a);
        }
        if e > b {
            map.insert(b, e);
        }
    }
    ANY_PROTECTED.store(!map.is_empty(), std::sync::atomic::Ordering::Release);
}

/// The program protected `[lo, hi)` (page aligned) of memory `malloc`
/// gave: made read-write again when freed.
pub(crate) fn protected(lo: usize, hi: usize) {
    protected_map().insert(lo, hi);
    ANY_PROTECTED.store(true, std::sync::atomic::Ordering::Release);
}

/// A failed allocation says why, as glibc's does: mimalloc may leave
/// errno as it was.
#[inline]
fn enomem_if_null(p: *mut c_void) -> *mut c_void {
    if p.is_null() {
        // SAFETY: errno is this thread's.
        unsafe { *libc::__errno_location() = libc::ENOMEM };
    }
    p
}

/// The largest alignment mimalloc serves from its arenas (its arena
/// slice); past it, it asks the OS, which it may not under `uswap run`.
const MI_ALIGN_MAX: usize = 64 << 10;

/// The alignment glibc's `memalign` (and, in glibc 2.36, `aligned_alloc`,
/// its alias) gives for `align`: at least malloc's own 16 bytes, an
/// alignment that is not a power of two rounded up to the next one
/// (`memalign(24, n)` is 32-byte aligned there; mimalloc refused it, and
/// the program got NULL); None past the largest power of two, which
/// glibc refuses with `EINVAL`.
fn as_glibc_aligns(align: usize) -> Option<usize> {
    const MALLOC_ALIGNMENT: usize = 16;
    if align > usize::MAX / 2 + 1 {
        return None;
    }
    Some(align.max(MALLOC_ALIGNMENT).next_power_of_two())
}

/// Blocks of an alignment past [`MI_ALIGN_MAX`] (a 2 MiB-aligned buffer
/// for huge pages, a 1 MiB-aligned arena of another allocator): an
/// over-allocation of mimalloc's, aligned inside.  Aligned start -> the
/// block mimalloc gave.  Rare: a map under a lock, looked at by `free`
/// only while it holds any.
static BIG_ALIGNED: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());
static ANY_BIG_ALIGNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn big_aligned_map() -> std::sync::MutexGuard<'static, BTreeMap<usize, usize>> {
    BIG_ALIGNED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `size` bytes aligned to `align` (a power of two past mimalloc's own).
fn big_aligned(align: usize, size: usize) -> *mut c_void {
    let Some(total) = size.max(1).checked_add(align) else {
        return enomem_if_null(std::ptr::null_mut());
    };
    // SAFETY: an allocation call.
    let p = or_more(|| unsafe { mi_malloc(total) });
    if p.is_null() {
        return enomem_if_null(p);
    }
    let a = (p as usize).next_multiple_of(align);
    let mut map = big_aligned_map();
    map.insert(a, p as usize);
    ANY_BIG_ALIGNED.store(true, Ordering::Release);
    a as *mut c_void
}

/// The mimalloc block under big-aligned `p`, if it is one (`take`: and
/// forget it, it is being freed).
#[inline]
fn big_aligned_base(p: usize, take: bool) -> Option<usize> {
    if !ANY_BIG_ALIGNED.load(Ordering::Acquire) {
        return None;
    }
    let mut map = big_aligned_map();
    if take {
        let base = map.remove(&p);
        ANY_BIG_ALIGNED.store(!map.is_empty(), Ordering::Release);
        base
    } else {
        map.get(&p).copied()
    }
}

/// `realloc` of a big-aligned block: a plain block of `size` with its
/// bytes (its alignment is not kept, as glibc's `realloc` keeps none).
fn realloc_big_aligned(p: *mut c_void, size: usize) -> Option<*mut c_void> {
    let base = big_aligned_base(p as usize, false)?;
    // SAFETY: the live block's usable size; then a fresh block, the old
    // bytes copied (the smaller of the two sizes), the old one freed.
    unsafe {
        let have = mimalloc(|| mi_malloc_usable_size(base as *const c_void)) - (p as usize - base);
        let q = or_more(|| mi_malloc(size));
        if q.is_null() {
            return Some(enomem_if_null(q));
        }
        std::ptr::copy_nonoverlapping(p.cast::<u8>(), q.cast::<u8>(), have.min(size));
        free_block(p);
        Some(q)
    }
}

/// The program allocates `size` bytes, from its own code: a safe point
/// to start uswap's background threads if the pager wants them, or will
/// once this is touched (`uswap::pager::expect_growth`: one load for a
/// small allocation when none is wanted).  Not from inside libc, which
/// may hold the locks starting a thread takes.
#[inline]
fn program_allocates(size: usize) {
    if !uswap::pager::in_handler() {
        uswap::pager::expect_growth(size);
    }
}

/// `posix_memalign` over glibc's allocator, which exports no such entry
/// point of its own: the argument checks of posix_memalign(3), then
/// `memalign`.
unsafe fn libc_posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> i32 {
    if !align.is_power_of_two() || !align.is_multiple_of(std::mem::size_of::<*mut c_void>()) {
        return libc::EINVAL;
    }
    // SAFETY: a plain C allocation call.
    let p = unsafe { __libc_memalign(align, size) };
    if p.is_null() {
        return libc::ENOMEM;
    }
    // SAFETY: `out` is the caller's, per the C contract.
    unsafe { *out = p };
    0
}

/// `malloc_usable_size` of a glibc block: glibc's own function, found at
/// start ([`find_libc_usable_size`]).
unsafe fn libc_usable_size(p: *const c_void) -> usize {
    let f = LIBC_USABLE_SIZE.load(Ordering::Acquire);
    if f.is_null() {
        return 0;
    }
    // SAFETY: glibc's `malloc_usable_size`, on one of its blocks.
    unsafe {
        let f: unsafe extern "C" fn(*const c_void) -> usize = std::mem::transmute(f);
        f(p)
    }
}

static LIBC_USABLE_SIZE: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// Look up glibc's `malloc_usable_size` (called once, at start): in libc
/// itself, not the next definition after this library's, which in a
/// program linked with another allocator (Redis with jemalloc) is that
/// allocator's, and knows nothing of glibc's blocks.
pub(crate) fn find_libc_usable_size() {
    // SAFETY: a handle on libc, loaded already (NOLOAD), and a symbol
    // lookup in it, with C strings.
    let f = unsafe {
        let libc_so = libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        if libc_so.is_null() {
            std::ptr::null_mut()
        } else {
            libc::dlsym(libc_so, c"malloc_usable_size".as_ptr())
        }
    };
    LIBC_USABLE_SIZE.store(f, Ordering::Release);
}

/// glibc's allocator, for this library's own Rust code.
struct LibcMalloc;

/// What glibc's malloc aligns to by itself.
const MALLOC_ALIGN: usize = 16;

// SAFETY: each method hands the layout to the glibc function that honours
// it: malloc/calloc/realloc for alignments malloc gives anyway, memalign
// for larger ones; memory is freed by the allocator that gave it.
unsafe impl GlobalAlloc for LibcMalloc {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: plain C allocation calls.
        unsafe {
            if l.align() <= MALLOC_ALIGN {
                __libc_malloc(l.size()).cast()
            } else {
                __libc_memalign(l.align(), l.size()).cast()
            }
        }
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if l.align() <= MALLOC_ALIGN {
            // SAFETY: a plain C allocation call.
            return unsafe { __libc_calloc(1, l.size()).cast() };
        }
        // SAFETY: as `alloc`; the fresh block is ours to zero.
        unsafe {
            let p = self.alloc(l);
            if !p.is_null() {
                p.write_bytes(0, l.size());
            }
            p
        }
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, size: usize) -> *mut u8 {
        if l.align() <= MALLOC_ALIGN {
            // SAFETY: `p` came from this allocator's malloc family.
            return unsafe { __libc_realloc(p.cast(), size).cast() };
        }
        // SAFETY: a fresh block of the new size, the old one's bytes copied
        // (the smaller of the two sizes), then the old one freed.
        unsafe {
            let q = self.alloc(Layout::from_size_align_unchecked(size, l.align()));
            if !q.is_null() {
                std::ptr::copy_nonoverlapping(p, q, l.size().min(size));
                self.dealloc(p, l);
            }
            q
        }
    }

    unsafe fn dealloc(&self, p: *mut u8, _: Layout) {
        // SAFETY: `p` came from glibc's allocator (above).
        unsafe { __libc_free(p.cast()) }
    }
}

#[global_allocator]
static ALLOC: LibcMalloc = LibcMalloc;
