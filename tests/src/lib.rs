//! Shared fixture for the integration tests: a private containerd and images ([`Runtime`]), a
//! swiftlet process per test ([`Agent`]), and CRI helpers to look at what the agent did.
//!
//! Prerequisites (root, the containerd binary) are checked once per process: when one is missing
//! the tests skip loudly (`SKIPPED: <why>` on stderr), or fail naming it when
//! `SWIFTLET_REQUIRE_RUNTIME=1` (CI sets it through `cargo xtask test`).

pub mod api_server;
pub mod attacks;
pub mod certs;
pub mod chaos;
pub mod cri_proxy;
pub mod kubelet_client;
pub mod otlp;
pub mod registry;
pub mod rng;

use std::collections::{BTreeSet, HashMap};
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use tonic::transport::Channel;

pub use xtask::{BUSYBOX_IMAGE, DEFAULT_ENDPOINT, NODE_NAME_LABEL, PAUSE_IMAGE};

/// The CRI label of a sandbox's/container's pod name.
pub const POD_NAME_LABEL: &str = "io.kubernetes.pod.name";
/// The CRI label of a sandbox's/container's pod namespace.
pub const POD_NAMESPACE_LABEL: &str = "io.kubernetes.pod.namespace";
/// The CRI label of a sandbox's/container's pod UID.
pub const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";
/// The CRI label of a container's name.
pub const CONTAINER_NAME_LABEL: &str = "io.kubernetes.container.name";

/// Errors of the CRI helpers, with the method or endpoint concerned.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Channel(#[from] swiftlet::cri::Error),
    #[error("CRI {method}: {status}")]
    Call {
        method: &'static str,
        status: tonic::Status,
    },
    #[error("starting a tokio runtime for CRI calls: {0}")]
    Tokio(std::io::Error),
}

/// `Result` of this crate's helpers.
pub type Result<T, E = Error> = std::result::Result<T, E>;

// ---------------------------------------------------------------------------------------------
// Runtime

/// The private containerd shared by every test of this process.
#[derive(Debug)]
pub struct Runtime {
    /// Its CRI endpoint (`unix://...`).
    pub endpoint: String,
    /// Where it keeps its files.
    pub layout: xtask::runtime::Layout,
}

/// Whether a missing prerequisite must fail the tests instead of skipping them.
pub fn runtime_required() -> bool {
    std::env::var(xtask::testrun::REQUIRE_RUNTIME_ENV)
        .is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}

pub(crate) fn on_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(name).is_file()))
}

/// Why the runtime cannot run here, if it cannot.
fn missing_prerequisite() -> Option<String> {
    if !xtask::is_root() {
        return Some("not running as root (the runtime tests need root)".to_owned());
    }
    for bin in ["containerd", "ctr", "runc"] {
        if !on_path(bin) {
            return Some(format!(
                "no `{bin}` binary on PATH (run `cargo xtask setup`)"
            ));
        }
    }
    if !Path::new(xtask::images::BUSYBOX_PATH).is_file() {
        return Some(format!(
            "no static busybox at {} (apt-get install busybox-static)",
            xtask::images::BUSYBOX_PATH
        ));
    }
    None
}

/// The one `T` of this process in `cell`, made by `start` on first use; `None` (after printing
/// `SKIPPED: <why>`) when `missing` names a missing prerequisite and the runtime is not required.
///
/// # Panics
/// When a prerequisite is missing and `SWIFTLET_REQUIRE_RUNTIME=1` (naming `what`).
pub(crate) fn shared_or_skip<T>(
    cell: &'static OnceLock<Option<T>>,
    what: &str,
    missing: fn() -> Option<String>,
    start: impl FnOnce() -> T,
) -> Option<&'static T> {
    let value = cell.get_or_init(|| {
        if let Some(why) = missing() {
            if runtime_required() {
                panic!("SWIFTLET_REQUIRE_RUNTIME=1 but {what} cannot run: {why}");
            }
            return None;
        }
        Some(start())
    });
    if value.is_none() {
        let why = missing().unwrap_or_else(|| format!("{what} unavailable"));
        eprintln!("SKIPPED: {why}");
    }
    value.as_ref()
}

impl Runtime {
    /// The runtime, started (idempotently) with its images once per process; `None` (after
    /// printing `SKIPPED: <why>`) when a prerequisite is missing and the runtime is not required.
    ///
    /// # Panics
    /// When a prerequisite is missing and `SWIFTLET_REQUIRE_RUNTIME=1`, or when starting the
    /// runtime or importing the images fails.
    pub fn shared() -> Option<&'static Runtime> {
        static RUNTIME: OnceLock<Option<Runtime>> = OnceLock::new();
        shared_or_skip(&RUNTIME, "the runtime", missing_prerequisite, || {
            let layout = xtask::runtime::Layout::default();
            if let Err(e) = xtask::runtime::up(&layout) {
                panic!("starting the private containerd: {e}");
            }
            {
                let _lock = layout
                    .lock()
                    .unwrap_or_else(|e| panic!("locking the runtime: {e}"));
                if let Err(e) = xtask::images::ensure(&layout) {
                    panic!("importing the test images: {e}");
                }
            }
            Runtime {
                endpoint: layout.endpoint(),
                layout,
            }
        })
    }

    /// A containerd of its own for one scenario (a test that kills or restarts the runtime
    /// must not touch the shared one): every file under `dir`, bridge `bridge`, pod subnet
    /// `pod_subnet` (see [`xtask::runtime::Layout::under`]), started with the test images.
    /// Dropping the returned guard stops it and kills its shims and containers.
    ///
    /// # Errors
    /// When it cannot start or the images cannot be imported (the message names which).
    pub fn private(
        dir: &Path,
        bridge: &str,
        pod_subnet: &str,
    ) -> std::result::Result<PrivateRuntime, String> {
        Self::private_layout(xtask::runtime::Layout::under(dir, bridge, pod_subnet))
    }

    /// [`Self::private`] with a layout of the caller's (one made by
    /// [`xtask::runtime::Layout::under`], changed).
    ///
    /// # Errors
    /// As [`Self::private`].
    pub fn private_layout(
        layout: xtask::runtime::Layout,
    ) -> std::result::Result<PrivateRuntime, String> {
        let dir = layout.root.parent().unwrap_or(&layout.root).to_owned();
        xtask::runtime::up(&layout)
            .map_err(|e| format!("starting the containerd under {}: {e}", dir.display()))?;
        let guard = PrivateRuntime(Runtime {
            endpoint: layout.endpoint(),
            layout,
        });
        {
            let _lock = guard.0.layout.lock().map_err(|e| e.to_string())?;
            xtask::images::ensure(&guard.0.layout)
                .map_err(|e| format!("importing the test images under {}: {e}", dir.display()))?;
        }
        Ok(guard)
    }

    /// A CRI runtime-service client to this runtime (connects lazily).
    pub fn client(&self) -> Result<RuntimeServiceClient<Channel>> {
        runtime_client(&self.endpoint)
    }
}

