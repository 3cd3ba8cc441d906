//! Status manager: the pods the agent was asked to run and the status it computed for each, as a
//! snapshot readers (the `/pods` endpoint) can take without waiting on any task.
use crate::runtime::{PodState, labels};
use k8s_cri::v1 as api;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, RwLock};

struct Entry {
    pod: Arc<Pod>,
    status: PodStatus,
    running_observed: bool,
}

/// Shared, cheap to clone. Writers: the sync loop (pods) and pod workers / PLEG (statuses).
#[derive(Clone)]
pub struct StatusManager {
    inner: Arc<RwLock<BTreeMap<String, Entry>>>,
    host_ip: Option<IpAddr>,
    metrics: crate::metrics::Metrics,
}

fn ts(nanos: i64) -> Option<Time> {
    (nanos > 0)
        .then(|| Timestamp::from_nanosecond(i128::from(nanos)).ok().map(Time))
        .flatten()
}

fn condition(kind: &str, ok: bool, prev: Option<&PodStatus>, now: &Time) -> PodCondition {
    let status = if ok { "True" } else { "False" };
    // Keep the transition time while the value stays the same.
    let since = prev
        .and_then(|p| p.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == kind))
        .filter(|c| c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    PodCondition {
        type_: kind.to_owned(),
        status: status.to_owned(),
        last_transition_time: Some(since),
        ..Default::default()
    }
}

impl StatusManager {
    pub fn new(metrics: crate::metrics::Metrics) -> Self {
        Self {
            inner: Arc::default(),
            host_ip: host_ip(),
            metrics,
        }
    }

    /// Adds or replaces the desired pod, keeping its status.
    pub fn set_pod(&self, uid: &str, pod: Arc<Pod>) {
        let Ok(mut map) = self.inner.write() else {
            return;
        };
        match map.get_mut(uid) {
            Some(e) => e.pod = pod,
            None => {
                let status = PodStatus {
                    phase: Some("Pending".into()),
                    host_ip: self.host_ip.map(|ip| ip.to_string()),
                    qos_class: crate::cm::pod_qos(&pod).ok().map(|q| q.as_str().to_owned()),
                    ..Default::default()
                };
                map.insert(
                    uid.to_owned(),
                    Entry {
                        pod,
                        status,
                        running_observed: false,
                    },
                );
            }
        }
    }

    pub fn remove_pod(&self, uid: &str) {
        if let Ok(mut map) = self.inner.write() {
            map.remove(uid);
        }
    }

    /// Recomputes a pod's status from what the runtime holds. True when this update is the
    /// first to see the pod Running.
    pub fn update(
        &self,
        uid: &str,
        state: &PodState,
        waiting: &HashMap<String, (String, String)>,
    ) -> bool {
        let Ok(mut map) = self.inner.write() else {
            return false;
        };
        let Some(entry) = map.get_mut(uid) else {
            return false;
        };
        let mut first_running = false;
        let status = generate(
            &entry.pod,
            state,
            waiting,
            Some(&entry.status),
            self.host_ip,
        );
        if status.phase.as_deref() == Some("Running") && !entry.running_observed {
            entry.running_observed = true;
            first_running = true;
            if let Some(seen) = entry
                .pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("kubernetes.io/config.seen"))
                .and_then(|s| s.parse::<Timestamp>().ok())
            {
                let secs = Timestamp::now().duration_since(seen).as_secs_f64();
                self.metrics
                    .pod_start_duration_seconds
                    .observe(secs.max(0.0));
                tracing::info!(
                    pod = entry.pod.metadata.name.as_deref().unwrap_or_default(),
                    seconds = secs,
                    "pod observed Running"
                );
            }
        }
        entry.status = status;
        first_running
    }

    /// The pods with their statuses, for `/pods`.
    pub fn pods(&self) -> Vec<Pod> {
        let Ok(map) = self.inner.read() else {
            return Vec::new();
        };
        map.values()
            .map(|e| {
                let mut p = (*e.pod).clone();
                p.status = Some(e.status.clone());
                p
            })
            .collect()
    }

    pub fn running_count(&self) -> usize {
        self.inner
            .read()
            .map(|m| {
                m.values()
                    .filter(|e| e.status.phase.as_deref() == Some("Running"))
                    .count()
            })
            .unwrap_or(0)
    }
}

fn host_ip() -> Option<IpAddr> {
    // The source address the kernel would use to reach outside; no packet is sent.
    let sock = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    sock.connect("192.0.2.1:9").ok()?;
    sock.local_addr().ok().map(|a| a.ip())
}

