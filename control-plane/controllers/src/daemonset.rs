//! DaemonSet controller (upstream `pkg/controller/daemon`): one pod on
//! every node the DaemonSet's pods may run on (node selector, required node
//! affinity, taints against tolerations plus the DaemonSet defaults),
//! following nodes as they come, change and go; failed daemon pods are
//! replaced (with back-off); a new template rolls out node by node within
//! maxUnavailable, or with maxSurge a new pod beside the old one
//! (`daemonset_surge`); status counts for `kubectl get ds` and
//! `kubectl rollout status`.
//!
//! Pods are not bound here: each gets a required node affinity on
//! `metadata.name` of its node, and the scheduler places it, as upstream.
//! The template hash (`controller-revision-hash`) is computed without
//! ControllerRevision objects.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::channel::mpsc;
use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetStatus};
use k8s_openapi::api::core::v1::{
    Affinity, Node, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod,
    PodTemplateSpec, Toleration,
};
use kube::api::PostParams;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, ResourceExt};
use kube_util::events::{Recorder, Reporter};
use kube_util::{nodeaffinity, selector, taints};

use crate::daemonset_surge as surge;
use crate::pods;
use crate::workload::{self, controller_owner, ApiResultExt, Result};
use crate::workload_claim::{self as claim, Claim};
use crate::workload_expectations::Expectations;
use crate::workload_hash::template_hash;

/// Label with the hash of the template a daemon pod was made from.
pub const REVISION_HASH: &str = "controller-revision-hash";

/// Back-off for replacing failed daemon pods (upstream: 1 s doubling to 15
/// minutes), so a node that keeps rejecting the pod is not hammered.
const BACKOFF_INITIAL: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(15 * 60);

struct State {
    client: kube::Client,
    pods: Store<Pod>,
    nodes: Store<Node>,
    revisions: Store<k8s_openapi::api::apps::v1::ControllerRevision>,
    expectations: Arc<Expectations>,
    events: Recorder,
    /// `<ds key>/<node>` -> (last failure, current delay).
    backoff: Mutex<HashMap<String, (Instant, Duration)>>,
}

/// Run the DaemonSet controller until its task is aborted.
///
/// # Errors
/// The caches cannot be filled.
pub async fn run(ctx: crate::Ctx) -> Result<(), crate::Error> {
    let client = ctx.client.clone();
    let (tx, rx) = mpsc::channel(1024);
    let expectations = Arc::new(Expectations::default());
    let ds_cache = ctx.informers.get::<DaemonSet>();
    let _ds_cache_trigger = workload::trigger(&ds_cache, tx.clone(), {
        let exp = expectations.clone();
        move |ds: &DaemonSet, exists| {
            if !exists {
                exp.forget(&workload::key(ds));
            }
            workload::itself(ds)
        }
    });
    let pod_cache = ctx.informers.get::<Pod>();
    let _pod_cache_trigger = workload::trigger(&pod_cache, tx.clone(), {
        let dss = ds_cache.store().clone();
        let exp = expectations.clone();
        move |pod: &Pod, exists| owners_of(pod, exists, &dss, &exp)
    });
    let node_cache = ctx.informers.get::<Node>();
    let revision_cache = ctx
        .informers
        .get::<k8s_openapi::api::apps::v1::ControllerRevision>();
    let _node_cache_trigger = workload::trigger(&node_cache, tx, {
        let dss = ds_cache.store().clone();
        let mut seen: HashMap<String, u64> = HashMap::new();
        move |node: &Node, exists| {
            // Heartbeat status updates change nothing a DaemonSet looks at.
            let name = node.name_any();
            let fp = exists.then(|| fingerprint(node));
            let changed = match fp {
                Some(fp) => seen.insert(name, fp) != Some(fp),
                None => seen.remove(&name).is_some(),
            };
            if !changed {
                return Vec::new();
            }
            dss.state()
                .iter()
                .map(|ds| ObjectRef::from_obj(&**ds))
                .collect()
        }
    });
    workload::ready(&ds_cache).await?;
    workload::ready(&pod_cache).await?;
    workload::ready(&node_cache).await?;
    let state = Arc::new(State {
        events: Recorder::new(client.clone(), Reporter::new("daemonset-controller")),
        client,
        pods: pod_cache.store().clone(),
        nodes: node_cache.store().clone(),
        revisions: revision_cache.store().clone(),
        expectations,
        backoff: Mutex::new(HashMap::new()),
    });
    workload::ready(&revision_cache).await?;
    workload::drive("daemonset", ds_cache.store().clone(), rx, state, reconcile).await;
    Ok(())
}

