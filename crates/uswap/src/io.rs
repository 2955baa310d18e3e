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
//! behaviour.  That costs a little: word copies do not vectorise, and a
//! RAM page write takes about 0.27 µs and a read 0.37 µs (release build,
//! this project's 2-core machine), against a fault's ~16 µs.
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
/// For [`IoDevice::inject_error`]: the next IO, whatever slot it is for.
#[doc(hidden)]
pub const ANY_SLOT: u64 = u64::MAX - 1;
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
    /// `O_DIRECT` was asked for on a filesystem that refuses it (ramfs, or
    /// tmpfs before Linux 6.6).
    #[error("{}: the filesystem does not support O_DIRECT (ramfs does not, nor tmpfs before Linux 6.6); use FileOptions::direct(false) or put the swap file on a filesystem that does, such as ext4 or xfs", .path.display())]
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

impl IoError {
    /// The errno of a failed read or write.
    pub fn errno(&self) -> Option<i32> {
        match self {
            IoError::Write { source, .. } | IoError::Read { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    /// Whether a failed read or write may well work if tried again later:
    /// the backing is full or short of a resource for now (`ENOSPC`,
    /// `EDQUOT`, `ENOMEM`, `ENOBUFS`, `EAGAIN`, `EBUSY`, `EINTR`,
    /// `ETIMEDOUT`), as opposed to a block that is bad (`EIO`, `EILSEQ`,
    /// `EBADMSG`, `ENODATA`), a device that is gone, or a truncated file.
    /// The pager retires a slot only on the second kind.
    pub fn is_transient(&self) -> bool {
        matches!(
            self.errno(),
            Some(
                libc::ENOSPC
                    | libc::EDQUOT
                    | libc::ENOMEM
                    | libc::ENOBUFS
                    | libc::EAGAIN
                    | libc::EBUSY
                    | libc::EINTR
                    | libc::ETIMEDOUT
            )
        )
    }
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
    /// filesystems without `O_DIRECT`, such as ramfs, or tmpfs before
    /// Linux 6.6.
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
    /// The process that mapped it: a forked child inherits this value but
    /// not the mapping (`MADV_DONTFORK`), and must not unmap whatever it
    /// has at that address.
    pid: libc::pid_t,
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
        // SAFETY: getpid has no preconditions.
        let region = RamRegion {
            base,
            len,
            pid: unsafe { libc::getpid() },
        };
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
        // SAFETY: getpid has no preconditions.
        if self.pid != unsafe { libc::getpid() } {
            return;
        }
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
    /// Boxed: the map is several cache lines (its list variant pads its
    /// cursor), which a RAM device need not carry.
    File(Box<FileBackend>),
}

/// The page store of one swap device.  See the module documentation.
pub struct IoDevice {
    slots: u64,
    backend: Backend,
    /// The slot whose next write fails with EIO, or [`DISARMED`].
    armed_write: AtomicU64,
    /// The slot whose next read fails with EIO, or [`DISARMED`].
    armed_read: AtomicU64,
    /// Test hook: every write (read) fails with `window_errno` until this
    /// `CLOCK_MONOTONIC` nanosecond; 0 when no window is open.
    window_write: AtomicU64,
    window_read: AtomicU64,
    window_errno: std::sync::atomic::AtomicI32,
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
        Self::from_backings(
            opts.slots,
            vec![(path.clone(), file)],
            &[source],
            opts.extent_kind,
            registry,
        )
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
            Backend::File(Box::new(FileBackend { paths, files, map })),
            registry,
        ))
    }

