//! Test fixture: real etcd servers (Debian's `etcd-server`, /usr/bin/etcd)
//! on 127.0.0.1 with free ports and a temporary data directory. Dropping the
//! fixture kills the processes and removes the directory, also when the
//! test panics.
#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One etcd process.
pub struct EtcdMember {
    pub name: String,
    pub client_url: String,
    pub peer_url: String,
    pub data_dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

/// One or more etcd members forming a cluster.
pub struct EtcdCluster {
    pub members: Vec<EtcdMember>,
    /// Holds every member's data dir and log; removed on drop (after the
    /// processes are killed, see `Drop`).
    dir: tempfile::TempDir,
}

fn free_port() -> (u16, TcpListener) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a free port on 127.0.0.1");
    (l.local_addr().expect("local addr").port(), l)
}

impl EtcdMember {
    fn spawn(&mut self, initial_cluster: &str, state: &str, token: &str) {
        let log = std::fs::File::create(&self.log).expect("create etcd log file");
        let child = Command::new("/usr/bin/etcd")
            .arg("--name")
            .arg(&self.name)
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--listen-client-urls")
            .arg(&self.client_url)
            .arg("--advertise-client-urls")
            .arg(&self.client_url)
            .arg("--listen-peer-urls")
            .arg(&self.peer_url)
            .arg("--initial-advertise-peer-urls")
            .arg(&self.peer_url)
            .arg("--initial-cluster")
            .arg(initial_cluster)
            .arg("--initial-cluster-state")
            .arg(state)
            .arg("--initial-cluster-token")
            .arg(token)
            .arg("--heartbeat-interval")
            .arg("50")
            .arg("--election-timeout")
            .arg("500")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log handle"))
            .stderr(log)
            .spawn()
            .expect("start /usr/bin/etcd (Debian package etcd-server)");
        self.child = Some(child);
    }

    /// Kill this member (SIGKILL) and reap it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The member's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// etcd's `/health` answers `"health":"true"` once the member has a leader.
    fn healthy(&self) -> bool {
        use std::io::{Read, Write};
        let addr = self.client_url.trim_start_matches("http://");
        let Ok(mut s) =
            TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_millis(200))
        else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        if s.write_all(format!("GET /health HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .is_err()
        {
            return false;
        }
        let mut body = String::new();
        let _ = s.read_to_string(&mut body);
        body.contains("\"health\":\"true\"")
    }
}

impl EtcdCluster {
    /// A single etcd member.
    pub fn start() -> EtcdCluster {
        Self::start_n(1)
    }

    /// `n` members forming one cluster; returns once every member reports
    /// healthy (a leader was elected).
    pub fn start_n(n: usize) -> EtcdCluster {
        let dir = tempfile::Builder::new()
            .prefix("skiff-etcd-")
            .tempdir()
            .expect("temp dir");
        let mut reserved = Vec::new();
        let mut members: Vec<EtcdMember> = (0..n)
            .map(|i| {
                let (cp, cl) = free_port();
                let (pp, pl) = free_port();
                reserved.push((cl, pl));
                EtcdMember {
                    name: format!("m{i}"),
                    client_url: format!("http://127.0.0.1:{cp}"),
                    peer_url: format!("http://127.0.0.1:{pp}"),
                    data_dir: dir.path().join(format!("m{i}.etcd")),
                    log: dir.path().join(format!("m{i}.log")),
                    child: None,
                }
            })
            .collect();
        let initial: Vec<String> = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url))
            .collect();
        let initial = initial.join(",");
        let token = format!(
            "skiff-test-{}",
            dir.path().file_name().unwrap().to_string_lossy()
        );
        drop(reserved);
        for m in &mut members {
            m.spawn(&initial, "new", &token);
        }
        let cluster = EtcdCluster { members, dir };
        cluster.wait_healthy();
        cluster
    }

    /// One member on an existing data directory (for example one made by
    /// `etcdctl snapshot restore --name NAME --initial-advertise-peer-urls PEER`).
    pub fn start_existing(data_dir: &Path, name: &str, peer_url: &str) -> EtcdCluster {
        let dir = tempfile::Builder::new()
            .prefix("skiff-etcd-")
            .tempdir()
            .expect("temp dir");
        let (cp, cl) = free_port();
        drop(cl);
        let mut m = EtcdMember {
            name: name.to_string(),
            client_url: format!("http://127.0.0.1:{cp}"),
            peer_url: peer_url.to_string(),
            data_dir: data_dir.to_path_buf(),
            log: dir.path().join(format!("{name}.log")),
            child: None,
        };
        m.spawn(&format!("{name}={peer_url}"), "existing", "skiff-restored");
        let cluster = EtcdCluster {
            members: vec![m],
            dir,
        };
        cluster.wait_healthy();
        cluster
    }

    /// A free loopback peer URL, for restoring a member.
    pub fn free_peer_url() -> String {
        let (p, l) = free_port();
        drop(l);
        format!("http://127.0.0.1:{p}")
    }

    /// The fixture's temporary directory (removed on drop).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .filter(|m| m.is_running())
            .map(|m| m.client_url.clone())
            .collect()
    }

    fn wait_healthy(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        for m in &self.members {
            while !m.healthy() {
                if Instant::now() > deadline {
                    panic!(
                        "etcd member {} did not become healthy:\n{}",
                        m.name,
                        m.log_tail()
                    );
                }
                // Started from synchronous test set-up, before any runtime.
                #[allow(clippy::disallowed_methods)]
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// Kill every member, leaving the data directories.
    pub fn kill_all(&mut self) {
        for m in &mut self.members {
            m.kill();
        }
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        // Processes first, then `dir` (a field) removes the data.
        self.kill_all();
    }
}
