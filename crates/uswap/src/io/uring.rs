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

/// A ring of `entries`, or why none can be had (`ENOSYS`: a kernel
/// without io_uring, or a seccomp profile refusing it; `EPERM`:
/// `kernel.io_uring_disabled`).
fn new_ring(entries: u32) -> io::Result<IoUring> {
    let ring = IoUring::new(entries)?;
    // Out of the program's way (`descriptors`): the same ring under a
    // placed duplicate of its descriptor, mapped again through it; the
    // first value's mappings and descriptor go as it drops.
    Ok(match crate::descriptors::floor() {
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
    })
}

/// A ring that does no IO and only holds files (registered), for a
/// process whose swap has no write ring of its own (a tier, whose store
/// writes its file itself): its unnamed files' last close is then the
/// ring's, after the exit (see [`WriteRing::hold_files`]).
pub struct FileHold {
    _ring: IoUring,
}

impl FileHold {
    /// A hold on `fds`' files, or why none can be had (as
    /// [`WriteRing::new`], or the registration's error).
    pub fn new(fds: &[std::os::fd::RawFd]) -> io::Result<FileHold> {
        let ring = new_ring(1)?;
        ring.submitter().register_files(fds)?;
        Ok(FileHold { _ring: ring })
    }

    /// The ring's descriptor, for a test to read its `fdinfo`.
    #[cfg(test)]
    pub(crate) fn raw_fd(&self) -> std::os::fd::RawFd {
        self._ring.as_raw_fd()
    }
}

/// The pieces one call has queued on a ring: each one's job, and the
/// bytes it must move.  What a write batch and a read batch share.
struct Batch {
    job_of: [u8; ENTRIES as usize],
    len_of: [u32; ENTRIES as usize],
    queued: usize,
}

impl Batch {
    fn new() -> Batch {
        Batch {
            job_of: [0; ENTRIES as usize],
            len_of: [0; ENTRIES as usize],
            queued: 0,
        }
    }

    /// Queue `sqe`, a piece of job `job` moving `len` bytes: false where
    /// the batch or the ring is full (the piece is not queued).
    ///
    /// # Safety
    /// The buffer `sqe` names must live, and be touched by nothing else,
    /// until [`Batch::reap`] returns.
    unsafe fn push(&mut self, ring: &mut IoUring, sqe: io_uring::squeue::Entry, job: usize, len: u32) -> bool {
        if self.queued == ENTRIES as usize {
            return false;
        }
        let sqe = sqe.user_data(self.queued as u64);
        // SAFETY: the caller's contract.
        if unsafe { ring.submission().push(&sqe) }.is_err() {
            return false;
        }
        self.job_of[self.queued] = job as u8;
        self.len_of[self.queued] = len;
        self.queued += 1;
        true
    }

    /// Submit what is queued and reap every completion, clearing `ok` of
    /// each job a piece of which moved other than its bytes; waits on
    /// through interruptions (the kernel may still be using the buffers:
    /// they must not be handed back before every completion is in).
    fn reap(&self, ring: &mut IoUring, ok: &mut [bool]) {
        let mut done = 0;
        while done < self.queued {
            match ring.submit_and_wait(self.queued - done) {
                Ok(_) => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)) => {}
                Err(_) => {
                    // Not an error this use of the ring can meet.  Said with
                    // one write(2) of a fixed line: a fault's reads wait here
                    // inside the SIGBUS handler, where formatting may not run.
                    const LINE: &[u8] = b"uswap: waiting for swap IO failed; trying again\n";
                    // SAFETY: writes a static buffer of its own length to fd 2.
                    unsafe { libc::write(2, LINE.as_ptr().cast(), LINE.len()) };
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            }
            for cqe in ring.completion() {
                let q = cqe.user_data() as usize;
                if q >= self.queued {
                    continue;
                }
                done += 1;
                if cqe.result() != self.len_of[q] as i32 {
                    ok[self.job_of[q] as usize] = false;
                }
            }
        }
    }
}

