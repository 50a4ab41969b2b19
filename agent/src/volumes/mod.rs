//! The pod's volumes (the kubelet's volume manager and volume plugins):
//! set up before its containers start and refreshed on every pod sync,
//! torn down after its containers are gone.
//!
//! # Layout
//! - [`atomic`]: the `..data` symlink-swap writer of API-data volumes.
//! - [`projection`]: keys, items and modes -> files.
//! - [`objects`]: configMaps and secrets from the API, TTL-cached.
//! - [`token`]: ServiceAccount tokens through TokenRequest, refreshed when due.
//! - [`hostpath`]: hostPath type checks.
//! - [`claim`]: persistentVolumeClaim and ephemeral volumes -> their PV's
//!   directory on this host.
//! - [`localpath`]: local-path directories, created on first use.
//! - [`reclaim`]: removes them when their PV is deleted.
//! - [`mounts`]: tmpfs mounts and their (never wedging) removal.
//! - [`error`]: why a volume failed, in its event's words.
//!
//! On disk a volume lives at `<root>/pods/<uid>/volumes/<plugin>/<name>`
//! with upstream's plugin names (`kubernetes.io~empty-dir`, `~configmap`,
//! `~secret`, `~downward-api`, `~projected`); hostPath volumes are the
//! host's own path, and so are claim volumes (their PV's `local` or
//! `hostPath` directory, which tear-down never touches). emptyDir `medium: Memory`, secret and projected
//! volumes are tmpfs mounts, so their data never reaches the disk.

pub mod atomic;
pub mod claim;
mod error;
pub mod hostpath;
pub mod localpath;
pub mod mounts;
pub mod objects;
pub mod projection;
pub mod reclaim;
pub mod token;

use std::collections::{HashMap, HashSet};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Volume};

use self::atomic::Payload;
use self::objects::{Kind, ObjectSource};
use crate::pod::PodExt;
use crate::runtime::resources::{self, Which};

pub use self::error::Error;

/// How soon a pod waiting for a volume, or a container for an object its
/// env names, tries again (the object may appear at any moment).
pub const RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// How often a pod waiting for its claims to be bound looks again (the
/// kubelet's WaitForAttachAndMount polls at 300 ms).
pub const CLAIM_POLL: Duration = Duration::from_millis(300);

const EMPTY_DIR: &str = "kubernetes.io~empty-dir";
const CONFIG_MAP: &str = "kubernetes.io~configmap";
const SECRET: &str = "kubernetes.io~secret";
const DOWNWARD_API: &str = "kubernetes.io~downward-api";
const PROJECTED: &str = "kubernetes.io~projected";

/// Pod directories younger than this are never swept as orphans.
pub const ORPHAN_MIN_AGE: Duration = Duration::from_secs(60);

/// A failing volume's event is repeated at most this often.
const REPORT_EVERY: Duration = Duration::from_secs(60);

/// Where one volume is on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostVolume {
    pub path: PathBuf,
    /// API-data volumes are always mounted read-only, as upstream.
    pub read_only: bool,
}

/// A pod's volumes by name.
pub type PodVolumes = HashMap<String, HostVolume>;

/// A volume that could not be set up (or refreshed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeError {
    pub volume: String,
    pub message: String,
    /// The volume never came up: containers must not start yet. Otherwise
    /// a refresh failed and the last good content stays.
    pub blocking: bool,
    /// New or not reported for a while: worth an event.
    pub report: bool,
    /// Waiting for its claim to be bound, which the controllers do within
    /// moments: polled at [`CLAIM_POLL`].
    pub awaiting_binding: bool,
}

impl std::fmt::Display for VolumeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Upstream's FailedMount event message.
        write!(
            f,
            "MountVolume.SetUp failed for volume {:?} : {}",
            self.volume, self.message
        )
    }
}

/// The outcome of setting up a pod's volumes.
#[derive(Debug, Default)]
pub struct Setup {
    pub volumes: PodVolumes,
    pub errors: Vec<VolumeError>,
}

