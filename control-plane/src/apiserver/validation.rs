//! Validation: ObjectMeta's rules for every kind (the kind's name rule,
//! labels) before the kind's own ([`super::strategy::Strategy::validate`]),
//! and the validators several kinds share (pod specs, DNS names, data
//! keys).

use serde_json::Value;

use super::resources::ResourceDef;
use super::status::Cause;
use super::strategy::NameRule;

/// Causes of a 422, empty when the object is valid: ObjectMeta's rules
/// (the name by the kind's rule, labels), then the kind's own.
pub fn validate(def: &ResourceDef, obj: &Value) -> Vec<Cause> {
    let mut c = object_meta(def, obj);
    c.extend(def.strategy.validate(obj));
    c
}

/// [`validate`] for an update of the main resource, which may also break
/// rules about what cannot change.
pub fn validate_update(def: &ResourceDef, old: &Value, new: &Value) -> Vec<Cause> {
    let mut c = object_meta(def, new);
    // Finalizers cannot be added to an object being deleted.
    if old["metadata"]["deletionTimestamp"].is_string() {
        let before = super::objects::finalizers(old);
        let mut added: Vec<String> = super::objects::finalizers(new)
            .into_iter()
            .filter(|f| !before.contains(f))
            .collect();
        added.sort();
        if !added.is_empty() {
            c.push(Cause::forbidden(
                "metadata.finalizers",
                &format!("no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"),
            ));
        }
    }
    c.extend(def.strategy.validate_update(old, new));
    c
}

/// [`validate`] for a write through a subresource.
pub fn validate_subresource_update(def: &ResourceDef, old: &Value, new: &Value) -> Vec<Cause> {
    let mut c = object_meta(def, new);
    c.extend(def.strategy.validate_status_update(old, new));
    c
}

/// The total size annotations may have (upstream's
/// `TotalAnnotationSizeLimitB`).
const MAX_ANNOTATIONS: usize = 256 * 1024;

/// ObjectMeta on any write (upstream's `ValidateObjectMetaAccessor`): name
/// (by the kind's rule) and generateName, namespace, generation, labels,
/// annotations, owner references, finalizers, managed fields.
fn object_meta(def: &ResourceDef, obj: &Value) -> Vec<Cause> {
    let mut c = Vec::new();
    let meta = &obj["metadata"];
    let name = meta["name"].as_str().unwrap_or_default();
    name_by_rule(def.strategy.name_rule(), "metadata.name", name, &mut c);
    if let Some(g) = meta["generateName"].as_str().filter(|g| !g.is_empty()) {
        // A prefix, which may end in the '-' before the random suffix.
        let prefix = g.trim_end_matches('-');
        name_by_rule(
            def.strategy.name_rule(),
            "metadata.generateName",
            prefix,
            &mut c,
        );
    }
    if def.namespaced {
        let ns = meta["namespace"].as_str().unwrap_or_default();
        dns_label("metadata.namespace", ns, &mut c);
    }
    if meta["generation"].as_i64().is_some_and(|g| g < 0) {
        c.push(Cause::invalid(
            "metadata.generation",
            &meta["generation"].to_string(),
            "must be greater than or equal to 0",
        ));
    }
    labels(obj, &mut c);
    annotations(meta, &mut c);
    owner_references(meta, &mut c);
    finalizers(meta, &mut c);
    managed_fields(meta, &mut c);
    c
}

fn name_by_rule(rule: NameRule, field: &str, name: &str, c: &mut Vec<Cause>) {
    match rule {
        NameRule::PathSegment => path_segment_name(field, name, c),
        NameRule::Label => dns_label(field, name, c),
        NameRule::Label1035 => dns1035_label(field, name, c),
        NameRule::Subdomain => dns_subdomain(field, name, c),
    }
}

/// Keys are qualified names (case-insensitive); all of them, keys and
/// values, at most 256 KiB.
pub(crate) fn annotations(meta: &Value, c: &mut Vec<Cause>) {
    let Some(m) = meta["annotations"].as_object() else {
        return;
    };
    let mut size = 0;
    for (k, v) in m {
        if !is_qualified_name(&k.to_lowercase()) {
            c.push(Cause::invalid(
                "metadata.annotations",
                k,
                QUALIFIED_NAME_MESSAGE,
            ));
        }
        size += k.len() + v.as_str().map_or(0, str::len);
    }
    if size > MAX_ANNOTATIONS {
        c.push(Cause::too_long("metadata.annotations", MAX_ANNOTATIONS));
    }
}

