//! Volumes as the scheduler sees them, after upstream's VolumeBinding and
//! VolumeRestrictions plugins: caches of claims, volumes and classes; the
//! whole-pod checks made once per attempt ([`Volumes::prefilter`], their
//! PreFilter); the per-node check ([`PodVolumes::check`], their Filter);
//! and the decisions to write before the pod is bound ([`Volumes::assume`],
//! their Reserve; the writes are [`crate::volumebind`]'s).
//!
//! Like upstream's assume cache, a decision goes into the cache at once (a
//! PV's claimRef, a claim's selected node), so that the next pod sees it
//! before the watch does. The watch's next version of that object
//! replaces it; a failed write restores the watched version.
//!
//! Pods without claims never get here: [`PodInfo::claims`] is empty.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    ObjectReference, PersistentVolume, PersistentVolumeClaim, TopologySelectorTerm,
};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Resource;
use kube_util::informer::Change;
use kube_util::storage::{self, BIND_COMPLETED_ANNOTATION, SELECTED_NODE_ANNOTATION};

use crate::cache::Cache;
use crate::nodeinfo::NodeInfo;
use crate::podinfo::PodInfo;

/// Upstream's `volume.NotSupportedProvisioner`: the class of static
/// volumes only, which nothing provisions.
pub const NO_PROVISIONER: &str = "kubernetes.io/no-provisioner";
const READ_WRITE_ONCE_POD: &str = "ReadWriteOncePod";
const WAIT_FOR_FIRST_CONSUMER: &str = "WaitForFirstConsumer";
/// Upstream's reason when an Immediate claim is not bound yet: the PV
/// controller, not the scheduler, has to act first.
pub const UNBOUND_IMMEDIATE: &str = "pod has unbound immediate PersistentVolumeClaims";

/// A watched object, and the version this scheduler assumed over it.
#[derive(Debug)]
struct Entry<K> {
    watched: Arc<K>,
    assumed: Option<Arc<K>>,
}

impl<K> Entry<K> {
    fn current(&self) -> &Arc<K> {
        self.assumed.as_ref().unwrap_or(&self.watched)
    }
}

/// The objects of one kind, by `namespace/name` (or `name`).
#[derive(Debug)]
struct Store<K> {
    items: HashMap<String, Entry<K>>,
    /// Keys seen since a re-list started.
    relist: Option<HashSet<String>>,
    synced: bool,
}

impl<K> Default for Store<K> {
    fn default() -> Self {
        Store {
            items: HashMap::new(),
            relist: None,
            synced: false,
        }
    }
}

fn key<K: Resource>(o: &K) -> String {
    let meta = o.meta();
    let name = meta.name.as_deref().unwrap_or_default();
    match meta.namespace.as_deref() {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_string(),
    }
}

fn version<K: Resource>(o: &K) -> Option<&str> {
    o.meta().resource_version.as_deref()
}

impl<K: Resource> Store<K> {
    /// Take in a watch change. True when it may let a pod fit that did
    /// not: an object added or changed, or the list complete.
    fn apply(&mut self, change: Change<K>) -> bool {
        match change {
            Change::Relisting => {
                self.relist = Some(HashSet::new());
                false
            }
            Change::Applied(o) => {
                let k = key(&*o);
                if let Some(seen) = &mut self.relist {
                    seen.insert(k.clone());
                }
                match self.items.get_mut(&k) {
                    Some(e) => {
                        // An assumption stands until the watch shows another
                        // version than the one it was made over: our own
                        // write, or a change that overrides it.
                        if e.assumed
                            .as_deref()
                            .is_some_and(|a| version(a) != version(&*o))
                        {
                            e.assumed = None;
                        }
                        let changed = version(&*e.watched) != version(&*o);
                        e.watched = o;
                        changed
                    }
                    None => {
                        self.items.insert(
                            k,
                            Entry {
                                watched: o,
                                assumed: None,
                            },
                        );
                        true
                    }
                }
            }
            Change::Deleted(o) => {
                self.items.remove(&key(&*o));
                false
            }
            Change::Listed => {
                if let Some(seen) = self.relist.take() {
                    self.items.retain(|k, _| seen.contains(k));
                }
                self.synced = true;
                true
            }
        }
    }

