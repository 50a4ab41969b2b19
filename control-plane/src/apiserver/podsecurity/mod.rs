//! The PodSecurity admission plugin (upstream's
//! `k8s.io/pod-security-admission`): namespaces choose a level
//! (`privileged`, `baseline`, `restricted`) and a version for each of
//! three modes with `pod-security.kubernetes.io/{enforce,audit,warn}` and
//! `...-version` labels, over cluster defaults from
//! `--admission-control-config-file`.
//!
//! - Pods: `enforce` violations are refused (403), `warn` ones come back
//!   as `Warning` headers, `audit` ones become the request's audit
//!   annotation `pod-security.kubernetes.io/audit-violations`. An update
//!   is checked only when it changes what the checks could see beyond
//!   the fields an update may change anyway (images), as upstream.
//! - Workloads (Deployments, Jobs, ... and PodTemplates): their pod
//!   templates get warnings and audit annotations, never refusals: the
//!   pods they make are what enforce refuses.
//! - Namespaces: bad labels are refused (422); tightening `enforce` warns
//!   about existing pods that would not be allowed.
//!
//! # Layout
//! - [`level`]: levels, versions, and the labels that pick them.
//! - [`checks`]: every check with its versions and messages.
//! - [`config`]: the `PodSecurityConfiguration` file format.

pub mod checks;
pub mod config;
pub mod level;

use crate::apiserver::matching::labels_of;
use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::{json, Value};

use super::status::{qualified, ApiError, ApiResult, Cause};
use super::{audit, convert, objects, resources, ApiServer, Req};
pub use config::Config;
use level::{Level, LevelVersion, Policy};

/// Audit annotation keys (upstream's `pod-security.kubernetes.io/*`).
const ENFORCE_POLICY: &str = "pod-security.kubernetes.io/enforce-policy";
const AUDIT_VIOLATIONS: &str = "pod-security.kubernetes.io/audit-violations";
const EXEMPT: &str = "pod-security.kubernetes.io/exempt";
const ERROR: &str = "pod-security.kubernetes.io/error";

/// How many existing pods a namespace label change checks at most
/// (upstream's `namespaceMaxPodsToCheck`).
const MAX_PODS_TO_CHECK: usize = 3000;

/// Pod subresources the plugin never looks at (upstream's
/// `ignoredPodSubresources`): they cannot change what the checks read.
const IGNORED_POD_SUBRESOURCES: &[&str] = &[
    "exec",
    "attach",
    "binding",
    "eviction",
    "log",
    "portforward",
    "proxy",
    "status",
];

impl ApiServer {
    /// Use `config` (from `--admission-control-config-file`) for Pod
    /// Security admission; without it every level defaults to privileged.
    /// Set once, at start.
    pub fn set_pod_security(&self, config: Config) {
        let _ = self.pod_security.set(config);
    }

    fn pod_security_config(&self) -> &Config {
        self.pod_security.get_or_init(Config::default)
    }
}

/// Validating admission of a create (`old` None) or update of `new`;
/// returns the warnings for the client. Deletes are not looked at.
///
/// # Errors
/// 403 when a pod violates its namespace's enforce level; 422 for bad
/// Pod Security labels on a namespace.
pub(crate) async fn admit(
    api: &ApiServer,
    r: &Req,
    old: Option<&Value>,
    new: Option<&Value>,
) -> ApiResult<Vec<String>> {
    let Some(new) = new else {
        return Ok(Vec::new());
    };
    let cfg = api.pod_security_config();
    // Subresource handlers (scale, binding) may write through a Req for
    // the main resource; the request's own subresource is what counts.
    let sub = r.sub.as_deref().unwrap_or(&r.attrs.subresource);
    match (r.attrs.group.as_str(), r.attrs.resource.as_str()) {
        ("", "namespaces") if sub.is_empty() => namespace(api, cfg, r, old, new).await,
        ("", "pods") if !IGNORED_POD_SUBRESOURCES.contains(&sub) => {
            if old.is_some_and(|old| !significant_update(old, new)) {
                return Ok(Vec::new());
            }
            pod(api, cfg, r, new, &new["metadata"], &new["spec"], true).await
        }
        (group, resource) if sub.is_empty() => match template(group, resource, new) {
            Some(t) => pod(api, cfg, r, new, &t["metadata"], &t["spec"], false).await,
            None => Ok(Vec::new()),
        },
        _ => Ok(Vec::new()),
    }
}

