//! Another process's statistics block, mapped read-only: what `uswap
//! stat` and `uswap top` read.  A file that is not a block this build
//! can read (being written, another version, cut short) is skipped.

use std::io;
use std::path::Path;
use std::sync::atomic::Ordering;

use super::block::{block_len, map_shared, Block, Head, Identity, MAGIC};
use super::table::layout_hash;

/// Another process's block, mapped read-only (`uswap stat`).
pub struct MappedBlock {
    block: Block,
}

impl MappedBlock {
    /// Map the block file at `path`; None when it is not a block this
    /// build can read (being written, another version, cut short).
    pub fn open(path: &Path) -> io::Result<Option<MappedBlock>> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(path)?;
        let size = file.metadata()?.len() as usize;
        if size < std::mem::size_of::<Head>() {
            return Ok(None);
        }
        let p = map_shared(&file, size, Some(()))?;
        let mut block = Block::at(p, size, 1);
        // Never this process's file to remove.
        block.owner.store(-1, Ordering::Relaxed);
        let h = block.head();
        let shards = h.shards.load(Ordering::Relaxed) as usize;
        if h.magic.load(Ordering::Acquire) != MAGIC
            || h.layout.load(Ordering::Relaxed) != layout_hash()
            || !shards.is_power_of_two()
            || block_len(shards) > size
        {
            return Ok(None);
        }
        block.shards = shards;
        Ok(Some(MappedBlock { block }))
    }

    /// Who it is.
    pub fn identity(&self) -> Identity {
        self.block.identity()
    }

    /// Its statistics now.
    pub fn stats(&self) -> super::snapshot::Stats {
        self.block.snapshot(
            super::table::CounterId::STALL_SOME_NS.0,
            super::table::CounterId::STALL_FULL_NS.0,
        )
    }
}

/// A reader's request that a process bring its swapped memory in and keep
/// it there (`uswap gdb`, `uswap gcore`): made through the process's
/// block, mapped writable (the block is this user's, mode 0600), and
/// withdrawn when dropped.  The process meets it within its reclaimer's
/// next pass (`HoldRequest::met`), and lets go when the request is
/// withdrawn or its reader has died.
pub struct HoldRequest {
    block: Block,
    by: u64,
}

impl HoldRequest {
    /// Ask the process whose block is at `path` to hold its memory in for
    /// this process.  An error where the block cannot be opened for
    /// writing (another user's), or is not a block this build knows.
    pub fn ask(path: &Path) -> io::Result<HoldRequest> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(path)?;
        let size = file.metadata()?.len() as usize;
        let not_ours = || {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "not a statistics block of this uswap's version",
            )
        };
        if size < std::mem::size_of::<Head>() {
            return Err(not_ours());
        }
        let p = map_shared(&file, size, None)?;
        let block = Block::at(p, size, 1);
        block.owner.store(-1, Ordering::Relaxed);
        let h = block.head();
        if h.magic.load(Ordering::Acquire) != MAGIC || h.layout.load(Ordering::Relaxed) != layout_hash() {
            return Err(not_ours());
        }
        let by = std::process::id() as u64;
        h.hold_by.store(by, Ordering::Release);
        Ok(HoldRequest { block, by })
    }

    /// Whether the process has its memory in and held for this request.
    pub fn met(&self) -> bool {
        self.block.head().held_for.load(Ordering::Acquire) == self.by
    }
}

impl Drop for HoldRequest {
    fn drop(&mut self) {
        let _ = self
            .block
            .head()
            .hold_by
            .compare_exchange(self.by, 0, Ordering::AcqRel, Ordering::Relaxed);
    }
}
