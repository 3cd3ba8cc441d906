//! State-machine tests of the pod workers under paused tokio time, with a fake runtime.
use super::*;
use k8s_openapi::api::core::v1::{PodSpec, PodStatus as ApiPodStatus};
use std::collections::HashSet;
use tokio::time::Instant;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Call {
    Sync(String, String),
    /// The sync of this pod (name) ended with a newer spec waiting.
    Superseded(String, String),
    Terminating(String, i64),
    Terminated(String),
}

#[derive(Default)]
pub(crate) struct Inner {
    pub(crate) calls: Mutex<Vec<(Call, Instant)>>,
    pub(crate) syncs_finished: Mutex<Vec<String>>,
    pub(crate) sync_time: Duration,
    pub(crate) kill_time: Duration,
    pub(crate) terminal: Mutex<HashSet<String>>,
    pub(crate) failing: Mutex<HashSet<String>>,
    pub(crate) requeue_after: Option<Duration>,
    pub(crate) deadline_in: Option<Duration>,
    /// How many kills fail before they succeed.
    pub(crate) kill_failures: std::sync::atomic::AtomicUsize,
}

/// A runtime that records calls and takes the configured time over each.
#[derive(Clone, Default)]
pub(crate) struct Fake(pub(crate) Arc<Inner>);

impl Fake {
    fn record(&self, c: Call) {
        self.0.calls.lock().unwrap().push((c, Instant::now()));
    }

    pub(crate) fn calls(&self) -> Vec<Call> {
        self.0
            .calls
            .lock()
            .unwrap()
            .iter()
            .map(|(c, _)| c.clone())
            .collect()
    }

    fn calls_at(&self) -> Vec<(Call, Instant)> {
        self.0.calls.lock().unwrap().clone()
    }

    pub(crate) fn syncs_of(&self, uid: &str) -> Vec<String> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Sync(u, name) if u == uid => Some(name),
                _ => None,
            })
            .collect()
    }

    pub(crate) fn graces_of(&self, uid: &str) -> Vec<i64> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Terminating(u, g) if u == uid => Some(g),
                _ => None,
            })
            .collect()
    }
}

impl PodSyncer for Fake {
    async fn sync_pod(
        &self,
        uid: &str,
        pod: &Pod,
        cancel: &CancellationToken,
        superseded: &CancellationToken,
    ) -> Result<Synced, runtime::Error> {
        let name = pod.metadata.name.clone().unwrap_or_default();
        self.record(Call::Sync(uid.to_owned(), name.clone()));
        // The whole sync is one interruptible wait here.
        tokio::select! {
            _ = cancel.cancelled() => return Ok(Synced::default()),
            _ = tokio::time::sleep(self.0.sync_time) => {}
        }
        if superseded.is_cancelled() {
            self.record(Call::Superseded(uid.to_owned(), name.clone()));
        }
        self.0.syncs_finished.lock().unwrap().push(uid.to_owned());
        if self.0.failing.lock().unwrap().contains(uid) {
            return Err(runtime::Error::NoSpec(name));
        }
        Ok(Synced {
            terminal: self.0.terminal.lock().unwrap().contains(uid),
            requeue_after: self.0.requeue_after,
            deadline_in: self.0.deadline_in,
            grace_override: None,
        })
    }

    async fn sync_terminating_pod(
        &self,
        uid: &str,
        _pod: &Pod,
        grace: i64,
    ) -> Result<(), runtime::Error> {
        self.record(Call::Terminating(uid.to_owned(), grace));
        tokio::time::sleep(self.0.kill_time).await;
        let failures = &self.0.kill_failures;
        if failures.load(std::sync::atomic::Ordering::SeqCst) > 0 {
            failures.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            return Err(runtime::Error::NoSpec(uid.to_owned()));
        }
        Ok(())
    }

    async fn sync_terminated_pod(&self, uid: &str, _pod: &Pod) -> Result<(), runtime::Error> {
        self.record(Call::Terminated(uid.to_owned()));
        Ok(())
    }
}

struct Harness {
    workers: PodWorkers<Fake>,
    fake: Fake,
    done_rx: mpsc::UnboundedReceiver<String>,
    desired: HashMap<String, ()>,
    purged: Vec<Purged>,
    _cancel: tokio_util::sync::DropGuard,
}

