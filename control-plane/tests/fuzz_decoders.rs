//! Fuzzing the request body decoders (JSON, YAML, Kubernetes protobuf)
//! with proptest: no body panics or runs away, every refusal is a 400 or
//! a 415 (never a 500), and what decodes is what was sent.
//!
//! Structured generators (Kubernetes-shaped objects, protobuf envelopes
//! with field trees) are mutated with random bytes so that the decoders'
//! deep paths are reached as well as their error paths; the adversarial
//! inputs the hardening issue names (deep nesting, alias bombs, huge
//! numbers, duplicate keys) are fixed tests, and `tests/corpus/decoders/`
//! holds hand-picked seeds replayed on every run. Failures that proptest
//! finds are kept in `tests/proptest-regressions/fuzz_decoders.txt` and
//! replayed first. `PROPTEST_CASES` sets the number of cases.

use crate::api;
use crate::fuzz;

use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use serde_json::{json, Map, Value};
use skiff_control_plane::apiserver::resources::RESOURCES;
use skiff_control_plane::apiserver::{decode_body, model, protobuf};

const REGRESSIONS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/proptest-regressions/fuzz_decoders.txt"
);

const JSON: &str = "application/json";
const YAML: &str = "application/yaml";
const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// Content types a client may send, served and not.
const CONTENT_TYPES: &[&str] = &[
    JSON,
    "application/json; charset=utf-8",
    YAML,
    PROTOBUF,
    "",
    "text/plain",
    "application/cbor",
    "application/json-patch+json",
    ";;",
];

/// Keys that Kubernetes objects have, so generated objects look like them.
const KEYS: &[&str] = &[
    "apiVersion",
    "kind",
    "metadata",
    "name",
    "namespace",
    "labels",
    "annotations",
    "spec",
    "status",
    "data",
    "binaryData",
    "stringData",
    "containers",
    "image",
    "env",
    "value",
    "ports",
    "containerPort",
    "replicas",
    "selector",
    "matchLabels",
    "template",
    "resources",
    "limits",
    "cpu",
    "finalizers",
    "ownerReferences",
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "type",
];

// ---- generators ------------------------------------------------------------

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => prop::sample::select(KEYS).prop_map(String::from),
        2 => "[a-zA-Z0-9._/-]{0,12}",
        1 => "\\PC{0,8}",
    ]
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-z0-9.-]{0,16}",
        1 => "\\PC{0,16}",
        // Strings that YAML would take for other types unless quoted.
        1 => prop::sample::select(&["true", "no", "null", "~", "1e3", "0x1F", "-", "*a", "&a", ": x", "#"][..])
            .prop_map(String::from),
    ]
}

/// Floats with short exact decimal forms: every JSON and YAML library
/// prints and reads these back to the same bits.
fn short_float() -> impl Strategy<Value = f64> {
    (any::<i32>(), 0..12u32).prop_map(|(m, e)| f64::from(m) / f64::from(1u32 << e))
}

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        short_float().prop_map(Value::from),
        text().prop_map(Value::from),
    ]
}

