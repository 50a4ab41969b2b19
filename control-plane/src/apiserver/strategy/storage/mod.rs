//! Storage kinds: PersistentVolumes and PersistentVolumeClaims (`core/v1`),
//! StorageClasses and the CSI kinds (`storage.k8s.io/v1`); upstream's
//! `pkg/registry/core/persistentvolume(claim)`, `pkg/registry/storage/*`
//! and the rules of `pkg/apis/core/validation` and
//! `pkg/apis/storage/validation` they call.
//!
//! # Layout
//! - [`volume`]: PersistentVolume (sources skiff can mount, immutability).
//! - [`claim`]: PersistentVolumeClaim (requests, what an update may change).
//! - [`class`]: StorageClass (defaults, fields no update may change).
//! - [`csi`]: CSIDriver, CSINode, VolumeAttachment: stored as sent, printed
//!   as upstream.
//!
//! The admission plugins that read other objects (DefaultStorageClass,
//! StorageObjectInUseProtection, PersistentVolumeClaimResize) are in
//! [`crate::apiserver::storageadmission`].

pub mod claim;
pub mod class;
pub mod csi;
pub mod volume;

use serde_json::Value;

use crate::apiserver::status::Cause;
use crate::apiserver::table::s;
use crate::apiserver::validation;

/// The class annotation older manifests use instead of
/// `storageClassName` (still honoured upstream on claims and volumes).
pub const BETA_CLASS_ANNOTATION: &str = "volume.beta.kubernetes.io/storage-class";

/// Access modes in upstream's order (`GetAccessModesAsString`), with the
/// short form `kubectl get` prints.
const ACCESS_MODES: [(&str, &str); 4] = [
    ("ReadWriteOnce", "RWO"),
    ("ReadOnlyMany", "ROX"),
    ("ReadWriteMany", "RWX"),
    ("ReadWriteOncePod", "RWOP"),
];

/// Values of `spec.volumeMode`.
const VOLUME_MODES: [&str; 2] = ["Block", "Filesystem"];

