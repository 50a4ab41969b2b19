//! API server benchmark: pod creates, gets and lists through the HTTPS API
//! (concurrency 32) against the same number of raw store writes in the
//! same run, the server's peak RSS, and watch fan-out (500 watchers x
//! 1,000 events). Prints figures, then one JSON line.
//!
//! Run: `cargo build --release -p skiff-control-plane --bin skiff-server --examples`
//! then `target/release/examples/bench_apiserver [--pods N] [--gets N] [--lists N] [--concurrency C]
//! [--rounds R] [--client https|kube] [--components] [--watchers W]
//! [--events E] [--server-bin PATH] [--stages] [--tokens]`.
//!
//! `--tokens` measures only what authenticating by a ServiceAccount token
//! costs against a client certificate (see `tokens.rs`).
//!
//! The server runs as its own process (the `skiff-server` binary next to
//! this example) so that its RSS and CPU time are its own. By default it
//! runs without its in-process scheduler and controllers: with no nodes,
//! the scheduler would retry 10,000 unschedulable pods and write an event
//! for each, which is not the API's cost (`--components` keeps them).
//!
//! API creates and raw store writes alternate (`--rounds`), so that other
//! work starting or stopping on the machine does not favour one of them.
//! The load generator shares the machine's cores with the server, so the
//! default client is a light one (see `https.rs`); `--client kube` uses
//! kube-rs. Per phase the benchmark prints the CPU time of the server, of
//! this process, and of everything else on the machine: on a few shared
//! cores that says more than the wall clock.

// The final JSON line is one `json!` literal with many fields.
#![recursion_limit = "256"]

mod cpu;
mod https;
mod load;
mod process;
mod stages;
mod tokens;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;
use skiff_control_plane::store::bench::{bench_raw_writes, percentile};
use skiff_control_plane::store::{SqliteStore, Store, SQLITE_FILE};

use load::{ClientKind, Load};
use process::{free_port, server_bin, ServerProc};

#[derive(Parser, Debug)]
struct Args {
    #[arg(long, default_value_t = 10_000)]
    pods: usize,
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Gets [default: --pods].
    #[arg(long)]
    gets: Option<usize>,
    #[arg(long, default_value_t = 1_000)]
    lists: usize,
    #[arg(long, default_value_t = 500)]
    watchers: usize,
    #[arg(long, default_value_t = 1_000)]
    events: usize,
    /// API creates and store writes alternate in this many rounds, so that
    /// a change in the machine's other load hits both alike.
    #[arg(long, default_value_t = 4)]
    rounds: usize,
    /// Client of the pod creates, gets and lists.
    #[arg(long, value_enum, default_value_t = ClientKind::Https)]
    client: ClientKind,
    /// Run the server with its in-process scheduler and controllers.
    #[arg(long)]
    components: bool,
    /// skiff-server binary [default: next to this example's directory].
    #[arg(long)]
    server_bin: Option<PathBuf>,
    /// Only time the steps of a pod create's object pipeline in this
    /// process, --pods times (no server).
    #[arg(long)]
    stages: bool,
    /// Only compare GETs authenticated by a ServiceAccount token with GETs
    /// by a client certificate (--gets of each, default 10,000).
    #[arg(long)]
    tokens: bool,
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// One phase's figures.
struct Figures {
    p50: Duration,
    p99: Duration,
    per_s: f64,
    n: usize,
    used: cpu::Used,
}

impl Figures {
    /// # Errors
    /// When no operation succeeded: there is nothing to measure, and a
    /// ratio against it would be meaningless (the failures were printed
    /// as they happened).
    fn new((lat, wall): load::Timings, used: cpu::Used) -> anyhow::Result<Figures> {
        anyhow::ensure!(
            !lat.is_empty(),
            "the phase completed no operation; every one failed (see the errors above)"
        );
        Ok(Figures {
            p50: percentile(&lat, 0.5),
            p99: percentile(&lat, 0.99),
            per_s: lat.len() as f64 / wall.as_secs_f64().max(1e-9),
            n: lat.len(),
            used,
        })
    }

