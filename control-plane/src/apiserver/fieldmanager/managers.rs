//! `metadata.managedFields` (upstream `managedfields/internal`) decoded and
//! encoded, and structured-merge-diff's two writes (`merge.Updater`): an
//! update (create, PUT, non-apply PATCH) moving what it changes to its
//! writer, and an apply that merges, prunes and will not take fields from
//! other managers unless forced.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::conflict::Conflicts;
use super::merge::{self, compare, field_set, prune};
use super::path::{go_json, value_eq, Path};
use super::schema::Shape;
use super::set::{self, FieldSet};

/// Update managers an object keeps before the oldest are merged (upstream
/// `DefaultMaxUpdateManagers`).
pub const MAX_UPDATE_MANAGERS: usize = 10;

/// The update manager the oldest ones are merged into past the cap.
pub const ANCIENT_CHANGES: &str = "ancient-changes";

/// Fields no manager owns: identity and what the server keeps (upstream
/// `stripmeta.go`).
const STRIPPED: &str = "apiVersion kind metadata metadata.name metadata.namespace \
    metadata.creationTimestamp metadata.selfLink metadata.uid metadata.clusterName \
    metadata.generation metadata.managedFields metadata.resourceVersion";

/// [`STRIPPED`] as a set, built once: every write subtracts it.
fn stripped() -> &'static FieldSet {
    static SET: std::sync::LazyLock<FieldSet> = std::sync::LazyLock::new(|| {
        let mut s = FieldSet::default();
        for p in STRIPPED.split_whitespace() {
            s.insert(&Path::fields(&p.split('.').collect::<Vec<_>>()).0);
        }
        s
    });
    &SET
}

/// A `metadata.managedFields` that does not decode.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Not a list, or an entry breaking upstream's rules: operation Apply
    /// or Update, a non-empty apiVersion, fieldsType FieldsV1.
    #[error("invalid managedFields: {0}")]
    Invalid(String),
    /// An entry's fieldsV1 does not decode.
    #[error("error decoding versioned set from managed fields entry {index}: {source}")]
    Fields { index: usize, source: set::Error },
}

/// Why an apply is refused.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The configuration cannot be applied at all (400).
    #[error("{0}")]
    BadRequest(String),
    /// The configuration or live object has lists that cannot be merged
    /// (upstream answers 500).
    #[error("failed to merge config: {0}")]
    Merge(#[from] merge::Error),
    /// Fields other managers own would change (409, see [`Conflicts::causes`]).
    #[error("{0}")]
    Conflict(Conflicts),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Operation {
    Apply,
    Update,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Apply => "Apply",
            Operation::Update => "Update",
        }
    }
}

/// Who owns a set of fields (upstream's manager identifier). An applier
/// keeps one entry whatever version it applies in (`api_version` empty);
/// an updater has one per apiVersion and subresource.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ManagerId {
    pub manager: String,
    pub operation: Operation,
    pub api_version: String,
    pub subresource: String,
}

impl ManagerId {
    /// The JSON upstream keys managers by (`BuildManagerIdentifier`), and
    /// sorts conflicts by.
    pub fn identifier(&self) -> String {
        let fields = [
            ("manager", self.manager.as_str()),
            ("operation", self.operation.as_str()),
            ("apiVersion", self.api_version.as_str()),
            ("subresource", self.subresource.as_str()),
        ];
        let present = fields.iter().filter(|(_, v)| !v.is_empty());
        let pairs: Vec<String> = present
            .map(|(k, v)| format!("\"{k}\":{}", go_json(&Value::from(*v))))
            .collect();
        format!("{{{}}}", pairs.join(","))
    }
}

/// What one manager owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The version `fields` are named in.
    pub api_version: String,
    /// RFC 3339: when the manager last changed the object.
    pub time: Option<String>,
    pub fields: FieldSet,
}

/// An object's managers and what each owns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ManagedFields(BTreeMap<ManagerId, Entry>);

/// The request that writes: who, in which version, to which subresource.
#[derive(Debug, Clone, Default)]
pub struct Writer {
    pub manager: String,
    pub api_version: String,
    /// "" for the main resource, or `status`, `scale`, ...
    pub subresource: String,
    /// The strategy's reset fields for this (sub)resource, `status` for the
    /// main one (upstream `IgnoredFields`): changes there move no
    /// ownership and never conflict, and appliers do not own them.
    pub reset: FieldSet,
}

impl Writer {
    pub fn new(manager: impl Into<String>, api_version: impl Into<String>) -> Self {
        let (manager, api_version) = (manager.into(), api_version.into());
        Writer {
            manager,
            api_version,
            ..Writer::default()
        }
    }

    pub fn id(&self, operation: Operation) -> ManagerId {
        let api_version = if operation == Operation::Update {
            self.api_version.clone()
        } else {
            String::new()
        };
        ManagerId {
            manager: self.manager.clone(),
            operation,
            api_version,
            subresource: self.subresource.clone(),
        }
    }
}