/// A containerd started by [`Runtime::private`]; stopped (with its shims and containers, and
/// its mounts) when dropped, even when the test fails.
#[derive(Debug)]
pub struct PrivateRuntime(Runtime);

impl std::ops::Deref for PrivateRuntime {
    type Target = Runtime;

    fn deref(&self) -> &Runtime {
        &self.0
    }
}

impl PrivateRuntime {
    /// SIGKILLs its containerd (shims and containers keep running); the pid killed.
    ///
    /// # Errors
    /// When it would not die.
    pub fn kill(&self) -> std::result::Result<Option<i32>, String> {
        xtask::runtime::kill(&self.0.layout).map_err(|e| e.to_string())
    }

    /// Starts its containerd again (idempotent: a running one is left alone).
    ///
    /// # Errors
    /// When it does not start (the message holds the end of its log).
    pub fn up(&self) -> std::result::Result<(), String> {
        xtask::runtime::up(&self.0.layout)
            .map(drop)
            .map_err(|e| e.to_string())
    }
}

impl Drop for PrivateRuntime {
    fn drop(&mut self) {
        if let Err(e) = xtask::runtime::down(&self.0.layout) {
            eprintln!(
                "stopping the containerd of {}: {e}",
                self.0.layout.socket.display()
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// CRI helpers

/// A tonic channel to a CRI endpoint (the agent's own connector; lazy, reconnecting).
///
/// Must be called inside a tokio runtime (the channel spawns its connection task).
pub fn cri_channel(endpoint: &str) -> Result<Channel> {
    Ok(swiftlet::cri::channel(endpoint)?)
}

/// A CRI runtime-service client.
pub fn runtime_client(endpoint: &str) -> Result<RuntimeServiceClient<Channel>> {
    Ok(RuntimeServiceClient::new(cri_channel(endpoint)?))
}

fn selector(labels: &[(&str, &str)]) -> HashMap<String, String> {
    labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Sandboxes carrying every one of `labels`.
pub async fn sandboxes_with_labels(
    client: &mut RuntimeServiceClient<Channel>,
    labels: &[(&str, &str)],
) -> Result<Vec<cri::PodSandbox>> {
    let req = cri::ListPodSandboxRequest {
        filter: Some(cri::PodSandboxFilter {
            label_selector: selector(labels),
            ..Default::default()
        }),
    };
    client
        .list_pod_sandbox(req)
        .await
        .map(|r| r.into_inner().items)
        .map_err(|status| Error::Call {
            method: "ListPodSandbox",
            status,
        })
}

/// Containers carrying every one of `labels`.
pub async fn containers_with_labels(
    client: &mut RuntimeServiceClient<Channel>,
    labels: &[(&str, &str)],
) -> Result<Vec<cri::Container>> {
    let req = cri::ListContainersRequest {
        filter: Some(cri::ContainerFilter {
            label_selector: selector(labels),
            ..Default::default()
        }),
    };
    client
        .list_containers(req)
        .await
        .map(|r| r.into_inner().containers)
        .map_err(|status| Error::Call {
            method: "ListContainers",
            status,
        })
}

/// Whether the runtime holds `image` (CRI `ImageStatus`; blocking).
pub fn image_present(endpoint: &str, image: &str) -> Result<bool> {
    let (endpoint, image) = (endpoint.to_owned(), image.to_owned());
    block_on(async move {
        let mut client = ImageServiceClient::new(cri_channel(&endpoint)?);
        let req = cri::ImageStatusRequest {
            image: Some(swiftlet::cri::image_spec(&image)),
            verbose: false,
        };
        let status = client
            .image_status(req)
            .await
            .map_err(|status| Error::Call {
                method: "ImageStatus",
                status,
            })?;
        Ok(status.into_inner().image.is_some())
    })?
}

/// Removes `image` from the runtime (CRI `RemoveImage`; a missing image is no error), so that
/// the next start pulls it; blocking.
pub fn remove_image(endpoint: &str, image: &str) -> Result<()> {
    let (endpoint, image) = (endpoint.to_owned(), image.to_owned());
    block_on(async move {
        let mut client = ImageServiceClient::new(cri_channel(&endpoint)?);
        let req = cri::RemoveImageRequest {
            image: Some(swiftlet::cri::image_spec(&image)),
        };
        client
            .remove_image(req)
            .await
            .map(drop)
            .map_err(|status| Error::Call {
                method: "RemoveImage",
                status,
            })
    })?
}

/// Stops and removes every sandbox labelled `swiftlet.io/node-name=<node>` (and so its
/// containers); returns how many were removed.
pub async fn remove_node_sandboxes(endpoint: &str, node: &str) -> Result<usize> {
    let mut client = runtime_client(endpoint)?;
    let sandboxes = sandboxes_with_labels(&mut client, &[(NODE_NAME_LABEL, node)]).await?;
    for sb in &sandboxes {
        client
            .stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: sb.id.clone(),
            })
            .await
            .map_err(|status| Error::Call {
                method: "StopPodSandbox",
                status,
            })?;
        client
            .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                pod_sandbox_id: sb.id.clone(),
            })
            .await
            .map_err(|status| Error::Call {
                method: "RemovePodSandbox",
                status,
            })?;
    }
    Ok(sandboxes.len())
}

/// Whether pod `uid` has a running container in the runtime (blocking; false when the runtime
/// cannot be read).
pub fn has_running_container(endpoint: &str, uid: &str) -> bool {
    pod_cri_objects(endpoint, uid).is_ok_and(|(_, cs)| {
        cs.iter()
            .any(|c| c.state == cri::ContainerState::ContainerRunning as i32)
    })
}

/// The sandboxes and containers labelled `io.kubernetes.pod.uid=<uid>` (blocking).
pub fn pod_cri_objects(
    endpoint: &str,
    uid: &str,
) -> Result<(Vec<cri::PodSandbox>, Vec<cri::Container>)> {
    cri_objects_labelled(endpoint, POD_UID_LABEL, uid)
}

/// The sandboxes and containers labelled `key=value` (blocking).
pub fn cri_objects_labelled(
    endpoint: &str,
    key: &str,
    value: &str,
) -> Result<(Vec<cri::PodSandbox>, Vec<cri::Container>)> {
    let endpoint = endpoint.to_owned();
    let (key, value) = (key.to_owned(), value.to_owned());
    block_on(async move {
        let mut client = runtime_client(&endpoint)?;
        let sandboxes = sandboxes_with_labels(&mut client, &[(&key, &value)]).await?;
        let containers = containers_with_labels(&mut client, &[(&key, &value)]).await?;
        Ok((sandboxes, containers))
    })?
}

/// Wall-clock now in Unix nanoseconds (the clock of CRI's timestamps).
pub fn unix_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// CRI's finishedAt of the newest container `name` of pod `uid` once containerd has recorded
/// its exit (polled every 5 ms); `None` after `timeout`.
pub fn wait_finished_at(endpoint: &str, uid: &str, name: &str, timeout: Duration) -> Option<i64> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        let statuses = container_statuses(endpoint, uid).ok()?;
        let finished = statuses
            .iter()
            .rfind(|s| s.metadata.as_ref().is_some_and(|m| m.name == name))
            .map_or(0, |s| s.finished_at);
        if finished > 0 {
            return Some(finished);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

/// Full CRI statuses of every container of pod `uid`, oldest first (blocking).
pub fn container_statuses(endpoint: &str, uid: &str) -> Result<Vec<cri::ContainerStatus>> {
    let (endpoint, uid) = (endpoint.to_owned(), uid.to_owned());
    block_on(async move {
        let mut client = runtime_client(&endpoint)?;
        let listed = containers_with_labels(&mut client, &[(POD_UID_LABEL, &uid)]).await?;
        let mut out = Vec::new();
        for c in listed {
            let req = cri::ContainerStatusRequest {
                container_id: c.id,
                verbose: false,
            };
            // A container removed since the list is skipped.
            if let Ok(r) = client.container_status(req).await
                && let Some(s) = r.into_inner().status
            {
                out.push(s);
            }
        }
        out.sort_by_key(|s| s.created_at);
        Ok(out)
    })?
}

/// The host pid of the running container `name` of pod `uid` (from containerd's verbose
/// `ContainerStatus`), if there is one.
pub fn container_pid(endpoint: &str, uid: &str, name: &str) -> Option<u32> {
    let (endpoint, uid, name) = (endpoint.to_owned(), uid.to_owned(), name.to_owned());
    block_on(async move {
        let mut client = runtime_client(&endpoint).ok()?;
        let labels = [(POD_UID_LABEL, uid.as_str()), (CONTAINER_NAME_LABEL, &name)];
        let listed = containers_with_labels(&mut client, &labels).await.ok()?;
        for c in listed {
            if c.state != cri::ContainerState::ContainerRunning as i32 {
                continue;
            }
            let req = cri::ContainerStatusRequest {
                container_id: c.id,
                verbose: true,
            };
            let info = client.container_status(req).await.ok()?.into_inner().info;
            let pid = info
                .get("info")
                .and_then(|i| serde_json::from_str::<serde_json::Value>(i).ok())
                .and_then(|v| v["pid"].as_u64())
                .and_then(|p| u32::try_from(p).ok())
                .filter(|&p| p > 0);
            if pid.is_some() {
                return pid;
            }
        }
        None
    })
    .ok()
    .flatten()
}

/// Runs `cmd` in container `id` through CRI `ExecSync` (at most 10 s): its exit code and its
/// stdout and stderr together.
pub fn exec(endpoint: &str, id: &str, cmd: &[&str]) -> Result<(i32, String)> {
    let (endpoint, id) = (
        endpoint.to_owned(),
        id.trim_start_matches("containerd://").to_owned(),
    );
    let cmd = cmd.iter().map(|s| (*s).to_owned()).collect();
    block_on(async move {
        let mut client = runtime_client(&endpoint)?;
        let req = cri::ExecSyncRequest {
            container_id: id,
            cmd,
            timeout: 10,
        };
        let r = client
            .exec_sync(req)
            .await
            .map_err(|status| Error::Call {
                method: "ExecSync",
                status,
            })?
            .into_inner();
        let mut out = r.stdout;
        out.extend_from_slice(&r.stderr);
        Ok((r.exit_code, String::from_utf8_lossy(&out).into_owned()))
    })?
}

/// The host pid of sandbox `id`'s pause process (from containerd's verbose `PodSandboxStatus`).
pub fn sandbox_pid(endpoint: &str, id: &str) -> Option<u32> {
    let (endpoint, id) = (endpoint.to_owned(), id.to_owned());
    block_on(async move {
        let mut client = runtime_client(&endpoint).ok()?;
        let req = cri::PodSandboxStatusRequest {
            pod_sandbox_id: id,
            verbose: true,
        };
        let info = client.pod_sandbox_status(req).await.ok()?.into_inner().info;
        info.get("info")
            .and_then(|i| serde_json::from_str::<serde_json::Value>(i).ok())
            .and_then(|v| v["pid"].as_u64())
            .and_then(|p| u32::try_from(p).ok())
            .filter(|&p| p > 0)
    })
    .ok()
    .flatten()
}

/// Runs `fut` to completion on a fresh current-thread runtime in a thread of its own (so it
/// also works from inside another runtime, e.g. in a `Drop`).
pub fn block_on<F, T>(fut: F) -> Result<T>
where
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let handle = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(Error::Tokio)?;
        Ok(rt.block_on(fut))
    });
    handle
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
}

