//! The audit log of the real `skiff-server` binary (`--audit-policy-file`,
//! `--audit-log-path`, `--audit-log-maxsize|maxbackup|maxage`), driven by
//! kubectl and kube-rs: which requests are logged at which level, the
//! fields of the events, the `Audit-Id` header, Secrets kept out of the
//! log by the recommended policy, rotation, and policies refused at start.
//!
//! Each test starts its own server process (no scheduler or controllers,
//! so the log holds only the test's requests) in a temporary directory;
//! dropping the fixture kills the process and removes the directory.

use crate::api;

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use http_body_util::BodyExt;
use serde_json::{json, Value};

use api::ok;

/// Long enough for a loaded machine; tests wait for facts, never for time.
const PATIENCE: Duration = Duration::from_secs(60);

/// A skiff-server process and its directory.
struct Server {
    child: Child,
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn binary() -> Command {
    Command::new(env!("CARGO_BIN_EXE_skiff-server"))
}

/// Flags every test server gets: loopback, a free port, test ranges, no
/// components (their requests would be logged too).
fn base_args(dir: &Path) -> Vec<String> {
    let tokens = dir.join("tokens.csv");
    std::fs::write(&tokens, "t0k3n-user,token-user,1001\n").expect("token file");
    [
        "--data-dir",
        &dir.join("data").display().to_string(),
        "--bind-address",
        "127.0.0.1",
        "--secure-port",
        "0",
        "--service-cluster-ip-range",
        "198.19.0.0/16",
        "--cluster-cidr",
        "198.18.0.0/16",
        "--token-auth-file",
        &tokens.display().to_string(),
        "--disable-scheduler",
        "--disable-controller-manager",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

impl Server {
    /// Start the binary with `extra` flags (paths may use `{dir}`) and
    /// wait until it serves.
    async fn start(dir: tempfile::TempDir, extra: &[&str], stdout: Stdio) -> Server {
        let d = dir.path().display().to_string();
        let extra: Vec<String> = extra.iter().map(|a| a.replace("{dir}", &d)).collect();
        let stderr = std::fs::File::create(dir.path().join("server.stderr")).expect("stderr");
        let child = binary()
            .args(base_args(dir.path()))
            .args(&extra)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .expect("start skiff-server");
        let kubeconfig = dir.path().join("data").join("admin.kubeconfig");
        let mut s = Server {
            child,
            dir,
            kubeconfig,
        };
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Ok(Some(status)) = s.child.try_wait() {
                panic!("skiff-server exited ({status}): {}", s.stderr());
            }
            if s.kubeconfig.exists() {
                let c = s.client().await;
                if let Ok(r) = c
                    .request_text(http::Request::get("/readyz").body(vec![]).unwrap())
                    .await
                {
                    if r.trim() == "ok" {
                        return s;
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "skiff-server did not serve: {}",
                s.stderr()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.stderr")).unwrap_or_default()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A client from `kubeconfig`, without its credentials when `bare`
    /// (then with `token`, if any).
    async fn client_from(
        &self,
        kubeconfig: &Path,
        bare: bool,
        token: Option<&str>,
    ) -> kube::Client {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let kc = kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
        let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .expect("kube config");
        if bare {
            cfg.auth_info = Default::default();
            cfg.auth_info.token = token.map(|t| t.to_string().into());
        }
        kube::Client::try_from(cfg).expect("kube client")
    }

    /// kube-rs as admin (system:masters).
    async fn client(&self) -> kube::Client {
        self.client_from(&self.kubeconfig, false, None).await
    }

    /// kube-rs as `user` in system:masters, from `skiff-server kubeconfig`.
    async fn client_for(&self, user: &str) -> kube::Client {
        let out = binary()
            .arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .args(["kubeconfig", "--user", user, "--group", "system:masters"])
            .output()
            .expect("skiff-server kubeconfig");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let p = self.path(&format!("{user}.kubeconfig"));
        std::fs::write(&p, &out.stdout).expect("write kubeconfig");
        self.client_from(&p, false, None).await
    }

    /// kube-rs trusting the CA, presenting no credentials.
    async fn anonymous(&self) -> kube::Client {
        self.client_from(&self.kubeconfig, true, None).await
    }

    /// kube-rs with a bearer token of the token file.
    async fn token_client(&self, token: &str) -> kube::Client {
        self.client_from(&self.kubeconfig, true, Some(token)).await
    }

    fn kubectl(&self, args: &[&str]) -> std::process::Output {
        let kubectl = std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".into());
        Command::new(kubectl)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HOME", self.dir.path())
            .arg(format!("--cache-dir={}", self.path("kube-cache").display()))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run kubectl")
    }
}

/// One request with our own headers; (code, Audit-Id header, body).
async fn send(
    c: &kube::Client,
    method: &str,
    path: &str,
    body: Option<Value>,
    headers: &[(&str, &str)],
) -> (u16, String, Value) {
    let mut b = http::Request::builder().method(method).uri(path);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    if body.is_some() {
        b = b.header("content-type", "application/json");
    }
    let bytes = body.map(|v| v.to_string().into_bytes()).unwrap_or_default();
    let resp = c
        .send(b.body(kube::client::Body::from(bytes)).expect("request"))
        .await
        .expect("send");
    let code = resp.status().as_u16();
    let id = resp
        .headers()
        .get("audit-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    let v = serde_json::from_slice(&body).unwrap_or(Value::Null);
    (code, id, v)
}

/// The complete lines of `log` (a line being written is left for later),
/// each of which must be a JSON event.
fn events(log: &Path) -> Vec<Value> {
    let bytes = std::fs::read(log).unwrap_or_default();
    let complete = match bytes.iter().rposition(|b| *b == b'\n') {
        Some(end) => &bytes[..=end],
        None => return Vec::new(),
    };
    complete
        .lines()
        .map(|l| {
            let l = l.expect("utf-8 line");
            serde_json::from_str(&l).unwrap_or_else(|e| panic!("not a JSON event ({e}): {l}"))
        })
        .collect()
}

/// Wait until `log` holds an event with `id` at `stage`.
async fn event(log: &Path, id: &str, stage: &str) -> Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(e) = events(log)
            .into_iter()
            .find(|e| e["auditID"] == id && e["stage"] == stage)
        {
            return e;
        }
        assert!(
            Instant::now() < deadline,
            "no {stage} event for {id} in {}",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn write_policy(dir: &Path, text: &str) -> PathBuf {
    let p = dir.join("policy.yaml");
    std::fs::write(&p, text).expect("write policy");
    p
}

/// RFC 3339 UTC with microseconds, as `metav1.MicroTime`.
fn assert_micro_time(v: &Value) {
    let s = v.as_str().unwrap_or_else(|| panic!("not a time: {v}"));
    assert!(s.parse::<jiff::Timestamp>().is_ok(), "{s}");
    let frac = s.rsplit('.').next().unwrap_or_default();
    assert_eq!(frac.len(), 7, "six fractional digits and Z: {s}");
}

const POLICY: &str = r#"
apiVersion: audit.k8s.io/v1
kind: Policy
rules:
  - level: None
    users: ["quiet-user"]
  - level: None
    nonResourceURLs: ["/readyz*", "/healthz*", "/livez*"]
  - level: RequestResponse
    resources:
    - group: ""
      resources: ["configmaps"]
  - level: Metadata
    resources:
    - group: ""
      resources: ["secrets"]
  - level: Metadata
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_logged_at_their_policy_level() {
    let dir = tempfile::tempdir().unwrap();
    write_policy(dir.path(), POLICY);
    let s = Server::start(
        dir,
        &[
            "--audit-policy-file",
            "{dir}/policy.yaml",
            "--audit-log-path",
            "{dir}/logs/audit.log",
        ],
        Stdio::null(),
    )
    .await;
    let log = s.path("logs/audit.log");
    let c = s.client().await;
    let ua = [("user-agent", "audit-test/1.0")];
    let cms = "/api/v1/namespaces/default/configmaps";

    // create: RequestReceived, then ResponseComplete with both objects.
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "cm1"}, "data": {"colour": "teal"}});
    let (code, id, _) = send(&c, "POST", cms, Some(cm), &ua).await;
    assert_eq!(code, 201);
    assert_eq!(id.len(), 36, "a UUID in Audit-Id: {id:?}");
    let received = event(&log, &id, "RequestReceived").await;
    assert_eq!(received["level"], "RequestResponse");
    assert!(received.get("responseStatus").is_none(), "{received}");
    let e = event(&log, &id, "ResponseComplete").await;
    assert_eq!(e["kind"], "Event");
    assert_eq!(e["apiVersion"], "audit.k8s.io/v1");
    assert_eq!(e["level"], "RequestResponse");
    assert_eq!(e["verb"], "create");
    assert_eq!(e["requestURI"], cms);
    assert_eq!(e["user"]["username"], "admin");
    assert!(
        e["user"]["groups"]
            .as_array()
            .unwrap()
            .contains(&json!("system:masters")),
        "{e}"
    );
    assert_eq!(e["sourceIPs"], json!(["127.0.0.1"]));
    assert_eq!(e["userAgent"], "audit-test/1.0");
    // The name of a create comes from its body; the core group is empty.
    assert_eq!(
        e["objectRef"],
        json!({"resource": "configmaps", "namespace": "default", "name": "cm1", "apiVersion": "v1"})
    );
    assert_eq!(e["responseStatus"], json!({"metadata": {}, "code": 201}));
    assert_eq!(e["requestObject"]["data"]["colour"], "teal");
    assert_eq!(e["responseObject"]["metadata"]["name"], "cm1");
    assert!(e["responseObject"]["metadata"]["uid"].is_string(), "{e}");
    assert_eq!(e["annotations"]["authorization.k8s.io/decision"], "allow");
    assert_micro_time(&e["requestReceivedTimestamp"]);
    assert_micro_time(&e["stageTimestamp"]);
    assert_eq!(
        e["requestReceivedTimestamp"],
        received["requestReceivedTimestamp"]
    );

    // get, list, and a failed get.
    let (code, id, _) = send(&c, "GET", &format!("{cms}/cm1"), None, &[]).await;
    assert_eq!(code, 200);
    let e = event(&log, &id, "ResponseComplete").await;
    assert_eq!(
        (e["verb"].as_str(), e["objectRef"]["name"].as_str()),
        (Some("get"), Some("cm1"))
    );
    assert_eq!(e["responseObject"]["data"]["colour"], "teal");
    assert!(e.get("requestObject").is_none(), "{e}");
    let (code, id, _) = send(&c, "GET", &format!("{cms}?limit=10"), None, &[]).await;
    assert_eq!(code, 200);
    let e = event(&log, &id, "ResponseComplete").await;
    assert_eq!(e["verb"], "list");
    assert_eq!(e["requestURI"], format!("{cms}?limit=10"));
    assert!(e["objectRef"].get("name").is_none(), "{e}");
    assert_eq!(e["responseObject"]["kind"], "ConfigMapList");
    let (code, id, _) = send(&c, "GET", &format!("{cms}/nope"), None, &[]).await;
    assert_eq!(code, 404);
    let e = event(&log, &id, "ResponseComplete").await;
    let st = &e["responseStatus"];
    assert_eq!(
        (st["code"].as_u64(), st["status"].as_str()),
        (Some(404), Some("Failure"))
    );
    assert_eq!(st["reason"], "NotFound");
    assert!(st["message"].as_str().unwrap().contains("nope"), "{e}");

    // The client's own Audit-Id is kept, as upstream.
    let (_, id, _) = send(
        &c,
        "GET",
        &format!("{cms}/cm1"),
        None,
        &[("audit-id", "my-own-id")],
    )
    .await;
    assert_eq!(id, "my-own-id");
    event(&log, "my-own-id", "ResponseComplete").await;

    // Everything else at Metadata: no bodies.
    let (code, id, _) = send(&c, "GET", "/api/v1/namespaces/default/pods", None, &[]).await;
    assert_eq!(code, 200);
    let e = event(&log, &id, "ResponseComplete").await;
    assert_eq!(
        (e["level"].as_str(), e["verb"].as_str()),
        (Some("Metadata"), Some("list"))
    );
    assert!(
        e.get("responseObject").is_none() && e.get("requestObject").is_none(),
        "{e}"
    );
    let (_, id, _) = send(
        &c,
        "GET",
        "/apis/apps/v1/namespaces/default/deployments",
        None,
        &[],
    )
    .await;
    let e = event(&log, &id, "ResponseComplete").await;
    assert_eq!(e["objectRef"]["apiGroup"], "apps");
    let (_, id, _) = send(&c, "GET", "/version", None, &[]).await;
    let e = event(&log, &id, "ResponseComplete").await;
    assert_eq!(
        (e["verb"].as_str(), e["requestURI"].as_str()),
        (Some("get"), Some("/version"))
    );
    assert!(e.get("objectRef").is_none(), "{e}");

    // A protobuf create (kubectl's generators) is named from its body.
    ok(s.kubectl(&["create", "configmap", "pb-cm", "--from-literal=shape=round"]));
    let pb = wait_for(&log, |e| {
        e["verb"] == "create"
            && e["objectRef"]["name"] == "pb-cm"
            && e["stage"] == "ResponseComplete"
    })
    .await;
    assert_eq!(pb["requestObject"]["data"]["shape"], "round", "{pb}");

    // A watch: ResponseStarted when it begins, ResponseComplete when it ends.
    let (code, id, _) = send(
        &c,
        "GET",
        &format!("{cms}?watch=true&timeoutSeconds=1"),
        None,
        &[],
    )
    .await;
    assert_eq!(code, 200);
    let started = event(&log, &id, "ResponseStarted").await;
    assert_eq!(
        (
            started["verb"].as_str(),
            started["responseStatus"]["code"].as_u64()
        ),
        (Some("watch"), Some(200))
    );
    event(&log, &id, "ResponseComplete").await;

    // delete.
    let (code, id, _) = send(&c, "DELETE", &format!("{cms}/cm1"), None, &[]).await;
    assert_eq!(code, 200);
    let e = event(&log, &id, "ResponseComplete").await;
    assert_eq!(
        (e["verb"].as_str(), e["objectRef"]["name"].as_str()),
        (Some("delete"), Some("cm1"))
    );

    // Unauthenticated requests are audited as system:anonymous.
    let anon = s.anonymous().await;
    let (code, id, _) = send(&anon, "GET", "/api/v1/namespaces", None, &[]).await;
    assert_eq!(code, 401);
    let e = event(&log, &id, "ResponseComplete").await;
    assert_eq!(
        e["user"],
        json!({"username": "system:anonymous", "groups": ["system:unauthenticated"]})
    );
    assert_eq!(e["responseStatus"]["code"], 401);

    // A forbidden request carries the decision and its reason.
    let token = s.token_client("t0k3n-user").await;
    let (code, id, _) = send(
        &token,
        "GET",
        "/api/v1/namespaces/default/secrets",
        None,
        &[],
    )
    .await;
    assert_eq!(code, 403);
    let e = event(&log, &id, "ResponseComplete").await;
    assert_eq!(e["user"]["username"], "token-user");
    assert_eq!(e["annotations"]["authorization.k8s.io/decision"], "forbid");
    assert!(
        e["annotations"]["authorization.k8s.io/reason"]
            .as_str()
            .unwrap()
            .contains("forbidden"),
        "{e}"
    );

    // quiet-user is at None: nothing of theirs is logged. The marker after
    // it shows the writer got past where its events would be.
    let quiet = s.client_for("quiet-user").await;
    let (code, quiet_id, _) = send(
        &quiet,
        "POST",
        cms,
        Some(json!({"metadata": {"name": "hush"}, "data": {}})),
        &[],
    )
    .await;
    assert_eq!(code, 201);
    let (_, marker, _) = send(&c, "GET", &format!("{cms}/hush"), None, &[]).await;
    event(&log, &marker, "ResponseComplete").await;
    let all = events(&log);
    assert!(!all
        .iter()
        .any(|e| e["auditID"] == quiet_id.as_str() || e["user"]["username"] == "quiet-user"));
    // Nor health checks.
    assert!(!all.iter().any(|e| e["requestURI"] == "/readyz"));
    // Every event is one of upstream's stages, at a level the policy gives.
    for e in &all {
        assert!(
            ["RequestReceived", "ResponseStarted", "ResponseComplete"]
                .contains(&e["stage"].as_str().unwrap()),
            "{e}"
        );
        assert!(
            ["Metadata", "RequestResponse"].contains(&e["level"].as_str().unwrap()),
            "{e}"
        );
    }
}

/// Wait until an event matches `f`.
async fn wait_for(log: &Path, f: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(e) = events(log).into_iter().find(|e| f(e)) {
            return e;
        }
        assert!(
            Instant::now() < deadline,
            "no such event in {}",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Recognisable, and long enough that its base64 is too.
const VALUE: &str = "skiff-audit-secret-value-0123456789";

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// upstream's recommended policy keeps Secrets (and the like) at
/// Metadata: their data never reaches the log, whatever the verb or the
/// encoding, while the RequestResponse rule logs ConfigMaps whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_at_metadata_never_show_their_data() {
    let dir = tempfile::tempdir().unwrap();
    write_policy(dir.path(), POLICY);
    let s = Server::start(
        dir,
        &[
            "--audit-policy-file",
            "{dir}/policy.yaml",
            "--audit-log-path",
            "{dir}/audit.log",
        ],
        Stdio::null(),
    )
    .await;
    let log = s.path("audit.log");
    let b64 = base64::engine::general_purpose::STANDARD.encode(VALUE);
    // protobuf (kubectl's generator), JSON with data and stringData,
    // update, patch, get, list.
    ok(s.kubectl(&[
        "create",
        "secret",
        "generic",
        "s-pb",
        &format!("--from-literal=password={VALUE}"),
    ]));
    let c = s.client().await;
    let secrets = "/api/v1/namespaces/default/secrets";
    let (code, _, _) = send(&c, "POST", secrets, Some(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "s-json"}, "data": {"password": b64}, "stringData": {"other": VALUE}})), &[]).await;
    assert_eq!(code, 201);
    let (_, _, mut got) = send(&c, "GET", &format!("{secrets}/s-json"), None, &[]).await;
    got["data"]["more"] = json!(b64);
    let (code, _, _) = send(&c, "PUT", &format!("{secrets}/s-json"), Some(got), &[]).await;
    assert_eq!(code, 200);
    ok(s.kubectl(&[
        "patch",
        "secret",
        "s-pb",
        "-p",
        &format!("{{\"stringData\":{{\"x\":\"{VALUE}\"}}}}"),
    ]));
    ok(s.kubectl(&["get", "secrets", "-o", "yaml"]));
    ok(s.kubectl(&["get", "secret", "s-json", "-o", "json"]));
    // A ConfigMap holding the same value at RequestResponse, last.
    let (code, cm_id, _) = send(
        &c,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        Some(json!({
        "metadata": {"name": "cm"}, "data": {"v": "plain-configmap-value"}})),
        &[],
    )
    .await;
    assert_eq!(code, 201);
    let e = event(&log, &cm_id, "ResponseComplete").await;
    assert_eq!(e["requestObject"]["data"]["v"], "plain-configmap-value");
    assert_eq!(e["responseObject"]["data"]["v"], "plain-configmap-value");

    let all = events(&log);
    let created: Vec<_> = all
        .iter()
        .filter(|e| {
            e["verb"] == "create"
                && e["objectRef"]["resource"] == "secrets"
                && e["stage"] == "ResponseComplete"
        })
        .collect();
    let names: Vec<_> = created
        .iter()
        .map(|e| e["objectRef"]["name"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        names,
        ["s-pb", "s-json"],
        "both creates logged, named from their bodies"
    );
    for e in all
        .iter()
        .filter(|e| e["objectRef"]["resource"] == "secrets")
    {
        assert_eq!(e["level"], "Metadata", "{e}");
        assert!(
            e.get("requestObject").is_none() && e.get("responseObject").is_none(),
            "{e}"
        );
    }
    for verb in ["update", "patch", "get", "list"] {
        assert!(
            all.iter()
                .any(|e| e["verb"] == verb && e["objectRef"]["resource"] == "secrets"),
            "{verb}"
        );
    }
    let bytes = std::fs::read(&log).unwrap();
    assert!(!contains(&bytes, VALUE), "the log holds the secret's value");
    assert!(!contains(&bytes, &b64), "the log holds its base64");
}

/// Past --audit-log-maxsize the log rotates to lumberjack's backup names;
/// --audit-log-maxbackup of them are kept, and backups older than
/// --audit-log-maxage days go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_rotates_and_keeps_max_backups() {
    let dir = tempfile::tempdir().unwrap();
    write_policy(dir.path(), POLICY);
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let ancient = dir.path().join("logs/audit-2001-02-03T04-05-06.789.log");
    std::fs::write(&ancient, "{}\n").unwrap();
    let s = Server::start(
        dir,
        &[
            "--audit-policy-file",
            "{dir}/policy.yaml",
            "--audit-log-path",
            "{dir}/logs/audit.log",
            "--audit-log-maxsize",
            "1",
            "--audit-log-maxbackup",
            "2",
            "--audit-log-maxage",
            "30",
        ],
        Stdio::null(),
    )
    .await;
    assert!(!ancient.exists(), "a backup older than maxage is removed");
    let log = s.path("logs/audit.log");
    let c = s.client().await;
    // Each create logs ~400 KiB (request and response): a file holds two.
    let big = "x".repeat(200 * 1024);
    for i in 0..12 {
        let (code, _, _) = send(
            &c,
            "POST",
            "/api/v1/namespaces/default/configmaps",
            Some(json!({"metadata": {"name": format!("big-{i}")}, "data": {"k": big}})),
            &[],
        )
        .await;
        assert_eq!(code, 201);
    }
    // The last event written is the marker's: every rotation is done. The
    // list (2.4 MB) is too large to hold for the log: left out, and said.
    let (code, marker, _) = send(
        &c,
        "GET",
        "/api/v1/namespaces/default/configmaps",
        None,
        &[],
    )
    .await;
    assert_eq!(code, 200);
    let e = event(&log, &marker, "ResponseComplete").await;
    assert_eq!(e["annotations"]["audit.k8s.io/truncated"], "true", "{e}");
    assert!(e.get("responseObject").is_none());

    let mut backups: Vec<PathBuf> = std::fs::read_dir(s.path("logs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p != &log)
        .collect();
    backups.sort();
    assert_eq!(backups.len(), 2, "maxbackup 2: {backups:?}");
    for b in &backups {
        let name = b.file_name().unwrap().to_str().unwrap();
        let stamp = name
            .strip_prefix("audit-")
            .and_then(|n| n.strip_suffix(".log"))
            .unwrap_or_else(|| panic!("lumberjack's name: {name}"));
        let (date, time) = stamp.split_once('T').unwrap();
        let rfc3339 = format!("{date}T{}Z", time.replacen('-', ":", 2));
        assert!(rfc3339.parse::<jiff::Timestamp>().is_ok(), "{name}");
        assert!(std::fs::metadata(b).unwrap().len() <= 1024 * 1024, "{name}");
        assert!(!events(b).is_empty(), "{name}");
    }
    // The newest creates are in the backups and the current file; the
    // oldest went with the removed backups.
    let current = events(&log);
    assert!(std::fs::metadata(&log).unwrap().len() <= 1024 * 1024);
    let kept: Vec<_> = backups
        .iter()
        .flat_map(|b| events(b))
        .chain(current)
        .collect();
    assert!(kept.iter().any(|e| e["objectRef"]["name"] == "big-11"));
    assert!(!kept
        .iter()
        .any(|e| e["objectRef"]["name"] == "big-0" && e["verb"] == "create"));
}

/// Run the binary to its exit (it must not start serving).
fn refused(args: &[String]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut child = binary()
        .args(base_args(dir.path()))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start skiff-server");
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            let mut err = String::new();
            use std::io::Read;
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            assert!(!status.success(), "skiff-server accepted {args:?}");
            return err;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("skiff-server kept running with {args:?}");
        }
        #[allow(clippy::disallowed_methods)] // a synchronous helper, as clippy.toml allows
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_bad_policy_stops_the_server_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let head = "apiVersion: audit.k8s.io/v1\nkind: Policy\n";
    for (policy, names) in [
        (
            format!("{head}rules:\n- level: Verbose\n"),
            &["rules[0].level", "Verbose"][..],
        ),
        (
            format!("{head}rules:\n- level: None\n  usres: [a]\n"),
            &["usres"],
        ),
        (
            format!("{head}rules:\n- level: Metadata\n  omitStages: [Later]\n"),
            &["rules[0].omitStages[0]", "Later"],
        ),
        (
            format!("{head}rules:\n- level: None\n  nonResourceURLs: [healthz]\n"),
            &["nonResourceURLs[0]"],
        ),
        (
            "apiVersion: audit.k8s.io/v1beta1\nkind: Policy\nrules:\n- level: None\n".into(),
            &["apiVersion"],
        ),
    ] {
        let p = dir.path().join("policy.yaml");
        std::fs::write(&p, &policy).unwrap();
        let err = refused(&[
            "--audit-policy-file".into(),
            p.display().to_string(),
            "--audit-log-path".into(),
            dir.path().join("audit.log").display().to_string(),
        ]);
        assert!(err.contains("policy.yaml"), "names the file: {err}");
        for n in names {
            assert!(err.contains(n), "{policy}\nnames {n}: {err}");
        }
    }
    let err = refused(&[
        "--audit-policy-file".into(),
        dir.path().join("missing.yaml").display().to_string(),
        "--audit-log-path".into(),
        "-".into(),
    ]);
    assert!(err.contains("missing.yaml"), "{err}");
    let err = refused(&[
        "--audit-log-path".into(),
        dir.path().join("a.log").display().to_string(),
    ]);
    assert!(err.contains("audit-policy-file"), "{err}");
}

/// `--audit-log-path -` writes the events to stdout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dash_logs_to_stdout() {
    let dir = tempfile::tempdir().unwrap();
    write_policy(dir.path(), POLICY);
    let mut s = Server::start(
        dir,
        &[
            "--audit-policy-file",
            "{dir}/policy.yaml",
            "--audit-log-path",
            "-",
        ],
        Stdio::piped(),
    )
    .await;
    let stdout = s.child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    // Ends when the server (killed on drop) closes its stdout.
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let c = s.client().await;
    let (code, id, _) = send(
        &c,
        "GET",
        "/api/v1/namespaces/default/configmaps",
        None,
        &[],
    )
    .await;
    assert_eq!(code, 200);
    let found = tokio::task::spawn_blocking(move || {
        while let Ok(line) = rx.recv_timeout(PATIENCE) {
            let e: Value = serde_json::from_str(&line).expect("stdout holds only JSON events");
            if e["auditID"] == id.as_str() && e["stage"] == "ResponseComplete" {
                return Some(e);
            }
        }
        None
    })
    .await
    .unwrap();
    let e = found.expect("the event on stdout");
    assert_eq!(e["verb"], "list");
}

/// A ValidatingAdmissionPolicy bound with `Audit` records its failures
/// in the request's event, and its `auditAnnotations` under the policy's
/// name; `Warn` on the same binding warns the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_policies_annotate_the_event() {
    let dir = tempfile::tempdir().unwrap();
    write_policy(dir.path(), POLICY);
    std::fs::write(
        dir.path().join("vap.yaml"),
        r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: audited.test.skiff.io}
spec:
  matchConstraints:
    resourceRules:
    - {apiGroups: [''], apiVersions: [v1], operations: [CREATE], resources: [configmaps]}
  validations:
  - expression: "!has(object.data) || !('v' in object.data) || object.data.v != 'bad'"
    message: v must not be bad
  auditAnnotations:
  - key: checked
    valueExpression: "'value ' + object.metadata.name"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: audited-binding}
spec:
  policyName: audited.test.skiff.io
  validationActions: [Warn, Audit]
"#,
    )
    .unwrap();
    let s = Server::start(
        dir,
        &[
            "--audit-policy-file",
            "{dir}/policy.yaml",
            "--audit-log-path",
            "{dir}/audit.log",
        ],
        Stdio::null(),
    )
    .await;
    let vap = s.path("vap.yaml").display().to_string();
    ok(s.kubectl(&["apply", "-f", &vap]));
    let log = s.path("audit.log");
    // Creates until one is warned about (the policy is in force).
    let deadline = Instant::now() + PATIENCE;
    let mut n = 0;
    let name = loop {
        n += 1;
        let name = format!("bad-{n}");
        let out = s.kubectl(&["create", "configmap", &name, "--from-literal=v=bad"]);
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{stderr}");
        if stderr.contains("Warning: Validation failed for ValidatingAdmissionPolicy 'audited.test.skiff.io' with binding 'audited-binding': v must not be bad") {
            break name;
        }
        assert!(Instant::now() < deadline, "never warned: {stderr}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let e = wait_for(&log, |e| {
        e["objectRef"]["name"] == name.as_str()
            && e["verb"] == "create"
            && e["stage"] == "ResponseComplete"
    })
    .await;
    let failures: Value = serde_json::from_str(
        e["annotations"]["validation.policy.admission.k8s.io/validation_failure"]
            .as_str()
            .unwrap_or_else(|| panic!("no validation_failure annotation: {e}")),
    )
    .unwrap();
    assert_eq!(
        failures,
        json!([{"message": "v must not be bad", "policy": "audited.test.skiff.io",
            "binding": "audited-binding", "expressionIndex": 0, "validationActions": ["Warn", "Audit"]}])
    );
    assert_eq!(
        e["annotations"]["audited.test.skiff.io/checked"],
        format!("value {name}").as_str(),
        "{e}"
    );
}
