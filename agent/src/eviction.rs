//! The eviction manager: every `--eviction-monitoring-interval` it observes the node's signals
//! (`memory.available`, `allocatableMemory.available`, `nodefs.available`, `nodefs.inodesFree`,
//! `imagefs.available`, `pid.available`), compares them with the hard thresholds
//! (`--eviction-hard`), reports the node conditions they raise, and while a memory or pid
//! threshold is met evicts one pod per interval, ranked as the kubelet ranks them: pods using
//! more memory than they request first, then lower priority, then the larger use above the
//! request. An evicted pod fails with reason `Evicted` and the kubelet's message; its worker stops
//! it. Critical pods (static, mirror, priority >= 2000000000) are never evicted.
use crate::cm::ContainerManager;
use crate::pod::quantity::Quantity;
use crate::pod::{is_critical, priority};
use k8s_openapi::api::core::v1::Pod;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// What the node runs short of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Signal {
    MemoryAvailable,
    AllocatableMemoryAvailable,
    NodeFsAvailable,
    NodeFsInodesFree,
    ImageFsAvailable,
    PidAvailable,
}

impl Signal {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MemoryAvailable => "memory.available",
            Self::AllocatableMemoryAvailable => "allocatableMemory.available",
            Self::NodeFsAvailable => "nodefs.available",
            Self::NodeFsInodesFree => "nodefs.inodesFree",
            Self::ImageFsAvailable => "imagefs.available",
            Self::PidAvailable => "pid.available",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [
            Self::MemoryAvailable,
            Self::AllocatableMemoryAvailable,
            Self::NodeFsAvailable,
            Self::NodeFsInodesFree,
            Self::ImageFsAvailable,
            Self::PidAvailable,
        ]
        .into_iter()
        .find(|sig| sig.as_str() == s)
    }

    /// The node condition a met threshold of this signal raises.
    pub fn condition(self) -> &'static str {
        match self {
            Self::MemoryAvailable | Self::AllocatableMemoryAvailable => "MemoryPressure",
            Self::NodeFsAvailable | Self::NodeFsInodesFree | Self::ImageFsAvailable => {
                "DiskPressure"
            }
            Self::PidAvailable => "PIDPressure",
        }
    }

    /// A disk signal: node-level resources (containers, images) are reclaimed before a pod goes.
    pub fn is_disk(self) -> bool {
        matches!(
            self,
            Self::NodeFsAvailable | Self::NodeFsInodesFree | Self::ImageFsAvailable
        )
    }

    /// The resource the eviction message names (and pods are ranked on).
    pub fn resource(self) -> &'static str {
        match self {
            Self::MemoryAvailable | Self::AllocatableMemoryAvailable => "memory",
            Self::NodeFsAvailable | Self::ImageFsAvailable => "ephemeral-storage",
            Self::NodeFsInodesFree => "inodes",
            Self::PidAvailable => "pids",
        }
    }
}

/// A threshold's amount: absolute, or a share of the signal's capacity.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Amount {
    Absolute(u64),
    Percent(f64),
}

impl Amount {
    /// The amount for a signal whose capacity is `capacity`.
    pub fn of(self, capacity: u64) -> u64 {
        match self {
            Self::Absolute(v) => v,
            Self::Percent(p) => (capacity as f64 * p / 100.0) as u64,
        }
    }
}

/// `signal < amount`: hard when `grace_period` is zero (acted on at once), soft otherwise (acted
/// on once met for that long).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Threshold {
    pub signal: Signal,
    pub amount: Amount,
    pub grace_period: Duration,
    /// `--eviction-minimum-reclaim`: once acted on, the threshold stays met until this much more
    /// than its amount is available.
    pub min_reclaim: Option<Amount>,
}

impl Threshold {
    pub fn is_hard(&self) -> bool {
        self.grace_period.is_zero()
    }

    /// Met by `o`: available below the amount, plus the minimum reclaim when `reclaiming`.
    fn met_by(&self, o: &Observation, reclaiming: bool) -> bool {
        let extra = match (reclaiming, self.min_reclaim) {
            (true, Some(m)) => m.of(o.capacity),
            _ => 0,
        };
        o.available < self.amount.of(o.capacity).saturating_add(extra)
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("{0} {1:?}: expected <signal><<quantity or percent>, e.g. memory.available<100Mi")]
    Syntax(&'static str, String),
    #[error("{0} {1:?}: expected <signal>=<value>[,...]")]
    Pair(&'static str, String),
    #[error("{0} {1:?}: unknown signal")]
    Signal(&'static str, String),
    #[error("{0} {1:?}: {2}")]
    Amount(&'static str, String, String),
    #[error(
        "--eviction-soft {0:?}: a soft threshold needs a grace period > 0 in --eviction-soft-grace-period"
    )]
    NoGracePeriod(String),
    #[error("{0}: {1} is listed twice")]
    Twice(&'static str, &'static str),
    #[error(
        "--system-reserved/--kube-reserved {0:?}: expected <resource>=<quantity>[,...] with \
         resources cpu, memory, ephemeral-storage"
    )]
    Reserved(String),
}

/// The kubelet's default hard thresholds on Linux.
pub const DEFAULT_HARD: &[&str] = &[
    "memory.available<100Mi",
    "nodefs.available<10%",
    "nodefs.inodesFree<5%",
    "imagefs.available<15%",
];

/// Parses `--eviction-hard`'s entries, each `<signal><<amount>` (see [`nonblank`]); no entry
/// (or only blank ones) means no threshold.
pub fn parse_thresholds(entries: &[impl AsRef<str>]) -> Result<Vec<Threshold>, Error> {
    parse_list("--eviction-hard", entries)
}

/// Parses `--eviction-soft`'s entries (as [`parse_thresholds`]) with its
/// `--eviction-soft-grace-period` (`<signal>=<duration>`, read by the caller): every soft
/// threshold needs a grace period above zero, as the kubelet requires.
pub fn parse_soft(
    entries: &[impl AsRef<str>],
    grace: &[(Signal, Duration)],
) -> Result<Vec<Threshold>, Error> {
    let mut out = parse_list("--eviction-soft", entries)?;
    for t in &mut out {
        t.grace_period = grace
            .iter()
            .find(|(s, _)| *s == t.signal)
            .map(|(_, d)| *d)
            .filter(|d| !d.is_zero())
            .ok_or_else(|| Error::NoGracePeriod(t.signal.as_str().to_owned()))?;
    }
    Ok(out)
}

/// Applies `--eviction-minimum-reclaim`'s entries (`<signal>=<quantity or percent>`) to every
/// threshold of their signals.
pub fn apply_min_reclaim(
    thresholds: &mut [Threshold],
    entries: &[impl AsRef<str>],
) -> Result<(), Error> {
    const FLAG: &str = "--eviction-minimum-reclaim";
    for (signal, amount) in parse_pairs(FLAG, entries)? {
        let amount = parse_amount(FLAG, &format!("{}={amount}", signal.as_str()), amount)?;
        for t in thresholds.iter_mut().filter(|t| t.signal == signal) {
            t.min_reclaim = Some(amount);
        }
    }
    Ok(())
}