    fn with_backend(slots: u64, backend: Backend, registry: &Registry) -> IoDevice {
        IoDevice {
            slots,
            backend,
            armed_write: AtomicU64::new(DISARMED),
            armed_read: AtomicU64::new(DISARMED),
            window_write: AtomicU64::new(0),
            window_read: AtomicU64::new(0),
            window_errno: std::sync::atomic::AtomicI32::new(0),
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
        if a == ANY_SLOT {
            return armed
                .compare_exchange(a, DISARMED, Ordering::Relaxed, Ordering::Relaxed)
                .ok()
                .map(|_| offset);
        }
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
        if let Some(errno) = self.in_window(&self.window_write) {
            self.write_errors.inc();
            return Err(IoError::Write {
                offset,
                source: io::Error::from_raw_os_error(errno),
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
        if let Some(errno) = self.in_window(&self.window_read) {
            self.read_errors.inc();
            return Err(IoError::Read {
                offset,
                source: io::Error::from_raw_os_error(errno),
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
    /// include `offset` ([`ANY_SLOT`]: whatever its slots) fail with EIO
    /// before doing any IO, once.  Arming
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

    /// Test hook: make every write (or read, per `op`) fail with `errno`
    /// for the next `duration`, as a full or failing disk would.
    #[doc(hidden)]
    pub fn inject_errors_for(&self, op: IoOp, errno: i32, duration: std::time::Duration) {
        self.window_errno.store(errno, Ordering::Relaxed);
        let until = monotonic_ns() + duration.as_nanos() as u64;
        match op {
            IoOp::Read => self.window_read.store(until, Ordering::Release),
            IoOp::Write => self.window_write.store(until, Ordering::Release),
        }
    }

    /// The injected errno, while an error window of `window` is open.
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

/// `CLOCK_MONOTONIC` in nanoseconds (a vDSO call; allocation-free).
pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::{alloc_zeroed, dealloc, handle_alloc_error, Layout};
    use std::io::Write as _;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    /// A zeroed buffer of whole pages, 4096-byte aligned as O_DIRECT needs.
    struct AlignedBuf {
        ptr: NonNull<u8>,
        layout: Layout,
    }

    impl AlignedBuf {
        fn new(pages: usize) -> AlignedBuf {
            let layout = Layout::from_size_align(pages * PAGE_SIZE, PAGE_SIZE).unwrap();
            assert!(layout.size() > 0);
            // SAFETY: the layout has a nonzero size.
            let p = unsafe { alloc_zeroed(layout) };
            let ptr = NonNull::new(p).unwrap_or_else(|| handle_alloc_error(layout));
            AlignedBuf { ptr, layout }
        }
    }

    impl std::ops::Deref for AlignedBuf {
        type Target = [u8];
        fn deref(&self) -> &[u8] {
            // SAFETY: `ptr` is a live, initialised (zeroed) allocation of
            // `layout.size()` bytes that we own.
            unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
        }
    }

    impl std::ops::DerefMut for AlignedBuf {
        fn deref_mut(&mut self) -> &mut [u8] {
            // SAFETY: as in `deref`, and `&mut self` makes it exclusive.
            unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
        }
    }

    impl Drop for AlignedBuf {
        fn drop(&mut self) {
            // SAFETY: allocated by `alloc_zeroed` with this layout.
            unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
        }
    }

    /// The word `w` of the page that generation `gen` writes to `slot`:
    /// distinct per slot, generation and position, never zero.
    fn word(slot: u64, gen: u64, w: u64) -> u64 {
        ((slot << 40) ^ (gen << 16) ^ w ^ 0x9E37_79B9_7F4A_7C15).wrapping_mul(0xBF58_476D_1CE4_E5B9) | 1
    }

    /// Fill `buf` with the pages generation `gen` writes to slots from
    /// `first`.
    fn fill(buf: &mut [u8], first: u64, gen: u64) {
        for (p, page) in buf.chunks_exact_mut(PAGE_SIZE).enumerate() {
            for (w, b) in page.chunks_exact_mut(8).enumerate() {
                b.copy_from_slice(&word(first + p as u64, gen, w as u64).to_le_bytes());
            }
        }
    }

    /// Check `buf`, read from slots from `first`, against the model: the
    /// generation last written to each slot, or zeros if none.
    fn verify(buf: &[u8], first: u64, model: &[Option<u64>]) {
        for (p, page) in buf.chunks_exact(PAGE_SIZE).enumerate() {
            let slot = first + p as u64;
            match model[slot as usize] {
                None => assert!(page.iter().all(|&b| b == 0), "slot {slot} should read zeros"),
                Some(gen) => {
                    for (w, b) in page.chunks_exact(8).enumerate() {
                        let got = u64::from_le_bytes(b.try_into().unwrap());
                        assert_eq!(got, word(slot, gen, w as u64), "slot {slot} gen {gen} word {w}");
                    }
                }
            }
        }
    }

    fn counter(reg: &Registry, name: &str) -> u64 {
        reg.snapshot().counter(name)
    }

    /// Zeros everywhere, then single pages and runs of several sizes,
    /// rewrites, and every slot checked against the model.
    /// Returns the model: the generation last written to each slot.
    fn round_trip(dev: &IoDevice, reg: &Registry) -> Vec<Option<u64>> {
        let slots = dev.slots();
        assert!(slots >= 600);
        let mut model = vec![None; slots as usize];
        let mut buf = AlignedBuf::new(130);
        // A fresh device reads zeros, in runs and pages.
        dev.read(0, &mut buf[..128 * PAGE_SIZE]).unwrap();
        verify(&buf[..128 * PAGE_SIZE], 0, &model);
        for slot in 128..slots {
            dev.read(slot, &mut buf[..PAGE_SIZE]).unwrap();
            verify(&buf[..PAGE_SIZE], slot, &model);
        }
        let mut written = 0;
        let mut gen = 0;
        // Single pages.
        for slot in (1..300).step_by(3) {
            gen += 1;
            fill(&mut buf[..PAGE_SIZE], slot, gen);
            dev.write(slot, &buf[..PAGE_SIZE]).unwrap();
            model[slot as usize] = Some(gen);
            written += 1;
        }
        // Runs, some over pages written above, one ending at the last slot.
        for (first, n) in [(300, 16), (400, 129), (590, 10), (2, 7), (150, 2), (440, 3)] {
            gen += 1;
            let n = n.min(130) as usize;
            let first = first.min(slots - n as u64);
            fill(&mut buf[..n * PAGE_SIZE], first, gen);
            dev.write(first, &buf[..n * PAGE_SIZE]).unwrap();
            for s in first..first + n as u64 {
                model[s as usize] = Some(gen);
            }
            written += n as u64;
        }
        assert_eq!(counter(reg, "io_write_pages"), written);
        // Everything back, page by page and in runs crossing written and
        // unwritten slots.
        for slot in 0..slots {
            buf[..PAGE_SIZE].fill(0xEE);
            dev.read(slot, &mut buf[..PAGE_SIZE]).unwrap();
            verify(&buf[..PAGE_SIZE], slot, &model);
        }
        let mut first = 0;
        while first < slots {
            let n = (slots - first).min(97) as usize;
            dev.read(first, &mut buf[..n * PAGE_SIZE]).unwrap();
            verify(&buf[..n * PAGE_SIZE], first, &model);
            first += n as u64;
        }
        assert_eq!(
            counter(reg, "io_write_errors") + counter(reg, "io_read_errors"),
            0
        );
        assert!(counter(reg, "io_read_pages") >= 2 * slots);
        model
    }

    #[test]
    fn ram_round_trip() {
        let reg = Registry::new();
        let dev = IoDevice::ram(640, &reg).unwrap();
        assert_eq!(dev.kind(), BackendKind::Ram);
        assert_eq!(dev.slots(), 640);
        assert!(dev.extent_map().is_none());
        round_trip(&dev, &reg);
    }

    #[test]
    fn file_round_trip_direct() {
        let dir = tempfile::tempdir().unwrap();
        for kind in [ExtentMapKind::Tree, ExtentMapKind::List] {
            let reg = Registry::new();
            let path = dir.path().join(format!("swap-{kind:?}"));
            let dev = IoDevice::file(&FileOptions::new(&path, 640).extent_kind(kind), &reg).unwrap();
            assert_eq!(dev.kind(), BackendKind::File);
            assert_eq!(dev.slots(), 640);
            let map = dev.extent_map().unwrap();
            assert_eq!((map.kind(), map.len(), map.slots()), (kind, 1, 640));
            let model = round_trip(&dev, &reg);
            // The file has the data too, where the slots say.
            drop(dev);
            let bytes = std::fs::read(&path).unwrap();
            assert_eq!(bytes.len(), 640 * PAGE_SIZE);
            verify(&bytes, 0, &model);
        }
    }

    #[test]
    fn zero_slots_refused() {
        let reg = Registry::new();
        assert!(matches!(IoDevice::ram(0, &reg), Err(IoError::ZeroSize)));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("swap");
        let e = IoDevice::file(&FileOptions::new(&path, 0), &reg).unwrap_err();
        assert!(matches!(e, IoError::ZeroSize), "{e}");
        assert!(!path.exists());
    }

    #[test]
    fn created_file_is_private_and_preallocated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("swap");
        let reg = Registry::new();
        let dev = IoDevice::file(&FileOptions::new(&path, 1000), &reg).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o600);
        assert_eq!(meta.len(), 1000 * PAGE);
        assert!(
            meta.blocks() * 512 >= 1000 * PAGE,
            "{} blocks: not preallocated",
            meta.blocks()
        );
        // Preallocated blocks are whole extents FIEMAP accepts.
        drop(dev);
        let dev = IoDevice::file(&FileOptions::new(&path, 1000).fiemap(true), &reg).unwrap();
        assert!(dev.extent_map().unwrap().slots() >= 1000);
        // A file in a directory that does not exist cannot be created.
        let bad = dir.path().join("no/such/dir/swap");
        let e = IoDevice::file(&FileOptions::new(&bad, 10), &reg).unwrap_err();
        assert!(matches!(e, IoError::Open { .. } | IoError::Create { .. }), "{e}");
        assert!(e.to_string().contains(&*bad.to_string_lossy()), "{e}");
    }

    #[test]
    fn existing_file_too_small() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("swap");
        std::fs::write(&path, vec![7u8; 10 * PAGE_SIZE]).unwrap();
        let reg = Registry::new();
        let e = IoDevice::file(&FileOptions::new(&path, 11), &reg).unwrap_err();
        assert!(
            matches!(e, IoError::TooSmall { have, need, .. } if have == 10 * PAGE && need == 11 * PAGE),
            "{e}"
        );
        let msg = e.to_string();
        for want in [
            &*path.to_string_lossy(),
            &(10 * PAGE).to_string(),
            &(11 * PAGE).to_string(),
            "fallocate",
        ] {
            assert!(msg.contains(want), "{msg} lacks {want}");
        }
        // Left alone.
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 10 * PAGE);
        // Neither a directory nor a character device will do.
        let e = IoDevice::file(&FileOptions::new(dir.path(), 1), &reg).unwrap_err();
        assert!(
            matches!(e, IoError::Extent(ExtentError::IsDirectory { .. })),
            "{e}"
        );
        let e = IoDevice::file(&FileOptions::new("/dev/null", 1), &reg).unwrap_err();
        assert!(
            matches!(e, IoError::Extent(ExtentError::NotSwappable { .. })),
            "{e}"
        );
    }

    #[test]
    fn existing_file_used_as_is() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("swap");
        std::fs::write(&path, vec![0xA5u8; 20 * PAGE_SIZE]).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let reg = Registry::new();
        let dev = IoDevice::file(&FileOptions::new(&path, 10), &reg).unwrap();
        assert_eq!(dev.slots(), 10);
        // Its contents are the slots' contents.
        let mut buf = AlignedBuf::new(10);
        dev.read(0, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0xA5));
        fill(&mut buf[..PAGE_SIZE], 9, 1);
        dev.write(9, &buf[..PAGE_SIZE]).unwrap();
        drop(dev);
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.len(), 20 * PAGE, "truncated");
        assert_eq!(meta.mode() & 0o777, 0o640, "chmodded");
        let bytes = std::fs::read(&path).unwrap();
        assert!(bytes[..9 * PAGE_SIZE].iter().all(|&b| b == 0xA5));
        assert_eq!(&bytes[9 * PAGE_SIZE..10 * PAGE_SIZE], &buf[..PAGE_SIZE]);
        assert!(bytes[10 * PAGE_SIZE..].iter().all(|&b| b == 0xA5));
    }

    #[test]
    fn fiemap_fragmented_runs_span_extents() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        // Grow two files in alternate 4 KiB chunks, syncing each, so the
        // filesystem interleaves their blocks.
        const CHUNKS: u64 = 512;
        {
            let mut fa = File::create(&a).unwrap();
            let mut fb = File::create(&b).unwrap();
            let chunk = vec![0u8; PAGE_SIZE];
            for _ in 0..CHUNKS {
                for f in [&mut fa, &mut fb] {
                    f.write_all(&chunk).unwrap();
                    f.sync_all().unwrap();
                }
            }
        }
        for kind in [ExtentMapKind::Tree, ExtentMapKind::List] {
            let reg = Registry::new();
            let opts = FileOptions::new(&a, CHUNKS).fiemap(true).extent_kind(kind);
            let dev = match IoDevice::file(&opts, &reg) {
                Ok(dev) => dev,
                Err(e @ IoError::Extent(ExtentError::FiemapUnsupported { .. })) => {
                    eprintln!("FIEMAP unsupported here: {e}");
                    return;
                }
                Err(e) => panic!("{e}"),
            };
            let map = dev.extent_map().unwrap();
            assert_eq!(map.slots(), CHUNKS);
            let boundaries: Vec<u64> = map.extents().map(|e| e.start_slot).filter(|&s| s > 0).collect();
            eprintln!("{kind:?}: fragmented file maps to {} extents", map.len());
            let mut model = vec![None; CHUNKS as usize];
            let mut buf = AlignedBuf::new(64);
            let mut gen = 0;
            // Runs across every boundary (capped), and long runs across many.
            let mut runs: Vec<(u64, u64)> = boundaries
                .iter()
                .take(200)
                .map(|&s| (s.saturating_sub(2), 5))
                .collect();
            runs.extend([(0, 64), (100, 64), (CHUNKS - 64, 64), (33, 17)]);
            for (first, n) in runs {
                let n = n.min(CHUNKS - first);
                gen += 1;
                let bytes = n as usize * PAGE_SIZE;
                fill(&mut buf[..bytes], first, gen);
                dev.write(first, &buf[..bytes]).unwrap();
                for s in first..first + n {
                    model[s as usize] = Some(gen);
                }
            }
            // Model says zeros for slots never written: the file is zeros.
            let mut first = 0;
            while first < CHUNKS {
                let n = (CHUNKS - first).min(61);
                let bytes = n as usize * PAGE_SIZE;
                dev.read(first, &mut buf[..bytes]).unwrap();
                verify(&buf[..bytes], first, &model);
                first += n;
            }
            // And the file holds them at their logical offsets.
            drop(dev);
            let bytes = std::fs::read(&a).unwrap();
            verify(&bytes, 0, &model);
        }
    }

