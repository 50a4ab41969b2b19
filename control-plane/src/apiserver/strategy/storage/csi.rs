//! CSIDriver, CSINode and VolumeAttachment (`storage.k8s.io/v1`): stored
//! for the CSI node plugins and attachers that read them, with upstream's
//! defaults, the few rules that keep them readable, and upstream's
//! `kubectl get` columns.

use serde_json::{json, Value};

use super::super::Strategy;
use super::s;
use crate::apiserver::defaults::{obj_field, set};
use crate::apiserver::status::Cause;
use crate::apiserver::table::{age_cell, name_cell, Col, AGE, NAME};

pub struct CsiDriver;
pub struct CsiNode;
pub struct VolumeAttachment;

/// A CSI driver's name (upstream's `ValidateCSIDriverName`): it is the
/// name of the plugin's socket directory and of the driver in CSI calls.
pub fn driver_name(name: &str, field: &str, c: &mut Vec<Cause>) {
    if name.is_empty() {
        c.push(Cause::required(field));
        return;
    }
    if name.len() > 63 {
        c.push(Cause::too_long(field, 63));
    }
    let ok = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && name.starts_with(|ch: char| ch.is_ascii_alphanumeric())
        && name.ends_with(|ch: char| ch.is_ascii_alphanumeric());
    if !ok {
        c.push(Cause::invalid(field, name, "a CSI driver name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"));
    }
}

fn bool_or(v: &Value, d: bool) -> Value {
    json!(v.as_bool().unwrap_or(d))
}

impl Strategy for CsiDriver {
    /// Upstream's `SetDefaults_CSIDriver`.
    fn default(&self, obj: &mut Value) {
        let spec = obj_field(obj, "spec");
        set(spec, "attachRequired", json!(true));
        set(spec, "podInfoOnMount", json!(false));
        set(spec, "storageCapacity", json!(false));
        set(spec, "fsGroupPolicy", json!("ReadWriteOnceWithFSType"));
        set(spec, "requiresRepublish", json!(false));
        set(spec, "seLinuxMount", json!(false));
        set(spec, "volumeLifecycleModes", json!(["Persistent"]));
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        driver_name(&s(&obj["metadata"]["name"]), "metadata.name", &mut c);
        c
    }

