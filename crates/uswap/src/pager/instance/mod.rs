//! One instance's state, and the operations both the fault and the
//! reclaim paths make on it.  From the ground up: page words and their
//! claims (`page.rs`), signal masks and uswap's threads (`signals.rs`),
//! one-line reports, page addresses, the fork gate, the overrun's bound,
//! the frame pools and the slots held for forked children; the parts of
//! [`Inner`] (`budget.rs`, `counters.rs`, `staged.rs`, `prefetch.rs`) and
//! `Inner` itself (`inner.rs`); then what works on it: the userfaultfd
//! moves and copies (`moves.rs`), slots taken and freed (`slots.rs`), the
//! table of published regions (`regions.rs`).
//!
//! [`Inner`]: inner::Inner

pub(crate) mod addrs;
pub(crate) mod background;
pub(crate) mod budget;
pub(crate) mod counters;
pub(crate) mod frames;
pub(crate) mod gate;
pub(crate) mod held;
#[cfg(test)]
pub(crate) mod inject;
pub(crate) mod inner;
pub(crate) mod moves;
pub(crate) mod overrun;
pub(crate) mod page;
pub(crate) mod prefetch;
pub(crate) mod regions;
pub(crate) mod report;
pub(crate) mod seal;
pub(crate) mod signals;
pub(crate) mod slots;
pub(crate) mod staged;
pub(crate) mod workingset;
