//! Runtime manager: turns a pod spec into CRI calls (`sync_pod`), stops pods (`kill_pod`) and reads
//! back what the runtime holds (`pod_state`, `relist`). Every call goes through [`crate::cri::Cri`].
pub mod actions;
pub mod env;
pub mod hash;
mod hooks;
mod kill;
mod reading;
mod resize;
pub mod runtime_class;
pub mod security;
mod start;
mod sync;
pub mod unsupported;

use crate::backoff::{Backoff, now_nanos};
use crate::cm::{self, ContainerManager};
use crate::cri::{self, Cri};
use crate::pod::state::is_live;
use crate::pod::{ContainerKind, ListedPod, PodState, full_name, grace_period_secs, labels};
use crate::pod_cache::{self, Mutating, PodCache};
use k8s_cri::v1 as api;
use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

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
    #[error("pod {pod} container {container}: termination message file: {source}")]
    TerminationMessage {
        pod: String,
        container: String,
        #[source]
        source: std::io::Error,
    },
    #[error("pod {pod}: {what} is not supported yet")]
    Unsupported { pod: String, what: String },
    #[error("pod {pod}: removing a dead container's log files: {source}")]
    ContainerLogs {
        pod: String,
        #[source]
        source: std::io::Error,
    },
    /// The container's image is not there to start from (`images::Error` says why).
    #[error(transparent)]
    Image(#[from] crate::images::Error),
    /// A lifecycle hook the API server would have rejected.
    #[error("pod {pod} container {container}: {hook}: {reason}")]
    InvalidHook {
        pod: String,
        container: String,
        hook: &'static str,
        reason: hooks::InvalidHandler,
    },
    /// A postStart hook failed (the kubelet's message); the container was killed.
    #[error("{message}")]
    PostStartHook {
        pod: String,
        container: String,
        message: String,
        /// The killed container will be started again (its restart policy and exit code): only
        /// then does the status show it waiting with this error, as the kubelet shows it.
        restarts: bool,
    },
    /// A volume could not be set up or mounted (`volume::Error` says which and why).
    #[error("pod {pod}: {source}")]
    Volume {
        pod: String,
        #[source]
        source: crate::volume::Error,
    },
    /// The pod's DNS configuration or hosts file could not be formed (`dns::Error` says why).
    #[error("pod {pod}: {source}")]
    Dns {
        pod: String,
        #[source]
        source: crate::dns::Error,
    },
    #[error("pod {0} has no spec")]
    NoSpec(String),
    /// `spec.runtimeClassName` names no RuntimeClass swiftlet can read: no sandbox is created.
    #[error("pod {pod}: failed to create pod sandbox: {source}")]
    RuntimeClass {
        pod: String,
        #[source]
        source: crate::api_objects::Error,
    },
    /// The container's environment could not be built (a configMap, secret or key it needs is
    /// missing, the services have not been read yet, a `valueFrom` cannot be resolved): the
    /// kubelet's message alone, as its status shows it.
    #[error("{source}")]
    Env {
        pod: String,
        container: String,
        #[source]
        source: Box<env::Error>,
    },
    /// The security context asks for what this node does not allow or cannot honour.
    #[error("pod {pod}: {refusal}")]
    Refused {
        pod: String,
        refusal: security::Refusal,
    },
}

impl Error {
    /// The waiting reason the status shows for a container that could not start because of this.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Image(e) => e.reason(),
            Error::Unsupported { .. } | Error::InvalidHook { .. } | Error::Env { .. } => {
                "CreateContainerConfigError"
            }
            Error::PostStartHook { .. } => "PostStartHookError",
            Error::Refused { refusal, .. } => refusal.reason(),
            Error::Volume { source, .. } => source.reason(),
            Error::Dns { source, .. } => source.reason(),
            // The kubelet's status while the sandbox cannot be created; the message says why.
            Error::RuntimeClass { .. } => "ContainerCreating",
            _ => "CreateContainerError",
        }
    }
}