/// apiVersion, kind, name and uid set; Events own nothing; one controller.
fn owner_references(meta: &Value, c: &mut Vec<Cause>) {
    let field = "metadata.ownerReferences";
    let mut controller: Option<String> = None;
    for r in meta["ownerReferences"].as_array().into_iter().flatten() {
        let s = |k: &str| r[k].as_str().unwrap_or_default();
        let version = s("apiVersion").rsplit('/').next().unwrap_or_default();
        if version.is_empty() {
            c.push(Cause::invalid(
                format!("{field}.apiVersion"),
                s("apiVersion"),
                "version must not be empty",
            ));
        }
        for k in ["kind", "name", "uid"] {
            if s(k).is_empty() {
                c.push(Cause::invalid(
                    format!("{field}.{k}"),
                    "",
                    "must not be empty",
                ));
            }
        }
        if s("apiVersion") == "v1" && s("kind") == "Event" {
            c.push(Cause::invalid(
                field,
                &r.to_string(),
                "/v1, Kind=Event is disallowed from being an owner",
            ));
        }
        if r["controller"].as_bool() == Some(true) {
            let this = format!("{}/{}", s("kind"), s("name"));
            match &controller {
                Some(first) => c.push(Cause::invalid(
                    field,
                    &meta["ownerReferences"].to_string(),
                    &format!("Only one reference can have Controller set to true. Found \"true\" in references for {first} and {this}"),
                )),
                None => controller = Some(this),
            }
        }
    }
}

/// Qualified names; not both `orphan` and `foregroundDeletion`.
fn finalizers(meta: &Value, c: &mut Vec<Cause>) {
    let field = "metadata.finalizers";
    let list: Vec<&str> = meta["finalizers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    for f in &list {
        if !is_qualified_name(f) {
            c.push(Cause::invalid(field, f, QUALIFIED_NAME_MESSAGE));
        }
    }
    if list.contains(&"orphan") && list.contains(&"foregroundDeletion") {
        c.push(Cause::invalid(
            field,
            &meta["finalizers"].to_string(),
            "finalizer orphan and foregroundDeletion cannot be both set",
        ));
    }
}

/// Operations `Apply` or `Update`, `FieldsV1`, managers of at most 128
/// printable characters.
fn managed_fields(meta: &Value, c: &mut Vec<Cause>) {
    for (i, f) in meta["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let path = format!("metadata.managedFields[{i}]");
        let op = f["operation"].as_str().unwrap_or_default();
        if op != "Apply" && op != "Update" {
            c.push(Cause::invalid(
                format!("{path}.operation"),
                op,
                "must be `Apply` or `Update`",
            ));
        }
        let ty = f["fieldsType"].as_str().unwrap_or_default();
        if !ty.is_empty() && ty != "FieldsV1" {
            c.push(Cause::invalid(
                format!("{path}.fieldsType"),
                ty,
                "must be `FieldsV1`",
            ));
        }
        field_manager(
            &format!("{path}.manager"),
            f["manager"].as_str().unwrap_or_default(),
            c,
        );
    }
}

/// A field manager: at most 128 characters, all printable.
pub(crate) fn field_manager(field: &str, m: &str, c: &mut Vec<Cause>) {
    if m.chars().count() > 128 {
        c.push(Cause::too_long(field, 128));
    }
    if let Some((i, ch)) = m.char_indices().find(|(_, ch)| ch.is_control()) {
        c.push(Cause::invalid(
            field,
            m,
            &format!("invalid character {:?} (at position {i})", ch),
        ));
    }
}

pub(crate) const QUALIFIED_NAME_MESSAGE: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')";

fn path_segment_name(field: &str, name: &str, c: &mut Vec<Cause>) {
    if name.is_empty() {
        c.push(Cause::required(field));
    } else if name == "." || name == ".." || name.contains('/') || name.contains('%') {
        c.push(Cause::invalid(
            field,
            name,
            "may not contain '/' or '%' or be '.' or '..'",
        ));
    }
}

pub(crate) fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

pub fn dns_label(field: &str, s: &str, c: &mut Vec<Cause>) {
    if s.is_empty() {
        c.push(Cause::required(field));
    } else if !is_dns_label(s) {
        c.push(Cause::invalid(field, s, DNS_LABEL_MESSAGE));
    }
}

/// upstream's `resource.ParseQuantity` refusal.
pub(crate) const QUANTITY_MESSAGE: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";

/// upstream's `IsDNS1123Label` message.
pub(crate) const DNS_LABEL_MESSAGE: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

