//! Pod Security admission through the real `kubectl`: namespace labels
//! choose the levels; `enforce` refuses with upstream's message, `warn`
//! comes back as warnings kubectl prints, `audit` lands in the audit log;
//! workloads' pod templates are warned about, not refused; bad labels are
//! refused; tightening `enforce` warns about existing pods; defaults and
//! exemptions come from `--admission-control-config-file`, and the binary
//! refuses a configuration it would not honour.

use crate::api;

use std::time::Duration;

use api::{eventually, fails, ok, TestServer};
use skiff_control_plane::config::Settings;

const WAIT: Duration = Duration::from_secs(20);

/// A pod with one privileged container named `c`.
fn privileged_pod(name: &str, ns: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  containers:\n  - name: c\n    image: busybox\n    securityContext: {{privileged: true}}\n"
    )
}

const RESTRICTED_DETAIL: &str = concat!(
    r#"privileged (container "c" must not set securityContext.privileged=true), "#,
    r#"allowPrivilegeEscalation != false (container "c" must set securityContext.allowPrivilegeEscalation=false), "#,
    r#"unrestricted capabilities (container "c" must set securityContext.capabilities.drop=["ALL"]), "#,
    r#"runAsNonRoot != true (pod or container "c" must set securityContext.runAsNonRoot=true), "#,
    r#"seccompProfile (pod or container "c" must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")"#
);

/// One server: the admission configuration makes `audit=restricted` the
/// cluster default and exempts namespace `free` and user `trusted`; pod
/// requests are audited at Metadata. The directory holds those files and
/// the audit log; it goes when the test ends.
async fn server() -> (TestServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let admission = dir.path().join("admission.yaml");
    std::fs::write(
        &admission,
        "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n- name: PodSecurity\n  path: pod-security.yaml\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("pod-security.yaml"),
        "apiVersion: pod-security.admission.config.k8s.io/v1\nkind: PodSecurityConfiguration\ndefaults:\n  audit: restricted\nexemptions:\n  namespaces: [free]\n  usernames: [trusted]\n",
    )
    .unwrap();
    let policy = dir.path().join("audit-policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Metadata\n  resources: [{group: \"\", resources: [pods]}]\n- level: None\n",
    )
    .unwrap();
    let s = TestServer::start_with_settings(
        None,
        Settings {
            admission_control_config_file: Some(admission),
            audit_policy_file: Some(policy),
            audit_log_path: Some(dir.path().join("audit.log").display().to_string()),
            ..Default::default()
        },
    )
    .await;
    (s, dir)
}

