//! What a cgroup uses now: cpu time, memory (usage, working set, rss, page faults) and
//! processes, read from its files on either hierarchy. The stats summary and (later) eviction
//! read pods' and the node's usage through here.
use super::driver::Controller;
use super::*;

/// Memory a cgroup uses, as the kubelet's stats report it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryUsage {
    pub usage_bytes: u64,
    /// Usage minus the inactive file cache: what the kernel cannot simply drop, the number
    /// eviction and `kubectl top` use.
    pub working_set_bytes: u64,
    pub rss_bytes: u64,
    /// The page cache charged to the cgroup (v1 `total_cache`, v2 `file`).
    pub cache_bytes: u64,
    pub page_faults: u64,
    pub major_page_faults: u64,
}

/// How often the CFS quota held a cgroup back (`cpu.stat`'s `nr_periods`, `nr_throttled`,
/// `throttled_usec`). The periods count only while a quota is set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuThrottling {
    pub periods: u64,
    pub throttled_periods: u64,
    pub throttled_nanos: u64,
}

/// A cgroup's usage; a part that cannot be read is `None`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CgroupUsage {
    /// Cpu time used since the cgroup was made, in nanoseconds.
    pub cpu_nanos: Option<u64>,
    /// Its throttling, on cgroup v2 (where `cpu.stat`, read for the usage anyway, has it); on
    /// v1 see [`CgroupDirs::throttling_v1`].
    pub cpu_throttling: Option<CpuThrottling>,
    pub memory: Option<MemoryUsage>,
    pub processes: Option<u64>,
}

/// The `memory.stat` keys of the inactive file cache, rss, page faults, major page faults and
/// the page cache.
type StatKeys = [&'static str; 5];
/// v1: the hierarchical (`total_`) counters.
const V1_KEYS: StatKeys = [
    "total_inactive_file",
    "total_rss",
    "total_pgfault",
    "total_pgmajfault",
    "total_cache",
];
const V2_KEYS: StatKeys = ["inactive_file", "anon", "pgfault", "pgmajfault", "file"];

/// The `key value` lines of a flat-keyed cgroup file whose value is a number.
fn numbers(text: &str) -> impl Iterator<Item = (&str, u64)> {
    text.lines().filter_map(|line| {
        let (key, value) = line.split_once(' ')?;
        Some((key, value.trim().parse().ok()?))
    })
}

/// The usage (ns) and the throttling of a cgroup v2 `cpu.stat`, in one pass over its lines.
fn cpu_stat_v2(text: &str) -> (Option<u64>, Option<CpuThrottling>) {
    let (mut usage_usec, mut t) = (None, CpuThrottling::default());
    let mut throttling_seen = false;
    for (key, value) in numbers(text) {
        match key {
            "usage_usec" => usage_usec = Some(value),
            "nr_periods" => (t.periods, throttling_seen) = (value, true),
            "nr_throttled" => t.throttled_periods = value,
            "throttled_usec" => t.throttled_nanos = value.saturating_mul(1000),
            _ => {}
        }
    }
    (
        usage_usec.map(|us| us.saturating_mul(1000)),
        throttling_seen.then_some(t),
    )
}

/// The throttling of a cgroup v1 `cpu.stat` (`nr_periods`, `nr_throttled`, `throttled_time` in
/// nanoseconds).
fn cpu_stat_v1(text: &str) -> Option<CpuThrottling> {
    let mut t = CpuThrottling::default();
    let mut seen = false;
    for (key, value) in numbers(text) {
        match key {
            "nr_periods" => (t.periods, seen) = (value, true),
            "nr_throttled" => t.throttled_periods = value,
            "throttled_time" => t.throttled_nanos = value,
            _ => {}
        }
    }
    seen.then_some(t)
}

/// Memory usage from the usage file's value (v1 `memory.usage_in_bytes`, v2 `memory.current`)
/// and `memory.stat`, read in one pass over its lines.
fn memory(usage: u64, stat: &str, keys: StatKeys) -> MemoryUsage {
    let mut values = [0u64; 5];
    for line in stat.lines() {
        let Some((key, value)) = line.split_once(' ') else {
            continue;
        };
        if let Some(i) = keys.iter().position(|k| *k == key) {
            values[i] = value.trim().parse().unwrap_or(0);
        }
    }
    let [inactive, rss, faults, major, cache] = values;
    MemoryUsage {
        usage_bytes: usage,
        working_set_bytes: usage.saturating_sub(inactive),
        rss_bytes: rss,
        cache_bytes: cache,
        page_faults: faults,
        major_page_faults: major,
    }
}

pub fn memory_v1(usage: u64, stat: &str) -> MemoryUsage {
    memory(usage, stat, V1_KEYS)
}

pub fn memory_v2(usage: u64, stat: &str) -> MemoryUsage {
    memory(usage, stat, V2_KEYS)
}

/// The directories of one cgroup, opened once per controller: its files, and those of its child
/// cgroups, are opened relative to them, so the kernel walks the long cgroup path once per
/// controller instead of once per file (a third of a stats summary's time went to those walks).
/// The files read are kept open and read again from their start (a cgroup file makes its text
/// anew on each read from offset 0), so a later read costs one system call instead of an open,
/// reads and a close (40 % of a summary's time at 100 pods), within [`kept_files_max`].
#[derive(Debug)]
pub struct CgroupDirs {
    /// Where the cpu time is accounted (v1: the cpuacct hierarchy).
    cpu: Option<fs::File>,
    /// v1 only: the cpu hierarchy's directory, whose `cpu.stat` has the CFS quota's throttling
    /// (on v2 the `cpu.stat` read for the usage has it).
    cpu_quota: Option<fs::File>,
    memory: Option<fs::File>,
    pids: Option<fs::File>,
    v2: bool,
    /// (controller, path relative to its directory) -> the open file.
    kept: std::sync::Mutex<HashMap<(Controller, String), KeptFile>>,
}

/// Files kept open by every [`CgroupDirs`] together.
static KEPT_FILES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many cgroup files may be kept open at once: a quarter of the agent's open-file limit
/// (the agent raises its soft limit to the hard one at its start), so that the files kept never
/// starve sockets and other files. Past it, files are opened for each read as before.
fn kept_files_max() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
        limit
            .current
            .map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX))
            / 4
    })
}

