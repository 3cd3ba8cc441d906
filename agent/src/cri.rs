//! The one client through which the agent talks to the container runtime. Every call is timed: a
//! tracing span, the `swiftlet_runtime_operations_duration_seconds{operation}` histogram and an
//! error counter. No other code holds a CRI client.
//!
//! # Deadlines
//!
//! Every call has a deadline computed from `--runtime-request-timeout` ([`Cri::request_timeout`],
//! default 2 minutes) as the kubelet computes it (see [`Deadline`]): past it the call is
//! abandoned (its HTTP/2 stream is reset, and the request carries the deadline in `grpc-timeout`
//! so the runtime stops working on it too), it fails with [`Error::DeadlineExceeded`] naming the
//! method and the deadline, and it is counted in `swiftlet_cri_deadline_exceeded_total{method}`
//! besides the error counter. Image pulls have no deadline, as in the kubelet: a pull may take
//! as long as the image needs, and a pull that makes no progress is the runtime's to cancel.
//!
//! # Trace markers (for eBPF uprobes)
//!
//! Every call is bracketed by two exported no-op functions that uprobes attach to by symbol name
//! (`#[no_mangle] extern "C"`, so they keep their name and the C calling convention). On x86-64
//! each is a naked function whose first instruction is a five-byte no-op (`nopl 0(%rax,%rax,1)`)
//! followed by `ret`: the kernel emulates a probed no-op instead of single-stepping it, and from
//! Linux 6.18 it turns a uprobe on a five-byte no-op into a call to a trampoline that enters the
//! kernel with a system call, with no trap at all. Elsewhere they are ordinary functions kept
//! whole by `#[inline(never)]` and `black_box`:
//!
//! * `swiftlet_cri_call_begin(method: u32, pod_uid: *const u8, pod_uid_len: usize)`
//! * `swiftlet_cri_call_end(method: u32, pod_uid: *const u8, pod_uid_len: usize, ok: u32)`
//!
//! `method` is the index of the method in [`METHODS`] (0 = `Version`, 1 = `RunPodSandbox`, ...;
//! append only, never renumber). `pod_uid` points at the UTF-8 UID of the pod the call is made for
//! (not NUL-terminated); the pointer is valid only during the call. The pod comes from
//! [`with_pod`], which the runtime manager wraps around each pod's sync and kill. Calls made for
//! no pod (the PLEG's relists and reads) call no marker: the pod timelines have no use for them,
//! and every uprobe hit costs the agent time in the kernel (~10 µs a marker here when it took
//! a trap and a single-step, a tenth of the agent's CPU during a burst of pod starts when
//! relists fired them too). On x86-64 the arguments are in rdi, rsi, rdx (and rcx); the same
//! pid/tid sees begin then end, so a uprobe pair times the call from the agent's side.
use crate::metrics::{MethodLabel, Metrics};
use hyper_util::rt::TokioIo;
use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tonic::transport::{Channel, Endpoint, Uri};
use tracing::Instrument;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("container runtime endpoint {endpoint:?}: only unix:// endpoints are supported")]
    UnsupportedEndpoint { endpoint: String },
    #[error("connecting to the container runtime at {endpoint}: {source}")]
    Connect {
        endpoint: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("CRI {method}: {status}")]
    Call {
        method: &'static str,
        status: tonic::Status,
    },
    #[error(
        "CRI {method}: no answer within its deadline of {deadline:?} (set by --runtime-request-timeout)"
    )]
    DeadlineExceeded {
        method: &'static str,
        deadline: Duration,
    },
}

impl Error {
    /// True when the runtime said the object does not exist (already gone).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Call { status, .. } if status.code() == tonic::Code::NotFound)
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `--runtime-request-timeout`'s default, the kubelet's.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// How long one CRI call may take, computed from the request timeout as the kubelet computes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deadline {
    /// The call is abandoned after this long.
    After(Duration),
    /// No deadline: `PullImage`, and `ExecSync` without a timeout of its own.
    None,
}

impl Deadline {
    /// Most calls: the request timeout.
    pub fn request(timeout: Duration) -> Self {
        Self::After(timeout)
    }

    /// `RunPodSandbox`: twice the request timeout (creating the sandbox's network takes longer).
    pub fn run_pod_sandbox(timeout: Duration) -> Self {
        Self::After(timeout.saturating_mul(2))
    }

