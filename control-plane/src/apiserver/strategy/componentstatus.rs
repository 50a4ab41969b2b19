//! ComponentStatuses (`core/v1`, deprecated upstream since 1.19 and still
//! served): computed on each request from the health of the scheduler and
//! the controller manager that run beside the server, and of its store
//! (`etcd-0`, as upstream names the storage backend whatever it is).

use std::sync::Arc;

use axum::body::Body;
use bytes::Bytes;
use http::{Method, Response};
use serde_json::{json, Value};

use super::Strategy;
use crate::apiserver::status::{ApiError, ApiResult};
use crate::apiserver::table::{self, name_cell, s, Col, NAME};
use crate::apiserver::{json_response, with_warnings, ApiServer, Req};

pub struct ComponentStatus;

/// Upstream's deprecation warning, which kubectl prints.
const DEPRECATED: &str = "v1 ComponentStatus is deprecated in v1.19+";

impl Strategy for ComponentStatus {
    fn columns(&self) -> Vec<Col> {
        vec![
            NAME,
            ("Status", "string", 0, "Status of the component conditions"),
            (
                "Message",
                "string",
                0,
                "Message of the component conditions",
            ),
            ("Error", "string", 0, "Error of the component conditions"),
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let c = &obj["conditions"][0];
        let status = if c["status"] == "True" {
            "Healthy"
        } else {
            "Unhealthy"
        };
        vec![
            name_cell(obj),
            json!(status),
            json!(s(&c["message"])),
            json!(s(&c["error"])),
        ]
    }
}

fn component(name: &str, health: &Result<(), String>) -> Value {
    let condition = match health {
        Ok(()) => json!({"type": "Healthy", "status": "True", "message": "ok"}),
        Err(e) => json!({"type": "Healthy", "status": "False", "error": e}),
    };
    json!({"kind": "ComponentStatus", "apiVersion": "v1",
           "metadata": {"name": name, "creationTimestamp": null},
           "conditions": [condition]})
}

/// `GET componentstatuses[/NAME]`.
pub(crate) async fn serve(
    api: &Arc<ApiServer>,
    _: &Method,
    r: &Req,
    _: Bytes,
) -> ApiResult<Response<Body>> {
    let store = tokio::time::timeout(std::time::Duration::from_secs(5), api.store.health()).await;
    let store = match store {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("timed out".into()),
    };
    let mut all: Vec<Value> = api
        .components
        .all()
        .iter()
        .map(|(name, h)| component(name, h))
        .collect();
    all.push(component("etcd-0", &store));
    let warn = [DEPRECATED.to_string()];
    if let Some(name) = r.name.as_deref() {
        let one = all
            .into_iter()
            .find(|c| c["metadata"]["name"] == name)
            .ok_or_else(|| ApiError::not_found("", "componentstatuses", name))?;
        return Ok(with_warnings(json_response(200, &one), &warn));
    }
    let body = if table::wants_table(r.accept()) {
        table::table(r.def, &all, json!({}), "Metadata", true)
    } else {
        json!({"kind": "ComponentStatusList", "apiVersion": "v1", "metadata": {}, "items": all})
    };
    Ok(with_warnings(json_response(200, &body), &warn))
}
