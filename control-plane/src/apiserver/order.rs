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

use serde_json::{Map, Value};

use super::protobuf::{fields_of, package, Field, Kind, INLINE};

/// What the value at hand is, as far as order goes.
#[derive(Clone, Copy)]
enum Ty {
    /// A struct: fields in declaration order.
    Msg(&'static [Field]),
    /// A map: keys sorted, values structs of these fields (or of unknown
    /// type).
    Map(Option<&'static [Field]>),
    /// Anything else: a scalar, or an object of unknown type (keys sorted).
    Unknown,
}

const UNKNOWN: Ty = Ty::Unknown;

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
    write(&mut out, v, fields_of(msg).map_or(UNKNOWN, Ty::Msg));
    out
}

/// The message type of a top-level object, from its `apiVersion` and
/// `kind` (`apps/v1` `Deployment` -> `apps.Deployment`; meta kinds such as
/// `Status` whatever group they come under).
fn message_of(obj: &Map<String, Value>) -> Option<&'static [Field]> {
    let kind = obj.get("kind")?.as_str()?;
    let api_version = obj.get("apiVersion")?.as_str()?;
    let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
    package(group)
        .and_then(|p| fields_of(&format!("{p}.{kind}")))
        .or_else(|| fields_of(&format!("meta.{kind}")))
}

fn write_top(out: &mut Vec<u8>, v: &Value) {
    let Value::Object(m) = v else {
        write(out, v, UNKNOWN);
        return;
    };
    let fields = message_of(m);
    out.push(b'{');
    let mut first = true;
    let mut done: Vec<&str> = Vec::with_capacity(m.len());
    for k in ["kind", "apiVersion"] {
        if let Some(v) = m.get(k) {
            key(out, &mut first, k);
            write(out, v, UNKNOWN);
            done.push(k);
        }
    }
    match fields {
        Some(fields) => struct_fields(out, m, fields, &mut first, &mut done),
        None => {
            if let (Some(v), Some(meta)) = (m.get("metadata"), fields_of("meta.ObjectMeta")) {
                key(out, &mut first, "metadata");
                write(out, v, Ty::Msg(meta));
                done.push("metadata");
            }
        }
    }
    rest(out, m, &mut first, &done);
    out.push(b'}');
}

fn key(out: &mut Vec<u8>, first: &mut bool, k: &str) {
    if !*first {
        out.push(b',');
    }
    *first = false;
    let _ = serde_json::to_writer(&mut *out, k);
    out.push(b':');
}

/// The type of one field's value (of each element, for repeated fields).
fn field_ty(f: &Field) -> Ty {
    match f.kind {
        Kind::Msg => fields_of(f.msg).map_or(UNKNOWN, Ty::Msg),
        Kind::Map if f.value == Kind::Msg => Ty::Map(fields_of(f.msg)),
        Kind::Map => Ty::Map(None),
        _ => UNKNOWN,
    }
}

/// The fields of `m` that `fields` declares, in that order; inline
/// (embedded) structs' fields in their place.
fn struct_fields<'m>(
    out: &mut Vec<u8>,
    m: &'m Map<String, Value>,
    fields: &'static [Field],
    first: &mut bool,
    done: &mut Vec<&'m str>,
) {
    for f in fields {
        if f.kind == Kind::Msg && INLINE.contains(&f.name) {
            if let Some(inner) = fields_of(f.msg) {
                struct_fields(out, m, inner, first, done);
            }
            continue;
        }
        if let Some((k, v)) = m.get_key_value(f.name) {
            if done.contains(&k.as_str()) {
                continue;
            }
            key(out, first, k);
            write(out, v, field_ty(f));
            done.push(k);
        }
    }
}

/// The keys of `m` not written yet, sorted (serde_json's map already
/// iterates in key order).
fn rest(out: &mut Vec<u8>, m: &Map<String, Value>, first: &mut bool, done: &[&str]) {
    for (k, v) in m {
        if !done.contains(&k.as_str()) {
            key(out, first, k);
            write(out, v, UNKNOWN);
        }
    }
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
        (Value::Object(m), Ty::Msg(fields)) => {
            out.push(b'{');
            let mut first = true;
            let mut done = Vec::with_capacity(m.len());
            struct_fields(out, m, fields, &mut first, &mut done);
            rest(out, m, &mut first, &done);
            out.push(b'}');
        }
        (Value::Object(m), Ty::Map(values)) => {
            let value = values.map_or(UNKNOWN, Ty::Msg);
            out.push(b'{');
            let mut first = true;
            for (k, v) in m {
                key(out, &mut first, k);
                write(out, v, value);
            }
            out.push(b'}');
        }
        (Value::Object(m), Ty::Unknown) => {
            out.push(b'{');
            let mut first = true;
            for (k, v) in m {
                key(out, &mut first, k);
                write(out, v, UNKNOWN);
            }
            out.push(b'}');
        }
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
