//! What a user holds: [`SwapBuilder`] configures and builds an instance,
//! [`Swap`] is the instance, [`Region`] a mapping it pages, [`PagerError`]
//! what can go wrong.  Everything here calls into the parts below.
//!
//! [`SwapBuilder`]: builder::SwapBuilder
//! [`Swap`]: swap::Swap
//! [`Region`]: region::Region
//! [`PagerError`]: error::PagerError

pub(crate) mod builder;
pub(crate) mod error;
pub(crate) mod region;
pub(crate) mod swap;
