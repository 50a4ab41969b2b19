//! The verbs over the store: get, list, create, update, patch, delete,
//! deletecollection, with upstream's object semantics (uid, generation,
//! resourceVersion preconditions, status split, graceful deletion,
//! finalizers, namespace lifecycle).

use std::sync::Arc;

use axum::body::Body;
use bytes::Bytes;
use http::Response;
use serde_json::{json, Value};

use super::convert;
use super::objects::{self, meta_mut};
use super::patch::{self, PatchType};
use super::resources::{self, ResourceDef};
use super::selectors::{FieldSelector, LabelSelector};
use super::status::{ApiError, ApiResult, Cause};
use super::{
    check_type_meta, decode_body, defaults, json_response, media_type, table, validation,
    with_warnings, ApiServer, Req,
};
use crate::store::{self, KeyValue};

/// How often a write that lost a compare-and-swap without a client
/// precondition is retried on fresh state (upstream's GuaranteedUpdate).
const RETRIES: usize = 8;

fn store_err(r: &Req, e: store::Error) -> ApiError {
    ApiError::from_store(e, r.def.group, r.def.plural, r.name())
}

/// The object or a Table, as the Accept header asks.
fn object_response(r: &Req, code: u16, obj: &Value) -> Response<Body> {
    if table::wants_table(r.accept()) {
        let meta = json!({"resourceVersion": obj["metadata"]["resourceVersion"].clone()});
        let inc = r.query.get("includeObject").unwrap_or("Metadata");
        return json_response(
            code,
            &table::table(r.def, std::slice::from_ref(obj), meta, inc, true),
        );
    }
    if table::wants_metadata(r.accept()) {
        return json_response(code, &table::partial_metadata(obj));
    }
    json_response(code, obj)
}

pub(crate) async fn get(api: &Arc<ApiServer>, r: &Req) -> ApiResult<Response<Body>> {
    let raw = !convert::converts(r.def)
        && !table::wants_table(r.accept())
        && !table::wants_metadata(r.accept());
    if raw {
        let kv = api.store.get(&r.key()).await.map_err(|e| store_err(r, e))?;
        let kv = kv.ok_or_else(|| ApiError::not_found(r.def.group, r.def.plural, r.name()))?;
        if let Some(b) = objects::splice_resource_version(&kv.value, kv.mod_revision) {
            return Ok(super::bytes_response(200, b));
        }
    }
    let obj = get_object(api, r).await?.1;
    Ok(object_response(r, 200, &obj))
}

/// The stored KeyValue and its decoded object, or 404.
pub(crate) async fn get_object(api: &ApiServer, r: &Req) -> ApiResult<(KeyValue, Value)> {
    let kv = api.store.get(&r.key()).await.map_err(|e| store_err(r, e))?;
    let kv = kv.ok_or_else(|| ApiError::not_found(r.def.group, r.def.plural, r.name()))?;
    let obj = convert::decode(r.def, &kv.value, kv.mod_revision)
        .ok_or_else(|| ApiError::internal(format!("stored object {} is not valid JSON", kv.key)))?;
    Ok((kv, obj))
}

/// Continue tokens: base64 JSON of the list revision and the last key.
fn encode_continue(rev: i64, key: &str) -> String {
    use base64::Engine;
    let t = json!({"v": "meta.k8s.io/v1", "rv": rev, "start": key});
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(t.to_string())
}

fn decode_continue(token: &str, prefix: &str) -> ApiResult<(i64, String)> {
    use base64::Engine;
    let bad = || ApiError::bad_request("continue key is not valid: invalid continue token");
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token.trim_end_matches('='))
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let rev = v["rv"].as_i64().ok_or_else(bad)?;
    let start = v["start"].as_str().ok_or_else(bad)?.to_string();
    // A token from another resource or namespace would read foreign keys.
    if !start.starts_with(prefix) {
        return Err(bad());
    }
    Ok((rev, start))
}

pub(crate) fn selectors(r: &Req) -> ApiResult<(LabelSelector, FieldSelector)> {
    let ls = LabelSelector::parse(r.query.get("labelSelector").unwrap_or(""))
        .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?;
    let fs = FieldSelector::parse(r.query.get("fieldSelector").unwrap_or(""), r.def.kind)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    Ok((ls, fs))
}

/// One page of matching objects: (items, list revision, continue token).
pub(crate) async fn list_objects(
    api: &ApiServer,
    r: &Req,
) -> ApiResult<(Vec<Value>, i64, Option<String>)> {
    let (kvs, rev, cont) = list_raw(api, r).await?;
    let items = kvs
        .iter()
        .filter_map(|kv| convert::decode(r.def, &kv.value, kv.mod_revision))
        .collect();
    Ok((items, rev, cont))
}

