//! One stored form, several API forms: `events.k8s.io/v1` Events are the
//! core `v1` Events under other field names (upstream stores both in one
//! place too), so `kubectl get events` and `kubectl describe` show what
//! kube-rs's event recorder (which writes events.k8s.io) reports.

use serde_json::{Map, Value};

use super::objects::{decode_stored, encode_for_store};
use super::resources::ResourceDef;

/// (events.k8s.io/v1 field, core/v1 field)
const EVENT_FIELDS: &[(&str, &str)] = &[
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("reportingInstance", "reportingInstance"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
    ("eventTime", "eventTime"),
    ("series", "series"),
    ("action", "action"),
    ("reason", "reason"),
    ("type", "type"),
    ("related", "related"),
    ("metadata", "metadata"),
];

/// Whether `def`'s API form differs from its stored form.
pub fn converts(def: &ResourceDef) -> bool {
    def.group == "events.k8s.io"
}

fn rename(
    obj: &Value,
    api_version: &str,
    pairs: impl Iterator<Item = (&'static str, &'static str)>,
) -> Value {
    let mut out = Map::new();
    out.insert("apiVersion".into(), Value::String(api_version.into()));
    out.insert("kind".into(), Value::String("Event".into()));
    for (from, to) in pairs {
        if let Some(v) = obj.get(from).filter(|v| !v.is_null()) {
            out.insert(to.to_string(), v.clone());
        }
    }
    Value::Object(out)
}

/// API form -> stored form.
pub fn to_storage(def: &ResourceDef, obj: &Value) -> Value {
    if !converts(def) {
        return obj.clone();
    }
    rename(
        obj,
        "v1",
        EVENT_FIELDS.iter().map(|(api, core)| (*api, *core)),
    )
}

/// Stored form -> API form.
pub fn from_storage(def: &ResourceDef, obj: Value) -> Value {
    if !converts(def) {
        return obj;
    }
    rename(
        &obj,
        &def.api_version(),
        EVENT_FIELDS.iter().map(|(api, core)| (*core, *api)),
    )
}

/// Decode stored bytes into `def`'s API form, with resourceVersion set.
pub fn decode(def: &ResourceDef, value: &[u8], revision: i64) -> Option<Value> {
    decode_stored(value, revision).map(|v| from_storage(def, v))
}

/// Bytes to store for an object in `def`'s API form.
pub fn encode(def: &ResourceDef, obj: &Value) -> Vec<u8> {
    if converts(def) {
        encode_for_store(&to_storage(def, obj))
    } else {
        encode_for_store(obj)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::resources::lookup;
    use serde_json::json;

    #[test]
    fn events_round_trip_between_forms() {
        let def = lookup("events.k8s.io", "v1", "events").unwrap();
        let api = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e"},
            "regarding": {"kind": "Pod", "name": "p"}, "note": "hi", "reportingController": "c", "eventTime": "2026-01-01T00:00:00.000000Z", "type": "Normal", "reason": "R", "action": "A"});
        let stored = to_storage(def, &api);
        assert_eq!(stored["apiVersion"], "v1");
        assert_eq!(stored["involvedObject"]["name"], "p");
        assert_eq!(stored["message"], "hi");
        assert_eq!(from_storage(def, stored), api);
    }
}
