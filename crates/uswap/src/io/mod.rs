//! The IO backend of one swap device: store and fetch page contents by slot.
//!
//! `ram.rs` and `file.rs` are the two stores ([`PageStore`]s) there are;
//! `backing.rs` opens and maps the files and block devices a file device
//! lives on.
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
//! worse: RAM stores copy with `rep movsb` in inline assembly on x86-64
//! (relaxed atomic words elsewhere) rather than a Rust `memcpy`, so a
//! racing caller is a logic error, never undefined behaviour; a cold
//! page moves in about 0.5 µs, against a fault's ~15 µs (`ram.rs`).
//!
//! [`IoDevice::read`] and [`IoDevice::write`] never allocate, on success or
//! failure, so the fault path can call them.

mod backing;
pub mod codec;
mod compressed;
mod crypt;
mod file;
mod ram;
mod uring;
mod zpool;

use crate::stats::CounterId;
use std::io;
use std::path::PathBuf;
#[cfg(test)]
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::extent::{ExtentError, ExtentMap, ExtentMapKind};
use crate::stats::{Counter, Registry};
use crate::PAGE_SIZE;
pub use backing::{from_sources, BackingInfo, ExtentSource};
use backing::{Access, Backing};
pub use codec::{Codec, CodecError};
pub use compressed::CompressedOptions;
use compressed::CompressedStore;
use file::FileStore;
use ram::RamStore;
pub use uring::{WriteJob, WriteRing};

const PAGE: u64 = PAGE_SIZE as u64;

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
    #[error("{}: is {have} bytes but {need} bytes are needed; grow it (`fallocate -l {need} {}` keeps its mode), ask for fewer slots, or give a path that does not exist yet to have it created, private", .path.display(), .path.display())]
    TooSmall { path: PathBuf, have: u64, need: u64 },
    /// The path is a symbolic link.
    #[error("{}: is a symbolic link; a swap file is opened only by its own path (a link planted in a shared directory would send this process's memory elsewhere): give the file's real path", .path.display())]
    Symlink { path: PathBuf },
    /// A regular file owned by another user.
    #[error("{}: is owned by uid {owner}, not by this user (uid {me}): its owner could read the memory swapped to it; give a file of your own, or a path that does not exist yet", .path.display())]
    NotOwner { path: PathBuf, owner: u32, me: u32 },
    /// A regular file that others may read or write.
    #[error("{}: has mode {mode:04o}, so other users can read the memory swapped to it (or write into it); run `chmod 600 {}`", .path.display(), .path.display())]
    OpenToOthers { path: PathBuf, mode: u32 },
    /// Another swap device (here or in another process) or a mount holds it.
    #[error("{}: is in use (by another swap device of this or another process, a mount, or kernel swap): two users of one swap file would share its slots; give each device its own file or device", .path.display())]
    InUse { path: PathBuf },
    /// An existing file with holes.
    #[error("{}: is sparse ({allocated} of the {need} bytes needed are allocated), so a swap-out could fail when the filesystem fills; allocate it: `fallocate -l {need} {}`", .path.display(), .path.display())]
    Sparse {
        path: PathBuf,
        allocated: u64,
        need: u64,
    },
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
    /// A page read from an encrypted file device failed its check: the
    /// block on disk is not the one written to that slot last.
    #[error("{}", IntegrityMessage { offset: *.offset, sealed: *.sealed })]
    Integrity { offset: u64, sealed: bool },
    /// Memory a device needs (a RAM device's pages, a compressed store,
    /// an encrypted file's key and bounce buffers) could not be mapped.
    #[error("cannot map the memory of {what}: {source}; ask for fewer slots or raise the memory limits (ulimit -v)")]
    Mmap {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    /// A device of zero slots was asked for.
    #[error("a swap device needs at least one slot; ask for one or more")]
    ZeroSize,
    /// A compressed device's codec could not be set up.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// A compressed device's slot tables could not be allocated.
    #[error(transparent)]
    Metadata(#[from] crate::table::TableError),
}

/// [`IoError::Integrity`]'s message, written without allocating: it is
/// printed from the fault path.
struct IntegrityMessage {
    offset: u64,
    sealed: bool,
}

impl std::fmt::Display for IntegrityMessage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let offset = self.offset;
        if self.sealed {
            write!(f, "swap slot {offset} failed its authentication check: the block on disk is not the one uswap wrote there (changed, copied from another slot, an older copy put back, or corrupted by the disk); the page is lost, never read as wrong data")
        } else {
            write!(f, "swap slot {offset} was read but holds no page (freed or never written, its seal forgotten): the page is lost; this is a bug in uswap, please report it")
        }
    }
}

