//! JSON written in the order upstream writes it: Go's encoder puts struct
//! fields in declaration order (TypeMeta's `kind` and `apiVersion` first,
//! then `metadata`, `spec`, `status`, each struct's fields as declared)
//! and sorts map keys, and `json.Encoder` ends each value with a newline.
//! Some clients compare bodies byte for byte or report errors by column,
//! so the server stores and answers in that order.
//!
//! The declaration order comes from the protobuf field table (the
//! `.proto` files list fields in Go struct order, whatever their numbers).
//! Objects of a type the table lacks keep `kind`, `apiVersion`, `metadata`
//! first and sort the rest, as Go does for unstructured objects.

use std::io::Write;
use std::sync::OnceLock;

use serde_json::{Map, Value};

use super::protobuf::{all_fields, fields_of, message_index, package, Field, Kind, INLINE};

/// What the value at hand is, as far as order goes.
#[derive(Clone, Copy)]
enum Ty {
    /// A struct: fields in declaration order (an index into [`orders`]).
    Msg(usize),
    /// A map: keys sorted, values structs of this message (or of unknown
    /// type).
    Map(Option<usize>),
    /// Anything else: a scalar, or an object of unknown type (keys sorted).
    Unknown,
}

const UNKNOWN: Ty = Ty::Unknown;

/// One message's fields by name: each one's place in Go's order (embedded
/// structs' fields in their place; the first of a repeated name wins) and
/// the type of its value. Sorted by name for lookup: an object is written
/// by looking up the keys it has, not by probing for every field its type
/// declares (a PodSpec declares forty).
struct Order(Vec<(&'static str, usize, Ty)>);

impl Order {
    fn of(fields: &'static [Field]) -> Order {
        fn flatten(fields: &'static [Field], out: &mut Vec<(&'static str, usize, Ty)>) {
            for f in fields {
                if f.kind == Kind::Msg && INLINE.contains(&f.name) {
                    if let Some(inner) = fields_of(f.msg) {
                        flatten(inner, out);
                    }
                } else if !out.iter().any(|(n, _, _)| *n == f.name) {
                    out.push((f.name, out.len(), field_ty(f)));
                }
            }
        }
        let mut slots = Vec::with_capacity(fields.len());
        flatten(fields, &mut slots);
        slots.sort_unstable_by_key(|(name, _, _)| *name);
        Order(slots)
    }

    /// `key`'s place and value type; unknown keys after every field.
    fn slot(&self, key: &str) -> (usize, Ty) {
        match self.0.binary_search_by(|(n, _, _)| (*n).cmp(key)) {
            Ok(i) => (self.0[i].1, self.0[i].2),
            Err(_) => (usize::MAX, UNKNOWN),
        }
    }
}

/// Every message's [`Order`], by its index in the field table; built once.
fn orders() -> &'static [Order] {
    static ORDERS: OnceLock<Vec<Order>> = OnceLock::new();
    ORDERS.get_or_init(|| all_fields().map(Order::of).collect())
}

/// The type of one field's value (of each element, for repeated fields).
fn field_ty(f: &Field) -> Ty {
    match f.kind {
        Kind::Msg => message_index(f.msg).map_or(UNKNOWN, Ty::Msg),
        Kind::Map if f.value == Kind::Msg => Ty::Map(message_index(f.msg)),
        Kind::Map => Ty::Map(None),
        _ => UNKNOWN,
    }
}

/// `object` (a top-level object with `apiVersion` and `kind`) as JSON in
/// upstream's order, without the trailing newline.
pub fn to_vec(object: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(512);
    write_top(&mut out, object);
    out
}

/// `v`, of message type `msg` (`meta.ListMeta`), in upstream's order.
pub fn typed_to_vec(v: &Value, msg: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    write(&mut out, v, message_index(msg).map_or(UNKNOWN, Ty::Msg));
    out
}

/// The message type of a top-level object, from its `apiVersion` and
/// `kind` (`apps/v1` `Deployment` -> `apps.Deployment`; meta kinds such as
/// `Status` whatever group they come under).
fn message_of(obj: &Map<String, Value>) -> Option<usize> {
    let kind = obj.get("kind")?.as_str()?;
    let api_version = obj.get("apiVersion")?.as_str()?;
    let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
    package(group)
        .and_then(|p| message_index(&format!("{p}.{kind}")))
        .or_else(|| message_index(&format!("meta.{kind}")))
}

/// `kind` and `apiVersion` first, then the message's fields in order (for
/// a type the table lacks: `metadata`), then the other keys sorted.
fn write_top(out: &mut Vec<u8>, v: &Value) {
    let Value::Object(m) = v else {
        write(out, v, UNKNOWN);
        return;
    };
    let order = message_of(m).map(|i| &orders()[i]);
    write_fields(out, m, |k| match (k, order) {
        ("kind", _) => (0, UNKNOWN),
        ("apiVersion", _) => (1, UNKNOWN),
        (_, Some(order)) => {
            let (at, ty) = order.slot(k);
            (at.saturating_add(2), ty)
        }
        ("metadata", None) => (2, message_index("meta.ObjectMeta").map_or(UNKNOWN, Ty::Msg)),
        (_, None) => (usize::MAX, UNKNOWN),
    });
}

