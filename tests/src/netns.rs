//! Nodes as network namespaces: each cluster node gets a namespace of its
//! own, joined to the host by a veth on a bridge of the cluster's, as
//! machines on one LAN are. The host side of the bridge holds the LAN's
//! first address (where the API server listens); node *i* gets
//! `.10 + i`.
//!
//! A node namespace has no default route: only its LAN, its pods (once its
//! agent configures them) and the service range, which is on-link so that
//! a packet no rule rewrote is answered by nobody instead of being routed
//! anywhere. Nothing can leave the machine.
//!
//! Everything is named after the cluster's run id (`skc<id>` for the
//! bridge, `skn-<id>-<i>` for namespaces, `skv<id><i>` for host-side
//! veths), so that [`sweep`] can remove a dead run's leftovers by name.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};

/// Where `ip netns` pins namespaces.
const NETNS_DIR: &str = "/run/netns";
/// Where the service ClusterIPs come from in tests (on-link in nodes).
pub const SERVICE_RANGE: &str = "198.19.0.0/16";

fn ip(args: &[&str]) -> Result<String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip (iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The cluster's LAN: a bridge in the host namespace on 198.18.`index`.0/24.
#[derive(Debug)]
pub struct Lan {
    id: String,
    index: u8,
    bridge: String,
}

/// One node's namespace on the LAN.
#[derive(Debug, Clone)]
pub struct NodeNs {
    pub name: String,
    pub ip: Ipv4Addr,
}

impl NodeNs {
    /// `/run/netns/<name>`, for `nsenter --net=`.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(NETNS_DIR).join(&self.name)
    }

    /// `ip -n <ns> ...`.
    ///
    /// # Errors
    /// The command failed.
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend(args);
        ip(&full)
    }

    /// A command run inside the namespace (network only, as DESIGN says:
    /// `ip netns exec` would remount /sys and hide the cgroup mounts).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", self.path().display()))
            .arg("--")
            .arg(program);
        c
    }

    /// Like [`Self::command`], as a tokio command.
    pub fn tokio_command(&self, program: impl AsRef<std::ffi::OsStr>) -> tokio::process::Command {
        tokio::process::Command::from(self.command(program))
    }
}

impl Lan {
    /// Creates the bridge `skc<id>` with 198.18.`index`.1/24.
    ///
    /// # Errors
    /// `ip` failed (not root, name taken); whatever was made is removed.
    pub fn create(id: &str, index: u8) -> Result<Lan> {
        let lan = Lan {
            id: id.to_string(),
            index,
            bridge: format!("skc{id}"),
        };
        let make = || -> Result<()> {
            ip(&["link", "add", &lan.bridge, "type", "bridge"])?;
            ip(&[
                "addr",
                "add",
                &format!("{}/24", lan.gateway()),
                "dev",
                &lan.bridge,
            ])?;
            ip(&["link", "set", &lan.bridge, "up"])?;
            Ok(())
        };
        if let Err(e) = make() {
            lan.remove();
            return Err(e);
        }
        Ok(lan)
    }

    /// The host's address on the LAN, 198.18.`index`.1.
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, self.index, 1)
    }

    /// `198.18.index.0/24`.
    pub fn cidr(&self) -> String {
        format!("198.18.{}.0/24", self.index)
    }

    /// Creates node `i`'s namespace, cabled to the bridge.
    ///
    /// # Errors
    /// `ip` failed; whatever was made for this node is removed.
    pub fn add_node(&self, i: u8) -> Result<NodeNs> {
        let node = NodeNs {
            name: format!("skn-{}-{i}", self.id),
            ip: Ipv4Addr::new(198, 18, self.index, 10 + i),
        };
        let host_end = format!("skv{}{i}", self.id);
        let make = || -> Result<()> {
            ip(&["netns", "add", &node.name])?;
            ip(&[
                "link", "add", &host_end, "type", "veth", "peer", "name", "eth0", "netns",
                &node.name,
            ])?;
            ip(&["link", "set", &host_end, "master", &self.bridge])?;
            ip(&["link", "set", &host_end, "up"])?;
            node.ip(&["link", "set", "lo", "up"])?;
            node.ip(&["addr", "add", &format!("{}/24", node.ip), "dev", "eth0"])?;
            node.ip(&["link", "set", "eth0", "up"])?;
            node.ip(&[
                "route",
                "add",
                SERVICE_RANGE,
                "dev",
                "eth0",
                "src",
                &node.ip.to_string(),
            ])?;
            Ok(())
        };
        if let Err(e) = make() {
            let _ = ip(&["netns", "del", &node.name]);
            let _ = ip(&["link", "del", &host_end]);
            return Err(e.context(format!("creating node namespace {}", node.name)));
        }
        Ok(node)
    }

    /// Removes the namespaces and the bridge (the veths go with them).
    pub fn remove(&self) -> Vec<String> {
        sweep(&self.id)
    }
}

/// Removes run `id`'s node namespaces and bridge, whatever exists of them;
/// the errors of removals that failed.
pub fn sweep(id: &str) -> Vec<String> {
    let mut errors = Vec::new();
    let prefix = format!("skn-{id}-");
    if let Ok(entries) = std::fs::read_dir(NETNS_DIR) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(&prefix) {
                if let Err(e) = ip(&["netns", "del", &name]) {
                    errors.push(format!("{e:#}"));
                }
            }
        }
    }
    let bridge = format!("skc{id}");
    if crate::cleanup::link_exists(&bridge) {
        if let Err(e) = ip(&["link", "del", &bridge]) {
            errors.push(format!("{e:#}"));
        }
    }
    errors
}
