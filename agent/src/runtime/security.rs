//! The security context on the node, as the kubelet's
//! `kuberuntime/security_context*.go` and `pkg/securitycontext`: the
//! effective context of a container (its own fields over the pod's), mapped
//! to CRI's `LinuxContainerSecurityContext` and `LinuxSandboxSecurityContext`,
//! and `runAsNonRoot` checked against the image's user.
//!
//! Every field is either passed to the runtime, which enforces it, or
//! refused with a message naming it: `procMount: Unmasked` (CRI cannot say
//! "no masked paths" on the wire: an empty list reads as "the runtime's
//! defaults") and `windowsOptions` (this is a Linux node). `seLinuxOptions`
//! go to the runtime as the kubelet sends them; a runtime on a host without
//! SELinux ignores them, as upstream does. Pod admission (sysctls, AppArmor,
//! supplementalGroupsPolicy) lives in [`super::admit`].

use std::path::Path;

use cri_proto::{v1, CriClient};
use k8s_openapi::api::core::v1::{
    AppArmorProfile, Container, Pod, PodSecurityContext, SELinuxOptions, SeccompProfile,
    SecurityContext,
};

use crate::pod::PodExt;

/// The deprecated per-container AppArmor annotation prefix, still honoured
/// by the kubelet when the fields are absent.
const APPARMOR_ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";

/// The user an image runs as without `runAsUser` (CRI ImageStatus): a
/// numeric `uid`, or a `username` that is not a number.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageUser {
    pub uid: Option<i64>,
    pub username: String,
}

/// What the node brings to the mapping.
#[derive(Debug, Clone, Copy)]
pub struct NodeSecurity<'a> {
    /// `Localhost` seccomp profiles are read from here (the kubelet's
    /// `<root-dir>/seccomp`).
    pub seccomp_root: &'a Path,
    /// Whether the host enforces AppArmor; without it no profile is sent
    /// (pods that need one are refused at admission).
    pub apparmor: bool,
}

/// Where `Localhost` seccomp profiles live under the agent's root
/// directory, as the kubelet's `<root-dir>/seccomp`.
pub fn seccomp_root(root_dir: &Path) -> std::path::PathBuf {
    root_dir.join("seccomp")
}

/// Whether runAsNonRoot has to be checked against the image's user: the
/// effective context asks for it and names no user of its own.
pub fn needs_image_user(pod: &Pod, c: &Container) -> bool {
    let sc = effective(pod, c);
    sc.run_as_non_root == Some(true) && sc.run_as_user.is_none()
}

/// The image's user, from CRI ImageStatus.
///
/// # Errors
/// The ImageStatus call failed, or the image is not present.
pub async fn image_user(cri: &CriClient, image: &str) -> Result<ImageUser, String> {
    let r = cri
        .image_status(v1::ImageStatusRequest {
            image: Some(v1::ImageSpec {
                image: image.to_string(),
                ..Default::default()
            }),
            verbose: false,
        })
        .await
        .map_err(|e| format!("failed to get image user: {}", super::status_message(&e)))?;
    let img = r
        .image
        .ok_or_else(|| format!("failed to get image user: image {image:?} is not present"))?;
    // An image that names no user runs as root (upstream `getImageUser`).
    let uid = match (img.uid, img.username.is_empty()) {
        (Some(u), _) => Some(u.value),
        (None, true) => Some(0),
        (None, false) => None,
    };
    Ok(ImageUser {
        uid,
        username: img.username,
    })
}

/// The container's effective security context: each field the container
/// sets wins over the pod's (upstream `DetermineEffectiveSecurityContext`);
/// the container-only fields come from the container.
pub fn effective(pod: &Pod, c: &Container) -> SecurityContext {
    let mut sc = c.security_context.clone().unwrap_or_default();
    let Some(psc) = pod_context(pod) else {
        return sc;
    };
    sc.se_linux_options = sc.se_linux_options.or_else(|| psc.se_linux_options.clone());
    sc.windows_options = sc.windows_options.or_else(|| psc.windows_options.clone());
    sc.run_as_user = sc.run_as_user.or(psc.run_as_user);
    sc.run_as_group = sc.run_as_group.or(psc.run_as_group);
    sc.run_as_non_root = sc.run_as_non_root.or(psc.run_as_non_root);
    sc.seccomp_profile = sc.seccomp_profile.or_else(|| psc.seccomp_profile.clone());
    sc.app_armor_profile = sc
        .app_armor_profile
        .or_else(|| psc.app_armor_profile.clone());
    sc
}

fn pod_context(pod: &Pod) -> Option<&PodSecurityContext> {
    pod.spec.as_ref().and_then(|s| s.security_context.as_ref())
}

/// upstream `format.Pod`: `name_namespace(uid)`.
fn pod_ref(pod: &Pod) -> String {
    format!("{}_{}({})", pod.name(), pod.namespace(), pod.uid())
}

