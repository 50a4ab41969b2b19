//! A whole cluster on this machine for end-to-end tests: the `skiff-server`
//! binary (API server, scheduler, controllers) and N nodes, each a harness
//! [`Containerd`] with a `skiff-agent` process joined to the API.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use skiff_tests::cluster::{Cluster, ClusterOptions};
//! let cluster = Cluster::start(2, ClusterOptions::default()).await?;
//! cluster.kubectl_ok(&["get", "nodes"]).await?;
//! cluster.finish().await // or drop it: then it prints its logs first
//! # }
//! ```
//!
//! # Layout on disk
//! One run directory `/tmp/skiff-test/<id>/` (locked for the cluster's
//! life, see [`cleanup`](crate::cleanup)) holds the server's data dir,
//! each node's kubeconfig, agent root, pod logs and static pod dir, and
//! kubectl's cache. Each node's containerd has its own run directory.
//!
//! # Network
//! Each node is a network namespace of its own on the cluster's LAN (a
//! bridge, see [`netns`](crate::netns)), with its containerd and agent
//! inside it: its pods, its proxy rules and its routes are its own, as on
//! a machine. The API server listens on the host's LAN address.
//!
//! The cluster leases an aligned block of consecutive 198.18.X.0/24
//! subnets (below 198.18.100.0, which single containerd fixtures use) and
//! passes it as `--cluster-cidr` with `--node-cidr-mask-size 24`, so node
//! IPAM hands each node one of them, and one more /24 for the LAN. The
//! nodes' containerds start without a CNI configuration: the agent writes
//! it for the node's podCIDR (`--cni-conf-dir`, `--cni-bridge`) and routes
//! the other nodes' podCIDRs through their LAN addresses, exactly as on
//! real nodes.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use cri_proto::v1;
use k8s_openapi::api::core::v1::Node as NodeObject;
use kube::Api;

use crate::agent::{free_port, workspace_binary};
use crate::cleanup::{self, RunLock};
use crate::containerd::Containerd;
use crate::netns::{Lan, NodeNs};

/// Third octets of the blocks cluster fixtures lease: 198.18.0.0 to
/// 198.18.99.255 (single containerd fixtures use 100 and up).
const CLUSTER_SUBNETS: std::ops::Range<u16> = 0..100;
/// Services get ClusterIPs from here; on-link in each node, routed
/// nowhere.
const SERVICE_RANGE: &str = crate::netns::SERVICE_RANGE;
/// How long kubectl may take for one command unless told otherwise.
const KUBECTL_TIMEOUT: Duration = Duration::from_secs(120);
/// Grace between SIGTERM and SIGKILL for the server.
const SERVER_STOP_GRACE: Duration = Duration::from_secs(10);

/// Settings of a [`Cluster`]. The defaults are shortened so that node
/// failures show within seconds; eviction stays at upstream's 300 s unless
/// the toleration fields are set.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// `--node-monitor-grace-period` of the node lifecycle controller.
    pub node_monitor_grace_period: Duration,
    /// `--node-monitor-period`.
    pub node_monitor_period: Duration,
    /// `--default-not-ready-toleration-seconds` (server default when None).
    pub not_ready_toleration_seconds: Option<i64>,
    /// `--default-unreachable-toleration-seconds` (server default when None).
    pub unreachable_toleration_seconds: Option<i64>,
    /// Agents' `--node-lease-duration-seconds` (renewed every quarter of
    /// it): must stay well under the grace period.
    pub node_lease_duration_seconds: u32,
    /// Agents' `--node-status-update-frequency`.
    pub node_status_update_frequency: Duration,
    /// Most nodes the cluster will ever have ([`Cluster::add_node`]
    /// included); rounded up to a power of two, it sizes the leased block.
    pub max_nodes: usize,
    /// Extra `skiff-server` flags.
    pub server_args: Vec<String>,
    /// Extra flags for every agent.
    pub agent_args: Vec<String>,
    /// How long start-up (and a node joining) may take.
    pub start_timeout: Duration,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            node_monitor_grace_period: Duration::from_secs(10),
            node_monitor_period: Duration::from_secs(1),
            not_ready_toleration_seconds: None,
            unreachable_toleration_seconds: None,
            node_lease_duration_seconds: 8,
            node_status_update_frequency: Duration::from_secs(2),
            max_nodes: 4,
            server_args: Vec::new(),
            agent_args: Vec::new(),
            start_timeout: Duration::from_secs(90),
        }
    }
}

/// Per-node settings for [`Cluster::add_node`].
#[derive(Debug, Clone, Default)]
pub struct NodeOptions {
    /// `--node-labels` (key, value) pairs.
    pub labels: Vec<(String, String)>,
    /// Extra agent flags.
    pub extra_args: Vec<String>,
}

/// A running control plane and its nodes.
///
/// # Guarantees
/// Everything it started is stopped and removed when it is dropped or
/// [`finish`](Self::finish)ed, also after a panic; a SIGKILLed test's
/// cluster is swept by the next fixture start (its processes name the run
/// directory). Dropped without `finish` (a failed test), it first prints
/// the cluster's state and the tails of every log to stderr.
pub struct Cluster {
    id: String,
    dir: PathBuf,
    /// First third octet of the leased block and its length.
    block: (u8, u8),
    /// The nodes' LAN (its /24 leased as a block of one).
    lan: Lan,
    lan_block: (u8, u8),
    options: ClusterOptions,
    server: Server,
    nodes: Vec<Node>,
    agent_binary: PathBuf,
    finished: bool,
    /// Held for the cluster's life; dropped after everything else.
    _lock: RunLock,
}

