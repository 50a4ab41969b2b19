//! PersistentVolumes (`core/v1`): upstream's defaults, validation and
//! immutability (`ValidatePersistentVolume(Update)`), and the
//! `kubectl get pv` columns.

use serde_json::{json, Value};

use super::super::{NameRule, Strategy};
use super::{access_modes_string, class_of, or_unset_field, phase_cell, positive_quantity};
use crate::apiserver::defaults::{obj_field, set};
use crate::apiserver::objects;
use crate::apiserver::status::Cause;
use crate::apiserver::table::{age_cell, name_cell, s, Col, AGE, NAME};
use crate::apiserver::Req;

pub struct PersistentVolume;

/// The volume sources a PV spec may hold (upstream's
/// `PersistentVolumeSource`), in upstream's validation order.
const SOURCES: &[&str] = &[
    "gcePersistentDisk",
    "awsElasticBlockStore",
    "hostPath",
    "glusterfs",
    "flocker",
    "nfs",
    "rbd",
    "quobyte",
    "cinder",
    "cephfs",
    "iscsi",
    "fc",
    "flexVolume",
    "azureFile",
    "vsphereVolume",
    "photonPersistentDisk",
    "portworxVolume",
    "azureDisk",
    "scaleIO",
    "local",
    "storageos",
    "csi",
];

/// The sources skiff serves. The agent mounts host directories only
/// (hostPath, local, and the local-path provisioner's volumes) and CSI
/// through a node plugin; a PV of any other type could be bound but never
/// mounted, so it is refused when created rather than failing every pod
/// that uses it later.
const SERVED: &[&str] = &["hostPath", "local", "csi"];

const RECLAIM_POLICIES: [&str; 3] = ["Delete", "Recycle", "Retain"];
const HOST_PATH_TYPES: [&str; 8] = [
    "",
    "BlockDevice",
    "CharDevice",
    "Directory",
    "DirectoryOrCreate",
    "File",
    "FileOrCreate",
    "Socket",
];

impl Strategy for PersistentVolume {
    /// Upstream's PrepareForCreate starts a volume Pending, from now.
    fn prepare_for_create(&self, _r: &Req, obj: &mut Value) {
        obj["status"] =
            json!({"phase": "Pending", "lastPhaseTransitionTime": objects::now_rfc3339()});
    }

    fn default(&self, obj: &mut Value) {
        let spec = obj_field(obj, "spec");
        set(spec, "persistentVolumeReclaimPolicy", json!("Retain"));
        set(spec, "volumeMode", json!("Filesystem"));
    }

    fn name_rule(&self) -> NameRule {
        NameRule::Subdomain
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        validate_spec(&obj["spec"], &mut c);
        c
    }

    fn validate_update(&self, old: &Value, new: &Value) -> Vec<Cause> {
        let mut c = self.validate(new);
        let source = |v: &Value| -> Vec<(String, Value)> {
            SOURCES
                .iter()
                .filter_map(|k| v["spec"].get(*k).map(|x| (k.to_string(), x.clone())))
                .filter(|(_, x)| !x.is_null())
                .collect()
        };
        let mut now = source(new);
        // Upstream lets a CSI volume get the expansion secret it lacked.
        let secret = "controllerExpandSecretRef";
        if old["spec"]["csi"].is_object() && old["spec"]["csi"][secret].is_null() {
            let csi = now.iter_mut().find(|(k, _)| k == "csi");
            if let Some(m) = csi.and_then(|(_, v)| v.as_object_mut()) {
                m.remove(secret);
            }
        }
        // Pods on nodes may have the old source mounted: what a PV points
        // at never changes.
        if source(old) != now {
            c.push(Cause::forbidden(
                "spec.persistentvolumesource",
                "spec.persistentvolumesource is immutable after creation",
            ));
        }
        let (om, nm) = (&old["spec"]["volumeMode"], &new["spec"]["volumeMode"]);
        if om != nm {
            // Upstream's path, without `spec.`.
            c.push(Cause::invalid("volumeMode", &s(nm), "field is immutable"));
        }
        // Affinity may be added to a PV that had none, never changed: the
        // scheduler placed pods by it.
        let (oa, na) = (&old["spec"]["nodeAffinity"], &new["spec"]["nodeAffinity"]);
        if !oa.is_null() && oa != na {
            c.push(Cause::forbidden("nodeAffinity", "field is immutable"));
        }
        c
    }

