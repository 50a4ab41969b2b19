//! The LimitRanger admission plugin (upstream's
//! `plugin/pkg/admission/limitranger`): a new pod's containers get their
//! namespace's LimitRange defaults, then pods and claims are held to the
//! ranges' min, max and limit/request ratio.
//!
//! Pod updates are neither defaulted nor checked, as upstream: containers'
//! resources cannot change after create (resizes aside), so a range added
//! later does not refuse a running pod's update.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::objects;
use super::resources::lookup;
use super::status::{qualified, ApiError, ApiResult};
use super::strategy::limitrange::milli;
use super::{ApiServer, Req};

pub const ANNOTATION: &str = "kubernetes.io/limit-ranger";

/// The namespace's LimitRanges, oldest key first.
async fn ranges(api: &ApiServer, ns: &str) -> ApiResult<Vec<Value>> {
    let def = lookup("", "v1", "limitranges")
        .ok_or_else(|| ApiError::internal("limitranges are not served"))?;
    let list = api.store.list(&def.prefix(Some(ns)), None, 0, None).await?;
    Ok(list
        .kvs
        .iter()
        .filter_map(|kv| objects::decode_stored(&kv.value, kv.mod_revision))
        .collect())
}

/// The items of type `ty` of every range.
fn items<'a>(ranges: &'a [Value], ty: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    ranges
        .iter()
        .flat_map(|r| r["spec"]["limits"].as_array().into_iter().flatten())
        .filter(move |i| i["type"].as_str() == Some(ty))
}

fn list_of(v: &Value) -> &Map<String, Value> {
    static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
    v.as_object().unwrap_or_else(|| EMPTY.get_or_init(Map::new))
}

/// Adds the missing entries of `defaults` to `resources[field]`; returns
/// the names it set, sorted.
fn merge(
    resources: &mut Map<String, Value>,
    field: &str,
    defaults: &Map<String, Value>,
) -> Vec<String> {
    if defaults.is_empty() {
        return Vec::new();
    }
    let list = resources.entry(field).or_insert_with(|| json!({}));
    if !list.is_object() {
        *list = json!({});
    }
    let Some(list) = list.as_object_mut() else {
        return Vec::new();
    };
    let mut set = Vec::new();
    for (k, v) in defaults {
        if !list.contains_key(k) {
            list.insert(k.clone(), v.clone());
            set.push(k.clone());
        }
    }
    set.sort();
    set
}

