//! The command line and the `--config` file (a KubeletConfiguration YAML subset), as the kubelet
//! takes them: [`Flags`] are the agent's own flags (no config-file field: `--config`,
//! `--kubeconfig`, `--root-dir`, ...); [`KubeletConfiguration`] is the file's fields, each with
//! the flag that sets it, one struct serving both. [`parse`] reads the file and binds every flag
//! given on the command line over it (a flag wins over the file), and [`AgentConfig::new`]
//! applies the defaults, checks the values and hands each component its settings.
pub mod doc;

use clap::{Args, CommandFactory, FromArgMatches, Parser};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A flag clap refused, or `--help` / `--version` (print it with `clap::Error::exit`).
    #[error(transparent)]
    Usage(#[from] clap::Error),
    #[error("reading config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing config file {path}: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: Box<serde_saphyr::Error>,
    },
    #[error("config file {path}: kind {kind:?} is not KubeletConfiguration")]
    Kind { path: PathBuf, kind: String },
    #[error(
        "config file {path}: apiVersion {version:?} is not kubelet.config.k8s.io/v1beta1 \
         (or kubelet.config.k8s.io/v1)"
    )]
    ApiVersion { path: PathBuf, version: String },
    #[error("{what}: invalid duration {value:?} (use Go-style durations like 20s, 1m, 1m30s)")]
    Duration { what: &'static str, value: String },
    #[error("--cgroup-driver {0:?}: expected cgroupfs or systemd")]
    CgroupDriver(String),
    #[error("--ebpf {0:?}: expected auto, on or off")]
    Ebpf(String),
    #[error("--ebpf on: {}", crate::ebpf::Error::NotBuilt)]
    EbpfNotBuilt,
    #[error("determining the node name: {0}")]
    Hostname(String),
    #[error("{what} {value:?}: must be at least {min:?}")]
    TooShort {
        what: &'static str,
        value: Duration,
        min: Duration,
    },
    #[error("--pleg-relist-period {0:?}: must be at least 1ms")]
    RelistPeriod(Duration),
    #[error("--runtime-request-timeout {0:?}: must be more than zero")]
    RequestTimeout(Duration),
    #[error("--cluster-dns {0:?}: not an IP address")]
    ClusterDns(String),
    #[error("--max-parallel-image-pulls {0}: must be at least 1")]
    MaxParallelImagePulls(i64),
    #[error(
        "--max-parallel-image-pulls {0} needs --serialize-image-pulls=false (serialized pulls run \
         one at a time)"
    )]
    SerializedParallelPulls(i64),
    #[error(transparent)]
    ContainerLogs(#[from] crate::logs::Error),
    #[error(transparent)]
    ImageGc(#[from] crate::images::gc::Error),
    #[error("--authorization-mode {0:?}: expected AlwaysAllow or Webhook")]
    AuthorizationMode(String),
    #[error("{0} asks the API server, which needs --kubeconfig")]
    WebhookWithoutApi(&'static str),
    #[error(
        "{field} is unset in the --config file and defaults there to {default} (as the kubelet's \
         config file does), which asks the API server and needs --kubeconfig; set {field} in the \
         file to run without an API server"
    )]
    FileDefaultWithoutApi {
        field: &'static str,
        default: &'static str,
    },
    #[error(
        "--anonymous-auth with --authorization-mode AlwaysAllow lets anyone who reaches the \
         kubelet API exec into every pod: use --authorization-mode Webhook, turn anonymous \
         access off, or give --insecure-anonymous-always-allow to run so anyway"
    )]
    AnonymousAlwaysAllow,
    #[error("--tls-cert-file and --tls-private-key-file go together: give both or neither")]
    TlsPair,
    #[error(transparent)]
    Eviction(#[from] crate::eviction::Error),
    #[error(
        "--enforce-node-allocatable {0:?}: only \"pods\" and \"none\" are implemented \
         (system-reserved and kube-reserved need cgroups of their own, which swiftlet does not manage)"
    )]
    EnforceNodeAllocatable(String),
    #[error(transparent)]
    Node(#[from] crate::node::Error),
}

/// swiftlet: a node agent that does the kubelet's job, faster and observably.
///
/// Flags follow the kubelet's names and defaults. Settings can also come from a
/// KubeletConfiguration YAML file given with --config; command-line flags win.
///
/// These are the flags with no config-file field; [`KubeletConfiguration`]'s flags are added to
/// them by [`command`].
#[derive(Debug, Parser, Default)]
#[command(name = "swiftlet", version = crate::VERSION, about, long_about = None)]
pub struct Flags {
    /// KubeletConfiguration file (YAML). docs/configuration.md lists every field swiftlet reads
    /// and the flag that overrides it; a flag given on the command line wins over the file.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// kubeconfig of the API server to take this node's pods from (source "api"), and to read
    /// the RuntimeClass a pod's runtimeClassName names and its image pull secrets (any
    /// source's pods).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Node name [default: the host name].
    #[arg(long, value_name = "NAME")]
    pub hostname_override: Option<String>,
    /// Directory for the agent's own state [default: /var/lib/swiftlet]. Its `config.json` (or
    /// `.dockercfg`) holds the node's image pull credentials, searched first.
    #[arg(long, value_name = "DIR")]
    pub root_dir: Option<PathBuf>,
    /// Where the self-signed serving certificate is kept (kubelet.crt, kubelet.key)
    /// [default: <root-dir>/pki].
    #[arg(long, value_name = "DIR")]
    pub cert_dir: Option<PathBuf>,
    /// Start even when anonymous kubelet API callers (--anonymous-auth) meet
    /// --authorization-mode AlwaysAllow: anyone who reaches the port may then exec into every
    /// pod. Refused without this flag [default: false].
    #[arg(long)]
    pub insecure_anonymous_always_allow: bool,
    /// CA certificates (PEM) an https:// --manifest-url server's certificate must chain to,
    /// instead of the system's root certificates.
    #[arg(long, value_name = "FILE")]
    pub manifest_url_ca_file: Option<PathBuf>,
    /// The Node's InternalIP addresses (comma-separated, one per family) [default: the address
    /// of the default route's interface].
    #[arg(long, value_name = "IP,...", value_delimiter = ',')]
    pub node_ip: Vec<IpAddr>,
    /// eBPF probes: auto (load what can be loaded, warn otherwise), on (fail without them), off.
    #[arg(long, value_name = "MODE", default_value = "auto")]
    pub ebpf: String,
    /// How often the PLEG relists the runtime (swiftlet's own flag; the kubelet's is fixed at
    /// 1s). With eBPF a container's exit is relisted at once anyway [default: 1s].
    #[arg(long, value_name = "DURATION")]
    pub pleg_relist_period: Option<GoDuration>,
    /// How often the PLEG relists while the eBPF probes report every container exit (swiftlet's
    /// own flag): the relist is then a safety net, and goes back to --pleg-relist-period at once
    /// when the probes lose an event or the runtime errs. At or below --pleg-relist-period (0
    /// included), the PLEG always relists every --pleg-relist-period [default: 60s].
    #[arg(long, value_name = "DURATION")]
    pub pleg_safety_net_period: Option<GoDuration>,
    /// How often image garbage collection looks (swiftlet's own flag; the kubelet's period is
    /// fixed at 5m) [default: 5m].
    #[arg(long, value_name = "DURATION")]
    pub image_gc_period: Option<GoDuration>,
    /// Dead instances kept per container of a pod, the newest; negative: no limit [default: 1].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub maximum_dead_containers_per_container: Option<i64>,
    /// Dead containers kept on the node in all (each pod's container keeps an even share, at
    /// least one, then the oldest go); negative: no limit [default: -1].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub maximum_dead_containers: Option<i64>,
    /// A dead container younger than this is never garbage collected [default: 0].
    #[arg(long, value_name = "DURATION")]
    pub minimum_container_ttl_duration: Option<GoDuration>,
    /// How often the eviction manager observes the signals (swiftlet's own; the kubelet's is
    /// fixed at 10s) [default: 10s].
    #[arg(long, value_name = "DURATION")]
    pub eviction_monitoring_interval: Option<GoDuration>,
    /// Log verbosity like the kubelet's -v (0-2 info, 3-4 debug, 5+ trace). RUST_LOG overrides.
    #[arg(short = 'v', long = "v", value_name = "LEVEL", default_value_t = 0)]
    pub verbosity: u8,
    /// Log format: text, or json (one JSON object a line: timestamp, level, target, message
    /// and the event's fields). Text has colours only when stderr is a terminal [default: text].
    #[arg(long, value_name = "FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub logging_format: String,
}

