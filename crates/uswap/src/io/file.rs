//! File devices: slots on one or more backings (regular files or block
//! devices), every slot translated through the device's extent map, IO
//! with `pread`/`pwrite`, `O_DIRECT` by default, every page encrypted and
//! authenticated by default (`crypt.rs`).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use super::backing::Backing;
use super::crypt::Sealer;
use super::{BackendKind, IoError, PageStore};
use crate::extent::ExtentMap;
use crate::PAGE_SIZE;

const PAGE: u64 = PAGE_SIZE as u64;

/// A file device: its backings and the map from slot to backing.
pub(crate) struct FileStore {
    /// The path of each backing, for messages.
    pub paths: Vec<PathBuf>,
    /// One open file per backing, indexed by the map's backing numbers.
    pub files: Vec<File>,
    pub map: ExtentMap,
    /// The key and per-slot seals, unless the device writes plaintext.
    pub sealer: Option<Sealer>,
}

/// A private swap file for `path`, which does not exist: an unnamed file
/// (`O_TMPFILE`, mode 0600) in `path`'s directory, so that no other user
/// can open it while it lives and nothing is left behind when the process
/// ends, even by `kill -9` or a crash; where the filesystem has no
/// `O_TMPFILE`, a file created at `path` (`O_EXCL`, 0600) and unlinked at
/// once.  Preallocated to `len` bytes, so no swap-out ever needs the
/// filesystem to allocate; `O_DIRECT` set on it when `direct`.  Locked as
/// an existing backing is (`flock`), though nothing else can reach it.
pub(crate) fn create_private(path: &Path, len: u64, direct: bool) -> Result<Backing, IoError> {
    let create_err = |source| IoError::Create {
        path: path.to_path_buf(),
        source,
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let unnamed = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .mode(0o600)
        .open(dir);
    let file = match unnamed {
        Ok(f) => f,
        // No O_TMPFILE here (EOPNOTSUPP; EISDIR from a kernel that
        // takes the flag for O_DIRECTORY): a name, for an instant.
        Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EISDIR)) => {
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(create_err)?;
            let _ = std::fs::remove_file(path);
            f
        }
        Err(e) => return Err(create_err(e)),
    };
    let len_off = libc::off_t::try_from(len).map_err(|_| {
        create_err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "size does not fit off_t",
        ))
    })?;
    loop {
        // SAFETY: plain syscall wrapper on a descriptor we hold open.
        let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len_off) };
        match rc {
            0 => break,
            libc::EINTR => continue,
            e => return Err(create_err(io::Error::from_raw_os_error(e))),
        }
    }
    if direct {
        // SAFETY: fcntl on a descriptor we hold open.
        let fl = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
        // SAFETY: as above; sets only the status flags read just now.
        if fl < 0 || unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, fl | libc::O_DIRECT) } != 0 {
            return Err(IoError::DirectUnsupported {
                path: path.to_path_buf(),
            });
        }
    }
    // SAFETY: a descriptor we hold open.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    Ok(Backing {
        path: path.to_path_buf(),
        file: crate::descriptors::place_file(file),
        block_device: false,
        size: len,
    })
}

/// How one contiguous piece of IO failed: after how many bytes, and why.
enum RunError {
    Io(io::Error),
    /// Zero bytes transferred: end of file.
    Eof,
}

impl FileStore {
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

impl FileStore {
    /// Write `buf` to slots `offset..` as it is.
    fn write_plain(&self, offset: u64, buf: &[u8]) -> Result<(), IoError> {
        let pages = (buf.len() / PAGE_SIZE) as u64;
        self.for_each_run(offset, pages, |file, pos, range| {
            write_all_at(file, &buf[range], pos)
        })
        .map_err(|(slot, e)| match e {
            RunError::Io(source) => IoError::Write { offset: slot, source },
            RunError::Eof => IoError::Write {
                offset: slot,
                source: io::ErrorKind::WriteZero.into(),
            },
        })
    }

    /// Read slots `offset..` into `buf` as they are on disk.
    fn read_plain(&self, offset: u64, buf: &mut [u8]) -> Result<(), IoError> {
        let pages = (buf.len() / PAGE_SIZE) as u64;
        self.for_each_run(offset, pages, |file, pos, range| {
            read_exact_at(file, &mut buf[range], pos)
        })
        .map_err(|(slot, e)| match e {
            RunError::Io(source) => IoError::Read { offset: slot, source },
            RunError::Eof => IoError::ShortRead { offset: slot },
        })
    }
}

impl PageStore for FileStore {
    fn kind(&self) -> BackendKind {
        BackendKind::File
    }

    fn write(&self, offset: u64, buf: &[u8]) -> Result<(), IoError> {
        match &self.sealer {
            Some(s) => s.write_sealed(offset, buf, |at, sealed| self.write_plain(at, sealed)),
            None => self.write_plain(offset, buf),
        }
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), IoError> {
        self.read_plain(offset, buf)?;
        match &self.sealer {
            Some(s) => s.open(offset, buf),
            None => Ok(()),
        }
    }

    fn sealer(&self) -> Option<&Sealer> {
        self.sealer.as_ref()
    }

    /// Freed slots forget their seals: their blocks cannot be read back.
    fn discard(&self, offset: u64, pages: u64) {
        if let Some(s) = &self.sealer {
            s.forget(offset, pages);
        }
    }

    fn discards(&self) -> bool {
        self.sealer.is_some()
    }

    fn needs_alignment(&self) -> bool {
        true
    }

    fn file_pieces(
        &self,
        offset: u64,
        pages: u64,
        piece: &mut dyn FnMut(i32, u64, std::ops::Range<usize>),
    ) -> bool {
        let all = self.for_each_run(offset, pages, |file, pos, range| {
            piece(file.as_raw_fd(), pos, range);
            Ok(())
        });
        debug_assert!(all.is_ok(), "queuing pieces cannot fail");
        true
    }

    fn extent_map(&self) -> Option<&ExtentMap> {
        Some(&self.map)
    }

    fn describe(&self, d: &mut std::fmt::DebugStruct<'_, '_>) {
        d.field("paths", &self.paths)
            .field("extents", &self.map.len())
            .field("encrypted", &self.sealer.is_some());
    }
}