/// The entries of `m` ordered by the place `slot` gives each key; keys of
/// the same place (those it does not know) keep the map's sorted order.
fn write_fields(out: &mut Vec<u8>, m: &Map<String, Value>, slot: impl Fn(&str) -> (usize, Ty)) {
    let mut entries: Vec<(usize, &String, &Value, Ty)> = m
        .iter()
        .map(|(k, v)| {
            let (at, ty) = slot(k);
            (at, k, v, ty)
        })
        .collect();
    entries.sort_by_key(|(at, _, _, _)| *at);
    write_entries(out, entries.into_iter().map(|(_, k, v, ty)| (k, v, ty)));
}

/// The entries of `m` in its own (sorted) order, every value of type `ty`.
fn write_sorted(out: &mut Vec<u8>, m: &Map<String, Value>, ty: Ty) {
    write_entries(out, m.iter().map(|(k, v)| (k, v, ty)));
}

/// One JSON object of these entries, in this order.
fn write_entries<'a>(
    out: &mut Vec<u8>,
    entries: impl Iterator<Item = (&'a String, &'a Value, Ty)>,
) {
    out.push(b'{');
    for (i, (k, v, ty)) in entries.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let _ = serde_json::to_writer(&mut *out, k);
        out.push(b':');
        write(out, v, ty);
    }
    out.push(b'}');
}

fn write(out: &mut Vec<u8>, v: &Value, ty: Ty) {
    match (v, ty) {
        (Value::Array(a), _) => {
            out.push(b'[');
            for (i, e) in a.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(out, e, ty);
            }
            out.push(b']');
        }
        (Value::Object(m), Ty::Msg(i)) => {
            let order = &orders()[i];
            write_fields(out, m, |k| order.slot(k));
        }
        (Value::Object(m), Ty::Map(values)) => {
            write_sorted(out, m, values.map_or(UNKNOWN, Ty::Msg))
        }
        (Value::Object(m), Ty::Unknown) => write_sorted(out, m, UNKNOWN),
        (scalar, _) => {
            let _ = serde_json::to_writer(&mut *out, scalar);
        }
    }
}

/// `json.Encoder`'s newline after a value.
pub fn with_newline(mut body: Vec<u8>) -> Vec<u8> {
    if body.last() != Some(&b'\n') {
        let _ = body.write_all(b"\n");
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn text(v: &Value) -> String {
        String::from_utf8(to_vec(v)).unwrap()
    }

    #[test]
    fn objects_come_out_in_go_struct_order() {
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "status": {"phase": "Pending"},
            "spec": {"restartPolicy": "Always", "containers": [{"image": "i", "name": "c",
                "resources": {"limits": {"memory": "1Gi", "cpu": "1"}}}]},
            "metadata": {"uid": "u", "name": "p", "labels": {"z": "1", "a": "2"}, "namespace": "d"}});
        assert_eq!(
            text(&pod),
            r#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"d","uid":"u","labels":{"a":"2","z":"1"}},"spec":{"containers":[{"name":"c","image":"i","resources":{"limits":{"cpu":"1","memory":"1Gi"}}}],"restartPolicy":"Always"},"status":{"phase":"Pending"}}"#
        );
        // Embedded structs' fields sit where Go puts them (VolumeSource).
        let vol = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"volumes": [{"emptyDir": {}, "name": "v"}], "containers": []}});
        assert!(
            text(&vol).contains(r#""volumes":[{"name":"v","emptyDir":{}}]"#),
            "{}",
            text(&vol)
        );
    }

    #[test]
    fn a_status_comes_out_as_upstream_writes_it() {
        let st = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "m", "reason": "Invalid", "code": 422,
            "details": {"causes": [{"field": "f", "message": "x", "reason": "FieldValueRequired"}],
                        "kind": "Pod", "name": "p", "group": ""}});
        assert_eq!(
            text(&st),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"m","reason":"Invalid","details":{"name":"p","group":"","kind":"Pod","causes":[{"reason":"FieldValueRequired","message":"x","field":"f"}]},"code":422}"#
        );
    }

    #[test]
    fn kinds_without_a_table_keep_type_and_metadata_first() {
        let lease = json!({"spec": {"holderIdentity": "n1"}, "metadata": {"namespace": "kube-node-lease", "name": "n1"},
            "kind": "Lease", "apiVersion": "coordination.k8s.io/v1"});
        assert_eq!(
            text(&lease),
            r#"{"kind":"Lease","apiVersion":"coordination.k8s.io/v1","metadata":{"name":"n1","namespace":"kube-node-lease"},"spec":{"holderIdentity":"n1"}}"#
        );
        assert_eq!(with_newline(b"{}".to_vec()), b"{}\n");
    }
}