impl Cluster {
    /// Starts the server and `nodes` nodes and waits until every node is
    /// Ready with a podCIDR and its containerd reports NetworkReady.
    ///
    /// # Errors
    /// Fails when not root, when no subnet block is free, when a binary
    /// does not build, or when a piece does not come up within
    /// `start_timeout` (the error says which; the logs are printed).
    pub async fn start(nodes: usize, options: ClusterOptions) -> Result<Cluster> {
        ensure!(
            nix::unistd::geteuid().is_root(),
            "the cluster fixture needs root (run the e2e tests as root)"
        );
        ensure!(
            nodes <= options.max_nodes,
            "{nodes} nodes but max_nodes is {}",
            options.max_nodes
        );
        tokio::task::spawn_blocking(cleanup::sweep_stale).await?;
        let (server_binary, agent_binary) = tokio::task::spawn_blocking(|| {
            Ok::<_, anyhow::Error>((
                workspace_binary("skiff-control-plane", "skiff-server")?,
                workspace_binary("skiff-agent", "skiff-agent")?,
            ))
        })
        .await??;
        let (id, dir, lock) = tokio::task::spawn_blocking(cleanup::create_run_dir).await??;
        let block_len = options.max_nodes.max(1).next_power_of_two();
        let leased = lease_block(block_len, &id).and_then(|block| {
            let lan_block = lease_block(1, &id)?;
            let lan = Lan::create(&id, lan_block.0)?;
            Ok((block, lan_block, lan))
        });
        let (block, lan_block, lan) = match leased {
            Ok(b) => b,
            Err(e) => {
                let _ = remove_run(&dir, &[], &id);
                return Err(e);
            }
        };
        let port = free_port()?;
        let server = Server::new(server_binary, &dir, port, block, lan.gateway(), &options);
        let mut cluster = Cluster {
            id,
            dir,
            block,
            lan,
            lan_block,
            options,
            server,
            nodes: Vec::new(),
            agent_binary,
            finished: false,
            _lock: lock,
        };
        // From here on, Drop removes whatever was started.
        cluster.server.spawn()?;
        let namespaces = (0..nodes)
            .map(|i| cluster.lan.add_node(i as u8 + 1))
            .collect::<Result<Vec<_>>>()?;
        let runtimes =
            futures::future::try_join_all(namespaces.iter().enumerate().map(|(i, ns)| {
                Containerd::builder()
                    .external_cni(block.0 + i as u8)
                    .netns(ns.path())
                    .start()
            }));
        let runtimes = runtimes.await.context("starting the nodes' containerds")?;
        cluster
            .server
            .wait_ready(cluster.options.start_timeout)
            .await?;
        for (containerd, ns) in runtimes.into_iter().zip(namespaces) {
            cluster.spawn_node(containerd, ns, NodeOptions::default())?;
        }
        let names: Vec<String> = cluster.nodes.iter().map(|n| n.name.clone()).collect();
        for name in names {
            cluster.wait_joined(&name).await?;
        }
        Ok(cluster)
    }

    /// A node joining later (the next free subnet of the block), waited
    /// for like the first ones.
    ///
    /// # Errors
    /// The block is full, or the node does not become Ready.
    pub async fn add_node(&mut self, opts: NodeOptions) -> Result<&mut Node> {
        let index = self.nodes.len();
        ensure!(
            index < usize::from(self.block.1),
            "cluster has room for {} nodes (ClusterOptions::max_nodes)",
            self.block.1
        );
        let ns = self.lan.add_node(index as u8 + 1)?;
        let containerd = Containerd::builder()
            .external_cni(self.block.0 + index as u8)
            .netns(ns.path())
            .start()
            .await?;
        let name = self.spawn_node(containerd, ns, opts)?;
        self.wait_joined(&name).await?;
        Ok(self.nodes.last_mut().expect("node just added"))
    }

    /// Creates the node's directories and kubeconfig and starts its agent
    /// in the node's namespace.
    fn spawn_node(
        &mut self,
        containerd: Containerd,
        ns: NodeNs,
        opts: NodeOptions,
    ) -> Result<String> {
        let name = format!("node-{}", self.nodes.len() + 1);
        let dir = self.dir.join(&name);
        let user = format!("system:node:{name}");
        let text = self
            .server
            .kubeconfig(&user, &["system:nodes"])
            .with_context(|| format!("issuing the kubeconfig of {name}"))?;
        let o = &self.options;
        let mut args = node_dir(&name, &dir, text.as_bytes(), &self.lan, &containerd, &ns)?;
        args.extend([
            format!(
                "--node-status-update-frequency={}ms",
                o.node_status_update_frequency.as_millis()
            ),
            format!(
                "--node-lease-duration-seconds={}",
                o.node_lease_duration_seconds
            ),
        ]);
        if !opts.labels.is_empty() {
            let labels: Vec<String> = opts
                .labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            args.push(format!("--node-labels={}", labels.join(",")));
        }
        args.extend(o.agent_args.iter().cloned());
        args.extend(opts.extra_args);
        let mut node = Node {
            name: name.clone(),
            containerd,
            agent: Process::new(
                "skiff-agent",
                self.agent_binary.clone(),
                args,
                dir.join("agent.log"),
                "SKIFF_AGENT_LOG",
            )
            .in_netns(ns.path()),
            ns,
            dir,
        };
        node.agent.spawn()?;
        self.nodes.push(node);
        Ok(name)
    }

