//! Subresources: status, scale, pods/binding, pods/eviction,
//! namespaces/finalize (and the CSRs' status and approval, in
//! [`super::csr`]). The streaming ones (pods/log, exec, attach,
//! portforward) are proxied to the pod's node before the request gets
//! here (see [`super::nodeproxy`]).

use std::sync::Arc;

use axum::body::Body;
use bytes::Bytes;
use http::{Method, Response};
use serde_json::{json, Value};

use super::handlers::{
    self, delete_one, get_object, prepare_update, write_update, Attempt, DeleteOptions,
};
use super::objects::{self, meta_mut};
use super::patch::{self, PatchType};
use super::status::{ApiError, ApiResult};
use super::{decode_body, json_response, ApiServer, Req};

pub(crate) async fn dispatch(
    api: &Arc<ApiServer>,
    method: &Method,
    r: Req,
    sub: &str,
    body: Bytes,
) -> ApiResult<Response<Body>> {
    let def = r.def;
    let known = def.subresources().into_iter().any(|(s, _, _)| s == sub);
    if !known || r.name.is_none() {
        return Err(ApiError::not_found_path(&r.attrs.path));
    }
    match (sub, method.clone()) {
        ("status" | "approval", _)
            if def.is("certificates.k8s.io", "certificatesigningrequests") =>
        {
            super::csr::subresource(api, method, &r, sub, body).await
        }
        ("status", Method::GET) => handlers::get(api, &r).await,
        ("status", Method::PUT) => handlers::update(api, &r, body).await,
        ("status", Method::PATCH) => handlers::patch(api, &r, body).await,
        ("scale", m) => scale(api, &r, &m, body).await,
        ("binding", Method::POST) => binding(api, &r, body).await,
        ("eviction", Method::POST) => eviction(api, &r, body).await,
        ("finalize", Method::PUT) => finalize(api, &r, body).await,
        ("log" | "exec" | "attach" | "portforward", _) => {
            let (_, pod) = get_object(api, &r).await?;
            let node = pod["spec"]["nodeName"].as_str().unwrap_or_default();
            if node.is_empty() {
                return Err(ApiError::bad_request(format!(
                    "pod {} is not yet scheduled to a node",
                    r.name()
                )));
            }
            // Unreachable through `route`, which proxies these first.
            Err(ApiError::unavailable(format!(
                "pods/{sub} for pod {:?} on node {node:?} is served by the node proxy",
                r.name()
            )))
        }
        (_, m) => Err(ApiError::method_not_allowed(format!(
            "{m} is not supported on {}/{sub}",
            def.plural
        ))),
    }
}

fn scale_of(obj: &Value) -> Value {
    let sel = obj["spec"]["selector"]["matchLabels"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    let meta = &obj["metadata"];
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"],
            "resourceVersion": meta["resourceVersion"], "creationTimestamp": meta["creationTimestamp"],
        },
        "spec": {"replicas": obj["spec"]["replicas"].as_i64().unwrap_or(0)},
        "status": {"replicas": obj["status"]["replicas"].as_i64().unwrap_or(0), "selector": sel},
    })
}

/// `/scale`: a `Scale` view of spec.replicas; writes go to the parent.
async fn scale(
    api: &Arc<ApiServer>,
    r: &Req,
    method: &Method,
    body: Bytes,
) -> ApiResult<Response<Body>> {
    for _ in 0..8 {
        let (cur, old) = get_object(api, r).await?;
        let current = scale_of(&old);
        let wanted = match *method {
            Method::GET => return Ok(json_response(200, &current)),
            Method::PUT => decode_body(&body, r.content_type())?,
            Method::PATCH => {
                let pt = PatchType::from_content_type(r.content_type())
                    .ok_or_else(|| ApiError::unsupported_media(r.content_type()))?;
                patch::apply(&current, &body, pt, "Scale")
                    .map_err(|e| ApiError::bad_request(e.to_string()))?
            }
            ref m => {
                return Err(ApiError::method_not_allowed(format!(
                    "{m} is not supported on scale"
                )))
            }
        };
        let precondition = wanted["metadata"]["resourceVersion"]
            .as_str()
            .filter(|s| !s.is_empty());
        if precondition.is_some_and(|rv| rv != cur.mod_revision.to_string()) {
            return Err(ApiError::stale(r.def.group, r.def.plural, r.name()));
        }
        let replicas = wanted["spec"]["replicas"]
            .as_i64()
            .ok_or_else(|| ApiError::bad_request("scale: spec.replicas must be an integer"))?;
        let mut new = old.clone();
        new["spec"]["replicas"] = json!(replicas);
        let new = prepare_update(r.def, None, &old, new);
        let main = Req {
            sub: None,
            ..clone_req(r)
        };
        if let Attempt::Done(v) =
            write_update(api, &main, &cur, &old, new, precondition.is_some()).await?
        {
            return Ok(json_response(200, &scale_of(&v)));
        }
    }
    Err(ApiError::stale(r.def.group, r.def.plural, r.name()))
}