/// upstream's `IsDNS1035Label`: a DNS label that starts with a letter.
pub(crate) fn is_dns1035_label(s: &str) -> bool {
    is_dns_label(s) && s.starts_with(|ch: char| ch.is_ascii_lowercase())
}

pub(crate) fn dns1035_label(field: &str, s: &str, c: &mut Vec<Cause>) {
    if s.is_empty() {
        c.push(Cause::required(field));
    } else if !is_dns1035_label(s) {
        c.push(Cause::invalid(field, s, "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"));
    }
}

pub(crate) fn dns_subdomain(field: &str, s: &str, c: &mut Vec<Cause>) {
    if s.is_empty() {
        c.push(Cause::required(field));
    } else if s.len() > 253 || !s.split('.').all(is_dns_label) {
        c.push(Cause::invalid(field, s, "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"));
    }
}

pub(crate) fn is_label_value(v: &str) -> bool {
    v.is_empty()
        || (v.len() <= 63
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && v.starts_with(|ch: char| ch.is_ascii_alphanumeric())
            && v.ends_with(|ch: char| ch.is_ascii_alphanumeric()))
}

pub(crate) fn is_qualified_name(k: &str) -> bool {
    let name = match k.split_once('/') {
        Some((prefix, name)) => {
            if prefix.is_empty() || prefix.len() > 253 || !prefix.split('.').all(is_dns_label) {
                return false;
            }
            name
        }
        None => k,
    };
    !name.is_empty() && is_label_value(name)
}

/// upstream's `IsValidLabelValue` message.
const LABEL_VALUE_MESSAGE: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

fn labels(obj: &Value, c: &mut Vec<Cause>) {
    label_map(&obj["metadata"]["labels"], "metadata.labels", c);
}

/// A map of labels (upstream's `ValidateLabels`): qualified-name keys,
/// label values; causes name the map, not the key, as upstream's do.
/// Also node selectors (RuntimeClass `scheduling.nodeSelector`).
pub(crate) fn label_map(m: &Value, field: &str, c: &mut Vec<Cause>) {
    for (k, v) in m.as_object().into_iter().flatten() {
        if !is_qualified_name(k) {
            c.push(Cause::invalid(field, k, QUALIFIED_NAME_MESSAGE));
        }
        match v.as_str() {
            Some(s) if is_label_value(s) => {}
            Some(s) => c.push(Cause::invalid(field, s, LABEL_VALUE_MESSAGE)),
            None => c.push(Cause::invalid(field, &v.to_string(), LABEL_VALUE_MESSAGE)),
        }
    }
}

const TOLERATION_OPERATORS: [&str; 2] = ["Equal", "Exists"];
const TAINT_EFFECTS: [&str; 3] = ["NoSchedule", "PreferNoSchedule", "NoExecute"];

/// Tolerations (upstream's `ValidateTolerations`), at `path` (a list).
/// A toleration the scheduler cannot read would tolerate nothing, or,
/// with an empty key, everything.
pub(crate) fn tolerations(list: &Value, path: &str, c: &mut Vec<Cause>) {
    for (i, t) in list.as_array().into_iter().flatten().enumerate() {
        let at = |f: &str| format!("{path}[{i}].{f}");
        let str_of = |f: &str| t[f].as_str().unwrap_or_default();
        let (key, op, value, effect) = (
            str_of("key"),
            str_of("operator"),
            str_of("value"),
            str_of("effect"),
        );
        if !key.is_empty() && !is_qualified_name(key) {
            c.push(Cause::invalid(at("key"), key, QUALIFIED_NAME_MESSAGE));
        }
        if key.is_empty() && op != "Exists" {
            c.push(Cause::invalid(at("operator"), op, "operator must be Exists when `key` is empty, which means \"match all values and all keys\""));
        }
        if !t["tolerationSeconds"].is_null() && effect != "NoExecute" {
            c.push(Cause::invalid(
                at("effect"),
                effect,
                "effect must be 'NoExecute' when `tolerationSeconds` is set",
            ));
        }
        match op {
            // No operator means Equal. Upstream names the operator in
            // both causes, though the value is at fault.
            "" | "Equal" if !is_label_value(value) => {
                c.push(Cause::invalid(at("operator"), value, LABEL_VALUE_MESSAGE));
            }
            "Exists" if !value.is_empty() => c.push(Cause::invalid(
                at("operator"),
                value,
                "value must be empty when `operator` is 'Exists'",
            )),
            "" | "Equal" | "Exists" => {}
            other => c.push(Cause::not_supported(
                at("operator"),
                other,
                &TOLERATION_OPERATORS,
            )),
        }
        // No effect means every effect.
        if !effect.is_empty() && !TAINT_EFFECTS.contains(&effect) {
            c.push(Cause::not_supported(at("effect"), effect, &TAINT_EFFECTS));
        }
    }
}