impl Setup {
    /// Some volume never came up: the pod's containers wait.
    pub fn blocked(&self) -> bool {
        self.errors.iter().any(|e| e.blocking)
    }

    /// When a blocked pod tries again: [`CLAIM_POLL`] while only claims
    /// being bound hold it, else [`RETRY`].
    pub fn retry_after(&self) -> Duration {
        let blocking = self.errors.iter().filter(|e| e.blocking);
        if blocking.clone().next().is_some() && blocking.into_iter().all(|e| e.awaiting_binding) {
            CLAIM_POLL
        } else {
            RETRY
        }
    }
}

/// What tearing a pod's volumes down had to do.
#[derive(Debug, Default)]
pub struct Teardown {
    /// Busy mounts detached lazily (MNT_DETACH).
    pub detached: Vec<PathBuf>,
    /// Mounts that could not be removed at all; the directory stays for
    /// the orphan sweep to retry.
    pub failed: Option<Error>,
}

/// One volume's set-up, decided (with API reads) before the blocking work.
enum Work {
    EmptyDir {
        tmpfs: Option<Option<u64>>,
        gid: Option<u32>,
    },
    HostPath {
        type_: String,
    },
    Files {
        tmpfs: bool,
        payload: Payload,
        gid: Option<u32>,
    },
    /// A claim's PV directory.
    Claim {
        source: claim::Source,
        gid: Option<u32>,
        policy: Option<String>,
    },
    Fail(Error),
}

pub struct VolumeManager {
    /// `<root>/pods`.
    pods_dir: PathBuf,
    /// None: no API connection; configMap and secret volumes cannot be read.
    objects: Option<Arc<ObjectSource>>,
    /// None: no API connection; serviceAccountToken projections fail.
    tokens: Option<token::TokenManager>,
    /// None: no API connection; claim volumes cannot be resolved.
    claims: Option<Arc<claim::ClaimSource>>,
    /// Claim volumes resolved so far, by `(uid, volume)`: for the
    /// synchronous [`VolumeManager::paths`] and to keep a running pod's
    /// volume when a later read fails.
    resolved: Mutex<HashMap<(String, String), HostVolume>>,
    /// Last reported error per `(uid, volume)`, to pace events.
    reported: Mutex<HashMap<(String, String), (String, Instant)>>,
}

impl VolumeManager {
    pub fn new(root_dir: &Path, objects: Option<Arc<ObjectSource>>) -> VolumeManager {
        VolumeManager {
            pods_dir: root_dir.join("pods"),
            objects,
            tokens: None,
            claims: None,
            resolved: Mutex::new(HashMap::new()),
            reported: Mutex::new(HashMap::new()),
        }
    }

    /// Where serviceAccountToken projections get their tokens.
    pub fn with_tokens(mut self, tokens: Option<token::TokenManager>) -> VolumeManager {
        self.tokens = tokens;
        self
    }

    /// Where claim volumes are resolved.
    pub fn with_claims(mut self, claims: Option<Arc<claim::ClaimSource>>) -> VolumeManager {
        self.claims = claims;
        self
    }

    /// The API object reader, when the agent has an API connection.
    pub fn objects(&self) -> Option<&ObjectSource> {
        self.objects.as_deref()
    }

    /// `<root>/pods/<uid>/volumes`.
    pub fn volumes_dir(&self, uid: &str) -> PathBuf {
        self.pods_dir.join(uid).join("volumes")
    }

    /// Where each of the pod's volumes is (set up or not).
    pub fn paths(&self, pod: &Pod) -> PodVolumes {
        volumes(pod)
            .iter()
            .filter_map(|v| Some((v.name.clone(), self.host_volume(pod.uid(), v)?)))
            .collect()
    }

