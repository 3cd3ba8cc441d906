//! One probe worker: a task per pod container and probe kind (the kubelet's `worker.go`).
//!
//! Every round it reads the container from the pod's status. A new container ID resets the
//! result to the kind's initial value ([`Kind::initial`]) and lifts the hold. Nothing is probed
//! while the container does not run (readiness is then a failure), while a liveness or startup
//! failure waits for the container to be replaced (on hold), before `initialDelaySeconds` have
//! passed since the container started, by a startup worker once its probe succeeded, and by
//! liveness and readiness workers until then. A result is recorded once `successThreshold` /
//! `failureThreshold` consecutive runs agree; Unknown runs (nothing to connect to) are dropped.
//! Rounds start every `periodSeconds` (at most 1 s apart while waiting for the container to run
//! or start: reading the status is cheap). As in the kubelet, a worker that starts less than one
//! period after the agent waits a random part of the period before its first round
//! ([`first_probe_delay`]), so that a restarted agent does not probe every container at once; a
//! worker started later (a pod added later) does not wait.
use super::probe::{Runner, Target};
use super::{Kind, ProbeResult, Results, Spec};
use crate::pod::RestartPolicy;
use crate::status::StatusManager;
use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod, PodStatus};
use k8s_openapi::jiff::Timestamp;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const WAIT_FOR_CONTAINER: Duration = Duration::from_secs(1);

/// Where workers read a pod's status. The status manager is the real one.
pub trait StatusSource: Send + Sync + 'static {
    fn pod_status(&self, uid: &str) -> Option<PodStatus>;
}

impl StatusSource for StatusManager {
    fn pod_status(&self, uid: &str) -> Option<PodStatus> {
        StatusManager::pod_status(self, uid)
    }
}

/// What every worker shares.
pub struct Context<R, S> {
    pub results: Results,
    pub runner: Arc<R>,
    pub source: S,
    pub metrics: Option<crate::metrics::Metrics>,
    /// When the agent started (see [`first_probe_delay`]).
    pub agent_start: Instant,
    /// A random number in [0, 1) for the first probe's delay; tests inject their own.
    pub random: fn() -> f64,
}

/// How long a worker created `since_agent_start` after the agent started waits before its first
/// round: `random` (in [0, 1)) times the period when the agent started less than one period ago,
/// else nothing (the kubelet's rule).
pub fn first_probe_delay(period: Duration, since_agent_start: Duration, random: f64) -> Duration {
    if since_agent_start < period {
        period.mul_f64(random.clamp(0.0, 1.0))
    } else {
        Duration::ZERO
    }
}

impl<R, S: Clone> Clone for Context<R, S> {
    fn clone(&self) -> Self {
        Self {
            results: self.results.clone(),
            runner: self.runner.clone(),
            source: self.source.clone(),
            metrics: self.metrics.clone(),
            agent_start: self.agent_start,
            random: self.random,
        }
    }
}

pub struct Worker<R, S> {
    ctx: Context<R, S>,
    uid: String,
    pod: Arc<Pod>,
    container: Container,
    kind: Kind,
    spec: Spec,
    container_id: Option<String>,
    last: ProbeResult,
    run: u32,
    on_hold: bool,
    probe_after: Option<Instant>,
}

/// The container's status by name (app containers, then init containers).
fn find<'a>(status: &'a PodStatus, name: &str) -> Option<&'a ContainerStatus> {
    status
        .container_statuses
        .iter()
        .chain(status.init_container_statuses.iter())
        .flatten()
        .find(|c| c.name == name)
}

/// The runtime's ID from `containerd://<id>`.
fn bare_id(id: &str) -> &str {
    id.split_once("://").map_or(id, |(_, id)| id)
}

impl<R: Runner, S: StatusSource> Worker<R, S> {
    pub fn new(
        ctx: Context<R, S>,
        uid: &str,
        pod: Arc<Pod>,
        container: Container,
        kind: Kind,
        spec: Spec,
    ) -> Self {
        Self {
            ctx,
            uid: uid.to_owned(),
            pod,
            container,
            kind,
            spec,
            container_id: None,
            last: ProbeResult::Unknown,
            run: 0,
            on_hold: false,
            probe_after: None,
        }
    }

