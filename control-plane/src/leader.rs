//! Leader election through `coordination.k8s.io/v1` Leases, as client-go's
//! `leaderelection` with its `LeaseLock`: with several servers, one
//! scheduler and one controller manager run at a time.
//!
//! A candidate takes the Lease when nobody holds it, or when the record
//! it last saw has not changed for a whole lease duration (measured on
//! its own clock, so the servers' clocks need not agree). The leader
//! renews every retry period; if it cannot renew within the renew
//! deadline it stops its work and becomes a candidate again. On shutdown
//! it gives the Lease up, so another server takes over at once.

use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, PostParams};
use kube_util::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::watch;

/// Upstream's defaults (kube-scheduler and kube-controller-manager).
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub lease: Duration,
    pub renew_deadline: Duration,
    pub retry: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            lease: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry: Duration::from_secs(2),
        }
    }
}

/// Where the Lease lives: upstream's names for both components.
pub const NAMESPACE: &str = "kube-system";

/// What this candidate knows of the Lease.
struct Observed {
    /// The holder and renew time last read, and when they last changed.
    record: Option<(String, Option<String>)>,
    since: Instant,
}

/// A candidate for the Lease `name`.
pub struct Elector {
    leases: Api<Lease>,
    name: String,
    identity: String,
    timing: Timing,
    recorder: Recorder,
    observed: Observed,
}

fn now() -> MicroTime {
    MicroTime(jiff::Timestamp::now())
}

impl Elector {
    pub fn new(client: kube::Client, name: &str, identity: String, timing: Timing) -> Self {
        Elector {
            leases: Api::namespaced(client.clone(), NAMESPACE),
            name: name.to_string(),
            recorder: Recorder::new(client, Reporter::new(name)),
            identity,
            timing,
            observed: Observed {
                record: None,
                since: Instant::now(),
            },
        }
    }

    /// Take or renew the Lease; true when this candidate holds it now.
    async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let seconds = i32::try_from(self.timing.lease.as_secs()).unwrap_or(i32::MAX);
        let Some(mut lease) = self.leases.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: kube::api::ObjectMeta {
                    name: Some(self.name.clone()),
                    namespace: Some(NAMESPACE.into()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(seconds),
                    acquire_time: Some(now()),
                    renew_time: Some(now()),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.leases.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    self.became_leader(&created);
                    Ok(true)
                }
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.take().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let record = (
            holder.clone(),
            spec.renew_time.as_ref().map(|t| t.0.to_string()),
        );
        if self.observed.record.as_ref() != Some(&record) {
            self.observed = Observed {
                record: Some(record),
                since: Instant::now(),
            };
        }
        let mine = holder == self.identity;
        let expired = self.observed.since.elapsed() > self.timing.lease;
        if !mine && !holder.is_empty() && !expired {
            return Ok(false);
        }
        let mut next = spec;
        next.renew_time = Some(now());
        next.lease_duration_seconds = Some(seconds);
        if !mine {
            next.holder_identity = Some(self.identity.clone());
            next.acquire_time = Some(now());
            next.lease_transitions = Some(next.lease_transitions.unwrap_or(0) + 1);
        }
        lease.spec = Some(next);
        match self
            .leases
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(written) => {
                if !mine {
                    self.became_leader(&written);
                }
                Ok(true)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn became_leader(&self, lease: &Lease) {
        tracing::info!(lease = self.name, identity = self.identity, "became leader");
        self.recorder.record(
            kube::Resource::object_ref(lease, &()),
            Event {
                type_: EventType::Normal,
                reason: "LeaderElection".into(),
                note: format!("{} became leader", self.identity),
                action: "LeaderElection".into(),
            },
        );
    }

    /// Give the Lease up (holder cleared) if this candidate holds it.
    async fn release(&self) {
        let Ok(Some(mut lease)) = self.leases.get_opt(&self.name).await else {
            return;
        };
        let Some(spec) = lease.spec.as_mut() else {
            return;
        };
        if spec.holder_identity.as_deref() != Some(&self.identity) {
            return;
        }
        spec.holder_identity = None;
        spec.renew_time = Some(now());
        spec.lease_duration_seconds = Some(1);
        let _ = self
            .leases
            .replace(&self.name, &PostParams::default(), &lease)
            .await;
    }

    /// Run `work` while this candidate leads, until `stop` says so: wait
    /// for the Lease, run `work(lost)` while renewing, and go back to
    /// waiting when a renewal misses its deadline (`lost` then turns true
    /// and `work` is awaited). Gives the Lease up on the way out.
    pub async fn run<W, Fut>(mut self, mut stop: watch::Receiver<bool>, work: W)
    where
        W: Fn(watch::Receiver<bool>) -> Fut + Send,
        Fut: Future<Output = ()> + Send + 'static,
    {
        loop {
            // Candidate.
            loop {
                match self.try_acquire_or_renew().await {
                    Ok(true) => break,
                    Ok(false) => {}
                    Err(e) => tracing::warn!(lease = self.name, "leader election: {e}"),
                }
                tokio::select! {
                    _ = tokio::time::sleep(self.timing.retry) => {}
                    _ = stopped(&mut stop) => return self.finish().await,
                }
            }
            // Leader.
            let (lost_tx, lost) = watch::channel(false);
            let mut task = AbortOnDrop(tokio::spawn(work(lost)));
            let mut renewed = Instant::now();
            let mut ended = false;
            let stopping = loop {
                tokio::select! {
                    _ = tokio::time::sleep(self.timing.retry) => {}
                    _ = stopped(&mut stop) => break true,
                    _ = &mut task.0 => {
                        ended = true;
                        break false;
                    }
                }
                match self.try_acquire_or_renew().await {
                    Ok(true) => renewed = Instant::now(),
                    Ok(false) => break false,
                    Err(e) => tracing::warn!(lease = self.name, "leader election: renewing: {e}"),
                }
                if renewed.elapsed() > self.timing.renew_deadline {
                    break false;
                }
            };
            let _ = lost_tx.send(true);
            if !ended {
                let _ = (&mut task.0).await;
            }
            if stopping {
                return self.finish().await;
            }
            tracing::warn!(
                lease = self.name,
                identity = self.identity,
                "leader election lost"
            );
        }
    }

    async fn finish(self) {
        self.release().await;
        self.recorder.shutdown(Duration::from_secs(2)).await;
    }
}

/// The leader's work, stopped with the election: dropping the election's
/// future (its task aborted) must not leave the work running.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Until `stop` turns true (the guard `wait_for` returns is not kept).
pub(crate) async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// `HOSTNAME_UUID`, as client-go's identities.
pub fn identity(hostname: &str) -> String {
    format!("{hostname}_{}", uuid::Uuid::new_v4())
}
