//! Defaulting, as upstream's `SetDefaults_*` functions and the admission
//! plugins that fill fields (ServiceAccount, DefaultTolerationSeconds) do.

use serde_json::{json, Map, Value};

use super::resources::ResourceDef;

/// Fill defaults of a new or updated object in place.
pub fn apply(def: &ResourceDef, obj: &mut Value) {
    match (def.group, def.kind) {
        ("", "Pod") => {
            if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
                pod_spec(spec, true);
            }
        }
        ("apps", "Deployment") => {
            let spec = obj_field(obj, "spec");
            set(spec, "replicas", json!(1));
            set(spec, "revisionHistoryLimit", json!(10));
            set(spec, "progressDeadlineSeconds", json!(600));
            let strategy = obj_field_map(spec, "strategy");
            set(strategy, "type", json!("RollingUpdate"));
            if strategy.get("type").and_then(Value::as_str) == Some("RollingUpdate") {
                let ru = obj_field_map(strategy, "rollingUpdate");
                set(ru, "maxUnavailable", json!("25%"));
                set(ru, "maxSurge", json!("25%"));
            }
            template(spec);
        }
        ("apps", "ReplicaSet") => {
            let spec = obj_field(obj, "spec");
            set(spec, "replicas", json!(1));
            template(spec);
        }
        ("apps", "DaemonSet") => {
            let spec = obj_field(obj, "spec");
            set(spec, "revisionHistoryLimit", json!(10));
            let us = obj_field_map(spec, "updateStrategy");
            set(us, "type", json!("RollingUpdate"));
            if us.get("type").and_then(Value::as_str) == Some("RollingUpdate") {
                let ru = obj_field_map(us, "rollingUpdate");
                set(ru, "maxUnavailable", json!(1));
                set(ru, "maxSurge", json!(0));
            }
            template(spec);
        }
        ("batch", "Job") => {
            let spec = obj_field(obj, "spec");
            set(spec, "parallelism", json!(1));
            if !spec.contains_key("completions")
                && spec.get("completionMode").and_then(Value::as_str) != Some("Indexed")
            {
                spec.insert("completions".into(), json!(1));
            }
            set(spec, "backoffLimit", json!(6));
            set(spec, "completionMode", json!("NonIndexed"));
            set(spec, "suspend", json!(false));
            set(spec, "manualSelector", json!(false));
            set(spec, "podReplacementPolicy", json!("TerminatingOrFailed"));
            template(spec);
        }
        ("", "Service") => {
            let spec = obj_field(obj, "spec");
            set(spec, "type", json!("ClusterIP"));
            set(spec, "sessionAffinity", json!("None"));
            let ty = spec
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or("ClusterIP")
                .to_string();
            if ty != "ExternalName" {
                set(spec, "internalTrafficPolicy", json!("Cluster"));
            }
            if matches!(ty.as_str(), "NodePort" | "LoadBalancer") {
                set(spec, "externalTrafficPolicy", json!("Cluster"));
            }
            if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
                for p in ports.iter_mut().filter_map(Value::as_object_mut) {
                    set(p, "protocol", json!("TCP"));
                    if !p.contains_key("targetPort") {
                        if let Some(port) = p.get("port").cloned() {
                            p.insert("targetPort".into(), port);
                        }
                    }
                }
            }
        }
        ("", "Namespace") => {
            let name = obj["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let meta = obj_field(obj, "metadata");
            let labels = obj_field_map(meta, "labels");
            labels.insert("kubernetes.io/metadata.name".into(), json!(name));
            let spec = obj_field(obj, "spec");
            set(spec, "finalizers", json!(["kubernetes"]));
            let status = obj_field(obj, "status");
            set(status, "phase", json!("Active"));
        }
        ("", "Secret") => {
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
        _ => {}
    }
}

fn template(spec: &mut Map<String, Value>) {
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
        set(spec, "preemptionPolicy", json!("PreemptLowerPriority"));
        set(spec, "priority", json!(0));
        set(spec, "serviceAccountName", json!("default"));
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

/// The DefaultTolerationSeconds admission plugin's settings
/// (`--default-not-ready-toleration-seconds`,
/// `--default-unreachable-toleration-seconds`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DefaultTolerationSeconds {
    pub not_ready: i64,
    pub unreachable: i64,
}

