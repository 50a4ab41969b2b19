//! Pod validation for pods that reach the agent without an API server in
//! front (static pods): the subset of apiserver validation whose absence
//! would make the sync loop misbehave, with upstream field paths.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::{Container, Pod};

/// One invalid field: `spec.containers[0].image: Required value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

fn err(field: impl Into<String>, message: impl Into<String>) -> FieldError {
    FieldError {
        field: field.into(),
        message: message.into(),
    }
}

/// DNS-1123 label: lowercase alphanumerics and '-', 63 at most.
pub fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// DNS-1123 subdomain: dot-separated labels, 253 at most.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

/// Validate a pod; empty means valid.
pub fn validate_pod(pod: &Pod) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let meta = &pod.metadata;
    match meta.name.as_deref() {
        None | Some("") => errs.push(err("metadata.name", "Required value")),
        Some(n) if !is_dns1123_subdomain(n) => errs.push(err(
            "metadata.name",
            format!("Invalid value: {n:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'"),
        )),
        _ => {}
    }
    if let Some(ns) = meta.namespace.as_deref() {
        if !is_dns1123_label(ns) {
            errs.push(err("metadata.namespace", format!("Invalid value: {ns:?}")));
        }
    }
    let Some(spec) = &pod.spec else {
        errs.push(err("spec", "Required value"));
        return errs;
    };
    if spec.containers.is_empty() {
        errs.push(err("spec.containers", "Required value"));
    }
    let mut names = HashSet::new();
    let init = spec.init_containers.as_deref().unwrap_or_default();
    for (kind, list) in [
        ("initContainers", init),
        ("containers", &spec.containers[..]),
    ] {
        for (i, c) in list.iter().enumerate() {
            validate_container(&format!("spec.{kind}[{i}]"), c, &mut names, &mut errs);
        }
    }
    if let Some(p) = spec.restart_policy.as_deref() {
        if !["Always", "OnFailure", "Never"].contains(&p) {
            errs.push(err(
                "spec.restartPolicy",
                format!("Unsupported value: {p:?}: supported values: \"Always\", \"OnFailure\", \"Never\""),
            ));
        }
    }
    if let Some(g) = spec.termination_grace_period_seconds {
        if g < 0 {
            errs.push(err("spec.terminationGracePeriodSeconds", "must be >= 0"));
        }
    }
    if let Some(p) = spec.dns_policy.as_deref() {
        if !["ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"].contains(&p) {
            errs.push(err("spec.dnsPolicy", format!("Unsupported value: {p:?}")));
        }
        if p == "None" && spec.dns_config.is_none() {
            errs.push(err(
                "spec.dnsConfig",
                "Required value: must provide `dnsConfig` when `dnsPolicy` is None",
            ));
        }
    }
    errs
}

fn validate_container(
    path: &str,
    c: &Container,
    names: &mut HashSet<String>,
    errs: &mut Vec<FieldError>,
) {
    if c.name.is_empty() {
        errs.push(err(format!("{path}.name"), "Required value"));
    } else if !is_dns1123_label(&c.name) {
        errs.push(err(
            format!("{path}.name"),
            format!("Invalid value: {:?}: must be a DNS-1123 label", c.name),
        ));
    } else if !names.insert(c.name.clone()) {
        errs.push(err(
            format!("{path}.name"),
            format!("Duplicate value: {:?}", c.name),
        ));
    }
    if c.image.as_deref().unwrap_or("").trim().is_empty() {
        errs.push(err(format!("{path}.image"), "Required value"));
    }
    if let Some(p) = c.image_pull_policy.as_deref() {
        if !["Always", "IfNotPresent", "Never"].contains(&p) {
            errs.push(err(
                format!("{path}.imagePullPolicy"),
                format!("Unsupported value: {p:?}"),
            ));
        }
    }
    for (i, port) in c.ports.iter().flatten().enumerate() {
        if !(1..=65535).contains(&port.container_port) {
            errs.push(err(
                format!("{path}.ports[{i}].containerPort"),
                "must be between 1 and 65535, inclusive",
            ));
        }
        if let Some(h) = port.host_port {
            if !(0..=65535).contains(&h) {
                errs.push(err(
                    format!("{path}.ports[{i}].hostPort"),
                    "must be between 1 and 65535, inclusive",
                ));
            }
        }
        if let Some(p) = port.protocol.as_deref() {
            if !["TCP", "UDP", "SCTP"].contains(&p) {
                errs.push(err(
                    format!("{path}.ports[{i}].protocol"),
                    format!("Unsupported value: {p:?}"),
                ));
            }
        }
    }
    for (i, e) in c.env.iter().flatten().enumerate() {
        if e.name.is_empty() {
            errs.push(err(format!("{path}.env[{i}].name"), "Required value"));
        }
    }
    if let Some(res) = &c.resources {
        for (kind, map) in [("limits", &res.limits), ("requests", &res.requests)] {
            for (name, q) in map.iter().flatten() {
                let ok = match name.as_str() {
                    "cpu" => crate::runtime::resources::parse_cpu_millis(&q.0).is_some(),
                    "memory" | "ephemeral-storage" => {
                        crate::runtime::resources::parse_bytes(&q.0).is_some()
                    }
                    _ => true,
                };
                if !ok {
                    errs.push(err(
                        format!("{path}.resources.{kind}.{name}"),
                        format!("Invalid value: {:?}: quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'", q.0),
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn valid_pod_passes() {
        let p = pod("metadata: {name: web}\nspec:\n  containers: [{name: c, image: busybox}]\n");
        assert!(validate_pod(&p).is_empty());
    }

    #[test]
    fn errors_name_the_field() {
        let p = pod("metadata: {name: Web}\nspec:\n  restartPolicy: Sometimes\n  containers:\n  - {name: c}\n  - {name: c, image: x, ports: [{containerPort: 70000}]}\n");
        let fields: Vec<_> = validate_pod(&p).into_iter().map(|e| e.field).collect();
        assert_eq!(
            fields,
            vec![
                "metadata.name",
                "spec.containers[0].image",
                "spec.containers[1].name",
                "spec.containers[1].ports[0].containerPort",
                "spec.restartPolicy"
            ]
        );
    }
}
