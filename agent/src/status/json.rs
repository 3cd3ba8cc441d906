//! `/pods`: a `v1` `PodList` of the desired pods with their statuses, serialised straight from
//! the registry's pods and the status manager's entries, and served again while nothing shown
//! changed.
use super::StatusManager;
#[cfg(test)]
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::core::v1::PodStatus;
use std::sync::PoisonError;

const EMPTY_POD_LIST: &str = r#"{"apiVersion":"v1","kind":"PodList","items":[],"metadata":{}}"#;

/// `/pods` borrowing the entries (a `v1` `PodList`, fields in `k8s_openapi::List`'s order).
#[derive(serde::Serialize)]
struct PodListView<'a> {
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    kind: &'static str,
    items: Items<'a>,
    metadata: EmptyMeta,
}

/// Every pod of the store in UID order, admitted and rejected alike; a packed pod's spec is
/// decoded for its own item only, so the list never holds more than one decoded spec.
struct Items<'a> {
    registry: &'a crate::pod_registry::Store,
    statuses: &'a super::Statuses,
    host_ips: &'a [std::net::IpAddr],
}

impl serde::Serialize for Items<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let registry = self.registry;
        let mut seq = s.serialize_seq(Some(registry.len()))?;
        let mut pods = registry.desired_pods().peekable();
        let mut rejected = registry.rejected_pods().peekable();
        loop {
            let pod_first = match (pods.peek(), rejected.peek()) {
                (None, None) => break,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (Some((a, _)), Some((b, _))) => a <= b,
            };
            if pod_first {
                let Some((uid, pod)) = pods.next() else { break };
                let initial;
                let status = match self.statuses.get(uid) {
                    Some(e) => &e.status,
                    None => {
                        initial = super::initial_status(pod, self.host_ips);
                        &initial
                    }
                };
                seq.serialize_element(&PodView {
                    api_version: "v1",
                    kind: "Pod",
                    metadata: &pod.metadata,
                    spec: pod.spec.as_ref(),
                    status,
                })?;
                continue;
            }
            let Some((_, r)) = rejected.next() else { break };
            let status = super::rejected_status(r, self.host_ips);
            let decoded;
            let spec = match r.pod() {
                crate::config::PodRef::Whole(p) => p.spec.as_ref(),
                crate::config::PodRef::Packed(p) => {
                    decoded = p.spec().map_err(serde::ser::Error::custom)?;
                    decoded.as_ref()
                }
            };
            seq.serialize_element(&PodView {
                api_version: "v1",
                kind: "Pod",
                metadata: r.pod().metadata(),
                spec,
                status: &status,
            })?;
        }
        seq.end()
    }
}

/// One pod of [`PodListView`]: the desired pod with its status.
#[derive(serde::Serialize)]
struct PodView<'a> {
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    kind: &'static str,
    metadata: &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    #[serde(skip_serializing_if = "Option::is_none")]
    spec: Option<&'a k8s_openapi::api::core::v1::PodSpec>,
    status: &'a PodStatus,
}

#[derive(serde::Serialize)]
struct EmptyMeta {}

impl StatusManager {
    /// The pods with their statuses as owned values: what [`StatusManager::pods_json`]
    /// serialises without copying (its tests compare the two).
    #[cfg(test)]
    pub fn pods(&self) -> Vec<Pod> {
        let Some((reg, map)) = self.read() else {
            return Vec::new();
        };
        let mut pods: Vec<(String, Pod)> = reg
            .desired_pods()
            .map(|(uid, pod)| {
                let mut p = (**pod).clone();
                p.status = Some(super::status_of(&map, uid, pod, &self.host_ips));
                (uid.clone(), p)
            })
            .collect();
        for (uid, r) in reg.rejected_pods() {
            let Ok(mut p) = r.pod().clone().into_pod() else {
                continue;
            };
            p.status = Some(super::rejected_status(r, &self.host_ips));
            pods.push((uid.clone(), p));
        }
        pods.sort_by(|a, b| a.0.cmp(&b.0));
        pods.into_iter().map(|(_, p)| p).collect()
    }

    /// `/pods` as JSON: a `v1` `PodList` of the pods with their statuses, the same document
    /// `List { items: self.pods() }` serialises to. Served from the last answer while no status
    /// changed since; else serialised straight from the entries, without copying them.
    pub fn pods_json(&self) -> bytes::Bytes {
        let mut cache = self
            .pods_json
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let current = self.changes.version();
        if let Some((version, body)) = cache.as_ref()
            && *version == current
        {
            return body.clone();
        }
        let Some((reg, map)) = self.read() else {
            return bytes::Bytes::from_static(EMPTY_POD_LIST.as_bytes());
        };
        // Writers bump the version only while holding their store's write lock: under both read
        // locks it names exactly what is serialised.
        let version = self.changes.version();
        let list = PodListView {
            api_version: "v1",
            kind: "PodList",
            items: Items {
                registry: &reg,
                statuses: &map,
                host_ips: &self.host_ips,
            },
            metadata: EmptyMeta {},
        };
        let body = match serde_json::to_vec(&list) {
            Ok(v) => bytes::Bytes::from(v),
            Err(e) => {
                tracing::warn!(error = %e, "serialising /pods");
                return bytes::Bytes::from_static(EMPTY_POD_LIST.as_bytes());
            }
        };
        drop((map, reg));
        *cache = Some((version, body.clone()));
        body
    }
}
