//! Reclaim: how much to evict and from where (`reclaim.rs`, the pass);
//! small pages out in batches, or one by one (`batch.rs`); 2 MB units out
//! whole (`unit.rs`); staged pages written to their
//! slots (`writeback.rs`); the run of slots and IO one unit of work takes
//! (`folio.rs`).

pub(crate) mod batch;
pub(crate) mod folio;
pub(crate) mod reclaim;
pub(crate) mod unit;
pub(crate) mod writeback;