/// The pod template of a workload object, if `group`/`resource` is a
/// kind that has one and it is set.
fn template<'a>(group: &str, resource: &str, obj: &'a Value) -> Option<&'a Value> {
    let t = match (group, resource) {
        ("", "podtemplates") => &obj["template"],
        ("", "replicationcontrollers")
        | ("apps", "deployments" | "replicasets" | "daemonsets" | "statefulsets")
        | ("batch", "jobs") => &obj["spec"]["template"],
        ("batch", "cronjobs") => &obj["spec"]["jobTemplate"]["spec"]["template"],
        _ => return None,
    };
    (!t.is_null()).then_some(t)
}

/// An update worth checking: containers added or removed, or an image
/// changed (the only container field an update of a pod's spec may
/// change), or an ephemeral container added or changed.
fn significant_update(old: &Value, new: &Value) -> bool {
    let list = |v: &Value, k: &str| v["spec"][k].as_array().cloned().unwrap_or_default();
    for k in ["containers", "initContainers"] {
        let (a, b) = (list(old, k), list(new, k));
        if a.len() != b.len() || a.iter().zip(&b).any(|(a, b)| a["image"] != b["image"]) {
            return true;
        }
    }
    let old_eph = list(old, "ephemeralContainers");
    list(new, "ephemeralContainers").iter().any(|c| {
        old_eph
            .iter()
            .find(|o| o["name"] == c["name"])
            .is_none_or(|o| o["image"] != c["image"])
    })
}

/// The namespace's labels, or none when it cannot be read.
async fn namespace_labels(api: &ApiServer, ns: &str) -> BTreeMap<String, String> {
    let key = format!("/registry/core/namespaces/{ns}");
    let Ok(Some(kv)) = api.store.get(&key).await else {
        return BTreeMap::new();
    };
    let v: Value = serde_json::from_slice(&kv.value).unwrap_or(Value::Null);
    labels_of(&v)
}

/// Check one pod (or, `enforce` false, a workload's pod template) against
/// its namespace's policy.
async fn pod(
    api: &ApiServer,
    cfg: &Config,
    r: &Req,
    obj: &Value,
    meta: &Value,
    spec: &Value,
    enforce: bool,
) -> ApiResult<Vec<String>> {
    let ns = objects::namespace(obj)
        .or(r.ns.as_deref())
        .unwrap_or_default()
        .to_string();
    if cfg.exempt_namespaces.contains(&ns) {
        audit::annotate(EXEMPT, "namespace".into());
        return Ok(Vec::new());
    }
    if !r.identity.user.is_empty() && cfg.exempt_usernames.contains(&r.identity.user) {
        audit::annotate(EXEMPT, "user".into());
        return Ok(Vec::new());
    }
    let (policy, errs) = Policy::from_labels(&namespace_labels(api, &ns).await, cfg.defaults);
    let quiet = if enforce {
        policy.fully_privileged()
    } else {
        policy.warn.level == Level::Privileged && policy.audit.level == Level::Privileged
    };
    if errs.is_empty() && quiet {
        return Ok(Vec::new());
    }
    let runtime_class = spec["runtimeClassName"].as_str().unwrap_or_default();
    if !runtime_class.is_empty()
        && cfg
            .exempt_runtime_classes
            .iter()
            .any(|c| c == runtime_class)
    {
        audit::annotate(EXEMPT, "runtimeClass".into());
        return Ok(Vec::new());
    }
    if !errs.is_empty() {
        let list: Vec<String> = errs
            .iter()
            .map(|e| {
                format!(
                    "metadata.labels[{}]: Invalid value: {:?}: {}",
                    e.label, e.value, e.detail
                )
            })
            .collect();
        audit::annotate(
            ERROR,
            format!("Failed to parse policy: {}", list.join(", ")),
        );
    }
    // Each level is evaluated once however many modes share it.
    let mut results: HashMap<LevelVersion, Vec<checks::Violation>> = HashMap::new();
    let mut eval = |lv: LevelVersion| {
        results
            .entry(lv)
            .or_insert_with(|| checks::evaluate(lv, meta, spec))
            .clone()
    };
    if enforce {
        audit::annotate(ENFORCE_POLICY, policy.enforce.to_string());
        let v = eval(policy.enforce);
        if !v.is_empty() {
            let name = objects::name(obj).unwrap_or(r.name());
            let audited = eval(policy.audit);
            if !audited.is_empty() {
                audit::annotate(AUDIT_VIOLATIONS, would_violate(policy.audit, &audited));
            }
            return Err(ApiError {
                details: Some(json!({"name": name, "group": r.def.group, "kind": r.def.plural})),
                ..ApiError::forbidden(format!(
                    "{} {name:?} is forbidden: violates PodSecurity {:?}: {}",
                    qualified(r.def.group, r.def.plural),
                    policy.enforce.to_string(),
                    checks::describe(&v)
                ))
            });
        }
    }
    let audited = eval(policy.audit);
    if !audited.is_empty() {
        audit::annotate(AUDIT_VIOLATIONS, would_violate(policy.audit, &audited));
    }
    let warned = eval(policy.warn);
    Ok(if warned.is_empty() {
        Vec::new()
    } else {
        vec![would_violate(policy.warn, &warned)]
    })
}

