//! Type checking of policies, reported in `status.typeChecking` as
//! upstream's policy controller does: every expression is checked
//! against the schema of each kind the policy's rules name exactly (a
//! wildcard group, version or resource is not checked), `object` and
//! `oldObject` typed by it and `params` by the parameter kind's; a field
//! the schema does not declare is a warning naming the kind. Checked
//! whenever a policy's generation moves past `status.observedGeneration`.

use std::sync::Arc;

use serde_json::{json, Map, Value};

use crate::apiserver::cel::expression;
use crate::apiserver::handlers::{get_object, write_update, Attempt};
use crate::apiserver::matching::strings;
use crate::apiserver::openapi;
use crate::apiserver::resources::{self, ResourceDef};
use crate::apiserver::strategy::admissionpolicy::VARIABLES;
use crate::apiserver::{ApiServer, Req};
use crate::store::follow::{follow, Change};

/// Most levels of `$ref` inlined into a kind's schema (the built-in
/// schemas are finite but some refer to themselves).
const MAX_DEPTH: usize = 12;

/// Check each policy whose status is behind its spec, until shutdown.
pub async fn run(api: Arc<ApiServer>) {
    let prefix = policy_def().prefix(None);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Value>();
    let watch = follow(
        api.store.as_ref(),
        &prefix,
        api.shutdown.clone(),
        "validatingadmissionpolicies typechecking",
        |change| {
            let kvs = match change {
                Change::Reset(kvs) => kvs,
                Change::Put(kv) => vec![kv],
                Change::Delete(_) => Vec::new(),
            };
            for kv in kvs {
                if let Ok(v) = serde_json::from_slice::<Value>(&kv.value) {
                    if v["status"]["observedGeneration"] != v["metadata"]["generation"] {
                        let _ = tx.send(v);
                    }
                }
            }
        },
    );
    let check = async {
        while let Some(policy) = rx.recv().await {
            write_status(&api, &policy).await;
        }
    };
    tokio::select! {
        _ = watch => {}
        _ = check => {}
    }
}

fn policy_def() -> &'static ResourceDef {
    resources::lookup(
        "admissionregistration.k8s.io",
        "v1",
        "validatingadmissionpolicies",
    )
    .expect("admission policies are served")
}

async fn write_status(api: &ApiServer, policy: &Value) {
    let name = policy["metadata"]["name"].as_str().unwrap_or_default();
    let warnings = check(api, policy);
    let r = Req {
        sub: Some("status".into()),
        ..Req::system(policy_def(), "update", None, Some(name.to_string()))
    };
    for _ in 0..5 {
        let Ok((cur, old)) = get_object(api, &r).await else {
            return;
        };
        if old["metadata"]["generation"] != policy["metadata"]["generation"] {
            return; // a newer generation is on its way
        }
        let mut new = old.clone();
        // Upstream omits an empty list.
        let checking = if warnings.is_empty() {
            json!({})
        } else {
            json!({"expressionWarnings": warnings})
        };
        new["status"] = json!({
            "observedGeneration": old["metadata"]["generation"],
            "typeChecking": checking,
        });
        if let Some(conds) = old["status"].get("conditions") {
            new["status"]["conditions"] = conds.clone();
        }
        match write_update(api, &r, &cur, &old, new, false).await {
            Ok(Attempt::Done(_)) => return,
            Ok(Attempt::Retry) => continue,
            Err(e) => {
                tracing::warn!(policy = name, error = %e.message, "typechecking: status write failed");
                return;
            }
        }
    }
}

/// The expression warnings of `policy`: `{fieldRef, warning}` each.
pub fn check(api: &ApiServer, policy: &Value) -> Vec<Value> {
    let spec = &policy["spec"];
    let kinds = checked_kinds(api, spec);
    if kinds.is_empty() {
        return Vec::new();
    }
    let params = spec.get("paramKind").and_then(|pk| {
        let (group, version) = pk["apiVersion"]
            .as_str()?
            .split_once('/')
            .unwrap_or(("", pk["apiVersion"].as_str()?));
        let def = resources::RESOURCES.iter().find(|d| {
            d.group == group && d.version == version && Some(d.kind) == pk["kind"].as_str()
        })?;
        kind_schema(api, def)
    });
    let mut expressions: Vec<(String, &str)> = Vec::new();
    let mut add = |list: &str, key: &str| {
        for (i, e) in spec[list].as_array().into_iter().flatten().enumerate() {
            if let Some(source) = e[key].as_str() {
                expressions.push((format!("spec.{list}[{i}].{key}"), source));
            }
        }
    };
    add("validations", "expression");
    add("validations", "messageExpression");
    add("auditAnnotations", "valueExpression");
    add("matchConditions", "expression");
    add("variables", "expression");
    let mut out = Vec::new();
    for (field, source) in expressions {
        let Ok(p) = expression::compile(source, &VARIABLES) else {
            continue;
        };
        let mut found = Vec::new();
        for (gvk, schema) in &kinds {
            let vars: Vec<(&str, Option<&Value>)> = VARIABLES
                .iter()
                .map(|v| {
                    let schema = match *v {
                        "object" | "oldObject" => Some(schema),
                        "params" => params.as_ref(),
                        _ => None,
                    };
                    (*v, schema)
                })
                .collect();
            if let Some(e) = expression::type_errors(&p, &vars) {
                found.push(format!("{gvk}: {e}"));
            }
        }
        if !found.is_empty() {
            out.push(json!({"fieldRef": field, "warning": found.join("\n")}));
        }
    }
    out
}

