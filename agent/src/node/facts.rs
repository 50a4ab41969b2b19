//! Facts about this node for its Node object: capacity and allocatable
//! (cpu, memory, pods, ephemeral-storage), addresses, and nodeInfo (kernel,
//! OS image, container runtime version), read from procfs and the system;
//! and the Node object built from them.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;

use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeStatus,
    NodeSystemInfo,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

/// Memory the kubelet keeps back by default (`memory.available<100Mi`).
const EVICTION_MEMORY_BYTES: u64 = 100 << 20;
/// `nodefs.available<10%`.
const EVICTION_NODEFS_PERCENT: u64 = 10;

/// The version the agent reports as kubeletVersion: the Kubernetes API it
/// speaks, tagged with ours.
pub const AGENT_VERSION: &str = concat!("v1.33.0-skiff.", env!("CARGO_PKG_VERSION"));

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    pub cpus: u64,
    pub memory_bytes: u64,
    pub ephemeral_bytes: u64,
    pub max_pods: u32,
    pub kernel: String,
    pub os_image: String,
    pub machine_id: String,
    pub boot_id: String,
    pub system_uuid: String,
    pub architecture: String,
    pub hostname: String,
    pub internal_ip: Option<IpAddr>,
    /// The node server's port, reported as
    /// `status.daemonEndpoints.kubeletEndpoint.port` (where the API server
    /// connects for logs, exec and port-forward); 0 when it is off.
    pub kubelet_port: u16,
}

