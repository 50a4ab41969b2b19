//! ServiceAccounts: how `kubectl get sa` prints them, and their `token`
//! subresource (TokenRequest, upstream's `serviceaccount/storage/token.go`):
//! a JWT for the account, for the audiences asked, bound to a pod, secret
//! or node when asked, that stops authenticating once that object is gone.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{Method, Response};
use serde_json::{json, Value};

use super::{handler, Serve, Strategy, Subresource};
use crate::apiserver::handlers::{get_object, is_dry_run};
use crate::apiserver::status::{ApiError, ApiResult, Cause};
use crate::apiserver::table::{age_cell, name_cell, Col, AGE, NAME};
use crate::apiserver::{decode_body, json_response, objects, ApiServer, Req};
use crate::auth::{node, satoken};

pub struct ServiceAccount;

static SUBRESOURCES: &[Subresource] = &[Subresource {
    name: "token",
    kind: "TokenRequest",
    group_version: Some(("authentication.k8s.io", "v1")),
    verbs: &["create"],
    serve: Serve::Handler(handler!(token)),
}];

/// Upstream's default and bounds of `spec.expirationSeconds`.
const DEFAULT_EXPIRATION: i64 = 3600;
const MIN_EXPIRATION: i64 = 600;
const MAX_EXPIRATION: i64 = 1 << 32;

impl Strategy for ServiceAccount {
    fn subresources(&self) -> &'static [Subresource] {
        SUBRESOURCES
    }

    fn columns(&self) -> Vec<Col> {
        vec![
            NAME,
            (
                "Secrets",
                "string",
                0,
                "Number of secrets in the service account",
            ),
            AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        vec![
            name_cell(obj),
            json!(obj["secrets"].as_array().map_or(0, |a| a.len())),
            age_cell(obj),
        ]
    }
}

/// `POST serviceaccounts/NAME/token`.
async fn token(
    api: &Arc<ApiServer>,
    method: &Method,
    r: &Req,
    body: Bytes,
) -> ApiResult<Response<Body>> {
    if method != Method::POST {
        return Err(ApiError::method_not_allowed(format!(
            "{method} is not supported on serviceaccounts/token"
        )));
    }
    let tokens = api
        .sa_tokens
        .get()
        .ok_or_else(|| ApiError::unavailable("service account tokens are not configured"))?;
    let mut req = decode_body(&body, r.content_type())?;
    check_kind(&req)?;
    let (_, sa) = get_object(api, r).await?;
    let ns = r.ns.clone().unwrap_or_default();
    let spec = spec_of(&req, r.name(), tokens.api_audiences())?;
    let expiration = tokens.capped(Duration::from_secs(spec.expiration.unsigned_abs()));

    let bound = match &spec.bound {
        Some(b) => Some(bound_object(api, &ns, b).await?),
        None => None,
    };
    // NodeRestriction: a node's tokens are bound to its own pods.
    if let Some(node_name) = r.node() {
        let pod = bound
            .as_ref()
            .filter(|b| b.kind == "Pod")
            .map(|b| &b.object);
        node::admit_token_request(node_name, pod, &req).map_err(ApiError::forbidden)?;
    }
    let node = match bound.as_ref().filter(|b| b.kind == "Pod") {
        Some(b) => pod_node(api, &b.object).await?,
        None => None,
    };

    let now = jiff::Timestamp::now().as_second();
    let mut status = json!({});
    if !is_dry_run(r) {
        let signed = tokens
            .sign(
                &satoken::Request {
                    namespace: ns.clone(),
                    service_account: r.name().to_string(),
                    service_account_uid: objects::meta_str(&sa, "uid")
                        .unwrap_or_default()
                        .to_string(),
                    audiences: spec.audiences.clone(),
                    expiration,
                    bound: bound
                        .as_ref()
                        .map(|b| (b.kind.clone(), b.name.clone(), b.uid.clone())),
                    node,
                },
                now,
            )
            .map_err(|e| ApiError::internal(e.to_string()))?;
        let exp = jiff::Timestamp::from_second(signed.1)
            .map_err(|e| ApiError::internal(e.to_string()))?;
        status = json!({"token": signed.0, "expirationTimestamp": format!("{exp:.0}")});
    }
    req["apiVersion"] = json!("authentication.k8s.io/v1");
    req["kind"] = json!("TokenRequest");
    req["metadata"] = json!({
        "name": r.name(),
        "namespace": ns,
        "creationTimestamp": objects::now_rfc3339(),
    });
    req["spec"]["audiences"] = json!(spec.audiences);
    req["spec"]["expirationSeconds"] = json!(expiration.as_secs());
    if let Some(b) = &bound {
        req["spec"]["boundObjectRef"]["uid"] = json!(b.uid);
    }
    req["status"] = status;
    Ok(json_response(201, &req))
}

