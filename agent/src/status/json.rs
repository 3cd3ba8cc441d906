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
    items: Vec<PodView<'a>>,
    metadata: EmptyMeta,
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
        map.values()
            .map(|e| {
                let mut p = (*e.pod).clone();
                p.status = Some(e.status.clone());
                p
            })
            .collect()
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
            items: map
                .values()
                .map(|e| PodView {
                    api_version: "v1",
                    kind: "Pod",
                    metadata: &e.pod.metadata,
                    spec: e.pod.spec.as_ref(),
                    status: &e.status,
                })
                .collect(),
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