    fn get(&self, key: &str) -> Option<&Arc<K>> {
        self.items.get(key).map(Entry::current)
    }

    fn assume(&mut self, key: &str, o: Arc<K>) {
        if let Some(e) = self.items.get_mut(key) {
            e.assumed = Some(o);
        }
    }

    fn restore(&mut self, key: &str) {
        if let Some(e) = self.items.get_mut(key) {
            e.assumed = None;
        }
    }

    fn current(&self) -> impl Iterator<Item = &Arc<K>> {
        self.items.values().map(Entry::current)
    }
}

/// Claims, volumes and classes, owned by the scheduling loop.
#[derive(Debug, Default)]
pub struct Volumes {
    claims: Store<PersistentVolumeClaim>,
    volumes: Store<PersistentVolume>,
    classes: Store<StorageClass>,
}

/// Why no node can take the pod whatever the node: the PreFilter message
/// (upstream's UnschedulableAndUnresolvable), for "0/N nodes are
/// available: MESSAGE."
pub type Unresolvable = String;

impl Volumes {
    /// All three kinds listed once.
    pub fn synced(&self) -> bool {
        self.claims.synced && self.volumes.synced && self.classes.synced
    }

    /// Take in a claim change; true when it may help a parked pod.
    pub fn claim_changed(&mut self, c: Change<PersistentVolumeClaim>) -> bool {
        self.claims.apply(c)
    }

    /// Take in a volume change; true when it may help a parked pod.
    pub fn volume_changed(&mut self, c: Change<PersistentVolume>) -> bool {
        self.volumes.apply(c)
    }

    /// Take in a class change; true when it may help a parked pod.
    pub fn class_changed(&mut self, c: Change<StorageClass>) -> bool {
        self.classes.apply(c)
    }

    fn claim(&self, namespace: &str, name: &str) -> Option<&Arc<PersistentVolumeClaim>> {
        self.claims.get(&format!("{namespace}/{name}"))
    }

    /// The checks that hold for the whole pod, in upstream's order:
    /// VolumeRestrictions' (every persistentVolumeClaim exists; a
    /// ReadWriteOncePod claim is not in use), then VolumeBinding's (each
    /// claim exists, is not lost, not being deleted, an ephemeral one is
    /// the pod's; every claim not bound waits for its first consumer).
    ///
    /// # Errors
    ///
    /// Upstream's message when no node can help.
    pub fn prefilter(&self, pod: &PodInfo, cache: &Cache) -> Result<PodVolumes, Unresolvable> {
        let ns = pod.namespace.as_str();
        let mut rwop_conflict = false;
        for c in pod.claims.iter().filter(|c| !c.ephemeral) {
            let pvc = self
                .claim(ns, &c.claim)
                .ok_or_else(|| not_found(&c.claim))?;
            let rwop = access_modes(pvc).any(|m| m == READ_WRITE_ONCE_POD);
            if rwop && cache.claim_in_use(ns, &c.claim) {
                rwop_conflict = true;
            }
        }
        let mut claims: Vec<&Arc<PersistentVolumeClaim>> = Vec::with_capacity(pod.claims.len());
        for c in &pod.claims {
            let Some(pvc) = self.claim(ns, &c.claim) else {
                if c.ephemeral {
                    return Err(format!(
                        "waiting for ephemeral volume controller to create the persistentvolumeclaim \"{}\"",
                        c.claim
                    ));
                }
                return Err(not_found(&c.claim));
            };
            if pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Lost") {
                return Err(format!(
                    "persistentvolumeclaim \"{}\" bound to non-existent persistentvolume \"{}\"",
                    c.claim,
                    volume_name(pvc).unwrap_or_default()
                ));
            }
            if pvc.metadata.deletion_timestamp.is_some() {
                return Err(format!(
                    "persistentvolumeclaim \"{}\" is being deleted",
                    c.claim
                ));
            }
            if c.ephemeral {
                if let Some(message) = storage::ephemeral_claim_not_for_pod(&pod.pod, pvc) {
                    return Err(message);
                }
            }
            // Two volumes may name one claim: it is decided on once.
            if !claims.iter().any(|p| Arc::ptr_eq(p, pvc)) {
                claims.push(pvc);
            }
        }