    /// `StopContainer`: the grace period, then the request timeout for the kill and the answer.
    pub fn stop_container(timeout: Duration, grace_secs: i64) -> Self {
        Self::After(timeout.saturating_add(secs(grace_secs)))
    }

    /// `ExecSync`: the command's own timeout plus the request timeout, which leaves the runtime
    /// time to clean up; no deadline when the command has no timeout (0).
    pub fn exec_sync(timeout: Duration, command_secs: i64) -> Self {
        if command_secs == 0 {
            Self::None
        } else {
            Self::After(timeout.saturating_add(secs(command_secs)))
        }
    }
}

/// Seconds of a CRI request field as a duration (negative: zero).
fn secs(s: i64) -> Duration {
    Duration::from_secs(u64::try_from(s).unwrap_or(0))
}

/// Awaits one call until `deadline`. Past it the call's future is dropped (tonic resets its
/// stream) and the call fails with [`Error::DeadlineExceeded`]; an error that arrives once the
/// deadline has passed (the runtime enforcing the deadline it was sent) is the same failure.
pub async fn call_with_deadline<T, F>(method: &'static str, deadline: Deadline, fut: F) -> Result<T>
where
    F: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
{
    let start = tokio::time::Instant::now();
    let res = match deadline {
        Deadline::None => fut.await,
        Deadline::After(d) => match tokio::time::timeout(d, fut).await {
            Ok(res) => res,
            Err(_) => {
                return Err(Error::DeadlineExceeded {
                    method,
                    deadline: d,
                });
            }
        },
    };
    match (res, deadline) {
        (Ok(resp), _) => Ok(resp.into_inner()),
        (Err(_), Deadline::After(d)) if start.elapsed() >= d => Err(Error::DeadlineExceeded {
            method,
            deadline: d,
        }),
        (Err(status), _) => Err(Error::Call { method, status }),
    }
}

/// `msg` as a request that tells the runtime its deadline (`grpc-timeout`).
fn request<T>(msg: T, deadline: Deadline) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    if let Deadline::After(d) = deadline {
        req.set_timeout(d);
    }
    req
}

/// CRI method names by trace-marker id (the index). Append only. The table lives beside the eBPF
/// probes' event types, which decode the id.
pub const METHODS: &[&str] = &swiftlet_ebpf_common::CRI_METHODS;

/// The trace-marker id of a method name (`u32::MAX` for a name not in [`METHODS`]).
pub fn method_id(method: &str) -> u32 {
    METHODS
        .iter()
        .position(|m| *m == method)
        .and_then(|i| u32::try_from(i).ok())
        .unwrap_or(u32::MAX)
}

/// Trace marker: a CRI call begins. See the module documentation.
// SAFETY: `no_mangle`: the `swiftlet_` prefix makes the symbol unique in the process (no other
// crate or library defines it), so it replaces nothing. `naked`: the body is a five-byte no-op
// and `ret`, a whole function under the C calling convention (it reads no argument, touches
// neither the stack nor a register, and returns to its caller).
#[unsafe(no_mangle)]
#[cfg_attr(target_arch = "x86_64", unsafe(naked))]
#[cfg_attr(not(target_arch = "x86_64"), inline(never))]
pub extern "C" fn swiftlet_cri_call_begin(method: u32, pod_uid: *const u8, pod_uid_len: usize) {
    // The five-byte no-op a uprobe attaches to (see the module documentation), then return.
    #[cfg(target_arch = "x86_64")]
    core::arch::naked_asm!(".byte 0x0f, 0x1f, 0x44, 0x00, 0x00", "ret");
    #[cfg(not(target_arch = "x86_64"))]
    std::hint::black_box((method, pod_uid, pod_uid_len));
}

/// Trace marker: a CRI call ended (`ok` = 1 on success, 0 on error). See the module documentation.
// SAFETY: as for `swiftlet_cri_call_begin`: a unique symbol, and a naked no-op-then-`ret` body.
#[unsafe(no_mangle)]
#[cfg_attr(target_arch = "x86_64", unsafe(naked))]
#[cfg_attr(not(target_arch = "x86_64"), inline(never))]
pub extern "C" fn swiftlet_cri_call_end(
    method: u32,
    pod_uid: *const u8,
    pod_uid_len: usize,
    ok: u32,
) {
    #[cfg(target_arch = "x86_64")]
    core::arch::naked_asm!(".byte 0x0f, 0x1f, 0x44, 0x00, 0x00", "ret");
    #[cfg(not(target_arch = "x86_64"))]
    std::hint::black_box((method, pod_uid, pod_uid_len, ok));
}

