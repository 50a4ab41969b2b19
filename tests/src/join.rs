//! Nodes joined the way an operator joins them: `skiff-server token
//! create`, `skiff-agent join --server --token`, and the agent started on
//! the kubeconfig the join wrote, on top of the [`Cluster`] fixture.
//!
//! The joined credentials live in the cluster's run directory
//! (`join-<node>/`), so the cluster's cleanup removes them.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use anyhow::{ensure, Context, Result};

use crate::agent::workspace_binary;
use crate::cluster::{Cluster, NodeOptions};

/// The two CLIs, pointed at a cluster.
pub struct JoinCli {
    server_bin: PathBuf,
    agent_bin: PathBuf,
    admin_kubeconfig: PathBuf,
    server_url: String,
    dir: PathBuf,
}

/// What a command printed, and how it ended.
#[derive(Debug)]
pub struct Ran {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl From<Output> for Ran {
    fn from(o: Output) -> Ran {
        Ran {
            ok: o.status.success(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

impl JoinCli {
    /// # Errors
    /// A binary cannot be built.
    pub fn new(cluster: &Cluster) -> Result<JoinCli> {
        Ok(JoinCli {
            server_bin: workspace_binary("skiff-control-plane", "skiff-server")?,
            agent_bin: workspace_binary("skiff-agent", "skiff-agent")?,
            admin_kubeconfig: cluster.admin_kubeconfig(),
            server_url: cluster.server_url().to_string(),
            dir: cluster.dir().to_owned(),
        })
    }

    /// The API server's URL.
    pub fn server_url(&self) -> &str {
        &self.server_url
    }

    /// `skiff-server token ARGS --kubeconfig <admin>`.
    ///
    /// # Errors
    /// The binary cannot be run.
    pub fn token(&self, args: &[&str]) -> Result<Ran> {
        let out = Command::new(&self.server_bin)
            .arg("token")
            .args(args)
            .arg(format!("--kubeconfig={}", self.admin_kubeconfig.display()))
            .stdin(Stdio::null())
            .output()
            .context("running skiff-server token")?;
        Ok(out.into())
    }

    /// `skiff-server token create ARGS`; the printed join token.
    ///
    /// # Errors
    /// The command failed.
    pub fn token_create(&self, args: &[&str]) -> Result<String> {
        let mut all = vec!["create"];
        all.extend_from_slice(args);
        let r = self.token(&all)?;
        ensure!(r.ok, "skiff-server token create failed: {}", r.stderr);
        Ok(r.stdout.trim().to_string())
    }

    /// Where node `node`'s joined credentials go.
    pub fn config_dir(&self, node: &str) -> PathBuf {
        self.dir.join(format!("join-{node}"))
    }

    /// `skiff-agent join --server SERVER --token TOKEN --node-name NODE
    /// --config-dir <its dir>`, bounded by `--timeout 60s`.
    ///
    /// # Errors
    /// The binary cannot be run.
    pub fn join(&self, server: &str, token: &str, node: &str) -> Result<Ran> {
        let out = Command::new(&self.agent_bin)
            .args([
                "join",
                "--server",
                server,
                "--node-name",
                node,
                "--timeout",
                "60s",
            ])
            .arg(format!("--config-dir={}", self.config_dir(node).display()))
            // Through the environment, as an operator keeps it out of `ps`.
            .env("SKIFF_JOIN_TOKEN", token)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .output()
            .context("running skiff-agent join")?;
        Ok(out.into())
    }

    /// Join the cluster's next node with `token` and start its agent on
    /// the joined kubeconfig (`extra` agent flags added); returns its name
    /// once it is Ready.
    ///
    /// # Errors
    /// The join failed, or the node did not become Ready.
    pub async fn add_joined_node(
        &self,
        cluster: &mut Cluster,
        token: &str,
        extra: &[&str],
    ) -> Result<String> {
        let node = format!("node-{}", cluster.nodes().len() + 1);
        let r = self.join(&self.server_url, token, &node)?;
        ensure!(
            r.ok,
            "skiff-agent join of {node} failed: {}{}",
            r.stderr,
            r.stdout
        );
        let kubeconfig = kubeconfig_of(&self.config_dir(&node));
        // The fixture names the node node-<n> too; the later --kubeconfig
        // wins over the one it issues itself.
        let mut extra_args = vec![format!("--kubeconfig={}", kubeconfig.display())];
        extra_args.extend(extra.iter().map(|s| s.to_string()));
        let added = cluster
            .add_node(NodeOptions {
                extra_args,
                ..NodeOptions::default()
            })
            .await?;
        ensure!(
            added.name() == node,
            "expected {node}, the fixture made {}",
            added.name()
        );
        Ok(node)
    }
}

/// The kubeconfig a join wrote into `config_dir`.
pub fn kubeconfig_of(config_dir: &Path) -> PathBuf {
    config_dir.join("kubeconfig")
}

/// The client certificate-and-key file a join wrote into `config_dir`.
pub fn client_pem_of(config_dir: &Path) -> PathBuf {
    config_dir.join("pki").join("kubelet-client-current.pem")
}
