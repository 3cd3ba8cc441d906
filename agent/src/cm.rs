//! Container manager: pod cgroups (cgroupfs driver, cgroup v1 and v2) and their settings from
//! the pod's QoS class and resources (`crate::pod`). Pod cgroups live at `<cgroup-root>/kubepods[/burstable|/besteffort]/pod<uid>`
//! (the kubelet's QoS and pod container managers). Guaranteed pods sit directly under `kubepods`.
use crate::pod::qos::{QosClass, pod_qos};
use crate::pod::resources::{self, pod_resources};
use cgroups_rs::fs::{MaxValue, cpu::CpuController, memory::MemController, pid::PidController};
use k8s_openapi::api::core::v1::{Container, Pod};
use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub const CGROUP_MOUNT: &str = "/sys/fs/cgroup";
/// cgroup v1 controllers the pod cgroup is created in (runc creates the rest beneath the parent).
#[cfg(test)]
const V1_CONTROLLERS: &[&str] = &["cpu", "memory", "pids"];

const MIN_SHARES: u64 = 2;
const MAX_SHARES: u64 = 262_144;
const SHARES_PER_CPU: u64 = 1024;
const QUOTA_PERIOD_US: u64 = 100_000;
const MIN_QUOTA_US: u64 = 1000;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{op} {path}: {message}")]
    Cgroups {
        op: &'static str,
        path: PathBuf,
        message: String,
    },
    #[error("the cgroup work was interrupted: {0}")]
    Interrupted(String),
    #[error("cgroup name {0:?} would leave its parent directory")]
    UnsafeName(String),
    #[error("pod resources: {0}")]
    Resources(#[from] resources::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> Error + 'a {
    move |source| Error::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

/// The pod cgroup's resource settings (`ResourceConfigForPod`, CFS limits enforced).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ResourceConfig {
    pub cpu_shares: u64,
    pub cpu_quota: Option<u64>,
    pub cpu_period: Option<u64>,
    pub memory_limit: Option<u64>,
}

pub fn milli_cpu_to_shares(m: u64) -> u64 {
    if m == 0 {
        return MIN_SHARES;
    }
    (m.saturating_mul(SHARES_PER_CPU) / 1000).clamp(MIN_SHARES, MAX_SHARES)
}

pub fn milli_cpu_to_quota(m: u64, period: u64) -> u64 {
    if m == 0 {
        return 0;
    }
    (m.saturating_mul(period) / 1000).max(MIN_QUOTA_US)
}

/// The pod cgroup's settings from the pod's requests and limits (`crate::pod::resources`):
/// shares from the cpu requests; for Guaranteed pods the cpu quota and memory limit from the
/// limits; for Burstable ones the quota only when every container declares a cpu limit and the
/// memory limit only when every container declares one; BestEffort pods get the minimum shares.
pub fn resource_config_for_pod(pod: &Pod) -> Result<ResourceConfig> {
    let r = pod_resources(pod)?;
    let shares = milli_cpu_to_shares(r.requests.cpu_millis());
    let quota = milli_cpu_to_quota(r.limits.cpu_millis(), QUOTA_PERIOD_US);
    Ok(match pod_qos(pod)? {
        QosClass::Guaranteed => ResourceConfig {
            cpu_shares: shares,
            cpu_quota: Some(quota),
            cpu_period: Some(QUOTA_PERIOD_US),
            memory_limit: Some(r.limits.memory_bytes()),
        },
        QosClass::Burstable => ResourceConfig {
            cpu_shares: shares,
            cpu_quota: r.cpu_limits_declared.then_some(quota),
            cpu_period: r.cpu_limits_declared.then_some(QUOTA_PERIOD_US),
            memory_limit: r.memory_limits_declared.then_some(r.limits.memory_bytes()),
        },
        QosClass::BestEffort => ResourceConfig {
            cpu_shares: MIN_SHARES,
            ..Default::default()
        },
    })
}

/// The resources part that a resize compares: "shares quota period memory".
pub fn resources_label(r: &k8s_cri::v1::LinuxContainerResources) -> String {
    format!(
        "{} {} {} {}",
        r.cpu_shares, r.cpu_quota, r.cpu_period, r.memory_limit_in_bytes
    )
}

/// The container's own cgroup limits (CPU shares, CFS quota, memory limit).
pub fn container_resources(c: &Container) -> Result<k8s_cri::v1::LinuxContainerResources> {
    let r = crate::pod::resources::requests_and_limits(c)?;
    // As the API server would: a limit without a request implies request = limit.
    let cpu_request = if r.requests.cpu.is_some() {
        r.requests
    } else {
        r.limits
    };
    let shares = milli_cpu_to_shares(cpu_request.cpu_millis());
    let cpu_limit = r.limits.cpu.is_some();
    let as_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    Ok(k8s_cri::v1::LinuxContainerResources {
        cpu_shares: as_i64(shares),
        cpu_quota: if cpu_limit {
            as_i64(milli_cpu_to_quota(r.limits.cpu_millis(), QUOTA_PERIOD_US))
        } else {
            0
        },
        cpu_period: if cpu_limit { QUOTA_PERIOD_US as i64 } else { 0 },
        memory_limit_in_bytes: as_i64(r.limits.memory_bytes()),
        ..Default::default()
    })
}