/// A TokenRequest body, if it names its kind, names TokenRequest.
fn check_kind(req: &Value) -> ApiResult<()> {
    let av = req["apiVersion"].as_str().unwrap_or_default();
    let kind = req["kind"].as_str().unwrap_or_default();
    if (!av.is_empty() && av != "authentication.k8s.io/v1")
        || (!kind.is_empty() && kind != "TokenRequest")
    {
        return Err(ApiError::bad_request(format!(
            "the body of the request was of kind {kind:?} in {av:?}: expected a TokenRequest in authentication.k8s.io/v1"
        )));
    }
    Ok(())
}

/// What a TokenRequest asks for, after defaults.
#[derive(Debug, PartialEq)]
struct Spec {
    audiences: Vec<String>,
    expiration: i64,
    bound: Option<BoundRef>,
}

#[derive(Debug, PartialEq)]
struct BoundRef {
    kind: String,
    name: String,
    uid: Option<String>,
}

/// Read and validate the spec (upstream's `ValidateTokenRequest` and the
/// storage's object kinds).
fn spec_of(req: &Value, name: &str, api_audiences: &[String]) -> ApiResult<Spec> {
    let spec = &req["spec"];
    let mut causes = Vec::new();
    if !spec.is_object() && !spec.is_null() {
        causes.push(Cause::invalid("spec", "", "must be an object"));
    }
    let audiences = match &spec["audiences"] {
        Value::Null => api_audiences.to_vec(),
        Value::Array(a) if a.iter().all(Value::is_string) => {
            let list: Vec<String> = a
                .iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect();
            if list.is_empty() {
                api_audiences.to_vec()
            } else {
                list
            }
        }
        other => {
            causes.push(Cause::invalid(
                "spec.audiences",
                &other.to_string(),
                "must be a list of strings",
            ));
            Vec::new()
        }
    };
    let expiration = match &spec["expirationSeconds"] {
        Value::Null => DEFAULT_EXPIRATION,
        v => match v.as_i64() {
            Some(n) if n < MIN_EXPIRATION => {
                causes.push(Cause::invalid(
                    "spec.expirationSeconds",
                    &n.to_string(),
                    "may not specify a duration less than 10 minutes",
                ));
                n
            }
            Some(n) if n > MAX_EXPIRATION => {
                causes.push(Cause::invalid(
                    "spec.expirationSeconds",
                    &n.to_string(),
                    "may not specify a duration larger than 2^32 seconds",
                ));
                n
            }
            Some(n) => n,
            None => {
                causes.push(Cause::invalid(
                    "spec.expirationSeconds",
                    &v.to_string(),
                    "must be an integer",
                ));
                0
            }
        },
    };
    let bound = match &spec["boundObjectRef"] {
        Value::Null => None,
        b => {
            let s = |k: &str| b[k].as_str().unwrap_or_default().to_string();
            let kind = s("kind");
            let api_version = s("apiVersion");
            if !["Pod", "Secret", "Node"].contains(&kind.as_str()) || api_version != "v1" {
                return Err(ApiError::bad_request(format!(
                    "cannot bind token to object of type {}, Kind={kind}",
                    if api_version.is_empty() {
                        "/"
                    } else {
                        &api_version
                    }
                )));
            }
            if s("name").is_empty() {
                causes.push(Cause::required("spec.boundObjectRef.name"));
            }
            Some(BoundRef {
                kind,
                name: s("name"),
                uid: Some(s("uid")).filter(|u| !u.is_empty()),
            })
        }
    };
    if !causes.is_empty() {
        return Err(ApiError::invalid(
            "TokenRequest",
            "authentication.k8s.io",
            name,
            causes,
        ));
    }
    Ok(Spec {
        audiences,
        expiration,
        bound,
    })
}

