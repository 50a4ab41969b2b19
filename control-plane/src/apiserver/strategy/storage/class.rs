//! StorageClasses (`storage.k8s.io/v1`): upstream's defaults, validation
//! and the fields no update may change (`ValidateStorageClass(Update)`),
//! and the `kubectl get sc` columns with `(default)` after the default
//! class's name.

use serde_json::{json, Value};

use super::super::Strategy;
use super::s;
use crate::apiserver::defaults::set;
use crate::apiserver::status::Cause;
use crate::apiserver::table::{age_cell, Col, AGE, NAME};
use kube_util::storage::{BETA_DEFAULT_CLASS_ANNOTATION, DEFAULT_CLASS_ANNOTATION};

pub struct StorageClass;

const RECLAIM_POLICIES: [&str; 2] = ["Delete", "Retain"];
const BINDING_MODES: [&str; 2] = ["Immediate", "WaitForFirstConsumer"];

/// Whether a class is marked default (upstream's `IsDefaultAnnotation`:
/// the GA annotation or the beta one, `"true"`).
pub fn is_default(class: &Value) -> bool {
    let a = &class["metadata"]["annotations"];
    a[DEFAULT_CLASS_ANNOTATION] == "true" || a[BETA_DEFAULT_CLASS_ANNOTATION] == "true"
}

impl Strategy for StorageClass {
    fn default(&self, obj: &mut Value) {
        if let Some(m) = obj.as_object_mut() {
            set(m, "reclaimPolicy", json!("Delete"));
            set(m, "volumeBindingMode", json!("Immediate"));
        }
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        match obj["provisioner"].as_str().filter(|p| !p.is_empty()) {
            None => c.push(Cause::required("provisioner")),
            Some(p) => qualified_name("provisioner", p, &mut c),
        }
        if let Some(params) = obj["parameters"].as_object() {
            if params.keys().any(String::is_empty) {
                c.push(Cause::invalid("parameters", "", "empty key"));
            }
        }
        let policy = s(&obj["reclaimPolicy"]);
        if !RECLAIM_POLICIES.contains(&policy.as_str()) {
            c.push(Cause::not_supported(
                "reclaimPolicy",
                &policy,
                &RECLAIM_POLICIES,
            ));
        }
        match obj["volumeBindingMode"].as_str() {
            None => c.push(Cause::required("volumeBindingMode")),
            Some(m) if !BINDING_MODES.contains(&m) => {
                c.push(Cause::not_supported("volumeBindingMode", m, &BINDING_MODES))
            }
            Some(_) => {}
        }
        c
    }

    /// Volumes already provisioned by the class were made from these
    /// fields; changing them would make the class lie about its volumes.
    fn validate_update(&self, old: &Value, new: &Value) -> Vec<Cause> {
        let mut c = self.validate(new);
        let params = |v: &Value| v["parameters"].as_object().cloned().unwrap_or_default();
        if params(old) != params(new) {
            c.push(Cause::forbidden(
                "parameters",
                "updates to parameters are forbidden.",
            ));
        }
        for f in ["provisioner", "reclaimPolicy"] {
            if old[f] != new[f] {
                c.push(Cause::forbidden(
                    f,
                    &format!("updates to {f} are forbidden."),
                ));
            }
        }
        if old["volumeBindingMode"] != new["volumeBindingMode"] {
            c.push(Cause::invalid(
                "volumeBindingMode",
                &s(&new["volumeBindingMode"]),
                "field is immutable",
            ));
        }
        c
    }