impl IoError {
    /// The errno of a failed read or write (`EBADMSG` for a page that
    /// failed its authentication check).
    pub fn errno(&self) -> Option<i32> {
        match self {
            IoError::Integrity { .. } => Some(libc::EBADMSG),
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
    ///
    /// A write that stopped short with no error from the kernel (a short
    /// or empty transfer: `WriteZero`, no errno) is transient too: nothing
    /// says the block is bad, and retiring a slot for it would print
    /// "errno 0" for a slot that works.
    pub fn is_transient(&self) -> bool {
        if let IoError::Write { source, .. } = self {
            if source.raw_os_error().is_none() {
                return true;
            }
        }
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
    encrypt: bool,
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
            encrypt: true,
        }
    }

    /// The path of the file or block device.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// The same options for another path.
    pub fn with_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.path = path.into();
        self
    }

    /// The device's slots.
    pub fn slots(&self) -> u64 {
        self.slots
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

    /// Encrypt and authenticate every page written (the default, `true`):
    /// AES-256-GCM under a random key held only in this process's memory,
    /// a fresh nonce per write, the slot bound in, so a block changed,
    /// moved or replayed on disk fails its check and its page is
    /// poisoned rather than read wrong (`io/crypt.rs`).  `false` writes
    /// plaintext: the ablation that measures what encryption costs, or a
    /// file on storage that is already encrypted and trusted.
    pub fn encrypt(mut self, on: bool) -> Self {
        self.encrypt = on;
        self
    }

    /// Whether pages are encrypted ([`FileOptions::encrypt`]).
    pub fn encrypts(&self) -> bool {
        self.encrypt
    }
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
    /// The map from slot to backing, for a store that has one.
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
    /// The owner freed slots `offset..offset + pages`: a store that keeps
    /// memory per slot lets it go (zram's `swap_slot_free_notify`), an
    /// encrypted one forgets their seals.
    fn discard(&self, _offset: u64, _pages: u64) {}
    /// Whether [`PageStore::discard`] does anything: the pager looks up a
    /// slot's use count before it discards, work spared where there is
    /// nothing to let go (RAM, a plaintext file).
    fn discards(&self) -> bool {
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
    store: Box<dyn PageStore>,
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
    /// A RAM device of `slots` pages: an anonymous private mapping of
    /// `slots * 4096` bytes with `MAP_NORESERVE` (pages are only allocated
    /// when first written), inherited by a forked child as its own copy,
    /// unmapped on drop.  Unwritten slots read as zeros.
    pub fn ram(slots: u64, registry: &Registry) -> Result<IoDevice, IoError> {
        if slots == 0 {
            return Err(IoError::ZeroSize);
        }
        Ok(Self::with_store(slots, Box::new(RamStore::new(slots)?), registry))
    }

    /// A compressed device (see [`CompressedOptions`]): pages compressed
    /// into a packed store in memory, with an optional file behind it.
    pub fn compressed(opts: &CompressedOptions, registry: &Registry) -> Result<IoDevice, IoError> {
        let store = CompressedStore::new(opts, registry)?;
        Ok(Self::with_store(opts.slots(), Box::new(store), registry))
    }

    /// A file device of `opts.slots` pages at `opts.path`.
    ///
    /// A path that does not exist, or a directory, gets a private file:
    /// unnamed (`O_TMPFILE`) in that directory, mode 0600, preallocated,
    /// gone with the process however it ends (see `file::create_private`);
    /// a directory cannot be blocked by a file another user put under the
    /// name one would pick (`uswap run`'s default is its `$TMPDIR`).  An
    /// existing path (a block device, or a file the user keeps and
    /// preallocated) must be this process's alone (`backing.rs`), a
    /// regular file or block device of at least `slots * 4096` bytes, and
    /// is used as is: never truncated, never chmodded.  The
    /// extent map is then built through [`from_sources`]'s machinery (one whole
    /// extent, or the file's FIEMAP extents) and every IO translated
    /// through it.
    ///
    /// With `O_DIRECT` (the default) on a filesystem that refuses it,
    /// [`IoError::DirectUnsupported`]; a file this call created has no
    /// name to remove.
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
        // Not following a link: a dangling one is an existing path, which
        // `open_file` refuses, not a name to create a file through.
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.is_dir() => {
                // A directory: a file of our own in it, with no name.
                let backing = file::create_private(&path.join("uswap.swap"), need, opts.direct)?;
                Self::map_file(opts, need, backing, registry)
            }
            Ok(_) => Self::open_file(opts, need, registry),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let backing = file::create_private(path, need, opts.direct)?;
                Self::map_file(opts, need, backing, registry)
            }
            Err(e) => Err(IoError::Open {
                path: path.clone(),
                source: e,
            }),
        }
    }

    /// [`IoDevice::file`] once the file exists: opened once, checked, and
    /// mapped.
    fn open_file(opts: &FileOptions, need: u64, registry: &Registry) -> Result<IoDevice, IoError> {
        let path = &opts.path;
        let backing = Backing::open(path, Access::ReadWrite { direct: opts.direct })?;
        if backing.size < need {
            return Err(IoError::TooSmall {
                path: path.clone(),
                have: backing.size,
                need,
            });
        }
        if !backing.block_device {
            use std::os::unix::fs::MetadataExt;
            let allocated = backing
                .file
                .metadata()
                .map_err(|source| IoError::Open {
                    path: path.clone(),
                    source,
                })?
                .blocks()
                * 512;
            if allocated < need {
                return Err(IoError::Sparse {
                    path: path.clone(),
                    allocated,
                    need,
                });
            }
        }
        Self::map_file(opts, need, backing, registry)
    }

    /// A file device over the one open backing of `opts`: one whole
    /// extent of `need` bytes, or the file's FIEMAP extents.
    fn map_file(
        opts: &FileOptions,
        need: u64,
        backing: Backing,
        registry: &Registry,
    ) -> Result<IoDevice, IoError> {
        let path = opts.path.clone();
        let source = if opts.fiemap {
            ExtentSource::Fiemap { path }
        } else {
            ExtentSource::Whole {
                path,
                len: Some(need),
            }
        };
        Self::from_backings(
            opts.slots,
            vec![backing],
            &[source],
            opts.extent_kind,
            opts.encrypt,
            registry,
        )
    }

    /// A file device over open backings, slot `i` of `sources` backed by
    /// `backings[i]`.  A FIEMAP map covers the whole file, which may be
    /// more than `slots`; only `0..slots` is used.  Sealed (`crypt.rs`)
    /// when `encrypt`.
    fn from_backings(
        slots: u64,
        backings: Vec<Backing>,
        sources: &[ExtentSource],
        kind: ExtentMapKind,
        encrypt: bool,
        registry: &Registry,
    ) -> Result<IoDevice, IoError> {
        let (map, _infos) = backing::map_backings(kind, sources, &backings)?;
        if map.slots() < slots {
            // Whole sources were sized to fit; a FIEMAP map is the file's
            // whole size, checked above, so this is a file that shrank.
            return Err(IoError::TooSmall {
                path: backings[0].path.clone(),
                have: map.slots() * PAGE,
                need: slots * PAGE,
            });
        }
        let sealer = if encrypt {
            Some(crypt::Sealer::new(slots)?)
        } else {
            None
        };
        let (paths, files) = backings.into_iter().map(|b| (b.path, b.file)).unzip();
        Ok(Self::with_store(
            slots,
            Box::new(FileStore::new(paths, files, map, sealer)),
            registry,
        ))
    }

    fn with_store(slots: u64, store: Box<dyn PageStore>, registry: &Registry) -> IoDevice {
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
            write_errors: registry.counter(CounterId::IO_WRITE_ERRORS),
            read_errors: registry.counter(CounterId::IO_READ_ERRORS),
        }
    }

    /// Where the pages live.
    pub fn kind(&self) -> BackendKind {
        self.store.kind()
    }

    /// Pages of memory a RAM device holds (0 for any other device).
    pub fn ram_pages(&self) -> u64 {
        self.store.ram_pages()
    }

    /// Number of slots: `0..slots()` may be read and written.
    pub fn slots(&self) -> u64 {
        self.slots
    }

    /// Whether some pages may be in a file (see [`PageStore::has_file`]).
    pub fn has_file(&self) -> bool {
        self.store.has_file()
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
    pub fn discard(&self, offset: u64, pages: u64) {
        self.store.discard(offset, pages)
    }

    /// Whether [`IoDevice::discard`] does anything on this device.
    pub fn discards(&self) -> bool {
        self.store.discards()
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
    fn begin_write(&self, offset: u64, buf: &[u8]) -> Result<u64, IoError> {
        let pages = self.check(offset, buf.len(), buf.as_ptr() as usize)?;
        #[cfg(test)]
        if let Some((offset, source)) = self.injected(IoOp::Write, offset, pages) {
            return Err(IoError::Write { offset, source });
        }
        Ok(pages)
    }

    /// Count a write of `pages` that worked.
    fn wrote(&self, pages: u64) {
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

pub(crate) use crate::sys::monotonic_ns;

#[cfg(test)]
mod tests;
