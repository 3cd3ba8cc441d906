//! Cgroup drivers: where a cgroup's files are and how a value is spelled in them, for the legacy
//! per-controller hierarchies (v1) and the unified hierarchy (v2). The container manager decides
//! *what* to write (the same numbers on every driver); a driver says *where* and *how*.
use super::{Error, Result, io_err, safe_join};
use std::path::{Path, PathBuf};

/// Which cgroup hierarchy a driver writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hierarchy {
    /// One directory per controller under the mount (this machine: hybrid, containerd uses v1).
    V1,
    /// The unified hierarchy at the mount itself.
    V2,
}

/// The controllers swiftlet configures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Controller {
    Cpu,
    Memory,
    Pids,
}

/// A cgroup driver. Cheap to share (`Arc<dyn Driver>`).
pub trait Driver: std::fmt::Debug + Send + Sync {
    fn hierarchy(&self) -> Hierarchy;
    /// The directory of cgroup `name` for `controller`.
    fn dir(&self, controller: Controller, name: &str) -> Result<PathBuf>;
    /// Every directory swiftlet creates for cgroup `name` (one per configured hierarchy).
    fn dirs(&self, name: &str) -> Result<Vec<PathBuf>>;
    /// The directories of cgroup `name` in every hierarchy mounted, those the runtime created on
    /// its own included: what clean-up must cover.
    fn all_dirs(&self, name: &str) -> Result<Vec<PathBuf>>;
    /// The value the cpu weight file takes for `shares` (v1 `cpu.shares` as is; v2 `cpu.weight`
    /// converted as runc does).
    fn cpu_weight(&self, shares: u64) -> u64;
    /// The cpu weight file's value in a new cgroup.
    fn default_cpu_weight(&self) -> u64;
    /// The memory limit file's name.
    fn memory_limit_file(&self) -> &'static str;
    /// The directory of cgroup `name` that accounts its cpu time (v1: the cpuacct hierarchy,
    /// which runc fills when it places a container; v2: the cgroup's own).
    fn cpu_usage_dir(&self, name: &str) -> Result<PathBuf>;
    /// Makes ready for `dir` to be created: on v2 every ancestor from the root down must exist
    /// and hand its controllers down (`cgroup.subtree_control`), else the new cgroup has no
    /// `cpu.weight` or `memory.max`. Nothing to do on v1.
    fn before_create(&self, _dir: &Path) -> Result<()> {
        Ok(())
    }
    /// What the runtime gets as the cgroup parent of a pod whose cgroup is `name`.
    fn runtime_parent(&self, name: &str) -> Result<String> {
        Ok(name.to_owned())
    }
    /// The cgroup the runtime makes for container `id` below its pod's (a path component).
    fn container_child<'a>(&self, id: &'a str) -> std::borrow::Cow<'a, str> {
        std::borrow::Cow::Borrowed(id)
    }
    /// Whether a manager owns the cgroups (systemd): then creating, configuring and removing
    /// one is a call to it that may take milliseconds, not a file write.
    fn managed(&self) -> bool {
        false
    }
    /// Creates cgroup `name` through the manager that owns the cgroups, if there is one
    /// (systemd): `Some(fresh)`, fresh when its files hold the kernel's defaults. `None`: the
    /// caller creates the directories.
    fn create_managed(&self, _name: &str) -> Result<Option<bool>> {
        Ok(None)
    }
    /// Tells the manager that owns the cgroups the settings about to be written to `name`'s
    /// files, so that it keeps them. Nothing to do on cgroupfs.
    fn declare(&self, _name: &str, _settings: &Settings) -> Result<()> {
        Ok(())
    }
    /// Removes cgroup `name` through the manager that owns the cgroups, if there is one;
    /// whatever is left the caller removes from the file system.
    fn remove_managed(&self, _name: &str) -> Result<()> {
        Ok(())
    }
}

/// Settings of one cgroup, each `None` when not being set: cpu shares (v1 units), cpu quota
/// (`None` quota: unlimited) with its period in microseconds, memory and pids limits (`None`
/// limit: unlimited).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    pub cpu_shares: Option<u64>,
    pub cpu_quota: Option<(Option<u64>, u64)>,
    pub memory_limit: Option<Option<u64>>,
    pub pids_limit: Option<Option<u64>>,
}