    /// Waits until `name` is Ready with a podCIDR inside the cluster CIDR
    /// and its containerd has loaded the agent's CNI configuration; then
    /// records the podCIDR as the containerd run's subnet (cleanup).
    async fn wait_joined(&mut self, name: &str) -> Result<()> {
        let client = self.client().await?;
        let node = self.node(name).context("no such node")?;
        let index = wait_node_joined(
            &client,
            name,
            &node.agent,
            &node.containerd,
            self.block,
            self.options.start_timeout,
        )
        .await?;
        self.node_mut(name)
            .context("no such node")?
            .containerd
            .set_subnet(index)
    }

    /// Waits until the named node's Ready condition is True.
    ///
    /// # Errors
    /// Timeout (with the last state seen).
    pub async fn wait_node_ready(&self, name: &str, timeout: Duration) -> Result<NodeObject> {
        let api = Api::<NodeObject>::all(self.client().await?);
        wait_for(&format!("node {name} Ready"), timeout, || async {
            let n = api.get(name).await?;
            ensure!(node_ready(&n), "Ready: {}", ready_status(&n));
            Ok(n)
        })
        .await
    }

    /// Waits for an event with `reason` about the object `name` in
    /// `namespace` (the node's events are in `default`); its message.
    ///
    /// # Errors
    /// Timeout.
    pub async fn wait_event(
        &self,
        namespace: &str,
        name: &str,
        reason: &str,
        timeout: Duration,
    ) -> Result<String> {
        let api =
            Api::<k8s_openapi::api::core::v1::Event>::namespaced(self.client().await?, namespace);
        let fields = format!("involvedObject.name={name}");
        wait_for(
            &format!("a {reason} event about {name}"),
            timeout,
            || async {
                let list = api
                    .list(&kube::api::ListParams::default().fields(&fields))
                    .await?;
                list.items
                    .into_iter()
                    .filter(|e| e.reason.as_deref() == Some(reason))
                    .find_map(|e| e.message)
                    .ok_or_else(|| anyhow!("none yet"))
            },
        )
        .await
    }

    /// The run id (also the name of the run directory).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The run directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `--cluster-cidr`: the leased block.
    pub fn cluster_cidr(&self) -> String {
        block_cidr(self.block)
    }

    /// `https://127.0.0.1:<port>` (fixed for the cluster's life).
    pub fn server_url(&self) -> &str {
        &self.server.url
    }

