//! Runtime manager: turns a pod spec into CRI calls (`sync_pod`), stops pods (`kill_pod`) and reads
//! back what the runtime holds (`pod_state`, `relist`). Every call goes through [`crate::cri::Cri`].
pub mod hash;
pub mod labels;

use crate::cm::{self, ContainerManager};
use crate::cri::{self, Cri};
use k8s_cri::v1 as api;
use k8s_openapi::api::core::v1::{Container, Pod};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("pod {pod}: {source}")]
    Cri {
        pod: String,
        #[source]
        source: cri::Error,
    },
    #[error("pod {pod}: {source}")]
    Cgroup {
        pod: String,
        #[source]
        source: cm::Error,
    },
    #[error("pod {pod}: {what} is not supported yet")]
    Unsupported { pod: String, what: String },
    #[error(
        "pod {pod} container {container}: image {image:?} is not present and imagePullPolicy is Never"
    )]
    ImageNeverPull {
        pod: String,
        container: String,
        image: String,
    },
    #[error("pod {pod} container {container}: pulling image {image:?}: {source}")]
    ImagePull {
        pod: String,
        container: String,
        image: String,
        #[source]
        source: cri::Error,
    },
    #[error("pod {0} has no spec")]
    NoSpec(String),
}

impl Error {
    /// The waiting reason the status shows for a container that could not start because of this.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::ImageNeverPull { .. } => "ErrImageNeverPull",
            Error::ImagePull { .. } => "ErrImagePull",
            Error::Unsupported { .. } => "CreateContainerConfigError",
            _ => "CreateContainerError",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What the runtime holds for one pod, with details.
#[derive(Debug, Clone, Default)]
pub struct PodState {
    /// Newest first.
    pub sandboxes: Vec<api::PodSandbox>,
    /// Status of the newest sandbox, when there is one.
    pub sandbox_status: Option<api::PodSandboxStatus>,
    /// Every container of the pod, newest first, with full status.
    pub containers: Vec<api::ContainerStatus>,
}

impl PodState {
    pub fn ready_sandbox(&self) -> Option<&api::PodSandbox> {
        self.sandboxes
            .first()
            .filter(|s| s.state == api::PodSandboxState::SandboxReady as i32)
    }

    /// The newest container with this name in the given sandbox (or any sandbox when None).
    pub fn newest(&self, name: &str) -> Option<&api::ContainerStatus> {
        self.containers
            .iter()
            .find(|c| c.metadata.as_ref().is_some_and(|m| m.name == name))
    }
}

/// A cheap summary of one pod from a relist: sandbox and container ids with states.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RelistEntry {
    pub sandboxes: Vec<(String, i32)>,
    pub containers: Vec<(String, i32)>,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub node_name: String,
    pub pod_logs_dir: PathBuf,
}

/// The outcome of one sync: when to look at the pod again even without an event.
#[derive(Debug, Default)]
pub struct SyncOutcome {
    pub requeue_after: Option<Duration>,
    /// Per container name: why it is waiting (image errors, back-off), for the status.
    pub waiting: HashMap<String, (String, String)>,
}

#[derive(Clone)]
pub struct Manager {
    cri: Cri,
    cm: ContainerManager,
    cfg: Config,
}

const CRASH_BACKOFF_INITIAL: Duration = Duration::from_secs(10);
const CRASH_BACKOFF_MAX: Duration = Duration::from_secs(300);
const MIN_GRACE_SECS: i64 = 2;

pub fn full_name(pod: &Pod) -> String {
    format!(
        "{}_{}",
        pod.metadata.name.as_deref().unwrap_or_default(),
        pod.metadata.namespace.as_deref().unwrap_or("default")
    )
}

fn now_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or_default()
}

/// Termination grace period of a pod in seconds: deletion grace, else the spec's, else 30.
pub fn grace_period_secs(pod: &Pod) -> i64 {
    pod.metadata
        .deletion_grace_period_seconds
        .or_else(|| {
            pod.spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
        })
        .unwrap_or(30)
}

impl Manager {
    pub fn new(cri: Cri, cm: ContainerManager, cfg: Config) -> Self {
        Self { cri, cm, cfg }
    }

    pub fn cri(&self) -> &Cri {
        &self.cri
    }

    fn node_selector(&self) -> HashMap<String, String> {
        HashMap::from([(labels::NODE_NAME.to_owned(), self.cfg.node_name.clone())])
    }

