//! The CustomResourceDefinition kind's rules (upstream's
//! `apiextensions-apiserver/pkg/registry/customresourcedefinition` and
//! `apis/apiextensions/validation`): names, scope, versions, schemas,
//! subresources and printer columns are checked on every write; a
//! deletion marks the definition and leaves the removal of its objects to
//! the cleanup finalizer.

use serde_json::{json, Value};

use super::{jsonpath, structural, CLEANUP_FINALIZER};
use crate::apiserver::cel;
use crate::apiserver::handlers::DeleteOptions;
use crate::apiserver::objects::{self, meta_mut};
use crate::apiserver::status::Cause;
use crate::apiserver::strategy::{self, webhookconfig, Strategy};
use crate::apiserver::table::{self, Col};
use crate::apiserver::validation::{dns1035_label, dns_subdomain, is_dns1035_label};
use crate::apiserver::ApiServer;

pub struct Definition;

const SCOPES: &[&str] = &["Cluster", "Namespaced"];
const COLUMN_TYPES: &[&str] = &["integer", "number", "string", "boolean", "date"];
const COLUMN_FORMATS: &[&str] = &[
    "int32",
    "int64",
    "float",
    "double",
    "byte",
    "date",
    "date-time",
    "password",
];

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

fn names(n: &Value, path: &str, c: &mut Vec<Cause>) {
    for f in ["plural", "singular"] {
        let v = s(&n[f]);
        if !v.is_empty() {
            dns1035_label(&format!("{path}.{f}"), v, c);
        } else if f == "plural" {
            c.push(Cause::required(format!("{path}.{f}")));
        }
    }
    let kind = s(&n["kind"]);
    if kind.is_empty() {
        c.push(Cause::required(format!("{path}.kind")));
    } else {
        kind_name(&format!("{path}.kind"), kind, c);
    }
    let list = s(&n["listKind"]);
    if !list.is_empty() {
        kind_name(&format!("{path}.listKind"), list, c);
        if list == kind {
            c.push(Cause::invalid(
                format!("{path}.listKind"),
                list,
                "kind and listKind may not be the same",
            ));
        }
    }
    for key in ["shortNames", "categories"] {
        let mut seen: Vec<&str> = Vec::new();
        for (i, x) in n[key].as_array().into_iter().flatten().enumerate() {
            let field = format!("{path}.{key}[{i}]");
            dns1035_label(&field, s(x), c);
            if seen.contains(&s(x)) {
                c.push(Cause::duplicate(field, s(x)));
            }
            seen.push(s(x));
        }
    }
}

/// Kinds are DNS-1035 labels once lower-cased (upstream's rule).
fn kind_name(field: &str, kind: &str, c: &mut Vec<Cause>) {
    if !is_dns1035_label(&kind.to_lowercase()) {
        c.push(Cause::invalid(
            field,
            kind,
            "may have mixed case, but should otherwise match: [a-z]([-a-z0-9]*[a-z0-9])?",
        ));
    }
}

fn subresources(subs: &Value, path: &str, c: &mut Vec<Cause>) {
    let Some(scale) = subs.get("scale").filter(|v| !v.is_null()) else {
        return;
    };
    let path = format!("{path}.scale");
    for (f, under) in [
        ("specReplicasPath", &[".spec."][..]),
        ("statusReplicasPath", &[".status."][..]),
        ("labelSelectorPath", &[".spec.", ".status."][..]),
    ] {
        let field = format!("{path}.{f}");
        match scale.get(f).and_then(Value::as_str) {
            None if f == "labelSelectorPath" => {}
            None | Some("") => c.push(Cause::required(field)),
            Some(p) => {
                let simple = p
                    .split('.')
                    .skip(1)
                    .all(|seg| !seg.is_empty() && !seg.contains(['[', ']', '*']));
                if !under.iter().any(|u| p.starts_with(u)) || !simple {
                    let prefix = under
                        .iter()
                        .map(|u| u.trim_end_matches('.'))
                        .collect::<Vec<_>>()
                        .join(" or ");
                    c.push(Cause::invalid(
                        field,
                        p,
                        &format!("should be a json path under {prefix}"),
                    ));
                }
            }
        }
    }
}

fn printer_columns(cols: &Value, path: &str, c: &mut Vec<Cause>) {
    for (i, col) in cols.as_array().into_iter().flatten().enumerate() {
        let at = format!("{path}[{i}]");
        if s(&col["name"]).is_empty() {
            c.push(Cause::required(format!("{at}.name")));
        }
        match s(&col["type"]) {
            "" => c.push(Cause::required(format!("{at}.type"))),
            t if !COLUMN_TYPES.contains(&t) => {
                c.push(Cause::not_supported(format!("{at}.type"), t, COLUMN_TYPES))
            }
            _ => {}
        }
        let format = s(&col["format"]);
        if !format.is_empty() && !COLUMN_FORMATS.contains(&format) {
            c.push(Cause::not_supported(
                format!("{at}.format"),
                format,
                COLUMN_FORMATS,
            ));
        }
        match s(&col["jsonPath"]) {
            "" => c.push(Cause::required(format!("{at}.jsonPath"))),
            p => {
                if let Err(e) = jsonpath::check(p) {
                    c.push(Cause::invalid(format!("{at}.jsonPath"), p, &e));
                }
            }
        }
    }
}

