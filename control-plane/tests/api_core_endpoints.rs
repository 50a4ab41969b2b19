//! The core endpoints clients expect beside the resources: component
//! statuses, the build in `/version`, each health check on its own.

use crate::api;

use api::{ok, raw, TestServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn componentstatuses_version_and_health_checks() {
    let s = TestServer::start().await;
    let api = &s.handle.as_ref().unwrap().api;
    // The fixture runs no components: report one up, one down.
    api.components.set("scheduler", Ok(()));
    api.components.set(
        "controller-manager",
        Err("not running here (--disable-controller-manager)".into()),
    );
    let out = s.kubectl(&["get", "componentstatuses"]);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let table = ok(out);
    assert!(
        stderr.contains("v1 ComponentStatus is deprecated in v1.19+"),
        "{stderr}"
    );
    let rows: Vec<Vec<&str>> = table
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows[0][..2], ["controller-manager", "Unhealthy"], "{table}");
    assert_eq!(rows[1][..3], ["scheduler", "Healthy", "ok"], "{table}");
    assert_eq!(rows[2][..3], ["etcd-0", "Healthy", "ok"], "{table}");
    let one = ok(s.kubectl(&[
        "get",
        "cs",
        "etcd-0",
        "-o",
        "jsonpath={.conditions[0].status}",
    ]));
    assert_eq!(one, "True");
    let c = s.client().await;
    let (code, _, body) = raw(
        &c,
        "DELETE",
        "/api/v1/componentstatuses/etcd-0",
        "application/json",
        vec![],
    )
    .await;
    assert_eq!(code, 405, "{body}");

    // /version names the commit the server was built from.
    let (code, _, v) = raw(&c, "GET", "/version", "application/json", vec![]).await;
    assert_eq!(code, 200);
    let commit = v["gitCommit"].as_str().unwrap();
    assert!(
        commit == "unknown"
            || (commit.len() == 40 && commit.bytes().all(|b| b.is_ascii_hexdigit())),
        "{v}"
    );
    assert_ne!(v["buildDate"], "2026-01-01T00:00:00Z", "{v}");

    // Every check /livez and /readyz list is reachable on its own.
    for endpoint in ["livez", "readyz", "healthz"] {
        let (code, _, verbose) = raw(
            &c,
            "GET",
            &format!("/{endpoint}?verbose"),
            "text/plain",
            vec![],
        )
        .await;
        assert_eq!(code, 200, "{verbose}");
        let checks: Vec<String> = verbose
            .as_str()
            .unwrap()
            .lines()
            .filter_map(|l| {
                l.strip_prefix("[+]")
                    .and_then(|l| l.strip_suffix(" ok"))
                    .map(String::from)
            })
            .collect();
        assert!(checks.contains(&"ping".to_string()), "{verbose}");
        for check in checks {
            let (code, _, body) = raw(
                &c,
                "GET",
                &format!("/{endpoint}/{check}"),
                "text/plain",
                vec![],
            )
            .await;
            assert_eq!(
                (code, body.as_str()),
                (200, Some("ok")),
                "/{endpoint}/{check}"
            );
        }
    }
    let (code, _, _) = raw(&c, "GET", "/livez/nope", "text/plain", vec![]).await;
    assert_eq!(code, 404);
}
