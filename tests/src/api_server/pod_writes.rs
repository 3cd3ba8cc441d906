//! Writes to pods, as a node agent makes them, with the API's semantics:
//!
//! - `PATCH /api/v1/namespaces/{ns}/pods/{name}/status` (merge or strategic merge patch; the
//!   strategic one merges `conditions` by type, container statuses by name, pod and host IPs by
//!   IP). A `metadata.uid` in the patch is a precondition: another UID answers 409. Only the
//!   status changes; the pod gets a new resourceVersion and watches see MODIFIED.
//! - `DELETE /api/v1/namespaces/{ns}/pods/{name}` with `DeleteOptions`: the grace period is
//!   `gracePeriodSeconds`, else the pod's `terminationGracePeriodSeconds`, else 30; a pod bound
//!   to no node or already terminal (Succeeded, Failed) is deleted at once, as is a grace of 0.
//!   Otherwise the pod gets `deletionTimestamp` (now + grace) and
//!   `deletionGracePeriodSeconds` and stays (MODIFIED) until its node deletes it with grace 0;
//!   a later delete only shortens the grace period. `preconditions.uid` that does not match
//!   answers 409.
//!
//! - `POST /api/v1/namespaces/{ns}/pods` creates a pod (a node creates mirror pods this way):
//!   the server sets its UID, creationTimestamp and resourceVersion; a taken name answers 409
//!   `AlreadyExists`. A mirror pod is held to NodeRestriction's owner rule: at most one owner
//!   reference, a controller reference to its own Node with that Node's UID, else 403.
//!
//! Every write is recorded ([`super::ApiServer::pod_writes`]) with its time, so tests can
//! count them.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::Value;

use super::ApiServer;
use super::writable::{ApiError, error, merge};