#[tokio::test(flavor = "multi_thread")]
async fn pod_security_levels_through_kubectl() {
    let (s, dir) = server().await;
    for ns in ["locked", "watched", "free"] {
        ok(s.kubectl(&["create", "namespace", ns]));
    }
    ok(s.kubectl(&[
        "label",
        "namespace",
        "locked",
        "pod-security.kubernetes.io/enforce=restricted",
    ]));
    ok(s.kubectl(&[
        "label",
        "namespace",
        "watched",
        "pod-security.kubernetes.io/warn=baseline",
        "pod-security.kubernetes.io/warn-version=v1.30",
    ]));
    ok(s.kubectl(&[
        "label",
        "namespace",
        "free",
        "pod-security.kubernetes.io/enforce=restricted",
    ]));

    // enforce: refused with upstream's message.
    let err = fails(s.kubectl_stdin(&["apply", "-f", "-"], &privileged_pod("priv", "locked")));
    assert!(
        err.contains(&format!(
            r#"pods "priv" is forbidden: violates PodSecurity "restricted:latest": {RESTRICTED_DETAIL}"#
        )),
        "{err}"
    );

    // warn: allowed, and kubectl prints the warning.
    let out = s.kubectl_stdin(&["apply", "-f", "-"], &privileged_pod("priv", "watched"));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    ok(out);
    assert!(
        stderr.contains(r#"Warning: would violate PodSecurity "baseline:v1.30": privileged (container "c" must not set securityContext.privileged=true)"#),
        "{stderr}"
    );

    // Workloads: their templates are warned about (warn follows the
    // stricter enforce level), never refused.
    let deploy = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: locked}\nspec:\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec:\n      containers:\n      - name: c\n        image: busybox\n        securityContext: {privileged: true}\n";
    let out = s.kubectl_stdin(&["apply", "-f", "-"], deploy);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    ok(out);
    assert!(
        stderr.contains(&format!(
            r#"Warning: would violate PodSecurity "restricted:latest": {RESTRICTED_DETAIL}"#
        )),
        "{stderr}"
    );

    // Exempt namespace and user: no checks at all.
    ok(s.kubectl_stdin(&["apply", "-f", "-"], &privileged_pod("priv", "free")));
    let trusted = s.kubeconfig_for("trusted", &["system:masters"]);
    let out = s.kubectl_as(
        &trusted,
        &["apply", "-f", "-"],
        Some(&privileged_pod("priv2", "locked")),
    );
    ok(out);

    // Bad labels are refused, naming the label.
    let err = fails(s.kubectl(&[
        "label",
        "namespace",
        "watched",
        "pod-security.kubernetes.io/enforce=strict",
    ]));
    assert!(
        err.contains(r#"metadata.labels[pod-security.kubernetes.io/enforce]: Invalid value: "strict": must be one of privileged, baseline, restricted"#),
        "{err}"
    );

    // Tightening enforce warns about the pods already there.
    let out = s.kubectl(&[
        "label",
        "namespace",
        "watched",
        "pod-security.kubernetes.io/enforce=baseline",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    ok(out);
    assert!(
        stderr.contains(r#"Warning: existing pods in namespace "watched" violate the new PodSecurity enforce level "baseline:latest""#)
            && stderr.contains("Warning: priv: privileged"),
        "{stderr}"
    );

    // audit: the cluster default (restricted) marks the audit event of
    // the pod allowed in "watched".
    let path = dir.path().join("audit.log");
    let found = eventually(WAIT, || {
        let path = path.clone();
        async move {
            std::fs::read_to_string(&path).is_ok_and(|text| {
                text.lines().any(|l| {
                    l.contains(r#""pod-security.kubernetes.io/audit-violations":"would violate PodSecurity \"restricted:latest\": privileged"#)
                        && l.contains(r#""namespace":"watched""#)
                        && l.contains("ResponseComplete")
                })
            })
        }
    })
    .await;
    assert!(
        found,
        "no audit-violations annotation in {}",
        path.display()
    );

    for ns in ["locked", "watched", "free"] {
        ok(s.kubectl(&["delete", "namespace", ns, "--wait=false"]));
    }
}

/// The real binary refuses to start with an admission configuration it
/// would not honour, naming the problem.
#[test]
fn a_bad_admission_config_stops_the_server() {
    use std::process::{Command, Stdio};
    use std::time::Instant;

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("admission.yaml");
    std::fs::write(
        &file,
        "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n- name: PodSecurity\n  configuration:\n    apiVersion: pod-security.admission.config.k8s.io/v1\n    kind: PodSecurityConfiguration\n    defaults: {enforce: strict}\n",
    )
    .unwrap();
    let data = dir.path().join("data");
    let mut child = Command::new(env!("CARGO_BIN_EXE_skiff-server"))
        .arg("--data-dir")
        .arg(&data)
        .args(["--bind-address", "127.0.0.1", "--secure-port", "0"])
        .args(["--disable-scheduler", "--disable-controller-manager"])
        .arg("--admission-control-config-file")
        .arg(&file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start skiff-server");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("skiff-server kept running with a bad admission configuration");
        }
        #[allow(clippy::disallowed_methods)] // a synchronous helper, as clippy.toml allows
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success());
    assert!(
        err.contains("defaults.enforce: must be one of privileged, baseline, restricted"),
        "{err}"
    );
}
