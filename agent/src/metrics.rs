//! Prometheus metrics (prometheus-client). One registry per agent; components hold cheap clones of
//! the metric handles they update. `/metrics` serves swiftlet's own (`swiftlet_*`), the kubelet's
//! names ([`kubelet`]), the API-server clients' ([`rest_client`]) and the process'
//! ([`process`]); `/metrics/probes` the prober's ([`probes`]).
pub mod kubelet;
pub mod probes;
pub mod process;
pub mod rest_client;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::Arc;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabel {
    pub operation: &'static str,
}

/// Labels of `swiftlet_cri_deadline_exceeded_total`: the CRI method whose deadline passed.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabel {
    pub method: &'static str,
}

/// Labels of `swiftlet_node_api_requests_total`: which membership request (`register`,
/// `status`, `lease`, `pod_status`, `pod_delete`, `mirror_create`, `mirror_delete`; the Node
/// watch's failures as `node_watch`; the heartbeat client made anew after repeated failures as
/// `reconnect`) and how it ended (`ok`, `conflict`, `unauthorized`, `forbidden`, `not_found`,
/// `server_error`, `tls`, `timeout`, `unreachable`, `kubeconfig`, `expired`, `error`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeApiLabel {
    pub operation: &'static str,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabel {
    pub source: &'static str,
}

/// Labels of `swiftlet_config_errors_total`: which pod source, and a short reason
/// (`syntax`, `wrong_kind`, `bad_name`, `no_containers`, `duplicate_name`, `fetch`, ...).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConfigErrorLabel {
    pub source: &'static str,
    pub reason: &'static str,
}

/// Labels of `swiftlet_pleg_fast_path_relists_total`: whether the pod's relist found a change.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: &'static str,
}

/// Labels of `swiftlet_ebpf_exits_dropped_total`: why a container exit the probes saw was not
/// handed to the PLEG (`table_full`, `channel_full`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

/// Labels of `swiftlet_prober_probe_total`: `Liveness` / `Readiness` / `Startup`, and
/// `successful` / `failed` / `unknown` (as the kubelet's `prober_probe_total`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeLabel {
    pub probe_type: &'static str,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    pub phase: String,
}

/// 50 µs .. ~52 s in factors of 2: fine enough for sub-millisecond agent phases.
fn phase_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.00005, 2.0, 21))
}

/// The kubelet's buckets for `pleg_relist_duration_seconds` (Prometheus' defaults, 5 ms .. 10 s,
/// so its dashboards' quantiles read the same here) and two finer ones below them.
fn relist_histogram() -> Histogram {
    Histogram::new([
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ])
}

fn millisecond_histogram() -> Histogram {
    // 0.5 ms .. ~65 s: fine enough to tell CRI calls and pod-start phases apart.
    Histogram::new(exponential_buckets(0.0005, 2.0, 18))
}

/// Every metric the agent exports. Cloning shares the underlying values.
/// The content type of the text [`Metrics::encode`] and [`probes::ProbeMetrics::encode`] write:
/// OpenMetrics (counters declared without `_total`, a closing `# EOF`).
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The content type of the Prometheus text format ([`to_prometheus_text`]).
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Whether a request's `Accept` header asks for OpenMetrics (Prometheus' scrapes do; most other
/// clients, and `promtool`, read the Prometheus text format, which the kubelet serves them).
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| a.contains("application/openmetrics-text"))
}

