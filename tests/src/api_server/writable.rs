//! The writable resources of the in-process API server: Nodes (cluster-scoped, with a `status`
//! subresource) and Leases (`coordination.k8s.io/v1`, namespaced), kept with the API's write
//! semantics:
//!
//! - `POST` creates; the name taken answers 409 `AlreadyExists`. The server sets `uid`,
//!   `creationTimestamp` and `resourceVersion` (one global counter, bumped on every write).
//! - `PUT` replaces; a body whose `metadata.resourceVersion` is not the stored one answers 409
//!   `Conflict` (optimistic concurrency); no version in the body means "unconditionally". A PUT
//!   of the object leaves its `status` as stored; a PUT of `/status` changes only the `status`.
//! - `PATCH` with `application/merge-patch+json` (RFC 7386) or
//!   `application/strategic-merge-patch+json` (a merge patch whose `conditions` and `addresses`
//!   lists merge by their `type` key, as the API's strategic merge does for a Node's status);
//!   other patch types answer 415. Patching `/status` changes only the `status`.
//! - `DELETE` removes at once (neither resource has finalizers or graceful deletion); a
//!   `preconditions.uid` or `preconditions.resourceVersion` that does not match answers 409.
//! - `GET` of the collection is a `<Kind>List` with the store's resourceVersion. A client that
//!   asks for a `Table` of Nodes (kubectl does) gets one, with the columns `kubectl get nodes`
//!   shows: NAME, STATUS (Ready or NotReady from the Ready condition), ROLES, AGE, VERSION.

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::Value;

use super::ApiServer;

/// One writable resource.
#[derive(Debug, Clone, Copy)]
pub(super) struct Kind {
    pub resource: &'static str,
    pub group: &'static str,
    pub kind: &'static str,
    pub api_version: &'static str,
    /// The object has a `status` subresource (a PUT or PATCH of the object leaves it alone).
    pub has_status: bool,
}

pub(super) const NODES: Kind = Kind {
    resource: "nodes",
    group: "",
    kind: "Node",
    api_version: "v1",
    has_status: true,
};

pub(super) const LEASES: Kind = Kind {
    resource: "leases",
    group: "coordination.k8s.io",
    kind: "Lease",
    api_version: "coordination.k8s.io/v1",
    has_status: false,
};

/// Which part of the object a write changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Part {
    Main,
    Status,
}

/// An API error, answered as a `Status`.
#[derive(Debug)]
pub struct ApiError {
    code: StatusCode,
    reason: &'static str,
    message: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.code,
            axum::Json(serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code.as_u16(),
            })),
        )
            .into_response()
    }
}

/// A patch the server cannot apply: 400, as the API server answers one.
pub(super) fn bad_patch(message: String) -> ApiError {
    error(StatusCode::BAD_REQUEST, "BadRequest", message)
}

pub(super) fn error(code: StatusCode, reason: &'static str, message: String) -> ApiError {
    ApiError {
        code,
        reason,
        message,
    }
}

fn qualified(kind: Kind) -> String {
    if kind.group.is_empty() {
        kind.resource.to_owned()
    } else {
        format!("{}.{}", kind.resource, kind.group)
    }
}

fn not_found(kind: Kind, name: &str) -> ApiError {
    error(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("{} \"{name}\" not found", qualified(kind)),
    )
}

fn conflict(kind: Kind, name: &str) -> ApiError {
    error(
        StatusCode::CONFLICT,
        "Conflict",
        format!(
            "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; \
             please apply your changes to the latest version and try again",
            qualified(kind)
        ),
    )
}

/// The key of an object in the store: (plural resource name, namespace, name).
pub(super) type Key = (&'static str, String, String);

fn key(kind: Kind, ns: &str, name: &str) -> Key {
    (kind.resource, ns.to_owned(), name.to_owned())
}

/// The namespace and name of a request's path (`ns` is empty for a cluster-scoped resource).
fn names(path: &HashMap<String, String>) -> (String, String) {
    let get = |k: &str| path.get(k).cloned().unwrap_or_default();
    (get("ns"), get("name"))
}

fn parse(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!("the body is not JSON: {e}"),
        )
    })
}

fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    super::rfc3339(secs)
}

impl ApiServer {
    /// The stored object `name` of `kind` in `ns` ("" when cluster-scoped), as JSON.
    pub(super) fn writable(&self, kind: Kind, ns: &str, name: &str) -> Option<Value> {
        self.lock().writable.get(&key(kind, ns, name)).cloned()
    }

