//! Writes in flight together, through io_uring: the background reclaimer's
//! writeback of swap files.
//!
//! A synchronous `pwrite` makes the reclaimer wait out each write's whole
//! latency before it starts the next; with several in flight the disk sees
//! them together (the kernel's swap writes are asynchronous too, and the
//! block layer merges them).  [`WriteRing::write_batch`] queues one write
//! per piece of each job (a run of slots contiguous in one file), submits
//! them with one system call and waits for all: the reclaimer holds the
//! claims of the pages being written until then, so a touch of one waits,
//! as a touch of a page under writeback waits on its folio lock in the
//! kernel.
//!
//! Only the success of a whole job is handled here.  A job that fails in
//! any way (an error, a short write, a full submission queue) is reported
//! as not written and left to the caller, who writes its pages one by one
//! with `pwrite`, where each meets its own error and gets the treatment
//! the pager gives it (retire the slot, back off, retry): one path for
//! errors, whatever wrote first.  RAM devices are written at once, in the
//! call.
//!
//! A job for an encrypted device is sealed first, into the ring's own
//! bounce buffer ([`BOUNCE_PAGES`]; a job that does not fit in what is
//! left of it is not queued, and goes the synchronous way).
//!
//! Registered (fixed) buffers are not used: the pages written are the
//! pager's staging frames, which receive pages by `UFFDIO_MOVE`, and that
//! needs them empty; a registered buffer pins its pages for good.

use std::io;
use std::os::fd::AsRawFd;

use io_uring::{opcode, types, IoUring};

use super::device::{BackendKind, IoDevice};
use crate::sys::Mapping;
use crate::PAGE_SIZE;

/// Pages of sealed (encrypted) data one batch can queue: the pager's
/// queued writeback takes at most 256 pages a round.
pub const BOUNCE_PAGES: usize = 256;

/// Queue entries: writes in flight at most.
const ENTRIES: u32 = 64;

/// One write: `buf` to the slots of `device` from `offset`.
pub struct WriteJob<'a> {
    pub device: &'a IoDevice,
    pub offset: u64,
    pub buf: &'a [u8],
}

/// An io_uring instance for writes.  Owned by one thread.
pub struct WriteRing {
    ring: IoUring,
    /// Where jobs for encrypted devices are sealed; committed when first
    /// used.
    bounce: Mapping,
}

impl WriteRing {
    /// A ring, or why none can be had (`ENOSYS`: a kernel without
    /// io_uring; `EPERM`: `kernel.io_uring_disabled`).
    pub fn new() -> io::Result<WriteRing> {
        let ring = IoUring::new(ENTRIES)?;
        // Out of the program's way (`descriptors`): the same ring under a
        // placed duplicate of its descriptor, mapped again through it; the
        // first value's mappings and descriptor go as it drops.
        let ring = match crate::descriptors::floor() {
            0 => ring,
            _ => {
                // SAFETY: duplicates the ring's descriptor, ours to own.
                let dup = unsafe { libc::fcntl(ring.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
                if dup < 0 {
                    return Err(io::Error::last_os_error());
                }
                let fd = crate::descriptors::place_raw(dup);
                // SAFETY: `fd` names the ring whose parameters these are,
                // and is owned by the new value.
                unsafe { IoUring::from_fd(fd, ring.params().clone()) }?
            }
        };
        Ok(WriteRing {
            ring,
            bounce: Mapping::new(BOUNCE_PAGES * PAGE_SIZE, PAGE_SIZE)?,
        })
    }

    /// Write every job (None: nothing), those to files in flight together;
    /// `ok[i]` says whether job `i` was written whole.  Jobs that were not are the
    /// caller's to write again (see the module documentation).
    pub fn write_batch(&mut self, jobs: &[Option<WriteJob<'_>>], ok: &mut [bool]) {
        const MAX: usize = ENTRIES as usize;
        // Per queued piece: its job and the bytes it must write.
        let mut job_of = [0u8; MAX];
        let mut len_of = [0u32; MAX];
        let mut queued = 0usize;
        // SAFETY: the ring's own bounce buffer; the kernel reads it only
        // between the pushes below and the reaping of their completions,
        // all inside this call, which holds `&mut self`.
        let bounce = unsafe { std::slice::from_raw_parts_mut(self.bounce.as_ptr(), self.bounce.len()) };
        let mut sealed = 0usize;
        for (i, job) in jobs.iter().enumerate() {
            ok[i] = false;
            let Some(job) = job else {
                continue;
            };
            if job.device.kind() != BackendKind::File {
                // Not in files: written now.
                ok[i] = job.device.write(job.offset, job.buf).is_ok();
                continue;
            }
            let Ok(pages) = job.device.begin_write(job.offset, job.buf) else {
                continue;
            };
            let data: &[u8] = match job.device.store.sealer() {
                None => job.buf,
                Some(sealer) => {
                    let len = job.buf.len();
                    if sealed + len > bounce.len() {
                        continue;
                    }
                    let dst = &mut bounce[sealed..sealed + len];
                    if sealer.seal(job.offset, job.buf, dst).is_err() {
                        continue;
                    }
                    sealed += len;
                    dst
                }
            };
            let first = queued;
            let mut fits = true;
            job.device
                .store
                .file_pieces(job.offset, pages, &mut |fd, pos, range| {
                    if queued == MAX || !fits {
                        fits = false;
                        return;
                    }
                    let piece = &data[range];
                    #[allow(unused_mut)]
                    let mut len = piece.len() as u32;
                    #[cfg(test)]
                    if job.device.take_short_write() {
                        len = (len / 2).max(PAGE_SIZE as u32 / 2) & !(PAGE_SIZE as u32 - 1);
                    }
                    let sqe = opcode::Write::new(types::Fd(fd), piece.as_ptr(), len)
                        .offset(pos)
                        .build()
                        .user_data(queued as u64);
                    // SAFETY: the buffer lives (the caller holds the pages'
                    // claims) until this call has reaped every completion.
                    if unsafe { self.ring.submission().push(&sqe) }.is_err() {
                        fits = false;
                        return;
                    }
                    job_of[queued] = i as u8;
                    len_of[queued] = piece.len() as u32;
                    queued += 1;
                });
            // A job that did not fit whole is not written here; its queued
            // pieces still complete (harmlessly: the caller writes the
            // same bytes to the same place again).
            ok[i] = fits && queued > first;
        }
        if queued == 0 {
            return;
        }
        let mut reaped = 0;
        while reaped < queued {
            match self.ring.submit_and_wait(queued - reaped) {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)) => {}
                Err(e) => {
                    // Not an error this use of the ring can meet.  The
                    // kernel may still be writing from the buffers, so
                    // they must not be handed back: wait on.
                    eprintln!(
                        "uswap: waiting for swap writes failed (errno {}); trying again",
                        e.raw_os_error().unwrap_or(0)
                    );
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            }
            for cqe in self.ring.completion() {
                let q = cqe.user_data() as usize;
                if q >= queued {
                    continue;
                }
                reaped += 1;
                if cqe.result() != len_of[q] as i32 {
                    ok[job_of[q] as usize] = false;
                }
            }
        }
        for (i, job) in jobs.iter().enumerate() {
            let Some(job) = job else {
                continue;
            };
            if ok[i] && job.device.kind() == BackendKind::File {
                job.device.wrote((job.buf.len() / PAGE_SIZE) as u64);
            }
        }
    }
}
