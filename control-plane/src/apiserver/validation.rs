//! Validation: names and labels for every kind, the fields whose absence
//! would break a controller for the workload kinds, and decoding through
//! the k8s-openapi types (which also finds unknown fields for
//! `fieldValidation`).

use serde::{de::DeserializeOwned, Serialize};
use serde_json::Value;

use super::resources::ResourceDef;
use super::selectors::LabelSelector;
use super::status::Cause;

/// Causes of a 422, empty when the object is valid.
pub fn validate(def: &ResourceDef, obj: &Value) -> Vec<Cause> {
    let mut c = Vec::new();
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    match (def.group, def.kind) {
        ("rbac.authorization.k8s.io", _) => path_segment_name(name, &mut c),
        ("", "Namespace") => dns_label("metadata.name", name, &mut c),
        ("", "Service") => dns1035_label("metadata.name", name, &mut c),
        _ => dns_subdomain("metadata.name", name, &mut c),
    }
    labels(obj, &mut c);
    match (def.group, def.kind) {
        ("", "Pod") => pod_spec("spec", obj.get("spec"), &mut c, false),
        ("apps", "Deployment")
        | ("apps", "ReplicaSet")
        | ("apps", "DaemonSet")
        | ("batch", "Job") => workload(def, obj, &mut c),
        ("", "Service") => service(obj, &mut c),
        ("", "ConfigMap") | ("", "Secret") => data_keys(obj, &mut c),
        ("certificates.k8s.io", "CertificateSigningRequest") => csr_spec(obj, &mut c),
        _ => {}
    }
    c
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
fn csr_spec(obj: &Value, c: &mut Vec<Cause>) {
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
        domain.contains('.') && domain.split('.').all(is_dns_label) && !path.is_empty()
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

fn path_segment_name(name: &str, c: &mut Vec<Cause>) {
    if name.is_empty() {
        c.push(Cause::required("metadata.name"));
    } else if name == "." || name == ".." || name.contains('/') || name.contains('%') {
        c.push(Cause::invalid(
            "metadata.name",
            name,
            "may not contain '/' or '%' or be '.' or '..'",
        ));
    }
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

pub fn dns_label(field: &str, s: &str, c: &mut Vec<Cause>) {
    if s.is_empty() {
        c.push(Cause::required(field));
    } else if !is_dns_label(s) {
        c.push(Cause::invalid(field, s, "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"));
    }
}

fn dns1035_label(field: &str, s: &str, c: &mut Vec<Cause>) {
    if s.is_empty() {
        c.push(Cause::required(field));
    } else if !is_dns_label(s) || !s.starts_with(|ch: char| ch.is_ascii_lowercase()) {
        c.push(Cause::invalid(field, s, "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"));
    }
}

fn dns_subdomain(field: &str, s: &str, c: &mut Vec<Cause>) {
    if s.is_empty() {
        c.push(Cause::required(field));
    } else if s.len() > 253 || !s.split('.').all(is_dns_label) {
        c.push(Cause::invalid(field, s, "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"));
    }
}

fn is_label_value(v: &str) -> bool {
    v.is_empty()
        || (v.len() <= 63
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && v.starts_with(|ch: char| ch.is_ascii_alphanumeric())
            && v.ends_with(|ch: char| ch.is_ascii_alphanumeric()))
}

fn is_qualified_name(k: &str) -> bool {
    let name = match k.split_once('/') {
        Some((prefix, name)) => {
            if prefix.is_empty() || prefix.len() > 253 || !prefix.split('.').all(is_dns_label) {
                return false;
            }
            name
        }
        None => k,
    };
    !name.is_empty() && is_label_value(name)
}

fn labels(obj: &Value, c: &mut Vec<Cause>) {
    if let Some(m) = obj["metadata"]["labels"].as_object() {
        for (k, v) in m {
            if !is_qualified_name(k) {
                c.push(Cause::invalid("metadata.labels", k, "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"));
            }
            match v.as_str() {
                Some(s) if is_label_value(s) => {}
                _ => c.push(Cause::invalid("metadata.labels", &v.to_string(), "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character")),
            }
        }
    }
}

fn pod_spec(path: &str, spec: Option<&Value>, c: &mut Vec<Cause>, template: bool) {
    let Some(spec) = spec else {
        c.push(Cause::required(path));
        return;
    };
    let containers = spec.get("containers").and_then(Value::as_array);
    match containers {
        None => c.push(Cause::required(format!("{path}.containers"))),
        Some(cs) if cs.is_empty() => c.push(Cause::required(format!("{path}.containers"))),
        Some(_) => {}
    }
    let mut names: Vec<&str> = Vec::new();
    for field in ["initContainers", "containers"] {
        for (i, ctr) in spec
            .get(field)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let p = format!("{path}.{field}[{i}]");
            let name = ctr.get("name").and_then(Value::as_str).unwrap_or_default();
            dns_label(&format!("{p}.name"), name, c);
            if !name.is_empty() && names.contains(&name) {
                c.push(Cause::duplicate(format!("{p}.name"), name));
            }
            names.push(name);
            if ctr
                .get("image")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .trim()
                .is_empty()
            {
                c.push(Cause::required(format!("{p}.image")));
            }
            for (j, port) in ctr
                .get("ports")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
            {
                let n = port
                    .get("containerPort")
                    .and_then(Value::as_i64)
                    .unwrap_or(0);
                if !(1..=65535).contains(&n) {
                    c.push(Cause::invalid(
                        format!("{p}.ports[{j}].containerPort"),
                        &n.to_string(),
                        "must be between 1 and 65535, inclusive",
                    ));
                }
            }
        }
    }
    if let Some(rp) = spec.get("restartPolicy").and_then(Value::as_str) {
        if !matches!(rp, "Always" | "OnFailure" | "Never") {
            c.push(Cause::not_supported(
                format!("{path}.restartPolicy"),
                rp,
                &["Always", "OnFailure", "Never"],
            ));
        }
    }
    if let Some(dp) = spec.get("dnsPolicy").and_then(Value::as_str) {
        if !matches!(
            dp,
            "ClusterFirstWithHostNet" | "ClusterFirst" | "Default" | "None"
        ) {
            c.push(Cause::not_supported(
                format!("{path}.dnsPolicy"),
                dp,
                &["ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"],
            ));
        }
    }
    let _ = template;
}

fn workload(def: &ResourceDef, obj: &Value, c: &mut Vec<Cause>) {
    let spec = &obj["spec"];
    if let Some(r) = spec.get("replicas").and_then(Value::as_i64) {
        if r < 0 {
            c.push(Cause::invalid(
                "spec.replicas",
                &r.to_string(),
                "must be greater than or equal to 0",
            ));
        }
    }
    let template = &spec["template"];
    pod_spec("spec.template.spec", template.get("spec"), c, true);
    // Jobs generate their selector; everyone else must bring one that
    // selects the template's labels, or the controller would adopt nothing.
    if def.kind != "Job" || spec["manualSelector"].as_bool() == Some(true) {
        match spec.get("selector") {
            None | Some(Value::Null) => c.push(Cause::required("spec.selector")),
            Some(sel) => {
                let ml = sel.get("matchLabels").and_then(Value::as_object);
                let has_expr = sel
                    .get("matchExpressions")
                    .and_then(Value::as_array)
                    .is_some_and(|a| !a.is_empty());
                if ml.is_none_or(|m| m.is_empty()) && !has_expr {
                    c.push(Cause::invalid(
                        "spec.selector",
                        "{}",
                        "empty selector is invalid for deployment",
                    ));
                } else if let Some(ml) = ml {
                    let labels = super::objects::labels(template);
                    if !LabelSelector::from_map(ml).matches_labels(&labels) {
                        let shown = serde_json::to_string(&template["metadata"]["labels"])
                            .unwrap_or_default();
                        c.push(Cause::invalid(
                            "spec.template.metadata.labels",
                            &shown,
                            "`selector` does not match template `labels`",
                        ));
                    }
                }
            }
        }
    }
    if def.kind == "Job" {
        if let Some(rp) = template["spec"]["restartPolicy"].as_str() {
            if !matches!(rp, "OnFailure" | "Never") {
                c.push(Cause::not_supported(
                    "spec.template.spec.restartPolicy",
                    rp,
                    &["OnFailure", "Never"],
                ));
            }
        } else {
            c.push(Cause::required("spec.template.spec.restartPolicy"));
        }
    }
}

fn service(obj: &Value, c: &mut Vec<Cause>) {
    let spec = &obj["spec"];
    let ty = spec["type"].as_str().unwrap_or("ClusterIP");
    if !matches!(
        ty,
        "ClusterIP" | "NodePort" | "LoadBalancer" | "ExternalName"
    ) {
        c.push(Cause::not_supported(
            "spec.type",
            ty,
            &["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"],
        ));
    }
    let ports = spec["ports"].as_array();
    let headless = spec["clusterIP"].as_str() == Some("None");
    if ports.is_none_or(|p| p.is_empty()) && ty != "ExternalName" && !headless {
        c.push(Cause::required("spec.ports"));
    }
    let multi = ports.is_some_and(|p| p.len() > 1);
    for (i, p) in ports.into_iter().flatten().enumerate() {
        let n = p["port"].as_i64().unwrap_or(0);
        if !(1..=65535).contains(&n) {
            c.push(Cause::invalid(
                format!("spec.ports[{i}].port"),
                &n.to_string(),
                "must be between 1 and 65535, inclusive",
            ));
        }
        if multi && p["name"].as_str().unwrap_or_default().is_empty() {
            c.push(Cause::required(format!("spec.ports[{i}].name")));
        }
    }
}

fn data_keys(obj: &Value, c: &mut Vec<Cause>) {
    for field in ["data", "binaryData"] {
        for k in obj[field].as_object().into_iter().flat_map(|m| m.keys()) {
            let ok = !k.is_empty()
                && k.len() <= 253
                && k.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
            if !ok {
                c.push(Cause::invalid(
                    format!("{field}[{k}]"),
                    k,
                    "a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
                ));
            }
        }
    }
}

/// Decode through the typed model and back: the canonical JSON, plus the
/// paths of fields the type does not have (`fieldValidation`).
///
/// # Errors
/// A message like `json: cannot unmarshal ...` for wrong types or shapes,
/// answered as 400 Bad Request.
pub fn decode_typed(def: &ResourceDef, obj: &Value) -> Result<(Value, Vec<String>), String> {
    let typed = with_model(def, FromValue(obj)).unwrap_or_else(|| Ok(obj.clone()))?;
    let mut unknown = Vec::new();
    unknown_fields(&mut Vec::new(), obj, &typed, &mut unknown);
    Ok((typed, unknown))
}

/// The canonical JSON of a JSON request body decoded straight into the
/// typed model, skipping the untyped tree [`decode_typed`] starts from.
/// None unless that takes: a kind without a model, a body the model
/// refuses, or one with fields the model lacks go the general way, which
/// words their errors and warnings.
pub fn decode_json_body(def: &ResourceDef, body: &[u8]) -> Option<Value> {
    with_model(def, FromJson(body))?.ok()
}

/// Decodes one kind's typed model from some input, back to canonical JSON.
trait ModelDecoder {
    fn decode<T: DeserializeOwned + Serialize>(self) -> Result<Value, String>;
}

/// From an untyped tree, borrowed: no deep copy of the object first.
struct FromValue<'a>(&'a Value);

impl ModelDecoder for FromValue<'_> {
    fn decode<T: DeserializeOwned + Serialize>(self) -> Result<Value, String> {
        let t = T::deserialize(self.0).map_err(|e| e.to_string())?;
        serde_json::to_value(&t).map_err(|e| e.to_string())
    }
}

