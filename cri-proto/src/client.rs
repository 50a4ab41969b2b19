//! [`CriClient`]: one typed async method per CRI RPC over a unix socket, each
//! with a deadline.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};
use tonic::{Code, Request, Response, Status, Streaming};

use crate::error::{Error, Result};
use crate::v1::{self, ImageServiceClient, RuntimeServiceClient};

/// Deadline of [`CriClient::pull_image`] unless set with
/// [`CriClient::with_pull_timeout`]: pulls of big images take minutes.
pub const DEFAULT_PULL_TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// The kubelet's CRI message limit (16 MiB): ListContainers on a busy node
/// outgrows tonic's 4 MiB default.
const MAX_MESSAGE_SIZE: usize = 16 << 20;

/// A CRI client (RuntimeService + ImageService) on one unix socket.
///
/// Cheap to clone: clones share one HTTP/2 connection. The connection is
/// (re)established on demand, so a client made while the runtime is down
/// starts working once the socket is back; calls in between fail with
/// [`Error::is_unavailable`].
///
/// # Errors
///
/// Every call returns [`Error::Status`] when the runtime answers with an
/// error or cannot be reached (see [`Error::is_unavailable`]), and
/// [`Error::Timeout`] when its deadline passes: [`CriClient::default_timeout`]
/// for most RPCs, [`CriClient::pull_timeout`] for PullImage, and the
/// request's own timeout plus the default for ExecSync and StopContainer.
#[derive(Debug, Clone)]
pub struct CriClient {
    socket: Arc<Path>,
    runtime: RuntimeServiceClient<Channel>,
    image: ImageServiceClient<Channel>,
    default_timeout: Duration,
    pull_timeout: Duration,
    observer: Option<Observer>,
}

