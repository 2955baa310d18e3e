//! The device: one swap device's page store ([`PageStore`]) behind the
//! checks, counters and test hooks every store shares ([`IoDevice`]).
//! Each store builds its device in its own file (`IoDevice::ram` in
//! `ram.rs`, `IoDevice::file` in `file.rs`, `IoDevice::compressed` in
//! `compressed/`): this file knows no store.

#[cfg(test)]
use std::io;
#[cfg(test)]
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[cfg(test)]
use crate::sys::monotonic_ns;

use super::crypt;
use super::error::IoError;
use crate::extent::ExtentMap;
use crate::stats::{Counter, CounterId, Registry};
use crate::PAGE_SIZE;

/// For [`IoDevice::inject_error`]: the next IO, whatever slot it is for.
#[cfg(test)]
pub const ANY_SLOT: u64 = u64::MAX - 1;
/// Test hook: marks an armed slot that fails every call covering it until
/// a call of that page alone (see `take_injected`).  No slot has this bit.
#[cfg(test)]
const STICKY: u64 = 1 << 62;
/// No injected error armed.
#[cfg(test)]
const DISARMED: u64 = u64::MAX;

/// Where a device's pages live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// An anonymous memory mapping ([`IoDevice::ram`]).
    Ram,
    /// A file or block device ([`IoDevice::file`]).
    File,
    /// Compressed in memory, maybe with a file behind
    /// ([`IoDevice::compressed`]).
    Compressed,
    /// On another machine: an NBD export ([`IoDevice::nbd`]).
    Remote,
}

/// Which direction of IO an injected error hits (the test hooks).
#[cfg(test)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoOp {
    /// Reads (swap-in).
    Read,
    /// Writes (swap-out).
    Write,
}

