//! Probe results by container and probe kind: written by the prober's workers, read by the
//! status (a container's `ready` and `started`) and the runtime (a failed liveness or startup
//! probe kills the container). Every change is also sent to the sync loop, which syncs the pod.
use k8s_openapi::api::core::v1::{Container, Probe};
use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};
use tokio::sync::mpsc;

/// The three kinds of probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Liveness,
    Readiness,
    Startup,
}

impl Kind {
    /// The name the kubelet's metrics use.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Liveness => "Liveness",
            Kind::Readiness => "Readiness",
            Kind::Startup => "Startup",
        }
    }

    /// The result a container has before its first probe result counts: readiness starts
    /// failed, liveness succeeded, startup unknown.
    pub fn initial(self) -> ProbeResult {
        match self {
            Kind::Liveness => ProbeResult::Success,
            Kind::Readiness => ProbeResult::Failure,
            Kind::Startup => ProbeResult::Unknown,
        }
    }

    /// The container's probe of this kind, if it has one.
    pub fn of(self, c: &Container) -> Option<&Probe> {
        match self {
            Kind::Liveness => c.liveness_probe.as_ref(),
            Kind::Readiness => c.readiness_probe.as_ref(),
            Kind::Startup => c.startup_probe.as_ref(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeResult {
    Success,
    Failure,
    /// The probe could not be run (for example a named port the container does not declare):
    /// such a run does not count towards either threshold.
    Unknown,
}

impl ProbeResult {
    /// The `result` label of `swiftlet_prober_probe_total`, as the kubelet's.
    pub fn metric_label(self) -> &'static str {
        match self {
            ProbeResult::Success => "successful",
            ProbeResult::Failure => "failed",
            ProbeResult::Unknown => "unknown",
        }
    }
}

/// A probe result that changed, for the sync loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    pub pod_uid: String,
    pub container_id: String,
    pub kind: Kind,
    pub result: ProbeResult,
}

/// Probe results by container ID and kind, shared by the prober workers (writers), the status
/// and the runtime (readers). Cheap to clone. A change is sent on the update channel.
#[derive(Clone, Default)]
pub struct Results {
    inner: Arc<RwLock<HashMap<(String, Kind), ProbeResult>>>,
    tx: Option<mpsc::UnboundedSender<Update>>,
}

impl Results {
    pub fn new(tx: mpsc::UnboundedSender<Update>) -> Self {
        Self {
            inner: Arc::default(),
            tx: Some(tx),
        }
    }

    pub fn get(&self, container_id: &str, kind: Kind) -> Option<ProbeResult> {
        let map = self.inner.read().unwrap_or_else(PoisonError::into_inner);
        map.get(&(container_id.to_owned(), kind)).copied()
    }

    /// Records a result; a change (or a first value) is sent to the sync loop.
    pub fn set(&self, pod_uid: &str, container_id: &str, kind: Kind, result: ProbeResult) {
        let mut map = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        let prev = map.insert((container_id.to_owned(), kind), result);
        drop(map);
        if prev != Some(result)
            && let Some(tx) = &self.tx
        {
            // The sync loop only stops at shutdown; nothing is lost that matters then.
            let _ = tx.send(Update {
                pod_uid: pod_uid.to_owned(),
                container_id: container_id.to_owned(),
                kind,
                result,
            });
        }
    }

    /// Records a container's initial result without telling the sync loop: it changes nothing
    /// the status or the runtime would do (no result reads the same), so it needs no sync.
    pub fn set_initial(&self, container_id: &str, kind: Kind) {
        let mut map = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        map.insert((container_id.to_owned(), kind), kind.initial());
    }

    pub fn remove(&self, container_id: &str, kind: Kind) {
        let mut map = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        map.remove(&(container_id.to_owned(), kind));
    }

    /// The probe whose failure means container `id` must be killed: liveness, then startup.
    pub fn kill_reason(&self, container_id: &str) -> Option<Kind> {
        [Kind::Liveness, Kind::Startup]
            .into_iter()
            .find(|&k| self.get(container_id, k) == Some(ProbeResult::Failure))
    }

    /// `(ready, started)` of running container `id` with spec `c` (kubelet `UpdatePodStatus`):
    /// started once its startup probe succeeded (at once without one); ready once started and its
    /// readiness probe succeeded (at once without one).
    pub fn ready_and_started(&self, c: &Container, container_id: &str) -> (bool, bool) {
        let ok = |kind: Kind| {
            kind.of(c).is_none() || self.get(container_id, kind) == Some(ProbeResult::Success)
        };
        let started = ok(Kind::Startup);
        (started && ok(Kind::Readiness), started)
    }
}
