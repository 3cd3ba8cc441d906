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

fn read_u64(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
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

impl ContainerManager {
    /// The usage of cgroup `name` (relative to each controller root; `/` is the root cgroup).
    pub fn cgroup_usage(&self, name: &str) -> CgroupUsage {
        self.usage(name, true)
    }

    /// [`Self::cgroup_usage`] without the process count (a container's: the summary does not
    /// report it, and each file read costs).
    pub fn container_usage(&self, name: &str) -> CgroupUsage {
        self.usage(name, false)
    }

    fn usage(&self, name: &str, processes: bool) -> CgroupUsage {
        let v2 = self.v2();
        let cpu_nanos = self.driver.cpu_usage_dir(name).ok().and_then(|dir| {
            if v2 {
                let text = fs::read_to_string(dir.join("cpu.stat")).ok()?;
                keyed(&text, "usage_usec").map(|us| us.saturating_mul(1000))
            } else {
                read_u64(&dir.join("cpuacct.usage"))
            }
        });
        let memory = self
            .driver
            .dir(Controller::Memory, name)
            .ok()
            .and_then(|dir| {
                let (usage, stat) = if v2 {
                    ("memory.current", "memory.stat")
                } else {
                    ("memory.usage_in_bytes", "memory.stat")
                };
                let usage = read_u64(&dir.join(usage))?;
                let stat = fs::read_to_string(dir.join(stat)).unwrap_or_default();
                Some(if v2 {
                    memory_v2(usage, &stat)
                } else {
                    memory_v1(usage, &stat)
                })
            });
        let processes = processes
            .then(|| self.driver.dir(Controller::Pids, name).ok())
            .flatten()
            .and_then(|dir| read_u64(&dir.join("pids.current")));
        CgroupUsage {
            cpu_nanos,
            memory,
            processes,
        }
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