/// A list setting's entries (a flag's comma-separated items, or those made of a config file's
/// map or list, one a pair or item), trimmed; blank ones (a trailing comma leaves one) are
/// skipped.
pub fn nonblank(entries: &[impl AsRef<str>]) -> impl Iterator<Item = &str> {
    entries
        .iter()
        .map(|e| e.as_ref().trim())
        .filter(|e| !e.is_empty())
}

/// `<signal>=<value>` entries (blank ones skipped); a signal listed twice is refused.
pub fn parse_pairs<'a>(
    flag: &'static str,
    entries: &'a [impl AsRef<str>],
) -> Result<Vec<(Signal, &'a str)>, Error> {
    let mut out: Vec<(Signal, &str)> = Vec::new();
    for part in nonblank(entries) {
        let (name, v) = part
            .split_once('=')
            .ok_or_else(|| Error::Pair(flag, part.to_owned()))?;
        let signal =
            Signal::parse(name.trim()).ok_or_else(|| Error::Signal(flag, part.to_owned()))?;
        if out.iter().any(|(s, _)| *s == signal) {
            return Err(Error::Twice(flag, signal.as_str()));
        }
        out.push((signal, v.trim()));
    }
    Ok(out)
}

fn parse_list(flag: &'static str, entries: &[impl AsRef<str>]) -> Result<Vec<Threshold>, Error> {
    let mut out: Vec<Threshold> = Vec::new();
    for part in nonblank(entries) {
        let (name, amount) = part
            .split_once('<')
            .ok_or_else(|| Error::Syntax(flag, part.to_owned()))?;
        let signal =
            Signal::parse(name.trim()).ok_or_else(|| Error::Signal(flag, part.to_owned()))?;
        if out.iter().any(|t| t.signal == signal) {
            return Err(Error::Twice(flag, signal.as_str()));
        }
        let amount = parse_amount(flag, part, amount.trim())?;
        out.push(Threshold {
            signal,
            amount,
            grace_period: Duration::ZERO,
            min_reclaim: None,
        });
    }
    Ok(out)
}

/// A quantity or a percentage in 0..=100 (`part` names the whole entry in errors).
fn parse_amount(flag: &'static str, part: &str, amount: &str) -> Result<Amount, Error> {
    let bad = |why: &str| Error::Amount(flag, part.to_owned(), why.to_owned());
    if let Some(p) = amount.strip_suffix('%') {
        let p: f64 = p.trim().parse().map_err(|_| bad("not a percentage"))?;
        if !(0.0..=100.0).contains(&p) {
            return Err(bad("must be 0% to 100%"));
        }
        return Ok(Amount::Percent(p));
    }
    let q = Quantity::parse(amount).map_err(|e| bad(&e.to_string()))?;
    Ok(Amount::Absolute(
        u64::try_from(q.value()).map_err(|_| bad("must not be negative"))?,
    ))
}

/// `--system-reserved` / `--kube-reserved` (`cpu=500m,memory=1Gi,ephemeral-storage=10Gi`):
/// what pods may not use; allocatable is capacity less both.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reserved {
    pub memory: u64,
    pub cpu_millis: u64,
    pub ephemeral_storage: u64,
}

impl Reserved {
    /// Parses `<resource>=<quantity>` entries (blank ones skipped); a resource other than cpu,
    /// memory and ephemeral-storage is refused (not silently dropped). The error names all the
    /// entries, written as the flag's comma-separated value.
    pub fn parse(entries: &[impl AsRef<str>]) -> Result<Self, Error> {
        let mut out = Self::default();
        let bad = || {
            let all: Vec<&str> = entries.iter().map(AsRef::as_ref).collect();
            Error::Reserved(all.join(","))
        };
        for part in nonblank(entries) {
            let (k, v) = part.split_once('=').ok_or_else(bad)?;
            let q = Quantity::parse(v.trim()).map_err(|_| bad())?;
            match k.trim() {
                "memory" => out.memory = u64::try_from(q.value()).map_err(|_| bad())?,
                "ephemeral-storage" => {
                    out.ephemeral_storage = u64::try_from(q.value()).map_err(|_| bad())?;
                }
                "cpu" => out.cpu_millis = u64::try_from(q.milli_value()).map_err(|_| bad())?,
                _ => return Err(bad()),
            }
        }
        Ok(out)
    }

    /// Both reservations together.
    pub fn plus(self, other: Self) -> Self {
        Self {
            memory: self.memory.saturating_add(other.memory),
            cpu_millis: self.cpu_millis.saturating_add(other.cpu_millis),
            ephemeral_storage: self
                .ephemeral_storage
                .saturating_add(other.ephemeral_storage),
        }
    }
}

/// One reading of a signal: what is available and the capacity percentages apply to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    pub available: u64,
    pub capacity: u64,
}

/// The thresholds met by `observed`, each with its observation; `reclaiming`: with their
/// minimum reclaim added (a threshold acted on stays met until that much more is available).
pub fn met(
    thresholds: &[Threshold],
    observed: &HashMap<Signal, Observation>,
    reclaiming: bool,
) -> Vec<(Threshold, Observation)> {
    thresholds
        .iter()
        .filter_map(|t| {
            let o = observed.get(&t.signal)?;
            t.met_by(o, reclaiming).then_some((*t, *o))
        })
        .collect()
}

/// Which thresholds are met and which are acted on, round after round (the kubelet's
/// `thresholdsFirstObservedAt` / `thresholdsMet` bookkeeping). A threshold is met when its
/// signal is below it, or when it was acted on last round and its minimum reclaim is not
/// available yet; it is acted on once met for its grace period (at once for a hard one).
#[derive(Debug, Default)]
pub struct Tracker {
    first_met: HashMap<usize, std::time::Instant>,
    acting: Vec<usize>,
}

/// One round of a [`Tracker`]: indices into the thresholds.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Round {
    /// Met now (their node conditions are raised whatever the grace period).
    pub met: Vec<usize>,
    /// Met for at least their grace period: eviction follows.
    pub acting: Vec<usize>,
}

impl Tracker {
    pub fn step(
        &mut self,
        thresholds: &[Threshold],
        observed: &HashMap<Signal, Observation>,
        now: std::time::Instant,
    ) -> Round {
        let met: Vec<usize> = thresholds
            .iter()
            .enumerate()
            .filter(|(i, t)| {
                observed
                    .get(&t.signal)
                    .is_some_and(|o| t.met_by(o, self.acting.contains(i)))
            })
            .map(|(i, _)| i)
            .collect();
        self.first_met.retain(|i, _| met.contains(i));
        for &i in &met {
            self.first_met.entry(i).or_insert(now);
        }
        let acting: Vec<usize> = met
            .iter()
            .copied()
            .filter(|i| now.duration_since(self.first_met[i]) >= thresholds[*i].grace_period)
            .collect();
        self.acting.clone_from(&acting);
        Round { met, acting }
    }
}