/// Builds a PodStatus (phase, conditions, container statuses) from the spec and runtime state.
pub fn generate(
    pod: &Pod,
    state: &PodState,
    waiting: &HashMap<String, (String, String)>,
    prev: Option<&PodStatus>,
    host_ip: Option<IpAddr>,
) -> PodStatus {
    let now = Time(Timestamp::now());
    let spec_containers = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    let sandbox_id = state.ready_sandbox().map(|s| s.id.clone());
    let mut statuses = Vec::new();
    let (mut running, mut waiting_n, mut succeeded) = (0, 0, 0);
    for c in spec_containers {
        let newest = state.containers.iter().find(|s| {
            s.metadata.as_ref().is_some_and(|m| m.name == c.name)
                && s.labels.get(labels::POD_UID) == pod.metadata.uid.as_ref()
        });
        let restart_count = newest
            .and_then(|n| n.annotations.get(labels::CONTAINER_RESTART_COUNT))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut st = ContainerStatus {
            name: c.name.clone(),
            image: c.image.clone().unwrap_or_default(),
            image_id: newest.map(|n| n.image_ref.clone()).unwrap_or_default(),
            container_id: newest.map(|n| format!("containerd://{}", n.id)),
            restart_count,
            ready: false,
            started: Some(false),
            ..Default::default()
        };
        let waiting_state = |reason: &str, message: Option<String>| ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.to_owned()),
                message,
            }),
            ..Default::default()
        };
        let in_backoff = waiting.get(&c.name);
        st.state = Some(match newest {
            Some(n) if n.state == api::ContainerState::ContainerRunning as i32 => {
                running += 1;
                st.ready = true;
                st.started = Some(true);
                ContainerState {
                    running: Some(ContainerStateRunning {
                        started_at: ts(n.started_at),
                    }),
                    ..Default::default()
                }
            }
            Some(n)
                if n.state == api::ContainerState::ContainerExited as i32
                    && in_backoff.is_none() =>
            {
                if n.exit_code == 0 {
                    succeeded += 1
                }
                ContainerState {
                    terminated: Some(ContainerStateTerminated {
                        exit_code: n.exit_code,
                        reason: Some(if n.reason.is_empty() {
                            if n.exit_code == 0 {
                                "Completed".into()
                            } else {
                                "Error".into()
                            }
                        } else {
                            n.reason.clone()
                        }),
                        message: (!n.message.is_empty()).then(|| n.message.clone()),
                        started_at: ts(n.started_at),
                        finished_at: ts(n.finished_at),
                        container_id: Some(format!("containerd://{}", n.id)),
                        ..Default::default()
                    }),
                    ..Default::default()
                }
            }
            _ => {
                match newest {
                    Some(n) if n.state == api::ContainerState::ContainerExited as i32 => {
                        if n.exit_code == 0 {
                            succeeded += 1
                        }
                    }
                    _ => waiting_n += 1,
                }
                match in_backoff {
                    Some((reason, message)) => waiting_state(reason, Some(message.clone())),
                    None => waiting_state("ContainerCreating", None),
                }
            }
        });
        statuses.push(st);
    }
    let total = spec_containers.len();
    let policy = pod
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always");
    let phase = pod_phase(total, waiting_n, running, succeeded, policy);
    let all_ready = total > 0 && statuses.iter().all(|s| s.ready);
    let pod_ip = state
        .sandbox_status
        .as_ref()
        .filter(|s| s.state == api::PodSandboxState::SandboxReady as i32)
        .and_then(|s| s.network.as_ref())
        .map(|n| n.ip.clone())
        .filter(|ip| !ip.is_empty())
        .or_else(|| {
            let host_net = pod
                .spec
                .as_ref()
                .and_then(|s| s.host_network)
                .unwrap_or(false);
            (host_net && sandbox_id.is_some())
                .then(|| host_ip.map(|ip| ip.to_string()))
                .flatten()
        });
    let start_time = prev
        .and_then(|p| p.start_time.clone())
        .or_else(|| state.sandboxes.first().and_then(|s| ts(s.created_at)));
    PodStatus {
        phase: Some(phase.to_owned()),
        conditions: Some(vec![
            condition(
                "PodReadyToStartContainers",
                sandbox_id.is_some(),
                prev,
                &now,
            ),
            condition("Initialized", true, prev, &now),
            condition("Ready", all_ready, prev, &now),
            condition("ContainersReady", all_ready, prev, &now),
            condition("PodScheduled", true, prev, &now),
        ]),
        host_ip: host_ip.map(|ip| ip.to_string()),
        pod_ip: pod_ip.clone(),
        pod_ips: pod_ip.map(|ip| vec![PodIP { ip }]),
        qos_class: crate::cm::pod_qos(pod).ok().map(|q| q.as_str().to_owned()),
        start_time,
        container_statuses: Some(statuses),
        ..Default::default()
    }
}

/// The kubelet's `getPhase` for pods without init containers: a container never started keeps the
/// pod Pending; then Running while any runs or the policy restarts them; else Succeeded / Failed.
fn pod_phase(
    total: usize,
    waiting: usize,
    running: usize,
    succeeded: usize,
    policy: &str,
) -> &'static str {
    if total == 0 || waiting > 0 {
        "Pending"
    } else if running > 0 || policy == "Always" {
        "Running"
    } else if succeeded == total {
        "Succeeded"
    } else if policy == "Never" {
        "Failed"
    } else {
        // OnFailure with a failed container: it will be restarted.
        "Running"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases() {
        assert_eq!(pod_phase(2, 1, 1, 0, "Always"), "Pending");
        assert_eq!(pod_phase(2, 0, 2, 0, "Always"), "Running");
        assert_eq!(pod_phase(1, 0, 0, 0, "Always"), "Running");
        assert_eq!(pod_phase(1, 0, 0, 1, "Never"), "Succeeded");
        assert_eq!(pod_phase(2, 0, 0, 1, "Never"), "Failed");
        assert_eq!(pod_phase(1, 0, 0, 0, "OnFailure"), "Running");
        assert_eq!(pod_phase(1, 0, 0, 1, "OnFailure"), "Succeeded");
        assert_eq!(pod_phase(0, 0, 0, 0, "Always"), "Pending");
    }
}
