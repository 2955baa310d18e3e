//! uswap's C ABI: the library's one handle and its regions, for C, C++
//! and anything with a C FFI (`include/uswap.h`, generated from this file
//! by cbindgen and checked in sync by the tests).
//!
//! What the handles own:
//!
//! - `uswap_config *`: settings only (budget, devices as swap specs, fault
//!   mode), freed with `uswap_config_free`; `uswap_open` copies them.
//! - `uswap_swap *`: one instance (its userfaultfd, devices, threads).
//!   `uswap_close` lets the handle go; the instance itself lives until
//!   its last region is unmapped too, so closing first is safe.
//! - `uswap_region *`: one mapping, `uswap_region_addr` .. `+ len`, zero
//!   filled and paged under the budget; `uswap_unmap` gives it back.  Its
//!   memory is the caller's to read and write from any thread.
//!
//! Errors are codes (`uswap_status`) with the one-line message of the
//! last failure on this thread in `uswap_last_error()`.  No Rust panic
//! crosses the boundary: one is caught and returned as
//! `USWAP_ERR_PANIC`.  Nothing here may be called from a signal handler.
//!
//! Fork: a forked child adopts the instance, as the Rust library's does
//! (docs/DESIGN.md, "fork without exec"): its copies of the regions keep
//! their contents, swapped-out pages included, and it may map regions of
//! its own.  `USWAP_ERR_FORKED` is for a child made without the fork
//! handlers (a raw `clone`).

#![allow(non_camel_case_types)]

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use uswap::pager::{FaultMode, PagerError, Region, Swap, SwapDeviceSpec};

/// What a call returned: `USWAP_OK`, or why it failed (the message is in
/// `uswap_last_error()`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum uswap_status {
    /// Done.
    USWAP_OK = 0,
    /// A pointer argument was NULL.
    USWAP_ERR_NULL = 1,
    /// A value out of range (a budget under a page, a length of zero, a
    /// range past a region's end) or a string that is not UTF-8.
    USWAP_ERR_INVALID = 2,
    /// A swap spec that does not parse (`zram:SIZE`, `file:PATH:SIZE`,
    /// `nbd://HOST/EXPORT`, ...).
    USWAP_ERR_SPEC = 3,
    /// A swap device could not be set up (a file, a server).
    USWAP_ERR_DEVICE = 4,
    /// The kernel lacks what uswap needs, or refused it (userfaultfd,
    /// `UFFDIO_MOVE`: Linux 6.8 or newer).
    USWAP_ERR_KERNEL = 5,
    /// Memory for the region or uswap's tables could not be mapped.
    USWAP_ERR_NOMEM = 6,
    /// Too many regions, or pages, for this instance.
    USWAP_ERR_LIMIT = 7,
    /// Called in a child of the process that opened the instance that did
    /// not adopt it (made by a raw `clone`, not `fork`).
    USWAP_ERR_FORKED = 8,
    /// uswap failed inside (a bug, please report it with the message).
    USWAP_ERR_PANIC = 9,
}

/// Who serves faults (see the README: SIGBUS mode is any user's and the
/// faster; handler-thread mode also serves the kernel's own accesses to
/// a region, such as `read(2)` into it, and needs root or
/// `vm.unprivileged_userfaultfd=1`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum uswap_fault_mode {
    /// The faulting thread, in a SIGBUS handler (the default).
    USWAP_MODE_SIGBUS = 0,
    /// uswap's handler threads.
    USWAP_MODE_HANDLER = 1,
}

/// An instance's statistics (`uswap_stats`): bytes and counts.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct uswap_stats {
    /// The budget.
    pub budget_bytes: u64,
    /// Memory of the regions resident now.
    pub resident_bytes: u64,
    /// The most ever resident.
    pub peak_resident_bytes: u64,
    /// Swap space in all.
    pub swap_total_bytes: u64,
    /// Swap space holding pages.
    pub swap_used_bytes: u64,
    /// Faults served.
    pub faults: u64,
    /// Pages read back from swap by faults.
    pub swapins: u64,
    /// Pages read ahead of faults.
    pub readahead: u64,
    /// Pages evicted.
    pub evictions: u64,
    /// Bytes written to the swap devices.
    pub io_write_bytes: u64,
    /// Bytes read from the swap devices.
    pub io_read_bytes: u64,
}

/// Settings for `uswap_open`.
pub struct uswap_config {
    budget: u64,
    devices: Vec<SwapDeviceSpec>,
    mode: FaultMode,
}

