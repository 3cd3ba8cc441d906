//! `/pods`: a `v1` `PodList` of the desired pods with their statuses, serialised straight from
//! the status manager's entries and served again while nothing shown changed.
use super::StatusManager;
#[cfg(test)]
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::core::v1::PodStatus;
use std::sync::PoisonError;
use std::sync::atomic::Ordering;

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
    store: &'a super::Store,
    host_ip: Option<std::net::IpAddr>,
}

impl serde::Serialize for Items<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let store = self.store;
        let mut seq = s.serialize_seq(Some(store.pods.len() + store.rejected.len()))?;
        let mut pods = store.pods.iter().peekable();
        let mut rejected = store.rejected.iter().peekable();
        loop {
            let pod_first = match (pods.peek(), rejected.peek()) {
                (None, None) => break,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (Some((a, _)), Some((b, _))) => a <= b,
            };
            if pod_first {
                let Some((_, e)) = pods.next() else { break };
                seq.serialize_element(&PodView {
                    api_version: "v1",
                    kind: "Pod",
                    metadata: &e.pod.metadata,
                    spec: e.pod.spec.as_ref(),
                    status: &e.status,
                })?;
                continue;
            }
            let Some((_, r)) = rejected.next() else { break };
            let status = r.status(self.host_ip);
            let decoded;
            let spec = match &r.pod {
                crate::config::PodRef::Whole(p) => p.spec.as_ref(),
                crate::config::PodRef::Packed(p) => {
                    decoded = p.spec().map_err(serde::ser::Error::custom)?;
                    decoded.as_ref()
                }
            };
            seq.serialize_element(&PodView {
                api_version: "v1",
                kind: "Pod",
                metadata: r.pod.metadata(),
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
        let Ok(map) = self.inner.read() else {
            return Vec::new();
        };
        let mut pods: Vec<(String, Pod)> = map
            .pods
            .iter()
            .map(|(uid, e)| {
                let mut p = (*e.pod).clone();
                p.status = Some(e.status.clone());
                (uid.clone(), p)
            })
            .collect();
        for (uid, r) in &map.rejected {
            let Ok(mut p) = r.pod.clone().into_pod() else {
                continue;
            };
            p.status = Some(r.status(self.host_ip));
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
        let current = self.version.load(Ordering::Acquire);
        if let Some((version, body)) = cache.as_ref()
            && *version == current
        {
            return body.clone();
        }
        let Ok(map) = self.inner.read() else {
            return bytes::Bytes::from_static(EMPTY_POD_LIST.as_bytes());
        };
        // Writers bump the version only while holding the write lock: under the read lock it
        // names exactly what is serialised.
        let version = self.version.load(Ordering::Acquire);
        let list = PodListView {
            api_version: "v1",
            kind: "PodList",
            items: Items {
                store: &map,
                host_ip: self.host_ip,
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
        drop(map);
        *cache = Some((version, body.clone()));
        body
    }
}
