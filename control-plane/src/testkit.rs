//! Test fixture (feature `testkit`): an in-process skiff-server on
//! 127.0.0.1 (free port), with a temporary data dir, SQLite (or a given
//! store), and helpers to drive it with the real kubectl binary and with
//! kube-rs. Used by this crate's tests and by the scheduler's and the
//! controllers'.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::{Config, Settings};
use crate::pki::Pki;
use crate::server::{self, ServerHandle};
use crate::store::{SqliteStore, Store, SQLITE_FILE};
use http_body_util::BodyExt;
use serde_json::Value;

/// Token in the fixture's token file for user `token-user` (no groups).
/// Where the versioned kubectls (`kubectl.1.27` .. `kubectl.1.33`) are.
pub const KUBECTL_DIR: &str = "/usr/lib/google-cloud-sdk/bin";

pub const USER_TOKEN: &str = "t0k3n-user";

/// A running test server.
pub struct TestServer {
    pub dir: tempfile::TempDir,
    pub handle: Option<ServerHandle>,
    pub cfg: Config,
    /// When set, the server runs on this store instead of SQLite in `dir`.
    external_store: Option<Arc<dyn Store>>,
    /// The controllers pods' admission depends on (`serviceaccount`,
    /// `root-ca-cert-publisher`), as skiff-server runs them.
    controllers: Option<tokio::task::JoinHandle<()>>,
}

fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

impl TestServer {
    /// A server on SQLite in a fresh temp dir.
    pub async fn start() -> TestServer {
        Self::start_with_settings(None, Settings::default()).await
    }

    /// A server on `store` (etcd tests).
    pub async fn start_with_store(store: Arc<dyn Store>) -> TestServer {
        Self::start_with_settings(Some(store), Settings::default()).await
    }

    /// A server on `store` (or SQLite in the temp dir) with `settings`
    /// over the fixture's own (for example a short compaction interval).
    pub async fn start_with_settings(
        external_store: Option<Arc<dyn Store>>,
        settings: Settings,
    ) -> TestServer {
        install_crypto();
        let dir = tempfile::tempdir().expect("temp dir");
        let tokens = dir.path().join("tokens.csv");
        std::fs::write(&tokens, format!("{USER_TOKEN},token-user,1001\n")).expect("token file");
        let flags = settings.or(Settings {
            data_dir: Some(dir.path().join("data")),
            bind_address: Some("127.0.0.1".into()),
            secure_port: Some(0),
            // Tests use the RFC 2544 benchmarking range (see DESIGN.md).
            service_cluster_ip_range: Some("198.19.0.0/16".into()),
            cluster_cidr: Some("198.18.0.0/16".into()),
            token_auth_file: Some(tokens),
            // Tests that want them ask.
            etcd_disable_snapshots: Some(true),
            ..Default::default()
        });
        let cfg = Config::resolve(flags, None).expect("config");
        let mut s = TestServer {
            dir,
            handle: None,
            cfg,
            external_store,
            controllers: None,
        };
        s.boot().await;
        s
    }

    async fn boot(&mut self) {
        let store: Arc<dyn Store> = match &self.external_store {
            Some(s) => s.clone(),
            None => {
                std::fs::create_dir_all(&self.cfg.data_dir).expect("data dir");
                Arc::new(
                    SqliteStore::open(self.cfg.data_dir.join(SQLITE_FILE))
                        .await
                        .expect("open sqlite"),
                )
            }
        };
        let h = server::start(&self.cfg, store)
            .await
            .expect("start skiff-server");
        // Restarts keep the port so kubeconfigs stay valid.
        self.cfg.secure_port = h.addr.port();
        self.handle = Some(h);
        self.start_account_controllers().await;
    }

    /// Run the ServiceAccount controllers (pods are refused without their
    /// namespace's `default` account) and wait for `default/default`.
    async fn start_account_controllers(&mut self) {
        let client = self.client().await;
        let pki = Pki::load_or_create(&self.cfg.data_dir).expect("pki");
        let config = skiff_controllers::Config {
            controllers: vec!["serviceaccount".into(), "root-ca-cert-publisher".into()],
            root_ca_pem: Some(pki.ca_pem().to_string()),
            ..skiff_controllers::Config::default()
        };
        let c = client.clone();
        self.controllers = Some(tokio::spawn(async move {
            skiff_controllers::run(c, config, std::future::pending()).await;
        }));
        let accounts: kube::Api<k8s_openapi::api::core::v1::ServiceAccount> =
            kube::Api::namespaced(client, "default");
        let deadline = Instant::now() + Duration::from_secs(30);
        while accounts.get_opt("default").await.ok().flatten().is_none()
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stop (draining) and start again on the same port and data.
    pub async fn restart(&mut self) {
        self.stop().await;
        self.boot().await;
    }

    pub async fn stop(&mut self) {
        if let Some(c) = self.controllers.take() {
            c.abort();
        }
        if let Some(h) = self.handle.take() {
            h.shutdown().await;
        }
    }

    pub fn handle(&self) -> &ServerHandle {
        self.handle.as_ref().expect("server running")
    }

    pub fn url(&self) -> String {
        self.handle().url.clone()
    }

    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.handle().admin_kubeconfig.clone()
    }

