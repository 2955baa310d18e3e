//! `uswap bench huge` (placeholder until implemented).

use clap::Args;

use super::Common;

#[derive(Args, Debug)]
pub struct HugeArgs {
    #[command(flatten)]
    pub common: Common,
}

pub fn run(args: &HugeArgs) -> anyhow::Result<()> {
    args.common.validate()?;
    anyhow::bail!("bench huge is not implemented yet")
}