/// What of a node decides where daemon pods run.
fn fingerprint(node: &Node) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    node.metadata.labels.hash(&mut h);
    if let Some(spec) = &node.spec {
        serde_json::to_string(&spec.taints)
            .unwrap_or_default()
            .hash(&mut h);
        spec.unschedulable.hash(&mut h);
    }
    h.finish()
}

fn owners_of(
    pod: &Pod,
    exists: bool,
    dss: &Store<DaemonSet>,
    exp: &Expectations,
) -> Vec<ObjectRef<DaemonSet>> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    if let Some(owner) = controller_owner::<DaemonSet>(&pod.metadata) {
        exp.observe(&format!("{ns}/{}", owner.name), pod, exists);
        return vec![owner];
    }
    if claim::controller_of(&pod.metadata).is_some()
        || !exists
        || pod.metadata.deletion_timestamp.is_some()
    {
        return Vec::new();
    }
    dss.state_filter(|ds| {
        ds.metadata.namespace.as_deref() == Some(ns)
            && !selector::is_empty(&ds.spec.selector)
            && selector::matches(&ds.spec.selector, pod.metadata.labels.as_ref())
    })
    .iter()
    .map(|ds| ObjectRef::from_obj(&**ds))
    .collect()
}

/// The tolerations every daemon pod gets (upstream
/// `AddOrUpdateDaemonPodTolerations`): daemons stay on nodes that are not
/// ready, unreachable, under pressure or cordoned.
fn daemon_tolerations(spec: &mut k8s_openapi::api::core::v1::PodSpec) {
    let mut add = vec![
        ("node.kubernetes.io/not-ready", "NoExecute"),
        ("node.kubernetes.io/unreachable", "NoExecute"),
        ("node.kubernetes.io/disk-pressure", "NoSchedule"),
        ("node.kubernetes.io/memory-pressure", "NoSchedule"),
        ("node.kubernetes.io/pid-pressure", "NoSchedule"),
        ("node.kubernetes.io/unschedulable", "NoSchedule"),
    ];
    if spec.host_network == Some(true) {
        add.push(("node.kubernetes.io/network-unavailable", "NoSchedule"));
    }
    let tols = spec.tolerations.get_or_insert_with(Vec::new);
    for (key, effect) in add {
        // Replace a toleration of the same key and effect: a
        // tolerationSeconds on it would evict the daemon.
        tols.retain(|t| !(t.key.as_deref() == Some(key) && t.effect.as_deref() == Some(effect)));
        tols.push(Toleration {
            key: Some(key.into()),
            operator: Some("Exists".into()),
            effect: Some(effect.into()),
            ..Default::default()
        });
    }
}

/// Whether a daemon pod should run on `node`, and whether one already
/// there may stay (it may while only NoSchedule taints are untolerated).
pub(crate) fn should_run(ds: &DaemonSet, node: &Node) -> (bool, bool) {
    let mut spec = ds.spec.template.spec.clone().unwrap_or_default();
    let name = node.name_any();
    if spec
        .node_name
        .as_deref()
        .is_some_and(|n| !n.is_empty() && n != name)
    {
        return (false, false);
    }
    if !nodeaffinity::pod_matches_node(&spec, node) {
        return (false, false);
    }
    daemon_tolerations(&mut spec);
    let tols = spec.tolerations.unwrap_or_default();
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let blocked = taints::untolerated_blocking(&taints, &tols).is_some();
    if !blocked {
        return (true, true);
    }
    let evicted = taints::untolerated_no_execute(&taints, &tols).is_some();
    (false, !evicted)
}

/// The node a daemon pod is for: where it is bound, or else the node its
/// required affinity names (upstream `GetTargetNodeName`).
fn target_node(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    if let Some(n) = spec.node_name.as_ref().filter(|n| !n.is_empty()) {
        return Some(n.clone());
    }
    let terms = &spec
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms;
    terms.iter().find_map(|t| {
        t.match_fields.iter().flatten().find_map(|r| {
            let v = r.values.as_deref().unwrap_or_default();
            (r.key == "metadata.name" && r.operator == "In" && v.len() == 1).then(|| v[0].clone())
        })
    })
}