fn harness(inner: Inner) -> Harness {
    let fake = Fake(Arc::new(inner));
    let (done_tx, done_rx) = mpsc::unbounded_channel();
    let cancel = CancellationToken::new();
    Harness {
        workers: PodWorkers::new(fake.clone(), done_tx, TaskTracker::new(), cancel.clone()),
        fake,
        done_rx,
        desired: HashMap::new(),
        purged: Vec::new(),
        _cancel: cancel.drop_guard(),
    }
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

impl Harness {
    fn update(&mut self, kind: UpdateType, pod: &Arc<Pod>) {
        let uid = pod.metadata.uid.clone().unwrap();
        if kind == UpdateType::Create {
            self.desired.insert(uid.clone(), ());
        }
        self.workers.update_pod(&uid, Work::new(kind, pod.clone()));
    }

    fn kill(&mut self, pod: &Arc<Pod>, grace: Option<i64>) {
        let uid = pod.metadata.uid.clone().unwrap();
        self.workers
            .update_pod(&uid, Work::kill(pod.clone(), grace));
    }

    /// Lets time pass, handling finished workers as the sync loop does.
    async fn run_for(&mut self, d: Duration) {
        let deadline = Instant::now() + d;
        loop {
            tokio::select! {
                Some(uid) = self.done_rx.recv() => {
                    let p = self.workers.on_finished(&uid, &self.desired);
                    self.purged.extend(p);
                }
                _ = tokio::time::sleep_until(deadline) => return,
            }
        }
    }
}

/// A harness whose pod "u1" (named `name`) was created a second ago.
async fn running(inner: Inner, name: &str) -> (Harness, Arc<Pod>) {
    let mut h = harness(inner);
    let p = pod("u1", name);
    h.update(UpdateType::Create, &p);
    h.run_for(secs(1)).await;
    (h, p)
}

pub(crate) fn pod(uid: &str, name: &str) -> Arc<Pod> {
    let mut p = Pod::default();
    p.metadata.uid = Some(uid.into());
    p.metadata.name = Some(name.into());
    p.metadata.namespace = Some("default".into());
    p.spec = Some(PodSpec {
        termination_grace_period_seconds: Some(30),
        ..Default::default()
    });
    Arc::new(p)
}

fn static_pod(uid: &str, name: &str, version: &str) -> Arc<Pod> {
    let mut p = (*pod(uid, name)).clone();
    p.metadata.annotations = Some(
        [
            (
                crate::config::CONFIG_SOURCE_ANNOTATION.to_owned(),
                "file".to_owned(),
            ),
            ("v".to_owned(), version.to_owned()),
        ]
        .into(),
    );
    Arc::new(p)
}

fn renamed(p: &Arc<Pod>, label: &str) -> Arc<Pod> {
    // The fake records metadata.name; keep the UID, vary the name to tell versions apart.
    let mut p = (**p).clone();
    p.metadata.name = Some(label.into());
    Arc::new(p)
}

/// A harness whose pod "u1" (named v0, syncs take 1 s) was created 10 ms ago: its first sync
/// runs.
async fn syncing() -> (Harness, Arc<Pod>) {
    let mut h = harness(Inner {
        sync_time: secs(1),
        ..Default::default()
    });
    let base = pod("u1", "v0");
    h.update(UpdateType::Create, &base);
    h.run_for(Duration::from_millis(10)).await;
    (h, base)
}

#[tokio::test(start_paused = true)]
async fn coalescing_newest_wins_with_bounded_syncs() {
    let (mut h, base) = syncing().await;
    for i in 1..=100 {
        h.update(UpdateType::Update, &renamed(&base, &format!("v{i}")));
    }
    h.run_for(secs(10)).await;
    assert_eq!(h.fake.syncs_of("u1"), ["v0", "v100"]);
    let marks = h.workers.timelines().get("u1").unwrap();
    assert_eq!(marks.updates, 101);
    assert_eq!(marks.syncs, 2);
}

#[tokio::test(start_paused = true)]
async fn a_sync_learns_that_a_newer_spec_waits_but_not_of_a_resync_of_its_own() {
    let (mut h, base) = syncing().await;
    // The same spec again (a resync, a PLEG event): the sync goes on unwarned.
    h.update(UpdateType::Sync, &base);
    h.run_for(secs(2)).await;
    let superseded = |h: &Harness| {
        h.fake
            .calls()
            .into_iter()
            .filter(|c| matches!(c, Call::Superseded(..)))
            .count()
    };
    assert_eq!(superseded(&h), 0);
    // Another spec while a sync runs: that sync is told.
    let mut newer = (*base).clone();
    if let Some(spec) = newer.spec.as_mut() {
        spec.termination_grace_period_seconds = Some(5);
    }
    h.update(UpdateType::Update, &base);
    h.run_for(Duration::from_millis(10)).await;
    h.update(UpdateType::Update, &Arc::new(newer));
    h.run_for(secs(3)).await;
    assert!(
        h.fake
            .calls()
            .contains(&Call::Superseded("u1".into(), "v0".into())),
        "{:?}",
        h.fake.calls()
    );
    assert_eq!(superseded(&h), 1, "the newer spec's own sync is not");
}

#[tokio::test(start_paused = true)]
async fn kill_is_never_lost_to_a_later_update() {
    let mut h = harness(Inner::default());
    let p = pod("u1", "web");
    h.update(UpdateType::Create, &p);
    h.kill(&p, Some(10));
    h.update(UpdateType::Update, &renamed(&p, "web-edited"));
    h.update(UpdateType::Sync, &p);
    h.run_for(secs(5)).await;
    assert_eq!(
        h.fake.calls(),
        [
            Call::Terminating("u1".into(), 10),
            Call::Terminated("u1".into()),
        ]
    );
    assert!(h.workers.is_finished("u1"));
    // Later updates do not wake it either.
    h.update(UpdateType::Update, &p);
    h.run_for(secs(5)).await;
    assert_eq!(h.fake.calls().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn kill_cancels_a_running_sync() {
    let (mut h, p) = running(
        Inner {
            sync_time: secs(60),
            ..Default::default()
        },
        "slow",
    )
    .await;
    let killed_at = Instant::now();
    h.kill(&p, Some(3));
    h.run_for(secs(5)).await;
    let calls = h.fake.calls_at();
    let (call, at) = &calls[1];
    assert_eq!(call, &Call::Terminating("u1".into(), 3));
    assert!(
        *at - killed_at < Duration::from_millis(10),
        "{:?}",
        *at - killed_at
    );
    assert!(
        h.fake.0.syncs_finished.lock().unwrap().is_empty(),
        "the sync ran to its end"
    );
}

#[tokio::test(start_paused = true)]
async fn grace_period_only_shrinks_and_never_below_one() {
    let (mut h, p) = running(
        Inner {
            kill_time: secs(100),
            ..Default::default()
        },
        "web",
    )
    .await;
    h.kill(&p, Some(20));
    h.run_for(secs(1)).await;
    h.kill(&p, Some(5));
    h.run_for(secs(1)).await;
    h.kill(&p, Some(10));
    h.update(UpdateType::Update, &p);
    h.run_for(secs(1)).await;
    h.kill(&p, Some(0));
    h.run_for(secs(1)).await;
    // 20, cut short by 5; 10 and the plain update keep 5 and do not interrupt; 0 becomes 1.
    assert_eq!(&h.fake.graces_of("u1")[..3], [20, 5, 1]);
    assert!(h.fake.graces_of("u1")[3..].iter().all(|g| *g == 1));

    let mut deleted = (*p).clone();
    deleted.metadata.deletion_grace_period_seconds = Some(8);
    assert_eq!(effective_grace(0, &deleted, None), (8, false));
    assert_eq!(effective_grace(0, &p, None), (30, false));
    assert_eq!(effective_grace(5, &deleted, Some(20)), (5, false));
    assert_eq!(effective_grace(30, &deleted, Some(2)), (2, true));
    assert_eq!(effective_grace(0, &p, Some(-3)), (1, false));
}

#[tokio::test(start_paused = true)]
async fn static_pods_with_one_full_name_run_one_at_a_time_first_come_first_served() {
    let mut h = harness(Inner {
        kill_time: secs(2),
        ..Default::default()
    });
    let a = static_pod("a", "web", "1");
    let b = static_pod("b", "web", "2");
    let c = static_pod("c", "web", "3");
    let d = static_pod("d", "web", "4");
    let other = static_pod("x", "db", "1");
    for p in [&a, &b, &c, &d, &other] {
        h.update(UpdateType::Create, p);
    }
    h.run_for(secs(1)).await;
    assert_eq!(h.fake.syncs_of("a"), ["web"]);
    assert_eq!(
        h.fake.syncs_of("x"),
        ["db"],
        "another full name is not held up"
    );
    for w in ["b", "c", "d"] {
        assert!(h.fake.syncs_of(w).is_empty(), "{w} started beside a");
    }
    // c is killed while it waits: it never starts.
    h.kill(&c, None);
    h.kill(&a, Some(1));
    h.run_for(secs(10)).await;
    let calls = h.fake.calls();
    let a_done = calls
        .iter()
        .position(|c| *c == Call::Terminated("a".into()))
        .unwrap();
    let b_start = calls
        .iter()
        .position(|c| *c == Call::Sync("b".into(), "web".into()))
        .unwrap();
    assert!(a_done < b_start, "{calls:?}");
    assert!(h.fake.syncs_of("c").is_empty() && h.fake.graces_of("c").is_empty());
    assert!(
        h.fake.syncs_of("d").is_empty(),
        "d runs beside b: {calls:?}"
    );
    assert!(h.workers.is_finished("c"));
    // A static pod that arrives already terminal never starts either, and finishes at once.
    let mut failed = (*static_pod("f", "web", "5")).clone();
    failed.status = Some(ApiPodStatus {
        phase: Some("Failed".into()),
        ..Default::default()
    });
    h.update(UpdateType::Create, &Arc::new(failed));
    h.run_for(secs(1)).await;
    assert!(h.workers.is_finished("f"));
    assert!(h.fake.graces_of("f").is_empty() && h.fake.syncs_of("f").is_empty());
    h.kill(&b, Some(1));
    h.run_for(secs(10)).await;
    assert_eq!(h.fake.syncs_of("d"), ["web"]);
}

#[tokio::test(start_paused = true)]
async fn terminal_phase_stops_the_pod_and_it_is_not_synced_again() {
    let mut h = harness(Inner::default());
    h.fake.0.terminal.lock().unwrap().insert("u1".into());
    let mut p = (*pod("u1", "job")).clone();
    if let Some(s) = p.spec.as_mut() {
        s.termination_grace_period_seconds = Some(7);
    }
    let p = Arc::new(p);
    h.update(UpdateType::Create, &p);
    h.run_for(secs(5)).await;
    assert_eq!(
        h.fake.calls(),
        [
            Call::Sync("u1".into(), "job".into()),
            Call::Terminating("u1".into(), 7),
            Call::Terminated("u1".into()),
        ]
    );
    for kind in [UpdateType::Sync, UpdateType::Update] {
        h.update(kind, &p);
    }
    h.run_for(secs(120)).await;
    assert_eq!(h.fake.calls().len(), 3, "{:?}", h.fake.calls());
    // Still desired and not asked to restart: the finished worker stays, so it stays stopped.
    assert!(h.purged.is_empty());
    assert!(h.workers.sync_known_pods(&h.desired).is_empty());
    assert!(h.workers.is_known("u1"));

    // A pod that arrives already Failed is never synced.
    let mut failed = (*pod("u2", "done")).clone();
    failed.status = Some(ApiPodStatus {
        phase: Some("Failed".into()),
        ..Default::default()
    });
    h.update(UpdateType::Create, &Arc::new(failed));
    h.run_for(secs(5)).await;
    assert!(h.fake.syncs_of("u2").is_empty());
    assert_eq!(h.fake.graces_of("u2"), [30]);
}

#[tokio::test(start_paused = true)]
async fn runtime_pods_no_source_knows_are_killed_with_one_second_grace() {
    let mut h = harness(Inner::default());
    let mut sync_only = Work::orphan_kill("ghost");
    sync_only.kind = UpdateType::Sync;
    h.workers.update_pod("ghost", sync_only);
    assert!(
        !h.workers.is_known("ghost"),
        "only kills make a runtime pod known"
    );
    h.workers.update_pod("ghost", Work::orphan_kill("ghost"));
    h.run_for(secs(5)).await;
    assert_eq!(
        h.fake.calls(),
        [Call::Terminating("ghost".into(), ORPHAN_GRACE)]
    );
    // Finished and not desired: purged at once.
    assert_eq!(
        h.purged,
        [Purged {
            uid: "ghost".into(),
            restart_requested: false
        }]
    );
    assert!(!h.workers.is_known("ghost"));
}

#[tokio::test(start_paused = true)]
async fn housekeeping_terminates_workers_of_pods_no_source_wants() {
    let mut h = harness(Inner::default());
    let mut p = (*pod("u1", "web")).clone();
    if let Some(s) = p.spec.as_mut() {
        s.termination_grace_period_seconds = Some(12);
    }
    let p = Arc::new(p);
    h.update(UpdateType::Create, &p);
    h.run_for(secs(1)).await;
    h.desired.clear();
    assert!(h.workers.sync_known_pods(&h.desired).is_empty());
    h.run_for(secs(1)).await;
    assert_eq!(h.fake.graces_of("u1"), [12]);
    assert_eq!(h.purged.len(), 1);
    assert!(!h.workers.is_known("u1"));
}

#[tokio::test(start_paused = true)]
async fn create_while_terminating_restarts_only_after_the_purge() {
    let (mut h, p) = running(
        Inner {
            kill_time: secs(3),
            ..Default::default()
        },
        "v1",
    )
    .await;
    h.kill(&p, Some(1));
    h.run_for(secs(1)).await;
    h.update(UpdateType::Create, &renamed(&p, "v2"));
    assert!(h.workers.is_terminating("u1"));
    h.run_for(secs(10)).await;
    assert_eq!(h.fake.syncs_of("u1"), ["v1"], "restarted before the purge");
    assert_eq!(
        h.purged,
        [Purged {
            uid: "u1".into(),
            restart_requested: true
        }]
    );
    assert!(!h.workers.is_known("u1"), "finished worker removed");
    // The sync loop creates it afresh.
    h.update(UpdateType::Create, &renamed(&p, "v2"));
    h.run_for(secs(1)).await;
    assert_eq!(h.fake.syncs_of("u1"), ["v1", "v2"]);
}

#[tokio::test(start_paused = true)]
async fn completed_work_is_queued_for_resync_or_retry() {
    let mut h = harness(Inner::default());
    h.fake.0.failing.lock().unwrap().insert("bad".into());
    h.update(UpdateType::Create, &pod("ok", "ok"));
    h.update(UpdateType::Create, &pod("bad", "bad"));
    h.run_for(Duration::from_millis(1)).await;
    let now = Instant::now();
    let ok = h.workers.queue().due_at("ok").unwrap() - now;
    assert!(ok >= RESYNC && ok <= RESYNC.mul_f64(1.5), "{ok:?}");
    let bad = h.workers.queue().due_at("bad").unwrap() - now;
    assert!(
        bad >= ERROR_BACKOFF && bad <= ERROR_BACKOFF.mul_f64(1.5),
        "{bad:?}"
    );
    // No per-worker timer: nothing syncs again on its own.
    h.run_for(secs(300)).await;
    assert_eq!(h.fake.syncs_of("ok").len(), 1);

    let mut h = harness(Inner {
        requeue_after: Some(secs(7)),
        ..Default::default()
    });
    h.update(UpdateType::Create, &pod("u", "u"));
    h.run_for(Duration::from_millis(1)).await;
    // Enqueued when the sync finished, a millisecond ago at most.
    let left = h.workers.queue().due_at("u").unwrap() - Instant::now();
    assert!(left <= secs(7) && left > secs(6), "{left:?}");
}

#[tokio::test(start_paused = true)]
async fn a_pod_with_an_active_deadline_is_synced_again_when_it_passes() {
    // No other reason to look again: due at the deadline, not at the 60 s resync.
    let mut h = harness(Inner {
        deadline_in: Some(Duration::from_millis(2_500)),
        ..Default::default()
    });
    h.update(UpdateType::Create, &pod("u", "u"));
    h.run_for(Duration::from_millis(1)).await;
    let left = h.workers.queue().due_at("u").unwrap() - Instant::now();
    assert!(
        left <= Duration::from_millis(2_500) && left > secs(2),
        "{left:?}"
    );
    // A sooner reason (a back-off ending) wins; a later one waits for the deadline.
    for (requeue, deadline, want) in [(1, 5, 1), (9, 4, 4)] {
        let mut h = harness(Inner {
            requeue_after: Some(secs(requeue)),
            deadline_in: Some(secs(deadline)),
            ..Default::default()
        });
        h.update(UpdateType::Create, &pod("u", "u"));
        h.run_for(Duration::from_millis(1)).await;
        let left = h.workers.queue().due_at("u").unwrap() - Instant::now();
        assert!(left <= secs(want) && left > secs(want - 1), "{left:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn timeline_marks_update_sync_start_and_finish() {
    let mut h = harness(Inner {
        sync_time: secs(1),
        ..Default::default()
    });
    let timelines = h.workers.timelines();
    let p = pod("u1", "web");
    h.update(UpdateType::Create, &p);
    let m = timelines.get("u1").unwrap();
    assert!(m.first_update_received > 0 && m.sync_started == 0);
    h.run_for(secs(2)).await;
    let m = timelines.get("u1").unwrap();
    assert!(m.first_update_received <= m.first_sync_started);
    assert!(m.first_sync_started <= m.first_sync_finished);
    assert_eq!((m.updates, m.syncs), (1, 1));
    assert_eq!(timelines.all().len(), 1);
    h.desired.clear();
    h.workers.sync_known_pods(&h.desired);
    h.run_for(secs(2)).await;
    assert!(
        timelines.get("u1").is_none(),
        "purged pods leave the timelines"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_kill_is_retried_quickly_then_left_to_the_work_queue() {
    let (mut h, p) = running(
        Inner {
            kill_failures: 3.into(),
            ..Default::default()
        },
        "web",
    )
    .await;
    let killed = Instant::now();
    h.kill(&p, Some(1));
    h.run_for(secs(5)).await;
    // Three failures, retried after 100, 200 and 400 ms: done 700 ms after the kill.
    let calls = h.fake.calls_at();
    let kills: Vec<Duration> = calls
        .iter()
        .filter(|(c, _)| matches!(c, Call::Terminating(..)))
        .map(|(_, at)| *at - killed)
        .collect();
    assert_eq!(
        kills,
        [0, 100, 300, 700].map(Duration::from_millis),
        "{calls:?}"
    );
    assert!(h.workers.is_known("u1") && h.purged.is_empty());
    assert_eq!(
        calls.last().map(|c| &c.0),
        Some(&Call::Terminated("u1".into()))
    );

    // Failing for longer: the worker gives up after 1.5 s and the work queue retries later.
    let mut h = harness(Inner {
        kill_failures: 100.into(),
        ..Default::default()
    });
    h.update(UpdateType::Create, &p);
    h.run_for(secs(1)).await;
    h.kill(&p, Some(1));
    h.run_for(secs(5)).await;
    assert_eq!(h.fake.graces_of("u1").len(), 5);
    assert!(h.workers.queue().due_at("u1").is_some());
}

#[tokio::test(start_paused = true)]
async fn a_deletion_timestamp_terminates_with_the_deletion_grace_period() {
    let (mut h, p) = running(Inner::default(), "web").await;
    let mut deleted = (*p).clone();
    deleted.metadata.deletion_timestamp = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()),
    );
    deleted.metadata.deletion_grace_period_seconds = Some(4);
    h.update(UpdateType::Update, &Arc::new(deleted));
    h.run_for(secs(1)).await;
    assert_eq!(h.fake.graces_of("u1"), [4]);
    assert!(h.workers.is_finished("u1"));
}

#[test]
fn uid_hash_is_stable_and_spreads_uids() {
    use std::hash::BuildHasher;
    let h = UidHash::default();
    let uids: Vec<String> = (0..10_000).map(|i| format!("{i:032x}")).collect();
    assert_eq!(h.hash_one(&uids[7]), h.hash_one(uids[7].clone()));
    // The low 14 bits (what a 16k-bucket table uses) of 10,000 sequential UIDs barely collide.
    let buckets: HashSet<u64> = uids.iter().map(|u| h.hash_one(u) & 0x3fff).collect();
    assert!(buckets.len() > 7_000, "{} distinct buckets", buckets.len());
    // Prefixes of one another do not collide.
    assert_ne!(h.hash_one("abc"), h.hash_one("abc\0"));
}

#[test]
fn a_repeated_failure_is_logged_once_per_period_and_a_new_one_at_once() {
    let mut w = Warned::default();
    let secs = |s: u64| s * 1_000_000_000;
    assert_eq!(w.should_log("pull failed", secs(1)), Some(0));
    for t in 2..20 {
        assert_eq!(w.should_log("pull failed", secs(t * 10)), None);
    }
    // A different error is news.
    assert_eq!(w.should_log("disk full", secs(200)), Some(18));
    assert_eq!(w.should_log("disk full", secs(210)), None);
    // The same error again after the period: logged, with the count held back.
    let later = secs(200) + REPEAT_WARNING.as_nanos() as u64;
    assert_eq!(w.should_log("disk full", later), Some(1));
}
