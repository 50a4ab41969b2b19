//! OpenAPI v3 documents, built from k8s-openapi's `schemars` schemas.
//!
//! kubectl (1.27+) reads `/openapi/v3` before `apply` and `create`: when a
//! group's PATCH operations list the `fieldValidation` query parameter it
//! leaves validation to the server, which then reports unknown fields
//! (`fieldValidation=Strict|Warn|Ignore`). The PATCH operations carry no
//! strategic-merge request body on purpose: kubectl then computes its
//! strategic merge patches from its compiled-in types, whose merge keys
//! are exactly upstream's.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde_json::{json, Map, Value};

use bytes::Bytes;

use super::crd::Registry;
use super::resources::{self, ResourceDef};

/// One group version's document, serialized once, with its content hash.
pub struct Doc {
    /// Shared, so that answering with a built-in document copies nothing.
    pub body: Bytes,
    pub hash: String,
}

static DOCS: OnceLock<BTreeMap<String, Doc>> = OnceLock::new();

/// `api/v1`, `apis/apps/v1`, ...
fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

fn docs() -> &'static BTreeMap<String, Doc> {
    DOCS.get_or_init(|| {
        let mut out = BTreeMap::new();
        let mut gvs: Vec<(&str, &str)> = Vec::new();
        for r in resources::RESOURCES {
            if !gvs.contains(&(r.group, r.version)) {
                gvs.push((r.group, r.version));
            }
        }
        for (g, v) in gvs {
            let doc = build(
                &resources::in_group_version(g, v),
                schemas(g, v),
                schema_name,
            );
            let body = serde_json::to_vec(&doc).unwrap_or_default();
            let hash = fnv_hex(&body);
            out.insert(
                gv_path(g, v),
                Doc {
                    body: body.into(),
                    hash,
                },
            );
        }
        out
    })
}

fn fnv_hex(b: &[u8]) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for x in b {
        h ^= *x as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    format!("{h:016X}")
}

/// The `/openapi/v3` index: the built-in group versions and those of
/// the custom kinds served now.
pub fn index(crds: &Registry) -> Value {
    let mut paths: Map<String, Value> = docs()
        .iter()
        .map(|(p, d)| {
            (
                p.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={}", d.hash)}),
            )
        })
        .collect();
    for g in crds.groups() {
        for v in &g.versions {
            let p = gv_path(&g.name, v);
            if paths.contains_key(&p) {
                continue;
            }
            if let Some(d) = custom_document(crds, &g.name, v) {
                paths.insert(
                    p.clone(),
                    json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={}", d.hash)}),
                );
            }
        }
    }
    json!({"paths": paths})
}

/// The document of `/openapi/v3/<path>`.
pub fn document(crds: &Registry, path: &str) -> Option<Doc> {
    let path = path.trim_matches('/');
    if let Some(d) = docs().get(path) {
        return Some(Doc {
            body: d.body.clone(),
            hash: d.hash.clone(),
        });
    }
    let (group, version) = path.strip_prefix("apis/")?.split_once('/')?;
    custom_document(crds, group, version)
}

/// A custom group version's document, built from the definitions' schemas
/// each time (they change with the definitions; there are few).
fn custom_document(crds: &Registry, group: &str, version: &str) -> Option<Doc> {
    if !crds.is_custom(group, version) {
        return None;
    }
    let defs = crds.in_group_version(group, version);
    let mut gen = schemars::generate::SchemaSettings::openapi3().into_generator();
    gen.subschema_for::<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>();
    let mut out = gen.take_definitions(true);
    for r in &defs {
        out.insert(custom_schema_name(r), custom_schema(r));
    }
    let doc = build(&defs, out, custom_schema_name);
    let body = serde_json::to_vec(&doc).unwrap_or_default();
    let hash = fnv_hex(&body);
    Some(Doc {
        body: body.into(),
        hash,
    })
}