/// One page of matching stored values, unparsed where the selectors allow.
pub(crate) async fn list_raw(
    api: &ApiServer,
    r: &Req,
) -> ApiResult<(Vec<KeyValue>, i64, Option<String>)> {
    let (ls, fs) = selectors(r)?;
    let prefix = r.def.prefix(r.ns.as_deref());
    let limit: usize = match r.query.get("limit") {
        Some(l) => l
            .parse()
            .map_err(|_| ApiError::bad_request(format!("invalid limit {l:?}")))?,
        None => 0,
    };
    let (mut revision, mut start_after) = match r.query.get("continue") {
        Some(tok) => {
            let (rev, key) = decode_continue(tok, &prefix)?;
            (Some(rev), Some(key))
        }
        None => (None, None),
    };
    let select_all = ls.is_empty() && fs.is_empty();
    // Labels, names and namespaces are checked on a metadata-only parse.
    let cheap = fs.metadata_only();
    let matches = |kv: &KeyValue| -> bool {
        if select_all {
            return true;
        }
        let obj = if cheap {
            objects::lite_metadata(&kv.value)
        } else {
            convert::decode(r.def, &kv.value, kv.mod_revision)
        };
        obj.is_some_and(|o| ls.matches(&o) && fs.matches(&o))
    };
    let mut items = Vec::new();
    loop {
        // With a selector most keys may not match: read bigger pages.
        let fetch = if limit > 0 && !select_all {
            (limit * 4).max(500)
        } else {
            limit
        };
        let page = match api
            .store
            .list(&prefix, start_after.as_deref(), fetch, revision)
            .await
        {
            Ok(p) => p,
            Err(store::Error::Compacted { .. }) if r.query.get("continue").is_some() => {
                return Err(ApiError::gone("The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list."));
            }
            Err(e) => return Err(store_err(r, e)),
        };
        revision = Some(page.revision);
        let n = page.kvs.len();
        for (i, kv) in page.kvs.into_iter().enumerate() {
            start_after = Some(kv.key.clone());
            if matches(&kv) {
                let key = kv.key.clone();
                items.push(kv);
                if limit > 0 && items.len() == limit {
                    let more = i + 1 < n || page.more;
                    let tok = more.then(|| encode_continue(page.revision, &key));
                    return Ok((items, page.revision, tok));
                }
            }
        }
        if !page.more || n == 0 {
            return Ok((items, page.revision, None));
        }
    }
}

pub(crate) async fn list(api: &Arc<ApiServer>, r: &Req) -> ApiResult<Response<Body>> {
    let (kvs, rev, cont) = list_raw(api, r).await?;
    let mut meta = json!({"resourceVersion": rev.to_string()});
    if let Some(c) = cont {
        meta["continue"] = json!(c);
    }
    if table::wants_table(r.accept()) || table::wants_metadata(r.accept()) {
        let items: Vec<Value> = kvs
            .iter()
            .filter_map(|kv| convert::decode(r.def, &kv.value, kv.mod_revision))
            .collect();
        if table::wants_table(r.accept()) {
            let inc = r.query.get("includeObject").unwrap_or("Metadata");
            return Ok(json_response(
                200,
                &table::table(r.def, &items, meta, inc, true),
            ));
        }
        let items: Vec<Value> = items.iter().map(table::partial_metadata).collect();
        return Ok(json_response(
            200,
            &json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "items": items}),
        ));
    }
    // The common case: splice stored bytes into the list without parsing
    // them (memory and CPU stay proportional to the bytes, not the objects).
    let mut body =
        Vec::with_capacity(kvs.iter().map(|kv| kv.value.len() + 32).sum::<usize>() + 256);
    body.extend_from_slice(
        format!(
            r#"{{"kind":"{}","apiVersion":"{}","metadata":{},"items":["#,
            r.def.list_kind(),
            r.def.api_version(),
            meta
        )
        .as_bytes(),
    );
    let mut first = true;
    for kv in &kvs {
        let spliced = if convert::converts(r.def) {
            None
        } else {
            objects::splice_resource_version(&kv.value, kv.mod_revision)
        };
        let item = match spliced {
            Some(b) => b,
            None => match convert::decode(r.def, &kv.value, kv.mod_revision) {
                Some(v) => serde_json::to_vec(&v).unwrap_or_default(),
                None => continue,
            },
        };
        if !first {
            body.push(b',');
        }
        first = false;
        body.extend_from_slice(&item);
    }
    body.extend_from_slice(b"]}");
    Ok(super::bytes_response(200, body))
}

/// Unknown fields under `fieldValidation`: Strict fails, Warn (the
/// default) warns, Ignore drops them silently. Returns the warnings.
fn field_validation(r: &Req, unknown: &[String]) -> ApiResult<Vec<String>> {
    if unknown.is_empty() {
        return Ok(Vec::new());
    }
    let msgs: Vec<String> = unknown
        .iter()
        .map(|f| format!("unknown field {f:?}"))
        .collect();
    match r.query.get("fieldValidation").unwrap_or("Warn") {
        "Strict" => Err(ApiError::bad_request(format!(
            "strict decoding error: {}",
            msgs.join(", ")
        ))),
        "Ignore" => Ok(Vec::new()),
        _ => Ok(msgs),
    }
}

