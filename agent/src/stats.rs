//! The kubelet's stats summary (`/stats/summary`): the node's and each pod's cpu, memory,
//! network and file systems, and each container's cpu, memory and writable layer. Pods and the
//! node are read from their cgroups (`cm::CgroupUsage`), containers from the runtime's
//! `ListContainerStats`, networks from `/proc/<pid>/net/dev` of each sandbox (and of the agent
//! for the node), file systems with `statvfs` and the runtime's `ImageFsInfo`.
//!
//! Cpu rates (`usageNanoCores`) need two reads: the provider keeps each cgroup's last cpu time
//! and reports the rate since it (the first read of a pod reports none, as the kubelet's).
mod exposition;
mod volumes;

pub use volumes::{PvcRef, VolumeStats};

use crate::cm::{CgroupDirs, CgroupUsage, ContainerManager, KeptFile, MemoryUsage};
use crate::cri::Cri;
use crate::pod::labels;
use crate::pod_cache::{PodCache, QuietListing};
use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub node: NodeStats,
    pub pods: Vec<PodStats>,
    /// The runtime's container stats could not be read (`resource_scrape_error`).
    #[serde(skip)]
    pub container_stats_failed: bool,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStats {
    pub node_name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_time: Option<String>,
    #[serde(flatten)]
    pub usage: Usage,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fs: Option<FsStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rlimit: Option<RlimitStats>,
}

