//! Namespaces (`core/v1`): the lifecycle (Active, then Terminating while
//! the namespace controller empties it and clears `spec.finalizers`
//! through `/finalize`), their name rule and columns
//! (upstream's `pkg/registry/core/namespace`).

use std::sync::Arc;

use axum::body::Body;
use bytes::Bytes;
use http::{Method, Response};
use serde_json::{json, Value};

use super::{handler, NameRule, Serve, Strategy, Subresource};
use crate::apiserver::defaults::{obj_field, obj_field_map, set};
use crate::apiserver::handlers::{get_object, write_update, Attempt, DeleteOptions};
use crate::apiserver::objects::{self, meta_mut};
use crate::apiserver::status::{ApiError, ApiResult};
use crate::apiserver::table::{age_cell, name_cell, s, Col, AGE, NAME};
use crate::apiserver::{decode_body, json_response, ApiServer, Req};

pub struct Namespace;

static SUBRESOURCES: &[Subresource] = &[Subresource {
    name: "finalize",
    kind: "Namespace",
    group_version: None,
    verbs: &["update"],
    serve: Serve::Handler(handler!(finalize)),
}];

impl Strategy for Namespace {
    /// A namespace keeps the status it is created with (its phase is
    /// defaulted to Active).
    fn prepare_for_create(&self, _r: &Req, _obj: &mut Value) {}

    /// `spec.finalizers` change only through `/finalize`.
    fn prepare_for_update(&self, old: &Value, new: &mut Value) {
        new["spec"] = old["spec"].clone();
    }

    fn default(&self, obj: &mut Value) {
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let meta = obj_field(obj, "metadata");
        let labels = obj_field_map(meta, "labels");
        labels.insert("kubernetes.io/metadata.name".into(), json!(name));
        let spec = obj_field(obj, "spec");
        set(spec, "finalizers", json!(["kubernetes"]));
        let status = obj_field(obj, "status");
        set(status, "phase", json!("Active"));
    }

    fn name_rule(&self) -> NameRule {
        NameRule::Label
    }

    /// Deleting a namespace makes it Terminating; it stays while
    /// `spec.finalizers` (the namespace controller's) or metadata
    /// finalizers hold it.
    fn mark_deleted(&self, api: &ApiServer, obj: &mut Value, _opts: &DeleteOptions) -> bool {
        api.forget_namespace(objects::name(obj).unwrap_or_default());
        if !objects::has_deletion_timestamp(obj) {
            let m = meta_mut(obj);
            m.insert("deletionTimestamp".into(), json!(objects::now_rfc3339()));
            m.insert("deletionGracePeriodSeconds".into(), json!(0));
        }
        obj["status"]["phase"] = json!("Terminating");
        self.holds_deletion(obj) || !objects::finalizers(obj).is_empty()
    }

    fn holds_deletion(&self, obj: &Value) -> bool {
        obj["spec"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty())
    }

    fn selectable_fields(&self) -> &'static [&'static str] {
        &["status.phase"]
    }

    fn subresources(&self) -> &'static [Subresource] {
        SUBRESOURCES
    }

    fn columns(&self) -> Vec<Col> {
        vec![
            NAME,
            ("Status", "string", 0, "The status of the namespace"),
            AGE,
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        vec![
            name_cell(obj),
            json!(s(&obj["status"]["phase"])),
            age_cell(obj),
        ]
    }
}

/// `namespaces/finalize`: the namespace controller clears spec.finalizers
/// once the namespace is empty; then the namespace goes.
async fn finalize(
    api: &Arc<ApiServer>,
    method: &Method,
    r: &Req,
    body: Bytes,
) -> ApiResult<Response<Body>> {
    {
        if *method != Method::PUT {
            return Err(ApiError::method_not_allowed(format!(
                "{method} is not supported on namespaces/finalize"
            )));
        }
        let b = decode_body(&body, r.content_type())?;
        for _ in 0..8 {
            let (cur, old) = get_object(api, r).await?;
            let mut new = old.clone();
            new["spec"]["finalizers"] = b["spec"]["finalizers"].clone();
            if new["spec"]["finalizers"].is_null() {
                new["spec"]["finalizers"] = json!([]);
            }
            if let Attempt::Done(v) = write_update(api, r, &cur, &old, new, false).await? {
                return Ok(json_response(200, &v));
            }
        }
        Err(ApiError::stale("", "namespaces", r.name()))
    }
}
