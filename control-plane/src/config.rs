//! Server configuration: flags, a YAML file (`--config`), and defaults, in
//! that order of precedence.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Configuration errors.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading config file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing config file {path}: {source}")]
    Parse {
        path: String,
        #[source]
        source: serde_yaml::Error,
    },
    #[error("invalid {field} {value:?}: {why}")]
    Invalid {
        field: &'static str,
        value: String,
        why: String,
    },
}

/// Every setting as optional, for layering (the file uses the flag names).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Settings {
    pub data_dir: Option<PathBuf>,
    pub bind_address: Option<String>,
    pub secure_port: Option<u16>,
    /// `http://host:port[,...]`: use etcd instead of the embedded SQLite.
    pub datastore_endpoint: Option<String>,
    pub service_cluster_ip_range: Option<String>,
    pub cluster_cidr: Option<String>,
    pub token_auth_file: Option<PathBuf>,
    /// Extra names or addresses for the serving certificate.
    pub tls_san: Option<Vec<String>>,
}

impl Settings {
    /// `self` where set, else `other`.
    pub fn or(self, other: Settings) -> Settings {
        Settings {
            data_dir: self.data_dir.or(other.data_dir),
            bind_address: self.bind_address.or(other.bind_address),
            secure_port: self.secure_port.or(other.secure_port),
            datastore_endpoint: self.datastore_endpoint.or(other.datastore_endpoint),
            service_cluster_ip_range: self
                .service_cluster_ip_range
                .or(other.service_cluster_ip_range),
            cluster_cidr: self.cluster_cidr.or(other.cluster_cidr),
            token_auth_file: self.token_auth_file.or(other.token_auth_file),
            tls_san: self.tls_san.or(other.tls_san),
        }
    }

    /// Read a YAML config file.
    ///
    /// # Errors
    /// Unreadable file, bad YAML, or unknown keys.
    pub fn from_file(path: &Path) -> Result<Settings, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.display().to_string(),
            source,
        })?;
        serde_yaml::from_str(&text).map_err(|source| Error::Parse {
            path: path.display().to_string(),
            source,
        })
    }
}

/// The resolved configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub data_dir: PathBuf,
    pub bind_address: IpAddr,
    /// 0 picks a free port (tests).
    pub secure_port: u16,
    /// Empty: SQLite in `data_dir`.
    pub datastore_endpoints: Vec<String>,
    pub service_cidr: crate::apiserver::ipalloc::Cidr,
    pub cluster_cidr: String,
    pub token_auth_file: Option<PathBuf>,
    pub extra_sans: Vec<String>,
}

pub const DEFAULT_DATA_DIR: &str = "/var/lib/skiff-server";
pub const DEFAULT_SERVICE_CIDR: &str = "10.43.0.0/16";
pub const DEFAULT_CLUSTER_CIDR: &str = "10.42.0.0/16";

impl Config {
    /// Resolve flags over the file over defaults.
    ///
    /// # Errors
    /// A value does not parse.
    pub fn resolve(flags: Settings, file: Option<&Path>) -> Result<Config, Error> {
        let s = match file {
            Some(f) => flags.or(Settings::from_file(f)?),
            None => flags,
        };
        let bind = s.bind_address.unwrap_or_else(|| "127.0.0.1".into());
        let bind_address = bind.parse().map_err(|_| Error::Invalid {
            field: "bind-address",
            value: bind.clone(),
            why: "not an IP address".into(),
        })?;
        let svc = s
            .service_cluster_ip_range
            .unwrap_or_else(|| DEFAULT_SERVICE_CIDR.into());
        let service_cidr =
            crate::apiserver::ipalloc::Cidr::parse(&svc).map_err(|e| Error::Invalid {
                field: "service-cluster-ip-range",
                value: svc.clone(),
                why: e.to_string(),
            })?;
        let cluster_cidr = s
            .cluster_cidr
            .unwrap_or_else(|| DEFAULT_CLUSTER_CIDR.into());
        crate::apiserver::ipalloc::Cidr::parse(&cluster_cidr).map_err(|e| Error::Invalid {
            field: "cluster-cidr",
            value: cluster_cidr.clone(),
            why: e.to_string(),
        })?;
        let datastore_endpoints = s
            .datastore_endpoint
            .map(|e| {
                e.split(',')
                    .map(|x| x.trim().to_string())
                    .filter(|x| !x.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        Ok(Config {
            data_dir: s.data_dir.unwrap_or_else(|| DEFAULT_DATA_DIR.into()),
            bind_address,
            secure_port: s.secure_port.unwrap_or(6443),
            datastore_endpoints,
            service_cidr,
            cluster_cidr,
            token_auth_file: s.token_auth_file,
            extra_sans: s.tls_san.unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_win_over_file() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.yaml");
        std::fs::write(
            &f,
            "secure-port: 7000\nbind-address: 0.0.0.0\nservice-cluster-ip-range: 198.19.0.0/16\n",
        )
        .unwrap();
        let flags = Settings {
            secure_port: Some(8000),
            ..Default::default()
        };
        let c = Config::resolve(flags, Some(&f)).unwrap();
        assert_eq!(c.secure_port, 8000);
        assert_eq!(c.bind_address.to_string(), "0.0.0.0");
        assert_eq!(c.service_cidr.to_string(), "198.19.0.0/16");
        std::fs::write(&f, "bogus: 1\n").unwrap();
        assert!(Config::resolve(Settings::default(), Some(&f)).is_err());
    }
}