/// The cpu, memory and network of the node or of a pod.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStats>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeStats {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_fs: Option<FsStats>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RlimitStats {
    pub time: String,
    pub maxpid: Option<u64>,
    pub curproc: Option<u64>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodReference {
    pub name: String,
    pub namespace: String,
    pub uid: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    pub pod_ref: PodReference,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_time: Option<String>,
    pub containers: Vec<ContainerStats>,
    #[serde(flatten)]
    pub usage: Usage,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process_stats: Option<ProcessStats>,
    /// Its volumes, as last measured (see `--volume-stats-agg-period`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub volume: Vec<VolumeStats>,
    /// The pod's cgroup, as `/metrics/cadvisor` names it (`id`).
    #[serde(skip)]
    pub cgroup: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessStats {
    pub process_count: u64,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStats {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_time: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<FsStats>,
    /// Which runtime container this is (for `/metrics/cadvisor`'s labels).
    #[serde(skip)]
    pub runtime: Option<ContainerRef>,
}

/// A running container as `/metrics/cadvisor` labels it.
#[derive(Debug, Clone, Default)]
pub struct ContainerRef {
    /// The runtime's container ID (`name`).
    pub id: String,
    /// The image the pod's spec names for it (`image`).
    pub image: String,
    /// Its cgroup (`id`): the pod's cgroup and the runtime's child of it.
    pub cgroup: String,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuStats {
    pub time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_nano_cores: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_core_nano_seconds: Option<u64>,
    /// The CFS quota's throttling, for `/metrics/cadvisor`: the summary has no field
    /// for it.
    #[serde(skip)]
    pub throttling: Option<crate::cm::CpuThrottling>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    pub time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    pub usage_bytes: u64,
    pub working_set_bytes: u64,
    pub rss_bytes: u64,
    pub page_faults: u64,
    pub major_page_faults: u64,
    /// The page cache, for `/metrics/cadvisor` (`container_memory_cache`).
    #[serde(skip)]
    pub cache_bytes: u64,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceStats {
    pub name: String,
    pub rx_bytes: u64,
    pub rx_errors: u64,
    pub tx_bytes: u64,
    pub tx_errors: u64,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkStats {
    pub time: String,
    /// The default interface's counters, at the top level as in the kubelet's document.
    #[serde(flatten)]
    pub default: InterfaceStats,
    pub interfaces: Vec<InterfaceStats>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FsStats {
    pub time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes_free: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes_used: Option<u64>,
}

impl FsStats {
    fn of(time: &str, s: crate::cm::FsSpace) -> Self {
        Self {
            time: time.to_owned(),
            available_bytes: Some(s.available_bytes),
            capacity_bytes: Some(s.capacity_bytes),
            used_bytes: Some(s.used_bytes),
            inodes_free: Some(s.inodes_free),
            inodes: Some(s.inodes),
            inodes_used: Some(s.inodes.saturating_sub(s.inodes_free)),
        }
    }
}

/// `/proc/net/dev`: the counters of each interface but loopback.
pub fn parse_net_dev(text: &str) -> Vec<InterfaceStats> {
    text.lines()
        .skip(2)
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let name = name.trim();
            let f: Vec<u64> = rest
                .split_whitespace()
                .map(|v| v.parse().unwrap_or(0))
                .collect();
            (name != "lo" && f.len() >= 11).then(|| InterfaceStats {
                name: name.to_owned(),
                rx_bytes: f[0],
                rx_errors: f[2],
                tx_bytes: f[8],
                tx_errors: f[10],
            })
        })
        .collect()
}

/// The interface of the default route in `/proc/net/route` (destination 0).
pub fn default_route_interface(route: &str) -> Option<String> {
    route.lines().skip(1).find_map(|l| {
        let mut f = l.split_whitespace();
        let (iface, dest) = (f.next()?, f.next()?);
        (dest == "00000000").then(|| iface.to_owned())
    })
}

/// The node's network, from the agent's own namespace.
fn node_network(time: &str, default: Option<&str>) -> Option<NetworkStats> {
    network(
        time,
        &std::fs::read_to_string("/proc/self/net/dev").ok()?,
        default,
    )
}

/// The network of a `/proc/<pid>/net/dev` text: the interfaces but loopback, and the default
/// one (else `eth0`, else the first).
fn network(time: &str, net_dev: &str, default: Option<&str>) -> Option<NetworkStats> {
    let interfaces = parse_net_dev(net_dev);
    let chosen = default
        .and_then(|d| interfaces.iter().find(|i| i.name == d))
        .or_else(|| interfaces.iter().find(|i| i.name == "eth0"))
        .or_else(|| interfaces.first())?
        .clone();
    Some(NetworkStats {
        time: time.to_owned(),
        default: chosen,
        interfaces,
    })
}

fn rfc3339(t: &jiff::Timestamp) -> String {
    t.to_string()
}

fn cri_time(nanos: i64) -> String {
    jiff::Timestamp::from_nanosecond(i128::from(nanos))
        .map(|t| rfc3339(&t))
        .unwrap_or_default()
}

/// The boot time (`btime` of `/proc/stat`): the node's start. Read once: it does not change,
/// and `/proc/stat` is one of the costlier files of a summary.
fn boot_time() -> Option<String> {
    static BOOT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    BOOT.get_or_init(|| {
        let secs = crate::metrics::process::boot_time_seconds()?;
        jiff::Timestamp::from_second(secs).ok().map(|t| rfc3339(&t))
    })
    .clone()
}

fn processes_now() -> Option<u64> {
    Some(u64::from(rustix::system::sysinfo().procs))
}

/// What the provider remembers between reads.
#[derive(Debug, Default)]
struct Cache {
    /// Each cgroup's last cpu time and when it was read (for `usageNanoCores`).
    cpu: HashMap<String, (Instant, u64)>,
    /// Sandbox ID -> the pid whose network namespace is the pod's.
    sandbox_pids: HashMap<String, u32>,
    /// Such a pid -> its `/proc/<pid>/net/dev`, kept open: opening it walked `/proc` for 40 % of
    /// a pod's network read. The open file stays bound to the namespace it was opened in.
    net_dev: HashMap<u32, Arc<KeptFile>>,
    /// Container ID -> its writable layer's usage, from the last `ListContainerStats`.
    writable: HashMap<String, FsStats>,
    /// When that list was read, and whether a read is under way.
    writable_read: Option<Instant>,
    writable_reading: bool,
    /// Each pod cgroup's directories, opened at its first read and kept while the pod is
    /// summarised: reopening them walked the deep cgroup paths again on every request.
    dirs: HashMap<String, Arc<CgroupDirs>>,
    /// The runtime's image filesystem, from the last `ImageFsInfo`.
    image_fs: Option<cri::ImageFsInfoResponse>,
}

/// This node's running containers and ready sandboxes, as one listing found them.
type Running = Arc<(Vec<cri::Container>, Vec<cri::PodSandbox>)>;

/// How old the writable layers' usage (and the image filesystem's) may get before it is read
/// again. The runtime itself measures layers periodically (containerd: every 10 s), so reading
/// it more often gains little, and `ListContainerStats` asks every container's shim for its
/// metrics: both are read off the request path.
const WRITABLE_LAYER_PERIOD: std::time::Duration = std::time::Duration::from_secs(10);

/// How often a pod's volumes are measured by default (the kubelet's `volumeStatsAggPeriod`).
const VOLUME_STATS_PERIOD: std::time::Duration = std::time::Duration::from_secs(60);

/// Pods from which a summary's reads are spread over threads.
const PARALLEL_FROM: usize = 16;

/// Whether a container has a cpu limit: the CFS quota's throttling is read for those, and for
/// the pod when any has.
fn cpu_limited(spec: Option<&k8s_openapi::api::core::v1::Container>) -> bool {
    spec.and_then(|c| c.resources.as_ref()?.limits.as_ref())
        .is_some_and(|l| l.contains_key("cpu"))
}

/// What a pod's reads need.
struct Plan<'a> {
    /// Its cgroup (none when its QoS class cannot be computed).
    cgroup: Option<String>,
    /// Its running containers, by name.
    containers: Vec<(&'a str, &'a cri::Container)>,
    /// Their specs in the pod, in the same order (none for a container the spec lacks).
    specs: Vec<Option<&'a k8s_openapi::api::core::v1::Container>>,
    /// The pid whose network namespace is the pod's (none: host network or unknown).
    pid: Option<u32>,
}

/// What a pod's reads found.
#[derive(Default)]
struct Reads {
    pod: CgroupUsage,
    /// In the order of [`Plan::containers`].
    containers: Vec<CgroupUsage>,
    network: Option<NetworkStats>,
}

/// A pod the summary covers.
pub struct PodEntry {
    pub uid: String,
    pub pod: Arc<Pod>,
    pub start_time: Option<jiff::Timestamp>,
}

/// Builds summaries. Cheap to clone; clones share the cache.
#[derive(Clone)]
pub struct Provider {
    cm: ContainerManager,
    cri: Cri,
    node_name: String,
    root_dir: PathBuf,
    cache: Arc<Mutex<Cache>>,
    /// The running containers and ready sandboxes, listed again only when the pod cache shows
    /// that one may have started, stopped or exited.
    running: Arc<QuietListing<Running>>,
    /// Each pod's volumes, measured off the request path.
    volumes: volumes::Volumes,
    /// The last summary taken, which [`Provider::recent`] serves while it is young enough. The
    /// lock is held while a reading is taken, so callers that arrive meanwhile share it.
    latest: Arc<tokio::sync::Mutex<Option<Reading>>>,
}

/// A summary taken, when, and of which pods (their UIDs, sorted).
struct Reading {
    at: Instant,
    uids: Vec<String>,
    summary: Arc<Summary>,
}

/// The pods' UIDs, sorted: a reading serves only the pods it was taken of.
fn uids_of(pods: &[PodEntry]) -> Vec<String> {
    let mut uids: Vec<String> = pods.iter().map(|p| p.uid.clone()).collect();
    uids.sort_unstable();
    uids
}

impl Provider {
    pub fn new(
        cm: ContainerManager,
        cri: Cri,
        node_name: String,
        root_dir: PathBuf,
        pod_cache: PodCache,
    ) -> Self {
        Self {
            cm,
            cri,
            node_name,
            root_dir,
            cache: Arc::default(),
            running: Arc::new(QuietListing::new(pod_cache)),
            volumes: volumes::Volumes::new(VOLUME_STATS_PERIOD, Default::default()),
            latest: Arc::default(),
        }
    }

    /// The summary of the node and of `pods` taken now; kept for [`Provider::recent`].
    pub async fn summary(&self, pods: Vec<PodEntry>) -> Arc<Summary> {
        let mut latest = self.latest.lock().await;
        let uids = uids_of(&pods);
        self.take(&mut latest, pods, uids).await
    }

    /// A summary of the node and of `pods` no older than `max_age`: the last one taken when it is
    /// that young and of the same pods, else one taken now. The metric paths serve this, so
    /// scrapes of `/metrics/cadvisor` and `/metrics/resource` close together read every cgroup
    /// once between them, as the kubelet's answer from cAdvisor's periodic reading. A pod added
    /// or gone always takes a new one. Each sample carries the time it was read.
    pub async fn recent(&self, pods: Vec<PodEntry>, max_age: std::time::Duration) -> Arc<Summary> {
        let mut latest = self.latest.lock().await;
        let uids = uids_of(&pods);
        if let Some(r) = &*latest
            && r.at.elapsed() <= max_age
            && r.uids == uids
        {
            return r.summary.clone();
        }
        self.take(&mut latest, pods, uids).await
    }

    /// Reads a summary of `pods` (whose sorted UIDs are `uids`) and keeps it as the latest.
    async fn take(
        &self,
        latest: &mut Option<Reading>,
        pods: Vec<PodEntry>,
        uids: Vec<String>,
    ) -> Arc<Summary> {
        let at = Instant::now();
        let summary = Arc::new(self.read_summary(pods).await);
        *latest = Some(Reading {
            at,
            uids,
            summary: summary.clone(),
        });
        summary
    }

    /// Measures each pod's volumes at most once every `period` (zero: never) instead of once a
    /// minute, and the volumes of claims as `claims` (the volume manager's) resolved them.
    pub fn with_volumes(
        mut self,
        period: std::time::Duration,
        claims: crate::volume::ResolvedClaims,
    ) -> Self {
        self.volumes = volumes::Volumes::new(period, claims);
        self
    }

    /// The last measurement of every claim's volume (starting a measurement of the pods due
    /// one, as a summary does): `kubelet_volume_stats_*`.
    pub fn claim_volumes(&self, pods: &[PodEntry]) -> Vec<VolumeStats> {
        self.volumes.refresh(&self.root_dir.join("pods"), pods);
        self.volumes.of_claims()
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Cpu stats of a cgroup read now, with the rate since the last read of the same key.
    fn cpu(&self, key: &str, time: &str, read: &CgroupUsage, now: Instant) -> Option<CpuStats> {
        let nanos = read.cpu_nanos?;
        let mut cache = self.cache();
        let rate = cache.cpu.get(key).and_then(|&(at, before)| {
            let secs = now.checked_duration_since(at)?.as_secs_f64();
            (secs > 0.0 && nanos >= before).then(|| ((nanos - before) as f64 / secs) as u64)
        });
        cache.cpu.insert(key.to_owned(), (now, nanos));
        Some(CpuStats {
            time: time.to_owned(),
            usage_nano_cores: rate,
            usage_core_nano_seconds: Some(nanos),
            throttling: read.cpu_throttling,
        })
    }

    fn memory(time: &str, m: Option<MemoryUsage>, limit: Option<u64>) -> Option<MemoryStats> {
        let m = m?;
        Some(MemoryStats {
            time: time.to_owned(),
            available_bytes: limit.map(|l| l.saturating_sub(m.working_set_bytes)),
            usage_bytes: m.usage_bytes,
            working_set_bytes: m.working_set_bytes,
            rss_bytes: m.rss_bytes,
            page_faults: m.page_faults,
            major_page_faults: m.major_page_faults,
            cache_bytes: m.cache_bytes,
        })
    }

    /// The file reads of every pod (its cgroup, its containers' cgroups under it, its network),
    /// spread over a few threads when there are many pods: they are most of a summary's cost
    /// (some 150 us a pod with one container on cgroup v1).
    fn read_all(&self, plans: &[Plan<'_>], time: &str) -> Vec<Reads> {
        let read = |plan: &Plan<'_>| self.read_pod(plan, time);
        let threads = std::thread::available_parallelism()
            .map_or(1, std::num::NonZeroUsize::get)
            .min(4);
        let multi_thread = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        if threads < 2 || plans.len() < PARALLEL_FROM || !multi_thread {
            return plans.iter().map(read).collect();
        }
        let chunk = plans.len().div_ceil(threads);
        tokio::task::block_in_place(|| {
            std::thread::scope(|scope| {
                let mut parts = plans.chunks(chunk);
                // The first chunk on this thread, the others on their own.
                let first = parts.next().unwrap_or_default();
                let handles: Vec<_> = parts
                    .map(|part| scope.spawn(move || part.iter().map(read).collect::<Vec<_>>()))
                    .collect();
                let mut out: Vec<Reads> = first.iter().map(read).collect();
                for h in handles {
                    match h.join() {
                        Ok(part) => out.extend(part),
                        Err(panic) => std::panic::resume_unwind(panic),
                    }
                }
                out
            })
        })
    }

    fn read_pod(&self, plan: &Plan<'_>, time: &str) -> Reads {
        let Some(cgroup) = &plan.cgroup else {
            return Reads::default();
        };
        let (mut dirs, fresh) = self.cgroup_dirs(cgroup, false);
        let mut pod = dirs.usage(None, true);
        // A directory kept open outlives its cgroup when the pod's cgroup was removed and made
        // again between two requests (a static pod deleted and added back keeps its UID): its
        // files read nothing, so the cgroup is opened afresh.
        if !fresh && pod == CgroupUsage::default() {
            dirs = self.cgroup_dirs(cgroup, true).0;
            pod = dirs.usage(None, true);
        }
        // The usage of what has a cpu limit, with its throttling where that is a file of its own.
        let with_throttling = |mut usage: CgroupUsage, child: Option<&str>, limited: bool| {
            if limited && usage.cpu_throttling.is_none() {
                usage.cpu_throttling = dirs.throttling_v1(child);
            }
            usage
        };
        let pod = with_throttling(pod, None, plan.specs.iter().any(|s| cpu_limited(*s)));
        // A container's cgroup is named by its ID under the pod's (the driver's spelling); its
        // process count is not reported. The files kept open of containers gone are closed.
        let children: Vec<std::borrow::Cow<'_, str>> = plan
            .containers
            .iter()
            .map(|(_, c)| self.cm.container_cgroup(&c.id))
            .collect();
        dirs.keep_children(children.iter().map(AsRef::as_ref));
        Reads {
            pod,
            containers: children
                .iter()
                .zip(&plan.specs)
                .map(|(child, spec)| {
                    with_throttling(
                        dirs.usage(Some(child), false),
                        Some(child),
                        cpu_limited(*spec),
                    )
                })
                .collect(),
            network: plan.pid.and_then(|pid| self.pod_network(time, pid)),
        }
    }

    /// The network of the pod whose sandbox is process `pid`, from its `/proc/<pid>/net/dev`
    /// kept open (opened again when it no longer reads).
    fn pod_network(&self, time: &str, pid: u32) -> Option<NetworkStats> {
        let kept = self.cache().net_dev.get(&pid).cloned();
        let text = match kept.and_then(|f| f.read()).filter(|t| !t.is_empty()) {
            Some(text) => text,
            None => {
                self.cache().net_dev.remove(&pid);
                let file = std::fs::File::open(format!("/proc/{pid}/net/dev")).ok()?;
                match KeptFile::keep(file) {
                    Ok(kept) => {
                        let text = kept.read()?;
                        self.cache().net_dev.insert(pid, Arc::new(kept));
                        text
                    }
                    Err(file) => crate::cm::read_from_start(&file)?,
                }
            }
        };
        network(time, &text, Some("eth0"))
    }

    /// The open directories of pod cgroup `cgroup`: those kept from an earlier request unless
    /// `reopen`, else opened now (`true` with them).
    fn cgroup_dirs(&self, cgroup: &str, reopen: bool) -> (Arc<CgroupDirs>, bool) {
        if !reopen && let Some(dirs) = self.cache().dirs.get(cgroup) {
            return (dirs.clone(), false);
        }
        let dirs = Arc::new(self.cm.open_cgroup(cgroup));
        self.cache().dirs.insert(cgroup.to_owned(), dirs.clone());
        (dirs, true)
    }

    /// Starts a read of the runtime's container stats (for the writable layers) and of its
    /// image filesystem when the last one is older than [`WRITABLE_LAYER_PERIOD`] and none is
    /// under way; the request that starts it does not wait for it.
    fn refresh_runtime_stats(&self, selector: HashMap<String, String>) {
        {
            let mut cache = self.cache();
            let fresh = cache
                .writable_read
                .is_some_and(|at| at.elapsed() < WRITABLE_LAYER_PERIOD);
            if fresh || cache.writable_reading {
                return;
            }
            cache.writable_reading = true;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let filter = cri::ContainerStatsFilter {
                label_selector: selector,
                ..Default::default()
            };
            let (read, image_fs) = tokio::join!(
                this.cri.list_container_stats(Some(filter)),
                this.cri.image_fs_info()
            );
            let mut cache = this.cache();
            cache.writable_reading = false;
            cache.writable_read = Some(Instant::now());
            match read {
                Ok(list) => {
                    cache.writable = list
                        .iter()
                        .filter_map(|s| {
                            Some((s.attributes.as_ref()?.id.clone(), writable_layer(s)?))
                        })
                        .collect();
                }
                Err(e) => tracing::debug!(%e, "stats: ListContainerStats"),
            }
            match image_fs {
                Ok(r) => cache.image_fs = Some(r),
                Err(e) => tracing::debug!(%e, "stats: ImageFsInfo"),
            }
        });
    }

    /// This node's running containers and ready sandboxes (two CRI lists; both fail together,
    /// so a summary never pairs containers with an empty sandbox list).
    async fn list_running(
        &self,
        selector: &HashMap<String, String>,
    ) -> crate::cri::Result<Running> {
        let (containers, sandboxes) = tokio::join!(
            self.cri.list_containers(Some(cri::ContainerFilter {
                label_selector: selector.clone(),
                state: Some(cri::ContainerStateValue {
                    state: cri::ContainerState::ContainerRunning as i32,
                }),
                ..Default::default()
            })),
            self.cri.list_pod_sandbox(Some(cri::PodSandboxFilter {
                label_selector: selector.clone(),
                state: Some(cri::PodSandboxStateValue {
                    state: cri::PodSandboxState::SandboxReady as i32,
                }),
                ..Default::default()
            })),
        );
        Ok(Arc::new((containers?, sandboxes?)))
    }

    /// The runtime's image filesystem: asked on the first summary, then as
    /// [`Provider::refresh_runtime_stats`] last read it.
    async fn image_fs(&self) -> Option<cri::ImageFsInfoResponse> {
        if let Some(r) = self.cache().image_fs.clone() {
            return Some(r);
        }
        let read = self.cri.image_fs_info().await.ok()?;
        self.cache().image_fs = Some(read.clone());
        Some(read)
    }

    async fn sandbox_pid(&self, id: &str) -> Option<u32> {
        if let Some(&pid) = self.cache().sandbox_pids.get(id) {
            return Some(pid);
        }
        let pid = self.cri.pod_sandbox_pid(id).await.ok().flatten()?;
        self.cache().sandbox_pids.insert(id.to_owned(), pid);
        Some(pid)
    }

    /// Reads the summary of the node and of `pods`.
    async fn read_summary(&self, pods: Vec<PodEntry>) -> Summary {
        let now = Instant::now();
        let time = rfc3339(&jiff::Timestamp::now());
        let node_selector: HashMap<String, String> =
            HashMap::from([(labels::NODE_NAME.to_owned(), self.node_name.clone())]);
        let (running, image_fs) = tokio::join!(
            self.running.get(self.list_running(&node_selector)),
            self.image_fs(),
        );
        self.refresh_runtime_stats(node_selector);
        self.volumes.refresh(&self.root_dir.join("pods"), &pods);
        let container_stats_failed = running.is_err();
        let running = running.unwrap_or_else(|e| {
            tracing::debug!(%e, "stats summary: listing the running containers");
            Arc::default()
        });
        let (containers, sandboxes) = &*running;
        // The newest running instance of each (pod, container), by attempt.
        let mut by_pod: HashMap<&str, HashMap<&str, &cri::Container>> = HashMap::new();
        for c in containers {
            let (Some(uid), Some(meta)) = (c.labels.get(labels::POD_UID), &c.metadata) else {
                continue;
            };
            let slot = by_pod.entry(uid).or_default();
            let newer = slot.get(meta.name.as_str()).is_none_or(|old| {
                old.metadata
                    .as_ref()
                    .is_none_or(|m| m.attempt < meta.attempt)
            });
            if newer {
                slot.insert(&meta.name, c);
            }
        }
        let sandbox_of: HashMap<&str, &str> = sandboxes
            .iter()
            .filter_map(|s| {
                let uid = s.labels.get(labels::POD_UID)?;
                Some((uid.as_str(), s.id.as_str()))
            })
            .collect();

        // What each pod's reads need: its cgroup, its running containers, its sandbox's pid.
        let mut plans = Vec::with_capacity(pods.len());
        for p in &pods {
            let qos = crate::pod::qos::pod_qos(&p.pod).ok();
            let cgroup = qos.and_then(|q| self.cm.pod_cgroup_name(&p.uid, q).ok());
            let host_network = p
                .pod
                .spec
                .as_ref()
                .and_then(|s| s.host_network)
                .unwrap_or(false);
            let pid = match sandbox_of.get(p.uid.as_str()) {
                Some(id) if !host_network => self.sandbox_pid(id).await,
                _ => None,
            };
            let mut containers: Vec<(&str, &cri::Container)> = by_pod
                .get(p.uid.as_str())
                .map(|m| m.iter().map(|(n, c)| (*n, *c)).collect())
                .unwrap_or_default();
            containers.sort_by_key(|(n, _)| *n);
            let specs = containers
                .iter()
                .map(|(name, _)| crate::pod::container(&p.pod, name))
                .collect();
            plans.push(Plan {
                cgroup,
                containers,
                specs,
                pid,
            });
        }
        let reads = self.read_all(&plans, &time);

        let mut out = Vec::with_capacity(pods.len());
        let mut live_keys = std::collections::HashSet::with_capacity(pods.len() * 2 + 1);
        for ((p, plan), read) in pods.iter().zip(&plans).zip(reads) {
            let meta = &p.pod.metadata;
            let key = format!("pod/{}", p.uid);
            let cpu = self.cpu(&key, &time, &read.pod, now);
            live_keys.insert(key);
            let containers = plan
                .containers
                .iter()
                .zip(&plan.specs)
                .zip(read.containers)
                .map(|(((name, c), spec), usage)| {
                    let key = format!("container/{}", c.id);
                    let image = spec.and_then(|spec| spec.image.clone()).unwrap_or_default();
                    let stats = ContainerStats {
                        name: (*name).to_owned(),
                        start_time: Some(cri_time(c.created_at)),
                        cpu: self.cpu(&key, &time, &usage, now),
                        memory: Self::memory(&time, usage.memory, None),
                        rootfs: self.cache().writable.get(&c.id).cloned(),
                        runtime: Some(ContainerRef {
                            id: c.id.clone(),
                            image,
                            cgroup: format!(
                                "/{}/{}",
                                plan.cgroup.as_deref().unwrap_or_default().trim_matches('/'),
                                self.cm.container_cgroup(&c.id)
                            ),
                        }),
                    };
                    live_keys.insert(key);
                    stats
                })
                .collect();
            out.push(PodStats {
                pod_ref: PodReference {
                    name: meta.name.clone().unwrap_or_default(),
                    namespace: meta.namespace.clone().unwrap_or_else(|| "default".into()),
                    uid: p.uid.clone(),
                },
                start_time: p.start_time.as_ref().map(rfc3339),
                containers,
                usage: Usage {
                    cpu,
                    memory: Self::memory(&time, read.pod.memory, None),
                    network: read.network,
                },
                process_stats: read
                    .pod
                    .processes
                    .map(|n| ProcessStats { process_count: n }),
                volume: self.volumes.of(&p.uid).to_vec(),
                cgroup: plan
                    .cgroup
                    .as_ref()
                    .map(|c| format!("/{}", c.trim_matches('/'))),
            });
        }
        {
            // Forget pods and sandboxes that are gone.
            let mut cache = self.cache();
            live_keys.insert("node".into());
            cache.cpu.retain(|k, _| live_keys.contains(k));
            let sandbox_ids: std::collections::HashSet<&str> =
                sandboxes.iter().map(|s| s.id.as_str()).collect();
            cache
                .sandbox_pids
                .retain(|id, _| sandbox_ids.contains(id.as_str()));
            let pids: std::collections::HashSet<u32> =
                cache.sandbox_pids.values().copied().collect();
            cache.net_dev.retain(|pid, _| pids.contains(pid));
            let cgroups: std::collections::HashSet<&str> =
                plans.iter().filter_map(|p| p.cgroup.as_deref()).collect();
            cache
                .dirs
                .retain(|cgroup, _| cgroups.contains(cgroup.as_str()));
        }
        let node = self.node(&time, now, image_fs);
        Summary {
            node,
            pods: out,
            container_stats_failed,
        }
    }

    fn node(
        &self,
        time: &str,
        now: Instant,
        image_fs: Option<cri::ImageFsInfoResponse>,
    ) -> NodeStats {
        let root = self.cm.cgroup_usage("/");
        let memory = root.memory;
        let capacity = crate::cm::machine_memory_bytes();
        let default_iface = std::fs::read_to_string("/proc/net/route")
            .ok()
            .and_then(|r| default_route_interface(&r));
        let image_fs = image_fs.and_then(|r| {
            let u = r.image_filesystems.into_iter().next()?;
            let mount = u.fs_id.map(|f| f.mountpoint).unwrap_or_default();
            let mut fs = crate::cm::filesystem_stats(Path::new(&mount))
                .map(|s| FsStats::of(time, s))
                .ok()?;
            fs.used_bytes = u.used_bytes.map(|b| b.value).or(fs.used_bytes);
            fs.inodes_used = u.inodes_used.map(|b| b.value).or(fs.inodes_used);
            Some(fs)
        });
        NodeStats {
            node_name: self.node_name.clone(),
            start_time: boot_time(),
            usage: Usage {
                cpu: self.cpu("node", time, &root, now),
                memory: Self::memory(time, memory, capacity),
                network: node_network(time, default_iface.as_deref()),
            },
            fs: crate::cm::filesystem_stats(&self.root_dir)
                .ok()
                .map(|s| FsStats::of(time, s)),
            runtime: Some(RuntimeStats { image_fs }),
            rlimit: Some(RlimitStats {
                time: time.to_owned(),
                maxpid: std::fs::read_to_string("/proc/sys/kernel/pid_max")
                    .ok()
                    .and_then(|s| s.trim().parse().ok()),
                curproc: processes_now(),
            }),
        }
    }
}

/// The writable layer's usage in the runtime's stats of a container.
fn writable_layer(c: &cri::ContainerStats) -> Option<FsStats> {
    let w = c.writable_layer.as_ref()?;
    Some(FsStats {
        time: cri_time(w.timestamp),
        available_bytes: None,
        capacity_bytes: None,
        used_bytes: w.used_bytes.as_ref().map(|v| v.value),
        inodes_free: None,
        inodes: None,
        inodes_used: w.inodes_used.as_ref().map(|v| v.value),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_net_files_parse() {
        let dev = "Inter-|   Receive                                                |  Transmit\n \
             face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
             lo:  100 1 0 0 0 0 0 0  100 1 0 0 0 0 0 0\n  \
             eth0: 5000 10 2 0 0 0 0 0 7000 12 3 0 0 0 0 0\n";
        assert_eq!(
            parse_net_dev(dev),
            vec![InterfaceStats {
                name: "eth0".into(),
                rx_bytes: 5000,
                rx_errors: 2,
                tx_bytes: 7000,
                tx_errors: 3,
            }]
        );
        let route = "Iface\tDestination\tGateway\n\
                     ens4\t0A800000\t00000000\n\
                     ens5\t00000000\t0100800A\n";
        assert_eq!(default_route_interface(route).as_deref(), Some("ens5"));
        assert_eq!(default_route_interface("Iface\tDestination\n"), None);
    }

    #[test]
    fn the_summary_serialises_with_the_kubelets_field_names() {
        let n = NetworkStats {
            time: "t".into(),
            default: InterfaceStats {
                name: "eth0".into(),
                rx_bytes: 1,
                ..Default::default()
            },
            interfaces: vec![],
        };
        let v = serde_json::to_value(&n).unwrap();
        assert_eq!(v["name"], "eth0");
        assert_eq!(v["rxBytes"], 1);
        let c = CpuStats {
            time: "t".into(),
            usage_nano_cores: None,
            usage_core_nano_seconds: Some(5),
            throttling: None,
        };
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(v["usageCoreNanoSeconds"], 5);
        assert!(v.get("usageNanoCores").is_none());
    }

    /// A summary of one pod (`p"q`, one container `main`) read at 2026-11-26T10:00:00Z.
    fn one_pod_summary() -> Summary {
        let t = "2026-11-26T10:00:00Z";
        let cpu = Some(CpuStats {
            time: t.into(),
            usage_nano_cores: None,
            usage_core_nano_seconds: Some(2_500_000_000),
            throttling: Some(crate::cm::CpuThrottling {
                periods: 40,
                throttled_periods: 4,
                throttled_nanos: 1_500_000_000,
            }),
        });
        let memory = Some(MemoryStats {
            time: t.into(),
            available_bytes: None,
            usage_bytes: 10,
            working_set_bytes: 7,
            rss_bytes: 1,
            page_faults: 0,
            major_page_faults: 0,
            cache_bytes: 3,
        });
        Summary {
            node: NodeStats {
                node_name: "n".into(),
                start_time: None,
                usage: Usage {
                    cpu: cpu.clone(),
                    memory: None,
                    network: None,
                },
                fs: None,
                runtime: None,
                rlimit: None,
            },
            pods: vec![PodStats {
                pod_ref: PodReference {
                    name: "p\"q".into(),
                    namespace: "default".into(),
                    uid: "u".into(),
                },
                start_time: None,
                containers: vec![ContainerStats {
                    name: "main".into(),
                    start_time: None,
                    cpu: cpu.clone(),
                    memory: memory.clone(),
                    rootfs: None,
                    runtime: Some(ContainerRef {
                        id: "c0ffee".into(),
                        image: "busybox:1.36".into(),
                        cgroup: "/kubepods/podu/c0ffee".into(),
                    }),
                }],
                usage: Usage {
                    cpu: None,
                    memory,
                    network: None,
                },
                process_stats: None,
                volume: Vec::new(),
                cgroup: Some("/kubepods/podu".into()),
            }],
            container_stats_failed: false,
        }
    }

    #[test]
    fn resource_metrics_carry_each_sample_with_its_time() {
        let text = one_pod_summary().resource_metrics();
        let ms = 1_795_687_200_000i64;
        for line in [
            format!(
                "container_cpu_usage_seconds_total{{container=\"main\",namespace=\"default\",pod=\"p\\\"q\"}} 2.5 {ms}"
            ),
            format!(
                "container_memory_working_set_bytes{{container=\"main\",namespace=\"default\",pod=\"p\\\"q\"}} 7 {ms}"
            ),
            format!("pod_memory_working_set_bytes{{namespace=\"default\",pod=\"p\\\"q\"}} 7 {ms}"),
            format!("node_cpu_usage_seconds_total 2.5 {ms}"),
            "resource_scrape_error 0".to_owned(),
            "# TYPE pod_cpu_usage_seconds_total counter".to_owned(),
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing from\n{text}"
            );
        }
        assert!(
            !text.contains("pod_cpu_usage_seconds_total{"),
            "no pod cpu sample: {text}"
        );
    }

    #[test]
    fn cadvisor_metrics_label_containers_pods_and_the_root_as_cadvisor_does() {
        let text = one_pod_summary().cadvisor_metrics();
        let ms = 1_795_687_200_000i64;
        let container = "container=\"main\",id=\"/kubepods/podu/c0ffee\",image=\"busybox:1.36\",\
                         name=\"c0ffee\",namespace=\"default\",pod=\"p\\\"q\"";
        let pod = "container=\"\",id=\"/kubepods/podu\",image=\"\",name=\"\",\
                   namespace=\"default\",pod=\"p\\\"q\"";
        for line in [
            format!("container_cpu_usage_seconds_total{{{container}}} 2.5 {ms}"),
            format!("container_memory_working_set_bytes{{{container}}} 7 {ms}"),
            format!("container_memory_usage_bytes{{{container}}} 10 {ms}"),
            format!("container_memory_rss{{{container}}} 1 {ms}"),
            format!("container_memory_cache{{{container}}} 3 {ms}"),
            format!("container_cpu_cfs_periods_total{{{container}}} 40 {ms}"),
            format!("container_cpu_cfs_throttled_periods_total{{{container}}} 4 {ms}"),
            format!("container_cpu_cfs_throttled_seconds_total{{{container}}} 1.5 {ms}"),
            format!("container_memory_working_set_bytes{{{pod}}} 7 {ms}"),
            format!("container_cpu_usage_seconds_total{{id=\"/\"}} 2.5 {ms}"),
            "# TYPE container_network_receive_bytes_total counter".to_owned(),
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing from\n{text}"
            );
        }
        // The pod read no cpu: no sample rather than a zero.
        assert!(
            !text.contains(&format!("container_cpu_usage_seconds_total{{{pod}}}")),
            "{text}"
        );
    }
}