/// A pod spec (of a pod, or of a workload's template at `path`).
pub(crate) fn pod_spec(path: &str, spec: Option<&Value>, c: &mut Vec<Cause>) {
    let Some(spec) = spec else {
        c.push(Cause::required(path));
        return;
    };
    let containers = spec.get("containers").and_then(Value::as_array);
    match containers {
        None => c.push(Cause::required(format!("{path}.containers"))),
        Some(cs) if cs.is_empty() => c.push(Cause::required(format!("{path}.containers"))),
        Some(_) => {}
    }
    let mut names: Vec<&str> = Vec::new();
    for field in ["initContainers", "containers"] {
        for (i, ctr) in spec
            .get(field)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let p = format!("{path}.{field}[{i}]");
            let name = ctr.get("name").and_then(Value::as_str).unwrap_or_default();
            dns_label(&format!("{p}.name"), name, c);
            if !name.is_empty() && names.contains(&name) {
                c.push(Cause::duplicate(format!("{p}.name"), name));
            }
            names.push(name);
            if ctr
                .get("image")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .trim()
                .is_empty()
            {
                c.push(Cause::required(format!("{p}.image")));
            }
            for (j, port) in ctr
                .get("ports")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
            {
                let n = port
                    .get("containerPort")
                    .and_then(Value::as_i64)
                    .unwrap_or(0);
                if !(1..=65535).contains(&n) {
                    c.push(Cause::invalid(
                        format!("{p}.ports[{j}].containerPort"),
                        &n.to_string(),
                        "must be between 1 and 65535, inclusive",
                    ));
                }
                if let Some(name) = port.get("name").and_then(Value::as_str) {
                    if !name.is_empty() {
                        port_name(&format!("{p}.ports[{j}].name"), name, c);
                    }
                }
                if let Some(h) = port.get("hostPort").and_then(Value::as_i64) {
                    if h != 0 && !(1..=65535).contains(&h) {
                        c.push(Cause::invalid(
                            format!("{p}.ports[{j}].hostPort"),
                            &h.to_string(),
                            "must be between 1 and 65535, inclusive",
                        ));
                    }
                }
            }
        }
    }
    if let Some(rp) = spec.get("restartPolicy").and_then(Value::as_str) {
        if !matches!(rp, "Always" | "OnFailure" | "Never") {
            c.push(Cause::not_supported(
                format!("{path}.restartPolicy"),
                rp,
                &["Always", "OnFailure", "Never"],
            ));
        }
    }
    if let Some(dp) = spec.get("dnsPolicy").and_then(Value::as_str) {
        if !matches!(
            dp,
            "ClusterFirstWithHostNet" | "ClusterFirst" | "Default" | "None"
        ) {
            c.push(Cause::not_supported(
                format!("{path}.dnsPolicy"),
                dp,
                &["ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"],
            ));
        }
    }
}

/// A named port (`containerPort` names, named `targetPort`s): an
/// IANA_SVC_NAME (upstream's `IsValidPortName`).
pub(crate) fn port_name(field: &str, name: &str, c: &mut Vec<Cause>) {
    let why = if name.len() > 15 {
        Some("must be no more than 15 characters")
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        Some("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)")
    } else if name.contains("--") {
        Some("must not contain consecutive hyphens")
    } else if !name.bytes().any(|b| b.is_ascii_lowercase()) {
        Some("must contain at least one letter (a-z)")
    } else if name.starts_with('-') || name.ends_with('-') {
        Some("must not begin or end with a hyphen")
    } else {
        None
    };
    if let Some(why) = why {
        c.push(Cause::invalid(field, name, why));
    }
}

/// An IP address of the given family (`IPv4`, `IPv6`, or either when
/// empty): what the service proxy writes into its rules must be one.
pub(crate) fn ip_address(field: &str, ip: &str, family: &str, c: &mut Vec<Cause>) {
    let ok = match ip.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => family != "IPv6",
        Ok(std::net::IpAddr::V6(_)) => family != "IPv4",
        Err(_) => false,
    };
    if !ok {
        let what = match family {
            "IPv4" => "must be a valid IPv4 address",
            "IPv6" => "must be a valid IPv6 address",
            _ => "must be a valid IP address",
        };
        c.push(Cause::invalid(field, ip, what));
    }
}