fn versions(spec: &Value, c: &mut Vec<Cause>) {
    let Some(vs) = spec["versions"].as_array().filter(|a| !a.is_empty()) else {
        c.push(Cause::required_because(
            "spec.versions",
            "must have exactly one version marked as storage version",
        ));
        return;
    };
    let mut seen: Vec<&str> = Vec::new();
    let mut storage = 0;
    let mut served = 0;
    for (i, v) in vs.iter().enumerate() {
        let path = format!("spec.versions[{i}]");
        let name = s(&v["name"]);
        dns1035_label(&format!("{path}.name"), name, c);
        if seen.contains(&name) {
            c.push(Cause::duplicate(format!("{path}.name"), name));
        }
        seen.push(name);
        storage += usize::from(v["storage"] == true);
        served += usize::from(v["served"] == true);
        let schema_path = format!("{path}.schema.openAPIV3Schema");
        match v["schema"]["openAPIV3Schema"]
            .as_object()
            .filter(|o| !o.is_empty())
        {
            None => c.push(Cause::required_because(schema_path, "schemas are required")),
            Some(_) => {
                let schema = &v["schema"]["openAPIV3Schema"];
                let structural = structural::check(schema, &schema_path);
                // Rules are typed by the schema: only a structural one
                // can type them.
                if structural.is_empty() {
                    c.extend(cel::check(schema, &schema_path));
                }
                c.extend(structural);
            }
        }
        subresources(&v["subresources"], &format!("{path}.subresources"), c);
        printer_columns(
            &v["additionalPrinterColumns"],
            &format!("{path}.additionalPrinterColumns"),
            c,
        );
        for (j, f) in v["selectableFields"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let field = format!("{path}.selectableFields[{j}].jsonPath");
            match s(&f["jsonPath"]) {
                "" => c.push(Cause::required(field)),
                p if !p.starts_with('.') || p.contains(['[', '*']) => c.push(Cause::invalid(
                    field,
                    p,
                    "must be a simple json path starting with .",
                )),
                _ => {}
            }
        }
    }
    if storage != 1 {
        c.push(Cause::invalid(
            "spec.versions",
            "",
            "must have exactly one version marked as storage version",
        ));
    }
    if served == 0 {
        c.push(Cause::invalid(
            "spec.versions",
            "",
            "must have at least one version marked as served",
        ));
    }
}

/// Upstream's `ValidateCustomResourceConversion`; its causes name the
/// internal fields (`webhookClientConfig`), as upstream's do.
fn conversion(spec: &Value, c: &mut Vec<Cause>) {
    let conv = &spec["conversion"];
    let webhook = &conv["webhook"];
    match s(&conv["strategy"]) {
        "" | "None" => {
            let forbidden = "should not be set when strategy is not set to Webhook";
            if !webhook["clientConfig"].is_null() {
                c.push(Cause::forbidden(
                    "spec.conversion.webhookClientConfig",
                    forbidden,
                ));
            }
            if webhook["conversionReviewVersions"]
                .as_array()
                .is_some_and(|v| !v.is_empty())
            {
                c.push(Cause::forbidden(
                    "spec.conversion.conversionReviewVersions",
                    forbidden,
                ));
            }
        }
        "Webhook" => {
            if webhook["clientConfig"].is_object() {
                webhookconfig::client_config(
                    &webhook["clientConfig"],
                    "spec.conversion.webhookClientConfig",
                    c,
                );
            } else {
                c.push(Cause::required_because(
                    "spec.conversion.webhookClientConfig",
                    "required when strategy is set to Webhook",
                ));
            }
            review_versions(&webhook["conversionReviewVersions"], c);
        }
        other => c.push(Cause::not_supported(
            "spec.conversion.strategy",
            other,
            &["None", "Webhook"],
        )),
    }
}

/// DNS labels, no duplicates, at least one this server speaks.
fn review_versions(versions: &Value, c: &mut Vec<Cause>) {
    let field = "spec.conversion.conversionReviewVersions";
    let known = "must include at least one of v1, v1beta1";
    let list: Vec<&str> = versions
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| v.as_str().unwrap_or_default())
        .collect();
    if list.is_empty() {
        c.push(Cause::required_because(field, known));
        return;
    }
    for (i, v) in list.iter().enumerate() {
        let at = format!("{field}[{i}]");
        if list[..i].contains(v) {
            c.push(Cause::invalid(&at, v, "duplicate version"));
        } else {
            dns1035_label(&at, v, c);
        }
    }
    if !list.iter().any(|v| ["v1", "v1beta1"].contains(v)) {
        c.push(Cause::invalid_json(field, versions, known));
    }
}