    /// The admin (system:masters) kubeconfig the server wrote.
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.server.admin_kubeconfig()
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    pub fn nodes_mut(&mut self) -> &mut [Node] {
        &mut self.nodes
    }

    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes.iter().find(|n| n.name == name)
    }

    pub fn node_mut(&mut self, name: &str) -> Option<&mut Node> {
        self.nodes.iter_mut().find(|n| n.name == name)
    }

    /// A kube-rs client as admin, bound to the caller's runtime.
    ///
    /// # Errors
    /// The admin kubeconfig is missing or invalid.
    pub async fn client(&self) -> Result<kube::Client> {
        client_from(&self.admin_kubeconfig()).await
    }

    /// A kubeconfig for `user` in `groups`, signed by the cluster CA.
    ///
    /// # Errors
    /// `skiff-server kubeconfig` failed.
    pub fn kubeconfig_for(&self, user: &str, groups: &[&str]) -> Result<PathBuf> {
        let path = self
            .dir
            .join(format!("{}.kubeconfig", user.replace(':', "_")));
        std::fs::write(&path, self.server.kubeconfig(user, groups)?)?;
        Ok(path)
    }

    /// Runs the real kubectl as admin (discovery cache inside the run
    /// directory), killed after two minutes.
    ///
    /// # Errors
    /// kubectl could not be run or timed out; its exit status is the
    /// caller's to judge.
    pub async fn kubectl(&self, args: &[&str]) -> Result<Output> {
        self.kubectl_stdin(args, None).await
    }

    /// [`kubectl`](Self::kubectl) with `stdin`.
    ///
    /// # Errors
    /// As [`kubectl`](Self::kubectl).
    pub async fn kubectl_stdin(&self, args: &[&str], stdin: Option<&str>) -> Result<Output> {
        self.kubectl_with(&kubectl_binary(), args, stdin).await
    }

    /// [`kubectl_stdin`](Self::kubectl_stdin) with another kubectl binary
    /// (e.g. `/usr/lib/google-cloud-sdk/bin/kubectl.1.27`), for
    /// behaviour that differs between kubectl versions.
    ///
    /// # Errors
    /// As [`kubectl`](Self::kubectl).
    pub async fn kubectl_with(
        &self,
        binary: &str,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<Output> {
        use tokio::io::AsyncWriteExt as _;
        let mut cmd = tokio::process::Command::new(binary);
        cmd.env("KUBECONFIG", self.admin_kubeconfig())
            .env("HOME", &self.dir)
            .arg(format!(
                "--cache-dir={}",
                self.dir.join("kube-cache").display()
            ))
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().context("running kubectl")?;
        // Input is written while the output is read: a command that echoes
        // its input (cat) would otherwise stall both once the pipes fill.
        let pipe = child.stdin.take();
        let feed = async move {
            if let (Some(input), Some(mut pipe)) = (stdin, pipe) {
                // A command that exits without reading it all is not an
                // error here; its exit status tells.
                let _ = pipe.write_all(input.as_bytes()).await;
                // Dropped here: the child sees end of input.
            }
        };
        let run = async {
            let ((), out) = tokio::join!(feed, child.wait_with_output());
            out
        };
        match tokio::time::timeout(KUBECTL_TIMEOUT, run).await {
            Ok(out) => Ok(out?),
            Err(_) => bail!("kubectl {args:?} did not finish in {KUBECTL_TIMEOUT:?}"),
        }
    }

    /// kubectl fed `input` whose stdin stays open until its stdout shows
    /// `want` (then it is closed and kubectl waited for): for sessions
    /// that end with their input, such as `attach -i` to a container
    /// without `stdinOnce`, where an answer still on its way when the
    /// input ends would be lost. Returns the stdout.
    ///
    /// # Errors
    /// kubectl cannot start, or `want` does not show within the kubectl
    /// timeout (the error carries what was read).
    pub async fn kubectl_conversation(
        &self,
        args: &[&str],
        input: &str,
        want: &str,
    ) -> Result<String> {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let mut child = tokio::process::Command::new(kubectl_binary())
            .env("KUBECONFIG", self.admin_kubeconfig())
            .env("HOME", &self.dir)
            .arg(format!(
                "--cache-dir={}",
                self.dir.join("kube-cache").display()
            ))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("running kubectl")?;
        let mut stdin = child.stdin.take().context("kubectl stdin")?;
        let mut stdout = child.stdout.take().context("kubectl stdout")?;
        stdin.write_all(input.as_bytes()).await?;
        let mut seen = Vec::new();
        let read = async {
            let mut buf = [0u8; 4096];
            while !String::from_utf8_lossy(&seen).contains(want) {
                let n = stdout.read(&mut buf).await?;
                if n == 0 {
                    break;
                }
                seen.extend_from_slice(&buf[..n]);
            }
            anyhow::Ok(())
        };
        let finished = tokio::time::timeout(KUBECTL_TIMEOUT, read).await;
        drop(stdin);
        let _ = tokio::time::timeout(KUBECTL_TIMEOUT, child.wait()).await;
        let text = String::from_utf8_lossy(&seen).into_owned();
        match finished {
            Ok(r) => r.map(|()| text),
            Err(_) => bail!("kubectl {args:?}: no {want:?} in {KUBECTL_TIMEOUT:?}; read {text:?}"),
        }
    }

    /// kubectl that must succeed; returns its stdout.
    ///
    /// # Errors
    /// Non-zero exit (the error carries stderr and stdout).
    pub async fn kubectl_ok(&self, args: &[&str]) -> Result<String> {
        checked(args, self.kubectl(args).await?)
    }

    /// `kubectl apply -f -` of `yaml`; returns kubectl's stdout.
    ///
    /// # Errors
    /// As [`kubectl_ok`](Self::kubectl_ok).
    pub async fn apply(&self, yaml: &str) -> Result<String> {
        let args = ["apply", "-f", "-"];
        checked(&args, self.kubectl_stdin(&args, Some(yaml)).await?)
    }

    /// SIGTERMs the server and waits for it (SIGKILL after 10 s). Agents
    /// keep running and retry.
    ///
    /// # Errors
    /// Waiting for the process failed.
    pub async fn stop_server(&mut self) -> Result<()> {
        self.server.process.stop_async(SERVER_STOP_GRACE).await
    }

    /// Starts the server again on the same port and data and waits until
    /// it answers.
    ///
    /// # Errors
    /// It does not come up within `start_timeout`.
    pub async fn start_server(&mut self) -> Result<()> {
        self.server.spawn()?;
        self.server.wait_ready(self.options.start_timeout).await
    }

    /// [`stop_server`](Self::stop_server) then
    /// [`start_server`](Self::start_server).
    ///
    /// # Errors
    /// As those two.
    pub async fn restart_server(&mut self) -> Result<()> {
        self.stop_server().await?;
        self.start_server().await
    }

    /// The server's pid while it runs.
    pub fn server_pid(&self) -> Option<u32> {
        self.server.process.child.as_ref().map(|c| c.id())
    }

    /// The server's whole log.
    pub fn server_log(&self) -> String {
        self.server.process.log()
    }

    /// Everything useful to understand a failure: the API's view (nodes,
    /// pods, recent events) while the server answers, then the tails of
    /// the server's, agents' and containerds' logs.
    pub fn diagnostics(&self) -> String {
        let mut out = format!("===== cluster {} ({})\n", self.id, self.cluster_cidr());
        if self.server.process.running() {
            for args in [
                &["get", "nodes", "-o", "wide"][..],
                &["get", "pods", "-A", "-o", "wide"],
                &["get", "events", "-A", "--sort-by=.lastTimestamp"],
            ] {
                out += &format!("----- kubectl {}\n", args.join(" "));
                out += &tail(&self.kubectl_blocking(args), 40);
                out.push('\n');
            }
        }
        out += &format!(
            "----- skiff-server log ({})\n",
            self.server.process.log.display()
        );
        out += &self.server.process.log_tail(80);
        for n in &self.nodes {
            out += &format!("\n----- {} agent log ({})\n", n.name, n.agent.log.display());
            out += &n.agent.log_tail(50);
            out += &format!(
                "\n----- {} containerd log ({})\n",
                n.name,
                n.containerd.log_path().display()
            );
            out += &n.containerd.log_tail(15);
        }
        out
    }

    /// kubectl from synchronous code (Drop), bounded by kubectl's own
    /// request timeout; stdout and stderr together.
    fn kubectl_blocking(&self, args: &[&str]) -> String {
        let out = Command::new(kubectl_binary())
            .env("KUBECONFIG", self.admin_kubeconfig())
            .env("HOME", &self.dir)
            .arg(format!(
                "--cache-dir={}",
                self.dir.join("kube-cache").display()
            ))
            .arg("--request-timeout=5s")
            .args(args)
            .stdin(Stdio::null())
            .output();
        match out {
            Ok(o) => format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => format!("running kubectl: {e}"),
        }
    }

    /// Stops and removes everything without printing diagnostics (the
    /// test passed).
    ///
    /// # Errors
    /// Lists what could not be cleaned up.
    pub async fn finish(mut self) -> Result<()> {
        self.finished = true;
        for node in &mut self.nodes {
            node.agent.kill();
        }
        self.server.process.stop_async(SERVER_STOP_GRACE).await?;
        let mut errors = Vec::new();
        for node in std::mem::take(&mut self.nodes) {
            if let Err(e) = node.containerd.cleanup().await {
                errors.push(format!("{} containerd: {e:#}", node.name));
            }
        }
        let dir = self.dir.clone();
        let blocks = [self.block, self.lan_block];
        let id = self.id.clone();
        let rest = tokio::task::spawn_blocking(move || remove_run(&dir, &blocks, &id)).await?;
        errors.extend(rest);
        ensure!(
            errors.is_empty(),
            "cleanup of cluster {} incomplete: {}",
            self.id,
            errors.join("; ")
        );
        Ok(())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        self.finished = true;
        eprintln!("{}", self.diagnostics());
        for node in &mut self.nodes {
            node.agent.kill();
        }
        if let Err(e) = self.server.process.stop(SERVER_STOP_GRACE) {
            eprintln!(
                "skiff-tests: stopping skiff-server of cluster {}: {e:#}",
                self.id
            );
        }
        // Each containerd tears itself down (CRI on its own thread).
        self.nodes.clear();
        for e in remove_run(&self.dir, &[self.block, self.lan_block], &self.id) {
            eprintln!("skiff-tests: cleanup of cluster {}: {e}", self.id);
        }
    }
}