tokio::task_local! {
    static POD_UID: std::sync::Arc<str>;
}

/// Runs `fut` with `uid` as the pod its CRI calls are made for (what the trace markers report).
pub async fn with_pod<F: Future>(uid: &str, fut: F) -> F::Output {
    POD_UID.scope(std::sync::Arc::from(uid), fut).await
}

/// The pod set by [`with_pod`] for the current task, if any.
pub fn current_pod() -> Option<std::sync::Arc<str>> {
    POD_UID.try_with(|u| u.clone()).ok()
}

fn marker(method: &'static str, end: Option<bool>) {
    let id = method_id(method);
    let fire = |ptr: *const u8, len: usize| match end {
        None => swiftlet_cri_call_begin(id, ptr, len),
        Some(ok) => swiftlet_cri_call_end(id, ptr, len, u32::from(ok)),
    };
    // Outside `with_pod` there is nothing to mark (see the module documentation).
    let _ = POD_UID.try_with(|u| fire(u.as_ptr(), u.len()));
}

/// Parses `unix:///path` (or a bare absolute path) into the socket path.
pub fn socket_path(endpoint: &str) -> Result<PathBuf> {
    if let Some(path) = endpoint.strip_prefix("unix://") {
        return Ok(PathBuf::from(path));
    }
    if endpoint.starts_with('/') {
        return Ok(PathBuf::from(endpoint));
    }
    Err(Error::UnsupportedEndpoint {
        endpoint: endpoint.to_owned(),
    })
}

/// A tonic channel to a CRI endpoint over a unix socket. Connects lazily and reconnects by itself.
pub fn channel(endpoint: &str) -> Result<Channel> {
    let path = socket_path(endpoint)?;
    // The URI is never dialled: the connector below ignores it and opens the socket.
    let ep = Endpoint::from_static("http://cri.invalid")
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true);
    Ok(
        ep.connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        })),
    )
}

/// The timed CRI client. Cheap to clone (tonic channels multiplex).
#[derive(Clone)]
pub struct Cri {
    runtime: RuntimeServiceClient<Channel>,
    /// The same connection, for calls decoded into this module's own message types
    /// ([`Cri::list_containers_brief`]).
    raw: tonic::client::Grpc<Channel>,
    image: ImageServiceClient<Channel>,
    metrics: Metrics,
    timeout: Duration,
}

impl Cri {
    pub fn new(endpoint: &str, metrics: Metrics) -> Result<Self> {
        let ch = channel(endpoint)?;
        Ok(Self {
            runtime: RuntimeServiceClient::new(ch.clone()).max_decoding_message_size(64 << 20),
            raw: tonic::client::Grpc::new(ch.clone()).max_decoding_message_size(64 << 20),
            image: ImageServiceClient::new(ch),
            metrics,
            timeout: DEFAULT_REQUEST_TIMEOUT,
        })
    }

    /// The same client with `timeout` as `--runtime-request-timeout` (see [`Deadline`]).
    #[must_use]
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// `--runtime-request-timeout`: the deadline of most calls.
    pub fn request_timeout(&self) -> Duration {
        self.timeout
    }

    /// The metrics the calls are counted in.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Times one call, bounded by `deadline`, and records its outcome. `method` is the CRI
    /// method name.
    async fn timed<T, F>(&self, method: &'static str, deadline: Deadline, fut: F) -> Result<T>
    where
        F: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        let span = tracing::debug_span!("cri", method);
        marker(method, None);
        let start = Instant::now();
        // Boxed: a call's future is large in debug builds, and the deadline's wrapper around it
        // would otherwise add copies of it to the stack of every pod sync that awaits it.
        let call = Box::pin(fut.instrument(span));
        let res = call_with_deadline(method, deadline, call).await;
        marker(method, Some(res.is_ok()));
        self.metrics
            .runtime_operation(method, start.elapsed().as_secs_f64(), res.is_err());
        if let Err(Error::DeadlineExceeded { .. }) = &res {
            self.metrics
                .cri_deadline_exceeded_total
                .get_or_create(&MethodLabel { method })
                .inc();
        }
        res
    }