impl Strategy for Definition {
    fn prepare_for_create(&self, _r: &crate::apiserver::Req, obj: &mut Value) {
        if let Some(m) = obj.as_object_mut() {
            m.insert(
                "status".into(),
                json!({"conditions": [], "acceptedNames": {"plural": "", "kind": ""}, "storedVersions": []}),
            );
        }
    }

    fn default(&self, obj: &mut Value) {
        let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
            return;
        };
        if let Some(names) = spec.get_mut("names").and_then(Value::as_object_mut) {
            let kind = names
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            if !kind.is_empty() {
                names
                    .entry("singular")
                    .or_insert_with(|| json!(kind.to_lowercase()));
                names
                    .entry("listKind")
                    .or_insert_with(|| json!(format!("{kind}List")));
            }
        }
        let conv = spec.entry("conversion").or_insert_with(|| json!({}));
        if let Some(conv) = conv.as_object_mut() {
            conv.entry("strategy").or_insert_with(|| json!("None"));
            // Upstream's SetDefaults_ServiceReference.
            if let Some(svc) = conv
                .get_mut("webhook")
                .and_then(|w| w.get_mut("clientConfig"))
                .and_then(|cc| cc.get_mut("service"))
                .and_then(Value::as_object_mut)
            {
                svc.entry("port").or_insert_with(|| json!(443));
            }
        }
    }

    fn validate(&self, obj: &Value) -> Vec<Cause> {
        let mut c = Vec::new();
        let spec = &obj["spec"];
        let group = s(&spec["group"]);
        if group.is_empty() {
            c.push(Cause::required("spec.group"));
        } else {
            dns_subdomain("spec.group", group, &mut c);
            if crate::apiserver::resources::groups().contains(&group) {
                c.push(Cause::invalid(
                    "spec.group",
                    group,
                    "is served by the API server itself",
                ));
            }
            if !group.contains('.') {
                c.push(Cause::invalid(
                    "spec.group",
                    group,
                    "should be a domain with at least one dot",
                ));
            }
        }
        let plural = s(&spec["names"]["plural"]);
        let name = objects::name(obj).unwrap_or_default();
        if !plural.is_empty() && !group.is_empty() && name != format!("{plural}.{group}") {
            c.push(Cause::invalid(
                "metadata.name",
                name,
                "must be spec.names.plural+\".\"+spec.group",
            ));
        }
        match s(&spec["scope"]) {
            "" => c.push(Cause::required("spec.scope")),
            sc if !SCOPES.contains(&sc) => c.push(Cause::not_supported("spec.scope", sc, SCOPES)),
            _ => {}
        }
        names(&spec["names"], "spec.names", &mut c);
        versions(spec, &mut c);
        conversion(spec, &mut c);
        c
    }

    fn validate_update(&self, old: &Value, new: &Value) -> Vec<Cause> {
        let mut c = self.validate(new);
        for f in ["group", "scope"] {
            if old["spec"][f] != new["spec"][f] {
                c.push(Cause::invalid(
                    format!("spec.{f}"),
                    s(&new["spec"][f]),
                    "field is immutable",
                ));
            }
        }
        let versions: Vec<&str> = new["spec"]["versions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|v| s(&v["name"]))
            .collect();
        for (i, stored) in old["status"]["storedVersions"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            if !versions.contains(&s(stored)) {
                c.push(Cause::invalid(
                    format!("status.storedVersions[{i}]"),
                    s(stored),
                    "must appear in spec.versions",
                ));
            }
        }
        c
    }

    /// Upstream's REST Delete: the cleanup finalizer and a Terminating
    /// condition go on first; the finalizer comes off once every object
    /// of the kind is gone.
    fn mark_deleted(&self, _api: &ApiServer, obj: &mut Value, opts: &DeleteOptions) -> bool {
        let mut finalizers = objects::finalizers(obj);
        if !objects::has_deletion_timestamp(obj) {
            if !finalizers.iter().any(|f| f == CLEANUP_FINALIZER) {
                finalizers.push(CLEANUP_FINALIZER.into());
                meta_mut(obj).insert("finalizers".into(), json!(finalizers));
            }
            super::establish::set_condition(
                obj,
                "Terminating",
                "True",
                "InstanceDeletionPending",
                "CustomResourceDefinition marked for deletion; CustomResource deletion will begin soon",
            );
        }
        strategy::mark_with_finalizers(obj, opts)
    }

    fn columns(&self) -> Vec<Col> {
        vec![
            table::NAME,
            (
                "Created At",
                "date",
                0,
                "CreationTimestamp is a timestamp representing the server time when this object was created.",
            ),
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        vec![
            table::name_cell(obj),
            obj["metadata"]["creationTimestamp"].clone(),
        ]
    }
}
