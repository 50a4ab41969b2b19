//! CRI v1 (`runtime.v1`) messages and tonic clients, generated from
//! `proto/runtime/v1/api.proto` at build time.

use std::fmt;

#[allow(clippy::all, clippy::pedantic, missing_docs)]
mod generated {
    tonic::include_proto!("runtime.v1");
}

pub use generated::*;

pub use generated::image_service_client::ImageServiceClient;
pub use generated::runtime_service_client::RuntimeServiceClient;
#[cfg(feature = "server")]
pub use generated::{
    image_service_server::{ImageService, ImageServiceServer},
    runtime_service_server::{RuntimeService, RuntimeServiceServer},
};

/// Redacts the secrets (upstream's `debug_redact` fields) so a logged
/// `PullImageRequest` never leaks registry credentials.
impl fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn redact(secret: &str) -> &'static str {
            if secret.is_empty() {
                ""
            } else {
                "<redacted>"
            }
        }
        f.debug_struct("AuthConfig")
            .field("username", &self.username)
            .field("password", &redact(&self.password))
            .field("auth", &redact(&self.auth))
            .field("server_address", &self.server_address)
            .field("identity_token", &redact(&self.identity_token))
            .field("registry_token", &redact(&self.registry_token))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    #[test]
    fn container_config_round_trips() {
        let config = ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: "app".into(),
                attempt: 2,
            }),
            image: Some(ImageSpec {
                image: "docker.io/library/busybox:1.36".into(),
                ..Default::default()
            }),
            command: vec!["sh".into(), "-c".into()],
            args: vec!["sleep 1".into()],
            envs: vec![KeyValue {
                key: "A".into(),
                value: "b".into(),
            }],
            mounts: vec![Mount {
                container_path: "/data".into(),
                host_path: "/var/lib/skiff/pods/x/volumes/data".into(),
                propagation: MountPropagation::PropagationHostToContainer as i32,
                ..Default::default()
            }],
            labels: [("io.kubernetes.pod.name".to_string(), "p".to_string())].into(),
            linux: Some(LinuxContainerConfig {
                resources: Some(LinuxContainerResources {
                    cpu_shares: 512,
                    memory_limit_in_bytes: 64 << 20,
                    ..Default::default()
                }),
                security_context: Some(LinuxContainerSecurityContext {
                    capabilities: Some(Capability {
                        drop_capabilities: vec!["ALL".into()],
                        ..Default::default()
                    }),
                    run_as_user: Some(Int64Value { value: 1000 }),
                    namespace_options: Some(NamespaceOption {
                        pid: NamespaceMode::Container as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            }),
            stop_signal: Signal::Sigterm as i32,
            ..Default::default()
        };
        let decoded = ContainerConfig::decode(config.encode_to_vec().as_slice()).unwrap();
        assert_eq!(decoded, config);
    }

    #[test]
    fn field_numbers_match_upstream_on_the_wire() {
        // PortMapping{container_port = 2: 80}: tag (2 << 3 | varint) = 0x10.
        let bytes = PortMapping {
            container_port: 80,
            ..Default::default()
        }
        .encode_to_vec();
        assert_eq!(bytes, [0x10, 80]);
        // ImageSpec.image_ref is field 20: tag (20 << 3 | len) = 0xa2 0x01.
        let bytes = ImageSpec {
            image_ref: "x".into(),
            ..Default::default()
        }
        .encode_to_vec();
        assert_eq!(bytes, [0xa2, 0x01, 1, b'x']);
    }

    #[test]
    fn unknown_fields_are_ignored_on_decode() {
        // A newer runtime's ContainerStatus: known fields plus an unknown
        // varint field 99 and an unknown length-delimited field 100.
        let mut bytes = ContainerStatus {
            exit_code: 137,
            reason: "OOMKilled".into(),
            ..Default::default()
        }
        .encode_to_vec();
        bytes.extend_from_slice(&[0x98, 0x06, 0x2a]); // field 99, varint 42
        bytes.extend_from_slice(&[0xa2, 0x06, 0x03, b'a', b'b', b'c']); // field 100, "abc"
        let status = ContainerStatus::decode(bytes.as_slice()).unwrap();
        assert_eq!(status.exit_code, 137);
        assert_eq!(status.reason, "OOMKilled");
    }

    #[test]
    fn unknown_enum_values_survive_as_integers() {
        // A future ContainerState value must not fail decoding.
        let bytes = ContainerStateValue { state: 9 }.encode_to_vec();
        let value = ContainerStateValue::decode(bytes.as_slice()).unwrap();
        assert_eq!(value.state, 9);
        assert!(ContainerState::try_from(value.state).is_err());
    }

    #[test]
    fn auth_config_debug_redacts_secrets() {
        let auth = AuthConfig {
            username: "me".into(),
            password: "hunter2".into(),
            registry_token: "tok".into(),
            ..Default::default()
        };
        let printed = format!(
            "{:?}",
            PullImageRequest {
                auth: Some(auth),
                ..Default::default()
            }
        );
        assert!(printed.contains("\"me\""), "{printed}");
        assert!(
            !printed.contains("hunter2") && !printed.contains("tok\""),
            "{printed}"
        );
    }
}