/// From JSON text; any field the model ignores fails it.
struct FromJson<'a>(&'a [u8]);

impl ModelDecoder for FromJson<'_> {
    fn decode<T: DeserializeOwned + Serialize>(self) -> Result<Value, String> {
        let mut de = serde_json::Deserializer::from_slice(self.0);
        let mut ignored = false;
        let t: T =
            serde_ignored::deserialize(&mut de, |_| ignored = true).map_err(|e| e.to_string())?;
        de.end().map_err(|e| e.to_string())?;
        if ignored {
            return Err("unknown fields".into());
        }
        serde_json::to_value(&t).map_err(|e| e.to_string())
    }
}

/// Run `d` with the typed model of `def`'s kind; None for kinds without
/// one (custom and review kinds).
fn with_model<D: ModelDecoder>(def: &ResourceDef, d: D) -> Option<Result<Value, String>> {
    use k8s_openapi::api::{
        apps, batch, certificates, coordination, core, discovery, events, rbac,
    };
    Some(match (def.group, def.kind) {
        ("", "Namespace") => d.decode::<core::v1::Namespace>(),
        ("", "Node") => d.decode::<core::v1::Node>(),
        ("", "Pod") => d.decode::<core::v1::Pod>(),
        ("", "Service") => d.decode::<core::v1::Service>(),
        ("", "Endpoints") => d.decode::<core::v1::Endpoints>(),
        ("", "ConfigMap") => d.decode::<core::v1::ConfigMap>(),
        ("", "Secret") => d.decode::<core::v1::Secret>(),
        ("", "Event") => d.decode::<core::v1::Event>(),
        ("", "ServiceAccount") => d.decode::<core::v1::ServiceAccount>(),
        ("apps", "Deployment") => d.decode::<apps::v1::Deployment>(),
        ("apps", "ReplicaSet") => d.decode::<apps::v1::ReplicaSet>(),
        ("apps", "DaemonSet") => d.decode::<apps::v1::DaemonSet>(),
        ("batch", "Job") => d.decode::<batch::v1::Job>(),
        ("coordination.k8s.io", "Lease") => d.decode::<coordination::v1::Lease>(),
        ("discovery.k8s.io", "EndpointSlice") => d.decode::<discovery::v1::EndpointSlice>(),
        ("events.k8s.io", "Event") => d.decode::<events::v1::Event>(),
        ("rbac.authorization.k8s.io", "Role") => d.decode::<rbac::v1::Role>(),
        ("rbac.authorization.k8s.io", "RoleBinding") => d.decode::<rbac::v1::RoleBinding>(),
        ("rbac.authorization.k8s.io", "ClusterRole") => d.decode::<rbac::v1::ClusterRole>(),
        ("rbac.authorization.k8s.io", "ClusterRoleBinding") => {
            d.decode::<rbac::v1::ClusterRoleBinding>()
        }
        ("certificates.k8s.io", "CertificateSigningRequest") => {
            d.decode::<certificates::v1::CertificateSigningRequest>()
        }
        _ => return None,
    })
}

