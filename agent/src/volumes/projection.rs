//! What the files of configMap, secret, downwardAPI and projected volumes
//! hold: keys projected to paths with modes, as upstream's
//! `MakePayload` functions do.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{DownwardAPIVolumeFile, KeyToPath, Pod};

use super::atomic::{FileProjection, Payload};
use super::objects::{Data, Kind};
use super::Error;
use crate::pod::PodExt;

/// The default mode of every API-data volume's files (upstream's
/// `ConfigMapVolumeSourceDefaultMode` and `SecretVolumeSourceDefaultMode`).
pub const DEFAULT_MODE: i32 = 0o644;

/// Project an object's keys into files. `data` None: the object is
/// missing and optional (an empty volume, as upstream).
///
/// # Errors
/// An item naming a key the object lacks, unless the source is optional.
pub fn keys(
    kind: Kind,
    data: Option<&Data>,
    items: Option<&[KeyToPath]>,
    default_mode: Option<i32>,
    optional: bool,
) -> Result<Payload, Error> {
    let mode = mode_bits(default_mode.unwrap_or(DEFAULT_MODE));
    let mut out = Payload::new();
    let Some(data) = data else {
        return Ok(out);
    };
    match items.filter(|i| !i.is_empty()) {
        None => {
            for (k, v) in data {
                out.insert(
                    k.clone(),
                    FileProjection {
                        data: v.clone(),
                        mode,
                    },
                );
            }
        }
        Some(items) => {
            for it in items {
                let Some(v) = data.get(&it.key) else {
                    if optional {
                        continue;
                    }
                    return Err(match kind {
                        Kind::ConfigMap => Error::ConfigMapKey(it.key.clone()),
                        Kind::Secret => Error::SecretKey(it.key.clone()),
                    });
                };
                out.insert(
                    it.path.clone(),
                    FileProjection {
                        data: v.clone(),
                        mode: it.mode.map(mode_bits).unwrap_or(mode),
                    },
                );
            }
        }
    }
    Ok(out)
}

/// Files of a downwardAPI volume (or projection).
///
/// # Errors
/// An unsupported field path, or a resourceFieldRef naming no container.
pub fn downward(
    pod: &Pod,
    items: &[DownwardAPIVolumeFile],
    default_mode: Option<i32>,
) -> Result<Payload, Error> {
    let mode = mode_bits(default_mode.unwrap_or(DEFAULT_MODE));
    let mut out = Payload::new();
    for it in items {
        let value = if let Some(f) = &it.field_ref {
            field(pod, &f.field_path)?
        } else if let Some(r) = &it.resource_field_ref {
            let name = r.container_name.as_deref().unwrap_or("");
            let c = pod
                .containers()
                .iter()
                .chain(pod.init_containers())
                .find(|c| c.name == name)
                .ok_or_else(|| Error::NoContainer(name.to_string()))?;
            crate::runtime::downward::resource_field_ref(
                c,
                &r.resource,
                r.divisor.as_ref().map(|d| d.0.as_str()),
            )?
        } else {
            String::new()
        };
        out.insert(
            it.path.clone(),
            FileProjection {
                data: value.into_bytes(),
                mode: it.mode.map(mode_bits).unwrap_or(mode),
            },
        );
    }
    Ok(out)
}

/// A downwardAPI volume field: metadata only (status fields are env-only).
fn field(pod: &Pod, path: &str) -> Result<String, Error> {
    let m = &pod.metadata;
    let empty = BTreeMap::new();
    let labels = m.labels.as_ref().unwrap_or(&empty);
    let annotations = m.annotations.as_ref().unwrap_or(&empty);
    let one = |prefix: &str, map: &BTreeMap<String, String>| {
        path.strip_prefix(prefix)
            .and_then(|k| k.strip_prefix("['").and_then(|k| k.strip_suffix("']")))
            .map(|k| map.get(k).cloned().unwrap_or_default())
    };
    Ok(match path {
        "metadata.name" => pod.name().to_string(),
        "metadata.namespace" => pod.namespace().to_string(),
        "metadata.uid" => pod.uid().to_string(),
        "metadata.labels" => format_map(labels),
        "metadata.annotations" => format_map(annotations),
        p => one("metadata.labels", labels)
            .or_else(|| one("metadata.annotations", annotations))
            .ok_or_else(|| Error::FieldRef(p.to_string()))?,
    })
}

