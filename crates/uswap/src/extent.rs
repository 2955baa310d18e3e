//! Swap extents: swap offset -> (backing, byte offset).
//!
//! A swap device is a run of page-sized slots, but what backs it need not be
//! one contiguous thing: the device may be assembled from several backing
//! files or block devices, and a swap file on a filesystem is wherever the
//! filesystem put its blocks.  Like the kernel's `struct swap_extent`, each
//! [`Extent`] maps a run of consecutive slots to a contiguous run of bytes on
//! one backing, and every read or write of a slot first translates the slot
//! through the map ([`ExtentMap::lookup`], the kernel's `map_swap_entry()`).
//!
//! How that translation finds the extent is seed 004's point.  Before it the
//! kernel kept the extents on a linked list and walked it from a one-entry
//! cache, `sis->curr_swap_extent`, which the walk updated at every step.  One
//! task swapping out sequentially hits that cache almost every time, but
//! several tasks working in different parts of the device keep moving the
//! shared cursor away from each other, so each lookup walks half the list and
//! writes a cache line every other task reads.  With 20K extents that put
//! `map_swap_entry()` at 90% of the CPU.  Seed 004 replaced the list with a
//! balanced tree keyed by the first slot of each extent: O(log n) per lookup
//! and no shared writes.  Both are here, as [`ExtentMapKind::Tree`] (the
//! default) and [`ExtentMapKind::List`] (the behaviour before seed 004), so
//! the difference can be measured (`uswap bench extent`).
//!
//! Maps are built with [`ExtentMapBuilder`], which merges adjacent extents as
//! `add_swap_extent()` does, or from files and devices with [`from_sources`],
//! which can map a regular file by its physical extents (FIEMAP) so that a
//! fragmented swap file yields as many extents as it would in the kernel.
//! uswap always does its IO through the file, never to the raw disk, so the
//! offset an extent maps to is the file's *logical* offset; the physical
//! address is kept alongside only to break extents where the kernel would.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;

use crate::PAGE_SIZE;

const PAGE: u64 = PAGE_SIZE as u64;

/// One run of consecutive slots mapped to a contiguous run of bytes on one
/// backing: the kernel's `struct swap_extent`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// First slot of the run.
    pub start_slot: u64,
    /// Number of slots (pages) in the run, at least 1.
    pub nr_slots: u64,
    /// Which backing holds the run: an index into the caller's backings (for
    /// [`from_sources`], the position of the source).
    pub backing: u32,
    /// Byte offset in the backing of `start_slot`; slot `start_slot + i` is
    /// at `byte_offset + i * PAGE_SIZE`.
    pub byte_offset: u64,
    /// Physical byte address of `byte_offset` on the underlying disk, when
    /// known (FIEMAP).  Only used to keep extents apart where the physical
    /// layout breaks; IO never goes there.
    pub physical: Option<u64>,
}

impl Extent {
    /// The slot after the last slot of this extent.
    pub fn end_slot(&self) -> u64 {
        self.start_slot + self.nr_slots
    }

    /// Translate `slot`, which the caller has checked lies in this extent.
    #[inline]
    fn translate(&self, slot: u64) -> (u32, u64) {
        (self.backing, self.byte_offset + (slot - self.start_slot) * PAGE)
    }

    /// Whether `slot` lies in this extent.
    #[inline]
    fn contains(&self, slot: u64) -> bool {
        slot.wrapping_sub(self.start_slot) < self.nr_slots
    }
}

/// How an [`ExtentMap`] finds the extent of a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ExtentMapKind {
    /// A balanced ordered tree keyed by first slot (seed 004): O(log n)
    /// lookups that write nothing shared.
    #[default]
    Tree,
    /// The behaviour before seed 004: a linear list walked from a one-entry
    /// "current extent" cache shared by every lookup, which the walk moves
    /// at every step.
    List,
}

