//! `zerotx send`.

use crate::options::SendArgs;

/// Runs `zerotx send`.
pub fn run(_args: SendArgs) -> anyhow::Result<()> {
    anyhow::bail!("zerotx send: not built yet")
}
