//! API server benchmark: pod creates, gets and lists through the HTTPS API
//! (kube-rs client, concurrency 32) against the same number of raw store
//! writes in the same run, the server's peak RSS, and watch fan-out
//! (500 watchers x 1,000 events). Prints figures, then one JSON line.
//!
//! Run: `cargo build --release -p skiff-control-plane --bin skiff-server --examples`
//! then `target/release/examples/bench_apiserver [--pods N] [--concurrency C]
//! [--watchers W] [--events E] [--server-bin PATH]`.
//!
//! The server runs as its own process (the `skiff-server` binary next to
//! this example) so that its RSS is its own.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;
use skiff_control_plane::store::bench::{bench_raw_writes, percentile};
use skiff_control_plane::store::{SqliteStore, Store, SQLITE_FILE};

#[derive(Parser, Debug)]
struct Args {
    #[arg(long, default_value_t = 10_000)]
    pods: usize,
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    #[arg(long, default_value_t = 1_000)]
    lists: usize,
    #[arg(long, default_value_t = 500)]
    watchers: usize,
    #[arg(long, default_value_t = 1_000)]
    events: usize,
    /// skiff-server binary [default: next to this example's directory].
    #[arg(long)]
    server_bin: Option<PathBuf>,
}

/// Kills the server on drop.
struct ServerProc(Child);

impl Drop for ServerProc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// CPU time (user + system) the process has used, in seconds.
fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are 14th and 15th.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

struct Figures {
    p50: Duration,
    p99: Duration,
    per_s: f64,
    n: usize,
}

fn figures(lat: &[Duration], wall: Duration) -> Figures {
    Figures {
        p50: percentile(lat, 0.5),
        p99: percentile(lat, 0.99),
        per_s: lat.len() as f64 / wall.as_secs_f64().max(1e-9),
        n: lat.len(),
    }
}

/// Run `n` operations with `conc` workers; `op(i)` is one operation.
async fn drive<F, Fut>(n: usize, conc: usize, op: F) -> (Vec<Duration>, Duration)
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send,
{
    let op = Arc::new(op);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..conc)
        .map(|_| {
            let (op, next) = (op.clone(), next.clone());
            tokio::spawn(async move {
                let mut lat = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return lat;
                    }
                    let t = Instant::now();
                    match op(i).await {
                        Ok(()) => lat.push(t.elapsed()),
                        Err(e) => eprintln!("operation {i} failed: {e:#}"),
                    }
                }
            })
        })
        .collect();
    let mut all = Vec::with_capacity(n);
    for w in workers {
        all.extend(w.await.unwrap_or_default());
    }
    (all, started.elapsed())
}

