//! APIServices (apiregistration.k8s.io/v1): validation as upstream's
//! kube-aggregator, and the `kubectl get apiservices` columns. The
//! built-in group versions' `Local` APIServices, availability and the
//! proxying of registered ones are [`crate::apiserver::aggregator`]'s.

use serde_json::{json, Value};

use super::{NameRule, Strategy};
use crate::apiserver::defaults::set;
use crate::apiserver::status::Cause;
use crate::apiserver::table::{age_cell, name_cell, Col, AGE, NAME};

pub struct ApiService;

impl Strategy for ApiService {
    /// `v1.` (the core group) is a name: upstream checks APIService names
    /// as path segments.
    fn name_rule(&self) -> NameRule {
        NameRule::PathSegment
    }

    fn default(&self, obj: &mut Value) {
        if let Some(svc) = obj
            .get_mut("spec")
            .and_then(|s| s.get_mut("service"))
            .and_then(Value::as_object_mut)
        {
            set(svc, "port", json!(443));
        }
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        let spec = &obj["spec"];
        let name = obj["metadata"]["name"].as_str().unwrap_or_default();
        let group = spec["group"].as_str().unwrap_or_default();
        let version = spec["version"].as_str().unwrap_or_default();
        if version.is_empty() {
            c.push(Cause::required("spec.version"));
        }
        if name != format!("{version}.{group}") {
            c.push(Cause::invalid(
                "metadata.name",
                name,
                "must be `spec.version+\".\"+spec.group`",
            ));
        }
        let priority = |field: &str, max: i64, c: &mut Vec<Cause>| {
            let v = spec[field].as_i64().unwrap_or(0);
            if v <= 0 || v > max {
                c.push(Cause::invalid_json(
                    format!("spec.{field}"),
                    &json!(v),
                    &format!("must be positive and less than {max}"),
                ));
            }
        };
        priority("groupPriorityMinimum", 20000, &mut c);
        priority("versionPriority", 1000, &mut c);
        let svc = &spec["service"];
        if svc.is_object() {
            for k in ["namespace", "name"] {
                if svc[k].as_str().is_none_or(str::is_empty) {
                    c.push(Cause::required(format!("spec.service.{k}")));
                }
            }
            if let Some(port) = svc["port"].as_i64() {
                if !(1..=65535).contains(&port) {
                    c.push(Cause::invalid_json(
                        "spec.service.port",
                        &json!(port),
                        "port is not valid: must be between 1 and 65535, inclusive",
                    ));
                }
            }
        }
        let has_ca = spec["caBundle"].as_str().is_some_and(|b| !b.is_empty());
        if spec["insecureSkipTLSVerify"] == true && has_ca {
            c.push(Cause::invalid_json(
                "spec.insecureSkipTLSVerify",
                &json!(true),
                "may not be true if caBundle is present",
            ));
        }
        c
    }

    fn validate_update(&self, _old: &Value, new: &Value) -> Vec<Cause> {
        self.validate(new)
    }

    fn columns(&self) -> Vec<Col> {
        vec![
            NAME,
            (
                "Service",
                "string",
                0,
                "The reference to the service that hosts this API endpoint.",
            ),
            (
                "Available",
                "string",
                0,
                "Whether this service is available.",
            ),
            AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let svc = &obj["spec"]["service"];
        let service = match (svc["namespace"].as_str(), svc["name"].as_str()) {
            (Some(ns), Some(n)) => format!("{ns}/{n}"),
            _ => "Local".into(),
        };
        let available = obj["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Available")
            .map_or("Unknown".to_string(), |c| {
                let status = c["status"].as_str().unwrap_or("Unknown");
                match c["reason"].as_str() {
                    Some(reason) if status != "True" => format!("{status} ({reason})"),
                    _ => status.to_string(),
                }
            });
        vec![
            name_cell(obj),
            json!(service),
            json!(available),
            age_cell(obj),
        ]
    }
}