impl WriteRing {
    /// A ring, or why none can be had (`ENOSYS`: a kernel without
    /// io_uring; `EPERM`: `kernel.io_uring_disabled`).
    pub fn new() -> io::Result<WriteRing> {
        Ok(WriteRing {
            ring: new_ring(ENTRIES)?,
            bounce: Mapping::new(BOUNCE_PAGES * PAGE_SIZE, PAGE_SIZE)?,
        })
    }

    /// Hold a reference to each of `fds`' files (registered with the
    /// ring), so that the last one is the ring's, dropped by the kernel's
    /// io_uring teardown after the process has gone, off its exit path.
    /// For the swap files uswap made unnamed: a file with no name is
    /// freed at its last close, and freeing its blocks on a filesystem
    /// mounted with `discard` is a discard per extent, which the closing
    /// thread waits out (1.7-2.6 s for a 4 GiB file half written, on this
    /// project's machine kind, held between the program's last instruction
    /// and its exit status).  A named file is not held: its close frees
    /// nothing, and a later `uswap run` may want its lock at once.
    pub fn hold_files(&mut self, fds: &[std::os::fd::RawFd]) -> io::Result<()> {
        if fds.is_empty() {
            return Ok(());
        }
        self.ring.submitter().register_files(fds)
    }

    /// The ring's descriptor, for a test to read its `fdinfo`.
    #[cfg(test)]
    pub(crate) fn raw_fd(&self) -> std::os::fd::RawFd {
        self.ring.as_raw_fd()
    }

