//! One write as dynamic admission (webhooks and policies) sees it: its
//! attributes, its namespace (read once, when a selector or a policy
//! needs it), whether a webhook's or policy's constraints select it, and
//! the AdmissionRequest that webhooks are sent and expressions read as
//! `request`.

use serde_json::{json, Value};

use super::cel::expression;
use super::handlers::is_dry_run;
use super::matching::{labels_of, Attributes, Constraints};
use super::objects;
use super::review::user_info;
use super::status::{ApiError, ApiResult};
use super::webhook::review;
use super::{ApiServer, Req};

/// The operation of a write: CREATE (no old object), UPDATE, DELETE (no
/// new one).
pub fn operation(old: Option<&Value>, new: Option<&Value>) -> &'static str {
    match (old, new) {
        (None, _) => "CREATE",
        (Some(_), Some(_)) => "UPDATE",
        (Some(_), None) => "DELETE",
    }
}

/// Writes dynamic admission never sees: the admission configurations
/// themselves (a broken webhook or policy cannot lock its own fix out),
/// and the write of a `scale` request to its parent (webhooks and
/// policies saw the Scale, see [`super::subresources`]).
pub fn exempt(r: &Req) -> bool {
    r.attrs.group == "admissionregistration.k8s.io"
        || (r.attrs.subresource == "scale" && r.sub.is_none())
}

pub struct AdmissionRequest<'a> {
    pub api: &'a ApiServer,
    pub r: &'a Req,
    pub operation: &'static str,
    pub uid: String,
    /// The request's namespace object, once read (None inside: there is
    /// none).
    namespace: Option<Option<std::sync::Arc<Value>>>,
    /// What the request's expressions may still cost.
    pub budget: f64,
}

impl<'a> AdmissionRequest<'a> {
    pub fn new(api: &'a ApiServer, r: &'a Req, operation: &'static str) -> Self {
        AdmissionRequest {
            api,
            r,
            operation,
            uid: objects::new_uid(),
            namespace: None,
            budget: expression::budget(),
        }
    }

    pub fn attributes(&self) -> Attributes<'a> {
        Attributes {
            operation: self.operation,
            group: &self.r.attrs.group,
            version: self.r.def.version,
            resource: &self.r.attrs.resource,
            subresource: &self.r.attrs.subresource,
            name: self.r.name.as_deref().unwrap_or_default(),
            namespaced: self.r.def.namespaced,
        }
    }

    /// Whether `c` selects this write (rules, namespace and object
    /// selectors), and in which version.
    pub async fn selected(
        &mut self,
        c: &Constraints,
        old: Option<&Value>,
        new: Option<&Value>,
    ) -> ApiResult<Option<String>> {
        let Some(version) = c.matched_version(&self.attributes()) else {
            return Ok(None);
        };
        if c.wants_namespace() && !self.namespace_matches(c, old, new).await? {
            return Ok(None);
        }
        Ok(c.object_matches(new, old).then_some(version))
    }

    /// The namespace selector: against the namespace's labels for
    /// namespaced objects, the object's own for a Namespace; other
    /// cluster-scoped objects always match.
    async fn namespace_matches(
        &mut self,
        c: &Constraints,
        old: Option<&Value>,
        new: Option<&Value>,
    ) -> ApiResult<bool> {
        if self.r.is_resource("", "namespaces") {
            let obj = new.or(old).unwrap_or(&Value::Null);
            return Ok(c.namespace_matches(Some(&labels_of(obj))));
        }
        if !self.r.def.namespaced {
            return Ok(true);
        }
        let labels = self.namespace_object().await?.map(labels_of);
        Ok(c.namespace_matches(labels.as_ref()))
    }

    /// The request's namespace (None for cluster-scoped requests or a
    /// namespace that does not exist).
    pub async fn namespace_object(&mut self) -> ApiResult<Option<&Value>> {
        if self.namespace.is_none() {
            let ns = self.r.ns.clone().unwrap_or_default();
            let found = if ns.is_empty() {
                None
            } else {
                self.api
                    .namespaces
                    .get(self.api.store.as_ref(), &ns)
                    .await
                    .map_err(ApiError::from)?
            };
            self.namespace = Some(found);
        }
        Ok(self.namespace.as_ref().and_then(|n| n.as_deref()))
    }

    /// The AdmissionRequest for `old` and `new` seen in `version`.
    pub fn asked<'v>(
        &'v self,
        version: &'v str,
        old: Option<&'v Value>,
        new: Option<&'v Value>,
    ) -> review::Asked<'v> {
        let def = self.r.def;
        let a = &self.r.attrs;
        let options_kind = match self.operation {
            "CREATE" => "CreateOptions",
            "UPDATE" => "UpdateOptions",
            _ => "DeleteOptions",
        };
        let mut options = json!({"apiVersion": "meta.k8s.io/v1", "kind": options_kind});
        if let Some(m) = self.r.query.0.get("fieldManager") {
            options["fieldManager"] = json!(m);
        }
        review::Asked {
            uid: &self.uid,
            kind: [def.group, version, def.kind],
            resource: [&a.group, version, &a.resource],
            request_kind: [def.group, def.version, def.kind],
            request_resource: [&a.group, def.version, &a.resource],
            subresource: &a.subresource,
            name: objects::name(new.or(old).unwrap_or(&Value::Null)).unwrap_or(self.r.name()),
            namespace: self.r.ns.as_deref().unwrap_or_default(),
            operation: self.operation,
            user_info: user_info(&self.r.identity),
            object: new,
            old_object: old,
            dry_run: is_dry_run(self.r),
            options,
        }
    }

    /// [`Self::asked`] as the JSON `request`.
    pub fn request(&self, version: &str, old: Option<&Value>, new: Option<&Value>) -> Value {
        review::request(&self.asked(version, old, new))
    }
}
