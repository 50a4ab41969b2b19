//! The restricted level's checks (`pod-security-admission/policy`):
//! current pod hardening best practice, on top of baseline's.

use std::collections::BTreeSet;

use super::baseline::seccomp_setters;
use super::*;

pub(super) fn seccomp_restricted(p: &Pod) -> Option<Violation> {
    let (who, values, implicit) = seccomp_setters(p.spec);
    if !who.is_empty() {
        return bad(
            "seccompProfile",
            format!(
                "{} must not set securityContext.seccompProfile.type to {}",
                who.join(" and "),
                join_quote(&values)
            ),
        );
    }
    if implicit.is_empty() {
        return None;
    }
    bad(
        "seccompProfile",
        format!(
            r#"pod or {} must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost""#,
            containers_phrase(&implicit)
        ),
    )
}

pub(super) fn seccomp_restricted_1_25(p: &Pod) -> Option<Violation> {
    if windows(p.spec) {
        return None;
    }
    seccomp_restricted(p)
}

pub(super) fn allow_privilege_escalation(p: &Pod) -> Option<Violation> {
    let names: Vec<String> = containers(p.spec)
        .filter(|c| sc(c)["allowPrivilegeEscalation"] != false)
        .map(name)
        .collect();
    if names.is_empty() {
        return None;
    }
    bad(
        "allowPrivilegeEscalation != false",
        format!(
            "{} must set securityContext.allowPrivilegeEscalation=false",
            containers_phrase(&names)
        ),
    )
}

pub(super) fn allow_privilege_escalation_1_25(p: &Pod) -> Option<Violation> {
    if windows(p.spec) {
        return None;
    }
    allow_privilege_escalation(p)
}

pub(super) fn capabilities_restricted(p: &Pod) -> Option<Violation> {
    let mut missing_drop = Vec::new();
    let mut adding = Vec::new();
    let mut caps = BTreeSet::new();
    for c in containers(p.spec) {
        let capabilities = &sc(c)["capabilities"];
        if capabilities.is_null() {
            missing_drop.push(name(c));
            continue;
        }
        let dropped_all = capabilities["drop"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|d| d == "ALL");
        if !dropped_all {
            missing_drop.push(name(c));
        }
        let mut forbidden = false;
        for cap in capabilities_added(c) {
            if cap != "NET_BIND_SERVICE" {
                forbidden = true;
                caps.insert(cap.to_string());
            }
        }
        if forbidden {
            adding.push(name(c));
        }
    }
    let mut details = Vec::new();
    if !missing_drop.is_empty() {
        details.push(format!(
            r#"{} must set securityContext.capabilities.drop=["ALL"]"#,
            containers_phrase(&missing_drop)
        ));
    }
    if !adding.is_empty() {
        details.push(format!(
            "{} must not include {} in securityContext.capabilities.add",
            containers_phrase(&adding),
            join_quote(&caps)
        ));
    }
    if details.is_empty() {
        return None;
    }
    bad("unrestricted capabilities", details.join("; "))
}

pub(super) fn capabilities_restricted_1_25(p: &Pod) -> Option<Violation> {
    if windows(p.spec) {
        return None;
    }
    capabilities_restricted(p)
}

/// The inline volume sources the restricted level allows, and the names
/// of the ones it refuses (upstream names unknown sources `unknown`).
const ALLOWED_VOLUMES: &[&str] = &[
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "image",
    "persistentVolumeClaim",
    "projected",
    "secret",
];
const RESTRICTED_VOLUMES: &[&str] = &[
    "hostPath",
    "gcePersistentDisk",
    "awsElasticBlockStore",
    "gitRepo",
    "nfs",
    "iscsi",
    "glusterfs",
    "rbd",
    "flexVolume",
    "cinder",
    "cephfs",
    "flocker",
    "fc",
    "azureFile",
    "vsphereVolume",
    "quobyte",
    "azureDisk",
    "photonPersistentDisk",
    "portworxVolume",
    "scaleIO",
    "storageos",
];

pub(super) fn restricted_volumes(p: &Pod) -> Option<Violation> {
    let mut names = Vec::new();
    let mut types = BTreeSet::new();
    for vol in volumes(p.spec) {
        let set = |k: &&str| !vol[*k].is_null();
        if ALLOWED_VOLUMES.iter().any(set) {
            continue;
        }
        names.push(name(vol));
        types.insert(
            RESTRICTED_VOLUMES
                .iter()
                .find(|k| set(k))
                .copied()
                .unwrap_or("unknown"),
        );
    }
    if names.is_empty() {
        return None;
    }
    bad(
        "restricted volume types",
        format!(
            "{} {} {} {} {}",
            plural("volume", "volumes", names.len()),
            join_quote(&names),
            plural("uses", "use", names.len()),
            plural(
                "restricted volume type",
                "restricted volume types",
                types.len()
            ),
            join_quote(&types)
        ),
    )
}

pub(super) fn run_as_non_root(p: &Pod) -> Option<Violation> {
    let pod = &sc_pod(p.spec)["runAsNonRoot"];
    let pod_false = *pod == false;
    let pod_true = *pod == true;
    let mut explicit = Vec::new();
    let mut implicit = Vec::new();
    for c in containers(p.spec) {
        match sc(c)["runAsNonRoot"].as_bool() {
            Some(false) => explicit.push(name(c)),
            Some(true) => {}
            None if !pod_true => implicit.push(name(c)),
            None => {}
        }
    }
    let who = setters(pod_false, &explicit);
    if !who.is_empty() {
        return bad(
            "runAsNonRoot != true",
            format!(
                "{} must not set securityContext.runAsNonRoot=false",
                who.join(" and ")
            ),
        );
    }
    if implicit.is_empty() {
        return None;
    }
    bad(
        "runAsNonRoot != true",
        format!(
            "pod or {} must set securityContext.runAsNonRoot=true",
            containers_phrase(&implicit)
        ),
    )
}

pub(super) fn run_as_non_root_1_35(p: &Pod) -> Option<Violation> {
    if user_namespace(p.spec) {
        return None;
    }
    run_as_non_root(p)
}

pub(super) fn run_as_user(p: &Pod) -> Option<Violation> {
    let pod = sc_pod(p.spec)["runAsUser"].as_i64() == Some(0);
    let names: Vec<String> = containers(p.spec)
        .filter(|c| sc(c)["runAsUser"].as_i64() == Some(0))
        .map(name)
        .collect();
    let who = setters(pod, &names);
    if who.is_empty() {
        return None;
    }
    bad(
        "runAsUser=0",
        format!("{} must not set runAsUser=0", who.join(" and ")),
    )
}

pub(super) fn run_as_user_1_35(p: &Pod) -> Option<Violation> {
    if user_namespace(p.spec) {
        return None;
    }
    run_as_user(p)
}
