//! CriClient against a real containerd, when `SKIFF_TEST_CRI_SOCKET` names
//! its socket (path or unix:// URL); skipped otherwise. Read-only calls only.

use std::path::Path;
use std::time::Duration;

use cri_proto::{v1, CriClient};

fn socket() -> Option<String> {
    let socket = std::env::var("SKIFF_TEST_CRI_SOCKET").ok()?;
    Path::new(socket.trim_start_matches("unix://"))
        .exists()
        .then_some(socket)
}

#[tokio::test]
#[ignore = "needs SKIFF_TEST_CRI_SOCKET (the agent's e2e tests cover CRI against containerd)"]
async fn version_status_and_lists() {
    let Some(socket) = socket() else {
        panic!("set SKIFF_TEST_CRI_SOCKET to a containerd socket to run this test");
    };
    let cri = CriClient::connect(&socket, Duration::from_secs(10))
        .await
        .unwrap();

    let version = cri
        .version(v1::VersionRequest {
            version: "v1".into(),
        })
        .await
        .unwrap();
    eprintln!(
        "runtime {} {} (api {})",
        version.runtime_name, version.runtime_version, version.runtime_api_version
    );
    assert_eq!(version.runtime_name, "containerd");
    assert_eq!(version.runtime_api_version, "v1");

    let status = cri
        .status(v1::StatusRequest { verbose: false })
        .await
        .unwrap();
    let conditions = status.status.unwrap_or_default().conditions;
    eprintln!("conditions: {conditions:?}");
    assert!(
        conditions
            .iter()
            .any(|c| c.r#type == "RuntimeReady" && c.status),
        "{conditions:?}"
    );
    assert!(
        conditions.iter().any(|c| c.r#type == "NetworkReady"),
        "{conditions:?}"
    );

    cri.list_pod_sandbox(v1::ListPodSandboxRequest::default())
        .await
        .unwrap();
    cri.list_containers(v1::ListContainersRequest::default())
        .await
        .unwrap();
    cri.list_images(v1::ListImagesRequest::default())
        .await
        .unwrap();
    let fs = cri
        .image_fs_info(v1::ImageFsInfoRequest::default())
        .await
        .unwrap();
    assert!(!fs.image_filesystems.is_empty(), "{fs:?}");

    let err = cri
        .container_status(v1::ContainerStatusRequest {
            container_id: "skiff-no-such-container".into(),
            verbose: false,
        })
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");

    let absent = cri
        .image_status(v1::ImageStatusRequest {
            image: Some(v1::ImageSpec {
                image: "skiff.invalid/none:0".into(),
                ..Default::default()
            }),
            verbose: false,
        })
        .await
        .unwrap();
    assert!(absent.image.is_none(), "{absent:?}");
}

#[tokio::test]
#[ignore = "needs SKIFF_TEST_CRI_SOCKET (the agent's e2e tests cover CRI against containerd)"]
async fn optional_rpcs_answer_or_are_unimplemented() {
    let Some(socket) = socket() else {
        panic!("set SKIFF_TEST_CRI_SOCKET to a containerd socket to run this test");
    };
    let cri = CriClient::connect_lazy(&socket, Duration::from_secs(10)).unwrap();

    // containerd 1.6 predates both; newer ones implement them.
    match cri
        .runtime_config(v1::RuntimeConfigRequest::default())
        .await
    {
        Ok(config) => eprintln!("runtime config: {config:?}"),
        Err(err) => {
            assert!(err.is_unimplemented(), "{err}");
            eprintln!("{err}");
        }
    }
    // On an idle 1.7+ runtime opening the stream waits for the first event.
    let events = tokio::time::timeout(
        Duration::from_secs(2),
        cri.get_container_events(v1::GetEventsRequest::default()),
    )
    .await;
    match events {
        Ok(Ok(_stream)) => eprintln!("container events: stream open"),
        Ok(Err(err)) => {
            assert!(err.is_unimplemented(), "{err}");
            eprintln!("{err}");
        }
        Err(_) => eprintln!("container events: no event within 2 s (idle runtime)"),
    }
}
