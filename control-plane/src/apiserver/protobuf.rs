//! Kubernetes protobuf request bodies (`application/vnd.kubernetes.protobuf`)
//! decoded into the JSON form the rest of the server works on.
//!
//! kubectl's typed commands (`kubectl create secret|configmap|namespace|
//! rolebinding|deployment ...`) send protobuf and do not fall back to JSON,
//! so the server must read it. The envelope is the magic `k8s\0` followed by
//! a `runtime.Unknown` whose `raw` holds the object; field numbers and names
//! come from [`super::protobuf_schema`].

use base64::Engine;
use serde_json::{json, Map, Value};

use super::protobuf_schema::MESSAGES;

/// Decoding errors (answered as 400).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("protobuf body does not start with the k8s\\0 magic")]
    Magic,
    #[error("truncated or malformed protobuf at byte {0}")]
    Malformed(usize),
    #[error("protobuf is not supported for {0}; send JSON or YAML")]
    Unsupported(String),
}

/// A field's wire/JSON kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Str,
    Bytes,
    I32,
    I64,
    Bool,
    F32,
    F64,
    Msg,
    MapStr,
    MapBytes,
    Time,
    MicroTime,
    Duration,
    IntOrString,
    Quantity,
    Raw,
}

/// One message field.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    pub num: u32,
    pub name: &'static str,
    pub kind: Kind,
    pub repeated: bool,
    /// Message type (`core.PodSpec`) for `Kind::Msg`.
    pub msg: &'static str,
}

/// Go embeds these structs, so their fields sit in the parent's JSON.
const INLINE: &[&str] = &[
    "localObjectReference",
    "volumeSource",
    "persistentVolumeSource",
    "ephemeralContainerCommon",
    "handler",
    "volumeStatus",
];

fn fields_of(msg: &str) -> Option<&'static [Field]> {
    MESSAGES
        .binary_search_by(|(n, _)| (*n).cmp(msg))
        .ok()
        .map(|i| MESSAGES[i].1)
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, Error> {
        let mut v: u64 = 0;
        for shift in (0..64).step_by(7) {
            let b = *self.buf.get(self.pos).ok_or(Error::Malformed(self.pos))?;
            self.pos += 1;
            v |= ((b & 0x7f) as u64) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(Error::Malformed(self.pos))
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], Error> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|e| *e <= self.buf.len())
            .ok_or(Error::Malformed(self.pos))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn done(&self) -> bool {
        self.pos >= self.buf.len()
    }
}

/// One raw field occurrence.
enum Raw<'a> {
    Varint(u64),
    Fixed64(u64),
    Bytes(&'a [u8]),
    Fixed32(u32),
}

fn fields(buf: &[u8]) -> Result<Vec<(u32, Raw<'_>)>, Error> {
    let mut r = Reader { buf, pos: 0 };
    let mut out = Vec::new();
    while !r.done() {
        let key = r.varint()?;
        let (num, wt) = ((key >> 3) as u32, key & 7);
        let v = match wt {
            0 => Raw::Varint(r.varint()?),
            1 => Raw::Fixed64(u64::from_le_bytes(
                r.take(8)?.try_into().map_err(|_| Error::Malformed(r.pos))?,
            )),
            2 => {
                let n = r.varint()? as usize;
                Raw::Bytes(r.take(n)?)
            }
            5 => Raw::Fixed32(u32::from_le_bytes(
                r.take(4)?.try_into().map_err(|_| Error::Malformed(r.pos))?,
            )),
            _ => return Err(Error::Malformed(r.pos)),
        };
        out.push((num, v));
    }
    Ok(out)
}

fn b64(b: &[u8]) -> Value {
    json!(base64::engine::general_purpose::STANDARD.encode(b))
}

fn time(b: &[u8], micro: bool) -> Result<Value, Error> {
    let (mut secs, mut nanos) = (None, 0i64);
    for (n, v) in fields(b)? {
        match (n, v) {
            (1, Raw::Varint(x)) => secs = Some(x as i64),
            (2, Raw::Varint(x)) => nanos = x as i32 as i64,
            _ => {}
        }
    }
    // A zero time is sent as an empty message: it means "unset".
    let Some(secs) = secs.filter(|s| *s != -62135596800) else {
        return Ok(Value::Null);
    };
    let t = chrono::DateTime::from_timestamp(secs, nanos as u32).ok_or(Error::Malformed(0))?;
    let fmt = if micro {
        chrono::SecondsFormat::Micros
    } else {
        chrono::SecondsFormat::Secs
    };
    Ok(json!(t.to_rfc3339_opts(fmt, true)))
}

