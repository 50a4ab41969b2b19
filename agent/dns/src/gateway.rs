//! The cluster DNS on a node: served on the pod network's gateway (the
//! first address of the node's pod CIDR), which pods reach through their
//! default route and find in their resolv.conf.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::Store;
use tokio::sync::watch;

use super::upstream::DNS_PORT;
use super::{DnsConfig, DnsServer};

/// Wait after a failed bind or a server that stopped.
const RETRY: Duration = Duration::from_secs(10);

/// Serve the cluster DNS on the pod CIDR's gateway (bound before the
/// bridge has the address, which comes with the first pod), moving with
/// the CIDR if it ever changes. Failures are logged and retried.
/// `gateway` is the pod network's rule for a CIDR's gateway address (the
/// agent's network module owns it; the DNS server only follows it).
pub async fn serve(
    config: DnsConfig,
    services: Store<Service>,
    slices: Store<EndpointSlice>,
    mut pod_cidr: watch::Receiver<Option<String>>,
    gateway: fn(&str) -> Option<IpAddr>,
    stop: impl Future<Output = ()>,
) {
    tokio::pin!(stop);
    loop {
        let gateway = pod_cidr.borrow_and_update().as_deref().and_then(gateway);
        let mut failed = false;
        if let Some(ip) = gateway {
            let dns = DnsConfig {
                listen: vec![SocketAddr::new(ip, DNS_PORT)],
                ..config.clone()
            };
            match DnsServer::bind(dns, services.clone(), slices.clone()).await {
                Ok(server) => {
                    let (done, done_rx) = tokio::sync::oneshot::channel::<()>();
                    let run = server.run(async {
                        let _ = done_rx.await;
                    });
                    tokio::pin!(run);
                    tokio::select! {
                        () = &mut stop => {
                            let _ = done.send(());
                            let _ = run.await;
                            return;
                        }
                        r = pod_cidr.changed() => {
                            let _ = done.send(());
                            let _ = run.await;
                            if r.is_err() {
                                return;
                            }
                            continue;
                        }
                        r = &mut run => {
                            if let Err(e) = r {
                                tracing::error!("cluster DNS on {ip} stopped: {e}; restarting in {RETRY:?}");
                            }
                            failed = true;
                        }
                    }
                }
                Err(e) => {
                    tracing::error!("cluster DNS on {ip}: {e}; retrying in {RETRY:?}");
                    failed = true;
                }
            }
        }
        tokio::select! {
            () = &mut stop => return,
            r = pod_cidr.changed() => if r.is_err() { return },
            () = tokio::time::sleep(RETRY), if failed => {}
        }
    }
}
