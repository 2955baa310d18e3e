//! File devices: slots on one or more backings (regular files or block
//! devices), every slot translated through the device's extent map, IO
//! with `pread`/`pwrite`, `O_DIRECT` by default, every page encrypted and
//! authenticated by default (`crypt.rs`).
//!
//! # A forked child's files of its own
//!
//! A child made by `fork` without `exec` shares its parent's swap file:
//! the slots its pages were in at the fork it reads there (the parent
//! keeps them for it, `pager/held.rs`), but it may not write the file, whose
//! free slots its parent hands out at the same time (the two copies of
//! the allocator would give one slot to both).  So the child writes its
//! own: a *layer*, one new unnamed file per backing, the same size, the
//! same slot map, its own key, made the first time the child has pages to
//! swap out (`open_layer`, from its reclaimer: a shell's children that
//! `exec` at once never make one).  A slot allocated to the child sets its
//! bit in the layer, and its writes go there; a read takes the newest
//! layer whose bit is set, or the base file: a child's child makes a layer of its own at the next
//! depth and reads through its parent's as its parent would.  A slot
//! keeps its layer's bit when freed: the child only ever reuses it by
//! writing it again in its own layer, and the slots it did not write
//! (its parents') it never frees (`pager::Inner::parents_slot`).  Before
//! this a forked child's dirty pages stayed resident: Python's
//! `forkserver` workers at 40 MiB held 337 MiB.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

use super::backing::{self, Access, Backing, ExtentSource};
use super::crypt::{self, Sealer};
use super::device::{BackendKind, IoDevice, PageStore};
use super::error::IoError;
use super::growth::Growth;
use super::options::FileOptions;
use crate::extent::ExtentMap;
use crate::extent::ExtentMapKind;
use crate::stats::Registry;
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
    /// Forked children's files (module docs): `layers[i]` is written by
    /// the process `i + 1` forks down from the one that made the device.
    pub layers: [OnceLock<Box<Layer>>; MAX_LAYERS],
    /// How many forks down this process is (0: the device's maker); its
    /// own layer is `layers[depth - 1]`.
    pub depth: AtomicUsize,
    /// Per backing: the chunks allocated of a file that grows as it is
    /// written (`growth.rs`); None for one preallocated whole.
    pub growth: Vec<Option<Growth>>,
}

/// How many forks down a child still gets files of its own; below it a
/// child's dirty pages stay resident, as they did without layers.
pub(crate) const MAX_LAYERS: usize = 8;

/// One forked child's files (module docs).
pub(crate) struct Layer {
    /// One per backing of the base, each as long.
    files: Vec<File>,
    /// Its own key and seals: a child sealing with its parent's key would
    /// repeat the parent's nonces.
    sealer: Option<Sealer>,
    /// Bit per slot: allocated to this layer's process (`allocated`) and
    /// so written here if written at all.  Never cleared.
    written: Box<[AtomicU64]>,
    /// Per backing: its chunks allocated.  A layer always grows as it is
    /// written: as long as its base, it holds only what its child wrote.
    growth: Vec<Growth>,
}

impl Layer {
    fn has(&self, slot: u64) -> bool {
        self.written[(slot / 64) as usize].load(Ordering::Acquire) & (1 << (slot % 64)) != 0
    }

    fn mark(&self, offset: u64, pages: u64) {
        for slot in offset..offset + pages {
            self.written[(slot / 64) as usize].fetch_or(1 << (slot % 64), Ordering::Release);
        }
    }
}

/// Where a slot's IO goes: the base files, or a layer.
#[derive(Clone, Copy)]
enum Place<'a> {
    Base,
    Layer(usize, &'a Layer),
}

impl Place<'_> {
    fn id(&self) -> usize {
        match self {
            Place::Base => 0,
            Place::Layer(i, _) => i + 1,
        }
    }
}

