//! The pod workload (creates, gets, label-selected pages, one full list)
//! through either client: the light HTTPS one ([`https`](super::https)) or
//! kube-rs. Every response is checked: status, a body that parses, and the
//! fields the operation promises (resourceVersion, the name asked for, the
//! selected label).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure};
use bytes::Bytes;
use http::Method;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use serde::Deserialize;
use serde_json::{json, Value};

use super::https::{self, Call, Conn};

/// Which client drives the pod workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ClientKind {
    /// Light HTTPS/1.1 client, one connection per worker, bodies
    /// serialised up front.
    Https,
    /// The same over HTTP/2, every worker on one connection (as kubectl
    /// and client-go).
    Https2,
    /// kube-rs `Api<Pod>` (what controllers use; about as much CPU per
    /// request as the server).
    Kube,
}

const NAMESPACE: &str = "default";
const PODS: &str = "/api/v1/namespaces/default/pods";

fn pod_name(i: usize) -> String {
    format!("bench-{i:05}")
}

/// Shard label of pod `i`; label-selected lists ask for one shard.
fn shard(i: usize) -> String {
    (i % 16).to_string()
}

/// Pod `i` as the JSON a client sends.
pub fn pod_json(i: usize) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod_name(i), "labels": {"app": "bench", "shard": shard(i)}},
        "spec": {"containers": [{"name": "app", "image": "registry.local/bench:1.0", "args": ["--serve", "--port=8080"],
            "ports": [{"containerPort": 8080}], "env": [{"name": "MODE", "value": "bench"}],
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}
    })
}

/// The part of an answered object the checks read.
#[derive(Deserialize)]
struct Object {
    metadata: Meta,
}

#[derive(Deserialize)]
struct Meta {
    #[serde(default)]
    name: String,
    #[serde(rename = "resourceVersion", default)]
    resource_version: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct List {
    metadata: Meta,
    items: Vec<Object>,
}

/// A stored object named `name` with a resourceVersion.
fn check_object(body: &[u8], name: &str) -> anyhow::Result<()> {
    let o: Object = serde_json::from_slice(body)?;
    ensure!(
        o.metadata.name == name,
        "answered {:?}, want {name:?}",
        o.metadata.name
    );
    ensure!(
        !o.metadata.resource_version.is_empty(),
        "{name} has no resourceVersion"
    );
    Ok(())
}

/// A list at a resourceVersion whose items all carry `shard`, at most `limit`.
fn check_list(l: &List, want_shard: Option<&str>, limit: usize) -> anyhow::Result<()> {
    ensure!(
        !l.metadata.resource_version.is_empty(),
        "list has no resourceVersion"
    );
    ensure!(
        limit == 0 || l.items.len() <= limit,
        "{} items past limit {limit}",
        l.items.len()
    );
    if let Some(s) = want_shard {
        if let Some(o) = l
            .items
            .iter()
            .find(|o| o.metadata.labels.get("shard").map(String::as_str) != Some(s))
        {
            bail!("{} does not match shard={s}", o.metadata.name);
        }
    }
    Ok(())
}

fn pods_api(client: &kube::Client) -> Api<Pod> {
    Api::namespaced(client.clone(), NAMESPACE)
}

/// Latencies of the operations that passed, and the phase's wall time.
pub type Timings = (Vec<Duration>, Duration);

/// Pod create bodies in the form each client sends.
pub enum Bodies {
    Json(Vec<Bytes>),
    Typed(Vec<Pod>),
}

/// The client of the pod workload.
pub enum Load {
    Https {
        target: https::Target,
        /// One per worker; taken by a phase and given back after it.
        conns: Vec<Conn>,
    },
    Kube(kube::Client),
}

impl Load {
    pub async fn https(target: https::Target, concurrency: usize) -> anyhow::Result<Load> {
        let mut conns: Vec<Conn> = Vec::with_capacity(concurrency);
        while conns.len() < concurrency {
            match conns.first().and_then(Conn::share) {
                Some(c) => conns.push(c),
                None => conns.push(target.connect().await?),
            }
        }
        Ok(Load::Https { target, conns })
    }