/// The pod template for `node`: daemon tolerations, the revision hash
/// label, and a required affinity to exactly that node (upstream
/// `ReplaceDaemonSetPodNodeNameNodeAffinity`; other required terms were
/// already checked against the node, preferred ones stay).
fn template_for(ds: &DaemonSet, hash: &str, node: &str) -> PodTemplateSpec {
    let mut t = ds.spec.template.clone();
    t.metadata
        .get_or_insert_with(Default::default)
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(REVISION_HASH.into(), hash.into());
    let spec = t.spec.get_or_insert_with(Default::default);
    daemon_tolerations(spec);
    let term = NodeSelectorTerm {
        match_fields: Some(vec![NodeSelectorRequirement {
            key: "metadata.name".into(),
            operator: "In".into(),
            values: Some(vec![node.into()]),
        }]),
        ..Default::default()
    };
    let affinity = spec.affinity.get_or_insert_with(Affinity::default);
    let na = affinity
        .node_affinity
        .get_or_insert_with(NodeAffinity::default);
    na.required_during_scheduling_ignored_during_execution = Some(NodeSelector {
        node_selector_terms: vec![term],
    });
    t
}

pub(crate) fn is_updated(pod: &Pod, hash: &str) -> bool {
    pod.labels().get(REVISION_HASH).map(String::as_str) == Some(hash)
}

/// Oldest first, and among equals a running pod before a pending one
/// (upstream `podByCreationTimestampAndPhase`).
pub(crate) fn oldest_running_first(a: &Arc<Pod>, b: &Arc<Pod>) -> std::cmp::Ordering {
    a.metadata
        .creation_timestamp
        .cmp(&b.metadata.creation_timestamp)
        .then_with(|| (pods::phase(b) == "Running").cmp(&(pods::phase(a) == "Running")))
        .then_with(|| a.metadata.name.cmp(&b.metadata.name))
}

async fn reconcile(ds: Arc<DaemonSet>, st: Arc<State>) -> Result<Action> {
    let ns = ds.namespace().unwrap_or_default();
    let key = workload::key(&*ds);
    let hash = template_hash(
        &ds.spec.template,
        ds.status.as_ref().and_then(|s| s.collision_count),
    );
    let now = workload::now();
    let nodes = st.nodes.state();
    let by_node = claim_pods(&ds, &st).await?;

    let mut requeue: Vec<Duration> = Vec::new();
    let settled = st
        .expectations
        .satisfied(&key, |n| st.pods.get(&ObjectRef::new(n).within(&ns)));
    if settled && ds.metadata.deletion_timestamp.is_none() {
        let Plan {
            create,
            delete,
            retry,
        } = plan(&ds, &hash, &nodes, &by_node, &st, now);
        requeue.extend(retry);
        let mut doomed = Vec::new();
        for (pod, failed) in delete {
            if let Some(msg) = failed {
                st.events.warning(&*ds, "FailedDaemonPod", msg);
            }
            doomed.push(pod);
        }
        let delete = doomed;
        if !create.is_empty() || !delete.is_empty() {
            sync_nodes(&ds, &hash, &create, &delete, &st).await?;
        } else {
            let step = rolling_update(&ds, &hash, &nodes, &by_node, now)?;
            requeue.extend(step.retry);
            sync_nodes(&ds, &hash, &step.create, &step.delete, &st).await?;
        }
    } else if let Some(d) = st.expectations.expires_in(&key) {
        requeue.push(d);
    }

    let collisions = record_revision(&ds, &by_node, &hash, &st).await?;
    let (mut status, next) = calculate_status(&ds, &hash, &nodes, &by_node, now);
    if collisions > 0 {
        status.collision_count = Some(collisions);
    }
    requeue.extend(next);
    if ds.status.as_ref() != Some(&status) {
        let mut updated = (*ds).clone();
        updated.status = Some(status);
        Api::<DaemonSet>::namespaced(st.client.clone(), &ns)
            .replace_status(&ds.name_any(), &PostParams::default(), &updated)
            .await
            .ctx(|| format!("updating status of daemon set {key}"))?;
    }
    Ok(match requeue.into_iter().min() {
        Some(d) => Action::requeue(d.max(Duration::from_millis(100))),
        None => Action::await_change(),
    })
}

