//! The cluster DNS server for real, on loopback: cluster names answered
//! from reflector stores the test fills itself (no API server), every
//! other name forwarded to a fake upstream DNS server that the test also
//! serves on loopback, named in a temporary resolv.conf. Queried with
//! hickory's client and with `dig`, over UDP and TCP.
//!
//! resolv.conf cannot name a port, so the fake upstreams listen on port 53
//! of random 127.x.y.z addresses (binding them needs root, as the agent
//! does; the whole of 127/8 is loopback on Linux, and a random address
//! lets runs overlap).
#![allow(clippy::disallowed_methods)] // a test harness: sync helpers (Drop, cleanup) may sleep, and short-lived commands run under the test's own timeout

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_server::net::client::{Client, ClientHandle};
use hickory_server::net::runtime::{Time, TokioRuntimeProvider};
use hickory_server::net::tcp::TcpClientStream;
use hickory_server::net::udp::UdpClientStream;
use hickory_server::proto::op::{Edns, Message, Metadata, ResponseCode};
use hickory_server::proto::rr::rdata::{A, SOA};
use hickory_server::proto::rr::{DNSClass, Name, RData, Record, RecordType};
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponseBuilder;
use hickory_server::Server;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher::Event;
use rand::Rng;
use skiff_dns::{listen, DnsConfig, DnsServer, Error};
use tokio::net::UdpSocket;
use tokio::sync::oneshot;

/// Headless endpoints in the big service: 100 A records are ~1.6 kB,
/// more than a 1232-byte EDNS payload.
const BIG: usize = 100;
const WWW: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);
const WEB_NAME: &str = "web.default.svc.cluster.local.";

const WEB: &str = "
metadata: {name: web, namespace: default}
spec:
  clusterIP: 198.19.0.10
  clusterIPs: [198.19.0.10]
  ports: [{name: http, port: 80, protocol: TCP}]
";

fn big_service() -> (Service, EndpointSlice) {
    let service = yaml("metadata: {name: big, namespace: default}\nspec: {clusterIP: None}");
    let endpoints: Vec<String> = (0..BIG)
        .map(|i| format!("- {{addresses: [198.18.{}.{}]}}", i / 250, 1 + i % 250))
        .collect();
    let slice = yaml(&format!(
        "metadata: {{name: big-1, namespace: default, labels: {{kubernetes.io/service-name: big}}}}\naddressType: IPv4\nendpoints:\n{}\n",
        endpoints.join("\n")
    ));
    (service, slice)
}

fn yaml<T: serde::de::DeserializeOwned>(s: &str) -> T {
    serde_saphyr::from_str(s).unwrap()
}

/// Stores filled as a reflector's first list would, `synced` or not.
fn stores(services: Vec<Service>, slices: Vec<EndpointSlice>, synced: bool) -> Stores {
    let mut s = Stores {
        services: Writer::default(),
        slices: Writer::default(),
    };
    s.services.apply_watcher_event(&Event::Init);
    s.slices.apply_watcher_event(&Event::Init);
    for svc in services {
        s.services.apply_watcher_event(&Event::InitApply(svc));
    }
    for slice in slices {
        s.slices.apply_watcher_event(&Event::InitApply(slice));
    }
    if synced {
        s.sync();
    }
    s
}

struct Stores {
    services: Writer<Service>,
    slices: Writer<EndpointSlice>,
}

impl Stores {
    fn sync(&mut self) {
        self.services.apply_watcher_event(&Event::InitDone);
        self.slices.apply_watcher_event(&Event::InitDone);
    }

    fn default_stores() -> Stores {
        let (big, big_slice) = big_service();
        stores(vec![yaml(WEB), big], vec![big_slice], true)
    }
}

/// A random loopback address, not 127.0.0.x (where host services sit).
fn loopback_ip() -> Ipv4Addr {
    let mut rng = rand::rng();
    Ipv4Addr::new(
        127,
        rng.random_range(1..=254),
        rng.random(),
        rng.random_range(1..=254),
    )
}

