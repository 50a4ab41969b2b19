//! Server-side apply (`application/apply-patch+yaml`) through the field
//! manager: the applied configuration merged into the live object by the
//! kind's list and map semantics, the applier's fields recorded in
//! `metadata.managedFields`, fields it dropped removed unless another
//! manager owns them, and changes to other managers' fields refused with
//! upstream's 409 unless `force=true`.
//!
//! Every other write (create, update, non-apply patch, on the main
//! resource or a subresource) is recorded by [`record_update`] as an
//! `Update` entry owning what it changed, so an apply that would undo it
//! conflicts (`kubectl edit`, then `kubectl apply --server-side`).
//!
//! kubectl (1.26+) moves a client-side applier's ownership to its
//! server-side one itself, with a JSON patch of `managedFields`: a write
//! that sets managedFields is taken at its word, as upstream.

use serde_json::{json, Value};

use super::fieldmanager::{self, ApplyError, ManagedFields, Shape, Writer};
use super::patch::{self, PatchType};
use super::resources::ResourceDef;
use super::status::{ApiError, ApiResult};
use super::{decode_body, objects, Req};

/// The shape of `def`'s objects: a definition's schema for custom kinds,
/// the built-in table otherwise.
fn with_shape<T>(def: &ResourceDef, f: impl FnOnce(Shape) -> T) -> T {
    match def.model.and_then(|m| m.json_schema()) {
        Some(schema) => f(Shape::from_openapi(&schema)),
        None => f(Shape::builtin(def.kind)),
    }
}

/// The applied configuration in `body`, checked against the request.
fn config(r: &Req, body: &[u8]) -> ApiResult<Value> {
    let config = decode_body(body, "application/yaml")?;
    if !config.is_object() {
        return Err(ApiError::bad_request(
            "the patch body must be a JSON object",
        ));
    }
    let gv = r.def.api_version();
    let (api_version, kind) = (
        config["apiVersion"].as_str().unwrap_or_default(),
        config["kind"].as_str().unwrap_or_default(),
    );
    if api_version.is_empty() || kind.is_empty() {
        return Err(ApiError::bad_request(
            "invalid object type: apiVersion and kind must be set for an apply patch",
        ));
    }
    if api_version != gv || kind != r.def.kind {
        return Err(ApiError::bad_request(format!(
            "the apply patch is for {api_version}, Kind={kind}, not {gv}, Kind={}",
            r.def.kind
        )));
    }
    Ok(config)
}

/// The manager a write is recorded under: `fieldManager`, else the
/// client's User-Agent up to its first `/` (upstream
/// `prefixFromUserAgent`), at most 128 characters.
fn manager(r: &Req) -> String {
    if let Some(m) = r.query.get("fieldManager") {
        return m.to_string();
    }
    let agent = (r.headers.get(http::header::USER_AGENT))
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let prefix = agent.split('/').next().unwrap_or_default();
    prefix.chars().take(128).collect()
}

/// The writer of `r`: its manager, version and subresource, and the
/// fields its (sub)resource resets (`status` for the main resource of
/// kinds with one).
fn writer(r: &Req, api_version: &str) -> Writer {
    let mut writer = Writer::new(manager(r), api_version);
    writer.subresource = r.sub.clone().unwrap_or_default();
    if r.def.status && r.sub.is_none() {
        writer
            .reset
            .insert(&fieldmanager::Path::fields(&["status"]).0);
    }
    writer
}

/// Whether `r` is a server-side apply, which records its own ownership.
pub fn is_apply(r: &Req) -> bool {
    r.attrs.verb == "patch"
        && super::patch::PatchType::from_content_type(r.content_type())
            == Some(super::patch::PatchType::Apply)
}

/// Record a write that is not an apply: `new` (what will be stored, `old`
/// `{}` for a create) gets the managers it came with, when it set them
/// and the write is to the main resource (upstream `decodeLiveOrNew`:
/// `[]` clears them), else `old`'s, with the writer's `Update` entry
/// owning what changed.
///
/// Never fails a write: objects whose lists cannot be keyed lose their
/// managedFields, as upstream.
pub fn record_update(r: &Req, old: &Value, new: &mut Value) {
    let sent = &new["metadata"]["managedFields"];
    let managers = match sent {
        Value::Array(a) if a.is_empty() || a == &[json!({})] => Ok(ManagedFields::default()),
        _ if r.sub.is_some() => ManagedFields::decode(&old["metadata"]["managedFields"]),
        _ => match ManagedFields::decode(sent) {
            Ok(m) if m.iter().next().is_some() => Ok(m),
            _ => ManagedFields::decode(&old["metadata"]["managedFields"]),
        },
    };
    let api_version = r.def.api_version();
    let writer = writer(r, &api_version);
    let updated = with_shape(r.def, |shape| {
        let managers = managers.unwrap_or_default();
        fieldmanager::update(old, new, shape, managers, &writer, &objects::now_rfc3339())
    });
    match updated {
        Ok(managers) => managers.write_to(new),
        Err(e) => {
            tracing::debug!(error = %e, kind = r.def.kind, "managedFields dropped");
            ManagedFields::default().write_to(new);
        }
    }
}