    pub async fn version(&self) -> Result<cri::VersionResponse> {
        let mut c = self.runtime.clone();
        let d = Deadline::request(self.timeout);
        self.timed(
            "Version",
            d,
            c.version(request(cri::VersionRequest::default(), d)),
        )
        .await
    }

    /// The cgroup driver the runtime says it uses (`RuntimeConfig`): `Some(true)` systemd,
    /// `Some(false)` cgroupfs, `None` when it does not say (containerd before 1.7 does not
    /// implement the call). Asked once at start, outside the operation metrics: an
    /// unimplemented call is an answer here, not a runtime error.
    pub async fn systemd_cgroup_driver(&self) -> Result<Option<bool>> {
        let mut c = self.runtime.clone();
        let d = Deadline::request(self.timeout);
        let call = Box::pin(c.runtime_config(request(cri::RuntimeConfigRequest::default(), d)));
        match call_with_deadline("RuntimeConfig", d, call).await {
            Ok(response) => Ok(response
                .linux
                .map(|l| l.cgroup_driver == cri::CgroupDriver::Systemd as i32)),
            Err(Error::Call { status, .. }) if status.code() == tonic::Code::Unimplemented => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Runs a sandbox with the runtime handler `runtime_handler` (`""`: the runtime's default).
    pub async fn run_pod_sandbox(
        &self,
        config: cri::PodSandboxConfig,
        runtime_handler: String,
    ) -> Result<String> {
        let mut c = self.runtime.clone();
        let d = Deadline::run_pod_sandbox(self.timeout);
        let req = cri::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler,
        };
        Ok(self
            .timed("RunPodSandbox", d, c.run_pod_sandbox(request(req, d)))
            .await?
            .pod_sandbox_id)
    }

    pub async fn stop_pod_sandbox(&self, id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let d = Deadline::request(self.timeout);
        let req = cri::StopPodSandboxRequest {
            pod_sandbox_id: id.to_owned(),
        };
        self.timed("StopPodSandbox", d, c.stop_pod_sandbox(request(req, d)))
            .await
            .map(drop)
    }

    pub async fn remove_pod_sandbox(&self, id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let d = Deadline::request(self.timeout);
        let req = cri::RemovePodSandboxRequest {
            pod_sandbox_id: id.to_owned(),
        };
        self.timed("RemovePodSandbox", d, c.remove_pod_sandbox(request(req, d)))
            .await
            .map(drop)
    }

    pub async fn pod_sandbox_status(&self, id: &str) -> Result<Option<cri::PodSandboxStatus>> {
        let mut c = self.runtime.clone();
        let d = Deadline::request(self.timeout);
        let req = cri::PodSandboxStatusRequest {
            pod_sandbox_id: id.to_owned(),
            verbose: false,
        };
        Ok(self
            .timed("PodSandboxStatus", d, c.pod_sandbox_status(request(req, d)))
            .await?
            .status)
    }

    /// The process ID of a sandbox (its pause process) from the runtime's verbose status
    /// (containerd: `info.pid`); `None` when the runtime does not say.
    pub async fn pod_sandbox_pid(&self, id: &str) -> Result<Option<u32>> {
        let mut c = self.runtime.clone();
        let d = Deadline::request(self.timeout);
        let req = cri::PodSandboxStatusRequest {
            pod_sandbox_id: id.to_owned(),
            verbose: true,
        };
        let info = self
            .timed("PodSandboxStatus", d, c.pod_sandbox_status(request(req, d)))
            .await?
            .info;
        Ok(info
            .get("info")
            .and_then(|i| serde_json::from_str::<serde_json::Value>(i).ok())
            .and_then(|v| v["pid"].as_u64())
            .and_then(|p| u32::try_from(p).ok())
            .filter(|&p| p > 0))
    }

    /// Resource usage of the containers `filter` selects (cpu, memory, writable layer).
    pub async fn list_container_stats(
        &self,
        filter: Option<cri::ContainerStatsFilter>,
    ) -> Result<Vec<cri::ContainerStats>> {
        let mut c = self.runtime.clone();
        let d = Deadline::request(self.timeout);
        let req = cri::ListContainerStatsRequest { filter };
        Ok(self
            .timed(
                "ListContainerStats",
                d,
                c.list_container_stats(request(req, d)),
            )
            .await?
            .stats)
    }

    pub async fn list_pod_sandbox(
        &self,
        filter: Option<cri::PodSandboxFilter>,
    ) -> Result<Vec<cri::PodSandbox>> {
        let mut c = self.runtime.clone();
        let d = Deadline::request(self.timeout);
        let req = cri::ListPodSandboxRequest { filter };
        Ok(self
            .timed("ListPodSandbox", d, c.list_pod_sandbox(request(req, d)))
            .await?
            .items)
    }

    pub async fn create_container(
        &self,
        sandbox_id: &str,
        config: cri::ContainerConfig,
        sandbox_config: cri::PodSandboxConfig,
    ) -> Result<String> {
        let mut c = self.runtime.clone();
        let d = Deadline::request(self.timeout);
        let req = cri::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.to_owned(),
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        };
        Ok(self
            .timed("CreateContainer", d, c.create_container(request(req, d)))
            .await?
            .container_id)
    }

    pub async fn start_container(&self, id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let d = Deadline::request(self.timeout);
        let req = cri::StartContainerRequest {
            container_id: id.to_owned(),
        };
        self.timed("StartContainer", d, c.start_container(request(req, d)))
            .await
            .map(drop)
    }

    pub async fn stop_container(&self, id: &str, timeout_secs: i64) -> Result<()> {
        let mut c = self.runtime.clone();
        let d = Deadline::stop_container(self.timeout, timeout_secs);
        let req = cri::StopContainerRequest {
            container_id: id.to_owned(),
            timeout: timeout_secs,
        };
        self.timed("StopContainer", d, c.stop_container(request(req, d)))
            .await
            .map(drop)
    }

    /// Asks the runtime to reopen a running container's log file (after the log was rotated:
    /// the runtime creates a new file at the container's `log_path`). A runtime that fails it
    /// creates no new file.
    pub async fn reopen_container_log(&self, id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let d = Deadline::request(self.timeout);
        let req = cri::ReopenContainerLogRequest {
            container_id: id.to_owned(),
        };
        self.timed(
            "ReopenContainerLog",
            d,
            c.reopen_container_log(request(req, d)),
        )
        .await
        .map(drop)
    }

    pub async fn update_container_resources(
        &self,
        id: &str,
        linux: cri::LinuxContainerResources,
    ) -> Result<()> {
        let mut c = self.runtime.clone();
        let d = Deadline::request(self.timeout);
        let req = cri::UpdateContainerResourcesRequest {
            container_id: id.to_owned(),
            linux: Some(linux),
            ..Default::default()
        };
        self.timed(
            "UpdateContainerResources",
            d,
            c.update_container_resources(request(req, d)),
        )
        .await
        .map(drop)
    }

    pub async fn remove_container(&self, id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let d = Deadline::request(self.timeout);
        let req = cri::RemoveContainerRequest {
            container_id: id.to_owned(),
        };
        self.timed("RemoveContainer", d, c.remove_container(request(req, d)))
            .await
            .map(drop)
    }

    pub async fn list_containers(
        &self,
        filter: Option<cri::ContainerFilter>,
    ) -> Result<Vec<cri::Container>> {
        let mut c = self.runtime.clone();
        let d = Deadline::request(self.timeout);
        let req = cri::ListContainersRequest { filter };
        Ok(self
            .timed("ListContainers", d, c.list_containers(request(req, d)))
            .await?
            .containers)
    }

    /// `ListContainers` decoded into [`BriefContainer`]s: what a relist needs of each container
    /// (id, state, creation time, labels). The runtime sends the whole `Container`; the fields
    /// not declared are skipped while decoding instead of being built and dropped: the image,
    /// the image ref and id, the metadata and every annotation, most of a listing's decoding (a
    /// relist lists every container of the node once a period).
    pub async fn list_containers_brief(
        &self,
        filter: Option<cri::ContainerFilter>,
    ) -> Result<Vec<BriefContainer>> {
        let mut grpc = self.raw.clone();
        let d = Deadline::request(self.timeout);
        let req = request(cri::ListContainersRequest { filter }, d);
        let call = async move {
            grpc.ready().await.map_err(|e| {
                tonic::Status::unknown(format!("runtime connection not ready: {e}"))
            })?;
            let path = tonic::codegen::http::uri::PathAndQuery::from_static(
                "/runtime.v1.RuntimeService/ListContainers",
            );
            let codec =
                tonic_prost::ProstCodec::<cri::ListContainersRequest, BriefContainers>::default();
            grpc.unary(req, path, codec).await
        };
        Ok(self.timed("ListContainers", d, call).await?.containers)
    }

    pub async fn container_status(&self, id: &str) -> Result<Option<cri::ContainerStatus>> {
        let mut c = self.runtime.clone();
        let d = Deadline::request(self.timeout);
        let req = cri::ContainerStatusRequest {
            container_id: id.to_owned(),
            verbose: false,
        };
        Ok(self
            .timed("ContainerStatus", d, c.container_status(request(req, d)))
            .await?
            .status)
    }

    /// Runs `cmd` in a container and waits for it, at most `timeout_secs` (0: no limit).
    pub async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout_secs: i64,
    ) -> Result<cri::ExecSyncResponse> {
        let mut c = self.runtime.clone();
        let d = Deadline::exec_sync(self.timeout, timeout_secs);
        let req = cri::ExecSyncRequest {
            container_id: id.to_owned(),
            cmd,
            timeout: timeout_secs,
        };
        self.timed("ExecSync", d, c.exec_sync(request(req, d)))
            .await
    }

