//! `compute_pod_actions`: what the runtime must do to bring a pod in line with its spec
//! (the kubelet's `computePodActions`). A pure function of the pod and what the runtime holds; `sync_pod`
//! carries the actions out (and applies crash-loop back-off when it starts a container).
//!
//! Rules, in the order they apply:
//! * A new sandbox (attempt = latest + 1, or 0 when there is none) is needed when there is none,
//!   when more than one is ready, when the newest is not ready, when its network mode no longer
//!   matches `hostNetwork`, or when a pod-network sandbox has no IP. The pod is killed first. A
//!   `restartPolicy: Never` pod that already ran is not restarted: it is only killed (terminal).
//! * Init containers run one at a time, in order, each to completion, before any app container; a
//!   failed one follows the pod's restart policy (`Never`: the pod fails). Restartable init
//!   containers (`restartPolicy: Always` on an init container: sidecars) start in order, keep
//!   running (restarted when they exit or their spec changes) and do not block the next one once
//!   running.
//! * An app container that is absent or not running is started when the restart policy allows it
//!   (`Always`; `OnFailure` after a non-zero exit code; never under `Never`); one in Unknown state
//!   is killed first. A running one whose spec hash changed is killed and restarted whatever the
//!   policy. A running one whose liveness (else startup) probe failed is killed, and restarted
//!   unless the policy is `Never` (sidecars: always restarted).
//! * When nothing runs and nothing is to start, the pod is killed (sidecars included) and is
//!   terminal.
//! * QoS class change (the sandbox was created for another class): the pod is killed and
//!   recreated (new sandbox, next attempt) under the new QoS cgroup; the old pod cgroup goes.
//! * In-place resize (KEP-1287): a running app container whose spec hash (which leaves resources
//!   out) is unchanged but whose cgroup resources differ from the applied ones is resized, not
//!   restarted.
use super::hash;
use crate::pod::probe_results::Kind;
use crate::pod::state::sandbox_changed;
use crate::pod::{PodState, RestartPolicy, is_sidecar, labels};
use k8s_cri::v1 as api;
use k8s_openapi::api::core::v1::{Container, Pod};

/// A running (or unknown) container to stop, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToKill {
    pub id: String,
    pub name: String,
    pub reason: &'static str,
    pub message: String,
    /// Grace period in seconds instead of the pod's: the failed probe's
    /// `terminationGracePeriodSeconds`.
    pub grace: Option<i64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodActions {
    /// Stop every container and the sandbox before anything else.
    pub kill_pod: bool,
    /// Create a new sandbox (after the kill).
    pub create_sandbox: bool,
    /// The newest sandbox, when there is one.
    pub sandbox_id: Option<String>,
    /// Attempt number of the sandbox to create (or of the current one).
    pub attempt: u32,
    /// Indices into `spec.initContainers` to start, in order.
    pub init_to_start: Vec<usize>,
    /// Indices into `spec.containers` to start.
    pub containers_to_start: Vec<usize>,
    /// Containers to stop first (changed spec, unknown state).
    pub containers_to_kill: Vec<ToKill>,
    /// Every container has finished and none will run again: the pod is Succeeded or Failed.
    pub terminal: bool,
    /// The pod's QoS class differs from its sandbox's: recreated under the new QoS cgroup.
    pub qos_changed: bool,
    /// Indices into `spec.containers` of running containers to resize in place.
    pub containers_to_resize: Vec<usize>,
}

fn state_of(s: &api::ContainerStatus) -> api::ContainerState {
    api::ContainerState::try_from(s.state).unwrap_or(api::ContainerState::ContainerUnknown)
}

fn hash_changed(c: &Container, s: &api::ContainerStatus) -> bool {
    hash::parse_label(s.annotations.get(labels::CONTAINER_HASH)) != Some(hash::container_hash(c))
}

/// The kubelet's `ShouldContainerBeRestarted`, for a container that is not running.
fn should_restart(
    policy: RestartPolicy,
    deleting: bool,
    st: Option<&api::ContainerStatus>,
) -> bool {
    use api::ContainerState as S;
    if deleting {
        return false;
    }
    let Some(st) = st else { return true };
    match state_of(st) {
        S::ContainerRunning => false,
        S::ContainerCreated | S::ContainerUnknown => true,
        S::ContainerExited => policy.restarts_after(st.exit_code),
    }
}

/// The QoS class the newest sandbox was created for differs from the pod's now.
fn qos_changed(pod: &Pod, state: &PodState) -> bool {
    let Some(old) = state
        .sandboxes
        .first()
        .and_then(|s| s.annotations.get(labels::POD_QOS_CLASS))
    else {
        return false;
    };
    crate::pod::pod_qos(pod).is_ok_and(|q| q.as_str() != old)
}

