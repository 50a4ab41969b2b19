//! OIDC authentication of people, in process, against an issuer this test
//! serves itself on loopback HTTPS (its own CA, discovery document and
//! JWKS, signing keys made here): a good ID token maps to the configured
//! user and groups and RBAC decides; every bad token gets 401; a key the
//! issuer rotates in is picked up; the structured
//! `--authentication-config` maps claims the same way.

use crate::api;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use api::{eventually, raw, TestServer};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{json, Value};
use skiff_control_plane::config::Settings;

const WAIT: Duration = Duration::from_secs(30);

/// A P-256 signing key of the test issuer.
struct SigningKey {
    kid: String,
    key: EncodingKey,
    jwk: Value,
}

impl SigningKey {
    fn new(kid: &str) -> SigningKey {
        let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let raw = kp.public_key_raw();
        let jwk = json!({
            "kty": "EC", "crv": "P-256", "use": "sig", "alg": "ES256", "kid": kid,
            "x": URL_SAFE_NO_PAD.encode(&raw[1..33]),
            "y": URL_SAFE_NO_PAD.encode(&raw[33..65]),
        });
        SigningKey {
            kid: kid.into(),
            key: EncodingKey::from_ec_der(&kp.serialize_der()),
            jwk,
        }
    }

    fn sign(&self, claims: &Value) -> String {
        let mut h = Header::new(Algorithm::ES256);
        h.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&h, claims, &self.key).unwrap()
    }
}

/// The issuer: discovery and JWKS on loopback HTTPS, with a CA of its own.
struct Issuer {
    url: String,
    ca_pem: String,
    /// What `/keys` serves; tests rotate keys by replacing it.
    jwks: Arc<Mutex<Value>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Issuer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve_issuer(keys: &[&SigningKey]) -> Issuer {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(vec![]).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "test OIDC issuer CA");
    let ca_pem = ca_params.self_signed(&ca_key).unwrap().pem();
    let ca = rcgen::Issuer::from_ca_cert_pem(&ca_pem, ca_key).unwrap();
    let srv_key = rcgen::KeyPair::generate().unwrap();
    let srv = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&srv_key, &ca)
        .unwrap();
    let tls = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(srv.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(srv_key.serialize_der())),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "https://127.0.0.1:{}",
        listener.local_addr().unwrap().port()
    );
    let jwks = Arc::new(Mutex::new(
        json!({"keys": keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>()}),
    ));
    let discovery = json!({
        "issuer": url,
        "jwks_uri": format!("{url}/keys"),
        "id_token_signing_alg_values_supported": ["ES256"],
    });
    let served = jwks.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            let (discovery, jwks) = (discovery.clone(), served.clone());
            tokio::spawn(async move {
                let Ok(io) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = hyper::service::service_fn(move |req: hyper::Request<_>| {
                    let body = match req.uri().path() {
                        "/.well-known/openid-configuration" => Some(discovery.clone()),
                        "/keys" => Some(jwks.lock().unwrap().clone()),
                        _ => None,
                    };
                    let resp = match body {
                        Some(v) => hyper::Response::new(Full::new(Bytes::from(v.to_string()))),
                        None => {
                            let mut r = hyper::Response::new(Full::new(Bytes::new()));
                            *r.status_mut() = hyper::StatusCode::NOT_FOUND;
                            r
                        }
                    };
                    async move { Ok::<_, std::convert::Infallible>(resp) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(io), svc)
                    .await;
            });
        }
    });
    Issuer {
        url,
        ca_pem,
        jwks,
        task,
    }
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// An ID token's claims for `email` in `groups`.
fn claims(iss: &str, email: &str, groups: &[&str]) -> Value {
    json!({
        "iss": iss, "aud": "skiff", "sub": format!("sub-{email}"), "email": email,
        "email_verified": true, "groups": groups, "tenant": "blue",
        "iat": now(), "exp": now() + 600,
    })
}

async fn list_pods_with(s: &TestServer, token: &str) -> u16 {
    let c = s.token_client(token).await;
    raw(&c, "GET", "/api/v1/namespaces/default/pods", "", vec![])
        .await
        .0
}

/// Grant `view` in `default` to a subject (kind User or Group).
async fn bind_view(s: &TestServer, name: &str, kind: &str, subject: &str) {
    let admin = s.client().await;
    let rb = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": "default"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": subject}],
    });
    let (code, _, v) = raw(
        &admin,
        "POST",
        "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings",
        "application/json",
        rb.to_string().into_bytes(),
    )
    .await;
    assert_eq!(code, 201, "{v}");
}

