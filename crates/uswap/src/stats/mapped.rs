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
