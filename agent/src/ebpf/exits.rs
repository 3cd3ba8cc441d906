//! Container exits as the kernel saw them, for the PLEG's fast path.
//!
//! [`Exits`] follows every container cgroup created below a pod cgroup (`.../pod<uid>/<id>` on
//! the cgroup2 hierarchy), the first process other than the OCI runtime's helper to exec there
//! (the container's main process) and that process's exit. It reports a [`KernelExit`] when the
//! main process exits and again when the container cgroup is removed, with the main process's
//! exit code when it was seen. The PLEG then relists that one pod at once instead of waiting for
//! its periodic relist.
//!
//! Memory is bounded: at most [`MAX_CONTAINERS`] container cgroups are followed (a cgroup whose
//! removal the probes lost would otherwise stay forever); past that the oldest is forgotten and
//! the loss counted. Reports go on a bounded channel; a full channel drops the report and counts
//! it. Nothing is dropped silently: `swiftlet_ebpf_exits_dropped_total{reason}` counts both, and
//! the periodic relist still finds every exit.
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::mpsc;

use super::{CgroupEventKind, KernelEvent, Monitor};
use crate::metrics::{Metrics, ReasonLabel};

/// How many container cgroups are followed at most.
pub const MAX_CONTAINERS: usize = 16_384;
/// Capacity of the channel to the PLEG.
pub const CHANNEL_CAPACITY: usize = 1024;
/// The hierarchy id of cgroup2 (`0::/...` in `/proc/<pid>/cgroup`).
const CGROUP2_HIERARCHY: u32 = 0;

/// What the eBPF probes saw end in a pod: a container's main process exited, or its cgroup was
/// removed, with the main process's exit code and time when seen. Asks for a relist of the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelExit {
    pub uid: String,
    /// The container's id (its cgroup's name), when known.
    pub container_id: Option<String>,
    /// The container-style exit code and the exit's wall-clock time in Unix nanoseconds.
    pub exit: Option<(i32, i64)>,
    /// Reported by the removal of the container's cgroup: the container has ended, whatever
    /// the runtime's record of its start says (its process may exit before the runtime notes
    /// that it started).
    pub gone: bool,
}

/// True for the command name of an OCI runtime's helper process (runc's `runc init` and its
/// `runc:[N:STAGE]` stages, crun), which execs in a container cgroup before the container does.
pub fn is_runtime_helper(comm: &str) -> bool {
    comm == "runc" || comm == "crun" || comm.starts_with("runc:[")
}

/// `(pod uid, child)` when `path` names a pod cgroup `.../pod<uid>` (child `None`) or a cgroup
/// right below one (`.../pod<uid>/<child>`), in either driver's spelling
/// ([`crate::pod::cgroup_name`]): a systemd container scope is named by its container ID.
pub fn pod_of_path(path: &str) -> Option<(Cow<'_, str>, Option<&str>)> {
    use crate::pod::cgroup_name::{container_id_of, pod_uid_of};
    let mut parts = path.rsplit('/').filter(|p| !p.is_empty());
    let last = parts.next()?;
    if let Some(uid) = pod_uid_of(last) {
        return Some((uid, None));
    }
    let parent = parts.next()?;
    pod_uid_of(parent).map(|uid| (uid, Some(container_id_of(last))))
}

/// A container's main process: its tgid and, once it exited, (exit code, CLOCK_MONOTONIC ns).
type MainProcess = (u32, Option<(Option<i32>, u64)>);

/// The tgid of a container found already running ([`Exits::adopt_running`]): its main process
/// is not known, no process exec'd in it later is taken for it (an exec probe's, say), and only
/// the cgroup's removal reports its end.
const UNKNOWN_MAIN: u32 = 0;

/// How deep below the pod root container cgroups are (`<qos>/pod<uid>/<id>`, or the systemd
/// driver's slices and scopes).
const MAX_DEPTH: usize = 4;

/// One followed container cgroup.
#[derive(Debug)]
struct Container {
    uid: String,
    id: String,
    created_ns: u64,
    main: Option<MainProcess>,
}

