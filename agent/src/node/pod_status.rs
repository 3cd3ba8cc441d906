//! Pod status write-back: the status the pod workers compute reaches the API server, as the
//! kubelet's status manager sends it.
//!
//! - Woken by every change of a pod in the status manager (and every [`RECONCILE`] for all
//!   pods), it patches `pods/<name>/status` of each pod of the `api` source whose status differs
//!   from the one it last wrote; an unchanged status is never written. The patch is a strategic
//!   merge patch carrying `metadata.uid` (a precondition: a new pod of the same name is not
//!   written over) and the whole status: the conditions swiftlet does not own (readiness gates,
//!   a scheduler's) stay as others wrote them.
//! - A status never goes back from a terminal phase (Succeeded, Failed) to another, and nothing
//!   is written for a pod before its worker has read the runtime once (after an agent restart
//!   the status on the node starts from the server's own; see `status::generate::continue_from`).
//! - A pod deleted through the API (it has a `deletionTimestamp`) is terminated by its worker
//!   with its grace period; once the worker has finished it (containers stopped, cgroup and
//!   directories gone) and its last status is written, it is deleted with grace 0 and a UID
//!   precondition, which removes it from the API server.
//! - A failed write is retried at the next change or reconcile; 404 (the pod is gone) and 409
//!   (another pod of that name) end the pod's writes. A pod's writes that take longer than
//!   [`WRITE_TIMEOUT`] are abandoned (counted `result="timeout"`) and the pass ends there: an API
//!   server that does not answer holds the writer no longer than that.
//! - `swiftlet_pod_status_write_delay_seconds`: from a pod's change in the status manager to its
//!   patch answered.
//!
//! - A static pod's status goes to its mirror pod: the API's copy of it (same name, namespace,
//!   labels and spec; annotation `kubernetes.io/config.mirror` = the static pod's hash; owned
//!   by the Node). The mirror pod is created when missing (once the Node is registered),
//!   replaced when it mirrors another version of the pod or is being deleted, and deleted once
//!   its static pod is gone (checked every [`RECONCILE`]). The pod watch keeps the mirror pods
//!   it sees apart (`config::api::MirrorPods`): they are never run.
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};

use crate::config::api::{Mirror, MirrorPods};
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::pod::Phase;
use crate::status::StatusManager;

/// How often every pod's status is compared with what was written (the kubelet's 10 s).
pub const RECONCILE: Duration = Duration::from_secs(10);

/// How long one pod's writes, or one pass over the orphaned mirror pods, may take. The shared
/// client bounds no request: a connection the network dropped without closing it (a load
/// balancer's failover, a lost NAT entry) would hold the writer, and every pod's status, for
/// good. An abandoned request takes its connection with it, so the next one dials anew.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(15);

/// What to do about one pod after a pass.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// Nothing more until it changes again.
    Done,
    /// Its status was written (nothing more until it changes again).
    Written,
    /// A write failed: try again at the next pass.
    Retry,
}

/// The writer's memory of each pod it wrote.
#[derive(Default)]
struct Written {
    /// The UID of the API object written (the pod's, or its mirror pod's).
    target: String,
    status: Option<PodStatus>,
    /// Deleted from the API server (or found gone).
    deleted: bool,
}

/// The status to write over `last`, or `None` when nothing is to be written: it is the same,
/// or it would take a terminal phase back.
fn to_write<'a>(last: Option<&PodStatus>, new: &'a PodStatus) -> Option<&'a PodStatus> {
    let phase = |s: &PodStatus| Phase::of(s.phase.as_deref());
    match last {
        Some(l) if l == new => None,
        Some(l)
            if phase(l).is_some_and(Phase::is_terminal)
                && !phase(new).is_some_and(Phase::is_terminal) =>
        {
            tracing::warn!(
                last = ?l.phase,
                new = ?new.phase,
                "a pod status would leave its terminal phase: not written"
            );
            None
        }
        _ => Some(new),
    }
}

