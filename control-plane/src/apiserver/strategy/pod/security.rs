//! Validation of the pod's and its containers' security contexts, as
//! upstream's `ValidatePodSecurityContext` / `ValidateSecurityContext`:
//! value ranges and enumerations, profile types with their
//! `localhostProfile`, sysctl names, and the combinations that cannot work.
//! Whether a node can honour a valid setting is the node's to say (the
//! agent refuses what it cannot enforce, naming the field).

use serde_json::Value;

use crate::apiserver::status::Cause;

/// Upstream `IsValidUserID` / `IsValidGroupID`.
const ID_RANGE: &str = "must be between 0 and 2147483647, inclusive";
/// The longest sysctl name (upstream `SysctlMaxLength`).
const SYSCTL_MAX: usize = 253;

/// An id field (`runAsUser`, `fsGroup`, ...) in 0..=MaxInt32.
fn id(field: String, v: &Value, c: &mut Vec<Cause>) {
    let ok = v
        .as_i64()
        .is_some_and(|n| (0..=i64::from(i32::MAX)).contains(&n));
    if !ok {
        c.push(Cause {
            reason: "FieldValueInvalid",
            field,
            message: format!("Invalid value: {v}: {ID_RANGE}"),
        });
    }
}

/// `value` at `field` must be one of `allowed`.
fn one_of(field: String, v: &Value, allowed: &[&str], c: &mut Vec<Cause>) {
    let s = v.as_str().unwrap_or_default();
    if !allowed.contains(&s) {
        c.push(Cause::not_supported(field, s, allowed));
    }
}

/// A seccomp or AppArmor profile: a known type, and `localhostProfile`
/// exactly when the type is Localhost.
fn profile(path: &str, what: &str, p: &Value, c: &mut Vec<Cause>) {
    let t = p.get("type").and_then(Value::as_str).unwrap_or_default();
    if t.is_empty() {
        c.push(Cause::required(format!("{path}.type")));
    } else {
        one_of(
            format!("{path}.type"),
            &p["type"],
            &["Localhost", "RuntimeDefault", "Unconfined"],
            c,
        );
    }
    let local = p.get("localhostProfile").and_then(Value::as_str);
    match (t, local) {
        ("Localhost", None) | ("Localhost", Some("")) => c.push(Cause::required_because(
            format!("{path}.localhostProfile"),
            &format!("must be set when {what} type is Localhost"),
        )),
        ("Localhost", Some(l)) if what == "AppArmor" && l.len() > 4095 => {
            c.push(Cause::too_long(format!("{path}.localhostProfile"), 4095))
        }
        (t, Some(l)) if t != "Localhost" => c.push(Cause::invalid(
            format!("{path}.localhostProfile"),
            l,
            &format!("can only be set when {what} type is Localhost"),
        )),
        _ => {}
    }
}

/// Upstream `IsValidSysctlName`: dot- or slash-separated segments of
/// `[a-z0-9]([-_a-z0-9]*[a-z0-9])?`.
fn is_sysctl_name(name: &str) -> bool {
    name.len() <= SYSCTL_MAX
        && name.split(['.', '/']).all(|seg| {
            !seg.is_empty()
                && seg
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
                && seg.starts_with(|ch: char| ch.is_ascii_lowercase() || ch.is_ascii_digit())
                && seg.ends_with(|ch: char| ch.is_ascii_lowercase() || ch.is_ascii_digit())
        })
}

/// The pod's `securityContext` and every container's, for the pod spec at
/// `path`.
pub(crate) fn validate(path: &str, spec: Option<&Value>, c: &mut Vec<Cause>) {
    let Some(spec) = spec else { return };
    if let Some(sc) = spec.get("securityContext").filter(|v| v.is_object()) {
        pod_context(&format!("{path}.securityContext"), sc, c);
    }
    let host_users = spec.get("hostUsers").and_then(Value::as_bool);
    for field in ["initContainers", "containers", "ephemeralContainers"] {
        let containers = spec.get(field).and_then(Value::as_array);
        for (i, ctr) in containers.into_iter().flatten().enumerate() {
            if let Some(sc) = ctr.get("securityContext").filter(|v| v.is_object()) {
                let p = format!("{path}.{field}[{i}].securityContext");
                container_context(&p, sc, host_users, c);
            }
        }
    }
}