/// One write to a pod: (when, verb `create`, `status` or `delete`, namespace/name, the body).
pub type PodWrite = (std::time::Instant, &'static str, String, Value);

fn not_found(name: &str) -> ApiError {
    error(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("pods \"{name}\" not found"),
    )
}

fn uid_conflict(want: &str, have: &str) -> ApiError {
    error(
        StatusCode::CONFLICT,
        "Conflict",
        format!("Precondition failed: UID in precondition: {want}, UID in object meta: {have}"),
    )
}

impl ApiServer {
    /// Every pod write answered so far.
    pub fn pod_writes(&self) -> Vec<PodWrite> {
        self.lock().pod_writes.clone()
    }

    /// The UID of pod `ns/name`.
    fn pod_uid(&self, ns: &str, name: &str) -> Option<String> {
        self.pod_named(ns, name)?.metadata.uid
    }

    fn record(&self, verb: &'static str, ns: &str, name: &str, body: &Value) {
        let entry = (
            std::time::Instant::now(),
            verb,
            format!("{ns}/{name}"),
            body.clone(),
        );
        self.lock().pod_writes.push(entry);
    }

    fn patch_pod_status(
        &self,
        ns: &str,
        name: &str,
        content_type: &str,
        patch: &Value,
    ) -> Result<Value, ApiError> {
        self.record("status", ns, name, patch);
        let strategic = content_type.starts_with("application/strategic-merge-patch+json");
        if !strategic && !content_type.starts_with("application/merge-patch+json") {
            return Err(error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "UnsupportedMediaType",
                format!("the patch type {content_type:?} is not supported here"),
            ));
        }
        let uid = self.pod_uid(ns, name).ok_or_else(|| not_found(name))?;
        if let Some(want) = patch["metadata"]["uid"].as_str()
            && want != uid
        {
            return Err(uid_conflict(want, &uid));
        }
        let pod = self
            .lock()
            .pods
            .get(&uid)
            .cloned()
            .ok_or_else(|| not_found(name))?;
        let mut status = serde_json::to_value(&pod.status).unwrap_or(Value::Null);
        merge(&mut status, &patch["status"], strategic, "").map_err(super::writable::bad_patch)?;
        let mut pod = pod;
        pod.status = serde_json::from_value(status).map_err(|e| {
            error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Invalid",
                format!("the patched status is not a PodStatus: {e}"),
            )
        })?;
        self.put(pod.clone());
        Ok(serde_json::to_value(self.lock().pods.get(&uid)).unwrap_or(Value::Null))
    }

    fn create_pod(&self, ns: &str, body: &[u8]) -> Result<Value, ApiError> {
        let mut pod: Pod = serde_json::from_slice(body).map_err(|e| {
            error(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                format!("not a Pod: {e}"),
            )
        })?;
        let name = pod.metadata.name.clone().unwrap_or_default();
        self.record(
            "create",
            ns,
            &name,
            &serde_json::to_value(&pod).unwrap_or_default(),
        );
        self.node_restriction(&pod)?;
        if self.pod_named(ns, &name).is_some() {
            return Err(error(
                StatusCode::CONFLICT,
                "AlreadyExists",
                format!("pods \"{name}\" already exists"),
            ));
        }
        let uid = {
            let mut s = self.lock();
            s.uids += 1;
            format!("pod-{:08}", s.uids)
        };
        pod.metadata.uid = Some(uid.clone());
        pod.metadata.namespace = Some(ns.to_owned());
        pod.metadata.creation_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        self.put(pod);
        Ok(serde_json::to_value(self.lock().pods.get(&uid)).unwrap_or(Value::Null))
    }

    /// NodeRestriction's rule for a mirror pod (which only a node creates): at most one owner
    /// reference, and that one a controller reference to its own Node (API version, kind, name
    /// and the stored Node's uid), without blockOwnerDeletion. Anything else is 403, as the
    /// admission plugin answers a node.
    fn node_restriction(&self, pod: &Pod) -> Result<(), ApiError> {
        let mirror = pod
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"));
        let owners = pod.metadata.owner_references.as_deref().unwrap_or_default();
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        let forbidden = |why: String| {
            Err(error(
                StatusCode::FORBIDDEN,
                "Forbidden",
                format!("pod is forbidden: node \"{node}\" {why}"),
            ))
        };
        match owners {
            _ if !mirror => Ok(()),
            [] => Ok(()),
            [owner] => {
                if owner.api_version != "v1" || owner.kind != "Node" || owner.name != node {
                    return forbidden(
                        "can only create pods with an owner reference set to itself".into(),
                    );
                }
                if owner.controller != Some(true) {
                    return forbidden(
                        "can only create pods with a controller owner reference set to itself"
                            .into(),
                    );
                }
                if owner.block_owner_deletion == Some(true) {
                    return forbidden(
                        "must not set blockOwnerDeletion on an owner reference".into(),
                    );
                }
                let uid = self.node(&node).and_then(|n| n.metadata.uid);
                if uid.as_deref() != Some(owner.uid.as_str()) {
                    return forbidden(format!("UID mismatch: {} is not its uid", owner.uid));
                }
                Ok(())
            }
            _ => {
                forbidden("can only create pods with a single owner reference set to itself".into())
            }
        }
    }

    fn delete_pod(&self, ns: &str, name: &str, body: &[u8]) -> Result<Value, ApiError> {
        let options: Value = if body.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(body).map_err(|e| {
                error(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    format!("DeleteOptions: {e}"),
                )
            })?
        };
        self.record("delete", ns, name, &options);
        let uid = self.pod_uid(ns, name).ok_or_else(|| not_found(name))?;
        if let Some(want) = options["preconditions"]["uid"].as_str()
            && want != uid
        {
            return Err(uid_conflict(want, &uid));
        }
        let mut pod: Pod = self
            .lock()
            .pods
            .get(&uid)
            .cloned()
            .ok_or_else(|| not_found(name))?;
        let spec = pod.spec.clone().unwrap_or_default();
        let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
        let mut grace = options["gracePeriodSeconds"]
            .as_i64()
            .or(spec.termination_grace_period_seconds)
            .unwrap_or(30);
        if spec.node_name.as_deref().unwrap_or("").is_empty()
            || matches!(phase.as_deref(), Some("Succeeded" | "Failed"))
        {
            grace = 0;
        }
        if grace <= 0 {
            self.delete(&uid);
            return Ok(serde_json::to_value(&pod).unwrap_or(Value::Null));
        }
        let shorter = pod
            .metadata
            .deletion_grace_period_seconds
            .is_none_or(|g| grace < g);
        if shorter {
            let at = k8s_openapi::jiff::Timestamp::now()
                + k8s_openapi::jiff::SignedDuration::from_secs(grace);
            pod.metadata.deletion_timestamp = Some(Time(at));
            pod.metadata.deletion_grace_period_seconds = Some(grace);
            self.put(pod.clone());
        }
        Ok(serde_json::to_value(&pod).unwrap_or(Value::Null))
    }
}

type NsName = Path<(String, String, String)>;

/// `PATCH /api/v1/namespaces/{ns}/{resource}/{name}/status` (pods only).
pub(super) async fn patch_status(
    State(server): State<ApiServer>,
    Path((ns, resource, name)): NsName,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if resource != "pods" {
        return StatusCode::METHOD_NOT_ALLOWED.into_response();
    }
    let content_type = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let patch: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                format!("the body is not JSON: {e}"),
            )
            .into_response();
        }
    };
    match server.patch_pod_status(&ns, &name, &content_type, &patch) {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `POST /api/v1/namespaces/{ns}/{resource}` (pods only).
pub(super) async fn create(
    State(server): State<ApiServer>,
    Path((ns, resource)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    if resource != "pods" {
        return StatusCode::METHOD_NOT_ALLOWED.into_response();
    }
    match server.create_pod(&ns, &body) {
        Ok(v) => (StatusCode::CREATED, axum::Json(v)).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `DELETE /api/v1/namespaces/{ns}/{resource}/{name}` (pods only).
pub(super) async fn delete(
    State(server): State<ApiServer>,
    Path((ns, resource, name)): NsName,
    body: Bytes,
) -> Response {
    if resource != "pods" {
        return StatusCode::METHOD_NOT_ALLOWED.into_response();
    }
    match server.delete_pod(&ns, &name, &body) {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}
