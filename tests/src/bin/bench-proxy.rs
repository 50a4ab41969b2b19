//! Service proxy benchmark: 1,000 and 10,000 services with 5 endpoints
//! each, straight through the proxy's sync (no pods, no API server), in
//! nftables and iptables mode, inside a network namespace of its own.
//!
//! For each mode and size it times the first full sync, the update of a
//! single endpoint (and the addition of one service), and in the same run
//! the physical floor: the very ruleset of the full sync loaded with one
//! raw `nft -f` (`iptables-restore` in iptables mode) into a fresh
//! namespace, and the cost of running the tool at all (an empty
//! transaction). Ends with one JSON line.
//!
//! Run as root: `cargo run --release -p skiff-tests --bin bench-proxy
//! [-- --sizes 1000,10000 --updates 20 --modes nftables,iptables]`.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use skiff_agent::proxy::model::{Endpoint, Protocol, ServicePort, ServicePortName, Targets};
use skiff_agent::proxy::{exec, iptables, nftables, Backend, Change, Mode};

struct Args {
    sizes: Vec<usize>,
    updates: usize,
    modes: Vec<Mode>,
}

fn args() -> Result<Args> {
    let mut a = Args {
        sizes: vec![1_000, 10_000],
        updates: 20,
        modes: vec![Mode::Nftables, Mode::Iptables],
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--sizes" => {
                a.sizes = value
                    .split(',')
                    .map(|s| s.parse().context("--sizes"))
                    .collect::<Result<_>>()?
            }
            "--updates" => a.updates = value.parse().context("--updates")?,
            "--modes" => {
                a.modes = value
                    .split(',')
                    .map(|s| s.parse().map_err(anyhow::Error::from))
                    .collect::<Result<_>>()?
            }
            other => bail!("unknown flag {other} (--sizes, --updates, --modes)"),
        }
    }
    Ok(a)
}

/// A namespace of the benchmark's own, deleted on drop.
struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Result<Netns> {
        let name = format!("skiff-bench-{}-{tag}", std::process::id());
        let ok = Command::new("ip").args(["netns", "add", &name]).status()?;
        ensure!(ok.success(), "ip netns add {name} (run as root)");
        Ok(Netns(name))
    }

    /// Run `f` on a thread inside the namespace (child processes inherit
    /// it), with a runtime of its own.
    fn run<F, Fut, R>(&self, f: F) -> R
    where
        F: FnOnce() -> Fut + Send,
        Fut: std::future::Future<Output = R>,
        R: Send,
    {
        std::thread::scope(|s| {
            s.spawn(|| {
                let file =
                    std::fs::File::open(format!("/run/netns/{}", self.0)).expect("netns file");
                nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime")
                    .block_on(f())
            })
            .join()
            .expect("benchmark thread")
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn vip(i: usize) -> Ipv4Addr {
    // 198.19.0.0/16 holds 65,536 addresses: enough for every size here.
    Ipv4Addr::new(198, 19, (i >> 8) as u8, (i & 0xff) as u8)
}

fn endpoint(i: usize, j: usize) -> Endpoint {
    // Endpoints in 198.18.0.0/16, distinct per service; one in five on
    // this node.
    let n = (i * 5 + j) as u32;
    let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 0, 0)) + (n % 65_000) + 1);
    Endpoint::ready(ip, 8080, j == 0)
}