/// The threshold to act on first: memory before the others (the kubelet's eviction priority),
/// then in the configured order.
pub fn to_reclaim(thresholds: &[Threshold], acting: &[usize]) -> Option<usize> {
    acting.iter().copied().min_by_key(|&i| {
        let memory = matches!(
            thresholds[i].signal,
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable
        );
        (!memory, i)
    })
}

/// The grace period an evicted pod is stopped with: 1 s for a hard threshold (the kubelet's
/// immediate eviction); for a soft one the smaller of `--eviction-max-pod-grace-period` and the
/// pod's own, or the pod's own when that flag is negative.
pub fn eviction_grace(t: &Threshold, max_pod_grace: i64, pod: &Pod) -> Option<i64> {
    if t.is_hard() {
        return Some(IMMEDIATE_GRACE_SECS);
    }
    if max_pod_grace < 0 {
        return None;
    }
    let own = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(30);
    Some(max_pod_grace.min(own))
}

/// How long the manager waits for an evicted pod to be cleaned up before it observes again, and
/// how often it looks (the kubelet's 30 s and 1 s).
pub const CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);
const CLEANUP_POLL: Duration = Duration::from_secs(1);

/// The kubelet's grace period for a hard eviction.
pub const IMMEDIATE_GRACE_SECS: i64 = 1;

/// The settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// `--eviction-hard` then `--eviction-soft`.
    pub thresholds: Vec<Threshold>,
    /// `--eviction-max-pod-grace-period` (seconds; negative: the pod's own).
    pub max_pod_grace_period: i64,
    pub interval: Duration,
    /// How long a node condition stays after its threshold is no longer met.
    pub pressure_transition: Duration,
    /// `--system-reserved` + `--kube-reserved` memory: what pods may not use.
    pub reserved_memory: u64,
    /// `--root-dir`: the node file system.
    pub root_dir: PathBuf,
    /// `--pod-logs-dir` (the pods' logs count in their disk use).
    pub pod_logs_dir: PathBuf,
}

impl Config {
    /// The hard thresholds (node allocatable is less those of memory and nodefs).
    pub fn hard(&self) -> Vec<Threshold> {
        self.thresholds
            .iter()
            .filter(|t| t.is_hard())
            .copied()
            .collect()
    }
}

/// A pod the manager may rank.
pub struct Candidate {
    pub uid: String,
    pub pod: Arc<Pod>,
    /// The use of the resource ranked on: the working set of its cgroup (memory), its bytes or
    /// inodes on the disk under pressure (disk), its processes (pids).
    pub usage: u64,
}

/// The pod's request of `resource` (memory or ephemeral-storage; 0 for others).
fn request(pod: &Pod, resource: &str) -> u64 {
    match resource {
        "memory" => crate::pod::resources::pod_resources(pod)
            .map(|r| r.requests.memory_bytes())
            .unwrap_or(0),
        "ephemeral-storage" => ephemeral_storage_request(pod),
        _ => 0,
    }
}

/// The pod's ephemeral-storage request: its app containers' requests added up, or the largest
/// init container's when that is more (a value that does not parse counts as none).
fn ephemeral_storage_request(pod: &Pod) -> u64 {
    let of = |c: &k8s_openapi::api::core::v1::Container| -> u64 {
        c.resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("ephemeral-storage"))
            .and_then(|q| Quantity::parse(&q.0).ok())
            .and_then(|q| u64::try_from(q.value()).ok())
            .unwrap_or(0)
    };
    let Some(spec) = pod.spec.as_ref() else {
        return 0;
    };
    let apps: u64 = spec.containers.iter().map(of).sum();
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .map(of)
        .max()
        .unwrap_or(0);
    apps.max(init)
}

/// The kubelet's order under memory or disk pressure: usage above the request first, then lower
/// priority, then the larger usage above the request (`resource`: `memory`,
/// `ephemeral-storage`, or `inodes`, which has no request). Under pid pressure: lower priority
/// first, then more processes. Critical pods are left out.
pub fn rank(mut pods: Vec<Candidate>, resource: &str) -> Vec<Candidate> {
    pods.retain(|c| !is_critical(&c.pod));
    if resource == "pids" {
        pods.sort_by(|a, b| {
            priority(&a.pod)
                .cmp(&priority(&b.pod))
                .then(b.usage.cmp(&a.usage))
        });
        return pods;
    }
    pods.sort_by(|a, b| {
        let (ra, rb) = (request(&a.pod, resource), request(&b.pod, resource));
        let (ea, eb) = (a.usage > ra, b.usage > rb);
        eb.cmp(&ea)
            .then(priority(&a.pod).cmp(&priority(&b.pod)))
            .then((b.usage as i128 - rb as i128).cmp(&(a.usage as i128 - ra as i128)))
    });
    pods
}

/// The kubelet's eviction message.
pub fn message(t: &Threshold, o: &Observation, pod: &Candidate) -> String {
    let resource = t.signal.resource();
    let amount = |v: u64| {
        if resource == "inodes" || resource == "pids" {
            v.to_string()
        } else {
            bytes(v)
        }
    };
    let threshold = match t.amount {
        Amount::Absolute(v) => amount(v),
        Amount::Percent(p) => format!("{p}%"),
    };
    let mut m = format!(
        "The node was low on resource: {resource}. Threshold quantity: {threshold}, available: {}. ",
        amount(o.available),
    );
    if resource == "memory" || resource == "ephemeral-storage" {
        m.push_str(&format!(
            "Pod was using {}, request is {}. ",
            bytes(pod.usage),
            bytes(request(&pod.pod, resource))
        ));
    }
    m
}

fn bytes(v: u64) -> String {
    if v >= 1 << 20 && v.is_multiple_of(1 << 10) {
        format!("{}Ki", v >> 10)
    } else {
        v.to_string()
    }
}

/// A node-level clean-up run before pods are evicted for disk pressure (container and image
/// garbage collection, wired by the agent); it answers a line for the log.
pub type ReclaimFn = Arc<
    dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = String> + Send>> + Send + Sync,
>;

/// What can be reclaimed before evicting.
#[derive(Clone, Default)]
pub struct Reclaim {
    /// Dead containers and sandboxes.
    pub containers: Option<ReclaimFn>,
    /// Images no container uses.
    pub images: Option<ReclaimFn>,
}

