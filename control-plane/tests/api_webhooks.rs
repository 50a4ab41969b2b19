//! Admission webhooks through the real `kubectl`: configurations are
//! validated and defaulted; a mutating webhook labels objects, a
//! validating one denies and warns, each only for the namespaces,
//! objects and match conditions it selects; the review carries what
//! upstream's does; failures follow `failurePolicy` and `timeoutSeconds`;
//! bad answers get upstream's errors and the server keeps serving; a
//! webhook behind a Service is reached through its endpoints.

use crate::api;
use crate::webhook_server;

use std::time::Duration;

use api::{eventually, fails, ok, TestServer};
use serde_json::Value;
use webhook_server::WebhookServer;

fn json(out: String) -> Value {
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// One webhook of kind `kind` at `path` of `hooks`, for `resource`
/// (core group) and `extra` YAML lines (indented for the webhook).
fn config(
    kind: &str,
    name: &str,
    hooks: &WebhookServer,
    path: &str,
    resource: &str,
    extra: &str,
) -> String {
    format!(
        "apiVersion: admissionregistration.k8s.io/v1
kind: {kind}
metadata:
  name: {name}
webhooks:
- name: {name}
  clientConfig:
    url: https://127.0.0.1:{port}{path}
    caBundle: {ca}
  rules:
  - operations: [CREATE, UPDATE, DELETE]
    apiGroups: ['']
    apiVersions: [v1]
    resources: [{resource}]
  sideEffects: None
  admissionReviewVersions: [v1]
{extra}",
        port = hooks.port,
        ca = hooks.ca_bundle
    )
}

fn configmap(ns: &str, name: &str, labels: &str) -> String {
    format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {ns}\n  labels: {{{labels}}}\ndata:\n  a: b\n")
}

/// Create configmaps in `ns` until one comes back with the mutating
/// webhook's label (configurations take effect a moment after they are
/// written, as upstream's informers make them).
async fn until_mutated(s: &TestServer, ns: &str) -> Value {
    let mut n = 0;
    let mut last = Value::Null;
    let seen = eventually(Duration::from_secs(10), || {
        n += 1;
        let name = format!("probe-{n}");
        let out = s.kubectl_stdin(
            &["create", "-o", "json", "-f", "-"],
            &configmap(ns, &name, "webhook: 'on'"),
        );
        let obj = json(ok(out));
        let hit = obj["metadata"]["labels"]["webhook.test.skiff.io/mutated"] == "true";
        last = obj;
        async move { hit }
    })
    .await;
    assert!(
        seen,
        "the mutating webhook never labelled a configmap: {last}"
    );
    last
}

#[tokio::test(flavor = "multi_thread")]
async fn webhooks_mutate_validate_warn_and_select_what_they_see() {
    let s = TestServer::start().await;
    let hooks = webhook_server::serve(&[]).await;
    ok(s.kubectl(&["create", "namespace", "hooked"]));
    ok(s.kubectl(&["label", "namespace", "hooked", "webhooks=on"]));
    ok(s.kubectl(&["create", "namespace", "plain"]));

    // Bad configurations are refused with upstream's causes.
    let bad = config(
        "ValidatingWebhookConfiguration",
        "bad",
        &hooks,
        "/validate",
        "configmaps",
        "  timeoutSeconds: 31\n",
    )
    .replace("url: https://", "url: http://")
    .replace("sideEffects: None", "sideEffects: Some");
    let err = fails(s.kubectl_stdin(&["apply", "-f", "-"], &bad));
    for cause in [
        "webhooks[0].name: Invalid value: \"bad\": should be a domain with at least three segments separated by dots",
        "'https' is the only allowed URL scheme",
        "webhooks[0].sideEffects: Unsupported value: \"Some\"",
        "webhooks[0].timeoutSeconds: Invalid value: 31: the timeout value must be between 1 and 30 seconds",
    ] {
        assert!(err.contains(cause), "missing {cause:?} in {err}");
    }
    let connect = config(
        "ValidatingWebhookConfiguration",
        "connect.test.skiff.io",
        &hooks,
        "/validate",
        "pods",
        "",
    )
    .replace("[CREATE, UPDATE, DELETE]", "[CONNECT]");
    let err = fails(s.kubectl_stdin(&["apply", "-f", "-"], &connect));
    assert!(
        err.contains("webhooks[0].rules[0].operations[0]: Unsupported value: \"CONNECT\""),
        "{err}"
    );
    let cond = config(
        "ValidatingWebhookConfiguration",
        "cond.test.skiff.io",
        &hooks,
        "/validate",
        "pods",
        "  matchConditions:\n  - name: broken\n    expression: params.x == 1\n",
    );
    let err = fails(s.kubectl_stdin(&["apply", "-f", "-"], &cond));
    assert!(err.contains("matchConditions[0].expression: Invalid value: \"params.x == 1\": compilation failed: ERROR: <input>:1:1: undeclared reference to 'params'"), "{err}");

    // A mutating webhook for the namespaces labelled webhooks=on, and a
    // validating one for the objects labelled webhook=on that have no
    // `skip` annotation.
    let mutating = config(
        "MutatingWebhookConfiguration",
        "label.test.skiff.io",
        &hooks,
        "/mutate",
        "configmaps",
        "  namespaceSelector:\n    matchLabels: {webhooks: 'on'}\n",
    );
    ok(s.kubectl_stdin(&["apply", "-f", "-"], &mutating));
    let validating = config("ValidatingWebhookConfiguration", "deny.test.skiff.io", &hooks, "/validate", "configmaps",
        "  objectSelector:\n    matchLabels: {webhook: 'on'}\n  matchConditions:\n  - name: not-skipped\n    expression: \"object == null || !has(object.metadata.annotations) || !('skip' in object.metadata.annotations)\"\n");
    ok(s.kubectl_stdin(&["apply", "-f", "-"], &validating));
    let stored = json(ok(s.kubectl(&[
        "get",
        "mutatingwebhookconfiguration",
        "label.test.skiff.io",
        "-o",
        "json",
    ])));
    let hook = &stored["webhooks"][0];
    assert_eq!(hook["failurePolicy"], "Fail", "{stored}");
    assert_eq!(hook["matchPolicy"], "Equivalent", "{stored}");
    assert_eq!(hook["timeoutSeconds"], 10, "{stored}");
    assert_eq!(hook["reinvocationPolicy"], "Never", "{stored}");
    assert_eq!(hook["objectSelector"], serde_json::json!({}), "{stored}");
    assert_eq!(hook["rules"][0]["scope"], "*", "{stored}");
    let table = ok(s.kubectl(&["get", "validatingwebhookconfigurations"]));
    assert!(
        table
            .lines()
            .next()
            .unwrap()
            .split_whitespace()
            .eq(["NAME", "WEBHOOKS", "AGE"]),
        "{table}"
    );
    assert!(table.contains("deny.test.skiff.io"), "{table}");

    // Mutation, and the review the webhook was sent.
    let mutated = until_mutated(&s, "hooked").await;
    let name = mutated["metadata"]["name"].as_str().unwrap().to_string();
    let review = hooks
        .calls_to("/mutate")
        .into_iter()
        .find(|r| r["name"] == name.as_str())
        .expect("the mutating webhook saw the configmap");
    assert_eq!(review["operation"], "CREATE");
    assert_eq!(review["namespace"], "hooked");
    assert_eq!(
        review["kind"],
        serde_json::json!({"group": "", "version": "v1", "kind": "ConfigMap"})
    );
    assert_eq!(
        review["resource"],
        serde_json::json!({"group": "", "version": "v1", "resource": "configmaps"})
    );
    assert_eq!(review["requestKind"], review["kind"]);
    assert_eq!(review["options"]["kind"], "CreateOptions");
    assert_eq!(review["dryRun"], false);
    assert_eq!(review["object"]["data"]["a"], "b");
    assert!(review["oldObject"].is_null());
    assert!(!review["uid"].as_str().unwrap_or_default().is_empty());
    assert!(
        review["userInfo"]["groups"]
            .as_array()
            .is_some_and(|g| g.contains(&"system:masters".into())),
        "{review}"
    );
    // Not in a namespace the selector leaves out.
    let plain = json(ok(s.kubectl_stdin(
        &["create", "-o", "json", "-f", "-"],
        &configmap("plain", "p1", "webhook: 'on'"),
    )));
    assert!(
        plain["metadata"]["labels"]["webhook.test.skiff.io/mutated"].is_null(),
        "{plain}"
    );

    // Validation: a denial with the webhook's message and code, warnings
    // passed through, the object selector and the match condition.
    let err = fails(s.kubectl_stdin(
        &["create", "-f", "-"],
        &configmap("plain", "d1", "webhook: 'on', deny: 'yes'"),
    ));
    assert!(err.contains("admission webhook \"deny.test.skiff.io\" denied the request: objects labelled deny are not allowed"), "{err}");
    let out = s.kubectl_stdin(
        &["create", "-f", "-"],
        &configmap("plain", "w1", "webhook: 'on'"),
    );
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    ok(out);
    assert!(
        stderr.contains("Warning: seen by the validating webhook"),
        "{stderr}"
    );
    let before = hooks.calls_to("/validate").len();
    ok(s.kubectl_stdin(
        &["create", "-f", "-"],
        &configmap("plain", "unselected", "deny: 'yes'"),
    ));
    let skipped = configmap("plain", "skipped", "webhook: 'on', deny: 'yes'")
        .replace("  labels:", "  annotations: {skip: 'yes'}\n  labels:");
    ok(s.kubectl_stdin(&["create", "-f", "-"], &skipped));
    assert_eq!(
        hooks.calls_to("/validate").len(),
        before,
        "the webhook was called for objects it does not select"
    );
    // Updates and deletes: the old object is sent; a delete is denied.
    ok(s.kubectl(&["label", "configmap", "-n", "plain", "w1", "protect=yes"]));
    let update = hooks.calls_to("/validate").into_iter().last().unwrap();
    assert_eq!(update["operation"], "UPDATE");
    assert_eq!(update["options"]["kind"], "UpdateOptions");
    assert!(
        update["oldObject"]["metadata"]["labels"]["protect"].is_null(),
        "{update}"
    );
    let err = fails(s.kubectl(&["delete", "configmap", "-n", "plain", "w1"]));
    assert!(
        err.contains(
            "admission webhook \"deny.test.skiff.io\" denied the request: this object is protected"
        ),
        "{err}"
    );
    let delete = hooks.calls_to("/validate").into_iter().last().unwrap();
    assert_eq!(delete["operation"], "DELETE");
    assert!(delete["object"].is_null(), "{delete}");
    // Dry runs say so.
    ok(s.kubectl_stdin(
        &["create", "--dry-run=server", "-f", "-"],
        &configmap("plain", "dry", "webhook: 'on'"),
    ));
    let dry = hooks.calls_to("/validate").into_iter().last().unwrap();
    assert_eq!(dry["dryRun"], true, "{dry}");

    // The configurations themselves are never sent to a webhook: a
    // webhook for everything cannot lock its own fix out.
    let everything = config(
        "ValidatingWebhookConfiguration",
        "all.test.skiff.io",
        &hooks,
        "/validate",
        "'*'",
        "",
    )
    .replace("apiGroups: ['']", "apiGroups: ['*']")
    .replace("apiVersions: [v1]", "apiVersions: ['*']");
    ok(s.kubectl_stdin(&["apply", "-f", "-"], &everything));
    ok(s.kubectl(&[
        "delete",
        "validatingwebhookconfiguration",
        "all.test.skiff.io",
    ]));
    assert!(!hooks
        .calls()
        .iter()
        .any(|(_, r)| r["resource"]["group"] == "admissionregistration.k8s.io"));

    // Metrics.
    let metrics = ok(s.kubectl(&["get", "--raw", "/metrics"]));
    assert!(metrics.contains("apiserver_admission_webhook_admission_duration_seconds_count{name=\"label.test.skiff.io\",operation=\"CREATE\",rejected=\"false\",type=\"admit\"}"), "{metrics}");
    assert!(metrics.contains("apiserver_admission_webhook_rejection_count_total{name=\"deny.test.skiff.io\",operation=\"CREATE\",error_type=\"no_error\",rejection_code=\"403\",type=\"validating\"}"), "{metrics}");
}

/// Apply `yaml`, then create secrets named `probe` in `ns` until
/// `accepted` says the outcome is the configured webhook's (the
/// configuration takes effect a moment after it is written); returns
/// the last outcome's stderr (or stdout when it succeeded).
async fn until_secret(s: &TestServer, ns: &str, accepted: impl Fn(bool, &str) -> bool) -> String {
    let mut n = 0;
    let mut last = String::new();
    let seen = eventually(Duration::from_secs(15), || {
        n += 1;
        let out = s.kubectl(&[
            "create",
            "secret",
            "generic",
            &format!("probe-{n}"),
            "-n",
            ns,
            "--from-literal=a=b",
        ]);
        let success = out.status.success();
        last = if success {
            String::from_utf8_lossy(&out.stdout).to_string()
        } else {
            String::from_utf8_lossy(&out.stderr).to_string()
        };
        let hit = accepted(success, &last);
        async move { hit }
    })
    .await;
    assert!(seen, "never got the expected outcome; last: {last}");
    last
}

#[tokio::test(flavor = "multi_thread")]
async fn webhook_failures_follow_the_failure_policy_and_bad_answers_are_refused() {
    let s = TestServer::start().await;
    let hooks = webhook_server::serve(&["hooksvc.webhooks.svc"]).await;
    ok(s.kubectl(&["create", "namespace", "webhooks"]));
    let apply = |kind: &str, path: &str, extra: &str| {
        let name = format!("{}.test.skiff.io", path.trim_start_matches('/'));
        ok(s.kubectl_stdin(
            &["apply", "-f", "-"],
            &config(kind, &name, &hooks, path, "secrets", extra),
        ));
        name
    };

    // A webhook that is down: Ignore lets writes through, Fail refuses them.
    let down = format!(
        "apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: down.test.skiff.io
webhooks:
- name: down.test.skiff.io
  clientConfig:
    url: https://127.0.0.1:1/validate
    caBundle: {ca}
  rules:
  - {{operations: [CREATE], apiGroups: [''], apiVersions: [v1], resources: [secrets]}}
  failurePolicy: POLICY
  sideEffects: None
  admissionReviewVersions: [v1]
",
        ca = hooks.ca_bundle
    );
    ok(s.kubectl_stdin(&["apply", "-f", "-"], &down.replace("POLICY", "Ignore")));
    ok(s.kubectl(&[
        "create",
        "secret",
        "generic",
        "through",
        "-n",
        "webhooks",
        "--from-literal=a=b",
    ]));
    ok(s.kubectl_stdin(&["apply", "-f", "-"], &down.replace("POLICY", "Fail")));
    let err = until_secret(&s, "webhooks", |success, _| !success).await;
    assert!(err.contains("Internal error occurred: failed calling webhook \"down.test.skiff.io\": failed to call webhook: Post \"https://127.0.0.1:1/validate?timeout=10s\""), "{err}");
    ok(s.kubectl(&[
        "delete",
        "validatingwebhookconfiguration",
        "down.test.skiff.io",
    ]));
    until_secret(&s, "webhooks", |success, _| success).await;

    // A webhook that never answers is given up on after its timeout.
    apply(
        "ValidatingWebhookConfiguration",
        "/slow",
        "  timeoutSeconds: 1\n",
    );
    let err = until_secret(&s, "webhooks", |success, _| !success).await;
    assert!(err.contains("failed calling webhook \"slow.test.skiff.io\": failed to call webhook: Post \"https://127.0.0.1:") && err.contains("context deadline exceeded"), "{err}");
    ok(s.kubectl(&[
        "delete",
        "validatingwebhookconfiguration",
        "slow.test.skiff.io",
    ]));

    // Answers that cannot be used: each refused with its reason.
    for (kind, path, why) in [
        (
            "ValidatingWebhookConfiguration",
            "/garbage",
            "received invalid webhook response: expected ident at line 1 column 2",
        ),
        (
            "ValidatingWebhookConfiguration",
            "/patch",
            "received invalid webhook response: validating webhook may not return response.patch",
        ),
        (
            "ValidatingWebhookConfiguration",
            "/huge",
            "received invalid webhook response: the response is larger than",
        ),
        (
            "MutatingWebhookConfiguration",
            "/bad-patch",
            "admission webhook \"bad-patch.test.skiff.io\" returned a patch that cannot be applied",
        ),
    ] {
        let name = apply(kind, path, "");
        let err = until_secret(&s, "webhooks", |success, _| !success).await;
        assert!(err.contains(why), "{path}: {err}");
        ok(s.kubectl(&["delete", &kind.to_lowercase(), &name]));
        until_secret(&s, "webhooks", |success, _| success).await;
    }

    // A webhook behind a Service (no pod behind it: dialled from the
    // server), checked against the service's DNS name.
    ok(s.kubectl_stdin(
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: v1
kind: Service
metadata: {{name: hooksvc, namespace: webhooks}}
spec:
  ports: [{{name: https, port: 443, targetPort: 8443}}]
---
apiVersion: v1
kind: Endpoints
metadata: {{name: hooksvc, namespace: webhooks}}
subsets:
- addresses: [{{ip: 127.0.0.1}}]
  ports: [{{name: https, port: {port}}}]
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {{name: svc.test.skiff.io}}
webhooks:
- name: svc.test.skiff.io
  clientConfig:
    service: {{name: hooksvc, namespace: webhooks, path: /mutate}}
    caBundle: {ca}
  rules:
  - {{operations: [CREATE], apiGroups: [''], apiVersions: [v1], resources: [secrets]}}
  sideEffects: None
  admissionReviewVersions: [v1]
",
            port = hooks.port,
            ca = hooks.ca_bundle
        ),
    ));
    let created = until_secret(&s, "webhooks", |success, out| success && !out.is_empty()).await;
    assert!(created.contains("created"), "{created}");
    let labelled = eventually(Duration::from_secs(10), || {
        let out = s.kubectl(&[
            "get",
            "secrets",
            "-n",
            "webhooks",
            "-l",
            "webhook.test.skiff.io/mutated=true",
            "-o",
            "name",
        ]);
        async move { !String::from_utf8_lossy(&out.stdout).trim().is_empty() }
    })
    .await;
    assert!(
        labelled,
        "the webhook behind the service never labelled a secret"
    );
    let stored = json(ok(s.kubectl(&[
        "get",
        "mutatingwebhookconfiguration",
        "svc.test.skiff.io",
        "-o",
        "json",
    ])));
    assert_eq!(
        stored["webhooks"][0]["clientConfig"]["service"]["port"], 443,
        "{stored}"
    );

    // Reinvocation: a webhook with IfNeeded that ran before another's
    // change is asked again, and sees it. Configurations run in name
    // order: the annotating one ("a-...") before the labelling one.
    ok(s.kubectl(&[
        "delete",
        "mutatingwebhookconfiguration",
        "svc.test.skiff.io",
    ]));
    for (name, path, extra) in [
        (
            "a-annotate.test.skiff.io",
            "/annotate",
            "  reinvocationPolicy: IfNeeded\n",
        ),
        ("b-label.test.skiff.io", "/mutate", ""),
    ] {
        ok(s.kubectl_stdin(
            &["apply", "-f", "-"],
            &config(
                "MutatingWebhookConfiguration",
                name,
                &hooks,
                path,
                "secrets",
                extra,
            ),
        ));
    }
    let mut n = 0;
    let mut last = Value::Null;
    let reinvoked = eventually(Duration::from_secs(15), || {
        n += 1;
        let out = s.kubectl(&[
            "create",
            "secret",
            "generic",
            &format!("again-{n}"),
            "-n",
            "webhooks",
            "-o",
            "json",
            "--from-literal=a=b",
        ]);
        last = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        // One label: the labelling webhook's, seen by the second call.
        let hit = last["metadata"]["annotations"]["webhook.test.skiff.io/labels"] == "1"
            && last["metadata"]["labels"]["webhook.test.skiff.io/mutated"] == "true";
        async move { hit }
    })
    .await;
    assert!(reinvoked, "never reinvoked: {last}");

    // The server kept serving through all of it.
    ok(s.kubectl(&["get", "--raw", "/readyz"]));
}
