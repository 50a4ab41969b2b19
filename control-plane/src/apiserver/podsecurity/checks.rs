//! The checks of the baseline and restricted levels, each at the versions
//! it changed in, with upstream's reasons and details
//! (`pod-security-admission/policy/check_*.go`).
//!
//! A check reads a pod's metadata and spec as JSON: a field that is
//! missing or null is "unset", as a nil pointer upstream. This module
//! holds the registry (which check applies at which level and version)
//! and the helpers; `baseline` and `restricted` hold the checks.

use std::collections::BTreeSet;

use serde_json::Value;

use super::level::{Level, LevelVersion, Version};

/// The newest version any check changed at: `latest`, and any newer
/// version, evaluate the checks as of this one (upstream clamps too).
pub const MAX_MINOR: u32 = 37;

/// One failed check: upstream's forbidden reason and detail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub reason: String,
    pub detail: String,
}

/// What a check reads.
struct Pod<'a> {
    meta: &'a Value,
    spec: &'a Value,
}

type CheckFn = fn(&Pod) -> Option<Violation>;

/// A check as it stands from `min` (`v1.<min>`) on; a restricted check
/// may replace (override) baseline ones.
struct Versioned {
    min: u32,
    check: CheckFn,
    overrides: &'static [&'static str],
}

struct Check {
    id: &'static str,
    level: Level,
    versions: &'static [Versioned],
}

const fn v(min: u32, check: CheckFn) -> Versioned {
    Versioned {
        min,
        check,
        overrides: &[],
    }
}

const fn over(min: u32, check: CheckFn, overrides: &'static [&'static str]) -> Versioned {
    Versioned {
        min,
        check,
        overrides,
    }
}

/// Every check, in upstream's result order: baseline IDs sorted, then
/// restricted IDs sorted (byte order, so `seLinuxOptions` comes before
/// `seccompProfile_baseline`).
static CHECKS: &[Check] = &[
    Check {
        id: "appArmorProfile",
        level: Level::Baseline,
        versions: &[v(0, app_armor)],
    },
    Check {
        id: "capabilities_baseline",
        level: Level::Baseline,
        versions: &[v(0, capabilities_baseline)],
    },
    Check {
        id: "hostNamespaces",
        level: Level::Baseline,
        versions: &[v(0, host_namespaces)],
    },
    Check {
        id: "hostPathVolumes",
        level: Level::Baseline,
        versions: &[v(0, host_path_volumes)],
    },
    Check {
        id: "hostPorts",
        level: Level::Baseline,
        versions: &[v(0, host_ports)],
    },
    Check {
        id: "hostProbesAndHostLifecycle",
        level: Level::Baseline,
        versions: &[v(34, host_probes)],
    },
    Check {
        id: "privileged",
        level: Level::Baseline,
        versions: &[v(0, privileged)],
    },
    Check {
        id: "procMount",
        level: Level::Baseline,
        versions: &[v(0, proc_mount), v(35, proc_mount_1_35)],
    },
    Check {
        id: "seLinuxOptions",
        level: Level::Baseline,
        versions: &[v(0, selinux_1_0), v(31, selinux_1_31)],
    },
    Check {
        id: "seccompProfile_baseline",
        level: Level::Baseline,
        versions: &[v(0, seccomp_baseline_1_0), v(19, seccomp_baseline_1_19)],
    },
    Check {
        id: "sysctls",
        level: Level::Baseline,
        versions: &[
            v(0, sysctls_1_0),
            v(27, sysctls_1_27),
            v(29, sysctls_1_29),
            v(32, sysctls_1_32),
            v(37, sysctls_1_37),
        ],
    },
    Check {
        id: "windowsHostProcess",
        level: Level::Baseline,
        versions: &[v(0, windows_host_process)],
    },
    Check {
        id: "allowPrivilegeEscalation",
        level: Level::Restricted,
        versions: &[
            v(8, allow_privilege_escalation),
            v(25, allow_privilege_escalation_1_25),
        ],
    },
    Check {
        id: "capabilities_restricted",
        level: Level::Restricted,
        versions: &[
            over(22, capabilities_restricted, &["capabilities_baseline"]),
            over(25, capabilities_restricted_1_25, &["capabilities_baseline"]),
        ],
    },
    Check {
        id: "procMount_restricted",
        level: Level::Restricted,
        versions: &[over(35, proc_mount, &["procMount"])],
    },
    Check {
        id: "restrictedVolumes",
        level: Level::Restricted,
        versions: &[over(0, restricted_volumes, &["hostPathVolumes"])],
    },
    Check {
        id: "runAsNonRoot",
        level: Level::Restricted,
        versions: &[v(0, run_as_non_root), v(35, run_as_non_root_1_35)],
    },
    Check {
        id: "runAsUser",
        level: Level::Restricted,
        versions: &[v(23, run_as_user), v(35, run_as_user_1_35)],
    },
    Check {
        id: "seccompProfile_restricted",
        level: Level::Restricted,
        versions: &[
            over(19, seccomp_restricted, &["seccompProfile_baseline"]),
            over(25, seccomp_restricted_1_25, &["seccompProfile_baseline"]),
        ],
    },
];