    /// Write a kubeconfig for `user` in `groups` (client certificate).
    pub fn kubeconfig_for(&self, user: &str, groups: &[&str]) -> PathBuf {
        let pki = Pki::load_or_create(&self.cfg.data_dir).expect("pki");
        let groups: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
        let text = pki
            .kubeconfig(&self.url(), user, &groups)
            .expect("kubeconfig");
        let path = self
            .dir
            .path()
            .join(format!("{}.kubeconfig", user.replace(':', "_")));
        std::fs::write(&path, text).expect("write kubeconfig");
        path
    }

    /// Run kubectl as admin.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_as(&self.admin_kubeconfig(), args, None)
    }

    /// Run kubectl as admin with `stdin`.
    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> Output {
        self.kubectl_as(&self.admin_kubeconfig(), args, Some(stdin))
    }

    /// Run kubectl with `kubeconfig`, its discovery cache inside the test dir.
    pub fn kubectl_as(&self, kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Output {
        let kubectl = std::env::var("KUBECTL").unwrap_or_else(|_| "/usr/bin/kubectl".into());
        self.kubectl_binary(&kubectl, kubeconfig, args, stdin)
    }

    /// [`TestServer::kubectl_as`] with the kubectl binary at `kubectl` (a
    /// versioned one, say).
    pub fn kubectl_binary(
        &self,
        kubectl: &str,
        kubeconfig: &Path,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Output {
        // Versions cache discovery differently: one cache each.
        let name = Path::new(kubectl).file_name().unwrap_or_default();
        let cache = self.dir.path().join("kube-cache").join(name);
        let mut cmd = Command::new(kubectl);
        cmd.env("KUBECONFIG", kubeconfig)
            .env("HOME", self.dir.path())
            .arg(format!("--cache-dir={}", cache.display()))
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("run kubectl");
        if let Some(input) = stdin {
            use std::io::Write;
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(input.as_bytes())
                .expect("write stdin");
        }
        child.wait_with_output().expect("kubectl output")
    }

    /// kube-rs client for a kubeconfig.
    pub async fn client_from(&self, kubeconfig: &Path) -> kube::Client {
        install_crypto();
        let kc = kube::config::Kubeconfig::read_from(kubeconfig).expect("read kubeconfig");
        let cfg =
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .expect("kube config");
        kube::Client::try_from(cfg).expect("kube client")
    }

    /// kube-rs client as admin (system:masters).
    pub async fn client(&self) -> kube::Client {
        self.client_from(&self.admin_kubeconfig()).await
    }

    /// kube-rs client for `user` in `groups`.
    pub async fn client_for(&self, user: &str, groups: &[&str]) -> kube::Client {
        let p = self.kubeconfig_for(user, groups);
        self.client_from(&p).await
    }

    /// kube-rs client that trusts the CA but presents no credentials.
    pub async fn anonymous_client(&self) -> kube::Client {
        install_crypto();
        let pki = Pki::load_or_create(&self.cfg.data_dir).expect("pki");
        let mut cfg = kube::Config::new(self.url().parse().expect("url"));
        cfg.root_cert = Some(vec![pki.ca_der()]);
        kube::Client::try_from(cfg).expect("kube client")
    }

    /// kube-rs client with a bearer token.
    pub async fn token_client(&self, token: &str) -> kube::Client {
        install_crypto();
        let pki = Pki::load_or_create(&self.cfg.data_dir).expect("pki");
        let mut cfg = kube::Config::new(self.url().parse().expect("url"));
        cfg.root_cert = Some(vec![pki.ca_der()]);
        cfg.auth_info.token = Some(token.to_string().into());
        kube::Client::try_from(cfg).expect("kube client")
    }
}

/// Send a raw request; returns the status code, headers and JSON (or
/// `Value::String` of the text) body.
pub async fn raw(
    client: &kube::Client,
    method: &str,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
) -> (u16, http::HeaderMap, Value) {
    let request = || {
        http::Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", content_type)
            .body(kube::client::Body::from(body.clone()))
            .expect("request")
    };
    // A GET whose connection broke before an answer is sent again, as
    // client-go does for a reset connection; anything else fails the test.
    let resp = match client.send(request()).await {
        Err(e) if method == "GET" && matches!(e, kube::Error::Service(_)) => {
            eprintln!("retrying GET {path} after a transport error: {e}");
            client.send(request()).await.expect("send")
        }
        r => r.expect("send"),
    };
    let code = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    let v = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
    (code, headers, v)
}

/// kubectl stdout, failing the test with stderr when kubectl failed.
pub fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "kubectl failed: {}\nstdout: {}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The words of the first line of kubectl's table output: its column
/// headers (`CREATED AT` is two).
pub fn header(table: &str) -> Vec<&str> {
    table
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect()
}

/// kubectl stderr, failing the test when kubectl succeeded.
pub fn fails(out: Output) -> String {
    assert!(
        !out.status.success(),
        "kubectl unexpectedly succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Retry `f` until it returns true or `within` passes.
pub async fn eventually<F, Fut>(within: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if f().await {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
