//! The node's pod network: here the CNI configuration (a bridge over the
//! node's pod CIDR with host-local IPAM and portmap, written into the
//! runtime's CNI conf dir once the CIDR is known; containerd's CRI plugin
//! watches that directory and reports NetworkReady=false until one
//! appears), and in [`routes`] the routes to the other nodes' pods.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::watch;

pub mod masquerade;
pub mod routes;

/// A destination: network address and prefix length (a pod CIDR). Here,
/// beside both users: [`routes`] computes them, [`masquerade`] writes them.
pub type Cidr = (std::net::Ipv4Addr, u8);

/// Undo what the agent programmed into the kernel for the pod network:
/// its routes to the other nodes' pod CIDRs and its masquerade table.
///
/// # Errors
/// Every step is tried; the failures are reported together.
pub async fn cleanup() -> anyhow::Result<()> {
    let mut failed = Vec::new();
    if let Err(errors) = routes::remove_all().await {
        failed.extend(errors.iter().map(ToString::to_string));
    }
    if skiff_proxy::exec::available("nft").await {
        if let Err(e) = skiff_proxy::exec::nft(&masquerade::remove_script()).await {
            failed.push(format!("removing table ip {}: {e}", masquerade::TABLE));
        }
    }
    anyhow::ensure!(failed.is_empty(), "{}", failed.join("; "));
    Ok(())
}

/// The file the agent owns in the CNI conf dir. `10-` sorts it before
/// most distribution defaults, and containerd loads the first file.
pub const CONFLIST_FILE: &str = "10-skiff.conflist";

/// How long to wait before writing again after a failed write.
const RETRY: Duration = Duration::from_secs(10);

/// Failures building or writing the CNI configuration.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The pod CIDR is not `ADDRESS/PREFIX`.
    #[error("invalid pod CIDR {cidr:?}: {why} (expected e.g. 10.244.1.0/24)")]
    Cidr { cidr: String, why: String },
    /// The file could not be written or renamed into place.
    #[error("writing CNI configuration {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What the configuration is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniSettings {
    /// Bridge name, also the network name: unique per node, so host-local's
    /// state (kept per network name) never collides with another network.
    pub bridge: String,
    pub pod_cidr: String,
    /// host-local's state directory (`<root_dir>/cni/networks`).
    pub data_dir: PathBuf,
}

/// The conflist text: bridge (gateway, no masquerade, hairpin) with
/// host-local IPAM over the pod CIDR, then portmap for hostPorts.
///
/// # Errors
/// The CIDR does not parse, or leaves no room for a gateway.
pub fn conflist(s: &CniSettings) -> Result<String> {
    let (subnet, gateway, default_route) = parse_cidr(&s.pod_cidr)?;
    let conf = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": s.bridge,
        "plugins": [
            {
                "type": "bridge",
                "bridge": s.bridge,
                "isGateway": true,
                // Pod traffic is never NATed off the host by the bridge.
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{ "subnet": subnet, "gateway": gateway.to_string() }]],
                    "routes": [{ "dst": default_route }],
                    "dataDir": s.data_dir,
                }
            },
            { "type": "portmap", "capabilities": { "portMappings": true } }
        ]
    });
    Ok(format!(
        "{}\n",
        serde_json::to_string_pretty(&conf).unwrap_or_default()
    ))
}

/// The pod network's gateway on this node (the bridge's address): the
/// first address of the pod CIDR.
pub fn gateway(pod_cidr: &str) -> Option<IpAddr> {
    parse_cidr(pod_cidr).ok().map(|(_, gw, _)| gw)
}

/// The canonical subnet (host bits cleared), its first address as the
/// gateway, and the default route of its family.
fn parse_cidr(cidr: &str) -> Result<(String, IpAddr, &'static str)> {
    let bad = |why: &str| Error::Cidr {
        cidr: cidr.to_string(),
        why: why.to_string(),
    };
    let (addr, prefix) = cidr.split_once('/').ok_or_else(|| bad("no /PREFIX"))?;
    let addr: IpAddr = addr.parse().map_err(|_| bad("not an IP address"))?;
    let prefix: u32 = prefix.parse().map_err(|_| bad("prefix is not a number"))?;
    match addr {
        IpAddr::V4(a) => {
            if prefix > 30 {
                return Err(bad("prefix must be at most /30 to leave room for pods"));
            }
            let mask = u32::MAX.checked_shl(32 - prefix).unwrap_or(0);
            let net = u32::from(a) & mask;
            let gw = std::net::Ipv4Addr::from(net + 1);
            let subnet = format!("{}/{prefix}", std::net::Ipv4Addr::from(net));
            Ok((subnet, IpAddr::V4(gw), "0.0.0.0/0"))
        }
        IpAddr::V6(a) => {
            if prefix > 126 {
                return Err(bad("prefix must be at most /126 to leave room for pods"));
            }
            let mask = u128::MAX.checked_shl(128 - prefix).unwrap_or(0);
            let net = u128::from(a) & mask;
            let gw = std::net::Ipv6Addr::from(net + 1);
            let subnet = format!("{}/{prefix}", std::net::Ipv6Addr::from(net));
            Ok((subnet, IpAddr::V6(gw), "::/0"))
        }
    }
}