/// A private swap file for `path`, which does not exist: an unnamed file
/// (`O_TMPFILE`, mode 0600) in `path`'s directory, so that no other user
/// can open it while it lives and nothing is left behind when the process
/// ends, even by `kill -9` or a crash; where the filesystem has no
/// `O_TMPFILE`, a file created at `path` (`O_EXCL`, 0600) and unlinked at
/// once.  Preallocated to `len` bytes, so no swap-out ever needs the
/// filesystem to allocate; `O_DIRECT` set on it when `direct`.  Locked as
/// an existing backing is (`flock`), though nothing else can reach it.
pub(crate) fn create_private(path: &Path, len: u64, direct: bool, grow: bool) -> Result<Backing, IoError> {
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
    if grow {
        // Sparse: allocated a chunk at a time as it is written (growth.rs).
        file.set_len(len).map_err(create_err)?;
    } else {
        loop {
            // SAFETY: plain syscall wrapper on a descriptor we hold open.
            let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len_off) };
            match rc {
                0 => break,
                libc::EINTR => continue,
                e => return Err(create_err(io::Error::from_raw_os_error(e))),
            }
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
    /// A file device's store over `files` (base backings), `map` from
    /// slot to backing, sealed by `sealer` when it encrypts.
    pub(crate) fn new(paths: Vec<PathBuf>, files: Vec<File>, map: ExtentMap, sealer: Option<Sealer>) -> Self {
        FileStore {
            paths,
            files,
            map,
            sealer,
            layers: Default::default(),
            depth: AtomicUsize::new(0),
            growth: Vec::new(),
        }
    }

    /// The growth of backing `backing` of `place`, if it grows.
    fn growth_of<'a>(&'a self, place: &Place<'a>, backing: usize) -> Option<&'a Growth> {
        match place {
            Place::Base => self.growth.get(backing)?.as_ref(),
            Place::Layer(_, l) => l.growth.get(backing),
        }
    }

    /// Bytes allocated so far to this process's files that grow.
    fn grown_bytes(&self) -> u64 {
        let base: u64 = self.growth.iter().flatten().map(Growth::allocated).sum();
        let layers: u64 = self
            .layers
            .iter()
            .filter_map(|l| l.get())
            .flat_map(|l| l.growth.iter().map(Growth::allocated))
            .sum();
        base + layers
    }

    /// Where this process writes: its layer, or the base at depth 0.
    /// `None` in a forked child whose layer is not made yet.
    fn writer(&self) -> Option<Place<'_>> {
        match self.depth.load(Ordering::Relaxed) {
            0 => Some(Place::Base),
            d => self.layers[d - 1].get().map(|l| Place::Layer(d - 1, l)),
        }
    }

    /// Where slot `slot` was written: the newest layer with its bit, else
    /// the base.
    fn reader(&self, slot: u64) -> Place<'_> {
        let d = self.depth.load(Ordering::Relaxed);
        for i in (0..d).rev() {
            if let Some(l) = self.layers[i].get() {
                if l.has(slot) {
                    return Place::Layer(i, l);
                }
            }
        }
        Place::Base
    }

    fn files_of<'a>(&'a self, p: &Place<'a>) -> &'a [File] {
        match p {
            Place::Base => &self.files,
            Place::Layer(_, l) => &l.files,
        }
    }

    fn sealer_of<'a>(&'a self, p: &Place<'a>) -> Option<&'a Sealer> {
        match p {
            Place::Base => self.sealer.as_ref(),
            Place::Layer(_, l) => l.sealer.as_ref(),
        }
    }

    /// Cut slots `offset..offset + pages` into runs contiguous on one
    /// backing of one place (`place(slot)`) and call `io(file, byte
    /// position, buffer byte range, place)` for each, in order.  `io`
    /// returns the bytes done before a failure with it; the failure comes
    /// back with the slot it happened at.
    #[inline]
    fn for_each_run<'a>(
        &'a self,
        offset: u64,
        pages: u64,
        place: impl Fn(u64) -> Place<'a>,
        mut io: impl FnMut(&File, usize, u64, std::ops::Range<usize>, Place<'a>) -> Result<(), (usize, RunError)>,
    ) -> Result<(), (u64, RunError)> {
        let end = offset + pages;
        let mut slot = offset;
        while slot < end {
            let (backing, pos) = self.map.lookup(slot).expect("slot checked in range");
            let at = place(slot);
            // Extend the run while the next slot follows on the same
            // backing of the same place.
            let mut n = 1;
            while slot + n < end
                && self.map.lookup(slot + n) == Some((backing, pos + n * PAGE))
                && place(slot + n).id() == at.id()
            {
                n += 1;
            }
            let from = ((slot - offset) * PAGE) as usize;
            let to = from + (n * PAGE) as usize;
            io(&self.files_of(&at)[backing as usize], backing as usize, pos, from..to, at)
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
    /// Write `buf` to slots `offset..` as it is, in `to`'s files.
    fn write_plain(&self, to: Place<'_>, offset: u64, buf: &[u8]) -> Result<(), IoError> {
        let pages = (buf.len() / PAGE_SIZE) as u64;
        self.for_each_run(
            offset,
            pages,
            |_| to,
            |file, backing, pos, range, at| {
                if let Some(g) = self.growth_of(&at, backing) {
                    g.ensure(file, pos, range.len() as u64).map_err(|e| (0, RunError::Io(e)))?;
                }
                write_all_at(file, &buf[range], pos)
            },
        )
        .map_err(|(slot, e)| match e {
            RunError::Io(source) => IoError::Write { offset: slot, source },
            RunError::Eof => IoError::Write {
                offset: slot,
                source: io::ErrorKind::WriteZero.into(),
            },
        })
    }

    /// The place this process writes to, its slots marked there; an error
    /// in a forked child without its layer (the pager allocates it no
    /// slots then).
    fn begin_write(&self, offset: u64, pages: u64) -> Result<Place<'_>, IoError> {
        let to = self.writer().ok_or_else(|| IoError::Write {
            offset,
            source: io::Error::other(
                "a forked child without a swap file of its own may not write its parent's",
            ),
        })?;
        if let Place::Layer(_, l) = to {
            l.mark(offset, pages);
        }
        Ok(to)
    }
}

