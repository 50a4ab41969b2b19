//! The storage API through real kubectl: PersistentVolumes, claims and
//! StorageClasses with upstream's defaults, validation, admission
//! (default class, protection finalizers, resize) and columns. No
//! controller runs here: claims stay Pending unless a test binds them by
//! hand.

use crate::api;

use api::{fails, ok, TestServer};
use serde_json::Value;

fn get_json(s: &TestServer, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&ok(s.kubectl(&all))).expect("kubectl -o json")
}

/// The header and the row of `name` in `kubectl get` output, split on
/// runs of two or more spaces.
fn columns(line: &str) -> Vec<String> {
    line.split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(String::from)
        .collect()
}

fn row<'a>(out: &'a str, name: &str) -> &'a str {
    out.lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no row {name} in\n{out}"))
}

const OBJECTS: &str = r#"
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: slow
provisioner: example.com/fixed
---
apiVersion: v1
kind: PersistentVolume
metadata:
  name: pv-local
spec:
  capacity:
    storage: 1Gi
  accessModes: [ReadWriteOnce, ReadWriteMany]
  storageClassName: slow
  local:
    path: /mnt/disk1
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions:
        - {key: kubernetes.io/hostname, operator: In, values: [n1]}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: c1
spec:
  accessModes: [ReadWriteOnce]
  resources:
    requests:
      storage: 1Gi
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: c2
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: slow
  resources:
    requests:
      storage: 1Gi
"#;

/// A claim or volume manifest refused with `message` in kubectl's error.
fn refused(s: &TestServer, yaml: &str, message: &str) {
    let err = fails(s.kubectl_stdin(&["apply", "-f", "-"], yaml));
    assert!(err.contains(message), "want {message:?} in: {err}");
}