/// Why an extent map could not be built.  Every message is one line naming
/// the file or device and what to do about it.
#[derive(thiserror::Error, Debug)]
pub enum ExtentError {
    /// The path does not exist.
    #[error("{}: no such file or device; create it first (e.g. `fallocate -l 1G {}`) or fix the path", .path.display(), .path.display())]
    NotFound { path: PathBuf },
    /// The path exists but may not be opened.
    #[error("{}: permission denied; make it readable and writable by this user, or run as one who can", .path.display())]
    PermissionDenied { path: PathBuf },
    /// The path is a directory.
    #[error("{}: is a directory; give a regular file or a block device to swap on", .path.display())]
    IsDirectory { path: PathBuf },
    /// The path is neither a regular file nor a block device (or, for a
    /// FIEMAP source, not a regular file).
    #[error("{}: is {what}; give a regular file or a block device (FIEMAP sources: a regular file)", .path.display())]
    NotSwappable { path: PathBuf, what: &'static str },
    /// Any other IO error on the path.
    #[error("{}: {source}; check the file and the filesystem it is on", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Less than one page would be usable.
    #[error("{}: {len} bytes is less than one {PAGE_SIZE}-byte page; make it at least one page (e.g. `fallocate -l 1G {}`)", .path.display(), .path.display())]
    TooSmall { path: PathBuf, len: u64 },
    /// A regular file has a hole: swapping into it would need the
    /// filesystem to allocate blocks at swap-out time, which the kernel
    /// refuses ("swapfile has holes").
    #[error("{}: file has holes (first at byte offset {offset}); preallocate it (e.g. `fallocate -l SIZE {}`) or write it full, then retry", .path.display(), .path.display())]
    Holes { path: PathBuf, offset: u64 },
    /// A FIEMAP extent carries a flag the kernel's swapfile activation
    /// refuses, or is not page aligned.
    #[error("{}: extent at byte offset {offset} is {flag}: {}", .path.display(), flag_advice(.flag))]
    BadExtentFlags {
        path: PathBuf,
        offset: u64,
        flag: &'static str,
    },
    /// The filesystem cannot report extents.
    #[error("{}: the filesystem does not support FIEMAP; use a whole-file source (ExtentSource::Whole) instead", .path.display())]
    FiemapUnsupported { path: PathBuf },
    /// Nothing to map: no sources, or a builder with no extents.
    #[error("no swap extents: give at least one backing of at least one {PAGE_SIZE}-byte page")]
    Empty,
    /// A length was asked for that the file or device does not have.
    #[error("{}: requested length {len} bytes exceeds its size of {actual} bytes; {}", .path.display(), if *.block_device { "give a length no larger than the device" } else { "preallocate the file to that size first (e.g. `fallocate -l SIZE FILE`) or ask for less" })]
    LenExceedsFile {
        path: PathBuf,
        len: u64,
        actual: u64,
        block_device: bool,
    },
    /// A builder call that cannot describe an extent (zero length, or slot
    /// or byte numbers past `u64`).
    #[error("invalid extent: {reason}; fix the caller")]
    InvalidExtent { reason: &'static str },
}

/// What to do about an extent flag swap refuses.
fn flag_advice(flag: &str) -> &'static str {
    match flag {
        "UNKNOWN" => "its location is not known yet; fsync the file or preallocate it with fallocate, and retry",
        "DELALLOC" => "delayed allocation, not on disk yet; fsync the file or preallocate it with fallocate, and retry",
        "ENCODED" => "compressed or otherwise encoded; create the swap file without compression (e.g. `chattr +m`, or on btrfs `chattr +C` before writing it)",
        "DATA_INLINE" => "stored inline in filesystem metadata; make the file several pages long and preallocate it with fallocate",
        "NOT_ALIGNED" => "not aligned to a 4096-byte page (filesystem block size below the page size, or tail packing); put the swap file on a filesystem with 4096-byte blocks, or use a whole-file source",
        "SHARED" => "shared with another file (reflink or snapshot); make an unshared copy (`cp --reflink=never`) and swap on that",
        _ => "the swap file cannot be mapped; preallocate it with fallocate on a plain filesystem",
    }
}

/// Collects extents in ascending slot order, merging as it goes, then
/// builds an [`ExtentMap`].  Made by [`ExtentMap::builder`].
#[derive(Debug)]
pub struct ExtentMapBuilder {
    kind: ExtentMapKind,
    extents: Vec<Extent>,
    next_slot: u64,
}

impl ExtentMapBuilder {
    /// Append the next `nr_slots` slots (ascending slot order, like
    /// `add_swap_extent()`), mapped to `backing` at `byte_offset`.
    ///
    /// Merges into the previous extent when the backing is the same and
    /// `byte_offset` continues it (and `physical` does too, when both are
    /// known): a file the filesystem laid out in one piece should cost one
    /// extent however its mapping was reported.
    pub fn add(
        &mut self,
        nr_slots: u64,
        backing: u32,
        byte_offset: u64,
        physical: Option<u64>,
    ) -> Result<&mut Self, ExtentError> {
        if nr_slots == 0 {
            return Err(ExtentError::InvalidExtent {
                reason: "an extent needs at least one slot",
            });
        }
        let end_slot = self
            .next_slot
            .checked_add(nr_slots)
            .ok_or(ExtentError::InvalidExtent {
                reason: "slot numbers overflow u64",
            })?;
        let bytes = nr_slots.checked_mul(PAGE).ok_or(ExtentError::InvalidExtent {
            reason: "extent length in bytes overflows u64",
        })?;
        // Every byte of the extent must be addressable, so that lookup's
        // arithmetic can never overflow.
        byte_offset.checked_add(bytes).ok_or(ExtentError::InvalidExtent {
            reason: "byte offsets overflow u64",
        })?;
        if let Some(p) = physical {
            p.checked_add(bytes).ok_or(ExtentError::InvalidExtent {
                reason: "physical addresses overflow u64",
            })?;
        }

        if let Some(last) = self.extents.last_mut() {
            let last_bytes = last.nr_slots * PAGE;
            let offset_follows = last.byte_offset + last_bytes == byte_offset;
            // Where only one side's physical address is known we cannot
            // tell whether the disk is contiguous, and a merge would lose
            // the known address: keep them apart.
            let physical_follows = match (last.physical, physical) {
                (Some(a), Some(b)) => a.checked_add(last_bytes) == Some(b),
                (None, None) => true,
                _ => false,
            };
            if last.backing == backing && offset_follows && physical_follows {
                last.nr_slots += nr_slots;
                self.next_slot = end_slot;
                return Ok(self);
            }
        }
        self.extents.push(Extent {
            start_slot: self.next_slot,
            nr_slots,
            backing,
            byte_offset,
            physical,
        });
        self.next_slot = end_slot;
        Ok(self)
    }

    /// Build the map; an error if no extent was added.
    pub fn build(self) -> Result<ExtentMap, ExtentError> {
        if self.extents.is_empty() {
            return Err(ExtentError::Empty);
        }
        let repr = match self.kind {
            ExtentMapKind::Tree => Repr::Tree(self.extents.into_iter().map(|e| (e.start_slot, e)).collect()),
            ExtentMapKind::List => Repr::List {
                extents: self.extents,
                curr: CachePadded::new(AtomicUsize::new(0)),
            },
        };
        Ok(ExtentMap {
            kind: self.kind,
            slots: self.next_slot,
            repr,
        })
    }
}

/// How the extents are kept, per [`ExtentMapKind`].
#[derive(Debug)]
enum Repr {
    /// Keyed by first slot; the extent lives in the tree node, as the
    /// kernel's `swap_extent` embeds its `rb_node`.
    Tree(BTreeMap<u64, Extent>),
    /// In slot order, with the shared cursor `curr_swap_extent`: an index
    /// into `extents`, always in range.  It is on a cache line of its own so
    /// that what the list variant pays for is the cursor itself (every
    /// lookup that misses writes it), not false sharing with the read-only
    /// fields beside it.
    List {
        extents: Vec<Extent>,
        curr: CachePadded<AtomicUsize>,
    },
}

/// Slot -> (backing, byte offset), immutable once built and shared by all
/// threads (`Send + Sync`).
#[derive(Debug)]
pub struct ExtentMap {
    kind: ExtentMapKind,
    slots: u64,
    repr: Repr,
}

impl ExtentMap {
    /// An empty builder for a map of `kind`.
    pub fn builder(kind: ExtentMapKind) -> ExtentMapBuilder {
        ExtentMapBuilder {
            kind,
            extents: Vec::new(),
            next_slot: 0,
        }
    }

