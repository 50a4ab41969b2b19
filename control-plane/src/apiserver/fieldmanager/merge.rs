//! Schema-aware operations on objects (upstream `typed`): the fields an
//! object sets, merging an applied configuration into a live object,
//! comparing two versions, removing fields, and apply's pruning.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde_json::{Map, Value};

use super::path::{value_eq, Path, PathElement};
use super::schema::{ListKind, Shape};
use super::set::FieldSet;

/// Objects the operations cannot walk.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A list item its list cannot name: a map-list item without any key
    /// field, a set item that is not a scalar (upstream's words).
    #[error("{path}: element {index}: {reason}")]
    BadItem {
        path: String,
        index: usize,
        reason: String,
    },
    /// Two items of an applied list with the same key.
    #[error("{path}: duplicate entries for key {key}")]
    Duplicate { path: String, key: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What changed from one version of an object to the next.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Comparison {
    /// Leaves both versions set, to different values.
    pub modified: FieldSet,
    /// Fields only the new version sets, and all below them.
    pub added: FieldSet,
    /// Fields only the old version sets, and all below them.
    pub removed: FieldSet,
}

impl Comparison {
    pub fn is_same(&self) -> bool {
        self.modified.is_empty() && self.added.is_empty() && self.removed.is_empty()
    }

    /// Without `fields` and all below them (upstream `ExcludeFields`).
    pub fn excluding(self, fields: &FieldSet) -> Comparison {
        let cut = |s: FieldSet| s.recursive_difference(fields);
        Comparison {
            modified: cut(self.modified),
            added: cut(self.added),
            removed: cut(self.removed),
        }
    }
}

/// How a value is walked where it is: granular maps and map- or set-lists
/// per entry, anything else (scalars, null, atomic fields) as a leaf.
#[derive(Clone, Copy)]
enum Walk<'v> {
    Map(&'v Map<String, Value>),
    List(&'v [Value]),
    Leaf,
}

fn walk<'v>(v: &'v Value, shape: Shape) -> Walk<'v> {
    match v {
        Value::Object(m) if !shape.atomic() => Walk::Map(m),
        Value::Array(a) if shape.list_kind() != ListKind::Atomic => Walk::List(a),
        _ => Walk::Leaf,
    }
}

fn text(path: &[PathElement]) -> String {
    Path(path.to_vec()).to_string()
}

/// The element naming each item of a map- or set-list (upstream
/// `listItemToPathElement`).
fn elements(items: &[Value], list: Shape, path: &[PathElement]) -> Result<Vec<PathElement>> {
    let kind = list.list_kind();
    let name = |item: &Value| -> Result<PathElement, &'static str> {
        let ListKind::Map(keys) = &kind else {
            return match item {
                Value::Object(_) => {
                    Err("associative list without keys has an element that's a map type")
                }
                Value::Array(_) => Err("not supported: associative list with lists as elements"),
                Value::Null => {
                    Err("associative list without keys has an element that's an explicit null")
                }
                v => Ok(PathElement::Value(v.clone())),
            };
        };
        let Value::Object(fields) = item else {
            return Err("associative list with keys may not have non-map elements");
        };
        // A key field omitted without a default is left out: such an item
        // is another one than an item that sets it (upstream).
        let mut key: Vec<(String, Value)> = (keys.iter())
            .filter_map(|k| {
                Some((
                    k.clone(),
                    fields.get(k).cloned().or_else(|| list.key_default(k))?,
                ))
            })
            .collect();
        key.sort_by(|a, b| a.0.cmp(&b.0));
        match key.is_empty() {
            true => Err("associative list with keys has an element that omits all key fields"),
            false => Ok(PathElement::Key(key)),
        }
    };
    let bad = |index, reason: &str| Error::BadItem {
        path: text(path),
        index,
        reason: reason.into(),
    };
    (items.iter().enumerate())
        .map(|(i, item)| name(item).map_err(|r| bad(i, r)))
        .collect()
}

