//! `--tokens`: what authenticating with a ServiceAccount token costs.
//! GETs of one pod with a bound-less ServiceAccount token alternate with the
//! same GETs with the client certificate of a user holding the same RBAC
//! binding (so authorization costs both the same), in the same run; the
//! ratios of server CPU per GET and of latency are what the token costs.

use std::path::Path;

use anyhow::Context;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, PostParams};
use serde_json::json;
use skiff_control_plane::pki::Pki;

use super::https::{self, Version};
use super::load::{pod_json, Load};
use super::{measured, Figures};

const SA: &str = "bench-robot";
const USER: &str = "bench-user";

pub async fn run(
    pid: u32,
    data: &Path,
    port: u16,
    client: &kube::Client,
    gets: usize,
    concurrency: usize,
    rounds: usize,
) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(pod_json(0))?,
    )
    .await
    .context("creating the pod")?;
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    sas.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": SA}}))?,
    )
    .await
    .context("creating the service account")?;
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "bench-view"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [
            {"kind": "ServiceAccount", "name": SA, "namespace": "default"},
            {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER},
        ],
    }))?;
    Api::<RoleBinding>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &binding)
        .await
        .context("binding view")?;
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let token = sas
        .create_token_request(SA, &PostParams::default(), &request)
        .await
        .context("requesting a token")?
        .status
        .and_then(|s| s.token)
        .context("the TokenRequest answer has no token")?;

    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let url = format!("https://127.0.0.1:{port}");
    let cert_kubeconfig = data.join("bench-user.kubeconfig");
    std::fs::write(
        &cert_kubeconfig,
        Pki::load_or_create(data)?.kubeconfig(&url, USER, &[])?,
    )?;
    let mut by_cert = Load::https(
        https::Target::from_kubeconfig(&cert_kubeconfig, addr, Version::Http1)?,
        concurrency,
    )
    .await?;
    let mut by_token = Load::https(
        https::Target::with_token(&data.join("admin.kubeconfig"), addr, Version::Http1, &token)?,
        concurrency,
    )
    .await?;
    // RBAC sees the binding through its watch: wait for both to be let in.
    for load in [&mut by_cert, &mut by_token] {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while load.gets(1, 1, 1).await.0.is_empty() {
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "GETs are still refused"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    let rounds = rounds.clamp(1, gets.max(1));
    let (mut cert_runs, mut token_runs) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        let n = (r + 1) * gets / rounds - r * gets / rounds;
        cert_runs.push(measured(pid, by_cert.gets(n, 1, concurrency)).await);
        token_runs.push(measured(pid, by_token.gets(n, 1, concurrency)).await);
    }
    let cert = Figures::merge(cert_runs).context("GETs with a client certificate")?;
    cert.print("GET with a client certificate");
    let tok = Figures::merge(token_runs).context("GETs with a ServiceAccount token")?;
    tok.print("GET with a ServiceAccount token");
    let (cert_us, _) = cert.cpu_us();
    let (tok_us, _) = tok.cpu_us();
    let r3 = |x: f64| (x * 1000.0).round() / 1000.0;
    let cpu_ratio = tok_us / cert_us.max(1e-9);
    let p50_ratio = tok.p50.as_secs_f64() / cert.p50.as_secs_f64().max(1e-9);
    let throughput_ratio = cert.per_s / tok.per_s.max(1e-9);
    println!(
        "token/certificate: server CPU per GET {cpu_ratio:.3} ({tok_us:.0} vs {cert_us:.0} us), p50 {p50_ratio:.3}, time per GET (inverse throughput) {throughput_ratio:.3}"
    );
    println!(
        "{}",
        json!({
            "gets": gets, "concurrency": concurrency, "rounds": rounds,
            "cert_get_p50_ms": super::ms(cert.p50), "cert_get_p99_ms": super::ms(cert.p99), "cert_get_per_s": cert.per_s.round(),
            "token_get_p50_ms": super::ms(tok.p50), "token_get_p99_ms": super::ms(tok.p99), "token_get_per_s": tok.per_s.round(),
            "server_cpu_us_per_cert_get": cert_us.round(), "server_cpu_us_per_token_get": tok_us.round(),
            "token_cert_server_cpu_ratio": r3(cpu_ratio), "token_cert_p50_ratio": r3(p50_ratio),
            "token_cert_time_per_get_ratio": r3(throughput_ratio),
        })
    );
    Ok(())
}