/// Follows container cgroups and reports their exits. Owned by the task that reads the probes'
/// events; feed it every event with [`Exits::observe`].
pub struct Exits {
    containers: HashMap<u64, Container>,
    tx: mpsc::Sender<KernelExit>,
    metrics: Metrics,
    /// Reports lost on the way (a full table or channel), for [`KernelPath`].
    missed: Arc<AtomicU64>,
    /// Converts a CLOCK_MONOTONIC stamp to Unix nanoseconds.
    wall_clock: fn(u64) -> i64,
}

/// Whether the kernel path reports every container exit: the probes are loaded with the process
/// probes, their reader runs, and nothing was lost on the way (in the kernel's ring, undecoded,
/// or dropped by [`Exits`]). The PLEG relists rarely while this holds (see [`crate::pleg`]).
/// Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct KernelPath {
    monitor: Option<Monitor>,
    missed: Arc<AtomicU64>,
}

impl KernelPath {
    /// Events missed so far, or `None` when nothing reports exits (no probes, no process probes,
    /// or the reader stopped). A count that grows means an exit may have been missed.
    pub fn missed(&self) -> Option<u64> {
        let monitor = self.monitor.as_ref()?;
        if monitor.pod_cgroup_dir().is_none() || !monitor.reader_running() {
            return None;
        }
        Some(
            monitor
                .events_lost()
                .saturating_add(self.missed.load(Ordering::Relaxed)),
        )
    }
}

impl Exits {
    /// A detector reporting to a new bounded channel, whose receiver is returned.
    pub fn new(metrics: Metrics) -> (Self, mpsc::Receiver<KernelExit>) {
        let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
        let exits = Self {
            containers: HashMap::new(),
            tx,
            metrics,
            missed: Arc::default(),
            wall_clock: wall_clock_of,
        };
        (exits, rx)
    }

    /// The health of the path from `monitor`'s probes through this detector.
    pub fn kernel_path(&self, monitor: Option<Monitor>) -> KernelPath {
        KernelPath {
            monitor,
            missed: Arc::clone(&self.missed),
        }
    }

    /// Follows the container cgroups already below `root` (the pod cgroup2 directory), so the
    /// containers of pods a restarted agent adopts report their end too: their cgroup's removal
    /// (their main process is not known). Call it after the probes are attached and before the
    /// events queued since are observed: a cgroup made meanwhile is then followed from its own
    /// creation event. Returns how many were adopted.
    pub fn adopt_running(&mut self, root: &Path) -> usize {
        let mut found = Vec::new();
        find_container_cgroups(root, MAX_DEPTH, &mut found);
        let n = found.len();
        for (cgroup_id, uid, id) in found {
            self.follow(cgroup_id, &uid, &id, 0);
            if let Some(c) = self.containers.get_mut(&cgroup_id) {
                c.main = Some((UNKNOWN_MAIN, None));
            }
        }
        n
    }

    /// How many container cgroups are followed now.
    pub fn followed(&self) -> usize {
        self.containers.len()
    }

