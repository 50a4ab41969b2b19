//! Importing image archives (OCI layout or docker-archive tars, plain,
//! gzip or zstd) into the runtime. CRI has no import call, so this goes
//! through containerd's own `ctr images import` (the `ctr` of the
//! containerd package) into CRI's `k8s.io` namespace, unpacked for the
//! snapshotter CRI uses; the archive is decompressed here and streamed to
//! it, since `ctr` only reads plain tars.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// The namespace containerd's CRI plugin keeps its images in.
const CRI_NAMESPACE: &str = "k8s.io";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the container runtime endpoint {0} is not a unix socket; images are imported through containerd's socket")]
    Endpoint(String),
    #[error("cannot run ctr (from the containerd package): {0}")]
    Ctr(#[source] std::io::Error),
    #[error("ctr images import {path} failed: {message}")]
    Import { path: PathBuf, message: String },
}

/// The file's compression, from its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Compression {
    None,
    Gzip,
    Zstd,
}

fn compression(head: &[u8]) -> Compression {
    match head {
        [0x1f, 0x8b, ..] => Compression::Gzip,
        [0x28, 0xb5, 0x2f, 0xfd, ..] => Compression::Zstd,
        _ => Compression::None,
    }
}

/// Whether `path` names an archive the import directory takes: `.tar`,
/// optionally `.gz`/`.tgz`/`.zst`/`.tzst` compressed (k3s's list).
pub fn is_archive(path: &Path) -> bool {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_lowercase())
        .unwrap_or_default();
    [".tar", ".tar.gz", ".tgz", ".tar.zst", ".tzst"]
        .iter()
        .any(|ext| name.ends_with(ext))
}

/// `path` as a plain tar stream.
fn open(path: &Path) -> Result<Box<dyn Read + Send>, Error> {
    let read_err = |source| Error::Read {
        path: path.to_owned(),
        source,
    };
    let mut reader = BufReader::new(File::open(path).map_err(read_err)?);
    let head = reader.fill_buf().map_err(read_err)?.to_vec();
    Ok(match compression(&head) {
        Compression::None => Box::new(reader),
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(reader)),
        Compression::Zstd => Box::new(
            ruzstd::decoding::StreamingDecoder::new(reader)
                .map_err(|e| read_err(std::io::Error::other(e.to_string())))?,
        ),
    })
}

/// The socket path of a `unix://` runtime endpoint.
pub fn socket_of(endpoint: &str) -> Result<&str, Error> {
    match endpoint.strip_prefix("unix://") {
        Some(path) if path.starts_with('/') => Ok(path),
        _ if endpoint.starts_with('/') => Ok(endpoint),
        _ => Err(Error::Endpoint(endpoint.to_string())),
    }
}

