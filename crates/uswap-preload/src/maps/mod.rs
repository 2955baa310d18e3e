//! The program's own anonymous memory: `mmap`, `munmap`, `mremap` and
//! `madvise`, interposed on libc's.
//!
//! A private anonymous read-write mapping the program asks for (no
//! address, no file: Python's small-object arenas, a JIT's heap, a large
//! buffer) is served from the paged heap instead: a page-aligned mimalloc
//! block, zeroed by `Region::discard` (no page touched), remembered here.
//!
//! So is a reservation: a private anonymous mapping with no access
//! (`PROT_NONE`), with or without an address hint, which a runtime commits
//! later, a part at a time, with `mprotect` (V8) or with `mmap(MAP_FIXED)`
//! of anonymous memory over it (OpenJDK's heap, metaspace, card table),
//! and uncommits with `mmap(MAP_FIXED, PROT_NONE)` or `madvise`.  The
//! block is served inaccessible; a fixed anonymous mapping over part of a
//! served block, readable and writable or inaccessible, is done in place
//! (its pages discarded, then their protection set): the memory stays the
//! region's, registered and paged, where the kernel's mapping would have
//! put unpaged memory in its place.  The hint is not honoured, as the
//! kernel need not: OpenJDK and V8 ask for an address (compressed
//! pointers, ASLR) and take what they get, placing the heap where it came
//! (OpenJDK then bases its compressed pointers on the heap's start).  A
//! reservation is carved from the one heap region, not made a region of
//! its own at its own address: the heap's address space is the machine's
//! memory and the swap together (tens of GiB), its page ids are there
//! already, and a region of its own would need the pager to follow every
//! trim of the reservation (both runtimes reserve more than they need and
//! unmap the ends to align it).
//!
//! Everything else goes to the kernel unchanged, through the system call
//! (libc's `mmap` would be this one again).
//!
//! On memory served so: `munmap` discards the pages (they read as zeros,
//! their memory and slots go back) and frees the block once all of it was
//! unmapped (kept a while first, in case the program asks for that
//! address again: `table.rs`'s quarantine); `mremap` shrinks in place
//! (the tail discarded) or, allowed to move, moves into a new block, to
//! the address asked (`MREMAP_FIXED`), or leaves the old range empty
//! (`MREMAP_DONTUNMAP`), and refuses to grow in place (ENOMEM, as the
//! kernel does where the next pages are taken); `madvise` advice that
//! changes what memory holds is carried out by uswap (`MADV_DONTNEED`
//! discards, `MADV_WIPEONFORK` wipes in a forked child), the rest reaches
//! the kernel. `madvise(MADV_DONTNEED)` on heap memory that `malloc` gave
//! (a program trimming its own allocator's memory) discards too: the
//! kernel's call would miss the pages uswap holds.
//!
//! What the program does to memory served so outlives none of it: a
//! block it changed the protection of (`mprotect`: a guard page under a
//! fiber stack, code a JIT made executable) or mapped something over
//! (`mmap` with `MAP_FIXED`: a file) is put back fresh when unmapped
//! (`Region::restore`: anonymous, readable and writable, zero), before
//! it is served again; pages a file is mapped over are discarded first,
//! so that uswap never takes the file's pages for its own.  Heap memory
//! `malloc` gave that the program protects is put back to readable and
//! writable when it is freed.
//!
//! Calls mimalloc itself makes (its metadata) go to the kernel: see
//! `heap::in_mimalloc`; so do those of threads whose blocks come from
//! glibc's allocator (`heap::to_libc`: uswap's own, and in SIGBUS mode
//! threads that block SIGBUS).

use std::ffi::c_void;
use std::sync::Mutex;

use libmimalloc_sys::{mi_free, mi_malloc_aligned};

use crate::heap::{in_mimalloc, mimalloc, to_libc};
use crate::running::RUNNING;

const PAGE: usize = uswap::PAGE_SIZE;

mod table;

use table::Table;

/// Blocks served as mappings (`table.rs`), under a lock: `mmap` and
/// `munmap` are not hot paths.  Its memory is glibc's (as all of this
/// library's).
static SERVED: Mutex<Table> = Mutex::new(Table::new());

fn served() -> std::sync::MutexGuard<'static, Table> {
    SERVED.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Give blocks back to mimalloc (taken out of the table, outside its lock).