// ---------------------------------------------------------------------------------------------
// Agent

/// The `/pods` answer: a `PodList` (only `items` is read; other fields are ignored).
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct PodList {
    /// The pods.
    #[serde(default)]
    pub items: Vec<Pod>,
}

impl PodList {
    /// The pod named `name`, if listed.
    pub fn get(&self, name: &str) -> Option<&Pod> {
        self.items
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(name))
    }

    /// The phase of pod `name` (`Running`, `Pending` ...), if listed with a status.
    pub fn phase(&self, name: &str) -> Option<&str> {
        self.get(name)?.status.as_ref()?.phase.as_deref()
    }

    /// Whether pod `name` is listed and Running.
    pub fn is_running(&self, name: &str) -> bool {
        self.phase(name) == Some("Running")
    }

    /// The status of app container `container` of pod `pod`.
    pub fn container(&self, pod: &str, container: &str) -> Option<&ContainerStatus> {
        self.get(pod)?
            .status
            .as_ref()?
            .container_statuses
            .as_ref()?
            .iter()
            .find(|c| c.name == container)
    }

    /// The UID of pod `name`.
    pub fn uid(&self, name: &str) -> Option<&str> {
        self.get(name)?.metadata.uid.as_deref()
    }

    /// `name phase` per pod, for failure messages.
    pub fn summary(&self) -> String {
        let rows: Vec<String> = self
            .items
            .iter()
            .map(|p| {
                format!(
                    "{} {}",
                    p.metadata.name.as_deref().unwrap_or("?"),
                    p.status
                        .as_ref()
                        .and_then(|s| s.phase.as_deref())
                        .unwrap_or("-")
                )
            })
            .collect();
        format!("[{}]", rows.join(", "))
    }
}

