//! ContainerConfig from a pod's container, as the kubelet's
//! `generateContainerConfig`: command and args with `$(VAR)` expansion,
//! environment, resources, security context, log path, and the labels and
//! annotations that let a restarted agent recognise the container.

use std::collections::HashMap;
use std::path::Path;

use cri_proto::v1;
use k8s_openapi::api::core::v1::{Container, EnvVar, Pod};
use sha2::{Digest, Sha256};

use super::resources::{self, Which};
use super::sandbox::namespace_options;
use super::security::{self, ImageUser, NodeSecurity};
use super::{downward, labels};
use crate::pod::PodExt;
use crate::volumes::objects::{EnvObjects, Kind};
use crate::volumes::PodVolumes;

/// A container's environment could not be built (the kubelet's
/// CreateContainerConfigError).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// Facts about the pod's placement that env vars may refer to.
pub struct ContainerContext<'a> {
    pub node_name: &'a str,
    pub pod_ip: &'a str,
    pub host_ip: &'a str,
    /// Directory for this container's termination message files.
    pub container_dir: &'a Path,
    /// The configMaps and secrets its env names, read beforehand; None
    /// when the agent has no API connection.
    pub objects: Option<&'a EnvObjects>,
    /// The pod's volumes on the host, for `volumeMounts`.
    pub volumes: &'a PodVolumes,
    /// The user the container's image runs as (CRI ImageStatus), or why
    /// it could not be read: `runAsNonRoot` is checked against it.
    pub image_user: Result<ImageUser, String>,
    /// Seccomp root and AppArmor of the node.
    pub node: NodeSecurity<'a>,
}

/// A stable hash of the container spec: when it changes, the container is
/// restarted (kubelet `HashContainer`). serde_json of k8s-openapi types is
/// deterministic (maps are BTreeMaps), so the hash survives agent restarts.
pub fn container_hash(c: &Container) -> String {
    let bytes = serde_json::to_vec(c).unwrap_or_default();
    hex::encode(&Sha256::digest(&bytes)[..4])
}

/// The container's log path relative to the sandbox's log directory.
pub fn log_path(name: &str, restart_count: u32) -> String {
    format!("{name}/{restart_count}.log")
}