/// A fake upstream resolver on `<random loopback>:53`: `www.example.org`
/// is 192.0.2.10, `big.example.org` has 100 addresses, the rest is
/// NXDOMAIN. It records the names it was asked; dropping it stops it.
struct FakeUpstream {
    ip: Ipv4Addr,
    asked: Arc<Mutex<Vec<String>>>,
    _server: Server<Answers>,
}

impl FakeUpstream {
    fn start() -> FakeUpstream {
        let asked = Arc::new(Mutex::new(Vec::new()));
        let (ip, (udp, tcp)) = bind_port_53();
        let mut server = Server::new(Answers {
            asked: asked.clone(),
        });
        server.register_socket(udp);
        server.register_listener(tcp, Duration::from_secs(10), 16);
        FakeUpstream {
            ip,
            asked,
            _server: server,
        }
    }

    fn asked(&self) -> Vec<String> {
        self.asked.lock().unwrap().clone()
    }
}

/// UDP and TCP on port 53 of a fresh random loopback address.
fn bind_port_53() -> (Ipv4Addr, (UdpSocket, tokio::net::TcpListener)) {
    for _ in 0..32 {
        let ip = loopback_ip();
        match listen::bind(SocketAddr::new(IpAddr::V4(ip), 53)) {
            Ok(sockets) => return (ip, sockets),
            Err(e) if e.source.kind() == std::io::ErrorKind::AddrInUse => continue,
            Err(e) => panic!("binding a fake upstream on {ip}:53 (needs root): {e}"),
        }
    }
    panic!("no free loopback address for a fake upstream")
}

struct Answers {
    asked: Arc<Mutex<Vec<String>>>,
}

#[async_trait::async_trait]
impl RequestHandler for Answers {
    async fn handle_request<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        mut response: R,
    ) -> ResponseInfo {
        let query = request.queries.queries()[0].original().clone();
        let name = query.name.to_lowercase().to_string();
        self.asked.lock().unwrap().push(name.clone());
        let mut metadata = Metadata::response_from_request(&request.metadata);
        metadata.recursion_available = true;
        let a = |ip: Ipv4Addr| Record::from_rdata(query.name.clone(), 60, RData::A(A(ip)));
        let answers: Vec<Record> = match (name.as_str(), query.query_type) {
            ("www.example.org.", RecordType::A) => vec![a(WWW)],
            ("big.example.org.", RecordType::A) => (0..BIG as u8)
                .map(|i| a(Ipv4Addr::new(192, 0, 2, i)))
                .collect(),
            _ => {
                metadata.response_code = ResponseCode::NXDomain;
                Vec::new()
            }
        };
        let origin = Name::from_ascii("example.org.").unwrap();
        let soa = (answers.is_empty()).then(|| {
            let data = SOA::new(origin.clone(), origin.clone(), 1, 60, 60, 60, 60);
            Record::from_rdata(origin.clone(), 60, RData::SOA(data))
        });
        let edns = request.edns.as_ref().map(|theirs| {
            let mut edns = Edns::new();
            edns.set_max_payload(theirs.max_payload());
            edns
        });
        let builder = MessageResponseBuilder::new(&request.queries, edns.as_ref());
        let message = builder.build(
            metadata,
            answers.iter(),
            None::<&Record>,
            soa.iter(),
            None::<&Record>,
        );
        response
            .send_response(message)
            .await
            .expect("fake upstream sends")
    }
}

/// A UDP socket on `<random loopback>:53` that never answers.
async fn silent_upstream() -> (Ipv4Addr, UdpSocket) {
    let (ip, (udp, _tcp)) = bind_port_53();
    (ip, udp)
}

