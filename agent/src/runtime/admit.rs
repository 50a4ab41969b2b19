//! Pod admission on the node, the security part of the kubelet's admit
//! handlers: sysctls (`pkg/kubelet/sysctl`, reason SysctlForbidden),
//! AppArmor (`pkg/kubelet/lifecycle`, reason AppArmor) and
//! `supplementalGroupsPolicy: Strict`, which containerd's CRI here cannot
//! enforce. A refused pod never starts: it is Failed with the reason, and
//! "Pod was rejected: " before the message, as upstream's `rejectPod`.

use k8s_openapi::api::core::v1::{Pod, PodStatus};

use crate::pod::PodExt;

use super::security::{apparmor_profiles, normalize_sysctl};

/// Why the node refuses a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// The pod status's and the event's reason.
    pub reason: &'static str,
    /// The event's message (the status adds "Pod was rejected: ").
    pub message: String,
}

/// What admission knows of the node.
#[derive(Debug, Clone, Copy)]
pub struct NodeFacts<'a> {
    /// `--allowed-unsafe-sysctls`: names, or prefixes ending in `*`.
    pub allowed_unsafe_sysctls: &'a [String],
    /// Whether the host enforces AppArmor.
    pub apparmor: bool,
}

/// The kubelet's safe sysctls: namespaced, and without effect on other
/// pods of the node.
const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
];

/// The kernel namespace a sysctl lives in (upstream `NamespacedBy`); None
/// when it is not known to be namespaced, and so may never be set.
fn namespace_of(sysctl: &str) -> Option<&'static str> {
    const IPC: &[&str] = &[
        "kernel.sem",
        "kernel.shmall",
        "kernel.shmmax",
        "kernel.shmmni",
        "kernel.shm_rmid_forced",
    ];
    if IPC.contains(&sysctl) || sysctl.starts_with("kernel.msg") || sysctl.starts_with("fs.mqueue.")
    {
        Some("IPC")
    } else if sysctl.starts_with("net.") {
        Some("Net")
    } else {
        None
    }
}

/// One sysctl against the safe set and the allowed unsafe ones (upstream
/// `validateSysctl`): it must be listed, and its namespace must not be the
/// host's.
fn check_sysctl(
    name: &str,
    allowed: &[String],
    host_net: bool,
    host_ipc: bool,
) -> Result<(), String> {
    let name = normalize_sysctl(name);
    let listed = SAFE_SYSCTLS.contains(&name.as_str())
        || allowed.iter().any(|p| {
            let p = normalize_sysctl(p);
            match p.strip_suffix('*') {
                Some(prefix) => name.starts_with(prefix),
                None => p == name,
            }
        });
    // Only namespaced sysctls can be allowed at all (the kubelet refuses
    // to start with others in its allow list).
    let ns = namespace_of(&name).filter(|_| listed);
    match ns {
        None => Err(format!("{name:?} not allowlisted")),
        Some("IPC") if host_ipc => Err(format!("{name:?} not allowed with host IPC enabled")),
        Some("Net") if host_net => Err(format!("{name:?} not allowed with host Net enabled")),
        Some(_) => Ok(()),
    }
}

/// Admit `pod` on this node, or say why not.
///
/// # Errors
/// The [`Rejection`] the pod is failed with.
pub fn admit(pod: &Pod, node: &NodeFacts) -> Result<(), Rejection> {
    let spec = pod.spec.clone().unwrap_or_default();
    let psc = spec.security_context.clone().unwrap_or_default();
    for s in psc.sysctls.iter().flatten() {
        check_sysctl(
            &s.name,
            node.allowed_unsafe_sysctls,
            spec.host_network.unwrap_or(false),
            spec.host_ipc.unwrap_or(false),
        )
        .map_err(|e| Rejection {
            reason: "SysctlForbidden",
            message: format!("forbidden sysctl: {e}"),
        })?;
    }
    let profiles = apparmor_profiles(pod);
    let apparmor = |why: String| Rejection {
        reason: "AppArmor",
        message: format!("Cannot enforce AppArmor: {why}"),
    };
    if profiles.iter().any(|p| p.type_ != "Unconfined") {
        if !node.apparmor {
            return Err(apparmor("AppArmor is not enabled on the host".into()));
        }
        for p in &profiles {
            let empty = p
                .localhost_profile
                .as_deref()
                .is_none_or(|n| n.trim().is_empty());
            if p.type_ == "Localhost" && empty {
                return Err(apparmor("invalid empty AppArmor profile name".into()));
            }
        }
    }
    if psc.supplemental_groups_policy.as_deref() == Some("Strict") {
        return Err(Rejection {
            reason: "SupplementalGroupsPolicyNotSupported",
            message: "SupplementalGroupsPolicy=Strict is not supported in this node".into(),
        });
    }
    Ok(())
}

