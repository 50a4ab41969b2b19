//! Subresources: the generic `status` and `scale`, and dispatch to the
//! ones a kind serves itself (its strategy's `subresources`: pods/binding,
//! pods/eviction, namespaces/finalize, the CSRs' status and approval). The
//! node-served ones (pods/log, exec, attach, portforward) are proxied to
//! the pod's node before the request gets here (see
//! [`super::nodeproxy`]).

use std::sync::Arc;

use axum::body::Body;
use bytes::Bytes;
use http::{Method, Response};
use serde_json::{json, Value};

use super::crd::custom;
use super::handlers::{self, get_object, prepare_update, write_update, Attempt};
use super::patch::{self, PatchType};
use super::resources::ResourceDef;
use super::status::{ApiError, ApiResult};
use super::strategy::Serve;
use super::{decode_body, json_response, with_warnings, ApiServer, Req};

pub(crate) async fn dispatch(
    api: &Arc<ApiServer>,
    method: &Method,
    r: Req,
    sub: &str,
    body: Bytes,
) -> ApiResult<Response<Body>> {
    let def = r.def;
    let known = def.subresources().iter().any(|s| s.name == sub);
    if !known || r.name.is_none() {
        return Err(ApiError::not_found_path(&r.attrs.path));
    }
    if let Some(own) = def.own_subresource(sub) {
        return match own.serve {
            Serve::Handler(serve) => serve(api, method, &r, body).await,
            // Unreachable through `route`, which proxies these first.
            Serve::Node => Err(ApiError::unavailable(format!(
                "{}/{sub} of {:?} is served by its node",
                def.plural,
                r.name()
            ))),
        };
    }
    match (sub, method.clone()) {
        ("status", Method::GET) => handlers::get(api, &r).await,
        ("status", Method::PUT) => handlers::update(api, &r, body).await,
        ("status", Method::PATCH) => handlers::patch(api, &r, body).await,
        ("scale", m) => scale(api, &r, &m, body).await,
        (_, m) => Err(ApiError::method_not_allowed(format!(
            "{m} is not supported on {}/{sub}",
            def.plural
        ))),
    }
}

/// The `Scale` of `obj`, read where its kind keeps replicas.
fn scale_of(def: &ResourceDef, obj: &Value) -> Value {
    let (spec, status, sel) = match def.strategy.scale_paths() {
        Some(paths) => custom::scale_view(&paths, obj),
        None => (
            obj["spec"]["replicas"].as_i64().unwrap_or(0),
            obj["status"]["replicas"].as_i64().unwrap_or(0),
            builtin_selector(obj),
        ),
    };
    let meta = &obj["metadata"];
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"],
            "resourceVersion": meta["resourceVersion"], "creationTimestamp": meta["creationTimestamp"],
        },
        "spec": {"replicas": spec},
        "status": {"replicas": status, "selector": sel},
    })
}

fn builtin_selector(obj: &Value) -> String {
    let selector = &obj["spec"]["selector"];
    // ReplicationControllers select by a plain label map.
    let equality =
        selector.get("matchLabels").is_none() && selector.get("matchExpressions").is_none();
    let labels = if equality {
        selector
    } else {
        &selector["matchLabels"]
    };
    labels
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default()
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
        let current = scale_of(r.def, &old);
        let mut wanted = match *method {
            Method::GET => return Ok(json_response(200, &current)),
            Method::PUT => decode_body(&body, r.content_type())?,
            Method::PATCH => {
                let pt = PatchType::from_content_type(r.content_type())
                    .ok_or_else(|| ApiError::unsupported_media(r.content_type()))?;
                // Upstream maps the parent's managedFields onto the Scale
                // for an apply; until this server does, it refuses one
                // rather than apply it without ownership.
                if pt == PatchType::Apply {
                    return Err(ApiError::new(
                        415,
                        "UnsupportedMediaType",
                        "server-side apply is not supported on the scale subresource; use a merge patch (kubectl scale) or apply the parent's spec.replicas",
                    ));
                }
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
            .filter(|s| !s.is_empty())
            .map(String::from);
        if precondition
            .as_ref()
            .is_some_and(|rv| *rv != cur.mod_revision.to_string())
        {
            return Err(ApiError::stale(r.def.group, r.def.plural, r.name()));
        }
        let mut warnings =
            crate::apiserver::webhook::mutate(api, r, Some(&current), &mut wanted).await?;
        warnings.extend(
            crate::apiserver::policy::validate(api, r, Some(&current), Some(&wanted)).await?,
        );
        warnings.extend(
            crate::apiserver::webhook::validate(api, r, Some(&current), Some(&wanted)).await?,
        );
        let replicas = wanted["spec"]["replicas"]
            .as_i64()
            .ok_or_else(|| ApiError::bad_request("scale: spec.replicas must be an integer"))?;
        let mut new = old.clone();
        match r.def.strategy.scale_paths() {
            Some(paths) => custom::set_replicas(&paths, &mut new, replicas),
            None => new["spec"]["replicas"] = json!(replicas),
        }
        let new = prepare_update(r.def, None, &old, new);
        let main = Req {
            sub: None,
            ..r.clone()
        };
        if let Attempt::Done(v) =
            write_update(api, &main, &cur, &old, new, precondition.is_some()).await?
        {
            return Ok(with_warnings(
                json_response(200, &scale_of(r.def, &v)),
                &warnings,
            ));
        }
    }
    Err(ApiError::stale(r.def.group, r.def.plural, r.name()))
}

/// The Status a subresource's create answers with.
pub(crate) fn success(kind: &str, name: &str, code: u16) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": code,
           "details": {"name": name, "kind": kind}})
}