/// The DaemonSet's pods by the node they are for, after adopting orphans
/// and releasing strays. Terminating and finished pods are included:
/// a node whose pod is still going away gets no second one yet.
async fn claim_pods(ds: &DaemonSet, st: &State) -> Result<HashMap<String, Vec<Arc<Pod>>>> {
    let ns = ds.namespace().unwrap_or_default();
    let uid = ds.uid().unwrap_or_default();
    let deleting = ds.metadata.deletion_timestamp.is_some();
    let sel = &ds.spec.selector;
    let api: Api<Pod> = Api::namespaced(st.client.clone(), &ns);
    let candidates = st
        .pods
        .state_filter(|p| p.metadata.namespace.as_deref() == Some(ns.as_str()));
    let mut by_node: HashMap<String, Vec<Arc<Pod>>> = HashMap::new();
    let mut may_adopt = None;
    for pod in candidates {
        let selected =
            !selector::is_empty(sel) && selector::matches(sel, pod.metadata.labels.as_ref());
        let pod = match claim::classify(&uid, deleting, selected, &pod.metadata) {
            Claim::Owned => pod,
            Claim::Adopt if !pods::is_finished(&pod) => {
                if may_adopt.is_none() {
                    let ds_api = Api::<DaemonSet>::namespaced(st.client.clone(), &ns);
                    may_adopt = Some(claim::can_adopt(&ds_api, ds).await?);
                }
                if may_adopt != Some(true) {
                    continue;
                }
                Arc::new(claim::adopt(&api, &*pod, claim::controller_ref(ds), None).await?)
            }
            Claim::Release => {
                claim::release(&api, &*pod, &uid).await?;
                continue;
            }
            _ => continue,
        };
        // A pod for no particular node cannot be a daemon: the node loop
        // would never find it, so it goes with the vanished nodes.
        let node = target_node(&pod).unwrap_or_default();
        by_node.entry(node).or_default().push(pod);
    }
    Ok(by_node)
}

/// What the manage pass does to a DaemonSet's pods.
struct Plan {
    /// Nodes that need a daemon pod.
    create: Vec<String>,
    /// Pods to delete, with the FailedDaemonPod message of failed ones.
    delete: Vec<(Arc<Pod>, Option<String>)>,
    /// When failed pods held back by back-off may be replaced.
    retry: Option<Duration>,
}

/// Nodes that need a daemon pod, pods that must go (failed ones with the
/// message of their FailedDaemonPod event; duplicates; on a node they may
/// not stay on; for a node that is gone), and when to look again for
/// failed pods held back by back-off (upstream `manage`).
fn plan(
    ds: &DaemonSet,
    hash: &str,
    nodes: &[Arc<Node>],
    by_node: &HashMap<String, Vec<Arc<Pod>>>,
    st: &State,
    now: jiff::Timestamp,
) -> Plan {
    let key = workload::key(ds);
    let surge = surge::allows_surge(ds);
    let min_ready = ds.spec.min_ready_seconds.unwrap_or(0);
    let mut create = Vec::new();
    let mut delete = Vec::new();
    let mut retry: Option<Duration> = None;
    let names: HashSet<String> = nodes.iter().map(|n| n.name_any()).collect();
    for node in nodes {
        let name = node.name_any();
        let (run, stay) = should_run(ds, node);
        let here = by_node.get(&name).cloned().unwrap_or_default();
        if run && here.is_empty() {
            create.push(name);
        } else if stay {
            let mut running = Vec::new();
            let mut held_back = false;
            for pod in here
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
            {
                match pods::phase(&pod) {
                    "Failed" => {
                        match backoff(st, &format!("{key}/{name}")) {
                            Some(wait) => {
                                held_back = true;
                                retry = Some(retry.map_or(wait, |r| r.min(wait)));
                            }
                            None => {
                                let msg = format!("Found failed daemon pod {}/{} on node {name}, will try to kill it", pod.namespace().unwrap_or_default(), pod.name_any());
                                tracing::info!(daemonset = %key, node = %name, pod = %pod.name_any(), "replacing failed daemon pod");
                                delete.push((pod, Some(msg)));
                            }
                        }
                    }
                    "Succeeded" => delete.push((pod, None)),
                    _ => running.push(pod),
                }
            }
            if surge {
                // Upstream creates here even beside a failed pod held back
                // by back-off; waiting for it keeps the back-off meaningful.
                if running.is_empty() && run && !held_back {
                    create.push(name);
                }
                delete.extend(
                    surge::excess_on_node(running, hash, min_ready, now)
                        .into_iter()
                        .map(|p| (p, None)),
                );
            } else {
                // One daemon per node: keep the oldest.
                running.sort_by(oldest_running_first);
                delete.extend(running.into_iter().skip(1).map(|p| (p, None)));
            }
        } else {
            delete.extend(
                here.into_iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .map(|p| (p, None)),
            );
        }
    }
    for (node, here) in by_node {
        if !names.contains(node) {
            delete.extend(
                here.iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none() || bound(p))
                    .map(|p| (p.clone(), None)),
            );
        }
    }
    Plan {
        create,
        delete,
        retry,
    }
}