/// Decode through the typed model; returns the canonical object and the
/// fieldValidation warnings.
fn typed(r: &Req, obj: &Value) -> ApiResult<(Value, Vec<String>)> {
    let (canonical, unknown) = validation::decode_typed(r.def, obj).map_err(|e| {
        ApiError::bad_request(format!(
            "{} in version {:?} cannot be handled as a {}: {e}",
            r.def.kind,
            r.def.api_version(),
            r.def.kind
        ))
    })?;
    let warnings = field_validation(r, &unknown)?;
    Ok((canonical, warnings))
}

fn is_dry_run(r: &Req) -> bool {
    r.query.0.get("dryRun").is_some_and(|v| v == "All")
}

/// Namespace lifecycle admission: the namespace must exist and not be
/// terminating for anything to be created in it.
async fn check_namespace(api: &ApiServer, ns: &str) -> ApiResult<()> {
    // A namespace seen active within the last second is taken as still
    // active (upstream's lifecycle admission reads an informer cache, which
    // lags the same way); deletes of namespaces clear the entry.
    if api.namespace_recently_active(ns) {
        return Ok(());
    }
    let key = format!("/registry/core/namespaces/{ns}");
    let kv = api.store.get(&key).await.map_err(ApiError::from)?;
    let Some(kv) = kv else {
        return Err(ApiError::not_found("", "namespaces", ns));
    };
    let v: Value = serde_json::from_slice(&kv.value).unwrap_or(Value::Null);
    if objects::has_deletion_timestamp(&v) || v["status"]["phase"] == "Terminating" {
        return Err(ApiError {
            details: Some(
                json!({"name": ns, "kind": "namespaces", "causes": [{"reason": "NamespaceTerminating", "message": format!("namespace {ns} is being terminated"), "field": "metadata.namespace"}]}),
            ),
            ..ApiError::forbidden(format!(
                "unable to create new content in namespace {ns} because it is being terminated"
            ))
        });
    }
    api.note_namespace_active(ns);
    Ok(())
}

pub(crate) async fn create(
    api: &Arc<ApiServer>,
    r: &Req,
    body: Bytes,
) -> ApiResult<Response<Body>> {
    // The common case first: a JSON body that the kind's model takes whole
    // is decoded once, straight into it.
    let json = media_type(r.content_type()) == "application/json";
    let (obj, canonical) = match json.then(|| validation::decode_json_body(r.def, &body)) {
        Some(Some(obj)) => (obj, true),
        _ => (decode_body(&body, r.content_type())?, false),
    };
    let (obj, warnings, stored) = create_value_stored(api, r, obj, canonical).await?;
    // The plain JSON answer is the bytes just stored with the revision
    // spliced in: no second serialization of the object.
    let plain = !convert::converts(r.def)
        && !table::wants_table(r.accept())
        && !table::wants_metadata(r.accept());
    if let Some(b) = stored
        .filter(|_| plain)
        .and_then(|(bytes, rev)| objects::splice_resource_version(&bytes, rev))
    {
        return Ok(with_warnings(super::bytes_response(201, b), &warnings));
    }
    Ok(with_warnings(object_response(r, 201, &obj), &warnings))
}

/// The create pipeline for an already decoded body.
pub(crate) async fn create_value(
    api: &ApiServer,
    r: &Req,
    obj: Value,
) -> ApiResult<(Value, Vec<String>)> {
    let (obj, warnings, _) = create_value_stored(api, r, obj, false).await?;
    Ok((obj, warnings))
}

