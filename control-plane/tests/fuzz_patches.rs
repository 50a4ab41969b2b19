//! Fuzzing the three patch types (JSON patch, JSON merge patch, strategic
//! merge patch, and server-side apply's approximation of the last) with
//! proptest: no patch panics, runs away or grows the object without bound,
//! every refusal is a 400 or a 422 (413 for too many operations), and the
//! patches mean what their RFCs and upstream say.
//!
//! Patches are generated against Kubernetes-shaped objects (lists merged
//! by key, directives at every level) and then mutated with random bytes.
//! The adversarial cases the hardening issue names (JSON patch move/copy
//! to and from the root and into a value's own children, copy bombs,
//! merge patch nulls, `$patch: delete`, `$retainKeys`, `$setElementOrder`)
//! are fixed tests; `tests/corpus/patches/` holds seeds replayed on every
//! run, and proptest's failures persist in
//! `tests/proptest-regressions/fuzz_patches.txt`.

use crate::api;
use crate::fuzz;

use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use serde_json::{json, Map, Value};
use skiff_control_plane::apiserver::patch::{self, PatchType};

const REGRESSIONS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/proptest-regressions/fuzz_patches.txt"
);

const TYPES: &[PatchType] = &[
    PatchType::Json,
    PatchType::Merge,
    PatchType::Strategic,
    PatchType::Apply,
];

/// Kinds whose strategic merge has list rules, and one without.
const KINDS: &[&str] = &["Pod", "Deployment", "Node", "Service", "ConfigMap"];

const NAMES: &[&str] = &["a", "b", "c", "d"];

// ---- generators ------------------------------------------------------------

fn non_null() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<bool>().prop_map(Value::from),
        (-3i64..100).prop_map(Value::from),
        prop::sample::select(NAMES).prop_map(Value::from),
        "[a-z0-9]{0,6}".prop_map(Value::from),
    ]
}

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![1 => Just(Value::Null), 4 => non_null()]
}

/// Plain values (no nulls when `nulls` is false) over a small key set, so
/// that two of them share keys.
fn plain(nulls: bool) -> impl Strategy<Value = Value> {
    // Chosen, not filtered: filtering rejects would add up over many cases.
    let leaf = if nulls {
        scalar().boxed()
    } else {
        non_null().boxed()
    };
    leaf.prop_recursive(4, 32, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-e]", inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn plain_object(nulls: bool) -> impl Strategy<Value = Value> {
    prop::collection::btree_map("[a-e]", plain(nulls), 0..5)
        .prop_map(|m| Value::Object(m.into_iter().collect()))
}

/// A container with a name from [`NAMES`] and lists merged by key.
fn container() -> impl Strategy<Value = Value> {
    (
        prop::sample::select(NAMES),
        "[a-z]{1,5}(:[0-9])?",
        prop::collection::btree_map(prop::sample::select(NAMES), "[0-9]{0,2}", 0..3),
        prop::collection::btree_set(1..4i64, 0..3),
    )
        .prop_map(|(name, image, env, ports)| {
            let env: Vec<Value> = env
                .into_iter()
                .map(|(n, v)| json!({"name": n, "value": v}))
                .collect();
            let ports: Vec<Value> = ports
                .into_iter()
                .map(|p| json!({"containerPort": p}))
                .collect();
            json!({"name": name, "image": image, "env": env, "ports": ports})
        })
}

