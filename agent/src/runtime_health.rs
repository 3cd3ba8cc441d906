//! The container runtime's health as the node status reports it, checked off the status path.
//!
//! One task ([`run`]) asks CRI `Status` every [`CHECK_PERIOD`], each check bounded by
//! [`CHECK_DEADLINE`], and beside it keeps the runtime's version (CRI `Version`) and image list
//! (CRI `ListImages`) fresh: every [`REFRESH_PERIOD`], every [`CHECK_PERIOD`] while a refresh
//! fails. It publishes what it saw as a [`RuntimeHealth`] through a `watch` channel; the node
//! status loop reads that record and never calls the runtime itself, and the PLEG relists every
//! period while a check fails (see [`crate::pleg`]). This is the kubelet's
//! shape: its runtime-up check runs every 5 s apart from the status, records the time of the
//! runtime's last good answer and the conditions it reported, and its node status reads the
//! record (and an image list refreshed every 30 s).
//!
//! The rule ([`RuntimeHealth::not_ready`]): the runtime is down once its last good answer (a
//! `Status` answer carrying a status) is [`DOWN_AFTER`] old, counted from the start until the
//! first one; before the first answer, within that time, the status check "may not have
//! completed yet". So a runtime that stops answering turns the node NotReady within
//! [`DOWN_AFTER`] plus one status update, whatever `--runtime-request-timeout` is (a status path
//! that called the runtime itself waited out that timeout, 2 minutes by default, once per call),
//! and a single failed check does not turn it NotReady. A runtime that answers but reports
//! `RuntimeReady` or `NetworkReady` false is not ready at once, in the words of
//! [`runtime_problems`].
//!
//! Failed checks are counted by the CRI client (`swiftlet_runtime_operations_errors_total{
//! operation="Status"}`; a check past its deadline also in
//! `swiftlet_cri_deadline_exceeded_total{method="Status"}`).
use std::time::Duration;

use k8s_cri::v1 as cri;
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::cri::Cri;

/// How often CRI `Status` is asked (the kubelet's runtime-up check period).
pub const CHECK_PERIOD: Duration = Duration::from_secs(5);
/// How long one check waits for its answer (at most `--runtime-request-timeout`): a check
/// abandoned sooner leaves room for the next one, so a runtime that answers again is seen
/// within this and a period, not after a hung call's full request timeout.
pub const CHECK_DEADLINE: Duration = Duration::from_secs(10);
/// How old the last good answer may be before the runtime is down (the kubelet's
/// `baseRuntimeSyncThreshold`).
pub const DOWN_AFTER: Duration = Duration::from_secs(30);
/// How often the version and the image list are refreshed (the kubelet's image cache period).
pub const REFRESH_PERIOD: Duration = Duration::from_secs(30);

/// What the checks saw, as [`run`] publishes it.
#[derive(Debug, Clone)]
pub struct RuntimeHealth {
    /// When the checks began (the agent's start).
    pub since: Instant,
    /// When CRI `Status` last answered with a status.
    pub answered: Option<Instant>,
    /// What that answer reported wrong, in the Ready condition's words (empty: nothing).
    pub problems: Vec<String>,
    /// Why the last check failed, when it did (cleared by a good answer).
    pub failure: Option<String>,
    /// `<runtime name>://<version>` from CRI `Version`'s last answer.
    pub version: Option<String>,
    /// CRI `ListImages`'s last answer.
    pub images: Option<Vec<cri::Image>>,
    /// Whether a refresh of the version and the images has finished (answered or not).
    pub refreshed: bool,
}

impl RuntimeHealth {
    /// Nothing seen yet; the checks begin at `since`.
    pub fn new(since: Instant) -> Self {
        Self {
            since,
            answered: None,
            problems: Vec::new(),
            failure: None,
            version: None,
            images: None,
            refreshed: false,
        }
    }

    /// Whether the first check and the first refresh have finished, however they ended.
    pub fn observed(&self) -> bool {
        (self.answered.is_some() || self.failure.is_some()) && self.refreshed
    }

    /// Records a check that ended at `now`: the runtime's status, or why there was none.
    pub fn record(&mut self, check: Result<cri::RuntimeStatus, String>, now: Instant) {
        match check {
            Ok(status) => {
                self.answered = Some(now);
                self.problems = runtime_problems(&status);
                self.failure = None;
            }
            Err(why) => self.failure = Some(why),
        }
    }

