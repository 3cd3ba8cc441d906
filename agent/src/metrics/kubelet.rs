//! The kubelet's own metric names, beside swiftlet's: what the dashboards and alert rules
//! written for the kubelet query (`kubelet_running_pods`, `kubelet_pleg_relist_duration_seconds`,
//! `kubelet_runtime_operations_total`, ...), with the kubelet's label names and values and its
//! histogram buckets, so that their quantiles read the same on a swiftlet node.
//!
//! Where a swiftlet metric means exactly what the kubelet's does (a count or a gauge), the same
//! value is registered under both names; histograms whose buckets differ are observed twice.
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The kubelet's `operation_type` label (runtime operations, pod worker updates).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationType {
    pub operation_type: &'static str,
}

/// `kubelet_running_containers`' label: `created`, `running`, `exited` or `unknown`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ContainerState {
    pub container_state: &'static str,
}

/// `kubelet_started_containers_total`'s label: `container` or `init_container` (sidecars are
/// init containers to the kubelet).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ContainerType {
    pub container_type: &'static str,
}

/// `kubelet_started_containers_errors_total`'s labels: the container type and the failure's
/// reason (`CreateContainerError`, `ErrImagePull`, ...), as the kubelet's `code`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ContainerTypeCode {
    pub container_type: &'static str,
    pub code: &'static str,
}

/// `kubelet_evictions`' label: the signal the pod was evicted for (`memory.available`,
/// `ephemeralpodfs.limit`, ...).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EvictionSignal {
    pub eviction_signal: &'static str,
}

/// `kubelet_cgroup_manager_duration_seconds`: one histogram per `operation_type` (`create`,
/// `update`, `destroy`), observed by the container manager.
pub type CgroupManagerDurations = Family<OperationType, Histogram, fn() -> Histogram>;

/// `storage_operation_duration_seconds`' labels, as the kubelet's: the volume plugin
/// (`kubernetes.io/empty-dir` ...), the operation (`volume_mount`), `success` or `fail-unknown`,
/// and `migrated` (always `false`: swiftlet has no in-tree volume migrated to CSI).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StorageOperation {
    pub volume_plugin: &'static str,
    pub operation_name: &'static str,
    pub status: &'static str,
    pub migrated: &'static str,
}

/// `storage_operation_duration_seconds`: one histogram per volume plugin, operation and
/// outcome, with the kubelet's buckets (0.1 s .. 600 s).
pub type StorageOperations = Family<StorageOperation, Histogram, fn() -> Histogram>;

fn storage_histogram() -> Histogram {
    Histogram::new([
        0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0,
    ])
}

/// Records one volume operation of `volume_plugin` that took `seconds` in `family`.
pub fn observe_storage_operation(
    family: &StorageOperations,
    volume_plugin: &'static str,
    operation_name: &'static str,
    ok: bool,
    seconds: f64,
) {
    family
        .get_or_create(&StorageOperation {
            volume_plugin,
            operation_name,
            status: if ok { "success" } else { "fail-unknown" },
            migrated: "false",
        })
        .observe(seconds);
}

/// `kubelet_node_name`'s label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabel {
    pub node: String,
}

/// Prometheus' default buckets (5 ms .. 10 s), which most kubelet histograms use.
const DEFAULT_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// `kubelet_pod_start_duration_seconds`' buckets (0.5 s .. 1 h).
const POD_START_BUCKETS: [f64; 25] = [
    0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0,
    300.0, 360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
];

fn default_histogram() -> Histogram {
    Histogram::new(DEFAULT_BUCKETS)
}

/// `kubelet_runtime_operations_duration_seconds`' buckets: 5 ms times powers of 2.5, 14 of them.
fn runtime_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.5, 14))
}