    async fn run(
        &mut self,
        n: usize,
        call: impl Fn(usize) -> Call + Send + Sync + 'static,
        check: impl Fn(usize, http::StatusCode, &[u8]) -> anyhow::Result<()> + Send + Sync + 'static,
    ) -> Timings {
        let Load::Https { conns, .. } = self else {
            unreachable!("run drives the HTTPS client only")
        };
        let (call, check) = (Arc::new(call), Arc::new(check));
        let (timings, back) = drive(std::mem::take(conns), n, move |mut conn, i| {
            let (call, check) = (call.clone(), check.clone());
            async move {
                let r = match https::send(&mut conn, call(i)).await {
                    Ok((status, body)) => check(i, status, &body),
                    Err(e) => Err(e),
                };
                (conn, r)
            }
        })
        .await;
        *conns = back;
        timings
    }

    /// `n` `GET /version`: the cheapest authenticated request, so what
    /// every API call pays for TLS, HTTP, authentication and routing
    /// before it does any work of its own.
    pub async fn floor(&mut self, n: usize, concurrency: usize) -> Timings {
        match self {
            Load::Https { .. } => {
                self.run(
                    n,
                    |_| Call {
                        method: Method::GET,
                        path: "/version".to_string(),
                        body: None,
                    },
                    |_, status, body| {
                        https::expect_status(status, 200, body)?;
                        let v: Value = serde_json::from_slice(body)?;
                        ensure!(v["gitVersion"].is_string(), "no gitVersion in {v}");
                        Ok(())
                    },
                )
                .await
            }
            Load::Kube(client) => {
                let client = client.clone();
                drive_stateless(n, concurrency, move |_| {
                    let client = client.clone();
                    async move {
                        client.apiserver_version().await?;
                        Ok(())
                    }
                })
                .await
            }
        }
    }

    /// Request bodies of pods `first..first + n`, built before the clock
    /// (and the CPU counters) start.
    pub fn bodies(&self, first: usize, n: usize) -> Bodies {
        let range = first..first + n;
        match self {
            Load::Https { .. } => Bodies::Json(
                range
                    .map(|i| Bytes::from(serde_json::to_vec(&pod_json(i)).unwrap_or_default()))
                    .collect(),
            ),
            Load::Kube(_) => Bodies::Typed(
                range
                    .filter_map(|i| serde_json::from_value(pod_json(i)).ok())
                    .collect(),
            ),
        }
    }

    /// Create pods `first..`, one per body of [`Load::bodies`]`(first, _)`.
    pub async fn creates(&mut self, first: usize, bodies: Bodies, concurrency: usize) -> Timings {
        match (self, bodies) {
            (this @ Load::Https { .. }, Bodies::Json(bodies)) => {
                let n = bodies.len();
                let bodies = Arc::new(bodies);
                this.run(
                    n,
                    move |i| Call {
                        method: Method::POST,
                        path: PODS.to_string(),
                        body: Some(bodies[i].clone()),
                    },
                    move |i, status, body| {
                        https::expect_status(status, 201, body)?;
                        check_object(body, &pod_name(first + i))
                    },
                )
                .await
            }
            (Load::Kube(client), Bodies::Typed(pods)) => {
                let n = pods.len();
                let pods = Arc::new(pods);
                drive_pods(client, n, concurrency, move |api, i| {
                    let pods = pods.clone();
                    async move {
                        let p = api.create(&PostParams::default(), &pods[i]).await?;
                        ensure!(
                            p.metadata.resource_version.is_some(),
                            "created pod has no resourceVersion"
                        );
                        Ok(())
                    }
                })
                .await
            }
            _ => unreachable!("bodies come from the same client's `bodies`"),
        }
    }

    /// `n` gets spread over the `pods` created.
    pub async fn gets(&mut self, n: usize, pods: usize, concurrency: usize) -> Timings {
        let pick = move |i: usize| pod_name((i * 7919) % pods.max(1));
        match self {
            Load::Https { .. } => {
                self.run(
                    n,
                    move |i| Call {
                        method: Method::GET,
                        path: format!("{PODS}/{}", pick(i)),
                        body: None,
                    },
                    move |i, status, body| {
                        https::expect_status(status, 200, body)?;
                        check_object(body, &pick(i))
                    },
                )
                .await
            }
            Load::Kube(client) => {
                drive_pods(client, n, concurrency, move |api, i| async move {
                    let p = api.get(&pick(i)).await?;
                    ensure!(p.metadata.resource_version.is_some(), "no resourceVersion");
                    Ok(())
                })
                .await
            }
        }
    }