/// Every field `obj` sets (upstream `ToFieldSet`): leaves, map keys, null
/// and empty fields, and each item of map- and set-lists.
///
/// # Errors
/// A list item that cannot be named.
pub fn field_set(obj: &Value, shape: Shape) -> Result<FieldSet> {
    let mut out = FieldSet::default();
    set_walk(obj, shape, &mut Vec::new(), &mut out)?;
    Ok(out)
}

fn set_walk(
    v: &Value,
    shape: Shape,
    path: &mut Vec<PathElement>,
    out: &mut FieldSet,
) -> Result<()> {
    match walk(v, shape) {
        Walk::Leaf => out.insert(path),
        Walk::Map(m) => {
            for (k, child) in m {
                path.push(PathElement::Field(k.clone()));
                set_walk(child, shape.field(k), path, out)?;
                let empty = child.is_null() || child.as_object().is_some_and(Map::is_empty);
                if empty || !shape.is_named_field(k) {
                    out.insert(path);
                }
                path.pop();
            }
        }
        Walk::List(items) => {
            let pes = elements(items, shape, path)?;
            let mut count: BTreeMap<&PathElement, usize> = BTreeMap::new();
            pes.iter().for_each(|pe| *count.entry(pe).or_default() += 1);
            for (item, pe) in items.iter().zip(&pes) {
                path.push(pe.clone());
                // Items sharing a key (live objects may have them) are owned
                // as one, not field by field.
                if count.get(pe) == Some(&1) {
                    set_walk(item, shape.items(), path, out)?;
                }
                out.insert(path);
                path.pop();
            }
        }
    }
    Ok(())
}

/// `config` merged into `live` (upstream `TypedValue.Merge`): config wins
/// leaves and atomic fields; granular maps merge per key; map- and
/// set-lists per item, live items keeping their place and new ones coming
/// in config order. A null in config is a value, but over a granular map or
/// list with content upstream reads it as an empty one, merging nothing.
///
/// # Errors
/// A list item that cannot be named, duplicate keys in a config list.
pub fn merge(live: &Value, config: &Value, shape: Shape) -> Result<Value> {
    merge_value(Some(live), config, shape, &mut Vec::new())
}

fn merge_value(
    live: Option<&Value>,
    cfg: &Value,
    shape: Shape,
    path: &mut Vec<PathElement>,
) -> Result<Value> {
    let lw = live.map(|l| walk(l, shape));
    match (walk(cfg, shape), lw) {
        (Walk::Map(c), lw) => {
            let l = match lw {
                Some(Walk::Map(l)) => Some(l),
                _ => None,
            };
            if c.is_empty() && l.is_none_or(Map::is_empty) {
                return Ok(cfg.clone());
            }
            let mut out = l.cloned().unwrap_or_default();
            for (k, cv) in c {
                path.push(PathElement::Field(k.clone()));
                let v = merge_value(l.and_then(|l| l.get(k)), cv, shape.field(k), path)?;
                path.pop();
                out.insert(k.clone(), v);
            }
            Ok(Value::Object(out))
        }
        (Walk::List(c), Some(Walk::List(l))) if !(c.is_empty() && l.is_empty()) => {
            merge_list(l, c, shape, path).map(Value::Array)
        }
        (Walk::List(c), _) if !c.is_empty() => merge_list(&[], c, shape, path).map(Value::Array),
        (Walk::Leaf, Some(Walk::Map(m))) if cfg.is_null() && !m.is_empty() => {
            Ok(live.cloned().unwrap_or_default())
        }
        (Walk::Leaf, Some(Walk::List(a))) if cfg.is_null() && !a.is_empty() => {
            Ok(live.cloned().unwrap_or_default())
        }
        _ => Ok(cfg.clone()),
    }
}

