//! The IO backend of one swap device: store and fetch page contents by slot.
//!
//! The pager writes evicted pages to a device's slots and reads them back on
//! a fault.  An [`IoDevice`] is where those pages live, either in memory
//! ([`IoDevice::ram`], like the RAM disks the seeds' tests swap on) or in a
//! file or block device ([`IoDevice::file`]).  Slot `offset` holds one
//! [`PAGE_SIZE`]-byte page; multi-page calls move a run of consecutive
//! slots, as a 2 MB swap-out of seed 003 does.
//!
//! File devices translate every slot through an [`ExtentMap`] (the kernel's
//! `map_swap_entry()`), so a device assembled from several backings, or a
//! file mapped by its physical extents (FIEMAP), is written where the map
//! says.  A run is cut wherever the translation stops being contiguous (a
//! new backing, or a jump in byte offset); uswap does its IO through the
//! file, never the raw disk, so two FIEMAP extents that follow each other in
//! the file's logical offsets are one `pwrite`, as they are one run of
//! bytes to the file.
//!
//! File IO uses `O_DIRECT` by default, as the design asks (USERFAULTFD.md,
//! IO): without it every swapped-out page would also sit in the page cache,
//! which defeats swapping it out.  `O_DIRECT` wants 4096-byte aligned
//! buffers; see [`IoDevice::write`].
//!
//! Concurrency: every method takes `&self` and the device is `Send + Sync`.
//! There is no lock on the data path: the swap space hands each slot to one
//! owner at a time, so callers never write one slot from two threads at
//! once, nor read a slot while it is being written.  If they did anyway,
//! the page read could be torn (a mix of old and new bytes) but nothing
//! worse: RAM devices copy with relaxed atomic word accesses rather than
//! plain `memcpy`, so a racing caller is a logic error, never undefined
//! behaviour.
//!
//! [`IoDevice::read`] and [`IoDevice::write`] never allocate, on success or
//! failure, so the fault path can call them.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::extent::{self, ExtentError, ExtentMap, ExtentMapKind, ExtentSource};
use crate::stats::{Counter, Registry};
use crate::PAGE_SIZE;

const PAGE: u64 = PAGE_SIZE as u64;

/// No injected error armed.
const DISARMED: u64 = u64::MAX;

/// Where a device's pages live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// An anonymous memory mapping ([`IoDevice::ram`]).
    Ram,
    /// A file or block device ([`IoDevice::file`]).
    File,
}

/// Which direction of IO an injected error hits ([`IoDevice::inject_error`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoOp {
    /// Reads (swap-in).
    Read,
    /// Writes (swap-out).
    Write,
}

