//! CustomResourceDefinitions through the real `kubectl`: a definition is
//! named and established, its kind served (discovery, OpenAPI for
//! `kubectl explain`), its objects validated, defaulted and pruned by the
//! schema, printed with the definition's columns, scaled through
//! `/scale`, and deleted with the definition.

use crate::api;
use crate::api_suite;

use std::time::Duration;

use api::{eventually, fails, header, ok, TestServer, KUBECTL_DIR};
use api_suite::{crd_condition, established};
use serde_json::Value;

const WIDGETS: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names:
    plural: widgets
    singular: widget
    kind: Widget
    shortNames: [wd]
  versions:
  - name: v1
    served: true
    storage: true
    subresources:
      status: {}
      scale:
        specReplicasPath: .spec.replicas
        statusReplicasPath: .status.replicas
        labelSelectorPath: .status.selector
    additionalPrinterColumns:
    - {name: Replicas, type: integer, jsonPath: .spec.replicas}
    - {name: Color, type: string, jsonPath: .spec.color}
    - {name: Ready, type: string, priority: 1, jsonPath: '.status.conditions[?(@.type=="Ready")].status'}
    - {name: Age, type: date, jsonPath: .metadata.creationTimestamp}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            description: What the widget should be.
            required: [color]
            properties:
              replicas: {type: integer, minimum: 0, maximum: 10, default: 1}
              color: {type: string, enum: [red, blue]}
              size: {type: string, default: small}
              label: {type: string, pattern: '^[a-z]+$', maxLength: 8}
          status:
            type: object
            properties:
              replicas: {type: integer}
              selector: {type: string}
              conditions:
                type: array
                items:
                  type: object
                  properties:
                    type: {type: string}
                    status: {type: string}
"#;

fn widget(name: &str, spec: &str) -> String {
    format!("apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: {name}\nspec:\n{spec}")
}

/// Whether the definition `name` is gone within `secs` seconds.
async fn gone(s: &TestServer, name: &str, secs: u64) -> bool {
    eventually(Duration::from_secs(secs), || {
        let out = s.kubectl(&["get", "crd", name]);
        async move { !out.status.success() }
    })
    .await
}

