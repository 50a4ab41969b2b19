//! The agent's API client, built from `--kubeconfig`, whose credentials
//! can be swapped while it is in use, and which moves to another API
//! server when its own stops answering.
//!
//! Every part of the agent holds a clone of one [`kube::Client`]. Its
//! transport is a [`Swap`]: each request goes to the *current* inner
//! client, built from the kubeconfig (and the certificate files it names).
//! When certificate rotation has written a new certificate,
//! [`Reloader::reload`] builds a new inner client and swaps it in: new
//! requests handshake with the new certificate, requests in flight (long
//! watches) finish on the old connection, which closes once they end.
//! Nothing is restarted: not the process, not a pod, not a watch.
//!
//! There is one inner client per API server: the kubeconfig's, and every
//! other that `default/kubernetes` lists (each server publishes its
//! address there). Requests go to one of them; [`balance`] checks it and
//! moves requests to another when it stops being ready, so an agent
//! outlives the loss of its server (watches on it end, and their retries
//! reach the new one).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use kube::client::Body;

/// Why no client could be built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading kubeconfig {path}: {source} (pass the node's kubeconfig with --kubeconfig, or join with `skiff-agent join`)")]
    Read {
        path: String,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("kubeconfig {path} is not usable: {source}")]
    Config {
        path: String,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("building the API client from {path}: {source}")]
    Client {
        path: String,
        #[source]
        source: kube::Error,
    },
}

/// The client every part of the agent shares, and the handle that swaps
/// its credentials.
pub struct ApiClient {
    pub client: kube::Client,
    pub reloader: Reloader,
}

impl ApiClient {
    /// The servers it knows, the one in use first.
    pub fn servers(&self) -> Vec<String> {
        let pool = read(&self.reloader.pool);
        let mut out: Vec<String> = vec![pool.servers[pool.active].url.clone()];
        out.extend(
            pool.servers
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != pool.active)
                .map(|(_, s)| s.url.clone()),
        );
        out
    }
}

/// One API server and the client that talks to it.
#[derive(Clone)]
struct Server {
    url: String,
    client: kube::Client,
}

/// Every server known, and the one requests go to.
struct Pool {
    /// The kubeconfig's server first; the others as `default/kubernetes`
    /// lists them.
    servers: Vec<Server>,
    active: usize,
}

fn read(p: &RwLock<Pool>) -> std::sync::RwLockReadGuard<'_, Pool> {
    p.read().unwrap_or_else(|e| e.into_inner())
}

fn write(p: &RwLock<Pool>) -> std::sync::RwLockWriteGuard<'_, Pool> {
    p.write().unwrap_or_else(|e| e.into_inner())
}

/// Rebuilds the inner clients from the kubeconfig (see the module docs).
#[derive(Clone)]
pub struct Reloader {
    path: PathBuf,
    pool: Arc<RwLock<Pool>>,
}

impl Reloader {
    /// Build the clients from the kubeconfig again and use them from now on.
    ///
    /// # Errors
    /// The kubeconfig or its files are unreadable or invalid; the current
    /// clients stay in use.
    pub async fn reload(&self) -> Result<(), Error> {
        let urls: Vec<String> = read(&self.pool)
            .servers
            .iter()
            .map(|s| s.url.clone())
            .collect();
        let base = config(&self.path).await?;
        let mut fresh = Vec::with_capacity(urls.len());
        for url in urls {
            fresh.push(server(&self.path, &base, url)?);
        }
        // Servers learned meanwhile keep their clients (as new as these).
        let mut pool = write(&self.pool);
        for s in &mut pool.servers {
            if let Some(f) = fresh.iter().find(|f| f.url == s.url) {
                s.client = f.client.clone();
            }
        }
        drop(pool);
        tracing::info!(kubeconfig = %self.path.display(), "API client credentials reloaded");
        Ok(())
    }

    /// The kubeconfig it reads.
    pub fn kubeconfig(&self) -> &Path {
        &self.path
    }
}

/// A client from the kubeconfig at `path` (its current context), which
/// moves to another API server when its own stops answering (see
/// [`balance`]).
///
/// # Errors
/// Unreadable or invalid kubeconfig.
pub async fn from_kubeconfig(path: &Path) -> Result<ApiClient, Error> {
    let base = config(path).await?;
    let url = base.cluster_url.to_string();
    let first = server(path, &base, url.trim_end_matches('/').to_string())?;
    let default_ns = first.client.default_namespace().to_string();
    let pool = Arc::new(RwLock::new(Pool {
        servers: vec![first],
        active: 0,
    }));
    let client = kube::Client::new(Swap { pool: pool.clone() }, default_ns);
    tokio::spawn(balance(Arc::downgrade(&pool), path.to_owned()));
    Ok(ApiClient {
        client,
        reloader: Reloader {
            path: path.to_owned(),
            pool,
        },
    })
}

async fn config(path: &Path) -> Result<kube::Config, Error> {
    // kube's rustls client needs the process-wide crypto provider chosen.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let p = || path.display().to_string();
    let kc = kube::config::Kubeconfig::read_from(path)
        .map_err(|source| Error::Read { path: p(), source })?;
    let mut cfg =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|source| Error::Config { path: p(), source })?;
    // The API server records the agent's writes under this name
    // (managedFields), as the kubelet's are under `kubelet`.
    let agent = format!("kubelet/{}", crate::node::facts::AGENT_VERSION);
    if let Ok(v) = http::HeaderValue::from_str(&agent) {
        cfg.headers.push((http::header::USER_AGENT, v));
    }
    Ok(cfg)
}