fn service(i: usize) -> ServicePort {
    let name = ServicePortName::new("bench", &format!("svc-{i}"), "http", Protocol::Tcp);
    ServicePort::cluster_ip(name, vip(i), 80)
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// The tool and its arguments for applying a script of `mode`.
fn tool(mode: Mode) -> (&'static str, &'static [&'static str]) {
    match mode {
        Mode::Iptables => ("iptables-restore", &["-w", "--noflush"]),
        _ => ("nft", &["-f", "-"]),
    }
}

#[derive(Debug, Default)]
struct Figures {
    full: Duration,
    raw_full: Duration,
    empty_tx: Duration,
    update: Vec<Duration>,
    add: Vec<Duration>,
}

fn one(mode: Mode, n: usize, updates: usize) -> Result<Figures> {
    let all: Vec<(ServicePort, Targets)> = (0..n)
        .map(|i| {
            (
                service(i),
                Targets::of((0..5).map(|j| endpoint(i, j)).collect()),
            )
        })
        .collect();

    // The floor: the same ruleset the proxier's full sync writes, loaded
    // raw into a fresh namespace.
    let text = match mode {
        Mode::Iptables => {
            iptables::Proxier::new(Some("198.18.0.0/24".into()))
                .full_sync(all.iter().map(|(s, t)| (s, t)), &Default::default())
                .text
        }
        _ => {
            nftables::Proxier::new(Some("198.18.0.0/24".into()))
                .full_sync(nftables::Full::Replace, all.iter().map(|(s, t)| (s, t)))
                .0
        }
    };
    let (program, args) = tool(mode);
    let floor_ns = Netns::new("floor")?;
    let (raw_full, empty_tx) = floor_ns.run(|| async {
        let start = Instant::now();
        exec::run(program, args, &text).await?;
        let raw = start.elapsed();
        // What running the tool costs with nothing to do.
        let noop = match mode {
            Mode::Iptables => "*nat\nCOMMIT\n".to_string(),
            _ => format!("add table ip {}\n", nftables::TABLE),
        };
        let mut best = Duration::MAX;
        for _ in 0..5 {
            let start = Instant::now();
            exec::run(program, args, &noop).await?;
            best = best.min(start.elapsed());
        }
        Ok::<_, anyhow::Error>((raw, best))
    })?;
    drop(floor_ns);

    let ns = Netns::new("proxy")?;
    let figures = ns.run(|| async {
        let mut backend = Backend::new(mode, Some("198.18.0.0/24".into())).context("backend")?;
        let start = Instant::now();
        backend.full_sync(&all, false).await?;
        let full = start.elapsed();

        // One endpoint of one service replaced by a new one, each time in
        // a different service spread over the table.
        let mut update = Vec::new();
        for k in 0..updates {
            let i = (k * 7919) % n;
            let mut eps: Vec<Endpoint> = (0..5).map(|j| endpoint(i, j)).collect();
            eps[2].ip = Ipv4Addr::new(198, 18, 255, (k % 250) as u8 + 1);
            let change = Change {
                namespace: "bench".into(),
                name: format!("svc-{i}"),
                ports: vec![(service(i), Targets::of(eps))],
            };
            let start = Instant::now();
            let synced = backend.partial_sync(&[change]).await?;
            update.push(start.elapsed());
            ensure!(
                synced.stats.service_ports == 1,
                "the update changed nothing"
            );
        }
        // One service added.
        let mut add = Vec::new();
        for k in 0..updates {
            let i = n + k;
            let change = Change {
                namespace: "bench".into(),
                name: format!("svc-{i}"),
                ports: vec![(
                    service(i),
                    Targets::of((0..5).map(|j| endpoint(i, j)).collect()),
                )],
            };
            let start = Instant::now();
            backend.partial_sync(&[change]).await?;
            add.push(start.elapsed());
        }
        update.sort();
        add.sort();
        Ok::<_, anyhow::Error>(Figures {
            full,
            raw_full,
            empty_tx,
            update,
            add,
        })
    })?;
    Ok(figures)
}

fn main() -> Result<()> {
    ensure!(
        nix::unistd::geteuid().is_root(),
        "bench-proxy needs root (it creates network namespaces)"
    );
    let a = args()?;
    let mut json = BTreeMap::new();
    for mode in &a.modes {
        for &n in &a.sizes {
            let f = one(*mode, n, a.updates)?;
            let key = format!("{mode}_{n}");
            let update_p50 = percentile(&f.update, 0.5);
            let update_p99 = percentile(&f.update, 0.99);
            let add_p50 = percentile(&f.add, 0.5);
            let ratio = f.full.as_secs_f64() / f.raw_full.as_secs_f64().max(1e-9);
            println!(
                "{mode:>8} {n:>6} services x 5 endpoints: full sync {:.1} ms (raw {program} of the same ruleset {:.1} ms, ratio {ratio:.2}); \
                 one endpoint changed p50 {:.2} ms p99 {:.2} ms; one service added p50 {:.2} ms; \
                 an empty {program} transaction {:.2} ms",
                ms(f.full),
                ms(f.raw_full),
                ms(update_p50),
                ms(update_p99),
                ms(add_p50),
                ms(f.empty_tx),
                program = tool(*mode).0,
            );
            json.insert(
                key,
                serde_json::json!({
                    "full_sync_ms": ms(f.full),
                    "raw_full_ms": ms(f.raw_full),
                    "full_over_raw": (ratio * 100.0).round() / 100.0,
                    "endpoint_update_p50_ms": ms(update_p50),
                    "endpoint_update_p99_ms": ms(update_p99),
                    "service_add_p50_ms": ms(add_p50),
                    "empty_transaction_ms": ms(f.empty_tx),
                }),
            );
        }
    }
    println!("{}", serde_json::to_string(&json)?);
    Ok(())
}
