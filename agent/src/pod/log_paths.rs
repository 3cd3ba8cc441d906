//! Where the runtime writes a pod's container logs, as the kubelet lays them out: the sandbox's
//! log directory `<pod-logs-dir>/<namespace>_<name>_<uid>`, and in it each container instance's
//! `<container>/<restart count>.log` (the container's CRI `log_path`, relative to the sandbox's).
use std::path::{Path, PathBuf};

/// The log directory of a pod's sandboxes.
pub fn pod_log_dir(pod_logs_dir: &Path, namespace: &str, name: &str, uid: &str) -> PathBuf {
    pod_logs_dir.join(format!("{namespace}_{name}_{uid}"))
}

/// A container instance's log, relative to its pod's log directory.
pub fn container_log(container: &str, restart_count: u32) -> String {
    format!("{container}/{restart_count}.log")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubelets_layout() {
        let dir = pod_log_dir(Path::new("/var/log/pods"), "ns", "web", "u-1");
        assert_eq!(dir, Path::new("/var/log/pods/ns_web_u-1"));
        assert_eq!(
            dir.join(container_log("main", 3)),
            Path::new("/var/log/pods/ns_web_u-1/main/3.log")
        );
    }
}
