//! A fault-injecting CRI proxy: a real gRPC server on a unix socket that serves the CRI
//! `RuntimeService` and `ImageService` by forwarding every call to a real runtime (the private
//! containerd), except the calls a test has chosen to disturb. An agent is pointed at it with
//! `--container-runtime-endpoint` ([`CriProxy::endpoint`]).
//!
//! A fault ([`Fault`]) applies to one CRI method (or `*`, every method) for a share of its calls
//! ([`Share`]): the next N calls, or a fraction of calls chosen by the proxy's seeded random
//! source, so a run can be replayed. Faults act before the call is forwarded: a delayed call
//! reaches the runtime late (or never, when the caller gives up first), a failed or hung call
//! never reaches it. A caller that gives up (its deadline, sent as `grpc-timeout`, or a reset
//! stream) ends the call's handler, so a hung call holds nothing once its caller is gone.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::image_service_server::{ImageService, ImageServiceServer};
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::runtime_service_server::{RuntimeService, RuntimeServiceServer};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::rng::Rng;

/// The largest message the proxy passes on (the agent's own limit for list answers).
const MAX_MESSAGE: usize = 64 << 20;

/// What the proxy does to a call it disturbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Waits this long, then forwards the call.
    Delay(Duration),
    /// Answers with this gRPC status at once; the runtime never sees the call.
    Fail(tonic::Code),
    /// Never answers (until the caller gives up).
    Hang,
    /// Forwards the call at once (the runtime performs it) but holds the answer this long: a
    /// runtime that does the work and answers after the caller's deadline.
    Late(Duration),
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Delay(d) => write!(f, "delay {d:?}"),
            Fault::Fail(code) => write!(f, "fail {code:?}"),
            Fault::Hang => write!(f, "hang"),
            Fault::Late(d) => write!(f, "answer late by {d:?}"),
        }
    }
}

/// Which calls of the method a fault disturbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Share {
    /// The next this many calls, then none.
    Next(usize),
    /// Each call with this chance in a million, drawn from the proxy's seeded source.
    PerMillion(u32),
}

impl Share {
    /// Every call.
    pub const ALL: Share = Share::PerMillion(1_000_000);
}

/// One injected fault.
#[derive(Debug, Clone)]
struct Rule {
    /// A CRI method name (`RunPodSandbox`), or `*` for every method.
    method: String,
    fault: Fault,
    share: Share,
}

/// What the proxy has been told and has seen.
#[derive(Debug)]
struct State {
    rules: Vec<Rule>,
    rng: Rng,
    /// Calls per method, disturbed or not.
    calls: BTreeMap<String, u64>,
    /// Disturbed calls per method.
    injected: BTreeMap<String, u64>,
}

impl State {
    /// Counts a call to `method` and picks the fault to apply to it, if any: the first rule for
    /// the method whose share takes this call.
    fn pick(&mut self, method: &str) -> Option<Fault> {
        *self.calls.entry(method.to_owned()).or_default() += 1;
        let rng = &mut self.rng;
        let fault = self
            .rules
            .iter_mut()
            .filter(|r| r.method == method || r.method == "*")
            .find_map(|r| match &mut r.share {
                Share::Next(n) if *n > 0 => {
                    *n -= 1;
                    Some(r.fault)
                }
                Share::Next(_) => None,
                Share::PerMillion(p) => (rng.below(1_000_000) < u64::from(*p)).then_some(r.fault),
            })?;
        *self.injected.entry(method.to_owned()).or_default() += 1;
        Some(fault)
    }
}

/// The shared state behind the proxy's handle and its server.
#[derive(Debug, Clone)]
struct Shared(Arc<Mutex<State>>);

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies the fault picked for this call of `method`: `Ok` to forward it, with how long to
    /// hold the runtime's answer.
    async fn disturb(&self, method: &str) -> Result<Duration, Status> {
        let fault = self.lock().pick(method);
        match fault {
            None => Ok(Duration::ZERO),
            Some(Fault::Late(d)) => Ok(d),
            Some(Fault::Delay(d)) => {
                tokio::time::sleep(d).await;
                Ok(Duration::ZERO)
            }
            Some(Fault::Fail(code)) => Err(Status::new(
                code,
                format!("{method}: fault injected by the CRI proxy"),
            )),
            Some(Fault::Hang) => std::future::pending().await,
        }
    }
}