    /// `n` first pages of 100 with a label selector (what controllers do).
    pub async fn lists(&mut self, n: usize, concurrency: usize) -> Timings {
        const LIMIT: usize = 100;
        match self {
            Load::Https { .. } => {
                self.run(
                    n,
                    |i| Call {
                        method: Method::GET,
                        path: format!("{PODS}?labelSelector=shard%3D{}&limit={LIMIT}", shard(i)),
                        body: None,
                    },
                    |i, status, body| {
                        https::expect_status(status, 200, body)?;
                        check_list(&serde_json::from_slice(body)?, Some(&shard(i)), LIMIT)
                    },
                )
                .await
            }
            Load::Kube(client) => {
                drive_pods(client, n, concurrency, move |api, i| async move {
                    let lp = ListParams::default()
                        .labels(&format!("shard={}", shard(i)))
                        .limit(LIMIT as u32);
                    let l = api.list(&lp).await?;
                    ensure!(l.items.len() <= LIMIT, "page past its limit");
                    Ok(())
                })
                .await
            }
        }
    }

    /// One list of every pod: (items, latency).
    pub async fn full_list(&mut self) -> anyhow::Result<(usize, Duration)> {
        let t = Instant::now();
        let items = match self {
            Load::Https { target, .. } => {
                let mut conn = target.connect().await?;
                let t = Instant::now();
                let (status, body) = https::send(
                    &mut conn,
                    Call {
                        method: Method::GET,
                        path: PODS.to_string(),
                        body: None,
                    },
                )
                .await?;
                https::expect_status(status, 200, &body)?;
                let l: List = serde_json::from_slice(&body)?;
                check_list(&l, None, 0)?;
                return Ok((l.items.len(), t.elapsed()));
            }
            Load::Kube(client) => pods_api(client)
                .list(&ListParams::default())
                .await?
                .items
                .len(),
        };
        Ok((items, t.elapsed()))
    }
}

/// Run `n` operations, one worker per element of `workers` (so their
/// number is the concurrency); `op(worker, i)` is operation `i` and hands
/// its worker back. Returns the latency of every operation that succeeded,
/// the wall time, and the workers.
pub async fn drive<S, F, Fut>(workers: Vec<S>, n: usize, op: F) -> (Timings, Vec<S>)
where
    S: Send + 'static,
    F: Fn(S, usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = (S, anyhow::Result<()>)> + Send,
{
    let op = Arc::new(op);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = workers
        .into_iter()
        .map(|mut worker| {
            let (op, next) = (op.clone(), next.clone());
            tokio::spawn(async move {
                let mut lat = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return (lat, worker);
                    }
                    let t = Instant::now();
                    let (w, r) = op(worker, i).await;
                    worker = w;
                    match r {
                        Ok(()) => lat.push(t.elapsed()),
                        Err(e) => eprintln!("operation {i} failed: {e:#}"),
                    }
                }
            })
        })
        .collect();
    let mut all = Vec::with_capacity(n);
    let mut back = Vec::new();
    for t in tasks {
        if let Ok((lat, worker)) = t.await {
            all.extend(lat);
            back.push(worker);
        }
    }
    ((all, started.elapsed()), back)
}

/// [`drive_stateless`] over the pods API of `client`: `op(api, i)`.
async fn drive_pods<F, Fut>(client: &kube::Client, n: usize, concurrency: usize, op: F) -> Timings
where
    F: Fn(Api<Pod>, usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send,
{
    let api = pods_api(client);
    drive_stateless(n, concurrency, move |i| op(api.clone(), i)).await
}

/// [`drive`] with `concurrency` stateless workers.
pub async fn drive_stateless<F, Fut>(n: usize, concurrency: usize, op: F) -> Timings
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send,
{
    drive(vec![(); concurrency], n, move |(), i| {
        let f = op(i);
        async move { ((), f.await) }
    })
    .await
    .0
}