/// An open instance.
pub struct uswap_swap(Swap);

/// A mapped region.
pub struct uswap_region(Region);

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_error(message: String) {
    // A message with a NUL in it (from a path) is cut there.
    let bytes: Vec<u8> = message.into_bytes().into_iter().take_while(|&b| b != 0).collect();
    let c = CString::new(bytes).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

fn fail(status: uswap_status, message: impl Into<String>) -> uswap_status {
    set_error(message.into());
    status
}

fn pager_error(e: PagerError) -> uswap_status {
    let status = match &e {
        PagerError::Uffd(_) => uswap_status::USWAP_ERR_KERNEL,
        PagerError::Io(_) => uswap_status::USWAP_ERR_DEVICE,
        PagerError::Mmap { .. } | PagerError::Metadata(_) => uswap_status::USWAP_ERR_NOMEM,
        PagerError::TooManyRegions | PagerError::TooManyPages { .. } => uswap_status::USWAP_ERR_LIMIT,
        PagerError::Forked { .. } => uswap_status::USWAP_ERR_FORKED,
        _ => uswap_status::USWAP_ERR_INVALID,
    };
    fail(status, e.to_string())
}

/// Run `f`, a panic caught and returned as `USWAP_ERR_PANIC`.
fn guarded(f: impl FnOnce() -> uswap_status) -> uswap_status {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(s) => {
            if s == uswap_status::USWAP_OK {
                set_error(String::new());
            }
            s
        }
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            fail(
                uswap_status::USWAP_ERR_PANIC,
                format!("uswap failed inside: {what}; please report it"),
            )
        }
    }
}

/// The message of the last call on this thread that failed ("" after
/// one that worked): one line, naming the cause and what to do.  Valid
/// until the next uswap call on this thread.
#[no_mangle]
pub extern "C" fn uswap_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// New settings: a 64 MiB budget, no device yet, SIGBUS mode.
#[no_mangle]
pub extern "C" fn uswap_config_new() -> *mut uswap_config {
    Box::into_raw(Box::new(uswap_config {
        budget: 64 << 20,
        devices: Vec::new(),
        mode: FaultMode::Sigbus,
    }))
}

/// Free settings from `uswap_config_new` (NULL is ignored).
///
/// # Safety
/// `config` is NULL or from `uswap_config_new`, not freed before.
#[no_mangle]
pub unsafe extern "C" fn uswap_config_free(config: *mut uswap_config) {
    if !config.is_null() {
        // SAFETY: from Box::into_raw in uswap_config_new, freed once.
        drop(unsafe { Box::from_raw(config) });
    }
}

/// Set the memory budget: at most this many bytes of the regions are
/// resident (at least a page).
///
/// # Safety
/// `config` is NULL or a live config.
#[no_mangle]
pub unsafe extern "C" fn uswap_config_budget(config: *mut uswap_config, bytes: u64) -> uswap_status {
    guarded(|| {
        // SAFETY: NULL or a live config, by the contract.
        let Some(c) = (unsafe { config.as_mut() }) else {
            return fail(
                uswap_status::USWAP_ERR_NULL,
                "uswap_config_budget: config is NULL",
            );
        };
        if bytes < uswap::PAGE_SIZE as u64 {
            return fail(
                uswap_status::USWAP_ERR_INVALID,
                format!("a budget of {bytes} bytes is less than a page: give at least 4096"),
            );
        }
        c.budget = bytes;
        uswap_status::USWAP_OK
    })
}

/// Add a swap device, written as a swap spec: `zram:1G`, `ram:512M`,
/// `file:/var/tmp/x.swap:8G`, `zram:1G,file:/var/tmp/x.swap:8G`,
/// `nbd://HOST/EXPORT`...  Devices are used in the order given.
///
/// # Safety
/// `config` is NULL or a live config; `spec` is NULL or a NUL-terminated
/// string.
#[no_mangle]
pub unsafe extern "C" fn uswap_config_device(config: *mut uswap_config, spec: *const c_char) -> uswap_status {
    guarded(|| {
        // SAFETY: NULL or a live config, by the contract.
        let Some(c) = (unsafe { config.as_mut() }) else {
            return fail(
                uswap_status::USWAP_ERR_NULL,
                "uswap_config_device: config is NULL",
            );
        };
        if spec.is_null() {
            return fail(uswap_status::USWAP_ERR_NULL, "uswap_config_device: spec is NULL");
        }
        // SAFETY: a NUL-terminated string, by the contract.
        let Ok(s) = unsafe { CStr::from_ptr(spec) }.to_str() else {
            return fail(
                uswap_status::USWAP_ERR_INVALID,
                "uswap_config_device: the spec is not UTF-8",
            );
        };
        match s.parse::<SwapDeviceSpec>() {
            Ok(d) => {
                c.devices.push(d);
                uswap_status::USWAP_OK
            }
            Err(e) => fail(uswap_status::USWAP_ERR_SPEC, e.to_string()),
        }
    })
}