fn free_blocks(starts: Vec<usize>) {
    for s in starts {
        // SAFETY: a block `serve` allocated, out of the table, unmapped.
        unsafe { mimalloc(|| mi_free(s as *mut c_void)) };
    }
}

/// Mark what of `[a, a + len)` is served as altered; what is not (memory
/// `malloc` gave), when `protect`, as protected.
fn alter(a: usize, len: usize, protect: bool) {
    let end = a.saturating_add(len);
    let mut map = served();
    let mut covered = false;
    for s in map.overlapping(a, end) {
        let b = map.get_mut(s).expect("listed above");
        b.altered = true;
        covered |= s <= a && s + b.len >= end;
    }
    drop(map);
    if protect && !covered {
        crate::heap::protected(a / PAGE * PAGE, end.next_multiple_of(PAGE));
    }
}

/// The lock of `SERVED`, held across a fork by the forking thread, so
/// that a child never inherits it held by a thread it does not have.
static FORK_GUARD: std::sync::atomic::AtomicPtr<std::sync::MutexGuard<'static, Table>> =
    std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

/// Take `SERVED`'s lock before every fork, let go after it on both sides;
/// in the child, first wipe what the program asked to be
/// (`MADV_WIPEONFORK`).  Also sizes the quarantine: a sixteenth of the
/// heap's address space.
pub(crate) fn hold_across_fork() {
    if let Some((base, end, _)) = heap() {
        served().set_quarantine_cap((end - base) / 16);
    }
    extern "C" fn prepare() {
        let g = Box::new(served());
        FORK_GUARD.store(Box::into_raw(g), std::sync::atomic::Ordering::Relaxed);
    }
    fn release() -> Option<Box<std::sync::MutexGuard<'static, Table>>> {
        let g = FORK_GUARD.swap(std::ptr::null_mut(), std::sync::atomic::Ordering::Relaxed);
        // SAFETY: the guard `prepare` boxed, taken back once.
        (!g.is_null()).then(|| unsafe { Box::from_raw(g) })
    }
    extern "C" fn parent() {
        drop(release());
    }
    extern "C" fn child() {
        let Some(g) = release() else {
            return;
        };
        let wipes = g.wipes();
        drop(g);
        if let Some((base, _, r)) = heap() {
            for (lo, hi) in wipes {
                discard(r, base, lo, hi - lo);
            }
        }
    }
    // SAFETY: registers functions with no preconditions.
    unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
}

fn set_errno(e: i32) {
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() = e };
}

/// The heap region's range, once uswap runs.
fn heap() -> Option<(usize, usize, &'static crate::running::Running)> {
    let r = RUNNING.get()?;
    let base = r.region.as_ptr() as usize;
    Some((base, base + r.region.len(), r))
}

/// Discard the whole pages of `[addr, addr + len)` in the heap.
fn discard(r: &crate::running::Running, base: usize, addr: usize, len: usize) {
    let lo = addr.next_multiple_of(PAGE);
    let hi = (addr + len) / PAGE * PAGE;
    if hi > lo {
        // A range of the region, page aligned: cannot be refused but for
        // an mlock'd range, which keeps its contents, as the kernel does.
        let _ = r.region.discard(lo - base, hi - lo);
    }
}

/// The mappings `/proc/self/maps` lists: (start, end, its line).
fn vmas(maps: &str) -> impl Iterator<Item = (u64, u64, &str)> {
    maps.lines().filter_map(|line| {
        let (a, b) = line.split_whitespace().next()?.split_once('-')?;
        Some((
            u64::from_str_radix(a, 16).ok()?,
            u64::from_str_radix(b, 16).ok()?,
            line,
        ))
    })
}

/// Whether this process may lock all of the program's mappings (listed
/// in `maps`, less uswap's `own`): it is privileged (`CAP_IPC_LOCK`,
/// taken for root's), or their size is within `RLIMIT_MEMLOCK`, the
/// kernel's check for `mlockall(MCL_CURRENT)`.
fn may_lock(maps: &str, own: &[(u64, u64)]) -> bool {
    // SAFETY: reads a limit into a local struct; geteuid has no
    // preconditions.
    let (limit, root) = unsafe {
        let mut rl: libc::rlimit = std::mem::zeroed();
        libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut rl);
        (rl.rlim_cur, libc::geteuid() == 0)
    };
    if root || limit == libc::RLIM_INFINITY {
        return true;
    }
    let mut total = 0u64;
    for (lo, hi, _) in vmas(maps) {
        let theirs: u64 = own
            .iter()
            .map(|&(s, l)| (s + l).min(hi).saturating_sub(s.max(lo)))
            .sum();
        total += (hi - lo).saturating_sub(theirs);
    }
    total <= limit
}