    /// Why the runtime keeps the node from being Ready at `now`, in the Ready condition's words
    /// (empty: it does not). The words stay the same while nothing new is seen, so an
    /// unchanged runtime never makes the status look changed.
    pub fn not_ready(&self, now: Instant) -> Vec<String> {
        let last = self.answered.unwrap_or(self.since);
        if now.saturating_duration_since(last) >= DOWN_AFTER {
            let mut why = format!(
                "container runtime is down: no good answer to CRI Status for {}s",
                DOWN_AFTER.as_secs()
            );
            if let Some(failure) = &self.failure {
                why.push_str(&format!(" (the last check: {failure})"));
            }
            return vec![why];
        }
        match self.answered {
            None => vec!["container runtime status check may not have completed yet".to_owned()],
            Some(_) => self.problems.clone(),
        }
    }
}

/// A new record, checks beginning now, and the channel [`run`] publishes through.
pub fn channel() -> (watch::Sender<RuntimeHealth>, watch::Receiver<RuntimeHealth>) {
    watch::channel(RuntimeHealth::new(Instant::now()))
}

/// The problems an answered `Status` reports, as the Ready condition words them (none: ready).
pub fn runtime_problems(status: &cri::RuntimeStatus) -> Vec<String> {
    [
        ("RuntimeReady", "container runtime not ready"),
        ("NetworkReady", "container runtime network not ready"),
    ]
    .iter()
    .filter_map(
        |(type_, words)| match status.conditions.iter().find(|c| c.r#type == *type_) {
            Some(c) if c.status => None,
            Some(c) => Some(format!(
                "{words}: {type_}=false reason:{} message:{}",
                c.reason, c.message
            )),
            None => Some(format!("{words}: the runtime reports no {type_} condition")),
        },
    )
    .collect()
}

/// A failed call in the record's words; a check past its deadline says how long it waited
/// (the CRI client's wording names `--runtime-request-timeout`, which the check shortens).
fn failure(e: &crate::cri::Error) -> String {
    match e {
        crate::cri::Error::DeadlineExceeded { method, deadline } => {
            format!("CRI {method}: no answer within {deadline:?}")
        }
        e => e.to_string(),
    }
}

/// Checks the runtime and refreshes its version and images into `health` until `cancel`.
pub async fn run(cri: Cri, health: watch::Sender<RuntimeHealth>, cancel: CancellationToken) {
    let deadline = CHECK_DEADLINE.min(cri.request_timeout());
    let checks = cri.clone().with_request_timeout(deadline);
    tokio::select! {
        () = cancel.cancelled() => {}
        _ = async { tokio::join!(check(&checks, &health), refresh(&cri, &health)) } => {}
    }
}

/// Asks CRI `Status` every [`CHECK_PERIOD`] (a check that took longer is followed by the next at
/// once) and records each outcome; logs the runtime failing and answering again.
async fn check(cri: &Cri, health: &watch::Sender<RuntimeHealth>) {
    let mut tick = tokio::time::interval(CHECK_PERIOD);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let outcome = cri
            .status(false)
            .await
            .map_err(|e| failure(&e))
            .and_then(|r| {
                r.status
                    .ok_or_else(|| "CRI Status: the runtime answered no status".to_owned())
            });
        let was_failing = health.borrow().failure.is_some();
        match &outcome {
            Err(why) if !was_failing => {
                tracing::warn!(error = %why, "the container runtime failed its status check");
            }
            Ok(_) if was_failing => tracing::info!("the container runtime answers again"),
            _ => {}
        }
        health.send_modify(|h| h.record(outcome, Instant::now()));
    }
}

