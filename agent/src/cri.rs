//! The one client through which the agent talks to the container runtime. Every call is timed: a
//! tracing span, the `swiftlet_runtime_operations_duration_seconds{operation}` histogram and an
//! error counter. No other code holds a CRI client.
//!
//! # Trace markers (for eBPF uprobes)
//!
//! Every call is bracketed by two exported no-op functions that uprobes attach to by symbol name
//! (they are `#[no_mangle] extern "C"`, `#[inline(never)]`, and their arguments pass through
//! `black_box`, so they survive optimisation with the C calling convention):
//!
//! * `swiftlet_cri_call_begin(method: u32, pod_uid: *const u8, pod_uid_len: usize)`
//! * `swiftlet_cri_call_end(method: u32, pod_uid: *const u8, pod_uid_len: usize, ok: u32)`
//!
//! `method` is the index of the method in [`METHODS`] (0 = `Version`, 1 = `RunPodSandbox`, ...;
//! append only, never renumber). `pod_uid` points at the UTF-8 UID of the pod the call is made for
//! (not NUL-terminated); the pointer is valid only during the call. The pod comes from
//! [`with_pod`], which the runtime manager wraps around each pod's sync and kill. Calls made for
//! no pod (the PLEG's relists and reads) call no marker: the pod timelines have no use for them,
//! and every uprobe hit costs the agent a trap and a single-step (~10 µs here, a tenth of the
//! agent's CPU during a burst of pod starts when relists fired them too). On x86-64 the
//! arguments are in rdi, rsi, rdx (and rcx); the same pid/tid sees begin then end, so a uprobe
//! pair times the call from the agent's side.
use crate::metrics::{Metrics, OperationLabel};
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
}

impl Error {
    /// True when the runtime said the object does not exist (already gone).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Call { status, .. } if status.code() == tonic::Code::NotFound)
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

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
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn swiftlet_cri_call_begin(method: u32, pod_uid: *const u8, pod_uid_len: usize) {
    std::hint::black_box((method, pod_uid, pod_uid_len));
}

/// Trace marker: a CRI call ended (`ok` = 1 on success, 0 on error). See the module documentation.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn swiftlet_cri_call_end(
    method: u32,
    pod_uid: *const u8,
    pod_uid_len: usize,
    ok: u32,
) {
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
    image: ImageServiceClient<Channel>,
    metrics: Metrics,
}

impl Cri {
    pub fn new(endpoint: &str, metrics: Metrics) -> Result<Self> {
        let ch = channel(endpoint)?;
        Ok(Self {
            runtime: RuntimeServiceClient::new(ch.clone()).max_decoding_message_size(64 << 20),
            image: ImageServiceClient::new(ch),
            metrics,
        })
    }

    /// The metrics the calls are counted in.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Times one call and records its outcome. `method` is the CRI method name.
    async fn timed<T, F>(&self, method: &'static str, fut: F) -> Result<T>
    where
        F: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        let span = tracing::debug_span!("cri", method);
        marker(method, None);
        let start = Instant::now();
        let res = fut.instrument(span).await;
        marker(method, Some(res.is_ok()));
        let label = OperationLabel { operation: method };
        self.metrics
            .runtime_operations_duration_seconds
            .get_or_create(&label)
            .observe(start.elapsed().as_secs_f64());
        match res {
            Ok(resp) => Ok(resp.into_inner()),
            Err(status) => {
                self.metrics
                    .runtime_operations_errors_total
                    .get_or_create(&label)
                    .inc();
                Err(Error::Call { method, status })
            }
        }
    }

    pub async fn version(&self) -> Result<cri::VersionResponse> {
        let mut c = self.runtime.clone();
        self.timed("Version", c.version(cri::VersionRequest::default()))
            .await
    }