/// Upstream's list merge: walk both lists, keeping live-only items where
/// they are and taking config items in config order; a live item config
/// also has waits until it is the next shared one.
fn merge_list(
    live: &[Value],
    cfg: &[Value],
    shape: Shape,
    path: &mut Vec<PathElement>,
) -> Result<Vec<Value>> {
    let (rpes, lpes) = (elements(cfg, shape, path)?, elements(live, shape, path)?);
    let mut config: BTreeSet<&PathElement> = BTreeSet::new();
    if let Some(dup) = rpes.iter().find(|pe| !config.insert(pe)) {
        return Err(Error::Duplicate {
            path: text(path),
            key: dup.to_string(),
        });
    }
    // Live items sharing a key have no one item to merge into: the config
    // item replaces them all (None).
    let mut current: BTreeMap<&PathElement, Option<&Value>> = BTreeMap::new();
    for (pe, v) in lpes.iter().zip(live) {
        current
            .entry(pe)
            .and_modify(|e| *e = None)
            .or_insert(Some(v));
    }
    let mut shared: VecDeque<&PathElement> =
        rpes.iter().filter(|pe| current.contains_key(pe)).collect();
    let mut next = shared.pop_front();
    let mut done: BTreeSet<&PathElement> = BTreeSet::new();
    let mut out = Vec::with_capacity(live.len().max(cfg.len()));
    let item = |pe: &PathElement, ri: usize, path: &mut Vec<PathElement>| {
        path.push(pe.clone());
        let v = merge_value(
            current.get(pe).copied().flatten(),
            &cfg[ri],
            shape.items(),
            path,
        );
        path.pop();
        v
    };
    let (mut li, mut ri) = (0, 0);
    while li < lpes.len() || ri < rpes.len() {
        if li < lpes.len() && ri < rpes.len() {
            let pe = &lpes[li];
            if *pe == rpes[ri] {
                done.insert(pe);
                out.push(item(pe, ri, path)?);
                (li, ri, next) = (li + 1, ri + 1, shared.pop_front());
                continue;
            }
            if config.contains(pe) && next.is_some_and(|n| n != pe) {
                li += 1;
                continue;
            }
        }
        if li < lpes.len() {
            if !config.contains(&lpes[li]) {
                out.push(live[li].clone());
                li += 1;
                continue;
            }
            if done.contains(&lpes[li]) {
                li += 1;
            }
        }
        if ri < rpes.len() {
            let pe = &rpes[ri];
            done.insert(pe);
            out.push(item(pe, ri, path)?);
            ri += 1;
            if next == Some(pe) {
                next = shared.pop_front();
            }
        }
    }
    Ok(out)
}

/// What changed from `old` to `new` (upstream `TypedValue.Compare`).
///
/// # Errors
/// A list item that cannot be named.
pub fn compare(old: &Value, new: &Value, shape: Shape) -> Result<Comparison> {
    let mut c = Comparison::default();
    compare_walk(Some(old), Some(new), shape, &mut Vec::new(), &mut c)?;
    Ok(c)
}

