//! How a swap space is configured: each device's size and kind
//! ([`SlotDeviceConfig`]), the seed switches ([`Switches`]) that
//! restore the behaviour before each seed, and the builder that gathers
//! them ([`SwapSpaceBuilder`]; its `build` is the space's, in mod.rs).

/// Where a solid-state device's linear scan starts (seed 001).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ScanBase {
    /// Each CPU has its own scan base (`cluster_next_cpu`), re-randomised
    /// when it crosses into another swap-cache trunk.
    #[default]
    PerCpu,
    /// One base shared by all CPUs: the behaviour before seed 001 (and the
    /// only one for rotational devices, where sequential IO matters more).
    Shared,
}

/// The seeds' mechanisms, each of which can be switched back to the
/// behaviour before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Switches {
    /// Per-CPU slot caches, refilled and returned 64 slots at a time.
    /// Off: every allocation and free takes the device lock.
    pub slot_cache: bool,
    /// Seed 000: after the first slot, scan up to `LATENCY_LIMIT` more
    /// slots even when no free cluster is left, so refills stay batched.
    /// Off: a fragmented device returns one slot per call.
    pub fragmented_scan: bool,
    /// Seed 001: per-CPU or shared scan base on solid-state devices.
    pub scan_base: ScanBase,
    /// Seed 003: a 2 MB unit takes one whole free cluster.  Off:
    /// `alloc_huge` always fails, so callers allocate 512 single slots.
    pub huge_cluster: bool,
    /// Kernel 6.12 (beyond the seeds): when no cluster is free, a CPU takes
    /// a nonfull (then a fragmented) cluster as its current cluster instead
    /// of scanning the map linearly.  Off: the seeds' linear scan.
    pub nonfull_clusters: bool,
}

impl Switches {
    /// The shipped configuration: every seed mechanism on, nothing past
    /// them (Linux 5.8's swap).
    pub const DEFAULT: Switches = Switches {
        slot_cache: true,
        fragmented_scan: true,
        scan_base: ScanBase::PerCpu,
        huge_cluster: true,
        nonfull_clusters: false,
    };

    /// Every combination of the switches (for tests).
    pub fn all() -> impl Iterator<Item = Switches> {
        (0..32u32).map(|b| Switches {
            slot_cache: b & 1 != 0,
            fragmented_scan: b & 2 != 0,
            scan_base: if b & 4 != 0 {
                ScanBase::PerCpu
            } else {
                ScanBase::Shared
            },
            huge_cluster: b & 8 != 0,
            nonfull_clusters: b & 16 != 0,
        })
    }
}

impl Default for Switches {
    fn default() -> Self {
        Switches::DEFAULT
    }
}

/// One device of a swap space.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotDeviceConfig {
    /// Slots, the header slot 0 included (so `slots - 1` pages of swap).
    pub slots: u64,
    /// Higher priorities are used first; equal priorities round-robin.
    pub priority: i32,
    /// Rotational (one shared scan base, sequential runs) or solid-state.
    pub rotational: bool,
    /// Its backing is allocated as slots are first written (a swap file
    /// that grows): clusters freed are taken again first, then partly used
    /// ones, and a cluster never used only when there is neither, so that
    /// the backing's written part stays as small as the use allows.
    /// Implies [`compact`](Self::compact).
    pub grows: bool,
    /// Hand out slots as a growing device does (freed clusters, then
    /// partly used ones, then one never used), whatever the backing.
    /// Off (the kernel's order): a freed cluster goes behind every one
    /// never used, and a device is swept whole before its first clusters
    /// are taken again.  Each slot's metadata (a file's seal, the swap
    /// cache's word) is committed at its first use and charged, in
    /// `uswap run`, to the program's budget, where the kernel's is not:
    /// swept whole, a 512 MiB encrypted swap file committed 4 MiB of
    /// seals and cache words in a process (sort) whose live swap was a
    /// fifth of it, under a budget of 40 MiB.
    pub compact: bool,
}

impl SlotDeviceConfig {
    /// A solid-state device of `slots` slots, priority 0.
    pub fn new(slots: u64) -> Self {
        SlotDeviceConfig {
            slots,
            priority: 0,
            rotational: false,
            grows: false,
            compact: false,
        }
    }

    /// Set the priority.
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// Mark the device rotational.
    pub fn rotational(mut self, rotational: bool) -> Self {
        self.rotational = rotational;
        self
    }

    /// Mark the device as one whose backing grows as it is written.
    pub fn grows(mut self, grows: bool) -> Self {
        self.grows = grows;
        self
    }

    /// Keep the slots handed out within the clusters used so far while
    /// any has room ([`SlotDeviceConfig::compact`]).
    pub fn compact(mut self, compact: bool) -> Self {
        self.compact = compact;
        self
    }
}

/// Builds a [`SwapSpace`](super::SwapSpace).
#[derive(Clone, Debug)]
pub struct SwapSpaceBuilder {
    pub(super) devices: Vec<SlotDeviceConfig>,
    pub(super) switches: Switches,
    pub(super) cpus: usize,
    pub(super) trunk_slots: u64,
    pub(super) seed: u64,
}

impl SwapSpaceBuilder {
    /// Add a device.
    pub fn device(mut self, d: SlotDeviceConfig) -> Self {
        self.devices.push(d);
        self
    }

    /// Set the seed switches.
    pub fn switches(mut self, s: Switches) -> Self {
        self.switches = s;
        self
    }

    /// Per-CPU structures to keep (default: the CPUs of this machine).
    pub fn cpus(mut self, n: usize) -> Self {
        self.cpus = n;
        self
    }

    /// The swap-cache trunk size the per-CPU scan bases spread over.
    pub fn trunk_slots(mut self, n: u64) -> Self {
        self.trunk_slots = n;
        self
    }

    /// Seed for the randomised scan bases (reproducible layouts).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
}