/// [`create_value`], also returning the stored bytes and their revision
/// (None on a dry run). `canonical`: `obj` already came out of the kind's
/// typed model, with no field it lacks.
#[allow(clippy::type_complexity)]
async fn create_value_stored(
    api: &ApiServer,
    r: &Req,
    mut obj: Value,
    canonical: bool,
) -> ApiResult<(Value, Vec<String>, Option<(Vec<u8>, i64)>)> {
    let def = r.def;
    check_type_meta(def, &mut obj)?;
    let body_ns = objects::namespace(&obj).map(String::from);
    if def.namespaced {
        let ns =
            r.ns.clone()
                .or(body_ns.clone())
                .ok_or_else(|| ApiError::bad_request("the namespace of the object must be set"))?;
        if body_ns.as_ref().is_some_and(|b| *b != ns) {
            return Err(ApiError::bad_request("the namespace of the provided object does not match the namespace sent on the request"));
        }
        meta_mut(&mut obj).insert("namespace".into(), json!(ns));
    } else {
        meta_mut(&mut obj).remove("namespace");
    }
    if objects::name(&obj).is_none() {
        match objects::meta_str(&obj, "generateName") {
            Some(g) => {
                let name = format!("{g}{}", objects::random_suffix(5));
                meta_mut(&mut obj).insert("name".into(), json!(name));
            }
            None => {
                return Err(ApiError::invalid(
                    def.kind,
                    def.group,
                    "",
                    vec![Cause::required("metadata.name")],
                ));
            }
        }
    }
    let name = objects::name(&obj).unwrap_or_default().to_string();
    let (mut obj, warnings) = if canonical {
        (obj, Vec::new())
    } else {
        typed(r, &obj)?
    };
    {
        let m = meta_mut(&mut obj);
        m.insert("uid".into(), json!(objects::new_uid()));
        m.insert("creationTimestamp".into(), json!(objects::now_rfc3339()));
        for k in [
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
            "managedFields",
        ] {
            m.remove(k);
        }
        if def.status {
            m.insert("generation".into(), json!(1));
        } else {
            m.remove("generation");
        }
    }
    reset_status_on_create(def, &mut obj);
    defaults::apply(def, &mut obj);
    defaults::default_tolerations(def, &mut obj, &api.default_toleration_seconds);
    if def.is("batch", "jobs") {
        job_selector(&mut obj);
    }
    let causes = validation::validate(def, &obj);
    if !causes.is_empty() {
        return Err(ApiError::invalid(def.kind, def.group, &name, causes));
    }
    if let Some(node) = r.node() {
        super::node_admit(node, &r.attrs, None, Some(&obj)).map_err(ApiError::forbidden)?;
    }
    if def.namespaced {
        check_namespace(api, objects::namespace(&obj).unwrap_or_default()).await?;
    }
    let allocated = if def.is("", "services") {
        allocate_service(api, &mut obj, None)?
    } else {
        Vec::new()
    };
    if is_dry_run(r) {
        release(api, &allocated);
        return Ok((obj, warnings, None));
    }
    let key = def.key(objects::namespace(&obj), &name);
    match api.store.create(&key, convert::encode(def, &obj)).await {
        Ok(kv) => {
            meta_mut(&mut obj).insert("resourceVersion".into(), json!(kv.mod_revision.to_string()));
            Ok((obj, warnings, Some((kv.value, kv.mod_revision))))
        }
        Err(e) => {
            release(api, &allocated);
            Err(ApiError::from_store(e, def.group, def.plural, &name))
        }
    }
}

/// Status is the controllers' to write: a new object starts with an empty
/// one (nodes keep theirs: the kubelet registers with its capacity).
fn reset_status_on_create(def: &ResourceDef, obj: &mut Value) {
    match (def.group, def.kind) {
        ("", "Pod") => obj["status"] = json!({"phase": "Pending", "qosClass": qos_class(obj)}),
        ("", "Node") | ("", "Namespace") => {}
        ("", "Service") => obj["status"] = json!({"loadBalancer": {}}),
        _ if def.status => {
            if let Some(m) = obj.as_object_mut() {
                m.insert("status".into(), json!({}));
            }
        }
        _ => {}
    }
}

/// The pod's QoS class, computed from requests and limits as upstream does.
fn qos_class(pod: &Value) -> &'static str {
    let cs: Vec<&Value> = ["containers", "initContainers"]
        .iter()
        .flat_map(|f| pod["spec"][*f].as_array().into_iter().flatten())
        .collect();
    let mut any = false;
    let mut guaranteed = true;
    for c in &cs {
        let req = c["resources"]["requests"].as_object();
        let lim = c["resources"]["limits"].as_object();
        if req.is_some_and(|m| !m.is_empty()) || lim.is_some_and(|m| !m.is_empty()) {
            any = true;
        }
        for res in ["cpu", "memory"] {
            let l = lim.and_then(|m| m.get(res));
            let q = req.and_then(|m| m.get(res)).or(l);
            if l.is_none() || q != l {
                guaranteed = false;
            }
        }
    }
    if !any {
        "BestEffort"
    } else if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

/// Jobs get a generated selector on their own uid (unless manualSelector),
/// and the template gets the matching labels.
fn job_selector(obj: &mut Value) {
    if obj["spec"]["manualSelector"].as_bool() == Some(true) {
        return;
    }
    let uid = obj["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let name = obj["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    obj["spec"]["selector"] = json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}});
    let tmpl = &mut obj["spec"]["template"];
    if !tmpl["metadata"].is_object() {
        tmpl["metadata"] = json!({});
    }
    if !tmpl["metadata"]["labels"].is_object() {
        tmpl["metadata"]["labels"] = json!({});
    }
    let labels = &mut tmpl["metadata"]["labels"];
    labels["batch.kubernetes.io/controller-uid"] = json!(uid);
    labels["batch.kubernetes.io/job-name"] = json!(name);
    labels["controller-uid"] = json!(uid);
    labels["job-name"] = json!(name);
}

/// What was allocated for a service, to release on failure.
#[derive(Debug)]
pub(crate) enum Allocated {
    Ip(String),
    Port(u16),
}

fn release(api: &ApiServer, allocated: &[Allocated]) {
    for a in allocated {
        match a {
            Allocated::Ip(ip) => api.ips.release(ip),
            Allocated::Port(p) => api.ips.release_port(*p),
        }
    }
}