/// A store of page-sized slots: what a swap device's pages live on.  RAM
/// and files are the two here; the compressed, tiered and encrypted
/// devices to come are more.  An [`IoDevice`] holds one and gives every
/// store the same checks, counters and test hooks: a store's `write` and
/// `read` get whole pages at slots `offset..` within its size (and
/// 4096-byte aligned buffers where `needs_alignment`), never allocate,
/// and may be called from any thread at once, for different slots.
pub trait PageStore: Send + Sync {
    /// Where the pages live.
    fn kind(&self) -> BackendKind;
    /// Write `buf` (whole pages) at slot `offset`.
    fn write(&self, offset: u64, buf: &[u8]) -> Result<(), IoError>;
    /// Read slots from `offset` into `buf` (whole pages).
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), IoError>;
    /// Whether buffers must be 4096-byte aligned (`O_DIRECT`).
    fn needs_alignment(&self) -> bool {
        false
    }
    /// Pages of memory that hold the pages of a RAM device (each slot
    /// ever written: the mapping keeps them), which saves no memory; 0
    /// for any other store.
    fn ram_pages(&self) -> u64 {
        0
    }
    /// Pages of memory a compressed store holds (its blocks in use), which
    /// `uswap run --store-outside-budget` leaves out of the budget as a
    /// memory cgroup leaves kernel zram's; 0 for any other store.
    fn store_pages(&self) -> u64 {
        0
    }
    /// The map from slot to backing, for a store that has one.
    /// Whether a backing of the store grows as it is written
    /// (`growth.rs`): the swap space then takes freed clusters first.
    fn grows(&self) -> bool {
        false
    }

    /// Bytes its growing backings have allocated so far.
    fn grown(&self) -> u64 {
        0
    }

    /// Whether a growing backing found no room at its last try: the
    /// slots past what it holds cannot be written now.
    fn cannot_grow(&self) -> bool {
        false
    }

    fn extent_map(&self) -> Option<&ExtentMap> {
        None
    }
    /// For a store in files: call `piece(fd, byte position, buffer byte
    /// range)` for each piece of slots `offset..offset + pages` that is
    /// contiguous in one file, in order, and return true; a store with
    /// nothing to queue (RAM) returns false.
    fn file_pieces(
        &self,
        _offset: u64,
        _pages: u64,
        _piece: &mut dyn FnMut(i32, u64, std::ops::Range<usize>),
    ) -> bool {
        false
    }
    /// For a store in files: call `piece(fd, byte position, buffer byte
    /// range)` for each piece of slots `offset..offset + pages` to read,
    /// contiguous in one file (each from the place its slot was written
    /// to), in order, and return true; [`PageStore::open_read`] then
    /// makes what the pieces read the pages.  A store with nothing to
    /// queue (RAM, compressed) returns false.
    fn read_pieces(
        &self,
        _offset: u64,
        _pages: u64,
        _piece: &mut dyn FnMut(i32, u64, std::ops::Range<usize>),
    ) -> bool {
        false
    }
    /// After every piece of [`PageStore::read_pieces`] was read into
    /// `buf`: open the pages an encrypting store sealed, as its `read`
    /// does.
    fn open_read(&self, _offset: u64, _buf: &mut [u8]) -> Result<(), IoError> {
        Ok(())
    }
    /// Whether a page read back from slot `offset` should leave the
    /// device (its slot freed, the page dirty): a store whose copies cost
    /// memory.  The pager asks before freeing.
    fn frees_on_swapin(&self, _offset: u64) -> bool {
        false
    }
    /// The key and seals of a store that encrypts (`crypt.rs`): a writer
    /// that queues the store's file pieces itself (`uring.rs`) seals
    /// the pages first.
    fn sealer(&self) -> Option<&crypt::Sealer> {
        None
    }
    /// The descriptors of the store's files that have no name (made
    /// unnamed, or unlinked since), each given to `f`: their blocks are
    /// freed at their last close (`WriteRing::hold_files`).
    fn unlinked_files(&self, _f: &mut dyn FnMut(std::os::fd::RawFd)) {}
    /// The owner freed slots `offset..offset + pages`: a store that keeps
    /// memory per slot lets it go (zram's `swap_slot_free_notify`), an
    /// encrypted one forgets their seals.
    fn slot_freed(&self, _offset: u64, _pages: u64) {}
    /// Whether [`PageStore::slot_freed`] does anything: the pager looks up
    /// a slot's use count before it tells, work spared where there is
    /// nothing to let go (RAM, a plaintext file).
    fn wants_slot_freed(&self) -> bool {
        false
    }
    /// Whether some of the pages may be in a file (a file device, or a
    /// compressed device with a file behind): a forked child shares that
    /// file with its parent.
    fn has_file(&self) -> bool {
        self.kind() == BackendKind::File
    }
    /// Compact a packed store; the blocks freed (0 for other stores).
    fn compact(&self) -> usize {
        0
    }
    /// Whether slot `slot` is this process's to free: in a forked child,
    /// one allocated to it (`file.rs`, "A forked child's files of its
    /// own").  A store with no file is private memory, each side's own.
    fn owns(&self, _slot: u64) -> bool {
        true
    }
    /// In a forked child, at its adoption: whether the store can give it
    /// files of its own (`open_layer`).  A compressed store with a file
    /// behind cannot yet.
    fn forked(&self) -> bool {
        !self.has_file()
    }
    /// Slots `offset..offset + pages` were allocated to this process.
    fn allocated(&self, _offset: u64, _pages: u64) {}
    /// Make the forked child's files of its own.
    fn open_layer(&self, _slots: u64) -> Result<(), IoError> {
        Ok(())
    }
    /// Check the store's own bookkeeping.
    fn check(&self) -> Result<(), String> {
        Ok(())
    }
    /// Test hook: a compressed slot's entry word.
    #[cfg(test)]
    fn entry_of(&self, _slot: u64) -> u64 {
        0
    }
    /// Test hook: the file behind a compressed store.
    #[cfg(test)]
    fn file_behind(&self) -> Option<&IoDevice> {
        None
    }
    /// Fields for `IoDevice`'s `Debug`.
    fn describe(&self, _d: &mut std::fmt::DebugStruct<'_, '_>) {}
}