/// `GROUP/VERSION, Kind=KIND` and the schema of each kind the rules name
/// exactly.
fn checked_kinds(api: &ApiServer, spec: &Value) -> Vec<(String, Value)> {
    let mut out: Vec<(String, Value)> = Vec::new();
    for rule in spec["matchConstraints"]["resourceRules"]
        .as_array()
        .into_iter()
        .flatten()
    {
        for group in strings(&rule["apiGroups"]) {
            for version in strings(&rule["apiVersions"]) {
                for resource in strings(&rule["resources"]) {
                    if [&group, &version, &resource]
                        .iter()
                        .any(|s| s.contains('*'))
                    {
                        continue;
                    }
                    // A subresource's object is another kind (a Scale):
                    // not checked.
                    if resource.contains('/') {
                        continue;
                    }
                    let def = resources::lookup(&group, &version, &resource)
                        .or_else(|| api.crds.lookup(&group, &version, &resource));
                    let Some(def) = def else { continue };
                    let gvk = match def.group {
                        "" => format!("{}, Kind={}", def.version, def.kind),
                        g => format!("{g}/{}, Kind={}", def.version, def.kind),
                    };
                    if out.iter().any(|(k, _)| *k == gvk) {
                        continue;
                    }
                    if let Some(schema) = kind_schema(api, def) {
                        out.push((gvk, schema));
                    }
                }
            }
        }
    }
    out
}

/// The kind's schema with its references inlined: a custom kind's from
/// its definition, a built-in's from the OpenAPI document of its group
/// version.
fn kind_schema(api: &ApiServer, def: &ResourceDef) -> Option<Value> {
    if let Some(s) = def.model.and_then(|m| m.json_schema()) {
        return Some(Value::clone(&s));
    }
    let path = match def.group {
        "" => format!("api/{}", def.version),
        g => format!("apis/{g}/{}", def.version),
    };
    let doc: Value = serde_json::from_slice(&openapi::document(&api.crds, &path)?.body).ok()?;
    let schemas = doc["components"]["schemas"].as_object()?;
    let root = schemas.values().find(|s| {
        s["x-kubernetes-group-version-kind"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|g| {
                g["group"] == def.group && g["version"] == def.version && g["kind"] == def.kind
            })
    })?;
    Some(inline(root, schemas, 0))
}

/// `schema` with `$ref`s (also as the one item of `allOf`) replaced by
/// what they point to, to [`MAX_DEPTH`]; deeper, an untyped node.
fn inline(schema: &Value, schemas: &Map<String, Value>, depth: usize) -> Value {
    if depth > MAX_DEPTH {
        return json!({"x-kubernetes-preserve-unknown-fields": true});
    }
    let target = schema["$ref"].as_str().or_else(|| {
        schema["allOf"]
            .as_array()
            .filter(|a| a.len() == 1)
            .and_then(|a| a[0]["$ref"].as_str())
    });
    if let Some(r) = target {
        let name = r.trim_start_matches("#/components/schemas/");
        return match schemas.get(name) {
            Some(s) => inline(s, schemas, depth + 1),
            None => json!({"x-kubernetes-preserve-unknown-fields": true}),
        };
    }
    let Value::Object(m) = schema else {
        return schema.clone();
    };
    let mut out = Map::new();
    for (k, v) in m {
        let v = match k.as_str() {
            "properties" => Value::Object(
                v.as_object()
                    .into_iter()
                    .flatten()
                    .map(|(p, s)| (p.clone(), inline(s, schemas, depth + 1)))
                    .collect(),
            ),
            "items" | "additionalProperties" if v.is_object() => inline(v, schemas, depth + 1),
            "description" => continue,
            _ => v.clone(),
        };
        out.insert(k.clone(), v);
    }
    Value::Object(out)
}