/// Joins a relative cgroup name below `base`, refusing anything that could walk out of it.
pub fn safe_join(base: &Path, name: &str) -> Result<PathBuf> {
    let rel = Path::new(name.trim_start_matches('/'));
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(Error::UnsafeName(name.to_owned()));
    }
    Ok(base.join(rel))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hierarchy {
    /// One directory per controller under the mount (this machine: hybrid, containerd uses v1).
    V1,
    /// The unified hierarchy at the mount itself.
    V2,
}

/// Where the controllers swiftlet configures are mounted.
#[derive(Debug, Clone)]
struct Mounts {
    cpu: PathBuf,
    memory: PathBuf,
    pids: PathBuf,
}

impl Hierarchy {
    /// The hierarchy at `mount` and where its controllers are. For the real mount this asks
    /// cgroups-rs (statfs for cgroup2, /proc/self/mountinfo for the v1 controllers); a test
    /// fixture elsewhere is v2 when it has a `cgroup.controllers` file and has one directory per
    /// v1 controller otherwise.
    fn detect(mount: &Path) -> (Hierarchy, Mounts) {
        use cgroups_rs::fs::{Controllers, hierarchies};
        let same = |p: &Path| Mounts {
            cpu: p.to_owned(),
            memory: p.to_owned(),
            pids: p.to_owned(),
        };
        let v1_fixture = || Mounts {
            cpu: mount.join("cpu"),
            memory: mount.join("memory"),
            pids: mount.join("pids"),
        };
        if mount != Path::new(hierarchies::UNIFIED_MOUNTPOINT) {
            return if mount.join("cgroup.controllers").exists() {
                (Hierarchy::V2, same(mount))
            } else {
                (Hierarchy::V1, v1_fixture())
            };
        }
        if hierarchies::is_cgroup2_unified_mode() {
            return (Hierarchy::V2, same(mount));
        }
        let v1 = hierarchies::V1::new();
        let fallback = v1_fixture();
        let at = |c: Controllers, default: PathBuf| {
            v1.get_mount_point(c)
                .map(|(point, _)| point)
                .unwrap_or(default)
        };
        (
            Hierarchy::V1,
            Mounts {
                cpu: at(Controllers::Cpu, fallback.cpu),
                memory: at(Controllers::Mem, fallback.memory),
                pids: at(Controllers::Pids, fallback.pids),
            },
        )
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    /// `--cgroup-root`, e.g. `/` or `/swiftlet-test`.
    pub cgroup_root: String,
    pub cgroups_per_qos: bool,
    /// The cgroupfs mount (tests point this at a temp dir).
    pub mount: PathBuf,
    /// `--pod-max-pids`: `pids.max` of each pod cgroup when > 0.
    pub pod_pids_limit: i64,
}

/// How many orphaned pod cgroups one housekeeping pass removes at most.
pub const ORPHANS_PER_PASS: usize = 8;
/// Housekeeping passes a pod cgroup must be seen orphaned on before it is removed: a pod whose
/// worker is creating or removing it right now is seen at most once.
const ORPHAN_PASSES: u32 = 2;

#[derive(Debug, Default)]
struct State {
    /// cpu requests (millicores) of the Burstable pods that have a pod cgroup, by UID: the
    /// burstable QoS cgroup's shares are their sum.
    burstable: HashMap<String, u64>,
    /// Pod cgroups no known pod owns, by UID: on how many consecutive passes they were seen.
    orphans: HashMap<String, u32>,
    /// The config last applied to each pod cgroup, by name.
    applied: HashMap<String, ResourceConfig>,
}

#[derive(Debug, Default)]
struct Shared {
    /// Files written and directories created: re-applying an unchanged config adds nothing.
    writes: AtomicU64,
    state: Mutex<State>,
    /// Held while the QoS level cgroups are computed and written, so that concurrent pod workers
    /// cannot let an older sum overwrite a newer one.
    qos: Mutex<()>,
    /// An orphan clean-up is running (the next pass skips rather than queue up).
    cleaning: AtomicBool,
}

/// Creates, configures and removes pod cgroups, and keeps the QoS level cgroups in line. Cheap
/// to clone; clones share the write counter and the burstable bookkeeping.
#[derive(Debug, Clone)]
pub struct ContainerManager {
    cfg: Config,
    hierarchy: Hierarchy,
    mounts: Mounts,
    shared: Arc<Shared>,
}

impl ContainerManager {
    pub fn new(cfg: Config) -> Self {
        let (hierarchy, mounts) = Hierarchy::detect(&cfg.mount);
        Self {
            cfg,
            hierarchy,
            mounts,
            shared: Arc::default(),
        }
    }

    pub fn hierarchy(&self) -> Hierarchy {
        self.hierarchy
    }

    /// Cgroup files written and directories created so far.
    pub fn writes(&self) -> u64 {
        self.shared.writes.load(Ordering::Relaxed)
    }

