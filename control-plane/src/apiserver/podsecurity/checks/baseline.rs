//! The baseline level's checks (`pod-security-admission/policy`):
//! known privilege escalations are refused, the defaults are allowed.

use std::collections::BTreeSet;

use serde_json::Value;

use super::*;

const APPARMOR_ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";

pub(super) fn app_armor(p: &Pod) -> Option<Violation> {
    let allowed_type = |t: &Value| matches!(str_of(t), "RuntimeDefault" | "Localhost");
    let mut values = BTreeSet::new();
    let pod_profile = &sc_pod(p.spec)["appArmorProfile"];
    let pod_bad = !pod_profile.is_null() && !allowed_type(&pod_profile["type"]);
    if pod_bad {
        values.insert(str_of(&pod_profile["type"]).to_string());
    }
    let mut bad_containers = Vec::new();
    for c in containers(p.spec) {
        let profile = &sc(c)["appArmorProfile"];
        if !profile.is_null() && !allowed_type(&profile["type"]) {
            bad_containers.push(name(c));
            values.insert(str_of(&profile["type"]).to_string());
        }
    }
    let mut who = setters(pod_bad, &bad_containers);
    let mut values: Vec<String> = values.into_iter().collect();
    let mut forbidden: Vec<String> = annotations(p.meta)
        .filter(|(k, v)| {
            k.starts_with(APPARMOR_ANNOTATION_PREFIX)
                && !(v.is_empty() || *v == "runtime/default" || v.starts_with("localhost/"))
        })
        .map(|(k, v)| format!("{k}={v:?}"))
        .collect();
    if !forbidden.is_empty() {
        forbidden.sort();
        who.push(plural("annotation", "annotations", forbidden.len()).to_string());
        values.extend(forbidden);
    }
    if who.is_empty() {
        return None;
    }
    bad(
        plural(
            "forbidden AppArmor profile",
            "forbidden AppArmor profiles",
            values.len(),
        ),
        format!(
            "{} must not set AppArmor profile type to {}",
            who.join(" and "),
            join_quote(&values)
        ),
    )
}

const DEFAULT_CAPABILITIES: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

pub(super) fn capabilities_baseline(p: &Pod) -> Option<Violation> {
    let mut bad_containers = Vec::new();
    let mut caps = BTreeSet::new();
    for c in containers(p.spec) {
        let mut valid = true;
        for cap in capabilities_added(c) {
            if !DEFAULT_CAPABILITIES.contains(&cap) {
                valid = false;
                caps.insert(cap.to_string());
            }
        }
        if !valid {
            bad_containers.push(name(c));
        }
    }
    if bad_containers.is_empty() {
        return None;
    }
    bad(
        "non-default capabilities",
        format!(
            "{} must not include {} in securityContext.capabilities.add",
            containers_phrase(&bad_containers),
            join_quote(&caps)
        ),
    )
}

pub(super) fn host_namespaces(p: &Pod) -> Option<Violation> {
    let found: Vec<String> = ["hostNetwork", "hostPID", "hostIPC"]
        .into_iter()
        .filter(|k| p.spec[*k] == true)
        .map(|k| format!("{k}=true"))
        .collect();
    if found.is_empty() {
        return None;
    }
    bad("host namespaces", found.join(", "))
}

pub(super) fn host_path_volumes(p: &Pod) -> Option<Violation> {
    let names: Vec<String> = volumes(p.spec)
        .filter(|v| !v["hostPath"].is_null())
        .map(name)
        .collect();
    if names.is_empty() {
        return None;
    }
    bad(
        "hostPath volumes",
        format!(
            "{} {}",
            plural("volume", "volumes", names.len()),
            join_quote(&names)
        ),
    )
}

pub(super) fn host_ports(p: &Pod) -> Option<Violation> {
    let mut bad_containers = Vec::new();
    let mut ports = BTreeSet::new();
    for c in containers(p.spec) {
        let mut valid = true;
        for port in c["ports"].as_array().into_iter().flatten() {
            let hp = port["hostPort"].as_i64().unwrap_or(0);
            if hp != 0 {
                valid = false;
                ports.insert(hp.to_string());
            }
        }
        if !valid {
            bad_containers.push(name(c));
        }
    }
    if bad_containers.is_empty() {
        return None;
    }
    bad(
        "hostPort",
        format!(
            "{} {} {} {}",
            containers_phrase(&bad_containers),
            plural("uses", "use", bad_containers.len()),
            plural("hostPort", "hostPorts", ports.len()),
            ports.into_iter().collect::<Vec<_>>().join(", ")
        ),
    )
}

