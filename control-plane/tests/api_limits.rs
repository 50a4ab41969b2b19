//! What one careless or hostile client can hold of the server: a flood of
//! idle connections does not deny anyone else service, and requests past
//! `--max-requests-inflight` / `--max-mutating-requests-inflight` get 429
//! with `Retry-After`, as upstream.
//!
//! Its own test binary: the first test lowers the process's open-files
//! limit, which would disturb tests running beside it.

use crate::api;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use api::TestServer;
use axum::body::Body;
use skiff_control_plane::auth::Identity;
use skiff_control_plane::config::Settings;

/// Connections the hostile client opens and then says nothing on.
const IDLE: usize = 1500;

/// Open an idle TCP connection to `to` from `from` (another loopback
/// address, so the per-source cap does not count the well-behaved client).
fn idle_connection(from: IpAddr, to: SocketAddr) -> std::io::Result<std::net::TcpStream> {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    sock.bind(&SocketAddr::new(from, 0).into())?;
    // A server that stopped accepting leaves connects hanging in its
    // backlog: give up on them quickly.
    sock.connect_timeout(&to.into(), std::time::Duration::from_secs(1))?;
    Ok(sock.into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_connections_do_not_deny_service() {
    // The limit a default systemd service or login starts with, so that
    // the flood would exhaust a server that does not raise it.
    let (_, hard) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .expect("getrlimit");
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, 2048, hard)
        .expect("setrlimit");
    let s = TestServer::start_with_settings(
        None,
        Settings {
            max_connections_per_source: Some(100),
            ..Default::default()
        },
    )
    .await;
    let addr = s.handle().addr;
    let hostile: IpAddr = "127.0.0.2".parse().unwrap();
    let mut held = Vec::new();
    for _ in 0..IDLE {
        match idle_connection(hostile, addr) {
            Ok(c) => held.push(c),
            Err(_) => break,
        }
    }
    let client = s.client().await;
    let ns: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client);
    let listed = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        ns.list(&Default::default()),
    )
    .await;
    assert!(
        matches!(listed, Ok(Ok(_))),
        "the API did not answer beside {IDLE} idle connections: {listed:?}"
    );
    drop(held);
}

fn user() -> Identity {
    Identity::new("alice", vec!["system:authenticated".into()])
}

/// A create whose body never finishes: it holds a mutating slot.
fn endless_post() -> http::Request<Body> {
    let never = futures::stream::pending::<Result<bytes::Bytes, std::io::Error>>();
    http::Request::builder()
        .method("POST")
        .uri("/api/v1/namespaces/default/configmaps")
        .header("content-type", "application/json")
        .body(Body::from_stream(never))
        .expect("request")
}

fn get(path: &str) -> http::Request<Body> {
    http::Request::builder()
        .uri(path)
        .body(Body::empty())
        .expect("request")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_past_the_inflight_limits_get_429() {
    let s = TestServer::start_with_settings(
        None,
        Settings {
            max_mutating_requests_inflight: Some(1),
            // Reads are limited on their own (unit tests): room enough here
            // for the server's own controllers.
            max_requests_inflight: Some(50),
            ..Default::default()
        },
    )
    .await;
    let api: Arc<_> = s.handle().api.clone();
    // alice may write (she is not in system:masters, which is exempt).
    let admin = Identity::new("admin", vec!["system:masters".into()]);
    let grant = serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "alice-admin"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "alice"}]});
    let req = http::Request::builder()
        .method("POST")
        .uri("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings")
        .header("content-type", "application/json")
        .body(Body::from(grant.to_string()))
        .expect("request");
    assert_eq!(api.handle(req, Some(admin.clone())).await.status(), 201);
    let allowed = api::eventually(std::time::Duration::from_secs(5), || {
        let api = api.clone();
        async move {
            let r = get("/api/v1/namespaces/default/configmaps");
            api.handle(r, Some(user())).await.status() == 200
        }
    })
    .await;
    assert!(allowed, "alice's grant never took effect");
    // The server's own controllers write too and may hold the one slot for
    // a moment: a create that is answered at once was refused, so try again
    // until one is admitted and waits for its body.
    let mut held = None;
    for _ in 0..50 {
        let api = api.clone();
        let h = tokio::spawn(async move { api.handle(endless_post(), Some(user())).await });
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        if !h.is_finished() {
            held = Some(h);
            break;
        }
    }
    let held = held.expect("no create was ever admitted");
    // The held create has the one mutating slot once a second create is
    // refused; until then the second may be the one admitted (it then
    // waits for its body, and is dropped, freeing the slot).
    let refused = api::eventually(std::time::Duration::from_secs(5), || {
        let api = api.clone();
        async move {
            let second = tokio::time::timeout(
                std::time::Duration::from_millis(200),
                api.handle(endless_post(), Some(user())),
            )
            .await;
            matches!(second, Ok(r) if r.status() == 429)
        }
    })
    .await;
    assert!(refused, "a second create beside a held one was not refused");
    let resp = api.handle(endless_post(), Some(user())).await;
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["retry-after"], "1");
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    let status: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(status["reason"], "TooManyRequests");
    assert_eq!(
        status["message"],
        "Too many requests, please try again later."
    );
    assert_eq!(status["details"]["retryAfterSeconds"], 1);

    // Reads have slots of their own; system:masters takes none.
    let read = api.handle(get("/api/v1/namespaces"), Some(user())).await;
    assert_eq!(read.status(), 200);
    let write = tokio::time::timeout(
        std::time::Duration::from_millis(300),
        api.handle(endless_post(), Some(admin)),
    )
    .await;
    // Admitted, it waits for its endless body like the held one.
    let write = match write {
        Err(_) => return held.abort(),
        Ok(r) => r,
    };
    assert_ne!(write.status(), 429, "system:masters is never throttled");
    held.abort();
}
