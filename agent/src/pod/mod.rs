//! The pod domain model: the lowest layer of the agent. It imports no other swiftlet module;
//! every other module may import it.
//!
//! What lives here is what the kubelet keeps in its `kubecontainer` package and its QoS and
//! resource helpers: a pod's full name and grace period, whether it is static or a mirror,
//! which containers are sidecars, the pod phase and restart policy as enums, the runtime's view
//! of a pod ([`state`]), the CRI label and annotation keys ([`labels`]), the annotation keys the
//! config layer stamps ([`annotations`]), the probe results shared by prober, status and
//! runtime ([`probe_results`]) and the active deadline's arithmetic ([`deadline`]).
use k8s_openapi::api::core::v1::{Container, Pod};

pub mod admission;
pub mod annotations;
pub mod api_references;
pub mod cgroup_name;
pub mod deadline;
pub mod downward;
pub mod labels;
pub mod log_paths;
pub mod probe_results;
pub mod qos;
pub mod quantity;
pub mod resources;
pub mod state;

pub use qos::{QosClass, pod_qos};
pub use state::{ContainerKind, ListedPod, PodState, RelistEntry};

/// The grace period the API server gives a pod that names none.
pub const DEFAULT_GRACE_SECS: i64 = 30;

/// Makes directory `dir` below a pod's directory, and every missing one above it, with the
/// kubelet's mode for a pod's directories (0750, less what the umask takes): no other local
/// user may enter them. An existing directory is left as it is.
pub fn pod_dirs(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(dir)
}

/// Takes group write and every permission of other users off `pods_dir` and each directory in
/// it, as [`pod_dirs`] makes them (an older build made them 0755, so any local user could read
/// a pod's files and rewrite its 0666 termination-message file). Directories are opened without
/// following a symlink and changed through their descriptors; other entries are skipped. The
/// number of directories changed; none when `pods_dir` does not exist.
pub fn tighten_pod_dirs(pods_dir: &std::path::Path) -> std::io::Result<usize> {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let tighten = |fd: &rustix::fd::OwnedFd| -> rustix::io::Result<bool> {
        let mode = rustix::fs::fstat(fd)?.st_mode & 0o7777;
        if mode & 0o027 == 0 {
            return Ok(false);
        }
        rustix::fs::fchmod(fd, Mode::from_raw_mode(mode & !0o027))?;
        Ok(true)
    };
    let top = match rustix::fs::open(pods_dir, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(0),
        Err(e) => return Err(e.into()),
    };
    let mut changed = usize::from(tighten(&top)?);
    for entry in rustix::fs::Dir::read_from(&top)? {
        let name = entry?.file_name().to_owned();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        match rustix::fs::openat(&top, name.as_c_str(), flags, Mode::empty()) {
            Ok(fd) => changed += usize::from(tighten(&fd)?),
            // Not a directory, a symlink, or gone meanwhile.
            Err(rustix::io::Errno::NOTDIR | rustix::io::Errno::LOOP | rustix::io::Errno::NOENT) => {
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(changed)
}

/// The pod's full name as the kubelet spells it: `<name>_<namespace>`.
pub fn full_name(pod: &Pod) -> String {
    format!(
        "{}_{}",
        pod.metadata.name.as_deref().unwrap_or_default(),
        namespace(pod)
    )
}

/// The pod's container (app containers first, then init containers) named `name`.
pub fn container<'a>(pod: &'a Pod, name: &str) -> Option<&'a Container> {
    pod.spec
        .iter()
        .flat_map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
        })
        .find(|c| c.name == name)
}

/// The pod's namespace (`default` when unset).
pub fn namespace(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("default")
}

/// Termination grace period of a pod in seconds: the deletion's, else the spec's, else 30.
pub fn grace_period_secs(pod: &Pod) -> i64 {
    pod.metadata
        .deletion_grace_period_seconds
        .or_else(|| {
            pod.spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
        })
        .unwrap_or(DEFAULT_GRACE_SECS)
}

/// The source that sent the pod (the annotation the config layer stamps), if any.
pub fn source(pod: &Pod) -> Option<&str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(annotations::CONFIG_SOURCE)
        .map(String::as_str)
}

/// A static pod: one from a file or a URL rather than from the API server.
pub fn is_static(pod: &Pod) -> bool {
    source(pod).is_some_and(|s| s != annotations::API_SOURCE)
}

/// The pod's priority (`spec.priority`, set by the API server from its priority class); 0
/// when unset.
pub fn priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

/// The lowest priority of a system-critical pod (`system-cluster-critical`).
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// A critical pod, as the kubelet defines it: static, mirror, or of system-critical priority.
/// Eviction never picks one, and admission makes room for one by preempting others.
pub fn is_critical(pod: &Pod) -> bool {
    is_static(pod) || is_mirror(pod) || priority(pod) >= SYSTEM_CRITICAL_PRIORITY
}

/// A mirror pod: the API server's copy of a static pod.
pub fn is_mirror(pod: &Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(annotations::CONFIG_MIRROR))
}

/// A sidecar: an init container with `restartPolicy: Always`, which keeps running beside the
/// app containers.
pub fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// The pod's lifecycle phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    Pending,
    Running,
    Succeeded,
    Failed,
    Unknown,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Running => "Running",
            Phase::Succeeded => "Succeeded",
            Phase::Failed => "Failed",
            Phase::Unknown => "Unknown",
        }
    }

    /// The phase a status string names; `None` for a string that names none.
    pub fn parse(s: &str) -> Option<Phase> {
        Some(match s {
            "Pending" => Phase::Pending,
            "Running" => Phase::Running,
            "Succeeded" => Phase::Succeeded,
            "Failed" => Phase::Failed,
            "Unknown" => Phase::Unknown,
            _ => return None,
        })
    }

    /// The phase of a status's `phase` field.
    pub fn of(phase: Option<&str>) -> Option<Phase> {
        phase.and_then(Phase::parse)
    }

    /// Succeeded or Failed: nothing of the pod runs again.
    pub fn is_terminal(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed)
    }
}

