//! Pinning spans of the heap for the kernel: in SIGBUS mode a system
//! call's buffers are brought in and held against eviction for the call
//! (`Region::pin`), by the interposed calls (`calls.rs`), the system-call
//! guard (`guard/`) and an alternate signal stack (`signals.rs`); and the
//! chunk, the longest span pinned at once, so that pins never hold more
//! than the budget allows.

use std::sync::atomic::{AtomicUsize, Ordering};

use uswap::pager::{FaultMode, Pinned};

use crate::running::RUNNING;

/// The longest span pinned at once, in bytes; 0 until SIGBUS mode runs,
/// and while it is 0 the interposed calls pin nothing.
static CHUNK: AtomicUsize = AtomicUsize::new(0);

/// Turn pinning on (SIGBUS mode), once the instance runs: a chunk is a
/// quarter of the budget, 64 KiB to 16 MiB.
pub(crate) fn start(mode: FaultMode, budget_bytes: usize) {
    if mode == FaultMode::Sigbus {
        CHUNK.store((budget_bytes / 4).clamp(64 << 10, 16 << 20), Ordering::Release);
    }
}

/// The chunk when pinning is on.
#[inline]
pub(crate) fn chunk() -> Option<usize> {
    match CHUNK.load(Ordering::Acquire) {
        0 => None,
        c => Some(c),
    }
}

/// Pin what of `[addr, addr + len)` is in the heap (brought in, made
/// writable when `write`, held until the guard drops); None when none of
/// it is.
pub(crate) fn span(addr: usize, len: usize, write: bool) -> Option<Pinned<'static>> {
    let r = RUNNING.get()?;
    let base = r.region.as_ptr() as usize;
    let end = base + r.region.len();
    let lo = addr.max(base);
    let hi = addr.saturating_add(len).min(end);
    if lo >= hi {
        return None;
    }
    // A span of the region (checked above): cannot be refused.
    r.region.pin(lo - base, hi - lo, write).ok()
}