/// `runAsNonRoot` as the kubelet's `verifyRunAsNonRoot`, with its messages:
/// an explicit `runAsUser` decides alone; otherwise the image's user must be
/// numeric and not 0. `image` is None when its user could not be read.
///
/// # Errors
/// The message of the container's CreateContainerConfigError.
pub fn verify_run_as_non_root(
    pod: &Pod,
    c: &Container,
    image: Result<&ImageUser, &str>,
) -> Result<(), String> {
    let sc = effective(pod, c);
    if sc.run_as_non_root != Some(true) {
        return Ok(());
    }
    let at = format!("(pod: {:?}, container: {})", pod_ref(pod), c.name);
    if let Some(uid) = sc.run_as_user {
        if uid == 0 {
            return Err(format!("container's runAsUser breaks non-root policy {at}"));
        }
        return Ok(());
    }
    let user = image.map_err(str::to_string)?;
    match user.uid {
        None if !user.username.is_empty() => Err(format!(
            "container has runAsNonRoot and image has non-numeric user ({}), cannot verify user is non-root {at}",
            user.username
        )),
        Some(0) => Err(format!(
            "container has runAsNonRoot and image will run as root {at}"
        )),
        Some(uid) if !(1..=i64::from(i32::MAX)).contains(&uid) => Err(format!(
            "container has runAsNonRoot and image has an invalid user id ({uid}). (Must be 1-({})): must be between 0 and 2147483647, inclusive {at}",
            i32::MAX
        )),
        _ => Ok(()),
    }
}

/// Fields CRI cannot carry on this node, named for the container's
/// CreateContainerConfigError.
///
/// # Errors
/// The message naming the field.
pub fn refuse_unsupported(pod: &Pod, c: &Container) -> Result<(), String> {
    let own = c.security_context.as_ref();
    if own.and_then(|s| s.proc_mount.as_deref()) == Some("Unmasked") {
        return Err(format!(
            "securityContext.procMount Unmasked of container {} is not supported on this node: the runtime is only told to keep its default masked paths",
            c.name
        ));
    }
    if own.is_some_and(|s| s.windows_options.is_some()) {
        return Err(format!(
            "securityContext.windowsOptions of container {} cannot be honoured: this is a Linux node",
            c.name
        ));
    }
    if pod_context(pod).is_some_and(|s| s.windows_options.is_some()) {
        return Err(
            "spec.securityContext.windowsOptions cannot be honoured: this is a Linux node".into(),
        );
    }
    Ok(())
}

/// The pod's supplementary groups: `supplementalGroups` then `fsGroup`, as
/// the kubelet gives every container (and the sandbox).
pub fn supplemental_groups(pod: &Pod) -> Vec<i64> {
    let Some(psc) = pod_context(pod) else {
        return Vec::new();
    };
    let mut groups = psc.supplemental_groups.clone().unwrap_or_default();
    if let Some(g) = psc.fs_group {
        if !groups.contains(&g) {
            groups.push(g);
        }
    }
    groups
}

/// A seccomp profile field as CRI's (upstream `fieldProfile`): Localhost
/// profiles are files under the node's seccomp root; no profile is
/// Unconfined, the kubelet's default without `--seccomp-default`.
pub fn seccomp(profile: Option<&SeccompProfile>, root: &Path) -> v1::SecurityProfile {
    use v1::security_profile::ProfileType;
    let of = |t: ProfileType, r: String| v1::SecurityProfile {
        profile_type: t as i32,
        localhost_ref: r,
    };
    match profile.map(|p| (p.type_.as_str(), p.localhost_profile.as_deref())) {
        Some(("RuntimeDefault", _)) => of(ProfileType::RuntimeDefault, String::new()),
        Some(("Localhost", Some(name))) => of(
            ProfileType::Localhost,
            root.join(name).display().to_string(),
        ),
        _ => of(ProfileType::Unconfined, String::new()),
    }
}

/// The container's AppArmor profile (upstream `getAppArmorProfile`): the
/// fields, else the deprecated annotation; None leaves the runtime's
/// default. The deprecated string form goes along for older runtimes.
fn apparmor(
    pod: &Pod,
    c: &Container,
    sc: &SecurityContext,
) -> Option<(v1::SecurityProfile, String)> {
    use v1::security_profile::ProfileType;
    let profile = sc.app_armor_profile.clone().or_else(|| {
        let key = format!("{APPARMOR_ANNOTATION_PREFIX}{}", c.name);
        let value = pod.metadata.annotations.as_ref()?.get(&key)?;
        annotation_profile(value)
    })?;
    let (t, r, old) = match profile.type_.as_str() {
        "RuntimeDefault" => (
            ProfileType::RuntimeDefault,
            String::new(),
            "runtime/default".to_string(),
        ),
        "Localhost" => {
            let name = profile.localhost_profile.unwrap_or_default();
            (
                ProfileType::Localhost,
                name.clone(),
                format!("localhost/{name}"),
            )
        }
        _ => (
            ProfileType::Unconfined,
            String::new(),
            "unconfined".to_string(),
        ),
    };
    Some((
        v1::SecurityProfile {
            profile_type: t as i32,
            localhost_ref: r,
        },
        old,
    ))
}