fn bound(p: &Pod) -> bool {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty())
}

/// `None` when a failed pod on `key` may be replaced now (and starts the
/// next, longer back-off), else how long to wait.
fn backoff(st: &State, key: &str) -> Option<Duration> {
    let mut m = st.backoff.lock().unwrap_or_else(|p| p.into_inner());
    let now = Instant::now();
    if let Some((at, delay)) = m.get(key) {
        let until = *at + *delay;
        if now < until {
            return Some(until - now);
        }
    }
    let next = match m.get(key) {
        // Long quiet: start over (upstream resets after twice the max).
        Some((at, _)) if now.duration_since(*at) > 2 * BACKOFF_MAX => BACKOFF_INITIAL,
        Some((_, d)) => (*d * 2).min(BACKOFF_MAX),
        None => BACKOFF_INITIAL,
    };
    m.insert(key.to_string(), (now, next));
    None
}

/// One step of a rolling update. Without surge (upstream `rollingUpdate`
/// with maxSurge 0): old pods to delete, unavailable ones at once, then
/// available ones while fewer than maxUnavailable nodes are without an
/// available daemon; the manage pass then creates their successors. With
/// surge: `daemonset_surge::rolling_update`.
fn rolling_update(
    ds: &DaemonSet,
    hash: &str,
    nodes: &[Arc<Node>],
    by_node: &HashMap<String, Vec<Arc<Pod>>>,
    now: jiff::Timestamp,
) -> Result<surge::Step> {
    let strategy = ds.spec.update_strategy.as_ref();
    if strategy.and_then(|s| s.type_.as_deref()) == Some("OnDelete") {
        return Ok(surge::Step::default());
    }
    let desired = nodes.iter().filter(|n| should_run(ds, n).0).count() as i32;
    let ru = strategy.and_then(|s| s.rolling_update.as_ref());
    let budget = surge::budget(
        ru.and_then(|r| r.max_surge.as_ref()),
        ru.and_then(|r| r.max_unavailable.as_ref()),
        desired,
    )?;
    if budget.surge > 0 {
        return Ok(surge::rolling_update(
            ds,
            hash,
            nodes,
            by_node,
            budget.surge,
            now,
        ));
    }
    let max_unavailable = budget.unavailable;
    let min_ready = ds.spec.min_ready_seconds.unwrap_or(0);
    let mut unavailable = 0;
    let mut replace_now = Vec::new();
    let mut candidates = Vec::new();
    let mut names: Vec<&String> = by_node.keys().collect();
    names.sort();
    for name in names {
        let alive: Vec<&Arc<Pod>> = by_node[name]
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        let (new, old): (Vec<&Arc<Pod>>, Vec<&Arc<Pod>>) =
            alive.into_iter().partition(|p| is_updated(p, hash));
        match (new.as_slice(), old.as_slice()) {
            ([], [old]) => {
                if !pods::is_available(old, min_ready, now) {
                    replace_now.push((*old).clone());
                } else if unavailable < max_unavailable {
                    candidates.push((*old).clone());
                }
            }
            ([new], []) => {
                if !pods::is_available(new, min_ready, now) {
                    unavailable += 1;
                }
            }
            // Nothing, both, or duplicates: the manage pass sorts the
            // node out; count it as unavailable meanwhile.
            _ => unavailable += 1,
        }
    }
    let room = (max_unavailable - unavailable).max(0) as usize;
    replace_now.extend(candidates.into_iter().take(room));
    Ok(surge::Step {
        delete: replace_now,
        ..Default::default()
    })
}

