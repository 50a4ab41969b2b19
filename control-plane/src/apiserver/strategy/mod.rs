//! Per-kind strategies: the rules one kind adds to the generic verbs, as
//! upstream's `pkg/registry/<group>/<kind>/strategy.go` (PrepareForCreate,
//! PrepareForUpdate, Validate, the REST storage's allocations and graceful
//! deletion, the TableConvertor).
//!
//! The verbs in [`super::handlers`] never test for a kind: they call the
//! [`Strategy`] of the resource's row in [`super::resources`]. Adding a
//! kind is one module here (when it has rules) plus one row in that table.
//!
//! # Layout
//! - [`Strategy`]: the hooks, each with the default a kind without rules gets;
//!   [`Plain`] is that kind.
//! - one module per kind with rules: [`pod`], [`service`], [`namespace`],
//!   [`node`], [`job`], [`cronjob`], [`workloads`] (Deployment, ReplicaSet,
//!   DaemonSet), [`statefulset`], [`revision`] (ControllerRevision),
//!   [`replicationcontroller`], [`disruptionbudget`],
//!   [`resourcequota`],
//!   [`limitrange`], [`priorityclass`], [`runtimeclass`],
//!   [`componentstatus`] (computed, never stored),
//!   [`csr`], [`event`], [`secret`], [`configmap`], [`rbac`],
//!   [`serviceaccount`] (TokenRequest), [`storage`] (PersistentVolumes,
//!   claims, StorageClasses, the CSI kinds), [`webhookconfig`] (admission
//!   webhook configurations), [`admissionpolicy`] (ValidatingAdmissionPolicies
//!   and bindings), [`apiservice`] (aggregated APIs), and
//!   [`printed`] for the kinds whose only rule is how `kubectl get` prints
//!   them.
//! - CustomResourceDefinitions and the kinds they define have theirs in
//!   [`super::crd`].

pub mod admissionpolicy;
pub mod apiservice;
pub mod componentstatus;
pub mod configmap;
pub mod cronjob;
pub mod csr;
pub mod disruptionbudget;
pub mod event;
pub mod job;
pub mod limitrange;
pub mod namespace;
pub mod node;
pub mod pod;
pub mod printed;
pub mod priorityclass;
pub mod rbac;
pub mod replicationcontroller;
pub mod resourcequota;
pub mod revision;
pub mod runtimeclass;
pub mod secret;
pub mod service;
pub mod serviceaccount;
pub mod statefulset;
pub mod storage;
pub mod webhookconfig;
pub mod workloads;

use std::sync::Arc;

use axum::body::Body;
use bytes::Bytes;
use futures::future::BoxFuture;
use http::{Method, Response};
use serde_json::{json, Value};

use super::convert::Version;
pub use super::crd::custom::ScalePaths;
use super::handlers::DeleteOptions;
use super::ipalloc::Allocation;
use super::objects::{self, meta_mut};
use super::resources::ResourceDef;
use super::status::{ApiResult, Cause};
use super::table::{self, Col};
use super::{ApiServer, Req};

/// The rule `metadata.name` follows (upstream's per-kind name validators).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameRule {
    /// A lowercase RFC 1123 subdomain: most kinds.
    Subdomain,
    /// A lowercase RFC 1123 label (Namespaces).
    Label,
    /// A DNS-1035 label (Services: the name becomes a DNS label).
    Label1035,
    /// Any path segment (RBAC kinds: `system:node`).
    PathSegment,
}

/// A subresource a kind serves beyond the generic `status` and `scale`.
pub struct Subresource {
    pub name: &'static str,
    /// The kind discovery lists for it, and that kind's group and version
    /// when they are not the resource's own.
    pub kind: &'static str,
    pub group_version: Option<(&'static str, &'static str)>,
    pub verbs: &'static [&'static str],
    pub serve: Serve,
}

/// Serves one subresource request on an object that exists (the name is
/// in the request).
pub type Handler = for<'a> fn(
    &'a Arc<ApiServer>,
    &'a Method,
    &'a Req,
    Bytes,
) -> BoxFuture<'a, ApiResult<Response<Body>>>;

/// A [`Handler`] made of an async fn taking `(api, method, request, body)`.
macro_rules! handler {
    ($f:path) => {
        |api, method, r, body| Box::pin($f(api, method, r, body))
    };
}
pub(crate) use handler;

/// Who serves a subresource.
#[derive(Clone, Copy)]
pub enum Serve {
    /// The kind's own handler.
    Handler(Handler),
    /// The object's node (pods/log, exec, attach, portforward), through
    /// [`super::nodeproxy`], or the backend it names (pods, services and
    /// nodes `/proxy`), through [`super::httpproxy`]; before the request
    /// body is read.
    Node,
}

