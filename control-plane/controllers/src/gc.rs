//! Garbage collector: ownerReferences with background, foreground and
//! orphan propagation, over every served resource but events.
//!
//! Observe: metadata watches of all resources feed the ownership
//! [`graph`]. Diff: for each item a watch event touched, [`decide`]
//! compares it with its owners (gone? waiting for dependents?) and its
//! dependents. Act: delete the item, drop dangling owner references,
//! orphan dependents, or release a finalizer. An owner the graph does
//! not know is looked up live before anything is deleted for it.
//!
//! The API server sets the `foregroundDeletion` / `orphan` finalizers on
//! DELETE with `propagationPolicy: Foreground | Orphan`; `Background`
//! deletes the owner at once and its dependents are collected here.

mod decide;
mod graph;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{
    DeleteParams, DynamicObject, PartialObjectMeta, Patch, PatchParams, Preconditions,
    PropagationPolicy,
};
use kube::discovery::verbs;
use kube::runtime::{watcher, WatchStreamExt};
use kube::Api;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::served::{self, Served};
use crate::{Ctx, Error};
use decide::{Decision, Owner};
use graph::{Graph, Item, FOREGROUND, ORPHAN};

/// Failed items are tried again after this long.
const RETRY: Duration = Duration::from_secs(1);
/// Every item with owners is looked at again this often.
const RESYNC: Duration = Duration::from_secs(60);
/// Remembered uids of owners known to be gone (uids never come back).
const ABSENT_CAP: usize = 10_000;

type MetaEvent = watcher::Event<PartialObjectMeta<DynamicObject>>;

/// How often discovery is asked again, for kinds defined since (custom
/// resources): upstream's collector resyncs its monitors as often.
const REDISCOVER: Duration = Duration::from_secs(30);

pub async fn run(ctx: Ctx) -> Result<(), Error> {
    loop {
        let all = served::discover(&ctx.client).await?;
        collect(&ctx, all).await?;
        tracing::info!("garbage collector: served resources changed, restarting its watches");
    }
}

/// Collect over the resources `all` until discovery finds others.
async fn collect(ctx: &Ctx, all: Vec<Served>) -> Result<(), Error> {
    let watched: Vec<usize> = (0..all.len())
        .filter(|&i| !all[i].is_events() && all[i].supports(verbs::WATCH))
        .collect();
    let (tx, mut rx) = mpsc::channel::<(usize, MetaEvent)>(4096);
    // Dropped (aborting the watches) when this function ends.
    let mut watches = JoinSet::new();
    for &i in &watched {
        // Metadata only: the collector needs nothing else, and the watches
        // of every resource stay small.
        let api: Api<PartialObjectMeta<DynamicObject>> =
            Api::all_with(ctx.client.clone(), &all[i].res);
        let tx = tx.clone();
        let what = all[i].group_resource();
        watches.spawn(async move {
            let mut events =
                std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
            while let Some(ev) = events.next().await {
                match ev {
                    Ok(ev) => {
                        if tx.send((i, ev)).await.is_err() {
                            return;
                        }
                    }
                    Err(e) => tracing::warn!(resource = %what, "watch failed, retrying: {e}"),
                }
            }
        });
    }
    drop(tx);
    tracing::info!(resources = watched.len(), "garbage collector watching");
    let mut gc = Collector::new(ctx.client.clone(), all, watched.len());
    let mut retry = tokio::time::interval(RETRY);
    let mut resync = tokio::time::interval(RESYNC);
    let mut rediscover = tokio::time::interval(REDISCOVER);
    rediscover.tick().await;
    loop {
        tokio::select! {
            ev = rx.recv() => match ev {
                Some((i, ev)) => gc.observe(i, ev),
                // No watch left (nothing served?): look again later.
                None => {
                    tokio::time::sleep(REDISCOVER).await;
                    return Ok(());
                }
            },
            _ = retry.tick() => gc.retry_failed(),
            _ = resync.tick() => gc.resync(),
            _ = rediscover.tick() => {
                if served::discover(&ctx.client).await.is_ok_and(|now| !same(&now, &gc.all)) {
                    return Ok(());
                }
            }
        }
        // Take in everything already queued before acting on any of it.
        while let Ok((i, ev)) = rx.try_recv() {
            gc.observe(i, ev);
        }
        gc.work().await;
    }
}

/// Whether two discoveries found the same resources.
fn same(a: &[Served], b: &[Served]) -> bool {
    let key = |s: &Served| {
        (
            s.res.group.clone(),
            s.res.version.clone(),
            s.res.plural.clone(),
        )
    };
    let mut x: Vec<_> = a.iter().map(key).collect();
    let mut y: Vec<_> = b.iter().map(key).collect();
    x.sort();
    y.sort();
    x == y
}

