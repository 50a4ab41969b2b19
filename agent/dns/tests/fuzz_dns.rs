//! Fuzzing the cluster DNS server's message handling with proptest: the
//! zone answers any question without panicking and with records that
//! encode; the server, sent any datagram or TCP frame, stays up, and every
//! answer it gives is a well-formed DNS response with the request's ID
//! (and question), within the UDP size the client allowed; resolv.conf
//! parsing takes any text.
//!
//! Messages are generated from the names the zone serves (services, pods,
//! reverse names, SRV names, the schema TXT) and then mutated with random
//! bytes and DNS-specific tokens (compression pointers, label lengths past
//! 63, EDNS records). Everything stays on loopback: the server's
//! resolv.conf names no upstream, so forwarded names fail fast (SERVFAIL).
//! `tests/corpus/dns/` holds hand-picked datagrams replayed on every run;
//! proptest's failures persist in `tests/proptest-regressions/fuzz_dns.txt`.

#[path = "../../../control-plane/tests/support/fuzz.rs"]
mod fuzz;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use hickory_server::proto::op::{Message, MessageType, Query, ResponseCode};
use hickory_server::proto::rr::{DNSClass, Name, RData, RecordType};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher::Event;
use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};
use skiff_dns::{upstream, Answer, DnsConfig, DnsServer, Zone};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

const REGRESSIONS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/proptest-regressions/fuzz_dns.txt"
);

/// How long to wait for an answer the server owes: only a server that
/// stopped answering takes this long (the test fails then).
const OWED: Duration = Duration::from_secs(10);

const WEB_IP: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 10);

const WEB: &str = "
metadata: {name: web, namespace: default}
spec:
  clusterIP: 198.19.0.10
  clusterIPs: [198.19.0.10, 'fd00:19::10']
  ports: [{name: http, port: 80, protocol: TCP}, {name: dns, port: 53, protocol: UDP}]
";
const DB: &str = "
metadata: {name: db, namespace: default}
spec: {clusterIP: None, ports: [{name: pg, port: 5432}]}
";
const DB_SLICE: &str = "
metadata: {name: db-1, namespace: default, labels: {kubernetes.io/service-name: db}}
addressType: IPv4
ports: [{name: pg, port: 5432, protocol: TCP}]
endpoints:
- {addresses: [198.18.0.2], conditions: {ready: true}, hostname: db-0}
- {addresses: [198.18.0.3], conditions: {ready: false}}
";
const EXT: &str = "
metadata: {name: ext, namespace: other}
spec: {type: ExternalName, externalName: db.example.org}
";

fn yaml<T: serde::de::DeserializeOwned>(s: &str) -> T {
    serde_saphyr::from_str(s).expect("fixture yaml")
}

/// Reflector stores holding the fixtures, listed and synced.
struct Stores {
    services: Writer<Service>,
    slices: Writer<EndpointSlice>,
}

fn stores() -> Stores {
    let mut s = Stores {
        services: Writer::default(),
        slices: Writer::default(),
    };
    s.services.apply_watcher_event(&Event::Init);
    s.slices.apply_watcher_event(&Event::Init);
    for svc in [WEB, DB, EXT] {
        s.services.apply_watcher_event(&Event::InitApply(yaml(svc)));
    }
    s.slices
        .apply_watcher_event(&Event::InitApply(yaml(DB_SLICE)));
    s.services.apply_watcher_event(&Event::InitDone);
    s.slices.apply_watcher_event(&Event::InitDone);
    s
}

// ---- generators ------------------------------------------------------------

const LABELS: &[&str] = &[
    "web",
    "db",
    "db-0",
    "ext",
    "default",
    "other",
    "svc",
    "pod",
    "cluster",
    "local",
    "_http",
    "_tcp",
    "_udp",
    "_dns",
    "_pg",
    "*",
    "dns-version",
    "198-18-0-2",
    "WEB",
    "Default",
    "x",
    "",
];

/// Name endings the zone treats differently.
const SUFFIXES: &[&[&str]] = &[
    &["svc", "cluster", "local"],
    &["default", "svc", "cluster", "local"],
    &["cluster", "local"],
    &["default", "pod", "cluster", "local"],
    &["10", "0", "19", "198", "in-addr", "arpa"],
    &["2", "0", "18", "198", "in-addr", "arpa"],
    &["in-addr", "arpa"],
    &[
        "0", "1", "0", "0", "0", "0", "0", "0", "0", "0", "0", "0", "0", "0", "0", "0", "0", "0",
        "0", "0", "0", "0", "0", "0", "9", "1", "0", "0", "0", "0", "d", "f", "ip6", "arpa",
    ],
    &["example", "org"],
    &[],
];