/// `new` as the API server may see it: a pod moves to a terminal phase there only once none
/// of its containers can run any more (`terminated`: its worker stopped them), as the kubelet
/// holds it. Until then `new` keeps the phase, reason and message of `old` (the status last
/// written, else the one the API server holds; Pending when there is none). The API server and
/// the controllers act on a terminal phase at once (a Job starts a replacement, a StatefulSet
/// the same identity elsewhere, the garbage collector deletes the pod) while an evicted, preempted
/// or deadline-exceeded pod's containers still run out their grace period.
fn hold_terminal_phase(mut new: PodStatus, old: Option<&PodStatus>, terminated: bool) -> PodStatus {
    let terminal = |s: Option<&PodStatus>| {
        Phase::of(s.and_then(|s| s.phase.as_deref())).is_some_and(Phase::is_terminal)
    };
    if terminated || !terminal(Some(&new)) || terminal(old) {
        return new;
    }
    let old = old.cloned().unwrap_or_default();
    new.phase = Some(
        old.phase
            .unwrap_or_else(|| Phase::Pending.as_str().to_owned()),
    );
    new.reason = old.reason;
    new.message = old.message;
    // The DisruptionTarget condition goes with the terminal phase, as the kubelet sends it.
    let target = crate::status::DISRUPTION_TARGET;
    let had = old.conditions.iter().flatten().any(|c| c.type_ == target);
    if !had && let Some(cs) = new.conditions.as_mut() {
        cs.retain(|c| c.type_ != target);
    }
    new
}

/// The strategic merge patch that writes `status` to the pod with UID `uid` over `old` (the
/// status the server holds as far as the agent knows; `None`: unknown, the whole status is
/// sent): only what changed, with what is gone removed ([`super::status_diff`]). `None` when
/// nothing the server would store changed (times differing below the second it keeps).
pub fn status_patch(
    uid: &str,
    old: Option<&PodStatus>,
    status: &PodStatus,
) -> Option<serde_json::Value> {
    let new = serde_json::to_value(status).ok()?;
    let changes = match old.map(serde_json::to_value) {
        Some(Ok(old)) => super::status_diff::diff(&old, &new)?,
        _ => new,
    };
    Some(serde_json::json!({ "metadata": { "uid": uid }, "status": changes }))
}

struct Writer {
    client: kube::Client,
    status: StatusManager,
    metrics: Metrics,
    written: HashMap<String, Written>,
    /// The mirror pods the pod watch sees.
    mirrors: MirrorPods,
    /// The Node's UID once registered (a mirror pod's owner).
    node: tokio::sync::watch::Receiver<Option<String>>,
    node_name: String,
}

/// The mirror pod of static pod `pod` whose hash (`kubernetes.io/config.hash`) is `hash`: its
/// name, namespace, labels and spec, the annotations with `kubernetes.io/config.mirror`, owned
/// by the Node.
pub fn mirror_pod(pod: &Pod, hash: &str, owner: OwnerReference) -> Pod {
    let mut annotations = pod.metadata.annotations.clone().unwrap_or_default();
    annotations.insert(
        crate::pod::annotations::CONFIG_MIRROR.to_owned(),
        hash.to_owned(),
    );
    Pod {
        metadata: ObjectMeta {
            name: pod.metadata.name.clone(),
            namespace: pod.metadata.namespace.clone(),
            labels: pod.metadata.labels.clone(),
            annotations: Some(annotations),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: pod.spec.clone(),
        status: None,
    }
}

/// A mirror pod's owner: its Node, as the controller reference NodeRestriction requires of a
/// node's pod create (a plain owner reference, as the Lease has, is refused with 403).
pub fn mirror_owner(node_name: &str, node_uid: &str) -> OwnerReference {
    OwnerReference {
        controller: Some(true),
        ..super::lease::node_owner(node_name, node_uid)
    }
}

/// Delete options with grace 0 and a UID precondition (the node's deletes).
fn delete_now(uid: &str) -> DeleteParams {
    DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    }
}

