//! ValidatingAdmissionPolicies through the real `kubectl`: a replica
//! limit with a ConfigMap parameter denies `kubectl scale` past it with
//! the policy's message; missing parameters follow
//! `parameterNotFoundAction`; `Warn` bindings warn; match conditions and
//! binding resources narrow what is checked; bad policies and bindings
//! are refused with upstream's causes; type checking is reported in the
//! policy's status.

use crate::api;

use std::time::Duration;

use api::{eventually, fails, ok, TestServer};

const REPLICA_LIMIT: &str = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: replica-limit.test.skiff.io
spec:
  failurePolicy: Fail
  paramKind: {apiVersion: v1, kind: ConfigMap}
  matchConstraints:
    resourceRules:
    - apiGroups: [apps]
      apiVersions: [v1]
      operations: [CREATE, UPDATE]
      resources: [deployments, deployments/scale]
  matchConditions:
  - name: not-exempt
    expression: "!has(object.metadata.labels) || !('exempt' in object.metadata.labels)"
  variables:
  - name: limit
    expression: int(params.data.maxReplicas)
  validations:
  - expression: object.spec.replicas <= variables.limit
    messageExpression: "'replicas must be at most ' + string(variables.limit)"
    reason: Forbidden
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: replica-limit-binding
spec:
  policyName: replica-limit.test.skiff.io
  validationActions: [Deny]
  paramRef:
    name: replica-limit
    parameterNotFoundAction: Deny
  matchResources:
    namespaceSelector:
      matchLabels: {limits: 'on'}
"#;

const TEAM_LABEL: &str = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: team-label.test.skiff.io
spec:
  matchConstraints:
    resourceRules:
    - {apiGroups: [''], apiVersions: [v1], operations: [CREATE], resources: [configmaps]}
  validations:
  - expression: "has(object.metadata.labels) && 'team' in object.metadata.labels"
    message: every configmap needs a team label
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: team-label-warn
spec:
  policyName: team-label.test.skiff.io
  validationActions: [Warn]
"#;