fn would_violate(lv: LevelVersion, v: &[checks::Violation]) -> String {
    format!(
        "would violate PodSecurity {:?}: {}",
        lv.to_string(),
        checks::describe(v)
    )
}

/// Namespace writes: refuse bad labels; on an update that tightens
/// `enforce`, warn about the existing pods it would not allow.
async fn namespace(
    api: &ApiServer,
    cfg: &Config,
    r: &Req,
    old: Option<&Value>,
    new: &Value,
) -> ApiResult<Vec<String>> {
    let name = objects::name(new).unwrap_or(r.name()).to_string();
    let new_labels = labels_of(new);
    let (policy, errs) = Policy::from_labels(&new_labels, cfg.defaults);
    let invalid = || {
        let causes = errs
            .iter()
            .map(|e| Cause::invalid(format!("metadata.labels[{}]", e.label), &e.value, e.detail))
            .collect();
        ApiError::invalid(r.def.kind, r.def.group, &name, causes)
    };
    let exempt = cfg.exempt_namespaces.contains(&name);
    let Some(old) = old else {
        if !errs.is_empty() {
            return Err(invalid());
        }
        return Ok(exempt_warning(cfg, exempt, &name, &policy, &new_labels)
            .into_iter()
            .collect());
    };
    let (old_policy, old_errs) = Policy::from_labels(&labels_of(old), cfg.defaults);
    if !errs.is_empty() && (old_errs.is_empty() || old_errs != errs) {
        return Err(invalid());
    }
    let (e, o) = (policy.enforce, old_policy.enforce);
    if e == o || e.level == Level::Privileged || (e.version == o.version && e.level <= o.level) {
        return Ok(Vec::new());
    }
    if exempt {
        return Ok(exempt_warning(cfg, exempt, &name, &policy, &new_labels)
            .into_iter()
            .collect());
    }
    Ok(existing_pods(api, cfg, &name, e).await)
}

/// Upstream's warning that an exempt namespace's labels do nothing.
fn exempt_warning(
    cfg: &Config,
    exempt: bool,
    name: &str,
    policy: &Policy,
    labels: &BTreeMap<String, String>,
) -> Option<String> {
    if !exempt || policy.fully_privileged() || policy.equivalent(&cfg.defaults) {
        return None;
    }
    let has = |mode: &str| {
        labels.contains_key(&format!("{}{mode}", level::LABEL_PREFIX))
            || labels.contains_key(&format!("{}{mode}-version", level::LABEL_PREFIX))
    };
    let parts: Vec<String> = [
        ("enforce", policy.enforce),
        ("audit", policy.audit),
        ("warn", policy.warn),
    ]
    .into_iter()
    .filter(|(mode, lv)| lv.level != Level::Privileged && has(mode))
    .map(|(mode, lv)| format!("{mode}={lv}"))
    .collect();
    Some(format!(
        "namespace {name:?} is exempt from Pod Security, and the policy ({}) will be ignored",
        parts.join(", ")
    ))
}

