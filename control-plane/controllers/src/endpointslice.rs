//! EndpointSlice controller: for each Service with a selector, the
//! discovery.k8s.io/v1 slices (IPv4, at most 100 endpoints each) of the
//! pods it selects, and the core/v1 Endpoints beside them.
//!
//! Observe (caches of Services, Pods, managed slices, Endpoints), diff
//! ([`desired`] then [`plan`]), act (only the slices that change). A
//! Service is reconciled when it, one of its pods (by current labels, or
//! by a slice that still lists the pod) or one of its slices changes.

mod desired;
mod legacy;
mod plan;

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};
use k8s_openapi::api::core::v1::{Endpoints, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::runtime::applier;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, ResourceExt};
use kube_util::informer::Scope;

use crate::{Ctx, Error};

pub use plan::{LABEL_MANAGED_BY, LABEL_SERVICE_NAME, MANAGED_BY, MAX_ENDPOINTS};

/// Resync every Service this often even without changes.
const RESYNC: Duration = Duration::from_secs(300);
/// Retry a failed reconcile (409s mostly) after this long.
const RETRY: Duration = Duration::from_secs(1);
/// Look again this soon when the cache lags behind our own writes.
const STALE_RETRY: Duration = Duration::from_millis(100);
/// A write the cache never shows (someone else deleted the slice) stops
/// holding the Service back after this long.
const EXPECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What reconciles share: the caches and the write log.
struct State {
    client: kube::Client,
    pods: Store<Pod>,
    slices: Store<EndpointSlice>,
    endpoints: Store<Endpoints>,
    tracker: Tracker,
}

pub async fn run(ctx: Ctx) -> Result<(), Error> {
    let client = ctx.client.clone();
    let managed = Scope::labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}"));
    let mirrored = Scope::labels(&format!("{}=true", legacy::LABEL_SKIP_MIRROR));
    let services = ctx.informers.get::<Service>();
    let pods = ctx.informers.get::<Pod>();
    let slices = ctx.informers.get_scoped::<EndpointSlice>(managed);
    let endpoints = ctx.informers.get_scoped::<Endpoints>(mirrored);
    let (svc_rx, pod_rx) = (services.subscribe(), pods.subscribe());
    let (slice_rx, ep_rx) = (slices.subscribe(), endpoints.subscribe());
    for ready in [
        services.ready().await,
        pods.ready().await,
        slices.ready().await,
        endpoints.ready().await,
    ] {
        ready.map_err(|e| Error::Config(e.to_string()))?;
    }

    let svc_store = services.store().clone();
    let slice_store = slices.store().clone();
    let queue = stream::select_all([
        svc_rx
            .objects()
            .map(|s| vec![ObjectRef::from_obj(&*s)])
            .boxed(),
        pod_rx
            .objects()
            .map(move |p| services_of_pod(&svc_store, &slice_store, &p))
            .boxed(),
        slice_rx
            .objects()
            .map(|s| service_of_labelled(&s).into_iter().collect())
            .boxed(),
        ep_rx
            .objects()
            .map(|e| vec![ObjectRef::new(&e.name_any()).within(&e.namespace().unwrap_or_default())])
            .boxed(),
    ])
    .flat_map(stream::iter)
    .map(Ok::<_, Infallible>);

    let state = Arc::new(State {
        client,
        pods: pods.store().clone(),
        slices: slices.store().clone(),
        endpoints: endpoints.store().clone(),
        tracker: Tracker::default(),
    });
    let results = applier(
        |svc, st| Box::pin(reconcile(svc, st)),
        |svc, err, _| {
            tracing::warn!(service = %svc.name_any(), namespace = ?svc.namespace(), "syncing endpoints failed, retrying: {err}");
            Action::requeue(RETRY)
        },
        state,
        services.store().clone(),
        queue,
        kube::runtime::controller::Config::default(),
    );
    results.for_each(|_| async {}).await;
    // The queue only ends when every watch task has: nothing left to do.
    Ok(())
}