    fn wrote(&self) {
        self.shared.writes.fetch_add(1, Ordering::Relaxed);
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn root(&self) -> &str {
        self.cfg.cgroup_root.trim_end_matches('/')
    }

    /// The cgroup name of a QoS class's parent directory (relative to each controller root).
    pub fn qos_cgroup_name(&self, qos: QosClass) -> String {
        let root = self.root();
        if !self.cfg.cgroups_per_qos {
            return root.to_owned();
        }
        match qos {
            QosClass::Guaranteed => format!("{root}/kubepods"),
            QosClass::Burstable => format!("{root}/kubepods/burstable"),
            QosClass::BestEffort => format!("{root}/kubepods/besteffort"),
        }
    }

    /// The cgroup name (relative to each controller root) of a pod: what CRI gets as cgroup_parent.
    pub fn pod_cgroup_name(&self, uid: &str, qos: QosClass) -> Result<String> {
        if uid.is_empty() || uid.contains(['/', '.']) {
            return Err(Error::UnsafeName(uid.to_owned()));
        }
        Ok(format!("{}/pod{uid}", self.qos_cgroup_name(qos)))
    }

    /// Directories of one cgroup name in the hierarchies swiftlet creates it in.
    fn dirs(&self, name: &str) -> Result<Vec<PathBuf>> {
        let m = &self.mounts;
        match self.hierarchy {
            Hierarchy::V2 => Ok(vec![safe_join(&m.cpu, name)?]),
            // cpuacct is left to runc, which creates the path when it places a container: nothing
            // is configured there and each mkdir on cgroupfs costs.
            Hierarchy::V1 => [&m.cpu, &m.memory, &m.pids]
                .into_iter()
                .map(|c| safe_join(c, name))
                .collect(),
        }
    }

    /// Directories of one cgroup name in every hierarchy mounted under the cgroup mount, including
    /// those the runtime created on its own (blkio, devices, freezer, cpuset, name=systemd, ...):
    /// what clean-up must cover so nothing is left behind.
    fn all_hierarchy_dirs(&self, name: &str) -> Result<Vec<PathBuf>> {
        if self.hierarchy == Hierarchy::V2 {
            return self.dirs(name);
        }
        let mut out = Vec::new();
        if let Ok(entries) = fs::read_dir(&self.cfg.mount) {
            for e in entries.flatten() {
                // Symlinks such as `cpu,cpuacct` alias a hierarchy already listed.
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    out.push(safe_join(&e.path(), name)?);
                }
            }
        }
        Ok(out)
    }

    /// Creates the QoS level cgroups (`kubepods`, `burstable`, `besteffort`) at start.
    pub fn start(&self) -> Result<()> {
        if !self.cfg.cgroups_per_qos {
            return Ok(());
        }
        for qos in [
            QosClass::Guaranteed,
            QosClass::Burstable,
            QosClass::BestEffort,
        ] {
            self.create(&self.qos_cgroup_name(qos))?;
        }
        self.update_qos_cgroups()
    }

    /// The kubelet's `UpdateCgroups` for cpu: besteffort gets 2 shares, burstable the shares of
    /// the summed cpu requests of the Burstable pods (2 when there are none).
    fn update_qos_cgroups(&self) -> Result<()> {
        if !self.cfg.cgroups_per_qos {
            return Ok(());
        }
        // Every change to the bookkeeping is followed by a call here: whoever writes last has
        // read the sum after every change that came before its write.
        let _writing = self
            .shared
            .qos
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let burstable: u64 = self.state().burstable.values().sum();
        self.set_shares(
            &self.qos_cgroup_name(QosClass::Burstable),
            milli_cpu_to_shares(burstable),
        )?;
        self.set_shares(&self.qos_cgroup_name(QosClass::BestEffort), MIN_SHARES)
    }

    /// Records (or forgets) a pod's share of the burstable QoS cgroup; true when it changed.
    fn account(&self, uid: &str, burstable_cpu: Option<u64>) -> bool {
        let mut st = self.state();
        match burstable_cpu {
            Some(m) => st.burstable.insert(uid.to_owned(), m) != Some(m),
            None => st.burstable.remove(uid).is_some(),
        }
    }

    /// Creates a cgroup in every hierarchy swiftlet configures, when missing. True when every
    /// directory is new (its files hold the kernel's defaults).
    fn create(&self, name: &str) -> Result<bool> {
        let mut fresh = true;
        for dir in self.dirs(name)? {
            match fs::create_dir(&dir) {
                Ok(()) => self.wrote(),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => fresh = false,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    fs::create_dir_all(&dir).map_err(io_err("creating cgroup", &dir))?;
                    self.wrote();
                }
                Err(e) => return Err(io_err("creating cgroup", &dir)(e)),
            }
        }
        Ok(fresh)
    }

    /// Creates the pod cgroup if missing and applies its resource settings (only the values that
    /// differ are written). The burstable QoS cgroup's shares are brought in line first, as the
    /// kubelet does before creating a pod cgroup. Returns the pod cgroup's name.
    pub fn ensure_pod_cgroup(&self, pod: &Pod, uid: &str) -> Result<String> {
        let qos = pod_qos(pod)?;
        let name = self.pod_cgroup_name(uid, qos)?;
        let share = match qos {
            QosClass::Burstable => Some(pod_resources(pod)?.requests.cpu_millis()),
            _ => None,
        };
        if self.account(uid, share) {
            self.update_qos_cgroups()?;
        }
        let rc = resource_config_for_pod(pod)?;
        // Applied before and still there: nothing to read or write (the kubelet does not even
        // look again). After a restart the files are read and compared instead.
        if self.state().applied.get(&name) == Some(&rc)
            && safe_join(&self.mounts.cpu, &name)?.is_dir()
        {
            return Ok(name);
        }
        let fresh = self.create(&name)?;
        self.apply_to(&name, &rc, fresh)?;
        self.state().applied.insert(name.clone(), rc);
        Ok(name)
    }