        let mut out = PodVolumes {
            rwop_conflict,
            ..PodVolumes::default()
        };
        for pvc in claims {
            if let Some(pv) = claim_is_bound(pvc) {
                out.bound.push(self.volumes.get(pv).cloned());
                continue;
            }
            let class = storage::claim_class(pvc)
                .filter(|c| !c.is_empty())
                .and_then(|c| self.classes.get(c));
            let delayed = class
                .is_some_and(|c| c.volume_binding_mode.as_deref() == Some(WAIT_FOR_FIRST_CONSUMER));
            // A claim naming its volume is the PV controller's to bind,
            // whatever its class (upstream treats it as Immediate).
            if !delayed || volume_name(pvc).is_some() {
                return Err(UNBOUND_IMMEDIATE.to_string());
            }
            let selected_node =
                storage::annotation(&pvc.metadata.annotations, SELECTED_NODE_ANNOTATION)
                    .map(String::from);
            let candidates = match selected_node {
                // Provisioning was asked for on that node already.
                Some(_) => Vec::new(),
                None => self.candidates(pvc),
            };
            out.unbound.push(Unbound {
                claim: pvc.clone(),
                request: storage::claim_request(pvc),
                selected_node,
                candidates,
                class: class.cloned(),
            });
        }
        // Smallest claims pick first, so that each gets the smallest PV
        // that fits (upstream byPVCSize); stable, so equal ones keep
        // volume order.
        out.unbound.sort_by_key(|u| u.request);
        Ok(out)
    }

    /// The volumes that could serve `pvc` wherever its pod lands: one
    /// pre-bound to it first, then the rest smallest first (upstream
    /// `FindMatchingVolume` picks the smallest that fits).
    fn candidates(&self, pvc: &PersistentVolumeClaim) -> Vec<Candidate> {
        let mut out: Vec<Candidate> = self
            .volumes
            .current()
            .filter(|pv| storage::volume_matches_claim(pv, pvc))
            .map(|pv| Candidate {
                prebound: pv
                    .spec
                    .as_ref()
                    .and_then(|s| s.claim_ref.as_ref())
                    .is_some(),
                capacity: storage::volume_capacity(pv),
                volume: pv.clone(),
            })
            .collect();
        out.sort_by(|a, b| {
            b.prebound
                .cmp(&a.prebound)
                .then(a.capacity.cmp(&b.capacity))
                .then_with(|| a.volume.metadata.name.cmp(&b.volume.metadata.name))
        });
        out
    }

    /// Put the decisions of `plan` into the cache (upstream
    /// `AssumePodVolumes`), leaving in it only what has to be written: a
    /// PV already pre-bound to its claim, or a claim already carrying
    /// this node, needs no write.
    pub fn assume(&mut self, plan: &mut Plan) {
        plan.bindings.retain_mut(|(pvc, pv)| {
            let Some(bound) = bind_to_claim(pv, pvc) else {
                return false;
            };
            let bound = Arc::new(bound);
            self.volumes.assume(&key(&**pv), bound.clone());
            *pv = bound;
            true
        });
        let node = plan.node.clone();
        plan.provisions.retain_mut(|pvc| {
            let current = storage::annotation(&pvc.metadata.annotations, SELECTED_NODE_ANNOTATION);
            if current == Some(node.as_str()) {
                return false;
            }
            let mut selected = (**pvc).clone();
            selected
                .metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(SELECTED_NODE_ANNOTATION.to_string(), node.clone());
            let selected = Arc::new(selected);
            self.claims.assume(&key(&**pvc), selected.clone());
            *pvc = selected;
            true
        });
    }

    /// Undo [`Volumes::assume`] (upstream `RevertAssumedPodVolumes`): the
    /// cache shows the watched versions again.
    pub fn restore(&mut self, plan: &Plan) {
        for (_, pv) in &plan.bindings {
            self.volumes.restore(&key(&**pv));
        }
        for pvc in &plan.provisions {
            self.claims.restore(&key(&**pvc));
        }
    }
}

