//! CertificateSigningRequests (`certificates.k8s.io/v1`): what upstream's
//! CSR registry strategies and admission plugins add to plain storage.
//!
//! - create: `spec.username`, `uid`, `groups` and `extra` are the
//!   requester's, whatever the body says (the approver trusts them); the
//!   status starts empty.
//! - the main resource keeps spec and status on update (the handlers'
//!   update strategy; only metadata changes there).
//! - `/approval`: only the Approved / Denied conditions change, never the
//!   certificate; the caller needs `approve` on `signers/<signerName>`
//!   (the `certificates/approval` admission plugin).
//! - `/status`: the certificate and the other conditions; Approved and
//!   Denied are kept as they were. Issuing needs `sign` on the signer
//!   (`certificates/signing`), an Approved request that is neither Denied
//!   nor Failed, and a certificate once issued never changes.

use std::sync::Arc;

use axum::body::Body;
use bytes::Bytes;
use http::{Method, Response};
use serde_json::{json, Value};

use super::handlers::{self, get_object, write_update, Attempt};
use super::objects;
use super::patch::{self, PatchType};
use super::status::{ApiError, ApiResult, Cause};
use super::{
    check_type_meta, decode_body, json_response, validation, with_warnings, ApiServer, Req,
};
use crate::auth::{csr as csr_auth, Attributes};

const APPROVED: &str = "Approved";
const DENIED: &str = "Denied";
const FAILED: &str = "Failed";
/// How often an update that lost a compare-and-swap is retried.
const RETRIES: usize = 8;

/// `POST certificatesigningrequests`.
pub(crate) async fn create(
    api: &Arc<ApiServer>,
    r: &Req,
    body: Bytes,
) -> ApiResult<Response<Body>> {
    let mut obj = decode_body(&body, r.content_type())?;
    check_type_meta(r.def, &mut obj)?;
    let id = &r.identity;
    let spec = &mut obj["spec"];
    if !spec.is_object() {
        *spec = json!({});
    }
    spec["username"] = json!(id.user);
    spec["uid"] = json!(id.uid);
    spec["groups"] = json!(id.groups);
    if let Some(m) = spec.as_object_mut() {
        m.remove("extra");
    }
    csr_auth::admit_create(id, &obj).map_err(|why| {
        ApiError::forbidden(format!(
            "certificatesigningrequests.certificates.k8s.io is forbidden: {why}"
        ))
    })?;
    let (created, warnings) = handlers::create_value(api, r, obj).await?;
    Ok(with_warnings(json_response(201, &created), &warnings))
}

/// `/approval` and `/status`.
pub(crate) async fn subresource(
    api: &Arc<ApiServer>,
    method: &Method,
    r: &Req,
    sub: &str,
    body: Bytes,
) -> ApiResult<Response<Body>> {
    if *method == Method::GET {
        return handlers::get(api, r).await;
    }
    if *method != Method::PUT && *method != Method::PATCH {
        return Err(ApiError::method_not_allowed(format!(
            "{method} is not supported on certificatesigningrequests/{sub}"
        )));
    }
    for _ in 0..RETRIES {
        let (cur, old) = get_object(api, r).await?;
        let wanted = if *method == Method::PUT {
            let mut w = decode_body(&body, r.content_type())?;
            check_type_meta(r.def, &mut w)?;
            w
        } else {
            let pt = PatchType::from_content_type(r.content_type())
                .ok_or_else(|| ApiError::unsupported_media(r.content_type()))?;
            patch::apply(&old, &body, pt, r.def.kind).map_err(|e| match e {
                patch::Error::Malformed(m) => ApiError::bad_request(m),
                patch::Error::Apply(m) => ApiError::new(422, "Invalid", m),
            })?
        };
        let sent_rv = objects::meta_str(&wanted, "resourceVersion")
            .filter(|v| !v.is_empty())
            .map(String::from);
        if sent_rv
            .as_deref()
            .is_some_and(|rv| rv != cur.mod_revision.to_string())
        {
            return Err(ApiError::stale(r.def.group, r.def.plural, r.name()));
        }
        let (wanted, _) = validation::decode_typed(r.def, &wanted)
            .map_err(|e| ApiError::bad_request(format!("CertificateSigningRequest: {e}")))?;
        let now = objects::now_rfc3339();
        let new = if sub == "approval" {
            approval_update(&old, &wanted, &now)
        } else {
            status_update(&old, &wanted, &now)
        };
        check_update(r, sub, &old, &new)?;
        authorize_signer(api, r, sub, &old, &new).await?;
        match write_update(api, r, &cur, &old, new, sent_rv.is_some()).await? {
            Attempt::Done(v) => return Ok(json_response(200, &v)),
            Attempt::Retry => continue,
        }
    }
    Err(ApiError::stale(r.def.group, r.def.plural, r.name()))
}