fn pod(i: usize) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("bench-{i:05}"), "labels": {"app": "bench", "shard": (i % 16).to_string()}},
        "spec": {"containers": [{"name": "app", "image": "registry.local/bench:1.0", "args": ["--serve", "--port=8080"],
            "ports": [{"containerPort": 8080}], "env": [{"name": "MODE", "value": "bench"}],
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}
    }))
    .expect("pod literal")
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    let dir = tempfile::tempdir()?;
    let bin = match &args.server_bin {
        Some(b) => b.clone(),
        None => std::env::current_exe()?
            .parent()
            .and_then(|p| p.parent())
            .context("locating target dir")?
            .join("skiff-server"),
    };
    if !bin.exists() {
        bail!("{} not found: build it with `cargo build --release -p skiff-control-plane --bin skiff-server` or pass --server-bin", bin.display());
    }
    let port = free_port()?;
    let data = dir.path().join("server");
    let child = Command::new(&bin)
        .args([
            "--data-dir",
            &data.display().to_string(),
            "--secure-port",
            &port.to_string(),
            "--service-cluster-ip-range",
            "198.19.0.0/16",
        ])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let server = ServerProc(child);
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
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");

    // 1. creates through the API
    let cpu0 = cpu_secs(pid);
    let p = pods.clone();
    let (lat, wall) = drive(args.pods, args.concurrency, move |i| {
        let p = p.clone();
        async move {
            p.create(&PostParams::default(), &pod(i)).await?;
            Ok(())
        }
    })
    .await;
    let create = figures(&lat, wall);
    let server_cpu_us_per_create = (cpu_secs(pid) - cpu0) * 1e6 / create.n.max(1) as f64;
    println!("server CPU per create: {server_cpu_us_per_create:.0} us (the client shares the machine's cores)");
    println!(
        "API create: {} ok, p50 {:.3} ms, p99 {:.3} ms, {:.0}/s",
        create.n,
        ms(create.p50),
        ms(create.p99),
        create.per_s
    );

    // 2. gets
    let p = pods.clone();
    let n = args.pods;
    let (lat, wall) = drive(args.pods, args.concurrency, move |i| {
        let p = p.clone();
        async move {
            p.get(&format!("bench-{:05}", (i * 7919) % n)).await?;
            Ok(())
        }
    })
    .await;
    let get = figures(&lat, wall);
    println!(
        "API get:    {} ok, p50 {:.3} ms, p99 {:.3} ms, {:.0}/s",
        get.n,
        ms(get.p50),
        ms(get.p99),
        get.per_s
    );

    // 3. lists: pages of 100 with a label selector (what controllers do),
    // and one full list of every pod.
    let p = pods.clone();
    let (lat, wall) = drive(args.lists, args.concurrency, move |i| {
        let p = p.clone();
        async move {
            let lp = ListParams::default()
                .labels(&format!("shard={}", i % 16))
                .limit(100);
            p.list(&lp).await?;
            Ok(())
        }
    })
    .await;
    let list = figures(&lat, wall);
    let t = Instant::now();
    let all = pods.list(&ListParams::default()).await?;
    let full_list = t.elapsed();
    println!(
        "API list:   {} ok, p50 {:.3} ms, p99 {:.3} ms, {:.0}/s; full list of {} pods {:.1} ms",
        list.n,
        ms(list.p50),
        ms(list.p99),
        list.per_s,
        all.items.len(),
        ms(full_list)
    );
    let rss_after_pods = peak_rss_kib(pid);

    // 4. the same writes straight into a store of the same kind
    let raw_dir = dir.path().join("raw");
    std::fs::create_dir_all(&raw_dir)?;
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(raw_dir.join(SQLITE_FILE)).await?);
    let (lat, wall) = bench_raw_writes(store, args.pods, args.concurrency).await;
    let raw = figures(&lat, wall);
    println!(
        "store create: {} ok, p50 {:.3} ms, p99 {:.3} ms, {:.0}/s",
        raw.n,
        ms(raw.p50),
        ms(raw.p99),
        raw.per_s
    );
    let ratio = create.per_s / raw.per_s.max(1e-9);
    println!("API/store create throughput ratio: {ratio:.3}");

    // 5. watch fan-out
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-public");
    let start_rv = cms
        .list(&ListParams::default().limit(1))
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let epoch = Instant::now();
    let mut watchers = Vec::new();
    let ready = Arc::new(AtomicUsize::new(0));
    for _ in 0..args.watchers {
        let cms = cms.clone();
        let rv = start_rv.clone();
        let want = args.events;
        let ready = ready.clone();
        watchers.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(want);
            let Ok(stream) = cms.watch(&WatchParams::default(), &rv).await else {
                return lat;
            };
            ready.fetch_add(1, Ordering::Relaxed);
            let mut stream = stream.boxed();
            while lat.len() < want {
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
    while ready.load(Ordering::Relaxed) < args.watchers && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let c = cms.clone();
    let (_, ev_wall) = drive(args.events, 8, move |i| {
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
    for w in watchers {
        let l = w.await.unwrap_or_default();
        if l.len() == args.events {
            complete += 1;
        }
        deliveries.extend(l);
    }
    let watch_p50 = percentile(&deliveries, 0.5);
    let watch_p99 = percentile(&deliveries, 0.99);
    println!(
        "watch: {} watchers, {} events in {:.1} s, {} deliveries ({} watchers got all), delivery p50 {:.3} ms p99 {:.3} ms",
        args.watchers, args.events, ev_wall.as_secs_f64(), deliveries.len(), complete, ms(watch_p50), ms(watch_p99)
    );
    let rss = peak_rss_kib(pid);
    println!(
        "server peak RSS: {:.1} MiB after {} pods, {:.1} MiB at the end",
        rss_after_pods as f64 / 1024.0,
        args.pods,
        rss as f64 / 1024.0
    );
    drop(server);
    let out = json!({
        "pods": args.pods, "concurrency": args.concurrency,
        "api_create_p50_ms": ms(create.p50), "api_create_p99_ms": ms(create.p99), "api_create_per_s": create.per_s.round(),
        "api_get_p50_ms": ms(get.p50), "api_get_p99_ms": ms(get.p99), "api_get_per_s": get.per_s.round(),
        "api_list_p50_ms": ms(list.p50), "api_list_p99_ms": ms(list.p99), "api_list_per_s": list.per_s.round(),
        "api_full_list_ms": ms(full_list),
        "store_create_p50_ms": ms(raw.p50), "store_create_p99_ms": ms(raw.p99), "store_create_per_s": raw.per_s.round(),
        "api_store_create_throughput_ratio": (ratio * 1000.0).round() / 1000.0,
        "server_cpu_us_per_create": server_cpu_us_per_create.round(),
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "server_peak_rss_mib_after_pods": (rss_after_pods as f64 / 1024.0).round(),
        "server_peak_rss_mib": (rss as f64 / 1024.0).round(),
        "watchers": args.watchers, "watch_events": args.events, "watch_deliveries": deliveries.len(),
        "watchers_complete": complete,
        "watch_delivery_p50_ms": ms(watch_p50), "watch_delivery_p99_ms": ms(watch_p99),
    });
    println!("{out}");
    Ok(())
}