/// The kubelet's `operation_type` of a CRI method (`RunPodSandbox` is `run_podsandbox`).
pub fn operation_type(method: &'static str) -> &'static str {
    match method {
        "Version" => "version",
        "Status" => "status",
        "RunPodSandbox" => "run_podsandbox",
        "StopPodSandbox" => "stop_podsandbox",
        "RemovePodSandbox" => "remove_podsandbox",
        "PodSandboxStatus" => "podsandbox_status",
        "ListPodSandbox" => "list_podsandbox",
        "CreateContainer" => "create_container",
        "StartContainer" => "start_container",
        "StopContainer" => "stop_container",
        "RemoveContainer" => "remove_container",
        "ListContainers" => "list_containers",
        "ContainerStatus" => "container_status",
        "UpdateContainerResources" => "update_container",
        "ReopenContainerLog" => "reopen_container_log",
        "ExecSync" => "exec_sync",
        "Exec" => "exec",
        "Attach" => "attach",
        "PortForward" => "port_forward",
        "ContainerStats" => "container_stats",
        "ListContainerStats" => "list_container_stats",
        "PodSandboxStats" => "podsandbox_stats",
        "ListPodSandboxStats" => "list_podsandbox_stats",
        "UpdateRuntimeConfig" => "update_runtime_config",
        "ListImages" => "list_images",
        "ImageStatus" => "image_status",
        "PullImage" => "pull_image",
        "RemoveImage" => "remove_image",
        "ImageFsInfo" => "image_fs_info",
        other => other,
    }
}

/// The kubelet-named metrics that are not a swiftlet metric under a second name.
#[derive(Clone)]
pub struct KubeletMetrics {
    pub node_name: Family<NodeLabel, Gauge>,
    pub running_containers: Family<ContainerState, Gauge>,
    pub pleg_relist_duration_seconds: Histogram,
    pub pleg_relist_interval_seconds: Histogram,
    pub pod_start_duration_seconds: Histogram,
    pub pod_worker_duration_seconds: Family<OperationType, Histogram, fn() -> Histogram>,
    pub runtime_operations_total: Family<OperationType, Counter>,
    pub runtime_operations_errors_total: Family<OperationType, Counter>,
    pub runtime_operations_duration_seconds: Family<OperationType, Histogram, fn() -> Histogram>,
    pub started_containers_total: Family<ContainerType, Counter>,
    pub started_containers_errors_total: Family<ContainerTypeCode, Counter>,
    pub evictions: Family<EvictionSignal, Counter>,
    pub cgroup_manager_duration_seconds: CgroupManagerDurations,
    pub volume_stats: VolumeStatsGauges,
    /// Registered without the `kubelet_` prefix, as the kubelet's.
    pub storage_operation_duration_seconds: StorageOperations,
}

/// Swiftlet metrics that mean what a kubelet metric means, registered again under its name.
pub struct Shared {
    pub running_pods: Gauge,
    pub pleg_discard_events: Counter,
    pub pleg_last_seen_seconds: Gauge,
    pub started_pods: Counter,
}

/// `kubelet_volume_stats_*`' labels: the claim's namespace and name.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClaimLabels {
    pub namespace: String,
    pub persistentvolumeclaim: String,
}

/// The kubelet's gauges of each claim's volume, from its last measurement.
#[derive(Clone, Default)]
pub struct VolumeStatsGauges {
    pub capacity_bytes: Family<ClaimLabels, Gauge>,
    pub available_bytes: Family<ClaimLabels, Gauge>,
    pub used_bytes: Family<ClaimLabels, Gauge>,
    pub inodes: Family<ClaimLabels, Gauge>,
    pub inodes_free: Family<ClaimLabels, Gauge>,
    pub inodes_used: Family<ClaimLabels, Gauge>,
}

/// One claim's volume as measured: capacity, available and used bytes, inodes, free and used
/// inodes.
pub struct ClaimVolume {
    pub labels: ClaimLabels,
    pub values: [u64; 6],
}