/// The page store of one swap device.  See the module documentation.
pub struct IoDevice {
    slots: u64,
    pub(super) store: Box<dyn PageStore>,
    /// Test hook: the slot whose next write fails with EIO, or
    /// [`DISARMED`].
    #[cfg(test)]
    armed_write: AtomicU64,
    /// Test hook: the slot whose next read fails with EIO, or
    /// [`DISARMED`].
    #[cfg(test)]
    armed_read: AtomicU64,
    /// Test hook: every write (read) fails with `window_errno` until this
    /// `CLOCK_MONOTONIC` nanosecond; 0 when no window is open.
    #[cfg(test)]
    window_write: AtomicU64,
    #[cfg(test)]
    window_read: AtomicU64,
    #[cfg(test)]
    window_errno: std::sync::atomic::AtomicI32,
    /// Test hook: this many of the next writes queued on an io_uring
    /// write half their bytes, as a short write would.
    #[cfg(test)]
    short_writes: std::sync::atomic::AtomicUsize,
    write_pages: Arc<Counter>,
    /// Writes that worked: `io_write_pages` over this is the average
    /// write, in pages.
    writes: Arc<Counter>,
    read_pages: Arc<Counter>,
    /// Reads that worked: `io_read_pages` over this is the average read.
    reads: Arc<Counter>,
    /// Of those, reads queued with others on an io_uring (`uring.rs`).
    reads_batched: Arc<Counter>,
    write_errors: Arc<Counter>,
    read_errors: Arc<Counter>,
}

impl std::fmt::Debug for IoDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("IoDevice");
        d.field("kind", &self.kind()).field("slots", &self.slots);
        self.store.describe(&mut d);
        d.finish()
    }
}

impl IoDevice {
    pub(super) fn with_store(slots: u64, store: Box<dyn PageStore>, registry: &Registry) -> IoDevice {
        IoDevice {
            slots,
            store,
            #[cfg(test)]
            armed_write: AtomicU64::new(DISARMED),
            #[cfg(test)]
            armed_read: AtomicU64::new(DISARMED),
            #[cfg(test)]
            window_write: AtomicU64::new(0),
            #[cfg(test)]
            window_read: AtomicU64::new(0),
            #[cfg(test)]
            window_errno: std::sync::atomic::AtomicI32::new(0),
            #[cfg(test)]
            short_writes: std::sync::atomic::AtomicUsize::new(0),
            write_pages: registry.counter(CounterId::IO_WRITE_PAGES),
            writes: registry.counter(CounterId::IO_WRITES),
            read_pages: registry.counter(CounterId::IO_READ_PAGES),
            reads: registry.counter(CounterId::IO_READS),
            reads_batched: registry.counter(CounterId::IO_READS_BATCHED),
            write_errors: registry.counter(CounterId::IO_WRITE_ERRORS),
            read_errors: registry.counter(CounterId::IO_READ_ERRORS),
        }
    }

    /// Where the pages live.
    pub fn kind(&self) -> BackendKind {
        self.store.kind()
    }

    /// Whether its reads and writes wait on a disk (a swap file) or a
    /// network (an NBD export): worth handing the rest of a readahead
    /// window to the prefetcher while the program runs, and writeback to
    /// the reclaimer.  Reads from memory (RAM, compressed) cost less than
    /// the hand-over.
    #[inline]
    pub fn waits_on_disk(&self) -> bool {
        matches!(self.kind(), BackendKind::File | BackendKind::Remote)
    }

    /// Whether a page read ahead from here should come in dirty rather
    /// than clean and write-protected: where writing it out again costs a
    /// copy in memory (RAM), less than the write-protect call per run and
    /// the fault of the program's first write; or where its copy leaves
    /// the device anyway ([`frees_on_swapin`](Self::frees_on_swapin)).
    #[inline]
    pub fn read_ahead_dirty(&self, offset: u64) -> bool {
        self.kind() == BackendKind::Ram || self.frees_on_swapin(offset)
    }

    /// Whether its pages' copies cost memory, so that pages read back let
    /// them go and come in sealed (a compressed device; see
    /// [`frees_on_swapin`](Self::frees_on_swapin) for which pages).
    #[inline]
    pub fn lets_copies_go(&self) -> bool {
        self.kind() == BackendKind::Compressed
    }

    /// Pages of memory a RAM device holds (0 for any other device).
    pub fn ram_pages(&self) -> u64 {
        self.store.ram_pages()
    }

    /// Pages of memory a compressed device's store holds (0 for any
    /// other device).
    pub fn store_pages(&self) -> u64 {
        self.store.store_pages()
    }

    /// Number of slots: `0..slots()` may be read and written.
    pub fn slots(&self) -> u64 {
        self.slots
    }

