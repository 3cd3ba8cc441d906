//! Container manager: QoS classes, the kubelet's resource math, and pod cgroups (cgroupfs driver,
//! cgroup v1 and v2). Pod cgroups live at `<cgroup-root>/kubepods[/burstable|/besteffort]/pod<uid>`
//! (kubelet-behaviour.md §1.8-§1.10). Guaranteed pods sit directly under `kubepods`.
use k8s_openapi::api::core::v1::{Container, Pod, ResourceRequirements};
use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};

pub const CGROUP_MOUNT: &str = "/sys/fs/cgroup";
/// cgroup v1 controllers the pod cgroup is created in (runc creates the rest beneath the parent).
const V1_CONTROLLERS: &[&str] = &["cpu", "cpuacct", "memory", "pids"];

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
    #[error("cgroup name {0:?} would leave its parent directory")]
    UnsafeName(String),
    #[error("resource quantity {value:?} for {resource}: {reason}")]
    Quantity {
        resource: &'static str,
        value: String,
        reason: &'static str,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> Error + 'a {
    move |source| Error::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl QosClass {
    pub fn as_str(self) -> &'static str {
        match self {
            QosClass::Guaranteed => "Guaranteed",
            QosClass::Burstable => "Burstable",
            QosClass::BestEffort => "BestEffort",
        }
    }
}

/// Parses a CPU quantity into millicores ("250m", "0.5", "2").
pub fn parse_cpu_millis(value: &str) -> Result<u64> {
    let err = |reason| Error::Quantity {
        resource: "cpu",
        value: value.to_owned(),
        reason,
    };
    let v = value.trim();
    if let Some(m) = v.strip_suffix('m') {
        return m
            .parse::<u64>()
            .map_err(|_| err("not a whole number of millicores"));
    }
    let cores: f64 = v.parse().map_err(|_| err("not a number"))?;
    if !cores.is_finite() || cores < 0.0 {
        return Err(err("must be a non-negative number"));
    }
    // The API rounds CPU up to whole millicores.
    Ok((cores * 1000.0).ceil() as u64)
}

/// Parses a memory quantity into bytes ("128Mi", "1G", "1000", "1e6").
pub fn parse_bytes(value: &str) -> Result<u64> {
    let err = |reason| Error::Quantity {
        resource: "memory",
        value: value.to_owned(),
        reason,
    };
    let v = value.trim();
    const SUFFIXES: &[(&str, f64)] = &[
        ("Ki", 1024.0),
        ("Mi", 1048576.0),
        ("Gi", 1073741824.0),
        ("Ti", 1099511627776.0),
        ("Pi", 1125899906842624.0),
        ("Ei", 1152921504606846976.0),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
        ("E", 1e18),
        ("m", 1e-3),
    ];
    let (num, scale) = SUFFIXES
        .iter()
        .find_map(|(s, f)| v.strip_suffix(s).map(|n| (n, *f)))
        .unwrap_or((v, 1.0));
    let n: f64 = num.parse().map_err(|_| err("not a number"))?;
    if !n.is_finite() || n < 0.0 {
        return Err(err("must be a non-negative number"));
    }
    Ok((n * scale).ceil() as u64)
}

/// cpu millicores and memory bytes of a container's requests or limits (0 when absent).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Amounts {
    pub cpu_millis: u64,
    pub memory: u64,
}

fn amounts(
    map: Option<
        &std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
    >,
) -> Result<Amounts> {
    let mut a = Amounts::default();
    if let Some(map) = map {
        if let Some(q) = map.get("cpu") {
            a.cpu_millis = parse_cpu_millis(&q.0)?;
        }
        if let Some(q) = map.get("memory") {
            a.memory = parse_bytes(&q.0)?;
        }
    }
    Ok(a)
}

fn container_amounts(c: &Container) -> Result<(Amounts, Amounts)> {
    let r: Option<&ResourceRequirements> = c.resources.as_ref();
    Ok((
        amounts(r.and_then(|r| r.requests.as_ref()))?,
        amounts(r.and_then(|r| r.limits.as_ref()))?,
    ))
}

fn all_containers(pod: &Pod) -> impl Iterator<Item = &Container> {
    let spec = pod.spec.as_ref();
    spec.map(|s| s.containers.iter())
        .into_iter()
        .flatten()
        .chain(
            spec.and_then(|s| s.init_containers.as_ref())
                .into_iter()
                .flatten(),
        )
}