/// How to start an [`Agent`].
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// A short name for the test (part of the node name and the log file name).
    pub name: String,
    /// `--file-check-frequency`.
    pub file_check_frequency: String,
    /// More flags.
    pub extra_args: Vec<String>,
    /// The agent binary; `None`: the debug build from [`agent_binary`].
    pub binary: Option<PathBuf>,
    /// `-v`; 4 (debug logs) unless a bench wants the agent quiet.
    pub verbosity: u8,
    /// The CRI endpoint the agent talks to, when not the runtime's own (a [`cri_proxy::CriProxy`]
    /// in front of it); the fixture's checks and clean-up still use the runtime's.
    pub cri_endpoint: Option<String>,
    /// `Some(kib)`: the root dir and the pod log dir (`<root>/pod-logs`) are each a tmpfs of
    /// `kib` KiB and [`TMPFS_INODES`] inodes (a small disk that can be filled), unmounted when
    /// the agent is dropped.
    pub tmpfs_kib: Option<u64>,
    /// `--port` of the kubelet API (on 127.0.0.1 with `--address`); `None`: off.
    pub kubelet_port: Option<u16>,
}

/// `--eviction-hard` of every test agent whose test does not pass its own: the kubelet's memory
/// threshold, and disk thresholds of 1%. The tests' root dirs live on the disk that also holds
/// the build's target dirs (tens of GB while CI runs), where the kubelet's `nodefs.available<10%`
/// can be crossed by the build rather than by anything a test does; a node under DiskPressure
/// then reports it and evicts pods, which tests of other things must not depend on. The eviction
/// tests pass their own thresholds.
pub const TEST_EVICTION_HARD: &str =
    "memory.available<100Mi,nodefs.available<1%,nodefs.inodesFree<1%,imagefs.available<1%";

/// The inodes of each tmpfs of [`AgentOptions::tmpfs_kib`].
pub const TMPFS_INODES: u64 = 512;

/// Mounts made for one agent, unmounted (lazily, deepest first) when dropped, also when a test
/// fails.
#[derive(Debug, Default)]
struct Mounts(Vec<PathBuf>);

impl Mounts {
    /// Mounts a tmpfs of `kib` KiB and [`TMPFS_INODES`] inodes on `dir`.
    fn tmpfs(&mut self, dir: &Path, kib: u64) -> std::io::Result<()> {
        let c = |s: &[u8]| {
            std::ffi::CString::new(s)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
        };
        let target = c(dir.as_os_str().as_encoded_bytes())?;
        let fstype = c(b"tmpfs")?;
        let options = c(format!("size={kib}k,nr_inodes={TMPFS_INODES},mode=0755").as_bytes())?;
        // SAFETY: every pointer is a valid NUL-terminated string for the duration of the call.
        let rc = unsafe {
            libc::mount(
                fstype.as_ptr(),
                target.as_ptr(),
                fstype.as_ptr(),
                0,
                options.as_ptr().cast(),
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        self.0.push(dir.to_owned());
        Ok(())
    }
}

impl Drop for Mounts {
    fn drop(&mut self) {
        for dir in self.0.drain(..).rev() {
            let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
                continue;
            };
            // SAFETY: c is a valid NUL-terminated path for the duration of the call.
            if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
                eprintln!(
                    "unmounting {}: {}",
                    dir.display(),
                    std::io::Error::last_os_error()
                );
            }
        }
    }
}

impl AgentOptions {
    /// Options for the test called `name`.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            file_check_frequency: "1s".to_owned(),
            extra_args: Vec::new(),
            binary: None,
            verbosity: 4,
            cri_endpoint: None,
            tmpfs_kib: None,
            kubelet_port: None,
        }
    }
}

/// The program `name` on `PATH`, or None (said on stderr) when it is not installed: a check
/// that needs it is then skipped, unless `SWIFTLET_REQUIRE_RUNTIME=1`, where a missing program
/// fails the test (`install` says how to get it).
pub fn find_tool(name: &str, install: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    let found = std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file());
    if found.is_none() {
        assert!(!runtime_required(), "{name} is not installed ({install})");
        eprintln!("SKIPPED: {name} is not installed");
    }
    found
}

