//! Managed etcd (k3s's embedded etcd, run as Debian's real `etcd`): with
//! `--cluster-init`, or `--server` and `--token` to join, each
//! skiff-server runs one member of the cluster's etcd beside itself and
//! stores through it, every connection (peers, this server) on mutual TLS
//! from the cluster's etcd CA.
//!
//! - [`member`]: the etcd process: flags, start, restarts, stop.
//! - [`join`]: a server joining: what the first server hands out, and
//!   the joiner's side (CA pinned by the token, member added, PKI
//!   copied).
//! - [`bootstrap`]: the cluster's keys kept in etcd, sealed with the
//!   cluster secret, so that a snapshot brings back a cluster whose
//!   data directories are all gone.
//! - [`nodes`]: the Node of a server (an agent beside it under the same
//!   name) marked as control plane; deleting it removes the member.
//!
//! Files: `DATA_DIR/etcd/` (the member's data), `DATA_DIR/etcd.log`,
//! `DATA_DIR/pki/etcd-ca.{crt,key}` (shared by the cluster's servers) and
//! `DATA_DIR/pki/etcd-member.{crt,key}` (this member's, for peers,
//! clients and as this server's client certificate; issued anew at every
//! start), `DATA_DIR/pki/cluster-secret`.

pub mod bootstrap;
pub mod join;
pub mod member;
pub mod nodes;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::config::{Config, ManagedEtcd};
use crate::pki::{self, Pki};
use crate::store::etcd::Tls;

pub use member::Member;

/// Why the member could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Io(String),
    #[error(transparent)]
    Pki(#[from] pki::Error),
    #[error("joining the cluster through {server}: {message}")]
    Join { server: String, message: String },
    #[error("etcd did not answer within {0:?}; its log is {1}")]
    NotReady(Duration, String),
}

/// How long a starting member may take to answer (a joining one first
/// catches up with the cluster).
const READY_WITHIN: Duration = Duration::from_secs(90);

/// Where a member's files are.
#[derive(Debug, Clone)]
pub struct Layout {
    pub etcd_dir: PathBuf,
    pub log: PathBuf,
    pub ca_cert: PathBuf,
    pub member_cert: PathBuf,
    pub member_key: PathBuf,
    pub client_port: u16,
}

impl Layout {
    pub fn new(data_dir: &Path, client_port: u16) -> Layout {
        let pki = data_dir.join("pki");
        Layout {
            etcd_dir: data_dir.join("etcd"),
            log: data_dir.join("etcd.log"),
            ca_cert: pki.join("etcd-ca.crt"),
            member_cert: pki.join("etcd-member.crt"),
            member_key: pki.join("etcd-member.key"),
            client_port,
        }
    }

    /// The URL this server reaches its own member on.
    pub fn local_client_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.client_port)
    }

    /// Whether the data dir holds a member already: then its cluster
    /// comes from its own data, and nothing is joined again.
    pub fn has_member(&self) -> bool {
        self.etcd_dir.join("member").exists()
    }

    /// The files this server's etcd client presents and trusts.
    pub fn tls(&self) -> Tls {
        Tls {
            ca: self.ca_cert.clone(),
            cert: self.member_cert.clone(),
            key: self.member_key.clone(),
        }
    }
}

/// Where a managed-etcd server's client reaches the cluster, with the
/// files it presents.
#[derive(Debug, Clone)]
pub struct Etcd {
    pub endpoints: Vec<String>,
    pub tls: Tls,
}

impl Etcd {
    /// The cluster `cfg` stores in when it runs a managed member.
    pub fn of(cfg: &Config) -> Option<Etcd> {
        cfg.managed_etcd.as_ref()?;
        Some(Etcd {
            endpoints: cfg.datastore_endpoints.clone(),
            tls: cfg.datastore_tls.clone()?,
        })
    }
}

fn url(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(v4) => format!("https://{v4}:{port}"),
        IpAddr::V6(v6) => format!("https://[{v6}]:{port}"),
    }
}

/// Set up and start this server's member: join through `--server` the
/// first time when asked, issue its certificate, start etcd and wait
/// until it answers.
///
/// # Errors
/// The join is refused, a file cannot be written, or etcd does not come
/// up (the member is stopped again).
pub async fn start(cfg: &Config, m: &ManagedEtcd) -> Result<Member, Error> {
    let layout = Layout::new(&cfg.data_dir, m.client_port);
    std::fs::create_dir_all(&cfg.data_dir)
        .map_err(|e| Error::Io(format!("creating {}: {e}", cfg.data_dir.display())))?;
    let advertise = crate::server::advertise_ip(cfg);
    let client_url = url(advertise, m.client_port);
    let peer_url = url(advertise, m.peer_port);
    let (initial_cluster, initial_state) = match &m.join {
        Some(j) if !layout.has_member() => {
            let cluster = join::join(cfg, m, j, &peer_url).await?;
            (cluster, "existing")
        }
        _ => {
            bootstrap::ensure_secret(&cfg.data_dir, m.secret_file.as_deref())?;
            (format!("{}={peer_url}", m.name), "new")
        }
    };
    launch(
        cfg,
        m,
        advertise,
        member::Launch {
            name: m.name.clone(),
            layout,
            client_url,
            peer_url,
            initial_cluster,
            initial_state,
            force_new_cluster: false,
        },
    )
    .await
}