/// The manager's task: observes every interval, reports node conditions, reclaims node-level
/// resources under disk pressure, and evicts one pod per interval while a threshold is acted on.
pub struct Manager {
    pub cm: ContainerManager,
    pub cri: crate::cri::Cri,
    pub status: crate::status::StatusManager,
    pub cfg: Config,
    pub reclaim: Reclaim,
    /// Where an evicted pod's UID goes for an immediate sync (the sync loop's "sync now").
    pub sync_now: tokio::sync::mpsc::UnboundedSender<String>,
    /// The node conditions under pressure, sorted (read by the node status).
    pub pressure: tokio::sync::watch::Sender<Vec<&'static str>>,
}

impl Manager {
    pub async fn run(self, cancel: tokio_util::sync::CancellationToken) {
        let mut tick = tokio::time::interval(self.cfg.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut pressure: HashMap<&'static str, tokio::time::Instant> = HashMap::new();
        let mut tracker = Tracker::default();
        let mut image_fs: Option<PathBuf> = None;
        let thresholds = &self.cfg.thresholds;
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            if image_fs.is_none() {
                image_fs = image_fs_mount(&self.cri).await;
            }
            // Pods over their own local-storage limits go first, whatever the node's signals
            // (the kubelet's local-storage evictions); the round ends with them.
            let over = self.local_storage_evictions().await;
            if !over.is_empty() {
                for uid in over {
                    self.wait_for_cleanup(&uid, &cancel).await;
                }
                continue;
            }
            let observed = observe(&self.cm, &self.cfg, image_fs.as_deref());
            let now = tokio::time::Instant::now();
            let round = tracker.step(thresholds, &observed, now.into_std());
            for &i in &round.met {
                let t = &thresholds[i];
                let condition = t.signal.condition();
                if pressure.insert(condition, now).is_none() {
                    tracing::warn!(
                        condition,
                        signal = t.signal.as_str(),
                        available = observed.get(&t.signal).map_or(0, |o| o.available),
                        hard = t.is_hard(),
                        "eviction threshold met"
                    );
                }
            }
            pressure.retain(|condition, since| {
                let keep = now.duration_since(*since) < self.cfg.pressure_transition;
                if !keep {
                    tracing::info!(condition, "node condition cleared");
                }
                keep
            });
            let mut held: Vec<&'static str> = pressure.keys().copied().collect();
            held.sort_unstable();
            self.pressure.send_if_modified(|now| {
                let changed = *now != held;
                if changed {
                    *now = held;
                }
                changed
            });
            let Some(i) = to_reclaim(thresholds, &round.acting) else {
                continue;
            };
            let t = thresholds[i];
            let Some(o) = observed.get(&t.signal).copied() else {
                continue;
            };
            if t.signal.is_disk() && self.reclaim_node_level(t.signal, image_fs.as_deref()).await {
                continue;
            }
            if let Some(uid) = self.evict_one(&t, &o, image_fs.as_deref()).await {
                self.wait_for_cleanup(&uid, &cancel).await;
            }
        }
    }