/// Write `content` as `<dir>/10-skiff.conflist` unless it already holds
/// exactly that. Atomic: a temporary file renamed over the old one, so
/// containerd's watcher never reads half a file. Returns whether it wrote.
///
/// # Errors
/// The directory cannot be created or written.
pub fn ensure(dir: &Path, content: &str) -> Result<bool> {
    let path = dir.join(CONFLIST_FILE);
    if std::fs::read_to_string(&path).is_ok_and(|old| old == content) {
        return Ok(false);
    }
    std::fs::create_dir_all(dir).map_err(|source| Error::Write {
        path: dir.to_path_buf(),
        source,
    })?;
    // A dot-name without the .conflist suffix: libcni ignores it.
    let tmp = dir.join(format!(".{CONFLIST_FILE}.tmp"));
    std::fs::write(&tmp, content)
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|source| {
            let _ = std::fs::remove_file(&tmp);
            Error::Write {
                path: path.clone(),
                source,
            }
        })?;
    Ok(true)
}

/// Keeps the CNI configuration in step with the pod CIDR.
pub struct Network {
    /// `<cni_conf_dir>`.
    pub conf_dir: PathBuf,
    pub bridge: String,
    pub data_dir: PathBuf,
}

impl Network {
    /// From the agent's configuration; None when `cni_conf_dir` is unset
    /// (the operator manages CNI).
    pub fn from_config(config: &crate::Config) -> Option<Network> {
        Some(Network {
            conf_dir: config.cni_conf_dir.clone()?,
            bridge: config.cni_bridge.clone(),
            data_dir: config.root_dir.join("cni").join("networks"),
        })
    }

    /// Write the configuration for `cidr` if it differs from what is there.
    ///
    /// # Errors
    /// Invalid CIDR, or the file could not be written.
    pub fn sync(&self, cidr: &str) -> Result<bool> {
        let text = conflist(&CniSettings {
            bridge: self.bridge.clone(),
            pod_cidr: cidr.to_string(),
            data_dir: self.data_dir.clone(),
        })?;
        ensure(&self.conf_dir, &text)
    }

    /// Follow `cidr` (sender: the node agent; None until known) until it
    /// closes or `stop` turns true. Failed writes are retried.
    pub async fn run(
        self,
        mut cidr: watch::Receiver<Option<String>>,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut failed = false;
        loop {
            let current = cidr.borrow_and_update().clone();
            if let Some(c) = current.as_deref() {
                match self.sync(c) {
                    Ok(true) => {
                        failed = false;
                        tracing::info!(
                            pod_cidr = c,
                            path = %self.conf_dir.join(CONFLIST_FILE).display(),
                            "wrote CNI configuration"
                        );
                    }
                    Ok(false) => failed = false,
                    Err(e) => {
                        if !failed {
                            tracing::error!("{e}; retrying every {RETRY:?}");
                        }
                        failed = true;
                    }
                }
            }
            tokio::select! {
                r = cidr.changed() => if r.is_err() { return },
                () = crate::backoff::retry_after(failed, RETRY) => {}
                r = stop.wait_for(|s| *s) => { let _ = r; return }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateway_is_first_address_of_the_subnet() {
        let s = CniSettings {
            bridge: "skiff0".into(),
            pod_cidr: "198.18.3.7/24".into(),
            data_dir: "/var/lib/skiff-agent/cni/networks".into(),
        };
        let v: serde_json::Value = serde_json::from_str(&conflist(&s).unwrap()).unwrap();
        assert_eq!(v["name"], "skiff0");
        let bridge = &v["plugins"][0];
        assert_eq!(bridge["bridge"], "skiff0");
        assert_eq!(bridge["isGateway"], true);
        assert_eq!(bridge["ipMasq"], false);
        let range = &bridge["ipam"]["ranges"][0][0];
        assert_eq!(range["subnet"], "198.18.3.0/24");
        assert_eq!(range["gateway"], "198.18.3.1");
        assert_eq!(
            bridge["ipam"]["dataDir"],
            "/var/lib/skiff-agent/cni/networks"
        );
        assert_eq!(v["plugins"][1]["capabilities"]["portMappings"], true);

        let (subnet, gw, route) = parse_cidr("fd00:1::5/64").unwrap();
        assert_eq!(subnet, "fd00:1::/64");
        assert_eq!(gw.to_string(), "fd00:1::1");
        assert_eq!(route, "::/0");
        assert!(parse_cidr("198.18.0.0").is_err());
        assert!(parse_cidr("198.18.0.0/31").is_err());
        assert!(parse_cidr("nope/24").is_err());
    }

    #[test]
    fn writes_only_when_content_changes() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("net.d");
        assert!(ensure(&conf, "a").unwrap());
        assert!(!ensure(&conf, "a").unwrap());
        assert!(ensure(&conf, "b").unwrap());
        let names: Vec<_> = std::fs::read_dir(&conf)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec![CONFLIST_FILE.to_string()]);
        assert_eq!(
            std::fs::read_to_string(conf.join(CONFLIST_FILE)).unwrap(),
            "b"
        );
    }
}