/// Refreshes the version and the image list: every [`REFRESH_PERIOD`], every [`CHECK_PERIOD`]
/// while either call fails. A failed call keeps the last answer.
async fn refresh(cri: &Cri, health: &watch::Sender<RuntimeHealth>) {
    loop {
        let version = cri
            .version()
            .await
            .ok()
            .map(|v| format!("{}://{}", v.runtime_name, v.runtime_version));
        let images = cri.list_images().await.ok();
        let complete = version.is_some() && images.is_some();
        health.send_modify(|h| {
            h.version = version.or(h.version.take());
            h.images = images.or(h.images.take());
            h.refreshed = true;
        });
        let next = if complete {
            REFRESH_PERIOD
        } else {
            CHECK_PERIOD
        };
        tokio::time::sleep(next).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_cri::v1::{RuntimeCondition, RuntimeStatus};

    fn cond(t: &str, ok: bool) -> RuntimeCondition {
        RuntimeCondition {
            r#type: t.into(),
            status: ok,
            reason: if ok { "" } else { "NoCni" }.into(),
            message: if ok { "" } else { "cni config uninitialized" }.into(),
        }
    }

    fn ready() -> RuntimeStatus {
        RuntimeStatus {
            conditions: vec![cond("RuntimeReady", true), cond("NetworkReady", true)],
        }
    }

    #[test]
    fn runtime_conditions_word_the_ready_condition() {
        assert!(runtime_problems(&ready()).is_empty());
        let no_net = RuntimeStatus {
            conditions: vec![cond("RuntimeReady", true), cond("NetworkReady", false)],
        };
        assert_eq!(
            runtime_problems(&no_net),
            [
                "container runtime network not ready: NetworkReady=false reason:NoCni message:cni config uninitialized"
            ]
        );
        let silent = RuntimeStatus {
            conditions: vec![cond("NetworkReady", true)],
        };
        assert_eq!(
            runtime_problems(&silent),
            ["container runtime not ready: the runtime reports no RuntimeReady condition"]
        );
    }

    #[test]
    fn before_the_first_answer_the_check_may_not_have_completed_then_the_runtime_is_down() {
        let start = Instant::now();
        let mut h = RuntimeHealth::new(start);
        assert!(!h.observed());
        assert_eq!(
            h.not_ready(start + Duration::from_secs(1)),
            ["container runtime status check may not have completed yet"]
        );
        // Failing checks alone change nothing within the threshold, counted from the start.
        h.record(
            Err("CRI Status: refused".into()),
            start + Duration::from_secs(5),
        );
        assert_eq!(
            h.not_ready(start + DOWN_AFTER - Duration::from_millis(1)),
            ["container runtime status check may not have completed yet"]
        );
        assert_eq!(
            h.not_ready(start + DOWN_AFTER),
            [
                "container runtime is down: no good answer to CRI Status for 30s (the last check: CRI Status: refused)"
            ]
        );
    }

    #[test]
    fn the_runtime_is_down_once_its_last_good_answer_is_30_s_old() {
        let start = Instant::now();
        let mut h = RuntimeHealth::new(start);
        let answered = start + Duration::from_secs(100);
        h.record(Ok(ready()), answered);
        assert!(h.not_ready(answered).is_empty());
        // A hung check: no failure recorded yet, the answer only ages.
        let just_before = answered + DOWN_AFTER - Duration::from_millis(1);
        assert!(h.not_ready(just_before).is_empty());
        let down = h.not_ready(answered + DOWN_AFTER);
        assert_eq!(
            down,
            ["container runtime is down: no good answer to CRI Status for 30s"]
        );
        // Checks that fail keep the words unchanged while the failure is the same.
        h.record(
            Err("CRI Status: no answer within 10s".into()),
            answered + Duration::from_secs(15),
        );
        let later = h.not_ready(answered + Duration::from_secs(40));
        assert_eq!(later, h.not_ready(answered + Duration::from_secs(400)));
        assert!(
            later[0].starts_with("container runtime is down") && later[0].contains("within 10s"),
            "{later:?}"
        );
        // A good answer ends it at once.
        let back = answered + Duration::from_secs(401);
        h.record(Ok(ready()), back);
        assert!(h.not_ready(back).is_empty());
        assert_eq!(h.failure, None);
    }

    #[test]
    fn an_answered_unhealthy_status_is_not_ready_at_once_and_down_supersedes_it() {
        let start = Instant::now();
        let mut h = RuntimeHealth::new(start);
        let no_net = RuntimeStatus {
            conditions: vec![cond("RuntimeReady", true), cond("NetworkReady", false)],
        };
        h.record(Ok(no_net), start);
        let words = h.not_ready(start);
        assert_eq!(words.len(), 1);
        assert!(
            words[0].starts_with("container runtime network not ready: NetworkReady=false"),
            "{words:?}"
        );
        assert_eq!(
            h.not_ready(start + DOWN_AFTER),
            ["container runtime is down: no good answer to CRI Status for 30s"]
        );
    }

    #[test]
    fn observed_once_a_check_and_a_refresh_finished() {
        let start = Instant::now();
        let mut h = RuntimeHealth::new(start);
        h.refreshed = true;
        assert!(!h.observed(), "no check finished yet");
        h.record(Err("CRI Status: refused".into()), start);
        assert!(h.observed());
    }
}