/// Wait until `token` lists pods (RBAC caches follow the store).
async fn permitted(s: &TestServer, token: &str) -> bool {
    eventually(WAIT, || async { list_pods_with(s, token).await == 200 }).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidc_flags_map_people_and_refuse_bad_tokens() {
    let k1 = SigningKey::new("k1");
    let issuer = serve_issuer(&[&k1]).await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("issuer-ca.pem");
    std::fs::write(&ca_file, &issuer.ca_pem).unwrap();
    let mut s = TestServer::start_with_settings(
        None,
        Settings {
            oidc_issuer_url: Some(issuer.url.clone()),
            oidc_client_id: Some("skiff".into()),
            oidc_username_claim: Some("email".into()),
            oidc_groups_claim: Some("groups".into()),
            oidc_groups_prefix: Some("oidc:".into()),
            oidc_ca_file: Some(ca_file),
            oidc_signing_algs: Some(vec!["ES256".into()]),
            oidc_required_claim: Some(vec!["tenant=blue".into()]),
            ..Default::default()
        },
    )
    .await;

    // A good token authenticates; RBAC decides what it may do.
    let jane = k1.sign(&claims(&issuer.url, "jane@example.com", &["dev"]));
    assert_eq!(list_pods_with(&s, &jane).await, 403);
    bind_view(&s, "jane-views", "User", "jane@example.com").await;
    assert!(permitted(&s, &jane).await, "jane's binding never applied");
    // Groups come from the claim, prefixed.
    let bob = k1.sign(&claims(&issuer.url, "bob@example.com", &["readers"]));
    assert_eq!(list_pods_with(&s, &bob).await, 403);
    bind_view(&s, "readers-view", "Group", "oidc:readers").await;
    assert!(permitted(&s, &bob).await, "the group binding never applied");
    // A single string is a group too (upstream allows it).
    let mut single = claims(&issuer.url, "carol@example.com", &[]);
    single["groups"] = json!("readers");
    assert_eq!(list_pods_with(&s, &k1.sign(&single)).await, 200);
    // TokenReview answers for people's tokens too.
    let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": bob}});
    let (code, _, v) = raw(
        &s.client().await,
        "POST",
        "/apis/authentication.k8s.io/v1/tokenreviews",
        "application/json",
        serde_json::to_vec(&review).unwrap(),
    )
    .await;
    assert_eq!(code, 201, "{v}");
    assert_eq!(v["status"]["authenticated"], true, "{v}");
    assert_eq!(v["status"]["user"]["username"], "bob@example.com");
    assert!(
        v["status"]["user"]["groups"]
            .to_string()
            .contains("oidc:readers"),
        "{v}"
    );

    // Every bad token is refused with 401, never a crash.
    let mut bad: Vec<(&str, String)> = Vec::new();
    let good = claims(&issuer.url, "jane@example.com", &["dev"]);
    let with = |f: &dyn Fn(&mut Value)| {
        let mut c = good.clone();
        f(&mut c);
        c
    };
    bad.push((
        "expired",
        k1.sign(&with(&|c| c["exp"] = json!(now() - 3600))),
    ));
    bad.push((
        "no exp",
        k1.sign(&with(&|c| {
            c.as_object_mut().unwrap().remove("exp");
        })),
    ));
    bad.push(("wrong aud", k1.sign(&with(&|c| c["aud"] = json!("other")))));
    bad.push((
        "wrong iss",
        k1.sign(&with(&|c| c["iss"] = json!("https://127.0.0.1:1"))),
    ));
    bad.push((
        "missing required claim",
        k1.sign(&with(&|c| {
            c.as_object_mut().unwrap().remove("tenant");
        })),
    ));
    bad.push((
        "wrong required claim",
        k1.sign(&with(&|c| c["tenant"] = json!("red"))),
    ));
    bad.push((
        "email not verified",
        k1.sign(&with(&|c| c["email_verified"] = json!(false))),
    ));
    bad.push((
        "groups not strings",
        k1.sign(&with(&|c| c["groups"] = json!([1]))),
    ));
    let forged = SigningKey::new("k1");
    bad.push(("bad signature", forged.sign(&good)));
    let mut parts: Vec<String> = jane.split('.').map(String::from).collect();
    parts[1] =
        URL_SAFE_NO_PAD.encode(with(&|c| c["email"] = json!("root@example.com")).to_string());
    bad.push(("tampered payload", parts.join(".")));
    bad.push((
        "alg none",
        format!(
            "{}.{}.",
            URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#),
            URL_SAFE_NO_PAD.encode(good.to_string())
        ),
    ));
    let mut hs = Header::new(Algorithm::HS256);
    hs.kid = Some("k1".into());
    bad.push((
        "HS256",
        jsonwebtoken::encode(&hs, &good, &EncodingKey::from_secret(b"k1")).unwrap(),
    ));
    // HMAC keyed with the public key's JSON, the classic confusion attack.
    bad.push((
        "HS256 with the public key",
        jsonwebtoken::encode(
            &hs,
            &good,
            &EncodingKey::from_secret(k1.jwk.to_string().as_bytes()),
        )
        .unwrap(),
    ));
    bad.push(("unknown kid", SigningKey::new("nope").sign(&good)));
    bad.push(("garbage", "not.a.jwt".into()));
    bad.push(("256 KiB", format!("{jane}{}", "A".repeat(256 * 1024))));
    for (what, token) in &bad {
        assert_eq!(list_pods_with(&s, token).await, 401, "{what}");
    }
    // A 1 MiB header does not fit the HTTP server's request buffer: it is
    // refused (431) before authentication, as Go's servers refuse headers
    // over their MaxHeaderBytes.
    let huge = format!("{jane}{}", "A".repeat(1024 * 1024));
    assert_eq!(list_pods_with(&s, &huge).await, 431);
    // Still serving, and the good token still works.
    assert_eq!(list_pods_with(&s, &jane).await, 200);

    // The issuer rotates to a new key: tokens naming it are accepted once
    // the keys are fetched again (rate-limited, hence the wait).
    let k2 = SigningKey::new("k2");
    *issuer.jwks.lock().unwrap() = json!({"keys": [k2.jwk.clone()]});
    let rotated = k2.sign(&claims(&issuer.url, "jane@example.com", &["dev"]));
    assert!(
        permitted(&s, &rotated).await,
        "the rotated key was never fetched"
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authentication_config_maps_claims() {
    let k1 = SigningKey::new("k1");
    let issuer = serve_issuer(&[&k1]).await;
    let dir = tempfile::tempdir().unwrap();
    let ca = issuer
        .ca_pem
        .lines()
        .map(|l| format!("      {l}"))
        .collect::<Vec<_>>()
        .join("\n");
    let file = dir.path().join("authn.yaml");
    std::fs::write(
        &file,
        format!(
            "apiVersion: apiserver.config.k8s.io/v1beta1\nkind: AuthenticationConfiguration\njwt:\n\
             - issuer:\n    url: {url}\n    audiences: [skiff, other]\n    audienceMatchPolicy: MatchAny\n    certificateAuthority: |\n{ca}\n\
             \x20 claimValidationRules:\n  - claim: tenant\n    requiredValue: blue\n\
             \x20 claimMappings:\n    username: {{claim: sub, prefix: 'corp:'}}\n    groups: {{claim: groups, prefix: ''}}\n    uid: {{claim: sub}}\n",
            url = issuer.url
        ),
    )
    .unwrap();
    let mut s = TestServer::start_with_settings(
        None,
        Settings {
            authentication_config: Some(file),
            ..Default::default()
        },
    )
    .await;
    let mut c = claims(&issuer.url, "dana@example.com", &["team-a"]);
    c["aud"] = json!(["other"]);
    let dana = k1.sign(&c);
    assert_eq!(list_pods_with(&s, &dana).await, 403);
    bind_view(&s, "dana", "User", "corp:sub-dana@example.com").await;
    assert!(
        permitted(&s, &dana).await,
        "the prefixed username never matched"
    );
    c["tenant"] = json!("red");
    assert_eq!(list_pods_with(&s, &k1.sign(&c)).await, 401);
    c["tenant"] = json!("blue");
    c["aud"] = json!("elsewhere");
    assert_eq!(list_pods_with(&s, &k1.sign(&c)).await, 401);
    s.stop().await;
}

#[tokio::test]
async fn refused_settings_stop_the_server_with_the_field_named() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("authn.yaml");
    std::fs::write(
        &file,
        "apiVersion: apiserver.config.k8s.io/v1\nkind: AuthenticationConfiguration\njwt:\n\
         - issuer: {url: 'https://issuer.example', audiences: [skiff]}\n  claimMappings:\n    username: {expression: 'claims.sub'}\n",
    )
    .unwrap();
    let cfg = skiff_control_plane::config::Config::resolve(
        Settings {
            data_dir: Some(dir.path().join("data")),
            secure_port: Some(0),
            authentication_config: Some(file.clone()),
            ..Default::default()
        },
        None,
    )
    .unwrap();
    let store: Arc<dyn skiff_control_plane::store::Store> = Arc::new(
        skiff_control_plane::store::SqliteStore::open(dir.path().join("db.sqlite"))
            .await
            .unwrap(),
    );
    let e = match skiff_control_plane::server::start(&cfg, store.clone()).await {
        Ok(_) => panic!("a CEL expression was accepted"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("jwt[0].claimMappings.username.expression"),
        "{e}"
    );
    let mut cfg = cfg;
    cfg.oidc.issuer_url = Some("https://issuer.example".into());
    cfg.oidc.client_id = Some("skiff".into());
    let e = match skiff_control_plane::server::start(&cfg, store).await {
        Ok(_) => panic!("flags and file together were accepted"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("mutually exclusive"), "{e}");
}