/// `<resource>/proxy` of pods, services and nodes, with upstream's verbs
/// and options kind.
pub const fn proxy(kind: &'static str) -> Subresource {
    Subresource {
        name: "proxy",
        kind,
        group_version: None,
        verbs: &["create", "delete", "get", "patch", "update"],
        serve: Serve::Node,
    }
}

/// The rules of one kind. Every hook has the default a kind without rules
/// gets; a kind's module overrides the ones it has rules for.
pub trait Strategy: Send + Sync {
    /// PrepareForCreate: the fields the server sets on a new object. The
    /// default starts the status afresh for kinds with a status
    /// subresource (status is the controllers' to write).
    fn prepare_for_create(&self, r: &Req, obj: &mut Value) {
        reset_status(r.def, obj);
    }

    /// PrepareForUpdate of the main resource, after the generic rules
    /// (status kept, immutable metadata kept, generation bumped): what
    /// else an update may not change.
    fn prepare_for_update(&self, _old: &Value, _new: &mut Value) {}

    /// Defaults (upstream's `SetDefaults_*`), applied on create and on
    /// every write of the main resource.
    fn default(&self, _obj: &mut Value) {}

    /// The rule `metadata.name` follows.
    fn name_rule(&self) -> NameRule {
        NameRule::Subdomain
    }

    /// Validation beyond ObjectMeta's: the causes of a 422, empty when
    /// the object is valid.
    fn validate(&self, _obj: &Value) -> Vec<Cause> {
        Vec::new()
    }

    /// Validation of an update of the main resource: by default the new
    /// object's; kinds with immutable fields compare with `old`.
    fn validate_update(&self, _old: &Value, new: &Value) -> Vec<Cause> {
        self.validate(new)
    }

    /// Validation of a write through a subresource (status, scale): by
    /// default the new object's; custom kinds' transition rules compare
    /// with `old` there too.
    fn validate_status_update(&self, _old: &Value, new: &Value) -> Vec<Cause> {
        self.validate(new)
    }

    /// What this kind's writes must be allowed beyond RBAC on their verb,
    /// asked of the requester after validation and admission (`old` None
    /// on a create): who may grant which permissions (RBAC escalation),
    /// who may ask for which certificate.
    ///
    /// # Errors
    /// 403 saying what the requester lacks (404 for a role that does not
    /// exist).
    fn authorize_write<'a>(
        &'a self,
        _api: &'a ApiServer,
        _r: &'a Req,
        _old: Option<&'a Value>,
        _new: &'a Value,
    ) -> BoxFuture<'a, ApiResult<()>> {
        Box::pin(std::future::ready(Ok(())))
    }

    /// Take what the object needs from a shared pool (ClusterIPs,
    /// NodePorts) before it is written; `old` is the stored object on an
    /// update. What is returned goes back to the pool if the write fails.
    ///
    /// # Errors
    /// 422 when the object asks for what cannot be had.
    fn allocate(
        &self,
        _api: &ApiServer,
        _obj: &mut Value,
        _old: Option<&Value>,
    ) -> ApiResult<Allocation> {
        Ok(Allocation::default())
    }

    /// Give back what a removed object held.
    fn release(&self, _api: &ApiServer, _obj: &Value) {}

    /// Mark `obj` (a copy of the stored object) for deletion. Returns
    /// whether it stays in the store for now (finalizers, a grace period);
    /// when not, the object is removed.
    fn mark_deleted(&self, _api: &ApiServer, obj: &mut Value, opts: &DeleteOptions) -> bool {
        mark_with_finalizers(obj, opts)
    }

    /// Whether something besides `metadata.finalizers` still holds a
    /// deleted object in the store (a pod's grace period, a namespace's
    /// `spec.finalizers`).
    fn holds_deletion(&self, _obj: &Value) -> bool {
        false
    }

    /// Field selectors served beyond `metadata.name` and
    /// `metadata.namespace` (upstream's per-kind `GetAttrs`).
    fn selectable_fields(&self) -> &'static [&'static str] {
        &[]
    }

    /// Where `/scale` reads and writes replicas and the selector; None for
    /// the built-in kinds' `spec.replicas` / `status.replicas` /
    /// `spec.selector` (custom kinds name their own paths).
    fn scale_paths(&self) -> Option<ScalePaths> {
        None
    }

    /// Subresources beyond `status` and `scale`.
    fn subresources(&self) -> &'static [Subresource] {
        &[]
    }

    /// Table columns (upstream's printers, `pkg/printers/internalversion`).
    fn columns(&self) -> Vec<Col> {
        vec![table::NAME, table::AGE]
    }

    /// One row's cells, in the order of [`Strategy::columns`].
    fn cells(&self, obj: &Value) -> Vec<Value> {
        vec![table::name_cell(obj), table::age_cell(obj)]
    }

    /// How long objects of this kind live in the store after each write
    /// (upstream's event TTL); None: until deleted.
    fn ttl(&self, _api: &ApiServer) -> Option<std::time::Duration> {
        None
    }

    /// Whether the API form differs from the stored form (then lists and
    /// gets cannot splice stored bytes into the answer).
    fn converts(&self) -> bool {
        false
    }

    /// API form -> stored form.
    fn to_stored(&self, _def: &ResourceDef, obj: &Value) -> Value {
        obj.clone()
    }

    /// Stored form -> API form.
    fn to_served(&self, _def: &ResourceDef, obj: Value) -> Value {
        obj
    }

    /// Whether [`Strategy::convert`] may have work to do: then objects
    /// pass through it on their way in and out.
    fn converts_by_call(&self) -> bool {
        false
    }

    /// Objects [`Strategy::to_served`] or [`Strategy::to_stored`] left at
    /// another version than `to` wants, brought to it where that takes a
    /// call (a custom kind's conversion webhook).
    ///
    /// # Errors
    /// 500 when the conversion fails.
    fn convert<'a>(
        &'a self,
        _api: &'a ApiServer,
        _def: &'a ResourceDef,
        objs: Vec<Value>,
        _to: Version,
    ) -> BoxFuture<'a, ApiResult<Vec<Value>>> {
        Box::pin(std::future::ready(Ok(objs)))
    }
}