/// Create daemon pods for `create` nodes (slow-start batches) and delete
/// `delete` pods (at once; a pod whose node is gone is removed without
/// grace, as upstream's pod garbage collector does).
async fn sync_nodes(
    ds: &DaemonSet,
    hash: &str,
    create: &[String],
    delete: &[Arc<Pod>],
    st: &State,
) -> Result<()> {
    let ns = ds.namespace().unwrap_or_default();
    let key = workload::key(ds);
    let api: Api<Pod> = Api::namespaced(st.client.clone(), &ns);
    for p in delete {
        st.expectations.deleting(
            &key,
            &p.name_any(),
            p.metadata.uid.as_deref().unwrap_or_default(),
        );
    }
    let deletions = futures::future::join_all(delete.iter().map(|p| delete_pod(&api, ds, p, st)));
    let n = create.len();
    st.expectations.creating(&key, n);
    let owner = claim::controller_ref(ds);
    let prefix = pods::name_prefix(&ds.name_any());
    let creations = pods::slow_start(n, |i| {
        let pod = pods::from_template(
            &template_for(ds, hash, &create[i]),
            prefix.clone(),
            owner.clone(),
        );
        let (api, key) = (&api, &key);
        async move { pods::create(api, &pod, ds, &st.events, &st.expectations, key).await }
    });
    let (deleted, (_, made, create_err)) = futures::future::join(deletions, creations).await;
    for _ in made..n {
        st.expectations.created(&key, None);
    }
    if let Some(e) = create_err {
        return Err(e).ctx(|| format!("creating daemon pods for {key}"));
    }
    deleted.into_iter().collect::<Result<Vec<()>>>()?;
    Ok(())
}

async fn delete_pod(api: &Api<Pod>, ds: &DaemonSet, pod: &Pod, st: &State) -> Result<()> {
    // A pod of a deleted node has no agent to finish its graceful deletion.
    let node_gone = target_node(pod).is_none_or(|n| st.nodes.get(&ObjectRef::new(&n)).is_none());
    let grace = node_gone.then_some(0);
    workload::delete_owned_pod(
        api,
        ds,
        pod,
        grace,
        &st.events,
        &st.expectations,
        "daemon set",
    )
    .await
}

/// Status counts (upstream `updateDaemonSetStatus`), and when to look again
/// for pods that are ready but not yet available.
fn calculate_status(
    ds: &DaemonSet,
    hash: &str,
    nodes: &[Arc<Node>],
    by_node: &HashMap<String, Vec<Arc<Pod>>>,
    now: jiff::Timestamp,
) -> (DaemonSetStatus, Option<Duration>) {
    let min_ready = ds.spec.min_ready_seconds.unwrap_or(0);
    let (mut desired, mut current, mut misscheduled, mut ready, mut available, mut updated) =
        (0, 0, 0, 0, 0, 0);
    let mut firsts = Vec::new();
    for node in nodes {
        let (run, _) = should_run(ds, node);
        let mut here = by_node.get(&node.name_any()).cloned().unwrap_or_default();
        let scheduled = !here.is_empty();
        if !run {
            if scheduled {
                misscheduled += 1;
            }
            continue;
        }
        desired += 1;
        if !scheduled {
            continue;
        }
        current += 1;
        here.sort_by(oldest_running_first);
        let pod = here[0].clone();
        if pods::is_ready(&pod) {
            ready += 1;
            if pods::is_available(&pod, min_ready, now) {
                available += 1;
            }
        }
        if is_updated(&pod, hash) {
            updated += 1;
        }
        firsts.push(pod);
    }
    let old = ds.status.clone().unwrap_or_default();
    let status = DaemonSetStatus {
        desired_number_scheduled: desired,
        current_number_scheduled: current,
        number_misscheduled: misscheduled,
        number_ready: ready,
        number_available: (available > 0).then_some(available),
        number_unavailable: (desired - available > 0).then_some(desired - available),
        updated_number_scheduled: (updated > 0).then_some(updated),
        observed_generation: ds.metadata.generation,
        collision_count: old.collision_count,
        conditions: old.conditions,
    };
    (status, pods::next_available_in(&firsts, min_ready, now))
}