/// The gRPC services: forward to the runtime after [`Shared::disturb`]. The forwarded call runs
/// in a task of its own, so that it completes in the runtime even when the caller gives up on
/// it (a late answer's call must still happen).
#[derive(Clone)]
struct Forward {
    shared: Shared,
    runtime: RuntimeServiceClient<Channel>,
    image: ImageServiceClient<Channel>,
}

/// Implements a CRI service trait for [`Forward`]: each listed method is disturbed under its
/// CRI name and then forwarded with the named client. `extra` holds the trait's other items.
macro_rules! forward {
    ($service:ident, $client:ident, { $($method:ident($name:literal, $req:ident) -> $resp:ident;)* } $($extra:tt)*) => {
        #[tonic::async_trait]
        impl $service for Forward {
            $(
                async fn $method(
                    &self,
                    request: Request<cri::$req>,
                ) -> Result<Response<cri::$resp>, Status> {
                    let late = self.shared.disturb($name).await?;
                    let mut client = self.$client.clone();
                    let call = tokio::spawn(async move {
                        client.$method(request.into_inner()).await
                    });
                    let answer = call
                        .await
                        .unwrap_or_else(|e| Err(Status::internal(format!("proxy task: {e}"))));
                    tokio::time::sleep(late).await;
                    answer
                }
            )*
            $($extra)*
        }
    };
}

forward!(RuntimeService, runtime, {
    version("Version", VersionRequest) -> VersionResponse;
    run_pod_sandbox("RunPodSandbox", RunPodSandboxRequest) -> RunPodSandboxResponse;
    stop_pod_sandbox("StopPodSandbox", StopPodSandboxRequest) -> StopPodSandboxResponse;
    remove_pod_sandbox("RemovePodSandbox", RemovePodSandboxRequest) -> RemovePodSandboxResponse;
    pod_sandbox_status("PodSandboxStatus", PodSandboxStatusRequest) -> PodSandboxStatusResponse;
    list_pod_sandbox("ListPodSandbox", ListPodSandboxRequest) -> ListPodSandboxResponse;
    create_container("CreateContainer", CreateContainerRequest) -> CreateContainerResponse;
    start_container("StartContainer", StartContainerRequest) -> StartContainerResponse;
    stop_container("StopContainer", StopContainerRequest) -> StopContainerResponse;
    remove_container("RemoveContainer", RemoveContainerRequest) -> RemoveContainerResponse;
    list_containers("ListContainers", ListContainersRequest) -> ListContainersResponse;
    container_status("ContainerStatus", ContainerStatusRequest) -> ContainerStatusResponse;
    update_container_resources("UpdateContainerResources", UpdateContainerResourcesRequest)
        -> UpdateContainerResourcesResponse;
    reopen_container_log("ReopenContainerLog", ReopenContainerLogRequest)
        -> ReopenContainerLogResponse;
    exec_sync("ExecSync", ExecSyncRequest) -> ExecSyncResponse;
    exec("Exec", ExecRequest) -> ExecResponse;
    attach("Attach", AttachRequest) -> AttachResponse;
    port_forward("PortForward", PortForwardRequest) -> PortForwardResponse;
    container_stats("ContainerStats", ContainerStatsRequest) -> ContainerStatsResponse;
    list_container_stats("ListContainerStats", ListContainerStatsRequest)
        -> ListContainerStatsResponse;
    pod_sandbox_stats("PodSandboxStats", PodSandboxStatsRequest) -> PodSandboxStatsResponse;
    list_pod_sandbox_stats("ListPodSandboxStats", ListPodSandboxStatsRequest)
        -> ListPodSandboxStatsResponse;
    update_runtime_config("UpdateRuntimeConfig", UpdateRuntimeConfigRequest)
        -> UpdateRuntimeConfigResponse;
    status("Status", StatusRequest) -> StatusResponse;
    checkpoint_container("CheckpointContainer", CheckpointContainerRequest)
        -> CheckpointContainerResponse;
    list_metric_descriptors("ListMetricDescriptors", ListMetricDescriptorsRequest)
        -> ListMetricDescriptorsResponse;
    list_pod_sandbox_metrics("ListPodSandboxMetrics", ListPodSandboxMetricsRequest)
        -> ListPodSandboxMetricsResponse;
    runtime_config("RuntimeConfig", RuntimeConfigRequest) -> RuntimeConfigResponse;
}
    type GetContainerEventsStream = tonic::Streaming<cri::ContainerEventResponse>;

    async fn get_container_events(
        &self,
        request: Request<cri::GetEventsRequest>,
    ) -> Result<Response<Self::GetContainerEventsStream>, Status> {
        self.shared.disturb("GetContainerEvents").await?;
        let mut client = self.runtime.clone();
        client.get_container_events(request.into_inner()).await
    }
);

