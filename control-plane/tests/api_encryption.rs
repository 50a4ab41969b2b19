//! Secrets encrypted at rest (`--encryption-provider-config`), through the
//! real API on SQLite and on a real etcd: the stored bytes (database, WAL,
//! etcd's files, snapshots) hold upstream's `k8s:enc:aescbc:v1:` prefix and
//! never the value; get, list and watch read it back; `secrets-encrypt
//! rotate`, a restart and `reencrypt` move every Secret to the new key.

use crate::api;
use crate::etcd_support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, Patch, PatchParams, WatchEvent, WatchParams};
use serde_json::json;

use api::{ok, TestServer};
use etcd_support::EtcdCluster;
use skiff_control_plane::config::{Config, Settings};
use skiff_control_plane::store::encryption::{admin, EncryptedStore, EncryptionConfiguration};
use skiff_control_plane::store::{EtcdStore, SqliteStore, Store, SQLITE_FILE};

/// Recognisable, and long enough that its base64 is too.
const VALUE: &str = "skiff-very-secret-value-0123456789";
const KEY1: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
const KEY1_PREFIX: &str = "k8s:enc:aescbc:v1:key1:";

fn write_config(dir: &Path) -> PathBuf {
    let p = dir.join("encryption.yaml");
    std::fs::write(
        &p,
        format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\n\
             resources:\n- resources: [secrets, configmaps]\n  providers:\n\
             \x20 - aescbc:\n      keys:\n      - {{name: key1, secret: {KEY1}}}\n\
             \x20 - identity: {{}}\n"
        ),
    )
    .unwrap();
    p
}

fn settings(config: &Path) -> Settings {
    Settings {
        encryption_provider_config: Some(config.to_path_buf()),
        ..Default::default()
    }
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// Every byte of every file under `dir` (the database and its WAL; etcd's
/// WAL and snapshots).
fn all_bytes(dir: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let p = entry.path();
        if p.is_dir() {
            out.extend(all_bytes(&p));
        } else if let Ok(b) = std::fs::read(&p) {
            out.extend(b);
        }
    }
    out
}

fn assert_no_plaintext(bytes: &[u8], what: &str) {
    assert!(!contains(bytes, VALUE), "{what} holds the value");
    assert!(!contains(bytes, &b64(VALUE)), "{what} holds its base64");
}