pub fn container_config(
    pod: &Pod,
    c: &Container,
    restart_count: u32,
    ctx: &ContainerContext,
) -> Result<v1::ContainerConfig, ConfigError> {
    // Refused before anything is written for the container, as the
    // kubelet's `generateContainerConfig` checks runAsNonRoot first.
    security::refuse_unsupported(pod, c).map_err(ConfigError)?;
    let image_user = ctx.image_user.as_ref().map_err(String::as_str);
    security::verify_run_as_non_root(pod, c, image_user).map_err(ConfigError)?;
    let env = resolve_env(pod, c, ctx)?;
    let lookup: HashMap<&str, &str> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let command = c
        .command
        .iter()
        .flatten()
        .map(|s| expand(s, &lookup))
        .collect();
    let args = c
        .args
        .iter()
        .flatten()
        .map(|s| expand(s, &lookup))
        .collect();

    let mut cont_labels = HashMap::from([
        (labels::POD_NAME.to_string(), pod.name().to_string()),
        (
            labels::POD_NAMESPACE.to_string(),
            pod.namespace().to_string(),
        ),
        (labels::POD_UID.to_string(), pod.uid().to_string()),
        (labels::CONTAINER_NAME.to_string(), c.name.clone()),
    ]);
    cont_labels.insert(labels::MANAGED_BY.into(), labels::MANAGED_BY_VALUE.into());

    let msg_path = c
        .termination_message_path
        .clone()
        .unwrap_or_else(|| "/dev/termination-log".into());
    let mut mounts = Vec::new();
    let mut annotations = HashMap::from([
        (labels::CONTAINER_HASH.to_string(), container_hash(c)),
        (
            labels::CONTAINER_RESTART_COUNT.to_string(),
            restart_count.to_string(),
        ),
        (
            labels::TERMINATION_MESSAGE_PATH.to_string(),
            msg_path.clone(),
        ),
        (
            labels::TERMINATION_MESSAGE_POLICY.to_string(),
            c.termination_message_policy
                .clone()
                .unwrap_or_else(|| "File".into()),
        ),
        (
            labels::POD_GRACE_PERIOD.to_string(),
            pod.grace_period_seconds().to_string(),
        ),
    ]);
    if let Some(ports) = &c.ports {
        annotations.insert(
            labels::CONTAINER_PORTS.into(),
            serde_json::to_string(ports).unwrap_or_default(),
        );
    }
    if !msg_path.is_empty() {
        // The kubelet bind-mounts an empty host file at the message path and
        // reads it when the container terminates.
        let host = ctx
            .container_dir
            .join(format!("termination-log-{restart_count}"));
        // World-writable, as the kubelet makes it: the container may run
        // as any user.
        let created = std::fs::create_dir_all(ctx.container_dir).is_ok()
            && std::fs::write(&host, b"").is_ok()
            && std::fs::set_permissions(&host, std::os::unix::fs::PermissionsExt::from_mode(0o666))
                .is_ok();
        if created {
            mounts.push(v1::Mount {
                container_path: msg_path,
                host_path: host.display().to_string(),
                ..Default::default()
            });
            annotations.insert(
                labels::TERMINATION_MESSAGE_FILE.into(),
                host.display().to_string(),
            );
        }
    }
    mounts.extend(volume_mounts(c, ctx, &lookup)?);

    Ok(v1::ContainerConfig {
        metadata: Some(v1::ContainerMetadata {
            name: c.name.clone(),
            attempt: restart_count,
        }),
        image: Some(v1::ImageSpec {
            image: c.image.clone().unwrap_or_default(),
            ..Default::default()
        }),
        command,
        args,
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs: env
            .into_iter()
            .map(|(key, value)| v1::KeyValue {
                key,
                value: value.into_bytes(),
            })
            .collect(),
        mounts,
        labels: cont_labels,
        annotations,
        log_path: log_path(&c.name, restart_count),
        stdin: c.stdin.unwrap_or(false),
        stdin_once: c.stdin_once.unwrap_or(false),
        tty: c.tty.unwrap_or(false),
        linux: Some(linux_config(pod, c, ctx)),
        ..Default::default()
    })
}

fn linux_config(pod: &Pod, c: &Container, ctx: &ContainerContext) -> v1::LinuxContainerConfig {
    let cpu_req =
        resources::get(c, Which::Request, "cpu").and_then(|q| resources::parse_cpu_millis(&q));
    let cpu_lim =
        resources::get(c, Which::Limit, "cpu").and_then(|q| resources::parse_cpu_millis(&q));
    let mem_lim =
        resources::get(c, Which::Limit, "memory").and_then(|q| resources::parse_bytes(&q));
    let res = resources::linux_resources(cpu_req, cpu_lim, mem_lim);
    let mut security =
        security::container_security(pod, c, ctx.image_user.as_ref().ok(), &ctx.node);
    security.namespace_options = Some(namespace_options(pod));
    v1::LinuxContainerConfig {
        resources: Some(res),
        security_context: Some(security),
    }
}

