//! What one API server serves beyond its built-in kinds: a row per served
//! version of every Established definition, and their groups' versions in
//! discovery order. The establishing loop ([`super::establish`]) refills
//! it from the store; routing, discovery and OpenAPI read it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use serde_json::Value;

use super::conversion::Webhook;
use super::custom::{CustomKind, PrinterColumn, Rules, ScalePaths};
use super::intern;
use super::versions;
use crate::apiserver::objects;
use crate::apiserver::resources::{self, ResourceDef};

/// A custom group and its served versions, the preferred first.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    pub name: String,
    pub versions: Vec<String>,
}

#[derive(Default)]
struct Served {
    defs: Vec<&'static ResourceDef>,
    groups: Vec<Group>,
    /// (group, plural) of definitions being deleted.
    terminating: Vec<(String, String)>,
}

/// The custom kinds one server serves.
pub struct Registry {
    /// Tells this server's rows from another's in the same process (the
    /// tests run many servers in one).
    id: u64,
    served: RwLock<Arc<Served>>,
}

impl Default for Registry {
    fn default() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Registry {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            served: RwLock::default(),
        }
    }
}

/// What makes a row: a change to any of it is a new row.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct RowKey {
    server: u64,
    group: String,
    version: String,
    plural: String,
    kind: String,
    singular: String,
    namespaced: bool,
    status: bool,
    scale: bool,
    short_names: Vec<String>,
    categories: Vec<String>,
}

type Row = (&'static ResourceDef, &'static CustomKind);

static ROWS: Mutex<Option<HashMap<RowKey, Row>>> = Mutex::new(None);

fn row(key: RowKey) -> Row {
    let mut rows = ROWS.lock().expect("custom rows lock");
    let rows = rows.get_or_insert_with(HashMap::new);
    if let Some(r) = rows.get(&key) {
        return *r;
    }
    let kind: &'static CustomKind = Box::leak(Box::default());
    let def: &'static ResourceDef = Box::leak(Box::new(ResourceDef {
        group: intern::str(&key.group),
        version: intern::str(&key.version),
        kind: intern::str(&key.kind),
        plural: intern::str(&key.plural),
        namespaced: key.namespaced,
        short_names: intern::strs(&key.short_names),
        singular_name: Some(intern::str(&key.singular)),
        categories: intern::strs(&key.categories),
        status: key.status,
        scale: key.scale,
        computed: None,
        stored_as: None,
        model: Some(kind),
        strategy: kind,
    }));
    rows.insert(key, (def, kind));
    (def, kind)
}

fn strings(v: &Value) -> Vec<String> {
    objects::str_list(v).into_iter().map(String::from).collect()
}

fn printer_columns(v: &Value) -> Option<Vec<PrinterColumn>> {
    let cols = v.as_array()?;
    Some(
        cols.iter()
            .map(|c| PrinterColumn {
                name: intern::str(c["name"].as_str().unwrap_or_default()),
                ty: intern::str(c["type"].as_str().unwrap_or("string")),
                description: intern::str(c["description"].as_str().unwrap_or_default()),
                priority: c["priority"].as_u64().unwrap_or(0).min(255) as u8,
                path: c["jsonPath"].as_str().unwrap_or_default().to_string(),
            })
            .collect(),
    )
}

fn scale_paths(v: &Value) -> Option<ScalePaths> {
    let s = v.as_object()?;
    Some(ScalePaths {
        spec_replicas: s.get("specReplicasPath")?.as_str()?.to_string(),
        status_replicas: s.get("statusReplicasPath")?.as_str()?.to_string(),
        label_selector: s
            .get("labelSelectorPath")
            .and_then(Value::as_str)
            .map(String::from),
    })
}

/// Whether a definition's condition `ty` is True.
pub fn condition_true(crd: &Value, ty: &str) -> bool {
    crd["status"]["conditions"]
        .as_array()
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == ty && c["status"] == "True"))
}