/// The container's cgroup resources differ from the ones applied to it (unknown: no).
fn resources_changed(c: &Container, s: &api::ContainerStatus) -> bool {
    let Some(applied) = s.annotations.get(labels::CONTAINER_RESOURCES) else {
        return false;
    };
    crate::cm::container_resources(c).is_ok_and(|r| crate::cm::resources_label(&r) != *applied)
}

fn kill(s: &api::ContainerStatus, name: &str, reason: &'static str, message: String) -> ToKill {
    ToKill {
        id: s.id.clone(),
        name: name.to_owned(),
        reason,
        message,
        grace: None,
    }
}

/// What the probes say of a container, as far as the actions depend on it.
pub trait ProbeView {
    /// The liveness or startup probe that failed for container `id`, if one did.
    fn kill_reason(&self, id: &str) -> Option<Kind>;
    /// Whether container `id` (spec `c`) counts as started: its startup probe succeeded, or it
    /// has none.
    fn started(&self, c: &Container, id: &str) -> bool;
}

impl ProbeView for crate::pod::probe_results::Results {
    fn kill_reason(&self, id: &str) -> Option<Kind> {
        crate::pod::probe_results::Results::kill_reason(self, id)
    }

    fn started(&self, c: &Container, id: &str) -> bool {
        self.ready_and_started(c, id).1
    }
}

/// Only failed probes, by a function of the container id; every container counts as started.
impl<F: Fn(&str) -> Option<Kind>> ProbeView for F {
    fn kill_reason(&self, id: &str) -> Option<Kind> {
        self(id)
    }

    fn started(&self, _: &Container, _: &str) -> bool {
        true
    }
}

/// What to do for `pod` given `state` (see the module documentation for the rules), with no
/// probe results.
pub fn compute_pod_actions(pod: &Pod, state: &PodState) -> PodActions {
    compute_pod_actions_with(pod, state, &|_: &str| None)
}

/// The kill of running container `s` (spec `c`) whose `probe` failed, within the probe's
/// `terminationGracePeriodSeconds` when it sets one.
fn probe_kill(s: &api::ContainerStatus, c: &Container, probe: Kind, restart: bool) -> ToKill {
    let (reason, what, spec) = match probe {
        Kind::Startup => ("StartupProbe", "startup", c.startup_probe.as_ref()),
        _ => ("LivenessProbe", "liveness", c.liveness_probe.as_ref()),
    };
    let then = if restart { ", will be restarted" } else { "" };
    let name = &c.name;
    ToKill {
        grace: spec.and_then(|p| p.termination_grace_period_seconds),
        ..kill(
            s,
            name,
            reason,
            format!("Container {name} failed {what} probe{then}"),
        )
    }
}

