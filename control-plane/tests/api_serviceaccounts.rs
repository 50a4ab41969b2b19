//! ServiceAccount tokens through the API, in process: TokenRequest (real
//! `kubectl create token`), their authentication and RBAC, tokens bound to
//! a pod that stop working when it goes, TokenReview, the issuer's public
//! discovery documents (a token verified against the JWKS with `ring`, not
//! the JWT library the server signs with), legacy Secret tokens filled by
//! the token controller, and bad input.

use crate::api;

use std::path::PathBuf;
use std::time::Duration;

use api::{eventually, fails, ok, raw, TestServer};
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use serde_json::{json, Value};
use skiff_control_plane::auth::satoken::Tokens;
use skiff_control_plane::pki::Pki;

const WAIT: Duration = Duration::from_secs(20);

/// A kubeconfig that presents `token` (and trusts the cluster CA).
fn token_kubeconfig(s: &TestServer, name: &str, token: &str) -> PathBuf {
    let pki = Pki::load_or_create(&s.cfg.data_dir).unwrap();
    let ca = STANDARD.encode(pki.ca_pem());
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: {}, certificate-authority-data: {ca}}}\nusers:\n- name: u\n  user: {{token: {token}}}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u, namespace: default}}\ncurrent-context: x\n",
        s.url()
    );
    let path = s.dir.path().join(format!("{name}.kubeconfig"));
    std::fs::write(&path, text).unwrap();
    path
}

/// The status code of listing pods in `default` with `token`.
async fn list_pods_with(s: &TestServer, token: &str) -> u16 {
    let c = s.token_client(token).await;
    raw(&c, "GET", "/api/v1/namespaces/default/pods", "", vec![])
        .await
        .0
}

async fn token_review(s: &TestServer, token: &str, audiences: Option<&[&str]>) -> Value {
    let mut spec = json!({"token": token});
    if let Some(a) = audiences {
        spec["audiences"] = json!(a);
    }
    let body =
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec});
    let (code, _, v) = raw(
        &s.client().await,
        "POST",
        "/apis/authentication.k8s.io/v1/tokenreviews",
        "application/json",
        serde_json::to_vec(&body).unwrap(),
    )
    .await;
    assert_eq!(code, 201, "{v}");
    v["status"].clone()
}

fn claims(token: &str) -> Value {
    let payload = token.split('.').nth(1).unwrap();
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap()
}

/// Let `default:robot` read the namespace (ClusterRole view).
fn bind_view(s: &TestServer) {
    ok(s.kubectl(&[
        "create",
        "rolebinding",
        "robot-view",
        "--clusterrole=view",
        "--serviceaccount=default:robot",
    ]));
}