fn write_resolv_conf(path: &Path, nameservers: &[Ipv4Addr]) {
    let mut content = String::from("# written by the dns test\nsearch example.org\n");
    for ns in nameservers {
        content.push_str(&format!("nameserver {ns}\n"));
    }
    content.push_str("options ndots:1 timeout:1\n");
    // Atomic, as resolvconf and systemd-resolved replace it.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, content).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// The server under test on 127.0.0.1 (a free port); stopped when
/// dropped if the test did not stop it.
struct Running {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<skiff_dns::Result<()>>,
}

impl Running {
    async fn start(config: DnsConfig, stores: &Stores) -> Running {
        let server = DnsServer::bind(
            config,
            stores.services.as_reader(),
            stores.slices.as_reader(),
        )
        .await
        .expect("bind the DNS server");
        Running::serve(server)
    }

    /// Binds `config` where a server just stopped. The address can stay
    /// taken for a moment: a process that a test beside this one forks
    /// holds copies of all our sockets until it execs.
    async fn restart(config: DnsConfig, stores: &Stores) -> Running {
        for _ in 0..100 {
            let bound = DnsServer::bind(
                config.clone(),
                stores.services.as_reader(),
                stores.slices.as_reader(),
            )
            .await;
            match bound {
                Ok(server) => return Running::serve(server),
                Err(Error::Bind(e)) if e.source.kind() == std::io::ErrorKind::AddrInUse => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("rebind the DNS server: {e}"),
            }
        }
        panic!("{:?} stayed taken after the server stopped", config.listen)
    }

    fn serve(server: DnsServer) -> Running {
        let addr = server.local_addrs()[0];
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server.run(async move {
            let _ = stopped.await;
        }));
        Running {
            addr,
            stop: Some(stop),
            task,
        }
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        (&mut self.task)
            .await
            .expect("server task")
            .expect("server stops cleanly");
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A fake upstream, a resolv.conf that names it, and the server under
/// test reading it.
struct Env {
    upstream: FakeUpstream,
    server: Running,
    _dir: tempfile::TempDir,
}

impl Env {
    async fn start(stores: &Stores) -> Env {
        let upstream = FakeUpstream::start();
        let dir = tempfile::tempdir().unwrap();
        let resolv = dir.path().join("resolv.conf");
        write_resolv_conf(&resolv, &[upstream.ip]);
        let server = Running::start(config(resolv), stores).await;
        Env {
            upstream,
            server,
            _dir: dir,
        }
    }

    async fn stop(self) {
        self.server.stop().await;
    }
}

fn config(resolv_conf: PathBuf) -> DnsConfig {
    DnsConfig {
        listen: vec!["127.0.0.1:0".parse().unwrap()],
        resolv_conf,
        upstream_timeout: Duration::from_millis(500),
        resolv_conf_reload: Duration::from_millis(100),
        ..DnsConfig::default()
    }
}

#[derive(Clone, Copy, Debug)]
enum Transport {
    Udp,
    Tcp,
}

async fn client(addr: SocketAddr, transport: Transport) -> Client<TokioRuntimeProvider> {
    let provider = TokioRuntimeProvider::new();
    let timeout = Duration::from_secs(5);
    // The exchange's background task ends when the client is dropped.
    match transport {
        Transport::Udp => {
            let stream = UdpClientStream::builder(addr, provider)
                .with_timeout(Some(timeout))
                .build();
            let (client, background) = Client::<TokioRuntimeProvider>::from_sender(stream);
            tokio::spawn(background);
            client
        }
        Transport::Tcp => {
            let (connect, handle) = TcpClientStream::new(addr, None, Some(timeout), provider);
            let stream = connect.await.expect("connect over TCP");
            let (client, background) = Client::<TokioRuntimeProvider>::new(stream, handle);
            tokio::spawn(background);
            client
        }
    }
}

async fn ask(addr: SocketAddr, transport: Transport, name: &str, qtype: RecordType) -> Message {
    let mut client = client(addr, transport).await;
    client
        .query(Name::from_ascii(name).unwrap(), DNSClass::IN, qtype)
        .await
        .unwrap_or_else(|e| panic!("{name} {qtype} over {transport:?}: {e}"))
        .into_message()
}

/// The A answer for `name` once it is NOERROR (after a change the server
/// picks up in the background), polling for a bounded while.
async fn answered_eventually(addr: SocketAddr, name: &str) -> Message {
    let mut last = None;
    for _ in 0..100 {
        let answer = ask(addr, Transport::Udp, name, RecordType::A).await;
        if answer.metadata.response_code == ResponseCode::NoError {
            return answer;
        }
        last = Some(answer.metadata.response_code);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{name} still {last:?}")
}

fn addresses(message: &Message) -> Vec<String> {
    let mut v: Vec<String> = message
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(a.to_string()),
            RData::AAAA(a) => Some(a.to_string()),
            _ => None,
        })
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn cluster_names_from_the_stores_others_from_the_upstream() {
    let stores = Stores::default_stores();
    let env = Env::start(&stores).await;

    for transport in [Transport::Udp, Transport::Tcp] {
        let web = ask(env.server.addr, transport, WEB_NAME, RecordType::A).await;
        assert_eq!(web.metadata.response_code, ResponseCode::NoError);
        assert!(web.metadata.authoritative);
        assert_eq!(addresses(&web), vec!["198.19.0.10"]);
        assert_eq!(web.answers[0].ttl, 5);

        let srv = ask(
            env.server.addr,
            transport,
            "_http._tcp.web.default.svc.cluster.local.",
            RecordType::SRV,
        )
        .await;
        assert_eq!(srv.answers.len(), 1);
        assert_eq!(
            srv.answers[0].data.to_string(),
            "0 100 80 web.default.svc.cluster.local."
        );
        assert_eq!(srv.additionals.len(), 1, "the target's address rides along");

        let missing = ask(
            env.server.addr,
            transport,
            "nope.default.svc.cluster.local.",
            RecordType::A,
        )
        .await;
        assert_eq!(missing.metadata.response_code, ResponseCode::NXDomain);
        assert_eq!(missing.authorities.len(), 1, "NXDOMAIN carries the SOA");

        let nodata = ask(env.server.addr, transport, WEB_NAME, RecordType::AAAA).await;
        assert_eq!(nodata.metadata.response_code, ResponseCode::NoError);
        assert!(nodata.answers.is_empty());

        let www = ask(
            env.server.addr,
            transport,
            "www.example.org.",
            RecordType::A,
        )
        .await;
        assert_eq!(www.metadata.response_code, ResponseCode::NoError);
        assert!(!www.metadata.authoritative);
        assert_eq!(addresses(&www), vec![WWW.to_string()]);

        let unknown = ask(
            env.server.addr,
            transport,
            "nope.example.org.",
            RecordType::A,
        )
        .await;
        assert_eq!(unknown.metadata.response_code, ResponseCode::NXDomain);
        assert_eq!(
            unknown.authorities.len(),
            1,
            "the upstream's SOA is passed on"
        );
    }

    let asked = env.upstream.asked();
    assert!(asked.contains(&"www.example.org.".to_string()), "{asked:?}");
    assert!(
        !asked.iter().any(|n| n.ends_with("cluster.local.")),
        "cluster names must never be forwarded: {asked:?}"
    );
    env.stop().await;
}

#[tokio::test]
async fn big_answers_are_truncated_over_udp_and_whole_over_tcp() {
    let stores = Stores::default_stores();
    let env = Env::start(&stores).await;

    // From the stores, and forwarded (which the server itself has to
    // fetch over TCP from the upstream, whose UDP answer is cut too).
    for name in ["big.default.svc.cluster.local.", "big.example.org."] {
        let udp = ask(env.server.addr, Transport::Udp, name, RecordType::A).await;
        assert!(udp.metadata.truncation, "{name}: TC over UDP: {udp:?}");
        assert!(
            udp.answers.len() < BIG,
            "{name}: {} answers over UDP",
            udp.answers.len()
        );

        let tcp = ask(env.server.addr, Transport::Tcp, name, RecordType::A).await;
        assert!(!tcp.metadata.truncation, "{name}: whole over TCP");
        assert_eq!(tcp.answers.len(), BIG, "{name}");
    }

    // Without EDNS a UDP answer stays within 512 bytes.
    let mut plain = client(env.server.addr, Transport::Udp).await;
    plain.disable_edns();
    let small = plain
        .query(
            Name::from_ascii("big.default.svc.cluster.local.").unwrap(),
            DNSClass::IN,
            RecordType::A,
        )
        .await
        .unwrap();
    assert!(small.metadata.truncation);
    assert!(
        small.answers.len() < 512 / 16,
        "{} answers",
        small.answers.len()
    );
    env.stop().await;
}

#[tokio::test]
async fn servfail_when_no_upstream_answers_and_failover_when_one_does() {
    let upstream = FakeUpstream::start();
    let (silent, _socket) = silent_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let resolv = dir.path().join("resolv.conf");
    write_resolv_conf(&resolv, &[silent]);
    let stores = Stores::default_stores();
    let server = Running::start(config(resolv.clone()), &stores).await;

    let failed = ask(
        server.addr,
        Transport::Udp,
        "www.example.org.",
        RecordType::A,
    )
    .await;
    assert_eq!(failed.metadata.response_code, ResponseCode::ServFail);
    // The cluster domain does not depend on the upstream.
    let web = ask(server.addr, Transport::Udp, WEB_NAME, RecordType::A).await;
    assert_eq!(addresses(&web), vec!["198.19.0.10"]);

    // resolv.conf is re-read: the silent one first, then a live one.
    write_resolv_conf(&resolv, &[silent, upstream.ip]);
    let www = answered_eventually(server.addr, "www.example.org.").await;
    assert_eq!(addresses(&www), vec![WWW.to_string()]);
    server.stop().await;
}

#[tokio::test]
async fn missing_resolv_conf_fails_forwarding_only() {
    let dir = tempfile::tempdir().unwrap();
    let stores = Stores::default_stores();
    let server = Running::start(config(dir.path().join("absent")), &stores).await;
    let www = ask(
        server.addr,
        Transport::Tcp,
        "www.example.org.",
        RecordType::A,
    )
    .await;
    assert_eq!(www.metadata.response_code, ResponseCode::ServFail);
    assert!(
        www.metadata.recursion_available,
        "a recursive server, failing"
    );
    let web = ask(server.addr, Transport::Tcp, WEB_NAME, RecordType::A).await;
    assert_eq!(addresses(&web), vec!["198.19.0.10"]);
    server.stop().await;
}

#[tokio::test]
async fn cluster_names_wait_for_the_stores_to_sync() {
    let mut stores = stores(vec![yaml(WEB)], Vec::new(), false);
    let env = Env::start(&stores).await;

    let early = ask(env.server.addr, Transport::Udp, WEB_NAME, RecordType::A).await;
    assert_eq!(
        early.metadata.response_code,
        ResponseCode::ServFail,
        "not NXDOMAIN before the first list"
    );
    let www = ask(
        env.server.addr,
        Transport::Udp,
        "www.example.org.",
        RecordType::A,
    )
    .await;
    assert_eq!(addresses(&www), vec![WWW.to_string()]);

    stores.sync();
    let web = answered_eventually(env.server.addr, WEB_NAME).await;
    assert_eq!(addresses(&web), vec!["198.19.0.10"]);

    // And it follows the store: a deleted service is gone.
    stores
        .services
        .apply_watcher_event(&Event::Delete(yaml(WEB)));
    let gone = ask(env.server.addr, Transport::Udp, WEB_NAME, RecordType::A).await;
    assert_eq!(gone.metadata.response_code, ResponseCode::NXDomain);
    env.stop().await;
}

#[tokio::test]
async fn restarts_on_the_same_address() {
    let dir = tempfile::tempdir().unwrap();
    let stores = Stores::default_stores();
    // Port 53 of a random loopback address, not a free high port: clients
    // in the tests beside this one bind random high ports on all addresses
    // and could take it between the stop and the restart.
    let (ip, probe) = bind_port_53();
    drop(probe);
    let addr = SocketAddr::new(IpAddr::V4(ip), 53);
    let on = |addr| DnsConfig {
        listen: vec![addr],
        ..config(dir.path().join("absent"))
    };
    let first = Running::start(on(addr), &stores).await;
    assert_eq!(first.addr, addr);
    // A TCP connection, so the old listener leaves TIME_WAIT behind.
    ask(addr, Transport::Tcp, WEB_NAME, RecordType::A).await;
    first.stop().await;

    let second = Running::restart(on(addr), &stores).await;
    assert_eq!(second.addr, addr);
    for transport in [Transport::Udp, Transport::Tcp] {
        let web = ask(addr, transport, WEB_NAME, RecordType::A).await;
        assert_eq!(addresses(&web), vec!["198.19.0.10"]);
    }
    second.stop().await;
}

#[tokio::test]
async fn binds_an_address_the_node_does_not_have_yet() {
    // In the test range (DESIGN.md), an address this machine does not
    // have: no traffic is sent, the sockets are only bound.
    let mut rng = rand::rng();
    let ip = Ipv4Addr::new(
        198,
        18,
        rng.random_range(200..=254),
        rng.random_range(1..=254),
    );
    let addr = SocketAddr::new(IpAddr::V4(ip), 0);
    let plain = std::net::UdpSocket::bind(addr);
    assert_eq!(
        plain.map(drop).map_err(|e| e.kind()),
        Err(std::io::ErrorKind::AddrNotAvailable),
        "{ip} must not be on this machine for this test"
    );
    let stores = Stores::default_stores();
    let dir = tempfile::tempdir().unwrap();
    let server = DnsServer::bind(
        DnsConfig {
            listen: vec![addr],
            ..config(dir.path().join("absent"))
        },
        stores.services.as_reader(),
        stores.slices.as_reader(),
    )
    .await
    .expect("IP_FREEBIND binds an address before it exists");
    assert_eq!(server.local_addrs()[0].ip(), IpAddr::V4(ip));
    assert_ne!(server.local_addrs()[0].port(), 0);
}

/// `dig`'s output for `args` against the server.
async fn dig(server: SocketAddr, args: &[&str]) -> String {
    let out = tokio::process::Command::new("dig")
        .arg(format!("@{}", server.ip()))
        .args(["-p", &server.port().to_string(), "+time=5", "+tries=1"])
        .args(args)
        .output()
        .await
        .expect("dig not found: run scripts/deps.sh (Debian's bind9-dnsutils)");
    assert!(
        out.status.success(),
        "dig {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn lines(s: &str) -> Vec<&str> {
    let mut v: Vec<&str> = s.lines().filter(|l| !l.is_empty()).collect();
    v.sort();
    v
}

#[tokio::test]
async fn dig_sees_the_same() {
    let stores = Stores::default_stores();
    let env = Env::start(&stores).await;
    let s = env.server.addr;

    for transport in ["+notcp", "+tcp"] {
        let short = dig(
            s,
            &[transport, "+short", "web.default.svc.cluster.local", "A"],
        )
        .await;
        assert_eq!(lines(&short), vec!["198.19.0.10"], "{transport}");
        let srv = dig(
            s,
            &[
                transport,
                "+short",
                "_http._tcp.web.default.svc.cluster.local",
                "SRV",
            ],
        )
        .await;
        assert_eq!(
            lines(&srv),
            vec!["0 100 80 web.default.svc.cluster.local."],
            "{transport}"
        );
        let www = dig(s, &[transport, "+short", "www.example.org", "A"]).await;
        assert_eq!(lines(&www), vec![WWW.to_string()], "{transport}");
        let missing = dig(s, &[transport, "nope.default.svc.cluster.local", "A"]).await;
        assert!(
            missing.contains("status: NXDOMAIN"),
            "{transport}: {missing}"
        );
        let ptr = dig(s, &[transport, "+short", "-x", "198.19.0.10"]).await;
        assert_eq!(lines(&ptr), vec![WEB_NAME], "{transport}");
    }

    // UDP only: the TC flag and a cut answer.
    let cut = dig(
        s,
        &["+notcp", "+ignore", "big.default.svc.cluster.local", "A"],
    )
    .await;
    assert!(
        cut.lines()
            .any(|l| l.contains("flags:") && l.contains(" tc")),
        "{cut}"
    );
    // dig's default: retry over TCP on TC, and get it whole.
    let whole = dig(s, &["+short", "big.default.svc.cluster.local", "A"]).await;
    assert_eq!(lines(&whole).len(), BIG, "{whole}");
    env.stop().await;
}