/// The image names `ctr images import` reports (`unpacking NAME (sha256:...)...done`).
fn imported_names(output: &str) -> Vec<String> {
    output
        .lines()
        .filter_map(|l| l.strip_prefix("unpacking "))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// How long one import may take before `ctr` is killed: a wedged `ctr`
/// must not hold up the imports after it.
const IMPORT_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// Import the archive at `path` into the runtime at `endpoint`, unpacked
/// for `snapshotter` (the runtime's default when None); the names of the
/// images imported.
///
/// # Errors
/// The file cannot be read or decompressed, or `ctr` fails or takes
/// longer than [`IMPORT_TIMEOUT`].
pub async fn import(
    endpoint: &str,
    snapshotter: Option<&str>,
    path: &Path,
) -> Result<Vec<String>, Error> {
    let socket = socket_of(endpoint)?;
    let mut input = open(path)?;
    let mut cmd = tokio::process::Command::new("ctr");
    cmd.args(["--address", socket, "-n", CRI_NAMESPACE, "images", "import"]);
    // Without --all-platforms ctr takes this platform's image of a
    // multi-platform archive, as a pull would.
    if let Some(s) = snapshotter {
        cmd.args(["--snapshotter", s]);
    }
    cmd.arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(Error::Ctr)?;
    let stdin = child
        .stdin
        .take()
        .ok_or_else(|| Error::Ctr(std::io::Error::other("no stdin pipe to ctr")))?;
    let mut stdin = File::from(stdin.into_owned_fd().map_err(Error::Ctr)?);
    // Decompressing is blocking work: a thread of its own feeds ctr, so
    // that ctr's output pipes are drained meanwhile. A killed ctr ends it
    // with a broken pipe.
    let feeder = std::thread::spawn(move || -> std::io::Result<()> {
        std::io::copy(&mut input, &mut stdin)?;
        stdin.flush()
    });
    let out = tokio::time::timeout(IMPORT_TIMEOUT, child.wait_with_output())
        .await
        .map_err(|_| Error::Import {
            path: path.to_owned(),
            message: format!("no result within {IMPORT_TIMEOUT:?}; ctr was killed"),
        })?
        .map_err(Error::Ctr)?;
    let fed = feeder
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("archive reader panicked")));
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(Error::Import {
            path: path.to_owned(),
            message: stderr.trim().to_string(),
        });
    }
    // ctr succeeded on what it read: a decompression error after the end
    // of the tar (trailing garbage) does not undo that; before it, ctr
    // would have failed on a truncated tar.
    if let Err(e) = fed {
        tracing::debug!(path = %path.display(), "reading the archive ended with: {e}");
    }
    Ok(imported_names(&String::from_utf8_lossy(&out.stdout)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compression_from_magic_bytes() {
        assert_eq!(compression(&[0x1f, 0x8b, 8, 0]), Compression::Gzip);
        assert_eq!(compression(&[0x28, 0xb5, 0x2f, 0xfd]), Compression::Zstd);
        assert_eq!(compression(b"index.json"), Compression::None);
        assert_eq!(compression(&[]), Compression::None);
    }

    #[test]
    fn archives_by_name() {
        for ok in ["a.tar", "b.TAR.GZ", "c.tgz", "d.tar.zst", "e.tzst"] {
            assert!(is_archive(Path::new(ok)), "{ok}");
        }
        for no in ["a.txt", "tar", "x.tar.part", ".zst"] {
            assert!(!is_archive(Path::new(no)), "{no}");
        }
    }

    #[test]
    fn unix_endpoints_only() {
        assert_eq!(
            socket_of("unix:///run/containerd/containerd.sock").unwrap(),
            "/run/containerd/containerd.sock"
        );
        assert_eq!(socket_of("/run/c.sock").unwrap(), "/run/c.sock");
        assert!(socket_of("tcp://1.2.3.4:1").is_err());
    }

    #[test]
    fn names_from_ctr_output() {
        let out = "unpacking docker.io/library/app:1 (sha256:abc)...done\nunpacking skiff.test/x:2 (sha256:def)...done\n";
        assert_eq!(
            imported_names(out),
            ["docker.io/library/app:1", "skiff.test/x:2"]
        );
    }

    #[test]
    fn zstd_archives_are_read_decompressed() {
        let dir = std::env::temp_dir().join(format!("skiff-archive-zst-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("a.tar.zst");
        let data = ruzstd::encoding::compress_to_vec(
            &b"plain tar bytes"[..],
            ruzstd::encoding::CompressionLevel::Fastest,
        );
        std::fs::write(&path, data).unwrap();
        let mut text = String::new();
        open(&path).unwrap().read_to_string(&mut text).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(text, "plain tar bytes");
    }

    #[test]
    fn gzip_archives_are_read_decompressed() {
        let dir = std::env::temp_dir().join(format!("skiff-archive-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("a.tar.gz");
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(b"plain tar bytes").unwrap();
        std::fs::write(&path, gz.finish().unwrap()).unwrap();
        let mut text = String::new();
        open(&path).unwrap().read_to_string(&mut text).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(text, "plain tar bytes");
    }
}
