//! The node's heartbeat: the Lease `kube-node-lease/<node>` renewed every
//! quarter of its duration (10 s of 40 s), as the kubelet's
//! nodelease controller does. The node lifecycle controller reads its
//! `renewTime` to tell a live node from a dead one, so this loop must keep
//! going whatever else is slow: it has its own task and its own back-off
//! (100 ms doubling to 7 s) while the API is unreachable.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use kube::api::PostParams;
use kube::Api;
use tokio::sync::watch;

use super::{call, Error, Outage, Result, Retry};

pub const NAMESPACE: &str = "kube-node-lease";

/// Conflicts in a row before waiting for the next attempt.
const CONFLICT_RETRIES: usize = 5;

/// Renews one node's Lease.
pub struct Heartbeat {
    api: Api<Lease>,
    node: String,
    duration_seconds: i32,
    /// The Node's uid once known (sender: the node loop); the Lease gets
    /// an owner reference to the Node so it goes when the Node goes.
    node_uid: watch::Receiver<Option<String>>,
    /// The Lease as last read or written.
    lease: Option<Lease>,
}

impl Heartbeat {
    pub fn new(
        client: kube::Client,
        node: &str,
        duration_seconds: u32,
        node_uid: watch::Receiver<Option<String>>,
    ) -> Heartbeat {
        Heartbeat {
            api: Api::namespaced(client, NAMESPACE),
            node: node.to_string(),
            duration_seconds: i32::try_from(duration_seconds.max(1)).unwrap_or(40),
            node_uid,
            lease: None,
        }
    }

    /// How often the Lease is renewed: a quarter of its duration.
    pub fn interval(&self) -> Duration {
        Duration::from_secs_f64(f64::from(self.duration_seconds) / 4.0)
    }

    /// Renew until `stop` turns true.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let mut retry = Retry::new(Duration::from_millis(100), Duration::from_secs(7));
        let mut outage = Outage::new(format!("lease {NAMESPACE}/{}", self.node));
        loop {
            let wait = match self.renew().await {
                Ok(()) => {
                    outage.ok();
                    retry.reset();
                    self.interval()
                }
                Err(e) => {
                    outage.failed(&e);
                    retry.next()
                }
            };
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    /// One renewal: read or create the Lease if we hold none, then write
    /// a fresh `renewTime`; on a conflict read it again and retry.
    ///
    /// # Errors
    /// The API failed or did not answer within the renew interval.
    pub async fn renew(&mut self) -> Result<()> {
        let mut conflicts = 0;
        loop {
            let Some(current) = self.lease.take() else {
                self.lease = Some(self.get_or_create().await?);
                // A Lease just created already carries a fresh renewTime.
                if self.lease.as_ref().is_some_and(|l| self.fresh(l)) {
                    return Ok(());
                }
                continue;
            };
            let next = self.renewed(current);
            match self.replace(&next).await {
                Ok(l) => {
                    self.lease = Some(l);
                    return Ok(());
                }
                // Someone else wrote it (or deleted it): read it again.
                Err(e) if matches!(e.code(), Some(409 | 404)) && conflicts < CONFLICT_RETRIES => {
                    conflicts += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn object(&self) -> String {
        format!("lease {NAMESPACE}/{}", self.node)
    }

    async fn get_or_create(&self) -> Result<Lease> {
        let t = self.interval();
        let object = self.object();
        if let Some(l) = call("reading", &object, t, self.api.get_opt(&self.node)).await? {
            return Ok(l);
        }
        let lease = self.renewed(Lease {
            metadata: ObjectMeta {
                name: Some(self.node.clone()),
                namespace: Some(NAMESPACE.into()),
                ..Default::default()
            },
            spec: None,
        });
        match call(
            "creating",
            &object,
            t,
            self.api.create(&PostParams::default(), &lease),
        )
        .await
        {
            Ok(l) => Ok(l),
            // Created meanwhile (a previous try that timed out): read it.
            Err(e) if e.code() == Some(409) => {
                self.api.get(&self.node).await.map_err(|source| Error::Api {
                    action: "reading",
                    object,
                    source,
                })
            }
            Err(e) => Err(e),
        }
    }

    async fn replace(&self, lease: &Lease) -> Result<Lease> {
        call(
            "renewing",
            &self.object(),
            self.interval(),
            self.api.replace(&self.node, &PostParams::default(), lease),
        )
        .await
    }

    /// Whether `lease` was renewed by us within the last interval.
    fn fresh(&self, lease: &Lease) -> bool {
        let spec = lease.spec.as_ref();
        let ours = spec.and_then(|s| s.holder_identity.as_deref()) == Some(self.node.as_str());
        let recent = spec
            .and_then(|s| s.renew_time.as_ref())
            .and_then(|t| jiff::Timestamp::now().duration_since(t.0).try_into().ok())
            .is_some_and(|age: Duration| age < self.interval());
        ours && recent && !self.needs_owner(lease)
    }

    /// Whether `lease` lacks an owner reference to the Node as it is now
    /// (none yet, or one to a Node that was deleted and re-created).
    fn needs_owner(&self, lease: &Lease) -> bool {
        let uid = self.node_uid.borrow().clone();
        uid.is_some_and(|uid| {
            !lease
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.kind == "Node" && o.uid == uid)
        })
    }

    /// `lease` with our holder, duration, renewTime = now, and the owner
    /// reference to the Node when its uid is known.
    fn renewed(&self, mut lease: Lease) -> Lease {
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = Some(self.node.clone());
        spec.lease_duration_seconds = Some(self.duration_seconds);
        spec.renew_time = Some(MicroTime(jiff::Timestamp::now()));
        let uid = self.node_uid.borrow().clone();
        if let (true, Some(uid)) = (self.needs_owner(&lease), uid) {
            let refs = lease.metadata.owner_references.get_or_insert_with(Vec::new);
            refs.retain(|o| !(o.kind == "Node" && o.name == self.node));
            refs.push(OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: self.node.clone(),
                uid,
                ..Default::default()
            });
        }
        lease
    }
}
