//! RuntimeClasses (`node.k8s.io/v1`): validation as upstream's
//! `pkg/apis/node/validation` (`ValidateRuntimeClass(Update)`), and the
//! `kubectl get runtimeclass` columns (NAME, HANDLER, AGE).
//!
//! What a class does to the pods that name it (overhead, node selector,
//! tolerations) is the RuntimeClass admission plugin's
//! ([`crate::apiserver::runtimeclass`]); the agent reads `handler` to pick
//! the CRI runtime handler.

use serde_json::{json, Value};

use super::Strategy;
use crate::apiserver::status::Cause;
use crate::apiserver::table::{age_cell, name_cell, s, Col, AGE, NAME};
use crate::apiserver::validation::{self, is_dns_label, DNS_LABEL_MESSAGE};

pub struct RuntimeClass;

/// Resources a pod's overhead may name without a domain (upstream's
/// `IsStandardContainerResourceName`), besides `hugepages-<size>`.
const STANDARD_RESOURCES: [&str; 3] = ["cpu", "memory", "ephemeral-storage"];

impl Strategy for RuntimeClass {
    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        handler(&s(&obj["handler"]), &mut c);
        if let Some(overhead) = obj.get("overhead").filter(|o| !o.is_null()) {
            pod_fixed(&overhead["podFixed"], &mut c);
        }
        let scheduling = &obj["scheduling"];
        validation::label_map(
            &scheduling["nodeSelector"],
            "scheduling.nodeSelector",
            &mut c,
        );
        validation::tolerations(&scheduling["tolerations"], "scheduling.tolerations", &mut c);
        c
    }

    /// Pods already running were started by this handler: a class that
    /// changed it would misdescribe them, so only a new class may.
    fn validate_update(&self, old: &Value, new: &Value) -> Vec<Cause> {
        let mut c = self.validate(new);
        if old["handler"] != new["handler"] {
            c.push(Cause::invalid(
                "handler",
                &s(&new["handler"]),
                "field is immutable",
            ));
        }
        c
    }

    fn columns(&self) -> Vec<Col> {
        vec![
            NAME,
            (
                "Handler",
                "string",
                0,
                "handler specifies the underlying runtime and configuration that the CRI implementation will use to handle pods of this class.",
            ),
            AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        vec![name_cell(obj), json!(s(&obj["handler"])), age_cell(obj)]
    }
}

/// `handler`: a DNS-1123 label (upstream's `NameIsDNSLabel`). Upstream
/// answers an empty handler with the label message rather than "Required
/// value", and so does this.
fn handler(h: &str, c: &mut Vec<Cause>) {
    if h.len() > 63 {
        c.push(Cause::invalid(
            "handler",
            h,
            "must be no more than 63 characters",
        ));
    } else if !is_dns_label(h) {
        c.push(Cause::invalid("handler", h, DNS_LABEL_MESSAGE));
    }
}

