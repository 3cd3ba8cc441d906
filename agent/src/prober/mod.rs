//! Liveness, readiness and startup probes.
//!
//! * [`Manager`] keeps one [`worker`] task per pod container and probe kind. Pod workers call
//!   [`Manager::add_pod`] before each sync (idempotent), [`Manager::stop_liveness_and_startup`]
//!   when the pod starts terminating and [`Manager::remove_pod`] once it is stopped.
//! * A worker reads the container's ID, start time and the pod IP from the status manager, runs
//!   its probe every `periodSeconds` ([`probe`]: exec through CRI `ExecSync`, httpGet over HTTP or
//!   HTTPS, tcpSocket, grpc) and records the result in [`Results`] once `successThreshold` / `failureThreshold`
//!   consecutive results agree.
//! * [`Results`] is shared: the status uses readiness and startup results for a container's
//!   `ready` and `started`, the runtime kills a container whose liveness or startup probe failed,
//!   and every change is sent to the sync loop, which then syncs the pod.
use crate::pod::is_sidecar;
use k8s_openapi::api::core::v1::{Container, Pod, Probe};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub mod probe;
pub mod worker;

pub use crate::pod::probe_results::{Kind, ProbeResult, Results, Update};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("container {container}: invalid {kind} probe: {reason}")]
pub struct InvalidProbe {
    pub container: String,
    pub kind: &'static str,
    pub reason: Reason,
}

