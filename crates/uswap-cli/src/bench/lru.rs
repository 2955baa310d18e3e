//! `uswap bench lru` (placeholder until implemented).

use clap::Args;

use super::Common;

#[derive(Args, Debug)]
pub struct LruArgs {
    #[command(flatten)]
    pub common: Common,
}

pub fn run(args: &LruArgs) -> anyhow::Result<()> {
    args.common.validate()?;
    anyhow::bail!("bench lru is not implemented yet")
}
