//! ConfigMaps (`core/v1`): key validation and the `kubectl get
//! configmaps` columns.

use serde_json::{json, Value};

use super::Strategy;
use crate::apiserver::status::Cause;
use crate::apiserver::table::{age_cell, name_cell, Col, AGE, NAME};
use crate::apiserver::validation;

pub struct ConfigMap;

impl Strategy for ConfigMap {
    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        validation::data_keys(obj, &mut c);
        validation::data_size(obj, &["data"], &["binaryData"], "", &mut c);
        c
    }

    fn columns(&self) -> Vec<Col> {
        vec![NAME, ("Data", "string", 0, "Number of data entries."), AGE]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let n = obj["data"].as_object().map_or(0, |m| m.len())
            + obj["binaryData"].as_object().map_or(0, |m| m.len());
        vec![name_cell(obj), json!(n), age_cell(obj)]
    }
}
