//! CriClient against an in-process fake runtime on a unix socket: deadlines,
//! error mapping, lazy reconnect and the event stream.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use cri_proto::v1::{self, RuntimeService, RuntimeServiceServer};
use cri_proto::{CriClient, Error};
use tokio::net::UnixListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status};

/// Answers Version, ContainerStatus (always NotFound), ExecSync and
/// StopContainer (sleep for the request's timeout), ListContainers (hangs) and GetContainerEvents;
/// everything else is the generated Unimplemented stub.
#[derive(Default)]
struct Fake {
    /// grpc-timeout header of the last Version call.
    last_grpc_timeout: Mutex<Option<String>>,
}

#[tonic::async_trait]
impl RuntimeService for Fake {
    async fn version(
        &self,
        req: Request<v1::VersionRequest>,
    ) -> Result<Response<v1::VersionResponse>, Status> {
        let header = req
            .metadata()
            .get("grpc-timeout")
            .map(|v| v.to_str().unwrap().to_owned());
        *self.last_grpc_timeout.lock().unwrap() = header;
        Ok(Response::new(v1::VersionResponse {
            version: "0.1.0".into(),
            runtime_name: "fake".into(),
            runtime_version: "1.0".into(),
            runtime_api_version: "v1".into(),
        }))
    }

    async fn container_status(
        &self,
        req: Request<v1::ContainerStatusRequest>,
    ) -> Result<Response<v1::ContainerStatusResponse>, Status> {
        Err(Status::not_found(format!(
            "container {:?} not found",
            req.get_ref().container_id
        )))
    }

    async fn exec_sync(
        &self,
        req: Request<v1::ExecSyncRequest>,
    ) -> Result<Response<v1::ExecSyncResponse>, Status> {
        tokio::time::sleep(Duration::from_secs(req.get_ref().timeout as u64)).await;
        Ok(Response::new(v1::ExecSyncResponse {
            stdout: b"done".to_vec(),
            ..Default::default()
        }))
    }

    async fn stop_container(
        &self,
        req: Request<v1::StopContainerRequest>,
    ) -> Result<Response<v1::StopContainerResponse>, Status> {
        // Uses up the whole grace period, like a container ignoring SIGTERM.
        tokio::time::sleep(Duration::from_secs(req.get_ref().timeout as u64)).await;
        Ok(Response::new(v1::StopContainerResponse {}))
    }

    async fn list_containers(
        &self,
        _: Request<v1::ListContainersRequest>,
    ) -> Result<Response<v1::ListContainersResponse>, Status> {
        std::future::pending().await
    }

    async fn get_container_events(
        &self,
        _: Request<v1::GetEventsRequest>,
    ) -> Result<Response<BoxStream<v1::ContainerEventResponse>>, Status> {
        let event = |id: &str, kind: v1::ContainerEventType| {
            Ok(v1::ContainerEventResponse {
                container_id: id.into(),
                container_event_type: kind as i32,
                ..Default::default()
            })
        };
        let events = vec![
            event("a", v1::ContainerEventType::ContainerCreatedEvent),
            event("a", v1::ContainerEventType::ContainerStartedEvent),
        ];
        Ok(Response::new(Box::pin(tokio_stream::iter(events))))
    }
}

/// A fake runtime serving on a socket until stopped or dropped.
struct Running {
    /// Sent (or dropped) by the test to shut the server down gracefully,
    /// which also closes the client's connection with a GOAWAY.
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Running {
    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap();
    }
}

fn serve(socket: &Path) -> Running {
    let incoming = UnixListenerStream::new(UnixListener::bind(socket).unwrap());
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(RuntimeServiceServer::new(Fake::default()))
            .serve_with_incoming_shutdown(incoming, async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    Running { stop, task }
}

fn socket_in(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("cri.sock")
}

const SHORT: Duration = Duration::from_millis(300);

#[tokio::test]
async fn unary_calls_map_results_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let socket = socket_in(&dir);
    let _server = serve(&socket);
    let cri = CriClient::connect(format!("unix://{}", socket.display()), SHORT)
        .await
        .unwrap();

    let version = cri.version(v1::VersionRequest::default()).await.unwrap();
    assert_eq!(version.runtime_name, "fake");

    let err = cri
        .container_status(v1::ContainerStatusRequest {
            container_id: "nope".into(),
            verbose: false,
        })
        .await
        .unwrap_err();
    assert!(err.is_not_found() && !err.is_unavailable(), "{err}");
    let message = err.to_string();
    assert!(
        message.contains("ContainerStatus") && message.contains(&*socket.to_string_lossy()),
        "{message}"
    );

    let err = cri.status(v1::StatusRequest::default()).await.unwrap_err();
    assert!(err.is_unimplemented(), "{err}");
    assert_eq!(err.code(), Some(tonic::Code::Unimplemented));
}

