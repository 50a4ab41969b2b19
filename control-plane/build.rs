//! Compiles the Kubernetes `.proto` files under `proto/` with protox (pure
//! Rust, no system `protoc`) and writes the field table that
//! `src/apiserver/protobuf.rs` decodes request bodies with into
//! `$OUT_DIR/protobuf_schema.rs`.
//!
//! The table is emitted as static data rather than walked from a descriptor at
//! start-up: the decoder stays a binary search over `&'static` rows, the server
//! pulls in no descriptor crate at run time, and a `.proto` that references an
//! unknown type or uses a type the decoder cannot read fails the build.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FieldDescriptorProto, FileDescriptorSet};

type BoxError = Box<dyn std::error::Error>;

const PROTO_DIR: &str = "proto";

fn main() -> Result<(), BoxError> {
    println!("cargo:rerun-if-changed={PROTO_DIR}");
    build_info();
    let mut files = Vec::new();
    proto_files(Path::new(PROTO_DIR), &mut files)?;
    files.sort();
    let rel: Vec<&Path> = files
        .iter()
        .map(|f| f.strip_prefix(PROTO_DIR))
        .collect::<Result<_, _>>()?;
    let fds = protox::compile(rel, [PROTO_DIR])?;
    let out = PathBuf::from(std::env::var_os("OUT_DIR").ok_or("OUT_DIR is not set")?);
    std::fs::write(out.join("protobuf_schema.rs"), render(&table(&fds)?))?;
    Ok(())
}

/// The commit, tree state and commit date `/version` reports
/// (`SKIFF_GIT_COMMIT`, `SKIFF_GIT_TREE_STATE`, `SKIFF_BUILD_DATE`), from
/// git when the source is a checkout; `unknown` otherwise (a tarball).
fn build_info() {
    let git = |args: &[&str]| -> Option<String> {
        let out = std::process::Command::new("git")
            .args(args)
            .env("TZ", "UTC")
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let commit = git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let state = match git(&["status", "--porcelain", "--untracked-files=no"]) {
        Some(s) if s.is_empty() => "clean",
        Some(_) => "dirty",
        None => "unknown",
    };
    // The commit's own date: the same source gives the same answer.
    let date = git(&[
        "log",
        "-1",
        "--format=%cd",
        "--date=format-local:%Y-%m-%dT%H:%M:%SZ",
    ])
    .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=SKIFF_GIT_COMMIT={commit}");
    println!("cargo:rustc-env=SKIFF_GIT_TREE_STATE={state}");
    println!("cargo:rustc-env=SKIFF_BUILD_DATE={date}");
    // A new commit changes what HEAD names.
    if let Some(head) = git(&["rev-parse", "--git-path", "HEAD"]) {
        println!("cargo:rerun-if-changed={head}");
    }
    if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
        if let Some(path) = git(&["rev-parse", "--git-path", &r]) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}

fn proto_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), BoxError> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            proto_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "proto") {
            out.push(path);
        }
    }
    Ok(())
}

/// One row of the table, as `protobuf::Field` spells it.
struct Row {
    num: i32,
    name: String,
    kind: &'static str,
    repeated: bool,
    /// Short name of the field's message type: of the field for `Msg`,
    /// of the map's values for a `Map` of `Msg`.
    msg: String,
    /// The kind of a `Map`'s values (`Str` for other fields).
    value: &'static str,
}

/// The short package the table names messages by: the last element that is
/// not a version (`k8s.io.api.core.v1` -> `core`,
/// `k8s.io.apimachinery.pkg.util.intstr` -> `intstr`).
fn short_package(package: &str) -> &str {
    let mut parts = package.rsplit('.');
    let last = parts.next().unwrap_or(package);
    let is_version = last
        .strip_prefix('v')
        .is_some_and(|v| v.starts_with(|c: char| c.is_ascii_digit()));
    if is_version {
        parts.next().unwrap_or(last)
    } else {
        last
    }
}

/// `.k8s.io.api.core.v1.PodSpec` -> `core.PodSpec`.
fn short_type(full: &str) -> String {
    let full = full.trim_start_matches('.');
    match full.rsplit_once('.') {
        Some((package, name)) => format!("{}.{name}", short_package(package)),
        None => full.to_string(),
    }
}