/// The KubeletConfiguration fields swiftlet reads, each settable by its flag too: the file's
/// fields come first and every flag given on the command line is bound over them ([`parse`]).
/// A field's clap id is its path in the file, so docs/configuration.md pairs each field with
/// its flag from this struct alone. Map-valued fields (`evictionHard`, `nodeLabels`, ...) are
/// kept in the flag's form, one `<key><sep><value>` entry each, so one parser reads both.
///
/// Other fields of the file are not refused, as a kubelet config written for the Go kubelet
/// carries many fields swiftlet does not implement, but [`AgentConfig::new`] names them in a
/// warning.
#[derive(Debug, Default, Deserialize, Args)]
#[serde(rename_all = "camelCase")]
#[command(next_help_heading = "Configuration (each flag sets the --config field of its id)")]
pub struct KubeletConfiguration {
    #[arg(skip)]
    pub api_version: Option<String>,
    #[arg(skip)]
    pub kind: Option<String>,
    /// The fields swiftlet does not read, by name.
    #[serde(flatten)]
    #[arg(skip)]
    pub unknown: BTreeMap<String, serde_json::Value>,
    /// Directory (or single file) of static pod manifests.
    #[arg(id = "staticPodPath", long = "pod-manifest-path", value_name = "PATH")]
    pub static_pod_path: Option<PathBuf>,
    /// CRI endpoint of the container runtime (unix:// URL). A runtime that does not answer at
    /// start is waited for (retried every 0.5 s doubling to 5 s, each failure logged)
    /// [default: unix:///run/containerd/containerd.sock].
    #[arg(
        id = "containerRuntimeEndpoint",
        long = "container-runtime-endpoint",
        value_name = "URL"
    )]
    pub container_runtime_endpoint: Option<String>,
    /// Deadline of each CRI call, except image pulls, which have none: RunPodSandbox gets twice
    /// it, StopContainer the grace period more, ExecSync the command's timeout more. A call past
    /// its deadline fails, and the pod's sync is retried as after any error [default: 2m].
    #[arg(
        id = "runtimeRequestTimeout",
        long = "runtime-request-timeout",
        value_name = "DURATION"
    )]
    pub runtime_request_timeout: Option<GoDuration>,
    /// Root cgroup for pod cgroups [default: /].
    #[arg(id = "cgroupRoot", long = "cgroup-root", value_name = "PATH")]
    pub cgroup_root: Option<String>,
    /// Create the kubepods/burstable/besteffort QoS cgroup hierarchy [default: true].
    #[serde(rename = "cgroupsPerQOS")]
    #[arg(id = "cgroupsPerQOS", long = "cgroups-per-qos", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub cgroups_per_qos: Option<bool>,
    /// Cgroup driver: cgroupfs (swiftlet writes the cgroup file system) or systemd (pod cgroups
    /// are slices created through systemd; the runtime must use systemd cgroups too)
    /// [default: cgroupfs].
    #[arg(id = "cgroupDriver", long = "cgroup-driver", value_name = "DRIVER")]
    pub cgroup_driver: Option<String>,
    /// Maximum number of processes in each pod (`pids.max` of the pod cgroup); -1 or 0: no
    /// limit [default: -1].
    #[arg(
        id = "podPidsLimit",
        long = "pod-max-pids",
        value_name = "N",
        allow_negative_numbers = true
    )]
    pub pod_pids_limit: Option<i64>,
    /// Address of the healthz server [default: 127.0.0.1].
    #[arg(
        id = "healthzBindAddress",
        long = "healthz-bind-address",
        value_name = "IP"
    )]
    pub healthz_bind_address: Option<IpAddr>,
    /// Port of the healthz server; 0 disables it [default: 10248].
    #[arg(id = "healthzPort", long = "healthz-port", value_name = "PORT")]
    pub healthz_port: Option<u16>,
    /// Read-only port (/pods, /metrics, /debug) bound to 127.0.0.1, without authentication:
    /// /pods shows full pod specs, env values included, to every local user. Off unless asked
    /// for, as on a hardened kubelet; the kubelet's old port is 10255 [default: 0 (off)].
    #[arg(id = "readOnlyPort", long = "read-only-port", value_name = "PORT")]
    pub read_only_port: Option<u16>,
    /// How often the manifest path is rescanned (inotify catches changes in between) [default: 20s].
    #[arg(
        id = "fileCheckFrequency",
        long = "file-check-frequency",
        value_name = "DURATION"
    )]
    pub file_check_frequency: Option<GoDuration>,
    /// How often a running pod is synced again without an event (jittered by up to 50%); each
    /// sync rewrites its configMap, secret, downwardAPI and projected volumes [default: 1m].
    #[arg(id = "syncFrequency", long = "sync-frequency", value_name = "DURATION")]
    pub sync_frequency: Option<GoDuration>,
    /// Directory of pod logs written by the runtime [default: /var/log/pods]. Each container's
    /// log is also linked into its sibling directory `containers` (/var/log/containers by
    /// default), where log shippers read it.
    #[arg(id = "podLogsDir", long = "pod-logs-dir", value_name = "DIR")]
    pub pod_logs_dir: Option<PathBuf>,
    /// URL of pod manifests (a Pod or a PodList, YAML or JSON), fetched every
    /// --http-check-frequency: https:// (verified against the system's roots or
    /// --manifest-url-ca-file) or http:// (a warning unless to the loopback).
    #[serde(rename = "staticPodURL")]
    #[arg(id = "staticPodURL", long = "manifest-url", value_name = "URL")]
    pub static_pod_url: Option<String>,
    /// HTTP headers for --manifest-url: comma-separated 'Name:Value' pairs; repeatable. Headers
    /// with the same name are all sent, in the order given. (In the file: a map of header name
    /// to a list of values.)
    #[serde(
        rename = "staticPodURLHeader",
        default,
        deserialize_with = "header_map"
    )]
    #[arg(
        id = "staticPodURLHeader",
        long = "manifest-url-header",
        value_name = "NAME:VALUE,...",
        value_delimiter = ','
    )]
    pub static_pod_url_header: Option<Vec<Header>>,
    /// How often --manifest-url is fetched [default: 20s].
    #[arg(
        id = "httpCheckFrequency",
        long = "http-check-frequency",
        value_name = "DURATION"
    )]
    pub http_check_frequency: Option<GoDuration>,
    /// How often each pod's volumes are measured for /stats/summary (the bytes and inodes below
    /// each volume's directory, and its file system's size), off the request path; 0 turns it
    /// off [default: 1m].
    #[arg(
        id = "volumeStatsAggPeriod",
        long = "volume-stats-agg-period",
        value_name = "DURATION"
    )]
    pub volume_stats_agg_period: Option<GoDuration>,
    /// Unsafe sysctls (or prefixes ending in `*`, e.g. `kernel.msg*`) pods may set beyond the
    /// safe set; comma-separated, repeatable.
    #[arg(
        id = "allowedUnsafeSysctls",
        long = "allowed-unsafe-sysctls",
        value_name = "NAME,...",
        value_delimiter = ','
    )]
    pub allowed_unsafe_sysctls: Option<Vec<String>>,
    /// Containers without a seccomp profile run the runtime's default profile (RuntimeDefault)
    /// instead of none (Unconfined) [default: false].
    #[arg(id = "seccompDefault", long = "seccomp-default", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub seccomp_default: Option<bool>,
    /// Most pods this node runs at once; a pod over it is rejected (phase Failed, reason
    /// OutOfpods) [default: 110].
    #[arg(id = "maxPods", long = "max-pods", value_name = "N")]
    pub max_pods: Option<u32>,
    /// IP addresses of the cluster's DNS servers, comma-separated, repeatable: the nameservers
    /// of pods with dnsPolicy ClusterFirst (and ClusterFirstWithHostNet). Without any, those pods
    /// get the node's resolver configuration (the Default policy) and a warning is logged.
    #[serde(rename = "clusterDNS")]
    #[arg(
        id = "clusterDNS",
        long = "cluster-dns",
        value_name = "IP,...",
        value_delimiter = ','
    )]
    pub cluster_dns: Option<Vec<String>>,
    /// The cluster's DNS domain (kubeadm uses cluster.local): ClusterFirst pods search
    /// <namespace>.svc.<domain>, svc.<domain> and <domain> before the node's search domains
    /// [default: none].
    #[arg(id = "clusterDomain", long = "cluster-domain", value_name = "DOMAIN")]
    pub cluster_domain: Option<String>,
    /// Resolver configuration file the pods' DNS configuration starts from (the Default policy
    /// takes it whole, ClusterFirst its search domains); "" means none: Default pods then
    /// resolve through the node itself (nameserver 127.0.0.1) [default: /etc/resolv.conf].
    #[arg(id = "resolvConf", long = "resolv-conf", value_name = "FILE")]
    pub resolv_conf: Option<String>,
    /// A container's log is rotated once it reaches this size (a quantity: 10Mi, 64Ki, 1G);
    /// negative turns rotation off [default: 10Mi].
    #[arg(
        id = "containerLogMaxSize",
        long = "container-log-max-size",
        value_name = "QUANTITY",
        allow_negative_numbers = true
    )]
    pub container_log_max_size: Option<String>,
    /// Log files kept per container: the current one and at most this many minus one rotated
    /// ones, all but the newest gzip-compressed; at least 2 [default: 5].
    #[arg(
        id = "containerLogMaxFiles",
        long = "container-log-max-files",
        value_name = "N",
        allow_negative_numbers = true
    )]
    pub container_log_max_files: Option<i64>,
    /// How often the running containers' logs are checked for rotation; at least 3s
    /// [default: 10s].
    #[arg(
        id = "containerLogMonitorInterval",
        long = "container-log-monitor-interval",
        value_name = "DURATION"
    )]
    pub container_log_monitor_interval: Option<GoDuration>,
    /// Containers whose logs are checked and rotated at once; at least 1 [default: 1].
    #[arg(
        id = "containerLogMaxWorkers",
        long = "container-log-max-workers",
        value_name = "N",
        allow_negative_numbers = true
    )]
    pub container_log_max_workers: Option<i64>,
    /// Image garbage collection starts when the image file system is at least this full
    /// (percent; 100 turns it off) [default: 85].
    #[serde(rename = "imageGCHighThresholdPercent")]
    #[arg(
        id = "imageGCHighThresholdPercent",
        long = "image-gc-high-threshold",
        value_name = "PERCENT",
        allow_negative_numbers = true
    )]
    pub image_gc_high_threshold_percent: Option<i64>,
    /// ... and removes unused images, least recently used first, until the use is down to this
    /// percent; below the high threshold [default: 80].
    #[serde(rename = "imageGCLowThresholdPercent")]
    #[arg(
        id = "imageGCLowThresholdPercent",
        long = "image-gc-low-threshold",
        value_name = "PERCENT",
        allow_negative_numbers = true
    )]
    pub image_gc_low_threshold_percent: Option<i64>,
    /// An image first seen less than this long ago is never collected [default: 2m].
    #[serde(rename = "imageMinimumGCAge")]
    #[arg(
        id = "imageMinimumGCAge",
        long = "image-minimum-gc-age",
        value_name = "DURATION"
    )]
    pub image_minimum_gc_age: Option<GoDuration>,
    /// An image no container has used for this long is removed whatever the disk use; 0 turns
    /// it off. Must exceed --image-minimum-gc-age [default: 0].
    #[serde(rename = "imageMaximumGCAge")]
    #[arg(
        id = "imageMaximumGCAge",
        long = "image-maximum-gc-age",
        value_name = "DURATION"
    )]
    pub image_maximum_gc_age: Option<GoDuration>,
    /// Pull one image at a time (the kubelet's default is true; swiftlet's is false: distinct
    /// images pull in parallel, and pods asking for one image wait for one pull of it)
    /// [default: false].
    #[arg(id = "serializeImagePulls", long = "serialize-image-pulls", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub serialize_image_pulls: Option<bool>,
    /// At most this many image pulls at once; at least 1, and only with
    /// --serialize-image-pulls=false [default: no limit].
    #[arg(
        id = "maxParallelImagePulls",
        long = "max-parallel-image-pulls",
        value_name = "N",
        allow_negative_numbers = true
    )]
    pub max_parallel_image_pulls: Option<i64>,
    /// Port of the kubelet API (HTTPS: /containerLogs, /exec, /attach, /portForward, /run,
    /// /pods, /metrics, /healthz); 0 turns it off (swiftlet's own) [default: 10250].
    #[arg(id = "port", long = "port", value_name = "PORT")]
    pub port: Option<u16>,
    /// Address the kubelet API listens on [default: 0.0.0.0].
    #[arg(id = "address", long = "address", value_name = "IP")]
    pub address: Option<IpAddr>,
    /// The kubelet API's serving certificate (PEM, leaf first); without it a self-signed one is
    /// made in --cert-dir.
    #[arg(id = "tlsCertFile", long = "tls-cert-file", value_name = "FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert-file.
    #[arg(
        id = "tlsPrivateKeyFile",
        long = "tls-private-key-file",
        value_name = "FILE"
    )]
    pub tls_private_key_file: Option<PathBuf>,
    /// How long an exec, attach or port-forward stream through the kubelet API may pass no
    /// byte either way before it is closed; 0: no limit [default: 4h].
    #[arg(
        id = "streamingConnectionIdleTimeout",
        long = "streaming-connection-idle-timeout",
        value_name = "DURATION"
    )]
    pub streaming_connection_idle_timeout: Option<GoDuration>,
    #[serde(default)]
    #[command(flatten)]
    pub authentication: Authentication,
    #[serde(default)]
    #[command(flatten)]
    pub authorization: Authorization,
    #[serde(default)]
    #[command(flatten)]
    pub tracing: Tracing,
    /// Register this node with the API server of --kubeconfig (create its Node object); off:
    /// only an existing Node's status is kept [default: true].
    #[arg(id = "registerNode", long = "register-node", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub register_node: Option<bool>,
    /// Labels of the Node at registration: <key>=<value>, comma-separated, repeatable. Keys of
    /// the kubernetes.io and k8s.io namespaces only with the prefixes kubelet.kubernetes.io and
    /// node.kubernetes.io or the well-known keys (topology.kubernetes.io/zone, ...).
    #[serde(default, deserialize_with = "map_with_equals")]
    #[arg(
        id = "nodeLabels",
        long = "node-labels",
        value_name = "KEY=VALUE,...",
        value_delimiter = ','
    )]
    pub node_labels: Option<Vec<String>>,
    /// Taints of the Node at registration: <key>[=<value>]:<effect>, comma-separated,
    /// repeatable; effect NoSchedule, PreferNoSchedule or NoExecute.
    #[serde(default, deserialize_with = "taint_list")]
    #[arg(
        id = "registerWithTaints",
        long = "register-with-taints",
        value_name = "TAINTS",
        value_delimiter = ','
    )]
    pub register_with_taints: Option<Vec<String>>,
    /// How often the node status is computed; it is written when it changed or
    /// nodeStatusReportFrequency (5m) passed [default: 10s].
    #[arg(
        id = "nodeStatusUpdateFrequency",
        long = "node-status-update-frequency",
        value_name = "DURATION"
    )]
    pub node_status_update_frequency: Option<GoDuration>,
    #[arg(skip)]
    pub node_status_report_frequency: Option<GoDuration>,
    /// How many images (the largest first) the node status lists; -1: all [default: 50].
    #[arg(
        id = "nodeStatusMaxImages",
        long = "node-status-max-images",
        value_name = "N",
        allow_negative_numbers = true
    )]
    pub node_status_max_images: Option<i32>,
    #[arg(skip)]
    pub node_lease_duration_seconds: Option<u32>,
    /// Resources reserved for the system (memory=<quantity>,...): pods may not use them; the
    /// allocatableMemory.available signal counts from capacity minus both reservations.
    #[serde(default, deserialize_with = "map_with_equals")]
    #[arg(
        id = "systemReserved",
        long = "system-reserved",
        value_name = "RESOURCES",
        value_delimiter = ','
    )]
    pub system_reserved: Option<Vec<String>>,
    /// Resources reserved for the node's Kubernetes daemons (memory=<quantity>,...).
    #[serde(default, deserialize_with = "map_with_equals")]
    #[arg(
        id = "kubeReserved",
        long = "kube-reserved",
        value_name = "RESOURCES",
        value_delimiter = ','
    )]
    pub kube_reserved: Option<Vec<String>>,
    /// Hard eviction thresholds: comma-separated <signal><<quantity or percent> (memory.available,
    /// allocatableMemory.available, nodefs.available, nodefs.inodesFree, imagefs.available,
    /// pid.available); "" for none [default: memory.available<100Mi,nodefs.available<10%,
    /// nodefs.inodesFree<5%,imagefs.available<15%].
    #[serde(default, deserialize_with = "map_with_less_than")]
    #[arg(
        id = "evictionHard",
        long = "eviction-hard",
        value_name = "THRESHOLDS",
        value_delimiter = ','
    )]
    pub eviction_hard: Option<Vec<String>>,
    /// Soft eviction thresholds, as --eviction-hard; each acted on only once met for its grace
    /// period in --eviction-soft-grace-period [default: none].
    #[serde(default, deserialize_with = "map_with_less_than")]
    #[arg(
        id = "evictionSoft",
        long = "eviction-soft",
        value_name = "THRESHOLDS",
        value_delimiter = ','
    )]
    pub eviction_soft: Option<Vec<String>>,
    /// Grace periods of the soft thresholds: comma-separated <signal>=<duration>
    /// (memory.available=1m30s).
    #[serde(default, deserialize_with = "map_with_equals")]
    #[arg(
        id = "evictionSoftGracePeriod",
        long = "eviction-soft-grace-period",
        value_name = "GRACE_PERIODS",
        value_delimiter = ','
    )]
    pub eviction_soft_grace_period: Option<Vec<String>>,
    /// Most seconds of grace a pod evicted for a soft threshold gets (less when its own is less;
    /// negative: its own) [default: 0].
    #[arg(
        id = "evictionMaxPodGracePeriod",
        long = "eviction-max-pod-grace-period",
        value_name = "SECONDS",
        allow_negative_numbers = true
    )]
    pub eviction_max_pod_grace_period: Option<i64>,
    /// Once a threshold is acted on, how much more than it must be available before it is no
    /// longer met: comma-separated <signal>=<quantity or percent> [default: none].
    #[serde(default, deserialize_with = "map_with_equals")]
    #[arg(
        id = "evictionMinimumReclaim",
        long = "eviction-minimum-reclaim",
        value_name = "AMOUNTS",
        value_delimiter = ','
    )]
    pub eviction_minimum_reclaim: Option<Vec<String>>,
    /// How long a node condition stays after its threshold is no longer met [default: 5m].
    #[arg(
        id = "evictionPressureTransitionPeriod",
        long = "eviction-pressure-transition-period",
        value_name = "DURATION"
    )]
    pub eviction_pressure_transition_period: Option<GoDuration>,
    /// Where node allocatable is enforced: "pods" (the kubepods cgroup gets cpu shares and a
    /// memory limit of capacity less --system-reserved and --kube-reserved) or "none";
    /// system-reserved and kube-reserved (their own cgroups) are not implemented [default: pods].
    #[arg(
        id = "enforceNodeAllocatable",
        long = "enforce-node-allocatable",
        value_name = "LEVELS",
        value_delimiter = ','
    )]
    pub enforce_node_allocatable: Option<Vec<String>>,
}

