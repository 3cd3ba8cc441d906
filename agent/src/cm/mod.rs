//! Container manager: pod cgroups and their settings from the pod's QoS class and resources
//! (`crate::pod`). Pod cgroups live at `<cgroup-root>/kubepods[/burstable|/besteffort]/pod<uid>`
//! (the kubelet's QoS and pod container managers). Guaranteed pods sit directly under `kubepods`.
//!
//! - this file: [`ContainerManager`]: the QoS level cgroups, creating, configuring and removing
//!   pod cgroups (only values that differ are written);
//! - [`resources`]: the numbers (shares, quota, memory limit) from requests and limits;
//! - [`driver`]: where the files are and how values are spelled, per hierarchy (v1, v2);
//! - `systemd`: the systemd driver, slices created and configured over systemd's D-Bus API
//!   with the files underneath written as on cgroupfs;
//! - `housekeeping`: orphaned pod cgroups found and removed;
//! - `machine`: the machine's addresses, CPUs and root filesystem size.
mod driver;
mod housekeeping;
mod machine;
mod resources;
mod systemd;
#[cfg(test)]
mod tests;
mod usage;

pub use driver::{Controller, Driver, Hierarchy, Settings, shares_to_weight};
pub use machine::{
    FsSpace, detected_ips, filesystem_bytes, filesystem_space, filesystem_stats, hostname,
    machine_cpus, node_ips,
};
use resources::{MIN_SHARES, QUOTA_PERIOD_US};
pub use resources::{
    ResourceConfig, container_resources, machine_memory_bytes, milli_cpu_to_quota,
    milli_cpu_to_shares, resource_config_for_pod, resources_label,
};
pub use usage::{CgroupDirs, CgroupUsage, CpuThrottling, KeptFile, MemoryUsage, read_from_start};

use crate::metrics::kubelet::{CgroupManagerDurations, OperationType};

/// What the node offers a container without a limit (the kubelet's node allocatable; here the
/// machine's capacity, nothing being reserved), for the downward API: `memory_capacity` bytes,
/// the CPUs online and the size of the file system holding `pods_dir`'s parent (the root dir).
pub fn node_allocatable(
    memory_capacity: u64,
    pods_dir: &std::path::Path,
) -> crate::pod::downward::Allocatable {
    crate::pod::downward::Allocatable {
        cpu_millis: machine_cpus().saturating_mul(1000),
        memory_bytes: memory_capacity,
        ephemeral_storage_bytes: filesystem_bytes(pods_dir.parent().unwrap_or(pods_dir)),
    }
}

use crate::pod::qos::{QosClass, pod_qos};
use crate::pod::resources::pod_resources;
use cgroups_rs::fs::{MaxValue, cpu::CpuController, memory::MemController, pid::PidController};
use k8s_openapi::api::core::v1::Pod;
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
    #[error("{op} {unit}: {message}")]
    Systemd {
        op: &'static str,
        unit: String,
        message: String,
    },
    #[error("pod resources: {0}")]
    Resources(#[from] crate::pod::resources::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> Error + 'a {
    move |source| Error::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

/// Joins a relative cgroup name below `base`, refusing anything that could walk out of it.
pub fn safe_join(base: &Path, name: &str) -> Result<PathBuf> {
    let rel = Path::new(name.trim_start_matches('/'));
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(Error::UnsafeName(name.to_owned()));
    }
    Ok(base.join(rel))
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
    driver: Arc<dyn Driver>,
    shared: Arc<Shared>,
    /// `kubelet_cgroup_manager_duration_seconds`, once given ([`Self::with_durations`]).
    durations: Option<CgroupManagerDurations>,
}

impl ContainerManager {
    /// The cgroupfs driver: swiftlet creates and writes the cgroups itself.
    pub fn new(cfg: Config) -> Self {
        let driver = driver::detect(&cfg.mount);
        Self {
            cfg,
            driver,
            shared: Arc::default(),
            durations: None,
        }
    }

    /// Observes how long each create, update and destroy of a cgroup takes into `durations`
    /// (by the kubelet's `operation_type`).
    pub fn with_durations(mut self, durations: CgroupManagerDurations) -> Self {
        self.durations = Some(durations);
        self
    }

    /// Observes an operation of `operation_type` begun at `since`.
    fn observe(&self, operation_type: &'static str, since: std::time::Instant) {
        if let Some(d) = &self.durations {
            d.get_or_create(&OperationType { operation_type })
                .observe(since.elapsed().as_secs_f64());
        }
    }

