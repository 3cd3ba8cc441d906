//! What pods leave behind outside the runtime, found and removed by housekeeping ([`Orphans`]):
//! pod cgroups, pod log directories and pod state directories no pod owns any more (a pod deleted
//! while the agent was down, or a kill cut short between removing the sandbox and removing its
//! logs). One orphaned at two passes in a row is removed (a pod whose first sync is creating its
//! directory right now is known by the next pass).
//!
//! The scans (these directories, and the pod cgroups in every hierarchy) cost tens of directory
//! reads at a few hundred pods, so housekeeping runs them only when an orphan can have appeared
//! ([`OrphanScans`]): a pod it knew is gone, the last scan left one to confirm or to retry, or
//! [`ORPHAN_SCAN_PERIOD`] has passed (an orphan no departure explains: one made by hand, or left
//! by a previous life and missed by the first scan).
use crate::cm::ContainerManager;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Longest time between two orphan scans when no pod left.
pub const ORPHAN_SCAN_PERIOD: Duration = Duration::from_secs(30);

/// Which housekeeping passes scan for orphans (see the module docs).
#[derive(Debug, Default)]
pub struct OrphanScans {
    /// Every UID housekeeping called known since the last scan began.
    known_since: HashSet<String>,
    /// When the last scan began.
    last: Option<Instant>,
    /// The last scan left an orphan to confirm on the next pass, or failed to remove one.
    pending: bool,
    /// A scan runs now.
    running: bool,
}

impl OrphanScans {
    /// Whether a housekeeping pass that knows the UIDs `known` at `now` scans; a true answer
    /// marks the scan begun (no other begins until [`Self::finish`]).
    pub fn begin(&mut self, known: &HashSet<String>, now: Instant) -> bool {
        let left = self.known_since.iter().any(|uid| !known.contains(uid));
        for uid in known {
            if !self.known_since.contains(uid) {
                self.known_since.insert(uid.clone());
            }
        }
        let due = left
            || self.pending
            || self
                .last
                .is_none_or(|t| now.saturating_duration_since(t) >= ORPHAN_SCAN_PERIOD);
        if self.running || !due {
            return false;
        }
        self.running = true;
        self.last = Some(now);
        self.known_since.clone_from(known);
        true
    }

    /// The scan [`Self::begin`] allowed has ended; `pending` when it left work for the next pass.
    pub fn finish(&mut self, pending: bool) {
        self.running = false;
        self.pending = pending;
    }
}

/// Housekeeping's orphan finder (cheap to clone: clones share what the scans saw).
#[derive(Clone)]
pub struct Orphans {
    /// The pod cgroups.
    cm: ContainerManager,
    /// Where the pods' log directories are (`<namespace>_<name>_<uid>`).
    pod_logs_dir: PathBuf,
    /// Where the pods' state directories are (`<root-dir>/pods/<uid>`).
    pods_dir: PathBuf,
    /// Pod log and state directories found orphaned at the last scan.
    dirs: Arc<Mutex<HashSet<PathBuf>>>,
    /// When housekeeping scans.
    scans: Arc<Mutex<OrphanScans>>,
}

impl Orphans {
    pub fn new(cm: ContainerManager, pod_logs_dir: PathBuf, pods_dir: PathBuf) -> Self {
        Self {
            cm,
            pod_logs_dir,
            pods_dir,
            dirs: Arc::default(),
            scans: Arc::default(),
        }
    }

    fn scans(&self) -> MutexGuard<'_, OrphanScans> {
        self.scans.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn dirs(&self) -> MutexGuard<'_, HashSet<PathBuf>> {
        self.dirs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether this housekeeping pass, knowing the pods `known`, scans for orphans
    /// ([`OrphanScans::begin`]); after a true answer call [`Self::scan`].
    pub fn begin_scan(&self, known: &HashSet<String>) -> bool {
        self.scans().begin(known, Instant::now())
    }

    /// The scan [`Self::begin_scan`] allowed: removes the orphaned pod cgroups and pod
    /// directories of UIDs not in `known`, then marks the scan ended (the next pass scans again
    /// if it left an orphan seen once or one it failed to remove). Blocking: walks the cgroup
    /// tree and the directories, kills leftovers, retries rmdir; call it off the async threads.
    pub fn scan(&self, known: &HashSet<String>) {
        if let Some(due) = self.cm.orphaned_pod_cgroups(&|uid| known.contains(uid))
            && !due.is_empty()
        {
            self.cm.remove_orphans(&due);
        }
        self.remove_orphaned_pod_dirs(&|uid| known.contains(uid));
        let pending = !self.dirs().is_empty() || self.cm.orphans_pending();
        self.scans().finish(pending);
    }

