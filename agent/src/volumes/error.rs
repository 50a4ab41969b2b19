//! Why a volume could not be set up or torn down. The texts are the
//! messages of the pod's `FailedMount` events (upstream's wording where it
//! has one), so a repeated failure is recognised by its text.

use std::path::PathBuf;

use super::objects::FetchError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("volume type is not supported by skiff-agent (supported: emptyDir, hostPath, configMap, secret, downwardAPI, projected, persistentVolumeClaim, ephemeral)")]
    Unsupported,
    #[error("{noun} {name:?} cannot be read: this node has no API server connection")]
    NoApi { noun: &'static str, name: String },
    #[error(transparent)]
    Fetch(#[from] FetchError),
    #[error(transparent)]
    Token(#[from] super::token::Error),
    #[error("configmap references non-existent config key: {0}")]
    ConfigMapKey(String),
    #[error("references non-existent secret key: {0}")]
    SecretKey(String),
    #[error("unsupported fieldRef {0:?} in downwardAPI volume")]
    FieldRef(String),
    #[error("container {0:?} not found in pod for resourceFieldRef")]
    NoContainer(String),
    #[error(transparent)]
    ResourceFieldRef(#[from] crate::runtime::downward::Error),
    /// hostPath `type` not met (upstream's `checkType` message).
    #[error("hostPath type check failed: {path} is not {what}", path = .path.display())]
    HostPathType { path: PathBuf, what: &'static str },
    #[error("hostPath type check failed: unknown type {0:?}")]
    HostPathUnknownType(String),
    /// A filesystem call on the volume's directory.
    #[error("{action} {path}: {source}", path = .path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{action} {path}: {source}", path = .path.display())]
    Mount {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: nix::errno::Errno,
    },
    /// A claim or its PV cannot be used (missing, not the pod's, a failed
    /// read): the message says why, in upstream's words where it has any.
    #[error("{0}")]
    Claim(String),
    #[error("PVC {claim} is not bound yet (phase {phase:?}, spec.volumeName \"\")")]
    ClaimNotBound { claim: String, phase: String },
    #[error("persistentvolume {volume:?} cannot be used on node {node:?}: its nodeAffinity does not match the node's labels")]
    VolumeNodeAffinity { volume: String, node: String },
    #[error("persistentvolume {volume:?} has volume source {kind:?}, which skiff-agent cannot mount (supported: local, hostPath)")]
    VolumeSourceUnsupported { volume: String, kind: String },
    #[error(
        "persistentvolume {volume:?} is a local-path volume of node {node:?}, not of this one"
    )]
    LocalPathOtherNode { volume: String, node: String },
    #[error("refusing local-path directory {path}: {reason}", path = .path.display())]
    LocalPathUnsafe { path: PathBuf, reason: &'static str },
    #[error("refusing local-path directory {}: something other than a directory is there", .0.display())]
    LocalPathNotDir(PathBuf),
    /// Upstream's local volume plugin: the path must exist beforehand.
    #[error("path {:?} does not exist", .0)]
    LocalMissing(PathBuf),
    #[error("mounts remain under {}", .0.display())]
    MountsRemain(PathBuf),
    #[error(transparent)]
    Write(#[from] super::atomic::Error),
}

impl Error {
    pub(super) fn io(
        action: &'static str,
        path: &std::path::Path,
    ) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.to_path_buf();
        move |source| Error::Io {
            action,
            path,
            source,
        }
    }

    pub(super) fn mount(
        action: &'static str,
        path: &std::path::Path,
    ) -> impl FnOnce(nix::errno::Errno) -> Error {
        let path = path.to_path_buf();
        move |source| Error::Mount {
            action,
            path,
            source,
        }
    }
}
