//! Defaulting shared by several kinds, as upstream's `SetDefaults_*`
//! functions: pod specs (of pods and of workload templates), containers,
//! and the small helpers each kind's strategy defaults its own fields with.

use serde_json::{json, Map, Value};

/// Pod template defaults of a workload's spec.
pub(crate) fn template(spec: &mut Map<String, Value>) {
    if let Some(ps) = spec
        .get_mut("template")
        .and_then(|t| t.get_mut("spec"))
        .and_then(Value::as_object_mut)
    {
        pod_spec(ps, false);
    }
}

/// Pod spec defaults. `admission` adds what admission plugins add to real
/// pods but not to templates (service account; the default tolerations
/// are [`default_tolerations`], applied on create only).
pub fn pod_spec(spec: &mut Map<String, Value>, admission: bool) {
    set(spec, "restartPolicy", json!("Always"));
    set(spec, "terminationGracePeriodSeconds", json!(30));
    set(spec, "dnsPolicy", json!("ClusterFirst"));
    set(spec, "schedulerName", json!("default-scheduler"));
    set(spec, "securityContext", json!({}));
    if admission {
        set(spec, "enableServiceLinks", json!(true));
        // The deprecated `serviceAccount` names the account when
        // `serviceAccountName` does not, as upstream's conversion reads it.
        let deprecated = spec
            .get("serviceAccount")
            .filter(|v| v.as_str().is_some_and(|s| !s.is_empty()))
            .cloned();
        set(
            spec,
            "serviceAccountName",
            deprecated.unwrap_or(json!("default")),
        );
        let sa = spec
            .get("serviceAccountName")
            .cloned()
            .unwrap_or(json!("default"));
        set(spec, "serviceAccount", sa);
    }
    for field in ["containers", "initContainers"] {
        if let Some(cs) = spec.get_mut(field).and_then(Value::as_array_mut) {
            for c in cs.iter_mut().filter_map(Value::as_object_mut) {
                container(c);
            }
        }
    }
}

fn container(c: &mut Map<String, Value>) {
    let image = c
        .get("image")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    set(c, "imagePullPolicy", json!(pull_policy(&image)));
    set(c, "terminationMessagePath", json!("/dev/termination-log"));
    set(c, "terminationMessagePolicy", json!("File"));
    set(c, "resources", json!({}));
    if let Some(ports) = c.get_mut("ports").and_then(Value::as_array_mut) {
        for p in ports.iter_mut().filter_map(Value::as_object_mut) {
            set(p, "protocol", json!("TCP"));
        }
    }
}

/// `Always` for `:latest` or untagged images, `IfNotPresent` otherwise; an
/// image pinned by digest is never re-pulled.
pub fn pull_policy(image: &str) -> &'static str {
    if image.contains('@') {
        return "IfNotPresent";
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.split_once(':') {
        Some((_, "latest")) | None => "Always",
        Some(_) => "IfNotPresent",
    }
}

pub(crate) fn set(m: &mut Map<String, Value>, k: &str, v: Value) {
    if m.get(k).is_none_or(Value::is_null) {
        m.insert(k.to_string(), v);
    }
}

pub(crate) fn obj_field<'a>(obj: &'a mut Value, k: &str) -> &'a mut Map<String, Value> {
    let m = obj.as_object_mut().expect("objects are maps");
    obj_field_map(m, k)
}

pub(crate) fn obj_field_map<'a>(
    m: &'a mut Map<String, Value>,
    k: &str,
) -> &'a mut Map<String, Value> {
    if !m.get(k).is_some_and(Value::is_object) {
        m.insert(k.to_string(), json!({}));
    }
    m.get_mut(k)
        .and_then(Value::as_object_mut)
        .expect("just inserted")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::resources::lookup;

    #[test]
    fn pull_policies() {
        assert_eq!(pull_policy("busybox"), "Always");
        assert_eq!(pull_policy("busybox:latest"), "Always");
        assert_eq!(pull_policy("busybox:1.36"), "IfNotPresent");
        assert_eq!(pull_policy("localhost:5000/busybox"), "Always");
        assert_eq!(pull_policy("localhost:5000/busybox:1"), "IfNotPresent");
    }

    #[test]
    fn pod_and_deployment_defaults() {
        let mut pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "busybox:1"}]}});
        lookup("", "v1", "pods").unwrap().strategy.default(&mut pod);
        assert_eq!(pod["spec"]["restartPolicy"], "Always");
        assert_eq!(pod["spec"]["terminationGracePeriodSeconds"], 30);
        assert_eq!(
            pod["spec"]["containers"][0]["imagePullPolicy"],
            "IfNotPresent"
        );
        let mut d =
            json!({"metadata": {"name": "d"}, "spec": {"template": {"spec": {"containers": []}}}});
        lookup("apps", "v1", "deployments")
            .unwrap()
            .strategy
            .default(&mut d);
        assert_eq!(d["spec"]["strategy"]["rollingUpdate"]["maxSurge"], "25%");
        assert_eq!(d["spec"]["replicas"], 1);
    }
}