impl VolumeStatsGauges {
    fn register(&self, registry: &mut Registry) {
        let gauges = [
            (
                "volume_stats_capacity_bytes",
                "Capacity in bytes of the volume",
                &self.capacity_bytes,
            ),
            (
                "volume_stats_available_bytes",
                "Number of available bytes in the volume",
                &self.available_bytes,
            ),
            (
                "volume_stats_used_bytes",
                "Number of used bytes in the volume",
                &self.used_bytes,
            ),
            (
                "volume_stats_inodes",
                "Maximum number of inodes in the volume",
                &self.inodes,
            ),
            (
                "volume_stats_inodes_free",
                "Number of free inodes in the volume",
                &self.inodes_free,
            ),
            (
                "volume_stats_inodes_used",
                "Number of used inodes in the volume",
                &self.inodes_used,
            ),
        ];
        for (name, help, family) in gauges {
            registry.register(name, help, family.clone());
        }
    }

    /// Shows exactly `claims` (a claim no longer measured leaves no series behind).
    pub fn set(&self, claims: &[ClaimVolume]) {
        let families = [
            &self.capacity_bytes,
            &self.available_bytes,
            &self.used_bytes,
            &self.inodes,
            &self.inodes_free,
            &self.inodes_used,
        ];
        for (i, family) in families.into_iter().enumerate() {
            family.clear();
            for c in claims {
                let v = i64::try_from(c.values[i]).unwrap_or(i64::MAX);
                family.get_or_create(&c.labels).set(v);
            }
        }
    }
}

impl KubeletMetrics {
    /// Makes the kubelet's metrics and registers them, and `shared`, in `registry` (which
    /// prefixes them with `kubelet`).
    pub fn register(registry: &mut Registry, shared: Shared) -> Self {
        let m = Self {
            node_name: Family::default(),
            running_containers: Family::default(),
            pleg_relist_duration_seconds: default_histogram(),
            pleg_relist_interval_seconds: default_histogram(),
            pod_start_duration_seconds: Histogram::new(POD_START_BUCKETS),
            pod_worker_duration_seconds: Family::new_with_constructor(default_histogram),
            runtime_operations_total: Family::default(),
            runtime_operations_errors_total: Family::default(),
            runtime_operations_duration_seconds: Family::new_with_constructor(runtime_histogram),
            started_containers_total: Family::default(),
            started_containers_errors_total: Family::default(),
            evictions: Family::default(),
            cgroup_manager_duration_seconds: Family::new_with_constructor(default_histogram),
            volume_stats: VolumeStatsGauges::default(),
            storage_operation_duration_seconds: Family::new_with_constructor(storage_histogram),
        };
        m.volume_stats.register(registry);
        registry.register(
            "node_name",
            "The node's name. The count is always 1",
            m.node_name.clone(),
        );
        registry.register(
            "running_pods",
            "Number of pods that have a running pod sandbox",
            shared.running_pods,
        );
        registry.register(
            "running_containers",
            "Number of containers currently running, by state (as the last relist found them)",
            m.running_containers.clone(),
        );
        registry.register(
            "pleg_relist_duration_seconds",
            "Duration in seconds for relisting pods in PLEG",
            m.pleg_relist_duration_seconds.clone(),
        );
        registry.register(
            "pleg_relist_interval_seconds",
            "Interval in seconds between relisting in PLEG",
            m.pleg_relist_interval_seconds.clone(),
        );
        registry.register(
            "pleg_discard_events",
            "The number of discard events in PLEG",
            shared.pleg_discard_events,
        );
        registry.register(
            "pleg_last_seen_seconds",
            "Timestamp in seconds when PLEG was last seen active",
            shared.pleg_last_seen_seconds,
        );
        registry.register(
            "pod_start_duration_seconds",
            "Duration in seconds from kubelet seeing a pod for the first time to the pod starting \
             to run",
            m.pod_start_duration_seconds.clone(),
        );
        registry.register(
            "pod_worker_duration_seconds",
            "Duration in seconds to sync a single pod. Broken down by operation type: create, \
             update, sync or kill",
            m.pod_worker_duration_seconds.clone(),
        );
        registry.register(
            "runtime_operations",
            "Cumulative number of runtime operations by operation type",
            m.runtime_operations_total.clone(),
        );
        registry.register(
            "runtime_operations_errors",
            "Cumulative number of runtime operation errors by operation type",
            m.runtime_operations_errors_total.clone(),
        );
        registry.register(
            "runtime_operations_duration_seconds",
            "Duration in seconds of runtime operations. Broken down by operation type",
            m.runtime_operations_duration_seconds.clone(),
        );
        registry.register(
            "started_pods",
            "Cumulative number of pods started",
            shared.started_pods,
        );
        registry.register(
            "started_containers",
            "Cumulative number of containers started (attempts), by container type",
            m.started_containers_total.clone(),
        );
        registry.register(
            "started_containers_errors",
            "Cumulative number of errors when starting containers, by container type and code",
            m.started_containers_errors_total.clone(),
        );
        registry.register(
            "evictions",
            "Cumulative number of pod evictions by eviction signal",
            m.evictions.clone(),
        );
        registry.register(
            "cgroup_manager_duration_seconds",
            "Duration in seconds for cgroup manager operations. Broken down by method",
            m.cgroup_manager_duration_seconds.clone(),
        );
        m
    }