/// Runs `kubectl --kubeconfig <kubeconfig> --request-timeout 10s <args>` (blocking).
///
/// # Panics
/// When kubectl cannot be started.
pub fn kubectl_output(kubectl: &Path, kubeconfig: &Path, args: &[String]) -> std::process::Output {
    std::process::Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--request-timeout", "10s"])
        .args(args)
        .output()
        .expect("kubectl runs")
}

/// The release build of the swiftlet binary, for benches (built on every call; cargo makes that
/// quick when it is fresh). `SWIFTLET_BENCH_AGENT` names a prebuilt agent to use instead (to
/// compare two builds in one session of a noisy machine, each measured in turn).
///
/// # Panics
/// When the build fails.
pub fn release_agent_binary() -> PathBuf {
    if let Some(prebuilt) = std::env::var_os("SWIFTLET_BENCH_AGENT") {
        return PathBuf::from(prebuilt);
    }
    xtask::agent::build_agent(true).unwrap_or_else(|e| panic!("{e}"))
}

/// The swiftlet binary, built once per process.
pub fn agent_binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| xtask::agent::build_agent(false).unwrap_or_else(|e| panic!("{e}")))
}

/// The `swiftlet-trace` client binary, built once per process.
pub fn trace_binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        xtask::agent::build("swiftlet-trace", false).unwrap_or_else(|e| panic!("{e}"))
    })
}

fn free_port() -> u16 {
    xtask::free_loopback_port().unwrap_or_else(|e| panic!("picking a free loopback port: {e}"))
}

fn unique_node_name(test: &str) -> String {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let mut base: String = test
        .to_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    base.truncate(20);
    let base = base.trim_matches('-');
    format!("{base}-{}-{n}", std::process::id())
}

/// A swiftlet process of one test, with its own manifest dir, node name, ports and cgroup root.
/// It is started the way xtask starts agents ([`xtask::agent::Spec`]).
///
/// Dropping it stops the agent (SIGTERM, then SIGKILL), removes every CRI sandbox labelled with
/// its node name and removes its cgroup root, so nothing leaks between tests.
pub struct Agent {
    process: Option<xtask::agent::RunningAgent>,
    spec: xtask::agent::Spec,
    /// Keeps its connection to the read-only server between requests.
    http: xtask::http::Client,
    manifest_dir: tempfile::TempDir,
    /// Dropped before `root_dir`: the tmpfs mounts on it go first.
    _mounts: Mounts,
    root_dir: tempfile::TempDir,
    /// The runtime's own endpoint (the agent's may be a proxy in front of it).
    runtime_endpoint: String,
    /// The runtime's state directory (where its sandboxes' shm mounts are).
    runtime_state: PathBuf,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("node", &self.spec.node)
            .field("read_only", &self.spec.read_only_addr())
            .field("log", &self.spec.log)
            .finish_non_exhaustive()
    }
}

/// How long [`Agent::start`] waits for `/healthz`. An agent answers within a second or two on
/// the host, but in the cgroup v2 VM (QEMU's TCG, software emulation) the first agents wait for
/// the guest's containerd, and every agent's eBPF programs go through the verifier emulated:
/// with several tests starting agents at once, starts of 30 s and more were seen there (CI of
/// `d5d7f94`, 2026-12-07). The bound only matters when a start fails.
pub const HEALTHZ_TIMEOUT: Duration = Duration::from_secs(120);

/// How long the tests that run in the VMs (cgroups, systemd_driver, deploy) wait for pods to
/// run or go: under QEMU's software emulation four pods written together took 57 s to run (CI
/// of `23db6b4`, 2026-12-07), where the host takes a few seconds. The bound only costs time when
/// a test fails.
pub const VM_POD_TIMEOUT: Duration = Duration::from_secs(180);

/// How long one request to the agent's read-only port may take: in the emulated VM with the host
/// busy, a `GET /pods` ran past 10 s (a CI run of `b335120`, 2026-12-07, with other tests on the
/// host). The bound only costs time when the agent does not answer.
pub const GET_TIMEOUT: Duration = Duration::from_secs(30);

impl Agent {
    /// Builds (once) and starts swiftlet against `runtime`, and waits for `GET /healthz` == `ok`.
    ///
    /// # Panics
    /// When the build fails, the agent exits, or it does not become healthy in time (the log
    /// path and its tail are in the message).
    pub fn start(runtime: &Runtime, opts: AgentOptions) -> Agent {
        let node = unique_node_name(&opts.name);
        let manifest_dir = tempfile::Builder::new()
            .prefix("swiftlet-manifests-")
            .tempdir()
            .unwrap_or_else(|e| panic!("creating a manifest dir: {e}"));
        let root_dir = tempfile::Builder::new()
            .prefix("swiftlet-root-")
            .tempdir()
            .unwrap_or_else(|e| panic!("creating a root dir: {e}"));
        let mut mounts = Mounts::default();
        if let Some(kib) = opts.tmpfs_kib {
            let logs = root_dir.path().join("pod-logs");
            mounts
                .tmpfs(root_dir.path(), kib)
                .and_then(|()| std::fs::create_dir(&logs))
                .and_then(|()| mounts.tmpfs(&logs, kib))
                .unwrap_or_else(|e| panic!("mounting the tmpfs for the agent's dirs: {e}"));
        }
        let log_dir = xtask::target_dir().join("swiftlet-test-logs");
        std::fs::create_dir_all(&log_dir)
            .unwrap_or_else(|e| panic!("creating {}: {e}", log_dir.display()));
        let mut extra_args = vec!["-v".to_owned(), opts.verbosity.to_string()];
        if !opts
            .extra_args
            .iter()
            .any(|a| a.starts_with("--eviction-hard"))
        {
            extra_args.extend(["--eviction-hard".to_owned(), TEST_EVICTION_HARD.to_owned()]);
        }
        extra_args.extend(opts.extra_args);
        let spec = xtask::agent::Spec {
            binary: opts.binary.unwrap_or_else(|| agent_binary().to_path_buf()),
            manifest_dir: manifest_dir.path().to_owned(),
            endpoint: opts
                .cri_endpoint
                .unwrap_or_else(|| runtime.endpoint.clone()),
            root_dir: root_dir.path().to_owned(),
            pod_logs_dir: Some(root_dir.path().join("pod-logs")),
            cgroup_root: format!("/swiftlet-test-{node}"),
            log: log_dir.join(format!("{node}.log")),
            node,
            healthz_port: free_port(),
            read_only_port: free_port(),
            kubelet_port: opts.kubelet_port.unwrap_or(0),
            file_check_frequency: opts.file_check_frequency,
            extra_args,
            own_process_group: false,
            die_with_parent: true,
        };
        let http = xtask::http::Client::new(spec.read_only_addr(), GET_TIMEOUT);
        let mut agent = Agent {
            process: None,
            spec,
            http,
            manifest_dir,
            _mounts: mounts,
            root_dir,
            runtime_endpoint: runtime.endpoint.clone(),
            runtime_state: runtime.layout.state.clone(),
        };
        agent.launch(false);
        agent
    }

