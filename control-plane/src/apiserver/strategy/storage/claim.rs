//! PersistentVolumeClaims (`core/v1`): upstream's defaults, validation,
//! what an update may change (`ValidatePersistentVolumeClaim(Update)`),
//! and the `kubectl get pvc` columns.

use serde_json::{json, Value};

use super::super::Strategy;
use super::BETA_CLASS_ANNOTATION;
use super::{access_modes_string, class_of, milli, or_unset_field, phase_cell, s};
use crate::apiserver::defaults::{obj_field, set};
use crate::apiserver::status::Cause;
use crate::apiserver::table::{age_cell, name_cell, Col, AGE, NAME};
use crate::apiserver::{validation, Req};

pub struct PersistentVolumeClaim;

/// Why a claim may not name a data source: nothing here populates or
/// clones volumes, and a claim bound to an empty volume would look as if
/// it had been.
const NO_POPULATORS: &str = "volume populators and cloning are not supported by skiff yet";

impl Strategy for PersistentVolumeClaim {
    /// Upstream's PrepareForCreate clears the status; defaulting then
    /// makes it Pending.
    fn prepare_for_create(&self, _r: &Req, obj: &mut Value) {
        obj["status"] = json!({"phase": "Pending"});
    }

    fn default(&self, obj: &mut Value) {
        set(obj_field(obj, "spec"), "volumeMode", json!("Filesystem"));
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        validate_spec(&obj["spec"], &mut c);
        c
    }

    fn validate_update(&self, old: &Value, new: &Value) -> Vec<Cause> {
        let mut c = self.validate(new);
        c.extend(immutable(old, new));
        c
    }