    /// Two backings: runs crossing from one to the other are split and land
    /// in the right file at the right place.
    #[test]
    fn runs_split_across_backings() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        std::fs::write(&a, vec![0u8; 5 * PAGE_SIZE]).unwrap();
        std::fs::write(&b, vec![0u8; 9 * PAGE_SIZE]).unwrap();
        let reg = Registry::new();
        let backings = vec![
            (a.clone(), open_existing(&a, true).unwrap()),
            (b.clone(), open_existing(&b, true).unwrap()),
        ];
        // Slots 0..5 are a's pages, 5..14 b's.
        let sources = [
            ExtentSource::Whole {
                path: a.clone(),
                len: None,
            },
            ExtentSource::Whole {
                path: b.clone(),
                len: None,
            },
        ];
        let dev = IoDevice::from_backings(14, backings, &sources, ExtentMapKind::Tree, &reg).unwrap();
        assert_eq!(dev.extent_map().unwrap().len(), 2);
        let mut model = vec![None; 14];
        let mut buf = AlignedBuf::new(14);
        fill(&mut buf[..14 * PAGE_SIZE], 0, 1);
        dev.write(0, &buf).unwrap();
        model.iter_mut().for_each(|m| *m = Some(1));
        fill(&mut buf[..4 * PAGE_SIZE], 3, 2);
        dev.write(3, &buf[..4 * PAGE_SIZE]).unwrap();
        model[3..7].iter_mut().for_each(|m| *m = Some(2));
        dev.read(0, &mut buf).unwrap();
        verify(&buf, 0, &model);
        dev.read(4, &mut buf[..2 * PAGE_SIZE]).unwrap();
        verify(&buf[..2 * PAGE_SIZE], 4, &model);
        drop(dev);
        let fa = std::fs::read(&a).unwrap();
        let fb = std::fs::read(&b).unwrap();
        verify(&fa, 0, &model[..5]);
        // b's page i is slot 5 + i.
        let mut expect_b = vec![None; 5];
        expect_b.extend_from_slice(&model[5..]);
        let mut b_as_slots = vec![0u8; 5 * PAGE_SIZE];
        b_as_slots.extend_from_slice(&fb);
        verify(&b_as_slots[5 * PAGE_SIZE..], 5, &expect_b);
    }

    #[test]
    fn unaligned_buffers_and_ranges() {
        let dir = tempfile::tempdir().unwrap();
        let reg = Registry::new();
        let file = IoDevice::file(&FileOptions::new(dir.path().join("swap"), 16), &reg).unwrap();
        let buffered = IoDevice::file(
            &FileOptions::new(dir.path().join("swap2"), 16).direct(false),
            &reg,
        )
        .unwrap();
        let ram = IoDevice::ram(16, &reg).unwrap();
        let mut buf = AlignedBuf::new(3);
        for dev in [&file, &buffered] {
            // Misaligned address.
            let e = dev.write(1, &buf[8..8 + PAGE_SIZE]).unwrap_err();
            assert!(matches!(e, IoError::Unaligned { .. }), "{e}");
            assert!(e.to_string().contains("aligned"), "{e}");
            let e = dev.read(1, &mut buf[512..512 + PAGE_SIZE]).unwrap_err();
            assert!(matches!(e, IoError::Unaligned { .. }), "{e}");
        }
        for dev in [&file, &buffered, &ram] {
            // Lengths that are not whole pages, or nothing.
            for len in [0, 100, PAGE_SIZE + 512] {
                let e = dev.write(1, &buf[..len]).unwrap_err();
                assert!(matches!(e, IoError::Unaligned { .. }), "{e}");
                let e = dev.read(1, &mut buf[..len]).unwrap_err();
                assert!(matches!(e, IoError::Unaligned { .. }), "{e}");
            }
            // Past the end, including offsets that overflow.
            let e = dev.write(15, &buf[..2 * PAGE_SIZE]).unwrap_err();
            assert!(
                matches!(
                    e,
                    IoError::Range {
                        offset: 15,
                        pages: 2,
                        slots: 16
                    }
                ),
                "{e}"
            );
            assert!(e.to_string().contains("16 slots"), "{e}");
            let e = dev.read(16, &mut buf[..PAGE_SIZE]).unwrap_err();
            assert!(matches!(e, IoError::Range { .. }), "{e}");
            let e = dev.read(u64::MAX, &mut buf[..PAGE_SIZE]).unwrap_err();
            assert!(matches!(e, IoError::Range { .. }), "{e}");
            // The last slot is fine.
            dev.write(15, &buf[..PAGE_SIZE]).unwrap();
        }
        assert_eq!(
            counter(&reg, "io_write_errors") + counter(&reg, "io_read_errors"),
            0
        );
        // RAM takes any buffer.
        let mut v = vec![0u8; 2 * PAGE_SIZE + 3];
        fill(&mut v[3..], 4, 9);
        ram.write(4, &v[3..]).unwrap();
        let mut back = vec![0u8; 2 * PAGE_SIZE + 5];
        ram.read(4, &mut back[5..]).unwrap();
        let mut model = vec![None; 16];
        model[4] = Some(9);
        model[5] = Some(9);
        verify(&back[5..], 4, &model);
    }

    /// In `dir`, on a filesystem that refuses O_DIRECT: the error says so
    /// and what to do, a file the call created is removed, an existing one
    /// left alone, and buffered IO works.
    fn check_direct_unsupported(dir: &Path) {
        let reg = Registry::new();
        let path = dir.join("swap");
        let e = IoDevice::file(&FileOptions::new(&path, 64), &reg).unwrap_err();
        assert!(matches!(e, IoError::DirectUnsupported { .. }), "{e}");
        let msg = e.to_string();
        for want in [
            &*path.to_string_lossy(),
            "does not support O_DIRECT",
            "direct(false)",
        ] {
            assert!(msg.contains(want), "{msg} lacks {want}");
        }
        assert!(!path.exists(), "the file this call created is left behind");
        std::fs::write(&path, vec![1u8; 64 * PAGE_SIZE]).unwrap();
        let e = IoDevice::file(&FileOptions::new(&path, 64), &reg).unwrap_err();
        assert!(matches!(e, IoError::DirectUnsupported { .. }), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), vec![1u8; 64 * PAGE_SIZE]);
        std::fs::remove_file(&path).unwrap();
        let dev = IoDevice::file(&FileOptions::new(&path, 640).direct(false), &reg).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        round_trip(&dev, &reg);
    }

    /// tmpfs refused O_DIRECT until Linux 6.6 and accepts it since; either
    /// way the device must do what the kernel allows and say why not.
    #[test]
    fn direct_on_tmpfs_follows_the_kernel() {
        let Some(dir) = crate::extent::tests::tmpfs_tempdir() else {
            return;
        };
        let probe = dir.path().join("probe");
        std::fs::write(&probe, b"").unwrap();
        match open_options(true).open(&probe) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                eprintln!("tmpfs refuses O_DIRECT here");
                check_direct_unsupported(dir.path());
            }
            Err(e) => panic!("{e}"),
            Ok(_) => {
                eprintln!("tmpfs accepts O_DIRECT here (Linux >= 6.6)");
                let reg = Registry::new();
                let dev = IoDevice::file(&FileOptions::new(dir.path().join("swap"), 640), &reg).unwrap();
                round_trip(&dev, &reg);
                let reg = Registry::new();
                let opts = FileOptions::new(dir.path().join("swap2"), 640).direct(false);
                round_trip(&IoDevice::file(&opts, &reg).unwrap(), &reg);
            }
        }
    }

    /// ramfs has never supported O_DIRECT (and creates the file before
    /// refusing the open).  Mount one where only a helper thread sees it:
    /// the thread unshares its mount namespace, makes every mount in it
    /// private so nothing propagates back, and mounts ramfs over a
    /// temporary directory; the namespace dies with the thread.  Needs
    /// CAP_SYS_ADMIN; skipped without.
    #[test]
    fn direct_unsupported_on_ramfs() {
        use std::ffi::CString;
        let dir = tempfile::tempdir().unwrap();
        let target = CString::new(dir.path().as_os_str().as_encoded_bytes()).unwrap();
        let dir_path = dir.path().to_path_buf();
        std::thread::spawn(move || {
            // SAFETY: unshare has no memory-safety preconditions; it gives
            // this thread (only) its own fs_struct and mount namespace.
            if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
                eprintln!(
                    "cannot unshare the mount namespace ({}); skipping",
                    io::Error::last_os_error()
                );
                return;
            }
            // SAFETY: the strings are NUL-terminated and outlive the calls;
            // null source, type and data are allowed for MS_PRIVATE.
            let rc = unsafe {
                libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                )
            };
            assert_eq!(rc, 0, "make mounts private: {}", io::Error::last_os_error());
            // SAFETY: as above; ramfs takes no data.
            let rc = unsafe {
                libc::mount(
                    c"uswap-test".as_ptr(),
                    target.as_ptr(),
                    c"ramfs".as_ptr(),
                    0,
                    std::ptr::null(),
                )
            };
            if rc != 0 {
                eprintln!("cannot mount ramfs ({}); skipping", io::Error::last_os_error());
                return;
            }
            check_direct_unsupported(&dir_path);
            // SAFETY: as above.
            unsafe { libc::umount2(target.as_ptr(), 0) };
        })
        .join()
        .unwrap();
    }

    fn injected_errors(dev: &IoDevice, reg: &Registry) {
        use std::error::Error as _;
        let mut buf = AlignedBuf::new(4);
        fill(&mut buf[..PAGE_SIZE], 5, 1);
        dev.write(5, &buf[..PAGE_SIZE]).unwrap();
        let pages_before = counter(reg, "io_write_pages");
        // A write covering the armed slot fails, naming it.
        dev.inject_error(7, IoOp::Write);
        // One not covering it does not, and leaves it armed.
        dev.write(8, &buf[..PAGE_SIZE]).unwrap();
        dev.read(6, &mut buf[..2 * PAGE_SIZE]).unwrap();
        fill(&mut buf[..3 * PAGE_SIZE], 6, 2);
        let e = dev.write(6, &buf[..3 * PAGE_SIZE]).unwrap_err();
        assert!(matches!(e, IoError::Write { offset: 7, .. }), "{e}");
        assert!(e.to_string().contains("slot 7"), "{e}");
        assert_eq!(
            e.source()
                .and_then(|s| s.downcast_ref::<io::Error>())
                .and_then(|s| s.raw_os_error()),
            Some(libc::EIO)
        );
        assert_eq!(counter(reg, "io_write_errors"), 1);
        assert_eq!(counter(reg, "io_write_pages"), pages_before + 1);
        // One-shot: the same write now succeeds.
        dev.write(6, &buf[..3 * PAGE_SIZE]).unwrap();
        assert_eq!(counter(reg, "io_write_errors"), 1);
        assert_eq!(counter(reg, "io_write_pages"), pages_before + 4);

        let reads_before = counter(reg, "io_read_pages");
        dev.inject_error(5, IoOp::Read);
        dev.write(5, &buf[..PAGE_SIZE]).unwrap(); // writes are not armed
        let e = dev.read(5, &mut buf[..PAGE_SIZE]).unwrap_err();
        assert!(matches!(e, IoError::Read { offset: 5, .. }), "{e}");
        assert!(e.to_string().contains("slot 5"), "{e}");
        assert_eq!(counter(reg, "io_read_errors"), 1);
        assert_eq!(counter(reg, "io_read_pages"), reads_before);
        // The read after succeeds.  Slot 5 holds what was last written
        // there: buf's first page, filled for slot 6 (generation 2).
        let mut expect = AlignedBuf::new(1);
        fill(&mut expect, 6, 2);
        dev.read(5, &mut buf[..PAGE_SIZE]).unwrap();
        assert_eq!(&buf[..PAGE_SIZE], &expect[..]);
        let mut model = vec![None; dev.slots() as usize];
        model[6] = Some(2);
        model[7] = Some(2);
        model[8] = Some(2);
        dev.read(6, &mut buf[..3 * PAGE_SIZE]).unwrap();
        verify(&buf[..3 * PAGE_SIZE], 6, &model);
        assert_eq!(counter(reg, "io_read_errors"), 1);
        assert_eq!(counter(reg, "io_read_pages"), reads_before + 4);
    }

    #[test]
    fn inject_error_is_one_shot_and_counted() {
        let reg = Registry::new();
        injected_errors(&IoDevice::ram(32, &reg).unwrap(), &reg);
        let dir = tempfile::tempdir().unwrap();
        let reg = Registry::new();
        injected_errors(
            &IoDevice::file(&FileOptions::new(dir.path().join("swap"), 32), &reg).unwrap(),
            &reg,
        );
    }

    /// 8 threads, each owning 256 slots, write, read back and verify 5,000
    /// pages each, in single pages and runs of 4.
    fn concurrent(dev: &IoDevice, reg: &Registry) {
        const THREADS: u64 = 8;
        const OWN: u64 = 256;
        const OPS: u64 = 5_000;
        assert!(dev.slots() > THREADS * OWN);
        std::thread::scope(|s| {
            for t in 0..THREADS {
                s.spawn(move || {
                    let base = 1 + t * OWN;
                    let mut model = vec![None; dev.slots() as usize];
                    let mut buf = AlignedBuf::new(4);
                    let mut x = 0x2545_F491_4F6C_DD1Du64 ^ (t + 1);
                    let mut pages = 0;
                    let mut gen = 0;
                    while pages < OPS {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let n = if x % 5 == 0 { 4 } else { 1 };
                        let first = base + (x >> 8) % (OWN - n + 1);
                        let bytes = n as usize * PAGE_SIZE;
                        gen += 1;
                        fill(&mut buf[..bytes], first, gen);
                        dev.write(first, &buf[..bytes]).unwrap();
                        for s in first..first + n {
                            model[s as usize] = Some(gen);
                        }
                        // Read back this run and one other owned slot.
                        buf[..bytes].fill(0);
                        dev.read(first, &mut buf[..bytes]).unwrap();
                        verify(&buf[..bytes], first, &model);
                        let other = base + (x >> 24) % OWN;
                        dev.read(other, &mut buf[..PAGE_SIZE]).unwrap();
                        verify(&buf[..PAGE_SIZE], other, &model);
                        pages += n;
                    }
                    for slot in base..base + OWN {
                        dev.read(slot, &mut buf[..PAGE_SIZE]).unwrap();
                        verify(&buf[..PAGE_SIZE], slot, &model);
                    }
                });
            }
        });
        assert!(counter(reg, "io_write_pages") >= THREADS * OPS);
        assert_eq!(
            counter(reg, "io_write_errors") + counter(reg, "io_read_errors"),
            0
        );
    }

    #[test]
    fn concurrent_disjoint_slots_ram() {
        let reg = Registry::new();
        concurrent(&IoDevice::ram(2049, &reg).unwrap(), &reg);
    }

    #[test]
    fn concurrent_disjoint_slots_file() {
        let dir = tempfile::tempdir().unwrap();
        let reg = Registry::new();
        concurrent(
            &IoDevice::file(&FileOptions::new(dir.path().join("swap"), 2049), &reg).unwrap(),
            &reg,
        );
    }

    #[test]
    fn device_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<IoDevice>();
        let reg = Registry::new();
        let dev = IoDevice::ram(4, &reg).unwrap();
        assert!(format!("{dev:?}").contains("Ram"));
    }
}