    fn host_volume(&self, uid: &str, v: &Volume) -> Option<HostVolume> {
        let under = |plugin: &str, read_only| HostVolume {
            path: self.volumes_dir(uid).join(plugin).join(&v.name),
            read_only,
        };
        if v.empty_dir.is_some() {
            Some(under(EMPTY_DIR, false))
        } else if let Some(h) = &v.host_path {
            Some(HostVolume {
                path: PathBuf::from(&h.path),
                read_only: false,
            })
        } else if v.config_map.is_some() {
            Some(under(CONFIG_MAP, true))
        } else if v.secret.is_some() {
            Some(under(SECRET, true))
        } else if v.downward_api.is_some() {
            Some(under(DOWNWARD_API, true))
        } else if v.projected.is_some() {
            Some(under(PROJECTED, true))
        } else if v.persistent_volume_claim.is_some() || v.ephemeral.is_some() {
            self.resolved
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&(uid.to_string(), v.name.clone()))
                .cloned()
        } else {
            None
        }
    }

    /// Set up (or refresh) every volume of the pod. Idempotent: files are
    /// rewritten only when their content changed, mounts made only once.
    pub async fn setup(&self, pod: &Pod) -> Setup {
        let uid = pod.uid().to_string();
        let mut planned = Vec::new();
        let claims: HashSet<String> = volumes(pod)
            .iter()
            .filter(|v| v.persistent_volume_claim.is_some() || v.ephemeral.is_some())
            .map(|v| v.name.clone())
            .collect();
        for v in volumes(pod) {
            if v.persistent_volume_claim.is_some() || v.ephemeral.is_some() {
                let known = self.host_volume(&uid, v);
                let (hv, work) = match self.plan_claim(pod, v, known.is_none()).await {
                    Ok((hv, work)) => (Some(hv), work),
                    Err(e) => (known.clone(), Work::Fail(e)),
                };
                planned.push((v.name.clone(), hv, work, known.is_some()));
                continue;
            }
            let Some(hv) = self.host_volume(&uid, v) else {
                planned.push((v.name.clone(), None, Work::Fail(Error::Unsupported), false));
                continue;
            };
            let work = self.plan(pod, v).await;
            planned.push((v.name.clone(), Some(hv), work, false));
        }
        let done = tokio::task::spawn_blocking(move || {
            planned
                .into_iter()
                .map(|(name, hv, work, known)| {
                    // A claim volume once set up stays usable by the
                    // running pod when a later read fails.
                    let populated =
                        known || hv.as_ref().is_some_and(|h| atomic::is_populated(&h.path));
                    let r = match &hv {
                        Some(h) => execute(&h.path, work),
                        None => match work {
                            Work::Fail(m) => Err(m),
                            _ => Ok(()),
                        },
                    };
                    (name, hv, populated, r)
                })
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();

        let mut out = Setup::default();
        let mut reported = self.reported.lock().unwrap_or_else(|e| e.into_inner());
        for (name, hv, populated, r) in done {
            let key = (uid.clone(), name.clone());
            let set_up = r.is_ok();
            match r {
                Ok(()) => {
                    reported.remove(&key);
                }
                Err(e) => {
                    let awaiting_binding = matches!(e, Error::ClaimNotBound { .. });
                    let message = e.to_string();
                    let now = Instant::now();
                    let report = match reported.get(&key) {
                        Some((m, at)) => *m != message || now.duration_since(*at) >= REPORT_EVERY,
                        None => true,
                    };
                    if report {
                        reported.insert(key, (message.clone(), now));
                    }
                    out.errors.push(VolumeError {
                        volume: name.clone(),
                        message,
                        // A refresh failure keeps the last good files.
                        blocking: !populated,
                        report,
                        awaiting_binding,
                    });
                }
            }
            if let Some(hv) = hv {
                if set_up && claims.contains(&name) {
                    self.resolved
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert((uid.clone(), name.clone()), hv.clone());
                }
                out.volumes.insert(name, hv);
            }
        }
        out
    }

    /// Decide a volume's set-up, reading the API objects it projects.
    async fn plan(&self, pod: &Pod, v: &Volume) -> Work {
        let gid = fs_group(pod);
        if let Some(e) = &v.empty_dir {
            let memory = e.medium.as_deref() == Some("Memory");
            let size = e
                .size_limit
                .as_ref()
                .and_then(|q| resources::parse_bytes(&q.0))
                .filter(|s| *s > 0)
                .map(|s| s as u64)
                .or_else(|| pod_memory_limit(pod));
            return Work::EmptyDir {
                tmpfs: memory.then_some(size),
                gid,
            };
        }
        if let Some(h) = &v.host_path {
            return Work::HostPath {
                type_: h.type_.clone().unwrap_or_default(),
            };
        }
        let result = if let Some(c) = &v.config_map {
            let optional = c.optional.unwrap_or(false);
            self.object(pod, Kind::ConfigMap, &c.name, optional)
                .await
                .and_then(|d| {
                    projection::keys(
                        Kind::ConfigMap,
                        d.as_deref(),
                        c.items.as_deref(),
                        c.default_mode,
                        optional,
                    )
                })
                .map(|p| (false, p))
        } else if let Some(s) = &v.secret {
            let optional = s.optional.unwrap_or(false);
            let name = s.secret_name.clone().unwrap_or_default();
            self.object(pod, Kind::Secret, &name, optional)
                .await
                .and_then(|d| {
                    projection::keys(
                        Kind::Secret,
                        d.as_deref(),
                        s.items.as_deref(),
                        s.default_mode,
                        optional,
                    )
                })
                .map(|p| (true, p))
        } else if let Some(d) = &v.downward_api {
            projection::downward(pod, d.items.as_deref().unwrap_or_default(), d.default_mode)
                .map(|p| (false, p))
        } else if let Some(p) = &v.projected {
            self.projected(pod, p).await.map(|p| (true, p))
        } else {
            Err(Error::Unsupported)
        };
        match result {
            Ok((tmpfs, mut payload)) => {
                if gid.is_some() {
                    // The group may read every file, as upstream's
                    // SetVolumeOwnership makes read-only volumes.
                    for f in payload.values_mut() {
                        f.mode |= 0o440;
                    }
                }
                Work::Files {
                    tmpfs,
                    payload,
                    gid,
                }
            }
            Err(m) => Work::Fail(m),
        }
    }

    /// Resolve a claim volume to its PV's directory on this host. The
    /// fsGroup is applied on the pod's first set-up only, as upstream's
    /// mount does: later syncs must not walk the whole volume again.
    async fn plan_claim(
        &self,
        pod: &Pod,
        v: &Volume,
        first: bool,
    ) -> Result<(HostVolume, Work), Error> {
        let Some(claim) = kube_util::storage::pod_claims(pod)
            .into_iter()
            .find(|c| c.volume == v.name)
        else {
            return Err(Error::Unsupported);
        };
        let Some(src) = &self.claims else {
            return Err(Error::NoApi {
                noun: "persistentvolumeclaim",
                name: claim.claim,
            });
        };
        let r = src.resolve(pod, &claim).await?;
        let policy = pod
            .spec
            .as_ref()
            .and_then(|s| s.security_context.as_ref())
            .and_then(|c| c.fs_group_change_policy.clone());
        Ok((
            HostVolume {
                path: r.path,
                read_only: claim.read_only,
            },
            Work::Claim {
                source: r.source,
                gid: fs_group(pod).filter(|_| first),
                policy,
            },
        ))
    }

    /// A projected volume: every source into one payload.
    async fn projected(
        &self,
        pod: &Pod,
        p: &k8s_openapi::api::core::v1::ProjectedVolumeSource,
    ) -> Result<Payload, Error> {
        let mut out = Payload::new();
        for s in p.sources.iter().flatten() {
            let part = if let Some(c) = &s.config_map {
                let optional = c.optional.unwrap_or(false);
                let d = self.object(pod, Kind::ConfigMap, &c.name, optional).await?;
                projection::keys(
                    Kind::ConfigMap,
                    d.as_deref(),
                    c.items.as_deref(),
                    p.default_mode,
                    optional,
                )?
            } else if let Some(c) = &s.secret {
                let optional = c.optional.unwrap_or(false);
                let d = self.object(pod, Kind::Secret, &c.name, optional).await?;
                projection::keys(
                    Kind::Secret,
                    d.as_deref(),
                    c.items.as_deref(),
                    p.default_mode,
                    optional,
                )?
            } else if let Some(d) = &s.downward_api {
                projection::downward(pod, d.items.as_deref().unwrap_or_default(), p.default_mode)?
            } else if let Some(t) = &s.service_account_token {
                // Every sync asks; the manager answers from its cache until
                // the token is due, so a refresh lands here unprompted.
                let tokens = self.tokens.as_ref().ok_or(token::Error::NoApi)?;
                let data = tokens.token(pod, t).await?.into_bytes();
                // With an fsGroup the token is 0600 and the group gets read
                // below (0640), as upstream: not world-readable. (Upstream
                // also makes it 0600 owned by a shared runAsUser; without
                // per-file owners here it keeps the defaultMode then.)
                let mode = if fs_group(pod).is_some() {
                    0o600
                } else {
                    (p.default_mode.unwrap_or(projection::DEFAULT_MODE) as u32) & 0o7777
                };
                Payload::from([(t.path.clone(), atomic::FileProjection { data, mode })])
            } else {
                Payload::new()
            };
            out.extend(part);
        }
        Ok(out)
    }

    /// An object's data; None when it is missing and `optional`.
    async fn object(
        &self,
        pod: &Pod,
        kind: Kind,
        name: &str,
        optional: bool,
    ) -> Result<Option<Arc<objects::Data>>, Error> {
        let Some(src) = &self.objects else {
            return Err(Error::NoApi {
                noun: kind.noun(),
                name: name.to_string(),
            });
        };
        match src.get(kind, pod.namespace(), name).await {
            Ok(d) => Ok(Some(d)),
            Err(e) if e.is_not_found() && optional => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Unmount and remove everything under the pod's volumes directory.
    /// Never waits on a busy mount for long: it is detached lazily instead.
    pub async fn teardown(&self, uid: &str) -> Teardown {
        self.reported
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(u, _), _| u != uid);
        if let Some(t) = &self.tokens {
            t.forget_pod(uid);
        }
        // Claim directories are the PV's, not under the pod's: only the
        // record of them goes.
        self.resolved
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(u, _), _| u != uid);
        let dir = self.volumes_dir(uid);
        tokio::task::spawn_blocking(move || remove_volumes_dir(&dir))
            .await
            .unwrap_or_default()
    }

    /// Remove the directories (and mounts) of pods that are not in `live`:
    /// left by a crash or a failed teardown. Runs in the background.
    ///
    /// # Caveats
    /// A directory changed in the last [`ORPHAN_MIN_AGE`] is left alone: it
    /// may belong to a pod whose worker started after `live` was taken.
    pub fn sweep_orphans(&self, live: HashSet<String>) {
        self.sweep_orphans_older_than(live, ORPHAN_MIN_AGE);
    }

    fn sweep_orphans_older_than(&self, live: HashSet<String>, min_age: Duration) {
        let pods_dir = self.pods_dir.clone();
        tokio::task::spawn_blocking(move || {
            for e in fs::read_dir(&pods_dir).into_iter().flatten().flatten() {
                let uid = e.file_name().to_string_lossy().into_owned();
                let fresh = e
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age < min_age);
                if live.contains(&uid) || fresh {
                    continue;
                }
                let t = remove_volumes_dir(&e.path().join("volumes"));
                if let Some(f) = t.failed {
                    tracing::warn!(uid, "cannot remove orphaned pod directory: {f}");
                    continue;
                }
                if !t.detached.is_empty() {
                    tracing::warn!(uid, mounts = ?t.detached, "orphaned pod had busy mounts, detached them");
                }
                match fs::remove_dir_all(e.path()) {
                    Ok(()) => tracing::info!(uid, "removed orphaned pod directory"),
                    Err(err) => tracing::warn!(uid, "cannot remove orphaned pod directory: {err}"),
                }
            }
        });
    }
}

