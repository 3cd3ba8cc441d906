//! The one client through which the agent talks to the container runtime. Every call is timed: a
//! tracing span, the `swiftlet_runtime_operations_duration_seconds{operation}` histogram and an
//! error counter, plus a pair of marker calls ([`swiftlet_cri_begin`]/[`swiftlet_cri_end`]) on which
//! the eBPF uprobes record the call on the kernel's clock. No other code holds a CRI client.
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

/// Uprobe target: a CRI call is about to be sent. `method` indexes
/// `swiftlet_ebpf_common::CRI_METHODS`; `uid_ptr`/`uid_len` name the pod UID (empty when the call
/// is not about one pod). Does nothing; `#[inline(never)]` and `no_mangle` keep the symbol for the
/// probe to find, `black_box` keeps the arguments in their registers at the call.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn swiftlet_cri_begin(method: u32, uid_ptr: *const u8, uid_len: usize) {
    std::hint::black_box((method, uid_ptr, uid_len));
}

/// Uprobe target: a CRI call returned; `ok` is 1 on success. See [`swiftlet_cri_begin`].
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn swiftlet_cri_end(method: u32, uid_ptr: *const u8, uid_len: usize, ok: u32) {
    std::hint::black_box((method, uid_ptr, uid_len, ok));
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

    /// Times one call and records its outcome. `method` is the CRI method name, `uid` the pod
    /// the call is about (empty when none).
    async fn timed<T, F>(&self, method: &'static str, uid: &str, fut: F) -> Result<T>
    where
        F: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        let span = tracing::debug_span!("cri", method);
        let index = swiftlet_ebpf_common::cri_method_index(method);
        swiftlet_cri_begin(index, uid.as_ptr(), uid.len());
        let start = Instant::now();
        let res = fut.instrument(span).await;
        swiftlet_cri_end(index, uid.as_ptr(), uid.len(), u32::from(res.is_ok()));
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
        self.timed("Version", "", c.version(cri::VersionRequest::default()))
            .await
    }

    pub async fn run_pod_sandbox(&self, config: cri::PodSandboxConfig) -> Result<String> {
        let mut c = self.runtime.clone();
        let uid = config
            .metadata
            .as_ref()
            .map(|m| m.uid.clone())
            .unwrap_or_default();
        let req = cri::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: String::new(),
        };
        Ok(self
            .timed("RunPodSandbox", &uid, c.run_pod_sandbox(req))
            .await?
            .pod_sandbox_id)
    }

    pub async fn stop_pod_sandbox(&self, id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = cri::StopPodSandboxRequest {
            pod_sandbox_id: id.to_owned(),
        };
        self.timed("StopPodSandbox", "", c.stop_pod_sandbox(req))
            .await
            .map(drop)
    }

    pub async fn remove_pod_sandbox(&self, id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = cri::RemovePodSandboxRequest {
            pod_sandbox_id: id.to_owned(),
        };
        self.timed("RemovePodSandbox", "", c.remove_pod_sandbox(req))
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
            .timed("PodSandboxStatus", "", c.pod_sandbox_status(req))
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
            .timed("ListPodSandbox", "", c.list_pod_sandbox(req))
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
        let uid = sandbox_config
            .metadata
            .as_ref()
            .map(|m| m.uid.clone())
            .unwrap_or_default();
        let req = cri::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.to_owned(),
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        };
        Ok(self
            .timed("CreateContainer", &uid, c.create_container(req))
            .await?
            .container_id)
    }

    /// Starts container `id` of the pod with UID `pod_uid` (the UID only labels the trace marker).
    pub async fn start_container(&self, id: &str, pod_uid: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = cri::StartContainerRequest {
            container_id: id.to_owned(),
        };
        self.timed("StartContainer", pod_uid, c.start_container(req))
            .await
            .map(drop)
    }

    pub async fn stop_container(&self, id: &str, timeout_secs: i64) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = cri::StopContainerRequest {
            container_id: id.to_owned(),
            timeout: timeout_secs,
        };
        self.timed("StopContainer", "", c.stop_container(req))
            .await
            .map(drop)
    }

    pub async fn remove_container(&self, id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = cri::RemoveContainerRequest {
            container_id: id.to_owned(),
        };
        self.timed("RemoveContainer", "", c.remove_container(req))
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
            .timed("ListContainers", "", c.list_containers(req))
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
            .timed("ContainerStatus", "", c.container_status(req))
            .await?
            .status)
    }

    pub async fn image_status(&self, image: &str) -> Result<Option<cri::Image>> {
        let mut c = self.image.clone();
        let req = cri::ImageStatusRequest {
            image: Some(image_spec(image)),
            verbose: false,
        };
        Ok(self
            .timed("ImageStatus", "", c.image_status(req))
            .await?
            .image)
    }

    pub async fn pull_image(&self, image: &str) -> Result<String> {
        let mut c = self.image.clone();
        let req = cri::PullImageRequest {
            image: Some(image_spec(image)),
            auth: None,
            sandbox_config: None,
        };
        Ok(self
            .timed("PullImage", "", c.pull_image(req))
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
}
