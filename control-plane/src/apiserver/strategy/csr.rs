//! CertificateSigningRequests (`certificates.k8s.io/v1`): what upstream's
//! CSR registry strategies and admission plugins add to plain storage.
//!
//! - create: `spec.username`, `uid`, `groups` and `extra` are the
//!   requester's, whatever the body says (the approver trusts them); the
//!   status starts empty; who may create which CSR is
//!   [`crate::auth::csr::admit_create`]'s to say.
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
use futures::future::BoxFuture;
use http::{Method, Response};
use serde_json::{json, Value};

use super::{handler, Serve, Strategy, Subresource};
use crate::apiserver::handlers::{self, get_object, write_update, Attempt};
use crate::apiserver::patch::PatchType;
use crate::apiserver::status::{ApiError, ApiResult, Cause};
use crate::apiserver::table::{age_cell, human_duration, name_cell, or_none, s, Col, AGE, NAME};
use crate::apiserver::{
    check_type_meta, decode_body, json_response, model, objects, server_side_apply, validation,
};
use crate::apiserver::{ApiServer, Req};
use crate::auth::{csr as csr_auth, Attributes};

const APPROVED: &str = "Approved";
const DENIED: &str = "Denied";
const FAILED: &str = "Failed";
/// How often an update that lost a compare-and-swap is retried.
const RETRIES: usize = 8;

pub struct Csr;

static SUBRESOURCES: &[Subresource] = &[
    Subresource {
        name: "status",
        kind: "CertificateSigningRequest",
        group_version: None,
        verbs: &["get", "patch", "update"],
        serve: Serve::Handler(handler!(subresource)),
    },
    Subresource {
        name: "approval",
        kind: "CertificateSigningRequest",
        group_version: None,
        verbs: &["get", "patch", "update"],
        serve: Serve::Handler(handler!(subresource)),
    },
];

impl Strategy for Csr {
    /// The requester is whoever sends the request, whatever the body says
    /// (the approver trusts these fields); the status starts empty.
    fn prepare_for_create(&self, r: &Req, obj: &mut Value) {
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
        super::reset_status(r.def, obj);
    }

    /// A CSR's spec is what was requested, and by whom: it never changes.
    fn prepare_for_update(&self, old: &Value, new: &mut Value) {
        new["spec"] = old["spec"].clone();
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        validate_spec(obj, &mut c);
        c
    }

    /// Joining nodes and bootstrap tokens may ask only for their own
    /// client certificates.
    fn authorize_write<'a>(
        &'a self,
        _api: &'a ApiServer,
        r: &'a Req,
        old: Option<&'a Value>,
        new: &'a Value,
    ) -> BoxFuture<'a, ApiResult<()>> {
        let decided = match old {
            Some(_) => Ok(()),
            None => csr_auth::admit_create(&r.identity, new).map_err(|why| {
                ApiError::forbidden(format!(
                    "certificatesigningrequests.certificates.k8s.io is forbidden: {why}"
                ))
            }),
        };
        Box::pin(std::future::ready(decided))
    }

    fn selectable_fields(&self) -> &'static [&'static str] {
        &["spec.signerName"]
    }

    fn subresources(&self) -> &'static [Subresource] {
        SUBRESOURCES
    }

    fn columns(&self) -> Vec<Col> {
        vec![
            NAME,
            AGE,
            ("SignerName", "string", 0, "signerName indicates the requested signer, and is a qualified name."),
            ("Requestor", "string", 0, "username contains the name of the user that created the CertificateSigningRequest."),
            ("RequestedDuration", "string", 0, "expirationSeconds is the requested duration of validity of the issued certificate."),
            ("Condition", "string", 0, "conditions applied to the request. Known conditions are \"Approved\", \"Denied\", and \"Failed\"."),
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let spec = &obj["spec"];
        let duration = spec["expirationSeconds"]
            .as_i64()
            .map(human_duration)
            .unwrap_or_else(|| "<none>".into());
        vec![
            name_cell(obj),
            age_cell(obj),
            json!(or_none(s(&spec["signerName"]))),
            json!(s(&spec["username"])),
            json!(duration),
            json!(condition_column(obj)),
        ]
    }
}