/// Blocking: unmount everything under `dir`, then remove it (only when no
/// mount is left, so that nothing mounted is ever deleted through).
fn remove_volumes_dir(dir: &Path) -> Teardown {
    let mut t = Teardown::default();
    match mounts::unmount_all(dir) {
        Ok(d) => t.detached = d,
        Err(e) => {
            t.failed = Some(e);
            return t;
        }
    }
    if !mounts::mounts_under(dir).is_empty() {
        t.failed = Some(Error::MountsRemain(dir.to_path_buf()));
        return t;
    }
    match fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => t.failed = Some(Error::io("removing", dir)(e)),
    }
    t
}

/// Blocking: carry out one volume's set-up at `path`.
fn execute(path: &Path, work: Work) -> Result<(), Error> {
    let mkdir = |mode: u32| -> Result<(), Error> {
        if !path.is_dir() {
            fs::create_dir_all(path).map_err(Error::io("creating", path))?;
            fs::set_permissions(path, fs::Permissions::from_mode(mode))
                .map_err(Error::io("chmod", path))?;
        }
        Ok(())
    };
    match work {
        Work::Fail(m) => Err(m),
        Work::HostPath { type_ } => hostpath::check(path, &type_),
        Work::Claim {
            source,
            gid,
            policy,
        } => match source {
            claim::Source::HostPath { type_ } => hostpath::check(path, &type_),
            claim::Source::Local => match fs::symlink_metadata(path) {
                Ok(_) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    Err(Error::LocalMissing(path.to_path_buf()))
                }
                Err(e) => Err(Error::io("stat", path)(e)),
            },
            claim::Source::LocalPath { root } => {
                localpath::ensure(path, &root, gid, policy.as_deref())
            }
        },
        Work::EmptyDir { tmpfs, gid } => {
            // Ownership and mode are set once: a container may change them.
            let fresh = !path.is_dir() || (tmpfs.is_some() && !mounts::is_mount_point(path));
            // World-writable as upstream: the containers may run as anyone.
            mkdir(0o777)?;
            if let Some(size) = tmpfs {
                mounts::ensure_tmpfs(path, size)?;
            }
            if !fresh {
                return Ok(());
            }
            let mut mode = 0o777;
            if gid.is_some() {
                // fsGroup: the group owns it, and new files inherit it.
                std::os::unix::fs::chown(path, None, gid).map_err(Error::io("chown", path))?;
                mode |= 0o2000;
            }
            fs::set_permissions(path, fs::Permissions::from_mode(mode))
                .map_err(Error::io("chmod", path))
        }
        Work::Files {
            tmpfs,
            payload,
            gid,
        } => {
            mkdir(0o755)?;
            if tmpfs {
                mounts::ensure_tmpfs(path, None)?;
            }
            Ok(atomic::write(path, &payload, gid).map(drop)?)
        }
    }
}