/// ClusterIP and NodePorts for a service; on update, `old` keeps its own.
pub(crate) fn allocate_service(
    api: &ApiServer,
    obj: &mut Value,
    old: Option<&Value>,
) -> ApiResult<Vec<Allocated>> {
    let name = objects::name(obj).unwrap_or_default().to_string();
    let invalid = |field: &str, value: &str, e: super::ipalloc::Error| {
        ApiError::invalid(
            "Service",
            "",
            &name,
            vec![Cause::invalid(field, value, &e.to_string())],
        )
    };
    let mut out = Vec::new();
    let ty = obj["spec"]["type"]
        .as_str()
        .unwrap_or("ClusterIP")
        .to_string();
    if ty == "ExternalName" {
        return Ok(out);
    }
    let old_ip = old
        .and_then(|o| o["spec"]["clusterIP"].as_str())
        .unwrap_or_default()
        .to_string();
    let want = obj["spec"]["clusterIP"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let ip = if !old_ip.is_empty() && (want.is_empty() || want == old_ip) {
        old_ip
    } else if !old_ip.is_empty() {
        return Err(ApiError::invalid(
            "Service",
            "",
            &name,
            vec![Cause::invalid(
                "spec.clusterIPs[0]",
                &want,
                "may not change once set",
            )],
        ));
    } else if want == "None" {
        "None".to_string()
    } else {
        let want_ip = if want.is_empty() {
            None
        } else {
            Some(want.parse().map_err(|_| {
                ApiError::invalid(
                    "Service",
                    "",
                    &name,
                    vec![Cause::invalid(
                        "spec.clusterIP",
                        &want,
                        "must be a valid IP address",
                    )],
                )
            })?)
        };
        let ip = api
            .ips
            .allocate(want_ip)
            .map_err(|e| invalid("spec.clusterIPs", &want, e))?
            .to_string();
        out.push(Allocated::Ip(ip.clone()));
        ip
    };
    obj["spec"]["clusterIP"] = json!(ip);
    obj["spec"]["clusterIPs"] = json!([ip]);
    if ip != "None" || obj["spec"]["ipFamilies"].is_null() {
        obj["spec"]["ipFamilies"] = json!(["IPv4"]);
        obj["spec"]["ipFamilyPolicy"] = json!("SingleStack");
    }
    if matches!(ty.as_str(), "NodePort" | "LoadBalancer") {
        let old_ports: Vec<(i64, i64)> = old
            .and_then(|o| o["spec"]["ports"].as_array())
            .into_iter()
            .flatten()
            .filter_map(|p| Some((p["port"].as_i64()?, p["nodePort"].as_i64()?)))
            .collect();
        if let Some(ports) = obj["spec"]["ports"].as_array_mut() {
            for (i, p) in ports.iter_mut().enumerate() {
                let port = p["port"].as_i64().unwrap_or(0);
                let keep = old_ports
                    .iter()
                    .find(|(op, _)| *op == port)
                    .map(|(_, np)| *np);
                // 0 means "unset" (protobuf clients send it for an absent port).
                match (p["nodePort"].as_i64().filter(|n| *n != 0), keep) {
                    (Some(np), Some(k)) if np == k => {}
                    (None, Some(k)) => p["nodePort"] = json!(k),
                    (want, _) => {
                        let np = api.ips.allocate_port(want.map(|w| w as u16)).map_err(|e| {
                            invalid(
                                &format!("spec.ports[{i}].nodePort"),
                                &want.unwrap_or(0).to_string(),
                                e,
                            )
                        })?;
                        out.push(Allocated::Port(np));
                        p["nodePort"] = json!(np);
                    }
                }
            }
        }
    }
    Ok(out)
}

fn release_service(api: &ApiServer, svc: &Value) {
    if let Some(ip) = svc["spec"]["clusterIP"].as_str() {
        api.ips.release(ip);
    }
    for p in svc["spec"]["ports"].as_array().into_iter().flatten() {
        if let Some(np) = p["nodePort"].as_i64() {
            api.ips.release_port(np as u16);
        }
    }
}

/// Merge an incoming object into the stored one the way upstream's update
/// strategies do. `sub` is `Some("status")` for the status subresource.
pub(crate) fn prepare_update(
    def: &ResourceDef,
    sub: Option<&str>,
    old: &Value,
    new: Value,
) -> Value {
    let mut new = new;
    if sub == Some("status") {
        // Status writes change status only (ResetObjectMetaForStatus).
        let mut out = old.clone();
        out["status"] = new.get("status").cloned().unwrap_or(Value::Null);
        return out;
    }
    if def.status {
        match old.get("status") {
            Some(s) => new["status"] = s.clone(),
            None => {
                if let Some(m) = new.as_object_mut() {
                    m.remove("status");
                }
            }
        }
    }
    let om = old.get("metadata").cloned().unwrap_or(json!({}));
    {
        let m = meta_mut(&mut new);
        for k in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "namespace",
            "name",
            "generation",
        ] {
            match om.get(k) {
                Some(v) => m.insert(k.to_string(), v.clone()),
                None => m.remove(k),
            };
        }
    }
    if def.status && old.get("spec") != new.get("spec") {
        let g = old["metadata"]["generation"].as_i64().unwrap_or(0) + 1;
        meta_mut(&mut new).insert("generation".into(), json!(g));
    }
    if def.is("batch", "jobs") && new["spec"]["selector"].is_null() {
        new["spec"]["selector"] = old["spec"]["selector"].clone();
    }
    // A CSR's spec is what was requested, and by whom: it never changes.
    if def.is("", "namespaces") || def.is("certificates.k8s.io", "certificatesigningrequests") {
        new["spec"] = old["spec"].clone();
    }
    new
}

