//! Watch cache benchmark: `--watchers` watches of one namespace's
//! ConfigMaps through the watch cache against the same through direct
//! store watches (`--watch-cache=false`), on a real etcd, in the same run:
//! the watches etcd holds for them, the server's RSS, and the time
//! `--events` creates take to reach every watcher. Prints figures and
//! ratios, then one JSON line.
//!
//! Run: `cargo build --release -p skiff-control-plane --bin skiff-server --examples`
//! then `target/release/examples/bench_watch_cache [--watchers N] [--events E]`.
//!
//! Aim: etcd holds one watch for all watchers through the cache (against
//! one each without it), at no more RSS and no slower delivery.

#[path = "bench_apiserver/cpu.rs"]
#[allow(dead_code)]
mod cpu;
#[path = "bench_apiserver/process.rs"]
mod process;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use process::{free_port, server_bin, ServerProc};
use serde_json::json;

#[derive(Parser, Debug)]
struct Args {
    #[arg(long, default_value_t = 1000)]
    watchers: usize,
    #[arg(long, default_value_t = 100)]
    events: usize,
    /// The skiff-server binary [default: next to this example's directory].
    #[arg(long)]
    server_bin: Option<PathBuf>,
}

fn start_etcd(dir: &Path, client: u16, peer: u16) -> anyhow::Result<ServerProc> {
    let log = std::fs::File::create(dir.join("etcd.log"))?;
    let c = format!("http://127.0.0.1:{client}");
    let p = format!("http://127.0.0.1:{peer}");
    let child = Command::new("/usr/bin/etcd")
        .args(["--name", "bench", "--data-dir"])
        .arg(dir.join("etcd"))
        .args(["--listen-client-urls", &c, "--advertise-client-urls", &c])
        .args([
            "--listen-peer-urls",
            &p,
            "--initial-advertise-peer-urls",
            &p,
        ])
        .args(["--initial-cluster", &format!("bench={p}")])
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting /usr/bin/etcd (Debian package etcd-server)")?;
    Ok(ServerProc(child))
}

/// One sample of etcd's own `/metrics`.
fn etcd_metric(port: u16, name: &str) -> anyhow::Result<f64> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .with_context(|| format!("etcd reports no {name}"))
}

fn start_server(
    bin: &Path,
    data: &Path,
    port: u16,
    etcd: u16,
    cache: bool,
) -> anyhow::Result<ServerProc> {
    let child = Command::new(bin)
        .arg("--data-dir")
        .arg(data)
        .args(["--bind-address", "127.0.0.1", "--secure-port"])
        .arg(port.to_string())
        .args(["--service-cluster-ip-range", "198.19.0.0/16"])
        .args(["--cluster-cidr", "198.18.0.0/16"])
        .arg("--datastore-endpoint")
        .arg(format!("http://127.0.0.1:{etcd}"))
        .arg(format!("--watch-cache={cache}"))
        .args(["--max-connections-per-source", "0"])
        .args(["--disable-scheduler", "--disable-controller-manager"])
        .arg("--etcd-disable-snapshots")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    Ok(ServerProc(child))
}

