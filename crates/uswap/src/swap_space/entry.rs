//! A swap entry (a device and a slot on it, `swp_entry_t`), the limits
//! on both, and what can go wrong in the swap space.

/// Most devices in one swap space (`MAX_SWAPFILES`).
pub const MAX_DEVICES: usize = 32;

/// Most slots in one device: 2^32 slots are 16 TiB of swap and a 4 GiB
/// `swap_map`; beyond that the metadata alone is unreasonable.
pub const MAX_DEVICE_SLOTS: u64 = 1 << 32;

/// Slots per swap-cache trunk, the unit the per-CPU scan bases spread CPUs
/// over (`SWAP_ADDRESS_SPACE_PAGES`: 64 MB).
pub const TRUNK_SLOTS: u64 = 16384;

const OFFSET_BITS: u32 = 48;

/// A swap entry: device index and slot offset (`swp_entry_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SwapEntry(u64);

impl SwapEntry {
    /// No entry (offset 0 is every device's header, never allocated).
    pub const NONE: SwapEntry = SwapEntry(0);

    /// The entry for slot `offset` of device `device`.
    pub fn new(device: u16, offset: u64) -> Self {
        debug_assert!(offset < 1 << OFFSET_BITS);
        SwapEntry((device as u64) << OFFSET_BITS | offset)
    }

    /// The device index.
    pub fn device(self) -> u16 {
        (self.0 >> OFFSET_BITS) as u16
    }

    /// The slot offset within the device.
    pub fn offset(self) -> u64 {
        self.0 & ((1 << OFFSET_BITS) - 1)
    }

    /// The packed value.
    pub fn raw(self) -> u64 {
        self.0
    }
}

/// What can go wrong in the swap space.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SwapError {
    /// Every slot of every device is in use.
    #[error("swap space is full: all {slots} slots are in use; add a device or free slots")]
    Full {
        /// Slots there are.
        slots: u64,
    },
    /// No device has a whole free cluster for a 2 MB unit; allocate its 512
    /// pages one by one instead.
    #[error("no free 2 MB cluster on any device; fall back to single slots")]
    NoFreeCluster,
    /// The entry does not name an allocated slot.
    #[error("bad swap entry: device {device} slot {offset}: {reason}")]
    BadEntry {
        /// The device's index.
        device: u16,
        /// The slot on its device.
        offset: u64,
        /// Why.
        reason: &'static str,
    },
    /// The slot's use count cannot grow further.
    #[error("swap count overflow on device {device} slot {offset}: more than 2^32-1 references")]
    CountOverflow {
        /// The device's index.
        device: u16,
        /// The slot on its device.
        offset: u64,
    },
    /// A swap space needs at least one device.
    #[error("a swap space needs at least one device")]
    NoDevices,
    /// More devices than `MAX_DEVICES`.
    #[error("{0} devices given; at most {MAX_DEVICES} are supported")]
    TooManyDevices(usize),
    /// A device size that cannot work.
    #[error("device {device}: {slots} slots is {problem}; give between 2 (one header slot and one page) and {MAX_DEVICE_SLOTS} slots")]
    BadSize {
        /// The device's index.
        device: usize,
        /// The slots asked for.
        slots: u64,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// A configuration value out of range.
    #[error("invalid swap space configuration: {0}")]
    Config(String),
    /// The swap map or cluster table could not be allocated.
    #[error(transparent)]
    Table(#[from] crate::table::TableError),
}