/// Why a device could not be set up, or an IO failed.  Every message is one
/// line naming the path or slot and what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    /// The swap file did not exist and could not be created or preallocated.
    #[error("{}: cannot create the swap file: {source}; check that the directory exists and is writable and that the filesystem has room", .path.display())]
    Create {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The swap file or device exists but could not be opened or sized.
    #[error("{}: cannot open: {source}; check the path and that this user may read and write it", .path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// An existing file or device is smaller than the slots asked for.
    #[error("{}: is {have} bytes but {need} bytes are needed; grow it (e.g. `fallocate -l {need} {}`), ask for fewer slots, or give a path that does not exist yet to have it created", .path.display(), .path.display())]
    TooSmall { path: PathBuf, have: u64, need: u64 },
    /// `O_DIRECT` was asked for on a filesystem that refuses it (tmpfs).
    #[error("{}: the filesystem does not support O_DIRECT (tmpfs does not); use FileOptions::direct(false) or put the swap file on a filesystem that does, such as ext4 or xfs", .path.display())]
    DirectUnsupported { path: PathBuf },
    /// The extent map could not be built.
    #[error(transparent)]
    Extent(#[from] ExtentError),
    /// A buffer of the wrong length, or a misaligned one for a file device.
    #[error("{what}; pass whole {PAGE_SIZE}-byte pages in a {PAGE_SIZE}-byte aligned buffer")]
    Unaligned { what: &'static str },
    /// Slots past the end of the device.
    #[error("slots {offset}..{} are out of range: the device has {slots} slots; fix the caller", .offset.saturating_add(*.pages))]
    Range { offset: u64, pages: u64, slots: u64 },
    /// A write failed (or an error was injected there).
    #[error("write of swap slot {offset} failed: {source}; the swap backing is failing, check the kernel log (dmesg) and the disk")]
    Write {
        offset: u64,
        #[source]
        source: io::Error,
    },
    /// A read failed (or an error was injected there).
    #[error("read of swap slot {offset} failed: {source}; the swap backing is failing, check the kernel log (dmesg) and the disk")]
    Read {
        offset: u64,
        #[source]
        source: io::Error,
    },
    /// A read hit the end of the file: it shrank while in use.
    #[error("read of swap slot {offset} hit the end of the file; the swap file was truncated while in use, do not modify it while swapping on it")]
    ShortRead { offset: u64 },
    /// The memory of a RAM device could not be mapped.
    #[error("cannot map the memory of a RAM swap device: {source}; ask for fewer slots or raise the memory limits")]
    Mmap {
        #[source]
        source: io::Error,
    },
    /// A device of zero slots was asked for.
    #[error("a swap device needs at least one slot; ask for one or more")]
    ZeroSize,
}

/// How to open a file device.  Built with [`FileOptions::new`] and the
/// setters; passed to [`IoDevice::file`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileOptions {
    path: PathBuf,
    slots: u64,
    direct: bool,
    fiemap: bool,
    extent_kind: ExtentMapKind,
}

impl FileOptions {
    /// A device of `slots` pages at `path`: created (mode 0600, fully
    /// preallocated) if it does not exist, else used as is.  `O_DIRECT`,
    /// one whole-file extent, a tree extent map.
    pub fn new(path: impl Into<PathBuf>, slots: u64) -> Self {
        FileOptions {
            path: path.into(),
            slots,
            direct: true,
            fiemap: false,
            extent_kind: ExtentMapKind::Tree,
        }
    }

    /// `O_DIRECT` IO (the default, `true`), or buffered IO (`false`) for
    /// filesystems without `O_DIRECT`, such as tmpfs.
    pub fn direct(mut self, on: bool) -> Self {
        self.direct = on;
        self
    }

    /// Map the file by its physical extents ([`ExtentSource::Fiemap`]), so a
    /// fragmented file has as many extents as in the kernel; holes and
    /// unstable extents are refused.  Default `false`: one extent for the
    /// whole file ([`ExtentSource::Whole`]).
    pub fn fiemap(mut self, on: bool) -> Self {
        self.fiemap = on;
        self
    }

    /// How the extent map finds a slot's extent (default
    /// [`ExtentMapKind::Tree`]).
    pub fn extent_kind(mut self, k: ExtentMapKind) -> Self {
        self.extent_kind = k;
        self
    }
}

/// The memory of a RAM device: an anonymous private mapping, unmapped on
/// drop.
///
/// Invariant: `base` is the start of a live mapping of `len` bytes,
/// readable and writable, page aligned, owned by this value alone; every
/// access to it goes through the atomic word copies in [`ram_write`] and
/// [`ram_read`].
struct RamRegion {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the region is plain memory owned by this value; nothing in it is
// tied to a thread, and all shared access goes through atomics (see the
// invariant), so moving it to and sharing it between threads is sound.
unsafe impl Send for RamRegion {}
// SAFETY: as above: `&RamRegion` only permits atomic accesses to the bytes.
unsafe impl Sync for RamRegion {}

impl RamRegion {
    fn new(len: usize) -> Result<RamRegion, IoError> {
        // SAFETY: an anonymous mapping at an address of the kernel's choice
        // touches no existing memory; the arguments are plain values.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(IoError::Mmap {
                source: io::Error::last_os_error(),
            });
        }
        let base = NonNull::new(p.cast::<u8>()).expect("mmap returned NULL without MAP_FIXED");
        let region = RamRegion { base, len };
        // A forked child must neither share the swapped-out pages nor copy
        // them (the kernel's swap is not inherited either).
        // SAFETY: the range is exactly the mapping just made, which we own.
        let rc = unsafe { libc::madvise(p, len, libc::MADV_DONTFORK) };
        if rc != 0 {
            let source = io::Error::last_os_error();
            drop(region); // unmaps
            return Err(IoError::Mmap { source });
        }
        Ok(region)
    }
}

