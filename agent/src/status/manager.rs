//! The status manager: writes the pods' computed statuses to the API.
//!
//! Workers only update the in-memory [`StatusStore`]; this task patches
//! `pods/status` for the pods whose status differs from what the API was
//! last told, so bursts coalesce (a pod that changes three times while a
//! patch is in flight is patched once more, not three times) and the API
//! sees at most `QPS` writes per second from this node. Patches that fail
//! (the API is down) stay pending and are retried, so everything that
//! happened during an outage is reported once it ends.
//!
//! It also finishes graceful deletion: when a worker has stopped a pod the
//! API is deleting, the manager deletes the object (grace 0, uid
//! precondition), as the kubelet does.

use std::collections::{HashMap, HashSet};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::Api;
use kube_util::podstatus::is_terminal;
use tokio::sync::{mpsc, watch};

use crate::pod::PodExt;
use crate::source::api::MirrorPods;
use crate::status::StatusStore;

/// Status writes per second from this node, and the burst allowed
/// (a 100-pod node starting at once is absorbed by the burst, then paced).
const QPS: u32 = 20;
const BURST: u32 = 50;
/// Patches in flight at once.
const IN_FLIGHT: usize = 4;
/// Everything is compared again this often, so nothing stays unreported
/// if a wake-up is lost or a patch failed.
const RESYNC: Duration = Duration::from_secs(10);

/// What the status manager needs from the rest of the agent.
pub struct StatusManager {
    api: kube::Client,
    statuses: Arc<StatusStore>,
    /// Mirror pods in the API, from the API source: static pods' statuses
    /// go to their mirror.
    mirrors: watch::Receiver<MirrorPods>,
    /// Pods a worker finished stopping because the API is deleting them.
    deleted: mpsc::UnboundedReceiver<Pod>,
    limiter: DefaultDirectRateLimiter,
    /// The status the API was last sent, by pod uid, with the uid of the
    /// object it went to (a static pod's mirror is replaced when a user
    /// deletes it, and the new one needs the status too).
    sent: HashMap<String, (String, PodStatus)>,
}

/// Where a pod's status is written.
struct Target {
    namespace: String,
    name: String,
    uid: String,
}

impl StatusManager {
    pub fn new(
        api: kube::Client,
        statuses: Arc<StatusStore>,
        mirrors: watch::Receiver<MirrorPods>,
        deleted: mpsc::UnboundedReceiver<Pod>,
    ) -> Self {
        let quota = Quota::per_second(NonZeroU32::new(QPS).unwrap_or(NonZeroU32::MIN))
            .allow_burst(NonZeroU32::new(BURST).unwrap_or(NonZeroU32::MIN));
        StatusManager {
            api,
            statuses,
            mirrors,
            deleted,
            limiter: RateLimiter::direct(quota),
            sent: HashMap::new(),
        }
    }

    /// Run until `deleted` closes (the pod manager stopped).
    pub async fn run(mut self) {
        let mut resync = tokio::time::interval(RESYNC);
        let mut deleting: HashMap<String, Pod> = HashMap::new();
        loop {
            let dirty: HashSet<String> = tokio::select! {
                d = self.statuses.take_dirty() => d,
                _ = resync.tick() => {
                    self.sent.retain(|uid, _| self.statuses.get(uid).is_some());
                    self.statuses.uids().into_iter().collect()
                }
                pod = self.deleted.recv() => {
                    let Some(pod) = pod else { return };
                    deleting.insert(pod.uid().to_string(), pod);
                    HashSet::new()
                }
            };
            self.patch_all(dirty).await;
            self.delete_all(&mut deleting).await;
        }
    }

    async fn patch_all(&mut self, dirty: HashSet<String>) {
        let work: Vec<(String, Target, PodStatus)> = dirty
            .into_iter()
            .filter_map(|uid| self.pending(&uid).map(|(t, s)| (uid, t, s)))
            .collect();
        let this = &*self;
        let results: Vec<(String, String, PodStatus, bool)> = futures::stream::iter(work)
            .map(|(uid, t, status)| async move {
                this.limiter.until_ready().await;
                let ok = this.patch(&t, &status).await;
                (uid, t.uid, status, ok)
            })
            .buffer_unordered(IN_FLIGHT)
            .collect()
            .await;
        for (uid, target, status, ok) in results {
            if ok {
                self.sent.insert(uid, (target, status));
            }
        }
    }

    /// The patch `uid` needs, if any.
    fn pending(&self, uid: &str) -> Option<(Target, PodStatus)> {
        let (pod, status) = self.statuses.get(uid)?;
        let target = if pod.is_static() {
            let mirror = self.mirrors.borrow().get(&pod.key()).cloned()?;
            Target {
                namespace: pod.namespace().to_string(),
                name: pod.name().to_string(),
                uid: mirror.uid().to_string(),
            }
        } else {
            Target {
                namespace: pod.namespace().to_string(),
                name: pod.name().to_string(),
                uid: uid.to_string(),
            }
        };
        let known = match self.sent.get(uid) {
            Some((to, s)) if *to == target.uid => Some(s),
            Some(_) => None,
            None => pod.status.as_ref(),
        };
        if known == Some(&status) {
            return None;
        }
        // A pod the API records as finished never goes back (the kubelet's
        // rule): a restarted agent that lost the containers must not turn a
        // Succeeded pod into Pending.
        if known.is_some_and(is_terminal) && !is_terminal(&status) {
            return None;
        }
        Some((target, status))
    }

    async fn patch(&self, t: &Target, status: &PodStatus) -> bool {
        let api: Api<Pod> = Api::namespaced(self.api.clone(), &t.namespace);
        // The uid makes the patch fail on a different pod of the same name.
        let body = serde_json::json!({
            "metadata": { "uid": t.uid },
            "status": status,
        });
        match api
            .patch_status(&t.name, &PatchParams::default(), &Patch::Merge(&body))
            .await
        {
            Ok(_) => true,
            Err(kube::Error::Api(e)) if e.code == 404 => {
                tracing::debug!(pod = %format!("{}/{}", t.namespace, t.name), "pod gone before its status was written");
                true
            }
            Err(e) => {
                // Left unsent: the next resync tries again.
                tracing::warn!(pod = %format!("{}/{}", t.namespace, t.name), "writing pod status failed, will retry: {e}");
                false
            }
        }
    }

    async fn delete_all(&mut self, deleting: &mut HashMap<String, Pod>) {
        let mut done = Vec::new();
        for (uid, pod) in deleting.iter() {
            self.limiter.until_ready().await;
            let api: Api<Pod> = Api::namespaced(self.api.clone(), pod.namespace());
            let dp = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: Some(uid.clone()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match api.delete(pod.name(), &dp).await {
                Ok(_) => done.push(uid.clone()),
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {
                    done.push(uid.clone())
                }
                Err(e) => {
                    tracing::warn!(pod = %pod.key(), "deleting the stopped pod failed, will retry: {e}")
                }
            }
        }
        for uid in done {
            deleting.remove(&uid);
            self.sent.remove(&uid);
        }
    }
}