/// Told of every finished unary call: the CRI method, how long it took,
/// and whether it failed (for the agent's operation metrics).
#[derive(Clone)]
pub struct Observer(Arc<dyn Fn(&'static str, Duration, bool) + Send + Sync>);

impl Observer {
    pub fn new(f: impl Fn(&'static str, Duration, bool) + Send + Sync + 'static) -> Observer {
        Observer(Arc::new(f))
    }
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Observer")
    }
}

impl CriClient {
    /// A client that connects on first use and reconnects by itself, so an
    /// agent can start before containerd. `socket` is a path or a
    /// `unix:///path` URL.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidEndpoint`] for any other scheme or an empty path.
    ///
    /// # Panics
    ///
    /// Outside a Tokio runtime: the channel spawns its connection task here.
    pub fn connect_lazy(
        socket: impl Into<PathBuf>,
        default_timeout: Duration,
    ) -> Result<CriClient> {
        let socket: Arc<Path> = socket_path(socket.into())?.into();
        let channel =
            endpoint(default_timeout).connect_with_connector_lazy(connector(socket.clone()));
        Ok(CriClient::new(socket, channel, default_timeout))
    }

    /// Like [`CriClient::connect_lazy`], but opens the connection now.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidEndpoint`] as for `connect_lazy`; [`Error::Connect`]
    /// when the socket cannot be reached.
    pub async fn connect(
        socket: impl Into<PathBuf>,
        default_timeout: Duration,
    ) -> Result<CriClient> {
        let socket: Arc<Path> = socket_path(socket.into())?.into();
        let channel = endpoint(default_timeout)
            .connect_with_connector(connector(socket.clone()))
            .await
            .map_err(|source| Error::Connect {
                socket: socket.to_path_buf(),
                source,
            })?;
        Ok(CriClient::new(socket, channel, default_timeout))
    }

    fn new(socket: Arc<Path>, channel: Channel, default_timeout: Duration) -> CriClient {
        CriClient {
            socket,
            runtime: RuntimeServiceClient::new(channel.clone())
                .max_decoding_message_size(MAX_MESSAGE_SIZE)
                .max_encoding_message_size(MAX_MESSAGE_SIZE),
            image: ImageServiceClient::new(channel)
                .max_decoding_message_size(MAX_MESSAGE_SIZE)
                .max_encoding_message_size(MAX_MESSAGE_SIZE),
            default_timeout,
            pull_timeout: DEFAULT_PULL_TIMEOUT,
            observer: None,
        }
    }

    /// Reports every unary call (method, duration, failed) to `observer`.
    pub fn with_observer(mut self, observer: Observer) -> CriClient {
        self.observer = Some(observer);
        self
    }

    /// Sets the deadline of [`CriClient::pull_image`].
    pub fn with_pull_timeout(mut self, pull_timeout: Duration) -> CriClient {
        self.pull_timeout = pull_timeout;
        self
    }

    /// The unix socket path this client talks to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Deadline of every call except PullImage and ExecSync.
    pub fn default_timeout(&self) -> Duration {
        self.default_timeout
    }

    /// Deadline of PullImage.
    pub fn pull_timeout(&self) -> Duration {
        self.pull_timeout
    }

    /// The generated RuntimeService client on the shared connection, for
    /// calls without this type's deadlines.
    pub fn runtime(&self) -> RuntimeServiceClient<Channel> {
        self.runtime.clone()
    }

    /// The generated ImageService client on the shared connection.
    pub fn image(&self) -> ImageServiceClient<Channel> {
        self.image.clone()
    }

    /// Runs one unary call with deadline `after`, enforced here and sent as
    /// `grpc-timeout` so the runtime stops working on it too.
    async fn unary<Req, Resp, Fut>(
        &self,
        method: &'static str,
        after: Duration,
        req: Req,
        call: impl FnOnce(Request<Req>) -> Fut,
    ) -> Result<Resp>
    where
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        let mut request = Request::new(req);
        request.set_timeout(after);
        let started = Instant::now();
        let result = match tokio::time::timeout(after, call(request)).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            // tonic enforces grpc-timeout itself and reports `Cancelled`, a
            // runtime reports `DeadlineExceeded`: either way our deadline
            // passed, so say so in one way.
            Ok(Err(status))
                if matches!(status.code(), Code::Cancelled | Code::DeadlineExceeded)
                    && started.elapsed() >= after =>
            {
                Err(self.timeout_error(method, after))
            }
            Ok(Err(status)) => Err(self.status_error(method, status)),
            Err(_elapsed) => Err(self.timeout_error(method, after)),
        };
        if let Some(observe) = &self.observer {
            (observe.0)(method, started.elapsed(), result.is_err());
        }
        result
    }

    /// The default deadline plus a request's own timeout in seconds (<= 0
    /// adds nothing).
    fn default_plus_secs(&self, secs: i64) -> Duration {
        let own = Duration::from_secs(u64::try_from(secs).unwrap_or(0));
        self.default_timeout.saturating_add(own)
    }

    fn timeout_error(&self, method: &'static str, after: Duration) -> Error {
        Error::Timeout {
            method,
            socket: self.socket.to_path_buf(),
            after,
        }
    }

    fn status_error(&self, method: &'static str, status: Status) -> Error {
        Error::Status {
            method,
            socket: self.socket.to_path_buf(),
            status,
        }
    }
}

