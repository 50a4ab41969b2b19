//! gRPC probes (upstream `probe/grpc`): `grpc.health.v1.Health/Check` on
//! the pod IP, plaintext, with the probe's optional service name. SERVING
//! succeeds; anything else, a refused connection, a server without the
//! health service or the timeout fails, with upstream's wording.

use std::time::{Duration, Instant};

use tonic::transport::Endpoint;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use super::Verdict;

/// Check `service` ("" = the whole server) at `host:port` within `timeout`.
pub async fn probe(host: &str, port: u16, service: &str, timeout: Duration) -> Verdict {
    let started = Instant::now();
    let addr = super::port::join_host_port(host, port);
    let go_timeout = kube_util::duration::format_go_millis(timeout);
    let endpoint = match Endpoint::from_shared(format!("http://{addr}")) {
        Ok(e) => e,
        Err(e) => {
            return Verdict::Failure(format!("error: failed to connect service at {addr:?}: {e}"))
        }
    };
    let endpoint = endpoint.connect_timeout(timeout).timeout(timeout);
    let endpoint = match endpoint.user_agent(super::http::user_agent("probe")) {
        Ok(e) => e,
        Err(e) => return Verdict::Failure(format!("error: {e}")),
    };
    let channel = match tokio::time::timeout(timeout, endpoint.connect()).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            return Verdict::Failure(format!(
                "error: failed to connect service at {addr:?}: {}",
                root_cause(&e)
            ))
        }
        Err(_) => {
            return Verdict::Failure(format!(
                "timeout: failed to connect service {addr:?} within {go_timeout}: context deadline exceeded"
            ))
        }
    };
    let left = timeout.saturating_sub(started.elapsed());
    let mut client = HealthClient::new(channel);
    let check = client.check(HealthCheckRequest {
        service: service.to_string(),
    });
    let resp = match tokio::time::timeout(left, check).await {
        Ok(Ok(r)) => r.into_inner(),
        Ok(Err(status)) => {
            return Verdict::Failure(match status.code() {
                Code::Unimplemented => format!(
                    "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): {}",
                    status.message()
                ),
                Code::DeadlineExceeded | Code::Cancelled => {
                    format!("timeout: health rpc did not complete within {go_timeout}")
                }
                _ => format!(
                    "error: health rpc probe failed: rpc error: code = {:?} desc = {}",
                    status.code(),
                    status.message()
                ),
            })
        }
        Err(_) => {
            return Verdict::Failure(format!(
                "timeout: health rpc did not complete within {go_timeout}"
            ))
        }
    };
    match resp.status() {
        ServingStatus::Serving => Verdict::Success("service healthy".into()),
        other => Verdict::Failure(format!(
            "service unhealthy (responded with {:?})",
            other.as_str_name()
        )),
    }
}

fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = e;
    while let Some(s) = cause.source() {
        cause = s;
    }
    match cause.downcast_ref::<std::io::Error>() {
        Some(io) => format!("dial tcp: connect: {}", super::tcp::go_io_error(io)),
        None => cause.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn refused_connection_fails() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        let v = probe("127.0.0.1", port, "", Duration::from_secs(1)).await;
        let Verdict::Failure(msg) = v else {
            panic!("{v:?}")
        };
        assert!(
            msg.starts_with("error: failed to connect service at"),
            "{msg}"
        );
    }
}
