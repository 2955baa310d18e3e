//! Pages in and out of regions: the userfaultfd moves (`UFFDIO_MOVE`)
//! and copies (`UFFDIO_COPY`) both the fault and the reclaim paths make,
//! with what they do on a failure, and the test hooks that inject one.

use crate::pager::instance::frames::Mapping;
#[cfg(test)]
use crate::pager::instance::inject::Inject;
use crate::pager::instance::inner::Inner;
use crate::uffd::UffdError;
use crate::PAGE_SIZE;
#[cfg(test)]
use std::sync::atomic::Ordering;

/// Which way `UFFDIO_MOVE` moves a page: out of a region into our staging
/// memory, or back in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dir {
    Out,
    In,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Installed {
    /// All moved.
    Moved,
    /// Some moved and the rest copied.
    Copied,
    /// The destination is no longer mapped.
    Gone,
}

impl Inner {
    /// Move `len` bytes of pages from region memory at `src` into our
    /// staging memory at `dst`: all of them, or `Err((moved, why))` with
    /// the prefix that did move.
    ///
    /// Where a move fails, the pages past what it reports are looked at
    /// (`mincore`, on this error path only): a page gone from its region
    /// whose frame holds a page went out, whatever the count said.  A
    /// free staging frame is empty, and a page the program dropped
    /// leaves its frame empty (`ENOENT`), so nothing else looks so.  Such
    /// a move has not been caught, but taken for one that did nothing it
    /// would cost a run of pages their contents: each resident by its
    /// word and missing from its region reads zeros, and its frame, given
    /// back full, refuses the next page (`EEXIST`), the signature of
    /// docs/RELIABILITY.md's three sightings.  So they count as moved,
    /// the rest is moved on, and the first such move is said.
    pub fn move_out(&self, dst: u64, src: u64, len: u64) -> Result<(), (u64, UffdError)> {
        let mut done = 0;
        loop {
            let Err((moved, err)) = self.move_all(Dir::Out, dst + done, src + done, len - done) else {
                return Ok(());
            };
            done += moved;
            let unreported = self.moved_unreported(dst + done, src + done, len - done);
            if unreported == 0 {
                return Err((done, err));
            }
            crate::pager::instance::report::once(
                &self.reports().unreported_move,
                format_args!(
                    "uswap: UFFDIO_MOVE moved {} page(s) at {:#x} past what it reported ({err}); they are taken as moved. Please report this line (docs/RELIABILITY.md)",
                    unreported / PAGE_SIZE as u64,
                    src + done,
                ),
            );
            done += unreported;
            if done == len {
                return Ok(());
            }
        }
    }

    /// How many bytes of pages at the head of `[src, src + len)` are gone
    /// from the region into their frames at `dst` (see `move_out`).
    fn moved_unreported(&self, dst: u64, src: u64, len: u64) -> u64 {
        let page = PAGE_SIZE as u64;
        let mut n = 0;
        while n < len && !crate::sys::page_mapped(src + n) && crate::sys::page_mapped(dst + n) {
            n += page;
        }
        n
    }

    /// Put `len` bytes of pages from our memory at `src` back into a region
    /// at `dst` (missing there): moved, and what will not move copied.
    /// `Ok(true)` when some were copied (their source still holds them and
    /// must be discarded before it is reused); `Err((done, why))` when
    /// neither worked past `done` bytes.
    pub fn move_in(&self, dst: u64, src: u64, len: u64) -> Result<bool, (u64, UffdError)> {
        let Err((moved, _)) = self.move_all(Dir::In, dst, src, len) else {
            return Ok(false);
        };
        let mut at = moved;
        #[cfg(test)]
        if self
            .inject()
            .copy_in
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
        {
            let errno = self.inject().copy_in.1.load(Ordering::Relaxed);
            return Err((
                at,
                UffdError::Ioctl {
                    op: "UFFDIO_COPY",
                    errno,
                },
            ));
        }
        while at < len {
            match self.copy(dst + at, (src + at) as *const u8, len - at, false) {
                Ok(()) => break,
                // A page is there already: it cannot be, under the claim,
                // but if it were, what is there stays.
                Err((n, e)) if e.errno() == Some(libc::EEXIST) => at += n + PAGE_SIZE as u64,
                Err((n, e)) => return Err((at + n, e)),
            }
        }
        Ok(true)
    }