/// `/approval` and `/status`.
async fn subresource(
    api: &Arc<ApiServer>,
    method: &Method,
    r: &Req,
    body: Bytes,
) -> ApiResult<Response<Body>> {
    let sub = r.sub.as_deref().unwrap_or_default();
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
            server_side_apply::patched(r, &old, &body, pt)?
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
        let (wanted, _) = model::decode_typed(r.def, &wanted)
            .map_err(|e| ApiError::bad_request(format!("CertificateSigningRequest: {e}")))?;
        let now = objects::now_rfc3339();
        let mut new = if sub == "approval" {
            approval_update(&old, &wanted, &now)
        } else {
            status_update(&old, &wanted, &now)
        };
        server_side_apply::keep_applied_fields(r, &wanted, &mut new);
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

/// Key usages a CSR may list (upstream's `KeyUsage` values).
const CSR_USAGES: &[&str] = &[
    "signing",
    "digital signature",
    "content commitment",
    "key encipherment",
    "key agreement",
    "data encipherment",
    "cert sign",
    "crl sign",
    "encipher only",
    "decipher only",
    "any",
    "server auth",
    "client auth",
    "code signing",
    "email protection",
    "s/mime",
    "ipsec end system",
    "ipsec tunnel",
    "ipsec user",
    "timestamping",
    "ocsp signing",
    "microsoft sgc",
    "netscape sgc",
];

/// A CSR's request parses (and is signed by its own key), its signer is a
/// qualified `domain/path` name, its usages are known, and a requested
/// duration is at least ten minutes.
fn validate_spec(obj: &Value, c: &mut Vec<Cause>) {
    let spec = &obj["spec"];
    match crate::auth::csr::decode_request(obj) {
        None => c.push(Cause::required("spec.request")),
        Some(pem) => {
            if let Err(e) = skiff_bootstrap::csr::parse_pem(&pem) {
                c.push(Cause::invalid(
                    "spec.request",
                    "<request data>",
                    &e.to_string(),
                ));
            }
        }
    }
    let signer = spec["signerName"].as_str().unwrap_or_default();
    if signer.is_empty() {
        c.push(Cause::required("spec.signerName"));
    } else if !signer.split_once('/').is_some_and(|(domain, path)| {
        domain.contains('.') && domain.split('.').all(validation::is_dns_label) && !path.is_empty()
    }) {
        c.push(Cause::invalid(
            "spec.signerName",
            signer,
            "must be a fully qualified domain and path of the form 'example.com/signer-name'",
        ));
    }
    let usages = spec["usages"].as_array().cloned().unwrap_or_default();
    if usages.is_empty() {
        c.push(Cause::required("spec.usages"));
    }
    for (i, u) in usages.iter().enumerate() {
        let u = u.as_str().unwrap_or_default();
        if !CSR_USAGES.contains(&u) {
            c.push(Cause::not_supported(
                format!("spec.usages[{i}]"),
                u,
                CSR_USAGES,
            ));
        }
    }
    if let Some(e) = spec["expirationSeconds"].as_i64() {
        if e < 600 {
            c.push(Cause::invalid(
                "spec.expirationSeconds",
                &e.to_string(),
                "may not specify a duration less than 600 seconds (10 minutes)",
            ));
        }
    }
}

/// kubectl's CSR condition: Denied, else Approved, else Pending; then
/// `,Failed` and `,Issued` (`extractCSRStatus`).
fn condition_column(obj: &Value) -> String {
    let conds = obj["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let has = |t: &str| conds.iter().any(|c| c["type"] == t);
    let mut out = if has("Denied") {
        "Denied".to_string()
    } else if has("Approved") {
        "Approved".to_string()
    } else {
        "Pending".to_string()
    };
    if has("Failed") {
        out += ",Failed";
    }
    if obj["status"]["certificate"]
        .as_str()
        .is_some_and(|c| !c.is_empty())
    {
        out += ",Issued";
    }
    out
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
