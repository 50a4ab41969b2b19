//! AdmissionReview v1: the request sent to a webhook and the checks on
//! its answer (upstream's `webhook/request/admissionreview.go`).

use base64::Engine;
use serde_json::{json, Value};

/// What the review asks about.
pub struct Asked<'a> {
    pub uid: &'a str,
    /// (group, version, kind) and (group, version, resource) the webhook
    /// is asked in, and those of the request.
    pub kind: [&'a str; 3],
    pub resource: [&'a str; 3],
    pub request_kind: [&'a str; 3],
    pub request_resource: [&'a str; 3],
    pub subresource: &'a str,
    pub name: &'a str,
    pub namespace: &'a str,
    pub operation: &'a str,
    pub user_info: Value,
    pub object: Option<&'a Value>,
    pub old_object: Option<&'a Value>,
    pub dry_run: bool,
    pub options: Value,
}

fn gvk([group, version, kind]: [&str; 3]) -> Value {
    json!({"group": group, "version": version, "kind": kind})
}

fn gvr([group, version, resource]: [&str; 3]) -> Value {
    json!({"group": group, "version": version, "resource": resource})
}

/// The review's `request` (also the `request` variable of match
/// conditions).
pub fn request(a: &Asked) -> Value {
    let mut r = json!({
        "uid": a.uid,
        "kind": gvk(a.kind),
        "resource": gvr(a.resource),
        "requestKind": gvk(a.request_kind),
        "requestResource": gvr(a.request_resource),
        "name": a.name,
        "operation": a.operation,
        "userInfo": a.user_info,
        "object": a.object,
        "oldObject": a.old_object,
        "dryRun": a.dry_run,
        "options": a.options,
    });
    if !a.subresource.is_empty() {
        r["subResource"] = json!(a.subresource);
        r["requestSubResource"] = json!(a.subresource);
    }
    if !a.namespace.is_empty() {
        r["namespace"] = json!(a.namespace);
    }
    r
}

pub fn review(request: Value) -> Value {
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
}

/// A webhook's verdict.
#[derive(Debug)]
pub struct Answer {
    pub allowed: bool,
    /// `response.status` of a denial.
    pub status: Value,
    /// A JSONPatch (mutating webhooks only).
    pub patch: Option<json_patch::Patch>,
    pub warnings: Vec<String>,
}

/// Check and read the answer `body` to the review with `uid`.
///
/// # Errors
/// Why the body is not a valid answer, in upstream's words (without the
/// `received invalid webhook response: ` prefix).
pub fn answer(body: &[u8], uid: &str, mutating: bool) -> Result<Answer, String> {
    let review: Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    let (api_version, kind) = (&review["apiVersion"], &review["kind"]);
    if api_version != "admission.k8s.io/v1" || kind != "AdmissionReview" {
        return Err(format!(
            "expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got {}, Kind={}",
            api_version.as_str().unwrap_or_default(),
            kind.as_str().unwrap_or_default()
        ));
    }
    let r = match review.get("response") {
        Some(r) if r.is_object() => r,
        _ => return Err("webhook response was absent".into()),
    };
    let got = r["uid"].as_str().unwrap_or_default();
    if got != uid {
        return Err(format!("expected response.uid={uid:?}, got {got:?}"));
    }
    let patch_type = r["patchType"].as_str().unwrap_or_default();
    let raw = r["patch"].as_str().unwrap_or_default();
    if !raw.is_empty() && patch_type.is_empty() {
        return Err("webhook returned response.patch but not response.patchType".into());
    }
    if !raw.is_empty() && !mutating {
        return Err("validating webhook may not return response.patch".into());
    }
    if !raw.is_empty() && patch_type != "JSONPatch" {
        return Err(format!(
            "webhook returned invalid response.patchType of {patch_type:?}"
        ));
    }
    let patch = if raw.is_empty() {
        None
    } else {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(raw)
            .map_err(|e| format!("response.patch is not base64: {e}"))?;
        Some(
            serde_json::from_slice(&bytes)
                .map_err(|e| format!("response.patch is not a JSONPatch: {e}"))?,
        )
    };
    Ok(Answer {
        allowed: r["allowed"].as_bool().unwrap_or(false),
        status: r["status"].clone(),
        patch,
        warnings: r["warnings"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(String::from)
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(response: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})).unwrap()
    }

    #[test]
    fn answers_are_checked_as_upstream_checks_them() {
        let ok = answer(
            &body(json!({"uid": "u", "allowed": true, "warnings": ["w"]})),
            "u",
            false,
        )
        .unwrap();
        assert!(ok.allowed && ok.patch.is_none());
        assert_eq!(ok.warnings, ["w"]);
        let e = |b: Vec<u8>, mutating| answer(&b, "u", mutating).unwrap_err();
        assert_eq!(
            e(body(json!({"uid": "v", "allowed": true})), false),
            "expected response.uid=\"u\", got \"v\""
        );
        assert_eq!(
            e(b"not json".to_vec(), false),
            "expected ident at line 1 column 2"
        );
        assert_eq!(
            e(
                serde_json::to_vec(
                    &json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"})
                )
                .unwrap(),
                false
            ),
            "webhook response was absent"
        );
        let patch = base64::engine::general_purpose::STANDARD
            .encode(br#"[{"op":"add","path":"/x","value":1}]"#);
        assert_eq!(
            e(
                body(
                    json!({"uid": "u", "allowed": true, "patch": patch, "patchType": "JSONPatch"})
                ),
                false
            ),
            "validating webhook may not return response.patch"
        );
        assert_eq!(
            e(
                body(json!({"uid": "u", "allowed": true, "patch": patch})),
                true
            ),
            "webhook returned response.patch but not response.patchType"
        );
        let m = answer(
            &body(json!({"uid": "u", "allowed": true, "patch": patch, "patchType": "JSONPatch"})),
            "u",
            true,
        )
        .unwrap();
        assert_eq!(m.patch.unwrap().0.len(), 1);
    }
}
