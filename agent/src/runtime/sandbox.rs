//! PodSandboxConfig from a Pod, as the kubelet's `generatePodSandboxConfig`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use cri_proto::v1;
use k8s_openapi::api::core::v1::Pod;

use super::labels;
use super::security::{self, NodeSecurity};
use crate::pod::PodExt;

/// Where the node's own resolver configuration lives.
const HOST_RESOLV_CONF: &str = "/etc/resolv.conf";

/// What the sandbox needs from the agent's configuration.
pub struct SandboxContext<'a> {
    pub pod_log_dir: &'a Path,
    pub cluster_dns: &'a [String],
    pub cluster_domain: &'a str,
    /// Seccomp root and AppArmor of the node.
    pub node: NodeSecurity<'a>,
}

/// `/var/log/pods/<namespace>_<name>_<uid>`.
pub fn pod_log_dir(root: &Path, pod: &Pod) -> PathBuf {
    root.join(format!("{}_{}_{}", pod.namespace(), pod.name(), pod.uid()))
}

pub fn sandbox_config(pod: &Pod, attempt: u32, ctx: &SandboxContext) -> v1::PodSandboxConfig {
    let spec = pod.spec.clone().unwrap_or_default();
    let mut sandbox_labels: HashMap<String, String> = pod
        .metadata
        .labels
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    sandbox_labels.insert(labels::POD_NAME.into(), pod.name().into());
    sandbox_labels.insert(labels::POD_NAMESPACE.into(), pod.namespace().into());
    sandbox_labels.insert(labels::POD_UID.into(), pod.uid().into());
    sandbox_labels.insert(labels::MANAGED_BY.into(), labels::MANAGED_BY_VALUE.into());
    let mut annotations: HashMap<String, String> = pod
        .metadata
        .annotations
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    annotations.insert(
        labels::POD_GRACE_PERIOD.into(),
        pod.grace_period_seconds().to_string(),
    );

    let host_network = spec.host_network.unwrap_or(false);
    let port_mappings = spec
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.host_port.unwrap_or(0) > 0)
        .map(|p| v1::PortMapping {
            protocol: protocol(p.protocol.as_deref()) as i32,
            container_port: p.container_port,
            host_port: p.host_port.unwrap_or(0),
            host_ip: p.host_ip.clone().unwrap_or_default(),
        })
        .collect();

    let mut security_context = security::sandbox_security(pod, &ctx.node);
    security_context.namespace_options = Some(namespace_options(pod));
    // Sysctls reach here only when admitted (`admit`); slash-separated
    // names are given with dots, as the kubelet does.
    let sysctls = spec
        .security_context
        .iter()
        .flat_map(|s| s.sysctls.iter().flatten())
        .map(|s| (security::normalize_sysctl(&s.name), s.value.clone()))
        .collect();

    v1::PodSandboxConfig {
        metadata: Some(v1::PodSandboxMetadata {
            name: pod.name().into(),
            uid: pod.uid().into(),
            namespace: pod.namespace().into(),
            attempt,
        }),
        hostname: if host_network {
            String::new()
        } else {
            hostname(pod)
        },
        log_directory: pod_log_dir(ctx.pod_log_dir, pod).display().to_string(),
        dns_config: Some(dns_config(pod, ctx)),
        port_mappings,
        labels: sandbox_labels,
        annotations,
        linux: Some(v1::LinuxPodSandboxConfig {
            cgroup_parent: String::new(),
            security_context: Some(security_context),
            sysctls,
            overhead: overhead(pod),
            ..Default::default()
        }),
    }
}

/// The pod's overhead (set by its RuntimeClass) for the runtime, as the
/// kubelet's `convertOverheadToLinuxResources`: requests equal limits.
fn overhead(pod: &Pod) -> Option<v1::LinuxContainerResources> {
    let overhead = pod.spec.as_ref()?.overhead.as_ref()?;
    let cpu = overhead
        .get("cpu")
        .and_then(|q| super::resources::parse_cpu_millis(&q.0));
    let memory = overhead
        .get("memory")
        .and_then(|q| super::resources::parse_bytes(&q.0));
    Some(super::resources::linux_resources(cpu, cpu, memory))
}

pub fn protocol(p: Option<&str>) -> v1::Protocol {
    match p {
        Some("UDP") => v1::Protocol::Udp,
        Some("SCTP") => v1::Protocol::Sctp,
        _ => v1::Protocol::Tcp,
    }
}

/// Host namespaces as the pod asks; shareProcessNamespace gives one PID
/// namespace for the whole pod.
pub fn namespace_options(pod: &Pod) -> v1::NamespaceOption {
    let spec = pod.spec.clone().unwrap_or_default();
    let mode = |host: Option<bool>, otherwise: v1::NamespaceMode| {
        if host.unwrap_or(false) {
            v1::NamespaceMode::Node as i32
        } else {
            otherwise as i32
        }
    };
    let pid_default = if spec.share_process_namespace.unwrap_or(false) {
        v1::NamespaceMode::Pod
    } else {
        v1::NamespaceMode::Container
    };
    v1::NamespaceOption {
        network: mode(spec.host_network, v1::NamespaceMode::Pod),
        pid: mode(spec.host_pid, pid_default),
        ipc: mode(spec.host_ipc, v1::NamespaceMode::Pod),
        ..Default::default()
    }
}