    /// Probes until cancelled (or until the container stopped for good), then forgets its result.
    pub async fn run(mut self, cancel: CancellationToken) {
        let delay = first_probe_delay(
            self.spec.period,
            self.ctx.agent_start.elapsed(),
            (self.ctx.random)(),
        );
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
        loop {
            // Rounds start every period, however long the probe took (as the kubelet's ticker).
            let round = Instant::now();
            let next = tokio::select! {
                _ = cancel.cancelled() => break,
                next = self.step() => next,
            };
            let Some(next) = next else { break };
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep_until(round + next) => {}
            }
        }
        if let Some(id) = &self.container_id {
            self.ctx.results.remove(id, self.kind);
        }
        if let Some(m) = &self.ctx.metrics {
            m.probes.forget(&self.series());
        }
    }

    /// What this worker's `/metrics/probes` series are labelled with.
    fn series(&self) -> crate::metrics::probes::ProbeTarget {
        let meta = &self.pod.metadata;
        crate::metrics::probes::ProbeTarget {
            probe_type: self.kind.as_str(),
            container: self.container.name.clone(),
            pod: meta.name.clone().unwrap_or_default(),
            namespace: crate::pod::namespace(&self.pod).to_owned(),
            pod_uid: self.uid.clone(),
        }
    }

    /// One round; how long until the next, or `None` to stop.
    async fn step(&mut self) -> Option<Duration> {
        let period = self.spec.period;
        let wait = period.min(WAIT_FOR_CONTAINER);
        let Some(status) = self.ctx.source.pod_status(&self.uid) else {
            return Some(wait);
        };
        let Some(cs) = find(&status, &self.container.name) else {
            return Some(wait);
        };
        let Some(id) = cs.container_id.as_deref().map(bare_id) else {
            return Some(wait);
        };
        let results = &self.ctx.results;
        if self.container_id.as_deref() != Some(id) {
            if let Some(old) = self.container_id.take() {
                results.remove(&old, self.kind);
            }
            self.container_id = Some(id.to_owned());
            results.set_initial(id, self.kind);
            self.on_hold = false;
            self.last = ProbeResult::Unknown;
            self.run = 0;
            self.probe_after = None;
        }
        let Some(running) = cs.state.as_ref().and_then(|s| s.running.as_ref()) else {
            if self.kind == Kind::Readiness {
                results.set(&self.uid, id, self.kind, ProbeResult::Failure);
            }
            // A container that is not restarted needs no more probes.
            let done = RestartPolicy::of(&self.pod) == RestartPolicy::Never
                && cs.state.as_ref().is_some_and(|s| s.terminated.is_some());
            return (!done).then_some(wait);
        };
        if self.on_hold {
            return Some(period);
        }
        let started = self.container.startup_probe.is_none()
            || results.get(id, Kind::Startup) == Some(ProbeResult::Success);
        match (self.kind, started) {
            (Kind::Startup, true) => return Some(period),
            (Kind::Liveness | Kind::Readiness, false) => return Some(wait),
            _ => {}
        }
        let now = Instant::now();
        let initial_delay = self.spec.initial_delay;
        let deadline = *self.probe_after.get_or_insert_with(|| {
            // Counted from the container's start, as the kubelet does.
            let since_start = running
                .started_at
                .as_ref()
                .map(|t| Timestamp::now().duration_since(t.0))
                .and_then(|d| Duration::try_from(d).ok())
                .unwrap_or_default();
            now + initial_delay.saturating_sub(since_start)
        });
        if now < deadline {
            return Some((deadline - now).min(period));
        }

        let target = Target {
            container_id: id.to_owned(),
            pod_ip: status.pod_ip.clone().filter(|ip| !ip.is_empty()),
            ports: self.container.ports.clone().unwrap_or_default(),
        };
        let started = Instant::now();
        let (result, message) = self
            .ctx
            .runner
            .run(&self.spec.handler, &target, self.spec.timeout)
            .await;
        if let Some(m) = &self.ctx.metrics {
            m.prober_probe_total
                .get_or_create(&crate::metrics::ProbeLabel {
                    probe_type: self.kind.as_str(),
                    result: result.metric_label(),
                })
                .inc();
            m.probes.observe(
                &self.series(),
                result.metric_label(),
                started.elapsed().as_secs_f64(),
            );
        }
        if result == ProbeResult::Unknown {
            tracing::debug!(pod = %self.uid, container = %self.container.name, kind = self.kind.as_str(), %message, "probe could not run");
            return Some(period);
        }
        if result == self.last {
            self.run = self.run.saturating_add(1);
        } else {
            self.last = result;
            self.run = 1;
        }
        let threshold = match result {
            ProbeResult::Success => self.spec.success_threshold,
            _ => self.spec.failure_threshold,
        };
        if self.run < threshold {
            return Some(period);
        }
        if results.get(id, self.kind) != Some(result) {
            tracing::info!(pod = %crate::pod::full_name(&self.pod), container = %self.container.name, kind = self.kind.as_str(), ?result, %message, "probe result changed");
        }
        results.set(&self.uid, id, self.kind, result);
        if result == ProbeResult::Failure && self.kind != Kind::Readiness {
            // The container will be killed: wait for its successor.
            self.on_hold = true;
            self.run = 0;
        }
        Some(period)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prober::Handler;
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStateRunning, ExecAction, Probe};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[derive(Default)]
    struct Fake {
        result: Mutex<Option<ProbeResult>>,
        calls: AtomicUsize,
    }

    impl Runner for Fake {
        async fn run(&self, _: &Handler, _: &Target, _: Duration) -> (ProbeResult, String) {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let r = self.result.lock().unwrap().unwrap_or(ProbeResult::Success);
            (r, String::new())
        }
    }

    #[derive(Clone, Default)]
    struct Source(Arc<Mutex<Option<PodStatus>>>);

    impl StatusSource for Source {
        fn pod_status(&self, _: &str) -> Option<PodStatus> {
            self.0.lock().unwrap().clone()
        }
    }

    impl Source {
        fn running(&self, id: &str) {
            *self.0.lock().unwrap() = Some(PodStatus {
                container_statuses: Some(vec![ContainerStatus {
                    name: "c".into(),
                    container_id: Some(format!("containerd://{id}")),
                    state: Some(ContainerState {
                        running: Some(ContainerStateRunning {
                            started_at: Some(Time(Timestamp::now())),
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            });
        }
    }

    struct Setup {
        fake: Arc<Fake>,
        source: Source,
        results: Results,
        cancel: CancellationToken,
        agent_start: Instant,
        random: fn() -> f64,
    }

    impl Setup {
        /// An agent that started long ago: no first-probe delay.
        fn new() -> Self {
            Self {
                fake: Arc::default(),
                source: Source::default(),
                results: Results::default(),
                cancel: CancellationToken::new(),
                agent_start: Instant::now() - Duration::from_secs(3600),
                random: || 0.5,
            }
        }

        fn start(&self, kind: Kind, probe: Probe, startup: bool) {
            let container = Container {
                name: "c".into(),
                startup_probe: startup.then(|| probe.clone()),
                ..Default::default()
            };
            let ctx = Context {
                results: self.results.clone(),
                runner: self.fake.clone(),
                source: self.source.clone(),
                metrics: None,
                agent_start: self.agent_start,
                random: self.random,
            };
            let spec = Spec::parse(kind, "c", &probe).unwrap();
            let w = Worker::new(ctx, "u", Arc::default(), container, kind, spec);
            tokio::spawn(w.run(self.cancel.clone()));
        }

        fn set(&self, r: ProbeResult) {
            *self.fake.result.lock().unwrap() = Some(r);
        }

        fn calls(&self) -> usize {
            self.fake.calls.load(Ordering::SeqCst)
        }
    }

    fn probe(period: i32, success: i32, failure: i32, delay: i32) -> Probe {
        Probe {
            exec: Some(ExecAction {
                command: Some(vec!["true".into()]),
            }),
            period_seconds: Some(period),
            success_threshold: Some(success),
            failure_threshold: Some(failure),
            initial_delay_seconds: Some(delay),
            ..Default::default()
        }
    }

    async fn at(start: Instant, secs: f64) {
        tokio::time::sleep_until(start + Duration::from_secs_f64(secs)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn readiness_follows_the_thresholds() {
        let s = Setup::new();
        s.source.running("id1");
        let t0 = Instant::now();
        s.start(Kind::Readiness, probe(1, 2, 3, 0), false);
        let ready = || s.results.get("id1", Kind::Readiness);
        // Probes at 0 s and 1 s succeed: ready after the second.
        at(t0, 0.5).await;
        assert_eq!((s.calls(), ready()), (1, Some(ProbeResult::Failure)));
        at(t0, 1.5).await;
        assert_eq!((s.calls(), ready()), (2, Some(ProbeResult::Success)));
        // Failing from 2 s: not ready after the third failure (4 s).
        s.set(ProbeResult::Failure);
        at(t0, 3.5).await;
        assert_eq!(ready(), Some(ProbeResult::Success));
        at(t0, 4.5).await;
        assert_eq!((s.calls(), ready()), (5, Some(ProbeResult::Failure)));
        // Unknown runs count for nothing.
        s.set(ProbeResult::Unknown);
        at(t0, 9.5).await;
        assert_eq!(ready(), Some(ProbeResult::Failure));
        s.cancel.cancel();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(ready(), None, "a stopped worker forgets its result");
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_runs_before_the_container_and_the_initial_delay() {
        let s = Setup::new();
        let t0 = Instant::now();
        s.start(Kind::Readiness, probe(10, 1, 3, 5), false);
        at(t0, 3.0).await;
        assert_eq!(s.calls(), 0);
        s.source.running("id1");
        let started = Instant::now();
        // Seen within 1 s; the first probe 5 s after the container started.
        at(started, 4.9).await;
        assert_eq!(s.calls(), 0);
        assert_eq!(
            s.results.get("id1", Kind::Readiness),
            Some(ProbeResult::Failure)
        );
        at(started, 5.1).await;
        assert_eq!(s.calls(), 1);
        assert_eq!(
            s.results.get("id1", Kind::Readiness),
            Some(ProbeResult::Success)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn liveness_failure_holds_until_the_container_is_replaced() {
        let s = Setup::new();
        s.source.running("id1");
        s.set(ProbeResult::Failure);
        let t0 = Instant::now();
        s.start(Kind::Liveness, probe(1, 1, 2, 0), false);
        at(t0, 0.5).await;
        assert_eq!(
            s.results.get("id1", Kind::Liveness),
            Some(ProbeResult::Success),
            "initial value"
        );
        at(t0, 1.5).await;
        assert_eq!(
            s.results.get("id1", Kind::Liveness),
            Some(ProbeResult::Failure)
        );
        assert_eq!(s.results.kill_reason("id1"), Some(Kind::Liveness));
        at(t0, 5.5).await;
        assert_eq!(
            s.calls(),
            2,
            "on hold: no more probes of the failed container"
        );
        s.source.running("id2");
        at(t0, 6.5).await;
        assert_eq!(s.results.get("id1", Kind::Liveness), None);
        assert_eq!(s.calls(), 3);
        at(t0, 7.5).await;
        assert_eq!(
            s.results.get("id2", Kind::Liveness),
            Some(ProbeResult::Failure)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn readiness_waits_for_the_startup_probe() {
        let s = Setup::new();
        s.source.running("id1");
        let t0 = Instant::now();
        s.start(Kind::Readiness, probe(1, 1, 3, 0), true);
        at(t0, 3.5).await;
        assert_eq!(s.calls(), 0);
        s.results
            .set("u", "id1", Kind::Startup, ProbeResult::Success);
        at(t0, 4.5).await;
        assert_eq!(s.calls(), 1);
        assert_eq!(
            s.results.get("id1", Kind::Readiness),
            Some(ProbeResult::Success)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn startup_stops_probing_once_it_succeeded() {
        let s = Setup::new();
        s.source.running("id1");
        s.set(ProbeResult::Failure);
        let t0 = Instant::now();
        s.start(Kind::Startup, probe(1, 1, 5, 0), true);
        at(t0, 2.5).await;
        assert_eq!(s.calls(), 3);
        assert_eq!(
            s.results.get("id1", Kind::Startup),
            Some(ProbeResult::Unknown)
        );
        s.set(ProbeResult::Success);
        at(t0, 3.5).await;
        assert_eq!(
            s.results.get("id1", Kind::Startup),
            Some(ProbeResult::Success)
        );
        at(t0, 8.5).await;
        assert_eq!(s.calls(), 4);
    }

    #[test]
    fn the_first_probe_waits_only_right_after_the_agent_started() {
        let period = Duration::from_secs(10);
        let secs = Duration::from_secs;
        assert_eq!(
            first_probe_delay(period, secs(0), 0.25),
            secs(2) + Duration::from_millis(500)
        );
        assert_eq!(first_probe_delay(period, secs(9), 0.9), secs(9));
        assert_eq!(first_probe_delay(period, secs(9), 0.0), Duration::ZERO);
        // One period or more after the start: no wait, whatever the draw.
        assert_eq!(first_probe_delay(period, secs(10), 0.9), Duration::ZERO);
        assert_eq!(first_probe_delay(period, secs(600), 0.9), Duration::ZERO);
        // A wild draw stays within the period.
        assert_eq!(first_probe_delay(period, secs(0), 7.0), period);
    }

    #[tokio::test(start_paused = true)]
    async fn workers_started_with_the_agent_spread_their_first_probe() {
        // The agent has just started: the first probe waits 0.4 of the 10 s period.
        let mut s = Setup::new();
        s.agent_start = Instant::now();
        s.random = || 0.4;
        s.source.running("id1");
        let t0 = Instant::now();
        s.start(Kind::Readiness, probe(10, 1, 3, 0), false);
        at(t0, 3.9).await;
        assert_eq!(s.calls(), 0);
        assert_eq!(s.results.get("id1", Kind::Readiness), None);
        at(t0, 4.1).await;
        assert_eq!(s.calls(), 1);
        // Then every period from there.
        at(t0, 13.9).await;
        assert_eq!(s.calls(), 1);
        at(t0, 14.1).await;
        assert_eq!(s.calls(), 2);
        // A pod's worker started more than a period after the agent probes at once.
        let later = Setup {
            agent_start: s.agent_start,
            random: || 0.9,
            ..Setup::new()
        };
        later.source.running("id2");
        later.start(Kind::Readiness, probe(10, 1, 3, 0), false);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(later.calls(), 1);
        s.cancel.cancel();
        later.cancel.cancel();
    }
}