/// `ComputePodQOS`: summed requests and limits of cpu and memory over all containers.
pub fn pod_qos(pod: &Pod) -> Result<QosClass> {
    let (mut req, mut lim) = (Amounts::default(), Amounts::default());
    let mut guaranteed = true;
    for c in all_containers(pod) {
        let (r, l) = container_amounts(c)?;
        req.cpu_millis += r.cpu_millis;
        req.memory += r.memory;
        lim.cpu_millis += l.cpu_millis;
        lim.memory += l.memory;
        if l.cpu_millis == 0 || l.memory == 0 {
            guaranteed = false;
        }
    }
    let has = |a: Amounts| (a.cpu_millis > 0) as u8 + (a.memory > 0) as u8;
    if has(req) == 0 && has(lim) == 0 {
        return Ok(QosClass::BestEffort);
    }
    let equal = |r: u64, l: u64| r == 0 || r == l;
    if guaranteed
        && has(req) == has(lim)
        && equal(req.cpu_millis, lim.cpu_millis)
        && equal(req.memory, lim.memory)
    {
        return Ok(QosClass::Guaranteed);
    }
    Ok(QosClass::Burstable)
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
    (m * SHARES_PER_CPU / 1000).clamp(MIN_SHARES, MAX_SHARES)
}

pub fn milli_cpu_to_quota(m: u64, period: u64) -> u64 {
    if m == 0 {
        return 0;
    }
    (m * period / 1000).max(MIN_QUOTA_US)
}