    pub(super) fn create_object(
        &self,
        kind: Kind,
        ns: &str,
        mut obj: Value,
    ) -> Result<Value, ApiError> {
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if name.is_empty() {
            return Err(error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Invalid",
                format!("{} \"\": metadata.name: Required value", kind.kind),
            ));
        }
        let mut s = self.lock();
        let k = key(kind, ns, &name);
        if s.writable.contains_key(&k) {
            return Err(error(
                StatusCode::CONFLICT,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", qualified(kind)),
            ));
        }
        s.rv += 1;
        s.uids += 1;
        let meta = &mut obj["metadata"];
        meta["uid"] = Value::from(format!("{}-{:08}", kind.resource, s.uids));
        meta["resourceVersion"] = Value::from(s.rv.to_string());
        meta["creationTimestamp"] = Value::from(now_rfc3339());
        if !ns.is_empty() {
            meta["namespace"] = Value::from(ns);
        }
        obj["kind"] = Value::from(kind.kind);
        obj["apiVersion"] = Value::from(kind.api_version);
        s.writable.insert(k.clone(), obj.clone());
        let rv = s.rv;
        s.writable_history.push((rv, "ADDED", k, obj.clone()));
        drop(s);
        self.notify();
        Ok(obj)
    }

    /// Stores `new` over the stored object of `part`, keeping what `part` does not own.
    fn write(&self, kind: Kind, ns: &str, name: &str, part: Part, new: Value) -> Value {
        let mut s = self.lock();
        s.rv += 1;
        let rv = s.rv;
        let stored = s.writable.get_mut(&key(kind, ns, name));
        let Some(stored) = stored else {
            return Value::Null;
        };
        let mut merged = match part {
            Part::Status => {
                let mut o = stored.clone();
                o["status"] = new["status"].clone();
                o
            }
            Part::Main if kind.has_status => {
                let mut o = new;
                o["status"] = stored["status"].clone();
                o
            }
            Part::Main => new,
        };
        // What the server owns stays as it is.
        for field in ["uid", "creationTimestamp", "namespace", "name"] {
            merged["metadata"][field] = stored["metadata"][field].clone();
        }
        merged["metadata"]["resourceVersion"] = Value::from(rv.to_string());
        merged["kind"] = Value::from(kind.kind);
        merged["apiVersion"] = Value::from(kind.api_version);
        *stored = merged.clone();
        s.writable_history
            .push((rv, "MODIFIED", key(kind, ns, name), merged.clone()));
        drop(s);
        self.notify();
        merged
    }

    fn replace(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
        part: Part,
        body: Value,
    ) -> Result<Value, ApiError> {
        let stored = self
            .writable(kind, ns, name)
            .ok_or_else(|| not_found(kind, name))?;
        if body["metadata"]["name"].as_str().is_some_and(|n| n != name) {
            return Err(error(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                "the name of the object does not match the name on the URL".to_owned(),
            ));
        }
        let want = body["metadata"]["resourceVersion"].as_str().unwrap_or("");
        if !want.is_empty() && Some(want) != stored["metadata"]["resourceVersion"].as_str() {
            return Err(conflict(kind, name));
        }
        Ok(self.write(kind, ns, name, part, body))
    }

    fn patch(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
        part: Part,
        content_type: &str,
        patch: Value,
    ) -> Result<Value, ApiError> {
        let strategic = match content_type.split(';').next().unwrap_or("").trim() {
            "application/merge-patch+json" => false,
            "application/strategic-merge-patch+json" => true,
            other => {
                return Err(error(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "UnsupportedMediaType",
                    format!("the patch type {other:?} is not supported here"),
                ));
            }
        };
        let mut patched = self
            .writable(kind, ns, name)
            .ok_or_else(|| not_found(kind, name))?;
        if let Some(rv) = patch["metadata"]["resourceVersion"].as_str()
            && Some(rv) != patched["metadata"]["resourceVersion"].as_str()
        {
            return Err(conflict(kind, name));
        }
        merge(&mut patched, &patch, strategic, "").map_err(bad_patch)?;
        Ok(self.write(kind, ns, name, part, patched))
    }

    fn remove(&self, kind: Kind, ns: &str, name: &str, body: &[u8]) -> Result<Value, ApiError> {
        let options = if body.is_empty() {
            Value::Null
        } else {
            parse(body)?
        };
        let mut s = self.lock();
        let k = key(kind, ns, name);
        let stored = s.writable.get(&k).ok_or_else(|| not_found(kind, name))?;
        let pre = &options["preconditions"];
        for field in ["uid", "resourceVersion"] {
            if let Some(want) = pre[field].as_str()
                && Some(want) != stored["metadata"][field].as_str()
            {
                return Err(error(
                    StatusCode::CONFLICT,
                    "Conflict",
                    format!(
                        "Precondition failed: {field} in precondition: {want}, {field} in object \
                         meta: {}",
                        stored["metadata"][field].as_str().unwrap_or("")
                    ),
                ));
            }
        }
        s.rv += 1;
        let mut gone = s.writable.remove(&k).unwrap_or_default();
        let rv = s.rv;
        gone["metadata"]["resourceVersion"] = Value::from(rv.to_string());
        s.writable_history.push((rv, "DELETED", k, gone.clone()));
        drop(s);
        self.notify();
        Ok(gone)
    }

    fn list(&self, kind: Kind, ns: &str) -> Value {
        let s = self.lock();
        let items: Vec<&Value> = s
            .writable
            .iter()
            .filter(|((r, n, _), _)| *r == kind.resource && (ns.is_empty() || n == ns))
            .map(|(_, v)| v)
            .collect();
        serde_json::json!({
            "kind": format!("{}List", kind.kind), "apiVersion": kind.api_version,
            "metadata": { "resourceVersion": s.rv.to_string() },
            "items": items,
        })
    }
}