    /// Write every job (None: nothing), those to files in flight together;
    /// `ok[i]` says whether job `i` was written whole.  Jobs that were not are the
    /// caller's to write again (see the module documentation).
    pub fn write_batch(&mut self, jobs: &[Option<WriteJob<'_>>], ok: &mut [bool]) {
        let mut batch = Batch::new();
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
            let first = batch.queued;
            let mut fits = true;
            job.device
                .store
                .file_pieces(job.offset, pages, &mut |fd, pos, range| {
                    if !fits {
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
                        .build();
                    // SAFETY: the buffer lives (the caller holds the pages'
                    // claims) until this call has reaped every completion.
                    fits = unsafe { batch.push(&mut self.ring, sqe, i, piece.len() as u32) };
                });
            // A job that did not fit whole is not written here; its queued
            // pieces still complete (harmlessly: the caller writes the
            // same bytes to the same place again).
            ok[i] = fits && batch.queued > first;
        }
        if batch.queued == 0 {
            return;
        }
        batch.reap(&mut self.ring, ok);
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

/// One read: the slots of `device` from `offset` into `buf`.
pub struct ReadJob<'a> {
    pub device: &'a IoDevice,
    pub offset: u64,
    pub buf: &'a mut [u8],
}

/// An io_uring instance for reads: a fault's readahead window, whose runs
/// of slots a swap file holds apart (each a read of its own), read
/// together.  Read one after the other, a window of 32 pages in runs of
/// 6 was four disk round trips; in flight together it is about one, and
/// one kick of the disk's queue where a VM pays each.  Owned by one
/// thread at a time (the pager's `ReadRings` lends it).
pub struct ReadRing {
    ring: IoUring,
}

impl ReadRing {
    /// A ring, or why none can be had (as [`WriteRing::new`]).
    pub fn new() -> io::Result<ReadRing> {
        Ok(ReadRing { ring: new_ring(ENTRIES)? })
    }

    /// Read every job, those from files in flight together; `ok[i]` says
    /// whether job `i` was read whole (and opened, where its device
    /// encrypts).  A job that was not is the caller's to read again with
    /// [`IoDevice::read`], where it meets its own error: one path for
    /// errors, as for writes.  Jobs on devices in memory are read in the
    /// call.  Never allocates.
    pub fn read_batch(&mut self, jobs: &mut [Option<ReadJob<'_>>], ok: &mut [bool]) {
        let mut batch = Batch::new();
        debug_assert!(ok.len() >= jobs.len() && jobs.len() <= u8::MAX as usize);
        for (i, job) in jobs.iter_mut().enumerate() {
            ok[i] = false;
            let Some(job) = job else {
                continue;
            };
            if job.device.kind() != BackendKind::File {
                ok[i] = job.device.read(job.offset, job.buf).is_ok();
                continue;
            }
            let Some(pages) = job.device.begin_read(job.offset, job.buf) else {
                continue;
            };
            let first = batch.queued;
            let mut fits = true;
            let buf: *mut u8 = job.buf.as_mut_ptr();
            job.device.store.read_pieces(job.offset, pages, &mut |fd, pos, range| {
                if !fits {
                    return;
                }
                // SAFETY: `range` lies within the job's buffer
                // (`read_pieces` cuts the job's pages).
                let at = unsafe { buf.add(range.start) };
                let sqe = opcode::Read::new(types::Fd(fd), at, range.len() as u32)
                    .offset(pos)
                    .build();
                // SAFETY: the buffer lives (the caller holds it and the
                // pages' claims) until this call has reaped every
                // completion.
                fits = unsafe { batch.push(&mut self.ring, sqe, i, range.len() as u32) };
            });
            // A job that did not fit whole is read again by the caller;
            // its queued pieces still complete into its buffer first.
            ok[i] = fits && batch.queued > first;
        }
        if batch.queued > 0 {
            batch.reap(&mut self.ring, ok);
        }
        for (i, job) in jobs.iter_mut().enumerate() {
            let Some(job) = job else {
                continue;
            };
            if ok[i] && job.device.kind() == BackendKind::File {
                ok[i] = job.device.store.open_read(job.offset, job.buf).is_ok();
                if ok[i] {
                    job.device.read_done((job.buf.len() / PAGE_SIZE) as u64);
                }
            }
        }
    }
}

/// A [`ReadRing`] lent to one thread at a time, in the process that made
/// it alone.  A fault takes it if it is free and reads its window the
/// slow way if not: a ring each thread would be a descriptor and two
/// mappings in every thread of the program, and on this machine kind two
/// CPUs rarely both wait on a window.  A forked child inherits the ring's
/// descriptor and its mappings, which are shared with the parent's: the
/// child's submissions would land in the parent's queue, so the ring
/// refuses every process but its maker's.
pub struct LentRing {
    busy: std::sync::atomic::AtomicBool,
    pid: i32,
    ring: std::cell::UnsafeCell<ReadRing>,
}

// SAFETY: the ring inside is reached only through a `Borrowed`, which
// `busy` makes one at a time.
unsafe impl Sync for LentRing {}
// SAFETY: as above; the ring itself is a descriptor and mappings.
unsafe impl Send for LentRing {}

impl LentRing {
    pub fn new(ring: ReadRing) -> LentRing {
        LentRing {
            busy: std::sync::atomic::AtomicBool::new(false),
            pid: rustix::process::getpid().as_raw_nonzero().get(),
            ring: std::cell::UnsafeCell::new(ring),
        }
    }

    /// The ring, if no other thread has it and this is its maker's
    /// process.
    pub fn borrow(&self) -> Option<Borrowed<'_>> {
        use std::sync::atomic::Ordering;
        if rustix::process::getpid().as_raw_nonzero().get() != self.pid
            || self.busy.swap(true, Ordering::Acquire)
        {
            return None;
        }
        Some(Borrowed { lent: self })
    }
}

/// The ring of a [`LentRing`], given back as it drops.
pub struct Borrowed<'a> {
    lent: &'a LentRing,
}

impl std::ops::Deref for Borrowed<'_> {
    type Target = ReadRing;
    fn deref(&self) -> &ReadRing {
        // SAFETY: `busy` was set for this guard alone.
        unsafe { &*self.lent.ring.get() }
    }
}

impl std::ops::DerefMut for Borrowed<'_> {
    fn deref_mut(&mut self) -> &mut ReadRing {
        // SAFETY: as in `deref`, and `&mut self` makes this the only
        // reference.
        unsafe { &mut *self.lent.ring.get() }
    }
}

impl Drop for Borrowed<'_> {
    fn drop(&mut self) {
        self.lent.busy.store(false, std::sync::atomic::Ordering::Release);
    }
}
