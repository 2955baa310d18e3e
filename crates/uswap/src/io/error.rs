//! Why a device could not be set up, or an IO failed: one line naming the
//! path or slot and what to do about it, and whether trying again later
//! may work.

use std::io;
use std::path::PathBuf;

use super::codec::CodecError;
use crate::extent::ExtentError;
use crate::PAGE_SIZE;

/// Why a device could not be set up, or an IO failed.  Every message is one
/// line naming the path or slot and what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    /// The swap file did not exist and could not be created or preallocated.
    #[error("{}: cannot create the swap file: {source}; check that the directory exists and is writable and that the filesystem has room", .path.display())]
    Create {
        /// The path as given.
        path: PathBuf,
        /// What the system call said.
        #[source]
        source: io::Error,
    },
    /// The swap file or device exists but could not be opened or sized.
    #[error("{}: cannot open: {source}; check the path and that this user may read and write it", .path.display())]
    Open {
        /// The path as given.
        path: PathBuf,
        /// What the system call said.
        #[source]
        source: io::Error,
    },
    /// An existing file or device is smaller than the slots asked for.
    #[error("{}: is {have} bytes but {need} bytes are needed; grow it (`fallocate -l {need} {}` keeps its mode), ask for fewer slots, or give a path that does not exist yet to have it created, private", .path.display(), .path.display())]
    TooSmall {
        /// The path as given.
        path: PathBuf,
        /// Bytes it has.
        have: u64,
        /// Bytes it needs.
        need: u64,
    },
    /// The path is a symbolic link.
    #[error("{}: is a symbolic link; a swap file is opened only by its own path (a link planted in a shared directory would send this process's memory elsewhere): give the file's real path", .path.display())]
    Symlink {
        /// The path as given.
        path: PathBuf,
    },
    /// A regular file owned by another user.
    #[error("{}: is owned by uid {owner}, not by this user (uid {me}): its owner could read the memory swapped to it; give a file of your own, or a path that does not exist yet", .path.display())]
    NotOwner {
        /// The path as given.
        path: PathBuf,
        /// Its owner's uid.
        owner: u32,
        /// This process's uid.
        me: u32,
    },
    /// A regular file that others may read or write.
    #[error("{}: has mode {mode:04o}, so other users can read the memory swapped to it (or write into it); run `chmod 600 {}`", .path.display(), .path.display())]
    OpenToOthers {
        /// The path as given.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// Another swap device (here or in another process) or a mount holds it.
    #[error("{}: is in use (by another swap device of this or another process, a mount, or kernel swap): two users of one swap file would share its slots; give each device its own file or device", .path.display())]
    InUse {
        /// The path as given.
        path: PathBuf,
    },
    /// An existing file with holes.
    #[error("{}: is sparse ({allocated} of the {need} bytes needed are allocated), so a swap-out could fail when the filesystem fills; allocate it: `fallocate -l {need} {}`", .path.display(), .path.display())]
    Sparse {
        /// The path as given.
        path: PathBuf,
        /// Bytes the filesystem has allocated to it.
        allocated: u64,
        /// Bytes it needs.
        need: u64,
    },
    /// `O_DIRECT` was asked for on a filesystem that refuses it (ramfs, or
    /// tmpfs before Linux 6.6).
    #[error("{}: the filesystem does not support O_DIRECT (ramfs does not, nor tmpfs before Linux 6.6); use FileOptions::direct(false) or put the swap file on a filesystem that does, such as ext4 or xfs", .path.display())]
    DirectUnsupported {
        /// The path as given.
        path: PathBuf,
    },
    /// The extent map could not be built.
    #[error(transparent)]
    Extent(#[from] ExtentError),
    /// A buffer of the wrong length, or a misaligned one for a file device.
    #[error("{what}; pass whole {PAGE_SIZE}-byte pages in a {PAGE_SIZE}-byte aligned buffer")]
    Unaligned {
        /// What it was.
        what: &'static str,
    },
    /// Slots past the end of the device.
    #[error("slots {offset}..{} are out of range: the device has {slots} slots; fix the caller", .offset.saturating_add(*.pages))]
    Range {
        /// The slot.
        offset: u64,
        /// How many pages.
        pages: u64,
        /// Slots the device has.
        slots: u64,
    },
    /// A write failed (or an error was injected there).
    #[error("write of swap slot {offset} failed: {source}{}", write_advice(source))]
    Write {
        /// The slot.
        offset: u64,
        /// What the system call said.
        #[source]
        source: io::Error,
    },
    /// A read failed (or an error was injected there).
    #[error("read of swap slot {offset} failed: {source}; the swap backing is failing, check the kernel log (dmesg) and the disk")]
    Read {
        /// The slot.
        offset: u64,
        /// What the system call said.
        #[source]
        source: io::Error,
    },
    /// A read hit the end of the file: it shrank while in use.
    #[error("read of swap slot {offset} hit the end of the file; the swap file was truncated while in use, do not modify it while swapping on it")]
    ShortRead {
        /// The slot.
        offset: u64,
    },
    /// A page read from an encrypted file device failed its check: the
    /// block on disk is not the one written to that slot last.
    #[error("{}", IntegrityMessage { offset: *.offset, sealed: *.sealed })]
    Integrity {
        /// The slot.
        offset: u64,
        /// Whether the slot was sealed (false: it held no page).
        sealed: bool,
    },
    /// Memory a device needs (a RAM device's pages, a compressed store,
    /// an encrypted file's key and bounce buffers) could not be mapped.
    #[error("cannot map the memory of {what}: {source}; ask for fewer slots or raise the memory limits (ulimit -v)")]
    Mmap {
        /// What it was.
        what: &'static str,
        /// What the system call said.
        #[source]
        source: io::Error,
    },
    /// An NBD export that cannot be used: not reachable, refused, too
    /// small, read-only.
    #[error("{target}: {what}")]
    Nbd {
        /// The export's URI, canonical.
        target: String,
        /// What is wrong and what to do.
        what: String,
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
    /// `EFBIG`: past the process's file size limit, which a program may
    /// lower and raise again (`RLIMIT_FSIZE`, `ulimit -f`) and which holds
    /// for uswap's threads too, `EDQUOT`, `ENOMEM`, `ENOBUFS`, `EAGAIN`, `EBUSY`, `EINTR`,
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
                    | libc::EFBIG
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

/// What a failed write says to do: a swap file that has no room to grow
/// is no failing disk.
fn write_advice(source: &io::Error) -> &'static str {
    if source.raw_os_error() == Some(libc::EFBIG) {
        "; the process's file size limit (RLIMIT_FSIZE, `ulimit -f`) holds for its swap file too: raise it, or swap to a compressed store (--swap zram:SIZE), which no file limit bounds"
    } else if source.kind() == io::ErrorKind::StorageFull {
        ""
    } else {
        "; the swap backing is failing, check the kernel log (dmesg) and the disk"
    }
}