/// The Services a pod change may concern: those whose selector matches
/// the pod now, and those whose slices still list it (its labels may
/// have changed, or it is gone).
fn services_of_pod(
    services: &Store<Service>,
    slices: &Store<EndpointSlice>,
    pod: &Pod,
) -> Vec<ObjectRef<Service>> {
    let ns = pod.namespace().unwrap_or_default();
    let mut out: HashSet<ObjectRef<Service>> = services
        .state()
        .iter()
        .filter(|s| s.namespace().as_deref() == Some(ns.as_str()))
        .filter(|s| desired::selector(s).is_some_and(|sel| desired::selects(sel, pod)))
        .map(|s| ObjectRef::from_obj(&**s))
        .collect();
    let uid = pod.uid();
    for s in slices.state() {
        if s.namespace().as_deref() != Some(ns.as_str()) {
            continue;
        }
        let lists = s
            .endpoints
            .iter()
            .flatten()
            .any(|e| e.target_ref.as_ref().and_then(|r| r.uid.as_ref()) == uid.as_ref());
        if lists {
            out.extend(service_of_labelled(&s));
        }
    }
    out.into_iter().collect()
}

/// The Service a managed slice belongs to, by its service-name label.
fn service_of_labelled(s: &EndpointSlice) -> Option<ObjectRef<Service>> {
    let name = s.labels().get(LABEL_SERVICE_NAME)?;
    Some(ObjectRef::new(name).within(&s.namespace().unwrap_or_default()))
}

async fn reconcile(svc: Arc<Service>, st: Arc<State>) -> Result<Action, Error> {
    let ns = svc.namespace().unwrap_or_default();
    let name = svc.name_any();
    let key = (ns.clone(), name.clone());
    let owned: Vec<Arc<EndpointSlice>> = st
        .slices
        .state()
        .into_iter()
        .filter(|s| s.namespace().as_deref() == Some(ns.as_str()))
        .filter(|s| s.labels().get(LABEL_SERVICE_NAME) == Some(&name))
        .collect();
    // Our own recent writes not in the cache yet: planning now would
    // create duplicates or undo them.
    if st.tracker.stale(&key, &owned) {
        return Ok(Action::requeue(STALE_RETRY));
    }
    let slices: Api<EndpointSlice> = Api::namespaced(st.client.clone(), &ns);
    if desired::selector(&svc).is_none() {
        // Someone else manages this Service's endpoints now (or nobody
        // does: ExternalName). Slices we made earlier would be stale.
        for s in &owned {
            delete_slice(&slices, s, &st.tracker, &key).await?;
        }
        return Ok(Action::requeue(RESYNC));
    }
    let pods: Vec<Arc<Pod>> = st
        .pods
        .state()
        .into_iter()
        .filter(|p| p.namespace().as_deref() == Some(ns.as_str()))
        .collect();
    let pes = desired::pod_endpoints(&svc, pods.iter().map(|p| &**p));
    let refs: Vec<&EndpointSlice> = owned.iter().map(|s| &**s).collect();
    let p = plan::plan(&svc, desired::slice_groups(&svc, &pes), &refs);
    if !p.is_empty() {
        tracing::debug!(service = %name, namespace = %ns, create = p.create.len(), update = p.update.len(), delete = p.delete.len(), "writing endpoint slices");
    }
    // Creates and updates before deletes: readers never see a gap.
    for s in &p.create {
        let made = slices.create(&PostParams::default(), s).await?;
        st.tracker.expect_version(&key, &made);
    }
    for s in &p.update {
        let made = slices
            .replace(&s.name_any(), &PostParams::default(), s)
            .await?;
        st.tracker.expect_version(&key, &made);
    }
    for s in &p.delete {
        delete_slice(&slices, s, &st.tracker, &key).await?;
    }
    sync_endpoints(&st, &svc, &pes).await?;
    Ok(Action::requeue(RESYNC))
}