/// One step of a path into an object.
enum Step<'a> {
    Field(&'a str),
    Index(usize),
}

/// `spec.containers[0].bogus`, the way upstream names a field.
fn path_text(path: &[Step<'_>]) -> String {
    let mut out = String::new();
    for step in path {
        match step {
            Step::Field(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Step::Index(i) => {
                use std::fmt::Write;
                let _ = write!(out, "[{i}]");
            }
        }
    }
    out
}

/// Paths in `sent` that the typed round trip dropped. Free-form maps
/// (labels, data) survive the round trip whole, so only schema fields show.
/// `path` leads to `sent`; a path is only spelled out for a field that is
/// reported, since almost none are.
fn unknown_fields<'a>(
    path: &mut Vec<Step<'a>>,
    sent: &'a Value,
    typed: &Value,
    out: &mut Vec<String>,
) {
    match (sent, typed) {
        (Value::Object(s), Value::Object(t)) => {
            for (k, v) in s {
                path.push(Step::Field(k));
                match t.get(k) {
                    Some(tv) => unknown_fields(path, v, tv, out),
                    None if v.is_null() => {}
                    None => out.push(path_text(path)),
                }
                path.pop();
            }
        }
        (Value::Array(s), Value::Array(t)) => {
            for (i, (sv, tv)) in s.iter().zip(t.iter()).enumerate() {
                path.push(Step::Index(i));
                unknown_fields(path, sv, tv, out);
                path.pop();
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::resources::lookup;
    use serde_json::json;

    #[test]
    fn pod_without_image_is_invalid() {
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}});
        let c = validate(lookup("", "v1", "pods").unwrap(), &pod);
        assert_eq!(c, vec![Cause::required("spec.containers[0].image")]);
        let pod = json!({"metadata": {"name": "Bad_Name"}, "spec": {"containers": [{"name": "c", "image": "i"}]}});
        assert_eq!(
            validate(lookup("", "v1", "pods").unwrap(), &pod)[0].field,
            "metadata.name"
        );
    }

    #[test]
    fn unknown_fields_are_found() {
        let pods = lookup("", "v1", "pods").unwrap();
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"x": "y"}},
            "spec": {"containers": [{"name": "c", "image": "i", "bogus": 1}], "nope": true}});
        let (_, unknown) = decode_typed(pods, &pod).unwrap();
        assert_eq!(
            unknown,
            vec![
                "spec.containers[0].bogus".to_string(),
                "spec.nope".to_string()
            ]
        );
        let bad = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": 5}});
        assert!(decode_typed(pods, &bad).is_err());
    }

    #[test]
    fn json_bodies_decode_straight_to_the_same_canonical_object() {
        let pods = lookup("", "v1", "pods").unwrap();
        let pod = json!({"metadata": {"name": "p", "labels": {"x": "y"}},
            "spec": {"containers": [{"name": "c", "image": "i", "ports": [{"containerPort": 80}],
                "resources": {"requests": {"cpu": "10m"}}}], "nodeSelector": {}}});
        let body = serde_json::to_vec(&pod).unwrap();
        let (want, unknown) = decode_typed(pods, &pod).unwrap();
        assert!(unknown.is_empty());
        assert_eq!(decode_json_body(pods, &body), Some(want));
        // Left to the general path, which words errors and warnings.
        for refused in [
            r#"{"metadata": {"name": "p"}, "spec": {"nope": true}}"#,
            r#"{"apiVersion": "apps/v1", "kind": "Pod", "metadata": {"name": "p"}}"#,
            r#"{"metadata": {"name": 5}}"#,
            r#"{"metadata": {"name": "p"}} trailing"#,
            r#"[]"#,
            "",
        ] {
            assert_eq!(
                decode_json_body(pods, refused.as_bytes()),
                None,
                "{refused}"
            );
        }
    }
}