/// Whether `pod`'s own status (as its source gave it: the API server's) is in a terminal phase.
pub fn source_phase_is_terminal(pod: &Pod) -> bool {
    Phase::of(pod.status.as_ref().and_then(|s| s.phase.as_deref())).is_some_and(Phase::is_terminal)
}

/// The pod's restart policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RestartPolicy {
    #[default]
    Always,
    OnFailure,
    Never,
}

impl RestartPolicy {
    /// The pod's policy; unset (or a value the API does not define) is `Always`, the API default.
    pub fn of(pod: &Pod) -> RestartPolicy {
        match pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) {
            Some("OnFailure") => RestartPolicy::OnFailure,
            Some("Never") => RestartPolicy::Never,
            _ => RestartPolicy::Always,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            RestartPolicy::Always => "Always",
            RestartPolicy::OnFailure => "OnFailure",
            RestartPolicy::Never => "Never",
        }
    }

    /// Whether a container that exited with `exit_code` is started again under this policy.
    pub fn restarts_after(self, exit_code: i32) -> bool {
        match self {
            RestartPolicy::Always => true,
            RestartPolicy::OnFailure => exit_code != 0,
            RestartPolicy::Never => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;
    use std::collections::BTreeMap;

    #[test]
    fn pod_directories_an_older_build_made_open_are_tightened_without_following_links() {
        use std::os::unix::fs::PermissionsExt as _;
        let root = tempfile::tempdir().unwrap();
        let pods = root.path().join("pods");
        assert_eq!(tighten_pod_dirs(&pods).unwrap(), 0, "no pods directory yet");
        let mode = |p: &std::path::Path| {
            std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
        };
        let set = |p: &std::path::Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
        };
        let outside = root.path().join("outside");
        for d in [&pods, &pods.join("old"), &pods.join("new"), &outside] {
            std::fs::create_dir(d).unwrap();
        }
        set(&pods, 0o755);
        set(&pods.join("old"), 0o775);
        set(&pods.join("new"), 0o750);
        set(&outside, 0o755);
        std::os::unix::fs::symlink(&outside, pods.join("link")).unwrap();
        std::fs::write(pods.join("file"), "").unwrap();
        set(&pods.join("file"), 0o644);
        assert_eq!(tighten_pod_dirs(&pods).unwrap(), 2);
        assert_eq!(mode(&pods), 0o750);
        assert_eq!(mode(&pods.join("old")), 0o750);
        assert_eq!(mode(&pods.join("new")), 0o750);
        assert_eq!(mode(&outside), 0o755, "a symlink is not followed");
        assert_eq!(mode(&pods.join("file")), 0o644, "only directories");
        assert_eq!(
            tighten_pod_dirs(&pods).unwrap(),
            0,
            "nothing left to change"
        );
    }

    fn pod(annotations: &[(&str, &str)], policy: Option<&str>) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("web".into());
        p.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<BTreeMap<_, _>>(),
        );
        p.spec = Some(PodSpec {
            restart_policy: policy.map(str::to_owned),
            ..Default::default()
        });
        p
    }

    #[test]
    fn names_and_grace() {
        let mut p = pod(&[], None);
        assert_eq!(full_name(&p), "web_default");
        assert_eq!(grace_period_secs(&p), 30);
        if let Some(s) = p.spec.as_mut() {
            s.termination_grace_period_seconds = Some(5);
        }
        assert_eq!(grace_period_secs(&p), 5);
        p.metadata.deletion_grace_period_seconds = Some(1);
        assert_eq!(grace_period_secs(&p), 1, "the deletion's grace wins");
        p.metadata.namespace = Some("kube-system".into());
        assert_eq!(full_name(&p), "web_kube-system");
    }

    #[test]
    fn static_and_mirror() {
        assert!(is_static(&pod(
            &[(annotations::CONFIG_SOURCE, "file")],
            None
        )));
        assert!(is_static(&pod(
            &[(annotations::CONFIG_SOURCE, "http")],
            None
        )));
        assert!(!is_static(&pod(
            &[(annotations::CONFIG_SOURCE, "api")],
            None
        )));
        assert!(!is_static(&pod(&[], None)));
        assert!(is_mirror(&pod(&[(annotations::CONFIG_MIRROR, "x")], None)));
        assert!(!is_mirror(&pod(&[], None)));
    }

    #[test]
    fn phases_and_policies() {
        for p in [
            Phase::Pending,
            Phase::Running,
            Phase::Succeeded,
            Phase::Failed,
            Phase::Unknown,
        ] {
            assert_eq!(Phase::parse(p.as_str()), Some(p));
        }
        assert_eq!(Phase::parse("running"), None);
        assert!(Phase::Failed.is_terminal() && !Phase::Running.is_terminal());
        assert_eq!(RestartPolicy::of(&pod(&[], None)), RestartPolicy::Always);
        assert_eq!(
            RestartPolicy::of(&pod(&[], Some("OnFailure"))),
            RestartPolicy::OnFailure
        );
        assert_eq!(
            RestartPolicy::of(&pod(&[], Some("Never"))),
            RestartPolicy::Never
        );
        assert!(RestartPolicy::OnFailure.restarts_after(1));
        assert!(!RestartPolicy::OnFailure.restarts_after(0));
        assert!(!RestartPolicy::Never.restarts_after(1));
        assert!(RestartPolicy::Always.restarts_after(0));
    }
}
