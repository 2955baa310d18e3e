//! How a swap device is asked for: a file device's options
//! ([`FileOptions`]), a compressed device's ([`CompressedOptions`]).
//! Values a user builds (`spec` parses them from text); the stores read
//! them when they build their devices.

use std::path::PathBuf;

use super::codec::Codec;
use super::nbd::target::NbdTarget;
use crate::extent::ExtentMapKind;
use crate::PAGE_SIZE;

const PAGE: u64 = PAGE_SIZE as u64;

/// How to open a file device.  Built with [`FileOptions::new`] and the
/// setters; passed to `IoDevice::file` (the builder, for a `SwapDeviceSpec::file`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileOptions {
    pub(crate) path: PathBuf,
    pub(crate) slots: u64,
    pub(crate) direct: bool,
    pub(crate) fiemap: bool,
    pub(crate) extent_kind: ExtentMapKind,
    pub(crate) encrypt: bool,
    pub(crate) grow: bool,
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
            grow: false,
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

    /// Map the file by its physical extents (`ExtentSource::Fiemap`), so a
    /// fragmented file has as many extents as in the kernel; holes and
    /// unstable extents are refused.  Default `false`: one extent for the
    /// whole file (`ExtentSource::Whole`).
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

    /// A file this device creates grows as it is written (default
    /// `false`: preallocated whole at start): `slots` is then its most,
    /// and its blocks are allocated 2 MiB at a time before the first
    /// write there, while its file system keeps a reserve free (a tenth of
    /// what was free at start, at least 1 GiB, at most half); past that, writes fail
    /// with `ENOSPC` and the pages wait in memory.  An existing file or
    /// block device is used as it is.
    pub fn grow(mut self, on: bool) -> Self {
        self.grow = on;
        self
    }

    /// Whether a file this device creates grows ([`FileOptions::grow`]).
    pub fn grows(&self) -> bool {
        self.grow
    }
}

/// How to build a compressed device; see [`CompressedOptions::new`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompressedOptions {
    pub(crate) limit: u64,
    pub(crate) codec: Codec,
    pub(crate) file: Option<FileOptions>,
    pub(crate) nbd: Option<NbdTarget>,
    pub(crate) incompressible_to_file: bool,
    /// `None`: by the codec ([`Codec::gives_up_fast`]).
    pub(crate) sample_check: Option<bool>,
    pub(crate) keep_copies: bool,
}

impl CompressedOptions {
    /// A compressed device whose store uses at most `limit` bytes of
    /// memory.  Alone, the device has `limit / 4096` slots, like a zram
    /// disk of that size (its store then never fills: a page that does not
    /// compress takes 4096 bytes, no more); with a [`file`](Self::file)
    /// behind it, it has the file's slots, and the store's oldest pages
    /// go to the file when the store reaches `limit`.  LZ4 by default.
    pub fn new(limit: u64) -> Self {
        CompressedOptions {
            limit,
            codec: Codec::Lz4,
            file: None,
            nbd: None,
            incompressible_to_file: false,
            sample_check: None,
            keep_copies: false,
        }
    }

    /// Keep a page's compressed copy when a read fault brings it back
    /// (off by default).  Off, as zram and zswap do, the copy is let go:
    /// the store holds only pages that are out, and a page read back and
    /// evicted again is compressed again.  On, the page comes back clean
    /// with its slot, as from a RAM or file device, and goes again with no
    /// compression, for memory: the store also holds copies of resident
    /// pages (measured in docs/history/PERFORMANCE-LOG.md, "Compressed RAM").
    pub fn keep_copies(mut self, on: bool) -> Self {
        self.keep_copies = on;
        self
    }

    /// The codec (default [`Codec::Lz4`]).
    pub fn codec(mut self, c: Codec) -> Self {
        self.codec = c;
        self
    }

    /// A file behind the store (a tier): the device has its slots.
    pub fn file(mut self, f: FileOptions) -> Self {
        self.file = Some(f);
        self.nbd = None;
        self
    }

    /// An NBD export behind the store (a remote tier): the device has its
    /// slots (all of the export, or the target's `size`).
    pub fn nbd(mut self, t: NbdTarget) -> Self {
        self.nbd = Some(t);
        self.file = None;
        self
    }

    /// The NBD export behind, if any.
    pub fn nbd_of(&self) -> Option<&NbdTarget> {
        self.nbd.as_ref()
    }

    /// With a file behind: pages that do not compress go straight to it,
    /// as zswap rejected them to the swap device before Linux 6.18; off
    /// (the default), they are stored whole and written back in their
    /// turn, as zswap has stored them since.  Whole, the store keeps the
    /// LRU order of writeback (the coldest page goes first, whatever it
    /// holds), a fault on a recent page is served from memory, and the
    /// file is written in writeback's batches of neighbouring slots
    /// rather than a page at a time from reclaim (measured in
    /// docs/PERFORMANCE.md, pmbench over random data).
    pub fn incompressible_to_file(mut self, on: bool) -> Self {
        self.incompressible_to_file = on;
        self
    }

    /// Look at a sample of each page's bytes before compressing it: a
    /// sample of almost all distinct bytes (random, encrypted or
    /// compressed data) is stored whole without trying, as btrfs's
    /// compression heuristic does.  Off, every page is compressed and
    /// stored whole only when that did not pay.  By default on only for a
    /// codec that is slow to give up on such a page, zstd at level 1 and
    /// above ([`Codec::gives_up_fast`]): LZ4 gives up in less time than
    /// the check takes.
    pub fn sample_check(mut self, on: bool) -> Self {
        self.sample_check = Some(on);
        self
    }

    /// Whether pages are sampled before they are compressed: as set, or
    /// by the codec.
    pub fn samples(&self) -> bool {
        self.sample_check.unwrap_or(!self.codec.gives_up_fast())
    }

    /// The store's memory limit in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The codec.
    pub fn codec_of(&self) -> Codec {
        self.codec
    }

    /// The file behind, if any.
    pub fn file_of(&self) -> Option<&FileOptions> {
        self.file.as_ref()
    }

    /// The device's slots: the file's, the export's (0 while its size is
    /// the server's to say: `NbdTarget::size` unset), else the limit's.
    pub fn slots(&self) -> u64 {
        match (&self.file, &self.nbd) {
            (Some(f), _) => f.slots(),
            (None, Some(t)) => t.size.unwrap_or(0) / PAGE,
            (None, None) => self.limit / PAGE,
        }
    }
}
