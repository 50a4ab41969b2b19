//! This server's etcd member: the `etcd` process with its flags, started
//! and restarted when it exits (with a growing pause), stopped with the
//! server. Its output goes to `DATA_DIR/etcd.log`.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{Error, Layout};

/// How the member is started.
#[derive(Debug, Clone)]
pub struct Launch {
    pub name: String,
    pub layout: Layout,
    pub client_url: String,
    pub peer_url: String,
    /// `--initial-cluster`: `NAME=PEER_URL,...` (read only on the first
    /// start; afterwards the member knows its cluster).
    pub initial_cluster: String,
    /// `new` for the first member, `existing` for a joining one.
    pub initial_state: &'static str,
    /// Start a new one-member cluster from the member's data (etcd's
    /// `--force-new-cluster`, for a reset).
    pub force_new_cluster: bool,
}

impl Launch {
    fn args(&self) -> Vec<String> {
        let l = &self.layout;
        let path = |p: &PathBuf| p.display().to_string();
        // A server bound to loopback advertises loopback: listen once.
        let listen = if self.client_url == l.local_client_url() {
            self.client_url.clone()
        } else {
            format!("{},{}", l.local_client_url(), self.client_url)
        };
        let mut args = vec![
            ("name", self.name.clone()),
            ("data-dir", path(&l.etcd_dir)),
            ("listen-client-urls", listen),
            ("advertise-client-urls", self.client_url.clone()),
            ("listen-peer-urls", self.peer_url.clone()),
            ("initial-advertise-peer-urls", self.peer_url.clone()),
            ("initial-cluster", self.initial_cluster.clone()),
            ("initial-cluster-state", self.initial_state.to_string()),
            ("cert-file", path(&l.member_cert)),
            ("key-file", path(&l.member_key)),
            ("trusted-ca-file", path(&l.ca_cert)),
            ("client-cert-auth", "true".into()),
            ("peer-cert-file", path(&l.member_cert)),
            ("peer-key-file", path(&l.member_key)),
            ("peer-trusted-ca-file", path(&l.ca_cert)),
            ("peer-client-cert-auth", "true".into()),
            // Upstream kube-apiserver's etcd sizing: the API server
            // compacts, etcd need not.
            ("quota-backend-bytes", (8u64 << 30).to_string()),
            ("snapshot-count", "10000".into()),
        ];
        // Debian's etcd 3.4 logs with zap only when asked.
        args.push(("logger", "zap".into()));
        if self.force_new_cluster {
            args.push(("force-new-cluster", "true".into()));
        }
        args.into_iter()
            .map(|(k, v)| format!("--{k}={v}"))
            .collect()
    }

    fn spawn(&self) -> Result<Child, Error> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.layout.log)
            .map_err(|e| Error::Io(format!("opening {}: {e}", self.layout.log.display())))?;
        let err = log
            .try_clone()
            .map_err(|e| Error::Io(format!("etcd log: {e}")))?;
        Command::new("etcd")
            .args(self.args())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| Error::Io(format!("starting etcd (install etcd-server): {e}")))
    }
}

/// The running member; [`Member::stop`] ends it.
pub struct Member {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Member {
    /// Start the member and keep it running.
    ///
    /// # Errors
    /// The first start fails (no `etcd` binary, no log file).
    pub fn start(launch: Launch) -> Result<Member, Error> {
        let first = launch.spawn()?;
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut child = first;
            let mut pause = Duration::from_secs(1);
            loop {
                tokio::select! {
                    status = child.wait() => {
                        tracing::warn!(
                            status = ?status,
                            log = %launch.layout.log.display(),
                            "etcd exited; starting it again in {pause:?}"
                        );
                        tokio::select! {
                            () = tokio::time::sleep(pause) => {}
                            _ = stopped.changed() => return,
                        }
                        pause = (pause * 2).min(Duration::from_secs(10));
                        match launch.spawn() {
                            Ok(c) => child = c,
                            Err(e) => tracing::error!("{e}"),
                        }
                    }
                    _ = stopped.changed() => {
                        terminate(&mut child).await;
                        return;
                    }
                }
            }
        });
        Ok(Member { stop, task })
    }

    /// Stop etcd (SIGTERM, then SIGKILL after 10 s) and wait for it.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

async fn terminate(child: &mut Child) {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    if tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
}
