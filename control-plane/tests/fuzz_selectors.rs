//! Fuzzing label and field selector parsing with proptest: no selector
//! panics, every refusal is a typed error (a 400 from the server), and a
//! selector means what it says: printed in any of its spellings it parses
//! to the same selector, it matches what upstream's semantics match, and
//! what kube-rs clients (through `kube-util`) send parses to a selector
//! that agrees with theirs.
//!
//! `tests/corpus/selectors/` holds hand-picked seeds replayed on every
//! run; proptest's failures persist in
//! `tests/proptest-regressions/fuzz_selectors.txt`.

use crate::api;
use crate::fuzz;

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use serde_json::{json, Value};
use skiff_control_plane::apiserver::selectors::{Error, FieldSelector, LabelSelector};

const REGRESSIONS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/proptest-regressions/fuzz_selectors.txt"
);

/// Few keys and values, so that generated labels and selectors meet.
const KEYS: &[&str] = &["app", "tier", "example.com/team", "a.b-c_d", "x"];
const VALUES: &[&str] = &["web", "db", "", "1", "10", "-3", "v.1_2"];
/// The values of a set (`in (...)`): not empty.
const SET_VALUES: &[&str] = &["web", "db", "1", "10", "-3", "v.1_2"];

/// One requirement, as upstream's selector grammar has them.
#[derive(Debug, Clone)]
enum Req {
    Eq(&'static str, &'static str),
    NotEq(&'static str, &'static str),
    In(&'static str, Vec<&'static str>),
    NotIn(&'static str, Vec<&'static str>),
    Exists(&'static str),
    NotExists(&'static str),
    Gt(&'static str, i64),
    Lt(&'static str, i64),
}

fn req() -> impl Strategy<Value = Req> {
    let k = prop::sample::select(KEYS);
    let v = prop::sample::select(VALUES);
    let set = prop::collection::vec(prop::sample::select(SET_VALUES), 1..4);
    prop_oneof![
        (k.clone(), v.clone()).prop_map(|(k, v)| Req::Eq(k, v)),
        (k.clone(), v).prop_map(|(k, v)| Req::NotEq(k, v)),
        (k.clone(), set.clone()).prop_map(|(k, s)| Req::In(k, s)),
        (k.clone(), set).prop_map(|(k, s)| Req::NotIn(k, s)),
        k.clone().prop_map(Req::Exists),
        k.clone().prop_map(Req::NotExists),
        (k.clone(), -20i64..20).prop_map(|(k, n)| Req::Gt(k, n)),
        (k, -20i64..20).prop_map(|(k, n)| Req::Lt(k, n)),
    ]
}

/// How to spell a selector: spaces around operators and commas, `=` or
/// `==`.
#[derive(Debug, Clone, Copy)]
struct Spelling {
    pad: &'static str,
    double_eq: bool,
}

fn spelling() -> impl Strategy<Value = Spelling> {
    (prop::sample::select(&["", " ", "  "][..]), any::<bool>())
        .prop_map(|(pad, double_eq)| Spelling { pad, double_eq })
}

fn print(reqs: &[Req], s: Spelling) -> String {
    let p = s.pad;
    let eq = if s.double_eq { "==" } else { "=" };
    let set = |vs: &[&str]| vs.join(&format!("{p},{p}"));
    let one = |r: &Req| match r {
        Req::Eq(k, v) => format!("{p}{k}{p}{eq}{p}{v}{p}"),
        Req::NotEq(k, v) => format!("{p}{k}{p}!={p}{v}{p}"),
        // ` in ` needs its spaces: they are part of the operator.
        Req::In(k, vs) => format!("{p}{k} {p}in{p} ({p}{}{p}){p}", set(vs)),
        Req::NotIn(k, vs) => format!("{p}{k} {p}notin{p} ({p}{}{p}){p}", set(vs)),
        Req::Exists(k) => format!("{p}{k}{p}"),
        Req::NotExists(k) => format!("{p}!{p}{k}{p}"),
        Req::Gt(k, n) => format!("{p}{k}{p}>{p}{n}{p}"),
        Req::Lt(k, n) => format!("{p}{k}{p}<{p}{n}{p}"),
    };
    reqs.iter().map(one).collect::<Vec<_>>().join(",")
}

/// Upstream's meaning of a requirement (`labels.Requirement.Matches`).
fn holds(r: &Req, labels: &BTreeMap<&str, &str>) -> bool {
    let get = |k: &str| labels.get(k).copied();
    let int = |k: &str| get(k).and_then(|v| v.parse::<i64>().ok());
    match r {
        Req::Eq(k, v) => get(k) == Some(*v),
        Req::NotEq(k, v) => get(k) != Some(*v),
        Req::In(k, vs) => get(k).is_some_and(|v| vs.contains(&v)),
        Req::NotIn(k, vs) => get(k).is_none_or(|v| !vs.contains(&v)),
        Req::Exists(k) => get(k).is_some(),
        Req::NotExists(k) => get(k).is_none(),
        Req::Gt(k, n) => int(k).is_some_and(|v| v > *n),
        Req::Lt(k, n) => int(k).is_some_and(|v| v < *n),
    }
}

fn labels() -> impl Strategy<Value = BTreeMap<&'static str, &'static str>> {
    prop::collection::btree_map(
        prop::sample::select(KEYS),
        prop::sample::select(VALUES),
        0..4,
    )
}

fn pod(labels: &BTreeMap<&str, &str>) -> Value {
    json!({"metadata": {"name": "p", "namespace": "default", "labels": labels}})
}

/// Tokens of the selector grammar, for mutations.
const SELECTOR_TOKENS: &[&[u8]] = &[
    b"!", b"=", b"==", b"!=", b" in ", b" notin ", b"(", b")", b",", b">", b"<", b" ", b"\\",
    b"\xff", b"-",
];

/// Generated selectors, printed and then mutated, for both parsers.
fn selector_text() -> impl Strategy<Value = String> {
    let printed = (prop::collection::vec(req(), 0..5), spelling())
        .prop_map(|(reqs, s)| print(&reqs, s).into_bytes());
    fuzz::mutated(printed, SELECTOR_TOKENS).prop_map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// Field selectors' fields: the two every kind has, and a pod's.
const POD_FIELDS: &[&str] = &["spec.nodeName", "status.phase", "spec.restartPolicy"];
const FIELDS: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "spec.nodeName",
    "status.phase",
    "spec.restartPolicy",
];

fn field_terms() -> impl Strategy<Value = Vec<(&'static str, u8, &'static str)>> {
    prop::collection::vec(
        (
            prop::sample::select(FIELDS),
            0..3u8,
            prop::sample::select(VALUES),
        ),
        0..4,
    )
}

fn print_fields(terms: &[(&str, u8, &str)], pad: &str) -> String {
    terms
        .iter()
        .map(|(f, op, v)| {
            let op = ["=", "==", "!="][usize::from(*op)];
            format!("{pad}{f}{pad}{op}{pad}{v}{pad}")
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// An object with some of [`FIELDS`] set.
fn field_object() -> impl Strategy<Value = Value> {
    prop::collection::btree_map(
        prop::sample::select(FIELDS),
        prop::sample::select(VALUES),
        0..5,
    )
    .prop_map(|set| {
        let mut obj = json!({});
        for (path, v) in set {
            let (a, b) = path.split_once('.').expect("dotted");
            obj[a][b] = json!(v);
        }
        obj
    })
}

fn field_value(obj: &Value, path: &str) -> String {
    let (a, b) = path.split_once('.').expect("dotted");
    obj[a][b].as_str().unwrap_or("").to_string()
}

/// A k8s LabelSelector as controllers hold them (from a workload's
/// spec.selector), valid for kube-rs.
fn label_selector() -> impl Strategy<Value = meta::LabelSelector> {
    let requirement = (
        prop::sample::select(KEYS),
        prop::sample::select(&["In", "NotIn", "Exists", "DoesNotExist"][..]),
        prop::collection::vec(prop::sample::select(SET_VALUES), 0..3),
    )
        .prop_map(|(k, op, vs)| meta::LabelSelectorRequirement {
            key: k.into(),
            operator: op.into(),
            values: matches!(op, "In" | "NotIn")
                .then(|| vs.iter().map(|v| v.to_string()).collect()),
        });
    (
        prop::option::of(prop::collection::btree_map(
            prop::sample::select(KEYS).prop_map(String::from),
            prop::sample::select(VALUES).prop_map(String::from),
            0..3,
        )),
        prop::option::of(prop::collection::vec(requirement, 0..3)),
    )
        .prop_map(|(match_labels, match_expressions)| meta::LabelSelector {
            match_labels,
            match_expressions,
        })
}

proptest! {
    #![proptest_config(fuzz::config(REGRESSIONS, 30000))]

    /// No text panics either parser; refusals are typed.
    #[test]
    fn any_selector_text_parses_or_is_refused(text in selector_text()) {
        match LabelSelector::parse(&text) {
            Ok(_) | Err(Error::Syntax(_)) => {}
            Err(e) => prop_assert!(false, "label selector {text:?}: {e}"),
        }
        let _ = FieldSelector::parse(&text, POD_FIELDS);
    }

    /// A selector printed in any spelling parses to the same selector,
    /// and that selector matches exactly the labels upstream's would.
    #[test]
    fn label_selectors_round_trip_and_match_upstream(
        reqs in prop::collection::vec(req(), 0..5),
        a in spelling(),
        b in spelling(),
        sets in prop::collection::vec(labels(), 1..6),
    ) {
        let canonical = print(&reqs, Spelling { pad: "", double_eq: false });
        let parsed = LabelSelector::parse(&canonical);
        prop_assert!(parsed.is_ok(), "{canonical:?}: {parsed:?}");
        let parsed = parsed.expect("checked");
        for s in [a, b] {
            let text = print(&reqs, s);
            let again = LabelSelector::parse(&text).ok();
            prop_assert_eq!(again.as_ref(), Some(&parsed), "{:?}", text);
        }
        for l in &sets {
            let want = reqs.iter().all(|r| holds(r, l));
            prop_assert_eq!(parsed.matches(&pod(l)), want, "{:?} on {:?}", canonical, l);
        }
    }

    /// What kube-rs prints for a LabelSelector (kube-util's conversion,
    /// as the controllers list with it) parses here to a selector that
    /// selects the same objects as kube-util's own matching.
    #[test]
    fn kube_rs_selectors_mean_the_same_here(sel in label_selector(), sets in prop::collection::vec(labels(), 1..6)) {
        let text = kube_util::selector::selector(&sel).expect("valid").to_string();
        let parsed = LabelSelector::parse(&text);
        prop_assert!(parsed.is_ok(), "{text:?}: {parsed:?}");
        let parsed = parsed.expect("checked");
        for l in &sets {
            let owned: BTreeMap<String, String> = l.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            prop_assert_eq!(
                parsed.matches(&pod(l)),
                kube_util::selector::matches(&sel, Some(&owned)),
                "{:?} on {:?}", text, l
            );
        }
    }

    /// Field selectors: any spelling parses to the same terms, which match
    /// as `field=value` / `field!=value` say (a missing field is "").
    #[test]
    fn field_selectors_round_trip_and_match(
        terms in field_terms(),
        pad in prop::sample::select(&["", " "][..]),
        objs in prop::collection::vec(field_object(), 1..5),
    ) {
        let parsed = FieldSelector::parse(&print_fields(&terms, ""), POD_FIELDS);
        prop_assert!(parsed.is_ok(), "{parsed:?}");
        let parsed = parsed.expect("checked");
        let again = FieldSelector::parse(&print_fields(&terms, pad), POD_FIELDS).ok();
        prop_assert_eq!(again.as_ref(), Some(&parsed));
        let name = terms.iter().find(|(f, op, _)| *f == "metadata.name" && *op != 2).map(|(_, _, v)| *v);
        prop_assert_eq!(parsed.name(), name);
        for obj in &objs {
            let want = terms.iter().all(|(f, op, v)| (field_value(obj, f) == *v) != (*op == 2));
            prop_assert_eq!(parsed.matches(obj), want, "{:?} on {}", terms, obj);
        }
    }
}

/// Fields a kind does not select by are refused, as upstream refuses them.
#[test]
fn unsupported_fields_are_refused() {
    for s in ["spec.bogus=1", "metadata.labels=x", "=x", "status.phase"] {
        assert!(FieldSelector::parse(s, POD_FIELDS).is_err(), "{s}");
    }
    for s in ["a in (x", "a in x)", "a > x", "a < 1.5", "!", "a b"] {
        assert!(LabelSelector::parse(s).is_err(), "{s}");
    }
}

/// Every seed in `tests/corpus/selectors/`, one selector a line, through
/// both parsers.
#[test]
fn corpus_replays() {
    for (path, bytes) in fuzz::corpus(env!("CARGO_MANIFEST_DIR"), "selectors") {
        for line in String::from_utf8_lossy(&bytes).lines() {
            match LabelSelector::parse(line) {
                Ok(_) | Err(Error::Syntax(_)) => {}
                Err(e) => panic!("{}: {line:?}: {e}", path.display()),
            }
            let _ = FieldSelector::parse(line, POD_FIELDS);
        }
    }
}

/// Through the server: a list with any selector is answered 200 or 400
/// (a Status), never more.
#[test]
fn the_server_refuses_bad_selectors_with_400() {
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
    let param = prop::sample::select(&["labelSelector", "fieldSelector"][..]);
    let mut runner = TestRunner::new(fuzz::config(REGRESSIONS, 1500));
    let result = runner.run(&(param, selector_text()), |(param, text)| {
        let q: String = form_urlencoded::byte_serialize(text.as_bytes()).collect();
        let path = format!("/api/v1/namespaces/default/pods?{param}={q}");
        let (code, _, status) = rt.block_on(api::raw(&client, "GET", &path, "", Vec::new()));
        prop_assert!(code == 200 || code == 400, "{path}: {code} {status}");
        if code == 400 {
            prop_assert_eq!(&status["kind"], "Status", "{}", status);
        }
        Ok(())
    });
    rt.block_on(server.stop());
    if let Err(e) = result {
        panic!("{e}");
    }
}
