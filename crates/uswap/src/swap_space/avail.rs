//! What a space's devices share (the kernel's `swap_avail_heads` and
//! `nr_swap_pages`): the devices that have free slots, in the order
//! allocation tries them, and the count of free slots.

use std::sync::atomic::AtomicI64;

use super::entry::MAX_DEVICES;
use crate::stats::StatMutex;

/// What devices share: the list of devices with free slots, and the count
/// of free slots (`nr_swap_pages`).
pub(crate) struct SpaceShared {
    /// Indices of devices that are not full, highest priority first; equal
    /// priorities in round-robin order (`swap_avail_heads`).  Taken under a
    /// device lock when that device fills up or frees its first slot, so
    /// membership always matches fullness.  Capacity is reserved for every
    /// device, so it never reallocates.
    pub(super) avail: StatMutex<Vec<u16>>,
    pub(super) nr_free: AtomicI64,
    pub(super) priorities: Vec<i32>,
}

impl SpaceShared {
    pub(super) fn avail_remove(&self, dev: u16) {
        let mut a = self.avail.lock();
        if let Some(i) = a.iter().position(|&d| d == dev) {
            a.remove(i);
        }
    }

    pub(super) fn avail_insert(&self, dev: u16, prio: i32) {
        let mut a = self.avail.lock();
        if a.contains(&dev) {
            return;
        }
        // After every device of higher or equal priority.
        let at = a
            .iter()
            .position(|&d| self.priorities[d as usize] < prio)
            .unwrap_or(a.len());
        a.insert(at, dev);
    }

    /// The devices to try, in order, and rotate the first to the back of
    /// its priority group (`plist_requeue`), so equal priorities take turns.
    pub(super) fn avail_order(&self, out: &mut [u16; MAX_DEVICES]) -> usize {
        let mut a = self.avail.lock();
        let n = a.len();
        out[..n].copy_from_slice(&a);
        if n > 1 {
            let p = self.priorities[a[0] as usize];
            let group_end = a
                .iter()
                .position(|&d| self.priorities[d as usize] != p)
                .unwrap_or(n);
            a[..group_end].rotate_left(1);
        }
        n
    }
}
