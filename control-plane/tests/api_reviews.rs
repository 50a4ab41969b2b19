//! Review APIs and ServiceAccount plumbing, in process with the real
//! kubectl: `kubectl auth whoami` (SelfSubjectReview), `kubectl auth
//! can-i --list` (SelfSubjectRulesReview), LocalSubjectAccessReview's
//! namespace rule, the `default` ServiceAccount and `kube-root-ca.crt`
//! controllers, ServiceAccount admission of pods, and the serving
//! certificate naming the `kubernetes` Service.

use crate::api;

use std::time::Duration;

use api::{eventually, fails, ok, TestServer, KUBECTL_DIR};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(20);

fn json(out: std::process::Output) -> Value {
    serde_json::from_str(&ok(out)).expect("kubectl printed JSON")
}

#[tokio::test(flavor = "multi_thread")]
async fn reviews_accounts_and_serving_names() {
    let s = TestServer::start().await;

    // whoami: the caller's name and groups.
    let alice = s.kubeconfig_for("alice", &["devs"]);
    let who = json(s.kubectl_as(&alice, &["auth", "whoami", "-o", "json"], None));
    assert_eq!(who["kind"], "SelfSubjectReview");
    assert_eq!(who["status"]["userInfo"]["username"], "alice");
    let groups = who["status"]["userInfo"]["groups"].to_string();
    assert!(
        groups.contains("devs") && groups.contains("system:authenticated"),
        "{groups}"
    );
    let table = ok(s.kubectl_as(&alice, &["auth", "whoami"], None));
    assert!(table.contains("alice"), "{table}");

    // can-i --list: what RBAC grants in the namespace.
    ok(s.kubectl(&[
        "create",
        "role",
        "reader",
        "-n",
        "default",
        "--verb=get,list",
        "--resource=configmaps",
    ]));
    ok(s.kubectl(&[
        "create",
        "rolebinding",
        "reader",
        "-n",
        "default",
        "--role=reader",
        "--user=alice",
    ]));
    let list = ok(s.kubectl_as(&alice, &["auth", "can-i", "--list", "-n", "default"], None));
    assert!(
        list.lines()
            .any(|l| l.starts_with("configmaps") && l.contains("[get list]")),
        "{list}"
    );
    let elsewhere = ok(s.kubectl_as(
        &alice,
        &["auth", "can-i", "--list", "-n", "kube-system"],
        None,
    ));
    assert!(
        !elsewhere.lines().any(|l| l.starts_with("configmaps")),
        "{elsewhere}"
    );

    // Every supported kubectl: `whoami` asks authentication.k8s.io/v1
    // from 1.28 on (1.27 asks v1alpha1/v1beta1, not served here).
    for minor in 27..=33 {
        let kubectl = format!("{KUBECTL_DIR}/kubectl.1.{minor}");
        let list = ok(s.kubectl_binary(
            &kubectl,
            &alice,
            &["auth", "can-i", "--list", "-n", "default"],
            None,
        ));
        assert!(list.contains("configmaps"), "kubectl 1.{minor}: {list}");
        let who = s.kubectl_binary(&kubectl, &alice, &["auth", "whoami"], None);
        if minor >= 28 {
            let who = ok(who);
            assert!(who.contains("alice"), "kubectl 1.{minor}: {who}");
        }
    }

    // LocalSubjectAccessReview: answered in its namespace only.
    let local = |ns: &str| {
        format!(
            "apiVersion: authorization.k8s.io/v1\nkind: LocalSubjectAccessReview\nmetadata: {{namespace: default}}\nspec:\n  user: alice\n  resourceAttributes: {{namespace: {ns}, verb: get, resource: configmaps}}\n"
        )
    };
    let answer = json(s.kubectl_stdin(&["create", "-f", "-", "-o", "json"], &local("default")));
    assert_eq!(answer["status"]["allowed"], true);
    let err = fails(s.kubectl_stdin(&["create", "-f", "-", "-o", "json"], &local("other")));
    assert!(
        err.contains("spec.resourceAttributes.namespace must match namespace: default"),
        "{err}"
    );

    // Controllers: every namespace gets `default` and the CA ConfigMap,
    // put back when deleted or changed.
    ok(s.kubectl(&["create", "namespace", "team"]));
    let has = |args: &'static [&'static str]| {
        let s = &s;
        move || async move { s.kubectl(args).status.success() }
    };
    assert!(
        eventually(
            WAIT,
            has(&["get", "serviceaccount", "default", "-n", "team"])
        )
        .await
    );
    assert!(
        eventually(
            WAIT,
            has(&["get", "configmap", "kube-root-ca.crt", "-n", "team"])
        )
        .await
    );
    let cm = json(s.kubectl(&[
        "get",
        "configmap",
        "kube-root-ca.crt",
        "-n",
        "team",
        "-o",
        "json",
    ]));
    let ca = cm["data"]["ca.crt"].as_str().unwrap().to_string();
    assert!(ca.contains("BEGIN CERTIFICATE"));
    assert!(cm["metadata"]["annotations"]["kubernetes.io/description"].is_string());
    ok(s.kubectl(&["delete", "serviceaccount", "default", "-n", "team"]));
    assert!(
        eventually(
            WAIT,
            has(&["get", "serviceaccount", "default", "-n", "team"])
        )
        .await
    );
    ok(s.kubectl(&[
        "patch",
        "configmap",
        "kube-root-ca.crt",
        "-n",
        "team",
        "-p",
        r#"{"data":{"ca.crt":"tampered"}}"#,
    ]));
    let restored = eventually(WAIT, || async {
        let out = s.kubectl(&[
            "get",
            "configmap",
            "kube-root-ca.crt",
            "-n",
            "team",
            "-o",
            "jsonpath={.data.ca\\.crt}",
        ]);
        String::from_utf8_lossy(&out.stdout) == ca
    })
    .await;
    assert!(restored, "the CA ConfigMap was not restored");

    // Admission: the default account, its token volume in every container.
    let pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: team}\nspec:\n  initContainers: [{name: i, image: busybox}]\n  containers: [{name: c, image: busybox}]\n";
    let p = json(s.kubectl_stdin(&["create", "-f", "-", "-o", "json"], pod));
    assert_eq!(p["spec"]["serviceAccountName"], "default");
    let vol = p["spec"]["volumes"][0]["name"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        vol.starts_with("kube-api-access-") && vol.len() == "kube-api-access-".len() + 5,
        "{vol}"
    );
    for c in ["initContainers", "containers"] {
        let m = &p["spec"][c][0]["volumeMounts"][0];
        assert_eq!(
            m["mountPath"],
            "/var/run/secrets/kubernetes.io/serviceaccount"
        );
        assert_eq!(m["readOnly"], true);
    }
    let missing = pod
        .replace("name: p,", "name: q,")
        .replace("spec:\n", "spec:\n  serviceAccountName: ghost\n");
    let err = fails(s.kubectl_stdin(&["create", "-f", "-"], &missing));
    assert!(
        err.contains(
            "error looking up service account team/ghost: serviceaccount \"ghost\" not found"
        ),
        "{err}"
    );
    let off = pod
        .replace("name: p,", "name: r,")
        .replace("spec:\n", "spec:\n  automountServiceAccountToken: false\n");
    let r = json(s.kubectl_stdin(&["create", "-f", "-", "-o", "json"], &off));
    assert!(r["spec"]["volumes"].is_null(), "{}", r["spec"]);
    let err = fails(s.kubectl(&[
        "patch",
        "pod",
        "p",
        "-n",
        "team",
        "-p",
        r#"{"spec":{"serviceAccountName":"other"}}"#,
    ]));
    assert!(err.contains("spec.serviceAccountName"), "{err}");
    ok(s.kubectl(&["delete", "namespace", "team", "--wait=false"]));

    // The serving certificate names the kubernetes Service.
    let pem = std::fs::read(s.cfg.data_dir.join("pki").join("server.crt")).expect("server.crt");
    let (_, der) = x509_parser::pem::parse_x509_pem(&pem).expect("PEM");
    let cert = der.parse_x509().expect("certificate");
    let sans = cert
        .subject_alternative_name()
        .expect("SAN extension")
        .expect("SANs")
        .value
        .general_names
        .iter()
        .map(|n| match n {
            x509_parser::extensions::GeneralName::DNSName(d) => d.to_string(),
            x509_parser::extensions::GeneralName::IPAddress(ip) => ip
                .iter()
                .map(|b| b.to_string())
                .collect::<Vec<_>>()
                .join("."),
            other => format!("{other:?}"),
        })
        .collect::<Vec<_>>();
    for want in [
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
        "198.19.0.1",
    ] {
        assert!(
            sans.iter().any(|s| s == want),
            "{want} missing from {sans:?}"
        );
    }
    // And kubectl verifies the server under that name (sent as SNI).
    let url = s.url();
    for name in ["kubernetes.default.svc", "kubernetes"] {
        let version = ok(s.kubectl(&[
            "get",
            "--raw=/version",
            &format!("--server={url}"),
            &format!("--tls-server-name={name}"),
        ]));
        assert!(version.contains("gitVersion"), "{version}");
    }
}