/// Outcome of one optimistic write attempt.
pub(crate) enum Attempt {
    Done(Value),
    Retry,
}

/// Write `new` over the stored `cur`, then finish a deletion that just lost
/// its last finalizer. `precondition` is a client-given resourceVersion.
pub(crate) async fn write_update(
    api: &ApiServer,
    r: &Req,
    cur: &KeyValue,
    old: &Value,
    mut new: Value,
    precondition: bool,
) -> ApiResult<Attempt> {
    let def = r.def;
    let name = r.name().to_string();
    if r.sub.is_none() {
        defaults::apply(def, &mut new);
    }
    let causes = validation::validate(def, &new);
    if !causes.is_empty() {
        return Err(ApiError::invalid(def.kind, def.group, &name, causes));
    }
    if let Some(node) = r.node() {
        super::node_admit(node, &r.attrs, Some(old), Some(&new)).map_err(ApiError::forbidden)?;
    }
    let allocated = if def.is("", "services") && r.sub.is_none() {
        allocate_service(api, &mut new, Some(old))?
    } else {
        Vec::new()
    };
    if is_dry_run(r) {
        release(api, &allocated);
        return Ok(Attempt::Done(new));
    }
    // Finalizers gone from an object being deleted: it goes now.
    let finished = objects::has_deletion_timestamp(&new)
        && objects::finalizers(&new).is_empty()
        && !(def.is("", "pods")
            && new["metadata"]["deletionGracePeriodSeconds"]
                .as_i64()
                .unwrap_or(0)
                > 0)
        && !(def.is("", "namespaces")
            && new["spec"]["finalizers"]
                .as_array()
                .is_some_and(|f| !f.is_empty()));
    let result = api
        .store
        .update(&cur.key, convert::encode(def, &new), cur.mod_revision)
        .await;
    match result {
        Ok(kv) => {
            meta_mut(&mut new).insert("resourceVersion".into(), json!(kv.mod_revision.to_string()));
            if finished {
                match api.store.delete(&kv.key, Some(kv.mod_revision)).await {
                    Ok(_) => {
                        if def.is("", "services") {
                            release_service(api, &new);
                        }
                    }
                    Err(store::Error::Conflict { .. } | store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(store_err(r, e)),
                }
            }
            Ok(Attempt::Done(new))
        }
        Err(store::Error::Conflict { .. }) if !precondition => {
            release(api, &allocated);
            Ok(Attempt::Retry)
        }
        Err(e) => {
            release(api, &allocated);
            Err(store_err(r, e))
        }
    }
}

pub(crate) async fn update(
    api: &Arc<ApiServer>,
    r: &Req,
    body: Bytes,
) -> ApiResult<Response<Body>> {
    let mut obj = decode_body(&body, r.content_type())?;
    check_type_meta(r.def, &mut obj)?;
    if let Some(n) = objects::name(&obj) {
        if n != r.name() {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({})",
                r.name()
            )));
        }
    }
    meta_mut(&mut obj).insert("name".into(), json!(r.name()));
    if let (Some(ns), Some(bns)) = (r.ns.as_deref(), objects::namespace(&obj)) {
        if ns != bns {
            return Err(ApiError::bad_request("the namespace of the provided object does not match the namespace sent on the request"));
        }
    }
    let (obj, warnings) = typed(r, &obj)?;
    let sent_rv = objects::meta_str(&obj, "resourceVersion").map(String::from);
    for _ in 0..RETRIES {
        let (cur, old) = get_object(api, r).await?;
        if let Some(rv) = &sent_rv {
            if *rv != cur.mod_revision.to_string() {
                return Err(ApiError::stale(r.def.group, r.def.plural, r.name()));
            }
        }
        let new = prepare_update(r.def, r.sub.as_deref(), &old, obj.clone());
        if let Attempt::Done(v) = write_update(api, r, &cur, &old, new, sent_rv.is_some()).await? {
            return Ok(with_warnings(object_response(r, 200, &v), &warnings));
        }
    }
    Err(ApiError::stale(r.def.group, r.def.plural, r.name()))
}