    /// `UFFDIO_MOVE` of `len` bytes, to the end: a partial move (the
    /// kernel's `EAGAIN` with a count) is continued, and the error of the
    /// page that stopped it comes back with how far it got.
    // `dir` picks the injected failure, in tests only.
    #[cfg_attr(not(test), allow(unused_variables))]
    fn move_all(&self, dir: Dir, dst: u64, src: u64, len: u64) -> Result<(), (u64, UffdError)> {
        #[cfg(test)]
        {
            let f = match dir {
                Dir::Out => &self.inject().move_out,
                Dir::In => &self.inject().move_in,
            };
            if let Some((partial, errno)) = Inject::take_move(f) {
                // A failed move stops short of its end, as the kernel's
                // does (a whole move is a success): the soak found a hook
                // that "failed" after moving everything.
                let partial = partial.min(len.saturating_sub(PAGE_SIZE as u64));
                // Moved, and not said (out only).
                let unreported = match dir {
                    Dir::Out => {
                        self.inject().move_out_unreported.load(Ordering::Relaxed) as u64 * PAGE_SIZE as u64
                    }
                    Dir::In => 0,
                };
                let moving = (partial + unreported).min(len);
                if moving > 0 {
                    self.move_run(dst, src, moving)?;
                }
                return Err((
                    partial,
                    UffdError::Ioctl {
                        op: "UFFDIO_MOVE",
                        errno,
                    },
                ));
            }
        }
        self.move_run(dst, src, len)
    }

    /// `UFFDIO_MOVE` of `len` bytes, continued past partial moves.
    fn move_run(&self, dst: u64, src: u64, len: u64) -> Result<(), (u64, UffdError)> {
        let mut done = 0;
        while done < len {
            // SAFETY: the pager moves only pages it holds the claim of
            // (region pages, whose contents are the pager's to move while
            // claimed) to or from its own staging memory, which no one
            // else refers to.
            let moved = unsafe {
                self.uffd()
                    .move_pages(dst + done, src + done, len - done, true, false)
            };
            match moved {
                Ok(n) if n > 0 => done += n,
                Ok(_) => {
                    return Err((
                        done,
                        UffdError::Ioctl {
                            op: "UFFDIO_MOVE",
                            errno: libc::EAGAIN,
                        },
                    ))
                }
                Err(e) => return Err((done, e)),
            }
        }
        Ok(())
    }

    /// `UFFDIO_COPY` of `len` bytes into a region (missing there), to the
    /// end, write-protected when `wp`; wakes the threads waiting there.
    /// On failure, how far it got and why.
    pub fn copy(&self, dst: u64, src: *const u8, len: u64, wp: bool) -> Result<(), (u64, UffdError)> {
        let whole = len;
        let len = self.present_prefix(src as u64, len);
        let mut done = 0;
        while done < len {
            // SAFETY: the pager copies only into missing pages it holds
            // the claim of, from its own frames (readable for `len`).
            let copied = unsafe {
                self.uffd()
                    .copy(dst + done, src.wrapping_add(done as usize), len - done, wp, true)
            };
            match copied {
                Ok(n) if n > 0 => done += n,
                Ok(_) => {
                    let e = UffdError::Ioctl {
                        op: "UFFDIO_COPY",
                        errno: libc::EAGAIN,
                    };
                    return Err((done, e));
                }
                Err(e) => return Err((done, e)),
            }
        }
        if len < whole {
            // As the kernel refuses it where faults are not waited for.
            return Err((
                len,
                UffdError::Ioctl {
                    op: "UFFDIO_COPY",
                    errno: libc::EFAULT,
                },
            ));
        }
        Ok(())
    }

    /// How much of the copy source `[src, src + len)` is there to be read
    /// without a fault on the userfaultfd.
    ///
    /// In handler-thread mode the kernel's read of a source page that is
    /// not there (a sealed region page being staged, or a staging frame
    /// moved back, that is gone) is a userfault, which waits for a handler
    /// thread to serve it: a handler thread making the copy itself (a
    /// fault's direct reclaim) waits for ever, and any other copier waits
    /// on the claim it holds (a Redis server in handler mode hung so, its
    /// only handler thread in `UFFDIO_COPY`).  In SIGBUS mode the same read
    /// fails the copy with `EFAULT`, which every caller takes for a page
    /// the program dropped.  So in handler-thread mode the pages are looked
    /// at first (`mincore`, no fault), and the copy stops at the first one
    /// that is not there; a page the kernel's own swap holds is there (the
    /// read brings it in without a userfault), told apart by
    /// `/proc/self/pagemap`.  uswap's bounce frames and page of zeros are
    /// always there and are not looked at.
    fn present_prefix(&self, src: u64, len: u64) -> u64 {
        if self.uffd().user_mode_only() || self.own_populated(src, len) {
            return len;
        }
        let mut prefix = None;
        self.walk_presence(src, len, |addr, there| {
            if !there && prefix.is_none() {
                prefix = Some(addr.saturating_sub(src).min(len));
            }
            prefix.is_none()
        });
        prefix.unwrap_or(len)
    }

