//! Reclaim: how much to evict and from where (`reclaim.rs`, the pass);
//! small pages out in batches (`batch.rs`); staged pages written to their
//! slots (`writeback.rs`); the run of slots and IO one unit of work takes
//! (`folio.rs`).

pub(crate) mod batch;
pub(crate) mod folio;
pub(crate) mod reclaim;
pub(crate) mod writeback;