/// Warnings naming the existing pods of `ns` that `enforce` would refuse,
/// grouped by reason (upstream's `EvaluatePodsInNamespace`): one pod per
/// controller first, so that a big ReplicaSet does not crowd out the rest.
async fn existing_pods(
    api: &ApiServer,
    cfg: &Config,
    ns: &str,
    enforce: LevelVersion,
) -> Vec<String> {
    let Some(def) = resources::lookup("", "v1", "pods") else {
        return Vec::new();
    };
    let listed = match api.store.list(&def.prefix(Some(ns)), None, 0, None).await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(namespace = ns, error = %e, "listing pods for a PodSecurity label change");
            return vec!["failed to list pods while checking new PodSecurity enforce level".into()];
        }
    };
    let pods: Vec<Value> = listed
        .kvs
        .iter()
        .filter_map(|kv| convert::decode(def, &kv.value, kv.mod_revision))
        .filter(|p| {
            let rc = p["spec"]["runtimeClassName"].as_str().unwrap_or_default();
            rc.is_empty() || !cfg.exempt_runtime_classes.iter().any(|c| c == rc)
        })
        .collect();
    let mut first = Vec::new();
    let mut repeats = Vec::new();
    let mut controllers = HashSet::new();
    for p in &pods {
        let controller = p["metadata"]["ownerReferences"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|o| o["controller"] == true)
            .and_then(|o| o["uid"].as_str());
        match controller {
            Some(uid) if !controllers.insert(uid) => repeats.push(p),
            _ => first.push(p),
        }
    }
    first.extend(repeats);
    let total = first.len();
    first.truncate(MAX_PODS_TO_CHECK);
    let checked = first.len();
    // reason -> (alphabetically first pod name, how many pods)
    let mut by_reason: Vec<(String, String, usize)> = Vec::new();
    for p in first {
        let v = checks::evaluate(enforce, &p["metadata"], &p["spec"]);
        if v.is_empty() {
            continue;
        }
        let reason = checks::reasons(&v);
        let pod = objects::name(p).unwrap_or_default().to_string();
        match by_reason.iter_mut().find(|(r, _, _)| *r == reason) {
            Some((_, name, n)) => {
                *n += 1;
                if pod < *name {
                    *name = pod;
                }
            }
            None => by_reason.push((reason, pod, 1)),
        }
    }
    let mut warnings = Vec::new();
    if checked < total {
        warnings.push(format!(
            "new PodSecurity enforce level only checked against the first {checked} of {total} existing pods"
        ));
    }
    if !by_reason.is_empty() {
        warnings.push(format!(
            "existing pods in namespace {ns:?} violate the new PodSecurity enforce level {:?}",
            enforce.to_string()
        ));
    }
    let mut pods: Vec<String> = by_reason
        .into_iter()
        .map(|(reason, name, n)| match n {
            1 => format!("{name}: {reason}"),
            2 => format!("{name} (and 1 other pod): {reason}"),
            n => format!("{name} (and {} other pods): {reason}", n - 1),
        })
        .collect();
    pods.sort();
    warnings.extend(pods);
    warnings
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_of_workloads() {
        let t = json!({"metadata": {}, "spec": {"containers": []}});
        let spec = json!({"spec": {"template": t}});
        assert_eq!(template("apps", "deployments", &spec), Some(&t));
        assert_eq!(template("batch", "jobs", &spec), Some(&t));
        assert_eq!(
            template("", "replicationcontrollers", &json!({"spec": {}})),
            None
        );
        let cron = json!({"spec": {"jobTemplate": {"spec": {"template": t}}}});
        assert_eq!(template("batch", "cronjobs", &cron), Some(&t));
        assert_eq!(
            template("", "podtemplates", &json!({"template": t})),
            Some(&t)
        );
        assert_eq!(template("", "services", &spec), None);
    }

    #[test]
    fn only_image_and_container_changes_are_significant() {
        let pod = |image: &str, labels: Value| json!({"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": image}]}});
        assert!(!significant_update(
            &pod("a", json!({})),
            &pod("a", json!({"x": "y"}))
        ));
        assert!(significant_update(
            &pod("a", json!({})),
            &pod("b", json!({}))
        ));
        let mut with_eph = pod("a", json!({}));
        with_eph["spec"]["ephemeralContainers"] = json!([{"name": "debug", "image": "busybox"}]);
        assert!(significant_update(&pod("a", json!({})), &with_eph));
        assert!(!significant_update(&with_eph, &with_eph));
    }

    #[test]
    fn exempt_namespace_warning_names_the_labelled_modes() {
        let cfg = Config {
            exempt_namespaces: vec!["kube-system".into()],
            ..Config::default()
        };
        let labels: BTreeMap<String, String> = [(
            "pod-security.kubernetes.io/enforce".to_string(),
            "baseline".to_string(),
        )]
        .into();
        let (p, _) = Policy::from_labels(&labels, cfg.defaults);
        assert_eq!(
            exempt_warning(&cfg, true, "kube-system", &p, &labels).as_deref(),
            Some(
                r#"namespace "kube-system" is exempt from Pod Security, and the policy (enforce=baseline:latest) will be ignored"#
            )
        );
        assert_eq!(exempt_warning(&cfg, false, "x", &p, &labels), None);
    }
}
