//! Slots on swap files held for forked children (fork.rs): freed by the
//! parent while a child may still read them, they wait here until every
//! such child is done, as the kernel keeps a slot that parent and child
//! share (`swap_duplicate`) until both free it.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::descriptors::Placed;
use crate::pager::instance::page::{PageState, UNIT_PAGES};
use crate::pager::instance::report;
use crate::stats::StatMutex;
use crate::swap_space::SwapEntry;

/// A parent's hold on the slots of its swap files that a forked child may
/// still read: freed by the parent meanwhile, they wait here.
pub(crate) struct Hold {
    /// Whether a child may read: then frees look at `state`.
    active: AtomicBool,
    state: StatMutex<HoldState>,
}

#[derive(Default)]
struct HoldState {
    /// One bit per slot (devices one after another): held for a child.
    bits: Vec<u64>,
    /// Each device's first bit.
    bases: Vec<u64>,
    /// Slots on all devices.
    total: u64,
    /// The snapshot of the fork under way, taken before it.
    pending: Vec<u64>,
    /// Read ends of the children's pipes: a child is done at their end.
    children: Vec<Placed>,
    /// Held slots the parent freed: single slots, and units' clusters.
    deferred: Vec<SwapEntry>,
    deferred_units: Vec<SwapEntry>,
}

impl Hold {
    pub fn new(device_slots: &[u64], site: Arc<crate::stats::LockSite>) -> Hold {
        let mut bases = Vec::with_capacity(device_slots.len());
        let mut total = 0;
        for &n in device_slots {
            bases.push(total);
            total += n;
        }
        Hold {
            active: AtomicBool::new(false),
            state: StatMutex::new(
                HoldState {
                    bases,
                    total,
                    ..HoldState::default()
                },
                site,
            ),
        }
    }

    /// Before a fork: the slots on swap files (`file_device` says which
    /// devices are) that the child's copy of the page states refers to.
    pub(crate) fn snapshot(&self, states: &[PageState], file_device: impl Fn(u16) -> bool) {
        let mut s = self.state.lock();
        let mut bits = vec![0u64; s.total.div_ceil(64) as usize];
        let bases = s.bases.clone();
        let mut mark = |e: SwapEntry| {
            if file_device(e.device()) {
                let i = bases[e.device() as usize] + e.offset();
                bits[(i / 64) as usize] |= 1 << (i % 64);
            }
        };
        // Only where the table was ever written: the rest is `Never`,
        // and reading it would fault the zero page into all of it.
        for st in crate::table::written_entries(states)
            .into_iter()
            .flat_map(|r| &states[r])
        {
            let w = st.load();
            let Some(e) = w.slot() else {
                continue;
            };
            if w.is_unit() && w.is_whole() {
                for q in 0..UNIT_PAGES as u64 {
                    mark(SwapEntry::new(e.device(), e.offset() + q));
                }
            } else {
                mark(e);
            }
        }
        s.pending = bits;
    }

    /// After the fork, in the parent: hold the snapshot's slots until the
    /// end of pipe `read_end` (a duplicate is kept) closes.
    /// Returns whether any slot is held (a parent that never swapped to
    /// its files holds none, and needs no reclaimer to let them go).
    pub(crate) fn activate(&self, read_end: i32) -> bool {
        let mut s = self.state.lock();
        let pending = std::mem::take(&mut s.pending);
        let holds = pending.iter().any(|&w| w != 0);
        if !holds {
            // Nothing on the files the child could read: no hold at all.
            return false;
        }
        if read_end < 0 {
            // No pipe (out of descriptors): the child's end cannot be
            // seen, so these slots stay held for the process's life.
            report::line(format_args!(
                "uswap: no pipe to watch a forked child with; the slots it may read stay out of use"
            ));
        } else {
            // SAFETY: dup of a live descriptor; the copy is owned here.
            let fd = unsafe { libc::fcntl(read_end, libc::F_DUPFD_CLOEXEC, 0) };
            if fd >= 0 {
                // SAFETY: a fresh descriptor, owned by nothing else.
                s.children.push(Placed::new(unsafe { OwnedFd::from_raw_fd(fd) }));
            }
        }
        if s.bits.len() < pending.len() {
            s.bits.resize(pending.len(), 0);
        }
        for (b, p) in s.bits.iter_mut().zip(pending) {
            *b |= p;
        }
        self.active.store(true, Ordering::Release);
        holds
    }

    /// Whether slots wait for a child: the reclaimer frees them once it
    /// is done.
    pub(crate) fn waiting(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    /// In a child: the holds of its parent are not its own.
    pub(crate) fn forget(&self) {
        self.active.store(false, Ordering::Relaxed);
        let mut s = self.state.lock();
        s.bits = Vec::new();
        s.pending = Vec::new();
        // Dropping would close descriptors the child inherited: they are
        // the parent's other children's pipes, and closing them here is
        // right (this process must not keep them open).
        s.children.clear();
        s.deferred.clear();
        s.deferred_units.clear();
    }

    /// Whether freeing `e` (a unit's cluster when `unit`) must wait for a
    /// child: then it is kept here.
    pub fn defer(&self, e: SwapEntry, unit: bool) -> bool {
        if !self.active.load(Ordering::Acquire) {
            return false;
        }
        let mut s = self.state.lock();
        let Some(&base) = s.bases.get(e.device() as usize) else {
            return false;
        };
        let i = base + e.offset();
        let held = s
            .bits
            .get((i / 64) as usize)
            .is_some_and(|b| b & (1 << (i % 64)) != 0);
        if held {
            if unit {
                s.deferred_units.push(e);
            } else {
                s.deferred.push(e);
            }
        }
        held
    }

    /// The reclaimer's look, every pass: once every child that may read
    /// is done, the held slots the parent freed, to be freed now (single
    /// slots, units' clusters).
    pub fn release_if_done(&self) -> Option<(Vec<SwapEntry>, Vec<SwapEntry>)> {
        if !self.active.load(Ordering::Acquire) {
            return None;
        }
        let mut s = self.state.lock();
        s.children.retain(|fd| {
            let mut p = libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: polls one descriptor of ours, without waiting.
            let n = unsafe { libc::poll(&mut p, 1, 0) };
            // A write end still open: no event. Closed: POLLHUP.
            !(n > 0 && p.revents & (libc::POLLHUP | libc::POLLERR) != 0)
        });
        if !s.children.is_empty() {
            return None;
        }
        self.active.store(false, Ordering::Release);
        s.bits = Vec::new();
        Some((
            std::mem::take(&mut s.deferred),
            std::mem::take(&mut s.deferred_units),
        ))
    }
}