fn clone_req(r: &Req) -> Req {
    Req {
        def: r.def,
        ns: r.ns.clone(),
        name: r.name.clone(),
        sub: r.sub.clone(),
        query: r.query.clone(),
        headers: r.headers.clone(),
        identity: r.identity.clone(),
        attrs: r.attrs.clone(),
    }
}

fn success(kind: &str, name: &str, code: u16) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": code,
           "details": {"name": name, "kind": kind}})
}

/// `pods/binding`: the scheduler's write of spec.nodeName.
async fn binding(api: &Arc<ApiServer>, r: &Req, body: Bytes) -> ApiResult<Response<Body>> {
    let b = decode_body(&body, r.content_type())?;
    let target = b["target"]["name"]
        .as_str()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            ApiError::invalid(
                "Binding",
                "",
                r.name(),
                vec![super::status::Cause::required("target.name")],
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
            .update(
                &cur.key,
                super::objects::encode_for_store(&new),
                cur.mod_revision,
            )
            .await
        {
            Ok(_) => return Ok(json_response(201, &success("pods", r.name(), 201))),
            Err(crate::store::Error::Conflict { .. }) => continue,
            Err(e) => return Err(ApiError::from_store(e, "", "pods", r.name())),
        }
    }
    Err(ApiError::stale("", "pods", r.name()))
}

/// `pods/eviction`: a graceful delete (no PodDisruptionBudgets are served,
/// so nothing can refuse it).
async fn eviction(api: &Arc<ApiServer>, r: &Req, body: Bytes) -> ApiResult<Response<Body>> {
    let mut opts = DeleteOptions::default();
    if !body.is_empty() {
        let e = decode_body(&body, r.content_type())?;
        let d = &e["deleteOptions"];
        opts.grace = d["gracePeriodSeconds"].as_i64();
        opts.uid = d["preconditions"]["uid"].as_str().map(String::from);
        opts.resource_version = d["preconditions"]["resourceVersion"]
            .as_str()
            .map(String::from);
    }
    let main = Req {
        sub: None,
        ..clone_req(r)
    };
    delete_one(api, &main, &opts).await?;
    Ok(json_response(201, &success("pods", r.name(), 201)))
}

/// `namespaces/finalize`: the namespace controller clears spec.finalizers
/// once the namespace is empty; then the namespace goes.
async fn finalize(api: &Arc<ApiServer>, r: &Req, body: Bytes) -> ApiResult<Response<Body>> {
    let b = decode_body(&body, r.content_type())?;
    for _ in 0..8 {
        let (cur, old) = get_object(api, r).await?;
        let mut new = old.clone();
        new["spec"]["finalizers"] = b["spec"]["finalizers"].clone();
        if new["spec"]["finalizers"].is_null() {
            new["spec"]["finalizers"] = json!([]);
        }
        let main = Req {
            sub: Some("finalize".into()),
            ..clone_req(r)
        };
        if let Attempt::Done(v) = write_update(api, &main, &cur, &old, new, false).await? {
            return Ok(json_response(200, &v));
        }
    }
    Err(ApiError::stale("", "namespaces", r.name()))
}