/// `authentication` of a KubeletConfiguration.
#[derive(Debug, Default, Deserialize, Args)]
#[serde(default)]
pub struct Authentication {
    #[command(flatten)]
    pub x509: X509Authentication,
    #[command(flatten)]
    pub anonymous: AnonymousAuthentication,
    #[command(flatten)]
    pub webhook: WebhookAuthentication,
}

#[derive(Debug, Default, Deserialize, Args)]
pub struct X509Authentication {
    /// CA certificates (PEM): a kubelet API client presenting a certificate they signed is
    /// authenticated as the certificate's common name (organizations are its groups).
    #[serde(rename = "clientCAFile")]
    #[arg(
        id = "authentication.x509.clientCAFile",
        long = "client-ca-file",
        value_name = "FILE"
    )]
    pub client_ca_file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize, Args)]
pub struct AnonymousAuthentication {
    /// Serve kubelet API requests that bring no client certificate, as system:anonymous. Off
    /// unless asked for (the Go kubelet's flag defaults to on; hardened set-ups turn it off)
    /// [default: false].
    #[arg(id = "authentication.anonymous.enabled", long = "anonymous-auth", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub enabled: Option<bool>,
}

/// `authentication.webhook`.
#[derive(Debug, Default, Deserialize, Args)]
pub struct WebhookAuthentication {
    /// Authenticate kubelet API bearer tokens with a TokenReview to the API server of
    /// --kubeconfig [default: true with --config, else false].
    #[arg(id = "authentication.webhook.enabled", long = "authentication-token-webhook", value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub enabled: Option<bool>,
    /// How long a TokenReview's answer is cached [default: 2m].
    #[serde(rename = "cacheTTL")]
    #[arg(
        id = "authentication.webhook.cacheTTL",
        long = "authentication-token-webhook-cache-ttl",
        value_name = "DURATION"
    )]
    pub cache_ttl: Option<GoDuration>,
}

/// `authorization` of a KubeletConfiguration.
#[derive(Debug, Default, Deserialize, Args)]
#[serde(default)]
pub struct Authorization {
    /// Authorization of kubelet API requests: AlwaysAllow (every authenticated caller may do
    /// everything) or Webhook (a SubjectAccessReview to the API server of --kubeconfig on
    /// nodes/<subresource> per request) [default: Webhook with --config, else AlwaysAllow].
    #[arg(
        id = "authorization.mode",
        long = "authorization-mode",
        value_name = "MODE"
    )]
    pub mode: Option<String>,
    #[command(flatten)]
    pub webhook: WebhookAuthorization,
}

/// `authorization.webhook`.
#[derive(Debug, Default, Deserialize, Args)]
pub struct WebhookAuthorization {
    /// How long an allowed Webhook decision is cached [default: 5m].
    #[serde(rename = "cacheAuthorizedTTL")]
    #[arg(
        id = "authorization.webhook.cacheAuthorizedTTL",
        long = "authorization-webhook-cache-authorized-ttl",
        value_name = "DURATION"
    )]
    pub cache_authorized_ttl: Option<GoDuration>,
    /// How long a denied Webhook decision is cached [default: 30s].
    #[serde(rename = "cacheUnauthorizedTTL")]
    #[arg(
        id = "authorization.webhook.cacheUnauthorizedTTL",
        long = "authorization-webhook-cache-unauthorized-ttl",
        value_name = "DURATION"
    )]
    pub cache_unauthorized_ttl: Option<GoDuration>,
}

/// `tracing` of a KubeletConfiguration: OTLP export of pod starts (`docs/observability.md`).
#[derive(Debug, Default, Deserialize, Args)]
#[serde(default, rename_all = "camelCase")]
pub struct Tracing {
    /// The OTLP/gRPC collector that receives each sampled pod start as a trace: host:port (or
    /// an http:// URL); unset: no export.
    #[arg(
        id = "tracing.endpoint",
        long = "tracing-endpoint",
        value_name = "HOST:PORT"
    )]
    pub endpoint: Option<String>,
    /// Pod starts exported per million (1000000: every one) [default: 0, as the kubelet's].
    #[arg(
        id = "tracing.samplingRatePerMillion",
        long = "tracing-sampling-rate-per-million",
        value_name = "N"
    )]
    pub sampling_rate_per_million: Option<u32>,
}

/// The whole command line: [`Flags`] and [`KubeletConfiguration`]'s flags.
pub fn command() -> clap::Command {
    let flags = Flags::command();
    // The configuration's doc comment would otherwise become the program's description.
    let about = flags.get_about().cloned().unwrap_or_default();
    KubeletConfiguration::augment_args(flags)
        .about(about)
        .long_about(None)
}

/// Parses the command line `args` (program name first) as the kubelet does: the `--config`
/// file is read first (none: every field unset), then each flag given on the command line is
/// bound over its field. Defaults are applied later, by [`AgentConfig::new`].
pub fn parse<I, T>(args: I) -> Result<(Flags, KubeletConfiguration), Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let matches = command().try_get_matches_from(args)?;
    let flags = Flags::from_arg_matches(&matches)?;
    let mut config = match &flags.config {
        Some(path) => KubeletConfiguration::load(path)?,
        None => KubeletConfiguration::default(),
    };
    config.update_from_arg_matches(&matches)?;
    Ok((flags, config))
}