impl Drop for RamRegion {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are our mapping (invariant), and `&mut self`
        // means no reference into it is live.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// Copy `src` (a whole number of words) into the region at byte `at`.
///
/// The region is written with relaxed atomic stores, one 8-byte word at a
/// time: a caller that broke the one-owner-per-slot contract gets torn
/// pages, not a data race.
#[inline]
fn ram_write(region: &RamRegion, at: usize, src: &[u8]) {
    assert!(at % 8 == 0 && src.len() % 8 == 0 && at + src.len() <= region.len);
    for (i, w) in src.chunks_exact(8).enumerate() {
        let v = u64::from_ne_bytes(w.try_into().expect("chunks of 8"));
        // SAFETY: `at + 8 * i + 8 <= len` (asserted above), so the word is
        // inside the live mapping; the base is page aligned and `at` a
        // multiple of 8, so it is aligned for AtomicU64; the region is only
        // ever accessed atomically (RamRegion's invariant).
        let word = unsafe { AtomicU64::from_ptr(region.base.as_ptr().add(at + 8 * i).cast::<u64>()) };
        word.store(v, Ordering::Relaxed);
    }
}

/// Copy from the region at byte `at` into `dst` (a whole number of words),
/// with relaxed atomic loads; see [`ram_write`].
#[inline]
fn ram_read(region: &RamRegion, at: usize, dst: &mut [u8]) {
    assert!(at % 8 == 0 && dst.len() % 8 == 0 && at + dst.len() <= region.len);
    for (i, w) in dst.chunks_exact_mut(8).enumerate() {
        // SAFETY: as in `ram_write`: in bounds, aligned, atomic-only.
        let word = unsafe { AtomicU64::from_ptr(region.base.as_ptr().add(at + 8 * i).cast::<u64>()) };
        w.copy_from_slice(&word.load(Ordering::Relaxed).to_ne_bytes());
    }
}

/// A file device: its backings and the map from slot to backing.
struct FileBackend {
    /// The path of each backing, for messages.
    paths: Vec<PathBuf>,
    /// One open file per backing, indexed by the map's backing numbers.
    files: Vec<File>,
    map: ExtentMap,
}

enum Backend {
    Ram(RamRegion),
    File(FileBackend),
}

/// The page store of one swap device.  See the module documentation.
pub struct IoDevice {
    slots: u64,
    backend: Backend,
    /// The slot whose next write fails with EIO, or [`DISARMED`].
    armed_write: AtomicU64,
    /// The slot whose next read fails with EIO, or [`DISARMED`].
    armed_read: AtomicU64,
    write_pages: Arc<Counter>,
    read_pages: Arc<Counter>,
    write_errors: Arc<Counter>,
    read_errors: Arc<Counter>,
}

impl std::fmt::Debug for IoDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("IoDevice");
        d.field("kind", &self.kind()).field("slots", &self.slots);
        if let Backend::File(fb) = &self.backend {
            d.field("paths", &fb.paths).field("extents", &fb.map.len());
        }
        d.finish()
    }
}

/// Open flags for a backing: read-write, plus `O_DIRECT` when asked.
fn open_options(direct: bool) -> OpenOptions {
    let mut o = OpenOptions::new();
    o.read(true).write(true);
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    o
}

/// Open an existing backing for IO, mapping EINVAL under `O_DIRECT` to
/// [`IoError::DirectUnsupported`].
fn open_existing(path: &Path, direct: bool) -> Result<File, IoError> {
    open_options(direct).open(path).map_err(|e| {
        if direct && e.raw_os_error() == Some(libc::EINVAL) {
            IoError::DirectUnsupported {
                path: path.to_path_buf(),
            }
        } else {
            IoError::Open {
                path: path.to_path_buf(),
                source: e,
            }
        }
    })
}