impl Error {
    /// When to try again after this error stopped a container from starting.
    pub fn retry_after(&self) -> Duration {
        match self {
            Error::Image(e) => e.retry_after().unwrap_or(CRASH_BACKOFF_INITIAL),
            _ => CRASH_BACKOFF_INITIAL,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything needed to start containers in one pod's sandbox during one sync.
struct StartTarget<'a> {
    pod: &'a Pod,
    name: &'a str,
    uid: &'a str,
    /// The pod's containers by name, as the sync read them.
    index: &'a crate::pod::state::ContainerIndex<'a>,
    sandbox_id: &'a str,
    sandbox_config: &'a api::PodSandboxConfig,
    /// The pod's IPs as the sandbox's status reports them (none on the host network), for the
    /// containers' environments and the pod's managed `/etc/hosts`.
    pod_ips: &'a [String],
    /// Fires when the pod starts terminating: a postStart hook still running is abandoned.
    cancel: &'a CancellationToken,
    /// The pulls begun while the sandbox was being created, by image.
    prefetched: &'a crate::images::Prefetched,
    /// The pod's QoS class, computed once for all of its starts.
    qos: crate::pod::QosClass,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub node_name: String,
    /// `--node-ip`: the node's configured addresses (none: detected), for host-network pods'
    /// IPs and the `status.hostIP(s)` environment sources.
    pub node_ips: Vec<std::net::IpAddr>,
    pub pod_logs_dir: PathBuf,
    /// `<root-dir>/pods`: per pod (by UID) the files the agent mounts into its containers (the
    /// termination message files, emptyDir volumes, subPath binds).
    pub pods_dir: PathBuf,
    /// What the node allows of security contexts.
    pub security: security::Settings,
    /// The machine's memory in bytes (the base of Burstable containers' `oom_score_adj`).
    pub memory_capacity: u64,
    /// `--cluster-dns`, `--cluster-domain`, `--resolv-conf`: the pods' DNS configuration.
    pub dns: crate::dns::Settings,
}

/// What a [`Manager`] is built from: every part it needs, given once by the agent (none is
/// wired later, so none can be forgotten).
pub struct Deps {
    pub cri: Cri,
    pub cm: ContainerManager,
    pub cfg: Config,
    /// Liveness and startup results: a failed probe kills its container.
    pub probes: crate::pod::probe_results::Results,
    /// The API server's objects the pods refer to (their RuntimeClass, their image pull
    /// secrets, the configMaps, secrets and service account tokens of their volumes). An
    /// `ApiObjects` with no API server: a pod naming a RuntimeClass waits with an error saying
    /// so, and pull secrets are skipped as missing.
    pub api_objects: crate::api_objects::ApiObjects,
    /// The image manager: the runtime asks it for each container's image.
    pub images: crate::images::Images,
    /// The volume manager: the runtime asks it to set up, refresh and tear down the pods'
    /// volumes and for each container's mounts.
    pub volumes: crate::volume::Manager,
    /// The pod cache (made once by the agent, shared with the PLEG's side of the agent).
    pub pod_cache: PodCache,
}

/// The outcome of one sync: when to look at the pod again even without an event.
#[derive(Debug, Default)]
pub struct SyncOutcome {
    pub requeue_after: Option<Duration>,
    /// Per container name: why it is waiting (image errors, back-off), for the status.
    pub waiting: HashMap<String, (String, String)>,
    /// Every container finished and none will run again (phase Succeeded or Failed): the pod
    /// needs no more syncs.
    pub terminal: bool,
    /// What this sync decided.
    pub actions: actions::PodActions,
    /// What the runtime holds for the pod after this sync, when the sync knows it without asking
    /// again: the state it read (nothing was changed) or that state plus the sandbox and
    /// containers it started. `None` when it stopped something or a start failed: then the
    /// caller reads the runtime.
    pub state: Option<PodState>,
    /// The containers this sync started, in start order, as the runtime would report them now.
    started: Vec<api::ContainerStatus>,
    /// The runtime held nothing for the pod before this sync: `state` is exactly what this sync
    /// created, as of its end.
    from_nothing: bool,
    /// A start failed: what the pod holds must be read back (a failed postStart hook leaves a
    /// killed container that `started` does not hold).
    start_failed: bool,
    /// When this sync finished setting up the pod's volumes (for the startup timeline).
    pub volumes_set_up: Option<Instant>,
}

impl SyncOutcome {
    /// Records why container `name` waits, and to look again within `retry`.
    fn wait(&mut self, name: &str, reason: &str, message: String, retry: Duration) {
        self.waiting
            .insert(name.to_owned(), (reason.to_owned(), message));
        self.requeue(retry);
    }

    fn requeue(&mut self, after: Duration) {
        self.requeue_after = Some(self.requeue_after.map_or(after, |d| d.min(after)));
    }
}

#[derive(Clone)]
pub struct Manager {
    cri: Cri,
    cm: ContainerManager,
    cfg: Config,
    /// Crash-loop back-offs, per pod, container and spec hash.
    backoff: Arc<Mutex<Backoff>>,
    /// Liveness and startup results: a failed probe kills its container.
    probes: crate::pod::probe_results::Results,
    resize: Arc<Mutex<ResizeState>>,
    /// The PLEG's pod reads handed to the pods' syncs, and the pods being stopped.
    fresh: PodCache,
    /// `spec.runtimeClassName` -> CRI runtime handler, through the API server.
    runtime_classes: runtime_class::RuntimeClasses,
    /// Where pods' image pull secrets, the configMaps, secrets and services of their
    /// containers' environments, and their volumes' configMaps, secrets and service account
    /// tokens, are read.
    api: crate::api_objects::ApiObjects,
    /// The volume manager: set-up, refresh, mounts and tear-down of the pods' volumes.
    volumes: crate::volume::Manager,
    /// The image manager (pulls, their back-offs, credentials).
    images: crate::images::Images,
}

/// What in-place resizes left behind (annotations cannot change after create).
#[derive(Default)]
struct ResizeState {
    /// Container ID -> the resources label applied by UpdateContainerResources.
    applied: HashMap<String, String>,
    /// Pod UID -> why its last resize was refused or failed.
    errors: HashMap<String, String>,
}

impl ResizeState {
    /// Forgets what resizes left of a pod that is gone: its error and its containers' applied
    /// resources.
    fn forget_pod<'a>(&mut self, uid: &str, containers: impl IntoIterator<Item = &'a str>) {
        self.errors.remove(uid);
        for id in containers {
            self.applied.remove(id);
        }
    }
}

const CRASH_BACKOFF_INITIAL: Duration = Duration::from_secs(10);
const CRASH_BACKOFF_MAX: Duration = Duration::from_secs(300);
const MIN_GRACE_SECS: i64 = 2;

impl Manager {
    /// The container manager (pod cgroups).
    pub fn cm(&self) -> &ContainerManager {
        &self.cm
    }