/// What is wrong with a probe, in the API server's validation words.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Reason {
    #[error(transparent)]
    Handler(#[from] crate::handler::Invalid),
    #[error("{field} must not be negative (got {value})")]
    Negative { field: &'static str, value: i32 },
    #[error("successThreshold must be 1 (got {0})")]
    SuccessThreshold(u32),
}

pub use crate::handler::{Grpc, Handler, HttpGet};

/// A probe with the API defaults applied (period 10 s, timeout 1 s, thresholds 1 and 3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    pub handler: Handler,
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

/// A non-negative seconds field; 0 or unset takes `default` (the API's defaulting).
fn seconds(v: Option<i32>, default: u32, field: &'static str) -> Result<u32, Reason> {
    match v {
        None | Some(0) => Ok(default),
        Some(value) if value < 0 => Err(Reason::Negative { field, value }),
        Some(n) => Ok(n.unsigned_abs()),
    }
}

impl Spec {
    /// Validates a probe of container `container` and applies the defaults.
    pub fn parse(kind: Kind, container: &str, p: &Probe) -> Result<Spec, InvalidProbe> {
        Self::parse_inner(kind, p).map_err(|reason| InvalidProbe {
            container: container.to_owned(),
            kind: kind.as_str(),
            reason,
        })
    }

    fn parse_inner(kind: Kind, p: &Probe) -> Result<Spec, Reason> {
        let mut handlers = Vec::new();
        if let Some(e) = &p.exec {
            handlers.push(Handler::Exec(crate::handler::exec_command(e)?));
        }
        if let Some(h) = &p.http_get {
            handlers.push(Handler::Http(HttpGet::parse(h)?));
        }
        if let Some(t) = &p.tcp_socket {
            crate::handler::check_port(&t.port)?;
            handlers.push(Handler::Tcp {
                host: t.host.clone().filter(|h| !h.is_empty()),
                port: t.port.clone(),
            });
        }
        if let Some(g) = &p.grpc {
            handlers.push(Handler::Grpc(Grpc::parse(g)?));
        }
        let handler = crate::handler::exactly_one(handlers, "exec, httpGet, tcpSocket or grpc")?;
        let success_threshold = seconds(p.success_threshold, 1, "successThreshold")?;
        if kind != Kind::Readiness && success_threshold != 1 {
            return Err(Reason::SuccessThreshold(success_threshold));
        }
        Ok(Spec {
            handler,
            initial_delay: Duration::from_secs(
                seconds(p.initial_delay_seconds, 0, "initialDelaySeconds")?.into(),
            ),
            period: Duration::from_secs(seconds(p.period_seconds, 10, "periodSeconds")?.into()),
            timeout: Duration::from_secs(seconds(p.timeout_seconds, 1, "timeoutSeconds")?.into()),
            success_threshold,
            failure_threshold: seconds(p.failure_threshold, 3, "failureThreshold")?,
        })
    }
}

type Key = (String, String, Kind);

/// A started worker and the container spec it probes.
struct Running {
    cancel: CancellationToken,
    container: Container,
}

/// Starts and stops the probe workers. Cheap to clone.
#[derive(Clone)]
pub struct Manager {
    workers: Arc<Mutex<HashMap<Key, Running>>>,
    ctx: worker::Context<probe::Prober, crate::status::StatusManager>,
    tracker: TaskTracker,
    cancel: CancellationToken,
}

impl Manager {
    pub fn new(
        results: Results,
        prober: probe::Prober,
        status: crate::status::StatusManager,
        metrics: crate::metrics::Metrics,
        agent_start: tokio::time::Instant,
        tracker: TaskTracker,
        cancel: CancellationToken,
    ) -> Self {
        Self {
            workers: Arc::default(),
            ctx: worker::Context {
                results,
                runner: Arc::new(prober),
                source: status,
                metrics: Some(metrics),
                agent_start,
                random: fastrand::f64,
            },
            tracker,
            cancel,
        }
    }

    /// Starts the workers of the pod's probes that are not running yet and restarts those whose
    /// container spec changed; stops the ones whose probe is gone (kubelet `AddPod`). An invalid
    /// probe is logged and gets no worker: a readiness or startup probe then never succeeds, a
    /// liveness probe never fails.
    pub fn add_pod(&self, uid: &str, pod: &Pod) {
        let Some(spec) = pod.spec.as_ref() else {
            return;
        };
        let sidecars = spec
            .init_containers
            .iter()
            .flatten()
            .filter(|c| is_sidecar(c));
        let mut workers = self.workers.lock().unwrap_or_else(PoisonError::into_inner);
        let mut shared: Option<Arc<Pod>> = None;
        let mut wanted = Vec::new();
        for c in spec.containers.iter().chain(sidecars) {
            for kind in [Kind::Startup, Kind::Readiness, Kind::Liveness] {
                let Some(p) = kind.of(c) else { continue };
                let key = (uid.to_owned(), c.name.clone(), kind);
                wanted.push(key.clone());
                match workers.get(&key) {
                    Some(w) if w.container == *c => continue,
                    Some(w) => w.cancel.cancel(),
                    None => {}
                }
                let cancel = self.cancel.child_token();
                workers.insert(
                    key,
                    Running {
                        cancel: cancel.clone(),
                        container: c.clone(),
                    },
                );
                let spec = match Spec::parse(kind, &c.name, p) {
                    Ok(s) => s,
                    Err(e) => {
                        // Logged once per container spec: the entry stays, with no task.
                        tracing::error!(pod = %crate::pod::full_name(pod), error = %e, "probe not started");
                        continue;
                    }
                };
                let pod = shared.get_or_insert_with(|| Arc::new(pod.clone())).clone();
                let w = worker::Worker::new(self.ctx.clone(), uid, pod, c.clone(), kind, spec);
                self.tracker.spawn(w.run(cancel));
            }
        }
        workers.retain(|key, w| {
            let keep = key.0 != uid || wanted.contains(key);
            if !keep {
                w.cancel.cancel();
            }
            keep
        });
    }

    fn stop(&self, uid: &str, kinds: &[Kind]) {
        let mut workers = self.workers.lock().unwrap_or_else(PoisonError::into_inner);
        workers.retain(|(u, _, kind), w| {
            let stop = u == uid && kinds.contains(kind);
            if stop {
                w.cancel.cancel();
            }
            !stop
        });
    }

    /// Stops the liveness and startup workers of a terminating pod: nothing is restarted any more.
    pub fn stop_liveness_and_startup(&self, uid: &str) {
        self.stop(uid, &[Kind::Liveness, Kind::Startup]);
    }

    /// Stops every worker of the pod.
    pub fn remove_pod(&self, uid: &str) {
        self.stop(uid, &[Kind::Liveness, Kind::Readiness, Kind::Startup]);
    }

    /// How many workers run (tests, debugging).
    pub fn worker_count(&self) -> usize {
        self.workers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ExecAction, HTTPGetAction, TCPSocketAction};
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    fn exec() -> Probe {
        Probe {
            exec: Some(ExecAction {
                command: Some(vec!["true".into()]),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn defaults_are_the_apis() {
        let s = Spec::parse(Kind::Readiness, "c", &exec()).unwrap();
        assert_eq!(s.handler, Handler::Exec(vec!["true".into()]));
        assert_eq!(s.initial_delay, Duration::ZERO);
        assert_eq!(s.period, Duration::from_secs(10));
        assert_eq!(s.timeout, Duration::from_secs(1));
        assert_eq!((s.success_threshold, s.failure_threshold), (1, 3));
    }

    #[test]
    fn http_path_and_scheme_defaults() {
        let p = Probe {
            http_get: Some(HTTPGetAction {
                port: IntOrString::String("web".into()),
                path: Some("healthz".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let Handler::Http(h) = Spec::parse(Kind::Liveness, "c", &p).unwrap().handler else {
            panic!("not http")
        };
        assert_eq!((h.path.as_str(), h.scheme.as_str()), ("/healthz", "HTTP"));
    }

    #[test]
    fn invalid_probes_are_rejected_with_a_reason() {
        let bad = |p: Probe, kind: Kind| Spec::parse(kind, "c", &p).unwrap_err().reason.to_string();
        assert!(bad(Probe::default(), Kind::Readiness).contains("no handler"));
        let mut two = exec();
        two.tcp_socket = Some(TCPSocketAction {
            port: IntOrString::Int(80),
            ..Default::default()
        });
        assert!(bad(two, Kind::Readiness).contains("more than one"));
        let mut success = exec();
        success.success_threshold = Some(2);
        assert!(Spec::parse(Kind::Readiness, "c", &success).is_ok());
        assert!(bad(success, Kind::Liveness).contains("successThreshold must be 1"));
        let mut neg = exec();
        neg.period_seconds = Some(-1);
        assert!(bad(neg, Kind::Startup).contains("periodSeconds"));
        let port = Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(70000),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(bad(port, Kind::Readiness).contains("70000"));
        let empty = Probe {
            exec: Some(ExecAction { command: None }),
            ..Default::default()
        };
        assert!(bad(empty, Kind::Readiness).contains("empty"));
    }

    #[test]
    fn results_send_only_changes() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let r = Results::new(tx);
        r.set_initial("c1", Kind::Readiness);
        r.set("u", "c1", Kind::Readiness, ProbeResult::Failure);
        r.set("u", "c1", Kind::Readiness, ProbeResult::Success);
        r.set("u", "c1", Kind::Readiness, ProbeResult::Success);
        r.set("u", "c1", Kind::Readiness, ProbeResult::Failure);
        let got: Vec<ProbeResult> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|u| u.result)
            .collect();
        assert_eq!(got, [ProbeResult::Success, ProbeResult::Failure]);
    }

    #[test]
    fn readiness_waits_for_startup() {
        let r = Results::default();
        let c = Container {
            name: "c".into(),
            readiness_probe: Some(exec()),
            startup_probe: Some(exec()),
            ..Default::default()
        };
        assert_eq!(r.ready_and_started(&c, "id"), (false, false));
        r.set("u", "id", Kind::Readiness, ProbeResult::Success);
        assert_eq!(r.ready_and_started(&c, "id"), (false, false));
        r.set("u", "id", Kind::Startup, ProbeResult::Success);
        assert_eq!(r.ready_and_started(&c, "id"), (true, true));
        let plain = Container::default();
        assert_eq!(r.ready_and_started(&plain, "other"), (true, true));
    }

    #[test]
    fn kill_reason_is_liveness_then_startup() {
        let r = Results::default();
        assert_eq!(r.kill_reason("id"), None);
        r.set("u", "id", Kind::Startup, ProbeResult::Failure);
        assert_eq!(r.kill_reason("id"), Some(Kind::Startup));
        r.set("u", "id", Kind::Liveness, ProbeResult::Failure);
        assert_eq!(r.kill_reason("id"), Some(Kind::Liveness));
    }

    fn pod_with(containers: Vec<Container>) -> Pod {
        let mut p = Pod::default();
        p.metadata.uid = Some("u".into());
        p.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            containers,
            ..Default::default()
        });
        p
    }

    #[tokio::test]
    async fn manager_follows_the_spec() {
        let metrics = crate::metrics::Metrics::new();
        let cri = crate::cri::Cri::new("unix:///nonexistent/swiftlet-test.sock", metrics.clone())
            .unwrap();
        let cancel = CancellationToken::new();
        let m = Manager::new(
            Results::default(),
            probe::Prober::new(cri),
            crate::status::StatusManager::new(
                metrics.clone(),
                crate::pod_registry::PodRegistry::new().reader(),
                Results::default(),
                Vec::new(),
            ),
            metrics,
            tokio::time::Instant::now(),
            TaskTracker::new(),
            cancel.clone(),
        );
        let tokens = |m: &Manager| -> Vec<(Kind, CancellationToken)> {
            let w = m.workers.lock().unwrap();
            let mut v: Vec<_> = w.iter().map(|(k, r)| (k.2, r.cancel.clone())).collect();
            v.sort_by_key(|(k, _)| k.as_str());
            v
        };
        let mut c = Container {
            name: "c".into(),
            readiness_probe: Some(exec()),
            liveness_probe: Some(exec()),
            ..Default::default()
        };
        m.add_pod("u", &pod_with(vec![c.clone()]));
        let first = tokens(&m);
        assert_eq!(first.len(), 2);
        // The same spec again: the same workers.
        m.add_pod("u", &pod_with(vec![c.clone()]));
        assert!(first.iter().all(|(_, t)| !t.is_cancelled()));
        // A changed container: its workers start afresh; a probe gone: its worker stops.
        c.readiness_probe.as_mut().unwrap().period_seconds = Some(3);
        c.liveness_probe = None;
        m.add_pod("u", &pod_with(vec![c.clone()]));
        assert!(first.iter().all(|(_, t)| t.is_cancelled()));
        let second = tokens(&m);
        assert_eq!(second.len(), 1);
        assert_eq!(second[0].0, Kind::Readiness);
        // Terminating stops liveness and startup only; removal stops the rest.
        c.startup_probe = Some(exec());
        m.add_pod("u", &pod_with(vec![c.clone()]));
        assert_eq!(m.worker_count(), 2);
        m.stop_liveness_and_startup("u");
        assert_eq!(
            tokens(&m).iter().map(|t| t.0).collect::<Vec<_>>(),
            [Kind::Readiness]
        );
        m.remove_pod("u");
        assert_eq!(m.worker_count(), 0);
        cancel.cancel();
    }
}