/// [`compute_pod_actions`] with what the probes say: a failed liveness or startup probe kills
/// its container, and a sidecar holds the next init container back until it has started.
pub fn compute_pod_actions_with(pod: &Pod, state: &PodState, probes: &dyn ProbeView) -> PodActions {
    let probe_failed = |id: &str| probes.kill_reason(id);
    let Some(spec) = pod.spec.as_ref() else {
        return PodActions {
            kill_pod: true,
            ..Default::default()
        };
    };
    let policy = RestartPolicy::of(pod);
    let deleting = pod.metadata.deletion_timestamp.is_some();
    let inits = spec.init_containers.as_deref().unwrap_or_default();
    // One pass over the containers: looking each spec container up by scanning them all would
    // cost O(n^2) per sync of a pod of n containers.
    let index = state.index();
    let newest = |name: &str| index.newest(name);
    let (mut create, mut attempt, sandbox_id) = sandbox_changed(pod, state);
    // Also when the sandbox is to be recreated anyway (e.g. a sync that stopped the old one
    // failed before it started the new one): the cgroups under the old class must still go.
    let qos_changed = !deleting && qos_changed(pod, state);
    if qos_changed && !create {
        create = true;
        attempt += 1;
    }
    let mut a = PodActions {
        kill_pod: create,
        create_sandbox: create,
        sandbox_id,
        attempt,
        qos_changed,
        ..Default::default()
    };

    if create {
        if deleting {
            a.create_sandbox = false;
            return a;
        }
        if policy == RestartPolicy::Never && attempt != 0 && !state.containers.is_empty() {
            // It ran, its sandbox is gone: it does not run again.
            a.create_sandbox = false;
            a.terminal = true;
            return a;
        }
        let to_start: Vec<usize> = spec
            .containers
            .iter()
            .enumerate()
            .filter(|(_, c)| {
                !(policy == RestartPolicy::OnFailure
                    && newest(&c.name).is_some_and(|s| {
                        state_of(s) == api::ContainerState::ContainerExited && s.exit_code == 0
                    }))
            })
            .map(|(i, _)| i)
            .collect();
        if to_start.is_empty() {
            a.create_sandbox = false;
            a.terminal = true;
        } else if !inits.is_empty() {
            a.init_to_start = vec![0];
        } else {
            a.containers_to_start = to_start;
        }
        return a;
    }

    // Init containers. Any app container created or running means the pod is initialised (exited
    // ones do not count: the sandbox may have been recreated since).
    let mut initialized = spec.containers.iter().any(|c| {
        newest(&c.name).is_some_and(|s| {
            matches!(
                state_of(s),
                api::ContainerState::ContainerCreated | api::ContainerState::ContainerRunning
            )
        })
    });
    if !initialized && !deleting {
        initialized = true;
        for (i, ic) in inits.iter().enumerate() {
            let st = newest(&ic.name);
            let next = match st.map(state_of) {
                None => Some(i),
                Some(api::ContainerState::ContainerRunning) => {
                    if is_sidecar(ic) && st.is_some_and(|s| probes.started(ic, &s.id)) {
                        // Started; the next one may go. Spec changes are handled below.
                        continue;
                    }
                    // Wait for it to finish, or for a sidecar's startup probe to succeed.
                    None
                }
                Some(api::ContainerState::ContainerExited) => {
                    let Some(st) = st else { continue };
                    if !is_sidecar(ic) && st.exit_code == 0 {
                        continue;
                    }
                    if !is_sidecar(ic) && policy == RestartPolicy::Never {
                        a.kill_pod = true;
                        a.terminal = true;
                        return a;
                    }
                    Some(i)
                }
                Some(_) => {
                    if let Some(st) = st
                        && state_of(st) == api::ContainerState::ContainerUnknown
                    {
                        a.containers_to_kill.push(kill(
                            st,
                            &ic.name,
                            "Unknown",
                            format!("init container {} is in unknown state", ic.name),
                        ));
                    }
                    Some(i)
                }
            };
            a.init_to_start.extend(next);
            initialized = false;
            break;
        }
    }
    if initialized && !deleting {
        // Sidecars keep running: restart the ones that exited or whose spec changed.
        for (i, ic) in inits.iter().enumerate().filter(|(_, c)| is_sidecar(c)) {
            match newest(&ic.name) {
                Some(s) if state_of(s) == api::ContainerState::ContainerRunning => {
                    if hash_changed(ic, s) {
                        a.containers_to_kill.push(kill(
                            s,
                            &ic.name,
                            "Changed",
                            format!(
                                "Init container {} definition changed, will be restarted",
                                ic.name
                            ),
                        ));
                        a.init_to_start.push(i);
                    } else if let Some(probe) = probe_failed(&s.id) {
                        a.containers_to_kill.push(probe_kill(s, ic, probe, true));
                        a.init_to_start.push(i);
                    }
                }
                _ => a.init_to_start.push(i),
            }
        }
    }
    if !initialized {
        return a;
    }

    // App containers.
    let mut keep = 0;
    for (i, c) in spec.containers.iter().enumerate() {
        let st = newest(&c.name);
        match st {
            Some(s) if state_of(s) == api::ContainerState::ContainerRunning => {
                if hash_changed(c, s) && !deleting {
                    a.containers_to_kill.push(kill(
                        s,
                        &c.name,
                        "Changed",
                        format!("Container {} definition changed, will be restarted", c.name),
                    ));
                    a.containers_to_start.push(i);
                } else if let Some(probe) = probe_failed(&s.id).filter(|_| !deleting) {
                    let restart = policy != RestartPolicy::Never;
                    a.containers_to_kill.push(probe_kill(s, c, probe, restart));
                    if restart {
                        a.containers_to_start.push(i);
                    }
                } else {
                    if !deleting && resources_changed(c, s) {
                        a.containers_to_resize.push(i);
                    }
                    keep += 1;
                }
            }
            _ => {
                if should_restart(policy, deleting, st) {
                    if let Some(s) =
                        st.filter(|s| state_of(s) == api::ContainerState::ContainerUnknown)
                    {
                        a.containers_to_kill.push(kill(
                            s,
                            &c.name,
                            "Unknown",
                            format!(
                                "Container {} is in unknown state, try killing it before restart",
                                c.name
                            ),
                        ));
                    }
                    a.containers_to_start.push(i);
                }
            }
        }
    }
    if keep == 0 && a.containers_to_start.is_empty() {
        // Nothing runs and nothing will: stop the rest (sidecars cannot keep the pod alive).
        a.kill_pod = true;
        a.init_to_start.clear();
        a.terminal = !deleting;
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;

    const NODE_NS: i32 = api::NamespaceMode::Node as i32;
    const POD_NS: i32 = api::NamespaceMode::Pod as i32;

    fn container(name: &str) -> Container {
        Container {
            name: name.into(),
            image: Some("img".into()),
            ..Default::default()
        }
    }

    fn sidecar(name: &str) -> Container {
        Container {
            restart_policy: Some("Always".into()),
            ..container(name)
        }
    }

    fn pod(policy: &str, inits: Vec<Container>, apps: Vec<Container>) -> Pod {
        let mut p = Pod::default();
        p.metadata.uid = Some("u".into());
        p.spec = Some(PodSpec {
            restart_policy: Some(policy.into()),
            init_containers: (!inits.is_empty()).then_some(inits),
            containers: apps,
            ..Default::default()
        });
        p
    }

    fn sandbox(id: &str, ready: bool, attempt: u32, created: i64) -> api::PodSandbox {
        api::PodSandbox {
            id: id.into(),
            state: if ready {
                api::PodSandboxState::SandboxReady
            } else {
                api::PodSandboxState::SandboxNotready
            } as i32,
            created_at: created,
            metadata: Some(api::PodSandboxMetadata {
                attempt,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn sandbox_status(id: &str, net: i32, ip: &str) -> api::PodSandboxStatus {
        api::PodSandboxStatus {
            id: id.into(),
            network: Some(api::PodSandboxNetworkStatus {
                ip: ip.into(),
                ..Default::default()
            }),
            linux: Some(api::LinuxPodSandboxStatus {
                namespaces: Some(api::Namespace {
                    options: Some(api::NamespaceOption {
                        network: net,
                        ..Default::default()
                    }),
                }),
            }),
            ..Default::default()
        }
    }

    /// A state with one ready pod-network sandbox "sb" holding `containers` (newest first).
    fn ready(containers: Vec<api::ContainerStatus>) -> PodState {
        PodState {
            sandboxes: vec![sandbox("sb", true, 0, 1)],
            sandbox_status: Some(sandbox_status("sb", POD_NS, "10.0.0.2")),
            containers,
            ..Default::default()
        }
    }

    fn status(spec: &Container, st: api::ContainerState, exit: i32) -> api::ContainerStatus {
        api::ContainerStatus {
            id: format!("{}-id", spec.name),
            metadata: Some(api::ContainerMetadata {
                name: spec.name.clone(),
                attempt: 0,
            }),
            state: st as i32,
            exit_code: exit,
            annotations: [(
                labels::CONTAINER_HASH.to_owned(),
                hash::hash_label(hash::container_hash(spec)),
            )]
            .into(),
            ..Default::default()
        }
    }

    use api::ContainerState::{ContainerExited as EXITED, ContainerRunning as RUNNING};

    fn with_resources(
        c: &Container,
        requests: &[(&str, &str)],
        limits: &[(&str, &str)],
    ) -> Container {
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        let q = |pairs: &[(&str, &str)]| {
            (!pairs.is_empty()).then(|| {
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                    .collect()
            })
        };
        Container {
            resources: Some(k8s_openapi::api::core::v1::ResourceRequirements {
                requests: q(requests),
                limits: q(limits),
                ..Default::default()
            }),
            ..c.clone()
        }
    }

    /// A running instance of `c` that was created with `c`'s resources, in a sandbox created for
    /// the QoS class `qos`.
    fn applied(c: &Container) -> api::ContainerStatus {
        let mut s = status(c, RUNNING, 0);
        let r = crate::cm::container_resources(c).unwrap();
        s.annotations.insert(
            labels::CONTAINER_RESOURCES.to_owned(),
            crate::cm::resources_label(&r),
        );
        s
    }

    fn in_qos_sandbox(mut s: PodState, qos: &str) -> PodState {
        s.sandboxes[0]
            .annotations
            .insert(labels::POD_QOS_CLASS.to_owned(), qos.to_owned());
        s
    }

    #[test]
    fn resource_change_within_the_qos_class_resizes_in_place() {
        let g = &[("cpu", "500m"), ("memory", "64Mi")][..];
        let old = with_resources(&container("a"), g, g);
        let s = in_qos_sandbox(ready(vec![applied(&old)]), "Guaranteed");
        // Same resources: nothing.
        let p = pod("Always", vec![], vec![old.clone()]);
        assert_eq!(
            compute_pod_actions(&p, &s).containers_to_resize,
            Vec::<usize>::new()
        );
        // Raised cpu, still Guaranteed: resized, not killed or restarted.
        let g2 = &[("cpu", "1"), ("memory", "64Mi")][..];
        let p = pod(
            "Always",
            vec![],
            vec![with_resources(&container("a"), g2, g2)],
        );
        let a = compute_pod_actions(&p, &s);
        assert_eq!(
            a,
            PodActions {
                sandbox_id: Some("sb".into()),
                containers_to_resize: vec![0],
                ..Default::default()
            }
        );
        // Lowered memory: resized too.
        let g3 = &[("cpu", "500m"), ("memory", "32Mi")][..];
        let p = pod(
            "Always",
            vec![],
            vec![with_resources(&container("a"), g3, g3)],
        );
        assert_eq!(compute_pod_actions(&p, &s).containers_to_resize, vec![0]);
        // Deleting: no resize.
        let mut p = p;
        p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        assert!(compute_pod_actions(&p, &s).containers_to_resize.is_empty());
    }

    #[test]
    fn resources_unknown_to_the_runtime_are_not_resized() {
        // A container created before resources were recorded (no annotation): left alone.
        let c = with_resources(&container("a"), &[("cpu", "1")], &[]);
        let p = pod("Always", vec![], vec![c.clone()]);
        let s = ready(vec![status(
            &with_resources(&c, &[("cpu", "2")], &[]),
            RUNNING,
            0,
        )]);
        assert!(compute_pod_actions(&p, &s).containers_to_resize.is_empty());
    }

    #[test]
    fn qos_class_change_recreates_the_pod() {
        let g = &[("cpu", "500m"), ("memory", "64Mi")][..];
        let old = with_resources(&container("a"), g, g);
        let s = in_qos_sandbox(ready(vec![applied(&old)]), "Guaranteed");
        // Guaranteed -> Burstable (limits dropped): kill, new sandbox (next attempt), start.
        let new = with_resources(&container("a"), g, &[]);
        let p = pod("Always", vec![], vec![new]);
        let a = compute_pod_actions(&p, &s);
        assert_eq!(
            a,
            PodActions {
                kill_pod: true,
                create_sandbox: true,
                sandbox_id: Some("sb".into()),
                attempt: 1,
                qos_changed: true,
                containers_to_start: vec![0],
                ..Default::default()
            }
        );
        // The old sandbox already stopped (a sync failed half-way): still seen, one attempt on.
        let mut stopped = s.clone();
        stopped.sandboxes[0].state = api::PodSandboxState::SandboxNotready as i32;
        let a = compute_pod_actions(&p, &stopped);
        assert!(a.qos_changed && a.create_sandbox);
        assert_eq!(a.attempt, 1);
        // A sandbox without the annotation (created before it was recorded): no change seen.
        let s = ready(vec![applied(&old)]);
        assert!(!compute_pod_actions(&p, &s).qos_changed);
    }

    #[test]
    fn new_pod_creates_sandbox_and_starts_all() {
        let p = pod("Always", vec![], vec![container("a"), container("b")]);
        let a = compute_pod_actions(&p, &PodState::default());
        assert_eq!(
            a,
            PodActions {
                kill_pod: true,
                create_sandbox: true,
                attempt: 0,
                containers_to_start: vec![0, 1],
                ..Default::default()
            }
        );
    }

    #[test]
    fn steady_pod_does_nothing() {
        let (c1, c2) = (container("a"), container("b"));
        let p = pod("Always", vec![], vec![c1.clone(), c2.clone()]);
        let s = ready(vec![status(&c1, RUNNING, 0), status(&c2, RUNNING, 0)]);
        let a = compute_pod_actions(&p, &s);
        assert_eq!(
            a,
            PodActions {
                sandbox_id: Some("sb".into()),
                ..Default::default()
            }
        );
    }

    #[test]
    fn sandbox_not_ready_is_recreated_with_next_attempt() {
        let c = container("a");
        let p = pod("Always", vec![], vec![c.clone()]);
        let mut s = ready(vec![status(&c, EXITED, 137)]);
        s.sandboxes = vec![sandbox("sb", false, 3, 1)];
        let a = compute_pod_actions(&p, &s);
        assert!(a.kill_pod && a.create_sandbox);
        assert_eq!(a.attempt, 4);
        assert_eq!(a.containers_to_start, [0]);
    }

    #[test]
    fn two_ready_sandboxes_are_replaced() {
        let c = container("a");
        let p = pod("Always", vec![], vec![c.clone()]);
        let mut s = ready(vec![status(&c, RUNNING, 0)]);
        s.sandboxes = vec![sandbox("sb", true, 1, 2), sandbox("old", true, 0, 1)];
        let a = compute_pod_actions(&p, &s);
        assert!(a.create_sandbox);
        assert_eq!(a.attempt, 2);
    }

    #[test]
    fn network_mode_change_or_missing_ip_recreates_sandbox() {
        let c = container("a");
        let mut p = pod("Always", vec![], vec![c.clone()]);
        let mut s = ready(vec![status(&c, RUNNING, 0)]);
        s.sandbox_status = Some(sandbox_status("sb", POD_NS, ""));
        assert!(compute_pod_actions(&p, &s).create_sandbox, "no IP");
        if let Some(spec) = p.spec.as_mut() {
            spec.host_network = Some(true);
        }
        s.sandbox_status = Some(sandbox_status("sb", POD_NS, "10.0.0.2"));
        assert!(
            compute_pod_actions(&p, &s).create_sandbox,
            "now hostNetwork"
        );
        s.sandbox_status = Some(sandbox_status("sb", NODE_NS, ""));
        assert!(
            !compute_pod_actions(&p, &s).create_sandbox,
            "host network needs no IP"
        );
    }

    #[test]
    fn never_pod_that_ran_is_not_recreated() {
        let c = container("a");
        let p = pod("Never", vec![], vec![c.clone()]);
        let mut s = ready(vec![status(&c, EXITED, 0)]);
        s.sandboxes = vec![sandbox("sb", false, 0, 1)];
        let a = compute_pod_actions(&p, &s);
        assert!(a.kill_pod && !a.create_sandbox && a.terminal);
        assert!(a.containers_to_start.is_empty());
    }

    #[test]
    fn on_failure_recreation_skips_succeeded_containers() {
        let (c1, c2) = (container("a"), container("b"));
        let p = pod("OnFailure", vec![], vec![c1.clone(), c2.clone()]);
        let mut s = ready(vec![status(&c1, EXITED, 0), status(&c2, EXITED, 1)]);
        s.sandboxes = vec![sandbox("sb", false, 0, 1)];
        let a = compute_pod_actions(&p, &s);
        assert!(a.create_sandbox);
        assert_eq!(a.containers_to_start, [1]);
    }

    #[test]
    fn restart_policy_by_exit_code() {
        let c = container("a");
        for (policy, exit, restart) in [
            ("Always", 0, true),
            ("Always", 1, true),
            ("OnFailure", 0, false),
            ("OnFailure", 2, true),
            ("Never", 0, false),
            ("Never", 1, false),
        ] {
            let p = pod(policy, vec![], vec![c.clone()]);
            let a = compute_pod_actions(&p, &ready(vec![status(&c, EXITED, exit)]));
            assert_eq!(
                a.containers_to_start.len(),
                usize::from(restart),
                "{policy} exit {exit}"
            );
            // A pod with nothing left to run is killed and terminal.
            assert_eq!(a.kill_pod, !restart, "{policy} exit {exit}");
            assert_eq!(a.terminal, !restart, "{policy} exit {exit}");
        }
    }

    #[test]
    fn changed_hash_restarts_whatever_the_policy() {
        let c = container("a");
        let mut changed = c.clone();
        changed.image = Some("img:2".into());
        let p = pod("Never", vec![], vec![changed]);
        let a = compute_pod_actions(&p, &ready(vec![status(&c, RUNNING, 0)]));
        assert_eq!(a.containers_to_start, [0]);
        assert_eq!(a.containers_to_kill.len(), 1);
        assert_eq!(a.containers_to_kill[0].id, "a-id");
        assert!(!a.kill_pod);
    }

    #[test]
    fn resources_or_labels_do_not_restart() {
        let c = container("a");
        let mut resized = c.clone();
        resized.resources = Some(Default::default());
        let mut p = pod("Always", vec![], vec![resized]);
        p.metadata.labels = Some([("new".to_owned(), "label".to_owned())].into());
        let a = compute_pod_actions(&p, &ready(vec![status(&c, RUNNING, 0)]));
        assert!(a.containers_to_kill.is_empty() && a.containers_to_start.is_empty());
    }

    #[test]
    fn unknown_container_is_killed_before_restart() {
        let c = container("a");
        let p = pod("Never", vec![], vec![c.clone()]);
        let a = compute_pod_actions(
            &p,
            &ready(vec![status(&c, api::ContainerState::ContainerUnknown, 0)]),
        );
        assert_eq!(a.containers_to_start, [0]);
        assert_eq!(a.containers_to_kill[0].reason, "Unknown");
    }

    #[test]
    fn new_pod_with_init_containers_starts_only_the_first() {
        let p = pod(
            "Always",
            vec![container("i1"), container("i2")],
            vec![container("a")],
        );
        let a = compute_pod_actions(&p, &PodState::default());
        assert!(a.create_sandbox);
        assert_eq!(a.init_to_start, [0]);
        assert!(a.containers_to_start.is_empty());
    }

    #[test]
    fn init_containers_run_one_at_a_time_in_order() {
        let (i1, i2, app) = (container("i1"), container("i2"), container("a"));
        let p = pod("Always", vec![i1.clone(), i2.clone()], vec![app.clone()]);
        // i1 running: wait.
        let a = compute_pod_actions(&p, &ready(vec![status(&i1, RUNNING, 0)]));
        assert!(a.init_to_start.is_empty() && a.containers_to_start.is_empty());
        assert!(!a.kill_pod);
        // i1 done: i2.
        let a = compute_pod_actions(&p, &ready(vec![status(&i1, EXITED, 0)]));
        assert_eq!(a.init_to_start, [1]);
        assert!(a.containers_to_start.is_empty());
        // Both done: the app containers.
        let a = compute_pod_actions(
            &p,
            &ready(vec![status(&i2, EXITED, 0), status(&i1, EXITED, 0)]),
        );
        assert!(a.init_to_start.is_empty());
        assert_eq!(a.containers_to_start, [0]);
        // App running: init is never rerun even when its record is gone.
        let a = compute_pod_actions(&p, &ready(vec![status(&app, RUNNING, 0)]));
        assert!(a.init_to_start.is_empty() && a.containers_to_start.is_empty());
    }

    #[test]
    fn failed_init_container_follows_the_restart_policy() {
        let (i1, app) = (container("i1"), container("a"));
        for policy in ["Always", "OnFailure"] {
            let p = pod(policy, vec![i1.clone()], vec![app.clone()]);
            let a = compute_pod_actions(&p, &ready(vec![status(&i1, EXITED, 1)]));
            assert_eq!(a.init_to_start, [0], "{policy}");
            assert!(!a.kill_pod && a.containers_to_start.is_empty());
        }
        let p = pod("Never", vec![i1.clone()], vec![app]);
        let a = compute_pod_actions(&p, &ready(vec![status(&i1, EXITED, 1)]));
        assert!(a.kill_pod && a.terminal);
        assert!(a.init_to_start.is_empty() && a.containers_to_start.is_empty());
    }

    #[test]
    fn sidecars_start_in_order_and_do_not_block() {
        let (s1, i2, app) = (sidecar("s1"), container("i2"), container("a"));
        let p = pod("Always", vec![s1.clone(), i2.clone()], vec![app.clone()]);
        // The sidecar runs: the next init container starts while it keeps running.
        let a = compute_pod_actions(&p, &ready(vec![status(&s1, RUNNING, 0)]));
        assert_eq!(a.init_to_start, [1]);
        // Regular init done, sidecar running: app containers start; the sidecar is left alone.
        let a = compute_pod_actions(
            &p,
            &ready(vec![status(&i2, EXITED, 0), status(&s1, RUNNING, 0)]),
        );
        assert!(a.init_to_start.is_empty());
        assert_eq!(a.containers_to_start, [0]);
        // Running pod whose sidecar exited: it is restarted, apps untouched.
        let a = compute_pod_actions(
            &p,
            &ready(vec![
                status(&app, RUNNING, 0),
                status(&i2, EXITED, 0),
                status(&s1, EXITED, 1),
            ]),
        );
        assert_eq!(a.init_to_start, [0]);
        assert!(a.containers_to_start.is_empty() && !a.kill_pod);
    }

    #[test]
    fn sidecars_do_not_keep_a_finished_pod_alive() {
        let (s1, app) = (sidecar("s1"), container("a"));
        let p = pod("Never", vec![s1.clone()], vec![app.clone()]);
        let a = compute_pod_actions(
            &p,
            &ready(vec![status(&app, EXITED, 0), status(&s1, RUNNING, 0)]),
        );
        assert!(a.kill_pod && a.terminal);
        assert!(a.init_to_start.is_empty());
    }

    #[test]
    fn changed_sidecar_is_restarted() {
        let (s1, app) = (sidecar("s1"), container("a"));
        let mut s1b = s1.clone();
        s1b.args = Some(vec!["x".into()]);
        let p = pod("Always", vec![s1b], vec![app.clone()]);
        let a = compute_pod_actions(
            &p,
            &ready(vec![status(&app, RUNNING, 0), status(&s1, RUNNING, 0)]),
        );
        assert_eq!(a.init_to_start, [0]);
        assert_eq!(a.containers_to_kill[0].id, "s1-id");
    }

    #[test]
    fn deleting_pod_starts_nothing() {
        let c = container("a");
        let mut p = pod("Always", vec![], vec![c.clone()]);
        p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        let a = compute_pod_actions(&p, &ready(vec![status(&c, EXITED, 1)]));
        assert!(a.containers_to_start.is_empty() && !a.create_sandbox);
        let a = compute_pod_actions(&p, &PodState::default());
        assert!(!a.create_sandbox);
    }

    #[test]
    fn failed_liveness_kills_and_restarts_by_policy() {
        let (c1, c2) = (container("a"), container("b"));
        let failed = |id: &str| (id == "a-id").then_some(Kind::Liveness);
        let s = ready(vec![status(&c1, RUNNING, 0), status(&c2, RUNNING, 0)]);
        for policy in ["Always", "OnFailure"] {
            let p = pod(policy, vec![], vec![c1.clone(), c2.clone()]);
            let a = compute_pod_actions_with(&p, &s, &failed);
            assert_eq!(a.containers_to_start, [0], "{policy}");
            assert_eq!(
                a.containers_to_kill,
                [ToKill {
                    id: "a-id".into(),
                    name: "a".into(),
                    reason: "LivenessProbe",
                    message: "Container a failed liveness probe, will be restarted".into(),
                    grace: None,
                }]
            );
            assert!(!a.kill_pod);
        }
        // Never: killed, not restarted; the other container keeps the pod going.
        let p = pod("Never", vec![], vec![c1.clone(), c2.clone()]);
        let a = compute_pod_actions_with(&p, &s, &failed);
        assert!(a.containers_to_start.is_empty() && !a.kill_pod);
        assert_eq!(
            a.containers_to_kill[0].message,
            "Container a failed liveness probe"
        );
        // Never with nothing else running: the pod is done.
        let p = pod("Never", vec![], vec![c1.clone()]);
        let a = compute_pod_actions_with(&p, &ready(vec![status(&c1, RUNNING, 0)]), &failed);
        assert!(a.kill_pod && a.terminal);
    }

    #[test]
    fn failed_startup_kills_and_a_changed_spec_wins() {
        let mut c = container("a");
        c.startup_probe = Some(k8s_openapi::api::core::v1::Probe {
            termination_grace_period_seconds: Some(7),
            ..Default::default()
        });
        let p = pod("Always", vec![], vec![c.clone()]);
        let startup = |_: &str| Some(Kind::Startup);
        let a = compute_pod_actions_with(&p, &ready(vec![status(&c, RUNNING, 0)]), &startup);
        assert_eq!(a.containers_to_kill[0].reason, "StartupProbe");
        assert_eq!(
            a.containers_to_kill[0].grace,
            Some(7),
            "the probe's grace period"
        );
        assert_eq!(a.containers_to_start, [0]);
        let mut changed = c.clone();
        changed.args = Some(vec!["x".into()]);
        let p = pod("Always", vec![], vec![changed]);
        let a = compute_pod_actions_with(&p, &ready(vec![status(&c, RUNNING, 0)]), &startup);
        assert_eq!(a.containers_to_kill[0].reason, "Changed");
    }

    #[test]
    fn sidecar_failing_liveness_is_restarted() {
        let (s1, app) = (sidecar("s1"), container("a"));
        let p = pod("Never", vec![s1.clone()], vec![app.clone()]);
        let st = ready(vec![status(&app, RUNNING, 0), status(&s1, RUNNING, 0)]);
        let failed = |id: &str| (id == "s1-id").then_some(Kind::Liveness);
        let a = compute_pod_actions_with(&p, &st, &failed);
        assert_eq!(a.init_to_start, [0]);
        assert_eq!(a.containers_to_kill[0].reason, "LivenessProbe");
        assert!(a.containers_to_start.is_empty());
    }

    #[test]
    fn a_sidecar_holds_the_next_init_container_until_its_startup_probe_succeeds() {
        let mut s1 = sidecar("s1");
        s1.startup_probe = Some(k8s_openapi::api::core::v1::Probe::default());
        let (i2, app) = (container("i2"), container("a"));
        let p = pod("Always", vec![s1.clone(), i2.clone()], vec![app.clone()]);
        let st = ready(vec![status(&s1, RUNNING, 0)]);
        struct Startup(bool);
        impl ProbeView for Startup {
            fn kill_reason(&self, _: &str) -> Option<Kind> {
                None
            }
            fn started(&self, c: &Container, _: &str) -> bool {
                c.startup_probe.is_none() || self.0
            }
        }
        let a = compute_pod_actions_with(&p, &st, &Startup(false));
        assert!(
            a.init_to_start.is_empty() && a.containers_to_start.is_empty(),
            "the sidecar has not started: nothing else starts: {a:?}"
        );
        let a = compute_pod_actions_with(&p, &st, &Startup(true));
        assert_eq!(
            a.init_to_start,
            [1],
            "started: the next init container goes"
        );
        // The probe results the runtime uses say the same.
        let results = crate::pod::probe_results::Results::default();
        let a = compute_pod_actions_with(&p, &st, &results);
        assert!(a.init_to_start.is_empty());
        results.set(
            "u",
            "s1-id",
            Kind::Startup,
            crate::pod::probe_results::ProbeResult::Success,
        );
        let a = compute_pod_actions_with(&p, &st, &results);
        assert_eq!(a.init_to_start, [1]);
    }
}
