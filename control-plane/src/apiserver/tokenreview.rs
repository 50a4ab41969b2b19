//! TokenReview (`authentication.k8s.io/v1`): who a token is, asked by
//! webhooks and proxies that received it, answered by the same chain of
//! authenticators requests go through ([`super::authenticate`]); never
//! stored.

use std::sync::Arc;

use axum::body::Body;
use bytes::Bytes;
use http::{Method, Response};
use serde_json::json;

use super::review::user_info;
use super::status::{ApiError, ApiResult};
use super::{check_type_meta, decode_body, json_response, ApiServer, Req};

/// `POST tokenreviews`.
pub(crate) async fn create(
    api: &Arc<ApiServer>,
    _: &Method,
    r: &Req,
    body: Bytes,
) -> ApiResult<Response<Body>> {
    if r.name.is_some() {
        return Err(ApiError::method_not_allowed(
            "create of a named TokenReview is not supported",
        ));
    }
    let mut review = decode_body(&body, r.content_type())?;
    check_type_meta(r.def, &mut review)?;
    let token = review["spec"]["token"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if token.is_empty() {
        return Err(ApiError::bad_request(
            "token is required for TokenReview in authentication",
        ));
    }
    let wanted: Option<Vec<String>> = review["spec"]["audiences"].as_array().map(|a| {
        a.iter()
            .filter_map(|v| v.as_str().map(String::from))
            .collect()
    });
    let wanted = wanted.filter(|w| !w.is_empty());
    let status = match api.authenticate_token(&token, wanted.as_deref()).await {
        Ok((id, audiences)) => {
            json!({"authenticated": true, "user": user_info(&id), "audiences": audiences})
        }
        Err(why) => json!({"user": {}, "error": why}),
    };
    review["metadata"] = json!({"creationTimestamp": null});
    review["status"] = status;
    Ok(json_response(201, &review))
}