/// The container's environment in order: envFrom first, then env (which
/// wins), with `$(VAR)` references to earlier variables expanded, as the
/// kubelet's `makeEnvironmentVariables`.
fn resolve_env(
    pod: &Pod,
    c: &Container,
    ctx: &ContainerContext,
) -> Result<Vec<(String, String)>, ConfigError> {
    // The API server's Service variables first: the pod's own may override
    // them (the kubelet's service env map is the base).
    let mut out: Vec<(String, String)> = ctx
        .objects
        .map(|o| o.service_env.clone())
        .unwrap_or_default();
    let set = |out: &mut Vec<(String, String)>, name: &str, value: String| {
        out.retain(|(k, _)| k != name);
        out.push((name.to_string(), value));
    };
    for from in c.env_from.iter().flatten() {
        let Some((kind, name, optional)) = env_from_source(from) else {
            continue;
        };
        let Some(data) = lookup_object(pod, ctx, kind, &name, optional, None)? else {
            continue;
        };
        let prefix = from.prefix.as_deref().unwrap_or("");
        for (k, v) in data.iter() {
            let var = format!("{prefix}{k}");
            // Invalid names are skipped (reported by `env_from_invalid_keys`).
            if is_env_var_name(&var) {
                set(&mut out, &var, String::from_utf8_lossy(v).into_owned());
            }
        }
    }
    for EnvVar {
        name,
        value,
        value_from,
    } in c.env.iter().flatten()
    {
        let resolved = match (value, value_from) {
            (_, Some(from)) => {
                if let Some(f) = &from.field_ref {
                    field_ref(pod, &f.field_path, ctx)?
                } else if let Some(r) = &from.resource_field_ref {
                    downward::resource_field_ref(
                        c,
                        &r.resource,
                        r.divisor.as_ref().map(|d| d.0.as_str()),
                    )
                    .map_err(|e| ConfigError(e.to_string()))?
                } else if let Some(k) = &from.config_map_key_ref {
                    let optional = k.optional.unwrap_or(false);
                    match key_ref(pod, ctx, Kind::ConfigMap, &k.name, &k.key, optional, name)? {
                        Some(v) => v,
                        None => continue,
                    }
                } else if let Some(k) = &from.secret_key_ref {
                    let optional = k.optional.unwrap_or(false);
                    match key_ref(pod, ctx, Kind::Secret, &k.name, &k.key, optional, name)? {
                        Some(v) => v,
                        None => continue,
                    }
                } else {
                    String::new()
                }
            }
            (Some(v), None) => {
                let lookup: HashMap<&str, &str> =
                    out.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                expand(v, &lookup)
            }
            (None, None) => String::new(),
        };
        set(&mut out, name, resolved);
    }
    Ok(out)
}

fn env_from_source(
    from: &k8s_openapi::api::core::v1::EnvFromSource,
) -> Option<(Kind, String, bool)> {
    if let Some(r) = &from.config_map_ref {
        Some((Kind::ConfigMap, r.name.clone(), r.optional.unwrap_or(false)))
    } else {
        from.secret_ref
            .as_ref()
            .map(|r| (Kind::Secret, r.name.clone(), r.optional.unwrap_or(false)))
    }
}

/// A configMap's or secret's data for env; None when it is missing and
/// optional. `env` names the variable asking, for the no-API message.
fn lookup_object<'a>(
    pod: &Pod,
    ctx: &'a ContainerContext,
    kind: Kind,
    name: &str,
    optional: bool,
    env: Option<(&str, &str)>,
) -> Result<Option<&'a crate::volumes::objects::Data>, ConfigError> {
    let Some(objects) = ctx.objects else {
        return Err(ConfigError(match env {
            Some((key, var)) => format!(
                "{} {name:?} not found (key {key:?} for env {var}): this node has no API server connection",
                kind.noun()
            ),
            None => format!(
                "envFrom {} is not available: this node has no API server connection to read it from",
                kind.noun()
            ),
        }));
    };
    match objects.get(kind, name) {
        Some(Ok(d)) => Ok(Some(d.as_ref())),
        Some(Err(e)) if e.is_not_found() && optional => Ok(None),
        Some(Err(e)) => Err(ConfigError(e.to_string())),
        // Not fetched: treat as missing (the fetch covers every reference).
        None if optional => Ok(None),
        None => Err(ConfigError(format!(
            "{} {name:?} not found in namespace {}",
            kind.noun(),
            pod.namespace()
        ))),
    }
}

/// One key of a configMap or secret; None when optional and missing.
fn key_ref(
    pod: &Pod,
    ctx: &ContainerContext,
    kind: Kind,
    name: &str,
    key: &str,
    optional: bool,
    var: &str,
) -> Result<Option<String>, ConfigError> {
    let Some(data) = lookup_object(pod, ctx, kind, name, optional, Some((key, var)))? else {
        return Ok(None);
    };
    match data.get(key) {
        Some(v) => Ok(Some(String::from_utf8_lossy(v).into_owned())),
        None if optional => Ok(None),
        None => {
            let what = match kind {
                Kind::ConfigMap => "ConfigMap",
                Kind::Secret => "Secret",
            };
            Err(ConfigError(format!(
                "couldn't find key {key} in {what} {}/{name}",
                pod.namespace()
            )))
        }
    }
}

/// Upstream's `IsEnvVarName`: `[-._a-zA-Z][-._a-zA-Z0-9]*`.
pub fn is_env_var_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || matches!(c, '-' | '.' | '_'))
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
}