    /// [`Self::destroy_pod_cgroups`] on one of tokio's blocking threads: it may wait for
    /// leftovers to die, and must not hold up the async threads meanwhile.
    pub async fn destroy_pod_cgroups_async(&self, uid: &str) -> Result<()> {
        let (cm, uid) = (self.clone(), uid.to_owned());
        tokio::task::spawn_blocking(move || cm.destroy_pod_cgroups(&uid))
            .await
            .unwrap_or_else(|e| Err(Error::Interrupted(e.to_string())))
    }

    /// Writes the cpu shares of a cgroup (as cgroup v2 weight there) when they differ.
    fn set_shares(&self, name: &str, shares: u64) -> Result<()> {
        self.set_shares_to(name, shares, false)
    }

    /// [`Self::set_shares`]; `fresh`: the cgroup was just created, its files hold the defaults.
    fn set_shares_to(&self, name: &str, shares: u64, fresh: bool) -> Result<()> {
        let v2 = self.hierarchy == Hierarchy::V2;
        let dir = safe_join(&self.mounts.cpu, name)?;
        let cpu = CpuController::new(dir.clone(), PathBuf::new(), v2);
        // cgroups-rs writes the number it is given into cpu.weight on v2 without converting it
        // ("conversion is the caller's responsibility"): convert as runc does.
        let want = if v2 { shares_to_weight(shares) } else { shares };
        let current = if fresh {
            Some(if v2 { 100 } else { 1024 })
        } else {
            cpu.shares().ok()
        };
        if current != Some(want) {
            cpu.set_shares(want)
                .map_err(cg_err("writing cpu shares of", &dir))?;
            self.wrote();
        }
        Ok(())
    }

    /// Applies a resource config to an existing pod cgroup (a resize), writing only what differs
    /// from the files. Unset quota and memory limit mean unlimited (a resize may lift a limit).
    pub fn apply(&self, name: &str, rc: &ResourceConfig) -> Result<()> {
        self.state().applied.remove(name);
        self.apply_to(name, rc, false)?;
        self.state().applied.insert(name.to_owned(), rc.clone());
        Ok(())
    }

    /// Writes what differs. `fresh`: the cgroup was just created, so its files hold the kernel's
    /// defaults (1024 shares / weight 100, period 100 ms, no quota, no memory or pids limit) and
    /// need not be read.
    fn apply_to(&self, name: &str, rc: &ResourceConfig, fresh: bool) -> Result<()> {
        let v2 = self.hierarchy == Hierarchy::V2;
        let read = |default, f: &dyn Fn() -> Option<i64>| if fresh { Some(default) } else { f() };
        self.set_shares_to(name, rc.cpu_shares, fresh)?;
        let dir = safe_join(&self.mounts.cpu, name)?;
        let cpu = CpuController::new(dir.clone(), PathBuf::new(), v2);
        let period = rc.cpu_period.unwrap_or(QUOTA_PERIOD_US);
        let current = read(QUOTA_PERIOD_US as i64, &|| {
            cpu.cfs_period().ok().map(|p| p as i64)
        });
        if current != Some(period as i64) {
            cpu.set_cfs_period(period)
                .map_err(cg_err("writing cpu period of", &dir))?;
            self.wrote();
        }
        let quota = rc.cpu_quota.map_or(-1, saturating_i64);
        if read(-1, &|| cpu.cfs_quota().ok()) != Some(quota) {
            cpu.set_cfs_quota(quota)
                .map_err(cg_err("writing cpu quota of", &dir))?;
            self.wrote();
        }
        let dir = safe_join(&self.mounts.memory, name)?;
        let limit = rc.memory_limit.map_or(-1, saturating_i64);
        if read(-1, &|| self.memory_limit_at(&dir)) != Some(limit) {
            MemController::new(dir.clone(), PathBuf::new(), v2)
                .set_limit(limit)
                .map_err(cg_err("writing memory limit of", &dir))?;
            self.wrote();
        }
        let dir = safe_join(&self.mounts.pids, name)?;
        let pids = PidController::new(dir.clone(), PathBuf::new(), v2);
        let want = if self.cfg.pod_pids_limit > 0 {
            MaxValue::Value(self.cfg.pod_pids_limit)
        } else {
            MaxValue::Max
        };
        let current = if fresh {
            Some(MaxValue::Max)
        } else {
            pids.get_pid_max().ok()
        };
        if current != Some(want) {
            pids.set_pid_max(want)
                .map_err(cg_err("writing pids.max of", &dir))?;
            self.wrote();
        }
        Ok(())
    }

    /// For a resize: `new` with each cpu quota and memory limit raised to the pod cgroup's current
    /// one where that is larger (unlimited counts as largest). Applied before the containers are
    /// updated, so that no child ever exceeds its parent; `new` itself is applied after.
    pub fn grown_config(&self, name: &str, new: &ResourceConfig) -> Result<ResourceConfig> {
        let v2 = self.hierarchy == Hierarchy::V2;
        let dir = safe_join(&self.mounts.cpu, name)?;
        let cpu = CpuController::new(dir.clone(), PathBuf::new(), v2);
        let quota = cpu
            .cfs_quota()
            .map_err(cg_err("reading cpu quota of", &dir))?;
        let mem_dir = safe_join(&self.mounts.memory, name)?;
        let memory = self.memory_limit_at(&mem_dir).unwrap_or(-1);
        // None: unlimited.
        let larger = |cur: i64, new: Option<u64>| match new {
            Some(n) if cur >= 0 => Some(n.max(cur as u64)),
            _ => None,
        };
        let cpu_quota = larger(quota, new.cpu_quota);
        Ok(ResourceConfig {
            cpu_shares: new.cpu_shares,
            cpu_quota,
            cpu_period: cpu_quota.and(new.cpu_period),
            memory_limit: larger(memory, new.memory_limit),
        })
    }