    /// A URL of the runtime's streaming server that runs `req`'s command in a container once a
    /// client connects to it (the exec, attach and port-forward URLs are single-use).
    pub async fn exec(&self, req: cri::ExecRequest) -> Result<String> {
        let mut c = self.runtime.clone();
        let d = Deadline::request(self.timeout);
        Ok(self.timed("Exec", d, c.exec(request(req, d))).await?.url)
    }

    /// A streaming URL attached to a container's main process.
    pub async fn attach(&self, req: cri::AttachRequest) -> Result<String> {
        let mut c = self.runtime.clone();
        let d = Deadline::request(self.timeout);
        Ok(self
            .timed("Attach", d, c.attach(request(req, d)))
            .await?
            .url)
    }

    /// A streaming URL forwarding to ports in a pod sandbox's network namespace.
    pub async fn port_forward(&self, req: cri::PortForwardRequest) -> Result<String> {
        let mut c = self.runtime.clone();
        let d = Deadline::request(self.timeout);
        Ok(self
            .timed("PortForward", d, c.port_forward(request(req, d)))
            .await?
            .url)
    }

    /// The runtime's status; `verbose` adds its own information (containerd: its CRI
    /// configuration as JSON under `config`).
    pub async fn status(&self, verbose: bool) -> Result<cri::StatusResponse> {
        let mut c = self.runtime.clone();
        let d = Deadline::request(self.timeout);
        self.timed(
            "Status",
            d,
            c.status(request(cri::StatusRequest { verbose }, d)),
        )
        .await
    }