/// The kubelet's InvalidEnvironmentVariableNames event messages: keys of
/// envFrom sources skipped because they are not valid variable names.
pub fn env_from_invalid_keys(pod: &Pod, c: &Container, objects: &EnvObjects) -> Vec<String> {
    let mut out = Vec::new();
    for from in c.env_from.iter().flatten() {
        let Some((kind, name, _)) = env_from_source(from) else {
            continue;
        };
        let Some(Ok(data)) = objects.get(kind, &name) else {
            continue;
        };
        let prefix = from.prefix.as_deref().unwrap_or("");
        let bad: Vec<&str> = data
            .keys()
            .filter(|k| !is_env_var_name(&format!("{prefix}{k}")))
            .map(String::as_str)
            .collect();
        if !bad.is_empty() {
            out.push(format!(
                "Keys [{}] from the EnvFrom {} {}/{name} were skipped since they are considered invalid environment variable names.",
                bad.join(", "),
                kind.noun(),
                pod.namespace()
            ));
        }
    }
    out
}

/// CRI mounts for the container's volumeMounts (the kubelet's
/// `makeMounts`): subPath / subPathExpr inside the volume, read-only as
/// asked (API-data volumes always), mount propagation.
fn volume_mounts(
    c: &Container,
    ctx: &ContainerContext,
    env: &HashMap<&str, &str>,
) -> Result<Vec<v1::Mount>, ConfigError> {
    let mut out = Vec::new();
    for m in c.volume_mounts.iter().flatten() {
        let vol = ctx.volumes.get(&m.name).ok_or_else(|| {
            ConfigError(format!(
                "cannot find volume {:?} to mount into container {:?}",
                m.name, c.name
            ))
        })?;
        let sub = match (m.sub_path.as_deref(), m.sub_path_expr.as_deref()) {
            (Some(s), _) if !s.is_empty() => Some(s.to_string()),
            (_, Some(e)) if !e.is_empty() => Some(expand(e, env)),
            _ => None,
        };
        let host = match sub {
            Some(sub) => sub_path(&vol.path, &sub)?,
            None => vol.path.clone(),
        };
        let propagation = match m.mount_propagation.as_deref() {
            Some("HostToContainer") => v1::MountPropagation::PropagationHostToContainer,
            Some("Bidirectional") => v1::MountPropagation::PropagationBidirectional,
            _ => v1::MountPropagation::PropagationPrivate,
        };
        out.push(v1::Mount {
            container_path: m.mount_path.clone(),
            host_path: host.display().to_string(),
            readonly: m.read_only.unwrap_or(false) || vol.read_only,
            propagation: propagation as i32,
            ..Default::default()
        });
    }
    Ok(out)
}

/// The host path of `sub` inside the volume at `root`, created as a
/// directory when missing (as upstream), refused when it (or a symlink in
/// it) leads out of the volume.
fn sub_path(root: &Path, sub: &str) -> Result<std::path::PathBuf, ConfigError> {
    use std::path::Component;
    let rel = Path::new(sub);
    if !rel.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(ConfigError(format!(
            "subPath {sub:?} must be a relative path without '..'"
        )));
    }
    let path = root.join(rel);
    if std::fs::symlink_metadata(&path).is_err() {
        std::fs::create_dir_all(&path)
            .map_err(|e| ConfigError(format!("cannot create subPath {sub:?}: {e}")))?;
    }
    let (Ok(real), Ok(real_root)) = (path.canonicalize(), root.canonicalize()) else {
        return Err(ConfigError(format!("cannot resolve subPath {sub:?}")));
    };
    if !real.starts_with(&real_root) {
        return Err(ConfigError(format!(
            "subPath {sub:?} leads outside of its volume"
        )));
    }
    // The resolved path: a symlink swapped later cannot redirect the mount.
    Ok(real)
}