    /// The image manager the runtime pulls through.
    pub fn images(&self) -> &crate::images::Images {
        &self.images
    }

    /// Forgets crash-loop back-off entries untouched for ten minutes (for housekeeping; a killed
    /// pod's entries are forgotten by `kill_pod` already).
    pub fn gc_backoffs(&self) {
        self.backoff
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .gc(now_nanos());
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::{Config, Manager, hash};
    use crate::pod::labels;
    use crate::{cm, cri::Cri, metrics::Metrics};

    /// A manager whose CRI client connects to nothing (lazily) and whose cgroups live under
    /// `mount`.
    pub(crate) fn manager(mount: &std::path::Path) -> Manager {
        let cri = Cri::new("unix:///nonexistent/cri.sock", Metrics::new()).expect("lazy client");
        Manager::new(super::Deps {
            cri: cri.clone(),
            cm: cm::ContainerManager::new(cm::Config {
                cgroup_root: "/t".into(),
                cgroups_per_qos: true,
                mount: mount.into(),
                pod_pids_limit: -1,
            }),
            cfg: Config {
                node_name: "n1".into(),
                node_ips: Vec::new(),
                pod_logs_dir: "/logs".into(),
                pods_dir: "/pods".into(),
                security: super::security::Settings::default(),
                memory_capacity: 8 << 30,
                // Not the machine's resolv.conf: the tests' results do not depend on it.
                dns: crate::dns::Settings {
                    resolv_conf: None,
                    ..Default::default()
                },
            },
            probes: Default::default(),
            api_objects: Default::default(),
            images: crate::images::Images::new(
                cri.clone(),
                Default::default(),
                Default::default(),
                None,
            ),
            volumes: crate::volume::Manager::new(
                "/pods".into(),
                8 << 30,
                Default::default(),
                tokio::sync::watch::channel(Default::default()).1,
            ),
            pod_cache: Default::default(),
        })
    }

    #[tokio::test]
    async fn first_start_requests_are_what_a_new_pods_sync_sends() {
        let mount = tempfile::tempdir().expect("tempdir");
        let manager = manager(mount.path());
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "ns"},
            "spec": {"containers": [
                {"name": "a", "image": "img:1", "resources": {"requests": {"cpu": "250m"}}},
                {"name": "b", "image": "img:2"}
            ]}
        }))
        .expect("pod");
        let (sandbox, containers) = manager.first_start_requests(&pod, "u1").expect("requests");
        let linux = sandbox.linux.as_ref().expect("linux");
        // Burstable (a request, no limits): the pod cgroup the sync creates, named, not made.
        assert_eq!(linux.cgroup_parent, "/t/kubepods/burstable/podu1");
        let made = std::fs::read_dir(mount.path()).expect("mount").count();
        assert_eq!(made, 0, "nothing is created under the cgroup mount");
        assert_eq!(sandbox.log_directory, "/logs/ns_web_u1");
        assert_eq!(sandbox.hostname, "web");
        // ClusterFirst without cluster DNS falls back to Default; without --resolv-conf that is
        // the node itself.
        let dns = sandbox.dns_config.as_ref().expect("a DNS config");
        assert_eq!(
            (dns.servers.as_slice(), dns.searches.as_slice()),
            (&["127.0.0.1".to_owned()][..], &[".".to_owned()][..])
        );
        assert_eq!(
            sandbox.labels.get(labels::NODE_NAME).map(String::as_str),
            Some("n1")
        );
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(containers.len(), 2);
        for (config, c) in containers.iter().zip(&spec.containers) {
            let meta = config.metadata.as_ref().expect("metadata");
            assert_eq!((meta.name.as_str(), meta.attempt), (c.name.as_str(), 0));
            assert_eq!(config.log_path, format!("{}/0.log", c.name));
            assert_eq!(
                config.annotations.get(labels::CONTAINER_HASH),
                Some(&hash::hash_label(hash::container_hash(c)))
            );
        }
        let shares = |i: usize| {
            containers[i]
                .linux
                .as_ref()
                .and_then(|l| l.resources.as_ref())
                .map(|r| r.cpu_shares)
        };
        assert_eq!((shares(0), shares(1)), (Some(256), Some(2)));
    }

    #[tokio::test]
    async fn each_container_gets_the_managed_etc_hosts_unless_it_mounts_its_own() {
        use super::start::{Inputs, Instance};
        let (mount, pods) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut manager = manager(mount.path());
        manager.cfg.pods_dir = pods.path().into();
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "ns"},
            "spec": {
                "hostAliases": [{"ip": "10.1.2.3", "hostnames": ["db"]}],
                "volumes": [{"name": "h", "hostPath": {"path": "/etc/hosts"}}],
                "containers": [
                    {"name": "a", "image": "img"},
                    {"name": "b", "image": "img",
                     "volumeMounts": [{"name": "h", "mountPath": "/etc/hosts"}]},
                ],
            }
        }))
        .unwrap();
        let spec = pod.spec.as_ref().unwrap();
        let config = |i: usize, ips: &[String]| {
            let c = &spec.containers[i];
            let instance = Instance {
                kind: crate::pod::ContainerKind::App,
                restart_count: 0,
                hash: hash::container_hash(c),
            };
            let inputs = Inputs {
                image_user: &Default::default(),
                env: &[],
                pod_ips: ips,
                qos: crate::pod::QosClass::BestEffort,
            };
            manager
                .container_config(&pod, "u1", c, instance, &inputs)
                .unwrap()
        };
        let hosts_mounts = |c: &k8s_cri::v1::ContainerConfig| -> Vec<String> {
            c.mounts
                .iter()
                .filter(|m| m.container_path == "/etc/hosts")
                .map(|m| m.host_path.clone())
                .collect()
        };
        let file = pods.path().join("u1").join("etc-hosts");
        // The IP not known yet: no file, no mount.
        assert!(hosts_mounts(&config(0, &[])).is_empty());
        assert!(!file.exists());
        let ips = ["10.88.0.7".to_owned()];
        let a = config(0, &ips);
        assert_eq!(hosts_mounts(&a), [file.display().to_string()]);
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(
            text.contains("10.88.0.7\tweb\n") && text.contains("10.1.2.3\tdb\n"),
            "{text}"
        );
        // A container mounting /etc/hosts itself keeps its own mount, only.
        assert_eq!(hosts_mounts(&config(1, &ips)), ["/etc/hosts"]);
    }

    #[test]
    fn a_removed_pod_leaves_nothing_of_its_resizes() {
        let mut r = super::ResizeState::default();
        r.applied.insert("c1".into(), "cpu=1".into());
        r.applied.insert("c2".into(), "cpu=2".into());
        r.applied.insert("other".into(), "cpu=3".into());
        r.errors.insert("u".into(), "refused".into());
        r.errors.insert("v".into(), "refused".into());
        r.forget_pod("u", ["c1", "c2"]);
        assert_eq!(r.applied.keys().collect::<Vec<_>>(), ["other"]);
        assert_eq!(r.errors.keys().collect::<Vec<_>>(), ["v"]);
    }
}
