//! The kernel's side of `--budget auto`: a memory group whose
//! `memory.limit_in_bytes` is driven by the same logic as `uswap run
//! --budget auto` (`uswap::domain::auto::Driver`), over kernel swap.
//!
//! What cgroup v1 changes against Senpai's cgroup v2 setting:
//! - there is no PSI per group, so the pressure is the machine's
//!   (`/proc/pressure/memory`, "some"): the benchmark runs one program
//!   at a time, and a machine otherwise idle stalls for want of memory
//!   only in it;
//! - there is no `memory.reclaim` and no `memory.high`: the limit itself
//!   is lowered, and the write reclaims down to it synchronously (in
//!   this sampler, not in the program) or fails with EBUSY, kept at the
//!   old limit until the next interval;
//! - the charge is `memory.usage_in_bytes` (its page cache too: what the
//!   limit holds), and the pages "touched" in an interval, the floor, are
//!   the group's page faults (`total_pgfault`, minor ones included, as
//!   uswap's count a first touch).
//!
//! PSI's memory stall counts only waits for memory (reclaim, refaults of
//! evicted pages), never a first touch, so all of it is pressure: the
//! driver is given its faults as swap-ins.

use std::fs;
use std::path::PathBuf;
use std::time::Instant;

use uswap::domain::auto::{Counts, Driver, Tuning};

use super::kernel_swap::{memory_stat, MemCgroup};

const PAGE: u64 = uswap::PAGE_SIZE as u64;

/// A memory group's limit under the controller.
pub struct GroupAuto {
    driver: Driver,
    group: PathBuf,
    /// The limit written last, in pages.
    limit: u64,
}

impl GroupAuto {
    /// Start at `max` bytes, the ceiling, as `uswap run --budget
    /// auto,max=` does; the tuning otherwise `tuning` (`--auto`'s).
    pub fn new(group: &MemCgroup, max: u64, tuning: Tuning) -> GroupAuto {
        let tuning = Tuning {
            max: max / PAGE,
            ..tuning
        };
        GroupAuto {
            driver: Driver::new(tuning, max / PAGE),
            group: group.path().to_path_buf(),
            limit: max / PAGE,
        }
    }

    /// Called from the sampler every few milliseconds: once an interval,
    /// read the group and the machine's pressure and move the limit.
    pub fn tick(&mut self, now: Instant) {
        if !self.driver.due(now) {
            return;
        }
        let faults = memory_stat(&self.group, "total_pgfault");
        let counts = Counts {
            charge: read_u64(self.group.join("memory.usage_in_bytes")) / PAGE,
            stall_ns: psi_some_us().saturating_mul(1000),
            faults,
            swapins: faults,
            hits: 0,
        };
        let Some(b) = self.driver.step(now, counts) else {
            return;
        };
        if b != self.limit {
            // Refused (EBUSY: the kernel could not reclaim down to it),
            // the old limit stays until the next interval.
            if fs::write(self.group.join("memory.limit_in_bytes"), (b * PAGE).to_string()).is_ok() {
                self.limit = b;
            }
        }
    }
}

fn read_u64(p: PathBuf) -> u64 {
    fs::read_to_string(p)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

/// The machine's memory stall, "some", in microseconds since boot; 0
/// without PSI.
fn psi_some_us() -> u64 {
    fs::read_to_string("/proc/pressure/memory")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("some "))
                .and_then(|l| l.split_whitespace().find_map(|f| f.strip_prefix("total=")))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// Whether the machine publishes memory pressure (the kernel-auto runner
/// needs it).
pub fn psi_available() -> bool {
    fs::read_to_string("/proc/pressure/memory").is_ok()
}
