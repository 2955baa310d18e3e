//! Where work comes in: faults, on the faulting thread (`sigbus.rs`, on
//! a stack with room, `altstack.rs`) or on handler threads, the
//! background threads (`threads.rs`), and a `fork` (`fork.rs`).  Nothing
//! below calls back up here.

pub(crate) mod altstack;
pub(crate) mod fork;
pub(crate) mod sigbus;
pub(crate) mod threads;
