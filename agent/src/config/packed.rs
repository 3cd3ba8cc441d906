//! Pods kept packed. A decoded `Pod` costs about 5 KiB before most of its fields are set (the
//! API types are large structs: a `Pod` is over 2 KiB and each `Container` as much again), so a
//! manifest URL listing 10,000 pods would cost some 50 MiB decoded, although `--max-pods` lets
//! at most a few hundred of them run. A [`Packed`] pod keeps its metadata decoded (what the mux,
//! admission and `/pods` look at) and its spec and status as their compact JSON encoding, a few
//! hundred bytes; the pod is decoded again only when something needs it whole (admission of it,
//! an update of an admitted pod).

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// A packed pod could not be encoded or decoded again (the agent's own encoding of a pod it
/// decoded: only a fault in the agent gets here).
#[derive(Debug, thiserror::Error)]
#[error("pod {name}: {what} its packed spec and status: {message}")]
pub struct PackError {
    name: String,
    what: &'static str,
    message: String,
}

/// A pod with its metadata decoded and its spec and status packed into JSON.
#[derive(Debug, Clone)]
pub struct Packed {
    metadata: ObjectMeta,
    /// JSON of `(spec, status)`.
    body: Box<[u8]>,
}

impl Packed {
    /// Packs `pod`.
    pub fn pack(pod: Pod) -> Result<Self, PackError> {
        let body = Self::encode(&pod)?;
        Ok(Packed {
            metadata: pod.metadata,
            body,
        })
    }

    /// A packed copy of `pod`.
    pub fn copy_of(pod: &Pod) -> Result<Self, PackError> {
        Ok(Packed {
            body: Self::encode(pod)?,
            metadata: pod.metadata.clone(),
        })
    }

    fn encode(pod: &Pod) -> Result<Box<[u8]>, PackError> {
        let body = serde_json::to_vec(&(&pod.spec, &pod.status)).map_err(|e| PackError {
            name: pod.metadata.name.clone().unwrap_or_default(),
            what: "encoding",
            message: e.to_string(),
        })?;
        Ok(body.into_boxed_slice())
    }

    /// The spec and status, decoded again.
    fn decode(&self) -> Result<(Option<PodSpec>, Option<PodStatus>), PackError> {
        serde_json::from_slice(&self.body).map_err(|e| PackError {
            name: self.metadata.name.clone().unwrap_or_default(),
            what: "decoding",
            message: e.to_string(),
        })
    }

    /// The whole pod, decoded again.
    pub fn unpack(&self) -> Result<Pod, PackError> {
        let (spec, status) = self.decode()?;
        Ok(Pod {
            metadata: self.metadata.clone(),
            spec,
            status,
        })
    }

    /// The spec alone, decoded again (`/pods` shows the spec beside its own status).
    pub fn spec(&self) -> Result<Option<PodSpec>, PackError> {
        self.decode().map(|(spec, _)| spec)
    }

    /// Bytes the packed spec and status take.
    pub fn packed_len(&self) -> usize {
        self.body.len()
    }
}

/// A pod as the mux keeps it and hands it on: whole, or [`Packed`] (the manifest URL's pods).
/// Cheap to clone: clones share the pod.
#[derive(Debug, Clone)]
pub enum PodRef {
    Whole(Arc<Pod>),
    Packed(Arc<Packed>),
}

impl From<Pod> for PodRef {
    fn from(pod: Pod) -> Self {
        PodRef::Whole(Arc::new(pod))
    }
}

impl From<Arc<Pod>> for PodRef {
    fn from(pod: Arc<Pod>) -> Self {
        PodRef::Whole(pod)
    }
}

impl PodRef {
    /// `pod` packed.
    pub fn packed(pod: Pod) -> Result<Self, PackError> {
        Packed::pack(pod).map(|p| PodRef::Packed(Arc::new(p)))
    }

    pub fn metadata(&self) -> &ObjectMeta {
        match self {
            PodRef::Whole(p) => &p.metadata,
            PodRef::Packed(p) => &p.metadata,
        }
    }