pub(super) fn host_probes(p: &Pod) -> Option<Violation> {
    let mut bad_containers = BTreeSet::new();
    let mut hosts = BTreeSet::new();
    for c in containers(p.spec) {
        let handlers = [
            &c["livenessProbe"],
            &c["readinessProbe"],
            &c["startupProbe"],
            &c["lifecycle"]["postStart"],
            &c["lifecycle"]["preStop"],
        ];
        for h in handlers {
            for action in ["httpGet", "tcpSocket"] {
                let host = str_of(&h[action]["host"]);
                if !host.is_empty() {
                    bad_containers.insert(name(c));
                    hosts.insert(host.to_string());
                }
            }
        }
    }
    if bad_containers.is_empty() {
        return None;
    }
    bad(
        "probe or lifecycle host",
        format!(
            "{} {} {} {} {}",
            plural("container", "containers", bad_containers.len()),
            join_quote(&bad_containers),
            plural("uses", "use", bad_containers.len()),
            plural(
                "probe or lifecycle host",
                "probe or lifecycle hosts",
                hosts.len()
            ),
            join_quote(&hosts)
        ),
    )
}

pub(super) fn privileged(p: &Pod) -> Option<Violation> {
    let names: Vec<String> = containers(p.spec)
        .filter(|c| sc(c)["privileged"] == true)
        .map(name)
        .collect();
    if names.is_empty() {
        return None;
    }
    bad(
        "privileged",
        format!(
            "{} must not set securityContext.privileged=true",
            containers_phrase(&names)
        ),
    )
}

pub(super) fn proc_mount(p: &Pod) -> Option<Violation> {
    let mut names = Vec::new();
    let mut types = BTreeSet::new();
    for c in containers(p.spec) {
        let pm = &sc(c)["procMount"];
        if !pm.is_null() && pm != "Default" {
            names.push(name(c));
            types.insert(str_of(pm).to_string());
        }
    }
    if names.is_empty() {
        return None;
    }
    bad(
        "procMount",
        format!(
            "{} must not set securityContext.procMount to {}",
            containers_phrase(&names),
            join_quote(&types)
        ),
    )
}

pub(super) fn proc_mount_1_35(p: &Pod) -> Option<Violation> {
    if user_namespace(p.spec) {
        return None;
    }
    proc_mount(p)
}

const SELINUX_TYPES_1_0: &[&str] = &["", "container_t", "container_init_t", "container_kvm_t"];
const SELINUX_TYPES_1_31: &[&str] = &[
    "",
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];

pub(super) fn selinux_1_0(p: &Pod) -> Option<Violation> {
    selinux(p, SELINUX_TYPES_1_0)
}

pub(super) fn selinux_1_31(p: &Pod) -> Option<Violation> {
    selinux(p, SELINUX_TYPES_1_31)
}

pub(super) fn selinux(p: &Pod, allowed: &[&str]) -> Option<Violation> {
    let mut types = BTreeSet::new();
    let (mut set_user, mut set_role) = (false, false);
    let mut valid = |o: &Value| {
        let mut ok = true;
        let t = str_of(&o["type"]);
        if !allowed.contains(&t) {
            ok = false;
            types.insert(t.to_string());
        }
        if !str_of(&o["user"]).is_empty() {
            ok = false;
            set_user = true;
        }
        if !str_of(&o["role"]).is_empty() {
            ok = false;
            set_role = true;
        }
        ok
    };
    let pod_opts = &sc_pod(p.spec)["seLinuxOptions"];
    let pod_bad = !pod_opts.is_null() && !valid(pod_opts);
    let mut names = Vec::new();
    for c in containers(p.spec) {
        let o = &sc(c)["seLinuxOptions"];
        if !o.is_null() && !valid(o) {
            names.push(name(c));
        }
    }
    let who = setters(pod_bad, &names);
    if who.is_empty() {
        return None;
    }
    let mut what = Vec::new();
    if !types.is_empty() {
        what.push(format!(
            "{} {}",
            plural("type", "types", types.len()),
            join_quote(&types)
        ));
    }
    if set_user {
        what.push("user may not be set".to_string());
    }
    if set_role {
        what.push("role may not be set".to_string());
    }
    bad(
        "seLinuxOptions",
        format!(
            "{} set forbidden securityContext.seLinuxOptions: {}",
            who.join(" and "),
            what.join("; ")
        ),
    )
}

const SECCOMP_POD_ANNOTATION: &str = "seccomp.security.alpha.kubernetes.io/pod";
const SECCOMP_CONTAINER_ANNOTATION: &str = "container.seccomp.security.alpha.kubernetes.io/";