/// Create `path` (mode 0600, failing if it appeared meanwhile) and
/// preallocate `len` bytes, so no swap-out ever needs the filesystem to
/// allocate.  Removes the file again if preallocation fails.
fn create_preallocated(path: &Path, len: u64) -> Result<(), IoError> {
    let create_err = |source| IoError::Create {
        path: path.to_path_buf(),
        source,
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(create_err)?;
    let res = (|| {
        let len = libc::off_t::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "size does not fit off_t"))?;
        loop {
            // SAFETY: plain syscall wrapper on a descriptor we hold open.
            let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) };
            match rc {
                0 => return file.sync_all(),
                libc::EINTR => continue,
                e => return Err(io::Error::from_raw_os_error(e)),
            }
        }
    })();
    if let Err(e) = res {
        drop(file);
        let _ = std::fs::remove_file(path);
        return Err(create_err(e));
    }
    Ok(())
}

/// The size in bytes of an open regular file or block device.
fn backing_size(file: &File, block_device: bool) -> io::Result<u64> {
    if block_device {
        use std::io::{Seek, SeekFrom};
        // `&File` seeks the shared file offset, which pread/pwrite ignore.
        (&*file).seek(SeekFrom::End(0))
    } else {
        Ok(file.metadata()?.len())
    }
}

impl IoDevice {
    /// A RAM device of `slots` pages: an anonymous private mapping of
    /// `slots * 4096` bytes with `MAP_NORESERVE` (pages are only allocated
    /// when first written) and `MADV_DONTFORK` (a forked child neither
    /// shares nor copies it), unmapped on drop.  Unwritten slots read as
    /// zeros.
    pub fn ram(slots: u64, registry: &Registry) -> Result<IoDevice, IoError> {
        if slots == 0 {
            return Err(IoError::ZeroSize);
        }
        let len = slots
            .checked_mul(PAGE)
            .and_then(|b| usize::try_from(b).ok())
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(|| IoError::Mmap {
                source: io::Error::new(io::ErrorKind::InvalidInput, "size overflows the address space"),
            })?;
        let region = RamRegion::new(len)?;
        Ok(Self::with_backend(slots, Backend::Ram(region), registry))
    }