/// The most a ConfigMap's or Secret's data may hold (upstream's
/// `MaxSecretSize`, 1 MiB).
pub(crate) const MAX_DATA: usize = 1024 * 1024;

/// The total size of a ConfigMap's or Secret's data must stay within
/// [`MAX_DATA`]: `plain` fields hold text, `base64` ones bytes in base64
/// (4 characters carry 3 bytes). `field` names the object part a 422 blames.
pub(crate) fn data_size(
    obj: &Value,
    plain: &[&str],
    base64: &[&str],
    field: &str,
    c: &mut Vec<Cause>,
) {
    let len = |f: &&str| -> usize {
        obj[*f]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(_, v)| v.as_str().map_or(0, str::len))
            .sum()
    };
    let size = plain.iter().map(len).sum::<usize>() + base64.iter().map(len).sum::<usize>() / 4 * 3;
    if size > MAX_DATA {
        c.push(Cause::too_long(field, MAX_DATA));
    }
}

/// ConfigMap and Secret keys.
pub(crate) fn data_keys(obj: &Value, c: &mut Vec<Cause>) {
    for field in ["data", "binaryData"] {
        for k in obj[field].as_object().into_iter().flat_map(|m| m.keys()) {
            let ok = !k.is_empty()
                && k.len() <= 253
                && k.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
            if !ok {
                c.push(Cause::invalid(
                    format!("{field}[{k}]"),
                    k,
                    "a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
                ));
            }
        }
    }
}

/// A label selector's expressions (upstream's
/// `ValidateLabelSelectorRequirement`): an expression the controllers
/// cannot read would match nothing, silently.
pub fn label_selector(sel: &Value, path: &str, c: &mut Vec<Cause>) {
    let exprs = sel["matchExpressions"].as_array().into_iter().flatten();
    for (i, e) in exprs.enumerate() {
        let path = format!("{path}.matchExpressions[{i}]");
        let has_values = e["values"].as_array().is_some_and(|v| !v.is_empty());
        match e["operator"].as_str().unwrap_or_default() {
            "In" | "NotIn" if !has_values => c.push(Cause::required_because(
                format!("{path}.values"),
                "must be specified when `operator` is 'In' or 'NotIn'",
            )),
            "Exists" | "DoesNotExist" if has_values => c.push(Cause::forbidden(
                format!("{path}.values"),
                "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
            )),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            op => c.push(Cause::invalid(
                format!("{path}.operator"),
                op,
                "not a valid selector operator",
            )),
        }
        if e["key"].as_str().is_none_or(str::is_empty) {
            c.push(Cause::required(format!("{path}.key")));
        }
    }
}

/// upstream's `IsValidPercent` message.
const PERCENT_MSG: &str = "a valid percent string must be a numeric string followed by an ending '%' (e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')";

/// upstream's `ValidateNonnegativeIntOrPercent` and
/// `IsNotMoreThan100Percent`.
pub(crate) fn int_or_percent(v: &Value, field: &str, c: &mut Vec<Cause>) {
    match v {
        Value::Number(n) => {
            if n.as_i64().is_none_or(|n| n < 0) {
                c.push(Cause::invalid(
                    field,
                    &n.to_string(),
                    "must be greater than or equal to 0",
                ));
            }
        }
        Value::String(p) => {
            let pct = p
                .strip_suffix('%')
                .filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))
                .map(|d| d.parse::<u64>().unwrap_or(u64::MAX));
            match pct {
                None => c.push(Cause::invalid(field, p, PERCENT_MSG)),
                Some(n) if n > 100 => {
                    c.push(Cause::invalid(field, p, "must not be greater than 100%"))
                }
                Some(_) => {}
            }
        }
        other => c.push(Cause::invalid(
            field,
            &other.to_string(),
            "must be an integer or a percentage",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::resources::lookup;
    use serde_json::json;

    #[test]
    fn pod_without_image_is_invalid() {
        let pod = json!({"metadata": {"name": "p", "namespace": "d"}, "spec": {"containers": [{"name": "c"}]}});
        let c = validate(lookup("", "v1", "pods").unwrap(), &pod);
        assert_eq!(c, vec![Cause::required("spec.containers[0].image")]);
        let pod = json!({"metadata": {"name": "Bad_Name", "namespace": "d"}, "spec": {"containers": [{"name": "c", "image": "i"}]}});
        assert_eq!(
            validate(lookup("", "v1", "pods").unwrap(), &pod)[0].field,
            "metadata.name"
        );
    }
}
