//! The agent's own Node as the API server has it, watched (a list, then a watch of the one
//! object, as the kubelet's node informer): labels and taints set through the API (`kubectl
//! label node`, `kubectl taint node`) reach admission at once, its capacity and allocatable reach
//! the status loop (resources other components advertise in capacity become allocatable), and a
//! deleted Node prompts the status loop to register it again without waiting for its next status
//! write.
use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::pod::admission;

/// Watches the Node `name` until `cancel`: its labels and taints into `admission` (when they
/// differ from what it holds), its capacity and allocatable into `stored` (emptied when it is
/// deleted), its deletion into `gone`.
pub async fn run(
    api: Api<Node>,
    name: String,
    admission: watch::Sender<admission::Node>,
    stored: watch::Sender<super::status::Stored>,
    gone: Arc<Notify>,
    metrics: Metrics,
    cancel: CancellationToken,
) {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = std::pin::pin!(watcher::watcher(api, config).default_backoff());
    loop {
        let next = tokio::select! {
            () = cancel.cancelled() => return,
            next = events.next() => next,
        };
        match next {
            None => return,
            Some(Ok(Event::Apply(node) | Event::InitApply(node))) => {
                seen(&node, &admission);
                let resources = super::status::Stored::of(&node);
                stored.send_if_modified(|held| {
                    let changed = *held != resources;
                    *held = resources;
                    changed
                });
            }
            Some(Ok(Event::Delete(_))) => {
                tracing::info!(node = name, "the Node was deleted from the API server");
                stored.send_replace(super::status::Stored::default());
                gone.notify_one();
            }
            Some(Ok(Event::Init | Event::InitDone)) => {}
            Some(Err(e)) => {
                let result = match &e {
                    watcher::Error::InitialListFailed(k)
                    | watcher::Error::WatchStartFailed(k)
                    | watcher::Error::WatchFailed(k) => super::error_result(k),
                    watcher::Error::WatchError(s) if s.code == 410 => "expired",
                    _ => "error",
                };
                metrics.node_api_request("node_watch", result);
                tracing::debug!(node = name, error = %e, "watching the Node; retrying with backoff");
            }
        }
    }
}

/// Puts the Node's labels and taints into `admission` when they changed.
fn seen(node: &Node, admission: &watch::Sender<admission::Node>) {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    admission.send_if_modified(|held| update(held, labels, taints));
}

/// Sets `held`'s labels and taints; whether they changed.
fn update(
    held: &mut admission::Node,
    labels: BTreeMap<String, String>,
    taints: Vec<k8s_openapi::api::core::v1::Taint>,
) -> bool {
    if held.labels == labels && held.taints == taints {
        return false;
    }
    tracing::info!(
        node = held.name,
        labels = labels.len(),
        taints = taints.len(),
        "admission follows the Node's labels and taints from the API server"
    );
    held.labels = labels;
    held.taints = taints;
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_taints_from_the_api_replace_the_local_ones_only_when_they_differ() {
        let mut held = admission::Node {
            name: "n".into(),
            labels: [("kubernetes.io/hostname".to_owned(), "n".to_owned())].into(),
            ..Default::default()
        };
        let same = held.labels.clone();
        assert!(!update(&mut held, same, Vec::new()));
        let mut labels = held.labels.clone();
        labels.insert("disk".into(), "ssd".into());
        assert!(update(&mut held, labels.clone(), Vec::new()));
        assert_eq!(held.labels["disk"], "ssd");
        let taint = k8s_openapi::api::core::v1::Taint {
            key: "k".into(),
            effect: "NoExecute".into(),
            ..Default::default()
        };
        assert!(update(&mut held, labels, vec![taint]));
        assert_eq!(held.taints.len(), 1);
    }
}
