//! ReplicationControllers (`core/v1`): defaults, validation and the
//! `kubectl get rc` columns (upstream `pkg/registry/core/replicationcontroller`
//! and `ValidateReplicationController`). Their selector is a plain label
//! map, matched by equality.

use serde_json::{json, Value};

use super::Strategy;
use crate::apiserver::defaults::{obj_field, set, template};
use crate::apiserver::objects;
use crate::apiserver::selectors::LabelSelector;
use crate::apiserver::status::Cause;
use crate::apiserver::table::{
    age_cell, i, name_cell, or_none, s, template_containers, Col, AGE, NAME, TEMPLATE,
};
use crate::apiserver::validation;

pub struct ReplicationController;

impl Strategy for ReplicationController {
    /// Upstream `SetDefaults_ReplicationController`: the template's labels
    /// stand in for a missing selector and missing object labels.
    fn default(&self, obj: &mut Value) {
        let tmpl_labels = obj["spec"]["template"]["metadata"]["labels"].clone();
        let has_labels = |v: &Value| v.as_object().is_some_and(|m| !m.is_empty());
        if has_labels(&tmpl_labels) {
            if !has_labels(&obj["spec"]["selector"]) {
                obj_field(obj, "spec").insert("selector".into(), tmpl_labels.clone());
            }
            if !has_labels(&obj["metadata"]["labels"]) {
                obj_field(obj, "metadata").insert("labels".into(), tmpl_labels);
            }
        }
        let spec = obj_field(obj, "spec");
        set(spec, "replicas", json!(1));
        template(spec);
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        let spec = &obj["spec"];
        for field in ["replicas", "minReadySeconds"] {
            if let Some(n) = spec[field].as_i64().filter(|n| *n < 0) {
                c.push(Cause::invalid(
                    format!("spec.{field}"),
                    &n.to_string(),
                    "must be greater than or equal to 0",
                ));
            }
        }
        let selector = spec["selector"].as_object().filter(|m| !m.is_empty());
        if selector.is_none() {
            c.push(Cause::required("spec.selector"));
        }
        let tmpl = &spec["template"];
        if !tmpl.is_object() {
            c.push(Cause::required("spec.template"));
            return c;
        }
        if let Some(sel) = selector {
            if !LabelSelector::from_map(sel).matches_labels(&objects::labels(tmpl)) {
                let shown = serde_json::to_string(&tmpl["metadata"]["labels"]).unwrap_or_default();
                c.push(Cause::invalid(
                    "spec.template.metadata.labels",
                    &shown,
                    "`selector` does not match template `labels`",
                ));
            }
        }
        let pod = tmpl.get("spec");
        validation::pod_spec("spec.template.spec", pod, &mut c);
        super::pod::security::validate("spec.template.spec", pod, &mut c);
        super::pod::affinity::validate("spec.template.spec", pod, &mut c);
        match pod.and_then(|p| p["restartPolicy"].as_str()) {
            Some("Always") | None => {}
            Some(rp) => c.push(Cause::not_supported(
                "spec.template.spec.restartPolicy",
                rp,
                &["Always"],
            )),
        }
        if pod.is_some_and(|p| !p["activeDeadlineSeconds"].is_null()) {
            c.push(Cause::forbidden(
                "spec.template.spec.activeDeadlineSeconds",
                "activeDeadlineSeconds in ReplicationController is not Supported",
            ));
        }
        c
    }

    fn columns(&self) -> Vec<Col> {
        let mut cols = vec![
            NAME,
            ("Desired", "integer", 0, "Number of desired pods."),
            ("Current", "integer", 0, "Number of actual replicas."),
            (
                "Ready",
                "integer",
                0,
                "The number of ready replicas for this replication controller.",
            ),
            AGE,
        ];
        cols.extend(TEMPLATE);
        cols
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let (spec, st) = (&obj["spec"], &obj["status"]);
        let (containers, images) = template_containers(obj);
        let selector: Vec<String> = spec["selector"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| format!("{k}={}", s(v)))
            .collect();
        vec![
            name_cell(obj),
            json!(i(&spec["replicas"])),
            json!(i(&st["replicas"])),
            json!(i(&st["readyReplicas"])),
            age_cell(obj),
            json!(containers),
            json!(images),
            json!(or_none(selector.join(","))),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rc() -> Value {
        json!({
            "metadata": {"name": "web"},
            "spec": {"template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "c", "image": "nginx"}]}
            }}
        })
    }

    #[test]
    fn selector_and_labels_default_from_the_template() {
        let mut obj = rc();
        ReplicationController.default(&mut obj);
        assert_eq!(obj["spec"]["selector"], json!({"app": "web"}));
        assert_eq!(obj["metadata"]["labels"], json!({"app": "web"}));
        assert_eq!(obj["spec"]["replicas"], json!(1));
        assert!(ReplicationController.validate(&obj).is_empty());
    }

    #[test]
    fn selector_must_match_template_labels() {
        let mut obj = rc();
        obj["spec"]["selector"] = json!({"app": "other"});
        ReplicationController.default(&mut obj);
        let causes = ReplicationController.validate(&obj);
        assert_eq!(causes.len(), 1, "{causes:?}");
        let shown = format!("{causes:?}");
        assert!(shown.contains("spec.template.metadata.labels"), "{shown}");
        assert!(
            shown.contains("`selector` does not match template `labels`"),
            "{shown}"
        );
    }

    #[test]
    fn restart_policy_must_be_always() {
        let mut obj = rc();
        obj["spec"]["template"]["spec"]["restartPolicy"] = json!("Never");
        ReplicationController.default(&mut obj);
        let shown = format!("{:?}", ReplicationController.validate(&obj));
        assert!(
            shown.contains("spec.template.spec.restartPolicy"),
            "{shown}"
        );
    }
}