/// A node's state directory `dir` made (its agent's directories, its
/// `kubeconfig`, its `resolv.conf`), and the flags of its agent running
/// against `containerd` in `ns`.
///
/// # Errors
/// A file cannot be written, or no free port for its node server.
pub(crate) fn node_dir(
    name: &str,
    dir: &Path,
    kubeconfig: &[u8],
    lan: &Lan,
    containerd: &Containerd,
    ns: &NodeNs,
) -> Result<Vec<String>> {
    for sub in ["root", "logs", "manifests"] {
        std::fs::create_dir_all(dir.join(sub))?;
    }
    std::fs::write(dir.join("kubeconfig"), kubeconfig)?;
    // Names outside the cluster go to the host's LAN address, where a
    // test may serve them (nothing answers otherwise): never further.
    std::fs::write(
        dir.join("resolv.conf"),
        format!("nameserver {}\n", lan.gateway()),
    )?;
    let mut args = vec![
        format!("--kubeconfig={}", dir.join("kubeconfig").display()),
        format!("--node-name={name}"),
        format!("--container-runtime-endpoint={}", containerd.endpoint()),
        format!("--root-dir={}", dir.join("root").display()),
        format!("--pod-log-dir={}", dir.join("logs").display()),
        format!("--static-pod-path={}", dir.join("manifests").display()),
        "--status-address=none".into(),
        // Many agents share this host: each its own node server port.
        format!("--port={}", free_port()?),
        format!("--cni-conf-dir={}", containerd.cni_conf_dir().display()),
        format!("--cni-bridge={}", containerd.bridge()),
        "--runtime-request-timeout=30s".into(),
        format!("--node-ip={}", ns.ip),
        format!("--resolv-conf={}", dir.join("resolv.conf").display()),
    ];
    args.extend(crate::agent::TEST_AGENT_FLAGS.map(String::from));
    Ok(args)
}

