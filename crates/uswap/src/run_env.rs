//! The environment `uswap run` hands its configuration to the preload
//! library in (`crates/uswap-cli/src/run.rs` writes it,
//! `crates/uswap-preload` reads it): one contract, named once.

/// The process tree's budget domain (`crate::domain`): `PID:FD`, the
/// supervisor (`uswap run`, the program's parent) and its memfd.  Every
/// process of the tree that loads the preload library is paged and joins
/// it.
pub const DOMAIN: &str = "USWAP_RUN_DOMAIN";
/// The exit status of `uswap run` when it fails itself (bad input, no
/// userfaultfd, a swap file it cannot make), before the program starts:
/// `docker run`'s and `podman run`'s, so that a wrapper tells it from the
/// program's own status and from a shell's 126 and 127 (not executable,
/// not found).
pub const RUN_FAILED: i32 = 125;
/// The budget, in bytes.
pub const BUDGET: &str = "USWAP_RUN_BUDGET";
/// The size of the heap region, in bytes.
pub const HEAP: &str = "USWAP_RUN_HEAP";
/// The swap devices, one swap spec per line (`uswap::spec`; paths
/// absolute).
pub const SWAP: &str = "USWAP_RUN_SWAP";
/// How far past the budget the heap may stay resident with the swap
/// full ([`crate::pager::Overrun`]'s form: `10%`, a size, `unbounded`).
pub const OVERRUN: &str = "USWAP_RUN_OVERRUN";
/// `sigbus` or `handler`.
pub const MODE: &str = "USWAP_RUN_MODE";
/// Set: print the statistics at exit.
pub const STATS: &str = "USWAP_RUN_STATS";
/// A path: write the statistics there at exit, as JSON.
pub const STATS_JSON: &str = "USWAP_RUN_STATS_JSON";

/// The largest heap the preload library can give its allocator: mimalloc
/// takes the region in arenas of at most 8 GiB, and holds 160 arenas.
pub const HEAP_MAX: u64 = 160 * (8 << 30);
/// What the heap's length is a multiple of: mimalloc's arena slice (64
/// KiB), itself a multiple of the page.
pub const HEAP_ALIGN: u64 = 64 << 10;

/// Set in SIGBUS mode with the system-call guard on: where the heap is
/// (`crates/uswap-preload/src/guard`), as [`GuardLayout`]'s `BASE:LEN:FILTERS`
/// in hexadecimal.  Every process of the run reads it: the paged one maps
/// its heap there, the others (past an `exec`, the filter inherited) map
/// the guard's trampoline.
pub const GUARD: &str = "USWAP_RUN_GUARD";

/// How many seccomp filters this process has (`Seccomp_filters:` in
/// /proc/self/status; 0 where the kernel does not say): `uswap run`
/// records it in [`GuardLayout::filters`], and an image of the process
/// that finds one more knows the guard's filter is there already.
pub fn seccomp_filters() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Seccomp_filters:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Where the guard's heap may start: from 64 TiB, in 4 GiB blocks, one of
/// 1024: far below where the kernel puts mappings (near 128 TiB) and the
/// executable (near 85 TiB), above where V8 (under 64 TiB) and Go (from
/// 768 GiB up) put theirs.
pub const GUARD_ZONE: u64 = 64 << 40;
/// The guard's unit: the filter tests a pointer's upper 32 bits alone.
pub const GUARD_BLOCK: u64 = 1 << 32;
const GUARD_CHOICES: u64 = 1024;

/// The guarded layout of a run: the heap at `base` (a block boundary),
/// `len` bytes; the guarded blocks `[lo << 32, hi << 32)`; the trampoline
/// page just below the heap; and how many seccomp filters the process
/// had before the guard added its own (a later image of the same
/// process, which inherits it, finds one more and adds none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuardLayout {
    pub base: u64,
    pub len: u64,
    pub filters: u32,
}

impl GuardLayout {
    /// A layout at a block of the zone picked by `random`.
    pub fn new(random: u64, len: u64, filters: u32) -> GuardLayout {
        GuardLayout {
            base: GUARD_ZONE + (random % GUARD_CHOICES) * GUARD_BLOCK,
            len,
            filters,
        }
    }

    /// The first guarded block's number (address >> 32).
    pub fn lo(&self) -> u32 {
        (self.base >> 32) as u32
    }

    /// One past the last guarded block's number.
    pub fn hi(&self) -> u32 {
        ((self.base + self.len).next_multiple_of(GUARD_BLOCK) >> 32) as u32
    }

    /// The trampoline page's address.
    pub fn trampoline(&self) -> u64 {
        self.base - crate::PAGE_SIZE as u64
    }

    /// The environment's form.
    pub fn to_env(&self) -> String {
        format!("{:x}:{:x}:{:x}", self.base, self.len, self.filters)
    }

    /// Read the environment's form; None when malformed.
    pub fn parse(s: &str) -> Option<GuardLayout> {
        let mut it = s.trim().split(':').map(|v| u64::from_str_radix(v, 16).ok());
        let (base, len, filters) = (it.next()??, it.next()??, it.next()??);
        (it.next().is_none() && base % GUARD_BLOCK == 0 && base >= GUARD_ZONE && len > 0).then_some(
            GuardLayout {
                base,
                len,
                filters: filters as u32,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guard_layout_round_trips_and_covers_its_heap() {
        for (r, len) in [(0, 1u64 << 20), (1023, 5 << 30), (77, 1 << 32), (5000, 1 << 40)] {
            let g = GuardLayout::new(r, len, 2);
            assert_eq!(GuardLayout::parse(&g.to_env()), Some(g));
            assert!(g.base >= GUARD_ZONE && g.base < GUARD_ZONE + GUARD_CHOICES * GUARD_BLOCK);
            assert!(u64::from(g.lo()) << 32 == g.base);
            assert!(u64::from(g.hi()) << 32 >= g.base + len);
            assert!((u64::from(g.hi()) << 32) - (g.base + len) < GUARD_BLOCK);
        }
        assert_eq!(GuardLayout::parse("zz:1:0"), None);
        assert_eq!(GuardLayout::parse("1000:1:0"), None);
    }
}