/// `accessModes` of a PV or PVC spec (upstream's
/// `ValidatePersistentVolume(Claim)Spec` part). `required_detail` is the
/// detail upstream gives when the list is empty (PVs give none).
fn access_modes(spec: &Value, path: &str, required_detail: &str, c: &mut Vec<Cause>) {
    let field = format!("{path}.accessModes");
    let modes: Vec<&str> = spec["accessModes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| m.as_str().unwrap_or_default())
        .collect();
    if modes.is_empty() {
        c.push(if required_detail.is_empty() {
            Cause::required(field)
        } else {
            Cause::required_because(field, required_detail)
        });
        return;
    }
    let allowed: Vec<&str> = ACCESS_MODES.iter().map(|(m, _)| *m).collect();
    let (mut rwop, mut other) = (false, false);
    for m in &modes {
        if !allowed.contains(m) {
            c.push(Cause::not_supported(&field, m, &allowed));
        } else if *m == "ReadWriteOncePod" {
            rwop = true;
        } else {
            other = true;
        }
    }
    // ReadWriteOncePod promises a single pod: any other mode would loosen it.
    if rwop && other {
        c.push(Cause::forbidden(
            field,
            "may not use ReadWriteOncePod with other access modes",
        ));
    }
}

/// `volumeMode`, when set.
fn volume_mode(spec: &Value, path: &str, c: &mut Vec<Cause>) {
    if let Some(m) = spec["volumeMode"].as_str() {
        if !VOLUME_MODES.contains(&m) {
            c.push(Cause::not_supported(
                format!("{path}.volumeMode"),
                m,
                &VOLUME_MODES,
            ));
        }
    }
}

/// `storageClassName`, when set and not empty: a class's name (upstream's
/// `ValidateClassName`, a DNS subdomain).
fn class_name(spec: &Value, path: &str, c: &mut Vec<Cause>) {
    if let Some(n) = spec["storageClassName"].as_str().filter(|n| !n.is_empty()) {
        validation::dns_subdomain(&format!("{path}.storageClassName"), n, c);
    }
}

/// A quantity in thousandths, for comparisons (None: absent or not a
/// quantity).
fn milli(q: &Value) -> Option<i128> {
    kube_util::quantity::scaled(q.as_str()?, -3).ok()
}

/// A quantity that must be there and greater than zero (upstream's
/// `ValidatePositiveQuantityValue`); `field` is `spec.resources[storage]`
/// or `spec.capacity[storage]`.
fn positive_quantity(q: &Value, field: &str, c: &mut Vec<Cause>) {
    match milli(q) {
        None if q.is_null() => c.push(Cause::required(field)),
        None => c.push(Cause::invalid(
            field,
            &s(q),
            "must be a valid quantity such as 128Mi or 1Gi",
        )),
        Some(v) if v <= 0 => c.push(Cause::invalid(field, &s(q), "must be greater than zero")),
        Some(_) => {}
    }
}

/// Access modes as `kubectl get` prints them: `RWO,RWX`, in upstream's
/// order, each once.
fn access_modes_string(modes: &Value) -> String {
    let given: Vec<&str> = modes
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    ACCESS_MODES
        .iter()
        .filter(|(m, _)| given.contains(m))
        .map(|(_, short)| *short)
        .collect::<Vec<_>>()
        .join(",")
}

/// The class of a PV or PVC as upstream's helpers read it: the beta
/// annotation first, then `spec.storageClassName`.
fn class_of(obj: &Value) -> String {
    match obj["metadata"]["annotations"][BETA_CLASS_ANNOTATION].as_str() {
        Some(a) => a.to_string(),
        None => s(&obj["spec"]["storageClassName"]),
    }
}

/// The phase `kubectl get` prints: `Terminating` once deletion started.
fn phase_cell(obj: &Value) -> String {
    if obj["metadata"]["deletionTimestamp"].is_string() {
        "Terminating".into()
    } else {
        s(&obj["status"]["phase"])
    }
}

/// A string field or `<unset>`, as the printers show optional names.
fn or_unset_field(v: &Value) -> String {
    v.as_str().map_or_else(|| "<unset>".into(), str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn access_modes_print_short_in_upstream_order() {
        let modes = json!(["ReadWriteMany", "ReadWriteOnce", "ReadWriteOnce"]);
        assert_eq!(access_modes_string(&modes), "RWO,RWX");
        assert_eq!(access_modes_string(&json!(["ReadWriteOncePod"])), "RWOP");
        assert_eq!(access_modes_string(&Value::Null), "");
    }

    #[test]
    fn access_modes_are_checked() {
        let mut c = Vec::new();
        access_modes(&json!({}), "spec", "", &mut c);
        assert_eq!(c[0].message, "Required value");
        c.clear();
        access_modes(
            &json!({"accessModes": ["ReadWriteOncePod", "ReadWriteOnce", "Sometimes"]}),
            "spec",
            "",
            &mut c,
        );
        assert_eq!(c.len(), 2, "{c:?}");
        assert_eq!(c[0].reason, "FieldValueNotSupported");
        assert_eq!(
            c[1].message,
            "Forbidden: may not use ReadWriteOncePod with other access modes"
        );
    }

    #[test]
    fn selector_operators_are_checked() {
        let mut c = Vec::new();
        let sel = json!({"matchExpressions": [
            {"key": "a", "operator": "In", "values": ["x"]},
            {"key": "b", "operator": "In"},
            {"key": "c", "operator": "Exists", "values": ["x"]},
            {"key": "d", "operator": "Near"},
        ]});
        validation::label_selector(&sel, "spec.selector", &mut c);
        let fields: Vec<&str> = c.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.selector.matchExpressions[1].values",
                "spec.selector.matchExpressions[2].values",
                "spec.selector.matchExpressions[3].operator",
            ]
        );
    }

    #[test]
    fn quantities_must_be_positive() {
        let mut c = Vec::new();
        positive_quantity(&json!("1Gi"), "f", &mut c);
        assert!(c.is_empty());
        positive_quantity(&json!("0"), "f", &mut c);
        positive_quantity(&Value::Null, "f", &mut c);
        positive_quantity(&json!("lots"), "f", &mut c);
        let msgs: Vec<&str> = c.iter().map(|c| c.message.as_str()).collect();
        assert_eq!(msgs[0], "Invalid value: \"0\": must be greater than zero");
        assert_eq!(msgs[1], "Required value");
        assert!(msgs[2].starts_with("Invalid value: \"lots\""));
    }
}