/// Waits until node `name` is Ready with a podCIDR in `block` and its
/// containerd has loaded the agent's CNI configuration (NetworkReady);
/// the podCIDR's third octet.
///
/// # Errors
/// Timeout (with the last state seen), or the agent exited.
pub(crate) async fn wait_node_joined(
    client: &kube::Client,
    name: &str,
    agent: &Process,
    containerd: &Containerd,
    block: (u8, u8),
    timeout: Duration,
) -> Result<u8> {
    let cri = containerd.client();
    wait_for(&format!("node {name} to join"), timeout, || async {
        if !agent.running() {
            let log = agent.log_tail(20);
            return Err(give_up(anyhow!("its agent exited; log tail:\n{log}")));
        }
        let obj = Api::<NodeObject>::all(client.clone())
            .get_opt(name)
            .await?
            .context("no Node object yet")?;
        let cidr = obj
            .spec
            .as_ref()
            .and_then(|s| s.pod_cidr.clone())
            .context("no podCIDR yet")?;
        let index = subnet_index(&cidr, block)?;
        let status = cri.status(v1::StatusRequest { verbose: false }).await?;
        let conditions = status.status.map(|s| s.conditions).unwrap_or_default();
        let net = conditions.iter().find(|c| c.r#type == "NetworkReady");
        ensure!(
            net.is_some_and(|c| c.status),
            "podCIDR {cidr}, containerd NetworkReady is not true: {net:?}"
        );
        ensure!(
            node_ready(&obj),
            "podCIDR {cidr}, network ready, Node condition Ready is not True"
        );
        Ok(index)
    })
    .await
}

/// Removes the LAN, unmounts and removes the run directory, then releases
/// the blocks.
pub(crate) fn remove_run(dir: &Path, blocks: &[(u8, u8)], id: &str) -> Vec<String> {
    let mut errors = crate::netns::sweep(id);
    if let Err(e) = cleanup::unmount_under(dir) {
        errors.push(format!("unmounting under {}: {e:#}", dir.display()));
    }
    if let Err(e) = std::fs::remove_dir_all(dir) {
        if e.kind() != std::io::ErrorKind::NotFound {
            errors.push(format!("removing {}: {e}", dir.display()));
        }
    }
    for block in blocks {
        for x in block.0..block.0 + block.1 {
            if let Err(e) = cleanup::release_subnet(x, id) {
                errors.push(format!("{e:#}"));
            }
        }
    }
    errors
}

/// One node: its network namespace, its containerd and its agent process.
pub struct Node {
    name: String,
    dir: PathBuf,
    agent: Process,
    containerd: Containerd,
    ns: NodeNs,
}

impl Node {
    /// The node's network namespace (its LAN address, commands inside it).
    pub fn netns(&self) -> &NodeNs {
        &self.ns
    }

    /// The node's LAN address (its InternalIP).
    pub fn ip(&self) -> std::net::Ipv4Addr {
        self.ns.ip
    }

    /// The Node object's name (`node-1`, `node-2`, ...).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node's directory (kubeconfig, agent root, pod logs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The agent's `--static-pod-path`.
    pub fn static_pod_dir(&self) -> PathBuf {
        self.dir.join("manifests")
    }

    /// The node's containerd (CRI client, images, logs).
    pub fn containerd(&self) -> &Containerd {
        &self.containerd
    }

    pub fn containerd_mut(&mut self) -> &mut Containerd {
        &mut self.containerd
    }

    /// SIGKILLs the agent, as a crash or a lost machine would. Its
    /// containers keep running.
    pub fn kill_agent(&mut self) {
        self.agent.kill();
    }

    /// Starts the agent again with the same flags and directories (after
    /// [`kill_agent`](Self::kill_agent)); does not wait for the node to be
    /// Ready (see [`Cluster::wait_node_ready`]).
    ///
    /// # Errors
    /// The binary cannot be started.
    pub fn start_agent(&mut self) -> Result<()> {
        self.agent.spawn()
    }

    /// Sets `--flag=value` for the agent's next start (replacing an
    /// earlier value of the flag).
    pub fn set_agent_flag(&mut self, flag: &str, value: &str) {
        let prefix = format!("--{flag}=");
        self.agent.args.retain(|a| !a.starts_with(&prefix));
        self.agent.args.push(format!("{prefix}{value}"));
    }

    /// Whether the agent process runs.
    pub fn agent_running(&self) -> bool {
        self.agent.running()
    }

    /// The agent's pid while it runs.
    pub fn agent_pid(&self) -> Option<u32> {
        self.agent.child.as_ref().map(|c| c.id())
    }

    /// The agent's whole log (appended to across restarts).
    pub fn agent_log(&self) -> String {
        self.agent.log()
    }

    pub fn agent_log_tail(&self, lines: usize) -> String {
        self.agent.log_tail(lines)
    }

    /// Every container on the node, any state, through CRI.
    ///
    /// # Errors
    /// The CRI call failed.
    pub async fn containers(&self) -> Result<Vec<v1::Container>> {
        let req = v1::ListContainersRequest::default();
        let resp = self.containerd.client().list_containers(req).await;
        Ok(resp
            .with_context(|| format!("listing containers on {}", self.name))?
            .containers)
    }

    /// The running containers on the node.
    ///
    /// # Errors
    /// The CRI call failed.
    pub async fn running_containers(&self) -> Result<Vec<v1::Container>> {
        let running = v1::ContainerState::ContainerRunning as i32;
        let mut all = self.containers().await?;
        all.retain(|c| c.state == running);
        Ok(all)
    }

    /// Every pod sandbox on the node, any state, through CRI.
    ///
    /// # Errors
    /// The CRI call failed.
    pub async fn sandboxes(&self) -> Result<Vec<v1::PodSandbox>> {
        let req = v1::ListPodSandboxRequest::default();
        let resp = self.containerd.client().list_pod_sandbox(req).await;
        Ok(resp
            .with_context(|| format!("listing sandboxes on {}", self.name))?
            .items)
    }
}

/// The control plane process and how to reach it.
struct Server {
    process: Process,
    data_dir: PathBuf,
    url: String,
}

impl Server {
    fn new(
        binary: PathBuf,
        dir: &Path,
        port: u16,
        block: (u8, u8),
        address: std::net::Ipv4Addr,
        o: &ClusterOptions,
    ) -> Server {
        let data_dir = dir.join("server");
        let mut args = vec![
            format!("--data-dir={}", data_dir.display()),
            format!("--bind-address={address}"),
            format!("--secure-port={port}"),
            format!("--cluster-cidr={}", block_cidr(block)),
            "--node-cidr-mask-size=24".into(),
            format!("--service-cluster-ip-range={SERVICE_RANGE}"),
            format!(
                "--node-monitor-period={}ms",
                o.node_monitor_period.as_millis()
            ),
            format!(
                "--node-monitor-grace-period={}ms",
                o.node_monitor_grace_period.as_millis()
            ),
        ];
        if let Some(s) = o.not_ready_toleration_seconds {
            args.push(format!("--default-not-ready-toleration-seconds={s}"));
        }
        if let Some(s) = o.unreachable_toleration_seconds {
            args.push(format!("--default-unreachable-toleration-seconds={s}"));
        }
        args.extend(o.server_args.iter().cloned());
        Server {
            process: Process::new(
                "skiff-server",
                binary,
                args,
                dir.join("server.log"),
                "SKIFF_SERVER_LOG",
            ),
            data_dir,
            url: format!("https://{address}:{port}"),
        }
    }

    fn spawn(&mut self) -> Result<()> {
        self.process.spawn()
    }

    fn admin_kubeconfig(&self) -> PathBuf {
        self.data_dir.join("admin.kubeconfig")
    }

    /// Waits until the admin kubeconfig exists and `/version` answers.
    async fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let kubeconfig = self.admin_kubeconfig();
        let process = &self.process;
        wait_for("skiff-server to serve", timeout, || async {
            if !process.running() {
                return Err(give_up(anyhow!("skiff-server exited")));
            }
            let client = client_from(&kubeconfig).await?;
            client.apiserver_version().await?;
            Ok(())
        })
        .await
        .map_err(|e| anyhow!("{e:#}\nskiff-server log:\n{}", self.process.log_tail(40)))
    }

    /// `skiff-server --data-dir D kubeconfig ...`: a client-certificate
    /// kubeconfig signed by the cluster CA.
    fn kubeconfig(&self, user: &str, groups: &[&str]) -> Result<String> {
        let mut cmd = Command::new(&self.process.binary);
        cmd.arg(format!("--data-dir={}", self.data_dir.display()))
            .args(["kubeconfig", "--user", user, "--server", &self.url]);
        for g in groups {
            cmd.args(["--group", g]);
        }
        let out = cmd.stdin(Stdio::null()).output()?;
        ensure!(
            out.status.success(),
            "skiff-server kubeconfig --user {user}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(String::from_utf8(out.stdout)?)
    }
}

/// A child process with its log file, restartable with the same flags.
pub(crate) struct Process {
    what: &'static str,
    binary: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    /// Environment variable that overrides `RUST_LOG` for it.
    log_env: &'static str,
    /// The network namespace it runs in (`nsenter --net=`), if not ours.
    netns: Option<PathBuf>,
    child: Option<Child>,
}

impl Process {
    pub(crate) fn new(
        what: &'static str,
        binary: PathBuf,
        args: Vec<String>,
        log: PathBuf,
        log_env: &'static str,
    ) -> Process {
        Process {
            what,
            binary,
            args,
            log,
            log_env,
            netns: None,
            child: None,
        }
    }

    /// Run it inside the network namespace pinned at `path`.
    pub(crate) fn in_netns(mut self, path: PathBuf) -> Process {
        self.netns = Some(path);
        self
    }

    /// Starts it unless it runs. Not in a process group of its own: a
    /// terminal's Ctrl-C, which skips the test's cleanup, stops it too.
    pub(crate) fn spawn(&mut self) -> Result<()> {
        if self.running() {
            return Ok(());
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        let level = std::env::var(self.log_env).unwrap_or_else(|_| "info".into());
        let mut command = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net={}", ns.display()))
                    .arg("--")
                    .arg(&self.binary);
                c
            }
            None => Command::new(&self.binary),
        };
        let child = command
            .args(&self.args)
            .env("RUST_LOG", level)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {} ({})", self.what, self.binary.display()))?;
        self.child = Some(child);
        Ok(())
    }

    /// Whether it runs (reaps it when it exited).
    pub(crate) fn running(&self) -> bool {
        let Some(child) = self.child.as_ref() else {
            return false;
        };
        cleanup::is_alive(nix::unistd::Pid::from_raw(child.id() as i32))
    }

    pub(crate) fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn stop(&mut self, grace: Duration) -> Result<()> {
        match self.child.take() {
            Some(mut c) => cleanup::terminate_child(&mut c, grace),
            None => Ok(()),
        }
    }

    /// [`stop`](Self::stop) off the async runtime's threads.
    async fn stop_async(&mut self, grace: Duration) -> Result<()> {
        match self.child.take() {
            Some(mut c) => {
                tokio::task::spawn_blocking(move || cleanup::terminate_child(&mut c, grace)).await?
            }
            None => Ok(()),
        }
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub(crate) fn log_tail(&self, lines: usize) -> String {
        tail(&self.log(), lines)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Polls `probe` until it returns `Ok` or `timeout` passes. An `Err` means
/// "not yet" and says why: the last one is the timeout error's message;
/// an error made with [`give_up`] ends the wait at once.
///
/// # Errors
/// Timeout, with `what` and the last reason, or the probe gave up.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let deadline = Instant::now() + timeout;
    let mut delay = Duration::from_millis(100);
    loop {
        match probe().await {
            Ok(v) => return Ok(v),
            Err(e) if e.is::<GiveUp>() => bail!("gave up waiting for {what}: {e:#}"),
            Err(e) if Instant::now() >= deadline => {
                bail!("timed out after {timeout:?} waiting for {what}; last: {e:#}")
            }
            Err(_) => {}
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(500));
    }
}

/// A state a [`wait_for`] probe cannot leave (a process died, a pod
/// failed): waiting longer is pointless.
#[derive(Debug)]
pub struct GiveUp(anyhow::Error);

impl std::fmt::Display for GiveUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.0)
    }
}