    /// Whether some pages may be in a file (see [`PageStore::has_file`]).
    pub fn has_file(&self) -> bool {
        self.store.has_file()
    }

    /// The descriptors of this device's files that have no name (see
    /// [`PageStore::unlinked_files`]).
    pub fn unlinked_files(&self) -> Vec<std::os::fd::RawFd> {
        let mut fds = Vec::new();
        self.store.unlinked_files(&mut |fd| fds.push(fd));
        fds
    }

    /// Whether a backing grows as it is written (see [`PageStore::grows`]).
    pub fn grows(&self) -> bool {
        self.store.grows()
    }

    /// Bytes its growing backings have allocated (see [`PageStore::grown`]).
    pub fn grown(&self) -> u64 {
        self.store.grown()
    }

    /// Whether it cannot grow now (see [`PageStore::cannot_grow`]).
    pub fn cannot_grow(&self) -> bool {
        self.store.cannot_grow()
    }

    /// Whether a page read back from slot `offset` should leave the device
    /// (see [`PageStore::frees_on_swapin`]): true for a compressed device's
    /// pages in memory.
    pub fn frees_on_swapin(&self, offset: u64) -> bool {
        self.store.frees_on_swapin(offset)
    }

    /// Whether pages written here are encrypted and authenticated
    /// ([`FileOptions::encrypt`]); a slot of such a device that was never
    /// written, or was freed, cannot be read (it has no seal).
    pub fn encrypts(&self) -> bool {
        self.store.sealer().is_some()
    }

    /// The owner freed slots `offset..offset + pages`; a compressed device
    /// frees their memory, an encrypted file forgets their seals.
    /// Allocation-free.
    pub fn slot_freed(&self, offset: u64, pages: u64) {
        self.store.slot_freed(offset, pages)
    }

    /// Whether [`IoDevice::slot_freed`] does anything on this device.
    pub fn wants_slot_freed(&self) -> bool {
        self.store.wants_slot_freed()
    }

    /// Whether slot `offset` is this process's to free (a forked child's
    /// own, `PageStore::owns`).
    pub fn owns(&self, offset: u64) -> bool {
        self.store.owns(offset)
    }

    /// In a forked child, at its adoption: whether the device can give it
    /// swap files of its own ([`IoDevice::open_layer`]).
    pub fn forked(&self) -> bool {
        self.store.forked()
    }

    /// Slots `offset..offset + pages` were just allocated to this
    /// process: a forked child's own from now on (`PageStore::owns`).
    /// Allocation-free.
    pub fn allocated(&self, offset: u64, pages: u64) {
        self.store.allocated(offset, pages)
    }

    /// Make a forked child's swap files of its own (`file.rs`); not on
    /// the fault path (it creates files and allocates).
    pub fn open_layer(&self) -> Result<(), IoError> {
        self.store.open_layer(self.slots)
    }

    /// Compact a compressed device's store; the blocks freed.
    pub fn compact(&self) -> usize {
        self.store.compact()
    }

    /// Test hook: the file behind a compressed device, to inject its
    /// errors.
    #[cfg(test)]
    pub fn file_behind(&self) -> Option<&IoDevice> {
        self.store.file_behind()
    }

    /// Check a compressed device's store bookkeeping.
    pub fn check_store(&self) -> Result<(), String> {
        self.store.check()
    }

    /// The extent map of a file device (`None` for RAM).
    pub fn extent_map(&self) -> Option<&ExtentMap> {
        self.store.extent_map()
    }

    /// Check a call's arguments; returns the number of pages.
    #[inline]
    fn check(&self, offset: u64, len: usize, addr: usize) -> Result<u64, IoError> {
        if len == 0 || !len.is_multiple_of(PAGE_SIZE) {
            return Err(IoError::Unaligned {
                what: "buffer length is not a nonzero multiple of the page size",
            });
        }
        if self.store.needs_alignment() && !addr.is_multiple_of(PAGE_SIZE) {
            return Err(IoError::Unaligned {
                what: "buffer address is not 4096-byte aligned, which file devices (O_DIRECT) need",
            });
        }
        let pages = (len / PAGE_SIZE) as u64;
        match offset.checked_add(pages) {
            Some(end) if end <= self.slots => Ok(pages),
            _ => Err(IoError::Range {
                offset,
                pages,
                slots: self.slots,
            }),
        }
    }