/// The system call itself.
unsafe fn sys_mmap(addr: *mut c_void, len: usize, prot: i32, flags: i32, fd: i32, off: i64) -> *mut c_void {
    // SAFETY: the caller's arguments, to the kernel.
    unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) as *mut c_void }
}

/// Whether a mapping request is one the heap serves: private anonymous
/// memory, readable and writable with no address asked for, or
/// inaccessible (a reservation) with or without a hint.
fn servable(addr: *mut c_void, len: usize, prot: i32, flags: i32, fd: i32) -> bool {
    fd == -1
        && len > 0
        && ((addr.is_null() && prot == libc::PROT_READ | libc::PROT_WRITE) || prot == libc::PROT_NONE)
        && flags & !IGNORED_FLAGS == libc::MAP_PRIVATE | libc::MAP_ANONYMOUS
        && !in_mimalloc()
        && !to_libc()
}

/// Flags a served mapping does without: `MAP_NORESERVE` (the heap's
/// memory is committed as it is touched anyway) and `MAP_POPULATE` (pages
/// asked in at once; served memory comes in at its first touch, and a
/// mapping larger than the budget could not all be in: stress-ng's
/// mremap stressor maps 256 MiB so, which went to the kernel unpaged).
const IGNORED_FLAGS: i32 = libc::MAP_NORESERVE | libc::MAP_POPULATE;

/// Whether a fixed mapping is one done in place over a served block:
/// private anonymous memory, readable and writable or inaccessible (a
/// runtime committing or uncommitting part of its reservation), page
/// aligned.
fn in_place(addr: *mut c_void, len: usize, prot: i32, flags: i32, fd: i32) -> bool {
    fd == -1
        && len > 0
        && (addr as usize).is_multiple_of(PAGE)
        && (prot == libc::PROT_READ | libc::PROT_WRITE || prot == libc::PROT_NONE)
        && flags & !IGNORED_FLAGS == libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED
        && !in_mimalloc()
        && !to_libc()
}

/// Serve a mapping of `len` bytes from the heap: a zeroed, page-aligned
/// block, inaccessible when `prot` is `PROT_NONE`; None when the heap has
/// no room (after the quarantine has given back what it held).
fn serve(len: usize, prot: i32) -> Option<*mut c_void> {
    let (base, _, r) = heap()?;
    let len = len.next_multiple_of(PAGE);
    // SAFETY: an allocation call.
    let mut p = crate::heap::or_more(|| unsafe { mi_malloc_aligned(len, PAGE) });
    if p.is_null() {
        let held = served().trim(0, 0);
        if held.is_empty() {
            return None;
        }
        free_blocks(held);
        // SAFETY: as above.
        p = unsafe { mimalloc(|| mi_malloc_aligned(len, PAGE)) };
        if p.is_null() {
            return None;
        }
    }
    // A fresh mapping reads as zeros; a reused block may not.
    discard(r, base, p as usize, len);
    let altered = prot != libc::PROT_READ | libc::PROT_WRITE;
    // SAFETY: the block just allocated, whole pages of the region; its
    // protection changes, its registration stays.
    if altered && unsafe { libc::syscall(libc::SYS_mprotect, p, len, prot) } != 0 {
        // SAFETY: the block just allocated, untouched.
        unsafe { mimalloc(|| mi_free(p)) };
        return None;
    }
    served().insert(p as usize, len, altered);
    Some(p)
}

