//! containerd's registry host configuration (`config_path`): one
//! `HOST/hosts.toml` per registry, read at every pull, so files written
//! here take effect without restarting containerd. containerd 1.6, 1.7 and
//! 2.x read the same format.
//!
//! A mirrored registry's file lists its endpoints as `[host."URL"]`
//! entries (tried in order, for pull and resolve only); containerd adds
//! the registry itself last unless a `server` is set, so no `server` is
//! written and the registry stays the fallback, as in k3s. TLS settings
//! of a registry go in its own file's top level; those of an endpoint in
//! its entry.
//!
//! Only files this module wrote (they start with [`MARKER`]) are replaced
//! or removed; a `hosts.toml` someone else wrote is left alone.

use std::collections::BTreeMap;
use std::path::Path;

use super::config::{Registries, Tls, ANY_REGISTRY};

/// First line of every file written here.
pub const MARKER: &str = "# Written by skiff-agent";

/// The file name containerd reads in each host directory.
const FILE: &str = "hosts.toml";

/// containerd's directory for "every registry" (containerd 1.7 and later).
const DEFAULT_DIR: &str = "_default";

/// The host files `registries` needs: directory name -> file content.
/// `source` is named in each file.
pub fn render(registries: &Registries, source: &Path) -> BTreeMap<String, String> {
    let header = format!(
        "{MARKER} from {}: it is replaced when that file changes.\n",
        source.display()
    );
    let mut files = BTreeMap::new();
    for (host, endpoints) in &registries.mirrors {
        let mut doc = toml::Table::new();
        if let Some(tls) = registries.configs.get(host).and_then(|c| c.tls.as_ref()) {
            add_tls(&mut doc, tls);
        }
        let mut entries = toml::Table::new();
        for e in endpoints {
            let mut entry = toml::Table::new();
            entry.insert(
                "capabilities".into(),
                toml::Value::Array(vec!["pull".into(), "resolve".into()]),
            );
            if let Some(tls) = registries.configs.get(&e.host).and_then(|c| c.tls.as_ref()) {
                add_tls(&mut entry, tls);
            }
            entries.insert(e.url.clone(), toml::Value::Table(entry));
        }
        doc.insert("host".into(), toml::Value::Table(entries));
        let dir = if host == ANY_REGISTRY {
            DEFAULT_DIR
        } else {
            host.as_str()
        };
        files.insert(dir.to_string(), text(&header, &doc));
    }
    for (host, config) in &registries.configs {
        let Some(tls) = &config.tls else { continue };
        if registries.mirrors.contains_key(host) {
            continue;
        }
        let mut doc = toml::Table::new();
        add_tls(&mut doc, tls);
        // containerd refuses a file without a `host` table (and then
        // reads none of it): an empty one leaves just the registry.
        doc.insert("host".into(), toml::Value::Table(toml::Table::new()));
        files.insert(host.clone(), text(&header, &doc));
    }
    files
}

fn add_tls(table: &mut toml::Table, tls: &Tls) {
    let path = |p: &Path| toml::Value::String(p.display().to_string());
    if let Some(ca) = &tls.ca_file {
        table.insert("ca".into(), path(ca));
    }
    if let Some((cert, key)) = &tls.client {
        table.insert(
            "client".into(),
            toml::Value::Array(vec![toml::Value::Array(vec![path(cert), path(key)])]),
        );
    }
    if tls.insecure_skip_verify {
        table.insert("skip_verify".into(), toml::Value::Boolean(true));
    }
}

fn text(header: &str, doc: &toml::Table) -> String {
    format!("{header}{doc}")
}