/// Admit a pod this node has not started yet, as the kubelet does when a
/// pod is added: when refused, record the event (once), set the pod's
/// status to Failed with the reason, and return that status. None when the
/// pod is admitted, or already past admission (it ran, or is not Pending).
pub fn reject_if_refused(
    shared: &crate::shared::Shared,
    pod: &Pod,
    previous: Option<&PodStatus>,
) -> Option<PodStatus> {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if !matches!(phase, None | Some("Pending")) {
        return None;
    }
    let node = NodeFacts {
        allowed_unsafe_sysctls: &shared.config.allowed_unsafe_sysctls,
        apparmor: host_apparmor_enabled(),
    };
    let evicting = shared.pressure.refuses(pod).map(|message| Rejection {
        reason: crate::eviction::REASON,
        message,
    });
    let r = evicting.or_else(|| admit(pod, &node).err())?;
    let status = rejected_status(pod, &r);
    let known = previous.is_some_and(|p| p.reason == status.reason);
    if !known {
        tracing::info!(pod = %pod.key(), reason = r.reason, "pod rejected: {}", r.message);
        shared
            .recorder
            .event(pod, crate::events::WARNING, r.reason, &r.message);
    }
    shared.statuses.set(pod, status.clone());
    Some(status)
}

/// The status of a refused pod (upstream `rejectPod`).
pub fn rejected_status(pod: &Pod, r: &Rejection) -> PodStatus {
    PodStatus {
        phase: Some("Failed".into()),
        reason: Some(r.reason.into()),
        message: Some(format!("Pod was rejected: {}", r.message)),
        qos_class: Some(kube_util::qos::qos_class(pod).as_str().into()),
        ..Default::default()
    }
}

/// Whether the host enforces AppArmor (the kernel module says `Y`); read
/// once, as it cannot change without a reboot.
pub fn host_apparmor_enabled() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| {
        std::fs::read_to_string("/sys/module/apparmor/parameters/enabled")
            .is_ok_and(|s| s.trim_start().starts_with('Y'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        serde_saphyr::from_str(yaml).unwrap()
    }

    const NODE: NodeFacts = NodeFacts {
        allowed_unsafe_sysctls: &[],
        apparmor: false,
    };

    #[test]
    fn safe_sysctls_pass_unsafe_are_forbidden() {
        let p = pod("metadata: {name: p}\nspec:\n  securityContext:\n    sysctls: [{name: net.ipv4.tcp_syncookies, value: '1'}, {name: kernel/shm_rmid_forced, value: '1'}]\n  containers: [{name: c}]\n");
        assert_eq!(admit(&p, &NODE), Ok(()));
        let p = pod("metadata: {name: p}\nspec:\n  securityContext:\n    sysctls: [{name: kernel.msgmax, value: '65536'}]\n  containers: [{name: c}]\n");
        let r = admit(&p, &NODE).unwrap_err();
        assert_eq!(r.reason, "SysctlForbidden");
        assert_eq!(
            r.message,
            "forbidden sysctl: \"kernel.msgmax\" not allowlisted"
        );
        let allowed = ["kernel.msg*".to_string()];
        let node = NodeFacts {
            allowed_unsafe_sysctls: &allowed,
            ..NODE
        };
        assert_eq!(admit(&p, &node), Ok(()));
        // Never a sysctl that is not namespaced, even when listed.
        let allowed = ["vm.*".to_string()];
        let node = NodeFacts {
            allowed_unsafe_sysctls: &allowed,
            ..NODE
        };
        let p = pod("metadata: {name: p}\nspec:\n  securityContext:\n    sysctls: [{name: vm.swappiness, value: '1'}]\n  containers: [{name: c}]\n");
        assert!(admit(&p, &node).is_err());
    }

    #[test]
    fn host_namespaces_forbid_their_sysctls() {
        let p = pod("metadata: {name: p}\nspec:\n  hostNetwork: true\n  securityContext:\n    sysctls: [{name: net.ipv4.tcp_syncookies, value: '1'}]\n  containers: [{name: c}]\n");
        assert_eq!(
            admit(&p, &NODE).unwrap_err().message,
            "forbidden sysctl: \"net.ipv4.tcp_syncookies\" not allowed with host Net enabled"
        );
    }

    #[test]
    fn apparmor_needs_the_host() {
        let p = pod("metadata: {name: p}\nspec:\n  containers: [{name: c, securityContext: {appArmorProfile: {type: RuntimeDefault}}}]\n");
        let r = admit(&p, &NODE).unwrap_err();
        assert_eq!(r.reason, "AppArmor");
        assert_eq!(
            r.message,
            "Cannot enforce AppArmor: AppArmor is not enabled on the host"
        );
        let node = NodeFacts {
            apparmor: true,
            ..NODE
        };
        assert_eq!(admit(&p, &node), Ok(()));
        // Unconfined needs nothing, and the annotation counts too.
        let p = pod("metadata: {name: p}\nspec:\n  securityContext: {appArmorProfile: {type: Unconfined}}\n  containers: [{name: c}]\n");
        assert_eq!(admit(&p, &NODE), Ok(()));
        let p = pod("metadata: {name: p, annotations: {container.apparmor.security.beta.kubernetes.io/c: localhost/x}}\nspec:\n  containers: [{name: c}]\n");
        assert_eq!(admit(&p, &NODE).unwrap_err().reason, "AppArmor");
    }

    #[test]
    fn strict_supplemental_groups_are_refused() {
        let p = pod("metadata: {name: p}\nspec:\n  securityContext: {supplementalGroupsPolicy: Strict}\n  containers: [{name: c}]\n");
        assert_eq!(
            admit(&p, &NODE).unwrap_err().reason,
            "SupplementalGroupsPolicyNotSupported"
        );
        let p = pod("metadata: {name: p}\nspec:\n  securityContext: {supplementalGroupsPolicy: Merge}\n  containers: [{name: c}]\n");
        assert_eq!(admit(&p, &NODE), Ok(()));
    }
}