    fn cri_err(pod: &str) -> impl FnOnce(cri::Error) -> Error + '_ {
        move |source| Error::Cri {
            pod: pod.to_owned(),
            source,
        }
    }

    /// Sandboxes and containers of this agent matching `extra` labels: two CRI calls.
    async fn list(
        &self,
        extra: Option<(&str, &str)>,
    ) -> cri::Result<(Vec<api::PodSandbox>, Vec<api::Container>)> {
        let mut selector = self.node_selector();
        if let Some((k, v)) = extra {
            selector.insert(k.to_owned(), v.to_owned());
        }
        let sandboxes = self
            .cri
            .list_pod_sandbox(Some(api::PodSandboxFilter {
                label_selector: selector.clone(),
                ..Default::default()
            }))
            .await?;
        let containers = self
            .cri
            .list_containers(Some(api::ContainerFilter {
                label_selector: selector,
                ..Default::default()
            }))
            .await?;
        Ok((sandboxes, containers))
    }

    /// Every pod this agent has in the runtime, by UID.
    pub async fn relist(&self) -> cri::Result<HashMap<String, RelistEntry>> {
        let (sandboxes, containers) = self.list(None).await?;
        let mut out: HashMap<String, RelistEntry> = HashMap::new();
        for s in sandboxes {
            if let Some(uid) = s.labels.get(labels::POD_UID) {
                out.entry(uid.clone())
                    .or_default()
                    .sandboxes
                    .push((s.id, s.state));
            }
        }
        for c in containers {
            if let Some(uid) = c.labels.get(labels::POD_UID) {
                out.entry(uid.clone())
                    .or_default()
                    .containers
                    .push((c.id, c.state));
            }
        }
        for e in out.values_mut() {
            e.sandboxes.sort();
            e.containers.sort();
        }
        Ok(out)
    }

    /// Everything the runtime knows about one pod.
    pub async fn pod_state(&self, uid: &str) -> cri::Result<PodState> {
        let (mut sandboxes, listed) = self.list(Some((labels::POD_UID, uid))).await?;
        sandboxes.sort_by_key(|s| std::cmp::Reverse(s.created_at));
        let sandbox_status = match sandboxes.first() {
            Some(s) => match self.cri.pod_sandbox_status(&s.id).await {
                Ok(st) => st,
                Err(e) if e.is_not_found() => None,
                Err(e) => return Err(e),
            },
            None => None,
        };
        let mut containers = Vec::with_capacity(listed.len());
        for c in listed {
            match self.cri.container_status(&c.id).await {
                Ok(Some(st)) => containers.push(st),
                Ok(None) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        containers.sort_by_key(|c| std::cmp::Reverse(c.created_at));
        Ok(PodState {
            sandboxes,
            sandbox_status,
            containers,
        })
    }

    /// Brings the runtime in line with the pod spec: sandbox, then containers
    /// (a minimal `compute_pod_actions`; init containers are not supported yet).
    pub async fn sync_pod(&self, pod: &Pod) -> Result<SyncOutcome> {
        let name = full_name(pod);
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let spec = pod
            .spec
            .as_ref()
            .ok_or_else(|| Error::NoSpec(name.clone()))?;
        if spec.init_containers.as_ref().is_some_and(|v| !v.is_empty()) {
            return Err(Error::Unsupported {
                pod: name,
                what: "initContainers".into(),
            });
        }
        if spec.volumes.as_ref().is_some_and(|v| !v.is_empty()) {
            return Err(Error::Unsupported {
                pod: name,
                what: "volumes".into(),
            });
        }
        let state = self.pod_state(&uid).await.map_err(Self::cri_err(&name))?;
        let restart_policy = spec.restart_policy.as_deref().unwrap_or("Always");
        let mut outcome = SyncOutcome::default();

        let (sandbox_id, sandbox_config) = match state.ready_sandbox() {
            Some(s) => {
                let attempt = s.metadata.as_ref().map(|m| m.attempt).unwrap_or(0);
                let cgroup =
                    self.cm
                        .ensure_pod_cgroup(pod, &uid)
                        .map_err(|source| Error::Cgroup {
                            pod: name.clone(),
                            source,
                        })?;
                (
                    s.id.clone(),
                    self.sandbox_config(pod, &uid, attempt, &cgroup),
                )
            }
            None => {
                let attempt = state
                    .sandboxes
                    .first()
                    .and_then(|s| s.metadata.as_ref())
                    .map(|m| m.attempt + 1)
                    .unwrap_or(0);
                if restart_policy == "Never" && attempt > 0 && !state.containers.is_empty() {
                    // The pod ran and its sandbox is gone: it does not start again.
                    return Ok(outcome);
                }
                if !state.sandboxes.is_empty() {
                    self.kill_runtime_pod(&name, &state, MIN_GRACE_SECS).await?;
                }
                let cgroup =
                    self.cm
                        .ensure_pod_cgroup(pod, &uid)
                        .map_err(|source| Error::Cgroup {
                            pod: name.clone(),
                            source,
                        })?;
                let config = self.sandbox_config(pod, &uid, attempt, &cgroup);
                let log_dir = PathBuf::from(&config.log_directory);
                if let Err(e) = std::fs::create_dir_all(&log_dir) {
                    tracing::warn!(pod = %name, dir = %log_dir.display(), %e, "creating pod log directory");
                }
                let id = self
                    .cri
                    .run_pod_sandbox(config.clone())
                    .await
                    .map_err(Self::cri_err(&name))?;
                tracing::info!(pod = %name, sandbox = %id, attempt, "sandbox started");
                (id, config)
            }
        };
        let fresh_sandbox =
            state.ready_sandbox().map(|s| s.id.as_str()) != Some(sandbox_id.as_str());

        for container in &spec.containers {
            // Containers of an older sandbox do not count.
            let prev = if fresh_sandbox {
                None
            } else {
                state.containers.iter().find(|c| {
                    c.metadata
                        .as_ref()
                        .is_some_and(|m| m.name == container.name)
                })
            };
            let hash = hash::container_hash(container);
            let mut restart_count = 0;
            if let Some(prev) = prev {
                restart_count = prev.metadata.as_ref().map(|m| m.attempt + 1).unwrap_or(0);
                let running = prev.state == api::ContainerState::ContainerRunning as i32;
                let prev_hash = hash::parse_label(prev.annotations.get(labels::CONTAINER_HASH));
                if running && prev_hash == Some(hash) {
                    continue;
                }
                if running {
                    tracing::info!(pod = %name, container = %container.name, "container definition changed, restarting");
                    self.stop_container(&name, &prev.id, grace_period_secs(pod))
                        .await?;
                } else if prev.state == api::ContainerState::ContainerExited as i32 {
                    let wants = match restart_policy {
                        "Never" => false,
                        "OnFailure" => prev.exit_code != 0,
                        _ => true,
                    };
                    if !wants && prev_hash == Some(hash) {
                        continue;
                    }
                    let delay =
                        backoff_delay(prev.metadata.as_ref().map(|m| m.attempt).unwrap_or(0));
                    let since =
                        Duration::from_nanos((now_nanos() - prev.finished_at).max(0) as u64);
                    if since < delay {
                        let left = delay - since;
                        outcome.requeue_after =
                            Some(outcome.requeue_after.map_or(left, |d| d.min(left)));
                        outcome.waiting.insert(
                            container.name.clone(),
                            (
                                "CrashLoopBackOff".into(),
                                format!(
                                    "back-off {}s restarting failed container={} pod={}",
                                    delay.as_secs(),
                                    container.name,
                                    name
                                ),
                            ),
                        );
                        continue;
                    }
                }
            }
            match self
                .start_container(
                    pod,
                    &name,
                    &uid,
                    container,
                    &sandbox_id,
                    &sandbox_config,
                    restart_count,
                    hash,
                )
                .await
            {
                Ok(()) => {}
                Err(e) => {
                    tracing::warn!(pod = %name, container = %container.name, error = %e, "starting container");
                    outcome
                        .waiting
                        .insert(container.name.clone(), (e.reason().into(), e.to_string()));
                    outcome.requeue_after = Some(
                        outcome
                            .requeue_after
                            .map_or(CRASH_BACKOFF_INITIAL, |d| d.min(CRASH_BACKOFF_INITIAL)),
                    );
                }
            }
        }
        Ok(outcome)
    }

    #[allow(clippy::too_many_arguments)]
    async fn start_container(
        &self,
        pod: &Pod,
        name: &str,
        uid: &str,
        container: &Container,
        sandbox_id: &str,
        sandbox_config: &api::PodSandboxConfig,
        restart_count: u32,
        hash: u64,
    ) -> Result<()> {
        let image = container.image.clone().unwrap_or_default();
        self.ensure_image(name, container, &image).await?;
        let config = self.container_config(pod, uid, container, restart_count, hash, &image)?;
        let id = self
            .cri
            .create_container(sandbox_id, config, sandbox_config.clone())
            .await
            .map_err(Self::cri_err(name))?;
        self.cri
            .start_container(&id, uid)
            .await
            .map_err(Self::cri_err(name))?;
        tracing::info!(pod = %name, container = %container.name, id = %id, restart_count, "container started");
        Ok(())
    }

    async fn ensure_image(&self, pod: &str, container: &Container, image: &str) -> Result<()> {
        let policy = container
            .image_pull_policy
            .as_deref()
            .unwrap_or("IfNotPresent");
        let present = || async {
            self.cri
                .image_status(image)
                .await
                .map(|i| i.is_some())
                .map_err(Self::cri_err(pod))
        };
        let pull = policy == "Always" || (policy != "Never" && !present().await?);
        if pull {
            self.cri
                .pull_image(image)
                .await
                .map_err(|source| Error::ImagePull {
                    pod: pod.to_owned(),
                    container: container.name.clone(),
                    image: image.to_owned(),
                    source,
                })?;
        } else if policy == "Never" && !present().await? {
            return Err(Error::ImageNeverPull {
                pod: pod.to_owned(),
                container: container.name.clone(),
                image: image.to_owned(),
            });
        }
        Ok(())
    }

    fn pod_labels(&self, pod: &Pod, uid: &str) -> HashMap<String, String> {
        HashMap::from([
            (
                labels::POD_NAME.to_owned(),
                pod.metadata.name.clone().unwrap_or_default(),
            ),
            (
                labels::POD_NAMESPACE.to_owned(),
                pod.metadata
                    .namespace
                    .clone()
                    .unwrap_or_else(|| "default".into()),
            ),
            (labels::POD_UID.to_owned(), uid.to_owned()),
            (labels::NODE_NAME.to_owned(), self.cfg.node_name.clone()),
        ])
    }

    fn host_network(pod: &Pod) -> bool {
        pod.spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false)
    }

    fn namespace_options(pod: &Pod) -> api::NamespaceOption {
        let share_pid = pod
            .spec
            .as_ref()
            .and_then(|s| s.share_process_namespace)
            .unwrap_or(false);
        api::NamespaceOption {
            network: if Self::host_network(pod) {
                api::NamespaceMode::Node
            } else {
                api::NamespaceMode::Pod
            } as i32,
            pid: if share_pid {
                api::NamespaceMode::Pod
            } else {
                api::NamespaceMode::Container
            } as i32,
            ipc: api::NamespaceMode::Pod as i32,
            ..Default::default()
        }
    }

    pub fn sandbox_config(
        &self,
        pod: &Pod,
        uid: &str,
        attempt: u32,
        cgroup_parent: &str,
    ) -> api::PodSandboxConfig {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let namespace = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let spec = pod.spec.as_ref();
        // Host-network pods share the node's UTS namespace: the runtime refuses to set a hostname.
        let hostname = if Self::host_network(pod) {
            String::new()
        } else {
            spec.and_then(|s| s.hostname.clone())
                .unwrap_or_else(|| name.chars().take(63).collect())
        };
        let mut labels = pod
            .metadata
            .labels
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect::<HashMap<_, _>>();
        labels.extend(self.pod_labels(pod, uid));
        let annotations = pod
            .metadata
            .annotations
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect();
        let port_mappings = spec
            .map(|s| s.containers.as_slice())
            .unwrap_or_default()
            .iter()
            .flat_map(|c| c.ports.iter().flatten())
            .filter(|p| p.host_port.is_some_and(|h| h > 0))
            .map(|p| api::PortMapping {
                protocol: match p.protocol.as_deref() {
                    Some("UDP") => api::Protocol::Udp,
                    Some("SCTP") => api::Protocol::Sctp,
                    _ => api::Protocol::Tcp,
                } as i32,
                container_port: p.container_port,
                host_port: p.host_port.unwrap_or_default(),
                host_ip: p.host_ip.clone().unwrap_or_default(),
            })
            .collect();
        let privileged = spec
            .map(|s| s.containers.as_slice())
            .unwrap_or_default()
            .iter()
            .any(|c| {
                c.security_context
                    .as_ref()
                    .and_then(|s| s.privileged)
                    .unwrap_or(false)
            });
        api::PodSandboxConfig {
            metadata: Some(api::PodSandboxMetadata {
                name: name.clone(),
                uid: uid.to_owned(),
                namespace: namespace.clone(),
                attempt,
            }),
            hostname,
            log_directory: self
                .cfg
                .pod_logs_dir
                .join(format!("{namespace}_{name}_{uid}"))
                .to_string_lossy()
                .into_owned(),
            dns_config: None,
            port_mappings,
            labels,
            annotations,
            linux: Some(api::LinuxPodSandboxConfig {
                cgroup_parent: cgroup_parent.to_owned(),
                security_context: Some(api::LinuxSandboxSecurityContext {
                    namespace_options: Some(Self::namespace_options(pod)),
                    privileged,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            windows: None,
        }
    }

    fn container_config(
        &self,
        pod: &Pod,
        uid: &str,
        c: &Container,
        restart_count: u32,
        hash: u64,
        image: &str,
    ) -> Result<api::ContainerConfig> {
        let name = full_name(pod);
        let unsupported = |what: &str| Error::Unsupported {
            pod: name.clone(),
            what: format!("container {}: {what}", c.name),
        };
        let mut envs = Vec::new();
        for e in c.env.iter().flatten() {
            if e.value_from.is_some() {
                return Err(unsupported(&format!("env {} valueFrom", e.name)));
            }
            envs.push(api::KeyValue {
                key: e.name.clone(),
                value: e.value.clone().unwrap_or_default(),
            });
        }
        if c.env_from.as_ref().is_some_and(|v| !v.is_empty()) {
            return Err(unsupported("envFrom"));
        }
        let mut labels = self.pod_labels(pod, uid);
        labels.insert(labels::CONTAINER_NAME.to_owned(), c.name.clone());
        let annotations = HashMap::from([
            (labels::CONTAINER_HASH.to_owned(), hash::hash_label(hash)),
            (
                labels::CONTAINER_RESTART_COUNT.to_owned(),
                restart_count.to_string(),
            ),
            (
                labels::POD_TERMINATION_GRACE_PERIOD.to_owned(),
                grace_period_secs(pod).to_string(),
            ),
            (
                labels::TERMINATION_MESSAGE_PATH.to_owned(),
                c.termination_message_path
                    .clone()
                    .unwrap_or_else(|| "/dev/termination-log".into()),
            ),
        ]);
        let resources = container_resources(c).map_err(|source| Error::Cgroup {
            pod: name.clone(),
            source,
        })?;
        let sc = c.security_context.as_ref();
        Ok(api::ContainerConfig {
            metadata: Some(api::ContainerMetadata {
                name: c.name.clone(),
                attempt: restart_count,
            }),
            image: Some(cri::image_spec(image)),
            command: c.command.clone().unwrap_or_default(),
            args: c.args.clone().unwrap_or_default(),
            working_dir: c.working_dir.clone().unwrap_or_default(),
            envs,
            labels,
            annotations,
            log_path: format!("{}/{restart_count}.log", c.name),
            stdin: c.stdin.unwrap_or(false),
            stdin_once: c.stdin_once.unwrap_or(false),
            tty: c.tty.unwrap_or(false),
            linux: Some(api::LinuxContainerConfig {
                resources: Some(resources),
                security_context: Some(api::LinuxContainerSecurityContext {
                    namespace_options: Some(Self::namespace_options(pod)),
                    privileged: sc.and_then(|s| s.privileged).unwrap_or(false),
                    run_as_user: sc
                        .and_then(|s| s.run_as_user)
                        .map(|value| api::Int64Value { value }),
                    run_as_group: sc
                        .and_then(|s| s.run_as_group)
                        .map(|value| api::Int64Value { value }),
                    readonly_rootfs: sc
                        .and_then(|s| s.read_only_root_filesystem)
                        .unwrap_or(false),
                    ..Default::default()
                }),
            }),
            ..Default::default()
        })
    }

    async fn stop_container(&self, pod: &str, id: &str, grace: i64) -> Result<()> {
        match self.cri.stop_container(id, grace.max(MIN_GRACE_SECS)).await {
            Err(e) if !e.is_not_found() => Err(Self::cri_err(pod)(e)),
            _ => Ok(()),
        }
    }

    /// Stops every container (in parallel, within the grace period), then stops and removes every
    /// sandbox of the pod.
    async fn kill_runtime_pod(&self, name: &str, state: &PodState, grace: i64) -> Result<()> {
        let mut stops = tokio::task::JoinSet::new();
        for c in &state.containers {
            if c.state == api::ContainerState::ContainerRunning as i32
                || c.state == api::ContainerState::ContainerCreated as i32
            {
                let (this, name, id) = (self.clone(), name.to_owned(), c.id.clone());
                stops.spawn(async move { this.stop_container(&name, &id, grace).await });
            }
        }
        let mut first_err = None;
        while let Some(res) = stops.join_next().await {
            if let Ok(Err(e)) = res {
                first_err.get_or_insert(e);
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        for s in &state.sandboxes {
            for r in [
                self.cri.stop_pod_sandbox(&s.id).await,
                self.cri.remove_pod_sandbox(&s.id).await,
            ] {
                if let Err(e) = r
                    && !e.is_not_found()
                {
                    return Err(Self::cri_err(name)(e));
                }
            }
        }
        Ok(())
    }

    /// Terminates a pod: containers within `grace` seconds, then its sandboxes, then its cgroup and
    /// log directory. Works from the UID alone, so orphans (no spec) can be killed too.
    pub async fn kill_pod(&self, name: &str, uid: &str, grace: i64) -> Result<()> {
        let state = self.pod_state(uid).await.map_err(Self::cri_err(name))?;
        self.kill_runtime_pod(name, &state, grace).await?;
        // Without the spec (orphans) the QoS class is unknown: try the pod's place under each.
        for qos in [
            cm::QosClass::Guaranteed,
            cm::QosClass::Burstable,
            cm::QosClass::BestEffort,
        ] {
            self.cm
                .pod_cgroup_name(uid, qos)
                .and_then(|cg| self.cm.destroy_pod_cgroup(&cg))
                .map_err(|source| Error::Cgroup {
                    pod: name.to_owned(),
                    source,
                })?;
        }
        for s in &state.sandboxes {
            if let Some(m) = &s.metadata {
                let dir = self
                    .cfg
                    .pod_logs_dir
                    .join(format!("{}_{}_{}", m.namespace, m.name, m.uid));
                if let Err(e) = std::fs::remove_dir_all(&dir)
                    && e.kind() != std::io::ErrorKind::NotFound
                {
                    tracing::warn!(pod = %name, dir = %dir.display(), %e, "removing pod log directory");
                }
            }
        }
        Ok(())
    }
}

/// Crash-loop back-off before restart number `attempt + 1`: 10 s doubling to 300 s.
fn backoff_delay(attempt: u32) -> Duration {
    CRASH_BACKOFF_INITIAL
        .saturating_mul(1u32.checked_shl(attempt).unwrap_or(u32::MAX))
        .min(CRASH_BACKOFF_MAX)
}

/// The container's own cgroup limits (CPU shares, CFS quota, memory limit).
fn container_resources(c: &Container) -> cm::Result<api::LinuxContainerResources> {
    let r = c.resources.as_ref();
    let get = |m: Option<
        &std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
    >,
               k: &str| m.and_then(|m| m.get(k)).map(|q| q.0.clone());
    let req_cpu = get(r.and_then(|r| r.requests.as_ref()), "cpu")
        .map(|v| cm::parse_cpu_millis(&v))
        .transpose()?;
    let lim_cpu = get(r.and_then(|r| r.limits.as_ref()), "cpu")
        .map(|v| cm::parse_cpu_millis(&v))
        .transpose()?;
    let lim_mem = get(r.and_then(|r| r.limits.as_ref()), "memory")
        .map(|v| cm::parse_bytes(&v))
        .transpose()?;
    // As the API server would: a limit without a request implies request = limit.
    let shares = cm::milli_cpu_to_shares(req_cpu.or(lim_cpu).unwrap_or(0));
    Ok(api::LinuxContainerResources {
        cpu_shares: shares as i64,
        cpu_quota: lim_cpu
            .map(|m| cm::milli_cpu_to_quota(m, 100_000) as i64)
            .unwrap_or(0),
        cpu_period: if lim_cpu.is_some() { 100_000 } else { 0 },
        memory_limit_in_bytes: lim_mem.unwrap_or(0) as i64,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_cap() {
        assert_eq!(backoff_delay(0), Duration::from_secs(10));
        assert_eq!(backoff_delay(1), Duration::from_secs(20));
        assert_eq!(backoff_delay(4), Duration::from_secs(160));
        assert_eq!(backoff_delay(5), Duration::from_secs(300));
        assert_eq!(backoff_delay(40), Duration::from_secs(300));
    }
}