fn labels() -> impl Strategy<Value = Vec<String>> {
    (
        prop::collection::vec(prop::sample::select(LABELS), 0..4),
        prop::sample::select(SUFFIXES),
        prop::option::of("[a-zA-Z0-9-]{1,70}"),
    )
        .prop_map(|(pre, suffix, odd)| {
            pre.iter()
                .filter(|l| !l.is_empty())
                .map(|l| l.to_string())
                .chain(odd)
                .chain(suffix.iter().map(|l| l.to_string()))
                .collect()
        })
}

const TYPES: &[u16] = &[1, 28, 33, 12, 16, 255, 6, 2, 5, 252, 251, 41, 0, 65535];
const CLASSES: &[u16] = &[1, 1, 1, 3, 255, 254, 0];

fn qtype() -> impl Strategy<Value = u16> {
    prop_oneof![4 => prop::sample::select(TYPES), 1 => any::<u16>()]
}

fn qclass() -> impl Strategy<Value = u16> {
    prop_oneof![4 => prop::sample::select(CLASSES), 1 => any::<u16>()]
}

fn name_wire(labels: &[String], out: &mut Vec<u8>) {
    for l in labels {
        // Longer than a label may be: cut, as a mutation would.
        let b = &l.as_bytes()[..l.len().min(255)];
        out.push(b.len() as u8);
        out.extend_from_slice(b);
    }
    out.push(0);
}

/// A query as a client would send it: header, questions, maybe EDNS.
#[derive(Debug, Clone)]
struct Msg {
    id: u16,
    flags: u16,
    questions: Vec<(Vec<String>, u16, u16)>,
    /// Declared question count, when not the real one.
    qdcount: Option<u16>,
    /// OPT record: payload size, extended flags (DO bit), options.
    edns: Option<(u16, u32, Vec<u8>)>,
}

impl Msg {
    fn wire(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&self.id.to_be_bytes());
        out.extend_from_slice(&self.flags.to_be_bytes());
        let qd = self.qdcount.unwrap_or(self.questions.len() as u16);
        out.extend_from_slice(&qd.to_be_bytes());
        out.extend_from_slice(&[0, 0, 0, 0]);
        out.extend_from_slice(&u16::from(self.edns.is_some()).to_be_bytes());
        for (labels, t, c) in &self.questions {
            name_wire(labels, &mut out);
            out.extend_from_slice(&t.to_be_bytes());
            out.extend_from_slice(&c.to_be_bytes());
        }
        if let Some((payload, ttl, options)) = &self.edns {
            out.push(0);
            out.extend_from_slice(&41u16.to_be_bytes());
            out.extend_from_slice(&payload.to_be_bytes());
            out.extend_from_slice(&ttl.to_be_bytes());
            out.extend_from_slice(&(options.len() as u16).to_be_bytes());
            out.extend_from_slice(options);
        }
        out
    }
}

fn msg() -> impl Strategy<Value = Msg> {
    (
        any::<u16>(),
        // A standard query with RD, mostly; any flags (QR, opcodes) too.
        prop_oneof![4 => Just(0x0100u16), 1 => Just(0u16), 1 => any::<u16>()],
        prop::collection::vec((labels(), qtype(), qclass()), 0..3).prop_map(|mut q| {
            // One question, mostly: what the handler answers.
            q.truncate(1.max(q.len() / 2));
            q
        }),
        prop::option::weighted(0.1, any::<u16>()),
        prop::option::of((
            prop::sample::select(&[0u16, 512, 1232, 4096, 65535][..]),
            prop_oneof![Just(0u32), Just(0x8000u32), any::<u32>()],
            prop::collection::vec(any::<u8>(), 0..12),
        )),
    )
        .prop_map(|(id, flags, questions, qdcount, edns)| Msg {
            id,
            flags,
            questions,
            qdcount,
            edns,
        })
}

const DNS_TOKENS: &[&[u8]] = &[
    b"\xc0\x0c",
    b"\xc0\x00",
    b"\xc0\xff",
    b"\x3f",
    b"\x40",
    b"\x80",
    b"\x00\x29",
    b"\x00\x00\x29\x10\x00",
    b"\xff\xff",
    b"\x00",
    b"\x01",
];

fn datagram() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        10 => fuzz::mutated(msg().prop_map(|m| m.wire()), DNS_TOKENS),
        1 => prop::collection::vec(any::<u8>(), 0..40),
    ]
}

// ---- talking to the server -------------------------------------------------

