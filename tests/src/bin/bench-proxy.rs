//! Service proxy benchmark: 1,000 and 10,000 services with 5 endpoints
//! each, straight through the proxy's sync (no pods, no API server), in
//! nftables and iptables mode, inside a network namespace of its own.
//!
//! For each mode and size it times the first full sync, the update of a
//! single endpoint (and the addition of one service), and in the same run
//! the physical floor: the very ruleset of the full sync loaded with one
//! raw `nft -f` (`iptables-restore` in iptables mode) into a fresh
//! namespace, then the very delta of each change loaded raw the same way,
//! and the cost of running the tool at all (an empty transaction). Ends
//! with one JSON line. SIGINT or SIGTERM deletes the run's namespaces, and
//! a run deletes those a killed one left behind.
//!
//! Run as root: `cargo run --release -p skiff-tests --bin bench-proxy
//! [-- --sizes 1000,10000 --updates 20 --modes nftables,iptables]`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use skiff_proxy::model::{Endpoint, Protocol, ServicePort, ServicePortName, Targets};
use skiff_proxy::{iptables, nftables, Backend, Change, Mode};

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

/// The benchmark's namespaces are `skiff-bench-<pid>-<tag>`.
const NETNS_PREFIX: &str = "skiff-bench-";

/// A namespace of the benchmark's own, deleted on drop.
struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Result<Netns> {
        let name = format!("{NETNS_PREFIX}{}-{tag}", std::process::id());
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

/// Deletes the namespaces (and so the rules) of earlier runs whose process
/// is gone, and with `own` this run's too.
fn remove_namespaces(own: bool) {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = name
            .strip_prefix(NETNS_PREFIX)
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok());
        let Some(pid) = pid else { continue };
        let gone = !std::path::Path::new(&format!("/proc/{pid}")).exists();
        if gone || (own && pid == me) {
            let _ = Command::new("ip").args(["netns", "del", &name]).status();
        }
    }
}

/// On SIGINT or SIGTERM delete this run's namespaces, then exit: drops do
/// not run when a signal ends the process. Called before any other thread
/// starts, so that all of them inherit the blocked mask and the signals
/// reach only the waiting thread (child processes get a clean mask).
fn clean_up_on_signals() -> Result<()> {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    set.thread_block()?;
    std::thread::spawn(move || {
        if let Ok(sig) = set.wait() {
            remove_namespaces(true);
            std::process::exit(128 + sig as i32);
        }
    });
    Ok(())
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

/// The tool that loads a script of `mode`, for the figures' labels.
fn tool(mode: Mode) -> &'static str {
    match mode {
        Mode::Iptables => "iptables-restore",
        _ => "nft",
    }
}

#[derive(Debug, Default)]
struct Figures {
    full: Duration,
    raw_full: Duration,
    empty_tx: Duration,
    update: Vec<Duration>,
    raw_update: Vec<Duration>,
    add: Vec<Duration>,
}

/// The jumps from the built-in chains that the backend adds after its
/// full sync, as restore input. They belong in the floor: once the proxy's
/// chains hang off a hooked chain, the kernel validates what they reach on
/// every transaction, which is most of a delta's cost at 10,000 services.
fn iptables_jumps() -> String {
    let mut text = String::new();
    for table in [iptables::Table::Nat, iptables::Table::Filter] {
        text.push_str(&format!("*{}\n", table.name()));
        for (_, from, to) in iptables::JUMPS.iter().filter(|(t, _, _)| *t == table) {
            let args: Vec<String> = iptables::jump_args(table, to)
                .into_iter()
                .map(|a| {
                    if a.contains(' ') {
                        format!("\"{a}\"")
                    } else {
                        a
                    }
                })
                .collect();
            text.push_str(&format!("-I {from} {}\n", args.join(" ")));
        }
        text.push_str("COMMIT\n");
    }
    text
}

