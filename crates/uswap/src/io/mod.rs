//! The IO backend of one swap device: store and fetch page contents by slot.
//!
//! From the ground up: `error.rs` (why a device failed, in one line);
//! `options.rs` (how a device is asked for); `codec.rs`, `crypt.rs` and
//! `backing/` (compression, sealing, the files and block devices a file
//! device lives on); `device.rs` (the
//! [`IoDevice`] every store sits behind, and the [`PageStore`] trait);
//! the stores, each building its device: `ram.rs`, `file.rs`,
//! `compressed/` (with `zpool.rs`, its packed pool), `nbd/` (an export
//! on another machine); `uring.rs` (queued writeback).  This file only names them.
//!
//! The pager writes evicted pages to a device's slots and reads them back on
//! a fault.  An [`IoDevice`] is where those pages live, either in memory
//! ([`IoDevice::ram`], like the RAM disks the seeds' tests swap on) or in a
//! file or block device ([`IoDevice::file`]).  Slot `offset` holds one
//! [`PAGE_SIZE`](crate::PAGE_SIZE)-byte page; multi-page calls move a run of consecutive
//! slots, as a 2 MB swap-out of seed 003 does.
//!
//! File devices translate every slot through an [`ExtentMap`](crate::extent::ExtentMap) (the kernel's
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
mod device;
mod error;
mod file;
mod growth;
pub mod nbd;
mod options;
mod ram;
mod uring;
mod zpool;

pub use backing::{from_sources, BackingInfo, ExtentSource};
pub use codec::{Codec, CodecError};
pub use device::{BackendKind, IoDevice, PageStore};
#[cfg(test)]
pub use device::{IoOp, ANY_SLOT};
pub use error::IoError;
pub(crate) use file::MAX_LAYERS;
pub use growth::reserve_for;
pub use options::{CompressedOptions, FileOptions};
pub use uring::{Borrowed, FileHold, LentRing, ReadJob, ReadRing, WriteJob, WriteRing};

#[cfg(test)]
mod tests;
