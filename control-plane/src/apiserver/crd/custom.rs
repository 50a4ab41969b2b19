//! The rules of one custom kind at one version: its schema (pruning,
//! defaulting, validation), printer columns, scale paths and selectable
//! fields, as upstream's `customresource` strategy and table convertor.
//!
//! A [`CustomKind`] is both the row's model (decoding prunes what the
//! schema does not know, which `fieldValidation` then reports) and its
//! strategy. Rows are `'static` (see [`super::intern`]); the rules sit in
//! a slot the registry refills whenever the definition changes.

use std::sync::{Arc, RwLock};

use schemars::SchemaGenerator;
use serde_json::{json, Value};

use futures::future::BoxFuture;

use super::conversion::Webhook;
use super::{jsonpath, structural};
use crate::apiserver::cel;
use crate::apiserver::convert::Version;
use crate::apiserver::model::Model;
use crate::apiserver::objects::{self, meta_mut};
use crate::apiserver::resources::ResourceDef;
use crate::apiserver::status::Cause;
use crate::apiserver::status::{ApiError, ApiResult};
use crate::apiserver::strategy::Strategy;
use crate::apiserver::table::{self, Col};
use crate::apiserver::ApiServer;
use crate::apiserver::Req;

/// One `additionalPrinterColumns` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct PrinterColumn {
    pub name: &'static str,
    pub ty: &'static str,
    pub description: &'static str,
    pub priority: u8,
    pub path: String,
}

/// `subresources.scale` of the version.
#[derive(Debug, Clone, PartialEq)]
pub struct ScalePaths {
    pub spec_replicas: String,
    pub status_replicas: String,
    pub label_selector: Option<String>,
}

/// What one served version of a definition says about its objects.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Rules {
    /// `schema.openAPIV3Schema`, absent only for definitions that preserve
    /// every field.
    pub schema: Option<Arc<Value>>,
    /// None: upstream's default columns (Name, Age).
    pub columns: Option<Vec<PrinterColumn>>,
    pub scale: Option<ScalePaths>,
    /// `subresources.status` is on: status is not content.
    pub status: bool,
    /// `GROUP/VERSION` of the storage version: what stored objects say.
    pub stored_api_version: String,
    /// `selectableFields` paths without the leading dot.
    pub selectable: &'static [&'static str],
    /// The definition's conversion webhook; None: conversion `None`.
    pub conversion: Option<Arc<Webhook>>,
}

/// A served custom kind at one version.
#[derive(Default)]
pub struct CustomKind {
    rules: RwLock<Arc<Rules>>,
}

impl CustomKind {
    pub fn rules(&self) -> Arc<Rules> {
        self.rules.read().expect("custom rules lock").clone()
    }

    pub fn set_rules(&self, rules: Rules) {
        let mut slot = self.rules.write().expect("custom rules lock");
        if **slot != rules {
            *slot = Arc::new(rules);
        }
    }
}

impl Model for CustomKind {
    fn canonical(&self, obj: &Value) -> Result<Value, serde_json::Error> {
        let mut out = obj.clone();
        if !out.is_object() {
            return Err(serde::de::Error::custom(format!(
                "invalid type: {}, expected an object",
                structural::type_name(obj)
            )));
        }
        if let Some(meta) = out.get("metadata").filter(|m| !m.is_null()) {
            let typed: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta =
                serde::Deserialize::deserialize(meta)?;
            out["metadata"] = serde_json::to_value(typed)?;
        }
        if let Some(s) = &self.rules().schema {
            structural::prune(s, &mut out);
        }
        Ok(out)
    }

    fn canonical_json(&self, _body: &[u8]) -> Option<Value> {
        None
    }

    fn add_schema(&self, _gen: &mut SchemaGenerator) {}

    fn json_schema(&self) -> Option<Arc<Value>> {
        self.rules().schema.clone()
    }
}

/// Whether two objects agree on everything but metadata and status: what
/// a generation counts. Compared in place, without copies.
fn same_content(a: &Value, b: &Value) -> bool {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return a == b;
    };
    let counted = |k: &String| k != "metadata" && k != "status";
    a.keys().filter(|k| counted(k)).count() == b.keys().filter(|k| counted(k)).count()
        && a.iter()
            .filter(|(k, _)| counted(k))
            .all(|(k, v)| b.get(k) == Some(v))
}

impl Strategy for CustomKind {
    /// A new object's status is the controllers' to write: with a status
    /// subresource it is dropped (upstream's PrepareForCreate).
    fn prepare_for_create(&self, r: &Req, obj: &mut Value) {
        if r.def.status {
            if let Some(m) = obj.as_object_mut() {
                m.remove("status");
            }
        }
    }

    /// Upstream counts a generation for any change besides metadata (and
    /// status, when it is a subresource); the generic rule looked at spec
    /// only.
    fn prepare_for_update(&self, old: &Value, new: &mut Value) {
        let before = old["metadata"]["generation"].as_i64().unwrap_or(0);
        let now = new["metadata"]["generation"].as_i64().unwrap_or(0);
        let mut changed = !same_content(old, new);
        if !changed && old.get("status") != new.get("status") && new.get("status").is_some() {
            // Without a status subresource, status is content like the rest.
            changed = !self.rules().status;
        }
        if changed && now == before {
            meta_mut(new).insert("generation".into(), json!(before + 1));
        }
    }

    fn default(&self, obj: &mut Value) {
        if let Some(s) = &self.rules().schema {
            structural::apply_defaults(s, obj);
        }
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        validate(&self.rules(), obj, None)
    }