/// `pv` with its claimRef set to `pvc` and marked as bound by a
/// controller (upstream `GetBindVolumeToClaim`); `None` when it already
/// is exactly that.
fn bind_to_claim(pv: &PersistentVolume, pvc: &PersistentVolumeClaim) -> Option<PersistentVolume> {
    let claim_ref = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        namespace: pvc.metadata.namespace.clone(),
        name: pvc.metadata.name.clone(),
        uid: pvc.metadata.uid.clone(),
        ..Default::default()
    };
    let current = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
    let same = current.is_some_and(|r| {
        r.namespace == claim_ref.namespace && r.name == claim_ref.name && r.uid == claim_ref.uid
    });
    let marked = storage::annotation(
        &pv.metadata.annotations,
        storage::BOUND_BY_CONTROLLER_ANNOTATION,
    )
    .is_some();
    // Pre-bound by a user (claimRef without uid, or the full reference):
    // not the controller's doing, so not marked.
    let by_user = current.is_some();
    if same && (marked || by_user) {
        return None;
    }
    let mut out = pv.clone();
    if !by_user && !marked {
        out.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(
                storage::BOUND_BY_CONTROLLER_ANNOTATION.to_string(),
                "yes".to_string(),
            );
    }
    if !same {
        out.spec.get_or_insert_with(Default::default).claim_ref = Some(claim_ref);
    }
    Some(out)
}

fn not_found(claim: &str) -> String {
    format!("persistentvolumeclaim \"{claim}\" not found")
}

fn access_modes(pvc: &PersistentVolumeClaim) -> impl Iterator<Item = &str> {
    pvc.spec
        .iter()
        .flat_map(|s| s.access_modes.iter().flatten())
        .map(String::as_str)
}

fn volume_name(pvc: &PersistentVolumeClaim) -> Option<&str> {
    pvc.spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .filter(|n| !n.is_empty())
}

/// The volume of a bound claim: Bound with a volume name, or (upstream's
/// test, for the moment between the PV controller's spec and status
/// writes) a volume name and `pv.kubernetes.io/bind-completed`.
fn claim_is_bound(pvc: &PersistentVolumeClaim) -> Option<&str> {
    storage::claim_bound(pvc).or_else(|| {
        storage::annotation(&pvc.metadata.annotations, BIND_COMPLETED_ANNOTATION)
            .and(volume_name(pvc))
    })
}

/// Upstream `MatchTopologySelectorTerms`: no terms allow every node; a
/// term with no expressions allows none; otherwise any term whose every
/// expression holds.
fn topology_allows(
    terms: &[TopologySelectorTerm],
    labels: Option<&BTreeMap<String, String>>,
) -> bool {
    if terms.is_empty() {
        return true;
    }
    terms.iter().any(|t| {
        let exprs = t.match_label_expressions.as_deref().unwrap_or_default();
        !exprs.is_empty()
            && exprs.iter().all(|e| {
                labels
                    .and_then(|l| l.get(&e.key))
                    .is_some_and(|v| e.values.contains(v))
            })
    })
}

/// A PV that could serve a claim.
#[derive(Debug, Clone)]
struct Candidate {
    volume: Arc<PersistentVolume>,
    /// Its claimRef names the claim already.
    prebound: bool,
    capacity: i128,
}

/// A claim waiting for its first consumer.
#[derive(Debug, Clone)]
struct Unbound {
    claim: Arc<PersistentVolumeClaim>,
    request: i128,
    /// `volume.kubernetes.io/selected-node`: provisioning was asked for
    /// there, so only that node will do.
    selected_node: Option<String>,
    candidates: Vec<Candidate>,
    class: Option<Arc<StorageClass>>,
}

/// A pod's volumes as found by [`Volumes::prefilter`], for the per-node
/// checks of this attempt.
#[derive(Debug, Clone, Default)]
pub struct PodVolumes {
    /// A ReadWriteOncePod claim of the pod is used by another pod.
    pub rwop_conflict: bool,
    /// The volumes of the bound claims; `None` when it does not exist.
    bound: Vec<Option<Arc<PersistentVolume>>>,
    unbound: Vec<Unbound>,
}