pub fn resource_config_for_pod(pod: &Pod) -> Result<ResourceConfig> {
    let spec = pod.spec.as_ref();
    let (mut req, mut lim) = (Amounts::default(), Amounts::default());
    let (mut cpu_limits_declared, mut mem_limits_declared) = (true, true);
    for c in spec.map(|s| s.containers.as_slice()).unwrap_or_default() {
        let (r, l) = container_amounts(c)?;
        req.cpu_millis += r.cpu_millis;
        req.memory += r.memory;
        lim.cpu_millis += l.cpu_millis;
        lim.memory += l.memory;
        cpu_limits_declared &= l.cpu_millis > 0;
        mem_limits_declared &= l.memory > 0;
    }
    // Init containers run one at a time: the pod needs the max of them, not the sum.
    for c in spec
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default()
    {
        let (r, l) = container_amounts(c)?;
        req.cpu_millis = req.cpu_millis.max(r.cpu_millis);
        req.memory = req.memory.max(r.memory);
        lim.cpu_millis = lim.cpu_millis.max(l.cpu_millis);
        lim.memory = lim.memory.max(l.memory);
        cpu_limits_declared &= l.cpu_millis > 0;
        mem_limits_declared &= l.memory > 0;
    }
    let shares = milli_cpu_to_shares(req.cpu_millis);
    let quota = milli_cpu_to_quota(lim.cpu_millis, QUOTA_PERIOD_US);
    Ok(match pod_qos(pod)? {
        QosClass::Guaranteed => ResourceConfig {
            cpu_shares: shares,
            cpu_quota: Some(quota),
            cpu_period: Some(QUOTA_PERIOD_US),
            memory_limit: Some(lim.memory),
        },
        QosClass::Burstable => ResourceConfig {
            cpu_shares: shares,
            cpu_quota: cpu_limits_declared.then_some(quota),
            cpu_period: cpu_limits_declared.then_some(QUOTA_PERIOD_US),
            memory_limit: mem_limits_declared.then_some(lim.memory),
        },
        QosClass::BestEffort => ResourceConfig {
            cpu_shares: MIN_SHARES,
            ..Default::default()
        },
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

impl Hierarchy {
    pub fn detect(mount: &Path) -> Hierarchy {
        if mount.join("cgroup.controllers").exists() {
            Hierarchy::V2
        } else {
            Hierarchy::V1
        }
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    /// `--cgroup-root`, e.g. `/` or `/swiftlet-test`.
    pub cgroup_root: String,
    pub cgroups_per_qos: bool,
    /// The cgroupfs mount (tests point this at a temp dir).
    pub mount: PathBuf,
}

/// Creates, configures and removes pod cgroups. Holds no mutable state: the file system is the
/// state, so any worker may call it for its own pod.
#[derive(Debug, Clone)]
pub struct ContainerManager {
    cfg: Config,
    hierarchy: Hierarchy,
}

impl ContainerManager {
    pub fn new(cfg: Config) -> Self {
        let hierarchy = Hierarchy::detect(&cfg.mount);
        Self { cfg, hierarchy }
    }

    pub fn hierarchy(&self) -> Hierarchy {
        self.hierarchy
    }

    /// The cgroup name (relative to each controller root) of a pod: what CRI gets as cgroup_parent.
    pub fn pod_cgroup_name(&self, uid: &str, qos: QosClass) -> Result<String> {
        if uid.is_empty() || uid.contains(['/', '.']) {
            return Err(Error::UnsafeName(uid.to_owned()));
        }
        let root = self.cfg.cgroup_root.trim_end_matches('/');
        let qos_dir = if !self.cfg.cgroups_per_qos {
            String::new()
        } else {
            match qos {
                QosClass::Guaranteed => "/kubepods".to_owned(),
                QosClass::Burstable => "/kubepods/burstable".to_owned(),
                QosClass::BestEffort => "/kubepods/besteffort".to_owned(),
            }
        };
        Ok(format!("{root}{qos_dir}/pod{uid}"))
    }

    /// Directories of one cgroup name in every hierarchy it lives in.
    fn dirs(&self, name: &str) -> Result<Vec<PathBuf>> {
        match self.hierarchy {
            Hierarchy::V2 => Ok(vec![safe_join(&self.cfg.mount, name)?]),
            Hierarchy::V1 => V1_CONTROLLERS
                .iter()
                .map(|c| safe_join(&self.cfg.mount.join(c), name))
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
        let root = self.cfg.cgroup_root.trim_end_matches('/');
        for sub in ["/kubepods", "/kubepods/burstable", "/kubepods/besteffort"] {
            for dir in self.dirs(&format!("{root}{sub}"))? {
                fs::create_dir_all(&dir).map_err(io_err("creating cgroup", &dir))?;
            }
        }
        let besteffort = ResourceConfig {
            cpu_shares: MIN_SHARES,
            ..Default::default()
        };
        self.apply(&format!("{root}/kubepods/besteffort"), &besteffort)
    }

    /// Creates the pod cgroup if missing and applies its resource settings. Returns its name.
    pub fn ensure_pod_cgroup(&self, pod: &Pod, uid: &str) -> Result<String> {
        let qos = pod_qos(pod)?;
        let name = self.pod_cgroup_name(uid, qos)?;
        for dir in self.dirs(&name)? {
            match fs::create_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    fs::create_dir_all(&dir).map_err(io_err("creating cgroup", &dir))?
                }
                Err(e) => return Err(io_err("creating cgroup", &dir)(e)),
            }
        }
        self.apply(&name, &resource_config_for_pod(pod)?)?;
        Ok(name)
    }

    /// Writes a value only when it differs from what the file holds (re-applying costs no writes).
    fn write_if_changed(path: &Path, value: &str) -> Result<()> {
        if let Ok(current) = fs::read_to_string(path)
            && current.trim() == value
        {
            return Ok(());
        }
        fs::write(path, value).map_err(io_err("writing", path))
    }

    fn apply(&self, name: &str, rc: &ResourceConfig) -> Result<()> {
        let root = &self.cfg.mount;
        match self.hierarchy {
            Hierarchy::V1 => {
                let cpu = safe_join(&root.join("cpu"), name)?;
                Self::write_if_changed(&cpu.join("cpu.shares"), &rc.cpu_shares.to_string())?;
                if let (Some(q), Some(p)) = (rc.cpu_quota, rc.cpu_period) {
                    Self::write_if_changed(&cpu.join("cpu.cfs_period_us"), &p.to_string())?;
                    Self::write_if_changed(&cpu.join("cpu.cfs_quota_us"), &q.to_string())?;
                }
                if let Some(m) = rc.memory_limit {
                    let mem = safe_join(&root.join("memory"), name)?;
                    Self::write_if_changed(&mem.join("memory.limit_in_bytes"), &m.to_string())?;
                }
            }
            Hierarchy::V2 => {
                let dir = safe_join(root, name)?;
                Self::write_if_changed(
                    &dir.join("cpu.weight"),
                    &shares_to_weight(rc.cpu_shares).to_string(),
                )?;
                if let (Some(q), Some(p)) = (rc.cpu_quota, rc.cpu_period) {
                    Self::write_if_changed(&dir.join("cpu.max"), &format!("{q} {p}"))?;
                }
                if let Some(m) = rc.memory_limit {
                    Self::write_if_changed(&dir.join("memory.max"), &m.to_string())?;
                }
            }
        }
        Ok(())
    }

    /// Kills whatever still runs in the pod cgroup and removes it, deepest directories first.
    /// A missing cgroup is not an error.
    pub fn destroy_pod_cgroup(&self, name: &str) -> Result<()> {
        for dir in self.all_hierarchy_dirs(name)? {
            if !dir.exists() {
                continue;
            }
            remove_tree(&dir)?;
        }
        Ok(())
    }

    /// Names (relative to the controller root) of every `pod*` cgroup under our QoS directories.
    pub fn list_pod_cgroups(&self) -> Vec<String> {
        let root = self.cfg.cgroup_root.trim_end_matches('/');
        let parents = if self.cfg.cgroups_per_qos {
            vec![
                format!("{root}/kubepods"),
                format!("{root}/kubepods/burstable"),
                format!("{root}/kubepods/besteffort"),
            ]
        } else {
            vec![root.to_owned()]
        };
        let mut out = Vec::new();
        let Ok(dirs) = self.dirs("/") else { return out };
        let Some(first) = dirs.first() else {
            return out;
        };
        for parent in parents {
            let Ok(dir) = safe_join(first, &parent) else {
                continue;
            };
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n.starts_with("pod") && e.path().is_dir() {
                    out.push(format!("{parent}/{n}"));
                }
            }
        }
        out
    }
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
    use k8s_openapi::api::core::v1::PodSpec;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use std::collections::BTreeMap;

    fn res(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, Quantity>> {
        if pairs.is_empty() {
            return None;
        }
        Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                .collect(),
        )
    }

    type Res<'a> = &'a [(&'a str, &'a str)];

    fn pod(containers: &[(Res<'_>, Res<'_>)]) -> Pod {
        Pod {
            spec: Some(PodSpec {
                containers: containers
                    .iter()
                    .enumerate()
                    .map(|(i, (req, lim))| Container {
                        name: format!("c{i}"),
                        resources: Some(ResourceRequirements {
                            requests: res(req),
                            limits: res(lim),
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn quantities() {
        assert_eq!(parse_cpu_millis("250m").unwrap(), 250);
        assert_eq!(parse_cpu_millis("0.5").unwrap(), 500);
        assert_eq!(parse_cpu_millis("2").unwrap(), 2000);
        assert!(parse_cpu_millis("x").is_err());
        assert_eq!(parse_bytes("128Mi").unwrap(), 128 << 20);
        assert_eq!(parse_bytes("1G").unwrap(), 1_000_000_000);
        assert_eq!(parse_bytes("1e3").unwrap(), 1000);
        assert!(parse_bytes("-1").is_err());
    }

    #[test]
    fn qos_classes() {
        assert_eq!(pod_qos(&pod(&[(&[], &[])])).unwrap(), QosClass::BestEffort);
        let g: &[(&str, &str)] = &[("cpu", "1"), ("memory", "1Gi")];
        assert_eq!(pod_qos(&pod(&[(g, g)])).unwrap(), QosClass::Guaranteed);
        assert_eq!(
            pod_qos(&pod(&[(g, g), (&[], &[])])).unwrap(),
            QosClass::Burstable
        );
        assert_eq!(
            pod_qos(&pod(&[(&[("cpu", "100m")], &[])])).unwrap(),
            QosClass::Burstable
        );
        // Only limits (no API-server defaulting): requests empty != limits -> Burstable.
        assert_eq!(pod_qos(&pod(&[(&[], g)])).unwrap(), QosClass::Burstable);
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

    #[test]
    fn cgroup_names_and_files_v1_fixture() {
        let tmp = tempfile::tempdir().unwrap();
        for c in V1_CONTROLLERS {
            fs::create_dir_all(tmp.path().join(c)).unwrap();
        }
        let cm = ContainerManager::new(Config {
            cgroup_root: "/test".into(),
            cgroups_per_qos: true,
            mount: tmp.path().into(),
        });
        assert_eq!(cm.hierarchy(), Hierarchy::V1);
        cm.start().unwrap();
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
            cm.list_pod_cgroups(),
            vec!["/test/kubepods/podu1".to_owned()]
        );
        // Unsafe names never leave the directory.
        assert!(cm.pod_cgroup_name("../x", QosClass::BestEffort).is_err());
        assert!(safe_join(tmp.path(), "a/../../b").is_err());
        // Files written by a test fixture are plain files, so remove_dir fails on a non-empty dir:
        // destroy is exercised against the real cgroupfs in the integration tests.
    }

    #[test]
    fn v2_fixture_uses_v2_file_names() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join("cgroup.controllers"), "cpu memory pids").unwrap();
        let cm = ContainerManager::new(Config {
            cgroup_root: "/".into(),
            cgroups_per_qos: true,
            mount: tmp.path().into(),
        });
        assert_eq!(cm.hierarchy(), Hierarchy::V2);
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
    }
}