/// A file kept open to be read again from its start (a cgroup's or `/proc`'s, whose text is
/// made anew on each read from offset 0), counted in [`KEPT_FILES`] for as long as it lives.
#[derive(Debug)]
pub struct KeptFile(fs::File);

impl KeptFile {
    /// Keeps `file` when the budget of kept files allows, else gives it back.
    pub fn keep(file: fs::File) -> Result<KeptFile, fs::File> {
        use std::sync::atomic::Ordering;
        if KEPT_FILES.fetch_add(1, Ordering::Relaxed) < kept_files_max() {
            Ok(KeptFile(file))
        } else {
            KEPT_FILES.fetch_sub(1, Ordering::Relaxed);
            Err(file)
        }
    }

    /// The file's text now.
    pub fn read(&self) -> Option<String> {
        read_from_start(&self.0)
    }
}

impl Drop for KeptFile {
    fn drop(&mut self) {
        KEPT_FILES.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Reads a file from offset 0 to its end. A cgroup file's text is one record made whole on each
/// read from its start, so a read shorter than the buffer is its end (one call for the usual
/// few hundred bytes).
pub fn read_from_start(file: &fs::File) -> Option<String> {
    let mut buf = [0u8; 4096];
    let mut out = Vec::new();
    loop {
        let offset = out.len() as u64;
        match rustix::io::pread(file, &mut buf, offset) {
            Ok(0) => break,
            Ok(n) => {
                out.extend_from_slice(&buf[..n]);
                if n < buf.len() {
                    break;
                }
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => return None,
        }
    }
    String::from_utf8(out).ok()
}

/// Opens `rel` relative to `dir` for reading; a `rel` with a NUL byte fails here too.
fn open_at(dir: &fs::File, rel: &str) -> Option<fs::File> {
    use rustix::fs::{Mode, OFlags};
    let fd = rustix::fs::openat(dir, rel, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).ok()?;
    Some(fs::File::from(fd))
}

impl CgroupDirs {
    fn dir(&self, controller: Controller) -> Option<&fs::File> {
        match controller {
            Controller::Memory => self.memory.as_ref(),
            Controller::Pids => self.pids.as_ref(),
            Controller::Cpu => self.cpu.as_ref(),
        }
    }

    fn lock_kept(&self) -> std::sync::MutexGuard<'_, HashMap<(Controller, String), KeptFile>> {
        self.kept
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Reads `rel` below `controller`'s directory whole: from the file kept open when there is
    /// one (dropped when it no longer reads, as when its cgroup is gone), else opened now and
    /// kept when the budget allows.
    fn read(&self, controller: Controller, rel: &str) -> Option<String> {
        self.read_in(controller, self.dir(controller), rel)
    }

    /// [`CgroupDirs::read`] below `dir`, the file kept under `controller`.
    fn read_in(&self, controller: Controller, dir: Option<&fs::File>, rel: &str) -> Option<String> {
        let key = (controller, rel.to_owned());
        let kept = self.lock_kept().remove(&key);
        if let Some(file) = kept {
            let text = read_from_start(&file.0)?;
            self.lock_kept().insert(key, file);
            return Some(text);
        }
        let file = open_at(dir?, rel)?;
        let text = read_from_start(&file)?;
        if let Ok(kept) = KeptFile::keep(file) {
            self.lock_kept().insert(key, kept);
        }
        Some(text)
    }

    /// Closes the kept files of child cgroups other than `children` (containers that are gone).
    pub fn keep_children<'a>(&self, children: impl IntoIterator<Item = &'a str>) {
        let children: std::collections::HashSet<&str> = children.into_iter().collect();
        self.lock_kept().retain(|(_, rel), _| {
            rel.split_once('/')
                .is_none_or(|(child, _)| children.contains(child))
        });
    }

    /// The CFS quota's throttling of the cgroup or of its child `child` on cgroup v1, where it
    /// is a file of its own, read only for what has a cpu limit (`None` on v2, where
    /// [`CgroupDirs::usage`] has it).
    pub fn throttling_v1(&self, child: Option<&str>) -> Option<CpuThrottling> {
        if self.v2 {
            return None;
        }
        let rel = match child {
            Some(c) => format!("{c}/cpu.stat"),
            None => "cpu.stat".to_owned(),
        };
        cpu_stat_v1(&self.read_in(Controller::Cpu, self.cpu_quota.as_ref(), &rel)?)
    }

    /// The usage of the cgroup (`child` `None`) or of its child cgroup `child` (a container's,
    /// named by its ID under the pod's). `processes`: read the process count too.
    pub fn usage(&self, child: Option<&str>, processes: bool) -> CgroupUsage {
        let path = |file: &str| match child {
            Some(c) => format!("{c}/{file}"),
            None => file.to_owned(),
        };
        let number = |controller: Controller, file: &str| -> Option<u64> {
            self.read(controller, &path(file))?.trim().parse().ok()
        };
        let (cpu_nanos, cpu_throttling) = if self.v2 {
            self.read(Controller::Cpu, &path("cpu.stat"))
                .map_or((None, None), |text| cpu_stat_v2(&text))
        } else {
            (number(Controller::Cpu, "cpuacct.usage"), None)
        };
        let usage_file = if self.v2 {
            "memory.current"
        } else {
            "memory.usage_in_bytes"
        };
        let memory = number(Controller::Memory, usage_file).map(|usage| {
            let stat = self
                .read(Controller::Memory, &path("memory.stat"))
                .unwrap_or_default();
            if self.v2 {
                memory_v2(usage, &stat)
            } else {
                memory_v1(usage, &stat)
            }
        });
        let processes = if processes {
            number(Controller::Pids, "pids.current")
        } else {
            None
        };
        CgroupUsage {
            cpu_nanos,
            cpu_throttling,
            memory,
            processes,
        }
    }
}

impl ContainerManager {
    /// Opens cgroup `name`'s directories (relative to each controller root; `/` is the root
    /// cgroup) for [`CgroupDirs::usage`]. A controller whose directory is missing reads nothing.
    pub fn open_cgroup(&self, name: &str) -> CgroupDirs {
        let open = |dir: Result<PathBuf>| dir.ok().and_then(|d| fs::File::open(d).ok());
        CgroupDirs {
            cpu: open(self.driver.cpu_usage_dir(name)),
            cpu_quota: if self.v2() {
                None
            } else {
                open(self.driver.dir(Controller::Cpu, name))
            },
            memory: open(self.driver.dir(Controller::Memory, name)),
            pids: open(self.driver.dir(Controller::Pids, name)),
            v2: self.v2(),
            kept: std::sync::Mutex::default(),
        }
    }

    /// The usage of cgroup `name`.
    pub fn cgroup_usage(&self, name: &str) -> CgroupUsage {
        self.open_cgroup(name).usage(None, true)
    }

    /// The usage of a pod's cgroup.
    pub fn pod_usage(&self, uid: &str, qos: QosClass) -> Result<CgroupUsage> {
        Ok(self.cgroup_usage(&self.pod_cgroup_name(uid, qos)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_counters_of_both_hierarchies() {
        let v1 = "cache 5\nrss 1\ntotal_cache 100\ntotal_rss 300\ntotal_inactive_file 40\n\
                  total_pgfault 7\ntotal_pgmajfault 2\n";
        assert_eq!(
            memory_v1(500, v1),
            MemoryUsage {
                usage_bytes: 500,
                working_set_bytes: 460,
                rss_bytes: 300,
                cache_bytes: 100,
                page_faults: 7,
                major_page_faults: 2,
            }
        );
        assert_eq!(
            cpu_stat_v2(
                "usage_usec 12\nuser_usec 3\nnr_periods 40\nnr_throttled 4\nthrottled_usec 25\n"
            ),
            (
                Some(12_000),
                Some(CpuThrottling {
                    periods: 40,
                    throttled_periods: 4,
                    throttled_nanos: 25_000
                })
            )
        );
        assert_eq!(
            cpu_stat_v2("usage_usec 12\n"),
            (Some(12_000), None),
            "a kernel without the CFS bandwidth keys"
        );
        let v2 = "anon 300\nfile 100\ninactive_file 600\npgfault 7\npgmajfault 2\n";
        assert_eq!(memory_v2(500, v2).working_set_bytes, 0, "never below zero");
        assert_eq!(memory_v2(500, v2).rss_bytes, 300);
        assert_eq!(memory_v2(500, v2).cache_bytes, 100);
        assert_eq!(cpu_stat_v2("usage_usecx 12\n"), (None, None));
    }

    fn manager_at(mount: &Path) -> ContainerManager {
        ContainerManager::new(Config {
            cgroup_root: "/".into(),
            cgroups_per_qos: true,
            mount: mount.to_owned(),
            pod_pids_limit: 0,
        })
    }

    /// A v1 hierarchy in a temporary directory, cgroup `sub` made in each controller.
    fn v1_mount(sub: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for c in ["cpu", "cpuacct", "memory", "pids"] {
            fs::create_dir_all(dir.path().join(c).join(sub)).unwrap();
        }
        dir
    }

    #[test]
    fn a_fixture_cgroup_reads_on_v1_and_v2() {
        let dir = v1_mount("a");
        let m = dir.path();
        fs::write(m.join("cpuacct/a/cpuacct.usage"), "12345\n").unwrap();
        fs::write(m.join("memory/a/memory.usage_in_bytes"), "1000\n").unwrap();
        fs::write(m.join("memory/a/memory.stat"), "total_inactive_file 100\n").unwrap();
        fs::write(m.join("pids/a/pids.current"), "3\n").unwrap();
        let cm = manager_at(m);
        let u = cm.cgroup_usage("/a");
        assert_eq!(u.cpu_nanos, Some(12345));
        assert_eq!(u.memory.map(|m| m.working_set_bytes), Some(900));
        assert_eq!(u.processes, Some(3));
        assert_eq!(cm.cgroup_usage("/missing"), CgroupUsage::default());
        fs::create_dir_all(m.join("memory/a/c1")).unwrap();
        fs::write(m.join("memory/a/c1/memory.usage_in_bytes"), "70\n").unwrap();
        let child = cm.open_cgroup("/a").usage(Some("c1"), false);
        assert_eq!(child.memory.map(|m| m.usage_bytes), Some(70));
        assert_eq!((child.cpu_nanos, child.processes), (None, None));
        assert!(cm.pod_usage("../x", QosClass::BestEffort).is_err());

        let dir = tempfile::tempdir().unwrap();
        let m = dir.path();
        fs::write(m.join("cgroup.controllers"), "cpu memory pids\n").unwrap();
        fs::create_dir_all(m.join("a")).unwrap();
        fs::write(m.join("a/cpu.stat"), "usage_usec 7\n").unwrap();
        fs::write(m.join("a/memory.current"), "50\n").unwrap();
        fs::write(m.join("a/memory.stat"), "anon 20\ninactive_file 10\n").unwrap();
        let cm = manager_at(m);
        let u = cm.cgroup_usage("/a");
        assert_eq!(u.cpu_nanos, Some(7000));
        assert_eq!(
            u.memory.map(|m| (m.working_set_bytes, m.rss_bytes)),
            Some((40, 20))
        );
        assert_eq!(u.processes, None);
    }

    #[test]
    fn throttling_is_read_from_the_cpu_hierarchy_on_v1() {
        let dir = v1_mount("a/c1");
        let m = dir.path();
        fs::create_dir_all(m.join("cpu/a/c1")).unwrap();
        fs::write(
            m.join("cpu/a/c1/cpu.stat"),
            "nr_periods 40\nnr_throttled 4\nthrottled_time 1500000000\nnr_bursts 0\n",
        )
        .unwrap();
        let cm = manager_at(m);
        let dirs = cm.open_cgroup("/a");
        assert_eq!(
            dirs.throttling_v1(Some("c1")),
            Some(CpuThrottling {
                periods: 40,
                throttled_periods: 4,
                throttled_nanos: 1_500_000_000,
            })
        );
        assert_eq!(dirs.throttling_v1(None), None, "no cpu.stat for the pod");
        assert_eq!(dirs.usage(Some("c1"), false).cpu_throttling, None);
    }

    #[test]
    fn kept_files_are_read_again_from_their_start_and_closed_with_their_container() {
        let dir = v1_mount("a/c1");
        let m = dir.path();
        fs::write(m.join("memory/a/c1/memory.usage_in_bytes"), "70\n").unwrap();
        // Longer than one read's buffer: read to its end.
        let long = format!("{}total_rss 5\n", "pad 0\n".repeat(1000));
        fs::write(m.join("memory/a/c1/memory.stat"), &long).unwrap();
        let cm = manager_at(m);
        let dirs = cm.open_cgroup("/a");
        let first = dirs.usage(Some("c1"), false).memory.unwrap();
        assert_eq!((first.usage_bytes, first.rss_bytes), (70, 5));
        assert_eq!(dirs.lock_kept().len(), 2, "both files kept open");
        // The same files (same inodes) with new text: a read shows the new text whole.
        for (file, text) in [
            ("memory.usage_in_bytes", "9\n"),
            ("memory.stat", "total_rss 1\n"),
        ] {
            let mut f = fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(m.join("memory/a/c1").join(file))
                .unwrap();
            std::io::Write::write_all(&mut f, text.as_bytes()).unwrap();
        }
        let again = dirs.usage(Some("c1"), false).memory.unwrap();
        assert_eq!((again.usage_bytes, again.rss_bytes), (9, 1));
        dirs.keep_children(["c2"]);
        assert!(
            dirs.lock_kept().is_empty(),
            "c1 is gone: its files are closed"
        );
    }
}
