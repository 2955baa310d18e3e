//! A slot's entry word in a compressed store: a tag in the top four bits
//! (empty, same-filled, stored, in the file behind, being written back,
//! written back while freed, busy) and, for a stored page, its handle in
//! the pool (size class, block, index).

use crate::io::zpool::Handle;

/// Entry tags (the top four bits).
pub(super) const TAG_SHIFT: u32 = 60;

pub(super) const EMPTY: u64 = 0;

pub(super) const SAME: u64 = 1;

pub(super) const STORED: u64 = 2;

pub(super) const FILE: u64 = 3;

pub(super) const WB: u64 = 4;

pub(super) const WB_DEAD: u64 = 5;

pub(super) const BUSY: u64 = 6;

#[inline]
pub(super) fn tag(e: u64) -> u64 {
    e >> TAG_SHIFT
}

#[inline]
pub(super) fn entry(tag: u64, h: Handle) -> u64 {
    tag << TAG_SHIFT | (h.class as u64) << 48 | (h.block as u64) << 16 | h.index as u64
}

#[inline]
pub(super) fn handle(e: u64) -> Handle {
    Handle {
        class: (e >> 48) as u8,
        block: (e >> 16) as u32,
        index: e as u16,
    }
}

#[inline]
pub(super) fn holds_object(e: u64) -> bool {
    matches!(tag(e), STORED | WB | WB_DEAD)
}
