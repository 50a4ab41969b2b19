//! Server-side apply's pure core: which manager owns which field of an
//! object (`metadata.managedFields`) and how an applied configuration merges
//! into it, after upstream's structured-merge-diff v4 and
//! `k8s.io/apimachinery/pkg/util/managedfields/internal`.
//!
//! # Layout
//! - [`path`]: path elements, their order, display and FieldsV1 keys
//! - [`set`]: [`FieldSet`], a trie of paths, and its FieldsV1 JSON
//! - [`schema`]: [`Shape`], how each field merges (built-in markers, CRD
//!   schemas, upstream's deduced type)
//! - [`merge`]: the fields an object sets, merge, compare, remove, prune
//! - [`managers`]: [`ManagedFields`], [`update`] and [`apply`]
//! - [`conflict`]: apply conflicts, their message and 409 Status
//!
//! Pure functions of values: no store, no clock (callers pass `now`).
//!
//! # Caveats
//! One version per kind: fields are never converted between apiVersions,
//! and managers of other versions are compared in the writer's. A removal
//! that empties a map or list drops it where upstream leaves a null.
//! FieldsV1 objects come out with serde_json's sorted keys, not upstream's
//! element order (JSON objects are unordered; clients do not care).
//! The walks recurse as deep as objects nest, which the JSON (128) and YAML
//! (64) parsers bound; FieldsV1 from clients is bounded in [`set`].

pub mod conflict;
pub mod managers;
pub mod merge;
pub mod path;
pub mod schema;
pub mod set;

pub use conflict::{Conflict, Conflicts};
pub use managers::{apply, update, ApplyError, ManagedFields, ManagerId, Operation, Writer};
pub use path::{Path, PathElement};
pub use schema::{ListKind, Shape};
pub use set::FieldSet;
