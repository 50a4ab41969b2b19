//! Secrets (`core/v1`): the default type, `stringData` folded into
//! `data`, key validation and the `kubectl get secrets` columns.

use serde_json::{json, Value};

use super::Strategy;
use crate::apiserver::status::Cause;
use crate::apiserver::table::{age_cell, name_cell, s, Col, AGE, NAME};
use crate::apiserver::validation;

pub struct Secret;

const SERVICE_ACCOUNT_TOKEN: &str = "kubernetes.io/service-account-token";
const SA_NAME_ANNOTATION: &str = "kubernetes.io/service-account.name";

impl Strategy for Secret {
    fn default(&self, obj: &mut Value) {
        let m = obj.as_object_mut().expect("objects are maps");
        if !m.contains_key("type") {
            m.insert("type".into(), json!("Opaque"));
        }
        // stringData is write-only: fold it into data (base64), as upstream.
        if let Some(Value::Object(sd)) = m.remove("stringData") {
            use base64::Engine;
            let data = m.entry("data").or_insert_with(|| json!({}));
            if let Some(d) = data.as_object_mut() {
                for (k, v) in sd {
                    let s = v.as_str().unwrap_or_default();
                    d.insert(
                        k,
                        json!(base64::engine::general_purpose::STANDARD.encode(s)),
                    );
                }
            }
        }
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        // The token controller fills these in for the account they name.
        if obj["type"] == SERVICE_ACCOUNT_TOKEN
            && obj["metadata"]["annotations"][SA_NAME_ANNOTATION]
                .as_str()
                .is_none_or(str::is_empty)
        {
            c.push(Cause::required(format!(
                "metadata.annotations[{SA_NAME_ANNOTATION}]"
            )));
        }
        validation::data_keys(obj, &mut c);
        validation::data_size(obj, &[], &["data"], "data", &mut c);
        c
    }

    fn selectable_fields(&self) -> &'static [&'static str] {
        &["type"]
    }

    fn columns(&self) -> Vec<Col> {
        vec![
            NAME,
            ("Type", "string", 0, "The type of the secret"),
            (
                "Data",
                "string",
                0,
                "The number of data entries in the secret",
            ),
            AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let n = obj["data"].as_object().map_or(0, |m| m.len());
        vec![
            name_cell(obj),
            json!(s(&obj["type"])),
            json!(n),
            age_cell(obj),
        ]
    }
}
