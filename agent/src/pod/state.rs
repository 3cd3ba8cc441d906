//! The runtime's view of a pod: what CRI reports for its sandboxes and containers, as a full
//! read ([`PodState`]) or as the cheap summary a relist compares ([`RelistEntry`]).
use k8s_cri::v1 as api;
use k8s_openapi::api::core::v1::Pod;
use std::collections::HashMap;

/// What part a container plays in its pod (stored on it, so a kill knows its turn without the
/// spec: app and init containers first, sidecars after them in reverse start order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerKind {
    Init,
    Sidecar,
    App,
}

impl ContainerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ContainerKind::Init => "init",
            ContainerKind::Sidecar => "sidecar",
            ContainerKind::App => "app",
        }
    }
}

/// What the runtime holds for one pod, with details.
#[derive(Debug, Clone, Default)]
pub struct PodState {
    /// Newest first.
    pub sandboxes: Vec<api::PodSandbox>,
    /// Status of the newest sandbox, when there is one.
    pub sandbox_status: Option<api::PodSandboxStatus>,
    /// Every container of the pod, newest first, with full status.
    pub containers: Vec<api::ContainerStatus>,
    /// Why the pod's last in-place resize was refused or failed.
    pub resize_error: Option<String>,
}

impl PodState {
    pub fn ready_sandbox(&self) -> Option<&api::PodSandbox> {
        self.sandboxes
            .first()
            .filter(|s| s.state == api::PodSandboxState::SandboxReady as i32)
    }

    /// Something a pod kill would stop: a ready sandbox or a live container
    /// ([`is_live`]). False for a new pod (nothing at all) and for one whose every container
    /// exited and whose sandboxes stopped: killing it changes nothing.
    pub fn anything_live(&self) -> bool {
        self.containers.iter().any(is_live)
            || self
                .sandboxes
                .iter()
                .any(|s| s.state == api::PodSandboxState::SandboxReady as i32)
    }

    /// The newest container with this name.
    pub fn newest(&self, name: &str) -> Option<&api::ContainerStatus> {
        self.containers
            .iter()
            .find(|c| c.metadata.as_ref().is_some_and(|m| m.name == name))
    }

    /// The instances of every container name, in one pass: what a sync or a status looks up per
    /// spec container without scanning every container for each (a pod of n containers costs
    /// O(n), not O(n^2)).
    pub fn index(&self) -> ContainerIndex<'_> {
        self.index_where(|_| true)
    }

    /// [`PodState::index`] over the containers `keep` accepts.
    pub fn index_where(&self, keep: impl Fn(&api::ContainerStatus) -> bool) -> ContainerIndex<'_> {
        let mut by_name: HashMap<&str, Instances<'_>> = HashMap::new();
        // Newest first: the first seen of a name is its newest instance.
        for c in self.containers.iter().filter(|c| keep(c)) {
            let Some(m) = c.metadata.as_ref() else {
                continue;
            };
            let e = by_name.entry(m.name.as_str()).or_default();
            match (e.newest, e.previous) {
                (None, _) => e.newest = Some(c),
                (Some(_), None) => e.previous = Some(c),
                _ => {}
            }
            if e.newest_exited.is_none() && c.state == api::ContainerState::ContainerExited as i32 {
                e.newest_exited = Some(c);
            }
        }
        ContainerIndex { by_name }
    }

    /// Marks running container `id` exited with `code` at `finished_ns` (Unix nanoseconds), as
    /// the kernel saw its main process exit before the runtime recorded it. False (and nothing
    /// changed) when no running container has that id, or when the exit is from before the
    /// container started (the OCI runtime's helper may exec in the container's cgroup and exit
    /// first) unless the container's cgroup is `gone`: the runtime notes a start once its call
    /// returned, after a process that fails at once may have exited, and a removed cgroup
    /// leaves no doubt that the container ended. The finish is then shown at the start.
    pub fn apply_kernel_exit(&mut self, id: &str, code: i32, finished_ns: i64, gone: bool) -> bool {
        let running = api::ContainerState::ContainerRunning as i32;
        let Some(c) = self
            .containers
            .iter_mut()
            .find(|c| c.id == id && c.state == running && (gone || finished_ns >= c.started_at))
        else {
            return false;
        };
        c.state = api::ContainerState::ContainerExited as i32;
        c.exit_code = code;
        c.finished_at = finished_ns.max(c.started_at);
        true
    }

    /// The relist summary of this state: what a relist would have listed for the pod.
    pub fn relist_entry(&self) -> RelistEntry {
        RelistEntry::sorted(
            self.sandboxes
                .iter()
                .map(|s| (s.id.clone(), s.state))
                .collect(),
            self.containers
                .iter()
                .map(|c| (c.id.clone(), c.state))
                .collect(),
        )
    }
}

