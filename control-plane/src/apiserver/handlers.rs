//! The verbs over the store: get, list, create, update, patch, delete,
//! deletecollection, with upstream's object semantics (uid, generation,
//! resourceVersion preconditions, status split, graceful deletion,
//! finalizers, namespace lifecycle).

use std::sync::Arc;

use axum::body::Body;
use bytes::Bytes;
use http::Response;
use serde_json::{json, Value};

use super::ipalloc::Allocation;
use super::objects::{self, meta_mut};
use super::patch::PatchType;
use super::resources::ResourceDef;
use super::selectors::{FieldSelector, LabelSelector};
use super::status::{ApiError, ApiResult, Cause};
use super::{admission, convert, model, options, order, server_side_apply, table, validation};
use super::{
    check_type_meta, decode_body, json_response, media_type, with_warnings, ApiServer, Req,
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
    let obj = convert::served_one(api, r.def, obj).await?;
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
    let fs = FieldSelector::parse(
        r.query.get("fieldSelector").unwrap_or(""),
        r.def.strategy.selectable_fields(),
    )
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
    let items = convert::served(api, r.def, items).await?;
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
    let rv = options::resource_version(&r.query)?;
    let exact = options::exact_match(&r.query, rv)?;
    let (mut revision, mut start_after) = match r.query.get("continue") {
        Some(tok) => {
            let (rev, key) = decode_continue(tok, &prefix)?;
            (Some(rev), Some(key))
        }
        // Any other resourceVersion is served by the newest state, which is
        // never older than it (NotOlderThan, upstream's default).
        None if exact => (rv, None),
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
            Err(store::Error::Compacted {
                requested,
                compacted,
            }) if exact => {
                return Err(ApiError::gone(format!(
                    "too old resource version: {requested} ({compacted})"
                )));
            }
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
        let items = convert::served(api, r.def, items).await?;
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
            r#"{{"kind":"{}","apiVersion":"{}","metadata":"#,
            r.def.list_kind(),
            r.def.api_version(),
        )
        .as_bytes(),
    );
    body.extend_from_slice(&order::typed_to_vec(&meta, "meta.ListMeta"));
    body.extend_from_slice(br#","items":["#);
    let mut first = true;
    let mut push = |item: &[u8]| {
        if !first {
            body.push(b',');
        }
        first = false;
        body.extend_from_slice(item);
    };
    if convert::converts(r.def) {
        let items = kvs
            .iter()
            .filter_map(|kv| convert::decode(r.def, &kv.value, kv.mod_revision))
            .collect();
        for item in convert::served(api, r.def, items).await? {
            push(&order::to_vec(&item));
        }
    } else {
        for kv in &kvs {
            if let Some(b) = objects::splice_resource_version(&kv.value, kv.mod_revision) {
                push(&b);
            } else if let Some(v) = convert::decode(r.def, &kv.value, kv.mod_revision) {
                push(&order::to_vec(&v));
            }
        }
    }
    body.extend_from_slice(b"]}");
    Ok(super::bytes_response(200, body))
}

/// Unknown or duplicate fields under `fieldValidation`: Strict fails,
/// Warn (the default) warns, Ignore drops them silently. `problems` are
/// messages like `unknown field "spec.x"`; returns the warnings.
fn field_validation(r: &Req, problems: Vec<String>) -> ApiResult<Vec<String>> {
    if problems.is_empty() {
        return Ok(Vec::new());
    }
    match r.query.get("fieldValidation").unwrap_or("Warn") {
        "Strict" => Err(ApiError::bad_request(format!(
            "strict decoding error: {}",
            problems.join(", ")
        ))),
        "Ignore" => Ok(Vec::new()),
        _ => Ok(problems),
    }
}

/// The write's options, validated, and what `fieldValidation` makes of
/// fields a JSON body names twice (which decoding would silently drop).
///
/// # Errors
/// 422 for bad options; 400 under Strict for a duplicate field.
fn check_write(r: &Req, write: options::Write, body: &[u8]) -> ApiResult<Vec<String>> {
    if options::write(&r.query, write)? == options::FieldValidation::Ignore
        || !media_type(r.content_type()).ends_with("json")
    {
        return Ok(Vec::new());
    }
    let duplicates = model::duplicate_fields(body)
        .into_iter()
        .map(|f| format!("duplicate field {f:?}"))
        .collect();
    field_validation(r, duplicates)
}

/// Decode through the typed model; returns the canonical object and the
/// fieldValidation warnings.
fn typed(r: &Req, obj: &Value) -> ApiResult<(Value, Vec<String>)> {
    let (canonical, unknown) = model::decode_typed(r.def, obj).map_err(|e| {
        ApiError::bad_request(format!(
            "{} in version {:?} cannot be handled as a {}: {e}",
            r.def.kind,
            r.def.api_version(),
            r.def.kind
        ))
    })?;
    let unknown = unknown
        .iter()
        .map(|f| format!("unknown field {f:?}"))
        .collect();
    let warnings = field_validation(r, unknown)?;
    Ok((canonical, warnings))
}

