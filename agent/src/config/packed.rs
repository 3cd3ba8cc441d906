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

    /// An estimate, on the high side, of the memory this pod holds once the agent has taken it
    /// in: the packed body, the decoded metadata with every string, map node and vector it allocates,
    /// and [`HELD_PER_POD`] for what the mux, the status manager and the sync loop keep per pod.
    pub fn held_bytes(&self) -> usize {
        HELD_PER_POD
            + std::mem::size_of::<Packed>()
            + heap(self.body.len())
            + meta_heap(&self.metadata)
    }
}

/// What the agent keeps per pod beyond the pod itself (the mux's entry, the status manager's,
/// the sync loop's and the pod worker's), measured: a PodList of 10,000 small pods cost about
/// 2.5 KiB a pod in all, of which about 1.5 KiB was the pod's decoded metadata and packed body.
pub const HELD_PER_POD: usize = 1024;

/// A heap block of `len` bytes as the allocator hands it out (a 16-byte header and granule, 32
/// bytes at least); nothing for an empty one.
fn heap(len: usize) -> usize {
    if len == 0 {
        0
    } else {
        (len + 8).next_multiple_of(16).max(32)
    }
}

/// A string's heap block.
fn str_heap(s: &str) -> usize {
    heap(s.len())
}

/// An `Option<String>`'s heap block.
fn opt_heap(s: &Option<String>) -> usize {
    s.as_deref().map_or(0, str_heap)
}

/// A vector's buffer of `len` elements of `size` bytes, as decoded (room for up to twice as
/// many: a vector grows by doubling while a list is read).
fn vec_heap(len: usize, size: usize) -> usize {
    if len == 0 {
        0
    } else {
        heap(len.max(2) * 2 * size)
    }
}

/// The nodes of a B-tree map of `len` entries of `entry` bytes each (key and value as stored in
/// a node): a node has room for 11, and entries read in order leave each node about half full,
/// so a node is counted per 6 entries (child links included), and the first one whole.
fn map_nodes(len: usize, entry: usize) -> usize {
    const CAPACITY: usize = 11;
    // The entries, the parent link and counts, and an internal node's 12 child links.
    let node = heap(CAPACITY * entry + 16 + 12 * 8);
    if len == 0 {
        0
    } else {
        node + len.div_ceil(6) * node
    }
}

/// A map of strings: its nodes and each entry's two strings.
fn map_heap(m: &Option<std::collections::BTreeMap<String, String>>) -> usize {
    m.as_ref().map_or(0, |m| {
        map_nodes(m.len(), 2 * std::mem::size_of::<String>())
            + m.iter()
                .map(|(k, v)| str_heap(k) + str_heap(v))
                .sum::<usize>()
    })
}

/// What a JSON value (the managed fields' `fieldsV1`) holds beyond its own place: a string's
/// block, an array's buffer and elements, an object's nodes, keys and values.
fn json_heap(v: &serde_json::Value) -> usize {
    use serde_json::Value;
    let value = std::mem::size_of::<Value>();
    match v {
        Value::String(s) => str_heap(s),
        Value::Array(a) => vec_heap(a.len(), value) + a.iter().map(json_heap).sum::<usize>(),
        Value::Object(o) => {
            map_nodes(o.len(), std::mem::size_of::<String>() + value)
                + o.iter()
                    .map(|(k, v)| str_heap(k) + json_heap(v))
                    .sum::<usize>()
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => 0,
    }
}

/// The heap blocks a decoded `ObjectMeta` holds.
fn meta_heap(m: &ObjectMeta) -> usize {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, OwnerReference};
    use std::mem::size_of;
    let strings = [
        &m.name,
        &m.namespace,
        &m.uid,
        &m.generate_name,
        &m.resource_version,
        &m.self_link,
    ];
    let owners = m.owner_references.as_deref().unwrap_or_default();
    let owners = vec_heap(owners.len(), size_of::<OwnerReference>())
        + owners
            .iter()
            .map(|o| {
                str_heap(&o.api_version) + str_heap(&o.kind) + str_heap(&o.name) + str_heap(&o.uid)
            })
            .sum::<usize>();
    let managed = m.managed_fields.as_deref().unwrap_or_default();
    let managed = vec_heap(managed.len(), size_of::<ManagedFieldsEntry>())
        + managed
            .iter()
            .map(|f| {
                [
                    &f.api_version,
                    &f.fields_type,
                    &f.manager,
                    &f.operation,
                    &f.subresource,
                ]
                .into_iter()
                .map(opt_heap)
                .sum::<usize>()
                    + f.fields_v1.as_ref().map_or(0, |v| json_heap(&v.0))
            })
            .sum::<usize>();
    let finalizers = m.finalizers.as_deref().unwrap_or_default();
    let finalizers = vec_heap(finalizers.len(), size_of::<String>())
        + finalizers.iter().map(|f| str_heap(f)).sum::<usize>();
    strings.into_iter().map(opt_heap).sum::<usize>()
        + map_heap(&m.labels)
        + map_heap(&m.annotations)
        + owners
        + managed
        + finalizers
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

    /// [`Packed::held_bytes`] for a packed pod; a whole pod's estimate is not needed (the
    /// sources that keep pods whole read one pod of at most 3 MiB at a time).
    pub fn held_bytes(&self) -> Option<usize> {
        match self {
            PodRef::Whole(_) => None,
            PodRef::Packed(p) => Some(p.held_bytes()),
        }
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
