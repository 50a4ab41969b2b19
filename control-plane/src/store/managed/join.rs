//! A server joining the cluster (k3s's `--server` with a server token):
//! the joiner pins the first server's CA with the token's hash (nothing
//! secret goes out before), then asks it, with the token, to add its etcd
//! member. The answer is what every server of the cluster shares: the
//! cluster CA, the front-proxy CA, the ServiceAccount signing key, the
//! etcd CA and the cluster secret, and etcd's `--initial-cluster` for the new member.
//!
//! Asking is `POST /skiff/v1/servers`, a non-resource URL (verb `post`) that RBAC
//! allows to `system:masters` and to bootstrap tokens in
//! [`SERVERS_GROUP`]: a token for agents cannot take a cluster's keys.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use skiff_bootstrap::{discovery, JoinToken};

use super::Error;
use crate::config::{Config, Join, ManagedEtcd};
use crate::pki;

/// How long a joiner asks again while etcd cannot take a member yet.
const ADD_WITHIN: Duration = Duration::from_secs(120);

/// Where joining servers ask.
pub const PATH: &str = "/skiff/v1/servers";

/// The group whose bootstrap tokens may join servers
/// (`skiff-server token create --groups system:bootstrappers:skiff:servers`).
pub const SERVERS_GROUP: &str = "system:bootstrappers:skiff:servers";

/// The files every server shares, by their name under `DATA_DIR/pki`
/// (the ServiceAccount key goes where `--service-account-signing-key-file`
/// says).
pub(super) const SHARED: [&str; 8] = [
    "ca.crt",
    "ca.key",
    "front-proxy-ca.crt",
    "front-proxy-ca.key",
    "etcd-ca.crt",
    "etcd-ca.key",
    SERVICE_ACCOUNT_KEY,
    super::bootstrap::SECRET_FILE,
];
const SERVICE_ACCOUNT_KEY: &str = "service-account.key";

/// What a joining server sends.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Request {
    pub name: String,
    pub peer_url: String,
}

/// What it is sent back.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Bundle {
    /// [`SHARED`] file name -> content.
    pub files: BTreeMap<String, String>,
    /// etcd's `--initial-cluster` for the new member.
    pub initial_cluster: String,
}

/// What the first server needs to answer joins: set when it runs a
/// managed member.
#[derive(Debug, Clone)]
pub struct Source {
    pub data_dir: PathBuf,
    pub service_account_key: PathBuf,
    pub etcd: super::Etcd,
}

fn shared_path(data_dir: &Path, service_account_key: &Path, name: &str) -> PathBuf {
    if name == SERVICE_ACCOUNT_KEY {
        service_account_key.to_path_buf()
    } else {
        data_dir.join("pki").join(name)
    }
}

/// Every [`SHARED`] file by name.
///
/// # Errors
/// One cannot be read.
pub(super) fn read_shared(
    data_dir: &Path,
    service_account_key: &Path,
) -> Result<BTreeMap<String, String>, String> {
    let mut files = BTreeMap::new();
    for name in SHARED {
        let path = shared_path(data_dir, service_account_key, name);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        files.insert(name.to_string(), text);
    }
    Ok(files)
}

/// Write the [`SHARED`] files of `files` where this server keeps them;
/// every one but `except` must be there.
///
/// # Errors
/// One is missing (the message names it), or cannot be written.
pub(super) fn write_shared(
    cfg: &Config,
    files: &BTreeMap<String, String>,
    except: Option<&str>,
) -> Result<(), Error> {
    let sa_key = &cfg.service_accounts.signing_key_file;
    for name in SHARED.into_iter().filter(|n| Some(*n) != except) {
        let text = files
            .get(name)
            .ok_or_else(|| Error::Io(format!("{name} is missing")))?;
        let path = shared_path(&cfg.data_dir, sa_key, name);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::Io(format!("creating {}: {e}", dir.display())))?;
        }
        let secret = name.ends_with(".key") || name == super::bootstrap::SECRET_FILE;
        pki::write_file(&path, text, secret)?;
    }
    Ok(())
}