/// The object a token is bound to, as stored.
struct Bound {
    kind: String,
    name: String,
    uid: String,
    object: Value,
}

async fn bound_object(api: &ApiServer, ns: &str, b: &BoundRef) -> ApiResult<Bound> {
    let (key, plural) = match b.kind.as_str() {
        "Pod" => (format!("/registry/core/pods/{ns}/{}", b.name), "pods"),
        "Secret" => (format!("/registry/core/secrets/{ns}/{}", b.name), "secrets"),
        _ => (format!("/registry/core/nodes/{}", b.name), "nodes"),
    };
    let object: Value = api
        .store
        .get(&key)
        .await
        .map_err(ApiError::from)?
        .and_then(|kv| serde_json::from_slice(&kv.value).ok())
        .ok_or_else(|| ApiError::not_found("", plural, &b.name))?;
    let uid = objects::meta_str(&object, "uid")
        .unwrap_or_default()
        .to_string();
    if let Some(want) = &b.uid {
        if *want != uid {
            return Err(ApiError::conflict(
                "",
                &b.kind,
                &b.name,
                &format!("the UID in the bound object reference ({want}) does not match the UID in record. The object might have been deleted and then recreated"),
            ));
        }
    }
    Ok(Bound {
        kind: b.kind.clone(),
        name: b.name.clone(),
        uid,
        object,
    })
}

/// The node a bound pod runs on (name, uid), which upstream adds to the
/// token so that it dies with the node too.
async fn pod_node(api: &ApiServer, pod: &Value) -> ApiResult<Option<(String, String)>> {
    let Some(node) = pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) else {
        return Ok(None);
    };
    let kv = api
        .store
        .get(&format!("/registry/core/nodes/{node}"))
        .await
        .map_err(ApiError::from)?;
    Ok(kv
        .and_then(|kv| serde_json::from_slice::<Value>(&kv.value).ok())
        .map(|n| {
            let uid = objects::meta_str(&n, "uid").unwrap_or_default().to_string();
            (node.to_string(), uid)
        }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_aud() -> Vec<String> {
        vec!["https://kubernetes.default.svc.cluster.local".into()]
    }

    #[test]
    fn defaults() {
        let s = spec_of(&json!({}), "sa", &api_aud()).unwrap();
        assert_eq!(s.audiences, api_aud());
        assert_eq!(s.expiration, 3600);
        assert_eq!(s.bound, None);
    }

    #[test]
    fn expiration_bounds_and_bad_values() {
        for (v, want) in [
            (json!(599), "less than 10 minutes"),
            (json!(1_i64 << 40), "larger than 2^32"),
            (json!("an hour"), "integer"),
            (json!(-5), "less than 10 minutes"),
        ] {
            let e =
                spec_of(&json!({"spec": {"expirationSeconds": v}}), "sa", &api_aud()).unwrap_err();
            assert_eq!(e.code, 422);
            assert!(e.message.contains(want), "{}", e.message);
        }
        let e = spec_of(&json!({"spec": {"audiences": "api"}}), "sa", &api_aud()).unwrap_err();
        assert!(e.message.contains("spec.audiences"), "{}", e.message);
    }

    #[test]
    fn bound_kinds() {
        let s = spec_of(
            &json!({"spec": {"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "p", "uid": "u"}}}),
            "sa",
            &api_aud(),
        )
        .unwrap();
        assert_eq!(
            s.bound,
            Some(BoundRef {
                kind: "Pod".into(),
                name: "p".into(),
                uid: Some("u".into())
            })
        );
        let e = spec_of(
            &json!({"spec": {"boundObjectRef": {"kind": "Deployment", "apiVersion": "apps/v1", "name": "d"}}}),
            "sa",
            &api_aud(),
        )
        .unwrap_err();
        assert_eq!(e.code, 400);
        assert!(e
            .message
            .contains("cannot bind token to object of type apps/v1, Kind=Deployment"));
    }

    #[test]
    fn foreign_bodies_are_refused() {
        assert!(check_kind(&json!({"kind": "Pod", "apiVersion": "v1"})).is_err());
        assert!(check_kind(&json!({})).is_ok());
        assert!(check_kind(
            &json!({"kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1"})
        )
        .is_ok());
    }
}
