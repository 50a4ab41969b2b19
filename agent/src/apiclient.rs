//! The agent's API client, built from `--kubeconfig`.

use std::path::Path;

/// Why no client could be built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading kubeconfig {path}: {source} (pass the node's kubeconfig with --kubeconfig)")]
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

/// A client from the kubeconfig at `path` (its current context).
///
/// # Errors
/// Unreadable or invalid kubeconfig.
pub async fn from_kubeconfig(path: &Path) -> Result<kube::Client, Error> {
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
