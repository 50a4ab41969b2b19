//! ResourceQuotas (core/v1): validation (upstream's
//! `ValidateResourceQuota`) and the `kubectl get quota` columns.
//!
//! `status` (`hard`, `used`) is written by the ResourceQuota admission
//! ([`crate::apiserver::quota`]) and the resourcequota controller through
//! the status subresource; a create starts it empty.

use serde_json::{json, Value};

use super::Strategy;
use crate::apiserver::status::Cause;
use crate::apiserver::table::{age_cell, name_cell, Col, AGE, NAME};
use kube_util::quantity;
use kube_util::quota::{parse_list, SCOPES};

pub struct ResourceQuota;

/// Upstream's `standardQuotaResources`: names without a `/` must be one
/// of these (or a huge page size).
const STANDARD: [&str; 18] = [
    "cpu",
    "memory",
    "ephemeral-storage",
    "requests.cpu",
    "requests.memory",
    "requests.storage",
    "requests.ephemeral-storage",
    "limits.cpu",
    "limits.memory",
    "limits.ephemeral-storage",
    "pods",
    "services",
    "replicationcontrollers",
    "resourcequotas",
    "secrets",
    "persistentvolumeclaims",
    "configmaps",
    "services.nodeports",
];

/// Counted in whole objects: a fraction is refused.
fn is_integer_resource(name: &str) -> bool {
    matches!(
        name,
        "pods"
            | "services"
            | "replicationcontrollers"
            | "resourcequotas"
            | "secrets"
            | "configmaps"
            | "persistentvolumeclaims"
            | "services.nodeports"
            | "services.loadbalancers"
    ) || name.starts_with("count/")
        || name.ends_with("/persistentvolumeclaims")
}

fn is_standard(name: &str) -> bool {
    STANDARD.contains(&name)
        || name == "services.loadbalancers"
        || name.starts_with("hugepages-")
        || name.starts_with("requests.hugepages-")
}

/// The pod resources a scope can be applied to (upstream's
/// `IsResourceQuotaScopeValidForResource`): BestEffort pods request no
/// compute, so only their number can be limited.
fn scope_fits(scope: &str, resource: &str) -> bool {
    let compute = matches!(
        resource,
        "cpu" | "memory" | "requests.cpu" | "requests.memory" | "limits.cpu" | "limits.memory"
    );
    match scope {
        "BestEffort" => resource == "pods",
        "Terminating"
        | "NotTerminating"
        | "NotBestEffort"
        | "PriorityClass"
        | "CrossNamespacePodAffinity" => resource == "pods" || compute,
        _ => true,
    }
}

/// Go's rendering of a scope list in upstream's messages.
fn go_scopes(scopes: &[&str]) -> String {
    let quoted: Vec<String> = scopes.iter().map(|s| format!("{s:?}")).collect();
    format!("[]core.ResourceQuotaScope{{{}}}", quoted.join(", "))
}

fn validate_list(list: &Value, path: &str, c: &mut Vec<Cause>) {
    let Some(m) = list.as_object() else {
        return;
    };
    for (k, v) in m {
        let field = format!("{path}[{k}]");
        if !k.contains('/') && !is_standard(k) {
            c.push(Cause::invalid(
                &field,
                k,
                "must be a standard resource for quota",
            ));
        }
        let q = v
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| v.to_string());
        match quantity::scaled(&q, -3) {
            Err(_) => c.push(Cause::invalid(
                &field,
                &q,
                crate::apiserver::validation::QUANTITY_MESSAGE,
            )),
            Ok(n) if n < 0 => c.push(Cause::invalid(
                &field,
                &q,
                "must be greater than or equal to 0",
            )),
            Ok(n) if n % 1000 != 0 && is_integer_resource(k) => {
                c.push(Cause::invalid(&field, &q, "must be an integer"))
            }
            Ok(_) => {}
        }
    }
}

/// Both halves of a pair of opposite scopes selected at once.
fn conflicting(scopes: &[&str]) -> bool {
    [
        ("BestEffort", "NotBestEffort"),
        ("Terminating", "NotTerminating"),
    ]
    .iter()
    .any(|(a, b)| scopes.contains(a) && scopes.contains(b))
}