    /// The figures of several runs of one phase taken together.
    fn merge(runs: Vec<(load::Timings, cpu::Used)>) -> anyhow::Result<Figures> {
        let mut lat = Vec::new();
        let mut wall = Duration::ZERO;
        let mut used = cpu::Used::default();
        for ((l, w), u) in runs {
            lat.extend(l);
            wall += w;
            used = used + u;
        }
        Figures::new((lat, wall), used)
    }

    /// CPU microseconds per operation of the server and of this process.
    fn cpu_us(&self) -> (f64, f64) {
        let per = |s: f64| s * 1e6 / self.n.max(1) as f64;
        (per(self.used.server), per(self.used.client))
    }

    /// Share of the machine that other processes used meanwhile.
    fn others_share(&self) -> f64 {
        self.used.others / self.used.capacity.max(1e-9)
    }

    fn print(&self, what: &str) {
        let (server, client) = self.cpu_us();
        println!(
            "{what}: {} ok, p50 {:.3} ms, p99 {:.3} ms, {:.0}/s; CPU per op: server {server:.0} us, bench process {client:.0} us; other processes used {:.0}% of the machine",
            self.n,
            ms(self.p50),
            ms(self.p99),
            self.per_s,
            self.others_share() * 100.0
        );
    }
}

/// Run one phase, reading the CPU counters around it.
async fn measured(
    pid: u32,
    f: impl std::future::Future<Output = load::Timings>,
) -> (load::Timings, cpu::Used) {
    let start = cpu::Mark::now(pid);
    let timings = f.await;
    (timings, cpu::Mark::now(pid).used_since(&start))
}

async fn phase(
    pid: u32,
    f: impl std::future::Future<Output = load::Timings>,
) -> anyhow::Result<Figures> {
    let (timings, used) = measured(pid, f).await;
    Figures::new(timings, used)
}

fn start_server(args: &Args, data: &std::path::Path, port: u16) -> anyhow::Result<ServerProc> {
    let bin = server_bin(args.server_bin.as_deref())?;
    let mut cmd = Command::new(&bin);
    cmd.args([
        "--data-dir",
        &data.display().to_string(),
        "--secure-port",
        &port.to_string(),
        "--service-cluster-ip-range",
        "198.19.0.0/16",
    ]);
    if !args.components {
        cmd.args(["--disable-scheduler", "--disable-controller-manager"]);
    }
    let child = cmd
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    Ok(ServerProc(child))
}

/// Watch fan-out: `watchers` kube-rs watches on one namespace's ConfigMaps
/// while `events` ConfigMaps are created; each event carries its send
/// time. Returns (deliveries, watchers that got every event, wall time of
/// the creates).
async fn watch_fanout(
    client: &kube::Client,
    watchers: usize,
    events: usize,
) -> anyhow::Result<(Vec<Duration>, usize, Duration)> {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-public");
    let start_rv = cms
        .list(&ListParams::default().limit(1))
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let epoch = Instant::now();
    let mut tasks = Vec::new();
    let ready = Arc::new(AtomicUsize::new(0));
    for _ in 0..watchers {
        let (cms, rv, ready) = (cms.clone(), start_rv.clone(), ready.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(events);
            let Ok(stream) = cms.watch(&WatchParams::default(), &rv).await else {
                return lat;
            };
            ready.fetch_add(1, Ordering::Relaxed);
            let mut stream = stream.boxed();
            while lat.len() < events {
                match tokio::time::timeout(Duration::from_secs(60), stream.next()).await {
                    Ok(Some(Ok(WatchEvent::Added(cm)))) => {
                        let sent: u64 = cm
                            .data
                            .as_ref()
                            .and_then(|d| d.get("t"))
                            .and_then(|t| t.parse().ok())
                            .unwrap_or(0);
                        let now = epoch.elapsed().as_micros() as u64;
                        lat.push(Duration::from_micros(now.saturating_sub(sent)));
                    }
                    Ok(Some(Ok(_))) => {}
                    _ => break,
                }
            }
            lat
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while ready.load(Ordering::Relaxed) < watchers && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let c = cms.clone();
    let (_, wall) = load::drive_stateless(events, 8, move |i| {
        let c = c.clone();
        async move {
            let t = epoch.elapsed().as_micros().to_string();
            let cm: ConfigMap = serde_json::from_value(
                json!({"metadata": {"name": format!("ev-{i:05}")}, "data": {"t": t}}),
            )?;
            c.create(&PostParams::default(), &cm).await?;
            Ok(())
        }
    })
    .await;
    let mut deliveries = Vec::new();
    let mut complete = 0;
    for t in tasks {
        let l = t.await.unwrap_or_default();
        if l.len() == events {
            complete += 1;
        }
        deliveries.extend(l);
    }
    Ok((deliveries, complete, wall))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    if args.stages {
        return stages::run(args.pods);
    }
    let dir = tempfile::tempdir()?;
    let port = free_port()?;
    let data = dir.path().join("server");
    let server = start_server(&args, &data, port)?;
    let pid = server.0.id();
    let kubeconfig = data.join("admin.kubeconfig");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !kubeconfig.exists() {
        if Instant::now() > deadline {
            bail!(
                "skiff-server did not write {} within 30 s",
                kubeconfig.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let kc = kube::config::Kubeconfig::read_from(&kubeconfig)?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await?;
    let client = kube::Client::try_from(cfg)?;
    if args.tokens {
        let gets = args.gets.unwrap_or(args.pods);
        return tokens::run(
            pid,
            &data,
            port,
            &client,
            gets,
            args.concurrency,
            args.rounds,
        )
        .await;
    }
    let mut pods = match args.client {
        ClientKind::Https | ClientKind::Https2 => {
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
            let version = match args.client {
                ClientKind::Https2 => https::Version::Http2,
                _ => https::Version::Http1,
            };
            let target = https::Target::from_kubeconfig(&kubeconfig, addr, version)?;
            Load::https(target, args.concurrency).await?
        }
        ClientKind::Kube => Load::Kube(client.clone()),
    };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "client: {:?}, concurrency {}; server: {}; {cpus} CPUs shared with whatever else runs",
        args.client,
        args.concurrency,
        if args.components {
            "with its scheduler and controllers"
        } else {
            "API server only (--disable-scheduler --disable-controller-manager)"
        }
    );

    // 0. the cheapest request
    let floor = phase(pid, pods.floor(args.pods, args.concurrency))
        .await
        .context("floor (GET /version)")?;
    floor.print("API floor (GET /version)");
    // 1. creates through the API alternating with the same number of
    // writes straight into a store of the same kind, in this process (so
    // "bench process" CPU is the store's own).
    let raw_dir = dir.path().join("raw");
    std::fs::create_dir_all(&raw_dir)?;
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(raw_dir.join(SQLITE_FILE)).await?);
    let rounds = args.rounds.clamp(1, args.pods.max(1));
    let (mut api_runs, mut store_runs) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        let first = r * args.pods / rounds;
        let n = (r + 1) * args.pods / rounds - first;
        let bodies = pods.bodies(first, n);
        api_runs.push(measured(pid, pods.creates(first, bodies, args.concurrency)).await);
        store_runs.push(measured(pid, bench_raw_writes(store.clone(), n, args.concurrency)).await);
    }
    let create = Figures::merge(api_runs).context("API creates")?;
    create.print("API create");
    let raw = Figures::merge(store_runs).context("raw store writes")?;
    raw.print("store create");
    let ratio = create.per_s / raw.per_s.max(1e-9);
    println!("API/store create throughput ratio: {ratio:.3}");
    // What the cores could do if nothing else ran: the CPU each create
    // costs (server + client) against the core count, for the API and the
    // store alike. The floor is what any request costs before its own work.
    let (server_us, client_us) = create.cpu_us();
    let (_, store_us) = raw.cpu_us();
    let (floor_server_us, floor_client_us) = floor.cpu_us();
    println!(
        "per create beyond the store's own {store_us:.0} us: server {:.0} us (of which {floor_server_us:.0} any request costs), client {client_us:.0} us (floor {floor_client_us:.0})",
        server_us - store_us
    );
    let api_cpu_ceiling = cpus as f64 * 1e6 / (server_us + client_us).max(1e-9);
    let store_cpu_ceiling = cpus as f64 * 1e6 / store_us.max(1e-9);
    println!(
        "CPU-bound ceilings on {cpus} idle CPUs: API {api_cpu_ceiling:.0} creates/s (server {server_us:.0} + client {client_us:.0} us each), store {store_cpu_ceiling:.0} writes/s ({store_us:.0} us each); ratio of ceilings {:.3}",
        api_cpu_ceiling / store_cpu_ceiling.max(1e-9)
    );

    // 2. gets and label-selected pages through the API, then one full list.
    let get = phase(
        pid,
        pods.gets(args.gets.unwrap_or(args.pods), args.pods, args.concurrency),
    )
    .await
    .context("API gets")?;
    get.print("API get   ");
    let list = phase(pid, pods.lists(args.lists, args.concurrency))
        .await
        .context("label-selected lists")?;
    list.print("API list (label selector, pages of 100)");
    let (listed, full_list) = pods.full_list().await?;
    println!("API full list of {listed} pods: {:.1} ms", ms(full_list));
    let rss_after_pods = cpu::peak_rss_kib(pid);

    // 3. watch fan-out
    let (deliveries, complete, ev_wall) = watch_fanout(&client, args.watchers, args.events).await?;
    let watch_p50 = percentile(&deliveries, 0.5);
    let watch_p99 = percentile(&deliveries, 0.99);
    println!(
        "watch: {} watchers, {} events in {:.1} s, {} deliveries ({} watchers got all), delivery p50 {:.3} ms p99 {:.3} ms",
        args.watchers, args.events, ev_wall.as_secs_f64(), deliveries.len(), complete, ms(watch_p50), ms(watch_p99)
    );
    let rss = cpu::peak_rss_kib(pid);
    println!(
        "server peak RSS: {:.1} MiB after {} pods, {:.1} MiB at the end",
        rss_after_pods as f64 / 1024.0,
        args.pods,
        rss as f64 / 1024.0
    );
    drop(server);
    let r3 = |x: f64| (x * 1000.0).round() / 1000.0;
    let out = json!({
        "pods": args.pods, "concurrency": args.concurrency, "rounds": rounds, "cpus": cpus,
        "client": format!("{:?}", args.client).to_lowercase(), "components": args.components,
        "api_create_p50_ms": ms(create.p50), "api_create_p99_ms": ms(create.p99), "api_create_per_s": create.per_s.round(),
        "api_get_p50_ms": ms(get.p50), "api_get_p99_ms": ms(get.p99), "api_get_per_s": get.per_s.round(),
        "api_list_p50_ms": ms(list.p50), "api_list_p99_ms": ms(list.p99), "api_list_per_s": list.per_s.round(),
        "api_full_list_ms": ms(full_list),
        "store_create_p50_ms": ms(raw.p50), "store_create_p99_ms": ms(raw.p99), "store_create_per_s": raw.per_s.round(),
        "api_store_create_throughput_ratio": r3(ratio),
        "api_floor_p50_ms": ms(floor.p50), "api_floor_p99_ms": ms(floor.p99), "api_floor_per_s": floor.per_s.round(),
        "server_cpu_us_per_floor_request": floor_server_us.round(), "client_cpu_us_per_floor_request": floor_client_us.round(),
        "server_cpu_us_per_create": server_us.round(), "client_cpu_us_per_create": client_us.round(),
        "server_cpu_us_per_get": get.cpu_us().0.round(), "server_cpu_us_per_list": list.cpu_us().0.round(),
        "store_cpu_us_per_write": store_us.round(),
        "others_cpu_share_during_creates": r3(create.others_share()),
        "others_cpu_share_during_store_writes": r3(raw.others_share()),
        "api_cpu_ceiling_creates_per_s": api_cpu_ceiling.round(),
        "store_cpu_ceiling_writes_per_s": store_cpu_ceiling.round(),
        "server_peak_rss_mib_after_pods": (rss_after_pods as f64 / 1024.0).round(),
        "server_peak_rss_mib": (rss as f64 / 1024.0).round(),
        "watchers": args.watchers, "watch_events": args.events, "watch_deliveries": deliveries.len(),
        "watchers_complete": complete,
        "watch_delivery_p50_ms": ms(watch_p50), "watch_delivery_p99_ms": ms(watch_p99),
    });
    println!("{out}");
    Ok(())
}