/// The deprecated annotation's value as a profile.
pub fn annotation_profile(value: &str) -> Option<AppArmorProfile> {
    let (type_, local) = match value {
        "runtime/default" => ("RuntimeDefault", None),
        "unconfined" => ("Unconfined", None),
        v => ("Localhost", Some(v.strip_prefix("localhost/")?.to_string())),
    };
    Some(AppArmorProfile {
        type_: type_.into(),
        localhost_profile: local,
    })
}

/// Every AppArmor profile the pod asks for: its fields and annotations.
pub fn apparmor_profiles(pod: &Pod) -> Vec<AppArmorProfile> {
    let mut out: Vec<AppArmorProfile> = pod_context(pod)
        .and_then(|s| s.app_armor_profile.clone())
        .into_iter()
        .collect();
    for c in pod.containers().iter().chain(pod.init_containers()) {
        out.extend(
            c.security_context
                .as_ref()
                .and_then(|s| s.app_armor_profile.clone()),
        );
    }
    for (k, v) in pod.metadata.annotations.iter().flatten() {
        if k.starts_with(APPARMOR_ANNOTATION_PREFIX) {
            out.extend(annotation_profile(v));
        }
    }
    out
}

fn selinux(o: Option<&SELinuxOptions>) -> Option<v1::SeLinuxOption> {
    o.map(|o| v1::SeLinuxOption {
        user: o.user.clone().unwrap_or_default(),
        role: o.role.clone().unwrap_or_default(),
        r#type: o.type_.clone().unwrap_or_default(),
        level: o.level.clone().unwrap_or_default(),
    })
}

/// The container's CRI security context (namespace options are the
/// sandbox's, set by the caller). `image` is the image's user, for
/// `runAsUsername` when the image names a user and nothing overrides it.
pub fn container_security(
    pod: &Pod,
    c: &Container,
    image: Option<&ImageUser>,
    node: &NodeSecurity,
) -> v1::LinuxContainerSecurityContext {
    let sc = effective(pod, c);
    let caps = sc.capabilities.clone().unwrap_or_default();
    let run_as_username = match (sc.run_as_user, image) {
        (None, Some(u)) if u.uid.is_none() => u.username.clone(),
        _ => String::new(),
    };
    let (apparmor, apparmor_profile) = match apparmor(pod, c, &sc) {
        Some((p, old)) if node.apparmor => (Some(p), old),
        _ => (None, String::new()),
    };
    v1::LinuxContainerSecurityContext {
        capabilities: Some(v1::Capability {
            add_capabilities: caps.add.unwrap_or_default(),
            drop_capabilities: caps.drop.unwrap_or_default(),
            ..Default::default()
        }),
        privileged: sc.privileged.unwrap_or(false),
        selinux_options: selinux(sc.se_linux_options.as_ref()),
        run_as_user: sc.run_as_user.map(|value| v1::Int64Value { value }),
        run_as_group: sc.run_as_group.map(|value| v1::Int64Value { value }),
        run_as_username,
        readonly_rootfs: sc.read_only_root_filesystem.unwrap_or(false),
        supplemental_groups: supplemental_groups(pod),
        // Unset means allowed, as upstream `AddNoNewPrivileges`.
        no_new_privs: sc.allow_privilege_escalation == Some(false),
        seccomp: Some(seccomp(sc.seccomp_profile.as_ref(), node.seccomp_root)),
        apparmor,
        apparmor_profile,
        // procMount Default: the runtime's default masked and read-only
        // paths (Unmasked is refused by `refuse_unsupported`).
        ..Default::default()
    }
}

/// The sandbox's CRI security context from the pod's (upstream
/// `determinePodSandboxSecurityContext`), namespace options by the caller.
pub fn sandbox_security(pod: &Pod, node: &NodeSecurity) -> v1::LinuxSandboxSecurityContext {
    let psc = pod_context(pod).cloned().unwrap_or_default();
    // The sandbox is privileged when any container is, so that the
    // runtime may set the pod up for it.
    let privileged = pod
        .containers()
        .iter()
        .chain(pod.init_containers())
        .any(|c| {
            c.security_context
                .as_ref()
                .and_then(|s| s.privileged)
                .unwrap_or(false)
        });
    v1::LinuxSandboxSecurityContext {
        selinux_options: selinux(psc.se_linux_options.as_ref()),
        run_as_user: psc.run_as_user.map(|value| v1::Int64Value { value }),
        run_as_group: psc.run_as_group.map(|value| v1::Int64Value { value }),
        supplemental_groups: supplemental_groups(pod),
        privileged,
        seccomp: Some(seccomp(psc.seccomp_profile.as_ref(), node.seccomp_root)),
        ..Default::default()
    }
}

/// A sysctl name with dots (upstream `NormalizeName`): a name written with
/// slashes has its dots and slashes swapped.
pub fn normalize_sysctl(name: &str) -> String {
    match name.find(['.', '/']) {
        Some(i) if name.as_bytes()[i] == b'/' => name
            .chars()
            .map(|ch| match ch {
                '/' => '.',
                '.' => '/',
                ch => ch,
            })
            .collect(),
        _ => name.to_string(),
    }
}

#[cfg(test)]
mod tests;