    /// Starts the process and waits for `/healthz`; panics with the log's tail when it fails.
    fn launch(&mut self, append: bool) {
        match self.spec.start(append, HEALTHZ_TIMEOUT) {
            Ok(process) => self.process = Some(process),
            Err(e) => panic!("starting swiftlet ({}): {e}", self.spec.node),
        }
    }

    /// Kills the agent with SIGKILL (no clean-up of its own); [`Agent::restart_after_sigkill`]
    /// starts it again.
    pub fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
    }

    /// Kills the agent with SIGKILL (no clean-up of its own) if it runs, and starts it again
    /// with the same node name, directories and ports, appending to the same log; waits for
    /// `/healthz`.
    pub fn restart_after_sigkill(&mut self) {
        self.kill();
        // Connections kept to the killed process are of no use to the new one.
        self.http = xtask::http::Client::new(self.spec.read_only_addr(), GET_TIMEOUT);
        self.launch(true);
    }

    /// Stops the agent with SIGTERM (its pods keep running) and starts it again with `flag`
    /// set to `value` (replacing the value it had, or added), with the same node name,
    /// directories and ports, appending to the same log; waits for `/healthz`.
    pub fn restart_with_flag(&mut self, flag: &str, value: &str) {
        self.stop(Duration::from_secs(30));
        let args = &mut self.spec.extra_args;
        match args.iter().position(|a| a == flag) {
            Some(i) if i + 1 < args.len() => args[i + 1] = value.to_owned(),
            _ => args.extend([flag.to_owned(), value.to_owned()]),
        }
        self.http = xtask::http::Client::new(self.spec.read_only_addr(), GET_TIMEOUT);
        self.launch(true);
    }

    /// Whether its `/healthz` answers `ok` now.
    pub fn healthy(&self) -> bool {
        xtask::agent::healthy(self.spec.healthz_addr())
    }

    /// The agent's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(|p| p.child.id())
    }

    /// The node name (`--hostname-override`).
    pub fn node_name(&self) -> &str {
        &self.spec.node
    }

    /// The static pod name of a manifest whose `metadata.name` is `name`.
    pub fn static_pod_name(&self, name: &str) -> String {
        format!("{name}-{}", self.spec.node)
    }

    /// [`busybox_pod_manifest`] for pod `name` with the UID `<name>-<node>` in namespace
    /// `default`.
    pub fn busybox_pod(
        &self,
        name: &str,
        spec_extra: &str,
        script: &str,
        container_extra: &str,
    ) -> String {
        let metadata = format!(
            "name: {name}, namespace: default, uid: {name}-{}",
            self.spec.node
        );
        busybox_pod_manifest(&metadata, spec_extra, script, container_extra)
    }

    /// The agent's `--root-dir`.
    pub fn root_dir(&self) -> &Path {
        self.root_dir.path()
    }

    /// The cgroup root (`--cgroup-root`).
    pub fn cgroup_root(&self) -> &str {
        &self.spec.cgroup_root
    }

    /// The read-only server's address (`/pods`, `/metrics`, `/debug/...`).
    pub fn read_only_addr(&self) -> SocketAddr {
        self.spec.read_only_addr()
    }

    /// The state directory of the runtime the agent talks to.
    pub fn runtime_state_dir(&self) -> &Path {
        &self.runtime_state
    }

    /// The runtime's CRI endpoint (the agent talks to it directly, or through
    /// [`AgentOptions::cri_endpoint`]).
    pub fn endpoint(&self) -> &str {
        &self.runtime_endpoint
    }

    /// The manifest directory (`--pod-manifest-path`).
    pub fn manifest_dir(&self) -> &Path {
        self.manifest_dir.path()
    }

    /// The agent's log file.
    pub fn log_path(&self) -> &Path {
        &self.spec.log
    }

    /// Writes manifest `name` atomically (a hidden temp file renamed into place).
    pub fn write_manifest(&self, name: &str, contents: &str) {
        let tmp = self.manifest_dir.path().join(format!(".{name}.tmp"));
        let dst = self.manifest_dir.path().join(name);
        let mut f = std::fs::File::create(&tmp)
            .unwrap_or_else(|e| panic!("creating {}: {e}", tmp.display()));
        f.write_all(contents.as_bytes())
            .and_then(|()| f.sync_all())
            .unwrap_or_else(|e| panic!("writing {}: {e}", tmp.display()));
        std::fs::rename(&tmp, &dst)
            .unwrap_or_else(|e| panic!("renaming to {}: {e}", dst.display()));
    }

    /// Removes manifest `name`.
    pub fn remove_manifest(&self, name: &str) {
        let path = self.manifest_dir.path().join(name);
        std::fs::remove_file(&path).unwrap_or_else(|e| panic!("removing {}: {e}", path.display()));
    }

    /// `GET path` on the read-only port: (status, body).
    pub fn get(&self, path: &str) -> (u16, String) {
        match self.http.get(path) {
            Ok(r) => (r.status, r.body),
            Err(e) => panic!("{e}; agent log {}", self.spec.log.display()),
        }
    }

    /// The value of series `series` (a name, with its labels if it has any) on `/metrics`; 0
    /// when it is not there.
    pub fn metric(&self, series: &str) -> f64 {
        let (_, body) = self.get("/metrics");
        body.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    }

    /// `GET /pods`, parsed.
    pub fn pods(&self) -> PodList {
        let (status, body) = self.get("/pods");
        assert_eq!(status, 200, "GET /pods answered {status}: {body}");
        serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("GET /pods is not a PodList ({e}): {body}"))
    }

    /// Polls `/pods` every `every` (no pause when 0), handing each answer and the wall-clock
    /// time it arrived (Unix nanoseconds) to `done` until it returns true. False on timeout.
    pub fn poll_pods(
        &self,
        every: Duration,
        timeout: Duration,
        mut done: impl FnMut(&PodList, i64) -> bool,
    ) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let pods = self.pods();
            if done(&pods, unix_nanos()) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(every);
        }
    }

    /// Polls `/pods` every 50 ms until `done` holds; returns that list, or `None` on timeout.
    pub fn try_wait_for(
        &self,
        mut done: impl FnMut(&PodList) -> bool,
        timeout: Duration,
    ) -> Option<PodList> {
        let deadline = Instant::now() + timeout;
        loop {
            let pods = self.pods();
            if done(&pods) {
                return Some(pods);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Polls `/pods` every 50 ms until `done` holds and returns that list.
    ///
    /// # Panics
    /// On timeout, with the last list and the log tail.
    pub fn wait_for(&self, done: impl FnMut(&PodList) -> bool, timeout: Duration) -> PodList {
        match self.try_wait_for(done, timeout) {
            Some(p) => p,
            None => panic!(
                "condition not met within {timeout:?}; /pods: {}; log {}:\n{}",
                self.pods().summary(),
                self.spec.log.display(),
                self.log_tail(40)
            ),
        }
    }

    /// Polls `check` every 50 ms until it returns `Ok` and returns that value.
    ///
    /// # Panics
    /// On timeout, with `what`, the last `Err` and the log tail.
    pub fn eventually<T>(
        &self,
        what: &str,
        timeout: Duration,
        check: impl FnMut() -> Result<T, String>,
    ) -> T {
        self.try_eventually(timeout, check).unwrap_or_else(|why| {
            panic!(
                "{what} not reached within {timeout:?}: {why}; log {}:\n{}",
                self.spec.log.display(),
                self.log_tail(40)
            )
        })
    }

    /// [`Agent::eventually`] that returns the last `Err` on timeout instead of panicking.
    pub fn try_eventually<T>(
        &self,
        timeout: Duration,
        mut check: impl FnMut() -> Result<T, String>,
    ) -> Result<T, String> {
        let deadline = Instant::now() + timeout;
        loop {
            match check() {
                Ok(v) => return Ok(v),
                Err(why) if Instant::now() >= deadline => return Err(why),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// The waiting reason and message of container `main` of static pod `name` (its
    /// `metadata.name`), once it waits with a message.
    ///
    /// # Panics
    /// When it does not within 60 s.
    pub fn waiting(&self, name: &str) -> (String, String) {
        let pod = self.static_pod_name(name);
        self.eventually("a waiting reason", Duration::from_secs(60), || {
            let list = self.pods();
            let w = list
                .container(&pod, "main")
                .and_then(|c| c.state.as_ref()?.waiting.clone())
                .filter(|w| w.message.is_some())
                .ok_or_else(|| format!("no waiting message: {}", list.summary()))?;
            Ok((w.reason.unwrap_or_default(), w.message.unwrap_or_default()))
        })
    }

    /// Waits until `path` no longer exists; `what` names it in the failure message.
    ///
    /// # Panics
    /// When it is still there after `timeout`.
    pub fn wait_until_gone(&self, what: &str, path: &Path, timeout: Duration) {
        self.eventually(&format!("{what} to go"), timeout, || {
            if path.exists() {
                Err(format!("{} is still there", path.display()))
            } else {
                Ok(())
            }
        });
    }

    /// The whole agent log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.spec.log).unwrap_or_default()
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        xtask::agent::tail(&self.spec.log, lines)
    }

    /// Stops the agent: SIGTERM, then SIGKILL after `timeout`. Idempotent.
    pub fn stop(&mut self, timeout: Duration) {
        if let Some(mut process) = self.process.take()
            && !process.stop(timeout)
        {
            eprintln!(
                "swiftlet ({}) did not exit within {timeout:?} of SIGTERM: killed",
                self.spec.node
            );
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "swiftlet log ({}): {}\n--- last lines ---\n{}",
                self.spec.node,
                self.spec.log.display(),
                self.log_tail(60)
            );
        }
        self.stop(Duration::from_secs(20));
        let endpoint = self.runtime_endpoint.clone();
        let node = self.spec.node.clone();
        match block_on(async move { remove_node_sandboxes(&endpoint, &node).await }) {
            Ok(Ok(_)) => {}
            Ok(Err(e)) | Err(e) => {
                eprintln!("cleaning up the sandboxes of {}: {e}", self.spec.node)
            }
        }
        xtask::runtime::remove_cgroup_root(&self.spec.cgroup_root);
    }
}

// ---------------------------------------------------------------------------------------------
// Manifests and cgroups

/// The shared runtime and a fresh agent for the test called `name`; `None` (skipped) when the
/// runtime cannot run here.
pub fn start_agent(name: &str) -> Option<Agent> {
    let rt = Runtime::shared()?;
    Some(Agent::start(rt, AgentOptions::new(name)))
}

/// Builds an image of distinct content (`localhost/swiftlet-test/gc-<name>:<pid>`, one file) in
/// `dir` and imports it into `runtime` with `ctr`, as the image GC tests need; its reference.
///
/// # Panics
/// When the build or the import fails.
pub fn import_test_image(runtime: &Runtime, dir: &Path, name: &str) -> String {
    let reference = format!("localhost/swiftlet-test/gc-{name}:{}", std::process::id());
    let archive =
        xtask::images::build_file_archive(&reference, &format!("gc/{name}"), reference.as_bytes())
            .expect("an archive");
    let path = dir.join(format!("{name}.tar"));
    std::fs::write(&path, archive).expect("write the archive");
    xtask::images::import(&runtime.layout, &path).expect("ctr images import");
    reference
}

/// A static pod `user` whose one container sleeps on the busybox image: the image in use of the
/// image GC tests.
pub fn image_user_manifest(node: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: user, namespace: default, uid: user-{node}}}\n\
         spec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    \
         image: {BUSYBOX_IMAGE}\n    imagePullPolicy: Never\n    command: [sleep, \"3600\"]\n"
    )
}

/// A static pod manifest whose one container loops until SIGTERM (so it stops at once), with a
/// 5 s grace period and the labels `app: <name>` plus `labels`.
pub fn looping_pod_manifest(name: &str, labels: &[(&str, &str)]) -> String {
    xtask::looping_pod_manifest(name, 5, 0, labels)
}

/// A static pod manifest with an explicit UID (`<name>-<node>`, so edits keep the same pod), one
/// app container `main` running `script` under `policy` (no SIGTERM trap) with a 5 s grace period,
/// and optional extra spec lines (already indented by two spaces).
pub fn script_pod_manifest(
    node: &str,
    name: &str,
    policy: &str,
    script: &str,
    extra: &str,
) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: default, uid: {name}-{node}}}
spec:
  restartPolicy: {policy}
  terminationGracePeriodSeconds: 5
{extra}  containers:
  - name: main
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: Never
    command: ["sh", "-c", {script:?}]