    /// Evicts (1 s of grace) every running pod whose emptyDir on disk holds more than its
    /// `sizeLimit`, or whose volumes, logs and writable layers hold more than the sum of its
    /// containers' ephemeral-storage limits, with the kubelet's messages. Only pods that set
    /// such a limit are measured. Answers the evicted pods' UIDs.
    async fn local_storage_evictions(&self) -> Vec<String> {
        let pods: Vec<(String, Arc<Pod>)> = self
            .status
            .pods_started()
            .into_iter()
            .filter(|(uid, pod, _)| {
                !self.status.is_evicted(uid)
                    && !self.status.is_terminal(uid)
                    && !is_critical(pod)
                    && has_local_storage_limit(pod)
            })
            .map(|(uid, pod, _)| (uid, pod))
            .collect();
        if pods.is_empty() {
            return Vec::new();
        }
        let writable = if pods
            .iter()
            .any(|(_, p)| ephemeral_storage_limit(p).is_some())
        {
            writable_layers(&self.cri, false).await
        } else {
            LayerUse::new()
        };
        let cfg = self.cfg.clone();
        let verdicts = tokio::task::spawn_blocking(move || {
            pods.into_iter()
                .filter_map(|(uid, pod)| {
                    let layers = writable.get(&uid).cloned().unwrap_or_default();
                    local_storage_verdict(&cfg, &uid, &pod, &layers).map(|m| (uid, pod, m))
                })
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        let mut evicted = Vec::new();
        for (uid, pod, (signal, msg)) in verdicts {
            tracing::warn!(pod = %crate::pod::full_name(&pod), message = %msg, "evicting pod over its local storage limit");
            if self
                .status
                .evict_with_grace(&uid, &msg, Some(IMMEDIATE_GRACE_SECS))
            {
                self.cri.metrics().evicted(signal);
                let _ = self.sync_now.send(uid.clone());
                evicted.push(uid);
            }
        }
        evicted
    }

    /// Waits until the evicted pod's worker has stopped it and removed what it held (its
    /// volumes free their disk, its cgroup its memory), at most [`CLEANUP_TIMEOUT`]: the next
    /// observation must see what the eviction freed, or it would evict a second pod for the
    /// same shortage (the kubelet waits the same way).
    async fn wait_for_cleanup(&self, uid: &str, cancel: &tokio_util::sync::CancellationToken) {
        let deadline = tokio::time::Instant::now() + CLEANUP_TIMEOUT;
        loop {
            if self.status.api_view(uid).is_none_or(|(_, _, done)| done) {
                tracing::info!(uid, "eviction manager: evicted pod cleaned up");
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(
                    uid,
                    "eviction manager: timed out waiting for the evicted pod to be cleaned up"
                );
                return;
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(CLEANUP_POLL) => {}
            }
        }
    }

    /// Runs the node-level clean-ups for a disk signal and observes again: true when no
    /// threshold (with its minimum reclaim) is met any more, so no pod needs to go. As on the
    /// kubelet: with the images on a file system of their own, pressure on the node file system
    /// only collects containers; otherwise containers and images are both collected.
    async fn reclaim_node_level(&self, signal: Signal, image_fs: Option<&std::path::Path>) -> bool {
        let dedicated = image_fs.is_some_and(|m| !same_filesystem(m, &self.cfg.root_dir));
        let images =
            !(dedicated && matches!(signal, Signal::NodeFsAvailable | Signal::NodeFsInodesFree));
        let mut ran = false;
        for (what, f) in [
            ("containers", self.reclaim.containers.as_ref()),
            ("images", self.reclaim.images.as_ref().filter(|_| images)),
        ] {
            if let Some(f) = f {
                let done = f().await;
                tracing::info!(signal = signal.as_str(), what, %done, "eviction manager: reclaimed node-level resources");
                ran = true;
            }
        }
        if !ran {
            return false;
        }
        let observed = observe(&self.cm, &self.cfg, image_fs);
        let left = met(&self.cfg.thresholds, &observed, true);
        if left.is_empty() {
            tracing::info!(
                signal = signal.as_str(),
                "eviction manager: able to reduce resource pressure without evicting pods"
            );
        }
        left.is_empty()
    }

    /// Ranks the running pods for `t`'s resource and evicts the first; answers its UID.
    async fn evict_one(
        &self,
        t: &Threshold,
        o: &Observation,
        image_fs: Option<&std::path::Path>,
    ) -> Option<String> {
        let pods: Vec<(String, Arc<Pod>)> = self
            .status
            .pods_started()
            .into_iter()
            .filter(|(uid, _, _)| !self.status.is_evicted(uid) && !self.status.is_terminal(uid))
            .map(|(uid, pod, _)| (uid, pod))
            .collect();
        let usage = self.usage_of(t.signal, &pods, image_fs).await;
        let candidates = pods
            .into_iter()
            .map(|(uid, pod)| {
                let usage = usage.get(&uid).copied().unwrap_or(0);
                Candidate { uid, pod, usage }
            })
            .collect();
        let Some(victim) = rank(candidates, t.signal.resource()).into_iter().next() else {
            tracing::warn!(
                signal = t.signal.as_str(),
                "eviction threshold met, but no pod can be evicted"
            );
            return None;
        };
        let msg = message(t, o, &victim);
        let grace = eviction_grace(t, self.cfg.max_pod_grace_period, &victim.pod);
        tracing::warn!(
            pod = %crate::pod::full_name(&victim.pod),
            signal = t.signal.as_str(),
            hard = t.is_hard(),
            grace_seconds = ?grace,
            message = %msg,
            "evicting pod"
        );
        if !self.status.evict_with_grace(&victim.uid, &msg, grace) {
            return None;
        }
        self.cri.metrics().evicted(t.signal.as_str());
        let _ = self.sync_now.send(victim.uid.clone());
        Some(victim.uid)
    }

    /// Each pod's use of what `signal` measures.
    async fn usage_of(
        &self,
        signal: Signal,
        pods: &[(String, Arc<Pod>)],
        image_fs: Option<&std::path::Path>,
    ) -> HashMap<String, u64> {
        let mut out = HashMap::new();
        match signal {
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable | Signal::PidAvailable => {
                for (uid, pod) in pods {
                    let usage = crate::pod::qos::pod_qos(pod)
                        .ok()
                        .and_then(|q| self.cm.pod_usage(uid, q).ok());
                    let v = if signal == Signal::PidAvailable {
                        usage.and_then(|u| u.processes)
                    } else {
                        usage.and_then(|u| u.memory).map(|m| m.working_set_bytes)
                    };
                    out.insert(uid.clone(), v.unwrap_or(0));
                }
            }
            Signal::NodeFsAvailable | Signal::NodeFsInodesFree | Signal::ImageFsAvailable => {
                let inodes = signal == Signal::NodeFsInodesFree;
                let dedicated = image_fs.is_some_and(|m| !same_filesystem(m, &self.cfg.root_dir));
                // With the images apart, the node file system holds the pods' volumes and logs
                // and the image file system their writable layers; otherwise one holds all.
                let (local, layers) = match (dedicated, signal) {
                    (true, Signal::ImageFsAvailable) => (false, true),
                    (true, _) => (true, false),
                    (false, _) => (true, true),
                };
                let writable = if layers {
                    writable_layers(&self.cri, inodes).await
                } else {
                    HashMap::new()
                };
                let cfg = self.cfg.clone();
                let pods: Vec<(String, Arc<Pod>)> = pods.to_vec();
                let local_use = if local {
                    tokio::task::spawn_blocking(move || {
                        pods.iter()
                            .map(|(uid, pod)| (uid.clone(), local_disk_use(&cfg, uid, pod, inodes)))
                            .collect::<HashMap<_, _>>()
                    })
                    .await
                    .unwrap_or_default()
                } else {
                    HashMap::new()
                };
                for (uid, v) in local_use {
                    *out.entry(uid).or_insert(0) += v;
                }
                for (uid, v) in writable {
                    *out.entry(uid).or_insert(0) += v.values().sum::<u64>();
                }
            }
        }
        out
    }
}

/// The sum of the ephemeral-storage limits of the pod's containers that set one (`None`: none
/// does), as the kubelet's `PodLimits`.
fn ephemeral_storage_limit(pod: &Pod) -> Option<u64> {
    let limits: Vec<u64> = pod
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .filter_map(container_ephemeral_storage_limit)
        .collect();
    (!limits.is_empty()).then(|| limits.iter().sum())
}

/// A container's ephemeral-storage limit, if it sets one.
fn container_ephemeral_storage_limit(c: &k8s_openapi::api::core::v1::Container) -> Option<u64> {
    let q = c
        .resources
        .as_ref()?
        .limits
        .as_ref()?
        .get("ephemeral-storage")?;
    u64::try_from(Quantity::parse(&q.0).ok()?.value()).ok()
}

/// Whether the pod sets a local-storage limit the manager enforces.
fn has_local_storage_limit(pod: &Pod) -> bool {
    ephemeral_storage_limit(pod).is_some()
        || pod.spec.as_ref().is_some_and(|s| {
            s.volumes.iter().flatten().any(|v| {
                v.empty_dir.as_ref().is_some_and(|e| {
                    e.size_limit.is_some() && e.medium.as_deref().unwrap_or("").is_empty()
                })
            })
        })
}

/// The kubelet's signal and message when the pod is over one of its local-storage limits, else
/// `None`: an emptyDir on disk past its `sizeLimit` (`emptydirfs.limit`), the pod past its
/// containers' limits together (`ephemeralpodfs.limit`), or a container past its own, its
/// writable layer and its logs (`ephemeralcontainerfs.limit`), checked in that order.
/// `layers`: the writable layers' bytes by container name.
fn local_storage_verdict(
    cfg: &Config,
    uid: &str,
    pod: &Pod,
    layers: &HashMap<String, u64>,
) -> Option<(&'static str, String)> {
    let spec = pod.spec.as_ref()?;
    let pods_dir = cfg.root_dir.join("pods");
    for (name, limit, dir) in crate::volume::disk_size_limits(&pods_dir, uid, spec) {
        if disk_use(&dir).0 > limit {
            return Some((
                "emptydirfs.limit",
                format!(
                    "Usage of EmptyDir volume \"{name}\" exceeds the limit \"{}\". ",
                    quantity(limit)
                ),
            ));
        }
    }
    let limit = ephemeral_storage_limit(pod)?;
    let used = local_disk_use(cfg, uid, pod, false).saturating_add(layers.values().sum());
    if used > limit {
        return Some((
            "ephemeralpodfs.limit",
            format!(
                "Pod ephemeral local storage usage exceeds the total limit of containers {}. ",
                quantity(limit)
            ),
        ));
    }
    let logs = pod_log_dir(cfg, uid, pod);
    spec.containers.iter().find_map(|c| {
        let limit = container_ephemeral_storage_limit(c)?;
        let used = layers
            .get(&c.name)
            .copied()
            .unwrap_or(0)
            .saturating_add(disk_use(&logs.join(&c.name)).0);
        (used > limit).then(|| {
            (
                "ephemeralcontainerfs.limit",
                format!(
                    "Container {} exceeded its local ephemeral storage limit \"{}\". ",
                    c.name,
                    quantity(limit)
                ),
            )
        })
    })
}

/// Bytes as the API prints a binary quantity (`64Mi`), or plain bytes.
fn quantity(v: u64) -> String {
    const UNITS: [(&str, u32); 4] = [("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)];
    UNITS
        .iter()
        .find(|(_, shift)| v >= 1 << shift && v.is_multiple_of(1 << shift))
        .map_or_else(
            || v.to_string(),
            |(unit, shift)| format!("{}{unit}", v >> shift),
        )
}

/// Whether two paths are on one file system (one device).
fn same_filesystem(a: &std::path::Path, b: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev(),
        _ => true,
    }
}

/// The mount point of the runtime's image file system (CRI `ImageFsInfo`).
async fn image_fs_mount(cri: &crate::cri::Cri) -> Option<PathBuf> {
    let fs = cri.image_fs_info().await.ok()?;
    fs.image_filesystems
        .iter()
        .find_map(|f| f.fs_id.as_ref().map(|id| PathBuf::from(&id.mountpoint)))
        .filter(|p| !p.as_os_str().is_empty())
}

/// The bytes (or inodes) of each container's writable layer, by pod UID and container name (CRI
/// `ListContainerStats`; a container's instances add up).
async fn writable_layers(cri: &crate::cri::Cri, inodes: bool) -> LayerUse {
    let mut out = LayerUse::new();
    let Ok(stats) = cri.list_container_stats(None).await else {
        return out;
    };
    for s in stats {
        let Some((uid, name)) = s.attributes.as_ref().and_then(|a| {
            let uid = a.labels.get(crate::pod::labels::POD_UID)?;
            Some((uid.clone(), a.metadata.as_ref()?.name.clone()))
        }) else {
            continue;
        };
        let used = s.writable_layer.as_ref().and_then(|w| {
            if inodes {
                w.inodes_used.as_ref().map(|v| v.value)
            } else {
                w.used_bytes.as_ref().map(|v| v.value)
            }
        });
        *out.entry(uid).or_default().entry(name).or_insert(0) += used.unwrap_or(0);
    }
    out
}

/// Writable-layer use: pod UID -> container name -> bytes (or inodes).
type LayerUse = HashMap<String, HashMap<String, u64>>;

/// A pod's bytes (or inodes) on the node file system: its volumes directory (emptyDirs on disk;
/// volumes mounted from other file systems, as memory emptyDirs and secrets are, are not
/// counted) and its log directory.
fn local_disk_use(cfg: &Config, uid: &str, pod: &Pod, inodes: bool) -> u64 {
    let volumes = cfg.root_dir.join("pods").join(uid).join("volumes");
    [volumes, pod_log_dir(cfg, uid, pod)]
        .iter()
        .map(|d| {
            let (b, i) = disk_use(d);
            if inodes { i } else { b }
        })
        .sum()
}

/// The pod's log directory (its containers' logs are in `<container name>/` below it).
fn pod_log_dir(cfg: &Config, uid: &str, pod: &Pod) -> PathBuf {
    let meta = &pod.metadata;
    crate::pod::log_paths::pod_log_dir(
        &cfg.pod_logs_dir,
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
        uid,
    )
}

/// Bytes (allocated blocks) and inodes under `dir`, not crossing into other file systems and
/// not following symbolic links; what cannot be read counts as nothing.
pub fn disk_use(dir: &std::path::Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let Ok(top) = std::fs::symlink_metadata(dir) else {
        return (0, 0);
    };
    let dev = top.dev();
    let (mut bytes, mut inodes) = (top.blocks() * 512, 1);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.dev() != dev {
                continue;
            }
            bytes += m.blocks() * 512;
            inodes += 1;
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    (bytes, inodes)
}

/// Reads the signals now (`image_fs`: the runtime's image file system, when known).
pub fn observe(
    cm: &ContainerManager,
    cfg: &Config,
    image_fs: Option<&std::path::Path>,
) -> HashMap<Signal, Observation> {
    let mut out = HashMap::new();
    if let Some(capacity) = crate::cm::machine_memory_bytes() {
        if let Some(m) = cm.cgroup_usage("/").memory {
            out.insert(
                Signal::MemoryAvailable,
                Observation {
                    available: capacity.saturating_sub(m.working_set_bytes),
                    capacity,
                },
            );
        }
        let allocatable = capacity.saturating_sub(cfg.reserved_memory);
        let pods = cm.qos_cgroup_name(crate::pod::qos::QosClass::Guaranteed);
        if let Some(m) = cm.cgroup_usage(&pods).memory {
            out.insert(
                Signal::AllocatableMemoryAvailable,
                Observation {
                    available: allocatable.saturating_sub(m.working_set_bytes),
                    capacity: allocatable,
                },
            );
        }
    }
    if let Ok(fs) = crate::cm::filesystem_stats(&cfg.root_dir) {
        out.insert(
            Signal::NodeFsAvailable,
            Observation {
                available: fs.available_bytes,
                capacity: fs.capacity_bytes,
            },
        );
        out.insert(
            Signal::NodeFsInodesFree,
            Observation {
                available: fs.inodes_free,
                capacity: fs.inodes,
            },
        );
    }
    if let Some(fs) = image_fs.and_then(|p| crate::cm::filesystem_stats(p).ok()) {
        out.insert(
            Signal::ImageFsAvailable,
            Observation {
                available: fs.available_bytes,
                capacity: fs.capacity_bytes,
            },
        );
    }
    let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    if let Some(max) = pid_max {
        let procs = rustix::system::sysinfo().procs;
        out.insert(
            Signal::PidAvailable,
            Observation {
                available: max.saturating_sub(u64::from(procs)),
                capacity: max,
            },
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn thresholds_parse_as_the_kubelets_flag() {
        let t = parse_thresholds(DEFAULT_HARD).unwrap();
        assert_eq!(t.len(), 4);
        assert_eq!(
            t[0],
            Threshold {
                signal: Signal::MemoryAvailable,
                amount: Amount::Absolute(100 << 20),
                grace_period: Duration::ZERO,
                min_reclaim: None,
            }
        );
        assert!(t.iter().all(Threshold::is_hard));
        assert_eq!(t[1].amount, Amount::Percent(10.0));
        assert!(parse_thresholds(&[""]).unwrap().is_empty());
        assert!(parse_thresholds(&[] as &[&str]).unwrap().is_empty());
        // A trailing comma's blank entry is skipped, and entries are trimmed.
        assert_eq!(
            parse_thresholds(&[" memory.available<100Mi ", ""]).unwrap()[0],
            t[0]
        );
        assert!(matches!(
            parse_thresholds(&["memory.available>1Gi"]),
            Err(Error::Syntax("--eviction-hard", _))
        ));
        assert!(matches!(
            parse_thresholds(&["swap.available<1Gi"]),
            Err(Error::Signal(..))
        ));
        assert!(matches!(
            parse_thresholds(&["nodefs.available<200%"]),
            Err(Error::Amount(..))
        ));
        assert!(matches!(
            parse_thresholds(&["memory.available<lots"]),
            Err(Error::Amount(..))
        ));
        assert_eq!(
            parse_thresholds(&["memory.available<1Gi", "memory.available<2Gi"]),
            Err(Error::Twice("--eviction-hard", "memory.available"))
        );
        assert_eq!(
            Reserved::parse(&["cpu=1500m", "memory=1Gi", "ephemeral-storage=1G"]).unwrap(),
            Reserved {
                memory: 1 << 30,
                cpu_millis: 1500,
                ephemeral_storage: 1_000_000_000,
            }
        );
        assert_eq!(Reserved::parse(&[""]).unwrap(), Reserved::default());
        assert!(Reserved::parse(&["memory"]).is_err());
        // The error names the whole setting, as the flag's comma-separated value.
        assert_eq!(
            Reserved::parse(&["cpu=1", "memory"]),
            Err(Error::Reserved("cpu=1,memory".into()))
        );
        assert!(
            Reserved::parse(&["pid=100"]).is_err(),
            "unknown resources are refused"
        );
    }

    #[test]
    fn soft_thresholds_need_a_grace_period_and_take_a_minimum_reclaim() {
        let grace = [(Signal::MemoryAvailable, Duration::from_secs(90))];
        let mut t = parse_soft(&["memory.available<1Gi"], &grace).unwrap();
        assert_eq!(t[0].grace_period, Duration::from_secs(90));
        assert!(!t[0].is_hard());
        assert_eq!(
            parse_soft(&["nodefs.available<20%"], &grace),
            Err(Error::NoGracePeriod("nodefs.available".into()))
        );
        assert_eq!(
            parse_soft(
                &["memory.available<1Gi"],
                &[(Signal::MemoryAvailable, Duration::ZERO)]
            ),
            Err(Error::NoGracePeriod("memory.available".into()))
        );
        apply_min_reclaim(&mut t, &["memory.available=500Mi", "nodefs.available=5%"]).unwrap();
        assert_eq!(t[0].min_reclaim, Some(Amount::Absolute(500 << 20)));
        assert!(matches!(
            apply_min_reclaim(&mut t, &["memory.available"]),
            Err(Error::Pair(..))
        ));
        assert!(matches!(
            apply_min_reclaim(&mut t, &["memory.available=-1Gi"]),
            Err(Error::Amount(..))
        ));
        assert_eq!(
            parse_pairs(
                "--eviction-soft-grace-period",
                &["memory.available=1m", " pid.available=5s"]
            )
            .unwrap(),
            [
                (Signal::MemoryAvailable, "1m"),
                (Signal::PidAvailable, "5s")
            ]
        );
    }

    fn obs(available: u64, capacity: u64) -> Observation {
        Observation {
            available,
            capacity,
        }
    }

    #[test]
    fn a_threshold_is_met_below_its_amount_of_the_capacity() {
        let t = parse_thresholds(&["memory.available<100Mi", "nodefs.available<10%"]).unwrap();
        let observed = HashMap::from([
            (Signal::MemoryAvailable, obs(99 << 20, 1 << 30)),
            (Signal::NodeFsAvailable, obs(11, 100)),
        ]);
        let m = met(&t, &observed, false);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].0.signal, Signal::MemoryAvailable);
        let observed = HashMap::from([(Signal::NodeFsAvailable, obs(9, 100))]);
        assert_eq!(
            met(&t, &observed, false)[0].0.signal,
            Signal::NodeFsAvailable
        );
    }

    #[test]
    fn a_soft_threshold_acts_after_its_grace_period_and_a_met_one_stays_until_reclaimed() {
        let mut t = parse_thresholds(&["memory.available<100Mi"]).unwrap();
        t.extend(
            parse_soft(
                &["nodefs.available<20%"],
                &[(Signal::NodeFsAvailable, Duration::from_secs(60))],
            )
            .unwrap(),
        );
        apply_min_reclaim(&mut t, &["memory.available=50Mi"]).unwrap();
        let mut tracker = Tracker::default();
        let t0 = Instant::now();
        let at = |s| t0 + Duration::from_secs(s);
        let low_disk = HashMap::from([
            (Signal::MemoryAvailable, obs(1 << 30, 2 << 30)),
            (Signal::NodeFsAvailable, obs(10, 100)),
        ]);
        // The soft threshold is met (its condition raised) but not acted on for 60 s.
        let r = tracker.step(&t, &low_disk, at(0));
        assert_eq!((r.met, r.acting), (vec![1], vec![]));
        assert!(tracker.step(&t, &low_disk, at(59)).acting.is_empty());
        assert_eq!(tracker.step(&t, &low_disk, at(60)).acting, [1]);
        // Recovered for one round: the clock starts again.
        let fine = HashMap::from([
            (Signal::MemoryAvailable, obs(1 << 30, 2 << 30)),
            (Signal::NodeFsAvailable, obs(50, 100)),
        ]);
        assert_eq!(tracker.step(&t, &fine, at(61)), Round::default());
        assert!(tracker.step(&t, &low_disk, at(62)).acting.is_empty());
        // A hard threshold acts at once; then, with 120 Mi available (above 100 Mi but not
        // above 100 + 50 Mi), it stays met; at 160 Mi it is resolved.
        let memory = |mib: u64| HashMap::from([(Signal::MemoryAvailable, obs(mib << 20, 2 << 30))]);
        assert_eq!(tracker.step(&t, &memory(90), at(70)).acting, [0]);
        assert_eq!(tracker.step(&t, &memory(120), at(71)).acting, [0]);
        assert_eq!(tracker.step(&t, &memory(160), at(72)), Round::default());
        // Not acted on last round: 120 Mi is not below the threshold itself.
        assert_eq!(tracker.step(&t, &memory(120), at(73)), Round::default());
    }

    #[test]
    fn memory_is_reclaimed_first_and_hard_evictions_get_one_second() {
        let mut t = parse_thresholds(&["nodefs.available<10%", "memory.available<100Mi"]).unwrap();
        t.extend(
            parse_soft(
                &["pid.available<10%"],
                &[(Signal::PidAvailable, Duration::from_secs(5))],
            )
            .unwrap(),
        );
        assert_eq!(to_reclaim(&t, &[0, 1, 2]), Some(1));
        assert_eq!(to_reclaim(&t, &[2, 0]), Some(0));
        assert_eq!(to_reclaim(&t, &[]), None);
        let p = pod("p", None, None);
        assert_eq!(eviction_grace(&t[0], 0, &p), Some(IMMEDIATE_GRACE_SECS));
        assert_eq!(eviction_grace(&t[2], 0, &p), Some(0));
        assert_eq!(eviction_grace(&t[2], 10, &p), Some(10));
        assert_eq!(
            eviction_grace(&t[2], 600, &p),
            Some(30),
            "the pod's own is less"
        );
        assert_eq!(
            eviction_grace(&t[2], -1, &p),
            None,
            "negative: the pod's own"
        );
    }

    fn pod(name: &str, request: Option<&str>, priority: Option<i32>) -> Arc<Pod> {
        let mut p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": name},
            "spec": {"containers": [{"name": "c", "image": "i"}]}
        }))
        .unwrap();
        if let Some(r) = request {
            p.spec.as_mut().unwrap().containers[0].resources = Some(
                serde_json::from_value(
                    serde_json::json!({"requests": {"memory": r, "ephemeral-storage": r}}),
                )
                .unwrap(),
            );
        }
        p.spec.as_mut().unwrap().priority = priority;
        Arc::new(p)
    }