/// Whether the request's `Accept` asks for a server-side `Table`.
pub(super) fn wants_table(headers: &HeaderMap) -> bool {
    headers
        .get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=Table"))
}

/// A duration as kubectl's AGE column shows it: `42s`, `5m`, `3h`, `2d`.
fn age(created: &str) -> String {
    let Ok(t) = created.parse::<k8s_openapi::jiff::Timestamp>() else {
        return "<unknown>".to_owned();
    };
    let secs = k8s_openapi::jiff::Timestamp::now()
        .duration_since(t)
        .as_secs()
        .max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// A `Table` of `columns` (name, priority: 1 shows with `-o wide` only; the `Name` column is
/// the object's name) and `rows` (each its cells and the object they describe).
fn table(columns: &[(&str, u8)], rows: Vec<(Vec<Value>, &Value)>, rv: u64) -> Value {
    let columns: Vec<Value> = columns
        .iter()
        .map(|(name, priority)| {
            let format = if *name == "Name" { "name" } else { "" };
            serde_json::json!({"name": name, "type": "string", "format": format,
                "description": "", "priority": priority})
        })
        .collect();
    let rows: Vec<Value> = rows
        .into_iter()
        .map(|(cells, o)| {
            serde_json::json!({
                "cells": cells,
                "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                    "metadata": o["metadata"]},
            })
        })
        .collect();
    serde_json::json!({
        "kind": "Table", "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": rv.to_string()},
        "columnDefinitions": columns,
        "rows": rows,
    })
}

/// The `Table` of `pods` (JSON Pod objects) as `kubectl get pods [-o wide]` prints it: NAME,
/// READY, STATUS (Terminating, the pod's reason, a container's waiting or terminated reason,
/// else the phase), RESTARTS, AGE, then IP and NODE.
pub(super) fn pod_table(pods: &[Value], rv: u64) -> Value {
    let rows = pods
        .iter()
        .map(|p| {
            let statuses: Vec<&Value> = p["status"]["containerStatuses"]
                .as_array()
                .into_iter()
                .flatten()
                .collect();
            let total = p["spec"]["containers"].as_array().map_or(0, Vec::len);
            let ready = statuses.iter().filter(|c| c["ready"] == true).count();
            let restarts: i64 = statuses
                .iter()
                .map(|c| c["restartCount"].as_i64().unwrap_or(0))
                .sum();
            let container_reason = statuses.iter().find_map(|c| {
                c["state"]["waiting"]["reason"]
                    .as_str()
                    .or(c["state"]["terminated"]["reason"].as_str())
            });
            let status = if !p["metadata"]["deletionTimestamp"].is_null() {
                "Terminating"
            } else {
                p["status"]["reason"]
                    .as_str()
                    .or(container_reason)
                    .or(p["status"]["phase"].as_str())
                    .unwrap_or("Pending")
            };
            let or_none = |v: &Value| v.as_str().unwrap_or("<none>").to_owned();
            let cells = vec![
                p["metadata"]["name"].clone(),
                Value::from(format!("{ready}/{total}")),
                Value::from(status),
                Value::from(restarts),
                Value::from(age(p["metadata"]["creationTimestamp"]
                    .as_str()
                    .unwrap_or(""))),
                Value::from(or_none(&p["status"]["podIP"])),
                Value::from(or_none(&p["spec"]["nodeName"])),
            ];
            (cells, p)
        })
        .collect();
    let columns = [
        ("Name", 0),
        ("Ready", 0),
        ("Status", 0),
        ("Restarts", 0),
        ("Age", 0),
        ("IP", 1),
        ("Node", 1),
    ];
    table(&columns, rows, rv)
}