forward!(ImageService, image, {
    list_images("ListImages", ListImagesRequest) -> ListImagesResponse;
    image_status("ImageStatus", ImageStatusRequest) -> ImageStatusResponse;
    pull_image("PullImage", PullImageRequest) -> PullImageResponse;
    remove_image("RemoveImage", RemoveImageRequest) -> RemoveImageResponse;
    image_fs_info("ImageFsInfo", ImageFsInfoRequest) -> ImageFsInfoResponse;
});

/// Why the proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("CRI proxy: {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("CRI proxy: the upstream runtime endpoint: {0}")]
    Upstream(#[from] swiftlet::cri::Error),
}

/// A running proxy. Dropping it stops the server at once (calls in flight are cut off).
pub struct CriProxy {
    shared: Shared,
    socket: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for CriProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CriProxy")
            .field("socket", &self.socket)
            .finish_non_exhaustive()
    }
}

impl CriProxy {
    /// Starts a proxy in front of the runtime at `upstream` (`unix://...`) on a socket of its
    /// own, on a thread of its own; `seed` drives the fractional faults.
    pub fn start(upstream: &str, seed: u64) -> Result<Self, Error> {
        let io = |what: &str| {
            let what = what.to_owned();
            move |source| Error::Io { what, source }
        };
        let dir = tempfile::Builder::new()
            .prefix("swiftlet-cri-proxy-")
            .tempdir()
            .map_err(io("creating its directory"))?;
        let socket = dir.path().join("cri.sock");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("cri-proxy")
            .enable_all()
            .build()
            .map_err(io("starting its tokio runtime"))?;
        let shared = Shared(Arc::new(Mutex::new(State {
            rules: Vec::new(),
            rng: Rng::new(seed),
            calls: BTreeMap::new(),
            injected: BTreeMap::new(),
        })));
        // The listener and the lazy channel need the runtime's context.
        let (listener, forward) = {
            let _in_rt = rt.enter();
            let listener = tokio::net::UnixListener::bind(&socket)
                .map_err(io(&format!("binding {}", socket.display())))?;
            let channel = swiftlet::cri::channel(upstream)?;
            let forward = Forward {
                shared: shared.clone(),
                runtime: RuntimeServiceClient::new(channel.clone())
                    .max_decoding_message_size(MAX_MESSAGE),
                image: ImageServiceClient::new(channel).max_decoding_message_size(MAX_MESSAGE),
            };
            (listener, forward)
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("cri-proxy".into())
            .spawn(move || serve(rt, listener, forward, stopped))
            .map_err(io("starting its thread"))?;
        Ok(Self {
            shared,
            socket,
            stop: Some(stop),
            thread: Some(thread),
            _dir: dir,
        })
    }

    /// The proxy's endpoint, for `--container-runtime-endpoint`.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// The proxy's socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Disturbs `share` of the calls of `method` (a CRI method name, `*` for every method) with
    /// `fault`, after the faults injected before it (the first whose share takes a call wins).
    pub fn inject(&self, method: &str, fault: Fault, share: Share) {
        self.shared.lock().rules.push(Rule {
            method: method.to_owned(),
            fault,
            share,
        });
    }

    /// Removes every fault: calls from now on are forwarded as they are (a call already hanging
    /// still hangs until its caller gives up).
    pub fn clear(&self) {
        self.shared.lock().rules.clear();
    }

    /// Calls of `method` so far, disturbed or not.
    pub fn calls(&self, method: &str) -> u64 {
        self.shared.lock().calls.get(method).copied().unwrap_or(0)
    }

    /// Disturbed calls of `method` so far.
    pub fn injected(&self, method: &str) -> u64 {
        self.shared
            .lock()
            .injected
            .get(method)
            .copied()
            .unwrap_or(0)
    }
}

impl Drop for CriProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The proxy's thread: serves until told to stop, then drops every connection (no graceful
/// drain: a hung call would hold it forever).
fn serve(
    rt: tokio::runtime::Runtime,
    listener: tokio::net::UnixListener,
    forward: Forward,
    stopped: tokio::sync::oneshot::Receiver<()>,
) {
    rt.block_on(async move {
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        let served = tonic::transport::Server::builder()
            .add_service(
                RuntimeServiceServer::new(forward.clone())
                    .max_decoding_message_size(MAX_MESSAGE)
                    .max_encoding_message_size(MAX_MESSAGE),
            )
            .add_service(
                ImageServiceServer::new(forward)
                    .max_decoding_message_size(MAX_MESSAGE)
                    .max_encoding_message_size(MAX_MESSAGE),
            )
            .serve_with_incoming(incoming);
        tokio::select! {
            r = served => if let Err(e) = r {
                eprintln!("CRI proxy: serving: {e}");
            },
            _ = stopped => {}
        }
    });
    rt.shutdown_timeout(Duration::ZERO);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(seed: u64) -> State {
        State {
            rules: Vec::new(),
            rng: Rng::new(seed),
            calls: BTreeMap::new(),
            injected: BTreeMap::new(),
        }
    }

    #[test]
    fn next_n_disturbs_exactly_n_calls_of_its_method() {
        let mut s = state(1);
        s.rules.push(Rule {
            method: "StartContainer".into(),
            fault: Fault::Hang,
            share: Share::Next(2),
        });
        assert_eq!(s.pick("CreateContainer"), None);
        assert_eq!(s.pick("StartContainer"), Some(Fault::Hang));
        assert_eq!(s.pick("StartContainer"), Some(Fault::Hang));
        assert_eq!(s.pick("StartContainer"), None);
        assert_eq!(s.calls.get("StartContainer"), Some(&3));
        assert_eq!(s.injected.get("StartContainer"), Some(&2));
        assert_eq!(s.injected.get("CreateContainer"), None);
    }

    #[test]
    fn a_fraction_is_drawn_from_the_seed() {
        let draws = |seed| {
            let mut s = state(seed);
            s.rules.push(Rule {
                method: "*".into(),
                fault: Fault::Fail(tonic::Code::Unavailable),
                share: Share::PerMillion(300_000),
            });
            (0..1000)
                .map(|_| s.pick("ListContainers").is_some())
                .collect::<Vec<_>>()
        };
        let a = draws(9);
        assert_eq!(a, draws(9));
        let hit = a.iter().filter(|&&x| x).count();
        assert!((200..400).contains(&hit), "{hit} of 1000 at 30 %");
        let mut all = state(3);
        all.rules.push(Rule {
            method: "Version".into(),
            fault: Fault::Hang,
            share: Share::ALL,
        });
        assert!((0..100).all(|_| all.pick("Version").is_some()));
    }
}