impl Strategy for ResourceQuota {
    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        let spec = &obj["spec"];
        validate_list(&spec["hard"], "spec.hard", &mut c);
        validate_list(&obj["status"]["hard"], "status.hard", &mut c);
        validate_list(&obj["status"]["used"], "status.used", &mut c);
        let hard: Vec<String> = parse_list(&spec["hard"]).into_keys().collect();
        let scopes: Vec<&str> = spec["scopes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let shown = go_scopes(&scopes);
        for (i, scope) in scopes.iter().enumerate() {
            if !SCOPES.contains(scope) {
                c.push(Cause::invalid("spec.scopes", &shown, "unsupported scope"));
            } else if *scope == "CrossNamespacePodAffinity" {
                // Matching needs every pod's affinity terms against
                // namespaces this server does not track for quotas.
                c.push(Cause::invalid(
                    format!("spec.scopes[{i}]"),
                    scope,
                    "the CrossNamespacePodAffinity scope is not supported by this server",
                ));
            }
            if hard.iter().any(|k| is_standard(k) && !scope_fits(scope, k)) {
                c.push(Cause::invalid(
                    "spec.scopes",
                    &shown,
                    "unsupported scope applied to resource",
                ));
            }
        }
        if conflicting(&scopes) {
            c.push(Cause::invalid("spec.scopes", &shown, "conflicting scopes"));
        }
        let exprs = spec["scopeSelector"]["matchExpressions"].as_array();
        let mut selected = Vec::new();
        for (i, e) in exprs.into_iter().flatten().enumerate() {
            let path = format!("spec.scopeSelector.matchExpressions[{i}]");
            let scope = e["scopeName"].as_str().unwrap_or_default();
            let op = e["operator"].as_str().unwrap_or_default();
            let values = e["values"].as_array().map_or(0, Vec::len);
            if !SCOPES.contains(&scope) {
                c.push(Cause::invalid(
                    format!("{path}.scopeName"),
                    scope,
                    "unsupported scope",
                ));
            } else if scope == "CrossNamespacePodAffinity" {
                c.push(Cause::invalid(
                    format!("{path}.scopeName"),
                    scope,
                    "the CrossNamespacePodAffinity scope is not supported by this server",
                ));
            }
            if hard.iter().any(|k| is_standard(k) && !scope_fits(scope, k)) {
                c.push(Cause::invalid(
                    "spec.scopeSelector.matchExpressions",
                    &spec["scopeSelector"].to_string(),
                    "unsupported scope applied to resource",
                ));
            }
            if scope != "PriorityClass" && SCOPES.contains(&scope) && op != "Exists" {
                c.push(Cause::invalid(format!("{path}.operator"), op, "must be 'Exist' when scope is any of ResourceQuotaScopeTerminating, ResourceQuotaScopeNotTerminating, ResourceQuotaScopeBestEffort, ResourceQuotaScopeNotBestEffort or ResourceQuotaScopeCrossNamespacePodAffinity"));
            }
            match op {
                "In" | "NotIn" if values == 0 => c.push(Cause::required_because(
                    format!("{path}.values"),
                    "must be at least one value when `operator` is 'In' or 'NotIn' for scope selector",
                )),
                "Exists" | "DoesNotExist" if values != 0 => c.push(Cause::invalid(
                    format!("{path}.values"),
                    &e["values"].to_string(),
                    "must be no value when `operator` is 'Exist' or 'DoesNotExist' for scope selector",
                )),
                "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
                _ => c.push(Cause::not_supported(
                    format!("{path}.operator"),
                    op,
                    &["DoesNotExist", "Exists", "In", "NotIn"],
                )),
            }
            selected.push(scope);
        }
        if conflicting(&selected) {
            c.push(Cause::invalid(
                "spec.scopeSelector.matchExpressions",
                &spec["scopeSelector"].to_string(),
                "conflicting scopes",
            ));
        }
        c
    }

    fn columns(&self) -> Vec<Col> {
        vec![
            NAME,
            AGE,
            (
                "Request",
                "string",
                0,
                "Request represents a minimum amount of cpu/memory that a container may consume.",
            ),
            (
                "Limit",
                "string",
                0,
                "Limits control the maximum amount of cpu/memory that a container may use independent of contention on the node.",
            ),
        ]
    }