/// Times `scripts` loaded raw by `backend`'s tool, one after the other.
async fn raw(backend: &Backend, scripts: &[String]) -> Result<Vec<Duration>> {
    let mut out = Vec::new();
    for text in scripts {
        let start = Instant::now();
        backend.load(text).await?;
        out.push(start.elapsed());
    }
    Ok(out)
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
    // One endpoint of one service replaced by a new one, each time in a
    // different service spread over the table; then services added.
    let changes: Vec<Change> = (0..updates)
        .map(|k| {
            let i = (k * 7919) % n;
            let mut eps: Vec<Endpoint> = (0..5).map(|j| endpoint(i, j)).collect();
            eps[2].ip = Ipv4Addr::new(198, 18, 255, (k % 250) as u8 + 1);
            (i, eps)
        })
        .chain((0..updates).map(|k| {
            let i = n + k;
            (i, (0..5).map(|j| endpoint(i, j)).collect())
        }))
        .map(|(i, eps)| Change {
            namespace: "bench".into(),
            name: format!("svc-{i}"),
            ports: vec![(service(i), Targets::of(eps))],
        })
        .collect();

    // The floor: the same ruleset the backend's full sync writes, loaded
    // raw into a fresh namespace, then the same deltas each change writes,
    // from a twin backend fed the same changes (its scripts, not applied).
    let mut twin = Backend::new(mode, Some("198.18.0.0/24".into())).context("backend")?;
    let mut full = twin.full_script(&all, false, &BTreeSet::new()).0;
    if mode == Mode::Iptables {
        full.push_str(&iptables_jumps());
    }
    let mut scripts = vec![full];
    scripts.extend(
        changes
            .iter()
            .map(|c| twin.partial_script(std::slice::from_ref(c)).0),
    );
    let floor_ns = Netns::new("floor")?;
    let (floor, empty_tx) = floor_ns.run(|| async {
        let floor = raw(&twin, &scripts).await?;
        // What running the tool costs with nothing to do.
        let noop = match mode {
            Mode::Iptables => "*nat\nCOMMIT\n".to_string(),
            _ => format!("add table ip {}\n", nftables::TABLE),
        };
        let noops = raw(&twin, &vec![noop; 5]).await?;
        Ok::<_, anyhow::Error>((floor, noops.into_iter().min().unwrap_or_default()))
    })?;
    drop(floor_ns);

    let ns = Netns::new("proxy")?;
    let synced = ns.run(|| async {
        let mut backend = Backend::new(mode, Some("198.18.0.0/24".into())).context("backend")?;
        let start = Instant::now();
        backend.full_sync(&all, false).await?;
        let mut took = vec![start.elapsed()];
        for change in &changes {
            let start = Instant::now();
            let synced = backend.partial_sync(std::slice::from_ref(change)).await?;
            took.push(start.elapsed());
            ensure!(synced.stats.service_ports == 1, "a change changed nothing");
        }
        Ok::<_, anyhow::Error>(took)
    })?;
    let split = |d: &[Duration]| {
        let mut update = d[1..=updates].to_vec();
        let mut add = d[updates + 1..].to_vec();
        update.sort();
        add.sort();
        (d[0], update, add)
    };
    let (full, update, add) = split(&synced);
    let (raw_full, raw_update, _) = split(&floor);
    Ok(Figures {
        full,
        raw_full,
        empty_tx,
        update,
        raw_update,
        add,
    })
}

fn main() -> Result<()> {
    ensure!(
        nix::unistd::geteuid().is_root(),
        "bench-proxy needs root (it creates network namespaces)"
    );
    let a = args()?;
    remove_namespaces(false);
    clean_up_on_signals()?;
    let mut json = BTreeMap::new();
    for mode in &a.modes {
        for &n in &a.sizes {
            let f = one(*mode, n, a.updates)?;
            let key = format!("{mode}_{n}");
            let update_p50 = percentile(&f.update, 0.5);
            let update_p99 = percentile(&f.update, 0.99);
            let raw_update_p50 = percentile(&f.raw_update, 0.5);
            let update_ratio = update_p50.as_secs_f64() / raw_update_p50.as_secs_f64().max(1e-9);
            let add_p50 = percentile(&f.add, 0.5);
            let ratio = f.full.as_secs_f64() / f.raw_full.as_secs_f64().max(1e-9);
            println!(
                "{mode:>8} {n:>6} services x 5 endpoints: full sync {:.1} ms (raw {program} of the same ruleset {:.1} ms, ratio {ratio:.2}); \
                 one endpoint changed p50 {:.2} ms p99 {:.2} ms (raw {program} of the same change p50 {:.2} ms, ratio {update_ratio:.2}); \
                 one service added p50 {:.2} ms; \
                 an empty {program} transaction {:.2} ms",
                ms(f.full),
                ms(f.raw_full),
                ms(update_p50),
                ms(update_p99),
                ms(raw_update_p50),
                ms(add_p50),
                ms(f.empty_tx),
                program = tool(*mode),
            );
            json.insert(
                key,
                serde_json::json!({
                    "full_sync_ms": ms(f.full),
                    "raw_full_ms": ms(f.raw_full),
                    "full_over_raw": (ratio * 100.0).round() / 100.0,
                    "endpoint_update_p50_ms": ms(update_p50),
                    "endpoint_update_p99_ms": ms(update_p99),
                    "raw_endpoint_update_p50_ms": ms(raw_update_p50),
                    "endpoint_update_over_raw": (update_ratio * 100.0).round() / 100.0,
                    "service_add_p50_ms": ms(add_p50),
                    "empty_transaction_ms": ms(f.empty_tx),
                }),
            );
        }
    }
    println!("{}", serde_json::to_string(&json)?);
    Ok(())
}