impl Writer {
    /// The UID of static pod `pod`'s mirror pod, made now when it is missing, or replaced when
    /// it mirrors another version of the pod or is being deleted (the kubelet's rules); `None`
    /// for a finished static pod without one. `Err`: try again later (a write failed, or the
    /// Node, the mirror pod's owner, is not registered yet).
    async fn mirror_for(
        &mut self,
        api: &Api<Pod>,
        pod: &Pod,
        ns: &str,
        name: &str,
        terminated: bool,
    ) -> Result<Option<String>, ()> {
        let hash = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(crate::pod::annotations::CONFIG_HASH))
            .cloned()
            .or_else(|| pod.metadata.uid.clone())
            .unwrap_or_default();
        let key = format!("{ns}/{name}");
        match self.mirrors.get(ns, name) {
            Some(m) if m.hash == hash && !m.deleting => return Ok(Some(m.uid)),
            Some(m) => {
                tracing::info!(pod = key, "replacing a stale mirror pod");
                match api.delete(name, &delete_now(&m.uid)).await {
                    Ok(_) => self.metrics.node_api_request("mirror_delete", "ok"),
                    Err(e) if super::error_result(&e) == "not_found" => {}
                    Err(e) => {
                        self.metrics
                            .node_api_request("mirror_delete", super::error_result(&e));
                        tracing::warn!(pod = key, error = %e, "deleting a stale mirror pod failed");
                        return Err(());
                    }
                }
            }
            None if terminated => return Ok(None),
            None => {}
        }
        let Some(node_uid) = self.node.borrow().clone() else {
            return Err(());
        };
        let mirror = mirror_pod(pod, &hash, mirror_owner(&self.node_name, &node_uid));
        match api.create(&PostParams::default(), &mirror).await {
            Ok(created) => {
                self.metrics.node_api_request("mirror_create", "ok");
                let uid = created.metadata.uid.clone().unwrap_or_default();
                tracing::info!(pod = key, mirror_uid = uid, "mirror pod created");
                self.mirrors.upsert(
                    (ns.to_owned(), name.to_owned()),
                    Mirror {
                        uid: uid.clone(),
                        hash,
                        deleting: false,
                    },
                );
                Ok(Some(uid))
            }
            Err(e) => {
                self.metrics
                    .node_api_request("mirror_create", super::error_result(&e));
                tracing::warn!(pod = key, error = %e, "creating the mirror pod failed");
                Err(())
            }
        }
    }

    /// Deletes the mirror pods whose static pod is gone.
    async fn delete_orphaned_mirrors(&mut self) {
        for ((ns, name), m) in self.mirrors.all() {
            let has_static = self.status.find(&ns, &name).is_some_and(|(uid, _)| {
                self.status
                    .api_view(&uid)
                    .is_some_and(|(p, _, _)| crate::pod::is_static(&p))
            });
            if has_static {
                continue;
            }
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
            match api.delete(&name, &delete_now(&m.uid)).await {
                Ok(_) => {
                    self.metrics.node_api_request("mirror_delete", "ok");
                    tracing::info!(pod = %format!("{ns}/{name}"), "orphaned mirror pod deleted");
                }
                Err(e) => {
                    let result = super::error_result(&e);
                    self.metrics.node_api_request("mirror_delete", result);
                    if !matches!(result, "not_found" | "conflict") {
                        tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, "deleting an orphaned mirror pod failed");
                    }
                }
            }
        }
    }

    async fn sync(&mut self, uid: &str) -> Outcome {
        let Some((pod, status, terminated)) = self.status.api_view(uid) else {
            self.written.remove(uid);
            return Outcome::Done;
        };
        // Nothing to write before its worker read the runtime (its next status is a change).
        let Some(status) = status else {
            return Outcome::Done;
        };
        let (Some(ns), Some(name)) = (pod.metadata.namespace.clone(), pod.metadata.name.clone())
        else {
            return Outcome::Done;
        };
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        // The API object the status goes to: the pod itself, or a static pod's mirror pod.
        let target = if crate::pod::is_static(&pod) {
            match self.mirror_for(&api, &pod, &ns, &name, terminated).await {
                Ok(Some(mirror)) => mirror,
                Ok(None) => return Outcome::Done,
                Err(()) => return Outcome::Retry,
            }
        } else if crate::pod::source(&pod) == Some(crate::config::API) {
            uid.to_owned()
        } else {
            return Outcome::Done;
        };
        let w = self.written.entry(uid.to_owned()).or_default();
        if w.target != target {
            // A new object (a recreated mirror pod): it has none of the status yet.
            *w = Written {
                target: target.clone(),
                ..Written::default()
            };
        }
        if w.deleted {
            return Outcome::Done;
        }
        let mut wrote = false;
        // What the server holds: the status last written, else the one the API gave the pod
        // (after a restart: a terminal phase there is never written back, and what the new
        // status lacks is removed).
        let on_server = w.status.as_ref().or(pod.status.as_ref());
        let status = hold_terminal_phase(status, on_server, terminated);
        let patch =
            to_write(on_server, &status).map(|new| (new, status_patch(&target, on_server, new)));
        if let Some((new, None)) = patch {
            // The server holds this already (it differs below what the server stores).
            w.status = Some(new.clone());
        } else if let Some((new, Some(patch))) = patch {
            let sent = api
                .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch))
                .await;
            match sent {
                Ok(_) => {
                    self.metrics.node_api_request("pod_status", "ok");
                    w.status = Some(new.clone());
                    wrote = true;
                }
                Err(e) => return failed(&self.metrics, "pod_status", &ns, &name, &e, w),
            }
        }
        if pod.metadata.deletion_timestamp.is_none() || !terminated {
            return if wrote {
                Outcome::Written
            } else {
                Outcome::Done
            };
        }
        match api.delete(&name, &delete_now(uid)).await {
            Ok(_) => {
                self.metrics.node_api_request("pod_delete", "ok");
                tracing::info!(pod = %format!("{ns}/{name}"), "terminated pod deleted from the API server");
                w.deleted = true;
                if wrote {
                    Outcome::Written
                } else {
                    Outcome::Done
                }
            }
            Err(e) => failed(&self.metrics, "pod_delete", &ns, &name, &e, w),
        }
    }
}