/// Bind claim `name` by hand, as the PV controller would: the volume
/// name, then the status.
fn bind(s: &TestServer, name: &str) {
    ok(s.kubectl(&[
        "patch",
        "pvc",
        name,
        "--type=merge",
        "-p",
        r#"{"spec":{"volumeName":"pv-local"}}"#,
    ]));
    ok(s.kubectl(&[
        "patch", "pvc", name, "--subresource=status", "--type=merge", "-p",
        r#"{"status":{"phase":"Bound","accessModes":["ReadWriteOnce"],"capacity":{"storage":"1Gi"}}}"#,
    ]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn storage_kinds_through_kubectl() {
    let s = TestServer::start().await;

    // Discovery: the kinds, their short names and scopes.
    let res = ok(s.kubectl(&["api-resources"]));
    for (name, want) in [
        ("persistentvolumes", "pv v1 false PersistentVolume"),
        (
            "persistentvolumeclaims",
            "pvc v1 true PersistentVolumeClaim",
        ),
        ("storageclasses", "sc storage.k8s.io/v1 false StorageClass"),
        ("csidrivers", "storage.k8s.io/v1 false CSIDriver"),
        ("csinodes", "storage.k8s.io/v1 false CSINode"),
        (
            "volumeattachments",
            "storage.k8s.io/v1 false VolumeAttachment",
        ),
    ] {
        let line = row(&res, name).split_whitespace().collect::<Vec<_>>()[1..].join(" ");
        assert_eq!(line, want, "{res}");
    }

    // The built-in class, created at start, is the default.
    let sc = get_json(&s, &["get", "sc", "local-path"]);
    assert_eq!(sc["provisioner"], "skiff.io/local-path");
    assert_eq!(sc["volumeBindingMode"], "WaitForFirstConsumer");
    assert_eq!(sc["allowVolumeExpansion"], true);

    ok(s.kubectl_stdin(&["apply", "-f", "-"], OBJECTS));

    // Defaults and protection finalizers.
    let pv = get_json(&s, &["get", "pv", "pv-local"]);
    assert_eq!(pv["spec"]["persistentVolumeReclaimPolicy"], "Retain");
    assert_eq!(pv["spec"]["volumeMode"], "Filesystem");
    assert_eq!(pv["status"]["phase"], "Pending");
    assert_eq!(
        pv["metadata"]["finalizers"],
        serde_json::json!(["kubernetes.io/pv-protection"])
    );
    let c1 = get_json(&s, &["get", "pvc", "c1"]);
    assert_eq!(
        c1["spec"]["storageClassName"], "local-path",
        "the default class"
    );
    assert_eq!(c1["spec"]["volumeMode"], "Filesystem");
    assert_eq!(c1["status"]["phase"], "Pending");
    assert_eq!(
        c1["metadata"]["finalizers"],
        serde_json::json!(["kubernetes.io/pvc-protection"])
    );
    let sc = get_json(&s, &["get", "sc", "slow"]);
    assert_eq!(sc["reclaimPolicy"], "Delete");
    assert_eq!(sc["volumeBindingMode"], "Immediate");

    // Columns as upstream prints them.
    let out = ok(s.kubectl(&["get", "pv"]));
    assert_eq!(
        columns(out.lines().next().unwrap_or_default()),
        [
            "NAME",
            "CAPACITY",
            "ACCESS MODES",
            "RECLAIM POLICY",
            "STATUS",
            "CLAIM",
            "STORAGECLASS",
            "VOLUMEATTRIBUTESCLASS",
            "REASON",
            "AGE"
        ]
    );
    let cells = columns(row(&out, "pv-local"));
    assert_eq!(
        cells[..7],
        ["pv-local", "1Gi", "RWO,RWX", "Retain", "Pending", "slow", "<unset>"]
    );
    let wide = ok(s.kubectl(&["get", "pv", "-o", "wide"]));
    assert_eq!(
        columns(wide.lines().next().unwrap_or_default())
            .last()
            .map(String::as_str),
        Some("VOLUMEMODE")
    );
    let out = ok(s.kubectl(&["get", "pvc", "-o", "wide"]));
    assert_eq!(
        columns(out.lines().next().unwrap_or_default()),
        [
            "NAME",
            "STATUS",
            "VOLUME",
            "CAPACITY",
            "ACCESS MODES",
            "STORAGECLASS",
            "VOLUMEATTRIBUTESCLASS",
            "AGE",
            "VOLUMEMODE"
        ]
    );
    let cells = columns(row(&out, "c1"));
    assert_eq!(cells[..4], ["c1", "Pending", "local-path", "<unset>"]);
    assert_eq!(cells.last().map(String::as_str), Some("Filesystem"));
    let out = ok(s.kubectl(&["get", "sc"]));
    assert_eq!(
        columns(out.lines().next().unwrap_or_default()),
        [
            "NAME",
            "PROVISIONER",
            "RECLAIMPOLICY",
            "VOLUMEBINDINGMODE",
            "ALLOWVOLUMEEXPANSION",
            "AGE"
        ]
    );
    assert_eq!(
        columns(row(&out, "local-path"))[..5],
        [
            "local-path (default)",
            "skiff.io/local-path",
            "Delete",
            "WaitForFirstConsumer",
            "true"
        ]
    );
    assert_eq!(
        columns(row(&out, "slow"))[..5],
        ["slow", "example.com/fixed", "Delete", "Immediate", "false"]
    );
    let all = ok(s.kubectl(&["get", "pv,pvc,sc"]));
    for name in [
        "persistentvolume/pv-local",
        "persistentvolumeclaim/c2",
        "storageclass.storage.k8s.io/local-path",
    ] {
        assert!(all.contains(name), "{name} in\n{all}");
    }

    // Validation, with upstream's words.
    refused(
        &s,
        "{apiVersion: v1, kind: PersistentVolumeClaim, metadata: {name: bad}, spec: {accessModes: [ReadWriteOnce]}}",
        "spec.resources[storage]: Required value",
    );
    refused(
        &s,
        "{apiVersion: v1, kind: PersistentVolumeClaim, metadata: {name: bad}, spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}, dataSource: {kind: PersistentVolumeClaim, name: c1}}}",
        "spec.dataSource: Forbidden: volume populators and cloning are not supported by skiff yet",
    );
    refused(
        &s,
        "{apiVersion: v1, kind: PersistentVolume, metadata: {name: bad}, spec: {capacity: {storage: 1Gi}, accessModes: [ReadWriteOnce], hostPath: {path: /a}, csi: {driver: d.example.com, volumeHandle: h}}}",
        "spec.csi: Forbidden: may not specify more than 1 volume type",
    );
    refused(
        &s,
        "{apiVersion: v1, kind: PersistentVolume, metadata: {name: bad}, spec: {capacity: {storage: 1Gi}, accessModes: [ReadWriteOnce], local: {path: /a}}}",
        "spec.nodeAffinity: Required value: Local volume requires node affinity",
    );
    let err = fails(s.kubectl(&[
        "patch",
        "pv",
        "pv-local",
        "--type=merge",
        "-p",
        r#"{"spec":{"local":{"path":"/mnt/other"}}}"#,
    ]));
    assert!(
        err.contains("spec.persistentvolumesource: Forbidden: spec.persistentvolumesource is immutable after creation"),
        "{err}"
    );
    let err = fails(s.kubectl(&[
        "patch",
        "pvc",
        "c1",
        "--type=merge",
        "-p",
        r#"{"spec":{"accessModes":["ReadWriteMany"]}}"#,
    ]));
    assert!(
        err.contains("spec: Forbidden: spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims"),
        "{err}"
    );
    let err = fails(s.kubectl(&[
        "patch",
        "sc",
        "slow",
        "--type=merge",
        "-p",
        r#"{"parameters":{"root":"/x"}}"#,
    ]));
    assert!(
        err.contains("parameters: Forbidden: updates to parameters are forbidden."),
        "{err}"
    );

    // Expansion: a bound claim grows when its class allows it, never
    // shrinks below what it has.
    bind(&s, "c1");
    bind(&s, "c2");
    let out = ok(s.kubectl(&["get", "pvc", "c1"]));
    assert_eq!(
        columns(row(&out, "c1"))[..6],
        ["c1", "Bound", "pv-local", "1Gi", "RWO", "local-path"]
    );
    ok(s.kubectl(&[
        "patch",
        "pvc",
        "c1",
        "--type=merge",
        "-p",
        r#"{"spec":{"resources":{"requests":{"storage":"2Gi"}}}}"#,
    ]));
    let err = fails(s.kubectl(&[
        "patch",
        "pvc",
        "c1",
        "--type=merge",
        "-p",
        r#"{"spec":{"resources":{"requests":{"storage":"512Mi"}}}}"#,
    ]));
    assert!(
        err.contains("spec.resources.requests.storage: Forbidden: field can not be less than status.capacity"),
        "{err}"
    );
    let err = fails(s.kubectl(&[
        "patch",
        "pvc",
        "c2",
        "--type=merge",
        "-p",
        r#"{"spec":{"resources":{"requests":{"storage":"2Gi"}}}}"#,
    ]));
    assert!(
        err.contains("persistentvolumeclaims \"c2\" is forbidden: only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize"),
        "{err}"
    );

    // The protection finalizer holds a deleted claim (no controller here
    // removes it).
    ok(s.kubectl(&["delete", "pvc", "c2", "--wait=false"]));
    let out = ok(s.kubectl(&["get", "pvc", "c2"]));
    assert_eq!(columns(row(&out, "c2"))[1], "Terminating");

    // kubectl's describers read the same objects.
    let out = ok(s.kubectl(&["describe", "sc", "local-path"]));
    assert!(out.contains("IsDefaultClass:        Yes"), "{out}");
    let out = ok(s.kubectl(&["describe", "pvc", "c1"]));
    assert!(out.contains("StorageClass:  local-path"), "{out}");
    assert!(out.contains("kubernetes.io/pvc-protection"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_built_in_class_is_created_once() {
    let mut s = TestServer::start().await;
    // An administrator who turns the default off keeps it off across
    // restarts; claims then get no class.
    ok(s.kubectl(&[
        "annotate",
        "sc",
        "local-path",
        "--overwrite",
        "storageclass.kubernetes.io/is-default-class=false",
    ]));
    s.restart().await;
    let sc = get_json(&s, &["get", "sc", "local-path"]);
    assert_eq!(
        sc["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"],
        "false"
    );
    ok(s.kubectl_stdin(
        &["apply", "-f", "-"],
        "{apiVersion: v1, kind: PersistentVolumeClaim, metadata: {name: plain}, spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}}",
    ));
    let pvc = get_json(&s, &["get", "pvc", "plain"]);
    assert!(pvc["spec"]["storageClassName"].is_null(), "{pvc}");
    // Deleted, it comes back at the next start.
    ok(s.kubectl(&["delete", "sc", "local-path"]));
    s.restart().await;
    let sc = get_json(&s, &["get", "sc", "local-path"]);
    assert_eq!(
        sc["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"],
        "true"
    );
}