    /// Call `f(start, len)` for each run of pages of `[addr, addr + len)`
    /// (page aligned) that is there; in SIGBUS mode, once for all of it
    /// (a page that is not fails there with `EFAULT`, no userfault).  See
    /// `present_prefix` for why handler-thread mode looks first.
    pub fn for_present_runs(&self, addr: u64, len: u64, mut f: impl FnMut(u64, u64)) {
        if self.uffd().user_mode_only() {
            f(addr, len);
            return;
        }
        let page = PAGE_SIZE as u64;
        let mut run: Option<u64> = None;
        self.walk_presence(addr, len, |at, there| {
            match (run, there) {
                (None, true) => run = Some(at),
                (Some(start), false) => {
                    f(start, at - start);
                    run = None;
                }
                _ => {}
            }
            true
        });
        if let Some(start) = run {
            f(start, (addr + len).next_multiple_of(page) - start);
        }
    }

    /// `see(page address, whether it is there)` for each page of `[addr,
    /// addr + len)` while it returns true: `mincore` (no fault), and for a
    /// page it says is out, `/proc/self/pagemap` (in the kernel's own swap
    /// counts as there: reading it is no userfault).  Nothing allocated.
    fn walk_presence(&self, addr: u64, len: u64, mut see: impl FnMut(u64, bool) -> bool) {
        const MOST: usize = 512;
        let page = PAGE_SIZE as u64;
        let first = addr & !(page - 1);
        let end = (addr + len).next_multiple_of(page);
        let mut at = first;
        while at < end {
            let pages = (((end - at) / page) as usize).min(MOST);
            let mut vec = [0u8; MOST];
            // SAFETY: mincore reads the page tables of a range of ours
            // into a buffer of `pages` bytes; it touches no page.
            let rc = unsafe { libc::mincore(at as *mut libc::c_void, pages * PAGE_SIZE, vec.as_mut_ptr()) };
            for (i, &v) in vec[..pages].iter().enumerate() {
                let p = at + i as u64 * page;
                let there = rc != 0 || v & 1 != 0 || crate::sys::in_kernel_swap(p);
                if !see(p, there) {
                    return;
                }
            }
            at += pages as u64 * page;
        }
    }

    /// Whether `[src, src + len)` lies in uswap's bounce frames or its
    /// page of zeros, populated at build and never dropped.
    fn own_populated(&self, src: u64, len: u64) -> bool {
        let inside = |m: &Mapping| src >= m.addr() && src + len <= m.addr() + m.len() as u64;
        inside(self.frames().bounce.mapping()) || inside(&self.frames().zero)
    }

    /// Install a page of zeros at `page` (missing there).
    pub fn copy_zero(&self, page: u64, wp: bool) -> Result<(), UffdError> {
        self.copy(page, self.frames().zero.addr() as *const u8, PAGE_SIZE as u64, wp)
            .map_err(|(_, e)| e)
    }

    /// Whether an install into a region failed because the program
    /// unmapped the destination (`ENOENT` from a copy: no registered
    /// mapping there any more).
    pub fn region_gone(e: &UffdError) -> bool {
        e.errno() == Some(libc::ENOENT)
    }

    /// Put `len` bytes of pages from `src` (ours) into the region at `dst`
    /// (missing there), all of them: a move, finished by copying what does
    /// not move, and retried while the kernel refuses for now (ENOMEM).  Half
    /// a unit in place is no state to leave: the faulting thread waits for
    /// memory, as a faulting thread in the kernel would.
    pub fn put_in(&self, dst: u64, src: u64, len: u64) -> Installed {
        let mut done = 0;
        let mut copied = false;
        loop {
            match self.move_in(dst + done, src + done, len - done) {
                Ok(c) => {
                    return if copied || c {
                        Installed::Copied
                    } else {
                        Installed::Moved
                    }
                }
                Err((n, err)) => {
                    copied = true;
                    if Self::region_gone(&err) {
                        return Installed::Gone;
                    }
                    done += n;
                    self.retry_pause(err.errno());
                }
            }
        }
    }
}