/// An entry's time in seconds since the epoch; 0, as upstream's nil time,
/// when absent or unreadable.
fn seconds(time: Option<&str>) -> i64 {
    let parsed = time.and_then(|t| t.parse::<jiff::Timestamp>().ok());
    parsed.map_or(0, |t| t.as_second())
}

impl ManagedFields {
    /// Decode a `metadata.managedFields` list (null: no managers). A later
    /// entry with an earlier one's identifier replaces it, as upstream.
    ///
    /// # Errors
    /// What upstream's `decodeManagedFields` refuses, and fields of the
    /// wrong JSON type.
    pub fn decode(list: &Value) -> Result<Self, Error> {
        let items = match list {
            Value::Null => return Ok(Self::default()),
            Value::Array(items) => items,
            _ => return Err(Error::Invalid("must be a list".into())),
        };
        let mut entries = BTreeMap::new();
        for (index, e) in items.iter().enumerate() {
            let bad = |why: &str| Error::Invalid(format!("entry {index}: {why}"));
            let text = |name: &str| match e.get(name) {
                None | Some(Value::Null) => Ok(String::new()),
                Some(Value::String(s)) => Ok(s.clone()),
                Some(_) => Err(bad(&format!("{name} must be a string"))),
            };
            let operation = match text("operation")?.as_str() {
                "Apply" => Operation::Apply,
                "Update" => Operation::Update,
                _ => return Err(bad("operation must be `Apply` or `Update`")),
            };
            let api_version = text("apiVersion")?;
            if api_version.is_empty() {
                return Err(bad("apiVersion must not be empty"));
            }
            match text("fieldsType")?.as_str() {
                "FieldsV1" => {}
                "" => return Err(bad("missing fieldsType")),
                other => return Err(bad(&format!("invalid fieldsType {other:?}"))),
            }
            let fields = FieldSet::from_fields_v1(e.get("fieldsV1").unwrap_or(&Value::Null))
                .map_err(|source| Error::Fields { index, source })?;
            let mut writer = Writer::new(text("manager")?, api_version.clone());
            writer.subresource = text("subresource")?;
            let id = writer.id(operation);
            let time = Some(text("time")?).filter(|t| !t.is_empty());
            entries.insert(
                id,
                Entry {
                    api_version,
                    time,
                    fields,
                },
            );
        }
        Ok(ManagedFields(entries))
    }

    /// The `metadata.managedFields` list in upstream's order: Apply entries
    /// first, then by time, manager, apiVersion, subresource.
    pub fn encode(&self) -> Value {
        let mut list: Vec<(&ManagerId, &Entry)> = self.0.iter().collect();
        list.sort_by_key(|(id, e)| {
            (
                id.operation,
                seconds(e.time.as_deref()),
                &id.manager,
                &e.api_version,
                &id.subresource,
            )
        });
        let entry = |(id, e): (&ManagerId, &Entry)| {
            let fields = e.fields.to_fields_v1();
            let mut m = json!({"operation": id.operation.as_str(), "apiVersion": e.api_version, "fieldsType": "FieldsV1", "fieldsV1": fields});
            for (k, v) in [("manager", &id.manager), ("subresource", &id.subresource)] {
                if !v.is_empty() {
                    m[k] = Value::from(v.as_str());
                }
            }
            if let Some(t) = &e.time {
                m["time"] = Value::from(t.as_str());
            }
            m
        };
        Value::Array(list.into_iter().map(entry).collect())
    }

    /// Set `obj`'s `metadata.managedFields`, or remove it when no manager
    /// is left (upstream omits an empty list).
    pub fn write_to(&self, obj: &mut Value) {
        let Some(root) = obj.as_object_mut() else {
            return;
        };
        let meta = root
            .entry("metadata")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(meta) = meta.as_object_mut() {
            if self.0.is_empty() {
                meta.remove("managedFields");
            } else {
                meta.insert("managedFields".into(), self.encode());
            }
        }
    }

    pub fn get(&self, id: &ManagerId) -> Option<&Entry> {
        self.0.get(id)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&ManagerId, &Entry)> {
        self.0.iter()
    }

    /// Take `fields` from every manager but `except`; drop those left empty.
    fn take(&mut self, fields: &FieldSet, except: Option<&ManagerId>) {
        for (_, e) in self.0.iter_mut().filter(|(id, _)| Some(*id) != except) {
            e.fields = e.fields.difference(fields);
        }
        self.0.retain(|_, e| !e.fields.is_empty());
    }