fn conditions(obj: &Value) -> Vec<Value> {
    obj["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn is_approval(c: &Value) -> bool {
    c["type"] == APPROVED || c["type"] == DENIED
}

fn has(obj: &Value, ty: &str) -> bool {
    conditions(obj).iter().any(|c| c["type"] == ty)
}

/// Fill the timestamps a client left out (upstream's
/// `populateConditionTimestamps`): a new or changed condition transitions now.
fn stamp(conds: &mut [Value], old: &[Value], now: &str) {
    for c in conds.iter_mut() {
        let prev = old.iter().find(|o| o["type"] == c["type"]);
        if c["lastUpdateTime"].as_str().is_none_or(str::is_empty) {
            c["lastUpdateTime"] = json!(now);
        }
        if c["lastTransitionTime"].as_str().is_none_or(str::is_empty) {
            let t = match prev {
                Some(p) if p["status"] == c["status"] => p["lastTransitionTime"].clone(),
                _ => json!(now),
            };
            c["lastTransitionTime"] = t;
        }
    }
}

/// The stored object with only the wanted approval conditions taken.
fn approval_update(old: &Value, wanted: &Value, now: &str) -> Value {
    let mut new = old.clone();
    let mut conds = conditions(wanted);
    stamp(&mut conds, &conditions(old), now);
    new["status"]["conditions"] = json!(conds);
    if let Some(m) = wanted["metadata"].as_object() {
        // Labels and annotations ride along, as on any update.
        for k in ["labels", "annotations"] {
            if let Some(v) = m.get(k) {
                new["metadata"][k] = v.clone();
            }
        }
    }
    new
}

/// The stored object with the wanted certificate and non-approval
/// conditions; the stored Approved / Denied conditions stay as they are.
fn status_update(old: &Value, wanted: &Value, now: &str) -> Value {
    let mut new = old.clone();
    let old_conds = conditions(old);
    let mut conds: Vec<Value> = old_conds
        .iter()
        .filter(|c| is_approval(c))
        .cloned()
        .collect();
    let mut rest: Vec<Value> = conditions(wanted)
        .into_iter()
        .filter(|c| !is_approval(c))
        .collect();
    stamp(&mut rest, &old_conds, now);
    conds.extend(rest);
    new["status"]["conditions"] = json!(conds);
    match wanted["status"]["certificate"].as_str() {
        Some(c) if !c.is_empty() => new["status"]["certificate"] = json!(c),
        _ => {
            if let Some(m) = new["status"].as_object_mut() {
                m.remove("certificate");
            }
        }
    }
    new
}

/// Upstream's update validation of conditions and the certificate.
fn check_update(r: &Req, sub: &str, old: &Value, new: &Value) -> ApiResult<()> {
    let mut causes = Vec::new();
    let conds = conditions(new);
    let field = "status.conditions";
    for (i, c) in conds.iter().enumerate() {
        let ty = c["type"].as_str().unwrap_or_default();
        if ty.is_empty() {
            causes.push(Cause::required(format!("{field}[{i}].type")));
        }
        if conds.iter().filter(|o| o["type"] == c["type"]).count() > 1 {
            causes.push(Cause::duplicate(format!("{field}[{i}].type"), ty));
        }
        if [APPROVED, DENIED, FAILED].contains(&ty) && c["status"] != "True" {
            causes.push(Cause::not_supported(
                format!("{field}[{i}].status"),
                c["status"].as_str().unwrap_or_default(),
                &["True"],
            ));
        }
    }
    if has(new, APPROVED) && has(new, DENIED) {
        causes.push(Cause::invalid(
            field,
            "Approved,Denied",
            "Approved and Denied conditions are mutually exclusive",
        ));
    }
    for ty in [APPROVED, DENIED, FAILED] {
        if has(old, ty) && !has(new, ty) {
            causes.push(Cause::forbidden(
                field,
                &format!("updates may not remove a condition of type {ty:?}"),
            ));
        }
    }
    let old_cert = old["status"]["certificate"].as_str().unwrap_or_default();
    let new_cert = new["status"]["certificate"].as_str().unwrap_or_default();
    if !old_cert.is_empty() && old_cert != new_cert {
        causes.push(Cause::forbidden(
            "status.certificate",
            "updates may not modify a certificate once issued",
        ));
    }
    if sub == "status" && old_cert.is_empty() && !new_cert.is_empty() {
        if !has(new, APPROVED) || has(new, DENIED) || has(new, FAILED) {
            causes.push(Cause::forbidden(
                "status.certificate",
                "a certificate may only be issued for an Approved request that is not Denied or Failed",
            ));
        }
        if let Err(e) = check_certificate_pem(new_cert) {
            causes.push(Cause::invalid(
                "status.certificate",
                "<certificate data>",
                &e,
            ));
        }
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(r.def.kind, r.def.group, r.name(), causes))
    }
}