/// The instances of one container name a pod's state holds.
#[derive(Debug, Clone, Copy, Default)]
pub struct Instances<'a> {
    /// The newest instance.
    pub newest: Option<&'a api::ContainerStatus>,
    /// The one before it.
    pub previous: Option<&'a api::ContainerStatus>,
    /// The newest instance that exited (the newest itself, or an older one).
    pub newest_exited: Option<&'a api::ContainerStatus>,
}

/// A pod's containers by name ([`PodState::index`]).
#[derive(Debug, Default)]
pub struct ContainerIndex<'a> {
    by_name: HashMap<&'a str, Instances<'a>>,
}

impl<'a> ContainerIndex<'a> {
    /// The instances of container `name` (none: every field `None`).
    pub fn get(&self, name: &str) -> Instances<'a> {
        self.by_name.get(name).copied().unwrap_or_default()
    }

    /// The newest instance of container `name`.
    pub fn newest(&self, name: &str) -> Option<&'a api::ContainerStatus> {
        self.get(name).newest
    }
}

/// A container a stop has to stop: created or running.
pub fn is_live(c: &api::ContainerStatus) -> bool {
    c.state == api::ContainerState::ContainerRunning as i32
        || c.state == api::ContainerState::ContainerCreated as i32
}

/// One pod's sandboxes as a listing returned them, and its containers' ids with the states the
/// listing showed.
pub type ListedPod = (Vec<api::PodSandbox>, Vec<(String, i32)>);

/// A cheap summary of one pod from a relist: sandbox and container ids with states.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RelistEntry {
    pub sandboxes: Vec<(String, i32)>,
    pub containers: Vec<(String, i32)>,
}

impl RelistEntry {
    /// The entry of these sandboxes and containers (id, state), in id order: entries compare
    /// equal whatever order the runtime listed them in.
    pub fn sorted(mut sandboxes: Vec<(String, i32)>, mut containers: Vec<(String, i32)>) -> Self {
        sandboxes.sort();
        containers.sort();
        Self {
            sandboxes,
            containers,
        }
    }
}

/// Whether the pod's sandbox must be (re)created, with the attempt number and the newest
/// sandbox's id: there is none, more than one is ready, the newest is not ready, its network
/// mode no longer matches `hostNetwork`, or a pod-network sandbox has no IP.
pub fn sandbox_changed(pod: &Pod, state: &PodState) -> (bool, u32, Option<String>) {
    let Some(latest) = state.sandboxes.first() else {
        return (true, 0, None);
    };
    let attempt = latest.metadata.as_ref().map_or(0, |m| m.attempt);
    let id = Some(latest.id.clone());
    let ready = |s: &api::PodSandbox| s.state == api::PodSandboxState::SandboxReady as i32;
    if state.sandboxes.iter().filter(|s| ready(s)).count() > 1 || !ready(latest) {
        return (true, attempt + 1, id);
    }
    let host_network = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    if let Some(st) = state.sandbox_status.as_ref().filter(|s| s.id == latest.id) {
        let mode = st
            .linux
            .as_ref()
            .and_then(|l| l.namespaces.as_ref())
            .and_then(|n| n.options.as_ref())
            .map(|o| o.network);
        if let Some(mode) = mode
            && (mode == api::NamespaceMode::Node as i32) != host_network
        {
            return (true, attempt + 1, id);
        }
        let has_ip = st.network.as_ref().is_some_and(|n| !n.ip.is_empty());
        if !host_network && !has_ip {
            return (true, attempt + 1, id);
        }
    }
    (false, attempt, id)
}

/// A listing's sandboxes and containers (`C`: full or brief ones, whose pod UID label `uid`
/// reads) grouped by pod UID (objects without one are not a pod's).
pub type ByPod<C> = HashMap<String, (Vec<api::PodSandbox>, Vec<C>)>;

