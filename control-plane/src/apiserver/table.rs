//! Server-side printing: `meta.k8s.io/v1` `Table` responses with the columns
//! upstream's printers (`pkg/printers/internalversion`) give each kind, so
//! `kubectl get` output looks as users expect.

use serde_json::{json, Value};

use super::objects::{self, parse_time};
use super::resources::ResourceDef;

/// Whether the Accept header asks for a Table.
pub fn wants_table(accept: &str) -> bool {
    accept
        .split(',')
        .any(|a| a.contains("as=Table") && a.contains("g=meta.k8s.io"))
}

/// Whether the Accept header asks for metadata only
/// (`as=PartialObjectMetadata[List]`, used by metadata informers).
pub fn wants_metadata(accept: &str) -> bool {
    accept
        .split(',')
        .any(|a| a.contains("as=PartialObjectMetadata") && a.contains("g=meta.k8s.io"))
}

/// An object reduced to `PartialObjectMetadata`.
pub fn partial_metadata(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or(json!({})),
    })
}

/// (name, type, priority, description)
type Col = (&'static str, &'static str, u8, &'static str);

fn columns(def: &ResourceDef) -> Vec<Col> {
    let name: Col = (
        "Name",
        "string",
        0,
        "Name must be unique within a namespace.",
    );
    let age: Col = ("Age", "string", 0, "CreationTimestamp is a timestamp representing the server time when this object was created.");
    let mut cols = vec![name];
    let rest: Vec<Col> = match (def.group, def.kind) {
        ("", "Pod") => vec![
            ("Ready", "string", 0, "The aggregate readiness state of this pod for accepting traffic."),
            ("Status", "string", 0, "The aggregate status of the containers in this pod."),
            ("Restarts", "string", 0, "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted."),
            age,
            ("IP", "string", 1, "IP address allocated to the pod."),
            ("Node", "string", 1, "Name of the Node this pod is assigned to."),
            ("Nominated Node", "string", 1, "Name of the node where the pod is nominated to run."),
            ("Readiness Gates", "string", 1, "If specified, all readiness gates will be evaluated for pod readiness."),
        ],
        ("", "Node") => vec![
            ("Status", "string", 0, "The status of the node"),
            ("Roles", "string", 0, "The roles of the node"),
            age,
            ("Version", "string", 0, "Kubelet Version reported by the node."),
            ("Internal-IP", "string", 1, "List of addresses reachable to the node."),
            ("External-IP", "string", 1, "List of addresses reachable to the node."),
            ("OS-Image", "string", 1, "OS Image reported by the node from /etc/os-release."),
            ("Kernel-Version", "string", 1, "Kernel Version reported by the node."),
            ("Container-Runtime", "string", 1, "Container Runtime Version reported by the node."),
        ],
        ("", "Namespace") => vec![("Status", "string", 0, "The status of the namespace"), age],
        ("", "Service") => vec![
            ("Type", "string", 0, "The type of the service."),
            ("Cluster-IP", "string", 0, "The cluster IP of the service."),
            ("External-IP", "string", 0, "The external IP of the service."),
            ("Port(s)", "string", 0, "The ports of the service."),
            age,
            ("Selector", "string", 1, "The selector of the service."),
        ],
        ("apps", "Deployment") => vec![
            ("Ready", "string", 0, "Number of the pod with ready state"),
            ("Up-to-date", "string", 0, "Total number of non-terminated pods targeted by this deployment that have the desired template spec."),
            ("Available", "string", 0, "Total number of available pods (ready for at least minReadySeconds) targeted by this deployment."),
            age,
            ("Containers", "string", 1, "Names of each container in the template."),
            ("Images", "string", 1, "Images referenced by each container in the template."),
            ("Selector", "string", 1, "Label selector for pods."),
        ],
        ("apps", "ReplicaSet") => vec![
            ("Desired", "integer", 0, "Number of desired pods."),
            ("Current", "integer", 0, "Number of actual replicas."),
            ("Ready", "integer", 0, "The number of ready replicas for this replica set."),
            age,
            ("Containers", "string", 1, "Names of each container in the template."),
            ("Images", "string", 1, "Images referenced by each container in the template."),
            ("Selector", "string", 1, "Label selector for pods."),
        ],
        ("apps", "DaemonSet") => vec![
            ("Desired", "integer", 0, "The total number of nodes that should be running the daemon pod."),
            ("Current", "integer", 0, "The number of nodes that are running at least 1 daemon pod."),
            ("Ready", "integer", 0, "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and ready."),
            ("Up-to-date", "integer", 0, "The total number of nodes that are running updated daemon pod"),
            ("Available", "integer", 0, "The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and available."),
            ("Node Selector", "string", 0, "NodeSelector is a selector which must be true for the pod to fit on a node."),
            age,
            ("Containers", "string", 1, "Names of each container in the template."),
            ("Images", "string", 1, "Images referenced by each container in the template."),
            ("Selector", "string", 1, "Label selector for pods."),
        ],
        ("batch", "Job") => vec![
            ("Status", "string", 0, "Status of the job."),
            ("Completions", "string", 0, "The desired number of successfully finished pods the job should be run with."),
            ("Duration", "string", 0, "Time required to complete the job."),
            age,
            ("Containers", "string", 1, "Names of each container in the template."),
            ("Images", "string", 1, "Images referenced by each container in the template."),
            ("Selector", "string", 1, "Label selector for pods."),
        ],
        ("", "Event") => {
            cols.clear();
            vec![
                ("Last Seen", "string", 0, "Time when last this event has been seen."),
                ("Type", "string", 0, "Type of this event (Normal, Warning), new types could be added in the future."),
                ("Reason", "string", 0, "This should be a short, machine understandable string that gives the reason for this event being generated."),
                ("Object", "string", 0, "The object this Event is about."),
                ("Message", "string", 0, "A human-readable description of the status of this operation."),
                ("Subobject", "string", 1, "The field of the object this Event is about."),
                ("Source", "string", 1, "The component reporting this event."),
                ("First Seen", "string", 1, "The time at which the event was first recorded."),
                ("Count", "string", 1, "The number of times this event has occurred."),
                ("Name", "string", 1, "Name must be unique within a namespace."),
            ]
        }
        ("", "ConfigMap") => vec![("Data", "string", 0, "Number of data entries."), age],
        ("", "Secret") => vec![
            ("Type", "string", 0, "The type of the secret"),
            ("Data", "string", 0, "The number of data entries in the secret"),
            age,
        ],
        ("", "Endpoints") => vec![("Endpoints", "string", 0, "Endpoints of the service"), age],
        ("", "ServiceAccount") => vec![("Secrets", "string", 0, "Number of secrets in the service account"), age],
        ("coordination.k8s.io", "Lease") => vec![("Holder", "string", 0, "The holder of the lease."), age],
        ("discovery.k8s.io", "EndpointSlice") => vec![
            ("AddressType", "string", 0, "The IP protocol for this slice"),
            ("Ports", "string", 0, "The ports of this slice"),
            ("Endpoints", "string", 0, "The endpoints of this slice"),
            age,
        ],
        ("certificates.k8s.io", "CertificateSigningRequest") => vec![
            age,
            ("SignerName", "string", 0, "signerName indicates the requested signer, and is a qualified name."),
            ("Requestor", "string", 0, "username contains the name of the user that created the CertificateSigningRequest."),
            ("RequestedDuration", "string", 0, "expirationSeconds is the requested duration of validity of the issued certificate."),
            ("Condition", "string", 0, "conditions applied to the request. Known conditions are \"Approved\", \"Denied\", and \"Failed\"."),
        ],
        ("rbac.authorization.k8s.io", "Role") | ("rbac.authorization.k8s.io", "ClusterRole") => {
            vec![("Created At", "date", 0, "Time is a wrapper around time.Time which supports correct marshaling to YAML and JSON.")]
        }
        ("rbac.authorization.k8s.io", "RoleBinding") | ("rbac.authorization.k8s.io", "ClusterRoleBinding") => vec![
            ("Role", "string", 0, "Role"),
            age,
            ("Users", "string", 1, "Users in the roleBinding"),
            ("Groups", "string", 1, "Groups in the roleBinding"),
            ("ServiceAccounts", "string", 1, "ServiceAccounts in the roleBinding"),
        ],
        _ => vec![age],
    };
    cols.extend(rest);
    cols
}

/// `columnDefinitions` of the kind's Table.
pub fn column_definitions(def: &ResourceDef) -> Value {
    Value::Array(
        columns(def)
            .into_iter()
            .map(|(name, ty, priority, description)| {
                let format = if name == "Name" { "name" } else { "" };
                json!({"name": name, "type": ty, "format": format, "description": description, "priority": priority})
            })
            .collect(),
    )
}

/// A whole Table for `objs`. `include_object` is `None`, `Metadata` (the
/// default) or `Object`.
pub fn table(
    def: &ResourceDef,
    objs: &[Value],
    list_meta: Value,
    include_object: &str,
    with_columns: bool,
) -> Value {
    let rows: Vec<Value> = objs.iter().map(|o| row(def, o, include_object)).collect();
    let mut t = json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "rows": rows,
    });
    if with_columns {
        t["columnDefinitions"] = column_definitions(def);
    } else {
        t["columnDefinitions"] = Value::Null;
    }
    t
}