/// The violations of a pod (`meta`, `spec`) against `lv`, in upstream's
/// order; empty when it is allowed.
pub fn evaluate(lv: LevelVersion, meta: &Value, spec: &Value) -> Vec<Violation> {
    if lv.level == Level::Privileged {
        return Vec::new();
    }
    let minor = match lv.version {
        Version::Latest => MAX_MINOR,
        Version::Minor(m) => m.min(MAX_MINOR),
    };
    let active = |c: &'static Check| c.versions.iter().rev().find(|v| v.min <= minor);
    let restricted = lv.level == Level::Restricted;
    let overridden: BTreeSet<&str> = CHECKS
        .iter()
        .filter(|c| restricted && c.level == Level::Restricted)
        .filter_map(active)
        .flat_map(|v| v.overrides.iter().copied())
        .collect();
    let pod = Pod { meta, spec };
    CHECKS
        .iter()
        .filter(|c| c.level == Level::Baseline || restricted)
        .filter(|c| !overridden.contains(c.id))
        .filter_map(active)
        .filter_map(|v| (v.check)(&pod))
        .collect()
}

/// `reason (detail), reason (detail)`: the text of upstream's refusals
/// and warnings.
pub fn describe(violations: &[Violation]) -> String {
    violations
        .iter()
        .map(|v| {
            if v.detail.is_empty() {
                v.reason.clone()
            } else {
                format!("{} ({})", v.reason, v.detail)
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Just the reasons, `reason, reason` (the namespace-change warnings).
pub fn reasons(violations: &[Violation]) -> String {
    violations
        .iter()
        .map(|v| v.reason.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

// ---- helpers -------------------------------------------------------------

fn bad(reason: impl Into<String>, detail: impl Into<String>) -> Option<Violation> {
    Some(Violation {
        reason: reason.into(),
        detail: detail.into(),
    })
}

fn plural<'a>(singular: &'a str, plural: &'a str, n: usize) -> &'a str {
    if n == 1 {
        singular
    } else {
        plural
    }
}

fn join_quote<S: AsRef<str>>(items: impl IntoIterator<Item = S>) -> String {
    let items: Vec<String> = items
        .into_iter()
        .map(|s| format!("\"{}\"", s.as_ref()))
        .collect();
    items.join(", ")
}

/// `container "a"` / `containers "a", "b"`.
fn containers_phrase(names: &[String]) -> String {
    format!(
        "{} {}",
        plural("container", "containers", names.len()),
        join_quote(names)
    )
}

/// Init, regular and ephemeral containers, in that order.
fn containers(spec: &Value) -> impl Iterator<Item = &Value> {
    ["initContainers", "containers", "ephemeralContainers"]
        .into_iter()
        .flat_map(move |k| spec[k].as_array().into_iter().flatten())
}

fn name(c: &Value) -> String {
    c["name"].as_str().unwrap_or_default().to_string()
}

fn sc(c: &Value) -> &Value {
    &c["securityContext"]
}

fn windows(spec: &Value) -> bool {
    spec["os"]["name"] == "windows"
}

/// A pod in its own user namespace (`hostUsers: false`): root in it is
/// not root on the host, so the checks about root are relaxed.
fn user_namespace(spec: &Value) -> bool {
    spec["hostUsers"] == false
}

fn str_of(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

fn annotations(meta: &Value) -> impl Iterator<Item = (&String, &str)> {
    meta["annotations"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k, str_of(v)))
}

/// "pod and containers "a"" from who set something.
fn setters(pod: bool, containers: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    if pod {
        out.push("pod".to_string());
    }
    if !containers.is_empty() {
        out.push(containers_phrase(containers));
    }
    out
}

fn sc_pod(spec: &Value) -> &Value {
    &spec["securityContext"]
}

fn volumes(spec: &Value) -> impl Iterator<Item = &Value> {
    spec["volumes"].as_array().into_iter().flatten()
}

fn capabilities_added(c: &Value) -> impl Iterator<Item = &str> {
    sc(c)["capabilities"]["add"]
        .as_array()
        .into_iter()
        .flatten()
        .map(str_of)
}

mod baseline;
mod restricted;

use baseline::*;
use restricted::*;

#[cfg(test)]
mod tests;
