//! Sets of field paths as a trie (upstream `fieldpath.Set`) and their
//! FieldsV1 JSON, the form `metadata.managedFields[].fieldsV1` holds.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use super::path::{Path, PathElement};

/// How deep a client's FieldsV1 may nest: deeper than objects are, shallow
/// enough that a hostile body cannot exhaust the stack.
pub const MAX_DEPTH: usize = 64;

/// How many path elements one FieldsV1 may name: more than an object a
/// request can carry has fields, few enough to bound what decoding costs.
pub const MAX_ELEMENTS: usize = 250_000;

/// Why a FieldsV1 document is refused.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A node is not an object, or a key no element type parses as.
    #[error("{path}: {reason}")]
    Malformed { path: String, reason: String },
    /// Nested deeper than [`MAX_DEPTH`] or naming more than [`MAX_ELEMENTS`].
    #[error("fieldsV1 is larger than {MAX_DEPTH} levels or {MAX_ELEMENTS} elements")]
    TooLarge,
}

/// A set of paths: a path is in it when its last element is a member of
/// the node its other elements lead to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSet {
    pub(super) members: BTreeSet<PathElement>,
    /// Never holds an empty set, so derived equality is set equality.
    pub(super) children: BTreeMap<PathElement, FieldSet>,
}

impl FieldSet {
    /// Add `path`; the empty path (the whole object) is never tracked.
    pub fn insert(&mut self, path: &[PathElement]) {
        if let Some((last, parents)) = path.split_last() {
            let node = parents
                .iter()
                .fold(self, |n, pe| n.children.entry(pe.clone()).or_default());
            node.members.insert(last.clone());
        }
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty() && self.children.is_empty()
    }

    pub fn union(&self, other: &FieldSet) -> FieldSet {
        let mut out = self.clone();
        out.extend(other);
        out
    }

    /// Add every path of `other`.
    pub fn extend(&mut self, other: &FieldSet) {
        self.members.extend(other.members.iter().cloned());
        for (pe, set) in &other.children {
            self.children.entry(pe.clone()).or_default().extend(set);
        }
    }

    pub fn intersection(&self, other: &FieldSet) -> FieldSet {
        let children = (self.children.iter())
            .filter_map(|(pe, set)| Some((pe.clone(), set.intersection(other.children.get(pe)?))))
            .filter(|(_, set)| !set.is_empty())
            .collect();
        let members = self.members.intersection(&other.members).cloned().collect();
        FieldSet { members, children }
    }

    /// Paths of `self` not in `other`. As upstream, a member of `other`
    /// takes that path only, not the paths below it.
    pub fn difference(&self, other: &FieldSet) -> FieldSet {
        self.minus(other, false)
    }

    /// Paths of `self` neither in `other` nor below one of its paths.
    pub fn recursive_difference(&self, other: &FieldSet) -> FieldSet {
        self.minus(other, true)
    }

    fn minus(&self, other: &FieldSet, recursive: bool) -> FieldSet {
        let children = (self.children.iter())
            .filter(|(pe, _)| !(recursive && other.members.contains(pe)))
            .map(|(pe, set)| match other.children.get(pe) {
                Some(o) => (pe.clone(), set.minus(o, recursive)),
                None => (pe.clone(), set.clone()),
            })
            .filter(|(_, set)| !set.is_empty())
            .collect();
        let members = self.members.difference(&other.members).cloned().collect();
        FieldSet { members, children }
    }

    /// Every path of the set in upstream's `Iterate` order: a node's
    /// members, then the paths below its children.
    pub fn paths(&self) -> Vec<Path> {
        let mut out: Vec<Path> = self
            .members
            .iter()
            .map(|pe| Path(vec![pe.clone()]))
            .collect();
        for (pe, set) in &self.children {
            out.extend(set.paths().into_iter().map(|mut p| {
                p.0.insert(0, pe.clone());
                p
            }));
        }
        out
    }

    /// The FieldsV1 JSON: `{}` for a member, an object for a node with
    /// paths below it, holding `".": {}` when it is a member too.
    pub fn to_fields_v1(&self) -> Value {
        Value::Object(self.emit(false))
    }

    fn emit(&self, member: bool) -> Map<String, Value> {
        let mut out = Map::new();
        if member {
            out.insert(".".into(), Value::Object(Map::new()));
        }
        for pe in self
            .members
            .iter()
            .filter(|pe| !self.children.contains_key(pe))
        {
            out.insert(pe.to_fields_v1_key(), Value::Object(Map::new()));
        }
        for (pe, set) in &self.children {
            out.insert(
                pe.to_fields_v1_key(),
                Value::Object(set.emit(self.members.contains(pe))),
            );
        }
        out
    }

