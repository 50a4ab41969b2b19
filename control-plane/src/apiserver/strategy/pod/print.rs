//! The `kubectl get pods` row: upstream's `printPod`.

use serde_json::{json, Value};

use k8s_openapi::api::core::v1::Pod;
use kube_util::podstatus;

use crate::apiserver::objects;
use crate::apiserver::table::{age_cell, human_duration, name_cell, or_none, s, Col, AGE, NAME};

pub(super) const COLUMNS: [Col; 9] = [
    NAME,
    ("Ready", "string", 0, "The aggregate readiness state of this pod for accepting traffic."),
    ("Status", "string", 0, "The aggregate status of the containers in this pod."),
    ("Restarts", "string", 0, "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted."),
    AGE,
    ("IP", "string", 1, "IP address allocated to the pod."),
    ("Node", "string", 1, "Name of the Node this pod is assigned to."),
    ("Nominated Node", "string", 1, "Name of the node where the pod is nominated to run."),
    ("Readiness Gates", "string", 1, "If specified, all readiness gates will be evaluated for pod readiness."),
];

/// The pod row: kubectl's `printPod`, READY, STATUS and RESTARTS from
/// kube-util (the agent prints the same words).
pub(super) fn cells(pod: &Value) -> Vec<Value> {
    let name = name_cell(pod);
    let age = age_cell(pod);
    let spec = &pod["spec"];
    let st = &pod["status"];
    // A stored pod always reads as one; an unreadable one shows its phase.
    let summary = serde_json::from_value::<Pod>(pod.clone())
        .map(|p| podstatus::summary(&p))
        .unwrap_or_else(|_| podstatus::Summary {
            status: s(&st["phase"]),
            ready: 0,
            total: 0,
            restarts: 0,
            last_restart: None,
        });
    let restarts_str = match summary.last_restart {
        Some(t) if summary.restarts > 0 => format!(
            "{} ({} ago)",
            summary.restarts,
            human_duration(objects::seconds_since(t))
        ),
        _ => summary.restarts.to_string(),
    };
    let conds = st["conditions"].as_array().cloned().unwrap_or_default();
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
        json!(format!("{}/{}", summary.ready, summary.total)),
        json!(summary.status),
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

    #[test]
    fn pod_status_column() {
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}], "initContainers": [{"name": "i"}]},
            "status": {"phase": "Pending", "initContainerStatuses": [{"name": "i", "ready": false, "image": "i", "imageID": "", "restartCount": 0, "state": {"running": {}}}]}});
        assert_eq!(cells(&pod)[2], "Init:0/1");
        let pod = json!({"metadata": {"name": "p", "deletionTimestamp": "2020-01-01T00:00:00Z"}, "spec": {"containers": [{"name": "a"}]},
            "status": {"phase": "Running", "containerStatuses": [{"name": "a", "ready": true, "image": "i", "imageID": "", "restartCount": 0, "state": {"running": {}}}]}});
        let c = cells(&pod);
        assert_eq!(c[1], "1/1");
        assert_eq!(c[2], "Terminating");
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}]},
            "status": {"phase": "Pending", "containerStatuses": [{"name": "a", "ready": false, "image": "i", "imageID": "", "restartCount": 3, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}});
        assert_eq!(cells(&pod)[2], "CrashLoopBackOff");
        assert_eq!(cells(&pod)[3], "3");
    }
}