    /// Every image the runtime holds.
    pub async fn list_images(&self) -> Result<Vec<cri::Image>> {
        let mut c = self.image.clone();
        let d = Deadline::request(self.timeout);
        let req = cri::ListImagesRequest { filter: None };
        Ok(self
            .timed("ListImages", d, c.list_images(request(req, d)))
            .await?
            .images)
    }

    /// Removes image `image` (an ID or a reference) with every tag it has.
    pub async fn remove_image(&self, image: &str) -> Result<()> {
        let mut c = self.image.clone();
        let d = Deadline::request(self.timeout);
        let req = cri::RemoveImageRequest {
            image: Some(image_spec(image)),
        };
        self.timed("RemoveImage", d, c.remove_image(request(req, d)))
            .await
            .map(drop)
    }

    /// The file systems the runtime keeps its images on, with their usage.
    pub async fn image_fs_info(&self) -> Result<cri::ImageFsInfoResponse> {
        let mut c = self.image.clone();
        let d = Deadline::request(self.timeout);
        self.timed(
            "ImageFsInfo",
            d,
            c.image_fs_info(request(cri::ImageFsInfoRequest {}, d)),
        )
        .await
    }

    pub async fn image_status(&self, image: &str) -> Result<Option<cri::Image>> {
        let mut c = self.image.clone();
        let d = Deadline::request(self.timeout);
        let req = cri::ImageStatusRequest {
            image: Some(image_spec(image)),
            verbose: false,
        };
        Ok(self
            .timed("ImageStatus", d, c.image_status(request(req, d)))
            .await?
            .image)
    }