    /// Sets `kubelet_running_containers` from the count of containers in each CRI state
    /// (`CONTAINER_CREATED`, `_RUNNING`, `_EXITED`, `_UNKNOWN`, in that order).
    pub fn set_running_containers(&self, by_state: [i64; 4]) {
        for (state, n) in ["created", "running", "exited", "unknown"]
            .into_iter()
            .zip(by_state)
        {
            self.running_containers
                .get_or_create(&ContainerState {
                    container_state: state,
                })
                .set(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claims_volume_series_are_exactly_the_claims_measured() {
        let mut registry = Registry::with_prefix("kubelet");
        let gauges = VolumeStatsGauges::default();
        gauges.register(&mut registry);
        let claim = |name: &str| ClaimVolume {
            labels: ClaimLabels {
                namespace: "default".into(),
                persistentvolumeclaim: name.into(),
            },
            values: [100, 60, 40, 10, 7, 3],
        };
        let text = |r: &Registry| {
            let mut out = String::new();
            prometheus_client::encoding::text::encode(&mut out, r).expect("encode");
            out
        };
        gauges.set(&[claim("db"), claim("logs")]);
        let got = text(&registry);
        for line in [
            "kubelet_volume_stats_capacity_bytes{namespace=\"default\",persistentvolumeclaim=\"db\"} 100",
            "kubelet_volume_stats_available_bytes{namespace=\"default\",persistentvolumeclaim=\"db\"} 60",
            "kubelet_volume_stats_used_bytes{namespace=\"default\",persistentvolumeclaim=\"logs\"} 40",
            "kubelet_volume_stats_inodes{namespace=\"default\",persistentvolumeclaim=\"db\"} 10",
            "kubelet_volume_stats_inodes_free{namespace=\"default\",persistentvolumeclaim=\"db\"} 7",
            "kubelet_volume_stats_inodes_used{namespace=\"default\",persistentvolumeclaim=\"db\"} 3",
        ] {
            assert!(got.contains(line), "{line} not in {got}");
        }
        // A claim no longer measured leaves no series behind.
        gauges.set(&[claim("db")]);
        assert!(!text(&registry).contains("\"logs\""));
    }

    #[test]
    fn cri_methods_get_the_kubelets_operation_types() {
        assert_eq!(operation_type("RunPodSandbox"), "run_podsandbox");
        assert_eq!(operation_type("PodSandboxStatus"), "podsandbox_status");
        assert_eq!(
            operation_type("UpdateContainerResources"),
            "update_container"
        );
        assert_eq!(operation_type("ImageFsInfo"), "image_fs_info");
        assert_eq!(operation_type("NotACriMethod"), "NotACriMethod");
    }
}