/// The pod's fsGroup: the group its volumes' files belong to.
///
/// `fsGroupChangePolicy` needs no walk here: an emptyDir gets its group
/// (and setgid, so new files inherit it) once, when it is created empty,
/// which is all that either policy changes in an empty volume; API-data
/// volumes are written with the group every time. hostPath volumes are
/// never chowned, as upstream.
fn fs_group(pod: &Pod) -> Option<u32> {
    pod.spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref())
        .and_then(|c| c.fs_group)
        .and_then(|g| u32::try_from(g).ok())
}

fn volumes(pod: &Pod) -> &[Volume] {
    pod.spec
        .as_ref()
        .and_then(|s| s.volumes.as_deref())
        .unwrap_or_default()
}

/// The pod's memory limit when every container has one: the default size
/// of its memory-backed emptyDirs (upstream sizes them by the pod's limit).
fn pod_memory_limit(pod: &Pod) -> Option<u64> {
    let cs = pod.containers();
    if cs.is_empty() {
        return None;
    }
    cs.iter()
        .map(|c| resources::get(c, Which::Limit, "memory").and_then(|q| resources::parse_bytes(&q)))
        .try_fold(0u64, |acc, l| Some(acc + l? as u64))
        .filter(|s| *s > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn empty_dir_host_path_and_downward_then_teardown() {
        let t = tempfile::tempdir().unwrap();
        let host = t.path().join("host-dir");
        let pod: Pod = serde_saphyr::from_str(&format!(
            "metadata: {{name: p, namespace: ns, uid: u1, labels: {{app: a}}}}\nspec:\n  containers: [{{name: c, image: i}}]\n  volumes:\n  - {{name: scratch, emptyDir: {{}}}}\n  - {{name: h, hostPath: {{path: {}, type: DirectoryOrCreate}}}}\n  - name: info\n    downwardAPI: {{items: [{{path: labels, fieldRef: {{fieldPath: metadata.labels}}}}]}}\n  - {{name: cm, configMap: {{name: x}}}}\n  - {{name: nfs, nfs: {{server: s, path: /}}}}\n",
            host.display()
        ))
        .unwrap();
        let vm = VolumeManager::new(t.path(), None);
        let s = vm.setup(&pod).await;
        let scratch = &s.volumes["scratch"];
        assert!(scratch
            .path
            .ends_with("pods/u1/volumes/kubernetes.io~empty-dir/scratch"));
        assert!(scratch.path.is_dir() && !scratch.read_only);
        assert!(host.is_dir());
        assert_eq!(
            fs::read_to_string(s.volumes["info"].path.join("labels")).unwrap(),
            "app=\"a\""
        );
        assert!(s.volumes["info"].read_only);
        // No API connection: the configMap volume blocks; nfs is unknown.
        assert!(s.blocked());
        let names: Vec<_> = s.errors.iter().map(|e| e.volume.as_str()).collect();
        assert_eq!(names, ["cm", "nfs"]);
        assert!(s.errors[0]
            .to_string()
            .starts_with("MountVolume.SetUp failed for volume \"cm\" : configmap \"x\""));
        assert!(s.errors.iter().all(|e| e.report));
        // The same failure again is not re-reported at once.
        assert!(vm.setup(&pod).await.errors.iter().all(|e| !e.report));

        let td = vm.teardown("u1").await;
        assert!(td.failed.is_none() && td.detached.is_empty());
        assert!(!vm.volumes_dir("u1").exists());
        assert!(host.is_dir(), "a hostPath is never removed");
    }

    #[tokio::test]
    async fn claim_volumes_wait_for_the_api() {
        let t = tempfile::tempdir().unwrap();
        let pod: Pod = serde_saphyr::from_str(
            "metadata: {name: p, namespace: ns, uid: u1}\nspec:\n  containers: [{name: c, image: i}]\n  volumes:\n  - {name: data, persistentVolumeClaim: {claimName: c1}}\n  - {name: e, ephemeral: {volumeClaimTemplate: {spec: {}}}}\n",
        )
        .unwrap();
        let vm = VolumeManager::new(t.path(), None);
        let s = vm.setup(&pod).await;
        assert!(s.blocked());
        assert!(s.volumes.is_empty() && vm.paths(&pod).is_empty());
        let msgs: Vec<_> = s.errors.iter().map(|e| e.to_string()).collect();
        assert_eq!(msgs, [
            "MountVolume.SetUp failed for volume \"data\" : persistentvolumeclaim \"c1\" cannot be read: this node has no API server connection",
            "MountVolume.SetUp failed for volume \"e\" : persistentvolumeclaim \"p-e\" cannot be read: this node has no API server connection",
        ]);
    }

    #[tokio::test]
    async fn orphans_are_swept() {
        let t = tempfile::tempdir().unwrap();
        let vm = VolumeManager::new(t.path(), None);
        for uid in ["live", "gone"] {
            fs::create_dir_all(vm.volumes_dir(uid).join(EMPTY_DIR).join("x")).unwrap();
        }
        vm.sweep_orphans(HashSet::new());
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(t.path().join("pods/gone").exists(), "fresh dirs stay");
        vm.sweep_orphans_older_than(HashSet::from(["live".to_string()]), Duration::ZERO);
        for _ in 0..100 {
            if !t.path().join("pods/gone").exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!t.path().join("pods/gone").exists());
        assert!(t.path().join("pods/live").exists());
    }
}