    /// A file device of `opts.slots` pages at `opts.path`.
    ///
    /// A path that does not exist is created with mode 0600 and
    /// preallocated to `slots * 4096` bytes (`posix_fallocate`).  An
    /// existing path must be a regular file or block device of at least
    /// that size, and is used as is: never truncated, never chmodded.  The
    /// extent map is then built through [`extent::from_sources`] (one whole
    /// extent, or the file's FIEMAP extents) and every IO translated
    /// through it.
    ///
    /// With `O_DIRECT` (the default) on a filesystem that refuses it,
    /// [`IoError::DirectUnsupported`]; a file this call created is removed
    /// again on any error.
    pub fn file(opts: &FileOptions, registry: &Registry) -> Result<IoDevice, IoError> {
        if opts.slots == 0 {
            return Err(IoError::ZeroSize);
        }
        let need = opts.slots.checked_mul(PAGE).ok_or(IoError::Range {
            offset: 0,
            pages: opts.slots,
            slots: u64::MAX / PAGE,
        })?;
        let path = &opts.path;
        let created = match std::fs::metadata(path) {
            Ok(_) => false,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                create_preallocated(path, need)?;
                true
            }
            Err(e) => {
                return Err(IoError::Open {
                    path: path.clone(),
                    source: e,
                })
            }
        };
        let res = Self::open_file(opts, need, registry);
        if res.is_err() && created {
            let _ = std::fs::remove_file(path);
        }
        res
    }

    /// [`IoDevice::file`] once the file exists.
    fn open_file(opts: &FileOptions, need: u64, registry: &Registry) -> Result<IoDevice, IoError> {
        let path = &opts.path;
        // Check the type before opening: opening a FIFO would block.
        let meta = std::fs::metadata(path).map_err(|e| IoError::Open {
            path: path.clone(),
            source: e,
        })?;
        let ft = meta.file_type();
        let block_device = ft.is_block_device();
        if ft.is_dir() {
            return Err(ExtentError::IsDirectory { path: path.clone() }.into());
        }
        if !ft.is_file() && !block_device {
            let what = if ft.is_char_device() {
                "a character device"
            } else if ft.is_fifo() {
                "a FIFO"
            } else if ft.is_socket() {
                "a socket"
            } else {
                "not a regular file or block device"
            };
            return Err(ExtentError::NotSwappable {
                path: path.clone(),
                what,
            }
            .into());
        }
        let file = open_existing(path, opts.direct)?;
        let have = backing_size(&file, block_device).map_err(|e| IoError::Open {
            path: path.clone(),
            source: e,
        })?;
        if have < need {
            return Err(IoError::TooSmall {
                path: path.clone(),
                have,
                need,
            });
        }
        let source = if opts.fiemap {
            ExtentSource::Fiemap { path: path.clone() }
        } else {
            ExtentSource::Whole {
                path: path.clone(),
                len: Some(need),
            }
        };
        Self::from_backings(opts.slots, vec![(path.clone(), file)], &[source], opts.extent_kind, registry)
    }

    /// A file device over already open backings, slot `i` of `sources`
    /// backed by `backings[i]`.  A FIEMAP map covers the whole file, which
    /// may be more than `slots`; only `0..slots` is used.
    fn from_backings(
        slots: u64,
        backings: Vec<(PathBuf, File)>,
        sources: &[ExtentSource],
        kind: ExtentMapKind,
        registry: &Registry,
    ) -> Result<IoDevice, IoError> {
        debug_assert_eq!(backings.len(), sources.len());
        let (map, _infos) = extent::from_sources(kind, sources)?;
        if map.slots() < slots {
            // Whole sources were sized to fit; a FIEMAP map is the file's
            // whole size, checked above, so this is a file that shrank.
            let path = backings[0].0.clone();
            return Err(IoError::TooSmall {
                path,
                have: map.slots() * PAGE,
                need: slots * PAGE,
            });
        }
        let (paths, files) = backings.into_iter().unzip();
        Ok(Self::with_backend(
            slots,
            Backend::File(FileBackend { paths, files, map }),
            registry,
        ))
    }

    fn with_backend(slots: u64, backend: Backend, registry: &Registry) -> IoDevice {
        IoDevice {
            slots,
            backend,
            armed_write: AtomicU64::new(DISARMED),
            armed_read: AtomicU64::new(DISARMED),
            write_pages: registry.counter("io_write_pages"),
            read_pages: registry.counter("io_read_pages"),
            write_errors: registry.counter("io_write_errors"),
            read_errors: registry.counter("io_read_errors"),
        }
    }

    /// Where the pages live.
    pub fn kind(&self) -> BackendKind {
        match self.backend {
            Backend::Ram(_) => BackendKind::Ram,
            Backend::File(_) => BackendKind::File,
        }
    }

    /// Number of slots: `0..slots()` may be read and written.
    pub fn slots(&self) -> u64 {
        self.slots
    }

    /// The extent map of a file device (`None` for RAM).
    pub fn extent_map(&self) -> Option<&ExtentMap> {
        match &self.backend {
            Backend::Ram(_) => None,
            Backend::File(fb) => Some(&fb.map),
        }
    }

    /// Check a call's arguments; returns the number of pages.
    #[inline]
    fn check(&self, offset: u64, len: usize, addr: usize) -> Result<u64, IoError> {
        if len == 0 || len % PAGE_SIZE != 0 {
            return Err(IoError::Unaligned {
                what: "buffer length is not a nonzero multiple of the page size",
            });
        }
        if matches!(self.backend, Backend::File(_)) && addr % PAGE_SIZE != 0 {
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
    /// it and return that slot: this call must fail.
    #[inline]
    fn take_injected(armed: &AtomicU64, offset: u64, pages: u64) -> Option<u64> {
        let a = armed.load(Ordering::Relaxed);
        if a == DISARMED || a < offset || a - offset >= pages {
            return None;
        }
        // One-shot: of several racing calls over the slot, one fails.
        armed
            .compare_exchange(a, DISARMED, Ordering::Relaxed, Ordering::Relaxed)
            .ok()
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
        let pages = self.check(offset, buf.len(), buf.as_ptr() as usize)?;
        if let Some(slot) = Self::take_injected(&self.armed_write, offset, pages) {
            self.write_errors.inc();
            return Err(IoError::Write {
                offset: slot,
                source: io::Error::from_raw_os_error(libc::EIO),
            });
        }
        let res = match &self.backend {
            Backend::Ram(region) => {
                ram_write(region, (offset * PAGE) as usize, buf);
                Ok(())
            }
            Backend::File(fb) => fb.for_each_run(offset, pages, |file, pos, range| {
                write_all_at(file, &buf[range], pos)
            }),
        };
        match res {
            Ok(()) => {
                self.write_pages.add(pages);
                Ok(())
            }
            Err((slot, e)) => {
                self.write_errors.inc();
                Err(match e {
                    RunError::Io(source) => IoError::Write { offset: slot, source },
                    RunError::Eof => IoError::Write {
                        offset: slot,
                        source: io::ErrorKind::WriteZero.into(),
                    },
                })
            }
        }
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
        if let Some(slot) = Self::take_injected(&self.armed_read, offset, pages) {
            self.read_errors.inc();
            return Err(IoError::Read {
                offset: slot,
                source: io::Error::from_raw_os_error(libc::EIO),
            });
        }
        let res = match &self.backend {
            Backend::Ram(region) => {
                ram_read(region, (offset * PAGE) as usize, buf);
                Ok(())
            }
            Backend::File(fb) => fb.for_each_run(offset, pages, |file, pos, range| {
                read_exact_at(file, &mut buf[range], pos)
            }),
        };
        match res {
            Ok(()) => {
                self.read_pages.add(pages);
                Ok(())
            }
            Err((slot, e)) => {
                self.read_errors.inc();
                Err(match e {
                    RunError::Io(source) => IoError::Read { offset: slot, source },
                    RunError::Eof => IoError::ShortRead { offset: slot },
                })
            }
        }
    }

    /// Test hook: make the next write (or read, per `op`) whose slots
    /// include `offset` fail with EIO before doing any IO, once.  Arming
    /// again replaces the previous slot for that op.  Lets the pager's
    /// error paths be tested; allocation-free.
    #[doc(hidden)]
    pub fn inject_error(&self, offset: u64, op: IoOp) {
        let armed = match op {
            IoOp::Read => &self.armed_read,
            IoOp::Write => &self.armed_write,
        };
        armed.store(offset, Ordering::Relaxed);
    }
}

/// How one contiguous piece of IO failed: after how many bytes, and why.
enum RunError {
    Io(io::Error),
    /// Zero bytes transferred: end of file.
    Eof,
}

impl FileBackend {
    /// Cut slots `offset..offset + pages` into runs contiguous on one
    /// backing and call `io(file, byte position, buffer byte range)` for
    /// each, in order.  `io` returns the bytes done before a failure with
    /// it; the failure comes back with the slot it happened at.
    #[inline]
    fn for_each_run(
        &self,
        offset: u64,
        pages: u64,
        mut io: impl FnMut(&File, u64, std::ops::Range<usize>) -> Result<(), (usize, RunError)>,
    ) -> Result<(), (u64, RunError)> {
        let end = offset + pages;
        let mut slot = offset;
        while slot < end {
            let (backing, pos) = self.map.lookup(slot).expect("slot checked in range");
            // Extend the run while the next slot follows on the same backing.
            let mut n = 1;
            while slot + n < end && self.map.lookup(slot + n) == Some((backing, pos + n * PAGE)) {
                n += 1;
            }
            let from = ((slot - offset) * PAGE) as usize;
            let to = from + (n * PAGE) as usize;
            io(&self.files[backing as usize], pos, from..to)
                .map_err(|(done, e)| (slot + (done / PAGE_SIZE) as u64, e))?;
            slot += n;
        }
        Ok(())
    }
}

/// `pwrite` all of `buf` at `pos`, retrying EINTR and short writes.
fn write_all_at(file: &File, buf: &[u8], pos: u64) -> Result<(), (usize, RunError)> {
    let mut done = 0;
    while done < buf.len() {
        match file.write_at(&buf[done..], pos + done as u64) {
            Ok(0) => return Err((done, RunError::Eof)),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err((done, RunError::Io(e))),
        }
    }
    Ok(())
}

/// `pread` all of `buf` at `pos`, retrying EINTR and short reads.
fn read_exact_at(file: &File, buf: &mut [u8], pos: u64) -> Result<(), (usize, RunError)> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], pos + done as u64) {
            Ok(0) => return Err((done, RunError::Eof)),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err((done, RunError::Io(e))),
        }
    }
    Ok(())
}
