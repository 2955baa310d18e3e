//! A fault served: a page or a 2 MB unit brought in, zero-filled, taken
//! back from the swap cache or read from its slot, and installed
//! (`serve.rs`); and the pages after it read ahead (`readahead.rs`).

pub(crate) mod readahead;
pub(crate) mod serve;
