//! Housekeeping of pod cgroups: finding the ones no pod owns any more and removing them, killing
//! what still runs in them. Everything here blocks (directory walks, kills, retries with sleeps):
//! run it off the async threads.
use super::*;

impl ContainerManager {
    /// The UIDs of the pod cgroups (`pod<uid>`, or the systemd driver's slices) under this agent's cgroup root, in any hierarchy (the
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
            // Each pod is in every hierarchy: a set, not a search of `out` per entry (at 250
            // pods and a dozen v1 hierarchies that search cost more than the directory reads).
            let mut seen: std::collections::HashSet<String> = std::collections::HashSet::new();
            for dir in dirs {
                let Ok(entries) = fs::read_dir(&dir) else {
                    continue;
                };
                for e in entries.flatten() {
                    let name = e.file_name();
                    let Some(uid) = name.to_str().and_then(crate::pod::cgroup_name::pod_uid_of)
                    else {
                        continue;
                    };
                    if !seen.contains(uid.as_ref()) && e.file_type().is_ok_and(|t| t.is_dir()) {
                        seen.insert(uid.to_string());
                        out.push((uid.into_owned(), qos));
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

    /// Whether the last [`Self::orphaned_pod_cgroups`] left an orphaned pod cgroup to confirm or
    /// to remove (seen once, over [`ORPHANS_PER_PASS`], or its removal failed).
    pub fn orphans_pending(&self) -> bool {
        !self.state().orphans.is_empty()
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

pub(super) fn remove_tree(dir: &Path) -> Result<()> {
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
        // A process, never a group: 0 and negative numbers (not in a cgroup.procs) are skipped.
        let procs = pids.into_iter().filter(|&p| p > 0);
        for pid in procs.filter_map(rustix::process::Pid::from_raw) {
            // Best effort: one that exited meanwhile is gone anyway.
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    match fs::remove_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err("removing cgroup", dir)(e)),
    }
}