/// The `Table` of `nodes` (JSON Node objects) as `kubectl get nodes` prints it.
fn node_table(nodes: &[Value], rv: u64) -> Value {
    let rows = nodes
        .iter()
        .map(|n| {
            let ready = n["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            let mut status = if ready { "Ready" } else { "NotReady" }.to_owned();
            if n["spec"]["unschedulable"] == true {
                status.push_str(",SchedulingDisabled");
            }
            let roles: Vec<&str> = n["metadata"]["labels"]
                .as_object()
                .into_iter()
                .flatten()
                .filter_map(|(k, _)| k.strip_prefix("node-role.kubernetes.io/"))
                .collect();
            let roles = if roles.is_empty() {
                "<none>".to_owned()
            } else {
                roles.join(",")
            };
            let cells = vec![
                n["metadata"]["name"].clone(),
                Value::from(status),
                Value::from(roles),
                Value::from(age(n["metadata"]["creationTimestamp"]
                    .as_str()
                    .unwrap_or(""))),
                Value::from(
                    n["status"]["nodeInfo"]["kubeletVersion"]
                        .as_str()
                        .unwrap_or(""),
                ),
            ];
            (cells, n)
        })
        .collect();
    let columns = [
        ("Name", 0),
        ("Status", 0),
        ("Roles", 0),
        ("Age", 0),
        ("Version", 0),
    ];
    table(&columns, rows, rv)
}

/// The key items of a list named `field` merge by in a strategic merge patch (the API's
/// `patchMergeKey` of the lists a node agent patches), or `None`: the list is replaced.
fn merge_key(field: &str) -> Option<&'static str> {
    match field {
        "conditions" | "addresses" => Some("type"),
        "containerStatuses" | "initContainerStatuses" | "ephemeralContainerStatuses" => {
            Some("name")
        }
        "podIPs" | "hostIPs" => Some("ip"),
        _ => None,
    }
}

/// Applies merge patch `patch` to `target` (RFC 7386: objects merge key by key, `null`
/// removes, anything else replaces). `strategic`: a strategic merge patch, as the API server
/// applies one (checked against `kubectl patch --local --type strategic` in the tests below):
/// the lists [`merge_key`] names merge item by item on their key ([`merge_list`]), and the
/// `$patch` directives `replace` and `delete` are honoured in objects and list items. The
/// directives this server does not implement (`$setElementOrder`, `$retainKeys`,
/// `$deleteFromPrimitiveList`) are refused with an error naming them, never stored.
pub(super) fn merge(
    target: &mut Value,
    patch: &Value,
    strategic: bool,
    field: &str,
) -> Result<(), String> {
    match patch {
        Value::Object(p) => {
            if strategic {
                if let Some(k) = p.keys().find(|k| k.starts_with('$') && *k != "$patch") {
                    return Err(format!(
                        "the strategic merge directive {k:?} is not implemented by this test server"
                    ));
                }
                match p.get("$patch").map(|d| d.as_str()) {
                    None => {}
                    Some(Some("replace")) => {
                        let mut replaced = p.clone();
                        replaced.remove("$patch");
                        *target = Value::Object(replaced);
                        return Ok(());
                    }
                    Some(Some("delete")) => {
                        *target = Value::Null;
                        return Ok(());
                    }
                    Some(other) => return Err(format!("unknown $patch directive {other:?}")),
                }
            }
            if !target.is_object() {
                *target = Value::Object(serde_json::Map::new());
            }
            let Value::Object(t) = target else {
                return Ok(());
            };
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                    continue;
                }
                let slot = t.entry(k.clone()).or_insert(Value::Null);
                merge(slot, v, strategic, k)?;
                if strategic && slot.is_null() {
                    // `$patch: delete` of a whole object.
                    t.remove(k);
                }
            }
            Ok(())
        }
        Value::Array(items) if strategic => match merge_key(field) {
            Some(key) => merge_list(target, items, key),
            None => {
                *target = patch.clone();
                Ok(())
            }
        },
        other => {
            *target = other.clone();
            Ok(())
        }
    }
}