    /// The memory limit in a memory cgroup directory, -1 when unlimited. cgroups-rs reads it only
    /// as part of `memory_stat()`, a dozen files; this reads the one file.
    fn memory_limit_at(&self, dir: &Path) -> Option<i64> {
        let file = match self.hierarchy {
            Hierarchy::V1 => "memory.limit_in_bytes",
            Hierarchy::V2 => "memory.max",
        };
        let text = fs::read_to_string(dir.join(file)).ok()?;
        let text = text.trim();
        if text == "max" {
            return Some(-1);
        }
        // v1 shows "unlimited" as the largest page-aligned counter value.
        let v: u64 = text.parse().ok()?;
        Some(if v >= 1 << 62 { -1 } else { v as i64 })
    }

    /// Bytes of memory the pod cgroup uses now (`memory.usage_in_bytes` / `memory.current`).
    pub fn memory_usage(&self, name: &str) -> Result<u64> {
        let dir = safe_join(&self.mounts.memory, name)?;
        let mem = MemController::new(dir.clone(), PathBuf::new(), self.hierarchy == Hierarchy::V2);
        Ok(mem.memory_stat().usage_in_bytes)
    }

    /// Kills whatever still runs in the pod cgroup and removes it, deepest directories first.
    /// A missing cgroup is not an error.
    pub fn destroy_pod_cgroup(&self, name: &str) -> Result<()> {
        self.state().applied.remove(name);
        for dir in self.all_hierarchy_dirs(name)? {
            if !dir.exists() {
                continue;
            }
            remove_tree(&dir)?;
        }
        Ok(())
    }

    /// Removes a pod's cgroup under every QoS class (the spec, and so the class, may be unknown
    /// or may have changed) and drops its share of the burstable QoS cgroup.
    pub fn destroy_pod_cgroups(&self, uid: &str) -> Result<()> {
        self.destroy_pod_cgroups_except(uid, None)
    }

    /// Like [`Self::destroy_pod_cgroups`] but keeps the pod cgroup of class `keep` and the pod's
    /// share (after a QoS class change the pod lives on in its new class).
    pub fn destroy_pod_cgroups_except(&self, uid: &str, keep: Option<QosClass>) -> Result<()> {
        for qos in [
            QosClass::Guaranteed,
            QosClass::Burstable,
            QosClass::BestEffort,
        ] {
            if Some(qos) != keep {
                self.destroy_pod_cgroup(&self.pod_cgroup_name(uid, qos)?)?;
            }
        }
        if keep.is_none() && self.account(uid, None) {
            self.update_qos_cgroups()?;
        }
        Ok(())
    }

    /// The UIDs of the `pod<uid>` cgroups under this agent's cgroup root, in any hierarchy (the
    /// runtime's own ones included), with their QoS class.
    pub fn list_pod_cgroups(&self) -> Vec<(String, QosClass)> {
        let mut out: Vec<(String, QosClass)> = Vec::new();
        let classes = if self.cfg.cgroups_per_qos {
            &[
                QosClass::Guaranteed,
                QosClass::Burstable,
                QosClass::BestEffort,
            ][..]
        } else {
            &[QosClass::Guaranteed][..]
        };
        for &qos in classes {
            let Ok(dirs) = self.all_hierarchy_dirs(&self.qos_cgroup_name(qos)) else {
                continue;
            };
            for dir in dirs {
                let Ok(entries) = fs::read_dir(&dir) else {
                    continue;
                };
                for e in entries.flatten() {
                    let name = e.file_name();
                    let Some(uid) = name.to_str().and_then(|n| n.strip_prefix("pod")) else {
                        continue;
                    };
                    if !uid.is_empty()
                        && e.file_type().is_ok_and(|t| t.is_dir())
                        && !out.iter().any(|(u, q)| u == uid && *q == qos)
                    {
                        out.push((uid.to_owned(), qos));
                    }
                }
            }
        }
        out
    }

    /// Housekeeping: the pod cgroups under this agent's root that belong to no pod `known` names,
    /// seen so on two consecutive passes; at most [`ORPHANS_PER_PASS`]. `None` while the previous
    /// clean-up still runs. Also drops burstable shares of pods no longer known.
    pub fn orphaned_pod_cgroups(&self, known: &dyn Fn(&str) -> bool) -> Option<Vec<String>> {
        if self.shared.cleaning.swap(true, Ordering::AcqRel) {
            return None;
        }
        let found = self.list_pod_cgroups();
        let mut due = Vec::new();
        let changed = {
            let mut st = self.state();
            let before = st.burstable.len();
            st.burstable.retain(|uid, _| known(uid));
            let mut seen = std::mem::take(&mut st.orphans);
            for (uid, _) in &found {
                if known(uid) || st.orphans.contains_key(uid) {
                    continue;
                }
                let n = seen.remove(uid).unwrap_or(0) + 1;
                if n >= ORPHAN_PASSES && due.len() < ORPHANS_PER_PASS {
                    due.push(uid.clone());
                }
                st.orphans.insert(uid.clone(), n);
            }
            before != st.burstable.len()
        };
        if changed && let Err(e) = self.update_qos_cgroups() {
            tracing::warn!(%e, "updating the QoS cgroups");
        }
        if due.is_empty() {
            self.shared.cleaning.store(false, Ordering::Release);
        }
        Some(due)
    }