/// A fixed private anonymous mapping over part of one served block
/// (mapped now, or unmapped and still held by the quarantine), done in
/// place: the pages discarded (they read as zeros, their slots go back),
/// then given `prot`, and counted as mapped.  False when the range is not
/// wholly inside one served block (the kernel's mapping then replaces
/// what is there).
fn map_in_place(addr: usize, len: usize, prot: i32) -> bool {
    let Some((base, _, r)) = heap() else {
        return false;
    };
    let len = len.next_multiple_of(PAGE);
    let mut map = served();
    let Some(start) = map.block_of(addr) else {
        return false;
    };
    if addr + len > start + map.get(start).expect("found above").len {
        return false;
    }
    // Discarded first: the pages are zero by the time they are
    // accessible, as a fresh mapping's.
    discard(r, base, addr, len);
    // SAFETY: whole pages of a served block (checked above); only their
    // protection changes.
    if unsafe { libc::syscall(libc::SYS_mprotect, addr, len, prot) } != 0 {
        return false;
    }
    map.map(start, addr, addr + len);
    if prot != libc::PROT_READ | libc::PROT_WRITE {
        map.get_mut(start).expect("found above").altered = true;
    }
    true
}

/// Unmap `[lo, hi)` (page aligned) of the served blocks it covers: each
/// piece put back fresh (an altered block) or discarded, then counted
/// unmapped; blocks with nothing mapped left go to the quarantine.  Heap
/// memory no block covers (malloc's) is left alone.
fn unmap_served(r: &crate::running::Running, base: usize, lo: usize, hi: usize) {
    let mut map = served();
    let mut freed = Vec::new();
    for start in map.overlapping(lo, hi) {
        let b = map.get(start).expect("listed above");
        let (a, e) = (lo.max(start), hi.min(start + b.len));
        if b.altered {
            // Back to fresh region memory: the program's protection and
            // anything it mapped there go.
            if r.region.restore(a - base, e - a).is_err() {
                discard(r, base, a, e - a);
            }
        } else {
            discard(r, base, a, e - a);
        }
        freed.extend(map.unmap(start, a, e));
    }
    drop(map);
    free_blocks(freed);
}

/// `mremap`'s `MREMAP_FIXED` target `[to, to + len)`, made ready to take
/// the moved pages: inside one served block (mapped, or held by the
/// quarantine: an address the program found by mapping and unmapping),
/// discarded and counted mapped; wholly outside the heap, a fresh kernel
/// mapping (unpaged, as any mapping there).  Err: an errno, when the
/// target is heap memory no block holds (malloc's: the kernel would
/// clobber it).
fn fixed_target(to: usize, len: usize) -> Result<(), i32> {
    let (base, end, _) = heap().ok_or(libc::EINVAL)?;
    if to + len <= base || to >= end {
        // SAFETY: a fixed private anonymous mapping outside the heap, at
        // an address the program chose for its memory.
        let p = unsafe {
            sys_mmap(
                to as *mut c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        return if p == libc::MAP_FAILED {
            Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::ENOMEM))
        } else {
            Ok(())
        };
    }
    if map_in_place(to, len, libc::PROT_READ | libc::PROT_WRITE) {
        return Ok(());
    }
    Err(libc::EINVAL)
}

/// The interposed calls.  Their callers are C programs: each function's
/// contract is the C one (its manual page).
#[allow(clippy::missing_safety_doc)] // the contract is the C one, above
mod interpose {
    use super::*;

    /// `mmap(2)`.
    #[no_mangle]
    pub unsafe extern "C" fn mmap(
        addr: *mut c_void,
        len: usize,
        prot: i32,
        flags: i32,
        fd: i32,
        off: i64,
    ) -> *mut c_void {
        if in_place(addr, len, prot, flags, fd) && map_in_place(addr as usize, len, prot) {
            return addr;
        }
        if flags & libc::MAP_FIXED != 0 && !in_mimalloc() {
            if let Some((base, end, r)) = heap() {
                let a = addr as usize;
                if a < end && a.saturating_add(len) > base {
                    // Something mapped over heap memory: its pages are
                    // uswap's no more (dropped first, so that no eviction
                    // takes the new mapping's pages for the region's),
                    // and a served block under it is put back fresh at
                    // its unmapping.
                    let (lo, hi) = (a.max(base), a.saturating_add(len).min(end));
                    discard(r, base, lo, hi - lo);
                    alter(lo, hi - lo, false);
                    // The new mapping holds its place in a served block
                    // (one the quarantine held among them) until unmapped.
                    let mut map = served();
                    for start in map.overlapping(lo, hi) {
                        map.map(start, lo, hi);
                    }
                }
            }
        }
        if servable(addr, len, prot, flags, fd) {
            // The program maps memory of its own: a safe point to start
            // uswap's background threads, as its `malloc` is (heap.rs).
            if !uswap::pager::in_handler() {
                // A reservation (`PROT_NONE`: V8's cage, a JVM's heap)
                // is address space, not memory about to be touched.
                uswap::pager::expect_growth(if prot == libc::PROT_NONE { 0 } else { len });
            }
            if let Some(p) = serve(len, prot) {
                return p;
            }
            // A reservation the heap has no room for is the kernel's (it
            // costs no memory until committed); other memory fails.
            if heap().is_some() && prot != libc::PROT_NONE {
                // The heap is full: as the kernel says when memory is.
                set_errno(libc::ENOMEM);
                return libc::MAP_FAILED;
            }
        }
        // SAFETY: the caller's request, to the kernel.
        unsafe { sys_mmap(addr, len, prot, flags, fd, off) }
    }