/// `key="value"` lines in key order, values quoted (upstream `FormatMap`).
pub fn format_map(m: &BTreeMap<String, String>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k}={}", serde_json::Value::String(v.clone())))
        .collect::<Vec<_>>()
        .join("\n")
}

/// API modes are decimal-typed ints holding permission bits.
fn mode_bits(m: i32) -> u32 {
    (m as u32) & 0o7777
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data() -> Data {
        [("a", "1"), ("b", "2")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect()
    }

    fn item(key: &str, path: &str, mode: Option<i32>) -> KeyToPath {
        KeyToPath {
            key: key.into(),
            path: path.into(),
            mode,
            ..Default::default()
        }
    }

    #[test]
    fn all_keys_with_default_mode() {
        let p = keys(Kind::Secret, Some(&data()), None, Some(0o400), false).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p["a"].mode, 0o400);
        let p = keys(Kind::ConfigMap, Some(&data()), None, None, false).unwrap();
        assert_eq!(p["b"].mode, 0o644);
        assert_eq!(p["b"].data, b"2");
    }

    #[test]
    fn items_paths_and_modes() {
        let items = [item("a", "dir/x", Some(0o600)), item("b", "y", None)];
        let p = keys(
            Kind::Secret,
            Some(&data()),
            Some(&items),
            Some(0o440),
            false,
        )
        .unwrap();
        assert_eq!(p.keys().collect::<Vec<_>>(), ["dir/x", "y"]);
        assert_eq!(p["dir/x"].mode, 0o600);
        assert_eq!(p["y"].mode, 0o440);
    }

    #[test]
    fn missing_keys_and_objects() {
        let items = [item("zz", "z", None)];
        let e = keys(Kind::ConfigMap, Some(&data()), Some(&items), None, false).unwrap_err();
        assert_eq!(
            e.to_string(),
            "configmap references non-existent config key: zz"
        );
        let e = keys(Kind::Secret, Some(&data()), Some(&items), None, false).unwrap_err();
        assert_eq!(e.to_string(), "references non-existent secret key: zz");
        assert!(keys(Kind::Secret, Some(&data()), Some(&items), None, true)
            .unwrap()
            .is_empty());
        assert!(keys(Kind::Secret, None, None, None, true)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn downward_fields() {
        let pod: Pod = serde_saphyr::from_str(
            "metadata: {name: p, namespace: ns, uid: u1, labels: {b: '2', a: 'x\"y'}, annotations: {k: v}}\nspec:\n  containers:\n  - name: c\n    image: i\n    resources: {limits: {memory: 64Mi}}\n",
        )
        .unwrap();
        let items: Vec<DownwardAPIVolumeFile> = serde_saphyr::from_str(
            "- {path: name, fieldRef: {fieldPath: metadata.name}}\n- {path: labels, fieldRef: {fieldPath: metadata.labels}, mode: 256}\n- {path: k, fieldRef: {fieldPath: \"metadata.annotations['k']\"}}\n- {path: mem, resourceFieldRef: {containerName: c, resource: limits.memory, divisor: 1Mi}}\n",
        )
        .unwrap();
        let p = downward(&pod, &items, None).unwrap();
        let s = |k: &str| String::from_utf8(p[k].data.clone()).unwrap();
        assert_eq!(s("name"), "p");
        assert_eq!(s("labels"), "a=\"x\\\"y\"\nb=\"2\"");
        assert_eq!(p["labels"].mode, 0o400);
        assert_eq!(s("k"), "v");
        assert_eq!(s("mem"), "64");
    }
}