/// The collector's state: the graph and its work sets.
struct Collector {
    client: kube::Client,
    /// Every served resource (owners may be of any of them).
    all: Vec<Served>,
    /// (group, kind) -> index in `all`.
    by_kind: HashMap<(String, String), usize>,
    graph: Graph,
    /// How many watches there are, and which have listed once.
    watches: usize,
    synced: HashSet<usize>,
    dirty: HashSet<String>,
    failed: HashSet<String>,
    absent: HashSet<String>,
}

fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(g, _)| g)
}

impl Collector {
    fn new(client: kube::Client, all: Vec<Served>, watches: usize) -> Self {
        let by_kind = all
            .iter()
            .enumerate()
            .map(|(i, r)| ((r.res.group.clone(), r.res.kind.clone()), i))
            .collect();
        Collector {
            client,
            all,
            by_kind,
            graph: Graph::default(),
            watches,
            synced: HashSet::new(),
            dirty: HashSet::new(),
            failed: HashSet::new(),
            absent: HashSet::new(),
        }
    }

    fn observe(&mut self, res: usize, ev: MetaEvent) {
        let dirty = match ev {
            watcher::Event::Init => {
                self.graph.list_started(res);
                return;
            }
            watcher::Event::InitDone => {
                self.synced.insert(res);
                self.graph.list_done(res)
            }
            watcher::Event::Apply(o) | watcher::Event::InitApply(o) => {
                match Item::from_meta(res, &o.metadata) {
                    Some(item) => self.graph.upsert(item),
                    None => return,
                }
            }
            watcher::Event::Delete(o) => {
                let Some(uid) = o.metadata.uid else { return };
                self.note_absent(&uid);
                self.graph.remove(&uid)
            }
        };
        self.dirty.extend(dirty);
    }

    fn note_absent(&mut self, uid: &str) {
        if self.absent.len() >= ABSENT_CAP {
            self.absent.clear();
        }
        self.absent.insert(uid.to_string());
    }

    fn retry_failed(&mut self) {
        self.dirty.extend(self.failed.drain());
    }

    fn resync(&mut self) {
        self.dirty.extend(self.graph.interesting());
    }

    /// Process every dirty item, once every watch has listed (deciding
    /// on a partial graph would look up many owners live for nothing).
    async fn work(&mut self) {
        if self.synced.len() < self.watches {
            return;
        }
        let batch: Vec<String> = self.dirty.drain().collect();
        for uid in batch {
            if let Err(e) = self.process(&uid).await {
                let what = self.graph.get(&uid).map(|i| self.describe(i));
                tracing::warn!(object = ?what, "garbage collection step failed, retrying: {e}");
                self.failed.insert(uid);
            }
        }
    }

    fn describe(&self, item: &Item) -> String {
        let r = &self.all[item.res];
        match &item.namespace {
            Some(ns) => format!("{} {ns}/{}", r.group_resource(), item.name),
            None => format!("{} {}", r.group_resource(), item.name),
        }
    }