async fn client(data: &Path) -> anyhow::Result<kube::Client> {
    let path = data.join("admin.kubeconfig");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(kc) = kube::config::Kubeconfig::read_from(&path) {
            let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
            let c = kube::Client::try_from(cfg)?;
            let ns: Api<Namespace> = Api::all(c.clone());
            if ns.get("default").await.is_ok() {
                return Ok(c);
            }
        }
        if Instant::now() > deadline {
            bail!("the server on {} did not come up", data.display());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

struct Run {
    /// Watches etcd gained for the watchers.
    etcd_watchers: f64,
    rss_mib: f64,
    peak_rss_mib: f64,
    /// From the first create to the last watcher's last event.
    delivery: Duration,
}

async fn run(args: &Args, bin: &Path, root: &Path, etcd: u16, cache: bool) -> anyhow::Result<Run> {
    let data = root.join(if cache { "cache" } else { "direct" });
    let server = start_server(bin, &data, free_port()?, etcd, cache)?;
    let c = client(&data).await?;
    let ns = if cache { "bench-cache" } else { "bench-direct" };
    let nss: Api<Namespace> = Api::all(c.clone());
    let obj: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
    nss.create(&PostParams::default(), &obj).await?;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), ns);
    let rv = cms
        .list(&Default::default())
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let before = etcd_metric(etcd, "etcd_debugging_mvcc_watcher_total")?;

    // Each watcher counts the creates it saw; `got` the watchers done.
    let want = args.events + 1;
    let got = Arc::new(AtomicUsize::new(0));
    let warm = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..args.watchers {
        let (cms, rv, got, warm) = (cms.clone(), rv.clone(), got.clone(), warm.clone());
        tasks.push(tokio::spawn(async move {
            let Ok(stream) = cms.watch(&WatchParams::default(), &rv).await else {
                return;
            };
            let mut stream = stream.boxed();
            let mut n = 0;
            while n < want {
                match tokio::time::timeout(Duration::from_secs(120), stream.next()).await {
                    Ok(Some(Ok(WatchEvent::Added(_)))) => {
                        n += 1;
                        if n == 1 {
                            warm.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Ok(Some(Ok(_))) => {}
                    _ => return,
                }
            }
            got.fetch_add(1, Ordering::Relaxed);
            // Held open until the figures are read.
            let _ = stream.next().await;
        }));
    }
    // One create every watcher sees: all are established.
    let warmup: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "warmup"}}))?;
    cms.create(&PostParams::default(), &warmup).await?;
    let deadline = Instant::now() + Duration::from_secs(120);
    while warm.load(Ordering::Relaxed) < args.watchers {
        if Instant::now() > deadline {
            bail!(
                "only {} of {} watchers saw the first event",
                warm.load(Ordering::Relaxed),
                args.watchers
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let start = Instant::now();
    for i in 0..args.events {
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": format!("ev-{i:04}")}}))?;
        cms.create(&PostParams::default(), &cm).await?;
    }
    while got.load(Ordering::Relaxed) < args.watchers {
        if Instant::now() > deadline + Duration::from_secs(120) {
            bail!(
                "only {} of {} watchers saw every event",
                got.load(Ordering::Relaxed),
                args.watchers
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let delivery = start.elapsed();
    let after = etcd_metric(etcd, "etcd_debugging_mvcc_watcher_total")?;
    let pid = server.0.id();
    let out = Run {
        etcd_watchers: after - before,
        rss_mib: cpu::rss_kib(pid) as f64 / 1024.0,
        peak_rss_mib: cpu::peak_rss_kib(pid) as f64 / 1024.0,
        delivery,
    };
    for t in &tasks {
        t.abort();
    }
    drop(server);
    Ok(out)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    // A connection per watch, in this process.
    skiff_daemon::limits::raise_fd_limit()?;
    let bin = server_bin(args.server_bin.as_deref())?;
    let root = tempfile::tempdir()?;
    let etcd_port = free_port()?;
    let _etcd = start_etcd(root.path(), etcd_port, free_port()?)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while etcd_metric(etcd_port, "etcd_debugging_mvcc_watcher_total").is_err() {
        if Instant::now() > deadline {
            bail!("etcd did not come up");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let cached = run(&args, &bin, root.path(), etcd_port, true).await?;
    let direct = run(&args, &bin, root.path(), etcd_port, false).await?;
    println!(
        "{} watchers of one type, {} creates, on etcd:",
        args.watchers, args.events
    );
    for (what, r) in [("watch cache", &cached), ("direct", &direct)] {
        println!(
            "  {what:<12} etcd watches {:>6}   server RSS {:>6.1} MiB (peak {:>6.1})   every event to every watcher in {:>7.1} ms",
            r.etcd_watchers,
            r.rss_mib,
            r.peak_rss_mib,
            r.delivery.as_secs_f64() * 1e3
        );
    }
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
    let watches = ratio(cached.etcd_watchers, direct.etcd_watchers);
    let rss = ratio(cached.rss_mib, direct.rss_mib);
    let time = ratio(cached.delivery.as_secs_f64(), direct.delivery.as_secs_f64());
    println!("  ratios cache/direct: etcd watches {watches:.3}, RSS {rss:.2}, delivery time {time:.2}   (aim: 1 watch against {}, RSS <= 1, time <= 1)", args.watchers);
    println!(
        "{}",
        json!({
            "watchers": args.watchers,
            "events": args.events,
            "cache_etcd_watches": cached.etcd_watchers,
            "direct_etcd_watches": direct.etcd_watchers,
            "cache_rss_mib": cached.rss_mib,
            "direct_rss_mib": direct.rss_mib,
            "cache_delivery_ms": cached.delivery.as_secs_f64() * 1e3,
            "direct_delivery_ms": direct.delivery.as_secs_f64() * 1e3,
            "rss_ratio": rss,
            "delivery_ratio": time,
        })
    );
    Ok(())
}