fn row(def: &ResourceDef, obj: &Value, include_object: &str) -> Value {
    let object = match include_object {
        "None" => Value::Null,
        "Object" => obj.clone(),
        _ => json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj.get("metadata").cloned().unwrap_or(json!({})),
        }),
    };
    json!({"cells": cells(def, obj), "object": object})
}

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn i(v: &Value) -> i64 {
    v.as_i64().unwrap_or(0)
}

fn or_none(s: String) -> String {
    if s.is_empty() {
        "<none>".into()
    } else {
        s
    }
}

fn age_of(obj: &Value) -> String {
    objects::meta_str(obj, "creationTimestamp")
        .map(since)
        .unwrap_or_else(|| "<unknown>".into())
}

/// Human age of a timestamp, like upstream's `translateTimestampSince`.
pub fn since(ts: &str) -> String {
    match parse_time(ts) {
        Some(t) => human_duration(chrono::Utc::now().signed_duration_since(t).num_seconds()),
        None => "<unknown>".into(),
    }
}

/// apimachinery's `duration.HumanDuration`.
pub fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    if secs < 0 {
        return "0s".into();
    }
    if secs < 120 {
        return format!("{secs}s");
    }
    let minutes = secs / 60;
    if minutes < 10 {
        let s = secs % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = secs / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{}h", hours / 24, h)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        return if dy == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{}d", hours / 24 / 365, dy)
        };
    }
    format!("{}y", hours / 24 / 365)
}

