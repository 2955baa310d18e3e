//! The compressed store as a device: the `PageStore` calls an `IoDevice`
//! makes on it, and `IoDevice::compressed`, which builds one.

use std::sync::atomic::Ordering;

use crate::io::device::{BackendKind, IoDevice, PageStore};
use crate::io::error::IoError;
use crate::io::options::CompressedOptions;
use crate::stats::Registry;
use crate::PAGE_SIZE;
use super::entry::{tag, FILE};
use crate::io::zpool;
use super::CompressedStore;

impl PageStore for CompressedStore {
    fn kind(&self) -> BackendKind {
        BackendKind::Compressed
    }

    fn write(&self, offset: u64, buf: &[u8]) -> Result<(), IoError> {
        self.write_pages(offset, buf)
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), IoError> {
        self.read_pages(offset, buf)
    }

    fn needs_alignment(&self) -> bool {
        // Pages may go straight to an O_DIRECT file.
        self.file.as_ref().is_some_and(|f| f.store.needs_alignment())
    }

    fn frees_on_swapin(&self, offset: u64) -> bool {
        // A page read back from the store leaves it, as zram and zswap do
        // (the kernel frees the slot of a synchronous device on swap-in,
        // and zswap's loads are exclusive): a copy of a resident page
        // would hold memory to save a compression.  A page read back from
        // the file keeps its slot there, which costs no memory.
        !self.keep_copies && tag(self.entry(offset).load(Ordering::Acquire)) != FILE
    }

    fn store_pages(&self) -> u64 {
        (self.pool.used_blocks() * zpool::BLOCK / PAGE_SIZE) as u64
    }

    fn wants_slot_freed(&self) -> bool {
        true
    }

    fn slot_freed(&self, offset: u64, pages: u64) {
        for slot in offset..offset + pages {
            self.discard_slot(slot);
        }
    }

    fn has_file(&self) -> bool {
        self.file.is_some()
    }

    fn unlinked_files(&self, f: &mut dyn FnMut(std::os::fd::RawFd)) {
        if let Some(file) = &self.file {
            file.store.unlinked_files(f);
        }
    }

    fn compact(&self) -> usize {
        CompressedStore::compact(self)
    }

    fn check(&self) -> Result<(), String> {
        self.pool.check()
    }

    #[cfg(test)]
    fn entry_of(&self, slot: u64) -> u64 {
        self.entry(slot).load(Ordering::Relaxed)
    }

    #[cfg(test)]
    fn file_behind(&self) -> Option<&IoDevice> {
        self.file.as_ref()
    }

    fn describe(&self, d: &mut std::fmt::DebugStruct<'_, '_>) {
        d.field("codec", &self.codec.codec())
            .field("store_blocks", &self.pool.capacity_blocks())
            .field("file", &self.file);
    }
}

impl IoDevice {
    /// A compressed device (see [`CompressedOptions`]): pages compressed
    /// into a packed store in memory, with an optional file (or NBD
    /// export) behind it, whose slots the device has.
    pub fn compressed(opts: &CompressedOptions, registry: &Registry) -> Result<IoDevice, IoError> {
        let store = CompressedStore::new(opts, registry)?;
        let slots = store.file.as_ref().map_or(opts.limit / crate::PAGE_SIZE as u64, |f| f.slots());
        Ok(IoDevice::with_store(slots, Box::new(store), registry))
    }
}