/// A new object of a kind with a status subresource starts with an empty
/// status: the fields Go always writes (those without `omitempty`, the
/// schema's required ones) at their zero values, as upstream's first
/// answer has them (clients' models refuse a DaemonSetStatus without
/// `numberReady`).
pub fn reset_status(def: &ResourceDef, obj: &mut Value) {
    if def.status {
        if let Some(m) = obj.as_object_mut() {
            m.insert("status".into(), empty_status(def));
        }
    }
}

/// The status of `def`'s kind with nothing known yet.
pub fn empty_status(def: &ResourceDef) -> Value {
    let bare = json!({"apiVersion": def.api_version(), "kind": def.kind, "status": {}});
    def.model
        .and_then(|m| m.canonical(&bare).ok())
        .map(|mut v| v["status"].take())
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}))
}

/// A kind without rules of its own.
pub struct Plain;

impl Strategy for Plain {}

/// The generic deletion: the finalizers a propagation policy asks for,
/// then, if any finalizer is left, a deletion timestamp instead of
/// removal. Returns whether the object stays.
pub fn mark_with_finalizers(obj: &mut Value, opts: &DeleteOptions) -> bool {
    add_propagation_finalizer(obj, opts);
    hold_for_finalizers(obj, opts)
}

/// The finalizer a `Foreground` or `Orphan` propagation policy asks the
/// garbage collector to run, on an object not yet being deleted.
pub fn add_propagation_finalizer(obj: &mut Value, opts: &DeleteOptions) {
    let add = match opts.propagation.as_deref() {
        Some("Foreground") => "foregroundDeletion",
        Some("Orphan") => "orphan",
        _ => return,
    };
    let mut finalizers = objects::finalizers(obj);
    if !objects::has_deletion_timestamp(obj) && !finalizers.iter().any(|x| x == add) {
        finalizers.push(add.to_string());
        meta_mut(obj).insert("finalizers".into(), json!(finalizers));
    }
}

/// An object with finalizers is marked (deletion timestamp, if it has
/// none yet) and stays until they are gone. Returns whether it stays.
pub fn hold_for_finalizers(obj: &mut Value, opts: &DeleteOptions) -> bool {
    if objects::finalizers(obj).is_empty() {
        return false;
    }
    if !objects::has_deletion_timestamp(obj) {
        let m = meta_mut(obj);
        m.insert("deletionTimestamp".into(), json!(objects::now_rfc3339()));
        m.insert(
            "deletionGracePeriodSeconds".into(),
            json!(opts.grace.unwrap_or(0)),
        );
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::resources::lookup;

    #[test]
    fn empty_statuses_carry_the_fields_go_always_writes() {
        let ds = lookup("apps", "v1", "daemonsets").unwrap();
        assert_eq!(
            empty_status(ds),
            json!({"currentNumberScheduled": 0, "desiredNumberScheduled": 0,
                   "numberMisscheduled": 0, "numberReady": 0})
        );
        let rs = lookup("apps", "v1", "replicasets").unwrap();
        assert_eq!(empty_status(rs), json!({"replicas": 0}));
        let job = lookup("batch", "v1", "jobs").unwrap();
        assert_eq!(empty_status(job), json!({}));
    }
}