    /// Where `slot` lives: (backing, byte offset in it); `None` past the
    /// last slot.  Safe to call from any number of threads; never allocates.
    #[inline]
    pub fn lookup(&self, slot: u64) -> Option<(u32, u64)> {
        if slot >= self.slots {
            return None;
        }
        match &self.repr {
            Repr::Tree(tree) => {
                // The extent with the greatest first slot not above `slot`:
                // the slots are covered without gaps from 0, so it holds it.
                let (_, se) = tree.range(..=slot).next_back()?;
                debug_assert!(se.contains(slot));
                Some(se.translate(slot))
            }
            Repr::List { extents, curr } => Some(list_lookup(extents, curr, slot)),
        }
    }

    /// The kind this map was built as.
    pub fn kind(&self) -> ExtentMapKind {
        self.kind
    }

    /// Number of extents (after merging).
    pub fn len(&self) -> usize {
        match &self.repr {
            Repr::Tree(t) => t.len(),
            Repr::List { extents, .. } => extents.len(),
        }
    }

    /// Whether the map has no extents; a built map never is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of slots the map covers: slots `0..slots()` translate.
    pub fn slots(&self) -> u64 {
        self.slots
    }

    /// The extents in slot order.
    pub fn extents(&self) -> impl Iterator<Item = &Extent> + '_ {
        let (tree, list) = match &self.repr {
            Repr::Tree(t) => (Some(t.values()), None),
            Repr::List { extents, .. } => (None, Some(extents.iter())),
        };
        tree.into_iter().flatten().chain(list.into_iter().flatten())
    }
}

/// The pre-seed-004 `map_swap_entry()`: start at the shared current extent
/// and walk the circular list until the slot's extent turns up, storing the
/// cursor at every step (`sis->curr_swap_extent = se`) as the kernel did.
/// The caller has checked that `slot` is in range, so the walk ends within
/// one lap.
#[inline]
fn list_lookup(extents: &[Extent], curr: &AtomicUsize, slot: u64) -> (u32, u64) {
    let n = extents.len();
    // The cursor is only a hint: any in-range index gives the right answer,
    // so relaxed ordering is enough, as the kernel's plain stores were.
    let start = curr.load(Ordering::Relaxed);
    let mut i = start;
    loop {
        let se = &extents[i];
        if se.contains(slot) {
            return se.translate(slot);
        }
        i += 1;
        if i == n {
            i = 0;
        }
        curr.store(i, Ordering::Relaxed);
        // It *must* be present.
        assert!(i != start, "slot {slot} in range but on no extent");
    }
}

/// One backing for [`from_sources`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExtentSource {
    /// The whole file or block device as one extent, from byte 0.  `len`
    /// (bytes) limits it; by default it is the file's size or the device's.
    /// Rounded down to whole pages.  Holes in a regular file are not
    /// checked: IO goes through the file, which fills them on write.
    Whole { path: PathBuf, len: Option<u64> },
    /// A regular file mapped by its physical extents (FIEMAP), refusing
    /// holes and unstable extents as the kernel's swapfile activation does.
    Fiemap { path: PathBuf },
}

/// What [`from_sources`] found for one source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackingInfo {
    /// The path as given.
    pub path: PathBuf,
    /// Bytes of it the map uses: whole pages from byte 0.
    pub len: u64,
    /// Whether it is a block device (else a regular file).
    pub block_device: bool,
}

/// Build a map from backings in order: slot numbering continues across
/// sources; backing index = position in `sources`.
pub fn from_sources(
    kind: ExtentMapKind,
    sources: &[ExtentSource],
) -> Result<(ExtentMap, Vec<BackingInfo>), ExtentError> {
    if sources.is_empty() {
        return Err(ExtentError::Empty);
    }
    let mut builder = ExtentMap::builder(kind);
    let mut infos = Vec::with_capacity(sources.len());
    for (i, source) in sources.iter().enumerate() {
        let backing = u32::try_from(i).map_err(|_| ExtentError::InvalidExtent {
            reason: "more than u32::MAX backings",
        })?;
        let info = match source {
            ExtentSource::Whole { path, len } => add_whole(&mut builder, backing, path, *len)?,
            ExtentSource::Fiemap { path } => add_fiemap(&mut builder, backing, path)?,
        };
        infos.push(info);
    }
    Ok((builder.build()?, infos))
}

/// Map an open error to the variant that tells the user what to do.
fn io_error(path: &Path, e: io::Error) -> ExtentError {
    let path = path.to_path_buf();
    match e.kind() {
        io::ErrorKind::NotFound => ExtentError::NotFound { path },
        io::ErrorKind::PermissionDenied => ExtentError::PermissionDenied { path },
        _ if e.raw_os_error() == Some(libc::EISDIR) => ExtentError::IsDirectory { path },
        _ => ExtentError::Io { path, source: e },
    }
}