    fn dropped(&self, reason: &'static str) {
        self.missed.fetch_add(1, Ordering::Relaxed);
        self.metrics
            .ebpf_exits_dropped_total
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    fn report(&self, uid: &str, id: &str, exit: Option<(i32, u64)>, gone: bool) {
        let report = KernelExit {
            uid: uid.to_owned(),
            container_id: Some(id.to_owned()),
            exit: exit.map(|(code, ktime)| (code, (self.wall_clock)(ktime))),
            gone,
        };
        match self.tx.try_send(report) {
            Ok(()) => {
                self.metrics.ebpf_exits_total.inc();
            }
            Err(mpsc::error::TrySendError::Full(_)) => self.dropped("channel_full"),
            // The PLEG stopped: the agent is shutting down.
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    /// Takes one event from the probes.
    pub fn observe(&mut self, event: &KernelEvent) {
        match event {
            KernelEvent::Cgroup(e) if e.hierarchy_id == CGROUP2_HIERARCHY => {
                let Some((uid, Some(child))) = pod_of_path(&e.path) else {
                    return;
                };
                match e.kind {
                    CgroupEventKind::Mkdir => self.follow(e.cgroup_id, &uid, child, e.ktime_ns),
                    CgroupEventKind::Rmdir => {
                        let Some(c) = self.containers.remove(&e.cgroup_id) else {
                            return;
                        };
                        // The cgroup goes once the container is gone: its main process's exit
                        // (when seen) is the container's.
                        let exit = c
                            .main
                            .and_then(|(_, exit)| exit)
                            .and_then(|(code, ktime)| Some((code?, ktime)));
                        self.report(&c.uid, &c.id, exit, true);
                    }
                }
            }
            KernelEvent::Exec(e) => {
                // The OCI runtime's own helper execs in the cgroup first and exits before the
                // container's process runs: its exit is not the container's.
                if is_runtime_helper(&e.comm) {
                    return;
                }
                if let Some(c) = self.containers.get_mut(&e.cgroup_id) {
                    match &mut c.main {
                        Some((_, None)) => {}
                        // The first process, or a new one after the main process exited.
                        main => *main = Some((e.tgid, None)),
                    }
                }
            }
            KernelEvent::Exit(e) => {
                let Some(c) = self.containers.get_mut(&e.cgroup_id) else {
                    return;
                };
                let Some((tgid, exit @ None)) = &mut c.main else {
                    return;
                };
                if *tgid != e.tgid {
                    return;
                }
                *exit = Some((e.exit_code, e.ktime_ns));
                // A helper under a name `is_runtime_helper` does not know may still be taken
                // for the main process: the status ignores an exit from before the container
                // started.
                let code = e.exit_code.map(|code| (code, e.ktime_ns));
                let (uid, id) = (c.uid.clone(), c.id.clone());
                self.report(&uid, &id, code, false);
            }
            KernelEvent::Cgroup(_) | KernelEvent::Cri(_) => {}
        }
    }

    fn follow(&mut self, cgroup_id: u64, uid: &str, id: &str, created_ns: u64) {
        if self.containers.len() >= MAX_CONTAINERS && !self.containers.contains_key(&cgroup_id) {
            // Most likely a cgroup whose removal was lost: forget the oldest.
            if let Some(oldest) = self
                .containers
                .iter()
                .min_by_key(|(_, c)| c.created_ns)
                .map(|(k, _)| *k)
            {
                self.containers.remove(&oldest);
                self.dropped("table_full");
            }
        }
        self.containers.insert(
            cgroup_id,
            Container {
                uid: uid.to_owned(),
                id: id.to_owned(),
                created_ns,
                main: None,
            },
        );
    }
}

/// The container cgroups below `dir` (at most `depth` levels), as (cgroup id, pod UID,
/// container id): on cgroup2 a cgroup's id is its directory's inode number. Unreadable
/// directories are skipped (a cgroup removed during the walk).
fn find_container_cgroups(dir: &Path, depth: usize, found: &mut Vec<(u64, String, String)>) {
    use std::os::unix::fs::MetadataExt as _;
    if depth == 0 {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let path = entry.path();
        let Some(text) = path.to_str() else { continue };
        match pod_of_path(text) {
            Some((uid, Some(id))) => {
                if let Ok(meta) = std::fs::metadata(&path) {
                    found.push((meta.ino(), uid.into_owned(), id.to_owned()));
                }
            }
            _ => find_container_cgroups(&path, depth - 1, found),
        }
    }
}

/// The wall-clock time (Unix nanoseconds) of a CLOCK_MONOTONIC stamp: now minus how long ago.
pub fn wall_clock_of(ktime_ns: u64) -> i64 {
    let ago = monotonic_ns().saturating_sub(ktime_ns);
    let now = jiff::Timestamp::now().as_nanosecond();
    i64::try_from(now - i128::from(ago)).unwrap_or(0)
}

/// CLOCK_MONOTONIC now, in nanoseconds (the clock `bpf_ktime_get_ns` reads).
pub fn monotonic_ns() -> u64 {
    // CLOCK_MONOTONIC always exists on Linux: this cannot fail.
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ebpf::{CgroupEvent, ProcessEvent};

    fn cgroup(kind: CgroupEventKind, path: &str, id: u64, at: u64) -> KernelEvent {
        KernelEvent::Cgroup(CgroupEvent {
            kind,
            path: path.into(),
            level: 3,
            ktime_ns: at,
            hierarchy_id: CGROUP2_HIERARCHY,
            cgroup_id: id,
        })
    }

    fn process(cgroup_id: u64, tgid: u32, at: u64, exit_code: Option<i32>) -> ProcessEvent {
        ProcessEvent {
            ktime_ns: at,
            pid: tgid,
            tgid,
            cgroup_id,
            comm: "sleep".into(),
            exit_code,
        }
    }

    type Report = (String, Option<String>, Option<i32>, bool);

    fn drain(rx: &mut mpsc::Receiver<KernelExit>) -> Vec<Report> {
        let mut got = Vec::new();
        while let Ok(e) = rx.try_recv() {
            got.push((e.uid, e.container_id, e.exit.map(|(code, _)| code), e.gone));
        }
        got
    }

    fn dropped(metrics: &Metrics, reason: &'static str) -> u64 {
        metrics
            .ebpf_exits_dropped_total
            .get_or_create(&ReasonLabel { reason })
            .get()
    }

    #[test]
    fn pod_paths() {
        let read = |path| pod_of_path(path).map(|(uid, child)| (uid.into_owned(), child));
        assert_eq!(read("/kubepods/podu1"), Some(("u1".into(), None)));
        assert_eq!(
            read("/kubepods/burstable/podu1/c1"),
            Some(("u1".into(), Some("c1")))
        );
        assert_eq!(read("/kubepods/burstable"), None);
        assert_eq!(read("/"), None);
        // The systemd driver's slices and containerd's scopes.
        assert_eq!(
            read("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podu_1.slice"),
            Some(("u-1".into(), None))
        );
        assert_eq!(
            read("/kubepods.slice/kubepods-podu_1.slice/cri-containerd-c1.scope"),
            Some(("u-1".into(), Some("c1")))
        );
        assert_eq!(read("/kubepods.slice/kubepods-besteffort.slice"), None);
        assert!(is_runtime_helper("runc:[2:INIT]") && is_runtime_helper("crun"));
        assert!(!is_runtime_helper("runcible") && !is_runtime_helper("sh"));
    }

    #[test]
    fn the_main_process_exit_and_the_cgroup_removal_are_reported() {
        let metrics = Metrics::new();
        let (mut exits, mut rx) = Exits::new(metrics.clone());
        let path = "/kubepods/besteffort/podu1/c1";
        exits.observe(&cgroup(CgroupEventKind::Mkdir, path, 7, 1));
        let helper = |at: u64, code: Option<i32>| ProcessEvent {
            comm: "runc".into(),
            ..process(7, 10, at, code)
        };
        // runc's helper execs and exits first; then the container's process and its child.
        exits.observe(&KernelEvent::Exec(helper(2, None)));
        exits.observe(&KernelEvent::Exit(helper(3, Some(0))));
        exits.observe(&KernelEvent::Exec(process(7, 11, 4, None)));
        exits.observe(&KernelEvent::Exec(process(7, 12, 5, None)));
        exits.observe(&KernelEvent::Exit(process(7, 12, 6, Some(0))));
        exits.observe(&KernelEvent::Exit(process(7, 11, 7, Some(3))));
        exits.observe(&cgroup(CgroupEventKind::Rmdir, path, 7, 8));
        let c1 = Some("c1".to_owned());
        assert_eq!(
            drain(&mut rx),
            [
                ("u1".to_owned(), c1.clone(), Some(3), false),
                ("u1".to_owned(), c1, Some(3), true),
            ],
            "the main process's exit (not the runtime helper's, nor its child's), then the \
             cgroup's removal with the main process's code"
        );
        assert_eq!(exits.followed(), 0, "a removed cgroup is forgotten");
        assert_eq!(metrics.ebpf_exits_total.get(), 2);
    }

    #[test]
    fn the_table_is_bounded_and_a_forgotten_container_is_counted() {
        let metrics = Metrics::new();
        let (mut exits, mut rx) = Exits::new(metrics.clone());
        for i in 0..=MAX_CONTAINERS as u64 {
            let path = format!("/kubepods/podu{i}/c{i}");
            exits.observe(&cgroup(CgroupEventKind::Mkdir, &path, i, i + 1));
        }
        assert_eq!(exits.followed(), MAX_CONTAINERS);
        assert_eq!(dropped(&metrics, "table_full"), 1);
        // The oldest (cgroup 0) is no longer followed: its exit is not reported by the fast
        // path (the periodic relist finds it); the newest still is.
        exits.observe(&KernelEvent::Exec(process(0, 5, 10, None)));
        exits.observe(&KernelEvent::Exit(process(0, 5, 11, Some(1))));
        assert!(drain(&mut rx).is_empty());
        let newest = MAX_CONTAINERS as u64;
        exits.observe(&KernelEvent::Exec(process(newest, 6, 12, None)));
        exits.observe(&KernelEvent::Exit(process(newest, 6, 13, Some(2))));
        assert_eq!(drain(&mut rx).len(), 1);
    }

    #[test]
    fn running_containers_are_adopted_and_report_only_their_cgroups_removal() {
        use std::os::unix::fs::MetadataExt as _;
        let root = tempfile::tempdir().unwrap();
        let c1 = root.path().join("besteffort/podu1/c1");
        let c2 = root.path().join("podu2/c2");
        for dir in [&c1, &c2] {
            std::fs::create_dir_all(dir).unwrap();
        }
        // Deeper than a container cgroup: not followed.
        std::fs::create_dir_all(c2.join("nested")).unwrap();
        let metrics = Metrics::new();
        let (mut exits, mut rx) = Exits::new(metrics.clone());
        assert_eq!(exits.adopt_running(root.path()), 2);
        let id = std::fs::metadata(&c1).unwrap().ino();
        // A process exec'd later (an exec probe's) is not taken for the main process.
        exits.observe(&KernelEvent::Exec(process(id, 40, 1, None)));
        exits.observe(&KernelEvent::Exit(process(id, 40, 2, Some(1))));
        assert!(
            drain(&mut rx).is_empty(),
            "an exec'd process's exit is not the container's"
        );
        let path = c1.to_str().unwrap();
        exits.observe(&cgroup(CgroupEventKind::Rmdir, path, id, 3));
        assert_eq!(
            drain(&mut rx),
            [("u1".to_owned(), Some("c1".to_owned()), None, true)],
            "the removal reports the end, the code left to the runtime's record"
        );
        assert_eq!(exits.followed(), 1);
    }

    #[test]
    fn drops_make_the_kernel_path_untrusted() {
        let metrics = Metrics::new();
        let (mut exits, rx) = Exits::new(metrics.clone());
        let path = exits.kernel_path(None);
        assert_eq!(path.missed(), None, "without probes nothing reports exits");
        for i in 0..CHANNEL_CAPACITY as u64 + 2 {
            let p = format!("/kubepods/podu{i}/c{i}");
            exits.observe(&cgroup(CgroupEventKind::Mkdir, &p, i, 1));
            exits.observe(&cgroup(CgroupEventKind::Rmdir, &p, i, 2));
        }
        assert_eq!(exits.missed.load(Ordering::Relaxed), 2);
        drop(rx);
    }

    #[test]
    fn a_full_channel_drops_and_counts() {
        let metrics = Metrics::new();
        let (mut exits, rx) = Exits::new(metrics.clone());
        for i in 0..CHANNEL_CAPACITY as u64 + 3 {
            let path = format!("/kubepods/podu{i}/c{i}");
            exits.observe(&cgroup(CgroupEventKind::Mkdir, &path, i, 1));
            exits.observe(&cgroup(CgroupEventKind::Rmdir, &path, i, 2));
        }
        assert_eq!(dropped(&metrics, "channel_full"), 3);
        assert_eq!(metrics.ebpf_exits_total.get(), CHANNEL_CAPACITY as u64);
        drop(rx);
    }
}
