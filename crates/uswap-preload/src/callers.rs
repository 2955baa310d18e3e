//! Who is calling an interposed function: the program, or this library's
//! own code (uswap's, which closes its own descriptors and sets its own
//! threads' masks through the same symbols the program reaches).
//!
//! An interposed function that must tell them apart is entered through a
//! shim ([`with_caller!`]) that passes its return address on as one more
//! argument, and asks [`ours`].

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};

/// This library's code: `[start, end)`; empty until [`start`].
static OWN_TEXT: (AtomicUsize, AtomicUsize) = (AtomicUsize::new(0), AtomicUsize::new(0));

/// Find this library's code.
pub(crate) fn start() {
    let (lo, hi) = text_of(start as *const () as usize);
    OWN_TEXT.1.store(hi, Ordering::Relaxed);
    OWN_TEXT.0.store(lo, Ordering::Relaxed);
}

/// Whether `caller`, a return address, is in this library's code.
#[inline]
pub(crate) fn ours(caller: usize) -> bool {
    caller >= OWN_TEXT.0.load(Ordering::Relaxed) && caller < OWN_TEXT.1.load(Ordering::Relaxed)
}

/// An interposed C function `$name` entered through a shim that puts the
/// return address in the register of one argument past its own (`$reg`)
/// and jumps to `$inner`, which takes that one more argument.  Elsewhere
/// than x86-64, `$inner` is called with 0: every caller is the program.
macro_rules! with_caller {
    ($name:ident($($arg:ident: $ty:ty),*) -> $ret:ty, $reg:literal, $inner:ident) => {
        #[cfg(target_arch = "x86_64")]
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            // On entry the return address is at the top of the stack.
            std::arch::naked_asm!(concat!("mov ", $reg, ", [rsp]"), "jmp {f}", f = sym $inner)
        }

        #[cfg(not(target_arch = "x86_64"))]
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            // SAFETY: the C contract; every caller counts as the program.
            unsafe { $inner($($arg,)* 0) }
        }
    };
}

/// The executable span `[start, end)` of the loaded object whose code
/// holds `addr` ((0, 0) when none does).
pub(crate) fn text_of(addr: usize) -> (usize, usize) {
    unsafe extern "C" fn each(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> i32 {
        // SAFETY: dl_iterate_phdr passes a valid info for each object,
        // whose program headers it points to; `data` is our triple.
        unsafe {
            let info = &*info;
            let found = &mut *data.cast::<(usize, usize, usize)>();
            let headers = std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize);
            let (mut lo, mut hi) = (usize::MAX, 0);
            for h in headers
                .iter()
                .filter(|h| h.p_type == libc::PT_LOAD && h.p_flags & libc::PF_X != 0)
            {
                let start = info.dlpi_addr as usize + h.p_vaddr as usize;
                lo = lo.min(start);
                hi = hi.max(start + h.p_memsz as usize);
            }
            if (lo..hi).contains(&found.0) {
                (found.1, found.2) = (lo, hi);
            }
        }
        0
    }
    let mut found = (addr, 0usize, 0usize);
    // SAFETY: walks the loaded objects with the callback above.
    unsafe { libc::dl_iterate_phdr(Some(each), (&mut found as *mut (usize, usize, usize)).cast()) };
    (found.1, found.2)
}
