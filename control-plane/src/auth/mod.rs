//! Who is asking, and may they: authentication (client certificates, bearer
//! tokens, bootstrap tokens), RBAC, the Node authorizer with
//! NodeRestriction admission, and the CSR rules of joining nodes.

pub mod authconfig;
pub mod authn;
pub mod bootstrap;
pub mod bootstraptoken;
pub mod csr;
pub mod node;
pub mod oidc;
pub mod rbac;
pub mod satoken;

pub use authn::{Authenticator, Identity};

/// What a request wants to do, as authorizers see it (upstream's
/// `authorizer.Attributes`).
#[derive(Debug, Clone, Default)]
pub struct Attributes {
    pub verb: String,
    /// Resource requests: group, resource, subresource, namespace, name.
    pub resource_request: bool,
    pub group: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    /// Non-resource requests: the path.
    pub path: String,
    /// A list's or watch's `labelSelector` (upstream's selector
    /// authorization attributes): a node may list only its own volumes.
    pub label_selector: String,
}

impl Attributes {
    /// A resource request's attributes (core group), for tests.
    #[cfg(test)]
    pub fn resource(verb: &str, resource: &str, sub: &str, ns: &str, name: &str) -> Attributes {
        Attributes {
            verb: verb.into(),
            resource_request: true,
            resource: resource.into(),
            subresource: sub.into(),
            namespace: ns.into(),
            name: name.into(),
            ..Default::default()
        }
    }

    /// The message of a 403, as upstream words it.
    pub fn forbidden_message(&self, user: &str) -> String {
        if !self.resource_request {
            return format!(
                "forbidden: User {user:?} cannot {} path {:?}",
                self.verb, self.path
            );
        }
        let res = if self.subresource.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        };
        let what = if self.name.is_empty() {
            crate::apiserver::status::qualified(&self.group, &self.resource)
        } else {
            format!(
                "{} {:?}",
                crate::apiserver::status::qualified(&self.group, &self.resource),
                self.name
            )
        };
        let scope = if self.namespace.is_empty() {
            "at the cluster scope".to_string()
        } else {
            format!("in the namespace {:?}", self.namespace)
        };
        format!(
            "{what} is forbidden: User {user:?} cannot {} resource {res:?} in API group {:?} {scope}",
            self.verb, self.group
        )
    }
}
