//! A fault served: a page or a 2 MB unit brought in, zero-filled, taken
//! back from the swap cache or read from its slot, and installed
//! (`serve.rs`); the pages after it read ahead (`readahead.rs`); and a
//! slow one's time told by cause (`stall.rs`).

pub(crate) mod bring;
pub(crate) mod readahead;
pub(crate) mod serve;
pub(crate) mod stall;
pub(crate) mod trend;