    /// The systemd driver: each cgroup a slice created and configured through systemd. Fails
    /// where systemd cannot be reached on the system bus.
    pub fn with_systemd(cfg: Config) -> Result<Self> {
        let driver = Arc::new(systemd::Systemd::connect(driver::detect(&cfg.mount))?);
        Ok(Self {
            cfg,
            driver,
            shared: Arc::default(),
            durations: None,
        })
    }

    /// What the runtime gets as the cgroup parent of the pod whose cgroup is `name` (the
    /// name itself on cgroupfs, the slice unit with systemd).
    pub fn runtime_cgroup_parent(&self, name: &str) -> Result<String> {
        self.driver.runtime_parent(name)
    }

    /// The child cgroup the runtime makes for container `id` below its pod's.
    pub fn container_cgroup<'a>(&self, id: &'a str) -> std::borrow::Cow<'a, str> {
        self.driver.container_child(id)
    }

    pub fn hierarchy(&self) -> Hierarchy {
        self.driver.hierarchy()
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
        let name = format!("{}/pod{uid}", self.qos_cgroup_name(qos));
        // A name the driver cannot place (systemd: no slice name) fails here, before the pod
        // gets anywhere. cgroupfs places every safe name: nothing to build for it.
        if self.driver.managed() {
            self.driver.runtime_parent(&name)?;
        }
        Ok(name)
    }

    /// Directories of one cgroup name in the hierarchies swiftlet creates it in.
    fn dirs(&self, name: &str) -> Result<Vec<PathBuf>> {
        self.driver.dirs(name)
    }

    /// Directories of one cgroup name in every hierarchy mounted under the cgroup mount, including
    /// those the runtime created on its own: what clean-up must cover so nothing is left behind.
    fn all_hierarchy_dirs(&self, name: &str) -> Result<Vec<PathBuf>> {
        self.driver.all_dirs(name)
    }

    /// Whether the driver writes the unified hierarchy (cgroups-rs spells files by this).
    fn v2(&self) -> bool {
        self.driver.hierarchy() == Hierarchy::V2
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

    /// Node allocatable on the `kubepods` cgroup (the kubelet's `enforceNodeAllocatableCgroups`):
    /// cpu shares of `cpu_millis` and a memory limit of `memory_bytes`, so that pods together
    /// never take what `--system-reserved` and `--kube-reserved` keep back. The caller passes the
    /// machine's capacity when enforcement is off, as the kubelet does (its shares still weigh
    /// the pods against the rest of the machine). A limit below what the pods use now fails
    /// with the kernel's error.
    pub fn enforce_node_allocatable(&self, cpu_millis: u64, memory_bytes: u64) -> Result<()> {
        if !self.cfg.cgroups_per_qos {
            return Ok(());
        }
        let name = self.qos_cgroup_name(QosClass::Guaranteed);
        self.set_shares(&name, milli_cpu_to_shares(cpu_millis))?;
        let dir = self.driver.dir(Controller::Memory, &name)?;
        let limit = saturating_i64(memory_bytes);
        if self.memory_limit_at(&dir) != Some(limit) {
            let declared = Settings {
                memory_limit: Some(Some(memory_bytes)),
                ..Settings::default()
            };
            self.driver.declare(&name, &declared)?;
            MemController::new(dir.clone(), PathBuf::new(), self.v2())
                .set_limit(limit)
                .map_err(cg_err("writing memory limit of", &dir))?;
            self.wrote();
        }
        Ok(())
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
        let start = std::time::Instant::now();
        let burstable: u64 = self.state().burstable.values().sum();
        self.set_shares(
            &self.qos_cgroup_name(QosClass::Burstable),
            milli_cpu_to_shares(burstable),
        )?;
        self.set_shares(&self.qos_cgroup_name(QosClass::BestEffort), MIN_SHARES)?;
        self.observe("update", start);
        Ok(())
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
        if let Some(fresh) = self.driver.create_managed(name)? {
            self.wrote();
            return Ok(fresh);
        }
        let mut fresh = true;
        for dir in self.dirs(name)? {
            self.driver.before_create(&dir)?;
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
            && self.driver.dir(Controller::Cpu, &name)?.is_dir()
        {
            return Ok(name);
        }
        let start = std::time::Instant::now();
        let fresh = self.create(&name)?;
        self.apply_to(&name, &rc, fresh)?;
        self.observe(if fresh { "create" } else { "update" }, start);
        self.state().applied.insert(name.clone(), rc);
        Ok(name)
    }

    /// [`Self::ensure_pod_cgroup`] for async callers: with a driver whose calls go to a manager
    /// (systemd over D-Bus, with waits) on one of tokio's blocking threads, so that the async
    /// threads are not held meanwhile; on cgroupfs in place (a few file reads and writes).
    pub async fn ensure_pod_cgroup_async(&self, pod: &Pod, uid: &str) -> Result<String> {
        if !self.driver.managed() {
            return self.ensure_pod_cgroup(pod, uid);
        }
        let (cm, pod, uid) = (self.clone(), pod.clone(), uid.to_owned());
        tokio::task::spawn_blocking(move || cm.ensure_pod_cgroup(&pod, &uid))
            .await
            .unwrap_or_else(|e| Err(Error::Interrupted(e.to_string())))
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
        self.set_shares_to(name, shares, false, true)
    }

    /// [`Self::set_shares`]; `fresh`: the cgroup was just created, its files hold the defaults;
    /// `declare`: tell the driver's manager (the caller has not told it already).
    fn set_shares_to(&self, name: &str, shares: u64, fresh: bool, declare: bool) -> Result<()> {
        let v2 = self.v2();
        let dir = self.driver.dir(Controller::Cpu, name)?;
        let cpu = CpuController::new(dir.clone(), PathBuf::new(), v2);
        let want = self.driver.cpu_weight(shares);
        let current = if fresh {
            Some(self.driver.default_cpu_weight())
        } else {
            cpu.shares().ok()
        };
        if current != Some(want) {
            let declared = Settings {
                cpu_shares: Some(shares),
                ..Settings::default()
            };
            if declare {
                self.driver.declare(name, &declared)?;
            }
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
        let v2 = self.v2();
        let read = |default, f: &dyn Fn() -> Option<i64>| if fresh { Some(default) } else { f() };
        let period = rc.cpu_period.unwrap_or(QUOTA_PERIOD_US);
        // The whole config, whatever the files hold: what systemd does not know it would put
        // back to its own values when it re-applies the unit.
        self.driver.declare(
            name,
            &Settings {
                cpu_shares: Some(rc.cpu_shares),
                cpu_quota: Some((rc.cpu_quota, period)),
                memory_limit: Some(rc.memory_limit),
                pids_limit: Some(
                    u64::try_from(self.cfg.pod_pids_limit)
                        .ok()
                        .filter(|&n| n > 0),
                ),
            },
        )?;
        self.set_shares_to(name, rc.cpu_shares, fresh, false)?;
        let dir = self.driver.dir(Controller::Cpu, name)?;
        let cpu = CpuController::new(dir.clone(), PathBuf::new(), v2);
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
        let dir = self.driver.dir(Controller::Memory, name)?;
        let limit = rc.memory_limit.map_or(-1, saturating_i64);
        if read(-1, &|| self.memory_limit_at(&dir)) != Some(limit) {
            MemController::new(dir.clone(), PathBuf::new(), v2)
                .set_limit(limit)
                .map_err(cg_err("writing memory limit of", &dir))?;
            self.wrote();
        }
        let dir = self.driver.dir(Controller::Pids, name)?;
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
        let v2 = self.v2();
        let dir = self.driver.dir(Controller::Cpu, name)?;
        let cpu = CpuController::new(dir.clone(), PathBuf::new(), v2);
        let quota = cpu
            .cfs_quota()
            .map_err(cg_err("reading cpu quota of", &dir))?;
        let mem_dir = self.driver.dir(Controller::Memory, name)?;
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
        let file = self.driver.memory_limit_file();
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
        let dir = self.driver.dir(Controller::Memory, name)?;
        let mem = MemController::new(dir.clone(), PathBuf::new(), self.v2());
        Ok(mem.memory_stat().usage_in_bytes)
    }

    /// Kills whatever still runs in the pod cgroup and removes it, deepest directories first.
    /// A missing cgroup is not an error.
    pub fn destroy_pod_cgroup(&self, name: &str) -> Result<()> {
        self.state().applied.remove(name);
        let start = std::time::Instant::now();
        let mut existed = false;
        if self.driver.dir(Controller::Cpu, name)?.exists() {
            existed = true;
            self.driver.remove_managed(name)?;
        }
        for dir in self.all_hierarchy_dirs(name)? {
            if !dir.exists() {
                continue;
            }
            existed = true;
            housekeeping::remove_tree(&dir)?;
        }
        if existed {
            self.observe("destroy", start);
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