fn compare_walk(
    l: Option<&Value>,
    r: Option<&Value>,
    shape: Shape,
    path: &mut Vec<PathElement>,
    c: &mut Comparison,
) -> Result<()> {
    let (lw, rw) = (l.map(|v| walk(v, shape)), r.map(|v| walk(v, shape)));
    let empty = |w: Option<Walk>| match w {
        Some(Walk::Map(m)) => m.is_empty(),
        Some(Walk::List(a)) => a.is_empty(),
        _ => true,
    };
    let granular = |w: Option<Walk>| matches!(w, Some(Walk::Map(_) | Walk::List(_)));
    if !granular(lw) && !granular(rw) {
        compare_leaf(l, r, path, c);
        return Ok(());
    }
    // A null or absent side takes the other side's form (upstream); a
    // field that changes form is modified.
    let leaf = |v: Option<&Value>, w: Option<Walk>| {
        matches!(w, Some(Walk::Leaf)) && v.is_some_and(|v| !v.is_null())
    };
    let changed = matches!(
        (lw, rw),
        (Some(Walk::Map(_)), Some(Walk::List(_))) | (Some(Walk::List(_)), Some(Walk::Map(_)))
    );
    if changed || leaf(l, lw) || leaf(r, rw) {
        c.modified.insert(path);
        return Ok(());
    }
    if empty(lw) && empty(rw) {
        compare_leaf(l, r, path, c);
        return Ok(());
    }
    let none = Map::new();
    match (lw, rw) {
        (Some(Walk::List(a)), Some(Walk::List(b))) => compare_lists(a, b, shape, path, c)?,
        (Some(Walk::List(a)), _) => compare_lists(a, &[], shape, path, c)?,
        (_, Some(Walk::List(b))) => compare_lists(&[], b, shape, path, c)?,
        (lw, rw) => {
            let (a, b) = match (lw, rw) {
                (Some(Walk::Map(a)), Some(Walk::Map(b))) => (a, b),
                (Some(Walk::Map(a)), _) => (a, &none),
                (_, Some(Walk::Map(b))) => (&none, b),
                _ => (&none, &none),
            };
            for k in a.keys().chain(b.keys().filter(|k| !a.contains_key(*k))) {
                path.push(PathElement::Field(k.clone()));
                compare_walk(a.get(k), b.get(k), shape.field(k), path, c)?;
                path.pop();
            }
        }
    }
    if l.is_none() {
        c.added.insert(path);
    } else if r.is_none() {
        c.removed.insert(path);
    }
    Ok(())
}

fn compare_leaf(l: Option<&Value>, r: Option<&Value>, path: &[PathElement], c: &mut Comparison) {
    match (l, r) {
        (None, _) => c.added.insert(path),
        (_, None) => c.removed.insert(path),
        (Some(a), Some(b)) if !value_eq(a, b) => c.modified.insert(path),
        _ => {}
    }
}

fn compare_lists(
    a: &[Value],
    b: &[Value],
    shape: Shape,
    path: &mut Vec<PathElement>,
    c: &mut Comparison,
) -> Result<()> {
    let (lpes, rpes) = (elements(a, shape, path)?, elements(b, shape, path)?);
    let mut order: Vec<&PathElement> = Vec::new();
    let mut sides: BTreeMap<&PathElement, (Vec<&Value>, Vec<&Value>)> = BTreeMap::new();
    for (pe, v, right) in lpes
        .iter()
        .zip(a)
        .map(|(p, v)| (p, v, false))
        .chain(rpes.iter().zip(b).map(|(p, v)| (p, v, true)))
    {
        let side = sides.entry(pe).or_insert_with(|| {
            order.push(pe);
            Default::default()
        });
        if right {
            side.1.push(v)
        } else {
            side.0.push(v)
        }
    }
    for pe in order {
        let Some((ls, rs)) = sides.get(pe) else {
            continue;
        };
        path.push(pe.clone());
        if ls.len() < 2 && rs.len() < 2 {
            compare_walk(
                ls.first().copied(),
                rs.first().copied(),
                shape.items(),
                path,
                c,
            )?;
        } else if ls.is_empty() {
            c.added.insert(path);
        } else if rs.is_empty() {
            c.removed.insert(path);
        } else if ls.len() != rs.len() || ls.iter().zip(rs).any(|(x, y)| !value_eq(x, y)) {
            // Items sharing a key compare as one value.
            c.modified.insert(path);
        }
        path.pop();
    }
    Ok(())
}

/// `obj` without the fields of `set` (upstream `RemoveItems`): a member
/// goes with all below it, map-list items by key. A map or list the
/// removal empties goes too, where upstream leaves a null that a Go struct
/// decodes as absent but our typed models would refuse.
pub fn remove(obj: &Value, set: &FieldSet, shape: Shape) -> Value {
    remove_walk(obj, set, shape).unwrap_or_else(|| Value::Object(Map::new()))
}