/// Everything the agent needs, defaults applied.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub pod_manifest_path: Option<PathBuf>,
    pub container_runtime_endpoint: String,
    /// `--runtime-request-timeout` / `runtimeRequestTimeout`: the deadline of CRI calls.
    pub runtime_request_timeout: Duration,
    pub root_dir: PathBuf,
    pub pod_logs_dir: PathBuf,
    pub node_name: String,
    pub cgroup_root: String,
    pub cgroups_per_qos: bool,
    /// `--cgroup-driver systemd` / `cgroupDriver: systemd`: pod cgroups are systemd slices.
    pub systemd_cgroups: bool,
    /// `--pod-max-pids` / `podPidsLimit`: pids.max of each pod cgroup when > 0.
    pub pod_pids_limit: i64,
    pub healthz_bind_address: IpAddr,
    pub healthz_port: u16,
    pub read_only_port: u16,
    pub file_check_frequency: Duration,
    /// `--sync-frequency` / `syncFrequency`: the periodic resync of a running pod.
    pub sync_frequency: Duration,
    /// `--manifest-url`, its headers (in order) and fetch period.
    pub manifest_url: Option<String>,
    pub manifest_url_headers: Vec<(String, String)>,
    /// `--manifest-url-ca-file`.
    pub manifest_url_ca_file: Option<PathBuf>,
    pub http_check_frequency: Duration,
    /// `--volume-stats-agg-period` / `volumeStatsAggPeriod` (zero: off).
    pub volume_stats_agg_period: Duration,
    /// `--kubeconfig`: the API server source.
    pub kubeconfig: Option<PathBuf>,
    pub ebpf: crate::ebpf::Mode,
    pub pleg_relist_period: Duration,
    /// `--pleg-safety-net-period`.
    pub pleg_safety_net_period: Duration,
    /// `--allowed-unsafe-sysctls`: names or prefixes ending in `*`.
    pub allowed_unsafe_sysctls: Vec<String>,
    /// `--seccomp-default`.
    pub seccomp_default: bool,
    /// `--max-pods` / `maxPods`.
    pub max_pods: u32,
    /// `--cluster-dns`, `--cluster-domain`, `--resolv-conf` (config `clusterDNS`,
    /// `clusterDomain`, `resolvConf`).
    pub dns: crate::dns::Settings,
    /// `--container-log-max-size`, `--container-log-max-files`,
    /// `--container-log-monitor-interval`, `--container-log-max-workers`.
    pub container_logs: crate::logs::Policy,
    /// `--image-gc-high-threshold`, `--image-gc-low-threshold`, `--image-minimum-gc-age`,
    /// `--image-gc-period`.
    pub image_gc: crate::images::gc::Policy,
    /// `--maximum-dead-containers-per-container`, `--maximum-dead-containers`,
    /// `--minimum-container-ttl-duration`.
    pub container_gc: crate::container_gc::Policy,
    /// `--serialize-image-pulls`, `--max-parallel-image-pulls`: pulls at once (`None`: no
    /// limit).
    pub max_parallel_image_pulls: Option<usize>,
    /// `--address`, `--port` (`None`: off), TLS files, `--anonymous-auth`.
    pub kubelet_api: Option<KubeletApi>,
    /// `--enforce-node-allocatable` names `pods`.
    pub enforce_node_allocatable: bool,
    /// `--eviction-hard` and the rest of the eviction manager's settings.
    pub eviction: crate::eviction::Config,
    /// Cluster membership (used when `kubeconfig` is set).
    pub node: crate::node::Config,
    /// `tracing.endpoint` and `tracing.samplingRatePerMillion`: where pod starts are exported
    /// over OTLP, and how many per million (`None`: no export).
    pub tracing: Option<(String, u32)>,
}

/// The kubelet API's settings.
#[derive(Debug, Clone)]
pub struct KubeletApi {
    pub addr: std::net::SocketAddr,
    pub tls: crate::server::tls::Files,
    pub anonymous: bool,
    /// Token and access reviews (they need `--kubeconfig`).
    pub webhook: crate::server::webhook::Settings,
    /// `--streaming-connection-idle-timeout` (`None`: no limit).
    pub stream_idle_timeout: Option<Duration>,
}

/// The KubeletConfiguration versions whose fields swiftlet reads.
const KUBELET_CONFIG_VERSIONS: [&str; 2] =
    ["kubelet.config.k8s.io/v1beta1", "kubelet.config.k8s.io/v1"];

pub const DEFAULT_RUNTIME_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";

impl KubeletConfiguration {
    pub fn load(path: &Path) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.to_owned(),
            source,
        })?;
        let cfg: Self =
            serde_saphyr::from_str_with_options(&text, crate::config::manifest::yaml_options())
                .map_err(|source| Error::Parse {
                    path: path.to_owned(),
                    source: Box::new(source),
                })?;
        if cfg.kind.as_deref() != Some("KubeletConfiguration") {
            return Err(Error::Kind {
                path: path.to_owned(),
                kind: cfg.kind.clone().unwrap_or_default(),
            });
        }
        let version = cfg.api_version.as_deref().unwrap_or_default();
        if !KUBELET_CONFIG_VERSIONS.contains(&version) {
            return Err(Error::ApiVersion {
                path: path.to_owned(),
                version: version.to_owned(),
            });
        }
        Ok(cfg)
    }
}

impl AgentConfig {
    /// The components' settings from the agent's flags and the configuration [`parse`] made:
    /// each unset field takes its default, and each value is checked, the error naming its
    /// flag.
    pub fn new(flags: Flags, cfg: KubeletConfiguration) -> Result<Self, Error> {
        if !cfg.unknown.is_empty() {
            let names: Vec<&str> = cfg.unknown.keys().map(String::as_str).collect();
            tracing::warn!(
                path = %flags.config.as_deref().unwrap_or(Path::new("")).display(),
                fields = %names.join(", "),
                "config file: fields swiftlet does not implement are ignored"
            );
        }
        let systemd_cgroups = match cfg.cgroup_driver.as_deref().unwrap_or("cgroupfs") {
            "cgroupfs" => false,
            "systemd" => true,
            other => return Err(Error::CgroupDriver(other.to_owned())),
        };
        let node_name = match flags.hostname_override {
            Some(n) => n,
            None => hostname()?,
        }
        .to_lowercase();
        let ebpf: crate::ebpf::Mode = flags
            .ebpf
            .parse()
            .map_err(|_| Error::Ebpf(flags.ebpf.clone()))?;
        if ebpf == crate::ebpf::Mode::On && !crate::ebpf::BUILT_IN {
            return Err(Error::EbpfNotBuilt);
        }
        let pleg_relist_period = duration_or(flags.pleg_relist_period, Duration::from_secs(1));
        if pleg_relist_period < Duration::from_millis(1) {
            return Err(Error::RelistPeriod(pleg_relist_period));
        }
        let runtime_request_timeout =
            duration_or(cfg.runtime_request_timeout, Duration::from_secs(120));
        if runtime_request_timeout.is_zero() {
            return Err(Error::RequestTimeout(runtime_request_timeout));
        }
        let resolv_conf = cfg
            .resolv_conf
            .unwrap_or_else(|| crate::dns::DEFAULT_RESOLV_CONF.to_owned());
        let dns = crate::dns::Settings {
            cluster_dns: cfg
                .cluster_dns
                .iter()
                .flatten()
                .filter(|ip| !ip.trim().is_empty())
                .map(|ip| ip.trim().parse().map_err(|_| Error::ClusterDns(ip.clone())))
                .collect::<Result<_, _>>()?,
            cluster_domain: cfg.cluster_domain.unwrap_or_default(),
            resolv_conf: (!resolv_conf.is_empty()).then(|| PathBuf::from(resolv_conf)),
            node_hosts: PathBuf::from(crate::dns::NODE_HOSTS),
        };
        let container_logs = crate::logs::Policy::new(
            cfg.container_log_max_size
                .as_deref()
                .unwrap_or(crate::logs::DEFAULT_MAX_SIZE),
            cfg.container_log_max_files
                .unwrap_or(crate::logs::DEFAULT_MAX_FILES),
            duration_or(
                cfg.container_log_monitor_interval,
                crate::logs::DEFAULT_MONITOR_INTERVAL,
            ),
            cfg.container_log_max_workers
                .unwrap_or(crate::logs::DEFAULT_MAX_WORKERS),
        )?;
        let limit = |v: Option<i64>, default: Option<usize>| match v {
            None => default,
            Some(n) => usize::try_from(n).ok(),
        };
        let container_gc = crate::container_gc::Policy {
            min_age: duration_or(flags.minimum_container_ttl_duration, Duration::ZERO),
            max_per_container: limit(
                flags.maximum_dead_containers_per_container,
                Some(crate::container_gc::MAX_DEAD_PER_CONTAINER),
            ),
            max_containers: limit(flags.maximum_dead_containers, None),
        };
        let max_parallel_image_pulls = image_pull_limit(
            cfg.serialize_image_pulls.unwrap_or(false),
            cfg.max_parallel_image_pulls,
        )?;
        let image_gc = crate::images::gc::Policy::new(
            cfg.image_gc_high_threshold_percent
                .unwrap_or(crate::images::gc::DEFAULT_HIGH_THRESHOLD),
            cfg.image_gc_low_threshold_percent
                .unwrap_or(crate::images::gc::DEFAULT_LOW_THRESHOLD),
            duration_or(
                cfg.image_minimum_gc_age,
                crate::images::gc::DEFAULT_MINIMUM_AGE,
            ),
            duration_or(flags.image_gc_period, crate::images::gc::DEFAULT_PERIOD),
        )?
        .with_max_age(duration_or(cfg.image_maximum_gc_age, Duration::ZERO))?;
        let root_dir = flags
            .root_dir
            .unwrap_or_else(|| PathBuf::from("/var/lib/swiftlet"));
        let pod_logs_dir = cfg
            .pod_logs_dir
            .unwrap_or_else(|| PathBuf::from("/var/log/pods"));
        let reserved = crate::eviction::Reserved::parse(entries(&cfg.system_reserved))?.plus(
            crate::eviction::Reserved::parse(entries(&cfg.kube_reserved))?,
        );
        let mut thresholds = match &cfg.eviction_hard {
            Some(hard) => crate::eviction::parse_thresholds(hard)?,
            None => crate::eviction::parse_thresholds(crate::eviction::DEFAULT_HARD)?,
        };
        let grace_periods = crate::eviction::parse_pairs(
            "--eviction-soft-grace-period",
            entries(&cfg.eviction_soft_grace_period),
        )?
        .into_iter()
        .map(|(signal, v)| Ok((signal, parse_duration("--eviction-soft-grace-period", v)?)))
        .collect::<Result<Vec<_>, Error>>()?;
        thresholds.extend(crate::eviction::parse_soft(
            entries(&cfg.eviction_soft),
            &grace_periods,
        )?);
        crate::eviction::apply_min_reclaim(
            &mut thresholds,
            entries(&cfg.eviction_minimum_reclaim),
        )?;
        let interval = duration_or(flags.eviction_monitoring_interval, Duration::from_secs(10));
        if interval < Duration::from_millis(100) {
            return Err(Error::TooShort {
                what: "--eviction-monitoring-interval",
                value: interval,
                min: Duration::from_millis(100),
            });
        }
        let eviction = crate::eviction::Config {
            thresholds,
            max_pod_grace_period: cfg.eviction_max_pod_grace_period.unwrap_or(0),
            pod_logs_dir: pod_logs_dir.clone(),
            interval,
            pressure_transition: duration_or(
                cfg.eviction_pressure_transition_period,
                Duration::from_secs(300),
            ),
            reserved_memory: reserved.memory,
            root_dir: root_dir.clone(),
        };
        let mut enforce_node_allocatable = false;
        for level in cfg
            .enforce_node_allocatable
            .unwrap_or_else(|| vec!["pods".to_owned()])
            .iter()
            .map(|l| l.trim())
            .filter(|l| !l.is_empty())
        {
            match level {
                "pods" => enforce_node_allocatable = true,
                "none" => {}
                other => return Err(Error::EnforceNodeAllocatable(other.to_owned())),
            }
        }
        let port = cfg.port.unwrap_or(10250);
        let max_pods = cfg.max_pods.unwrap_or(110);
        let node = crate::node::Config {
            node_name: node_name.clone(),
            hostname: node_name.clone(),
            register: cfg.register_node.unwrap_or(true),
            labels: crate::node::parse_labels(entries(&cfg.node_labels))?,
            taints: crate::node::parse_taints(entries(&cfg.register_with_taints))?,
            node_ips: flags.node_ip,
            max_pods,
            root_dir: root_dir.clone(),
            kubelet_port: port,
            status_update_frequency: duration_or(
                cfg.node_status_update_frequency,
                Duration::from_secs(10),
            ),
            status_report_frequency: duration_or(
                cfg.node_status_report_frequency,
                Duration::from_secs(300),
            ),
            max_images: cfg.node_status_max_images.unwrap_or(50),
            lease_duration: Duration::from_secs(
                cfg.node_lease_duration_seconds.unwrap_or(40).max(1).into(),
            ),
            reserved,
            eviction_hard: eviction.hard(),
        };
        let kubelet_api = kubelet_api(
            port,
            cfg.address,
            (cfg.tls_cert_file, cfg.tls_private_key_file),
            duration_or(
                cfg.streaming_connection_idle_timeout,
                Duration::from_secs(4 * 3600),
            ),
            flags.cert_dir.unwrap_or_else(|| root_dir.join("pki")),
            (cfg.authentication, cfg.authorization),
            Access {
                from_file: flags.config.is_some(),
                has_api: flags.kubeconfig.is_some(),
                insecure_anonymous_always_allow: flags.insecure_anonymous_always_allow,
            },
        )?;
        let tracing = cfg
            .tracing
            .endpoint
            .filter(|e| !e.is_empty())
            .map(|e| (e, cfg.tracing.sampling_rate_per_million.unwrap_or(0)));
        Ok(AgentConfig {
            tracing,
            systemd_cgroups,
            node,
            enforce_node_allocatable,
            eviction,
            kubelet_api,
            image_gc,
            container_gc,
            max_parallel_image_pulls,
            pod_manifest_path: cfg.static_pod_path,
            container_runtime_endpoint: cfg
                .container_runtime_endpoint
                .unwrap_or_else(|| DEFAULT_RUNTIME_ENDPOINT.to_owned()),
            runtime_request_timeout,
            root_dir,
            pod_logs_dir,
            node_name,
            cgroup_root: cfg.cgroup_root.unwrap_or_else(|| "/".to_owned()),
            cgroups_per_qos: cfg.cgroups_per_qos.unwrap_or(true),
            pod_pids_limit: cfg.pod_pids_limit.unwrap_or(-1),
            healthz_bind_address: cfg
                .healthz_bind_address
                .unwrap_or(IpAddr::from([127, 0, 0, 1])),
            healthz_port: cfg.healthz_port.unwrap_or(10248),
            read_only_port: cfg.read_only_port.unwrap_or(0),
            file_check_frequency: duration_or(cfg.file_check_frequency, Duration::from_secs(20)),
            sync_frequency: duration_or(cfg.sync_frequency, Duration::from_secs(60)),
            manifest_url: cfg.static_pod_url,
            manifest_url_headers: cfg
                .static_pod_url_header
                .into_iter()
                .flatten()
                .map(|Header(name, value)| (name, value))
                .collect(),
            http_check_frequency: duration_or(cfg.http_check_frequency, Duration::from_secs(20)),
            volume_stats_agg_period: duration_or(
                cfg.volume_stats_agg_period,
                Duration::from_secs(60),
            ),
            manifest_url_ca_file: flags.manifest_url_ca_file,
            kubeconfig: flags.kubeconfig,
            ebpf,
            pleg_relist_period,
            pleg_safety_net_period: duration_or(
                flags.pleg_safety_net_period,
                Duration::from_secs(60),
            ),
            allowed_unsafe_sysctls: cfg.allowed_unsafe_sysctls.unwrap_or_default(),
            seccomp_default: cfg.seccomp_default.unwrap_or(false),
            max_pods,
            dns,
            container_logs,
        })
    }
}

