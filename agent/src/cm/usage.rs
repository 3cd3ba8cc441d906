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
    pub page_faults: u64,
    pub major_page_faults: u64,
}

/// A cgroup's usage; a part that cannot be read is `None`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CgroupUsage {
    /// Cpu time used since the cgroup was made, in nanoseconds.
    pub cpu_nanos: Option<u64>,
    pub memory: Option<MemoryUsage>,
    pub processes: Option<u64>,
}

/// The value of `key` in a flat keyed file (`memory.stat`, `cpu.stat`: `key value` lines).
fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// The `memory.stat` keys of the inactive file cache, rss, page faults and major page faults.
type StatKeys = [&'static str; 4];
/// v1: the hierarchical (`total_`) counters.
const V1_KEYS: StatKeys = [
    "total_inactive_file",
    "total_rss",
    "total_pgfault",
    "total_pgmajfault",
];
const V2_KEYS: StatKeys = ["inactive_file", "anon", "pgfault", "pgmajfault"];

/// Memory usage from the usage file's value (v1 `memory.usage_in_bytes`, v2 `memory.current`)
/// and `memory.stat`.
fn memory(usage: u64, stat: &str, [inactive, rss, faults, major]: StatKeys) -> MemoryUsage {
    let get = |k| keyed(stat, k).unwrap_or(0);
    MemoryUsage {
        usage_bytes: usage,
        working_set_bytes: usage.saturating_sub(get(inactive)),
        rss_bytes: get(rss),
        page_faults: get(faults),
        major_page_faults: get(major),
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
#[derive(Debug)]
pub struct CgroupDirs {
    cpu: Option<fs::File>,
    memory: Option<fs::File>,
    pids: Option<fs::File>,
    v2: bool,
}

/// Reads `rel` (relative to `dir`) whole; cgroup files are small, and one buffer read avoids the
/// size probe of `fs::read_to_string`.
fn read_at(dir: &fs::File, rel: &str) -> Option<String> {
    use rustix::fs::{Mode, OFlags};
    use std::io::Read;
    // A `rel` with a NUL byte fails here too.
    let fd = rustix::fs::openat(dir, rel, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).ok()?;
    let mut file = fs::File::from(fd);
    let mut buf = [0u8; 4096];
    let mut out = Vec::new();
    loop {
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    String::from_utf8(out).ok()
}

impl CgroupDirs {
    /// The usage of the cgroup (`child` `None`) or of its child cgroup `child` (a container's,
    /// named by its ID under the pod's). `processes`: read the process count too.
    pub fn usage(&self, child: Option<&str>, processes: bool) -> CgroupUsage {
        let path = |file: &str| match child {
            Some(c) => format!("{c}/{file}"),
            None => file.to_owned(),
        };
        let number = |dir: &Option<fs::File>, file: &str| -> Option<u64> {
            read_at(dir.as_ref()?, &path(file))?.trim().parse().ok()
        };
        let cpu_nanos = if self.v2 {
            self.cpu
                .as_ref()
                .and_then(|d| read_at(d, &path("cpu.stat")))
                .and_then(|text| keyed(&text, "usage_usec"))
                .map(|us| us.saturating_mul(1000))
        } else {
            number(&self.cpu, "cpuacct.usage")
        };
        let usage_file = if self.v2 {
            "memory.current"
        } else {
            "memory.usage_in_bytes"
        };
        let memory = number(&self.memory, usage_file).map(|usage| {
            let stat = self
                .memory
                .as_ref()
                .and_then(|d| read_at(d, &path("memory.stat")))
                .unwrap_or_default();
            if self.v2 {
                memory_v2(usage, &stat)
            } else {
                memory_v1(usage, &stat)
            }
        });
        let processes = if processes {
            number(&self.pids, "pids.current")
        } else {
            None
        };
        CgroupUsage {
            cpu_nanos,
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
            memory: open(self.driver.dir(Controller::Memory, name)),
            pids: open(self.driver.dir(Controller::Pids, name)),
            v2: self.v2(),
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
                page_faults: 7,
                major_page_faults: 2,
            }
        );
        let v2 = "anon 300\nfile 100\ninactive_file 600\npgfault 7\npgmajfault 2\n";
        assert_eq!(memory_v2(500, v2).working_set_bytes, 0, "never below zero");
        assert_eq!(memory_v2(500, v2).rss_bytes, 300);
        assert_eq!(keyed("usage_usec 12\nuser_usec 3\n", "user_usec"), Some(3));
        assert_eq!(keyed("usage_usecx 12\n", "usage_usec"), None);
    }

    fn manager_at(mount: &Path) -> ContainerManager {
        ContainerManager::new(Config {
            cgroup_root: "/".into(),
            cgroups_per_qos: true,
            mount: mount.to_owned(),
            pod_pids_limit: 0,
        })
    }

    #[test]
    fn a_fixture_cgroup_reads_on_v1_and_v2() {
        let dir = tempfile::tempdir().unwrap();
        let m = dir.path();
        for c in ["cpu", "cpuacct", "memory", "pids"] {
            fs::create_dir_all(m.join(c).join("a")).unwrap();
        }
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
}