fn remove_walk(v: &Value, set: &FieldSet, shape: Shape) -> Option<Value> {
    let keep = |pe: &PathElement, child: &Value, shape: Shape| match set.children.get(pe) {
        _ if set.members.contains(pe) => None,
        Some(below) => remove_walk(child, below, shape),
        None => Some(child.clone()),
    };
    match walk(v, shape) {
        Walk::Map(m) if !m.is_empty() => {
            let out: Map<String, Value> = (m.iter())
                .filter_map(|(k, child)| {
                    Some((
                        k.clone(),
                        keep(&PathElement::Field(k.clone()), child, shape.field(k))?,
                    ))
                })
                .collect();
            (!out.is_empty()).then_some(Value::Object(out))
        }
        Walk::List(items) if !items.is_empty() => {
            let Ok(pes) = elements(items, shape, &[]) else {
                return Some(v.clone());
            };
            let out: Vec<Value> = (items.iter().zip(&pes))
                .filter_map(|(item, pe)| keep(pe, item, shape.items()))
                .collect();
            (!out.is_empty()).then_some(Value::Array(out))
        }
        _ => Some(v.clone()),
    }
}

/// `set` with the struct fields it reaches into made members too (upstream
/// `EnsureNamedFieldsAreMembers`), so that pruning drops a struct whole.
fn with_named_fields(set: &FieldSet, shape: Shape) -> FieldSet {
    let mut out = FieldSet {
        members: set.members.clone(),
        children: BTreeMap::new(),
    };
    for (pe, below) in &set.children {
        let below_shape = match pe {
            PathElement::Field(name) if shape.is_named_field(name) => {
                out.members.insert(pe.clone());
                shape.field(name)
            }
            PathElement::Field(name) => shape.field(name),
            _ => shape.items(),
        };
        out.children
            .insert(pe.clone(), with_named_fields(below, below_shape));
    }
    out
}