/// What decides the kubelet API's access defaults and checks besides its own settings.
struct Access {
    /// A `--config` file was given: unset fields take the KubeletConfiguration file's defaults
    /// (Webhook authorization, webhook authentication), as the kubelet's do; without a file,
    /// the flags' (AlwaysAllow, no webhook).
    from_file: bool,
    /// `--kubeconfig` was given: the webhooks can ask the API server.
    has_api: bool,
    /// `--insecure-anonymous-always-allow`.
    insecure_anonymous_always_allow: bool,
}

/// The kubelet API's settings (`None`: `port` is 0), with the webhooks' checks.
fn kubelet_api(
    port: u16,
    address: Option<IpAddr>,
    (cert, key): (Option<PathBuf>, Option<PathBuf>),
    stream_idle_timeout: Duration,
    cert_dir: PathBuf,
    (authentication, authorization): (Authentication, Authorization),
    access: Access,
) -> Result<Option<KubeletApi>, Error> {
    if port == 0 {
        return Ok(None);
    }
    let file_default = |field: &'static str, default: &'static str, unset: bool| {
        if access.from_file && unset && !access.has_api {
            return Err(Error::FileDefaultWithoutApi { field, default });
        }
        Ok(())
    };
    file_default(
        "authorization.mode",
        "Webhook",
        authorization.mode.is_none(),
    )?;
    file_default(
        "authentication.webhook.enabled",
        "true",
        authentication.webhook.enabled.is_none(),
    )?;
    let default_mode = if access.from_file {
        "Webhook"
    } else {
        "AlwaysAllow"
    };
    let access_ttls = match authorization.mode.as_deref().unwrap_or(default_mode) {
        "AlwaysAllow" => None,
        "Webhook" => Some((
            duration_or(
                authorization.webhook.cache_authorized_ttl,
                Duration::from_secs(300),
            ),
            duration_or(
                authorization.webhook.cache_unauthorized_ttl,
                Duration::from_secs(30),
            ),
        )),
        other => return Err(Error::AuthorizationMode(other.to_owned())),
    };
    let hook = authentication.webhook;
    let token_ttl = hook
        .enabled
        .unwrap_or(access.from_file)
        .then(|| duration_or(hook.cache_ttl, Duration::from_secs(120)));
    if !access.has_api {
        if access_ttls.is_some() {
            return Err(Error::WebhookWithoutApi("--authorization-mode=Webhook"));
        }
        if token_ttl.is_some() {
            return Err(Error::WebhookWithoutApi("--authentication-token-webhook"));
        }
    }
    let anonymous = authentication.anonymous.enabled.unwrap_or(false);
    if anonymous && access_ttls.is_none() && !access.insecure_anonymous_always_allow {
        return Err(Error::AnonymousAlwaysAllow);
    }
    let cert_and_key = match (cert, key) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        _ => return Err(Error::TlsPair),
    };
    Ok(Some(KubeletApi {
        addr: std::net::SocketAddr::new(address.unwrap_or(IpAddr::from([0, 0, 0, 0])), port),
        tls: crate::server::tls::Files {
            cert_and_key,
            cert_dir,
            client_ca: authentication.x509.client_ca_file,
        },
        anonymous,
        webhook: crate::server::webhook::Settings {
            token_ttl,
            access_ttls,
        },
        stream_idle_timeout: (!stream_idle_timeout.is_zero()).then_some(stream_idle_timeout),
    }))
}

/// A list setting's entries (none when unset): its flag's items, which clap splits at the
/// commas (`value_delimiter`), or its config file field's, one a map pair or list item.
fn entries(setting: &Option<Vec<String>>) -> &[String] {
    setting.as_deref().unwrap_or_default()
}

/// How many image pulls may run at once (`None`: no limit), from `--serialize-image-pulls` and
/// `--max-parallel-image-pulls`, with the kubelet's validation.
fn image_pull_limit(serialize: bool, max: Option<i64>) -> Result<Option<usize>, Error> {
    match max {
        Some(n) if n < 1 => Err(Error::MaxParallelImagePulls(n)),
        Some(n) if serialize && n > 1 => Err(Error::SerializedParallelPulls(n)),
        Some(n) => Ok(usize::try_from(n).ok()),
        None => Ok(serialize.then_some(1)),
    }
}

/// Parses a Go-style duration: `20s`, `1m`, `1m30s`, `500ms`, `1h`.
pub fn parse_duration(what: &'static str, value: &str) -> Result<Duration, Error> {
    let err = || Error::Duration {
        what,
        value: value.to_owned(),
    };
    let mut total = Duration::ZERO;
    let mut rest = value.trim();
    if rest.is_empty() {
        return Err(err());
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(err)?;
        if digits == 0 {
            return Err(err());
        }
        let number: f64 = rest[..digits].parse().map_err(|_| err())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(err()),
        };
        total += Duration::try_from_secs_f64(number * scale).map_err(|_| err())?;
        rest = &rest[unit_len..];
    }
    Ok(total)
}

/// A Go-style duration (`20s`, `1m30s`, `500ms`), parsed once where it is read: a flag's value
/// by clap (its error names the flag), a config file's field by serde (its error names the
/// file and where in it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoDuration(pub Duration);

impl std::str::FromStr for GoDuration {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, String> {
        // Go's own special case: a bare 0 needs no unit.
        if value == "0" {
            return Ok(GoDuration(Duration::ZERO));
        }
        parse_duration("duration", value)
            .map(GoDuration)
            .map_err(|_| {
                format!("invalid duration {value:?} (use Go-style durations like 20s, 1m, 1m30s)")
            })
    }
}

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// `value`'s duration, else `default`.
fn duration_or(value: Option<GoDuration>, default: Duration) -> Duration {
    value.map_or(default, |d| d.0)
}

/// One `--manifest-url-header` pair, `Name:Value` (the value may itself contain ':').
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header(pub String, pub String);