/// JSON values up to a few levels deep, with Kubernetes-like keys.
fn value() -> impl Strategy<Value = Value> {
    scalar().prop_recursive(5, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(key(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// An object as a client would send it: the type of a served resource,
/// metadata, and a generated body.
fn object() -> impl Strategy<Value = Value> {
    (
        0..RESOURCES.len(),
        "[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?",
        prop::collection::btree_map("[a-z]{1,6}", "[a-z0-9]{0,6}", 0..3),
        prop::collection::btree_map(key(), value(), 0..5),
    )
        .prop_map(|(i, name, labels, rest)| {
            let def = &RESOURCES[i];
            let mut obj: Map<String, Value> = rest.into_iter().collect();
            obj.insert("apiVersion".into(), json!(def.api_version()));
            obj.insert("kind".into(), json!(def.kind));
            obj.insert(
                "metadata".into(),
                json!({"name": name, "namespace": "default", "labels": labels}),
            );
            Value::Object(obj)
        })
}

/// A protobuf field as it appears on the wire.
#[derive(Debug, Clone)]
enum Pb {
    Varint(u32, u64),
    Fixed64(u32, u64),
    Fixed32(u32, u32),
    Bytes(u32, Vec<u8>),
    Msg(u32, Vec<Pb>),
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

fn ld(num: u32, data: &[u8], out: &mut Vec<u8>) {
    varint((u64::from(num) << 3) | 2, out);
    varint(data.len() as u64, out);
    out.extend_from_slice(data);
}

fn encode(fields: &[Pb], out: &mut Vec<u8>) {
    for f in fields {
        match f {
            Pb::Varint(n, v) => {
                varint(u64::from(*n) << 3, out);
                varint(*v, out);
            }
            Pb::Fixed64(n, v) => {
                varint((u64::from(*n) << 3) | 1, out);
                out.extend_from_slice(&v.to_le_bytes());
            }
            Pb::Fixed32(n, v) => {
                varint((u64::from(*n) << 3) | 5, out);
                out.extend_from_slice(&v.to_le_bytes());
            }
            Pb::Bytes(n, b) => ld(*n, b, out),
            Pb::Msg(n, inner) => {
                let mut b = Vec::new();
                encode(inner, &mut b);
                ld(*n, &b, out);
            }
        }
    }
}

/// Field trees over the low field numbers, where the schema's fields are.
fn pb_fields() -> impl Strategy<Value = Vec<Pb>> {
    let num = prop_oneof![4 => 1..16u32, 1 => 16..64u32, 1 => any::<u32>().prop_map(|n| n >> 3)];
    let leaf = prop_oneof![
        (
            num.clone(),
            prop::sample::select(&[0, 1, 2, u64::MAX, 1 << 31, 0xffff_ffff, 1_700_000_000][..])
        )
            .prop_map(|(n, v)| Pb::Varint(n, v)),
        (num.clone(), any::<u64>()).prop_map(|(n, v)| Pb::Fixed64(n, v)),
        (num.clone(), any::<u32>()).prop_map(|(n, v)| Pb::Fixed32(n, v)),
        (num.clone(), text()).prop_map(|(n, s)| Pb::Bytes(n, s.into_bytes())),
        (num.clone(), prop::collection::vec(any::<u8>(), 0..8)).prop_map(|(n, b)| Pb::Bytes(n, b)),
    ];
    let tree = leaf.prop_recursive(6, 64, 6, move |inner| {
        (num.clone(), prop::collection::vec(inner, 0..6)).prop_map(|(n, f)| Pb::Msg(n, f))
    });
    prop::collection::vec(tree, 0..8)
}

/// Types with a protobuf table, and some without.
const PB_TYPES: &[(&str, &str)] = &[
    ("v1", "ConfigMap"),
    ("v1", "Secret"),
    ("v1", "Pod"),
    ("v1", "Namespace"),
    ("v1", "Service"),
    ("v1", "DeleteOptions"),
    ("apps/v1", "Deployment"),
    ("apps/v1", "DeleteOptions"),
    ("batch/v1", "Job"),
    ("policy/v1", "Eviction"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("authorization.k8s.io/v1", "SubjectAccessReview"),
    ("v1", "NoSuchKind"),
    ("example.com/v1", "Widget"),
];

/// The `k8s\0` envelope around an encoded object.
fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
    let mut tm = Vec::new();
    ld(1, api_version.as_bytes(), &mut tm);
    ld(2, kind.as_bytes(), &mut tm);
    let mut body = b"k8s\0".to_vec();
    ld(1, &tm, &mut body);
    ld(2, raw, &mut body);
    body
}

fn protobuf_body() -> impl Strategy<Value = Vec<u8>> {
    (prop::sample::select(PB_TYPES), pb_fields()).prop_map(|((av, kind), fields)| {
        let mut raw = Vec::new();
        encode(&fields, &mut raw);
        envelope(av, kind, &raw)
    })
}

const PB_TOKENS: &[&[u8]] = &[
    b"k8s\0",
    b"\x0a",
    b"\x12",
    b"\x0a\xff\xff\xff\xff\x0f",
    b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",
    b"\x08\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80",
    b"\x0b",
    b"\x0c",
];

/// A request body in one of the three encodings (or plain bytes), as it
/// is and mutated, with the content type to send it under.
fn body() -> impl Strategy<Value = (Vec<u8>, &'static str)> {
    let json_text = object().prop_map(|v| serde_json::to_vec(&v).expect("json"));
    let yaml_text = object().prop_map(|v| serde_saphyr::to_string(&v).expect("yaml").into_bytes());
    prop_oneof![
        3 => (fuzz::mutated(json_text, fuzz::TEXT_TOKENS), Just(JSON)),
        3 => (fuzz::mutated(yaml_text, fuzz::TEXT_TOKENS), Just(YAML)),
        3 => (fuzz::mutated(protobuf_body(), PB_TOKENS), Just(PROTOBUF)),
        1 => (
            prop::collection::vec(any::<u8>(), 0..64),
            prop::sample::select(CONTENT_TYPES)
        ),
        1 => (
            fuzz::mutated(object().prop_map(|v| serde_json::to_vec(&v).expect("json")), fuzz::TEXT_TOKENS),
            prop::sample::select(CONTENT_TYPES)
        ),
    ]
}

// ---- what must hold --------------------------------------------------------

/// A decoded body is an object; a refused one is a 400, or a 415 for a
/// media type not served (or a protobuf kind without a table).
fn check_decoded(body: &[u8], ct: &str) -> Result<(), TestCaseError> {
    match decode_body(body, ct) {
        Ok(v) => prop_assert!(v.is_object(), "decoded to a non-object: {v}"),
        Err(e) => {
            let base = ct.split(';').next().unwrap_or("").trim();
            let served = matches!(base, "application/json" | "application/yaml" | "");
            match e.code {
                400 => {}
                415 => prop_assert!(!served, "415 for {ct:?}: {e}"),
                _ => prop_assert!(false, "{} for {ct:?}: {e}", e.code),
            }
        }
    }
    Ok(())
}

/// The typed model's two ways in agree: a JSON body decoded straight
/// into the model equals the body parsed, then converted.
fn check_typed(body: &[u8]) -> Result<(), TestCaseError> {
    let Ok(parsed) = serde_json::from_slice::<Value>(body) else {
        return Ok(());
    };
    for def in RESOURCES.iter().filter(|d| d.model.is_some()) {
        let general = model::decode_typed(def, &parsed);
        if let Some(fast) = model::decode_json_body(def, body) {
            let (canonical, unknown) = general.map_err(|e| {
                TestCaseError::fail(format!(
                    "{def:?}: fast path took what the general refused: {e}"
                ))
            })?;
            prop_assert_eq!(&fast, &canonical, "{:?}", def);
            prop_assert!(unknown.is_empty(), "{def:?}: unknown fields {unknown:?}");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(fuzz::config(REGRESSIONS, 15000))]

    /// No body panics; refusals are 400 or 415.
    #[test]
    fn any_body_decodes_or_is_refused_with_400_or_415((body, ct) in body()) {
        check_decoded(&body, ct)?;
        // fieldValidation's duplicate scan reads every JSON body too.
        let _ = model::duplicate_fields(&body);
    }

    /// A JSON object encoded, then decoded, is equal; so is its YAML form,
    /// and the JSON text read as YAML (YAML 1.2 is a superset).
    #[test]
    fn objects_round_trip_through_json_and_yaml(obj in object()) {
        let text = serde_json::to_vec(&obj).expect("json");
        prop_assert_eq!(&decode_body(&text, JSON).expect("json decodes"), &obj);
        let pretty = serde_json::to_vec_pretty(&obj).expect("json");
        prop_assert_eq!(&decode_body(&pretty, JSON).expect("pretty json decodes"), &obj);
        let yaml = serde_saphyr::to_string(&obj).expect("yaml");
        let back = decode_body(yaml.as_bytes(), YAML);
        prop_assert!(back.is_ok(), "{yaml}\n{back:?}");
        prop_assert_eq!(&back.expect("checked"), &obj, "{}", yaml);
        let as_yaml = decode_body(&text, YAML);
        prop_assert!(as_yaml.is_ok(), "{}\n{as_yaml:?}", String::from_utf8_lossy(&text));
        prop_assert_eq!(&as_yaml.expect("checked"), &obj);
    }

    /// The model's fast path for JSON and its general path agree.
    #[test]
    fn typed_decoding_agrees_with_the_general_path(
        body in fuzz::mutated(object().prop_map(|v| serde_json::to_vec(&v).expect("json")), fuzz::TEXT_TOKENS)
    ) {
        check_typed(&body)?;
    }

    /// A key named twice is reported, wherever it is.
    #[test]
    fn duplicate_keys_are_found(obj in object(), key in "[a-z]{1,8}") {
        let text = serde_json::to_string(&obj).expect("json");
        // `{"k":1,` + the rest: the key is named twice when obj has it.
        let twice = format!("{{\"{key}\":1,\"{key}\":2,{}", &text[1..]);
        let found = model::duplicate_fields(twice.as_bytes());
        prop_assert!(found.contains(&key), "{found:?}");
        let v = decode_body(twice.as_bytes(), JSON).expect("json decodes");
        prop_assert!(v.get(&key).is_some());
    }

    /// A ConfigMap sent as protobuf decodes to its JSON form.
    #[test]
    fn protobuf_config_maps_decode_to_their_json(
        name in "[a-z0-9]{1,12}",
        labels in prop::collection::btree_map("[a-z./]{1,10}", "\\PC{0,8}", 0..4),
        data in prop::collection::btree_map("[a-zA-Z0-9._-]{1,10}", "\\PC{0,16}", 0..4),
    ) {
        let mut meta = Vec::new();
        ld(1, name.as_bytes(), &mut meta);
        ld(3, b"default", &mut meta);
        for (k, v) in &labels {
            let mut entry = Vec::new();
            ld(1, k.as_bytes(), &mut entry);
            ld(2, v.as_bytes(), &mut entry);
            ld(11, &entry, &mut meta);
        }
        let mut cm = Vec::new();
        ld(1, &meta, &mut cm);
        for (k, v) in &data {
            let mut entry = Vec::new();
            ld(1, k.as_bytes(), &mut entry);
            ld(2, v.as_bytes(), &mut entry);
            ld(2, &entry, &mut cm);
        }
        let mut want = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "default"},
        });
        if !labels.is_empty() {
            want["metadata"]["labels"] = json!(labels);
        }
        if !data.is_empty() {
            want["data"] = json!(data);
        }
        let got = decode_body(&envelope("v1", "ConfigMap", &cm), PROTOBUF).expect("decodes");
        prop_assert_eq!(got, want);
    }
}

// ---- adversarial inputs ----------------------------------------------------

fn code(body: &[u8], ct: &str) -> u16 {
    match decode_body(body, ct) {
        Ok(_) => 200,
        Err(e) => e.code,
    }
}

/// Nesting far past any parser's recursion limit is refused, not a stack
/// overflow: serde_json stops at 128 levels, serde-saphyr at 64.
#[test]
fn deep_nesting_is_refused() {
    let n = 100_000;
    let arrays = format!("{{\"a\":{}{}}}", "[".repeat(n), "]".repeat(n));
    let objects = format!("{}1{}", "{\"a\":".repeat(n), "}".repeat(n));
    for body in [&arrays, &objects] {
        assert_eq!(code(body.as_bytes(), JSON), 400);
        assert_eq!(code(body.as_bytes(), YAML), 400);
    }
    let block: String = (0..n)
        .map(|i| format!("{}a:\n", " ".repeat(i % 200)))
        .collect();
    assert_eq!(code(block.as_bytes(), YAML), 400);
    let dashes = format!("a:\n{}1\n", "- ".repeat(n));
    assert_eq!(code(dashes.as_bytes(), YAML), 400);
}

/// The billion laughs: nine levels of ten aliases each. serde-saphyr's
/// alias budget refuses it long before it expands.
#[test]
fn alias_bombs_are_refused() {
    let mut yaml = String::from("a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for i in 1..10 {
        let p = i - 1;
        yaml.push_str(&format!(
            "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
        ));
    }
    assert_eq!(code(yaml.as_bytes(), YAML), 400);
    // Merge keys are aliases too.
    let mut merges = String::from("b0: &b0 {x: 1, y: 2}\n");
    for i in 1..40 {
        merges.push_str(&format!(
            "b{i}: &b{i} {{<<: [*b{p}, *b{p}, *b{p}], z{i}: 1}}\n",
            p = i - 1
        ));
    }
    let c = code(merges.as_bytes(), YAML);
    assert!(c == 200 || c == 400, "{c}");
}

/// Numbers past what a double or an integer holds.
#[test]
fn huge_numbers_are_refused_or_kept_finite() {
    for n in ["1e999999", "-1e999999", "1e400"] {
        let body = format!("{{\"a\": {n}}}");
        assert_eq!(code(body.as_bytes(), JSON), 400, "{n}");
        // YAML's own float syntax: refused, or some finite value.
        if let Ok(v) = decode_body(format!("a: {n}").as_bytes(), YAML) {
            assert!(v["a"].as_f64().is_none_or(f64::is_finite), "{n}: {v}");
        }
    }
    let digits = "9".repeat(100_000);
    for body in [format!("{{\"a\": {digits}}}"), format!("a: {digits}")] {
        let ct = if body.starts_with('{') { JSON } else { YAML };
        let c = code(body.as_bytes(), ct);
        assert!(c == 200 || c == 400, "{c}");
    }
    // i64::MIN - 1 and u64::MAX + 1 come back as doubles, not wrapped.
    let v = decode_body(
        br#"{"a": -9223372036854775809, "b": 18446744073709551616}"#,
        JSON,
    )
    .expect("decodes");
    assert!(v["a"].as_f64().is_some_and(|f| f < -9.2e18), "{v}");
    assert!(v["b"].as_f64().is_some_and(|f| f > 1.8e19), "{v}");
}

/// Duplicate keys: JSON keeps the last and fieldValidation hears of it;
/// YAML refuses them (its spec says keys are unique).
#[test]
fn duplicate_keys() {
    let body = br#"{"metadata": {"name": "a", "name": "b"}}"#;
    let v = decode_body(body, JSON).expect("decodes");
    assert_eq!(v["metadata"]["name"], "b");
    assert_eq!(model::duplicate_fields(body), ["metadata.name"]);
    let c = code(b"metadata:\n  name: a\n  name: b\n", YAML);
    assert!(c == 200 || c == 400, "{c}");
}

/// Length prefixes that point past the end, and varints that never end.
#[test]
fn broken_protobuf_framing() {
    let mut body = b"k8s\0".to_vec();
    body.extend_from_slice(b"\x12\xff\xff\xff\xff\xff\xff\xff\xff\x7f");
    assert!(matches!(
        protobuf::decode(&body),
        Err(protobuf::Error::Malformed(_))
    ));
    let mut body = b"k8s\0".to_vec();
    body.extend_from_slice(&[0x80; 20]);
    assert!(protobuf::decode(&body).is_err());
    assert_eq!(code(b"k8s", PROTOBUF), 400);
}

/// Every seed in `tests/corpus/decoders/` under every content type.
#[test]
fn corpus_replays() {
    for (path, bytes) in fuzz::corpus(env!("CARGO_MANIFEST_DIR"), "decoders") {
        for ct in CONTENT_TYPES {
            if let Err(e) = check_decoded(&bytes, ct) {
                panic!("{}: {e}", path.display());
            }
        }
        let _ = model::duplicate_fields(&bytes);
        if let Err(e) = check_typed(&bytes) {
            panic!("{}: {e}", path.display());
        }
        // What decodes, encoded again, decodes to the same.
        if let Ok(v) = decode_body(&bytes, JSON) {
            let again = serde_json::to_vec(&v).expect("json");
            assert_eq!(
                decode_body(&again, JSON).ok(),
                Some(v),
                "{}",
                path.display()
            );
        }
    }
}

// ---- through the server ----------------------------------------------------

/// Where a fuzzed body is sent: creates (dry run, so nothing is stored or
/// acted on) and a delete's options.
fn request() -> impl Strategy<Value = (&'static str, String, &'static str, Vec<u8>)> {
    let create = prop::sample::select(
        &[
            "/api/v1/namespaces/default/configmaps",
            "/api/v1/namespaces/default/pods",
            "/api/v1/namespaces/default/secrets",
            "/apis/apps/v1/namespaces/default/deployments",
            "/apis/batch/v1/namespaces/default/jobs",
            "/api/v1/namespaces",
        ][..],
    );
    let validation =
        prop::sample::select(&["", "&fieldValidation=Strict", "&fieldValidation=Ignore"][..]);
    prop_oneof![
        4 => (create, validation, body()).prop_map(|(path, v, (b, ct))| {
            ("POST", format!("{path}?dryRun=All{v}"), ct, b)
        }),
        1 => body().prop_map(|(b, ct)| {
            ("DELETE", "/api/v1/namespaces/default/configmaps/absent".to_string(), ct, b)
        }),
    ]
}

/// Through the whole server: every answer to a fuzzed body is below 500
/// and, when a refusal, a Status with the same code.
#[test]
fn the_server_refuses_bad_bodies_with_a_status_below_500() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (mut server, client) = rt.block_on(async {
        let s = api::TestServer::start().await;
        let c = s.client().await;
        (s, c)
    });
    let mut runner = TestRunner::new(fuzz::config(REGRESSIONS, 1500));
    let result = runner.run(&request(), |(method, path, ct, body)| {
        let (code, _, status) = rt.block_on(api::raw(&client, method, &path, ct, body));
        prop_assert!(code < 500, "{method} {path} ({ct}): {code} {status}");
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