/// Upstream names a custom kind's schema by its reversed group:
/// `com.example.v1.Widget`.
fn custom_schema_name(r: &ResourceDef) -> String {
    let reversed: Vec<&str> = r.group.split('.').rev().collect();
    format!("{}.{}.{}", reversed.join("."), r.version, r.kind)
}

/// The definition's schema with the standard object fields, as upstream
/// publishes it.
fn custom_schema(r: &ResourceDef) -> Value {
    let mut schema = r
        .model
        .and_then(|m| m.json_schema())
        .map(|s| Value::clone(&s))
        .unwrap_or_else(|| json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}));
    if let Some(m) = schema.as_object_mut() {
        let props = m.entry("properties").or_insert_with(|| json!({}));
        if let Some(p) = props.as_object_mut() {
            p.insert("apiVersion".into(), json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object."}));
            p.insert("kind".into(), json!({"type": "string", "description": "Kind is a string value representing the REST resource this object represents."}));
            p.insert("metadata".into(), json!({"allOf": [{"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}], "description": "Standard object's metadata."}));
        }
        m.insert(
            "x-kubernetes-group-version-kind".into(),
            json!([{"group": r.group, "version": r.version, "kind": r.kind}]),
        );
    }
    schema
}

fn schema_name(r: &ResourceDef) -> String {
    let g = match r.group {
        "" => "core".to_string(),
        g => g.split('.').next().unwrap_or(g).to_string(),
    };
    format!("io.k8s.api.{g}.{}.{}", r.version, r.kind)
}

fn schemas(group: &str, version: &str) -> Map<String, Value> {
    let mut gen = schemars::generate::SchemaSettings::openapi3().into_generator();
    for r in resources::in_group_version(group, version) {
        if let Some(m) = r.model {
            m.add_schema(&mut gen);
        }
    }
    let mut defs = gen.take_definitions(true);
    for r in resources::in_group_version(group, version) {
        if let Some(Value::Object(s)) = defs.get_mut(&schema_name(r)) {
            s.insert(
                "x-kubernetes-group-version-kind".into(),
                json!([{"group": r.group, "version": r.version, "kind": r.kind}]),
            );
        }
    }
    // Upstream's strategic-merge tags, for clients that read them from here.
    for (schema, field, key) in PATCH_KEYS {
        if let Some(p) = defs
            .get_mut(*schema)
            .and_then(|s| s.get_mut("properties"))
            .and_then(|p| p.get_mut(*field))
        {
            if let Some(p) = p.as_object_mut() {
                p.insert("x-kubernetes-patch-strategy".into(), json!("merge"));
                if !key.is_empty() {
                    p.insert("x-kubernetes-patch-merge-key".into(), json!(key));
                }
            }
        }
    }
    defs
}

/// (schema, property, merge key) of upstream's `patchStrategy:"merge"` lists.
const PATCH_KEYS: &[(&str, &str, &str)] = &[
    ("io.k8s.api.core.v1.PodSpec", "containers", "name"),
    ("io.k8s.api.core.v1.PodSpec", "initContainers", "name"),
    ("io.k8s.api.core.v1.PodSpec", "ephemeralContainers", "name"),
    ("io.k8s.api.core.v1.PodSpec", "volumes", "name"),
    ("io.k8s.api.core.v1.PodSpec", "imagePullSecrets", "name"),
    ("io.k8s.api.core.v1.PodSpec", "hostAliases", "ip"),
    ("io.k8s.api.core.v1.Container", "env", "name"),
    ("io.k8s.api.core.v1.Container", "ports", "containerPort"),
    ("io.k8s.api.core.v1.Container", "volumeMounts", "mountPath"),
    (
        "io.k8s.api.core.v1.Container",
        "volumeDevices",
        "devicePath",
    ),
    ("io.k8s.api.core.v1.ServiceSpec", "ports", "port"),
    ("io.k8s.api.core.v1.PodStatus", "conditions", "type"),
    ("io.k8s.api.core.v1.NodeStatus", "conditions", "type"),
    ("io.k8s.api.core.v1.NodeStatus", "addresses", "type"),
    (
        "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
        "finalizers",
        "",
    ),
    (
        "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
        "ownerReferences",
        "uid",
    ),
];

fn param(name: &str, location: &str, required: bool) -> Value {
    json!({"name": name, "in": location, "required": required, "schema": {"type": "string", "uniqueItems": true}})
}

fn op(r: &ResourceDef, action: &str, verb_id: &str, extra: Vec<Value>, schema_ref: &str) -> Value {
    let mut params = extra;
    params.push(param("pretty", "query", false));
    json!({
        "operationId": format!("{verb_id}{}", r.kind),
        "tags": [if r.group.is_empty() { "core_v1".to_string() } else { format!("{}_v1", r.group.split('.').next().unwrap_or(r.group)) }],
        "parameters": params,
        "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": {"$ref": schema_ref}}}}},
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": {"group": r.group, "version": r.version, "kind": r.kind},
    })
}

fn build(
    defs: &[&'static ResourceDef],
    schemas: Map<String, Value>,
    schema_name: fn(&ResourceDef) -> String,
) -> Value {
    let mut paths = Map::new();
    for &r in defs {
        let base = format!("/{}", gv_path(r.group, r.version));
        let coll = if r.namespaced {
            format!("{base}/namespaces/{{namespace}}/{}", r.plural)
        } else {
            format!("{base}/{}", r.plural)
        };
        let item = format!("{coll}/{{name}}");
        let sref = format!("#/components/schemas/{}", schema_name(r));
        let mut path_params = vec![param("name", "path", true)];
        if r.namespaced {
            path_params.push(param("namespace", "path", true));
        }
        let validation = vec![
            param("dryRun", "query", false),
            param("fieldManager", "query", false),
            param("fieldValidation", "query", false),
        ];
        let body = json!({"content": {"*/*": {"schema": {"$ref": sref}}}});
        let mut create = op(r, "post", "create", validation.clone(), &sref);
        create["requestBody"] = body.clone();
        let mut replace = op(r, "put", "replace", validation.clone(), &sref);
        replace["requestBody"] = body;
        let coll_params: Vec<Value> = if r.namespaced {
            vec![param("namespace", "path", true)]
        } else {
            vec![]
        };
        paths.insert(
            coll,
            json!({
                "get": op(r, "list", "list", vec![param("labelSelector", "query", false), param("fieldSelector", "query", false), param("limit", "query", false), param("continue", "query", false), param("watch", "query", false)], &sref),
                "post": create,
                "delete": op(r, "deletecollection", "deletecollection", vec![], &sref),
                "parameters": coll_params,
            }),
        );
        paths.insert(
            item,
            json!({
                "get": op(r, "get", "read", vec![], &sref),
                "put": replace,
                "patch": op(r, "patch", "patch", validation.clone(), &sref),
                "delete": op(r, "delete", "delete", vec![param("gracePeriodSeconds", "query", false), param("propagationPolicy", "query", false)], &sref),
                "parameters": path_params,
            }),
        );
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": format!("v1.{}.0", super::discovery::KUBE_MINOR)},
        "paths": paths,
        "components": {"schemas": schemas},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apps_document_has_gvk_and_field_validation() {
        let doc: Value =
            serde_json::from_slice(&document(&Registry::default(), "apis/apps/v1").unwrap().body)
                .unwrap();
        let p = &doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"];
        assert_eq!(p["x-kubernetes-group-version-kind"]["kind"], "Deployment");
        assert!(p["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["name"] == "fieldValidation"));
        assert!(doc["components"]["schemas"]["io.k8s.api.apps.v1.Deployment"].is_object());
        assert!(
            index(&Registry::default())["paths"]["api/v1"]["serverRelativeURL"]
                .as_str()
                .unwrap()
                .starts_with("/openapi/v3/api/v1?hash=")
        );
    }
}
