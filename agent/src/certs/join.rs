//! `skiff-agent join`: from a join token to a kubeconfig, with the key
//! made here and the CA pinned by the token.
//!
//! 1. The config directory must not hold a kubeconfig yet.
//! 2. The CA is fetched and checked against the token's hash
//!    ([`discovery`](skiff_bootstrap::discovery)); a mismatch stops here, before any
//!    credential is sent.
//! 3. A key and a node client CSR (`system:node:<name>`) are made; the
//!    request goes to the API authenticated by the bootstrap token, and
//!    the node waits for the approved certificate.
//! 4. Only then is anything written: the certificate and key, and last the
//!    kubeconfig (its presence is what "joined" means). A failure while
//!    writing removes what was written.

use std::path::{Path, PathBuf};
use std::time::Duration;

use skiff_bootstrap::{csr, discovery, names, JoinToken};

use super::files::{self, Pair};
use super::request;

/// Why the node did not join.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A kubeconfig is already there.
    #[error("this node has already joined a cluster as {node:?} (kubeconfig {path}); run `skiff-agent uninstall --purge`, or remove {dir}, to join again")]
    AlreadyJoined {
        node: String,
        path: PathBuf,
        dir: PathBuf,
    },
    /// The token does not parse.
    #[error("invalid join token: {0}")]
    Token(#[from] skiff_bootstrap::token::Error),
    /// Not a valid node name.
    #[error("invalid node name {0:?}: use lowercase letters, digits, '-' and '.' (a DNS subdomain), or pass --node-name")]
    NodeName(String),
    #[error(transparent)]
    Discovery(#[from] discovery::Error),
    #[error(transparent)]
    Request(#[from] request::Error),
    /// rcgen failed.
    #[error(transparent)]
    Csr(#[from] csr::Error),
    /// The bootstrap client could not be built.
    #[error("building the bootstrap API client: {0}")]
    Client(#[from] kube::Error),
    /// Writing the credentials failed (nothing is left behind).
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What to join, and where to keep the result.
#[derive(Debug, Clone)]
pub struct JoinOptions {
    /// `https://HOST:PORT` of the API server, or several, comma-separated:
    /// the first that answers is joined through.
    pub server: String,
    /// The join token (`K10<hash>::<id>.<secret>`).
    pub token: String,
    pub node_name: String,
    /// Where the kubeconfig and the client certificate go.
    pub config_dir: PathBuf,
    /// Longest wait for the server and for the approval.
    pub timeout: Duration,
}

/// A joined node.
#[derive(Debug, Clone)]
pub struct Joined {
    pub kubeconfig: PathBuf,
    pub node_name: String,
}

/// The kubeconfig a join writes into `config_dir`.
pub fn kubeconfig_path(config_dir: &Path) -> PathBuf {
    config_dir.join(files::KUBECONFIG)
}

/// The client certificate file a join writes into `config_dir`.
pub fn client_pem_path(config_dir: &Path) -> PathBuf {
    config_dir.join(files::PKI_DIR).join(files::CLIENT_PEM)
}

fn valid_node_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 253
        && n.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// Join the cluster.
///
/// # Errors
/// See [`Error`]; on any error nothing is left in the config directory.
pub async fn join(o: &JoinOptions) -> Result<Joined, Error> {
    let kubeconfig = kubeconfig_path(&o.config_dir);
    if kubeconfig.exists() {
        return Err(Error::AlreadyJoined {
            node: files::node_name_of(&kubeconfig).unwrap_or_else(|| "<unknown>".into()),
            path: kubeconfig,
            dir: o.config_dir.clone(),
        });
    }
    let token = JoinToken::parse(&o.token)?;
    if !valid_node_name(&o.node_name) {
        return Err(Error::NodeName(o.node_name.clone()));
    }
    let (server, ca) = first_pinned(&o.server, &token, o.timeout).await?;
    tracing::info!(server = %server, "cluster CA matches the join token");
    let client = bootstrap_client(&server, &ca, &token)?;
    let req = csr::new_node_client(&o.node_name)?;
    let pair = request::obtain(
        &client,
        names::SIGNER_KUBELET_CLIENT,
        req,
        csr::NODE_CLIENT_USAGES,
        o.timeout,
    )
    .await?;
    write_credentials(o, &server, &ca, &pair)?;
    tracing::info!(node = %o.node_name, kubeconfig = %kubeconfig.display(), "joined the cluster");
    Ok(Joined {
        kubeconfig,
        node_name: o.node_name.clone(),
    })
}

/// The first of `servers` (comma-separated) that serves the CA the token
/// pins, and that CA. An unreachable server is passed over; one serving
/// another CA stops the join (nothing is sent to it, and a wrong token or
/// a wrong server is for the operator to fix, not to work around).
async fn first_pinned(
    servers: &str,
    token: &JoinToken,
    timeout: Duration,
) -> Result<(String, String), Error> {
    let mut last = None;
    for s in servers.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let server = discovery::normalize(s)?;
        match discovery::fetch_pinned_ca(&server, token, timeout).await {
            Ok(ca) => return Ok((server, ca)),
            Err(e @ discovery::Error::Mismatch { .. }) => return Err(e.into()),
            Err(e) => {
                tracing::warn!(server = %server, "{e}");
                last = Some(e);
            }
        }
    }
    Err(last
        .unwrap_or_else(|| discovery::Error::BadServer(servers.to_string()))
        .into())
}

/// A client that trusts `ca` and authenticates with the bootstrap token.
fn bootstrap_client(server: &str, ca_pem: &str, token: &JoinToken) -> Result<kube::Client, Error> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    // kube's rustls client needs the process-wide crypto provider chosen.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let url = server
        .parse()
        .map_err(|_| discovery::Error::BadServer(server.to_string()))?;
    let mut cfg = kube::Config::new(url);
    cfg.root_cert = Some(
        CertificateDer::pem_slice_iter(ca_pem.as_bytes())
            .filter_map(|c| c.ok())
            .map(|c| c.to_vec())
            .collect(),
    );
    cfg.auth_info.token = Some(token.token.expose().into());
    Ok(kube::Client::try_from(cfg)?)
}

fn write_credentials(o: &JoinOptions, server: &str, ca: &str, pair: &Pair) -> Result<(), Error> {
    let pem = client_pem_path(&o.config_dir);
    let kubeconfig = kubeconfig_path(&o.config_dir);
    let created_dir = !o.config_dir.exists();
    let result = pair
        .write(&pem)
        .map_err(|source| Error::Write {
            path: pem.clone(),
            source,
        })
        .and_then(|()| {
            let text = files::kubeconfig_text(server, ca, &pem, &o.node_name);
            files::write_private(&kubeconfig, text.as_bytes()).map_err(|source| Error::Write {
                path: kubeconfig.clone(),
                source,
            })
        });
    if result.is_err() {
        let _ = std::fs::remove_file(&pem);
        let _ = std::fs::remove_file(&kubeconfig);
        if created_dir {
            let _ = std::fs::remove_dir_all(&o.config_dir);
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(dir: &Path, token: &str, node: &str) -> JoinOptions {
        JoinOptions {
            server: "https://127.0.0.1:1".into(),
            token: token.into(),
            node_name: node.into(),
            config_dir: dir.to_owned(),
            timeout: Duration::from_secs(1),
        }
    }

    /// A list of servers is tried in turn past unreachable ones; a server
    /// serving another CA stops the join even when a good one follows.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn servers_are_tried_in_turn_until_one_serves_the_pinned_ca() {
        use skiff_control_plane::testkit::TestServer;
        let ours = TestServer::start().await;
        let other = TestServer::start().await;
        let ca = skiff_control_plane::pki::Pki::load_or_create(&ours.cfg.data_dir).unwrap();
        let hash = skiff_bootstrap::token::ca_hash(ca.ca_pem().as_bytes());
        let token = JoinToken::parse(&format!("K10{hash}::abcdef.0123456789abcdef")).unwrap();
        let t = Duration::from_secs(5);
        let list = format!("https://127.0.0.1:1, {}", ours.url());
        let (server, served) = first_pinned(&list, &token, t).await.unwrap();
        assert_eq!(server, ours.url());
        assert_eq!(served, ca.ca_pem());
        let list = format!("{},{}", other.url(), ours.url());
        let e = first_pinned(&list, &token, t).await.unwrap_err();
        assert!(e.to_string().contains("does not match"), "{e}");
        let e = first_pinned("https://127.0.0.1:1", &token, t)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("cannot reach the API server"), "{e}");
    }

    #[tokio::test]
    async fn refusals_before_any_contact_leave_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("agent");
        let e = join(&opts(&cfg, "abcdef.0123456789abcdef", "n1"))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Token(_)), "{e}");
        assert!(e.to_string().contains("carries no CA hash"), "{e}");
        let full = format!("K10{}::abcdef.0123456789abcdef", "0".repeat(64));
        let e = join(&opts(&cfg, &full, "Bad_Name")).await.unwrap_err();
        assert!(matches!(e, Error::NodeName(_)), "{e}");
        // Port 1 on loopback: nothing listens.
        let e = join(&opts(&cfg, &full, "n1")).await.unwrap_err();
        assert!(e.to_string().contains("cannot reach the API server"), "{e}");
        assert!(!cfg.exists(), "no partial state");
        std::fs::create_dir_all(&cfg).unwrap();
        std::fs::write(cfg.join("kubeconfig"), "{}").unwrap();
        let e = join(&opts(&cfg, &full, "n1")).await.unwrap_err();
        assert!(e.to_string().contains("already joined"), "{e}");
    }
}