    /// `pods: 2/10, requests.cpu: 500m/1` for each hard resource, in name
    /// order, `limits.*` in their own column (upstream's
    /// `printResourceQuota`).
    fn cells(&self, obj: &Value) -> Vec<Value> {
        let (mut request, mut limit) = (Vec::new(), Vec::new());
        if let Some(hard) = obj["spec"]["hard"].as_object() {
            for (k, v) in hard {
                let shown = |v: &Value| v.as_str().map_or_else(|| v.to_string(), str::to_string);
                let used = obj["status"]["used"]
                    .get(k)
                    .map_or_else(|| "0".to_string(), shown);
                let cell = format!("{k}: {used}/{}", shown(v));
                if k.starts_with("limits.") {
                    limit.push(cell);
                } else {
                    request.push(cell);
                }
            }
        }
        vec![
            name_cell(obj),
            age_cell(obj),
            json!(request.join(", ")),
            json!(limit.join(", ")),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn causes(spec: Value) -> Vec<String> {
        ResourceQuota
            .validate(&json!({"spec": spec}))
            .into_iter()
            .map(|c| c.line())
            .collect()
    }

    #[test]
    fn hard_amounts_and_names() {
        assert!(causes(json!({"hard": {"pods": "10", "requests.cpu": "500m",
            "count/deployments.apps": "2", "requests.example.com/gpu": "1"}}))
        .is_empty());
        assert_eq!(
            causes(json!({"hard": {"pods": "-1"}})),
            vec!["spec.hard[pods]: Invalid value: \"-1\": must be greater than or equal to 0"]
        );
        assert_eq!(
            causes(json!({"hard": {"pods": "1500m"}})),
            vec!["spec.hard[pods]: Invalid value: \"1500m\": must be an integer"]
        );
        assert_eq!(
            causes(json!({"hard": {"gpus": "1"}})),
            vec!["spec.hard[gpus]: Invalid value: \"gpus\": must be a standard resource for quota"]
        );
        assert_eq!(causes(json!({"hard": {"cpu": "lots"}})).len(), 1);
    }

    #[test]
    fn scopes_fit_their_resources() {
        assert!(causes(json!({"hard": {"pods": "1"}, "scopes": ["BestEffort"]})).is_empty());
        assert_eq!(
            causes(json!({"hard": {"cpu": "1"}, "scopes": ["BestEffort"]})),
            vec!["spec.scopes: Invalid value: \"[]core.ResourceQuotaScope{\\\"BestEffort\\\"}\": unsupported scope applied to resource"]
        );
        let both =
            causes(json!({"hard": {"pods": "1"}, "scopes": ["Terminating", "NotTerminating"]}));
        assert_eq!(both.len(), 1);
        assert!(both[0].ends_with("conflicting scopes"));
        assert!(
            causes(json!({"hard": {"pods": "1"}, "scopes": ["Sometimes"]}))[0]
                .ends_with("unsupported scope")
        );
        assert!(
            causes(json!({"hard": {"pods": "1"}, "scopes": ["CrossNamespacePodAffinity"]}))[0]
                .contains("not supported by this server")
        );
    }

    #[test]
    fn scope_selector_operators() {
        let sel =
            |e: Value| json!({"hard": {"pods": "1"}, "scopeSelector": {"matchExpressions": [e]}});
        assert!(causes(sel(
            json!({"scopeName": "PriorityClass", "operator": "In", "values": ["a"]})
        ))
        .is_empty());
        assert_eq!(
            causes(sel(json!({"scopeName": "PriorityClass", "operator": "In"}))),
            vec!["spec.scopeSelector.matchExpressions[0].values: Required value: must be at least one value when `operator` is 'In' or 'NotIn' for scope selector"]
        );
        assert_eq!(
            causes(sel(json!({"scopeName": "PriorityClass", "operator": "Is"}))),
            vec!["spec.scopeSelector.matchExpressions[0].operator: Unsupported value: \"Is\": supported values: \"DoesNotExist\", \"Exists\", \"In\", \"NotIn\""]
        );
        assert_eq!(
            causes(sel(
                json!({"scopeName": "BestEffort", "operator": "In", "values": ["x"]})
            ))
            .len(),
            1
        );
        assert!(causes(sel(
            json!({"scopeName": "Terminating", "operator": "Exists"})
        ))
        .is_empty());
    }

    #[test]
    fn cells_show_used_over_hard() {
        let q = json!({"metadata": {"name": "q"},
            "spec": {"hard": {"pods": "10", "requests.cpu": "1", "limits.memory": "1Gi"}},
            "status": {"used": {"pods": "2", "requests.cpu": "500m"}}});
        let cells = ResourceQuota.cells(&q);
        assert_eq!(cells[2], json!("pods: 2/10, requests.cpu: 500m/1"));
        assert_eq!(cells[3], json!("limits.memory: 0/1Gi"));
    }
}
