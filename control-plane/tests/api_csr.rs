//! Node bootstrap through the API, in process: bootstrap tokens
//! authenticate, CertificateSigningRequests are stamped with their
//! requester and guarded for bootstrappers and nodes, the csrapproving /
//! csrsigning / tokencleaner controllers approve, issue and clean up, and
//! real kubectl (1.27 to 1.33) lists, approves and denies CSRs.

use crate::api;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use api::{eventually, fails, header, ok, raw, TestServer, KUBECTL_DIR};
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeStatus, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use kube::api::{Api, PostParams};
use skiff_bootstrap::{csr, names, JoinToken};
use skiff_control_plane::pki::Pki;
use skiff_control_plane::tokens::{self, TokenSpec};
use tokio::sync::oneshot;

const WAIT: Duration = Duration::from_secs(30);

fn csr_object(signer: &str, pem: &str, usages: &[&str]) -> CertificateSigningRequest {
    CertificateSigningRequest {
        metadata: ObjectMeta {
            generate_name: Some("csr-".into()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(pem.as_bytes().to_vec()),
            signer_name: signer.into(),
            usages: Some(usages.iter().map(|s| s.to_string()).collect()),
            // The server must overwrite what the requester claims.
            username: Some("admin".into()),
            groups: Some(vec!["system:masters".into()]),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn api_code(e: kube::Error) -> u16 {
    match e {
        kube::Error::Api(s) => s.code,
        other => panic!("expected an API error, got {other}"),
    }
}

/// The csrapproving, csrsigning and tokencleaner controllers, in process.
async fn start_controllers(s: &TestServer) -> oneshot::Sender<()> {
    let client = s.client_for("system:kube-controller-manager", &[]).await;
    let pki = Pki::load_or_create(&s.cfg.data_dir).expect("pki");
    let config = skiff_controllers::Config {
        controllers: vec![
            "csrapproving".into(),
            "csrsigning".into(),
            "tokencleaner".into(),
        ],
        signing: Some(Arc::new(skiff_controllers::SigningCa {
            cert_pem: pki.ca_pem().to_string(),
            key_pem: pki.ca_key_pem().to_string(),
        })),
        cluster_signing_duration: Duration::from_secs(3600),
        ..Default::default()
    };
    let (tx, rx) = oneshot::channel();
    tokio::spawn(skiff_controllers::run(client, config, async {
        let _ = rx.await;
    }));
    tx
}

async fn issued(
    api: &Api<CertificateSigningRequest>,
    name: &str,
) -> Option<CertificateSigningRequest> {
    let c = api.get(name).await.ok()?;
    let has_cert = c
        .status
        .as_ref()
        .and_then(|s| s.certificate.as_ref())
        .is_some_and(|c| !c.0.is_empty());
    has_cert.then_some(c)
}

fn condition(c: &CertificateSigningRequest, ty: &str) -> Option<(String, String)> {
    c.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|x| x.type_ == ty)
        .map(|x| {
            (
                x.reason.clone().unwrap_or_default(),
                x.message.clone().unwrap_or_default(),
            )
        })
}

/// A kubeconfig whose client certificate is `cert_pem` with `key_pem`.
fn kubeconfig_with(s: &TestServer, path: &Path, cert_pem: &str, key_pem: &str) {
    use base64::Engine;
    let b64 = |x: &str| base64::engine::general_purpose::STANDARD.encode(x);
    let pki = Pki::load_or_create(&s.cfg.data_dir).expect("pki");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: \"{}\", certificate-authority-data: {}}}}}]\nusers: [{{name: u, user: {{client-certificate-data: {}, client-key-data: {}}}}}]\ncontexts: [{{name: x, context: {{cluster: c, user: u}}}}]\ncurrent-context: x\n",
        s.url(),
        b64(pki.ca_pem()),
        b64(cert_pem),
        b64(key_pem)
    );
    std::fs::write(path, text).expect("write kubeconfig");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bootstrap_tokens_join_nodes_through_approved_csrs() {
    let s = TestServer::start().await;
    let admin = s.client().await;
    let join = tokens::create(
        &admin,
        &TokenSpec {
            ttl: Some(Duration::from_secs(3600)),
            description: Some("api test".into()),
            groups: vec![],
        },
    )
    .await
    .expect("token create");
    let listed = tokens::list(&admin).await.expect("token list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, join.token.id);
    assert_eq!(listed[0].description, "api test");

    // /cacerts is public and is what the join token pins.
    let anon = s.anonymous_client().await;
    let (code, _, body) = raw(&anon, "GET", names::CA_PATH, "application/json", vec![]).await;
    assert_eq!(code, 200);
    let served = body.as_str().expect("PEM text").to_string();
    assert!(join.pins(served.as_bytes()), "the token pins the served CA");
    assert!(JoinToken::parse(&join.expose())
        .unwrap()
        .pins(served.as_bytes()));

    let boot = s.token_client(&join.token.expose()).await;
    let boot_csrs: Api<CertificateSigningRequest> = Api::all(boot.clone());
    let node1 = csr::new_node_client("n1").unwrap();
    let created = boot_csrs
        .create(
            &PostParams::default(),
            &csr_object(
                names::SIGNER_KUBELET_CLIENT,
                &node1.csr_pem,
                csr::NODE_CLIENT_USAGES,
            ),
        )
        .await
        .expect("a bootstrapper creates a node client CSR");
    let name = created.metadata.name.clone().unwrap();
    let user = format!("system:bootstrap:{}", join.token.id);
    assert_eq!(created.spec.username.as_deref(), Some(user.as_str()));
    let groups = created.spec.groups.clone().unwrap_or_default();
    assert!(groups.iter().any(|g| g == "system:bootstrappers"));
    assert!(groups.iter().any(|g| g == names::DEFAULT_TOKEN_GROUP));
    assert!(!groups.iter().any(|g| g == "system:masters"));
    boot_csrs
        .get(&name)
        .await
        .expect("a bootstrapper reads its own CSR");

    // What a bootstrap token may not do.
    assert_eq!(
        api_code(boot_csrs.list(&Default::default()).await.unwrap_err()),
        403
    );
    let serving = csr::new_node_serving("n1", &["n1".into()], &[]).unwrap();
    let err = boot_csrs
        .create(
            &PostParams::default(),
            &csr_object(
                names::SIGNER_KUBELET_SERVING,
                &serving.csr_pem,
                csr::NODE_SERVING_USAGES,
            ),
        )
        .await
        .unwrap_err();
    assert_eq!(api_code(err), 403);
    let admins: Api<CertificateSigningRequest> = Api::all(admin.clone());
    let other = admins
        .create(
            &PostParams::default(),
            &csr_object(
                "example.com/manual",
                &csr::new_node_client("x").unwrap().csr_pem,
                &["client auth"],
            ),
        )
        .await
        .unwrap();
    let other_name = other.metadata.name.unwrap();
    assert_eq!(api_code(boot_csrs.get(&other_name).await.unwrap_err()), 403);
    let secrets: Api<Secret> = Api::namespaced(boot.clone(), "kube-system");
    assert_eq!(
        api_code(secrets.list(&Default::default()).await.unwrap_err()),
        403
    );
    let wrong = format!("{}.0000000000000000", join.token.id);
    let (code, _, _) = raw(
        &s.token_client(&wrong).await,
        "GET",
        "/api/v1/namespaces",
        "application/json",
        vec![],
    )
    .await;
    assert_eq!(code, 401, "a wrong secret is not authenticated");

    // The approver and the signer issue the node's certificate.
    let stop = start_controllers(&s).await;
    assert!(
        eventually(WAIT, || async { issued(&admins, &name).await.is_some() }).await,
        "the join CSR is approved and issued"
    );
    let got = issued(&admins, &name).await.unwrap();
    let (reason, message) = condition(&got, "Approved").expect("Approved");
    assert_eq!(reason, "AutoApproved");
    assert!(message.contains("kubelet client certificate"), "{message}");
    let cert_pem = String::from_utf8(got.status.unwrap().certificate.unwrap().0).unwrap();
    let node_kc = s.dir.path().join("n1.kubeconfig");
    kubeconfig_with(&s, &node_kc, &cert_pem, &node1.key_pem);
    let as_node = s.client_from(&node_kc).await;
    let nodes: Api<Node> = Api::all(as_node.clone());
    let node = Node {
        metadata: ObjectMeta {
            name: Some("n1".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    nodes
        .create(&PostParams::default(), &node)
        .await
        .expect("the issued certificate is node n1's identity");
    // A manual signer's request is left alone.
    assert!(condition(&admins.get(&other_name).await.unwrap(), "Approved").is_none());

    // Renewals: the node asks for its own name only.
    let node_csrs: Api<CertificateSigningRequest> = Api::all(as_node.clone());
    let renewal = node_csrs
        .create(
            &PostParams::default(),
            &csr_object(
                names::SIGNER_KUBELET_CLIENT,
                &csr::new_node_client("n1").unwrap().csr_pem,
                csr::NODE_CLIENT_USAGES,
            ),
        )
        .await
        .expect("a node renews its certificate");
    let renewal = renewal.metadata.name.unwrap();
    let err = node_csrs
        .create(
            &PostParams::default(),
            &csr_object(
                names::SIGNER_KUBELET_CLIENT,
                &csr::new_node_client("n2").unwrap().csr_pem,
                csr::NODE_CLIENT_USAGES,
            ),
        )
        .await
        .unwrap_err();
    assert_eq!(
        api_code(err),
        403,
        "a node asks for no other node's certificate"
    );
    assert!(eventually(WAIT, || async { issued(&admins, &renewal).await.is_some() }).await);
    let r = admins.get(&renewal).await.unwrap();
    assert!(condition(&r, "Approved")
        .unwrap()
        .1
        .contains("self kubelet client"));

    // Serving certificates: for the node's reported addresses only, never
    // the API server's.
    let ip: std::net::IpAddr = "198.18.7.7".parse().unwrap();
    let serving_for = |ip: std::net::IpAddr| {
        let pem = csr::new_node_serving("n1", &["n1".into()], &[ip])
            .unwrap()
            .csr_pem;
        csr_object(
            names::SIGNER_KUBELET_SERVING,
            &pem,
            csr::NODE_SERVING_USAGES,
        )
    };
    let created = |c: CertificateSigningRequest| c.metadata.name.unwrap();
    let pp = PostParams::default();
    let good = created(node_csrs.create(&pp, &serving_for(ip)).await.unwrap());
    let apiserver_ip: std::net::IpAddr = "127.0.0.1".parse().unwrap();
    let bad = created(
        node_csrs
            .create(&pp, &serving_for(apiserver_ip))
            .await
            .unwrap(),
    );
    let status = serde_json::json!({"status": NodeStatus {
        addresses: Some(vec![
            NodeAddress { type_: "InternalIP".into(), address: ip.to_string() },
            NodeAddress { type_: "InternalIP".into(), address: apiserver_ip.to_string() },
        ]),
        ..Default::default()
    }});
    nodes
        .patch_status("n1", &Default::default(), &kube::api::Patch::Merge(&status))
        .await
        .expect("the node reports its addresses");
    assert!(eventually(WAIT, || async { issued(&admins, &good).await.is_some() }).await);
    let bad_csr = admins.get(&bad).await.unwrap();
    assert!(
        condition(&bad_csr, "Approved").is_none(),
        "no certificate for the API server's address"
    );

    // Expired tokens are refused, and cleaned away.
    let short = tokens::create(
        &admin,
        &TokenSpec {
            ttl: Some(Duration::from_secs(1)),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let all_secrets: Api<Secret> = Api::namespaced(admin.clone(), "kube-system");
    let secret_name = format!("bootstrap-token-{}", short.token.id);
    assert!(
        eventually(WAIT, || async {
            all_secrets
                .get_opt(&secret_name)
                .await
                .ok()
                .flatten()
                .is_none()
        })
        .await,
        "the token cleaner deleted the expired token"
    );
    let (code, _, _) = raw(
        &s.token_client(&short.token.expose()).await,
        "GET",
        "/api/v1/namespaces",
        "application/json",
        vec![],
    )
    .await;
    assert_eq!(code, 401);
    assert_eq!(
        tokens::delete(&admin, &join.expose()).await.unwrap(),
        join.token.id
    );
    assert!(tokens::list(&admin).await.unwrap().is_empty());
    let (code, _, _) = raw(
        &boot,
        "GET",
        &format!("/apis/certificates.k8s.io/v1/certificatesigningrequests/{name}"),
        "application/json",
        vec![],
    )
    .await;
    assert_eq!(code, 401, "a deleted token no longer authenticates");
    let _ = stop.send(());
}

fn kubectl_version(version: &str, s: &TestServer, args: &[&str]) -> Output {
    let cache = s.dir.path().join(format!("kube-cache-{version}"));
    Command::new(format!("{KUBECTL_DIR}/kubectl.{version}"))
        .env("KUBECONFIG", s.admin_kubeconfig())
        .env("HOME", s.dir.path())
        .arg(format!("--cache-dir={}", cache.display()))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run kubectl")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubectl_lists_approves_and_denies_csrs() {
    let s = TestServer::start().await;
    let admins: Api<CertificateSigningRequest> = Api::all(s.client().await);
    for version in ["1.27", "1.28", "1.29", "1.30", "1.31", "1.32", "1.33"] {
        let mut names_ = Vec::new();
        for _ in 0..2 {
            let mut obj = csr_object(
                "example.com/manual",
                &csr::new_node_client("x").unwrap().csr_pem,
                &["client auth"],
            );
            obj.spec.expiration_seconds = Some(3600);
            let c = admins.create(&PostParams::default(), &obj).await.unwrap();
            names_.push(c.metadata.name.unwrap());
        }
        let table = ok(kubectl_version(version, &s, &["get", "csr", &names_[0]]));
        assert_eq!(
            header(&table),
            [
                "NAME",
                "AGE",
                "SIGNERNAME",
                "REQUESTOR",
                "REQUESTEDDURATION",
                "CONDITION"
            ],
            "kubectl {version}: {table}"
        );
        let row = table.lines().nth(1).unwrap_or_default();
        assert!(
            row.contains("example.com/manual")
                && row.contains("admin")
                && row.contains("60m")
                && row.ends_with("Pending"),
            "kubectl {version}: {row}"
        );
        let out = ok(kubectl_version(
            version,
            &s,
            &["certificate", "approve", &names_[0]],
        ));
        assert!(out.contains("approved"), "kubectl {version}: {out}");
        let out = ok(kubectl_version(
            version,
            &s,
            &["certificate", "deny", &names_[1]],
        ));
        assert!(out.contains("denied"), "kubectl {version}: {out}");
        let approved = admins.get(&names_[0]).await.unwrap();
        assert_eq!(
            condition(&approved, "Approved").unwrap().0,
            "KubectlApprove",
            "kubectl {version}"
        );
        let denied = admins.get(&names_[1]).await.unwrap();
        assert_eq!(
            condition(&denied, "Denied").unwrap().0,
            "KubectlDeny",
            "kubectl {version}"
        );
        let rows = ok(kubectl_version(version, &s, &["get", "csr"]));
        assert!(
            rows.lines()
                .any(|l| l.starts_with(&names_[0]) && l.ends_with("Approved")),
            "{rows}"
        );
        assert!(
            rows.lines()
                .any(|l| l.starts_with(&names_[1]) && l.ends_with("Denied")),
            "{rows}"
        );
        // Approved and Denied exclude each other.
        let err = fails(kubectl_version(
            version,
            &s,
            &["certificate", "approve", &names_[1]],
        ));
        assert!(
            err.contains("denied") || err.contains("Denied") || err.contains("mutually exclusive"),
            "kubectl {version}: {err}"
        );
        for n in &names_ {
            ok(kubectl_version(version, &s, &["delete", "csr", n]));
        }
    }
    // A signer cannot approve: the status subresource keeps the conditions.
    let c = admins
        .create(
            &PostParams::default(),
            &csr_object(
                "example.com/manual",
                &csr::new_node_client("y").unwrap().csr_pem,
                &["client auth"],
            ),
        )
        .await
        .unwrap();
    let name = c.metadata.name.clone().unwrap();
    let mut approved = c.clone();
    approved.status = Some(
        k8s_openapi::api::certificates::v1::CertificateSigningRequestStatus {
            conditions: Some(vec![
                k8s_openapi::api::certificates::v1::CertificateSigningRequestCondition {
                    type_: "Approved".into(),
                    status: "True".into(),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        },
    );
    let after = admins
        .replace_status(&name, &PostParams::default(), &approved)
        .await
        .unwrap();
    assert!(condition(&after, "Approved").is_none());
    // And a certificate is only issued for an approved request.
    let mut cert = after.clone();
    cert.status = Some(
        k8s_openapi::api::certificates::v1::CertificateSigningRequestStatus {
            certificate: Some(ByteString(b"-----BEGIN CERTIFICATE-----\n".to_vec())),
            ..Default::default()
        },
    );
    let err = admins
        .replace_status(&name, &PostParams::default(), &cert)
        .await
        .unwrap_err();
    assert_eq!(api_code(err), 422);
}