/// Issue the member's certificate (for `advertise`, where peers and
/// clients reach it), start it, wait until it answers.
async fn launch(
    cfg: &Config,
    m: &ManagedEtcd,
    advertise: IpAddr,
    l: member::Launch,
) -> Result<Member, Error> {
    let ca = Pki::etcd(&cfg.data_dir)?;
    let sans = [
        advertise.to_string(),
        "127.0.0.1".into(),
        "localhost".into(),
        m.name.clone(),
    ];
    let cert = ca.member_cert(&m.name, &sans)?;
    pki::write_file(&l.layout.member_cert, &cert.cert_pem, false)?;
    pki::write_file(&l.layout.member_key, &cert.key_pem, true)?;
    let layout = l.layout.clone();
    let member = Member::start(l)?;
    if let Err(e) = wait_ready(&layout).await {
        member.stop().await;
        return Err(e);
    }
    tracing::info!(member = %m.name, url = %layout.local_client_url(), "etcd member running");
    Ok(member)
}

/// `--cluster-reset` (k3s's): make this server's member the only one of
/// a new cluster, from its own data or from the snapshot `restore` (the
/// member's data, if any, is kept aside as `DATA_DIR/etcd-old-SECONDS`),
/// then stop it. A data directory without the cluster CA takes the
/// cluster's keys from the snapshot, opened with the cluster secret.
/// Returns what the operator does next.
///
/// # Errors
/// Nothing to reset from, a snapshot that is not etcd's or does not
/// restore, keys that cannot be taken, or a member that does not come up.
pub async fn reset(cfg: &Config, m: &ManagedEtcd, restore: Option<&Path>) -> Result<String, Error> {
    let layout = Layout::new(&cfg.data_dir, m.client_port);
    let advertise = crate::server::advertise_ip(cfg);
    let peer_url = url(advertise, m.peer_port);
    let pki_dir = cfg.data_dir.join("pki");
    let keys_from_snapshot = !pki_dir.join("ca.crt").exists();
    if keys_from_snapshot {
        if restore.is_none() {
            return Err(Error::Io(format!(
                "{} holds no cluster CA: a reset without a snapshot needs the server's own data",
                pki_dir.display()
            )));
        }
        if m.secret_file.is_none() && !bootstrap::secret_path(&cfg.data_dir).exists() {
            return Err(Error::Io(format!(
                "{} holds no cluster CA: the snapshot's keys open with the cluster secret; pass --cluster-secret-file (a copy of DATA_DIR/pki/cluster-secret of a server of the cluster)",
                pki_dir.display()
            )));
        }
    }
    if restore.is_some() {
        bootstrap::ensure_secret(&cfg.data_dir, m.secret_file.as_deref())?;
    }
    match restore {
        Some(file) => {
            let format = crate::store::snapshot::snapshot_format(file)
                .map_err(|e| Error::Io(e.to_string()))?;
            if format != crate::store::snapshot::SnapshotFormat::Etcd {
                return Err(Error::Io(format!(
                    "{} is not an etcd snapshot (a SQLite one restores with `skiff-server snapshot restore`)",
                    file.display()
                )));
            }
            if layout.etcd_dir.exists() {
                let aside = cfg.data_dir.join(format!(
                    "etcd-old-{}",
                    jiff::Timestamp::now().as_second()
                ));
                std::fs::rename(&layout.etcd_dir, &aside).map_err(|e| {
                    Error::Io(format!("moving {} aside: {e}", layout.etcd_dir.display()))
                })?;
                tracing::info!(to = %aside.display(), "the member's data moved aside");
            }
            let (file, dir, name, peer) = (
                file.to_path_buf(),
                layout.etcd_dir.clone(),
                m.name.clone(),
                peer_url.clone(),
            );
            tokio::task::spawn_blocking(move || {
                crate::store::snapshot::snapshot_restore_etcd(&file, &dir, &name, &peer)
            })
            .await
            .map_err(|e| Error::Io(e.to_string()))?
            .map_err(|e| Error::Io(e.to_string()))?;
        }
        None if !layout.has_member() => {
            return Err(Error::Io(format!(
                "{} holds no etcd member to reset (pass --cluster-reset-restore-path to start from a snapshot)",
                layout.etcd_dir.display()
            )))
        }
        None => {}
    }
    let member = launch(
        cfg,
        m,
        advertise,
        member::Launch {
            name: m.name.clone(),
            layout: layout.clone(),
            client_url: url(advertise, m.client_port),
            initial_cluster: format!("{}={peer_url}", m.name),
            peer_url,
            initial_state: "new",
            force_new_cluster: restore.is_none(),
        },
    )
    .await?;
    let taken = if keys_from_snapshot {
        take_keys(cfg, &layout).await
    } else {
        Ok(())
    };
    member.stop().await;
    taken?;
    Ok(format!(
        "the managed etcd cluster is reset to one member, {}: start skiff-server again without --cluster-reset.\nOn every other server, move {} aside and start it again with --server and --token: it joins anew.",
        m.name,
        layout.etcd_dir.display()
    ))
}

/// The cluster's keys from the member just restored (it runs with a
/// temporary etcd CA, which the snapshot's replaces).
async fn take_keys(cfg: &Config, layout: &Layout) -> Result<(), Error> {
    let store = crate::store::etcd::EtcdStore::connect_tls(
        &[layout.local_client_url()],
        Some(&layout.tls()),
    )
    .await
    .map_err(|e| Error::Io(e.to_string()))?;
    bootstrap::recover(cfg, &store).await
}

/// Until the member answers a status request over TLS.
async fn wait_ready(layout: &Layout) -> Result<(), Error> {
    let started = Instant::now();
    let endpoints = [layout.local_client_url()];
    let tls = layout.tls();
    while started.elapsed() < READY_WITHIN {
        if crate::store::etcd_members::member_ready(&endpoints, Some(&tls)).await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(Error::NotReady(
        READY_WITHIN,
        layout.log.display().to_string(),
    ))
}
