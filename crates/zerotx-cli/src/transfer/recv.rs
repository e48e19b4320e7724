//! `zerotx recv`.

use crate::options::RecvArgs;

/// Runs `zerotx recv`.
pub fn run(_args: RecvArgs) -> anyhow::Result<()> {
    anyhow::bail!("zerotx recv: not built yet")
}