/// A strategic merge of list `items` into the list `target`, whose items merge on `key`:
/// `{"$patch": "replace"}` among the items replaces the list with the others; an item with
/// `"$patch": "delete"` removes the item with its key; every other item merges into the
/// first item with its key, or is added. The result puts the patch's items in the patch's
/// order and places the items only the target had between them by their old positions (an
/// item only the target had comes before a patch item the target had later), as the API
/// server's strategic merge orders a list without `$setElementOrder`.
fn merge_list(target: &mut Value, items: &[Value], key: &str) -> Result<(), String> {
    let directive = |i: &Value| i.get("$patch").and_then(Value::as_str).map(str::to_owned);
    if items
        .iter()
        .any(|i| directive(i).as_deref() == Some("replace"))
    {
        *target = Value::Array(
            items
                .iter()
                .filter(|i| directive(i).is_none())
                .cloned()
                .collect(),
        );
        return Ok(());
    }
    let original: Vec<Value> = target.as_array().cloned().unwrap_or_default();
    let mut deleted = Vec::new();
    let mut merged = original.clone();
    let mut patch_keys: Vec<&Value> = Vec::new();
    for item in items {
        let Some(k) = item.get(key).filter(|k| !k.is_null()) else {
            return Err(format!("a list item without its merge key {key:?}: {item}"));
        };
        match directive(item).as_deref() {
            None => {}
            Some("delete") => {
                deleted.push(k);
                continue;
            }
            Some(other) => return Err(format!("unknown $patch directive {other:?} in a list")),
        }
        patch_keys.push(k);
        match merged.iter_mut().find(|m| m.get(key) == Some(k)) {
            Some(m) => merge(m, item, true, "")?,
            None => {
                let mut added = Value::Null;
                merge(&mut added, item, true, "")?;
                merged.push(added);
            }
        }
    }
    merged.retain(|m| !deleted.iter().any(|d| m.get(key) == Some(*d)));
    let patch_index = |v: &Value| patch_keys.iter().position(|k| v.get(key) == Some(*k));
    let server_index = |v: &Value| original.iter().position(|o| o.get(key) == v.get(key));
    let (mut patched, server_only): (Vec<Value>, Vec<Value>) =
        merged.into_iter().partition(|m| patch_index(m).is_some());
    patched.sort_by_key(|m| patch_index(m));
    let (mut left, mut right) = (
        server_only.into_iter().peekable(),
        patched.into_iter().peekable(),
    );
    let mut out = Vec::new();
    loop {
        let take_left = match (left.peek(), right.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(l), Some(r)) => {
                matches!((server_index(l), server_index(r)), (Some(i), Some(j)) if i < j)
            }
        };
        out.extend(if take_left { left.next() } else { right.next() });
    }
    *target = Value::Array(out);
    Ok(())
}

type PathMap = Path<HashMap<String, String>>;