fn scalar(kind: Kind, v: &Raw<'_>) -> Result<Value, Error> {
    Ok(match (kind, v) {
        (Kind::Str, Raw::Bytes(b)) => json!(String::from_utf8_lossy(b)),
        (Kind::Bytes, Raw::Bytes(b)) => b64(b),
        (Kind::I32, Raw::Varint(x)) => json!(*x as i32),
        (Kind::I64, Raw::Varint(x)) => json!(*x as i64),
        (Kind::Duration, Raw::Varint(x)) => json!(*x as i64),
        (Kind::Bool, Raw::Varint(x)) => json!(*x != 0),
        (Kind::F64, Raw::Fixed64(x)) => json!(f64::from_bits(*x)),
        (Kind::F32, Raw::Fixed32(x)) => json!(f32::from_bits(*x)),
        (Kind::Time, Raw::Bytes(b)) => time(b, false)?,
        (Kind::MicroTime, Raw::Bytes(b)) => time(b, true)?,
        (Kind::Quantity, Raw::Bytes(b)) => {
            let mut s = Value::Null;
            for (n, v) in fields(b)? {
                if let (1, Raw::Bytes(x)) = (n, v) {
                    s = json!(String::from_utf8_lossy(x));
                }
            }
            s
        }
        (Kind::IntOrString, Raw::Bytes(b)) => {
            let (mut ty, mut i, mut s) = (0u64, 0i64, String::new());
            for (n, v) in fields(b)? {
                match (n, v) {
                    (1, Raw::Varint(x)) => ty = x,
                    (2, Raw::Varint(x)) => i = x as i32 as i64,
                    (3, Raw::Bytes(x)) => s = String::from_utf8_lossy(x).into_owned(),
                    _ => {}
                }
            }
            if ty == 1 {
                json!(s)
            } else {
                json!(i)
            }
        }
        (Kind::Raw, Raw::Bytes(b)) => {
            let mut raw = Value::Null;
            for (n, v) in fields(b)? {
                if let (1, Raw::Bytes(x)) = (n, v) {
                    raw = serde_json::from_slice(x).unwrap_or(Value::Null);
                }
            }
            raw
        }
        _ => return Err(Error::Malformed(0)),
    })
}

fn map_entry(b: &[u8], bytes: bool) -> Result<(String, Value), Error> {
    let (mut k, mut v) = (String::new(), json!(""));
    for (n, raw) in fields(b)? {
        match (n, raw) {
            (1, Raw::Bytes(x)) => k = String::from_utf8_lossy(x).into_owned(),
            (2, Raw::Bytes(x)) => {
                v = if bytes {
                    b64(x)
                } else {
                    json!(String::from_utf8_lossy(x))
                }
            }
            _ => {}
        }
    }
    Ok((k, v))
}

/// Decode message `msg` into a JSON object.
fn message(buf: &[u8], msg: &str, depth: usize) -> Result<Map<String, Value>, Error> {
    if depth > 64 {
        return Err(Error::Malformed(0));
    }
    let Some(schema) = fields_of(msg) else {
        return Ok(Map::new());
    };
    let mut out = Map::new();
    for (num, raw) in fields(buf)? {
        let Some(f) = schema.iter().find(|f| f.num == num) else {
            continue;
        };
        match f.kind {
            Kind::MapStr | Kind::MapBytes => {
                if let Raw::Bytes(b) = raw {
                    let (k, v) = map_entry(b, f.kind == Kind::MapBytes)?;
                    out.entry(f.name).or_insert_with(|| json!({}))[k] = v;
                }
            }
            Kind::Msg => {
                let Raw::Bytes(b) = raw else {
                    return Err(Error::Malformed(0));
                };
                let v = message(b, f.msg, depth + 1)?;
                if f.repeated {
                    push(&mut out, f.name, Value::Object(v));
                } else if INLINE.contains(&f.name) {
                    out.extend(v);
                } else {
                    out.insert(f.name.to_string(), Value::Object(v));
                }
            }
            k => {
                // Repeated scalars may come packed (one length-delimited run).
                if f.repeated && matches!(k, Kind::I32 | Kind::I64 | Kind::Bool) {
                    if let Raw::Bytes(b) = raw {
                        let mut r = Reader { buf: b, pos: 0 };
                        while !r.done() {
                            let x = r.varint()?;
                            push(&mut out, f.name, scalar(k, &Raw::Varint(x))?);
                        }
                        continue;
                    }
                }
                let v = scalar(k, &raw)?;
                if f.repeated {
                    push(&mut out, f.name, v);
                } else if v.is_null() || v.as_str() == Some("") {
                    // Go sends empty non-pointer strings; JSON omits them.
                } else {
                    out.insert(f.name.to_string(), v);
                }
            }
        }
    }
    Ok(out)
}