    /// Pulls `image`, anonymously or with `auth` (never logged: the request is not traced).
    pub async fn pull_image(&self, image: &str, auth: Option<cri::AuthConfig>) -> Result<String> {
        let mut c = self.image.clone();
        // No deadline, as in the kubelet (see the module documentation).
        let d = Deadline::None;
        let req = cri::PullImageRequest {
            image: Some(image_spec(image)),
            auth,
            sandbox_config: None,
        };
        Ok(self
            .timed("PullImage", d, c.pull_image(request(req, d)))
            .await?
            .image_ref)
    }
}

pub fn image_spec(image: &str) -> cri::ImageSpec {
    cri::ImageSpec {
        image: image.to_owned(),
        ..Default::default()
    }
}

/// A container as `ListContainers` lists it, with only the fields a relist reads. The tags are
/// those of CRI's `runtime.v1.Container`; prost skips the other fields of each message.
#[derive(Clone, PartialEq, prost::Message)]
pub struct BriefContainer {
    #[prost(string, tag = "1")]
    pub id: String,
    /// A `runtime.v1.ContainerState`.
    #[prost(int32, tag = "6")]
    pub state: i32,
    #[prost(int64, tag = "7")]
    pub created_at: i64,
    #[prost(map = "string, string", tag = "8")]
    pub labels: std::collections::HashMap<String, String>,
}

/// `runtime.v1.ListContainersResponse` holding [`BriefContainer`]s.
#[derive(Clone, PartialEq, prost::Message)]
pub struct BriefContainers {
    #[prost(message, repeated, tag = "1")]
    pub containers: Vec<BriefContainer>,
}

