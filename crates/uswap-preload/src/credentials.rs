//! Credential changes that reach every thread of the process, uswap's
//! included.
//!
//! glibc makes a credential change process-wide, as POSIX wants, by
//! having every thread make the system call itself (a signal of its own,
//! `SIGSETXID`, that no mask blocks): uswap's threads make it too, with
//! the program's arguments.  For `setgroups` one argument is the
//! program's list of groups, often in the heap (Python builds it with
//! `malloc`): in SIGBUS mode the system-call guard traps the call there,
//! in a thread of uswap's that blocks SIGSYS, and the kernel ends the
//! process (CPython's `os.setgroups` in a forked child died of SIGSYS
//! where a plain run raises `PermissionError`); in handler-thread mode a
//! list that is out would be brought in by a handler thread that is
//! itself in the call.  So `setgroups` copies a list in the heap into
//! uswap's own memory first.  The other credential calls take numbers.

use libc::{c_int, gid_t, size_t};

/// The most groups the kernel takes (`NGROUPS_MAX`); a longer list is
/// refused before the kernel reads it, and is passed on as it is.
const MOST_GROUPS: usize = 65_536;

#[allow(clippy::missing_safety_doc)] // the contract is the C one
mod interpose {
    use super::*;

    #[no_mangle]
    pub unsafe extern "C" fn setgroups(n: size_t, list: *const gid_t) -> c_int {
        let f = next!("setgroups" as fn(size_t, *const gid_t) -> c_int);
        if n == 0 {
            // No groups: no list (Python passes its empty array's pointer,
            // in the heap, which the guard's filter judges by itself).
            // SAFETY: the C contract.
            return unsafe { f(0, std::ptr::null()) };
        }
        if n > MOST_GROUPS || list.is_null() || !crate::calls::in_heap(list.cast(), n * 4) {
            // SAFETY: the C contract.
            return unsafe { f(n, list) };
        }
        // Read by this thread, as the program's own access (served), into
        // memory of glibc's allocator, outside the heap.
        // SAFETY: `n` groups at `list`, per the C contract.
        let copy: Vec<gid_t> = unsafe { std::slice::from_raw_parts(list, n) }.to_vec();
        // SAFETY: the C contract, with the same groups.
        unsafe { f(n, copy.as_ptr()) }
    }
}
