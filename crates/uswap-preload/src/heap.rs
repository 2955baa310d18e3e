//! The malloc family, interposed on libc's (mimalloc's, one call each),
//! and glibc's own allocator for this library's Rust code.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::ffi::c_void;

use libmimalloc_sys::{mi_aligned_alloc, mi_calloc, mi_free, mi_malloc, mi_posix_memalign, mi_realloc};

extern "C" {
    fn __libc_malloc(size: usize) -> *mut c_void;
    fn __libc_calloc(n: usize, size: usize) -> *mut c_void;
    fn __libc_realloc(p: *mut c_void, size: usize) -> *mut c_void;
    fn __libc_memalign(align: usize, size: usize) -> *mut c_void;
    fn __libc_free(p: *mut c_void);
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

    /// `malloc(3)`.
    #[no_mangle]
    pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
        // SAFETY: the C contract (module documentation).
        unsafe { mimalloc(|| mi_malloc(size)) }
    }

    /// `calloc(3)`.
    #[no_mangle]
    pub unsafe extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
        // SAFETY: the C contract (module documentation).
        unsafe { mimalloc(|| mi_calloc(n, size)) }
    }

    /// `realloc(3)`.
    #[no_mangle]
    pub unsafe extern "C" fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
        // SAFETY: the C contract (module documentation).
        unsafe { mimalloc(|| mi_realloc(p, size)) }
    }

    /// `reallocarray(3)`.
    #[no_mangle]
    pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void {
        // SAFETY: the C contract (module documentation).
        unsafe { mimalloc(|| mi_reallocarray(p, n, size)) }
    }

    /// `free(3)`.
    #[no_mangle]
    pub unsafe extern "C" fn free(p: *mut c_void) {
        // SAFETY: the C contract (module documentation).
        unsafe { mimalloc(|| mi_free(p)) }
    }

    /// `cfree`, an old alias of `free`.
    #[no_mangle]
    pub unsafe extern "C" fn cfree(p: *mut c_void) {
        // SAFETY: the C contract (module documentation).
        unsafe { mimalloc(|| mi_free(p)) }
    }

    /// `posix_memalign(3)`.
    #[no_mangle]
    pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> i32 {
        // SAFETY: the C contract (module documentation).
        unsafe { mimalloc(|| mi_posix_memalign(out, align, size)) }
    }

    /// `memalign(3)`.
    #[no_mangle]
    pub unsafe extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
        // SAFETY: the C contract (module documentation).
        unsafe { mimalloc(|| mi_memalign(align, size)) }
    }

    /// `aligned_alloc(3)`.
    #[no_mangle]
    pub unsafe extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
        // SAFETY: the C contract (module documentation).
        unsafe { mimalloc(|| mi_aligned_alloc(align, size)) }
    }

    /// `valloc(3)`.
    #[no_mangle]
    pub unsafe extern "C" fn valloc(size: usize) -> *mut c_void {
        // SAFETY: the C contract (module documentation).
        unsafe { mimalloc(|| mi_valloc(size)) }
    }

    /// `pvalloc(3)`.
    #[no_mangle]
    pub unsafe extern "C" fn pvalloc(size: usize) -> *mut c_void {
        // SAFETY: the C contract (module documentation).
        unsafe { mimalloc(|| mi_pvalloc(size)) }
    }

    /// `malloc_usable_size(3)`.
    #[no_mangle]
    pub unsafe extern "C" fn malloc_usable_size(p: *const c_void) -> usize {
        // SAFETY: the C contract (module documentation).
        unsafe { mimalloc(|| mi_malloc_usable_size(p)) }
    }
}

// mimalloc v3's option numbers (`mi_option_t` in mimalloc.h).
pub(crate) const MI_OPTION_PURGE_DELAY: i32 = 15;
pub(crate) const MI_OPTION_DISALLOW_OS_ALLOC: i32 = 17;

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
