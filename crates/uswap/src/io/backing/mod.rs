//! Backings: the regular files and block devices that file devices keep
//! their slots on.  Opening one checks what it is (a regular file or a
//! block device: never a directory, FIFO or socket; checked before the
//! open, which would block on a FIFO), opens it once (read-write and
//! `O_DIRECT` for IO, read-only to map it), and sizes it (`BLKGETSIZE64`
//! for a device).  Mapping it builds the extent map over it: one whole
//! extent, or the file's physical extents from FIEMAP, refusing holes and
//! unstable extents as the kernel's swapfile activation does.
//!
//! A backing opened for IO holds copies of a process's memory, so it must
//! be this process's alone: never reached through a symbolic
//! link (`O_NOFOLLOW`: a link planted in a shared directory would send the
//! memory elsewhere); a regular file owned by this user and closed to
//! everyone else (mode `0600`: no one else may read what is swapped or
//! write into it), held with an exclusive `flock` (the same file given
//! twice, or to two processes, would share slots: silent corruption and
//! disclosure); a block device opened `O_EXCL` (the kernel refuses one that
//! is mounted or swapped on, as `swapon` does, with `EBUSY`).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use super::error::IoError;
use crate::extent::{ExtentError, ExtentMap, ExtentMapBuilder, ExtentMapKind};
use crate::sys::{FiemapExtent, FIEMAP_EXTENT_LAST, FIEMAP_EXTENT_UNWRITTEN};
use crate::PAGE_SIZE;

const PAGE: u64 = PAGE_SIZE as u64;

/// How a backing is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// To map it only.
    ReadOnly,
    /// For IO: read-write, with `O_DIRECT` when `direct`.
    ReadWrite { direct: bool },
}

/// A backing, type-checked and open.
#[derive(Debug)]
pub(crate) struct Backing {
    /// The path as given, for messages.
    pub path: PathBuf,
    pub file: File,
    /// A block device (else a regular file).
    pub block_device: bool,
    /// Its size in bytes.
    pub size: u64,
}

impl Backing {
    /// Check what `path` is, then open it once.  Errors name the path and
    /// what to do: not found, permission, a directory or other file type
    /// swap cannot live on, `O_DIRECT` refused by the filesystem.
    pub fn open(path: &Path, access: Access) -> Result<Backing, IoError> {
        let for_io = access != Access::ReadOnly;
        if for_io {
            let link = std::fs::symlink_metadata(path).map_err(|e| io_error(path, e))?;
            if link.file_type().is_symlink() {
                return Err(IoError::Symlink {
                    path: path.to_path_buf(),
                });
            }
        }
        // Check the type before opening: opening a FIFO would block.
        let meta = std::fs::metadata(path).map_err(|e| io_error(path, e))?;
        let ft = meta.file_type();
        if ft.is_dir() {
            return Err(ExtentError::IsDirectory {
                path: path.to_path_buf(),
            }
            .into());
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
            }
            .into());
        }
        let mut o = OpenOptions::new();
        o.read(true);
        let direct = match access {
            Access::ReadOnly => false,
            Access::ReadWrite { direct } => {
                o.write(true);
                // A link swapped in after the check above fails here
                // (ELOOP); a block device in use fails with EBUSY.
                let excl = if block_device { libc::O_EXCL } else { 0 };
                o.custom_flags(libc::O_NOFOLLOW | excl | if direct { libc::O_DIRECT } else { 0 });
                direct
            }
        };
        let file = o.open(path).map_err(|e| match e.raw_os_error() {
            Some(libc::EINVAL) if direct => IoError::DirectUnsupported {
                path: path.to_path_buf(),
            },
            Some(libc::ELOOP) if for_io => IoError::Symlink {
                path: path.to_path_buf(),
            },
            Some(libc::EBUSY) if for_io => IoError::InUse {
                path: path.to_path_buf(),
            },
            _ => io_error(path, e).into(),
        })?;
        if for_io {
            private(path, &file, block_device)?;
        }
        let size = if block_device {
            crate::sys::block_device_size(&file).map_err(|e| io_error(path, e))?
        } else {
            meta.len()
        };
        Ok(Backing {
            path: path.to_path_buf(),
            file: crate::descriptors::place_file(file),
            block_device,
            size,
        })
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