    fn names(ranked: &[Candidate]) -> Vec<&str> {
        ranked.iter().map(|c| c.uid.as_str()).collect()
    }

    #[test]
    fn pods_rank_over_request_then_priority_then_excess() {
        let c = |name, request, prio, usage| Candidate {
            uid: String::from(name),
            pod: pod(name, request, prio),
            usage,
        };
        let pods = || {
            vec![
                c("within-request", Some("500Mi"), None, 400 << 20),
                c("small-excess", None, None, 50 << 20),
                c("big-excess", None, None, 300 << 20),
                c("high-priority-excess", None, Some(1000), 800 << 20),
                c("critical", None, Some(2_000_000_000), 900 << 20),
            ]
        };
        let expected = [
            "big-excess",
            "small-excess",
            "high-priority-excess",
            "within-request",
        ];
        let ranked = rank(pods(), "memory");
        assert_eq!(names(&ranked), expected);
        // The disk ranks the same way against the ephemeral-storage request.
        assert_eq!(names(&rank(pods(), "ephemeral-storage")), expected);
        // Under pid pressure: priority first, then the most processes.
        assert_eq!(
            names(&rank(pods(), "pids")),
            [
                "within-request",
                "big-excess",
                "small-excess",
                "high-priority-excess"
            ]
        );
        let t = parse_thresholds(&["memory.available<100Mi"]).unwrap()[0];
        let m = message(&t, &obs(80 << 20, 1 << 30), &ranked[0]);
        assert!(m.starts_with("The node was low on resource: memory. Threshold quantity: 102400Ki, available: 81920Ki. Pod was using 307200Ki, request is 0."), "{m}");
        let t = parse_thresholds(&["nodefs.inodesFree<5%"]).unwrap()[0];
        let m = message(&t, &obs(40, 1000), &ranked[0]);
        assert_eq!(
            m,
            "The node was low on resource: inodes. Threshold quantity: 5%, available: 40. "
        );
    }