fn template_containers(obj: &Value) -> (String, String) {
    let cs = obj["spec"]["template"]["spec"]["containers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let names: Vec<String> = cs.iter().map(|c| s(&c["name"])).collect();
    let images: Vec<String> = cs.iter().map(|c| s(&c["image"])).collect();
    (names.join(","), images.join(","))
}

fn selector_string(sel: &Value) -> String {
    let mut parts: Vec<String> = Vec::new();
    if let Some(m) = sel["matchLabels"].as_object() {
        parts.extend(m.iter().map(|(k, v)| format!("{k}={}", s(v))));
    }
    if let Some(exprs) = sel["matchExpressions"].as_array() {
        for e in exprs {
            let vals: Vec<String> = e["values"]
                .as_array()
                .into_iter()
                .flatten()
                .map(s)
                .collect();
            let op = s(&e["operator"]);
            let key = s(&e["key"]);
            parts.push(match op.as_str() {
                "In" => format!("{key} in ({})", vals.join(",")),
                "NotIn" => format!("{key} notin ({})", vals.join(",")),
                "Exists" => key,
                "DoesNotExist" => format!("!{key}"),
                _ => format!("{key} {op}"),
            });
        }
    }
    or_none(parts.join(","))
}

fn cells(def: &ResourceDef, obj: &Value) -> Vec<Value> {
    let name = json!(objects::name(obj).unwrap_or_default());
    let age = json!(age_of(obj));
    let st = &obj["status"];
    let spec = &obj["spec"];
    match (def.group, def.kind) {
        ("", "Pod") => pod_cells(obj, name, age),
        ("", "Node") => {
            let conds = st["conditions"].as_array().cloned().unwrap_or_default();
            let ready = conds.iter().find(|c| c["type"] == "Ready");
            let mut status = match ready.map(|c| s(&c["status"])) {
                Some(x) if x == "True" => "Ready".to_string(),
                Some(x) if x == "False" => "NotReady".to_string(),
                _ => "Unknown".to_string(),
            };
            if spec["unschedulable"].as_bool() == Some(true) {
                status.push_str(",SchedulingDisabled");
            }
            let mut roles: Vec<String> = objects::labels(obj)
                .iter()
                .filter_map(|(k, _)| k.strip_prefix("node-role.kubernetes.io/").map(String::from))
                .filter(|r| !r.is_empty())
                .collect();
            roles.sort();
            let addr = |t: &str| {
                st["addresses"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|a| a["type"] == t)
                    .map(|a| s(&a["address"]))
                    .unwrap_or_else(|| "<none>".into())
            };
            let info = &st["nodeInfo"];
            vec![
                name,
                json!(status),
                json!(or_none(roles.join(","))),
                age,
                json!(s(&info["kubeletVersion"])),
                json!(addr("InternalIP")),
                json!(addr("ExternalIP")),
                json!(or_unknown(s(&info["osImage"]))),
                json!(or_unknown(s(&info["kernelVersion"]))),
                json!(or_unknown(s(&info["containerRuntimeVersion"]))),
            ]
        }
        ("", "Namespace") => vec![name, json!(s(&st["phase"])), age],
        ("", "Service") => {
            let ty = s(&spec["type"]);
            let ext: Vec<String> = match ty.as_str() {
                "ExternalName" => vec![s(&spec["externalName"])],
                _ => {
                    let mut v: Vec<String> = spec["externalIPs"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(s)
                        .collect();
                    for ing in st["loadBalancer"]["ingress"]
                        .as_array()
                        .into_iter()
                        .flatten()
                    {
                        v.push(if ing["ip"].is_string() {
                            s(&ing["ip"])
                        } else {
                            s(&ing["hostname"])
                        });
                    }
                    if v.is_empty() && ty == "LoadBalancer" {
                        v.push("<pending>".into());
                    }
                    v
                }
            };
            let ports: Vec<String> = spec["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| match p["nodePort"].as_i64() {
                    Some(np) if np > 0 => format!("{}:{}/{}", i(&p["port"]), np, s(&p["protocol"])),
                    _ => format!("{}/{}", i(&p["port"]), s(&p["protocol"])),
                })
                .collect();
            let sel: Vec<String> = spec["selector"]
                .as_object()
                .map(|m| m.iter().map(|(k, v)| format!("{k}={}", s(v))).collect())
                .unwrap_or_default();
            vec![
                name,
                json!(ty),
                json!(or_none(s(&spec["clusterIP"]))),
                json!(or_none(ext.join(","))),
                json!(or_none(ports.join(","))),
                age,
                json!(or_none(sel.join(","))),
            ]
        }
        ("apps", "Deployment") => {
            let (c, im) = template_containers(obj);
            vec![
                name,
                json!(format!(
                    "{}/{}",
                    i(&st["readyReplicas"]),
                    i(&spec["replicas"])
                )),
                json!(i(&st["updatedReplicas"])),
                json!(i(&st["availableReplicas"])),
                age,
                json!(c),
                json!(im),
                json!(selector_string(&spec["selector"])),
            ]
        }
        ("apps", "ReplicaSet") => {
            let (c, im) = template_containers(obj);
            vec![
                name,
                json!(i(&spec["replicas"])),
                json!(i(&st["replicas"])),
                json!(i(&st["readyReplicas"])),
                age,
                json!(c),
                json!(im),
                json!(selector_string(&spec["selector"])),
            ]
        }
        ("apps", "DaemonSet") => {
            let (c, im) = template_containers(obj);
            let ns: Vec<String> = spec["template"]["spec"]["nodeSelector"]
                .as_object()
                .map(|m| m.iter().map(|(k, v)| format!("{k}={}", s(v))).collect())
                .unwrap_or_default();
            vec![
                name,
                json!(i(&st["desiredNumberScheduled"])),
                json!(i(&st["currentNumberScheduled"])),
                json!(i(&st["numberReady"])),
                json!(i(&st["updatedNumberScheduled"])),
                json!(i(&st["numberAvailable"])),
                json!(or_none(ns.join(","))),
                age,
                json!(c),
                json!(im),
                json!(selector_string(&spec["selector"])),
            ]
        }
        ("batch", "Job") => {
            let (c, im) = template_containers(obj);
            let conds = st["conditions"].as_array().cloned().unwrap_or_default();
            let has = |t: &str| {
                conds
                    .iter()
                    .any(|c| c["type"] == t && c["status"] == "True")
            };
            let status = if has("Complete") {
                "Complete"
            } else if has("Failed") {
                "Failed"
            } else if has("FailureTarget") {
                "FailureTarget"
            } else if has("SuccessCriteriaMet") {
                "SuccessCriteriaMet"
            } else if spec["suspend"].as_bool() == Some(true) || has("Suspended") {
                "Suspended"
            } else if objects::has_deletion_timestamp(obj) {
                "Terminating"
            } else {
                "Running"
            };
            let completions = match spec["completions"].as_i64() {
                Some(n) => format!("{}/{}", i(&st["succeeded"]), n),
                None => {
                    let p = spec["parallelism"].as_i64().unwrap_or(0);
                    if p > 1 {
                        format!("{}/1 of {}", i(&st["succeeded"]), p)
                    } else {
                        format!("{}/1", i(&st["succeeded"]))
                    }
                }
            };
            let duration = match (
                st["startTime"].as_str().and_then(parse_time),
                st["completionTime"].as_str().and_then(parse_time),
            ) {
                (Some(a), Some(b)) => human_duration(b.signed_duration_since(a).num_seconds()),
                (Some(a), None) => {
                    human_duration(chrono::Utc::now().signed_duration_since(a).num_seconds())
                }
                _ => String::new(),
            };
            vec![
                name,
                json!(status),
                json!(completions),
                json!(duration),
                age,
                json!(c),
                json!(im),
                json!(selector_string(&spec["selector"])),
            ]
        }
        ("", "Event") => {
            let last = obj["lastTimestamp"]
                .as_str()
                .or_else(|| obj["eventTime"].as_str())
                .or_else(|| objects::meta_str(obj, "creationTimestamp"))
                .map(since)
                .unwrap_or_else(|| "<unknown>".into());
            let first = obj["firstTimestamp"]
                .as_str()
                .map(since)
                .unwrap_or_else(|| "<unknown>".into());
            let io = &obj["involvedObject"];
            let object = format!("{}/{}", s(&io["kind"]).to_lowercase(), s(&io["name"]));
            let source = match (s(&obj["source"]["component"]), s(&obj["source"]["host"])) {
                (c, h) if !h.is_empty() => format!("{c}, {h}"),
                (c, _) if !c.is_empty() => c,
                _ => s(&obj["reportingComponent"]),
            };
            vec![
                json!(last),
                json!(s(&obj["type"])),
                json!(s(&obj["reason"])),
                json!(object),
                json!(s(&obj["message"]).trim().to_string()),
                json!(s(&io["fieldPath"])),
                json!(source),
                json!(first),
                json!(obj["count"].as_i64().unwrap_or(1)),
                name,
            ]
        }
        ("", "ConfigMap") => {
            let n = obj["data"].as_object().map_or(0, |m| m.len())
                + obj["binaryData"].as_object().map_or(0, |m| m.len());
            vec![name, json!(n), age]
        }
        ("", "Secret") => {
            let n = obj["data"].as_object().map_or(0, |m| m.len());
            vec![name, json!(s(&obj["type"])), json!(n), age]
        }
        ("", "Endpoints") => {
            let mut eps: Vec<String> = Vec::new();
            for sub in obj["subsets"].as_array().into_iter().flatten() {
                for a in sub["addresses"].as_array().into_iter().flatten() {
                    let ports: Vec<i64> = sub["ports"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|p| i(&p["port"]))
                        .collect();
                    if ports.is_empty() {
                        eps.push(s(&a["ip"]));
                    }
                    for p in ports {
                        eps.push(format!("{}:{p}", s(&a["ip"])));
                    }
                }
            }
            let shown = if eps.len() > 3 {
                format!("{} + {} more...", eps[..3].join(","), eps.len() - 3)
            } else {
                eps.join(",")
            };
            vec![name, json!(or_none(shown)), age]
        }
        ("", "ServiceAccount") => vec![
            name,
            json!(obj["secrets"].as_array().map_or(0, |a| a.len())),
            age,
        ],
        ("coordination.k8s.io", "Lease") => vec![name, json!(s(&spec["holderIdentity"])), age],
        ("discovery.k8s.io", "EndpointSlice") => {
            let ports: Vec<String> = obj["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| i(&p["port"]).to_string())
                .collect();
            let addrs: Vec<String> = obj["endpoints"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|e| e["addresses"].as_array().cloned().unwrap_or_default())
                .map(|a| s(&a))
                .collect();
            let shown = if addrs.len() > 3 {
                format!("{} + {} more...", addrs[..3].join(","), addrs.len() - 3)
            } else {
                addrs.join(",")
            };
            vec![
                name,
                json!(s(&obj["addressType"])),
                json!(or_unset(ports.join(","))),
                json!(or_unset(shown)),
                age,
            ]
        }
        ("certificates.k8s.io", "CertificateSigningRequest") => {
            let duration = spec["expirationSeconds"]
                .as_i64()
                .map(human_duration)
                .unwrap_or_else(|| "<none>".into());
            vec![
                name,
                age,
                json!(or_none(s(&spec["signerName"]))),
                json!(s(&spec["username"])),
                json!(duration),
                json!(csr_condition(obj)),
            ]
        }
        ("rbac.authorization.k8s.io", "Role") | ("rbac.authorization.k8s.io", "ClusterRole") => {
            vec![
                name,
                json!(objects::meta_str(obj, "creationTimestamp").unwrap_or_default()),
            ]
        }
        ("rbac.authorization.k8s.io", "RoleBinding")
        | ("rbac.authorization.k8s.io", "ClusterRoleBinding") => {
            let subj = |k: &str| -> String {
                let v: Vec<String> = obj["subjects"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|x| x["kind"] == k)
                    .map(|x| {
                        if k == "ServiceAccount" {
                            format!("{}/{}", s(&x["namespace"]), s(&x["name"]))
                        } else {
                            s(&x["name"])
                        }
                    })
                    .collect();
                v.join(", ")
            };
            vec![
                name,
                json!(format!(
                    "{}/{}",
                    s(&obj["roleRef"]["kind"]),
                    s(&obj["roleRef"]["name"])
                )),
                age,
                json!(subj("User")),
                json!(subj("Group")),
                json!(subj("ServiceAccount")),
            ]
        }
        _ => vec![name, age],
    }
}

/// kubectl's CSR condition: Denied, else Approved, else Pending; then
/// `,Failed` and `,Issued` (`extractCSRStatus`).
fn csr_condition(obj: &Value) -> String {
    let conds = obj["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let has = |t: &str| conds.iter().any(|c| c["type"] == t);
    let mut out = if has("Denied") {
        "Denied".to_string()
    } else if has("Approved") {
        "Approved".to_string()
    } else {
        "Pending".to_string()
    };
    if has("Failed") {
        out += ",Failed";
    }
    if obj["status"]["certificate"]
        .as_str()
        .is_some_and(|c| !c.is_empty())
    {
        out += ",Issued";
    }
    out
}

fn or_unknown(s: String) -> String {
    if s.is_empty() {
        "<unknown>".into()
    } else {
        s
    }
}

fn or_unset(s: String) -> String {
    if s.is_empty() {
        "<unset>".into()
    } else {
        s
    }
}

/// The pod row: kubectl's `printPod`.
fn pod_cells(pod: &Value, name: Value, age: Value) -> Vec<Value> {
    let spec = &pod["spec"];
    let st = &pod["status"];
    let init_specs = spec["initContainers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let restartable = |n: &str| {
        init_specs
            .iter()
            .any(|c| c["name"] == n && c["restartPolicy"] == "Always")
    };
    let mut total = spec["containers"].as_array().map_or(0, |a| a.len());
    total += init_specs
        .iter()
        .filter(|c| c["restartPolicy"] == "Always")
        .count();
    let mut ready = 0usize;
    let mut restarts = 0i64;
    let mut last_restart: Option<chrono::DateTime<chrono::Utc>> = None;
    let mut note_restart = |c: &Value| {
        if let Some(t) = c["lastState"]["terminated"]["finishedAt"]
            .as_str()
            .and_then(parse_time)
        {
            if last_restart.is_none_or(|l| t > l) {
                last_restart = Some(t);
            }
        }
    };
    let mut reason = s(&st["phase"]);
    if let Some(r) = st["reason"].as_str().filter(|r| !r.is_empty()) {
        reason = r.to_string();
    }
    for c in st["conditions"].as_array().into_iter().flatten() {
        if c["type"] == "PodScheduled" && c["reason"] == "SchedulingGated" {
            reason = "SchedulingGated".into();
        }
    }
    let conds = st["conditions"].as_array().cloned().unwrap_or_default();
    let cond_true = |t: &str| {
        conds
            .iter()
            .any(|c| c["type"] == t && c["status"] == "True")
    };
    let mut initializing = false;
    let init_statuses = st["initContainerStatuses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut restartable_restarts = 0i64;
    for (idx, c) in init_statuses.iter().enumerate() {
        restarts += i(&c["restartCount"]);
        note_restart(c);
        let cname = s(&c["name"]);
        if restartable(&cname) {
            restartable_restarts += i(&c["restartCount"]);
            if c["started"].as_bool() == Some(true) {
                if c["ready"].as_bool() == Some(true) {
                    ready += 1;
                }
                continue;
            }
        }
        let term = &c["state"]["terminated"];
        let wait = &c["state"]["waiting"];
        if term.is_object() && i(&term["exitCode"]) == 0 {
            continue;
        }
        if term.is_object() {
            reason = match term["reason"].as_str().filter(|r| !r.is_empty()) {
                Some(r) => format!("Init:{r}"),
                None if i(&term["signal"]) != 0 => format!("Init:Signal:{}", i(&term["signal"])),
                None => format!("Init:ExitCode:{}", i(&term["exitCode"])),
            };
        } else if let Some(r) = wait["reason"]
            .as_str()
            .filter(|r| !r.is_empty() && *r != "PodInitializing")
        {
            reason = format!("Init:{r}");
        } else {
            reason = format!("Init:{}/{}", idx, init_specs.len());
        }
        initializing = true;
        break;
    }
    if !initializing || cond_true("Initialized") {
        restarts = restartable_restarts;
        let mut has_running = false;
        let statuses = st["containerStatuses"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for c in statuses.iter().rev() {
            restarts += i(&c["restartCount"]);
            note_restart(c);
            let term = &c["state"]["terminated"];
            if let Some(r) = c["state"]["waiting"]["reason"]
                .as_str()
                .filter(|r| !r.is_empty())
            {
                reason = r.to_string();
            } else if let Some(r) = term["reason"].as_str().filter(|r| !r.is_empty()) {
                reason = r.to_string();
            } else if term.is_object() {
                reason = if i(&term["signal"]) != 0 {
                    format!("Signal:{}", i(&term["signal"]))
                } else {
                    format!("ExitCode:{}", i(&term["exitCode"]))
                };
            } else if c["ready"].as_bool() == Some(true) && c["state"]["running"].is_object() {
                has_running = true;
                ready += 1;
            }
        }
        if reason == "Completed" && has_running {
            reason = if cond_true("Ready") {
                "Running".into()
            } else {
                "NotReady".into()
            };
        }
    }
    let phase = s(&st["phase"]);
    if objects::has_deletion_timestamp(pod) && st["reason"] == "NodeLost" {
        reason = "Unknown".into();
    } else if objects::has_deletion_timestamp(pod) && phase != "Succeeded" && phase != "Failed" {
        reason = "Terminating".into();
    }
    let restarts_str = match last_restart {
        Some(t) if restarts > 0 => format!(
            "{restarts} ({} ago)",
            human_duration(chrono::Utc::now().signed_duration_since(t).num_seconds())
        ),
        _ => restarts.to_string(),
    };
    let ip = st["podIPs"]
        .as_array()
        .and_then(|a| a.first())
        .map(|p| s(&p["ip"]))
        .or_else(|| st["podIP"].as_str().map(String::from))
        .unwrap_or_default();
    let gates = spec["readinessGates"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let gates_str = if gates.is_empty() {
        "<none>".to_string()
    } else {
        let ok = gates
            .iter()
            .filter(|g| {
                conds
                    .iter()
                    .any(|c| c["type"] == g["conditionType"] && c["status"] == "True")
            })
            .count();
        format!("{ok}/{}", gates.len())
    };
    vec![
        name,
        json!(format!("{ready}/{total}")),
        json!(reason),
        json!(restarts_str),
        age,
        json!(or_none(ip)),
        json!(or_none(s(&spec["nodeName"]))),
        json!(or_none(s(&st["nominatedNodeName"]))),
        json!(gates_str),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::resources::lookup;

    #[test]
    fn durations() {
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(125), "2m5s");
        assert_eq!(human_duration(3600 * 3 + 60), "3h1m");
        assert_eq!(human_duration(86400 * 3), "3d");
    }

    #[test]
    fn pod_status_column() {
        let pods = lookup("", "v1", "pods").unwrap();
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}], "initContainers": [{"name": "i"}]},
            "status": {"phase": "Pending", "initContainerStatuses": [{"name": "i", "restartCount": 0, "state": {"running": {}}}]}});
        assert_eq!(cells(pods, &pod)[2], "Init:0/1");
        let pod = json!({"metadata": {"name": "p", "deletionTimestamp": "2020-01-01T00:00:00Z"}, "spec": {"containers": [{"name": "a"}]},
            "status": {"phase": "Running", "containerStatuses": [{"name": "a", "ready": true, "restartCount": 0, "state": {"running": {}}}]}});
        let c = cells(pods, &pod);
        assert_eq!(c[1], "1/1");
        assert_eq!(c[2], "Terminating");
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}]},
            "status": {"phase": "Pending", "containerStatuses": [{"name": "a", "restartCount": 3, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}});
        assert_eq!(cells(pods, &pod)[2], "CrashLoopBackOff");
        assert_eq!(cells(pods, &pod)[3], "3");
    }
}