"#
    )
}

/// A busybox pod `default/<name>` bound to `node`, as the API server would hold it (UID
/// `<name>-<node>`); `metadata_extra` goes into its metadata (`, labels: {app: web}`), the rest
/// as in [`busybox_pod_manifest`].
///
/// # Panics
/// When the manifest does not parse.
pub fn busybox_api_pod(
    node: &str,
    name: &str,
    metadata_extra: &str,
    spec_extra: &str,
    script: &str,
    container_extra: &str,
) -> Pod {
    let manifest = busybox_pod_manifest(
        &format!("name: {name}, namespace: default, uid: {name}-{node}{metadata_extra}"),
        &format!("  nodeName: {node}\n{spec_extra}"),
        script,
        container_extra,
    );
    // `spec_extra` may set a field the base manifest sets too: the later one wins here, as
    // the test means it (the agent itself refuses a manifest with a duplicate key).
    let mut options = serde_saphyr::Options::default();
    options.duplicate_keys = serde_saphyr::DuplicateKeyPolicy::LastWins;
    serde_saphyr::from_str_with_options(&manifest, options).expect("a pod")
}

/// A pod with one busybox container `main` running `script` under `sh -c` (SIGTERM ends it at
/// once) and a 2 s grace period. `metadata` is the flow mapping's inside (`name: x, ...`),
/// `spec_extra` spec lines (indented by two spaces, newline-terminated), `container_extra`
/// container lines such as probes (indented by four spaces, newline-terminated).
pub fn busybox_pod_manifest(
    metadata: &str,
    spec_extra: &str,
    script: &str,
    container_extra: &str,
) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{{metadata}}}
spec:
{spec_extra}  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: {BUSYBOX_IMAGE}
    imagePullPolicy: Never
    command: ["sh", "-c", {script:?}]
{container_extra}"#,
        script = format!("trap 'exit 0' TERM; {script}"),
    )
}