const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Upstream's `lastAppliedUpdater`: a kubectl server-side apply to an
/// object client-side apply wrote keeps its annotation the applied
/// configuration, so going back to client-side apply computes the right
/// patches. Objects without the annotation never get one.
fn sync_last_applied(live: &Value, config: &Value, merged: &mut Value) {
    // Upstream's limit on all of an object's annotations together.
    const LIMIT: usize = 256 * 1024;
    if !live["metadata"]["annotations"][LAST_APPLIED].is_string() {
        return;
    }
    let mut applied = config.clone();
    if let Some(a) = applied["metadata"]["annotations"].as_object_mut() {
        a.remove(LAST_APPLIED);
    }
    let text = applied.to_string();
    if text.len() > LIMIT {
        return;
    }
    if let Some(a) = merged["metadata"]["annotations"].as_object_mut() {
        a.insert(LAST_APPLIED.into(), Value::String(text));
    }
}

/// What `live` becomes under the patch `body` of type `pt`: an apply
/// through the field manager, any other patch as [`patch::apply`] makes
/// it.
///
/// # Errors
/// As [`apply`]; 400 or 422 for a patch that cannot apply.
pub fn patched(r: &Req, live: &Value, body: &[u8], pt: PatchType) -> ApiResult<Value> {
    match pt {
        PatchType::Apply => apply(r, live, body),
        _ => patch::apply(live, body, pt, r.def.kind).map_err(ApiError::from),
    }
}

/// Subresources that build their update from part of what a patch asked
/// for (ephemeral containers, a CSR's approval) keep an apply's
/// ownership: the write records no Update for an apply.
pub fn keep_applied_fields(r: &Req, patched: &Value, new: &mut Value) {
    if is_apply(r) {
        if let Some(mf) = patched["metadata"].get("managedFields") {
            objects::meta_mut(new).insert("managedFields".into(), mf.clone());
        }
    }
}

/// `live` (`{}` when the apply creates) with the configuration in `body`
/// applied for the request's field manager, its managedFields updated.
///
/// # Errors
/// 400 for a configuration that is not this kind's, sets managedFields
/// or has list items that cannot be merged; 409 with upstream's message
/// and causes for conflicts.
pub fn apply(r: &Req, live: &Value, body: &[u8]) -> ApiResult<Value> {
    let config = config(r, body)?;
    // Upstream starts over from no managers when the stored ones do not
    // decode, rather than refuse every later write.
    let managers = ManagedFields::decode(&live["metadata"]["managedFields"]).unwrap_or_default();
    let writer = writer(r, config["apiVersion"].as_str().unwrap_or_default());
    let force = r.query.get("force") == Some("true");
    let outcome = with_shape(r.def, |shape| {
        fieldmanager::apply(
            live,
            &config,
            shape,
            managers,
            &writer,
            force,
            &objects::now_rfc3339(),
        )
    });
    match outcome {
        Ok((mut merged, managers)) => {
            managers.write_to(&mut merged);
            if writer.manager.starts_with("kubectl") {
                sync_last_applied(live, &config, &mut merged);
            }
            Ok(merged)
        }
        Err(ApplyError::BadRequest(m)) => Err(ApiError::bad_request(m)),
        // A list item that cannot be named (a missing or repeated key)
        // is the client's to fix: 400, where upstream answers 500.
        Err(ApplyError::Merge(e)) => Err(ApiError::bad_request(format!(
            "failed to create typed patch object ({}, Kind={}): {e}",
            config["apiVersion"].as_str().unwrap_or_default(),
            r.def.kind
        ))),
        Err(ApplyError::Conflict(c)) => {
            let causes: Vec<Value> = (c.causes().iter())
                .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
                .collect();
            Err(ApiError {
                details: Some(json!({"causes": causes})),
                ..ApiError::new(409, "Conflict", c.to_string())
            })
        }
    }
}