/// Who serves faults (default `USWAP_MODE_SIGBUS`).
///
/// # Safety
/// `config` is NULL or a live config.
#[no_mangle]
pub unsafe extern "C" fn uswap_config_fault_mode(
    config: *mut uswap_config,
    mode: uswap_fault_mode,
) -> uswap_status {
    guarded(|| {
        // SAFETY: NULL or a live config, by the contract.
        let Some(c) = (unsafe { config.as_mut() }) else {
            return fail(
                uswap_status::USWAP_ERR_NULL,
                "uswap_config_fault_mode: config is NULL",
            );
        };
        c.mode = match mode {
            uswap_fault_mode::USWAP_MODE_SIGBUS => FaultMode::Sigbus,
            uswap_fault_mode::USWAP_MODE_HANDLER => FaultMode::HandlerThread,
        };
        uswap_status::USWAP_OK
    })
}

/// Open an instance with `config` (which the caller still owns): its
/// devices made, its threads started.  Without a device, a compressed
/// store of four times the budget.
///
/// # Safety
/// `config` is NULL or a live config; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn uswap_open(config: *const uswap_config, out: *mut *mut uswap_swap) -> uswap_status {
    guarded(|| {
        // SAFETY: NULL or a live config, by the contract.
        let Some(c) = (unsafe { config.as_ref() }) else {
            return fail(uswap_status::USWAP_ERR_NULL, "uswap_open: config is NULL");
        };
        if out.is_null() {
            return fail(uswap_status::USWAP_ERR_NULL, "uswap_open: out is NULL");
        }
        let mut b = Swap::builder().budget(c.budget).fault_mode(c.mode);
        if c.devices.is_empty() {
            b = b.device(SwapDeviceSpec::compressed(uswap::spec::CompressedOptions::new(
                c.budget.saturating_mul(4),
            )));
        }
        for d in &c.devices {
            b = b.device(d.clone());
        }
        match b.build() {
            Ok(swap) => {
                // SAFETY: writable, by the contract.
                unsafe { *out = Box::into_raw(Box::new(uswap_swap(swap))) };
                uswap_status::USWAP_OK
            }
            Err(e) => pager_error(e),
        }
    })
}

/// Let the handle go (NULL is ignored).  Regions still mapped stay
/// usable; the instance ends with the last of them.
///
/// # Safety
/// `swap` is NULL or from `uswap_open`, not closed before.
#[no_mangle]
pub unsafe extern "C" fn uswap_close(swap: *mut uswap_swap) {
    if !swap.is_null() {
        // SAFETY: from Box::into_raw in uswap_open, freed once.
        let swap = unsafe { Box::from_raw(swap) };
        let _ = catch_unwind(AssertUnwindSafe(|| drop(swap)));
    }
}

/// Map a region of `len` bytes (rounded up to pages), zero filled, paged
/// under the instance's budget.
///
/// # Safety
/// `swap` is NULL or a live instance; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn uswap_map(
    swap: *const uswap_swap,
    len: usize,
    out: *mut *mut uswap_region,
) -> uswap_status {
    guarded(|| {
        // SAFETY: NULL or a live instance, by the contract.
        let Some(s) = (unsafe { swap.as_ref() }) else {
            return fail(uswap_status::USWAP_ERR_NULL, "uswap_map: swap is NULL");
        };
        if out.is_null() {
            return fail(uswap_status::USWAP_ERR_NULL, "uswap_map: out is NULL");
        }
        if len == 0 {
            return fail(
                uswap_status::USWAP_ERR_INVALID,
                "uswap_map: a region of 0 bytes; give a length",
            );
        }
        match s.0.map(len) {
            Ok(r) => {
                // SAFETY: writable, by the contract.
                unsafe { *out = Box::into_raw(Box::new(uswap_region(r))) };
                uswap_status::USWAP_OK
            }
            Err(e) => pager_error(e),
        }
    })
}