    fn columns(&self) -> Vec<Col> {
        vec![
            NAME,
            ("Status", "string", 0, "phase represents the current phase of PersistentVolumeClaim."),
            ("Volume", "string", 0, "volumeName is the binding reference to the PersistentVolume backing this claim."),
            ("Capacity", "string", 0, "capacity represents the actual resources of the underlying volume."),
            ("Access Modes", "string", 0, "accessModes contains the actual access modes the volume backing the PVC has. More info: https://kubernetes.io/docs/concepts/storage/persistent-volumes#access-modes-1"),
            ("StorageClass", "string", 0, "StorageClass of the pvc"),
            ("VolumeAttributesClass", "string", 0, "VolumeAttributesClass of the pvc"),
            AGE,
            ("VolumeMode", "string", 1, "volumeMode defines what type of volume is required by the claim. Value of Filesystem is implied when not included in claim spec."),
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let spec = &obj["spec"];
        let volume = s(&spec["volumeName"]);
        // Capacity and modes are the bound volume's, shown once bound.
        let (capacity, modes) = if volume.is_empty() {
            (String::new(), String::new())
        } else {
            let st = &obj["status"];
            (
                s(&st["capacity"]["storage"]),
                access_modes_string(&st["accessModes"]),
            )
        };
        vec![
            name_cell(obj),
            json!(phase_cell(obj)),
            json!(volume),
            json!(capacity),
            json!(modes),
            json!(class_of(obj)),
            json!(or_unset_field(&spec["volumeAttributesClassName"])),
            age_cell(obj),
            json!(or_unset_field(&spec["volumeMode"])),
        ]
    }
}

/// Upstream's `ValidatePersistentVolumeClaimSpec`, with data sources
/// refused.
fn validate_spec(spec: &Value, c: &mut Vec<Cause>) {
    super::access_modes(spec, "spec", "at least 1 access mode is required", c);
    if !spec["selector"].is_null() {
        validation::label_selector(&spec["selector"], "spec.selector", c);
    }
    let storage = &spec["resources"]["requests"]["storage"];
    if storage.is_null() {
        c.push(Cause::required("spec.resources[storage]"));
    } else {
        super::positive_quantity(storage, "spec.resources[storage]", c);
    }
    super::class_name(spec, "spec", c);
    super::volume_mode(spec, "spec", c);
    if let Some(n) = spec["volumeName"].as_str().filter(|n| !n.is_empty()) {
        validation::dns_subdomain("spec.volumeName", n, c);
    }
    for field in ["dataSource", "dataSourceRef"] {
        if !spec[field].is_null() {
            c.push(Cause::forbidden(format!("spec.{field}"), NO_POPULATORS));
        }
    }
}

/// What an update of a claim may change (upstream's
/// `ValidatePersistentVolumeClaimUpdate`): claims are immutable so that
/// quota and limits cannot be gamed, except the binding (volumeName, once),
/// a class given to a claim that had none (by field or annotation), and,
/// for bound claims, requests (expansion) and the attributes class.
fn immutable(old: &Value, new: &Value) -> Vec<Cause> {
    let mut c = Vec::new();
    let mut was = old["spec"].clone();
    let mut now = new["spec"].clone();
    if s(&was["volumeName"]).is_empty() {
        was["volumeName"] = now["volumeName"].clone();
    }
    let beta = |v: &Value| v["metadata"]["annotations"][BETA_CLASS_ANNOTATION].clone();
    let (old_beta, new_beta) = (beta(old), beta(new));
    // Setting the field to the class the annotation already named is the
    // same claim.
    if !old_beta.is_null()
        && old_beta == new_beta
        && was["storageClassName"].is_null()
        && now["storageClassName"] == new_beta
    {
        now["storageClassName"] = Value::Null;
    } else if old_beta != new_beta {
        c.push(Cause::invalid(
            format!("metadata.annotations.{BETA_CLASS_ANNOTATION}"),
            &s(&new_beta),
            "field is immutable",
        ));
    }
    // RetroactiveDefaultStorageClass (upstream since 1.28): a claim made
    // with no class at all may get one later, the default class the PV
    // controller assigns once there is one.
    if old_beta.is_null() && was["storageClassName"].is_null() {
        now["storageClassName"] = Value::Null;
    }
    if new["status"]["phase"] == "Bound" {
        now["resources"]["requests"]["storage"] = was["resources"]["requests"]["storage"].clone();
    }
    // Upstream leaves the attributes class to its own rules (feature
    // VolumeAttributesClass), which nothing here acts on.
    now["volumeAttributesClassName"] = was["volumeAttributesClassName"].clone();
    if strip_nulls(&was) != strip_nulls(&now) {
        c.push(Cause::forbidden(
            "spec",
            "spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims",
        ));
    }
    let size = |v: &Value| milli(&v["spec"]["resources"]["requests"]["storage"]).unwrap_or(0);
    let status_size = milli(&old["status"]["capacity"]["storage"]).unwrap_or(0);
    // Upstream (RecoverVolumeExpansionFailure) lets a claim shrink back
    // down after a failed expansion, never to or below what the volume has.
    if size(new) < size(old) && size(new) <= status_size {
        c.push(Cause::forbidden(
            "spec.resources.requests.storage",
            "field can not be less than status.capacity",
        ));
    }
    let (om, nm) = (&old["spec"]["volumeMode"], &new["spec"]["volumeMode"]);
    if om != nm {
        // Upstream's path, without `spec.`.
        c.push(Cause::invalid("volumeMode", &s(nm), "field is immutable"));
    }
    c
}

/// A copy without null members, so that `"x": null` and a missing `x`
/// compare equal as they do in Go's typed structs.
fn strip_nulls(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), strip_nulls(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(spec: Value) -> Value {
        json!({"metadata": {"name": "c", "namespace": "ns"}, "spec": spec})
    }

    fn messages(c: &[Cause]) -> Vec<String> {
        c.iter().map(|c| c.line()).collect()
    }

    fn good() -> Value {
        claim(
            json!({"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}),
        )
    }

    #[test]
    fn requests_modes_and_sources_are_checked() {
        let mut v = good();
        PersistentVolumeClaim.default(&mut v);
        assert_eq!(v["spec"]["volumeMode"], "Filesystem");
        assert!(PersistentVolumeClaim.validate(&v).is_empty());
        let bad = claim(json!({"dataSource": {"kind": "PersistentVolumeClaim", "name": "x"}}));
        assert_eq!(
            messages(&PersistentVolumeClaim.validate(&bad)),
            [
                "spec.accessModes: Required value: at least 1 access mode is required",
                "spec.resources[storage]: Required value",
                "spec.dataSource: Forbidden: volume populators and cloning are not supported by skiff yet",
            ]
        );
    }

    #[test]
    fn only_binding_may_change_an_unbound_claim() {
        let old = good();
        let mut new = old.clone();
        new["spec"]["volumeName"] = json!("pv1");
        assert!(PersistentVolumeClaim.validate_update(&old, &new).is_empty());
        // Once set, the volume stays.
        let mut again = new.clone();
        again["spec"]["volumeName"] = json!("pv2");
        let m = messages(&PersistentVolumeClaim.validate_update(&new, &again));
        assert!(
            m[0].starts_with(
                "spec: Forbidden: spec is immutable after creation except resources.requests"
            ),
            "{m:?}"
        );
        // Requests change only on bound claims.
        let mut grow = old.clone();
        grow["spec"]["resources"]["requests"]["storage"] = json!("2Gi");
        assert_eq!(PersistentVolumeClaim.validate_update(&old, &grow).len(), 1);
    }

    #[test]
    fn bound_claims_grow_but_never_below_their_capacity() {
        let mut old = good();
        old["spec"]["volumeName"] = json!("pv1");
        old["status"] = json!({"phase": "Bound", "capacity": {"storage": "1Gi"}});
        let mut new = old.clone();
        new["spec"]["resources"]["requests"]["storage"] = json!("2Gi");
        assert!(PersistentVolumeClaim.validate_update(&old, &new).is_empty());
        let mut shrink = old.clone();
        shrink["spec"]["resources"]["requests"]["storage"] = json!("512Mi");
        assert_eq!(
            messages(&PersistentVolumeClaim.validate_update(&old, &shrink)),
            ["spec.resources.requests.storage: Forbidden: field can not be less than status.capacity"]
        );
    }

    #[test]
    fn the_beta_class_may_move_to_the_field() {
        let mut old = good();
        old["metadata"]["annotations"] = json!({BETA_CLASS_ANNOTATION: "fast"});
        let mut new = old.clone();
        new["spec"]["storageClassName"] = json!("fast");
        assert!(PersistentVolumeClaim.validate_update(&old, &new).is_empty());
        new["spec"]["storageClassName"] = json!("slow");
        assert_eq!(PersistentVolumeClaim.validate_update(&old, &new).len(), 1);
        // A claim with no class at all may get one; one with a class
        // keeps it.
        let mut none = good();
        let mut given = none.clone();
        given["spec"]["storageClassName"] = json!("local-path");
        assert!(PersistentVolumeClaim
            .validate_update(&none, &given)
            .is_empty());
        none["spec"]["storageClassName"] = json!("other");
        assert_eq!(
            PersistentVolumeClaim.validate_update(&none, &given).len(),
            1
        );
    }

    #[test]
    fn rows_show_the_volume_once_bound() {
        let mut v = good();
        PersistentVolumeClaim.default(&mut v);
        v["status"] = json!({"phase": "Pending"});
        let cells = PersistentVolumeClaim.cells(&v);
        assert_eq!(cells.len(), PersistentVolumeClaim.columns().len());
        assert_eq!(
            &cells[1..7],
            &[
                json!("Pending"),
                json!(""),
                json!(""),
                json!(""),
                json!(""),
                json!("<unset>")
            ]
        );
        v["spec"]["volumeName"] = json!("pv1");
        v["spec"]["storageClassName"] = json!("local-path");
        v["status"] = json!({"phase": "Bound", "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"]});
        v["metadata"]["deletionTimestamp"] = json!("2024-01-01T00:00:00Z");
        let cells = PersistentVolumeClaim.cells(&v);
        assert_eq!(
            &cells[1..6],
            &[
                json!("Terminating"),
                json!("pv1"),
                json!("1Gi"),
                json!("RWO"),
                json!("local-path")
            ]
        );
        assert_eq!(cells[8], "Filesystem");
    }
}