pub(super) fn seccomp_baseline_1_0(p: &Pod) -> Option<Violation> {
    let ok =
        |v: &str| v == "runtime/default" || v == "docker/default" || v.starts_with("localhost/");
    let ann = &p.meta["annotations"];
    let mut forbidden = BTreeSet::new();
    if let Some(v) = ann[SECCOMP_POD_ANNOTATION].as_str() {
        if !ok(v) {
            forbidden.insert(format!("{SECCOMP_POD_ANNOTATION}={v:?}"));
        }
    }
    for c in containers(p.spec) {
        let key = format!("{SECCOMP_CONTAINER_ANNOTATION}{}", name(c));
        if let Some(v) = ann[&key].as_str() {
            if !ok(v) {
                forbidden.insert(format!("{key}={v:?}"));
            }
        }
    }
    if forbidden.is_empty() {
        return None;
    }
    bad(
        "seccompProfile",
        format!(
            "forbidden {} {}",
            plural("annotation", "annotations", forbidden.len()),
            forbidden.into_iter().collect::<Vec<_>>().join(", ")
        ),
    )
}

fn valid_seccomp(t: &Value) -> bool {
    matches!(str_of(t), "RuntimeDefault" | "Localhost")
}

/// Who sets a seccomp profile type other than RuntimeDefault or
/// Localhost, the bad types, whether the pod sets a good one, and the
/// containers that set none.
pub(super) fn seccomp_setters(spec: &Value) -> (Vec<String>, BTreeSet<String>, Vec<String>) {
    let mut values = BTreeSet::new();
    let pod_profile = &sc_pod(spec)["seccompProfile"];
    let mut pod_bad = false;
    let mut pod_set = false;
    if !pod_profile.is_null() {
        if valid_seccomp(&pod_profile["type"]) {
            pod_set = true;
        } else {
            pod_bad = true;
            values.insert(str_of(&pod_profile["type"]).to_string());
        }
    }
    let mut explicit = Vec::new();
    let mut implicit = Vec::new();
    for c in containers(spec) {
        let profile = &sc(c)["seccompProfile"];
        if profile.is_null() {
            if !pod_set {
                implicit.push(name(c));
            }
        } else if !valid_seccomp(&profile["type"]) {
            explicit.push(name(c));
            values.insert(str_of(&profile["type"]).to_string());
        }
    }
    (setters(pod_bad, &explicit), values, implicit)
}

pub(super) fn seccomp_baseline_1_19(p: &Pod) -> Option<Violation> {
    let (who, values, _) = seccomp_setters(p.spec);
    if who.is_empty() {
        return None;
    }
    bad(
        "seccompProfile",
        format!(
            "{} must not set securityContext.seccompProfile.type to {}",
            who.join(" and "),
            join_quote(&values)
        ),
    )
}

const SYSCTLS_1_0: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
];
const SYSCTLS_1_27: &[&str] = &["net.ipv4.ip_local_reserved_ports"];
const SYSCTLS_1_29: &[&str] = &[
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
];
const SYSCTLS_1_32: &[&str] = &["net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"];
const SYSCTLS_1_37: &[&str] = &[
    "net.ipv4.tcp_slow_start_after_idle",
    "net.ipv4.tcp_notsent_lowat",
];

pub(super) fn sysctls_1_0(p: &Pod) -> Option<Violation> {
    sysctls(p, &[SYSCTLS_1_0])
}
pub(super) fn sysctls_1_27(p: &Pod) -> Option<Violation> {
    sysctls(p, &[SYSCTLS_1_0, SYSCTLS_1_27])
}
pub(super) fn sysctls_1_29(p: &Pod) -> Option<Violation> {
    sysctls(p, &[SYSCTLS_1_0, SYSCTLS_1_27, SYSCTLS_1_29])
}
pub(super) fn sysctls_1_32(p: &Pod) -> Option<Violation> {
    sysctls(p, &[SYSCTLS_1_0, SYSCTLS_1_27, SYSCTLS_1_29, SYSCTLS_1_32])
}
pub(super) fn sysctls_1_37(p: &Pod) -> Option<Violation> {
    sysctls(
        p,
        &[
            SYSCTLS_1_0,
            SYSCTLS_1_27,
            SYSCTLS_1_29,
            SYSCTLS_1_32,
            SYSCTLS_1_37,
        ],
    )
}

pub(super) fn sysctls(p: &Pod, allowed: &[&[&str]]) -> Option<Violation> {
    let forbidden: Vec<&str> = sc_pod(p.spec)["sysctls"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| str_of(&s["name"]))
        .filter(|n| !allowed.iter().any(|set| set.contains(n)))
        .collect();
    if forbidden.is_empty() {
        return None;
    }
    bad("forbidden sysctls", forbidden.join(", "))
}

pub(super) fn windows_host_process(p: &Pod) -> Option<Violation> {
    let names: Vec<String> = containers(p.spec)
        .filter(|c| sc(c)["windowsOptions"]["hostProcess"] == true)
        .map(name)
        .collect();
    let pod = sc_pod(p.spec)["windowsOptions"]["hostProcess"] == true;
    let who = setters(pod, &names);
    if who.is_empty() {
        return None;
    }
    bad(
        "hostProcess",
        format!(
            "{} must not set securityContext.windowsOptions.hostProcess=true",
            who.join(" and ")
        ),
    )
}
