//! Per-CPU data, as user space can have it.
//!
//! The kernel reaches per-CPU data with preemption disabled, so nothing else
//! touches it mid-operation.  User space cannot disable preemption: a thread
//! may migrate between reading its CPU number and finishing its work, and
//! several threads may share a CPU.  So each per-CPU slot is still guarded by
//! a lock, which is uncontended unless a thread migrates or is preempted
//! while holding it.  The CPU number comes from `sched_getcpu()` (a vDSO
//! call, a few nanoseconds).

use crossbeam_utils::CachePadded;

/// The number of CPUs this process may ever run on, at least 1.
pub fn possible_cpus() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    if n < 1 {
        1
    } else {
        n as usize
    }
}

/// The CPU the calling thread is running on right now (it may have moved by
/// the time the caller uses the answer).
#[inline]
pub fn current_cpu() -> usize {
    // SAFETY: sched_getcpu has no memory-safety preconditions.
    let c = unsafe { libc::sched_getcpu() };
    if c < 0 {
        0
    } else {
        c as usize
    }
}

/// One `T` per CPU, each on its own cache line.
pub struct PerCpu<T> {
    slots: Box<[CachePadded<T>]>,
}

impl<T> PerCpu<T> {
    /// `n` slots (at least one), slot `i` made by `make(i)`.
    pub fn new(n: usize, mut make: impl FnMut(usize) -> T) -> Self {
        PerCpu {
            slots: (0..n.max(1)).map(|i| CachePadded::new(make(i))).collect(),
        }
    }

    /// How many slots there are.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Always false: there is at least one slot.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The slot index for the calling thread's current CPU.  With fewer
    /// slots than CPUs, CPUs share slots modulo the count.
    #[inline]
    pub fn this_index(&self) -> usize {
        current_cpu() % self.slots.len()
    }

    /// The calling thread's current CPU's slot.
    #[inline]
    pub fn this(&self) -> &T {
        &self.slots[self.this_index()]
    }

    /// Slot `i`.
    pub fn get(&self, i: usize) -> &T {
        &self.slots[i]
    }

    /// Every slot, in CPU order.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().map(|s| &**s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_cover_every_cpu() {
        let p = PerCpu::new(possible_cpus(), |i| i);
        assert!(!p.is_empty());
        assert!(p.this_index() < p.len());
        assert_eq!(
            p.iter().copied().collect::<Vec<_>>(),
            (0..p.len()).collect::<Vec<_>>()
        );
        let one = PerCpu::new(0, |_| 7u8);
        assert_eq!(one.len(), 1);
        assert_eq!(*one.this(), 7);
    }
}