/// Open `path` and check it is something swap can live on.  Returns the
/// file, whether it is a block device, and its size in bytes.
fn open_backing(path: &Path) -> Result<(File, bool, u64), ExtentError> {
    // Check the type before opening: opening a FIFO would block.
    let meta = std::fs::metadata(path).map_err(|e| io_error(path, e))?;
    let ft = meta.file_type();
    if ft.is_dir() {
        return Err(ExtentError::IsDirectory {
            path: path.to_path_buf(),
        });
    }
    let block_device = ft.is_block_device();
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
            path: path.to_path_buf(),
            what,
        });
    }
    let file = File::open(path).map_err(|e| io_error(path, e))?;
    let size = if block_device {
        block_device_size(&file).map_err(|e| io_error(path, e))?
    } else {
        meta.len()
    };
    Ok((file, block_device, size))
}

/// `_IOR(0x12, 114, size_t)`: the size of a block device in bytes.  Built
/// from the generic ioctl encoding (x86, arm, riscv; not alpha, mips,
/// powerpc or sparc, which encode directions differently).
const BLKGETSIZE64: u64 = (2 << 30) | ((std::mem::size_of::<usize>() as u64) << 16) | (0x12 << 8) | 114;

/// The size of the block device open as `file`, in bytes.
fn block_device_size(file: &File) -> io::Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points
    // at a live, writable u64; the descriptor is open for the whole call.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64 as _, &mut size as *mut u64) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(size)
}

/// Whole pages of `len` bytes from `path`, or TooSmall.
fn usable_pages(path: &Path, len: u64) -> Result<u64, ExtentError> {
    let pages = len / PAGE;
    if pages == 0 {
        return Err(ExtentError::TooSmall {
            path: path.to_path_buf(),
            len,
        });
    }
    Ok(pages)
}

fn add_whole(
    builder: &mut ExtentMapBuilder,
    backing: u32,
    path: &Path,
    len: Option<u64>,
) -> Result<BackingInfo, ExtentError> {
    let (_file, block_device, actual) = open_backing(path)?;
    let len = match len {
        Some(len) if len > actual => {
            return Err(ExtentError::LenExceedsFile {
                path: path.to_path_buf(),
                len,
                actual,
                block_device,
            })
        }
        Some(len) => len,
        None => actual,
    };
    let pages = usable_pages(path, len)?;
    builder.add(pages, backing, 0, None)?;
    Ok(BackingInfo {
        path: path.to_path_buf(),
        len: pages * PAGE,
        block_device,
    })
}

/// `struct fiemap` without its flexible array of extents.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct FiemapHeader {
    /// Logical byte offset to start mapping at.
    fm_start: u64,
    /// Logical bytes to map.
    fm_length: u64,
    /// FIEMAP_FLAG_* in, flags the kernel did not know out.
    fm_flags: u32,
    /// Extents the kernel filled in.
    fm_mapped_extents: u32,
    /// Room for extents in the array after the header.
    fm_extent_count: u32,
    fm_reserved: u32,
}

/// `struct fiemap_extent`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct FiemapExtent {
    fe_logical: u64,
    fe_physical: u64,
    fe_length: u64,
    fe_reserved64: [u64; 2],
    fe_flags: u32,
    fe_reserved: [u32; 3],
}

/// `struct fiemap` with room for `N` extents, as one buffer.
#[repr(C)]
struct FiemapBuf<const N: usize> {
    header: FiemapHeader,
    extents: [FiemapExtent; N],
}

/// `_IOWR('f', 11, struct fiemap)`; the size encoded is the header's.
const FS_IOC_FIEMAP: u64 = 0xC020_660B;
const _: () = assert!(std::mem::size_of::<FiemapHeader>() == 32);
const _: () = assert!(std::mem::size_of::<FiemapExtent>() == 56);

const FIEMAP_EXTENT_LAST: u32 = 0x0001;
const FIEMAP_EXTENT_UNWRITTEN: u32 = 0x0800;

/// The extent flags swap refuses, and their names.  UNKNOWN and DELALLOC:
/// the blocks are not allocated yet, so the kernel could not map them and
/// writes would allocate at swap-out time.  ENCODED and DATA_INLINE: the
/// data is not plain blocks.  NOT_ALIGNED: a page would straddle blocks.
/// SHARED: a write would copy-on-write the block elsewhere, which is why
/// the kernel refuses reflinked swap files.  UNWRITTEN (fallocated, not yet
/// written) is fine: the blocks are allocated.
const REFUSED_FLAGS: [(u32, &str); 6] = [
    (0x0002, "UNKNOWN"),
    (0x0004, "DELALLOC"),
    (0x0008, "ENCODED"),
    (0x0200, "DATA_INLINE"),
    (0x0100, "NOT_ALIGNED"),
    (0x2000, "SHARED"),
];

/// Read the extents of `file` covering logical bytes `0..len`, `N` at a
/// time, until the kernel marks the last one or has nothing more.
fn fiemap_extents<const N: usize>(
    file: &File,
    path: &Path,
    len: u64,
) -> Result<Vec<FiemapExtent>, ExtentError> {
    let mut out = Vec::new();
    let mut start = 0u64;
    while start < len {
        let mut buf = FiemapBuf::<N> {
            header: FiemapHeader {
                fm_start: start,
                fm_length: len - start,
                fm_extent_count: N as u32,
                ..FiemapHeader::default()
            },
            extents: [FiemapExtent::default(); N],
        };
        // SAFETY: `buf` is a `struct fiemap` followed by room for exactly
        // `fm_extent_count` extents, all #[repr(C)] with the kernel's
        // layout; the kernel writes only within it.  The descriptor is open
        // for the whole call.
        let rc = unsafe {
            libc::ioctl(
                file.as_raw_fd(),
                FS_IOC_FIEMAP as _,
                &mut buf as *mut FiemapBuf<N>,
            )
        };
        if rc < 0 {
            let e = io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::EOPNOTSUPP | libc::ENOTTY | libc::EINVAL) => ExtentError::FiemapUnsupported {
                    path: path.to_path_buf(),
                },
                _ => io_error(path, e),
            });
        }
        let mapped = (buf.header.fm_mapped_extents as usize).min(N);
        if mapped == 0 {
            break;
        }
        let got = &buf.extents[..mapped];
        out.extend_from_slice(got);
        let last = got[mapped - 1];
        let next = last.fe_logical.saturating_add(last.fe_length);
        if last.fe_flags & FIEMAP_EXTENT_LAST != 0 || next <= start {
            break;
        }
        start = next;
    }
    Ok(out)
}