impl PageStore for FileStore {
    fn kind(&self) -> BackendKind {
        BackendKind::File
    }

    fn write(&self, offset: u64, buf: &[u8]) -> Result<(), IoError> {
        let to = self.begin_write(offset, (buf.len() / PAGE_SIZE) as u64)?;
        match self.sealer_of(&to) {
            Some(s) => s.write_sealed(offset, buf, |at, sealed| self.write_plain(to, at, sealed)),
            None => self.write_plain(to, offset, buf),
        }
    }

    /// Each run from the place it was written to, opened with that
    /// place's key.
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), IoError> {
        let pages = (buf.len() / PAGE_SIZE) as u64;
        let mut opened = Ok(());
        self.for_each_run(
            offset,
            pages,
            |slot| self.reader(slot),
            |file, _, pos, range, at| {
                let slot = offset + (range.start / PAGE_SIZE) as u64;
                let part = &mut buf[range];
                read_exact_at(file, part, pos)?;
                if let Some(s) = self.sealer_of(&at) {
                    if let Err(e) = s.open(slot, part) {
                        opened = Err(e);
                    }
                }
                Ok(())
            },
        )
        .map_err(|(slot, e)| match e {
            RunError::Io(source) => IoError::Read { offset: slot, source },
            RunError::Eof => IoError::ShortRead { offset: slot },
        })?;
        opened
    }

    /// Each run from the place it was written to, as `read`.
    fn read_pieces(
        &self,
        offset: u64,
        pages: u64,
        piece: &mut dyn FnMut(i32, u64, std::ops::Range<usize>),
    ) -> bool {
        let all = self.for_each_run(
            offset,
            pages,
            |slot| self.reader(slot),
            |file, _, pos, range, _| {
                piece(file.as_raw_fd(), pos, range);
                Ok(())
            },
        );
        debug_assert!(all.is_ok(), "queuing pieces cannot fail");
        true
    }

    /// Each run opened with the key of the place it was read from.
    fn open_read(&self, offset: u64, buf: &mut [u8]) -> Result<(), IoError> {
        let pages = (buf.len() / PAGE_SIZE) as u64;
        let mut opened = Ok(());
        let all = self.for_each_run(
            offset,
            pages,
            |slot| self.reader(slot),
            |_, _, _, range, at| {
                let slot = offset + (range.start / PAGE_SIZE) as u64;
                if let Some(s) = self.sealer_of(&at) {
                    if let Err(e) = s.open(slot, &mut buf[range]) {
                        opened = Err(e);
                    }
                }
                Ok(())
            },
        );
        debug_assert!(all.is_ok(), "opening cannot fail a run");
        opened
    }

    /// The writer's: a writer that queues pieces itself seals with the
    /// key of the place they go to.
    fn sealer(&self) -> Option<&Sealer> {
        match self.writer() {
            Some(p) => self.sealer_of(&p),
            None => self.sealer.as_ref(),
        }
    }

    /// The base's files with no link left (a forked child's layers are
    /// made later, in the child, and not counted).
    fn unlinked_files(&self, f: &mut dyn FnMut(std::os::fd::RawFd)) {
        use std::os::unix::fs::MetadataExt;
        for file in &self.files {
            if file.metadata().is_ok_and(|m| m.nlink() == 0) {
                f(file.as_raw_fd());
            }
        }
    }

    /// Freed slots forget their seals: their blocks cannot be read back.
    fn slot_freed(&self, offset: u64, pages: u64) {
        for slot in offset..offset + pages {
            if let Some(s) = self.sealer_of(&self.reader(slot)) {
                s.forget(slot, 1);
            }
        }
    }

    fn wants_slot_freed(&self) -> bool {
        self.sealer.is_some()
    }

    fn needs_alignment(&self) -> bool {
        true
    }

    /// The pieces of a write (`uring.rs`), in this process's place; its
    /// slots are marked there.
    fn file_pieces(
        &self,
        offset: u64,
        pages: u64,
        piece: &mut dyn FnMut(i32, u64, std::ops::Range<usize>),
    ) -> bool {
        let Ok(to) = self.begin_write(offset, pages) else {
            return false;
        };
        // Every chunk the write needs allocated first: a file that cannot
        // grow takes the write the slow way, which says why it fails.
        let grown = self.for_each_run(
            offset,
            pages,
            |_| to,
            |file, backing, pos, range, at| match self.growth_of(&at, backing) {
                Some(g) => g.ensure(file, pos, range.len() as u64).map_err(|e| (0, RunError::Io(e))),
                None => Ok(()),
            },
        );
        if grown.is_err() {
            return false;
        }
        let all = self.for_each_run(
            offset,
            pages,
            |_| to,
            |file, _, pos, range, _| {
                piece(file.as_raw_fd(), pos, range);
                Ok(())
            },
        );
        debug_assert!(all.is_ok(), "queuing pieces cannot fail");
        true
    }

    fn extent_map(&self) -> Option<&ExtentMap> {
        Some(&self.map)
    }

    fn grows(&self) -> bool {
        self.growth.iter().any(Option::is_some)
    }

    fn grown(&self) -> u64 {
        self.grown_bytes()
    }

    fn cannot_grow(&self) -> bool {
        let base = self.growth.iter().flatten().any(Growth::stopped);
        let layers = self.layers.iter().filter_map(|l| l.get()).any(|l| l.growth.iter().any(Growth::stopped));
        base || layers
    }

    /// Whether slot `slot` is this process's own: always at depth 0; in a
    /// forked child, a slot allocated to it since it has its layer (the
    /// rest are its parents', which it never frees).  Marked at
    /// allocation, not at the write: a slot allocated for a page whose
    /// move is then refused (shared with the parent since the fork) is
    /// freed unwritten, and counted as a parent's it leaked: a child
    /// emptied its free slots in a second.
    fn owns(&self, slot: u64) -> bool {
        match self.writer() {
            Some(Place::Base) => true,
            Some(Place::Layer(_, l)) => l.has(slot),
            None => false,
        }
    }

    /// In a forked child (fork.rs's adoption): one fork further down.
    /// Returns whether the child may have a layer (not past
    /// [`MAX_LAYERS`], and every backing a regular file).
    fn forked(&self) -> bool {
        let d = self.depth.load(Ordering::Relaxed);
        if d >= MAX_LAYERS {
            return false;
        }
        self.depth.store(d + 1, Ordering::Relaxed);
        self.files
            .iter()
            .all(|f| f.metadata().is_ok_and(|m| m.file_type().is_file()))
    }

    /// Make this forked child's layer (module docs): files beside the
    /// base's, as long and as `O_DIRECT`, and a key of its own.
    fn open_layer(&self, slots: u64) -> Result<(), IoError> {
        let d = self.depth.load(Ordering::Relaxed);
        if d == 0 || self.layers[d - 1].get().is_some() {
            return Ok(());
        }
        let mut files = Vec::with_capacity(self.files.len());
        let mut growth = Vec::with_capacity(self.files.len());
        for (f, path) in self.files.iter().zip(&self.paths) {
            let len = f.metadata().map_err(|source| IoError::Open {
                path: path.clone(),
                source,
            })?;
            // SAFETY: fcntl on a descriptor we hold open.
            let direct = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETFL) } & libc::O_DIRECT != 0;
            // Beside the base (its directory): a name for an instant only
            // where the file system has no O_TMPFILE.
            let at = path.with_file_name(format!("uswap-child-{}.swap", std::process::id()));
            let file = create_private(&at, len.len(), direct, true)?.file;
            let free = super::growth::free_now(&file).map_err(|source| IoError::Open {
                path: at.clone(),
                source,
            })?;
            growth.push(Growth::new(len.len(), super::growth::reserve_for(free))?);
            files.push(file);
        }
        let sealer = match &self.sealer {
            Some(_) => Some(Sealer::new(slots)?),
            None => None,
        };
        let written = crate::table::zeroed(slots.div_ceil(64) as usize, "a forked child's swap file map")?;
        let _ = self.layers[d - 1].set(Box::new(Layer {
            files,
            sealer,
            written,
            growth,
        }));
        Ok(())
    }

    fn allocated(&self, offset: u64, pages: u64) {
        if let Some(Place::Layer(_, l)) = self.writer() {
            l.mark(offset, pages);
        }
    }

    fn describe(&self, d: &mut std::fmt::DebugStruct<'_, '_>) {
        d.field("paths", &self.paths)
            .field("extents", &self.map.len())
            .field("encrypted", &self.sealer.is_some())
            .field("depth", &self.depth.load(Ordering::Relaxed));
    }
}