impl std::str::FromStr for Header {
    type Err = &'static str;

    fn from_str(pair: &str) -> Result<Self, Self::Err> {
        match pair.split_once(':') {
            Some((name, value)) if !name.trim().is_empty() => {
                Ok(Self(name.trim().to_owned(), value.trim().to_owned()))
            }
            _ => Err("expected comma-separated 'Name:Value' pairs"),
        }
    }
}

/// `staticPodURLHeader` (header name -> values) as `--manifest-url-header`'s pairs.
fn header_map<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Vec<Header>>, D::Error> {
    let map = BTreeMap::<String, Vec<String>>::deserialize(d)?;
    Ok(Some(
        map.into_iter()
            .flat_map(|(name, values)| values.into_iter().map(move |v| Header(name.clone(), v)))
            .collect(),
    ))
}

/// A map field (`systemReserved: {memory: 1Gi}`) as its flag's entries (`memory=1Gi`).
fn map_with_equals<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<String>>, D::Error> {
    map_entries(d, "=")
}

/// A thresholds map (`evictionHard: {memory.available: 100Mi}`) as its flag's entries
/// (`memory.available<100Mi`).
fn map_with_less_than<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<String>>, D::Error> {
    map_entries(d, "<")
}

fn map_entries<'de, D: serde::Deserializer<'de>>(
    d: D,
    sep: &str,
) -> Result<Option<Vec<String>>, D::Error> {
    let map = BTreeMap::<String, String>::deserialize(d)?;
    Ok(Some(
        map.iter().map(|(k, v)| format!("{k}{sep}{v}")).collect(),
    ))
}

/// `registerWithTaints` (a list of Taint objects) as `--register-with-taints` entries
/// (`key=value:Effect`), checked then as the flag's are.
fn taint_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    let taints = Vec::<k8s_openapi::api::core::v1::Taint>::deserialize(d)?;
    Ok(Some(
        taints
            .iter()
            .map(|t| match &t.value {
                Some(v) => format!("{}={v}:{}", t.key, t.effect),
                None => format!("{}:{}", t.key, t.effect),
            })
            .collect(),
    ))
}