/// A base64 `status.certificate` must hold PEM certificates only.
fn check_certificate_pem(b64: &str) -> Result<(), String> {
    use base64::Engine;
    let pem = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| format!("not base64: {e}"))?;
    let mut n = 0;
    for block in x509_parser::pem::Pem::iter_from_buffer(&pem) {
        let block = block.map_err(|e| format!("not PEM: {e}"))?;
        if block.label != "CERTIFICATE" {
            return Err(format!("unexpected PEM block {:?}", block.label));
        }
        block
            .parse_x509()
            .map_err(|e| format!("not an X.509 certificate: {e}"))?;
        n += 1;
    }
    if n == 0 {
        return Err("no PEM CERTIFICATE block".into());
    }
    Ok(())
}

/// Approving or denying needs `approve`, issuing needs `sign`, on
/// `signers/<signerName>` (or `signers/<domain>/*`).
async fn authorize_signer(
    api: &ApiServer,
    r: &Req,
    sub: &str,
    old: &Value,
    new: &Value,
) -> ApiResult<()> {
    let verb = match sub {
        "approval" if conditions(old) != conditions(new) => "approve",
        "status"
            if old["status"]["certificate"] != new["status"]["certificate"]
                || has(new, FAILED) != has(old, FAILED) =>
        {
            "sign"
        }
        _ => return Ok(()),
    };
    let signer = old["spec"]["signerName"].as_str().unwrap_or_default();
    let wildcard = signer
        .split_once('/')
        .map(|(domain, _)| format!("{domain}/*"))
        .unwrap_or_default();
    let mut first = None;
    for name in [signer.to_string(), wildcard] {
        let attrs = Attributes {
            verb: verb.into(),
            resource_request: true,
            group: csr_auth::GROUP.into(),
            resource: "signers".into(),
            name,
            ..Default::default()
        };
        match api.authorize(&r.identity, &attrs).await {
            Ok(()) => return Ok(()),
            Err(e) => {
                first.get_or_insert(e);
            }
        }
    }
    Err(first.unwrap_or_else(|| ApiError::forbidden("not allowed")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn approval_takes_conditions_only_and_status_keeps_them() {
        let old = json!({"spec": {"signerName": "kubernetes.io/kubelet-serving"}, "status": {}});
        let approve = json!({"status": {
            "conditions": [{"type": "Approved", "status": "True", "reason": "KubectlApprove"}],
            "certificate": "c2VjcmV0"}});
        let approved = approval_update(&old, &approve, "2026-01-01T00:00:00Z");
        assert_eq!(conditions(&approved).len(), 1);
        assert!(
            approved["status"]["certificate"].is_null(),
            "approval issues nothing"
        );
        assert_eq!(
            conditions(&approved)[0]["lastTransitionTime"],
            "2026-01-01T00:00:00Z"
        );

        // The signer's status write cannot approve or un-approve.
        let sign = json!({"status": {"conditions": [{"type": "Denied", "status": "True"}], "certificate": "Y2VydA=="}});
        let signed = status_update(&approved, &sign, "2026-01-01T00:01:00Z");
        let types: Vec<Value> = conditions(&signed)
            .iter()
            .map(|c| c["type"].clone())
            .collect();
        assert_eq!(types, vec![json!("Approved")]);
        assert_eq!(signed["status"]["certificate"], "Y2VydA==");
    }

    #[test]
    fn certificates_must_be_pem() {
        use base64::Engine;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        assert!(check_certificate_pem(&b64("garbage")).is_err());
        assert!(check_certificate_pem("%%%").is_err());
        let ck = crate::pki::Pki::load_or_create(tempfile::tempdir().unwrap().path())
            .unwrap()
            .client_cert("u", &[])
            .unwrap();
        assert!(check_certificate_pem(&b64(&ck.cert_pem)).is_ok());
    }
}