/// The controllers a pod cgroup cannot do without: on v2 each must be offered by the parent.
pub const REQUIRED_V2: [&str; 3] = ["cpu", "memory", "pids"];

/// cgroup v2 weight from v1 shares, the linear mapping runc uses:
/// `1 + (shares - 2) * 9999 / 262142`.
pub fn shares_to_weight(shares: u64) -> u64 {
    let s = shares.clamp(2, 262_144);
    1 + (s - 2) * 9999 / 262_142
}

/// The legacy hierarchies: one mount per controller.
#[derive(Debug, Clone)]
pub struct V1 {
    /// The cgroup mount holding every hierarchy (`/sys/fs/cgroup`).
    mount: PathBuf,
    cpu: PathBuf,
    memory: PathBuf,
    pids: PathBuf,
}

impl Driver for V1 {
    fn hierarchy(&self) -> Hierarchy {
        Hierarchy::V1
    }

    fn dir(&self, controller: Controller, name: &str) -> Result<PathBuf> {
        let base = match controller {
            Controller::Cpu => &self.cpu,
            Controller::Memory => &self.memory,
            Controller::Pids => &self.pids,
        };
        safe_join(base, name)
    }

    fn dirs(&self, name: &str) -> Result<Vec<PathBuf>> {
        // cpuacct is left to runc, which creates the path when it places a container: nothing
        // is configured there and each mkdir on cgroupfs costs.
        [&self.cpu, &self.memory, &self.pids]
            .into_iter()
            .map(|c| safe_join(c, name))
            .collect()
    }

    fn all_dirs(&self, name: &str) -> Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        if let Ok(entries) = std::fs::read_dir(&self.mount) {
            for e in entries.flatten() {
                // Symlinks such as `cpu,cpuacct` alias a hierarchy already listed.
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    out.push(safe_join(&e.path(), name)?);
                }
            }
        }
        Ok(out)
    }

    fn cpu_weight(&self, shares: u64) -> u64 {
        shares
    }

    fn default_cpu_weight(&self) -> u64 {
        1024
    }

    fn memory_limit_file(&self) -> &'static str {
        "memory.limit_in_bytes"
    }

    fn cpu_usage_dir(&self, name: &str) -> Result<PathBuf> {
        safe_join(&self.mount.join("cpuacct"), name)
    }
}

/// The unified hierarchy: every controller in one tree.
#[derive(Debug)]
pub struct V2 {
    root: PathBuf,
    /// Directories known to exist and to hand every controller down: checked once each.
    delegating: std::sync::Mutex<std::collections::HashSet<PathBuf>>,
}

impl V2 {
    pub fn new(root: PathBuf) -> Self {
        Self {
            root,
            delegating: Default::default(),
        }
    }
}

/// Enables in `dir`'s `cgroup.subtree_control` every controller its `cgroup.controllers` offers
/// (as runc and the kubelet do), so that its children get them. A controller of
/// [`REQUIRED_V2`] that is not offered, or that the kernel refuses to enable, is an error
/// naming it; another that cannot be enabled is left off. A directory without
/// `cgroup.controllers` is not a cgroup (a test fixture below its root): nothing to enable.
pub fn delegate_controllers(dir: &Path) -> Result<()> {
    let offered = match std::fs::read_to_string(dir.join("cgroup.controllers")) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err("reading controllers of", dir)(e)),
    };
    let offered: Vec<&str> = offered.split_whitespace().collect();
    let control = dir.join("cgroup.subtree_control");
    let missing = |c: &str| Error::Cgroups {
        op: "delegating controllers in",
        path: dir.to_owned(),
        message: format!(
            "the {c} controller is not available here (cgroup.controllers: {:?}); on the \
             unified hierarchy every controller must be free of the v1 hierarchies",
            offered.join(" ")
        ),
    };
    let enabled = std::fs::read_to_string(&control).unwrap_or_default();
    let enabled: Vec<&str> = enabled.split_whitespace().collect();
    let todo: Vec<&str> = offered
        .iter()
        .copied()
        .filter(|c| !enabled.contains(c))
        .collect();
    let line = todo.iter().map(|c| format!("+{c}")).collect::<Vec<_>>();
    // One refused controller fails the whole write: then they go one by one.
    let one_by_one = !todo.is_empty() && std::fs::write(&control, line.join(" ")).is_err();
    // What is offered is enabled before a missing one is reported: harmless, and the error
    // then names only what the host lacks.
    if let Some(c) = REQUIRED_V2.iter().find(|c| !offered.contains(c)) {
        return Err(missing(c));
    }
    for c in todo.into_iter().filter(|_| one_by_one) {
        if let Err(e) = std::fs::write(&control, format!("+{c}"))
            && REQUIRED_V2.contains(&c)
        {
            return Err(Error::Cgroups {
                op: "enabling a controller in",
                path: control.clone(),
                message: format!("+{c}: {e}"),
            });
        }
    }
    Ok(())
}