/// Apply's pruning (upstream `Updater.prune`): drop from `merged` what the
/// applier applied last time (`last`) and nobody owns any more (`owned`:
/// every manager's set, the applier's new one included).
pub(super) fn prune(
    merged: &Value,
    last: &FieldSet,
    owned: &FieldSet,
    shape: Shape,
) -> Result<Value> {
    let present = with_named_fields(&field_set(merged, shape)?, shape);
    let gone = with_named_fields(last, shape)
        .intersection(&present)
        .difference(&with_named_fields(owned, shape));
    Ok(if gone.is_empty() {
        merged.clone()
    } else {
        remove(merged, &gone, shape)
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn names(list: &Value) -> Vec<&str> {
        list.as_array()
            .unwrap()
            .iter()
            .map(|i| i["name"].as_str().unwrap())
            .collect()
    }

    fn texts(s: &FieldSet) -> Vec<String> {
        s.paths().iter().map(|p| p.to_string()).collect()
    }

    #[test]
    fn field_set_of_a_deployment() {
        let d = json!({
            "kind": "Deployment", "metadata": {"labels": {"app": "web"}},
            "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {"spec": {"containers": [{
                "name": "nginx", "args": ["-x"], "env": [{"name": "A", "value": "1"}], "ports": [{"containerPort": 80}],
            }]}}},
        });
        let c = json!({
            ".": {}, "f:name": {}, "f:args": {}, "f:env": {"k:{\"name\":\"A\"}": {".": {}, "f:name": {}, "f:value": {}}},
            "f:ports": {"k:{\"containerPort\":80,\"protocol\":\"TCP\"}": {".": {}, "f:containerPort": {}}},
        });
        let want = json!({"f:kind": {}, "f:metadata": {"f:labels": {"f:app": {}}}, "f:spec": {
            "f:selector": {}, "f:template": {"f:spec": {"f:containers": {"k:{\"name\":\"nginx\"}": c}}},
        }});
        assert_eq!(
            field_set(&d, Shape::builtin("Deployment"))
                .unwrap()
                .to_fields_v1(),
            want
        );
        // Deduced objects own their maps as members too.
        let deduced = field_set(&json!({"spec": {"a": 1}, "e": {}}), Shape::deduced()).unwrap();
        assert_eq!(
            deduced.to_fields_v1(),
            json!({"f:spec": {".": {}, "f:a": {}}, "f:e": {}})
        );
    }

    #[test]
    fn merges_lists_by_kind() {
        let shape = Shape::builtin("Pod");
        let live = json!({
            "metadata": {"finalizers": ["x", "y"], "labels": {"a": "1"}},
            "spec": {"containers": [{"name": "a"}, {"name": "b", "tty": true}], "tolerations": [{"key": "k1"}]},
        });
        let cfg = json!({
            "metadata": {"finalizers": ["z", "x"], "labels": null},
            "spec": {"containers": [{"name": "b", "image": "2"}, {"name": "c"}], "tolerations": [{"key": "k3"}], "hostname": null},
        });
        let out = merge(&live, &cfg, shape).unwrap();
        assert_eq!(names(&out["spec"]["containers"]), ["a", "b", "c"]);
        assert_eq!(
            out["spec"]["containers"][1],
            json!({"name": "b", "image": "2", "tty": true})
        );
        assert_eq!(
            out["metadata"],
            json!({"finalizers": ["z", "x", "y"], "labels": {"a": "1"}})
        );
        assert_eq!(out["spec"]["tolerations"], json!([{"key": "k3"}]));
        assert_eq!(out["spec"].get("hostname"), Some(&Value::Null));
        // A new config item before a shared one goes first.
        let cfg = json!({"spec": {"containers": [{"name": "d"}, {"name": "a"}]}});
        assert_eq!(
            names(&merge(&live, &cfg, shape).unwrap()["spec"]["containers"]),
            ["d", "a", "b"]
        );

        let dup = json!({"containers": [{"name": "a"}, {"name": "a"}]});
        let err = merge(&json!({}), &dup, Shape::builtin("PodSpec")).unwrap_err();
        assert_eq!(
            err.to_string(),
            r#".containers: duplicate entries for key [name="a"]"#
        );
        let err = field_set(
            &json!({"containers": [{"image": "x"}]}),
            Shape::builtin("PodSpec"),
        )
        .unwrap_err();
        assert_eq!(err.to_string(), ".containers: element 0: associative list with keys has an element that omits all key fields");
        // Live objects may repeat a key: owned as one item.
        let set = field_set(&dup, Shape::builtin("PodSpec")).unwrap();
        assert_eq!(
            set.to_fields_v1(),
            json!({"f:containers": {"k:{\"name\":\"a\"}": {}}})
        );
    }

    #[test]
    fn compares_and_removes() {
        let shape = Shape::builtin("Pod");
        let old = json!({"metadata": {"labels": {"app": "web"}}, "spec": {"nodeName": "a", "containers": [{"name": "c", "env": [{"name": "A"}]}]}});
        let mut new = old.clone();
        new["spec"]["nodeName"] = json!("b");
        new["metadata"]["labels"] = json!({"tier": "x"});
        new["spec"]["containers"][0]["env"] = json!([]);
        let c = compare(&old, &new, shape).unwrap();
        assert_eq!(
            (texts(&c.modified), texts(&c.added)),
            (
                vec![".spec.nodeName".into()],
                vec![".metadata.labels.tier".into()]
            )
        );
        let env = r#".spec.containers[name="c"].env[name="A"]"#;
        assert_eq!(
            texts(&c.removed),
            [
                ".metadata.labels.app".to_string(),
                env.into(),
                format!("{env}.name")
            ]
        );
        assert!(compare(&old, &old, shape).unwrap().is_same());

        let mut gone = FieldSet::default();
        gone.insert(&Path::fields(&["metadata", "labels", "app"]).0);
        let mut c0 = Path::fields(&["spec", "containers"]).0;
        c0.push(PathElement::Key(vec![("name".into(), json!("c"))]));
        gone.insert(&c0);
        // Emptied maps and lists go rather than stay as nulls.
        assert_eq!(
            remove(&old, &gone, shape),
            json!({"spec": {"nodeName": "a"}})
        );
    }
}