/// Make `root` hold exactly `files` among the files written here: write
/// the new and changed ones (atomically), remove those no longer wanted.
/// Returns what could not be done, one message each; the rest is done.
pub fn sync(root: &Path, files: &BTreeMap<String, String>) -> Vec<String> {
    let mut problems = Vec::new();
    if let Ok(entries) = std::fs::read_dir(root) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let dir = entry.path();
            if files.contains_key(&name) || !ours(&dir.join(FILE)) {
                continue;
            }
            if let Err(e) = std::fs::remove_file(dir.join(FILE)) {
                problems.push(format!("cannot remove {}: {e}", dir.join(FILE).display()));
                continue;
            }
            // Left when someone put other files (certificates) beside it.
            let _ = std::fs::remove_dir(&dir);
        }
    }
    for (name, content) in files {
        let dir = root.join(name);
        let path = dir.join(FILE);
        match std::fs::read_to_string(&path) {
            Ok(old) if old == *content => continue,
            Ok(old) if !old.starts_with(MARKER) => {
                problems.push(format!(
                    "{} was not written by skiff-agent: left alone, so the registries file's settings for {name} are not in effect",
                    path.display()
                ));
                continue;
            }
            _ => {}
        }
        if let Err(e) = write(&dir, &path, content) {
            problems.push(format!("cannot write {}: {e}", path.display()));
        }
    }
    problems
}

fn ours(path: &Path) -> bool {
    std::fs::read_to_string(path).is_ok_and(|t| t.starts_with(MARKER))
}

fn write(dir: &Path, path: &Path, content: &str) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{FILE}.tmp"));
    std::fs::write(&tmp, content)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registries::config::parse;

    fn rendered(yaml: &str) -> BTreeMap<String, String> {
        let r = parse(Path::new("/etc/skiff/registries.yaml"), yaml).unwrap();
        render(&r, Path::new("/etc/skiff/registries.yaml"))
    }

    #[test]
    fn mirror_endpoints_in_order_with_their_tls() {
        let files = rendered(
            "mirrors:\n  docker.io:\n    endpoint: [\"https://b.example:5000\", \"http://a.example\"]\nconfigs:\n  b.example:5000:\n    tls: {insecure_skip_verify: true}\n",
        );
        // The endpoint host also gets its own file: pulls that name it
        // directly need its TLS settings too.
        assert_eq!(
            files.keys().collect::<Vec<_>>(),
            ["b.example:5000", "docker.io"]
        );
        let text = &files["docker.io"];
        assert!(text.starts_with("# Written by skiff-agent from /etc/skiff/registries.yaml"));
        let b = text.find("[host.\"https://b.example:5000\"]").unwrap();
        let a = text.find("[host.\"http://a.example\"]").unwrap();
        assert!(b < a, "{text}");
        let doc: toml::Table = text.parse().unwrap();
        let host = doc["host"]["https://b.example:5000"].as_table().unwrap();
        assert_eq!(host["skip_verify"].as_bool(), Some(true));
        assert_eq!(host["capabilities"].as_array().unwrap().len(), 2);
        assert!(doc.get("server").is_none());
    }

    #[test]
    fn registry_tls_alone_and_wildcard() {
        let files = rendered(
            "mirrors:\n  \"*\":\n    endpoint: [\"https://m.example\"]\nconfigs:\n  r.example:443:\n    tls: {insecure_skip_verify: true}\n  auth.example:\n    auth: {username: u, password: p}\n",
        );
        assert_eq!(
            files.keys().collect::<Vec<_>>(),
            ["_default", "r.example:443"]
        );
        let doc: toml::Table = files["r.example:443"].parse().unwrap();
        assert_eq!(doc["skip_verify"].as_bool(), Some(true));
        assert!(doc["host"].as_table().unwrap().is_empty());
    }

    #[test]
    fn sync_replaces_only_its_own_files() {
        let root = tempfile::tempdir().unwrap();
        let foreign = root.path().join("quay.io");
        std::fs::create_dir_all(&foreign).unwrap();
        std::fs::write(foreign.join(FILE), "server = \"https://quay.io\"\n").unwrap();

        let files = rendered(
            "mirrors:\n  docker.io:\n    endpoint: [\"https://m.example\"]\n  quay.io:\n    endpoint: [\"https://m.example\"]\n",
        );
        let problems = sync(root.path(), &files);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("not written by skiff-agent"));
        assert_eq!(
            std::fs::read_to_string(foreign.join(FILE)).unwrap(),
            "server = \"https://quay.io\"\n"
        );
        let ours = root.path().join("docker.io").join(FILE);
        assert_eq!(std::fs::read_to_string(&ours).unwrap(), files["docker.io"]);

        // The mirror is gone from the file: so is its directory; the
        // foreign file stays.
        assert!(sync(root.path(), &BTreeMap::new()).is_empty());
        assert!(!root.path().join("docker.io").exists());
        assert!(foreign.join(FILE).exists());
    }
}
