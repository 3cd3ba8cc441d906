//! The node's heartbeat: the Lease `kube-node-lease/<node>`, held by the node, renewed every
//! quarter of its duration (10 s of 40 s by default), owned by the Node once the Node is known.
//! Renewal is independent of node status writes: a failing status write never stops it. Each
//! renewal is bounded by the heartbeat timeout and a dead connection is replaced
//! ([`super::heartbeat`]).
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use kube::Api;
use kube::api::PostParams;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// The namespace of node leases.
pub const NAMESPACE: &str = "kube-node-lease";

/// The first wait after a failed renewal (doubling up to the renew interval).
const RETRY_FIRST: Duration = Duration::from_millis(200);

/// The owner reference of the Node `name` with UID `uid`.
pub fn node_owner(name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "v1".to_owned(),
        kind: "Node".to_owned(),
        name: name.to_owned(),
        uid: uid.to_owned(),
        ..Default::default()
    }
}

/// `base` (or a new lease) renewed now by `node`: holder, duration, renew time, and the Node
/// as its owner when `owner_uid` is known and the lease has no owner yet.
pub fn renewed(
    base: Option<Lease>,
    node: &str,
    duration: Duration,
    owner_uid: Option<&str>,
    now: k8s_openapi::jiff::Timestamp,
) -> Lease {
    let mut lease = base.unwrap_or_else(|| Lease {
        metadata: ObjectMeta {
            name: Some(node.to_owned()),
            namespace: Some(NAMESPACE.to_owned()),
            ..Default::default()
        },
        spec: None,
    });
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = Some(node.to_owned());
    spec.lease_duration_seconds = Some(i32::try_from(duration.as_secs()).unwrap_or(i32::MAX));
    spec.renew_time = Some(MicroTime(now));
    if let Some(uid) = owner_uid
        && lease
            .metadata
            .owner_references
            .as_ref()
            .is_none_or(Vec::is_empty)
    {
        lease.metadata.owner_references = Some(vec![node_owner(node, uid)]);
    }
    lease
}

/// Renews the lease once: from `latest` (the lease the last renewal wrote) when there is one,
/// else from a fresh read, else by creating it. A conflict leaves `latest` empty, so the next
/// renewal reads the lease anew.
async fn renew_once(
    api: &Api<Lease>,
    node: &str,
    duration: Duration,
    owner_uid: Option<&str>,
    latest: Option<Lease>,
) -> Result<Lease, kube::Error> {
    let base = match latest {
        Some(l) => Some(l),
        None => api.get_opt(node).await?,
    };
    let now = k8s_openapi::jiff::Timestamp::now();
    let exists = base.is_some();
    let lease = renewed(base, node, duration, owner_uid, now);
    if exists {
        api.replace(node, &PostParams::default(), &lease).await
    } else {
        api.create(&PostParams::default(), &lease).await
    }
}

/// Renews the lease of `node` every quarter of `duration` until `cancel`, through the heartbeat
/// client (each renewal bounded by its timeout, see [`super::heartbeat`]); after a failure,
/// retries sooner (from 200 ms, doubling up to the renew interval).
pub async fn run(
    heartbeats: super::heartbeat::Heartbeats,
    node: String,
    duration: Duration,
    owner: watch::Receiver<Option<String>>,
    metrics: Metrics,
    cancel: CancellationToken,
) {
    let interval = duration / 4;
    let mut latest: Option<Lease> = None;
    let mut retry = RETRY_FIRST;
    loop {
        let owner_uid = owner.borrow().clone();
        let base = latest.take();
        let renewal = heartbeats.request(|client| {
            let api = Api::<Lease>::namespaced(client, NAMESPACE);
            let (node, owner_uid) = (node.clone(), owner_uid.clone());
            async move { renew_once(&api, &node, duration, owner_uid.as_deref(), base).await }
        });
        let wait = match renewal.await {
            Ok(lease) => {
                metrics.node_api_request("lease", "ok");
                latest = Some(lease);
                retry = RETRY_FIRST;
                interval
            }
            Err(e) => {
                let result = super::error_result(&e);
                metrics.node_api_request("lease", result);
                tracing::warn!(node, error = %e, result, "renewing the node lease failed");
                let wait = retry.min(interval);
                retry = (retry * 2).min(interval);
                wait
            }
        };
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renewal_sets_holder_duration_time_and_the_owner_once() {
        let t = k8s_openapi::jiff::Timestamp::from_second(1000).unwrap();
        let l = renewed(None, "n1", Duration::from_secs(40), None, t);
        assert_eq!(l.metadata.namespace.as_deref(), Some(NAMESPACE));
        let spec = l.spec.clone().unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("n1"));
        assert_eq!(spec.lease_duration_seconds, Some(40));
        assert_eq!(spec.renew_time, Some(MicroTime(t)));
        assert!(l.metadata.owner_references.is_none(), "no Node known yet");

        let t2 = k8s_openapi::jiff::Timestamp::from_second(1010).unwrap();
        let l2 = renewed(Some(l), "n1", Duration::from_secs(40), Some("uid-1"), t2);
        let owners = l2.metadata.owner_references.clone().unwrap();
        assert_eq!(
            (owners[0].kind.as_str(), owners[0].uid.as_str()),
            ("Node", "uid-1")
        );
        assert_eq!(l2.spec.as_ref().unwrap().renew_time, Some(MicroTime(t2)));
        // An owner already set is kept.
        let l3 = renewed(Some(l2), "n1", Duration::from_secs(40), Some("uid-2"), t2);
        assert_eq!(l3.metadata.owner_references.unwrap()[0].uid, "uid-1");
    }
}
