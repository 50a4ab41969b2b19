//! One stored form, several API forms: stored bytes <-> the object a
//! resource serves, through its strategy's conversion (events.k8s.io
//! Events are stored as core ones; see [`super::strategy::event`]).

use serde_json::Value;

use super::objects::{decode_stored, encode_for_store};
use super::resources::ResourceDef;

/// Whether `def`'s API form differs from its stored form.
pub fn converts(def: &ResourceDef) -> bool {
    def.strategy.converts()
}

/// Decode stored bytes into `def`'s API form, with resourceVersion set.
pub fn decode(def: &ResourceDef, value: &[u8], revision: i64) -> Option<Value> {
    let obj = decode_stored(value, revision)?;
    Some(if converts(def) {
        def.strategy.to_served(def, obj)
    } else {
        obj
    })
}

/// Bytes to store for an object in `def`'s API form.
pub fn encode(def: &ResourceDef, obj: &Value) -> Vec<u8> {
    if converts(def) {
        encode_for_store(&def.strategy.to_stored(def, obj))
    } else {
        encode_for_store(obj)
    }
}
