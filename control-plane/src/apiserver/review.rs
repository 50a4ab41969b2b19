//! Access reviews (`authorization.k8s.io/v1`): asked, answered with the
//! server's authorizers, never stored (`kubectl auth can-i`, `can-i
//! --list`), and SelfSubjectReview (`authentication.k8s.io/v1`, `kubectl
//! auth whoami`). Each review kind's row in [`super::resources`] names its
//! answer here.

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
            // Upstream's selector attributes (1.31+): the raw form.
            label_selector: s(&ra["labelSelector"], "rawSelector"),
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

/// `localsubjectaccessreviews`: a SubjectAccessReview confined to the
/// namespace it is created in.
pub(crate) async fn local_subject(
    api: &Arc<ApiServer>,
    _: &Method,
    r: &Req,
    body: Bytes,
) -> ApiResult<Response<Body>> {
    let ns = r.attrs.namespace.clone();
    if ns.is_empty() {
        return Err(ApiError::bad_request(format!(
            "namespace is required on this type: {ns}"
        )));
    }
    let review = decode_body(&body, r.content_type())?;
    local_scope_check(&review["spec"], &ns, r)?;
    access_review(api, r, body, false).await
}

/// Upstream's checks of a local review's spec against its namespace.
fn local_scope_check(spec: &Value, ns: &str, r: &Req) -> ApiResult<()> {
    if spec["nonResourceAttributes"].is_object() {
        return Err(ApiError::invalid(
            r.def.kind,
            r.def.group,
            "",
            vec![Cause::invalid(
                "spec.nonResourceAttributes",
                "",
                "disallowed on this kind of request",
            )],
        ));
    }
    if let Some(ra) = spec.get("resourceAttributes").filter(|v| v.is_object()) {
        if ra["namespace"].as_str().unwrap_or_default() != ns {
            return Err(ApiError::bad_request(format!(
                "spec.resourceAttributes.namespace must match namespace: {ns}"
            )));
        }
    }
    Ok(())
}

/// `selfsubjectreviews` (`authentication.k8s.io`, `kubectl auth
/// whoami`): who the requester is authenticated as.
pub(crate) async fn self_review(
    _: &Arc<ApiServer>,
    _: &Method,
    r: &Req,
    body: Bytes,
) -> ApiResult<Response<Body>> {
    let mut review = decode_body(&body, r.content_type())?;
    check_type_meta(r.def, &mut review)?;
    review["metadata"] = json!({"creationTimestamp": null});
    review["status"] = json!({"userInfo": user_info(&r.identity)});
    Ok(json_response(201, &review))
}

/// An identity as `authentication.k8s.io/v1` UserInfo (empty fields
/// left out, as upstream's omitempty).
pub(crate) fn user_info(id: &Identity) -> Value {
    let mut info = json!({"username": id.user, "groups": id.groups});
    if !id.uid.is_empty() {
        info["uid"] = json!(id.uid);
    }
    if !id.extra.is_empty() {
        info["extra"] = json!(id.extra);
    }
    info
}

/// `selfsubjectrulesreviews` (`kubectl auth can-i --list`): what RBAC
/// lets the requester do in `spec.namespace`.
pub(crate) async fn self_rules(
    api: &Arc<ApiServer>,
    _: &Method,
    r: &Req,
    body: Bytes,
) -> ApiResult<Response<Body>> {
    let mut review = decode_body(&body, r.content_type())?;
    check_type_meta(r.def, &mut review)?;
    let ns = review["spec"]["namespace"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let rules = api.rbac.index().rules_for(&r.identity, &ns);
    let mut status = rules_status(&rules);
    // Nodes are authorized by the node authorizer too, whose rules depend
    // on the objects asked about and are not listed (upstream says so).
    if r.node().is_some() {
        status["incomplete"] = json!(true);
    }
    review["metadata"] = json!({"creationTimestamp": null});
    review["status"] = status;
    Ok(json_response(201, &review))
}

/// RBAC rules split as SubjectRulesReviewStatus's resource and
/// non-resource rules.
fn rules_status(rules: &[k8s_openapi::api::rbac::v1::PolicyRule]) -> Value {
    let mut resource = Vec::new();
    let mut non_resource = Vec::new();
    for rule in rules {
        if let Some(urls) = rule.non_resource_urls.as_ref().filter(|u| !u.is_empty()) {
            non_resource.push(json!({"verbs": rule.verbs, "nonResourceURLs": urls}));
        }
        if rule.resources.as_ref().is_some_and(|r| !r.is_empty()) {
            let mut rr = json!({
                "verbs": rule.verbs,
                "apiGroups": rule.api_groups.clone().unwrap_or_default(),
                "resources": rule.resources,
            });
            if let Some(names) = rule.resource_names.as_ref().filter(|n| !n.is_empty()) {
                rr["resourceNames"] = json!(names);
            }
            resource.push(rr);
        }
    }
    json!({"resourceRules": resource, "nonResourceRules": non_resource, "incomplete": false})
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::rbac::v1::PolicyRule;

    #[test]
    fn rules_are_split_into_resource_and_non_resource_ones() {
        let rules = vec![
            PolicyRule {
                verbs: vec!["get".into()],
                api_groups: Some(vec!["".into()]),
                resources: Some(vec!["pods".into()]),
                resource_names: Some(vec!["web".into()]),
                ..PolicyRule::default()
            },
            PolicyRule {
                verbs: vec!["get".into()],
                non_resource_urls: Some(vec!["/healthz".into()]),
                ..PolicyRule::default()
            },
        ];
        let s = rules_status(&rules);
        assert_eq!(
            s["resourceRules"],
            json!([{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"], "resourceNames": ["web"]}])
        );
        assert_eq!(
            s["nonResourceRules"],
            json!([{"verbs": ["get"], "nonResourceURLs": ["/healthz"]}])
        );
        assert_eq!(s["incomplete"], false);
    }

    #[test]
    fn user_info_leaves_out_empty_fields() {
        let mut id = Identity::new("alice", vec!["devs".into()]);
        assert_eq!(
            user_info(&id),
            json!({"username": "alice", "groups": ["devs", "system:authenticated"]})
        );
        id.uid = "42".into();
        id.extra.insert("k".into(), vec!["v".into()]);
        let info = user_info(&id);
        assert_eq!(info["uid"], "42");
        assert_eq!(info["extra"], json!({"k": ["v"]}));
    }
}