    fn api_for(&self, item: &Item) -> Api<DynamicObject> {
        let r = &self.all[item.res].res;
        match &item.namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, r),
            None => Api::all_with(self.client.clone(), r),
        }
    }

    async fn process(&mut self, uid: &str) -> Result<(), kube::Error> {
        let Some(item) = self.graph.get(uid).cloned() else {
            return Ok(());
        };
        let blocking = self
            .graph
            .dependents(uid)
            .iter()
            .filter(|d| decide::blocks(d, uid))
            .count();
        if let Some(d) = decide::as_owner(&item, blocking) {
            self.act_as_owner(&item, d).await?;
        }
        if !item.owners.is_empty() {
            self.process_dependent(&item).await?;
        }
        Ok(())
    }

    async fn process_dependent(&mut self, item: &Item) -> Result<(), kube::Error> {
        let mut states = Vec::with_capacity(item.owners.len());
        for o in &item.owners {
            states.push(self.owner_state(item, o).await?);
        }
        let pairs: Vec<(&OwnerReference, Owner)> = item.owners.iter().zip(states).collect();
        let has_dependents = self.graph.has_dependents(&item.uid);
        match decide::as_dependent(item, &pairs, has_dependents) {
            Decision::Delete(policy) => self.delete(item, policy).await,
            Decision::DropOwners(uids) => self.drop_owners(item, &uids).await,
            _ => Ok(()),
        }
    }

    /// What is known of owner `o` of `item`: from the graph when it is
    /// there, else from a live read (the graph may lag behind a new owner).
    async fn owner_state(&mut self, item: &Item, o: &OwnerReference) -> Result<Owner, kube::Error> {
        if let Some(owner) = self.graph.get(&o.uid) {
            return Ok(if owner.waiting_for_dependents() {
                Owner::Waiting
            } else {
                Owner::Solid
            });
        }
        if self.absent.contains(&o.uid) {
            return Ok(Owner::Dangling);
        }
        let key = (group_of(&o.api_version).to_string(), o.kind.clone());
        let Some(&i) = self.by_kind.get(&key) else {
            tracing::debug!(object = %self.describe(item), owner_kind = %o.kind, "owner of a kind the server does not serve: leaving the object alone");
            return Ok(Owner::Unknown);
        };
        let r = &self.all[i];
        let api: Api<DynamicObject> = match (r.namespaced(), &item.namespace) {
            (true, Some(ns)) => Api::namespaced_with(self.client.clone(), ns, &r.res),
            // A cluster-scoped object cannot be owned by a namespaced one:
            // the reference points at nothing.
            (true, None) => return Ok(Owner::Dangling),
            (false, _) => Api::all_with(self.client.clone(), &r.res),
        };
        let found = api.get_metadata_opt(&o.name).await?;
        match found {
            Some(m) if m.metadata.uid.as_deref() == Some(o.uid.as_str()) => {
                let waiting = m.metadata.deletion_timestamp.is_some()
                    && m.metadata
                        .finalizers
                        .iter()
                        .flatten()
                        .any(|f| f == FOREGROUND);
                Ok(if waiting {
                    Owner::Waiting
                } else {
                    Owner::Solid
                })
            }
            _ => {
                self.note_absent(&o.uid);
                Ok(Owner::Dangling)
            }
        }
    }

    async fn act_as_owner(&mut self, item: &Item, d: Decision) -> Result<(), kube::Error> {
        match d {
            Decision::Orphan => {
                let deps: Vec<Item> = self
                    .graph
                    .dependents(&item.uid)
                    .into_iter()
                    .cloned()
                    .collect();
                for dep in &deps {
                    self.drop_owners(dep, std::slice::from_ref(&item.uid))
                        .await?;
                }
                tracing::info!(object = %self.describe(item), dependents = deps.len(), "orphaned dependents");
                self.remove_finalizer(item, ORPHAN).await
            }
            Decision::Foreground { release } => {
                let deps: Vec<Item> = self
                    .graph
                    .dependents(&item.uid)
                    .into_iter()
                    .filter(|d| !d.deleting)
                    .cloned()
                    .collect();
                for dep in &deps {
                    self.process_dependent(dep).await?;
                }
                if release {
                    tracing::info!(object = %self.describe(item), "dependents gone, finishing foreground deletion");
                    self.remove_finalizer(item, FOREGROUND).await?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    async fn delete(&mut self, item: &Item, policy: PropagationPolicy) -> Result<(), kube::Error> {
        tracing::info!(object = %self.describe(item), ?policy, "deleting object whose owners are gone");
        let dp = DeleteParams {
            propagation_policy: Some(policy),
            preconditions: Some(Preconditions {
                uid: Some(item.uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match self.api_for(item).delete(&item.name, &dp).await {
            Ok(_) => Ok(()),
            // Gone already, or the name is another object's now.
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Patch `item`'s owner references without `uids`, on the version
    /// the decision was made on.
    async fn drop_owners(&mut self, item: &Item, uids: &[String]) -> Result<(), kube::Error> {
        let keep: Vec<&OwnerReference> = item
            .owners
            .iter()
            .filter(|o| !uids.contains(&o.uid))
            .collect();
        let owners = if keep.is_empty() {
            Value::Null
        } else {
            json!(keep)
        };
        self.patch_meta(item, json!({"ownerReferences": owners}))
            .await
    }

    async fn remove_finalizer(&mut self, item: &Item, f: &str) -> Result<(), kube::Error> {
        let rest: Vec<&String> = item.finalizers.iter().filter(|x| *x != f).collect();
        let fins = if rest.is_empty() {
            Value::Null
        } else {
            json!(rest)
        };
        self.patch_meta(item, json!({"finalizers": fins})).await
    }

    async fn patch_meta(&self, item: &Item, mut meta: Value) -> Result<(), kube::Error> {
        if let Some(rv) = &item.resource_version {
            meta["resourceVersion"] = json!(rv);
        }
        let patch = json!({"metadata": meta});
        match self
            .api_for(item)
            .patch(&item.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(e),
        }
    }
}
