//! The ServiceAccount admission plugin (upstream's
//! `plugin/pkg/admission/serviceaccount`), run on pod creation: the pod
//! runs as an account that exists (`default` when it names none), gets
//! that account's image pull secrets when it has none of its own, and
//! unless automounting is turned off gets the projected
//! `kube-api-access-*` volume (a bound token, the cluster CA and its
//! namespace) mounted in every container. Mirror pods (the kubelet's
//! static pods) are never changed: they may not use accounts or secrets.

use serde_json::{json, Map, Value};

use super::objects;
use super::status::{ApiError, ApiResult, Cause};
use super::ApiServer;

/// Where the token, CA and namespace appear in containers.
pub const MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The projected volume's name prefix.
pub const VOLUME_PREFIX: &str = "kube-api-access-";
/// Upstream's bound token lifetime for the automounted volume: an hour,
/// plus seven seconds so the agent can tell it from a requested one.
pub const TOKEN_EXPIRATION_SECONDS: i64 = 3607;
const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Admit a pod being created (already defaulted), changing it as the
/// plugin does.
///
/// # Errors
/// 403 for a mirror pod using accounts or secrets, or a pod naming an
/// account that does not exist; a storage failure looking it up.
pub(crate) async fn admit(api: &ApiServer, pod: &mut Value) -> ApiResult<()> {
    let ns = objects::namespace(pod).unwrap_or_default().to_string();
    let name = pod["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let forbidden = |msg: String| ApiError::forbidden(format!("pods {name:?} is forbidden: {msg}"));
    if pod["metadata"]["annotations"][MIRROR_ANNOTATION].is_string() {
        return check_mirror(pod).map_err(forbidden);
    }
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return Ok(());
    };
    let sa_name = default_account(spec);
    let Some(sa) = lookup(api, &ns, &sa_name).await? else {
        return Err(forbidden(format!(
            "error looking up service account {ns}/{sa_name}: serviceaccount {sa_name:?} not found"
        )));
    };
    if automount(spec, &sa) {
        mount_token(spec, &objects::random_suffix(5));
    }
    add_pull_secrets(spec, &sa);
    Ok(())
}