impl std::error::Error for GiveUp {}

/// Wraps `e` so that [`wait_for`] stops at once.
pub fn give_up(e: impl Into<anyhow::Error>) -> anyhow::Error {
    anyhow::Error::new(GiveUp(e.into()))
}

/// A kube-rs client from a kubeconfig file.
///
/// # Errors
/// The file is missing or invalid.
pub async fn client_from(kubeconfig: &Path) -> Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    let opts = kube::config::KubeConfigOptions::default();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &opts).await?;
    Ok(kube::Client::try_from(cfg)?)
}

/// Where a node's server listens, `<InternalIP>:<daemonEndpoints port>`,
/// as the node reports it.
///
/// # Errors
/// The Node cannot be read, or reports no InternalIP or kubelet endpoint.
pub async fn node_server_address(client: &kube::Client, node: &str) -> Result<String> {
    let status = Api::<NodeObject>::all(client.clone())
        .get(node)
        .await?
        .status
        .context("node has no status")?;
    let ip = status
        .addresses
        .iter()
        .flatten()
        .find(|a| a.type_ == "InternalIP")
        .map(|a| a.address.clone())
        .context("node has no InternalIP")?;
    let port = status
        .daemon_endpoints
        .and_then(|d| d.kubelet_endpoint)
        .map(|e| e.port)
        .context("node reports no kubelet endpoint")?;
    Ok(format!("{ip}:{port}"))
}