/// The region's first byte (page aligned).
///
/// # Safety
/// `region` is NULL (then NULL is returned) or a live region.
#[no_mangle]
pub unsafe extern "C" fn uswap_region_addr(region: *const uswap_region) -> *mut c_void {
    // SAFETY: NULL or a live region, by the contract.
    match unsafe { region.as_ref() } {
        Some(r) => r.0.as_ptr().cast(),
        None => std::ptr::null_mut(),
    }
}

/// The region's length in bytes (whole pages).
///
/// # Safety
/// `region` is NULL (then 0) or a live region.
#[no_mangle]
pub unsafe extern "C" fn uswap_region_len(region: *const uswap_region) -> usize {
    // SAFETY: NULL or a live region, by the contract.
    unsafe { region.as_ref() }.map_or(0, |r| r.0.len())
}

/// Unmap a region: its memory and swap are given back, its address is
/// no longer the caller's.  NULL is `USWAP_ERR_NULL`.
///
/// # Safety
/// `region` is NULL or from `uswap_map`, not unmapped before; nothing
/// touches its memory afterwards.
#[no_mangle]
pub unsafe extern "C" fn uswap_unmap(region: *mut uswap_region) -> uswap_status {
    if region.is_null() {
        return fail(uswap_status::USWAP_ERR_NULL, "uswap_unmap: region is NULL");
    }
    // SAFETY: from Box::into_raw in uswap_map, freed once.
    let r = unsafe { Box::from_raw(region) };
    guarded(move || {
        drop(r);
        uswap_status::USWAP_OK
    })
}

/// Discard `len` bytes at `offset` of a region (whole pages): they read
/// as zeros again and their memory and swap are given back, as
/// `MADV_DONTNEED` does for anonymous memory.
///
/// # Safety
/// `region` is NULL or a live region.
#[no_mangle]
pub unsafe extern "C" fn uswap_discard(
    region: *const uswap_region,
    offset: usize,
    len: usize,
) -> uswap_status {
    guarded(|| {
        // SAFETY: NULL or a live region, by the contract.
        let Some(r) = (unsafe { region.as_ref() }) else {
            return fail(uswap_status::USWAP_ERR_NULL, "uswap_discard: region is NULL");
        };
        match r.0.discard(offset, len) {
            Ok(()) => uswap_status::USWAP_OK,
            Err(e) => pager_error(e),
        }
    })
}

/// Change the budget at run time (pages over it are evicted).
///
/// # Safety
/// `swap` is NULL or a live instance.
#[no_mangle]
pub unsafe extern "C" fn uswap_set_budget(swap: *const uswap_swap, bytes: u64) -> uswap_status {
    guarded(|| {
        // SAFETY: NULL or a live instance, by the contract.
        let Some(s) = (unsafe { swap.as_ref() }) else {
            return fail(uswap_status::USWAP_ERR_NULL, "uswap_set_budget: swap is NULL");
        };
        match s.0.set_budget(bytes) {
            Ok(()) => uswap_status::USWAP_OK,
            Err(e) => pager_error(e),
        }
    })
}

/// The instance's statistics now, into `out`.
///
/// # Safety
/// `swap` is NULL or a live instance; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn uswap_stats_get(swap: *const uswap_swap, out: *mut uswap_stats) -> uswap_status {
    guarded(|| {
        // SAFETY: NULL or a live instance, by the contract.
        let Some(s) = (unsafe { swap.as_ref() }) else {
            return fail(uswap_status::USWAP_ERR_NULL, "uswap_stats_get: swap is NULL");
        };
        if out.is_null() {
            return fail(uswap_status::USWAP_ERR_NULL, "uswap_stats_get: out is NULL");
        }
        let page = uswap::PAGE_SIZE as u64;
        let st = s.0.stats();
        let stats = uswap_stats {
            budget_bytes: s.0.budget_pages() as u64 * page,
            resident_bytes: s.0.resident_pages() as u64 * page,
            peak_resident_bytes: s.0.peak_resident_pages() as u64 * page,
            swap_total_bytes: s.0.total_slots() * page,
            swap_used_bytes: (s.0.total_slots() - s.0.free_slots()) * page,
            faults: st.counters.faults,
            swapins: st.counters.swapins,
            readahead: st.counters.readahead,
            evictions: st.counters.evictions,
            io_write_bytes: st.counters.io_write_pages * page,
            io_read_bytes: st.counters.io_read_pages * page,
        };
        // SAFETY: writable, by the contract.
        unsafe { *out = stats };
        uswap_status::USWAP_OK
    })
}
