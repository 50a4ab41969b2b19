//! The proxiers against the real kernel, in a network namespace of the
//! test's own: scripts load into real nftables / iptables, partial syncs
//! leave exactly what a fresh full sync writes, traffic to a ClusterIP is
//! DNATed and balanced, a service without endpoints refuses at once,
//! session affinity pins a client, a full resync keeps established
//! connections, and cleanup leaves the ruleset as it found it.
//!
//! Needs root, `ip`, `nft` and `iptables` (scripts/deps.sh installs them).
//! Endpoints are addresses on the namespace's loopback with listeners of
//! the test; ClusterIPs are routed to loopback without being local, so a
//! connection that is not DNATed goes nowhere (and times out) instead of
//! being refused by the kernel.
#![allow(clippy::disallowed_methods)] // a test harness: sync helpers (Drop, cleanup) may sleep, and short-lived commands run under the test's own timeout

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use skiff_proxy::model::{Endpoint, Protocol, ServicePort, ServicePortName, Targets};
use skiff_proxy::{cleanup, conntrack, Backend, Change, Mode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CIDR: &str = "198.18.0.0/24";

fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A network namespace, deleted on drop. Names carry the test process's
/// pid, so that a killed run's namespaces are swept by the next.
struct Netns(String);

impl Netns {
    fn new() -> Netns {
        static N: AtomicUsize = AtomicUsize::new(0);
        sweep_stale();
        let name = format!(
            "skiff-pt-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        );
        sh(&["ip", "netns", "add", &name]);
        let ns = Netns(name);
        ns.ip(&["link", "set", "lo", "up"]);
        ns.ip(&["route", "add", "198.19.0.0/16", "dev", "lo"]);
        ns
    }

    fn ip(&self, args: &[&str]) {
        let mut full = vec!["ip", "-n", &self.0];
        full.extend(args);
        sh(&full);
    }

    fn sh(&self, args: &[&str]) -> String {
        let path = format!("--net=/run/netns/{}", self.0);
        let mut full = vec!["nsenter", path.as_str()];
        full.extend(args);
        sh(&full)
    }

    /// Run `f` on a thread inside the namespace (its sockets and child
    /// processes live there) with a runtime of its own.
    fn run<F, Fut, R>(&self, f: F) -> R
    where
        F: FnOnce() -> Fut + Send,
        Fut: Future<Output = R>,
        R: Send,
    {
        std::thread::scope(|s| {
            s.spawn(|| {
                let file = std::fs::File::open(format!("/run/netns/{}", self.0)).unwrap();
                nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap()
                    .block_on(f())
            })
            .join()
            .unwrap()
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn sweep_stale() {
    let Ok(dir) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("skiff-pt-")
            .and_then(|r| r.split('-').next())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new("ip").args(["netns", "del", &name]).status();
        }
    }
}

fn port(name: &str, ip: [u8; 4]) -> ServicePort {
    let name = ServicePortName::new("default", name, "http", Protocol::Tcp);
    ServicePort::cluster_ip(name, Ipv4Addr::from(ip), 80)
}

/// Endpoints 198.18.0.`last`:8080, all on this node.
fn targets(lasts: &[u8]) -> Targets {
    Targets::of(
        lasts
            .iter()
            .map(|l| Endpoint::ready(Ipv4Addr::new(198, 18, 0, *l), 8080, true))
            .collect(),
    )
}

fn change(p: &ServicePort, t: Targets) -> Change {
    Change {
        namespace: p.name.namespace.clone(),
        name: p.name.name.clone(),
        ports: vec![(p.clone(), t)],
    }
}

/// Listeners on 198.18.0.`last`:8080 answering with their address.
async fn serve(lasts: &[u8]) {
    for l in lasts {
        let addr = SocketAddr::from(([198, 18, 0, *l], 8080));
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        tokio::spawn(async move {
            loop {
                let Ok((mut c, _)) = listener.accept().await else {
                    return;
                };
                // One line with the address per byte received, until EOF.
                tokio::spawn(async move {
                    let mut b = [0u8; 1];
                    while let Ok(1) = c.read(&mut b).await {
                        let line = format!("{}\n", addr.ip());
                        if c.write_all(line.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
    }
}

/// UDP responders on 198.18.0.`last`:5353 answering with their address.
async fn serve_udp(lasts: &[u8]) {
    for l in lasts {
        let addr = SocketAddr::from(([198, 18, 0, *l], 5353));
        let sock = tokio::net::UdpSocket::bind(addr).await.unwrap();
        tokio::spawn(async move {
            let mut buf = [0u8; 64];
            loop {
                match sock.recv_from(&mut buf).await {
                    Ok((_, from)) => {
                        let _ = sock.send_to(addr.ip().to_string().as_bytes(), from).await;
                    }
                    Err(e) => panic!("UDP server {addr}: {e}"),
                }
            }
        });
    }
}

/// Which endpoint answers a datagram to `ip`:53.
async fn hit_udp(ip: [u8; 4]) -> Option<String> {
    let sock = tokio::net::UdpSocket::bind("0.0.0.0:0").await.ok()?;
    sock.send_to(b"?", SocketAddr::from((ip, 53))).await.ok()?;
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(2), sock.recv(&mut buf))
        .await
        .ok()?
        .ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// Ask the UDP service once more from the same local port.
async fn ask_udp(flow: &tokio::net::UdpSocket) -> String {
    flow.send_to(b"?", "198.19.0.4:53").await.unwrap();
    let mut buf = [0u8; 64];
    let (n, _) = tokio::time::timeout(Duration::from_secs(2), flow.recv_from(&mut buf))
        .await
        .expect("UDP answer")
        .unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// Which endpoint answered, or the connect error's kind.
async fn hit(ip: [u8; 4]) -> Result<String, std::io::ErrorKind> {
    let connect = tokio::net::TcpStream::connect(SocketAddr::from((ip, 80)));
    let mut c = match tokio::time::timeout(Duration::from_secs(2), connect).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return Err(e.kind()),
        Err(_) => return Err(std::io::ErrorKind::TimedOut),
    };
    c.write_all(b"?").await.map_err(|e| e.kind())?;
    c.shutdown().await.map_err(|e| e.kind())?;
    let mut s = String::new();
    c.read_to_string(&mut s).await.map_err(|e| e.kind())?;
    Ok(s.trim().to_string())
}

/// Ask an open connection once more.
async fn ask(c: &mut tokio::net::TcpStream) -> String {
    c.write_all(b"?").await.unwrap();
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while c.read(&mut b).await.unwrap() == 1 && b[0] != b'\n' {
        line.push(b[0]);
    }
    String::from_utf8(line).unwrap()
}

async fn spread(ip: [u8; 4], n: usize) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    for _ in 0..n {
        *seen
            .entry(hit(ip).await.expect("service answers"))
            .or_default() += 1;
    }
    seen
}

/// The table as data, handles and backend slots dropped and elements
/// sorted, so that two listings of the same content compare equal. Left
/// out: the clients in affinity sets (traffic state), and shared chains
/// nothing jumps to (partial syncs keep them for reuse; a full sync writes
/// only those in use).
fn nft_table(ns: &Netns) -> BTreeMap<String, Vec<String>> {
    let text = ns.sh(&["nft", "-j", "list", "table", "ip", "skiff-proxy"]);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for item in v["nftables"].as_array().unwrap() {
        let Some((kind, body)) = item.as_object().and_then(|o| o.iter().next()) else {
            continue;
        };
        let mut body = body.clone();
        if let Some(o) = body.as_object_mut() {
            o.remove("handle");
        }
        match kind.as_str() {
            "rule" => {
                let chain = body["chain"].as_str().unwrap().to_string();
                out.entry(format!("chain {chain}"))
                    .or_default()
                    .push(body["expr"].to_string());
            }
            "set" | "map" => {
                let name = body["name"].as_str().unwrap().to_string();
                // Which endpoint holds which load-balancing slot depends
                // on the history of changes (survivors keep theirs), not
                // on the content: backends are compared without slots.
                let unslotted = |e: &serde_json::Value| {
                    let mut e = e.clone();
                    if name.contains("backends") {
                        if let Some(key) = e[0]["concat"].as_array_mut() {
                            key.pop();
                        }
                    }
                    e.to_string()
                };
                let mut elems: Vec<String> = body["elem"]
                    .as_array()
                    .map(|a| a.iter().map(unslotted).collect())
                    .unwrap_or_default();
                elems.sort();
                if name.starts_with("aff") {
                    elems.clear();
                }
                if let Some(o) = body.as_object_mut() {
                    o.remove("elem");
                }
                out.insert(format!("{kind} {name}"), vec![body.to_string()]);
                out.insert(format!("{kind} {name} elements"), elems);
            }
            "chain" => {
                let name = body["name"].as_str().unwrap().to_string();
                out.entry(format!("chain {name}")).or_default();
                out.insert(format!("chain {name} spec"), vec![body.to_string()]);
            }
            _ => {}
        }
    }
    let referenced: String = out
        .iter()
        .filter(|(k, _)| k.ends_with(" elements"))
        .flat_map(|(_, v)| v.iter().cloned())
        .collect();
    out.retain(|k, _| {
        let Some(chain) = k
            .strip_prefix("chain ")
            .map(|c| c.trim_end_matches(" spec"))
        else {
            return true;
        };
        let shared = ["cluster-", "external-", "nodeport-"].iter().any(|p| {
            chain
                .strip_prefix(p)
                .is_some_and(|n| n.parse::<u32>().is_ok())
        });
        !shared || referenced.contains(&format!("\"target\":\"{chain}\""))
    });
    out
}

/// The proxy's iptables chains, counters dropped.
fn ipt_rules(ns: &Netns) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for table in ["nat", "filter"] {
        for line in ns.sh(&["iptables-save", "-t", table]).lines() {
            if line.contains("SKIFF-") {
                out.insert(format!("{table} {}", line.replace("[0:0]", "")));
            }
        }
    }
    out
}

/// The whole ruleset (iptables-nft's tables included) as data. Built-in
/// chains without rules that accept everything are left out: iptables-nft
/// creates them on first use and keeps them, and they change nothing.
fn ruleset(ns: &Netns) -> BTreeSet<String> {
    let text = ns.sh(&["nft", "-j", "list", "ruleset"]);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut chains_with_rules = BTreeSet::new();
    let mut out = BTreeSet::new();
    let items = v["nftables"].as_array().unwrap();
    for item in items {
        if let Some(rule) = item.get("rule") {
            chains_with_rules.insert((rule["table"].to_string(), rule["chain"].to_string()));
            out.insert(format!(
                "rule {} {} {}",
                rule["table"], rule["chain"], rule["expr"]
            ));
        }
    }
    for item in items {
        if let Some(chain) = item.get("chain") {
            let key = (chain["table"].to_string(), chain["name"].to_string());
            let idle = chain["policy"] == "accept" && !chains_with_rules.contains(&key);
            if !idle {
                out.insert(format!("chain {} {} {}", key.0, key.1, chain["hook"]));
            }
        } else if let Some(set) = item.get("set").or_else(|| item.get("map")) {
            out.insert(format!(
                "set {} {} {}",
                set["table"], set["name"], set["elem"]
            ));
        }
    }
    out
}

fn root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    eprintln!("skipped: needs root");
    false
}

/// Both modes: balance, refuse, partial == full, affinity, cleanup.
fn exercise(mode: Mode) {
    let ns = Netns::new();
    for l in [10, 11, 12] {
        ns.ip(&["addr", "add", &format!("198.18.0.{l}/32"), "dev", "lo"]);
    }
    // Something of the operator's that must survive the proxy.
    ns.sh(&["nft", "add", "table", "inet", "operator"]);
    ns.sh(&[
        "nft",
        "add",
        "chain",
        "inet",
        "operator",
        "input",
        "{ type filter hook input priority 0 ; }",
    ]);
    ns.sh(&[
        "iptables",
        "-A",
        "INPUT",
        "-s",
        "192.0.2.1/32",
        "-j",
        "DROP",
    ]);
    let before = ruleset(&ns);

    let mut a = port("a", [198, 19, 0, 1]);
    a.external_ips = vec![Ipv4Addr::new(198, 19, 9, 9)];
    let b = port("b", [198, 19, 0, 2]);
    let mut c = port("c", [198, 19, 0, 3]);
    c.affinity_timeout = Some(60);
    let mut d = port("d", [198, 19, 0, 4]);
    d.name.protocol = Protocol::Udp;
    d.port = 53;
    let udp_targets = || {
        let mut t = targets(&[10, 11]);
        for e in t.cluster.iter_mut().chain(t.local.iter_mut()) {
            e.port = 5353;
        }
        t
    };
    let listing = |ns: &Netns| match mode {
        Mode::Nftables => format!("{:?}", nft_table(ns)),
        _ => format!("{:?}", ipt_rules(ns)),
    };

    let after_partial = ns.run(|| async {
        serve(&[10, 11, 12]).await;
        serve_udp(&[10, 11]).await;
        let mut backend = Backend::new(mode, Some(CIDR.into())).unwrap();
        backend
            .full_sync(
                &[
                    (a.clone(), targets(&[10, 11])),
                    (b.clone(), targets(&[])),
                    (c.clone(), targets(&[10, 11, 12])),
                    (d.clone(), udp_targets()),
                ],
                false,
            )
            .await
            .expect("full sync");
        let seen = spread([198, 19, 0, 1], 60).await;
        assert_eq!(seen.len(), 2, "balanced over both endpoints: {seen:?}");
        assert!(seen.values().all(|n| *n >= 10), "roughly even: {seen:?}");
        let external = hit([198, 19, 9, 9]).await;
        assert!(
            external
                .as_deref()
                .is_ok_and(|e| e.starts_with("198.18.0.1")),
            "external IP: {external:?}"
        );
        let mut udp = BTreeSet::new();
        for _ in 0..30 {
            udp.insert(hit_udp([198, 19, 0, 4]).await.expect("UDP service answers"));
        }
        assert_eq!(udp.len(), 2, "UDP balanced over both endpoints: {udp:?}");
        assert_eq!(
            hit([198, 19, 0, 2]).await,
            Err(std::io::ErrorKind::ConnectionRefused),
            "no endpoints: refused at once"
        );
        let pinned = spread([198, 19, 0, 3], 20).await;
        assert_eq!(
            pinned.len(),
            1,
            "session affinity pins the client: {pinned:?}"
        );

        // A UDP flow DNATed to an endpoint that goes away moves to one
        // that remains once its conntrack entry is cleared.
        let mut udp_flows = conntrack::Tracker::default();
        let initial = vec![(d.clone(), udp_targets())];
        assert!(
            udp_flows.replaced(&initial).is_empty(),
            "nothing flushed at start"
        );
        // One local port: one flow (unconnected, as the answer comes from
        // the endpoint's address when the reverse NAT is skipped).
        let flow = tokio::net::UdpSocket::bind("0.0.0.0:0").await.unwrap();
        let first = ask_udp(&flow).await;
        let keep: u8 = if first == "198.18.0.10" { 11 } else { 10 };
        let mut only = udp_targets();
        only.cluster.retain(|e| e.ip.octets()[3] == keep);
        only.local.retain(|e| e.ip.octets()[3] == keep);
        let moved = [change(&d, only.clone())];
        backend.partial_sync(&moved).await.expect("partial sync");
        conntrack::apply(&udp_flows.changed(&moved)).await;
        assert_eq!(
            ask_udp(&flow).await,
            format!("198.18.0.{keep}"),
            "the flow moved"
        );
        let back = [change(&d, udp_targets())];
        backend.partial_sync(&back).await.expect("partial sync");
        conntrack::apply(&udp_flows.changed(&back)).await;

        // An established connection survives a full resync.
        let mut held = tokio::net::TcpStream::connect("198.19.0.1:80")
            .await
            .unwrap();
        let first = ask(&mut held).await;

        // Changes: a gains an endpoint, b gets one, c loses two.
        let synced = backend
            .partial_sync(&[
                change(&a, targets(&[10, 11, 12])),
                change(&b, targets(&[12])),
                change(&c, targets(&[12])),
            ])
            .await
            .expect("partial sync");
        assert_eq!(synced.stats.service_ports, 3);
        assert_eq!(spread([198, 19, 0, 1], 90).await.len(), 3);
        assert_eq!(hit([198, 19, 0, 2]).await.as_deref(), Ok("198.18.0.12"));
        assert_eq!(spread([198, 19, 0, 3], 5).await.len(), 1);
        // Nothing changed: nothing to do.
        let synced = backend
            .partial_sync(&[change(&a, targets(&[10, 11, 12]))])
            .await
            .unwrap();
        assert_eq!(synced.stats.service_ports, 0);

        let listed = listing(&ns);
        backend
            .full_sync(
                &[
                    (a.clone(), targets(&[10, 11, 12])),
                    (b.clone(), targets(&[12])),
                    (c.clone(), targets(&[12])),
                    (d.clone(), udp_targets()),
                ],
                false,
            )
            .await
            .unwrap();
        assert_eq!(
            ask(&mut held).await,
            first,
            "an established connection survives resyncs"
        );
        listed
    });
    assert_eq!(
        after_partial,
        listing(&ns),
        "partial syncs left exactly what a full sync writes"
    );

    ns.run(|| async {
        cleanup(&[Mode::Nftables, Mode::Iptables])
            .await
            .expect("cleanup");
        assert_eq!(
            hit([198, 19, 0, 1]).await,
            Err(std::io::ErrorKind::TimedOut),
            "no rules left to DNAT"
        );
    });
    assert_eq!(
        ruleset(&ns),
        before,
        "cleanup leaves the ruleset as it found it"
    );
}

#[test]
fn nftables_rules_in_the_kernel() {
    if root() {
        exercise(Mode::Nftables);
    }
}

#[test]
fn iptables_rules_in_the_kernel() {
    if root() {
        exercise(Mode::Iptables);
    }
}

#[test]
fn a_broken_table_is_replaced_by_the_next_full_sync() {
    if !root() {
        return;
    }
    let ns = Netns::new();
    ns.ip(&["addr", "add", "198.18.0.10/32", "dev", "lo"]);
    let a = port("a", [198, 19, 0, 1]);
    ns.run(|| async {
        serve(&[10]).await;
        let mut backend = Backend::new(Mode::Nftables, Some(CIDR.into())).unwrap();
        backend
            .full_sync(&[(a.clone(), targets(&[10]))], false)
            .await
            .unwrap();
        // Someone deletes an element the proxier believes is there: the
        // next partial sync fails, and the one after it repairs.
        let out = tokio::process::Command::new("nft")
            .args(["delete element ip skiff-proxy cluster-backends-tcp { 198.19.0.1 . 80 . 0 }"])
            .status()
            .await
            .unwrap();
        assert!(out.success());
        let err = backend
            .partial_sync(&[change(&a, targets(&[11]))])
            .await
            .expect_err("the kernel refuses to delete a missing element");
        assert!(err.to_string().contains("nft"), "{err}");
        assert!(backend.needs_full_sync());
        backend
            .full_sync(&[(a.clone(), targets(&[10]))], false)
            .await
            .unwrap();
        assert_eq!(hit([198, 19, 0, 1]).await.as_deref(), Ok("198.18.0.10"));
    });
}