    /// `mmap64`, the same on 64-bit.
    #[no_mangle]
    pub unsafe extern "C" fn mmap64(
        addr: *mut c_void,
        len: usize,
        prot: i32,
        flags: i32,
        fd: i32,
        off: i64,
    ) -> *mut c_void {
        // SAFETY: the same contract.
        unsafe { mmap(addr, len, prot, flags, fd, off) }
    }

    /// `munmap(2)`.
    #[no_mangle]
    pub unsafe extern "C" fn munmap(addr: *mut c_void, len: usize) -> i32 {
        let a = addr as usize;
        if let Some((base, end, r)) = heap() {
            if a >= base && a < end && !in_mimalloc() {
                if !a.is_multiple_of(PAGE) || len == 0 {
                    set_errno(libc::EINVAL);
                    return -1;
                }
                let hi = a.saturating_add(len).next_multiple_of(PAGE).min(end);
                if served().block_of(a).is_none() {
                    // Heap memory malloc gave: not the program's to unmap.
                    set_errno(libc::EINVAL);
                    return -1;
                }
                unmap_served(r, base, a, hi);
                return 0;
            }
        }
        // SAFETY: the caller's request, to the kernel.
        unsafe { libc::syscall(libc::SYS_munmap, addr, len) as i32 }
    }

    /// `mremap(2)`.  Variadic in C (the new address comes only with
    /// `MREMAP_FIXED`); on x86-64 the fifth argument is in its register
    /// either way, read only when that flag says it was passed.
    ///
    /// On a served block, as the kernel on private anonymous memory:
    /// shrinking unmaps the tail in place; growing moves (`MREMAP_MAYMOVE`)
    /// into a new block, or is refused (`ENOMEM`: the next pages are
    /// taken); `MREMAP_FIXED` moves to the address asked (a served block
    /// or the quarantine's, or outside the heap), `MREMAP_DONTUNMAP`
    /// leaves the old range mapped and empty.  A move copies the bytes
    /// (one served block to another: both are the region's).
    #[no_mangle]
    pub unsafe extern "C" fn mremap(
        old: *mut c_void,
        old_len: usize,
        new_len: usize,
        flags: i32,
        new_addr: *mut c_void,
    ) -> *mut c_void {
        let a = old as usize;
        if let Some((base, end, r)) = heap() {
            if a >= base && a < end && !in_mimalloc() {
                let fail = |e| {
                    set_errno(e);
                    libc::MAP_FAILED
                };
                let known = {
                    let map = served();
                    map.block_of(a).map(|s| {
                        let b = map.get(s).expect("found above");
                        (a + old_len <= s + b.len, b.altered)
                    })
                };
                let (fixed, dontunmap) = (
                    flags & libc::MREMAP_FIXED != 0,
                    flags & libc::MREMAP_DONTUNMAP != 0,
                );
                let may_move = flags & libc::MREMAP_MAYMOVE != 0;
                let known_flags = libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED | libc::MREMAP_DONTUNMAP;
                let Some((true, altered)) = known else {
                    return fail(libc::EINVAL);
                };
                if flags & !known_flags != 0
                    || !a.is_multiple_of(PAGE)
                    || new_len == 0
                    || ((fixed || dontunmap) && !may_move)
                    || (dontunmap && old_len != new_len)
                {
                    return fail(libc::EINVAL);
                }
                let (old_pages, new_pages) = (old_len.next_multiple_of(PAGE), new_len.next_multiple_of(PAGE));
                if !fixed && !dontunmap && new_pages <= old_pages {
                    // Shrink in place: the tail is unmapped.
                    if new_pages < old_pages {
                        unmap_served(r, base, a + new_pages, a + old_pages);
                    }
                    return old;
                }
                // Every other case moves, copying the bytes, which a block
                // with inaccessible parts (a reservation) would not give up.
                if !may_move || altered {
                    return fail(libc::ENOMEM);
                }
                let to = if fixed {
                    let n = new_addr as usize;
                    if !n.is_multiple_of(PAGE) || (n < a + old_pages && a < n + new_pages) {
                        // Unaligned, or overlapping the old range.
                        return fail(libc::EINVAL);
                    }
                    if let Err(e) = fixed_target(n, new_pages) {
                        return fail(e);
                    }
                    n
                } else {
                    match serve(new_pages, libc::PROT_READ | libc::PROT_WRITE) {
                        Some(p) => p as usize,
                        None => return fail(libc::ENOMEM),
                    }
                };
                // SAFETY: the old range, mapped and readable (checked
                // above), and the target made ready for `new_pages`.
                unsafe { std::ptr::copy_nonoverlapping(a as *const u8, to as *mut u8, old_len.min(new_len)) };
                if dontunmap {
                    // The old range stays, empty: its next touch reads zeros.
                    discard(r, base, a, old_pages);
                } else {
                    unmap_served(r, base, a, a + old_pages);
                }
                return to as *mut c_void;
            }
        }
        // SAFETY: the caller's request, to the kernel.
        unsafe { libc::syscall(libc::SYS_mremap, old, old_len, new_len, flags, new_addr) as *mut c_void }
    }

