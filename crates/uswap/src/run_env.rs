//! The environment `uswap run` hands its configuration to the preload
//! library in (`crates/uswap-cli/src/run.rs` writes it,
//! `crates/uswap-preload` reads it): one contract, named once.

/// The pid of the process to page: `uswap run` `exec`s the program, which
/// keeps it; a child of the program finds another pid and is not paged.
pub const PID: &str = "USWAP_RUN_PID";
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

/// The largest heap the preload library can give its allocator: mimalloc
/// takes the region in arenas of at most 8 GiB, and holds 160 arenas.
pub const HEAP_MAX: u64 = 160 * (8 << 30);
/// What the heap's length is a multiple of: mimalloc's arena slice (64
/// KiB), itself a multiple of the page.
pub const HEAP_ALIGN: u64 = 64 << 10;
