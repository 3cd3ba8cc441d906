//! Command-line flags and the `--config` file (a KubeletConfiguration YAML subset), merged into one
//! [`AgentConfig`]. Flags given on the command line win over the file, as with the kubelet.
pub mod doc;

use clap::Parser;
use serde::Deserialize;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum Error {
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
    #[error("--manifest-url-header {0:?}: expected comma-separated 'Name:Value' pairs")]
    Header(String),
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
#[derive(Debug, Parser, Default)]
#[command(name = "swiftlet", version, about, long_about = None)]
pub struct Flags {
    /// KubeletConfiguration file (YAML). docs/configuration.md lists every field swiftlet reads
    /// and the flag that overrides it; a flag given on the command line wins over the file.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Directory (or single file) of static pod manifests.
    #[arg(long, value_name = "PATH")]
    pub pod_manifest_path: Option<PathBuf>,
    /// CRI endpoint of the container runtime (unix:// URL). A runtime that does not answer at
    /// start is waited for (retried every 0.5 s doubling to 5 s, each failure logged).
    #[arg(long, value_name = "URL")]
    pub container_runtime_endpoint: Option<String>,
    /// Deadline of each CRI call, except image pulls, which have none: RunPodSandbox gets twice
    /// it, StopContainer the grace period more, ExecSync the command's timeout more. A call past
    /// its deadline fails, and the pod's sync is retried as after any error [default: 2m].
    #[arg(long, value_name = "DURATION")]
    pub runtime_request_timeout: Option<GoDuration>,
    /// Directory for the agent's own state [default: /var/lib/swiftlet]. Its `config.json` (or
    /// `.dockercfg`) holds the node's image pull credentials, searched first.
    #[arg(long, value_name = "DIR")]
    pub root_dir: Option<PathBuf>,
    /// Directory of pod logs written by the runtime [default: /var/log/pods].
    #[arg(long, value_name = "DIR")]
    pub pod_logs_dir: Option<PathBuf>,
    /// Node name [default: the host name].
    #[arg(long, value_name = "NAME")]
    pub hostname_override: Option<String>,
    /// Root cgroup for pod cgroups [default: /].
    #[arg(long, value_name = "PATH")]
    pub cgroup_root: Option<String>,
    /// Create the kubepods/burstable/besteffort QoS cgroup hierarchy [default: true].
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub cgroups_per_qos: Option<bool>,
    /// Cgroup driver: cgroupfs (swiftlet writes the cgroup file system) or systemd (pod cgroups
    /// are slices created through systemd; the runtime must use systemd cgroups too)
    /// [default: cgroupfs].
    #[arg(long, value_name = "DRIVER")]
    pub cgroup_driver: Option<String>,
    /// Maximum number of processes in each pod (`pids.max` of the pod cgroup); -1 or 0: no
    /// limit [default: -1].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub pod_max_pids: Option<i64>,
    /// Address of the healthz server [default: 127.0.0.1].
    #[arg(long, value_name = "IP")]
    pub healthz_bind_address: Option<IpAddr>,
    /// Port of the healthz server; 0 disables it [default: 10248].
    #[arg(long, value_name = "PORT")]
    pub healthz_port: Option<u16>,
    /// Read-only port (/pods, /metrics, /debug) bound to 127.0.0.1, without authentication:
    /// /pods shows full pod specs, env values included, to every local user. Off unless asked
    /// for, as on a hardened kubelet; the kubelet's old port is 10255 [default: 0 (off)].
    #[arg(long, value_name = "PORT")]
    pub read_only_port: Option<u16>,
    /// How often the manifest path is rescanned (inotify catches changes in between) [default: 20s].
    #[arg(long, value_name = "DURATION")]
    pub file_check_frequency: Option<GoDuration>,
    /// How often a running pod is synced again without an event (jittered by up to 50%); each
    /// sync rewrites its configMap, secret, downwardAPI and projected volumes [default: 1m].
    #[arg(long, value_name = "DURATION")]
    pub sync_frequency: Option<GoDuration>,
    /// URL of pod manifests (a Pod or a PodList, YAML or JSON), fetched every
    /// --http-check-frequency. http:// only.
    #[arg(long, value_name = "URL")]
    pub manifest_url: Option<String>,
    /// HTTP headers for --manifest-url: comma-separated 'Name:Value' pairs; repeatable. Headers
    /// with the same name are all sent, in the order given.
    #[arg(long, value_name = "NAME:VALUE,...")]
    pub manifest_url_header: Vec<String>,
    /// How often --manifest-url is fetched [default: 20s].
    #[arg(long, value_name = "DURATION")]
    pub http_check_frequency: Option<GoDuration>,
    /// kubeconfig of the API server to take this node's pods from (source "api"), and to read
    /// the RuntimeClass a pod's runtimeClassName names and its image pull secrets (any
    /// source's pods).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// eBPF probes: auto (load what can be loaded, warn otherwise), on (fail without them), off.
    #[arg(long, value_name = "MODE", default_value = "auto")]
    pub ebpf: String,
    /// How often the PLEG relists the runtime (swiftlet's own flag; the kubelet's is fixed at
    /// 1s). With eBPF a container's exit is relisted at once anyway [default: 1s].
    #[arg(long, value_name = "DURATION")]
    pub pleg_relist_period: Option<GoDuration>,
    /// Unsafe sysctls (or prefixes ending in `*`, e.g. `kernel.msg*`) pods may set beyond the
    /// safe set; comma-separated, repeatable.
    #[arg(long, value_name = "NAME,...", value_delimiter = ',')]
    pub allowed_unsafe_sysctls: Vec<String>,
    /// Containers without a seccomp profile run the runtime's default profile (RuntimeDefault)
    /// instead of none (Unconfined) [default: false].
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub seccomp_default: Option<bool>,
    /// Most pods this node runs at once; a pod over it is rejected (phase Failed, reason
    /// OutOfpods) [default: 110].
    #[arg(long, value_name = "N")]
    pub max_pods: Option<u32>,
    /// IP addresses of the cluster's DNS servers, comma-separated, repeatable: the nameservers
    /// of pods with dnsPolicy ClusterFirst (and ClusterFirstWithHostNet). Without any, those pods
    /// get the node's resolver configuration (the Default policy) and a warning is logged.
    #[arg(long, value_name = "IP,...", value_delimiter = ',')]
    pub cluster_dns: Vec<String>,
    /// The cluster's DNS domain (kubeadm uses cluster.local): ClusterFirst pods search
    /// <namespace>.svc.<domain>, svc.<domain> and <domain> before the node's search domains
    /// [default: none].
    #[arg(long, value_name = "DOMAIN")]
    pub cluster_domain: Option<String>,
    /// Resolver configuration file the pods' DNS configuration starts from (the Default policy
    /// takes it whole, ClusterFirst its search domains); "" means none: Default pods then
    /// resolve through the node itself (nameserver 127.0.0.1) [default: /etc/resolv.conf].
    #[arg(long, value_name = "FILE")]
    pub resolv_conf: Option<String>,
    /// A container's log is rotated once it reaches this size (a quantity: 10Mi, 64Ki, 1G);
    /// negative turns rotation off [default: 10Mi].
    #[arg(long, value_name = "QUANTITY", allow_negative_numbers = true)]
    pub container_log_max_size: Option<String>,
    /// Log files kept per container: the current one and at most this many minus one rotated
    /// ones, all but the newest gzip-compressed; at least 2 [default: 5].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub container_log_max_files: Option<i64>,
    /// How often the running containers' logs are checked for rotation; at least 3s
    /// [default: 10s].
    #[arg(long, value_name = "DURATION")]
    pub container_log_monitor_interval: Option<GoDuration>,
    /// Containers whose logs are checked and rotated at once; at least 1 [default: 1].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub container_log_max_workers: Option<i64>,
    /// Image garbage collection starts when the image file system is at least this full
    /// (percent; 100 turns it off) [default: 85].
    #[arg(long, value_name = "PERCENT", allow_negative_numbers = true)]
    pub image_gc_high_threshold: Option<i64>,
    /// ... and removes unused images, least recently used first, until the use is down to this
    /// percent; below the high threshold [default: 80].
    #[arg(long, value_name = "PERCENT", allow_negative_numbers = true)]
    pub image_gc_low_threshold: Option<i64>,
    /// An image first seen less than this long ago is never collected [default: 2m].
    #[arg(long, value_name = "DURATION")]
    pub image_minimum_gc_age: Option<GoDuration>,
    /// An image no container has used for this long is removed whatever the disk use; 0 turns
    /// it off. Must exceed --image-minimum-gc-age [default: 0].
    #[arg(long, value_name = "DURATION")]
    pub image_maximum_gc_age: Option<GoDuration>,
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
    /// Pull one image at a time (the kubelet's default is true; swiftlet's is false: distinct
    /// images pull in parallel, and pods asking for one image wait for one pull of it)
    /// [default: false].
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub serialize_image_pulls: Option<bool>,
    /// At most this many image pulls at once; at least 1, and only with
    /// --serialize-image-pulls=false [default: no limit].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub max_parallel_image_pulls: Option<i64>,
    /// How often image garbage collection looks (swiftlet's own flag; the kubelet's period is
    /// fixed at 5m) [default: 5m].
    #[arg(long, value_name = "DURATION")]
    pub image_gc_period: Option<GoDuration>,
    /// Hard eviction thresholds: comma-separated <signal><<quantity or percent> (memory.available,
    /// allocatableMemory.available, nodefs.available, nodefs.inodesFree, imagefs.available,
    /// pid.available); "" for none [default: memory.available<100Mi,nodefs.available<10%,
    /// nodefs.inodesFree<5%,imagefs.available<15%].
    #[arg(long, value_name = "THRESHOLDS")]
    pub eviction_hard: Option<String>,
    /// Soft eviction thresholds, as --eviction-hard; each acted on only once met for its grace
    /// period in --eviction-soft-grace-period [default: none].
    #[arg(long, value_name = "THRESHOLDS")]
    pub eviction_soft: Option<String>,
    /// Grace periods of the soft thresholds: comma-separated <signal>=<duration>
    /// (memory.available=1m30s).
    #[arg(long, value_name = "GRACE_PERIODS")]
    pub eviction_soft_grace_period: Option<String>,
    /// Most seconds of grace a pod evicted for a soft threshold gets (less when its own is less;
    /// negative: its own) [default: 0].
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub eviction_max_pod_grace_period: Option<i64>,
    /// Once a threshold is acted on, how much more than it must be available before it is no
    /// longer met: comma-separated <signal>=<quantity or percent> [default: none].
    #[arg(long, value_name = "AMOUNTS")]
    pub eviction_minimum_reclaim: Option<String>,
    /// How often the eviction manager observes the signals (swiftlet's own; the kubelet's is
    /// fixed at 10s) [default: 10s].
    #[arg(long, value_name = "DURATION")]
    pub eviction_monitoring_interval: Option<GoDuration>,
    /// How long a node condition stays after its threshold is no longer met [default: 5m].
    #[arg(long, value_name = "DURATION")]
    pub eviction_pressure_transition_period: Option<GoDuration>,
    /// Resources reserved for the system (memory=<quantity>,...): pods may not use them; the
    /// allocatableMemory.available signal counts from capacity minus both reservations.
    #[arg(long, value_name = "RESOURCES")]
    pub system_reserved: Option<String>,
    /// Where node allocatable is enforced: "pods" (the kubepods cgroup gets cpu shares and a
    /// memory limit of capacity less --system-reserved and --kube-reserved) or "none";
    /// system-reserved and kube-reserved (their own cgroups) are not implemented [default: pods].
    #[arg(long, value_name = "LEVELS")]
    pub enforce_node_allocatable: Option<String>,
    /// Resources reserved for the node's Kubernetes daemons (memory=<quantity>,...).
    #[arg(long, value_name = "RESOURCES")]
    pub kube_reserved: Option<String>,
    /// Port of the kubelet API (HTTPS: /containerLogs, /exec, /attach, /portForward, /run,
    /// /pods, /metrics, /healthz); 0 turns it off (swiftlet's own) [default: 10250].
    #[arg(long, value_name = "PORT")]
    pub port: Option<u16>,
    /// Address the kubelet API listens on [default: 0.0.0.0].
    #[arg(long, value_name = "IP")]
    pub address: Option<IpAddr>,
    /// The kubelet API's serving certificate (PEM, leaf first); without it a self-signed one is
    /// made in --cert-dir.
    #[arg(long, value_name = "FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert-file.
    #[arg(long, value_name = "FILE")]
    pub tls_private_key_file: Option<PathBuf>,
    /// Where the self-signed serving certificate is kept (kubelet.crt, kubelet.key)
    /// [default: <root-dir>/pki].
    #[arg(long, value_name = "DIR")]
    pub cert_dir: Option<PathBuf>,
    /// CA certificates (PEM): a kubelet API client presenting a certificate they signed is
    /// authenticated as the certificate's common name (organizations are its groups).
    #[arg(long, value_name = "FILE")]
    pub client_ca_file: Option<PathBuf>,
    /// Serve kubelet API requests that bring no client certificate, as system:anonymous. Off
    /// unless asked for (the Go kubelet's flag defaults to on; hardened set-ups turn it off)
    /// [default: false].
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub anonymous_auth: Option<bool>,
    /// Authorization of kubelet API requests: AlwaysAllow (every authenticated caller may do
    /// everything) or Webhook (a SubjectAccessReview to the API server of --kubeconfig on
    /// nodes/<subresource> per request) [default: AlwaysAllow].
    #[arg(long, value_name = "MODE")]
    pub authorization_mode: Option<String>,
    /// How long an allowed Webhook decision is cached [default: 5m].
    #[arg(long, value_name = "DURATION")]
    pub authorization_webhook_cache_authorized_ttl: Option<GoDuration>,
    /// How long a denied Webhook decision is cached [default: 30s].
    #[arg(long, value_name = "DURATION")]
    pub authorization_webhook_cache_unauthorized_ttl: Option<GoDuration>,
    /// Authenticate kubelet API bearer tokens with a TokenReview to the API server of
    /// --kubeconfig [default: false].
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub authentication_token_webhook: Option<bool>,
    /// How long a TokenReview's answer is cached [default: 2m].
    #[arg(long, value_name = "DURATION")]
    pub authentication_token_webhook_cache_ttl: Option<GoDuration>,
    /// Register this node with the API server of --kubeconfig (create its Node object); off:
    /// only an existing Node's status is kept [default: true].
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub register_node: Option<bool>,
    /// Labels of the Node at registration: <key>=<value>, comma-separated, repeatable. Keys of
    /// the kubernetes.io and k8s.io namespaces only with the prefixes kubelet.kubernetes.io and
    /// node.kubernetes.io or the well-known keys (topology.kubernetes.io/zone, ...).
    #[arg(long, value_name = "KEY=VALUE,...")]
    pub node_labels: Vec<String>,
    /// Taints of the Node at registration: <key>[=<value>]:<effect>, comma-separated,
    /// repeatable; effect NoSchedule, PreferNoSchedule or NoExecute.
    #[arg(long, value_name = "TAINTS")]
    pub register_with_taints: Vec<String>,
    /// The Node's InternalIP addresses (comma-separated, one per family) [default: the address
    /// of the default route's interface].
    #[arg(long, value_name = "IP,...", value_delimiter = ',')]
    pub node_ip: Vec<IpAddr>,
    /// How often the node status is computed; it is written when it changed or
    /// nodeStatusReportFrequency (5m) passed [default: 10s].
    #[arg(long, value_name = "DURATION")]
    pub node_status_update_frequency: Option<GoDuration>,
    /// How many images (the largest first) the node status lists; -1: all [default: 50].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub node_status_max_images: Option<i32>,
    /// Log verbosity like the kubelet's -v (0-2 info, 3-4 debug, 5+ trace). RUST_LOG overrides.
    #[arg(short = 'v', long = "v", value_name = "LEVEL", default_value_t = 0)]
    pub verbosity: u8,
    /// Log format: text, or json (one JSON object a line: timestamp, level, target, message
    /// and the event's fields). Text has colours only when stderr is a terminal [default: text].
    #[arg(long, value_name = "FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub logging_format: String,
}

/// The subset of KubeletConfiguration swiftlet reads. Other fields are not refused, as a kubelet
/// config written for the Go kubelet carries many fields swiftlet does not implement, but
/// [`KubeletConfiguration::load`] names them in a warning.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletConfiguration {
    pub api_version: Option<String>,
    pub kind: Option<String>,
    /// The fields swiftlet does not read, by name.
    #[serde(flatten)]
    pub unknown: std::collections::BTreeMap<String, serde_json::Value>,
    pub static_pod_path: Option<PathBuf>,
    pub container_runtime_endpoint: Option<String>,
    pub runtime_request_timeout: Option<GoDuration>,
    pub cgroup_root: Option<String>,
    #[serde(rename = "cgroupsPerQOS")]
    pub cgroups_per_qos: Option<bool>,
    pub cgroup_driver: Option<String>,
    pub pod_pids_limit: Option<i64>,
    pub healthz_bind_address: Option<IpAddr>,
    pub healthz_port: Option<u16>,
    pub read_only_port: Option<u16>,
    pub file_check_frequency: Option<GoDuration>,
    pub sync_frequency: Option<GoDuration>,
    pub pod_logs_dir: Option<PathBuf>,
    #[serde(rename = "staticPodURL")]
    pub static_pod_url: Option<String>,
    /// Header name -> values.
    #[serde(rename = "staticPodURLHeader")]
    pub static_pod_url_header: Option<std::collections::BTreeMap<String, Vec<String>>>,
    pub http_check_frequency: Option<GoDuration>,
    pub allowed_unsafe_sysctls: Option<Vec<String>>,
    pub seccomp_default: Option<bool>,
    pub max_pods: Option<u32>,
    #[serde(rename = "clusterDNS")]
    pub cluster_dns: Option<Vec<String>>,
    pub cluster_domain: Option<String>,
    pub resolv_conf: Option<String>,
    pub container_log_max_size: Option<String>,
    pub container_log_max_files: Option<i64>,
    pub container_log_monitor_interval: Option<GoDuration>,
    pub container_log_max_workers: Option<i64>,
    #[serde(rename = "imageGCHighThresholdPercent")]
    pub image_gc_high_threshold_percent: Option<i64>,
    #[serde(rename = "imageGCLowThresholdPercent")]
    pub image_gc_low_threshold_percent: Option<i64>,
    #[serde(rename = "imageMinimumGCAge")]
    pub image_minimum_gc_age: Option<GoDuration>,
    pub serialize_image_pulls: Option<bool>,
    pub max_parallel_image_pulls: Option<i64>,
    #[serde(rename = "imageMaximumGCAge")]
    pub image_maximum_gc_age: Option<GoDuration>,
    pub port: Option<u16>,
    pub address: Option<IpAddr>,
    pub tls_cert_file: Option<PathBuf>,
    pub tls_private_key_file: Option<PathBuf>,
    pub authentication: Option<Authentication>,
    pub authorization: Option<Authorization>,
    pub register_node: Option<bool>,
    pub node_labels: Option<std::collections::BTreeMap<String, String>>,
    pub register_with_taints: Option<Vec<k8s_openapi::api::core::v1::Taint>>,
    pub node_status_update_frequency: Option<GoDuration>,
    pub node_status_report_frequency: Option<GoDuration>,
    pub node_status_max_images: Option<i32>,
    pub node_lease_duration_seconds: Option<u32>,
    pub system_reserved: Option<std::collections::BTreeMap<String, String>>,
    pub kube_reserved: Option<std::collections::BTreeMap<String, String>>,
    /// Signal -> quantity or percent.
    pub eviction_hard: Option<std::collections::BTreeMap<String, String>>,
    pub eviction_soft: Option<std::collections::BTreeMap<String, String>>,
    /// Signal -> duration.
    pub eviction_soft_grace_period: Option<std::collections::BTreeMap<String, String>>,
    pub eviction_max_pod_grace_period: Option<i64>,
    pub eviction_minimum_reclaim: Option<std::collections::BTreeMap<String, String>>,
    pub eviction_pressure_transition_period: Option<GoDuration>,
    pub enforce_node_allocatable: Option<Vec<String>>,
}