pub(crate) async fn patch(api: &Arc<ApiServer>, r: &Req, body: Bytes) -> ApiResult<Response<Body>> {
    let pt = PatchType::from_content_type(r.content_type())
        .ok_or_else(|| ApiError::unsupported_media(r.content_type()))?;
    if body.is_empty() {
        return Err(ApiError::bad_request("the patch body is empty"));
    }
    for _ in 0..RETRIES {
        let (cur, old) = match get_object(api, r).await {
            Ok(x) => x,
            // Server-side apply creates what is missing.
            Err(e) if e.code == 404 && pt == PatchType::Apply && r.sub.is_none() => {
                let obj = decode_body(&body, "application/yaml")?;
                let (obj, warnings) = create_value(api, r, obj).await?;
                return Ok(with_warnings(object_response(r, 201, &obj), &warnings));
            }
            Err(e) => return Err(e),
        };
        let patched = patch::apply(&old, &body, pt, r.def.kind).map_err(|e| match e {
            patch::Error::Malformed(m) => ApiError::bad_request(m),
            patch::Error::Apply(m) => ApiError::new(422, "Invalid", m),
        })?;
        let mut patched = patched;
        check_type_meta(r.def, &mut patched)?;
        let patched_rv = objects::meta_str(&patched, "resourceVersion").map(String::from);
        let precondition = patched_rv
            .as_deref()
            .is_some_and(|rv| rv != cur.mod_revision.to_string());
        if precondition {
            return Err(ApiError::stale(r.def.group, r.def.plural, r.name()));
        }
        if objects::name(&patched) != Some(r.name()) {
            return Err(ApiError::bad_request(
                "the patch may not change metadata.name",
            ));
        }
        let (patched, warnings) = typed(r, &patched)?;
        let new = prepare_update(r.def, r.sub.as_deref(), &old, patched);
        if let Attempt::Done(v) = write_update(api, r, &cur, &old, new, false).await? {
            return Ok(with_warnings(object_response(r, 200, &v), &warnings));
        }
    }
    Err(ApiError::stale(r.def.group, r.def.plural, r.name()))
}

/// DeleteOptions from the body and query.
#[derive(Debug, Default, Clone)]
pub(crate) struct DeleteOptions {
    pub grace: Option<i64>,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub propagation: Option<String>,
}

pub(crate) fn delete_options(r: &Req, body: &[u8]) -> ApiResult<DeleteOptions> {
    let mut o = DeleteOptions::default();
    if !body.is_empty() {
        let v: Value = serde_json::from_slice(body)
            .or_else(|_| serde_yaml::from_slice(body))
            .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?;
        o.grace = v["gracePeriodSeconds"].as_i64();
        o.uid = v["preconditions"]["uid"].as_str().map(String::from);
        o.resource_version = v["preconditions"]["resourceVersion"]
            .as_str()
            .map(String::from);
        o.propagation = v["propagationPolicy"].as_str().map(String::from);
        if v["orphanDependents"].as_bool() == Some(true) && o.propagation.is_none() {
            o.propagation = Some("Orphan".into());
        }
    }
    if let Some(g) = r.query.get("gracePeriodSeconds") {
        o.grace = Some(
            g.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid gracePeriodSeconds {g:?}")))?,
        );
    }
    if let Some(p) = r.query.get("propagationPolicy") {
        o.propagation = Some(p.to_string());
    }
    if let Some(p) = &o.propagation {
        if !matches!(p.as_str(), "Orphan" | "Background" | "Foreground") {
            return Err(ApiError::bad_request(format!(
                "invalid propagationPolicy {p:?}: must be Orphan, Background or Foreground"
            )));
        }
    }
    Ok(o)
}

pub(crate) async fn delete(
    api: &Arc<ApiServer>,
    r: &Req,
    body: Bytes,
) -> ApiResult<Response<Body>> {
    let opts = delete_options(r, &body)?;
    let obj = delete_one(api, r, &opts).await?;
    Ok(object_response(r, 200, &obj))
}

