//! Pod configuration: sources and the merge mux.
//!
//! Sources (the static-pod [`file`] source, later HTTP and the API server) each send
//! [`SourceUpdate`]s on a channel obtained from [`Mux::channel`]. The [`Mux`] merges them with the
//! kubelet's incremental semantics (`pkg/kubelet/config/config.go`) into [`PodUpdate`]s for the
//! sync loop.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

pub mod file;
mod fingerprint;
pub mod manifest;
mod mux;

pub use mux::{Mux, SourcesReady};

/// Source name of static pods read from files.
pub const FILE: &str = "file";
/// Source name of static pods fetched from a URL.
pub const HTTP: &str = "http";
/// Source name of pods from the API server.
pub const API: &str = "api";

/// Annotation naming the source a pod came from (stamped by the mux).
pub const CONFIG_SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";
/// Annotation holding when the mux first saw a pod's UID (RFC 3339 with nanoseconds).
pub const CONFIG_SEEN_ANNOTATION: &str = "kubernetes.io/config.seen";
/// Annotation on mirror pods.
pub const CONFIG_MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// Annotation holding a static pod's hash (its UID).
pub const CONFIG_HASH_ANNOTATION: &str = "kubernetes.io/config.hash";

/// The annotations the node adds locally; ignored when comparing pods.
pub const LOCAL_ANNOTATIONS: [&str; 3] = [
    CONFIG_SOURCE_ANNOTATION,
    CONFIG_MIRROR_ANNOTATION,
    CONFIG_SEEN_ANNOTATION,
];

/// What a source sends to the mux. Only `Set` (the source's full state) and `Remove` are taken at
/// face value: `Add`, `Update` and `Delete` are all handled alike, the pod's content deciding the
/// outcome (kubelet trap: the op a source sends is not trusted).
#[derive(Debug, Clone)]
pub enum SourceUpdate {
    Set(Vec<Pod>),
    Add(Vec<Pod>),
    Update(Vec<Pod>),
    Remove(Vec<Pod>),
    Delete(Vec<Pod>),
}

/// The operation of a merged update sent to the sync loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// Pods new to the node (or, empty, a source reporting for the first time).
    Add,
    /// Pods whose spec, labels or non-local annotations changed.
    Update,
    /// Pods given a deletion timestamp (graceful deletion).
    Delete,
    /// Pods gone from their source.
    Remove,
    /// Pods whose status alone changed.
    Reconcile,
}

/// One merged update: an op over pods from one source.
#[derive(Debug, Clone)]
pub struct PodUpdate {
    pub op: Op,
    pub pods: Vec<Arc<Pod>>,
    pub source: &'static str,
}