impl Registry {
    /// Serve exactly the served versions of the Established definitions
    /// among `crds`, under their accepted names.
    pub fn set(&self, crds: &[Value]) {
        let mut defs = Vec::new();
        let mut groups: Vec<Group> = Vec::new();
        let mut terminating = Vec::new();
        for crd in crds {
            if crd["metadata"]["deletionTimestamp"].is_string() {
                terminating.push((
                    crd["spec"]["group"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    crd["spec"]["names"]["plural"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                ));
            }
            if !condition_true(crd, "Established") {
                continue;
            }
            let spec = &crd["spec"];
            let names = match &crd["status"]["acceptedNames"] {
                n if n["plural"].is_string() => n,
                _ => &spec["names"],
            };
            let group = spec["group"].as_str().unwrap_or_default().to_string();
            let storage = spec["versions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|v| v["storage"] == true)
                .and_then(|v| v["name"].as_str())
                .unwrap_or_default();
            let stored_api_version = format!("{group}/{storage}");
            let conversion = Webhook::of_definition(spec).map(Arc::new);
            let mut served_versions = Vec::new();
            for v in spec["versions"].as_array().into_iter().flatten() {
                if v["served"] != true {
                    continue;
                }
                let version = v["name"].as_str().unwrap_or_default().to_string();
                let subs = &v["subresources"];
                let key = RowKey {
                    server: self.id,
                    group: group.clone(),
                    version: version.clone(),
                    plural: names["plural"].as_str().unwrap_or_default().to_string(),
                    kind: names["kind"].as_str().unwrap_or_default().to_string(),
                    singular: names["singular"].as_str().unwrap_or_default().to_string(),
                    namespaced: spec["scope"] == "Namespaced",
                    status: subs["status"].is_object(),
                    scale: subs["scale"].is_object(),
                    short_names: strings(&names["shortNames"]),
                    categories: strings(&names["categories"]),
                };
                let (def, kind) = row(key);
                let selectable: Vec<String> = v["selectableFields"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|f| f["jsonPath"].as_str())
                    .map(|p| p.trim_start_matches('.').to_string())
                    .collect();
                kind.set_rules(Rules {
                    schema: v["schema"]["openAPIV3Schema"]
                        .is_object()
                        .then(|| Arc::new(v["schema"]["openAPIV3Schema"].clone())),
                    columns: printer_columns(&v["additionalPrinterColumns"]),
                    scale: scale_paths(&subs["scale"]),
                    status: subs["status"].is_object(),
                    stored_api_version: stored_api_version.clone(),
                    conversion: conversion.clone(),
                    selectable: intern::strs(&selectable),
                });
                defs.push(def);
                served_versions.push(version);
            }
            if served_versions.is_empty() {
                continue;
            }
            match groups.iter_mut().find(|g| g.name == group) {
                Some(g) => {
                    for v in served_versions {
                        if !g.versions.contains(&v) {
                            g.versions.push(v);
                        }
                    }
                }
                None => groups.push(Group {
                    name: group,
                    versions: served_versions,
                }),
            }
        }
        for g in &mut groups {
            versions::sort(&mut g.versions);
        }
        groups.sort_by(|a, b| a.name.cmp(&b.name));
        *self.served.write().expect("custom registry lock") = Arc::new(Served {
            defs,
            groups,
            terminating,
        });
    }

    fn now(&self) -> Arc<Served> {
        self.served.read().expect("custom registry lock").clone()
    }

    /// The resource served at `group`/`version` under `plural`: a
    /// built-in one, else a custom one.
    pub fn lookup(&self, group: &str, version: &str, plural: &str) -> Option<&'static ResourceDef> {
        resources::lookup(group, version, plural).or_else(|| {
            self.now()
                .defs
                .iter()
                .find(|r| r.group == group && r.version == version && r.plural == plural)
                .copied()
        })
    }

    /// Served groups in discovery order (built-in, then custom), each
    /// with its versions, the preferred first.
    pub fn groups(&self) -> Vec<Group> {
        let mut out: Vec<Group> = resources::groups()
            .into_iter()
            .map(|g| Group {
                name: g.to_string(),
                versions: vec!["v1".into()],
            })
            .collect();
        out.extend(self.now().groups.iter().cloned());
        out
    }

    /// Resources of one group version, built-in or custom.
    pub fn in_group_version(&self, group: &str, version: &str) -> Vec<&'static ResourceDef> {
        let mut out = resources::in_group_version(group, version);
        if out.is_empty() {
            out = self
                .now()
                .defs
                .iter()
                .filter(|r| r.group == group && r.version == version)
                .copied()
                .collect();
        }
        out
    }

    /// Whether the definition of `group`/`plural` is being deleted.
    pub fn is_terminating(&self, group: &str, plural: &str) -> bool {
        self.now()
            .terminating
            .iter()
            .any(|(g, p)| g == group && p == plural)
    }

    /// Whether a custom definition serves this group version.
    pub fn is_custom(&self, group: &str, version: &str) -> bool {
        self.now()
            .defs
            .iter()
            .any(|r| r.group == group && r.version == version)
    }
}