impl Default for DefaultTolerationSeconds {
    /// Upstream's 300 s for both.
    fn default() -> Self {
        DefaultTolerationSeconds {
            not_ready: 300,
            unreachable: 300,
        }
    }
}

pub const TAINT_NOT_READY: &str = "node.kubernetes.io/not-ready";
pub const TAINT_UNREACHABLE: &str = "node.kubernetes.io/unreachable";

/// DefaultTolerationSeconds admission, on pod create: a pod that does not
/// already tolerate the not-ready / unreachable NoExecute taints gets a
/// toleration for each with `tolerationSeconds`, so that the node
/// lifecycle controller evicts it that long after its node fails.
/// A toleration with an empty key or effect counts as tolerating (as
/// upstream's plugin checks).
pub fn default_tolerations(def: &ResourceDef, obj: &mut Value, secs: &DefaultTolerationSeconds) {
    if !(def.group.is_empty() && def.kind == "Pod") {
        return;
    }
    let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let tol = spec.entry("tolerations").or_insert_with(|| json!([]));
    if tol.is_null() {
        *tol = json!([]);
    }
    let Some(list) = tol.as_array_mut() else {
        return;
    };
    for (key, seconds) in [
        (TAINT_NOT_READY, secs.not_ready),
        (TAINT_UNREACHABLE, secs.unreachable),
    ] {
        let tolerated = list.iter().any(|t| {
            let k = t.get("key").and_then(Value::as_str).unwrap_or_default();
            let e = t.get("effect").and_then(Value::as_str).unwrap_or_default();
            (k == key || k.is_empty()) && (e == "NoExecute" || e.is_empty())
        });
        if !tolerated {
            list.push(json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": seconds}));
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

fn set(m: &mut Map<String, Value>, k: &str, v: Value) {
    if m.get(k).is_none_or(Value::is_null) {
        m.insert(k.to_string(), v);
    }
}

fn obj_field<'a>(obj: &'a mut Value, k: &str) -> &'a mut Map<String, Value> {
    let m = obj.as_object_mut().expect("objects are maps");
    obj_field_map(m, k)
}

fn obj_field_map<'a>(m: &'a mut Map<String, Value>, k: &str) -> &'a mut Map<String, Value> {
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
        apply(lookup("", "v1", "pods").unwrap(), &mut pod);
        assert_eq!(pod["spec"]["restartPolicy"], "Always");
        assert_eq!(pod["spec"]["terminationGracePeriodSeconds"], 30);
        assert_eq!(
            pod["spec"]["containers"][0]["imagePullPolicy"],
            "IfNotPresent"
        );
        let mut d =
            json!({"metadata": {"name": "d"}, "spec": {"template": {"spec": {"containers": []}}}});
        apply(lookup("apps", "v1", "deployments").unwrap(), &mut d);
        assert_eq!(d["spec"]["strategy"]["rollingUpdate"]["maxSurge"], "25%");
        assert_eq!(d["spec"]["replicas"], 1);
    }

    #[test]
    fn default_tolerations_only_where_missing() {
        let pods = lookup("", "v1", "pods").unwrap();
        let secs = DefaultTolerationSeconds {
            not_ready: 7,
            unreachable: 9,
        };
        let mut pod = json!({"spec": {"tolerations": [
            {"key": TAINT_UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 2}
        ]}});
        default_tolerations(pods, &mut pod, &secs);
        assert_eq!(
            pod["spec"]["tolerations"],
            json!([
                {"key": TAINT_UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 2},
                {"key": TAINT_NOT_READY, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 7},
            ])
        );
        // Tolerating everything (empty key, empty effect) needs nothing more.
        let mut all = json!({"spec": {"tolerations": [{"operator": "Exists"}]}});
        default_tolerations(pods, &mut all, &secs);
        assert_eq!(all["spec"]["tolerations"].as_array().unwrap().len(), 1);
        let mut bare = json!({"spec": {}});
        default_tolerations(pods, &mut bare, &secs);
        assert_eq!(bare["spec"]["tolerations"][1]["tolerationSeconds"], 9);
    }
}