fn add_fiemap(builder: &mut ExtentMapBuilder, backing: u32, path: &Path) -> Result<BackingInfo, ExtentError> {
    let (file, block_device, size) = open_backing(path)?;
    if block_device {
        return Err(ExtentError::NotSwappable {
            path: path.to_path_buf(),
            what: "a block device, which has no file extents (use a whole source)",
        });
    }
    let pages = usable_pages(path, size)?;
    let len = pages * PAGE;
    // Delayed allocation leaves blocks unassigned until writeback; sync so
    // FIEMAP reports where the data really is rather than DELALLOC.
    file.sync_all().map_err(|e| io_error(path, e))?;

    // The kernel adds one extent per physically contiguous piece, in file
    // order, refusing anything it could not write a page to directly.  The
    // builder merges pieces that turn out contiguous both logically and
    // physically, as add_swap_extent() does.
    let mut expected = 0u64;
    for fe in fiemap_extents::<64>(&file, path, len)? {
        let end = fe.fe_logical.saturating_add(fe.fe_length).min(len);
        if end <= expected {
            continue;
        }
        if fe.fe_logical > expected {
            return Err(ExtentError::Holes {
                path: path.to_path_buf(),
                offset: expected,
            });
        }
        let flags = fe.fe_flags & !(FIEMAP_EXTENT_LAST | FIEMAP_EXTENT_UNWRITTEN);
        if let Some(&(_, name)) = REFUSED_FLAGS.iter().find(|(f, _)| flags & f != 0) {
            return Err(ExtentError::BadExtentFlags {
                path: path.to_path_buf(),
                offset: fe.fe_logical,
                flag: name,
            });
        }
        // An extent that overlaps what is already mapped starts earlier;
        // take the part from `expected`, physically shifted to match.
        let skip = expected - fe.fe_logical;
        let physical = fe.fe_physical.saturating_add(skip);
        // A page must be one piece of disk: the kernel skips a page that
        // straddles extents, but here slot i must be logical page i, so
        // refuse instead (it only happens with blocks below page size).
        if expected % PAGE != 0 || end % PAGE != 0 || physical % PAGE != 0 {
            return Err(ExtentError::BadExtentFlags {
                path: path.to_path_buf(),
                offset: expected,
                flag: "NOT_ALIGNED",
            });
        }
        builder.add((end - expected) / PAGE, backing, expected, Some(physical))?;
        expected = end;
    }
    if expected < len {
        return Err(ExtentError::Holes {
            path: path.to_path_buf(),
            offset: expected,
        });
    }
    Ok(BackingInfo {
        path: path.to_path_buf(),
        len,
        block_device: false,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::io::Write;

    const KINDS: [ExtentMapKind; 2] = [ExtentMapKind::Tree, ExtentMapKind::List];

    #[test]
    fn map_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<ExtentMap>();
    }

    #[test]
    fn builder_merges_only_contiguous_runs() {
        for kind in KINDS {
            let mut b = ExtentMap::builder(kind);
            // Contiguous on backing 0: merges into one.
            b.add(4, 0, 0, None).unwrap();
            b.add(2, 0, 4 * PAGE, None).unwrap();
            // Gap in byte offset: new extent.
            b.add(3, 0, 10 * PAGE, None).unwrap();
            // Different backing at the continuing offset: new extent.
            b.add(1, 1, 13 * PAGE, None).unwrap();
            // Contiguous offset but only this side's physical address
            // known: new extent (it cannot tell, and would lose it).
            b.add(2, 1, 14 * PAGE, Some(1 << 20)).unwrap();
            // Same backing, contiguous offset and physical: merges.
            b.add(2, 1, 16 * PAGE, Some((1 << 20) + 2 * PAGE)).unwrap();
            // Contiguous offset, physical discontiguous: new extent.
            b.add(5, 1, 18 * PAGE, Some(1 << 30)).unwrap();
            // Contiguous offset, physical contiguous, other backing: new.
            b.add(1, 2, 23 * PAGE, Some((1 << 30) + 5 * PAGE)).unwrap();
            let m = b.build().unwrap();
            let got: Vec<(u64, u64, u32, u64, Option<u64>)> = m
                .extents()
                .map(|e| (e.start_slot, e.nr_slots, e.backing, e.byte_offset, e.physical))
                .collect();
            assert_eq!(
                got,
                vec![
                    (0, 6, 0, 0, None),
                    (6, 3, 0, 10 * PAGE, None),
                    (9, 1, 1, 13 * PAGE, None),
                    (10, 4, 1, 14 * PAGE, Some(1 << 20)),
                    (14, 5, 1, 18 * PAGE, Some(1 << 30)),
                    (19, 1, 2, 23 * PAGE, Some((1 << 30) + 5 * PAGE)),
                ],
                "{kind:?}"
            );
            assert_eq!(m.len(), 6);
            assert!(!m.is_empty());
            assert_eq!(m.slots(), 20);
            assert_eq!(m.kind(), kind);
        }
    }

    #[test]
    fn builder_rejects_bad_input() {
        assert!(matches!(
            ExtentMap::builder(ExtentMapKind::Tree).build(),
            Err(ExtentError::Empty)
        ));
        let mut b = ExtentMap::builder(ExtentMapKind::List);
        assert!(matches!(
            b.add(0, 0, 0, None),
            Err(ExtentError::InvalidExtent { .. })
        ));
        assert!(matches!(
            b.add(2, 0, u64::MAX - PAGE, None),
            Err(ExtentError::InvalidExtent { .. })
        ));
        b.add(u64::MAX / PAGE - 1, 0, 0, None).unwrap();
        assert!(matches!(
            b.add(u64::MAX, 1, 0, None),
            Err(ExtentError::InvalidExtent { .. })
        ));
    }

    /// Three extents on two backings; checks the first and last slot of
    /// each, and past the end, for both kinds.
    #[test]
    fn lookup_at_extent_edges() {
        let maps: Vec<ExtentMap> = KINDS
            .iter()
            .map(|&k| {
                let mut b = ExtentMap::builder(k);
                b.add(3, 0, 100 * PAGE, None).unwrap();
                b.add(1, 1, 0, None).unwrap();
                b.add(7, 0, 50 * PAGE, None).unwrap();
                b.build().unwrap()
            })
            .collect();
        let want = [
            (0, Some((0, 100 * PAGE))),
            (2, Some((0, 102 * PAGE))),
            (3, Some((1, 0))),
            (4, Some((0, 50 * PAGE))),
            (10, Some((0, 56 * PAGE))),
            (11, None),
            (u64::MAX, None),
        ];
        for m in &maps {
            assert_eq!(m.len(), 3);
            // Look up in an order that makes the list walk forwards,
            // backwards (wrapping) and stay put.
            for &(slot, expect) in want.iter().chain(want.iter().rev()) {
                assert_eq!(m.lookup(slot), expect, "{:?} slot {slot}", m.kind());
            }
        }
        for slot in 0..12 {
            assert_eq!(maps[0].lookup(slot), maps[1].lookup(slot));
        }
    }

    /// Reference: one (backing, offset) per slot, straight from the adds.
    fn naive(adds: &[(u64, u32, u64)]) -> Vec<(u32, u64)> {
        let mut v = Vec::new();
        for &(n, backing, off) in adds {
            for i in 0..n {
                v.push((backing, off + i * PAGE));
            }
        }
        v
    }

    proptest! {
        #[test]
        fn tree_list_and_reference_agree(
            layout in prop::collection::vec((1u64..40, 0u32..3, 0u64..3, any::<bool>()), 1..300),
            probes in prop::collection::vec(any::<u64>(), 1..200),
        ) {
            // Each add continues the byte offset of its backing after a
            // random gap (0 = contiguous, so some merge).
            let mut next_off = [0u64; 3];
            let mut adds = Vec::new();
            let mut builders: Vec<ExtentMapBuilder> =
                KINDS.iter().map(|&k| ExtentMap::builder(k)).collect();
            for &(n, backing, gap, phys) in &layout {
                let off = next_off[backing as usize] + gap * PAGE;
                next_off[backing as usize] = off + n * PAGE;
                let physical = phys.then_some(off + (1 << 40));
                adds.push((n, backing, off));
                for b in &mut builders {
                    b.add(n, backing, off, physical).unwrap();
                }
            }
            let reference = naive(&adds);
            let maps: Vec<ExtentMap> = builders.into_iter().map(|b| b.build().unwrap()).collect();
            let total = reference.len() as u64;
            prop_assert_eq!(maps[0].len(), maps[1].len());
            prop_assert!(maps[0].len() <= layout.len());
            for m in &maps {
                prop_assert_eq!(m.slots(), total);
                // The extents tile 0..total in order.
                let mut next = 0;
                for e in m.extents() {
                    prop_assert_eq!(e.start_slot, next);
                    next = e.end_slot();
                }
                prop_assert_eq!(next, total);
            }
            for &p in &probes {
                // Mostly in range, sometimes just past it, sometimes far.
                let slot = match p % 8 {
                    0 => total + p % 4,
                    1 => p,
                    _ => p % total,
                };
                let want = reference.get(slot as usize).copied();
                prop_assert_eq!(maps[0].lookup(slot), want);
                prop_assert_eq!(maps[1].lookup(slot), want);
            }
        }
    }

    /// 20,000 extents of 7 slots, extent i at byte (i * 8 + 3) pages on
    /// backing i % 5: arithmetic gives the truth for any slot.
    fn big_map(kind: ExtentMapKind) -> ExtentMap {
        let mut b = ExtentMap::builder(kind);
        for i in 0..20_000u64 {
            b.add(7, (i % 5) as u32, (i * 8 + 3) * PAGE, None).unwrap();
        }
        b.build().unwrap()
    }

    fn big_truth(slot: u64) -> Option<(u32, u64)> {
        if slot >= 140_000 {
            return None;
        }
        let (i, r) = (slot / 7, slot % 7);
        Some(((i % 5) as u32, (i * 8 + 3 + r) * PAGE))
    }

    #[test]
    fn concurrent_lookups_are_right() {
        for kind in KINDS {
            let m = big_map(kind);
            assert_eq!(m.len(), 20_000);
            // Random lookups on the list walk ~10,000 extents each; keep
            // its count modest so the test stays quick unoptimised.
            let per_thread: u64 = match kind {
                ExtentMapKind::Tree => 200_000,
                ExtentMapKind::List => 1_500,
            };
            std::thread::scope(|s| {
                for t in 0..8u64 {
                    let m = &m;
                    s.spawn(move || {
                        let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (t + 1);
                        for _ in 0..per_thread {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            let slot = x % 140_010;
                            assert_eq!(m.lookup(slot), big_truth(slot), "{kind:?} slot {slot}");
                        }
                    });
                }
            });
        }
    }

    fn write_file(path: &Path, bytes: usize) {
        let mut f = File::create(path).unwrap();
        f.write_all(&vec![0xA5u8; bytes]).unwrap();
        f.sync_all().unwrap();
    }

    #[test]
    fn whole_sources_continue_slot_numbers() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        write_file(&a, 10 * PAGE_SIZE + 100); // rounds down to 10 pages
        write_file(&b, 3 * PAGE_SIZE);
        for kind in KINDS {
            let sources = [
                ExtentSource::Whole {
                    path: a.clone(),
                    len: None,
                },
                ExtentSource::Whole {
                    path: b.clone(),
                    len: None,
                },
                ExtentSource::Whole {
                    path: a.clone(),
                    len: Some(2 * PAGE + 5),
                },
            ];
            let (m, infos) = from_sources(kind, &sources).unwrap();
            assert_eq!(m.kind(), kind);
            assert_eq!(m.slots(), 15);
            assert_eq!(m.len(), 3);
            assert_eq!(
                infos,
                vec![
                    BackingInfo {
                        path: a.clone(),
                        len: 10 * PAGE,
                        block_device: false
                    },
                    BackingInfo {
                        path: b.clone(),
                        len: 3 * PAGE,
                        block_device: false
                    },
                    BackingInfo {
                        path: a.clone(),
                        len: 2 * PAGE,
                        block_device: false
                    },
                ]
            );
            assert_eq!(m.lookup(0), Some((0, 0)));
            assert_eq!(m.lookup(9), Some((0, 9 * PAGE)));
            assert_eq!(m.lookup(10), Some((1, 0)));
            assert_eq!(m.lookup(12), Some((1, 2 * PAGE)));
            assert_eq!(m.lookup(13), Some((2, 0)));
            assert_eq!(m.lookup(14), Some((2, PAGE)));
            assert_eq!(m.lookup(15), None);
        }
    }

    #[test]
    fn unreadable_file_is_permission_denied() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("locked");
        write_file(&a, 4 * PAGE_SIZE);
        std::fs::set_permissions(&a, std::fs::Permissions::from_mode(0o000)).unwrap();
        // Root reads anything; so that this test means something as root
        // too, a helper thread drops its filesystem uid (setfsuid is per
        // thread at the syscall level, and leaving uid 0 drops the
        // filesystem capabilities), then tries both kinds of source.
        let a2 = a.clone();
        let errs = std::thread::spawn(move || {
            // SAFETY: setfsuid only changes this thread's credentials.
            unsafe { libc::syscall(libc::SYS_setfsuid, 65534) };
            [
                from_sources(
                    ExtentMapKind::Tree,
                    &[ExtentSource::Whole {
                        path: a2.clone(),
                        len: None,
                    }],
                )
                .err(),
                from_sources(ExtentMapKind::Tree, &[ExtentSource::Fiemap { path: a2 }]).err(),
            ]
        })
        .join()
        .unwrap();
        for e in errs {
            let e = e.expect("an unreadable file must be refused");
            assert!(matches!(e, ExtentError::PermissionDenied { .. }), "{e}");
            let msg = e.to_string();
            assert!(
                msg.contains(&*a.to_string_lossy()) && msg.contains("permission denied"),
                "{msg}"
            );
        }
    }

    #[test]
    fn whole_source_errors() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        write_file(&a, 4 * PAGE_SIZE);
        let whole = |path: &Path, len| {
            from_sources(
                ExtentMapKind::Tree,
                &[ExtentSource::Whole {
                    path: path.to_path_buf(),
                    len,
                }],
            )
        };
        let e = whole(&a, Some(5 * PAGE)).unwrap_err();
        assert!(
            matches!(e, ExtentError::LenExceedsFile { len, actual, block_device: false, .. }
                if len == 5 * PAGE && actual == 4 * PAGE),
            "{e}"
        );
        assert!(e.to_string().contains("fallocate"), "{e}");
        let e = whole(&a, Some(100)).unwrap_err();
        assert!(matches!(e, ExtentError::TooSmall { len: 100, .. }), "{e}");
        let missing = dir.path().join("nope");
        let e = whole(&missing, None).unwrap_err();
        assert!(matches!(e, ExtentError::NotFound { .. }), "{e}");
        assert!(e.to_string().contains(&*missing.to_string_lossy()), "{e}");
        let e = whole(dir.path(), None).unwrap_err();
        assert!(matches!(e, ExtentError::IsDirectory { .. }), "{e}");
        assert!(matches!(
            from_sources(ExtentMapKind::Tree, &[]),
            Err(ExtentError::Empty)
        ));
    }

    /// Map one file with FIEMAP; `None` if the filesystem cannot, after
    /// checking that the error says so.
    fn fiemap_map(kind: ExtentMapKind, path: &Path) -> Option<ExtentMap> {
        match from_sources(
            kind,
            &[ExtentSource::Fiemap {
                path: path.to_path_buf(),
            }],
        ) {
            Ok((m, infos)) => {
                assert_eq!(infos[0].len, m.slots() * PAGE);
                Some(m)
            }
            Err(e @ ExtentError::FiemapUnsupported { .. }) => {
                assert!(e.to_string().contains("whole-file"), "{e}");
                eprintln!("FIEMAP unsupported here, checked the error only: {e}");
                None
            }
            Err(e) => panic!("{e}"),
        }
    }

    /// Physically discontiguous runs in a raw FIEMAP read (one extent per
    /// ioctl, to exercise the continuation loop differently from the map).
    fn raw_runs(path: &Path, len: u64) -> usize {
        let f = File::open(path).unwrap();
        let raw = fiemap_extents::<1>(&f, path, len).unwrap();
        let mut runs = 0;
        let mut prev_end: Option<(u64, u64)> = None;
        for fe in &raw {
            if prev_end != Some((fe.fe_logical, fe.fe_physical)) {
                runs += 1;
            }
            prev_end = Some((fe.fe_logical + fe.fe_length, fe.fe_physical + fe.fe_length));
        }
        runs
    }

    #[test]
    fn fiemap_maps_fragmented_file() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        // Grow two files in alternate 4 KiB chunks, syncing each, so the
        // filesystem interleaves their blocks.
        const CHUNKS: usize = 512; // 2 MiB each
        {
            let mut fa = File::create(&a).unwrap();
            let mut fb = File::create(&b).unwrap();
            let chunk = vec![0x5Au8; PAGE_SIZE];
            for _ in 0..CHUNKS {
                for f in [&mut fa, &mut fb] {
                    f.write_all(&chunk).unwrap();
                    f.sync_all().unwrap();
                }
            }
        }
        for kind in KINDS {
            let Some(m) = fiemap_map(kind, &a) else {
                return;
            };
            assert_eq!(m.slots(), CHUNKS as u64);
            for slot in 0..CHUNKS as u64 {
                assert_eq!(m.lookup(slot), Some((0, slot * PAGE)));
            }
            assert_eq!(m.lookup(CHUNKS as u64), None);
            assert!(m.extents().all(|e| e.physical.is_some()));
            let runs = raw_runs(&a, CHUNKS as u64 * PAGE);
            eprintln!(
                "{kind:?}: fragmented file has {runs} physical runs, map has {} extents",
                m.len()
            );
            assert!(runs >= 1);
            assert_eq!(m.len(), runs);
        }
    }

    #[test]
    fn fiemap_accepts_fallocated_file() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        // std has no fallocate; use the util-linux command when present.
        match std::process::Command::new("fallocate")
            .args(["-l", "1M"])
            .arg(&a)
            .status()
        {
            Ok(s) if s.success() => {}
            _ => {
                eprintln!("no fallocate command; skipping the unwritten-extent check");
                return;
            }
        }
        if let Some(m) = fiemap_map(ExtentMapKind::Tree, &a) {
            assert_eq!(m.slots(), 256);
            assert_eq!(m.lookup(255), Some((0, 255 * PAGE)));
        }
    }

    #[test]
    fn fiemap_refuses_holes() {
        let dir = tempfile::tempdir().unwrap();
        // Entirely sparse.
        let sparse = dir.path().join("sparse");
        File::create(&sparse).unwrap().set_len(1 << 20).unwrap();
        // Data, then a hole to the end.
        let tail = dir.path().join("tail");
        write_file(&tail, 16 * PAGE_SIZE);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&tail)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        for (path, offset) in [(&sparse, 0), (&tail, 16 * PAGE)] {
            match from_sources(
                ExtentMapKind::Tree,
                &[ExtentSource::Fiemap { path: path.clone() }],
            ) {
                Err(ExtentError::Holes { offset: o, .. }) => assert_eq!(o, offset),
                Err(e @ ExtentError::FiemapUnsupported { .. }) => eprintln!("{e}"),
                other => panic!("{path:?}: expected Holes, got {other:?}"),
            }
        }
        let e = from_sources(
            ExtentMapKind::Tree,
            &[ExtentSource::Fiemap { path: sparse.clone() }],
        )
        .unwrap_err();
        if let ExtentError::Holes { .. } = e {
            let msg = e.to_string();
            assert!(msg.contains("holes") && msg.contains("fallocate"), "{msg}");
            assert!(msg.contains(&*sparse.to_string_lossy()), "{msg}");
        }
    }

    #[test]
    fn fiemap_source_errors() {
        let dir = tempfile::tempdir().unwrap();
        let fiemap = |path: &Path| {
            from_sources(
                ExtentMapKind::List,
                &[ExtentSource::Fiemap {
                    path: path.to_path_buf(),
                }],
            )
            .unwrap_err()
        };
        let missing = dir.path().join("missing");
        let e = fiemap(&missing);
        assert!(matches!(e, ExtentError::NotFound { .. }), "{e}");
        assert!(e.to_string().contains(&*missing.to_string_lossy()), "{e}");
        let e = fiemap(dir.path());
        assert!(matches!(e, ExtentError::IsDirectory { .. }), "{e}");
        assert!(e.to_string().contains("is a directory"), "{e}");
        let empty = dir.path().join("empty");
        File::create(&empty).unwrap();
        let e = fiemap(&empty);
        assert!(matches!(e, ExtentError::TooSmall { len: 0, .. }), "{e}");
        let e = fiemap(Path::new("/dev/null"));
        assert!(matches!(e, ExtentError::NotSwappable { .. }), "{e}");
    }

    /// A temporary directory on tmpfs (/dev/shm), for the tests of what
    /// tmpfs refuses; None, said on stderr, where there is none to use.
    pub(crate) fn tmpfs_tempdir() -> Option<tempfile::TempDir> {
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        let shm_is_tmpfs = mounts.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 2 && f[1] == "/dev/shm" && f[2] == "tmpfs"
        });
        if !shm_is_tmpfs {
            eprintln!("/dev/shm is not tmpfs here; skipping");
            return None;
        }
        let dir = tempfile::tempdir_in("/dev/shm");
        if dir.is_err() {
            eprintln!("cannot write /dev/shm; skipping");
        }
        dir.ok()
    }

    /// tmpfs has no FIEMAP: the error must say so and point at Whole.
    #[test]
    fn fiemap_unsupported_on_tmpfs() {
        let Some(dir) = crate::extent::tests::tmpfs_tempdir() else {
            return;
        };
        let a = dir.path().join("a");
        write_file(&a, 4 * PAGE_SIZE);
        let e = from_sources(ExtentMapKind::Tree, &[ExtentSource::Fiemap { path: a }]).unwrap_err();
        assert!(matches!(e, ExtentError::FiemapUnsupported { .. }), "{e}");
        assert!(e.to_string().contains("whole-file"), "{e}");
    }
}