    fn columns(&self) -> Vec<Col> {
        vec![
            NAME,
            ("Capacity", "string", 0, "capacity is the description of the persistent volume's resources and capacity. More info: https://kubernetes.io/docs/concepts/storage/persistent-volumes#capacity"),
            ("Access Modes", "string", 0, "accessModes contains all ways the volume can be mounted. More info: https://kubernetes.io/docs/concepts/storage/persistent-volumes#access-modes"),
            ("Reclaim Policy", "string", 0, "persistentVolumeReclaimPolicy defines what happens to a persistent volume when released from its claim. Valid options are Retain (default for manually created PersistentVolumes), Delete (default for dynamically provisioned PersistentVolumes), and Recycle (deprecated). Recycle must be supported by the volume plugin underlying this PersistentVolume. More info: https://kubernetes.io/docs/concepts/storage/persistent-volumes#reclaiming"),
            ("Status", "string", 0, "phase indicates if a volume is available, bound to a claim, or released by a claim. More info: https://kubernetes.io/docs/concepts/storage/persistent-volumes#phase"),
            ("Claim", "string", 0, "claimRef is part of a bi-directional binding between PersistentVolume and PersistentVolumeClaim. Expected to be non-nil when bound. claim.VolumeName is the authoritative bind between PV and PVC. More info: https://kubernetes.io/docs/concepts/storage/persistent-volumes#binding"),
            ("StorageClass", "string", 0, "StorageClass of the pv"),
            ("VolumeAttributesClass", "string", 0, "VolumeAttributesClass of the pv"),
            ("Reason", "string", 0, "reason is a brief CamelCase string that describes any failure and is meant for machine parsing and tidy display in the CLI."),
            AGE,
            ("VolumeMode", "string", 1, "volumeMode defines if a volume is intended to be used with a formatted filesystem or to remain in raw block state. Value of Filesystem is implied when not included in spec."),
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let spec = &obj["spec"];
        let claim = match spec["claimRef"].as_object() {
            Some(r) => format!(
                "{}/{}",
                r.get("namespace").map(s).unwrap_or_default(),
                r.get("name").map(s).unwrap_or_default()
            ),
            None => String::new(),
        };
        let capacity = match &spec["capacity"]["storage"] {
            Value::Null => "0".to_string(),
            q => s(q),
        };
        vec![
            name_cell(obj),
            json!(capacity),
            json!(access_modes_string(&spec["accessModes"])),
            json!(s(&spec["persistentVolumeReclaimPolicy"])),
            json!(phase_cell(obj)),
            json!(claim),
            json!(class_of(obj)),
            json!(or_unset_field(&spec["volumeAttributesClassName"])),
            json!(s(&obj["status"]["reason"])),
            age_cell(obj),
            json!(or_unset_field(&spec["volumeMode"])),
        ]
    }
}

/// Upstream's `ValidatePersistentVolumeSpec`, with the sources skiff
/// cannot mount refused.
fn validate_spec(spec: &Value, c: &mut Vec<Cause>) {
    match spec["capacity"].as_object() {
        None => c.push(Cause::required("spec.capacity")),
        Some(cap) if cap.is_empty() => c.push(Cause::required("spec.capacity")),
        Some(cap) => {
            if !cap.contains_key("storage") || cap.len() > 1 {
                let keys: Vec<&str> = cap.keys().map(String::as_str).collect();
                c.push(Cause::not_supported(
                    "spec.capacity",
                    &keys.join(","),
                    &["storage"],
                ));
            }
            for (k, q) in cap {
                positive_quantity(q, &format!("spec.capacity[{k}]"), c);
            }
        }
    }
    super::access_modes(spec, "spec", "", c);
    super::class_name(spec, "spec", c);
    super::volume_mode(spec, "spec", c);
    if let Some(p) = spec["persistentVolumeReclaimPolicy"].as_str() {
        if !RECLAIM_POLICIES.contains(&p) {
            c.push(Cause::not_supported(
                "spec.persistentVolumeReclaimPolicy",
                p,
                &RECLAIM_POLICIES,
            ));
        }
    }
    let affinity = node_affinity(&spec["nodeAffinity"], c);
    let mut count = 0;
    for k in SOURCES {
        let Some(src) = spec.get(*k).filter(|v| !v.is_null()) else {
            continue;
        };
        let path = format!("spec.{k}");
        if count > 0 {
            c.push(Cause::forbidden(
                path,
                "may not specify more than 1 volume type",
            ));
            continue;
        }
        count += 1;
        if !SERVED.contains(k) {
            c.push(Cause::forbidden(
                path,
                &format!("{k} volumes are not supported by skiff: its nodes mount only hostPath, local and csi volumes"),
            ));
            continue;
        }
        match *k {
            "hostPath" => host_path(src, &path, c),
            "local" => local(src, &path, c),
            _ => csi(src, &path, c),
        }
    }
    if count == 0 {
        c.push(Cause::required_because(
            "spec",
            "must specify a volume type",
        ));
    }
    // A local volume is on one node's disk: without affinity the scheduler
    // would put its pods anywhere.
    if spec["local"].is_object() && !affinity {
        c.push(Cause::required_because(
            "spec.nodeAffinity",
            "Local volume requires node affinity",
        ));
    }
    // Recycling scrubs the volume's directory: never the host's root.
    let root = spec["hostPath"]["path"]
        .as_str()
        .is_some_and(|p| p.trim_end_matches('/').is_empty() && p.starts_with('/'));
    if root && spec["persistentVolumeReclaimPolicy"] == "Recycle" {
        c.push(Cause::forbidden(
            "spec.persistentVolumeReclaimPolicy",
            "may not be 'recycle' for a hostPath mount of '/'",
        ));
    }
}

/// A path with no `..` element (upstream's `validatePathNoBacksteps`).
fn no_backsteps(path: &str, field: &str, c: &mut Vec<Cause>) {
    if path.split('/').any(|p| p == "..") {
        c.push(Cause::invalid(field, path, "must not contain '..'"));
    }
}

fn host_path(src: &Value, path: &str, c: &mut Vec<Cause>) {
    let field = format!("{path}.path");
    match src["path"].as_str().filter(|p| !p.is_empty()) {
        None => c.push(Cause::required(field)),
        Some(p) => no_backsteps(p, &field, c),
    }
    if let Some(t) = src["type"].as_str() {
        if !HOST_PATH_TYPES.contains(&t) {
            c.push(Cause::not_supported(
                format!("{path}.type"),
                t,
                &HOST_PATH_TYPES,
            ));
        }
    }
}

fn local(src: &Value, path: &str, c: &mut Vec<Cause>) {
    let field = format!("{path}.path");
    match src["path"].as_str().filter(|p| !p.is_empty()) {
        None => c.push(Cause::required(field)),
        Some(p) => {
            // The agent joins nothing to it: a relative path would resolve
            // against whatever directory it runs in.
            if !p.starts_with('/') {
                c.push(Cause::invalid(&field, p, "must be an absolute path"));
            }
            no_backsteps(p, &field, c);
        }
    }
}

fn csi(src: &Value, path: &str, c: &mut Vec<Cause>) {
    match src["driver"].as_str().filter(|d| !d.is_empty()) {
        None => c.push(Cause::required(format!("{path}.driver"))),
        Some(d) => super::csi::driver_name(d, &format!("{path}.driver"), c),
    }
    if src["volumeHandle"].as_str().is_none_or(str::is_empty) {
        c.push(Cause::required(format!("{path}.volumeHandle")));
    }
}

/// `spec.nodeAffinity` (upstream's `validateVolumeNodeAffinity`); returns
/// whether one is given.
fn node_affinity(aff: &Value, c: &mut Vec<Cause>) -> bool {
    if aff.is_null() {
        return false;
    }
    let required = &aff["required"];
    if required.is_null() {
        c.push(Cause::required_because(
            "spec.nodeAffinity.required",
            "must specify required node constraints",
        ));
        return true;
    }
    if required["nodeSelectorTerms"]
        .as_array()
        .is_none_or(|t| t.is_empty())
    {
        c.push(Cause::required_because(
            "spec.nodeAffinity.required.nodeSelectorTerms",
            "must have at least one node selector term",
        ));
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pv(spec: Value) -> Value {
        json!({"metadata": {"name": "v"}, "spec": spec})
    }

    fn messages(c: &[Cause]) -> Vec<String> {
        c.iter().map(|c| c.line()).collect()
    }

    fn local_pv() -> Value {
        pv(json!({
            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "local": {"path": "/mnt/a"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}]}},
        }))
    }

    #[test]
    fn a_valid_volume_passes_and_gets_defaults() {
        let mut v = local_pv();
        PersistentVolume.default(&mut v);
        assert_eq!(v["spec"]["persistentVolumeReclaimPolicy"], "Retain");
        assert_eq!(v["spec"]["volumeMode"], "Filesystem");
        assert!(PersistentVolume.validate(&v).is_empty());
    }

    #[test]
    fn sources_are_counted_and_checked() {
        let none = pv(json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"]}));
        assert_eq!(
            messages(&PersistentVolume.validate(&none)),
            ["spec: Required value: must specify a volume type"]
        );
        let two = pv(
            json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "hostPath": {"path": "/a"}, "csi": {"driver": "d.example.com", "volumeHandle": "h"}}),
        );
        assert_eq!(
            messages(&PersistentVolume.validate(&two)),
            ["spec.csi: Forbidden: may not specify more than 1 volume type"]
        );
        let nfs = pv(
            json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "nfs": {"server": "s", "path": "/x"}}),
        );
        let m = messages(&PersistentVolume.validate(&nfs));
        assert!(
            m[0].starts_with("spec.nfs: Forbidden: nfs volumes are not supported"),
            "{m:?}"
        );
    }

    #[test]
    fn local_volumes_need_affinity_and_an_absolute_path() {
        let mut v = local_pv();
        v["spec"]["nodeAffinity"] = Value::Null;
        v["spec"]["local"]["path"] = json!("rel/../x");
        let m = messages(&PersistentVolume.validate(&v));
        assert_eq!(
            m,
            [
                "spec.local.path: Invalid value: \"rel/../x\": must be an absolute path",
                "spec.local.path: Invalid value: \"rel/../x\": must not contain '..'",
                "spec.nodeAffinity: Required value: Local volume requires node affinity",
            ]
        );
    }

    #[test]
    fn capacity_and_policy_are_checked() {
        let mut v = local_pv();
        v["spec"]["capacity"] = json!({"storage": "0", "cpu": "1"});
        v["spec"]["persistentVolumeReclaimPolicy"] = json!("Keep");
        let m = messages(&PersistentVolume.validate(&v));
        assert_eq!(m.len(), 3, "{m:?}");
        assert!(m[0].starts_with("spec.capacity: Unsupported value"));
        assert_eq!(
            m[1],
            "spec.capacity[storage]: Invalid value: \"0\": must be greater than zero"
        );
        assert!(m[2].starts_with("spec.persistentVolumeReclaimPolicy: Unsupported value: \"Keep\""));
    }

    #[test]
    fn the_source_mode_and_affinity_are_immutable() {
        let old = local_pv();
        let mut new = old.clone();
        new["spec"]["capacity"]["storage"] = json!("2Gi");
        assert!(PersistentVolume.validate_update(&old, &new).is_empty());
        new["spec"]["local"]["path"] = json!("/mnt/b");
        new["spec"]["volumeMode"] = json!("Block");
        new["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]
            ["values"] = json!(["n2"]);
        let m = messages(&PersistentVolume.validate_update(&old, &new));
        assert_eq!(
            m,
            [
                "spec.persistentvolumesource: Forbidden: spec.persistentvolumesource is immutable after creation",
                "volumeMode: Invalid value: \"Block\": field is immutable",
                "nodeAffinity: Forbidden: field is immutable",
            ]
        );
    }

    #[test]
    fn a_csi_volume_may_get_its_expansion_secret() {
        let old = pv(
            json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "csi": {"driver": "d.example.com", "volumeHandle": "h"}}),
        );
        let mut new = old.clone();
        new["spec"]["csi"]["controllerExpandSecretRef"] = json!({"name": "s", "namespace": "n"});
        assert!(PersistentVolume.validate_update(&old, &new).is_empty());
        let mut other = new.clone();
        other["spec"]["csi"]["volumeHandle"] = json!("h2");
        assert_eq!(PersistentVolume.validate_update(&old, &other).len(), 1);
        // Set once, it stays.
        let mut changed = new.clone();
        changed["spec"]["csi"]["controllerExpandSecretRef"]["name"] = json!("t");
        assert_eq!(PersistentVolume.validate_update(&new, &changed).len(), 1);
    }

    #[test]
    fn the_host_root_is_never_recycled() {
        let v = pv(
            json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "hostPath": {"path": "//"}, "persistentVolumeReclaimPolicy": "Recycle"}),
        );
        assert_eq!(
            messages(&PersistentVolume.validate(&v)),
            ["spec.persistentVolumeReclaimPolicy: Forbidden: may not be 'recycle' for a hostPath mount of '/'"]
        );
    }

    #[test]
    fn rows_print_as_upstream() {
        let mut v = local_pv();
        PersistentVolume.default(&mut v);
        v["spec"]["claimRef"] = json!({"namespace": "ns", "name": "c"});
        v["spec"]["storageClassName"] = json!("fast");
        v["status"] = json!({"phase": "Bound"});
        let cells = PersistentVolume.cells(&v);
        assert_eq!(cells.len(), PersistentVolume.columns().len());
        assert_eq!(
            &cells[1..9],
            &[
                json!("1Gi"),
                json!("RWO"),
                json!("Retain"),
                json!("Bound"),
                json!("ns/c"),
                json!("fast"),
                json!("<unset>"),
                json!("")
            ]
        );
        assert_eq!(cells[10], "Filesystem");
    }
}