    /// If an error is armed for a slot in `offset..offset + pages`, disarm
    /// it and return that slot: this call must fail.  An error armed for
    /// any slot fails this call; when the call spans several pages it then
    /// stays on the call's first slot, failing every call that covers it
    /// until one writes that page alone, as a bad block stays bad when its
    /// run is retried page by page.
    #[cfg(test)]
    #[inline]
    fn take_injected(armed: &AtomicU64, offset: u64, pages: u64) -> Option<u64> {
        let a = armed.load(Ordering::Relaxed);
        let (bad, next) = if a == ANY_SLOT {
            (offset, if pages > 1 { offset | STICKY } else { DISARMED })
        } else if a != DISARMED && a & STICKY != 0 {
            let bad = a & !STICKY;
            if bad < offset || bad - offset >= pages {
                return None;
            }
            (bad, if pages > 1 { a } else { DISARMED })
        } else if a == DISARMED || a < offset || a - offset >= pages {
            return None;
        } else {
            // One-shot: of several racing calls over the slot, one fails.
            (a, DISARMED)
        };
        armed
            .compare_exchange(a, next, Ordering::Relaxed, Ordering::Relaxed)
            .ok()
            .map(|_| bad)
    }

    /// Write `buf`, `n >= 1` whole pages, to slots `offset..offset + n`.
    ///
    /// For file devices `buf` must be 4096-byte aligned (`O_DIRECT` needs
    /// it; buffered devices ask it too, so that code works on both), else
    /// [`IoError::Unaligned`]; RAM devices take any buffer.  Slots past the
    /// end: [`IoError::Range`].  The run is split wherever the extent map's
    /// translation is not contiguous; short writes and EINTR are retried.
    /// On failure [`IoError::Write`] names the first slot not written; the
    /// slots before it may or may not hold the new data.
    ///
    /// Contract: no other call writes or reads any of these slots while
    /// this one runs (the swap space gives each slot one owner).  Breaking
    /// it is not undefined behaviour but may store or return torn pages.
    ///
    /// Never allocates.
    pub fn write(&self, offset: u64, buf: &[u8]) -> Result<(), IoError> {
        let pages = self.begin_write(offset, buf)?;
        match self.store.write(offset, buf) {
            Ok(()) => {
                self.wrote(pages);
                Ok(())
            }
            Err(e) => {
                self.write_errors.inc();
                Err(e)
            }
        }
    }

    /// A write's checks (and, in tests, its injected failures); returns
    /// its pages.
    pub(super) fn begin_write(&self, offset: u64, buf: &[u8]) -> Result<u64, IoError> {
        let pages = self.check(offset, buf.len(), buf.as_ptr() as usize)?;
        #[cfg(test)]
        if let Some((offset, source)) = self.injected(IoOp::Write, offset, pages) {
            return Err(IoError::Write { offset, source });
        }
        Ok(pages)
    }

    /// Count a write of `pages` that worked.
    pub(super) fn wrote(&self, pages: u64) {
        self.write_pages.add(pages);
        self.writes.inc();
    }