/// `spec.hostname`, else the pod name, cut to a DNS label.
fn hostname(pod: &Pod) -> String {
    let spec = pod.spec.as_ref();
    let name = spec
        .and_then(|s| s.hostname.clone())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| pod.name().to_string());
    let mut h: String = name.chars().take(63).collect();
    while h.ends_with(['-', '.']) {
        h.pop();
    }
    h
}

/// The pod's resolv.conf, by dnsPolicy (kubelet `dns.GetPodDNS`): cluster
/// DNS for ClusterFirst (the host's resolvers when no cluster DNS is
/// configured, as the kubelet falls back), the host's for Default, only
/// dnsConfig for None; dnsConfig is appended in every case.
pub fn dns_config(pod: &Pod, ctx: &SandboxContext) -> v1::DnsConfig {
    let spec = pod.spec.clone().unwrap_or_default();
    let host_network = spec.host_network.unwrap_or(false);
    let policy = spec.dns_policy.as_deref().unwrap_or("ClusterFirst");
    let cluster = match policy {
        "ClusterFirst" => !host_network,
        "ClusterFirstWithHostNet" => true,
        _ => false,
    } && !ctx.cluster_dns.is_empty();
    let mut cfg = if policy == "None" {
        v1::DnsConfig::default()
    } else if cluster {
        let ns = pod.namespace();
        let d = ctx.cluster_domain;
        let mut searches = vec![format!("{ns}.svc.{d}"), format!("svc.{d}"), d.to_string()];
        searches.extend(read_resolv_conf(Path::new(HOST_RESOLV_CONF)).searches);
        v1::DnsConfig {
            servers: ctx.cluster_dns.to_vec(),
            searches,
            options: vec!["ndots:5".into()],
        }
    } else {
        read_resolv_conf(Path::new(HOST_RESOLV_CONF))
    };
    if let Some(extra) = spec.dns_config {
        cfg.servers.extend(extra.nameservers.unwrap_or_default());
        cfg.searches.extend(extra.searches.unwrap_or_default());
        for o in extra.options.unwrap_or_default() {
            let name = o.name.unwrap_or_default();
            // A pod option overrides a default with the same name (ndots).
            cfg.options
                .retain(|x| x.split(':').next() != Some(name.as_str()));
            cfg.options.push(match o.value {
                Some(v) => format!("{name}:{v}"),
                None => name,
            });
        }
    }
    // glibc reads at most 3 nameservers and 6 search domains.
    cfg.servers.truncate(3);
    cfg.searches.dedup();
    cfg.searches.truncate(6);
    cfg
}

/// The host's resolv.conf as a DNS config; empty when unreadable.
pub fn read_resolv_conf(path: &Path) -> v1::DnsConfig {
    let mut cfg = v1::DnsConfig::default();
    let Ok(text) = std::fs::read_to_string(path) else {
        return cfg;
    };
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("nameserver") => cfg.servers.extend(words.next().map(String::from)),
            Some("search") => cfg.searches = words.map(String::from).collect(),
            Some("options") => cfg.options.extend(words.map(String::from)),
            _ => {}
        }
    }
    cfg
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn labels_dns_and_ports() {
        let p = pod("metadata: {name: web, namespace: prod, uid: u1, labels: {app: web}}\nspec:\n  containers:\n  - name: c\n    image: i\n    ports: [{containerPort: 80, hostPort: 8080}, {containerPort: 53, protocol: UDP}]\n");
        let dns = vec!["198.19.0.10".to_string()];
        let ctx = SandboxContext {
            pod_log_dir: Path::new("/var/log/pods"),
            cluster_dns: &dns,
            cluster_domain: "cluster.local",
            node: NodeSecurity {
                seccomp_root: Path::new("/s"),
                apparmor: false,
            },
        };
        let c = sandbox_config(&p, 2, &ctx);
        assert_eq!(c.labels[labels::POD_UID], "u1");
        assert_eq!(c.labels["app"], "web");
        assert_eq!(c.log_directory, "/var/log/pods/prod_web_u1");
        assert_eq!(c.hostname, "web");
        assert_eq!(c.metadata.unwrap().attempt, 2);
        assert_eq!(c.port_mappings.len(), 1);
        assert_eq!(c.port_mappings[0].host_port, 8080);
        let d = c.dns_config.unwrap();
        assert_eq!(d.servers, dns);
        assert_eq!(
            &d.searches[..3],
            &[
                "prod.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local"
            ]
        );
        assert_eq!(d.options, vec!["ndots:5"]);
    }

    #[test]
    fn dns_none_uses_only_dns_config() {
        let p = pod("metadata: {name: web, uid: u1}\nspec:\n  dnsPolicy: None\n  dnsConfig: {nameservers: [198.18.0.53], options: [{name: ndots, value: '2'}]}\n  containers: [{name: c, image: i}]\n");
        let ctx = SandboxContext {
            pod_log_dir: Path::new("/l"),
            cluster_dns: &[],
            cluster_domain: "cluster.local",
            node: NodeSecurity {
                seccomp_root: Path::new("/s"),
                apparmor: false,
            },
        };
        let d = dns_config(&p, &ctx);
        assert_eq!(d.servers, vec!["198.18.0.53"]);
        assert_eq!(d.options, vec!["ndots:2"]);
        assert!(d.searches.is_empty());
    }
}