fn pod_context(path: &str, sc: &Value, c: &mut Vec<Cause>) {
    for f in ["runAsUser", "runAsGroup", "fsGroup"] {
        if let Some(v) = sc.get(f).filter(|v| !v.is_null()) {
            id(format!("{path}.{f}"), v, c);
        }
    }
    let groups = sc.get("supplementalGroups").and_then(Value::as_array);
    for (i, g) in groups.into_iter().flatten().enumerate() {
        id(format!("{path}.supplementalGroups[{i}]"), g, c);
    }
    if let Some(v) = sc.get("fsGroupChangePolicy").filter(|v| !v.is_null()) {
        let f = format!("{path}.fsGroupChangePolicy");
        one_of(f, v, &["OnRootMismatch", "Always"], c);
    }
    if let Some(v) = sc.get("supplementalGroupsPolicy").filter(|v| !v.is_null()) {
        let f = format!("{path}.supplementalGroupsPolicy");
        one_of(f, v, &["Merge", "Strict"], c);
    }
    if let Some(v) = sc.get("seLinuxChangePolicy").filter(|v| !v.is_null()) {
        let f = format!("{path}.seLinuxChangePolicy");
        one_of(f, v, &["MountOption", "Recursive"], c);
    }
    if let Some(p) = sc.get("seccompProfile").filter(|v| v.is_object()) {
        profile(&format!("{path}.seccompProfile"), "seccomp", p, c);
    }
    if let Some(p) = sc.get("appArmorProfile").filter(|v| v.is_object()) {
        profile(&format!("{path}.appArmorProfile"), "AppArmor", p, c);
    }
    let sysctls = sc.get("sysctls").and_then(Value::as_array);
    let mut seen: Vec<String> = Vec::new();
    for (i, s) in sysctls.into_iter().flatten().enumerate() {
        let f = format!("{path}.sysctls[{i}].name");
        let name = s.get("name").and_then(Value::as_str).unwrap_or_default();
        if name.is_empty() {
            c.push(Cause::required(f));
            continue;
        }
        if !is_sysctl_name(name) {
            let why = format!("must have at most {SYSCTL_MAX} characters and match regex ^([a-z0-9]([-_a-z0-9]*[a-z0-9])?[\\./])*[a-z0-9]([-_a-z0-9]*[a-z0-9])?$");
            c.push(Cause::invalid(f, name, &why));
            continue;
        }
        // `a/b.c` and `a.b/c` are the same sysctl.
        let dotted = if name
            .find(['.', '/'])
            .is_some_and(|i| name.as_bytes()[i] == b'/')
        {
            name.chars()
                .map(|ch| match ch {
                    '/' => '.',
                    '.' => '/',
                    ch => ch,
                })
                .collect()
        } else {
            name.to_string()
        };
        if seen.contains(&dotted) {
            c.push(Cause::duplicate(f, name));
        }
        seen.push(dotted);
    }
}

