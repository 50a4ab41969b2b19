//! Access reviews (`authorization.k8s.io/v1`): asked, answered with the
//! server's authorizers, never stored (`kubectl auth can-i`). Each review
//! kind's row in [`super::resources`] names its answer here.

use std::sync::Arc;

use axum::body::Body;
use bytes::Bytes;
use http::{Method, Response};
use serde_json::{json, Value};

use super::status::{ApiError, ApiResult, Cause};
use super::{check_type_meta, decode_body, json_response, ApiServer, Req};
use crate::auth::{Attributes, Identity};

/// `selfsubjectaccessreviews`.
pub(crate) async fn self_subject(
    api: &Arc<ApiServer>,
    _: &Method,
    r: &Req,
    body: Bytes,
) -> ApiResult<Response<Body>> {
    access_review(api, r, body, true).await
}

/// `subjectaccessreviews`.
pub(crate) async fn subject(
    api: &Arc<ApiServer>,
    _: &Method,
    r: &Req,
    body: Bytes,
) -> ApiResult<Response<Body>> {
    access_review(api, r, body, false).await
}

/// Answer a SelfSubjectAccessReview (about the requester) or a
/// SubjectAccessReview (about the user its spec names) with the same
/// authorizers that guard requests.
async fn access_review(
    api: &ApiServer,
    r: &Req,
    body: Bytes,
    about_self: bool,
) -> ApiResult<Response<Body>> {
    if r.name.is_some() {
        return Err(ApiError::method_not_allowed(format!(
            "create of a named {} is not supported",
            r.def.kind
        )));
    }
    let mut review = decode_body(&body, r.content_type())?;
    check_type_meta(r.def, &mut review)?;
    let spec = review.get("spec").cloned().unwrap_or(Value::Null);
    let subject = if about_self {
        r.identity.clone()
    } else {
        let groups = spec["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|g| g.as_str().map(String::from))
            .collect();
        let mut id = Identity::new(spec["user"].as_str().unwrap_or_default(), groups);
        id.uid = spec["uid"].as_str().unwrap_or_default().to_string();
        id
    };
    let s = |v: &Value, k: &str| v[k].as_str().unwrap_or_default().to_string();
    let attrs = if let Some(ra) = spec.get("resourceAttributes").filter(|v| v.is_object()) {
        Attributes {
            verb: s(ra, "verb"),
            resource_request: true,
            group: s(ra, "group"),
            resource: s(ra, "resource"),
            subresource: s(ra, "subresource"),
            namespace: s(ra, "namespace"),
            name: s(ra, "name"),
            path: String::new(),
        }
    } else if let Some(nr) = spec.get("nonResourceAttributes").filter(|v| v.is_object()) {
        Attributes {
            verb: s(nr, "verb"),
            path: s(nr, "path"),
            ..Default::default()
        }
    } else {
        return Err(ApiError::invalid(
            r.def.kind,
            r.def.group,
            "",
            vec![Cause::required("spec.resourceAttributes")],
        ));
    };
    let (allowed, reason) = match api.authorize(&subject, &attrs).await {
        Ok(()) => (true, "allowed".to_string()),
        // Upstream's RBAC gives no reason for a denial: kubectl prints a plain "no".
        Err(_) => (false, String::new()),
    };
    review["status"] = json!({"allowed": allowed, "reason": reason});
    review["metadata"] = json!({"creationTimestamp": null});
    Ok(json_response(201, &review))
}
