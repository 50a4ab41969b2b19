//! `pods/binding`: the scheduler's placement.

use std::sync::Arc;

use axum::body::Body;
use bytes::Bytes;
use http::{Method, Response};
use serde_json::{json, Value};

use crate::apiserver::handlers::get_object;
use crate::apiserver::objects::{self, meta_mut};
use crate::apiserver::status::{ApiError, ApiResult, Cause};
use crate::apiserver::subresources::success;
use crate::apiserver::{decode_body, json_response, ApiServer, Req};

/// `pods/binding`: the scheduler's write of spec.nodeName.
pub(super) async fn binding(
    api: &Arc<ApiServer>,
    _: &Method,
    r: &Req,
    body: Bytes,
) -> ApiResult<Response<Body>> {
    let b = decode_body(&body, r.content_type())?;
    let target = b["target"]["name"]
        .as_str()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            ApiError::invalid(
                "Binding",
                "",
                r.name(),
                vec![Cause::required("target.name")],
            )
        })?;
    for _ in 0..8 {
        let (cur, old) = get_object(api, r).await?;
        if objects::has_deletion_timestamp(&old) {
            return Err(ApiError::conflict(
                "",
                "pods",
                r.name(),
                "pod is being deleted, cannot be assigned to a host",
            ));
        }
        if let Some(n) = old["spec"]["nodeName"].as_str().filter(|s| !s.is_empty()) {
            return Err(ApiError::conflict(
                "",
                "pods",
                r.name(),
                &format!("pod {} is already assigned to node {n:?}", r.name()),
            ));
        }
        if let Some(uid) = b["metadata"]["uid"].as_str().filter(|s| !s.is_empty()) {
            if objects::meta_str(&old, "uid") != Some(uid) {
                return Err(ApiError::conflict(
                    "",
                    "pods",
                    r.name(),
                    "the pod's UID does not match the binding's",
                ));
            }
        }
        let mut new = old.clone();
        new["spec"]["nodeName"] = json!(target);
        if let Some(ann) = b["metadata"]["annotations"].as_object() {
            let m = meta_mut(&mut new);
            let a = m.entry("annotations").or_insert_with(|| json!({}));
            for (k, v) in ann {
                a[k] = v.clone();
            }
        }
        let conds = new["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let mut conds: Vec<Value> = conds
            .into_iter()
            .filter(|c| c["type"] != "PodScheduled")
            .collect();
        conds.push(json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": objects::now_rfc3339()}));
        new["status"]["conditions"] = json!(conds);
        match api
            .store
            .update(&cur.key, objects::encode_for_store(&new), cur.mod_revision)
            .await
        {
            Ok(_) => return Ok(json_response(201, &success("pods", r.name(), 201))),
            Err(crate::store::Error::Conflict { .. }) => continue,
            Err(e) => return Err(ApiError::from_store(e, "", "pods", r.name())),
        }
    }
    Err(ApiError::stale("", "pods", r.name()))
}