/// The question the probe asks, whose answer is known: web's ClusterIP.
fn probe(id: u16) -> Vec<u8> {
    Msg {
        id,
        flags: 0x0100,
        questions: vec![(
            ["web", "default", "svc", "cluster", "local"]
                .map(String::from)
                .to_vec(),
            1,
            1,
        )],
        qdcount: None,
        edns: None,
    }
    .wire()
}

fn check_probe_answer(m: &Message) -> Result<(), TestCaseError> {
    prop_assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    let addrs: Vec<_> = m
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(a.0),
            _ => None,
        })
        .collect();
    prop_assert_eq!(addrs, vec![WEB_IP]);
    Ok(())
}

/// What must hold of the server's answer `reply` to `request`: a
/// well-formed response with its ID and (when it has one) its question,
/// no larger than the client said it could take over UDP.
fn check_reply(request: &[u8], reply: &[u8], udp: bool) -> Result<(), TestCaseError> {
    prop_assert!(
        reply.len() >= 12 && reply[2] & 0x80 != 0,
        "not a response: {reply:?}"
    );
    prop_assert_eq!(&reply[..2], &request[..2], "not the request's ID");
    let m = Message::from_vec(reply);
    prop_assert!(m.is_ok(), "malformed answer {reply:?}: {m:?}");
    let m = m.expect("checked");
    prop_assert_eq!(m.metadata.message_type, MessageType::Response);
    prop_assert_eq!(m.metadata.id, u16::from_be_bytes([request[0], request[1]]));
    let req = Message::from_vec(request).ok();
    if let Some(req) = &req {
        if !m.queries.is_empty() {
            prop_assert_eq!(&m.queries, &req.queries);
        }
    }
    if udp {
        let allowed = req
            .and_then(|r| r.edns.as_ref().map(|e| e.max_payload()))
            .unwrap_or(512)
            .max(512);
        prop_assert!(
            reply.len() <= usize::from(allowed),
            "{} bytes over UDP, {allowed} allowed",
            reply.len()
        );
    }
    Ok(())
}

/// Whether the server owes an answer to `bytes`: anything with a header
/// that is not itself a response. (Responses get one only when they fail
/// to parse: a FORMERR.)
fn owed(bytes: &[u8]) -> bool {
    bytes.len() >= 12 && bytes[2] & 0x80 == 0
}

async fn recv_within(sock: &UdpSocket, buf: &mut [u8]) -> Result<usize, TestCaseError> {
    tokio::time::timeout(OWED, sock.recv(buf))
        .await
        .map_err(|_| TestCaseError::fail("no answer: the server stopped answering"))?
        .map_err(|e| TestCaseError::fail(format!("recv: {e}")))
}

/// Send `bytes` over UDP, then a probe; check the answers (the probe's
/// shows the server is still up).
async fn udp_case(server: SocketAddr, bytes: &[u8]) -> Result<(), TestCaseError> {
    let sock = UdpSocket::bind("127.0.0.1:0").await.expect("bind client");
    sock.connect(server).await.expect("connect client");
    sock.send(bytes).await.expect("send");
    let id = (bytes.len() >= 2).then(|| u16::from_be_bytes([bytes[0], bytes[1]]));
    let probe_id = id.unwrap_or(0).wrapping_add(0x5555);
    sock.send(&probe(probe_id)).await.expect("send probe");
    let (mut answered, mut probed) = (false, false);
    let mut buf = vec![0u8; 65_536];
    while !(probed && (answered || !owed(bytes))) {
        let n = recv_within(&sock, &mut buf).await?;
        let reply = &buf[..n];
        prop_assert!(n >= 2, "an answer without an ID: {reply:?}");
        let got = u16::from_be_bytes([reply[0], reply[1]]);
        if got == probe_id && !probed {
            let m = Message::from_vec(reply);
            prop_assert!(m.is_ok(), "malformed probe answer {reply:?}: {m:?}");
            check_probe_answer(&m.expect("checked"))?;
            probed = true;
        } else {
            prop_assert_eq!(Some(got), id, "an answer to nothing asked");
            check_reply(bytes, reply, true)?;
            answered = true;
        }
    }
    Ok(())
}