    #[test]
    fn local_storage_limits_are_read_and_judged_as_the_kubelet_does() {
        let root = tempfile::tempdir().unwrap();
        let cfg = Config {
            thresholds: Vec::new(),
            max_pod_grace_period: 0,
            interval: Duration::from_secs(10),
            pressure_transition: Duration::from_secs(300),
            reserved_memory: 0,
            root_dir: root.path().to_owned(),
            pod_logs_dir: root.path().join("logs"),
        };
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "u"},
            "spec": {
                "containers": [
                    {"name": "a", "image": "i", "resources": {"limits": {"ephemeral-storage": "1Mi"}}},
                    {"name": "b", "image": "i", "resources": {"limits": {"ephemeral-storage": "1Mi"}}},
                    {"name": "c", "image": "i"}
                ],
                "volumes": [
                    {"name": "small", "emptyDir": {"sizeLimit": "64Ki"}},
                    {"name": "mem", "emptyDir": {"medium": "Memory", "sizeLimit": "1Ki"}}
                ]
            }
        }))
        .unwrap();
        assert!(has_local_storage_limit(&p));
        assert_eq!(ephemeral_storage_limit(&p), Some(2 << 20));
        assert_eq!(
            local_storage_verdict(&cfg, "u", &p, &HashMap::new()),
            None,
            "nothing written"
        );
        let dir = root
            .path()
            .join("pods/u/volumes/kubernetes.io~empty-dir/small");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("f"), vec![1u8; 128 << 10]).unwrap();
        assert_eq!(
            local_storage_verdict(&cfg, "u", &p, &HashMap::new()),
            Some((
                "emptydirfs.limit",
                "Usage of EmptyDir volume \"small\" exceeds the limit \"64Ki\". ".to_owned()
            ))
        );
        std::fs::remove_file(dir.join("f")).unwrap();
        // 3 MiB of writable layers is over the containers' 2 MiB together.
        let layers = |a: u64, b: u64| HashMap::from([("a".to_owned(), a), ("b".to_owned(), b)]);
        assert_eq!(
            local_storage_verdict(&cfg, "u", &p, &layers(2 << 20, 1 << 20)),
            Some((
                "ephemeralpodfs.limit",
                "Pod ephemeral local storage usage exceeds the total limit of containers 2Mi. "
                    .to_owned()
            ))
        );
        // Within the pod's 2 MiB, but container b's layer and logs are over its own 1 MiB.
        let logs = root.path().join("logs/default_p_u/b");
        std::fs::create_dir_all(&logs).unwrap();
        std::fs::write(logs.join("0.log"), vec![1u8; 512 << 10]).unwrap();
        assert_eq!(
            local_storage_verdict(&cfg, "u", &p, &layers(0, 768 << 10)),
            Some((
                "ephemeralcontainerfs.limit",
                "Container b exceeded its local ephemeral storage limit \"1Mi\". ".to_owned()
            ))
        );
        assert_eq!(
            local_storage_verdict(&cfg, "u", &p, &layers(0, 256 << 10)),
            None,
            "b's layer and logs together are within 1 MiB"
        );
        let plain = pod("q", None, None);
        assert!(!has_local_storage_limit(&plain));
        assert_eq!(quantity(1536), "1536");
        assert_eq!(quantity(3 << 30), "3Gi");
    }

    #[test]
    fn disk_use_counts_blocks_and_inodes_below_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("a/b");
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::write(sub.join("f"), vec![7u8; 64 << 10]).unwrap();
        std::fs::write(dir.path().join("g"), b"x").unwrap();
        let (bytes, inodes) = disk_use(dir.path());
        assert_eq!(inodes, 5, "the directory, a, b, f and g");
        assert!(bytes >= 64 << 10, "{bytes}");
        assert_eq!(disk_use(&dir.path().join("missing")), (0, 0));
    }
}