/// The current stored value of every Secret, read from the database file
/// beside the running server (newest row per key, not a delete).
fn sqlite_secret_values(s: &TestServer) -> Vec<Vec<u8>> {
    let conn = rusqlite::Connection::open_with_flags(
        s.cfg.data_dir.join(SQLITE_FILE),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let mut st = conn
        .prepare(
            "SELECT value FROM kv WHERE id IN (SELECT MAX(id) FROM kv \
             WHERE name LIKE '/registry/core/secrets/%' GROUP BY name) AND deleted = 0",
        )
        .unwrap();
    st.query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn skiff_server(s: &TestServer, config: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_skiff-server"))
        .arg("--data-dir")
        .arg(&s.cfg.data_dir)
        .arg("--encryption-provider-config")
        .arg(config)
        .arg("secrets-encrypt")
        .args(args)
        .output()
        .expect("run skiff-server secrets-encrypt")
}

fn cli_ok(out: std::process::Output) -> String {
    assert!(
        out.status.success(),
        "skiff-server failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn password(s: &Secret) -> String {
    let data = s.data.as_ref().expect("data");
    String::from_utf8(data["password"].0.clone()).unwrap()
}

/// Create through kubectl, then get, list and watch through kube-rs.
async fn create_and_read_back(s: &TestServer) {
    ok(s.kubectl(&[
        "create",
        "secret",
        "generic",
        "topsecret",
        &format!("--from-literal=password={VALUE}"),
    ]));
    ok(s.kubectl(&[
        "create",
        "configmap",
        "plain",
        &format!("--from-literal=note={VALUE}"),
    ]));
    let secrets: Api<Secret> = Api::namespaced(s.client().await, "default");
    let got = secrets.get("topsecret").await.unwrap();
    assert_eq!(password(&got), VALUE);
    let list = secrets.list(&ListParams::default()).await.unwrap();
    let listed = list
        .items
        .iter()
        .find(|x| x.metadata.name.as_deref() == Some("topsecret"))
        .expect("listed");
    assert_eq!(password(listed), VALUE);
    let out = ok(s.kubectl(&[
        "get",
        "secret",
        "topsecret",
        "-o",
        "jsonpath={.data.password}",
    ]));
    assert_eq!(out, b64(VALUE));

    // A watch from the created version: the next change arrives decrypted.
    let rv = got.metadata.resource_version.clone().unwrap();
    let wp = WatchParams::default().fields("metadata.name=topsecret");
    let mut stream = secrets.watch(&wp, &rv).await.unwrap().boxed();
    secrets
        .patch(
            "topsecret",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"seen": "yes"}}})),
        )
        .await
        .unwrap();
    let ev = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("a watch event within 10 s")
        .expect("stream open")
        .expect("event");
    match ev {
        WatchEvent::Modified(o) => assert_eq!(password(&o), VALUE),
        other => panic!("expected MODIFIED, got {other:?}"),
    }
    // A watch replayed from the log (resourceVersion before the patch).
    let mut replay = secrets.watch(&wp, &rv).await.unwrap().boxed();
    match tokio::time::timeout(Duration::from_secs(10), replay.next())
        .await
        .expect("a replayed event")
        .expect("stream open")
        .expect("event")
    {
        WatchEvent::Modified(o) => assert_eq!(password(&o), VALUE),
        other => panic!("expected MODIFIED, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_encrypted_in_sqlite_and_snapshots_and_rotate() {
    let keys = tempfile::tempdir().unwrap();
    let config = write_config(keys.path());
    let mut s = TestServer::start_with_settings(None, settings(&config)).await;
    create_and_read_back(&s).await;

    // Below the API: ciphertext only, in the database and its WAL.
    let values = sqlite_secret_values(&s);
    let ours: Vec<_> = values
        .iter()
        .filter(|v| v.starts_with(KEY1_PREFIX.as_bytes()))
        .collect();
    assert!(!ours.is_empty(), "a Secret under {KEY1_PREFIX}");
    assert!(
        values.iter().all(|v| v.starts_with(b"k8s:enc:")),
        "every Secret is encrypted (bootstrap ones included)"
    );
    assert_no_plaintext(&all_bytes(&s.cfg.data_dir), "the data dir");

    // A snapshot copies the stored bytes: still encrypted.
    let snap = s.dir.path().join("snap.db");
    s.handle().api.store().snapshot_save(&snap).await.unwrap();
    let snap_bytes = std::fs::read(&snap).unwrap();
    assert!(contains(&snap_bytes, KEY1_PREFIX));
    assert_no_plaintext(&snap_bytes, "the snapshot");

    // status: on, key1 writes, the Secrets are under it.
    let status = cli_ok(skiff_server(&s, &config, &["status"]));
    assert!(status.contains("Encryption Status: Enabled"), "{status}");
    assert!(
        status.contains("secrets: active key aescbc:key1"),
        "{status}"
    );
    assert!(status.contains("aescbc:key1: "), "{status}");
    assert!(!status.contains("identity (plaintext)"), "{status}");

    // rotate, restart on the new config, reencrypt with the server stopped.
    let rotated = cli_ok(skiff_server(&s, &config, &["rotate"]));
    assert!(rotated.contains("restart skiff-server"), "{rotated}");
    let cfg = EncryptionConfiguration::load(&config).unwrap();
    let keys1 = &cfg.resources[0].providers[0].aescbc.as_ref().unwrap().keys;
    assert_eq!(keys1.len(), 2);
    assert_eq!(keys1[1].name, "key1", "the old key stays, second");
    let new_prefix = format!("k8s:enc:aescbc:v1:{}:", keys1[0].name);
    s.restart().await;
    let refused = skiff_server(&s, &config, &["reencrypt"]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("stop it first"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    s.stop().await;
    let re = cli_ok(skiff_server(&s, &config, &["reencrypt"]));
    assert!(re.starts_with("re-encrypted "), "{re}");
    s.restart().await;

    let values = sqlite_secret_values(&s);
    assert!(
        values.iter().all(|v| v.starts_with(new_prefix.as_bytes())),
        "every Secret under the new key"
    );
    let status = cli_ok(skiff_server(&s, &config, &["status"]));
    assert!(!status.contains("aescbc:key1:"), "{status}");
    assert!(
        status.contains(&format!("secrets: active key aescbc:{}", keys1[0].name)),
        "{status}"
    );
    let secrets: Api<Secret> = Api::namespaced(s.client().await, "default");
    assert_eq!(password(&secrets.get("topsecret").await.unwrap()), VALUE);
    let list = secrets.list(&ListParams::default()).await.unwrap();
    assert!(list
        .items
        .iter()
        .any(|x| x.metadata.name.as_deref() == Some("topsecret") && password(x) == VALUE));
    let out = ok(s.kubectl(&["get", "configmap", "plain", "-o", "jsonpath={.data.note}"]));
    assert_eq!(out, VALUE);
}

/// A config the server cannot use stops it before it serves, naming the
/// field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_config_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.yaml");
    std::fs::write(
        &config,
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\n\
         resources:\n- resources: [secrets]\n  providers:\n  - aescbc:\n      keys:\n\
         \x20     - {name: k, secret: AAECAwQF}\n",
    )
    .unwrap();
    let cfg = Config::resolve(
        Settings {
            data_dir: Some(dir.path().join("data")),
            secure_port: Some(0),
            encryption_provider_config: Some(config.clone()),
            ..Default::default()
        },
        None,
    )
    .unwrap();
    std::fs::create_dir_all(&cfg.data_dir).unwrap();
    let store: Arc<dyn Store> = Arc::new(
        SqliteStore::open(cfg.data_dir.join(SQLITE_FILE))
            .await
            .unwrap(),
    );
    let e = match skiff_control_plane::server::start(&cfg, store).await {
        Ok(_) => panic!("started with a 6-byte aescbc key"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("resources[0].providers[0].aescbc.keys[0].secret") && e.contains("6 bytes"),
        "{e}"
    );
}

/// The same on a real etcd: etcd's files never hold the value, the raw
/// key holds the prefix, and reencrypt runs beside the running server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_encrypted_in_etcd() {
    let keys = tempfile::tempdir().unwrap();
    let config = write_config(keys.path());
    let etcd = EtcdCluster::start();
    let raw: Arc<dyn Store> = Arc::new(
        EtcdStore::connect(&etcd.endpoints())
            .await
            .expect("connect etcd"),
    );
    let mut s = TestServer::start_with_settings(Some(raw.clone()), settings(&config)).await;
    create_and_read_back(&s).await;
    let key = "/registry/core/secrets/default/topsecret";
    let stored = raw.get(key).await.unwrap().unwrap().value;
    assert!(stored.starts_with(KEY1_PREFIX.as_bytes()));
    for m in &etcd.members {
        assert_no_plaintext(&all_bytes(&m.data_dir), "etcd's data dir");
    }

    let mut cfg = EncryptionConfiguration::load(&config).unwrap();
    let added = cfg.rotate(jiff::Timestamp::now());
    cfg.save(&config, false).unwrap();
    s.restart().await;
    let t = cfg.transformers(&config).unwrap();
    let done = admin::reencrypt(&EncryptedStore::new(raw.clone(), t.clone()), &t, |_| None)
        .await
        .unwrap();
    assert!(done.rewritten >= 1, "{done:?}");
    let counts = admin::status(raw.as_ref(), Some(&t)).await.unwrap();
    let new_key = &added[0];
    assert_eq!(counts[0].resource, "secrets");
    assert_eq!(counts[0].by_key.keys().collect::<Vec<_>>(), vec![new_key]);
    let secrets: Api<Secret> = Api::namespaced(s.client().await, "default");
    assert_eq!(password(&secrets.get("topsecret").await.unwrap()), VALUE);
}