    /// Runs a sandbox with the runtime handler `runtime_handler` (`""`: the runtime's default).
    pub async fn run_pod_sandbox(
        &self,
        config: cri::PodSandboxConfig,
        runtime_handler: String,
    ) -> Result<String> {
        let mut c = self.runtime.clone();
        let req = cri::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler,
        };
        Ok(self
            .timed("RunPodSandbox", c.run_pod_sandbox(req))
            .await?
            .pod_sandbox_id)
    }

    pub async fn stop_pod_sandbox(&self, id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = cri::StopPodSandboxRequest {
            pod_sandbox_id: id.to_owned(),
        };
        self.timed("StopPodSandbox", c.stop_pod_sandbox(req))
            .await
            .map(drop)
    }

    pub async fn remove_pod_sandbox(&self, id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = cri::RemovePodSandboxRequest {
            pod_sandbox_id: id.to_owned(),
        };
        self.timed("RemovePodSandbox", c.remove_pod_sandbox(req))
            .await
            .map(drop)
    }

    pub async fn pod_sandbox_status(&self, id: &str) -> Result<Option<cri::PodSandboxStatus>> {
        let mut c = self.runtime.clone();
        let req = cri::PodSandboxStatusRequest {
            pod_sandbox_id: id.to_owned(),
            verbose: false,
        };
        Ok(self
            .timed("PodSandboxStatus", c.pod_sandbox_status(req))
            .await?
            .status)
    }

    pub async fn list_pod_sandbox(
        &self,
        filter: Option<cri::PodSandboxFilter>,
    ) -> Result<Vec<cri::PodSandbox>> {
        let mut c = self.runtime.clone();
        let req = cri::ListPodSandboxRequest { filter };
        Ok(self
            .timed("ListPodSandbox", c.list_pod_sandbox(req))
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
        let req = cri::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.to_owned(),
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        };
        Ok(self
            .timed("CreateContainer", c.create_container(req))
            .await?
            .container_id)
    }

    pub async fn start_container(&self, id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = cri::StartContainerRequest {
            container_id: id.to_owned(),
        };
        self.timed("StartContainer", c.start_container(req))
            .await
            .map(drop)
    }

    pub async fn stop_container(&self, id: &str, timeout_secs: i64) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = cri::StopContainerRequest {
            container_id: id.to_owned(),
            timeout: timeout_secs,
        };
        self.timed("StopContainer", c.stop_container(req))
            .await
            .map(drop)
    }

    pub async fn update_container_resources(
        &self,
        id: &str,
        linux: cri::LinuxContainerResources,
    ) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = cri::UpdateContainerResourcesRequest {
            container_id: id.to_owned(),
            linux: Some(linux),
            ..Default::default()
        };
        self.timed(
            "UpdateContainerResources",
            c.update_container_resources(req),
        )
        .await
        .map(drop)
    }

    pub async fn remove_container(&self, id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = cri::RemoveContainerRequest {
            container_id: id.to_owned(),
        };
        self.timed("RemoveContainer", c.remove_container(req))
            .await
            .map(drop)
    }

    pub async fn list_containers(
        &self,
        filter: Option<cri::ContainerFilter>,
    ) -> Result<Vec<cri::Container>> {
        let mut c = self.runtime.clone();
        let req = cri::ListContainersRequest { filter };
        Ok(self
            .timed("ListContainers", c.list_containers(req))
            .await?
            .containers)
    }

    pub async fn container_status(&self, id: &str) -> Result<Option<cri::ContainerStatus>> {
        let mut c = self.runtime.clone();
        let req = cri::ContainerStatusRequest {
            container_id: id.to_owned(),
            verbose: false,
        };
        Ok(self
            .timed("ContainerStatus", c.container_status(req))
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
        let req = cri::ExecSyncRequest {
            container_id: id.to_owned(),
            cmd,
            timeout: timeout_secs,
        };
        self.timed("ExecSync", c.exec_sync(req)).await
    }

    pub async fn image_status(&self, image: &str) -> Result<Option<cri::Image>> {
        let mut c = self.image.clone();
        let req = cri::ImageStatusRequest {
            image: Some(image_spec(image)),
            verbose: false,
        };
        Ok(self.timed("ImageStatus", c.image_status(req)).await?.image)
    }

    /// Pulls `image`, anonymously or with `auth` (never logged: the request is not traced).
    pub async fn pull_image(&self, image: &str, auth: Option<cri::AuthConfig>) -> Result<String> {
        let mut c = self.image.clone();
        let req = cri::PullImageRequest {
            image: Some(image_spec(image)),
            auth,
            sandbox_config: None,
        };
        Ok(self.timed("PullImage", c.pull_image(req)).await?.image_ref)
    }
}

pub fn image_spec(image: &str) -> cri::ImageSpec {
    cri::ImageSpec {
        image: image.to_owned(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
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

    #[tokio::test]
    async fn pod_scope_is_visible_to_calls() {
        assert!(current_pod().is_none());
        let seen = with_pod("uid-1", async { current_pod() }).await;
        assert_eq!(seen.as_deref(), Some("uid-1"));
    }
}
