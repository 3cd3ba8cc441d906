//! PLEG: relists the runtime (two CRI calls) every period and reports each pod whose sandboxes or
//! containers changed, so the sync loop hands it to its worker. The snapshot of runtime pods also
//! feeds housekeeping's orphan detection.
use crate::runtime::{Manager, RelistEntry};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// The UIDs of pods the runtime held at the last successful relist.
pub type RuntimePods = Arc<RwLock<HashSet<String>>>;

/// UIDs whose entries differ between two relists (appeared, changed or gone).
pub fn changed(
    old: &HashMap<String, RelistEntry>,
    new: &HashMap<String, RelistEntry>,
) -> Vec<String> {
    let mut out: Vec<String> = new
        .iter()
        .filter(|(uid, e)| old.get(*uid) != Some(e))
        .map(|(uid, _)| uid.clone())
        .chain(old.keys().filter(|uid| !new.contains_key(*uid)).cloned())
        .collect();
    out.sort();
    out
}

pub async fn run(
    runtime: Manager,
    period: Duration,
    tx: mpsc::Sender<String>,
    pods: RuntimePods,
    health: crate::kubelet::RuntimeState,
    cancel: CancellationToken,
) {
    let mut old: HashMap<String, RelistEntry> = HashMap::new();
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let new = match runtime.relist().await {
            Ok(n) => n,
            Err(e) => {
                // Keep the old snapshot: events are regenerated on the next good relist.
                tracing::warn!(error = %e, "relist failed");
                health.set(Some(e.to_string()));
                continue;
            }
        };
        health.set(None);
        for uid in changed(&old, &new) {
            if tx.try_send(uid).is_err() {
                tracing::debug!("PLEG channel full; the next relist will report again");
            }
        }
        if let Ok(mut p) = pods.write() {
            *p = new.keys().cloned().collect();
        }
        old = new;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_new_changed_and_gone_pods() {
        let e = |s: i32| RelistEntry {
            sandboxes: vec![("s".into(), 0)],
            containers: vec![("c".into(), s)],
        };
        let old = HashMap::from([
            ("a".to_owned(), e(1)),
            ("b".to_owned(), e(1)),
            ("gone".to_owned(), e(1)),
        ]);
        let new = HashMap::from([
            ("a".to_owned(), e(1)),
            ("b".to_owned(), e(2)),
            ("new".to_owned(), e(1)),
        ]);
        assert_eq!(changed(&old, &new), vec!["b", "gone", "new"]);
        assert!(changed(&new, &new).is_empty());
    }
}
