//! A control plane of several skiff-servers on managed etcd, each in a
//! network namespace of its own (a machine on the cluster's LAN): the
//! first starts the cluster (`--cluster-init`), the others join it with
//! a server token (`--server`, `--token`). Nodes (a containerd and an
//! agent in a namespace of their own) can be added, talking to one
//! server at first.
//!
//! Everything lives in a run directory that every process names in its
//! flags (etcd's `--data-dir` included), so a dead run's leftovers are
//! swept like a cluster fixture's.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use anyhow::{anyhow, ensure, Context, Result};
use nix::sys::signal::Signal;

use cri_proto::v1;
use skiff_control_plane::store::managed::join::SERVERS_GROUP;

use crate::agent::workspace_binary;
use crate::cleanup::{self, RunLock};
use crate::cluster::{
    block_cidr, client_from, give_up, lease_block, node_dir, remove_run, wait_for,
    wait_node_joined, Process,
};
use crate::containerd::Containerd;
use crate::netns::{Lan, NodeNs, SERVICE_RANGE};

const PORT: u16 = 6443;

/// The server (`sN`) holding the Lease `kube-system/LEASE`, asked of
/// `client`: holder identities are `NODE-NAME_UUID`, and the fixture
/// names its servers `sN`.
///
/// # Errors
/// The Lease cannot be read, or names no server of the fixture.
pub async fn lease_holder(client: &kube::Client, lease: &str) -> Result<usize> {
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(client.clone(), "kube-system");
    let who = leases
        .get(lease)
        .await?
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default();
    who.strip_prefix('s')
        .and_then(|rest| rest.split('_').next())
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("{lease} held by {who:?}"))
}

/// One server: its machine, its process, its data.
pub struct HaServer {
    pub name: String,
    pub ns: NodeNs,
    pub data_dir: PathBuf,
    process: Process,
    binary: PathBuf,
}

impl HaServer {
    /// `https://IP:6443`.
    pub fn url(&self) -> String {
        format!("https://{}:{PORT}", self.ns.ip)
    }

    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.data_dir.join("admin.kubeconfig")
    }

    pub fn running(&self) -> bool {
        self.process.running()
    }

    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }

    /// The machine is gone: the server and its etcd are SIGKILLed.
    pub fn kill(&mut self) {
        self.process.kill();
        let etcd = self.data_dir.join("etcd");
        cleanup::kill_processes_mentioning(&etcd.to_string_lossy(), Signal::SIGKILL);
    }

    /// `skiff-server ARGS --data-dir D --node-name N`, run on its machine.
    ///
    /// # Errors
    /// The command cannot be run.
    pub async fn cli(&self, args: &[&str]) -> Result<Output> {
        let out = self
            .ns
            .tokio_command(&self.binary)
            .args(args)
            .arg(format!("--data-dir={}", self.data_dir.display()))
            .arg(format!("--node-name={}", self.name))
            .output();
        tokio::time::timeout(Duration::from_secs(60), out)
            .await
            .context("skiff-server command timed out")?
            .context("running skiff-server")
    }

    /// `kubectl ARGS` with this server's admin kubeconfig (from the
    /// host, over the LAN).
    ///
    /// # Errors
    /// kubectl cannot be run.
    pub async fn kubectl(&self, args: &[&str]) -> Result<Output> {
        let out = tokio::process::Command::new("kubectl")
            .arg(format!(
                "--kubeconfig={}",
                self.admin_kubeconfig().display()
            ))
            .arg("--request-timeout=20s")
            .args(args)
            .output();
        tokio::time::timeout(Duration::from_secs(60), out)
            .await
            .context("kubectl timed out")?
            .context("running kubectl")
    }

    async fn wait_ready(&self, timeout: Duration) -> Result<()> {
        let kubeconfig = self.admin_kubeconfig();
        wait_for(&format!("{} to serve", self.name), timeout, || async {
            if !self.process.running() {
                return Err(give_up(anyhow!("{} exited", self.name)));
            }
            client_from(&kubeconfig).await?.apiserver_version().await?;
            Ok(())
        })
        .await
        .map_err(|e| anyhow!("{e:#}\n{} log:\n{}", self.name, self.log_tail(40)))
    }
}

/// One node: its agent (declared first: it stops before its containerd
/// is torn down, or it would start sandboxes again meanwhile).
pub struct HaAgent {
    pub name: String,
    pub ns: NodeNs,
    process: Process,
    containerd: Containerd,
}

impl HaAgent {
    pub fn running(&self) -> bool {
        self.process.running()
    }

    pub fn log(&self) -> String {
        self.process.log()
    }

    /// The running containers, through CRI.
    ///
    /// # Errors
    /// The CRI call failed.
    pub async fn running_containers(&self) -> Result<Vec<v1::Container>> {
        let running = v1::ContainerState::ContainerRunning as i32;
        let resp = self
            .containerd
            .client()
            .list_containers(v1::ListContainersRequest::default())
            .await
            .with_context(|| format!("listing containers on {}", self.name))?;
        Ok(resp
            .containers
            .into_iter()
            .filter(|c| c.state == running)
            .collect())
    }
}

