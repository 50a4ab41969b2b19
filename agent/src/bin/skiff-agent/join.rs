//! `skiff-agent join`.

use anyhow::{Context, Result};
use skiff_agent::certs::join::{self, JoinOptions};
use skiff_agent::config::{default_node_name, parse_duration};

use crate::cli::JoinArgs;

/// The join the flags ask for.
pub fn options(a: JoinArgs) -> Result<JoinOptions> {
    let timeout = parse_duration(&a.timeout).map_err(|e| anyhow::anyhow!("--timeout: {e}"))?;
    Ok(JoinOptions {
        server: a.server,
        token: a.token,
        node_name: a
            .node_name
            .map(|n| n.to_lowercase())
            .unwrap_or_else(default_node_name),
        config_dir: a.config_dir,
        timeout,
    })
}

pub async fn run(a: JoinArgs) -> Result<()> {
    let o = options(a)?;
    let joined = join::join(&o)
        .await
        .with_context(|| format!("joining {} as node {:?}", o.server, o.node_name))?;
    println!(
        "node {:?} joined; kubeconfig {} (start the agent with --config-dir {})",
        joined.node_name,
        joined.kubeconfig.display(),
        o.config_dir.display()
    );
    Ok(())
}