impl Driver for V2 {
    fn hierarchy(&self) -> Hierarchy {
        Hierarchy::V2
    }

    fn dir(&self, _: Controller, name: &str) -> Result<PathBuf> {
        safe_join(&self.root, name)
    }

    fn dirs(&self, name: &str) -> Result<Vec<PathBuf>> {
        Ok(vec![safe_join(&self.root, name)?])
    }

    fn all_dirs(&self, name: &str) -> Result<Vec<PathBuf>> {
        self.dirs(name)
    }

    fn cpu_weight(&self, shares: u64) -> u64 {
        // cgroups-rs writes the number it is given into cpu.weight on v2 without converting it
        // ("conversion is the caller's responsibility").
        shares_to_weight(shares)
    }

    fn default_cpu_weight(&self) -> u64 {
        100
    }

    fn memory_limit_file(&self) -> &'static str {
        "memory.max"
    }

    fn cpu_usage_dir(&self, name: &str) -> Result<PathBuf> {
        safe_join(&self.root, name)
    }

    fn before_create(&self, dir: &Path) -> Result<()> {
        let Some(rel) = dir.parent().and_then(|p| p.strip_prefix(&self.root).ok()) else {
            return Ok(());
        };
        let mut at = self.root.clone();
        let mut chain = vec![at.clone()];
        for part in rel.components() {
            at.push(part);
            chain.push(at.clone());
        }
        let mut known = self
            .delegating
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for d in chain {
            if known.contains(&d) && d.is_dir() {
                continue;
            }
            match std::fs::create_dir(&d) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_err("creating cgroup", &d)(e)),
            }
            delegate_controllers(&d)?;
            known.insert(d);
        }
        Ok(())
    }
}

/// The driver for the cgroups at `mount`. For the real mount this asks cgroups-rs (statfs for
/// cgroup2, /proc/self/mountinfo for the v1 controllers); a test fixture elsewhere is v2 when it
/// has a `cgroup.controllers` file and has one directory per v1 controller otherwise.
pub fn detect(mount: &Path) -> std::sync::Arc<dyn Driver> {
    use cgroups_rs::fs::{Controllers, hierarchies};
    let v1_fixture = || V1 {
        mount: mount.to_owned(),
        cpu: mount.join("cpu"),
        memory: mount.join("memory"),
        pids: mount.join("pids"),
    };
    let v2 = || std::sync::Arc::new(V2::new(mount.to_owned()));
    if mount != Path::new(hierarchies::UNIFIED_MOUNTPOINT) {
        if mount.join("cgroup.controllers").exists() {
            return v2();
        }
        return std::sync::Arc::new(v1_fixture());
    }
    if hierarchies::is_cgroup2_unified_mode() {
        return v2();
    }
    let v1 = hierarchies::V1::new();
    let fallback = v1_fixture();
    let at = |c: Controllers, default: PathBuf| {
        v1.get_mount_point(c)
            .map(|(point, _)| point)
            .unwrap_or(default)
    };
    std::sync::Arc::new(V1 {
        mount: mount.to_owned(),
        cpu: at(Controllers::Cpu, fallback.cpu),
        memory: at(Controllers::Mem, fallback.memory),
        pids: at(Controllers::Pids, fallback.pids),
    })
}