impl Writer {
    /// Counts and logs a write that took longer than [`WRITE_TIMEOUT`].
    fn timed_out(&self, operation: &'static str) {
        self.metrics.node_api_request(operation, "timeout");
        tracing::warn!(
            operation,
            timeout = ?WRITE_TIMEOUT,
            "the API server did not answer a write in time: abandoned, retried at the next pass"
        );
    }
}

/// Counts and logs a failed write; a pod that is gone (404) or replaced (409) is done.
fn failed(
    metrics: &Metrics,
    operation: &'static str,
    ns: &str,
    name: &str,
    e: &kube::Error,
    w: &mut Written,
) -> Outcome {
    let result = super::error_result(e);
    metrics.node_api_request(operation, result);
    let pod = format!("{ns}/{name}");
    match result {
        "not_found" | "conflict" => {
            tracing::info!(
                pod,
                result,
                "the pod is gone from the API server: no more writes"
            );
            w.deleted = true;
            Outcome::Done
        }
        _ => {
            tracing::warn!(pod, error = %e, result, operation, "writing to the API server failed");
            Outcome::Retry
        }
    }
}

/// Writes pod statuses (and deletes finished pods) until `cancel`.
pub async fn run(
    client: kube::Client,
    status: StatusManager,
    mirrors: MirrorPods,
    node: (String, tokio::sync::watch::Receiver<Option<String>>),
    metrics: Metrics,
    cancel: CancellationToken,
) {
    let changes = status.changes();
    let mut tick = tokio::time::interval(RECONCILE);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut writer = Writer {
        client,
        status,
        metrics,
        written: HashMap::new(),
        mirrors,
        node_name: node.0,
        node: node.1,
    };
    let mut retry: BTreeMap<String, Instant> = BTreeMap::new();
    loop {
        let mut due: BTreeMap<String, Instant> = tokio::select! {
            () = cancel.cancelled() => return,
            () = changes.notified() => writer.status.take_changed().into_iter().collect(),
            _ = tick.tick() => {
                let now = Instant::now();
                let mut all: BTreeMap<String, Instant> =
                    writer.status.uids().into_iter().map(|u| (u, now)).collect();
                writer.written.retain(|uid, _| all.contains_key(uid));
                if tokio::time::timeout(WRITE_TIMEOUT, writer.delete_orphaned_mirrors())
                    .await
                    .is_err()
                {
                    writer.timed_out("mirror_delete");
                }
                // A change seen before the tick keeps its own time.
                all.extend(writer.status.take_changed());
                all
            }
        };
        for (uid, since) in std::mem::take(&mut retry) {
            due.entry(uid).or_insert(since);
        }
        let mut due = due.into_iter();
        while let Some((uid, since)) = due.next() {
            let Ok(outcome) = tokio::time::timeout(WRITE_TIMEOUT, writer.sync(&uid)).await else {
                // The API server does not answer: the pass ends, everything left is retried.
                writer.timed_out("pod_status");
                retry.insert(uid, since);
                retry.extend(due);
                break;
            };
            match outcome {
                Outcome::Retry => {
                    retry.insert(uid, since);
                }
                Outcome::Written => writer
                    .metrics
                    .pod_status_write_delay_seconds
                    .observe(since.elapsed().as_secs_f64()),
                Outcome::Done => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(phase: &str) -> PodStatus {
        PodStatus {
            phase: Some(phase.to_owned()),
            ..PodStatus::default()
        }
    }

    #[test]
    fn only_a_new_status_is_written_and_never_back_from_terminal() {
        assert!(to_write(None, &st("Pending")).is_some());
        assert!(to_write(Some(&st("Running")), &st("Running")).is_none());
        assert!(to_write(Some(&st("Running")), &st("Failed")).is_some());
        assert!(to_write(Some(&st("Failed")), &st("Running")).is_none());
        assert!(to_write(Some(&st("Succeeded")), &st("Failed")).is_some());
    }

    #[test]
    fn a_terminal_phase_waits_until_the_containers_are_stopped() {
        let failed = |reason: &str| PodStatus {
            reason: Some(reason.to_owned()),
            message: Some(format!("{reason} message")),
            container_statuses: Some(Vec::new()),
            conditions: Some(vec![k8s_openapi::api::core::v1::PodCondition {
                type_: crate::status::DISRUPTION_TARGET.into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..st("Failed")
        };
        let running = st("Running");
        for reason in ["Evicted", "Preempting", "DeadlineExceeded"] {
            // Containers may still run: the API keeps seeing Running, with the rest of the new
            // status (the containers' states, the Ready condition) written.
            let held = hold_terminal_phase(failed(reason), Some(&running), false);
            assert_eq!(
                (held.phase.as_deref(), held.reason, held.message),
                (Some("Running"), None, None),
                "{reason}"
            );
            assert_eq!(held.container_statuses, Some(Vec::new()));
            assert_eq!(
                held.conditions,
                Some(Vec::new()),
                "DisruptionTarget waits too"
            );
            // Stopped: the terminal phase goes through.
            let done = hold_terminal_phase(failed(reason), Some(&running), true);
            assert_eq!(done, failed(reason));
        }
        // Nothing written and no status from the API yet: Pending.
        let first = hold_terminal_phase(failed("Evicted"), None, false);
        assert_eq!(first.phase.as_deref(), Some("Pending"));
        // Already terminal there: not held (a later terminal write may refine it).
        let again = hold_terminal_phase(failed("Evicted"), Some(&st("Failed")), false);
        assert_eq!(again, failed("Evicted"));
        // Not terminal: unchanged.
        assert_eq!(
            hold_terminal_phase(st("Running"), Some(&st("Pending")), false),
            st("Running")
        );
    }

    #[test]
    fn a_mirror_pod_copies_the_static_pod_with_its_hash_and_owner() {
        let mut p = Pod::default();
        p.metadata.name = Some("web-n1".into());
        p.metadata.namespace = Some("default".into());
        p.metadata.uid = Some("static-uid".into());
        p.metadata.resource_version = Some("7".into());
        p.metadata.labels = Some([("app".to_owned(), "web".to_owned())].into());
        p.spec = Some(Default::default());
        let m = mirror_pod(&p, "hash-1", mirror_owner("n1", "node-uid"));
        assert_eq!(m.metadata.name.as_deref(), Some("web-n1"));
        assert!(m.metadata.uid.is_none() && m.metadata.resource_version.is_none());
        assert_eq!(m.metadata.labels, p.metadata.labels);
        assert_eq!(
            m.metadata.annotations.unwrap()[crate::pod::annotations::CONFIG_MIRROR],
            "hash-1"
        );
        let owner = &m.metadata.owner_references.unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("Node", "node-uid")
        );
        assert_eq!(
            owner.controller,
            Some(true),
            "NodeRestriction needs a controller reference"
        );
        assert!(m.spec.is_some() && m.status.is_none());
    }

    #[test]
    fn the_patch_carries_the_uid_precondition_and_the_status() {
        let p = status_patch("u-1", None, &st("Running")).expect("a patch");
        assert_eq!(p["metadata"]["uid"], "u-1");
        assert_eq!(p["status"]["phase"], "Running");
        let mut running = st("Running");
        running.pod_ip = Some("10.0.0.1".into());
        let p = status_patch("u-1", Some(&running), &st("Failed")).expect("a patch");
        assert_eq!(status_patch("u-1", Some(&running), &running), None);
        assert_eq!(
            p["status"],
            serde_json::json!({"phase": "Failed", "podIP": null})
        );
    }
}