    /// Transition rules (`oldSelf`) compare with the stored object.
    fn validate_update(&self, old: &Value, new: &Value) -> Vec<Cause> {
        validate(&self.rules(), new, Some(old))
    }

    fn validate_status_update(&self, old: &Value, new: &Value) -> Vec<Cause> {
        validate(&self.rules(), new, Some(old))
    }

    fn scale_paths(&self) -> Option<ScalePaths> {
        self.rules().scale.clone()
    }

    fn selectable_fields(&self) -> &'static [&'static str] {
        self.rules().selectable
    }

    fn columns(&self) -> Vec<Col> {
        match &self.rules().columns {
            None => vec![table::NAME, table::AGE],
            Some(cols) => std::iter::once(table::NAME)
                .chain(
                    cols.iter()
                        .map(|c| (c.name, c.ty, c.priority, c.description)),
                )
                .collect(),
        }
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let rules = self.rules();
        let Some(cols) = &rules.columns else {
            return vec![table::name_cell(obj), table::age_cell(obj)];
        };
        std::iter::once(table::name_cell(obj))
            .chain(cols.iter().map(|c| cell(c, obj)))
            .collect()
    }

    /// Every version shares the stored objects: each is served with its
    /// own apiVersion.
    fn converts(&self) -> bool {
        true
    }

    /// Objects are stored at the storage version: conversion `None` only
    /// rewrites apiVersion; a webhook's kinds were converted by
    /// [`Strategy::convert`] before.
    fn to_stored(&self, _def: &ResourceDef, obj: &Value) -> Value {
        let rules = self.rules();
        let mut out = obj.clone();
        if let (None, Some(m)) = (&rules.conversion, out.as_object_mut()) {
            m.insert("apiVersion".into(), json!(rules.stored_api_version));
        }
        out
    }

    /// Defaults also apply on read (upstream's defaulting of stored
    /// objects), so a default added to the schema shows on old objects.
    /// With a webhook, an object at another version is left for
    /// [`Strategy::convert`].
    fn to_served(&self, def: &ResourceDef, mut obj: Value) -> Value {
        let api_version = def.api_version();
        if self.rules().conversion.is_some() && obj["apiVersion"] != api_version.as_str() {
            return obj;
        }
        if let Some(m) = obj.as_object_mut() {
            m.insert("apiVersion".into(), json!(api_version));
        }
        self.default(&mut obj);
        obj
    }

    fn converts_by_call(&self) -> bool {
        self.rules().conversion.is_some()
    }

    /// Through the webhook; what comes back for the served version is
    /// pruned and defaulted by its schema, as a decoded request is.
    fn convert<'a>(
        &'a self,
        api: &'a ApiServer,
        def: &'a ResourceDef,
        objs: Vec<Value>,
        to: Version,
    ) -> BoxFuture<'a, ApiResult<Vec<Value>>> {
        let rules = self.rules();
        let Some(hook) = rules.conversion.clone() else {
            return Box::pin(std::future::ready(Ok(objs)));
        };
        Box::pin(async move {
            let target = match to {
                Version::Served => def.api_version(),
                Version::Stored => rules.stored_api_version.clone(),
            };
            let mut out = hook
                .convert(api, objs, &target)
                .await
                .map_err(ApiError::internal)?;
            if to == Version::Served {
                for o in &mut out {
                    if let Some(s) = &rules.schema {
                        structural::prune(s, o);
                    }
                    self.default(o);
                }
            }
            Ok(out)
        })
    }
}

/// The schema's checks, then its CEL rules (upstream runs the rules only
/// on objects that pass the schema, as they are typed by it).
fn validate(rules: &Rules, obj: &Value, old: Option<&Value>) -> Vec<Cause> {
    let Some(s) = &rules.schema else {
        return Vec::new();
    };
    let causes = structural::validate(s, obj);
    if !causes.is_empty() {
        return causes;
    }
    cel::validate(s, obj, old)
}

/// One printer column's cell, as upstream's CRD table convertor: the
/// first value the path finds, dates as ages, nothing found as null.
fn cell(c: &PrinterColumn, obj: &Value) -> Value {
    let Some(v) = jsonpath::first(obj, &c.path) else {
        return Value::Null;
    };
    match c.ty {
        "date" => match v.as_str() {
            Some(ts) => json!(table::since(ts)),
            None => Value::Null,
        },
        "integer" if v.is_i64() || v.is_u64() => v.clone(),
        "number" if v.is_number() => v.clone(),
        "boolean" if v.is_boolean() => v.clone(),
        "string" => match v {
            Value::String(_) => v.clone(),
            other => json!(other.to_string()),
        },
        _ => Value::Null,
    }
}

/// The replicas and selector a `Scale` of a custom object shows.
pub fn scale_view(paths: &ScalePaths, obj: &Value) -> (i64, i64, String) {
    let at = |p: &str| objects::value_at(obj, p.trim_start_matches('.'));
    let spec = at(&paths.spec_replicas)
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let status = at(&paths.status_replicas)
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let selector = paths
        .label_selector
        .as_deref()
        .and_then(at)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    (spec, status, selector)
}

/// Write `replicas` at the spec replicas path, making the objects on the
/// way.
pub fn set_replicas(paths: &ScalePaths, obj: &mut Value, replicas: i64) {
    let mut at = obj;
    let steps: Vec<&str> = paths
        .spec_replicas
        .trim_start_matches('.')
        .split('.')
        .collect();
    let Some((last, parents)) = steps.split_last() else {
        return;
    };
    for step in parents {
        if !at[*step].is_object() {
            at[*step] = json!({});
        }
        at = &mut at[*step];
    }
    at[*last] = json!(replicas);
}