    /// Removes the orphaned pod cgroups a non-empty [`Self::orphaned_pod_cgroups`] returned
    /// (until then no other pass starts), killing what still runs in them. Blocking: run it off
    /// the async threads. A failure is logged and retried on a later pass.
    pub fn remove_orphans(&self, uids: &[String]) {
        for uid in uids {
            match self.destroy_pod_cgroups(uid) {
                Ok(()) => {
                    tracing::info!(%uid, "removed orphaned pod cgroup");
                    self.state().orphans.remove(uid);
                }
                Err(e) => tracing::warn!(%uid, %e, "removing orphaned pod cgroup; will retry"),
            }
        }
        self.shared.cleaning.store(false, Ordering::Release);
    }
}

fn cg_err<'a>(
    op: &'static str,
    path: &'a Path,
) -> impl FnOnce(cgroups_rs::fs::error::Error) -> Error + 'a {
    move |e| Error::Cgroups {
        op,
        path: path.to_owned(),
        // cgroups-rs's message names the file and its cause.
        message: e.to_string(),
    }
}

/// A limit for a cgroup file that takes an i64, where -1 means unlimited: never wraps negative.
fn saturating_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// cgroup v2 weight from v1 shares, the linear mapping runc uses:
/// `1 + (shares - 2) * 9999 / 262142`.
pub fn shares_to_weight(shares: u64) -> u64 {
    let s = shares.clamp(MIN_SHARES, MAX_SHARES);
    1 + (s - 2) * 9999 / 262_142
}

