//! Discovery documents: `/version`, `/api`, `/apis`, group-version resource
//! lists, and aggregated discovery (`apidiscovery.k8s.io/v2`), which kubectl
//! asks for first and which saves it one request per group.

use serde_json::{json, Value};

use super::crd::registry::{Group, Registry};
use super::resources::ResourceDef;

/// The Kubernetes version this server speaks.
pub const KUBE_MINOR: &str = "33";

pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": KUBE_MINOR,
        "gitVersion": format!("v1.{KUBE_MINOR}.0-skiff.{}", env!("CARGO_PKG_VERSION")),
        "gitCommit": env!("SKIFF_GIT_COMMIT"),
        "gitTreeState": env!("SKIFF_GIT_TREE_STATE"),
        "buildDate": env!("SKIFF_BUILD_DATE"),
        "goVersion": "rust",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, if cfg!(target_arch = "x86_64") { "amd64" } else { std::env::consts::ARCH }),
    })
}

pub fn core_versions() -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}],
    })
}

fn group_json(g: &Group) -> Value {
    let versions: Vec<Value> = g
        .versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{}/{v}", g.name), "version": v}))
        .collect();
    let preferred = versions.first().cloned().unwrap_or(Value::Null);
    json!({"name": g.name, "versions": versions, "preferredVersion": preferred})
}

pub fn groups(crds: &Registry) -> Value {
    let groups: Vec<Value> = crds.groups().iter().map(group_json).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

pub fn group(crds: &Registry, g: &str) -> Option<Value> {
    crds.groups().iter().find(|x| x.name == g).map(|x| {
        let mut v = group_json(x);
        v["kind"] = json!("APIGroup");
        v["apiVersion"] = json!("v1");
        v
    })
}

fn resource_json(r: &ResourceDef) -> Value {
    let mut v = json!({
        "name": r.plural,
        "singularName": r.singular(),
        "namespaced": r.namespaced,
        "kind": r.kind,
        "verbs": r.verbs(),
        "storageVersionHash": "",
    });
    if !r.short_names.is_empty() {
        v["shortNames"] = json!(r.short_names);
    }
    if !r.categories.is_empty() {
        v["categories"] = json!(r.categories);
    }
    v
}

/// `APIResourceList` for one group version; None when not served.
pub fn group_version(crds: &Registry, group: &str, version: &str) -> Option<Value> {
    let rs = crds.in_group_version(group, version);
    if rs.is_empty() {
        return None;
    }
    let mut list = Vec::new();
    for r in rs {
        list.push(resource_json(r));
        for sub in r.subresources() {
            let mut s = json!({"name": format!("{}/{}", r.plural, sub.name), "singularName": "", "namespaced": r.namespaced, "kind": sub.kind, "verbs": sub.verbs});
            if let Some((group, version)) = sub.group_version {
                s["group"] = json!(group);
                s["version"] = json!(version);
            }
            list.push(s);
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": list}),
    )
}

/// Whether the Accept header asks for aggregated discovery v2.
pub fn wants_aggregated(accept: &str) -> bool {
    accept.split(',').any(|a| {
        a.contains("as=APIGroupDiscoveryList") && a.contains("v=v2") && !a.contains("v=v2beta1")
    })
}

/// Aggregated discovery (`APIGroupDiscoveryList`) for `/api` (core only) or
/// `/apis` (every named group).
pub fn aggregated(crds: &Registry, core: bool) -> Value {
    let groups: Vec<Group> = if core {
        vec![Group {
            name: String::new(),
            versions: vec!["v1".into()],
        }]
    } else {
        crds.groups()
    };
    let items: Vec<Value> = groups
        .iter()
        .map(|g| {
            let versions: Vec<Value> = g
                .versions
                .iter()
                .map(|v| aggregated_version(crds, &g.name, v))
                .collect();
            json!({
                "metadata": {"name": g.name, "creationTimestamp": null},
                "versions": versions,
            })
        })
        .collect();
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items})
}

/// One version of a group in aggregated discovery.
fn aggregated_version(crds: &Registry, g: &str, version: &str) -> Value {
    let resources: Vec<Value> = crds
        .in_group_version(g, version)
        .into_iter()
        .map(aggregated_resource)
        .collect();
    json!({"version": version, "resources": resources, "freshness": "Current"})
}

/// One resource of a group version in aggregated discovery.
fn aggregated_resource(r: &ResourceDef) -> Value {
    let subs: Vec<Value> = r
        .subresources()
        .into_iter()
        .map(|sub| {
            let (sg, sv) = sub.group_version.unwrap_or((r.group, r.version));
            json!({"subresource": sub.name, "responseKind": {"group": sg, "version": sv, "kind": sub.kind}, "verbs": sub.verbs})
        })
        .collect();
    let mut v = json!({
        "resource": r.plural,
        "responseKind": {"group": r.group, "version": r.version, "kind": r.kind},
        "scope": if r.namespaced { "Namespaced" } else { "Cluster" },
        "singularResource": r.singular(),
        "verbs": r.verbs(),
        "subresources": subs,
    });
    if !r.short_names.is_empty() {
        v["shortNames"] = json!(r.short_names);
    }
    if !r.categories.is_empty() {
        v["categories"] = json!(r.categories);
    }
    v
}

/// Content-Type of an aggregated discovery answer.
pub const AGGREGATED_CONTENT_TYPE: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents() {
        let crds = Registry::default();
        let v1 = group_version(&crds, "", "v1").unwrap();
        let pods = v1["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "pods")
            .unwrap();
        assert_eq!(pods["shortNames"], json!(["po"]));
        assert_eq!(pods["categories"], json!(["all"]));
        assert!(group_version(&crds, "nope", "v1").is_none());
        assert!(wants_aggregated(
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
        ));
        assert!(!wants_aggregated("application/json"));
        assert_eq!(
            aggregated(&crds, false)["items"].as_array().unwrap().len(),
            crate::apiserver::resources::groups().len()
        );
    }
}