/// `authentication` of a KubeletConfiguration: `x509.clientCAFile`, `anonymous.enabled`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Authentication {
    pub x509: Option<X509Authentication>,
    pub anonymous: Option<AnonymousAuthentication>,
    pub webhook: Option<WebhookAuthentication>,
}

/// `authentication.webhook`: `enabled`, `cacheTTL`.
#[derive(Debug, Default, Deserialize)]
pub struct WebhookAuthentication {
    pub enabled: Option<bool>,
    #[serde(rename = "cacheTTL")]
    pub cache_ttl: Option<GoDuration>,
}

/// `authorization.webhook`: `cacheAuthorizedTTL`, `cacheUnauthorizedTTL`.
#[derive(Debug, Default, Deserialize)]
pub struct WebhookAuthorization {
    #[serde(rename = "cacheAuthorizedTTL")]
    pub cache_authorized_ttl: Option<GoDuration>,
    #[serde(rename = "cacheUnauthorizedTTL")]
    pub cache_unauthorized_ttl: Option<GoDuration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct X509Authentication {
    #[serde(rename = "clientCAFile")]
    pub client_ca_file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
pub struct AnonymousAuthentication {
    pub enabled: Option<bool>,
}

/// `authorization` of a KubeletConfiguration: `mode`, `webhook`.
#[derive(Debug, Default, Deserialize)]
pub struct Authorization {
    pub mode: Option<String>,
    pub webhook: Option<WebhookAuthorization>,
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
    pub http_check_frequency: Duration,
    /// `--kubeconfig`: the API server source.
    pub kubeconfig: Option<PathBuf>,
    pub ebpf: crate::ebpf::Mode,
    pub pleg_relist_period: Duration,
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
}

/// The kubelet API's settings.
#[derive(Debug, Clone)]
pub struct KubeletApi {
    pub addr: std::net::SocketAddr,
    pub tls: crate::server::tls::Files,
    pub anonymous: bool,
    /// Token and access reviews (they need `--kubeconfig`).
    pub webhook: crate::server::webhook::Settings,
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
        if !cfg.unknown.is_empty() {
            let names: Vec<&str> = cfg.unknown.keys().map(String::as_str).collect();
            tracing::warn!(
                path = %path.display(),
                fields = %names.join(", "),
                "config file: fields swiftlet does not implement are ignored"
            );
        }
        Ok(cfg)
    }
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

/// Parses `--manifest-url-header` values: each is comma-separated `Name:Value` pairs (the value
/// may itself contain ':').
pub fn parse_headers(values: &[String]) -> Result<Vec<(String, String)>, Error> {
    let mut out = Vec::new();
    for value in values {
        for pair in value.split(',') {
            match pair.split_once(':') {
                Some((name, v)) if !name.trim().is_empty() => {
                    out.push((name.trim().to_owned(), v.trim().to_owned()));
                }
                _ => return Err(Error::Header(value.clone())),
            }
        }
    }
    Ok(out)
}

fn hostname() -> Result<String, Error> {
    crate::cm::hostname().map_err(|e| Error::Hostname(e.to_string()))
}

impl Flags {
    /// Merges flags over the config file over the defaults.
    pub fn resolve(self) -> Result<AgentConfig, Error> {
        let file = match &self.config {
            Some(path) => KubeletConfiguration::load(path)?,
            None => KubeletConfiguration::default(),
        };
        let driver = self
            .cgroup_driver
            .or(file.cgroup_driver)
            .unwrap_or_else(|| "cgroupfs".to_owned());
        let systemd_cgroups = match driver.as_str() {
            "cgroupfs" => false,
            "systemd" => true,
            _ => return Err(Error::CgroupDriver(driver)),
        };
        let node_name = match self.hostname_override {
            Some(n) => n,
            None => hostname()?,
        }
        .to_lowercase();
        let mut manifest_url_headers = parse_headers(&self.manifest_url_header)?;
        if self.manifest_url_header.is_empty() {
            for (name, values) in file.static_pod_url_header.into_iter().flatten() {
                manifest_url_headers.extend(values.into_iter().map(|v| (name.clone(), v)));
            }
        }
        let ebpf: crate::ebpf::Mode = self
            .ebpf
            .parse()
            .map_err(|_| Error::Ebpf(self.ebpf.clone()))?;
        if ebpf == crate::ebpf::Mode::On && !crate::ebpf::BUILT_IN {
            return Err(Error::EbpfNotBuilt);
        }
        let pleg_relist_period = duration_or(self.pleg_relist_period, Duration::from_secs(1));
        if pleg_relist_period < Duration::from_millis(1) {
            return Err(Error::RelistPeriod(pleg_relist_period));
        }
        let runtime_request_timeout = duration_or(
            self.runtime_request_timeout
                .or(file.runtime_request_timeout),
            Duration::from_secs(120),
        );
        if runtime_request_timeout.is_zero() {
            return Err(Error::RequestTimeout(runtime_request_timeout));
        }
        let cluster_dns = if self.cluster_dns.is_empty() {
            file.cluster_dns.unwrap_or_default()
        } else {
            self.cluster_dns
        };
        let resolv_conf = self
            .resolv_conf
            .or(file.resolv_conf)
            .unwrap_or_else(|| crate::dns::DEFAULT_RESOLV_CONF.to_owned());
        let dns = crate::dns::Settings {
            cluster_dns: cluster_dns
                .iter()
                .filter(|ip| !ip.trim().is_empty())
                .map(|ip| ip.trim().parse().map_err(|_| Error::ClusterDns(ip.clone())))
                .collect::<Result<_, _>>()?,
            cluster_domain: self
                .cluster_domain
                .or(file.cluster_domain)
                .unwrap_or_default(),
            resolv_conf: (!resolv_conf.is_empty()).then(|| PathBuf::from(resolv_conf)),
            node_hosts: PathBuf::from(crate::dns::NODE_HOSTS),
        };
        let monitor_interval = duration_or(
            self.container_log_monitor_interval
                .or(file.container_log_monitor_interval),
            crate::logs::DEFAULT_MONITOR_INTERVAL,
        );
        let container_logs = crate::logs::Policy::new(
            self.container_log_max_size
                .or(file.container_log_max_size)
                .as_deref()
                .unwrap_or(crate::logs::DEFAULT_MAX_SIZE),
            self.container_log_max_files
                .or(file.container_log_max_files)
                .unwrap_or(crate::logs::DEFAULT_MAX_FILES),
            monitor_interval,
            self.container_log_max_workers
                .or(file.container_log_max_workers)
                .unwrap_or(crate::logs::DEFAULT_MAX_WORKERS),
        )?;
        let limit = |v: Option<i64>, default: Option<usize>| match v {
            None => default,
            Some(n) => usize::try_from(n).ok(),
        };
        let container_gc = crate::container_gc::Policy {
            min_age: duration_or(self.minimum_container_ttl_duration, Duration::ZERO),
            max_per_container: limit(
                self.maximum_dead_containers_per_container,
                Some(crate::container_gc::MAX_DEAD_PER_CONTAINER),
            ),
            max_containers: limit(self.maximum_dead_containers, None),
        };
        let max_parallel_image_pulls = image_pull_limit(
            self.serialize_image_pulls
                .or(file.serialize_image_pulls)
                .unwrap_or(false),
            self.max_parallel_image_pulls
                .or(file.max_parallel_image_pulls),
        )?;
        let image_gc = crate::images::gc::Policy::new(
            self.image_gc_high_threshold
                .or(file.image_gc_high_threshold_percent)
                .unwrap_or(crate::images::gc::DEFAULT_HIGH_THRESHOLD),
            self.image_gc_low_threshold
                .or(file.image_gc_low_threshold_percent)
                .unwrap_or(crate::images::gc::DEFAULT_LOW_THRESHOLD),
            duration_or(
                self.image_minimum_gc_age.or(file.image_minimum_gc_age),
                crate::images::gc::DEFAULT_MINIMUM_AGE,
            ),
            duration_or(self.image_gc_period, crate::images::gc::DEFAULT_PERIOD),
        )?
        .with_max_age(duration_or(
            self.image_maximum_gc_age.or(file.image_maximum_gc_age),
            Duration::ZERO,
        ))?;
        let root_dir = self
            .root_dir
            .unwrap_or_else(|| PathBuf::from("/var/lib/swiftlet"));
        let (authentication, authorization) = (
            file.authentication.unwrap_or_default(),
            file.authorization.unwrap_or_default(),
        );
        let mode = self
            .authorization_mode
            .or(authorization.mode)
            .unwrap_or_else(|| "AlwaysAllow".to_owned());
        let access_ttls = match mode.as_str() {
            "AlwaysAllow" => None,
            "Webhook" => {
                let hook = authorization.webhook.unwrap_or_default();
                Some((
                    duration_or(
                        self.authorization_webhook_cache_authorized_ttl
                            .or(hook.cache_authorized_ttl),
                        Duration::from_secs(300),
                    ),
                    duration_or(
                        self.authorization_webhook_cache_unauthorized_ttl
                            .or(hook.cache_unauthorized_ttl),
                        Duration::from_secs(30),
                    ),
                ))
            }
            _ => return Err(Error::AuthorizationMode(mode)),
        };
        let token_hook = authentication.webhook.unwrap_or_default();
        let token_ttl = if self
            .authentication_token_webhook
            .or(token_hook.enabled)
            .unwrap_or(false)
        {
            Some(duration_or(
                self.authentication_token_webhook_cache_ttl
                    .or(token_hook.cache_ttl),
                Duration::from_secs(120),
            ))
        } else {
            None
        };
        let webhook = crate::server::webhook::Settings {
            token_ttl,
            access_ttls,
        };
        let cert_and_key = match (
            self.tls_cert_file.or(file.tls_cert_file),
            self.tls_private_key_file.or(file.tls_private_key_file),
        ) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            _ => return Err(Error::TlsPair),
        };
        // A config file's map form (`systemReserved: {memory: 1Gi}`) reads as the flag's.
        // The config file's maps as the flags' comma-separated lists (`k=v` or `k<v`).
        let listed = |m: Option<std::collections::BTreeMap<String, String>>, sep: &str| {
            m.map(|m| {
                m.iter()
                    .map(|(k, v)| format!("{k}{sep}{v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            })
        };
        let reserved = |v: Option<String>| -> Result<crate::eviction::Reserved, Error> {
            Ok(v.map(|v| crate::eviction::Reserved::parse(&v))
                .transpose()?
                .unwrap_or_default())
        };
        let reserved = reserved(self.system_reserved.or(listed(file.system_reserved, "=")))?.plus(
            reserved(self.kube_reserved.or(listed(file.kube_reserved, "=")))?,
        );
        let pod_logs_dir = self
            .pod_logs_dir
            .or(file.pod_logs_dir)
            .unwrap_or_else(|| PathBuf::from("/var/log/pods"));
        let mut thresholds = crate::eviction::parse_thresholds(
            &self
                .eviction_hard
                .or(listed(file.eviction_hard, "<"))
                .unwrap_or_else(|| crate::eviction::DEFAULT_HARD.to_owned()),
        )?;
        let grace_periods = self
            .eviction_soft_grace_period
            .or(listed(file.eviction_soft_grace_period, "="))
            .unwrap_or_default();
        let grace_periods =
            crate::eviction::parse_pairs("--eviction-soft-grace-period", &grace_periods)?
                .into_iter()
                .map(|(signal, v)| Ok((signal, parse_duration("--eviction-soft-grace-period", v)?)))
                .collect::<Result<Vec<_>, Error>>()?;
        thresholds.extend(crate::eviction::parse_soft(
            &self
                .eviction_soft
                .or(listed(file.eviction_soft, "<"))
                .unwrap_or_default(),
            &grace_periods,
        )?);
        crate::eviction::apply_min_reclaim(
            &mut thresholds,
            &self
                .eviction_minimum_reclaim
                .or(listed(file.eviction_minimum_reclaim, "="))
                .unwrap_or_default(),
        )?;
        let enforce = self
            .enforce_node_allocatable
            .or(file.enforce_node_allocatable.map(|l| l.join(",")))
            .unwrap_or_else(|| "pods".to_owned());
        let mut enforce_node_allocatable = false;
        for level in enforce.split(',').map(str::trim).filter(|l| !l.is_empty()) {
            match level {
                "pods" => enforce_node_allocatable = true,
                "none" => {}
                other => return Err(Error::EnforceNodeAllocatable(other.to_owned())),
            }
        }
        let eviction = crate::eviction::Config {
            thresholds,
            max_pod_grace_period: self
                .eviction_max_pod_grace_period
                .or(file.eviction_max_pod_grace_period)
                .unwrap_or(0),
            pod_logs_dir: pod_logs_dir.clone(),
            interval: {
                let d = duration_or(self.eviction_monitoring_interval, Duration::from_secs(10));
                if d < Duration::from_millis(100) {
                    return Err(Error::TooShort {
                        what: "--eviction-monitoring-interval",
                        value: d,
                        min: Duration::from_millis(100),
                    });
                }
                d
            },
            pressure_transition: duration_or(
                self.eviction_pressure_transition_period
                    .or(file.eviction_pressure_transition_period),
                Duration::from_secs(300),
            ),
            reserved_memory: reserved.memory,
            root_dir: root_dir.clone(),
        };
        let port = self.port.or(file.port).unwrap_or(10250);
        let max_pods = self.max_pods.or(file.max_pods).unwrap_or(110);
        let node = crate::node::Config {
            node_name: node_name.clone(),
            register: self.register_node.or(file.register_node).unwrap_or(true),
            labels: if self.node_labels.is_empty() {
                let labels = file.node_labels.unwrap_or_default();
                for (k, v) in &labels {
                    crate::node::check_label(k, v)?;
                }
                labels
            } else {
                crate::node::parse_labels(&self.node_labels.join(","))?
            },
            taints: if self.register_with_taints.is_empty() {
                file.register_with_taints.unwrap_or_default()
            } else {
                crate::node::parse_taints(&self.register_with_taints.join(","))?
            },
            node_ips: self.node_ip,
            max_pods,
            root_dir: root_dir.clone(),
            kubelet_port: port,
            status_update_frequency: duration_or(
                self.node_status_update_frequency
                    .or(file.node_status_update_frequency),
                Duration::from_secs(10),
            ),
            status_report_frequency: duration_or(
                file.node_status_report_frequency,
                Duration::from_secs(300),
            ),
            max_images: self
                .node_status_max_images
                .or(file.node_status_max_images)
                .unwrap_or(50),
            lease_duration: Duration::from_secs(
                file.node_lease_duration_seconds.unwrap_or(40).max(1).into(),
            ),
            reserved,
            eviction_hard: eviction.hard(),
        };
        if self.kubeconfig.is_none() {
            if webhook.access_ttls.is_some() {
                return Err(Error::WebhookWithoutApi("--authorization-mode=Webhook"));
            }
            if webhook.token_ttl.is_some() {
                return Err(Error::WebhookWithoutApi("--authentication-token-webhook"));
            }
        }
        let kubelet_api = (port != 0).then(|| KubeletApi {
            addr: std::net::SocketAddr::new(
                self.address
                    .or(file.address)
                    .unwrap_or(IpAddr::from([0, 0, 0, 0])),
                port,
            ),
            tls: crate::server::tls::Files {
                cert_and_key,
                cert_dir: self.cert_dir.unwrap_or_else(|| root_dir.join("pki")),
                client_ca: self
                    .client_ca_file
                    .or(authentication.x509.and_then(|x| x.client_ca_file)),
            },
            anonymous: self
                .anonymous_auth
                .or(authentication.anonymous.and_then(|a| a.enabled))
                .unwrap_or(false),
            webhook,
        });
        Ok(AgentConfig {
            systemd_cgroups,
            node,
            enforce_node_allocatable,
            eviction,
            kubelet_api,
            image_gc,
            container_gc,
            max_parallel_image_pulls,
            pod_manifest_path: self.pod_manifest_path.or(file.static_pod_path),
            container_runtime_endpoint: self
                .container_runtime_endpoint
                .or(file.container_runtime_endpoint)
                .unwrap_or_else(|| DEFAULT_RUNTIME_ENDPOINT.to_owned()),
            runtime_request_timeout,
            root_dir,
            pod_logs_dir,
            node_name,
            cgroup_root: self
                .cgroup_root
                .or(file.cgroup_root)
                .unwrap_or_else(|| "/".to_owned()),
            cgroups_per_qos: self
                .cgroups_per_qos
                .or(file.cgroups_per_qos)
                .unwrap_or(true),
            pod_pids_limit: self.pod_max_pids.or(file.pod_pids_limit).unwrap_or(-1),
            healthz_bind_address: self
                .healthz_bind_address
                .or(file.healthz_bind_address)
                .unwrap_or(IpAddr::from([127, 0, 0, 1])),
            healthz_port: self.healthz_port.or(file.healthz_port).unwrap_or(10248),
            read_only_port: self.read_only_port.or(file.read_only_port).unwrap_or(0),
            file_check_frequency: duration_or(
                self.file_check_frequency.or(file.file_check_frequency),
                Duration::from_secs(20),
            ),
            sync_frequency: duration_or(
                self.sync_frequency.or(file.sync_frequency),
                Duration::from_secs(60),
            ),
            manifest_url: self.manifest_url.or(file.static_pod_url),
            manifest_url_headers,
            http_check_frequency: duration_or(
                self.http_check_frequency.or(file.http_check_frequency),
                Duration::from_secs(20),
            ),
            kubeconfig: self.kubeconfig,
            ebpf,
            pleg_relist_period,
            allowed_unsafe_sysctls: if self.allowed_unsafe_sysctls.is_empty() {
                file.allowed_unsafe_sysctls.unwrap_or_default()
            } else {
                self.allowed_unsafe_sysctls
            },
            seccomp_default: self
                .seccomp_default
                .or(file.seccomp_default)
                .unwrap_or(false),
            max_pods,
            dns,
            container_logs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Resolves the flags `args` (with a node name, so the host's does not matter).
    fn resolve(args: &[&str]) -> Result<AgentConfig, Error> {
        let mut all = vec!["swiftlet", "--hostname-override", "n"];
        all.extend(args);
        Flags::try_parse_from(all).expect("flags parse").resolve()
    }

    /// clap's error for the flags `args`, which must not parse.
    fn refused(args: &[&str]) -> String {
        let mut all = vec!["swiftlet", "--hostname-override", "n"];
        all.extend(args);
        Flags::try_parse_from(all)
            .expect_err("flags refused")
            .to_string()
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
            let mut all = vec!["swiftlet", "--config", path.to_str().unwrap()];
            all.extend_from_slice(args);
            Flags::parse_from(all)
                .resolve()
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
        let flags = Flags::parse_from([
            "swiftlet",
            "--config",
            path.to_str().unwrap(),
            "--healthz-port",
            "2222",
            "--hostname-override",
            "Node-A",
        ]);
        let cfg = flags.resolve().unwrap();
        assert_eq!(cfg.pod_manifest_path, Some(PathBuf::from("/etc/pods")));
        assert_eq!(cfg.read_only_port, 0);
        assert_eq!(cfg.healthz_port, 2222);
        assert_eq!(cfg.node_name, "node-a");
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
        assert!(resolve(&["--port", "0"]).unwrap().kubelet_api.is_none());
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

    #[test]
    fn manifest_url_flags() {
        let flags = Flags::parse_from([
            "swiftlet",
            "--hostname-override",
            "n",
            "--manifest-url",
            "http://127.0.0.1:8080/pods",
            "--manifest-url-header",
            "a:hello,b:again",
            "--manifest-url-header",
            "b:x:y",
            "--http-check-frequency",
            "5s",
        ]);
        let cfg = flags.resolve().unwrap();
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
        let defaults = Flags::parse_from(["swiftlet", "--hostname-override", "n"])
            .resolve()
            .unwrap();
        assert_eq!(defaults.http_check_frequency, Duration::from_secs(20));
        assert!(defaults.manifest_url.is_none() && defaults.kubeconfig.is_none());
        // Unauthenticated endpoints are off unless asked for; the kubelet's pod count applies.
        assert_eq!(defaults.read_only_port, 0);
        assert_eq!(defaults.healthz_port, 10248);
        assert_eq!(defaults.max_pods, 110);
        for bad in ["novalue", ":v", "a:b,"] {
            assert!(parse_headers(&[bad.to_owned()]).is_err(), "{bad}");
        }
    }

    #[test]
    fn takes_both_cgroup_drivers_and_rejects_others_and_a_wrong_kind() {
        let driver = |name: &str| {
            Flags::parse_from([
                "swiftlet",
                "--cgroup-driver",
                name,
                "--hostname-override",
                "n",
            ])
            .resolve()
        };
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
            let mut args = vec!["swiftlet", "--hostname-override", "n"];
            args.extend(v.map(|v| ["--pleg-relist-period", v]).into_iter().flatten());
            Flags::try_parse_from(args).expect("flags parse").resolve()
        };
        assert_eq!(
            parse(None).unwrap().pleg_relist_period,
            Duration::from_secs(1)
        );
        assert_eq!(
            parse(Some("250ms")).unwrap().pleg_relist_period,
            Duration::from_millis(250)
        );
        assert!(matches!(parse(Some("0s")), Err(Error::RelistPeriod(_))));
        for bad in ["1x", ""] {
            let e = refused(&["--pleg-relist-period", bad]);
            assert!(e.contains("--pleg-relist-period"), "{bad}: {e}");
        }
    }
}