fn hostname() -> Result<String, Error> {
    crate::cm::hostname().map_err(|e| Error::Hostname(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The agent's settings from the command line `args` (program name first).
    fn settings(args: &[&str]) -> Result<AgentConfig, Error> {
        let (flags, config) = parse(args)?;
        AgentConfig::new(flags, config)
    }

    /// The settings from the flags `args` (with a node name, so the host's does not matter).
    /// With a `--config` file and no `--kubeconfig`, one is added: a file's access defaults
    /// (Webhook) need an API server, and the tests of other fields are not about that.
    /// [`standalone`] resolves without.
    fn resolve(args: &[&str]) -> Result<AgentConfig, Error> {
        let mut all = args.to_vec();
        if all.contains(&"--config") && !all.contains(&"--kubeconfig") {
            all.extend(["--kubeconfig", "/kubeconfig"]);
        }
        standalone(&all)
    }

    /// [`resolve`] without adding a `--kubeconfig`.
    fn standalone(args: &[&str]) -> Result<AgentConfig, Error> {
        let mut all = vec!["swiftlet", "--hostname-override", "n"];
        all.extend(args);
        settings(&all)
    }

    /// clap's error for the flags `args`, which must not parse.
    fn refused(args: &[&str]) -> String {
        let mut all = vec!["swiftlet", "--hostname-override", "n"];
        all.extend(args);
        match parse(&all) {
            Err(Error::Usage(e)) => e.to_string(),
            other => panic!("flags not refused by clap: {other:?}"),
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("x", "20s").unwrap(), Duration::from_secs(20));
        assert_eq!(parse_duration("x", "1m").unwrap(), Duration::from_secs(60));
        assert_eq!(
            parse_duration("x", "1m30s").unwrap(),
            Duration::from_secs(90)
        );
        assert_eq!(
            parse_duration("x", "250ms").unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(
            parse_duration("x", "1.5s").unwrap(),
            Duration::from_millis(1500)
        );
        for bad in ["", "s", "10", "10x", "-1s", "1m-"] {
            assert!(parse_duration("x", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn image_pull_flags_follow_the_kubelets_rules() {
        let limit = |args: &[&str], file: &str| {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("k.yaml");
            std::fs::write(
                &path,
                format!(
                    "kind: KubeletConfiguration\napiVersion: kubelet.config.k8s.io/v1beta1\n{file}"
                ),
            )
            .unwrap();
            let mut all = vec!["--config", path.to_str().unwrap()];
            all.extend_from_slice(args);
            resolve(&all)
                .map(|c| c.max_parallel_image_pulls)
                .map_err(|e| e.to_string())
        };
        assert_eq!(limit(&[], ""), Ok(None), "parallel, no limit");
        assert_eq!(limit(&["--serialize-image-pulls"], ""), Ok(Some(1)));
        assert_eq!(limit(&[], "serializeImagePulls: true\n"), Ok(Some(1)));
        assert_eq!(limit(&["--max-parallel-image-pulls", "3"], ""), Ok(Some(3)));
        assert_eq!(limit(&[], "maxParallelImagePulls: 2\n"), Ok(Some(2)));
        assert_eq!(
            limit(
                &["--serialize-image-pulls=false"],
                "serializeImagePulls: true\n"
            ),
            Ok(None),
            "the flag wins"
        );
        assert!(
            limit(&["--max-parallel-image-pulls", "0"], "")
                .unwrap_err()
                .contains("at least 1")
        );
        assert!(
            limit(
                &[
                    "--serialize-image-pulls",
                    "true",
                    "--max-parallel-image-pulls",
                    "2"
                ],
                ""
            )
            .unwrap_err()
            .contains("--serialize-image-pulls=false")
        );
        assert_eq!(
            limit(
                &[
                    "--serialize-image-pulls",
                    "true",
                    "--max-parallel-image-pulls",
                    "1"
                ],
                ""
            ),
            Ok(Some(1))
        );
    }

    /// A KubeletConfiguration file holding `fields` in a fresh temporary directory.
    fn config_file(fields: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.yaml");
        let head = "kind: KubeletConfiguration\napiVersion: kubelet.config.k8s.io/v1beta1\n";
        std::fs::write(&path, format!("{head}{fields}")).unwrap();
        (dir, path)
    }

    #[test]
    fn a_duration_flag_wins_over_the_file_which_wins_over_the_default() {
        let (_dir, path) = config_file("syncFrequency: 1m30s\nnodeStatusUpdateFrequency: 15s\n");
        let config = path.to_str().unwrap();
        let default = resolve(&[]).unwrap();
        assert_eq!(default.sync_frequency, Duration::from_secs(60));
        let file = resolve(&["--config", config]).unwrap();
        assert_eq!(file.sync_frequency, Duration::from_secs(90));
        assert_eq!(file.node.status_update_frequency, Duration::from_secs(15));
        let flag = resolve(&["--config", config, "--sync-frequency", "250ms"]).unwrap();
        assert_eq!(flag.sync_frequency, Duration::from_millis(250));
        assert_eq!(flag.node.status_update_frequency, Duration::from_secs(15));
    }

    /// A flag replaces only its own field: the file's other fields, its siblings in a nested
    /// section included, stay as the file says.
    #[test]
    fn a_flag_binds_over_its_field_and_leaves_the_files_others() {
        let (_dir, path) = config_file(
            "authentication:\n  x509:\n    clientCAFile: /file-ca\n  anonymous:\n    enabled: true\n\
             nodeLabels:\n  node.kubernetes.io/pool: file\n\
             evictionHard:\n  memory.available: 1Gi\n  pid.available: 10%\n\
             registerWithTaints:\n  - {key: dedicated, value: db, effect: NoSchedule}\n",
        );
        let config = path.to_str().unwrap();
        let file = resolve(&["--config", config]).unwrap();
        let api = file.kubelet_api.unwrap();
        assert_eq!(api.tls.client_ca, Some(PathBuf::from("/file-ca")));
        assert!(api.anonymous);
        assert_eq!(file.node.labels["node.kubernetes.io/pool"], "file");
        assert_eq!(file.eviction.thresholds.len(), 2);
        assert_eq!(file.node.taints.len(), 1);
        assert_eq!(file.node.taints[0].value.as_deref(), Some("db"));
        let flags = resolve(&[
            "--config",
            config,
            "--client-ca-file",
            "/flag-ca",
            "--eviction-hard",
            "memory.available<2Gi",
        ])
        .unwrap();
        let api = flags.kubelet_api.unwrap();
        assert_eq!(api.tls.client_ca, Some(PathBuf::from("/flag-ca")));
        assert!(api.anonymous, "the sibling field stays the file's");
        let hard = &flags.eviction.thresholds;
        assert_eq!(hard.len(), 1, "the flag replaces the file's map: {hard:?}");
        assert_eq!(hard[0].amount, crate::eviction::Amount::Absolute(2 << 30));
        assert_eq!(flags.node.labels["node.kubernetes.io/pool"], "file");
        // A repeated map flag adds to itself, and replaces the file's map.
        let labels = resolve(&[
            "--config",
            config,
            "--node-labels",
            "a.example/x=1",
            "--node-labels",
            "a.example/y=2,a.example/z=3",
        ])
        .unwrap()
        .node
        .labels;
        assert_eq!(
            labels.keys().collect::<Vec<_>>(),
            ["a.example/x", "a.example/y", "a.example/z"]
        );
        // The file's taints are checked as the flag's are.
        let (_bad_dir, bad) =
            config_file("registerWithTaints:\n  - {key: dedicated, effect: Sometimes}\n");
        let e = resolve(&["--config", bad.to_str().unwrap()]).unwrap_err();
        assert!(e.to_string().contains("dedicated:Sometimes"), "{e}");
    }

    /// A map flag's value is split at its commas once, by clap; a config file map's pairs are
    /// entries as they stand, never split again.
    #[test]
    fn map_settings_reach_their_parsers_as_entries() {
        // The flag: a trailing comma's blank entry is skipped, an empty value means none, and
        // an error names the flag's whole value as given.
        let cfg = resolve(&["--node-labels", "a.example/x=1,", "--eviction-hard="]).unwrap();
        assert_eq!(cfg.node.labels.keys().collect::<Vec<_>>(), ["a.example/x"]);
        assert!(cfg.eviction.thresholds.is_empty());
        let e = resolve(&["--system-reserved", "cpu=1,memory"]).unwrap_err();
        assert!(e.to_string().contains("\"cpu=1,memory\""), "{e}");
        // The file: a comma in a value is part of the value, not a second entry smuggled in.
        let (_dir, path) =
            config_file("evictionHard:\n  memory.available: \"1Gi,pid.available<10%\"\n");
        let e = resolve(&["--config", path.to_str().unwrap()]).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Eviction(crate::eviction::Error::Amount("--eviction-hard", ref entry, _))
                    if entry == "memory.available<1Gi,pid.available<10%"
            ),
            "{e}"
        );
    }

    #[test]
    fn flags_win_over_file_and_defaults_apply() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.yaml");
        std::fs::write(
            &path,
            "kind: KubeletConfiguration\napiVersion: kubelet.config.k8s.io/v1beta1\n\
             staticPodPath: /etc/pods\nreadOnlyPort: 0\nhealthzPort: 1111\n\
             fileCheckFrequency: 5s\nunknownField: [1]\n",
        )
        .unwrap();
        let cfg = settings(&[
            "swiftlet",
            "--config",
            path.to_str().unwrap(),
            "--kubeconfig",
            "/kubeconfig",
            "--healthz-port",
            "2222",
            "--hostname-override",
            "Node-A",
        ])
        .unwrap();
        assert_eq!(cfg.pod_manifest_path, Some(PathBuf::from("/etc/pods")));
        assert_eq!(cfg.read_only_port, 0);
        assert_eq!(cfg.healthz_port, 2222);
        assert_eq!(cfg.node_name, "node-a");
        // The override is also the Node's Hostname address, lowercased as the kubelet does.
        assert_eq!(cfg.node.hostname, "node-a");
        assert_eq!(cfg.file_check_frequency, Duration::from_secs(5));
        assert_eq!(cfg.cgroup_root, "/");
        assert!(cfg.cgroups_per_qos);
        assert_eq!(cfg.container_runtime_endpoint, DEFAULT_RUNTIME_ENDPOINT);
    }

    #[test]
    fn eviction_flags_override_the_file_and_soft_thresholds_need_grace() {
        let cfg = resolve(&[
            "--eviction-hard",
            "memory.available<1Gi",
            "--eviction-soft",
            "pid.available<10%",
            "--eviction-soft-grace-period",
            "pid.available=30s",
            "--eviction-max-pod-grace-period",
            "-1",
        ])
        .unwrap();
        let t = &cfg.eviction.thresholds;
        assert_eq!(t.len(), 2);
        assert!(t[0].is_hard() && !t[1].is_hard());
        assert_eq!(t[1].grace_period, Duration::from_secs(30));
        assert_eq!(cfg.eviction.max_pod_grace_period, -1);
        assert_eq!(cfg.node.eviction_hard.len(), 1);
        let err = resolve(&["--eviction-soft", "pid.available<10%"]).unwrap_err();
        assert!(err.to_string().contains("grace period"), "{err}");
        let err = resolve(&[
            "--eviction-soft",
            "pid.available<10%",
            "--eviction-soft-grace-period",
            "pid.available=soon",
        ])
        .unwrap_err();
        assert!(
            err.to_string().contains("--eviction-soft-grace-period"),
            "{err}"
        );
        assert!(resolve(&[]).unwrap().enforce_node_allocatable);
        let gc = resolve(&[]).unwrap().container_gc;
        assert_eq!(gc, crate::container_gc::Policy::default());
        assert_eq!((gc.max_per_container, gc.max_containers), (Some(1), None));
        let gc = resolve(&[
            "--maximum-dead-containers",
            "100",
            "--maximum-dead-containers-per-container",
            "-1",
            "--minimum-container-ttl-duration",
            "1m",
        ])
        .unwrap()
        .container_gc;
        assert_eq!(
            (gc.max_containers, gc.max_per_container, gc.min_age),
            (Some(100), None, Duration::from_secs(60))
        );
        let off = resolve(&["--enforce-node-allocatable", "none"]).unwrap();
        assert!(!off.enforce_node_allocatable);
        let err = resolve(&["--enforce-node-allocatable", "pods,system-reserved"]).unwrap_err();
        assert!(err.to_string().contains("not manage"), "{err}");
    }

    #[test]
    fn the_example_configuration_in_deploy_loads() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/kubelet-config.yaml");
        // The unit in deploy/ passes --kubeconfig too (the webhooks need it).
        let cfg = resolve(&["--config", path, "--kubeconfig", "/etc/swiftlet/kubeconfig"]).unwrap();
        assert_eq!(
            cfg.container_runtime_endpoint,
            "unix:///run/containerd/containerd.sock"
        );
        assert_eq!(
            cfg.pod_manifest_path,
            Some(PathBuf::from("/etc/kubernetes/manifests"))
        );
        assert_eq!(cfg.read_only_port, 0);
        assert!(cfg.seccomp_default, "the example recommends RuntimeDefault");
        assert_eq!(cfg.max_pods, 110);
        assert_eq!(cfg.node.reserved.cpu_millis, 200);
        assert_eq!(cfg.node.reserved.memory, 512 << 20);
        assert_eq!(cfg.node.labels["node.kubernetes.io/pool"], "general");
        assert_eq!(cfg.node.max_images, 50);
        let ev = &cfg.eviction;
        assert_eq!(ev.hard().len(), 4);
        assert_eq!(cfg.node.eviction_hard.len(), 4);
        let soft: Vec<_> = ev.thresholds.iter().filter(|t| !t.is_hard()).collect();
        assert_eq!(soft.len(), 2);
        let memory = soft
            .iter()
            .find(|t| t.signal == crate::eviction::Signal::MemoryAvailable)
            .unwrap();
        assert_eq!(memory.grace_period, Duration::from_secs(90));
        assert_eq!(memory.amount, crate::eviction::Amount::Absolute(300 << 20));
        assert_eq!(
            memory.min_reclaim,
            Some(crate::eviction::Amount::Absolute(100 << 20))
        );
        assert_eq!(ev.max_pod_grace_period, 60);
        assert_eq!(ev.pressure_transition, Duration::from_secs(300));
        let api = cfg.kubelet_api.expect("the kubelet API");
        assert!(!api.anonymous);
        assert_eq!(
            api.webhook.access_ttls,
            Some((Duration::from_secs(300), Duration::from_secs(30)))
        );
        assert_eq!(api.webhook.token_ttl, Some(Duration::from_secs(120)));
        assert_eq!(
            api.tls.client_ca,
            Some(PathBuf::from("/etc/kubernetes/pki/ca.crt"))
        );
    }

    #[test]
    fn kubelet_api_settings_from_flags_and_file() {
        let defaults = resolve(&["--root-dir", "/r"]).unwrap();
        let api = defaults.kubelet_api.unwrap();
        assert_eq!(api.addr, "0.0.0.0:10250".parse().unwrap());
        assert!(!api.anonymous && api.tls.client_ca.is_none() && api.tls.cert_and_key.is_none());
        assert_eq!(api.tls.cert_dir, PathBuf::from("/r/pki"));
        assert_eq!(api.stream_idle_timeout, Some(Duration::from_secs(4 * 3600)));
        assert!(resolve(&["--port", "0"]).unwrap().kubelet_api.is_none());
        let idle = |v: &str| {
            resolve(&["--streaming-connection-idle-timeout", v])
                .unwrap()
                .kubelet_api
                .unwrap()
                .stream_idle_timeout
        };
        assert_eq!(idle("90s"), Some(Duration::from_secs(90)));
        assert_eq!(idle("0"), None, "0: no limit");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.yaml");
        std::fs::write(
            &path,
            "kind: KubeletConfiguration\napiVersion: kubelet.config.k8s.io/v1beta1\n\
             port: 11250\naddress: 127.0.0.1\ntlsCertFile: /c\ntlsPrivateKeyFile: /k\n\
             authentication:\n  x509:\n    clientCAFile: /ca\n  anonymous:\n    enabled: true\n\
             authorization:\n  mode: AlwaysAllow\n",
        )
        .unwrap();
        let cfg = resolve(&["--config", path.to_str().unwrap(), "--anonymous-auth=false"]).unwrap();
        let api = cfg.kubelet_api.unwrap();
        assert_eq!(api.addr, "127.0.0.1:11250".parse().unwrap());
        assert_eq!(
            api.tls.cert_and_key,
            Some((PathBuf::from("/c"), PathBuf::from("/k")))
        );
        assert_eq!(api.tls.client_ca, Some(PathBuf::from("/ca")));
        assert!(!api.anonymous, "the flag wins over the file");
        let e = resolve(&["--authorization-mode", "Webhook"]).unwrap_err();
        assert!(e.to_string().contains("needs --kubeconfig"), "{e}");
        let e = resolve(&["--authentication-token-webhook"]).unwrap_err();
        assert!(e.to_string().contains("needs --kubeconfig"), "{e}");
        let e = resolve(&["--authorization-mode", "RBAC"]).unwrap_err();
        assert!(e.to_string().contains("AlwaysAllow or Webhook"), "{e}");
        let cfg = resolve(&[
            "--kubeconfig",
            "/k",
            "--authorization-mode",
            "Webhook",
            "--authorization-webhook-cache-unauthorized-ttl",
            "10s",
            "--authentication-token-webhook",
        ])
        .unwrap();
        let hook = cfg.kubelet_api.unwrap().webhook;
        assert_eq!(
            hook.access_ttls,
            Some((Duration::from_secs(300), Duration::from_secs(10)))
        );
        assert_eq!(hook.token_ttl, Some(Duration::from_secs(120)));
        assert!(matches!(
            resolve(&["--tls-cert-file", "/c"]),
            Err(Error::TlsPair)
        ));
    }

    /// A config file's unset access fields take the KubeletConfiguration defaults (Webhook,
    /// webhook authentication), flags alone the kubelet's flag defaults; anonymous callers
    /// with AlwaysAllow are refused unless asked for by name.
    #[test]
    fn access_defaults_are_the_kubelets_and_anonymous_always_allow_is_refused() {
        let (_dir, path) = config_file("port: 10250\n");
        let file = path.to_str().unwrap();
        let api = resolve(&["--config", file]).unwrap().kubelet_api.unwrap();
        assert_eq!(
            api.webhook.access_ttls,
            Some((Duration::from_secs(300), Duration::from_secs(30))),
            "Webhook authorization"
        );
        assert_eq!(api.webhook.token_ttl, Some(Duration::from_secs(120)));
        assert!(!api.anonymous);
        let flags = resolve(&["--kubeconfig", "/k"])
            .unwrap()
            .kubelet_api
            .unwrap();
        assert_eq!(
            flags.webhook.access_ttls, None,
            "AlwaysAllow without a file"
        );
        assert_eq!(flags.webhook.token_ttl, None);
        // Without an API server the file's defaults cannot work: the error names the field.
        let e = standalone(&["--config", file]).unwrap_err().to_string();
        assert!(e.contains("authorization.mode is unset"), "{e}");
        let e = standalone(&["--config", file, "--authorization-mode", "AlwaysAllow"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("authentication.webhook.enabled is unset"), "{e}");
        let (_dir, off) = config_file(
            "authorization:\n  mode: AlwaysAllow\nauthentication:\n  webhook:\n    enabled: false\n",
        );
        let api = standalone(&["--config", off.to_str().unwrap()])
            .unwrap()
            .kubelet_api
            .unwrap();
        assert_eq!(
            (api.webhook.access_ttls, api.webhook.token_ttl),
            (None, None)
        );
        assert!(
            standalone(&["--config", file, "--port", "0"])
                .unwrap()
                .kubelet_api
                .is_none(),
            "no kubelet API, nothing to decide"
        );
        // Anonymous callers meeting AlwaysAllow: refused, unless said by name.
        let e = resolve(&["--anonymous-auth"]).unwrap_err();
        assert!(matches!(e, Error::AnonymousAlwaysAllow), "{e}");
        assert!(e.to_string().contains("--insecure-anonymous-always-allow"));
        let api = resolve(&["--anonymous-auth", "--insecure-anonymous-always-allow"])
            .unwrap()
            .kubelet_api
            .unwrap();
        assert!(api.anonymous && api.webhook.access_ttls.is_none());
        let webhook = resolve(&["--config", file, "--anonymous-auth"]).unwrap();
        assert!(
            webhook.kubelet_api.unwrap().anonymous,
            "the API server decides"
        );
        assert!(resolve(&["--anonymous-auth", "--port", "0"]).is_ok());
    }

    #[test]
    fn manifest_url_flags() {
        let cfg = resolve(&[
            "--manifest-url",
            "http://127.0.0.1:8080/pods",
            "--manifest-url-header",
            "a:hello,b:again",
            "--manifest-url-header",
            "b:x:y",
            "--http-check-frequency",
            "5s",
        ])
        .unwrap();
        assert_eq!(
            cfg.manifest_url.as_deref(),
            Some("http://127.0.0.1:8080/pods")
        );
        let pairs: Vec<(&str, &str)> = cfg
            .manifest_url_headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(pairs, [("a", "hello"), ("b", "again"), ("b", "x:y")]);
        assert_eq!(cfg.http_check_frequency, Duration::from_secs(5));
        let defaults = resolve(&[]).unwrap();
        assert_eq!(defaults.http_check_frequency, Duration::from_secs(20));
        assert!(defaults.manifest_url.is_none() && defaults.kubeconfig.is_none());
        // Unauthenticated endpoints are off unless asked for; the kubelet's pod count applies.
        assert_eq!(defaults.read_only_port, 0);
        assert_eq!(defaults.healthz_port, 10248);
        assert_eq!(defaults.max_pods, 110);
        for bad in ["novalue", ":v", "a:b,"] {
            let e = refused(&["--manifest-url-header", bad]);
            assert!(e.contains("'Name:Value'"), "{bad}: {e}");
        }
    }

    #[test]
    fn takes_both_cgroup_drivers_and_rejects_others_and_a_wrong_kind() {
        let driver = |name: &str| resolve(&["--cgroup-driver", name]);
        assert!(driver("systemd").unwrap().systemd_cgroups);
        assert!(!driver("cgroupfs").unwrap().systemd_cgroups);
        assert!(matches!(driver("cgroupv3"), Err(Error::CgroupDriver(_))));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.yaml");
        std::fs::write(&path, "kind: Pod\n").unwrap();
        assert!(matches!(
            KubeletConfiguration::load(&path),
            Err(Error::Kind { .. })
        ));
        std::fs::write(&path, "staticPodPath: /p\n").unwrap();
        assert!(
            matches!(KubeletConfiguration::load(&path), Err(Error::Kind { .. })),
            "no kind"
        );
        for version in [
            "",
            "apiVersion: v1\n",
            "apiVersion: kubelet.config.k8s.io/v2\n",
        ] {
            std::fs::write(&path, format!("kind: KubeletConfiguration\n{version}")).unwrap();
            let err = KubeletConfiguration::load(&path).unwrap_err();
            assert!(matches!(err, Error::ApiVersion { .. }), "{version:?}");
            assert!(err.to_string().contains("kubelet.config.k8s.io/v1beta1"));
        }
        // Fields swiftlet does not read are kept by name (and warned about), not refused.
        std::fs::write(
            &path,
            "kind: KubeletConfiguration\napiVersion: kubelet.config.k8s.io/v1beta1\n\
             staticPodPath: /p\nfeatureGates: {A: true}\nmaxOpenFiles: 100\n",
        )
        .unwrap();
        let cfg = KubeletConfiguration::load(&path).unwrap();
        assert_eq!(cfg.static_pod_path, Some(PathBuf::from("/p")));
        assert_eq!(
            cfg.unknown.keys().collect::<Vec<_>>(),
            ["featureGates", "maxOpenFiles"]
        );
    }

    #[test]
    fn runtime_request_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.yaml");
        std::fs::write(
            &path,
            "kind: KubeletConfiguration\napiVersion: kubelet.config.k8s.io/v1\n\
             runtimeRequestTimeout: 30s\n",
        )
        .unwrap();
        assert_eq!(
            resolve(&[]).unwrap().runtime_request_timeout,
            crate::cri::DEFAULT_REQUEST_TIMEOUT
        );
        let file = path.to_str().unwrap();
        assert_eq!(
            resolve(&["--config", file])
                .unwrap()
                .runtime_request_timeout,
            Duration::from_secs(30)
        );
        assert_eq!(
            resolve(&["--config", file, "--runtime-request-timeout", "5s"])
                .unwrap()
                .runtime_request_timeout,
            Duration::from_secs(5)
        );
        let zero = resolve(&["--runtime-request-timeout", "0s"]).unwrap_err();
        assert!(matches!(zero, Error::RequestTimeout(_)), "{zero}");
        assert!(zero.to_string().contains("more than zero"), "{zero}");
        let soon = refused(&["--runtime-request-timeout", "soon"]);
        assert!(
            soon.contains("--runtime-request-timeout") && soon.contains("invalid duration"),
            "{soon}"
        );
    }

    #[test]
    fn dns_flags() {
        let d = resolve(&[]).unwrap().dns;
        assert!(d.cluster_dns.is_empty() && d.cluster_domain.is_empty());
        assert_eq!(d.resolv_conf, Some(PathBuf::from("/etc/resolv.conf")));
        let d = resolve(&[
            "--cluster-dns",
            "10.96.0.10,fd00::10",
            "--cluster-dns",
            "10.96.0.11",
            "--cluster-domain",
            "cluster.local",
            "--resolv-conf",
            "",
        ])
        .unwrap()
        .dns;
        let ips: Vec<String> = d.cluster_dns.iter().map(ToString::to_string).collect();
        assert_eq!(ips, ["10.96.0.10", "fd00::10", "10.96.0.11"]);
        assert_eq!(d.cluster_domain, "cluster.local");
        assert_eq!(d.resolv_conf, None);
        // An empty value names no server (as a flag left empty in a unit file).
        assert!(
            resolve(&["--cluster-dns", ""])
                .unwrap()
                .dns
                .cluster_dns
                .is_empty()
        );
        let bad = resolve(&["--cluster-dns", "10.96.0.10,kube-dns"]).unwrap_err();
        assert!(
            matches!(bad, Error::ClusterDns(ref v) if v == "kube-dns"),
            "{bad}"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.yaml");
        std::fs::write(
            &path,
            "kind: KubeletConfiguration\napiVersion: kubelet.config.k8s.io/v1beta1\n\
             clusterDNS: [10.0.0.10]\nclusterDomain: k8s.test\nresolvConf: /run/r.conf\n",
        )
        .unwrap();
        let d = resolve(&["--config", path.to_str().unwrap()]).unwrap().dns;
        assert_eq!(d.cluster_dns, [std::net::IpAddr::from([10, 0, 0, 10])]);
        assert_eq!(d.cluster_domain, "k8s.test");
        assert_eq!(d.resolv_conf, Some(PathBuf::from("/run/r.conf")));
    }

    #[test]
    fn container_log_flags() {
        assert_eq!(
            resolve(&[]).unwrap().container_logs,
            crate::logs::Policy::default()
        );
        let p = resolve(&[
            "--container-log-max-size",
            "64Ki",
            "--container-log-max-files",
            "3",
            "--container-log-monitor-interval",
            "3s",
            "--container-log-max-workers",
            "2",
        ])
        .unwrap()
        .container_logs;
        assert_eq!(p.max_size, Some(64 << 10));
        assert_eq!(p.max_files, 3);
        assert_eq!(p.monitor_interval, Duration::from_secs(3));
        assert_eq!(p.max_workers, 2);
        let off = resolve(&["--container-log-max-size", "-1"]).unwrap();
        assert_eq!(off.container_logs.max_size, None);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.yaml");
        std::fs::write(
            &path,
            "kind: KubeletConfiguration\napiVersion: kubelet.config.k8s.io/v1beta1\n\
             containerLogMaxSize: 1Mi\ncontainerLogMaxFiles: 2\n\
             containerLogMonitorInterval: 30s\ncontainerLogMaxWorkers: 4\n",
        )
        .unwrap();
        let file = path.to_str().unwrap();
        let p = resolve(&["--config", file]).unwrap().container_logs;
        assert_eq!(
            (p.max_size, p.max_files, p.monitor_interval, p.max_workers),
            (Some(1 << 20), 2, Duration::from_secs(30), 4)
        );
        let p = resolve(&["--config", file, "--container-log-max-files", "7"])
            .unwrap()
            .container_logs;
        assert_eq!(p.max_files, 7);
        for (args, what) in [
            (
                ["--container-log-max-files", "1"],
                "--container-log-max-files",
            ),
            (
                ["--container-log-max-workers", "0"],
                "--container-log-max-workers",
            ),
            (["--container-log-monitor-interval", "1s"], "3s"),
            (
                ["--container-log-max-size", "big"],
                "--container-log-max-size",
            ),
        ] {
            let err = resolve(&args).unwrap_err();
            assert!(err.to_string().contains(what), "{args:?}: {err}");
        }
        let often = refused(&["--container-log-monitor-interval", "often"]);
        assert!(often.contains("invalid duration"), "{often}");
    }

    /// A duration in the config file is parsed as it is read: a bad one names the file, the
    /// field's place and the value.
    #[test]
    fn a_bad_duration_in_the_file_is_refused_where_it_is_read() {
        let (_dir, path) = config_file("syncFrequency: often\n");
        let e = KubeletConfiguration::load(&path).unwrap_err().to_string();
        assert!(
            e.contains(&path.display().to_string()) && e.contains("invalid duration \"often\""),
            "{e}"
        );
    }

    #[test]
    fn pleg_relist_period() {
        let parse = |v: Option<&str>| {
            let args: Vec<&str> = v
                .map(|v| ["--pleg-relist-period", v])
                .into_iter()
                .flatten()
                .collect();
            resolve(&args)
        };
        assert_eq!(
            parse(None).unwrap().pleg_relist_period,
            Duration::from_secs(1)
        );
        assert_eq!(
            parse(Some("250ms")).unwrap().pleg_relist_period,
            Duration::from_millis(250)
        );
        assert_eq!(
            parse(None).unwrap().pleg_safety_net_period,
            Duration::from_secs(60)
        );
        for zero in ["0s", "0"] {
            let off = resolve(&["--pleg-safety-net-period", zero]).unwrap();
            assert_eq!(off.pleg_safety_net_period, Duration::ZERO);
        }
        assert!(matches!(parse(Some("0s")), Err(Error::RelistPeriod(_))));
        for bad in ["1x", ""] {
            let e = refused(&["--pleg-relist-period", bad]);
            assert!(e.contains("--pleg-relist-period"), "{bad}: {e}");
        }
    }
}