/// An object as stored: metadata with labels, finalizers and owners, a
/// pod spec (or a workload's template of one), and a generated rest.
fn doc() -> impl Strategy<Value = (Value, &'static str)> {
    (
        prop::sample::select(KINDS),
        prop::collection::btree_map("[a-c]", "[a-z]{0,3}", 0..3),
        prop::collection::vec(prop::sample::select(NAMES), 0..4),
        prop::collection::vec(container(), 0..4),
        prop::collection::vec("[a-c]", 0..3),
        plain_object(false),
    )
        .prop_map(|(kind, labels, finalizers, containers, nodes, extra)| {
            let spec = json!({
                "containers": containers,
                "volumes": [{"name": "v", "emptyDir": {}}],
                "tolerations": [{"key": "k"}],
                "nodeName": "n1",
                "extra": extra,
            });
            let spec = match kind {
                "Deployment" => json!({"replicas": 1, "template": {"spec": spec}}),
                "Node" => json!({"podCIDRs": nodes, "unschedulable": false}),
                "Service" => json!({"ports": [{"port": 80}, {"port": 443}]}),
                _ => spec,
            };
            let doc = json!({
                "apiVersion": "v1",
                "kind": kind,
                "metadata": {
                    "name": "x",
                    "labels": labels,
                    "finalizers": finalizers,
                    "ownerReferences": [{"uid": "u1", "name": "o"}],
                },
                "spec": spec,
                "status": {"conditions": [{"type": "Ready", "status": "True"}]},
            });
            (doc, kind)
        })
}

