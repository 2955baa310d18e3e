//! `uswap bench extent` (placeholder until implemented).

use clap::Args;

use super::Common;

#[derive(Args, Debug)]
pub struct ExtentArgs {
    #[command(flatten)]
    pub common: Common,
}

pub fn run(args: &ExtentArgs) -> anyhow::Result<()> {
    args.common.validate()?;
    anyhow::bail!("bench extent is not implemented yet")
}