impl ExtentSource {
    /// The file or block device it names.
    pub fn path(&self) -> &Path {
        match self {
            ExtentSource::Whole { path, .. } | ExtentSource::Fiemap { path } => path,
        }
    }
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

/// Build a map from backings in order, each opened read-only (once):
/// slot numbering continues across sources; backing index = position in
/// `sources`.
pub fn from_sources(
    kind: ExtentMapKind,
    sources: &[ExtentSource],
) -> Result<(ExtentMap, Vec<BackingInfo>), IoError> {
    let backings = sources
        .iter()
        .map(|s| Backing::open(s.path(), Access::ReadOnly))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(map_backings(kind, sources, &backings)?)
}

/// Build a map over backings already open, `backings[i]` being
/// `sources[i]`'s.
pub(crate) fn map_backings(
    kind: ExtentMapKind,
    sources: &[ExtentSource],
    backings: &[Backing],
) -> Result<(ExtentMap, Vec<BackingInfo>), ExtentError> {
    debug_assert_eq!(sources.len(), backings.len());
    if sources.is_empty() {
        return Err(ExtentError::Empty);
    }
    let mut builder = ExtentMap::builder(kind);
    let mut infos = Vec::with_capacity(sources.len());
    for (i, (source, b)) in sources.iter().zip(backings).enumerate() {
        let index = u32::try_from(i).map_err(|_| ExtentError::InvalidExtent {
            reason: "more than u32::MAX backings",
        })?;
        let info = match source {
            ExtentSource::Whole { len, .. } => add_whole(&mut builder, index, b, *len)?,
            ExtentSource::Fiemap { .. } => add_fiemap(&mut builder, index, b)?,
        };
        infos.push(info);
    }
    Ok((builder.build()?, infos))
}

/// Map an open error to the variant that tells the user what to do.
/// Check that an open backing is this process's alone: the file's owner
/// and mode (a regular file), and an exclusive lock on it.  See the module
/// documentation.
fn private(path: &Path, file: &File, block_device: bool) -> Result<(), IoError> {
    let path = path.to_path_buf();
    let meta = file.metadata().map_err(|e| io_error(&path, e))?;
    if !block_device {
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        if meta.uid() != me {
            return Err(IoError::NotOwner {
                path,
                owner: meta.uid(),
                me,
            });
        }
        if meta.mode() & 0o077 != 0 {
            return Err(IoError::OpenToOthers {
                path,
                mode: meta.mode() & 0o7777,
            });
        }
    }
    // Block devices are held by O_EXCL; a regular file by flock, which the
    // same file opened again (here or in another process) cannot take.
    // A forked child shares this open file and its lock.
    if !block_device {
        // SAFETY: a descriptor we hold open.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = io::Error::last_os_error();
            return Err(if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                IoError::InUse { path }
            } else {
                io_error(&path, e).into()
            });
        }
    }
    Ok(())
}

fn io_error(path: &Path, e: io::Error) -> ExtentError {
    let path = path.to_path_buf();
    match e.kind() {
        io::ErrorKind::NotFound => ExtentError::NotFound { path },
        io::ErrorKind::PermissionDenied => ExtentError::PermissionDenied { path },
        _ if e.raw_os_error() == Some(libc::EISDIR) => ExtentError::IsDirectory { path },
        _ => ExtentError::Io { path, source: e },
    }
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
    index: u32,
    b: &Backing,
    len: Option<u64>,
) -> Result<BackingInfo, ExtentError> {
    let (path, block_device, actual) = (b.path.as_path(), b.block_device, b.size);
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
    builder.add(pages, index, 0, None)?;
    Ok(BackingInfo {
        path: path.to_path_buf(),
        len: pages * PAGE,
        block_device,
    })
}

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
    let mut extents = [FiemapExtent::default(); N];
    while start < len {
        let mapped = crate::sys::fiemap(file, start, len - start, &mut extents).map_err(|e| {
            match e.raw_os_error() {
                Some(libc::EOPNOTSUPP | libc::ENOTTY | libc::EINVAL) => ExtentError::FiemapUnsupported {
                    path: path.to_path_buf(),
                },
                _ => io_error(path, e),
            }
        })?;
        if mapped == 0 {
            break;
        }
        let got = &extents[..mapped];
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

fn add_fiemap(builder: &mut ExtentMapBuilder, index: u32, b: &Backing) -> Result<BackingInfo, ExtentError> {
    let (path, file, size) = (b.path.as_path(), &b.file, b.size);
    if b.block_device {
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
    for fe in fiemap_extents::<64>(file, path, len)? {
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
        if !expected.is_multiple_of(PAGE) || end % PAGE != 0 || physical % PAGE != 0 {
            return Err(ExtentError::BadExtentFlags {
                path: path.to_path_buf(),
                offset: expected,
                flag: "NOT_ALIGNED",
            });
        }
        builder.add((end - expected) / PAGE, index, expected, Some(physical))?;
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
pub(crate) mod tests;