/// Whether the Node's Ready condition is True.
pub fn node_ready(n: &NodeObject) -> bool {
    ready_status(n) == "True"
}

/// The status of the Node's Ready condition (`True`, `False`, `Unknown`),
/// empty when it has none.
pub fn ready_status(n: &NodeObject) -> String {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status.clone())
        .unwrap_or_default()
}

/// Whether `ip` (dotted IPv4) lies in `cidr` (a.b.c.d/n).
pub fn ip_in_cidr(ip: &str, cidr: &str) -> bool {
    let parse = || -> Option<bool> {
        let ip: std::net::Ipv4Addr = ip.parse().ok()?;
        let (net, len) = cidr.split_once('/')?;
        let net: std::net::Ipv4Addr = net.parse().ok()?;
        let len: u8 = len.parse().ok()?;
        Some(cleanup::overlaps((ip, 32), (net, len)))
    };
    parse().unwrap_or(false)
}

fn kubectl_binary() -> String {
    std::env::var("KUBECTL").unwrap_or_else(|_| "/usr/bin/kubectl".into())
}

fn checked(args: &[&str], out: Output) -> Result<String> {
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    ensure!(
        out.status.success(),
        "kubectl {} failed ({}): {}{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr),
        stdout
    );
    Ok(stdout)
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

pub(crate) fn block_cidr((first, len): (u8, u8)) -> String {
    let prefix = 24 - len.trailing_zeros();
    format!("198.18.{first}.0/{prefix}")
}

/// The third octet of a node's `198.18.X.0/24` podCIDR, checked to be in
/// the cluster's block.
pub(crate) fn subnet_index(cidr: &str, (first, len): (u8, u8)) -> Result<u8> {
    let x = cidr
        .strip_prefix("198.18.")
        .and_then(|r| r.strip_suffix(".0/24"))
        .and_then(|x| x.parse::<u8>().ok())
        .filter(|x| (first..first + len).contains(x));
    x.ok_or_else(|| {
        anyhow!(
            "podCIDR {cidr} is not a /24 of --cluster-cidr {}",
            block_cidr((first, len))
        )
    })
}

/// Leases an aligned block of `len` (a power of two) consecutive
/// 198.18.X.0/24 under [`CLUSTER_SUBNETS`] for run `id`: every lease file
/// free and no host address or route overlapping the block.
pub(crate) fn lease_block(len: usize, id: &str) -> Result<(u8, u8)> {
    let len16 = u16::try_from(len)
        .ok()
        .filter(|l| *l <= CLUSTER_SUBNETS.end - CLUSTER_SUBNETS.start)
        .with_context(|| format!("{len} node subnets do not fit the cluster range"))?;
    let used = cleanup::host_ipv4_networks();
    let starts: Vec<u16> = CLUSTER_SUBNETS
        .step_by(len)
        .filter(|s| s + len16 <= CLUSTER_SUBNETS.end)
        .collect();
    let offset = rand::random::<u32>() as usize % starts.len();
    let prefix = 24 - len16.trailing_zeros() as u8;
    for i in 0..starts.len() {
        let first = starts[(offset + i) % starts.len()] as u8;
        let net = (std::net::Ipv4Addr::new(198, 18, first, 0), prefix);
        if used.iter().any(|u| cleanup::overlaps(*u, net)) {
            continue;
        }
        let mut taken = Vec::new();
        for x in first..first + len16 as u8 {
            if !cleanup::lease_subnet(x, id)? {
                break;
            }
            taken.push(x);
        }
        if taken.len() == len {
            return Ok((first, len16 as u8));
        }
        for x in taken {
            cleanup::release_subnet(x, id)?;
        }
    }
    bail!(
        "no free block of {len} /24s in 198.18.0-99.0 (leases in {})",
        cleanup::SUBNET_DIR
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_arithmetic() {
        assert_eq!(block_cidr((4, 4)), "198.18.4.0/22");
        assert_eq!(block_cidr((2, 2)), "198.18.2.0/23");
        assert_eq!(block_cidr((9, 1)), "198.18.9.0/24");
        assert_eq!(subnet_index("198.18.6.0/24", (4, 4)).unwrap(), 6);
        assert!(subnet_index("198.18.8.0/24", (4, 4)).is_err());
        assert!(subnet_index("10.0.0.0/24", (4, 4)).is_err());
        assert!(ip_in_cidr("198.18.5.7", "198.18.5.0/24"));
        assert!(!ip_in_cidr("198.18.6.7", "198.18.5.0/24"));
    }
}