/// Why the volumes rule a node out; more than one may hold (upstream
/// `ConflictReasons`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Conflicts {
    /// A bound volume's nodeAffinity excludes the node.
    pub node_affinity: bool,
    /// An unbound claim can neither get a PV nor be provisioned here.
    pub bind: bool,
    /// A bound claim's volume does not exist.
    pub missing_volume: bool,
}

/// What binding the pod to `node` takes first.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub node: String,
    /// Static volumes to bind: each claim with its PV (after
    /// [`Volumes::assume`], the PV with its claimRef set).
    pub bindings: Vec<(Arc<PersistentVolumeClaim>, Arc<PersistentVolume>)>,
    /// Claims to provision on the node (after [`Volumes::assume`],
    /// carrying the selected-node annotation).
    pub provisions: Vec<Arc<PersistentVolumeClaim>>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.bindings.is_empty() && self.provisions.is_empty()
    }
}

impl PodVolumes {
    /// Can the pod's volumes be had on `node` (upstream
    /// `FindPodVolumes`)? The plan when they can.
    ///
    /// # Errors
    ///
    /// The conflicts when they cannot.
    pub fn check(&self, node: &NodeInfo) -> Result<Plan, Conflicts> {
        let mut conflicts = Conflicts::default();
        let Some(n) = node.node.as_ref() else {
            conflicts.bind = true;
            return Err(conflicts);
        };
        for pv in &self.bound {
            match pv {
                None => {
                    conflicts.missing_volume = true;
                    break;
                }
                Some(pv) => {
                    let allowed = pv
                        .spec
                        .as_ref()
                        .is_none_or(|s| storage::volume_allows_node(s, n));
                    if !allowed {
                        conflicts.node_affinity = true;
                        break;
                    }
                }
            }
        }
        let mut plan = Plan {
            node: node.name.clone(),
            ..Plan::default()
        };
        if !self.unbound_fit(node, &mut plan) {
            conflicts.bind = true;
        }
        if conflicts == Conflicts::default() {
            Ok(plan)
        } else {
            Err(conflicts)
        }
    }

    /// The unbound claims: each gets a free PV that allows the node (not
    /// one already picked for another claim of the pod), or is
    /// provisioned there if its class can.
    fn unbound_fit(&self, node: &NodeInfo, plan: &mut Plan) -> bool {
        let Some(n) = node.node.as_ref() else {
            return false;
        };
        if self
            .unbound
            .iter()
            .any(|u| u.selected_node.as_ref().is_some_and(|s| *s != node.name))
        {
            return false;
        }
        for u in &self.unbound {
            if u.selected_node.is_none() {
                if let Some(pv) = self.pick(u, n, plan) {
                    plan.bindings.push((u.claim.clone(), pv));
                    continue;
                }
            }
            if !can_provision(u.class.as_deref(), node) {
                return false;
            }
            plan.provisions.push(u.claim.clone());
        }
        true
    }

    fn pick(
        &self,
        u: &Unbound,
        node: &k8s_openapi::api::core::v1::Node,
        plan: &Plan,
    ) -> Option<Arc<PersistentVolume>> {
        for c in &u.candidates {
            let allowed = c
                .volume
                .spec
                .as_ref()
                .is_some_and(|s| storage::volume_allows_node(s, node));
            if c.prebound {
                // Pre-bound elsewhere than here: this claim cannot have
                // another volume on this node (upstream returns no match).
                return allowed.then(|| c.volume.clone());
            }
            let taken = plan
                .bindings
                .iter()
                .any(|(_, pv)| pv.metadata.name == c.volume.metadata.name);
            if allowed && !taken {
                return Some(c.volume.clone());
            }
        }
        None
    }
}

/// Upstream `checkVolumeProvisions`, less storage capacity (no
/// CSIStorageCapacity here: like upstream without it, a provisioner is
/// assumed to have room). The built-in local-path provisioner can
/// provision on any node; a class without a provisioner cannot at all.
fn can_provision(class: Option<&StorageClass>, node: &NodeInfo) -> bool {
    let Some(class) = class else {
        return false;
    };
    if class.provisioner.is_empty() || class.provisioner == NO_PROVISIONER {
        return false;
    }
    topology_allows(
        class.allowed_topologies.as_deref().unwrap_or_default(),
        node.labels(),
    )
}

#[cfg(test)]
mod tests;
