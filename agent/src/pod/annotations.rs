//! Pod annotation keys the node stamps or reads, and the names of the pod sources.

/// Source name of static pods read from files.
pub const FILE_SOURCE: &str = "file";
/// Source name of static pods fetched from a URL.
pub const HTTP_SOURCE: &str = "http";
/// Source name of pods from the API server.
pub const API_SOURCE: &str = "api";

/// The source a pod came from (stamped by the config mux).
pub const CONFIG_SOURCE: &str = "kubernetes.io/config.source";
/// When the config mux first saw a pod's UID (RFC 3339 with nanoseconds).
pub const CONFIG_SEEN: &str = "kubernetes.io/config.seen";
/// Marks a mirror pod (the API server's copy of a static pod).
pub const CONFIG_MIRROR: &str = "kubernetes.io/config.mirror";
/// A static pod's hash (its UID).
pub const CONFIG_HASH: &str = "kubernetes.io/config.hash";