    fn columns(&self) -> Vec<Col> {
        vec![
            NAME,
            ("AttachRequired", "boolean", 0, "attachRequired indicates this CSI volume driver requires an attach operation."),
            ("PodInfoOnMount", "boolean", 0, "podInfoOnMount indicates this CSI volume driver requires additional pod information (like podName, podUID, etc.) during mount operations."),
            ("StorageCapacity", "boolean", 0, "storageCapacity indicates that the CSI volume driver wants pod scheduling to consider the storage capacity that the driver deployment will report."),
            ("TokenRequests", "string", 0, "tokenRequests indicates the CSI driver needs pods' service account tokens it is mounting volume for to do necessary authentication."),
            ("RequiresRepublish", "boolean", 0, "requiresRepublish indicates the CSI driver wants `NodePublishVolume` being periodically called to reflect any possible change in the mounted volume."),
            ("Modes", "string", 0, "volumeLifecycleModes defines what kind of volumes this CSI volume driver supports."),
            AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let spec = &obj["spec"];
        let audiences: Vec<String> = spec["tokenRequests"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| s(&t["audience"]))
            .collect();
        let modes: Vec<String> = spec["volumeLifecycleModes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(s)
            .collect();
        vec![
            name_cell(obj),
            bool_or(&spec["attachRequired"], true),
            bool_or(&spec["podInfoOnMount"], false),
            bool_or(&spec["storageCapacity"], false),
            json!(if audiences.is_empty() {
                "<unset>".to_string()
            } else {
                audiences.join(",")
            }),
            bool_or(&spec["requiresRepublish"], false),
            json!(modes.join(",")),
            age_cell(obj),
        ]
    }
}

impl Strategy for CsiNode {
    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        let drivers = obj["spec"]["drivers"].as_array().into_iter().flatten();
        for (i, d) in drivers.enumerate() {
            driver_name(&s(&d["name"]), &format!("spec.drivers[{i}].name"), &mut c);
            if s(&d["nodeID"]).is_empty() {
                c.push(Cause::required(format!("spec.drivers[{i}].nodeID")));
            }
        }
        c
    }

    fn columns(&self) -> Vec<Col> {
        vec![
            NAME,
            (
                "Drivers",
                "integer",
                0,
                "Drivers indicates the number of CSI drivers registered on the node",
            ),
            AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let n = obj["spec"]["drivers"].as_array().map_or(0, Vec::len);
        vec![name_cell(obj), json!(n), age_cell(obj)]
    }
}

impl Strategy for VolumeAttachment {
    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        let spec = &obj["spec"];
        driver_name(&s(&spec["attacher"]), "spec.attacher", &mut c);
        let pv = spec["source"]["persistentVolumeName"].is_string();
        let inline = !spec["source"]["inlineVolumeSpec"].is_null();
        if pv == inline {
            c.push(Cause::invalid(
                "spec.source",
                "",
                "must specify exactly one of inlineVolumeSpec and persistentVolumeName",
            ));
        }
        if s(&spec["nodeName"]).is_empty() {
            c.push(Cause::required("spec.nodeName"));
        }
        c
    }

    /// An attachment is to one volume on one node: a different one is a
    /// new object.
    fn validate_update(&self, old: &Value, new: &Value) -> Vec<Cause> {
        let mut c = self.validate(new);
        if old["spec"] != new["spec"] {
            c.push(Cause::invalid("spec", "", "field is immutable"));
        }
        c
    }

    fn columns(&self) -> Vec<Col> {
        vec![
            NAME,
            (
                "Attacher",
                "string",
                0,
                "attacher indicates the name of the volume driver that MUST handle this request.",
            ),
            (
                "PV",
                "string",
                0,
                "persistentVolumeName represents the name of the persistent volume to attach.",
            ),
            (
                "Node",
                "string",
                0,
                "nodeName represents the node that the volume should be attached to.",
            ),
            (
                "Attached",
                "boolean",
                0,
                "attached indicates the volume is successfully attached.",
            ),
            AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let spec = &obj["spec"];
        vec![
            name_cell(obj),
            json!(s(&spec["attacher"])),
            json!(s(&spec["source"]["persistentVolumeName"])),
            json!(s(&spec["nodeName"])),
            bool_or(&obj["status"]["attached"], false),
            age_cell(obj),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_names_are_checked() {
        let mut c = Vec::new();
        driver_name("hostpath.csi.k8s.io", "f", &mut c);
        assert!(c.is_empty());
        driver_name("-bad/", "f", &mut c);
        driver_name(&"a".repeat(64), "f", &mut c);
        assert_eq!(c.len(), 2, "{c:?}");
        assert_eq!(c[1].reason, "FieldValueTooLong");
    }

    #[test]
    fn drivers_get_upstream_defaults_and_rows() {
        let mut d = json!({"metadata": {"name": "d.example.com"}, "spec": {"tokenRequests": [{"audience": "a"}]}});
        CsiDriver.default(&mut d);
        assert!(CsiDriver.validate(&d).is_empty());
        let cells = CsiDriver.cells(&d);
        assert_eq!(cells.len(), CsiDriver.columns().len());
        assert_eq!(
            &cells[1..7],
            &[
                json!(true),
                json!(false),
                json!(false),
                json!("a"),
                json!(false),
                json!("Persistent")
            ]
        );
    }

    #[test]
    fn attachments_name_one_source_and_never_change() {
        let va = json!({"spec": {"attacher": "d.example.com", "nodeName": "n1",
            "source": {"persistentVolumeName": "pv1"}}});
        assert!(VolumeAttachment.validate(&va).is_empty());
        let mut other = va.clone();
        other["spec"]["nodeName"] = json!("n2");
        assert_eq!(VolumeAttachment.validate_update(&va, &other).len(), 1);
        let none = json!({"spec": {"attacher": "d.example.com", "nodeName": "n1", "source": {}}});
        assert_eq!(VolumeAttachment.validate(&none)[0].field, "spec.source");
        let cells = VolumeAttachment.cells(&va);
        assert_eq!(
            &cells[1..5],
            &[
                json!("d.example.com"),
                json!("pv1"),
                json!("n1"),
                json!(false)
            ]
        );
    }
}
