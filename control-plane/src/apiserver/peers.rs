//! Every API server's address in `default/kubernetes`, as upstream's lease
//! endpoint reconciler keeps them (`--endpoint-reconciler-type=lease`):
//! each server holds a key for its address under `/registry/masterleases/`
//! with a [`TTL`] it renews every [`RENEW`], and writes the addresses of
//! the live keys into the `kubernetes` Endpoints and EndpointSlice. A
//! server that stops removes its own key first; one that dies drops out
//! when its key expires. Clients of the service (pods, through the proxy)
//! so reach whichever servers are up.
//!
//! As upstream, every server is expected to serve on the same port: the
//! objects carry the port of the server that wrote them last.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};

use super::bootstrap::{ensure_fields, system_req};
use super::status::ApiResult;
use super::ApiServer;

const PREFIX: &str = "/registry/masterleases/";
/// Upstream's master lease TTL.
pub const TTL: Duration = Duration::from_secs(15);
/// Upstream's endpoint reconcile interval.
pub const RENEW: Duration = Duration::from_secs(10);

fn key(ip: IpAddr) -> String {
    format!("{PREFIX}{ip}")
}

/// Write (or renew) this server's key.
async fn hold(api: &ApiServer, ip: IpAddr) -> ApiResult<()> {
    let key = key(ip);
    // The time makes each renewal a write: the store keeps the expiry of
    // a key rewritten with the same bytes.
    let value = json!({"ip": ip.to_string(), "renewed": jiff::Timestamp::now().to_string()})
        .to_string()
        .into_bytes();
    match api.store.get(&key).await? {
        Some(kv) => match api
            .store
            .update_with_ttl(&key, value, kv.mod_revision, Some(TTL))
            .await
        {
            // Renewed by this server's previous tick racing this one.
            Ok(_) | Err(crate::store::Error::Conflict { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        },
        None => match api.store.create_with_ttl(&key, value, Some(TTL)).await {
            Ok(_) | Err(crate::store::Error::AlreadyExists { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        },
    }
}

/// The addresses with a live key, sorted (IPv4 before IPv6, as `Ord`).
async fn live(api: &ApiServer) -> ApiResult<Vec<IpAddr>> {
    let list = api.store.list(PREFIX, None, 0, None).await?;
    let mut ips: Vec<IpAddr> = list
        .kvs
        .iter()
        .filter_map(|kv| kv.key.strip_prefix(PREFIX)?.parse().ok())
        .collect();
    ips.sort();
    ips.dedup();
    Ok(ips)
}

/// Point `default/kubernetes` at `ips` on `port` (the Endpoints for
/// clients that read them, the EndpointSlice for the service proxy).
async fn publish(api: &ApiServer, ips: &[IpAddr], port: u16) -> ApiResult<()> {
    let ports = json!([{"name": "https", "port": port, "protocol": "TCP"}]);
    let addresses: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip.to_string()})).collect();
    let ep = json!({
        "apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": "kubernetes", "namespace": "default", "labels": {"endpointslice.kubernetes.io/skip-mirror": "true"}},
        "subsets": if ips.is_empty() { json!([]) } else { json!([{"addresses": addresses, "ports": ports}]) },
    });
    let req = system_req("", "endpoints", Some("default"));
    let key = req.def.key(Some("default"), "kubernetes");
    ensure_fields(api, &req, &key, ep, &["subsets"]).await?;
    // One slice per address family, as upstream's; the first address's
    // family when there are none.
    let family = ips.first().is_none_or(IpAddr::is_ipv4);
    let endpoints: Vec<Value> = ips
        .iter()
        .filter(|ip| ip.is_ipv4() == family)
        .map(|ip| json!({"addresses": [ip.to_string()], "conditions": {"ready": true}}))
        .collect();
    let slice = json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "kubernetes", "namespace": "default", "labels": {"kubernetes.io/service-name": "kubernetes"}},
        "addressType": if family { "IPv4" } else { "IPv6" },
        "endpoints": endpoints,
        "ports": ports,
    });
    let req = system_req("discovery.k8s.io", "endpointslices", Some("default"));
    let key = req.def.key(Some("default"), "kubernetes");
    ensure_fields(api, &req, &key, slice, &["endpoints", "ports"]).await
}

/// Hold this server's key and publish the live servers: once at start
/// (bootstrap), then every [`RENEW`] from [`run`].
///
/// # Errors
/// The store fails.
pub async fn renew(api: &ApiServer) -> ApiResult<()> {
    let Some((ip, port)) = api.advertise else {
        return Ok(());
    };
    hold(api, ip).await?;
    publish(api, &live(api).await?, port).await
}

/// Renew every [`RENEW`], and publish again as soon as another server's
/// key comes or goes; on shutdown, remove this server's key and publish
/// the others.
pub async fn run(api: Arc<ApiServer>) {
    let Some((ip, port)) = api.advertise else {
        return;
    };
    let mut shutdown = api.shutdown.clone();
    let mut tick = tokio::time::interval(RENEW);
    tick.tick().await;
    loop {
        let rev = api.store.current_revision().await.unwrap_or(0);
        let mut changes = api.store.watch(PREFIX, rev).await.ok();
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    if let Err(e) = renew(&api).await {
                        tracing::warn!("renewing this API server's endpoint lease: {e:?}");
                    }
                }
                ev = async {
                    match changes.as_mut() {
                        Some(c) => c.next().await,
                        None => std::future::pending().await,
                    }
                } => match ev {
                    Some(Ok(_)) => match live(&api).await {
                        Ok(ips) => {
                            if let Err(e) = publish(&api, &ips, port).await {
                                tracing::warn!("publishing the API servers' endpoints: {e:?}");
                            }
                        }
                        Err(e) => tracing::warn!("listing API server leases: {e:?}"),
                    },
                    // The watch ended (compaction, store trouble): open it again.
                    _ => break,
                },
                _ = crate::leader::stopped(&mut shutdown) => {
                    let _ = api.store.delete(&key(ip), None).await;
                    if let Ok(ips) = live(&api).await {
                        let _ = publish(&api, &ips, port).await;
                    }
                    return;
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