/// Mutating admission of a new pod: Container items' `default` become
/// missing limits and `defaultRequest` missing requests, recorded in the
/// `kubernetes.io/limit-ranger` annotation.
///
/// # Errors
/// The store fails.
pub(crate) async fn admit_create(api: &ApiServer, r: &Req, pod: &mut Value) -> ApiResult<()> {
    if !r.is_resource("", "pods") {
        return Ok(());
    }
    let ranges = ranges(api, r.ns.as_deref().unwrap_or_default()).await?;
    if ranges.is_empty() {
        return Ok(());
    }
    let (mut limits, mut requests) = (Map::new(), Map::new());
    // The first range to name a resource wins, as upstream applies the
    // ranges in turn and each only fills what is still missing.
    for item in items(&ranges, "Container") {
        for (k, v) in list_of(&item["default"]) {
            limits.entry(k.clone()).or_insert_with(|| v.clone());
        }
        for (k, v) in list_of(&item["defaultRequest"]) {
            requests.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    let notes = default_containers(pod, &limits, &requests);
    if !notes.is_empty() {
        if let Some(meta) = pod.get_mut("metadata").and_then(Value::as_object_mut) {
            let ann = meta.entry("annotations").or_insert_with(|| json!({}));
            if !ann.is_object() {
                *ann = json!({});
            }
            ann[ANNOTATION] = json!(format!("LimitRanger plugin set: {}", notes.join("; ")));
        }
    }
    // The QoS class was computed before admission; the defaults change it,
    // as upstream's (which computes it after admission).
    let qos = super::strategy::pod::qos_class(pod);
    if pod["status"].is_object() {
        pod["status"]["qosClass"] = json!(qos);
    }
    Ok(())
}

/// Applies the defaults to every container; returns the annotation's parts.
fn default_containers(
    pod: &mut Value,
    limits: &Map<String, Value>,
    requests: &Map<String, Value>,
) -> Vec<String> {
    let mut notes = Vec::new();
    for (field, what) in [
        ("containers", "container"),
        ("initContainers", "init container"),
    ] {
        let Some(cs) = pod["spec"].get_mut(field).and_then(Value::as_array_mut) else {
            continue;
        };
        for c in cs.iter_mut().filter_map(Value::as_object_mut) {
            let name = c
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let res = c.entry("resources").or_insert_with(|| json!({}));
            if !res.is_object() {
                *res = json!({});
            }
            let Some(res) = res.as_object_mut() else {
                continue;
            };
            // A limit the pod gives without a request asks for the limit
            // (upstream's pod defaulting, which runs before the plugin).
            let own_limits = res
                .get("limits")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            merge(res, "requests", &own_limits);
            let set_limits = merge(res, "limits", limits);
            let set_requests = merge(res, "requests", requests);
            if !set_requests.is_empty() {
                notes.push(format!(
                    "{} request for {what} {name}",
                    set_requests.join(", ")
                ));
            }
            if !set_limits.is_empty() {
                notes.push(format!("{} limit for {what} {name}", set_limits.join(", ")));
            }
        }
    }
    notes
}

/// Validating admission: a new pod against the Container and Pod items,
/// a new or resized claim against the PersistentVolumeClaim items.
///
/// # Errors
/// 403 with upstream's messages.
pub(crate) async fn validate(
    api: &ApiServer,
    r: &Req,
    old: Option<&Value>,
    new: Option<&Value>,
) -> ApiResult<()> {
    let Some(new) = new else {
        return Ok(());
    };
    let (plural, pods) = if r.is_resource("", "pods") && old.is_none() {
        ("pods", true)
    } else if r.is_resource("", "persistentvolumeclaims") {
        ("persistentvolumeclaims", false)
    } else {
        return Ok(());
    };
    let ranges = ranges(api, r.ns.as_deref().unwrap_or_default()).await?;
    if ranges.is_empty() {
        return Ok(());
    }
    let errs = if pods {
        pod_errors(&ranges, new)
    } else {
        claim_errors(&ranges, new)
    };
    if errs.is_empty() {
        return Ok(());
    }
    // utilerrors.NewAggregate's rendering.
    let why = if errs.len() == 1 {
        errs.join("")
    } else {
        format!("[{}]", errs.join(", "))
    };
    Err(ApiError::forbidden(format!(
        "{} {:?} is forbidden: {why}",
        qualified("", plural),
        objects::name(new).unwrap_or_default()
    )))
}

type Resources = BTreeMap<String, (String, i128)>;

fn resources(v: &Value) -> Resources {
    list_of(v)
        .iter()
        .filter_map(|(k, q)| Some((k.clone(), (q.as_str()?.to_string(), milli(q)?))))
        .collect()
}

fn check(ty: &str, item: &Value, req: &Resources, lim: &Resources, errs: &mut Vec<String>) {
    for (k, v) in list_of(&item["min"]) {
        let (Some(enforced), Some(shown)) = (milli(v), v.as_str()) else {
            continue;
        };
        match (req.get(k), lim.get(k)) {
            (None, _) => errs.push(format!(
                "minimum {k} usage per {ty} is {shown}.  No request is specified"
            )),
            (Some((q, n)), _) if *n < enforced => errs.push(format!(
                "minimum {k} usage per {ty} is {shown}, but request is {q}"
            )),
            (_, Some((q, n))) if *n < enforced => errs.push(format!(
                "minimum {k} usage per {ty} is {shown}, but limit is {q}"
            )),
            _ => {}
        }
    }
    for (k, v) in list_of(&item["max"]) {
        let (Some(enforced), Some(shown)) = (milli(v), v.as_str()) else {
            continue;
        };
        match (req.get(k), lim.get(k)) {
            (_, None) => errs.push(format!(
                "maximum {k} usage per {ty} is {shown}.  No limit is specified"
            )),
            (_, Some((q, n))) if *n > enforced => errs.push(format!(
                "maximum {k} usage per {ty} is {shown}, but limit is {q}"
            )),
            (Some((q, n)), _) if *n > enforced => errs.push(format!(
                "maximum {k} usage per {ty} is {shown}, but request is {q}"
            )),
            _ => {}
        }
    }
    for (k, v) in list_of(&item["maxLimitRequestRatio"]) {
        let (Some(enforced), Some(shown)) = (milli(v), v.as_str()) else {
            continue;
        };
        let (r, l) = (
            req.get(k).map(|x| x.1).unwrap_or(0),
            lim.get(k).map(|x| x.1).unwrap_or(0),
        );
        if r == 0 {
            errs.push(format!("{k} max limit to request ratio per {ty} is {shown}, but no request is specified or request is 0"));
        } else if l == 0 {
            errs.push(format!("{k} max limit to request ratio per {ty} is {shown}, but no limit is specified or limit is 0"));
        } else if l * 1000 > enforced * r {
            errs.push(format!(
                "{k} max limit to request ratio per {ty} is {shown}, but provided ratio is {:.6}",
                l as f64 / r as f64
            ));
        }
    }
}

/// Sums the named resource over every list; a resource missing from one
/// is missing from the sum (upstream's `sum`: a container without a limit
/// leaves the pod without one).
fn sum(lists: &[Resources]) -> Resources {
    let Some(first) = lists.first() else {
        return Resources::new();
    };
    first
        .keys()
        .filter(|k| lists.iter().all(|l| l.contains_key(*k)))
        .map(|k| {
            let total: i128 = lists.iter().filter_map(|l| l.get(k)).map(|x| x.1).sum();
            (k.clone(), (render_milli(total), total))
        })
        .collect()
}

/// A milli value as a quantity string, for messages about sums.
fn render_milli(n: i128) -> String {
    if n % 1000 == 0 {
        (n / 1000).to_string()
    } else {
        format!("{n}m")
    }
}

fn pod_errors(ranges: &[Value], pod: &Value) -> Vec<String> {
    let spec = &pod["spec"];
    let of = |field: &str, which: &str| -> Vec<Resources> {
        spec[field]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| resources(&c["resources"][which]))
            .collect()
    };
    let mut errs = Vec::new();
    for item in items(ranges, "Container") {
        for field in ["containers", "initContainers"] {
            for (req, lim) in of(field, "requests").iter().zip(of(field, "limits").iter()) {
                check("Container", item, req, lim, &mut errs);
            }
        }
    }
    let mut req = sum(&of("containers", "requests"));
    let mut lim = sum(&of("containers", "limits"));
    // Init containers run one at a time, before the others: the pod needs
    // the largest of them or the sum, whichever is more.
    for (total, init) in [
        (&mut req, of("initContainers", "requests")),
        (&mut lim, of("initContainers", "limits")),
    ] {
        for one in init {
            for (k, v) in one {
                if total.get(&k).is_none_or(|t| t.1 < v.1) {
                    total.insert(k, v);
                }
            }
        }
    }
    for item in items(ranges, "Pod") {
        check("Pod", item, &req, &lim, &mut errs);
    }
    errs
}

fn claim_errors(ranges: &[Value], claim: &Value) -> Vec<String> {
    let req = resources(&claim["spec"]["resources"]["requests"]);
    let mut errs = Vec::new();
    for item in items(ranges, "PersistentVolumeClaim") {
        for (k, v) in list_of(&item["min"]) {
            let (Some(enforced), Some(shown)) = (milli(v), v.as_str()) else {
                continue;
            };
            match req.get(k) {
                None => errs.push(format!("minimum {k} usage per PersistentVolumeClaim is {shown}.  No request is specified")),
                Some((q, n)) if *n < enforced => errs.push(format!(
                    "minimum {k} usage per PersistentVolumeClaim is {shown}, but request is {q}"
                )),
                _ => {}
            }
        }
        for (k, v) in list_of(&item["max"]) {
            let (Some(enforced), Some(shown)) = (milli(v), v.as_str()) else {
                continue;
            };
            match req.get(k) {
                None => errs.push(format!("maximum {k} usage per PersistentVolumeClaim is {shown}.  No request is specified")),
                Some((q, n)) if *n > enforced => errs.push(format!(
                    "maximum {k} usage per PersistentVolumeClaim is {shown}, but request is {q}"
                )),
                _ => {}
            }
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(item: Value) -> Vec<Value> {
        vec![json!({"spec": {"limits": [item]}})]
    }

    #[test]
    fn defaults_are_annotated() {
        let mut pod = json!({"spec": {"containers": [{"name": "c"}, {"name": "d", "resources": {"limits": {"cpu": "2"}}}]}});
        let limits = json!({"cpu": "500m", "memory": "256Mi"});
        let requests = json!({"cpu": "100m", "memory": "128Mi"});
        let notes = default_containers(&mut pod, list_of(&limits), list_of(&requests));
        assert_eq!(
            notes,
            [
                "cpu, memory request for container c",
                "cpu, memory limit for container c",
                "memory request for container d",
                "memory limit for container d",
            ]
        );
        assert_eq!(
            pod["spec"]["containers"][1]["resources"]["limits"]["cpu"],
            "2"
        );
    }

    #[test]
    fn container_bounds_and_ratio() {
        let ranges = range(
            json!({"type": "Container", "min": {"cpu": "100m"}, "max": {"memory": "1Gi"},
            "maxLimitRequestRatio": {"cpu": "2"}}),
        );
        let pod = json!({"spec": {"containers": [{"name": "c", "resources": {
            "requests": {"cpu": "50m", "memory": "1Gi"}, "limits": {"cpu": "200m", "memory": "2Gi"}}}]}});
        assert_eq!(
            pod_errors(&ranges, &pod),
            [
                "minimum cpu usage per Container is 100m, but request is 50m",
                "maximum memory usage per Container is 1Gi, but limit is 2Gi",
                "cpu max limit to request ratio per Container is 2, but provided ratio is 4.000000",
            ]
        );
    }

    #[test]
    fn pod_max_sums_containers() {
        let ranges = range(json!({"type": "Pod", "max": {"cpu": "1"}}));
        let c = |cpu: &str| json!({"name": cpu, "resources": {"requests": {"cpu": cpu}, "limits": {"cpu": cpu}}});
        let pod = json!({"spec": {"containers": [c("600m"), c("500m")]}});
        assert_eq!(
            pod_errors(&ranges, &pod),
            ["maximum cpu usage per Pod is 1, but limit is 1100m"]
        );
        let pod = json!({"spec": {"containers": [c("600m"), c("400m")]}});
        assert!(pod_errors(&ranges, &pod).is_empty());
        // One container without a limit: the pod has none.
        let pod = json!({"spec": {"containers": [c("600m"), {"name": "x"}]}});
        assert_eq!(
            pod_errors(&ranges, &pod),
            ["maximum cpu usage per Pod is 1.  No limit is specified"]
        );
    }

    #[test]
    fn claims_bounded() {
        let ranges = range(json!({"type": "PersistentVolumeClaim", "max": {"storage": "2Gi"}}));
        let pvc = json!({"spec": {"resources": {"requests": {"storage": "5Gi"}}}});
        assert_eq!(
            claim_errors(&ranges, &pvc),
            ["maximum storage usage per PersistentVolumeClaim is 2Gi, but request is 5Gi"]
        );
    }
}