fn container_context(path: &str, sc: &Value, host_users: Option<bool>, c: &mut Vec<Cause>) {
    for f in ["runAsUser", "runAsGroup"] {
        if let Some(v) = sc.get(f).filter(|v| !v.is_null()) {
            id(format!("{path}.{f}"), v, c);
        }
    }
    if let Some(v) = sc.get("procMount").filter(|v| !v.is_null()) {
        let f = format!("{path}.procMount");
        one_of(f.clone(), v, &["Default", "Unmasked"], c);
        if v.as_str() == Some("Unmasked") && host_users != Some(false) {
            c.push(Cause::invalid(
                f,
                "Unmasked",
                "`hostUsers` must be false to use `Unmasked`",
            ));
        }
    }
    if let Some(p) = sc.get("seccompProfile").filter(|v| v.is_object()) {
        profile(&format!("{path}.seccompProfile"), "seccomp", p, c);
    }
    if let Some(p) = sc.get("appArmorProfile").filter(|v| v.is_object()) {
        profile(&format!("{path}.appArmorProfile"), "AppArmor", p, c);
    }
    if sc.get("allowPrivilegeEscalation").and_then(Value::as_bool) == Some(false) {
        if sc.get("privileged").and_then(Value::as_bool) == Some(true) {
            c.push(Cause {
                reason: "FieldValueInvalid",
                field: path.to_string(),
                message: "Invalid value: \"\": cannot set `allowPrivilegeEscalation` to false and `privileged` to true".into(),
            });
        }
        let adds = sc["capabilities"]["add"].as_array();
        if adds
            .into_iter()
            .flatten()
            .any(|a| a.as_str() == Some("SYS_ADMIN") || a.as_str() == Some("CAP_SYS_ADMIN"))
        {
            c.push(Cause {
                reason: "FieldValueInvalid",
                field: path.to_string(),
                message: "Invalid value: \"\": cannot set `allowPrivilegeEscalation` to false and `capabilities.Add` CAP_SYS_ADMIN".into(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn causes(spec: Value) -> Vec<(String, String)> {
        let mut c = Vec::new();
        validate("spec", Some(&spec), &mut c);
        c.into_iter().map(|c| (c.field, c.message)).collect()
    }

    #[test]
    fn valid_contexts_pass() {
        let spec = json!({
            "securityContext": {"runAsUser": 1000, "runAsGroup": 0, "fsGroup": 2000,
                "supplementalGroups": [3000], "fsGroupChangePolicy": "OnRootMismatch",
                "seccompProfile": {"type": "RuntimeDefault"},
                "sysctls": [{"name": "net.ipv4.tcp_syncookies", "value": "1"}, {"name": "kernel/shm_rmid_forced", "value": "1"}]},
            "containers": [{"name": "c", "securityContext": {"procMount": "Default",
                "seccompProfile": {"type": "Localhost", "localhostProfile": "a.json"},
                "appArmorProfile": {"type": "Unconfined"}, "allowPrivilegeEscalation": false}}]
        });
        assert_eq!(causes(spec), vec![]);
    }

    #[test]
    fn bad_values_are_named() {
        let spec = json!({
            "securityContext": {"runAsUser": -1, "fsGroupChangePolicy": "Sometimes",
                "seccompProfile": {"type": "Localhost"},
                "sysctls": [{"name": "Kernel.X", "value": "1"}, {"name": "a.b", "value": "1"}, {"name": "a/b", "value": "2"}]},
            "containers": [{"name": "c", "securityContext": {"procMount": "Unmasked",
                "appArmorProfile": {"type": "RuntimeDefault", "localhostProfile": "x"},
                "privileged": true, "allowPrivilegeEscalation": false}}]
        });
        let c = causes(spec);
        let fields: Vec<&str> = c.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.securityContext.runAsUser",
                "spec.securityContext.fsGroupChangePolicy",
                "spec.securityContext.seccompProfile.localhostProfile",
                "spec.securityContext.sysctls[0].name",
                "spec.securityContext.sysctls[2].name",
                "spec.containers[0].securityContext.procMount",
                "spec.containers[0].securityContext.appArmorProfile.localhostProfile",
                "spec.containers[0].securityContext",
            ]
        );
        assert_eq!(
            c[0].1,
            "Invalid value: -1: must be between 0 and 2147483647, inclusive"
        );
        assert_eq!(
            c[2].1,
            "Required value: must be set when seccomp type is Localhost"
        );
        assert!(c[5].1.contains("`hostUsers` must be false"), "{}", c[5].1);
    }
}