    /// `mprotect(2)`: reaches the kernel; on heap memory, remembered so
    /// that the memory is put back when the program gives it up.
    #[no_mangle]
    pub unsafe extern "C" fn mprotect(addr: *mut c_void, len: usize, prot: i32) -> i32 {
        let a = addr as usize;
        if let Some((base, end, _)) = heap() {
            if a < end
                && a.saturating_add(len) > base
                && !in_mimalloc()
                && prot != libc::PROT_READ | libc::PROT_WRITE
            {
                alter(a.max(base), a.saturating_add(len).min(end) - a.max(base), true);
            }
        }
        // SAFETY: the caller's request, to the kernel.
        unsafe { libc::syscall(libc::SYS_mprotect, addr, len, prot) as i32 }
    }

    /// `mlockall(2)`: everything but uswap's memory.  Locking that would
    /// fault every page of it in and keep it: the heap region (as large
    /// as the budget and the swap together), the metadata tables, a RAM
    /// device, the compressed store.  `MCL_CURRENT` locks each other
    /// mapping, as `mlockall` would; `MCL_FUTURE` is the kernel's, on
    /// fault (`MCL_ONFAULT`), so that what uswap maps later is not filled
    /// at once (the program's own later mappings are locked as they are
    /// touched, not at their `mmap`).
    #[no_mangle]
    pub unsafe extern "C" fn mlockall(flags: i32) -> i32 {
        if heap().is_none() {
            // SAFETY: the caller's request, to the kernel.
            return unsafe { libc::syscall(libc::SYS_mlockall, flags) as i32 };
        }
        let onfault = flags & libc::MCL_ONFAULT;
        let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
            set_errno(libc::ENOMEM);
            return -1;
        };
        let own = uswap::sys::own_memory();
        if flags & libc::MCL_CURRENT != 0 && !may_lock(&maps, &own) {
            // As the kernel answers, before it changes anything: the
            // program's memory is past RLIMIT_MEMLOCK.
            set_errno(libc::ENOMEM);
            return -1;
        }
        if flags & libc::MCL_FUTURE != 0 {
            // SAFETY: as above, for future mappings only.
            if unsafe { libc::syscall(libc::SYS_mlockall, libc::MCL_FUTURE | libc::MCL_ONFAULT) } != 0 {
                return -1;
            }
        }
        if flags & libc::MCL_CURRENT == 0 {
            return 0;
        }
        let lock_flags = if onfault != 0 { libc::MLOCK_ONFAULT } else { 0 };
        let mut rc = 0;
        for (lo, hi, line) in vmas(&maps) {
            // Inaccessible mappings (guards, reservations) hold no pages
            // to lock; the kernel's call lets them be.
            if line
                .split_whitespace()
                .nth(1)
                .is_some_and(|p| p.starts_with("---"))
            {
                continue;
            }
            // This mapping, less uswap's ranges in it.
            let mut at = lo;
            let mut pieces = Vec::new();
            for &(s, l) in own.iter().filter(|&&(s, l)| s < hi && s + l > lo) {
                if s > at {
                    pieces.push((at, s));
                }
                at = at.max(s + l);
            }
            if at < hi {
                pieces.push((at, hi));
            }
            for (a, b) in pieces {
                // SAFETY: locks part of a mapping of this process.
                if unsafe { libc::syscall(libc::SYS_mlock2, a, b - a, lock_flags) } != 0 {
                    let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
                    // The limit (RLIMIT_MEMLOCK: ENOMEM, EAGAIN) and
                    // permission are the caller's to hear of; what cannot
                    // be locked at all (the vsyscall page) is skipped.
                    if !line.ends_with("[vsyscall]") {
                        set_errno(e);
                        rc = -1;
                    }
                }
            }
        }
        rc
    }

    /// `madvise(2)`.  On the heap, advice that changes what the memory
    /// holds is uswap's to carry out, since the kernel's would reach
    /// neither the pages uswap holds out nor its record of those it has
    /// in: `MADV_DONTNEED`, `MADV_DONTNEED_LOCKED` and `MADV_FREE` discard;
    /// `MADV_WIPEONFORK` is remembered and done in a forked child
    /// (`KEEPONFORK` forgets it); `MADV_DONTFORK` and `MADV_DOFORK` are
    /// uswap's already (a child keeps the heap; its copy is not the
    /// program's concern); `MADV_POPULATE_READ` and `_WRITE` succeed as
    /// they are (a fault brings a page in when it is touched; the
    /// kernel's would fail with `EFAULT` on a page that is out).  Advice
    /// about placement and access (`MADV_SEQUENTIAL`, `MADV_HUGEPAGE`,
    /// `MADV_COLD`, `MADV_DONTDUMP`, ...) reaches the kernel.
    #[no_mangle]
    pub unsafe extern "C" fn madvise(addr: *mut c_void, len: usize, advice: i32) -> i32 {
        /// `MADV_DONTNEED_LOCKED` (Linux 5.18), not in every libc crate.
        const DONTNEED_LOCKED: i32 = 24;
        let a = addr as usize;
        if let Some((base, end, r)) = heap() {
            if a >= base && a < end {
                if !a.is_multiple_of(PAGE) {
                    set_errno(libc::EINVAL);
                    return -1;
                }
                let hi = a.saturating_add(len).next_multiple_of(PAGE).min(end);
                match advice {
                    // The program's advice on memory malloc gave it, and
                    // mimalloc's own purge of freed memory (`MADV_DONTNEED`
                    // after `purge_delay`), are discards: the kernel's
                    // call would drop what is resident and leave uswap
                    // counting it, and would miss what is out.
                    libc::MADV_DONTNEED | libc::MADV_FREE | DONTNEED_LOCKED => {
                        discard(r, base, a, hi - a);
                        return 0;
                    }
                    // mimalloc's other advice is for the kernel.
                    _ if in_mimalloc() => {}
                    libc::MADV_DONTFORK
                    | libc::MADV_DOFORK
                    | libc::MADV_POPULATE_READ
                    | libc::MADV_POPULATE_WRITE => return 0,
                    libc::MADV_WIPEONFORK | libc::MADV_KEEPONFORK => {
                        let mut map = served();
                        let starts = map.overlapping(a, hi);
                        if starts.is_empty() {
                            // Memory malloc gave: not a private mapping of
                            // the program's own, as the kernel requires.
                            set_errno(libc::EINVAL);
                            return -1;
                        }
                        for s in starts {
                            let b = map.get_mut(s).expect("listed above");
                            let (lo, e) = (a.max(s), hi.min(s + b.len));
                            if advice == libc::MADV_WIPEONFORK {
                                b.wipe.insert(lo, e);
                            } else {
                                b.wipe.remove(lo, e);
                            }
                        }
                        return 0;
                    }
                    _ => {}
                }
            }
        }
        // SAFETY: the caller's request, to the kernel.
        unsafe { libc::syscall(libc::SYS_madvise, addr, len, advice) as i32 }
    }
}