fn answer(result: Result<Value, ApiError>, created: bool) -> Response {
    match result {
        Ok(v) if created => (StatusCode::CREATED, axum::Json(v)).into_response(),
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

fn body_json(body: &Bytes) -> Result<Value, ApiError> {
    parse(body)
}

/// `GET` of a collection: the list (of the one object a `metadata.name=N` field selector names),
/// a `Table` of nodes for kubectl, or with `watch=true` the changes after `resourceVersion`.
async fn collection_get(
    s: ApiServer,
    kind: Kind,
    ns: &str,
    q: HashMap<String, String>,
    headers: &HeaderMap,
) -> Response {
    let name = q
        .get("fieldSelector")
        .and_then(|f| f.strip_prefix("metadata.name="))
        .map(str::to_owned);
    if q.get("watch").is_some_and(|w| w == "true" || w == "1") {
        let ns = ns.to_owned();
        let select = move |st: &super::Store, after: u64| {
            let events = st
                .writable_history
                .iter()
                .filter(|(rv, _, (r, n, o), _)| {
                    *rv > after
                        && *r == kind.resource
                        && (ns.is_empty() || *n == ns)
                        && name.as_ref().is_none_or(|x| x == o)
                })
                .map(|(_, event, _, v)| super::line(event, v))
                .collect();
            let newest = st.writable_history.last().map_or(0, |(rv, ..)| *rv);
            (events, newest)
        };
        return super::watch_response(s, &q, kind.kind, |st| &mut st.open_writable_watches, select)
            .await;
    }
    let mut list = s.list(kind, ns);
    if let (Some(name), Some(items)) = (&name, list["items"].as_array_mut()) {
        items.retain(|i| i["metadata"]["name"].as_str() == Some(name));
    }
    if kind.kind == NODES.kind && wants_table(headers) {
        let rv = s.lock().rv;
        let items = list["items"].as_array().cloned().unwrap_or_default();
        return axum::Json(node_table(&items, rv)).into_response();
    }
    axum::Json(list).into_response()
}

/// The handlers of `kind`'s collection and objects (and `/status` when it has one), to be
/// routed at `collection` (`.../nodes`, `.../namespaces/{ns}/leases`).
pub(super) fn routes(kind: Kind, collection: &str) -> axum::Router<ApiServer> {
    use axum::routing::{get, post};
    let one = format!("{collection}/{{name}}");
    let status = format!("{one}/status");
    let mut router = axum::Router::new()
        .route(
            collection,
            get(
                move |State(s): State<ApiServer>,
                      Path(p): PathMap,
                      Query(q): Query<HashMap<String, String>>,
                      headers: HeaderMap| async move {
                    collection_get(s, kind, &names(&p).0, q, &headers).await
                },
            )
            .merge(post(
                move |State(s): State<ApiServer>, Path(p): PathMap, body: Bytes| async move {
                    let ns = names(&p).0;
                    answer(
                        body_json(&body).and_then(|v| s.create_object(kind, &ns, v)),
                        true,
                    )
                },
            )),
        )
        .route(&one, object_routes(kind, Part::Main));
    if kind.has_status {
        router = router.route(&status, object_routes(kind, Part::Status));
    }
    router
}

fn object_routes(kind: Kind, part: Part) -> axum::routing::MethodRouter<ApiServer> {
    use axum::routing::{delete, get, patch, put};
    get(
        move |State(s): State<ApiServer>, Path(p): PathMap, headers: HeaderMap| async move {
            let (ns, name) = names(&p);
            let found = s
                .writable(kind, &ns, &name)
                .ok_or_else(|| not_found(kind, &name));
            match found {
                Ok(n) if kind.kind == NODES.kind && part == Part::Main && wants_table(&headers) => {
                    let rv = s.lock().rv;
                    axum::Json(node_table(&[n], rv)).into_response()
                }
                other => answer(other, false),
            }
        },
    )
    .merge(put(
        move |State(s): State<ApiServer>, Path(p): PathMap, body: Bytes| async move {
            let (ns, name) = names(&p);
            answer(
                body_json(&body).and_then(|v| s.replace(kind, &ns, &name, part, v)),
                false,
            )
        },
    ))
    .merge(patch(
        move |State(s): State<ApiServer>, Path(p): PathMap, headers: HeaderMap, body: Bytes| async move {
            let (ns, name) = names(&p);
            let content_type = headers
                .get(axum::http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            answer(
                body_json(&body)
                    .and_then(|v| s.patch(kind, &ns, &name, part, &content_type, v)),
                false,
            )
        },
    ))
    .merge(delete(
        move |State(s): State<ApiServer>, Path(p): PathMap, body: Bytes| async move {
            let (ns, name) = names(&p);
            if part == Part::Status {
                return StatusCode::METHOD_NOT_ALLOWED.into_response();
            }
            answer(s.remove(kind, &ns, &name, &body), false)
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::merge;
    use serde_json::{Value, json};

    #[test]
    fn merge_patch_merges_objects_removes_nulls_and_replaces_lists() {
        let mut t = json!({"a": {"b": 1, "c": 2}, "l": [1, 2], "conditions": [{"type": "X"}]});
        let patch = json!({"a": {"b": null, "d": 3}, "l": [3], "conditions": [{"type": "Y"}]});
        assert_eq!(merge(&mut t, &patch, false, ""), Ok(()));
        assert_eq!(
            t,
            json!({"a": {"c": 2, "d": 3}, "l": [3], "conditions": [{"type": "Y"}]})
        );
    }

    /// A Node whose lists the cases below patch: conditions (merge key `type`), addresses
    /// (merge key `type`, with a type twice) and images (no merge key: replaced).
    fn node() -> Value {
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}, "status": {
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ok"},
                {"type": "MemoryPressure", "status": "False"},
                {"type": "NetworkUnavailable", "status": "False", "reason": "RouteCreated"},
            ],
            "addresses": [
                {"type": "InternalIP", "address": "10.0.0.1"},
                {"type": "InternalIP", "address": "10.0.0.2"},
                {"type": "Hostname", "address": "n1"},
            ],
            "images": [{"names": ["a"], "sizeBytes": 1}],
            "capacity": {"cpu": "2", "example.com/dongle": "1"},
        }})
    }

    /// Strategic merge patches of a Node's status, each as a node agent or another component
    /// sends one.
    fn cases() -> Vec<Value> {
        vec![
            // The agent's own conditions: the others stay, placed as the API server places them.
            json!({"status": {"conditions": [
                {"type": "Ready", "status": "False", "reason": "KubeletNotReady"},
                {"type": "DiskPressure", "status": "False"},
            ]}}),
            json!({"status": {"conditions": [
                {"type": "PIDPressure", "status": "False"},
                {"type": "Ready", "status": "True"},
            ]}}),
            // A field of one item removed by null; an item deleted; a map key removed.
            json!({"status": {"conditions": [
                {"type": "Ready", "message": null},
                {"type": "NetworkUnavailable", "$patch": "delete"},
            ], "capacity": {"example.com/dongle": null}}}),
            // The addresses replaced whole (merging on `type` would fold the two InternalIPs).
            json!({"status": {"addresses": [
                {"$patch": "replace"},
                {"type": "InternalIP", "address": "10.0.0.9"},
                {"type": "Hostname", "address": "n1"},
            ]}}),
            json!({"status": {"addresses": [{"type": "ExternalIP", "address": "192.0.2.1"}]}}),
            // A list without a merge key is replaced; a null list is removed.
            json!({"status": {"images": [{"names": ["b"], "sizeBytes": 2}], "conditions": null}}),
            // A whole object replaced.
            json!({"status": {"capacity": {"$patch": "replace", "cpu": "4"}}}),
        ]
    }

    /// What kubectl's own strategic merge (the API server's code, with the Node schema's merge
    /// keys) makes of `patch` applied to `original`.
    fn kubectl_patch(kubectl: &std::path::Path, original: &Value, patch: &Value) -> Value {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let file = dir.path().join("node.json");
        std::fs::write(&file, original.to_string()).expect("writing the node");
        let out = std::process::Command::new(kubectl)
            .args([
                "patch",
                "--local",
                "--type",
                "strategic",
                "-o",
                "json",
                "-f",
            ])
            .arg(&file)
            .arg("-p")
            .arg(patch.to_string())
            .output()
            .expect("running kubectl");
        assert!(
            out.status.success(),
            "kubectl patch {patch}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("kubectl's JSON")
    }

    #[test]
    fn strategic_merge_is_kubectls() {
        let Some(kubectl) = crate::find_tool("kubectl", "apt-get install kubectl") else {
            return;
        };
        for patch in cases() {
            let want = kubectl_patch(&kubectl, &node(), &patch);
            let mut got = node();
            assert_eq!(merge(&mut got, &patch, true, ""), Ok(()), "{patch}");
            assert_eq!(got["status"], want["status"], "patch {patch}");
        }
    }

    #[test]
    fn the_directives_not_implemented_are_refused_not_stored() {
        for patch in [
            json!({"status": {"$setElementOrder/conditions": [{"type": "Ready"}]}}),
            json!({"metadata": {"$retainKeys": ["name"]}}),
            json!({"status": {"conditions": [{"type": "Ready", "$patch": "merge-all"}]}}),
            json!({"status": {"conditions": [{"status": "True"}]}}),
        ] {
            let mut t = node();
            assert!(merge(&mut t, &patch, true, "").is_err(), "{patch}");
        }
    }
}
