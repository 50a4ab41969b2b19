//! Turning a URL into what it asks for: a non-resource path, discovery, or a
//! resource request (upstream's `RequestInfoFactory`).

use std::collections::HashMap;

use http::Method;

use crate::auth::Attributes;

/// What a request path names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `/api`
    CoreVersions,
    /// `/apis`
    Groups,
    /// `/apis/<group>`
    Group(String),
    /// `/api/v1` or `/apis/<group>/<version>`
    GroupVersion { group: String, version: String },
    /// A resource, collection or subresource.
    Resource(ResourcePath),
    /// Anything else: health, metrics, openapi, version.
    NonResource,
}

/// The parts of a resource URL.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ResourcePath {
    pub group: String,
    pub version: String,
    pub namespace: Option<String>,
    pub resource: String,
    pub name: Option<String>,
    pub subresource: Option<String>,
    /// The legacy `/watch/` path prefix was used.
    pub watch_prefix: bool,
}

/// Parse a path (without query).
pub fn parse_path(path: &str) -> Target {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api"] => return Target::CoreVersions,
        ["apis"] => return Target::Groups,
        ["apis", g] => return Target::Group(g.to_string()),
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Target::NonResource,
    };
    if rest.is_empty() {
        return Target::GroupVersion {
            group: group.to_string(),
            version: version.to_string(),
        };
    }
    let mut rest = rest;
    let mut watch_prefix = false;
    if rest[0] == "watch" {
        watch_prefix = true;
        rest = &rest[1..];
    }
    let mut namespace = None;
    // `namespaces/<ns>/<resource>...` is a namespaced request, except for the
    // namespace object's own subresources (`namespaces/<ns>/status|finalize`).
    if rest.len() >= 3
        && rest[0] == "namespaces"
        && !(rest.len() == 3 && matches!(rest[2], "status" | "finalize"))
    {
        namespace = Some(rest[1].to_string());
        rest = &rest[2..];
    }
    // Past the subresource, only a proxy has more: the path it forwards.
    if rest.is_empty() || (rest.len() > 3 && rest[2] != "proxy") {
        return Target::NonResource;
    }
    Target::Resource(ResourcePath {
        group: group.to_string(),
        version: version.to_string(),
        namespace,
        resource: rest[0].to_string(),
        name: rest.get(1).map(|s| s.to_string()),
        subresource: rest.get(2).map(|s| s.to_string()),
        watch_prefix,
    })
}

/// Decoded query parameters (last value wins).
#[derive(Debug, Clone, Default)]
pub struct Query(pub HashMap<String, String>);

impl Query {
    pub fn parse(q: Option<&str>) -> Self {
        Query(
            form_urlencoded::parse(q.unwrap_or("").as_bytes())
                .into_owned()
                .collect(),
        )
    }
    pub fn get(&self, k: &str) -> Option<&str> {
        self.0.get(k).map(|s| s.as_str()).filter(|s| !s.is_empty())
    }
    pub fn flag(&self, k: &str) -> bool {
        matches!(self.get(k), Some("true") | Some("1"))
    }
}

/// The Kubernetes verb of a resource request.
pub fn verb(method: &Method, p: &ResourcePath, query: &Query) -> &'static str {
    let watch = p.watch_prefix || query.flag("watch");
    match *method {
        Method::GET | Method::HEAD => {
            if watch {
                "watch"
            } else if p.name.is_some() {
                "get"
            } else {
                "list"
            }
        }
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => {
            if p.name.is_some() {
                "delete"
            } else {
                "deletecollection"
            }
        }
        _ => "unknown",
    }
}

/// What the authorizers and the audit policy see of a request (upstream's
/// `authorizer.Attributes` without the user): the Kubernetes verb and the
/// resource for resource requests, the lower-case method and the path for
/// the rest.
pub fn attributes(method: &Method, target: &Target, query: &Query, path: &str) -> Attributes {
    match target {
        Target::Resource(p) => Attributes {
            verb: verb(method, p, query).to_string(),
            resource_request: true,
            group: p.group.clone(),
            resource: p.resource.clone(),
            subresource: p.subresource.clone().unwrap_or_default(),
            namespace: p.namespace.clone().unwrap_or_default(),
            name: p.name.clone().unwrap_or_default(),
            path: path.to_string(),
            label_selector: query.0.get("labelSelector").cloned().unwrap_or_default(),
        },
        _ => Attributes {
            verb: method.as_str().to_lowercase(),
            path: path.to_string(),
            ..Default::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        assert_eq!(parse_path("/api"), Target::CoreVersions);
        assert_eq!(
            parse_path("/apis/apps/v1"),
            Target::GroupVersion {
                group: "apps".into(),
                version: "v1".into()
            }
        );
        let Target::Resource(p) = parse_path("/api/v1/namespaces/default/pods/p1/status") else {
            panic!()
        };
        assert_eq!(p.namespace.as_deref(), Some("default"));
        assert_eq!(p.resource, "pods");
        assert_eq!(p.name.as_deref(), Some("p1"));
        assert_eq!(p.subresource.as_deref(), Some("status"));
        let Target::Resource(p) = parse_path("/api/v1/namespaces/kube-system/status") else {
            panic!()
        };
        assert_eq!(p.resource, "namespaces");
        assert_eq!(p.name.as_deref(), Some("kube-system"));
        let Target::Resource(p) = parse_path("/api/v1/namespaces/x") else {
            panic!()
        };
        assert_eq!(
            (p.resource.as_str(), p.name.as_deref(), p.namespace),
            ("namespaces", Some("x"), None)
        );
        let Target::Resource(p) = parse_path("/api/v1/watch/namespaces/d/pods") else {
            panic!()
        };
        assert!(p.watch_prefix);
        assert_eq!(parse_path("/healthz"), Target::NonResource);
        let Target::Resource(p) = parse_path("/api/v1/nodes/n1/proxy/logs/apt/") else {
            panic!()
        };
        assert_eq!(
            (p.name.as_deref(), p.subresource.as_deref()),
            (Some("n1"), Some("proxy"))
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/d/pods/p/log/extra"),
            Target::NonResource
        );
    }
}