    /// Upstream `capUpdateManagers`: past [`MAX_UPDATE_MANAGERS`] update
    /// entries, the oldest are merged into an `ancient-changes` entry per
    /// apiVersion (the first of a version only once a second one comes).
    fn cap_updates(&mut self) {
        let mut updaters: Vec<(i64, String, ManagerId)> = (self.0.iter())
            .filter(|(id, _)| id.operation == Operation::Update)
            .map(|(id, e)| (seconds(e.time.as_deref()), id.identifier(), id.clone()))
            .collect();
        updaters.sort();
        let mut left = updaters.len();
        let mut first_of: BTreeMap<String, ManagerId> = BTreeMap::new();
        for (_, _, id) in updaters {
            let Some(entry) = self.0.get(&id).cloned() else {
                continue;
            };
            let version = entry.api_version.clone();
            let bucket = Writer::new(ANCIENT_CHANGES, &version).id(Operation::Update);
            if left <= MAX_UPDATE_MANAGERS {
                break;
            }
            let Some(first) = first_of.get(&version) else {
                first_of.insert(version, id);
                continue;
            };
            if id == bucket {
                continue;
            }
            if !self.0.contains_key(&bucket) {
                if let Some(moved) = self.0.remove(first) {
                    self.0.insert(bucket.clone(), moved);
                }
            }
            self.0.remove(&id);
            if let Some(b) = self.0.get_mut(&bucket) {
                b.fields = b.fields.union(&entry.fields);
                // The merged entry is the more recent.
                b.time = entry.time;
            }
            left -= 1;
        }
    }
}

/// Ownership after a write that is not an apply (upstream `Updater.Update`
/// with the managedFields updater, strip and cap wrappers): every manager,
/// the writer's own entry too, loses what the write changed or removed;
/// the writer gains what it changed or added, stamped `now`.
///
/// # Errors
/// A list item of `old` or `new` that cannot be named; upstream then drops
/// managedFields rather than fail the write.
pub fn update(
    old: &Value,
    new: &Value,
    shape: Shape,
    mut managers: ManagedFields,
    writer: &Writer,
    now: &str,
) -> merge::Result<ManagedFields> {
    let mut cmp = compare(old, new, shape)?;
    if !writer.reset.is_empty() {
        cmp = cmp.excluding(&writer.reset);
    }
    let mut touched = cmp.added;
    touched.extend(&cmp.modified);
    // Creates, the most common write, find no managers to take from.
    if !managers.0.is_empty() {
        managers.take(&touched.union(&cmp.removed), None);
    }
    let gained = touched.difference(stripped());
    if !gained.is_empty() {
        let blank = || Entry {
            api_version: writer.api_version.clone(),
            time: None,
            fields: FieldSet::default(),
        };
        let e = managers
            .0
            .entry(writer.id(Operation::Update))
            .or_insert_with(blank);
        e.fields = e.fields.union(&gained);
        e.time = Some(now.to_string());
    }
    managers.cap_updates();
    Ok(managers)
}

/// A server-side apply of `config` to `live` (upstream `Updater.Apply`):
/// the merged object and the managers after it.
///
/// The applier comes to own exactly what `config` sets. What it applied
/// before and no longer does leaves the object unless another manager
/// owns it. Fields the apply changes (not those it sets to the value they
/// have) that others own are conflicts: refused, or with `force` taken.
///
/// # Guarantees
/// Applying the same configuration again returns `live` unchanged and the
/// same managers: the caller can skip the write.
///
/// # Errors
/// [`ApplyError::BadRequest`] for a config that is no object or sets
/// managedFields, [`ApplyError::Merge`], [`ApplyError::Conflict`].
pub fn apply(
    live: &Value,
    config: &Value,
    shape: Shape,
    mut managers: ManagedFields,
    writer: &Writer,
    force: bool,
    now: &str,
) -> Result<(Value, ManagedFields), ApplyError> {
    if !config.is_object() {
        return Err(ApplyError::BadRequest(
            "the apply configuration must be an object".into(),
        ));
    }
    if config
        .pointer("/metadata/managedFields")
        .is_some_and(|m| !m.is_null())
    {
        return Err(ApplyError::BadRequest(
            "metadata.managedFields must be nil".into(),
        ));
    }
    let id = writer.id(Operation::Apply);
    let mut merged = merge::merge(live, config, shape)?;
    let fields = field_set(config, shape)?.recursive_difference(&writer.reset);
    let last = managers.0.insert(
        id.clone(),
        Entry {
            api_version: writer.api_version.clone(),
            time: None,
            fields,
        },
    );
    if let Some(last) = last.as_ref().filter(|l| !l.fields.is_empty()) {
        let owned = managers
            .0
            .values()
            .fold(FieldSet::default(), |all, e| all.union(&e.fields));
        merged = prune(&merged, &last.fields, &owned, shape)?;
    }
    let cmp = compare(live, &merged, shape)?.excluding(&writer.reset);
    let touched = cmp.modified.union(&cmp.added);
    let conflicts: Vec<(ManagerId, FieldSet)> = (managers.0.iter())
        .filter(|(m, _)| **m != id)
        .map(|(m, e)| (m.clone(), e.fields.intersection(&touched)))
        .filter(|(_, s)| !s.is_empty())
        .collect();
    if !force && !conflicts.is_empty() {
        return Err(ApplyError::Conflict(Conflicts::new(conflicts)));
    }
    if let Some(e) = managers.0.get_mut(&id) {
        e.fields = e.fields.difference(stripped());
        // Upstream stamps the applier only when the object changes.
        e.time = if value_eq(live, &merged) {
            last.and_then(|l| l.time)
        } else {
            Some(now.to_string())
        };
    }
    managers.take(&touched.union(&cmp.removed), Some(&id));
    Ok((merged, managers))
}

#[cfg(test)]
mod tests;