    /// Read slots `offset..offset + n` into `buf`, `n >= 1` whole pages.
    ///
    /// The same rules as [`IoDevice::write`]: aligned buffers for file
    /// devices, [`IoError::Range`] past the end, runs split where the
    /// translation breaks, EINTR and short reads retried.  On failure
    /// [`IoError::Read`] names the first slot not read, or
    /// [`IoError::ShortRead`] where the file ended; `buf` is then
    /// partly filled.  Slots never written read as zeros on a new device.
    ///
    /// Contract: no call writes any of these slots while this one runs.
    /// Never allocates.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), IoError> {
        let pages = self.check(offset, buf.len(), buf.as_ptr() as usize)?;
        #[cfg(test)]
        if let Some((offset, source)) = self.injected(IoOp::Read, offset, pages) {
            return Err(IoError::Read { offset, source });
        }
        match self.store.read(offset, buf) {
            Ok(()) => {
                self.read_pages.add(pages);
                self.reads.inc();
                Ok(())
            }
            Err(e) => {
                self.read_errors.inc();
                Err(e)
            }
        }
    }

    /// For a read queued on an io_uring (`uring.rs`): the checks of
    /// [`IoDevice::read`]; the pages, or `None` where the read must go
    /// the synchronous way (a bad argument, or in tests an error armed
    /// for it, which that way meets).
    pub(super) fn begin_read(&self, offset: u64, buf: &[u8]) -> Option<u64> {
        #[cfg(test)]
        if self.read_armed() {
            return None;
        }
        self.check(offset, buf.len(), buf.as_ptr() as usize).ok()
    }

    /// Count a queued read that worked.
    pub(super) fn read_done(&self, pages: u64) {
        self.read_pages.add(pages);
        self.reads.inc();
        self.reads_batched.inc();
    }

    /// Test hook: whether a read error is armed or its window open.
    #[cfg(test)]
    fn read_armed(&self) -> bool {
        self.armed_read.load(Ordering::Relaxed) != DISARMED || self.in_window(&self.window_read).is_some()
    }

    /// Test hook: the next `n` writes queued on an io_uring
    /// (`WriteRing`) write half their bytes, as a short write would.
    #[cfg(test)]
    pub fn inject_short_writes(&self, n: usize) {
        self.short_writes.store(n, Ordering::Relaxed);
    }

    /// Test hook: the injected short writes not yet met.
    #[cfg(test)]
    pub fn short_writes_pending(&self) -> usize {
        self.short_writes.load(Ordering::Relaxed)
    }

    /// Test hook: the writes and reads that worked, as calls (a call
    /// of many pages counts one).
    #[cfg(test)]
    pub fn calls(&self) -> (u64, u64) {
        (self.writes.get(), self.reads.get())
    }

    /// Test hook: whether the write being queued is to come back short.
    #[cfg(test)]
    pub(crate) fn take_short_write(&self) -> bool {
        self.short_writes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    }

    /// Test hook: make the next write (or read, per `op`) whose slots
    /// include `offset` ([`ANY_SLOT`]: whatever its slots; see
    /// `take_injected` for a call of several pages) fail with EIO before
    /// doing any IO, once.  Arming again replaces the previous slot for
    /// that op.  Lets the pager's error paths be tested; allocation-free.
    #[cfg(test)]
    pub fn inject_error(&self, offset: u64, op: IoOp) {
        let armed = match op {
            IoOp::Read => &self.armed_read,
            IoOp::Write => &self.armed_write,
        };
        armed.store(offset, Ordering::Relaxed);
    }

    /// Test hook: make every write (or read, per `op`) fail with `errno`
    /// for the next `duration`, as a full or failing disk would.
    #[cfg(test)]
    pub fn inject_errors_for(&self, op: IoOp, errno: i32, duration: std::time::Duration) {
        self.window_errno.store(errno, Ordering::Relaxed);
        let until = monotonic_ns() + duration.as_nanos() as u64;
        match op {
            IoOp::Read => self.window_read.store(until, Ordering::Release),
            IoOp::Write => self.window_write.store(until, Ordering::Release),
        }
    }

    /// The failure injected into this call, if any (counted): the slot to
    /// name and the error: `EIO` for an armed slot, the window's errno
    /// while a window is open.
    #[cfg(test)]
    fn injected(&self, op: IoOp, offset: u64, pages: u64) -> Option<(u64, io::Error)> {
        let (armed, window, errors) = match op {
            IoOp::Read => (&self.armed_read, &self.window_read, &self.read_errors),
            IoOp::Write => (&self.armed_write, &self.window_write, &self.write_errors),
        };
        let failure = match Self::take_injected(armed, offset, pages) {
            Some(slot) => Some((slot, io::Error::from_raw_os_error(libc::EIO))),
            None => self
                .in_window(window)
                .map(|errno| (offset, io::Error::from_raw_os_error(errno))),
        };
        if failure.is_some() {
            errors.inc();
        }
        failure
    }

    /// The injected errno, while an error window of `window` is open.
    #[cfg(test)]
    #[inline]
    fn in_window(&self, window: &AtomicU64) -> Option<i32> {
        let until = window.load(Ordering::Acquire);
        if until == 0 {
            return None;
        }
        if monotonic_ns() < until {
            return Some(self.window_errno.load(Ordering::Relaxed));
        }
        window.store(0, Ordering::Relaxed);
        None
    }
}