/// The next frame on `conn`; None when the server closed it.
async fn read_frame(conn: &mut TcpStream) -> Result<Option<Vec<u8>>, TestCaseError> {
    let read = async {
        let n = conn.read_u16().await?;
        let mut b = vec![0u8; usize::from(n)];
        conn.read_exact(&mut b).await?;
        Ok::<_, std::io::Error>(b)
    };
    match tokio::time::timeout(OWED, read).await {
        Err(_) => Err(TestCaseError::fail(
            "no answer over TCP: the server stopped answering",
        )),
        Ok(Ok(b)) => Ok(Some(b)),
        // Closed, or reset because our probe was still unread.
        Ok(Err(e))
            if matches!(
                e.kind(),
                std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset
            ) =>
        {
            Ok(None)
        }
        Ok(Err(e)) => Err(TestCaseError::fail(format!(
            "reading an answer over TCP: {e}"
        ))),
    }
}

/// Send `bytes` in one TCP frame whose length prefix is off by `skew`
/// (0: right); when it is right, a probe follows on the same connection.
/// Then a probe over UDP shows the server is still up.
async fn tcp_case(server: SocketAddr, bytes: &[u8], skew: i32) -> Result<(), TestCaseError> {
    let mut conn = TcpStream::connect(server).await.expect("connect");
    let len = (bytes.len() as i32 + skew).clamp(0, 65_535) as u16;
    let mut frame = len.to_be_bytes().to_vec();
    frame.extend_from_slice(bytes);
    let right = usize::from(len) == bytes.len();
    let id = (bytes.len() >= 2).then(|| u16::from_be_bytes([bytes[0], bytes[1]]));
    let probe_id = id.unwrap_or(0).wrapping_add(0x5555);
    if right {
        let p = probe(probe_id);
        frame.extend_from_slice(&(p.len() as u16).to_be_bytes());
        frame.extend_from_slice(&p);
    }
    // The server may close on a bad frame before reading all of it.
    let _ = conn.write_all(&frame).await;
    if right {
        let (mut answered, mut probed) = (false, false);
        while !(probed && (answered || !owed(bytes))) {
            let Some(reply) = read_frame(&mut conn).await? else {
                // Closing a connection that sent what is not a query is
                // fair; leaving a query unanswered is not.
                prop_assert!(
                    !owed(bytes),
                    "the server closed the connection without answering"
                );
                break;
            };
            prop_assert!(reply.len() >= 2, "an answer without an ID: {reply:?}");
            let got = u16::from_be_bytes([reply[0], reply[1]]);
            if got == probe_id && !probed {
                let m = Message::from_vec(&reply);
                prop_assert!(m.is_ok(), "malformed probe answer {reply:?}: {m:?}");
                check_probe_answer(&m.expect("checked"))?;
                probed = true;
            } else {
                prop_assert_eq!(Some(got), id, "an answer to nothing asked");
                check_reply(bytes, &reply, false)?;
                answered = true;
            }
        }
    }
    drop(conn);
    udp_case(server, &probe(0x1111)).await
}

/// The server under test, on 127.0.0.1 (a free port), forwarding nowhere.
struct Running {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<skiff_dns::Result<()>>,
    _stores: Stores,
    _dir: tempfile::TempDir,
}

async fn start() -> Running {
    let dir = tempfile::tempdir().expect("temp dir");
    let stores = stores();
    let config = DnsConfig {
        listen: vec!["127.0.0.1:0".parse().expect("addr")],
        // No upstream: forwarded names answer SERVFAIL at once, and no
        // query leaves the machine.
        resolv_conf: dir.path().join("absent"),
        upstream_timeout: Duration::from_millis(200),
        ..DnsConfig::default()
    };
    let server = DnsServer::bind(
        config,
        stores.services.as_reader(),
        stores.slices.as_reader(),
    )
    .await
    .expect("bind the DNS server");
    let addr = server.local_addrs()[0];
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));
    // The server answers cluster names SERVFAIL until it has seen its
    // stores synced, which it notes in a task of its own: wait for that,
    // or the first case's probe could meet it.
    let mut synced = false;
    for _ in 0..100 {
        if udp_case(addr, &probe(0x2222)).await.is_ok() {
            synced = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        synced,
        "the DNS server never answered from its synced stores"
    );
    Running {
        addr,
        stop: Some(stop),
        task,
        _stores: stores,
        _dir: dir,
    }
}