/// Every JSON pointer into `v`, the root ("") first.
fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
    out.push(at.clone());
    match v {
        Value::Object(m) => {
            for (k, c) in m {
                let k = k.replace('~', "~0").replace('/', "~1");
                pointers(c, format!("{at}/{k}"), out);
            }
        }
        Value::Array(a) => {
            for (i, c) in a.iter().enumerate() {
                pointers(c, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

/// A pointer for a JSON patch operation, resolved against the document:
/// an existing one, a new child of one, or one that is odd.
#[derive(Debug, Clone)]
enum Ptr {
    Existing(prop::sample::Index),
    Child(prop::sample::Index, &'static str),
    Odd(&'static str),
}

const CHILDREN: &[&str] = &[
    "-",
    "0",
    "1",
    "new",
    "~0~1",
    "",
    "99999999999999999999",
    "01",
];
const ODD: &[&str] = &[
    "",
    "/",
    "/-",
    "nope",
    "/metadata/~2",
    "/spec/containers/-",
    "/spec/containers/-1",
    "/spec/containers/18446744073709551616",
    "/metadata/name/x",
];

fn ptr() -> impl Strategy<Value = Ptr> {
    prop_oneof![
        4 => any::<prop::sample::Index>().prop_map(Ptr::Existing),
        2 => (any::<prop::sample::Index>(), prop::sample::select(CHILDREN)).prop_map(|(i, c)| Ptr::Child(i, c)),
        1 => prop::sample::select(ODD).prop_map(Ptr::Odd),
    ]
}

fn resolve(p: &Ptr, all: &[String]) -> String {
    match p {
        Ptr::Existing(i) => i.get(all).clone(),
        Ptr::Child(i, c) => format!("{}/{c}", i.get(all)),
        Ptr::Odd(s) => s.to_string(),
    }
}

const OPS: &[&str] = &["add", "remove", "replace", "move", "copy", "test", "bogus"];

/// A JSON patch of up to six operations on `doc`.
fn json_patch(doc: Value) -> impl Strategy<Value = Value> {
    let mut all = Vec::new();
    pointers(&doc, String::new(), &mut all);
    let op = (
        prop::sample::select(OPS),
        ptr(),
        ptr(),
        plain(true),
        any::<bool>(),
    );
    prop::collection::vec(op, 0..6).prop_map(move |ops| {
        let ops: Vec<Value> = ops
            .iter()
            .map(|(op, path, from, value, test_real)| {
                let path = resolve(path, &all);
                let mut o = json!({"op": op, "path": path});
                match *op {
                    "move" | "copy" => o["from"] = json!(resolve(from, &all)),
                    // A test that passes, half the time.
                    "test" if *test_real => {
                        o["value"] = doc.pointer(&path).cloned().unwrap_or(Value::Null);
                    }
                    "remove" => {}
                    _ => o["value"] = value.clone(),
                }
                o
            })
            .collect();
        Value::Array(ops)
    })
}

/// Keys a strategic merge patch names: fields with rules, directives, and
/// fields without.
const PATCH_KEYS: &[&str] = &[
    "metadata",
    "labels",
    "finalizers",
    "ownerReferences",
    "spec",
    "template",
    "containers",
    "initContainers",
    "env",
    "ports",
    "volumes",
    "tolerations",
    "podCIDRs",
    "status",
    "conditions",
    "name",
    "image",
    "value",
    "containerPort",
    "port",
    "uid",
    "type",
    "emptyDir",
    "hostPath",
    "$patch",
    "$retainKeys",
    "$setElementOrder/containers",
    "$setElementOrder/env",
    "$setElementOrder/finalizers",
    "$deleteFromPrimitiveList/finalizers",
    "$deleteFromPrimitiveList/podCIDRs",
    "a",
    "b",
];

const DIRECTIVES: &[&str] = &["delete", "replace", "merge", "bogus"];

/// A directive's value, decided by its key; `seed` picks among choices.
fn directive(key: &str, seed: &Value) -> Option<Value> {
    let n = seed.to_string().len();
    let name = |i: usize| NAMES[i % NAMES.len()];
    Some(match key {
        "$patch" => json!(DIRECTIVES[n % DIRECTIVES.len()]),
        "$retainKeys" => json!(PATCH_KEYS[n % 8..n % 8 + 3]),
        // Primitive lists are ordered by value, lists of objects by key.
        k if k.starts_with("$setElementOrder/") => match n % 3 {
            0 => json!([name(n), name(n + 1)]),
            _ => json!([{"name": name(n)}, {"name": name(n + 2)}, {"name": name(n + 1)}]),
        },
        k if k.starts_with("$deleteFromPrimitiveList/") => json!([name(n), "c"]),
        _ => return None,
    })
}

/// A list item that merges by key: named, sometimes with `$patch`.
fn item(inner: impl Strategy<Value = Value> + Clone) -> impl Strategy<Value = Value> {
    (
        prop::sample::select(&["name", "containerPort", "uid", "type", "port"][..]),
        prop::sample::select(NAMES),
        prop::option::of(prop::sample::select(DIRECTIVES)),
        prop::collection::btree_map(prop::sample::select(PATCH_KEYS), inner, 0..3),
    )
        .prop_map(|(key, name, patch, rest)| {
            let mut m: Map<String, Value> =
                rest.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
            m.insert(key.into(), json!(name));
            if let Some(p) = patch {
                m.insert("$patch".into(), json!(p));
            }
            Value::Object(m)
        })
}

/// A strategic merge patch: objects over [`PATCH_KEYS`], lists of keyed
/// items, nulls, and directives where their keys fall.
fn smp() -> impl Strategy<Value = Value> {
    let leaf = scalar();
    let value = leaf.prop_recursive(5, 40, 5, |inner| {
        prop_oneof![
            2 => prop::collection::btree_map(prop::sample::select(PATCH_KEYS), inner.clone(), 0..5)
                .prop_map(|m| {
                    Value::Object(
                        m.into_iter()
                            .map(|(k, v)| (k.to_string(), directive(k, &v).unwrap_or(v)))
                            .collect(),
                    )
                }),
            2 => prop::collection::vec(item(inner.clone()), 0..4).prop_map(Value::Array),
            1 => prop::collection::vec(inner, 0..3).prop_map(Value::Array),
        ]
    });
    prop::collection::btree_map(prop::sample::select(PATCH_KEYS), value, 0..5).prop_map(|m| {
        Value::Object(
            m.into_iter()
                .map(|(k, v)| (k.to_string(), directive(k, &v).unwrap_or(v)))
                .collect(),
        )
    })
}

/// A document, a patch type and a patch body for it (as generated, or
/// mutated), the body sometimes YAML where a type takes it.
fn case() -> impl Strategy<Value = (Value, &'static str, PatchType, Vec<u8>)> {
    doc().prop_flat_map(|(doc, kind)| {
        let pt = prop::sample::select(TYPES);
        let body = prop_oneof![
            json_patch(doc.clone()).prop_map(|p| serde_json::to_vec(&p).expect("json")),
            smp().prop_map(|p| serde_json::to_vec(&p).expect("json")),
            smp().prop_map(|p| serde_saphyr::to_string(&p).expect("yaml").into_bytes()),
            plain_object(true).prop_map(|p| serde_json::to_vec(&p).expect("json")),
        ];
        (
            Just(doc),
            Just(kind),
            pt,
            fuzz::mutated(body, fuzz::TEXT_TOKENS),
        )
    })
}

// ---- what must hold --------------------------------------------------------

/// Object members that are null, outside arrays (whose elements a patch
/// may set to anything).
fn null_members(v: &Value, at: &str, out: &mut Vec<String>) {
    if let Value::Object(m) = v {
        for (k, c) in m {
            if c.is_null() {
                out.push(format!("{at}.{k}"));
            }
            null_members(c, &format!("{at}.{k}"), out);
        }
    }
}

/// Keys that are patch directives (`$patch`, `$retainKeys`, ...).
fn directive_keys(v: &Value, at: &str, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, c) in m {
                if k.starts_with('$') {
                    out.push(format!("{at}.{k}"));
                }
                directive_keys(c, &format!("{at}.{k}"), out);
            }
        }
        Value::Array(a) => {
            for (i, c) in a.iter().enumerate() {
                directive_keys(c, &format!("{at}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// What the server answers for a patch error.
fn status_code(e: &patch::Error) -> u16 {
    match e {
        patch::Error::Malformed(_) => 400,
        patch::Error::Apply(_) => 422,
        patch::Error::TooLarge(_) => 413,
    }
}

fn check_patch(doc: &Value, kind: &str, pt: PatchType, body: &[u8]) -> Result<(), TestCaseError> {
    match patch::apply(doc, body, pt, kind) {
        Ok(out) => {
            prop_assert!(out.is_object(), "{pt:?} made a non-object: {out}");
            if pt != PatchType::Json {
                let mut nulls = Vec::new();
                null_members(&out, "", &mut nulls);
                prop_assert!(nulls.is_empty(), "{pt:?} left nulls at {nulls:?}: {out}");
            }
            if matches!(pt, PatchType::Strategic | PatchType::Apply) {
                let mut keys = Vec::new();
                directive_keys(&out, "", &mut keys);
                prop_assert!(keys.is_empty(), "directives kept at {keys:?}: {out}");
            }
        }
        Err(e) => {
            let code = status_code(&e);
            prop_assert!(matches!(code, 400 | 413 | 422));
            prop_assert!(!e.to_string().is_empty());
        }
    }
    Ok(())
}

/// The merge patch that turns `a` into `b` (RFC 7386's inverse).
fn diff(a: &Value, b: &Value) -> Value {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            let mut p = Map::new();
            for k in a.keys().filter(|k| !b.contains_key(*k)) {
                p.insert(k.clone(), Value::Null);
            }
            for (k, bv) in b {
                match a.get(k) {
                    Some(av) if av == bv => {}
                    Some(av) if av.is_object() && bv.is_object() => {
                        p.insert(k.clone(), diff(av, bv));
                    }
                    _ => {
                        p.insert(k.clone(), bv.clone());
                    }
                }
            }
            Value::Object(p)
        }
        (_, b) => b.clone(),
    }
}

proptest! {
    #![proptest_config(fuzz::config(REGRESSIONS, 15000))]

    /// No patch panics; refusals are typed; merges leave no nulls and
    /// strategic merges no directives.
    #[test]
    fn any_patch_applies_or_is_refused_typed((doc, kind, pt, body) in case()) {
        check_patch(&doc, kind, pt, &body)?;
    }

    /// The merge patch from A to B turns A into B, as a merge patch and as
    /// a strategic merge of a kind without list rules.
    #[test]
    fn merge_patch_round_trips(a in plain_object(false), b in plain_object(false)) {
        let p = serde_json::to_vec(&diff(&a, &b)).expect("json");
        let merged = patch::apply(&a, &p, PatchType::Merge, "ConfigMap");
        prop_assert_eq!(merged.as_ref().ok(), Some(&b), "{:?}", merged);
        let strategic = patch::apply(&a, &p, PatchType::Strategic, "ConfigMap");
        prop_assert_eq!(strategic.as_ref().ok(), Some(&b), "{:?}", strategic);
    }

    /// JSON patch semantics on existing pointers: a test of the current
    /// value passes, a copy duplicates, a move relocates (never into the
    /// value's own children).
    #[test]
    fn json_patch_copy_move_and_test((doc, kind) in doc(), from in any::<prop::sample::Index>(), to in any::<prop::sample::Index>()) {
        let mut all = Vec::new();
        pointers(&doc, String::new(), &mut all);
        let (from, to) = (from.get(&all).clone(), to.get(&all).clone());
        let value = doc.pointer(&from).cloned().expect("exists");
        let body = |ops: Value| serde_json::to_vec(&ops).expect("json");

        let test = body(json!([{"op": "test", "path": from, "value": value}]));
        prop_assert_eq!(patch::apply(&doc, &test, PatchType::Json, kind).ok(), Some(doc.clone()));

        let copy = body(json!([{"op": "copy", "from": from, "path": to}]));
        match patch::apply(&doc, &copy, PatchType::Json, kind) {
            Ok(out) => prop_assert_eq!(out.pointer(&to), Some(&value)),
            // Copying over the root with something not an object.
            Err(patch::Error::Apply(_)) => prop_assert!(to.is_empty() && !value.is_object()),
            Err(e) => prop_assert!(false, "{e}"),
        }

        // RFC 6902 4.4: a move is a remove at `from` followed by an add of
        // the removed value at `to`, except that `to` may not be inside
        // `from`.
        let mov = body(json!([{"op": "move", "from": from, "path": to}]));
        let by_parts = body(json!([
            {"op": "remove", "path": from},
            {"op": "add", "path": to, "value": value},
        ]));
        let into_itself = to.starts_with(&format!("{from}/")) || (from.is_empty() && !to.is_empty());
        let moved = patch::apply(&doc, &mov, PatchType::Json, kind);
        if into_itself {
            prop_assert!(matches!(moved, Err(patch::Error::Apply(_))), "moved {from} into {to}: {moved:?}");
        } else {
            let parts = patch::apply(&doc, &by_parts, PatchType::Json, kind);
            prop_assert_eq!(moved.ok(), parts.ok(), "move {} -> {}", from, to);
        }
    }
}

// ---- adversarial inputs ----------------------------------------------------

fn apply_json(doc: &Value, ops: Value) -> patch::Result<Value> {
    patch::apply(
        doc,
        &serde_json::to_vec(&ops).expect("json"),
        PatchType::Json,
        "Pod",
    )
}

fn pod() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "finalizers": ["a", "b"]},
        "spec": {"containers": [{"name": "a", "image": "i"}, {"name": "b", "image": "j"}]},
    })
}

/// RFC 6902 at the root and into a value's own children.
#[test]
fn json_patch_root_and_own_children() {
    let doc = pod();
    // Moving the root into a child of itself: refused.
    assert!(matches!(
        apply_json(&doc, json!([{"op": "move", "from": "", "path": "/x"}])),
        Err(patch::Error::Apply(_))
    ));
    assert!(matches!(
        apply_json(
            &doc,
            json!([{"op": "move", "from": "/spec", "path": "/spec/x"}])
        ),
        Err(patch::Error::Apply(_))
    ));
    // Copying into one's own child is fine: the copy is taken first.
    let out = apply_json(&doc, json!([{"op": "copy", "from": "", "path": "/x"}])).expect("copy");
    assert_eq!(out["x"], doc);
    let out = apply_json(
        &doc,
        json!([{"op": "copy", "from": "/spec", "path": "/spec/x"}]),
    )
    .expect("copy");
    assert_eq!(out["spec"]["x"], doc["spec"]);
    // A child moved over the root becomes the document.
    let out = apply_json(&doc, json!([{"op": "move", "from": "/spec", "path": ""}])).expect("move");
    assert_eq!(out, doc["spec"]);
    // The root replaced by a non-object, or removed: refused.
    for ops in [
        json!([{"op": "replace", "path": "", "value": [1]}]),
        json!([{"op": "copy", "from": "/metadata/name", "path": ""}]),
        json!([{"op": "move", "from": "/spec/containers", "path": ""}]),
        json!([{"op": "remove", "path": ""}]),
    ] {
        assert!(
            matches!(apply_json(&doc, ops.clone()), Err(patch::Error::Apply(_))),
            "{ops}"
        );
    }
    // A move to where it already is changes nothing.
    let out = apply_json(
        &doc,
        json!([{"op": "move", "from": "/spec", "path": "/spec"}]),
    )
    .expect("move");
    assert_eq!(out, doc);
}

/// A failing operation after a move over the root: json_patch's undo
/// cannot move the value back (that would be a move into its own child)
/// and panicked, a 500; operations now apply to a copy with no undo.
#[test]
fn json_patch_failure_after_moving_over_the_root() {
    let ops = json!([
        {"op": "move", "from": "/spec/containers", "path": ""},
        {"op": "add", "path": "/spec", "value": 1},
    ]);
    assert!(matches!(
        apply_json(&pod(), ops),
        Err(patch::Error::Apply(_))
    ));
}

/// Each copy of the root doubles the document: upstream bounds what
/// copies may add (`--json-patch-max-copy-bytes`, 3 MiB) and the number
/// of operations (10 000).
#[test]
fn json_patch_copy_bombs_are_refused() {
    // To a new key each time: a copy over the last one would only add
    // the document's size once more.
    let ops: Vec<Value> = (0..64)
        .map(|i| json!({"op": "copy", "from": "", "path": format!("/x{i}")}))
        .collect();
    assert!(matches!(
        apply_json(&pod(), Value::Array(ops)),
        Err(patch::Error::Apply(_))
    ));
    let ops: Vec<Value> = (0..10_001)
        .map(|_| json!({"op": "test", "path": "/kind", "value": "Pod"}))
        .collect();
    assert!(matches!(
        apply_json(&pod(), Value::Array(ops)),
        Err(patch::Error::TooLarge(_))
    ));
}

/// A merge patch's null removes; nulls under a new key are dropped with
/// it (RFC 7386), and the whole body must be an object.
#[test]
fn merge_patch_nulls() {
    let doc = pod();
    let merge = |p: &str| patch::apply(&doc, p.as_bytes(), PatchType::Merge, "Pod");
    let out = merge(r#"{"metadata": {"finalizers": null}, "spec": null}"#).expect("merge");
    assert_eq!(
        out,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}})
    );
    let out = merge(r#"{"status": {"phase": null, "x": {"y": null}}}"#).expect("merge");
    assert_eq!(out["status"], json!({"x": {}}));
    for body in ["null", "[]", "1", "\"x\""] {
        assert!(
            matches!(merge(body), Err(patch::Error::Malformed(_))),
            "{body}"
        );
    }
}

fn smp_apply(doc: &Value, p: Value) -> patch::Result<Value> {
    patch::apply(
        doc,
        &serde_json::to_vec(&p).expect("json"),
        PatchType::Strategic,
        "Pod",
    )
}

/// `$patch: delete`, `replace` and unknown directives, at the root, on a
/// field and on a list item.
#[test]
fn strategic_patch_directives() {
    let doc = pod();
    assert!(matches!(
        smp_apply(&doc, json!({"$patch": "delete"})),
        Err(patch::Error::Apply(_))
    ));
    assert!(matches!(
        smp_apply(&doc, json!({"spec": {"$patch": "bogus"}})),
        Err(patch::Error::Malformed(_))
    ));
    let out = smp_apply(&doc, json!({"spec": {"$patch": "delete"}})).expect("patch");
    assert!(out.get("spec").is_none());
    let out = smp_apply(
        &doc,
        json!({"spec": {"$patch": "replace", "nodeName": "n"}}),
    )
    .expect("patch");
    assert_eq!(out["spec"], json!({"nodeName": "n"}));
    let out = smp_apply(
        &doc,
        json!({"spec": {"containers": [{"name": "a", "$patch": "delete"}, {"name": "zz", "$patch": "delete"}]}}),
    )
    .expect("patch");
    assert_eq!(
        out["spec"]["containers"],
        json!([{"name": "b", "image": "j"}])
    );
    let out = smp_apply(
        &doc,
        json!({"spec": {"containers": [{"name": "c", "image": "k"}, {"$patch": "replace"}]}}),
    )
    .expect("patch");
    assert_eq!(
        out["spec"]["containers"],
        json!([{"name": "c", "image": "k"}])
    );
    // Nulls in what the patch adds are dropped, as upstream drops them.
    let out = smp_apply(&doc, json!({"spec": {"affinity": {"nodeAffinity": null}, "containers": [{"name": "c", "image": null}]}}))
        .expect("patch");
    assert_eq!(out["spec"]["affinity"], json!({}));
    // Items merged by key must be objects that carry the key.
    for p in [
        json!({"spec": {"containers": [1]}}),
        json!({"spec": {"containers": [{"image": "x"}]}}),
    ] {
        assert!(
            matches!(smp_apply(&doc, p.clone()), Err(patch::Error::Apply(_))),
            "{p}"
        );
    }
}

/// `$retainKeys`, `$setElementOrder/` and `$deleteFromPrimitiveList/`,
/// with the values they expect and with others.
#[test]
fn strategic_patch_list_directives() {
    let doc = pod();
    let out = smp_apply(
        &doc,
        json!({"spec": {"$retainKeys": ["containers"], "nodeName": "n"}}),
    )
    .expect("patch");
    assert_eq!(out["spec"].as_object().map(|m| m.len()), Some(1));
    let out = smp_apply(
        &doc,
        json!({"spec": {"$setElementOrder/containers": [{"name": "b"}, {"name": "a"}]}}),
    )
    .expect("patch");
    assert_eq!(out["spec"]["containers"][0]["name"], "b");
    let out = smp_apply(&doc, json!({"metadata": {"$setElementOrder/finalizers": ["b", "a"], "$deleteFromPrimitiveList/finalizers": ["a"]}}))
        .expect("patch");
    assert_eq!(out["metadata"]["finalizers"], json!(["b"]));
    // Directives with values of the wrong shape are ignored, not fatal.
    for p in [
        json!({"spec": {"$retainKeys": "containers"}}),
        json!({"spec": {"$setElementOrder/containers": {"name": "a"}}}),
        json!({"spec": {"$setElementOrder/nope": [1, 2]}}),
        json!({"metadata": {"$deleteFromPrimitiveList/finalizers": "a"}}),
        json!({"metadata": {"$deleteFromPrimitiveList/name": ["p"]}}),
    ] {
        assert!(smp_apply(&doc, p.clone()).is_ok(), "{p}");
    }
}

/// The largest bodies the API takes (3 MiB), shaped to make list merges
/// compare every item with every other: they finish.
#[test]
fn large_list_merges_finish() {
    let n = 100_000;
    let names: Vec<Value> = (0..n).map(|i| json!({"name": format!("c{i}")})).collect();
    let out = smp_apply(&pod(), json!({"spec": {"containers": names}})).expect("patch");
    assert_eq!(
        out["spec"]["containers"].as_array().map(Vec::len),
        Some(n + 2)
    );
    let order: Vec<Value> = (0..n)
        .rev()
        .map(|i| json!({"name": format!("c{i}")}))
        .collect();
    let out = smp_apply(
        &out,
        json!({"spec": {"$setElementOrder/containers": order}}),
    )
    .expect("patch");
    assert_eq!(out["spec"]["containers"][0]["name"], format!("c{}", n - 1));
    let finalizers: Vec<Value> = (0..n).map(|i| json!(format!("f{i}"))).collect();
    let out = smp_apply(
        &pod(),
        json!({"metadata": {"finalizers": finalizers.clone()}}),
    )
    .expect("patch");
    let out = smp_apply(
        &out,
        json!({"metadata": {"$deleteFromPrimitiveList/finalizers": finalizers}}),
    )
    .expect("patch");
    assert_eq!(out["metadata"]["finalizers"], json!(["a", "b"]));
    let keys: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
    let labels: Map<String, Value> = keys.iter().map(|k| (k.clone(), json!("v"))).collect();
    let out = smp_apply(&pod(), json!({"metadata": {"labels": labels}})).expect("patch");
    let keep = &keys[..n / 2];
    let out =
        smp_apply(&out, json!({"metadata": {"labels": {"$retainKeys": keep}}})).expect("patch");
    assert_eq!(
        out["metadata"]["labels"].as_object().map(Map::len),
        Some(n / 2)
    );
}

/// Deeply nested patch bodies are refused by the parsers' depth limits.
#[test]
fn deep_patch_bodies_are_refused() {
    let n = 100_000;
    let deep = format!("{}1{}", "{\"a\":".repeat(n), "}".repeat(n));
    for pt in TYPES {
        assert!(
            patch::apply(&pod(), deep.as_bytes(), *pt, "Pod").is_err(),
            "{pt:?}"
        );
    }
}

/// Every seed in `tests/corpus/patches/`: `<name>.<type>.json`, applied to
/// the pod above.
#[test]
fn corpus_replays() {
    for (path, bytes) in fuzz::corpus(env!("CARGO_MANIFEST_DIR"), "patches") {
        let name = fuzz::name(&path);
        let types: &[PatchType] = if name.contains(".json-patch.") {
            &[PatchType::Json]
        } else {
            &[PatchType::Merge, PatchType::Strategic, PatchType::Apply]
        };
        for pt in types {
            for kind in KINDS {
                if let Err(e) = check_patch(&pod(), kind, *pt, &bytes) {
                    panic!("{name} as {pt:?} on a {kind}: {e}");
                }
            }
        }
    }
}

// ---- through the server ----------------------------------------------------

const PATCH_TYPES: &[&str] = &[
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
    "application/json",
];

/// Through the whole server (dry run, so the targets stay as created):
/// every answer to a fuzzed patch is below 500 and, when a refusal, a
/// Status with the same code.
#[test]
fn the_server_refuses_bad_patches_with_a_status_below_500() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (mut server, client) = rt.block_on(async {
        let s = api::TestServer::start().await;
        let c = s.client().await;
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "x", "labels": {"a": "b"}, "finalizers": ["a"]},
            "spec": {"containers": [{"name": "a", "image": "busybox", "env": [{"name": "a", "value": "1"}]}]},
        });
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"a": "1"}});
        for (path, obj) in [
            ("/api/v1/namespaces/default/pods", pod),
            ("/api/v1/namespaces/default/configmaps", cm),
        ] {
            let (code, _, body) = api::raw(&c, "POST", path, "application/json", serde_json::to_vec(&obj).expect("json")).await;
            assert_eq!(code, 201, "{body}");
        }
        (s, c)
    });
    let target = prop::sample::select(
        &[
            "/api/v1/namespaces/default/pods/x",
            "/api/v1/namespaces/default/configmaps/x",
            "/api/v1/namespaces/default/configmaps/absent",
        ][..],
    );
    let strategy = (case(), target, prop::sample::select(PATCH_TYPES));
    let mut runner = TestRunner::new(fuzz::config(REGRESSIONS, 1500));
    let result = runner.run(&strategy, |((_, _, _, body), path, ct)| {
        let path = format!("{path}?dryRun=All&fieldManager=fuzz");
        let (code, _, status) = rt.block_on(api::raw(&client, "PATCH", &path, ct, body));
        prop_assert!(code < 500, "{path} ({ct}): {code} {status}");
        if code >= 400 {
            prop_assert_eq!(&status["kind"], "Status", "{}", status);
            prop_assert_eq!(&status["code"], code, "{}", status);
        }
        Ok(())
    });
    rt.block_on(server.stop());
    if let Err(e) = result {
        panic!("{e}");
    }
}