#[tokio::test]
async fn observer_sees_every_unary_call() {
    let dir = tempfile::tempdir().unwrap();
    let socket = socket_in(&dir);
    let _server = serve(&socket);
    let seen = std::sync::Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let cri = CriClient::connect(&socket, SHORT)
        .await
        .unwrap()
        .with_observer(cri_proto::Observer::new(move |method, _took, failed| {
            record.lock().unwrap().push((method, failed));
        }));
    cri.version(v1::VersionRequest::default()).await.unwrap();
    let _ = cri
        .container_status(v1::ContainerStatusRequest::default())
        .await;
    // A clone keeps observing.
    let _ = cri.clone().status(v1::StatusRequest::default()).await;
    assert_eq!(
        *seen.lock().unwrap(),
        [
            ("Version", false),
            ("ContainerStatus", true),
            ("Status", true)
        ]
    );
}

#[tokio::test]
async fn deadlines() {
    let dir = tempfile::tempdir().unwrap();
    let socket = socket_in(&dir);
    let _server = serve(&socket);
    let cri = CriClient::connect(&socket, SHORT).await.unwrap();

    // A hung RPC ends at the default deadline, as a Timeout.
    let err = cri
        .list_containers(v1::ListContainersRequest::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Timeout { method: "ListContainers", after, .. } if after == SHORT),
        "{err}"
    );
    assert!(err.is_unavailable());
    assert!(err.to_string().contains("ListContainers"), "{err}");

    // ExecSync gets its own timeout plus the default as margin: 1 s + 0.3 s.
    let out = cri
        .exec_sync(v1::ExecSyncRequest {
            container_id: "c".into(),
            cmd: vec!["true".into()],
            timeout: 1,
        })
        .await
        .unwrap();
    assert_eq!(out.stdout, b"done");

    // StopContainer likewise gets the grace period plus the default.
    cri.stop_container(v1::StopContainerRequest {
        container_id: "c".into(),
        timeout: 1,
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn grpc_timeout_header_is_sent() {
    let dir = tempfile::tempdir().unwrap();
    let socket = socket_in(&dir);
    let fake = std::sync::Arc::new(Fake::default());
    let incoming = UnixListenerStream::new(UnixListener::bind(&socket).unwrap());
    let server = RuntimeServiceServer::from_arc(fake.clone());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(server)
            .serve_with_incoming(incoming),
    );

    let cri = CriClient::connect(&socket, Duration::from_secs(7))
        .await
        .unwrap();
    cri.version(v1::VersionRequest::default()).await.unwrap();
    let header = fake
        .last_grpc_timeout
        .lock()
        .unwrap()
        .clone()
        .expect("grpc-timeout header");
    // 7 s in the finest unit with at most 8 digits: microseconds.
    assert_eq!(header, "7000000u");
}

#[tokio::test]
async fn lazy_client_waits_for_the_socket_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let socket = socket_in(&dir);
    let cri = CriClient::connect_lazy(&socket, SHORT).unwrap();

    // Nothing listens yet: unavailable, not a panic or a hang.
    let err = cri
        .version(v1::VersionRequest::default())
        .await
        .unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    assert!(err.to_string().contains("Version"), "{err}");

    // The runtime comes up; the same client works without reconnecting by hand.
    let server = serve(&socket);
    cri.version(v1::VersionRequest::default()).await.unwrap();

    // The runtime goes away (closing our connection) and comes back, as in
    // a containerd restart: every failure in between reads as unavailable.
    server.stop().await;
    std::fs::remove_file(&socket).unwrap();
    let err = cri
        .version(v1::VersionRequest::default())
        .await
        .unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    let _server = serve(&socket);
    for _ in 0..20 {
        match cri.version(v1::VersionRequest::default()).await {
            Ok(_) => return,
            Err(err) => assert!(err.is_unavailable(), "{err:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no reconnect");
}

#[tokio::test]
async fn eager_connect_names_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let socket = socket_in(&dir);
    let err = CriClient::connect(&socket, SHORT).await.unwrap_err();
    assert!(
        matches!(err, Error::Connect { .. }) && err.is_unavailable(),
        "{err:?}"
    );
    assert!(
        err.to_string().contains(&*socket.to_string_lossy()),
        "{err}"
    );

    let err = CriClient::connect_lazy("tcp://127.0.0.1:1", SHORT).unwrap_err();
    assert!(matches!(err, Error::InvalidEndpoint { .. }), "{err}");
}

#[tokio::test]
async fn container_events_stream() {
    let dir = tempfile::tempdir().unwrap();
    let socket = socket_in(&dir);
    let _server = serve(&socket);
    let cri = CriClient::connect_lazy(&socket, SHORT).unwrap();

    let mut events = cri
        .get_container_events(v1::GetEventsRequest::default())
        .await
        .unwrap();
    let mut kinds = Vec::new();
    while let Some(event) = events.message().await.unwrap() {
        kinds.push(event.container_event_type());
    }
    assert_eq!(
        kinds,
        [
            v1::ContainerEventType::ContainerCreatedEvent,
            v1::ContainerEventType::ContainerStartedEvent
        ]
    );
}