    /// Read FieldsV1 JSON as upstream does: keys of unknown element types
    /// are dropped and null reads as `{}`.
    ///
    /// # Errors
    /// A node that is not an object, a key that does not parse, a document
    /// past [`MAX_DEPTH`] or [`MAX_ELEMENTS`].
    pub fn from_fields_v1(v: &Value) -> Result<FieldSet, Error> {
        let mut budget = MAX_ELEMENTS;
        Ok(read(v, &mut Vec::new(), &mut budget)?.0)
    }
}

/// The paths below one FieldsV1 node, and whether the node is a member
/// itself: it is when it says `"."` or has nothing below it (upstream
/// `readIterV1`).
fn read(
    v: &Value,
    path: &mut Vec<PathElement>,
    budget: &mut usize,
) -> Result<(FieldSet, bool), Error> {
    let malformed = |path: &[PathElement], reason: String| Error::Malformed {
        path: Path(path.to_vec()).to_string(),
        reason,
    };
    let map = match v {
        Value::Object(m) => m,
        Value::Null => return Ok((FieldSet::default(), true)),
        _ => return Err(malformed(path, "expected an object".into())),
    };
    if path.len() > MAX_DEPTH {
        return Err(Error::TooLarge);
    }
    let mut set = FieldSet::default();
    for (key, child) in map.iter().filter(|(k, _)| *k != ".") {
        *budget = budget.checked_sub(1).ok_or(Error::TooLarge)?;
        let pe = match PathElement::from_fields_v1_key(key) {
            Ok(Some(pe)) => pe,
            Ok(None) => continue,
            Err(reason) => return Err(malformed(path, reason)),
        };
        path.push(pe.clone());
        let (below, member) = read(child, path, budget)?;
        path.pop();
        if member {
            set.members.insert(pe.clone());
        }
        if !below.is_empty() {
            // Two spellings of one element (`k:` fields in another order) add up.
            set.children.entry(pe).or_default().extend(&below);
        }
    }
    let member = map.contains_key(".") || set.is_empty();
    Ok((set, member))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn set_of(paths: &[&[&str]]) -> FieldSet {
        let mut s = FieldSet::default();
        paths.iter().for_each(|p| s.insert(&Path::fields(p).0));
        s
    }

    #[test]
    fn fields_v1_round_trips() {
        let v = json!({
            "f:metadata": {"f:labels": {".": {}, "f:app": {}}},
            "f:spec": {
                "f:containers": {"k:{\"name\":\"c\"}": {".": {}, "f:image": {}}},
                "f:finalizers": {"v:\"a\"": {}, "v:3": {}},
                "f:items": {"i:0": {}},
            },
        });
        let set = FieldSet::from_fields_v1(&v).unwrap();
        assert_eq!(set.to_fields_v1(), v);
        let paths: Vec<String> = set.paths().iter().map(|p| p.to_string()).collect();
        let c = r#".spec.containers[name="c"]"#;
        let image = format!("{c}.image");
        let want = [
            ".metadata.labels",
            ".metadata.labels.app",
            c,
            image.as_str(),
        ];
        assert_eq!(paths[..4], want);
        assert_eq!(
            paths[4..],
            [
                ".spec.finalizers[=3]",
                r#".spec.finalizers[="a"]"#,
                ".spec.items[0]"
            ]
        );
        // Unknown element types are dropped; null is an empty node.
        let odd = json!({"x:y": {}, "f:a": null, "f:b": {"z:q": {}}});
        assert_eq!(
            FieldSet::from_fields_v1(&odd).unwrap(),
            set_of(&[&["a"], &["b"]])
        );
        assert!(FieldSet::from_fields_v1(&Value::Null).unwrap().is_empty());
    }

    #[test]
    fn bad_fields_v1_is_refused() {
        for bad in [
            json!([]),
            json!({"f:a": 1}),
            json!({"f:a": {"k:{": {}}}),
            json!({"q": {}}),
        ] {
            assert!(FieldSet::from_fields_v1(&bad).is_err(), "{bad}");
        }
        let deep = (0..100).fold(json!({}), |v, _| json!({ "f:a": v }));
        assert!(matches!(
            FieldSet::from_fields_v1(&deep),
            Err(Error::TooLarge)
        ));
    }

    #[test]
    fn set_algebra() {
        let a = set_of(&[
            &["spec", "replicas"],
            &["spec", "paused"],
            &["metadata", "labels", "x"],
        ]);
        let b = set_of(&[&["spec", "replicas"], &["spec"]]);
        assert_eq!(a.intersection(&b), set_of(&[&["spec", "replicas"]]));
        assert_eq!(
            a.difference(&b),
            set_of(&[&["spec", "paused"], &["metadata", "labels", "x"]])
        );
        assert_eq!(
            a.recursive_difference(&b),
            set_of(&[&["metadata", "labels", "x"]])
        );
        assert_eq!(a.union(&b).difference(&a), set_of(&[&["spec"]]));
        assert!(a.difference(&a).is_empty());
    }
}