fn field_ref(pod: &Pod, path: &str, ctx: &ContainerContext) -> Result<String, ConfigError> {
    let spec = pod.spec.as_ref();
    Ok(match path {
        "metadata.name" => pod.name().into(),
        "metadata.namespace" => pod.namespace().into(),
        "metadata.uid" => pod.uid().into(),
        "spec.nodeName" => ctx.node_name.into(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.podIP" | "status.podIPs" => ctx.pod_ip.into(),
        "status.hostIP" | "status.hostIPs" => ctx.host_ip.into(),
        p => {
            let label = |prefix: &str, map: &Option<std::collections::BTreeMap<String, String>>| {
                p.strip_prefix(prefix)
                    .and_then(|k| k.strip_prefix("['").and_then(|k| k.strip_suffix("']")))
                    .map(|k| {
                        map.as_ref()
                            .and_then(|m| m.get(k).cloned())
                            .unwrap_or_default()
                    })
            };
            label("metadata.labels", &pod.metadata.labels)
                .or_else(|| label("metadata.annotations", &pod.metadata.annotations))
                .ok_or_else(|| ConfigError(format!("unsupported fieldRef {p:?}")))?
        }
    })
}

/// `$(VAR)` expansion: defined variables are replaced, `$$` escapes,
/// undefined references stay as written (Kubernetes semantics).
pub fn expand(s: &str, vars: &HashMap<&str, &str>) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(after) = tail.strip_prefix("$$") {
            out.push('$');
            rest = after;
        } else if let Some(end) = tail.strip_prefix("$(").and_then(|t| t.find(')')) {
            let name = &tail[2..2 + end];
            match vars.get(name) {
                Some(v) => out.push_str(v),
                None => out.push_str(&tail[..end + 3]),
            }
            rest = &tail[end + 3..];
        } else {
            out.push('$');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn test_node() -> NodeSecurity<'static> {
        NodeSecurity {
            seccomp_root: Path::new("/var/lib/skiff-agent/seccomp"),
            apparmor: false,
        }
    }

    #[test]
    fn expansion() {
        let vars = HashMap::from([("A", "1"), ("B", "two")]);
        assert_eq!(expand("x$(A)-$(B)", &vars), "x1-two");
        assert_eq!(expand("$(C) $$(A) $", &vars), "$(C) $(A) $");
    }

    #[test]
    fn config_carries_env_resources_and_labels() {
        let pod: Pod = serde_saphyr::from_str(
            "metadata: {name: web, namespace: ns, uid: u}\nspec:\n  containers:\n  - name: c\n    image: toolbox:1\n    command: [sh, -c]\n    args: ['echo $(GREETING) $(POD)']\n    env:\n    - {name: GREETING, value: hi}\n    - name: POD\n      valueFrom: {fieldRef: {fieldPath: metadata.name}}\n    resources: {limits: {cpu: 250m, memory: 64Mi}}\n    securityContext: {runAsUser: 1000, readOnlyRootFilesystem: true, capabilities: {add: [NET_ADMIN]}}\n",
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ctx = ContainerContext {
            node_name: "n1",
            pod_ip: "198.18.0.5",
            host_ip: "198.18.0.1",
            container_dir: dir.path(),
            objects: None,
            volumes: &PodVolumes::new(),
            image_user: Ok(ImageUser::default()),
            node: test_node(),
        };
        let c = &pod.containers()[0];
        let cfg = container_config(&pod, c, 3, &ctx).unwrap();
        assert_eq!(cfg.args, vec!["echo hi web"]);
        assert_eq!(cfg.log_path, "c/3.log");
        assert_eq!(cfg.metadata.as_ref().unwrap().attempt, 3);
        assert_eq!(cfg.labels[labels::CONTAINER_NAME], "c");
        assert_eq!(cfg.annotations[labels::CONTAINER_RESTART_COUNT], "3");
        let linux = cfg.linux.unwrap();
        let r = linux.resources.unwrap();
        assert_eq!(
            (r.cpu_quota, r.cpu_period, r.cpu_shares),
            (25_000, 100_000, 256)
        );
        assert_eq!(r.memory_limit_in_bytes, 64 << 20);
        let sc = linux.security_context.unwrap();
        assert_eq!(sc.run_as_user.unwrap().value, 1000);
        assert!(sc.readonly_rootfs);
        assert_eq!(sc.capabilities.unwrap().add_capabilities, vec!["NET_ADMIN"]);
        assert_eq!(cfg.mounts[0].container_path, "/dev/termination-log");
    }

    #[test]
    fn missing_configmap_is_a_config_error() {
        let pod: Pod = serde_saphyr::from_str(
            "metadata: {name: w, uid: u}\nspec:\n  containers:\n  - name: c\n    image: i\n    env:\n    - name: X\n      valueFrom: {configMapKeyRef: {name: cm, key: k}}\n",
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ctx = ContainerContext {
            node_name: "n",
            pod_ip: "",
            host_ip: "",
            container_dir: dir.path(),
            objects: None,
            volumes: &PodVolumes::new(),
            image_user: Ok(ImageUser::default()),
            node: test_node(),
        };
        let e = container_config(&pod, &pod.containers()[0], 0, &ctx).unwrap_err();
        assert!(e.0.contains("configmap \"cm\" not found"), "{e}");
    }

    fn objects() -> EnvObjects {
        use crate::volumes::objects::FetchError;
        use std::sync::Arc;
        let data = |pairs: &[(&str, &str)]| {
            Ok(Arc::new(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
                    .collect(),
            ))
        };
        let mut o = EnvObjects::default();
        o.objects.insert(
            (Kind::ConfigMap, "cm".into()),
            data(&[("A", "1"), ("B", "2"), ("bad-key!", "x"), ("1x", "y")]),
        );
        o.objects
            .insert((Kind::Secret, "s".into()), data(&[("PASS", "hunter2")]));
        o.objects.insert(
            (Kind::ConfigMap, "gone".into()),
            Err(FetchError::NotFound {
                kind: Kind::ConfigMap,
                name: "gone".into(),
            }),
        );
        o
    }

    fn env_of(
        yaml: &str,
        objects: Option<&EnvObjects>,
    ) -> Result<Vec<(String, String)>, ConfigError> {
        let pod: Pod = serde_saphyr::from_str(yaml).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let vols = PodVolumes::new();
        let ctx = ContainerContext {
            node_name: "n",
            pod_ip: "198.18.0.9",
            host_ip: "",
            container_dir: dir.path(),
            objects,
            volumes: &vols,
            image_user: Ok(ImageUser::default()),
            node: test_node(),
        };
        resolve_env(&pod, &pod.containers()[0], &ctx)
    }

    #[test]
    fn env_from_objects() {
        let o = objects();
        let env = env_of(
            "metadata: {name: w, namespace: ns, uid: u}\nspec:\n  containers:\n  - name: c\n    image: i\n    envFrom:\n    - configMapRef: {name: cm}\n      prefix: CM_\n    - secretRef: {name: s}\n    - configMapRef: {name: gone, optional: true}\n    env:\n    - {name: CM_A, value: overridden}\n    - name: X\n      valueFrom: {configMapKeyRef: {name: cm, key: B}}\n    - name: P\n      valueFrom: {secretKeyRef: {name: s, key: PASS}}\n    - name: OPT\n      valueFrom: {configMapKeyRef: {name: gone, key: k, optional: true}}\n    - name: OPTKEY\n      valueFrom: {secretKeyRef: {name: s, key: nope, optional: true}}\n    - name: IP\n      valueFrom: {fieldRef: {fieldPath: status.podIP}}\n",
            Some(&o),
        )
        .unwrap();
        let m: HashMap<_, _> = env.iter().cloned().collect();
        assert_eq!(m["CM_A"], "overridden");
        assert_eq!(m["CM_B"], "2");
        assert_eq!(m["CM_1x"], "y");
        assert_eq!(m["PASS"], "hunter2");
        assert_eq!(m["X"], "2");
        assert_eq!(m["P"], "hunter2");
        assert_eq!(m["IP"], "198.18.0.9");
        assert!(!m.contains_key("OPT") && !m.contains_key("OPTKEY"));
        assert!(!m.keys().any(|k| k.contains('!')));

        let pod: Pod = serde_saphyr::from_str("metadata: {name: w, namespace: ns}\nspec:\n  containers:\n  - name: c\n    envFrom: [{configMapRef: {name: cm}}]\n").unwrap();
        let warn = env_from_invalid_keys(&pod, &pod.containers()[0], &o);
        assert_eq!(warn, ["Keys [1x, bad-key!] from the EnvFrom configmap ns/cm were skipped since they are considered invalid environment variable names."]);
    }

    #[test]
    fn env_errors_as_upstream() {
        let o = objects();
        let e = |y: &str| env_of(y, Some(&o)).unwrap_err().0;
        let base = "metadata: {name: w, namespace: ns}\nspec:\n  containers:\n  - name: c\n";
        assert_eq!(
            e(&format!("{base}    env: [{{name: X, valueFrom: {{configMapKeyRef: {{name: gone, key: k}}}}}}]\n")),
            "configmap \"gone\" not found"
        );
        assert_eq!(
            e(&format!(
                "{base}    env: [{{name: X, valueFrom: {{secretKeyRef: {{name: s, key: k}}}}}}]\n"
            )),
            "couldn't find key k in Secret ns/s"
        );
        assert_eq!(
            e(&format!(
                "{base}    envFrom: [{{configMapRef: {{name: gone}}}}]\n"
            )),
            "configmap \"gone\" not found"
        );
        // Without an API connection the message says so.
        let msg = env_of(
            &format!("{base}    envFrom: [{{secretRef: {{name: s}}}}]\n"),
            None,
        )
        .unwrap_err()
        .0;
        assert!(msg.contains("no API server connection"), "{msg}");
    }

    #[test]
    fn volume_mounts_with_sub_paths() {
        use crate::volumes::HostVolume;
        let dir = tempfile::tempdir().unwrap();
        let vol = dir.path().join("vol");
        std::fs::create_dir_all(&vol).unwrap();
        std::os::unix::fs::symlink("/etc", vol.join("escape")).unwrap();
        let vols = PodVolumes::from([
            (
                "data".to_string(),
                HostVolume {
                    path: vol.clone(),
                    read_only: false,
                },
            ),
            (
                "cfg".to_string(),
                HostVolume {
                    path: vol.clone(),
                    read_only: true,
                },
            ),
        ]);
        let pod: Pod = serde_saphyr::from_str(
            "metadata: {name: w, namespace: ns, uid: u}\nspec:\n  containers:\n  - name: c\n    env: [{name: SUB, value: logs}]\n    volumeMounts:\n    - {name: data, mountPath: /data, mountPropagation: HostToContainer}\n    - {name: data, mountPath: /ro, readOnly: true, subPath: a/b}\n    - {name: data, mountPath: /expr, subPathExpr: $(SUB)}\n    - {name: cfg, mountPath: /cfg}\n",
        )
        .unwrap();
        let cdir = dir.path().join("c");
        let ctx = ContainerContext {
            node_name: "n",
            pod_ip: "",
            host_ip: "",
            container_dir: &cdir,
            objects: None,
            volumes: &vols,
            image_user: Ok(ImageUser::default()),
            node: test_node(),
        };
        let cfg = container_config(&pod, &pod.containers()[0], 0, &ctx).unwrap();
        let m: HashMap<_, _> = cfg
            .mounts
            .iter()
            .map(|m| (m.container_path.as_str(), m))
            .collect();
        let real = vol.canonicalize().unwrap();
        assert_eq!(m["/data"].host_path, vol.display().to_string());
        assert_eq!(
            m["/data"].propagation,
            v1::MountPropagation::PropagationHostToContainer as i32
        );
        assert!(!m["/data"].readonly);
        assert_eq!(m["/ro"].host_path, real.join("a/b").display().to_string());
        assert!(m["/ro"].readonly && vol.join("a/b").is_dir());
        assert_eq!(
            m["/expr"].host_path,
            real.join("logs").display().to_string()
        );
        assert!(m["/cfg"].readonly, "API-data volumes are read-only");

        let bad = |sub: &str, volume: &str| {
            let p: Pod = serde_saphyr::from_str(&format!("metadata: {{name: w}}\nspec:\n  containers:\n  - name: c\n    volumeMounts: [{{name: {volume}, mountPath: /x, subPath: '{sub}'}}]\n")).unwrap();
            container_config(&p, &p.containers()[0], 0, &ctx)
                .unwrap_err()
                .0
        };
        assert!(bad("../up", "data").contains("without '..'"));
        assert!(bad("escape", "data").contains("outside of its volume"));
        assert_eq!(
            bad("x", "nope"),
            "cannot find volume \"nope\" to mount into container \"c\""
        );
    }
}