pub(crate) fn is_dry_run(r: &Req) -> bool {
    r.query.0.get("dryRun").is_some_and(|v| v == "All")
}

pub(crate) async fn create(
    api: &Arc<ApiServer>,
    r: &Req,
    body: Bytes,
) -> ApiResult<Response<Body>> {
    let mut warnings = check_write(r, options::Write::Create, &body)?;
    // The common case first: a JSON body that the kind's model takes whole
    // is decoded once, straight into it.
    let json = media_type(r.content_type()) == "application/json";
    let (obj, canonical) = match json.then(|| model::decode_json_body(r.def, &body)) {
        Some(Some(obj)) => (obj, true),
        _ => (decode_body(&body, r.content_type())?, false),
    };
    let (obj, more, stored) = create_value_stored(api, r, obj, canonical).await?;
    warnings.extend(more);
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
    let (mut obj, mut warnings) = if canonical {
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
        ] {
            m.remove(k);
        }
        if def.status {
            m.insert("generation".into(), json!(1));
        } else {
            m.remove("generation");
        }
    }
    def.strategy.prepare_for_create(r, &mut obj);
    def.strategy.default(&mut obj);
    if !server_side_apply::is_apply(r) {
        server_side_apply::record_update(r, &json!({}), &mut obj);
    }
    warnings.extend(admission::mutate_create(api, r, &mut obj).await?);
    let causes = validation::validate(def, &obj);
    if !causes.is_empty() {
        return Err(ApiError::invalid(def.kind, def.group, &name, causes));
    }
    warnings.extend(admission::validate_warn(api, r, None, Some(&obj)).await?);
    def.strategy.authorize_write(api, r, None, &obj).await?;
    let allocated = def.strategy.allocate(api, &mut obj, None)?;
    if is_dry_run(r) {
        allocated.release(&api.ips);
        return Ok((obj, warnings, None));
    }
    let key = def.key(objects::namespace(&obj), &name);
    let ttl = def.strategy.ttl(api);
    let bytes = match convert::encode_converted(api, def, &obj).await {
        Ok(b) => b,
        Err(e) => {
            allocated.release(&api.ips);
            return Err(e);
        }
    };
    match api.store.create_with_ttl(&key, bytes, ttl).await {
        Ok(kv) => {
            meta_mut(&mut obj).insert("resourceVersion".into(), json!(kv.mod_revision.to_string()));
            Ok((obj, warnings, Some((kv.value, kv.mod_revision))))
        }
        Err(e) => {
            allocated.release(&api.ips);
            Err(ApiError::from_store(e, def.group, def.plural, &name))
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
    def.strategy.prepare_for_update(old, &mut new);
    new
}

/// Outcome of one optimistic write attempt.
pub(crate) enum Attempt {
    Done(Value),
    Retry,
}

/// Write `new` over the stored `cur`, then finish a deletion that just lost
/// its last finalizer. `precondition` is a client-given resourceVersion.
/// Admission's warnings are not kept: callers that answer a client with
/// the object use [`write_update_warned`].
pub(crate) async fn write_update(
    api: &ApiServer,
    r: &Req,
    cur: &KeyValue,
    old: &Value,
    new: Value,
    precondition: bool,
) -> ApiResult<Attempt> {
    write_update_warned(api, r, cur, old, new, precondition, &mut Vec::new()).await
}

/// [`write_update`], adding admission's warnings to `warnings`.
pub(crate) async fn write_update_warned(
    api: &ApiServer,
    r: &Req,
    cur: &KeyValue,
    old: &Value,
    mut new: Value,
    precondition: bool,
    warnings: &mut Vec<String>,
) -> ApiResult<Attempt> {
    let def = r.def;
    let name = r.name().to_string();
    let main = r.sub.is_none();
    if main {
        def.strategy.default(&mut new);
    }
    // Ownership moves with what the client changed (defaults included, as
    // upstream defaults on decoding), not with what admission adds.
    if !server_side_apply::is_apply(r) {
        server_side_apply::record_update(r, old, &mut new);
    }
    warnings.extend(admission::mutate_update(api, r, old, &mut new).await?);
    if main {
        // What mutating admission added is defaulted too.
        def.strategy.default(&mut new);
    }
    let causes = if main {
        validation::validate_update(def, old, &new)
    } else {
        validation::validate_subresource_update(def, old, &new)
    };
    if !causes.is_empty() {
        return Err(ApiError::invalid(def.kind, def.group, &name, causes));
    }
    warnings.extend(admission::validate_warn(api, r, Some(old), Some(&new)).await?);
    def.strategy
        .authorize_write(api, r, Some(old), &new)
        .await?;
    let allocated = if main {
        def.strategy.allocate(api, &mut new, Some(old))?
    } else {
        Allocation::default()
    };
    if is_dry_run(r) {
        allocated.release(&api.ips);
        return Ok(Attempt::Done(new));
    }
    // Finalizers gone from an object being deleted: it goes now.
    let finished = objects::has_deletion_timestamp(&new)
        && objects::finalizers(&new).is_empty()
        && !def.strategy.holds_deletion(&new);
    let bytes = match convert::encode_converted(api, def, &new).await {
        Ok(b) => b,
        Err(e) => {
            allocated.release(&api.ips);
            return Err(e);
        }
    };
    let result = api
        .store
        .update_with_ttl(&cur.key, bytes, cur.mod_revision, def.strategy.ttl(api))
        .await;
    match result {
        Ok(kv) => {
            meta_mut(&mut new).insert("resourceVersion".into(), json!(kv.mod_revision.to_string()));
            if finished {
                match api.store.delete(&kv.key, Some(kv.mod_revision)).await {
                    Ok(_) => def.strategy.release(api, &new),
                    Err(store::Error::Conflict { .. } | store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(store_err(r, e)),
                }
            }
            Ok(Attempt::Done(new))
        }
        Err(store::Error::Conflict { .. }) if !precondition => {
            allocated.release(&api.ips);
            Ok(Attempt::Retry)
        }
        Err(e) => {
            allocated.release(&api.ips);
            Err(store_err(r, e))
        }
    }
}

pub(crate) async fn update(
    api: &Arc<ApiServer>,
    r: &Req,
    body: Bytes,
) -> ApiResult<Response<Body>> {
    let duplicates = check_write(r, options::Write::Update, &body)?;
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
    let (obj, mut warnings) = typed(r, &obj)?;
    warnings.extend(duplicates);
    let sent_rv = objects::meta_str(&obj, "resourceVersion").map(String::from);
    for _ in 0..RETRIES {
        let (cur, old) = get_object(api, r).await?;
        if let Some(rv) = &sent_rv {
            if *rv != cur.mod_revision.to_string() {
                return Err(ApiError::stale(r.def.group, r.def.plural, r.name()));
            }
        }
        let new = prepare_update(r.def, r.sub.as_deref(), &old, obj.clone());
        let mut admitted = Vec::new();
        let attempt =
            write_update_warned(api, r, &cur, &old, new, sent_rv.is_some(), &mut admitted);
        if let Attempt::Done(v) = attempt.await? {
            warnings.extend(admitted);
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
    let duplicates = check_write(r, options::Write::Patch(pt), &body)?;
    for _ in 0..RETRIES {
        let (cur, old) = match get_object(api, r).await {
            Ok(x) => x,
            // Server-side apply creates what is missing.
            Err(e) if e.code == 404 && pt == PatchType::Apply && r.sub.is_none() => {
                let obj = server_side_apply::apply(r, &json!({}), &body)?;
                let (obj, mut warnings) = create_value(api, r, obj).await?;
                warnings.extend(duplicates);
                return Ok(with_warnings(object_response(r, 201, &obj), &warnings));
            }
            Err(e) => return Err(e),
        };
        let mut patched = server_side_apply::patched(r, &old, &body, pt)?;
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
        let (patched, mut warnings) = typed(r, &patched)?;
        warnings.extend(duplicates.iter().cloned());
        let new = prepare_update(r.def, r.sub.as_deref(), &old, patched);
        let mut admitted = Vec::new();
        let attempt = write_update_warned(api, r, &cur, &old, new, false, &mut admitted);
        if let Attempt::Done(v) = attempt.await? {
            warnings.extend(admitted);
            return Ok(with_warnings(object_response(r, 200, &v), &warnings));
        }
    }
    Err(ApiError::stale(r.def.group, r.def.plural, r.name()))
}

/// DeleteOptions from the body and query.
#[derive(Debug, Default, Clone)]
pub struct DeleteOptions {
    pub grace: Option<i64>,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub propagation: Option<String>,
}

pub(crate) fn delete_options(r: &Req, body: &[u8]) -> ApiResult<DeleteOptions> {
    options::delete(&r.query)?;
    let mut o = DeleteOptions::default();
    if !body.is_empty() {
        // kubectl sends its delete and drain bodies as protobuf.
        let v: Value = if media_type(r.content_type()) == "application/vnd.kubernetes.protobuf" {
            decode_body(body, r.content_type())?
        } else {
            serde_json::from_slice(body)
                .or_else(|_| serde_saphyr::from_slice(body))
                .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?
        };
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
        admission::admit_delete(api, r, &old).await?;
        let mut marked = old.clone();
        let keep = r.def.strategy.mark_deleted(api, &mut marked, opts);
        if is_dry_run(r) {
            return Ok(marked);
        }
        if keep {
            if marked == old {
                return Ok(old);
            }
            let bytes = convert::encode_converted(api, r.def, &marked).await?;
            match api.store.update(&cur.key, bytes, cur.mod_revision).await {
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
                r.def.strategy.release(api, &old);
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