fn deployment(ns: &str, name: &str, replicas: u32, labels: &str) -> String {
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: {ns}, labels: {{{labels}}}}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec: {{containers: [{{name: c, image: busybox}}]}}
"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn policies_deny_warn_and_take_parameters() {
    let s = TestServer::start().await;
    for ns in ["limited", "unconfigured", "free"] {
        ok(s.kubectl(&["create", "namespace", ns]));
    }
    for ns in ["limited", "unconfigured"] {
        ok(s.kubectl(&["label", "namespace", ns, "limits=on"]));
    }
    ok(s.kubectl(&[
        "create",
        "configmap",
        "replica-limit",
        "-n",
        "limited",
        "--from-literal=maxReplicas=3",
    ]));
    ok(s.kubectl_stdin(&["apply", "-f", "-"], REPLICA_LIMIT));
    let table = ok(s.kubectl(&["get", "validatingadmissionpolicies"]));
    assert!(
        table.lines().next().unwrap().split_whitespace().eq([
            "NAME",
            "VALIDATIONS",
            "PARAMKIND",
            "AGE"
        ]),
        "{table}"
    );
    assert!(table.contains("v1/ConfigMap"), "{table}");
    let table = ok(s.kubectl(&["get", "validatingadmissionpolicybindings"]));
    assert!(
        table.contains("replica-limit.test.skiff.io") && table.contains("*/replica-limit"),
        "{table}"
    );

    // Within the limit: created. Past it (once the policy is in force):
    // denied with the policy's message and reason, on create and scale.
    ok(s.kubectl_stdin(&["apply", "-f", "-"], &deployment("limited", "web", 2, "")));
    let mut last = String::new();
    let denied = eventually(Duration::from_secs(10), || {
        let out = s.kubectl(&["scale", "deployment/web", "-n", "limited", "--replicas=5"]);
        last = String::from_utf8_lossy(&out.stderr).to_string();
        async move { !out.status.success() }
    })
    .await;
    assert!(denied, "scaling past the limit was never denied: {last}");
    assert!(last.contains("Error from server (Forbidden)") && last.contains("ValidatingAdmissionPolicy 'replica-limit.test.skiff.io' with binding 'replica-limit-binding' denied request: replicas must be at most 3"), "{last}");
    ok(s.kubectl(&["scale", "deployment/web", "-n", "limited", "--replicas=3"]));
    let err = fails(s.kubectl_stdin(&["apply", "-f", "-"], &deployment("limited", "big", 4, "")));
    assert!(err.contains("replicas must be at most 3"), "{err}");
    // A match condition exempts; a namespace the binding does not select
    // is not checked; missing parameters under Deny refuse.
    ok(s.kubectl_stdin(
        &["apply", "-f", "-"],
        &deployment("limited", "exempt", 9, "exempt: 'yes'"),
    ));
    ok(s.kubectl_stdin(&["apply", "-f", "-"], &deployment("free", "big", 9, "")));
    let err = fails(s.kubectl_stdin(
        &["apply", "-f", "-"],
        &deployment("unconfigured", "web", 1, ""),
    ));
    assert!(err.contains("failed to configure binding: no params found for policy binding with `Deny` parameterNotFoundAction"), "{err}");
    // Allow lets them through.
    ok(s.kubectl(&[
        "patch",
        "validatingadmissionpolicybinding",
        "replica-limit-binding",
        "--type=merge",
        "-p",
        r#"{"spec":{"paramRef":{"parameterNotFoundAction":"Allow"}}}"#,
    ]));
    let allowed = eventually(Duration::from_secs(10), || {
        let out = s.kubectl_stdin(
            &["apply", "-f", "-"],
            &deployment("unconfigured", "web", 1, ""),
        );
        async move { out.status.success() }
    })
    .await;
    assert!(
        allowed,
        "Allow never let a write without parameters through"
    );

    // Warn: the write goes through with the policy's warning.
    ok(s.kubectl_stdin(&["apply", "-f", "-"], TEAM_LABEL));
    let mut n = 0;
    let mut stderr = String::new();
    let warned = eventually(Duration::from_secs(10), || {
        n += 1;
        let out = s.kubectl(&["create", "configmap", &format!("c{n}"), "-n", "free"]);
        stderr = String::from_utf8_lossy(&out.stderr).to_string();
        let created = out.status.success();
        let hit = created && stderr.contains("Warning: Validation failed for ValidatingAdmissionPolicy 'team-label.test.skiff.io' with binding 'team-label-warn': every configmap needs a team label");
        async move { hit }
    })
    .await;
    assert!(warned, "no warning: {stderr}");

    // Type checking: a field the matched kind lacks is reported in the
    // policy's status, the correct policy has no warnings.
    ok(s.kubectl_stdin(
        &["apply", "-f", "-"],
        r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: typo.test.skiff.io}
spec:
  matchConstraints:
    resourceRules:
    - {apiGroups: [apps], apiVersions: [v1], operations: [CREATE], resources: [deployments]}
  validations:
  - expression: object.spec.replicass > 1
"#,
    ));
    let mut status = String::new();
    let checked = eventually(Duration::from_secs(10), || {
        status = ok(s.kubectl(&[
            "get",
            "validatingadmissionpolicy",
            "typo.test.skiff.io",
            "-o",
            "jsonpath={.status}",
        ]));
        let done = status.contains("observedGeneration");
        async move { done }
    })
    .await;
    assert!(checked, "never type checked: {status}");
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["observedGeneration"], 1, "{status}");
    assert_eq!(
        status["typeChecking"]["expressionWarnings"],
        serde_json::json!([{"fieldRef": "spec.validations[0].expression",
            "warning": "apps/v1, Kind=Deployment: ERROR: <input>:1:12: undefined field 'replicass'"}]),
        "{status}"
    );
    let clean = ok(s.kubectl(&[
        "get",
        "validatingadmissionpolicy",
        "replica-limit.test.skiff.io",
        "-o",
        "jsonpath={.status.typeChecking}",
    ]));
    assert_eq!(clean, "{}");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_policies_and_bindings_are_refused() {
    let s = TestServer::start().await;
    let err = fails(s.kubectl_stdin(
        &["apply", "-f", "-"],
        r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: bad}
spec:
  matchConstraints: {}
  validations:
  - expression: "object.spec.replicas <"
  - expression: "authorizer.group('') != null"
    reason: Teapot
  variables:
  - {name: "not valid", expression: "1"}
"#,
    ));
    for cause in [
        "spec.matchConstraints.resourceRules: Required value",
        "spec.validations[0].expression: Invalid value: \"object.spec.replicas <\": compilation failed",
        "spec.validations[1].expression: Invalid value: \"authorizer.group('') != null\": compilation failed: ERROR: <input>:1:1: undeclared reference to 'authorizer'",
        "spec.validations[1].reason: Unsupported value: \"Teapot\"",
        "spec.variables[0].name: Invalid value: \"not valid\": name is not a valid CEL identifier",
    ] {
        assert!(err.contains(cause), "missing {cause:?} in {err}");
    }
    let err = fails(s.kubectl_stdin(
        &["apply", "-f", "-"],
        r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: bad}
spec:
  validationActions: [Deny, Warn, Deny]
  paramRef: {name: x, selector: {}}
"#,
    ));
    for cause in [
        "spec.policyName: Required value",
        "spec.validationActions[2]: Duplicate value: \"Deny\"",
        "must not contain both Deny and Warn",
        "spec.paramRef: Forbidden: one of `name` or `selector` must be set",
        "spec.paramRef.parameterNotFoundAction: Required value",
    ] {
        assert!(err.contains(cause), "missing {cause:?} in {err}");
    }
}