fn remove_tree(dir: &Path) -> Result<()> {
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                remove_tree(&e.path())?;
            }
        }
    }
    // Up to five passes of SIGKILL over the remaining processes, as the kubelet does.
    for _ in 0..5 {
        let procs = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        let pids: Vec<i32> = procs
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        if pids.is_empty() {
            break;
        }
        for pid in pids {
            // SAFETY: kill(2) has no memory-safety preconditions.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    match fs::remove_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err("removing cgroup", dir)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::resources::tests::{
        Res, app_pod as pod, container, list, pod_of, sidecar, sidecar_pod,
    };

    const MI: u64 = 1 << 20;

    #[test]
    fn sidecar_init_and_app_pod_gets_the_kubelets_numbers() {
        // Requests 500m/300Mi, limits 1000m/428Mi (worked in `crate::pod::resources`); requests
        // differ from limits: Burstable, every container declares both limits.
        assert_eq!(
            resource_config_for_pod(&sidecar_pod()).unwrap(),
            ResourceConfig {
                cpu_shares: 512,
                cpu_quota: Some(100_000),
                cpu_period: Some(100_000),
                memory_limit: Some(428 * MI),
            }
        );
        // The integration test's pod: sidecar 50m/64Mi requests, 100m/128Mi limits; app
        // 100m/128Mi, 200m/256Mi. Shares of 150m = 150 * 1024 / 1000 = 153; quota of 300m =
        // 30000 us; memory 128Mi + 256Mi = 384Mi (not max(256Mi, 128Mi)).
        let pod = pod_of(
            vec![sidecar(
                "proxy",
                &[("cpu", "50m"), ("memory", "64Mi")],
                &[("cpu", "100m"), ("memory", "128Mi")],
            )],
            vec![container(
                "app",
                &[("cpu", "100m"), ("memory", "128Mi")],
                &[("cpu", "200m"), ("memory", "256Mi")],
            )],
        );
        assert_eq!(
            resource_config_for_pod(&pod).unwrap(),
            ResourceConfig {
                cpu_shares: 153,
                cpu_quota: Some(30_000),
                cpu_period: Some(100_000),
                memory_limit: Some(384 * MI),
            }
        );
    }

    #[test]
    fn overhead_is_in_the_pod_cgroup() {
        // Guaranteed 250m/64Mi plus overhead 100m/32Mi: shares of 350m = 358, quota 35000 us,
        // memory 96Mi.
        let g: Res<'_> = &[("cpu", "250m"), ("memory", "64Mi")];
        let mut p = pod(&[(g, g)]);
        if let Some(spec) = p.spec.as_mut() {
            spec.overhead = list(&[("cpu", "100m"), ("memory", "32Mi")]);
        }
        assert_eq!(
            resource_config_for_pod(&p).unwrap(),
            ResourceConfig {
                cpu_shares: 358,
                cpu_quota: Some(35_000),
                cpu_period: Some(100_000),
                memory_limit: Some(96 * MI),
            }
        );
    }

    #[test]
    fn limits_only_pod() {
        // As written (no defaulting): Burstable, no cpu request (2 shares), quota and memory
        // limit from the limits, which every container declares.
        let l: Res<'_> = &[("cpu", "500m"), ("memory", "64Mi")];
        let raw = pod(&[(&[], l)]);
        assert_eq!(pod_qos(&raw).unwrap(), QosClass::Burstable);
        assert_eq!(
            resource_config_for_pod(&raw).unwrap(),
            ResourceConfig {
                cpu_shares: 2,
                cpu_quota: Some(50_000),
                cpu_period: Some(100_000),
                memory_limit: Some(64 * MI),
            }
        );
        // Parsed as a static pod, the requests default to the limits: Guaranteed, 512 shares,
        // directly under kubepods.
        let manifest = "apiVersion: v1\nkind: Pod\nmetadata: {name: lim}\nspec:\n  containers:\n  \
                        - name: c\n    image: x\n    resources: {limits: {cpu: 500m, memory: 64Mi}}\n";
        let parsed =
            crate::config::manifest::parse(Path::new("/p.yaml"), manifest.as_bytes(), "n").unwrap();
        assert_eq!(pod_qos(&parsed).unwrap(), QosClass::Guaranteed);
        assert_eq!(
            resource_config_for_pod(&parsed).unwrap(),
            ResourceConfig {
                cpu_shares: 512,
                cpu_quota: Some(50_000),
                cpu_period: Some(100_000),
                memory_limit: Some(64 * MI),
            }
        );
        let (_tmp, cm) = v1_fixture("/lim");
        assert_eq!(
            cm.ensure_pod_cgroup(&parsed, "u1").unwrap(),
            "/lim/kubepods/podu1"
        );
    }

    #[test]
    fn huge_amounts_saturate_instead_of_wrapping() {
        assert_eq!(milli_cpu_to_shares(u64::MAX), MAX_SHARES);
        assert_eq!(
            milli_cpu_to_quota(u64::MAX, QUOTA_PERIOD_US),
            u64::MAX / 1000
        );
        assert_eq!(saturating_i64(u64::MAX), i64::MAX);
        // Two memory limits of 7Ei add up beyond i64: the pod limit stays a (huge) limit.
        let big: Res<'_> = &[("memory", "7Ei")];
        let rc = resource_config_for_pod(&pod(&[(&[], big), (&[], big)])).unwrap();
        assert_eq!(rc.memory_limit, Some(14 << 60));
        assert_eq!(saturating_i64(14 << 60), i64::MAX);
    }

    #[test]
    fn resource_math() {
        assert_eq!(milli_cpu_to_shares(0), 2);
        assert_eq!(milli_cpu_to_shares(1), 2);
        assert_eq!(milli_cpu_to_shares(1000), 1024);
        assert_eq!(milli_cpu_to_shares(10_000_000), MAX_SHARES);
        assert_eq!(milli_cpu_to_quota(5, QUOTA_PERIOD_US), MIN_QUOTA_US);
        assert_eq!(milli_cpu_to_quota(500, QUOTA_PERIOD_US), 50_000);
        let g: &[(&str, &str)] = &[("cpu", "500m"), ("memory", "64Mi")];
        let rc = resource_config_for_pod(&pod(&[(g, g)])).unwrap();
        assert_eq!(
            rc,
            ResourceConfig {
                cpu_shares: 512,
                cpu_quota: Some(50_000),
                cpu_period: Some(100_000),
                memory_limit: Some(64 << 20)
            }
        );
        let rc = resource_config_for_pod(&pod(&[
            (&[("cpu", "100m")], &[("memory", "1Gi")]),
            (&[], &[]),
        ]))
        .unwrap();
        assert_eq!(
            rc,
            ResourceConfig {
                cpu_shares: 102,
                ..Default::default()
            }
        );
        assert_eq!(shares_to_weight(2), 1);
        assert_eq!(shares_to_weight(262_144), 10_000);
        assert_eq!(shares_to_weight(1024), 39);
    }

    /// A started container manager over a directory laid out like a cgroup v1 mount.
    fn v1_fixture(cgroup_root: &str) -> (tempfile::TempDir, ContainerManager) {
        let tmp = tempfile::tempdir().unwrap();
        for c in V1_CONTROLLERS {
            fs::create_dir_all(tmp.path().join(c)).unwrap();
        }
        let cm = ContainerManager::new(Config {
            cgroup_root: cgroup_root.into(),
            cgroups_per_qos: true,
            mount: tmp.path().into(),
            pod_pids_limit: 100,
        });
        assert_eq!(cm.hierarchy(), Hierarchy::V1);
        cm.start().unwrap();
        (tmp, cm)
    }

    #[test]
    fn cgroup_names_and_files_v1_fixture() {
        let (tmp, cm) = v1_fixture("/test");
        assert_eq!(
            fs::read_to_string(tmp.path().join("cpu/test/kubepods/besteffort/cpu.shares")).unwrap(),
            "2"
        );
        let g: &[(&str, &str)] = &[("cpu", "500m"), ("memory", "64Mi")];
        let name = cm.ensure_pod_cgroup(&pod(&[(g, g)]), "u1").unwrap();
        assert_eq!(name, "/test/kubepods/podu1");
        assert_eq!(
            fs::read_to_string(tmp.path().join("cpu/test/kubepods/podu1/cpu.cfs_quota_us"))
                .unwrap(),
            "50000"
        );
        assert_eq!(
            fs::read_to_string(
                tmp.path()
                    .join("memory/test/kubepods/podu1/memory.limit_in_bytes")
            )
            .unwrap(),
            (64u64 << 20).to_string()
        );
        assert_eq!(
            fs::read_to_string(tmp.path().join("pids/test/kubepods/podu1/pids.max")).unwrap(),
            "100"
        );
        // Re-applying the same config writes nothing.
        let before = cm.writes();
        cm.ensure_pod_cgroup(&pod(&[(g, g)]), "u1").unwrap();
        assert_eq!(cm.writes(), before);
        // Burstable pods' cpu requests add up in the burstable QoS cgroup's shares.
        let b: &[(&str, &str)] = &[("cpu", "250m")];
        cm.ensure_pod_cgroup(&pod(&[(b, &[])]), "u2").unwrap();
        cm.ensure_pod_cgroup(&pod(&[(b, &[]), (b, &[])]), "u3")
            .unwrap();
        let qos_shares = || {
            fs::read_to_string(tmp.path().join("cpu/test/kubepods/burstable/cpu.shares")).unwrap()
        };
        assert_eq!(qos_shares(), milli_cpu_to_shares(750).to_string());
        let mut found = cm.list_pod_cgroups();
        found.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            found,
            vec![
                ("u1".to_owned(), QosClass::Guaranteed),
                ("u2".to_owned(), QosClass::Burstable),
                ("u3".to_owned(), QosClass::Burstable),
            ]
        );
        // Orphans: due only on the second pass that sees them unknown; known pods never.
        let known = |uid: &str| uid == "u1";
        assert_eq!(cm.orphaned_pod_cgroups(&known), Some(vec![]));
        let mut due = cm.orphaned_pod_cgroups(&known).unwrap();
        due.sort();
        assert_eq!(due, vec!["u2".to_owned(), "u3".to_owned()]);
        // Their shares left the burstable QoS cgroup; no new pass starts before the removal ran.
        assert_eq!(qos_shares(), "2");
        assert_eq!(cm.orphaned_pod_cgroups(&known), None);
        // Unsafe names never leave the directory.
        assert!(cm.pod_cgroup_name("../x", QosClass::BestEffort).is_err());
        assert!(safe_join(tmp.path(), "a/../../b").is_err());
        // Files written by a test fixture are plain files, so remove_dir fails on a non-empty dir:
        // destroy is exercised against the real cgroupfs in the integration tests.
    }

    #[test]
    fn concurrent_pod_workers_leave_the_burstable_qos_shares_at_the_full_sum() {
        let (tmp, cm) = v1_fixture("/race");
        let shares = tmp.path().join("cpu/race/kubepods/burstable/cpu.shares");
        for round in 0..20 {
            let pods = 8;
            std::thread::scope(|s| {
                for i in 0..pods {
                    let cm = cm.clone();
                    s.spawn(move || {
                        let b: &[(&str, &str)] = &[("cpu", "100m")];
                        cm.ensure_pod_cgroup(&pod(&[(b, &[])]), &format!("r{round}p{i}"))
                            .unwrap();
                    });
                }
            });
            let want = milli_cpu_to_shares(100 * pods * (round + 1));
            assert_eq!(
                fs::read_to_string(&shares).unwrap(),
                want.to_string(),
                "round {round}"
            );
        }
    }

    #[test]
    fn v2_fixture_uses_v2_file_names() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join("cgroup.controllers"), "cpu memory pids").unwrap();
        let cm = ContainerManager::new(Config {
            cgroup_root: "/".into(),
            cgroups_per_qos: true,
            mount: tmp.path().into(),
            pod_pids_limit: 100,
        });
        assert_eq!(cm.hierarchy(), Hierarchy::V2);
        cm.start().unwrap();
        // What the kernel puts in a new cgroup2 directory.
        let dir = tmp.path().join("kubepods/burstable/podu2");
        fs::create_dir_all(&dir).unwrap();
        for (f, v) in [
            ("cpu.max", "max 100000"),
            ("cpu.weight", "100"),
            ("memory.max", "max"),
            ("pids.max", "max"),
        ] {
            fs::write(dir.join(f), v).unwrap();
        }
        let b: &[(&str, &str)] = &[("cpu", "1")];
        let name = cm
            .ensure_pod_cgroup(&pod(&[(b, &[("cpu", "2"), ("memory", "1Gi")])]), "u2")
            .unwrap();
        assert_eq!(name, "/kubepods/burstable/podu2");
        let dir = tmp.path().join("kubepods/burstable/podu2");
        assert_eq!(fs::read_to_string(dir.join("cpu.weight")).unwrap(), "39");
        assert_eq!(
            fs::read_to_string(dir.join("cpu.max")).unwrap(),
            "200000 100000"
        );
        assert_eq!(
            fs::read_to_string(dir.join("memory.max")).unwrap(),
            (1u64 << 30).to_string()
        );
        assert_eq!(fs::read_to_string(dir.join("pids.max")).unwrap(), "100");
        // The burstable QoS cgroup's weight is converted from shares too.
        assert_eq!(
            fs::read_to_string(tmp.path().join("kubepods/burstable/cpu.weight")).unwrap(),
            shares_to_weight(1024).to_string()
        );
        let before = cm.writes();
        let p = pod(&[(b, &[("cpu", "2"), ("memory", "1Gi")])]);
        cm.ensure_pod_cgroup(&p, "u2").unwrap();
        assert_eq!(cm.writes(), before);
        // After a restart (nothing remembered) the files are read and still nothing is written.
        let cm = ContainerManager::new(cm.cfg.clone());
        cm.ensure_pod_cgroup(&p, "u2").unwrap();
        assert_eq!(cm.writes(), 0);
    }
}