/// Groups a listing by pod: see [`ByPod`].
pub fn by_pod<C>(
    sandboxes: Vec<api::PodSandbox>,
    containers: Vec<C>,
    uid: impl Fn(&C) -> Option<&String>,
) -> ByPod<C> {
    let mut pods: ByPod<C> = HashMap::new();
    for s in sandboxes {
        if let Some(uid) = s.labels.get(super::labels::POD_UID) {
            pods.entry(uid.clone())
                .or_insert_with(|| (Vec::new(), Vec::new()))
                .0
                .push(s);
        }
    }
    for c in containers {
        if let Some(uid) = uid(&c) {
            pods.entry(uid.clone())
                .or_insert_with(|| (Vec::new(), Vec::new()))
                .1
                .push(c);
        }
    }
    pods
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running(id: &str, started_at: i64) -> api::ContainerStatus {
        api::ContainerStatus {
            id: id.into(),
            state: api::ContainerState::ContainerRunning as i32,
            started_at,
            ..Default::default()
        }
    }

    #[test]
    fn a_kernel_seen_exit_applies_only_to_a_running_container_after_its_start() {
        let mut state = PodState {
            containers: vec![running("a", 4_000)],
            ..Default::default()
        };
        assert!(
            !state.apply_kernel_exit("a", 0, 3_000, false),
            "an exit from before the start is not the container's"
        );
        assert!(!state.apply_kernel_exit("other", 3, 5_000, false));
        assert!(state.apply_kernel_exit("a", 3, 5_000, false));
        let c = &state.containers[0];
        assert_eq!(
            (c.state, c.exit_code, c.finished_at),
            (api::ContainerState::ContainerExited as i32, 3, 5_000)
        );
        assert!(
            !state.apply_kernel_exit("a", 4, 6_000, true),
            "already exited"
        );
    }

    #[test]
    fn a_removed_cgroup_ends_a_container_that_exited_before_the_runtime_noted_its_start() {
        let mut state = PodState {
            containers: vec![running("a", 4_000)],
            ..Default::default()
        };
        assert!(state.apply_kernel_exit("a", 1, 3_000, true));
        let c = &state.containers[0];
        assert_eq!(
            (c.state, c.exit_code, c.finished_at),
            (api::ContainerState::ContainerExited as i32, 1, 4_000),
            "exited, and not before it started"
        );
    }

    fn instance(name: &str, id: &str, state: api::ContainerState) -> api::ContainerStatus {
        api::ContainerStatus {
            id: id.into(),
            metadata: Some(api::ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            state: state as i32,
            ..Default::default()
        }
    }

    #[test]
    fn the_index_finds_the_newest_the_previous_and_the_newest_exited_instance() {
        use api::ContainerState::{ContainerCreated, ContainerExited, ContainerRunning};
        let state = PodState {
            // Newest first.
            containers: vec![
                instance("a", "a3", ContainerRunning),
                instance("b", "b1", ContainerCreated),
                instance("a", "a2", ContainerCreated),
                instance("a", "a1", ContainerExited),
                instance("a", "a0", ContainerExited),
            ],
            ..Default::default()
        };
        let index = state.index();
        let id = |c: Option<&api::ContainerStatus>| c.map(|c| c.id.clone());
        let a = index.get("a");
        assert_eq!(
            (id(a.newest), id(a.previous), id(a.newest_exited)),
            (Some("a3".into()), Some("a2".into()), Some("a1".into()))
        );
        assert_eq!(id(index.newest("a")), id(state.newest("a")));
        let b = index.get("b");
        assert_eq!(
            (id(b.newest), id(b.previous), id(b.newest_exited)),
            (Some("b1".into()), None, None)
        );
        assert!(index.get("c").newest.is_none());
        let only_exited = state.index_where(|c| c.state == ContainerExited as i32);
        assert_eq!(id(only_exited.newest("a")), Some("a1".into()));
    }

    #[test]
    fn the_relist_entry_is_sorted_by_id() {
        let state = PodState {
            sandboxes: vec![api::PodSandbox {
                id: "s".into(),
                state: api::PodSandboxState::SandboxReady as i32,
                ..Default::default()
            }],
            containers: vec![running("b", 1), running("a", 1)],
            ..Default::default()
        };
        let e = state.relist_entry();
        let running = api::ContainerState::ContainerRunning as i32;
        assert_eq!(
            e.containers,
            [("a".to_owned(), running), ("b".to_owned(), running)]
        );
        assert_eq!(e.sandboxes.len(), 1);
    }
}