/// A pod's account is fixed at creation (its token volume and its
/// authorization were decided for it); upstream refuses changing it with
/// every other immutable pod field.
///
/// # Errors
/// 422 when `new` names another account than `old`.
pub(crate) fn validate_update(old: &Value, new: &Value) -> ApiResult<()> {
    let account = |p: &Value| {
        p["spec"]["serviceAccountName"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    if account(old) == account(new) {
        return Ok(());
    }
    let name = new["metadata"]["name"].as_str().unwrap_or_default();
    Err(ApiError::invalid(
        "Pod",
        "",
        name,
        vec![Cause::forbidden(
            "spec.serviceAccountName",
            "pod updates may not change the service account",
        )],
    ))
}

/// The account, if it exists. `default` is looked for a few times, as
/// upstream does: the ServiceAccounts controller creates it just after
/// its namespace, and a pod created right then should not fail.
async fn lookup(api: &ApiServer, ns: &str, name: &str) -> ApiResult<Option<Value>> {
    let key = format!("/registry/core/serviceaccounts/{ns}/{name}");
    let attempts = if name == "default" { 10 } else { 1 };
    for attempt in 0..attempts {
        if attempt > 0 {
            let jitter = rand::random_range(0..100);
            tokio::time::sleep(std::time::Duration::from_millis(100 + jitter)).await;
        }
        if let Some(kv) = api.store.get(&key).await.map_err(ApiError::from)? {
            return Ok(Some(
                serde_json::from_slice(&kv.value).unwrap_or(Value::Null),
            ));
        }
    }
    Ok(None)
}

/// Default `serviceAccountName` (from the deprecated `serviceAccount`, or
/// `default`) and keep the two equal; returns the account's name.
fn default_account(spec: &mut Map<String, Value>) -> String {
    let given = |k: &str, s: &Map<String, Value>| {
        s.get(k)
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .map(str::to_string)
    };
    let sa = given("serviceAccountName", spec)
        .or_else(|| given("serviceAccount", spec))
        .unwrap_or_else(|| "default".to_string());
    spec.insert("serviceAccountName".into(), json!(sa));
    spec.insert("serviceAccount".into(), json!(sa));
    sa
}

/// The pod's own setting wins over the account's; both default to true.
fn automount(spec: &Map<String, Value>, sa: &Value) -> bool {
    spec.get("automountServiceAccountToken")
        .and_then(Value::as_bool)
        .or_else(|| sa["automountServiceAccountToken"].as_bool())
        .unwrap_or(true)
}

fn token_volume(name: &str) -> Value {
    json!({
        "name": name,
        "projected": {
            "defaultMode": 420,
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": TOKEN_EXPIRATION_SECONDS, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
            ]
        }
    })
}

/// Mount the token volume in every container that does not mount
/// something at [`MOUNT_PATH`] already; add the volume (named with
/// `suffix` unless the pod has one already) if any container got it.
fn mount_token(spec: &mut Map<String, Value>, suffix: &str) {
    let existing = spec
        .get("volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v["name"].as_str())
        .find(|n| n.starts_with(VOLUME_PREFIX))
        .map(str::to_string);
    let volume = existing
        .clone()
        .unwrap_or_else(|| format!("{VOLUME_PREFIX}{suffix}"));
    let mount = json!({"name": volume, "readOnly": true, "mountPath": MOUNT_PATH});
    let mut needed = false;
    for field in ["initContainers", "containers", "ephemeralContainers"] {
        let Some(cs) = spec.get_mut(field).and_then(Value::as_array_mut) else {
            continue;
        };
        for c in cs.iter_mut().filter_map(Value::as_object_mut) {
            let mounts = c.entry("volumeMounts").or_insert_with(|| json!([]));
            let Some(mounts) = mounts.as_array_mut() else {
                continue;
            };
            if mounts.iter().any(|m| m["mountPath"] == MOUNT_PATH) {
                continue;
            }
            mounts.push(mount.clone());
            needed = true;
        }
    }
    if needed && existing.is_none() {
        let vols = spec.entry("volumes").or_insert_with(|| json!([]));
        if let Some(vols) = vols.as_array_mut() {
            vols.push(token_volume(&volume));
        }
    }
}

/// A pod with no pull secrets of its own uses its account's.
fn add_pull_secrets(spec: &mut Map<String, Value>, sa: &Value) {
    let own = spec
        .get("imagePullSecrets")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    let Some(theirs) = sa["imagePullSecrets"].as_array().filter(|a| !a.is_empty()) else {
        return;
    };
    if !own {
        let refs: Vec<Value> = theirs.iter().map(|r| json!({"name": r["name"]})).collect();
        spec.insert("imagePullSecrets".into(), Value::Array(refs));
    }
}

/// Upstream's rules for mirror pods, with its messages.
fn check_mirror(pod: &Value) -> Result<(), String> {
    let spec = &pod["spec"];
    // Pod defaulting ([`super::defaults::pod_spec`]) names `default` for
    // every pod, mirror pods included, before admission sees it: that name
    // is taken as "none".
    let names = |k: &str| {
        spec[k]
            .as_str()
            .is_some_and(|s| !s.is_empty() && s != "default")
    };
    if names("serviceAccountName") || names("serviceAccount") {
        return Err("a mirror pod may not reference service accounts".into());
    }
    if references_secrets(spec) {
        return Err("a mirror pod may not reference secrets".into());
    }
    let projects_token = spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["projected"]["sources"].as_array())
        .flatten()
        .any(|s| s.get("serviceAccountToken").is_some_and(|t| !t.is_null()));
    if projects_token {
        return Err("a mirror pod may not use ServiceAccountToken volume projections".into());
    }
    Ok(())
}

/// Whether the pod spec names any Secret: pull secrets, secret volumes
/// (plain, projected or as a volume plugin's credentials), or
/// environment from secrets in any container.
fn references_secrets(spec: &Value) -> bool {
    let non_empty = |v: &Value| v.as_array().is_some_and(|a| !a.is_empty());
    if non_empty(&spec["imagePullSecrets"]) {
        return true;
    }
    let vols = spec["volumes"].as_array().into_iter().flatten();
    for v in vols {
        let Some(v) = v.as_object() else { continue };
        if v.contains_key("secret") {
            return true;
        }
        if v.get("projected")
            .and_then(|p| p["sources"].as_array())
            .is_some_and(|s| {
                s.iter()
                    .any(|s| s.get("secret").is_some_and(|x| !x.is_null()))
            })
        {
            return true;
        }
        // Volume plugins' credentials (csi, cephfs, rbd, iscsi, ...).
        let creds = ["secretRef", "nodePublishSecretRef", "secretName"];
        if v.values().any(|src| {
            creds
                .iter()
                .any(|k| src.get(*k).is_some_and(|x| !x.is_null()))
        }) {
            return true;
        }
    }
    for field in ["initContainers", "containers", "ephemeralContainers"] {
        for c in spec[field].as_array().into_iter().flatten() {
            let env = c["env"].as_array().into_iter().flatten();
            if env
                .into_iter()
                .any(|e| !e["valueFrom"]["secretKeyRef"].is_null())
            {
                return true;
            }
            let from = c["envFrom"].as_array().into_iter().flatten();
            if from.into_iter().any(|e| !e["secretRef"].is_null()) {
                return true;
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn the_account_defaults_to_default_and_both_fields_agree() {
        let mut s = spec(json!({}));
        assert_eq!(default_account(&mut s), "default");
        assert_eq!(s["serviceAccount"], "default");
        let mut s = spec(json!({"serviceAccount": "old"}));
        assert_eq!(default_account(&mut s), "old");
        assert_eq!(s["serviceAccountName"], "old");
        let mut s = spec(json!({"serviceAccountName": "bot"}));
        assert_eq!(default_account(&mut s), "bot");
    }

    #[test]
    fn automount_follows_the_pod_then_the_account() {
        let sa_off = json!({"automountServiceAccountToken": false});
        assert!(automount(&spec(json!({})), &json!({})));
        assert!(!automount(&spec(json!({})), &sa_off));
        assert!(automount(
            &spec(json!({"automountServiceAccountToken": true})),
            &sa_off
        ));
        assert!(!automount(
            &spec(json!({"automountServiceAccountToken": false})),
            &json!({})
        ));
    }

    #[test]
    fn every_container_mounts_the_projected_volume() {
        let mut s = spec(json!({
            "initContainers": [{"name": "i"}],
            "containers": [{"name": "a"}, {"name": "b", "volumeMounts": [{"name": "own", "mountPath": MOUNT_PATH}]}],
            "volumes": [{"name": "own", "emptyDir": {}}]
        }));
        mount_token(&mut s, "abcde");
        let want =
            json!({"name": "kube-api-access-abcde", "readOnly": true, "mountPath": MOUNT_PATH});
        assert_eq!(s["initContainers"][0]["volumeMounts"], json!([want]));
        assert_eq!(s["containers"][0]["volumeMounts"], json!([want]));
        assert_eq!(
            s["containers"][1]["volumeMounts"].as_array().unwrap().len(),
            1
        );
        let vol = &s["volumes"][1];
        assert_eq!(vol["name"], "kube-api-access-abcde");
        assert_eq!(vol["projected"]["defaultMode"], 420);
        let src = &vol["projected"]["sources"];
        assert_eq!(src[0]["serviceAccountToken"]["expirationSeconds"], 3607);
        assert_eq!(src[1]["configMap"]["name"], "kube-root-ca.crt");
        assert_eq!(
            src[2]["downwardAPI"]["items"][0]["fieldRef"]["fieldPath"],
            "metadata.namespace"
        );
    }

    #[test]
    fn no_volume_when_every_container_mounts_the_path_itself() {
        let mut s = spec(json!({
            "containers": [{"name": "a", "volumeMounts": [{"name": "x", "mountPath": MOUNT_PATH}]}]
        }));
        mount_token(&mut s, "abcde");
        assert!(s.get("volumes").is_none());
    }

    #[test]
    fn pull_secrets_come_from_the_account_only_when_the_pod_has_none() {
        let sa = json!({"imagePullSecrets": [{"name": "reg"}]});
        let mut s = spec(json!({}));
        add_pull_secrets(&mut s, &sa);
        assert_eq!(s["imagePullSecrets"], json!([{"name": "reg"}]));
        let mut s = spec(json!({"imagePullSecrets": [{"name": "mine"}]}));
        add_pull_secrets(&mut s, &sa);
        assert_eq!(s["imagePullSecrets"], json!([{"name": "mine"}]));
    }

    #[test]
    fn the_account_may_not_change() {
        let pod = |sa: &str| json!({"metadata": {"name": "p"}, "spec": {"serviceAccountName": sa}});
        assert!(validate_update(&pod("a"), &pod("a")).is_ok());
        let err = validate_update(&pod("a"), &pod("b")).unwrap_err();
        assert_eq!(err.code, 422);
    }

    #[test]
    fn mirror_pods_may_not_use_accounts_or_secrets() {
        let pod = |spec: Value| json!({"spec": spec});
        assert!(check_mirror(&pod(json!({"containers": [{"name": "a"}]}))).is_ok());
        assert!(check_mirror(&pod(json!({"serviceAccountName": "default"}))).is_ok());
        assert_eq!(
            check_mirror(&pod(json!({"serviceAccountName": "bot"}))).unwrap_err(),
            "a mirror pod may not reference service accounts"
        );
        let secret_env = json!({"containers": [{"name": "a", "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}]});
        assert_eq!(
            check_mirror(&pod(secret_env)).unwrap_err(),
            "a mirror pod may not reference secrets"
        );
        let vol = json!({"volumes": [{"name": "v", "secret": {"secretName": "s"}}]});
        assert!(check_mirror(&pod(vol)).is_err());
        let tok = json!({"volumes": [{"name": "v", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}]});
        assert_eq!(
            check_mirror(&pod(tok)).unwrap_err(),
            "a mirror pod may not use ServiceAccountToken volume projections"
        );
    }
}