/// The Prometheus text format (0.0.4) of an OpenMetrics body: a counter family is declared by
/// its samples' `_total` name, and the `# UNIT` and `# EOF` lines go.
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    // A family's HELP line waits for its TYPE line, which says whether it is a counter.
    let mut help: Option<&str> = None;
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            if let Some(h) = help.replace(rest) {
                out.push_str("# HELP ");
                out.push_str(h);
                out.push('\n');
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            let name = if kind == "counter" && !name.ends_with("_total") {
                format!("{name}_total")
            } else {
                name.to_owned()
            };
            if let Some(h) = help.take() {
                let text = h.split_once(' ').map_or("", |(_, t)| t);
                out.push_str(&format!("# HELP {name} {text}\n"));
            }
            out.push_str(&format!("# TYPE {name} {kind}\n"));
            continue;
        }
        if let Some(h) = help.take() {
            out.push_str("# HELP ");
            out.push_str(h);
            out.push('\n');
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    /// The kubelet's names for what the dashboards written for it read.
    pub kubelet: kubelet::KubeletMetrics,
    /// `/metrics/probes`.
    pub probes: probes::ProbeMetrics,
    /// `rest_client_requests_total`: give it to [`rest_client::client`].
    pub rest_client_requests: rest_client::Requests,
    pub runtime_operations_duration_seconds: Family<OperationLabel, Histogram, fn() -> Histogram>,
    pub runtime_operations_errors_total: Family<OperationLabel, Counter>,
    pub cri_deadline_exceeded_total: Family<MethodLabel, Counter>,
    pub config_errors_total: Family<ConfigErrorLabel, Counter>,
    pub pod_start_duration_seconds: Histogram,
    pub pod_worker_duration_seconds: Family<OperationLabel, Histogram, fn() -> Histogram>,
    pub started_pods_total: Counter,
    /// Kubelet API connections closed unserved because [`crate::server::kubelet_api`] already
    /// served its most at once.
    pub kubelet_api_connections_refused_total: Counter,
    pub started_containers_total: Counter,
    pub running_pods: Gauge,
    pub tokio_alive_tasks: Gauge,
    pub ebpf_events_total: Counter,
    pub ebpf_reader_drains_total: Counter,
    pub ebpf_reader_empty_drains_total: Counter,
    pub ebpf_reader_wakeups_total: Counter,
    pub pod_start_phase_duration_seconds: Family<PhaseLabel, Histogram, fn() -> Histogram>,
    pub pleg_relist_duration_seconds: Histogram,
    pub pleg_relist_interval_seconds: Histogram,
    pub pleg_discard_events_total: Counter,
    pub stale_sandbox_objects_removed_total: Counter,
    pub pleg_last_seen_seconds: Gauge,
    pub runtime_ready: Gauge,
    pub pleg_fast_path_relists_total: Family<ResultLabel, Counter>,
    pub pleg_safety_net: Gauge,
    pub pleg_kernel_path_distrusted_total: Family<ReasonLabel, Counter>,
    pub prober_probe_total: Family<ProbeLabel, Counter>,
    pub ebpf_exits_total: Counter,
    pub ebpf_exits_dropped_total: Family<ReasonLabel, Counter>,
    pub admission_rejections_total: Family<ReasonLabel, Counter>,
    pub runtime_pod_state_reads_total: Family<SourceLabel, Counter>,
    pub container_log_rotations_total: Counter,
    pub container_log_rotation_errors_total: Counter,
    pub container_log_rotation_pass_duration_seconds: Histogram,
    pub image_gc_removed_total: Counter,
    pub image_gc_freed_bytes_total: Counter,
    pub image_gc_pass_duration_seconds: Histogram,
    pub node_api_requests_total: Family<NodeApiLabel, Counter>,
    pub pod_status_write_delay_seconds: Histogram,
    pub otlp_spans_exported_total: Counter,
    pub otlp_spans_dropped_total: Family<ReasonLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut root = Registry::default();
        let registry = root.sub_registry_with_prefix("swiftlet");
        let runtime_operations_duration_seconds =
            Family::<OperationLabel, Histogram, fn() -> Histogram>::new_with_constructor(
                millisecond_histogram,
            );
        registry.register(
            "runtime_operations_duration_seconds",
            "Duration of CRI calls, by method",
            runtime_operations_duration_seconds.clone(),
        );
        let runtime_operations_errors_total = Family::<OperationLabel, Counter>::default();
        registry.register(
            "runtime_operations_errors",
            "Failed CRI calls, by method",
            runtime_operations_errors_total.clone(),
        );
        let cri_deadline_exceeded_total = Family::<MethodLabel, Counter>::default();
        registry.register(
            "cri_deadline_exceeded",
            "CRI calls abandoned at their deadline (--runtime-request-timeout), by method; also \
             counted in runtime_operations_errors",
            cri_deadline_exceeded_total.clone(),
        );
        let config_errors_total = Family::<ConfigErrorLabel, Counter>::default();
        registry.register(
            "config_errors",
            "Pod configuration rejected (unreadable, unparsable or invalid manifests, failed fetches), by source and reason",
            config_errors_total.clone(),
        );
        let pod_start_duration_seconds = millisecond_histogram();
        registry.register(
            "pod_start_duration_seconds",
            "From the agent first seeing a pod to it being observed Running",
            pod_start_duration_seconds.clone(),
        );
        let pod_worker_duration_seconds =
            Family::<OperationLabel, Histogram, fn() -> Histogram>::new_with_constructor(
                millisecond_histogram,
            );
        registry.register(
            "pod_worker_duration_seconds",
            "Time a pod worker spent on one update, by kind",
            pod_worker_duration_seconds.clone(),
        );
        let started_pods_total = Counter::default();
        registry.register(
            "started_pods",
            "Pod sandboxes created",
            started_pods_total.clone(),
        );
        let kubelet_api_connections_refused_total = Counter::default();
        registry.register(
            "kubelet_api_connections_refused",
            "Kubelet API connections closed unserved: the agent already served its most at once",
            kubelet_api_connections_refused_total.clone(),
        );
        let started_containers_total = Counter::default();
        registry.register(
            "started_containers",
            "Containers started",
            started_containers_total.clone(),
        );
        let running_pods = Gauge::default();
        registry.register(
            "running_pods",
            "Pods with a ready sandbox",
            running_pods.clone(),
        );
        let tokio_alive_tasks = Gauge::default();
        registry.register(
            "tokio_alive_tasks",
            "Tasks alive in the agent's async runtime (read when /metrics is served)",
            tokio_alive_tasks.clone(),
        );
        let ebpf_events_total = Counter::default();
        registry.register(
            "ebpf_events",
            "Events read from the eBPF ring buffer",
            ebpf_events_total.clone(),
        );
        let ebpf_reader_drains_total = Counter::default();
        registry.register(
            "ebpf_reader_drains",
            "Times the eBPF reader drained its ring buffer (after the kernel woke it for records, and \
             every 10 ms while records keep coming)",
            ebpf_reader_drains_total.clone(),
        );
        let ebpf_reader_empty_drains_total = Counter::default();
        registry.register(
            "ebpf_reader_empty_drains",
            "eBPF reader drains that found no record (one ends each burst of records)",
            ebpf_reader_empty_drains_total.clone(),
        );
        let ebpf_reader_wakeups_total = Counter::default();
        registry.register(
            "ebpf_reader_wakeups",
            "Times the kernel woke the eBPF reader for records (none while it polls during a burst)",
            ebpf_reader_wakeups_total.clone(),
        );
        let pod_start_phase_duration_seconds =
            Family::<PhaseLabel, Histogram, fn() -> Histogram>::new_with_constructor(
                phase_histogram,
            );
        registry.register(
            "pod_start_phase_duration_seconds",
            "Pod start broken into phases (agent marks, CRI calls and eBPF-observed kernel \
             events on one clock), by phase",
            pod_start_phase_duration_seconds.clone(),
        );
        let pleg_relist_duration_seconds = relist_histogram();
        registry.register(
            "pleg_relist_duration_seconds",
            "Duration of a PLEG relist of every pod (with the status reads of changed pods)",
            pleg_relist_duration_seconds.clone(),
        );
        let pleg_relist_interval_seconds = millisecond_histogram();
        registry.register(
            "pleg_relist_interval_seconds",
            "Time between the starts of two PLEG relists",
            pleg_relist_interval_seconds.clone(),
        );
        let pleg_discard_events_total = Counter::default();
        registry.register(
            "pleg_discard_events",
            "PLEG events dropped because the sync loop's channel was full",
            pleg_discard_events_total.clone(),
        );
        let stale_sandbox_objects_removed_total = Counter::default();
        registry.register(
            "stale_sandbox_objects_removed",
            "Dead sandboxes of live pods, and the superseded exited containers in them, removed",
            stale_sandbox_objects_removed_total.clone(),
        );
        let pleg_last_seen_seconds = Gauge::default();
        registry.register(
            "pleg_last_seen_seconds",
            "Unix time of the last successful PLEG relist",
            pleg_last_seen_seconds.clone(),
        );
        let runtime_ready = Gauge::default();
        registry.register(
            "runtime_ready",
            "1 while the container runtime answers (the last PLEG relist succeeded), else 0",
            runtime_ready.clone(),
        );
        let pleg_fast_path_relists_total = Family::<ResultLabel, Counter>::default();
        registry.register(
            "pleg_fast_path_relists",
            "Relists of one pod triggered by the eBPF probes (its container's main process \
             exited or its cgroup was removed), by whether the runtime showed a change; \
             skipped: not relisted, the agent was stopping that pod or container itself",
            pleg_fast_path_relists_total.clone(),
        );
        let pleg_safety_net = Gauge::default();
        registry.register(
            "pleg_safety_net",
            "1 while the PLEG relists only every --pleg-safety-net-period (the eBPF probes report \
             every container exit), 0 while it relists every --pleg-relist-period",
            pleg_safety_net.clone(),
        );
        let pleg_kernel_path_distrusted_total = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "pleg_kernel_path_distrusted",
            "Times the PLEG went back to relisting every --pleg-relist-period, by reason: \
             events_lost (the probes lost events or the exit detector dropped one), probes_stopped, \
             runtime_error (a relist or a pod read failed), exit_unrecorded (the runtime had not \
             recorded an exit the kernel saw within the fast path's retries)",
            pleg_kernel_path_distrusted_total.clone(),
        );
        let ebpf_exits_total = Counter::default();
        registry.register(
            "ebpf_exits",
            "Container exits the eBPF probes saw (main process exit or container cgroup removed) \
             handed to the PLEG",
            ebpf_exits_total.clone(),
        );
        let admission_rejections_total = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "admission_rejections",
            "Pods rejected at admission, by reason (OutOfpods: over --max-pods; OutOfcpu, \
             OutOfmemory, NodeAffinity, NodeName, NodePorts, TaintToleration: the kubelet's \
             predicates)",
            admission_rejections_total.clone(),
        );
        let node_api_requests_total = Family::<NodeApiLabel, Counter>::default();
        registry.register(
            "node_api_requests",
            "Requests of cluster membership to the API server (Node registration, node status, \
             Lease renewal), by operation and result",
            node_api_requests_total.clone(),
        );
        let pod_status_write_delay_seconds = millisecond_histogram();
        registry.register(
            "pod_status_write_delay_seconds",
            "From a pod's status change in the status manager to its patch answered by the API \
             server",
            pod_status_write_delay_seconds.clone(),
        );
        let ebpf_exits_dropped_total = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "ebpf_exits_dropped",
            "Container exits the eBPF probes saw that the PLEG's fast path did not get (the \
             periodic relist still finds them): table_full, a container tracked no more to \
             bound memory; channel_full, the PLEG was behind",
            ebpf_exits_dropped_total.clone(),
        );
        let prober_probe_total = Family::<ProbeLabel, Counter>::default();
        registry.register(
            "prober_probe",
            "Probe runs, by probe type and result",
            prober_probe_total.clone(),
        );
        let runtime_pod_state_reads_total = Family::<SourceLabel, Counter>::default();
        registry.register(
            "runtime_pod_state_reads",
            "Reads of one pod's full runtime state (ListPodSandbox, ListContainers, \
             PodSandboxStatus, one ContainerStatus per container), by who read: pleg, fast_path, \
             sync (a sync's own read), worker (after a sync that changed the pod), kill; handoff \
             counts syncs that took the PLEG's read instead of reading",
            runtime_pod_state_reads_total.clone(),
        );
        let container_log_rotations_total = Counter::default();
        registry.register(
            "container_log_rotations",
            "Container logs rotated (renamed and reopened by the runtime) at \
             --container-log-max-size",
            container_log_rotations_total.clone(),
        );
        let container_log_rotation_errors_total = Counter::default();
        registry.register(
            "container_log_rotation_errors",
            "Container logs whose check or rotation failed (retried next pass)",
            container_log_rotation_errors_total.clone(),
        );
        let container_log_rotation_pass_duration_seconds = phase_histogram();
        registry.register(
            "container_log_rotation_pass_duration_seconds",
            "Duration of one container log rotation pass over the running containers \
             (every --container-log-monitor-interval)",
            container_log_rotation_pass_duration_seconds.clone(),
        );
        let image_gc_removed_total = Counter::default();
        registry.register(
            "image_garbage_collected",
            "Images removed by image garbage collection (--image-gc-high-threshold)",
            image_gc_removed_total.clone(),
        );
        let image_gc_freed_bytes_total = Counter::default();
        registry.register(
            "image_garbage_collected_bytes",
            "Bytes of the images removed by image garbage collection (their sizes as the \
             runtime reports them)",
            image_gc_freed_bytes_total.clone(),
        );
        let image_gc_pass_duration_seconds = phase_histogram();
        registry.register(
            "image_gc_pass_duration_seconds",
            "Duration of one image garbage collection pass (every --image-gc-period)",
            image_gc_pass_duration_seconds.clone(),
        );
        let otlp_spans_exported_total = Counter::default();
        registry.register(
            "otlp_spans_exported",
            "Spans of pod starts the OTLP collector of tracing.endpoint took",
            otlp_spans_exported_total.clone(),
        );
        let otlp_spans_dropped_total = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "otlp_spans_dropped",
            "Spans of sampled pod starts not exported, by reason: queue_full (the exporter was \
             behind), export_failed (the collector did not take them)",
            otlp_spans_dropped_total.clone(),
        );
        let kubelet = kubelet::KubeletMetrics::register(
            root.sub_registry_with_prefix("kubelet"),
            kubelet::Shared {
                running_pods: running_pods.clone(),
                pleg_discard_events: pleg_discard_events_total.clone(),
                pleg_last_seen_seconds: pleg_last_seen_seconds.clone(),
                started_pods: started_pods_total.clone(),
            },
        );
        root.register(
            "storage_operation_duration_seconds",
            "Storage operation duration",
            kubelet.storage_operation_duration_seconds.clone(),
        );
        root.register_collector(Box::new(process::ProcessCollector));
        let rest_client_requests = rest_client::Requests::default();
        root.register(
            "rest_client_requests",
            "Number of HTTP requests to the API server, partitioned by status code, method, and host",
            rest_client_requests.clone(),
        );
        Self {
            registry: Arc::new(root),
            kubelet,
            rest_client_requests,
            probes: probes::ProbeMetrics::default(),
            otlp_spans_exported_total,
            otlp_spans_dropped_total,
            image_gc_removed_total,
            image_gc_freed_bytes_total,
            image_gc_pass_duration_seconds,
            container_log_rotations_total,
            container_log_rotation_errors_total,
            container_log_rotation_pass_duration_seconds,
            runtime_pod_state_reads_total,
            pleg_relist_duration_seconds,
            pleg_relist_interval_seconds,
            pleg_discard_events_total,
            stale_sandbox_objects_removed_total,
            pleg_last_seen_seconds,
            runtime_ready,
            pleg_fast_path_relists_total,
            pleg_safety_net,
            pleg_kernel_path_distrusted_total,
            prober_probe_total,
            ebpf_exits_total,
            ebpf_exits_dropped_total,
            admission_rejections_total,
            node_api_requests_total,
            pod_status_write_delay_seconds,
            pod_start_phase_duration_seconds,
            runtime_operations_duration_seconds,
            runtime_operations_errors_total,
            cri_deadline_exceeded_total,
            config_errors_total,
            pod_start_duration_seconds,
            pod_worker_duration_seconds,
            started_pods_total,
            kubelet_api_connections_refused_total,
            started_containers_total,
            running_pods,
            tokio_alive_tasks,
            ebpf_events_total,
            ebpf_reader_drains_total,
            ebpf_reader_empty_drains_total,
            ebpf_reader_wakeups_total,
        }
    }

    /// `kubelet_node_name{node}` = 1.
    pub fn set_node_name(&self, node: &str) {
        self.kubelet
            .node_name
            .get_or_create(&kubelet::NodeLabel {
                node: node.to_owned(),
            })
            .set(1);
    }

    /// Records one CRI call of `method` that took `secs`, under swiftlet's name and the
    /// kubelet's.
    pub fn runtime_operation(&self, method: &'static str, secs: f64, failed: bool) {
        let label = OperationLabel { operation: method };
        let kubelet = kubelet::OperationType {
            operation_type: kubelet::operation_type(method),
        };
        self.runtime_operations_duration_seconds
            .get_or_create(&label)
            .observe(secs);
        self.kubelet
            .runtime_operations_duration_seconds
            .get_or_create(&kubelet)
            .observe(secs);
        self.kubelet
            .runtime_operations_total
            .get_or_create(&kubelet)
            .inc();
        if failed {
            self.runtime_operations_errors_total
                .get_or_create(&label)
                .inc();
            self.kubelet
                .runtime_operations_errors_total
                .get_or_create(&kubelet)
                .inc();
        }
    }

    /// Records one pod worker update of kind `operation` that took `secs`.
    pub fn pod_worker(&self, operation: &'static str, secs: f64) {
        self.pod_worker_duration_seconds
            .get_or_create(&OperationLabel { operation })
            .observe(secs);
        self.kubelet
            .pod_worker_duration_seconds
            .get_or_create(&kubelet::OperationType {
                operation_type: operation,
            })
            .observe(secs);
    }

    /// Records a pod's start: `secs` from its first sight to Running observed.
    pub fn pod_started(&self, secs: f64) {
        self.pod_start_duration_seconds.observe(secs);
        self.kubelet.pod_start_duration_seconds.observe(secs);
    }

    /// Records a PLEG relist that took `secs`.
    pub fn relisted(&self, secs: f64) {
        self.pleg_relist_duration_seconds.observe(secs);
        self.kubelet.pleg_relist_duration_seconds.observe(secs);
    }

    /// Records `secs` between the starts of two PLEG relists.
    pub fn relist_interval(&self, secs: f64) {
        self.pleg_relist_interval_seconds.observe(secs);
        self.kubelet.pleg_relist_interval_seconds.observe(secs);
    }

    /// Counts one attempt to start a container of the kubelet's `container_type` (`container`,
    /// `init_container`); `failed`: the reason it did not start. swiftlet's count is of
    /// containers started, the kubelet's of attempts and of errors.
    pub fn container_start(&self, container_type: &'static str, failed: Option<&'static str>) {
        self.kubelet
            .started_containers_total
            .get_or_create(&kubelet::ContainerType { container_type })
            .inc();
        match failed {
            None => {
                self.started_containers_total.inc();
            }
            Some(code) => {
                self.kubelet
                    .started_containers_errors_total
                    .get_or_create(&kubelet::ContainerTypeCode {
                        container_type,
                        code,
                    })
                    .inc();
            }
        }
    }

    /// Counts one pod evicted for `signal`.
    pub fn evicted(&self, signal: &'static str) {
        self.kubelet
            .evictions
            .get_or_create(&kubelet::EvictionSignal {
                eviction_signal: signal,
            })
            .inc();
    }

    /// Counts one pod rejected at admission.
    pub fn admission_rejection(&self, reason: &'static str) {
        self.admission_rejections_total
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    /// Counts one membership request to the API server.
    pub fn node_api_request(&self, operation: &'static str, result: &'static str) {
        self.node_api_requests_total
            .get_or_create(&NodeApiLabel { operation, result })
            .inc();
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> String {
        encode_registry(&self.registry)
    }
}

/// The OpenMetrics text of `registry`.
fn encode_registry(registry: &Registry) -> String {
    let mut out = String::new();
    // Encoding into a String cannot fail except on fmt errors, which String never returns.
    if let Err(err) = prometheus_client::encoding::text::encode(&mut out, registry) {
        tracing::error!(%err, "encoding metrics");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubelets_names_carry_the_same_values_as_swiftlets() {
        let m = Metrics::new();
        m.set_node_name("node-a");
        m.runtime_operation("RunPodSandbox", 0.3, false);
        m.runtime_operation("RunPodSandbox", 0.01, true);
        m.pod_worker("create", 0.02);
        m.pod_started(1.5);
        m.relisted(0.004);
        m.running_pods.set(3);
        m.started_pods_total.inc();
        m.kubelet.set_running_containers([1, 4, 2, 0]);
        m.container_start("container", None);
        m.container_start("init_container", None);
        m.container_start("container", Some("CreateContainerError"));
        m.evicted("memory.available");
        let text = m.encode();
        for line in [
            "kubelet_started_containers_total{container_type=\"container\"} 2",
            "kubelet_started_containers_total{container_type=\"init_container\"} 1",
            "kubelet_started_containers_errors_total{container_type=\"container\",code=\"CreateContainerError\"} 1",
            "swiftlet_started_containers_total 2",
            "kubelet_evictions_total{eviction_signal=\"memory.available\"} 1",
            "kubelet_node_name{node=\"node-a\"} 1",
            "kubelet_runtime_operations_total{operation_type=\"run_podsandbox\"} 2",
            "kubelet_runtime_operations_errors_total{operation_type=\"run_podsandbox\"} 1",
            "swiftlet_runtime_operations_errors_total{operation=\"RunPodSandbox\"} 1",
            "kubelet_runtime_operations_duration_seconds_bucket{le=\"0.48828125\",operation_type=\"run_podsandbox\"} 2",
            "kubelet_runtime_operations_duration_seconds_bucket{le=\"0.1953125\",operation_type=\"run_podsandbox\"} 1",
            "kubelet_pod_worker_duration_seconds_count{operation_type=\"create\"} 1",
            "swiftlet_pod_worker_duration_seconds_count{operation=\"create\"} 1",
            "kubelet_pod_start_duration_seconds_bucket{le=\"2.0\"} 1",
            "kubelet_pod_start_duration_seconds_bucket{le=\"1.0\"} 0",
            "kubelet_pleg_relist_duration_seconds_bucket{le=\"0.005\"} 1",
            "kubelet_running_pods 3",
            "swiftlet_running_pods 3",
            "kubelet_started_pods_total 1",
            "kubelet_running_containers{container_state=\"running\"} 4",
            "kubelet_running_containers{container_state=\"exited\"} 2",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing from\n{text}"
            );
        }
        assert!(text.contains("\nprocess_resident_memory_bytes "), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn the_prometheus_text_format_declares_counters_by_their_total_name() {
        let m = Metrics::new();
        m.runtime_operation("RunPodSandbox", 0.3, false);
        let text = to_prometheus_text(&m.encode());
        let at = |line: &str| {
            text.lines()
                .position(|l| l == line)
                .unwrap_or_else(|| panic!("{line} missing from\n{text}"))
        };
        let help = at(
            "# HELP kubelet_runtime_operations_total Cumulative number of runtime \
                       operations by operation type.",
        );
        let kind = at("# TYPE kubelet_runtime_operations_total counter");
        let sample = at("kubelet_runtime_operations_total{operation_type=\"run_podsandbox\"} 1");
        assert!(help < kind && kind < sample);
        at("# TYPE kubelet_running_pods gauge");
        at("# TYPE kubelet_pleg_relist_duration_seconds histogram");
        assert!(!text.contains("# EOF"), "{text}");
        assert!(
            !text.contains("# TYPE kubelet_runtime_operations counter"),
            "{text}"
        );
        assert!(wants_openmetrics(Some(
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
        )));
        assert!(!wants_openmetrics(Some("text/plain")));
        assert!(!wants_openmetrics(None));
    }
}