impl Facts {
    /// Read the facts; `root_dir` is the filesystem whose size is the
    /// node's ephemeral storage.
    pub fn gather(root_dir: &Path, max_pods: u32) -> Facts {
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get() as u64)
            .unwrap_or(1);
        let memory_bytes = procfs::Current::current()
            .map(|m: procfs::Meminfo| m.mem_total)
            .unwrap_or(0);
        let ephemeral_bytes = nix::sys::statvfs::statvfs(root_dir)
            .or_else(|_| nix::sys::statvfs::statvfs("/"))
            .map(|s| s.blocks() * s.fragment_size())
            .unwrap_or(0);
        let uname = nix::sys::utsname::uname().ok();
        let read = |p: &str| {
            std::fs::read_to_string(p)
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        };
        let os_image = std::fs::read_to_string("/etc/os-release")
            .ok()
            .and_then(|t| {
                t.lines().find_map(|l| {
                    l.strip_prefix("PRETTY_NAME=")
                        .map(|v| v.trim_matches('"').to_string())
                })
            })
            .unwrap_or_else(|| "Linux".into());
        let architecture = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            other => other,
        }
        .to_string();
        Facts {
            cpus,
            memory_bytes,
            ephemeral_bytes,
            max_pods,
            kernel: uname
                .as_ref()
                .map(|u| u.release().to_string_lossy().into_owned())
                .unwrap_or_default(),
            os_image,
            machine_id: read("/etc/machine-id"),
            boot_id: read("/proc/sys/kernel/random/boot_id"),
            system_uuid: read("/sys/class/dmi/id/product_uuid"),
            architecture,
            hostname: crate::config::default_node_name(),
            internal_ip: primary_ip(),
            kubelet_port: 0,
        }
    }

    pub fn capacity(&self) -> BTreeMap<String, Quantity> {
        BTreeMap::from([
            ("cpu".into(), Quantity(self.cpus.to_string())),
            (
                "memory".into(),
                Quantity(format!("{}Ki", self.memory_bytes / 1024)),
            ),
            ("pods".into(), Quantity(self.max_pods.to_string())),
            (
                "ephemeral-storage".into(),
                Quantity(format!("{}Ki", self.ephemeral_bytes / 1024)),
            ),
        ])
    }

    /// Capacity minus the kubelet's default hard eviction thresholds.
    pub fn allocatable(&self) -> BTreeMap<String, Quantity> {
        let mem = self.memory_bytes.saturating_sub(EVICTION_MEMORY_BYTES);
        let eph = self.ephemeral_bytes - self.ephemeral_bytes * EVICTION_NODEFS_PERCENT / 100;
        BTreeMap::from([
            ("cpu".into(), Quantity(self.cpus.to_string())),
            ("memory".into(), Quantity(format!("{}Ki", mem / 1024))),
            ("pods".into(), Quantity(self.max_pods.to_string())),
            ("ephemeral-storage".into(), Quantity(eph.to_string())),
        ])
    }

    /// The Node object as this agent sees itself.
    pub fn node(
        &self,
        name: &str,
        runtime_version: &str,
        runtime_ready: Result<(), String>,
    ) -> Node {
        let now = Time(jiff::Timestamp::now());
        let mut addresses = Vec::new();
        if let Some(ip) = self.internal_ip {
            addresses.push(NodeAddress {
                type_: "InternalIP".into(),
                address: ip.to_string(),
            });
        }
        addresses.push(NodeAddress {
            type_: "Hostname".into(),
            address: self.hostname.clone(),
        });
        let (ready, reason, message) = match runtime_ready {
            Ok(()) => (
                "True",
                "KubeletReady",
                "kubelet is posting ready status".to_string(),
            ),
            Err(e) => ("False", "KubeletNotReady", e),
        };
        let pressure = |t: &str, reason: &str, msg: &str| NodeCondition {
            type_: t.into(),
            status: "False".into(),
            reason: Some(reason.into()),
            message: Some(msg.into()),
            last_heartbeat_time: Some(now.clone()),
            ..Default::default()
        };
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(BTreeMap::from([
                    ("kubernetes.io/hostname".into(), name.into()),
                    ("kubernetes.io/os".into(), "linux".into()),
                    ("kubernetes.io/arch".into(), self.architecture.clone()),
                ])),
                ..Default::default()
            },
            spec: None,
            status: Some(NodeStatus {
                capacity: Some(self.capacity()),
                allocatable: Some(self.allocatable()),
                addresses: Some(addresses),
                daemon_endpoints: (self.kubelet_port != 0).then(|| NodeDaemonEndpoints {
                    kubelet_endpoint: Some(DaemonEndpoint {
                        port: i32::from(self.kubelet_port),
                    }),
                }),
                conditions: Some(vec![
                    pressure(
                        "MemoryPressure",
                        "KubeletHasSufficientMemory",
                        "kubelet has sufficient memory available",
                    ),
                    pressure(
                        "DiskPressure",
                        "KubeletHasNoDiskPressure",
                        "kubelet has no disk pressure",
                    ),
                    pressure(
                        "PIDPressure",
                        "KubeletHasSufficientPID",
                        "kubelet has sufficient PID available",
                    ),
                    NodeCondition {
                        type_: "Ready".into(),
                        status: ready.into(),
                        reason: Some(reason.into()),
                        message: Some(message),
                        last_heartbeat_time: Some(now.clone()),
                        ..Default::default()
                    },
                ]),
                node_info: Some(NodeSystemInfo {
                    architecture: self.architecture.clone(),
                    boot_id: self.boot_id.clone(),
                    container_runtime_version: runtime_version.into(),
                    kernel_version: self.kernel.clone(),
                    kube_proxy_version: AGENT_VERSION.into(),
                    kubelet_version: AGENT_VERSION.into(),
                    machine_id: self.machine_id.clone(),
                    operating_system: "linux".into(),
                    os_image: self.os_image.clone(),
                    system_uuid: self.system_uuid.clone(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        }
    }
}

/// The source address of the default route, without sending anything: a
/// connected UDP socket only asks the kernel for a route.
fn primary_ip() -> Option<IpAddr> {
    let sock = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    // RFC 2544 benchmarking range: never a real destination, and connect()
    // on UDP sends no packet.
    sock.connect("198.18.255.254:9").ok()?;
    let ip = sock.local_addr().ok()?.ip();
    (!ip.is_unspecified()).then_some(ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_are_plausible() {
        let f = Facts::gather(Path::new("/"), 110);
        assert!(f.cpus >= 1);
        assert!(f.memory_bytes > 64 << 20);
        assert!(f.ephemeral_bytes > 0);
        assert!(!f.kernel.is_empty());
        let node = f.node("n1", "containerd://1.6.20", Ok(()));
        let st = node.status.unwrap();
        assert_eq!(st.capacity.unwrap()["pods"].0, "110");
        assert_eq!(
            st.node_info.unwrap().container_runtime_version,
            "containerd://1.6.20"
        );
        let alloc = st.allocatable.unwrap();
        assert!(alloc.contains_key("ephemeral-storage"));
    }
}