/// Messages whose JSON form is not an object (a string, a number, or JSON
/// carried in bytes), decoded by a kind of their own.
fn special_kind(type_name: &str) -> Option<&'static str> {
    Some(match type_name {
        ".k8s.io.apimachinery.pkg.apis.meta.v1.Time" => "Time",
        ".k8s.io.apimachinery.pkg.apis.meta.v1.MicroTime" => "MicroTime",
        ".k8s.io.apimachinery.pkg.apis.meta.v1.Duration" => "Duration",
        ".k8s.io.apimachinery.pkg.apis.meta.v1.FieldsV1" => "Raw",
        ".k8s.io.apimachinery.pkg.runtime.RawExtension" => "Raw",
        ".k8s.io.apimachinery.pkg.util.intstr.IntOrString" => "IntOrString",
        ".k8s.io.apimachinery.pkg.api.resource.Quantity" => "Quantity",
        ".k8s.io.api.authorization.v1.ExtraValue" | ".k8s.io.api.certificates.v1.ExtraValue" => {
            "Strings"
        }
        _ => return None,
    })
}

/// The value field of a `map<..>` field's synthesized entry message, if
/// `field` is a map.
fn map_value<'a>(
    msg: &'a DescriptorProto,
    field: &FieldDescriptorProto,
) -> Option<&'a FieldDescriptorProto> {
    let entry_name = field.type_name().rsplit('.').next()?;
    let entry = msg
        .nested_type
        .iter()
        .find(|n| n.name() == entry_name && n.options.as_ref().is_some_and(|o| o.map_entry()))?;
    entry.field.iter().find(|f| f.number() == 2)
}

/// The kind a field's values decode as, and their message type for `Msg`.
fn kind_of(
    msg: &DescriptorProto,
    f: &FieldDescriptorProto,
) -> Result<(&'static str, String), BoxError> {
    Ok(match f.r#type() {
        Type::String => ("Str", String::new()),
        Type::Bytes => ("Bytes", String::new()),
        Type::Int32 => ("I32", String::new()),
        Type::Int64 => ("I64", String::new()),
        Type::Bool => ("Bool", String::new()),
        Type::Float => ("F32", String::new()),
        Type::Double => ("F64", String::new()),
        Type::Message => match special_kind(f.type_name()) {
            Some(kind) => (kind, String::new()),
            None => ("Msg", short_type(f.type_name())),
        },
        other => {
            return Err(format!(
                "{}.{}: protobuf type {other:?} has no decoder in protobuf.rs",
                msg.name(),
                f.name()
            )
            .into())
        }
    })
}

fn row(msg: &DescriptorProto, f: &FieldDescriptorProto) -> Result<Row, BoxError> {
    if let Some(value) = map_value(msg, f) {
        let (value_kind, value_msg) = kind_of(msg, value)?;
        return Ok(Row {
            num: f.number(),
            name: f.name().to_string(),
            kind: "Map",
            repeated: false,
            msg: value_msg,
            value: value_kind,
        });
    }
    let (kind, type_msg) = kind_of(msg, f)?;
    Ok(Row {
        num: f.number(),
        name: f.name().to_string(),
        kind,
        repeated: f.label() == Label::Repeated,
        msg: type_msg,
        value: "Str",
    })
}

/// (short message name, rows in declaration order), sorted by name so the
/// decoder can binary-search it.
fn table(fds: &FileDescriptorSet) -> Result<Vec<(String, Vec<Row>)>, BoxError> {
    let mut out = Vec::new();
    for file in &fds.file {
        let package = short_package(file.package());
        for msg in &file.message_type {
            let rows = msg
                .field
                .iter()
                .map(|f| row(msg, f))
                .collect::<Result<_, _>>()?;
            out.push((format!("{package}.{}", msg.name()), rows));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    if let Some(w) = out.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(format!("message {} is defined twice under proto/", w[0].0).into());
    }
    Ok(out)
}

fn render(table: &[(String, Vec<Row>)]) -> String {
    let mut s = String::from(
        "// Generated by control-plane/build.rs from control-plane/proto/: do not edit.\n\
         pub static MESSAGES: &[(&str, &[Field])] = &[\n",
    );
    for (name, rows) in table {
        let _ = writeln!(s, "    ({name:?}, &[");
        for r in rows {
            let _ = writeln!(
                s,
                "        Field {{ num: {}, name: {:?}, kind: {}, repeated: {}, msg: {:?}, value: {} }},",
                r.num, r.name, r.kind, r.repeated, r.msg, r.value
            );
        }
        s.push_str("    ]),\n");
    }
    s.push_str("];\n");
    s
}