/// For benches: the release agent (quiet) as test `name`, running `pods` busybox pods
/// `p0`..`p<pods-1>` that sleep (`spec_extra` is added to each spec), once every one runs (up
/// to 15 minutes); with the pod list that showed them running.
pub fn release_agent_with_pods(
    rt: &Runtime,
    name: &str,
    pods: usize,
    spec_extra: &str,
) -> (Agent, PodList) {
    let mut opts = AgentOptions::new(name);
    opts.verbosity = 0;
    opts.binary = Some(release_agent_binary());
    let agent = Agent::start(rt, opts);
    println!("starting {pods} pods ...");
    for i in 0..pods {
        agent.write_manifest(
            &format!("p{i}.yaml"),
            &busybox_pod_manifest(
                &format!("name: p{i}, namespace: default"),
                spec_extra,
                "sleep 3600 & wait",
                "",
            ),
        );
    }
    let running = |l: &PodList| {
        l.items
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count()
    };
    let list = agent.wait_for(|l| running(l) == pods, Duration::from_secs(900));
    (agent, list)
}

/// Removes the pods of [`release_agent_with_pods`] and waits until they are gone.
pub fn remove_bench_pods(agent: &Agent, pods: usize) {
    for i in 0..pods {
        agent.remove_manifest(&format!("p{i}.yaml"));
    }
    agent.wait_for(|l| l.items.is_empty(), Duration::from_secs(600));
}

/// Whether a container's status says Running.
pub fn is_running(c: &ContainerStatus) -> bool {
    c.state.as_ref().is_some_and(|s| s.running.is_some())
}

/// Whether systemd is this machine's init (the VM's guest; not this build machine, whose PID 1 is
/// its VM's own agent).
pub fn systemd_is_init() -> bool {
    Path::new("/run/systemd/system").is_dir()
        && std::fs::read_to_string("/proc/1/comm").is_ok_and(|c| c.trim() == "systemd")
}

/// The UIDs of every `pod<uid>` cgroup directory below `<hierarchy>/<cgroup_root>`, in any cgroup
/// hierarchy (including the ones runc populated itself).
pub fn pod_cgroup_uids(cgroup_root: &str) -> BTreeSet<String> {
    fn walk(dir: &Path, out: &mut BTreeSet<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                if let Some(uid) = e.file_name().to_str().and_then(|n| n.strip_prefix("pod")) {
                    out.insert(uid.to_owned());
                }
                walk(&e.path(), out);
            }
        }
    }
    let mut out = BTreeSet::new();
    for h in xtask::runtime::cgroup_hierarchies() {
        walk(&h.join(cgroup_root.trim_start_matches('/')), &mut out);
    }
    out
}