    /// The metadata to change: the pod's own when no one else holds it, else a copy's.
    pub fn metadata_mut(&mut self) -> &mut ObjectMeta {
        match self {
            PodRef::Whole(p) => &mut Arc::make_mut(p).metadata,
            PodRef::Packed(p) => &mut Arc::make_mut(p).metadata,
        }
    }

    /// The UID (empty if unset).
    pub fn uid(&self) -> &str {
        self.metadata().uid.as_deref().unwrap_or_default()
    }

    pub fn is_packed(&self) -> bool {
        matches!(self, PodRef::Packed(_))
    }

    /// The whole pod: shared when it is kept whole, else decoded again.
    pub fn whole(&self) -> Result<Arc<Pod>, PackError> {
        match self {
            PodRef::Whole(p) => Ok(p.clone()),
            PodRef::Packed(p) => p.unpack().map(Arc::new),
        }
    }

    /// The whole pod, taken over without a copy when it is kept whole and no one else holds it.
    pub fn into_pod(self) -> Result<Pod, PackError> {
        match self {
            PodRef::Whole(p) => Ok(Arc::try_unwrap(p).unwrap_or_else(|shared| Pod::clone(&shared))),
            PodRef::Packed(p) => p.unpack(),
        }
    }

    /// `pod` in the same form as `self` (packed when `self` is).
    pub fn like(&self, pod: Pod) -> Result<Self, PackError> {
        match self {
            PodRef::Whole(_) => Ok(pod.into()),
            PodRef::Packed(_) => PodRef::packed(pod),
        }
    }

    /// Whether both are the same shared pod.
    pub fn ptr_eq(&self, other: &PodRef) -> bool {
        match (self, other) {
            (PodRef::Whole(a), PodRef::Whole(b)) => Arc::ptr_eq(a, b),
            (PodRef::Packed(a), PodRef::Packed(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// How many holders share the pod (tests).
    #[cfg(test)]
    pub fn holders(&self) -> usize {
        match self {
            PodRef::Whole(p) => Arc::strong_count(p),
            PodRef::Packed(p) => Arc::strong_count(p),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "u1",
                         "annotations": {"a": "b"}},
            "spec": {"containers": [{"name": "c", "image": "busybox",
                                     "command": ["sh", "-c", "sleep 1"]}]},
            "status": {"phase": "Pending"}
        }))
        .expect("valid pod")
    }

    #[test]
    fn a_packed_pod_unpacks_to_the_same_pod_in_a_fraction_of_its_size() {
        let p = pod();
        let packed = Packed::pack(p.clone()).expect("packs");
        assert_eq!(packed.unpack().expect("unpacks"), p);
        assert_eq!(packed.spec().expect("spec"), p.spec);
        // The decoded pod's structs alone are over 4 KiB; packed it is its JSON.
        assert!(packed.packed_len() < 200, "{} bytes", packed.packed_len());
        let r = PodRef::packed(p.clone()).expect("packs");
        assert!(r.is_packed());
        assert_eq!(r.uid(), "u1");
        assert_eq!(*r.whole().expect("unpacks"), p);
        assert_eq!(r.clone().into_pod().expect("unpacks"), p);
    }

    #[test]
    fn changing_the_metadata_of_a_shared_pod_changes_a_copy() {
        let mut a = PodRef::packed(pod()).expect("packs");
        let b = a.clone();
        assert!(a.ptr_eq(&b));
        a.metadata_mut().name = Some("other".into());
        assert!(!a.ptr_eq(&b));
        assert_eq!(b.metadata().name.as_deref(), Some("web"));
        assert_eq!(
            a.whole().expect("unpacks").metadata.name.as_deref(),
            Some("other")
        );
        // `like` keeps the form.
        assert!(a.like(pod()).expect("packs").is_packed());
        assert!(!PodRef::from(pod()).like(pod()).expect("whole").is_packed());
    }
}
