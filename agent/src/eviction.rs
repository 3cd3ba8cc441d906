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

    /// The resource the eviction message names.
    fn resource(self) -> &'static str {
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

/// `signal < amount`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Threshold {
    pub signal: Signal,
    pub amount: Amount,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error(
        "--eviction-hard {0:?}: expected <signal><<quantity or percent>, e.g. memory.available<100Mi"
    )]
    Syntax(String),
    #[error("--eviction-hard {0:?}: unknown signal")]
    Signal(String),
    #[error("--eviction-hard {0:?}: {1}")]
    Amount(String, String),
    #[error(
        "--system-reserved/--kube-reserved {0:?}: expected <resource>=<quantity>[,...] with \
         resources cpu, memory, ephemeral-storage"
    )]
    Reserved(String),
}

/// The kubelet's default hard thresholds on Linux.
pub const DEFAULT_HARD: &str =
    "memory.available<100Mi,nodefs.available<10%,nodefs.inodesFree<5%,imagefs.available<15%";

/// Parses `--eviction-hard`: comma-separated `<signal><<amount>`; an empty value means none.
pub fn parse_thresholds(value: &str) -> Result<Vec<Threshold>, Error> {
    let mut out = Vec::new();
    for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, amount) = part
            .split_once('<')
            .ok_or_else(|| Error::Syntax(part.to_owned()))?;
        let signal = Signal::parse(name.trim()).ok_or_else(|| Error::Signal(part.to_owned()))?;
        let amount = amount.trim();
        let amount = if let Some(p) = amount.strip_suffix('%') {
            let p: f64 = p
                .parse()
                .map_err(|_| Error::Amount(part.to_owned(), "not a percentage".into()))?;
            if !(0.0..=100.0).contains(&p) {
                return Err(Error::Amount(part.to_owned(), "must be 0% to 100%".into()));
            }
            Amount::Percent(p)
        } else {
            let q = Quantity::parse(amount)
                .map_err(|e| Error::Amount(part.to_owned(), e.to_string()))?;
            Amount::Absolute(
                u64::try_from(q.value())
                    .map_err(|_| Error::Amount(part.to_owned(), "must not be negative".into()))?,
            )
        };
        out.push(Threshold { signal, amount });
    }
    Ok(out)
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
    /// Parses `<resource>=<quantity>,...`; a resource other than cpu, memory and
    /// ephemeral-storage is refused (not silently dropped).
    pub fn parse(value: &str) -> Result<Self, Error> {
        let mut out = Self::default();
        let bad = || Error::Reserved(value.to_owned());
        for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
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

/// The thresholds met by `observed`, each with its observation.
pub fn met(
    thresholds: &[Threshold],
    observed: &HashMap<Signal, Observation>,
) -> Vec<(Threshold, Observation)> {
    thresholds
        .iter()
        .filter_map(|t| {
            let o = observed.get(&t.signal)?;
            (o.available < t.amount.of(o.capacity)).then_some((*t, *o))
        })
        .collect()
}

/// The settings.
#[derive(Debug, Clone)]
pub struct Config {
    pub hard: Vec<Threshold>,
    pub interval: Duration,
    /// How long a node condition stays after its threshold is no longer met.
    pub pressure_transition: Duration,
    /// `--system-reserved` + `--kube-reserved` memory: what pods may not use.
    pub reserved_memory: u64,
    /// `--root-dir`: the node file system.
    pub root_dir: PathBuf,
}

/// A pod the manager may rank.
pub struct Candidate {
    pub uid: String,
    pub pod: Arc<Pod>,
    /// Working set of its cgroup.
    pub memory: u64,
}

fn memory_request(pod: &Pod) -> u64 {
    crate::pod::resources::pod_resources(pod)
        .map(|r| r.requests.memory_bytes())
        .unwrap_or(0)
}

/// The kubelet's order under memory pressure: usage above the request first, then lower
/// priority, then the larger usage above the request. Critical pods are left out.
pub fn rank_for_memory(mut pods: Vec<Candidate>) -> Vec<Candidate> {
    pods.retain(|c| !is_critical(&c.pod));
    pods.sort_by(|a, b| {
        let (ra, rb) = (memory_request(&a.pod), memory_request(&b.pod));
        let (ea, eb) = (a.memory > ra, b.memory > rb);
        eb.cmp(&ea)
            .then(priority(&a.pod).cmp(&priority(&b.pod)))
            .then((b.memory as i128 - rb as i128).cmp(&(a.memory as i128 - ra as i128)))
    });
    pods
}

/// The kubelet's eviction message.
pub fn message(t: &Threshold, o: &Observation, pod: &Candidate) -> String {
    let threshold = match t.amount {
        Amount::Absolute(v) => bytes(v),
        Amount::Percent(p) => format!("{p}%"),
    };
    let mut m = format!(
        "The node was low on resource: {}. Threshold quantity: {threshold}, available: {}. ",
        t.signal.resource(),
        bytes(o.available),
    );
    if t.signal.resource() == "memory" {
        m.push_str(&format!(
            "Pod was using {}, request is {}. ",
            bytes(pod.memory),
            bytes(memory_request(&pod.pod))
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

/// The manager's task: observes every interval, logs thresholds crossing, and evicts one pod
/// per interval while a memory or pid threshold is met.
pub struct Manager {
    pub cm: ContainerManager,
    pub status: crate::status::StatusManager,
    pub cfg: Config,
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
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            let observed = observe(&self.cm, &self.cfg);
            let now = tokio::time::Instant::now();
            let met = met(&self.cfg.hard, &observed);
            for (t, o) in &met {
                let condition = t.signal.condition();
                if pressure.insert(condition, now).is_none() {
                    tracing::warn!(
                        condition,
                        signal = t.signal.as_str(),
                        available = o.available,
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
            let Some((t, o)) = met.iter().find(|(t, _)| {
                matches!(
                    t.signal,
                    Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable
                )
            }) else {
                continue;
            };
            let candidates = self
                .status
                .pods_started()
                .into_iter()
                .filter(|(uid, _, _)| !self.status.is_evicted(uid) && !self.status.is_terminal(uid))
                .map(|(uid, pod, _)| {
                    let memory = crate::pod::qos::pod_qos(&pod)
                        .ok()
                        .and_then(|q| self.cm.pod_usage(&uid, q).ok())
                        .and_then(|u| u.memory)
                        .map_or(0, |m| m.working_set_bytes);
                    Candidate { uid, pod, memory }
                })
                .collect();
            let Some(victim) = rank_for_memory(candidates).into_iter().next() else {
                tracing::warn!(
                    signal = t.signal.as_str(),
                    "eviction threshold met, but no pod can be evicted"
                );
                continue;
            };
            let msg = message(t, o, &victim);
            tracing::warn!(
                pod = %crate::pod::full_name(&victim.pod),
                signal = t.signal.as_str(),
                message = %msg,
                "evicting pod"
            );
            if self.status.evict(&victim.uid, &msg) {
                let _ = self.sync_now.send(victim.uid);
            }
        }
    }
}

/// Reads the signals now.
pub fn observe(cm: &ContainerManager, cfg: &Config) -> HashMap<Signal, Observation> {
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
    let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    // SAFETY: sysinfo fills the struct before it is read.
    let mut info: libc::sysinfo = unsafe { std::mem::zeroed() };
    if let Some(max) = pid_max
        && unsafe { libc::sysinfo(&mut info) } == 0
    {
        out.insert(
            Signal::PidAvailable,
            Observation {
                available: max.saturating_sub(u64::from(info.procs)),
                capacity: max,
            },
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_parse_as_the_kubelets_flag() {
        let t = parse_thresholds(DEFAULT_HARD).unwrap();
        assert_eq!(t.len(), 4);
        assert_eq!(
            t[0],
            Threshold {
                signal: Signal::MemoryAvailable,
                amount: Amount::Absolute(100 << 20)
            }
        );
        assert_eq!(t[1].amount, Amount::Percent(10.0));
        assert!(parse_thresholds("").unwrap().is_empty());
        assert!(matches!(
            parse_thresholds("memory.available>1Gi"),
            Err(Error::Syntax(_))
        ));
        assert!(matches!(
            parse_thresholds("swap.available<1Gi"),
            Err(Error::Signal(_))
        ));
        assert!(matches!(
            parse_thresholds("nodefs.available<200%"),
            Err(Error::Amount(..))
        ));
        assert!(matches!(
            parse_thresholds("memory.available<lots"),
            Err(Error::Amount(..))
        ));
        assert_eq!(
            Reserved::parse("cpu=1500m,memory=1Gi,ephemeral-storage=1G").unwrap(),
            Reserved {
                memory: 1 << 30,
                cpu_millis: 1500,
                ephemeral_storage: 1_000_000_000,
            }
        );
        assert_eq!(Reserved::parse("").unwrap(), Reserved::default());
        assert!(Reserved::parse("memory").is_err());
        assert!(
            Reserved::parse("pid=100").is_err(),
            "unknown resources are refused"
        );
    }

    #[test]
    fn a_threshold_is_met_below_its_amount_of_the_capacity() {
        let t = parse_thresholds("memory.available<100Mi,nodefs.available<10%").unwrap();
        let obs = |a, c| Observation {
            available: a,
            capacity: c,
        };
        let observed = HashMap::from([
            (Signal::MemoryAvailable, obs(99 << 20, 1 << 30)),
            (Signal::NodeFsAvailable, obs(11, 100)),
        ]);
        let m = met(&t, &observed);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].0.signal, Signal::MemoryAvailable);
        let observed = HashMap::from([(Signal::NodeFsAvailable, obs(9, 100))]);
        assert_eq!(met(&t, &observed)[0].0.signal, Signal::NodeFsAvailable);
    }

    fn pod(name: &str, request: Option<&str>, priority: Option<i32>) -> Arc<Pod> {
        let mut p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": name},
            "spec": {"containers": [{"name": "c", "image": "i"}]}
        }))
        .unwrap();
        if let Some(r) = request {
            p.spec.as_mut().unwrap().containers[0].resources = Some(
                serde_json::from_value(serde_json::json!({"requests": {"memory": r}})).unwrap(),
            );
        }
        p.spec.as_mut().unwrap().priority = priority;
        Arc::new(p)
    }

    #[test]
    fn pods_rank_over_request_then_priority_then_excess() {
        let c = |name, request, prio, memory| Candidate {
            uid: String::from(name),
            pod: pod(name, request, prio),
            memory,
        };
        let mut critical = c("critical", None, Some(2_000_000_000), 900 << 20);
        critical.uid = "critical".into();
        let ranked = rank_for_memory(vec![
            c("within-request", Some("500Mi"), None, 400 << 20),
            c("small-excess", None, None, 50 << 20),
            c("big-excess", None, None, 300 << 20),
            c("high-priority-excess", None, Some(1000), 800 << 20),
            critical,
        ]);
        let names: Vec<&str> = ranked.iter().map(|c| c.uid.as_str()).collect();
        assert_eq!(
            names,
            [
                "big-excess",
                "small-excess",
                "high-priority-excess",
                "within-request"
            ]
        );
        let t = parse_thresholds("memory.available<100Mi").unwrap()[0];
        let m = message(
            &t,
            &Observation {
                available: 80 << 20,
                capacity: 1 << 30,
            },
            &ranked[0],
        );
        assert!(m.starts_with("The node was low on resource: memory. Threshold quantity: 102400Ki, available: 81920Ki."), "{m}");
    }
}
