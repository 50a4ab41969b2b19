//! Events: core `v1` Events, and `events.k8s.io/v1` Events, which are the
//! core ones under other field names (upstream stores both in one place
//! too), so `kubectl get events` and `kubectl describe` show what
//! kube-rs's event recorder (which writes events.k8s.io) reports.

use serde_json::{json, Map, Value};

use super::Strategy;
use crate::apiserver::objects;
use crate::apiserver::resources::ResourceDef;
use crate::apiserver::table::{name_cell, s, since, Col};
use crate::apiserver::ApiServer;

/// `core/v1` Events.
pub struct CoreEvent;

/// `events.k8s.io/v1` Events, stored as core ones.
pub struct EventsV1;

/// Fields either form can be selected by (upstream's event field label
/// conversions accept both sets on both groups).
const SELECTABLE: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
    "regarding.kind",
    "regarding.name",
    "regarding.namespace",
    "regarding.uid",
];

impl Strategy for CoreEvent {
    /// `--event-ttl`.
    fn ttl(&self, api: &ApiServer) -> Option<std::time::Duration> {
        api.event_ttl
    }

    fn selectable_fields(&self) -> &'static [&'static str] {
        SELECTABLE
    }

    /// `kubectl get events`: Last Seen first, Name only in the wide view.
    fn columns(&self) -> Vec<Col> {
        vec![
            ("Last Seen", "string", 0, "Time when last this event has been seen."),
            ("Type", "string", 0, "Type of this event (Normal, Warning), new types could be added in the future."),
            ("Reason", "string", 0, "This should be a short, machine understandable string that gives the reason for this event being generated."),
            ("Object", "string", 0, "The object this Event is about."),
            ("Message", "string", 0, "A human-readable description of the status of this operation."),
            ("Subobject", "string", 1, "The field of the object this Event is about."),
            ("Source", "string", 1, "The component reporting this event."),
            ("First Seen", "string", 1, "The time at which the event was first recorded."),
            ("Count", "string", 1, "The number of times this event has occurred."),
            ("Name", "string", 1, "Name must be unique within a namespace."),
        ]
    }

    fn cells(&self, obj: &Value) -> Vec<Value> {
        let last = obj["lastTimestamp"]
            .as_str()
            .or_else(|| obj["eventTime"].as_str())
            .or_else(|| objects::meta_str(obj, "creationTimestamp"))
            .map(since)
            .unwrap_or_else(|| "<unknown>".into());
        let first = obj["firstTimestamp"]
            .as_str()
            .map(since)
            .unwrap_or_else(|| "<unknown>".into());
        let io = &obj["involvedObject"];
        let object = format!("{}/{}", s(&io["kind"]).to_lowercase(), s(&io["name"]));
        let source = match (s(&obj["source"]["component"]), s(&obj["source"]["host"])) {
            (c, h) if !h.is_empty() => format!("{c}, {h}"),
            (c, _) if !c.is_empty() => c,
            _ => s(&obj["reportingComponent"]),
        };
        vec![
            json!(last),
            json!(s(&obj["type"])),
            json!(s(&obj["reason"])),
            json!(object),
            json!(s(&obj["message"]).trim().to_string()),
            json!(s(&io["fieldPath"])),
            json!(source),
            json!(first),
            json!(obj["count"].as_i64().unwrap_or(1)),
            name_cell(obj),
        ]
    }
}

impl Strategy for EventsV1 {
    fn ttl(&self, api: &ApiServer) -> Option<std::time::Duration> {
        api.event_ttl
    }

    fn selectable_fields(&self) -> &'static [&'static str] {
        SELECTABLE
    }

    fn converts(&self) -> bool {
        true
    }

    fn to_stored(&self, _def: &ResourceDef, obj: &Value) -> Value {
        rename(
            obj,
            "v1",
            EVENT_FIELDS.iter().map(|(api, core)| (*api, *core)),
        )
    }

    fn to_served(&self, def: &ResourceDef, obj: Value) -> Value {
        rename(
            &obj,
            &def.api_version(),
            EVENT_FIELDS.iter().map(|(api, core)| (*core, *api)),
        )
    }
}

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

#[cfg(test)]
mod tests {
    use crate::apiserver::resources::lookup;
    use serde_json::json;

    #[test]
    fn events_round_trip_between_forms() {
        let def = lookup("events.k8s.io", "v1", "events").unwrap();
        let api = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e"},
            "regarding": {"kind": "Pod", "name": "p"}, "note": "hi", "reportingController": "c", "eventTime": "2026-01-01T00:00:00.000000Z", "type": "Normal", "reason": "R", "action": "A"});
        let stored = def.strategy.to_stored(def, &api);
        assert_eq!(stored["apiVersion"], "v1");
        assert_eq!(stored["involvedObject"]["name"], "p");
        assert_eq!(stored["message"], "hi");
        assert_eq!(def.strategy.to_served(def, stored), api);
    }
}