impl IoDevice {
    /// A file device of `opts.slots` pages at `opts.path`.
    ///
    /// A path that does not exist, or a directory, gets a private file:
    /// unnamed (`O_TMPFILE`) in that directory, mode 0600, preallocated,
    /// gone with the process however it ends (see `file::create_private`);
    /// a directory cannot be blocked by a file another user put under the
    /// name one would pick (`uswap run`'s default is its `$TMPDIR`).  An
    /// existing path (a block device, or a file the user keeps and
    /// preallocated) must be this process's alone (`backing/`), a
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
                let backing = create_private(&path.join("uswap.swap"), need, opts.direct, opts.grow)?;
                IoDevice::map_file(opts, need, backing, opts.grow, registry)
            }
            Ok(_) => IoDevice::open_file(opts, need, registry),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let backing = create_private(path, need, opts.direct, opts.grow)?;
                IoDevice::map_file(opts, need, backing, opts.grow, registry)
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
        IoDevice::map_file(opts, need, backing, false, registry)
    }

    /// A file device over the one open backing of `opts`: one whole
    /// extent of `need` bytes, or the file's FIEMAP extents.  A backing
    /// uswap made sparse (`grow`) is allocated as it is written.
    fn map_file(
        opts: &FileOptions,
        need: u64,
        backing: Backing,
        grow: bool,
        registry: &Registry,
    ) -> Result<IoDevice, IoError> {
        let growth = if grow {
            let free = super::growth::free_now(&backing.file).map_err(|source| IoError::Open {
                path: backing.path.clone(),
                source,
            })?;
            Some(Growth::new(need, super::growth::reserve_for(free))?)
        } else {
            None
        };
        let path = opts.path.clone();
        let source = if opts.fiemap {
            ExtentSource::Fiemap { path }
        } else {
            ExtentSource::Whole {
                path,
                len: Some(need),
            }
        };
        IoDevice::from_backings(
            opts.slots,
            vec![backing],
            &[source],
            opts.extent_kind,
            opts.encrypt,
            vec![growth],
            registry,
        )
    }

    /// A file device over open backings, slot `i` of `sources` backed by
    /// `backings[i]`.  A FIEMAP map covers the whole file, which may be
    /// more than `slots`; only `0..slots` is used.  Sealed (`crypt.rs`)
    /// when `encrypt`.
    pub(super) fn from_backings(
        slots: u64,
        backings: Vec<Backing>,
        sources: &[ExtentSource],
        kind: ExtentMapKind,
        encrypt: bool,
        growth: Vec<Option<Growth>>,
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
        let mut store = FileStore::new(paths, files, map, sealer);
        store.growth = growth;
        Ok(IoDevice::with_store(slots, Box::new(store), registry))
    }
}