#[cfg(test)]
mod tests {
    /// The brief listing decodes what the runtime's full `Container` says of the fields it
    /// declares (the tags are right) and skips the rest.
    #[test]
    fn a_brief_container_decodes_a_full_listing() {
        use prost::Message as _;
        let labels = std::collections::HashMap::from([
            ("io.kubernetes.pod.uid".to_owned(), "u1".to_owned()),
            ("io.kubernetes.container.name".to_owned(), "app".to_owned()),
        ]);
        let full = super::cri::ListContainersResponse {
            containers: vec![super::cri::Container {
                id: "c1".into(),
                pod_sandbox_id: "s1".into(),
                metadata: Some(super::cri::ContainerMetadata {
                    name: "app".into(),
                    attempt: 3,
                }),
                image: Some(super::cri::ImageSpec {
                    image: "busybox".into(),
                    ..Default::default()
                }),
                image_ref: "sha256:abc".into(),
                state: super::cri::ContainerState::ContainerExited as i32,
                created_at: 1_234_567,
                labels: labels.clone(),
                annotations: std::collections::HashMap::from([("a".into(), "b".into())]),
                image_id: "sha256:def".into(),
            }],
        };
        let brief =
            super::BriefContainers::decode(full.encode_to_vec().as_slice()).expect("decodes");
        assert_eq!(
            brief.containers,
            [super::BriefContainer {
                id: "c1".into(),
                state: super::cri::ContainerState::ContainerExited as i32,
                created_at: 1_234_567,
                labels,
            }]
        );
    }

    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(
            socket_path("unix:///run/c.sock").unwrap(),
            PathBuf::from("/run/c.sock")
        );
        assert_eq!(
            socket_path("/run/c.sock").unwrap(),
            PathBuf::from("/run/c.sock")
        );
        assert!(matches!(
            socket_path("tcp://1.2.3.4:1"),
            Err(Error::UnsupportedEndpoint { .. })
        ));
    }

    #[test]
    fn method_ids_are_stable() {
        // Uprobe consumers decode these numbers: they must never move.
        assert_eq!(method_id("Version"), 0);
        assert_eq!(method_id("RunPodSandbox"), 1);
        assert_eq!(method_id("StartContainer"), 7);
        assert_eq!(method_id("ExecSync"), 14);
        assert_eq!(method_id("NoSuchMethod"), u32::MAX);
    }

    #[test]
    fn deadlines_are_computed_as_the_kubelet_computes_them() {
        let t = Duration::from_secs(120);
        assert_eq!(Deadline::request(t), Deadline::After(t));
        assert_eq!(
            Deadline::run_pod_sandbox(t),
            Deadline::After(Duration::from_secs(240))
        );
        assert_eq!(
            Deadline::stop_container(t, 30),
            Deadline::After(Duration::from_secs(150))
        );
        assert_eq!(Deadline::stop_container(t, -1), Deadline::After(t));
        assert_eq!(
            Deadline::exec_sync(t, 10),
            Deadline::After(Duration::from_secs(130))
        );
        assert_eq!(Deadline::exec_sync(t, 0), Deadline::None);
    }

    /// A call that never answers, as `call_with_deadline` sees it.
    async fn never() -> std::result::Result<tonic::Response<()>, tonic::Status> {
        std::future::pending().await
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_never_answers_fails_at_its_deadline() {
        let start = tokio::time::Instant::now();
        let d = Deadline::stop_container(Duration::from_secs(120), 30);
        let err = call_with_deadline("StopContainer", d, never())
            .await
            .unwrap_err();
        assert_eq!(start.elapsed(), Duration::from_secs(150));
        assert!(
            matches!(err, Error::DeadlineExceeded { method: "StopContainer", deadline }
                if deadline == Duration::from_secs(150)),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains("StopContainer") && msg.contains("150s"),
            "{msg}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_without_deadline_is_waited_for() {
        // PullImage: a day without an answer is still no failure.
        let day = Duration::from_secs(86_400);
        let pull = call_with_deadline("PullImage", Deadline::None, never());
        assert!(tokio::time::timeout(day, pull).await.is_err());
        // And an answer after an hour is taken.
        let slow = async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(tonic::Response::new(7))
        };
        assert_eq!(
            call_with_deadline("PullImage", Deadline::None, slow)
                .await
                .unwrap(),
            7
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_error_at_the_deadline_is_the_deadline_and_one_before_it_is_the_runtimes() {
        let d = Duration::from_secs(5);
        let fail_after = |after: Duration, status: tonic::Status| async move {
            tokio::time::sleep(after).await;
            Err::<tonic::Response<()>, _>(status)
        };
        // The runtime enforcing the deadline it was sent answers just as it passes.
        let at = call_with_deadline(
            "CreateContainer",
            Deadline::After(d),
            fail_after(
                d,
                tonic::Status::deadline_exceeded("context deadline exceeded"),
            ),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(
                at,
                Error::DeadlineExceeded {
                    method: "CreateContainer",
                    ..
                }
            ),
            "{at:?}"
        );
        // A runtime's own DeadlineExceeded before the deadline is the runtime's error.
        let before = call_with_deadline(
            "CreateContainer",
            Deadline::After(d),
            fail_after(
                Duration::from_secs(1),
                tonic::Status::deadline_exceeded("inner timeout"),
            ),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(&before, Error::Call { status, .. }
                if status.code() == tonic::Code::DeadlineExceeded),
            "{before:?}"
        );
    }

    /// A real client against a socket whose server accepts connections and never answers: the
    /// call fails at the deadline, and is counted.
    #[tokio::test]
    async fn a_runtime_that_never_answers_fails_the_call_at_the_deadline_and_counts_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cri.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let (accepted_tx, mut accepted) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                let _ = accepted_tx.send(());
                held.push(conn);
            }
        });
        let metrics = Metrics::new();
        let timeout = Duration::from_millis(300);
        let cri = Cri::new(&format!("unix://{}", path.display()), metrics.clone())
            .unwrap()
            .with_request_timeout(timeout);
        assert_eq!(cri.request_timeout(), timeout);
        let start = Instant::now();
        let err = cri.version().await.unwrap_err();
        let took = start.elapsed();
        assert!(
            matches!(err, Error::DeadlineExceeded { method: "Version", deadline } if deadline == timeout),
            "{err:?}"
        );
        assert!(took >= timeout && took < Duration::from_secs(3), "{took:?}");
        assert!(
            accepted.try_recv().is_ok(),
            "the call never reached the socket"
        );
        let text = metrics.encode();
        assert!(
            text.contains("swiftlet_cri_deadline_exceeded_total{method=\"Version\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("swiftlet_runtime_operations_errors_total{operation=\"Version\"} 1"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn pod_scope_is_visible_to_calls() {
        assert!(current_pod().is_none());
        let seen = with_pod("uid-1", async { current_pod() }).await;
        assert_eq!(seen.as_deref(), Some("uid-1"));
    }
}