/// Delete the object `r` names (gracefully, or marking it when finalizers
/// or a grace period hold it back). Returns what the client is shown.
pub(crate) async fn delete_one(api: &ApiServer, r: &Req, opts: &DeleteOptions) -> ApiResult<Value> {
    for _ in 0..RETRIES {
        let (cur, old) = get_object(api, r).await?;
        if let Some(uid) = &opts.uid {
            let have = objects::meta_str(&old, "uid").unwrap_or_default();
            if uid != have {
                return Err(ApiError::conflict(r.def.group, r.def.plural, r.name(), &format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {have}")));
            }
        }
        if let Some(rv) = &opts.resource_version {
            if *rv != cur.mod_revision.to_string() {
                return Err(ApiError::conflict(r.def.group, r.def.plural, r.name(), &format!("Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}", cur.mod_revision)));
            }
        }
        if let Some(node) = r.node() {
            super::node_admit(node, &r.attrs, Some(&old), None).map_err(ApiError::forbidden)?;
        }
        let mut marked = old.clone();
        let mut keep = false;
        let now = objects::now_rfc3339();
        if r.def.is("", "namespaces") {
            api.forget_namespace(r.name());
            // The namespace controller empties it, then clears spec.finalizers.
            if !objects::has_deletion_timestamp(&old) {
                meta_mut(&mut marked).insert("deletionTimestamp".into(), json!(now));
                meta_mut(&mut marked).insert("deletionGracePeriodSeconds".into(), json!(0));
            }
            marked["status"]["phase"] = json!("Terminating");
            keep = marked["spec"]["finalizers"]
                .as_array()
                .is_some_and(|f| !f.is_empty())
                || !objects::finalizers(&marked).is_empty();
        } else {
            let mut finalizers = objects::finalizers(&old);
            let add = match opts.propagation.as_deref() {
                Some("Foreground") => Some("foregroundDeletion"),
                Some("Orphan") => Some("orphan"),
                _ => None,
            };
            if let Some(f) = add {
                if !objects::has_deletion_timestamp(&old) && !finalizers.iter().any(|x| x == f) {
                    finalizers.push(f.to_string());
                    meta_mut(&mut marked).insert("finalizers".into(), json!(finalizers));
                }
            }
            if r.def.is("", "pods") {
                let grace = pod_grace(&old, opts.grace);
                if grace > 0 {
                    let current = old["metadata"]["deletionGracePeriodSeconds"].as_i64();
                    // A second delete may only shorten the grace period.
                    if current.is_none_or(|c| grace < c) {
                        let at = chrono::Utc::now() + chrono::Duration::seconds(grace);
                        let ts = at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
                        meta_mut(&mut marked).insert("deletionTimestamp".into(), json!(ts));
                        meta_mut(&mut marked)
                            .insert("deletionGracePeriodSeconds".into(), json!(grace));
                    }
                    keep = true;
                } else if objects::has_deletion_timestamp(&old) {
                    meta_mut(&mut marked).insert("deletionGracePeriodSeconds".into(), json!(0));
                }
            }
            if !finalizers.is_empty() {
                if !objects::has_deletion_timestamp(&marked) {
                    meta_mut(&mut marked).insert("deletionTimestamp".into(), json!(now));
                    let g = opts.grace.unwrap_or(0);
                    meta_mut(&mut marked).insert("deletionGracePeriodSeconds".into(), json!(g));
                }
                keep = true;
            }
        }
        if is_dry_run(r) {
            return Ok(marked);
        }
        if keep {
            if marked == old {
                return Ok(old);
            }
            match api
                .store
                .update(&cur.key, convert::encode(r.def, &marked), cur.mod_revision)
                .await
            {
                Ok(kv) => {
                    meta_mut(&mut marked)
                        .insert("resourceVersion".into(), json!(kv.mod_revision.to_string()));
                    return Ok(marked);
                }
                Err(store::Error::Conflict { .. }) => continue,
                Err(e) => return Err(store_err(r, e)),
            }
        }
        match api.store.delete(&cur.key, Some(cur.mod_revision)).await {
            Ok((_, rev)) => {
                if r.def.is("", "services") {
                    release_service(api, &old);
                }
                let mut shown = old;
                meta_mut(&mut shown).insert("resourceVersion".into(), json!(rev.to_string()));
                return Ok(shown);
            }
            Err(store::Error::Conflict { .. }) => continue,
            Err(e) => return Err(store_err(r, e)),
        }
    }
    Err(ApiError::stale(r.def.group, r.def.plural, r.name()))
}

/// The grace period a pod deletion gets: none for pods never bound to a
/// node or already finished (nothing runs that must stop).
fn pod_grace(pod: &Value, asked: Option<i64>) -> i64 {
    let bound = pod["spec"]["nodeName"]
        .as_str()
        .is_some_and(|n| !n.is_empty());
    let phase = pod["status"]["phase"].as_str().unwrap_or_default();
    if !bound || phase == "Succeeded" || phase == "Failed" {
        return 0;
    }
    let g = asked.unwrap_or_else(|| {
        pod["spec"]["terminationGracePeriodSeconds"]
            .as_i64()
            .unwrap_or(30)
    });
    // Upstream turns a requested 0 into 1 for bound pods unless forced; the
    // node then finishes the deletion right away. Honour 0 as immediate.
    g.max(0)
}

pub(crate) async fn delete_collection(
    api: &Arc<ApiServer>,
    r: &Req,
    body: Bytes,
) -> ApiResult<Response<Body>> {
    let opts = delete_options(r, &body)?;
    let (items, rev, _) = list_objects(api, r).await?;
    let mut deleted = Vec::new();
    for item in items {
        let one = Req {
            def: r.def,
            ns: objects::namespace(&item).map(String::from),
            name: objects::name(&item).map(String::from),
            sub: None,
            query: r.query.clone(),
            headers: r.headers.clone(),
            identity: r.identity.clone(),
            attrs: r.attrs.clone(),
        };
        match delete_one(api, &one, &opts).await {
            Ok(v) => deleted.push(v),
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(json_response(
        200,
        &json!({"kind": r.def.list_kind(), "apiVersion": r.def.api_version(), "metadata": {"resourceVersion": rev.to_string()}, "items": deleted}),
    ))
}

/// Resource definitions kubectl may name by kind in bodies (unused kinds
/// fall back to the URL's).
pub fn def_for(group: &str, kind: &str) -> Option<&'static ResourceDef> {
    resources::by_kind(group, kind)
}