impl Running {
    async fn stop(mut self) {
        let _ = self.stop.take().expect("running").send(());
        (&mut self.task)
            .await
            .expect("server task")
            .expect("server stops cleanly");
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn run<S: Strategy>(
    default_cases: u32,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) {
    let mut runner = TestRunner::new(fuzz::config(REGRESSIONS, default_cases));
    if let Err(e) = runner.run(&strategy, test) {
        panic!("{e}");
    }
}

// ---- properties ------------------------------------------------------------

/// Any datagram: the server stays up and its answers are well formed.
#[test]
fn the_server_answers_any_datagram_well_formed() {
    let rt = runtime();
    let server = rt.block_on(start());
    let addr = server.addr;
    run(10000, datagram(), |bytes| {
        rt.block_on(udp_case(addr, &bytes))
    });
    rt.block_on(server.stop());
}

/// Any TCP frame, with its length prefix right or wrong.
#[test]
fn the_server_answers_any_tcp_frame_well_formed() {
    let rt = runtime();
    let server = rt.block_on(start());
    let addr = server.addr;
    let skew = prop_oneof![4 => Just(0), 1 => -3..3i32, 1 => Just(70_000)];
    run(3000, (datagram(), skew), |(bytes, skew)| {
        rt.block_on(tcp_case(addr, &bytes, skew))
    });
    rt.block_on(server.stop());
}

/// The zone itself, for any question: authoritative answers carry the
/// question's name, a negative one the SOA, and all of them encode.
#[test]
fn the_zone_answers_any_question() {
    let stores = stores();
    let zone = Zone::new(
        "cluster.local",
        stores.services.as_reader(),
        stores.slices.as_reader(),
    )
    .expect("zone");
    let question = (labels(), qtype(), qclass()).prop_filter_map("a valid name", |(l, t, c)| {
        let name = Name::from_labels(l.iter().map(|s| s.as_bytes())).ok()?;
        let mut q = Query::query(name, RecordType::from(t));
        q.query_class = DNSClass::from(c);
        Some(q)
    });
    run(20000, question, |q| {
        let Answer::Local(local) = zone.answer(&q) else {
            return Ok(());
        };
        prop_assert!(matches!(
            local.rcode,
            ResponseCode::NoError | ResponseCode::NXDomain | ResponseCode::Refused
        ));
        for r in &local.answers {
            prop_assert_eq!(&r.name, &q.name);
        }
        if local.answers.is_empty() && local.rcode != ResponseCode::Refused {
            prop_assert!(local.soa.is_some(), "negative answer without SOA");
        }
        let mut m = Message::response(1, hickory_server::proto::op::OpCode::Query);
        m.metadata.response_code = local.rcode;
        m.queries.push(q.clone());
        m.answers.extend(local.answers.iter().cloned());
        m.additionals.extend(local.additionals.iter().cloned());
        m.authorities.extend(local.soa.iter().cloned());
        let wire = m.to_vec();
        prop_assert!(wire.is_ok(), "{wire:?}");
        let back = Message::from_vec(&wire.expect("checked"));
        prop_assert!(back.is_ok(), "{back:?}");
        Ok(())
    });
}

const RESOLV_TOKENS: &[&[u8]] = &[
    b"nameserver ",
    b"nameserver fe80::1%eth0\n",
    b"nameserver fe80::1%\0\n",
    b"nameserver 127.0.0.1\n",
    b"search ",
    b"options ",
    b"ndots:",
    b"#",
    b";",
    b"\n",
    b"%",
    b"::",
];

/// resolv.conf: any text gives upstreams on port 53, none of them the
/// server itself.
#[test]
fn resolv_conf_takes_any_text() {
    let text = "nameserver 192.0.2.1\nnameserver 127.0.0.53\nnameserver fe80::1%lo\nsearch example.org\noptions ndots:1 timeout:1\n";
    let listen: Vec<SocketAddr> = vec![
        "127.0.0.53:53".parse().expect("addr"),
        "[::]:53".parse().expect("addr"),
    ];
    let input = fuzz::mutated(Just(text.as_bytes().to_vec()), RESOLV_TOKENS);
    run(10000, input, |content| {
        let (usable, skipped) = upstream::nameservers(&content, &listen);
        for ns in usable.iter().chain(&skipped) {
            prop_assert_eq!(ns.port(), upstream::DNS_PORT);
        }
        for ns in &usable {
            prop_assert!(!upstream::would_loop(*ns, &listen), "{ns} loops");
        }
        Ok(())
    });
}

/// Every datagram in `tests/corpus/dns/`, over UDP and TCP.
#[test]
fn corpus_replays() {
    let rt = runtime();
    let server = rt.block_on(start());
    for (path, bytes) in fuzz::corpus(env!("CARGO_MANIFEST_DIR"), "dns") {
        if let Err(e) = rt.block_on(udp_case(server.addr, &bytes)) {
            panic!("{} over UDP: {e}", path.display());
        }
        if let Err(e) = rt.block_on(tcp_case(server.addr, &bytes, 0)) {
            panic!("{} over TCP: {e}", path.display());
        }
    }
    rt.block_on(server.stop());
}
