//! The `skiff-server` subcommands a user runs beside a running server.

use crate::api;

use std::process::Command;

use api::TestServer;

fn server_of(kubeconfig: &str) -> String {
    let kc: serde_json::Value = serde_saphyr::from_str(kubeconfig).expect("kubeconfig is YAML");
    kc["clusters"][0]["cluster"]["server"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// `skiff-server kubeconfig` points at the server that runs on the data
/// dir, whatever port it got (here a random one), not at 127.0.0.1:6443.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubeconfig_points_at_the_running_server() {
    let s = TestServer::start().await;
    let out = Command::new(env!("CARGO_BIN_EXE_skiff-server"))
        .arg("--data-dir")
        .arg(&s.cfg.data_dir)
        .args(["kubeconfig", "--user", "alice", "--group", "devs"])
        .output()
        .expect("run skiff-server kubeconfig");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let kc = String::from_utf8(out.stdout).unwrap();
    assert_eq!(server_of(&kc), s.url());
    let path = s.dir.path().join("alice.kubeconfig");
    std::fs::write(&path, &kc).unwrap();
    // It reaches the server and authenticates as alice (who may do nothing).
    let get = s.kubectl_as(&path, &["get", "namespaces"], None);
    let err = String::from_utf8_lossy(&get.stderr);
    assert!(
        err.contains("User \"alice\" cannot list resource \"namespaces\""),
        "kubectl with the printed kubeconfig: {err}"
    );
}
