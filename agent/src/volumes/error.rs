//! Why a volume could not be set up or torn down. The texts are the
//! messages of the pod's `FailedMount` events (upstream's wording where it
//! has one), so a repeated failure is recognised by its text.

use std::path::PathBuf;

use super::objects::FetchError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("volume type is not supported by skiff-agent (supported: emptyDir, hostPath, configMap, secret, downwardAPI, projected)")]
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