async fn delete_slice(
    api: &Api<EndpointSlice>,
    s: &EndpointSlice,
    tracker: &Tracker,
    key: &(String, String),
) -> Result<(), Error> {
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: s.uid(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(&s.name_any(), &dp).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    tracker.expect_gone(key, &s.name_any());
    Ok(())
}

/// Keep the core/v1 Endpoints of `svc` in step with its pods.
async fn sync_endpoints(
    st: &State,
    svc: &Service,
    pes: &[desired::PodEndpoint],
) -> Result<(), Error> {
    let ns = svc.namespace().unwrap_or_default();
    let want = legacy::desired(svc, pes);
    let name = svc.name_any();
    let have = st.endpoints.get(&ObjectRef::new(&name).within(&ns));
    if have.as_ref().is_some_and(|h| legacy::up_to_date(h, &want)) {
        return Ok(());
    }
    let api: Api<Endpoints> = Api::namespaced(st.client.clone(), &ns);
    let current = match have {
        Some(h) => Some((*h).clone()),
        None => match api.create(&PostParams::default(), &want).await {
            Ok(_) => None,
            // One without our label (made by hand, or before us): take it over.
            Err(kube::Error::Api(e)) if e.code == 409 => Some(api.get(&name).await?),
            Err(e) => return Err(e.into()),
        },
    };
    if let Some(mut cur) = current {
        if legacy::up_to_date(&cur, &want) {
            return Ok(());
        }
        cur.metadata.labels = want.metadata.labels.clone();
        cur.metadata.owner_references = want.metadata.owner_references.clone();
        cur.metadata.managed_fields = None;
        cur.subsets = want.subsets.clone();
        api.replace(&name, &PostParams::default(), &cur).await?;
    }
    Ok(())
}

/// Writes this controller made that the slice cache must show before the
/// Service is planned again (upstream's EndpointSliceTracker).
#[derive(Default)]
struct Tracker {
    /// (namespace, service) -> slice name -> what the cache must show.
    expect: Mutex<HashMap<(String, String), HashMap<String, Expect>>>,
}

#[derive(Debug, Clone, Copy)]
enum Expect {
    /// The slice at this resourceVersion or later.
    Version(u64, Instant),
    /// The slice gone.
    Gone(Instant),
}

fn version(s: &EndpointSlice) -> Option<u64> {
    s.resource_version()?.parse().ok()
}

impl Tracker {
    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<(String, String), HashMap<String, Expect>>> {
        // A panic while holding this lock leaves plain data behind.
        self.expect.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn expect_version(&self, key: &(String, String), s: &EndpointSlice) {
        // Resource versions that are not numbers cannot be compared:
        // then the cache is trusted.
        if let Some(v) = version(s) {
            self.lock()
                .entry(key.clone())
                .or_default()
                .insert(s.name_any(), Expect::Version(v, Instant::now()));
        }
    }

    fn expect_gone(&self, key: &(String, String), name: &str) {
        self.lock()
            .entry(key.clone())
            .or_default()
            .insert(name.to_string(), Expect::Gone(Instant::now()));
    }

    /// Whether the cache still misses one of our writes for `key`; forgets
    /// the writes it shows (and the ones too old to wait for).
    fn stale(&self, key: &(String, String), cached: &[Arc<EndpointSlice>]) -> bool {
        let mut all = self.lock();
        let Some(exp) = all.get_mut(key) else {
            return false;
        };
        let by_name: HashMap<String, &EndpointSlice> =
            cached.iter().map(|s| (s.name_any(), &**s)).collect();
        exp.retain(|name, e| {
            let (seen, at) = match *e {
                Expect::Version(v, at) => (
                    by_name
                        .get(name)
                        .and_then(|s| version(s))
                        .is_some_and(|have| have >= v),
                    at,
                ),
                Expect::Gone(at) => (!by_name.contains_key(name), at),
            };
            !seen && at.elapsed() < EXPECT_TIMEOUT
        });
        let stale = !exp.is_empty();
        if !stale {
            all.remove(key);
        }
        stale
    }
}