/// `overhead.podFixed`: resource names a container could request and
/// quantities that are not negative. Upstream validates it by reusing
/// `ValidateResourceRequirements` with the map as `limits`, so its causes
/// read `overhead.limits[<name>]`; kubectl users see that path, so it is
/// kept.
fn pod_fixed(fixed: &Value, c: &mut Vec<Cause>) {
    for (name, q) in fixed.as_object().into_iter().flatten() {
        let field = format!("overhead.limits[{name}]");
        if !validation::is_qualified_name(name) {
            c.push(Cause::invalid(
                &field,
                name,
                validation::QUALIFIED_NAME_MESSAGE,
            ));
        } else if !name.contains('/')
            && !STANDARD_RESOURCES.contains(&name.as_str())
            && !name.starts_with("hugepages-")
        {
            c.push(Cause::invalid(
                &field,
                name,
                "must be a standard resource for containers",
            ));
        }
        let text = s(q);
        match kube_util::quantity::compare(&text, "0") {
            None => c.push(Cause::invalid(&field, &text, validation::QUANTITY_MESSAGE)),
            Some(std::cmp::Ordering::Less) => c.push(Cause::invalid(
                &field,
                &text,
                "must be greater than or equal to 0",
            )),
            Some(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rc(handler: &str) -> Value {
        json!({"metadata": {"name": "gvisor"}, "handler": handler})
    }

    fn causes(c: Vec<Cause>) -> Vec<String> {
        c.iter().map(|c| c.line()).collect()
    }

    #[test]
    fn handler_is_a_dns_label() {
        assert!(RuntimeClass.validate(&rc("runsc")).is_empty());
        let c = causes(RuntimeClass.validate(&rc("Bad_Name")));
        assert_eq!(c.len(), 1);
        assert!(
            c[0].starts_with("handler: Invalid value: \"Bad_Name\": a lowercase RFC 1123 label"),
            "{c:?}"
        );
        assert_eq!(RuntimeClass.validate(&rc(""))[0].field, "handler");
        let long = "a".repeat(64);
        assert!(causes(RuntimeClass.validate(&rc(&long)))[0]
            .ends_with("must be no more than 63 characters"));
    }

    #[test]
    fn overhead_and_scheduling_are_checked() {
        let mut obj = rc("runsc");
        obj["overhead"] = json!({"podFixed": {"cpu": "250m", "memory": "120Mi"}});
        obj["scheduling"] = json!({
            "nodeSelector": {"skiff.io/sandbox": "true"},
            "tolerations": [{"key": "sandbox", "operator": "Exists", "effect": "NoSchedule"}],
        });
        assert!(RuntimeClass.validate(&obj).is_empty());
        obj["overhead"] = json!({"podFixed": {"cpu": "-1", "memory": "lots", "gpu": "1"}});
        obj["scheduling"] = json!({
            "nodeSelector": {"bad key!": "x", "ok": "bad value!"},
            "tolerations": [
                {"operator": "Equal", "value": "x"},
                {"key": "k", "operator": "Exists", "value": "v"},
                {"key": "k", "operator": "Near"},
                {"key": "k", "effect": "Sometimes", "tolerationSeconds": 5},
            ],
        });
        let fields: Vec<String> = RuntimeClass
            .validate(&obj)
            .into_iter()
            .map(|c| c.field)
            .collect();
        assert_eq!(
            fields,
            [
                "overhead.limits[cpu]",
                "overhead.limits[gpu]",
                "overhead.limits[memory]",
                "scheduling.nodeSelector",
                "scheduling.nodeSelector",
                "scheduling.tolerations[0].operator",
                "scheduling.tolerations[1].operator",
                "scheduling.tolerations[2].operator",
                "scheduling.tolerations[3].effect",
                "scheduling.tolerations[3].effect",
            ]
        );
        let c = causes(RuntimeClass.validate(&obj));
        assert!(
            c[0].ends_with("must be greater than or equal to 0"),
            "{c:?}"
        );
        assert!(c[1].ends_with("must be a standard resource for containers"));
        assert!(c[2].contains("quantities must match the regular expression"));
    }

    #[test]
    fn handler_is_immutable_the_rest_is_not() {
        let old = rc("runsc");
        let mut new = old.clone();
        new["scheduling"] = json!({"nodeSelector": {"a": "b"}});
        assert!(RuntimeClass.validate_update(&old, &new).is_empty());
        new["handler"] = json!("kata");
        assert_eq!(
            causes(RuntimeClass.validate_update(&old, &new)),
            ["handler: Invalid value: \"kata\": field is immutable"]
        );
    }

    #[test]
    fn rows_show_the_handler() {
        let cells = RuntimeClass.cells(&rc("runsc"));
        assert_eq!(cells.len(), RuntimeClass.columns().len());
        assert_eq!(&cells[..2], &[json!("gvisor"), json!("runsc")]);
    }
}
