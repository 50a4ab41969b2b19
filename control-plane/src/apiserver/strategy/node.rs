//! Nodes (`core/v1`): registered by their agents with their status, and
//! printed as `kubectl get nodes` shows them.

use serde_json::{json, Value};

use super::{Strategy, Subresource};
use crate::apiserver::objects;
use crate::apiserver::table::{age_cell, name_cell, or_none, or_unknown, s, Col, AGE, NAME};
use crate::apiserver::Req;

pub struct Node;

static SUBRESOURCES: &[Subresource] = &[super::proxy("NodeProxyOptions")];

impl Strategy for Node {
    fn subresources(&self) -> &'static [Subresource] {
        SUBRESOURCES
    }

    /// The agent registers its node with capacity and conditions: the
    /// status it creates the Node with is kept.
    fn prepare_for_create(&self, _r: &Req, _obj: &mut Value) {}

    fn selectable_fields(&self) -> &'static [&'static str] {
        &["spec.unschedulable"]
    }

    fn columns(&self) -> Vec<Col> {
        vec![
            NAME,
            ("Status", "string", 0, "The status of the node"),
            ("Roles", "string", 0, "The roles of the node"),
            AGE,
            (
                "Version",
                "string",
                0,
                "Kubelet Version reported by the node.",
            ),
            (
                "Internal-IP",
                "string",
                1,
                "List of addresses reachable to the node.",
            ),
            (
                "External-IP",
                "string",
                1,
                "List of addresses reachable to the node.",
            ),
            (
                "OS-Image",
                "string",
                1,
                "OS Image reported by the node from /etc/os-release.",
            ),
            (
                "Kernel-Version",
                "string",
                1,
                "Kernel Version reported by the node.",
            ),
            (
                "Container-Runtime",
                "string",
                1,
                "Container Runtime Version reported by the node.",
            ),
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let st = &obj["status"];
        let conds = st["conditions"].as_array().cloned().unwrap_or_default();
        let ready = conds.iter().find(|c| c["type"] == "Ready");
        let mut status = match ready.map(|c| s(&c["status"])) {
            Some(x) if x == "True" => "Ready".to_string(),
            Some(x) if x == "False" => "NotReady".to_string(),
            _ => "Unknown".to_string(),
        };
        if obj["spec"]["unschedulable"].as_bool() == Some(true) {
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
            name_cell(obj),
            json!(status),
            json!(or_none(roles.join(","))),
            age_cell(obj),
            json!(s(&info["kubeletVersion"])),
            json!(addr("InternalIP")),
            json!(addr("ExternalIP")),
            json!(or_unknown(s(&info["osImage"]))),
            json!(or_unknown(s(&info["kernelVersion"]))),
            json!(or_unknown(s(&info["containerRuntimeVersion"]))),
        ]
    }
}