/// The first server's side: add the member `req` asks for and bundle
/// what it needs.
///
/// # Errors
/// A shared file cannot be read, or etcd refuses the member.
pub async fn admit(source: &Source, req: &Request) -> Result<Bundle, String> {
    if req.name.is_empty() || !req.peer_url.starts_with("https://") {
        return Err(format!(
            "a joining server needs a name and an https:// peer URL (got {:?}, {:?})",
            req.name, req.peer_url
        ));
    }
    let files = read_shared(&source.data_dir, &source.service_account_key)?;
    let initial_cluster = crate::store::etcd_members::add(
        &source.etcd.endpoints,
        Some(&source.etcd.tls),
        &req.name,
        &req.peer_url,
    )
    .await
    .map_err(|e| e.to_string())?;
    tracing::info!(member = %req.name, peer = %req.peer_url, "etcd member added for a joining server");
    Ok(Bundle {
        files,
        initial_cluster,
    })
}

/// The joiner's side: pin the CA, ask for the member, write the shared
/// files. Returns etcd's `--initial-cluster`.
///
/// # Errors
/// [`Error::Join`] saying why (wrong CA hash: nothing was sent).
pub async fn join(
    cfg: &Config,
    m: &ManagedEtcd,
    j: &Join,
    peer_url: &str,
) -> Result<String, Error> {
    let fail = |message: String| Error::Join {
        server: j.server.clone(),
        message,
    };
    let token = JoinToken::parse(&j.token).map_err(|e| fail(e.to_string()))?;
    let server = discovery::normalize(&j.server).map_err(|e| fail(e.to_string()))?;
    let ca = discovery::fetch_pinned_ca(&server, &token, Duration::from_secs(30))
        .await
        .map_err(|e| fail(e.to_string()))?;
    let root = reqwest::Certificate::from_pem(ca.as_bytes()).map_err(|e| fail(e.to_string()))?;
    let http = reqwest::Client::builder()
        .add_root_certificate(root)
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()
        .map_err(|e| fail(e.to_string()))?;
    let request = Request {
        name: m.name.clone(),
        peer_url: peer_url.to_string(),
    };
    let body = serde_json::to_vec(&request).map_err(|e| fail(e.to_string()))?;
    let started = Instant::now();
    let body = loop {
        let resp = http
            .post(format!("{server}{PATH}"))
            .bearer_auth(token.token.expose())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.clone())
            .send()
            .await
            .map_err(|e| fail(e.to_string()))?;
        let status = resp.status();
        let answer = resp.bytes().await.map_err(|e| fail(e.to_string()))?;
        if status.is_success() {
            break answer;
        }
        let message = serde_json::from_slice::<serde_json::Value>(&answer)
            .ok()
            .and_then(|v| v["message"].as_str().map(String::from))
            .unwrap_or_else(|| String::from_utf8_lossy(&answer).into_owned());
        // etcd takes a member only when every member has been connected
        // for a while (its strict reconfiguration check): a server that
        // joined a moment ago makes the next one wait.
        if status != reqwest::StatusCode::SERVICE_UNAVAILABLE || started.elapsed() > ADD_WITHIN {
            return Err(fail(format!("{status}: {message}")));
        }
        tracing::info!(server = %server, "the cluster cannot take a member yet ({message}); asking again");
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    let bundle: Bundle =
        serde_json::from_slice(&body).map_err(|e| fail(format!("unexpected answer: {e}")))?;
    if let Some(name) = SHARED.iter().find(|n| !bundle.files.contains_key(**n)) {
        return Err(fail(format!("the answer lacks {name}")));
    }
    write_shared(cfg, &bundle.files, None)?;
    tracing::info!(server = %server, "joined: the cluster's CAs and keys written");
    Ok(bundle.initial_cluster)
}