/// Record the template as a ControllerRevision named by the pods' hash
/// (what `kubectl rollout history/undo ds` read), and trim the history to
/// `revisionHistoryLimit`, keeping the revisions live pods run. Returns
/// the collision count to record.
async fn record_revision(
    ds: &DaemonSet,
    by_node: &HashMap<String, Vec<Arc<Pod>>>,
    hash: &str,
    st: &State,
) -> Result<i32> {
    use crate::workload_revision as revision;
    let ns = ds.namespace().unwrap_or_default();
    let uid = ds.uid().unwrap_or_default();
    let api = Api::namespaced(st.client.clone(), &ns);
    let revs = revision::owned(&st.revisions, &ns, &uid);
    let labels = ds.spec.selector.match_labels.clone().unwrap_or_default();
    let template = ds.spec.template.clone();
    let recorded = ds.status.as_ref().and_then(|s| s.collision_count);
    let collisions = recorded.unwrap_or(0);
    let (_, collisions) = revision::ensure(
        &api,
        &revs,
        ds,
        &labels,
        revision::data_of(&template),
        collisions,
        // The same hash the pods are labelled with.
        |_, c| template_hash(&template, if c == collisions { recorded } else { Some(c) }),
    )
    .await?;
    let name = ds.name_any();
    let mut live: std::collections::HashSet<String> = by_node
        .values()
        .flatten()
        .filter_map(|p| {
            p.labels()
                .get(REVISION_HASH)
                .map(|h| revision::name(&name, h))
        })
        .collect();
    live.insert(revision::name(&name, hash));
    let revs = revision::owned(&st.revisions, &ns, &uid);
    revision::truncate(
        &api,
        &revs,
        &live,
        ds.spec.revision_history_limit.unwrap_or(10),
    )
    .await?;
    Ok(collisions)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::DaemonSetSpec;
    use k8s_openapi::api::core::v1::{NodeSpec, PodSpec, Taint};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn node(name: &str, labels: &[(&str, &str)], taints: Vec<Taint>) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: Some(taints),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn taint(key: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            effect: effect.into(),
            ..Default::default()
        }
    }

    fn ds(node_selector: Option<&[(&str, &str)]>) -> DaemonSet {
        DaemonSet {
            spec: DaemonSetSpec {
                template: PodTemplateSpec {
                    metadata: None,
                    spec: Some(PodSpec {
                        node_selector: node_selector.map(|s| {
                            s.iter()
                                .map(|(k, v)| (k.to_string(), v.to_string()))
                                .collect()
                        }),
                        ..Default::default()
                    }),
                },
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn eligibility_follows_selector_and_taints() {
        let d = ds(Some(&[("role", "edge")]));
        assert_eq!(
            should_run(&d, &node("a", &[("role", "edge")], vec![])),
            (true, true)
        );
        assert_eq!(should_run(&d, &node("b", &[], vec![])), (false, false));
        let any = ds(None);
        // Default daemon tolerations: cordoned and not-ready nodes are fine.
        let cordoned = node(
            "c",
            &[],
            vec![
                taint("node.kubernetes.io/unschedulable", "NoSchedule"),
                taint("node.kubernetes.io/not-ready", "NoExecute"),
            ],
        );
        assert_eq!(should_run(&any, &cordoned), (true, true));
        // A foreign NoSchedule taint: no new pod, an existing one stays.
        assert_eq!(
            should_run(
                &any,
                &node("d", &[], vec![taint("dedicated", "NoSchedule")])
            ),
            (false, true)
        );
        assert_eq!(
            should_run(&any, &node("e", &[], vec![taint("dedicated", "NoExecute")])),
            (false, false)
        );
    }

    #[test]
    fn pods_are_pinned_to_their_node_by_affinity() {
        let d = ds(None);
        let t = template_for(&d, "abc", "n1");
        let pod = pods::from_template(&t, "x-".into(), Default::default());
        assert_eq!(target_node(&pod).as_deref(), Some("n1"));
        assert_eq!(
            pod.labels().get(REVISION_HASH).map(String::as_str),
            Some("abc")
        );
        let tols = pod.spec.unwrap().tolerations.unwrap();
        assert_eq!(tols.len(), 6);
    }
}
