//! Pages in and out of regions: the userfaultfd moves (`UFFDIO_MOVE`)
//! and copies (`UFFDIO_COPY`) both the fault and the reclaim paths make,
//! with what they do on a failure, and the test hooks that inject one.

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
    pub fn move_out(&self, dst: u64, src: u64, len: u64) -> Result<(), (u64, UffdError)> {
        self.move_all(Dir::Out, dst, src, len)
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
                if partial > 0 {
                    self.move_run(dst, src, partial)?;
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
        Ok(())
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