fn create_token(s: &TestServer, args: &[&str]) -> String {
    let mut all = vec!["create", "token"];
    all.extend_from_slice(args);
    ok(s.kubectl(&all)).trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokens_authenticate_as_their_service_account() {
    let s = TestServer::start().await;
    ok(s.kubectl(&["create", "serviceaccount", "robot"]));
    let token = create_token(&s, &["robot"]);
    let c = claims(&token);
    assert_eq!(c["sub"], "system:serviceaccount:default:robot");
    assert_eq!(c["iss"], "https://kubernetes.default.svc.cluster.local");
    assert_eq!(
        c["exp"].as_i64().unwrap() - c["iat"].as_i64().unwrap(),
        3600
    );

    // Authenticated, and RBAC decides: forbidden, then allowed.
    let kc = token_kubeconfig(&s, "robot", &token);
    let err = fails(s.kubectl_as(&kc, &["get", "pods"], None));
    assert!(
        err.contains("User \"system:serviceaccount:default:robot\" cannot list resource \"pods\""),
        "{err}"
    );
    bind_view(&s);
    assert!(
        eventually(WAIT, || async {
            s.kubectl_as(&kc, &["get", "pods"], None).status.success()
        })
        .await
    );

    // TokenReview: the same identity, for the API's audience only.
    let st = token_review(&s, &token, None).await;
    assert_eq!(st["authenticated"], true, "{st}");
    assert_eq!(
        st["user"]["username"],
        "system:serviceaccount:default:robot"
    );
    let groups = st["user"]["groups"].to_string();
    for g in [
        "system:serviceaccounts",
        "system:serviceaccounts:default",
        "system:authenticated",
    ] {
        assert!(groups.contains(&format!("\"{g}\"")), "{groups}");
    }
    let st = token_review(&s, &token, Some(&["vault"])).await;
    assert_ne!(st["authenticated"], true, "{st}");

    // A token for another audience is not an API credential, but that
    // audience's reviews accept it.
    let vault = create_token(&s, &["robot", "--audience", "vault"]);
    assert_eq!(list_pods_with(&s, &vault).await, 401);
    let st = token_review(&s, &vault, Some(&["vault"])).await;
    assert_eq!(st["authenticated"], true, "{st}");
    assert_eq!(st["audiences"], json!(["vault"]));

    // Expired (signed with the server's own key) and forged tokens.
    let tokens = Tokens::load(&s.cfg.service_accounts).unwrap();
    let mut old = claims(&token);
    let now = jiff::Timestamp::now().as_second();
    old["iat"] = json!(now - 7200);
    old["nbf"] = json!(now - 7200);
    old["exp"] = json!(now - 3600);
    let key = std::fs::read(&s.cfg.service_accounts.signing_key_file).unwrap();
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
    header.kid = jsonwebtoken::decode_header(&token).unwrap().kid;
    let expired = jsonwebtoken::encode(
        &header,
        &old,
        &jsonwebtoken::EncodingKey::from_ec_pem(&key).unwrap(),
    )
    .unwrap();
    assert!(tokens.verify(&expired, now).is_err());
    assert_eq!(list_pods_with(&s, &expired).await, 401);
    let st = token_review(&s, &expired, None).await;
    assert_ne!(st["authenticated"], true);
    assert!(st["error"].as_str().unwrap().contains("expired"), "{st}");

    let parts: Vec<&str> = token.split('.').collect();
    let mut sig = URL_SAFE_NO_PAD.decode(parts[2]).unwrap();
    sig[10] ^= 1;
    let forged = format!("{}.{}.{}", parts[0], parts[1], URL_SAFE_NO_PAD.encode(sig));
    assert_eq!(list_pods_with(&s, &forged).await, 401);
    let none = format!(
        "{}.{}.",
        URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#),
        parts[1]
    );
    assert_eq!(list_pods_with(&s, &none).await, 401);
    let hs = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims(&token),
        &jsonwebtoken::EncodingKey::from_secret(b"guess"),
    )
    .unwrap();
    assert_eq!(list_pods_with(&s, &hs).await, 401);
    // A megabyte of token is refused, and the server carries on.
    let huge = format!("{}.{}.{}", parts[0], "A".repeat(1 << 20), parts[2]);
    let code = list_pods_with(&s, &huge).await;
    assert!(code == 401 || code == 431, "{code}");
    assert_eq!(list_pods_with(&s, &token).await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bound_tokens_stop_working_with_their_pod() {
    let s = TestServer::start().await;
    ok(s.kubectl(&["create", "serviceaccount", "robot"]));
    bind_view(&s);
    ok(s.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: Pod\nmetadata: {name: holder}\nspec:\n  serviceAccountName: robot\n  containers: [{name: c, image: skiff.test/toolbox:1.0}]\n",
    ));
    let uid = ok(s.kubectl(&["get", "pod", "holder", "-o", "jsonpath={.metadata.uid}"]));
    let token = create_token(
        &s,
        &[
            "robot",
            "--bound-object-kind",
            "Pod",
            "--bound-object-name",
            "holder",
            "--bound-object-uid",
            &uid,
        ],
    );
    let c = claims(&token);
    assert_eq!(c["kubernetes.io"]["pod"]["name"], "holder");
    assert_eq!(c["kubernetes.io"]["pod"]["uid"], uid.as_str());
    assert!(eventually(WAIT, || async { list_pods_with(&s, &token).await == 200 }).await);
    let st = token_review(&s, &token, None).await;
    assert_eq!(
        st["user"]["extra"]["authentication.kubernetes.io/pod-name"],
        json!(["holder"])
    );

    // A reference to another incarnation of the pod is a conflict.
    let err = fails(s.kubectl(&[
        "create",
        "token",
        "robot",
        "--bound-object-kind",
        "Pod",
        "--bound-object-name",
        "holder",
        "--bound-object-uid",
        "00000000-0000-0000-0000-000000000000",
    ]));
    assert!(err.contains("does not match the UID in record"), "{err}");

    ok(s.kubectl(&["delete", "pod", "holder", "--grace-period=0", "--force"]));
    assert!(
        eventually(WAIT, || async { list_pods_with(&s, &token).await == 401 }).await,
        "a deleted pod's token still authenticates"
    );
    let st = token_review(&s, &token, None).await;
    assert!(
        st["error"].as_str().unwrap_or_default().contains("holder"),
        "{st}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn issuer_discovery_is_public_and_its_keys_verify_tokens() {
    let s = TestServer::start().await;
    let anon = s.anonymous_client().await;
    let (code, headers, doc) = raw(
        &anon,
        "GET",
        "/.well-known/openid-configuration",
        "",
        vec![],
    )
    .await;
    assert_eq!(code, 200, "{doc}");
    assert_eq!(
        doc["issuer"],
        "https://kubernetes.default.svc.cluster.local"
    );
    assert_eq!(
        doc["jwks_uri"],
        "https://kubernetes.default.svc.cluster.local/openid/v1/jwks"
    );
    assert!(headers["cache-control"]
        .to_str()
        .unwrap()
        .contains("max-age"));
    let (code, headers, jwks) = raw(&anon, "GET", "/openid/v1/jwks", "", vec![]).await;
    assert_eq!(code, 200, "{jwks}");
    assert_eq!(headers["content-type"], "application/jwk-set+json");
    // Credentials are still needed everywhere else; bad ones are refused.
    assert_eq!(
        raw(&anon, "GET", "/api/v1/namespaces", "", vec![]).await.0,
        401
    );
    let bad = s.token_client("nonsense").await;
    assert_eq!(raw(&bad, "GET", "/openid/v1/jwks", "", vec![]).await.0, 401);

    // Verify a token's ES256 signature from the published key alone.
    ok(s.kubectl(&["create", "serviceaccount", "robot"]));
    let token = create_token(&s, &["robot"]);
    let header: Value = serde_json::from_slice(
        &URL_SAFE_NO_PAD
            .decode(token.split('.').next().unwrap())
            .unwrap(),
    )
    .unwrap();
    assert_eq!(header["alg"], "ES256");
    let key = jwks["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["kid"] == header["kid"])
        .expect("the token's kid is published");
    let mut point = vec![4u8];
    point.extend(URL_SAFE_NO_PAD.decode(key["x"].as_str().unwrap()).unwrap());
    point.extend(URL_SAFE_NO_PAD.decode(key["y"].as_str().unwrap()).unwrap());
    let (signed, sig) = token.rsplit_once('.').unwrap();
    let public =
        ring::signature::UnparsedPublicKey::new(&ring::signature::ECDSA_P256_SHA256_FIXED, &point);
    public
        .verify(signed.as_bytes(), &URL_SAFE_NO_PAD.decode(sig).unwrap())
        .expect("the JWKS key verifies the token");
    let mut tampered = signed.to_string();
    tampered.push('x');
    assert!(public
        .verify(tampered.as_bytes(), &URL_SAFE_NO_PAD.decode(sig).unwrap())
        .is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn legacy_token_secrets_are_filled_and_authenticate() {
    let s = TestServer::start().await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let controllers = skiff_controllers::Config {
        controllers: vec!["serviceaccount-token".into()],
        root_ca_pem: Some(
            Pki::load_or_create(&s.cfg.data_dir)
                .unwrap()
                .ca_pem()
                .to_string(),
        ),
        token_signer: Some(std::sync::Arc::new(
            Tokens::load(&s.cfg.service_accounts).unwrap(),
        )),
        ..skiff_controllers::Config::default()
    };
    let manager = tokio::spawn(skiff_controllers::run(
        s.client().await,
        controllers,
        async {
            let _ = stopped.await;
        },
    ));
    ok(s.kubectl(&["create", "serviceaccount", "robot"]));
    bind_view(&s);
    ok(s.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: robot-token\n  annotations: {kubernetes.io/service-account.name: robot}\ntype: kubernetes.io/service-account-token\n",
    ));
    let read = || {
        let out = s.kubectl(&[
            "get",
            "secret",
            "robot-token",
            "-o",
            "jsonpath={.data.token}",
        ]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert!(
        eventually(WAIT, || async { !read().is_empty() }).await,
        "the token controller did not fill the secret"
    );
    let token = read();
    let token = String::from_utf8(STANDARD.decode(&token).unwrap()).unwrap();
    assert_eq!(claims(&token)["iss"], "kubernetes/serviceaccount");
    let ca = ok(s.kubectl(&[
        "get",
        "secret",
        "robot-token",
        "-o",
        "jsonpath={.data.ca\\.crt}",
    ]));
    assert!(String::from_utf8(STANDARD.decode(ca.trim()).unwrap())
        .unwrap()
        .contains("BEGIN CERTIFICATE"));
    assert!(eventually(WAIT, || async { list_pods_with(&s, &token).await == 200 }).await);

    // The token lives as long as its secret.
    ok(s.kubectl(&["delete", "secret", "robot-token"]));
    assert!(eventually(WAIT, || async { list_pods_with(&s, &token).await == 401 }).await);

    // Such a secret must name its account.
    let err = fails(s.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: Secret\nmetadata: {name: nameless}\ntype: kubernetes.io/service-account-token\n",
    ));
    assert!(
        err.contains("metadata.annotations[kubernetes.io/service-account.name]: Required value"),
        "{err}"
    );
    let _ = stop.send(());
    manager.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn token_requests_refuse_bad_input() {
    let s = TestServer::start().await;
    ok(s.kubectl(&["create", "serviceaccount", "robot"]));
    let admin = s.client().await;
    let post = |body: Vec<u8>, sa: &'static str| {
        let admin = admin.clone();
        async move {
            raw(
                &admin,
                "POST",
                &format!("/api/v1/namespaces/default/serviceaccounts/{sa}/token"),
                "application/json",
                body,
            )
            .await
        }
    };
    let (code, _, v) = post(br#"{"spec": {"expirationSeconds": 10}}"#.to_vec(), "robot").await;
    assert_eq!(code, 422, "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("may not specify a duration less than 10 minutes"),
        "{v}"
    );
    let (code, _, v) = post(
        br#"{"spec": {"expirationSeconds": 99999999999999}}"#.to_vec(),
        "robot",
    )
    .await;
    assert_eq!(code, 422, "{v}");
    let (code, _, v) = post(b"{not json".to_vec(), "robot").await;
    assert_eq!(code, 400, "{v}");
    let (code, _, v) = post(
        br#"{"spec": {"boundObjectRef": {"kind": "Deployment", "apiVersion": "apps/v1", "name": "d"}}}"#.to_vec(),
        "robot",
    )
    .await;
    assert_eq!(code, 400, "{v}");
    let (code, _, v) = post(
        br#"{"spec": {"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "nowhere"}}}"#
            .to_vec(),
        "robot",
    )
    .await;
    assert_eq!(code, 404, "{v}");
    let (code, _, v) = post(b"{}".to_vec(), "ghost").await;
    assert_eq!(code, 404, "{v}");
    // Dry run: validated, nothing signed.
    let (code, _, v) = raw(
        &admin,
        "POST",
        "/api/v1/namespaces/default/serviceaccounts/robot/token?dryRun=All",
        "application/json",
        b"{}".to_vec(),
    )
    .await;
    assert_eq!(code, 201, "{v}");
    assert!(v["status"]["token"].is_null(), "{v}");
    let (code, _, v) = post(b"{}".to_vec(), "robot").await;
    assert_eq!(code, 201, "{v}");
    assert_eq!(v["kind"], "TokenRequest");
    assert_eq!(v["spec"]["expirationSeconds"], 3600);
    assert!(v["status"]["expirationTimestamp"]
        .as_str()
        .unwrap()
        .ends_with('Z'));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nodes_get_tokens_only_for_their_own_pods() {
    let s = TestServer::start().await;
    ok(s.kubectl(&["create", "serviceaccount", "robot"]));
    for (pod, node) in [("mine", "n1"), ("theirs", "n2")] {
        ok(s.kubectl_stdin(
            &["apply", "-f", "-"],
            &format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: {pod}}}\nspec:\n  nodeName: {node}\n  serviceAccountName: robot\n  containers: [{{name: c, image: skiff.test/toolbox:1.0}}]\n"),
        ));
    }
    let uid = |pod: &str| ok(s.kubectl(&["get", "pod", pod, "-o", "jsonpath={.metadata.uid}"]));
    let node = s.client_for("system:node:n1", &["system:nodes"]).await;
    let request = |pod: &str, uid: &str| {
        let body = json!({"spec": {"expirationSeconds": 3607, "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": pod, "uid": uid}}});
        serde_json::to_vec(&body).unwrap()
    };
    let path = "/api/v1/namespaces/default/serviceaccounts/robot/token";
    let (code, _, v) = raw(
        &node,
        "POST",
        path,
        "application/json",
        request("mine", &uid("mine")),
    )
    .await;
    assert_eq!(code, 201, "{v}");
    let token = v["status"]["token"].as_str().unwrap().to_string();
    assert_eq!(claims(&token)["kubernetes.io"]["pod"]["name"], "mine");
    let (code, _, v) = raw(
        &node,
        "POST",
        path,
        "application/json",
        request("theirs", &uid("theirs")),
    )
    .await;
    assert_eq!(code, 403, "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("scheduled on a different node"),
        "{v}"
    );
    let (code, _, v) = raw(&node, "POST", path, "application/json", b"{}".to_vec()).await;
    assert_eq!(code, 403, "{v}");
}