/// One method per unary RPC, all with the default deadline.
macro_rules! unary_rpcs {
    ($service:literal, $client:ident: $(
        $(#[$doc:meta])* $rpc:literal => fn $name:ident($req:ident) -> $resp:ident;
    )*) => {
        impl CriClient {$(
            #[doc = concat!("`", $service, "/", $rpc, "` with the default deadline.")]
            $(#[$doc])*
            ///
            /// # Errors
            ///
            /// See [`CriClient`](CriClient#errors).
            pub async fn $name(&self, req: v1::$req) -> Result<v1::$resp> {
                let mut client = self.$client.clone();
                self.unary($rpc, self.default_timeout, req, move |r| async move { client.$name(r).await })
                    .await
            }
        )*}
    };
}

unary_rpcs! {"RuntimeService", runtime:
    "Version" => fn version(VersionRequest) -> VersionResponse;
    "RunPodSandbox" => fn run_pod_sandbox(RunPodSandboxRequest) -> RunPodSandboxResponse;
    /// Idempotent for stopped sandboxes, but containerd 1.6 answers
    /// `NotFound` for unknown ids.
    "StopPodSandbox" => fn stop_pod_sandbox(StopPodSandboxRequest) -> StopPodSandboxResponse;
    /// Idempotent: succeeds when the sandbox is already removed.
    "RemovePodSandbox" => fn remove_pod_sandbox(RemovePodSandboxRequest) -> RemovePodSandboxResponse;
    /// `NotFound` for an unknown id.
    "PodSandboxStatus" => fn pod_sandbox_status(PodSandboxStatusRequest) -> PodSandboxStatusResponse;
    "ListPodSandbox" => fn list_pod_sandbox(ListPodSandboxRequest) -> ListPodSandboxResponse;
    "CreateContainer" => fn create_container(CreateContainerRequest) -> CreateContainerResponse;
    "StartContainer" => fn start_container(StartContainerRequest) -> StartContainerResponse;
    /// Idempotent: succeeds when the container is already removed.
    "RemoveContainer" => fn remove_container(RemoveContainerRequest) -> RemoveContainerResponse;
    "ListContainers" => fn list_containers(ListContainersRequest) -> ListContainersResponse;
    /// `NotFound` for an unknown id.
    "ContainerStatus" => fn container_status(ContainerStatusRequest) -> ContainerStatusResponse;
    "UpdateContainerResources" => fn update_container_resources(UpdateContainerResourcesRequest) -> UpdateContainerResourcesResponse;
    "ReopenContainerLog" => fn reopen_container_log(ReopenContainerLogRequest) -> ReopenContainerLogResponse;
    /// Returns the URL of the runtime's streaming server, not the stream.
    "Exec" => fn exec(ExecRequest) -> ExecResponse;
    /// Returns the URL of the runtime's streaming server, not the stream.
    "Attach" => fn attach(AttachRequest) -> AttachResponse;
    /// Returns the URL of the runtime's streaming server, not the stream.
    "PortForward" => fn port_forward(PortForwardRequest) -> PortForwardResponse;
    "ContainerStats" => fn container_stats(ContainerStatsRequest) -> ContainerStatsResponse;
    "ListContainerStats" => fn list_container_stats(ListContainerStatsRequest) -> ListContainerStatsResponse;
    "PodSandboxStats" => fn pod_sandbox_stats(PodSandboxStatsRequest) -> PodSandboxStatsResponse;
    "ListPodSandboxStats" => fn list_pod_sandbox_stats(ListPodSandboxStatsRequest) -> ListPodSandboxStatsResponse;
    "UpdateRuntimeConfig" => fn update_runtime_config(UpdateRuntimeConfigRequest) -> UpdateRuntimeConfigResponse;
    /// Carries the RuntimeReady / NetworkReady conditions.
    "Status" => fn status(StatusRequest) -> StatusResponse;
    /// The runtime's cgroup driver; `Unimplemented` on older runtimes.
    "RuntimeConfig" => fn runtime_config(RuntimeConfigRequest) -> RuntimeConfigResponse;
}

unary_rpcs! {"ImageService", image:
    "ListImages" => fn list_images(ListImagesRequest) -> ListImagesResponse;
    /// An absent image is `image: None`, not an error.
    "ImageStatus" => fn image_status(ImageStatusRequest) -> ImageStatusResponse;
    /// Idempotent: succeeds when the image is already gone.
    "RemoveImage" => fn remove_image(RemoveImageRequest) -> RemoveImageResponse;
    "ImageFsInfo" => fn image_fs_info(ImageFsInfoRequest) -> ImageFsInfoResponse;
}

impl CriClient {
    /// `ImageService/PullImage` with [`CriClient::pull_timeout`] as deadline.
    ///
    /// # Errors
    ///
    /// See [`CriClient`](CriClient#errors).
    pub async fn pull_image(&self, req: v1::PullImageRequest) -> Result<v1::PullImageResponse> {
        let mut client = self.image.clone();
        self.unary("PullImage", self.pull_timeout, req, move |r| async move {
            client.pull_image(r).await
        })
        .await
    }

    /// `RuntimeService/ExecSync`. The deadline is the request's own `timeout`
    /// (seconds, 0 = none) plus the default deadline as margin, so the
    /// runtime's own timeout fires first and reports the command's fate.
    ///
    /// # Errors
    ///
    /// See [`CriClient`](CriClient#errors).
    pub async fn exec_sync(&self, req: v1::ExecSyncRequest) -> Result<v1::ExecSyncResponse> {
        let after = self.default_plus_secs(req.timeout);
        let mut client = self.runtime.clone();
        self.unary("ExecSync", after, req, move |r| async move {
            client.exec_sync(r).await
        })
        .await
    }

    /// `RuntimeService/StopContainer`. The runtime kills the container after
    /// the request's `timeout` (grace period, seconds), so the deadline is
    /// that plus the default deadline, as in the kubelet.
    ///
    /// Idempotent for stopped containers, but containerd 1.6 answers
    /// `NotFound` for unknown ids.
    ///
    /// # Errors
    ///
    /// See [`CriClient`](CriClient#errors).
    pub async fn stop_container(
        &self,
        req: v1::StopContainerRequest,
    ) -> Result<v1::StopContainerResponse> {
        let after = self.default_plus_secs(req.timeout);
        let mut client = self.runtime.clone();
        self.unary("StopContainer", after, req, move |r| async move {
            client.stop_container(r).await
        })
        .await
    }

    /// `RuntimeService/GetContainerEvents`: the runtime's container lifecycle
    /// events (evented PLEG). The stream has no deadline; it ends with an
    /// error item when the runtime goes away, and callers then resubscribe
    /// and relist.
    ///
    /// # Errors
    ///
    /// See [`CriClient`](CriClient#errors); `Unimplemented` on runtimes
    /// without events (containerd 1.6).
    ///
    /// # Caveats
    ///
    /// containerd (grpc-go) sends the response headers only with the first
    /// event, so opening the stream cannot carry a deadline: on an idle node
    /// this future waits for the first event. To still fail fast when the
    /// runtime is down or hung, a Version call with the default deadline
    /// goes first; its errors are reported as GetContainerEvents.
    pub async fn get_container_events(
        &self,
        req: v1::GetEventsRequest,
    ) -> Result<Streaming<v1::ContainerEventResponse>> {
        const METHOD: &str = "GetContainerEvents";
        let mut probe = self.runtime.clone();
        self.unary(
            METHOD,
            self.default_timeout,
            v1::VersionRequest::default(),
            move |r| async move { probe.version(r).await },
        )
        .await?;
        let mut client = self.runtime.clone();
        client
            .get_container_events(req)
            .await
            .map(Response::into_inner)
            .map_err(|status| self.status_error(METHOD, status))
    }
}

/// Accepts `/path`, `relative/path` and `unix:///path`, like the kubelet's
/// `--container-runtime-endpoint`.
fn socket_path(endpoint: PathBuf) -> Result<PathBuf> {
    let Some(text) = endpoint.to_str() else {
        return Ok(endpoint); // not UTF-8, so not a URL either
    };
    let path = match text.split_once("://") {
        None => text,
        Some(("unix", path)) if path.starts_with('/') => path,
        Some(_) => "",
    };
    if path.is_empty() {
        return Err(Error::InvalidEndpoint {
            endpoint: text.to_owned(),
        });
    }
    Ok(PathBuf::from(path))
}

fn endpoint(default_timeout: Duration) -> Endpoint {
    // tonic wants an http URI, but the connector ignores it and dials the
    // socket; "localhost" is also what grpc-go sends as :authority for unix.
    Endpoint::from_static("http://localhost").connect_timeout(default_timeout)
}

fn connector(
    socket: Arc<Path>,
) -> impl tower::Service<
    Uri,
    Response = TokioIo<UnixStream>,
    Error = std::io::Error,
    Future = impl Future<Output = std::io::Result<TokioIo<UnixStream>>> + Send,
> + Send
       + 'static {
    tower::service_fn(move |_: Uri| {
        let socket = socket.clone();
        async move { Ok(TokioIo::new(UnixStream::connect(&*socket).await?)) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_paths() {
        let ok = |s: &str| socket_path(s.into()).unwrap();
        assert_eq!(
            ok("unix:///run/containerd/containerd.sock"),
            Path::new("/run/containerd/containerd.sock")
        );
        assert_eq!(
            ok("/run/containerd/containerd.sock"),
            Path::new("/run/containerd/containerd.sock")
        );
        assert_eq!(ok("c.sock"), Path::new("c.sock"));
        for bad in [
            "",
            "unix://",
            "unix://relative.sock",
            "tcp://127.0.0.1:1234",
            "npipe:////./pipe/x",
        ] {
            let err = socket_path(bad.into()).unwrap_err();
            assert!(matches!(err, Error::InvalidEndpoint { .. }), "{bad}: {err}");
        }
    }

    #[tokio::test]
    async fn futures_are_send() {
        fn send<T: Send>(_: T) {}
        let client = CriClient::connect_lazy("/nonexistent.sock", Duration::from_secs(1)).unwrap();
        send(client.version(Default::default()));
        send(client.exec_sync(Default::default()));
        send(client.get_container_events(Default::default()));
        send(CriClient::connect(
            "/nonexistent.sock",
            Duration::from_secs(1),
        ));
    }
}