/// A client for `url` with the kubeconfig's credentials and CA (every
/// server's certificate is signed by the cluster CA for its own address).
fn server(path: &Path, base: &kube::Config, url: String) -> Result<Server, Error> {
    let mut cfg = base.clone();
    cfg.cluster_url = url
        .parse()
        .map_err(|e: http::uri::InvalidUri| Error::Client {
            path: path.display().to_string(),
            source: kube::Error::Service(Box::new(e)),
        })?;
    let client = kube::Client::try_from(cfg).map_err(|source| Error::Client {
        path: path.display().to_string(),
        source,
    })?;
    Ok(Server { url, client })
}

/// How often the server in use is checked, and the servers listed.
const CHECK_EVERY: Duration = Duration::from_secs(2);
/// How long a server has to answer `/readyz`.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// The client-side load balancer (k3s's agent load balancer, in the
/// client): every [`CHECK_EVERY`] the server in use is asked `/readyz`;
/// when it fails, requests move to the first other server that answers.
/// The servers are the kubeconfig's and those `default/kubernetes` lists.
/// Ends when the client is dropped.
async fn balance(pool: std::sync::Weak<RwLock<Pool>>, path: PathBuf) {
    let mut tick = tokio::time::interval(CHECK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(pool) = pool.upgrade() else { return };
        let (active, servers) = {
            let p = read(&pool);
            (p.active, p.servers.clone())
        };
        if !ready(&servers[active].client).await {
            let mut moved = false;
            for d in 1..servers.len() {
                let to = &servers[(active + d) % servers.len()];
                if ready(&to.client).await {
                    let mut p = write(&pool);
                    if let Some(i) = p.servers.iter().position(|s| s.url == to.url) {
                        p.active = i;
                        tracing::warn!(from = %servers[active].url, to = %to.url, "API server not ready: using another");
                        moved = true;
                    }
                    break;
                }
            }
            if !moved {
                continue;
            }
        }
        let client = {
            let p = read(&pool);
            p.servers[p.active].client.clone()
        };
        if let Ok(urls) = listed(&client).await {
            learn(&pool, &path, urls).await;
        }
    }
}

async fn ready(client: &kube::Client) -> bool {
    let Ok(req) = http::Request::get("/readyz").body(Vec::new()) else {
        return false;
    };
    matches!(
        tokio::time::timeout(CHECK_TIMEOUT, client.request_text(req)).await,
        Ok(Ok(_))
    )
}

/// The API servers `default/kubernetes` lists, as URLs.
async fn listed(client: &kube::Client) -> Result<Vec<String>, kube::Error> {
    let eps: kube::Api<k8s_openapi::api::core::v1::Endpoints> =
        kube::Api::namespaced(client.clone(), "default");
    let ep = eps.get("kubernetes").await?;
    let mut urls = Vec::new();
    for subset in ep.subsets.unwrap_or_default() {
        let port = subset
            .ports
            .unwrap_or_default()
            .iter()
            .find(|p| p.name.as_deref() == Some("https"))
            .map(|p| p.port);
        let Some(port) = port else { continue };
        for a in subset.addresses.unwrap_or_default() {
            let host = match a.ip.parse::<std::net::IpAddr>() {
                Ok(std::net::IpAddr::V6(v6)) => format!("[{v6}]"),
                _ => a.ip.clone(),
            };
            urls.push(format!("https://{host}:{port}"));
        }
    }
    Ok(urls)
}

/// Add the servers `urls` names that the pool lacks; drop the learned
/// ones no longer listed (never the kubeconfig's, nor the one in use).
async fn learn(pool: &RwLock<Pool>, path: &Path, urls: Vec<String>) {
    let (have, active_url) = {
        let p = read(pool);
        let have: Vec<String> = p.servers.iter().map(|s| s.url.clone()).collect();
        (have, p.servers[p.active].url.clone())
    };
    let missing: Vec<&String> = urls.iter().filter(|u| !have.contains(u)).collect();
    let stale = have
        .iter()
        .skip(1)
        .any(|u| !urls.contains(u) && *u != active_url);
    if missing.is_empty() && !stale {
        return;
    }
    let Ok(base) = config(path).await else { return };
    let mut added = Vec::new();
    for url in missing {
        match server(path, &base, url.clone()) {
            Ok(s) => added.push(s),
            Err(e) => tracing::warn!(url = %url, "API server listed but unusable: {e}"),
        }
    }
    let mut p = write(pool);
    let active = p.servers[p.active].url.clone();
    let first = p.servers[0].url.clone();
    p.servers
        .retain(|s| s.url == first || s.url == active || urls.contains(&s.url));
    for s in added {
        tracing::info!(url = %s.url, "API server learned");
        p.servers.push(s);
    }
    p.active = p.servers.iter().position(|s| s.url == active).unwrap_or(0);
}

/// The transport of the shared client: forwards each request to the
/// client of the server in use.
#[derive(Clone)]
struct Swap {
    pool: Arc<RwLock<Pool>>,
}

impl tower::Service<Request<Body>> for Swap {
    type Response = Response<Body>;
    type Error = kube::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, kube::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Each inner client queues on its own buffer.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let inner = {
            let p = read(&self.pool);
            p.servers[p.active].client.clone()
        };
        Box::pin(async move { inner.send(req).await })
    }
}
