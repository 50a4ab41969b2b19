//! ControllerRevisions (`apps/v1`): the immutable snapshots of a
//! StatefulSet's or DaemonSet's template that rollouts go back to
//! (upstream's `pkg/registry/apps/controllerrevision/strategy.go`).

use serde_json::{json, Value};

use super::Strategy;
use crate::apiserver::status::Cause;
use crate::apiserver::table::{age_cell, i, name_cell, Col, AGE, NAME};

pub struct ControllerRevision;

impl Strategy for ControllerRevision {
    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        let rev = &obj["revision"];
        if rev.as_i64().is_none_or(|r| r < 0) {
            c.push(Cause::invalid(
                "revision",
                &rev.to_string(),
                "must be greater than or equal to 0",
            ));
        }
        c
    }

    fn validate_update(&self, old: &Value, new: &Value) -> Vec<Cause> {
        let mut c = self.validate(new);
        // The data is what a rollback restores: changing it in place would
        // rewrite history. The number may change (upstream renumbers a
        // revision rolled back to, so it becomes the newest).
        if old["data"] != new["data"] {
            c.push(Cause::invalid(
                "data",
                &new["data"].to_string(),
                "field is immutable",
            ));
        }
        c
    }

    fn columns(&self) -> Vec<Col> {
        vec![
            NAME,
            (
                "Controller",
                "string",
                0,
                "Controller of the object, with the form <kind>/<name>",
            ),
            (
                "Revision",
                "integer",
                0,
                "Revision represents the revision of the data.",
            ),
            AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let owner = obj["metadata"]["ownerReferences"]
            .as_array()
            .and_then(|refs| refs.iter().find(|r| r["controller"] == true))
            .map(|r| {
                let group = r["apiVersion"]
                    .as_str()
                    .and_then(|av| av.split_once('/'))
                    .map(|(g, _)| format!(".{g}"))
                    .unwrap_or_default();
                format!(
                    "{}{group}/{}",
                    r["kind"].as_str().unwrap_or_default().to_lowercase(),
                    r["name"].as_str().unwrap_or_default()
                )
            })
            .unwrap_or_else(|| "<none>".into());
        vec![
            name_cell(obj),
            json!(owner),
            json!(i(&obj["revision"])),
            age_cell(obj),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_is_immutable_the_number_is_not() {
        let old = json!({"metadata": {"name": "r"}, "data": {"a": 1}, "revision": 1});
        let mut new = old.clone();
        assert!(ControllerRevision.validate_update(&old, &new).is_empty());
        new["revision"] = json!(2);
        assert!(ControllerRevision.validate_update(&old, &new).is_empty());
        new["data"] = json!({"a": 2});
        assert_eq!(ControllerRevision.validate_update(&old, &new).len(), 1);
        new["revision"] = json!(-1);
        assert!(!ControllerRevision.validate(&new).is_empty());
    }
}
