//! `uswap bench alloc` (placeholder until implemented).

use clap::Args;

use super::Common;

#[derive(Args, Debug)]
pub struct AllocArgs {
    #[command(flatten)]
    pub common: Common,
}

pub fn run(args: &AllocArgs) -> anyhow::Result<()> {
    args.common.validate()?;
    anyhow::bail!("bench alloc is not implemented yet")
}