/// The servers, their nodes and their LAN.
pub struct HaCluster {
    id: String,
    dir: PathBuf,
    lan: Lan,
    lan_block: (u8, u8),
    /// The nodes' pod subnets (`--cluster-cidr`).
    pod_block: (u8, u8),
    binary: PathBuf,
    agents: Vec<HaAgent>,
    servers: Vec<HaServer>,
    /// The token servers join with.
    token: String,
    _lock: RunLock,
}

impl HaCluster {
    /// `n` servers: the first starts the cluster, the others join it one
    /// after the other, each waited for until it serves.
    ///
    /// # Errors
    /// Not root, no free subnet, or a server does not come up (its log is
    /// in the error).
    pub async fn start(n: usize) -> Result<HaCluster> {
        ensure!(
            nix::unistd::geteuid().is_root(),
            "the HA fixture needs root (run the e2e tests as root)"
        );
        tokio::task::spawn_blocking(cleanup::sweep_stale).await?;
        let binary = tokio::task::spawn_blocking(|| {
            crate::agent::workspace_binary("skiff-control-plane", "skiff-server")
        })
        .await??;
        let (id, dir, lock) = tokio::task::spawn_blocking(cleanup::create_run_dir).await??;
        let leased = lease_block(2, &id).and_then(|pods| {
            let block = lease_block(1, &id)?;
            Ok((pods, block, Lan::create(&id, block.0)?))
        });
        let (pod_block, lan_block, lan) = match leased {
            Ok(l) => l,
            Err(e) => {
                let _ = remove_run(&dir, &[], &id);
                return Err(e);
            }
        };
        let mut cluster = HaCluster {
            id,
            dir,
            lan,
            lan_block,
            pod_block,
            binary,
            agents: Vec::new(),
            servers: Vec::new(),
            token: String::new(),
            _lock: lock,
        };
        cluster.add(&["--cluster-init"]).await?;
        let out = cluster.servers[0]
            .cli(&["token", "create", "--groups", SERVERS_GROUP])
            .await?;
        ensure!(
            out.status.success(),
            "token create: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        cluster.token = String::from_utf8_lossy(&out.stdout).trim().to_string();
        for _ in 1..n {
            cluster.join().await?;
        }
        Ok(cluster)
    }

    /// One more server joining through the first, waited for.
    ///
    /// # Errors
    /// It does not come up.
    pub async fn join(&mut self) -> Result<&HaServer> {
        let (url, token) = (self.servers[0].url(), self.token.clone());
        self.add(&["--server", &url, "--token", &token]).await
    }

    /// The join token of the first server.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Start server number `servers().len()` with `args` and wait until
    /// it serves.
    ///
    /// # Errors
    /// It does not come up.
    pub async fn add(&mut self, args: &[&str]) -> Result<&HaServer> {
        let server = self.spawn(args)?;
        self.servers.push(server);
        let s = self.servers.last().expect("just added");
        s.wait_ready(Duration::from_secs(120)).await?;
        Ok(s)
    }

    /// Start server number `servers().len()` with `args`, expected to
    /// exit (a join that must fail): its log. Its machine goes again.
    ///
    /// # Errors
    /// It cannot be started, or still runs after a minute.
    pub async fn try_add(&mut self, args: &[&str]) -> Result<String> {
        let mut server = self.spawn(args)?;
        let exited = wait_for("the server to exit", Duration::from_secs(60), || {
            let running = server.running();
            async move {
                ensure!(!running, "still running");
                Ok(())
            }
        })
        .await;
        let log = server.process.log();
        server.kill();
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &server.ns.name])
            .output();
        exited.map_err(|e| {
            anyhow!(
                "{e:#}
{log}"
            )
        })?;
        Ok(log)
    }

    fn spawn(&mut self, args: &[&str]) -> Result<HaServer> {
        let i = self.servers.len();
        let name = format!("s{i}");
        let ns = self.lan.add_node(u8::try_from(i + 1)?)?;
        let mut process = self.process(&name, &ns, args);
        process.spawn()?;
        Ok(HaServer {
            data_dir: self.dir.join(&name),
            name,
            ns,
            process,
            binary: self.binary.clone(),
        })
    }

    /// Server `i` started again (stopped first if it runs) with `args`
    /// instead of the ones it had, and waited for.
    ///
    /// # Errors
    /// It does not come up.
    pub async fn restart(&mut self, i: usize, args: &[&str]) -> Result<()> {
        let process = self.process(&self.servers[i].name, &self.servers[i].ns, args);
        let s = &mut self.servers[i];
        s.kill();
        s.process = process;
        s.process.spawn()?;
        s.wait_ready(Duration::from_secs(120)).await
    }

    fn process(&self, name: &str, ns: &NodeNs, args: &[&str]) -> Process {
        let data_dir = self.dir.join(name);
        let mut flags = vec![
            format!("--data-dir={}", data_dir.display()),
            format!("--node-name={name}"),
            format!("--bind-address={}", ns.ip),
            format!("--secure-port={PORT}"),
            format!("--service-cluster-ip-range={SERVICE_RANGE}"),
            format!("--cluster-cidr={}", block_cidr(self.pod_block)),
            "--node-cidr-mask-size=24".into(),
        ];
        // Scheduled snapshots only where a test asks for them.
        if !args.iter().any(|a| a.starts_with("--etcd-snapshot")) {
            flags.push("--etcd-disable-snapshots".into());
        }
        flags.extend(args.iter().map(|a| a.to_string()));
        Process::new(
            "skiff-server",
            self.binary.clone(),
            flags,
            self.dir.join(format!("{name}.log")),
            "SKIFF_SERVER_LOG",
        )
        .in_netns(ns.path())
    }

    pub fn servers(&self) -> &[HaServer] {
        &self.servers
    }

    pub fn agents(&self) -> &[HaAgent] {
        &self.agents
    }

    /// A node (`node-N`): its containerd and agent in a namespace of
    /// their own, the agent's kubeconfig naming server `server` (it
    /// learns the others from `default/kubernetes`); waited for until
    /// Ready with a podCIDR and its network.
    ///
    /// # Errors
    /// The block is full, or the node does not become Ready.
    pub async fn add_agent(&mut self, server: usize) -> Result<&HaAgent> {
        let k = self.agents.len();
        ensure!(k < 2, "the pod block holds two nodes");
        let name = format!("node-{}", k + 1);
        let ns = self.lan.add_node(u8::try_from(20 + k)?)?;
        let containerd = Containerd::builder()
            .external_cni(self.pod_block.0 + u8::try_from(k)?)
            .netns(ns.path())
            .start()
            .await
            .with_context(|| format!("starting the containerd of {name}"))?;
        let dir = self.dir.join(&name);
        let s = &self.servers[server];
        let user = format!("system:node:{name}");
        let out = s
            .cli(&[
                "kubeconfig",
                "--user",
                &user,
                "--group",
                "system:nodes",
                "--server",
                &s.url(),
            ])
            .await?;
        ensure!(
            out.status.success(),
            "kubeconfig for {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let args = node_dir(&name, &dir, &out.stdout, &self.lan, &containerd, &ns)?;
        let agent_binary =
            tokio::task::spawn_blocking(|| workspace_binary("skiff-agent", "skiff-agent"))
                .await??;
        let mut process = Process::new(
            "skiff-agent",
            agent_binary,
            args,
            dir.join("agent.log"),
            "SKIFF_AGENT_LOG",
        )
        .in_netns(ns.path());
        process.spawn()?;
        self.agents.push(HaAgent {
            name: name.clone(),
            ns,
            process,
            containerd,
        });
        let client = client_from(&self.servers[server].admin_kubeconfig()).await?;
        let agent = self.agents.last().expect("just added");
        let index = wait_node_joined(
            &client,
            &name,
            &agent.process,
            &agent.containerd,
            self.pod_block,
            Duration::from_secs(120),
        )
        .await?;
        let agent = self.agents.last_mut().expect("just added");
        agent.containerd.set_subnet(index)?;
        Ok(agent)
    }

    pub fn server_mut(&mut self, i: usize) -> &mut HaServer {
        &mut self.servers[i]
    }

    /// The run directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The servers' and agents' logs' tails, for a failure's message.
    pub fn diagnostics(&self) -> String {
        let servers = self
            .servers
            .iter()
            .map(|s| format!("--- {} ---\n{}", s.name, s.log_tail(30)));
        let agents = self
            .agents
            .iter()
            .map(|a| format!("--- {} ---\n{}", a.name, a.process.log_tail(20)));
        servers.chain(agents).collect::<Vec<_>>().join("\n")
    }

    /// `result`, with the logs printed when it is an error.
    pub fn report<T>(&self, result: Result<T>) -> Result<T> {
        if result.is_err() {
            eprintln!("{}", self.diagnostics());
        }
        result
    }
}

impl Drop for HaCluster {
    fn drop(&mut self) {
        // Each agent stops, then its containerd tears itself down.
        self.agents.clear();
        for s in &mut self.servers {
            s.kill();
        }
        // Whatever else names the run (an etcd a server left behind).
        cleanup::kill_processes_mentioning(&self.dir.to_string_lossy(), Signal::SIGKILL);
        for e in remove_run(&self.dir, &[self.lan_block, self.pod_block], &self.id) {
            eprintln!("skiff-tests: cleanup of HA run {}: {e}", self.id);
        }
    }
}