fn push(out: &mut Map<String, Value>, name: &str, v: Value) {
    if let Some(a) = out.entry(name).or_insert_with(|| json!([])).as_array_mut() {
        a.push(v);
    }
}

/// Proto package of an API group.
fn package(group: &str) -> Option<&'static str> {
    match group {
        "" => Some("core"),
        "apps" => Some("apps"),
        "batch" => Some("batch"),
        "rbac.authorization.k8s.io" => Some("rbac"),
        "authorization.k8s.io" => Some("authorization"),
        "certificates.k8s.io" => Some("certificates"),
        _ => None,
    }
}

/// Decode a `k8s\0`-framed body into a JSON object with apiVersion/kind.
///
/// # Errors
/// Bad framing, malformed protobuf, or a kind without a protobuf table.
pub fn decode(body: &[u8]) -> Result<Value, Error> {
    let rest = body.strip_prefix(b"k8s\0").ok_or(Error::Magic)?;
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), &[][..]);
    for (n, v) in fields(rest)? {
        match (n, v) {
            (1, Raw::Bytes(tm)) => {
                for (m, x) in fields(tm)? {
                    match (m, x) {
                        (1, Raw::Bytes(s)) => api_version = String::from_utf8_lossy(s).into_owned(),
                        (2, Raw::Bytes(s)) => kind = String::from_utf8_lossy(s).into_owned(),
                        _ => {}
                    }
                }
            }
            (2, Raw::Bytes(b)) => raw = b,
            _ => {}
        }
    }
    let group = api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or("");
    let pkg = package(group).ok_or_else(|| Error::Unsupported(format!("{api_version} {kind}")))?;
    let msg = format!("{pkg}.{kind}");
    if fields_of(&msg).is_none() {
        return Err(Error::Unsupported(format!("{api_version} {kind}")));
    }
    let mut obj = message(raw, &msg, 0)?;
    obj.insert("apiVersion".into(), json!(api_version));
    obj.insert("kind".into(), json!(kind));
    Ok(Value::Object(obj))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        varint(((num as u64) << 3) | 2, out);
        varint(data.len() as u64, out);
        out.extend_from_slice(data);
    }

    #[test]
    fn decodes_a_secret_envelope() {
        let mut meta = Vec::new();
        ld(1, b"s1", &mut meta);
        ld(2, b"", &mut meta); // empty generateName: dropped
        let mut entry = Vec::new();
        ld(1, b"k", &mut entry);
        ld(2, b"v", &mut entry);
        let mut secret = Vec::new();
        ld(1, &meta, &mut secret);
        ld(2, &entry, &mut secret);
        ld(3, b"Opaque", &mut secret);
        let mut tm = Vec::new();
        ld(1, b"v1", &mut tm);
        ld(2, b"Secret", &mut tm);
        let mut unknown = Vec::new();
        ld(1, &tm, &mut unknown);
        ld(2, &secret, &mut unknown);
        let mut body = b"k8s\0".to_vec();
        body.extend(unknown);
        let v = decode(&body).unwrap();
        assert_eq!(
            v,
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s1"}, "data": {"k": "dg=="}, "type": "Opaque"})
        );
        assert_eq!(decode(b"nope"), Err(Error::Magic));
        assert!(decode(b"k8s\0\x0a\xff").is_err());
    }

    #[test]
    fn schema_is_sorted_for_binary_search() {
        assert!(MESSAGES.windows(2).all(|w| w[0].0 < w[1].0));
        assert!(fields_of("core.PodSpec").is_some());
    }
}