    fn columns(&self) -> Vec<Col> {
        vec![
            NAME,
            ("Provisioner", "string", 0, "Indicates the type of the provisioner."),
            ("ReclaimPolicy", "string", 0, "Dynamically provisioned PersistentVolumes of this storage class are created with this reclaimPolicy. Defaults to Delete."),
            ("VolumeBindingMode", "string", 0, "VolumeBindingMode indicates how PersistentVolumeClaims should be provisioned and bound. When unset, VolumeBindingImmediate is used."),
            ("AllowVolumeExpansion", "string", 0, "AllowVolumeExpansion shows whether the storage class allow volume expand."),
            AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let mut name = s(&obj["metadata"]["name"]);
        if is_default(obj) {
            name.push_str(" (default)");
        }
        let or = |v: &Value, d: &str| match v.as_str() {
            Some(x) if !x.is_empty() => x.to_string(),
            _ => d.to_string(),
        };
        vec![
            json!(name),
            json!(s(&obj["provisioner"])),
            json!(or(&obj["reclaimPolicy"], "Delete")),
            json!(or(&obj["volumeBindingMode"], "Immediate")),
            json!(obj["allowVolumeExpansion"].as_bool().unwrap_or(false)),
            age_cell(obj),
        ]
    }
}

/// A qualified name, `[prefix/]name` (upstream checks provisioners with
/// `IsQualifiedName` on the lower-cased text).
fn qualified_name(field: &str, v: &str, c: &mut Vec<Cause>) {
    let lower = v.to_lowercase();
    let (prefix, name) = match lower.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, lower.as_str()),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && name.starts_with(|ch: char| ch.is_ascii_alphanumeric())
        && name.ends_with(|ch: char| ch.is_ascii_alphanumeric());
    if !name_ok {
        c.push(Cause::invalid(field, v, "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"));
    }
    if let Some(p) = prefix {
        let mut pc = Vec::new();
        crate::apiserver::validation::dns_subdomain(field, p, &mut pc);
        if !pc.is_empty() {
            c.push(Cause::invalid(field, v, "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class() -> Value {
        json!({"metadata": {"name": "fast"}, "provisioner": "skiff.io/local-path"})
    }

    #[test]
    fn defaults_and_validation() {
        let mut sc = class();
        StorageClass.default(&mut sc);
        assert_eq!(sc["reclaimPolicy"], "Delete");
        assert_eq!(sc["volumeBindingMode"], "Immediate");
        assert!(StorageClass.validate(&sc).is_empty());
        sc["provisioner"] = json!("a b/c");
        sc["reclaimPolicy"] = json!("Recycle");
        let c = StorageClass.validate(&sc);
        let fields: Vec<&str> = c.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(fields, ["provisioner", "reclaimPolicy"]);
        sc["provisioner"] = json!("");
        assert_eq!(StorageClass.validate(&sc)[0].message, "Required value");
    }

    #[test]
    fn what_made_volumes_cannot_change() {
        let mut old = class();
        StorageClass.default(&mut old);
        let mut new = old.clone();
        new["allowVolumeExpansion"] = json!(true);
        assert!(StorageClass.validate_update(&old, &new).is_empty());
        new["parameters"] = json!({"root": "/x"});
        new["provisioner"] = json!("other.io/p");
        new["reclaimPolicy"] = json!("Retain");
        new["volumeBindingMode"] = json!("WaitForFirstConsumer");
        let msgs: Vec<String> = StorageClass
            .validate_update(&old, &new)
            .iter()
            .map(|c| c.line())
            .collect();
        assert_eq!(
            msgs,
            [
                "parameters: Forbidden: updates to parameters are forbidden.",
                "provisioner: Forbidden: updates to provisioner are forbidden.",
                "reclaimPolicy: Forbidden: updates to reclaimPolicy are forbidden.",
                "volumeBindingMode: Invalid value: \"WaitForFirstConsumer\": field is immutable",
            ]
        );
    }

    #[test]
    fn the_default_class_is_marked_in_rows() {
        let mut sc = class();
        sc["metadata"]["annotations"] = json!({BETA_DEFAULT_CLASS_ANNOTATION: "true"});
        let cells = StorageClass.cells(&sc);
        assert_eq!(cells.len(), StorageClass.columns().len());
        assert_eq!(
            &cells[..5],
            &[
                json!("fast (default)"),
                json!("skiff.io/local-path"),
                json!("Delete"),
                json!("Immediate"),
                json!(false)
            ]
        );
    }
}