    /// Removes the pod log directories (`<namespace>_<name>_<uid>` below the pod logs dir) and
    /// the pod state directories (`<uid>` below `<root-dir>/pods`: termination message files and
    /// volumes, torn down first by `volume::remove_pod_dir`, which leaves a mount point alone) of
    /// UIDs `known` says no to that were orphaned at the previous call too; returns how many
    /// were removed. Entries of any other shape, and anything but plain directories, are left
    /// alone. Blocking: call it off the async threads.
    pub fn remove_orphaned_pod_dirs(&self, known: &dyn Fn(&str) -> bool) -> usize {
        let mut orphaned = HashSet::new();
        let kinds: [(&Path, UidOf); 2] = [
            (&self.pod_logs_dir, log_dir_uid),
            (&self.pods_dir, state_dir_uid),
        ];
        for (parent, uid_of) in kinds {
            let entries = match std::fs::read_dir(parent) {
                Ok(rd) => rd,
                Err(e) => {
                    if e.kind() != std::io::ErrorKind::NotFound {
                        tracing::warn!(dir = %parent.display(), %e, "listing pod directories");
                    }
                    continue;
                }
            };
            for entry in entries.flatten() {
                let name = entry.file_name();
                let Some(uid) = name.to_str().and_then(uid_of) else {
                    continue;
                };
                if !known(uid) && entry.file_type().is_ok_and(|t| t.is_dir()) {
                    orphaned.insert(parent.join(&name));
                }
            }
        }
        let mut previous = self.dirs();
        let due: Vec<PathBuf> = orphaned.intersection(&previous).cloned().collect();
        *previous = orphaned;
        drop(previous);
        let mut removed = 0;
        for dir in due {
            let what = if dir.starts_with(&self.pods_dir) {
                "state"
            } else {
                "log"
            };
            let result = if what == "state" {
                // Volumes are torn down first; a mount point left below stops the removal.
                let uid = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
                crate::volume::remove_pod_dir(&self.pods_dir, uid)
                    .map_err(|e| std::io::Error::other(e.to_string()))
            } else {
                std::fs::remove_dir_all(&dir)
            };
            match result {
                Ok(()) => {
                    tracing::info!(dir = %dir.display(), "removed the {what} directory of a pod that is gone");
                    removed += 1;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), %e, "removing an orphaned pod directory")
                }
            }
        }
        removed
    }
}

/// Reads the pod UID from the name of a directory entry.
type UidOf = fn(&str) -> Option<&str>;

/// The pod UID of a pod state directory name (the UID itself).
fn state_dir_uid(name: &str) -> Option<&str> {
    (!name.is_empty() && !name.starts_with('.') && !name.contains('_')).then_some(name)
}

/// The pod UID of a pod log directory name `<namespace>_<name>_<uid>`; `None` for any other
/// name (namespaces, names and UIDs never contain `_`).
fn log_dir_uid(name: &str) -> Option<&str> {
    let mut parts = name.split('_');
    let (ns, pod, uid) = (parts.next()?, parts.next()?, parts.next()?);
    let plain = |s: &str| !s.is_empty() && !s.starts_with('.');
    (parts.next().is_none() && plain(ns) && plain(pod) && plain(uid)).then_some(uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manager(logs: &std::path::Path, mount: &std::path::Path) -> Orphans {
        let cm = crate::cm::ContainerManager::new(crate::cm::Config {
            cgroup_root: "/t".into(),
            cgroups_per_qos: true,
            mount: mount.into(),
            pod_pids_limit: -1,
        });
        Orphans::new(cm, logs.into(), logs.join("state"))
    }

    fn uids(list: &[&str]) -> HashSet<String> {
        list.iter().map(|u| (*u).to_owned()).collect()
    }

    #[test]
    fn orphans_are_scanned_for_when_a_pod_left_something_is_pending_or_the_period_passed() {
        let mut scans = OrphanScans::default();
        let t0 = Instant::now();
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        // The first pass scans (a previous life's leftovers); none begins while it runs.
        assert!(scans.begin(&uids(&["a", "b"]), at(0)));
        assert!(!scans.begin(&uids(&["a"]), at(2)), "one scan at a time");
        scans.finish(false);
        // "b" left while the scan ran: the next pass scans.
        assert!(scans.begin(&uids(&["a"]), at(4)));
        scans.finish(false);
        // Nothing left, nothing pending: no scan until the period has passed; new pods change
        // nothing.
        assert!(!scans.begin(&uids(&["a", "c"]), at(6)));
        assert!(!scans.begin(&uids(&["a", "c", "d"]), at(8)));
        // A pod that came and went between two scans counts as one that left.
        assert!(scans.begin(&uids(&["a", "c"]), at(10)));
        scans.finish(true);
        // The last scan left an orphan to confirm: the next pass scans.
        assert!(scans.begin(&uids(&["a", "c"]), at(12)));
        scans.finish(false);
        assert!(!scans.begin(&uids(&["a", "c"]), at(14)));
        assert!(
            scans.begin(&uids(&["a", "c"]), at(12 + ORPHAN_SCAN_PERIOD.as_secs())),
            "the period passed"
        );
        scans.finish(false);
    }

    #[test]
    fn names_that_are_not_pod_log_directories_are_ignored() {
        assert_eq!(log_dir_uid("default_web_u-1"), Some("u-1"));
        for name in ["web", "a_b", "a_b_c_d", "_b_c", "a__c", ".x_b_c", "a_b_.c"] {
            assert_eq!(log_dir_uid(name), None, "{name}");
        }
    }

    #[tokio::test]
    async fn an_orphaned_log_directory_goes_at_the_second_pass_and_nothing_else_does() {
        let logs = tempfile::tempdir().expect("tempdir");
        let mount = tempfile::tempdir().expect("tempdir");
        let m = manager(logs.path(), mount.path());
        for dir in ["ns_live_u1", "ns_gone_u2", "ns_late_u3", "not-a-pod-dir"] {
            std::fs::create_dir(logs.path().join(dir)).expect("mkdir");
        }
        std::fs::write(logs.path().join("ns_gone_u2/main.log"), "x").expect("write");
        // A file of the right shape is not a directory: left alone.
        std::fs::write(logs.path().join("ns_file_u4"), "x").expect("write");
        let known = |uid: &str| uid == "u1";
        assert_eq!(
            m.remove_orphaned_pod_dirs(&known),
            0,
            "first pass only notes"
        );
        // u3's pod turned up in between: its directory stays.
        let known_now = |uid: &str| uid == "u1" || uid == "u3";
        assert_eq!(m.remove_orphaned_pod_dirs(&known_now), 1);
        let mut left: Vec<String> = std::fs::read_dir(logs.path())
            .expect("ls")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            ["not-a-pod-dir", "ns_file_u4", "ns_late_u3", "ns_live_u1"]
        );
    }
}