fn json(out: String) -> Value {
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn custom_resources_are_served_validated_printed_scaled_and_cleaned_up() {
    let s = TestServer::start().await;
    ok(s.kubectl_stdin(&["apply", "-f", "-"], WIDGETS));
    let crd = established(&s, "widgets.example.com").await;
    let conds = crd["status"]["conditions"].as_array().unwrap();
    let names = conds.iter().find(|c| c["type"] == "NamesAccepted").unwrap();
    assert_eq!(names["status"], "True", "{crd}");
    assert_eq!(names["reason"], "NoConflicts", "{crd}");
    assert_eq!(crd["status"]["acceptedNames"]["kind"], "Widget");
    assert_eq!(crd["status"]["storedVersions"], serde_json::json!(["v1"]));
    assert_eq!(crd["metadata"]["finalizers"], Value::Null, "{crd}");

    // Discovery.
    let resources = ok(s.kubectl(&["api-resources", "--api-group=example.com"]));
    let row = resources
        .lines()
        .find(|l| l.starts_with("widgets"))
        .unwrap_or_else(|| panic!("{resources}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        cells,
        ["widgets", "wd", "example.com/v1", "true", "Widget"],
        "{row}"
    );

    // A valid object is defaulted; its status is the controllers' to write.
    ok(s.kubectl_stdin(
        &["apply", "-f", "-"],
        &widget("w1", "  color: red\n  label: abc\n"),
    ));
    let w1 = json(ok(s.kubectl(&["get", "wd", "w1", "-o", "json"])));
    assert_eq!(w1["spec"]["replicas"], 1, "{w1}");
    assert_eq!(w1["spec"]["size"], "small", "{w1}");
    assert_eq!(w1["metadata"]["generation"], 1, "{w1}");

    // Each validator speaks upstream's words, with the field's path.
    let bad = [
        (
            "  color: red\n  replicas: 11\n",
            "spec.replicas: Invalid value: 11: spec.replicas in body should be less than or equal to 10",
        ),
        (
            "  color: pink\n",
            "spec.color: Unsupported value: \"pink\": supported values: \"red\", \"blue\"",
        ),
        ("  replicas: 2\n", "spec.color: Required value"),
        (
            "  color: red\n  label: ABC\n",
            "spec.label in body should match '^[a-z]+$'",
        ),
        (
            "  color: red\n  replicas: many\n",
            "spec.replicas in body must be of type integer: \"string\"",
        ),
    ];
    for (spec, want) in bad {
        let err = fails(s.kubectl_stdin(&["create", "-f", "-"], &widget("bad", spec)));
        assert!(err.contains(want), "{spec}: {err}");
    }
    // Unknown fields: refused under kubectl's default strict validation,
    // pruned when validation is off.
    let err = fails(s.kubectl_stdin(
        &["create", "-f", "-"],
        &widget("w2", "  color: blue\n  bogus: 1\n"),
    ));
    assert!(err.contains("unknown field \"spec.bogus\""), "{err}");
    ok(s.kubectl_stdin(
        &["create", "--validate=false", "-f", "-"],
        &widget("w2", "  color: blue\n  bogus: 1\n"),
    ));
    let w2 = json(ok(s.kubectl(&["get", "widget", "w2", "-o", "json"])));
    assert_eq!(w2["spec"].get("bogus"), None, "{w2}");

    // Printer columns, the priority-1 one only with -o wide.
    let get = ok(s.kubectl(&["get", "widgets"]));
    assert_eq!(header(&get), ["NAME", "REPLICAS", "COLOR", "AGE"], "{get}");
    assert!(
        get.lines()
            .any(|l| l.split_whitespace().take(3).eq(["w1", "1", "red"])),
        "{get}"
    );
    let wide = ok(s.kubectl(&["get", "widgets", "-o", "wide"]));
    assert_eq!(
        header(&wide),
        ["NAME", "REPLICAS", "COLOR", "READY", "AGE"],
        "{wide}"
    );

    // kubectl explain reads the published schema.
    let explain = ok(s.kubectl(&["explain", "widget.spec"]));
    assert!(explain.contains("What the widget should be."), "{explain}");
    assert!(explain.contains("replicas"), "{explain}");

    // Scale writes the spec replicas path; status is a subresource.
    ok(s.kubectl(&["scale", "widget", "w1", "--replicas=3"]));
    let w1 = json(ok(s.kubectl(&["get", "widget", "w1", "-o", "json"])));
    assert_eq!(w1["spec"]["replicas"], 3, "{w1}");
    assert_eq!(w1["metadata"]["generation"], 2, "{w1}");
    ok(s.kubectl(&[
        "patch", "widget", "w1", "--subresource=status", "--type=merge", "-p",
        r#"{"status":{"replicas":3,"selector":"app=w1","conditions":[{"type":"Ready","status":"True"}]}}"#,
    ]));
    let w1 = json(ok(s.kubectl(&["get", "widget", "w1", "-o", "json"])));
    assert_eq!(w1["status"]["replicas"], 3, "{w1}");
    assert_eq!(
        w1["metadata"]["generation"], 2,
        "status is not a generation: {w1}"
    );
    let scale = json(ok(s.kubectl(&[
        "get",
        "--raw",
        "/apis/example.com/v1/namespaces/default/widgets/w1/scale",
    ])));
    assert_eq!(scale["status"]["selector"], "app=w1", "{scale}");
    let wide = ok(s.kubectl(&["get", "widget", "w1", "-o", "wide"]));
    assert!(
        wide.lines()
            .nth(1)
            .unwrap_or_default()
            .split_whitespace()
            .nth(3)
            == Some("True"),
        "{wide}"
    );

    // Every supported kubectl applies, prints and explains custom objects
    // (before 1.29, kubectl's validation and explain read OpenAPI v2,
    // which this server does not publish, for any kind: those apply
    // without validation and do not explain).
    let admin = s.admin_kubeconfig();
    for minor in 27..=33 {
        let kubectl = format!("{KUBECTL_DIR}/kubectl.1.{minor}");
        let name = format!("v{minor}");
        let obj = widget(&name, "  color: blue\n");
        let apply: &[&str] = if minor < 29 {
            &["apply", "--validate=false", "-f", "-"]
        } else {
            &["apply", "-f", "-"]
        };
        ok(s.kubectl_binary(&kubectl, &admin, apply, Some(&obj)));
        let get = ok(s.kubectl_binary(&kubectl, &admin, &["get", "widget", &name], None));
        assert_eq!(
            header(&get),
            ["NAME", "REPLICAS", "COLOR", "AGE"],
            "{kubectl}: {get}"
        );
        if minor >= 29 {
            let explain =
                ok(s.kubectl_binary(&kubectl, &admin, &["explain", "widgets.spec.color"], None));
            assert!(explain.contains("color"), "{kubectl}: {explain}");
        }
    }

    // Deleting the definition deletes its objects, then itself.
    ok(s.kubectl(&[
        "delete",
        "crd",
        "widgets.example.com",
        "--wait=true",
        "--timeout=20s",
    ]));
    assert!(
        gone(&s, "widgets.example.com", 10).await,
        "the definition stayed"
    );
    let raw = s.kubectl(&[
        "get",
        "--raw",
        "/apis/example.com/v1/namespaces/default/widgets",
    ]);
    assert!(!raw.status.success(), "widgets still served");
    // kubectl's cached discovery may still name the kind: then the list
    // itself is not found.
    let err = fails(s.kubectl(&["get", "widgets"]));
    assert!(
        err.contains("the server doesn't have a resource type \"widgets\"")
            || err.contains("the server could not find the requested resource"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_definitions_and_name_conflicts() {
    let s = TestServer::start().await;
    let err = fails(s.kubectl_stdin(
        &["create", "-f", "-"],
        &WIDGETS.replace("name: widgets.example.com", "name: things.example.com"),
    ));
    assert!(err.contains("metadata.name: Invalid value: \"things.example.com\": must be spec.names.plural+\".\"+spec.group"), "{err}");
    let err = fails(s.kubectl_stdin(
        &["create", "-f", "-"],
        &WIDGETS.replace("    storage: true\n", "    storage: false\n"),
    ));
    assert!(
        err.contains("must have exactly one version marked as storage version"),
        "{err}"
    );
    let err = fails(s.kubectl_stdin(
        &["create", "-f", "-"],
        &WIDGETS.replace(
            "              size: {type: string, default: small}\n",
            "              size: {default: small}\n",
        ),
    ));
    assert!(err.contains("spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[size].type: Required value: must not be empty for specified object fields"), "{err}");

    // A second definition asking for a taken short name is not accepted.
    ok(s.kubectl_stdin(&["apply", "-f", "-"], WIDGETS));
    established(&s, "widgets.example.com").await;
    let gadgets = WIDGETS
        .replace("widgets", "gadgets")
        .replace("singular: widget", "singular: gadget")
        .replace("kind: Widget", "kind: Gadget");
    ok(s.kubectl_stdin(&["apply", "-f", "-"], &gadgets));
    let crd = crd_condition(&s, "gadgets.example.com", "NamesAccepted", "False").await;
    let conds = crd["status"]["conditions"].as_array().unwrap();
    let names = conds.iter().find(|c| c["type"] == "NamesAccepted").unwrap();
    assert_eq!(names["reason"], "ShortNamesConflict", "{crd}");
    assert_eq!(names["message"], "\"wd\" is already in use", "{crd}");
    let est = conds.iter().find(|c| c["type"] == "Established").unwrap();
    assert_eq!(est["status"], "False", "{crd}");
    let raw = s.kubectl(&["get", "--raw", "/apis/example.com/v1/gadgets"]);
    assert!(!raw.status.success(), "an unaccepted kind is served");
}

/// kube-rs `#[derive(CustomResource)]` types through typed clients.
#[tokio::test(flavor = "multi_thread")]
async fn derived_custom_resources_work_through_kube_rs() {
    let s = TestServer::start().await;
    api_suite::derived_custom_resources(&s).await;
}

/// Hostile or careless definitions get a clear 4xx and leave nothing
/// half-stored; the server keeps serving.
#[tokio::test(flavor = "multi_thread")]
async fn hostile_definitions_and_objects_are_refused_cleanly() {
    let s = TestServer::start().await;
    let crd = |name: &str, schema: Value| {
        serde_json::json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{name}s.hostile.example.com")},
            "spec": {"group": "hostile.example.com", "scope": "Namespaced",
                "names": {"plural": format!("{name}s"), "kind": name[..1].to_uppercase() + &name[1..]},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": schema}}]}})
        .to_string()
    };

    // Nested 1,000 levels: refused, nothing stored.
    let mut deep = serde_json::json!({"type": "string"});
    for _ in 0..1000 {
        deep = serde_json::json!({"type": "object", "properties": {"a": deep}});
    }
    let err = fails(s.kubectl_stdin(
        &["create", "--validate=false", "-f", "-"],
        &crd("deep", deep),
    ));
    assert!(
        err.contains("BadRequest") || err.contains("recursion limit") || err.contains("nested"),
        "{err}"
    );
    let err = fails(s.kubectl(&["get", "crd", "deeps.hostile.example.com"]));
    assert!(err.contains("NotFound"), "{err}");

    // About 1 MiB of schema (20,000 properties): taken, and served.
    let mut props = serde_json::Map::new();
    for i in 0..20_000 {
        props.insert(
            format!("field{i:05}"),
            serde_json::json!({"type": "string", "maxLength": 10}),
        );
    }
    let big = serde_json::json!({"type": "object", "properties": {"spec": {"type": "object", "properties": props}}});
    ok(s.kubectl_stdin(&["create", "--validate=false", "-f", "-"], &crd("big", big)));
    established(&s, "bigs.hostile.example.com").await;

    // A pattern that backtracks catastrophically elsewhere is linear here.
    let pattern = serde_json::json!({"type": "object", "properties": {"spec": {"type": "object",
        "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}}}});
    let body = crd("regex", pattern);
    // Objects before their kind is established (or defined) are not found.
    let early = fails(s.kubectl_stdin(
        &["create", "--validate=false", "-f", "-"],
        "apiVersion: hostile.example.com/v1\nkind: Regex\nmetadata: {name: r}\nspec: {s: a}\n",
    ));
    assert!(
        early.contains("no matches for kind \"Regex\"") || early.contains("NotFound"),
        "{early}"
    );
    ok(s.kubectl_stdin(&["create", "-f", "-"], &body));
    established(&s, "regexs.hostile.example.com").await;
    let evil = format!(
        "apiVersion: hostile.example.com/v1\nkind: Regex\nmetadata: {{name: r}}\nspec: {{s: {}!}}\n",
        "a".repeat(100_000)
    );
    let err = fails(s.kubectl_stdin(&["create", "-f", "-"], &evil));
    assert!(
        err.contains("spec.s in body should match '^(a+)+$'"),
        "{err}"
    );
    // So is the same pattern in a CEL rule.
    let rule = serde_json::json!({"type": "object", "properties": {"spec": {"type": "object",
        "properties": {"s": {"type": "string"}},
        "x-kubernetes-validations": [{"rule": "self.s.matches('^(a+)+$')"}]}}});
    ok(s.kubectl_stdin(&["create", "-f", "-"], &crd("celregex", rule)));
    established(&s, "celregexs.hostile.example.com").await;
    let err = fails(s.kubectl_stdin(
        &["create", "-f", "-"],
        &evil.replace("kind: Regex", "kind: Celregex"),
    ));
    assert!(
        err.contains("spec: Invalid value: \"object\": failed rule: self.s.matches('^(a+)+$')"),
        "{err}"
    );

    // A non-structural schema and a bad printer column, with upstream's causes.
    let err = fails(s.kubectl_stdin(
        &["create", "-f", "-"],
        &crd("loose", serde_json::json!({"type": "object", "properties": {"spec": {"properties": {"x": {"type": "string"}}}}})),
    ));
    assert!(err.contains("spec.versions[0].schema.openAPIV3Schema.properties[spec].type: Required value: must not be empty for specified object fields"), "{err}");
    ok(s.kubectl(&["get", "ns", "default"]));
}

/// Two served versions share the stored objects (conversion `None`): each
/// is read with its own apiVersion, stored at the storage version;
/// discovery prefers the GA version; selectable fields filter lists.
#[tokio::test(flavor = "multi_thread")]
async fn versions_share_objects_and_fields_select() {
    let s = TestServer::start().await;
    let schema = r#"{"openAPIV3Schema": {"type": "object", "properties": {"spec": {"type": "object",
        "properties": {"color": {"type": "string"}}}}}}"#;
    let crd = format!(
        r#"{{"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {{"name": "paints.example.com"}},
        "spec": {{"group": "example.com", "scope": "Cluster",
            "names": {{"plural": "paints", "kind": "Paint"}},
            "versions": [
                {{"name": "v1beta1", "served": true, "storage": false, "schema": {schema}}},
                {{"name": "v1", "served": true, "storage": true, "schema": {schema},
                  "selectableFields": [{{"jsonPath": ".spec.color"}}]}}]}}}}"#
    );
    ok(s.kubectl_stdin(&["apply", "-f", "-"], &crd));
    established(&s, "paints.example.com").await;
    let group = json(ok(s.kubectl(&["get", "--raw", "/apis/example.com"])));
    assert_eq!(group["preferredVersion"]["version"], "v1", "{group}");
    let versions: Vec<&str> = group["versions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["version"].as_str())
        .collect();
    assert_eq!(versions, ["v1", "v1beta1"], "{group}");

    ok(s.kubectl_stdin(
        &["create", "-f", "-"],
        "apiVersion: example.com/v1beta1\nkind: Paint\nmetadata: {name: red}\nspec: {color: red}\n",
    ));
    ok(s.kubectl_stdin(
        &["create", "-f", "-"],
        "apiVersion: example.com/v1\nkind: Paint\nmetadata: {name: blue}\nspec: {color: blue}\n",
    ));
    let old = json(ok(s.kubectl(&[
        "get",
        "--raw",
        "/apis/example.com/v1beta1/paints/blue",
    ])));
    assert_eq!(old["apiVersion"], "example.com/v1beta1", "{old}");
    let new = json(ok(s.kubectl(&[
        "get",
        "--raw",
        "/apis/example.com/v1/paints/red",
    ])));
    assert_eq!(new["apiVersion"], "example.com/v1", "{new}");

    let listed = json(ok(s.kubectl(&[
        "get",
        "--raw",
        "/apis/example.com/v1/paints?fieldSelector=spec.color%3Dred",
    ])));
    let names: Vec<&str> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["metadata"]["name"].as_str())
        .collect();
    assert_eq!(names, ["red"], "{listed}");
    let err = fails(s.kubectl(&[
        "get",
        "--raw",
        "/apis/example.com/v1beta1/paints?fieldSelector=spec.color%3Dred",
    ]));
    assert!(
        err.contains("field label not supported: \"spec.color\""),
        "{err}"
    );
}

/// A custom object's own finalizer holds its definition's deletion: the
/// definition is Terminating, new objects are refused, and both go once
/// the finalizer is removed.
#[tokio::test(flavor = "multi_thread")]
async fn object_finalizers_hold_the_definition_deletion() {
    let s = TestServer::start().await;
    ok(s.kubectl_stdin(&["apply", "-f", "-"], WIDGETS));
    established(&s, "widgets.example.com").await;
    ok(s.kubectl_stdin(
        &["create", "-f", "-"],
        "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: held, finalizers: [example.com/keep]}\nspec: {color: red}\n",
    ));
    ok(s.kubectl(&["delete", "crd", "widgets.example.com", "--wait=false"]));
    let crd = crd_condition(&s, "widgets.example.com", "Terminating", "True").await;
    assert!(crd["metadata"]["deletionTimestamp"].is_string(), "{crd}");
    let held = json(ok(s.kubectl(&["get", "widget", "held", "-o", "json"])));
    assert!(held["metadata"]["deletionTimestamp"].is_string(), "{held}");
    let err = fails(s.kubectl_stdin(&["create", "-f", "-"], &widget("late", "  color: blue\n")));
    assert!(
        err.contains("create not allowed while custom resource definition is terminating"),
        "{err}"
    );

    ok(s.kubectl(&[
        "patch",
        "widget",
        "held",
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":null}}"#,
    ]));
    assert!(
        gone(&s, "widgets.example.com", 20).await,
        "the definition stayed after its last object went"
    );
}

const SHELVES: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: shelves.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: shelves, singular: shelf, kind: Shelf}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-validations:
        - {rule: "self.metadata.name.startsWith('shelf-')", message: "shelf names start with shelf-"}
        properties:
          spec:
            type: object
            x-kubernetes-validations:
            - rule: "self.minBooks <= self.maxBooks"
              messageExpression: "'minBooks ' + string(self.minBooks) + ' is above maxBooks ' + string(self.maxBooks)"
            - {rule: "self.material == oldSelf.material", message: "material is immutable", reason: FieldValueForbidden, fieldPath: .material}
            properties:
              minBooks: {type: integer}
              maxBooks: {type: integer}
              material: {type: string, maxLength: 20}
              scanner:
                type: string
                maxLength: 45
                x-kubernetes-validations:
                - {rule: "isIP(self)", message: "scanner must be an IP address"}
              labels:
                type: array
                maxItems: 10
                items: {type: string, maxLength: 10}
                x-kubernetes-validations:
                - {rule: "self.all(l, l == l.lowerAscii())", message: "labels are lower case"}
                - {rule: "self.isSorted()", message: "labels are sorted"}
          status:
            type: object
            properties:
              books: {type: integer}
            x-kubernetes-validations:
            - {rule: "self.books >= 0", message: "books cannot be negative"}
"#;

fn shelf(name: &str, spec: &str) -> String {
    format!("apiVersion: example.com/v1\nkind: Shelf\nmetadata:\n  name: {name}\nspec: {spec}\n")
}

/// `x-kubernetes-validations` rules run on creates, updates (transition
/// rules with `oldSelf`) and status writes, with the rule's message,
/// messageExpression, reason and fieldPath; rules that do not compile or
/// could cost too much are refused with the definition.
#[tokio::test(flavor = "multi_thread")]
async fn validation_rules_run_with_their_messages_and_limits() {
    let s = TestServer::start().await;
    ok(s.kubectl_stdin(&["apply", "-f", "-"], SHELVES));
    established(&s, "shelves.example.com").await;
    let good = "{minBooks: 1, maxBooks: 2, material: oak, labels: [x]}";
    ok(s.kubectl_stdin(&["apply", "-f", "-"], &shelf("shelf-a", good)));
    // Kubernetes' list and IP functions.
    ok(s.kubectl_stdin(
        &["apply", "-f", "-"],
        &shelf(
            "shelf-ip",
            "{minBooks: 1, maxBooks: 2, material: oak, scanner: 'fd00::1', labels: [a, b]}",
        ),
    ));

    let bad = [
        (
            "box",
            good,
            "<nil>: Invalid value: \"object\": shelf names start with shelf-",
        ),
        (
            "shelf-b",
            "{minBooks: 5, maxBooks: 2, material: oak}",
            "spec: Invalid value: \"object\": minBooks 5 is above maxBooks 2",
        ),
        (
            "shelf-c",
            "{minBooks: 1, maxBooks: 2, material: oak, labels: [Up]}",
            "spec.labels: Invalid value: \"array\": labels are lower case",
        ),
        (
            "shelf-d",
            "{minBooks: 1, maxBooks: 2, material: oak, labels: [b, a]}",
            "spec.labels: Invalid value: \"array\": labels are sorted",
        ),
        (
            "shelf-e",
            "{minBooks: 1, maxBooks: 2, material: oak, scanner: 10.0.0.01}",
            "spec.scanner: Invalid value: \"string\": scanner must be an IP address",
        ),
    ];
    for (name, spec, want) in bad {
        let err = fails(s.kubectl_stdin(&["create", "-f", "-"], &shelf(name, spec)));
        assert!(err.contains(want), "{name}: {err}");
    }

    // A transition rule compares with the stored object, on apply and
    // on patch; an unchanged field passes.
    let err = fails(s.kubectl_stdin(
        &["apply", "-f", "-"],
        &shelf("shelf-a", "{minBooks: 1, maxBooks: 2, material: pine}"),
    ));
    assert!(
        err.contains("spec.material: Forbidden: material is immutable"),
        "{err}"
    );
    let err = fails(s.kubectl(&[
        "patch",
        "shelf",
        "shelf-a",
        "--type=merge",
        "-p",
        r#"{"spec":{"material":"pine"}}"#,
    ]));
    assert!(err.contains("material is immutable"), "{err}");
    ok(s.kubectl(&[
        "patch",
        "shelf",
        "shelf-a",
        "--type=merge",
        "-p",
        r#"{"spec":{"maxBooks":3}}"#,
    ]));

    // Status writes are checked by the status schema's rules.
    let err = fails(s.kubectl(&[
        "patch",
        "shelf",
        "shelf-a",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"books":-1}}"#,
    ]));
    assert!(
        err.contains("status: Invalid value: \"object\": books cannot be negative"),
        "{err}"
    );
    ok(s.kubectl(&[
        "patch",
        "shelf",
        "shelf-a",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"books":4}}"#,
    ]));

    // Definitions whose rules cannot run are refused, naming the rule.
    let cases = [
        (
            "self.minBooks <= self.nope",
            "spec.versions[0].schema.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule: Invalid value: \"self.minBooks <= self.nope\": compilation failed: ERROR: <input>:1:22: undefined field 'nope'",
        ),
        (
            "self.minBooks <=",
            "x-kubernetes-validations[0].rule: Invalid value: \"self.minBooks <=\": compilation failed: ERROR: <input>:1:",
        ),
        (
            "url(self.material).getHost() != ''",
            "compilation failed: ERROR: <input>:1:4: undeclared reference to 'url' (in container '')",
        ),
    ];
    for (rule, want) in cases {
        let crd = SHELVES
            .replace("shelves", "crates")
            .replace("shelf", "crate")
            .replace("Shelf", "Crate")
            .replace("\"self.minBooks <= self.maxBooks\"", &format!("{rule:?}"));
        let err = fails(s.kubectl_stdin(&["create", "-f", "-"], &crd));
        assert!(err.contains(want), "{rule}: {err}");
    }
    // Unbounded lists of unbounded strings, compared pairwise.
    let costly = SHELVES
        .replace("shelves", "crates")
        .replace("shelf", "crate")
        .replace("Shelf", "Crate")
        .replace("                maxItems: 10\n", "")
        .replace("{type: string, maxLength: 10}", "{type: string}")
        .replace(
            "self.all(l, l == l.lowerAscii())",
            "self.all(a, self.exists(b, a == b + b))",
        );
    let err = fails(s.kubectl_stdin(&["create", "-f", "-"], &costly));
    assert!(
        err.contains("properties[labels].x-kubernetes-validations[0].rule: Forbidden: estimated rule cost exceeds budget by factor of more than 100x (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)"),
        "{err}"
    );
    let out = s.kubectl(&["get", "crd", "crates.example.com"]);
    assert!(!out.status.success(), "a refused definition was stored");
}
