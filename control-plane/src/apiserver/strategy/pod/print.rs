//! The `kubectl get pods` row: upstream's `printPod`.

use serde_json::{json, Value};

use crate::apiserver::objects::{self, parse_time};
use crate::apiserver::table::{age_cell, human_duration, i, name_cell, or_none, s, Col, AGE, NAME};

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

/// The pod row: kubectl's `printPod`.
pub(super) fn cells(pod: &Value) -> Vec<Value> {
    let name = name_cell(pod);
    let age = age_cell(pod);
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
    let mut last_restart: Option<jiff::Timestamp> = None;
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
            human_duration(objects::seconds_since(t))
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

    #[test]
    fn pod_status_column() {
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}], "initContainers": [{"name": "i"}]},
            "status": {"phase": "Pending", "initContainerStatuses": [{"name": "i", "restartCount": 0, "state": {"running": {}}}]}});
        assert_eq!(cells(&pod)[2], "Init:0/1");
        let pod = json!({"metadata": {"name": "p", "deletionTimestamp": "2020-01-01T00:00:00Z"}, "spec": {"containers": [{"name": "a"}]},
            "status": {"phase": "Running", "containerStatuses": [{"name": "a", "ready": true, "restartCount": 0, "state": {"running": {}}}]}});
        let c = cells(&pod);
        assert_eq!(c[1], "1/1");
        assert_eq!(c[2], "Terminating");
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}]},
            "status": {"phase": "Pending", "containerStatuses": [{"name": "a", "restartCount": 3, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}});
        assert_eq!(cells(&pod)[2], "CrashLoopBackOff");
        assert_eq!(cells(&pod)[3], "3");
    }
}
