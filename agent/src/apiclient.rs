//! The agent's API client, built from `--kubeconfig`, whose credentials
//! can be swapped while it is in use.
//!
//! Every part of the agent holds a clone of one [`kube::Client`]. Its
//! transport is a [`Swap`]: each request goes to the *current* inner
//! client, built from the kubeconfig (and the certificate files it names).
//! When certificate rotation has written a new certificate,
//! [`Reloader::reload`] builds a new inner client and swaps it in: new
//! requests handshake with the new certificate, requests in flight (long
//! watches) finish on the old connection, which closes once they end.
//! Nothing is restarted: not the process, not a pod, not a watch.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};

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

/// Rebuilds the inner client from the kubeconfig (see the module docs).
#[derive(Clone)]
pub struct Reloader {
    path: PathBuf,
    current: Arc<RwLock<kube::Client>>,
}

impl Reloader {
    /// Build a client from the kubeconfig again and use it from now on.
    ///
    /// # Errors
    /// The kubeconfig or its files are unreadable or invalid; the current
    /// client stays in use.
    pub async fn reload(&self) -> Result<(), Error> {
        let fresh = build(&self.path).await?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = fresh;
        tracing::info!(kubeconfig = %self.path.display(), "API client credentials reloaded");
        Ok(())
    }

    /// The kubeconfig it reads.
    pub fn kubeconfig(&self) -> &Path {
        &self.path
    }
}

/// A client from the kubeconfig at `path` (its current context).
///
/// # Errors
/// Unreadable or invalid kubeconfig.
pub async fn from_kubeconfig(path: &Path) -> Result<ApiClient, Error> {
    let inner = build(path).await?;
    let default_ns = inner.default_namespace().to_string();
    let current = Arc::new(RwLock::new(inner));
    let client = kube::Client::new(
        Swap {
            current: current.clone(),
        },
        default_ns,
    );
    Ok(ApiClient {
        client,
        reloader: Reloader {
            path: path.to_owned(),
            current,
        },
    })
}

async fn build(path: &Path) -> Result<kube::Client, Error> {
    // kube's rustls client needs the process-wide crypto provider chosen.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let p = || path.display().to_string();
    let kc = kube::config::Kubeconfig::read_from(path)
        .map_err(|source| Error::Read { path: p(), source })?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|source| Error::Config { path: p(), source })?;
    kube::Client::try_from(cfg).map_err(|source| Error::Client { path: p(), source })
}

/// The transport of the shared client: forwards each request to the
/// current inner client.
#[derive(Clone)]
struct Swap {
    current: Arc<RwLock<kube::Client>>,
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
        let inner = self
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        Box::pin(async move { inner.send(req).await })
    }
}
