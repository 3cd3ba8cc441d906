//! Parsing one static-pod manifest (a file's bytes) into a defaulted, validated [`Pod`].
//!
//! Follows the kubelet's file source (`common.go`: decode, `applyDefaults`, validation): the content
//! is YAML or JSON holding exactly one `kind: Pod`, `apiVersion: v1` object. swiftlet differs in two
//! deliberate ways: the UID is a SHA-256 over the pod's canonical JSON (the Go kubelet hashes a spew
//! dump of its internal struct, which cannot be reproduced), and only the API defaults the agent
//! relies on are applied (restart policy, grace period, DNS policy, image pull policy, termination
//! message path, requests from limits), not the whole of the API server's defaulting. The UID is
//! computed before the defaults, from the pod as written, so a new default never changes a running
//! static pod's UID.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, Pod, PodStatus, Toleration};
use sha2::{Digest, Sha256};

use super::{CONFIG_HASH_ANNOTATION, CONFIG_SOURCE_ANNOTATION, FILE, HTTP, StoredPod};

/// Largest manifest URL body read, like the kubelet's `maxConfigLength` (a PodList may hold many
/// pods).
pub const MAX_CONFIG_LENGTH: u64 = 10 * 1024 * 1024;

/// Largest single pod accepted: a manifest file, a URL body holding one pod, or one item of a
/// PodList (measured as about its size in compact JSON). It is the API server's limit on a
/// request body: a larger pod could not be created through the API server, nor its mirror pod.
/// The kubelet reads a file up to 10 MiB; this lower bound keeps the agent's memory bounded
/// (a pod decodes to several times its text).
pub const MAX_POD_BYTES: u64 = 3 * 1024 * 1024;

/// Most memory the pods of one PodList may hold, as [`super::packed::Packed::held_bytes`]
/// estimates it (with each rejected item's error). The 10 MiB body limit alone does not bound
/// it: a body of 90,000 tiny pods would hold some 200 MiB. Items after the one that would go
/// over are not decoded; they are reported together as one [`Error::ListTooLarge`]. 12 MiB holds
/// some 3,800 small pods, many times what `--max-pods` lets run.
pub const MAX_LIST_HELD: usize = 12 * 1024 * 1024;

/// Result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a manifest was rejected. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: cannot read manifest: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: manifest is {size} bytes, over the {max} byte limit")]
    TooLarge { path: PathBuf, size: u64, max: u64 },
    #[error("{path}: manifest is not UTF-8 (invalid byte at offset {offset})")]
    NotUtf8 { path: PathBuf, offset: usize },
    #[error("{path}: invalid {format}{}: {message}", location(*.line, *.column))]
    Syntax {
        path: PathBuf,
        format: &'static str,
        line: Option<usize>,
        column: Option<usize>,
        message: String,
    },
    #[error("{path}: YAML nested deeper than {max} levels{}", location(Some(*line), Some(*column)))]
    TooDeep {
        path: PathBuf,
        line: usize,
        column: usize,
        max: usize,
    },
    #[error("{path}: {problem}")]
    Invalid { path: PathBuf, problem: Problem },
    #[error(
        "{path}: {count} items from items[{first}] on not read: the items before them hold the \
         {max} bytes of memory one PodList may take"
    )]
    ListTooLarge {
        path: PathBuf,
        /// The first item not read.
        first: usize,
        /// How many items were not read.
        count: usize,
        max: usize,
    },
    #[error("{path}: {source}")]
    Pack {
        path: PathBuf,
        #[source]
        source: super::PackError,
    },
}

impl Error {
    /// A short reason for the `reason` label of `swiftlet_config_errors_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Read { .. } => "read",
            Error::TooLarge { .. } => "too_large",
            Error::NotUtf8 { .. } => "not_utf8",
            Error::Syntax { .. } => "syntax",
            Error::TooDeep { .. } => "too_deep",
            Error::Invalid { problem, .. } => problem.reason(),
            Error::ListTooLarge { .. } => "list_too_large",
            Error::Pack { .. } => "pack",
        }
    }

    /// The manifest the error is about.
    pub fn path(&self) -> &Path {
        match self {
            Error::Read { path, .. }
            | Error::TooLarge { path, .. }
            | Error::NotUtf8 { path, .. }
            | Error::Syntax { path, .. }
            | Error::TooDeep { path, .. }
            | Error::Invalid { path, .. }
            | Error::ListTooLarge { path, .. }
            | Error::Pack { path, .. } => path,
        }
    }
}

fn location(line: Option<usize>, column: Option<usize>) -> String {
    match (line, column) {
        (Some(l), Some(c)) => format!(" at line {l} column {c}"),
        (Some(l), None) => format!(" at line {l}"),
        _ => String::new(),
    }
}

/// The most of one manifest value a message quotes: a rejection is logged, served on
/// `/debug/manifests` and kept, so a megabyte `kind` must not travel whole.
pub const ECHO_MAX: usize = 128;

/// A value from a manifest as a message quotes it: `"..."`, cut after [`ECHO_MAX`] bytes (at a
/// character boundary) with its whole length named.
struct Echo<'a>(&'a str);

impl std::fmt::Display for Echo<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.len() <= ECHO_MAX {
            return write!(f, "{:?}", self.0);
        }
        let mut end = ECHO_MAX;
        while !self.0.is_char_boundary(end) {
            end -= 1;
        }
        write!(f, "{:?}... ({} bytes)", &self.0[..end], self.0.len())
    }
}

/// [`Echo`] of an optional value, `Some(...)` or `None` as `{:?}` shows them.
fn echo_some(value: &Option<String>) -> String {
    match value {
        Some(v) => format!("Some({})", Echo(v)),
        None => "None".to_owned(),
    }
}

/// A manifest that parsed but is not an acceptable static pod.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error("the document is not an object")]
    NotAnObject,
    #[error("kind is {}, expected \"Pod\"", echo_some(.found))]
    WrongKind { found: Option<String> },
    #[error("apiVersion is {}, expected \"v1\"", echo_some(.found))]
    WrongApiVersion { found: Option<String> },
    #[error("metadata.name is missing or empty")]
    MissingName,
    #[error("{field} {} is invalid: {reason}", Echo(.value))]
    BadName {
        field: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("the node name is empty")]
    EmptyNodeName,
    #[error("spec.containers is missing or empty")]
    NoContainers,
    #[error("{list}[{index}] has no name")]
    ContainerWithoutName { list: &'static str, index: usize },
    #[error("container {} has no image", Echo(.name))]
    ContainerWithoutImage { name: String },
    #[error("container name {} is used more than once", Echo(.name))]
    DuplicateContainerName { name: String },
    #[error("metadata.annotations: {size} bytes in all, over the API's {max} byte limit")]
    AnnotationsTooLarge { size: usize, max: usize },
    #[error("metadata.labels: {problem}")]
    BadLabel { problem: String },
    #[error("spec.activeDeadlineSeconds {value} is invalid: {reason}")]
    BadActiveDeadline { value: i64, reason: String },
    /// The kubelet's words for a static pod naming an API object (`pod::api_references`).
    #[error("static pods may not reference {resource}")]
    ApiReference { resource: &'static str },
}

impl Problem {
    /// A short reason for the `reason` label of `swiftlet_config_errors_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            Problem::NotAnObject | Problem::WrongKind { .. } => "wrong_kind",
            Problem::WrongApiVersion { .. } => "wrong_api_version",
            Problem::MissingName => "missing_name",
            Problem::BadName { .. } => "bad_name",
            Problem::EmptyNodeName => "empty_node_name",
            Problem::NoContainers => "no_containers",
            Problem::ContainerWithoutName { .. }
            | Problem::ContainerWithoutImage { .. }
            | Problem::DuplicateContainerName { .. } => "bad_container",
            Problem::AnnotationsTooLarge { .. } => "annotations_too_large",
            Problem::BadLabel { .. } => "bad_label",
            Problem::BadActiveDeadline { .. } => "bad_active_deadline",
            Problem::ApiReference { .. } => "api_reference",
        }
    }
}

pub(crate) fn too_large(path: &Path, size: u64, max: u64) -> Error {
    Error::TooLarge {
        path: path.to_path_buf(),
        size,
        max,
    }
}

fn check_len(path: &Path, bytes: &[u8], max: u64) -> Result<()> {
    let size = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    if size > max {
        return Err(too_large(path, size, max));
    }
    Ok(())
}

/// Where a manifest came from: decides how errors name it, what the UID hash covers (`file:<path>`
/// or `url:<url>`), the `config.source` annotation, and whether the file-only NoExecute toleration
/// is added (kubelet `applyDefaults`).
#[derive(Debug, Clone, Copy)]
pub enum Origin<'a> {
    File(&'a Path),
    Url(&'a str),
}

impl Origin<'_> {
    /// How errors name the manifest.
    pub fn path(&self) -> PathBuf {
        match self {
            Origin::File(p) => p.to_path_buf(),
            Origin::Url(u) => PathBuf::from(u),
        }
    }

    fn source(&self) -> &'static str {
        match self {
            Origin::File(_) => FILE,
            Origin::Url(_) => HTTP,
        }
    }
}

/// Parses one manifest's bytes into a static pod for `node_name`, with the kubelet's file-source
/// defaults applied (see the module docs).
pub fn parse(path: &Path, bytes: &[u8], node_name: &str) -> Result<Pod> {
    let text = text(path, bytes, MAX_POD_BYTES, node_name)?;
    parse_pod(Origin::File(path), path, text, node_name)
}

/// Parses what a manifest URL served: one Pod or a PodList (`kind: PodList`, items without
/// `kind`/`apiVersion` accepted), YAML or JSON. The outer error rejects the whole body
/// (unreadable, not a Pod or PodList, a single pod that is invalid); a PodList's items each parse
/// (and fail) on their own, named `<url> items[i]`. Pods come fingerprinted, ready for the mux; a
/// PodList's pods come packed ([`super::packed`]), each as soon as it is parsed, so a list of
/// thousands never exists as thousands of decoded pods.
pub fn parse_url(url: &str, bytes: &[u8], node_name: &str) -> Result<Vec<Result<StoredPod>>> {
    let path = PathBuf::from(url);
    let text = text(&path, bytes, MAX_CONFIG_LENGTH, node_name)?;
    let origin = Origin::Url(url);
    let json = is_json(text);
    // The type fields first (no tree of the document), then the items one at a time: a list
    // near the size limit never exists as a tree of the whole body, only as the pods it holds.
    let head: Head = decode(&path, text, json)?;
    let kind = head.kind.as_ref().and_then(serde_json::Value::as_str);
    if !head.object || kind != Some("PodList") {
        // One pod: if it is bad, the whole body is (the source keeps its last good set).
        check_len(&path, bytes, MAX_POD_BYTES)?;
        return parse_pod_after(origin, &path, text, json, &head, node_name)
            .map(|pod| vec![Ok(pod.into())]);
    }
    api_version_is_v1(head.api_version.as_ref().and_then(|v| v.as_str())).map_err(|problem| {
        Error::Invalid {
            path: path.clone(),
            problem,
        }
    })?;
    let list = ListItems {
        origin,
        url,
        node_name,
    };
    decode_seed(&path, text, json, list)
}

/// Decodes a PodList document, parsing each item as soon as it is read (one item's tree at a
/// time) into its own result named `<url> items[i]`.
#[derive(Clone, Copy)]
struct ListItems<'a> {
    origin: Origin<'a>,
    url: &'a str,
    node_name: &'a str,
}

impl<'de> serde::de::DeserializeSeed<'de> for ListItems<'_> {
    type Value = Vec<Result<StoredPod>>;

    fn deserialize<D: serde::Deserializer<'de>>(
        self,
        d: D,
    ) -> std::result::Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for ListItems<'_> {
    type Value = Vec<Result<StoredPod>>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a PodList")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(
        self,
        mut map: A,
    ) -> std::result::Result<Self::Value, A::Error> {
        let mut pods = Vec::new();
        while let Some(key) = map.next_key::<serde_json::Value>()? {
            if key.as_str() == Some("items") {
                pods = map.next_value_seed(ItemsSeq(self))?;
            } else {
                map.next_value::<serde::de::IgnoredAny>()?;
            }
        }
        Ok(pods)
    }
}

/// The `items` of a PodList: `null` or a list.
struct ItemsSeq<'a>(ListItems<'a>);

impl<'de> serde::de::DeserializeSeed<'de> for ItemsSeq<'_> {
    type Value = Vec<Result<StoredPod>>;

    fn deserialize<D: serde::Deserializer<'de>>(
        self,
        d: D,
    ) -> std::result::Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for ItemsSeq<'_> {
    type Value = Vec<Result<StoredPod>>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("items as a list")
    }

    fn visit_unit<E>(self) -> std::result::Result<Self::Value, E> {
        Ok(Vec::new())
    }

    fn visit_none<E>(self) -> std::result::Result<Self::Value, E> {
        Ok(Vec::new())
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> std::result::Result<Self::Value, A::Error> {
        let ListItems {
            origin,
            url,
            node_name,
        } = self.0;
        let mut pods = Vec::new();
        let mut held = 0;
        loop {
            let size = std::cell::Cell::new(0);
            let Some(item) = seq.next_element_seed(Item { size: &size })? else {
                break;
            };
            let path = PathBuf::from(format!("{url} items[{}]", pods.len()));
            let pod = match item {
                Bounded::Within(item) => {
                    // Each pod is packed as soon as it is parsed: the list holds a few hundred
                    // bytes per pod, not 10,000 decoded pods (5 KiB each before most of their
                    // fields).
                    parse_item(origin, &path, item, node_name).and_then(|pod| {
                        StoredPod::packed(pod).map_err(|source| Error::Pack {
                            path: path.clone(),
                            source,
                        })
                    })
                }
                Bounded::Over(size) => Err(too_large(&path, size, MAX_POD_BYTES)),
            };
            held += match &pod {
                Ok(pod) => pod.pod().held_bytes().unwrap_or(0),
                Err(e) => HELD_PER_ERROR + e.to_string().len(),
            };
            if held > MAX_LIST_HELD {
                // This item and every later one are read past, not decoded.
                let first = pods.len();
                let mut count = 1;
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                    count += 1;
                }
                pods.push(Err(Error::ListTooLarge {
                    path: PathBuf::from(url),
                    first,
                    count,
                    max: MAX_LIST_HELD,
                }));
                break;
            }
            pods.push(pod);
        }
        Ok(pods)
    }
}

/// What a rejected PodList item's error holds beyond its message (its path, the error itself,
/// the source's rejection entry).
const HELD_PER_ERROR: usize = 256;

/// One PodList item as a JSON tree, built only while it stays within [`MAX_POD_BYTES`] (counted
/// as about its size in compact JSON); past that the rest of the item is read and counted but
/// not kept, so an item of megabytes never exists as a tree.
#[derive(Clone, Copy)]
struct Item<'c> {
    /// The item's size so far, shared by every value inside it.
    size: &'c std::cell::Cell<u64>,
}

/// What [`Item`] read: the tree, or the item's size when it is over the limit.
enum Bounded {
    Within(serde_json::Value),
    Over(u64),
}

impl Item<'_> {
    /// Counts `n` bytes; false once the item is over the limit (nothing more is kept).
    fn charge(&self, n: usize) -> bool {
        let size = self
            .size
            .get()
            .saturating_add(u64::try_from(n).unwrap_or(u64::MAX));
        self.size.set(size);
        size <= MAX_POD_BYTES
    }

    /// `value` if the item is still within the limit after `n` more bytes.
    fn keep(
        &self,
        n: usize,
        value: impl FnOnce() -> serde_json::Value,
    ) -> Option<serde_json::Value> {
        self.charge(n).then(value)
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for Item<'_> {
    type Value = Bounded;

    fn deserialize<D: serde::Deserializer<'de>>(
        self,
        d: D,
    ) -> std::result::Result<Self::Value, D::Error> {
        let value = d.deserialize_any(ItemValue(self))?;
        Ok(match value {
            Some(v) if self.size.get() <= MAX_POD_BYTES => Bounded::Within(v),
            _ => Bounded::Over(self.size.get()),
        })
    }
}

/// A value inside an [`Item`]: `None` once the item is over the limit.
struct ItemValue<'c>(Item<'c>);

impl<'de> serde::de::DeserializeSeed<'de> for ItemValue<'_> {
    type Value = Option<serde_json::Value>;

    fn deserialize<D: serde::Deserializer<'de>>(
        self,
        d: D,
    ) -> std::result::Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for ItemValue<'_> {
    type Value = Option<serde_json::Value>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a pod")
    }

    fn visit_bool<E>(self, v: bool) -> std::result::Result<Self::Value, E> {
        Ok(self.0.keep(5, || v.into()))
    }

    fn visit_i64<E>(self, v: i64) -> std::result::Result<Self::Value, E> {
        Ok(self.0.keep(8, || v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> std::result::Result<Self::Value, E> {
        Ok(self.0.keep(8, || v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> std::result::Result<Self::Value, E> {
        Ok(self.0.keep(8, || v.into()))
    }

    fn visit_str<E>(self, v: &str) -> std::result::Result<Self::Value, E> {
        Ok(self.0.keep(v.len() + 3, || v.into()))
    }

    fn visit_unit<E>(self) -> std::result::Result<Self::Value, E> {
        Ok(self.0.keep(4, || serde_json::Value::Null))
    }

    fn visit_none<E>(self) -> std::result::Result<Self::Value, E> {
        Ok(self.0.keep(4, || serde_json::Value::Null))
    }

    fn visit_some<D: serde::Deserializer<'de>>(
        self,
        d: D,
    ) -> std::result::Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> std::result::Result<Self::Value, A::Error> {
        let mut kept = self.0.charge(2).then(Vec::new);
        while let Some(v) = seq.next_element_seed(ItemValue(self.0))? {
            match (&mut kept, v) {
                (Some(list), Some(v)) => list.push(v),
                _ => kept = None,
            }
        }
        Ok(kept.map(serde_json::Value::Array))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(
        self,
        mut map: A,
    ) -> std::result::Result<Self::Value, A::Error> {
        let mut kept = self.0.charge(2).then(serde_json::Map::new);
        while let Some(key) = map.next_key::<String>()? {
            let within = self.0.charge(key.len() + 4);
            let v = map.next_value_seed(ItemValue(self.0))?;
            match (&mut kept, v) {
                (Some(obj), Some(v)) if within => {
                    obj.insert(key, v);
                }
                _ => kept = None,
            }
        }
        Ok(kept.map(serde_json::Value::Object))
    }
}

/// Size (at most `max`), UTF-8, node-name and nesting checks shared by every entry point.
fn text<'b>(path: &Path, bytes: &'b [u8], max: u64, node_name: &str) -> Result<&'b str> {
    check_len(path, bytes, max)?;
    let text = std::str::from_utf8(bytes).map_err(|e| Error::NotUtf8 {
        path: path.to_path_buf(),
        offset: e.valid_up_to(),
    })?;
    if node_name.is_empty() {
        return Err(Error::Invalid {
            path: path.to_path_buf(),
            problem: Problem::EmptyNodeName,
        });
    }
    Ok(text)
}

/// JSON goes to the JSON parser (YAML rejects some JSON whitespace, e.g. tabs); all else is YAML.
fn is_json(text: &str) -> bool {
    text.trim_start().starts_with('{')
}

fn parse_pod(origin: Origin<'_>, path: &Path, text: &str, node_name: &str) -> Result<Pod> {
    let json = is_json(text);
    // The type fields first, without building a tree of the whole document (a manifest may be
    // megabytes; a tree of it would cost several times its size).
    let head: Head = decode(path, text, json)?;
    parse_pod_after(origin, path, text, json, &head, node_name)
}

/// [`parse_pod`] once the document's type fields (`head`) are decoded.
fn parse_pod_after(
    origin: Origin<'_>,
    path: &Path,
    text: &str,
    json: bool,
    head: &Head,
    node_name: &str,
) -> Result<Pod> {
    check_head(head).map_err(|problem| Error::Invalid {
        path: path.to_path_buf(),
        problem,
    })?;
    let pod: Pod = decode(path, text, json)?;
    finish(origin, path, pod, node_name)
}

/// One item of a PodList: `kind`/`apiVersion` may be absent, but not wrong.
fn parse_item(
    origin: Origin<'_>,
    path: &Path,
    item: serde_json::Value,
    node_name: &str,
) -> Result<Pod> {
    let invalid = |problem| Error::Invalid {
        path: path.to_path_buf(),
        problem,
    };
    let obj = item
        .as_object()
        .ok_or(Problem::NotAnObject)
        .map_err(invalid)?;
    if let Some(kind) = obj.get("kind") {
        if kind.as_str() != Some("Pod") {
            let found = kind.as_str().map(str::to_owned);
            return Err(invalid(Problem::WrongKind { found }));
        }
        check_api_version(&item).map_err(invalid)?;
    }
    let pod: Pod = serde_json::from_value(item).map_err(|e| Error::Syntax {
        path: path.to_path_buf(),
        format: "JSON",
        line: None,
        column: None,
        message: redact_values(&e.to_string()),
    })?;
    finish(origin, path, pod, node_name)
}

/// Validation and defaults of a decoded pod.
fn finish(origin: Origin<'_>, path: &Path, mut pod: Pod, node_name: &str) -> Result<Pod> {
    let invalid = |problem| Error::Invalid {
        path: path.to_path_buf(),
        problem,
    };
    validate_before_defaults(&pod).map_err(invalid)?;
    let uid = match pod.metadata.uid.as_deref() {
        Some(uid) if !uid.is_empty() => uid.to_owned(),
        _ => static_uid(&pod, node_name, origin),
    };
    apply_defaults(&mut pod, uid, node_name, origin);
    validate_after_defaults(&pod).map_err(invalid)?;
    if let Some(resource) = crate::pod::api_references::api_reference(&pod) {
        return Err(invalid(Problem::ApiReference { resource }));
    }
    Ok(pod)
}

fn decode<T: serde::de::DeserializeOwned>(path: &Path, text: &str, json: bool) -> Result<T> {
    decode_seed(path, text, json, std::marker::PhantomData::<T>)
}

/// Deepest nesting of collections accepted in YAML (the decoder's default, which keeps its
/// recursion within a thread's stack in a debug build too). A pod's own fields nest about a
/// dozen deep.
const MAX_DEPTH: usize = 64;

/// The YAML decoder's settings: its budget bounds what hostile YAML can cost (nesting, nodes,
/// aliases and their expansions), and its errors carry no snippet of the text (a manifest may
/// hold secrets; messages go to the log and to `/debug/manifests`).
pub(crate) fn yaml_options() -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_depth = MAX_DEPTH;
    budget.flow_nesting_limit = MAX_DEPTH;
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options.with_snippet = false;
    // YAML 1.2's booleans (`true`, `false`) only, as before: `y`, `on` and `no` stay strings.
    options.strict_booleans = true;
    options
}

/// Decodes `text` (JSON or YAML) through `seed`; a syntax error names the file and where.
///
/// Both decoders stream, holding the value being built and not a tree of the text: JSON through
/// `serde_json`, YAML through `serde_saphyr`, whose budget turns away a document nested deeper
/// than [`MAX_DEPTH`] where it crosses it.
fn decode_seed<T, S>(path: &Path, text: &str, json: bool, seed: S) -> Result<T>
where
    S: for<'de> serde::de::DeserializeSeed<'de, Value = T>,
{
    if json {
        let mut d = serde_json::Deserializer::from_str(text);
        return seed
            .deserialize(&mut d)
            .and_then(|v| d.end().map(|()| v))
            .map_err(|e| Error::Syntax {
                path: path.to_path_buf(),
                format: "JSON",
                line: (e.line() > 0).then_some(e.line()),
                column: (e.column() > 0).then_some(e.column()),
                message: redact_values(&e.to_string()),
            });
    }
    serde_saphyr::with_deserializer_from_str_with_options(text, yaml_options(), |d| {
        seed.deserialize(d)
    })
    .map_err(|e| yaml_error(path, &e))
}

/// A YAML decoder error as the manifest's error: too deep, or a syntax error with its location.
fn yaml_error(path: &Path, e: &serde_saphyr::Error) -> Error {
    let at = e
        .location()
        .filter(|l| l.line() > 0)
        .map(|l| (l.line() as usize, l.column() as usize));
    // Block collections cross the budget's depth; flow collections (`[[[`) the parser's
    // nesting limit, which its error names only in its message.
    let too_deep = match e {
        serde_saphyr::Error::Budget { breach, .. } => {
            matches!(breach, serde_saphyr::budget::BudgetBreach::Depth { .. })
        }
        other => other.to_string().contains("recursion limit exceeded"),
    };
    if too_deep {
        let (line, column) = at.unwrap_or_default();
        return Error::TooDeep {
            path: path.to_path_buf(),
            line,
            column,
            max: MAX_DEPTH,
        };
    }
    Error::Syntax {
        path: path.to_path_buf(),
        format: "YAML",
        line: at.map(|a| a.0),
        column: at.map(|a| a.1),
        message: redact_values(&e.to_string()),
    }
}

/// Longest decoder message kept; the rest is cut (the file and location say where to look).
const MAX_MESSAGE_CHARS: usize = 256;

/// A decoder message without the values it quotes. serde's messages quote the offending value
/// (`invalid type: string "hunter2", expected a boolean`); a rejected manifest may hold secrets
/// (an env value in the wrong place), and the message goes to the log, to
/// `/debug/manifests` and to anyone who can read them. Field names (quoted with backticks) and
/// the expected types stay, so the message still says what is wrong.
pub(crate) fn redact_values(message: &str) -> String {
    let mut out = String::with_capacity(message.len().min(MAX_MESSAGE_CHARS + 16));
    let mut quoted = false;
    let mut escaped = false;
    let mut kept = 0;
    for ch in message.chars() {
        if kept >= MAX_MESSAGE_CHARS {
            out.push_str("...");
            return out;
        }
        if quoted {
            match (escaped, ch) {
                (false, '\\') => escaped = true,
                (false, '"') => {
                    quoted = false;
                    out.push_str("<redacted>\"");
                }
                _ => escaped = false,
            }
            continue;
        }
        if ch == '"' {
            quoted = true;
        }
        out.push(ch);
        kept += 1;
    }
    if quoted {
        out.push_str("<redacted>");
    }
    out
}

/// A document's type fields, read without keeping anything else of it.
#[derive(Debug, Default)]
struct Head {
    /// The document is a mapping.
    object: bool,
    kind: Option<serde_json::Value>,
    api_version: Option<serde_json::Value>,
}

impl<'de> serde::Deserialize<'de> for Head {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_any(HeadVisitor)
    }
}

/// Takes `kind` and `apiVersion` of a mapping and skips the rest; any other document is a
/// [`Head`] that is not an object.
struct HeadVisitor;

impl<'de> serde::de::Visitor<'de> for HeadVisitor {
    type Value = Head;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a document")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(
        self,
        mut map: A,
    ) -> std::result::Result<Head, A::Error> {
        let mut head = Head {
            object: true,
            ..Head::default()
        };
        while let Some(key) = map.next_key::<serde_json::Value>()? {
            match key.as_str() {
                Some("kind") => head.kind = Some(map.next_value()?),
                Some("apiVersion") => head.api_version = Some(map.next_value()?),
                _ => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok(head)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> std::result::Result<Head, A::Error> {
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(Head::default())
    }

    fn visit_bool<E>(self, _: bool) -> std::result::Result<Head, E> {
        Ok(Head::default())
    }

    fn visit_i64<E>(self, _: i64) -> std::result::Result<Head, E> {
        Ok(Head::default())
    }

    fn visit_u64<E>(self, _: u64) -> std::result::Result<Head, E> {
        Ok(Head::default())
    }

    fn visit_f64<E>(self, _: f64) -> std::result::Result<Head, E> {
        Ok(Head::default())
    }

    fn visit_str<E>(self, _: &str) -> std::result::Result<Head, E> {
        Ok(Head::default())
    }

    fn visit_unit<E>(self) -> std::result::Result<Head, E> {
        Ok(Head::default())
    }

    fn visit_none<E>(self) -> std::result::Result<Head, E> {
        Ok(Head::default())
    }

    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> std::result::Result<Head, D::Error> {
        d.deserialize_any(HeadVisitor)
    }
}

fn check_head(head: &Head) -> Result<(), Problem> {
    if !head.object {
        return Err(Problem::NotAnObject);
    }
    let kind = head.kind.as_ref().and_then(|v| v.as_str());
    if kind != Some("Pod") {
        return Err(Problem::WrongKind {
            found: kind.map(str::to_owned),
        });
    }
    api_version_is_v1(head.api_version.as_ref().and_then(|v| v.as_str()))
}

fn check_api_version(value: &serde_json::Value) -> Result<(), Problem> {
    api_version_is_v1(value.get("apiVersion").and_then(|v| v.as_str()))
}

fn api_version_is_v1(api_version: Option<&str>) -> Result<(), Problem> {
    if api_version != Some("v1") {
        return Err(Problem::WrongApiVersion {
            found: api_version.map(str::to_owned),
        });
    }
    Ok(())
}

fn validate_before_defaults(pod: &Pod) -> Result<(), Problem> {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    if name.is_empty() {
        return Err(Problem::MissingName);
    }
    check_path_safe("metadata.name", name)?;
    if let Some(ns) = pod.metadata.namespace.as_deref() {
        check_path_safe("metadata.namespace", ns)?;
    }
    if let Some(uid) = pod.metadata.uid.as_deref()
        && let Some(reason) = bad_uid(uid)
    {
        return Err(Problem::BadName {
            field: "metadata.uid",
            value: uid.chars().take(MAX_UID).collect(),
            reason,
        });
    }
    check_metadata_sizes(pod)?;
    let spec = pod.spec.as_ref().ok_or(Problem::NoContainers)?;
    if spec.containers.is_empty() {
        return Err(Problem::NoContainers);
    }
    if let Some(value) = spec.active_deadline_seconds
        && let Some(reason) = crate::pod::deadline::invalid(value)
    {
        return Err(Problem::BadActiveDeadline { value, reason });
    }
    let mut names = HashSet::new();
    let init = spec.init_containers.as_deref().unwrap_or_default();
    for (list, containers) in [
        ("spec.initContainers", init),
        ("spec.containers", &spec.containers[..]),
    ] {
        for (index, c) in containers.iter().enumerate() {
            if c.name.is_empty() {
                return Err(Problem::ContainerWithoutName { list, index });
            }
            if let Some(reason) = dns1123_label(&c.name) {
                return Err(Problem::BadName {
                    field: "container name",
                    value: c.name.clone(),
                    reason,
                });
            }
            if c.image.as_deref().is_none_or(|i| i.trim().is_empty()) {
                return Err(Problem::ContainerWithoutImage {
                    name: c.name.clone(),
                });
            }
            if !names.insert(c.name.as_str()) {
                return Err(Problem::DuplicateContainerName {
                    name: c.name.clone(),
                });
            }
        }
    }
    Ok(())
}

fn validate_after_defaults(pod: &Pod) -> Result<(), Problem> {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    if let Some(reason) = dns1123_subdomain(name) {
        return Err(Problem::BadName {
            field: "metadata.name (with the node name appended)",
            value: name.to_owned(),
            reason,
        });
    }
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    if let Some(reason) = dns1123_label(ns) {
        return Err(Problem::BadName {
            field: "metadata.namespace",
            value: ns.to_owned(),
            reason,
        });
    }
    Ok(())
}

/// The API server's total size of a pod's annotations (keys and values), in bytes.
pub const MAX_ANNOTATIONS_BYTES: usize = 256 * 1024;
/// The API server's longest label value, and longest label key name (the part after a prefix).
const MAX_LABEL_VALUE: usize = 63;
const MAX_LABEL_NAME: usize = 63;
/// Longest label key prefix (a DNS subdomain).
const MAX_LABEL_PREFIX: usize = 253;

/// The API server's size limits on metadata, which the API would have applied before the pod
/// reached a node: without them one manifest could make every copy of the pod (the source's
/// set, the status manager, the workers) arbitrarily large.
fn check_metadata_sizes(pod: &Pod) -> Result<(), Problem> {
    if let Some(annotations) = &pod.metadata.annotations {
        let size: usize = annotations.iter().map(|(k, v)| k.len() + v.len()).sum();
        if size > MAX_ANNOTATIONS_BYTES {
            return Err(Problem::AnnotationsTooLarge {
                size,
                max: MAX_ANNOTATIONS_BYTES,
            });
        }
    }
    for (key, value) in pod.metadata.labels.iter().flatten() {
        let (prefix, name) = key.rsplit_once('/').unwrap_or(("", key));
        let problem = if name.is_empty() || name.len() > MAX_LABEL_NAME {
            Some(format!(
                "a key's name must be 1-{MAX_LABEL_NAME} characters"
            ))
        } else if prefix.len() > MAX_LABEL_PREFIX {
            Some(format!(
                "a key's prefix must be at most {MAX_LABEL_PREFIX} characters"
            ))
        } else if value.len() > MAX_LABEL_VALUE {
            // The key is safe to name (it is at most 317 characters); the value is not echoed.
            Some(format!(
                "the value of {key:?} is {} characters, over {MAX_LABEL_VALUE}",
                value.len()
            ))
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(Problem::BadLabel { problem });
        }
    }
    Ok(())
}

fn check_path_safe(field: &'static str, value: &str) -> Result<(), Problem> {
    let reason = if value.contains('/') {
        "contains '/'"
    } else if value.contains("..") {
        "contains '..'"
    } else {
        return Ok(());
    };
    Err(Problem::BadName {
        field,
        value: value.to_owned(),
        reason,
    })
}

/// The longest pod UID a manifest may give (the API's are 36-character UUIDs, the agent's own
/// 32 hex digits).
const MAX_UID: usize = 128;

/// `None` when a manifest's pod UID is safe to use as it is used, else why not: it names the
/// pod's directory under `--root-dir` and is part of its cgroup's name, where the systemd driver
/// writes its '-' as '_' (so a '_' would read back as another UID) and '.' ends a unit's name.
/// An empty UID is replaced by the agent's own.
fn bad_uid(uid: &str) -> Option<&'static str> {
    if uid.len() > MAX_UID {
        Some("is longer than 128 characters")
    } else if !uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        Some("may hold only letters, digits and '-'")
    } else {
        None
    }
}

/// `None` if `s` is a DNS-1123 label, else why not.
fn dns1123_label(s: &str) -> Option<&'static str> {
    if s.is_empty() {
        return Some("is empty");
    }
    if s.len() > 63 {
        return Some("is longer than 63 characters");
    }
    let b = s.as_bytes();
    if !b
        .iter()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
    {
        return Some("must consist of lower-case letters, digits and '-'");
    }
    if !b[0].is_ascii_alphanumeric() || !b[b.len() - 1].is_ascii_alphanumeric() {
        return Some("must start and end with a letter or digit");
    }
    None
}

/// `None` if `s` is a DNS-1123 subdomain, else why not.
pub fn dns1123_subdomain(s: &str) -> Option<&'static str> {
    if s.is_empty() {
        return Some("is empty");
    }
    if s.len() > 253 {
        return Some("is longer than 253 characters");
    }
    for label in s.split('.') {
        if label.is_empty() {
            return Some("has an empty dot-separated part");
        }
        if dns1123_label(label).is_some() {
            return Some(
                "must be dot-separated parts of lower-case letters, digits and '-', each starting and ending with a letter or digit",
            );
        }
    }
    None
}

/// Deterministic UID of a static pod: SHA-256 over (canonical JSON of the pod as parsed,
/// `host:<node>`, `file:<path>`) or, for a URL, (canonical JSON, `url:<url>`), like the kubelet's
/// inputs; truncated to 128 bits and written as 8-4-4-4-12 lower-case hex.
fn static_uid(pod: &Pod, node_name: &str, origin: Origin<'_>) -> String {
    let mut h = Sha256::new();
    // Serialising a typed Pod cannot fail (string keys, no non-finite floats in the schema); an
    // error would only weaken the hash input, never panic.
    if let Ok(json) = serde_json::to_vec(pod) {
        h.update(&json);
    }
    h.update([0]);
    match origin {
        Origin::File(path) => {
            h.update(b"host:");
            h.update(node_name.as_bytes());
            h.update([0]);
            h.update(b"file:");
            h.update(path.as_os_str().as_encoded_bytes());
        }
        Origin::Url(url) => {
            h.update(b"url:");
            h.update(url.as_bytes());
        }
    }
    let digest = h.finalize();
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

fn apply_defaults(pod: &mut Pod, uid: String, node_name: &str, origin: Origin<'_>) {
    let meta = &mut pod.metadata;
    let name = meta.name.take().unwrap_or_default();
    meta.name = Some(format!("{name}-{}", node_name.to_lowercase()));
    if meta.namespace.as_deref().is_none_or(str::is_empty) {
        meta.namespace = Some("default".to_owned());
    }
    let annotations = meta.annotations.get_or_insert_with(Default::default);
    annotations.insert(CONFIG_HASH_ANNOTATION.to_owned(), uid.clone());
    annotations.insert(
        CONFIG_SOURCE_ANNOTATION.to_owned(),
        origin.source().to_owned(),
    );
    meta.uid = Some(uid);

    let spec = pod.spec.get_or_insert_with(Default::default);
    spec.node_name = Some(node_name.to_owned());
    spec.restart_policy
        .get_or_insert_with(|| "Always".to_owned());
    spec.termination_grace_period_seconds.get_or_insert(30);
    spec.dns_policy
        .get_or_insert_with(|| "ClusterFirst".to_owned());
    let init = spec.init_containers.iter_mut().flatten();
    for c in init.chain(spec.containers.iter_mut()) {
        default_container(c);
    }
    if let Origin::File(_) = origin {
        add_or_update_toleration(
            spec.tolerations.get_or_insert_with(Vec::new),
            Toleration {
                operator: Some("Exists".to_owned()),
                effect: Some("NoExecute".to_owned()),
                ..Default::default()
            },
        );
    }

    pod.status.get_or_insert_with(PodStatus::default).phase = Some("Pending".to_owned());
}

fn default_container(c: &mut Container) {
    if c.image_pull_policy.as_deref().is_none_or(str::is_empty) {
        let image = c.image.as_deref().unwrap_or_default();
        c.image_pull_policy = Some(default_pull_policy(image).to_owned());
    }
    if c.termination_message_path
        .as_deref()
        .is_none_or(str::is_empty)
    {
        c.termination_message_path = Some("/dev/termination-log".to_owned());
    }
    c.termination_message_policy
        .get_or_insert_with(|| "File".to_owned());
    // As the API server's SetDefaults_Pod: a resource with a limit and no request is requested at
    // its limit (so a pod that sets only limits is Guaranteed). Resources are not in the container
    // hash: running containers are not restarted by this default.
    if let Some(r) = c.resources.as_mut()
        && let Some(limits) = r.limits.as_ref()
    {
        let requests = r.requests.get_or_insert_with(Default::default);
        for (name, limit) in limits {
            requests
                .entry(name.clone())
                .or_insert_with(|| limit.clone());
        }
    }
}

/// The API's default pull policy: `Always` when the tag is `latest` or absent (and there is no
/// digest), `IfNotPresent` otherwise.
fn default_pull_policy(image: &str) -> &'static str {
    let (named, digest) = match image.split_once('@') {
        Some((n, _)) => (n, true),
        None => (image, false),
    };
    let last = named.rsplit('/').next().unwrap_or(named);
    match last.rsplit_once(':') {
        Some((_, "latest")) => "Always",
        Some(_) => "IfNotPresent",
        None if digest => "IfNotPresent",
        None => "Always",
    }
}

/// Like the API helper `AddOrUpdateTolerationInPod`: replace a toleration matching on key,
/// operator, value and effect, else append.
fn add_or_update_toleration(list: &mut Vec<Toleration>, t: Toleration) {
    let same = |o: &Toleration| {
        o.key == t.key && o.operator == t.operator && o.value == t.value && o.effect == t.effect
    };
    match list.iter_mut().find(|o| same(o)) {
        Some(existing) => *existing = t,
        None => list.push(t),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE: &str = "Node-A";

    fn yaml(name: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n  - name: c\n    image: busybox:1.36\n"
        )
    }

    fn ok(text: &str) -> Pod {
        match parse(Path::new("/etc/pods/p.yaml"), text.as_bytes(), NODE) {
            Ok(p) => p,
            Err(e) => panic!("unexpected error: {e}"),
        }
    }

    fn err(text: &[u8]) -> Error {
        match parse(Path::new("/etc/pods/bad.yaml"), text, NODE) {
            Ok(p) => panic!("expected an error, got {p:?}"),
            Err(e) => {
                assert!(
                    e.to_string().contains("/etc/pods/bad.yaml"),
                    "error does not name the file: {e}"
                );
                assert_eq!(e.path(), Path::new("/etc/pods/bad.yaml"));
                e
            }
        }
    }

    fn problem(text: &str) -> Problem {
        match err(text.as_bytes()) {
            Error::Invalid { problem, .. } => problem,
            other => panic!("expected Invalid, got {other}"),
        }
    }

    #[test]
    fn defaults_name_namespace_node_status() {
        let pod = ok(&yaml("web"));
        assert_eq!(pod.metadata.name.as_deref(), Some("web-node-a"));
        assert_eq!(pod.metadata.namespace.as_deref(), Some("default"));
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(spec.node_name.as_deref(), Some(NODE));
        assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
        assert_eq!(spec.termination_grace_period_seconds, Some(30));
        assert_eq!(spec.dns_policy.as_deref(), Some("ClusterFirst"));
        let c = &spec.containers[0];
        assert_eq!(c.image_pull_policy.as_deref(), Some("IfNotPresent"));
        assert_eq!(
            c.termination_message_path.as_deref(),
            Some("/dev/termination-log")
        );
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        assert_eq!(phase, Some("Pending"));
    }

    #[test]
    fn static_pods_referencing_api_objects_are_rejected_with_the_kubelets_words() {
        let p = problem(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec:\n  \
             containers: [{name: c, image: x}]\n  volumes: [{name: v, configMap: {name: m}}]\n",
        );
        assert_eq!(p.to_string(), "static pods may not reference configmaps");
        assert_eq!(p.reason(), "api_reference");
        let p = problem(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec:\n  \
             containers: [{name: c, image: x, envFrom: [{secretRef: {name: s}}]}]\n",
        );
        assert_eq!(p.to_string(), "static pods may not reference secrets");
        // A downwardAPI volume needs no API object.
        ok("apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec:\n  \
            containers: [{name: c, image: x}]\n  \
            volumes: [{name: v, downwardAPI: {items: [{path: n, fieldRef: {fieldPath: metadata.name}}]}}]\n");
    }

    #[test]
    fn explicit_namespace_and_policies_kept() {
        let pod = ok(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a, namespace: kube-system}\n\
             spec:\n  restartPolicy: Never\n  terminationGracePeriodSeconds: 5\n  \
             containers: [{name: c, image: x, imagePullPolicy: Never}]\n",
        );
        assert_eq!(pod.metadata.namespace.as_deref(), Some("kube-system"));
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert_eq!(spec.termination_grace_period_seconds, Some(5));
        assert_eq!(
            spec.containers[0].image_pull_policy.as_deref(),
            Some("Never")
        );
    }

    #[test]
    fn limits_without_requests_are_requested_and_the_uid_is_unchanged() {
        let m = "apiVersion: v1\nkind: Pod\nmetadata: {name: lim}\nspec:\n  containers:\n  \
                 - name: c\n    image: x:1\n    resources: {limits: {cpu: 500m, memory: 64Mi}}\n";
        let p = parse(Path::new("/etc/pods/lim.yaml"), m.as_bytes(), NODE).expect("valid");
        // The UID an agent without this default gave the same file: unchanged, so an upgrade
        // keeps a running static pod.
        assert_eq!(
            p.metadata.uid.as_deref(),
            Some("05e83e9e-644e-b307-ec52-73dc8b7af47a")
        );
        let r = p
            .spec
            .as_ref()
            .map(|s| &s.containers[0])
            .and_then(|c| c.resources.as_ref());
        let requests = r
            .and_then(|r| r.requests.as_ref())
            .expect("requests defaulted");
        assert_eq!(requests["cpu"].0, "500m");
        assert_eq!(requests["memory"].0, "64Mi");
        // A request that is set is kept; a resource without a limit gets no request.
        let m = "apiVersion: v1\nkind: Pod\nmetadata: {name: both}\nspec:\n  initContainers:\n  \
                 - name: i\n    image: x:1\n    resources: {limits: {cpu: 1}, requests: {cpu: 200m}}\n  \
                 containers:\n  - name: c\n    image: x:1\n    resources: {requests: {memory: 1Mi}}\n";
        let p = ok(m);
        let spec = p.spec.as_ref().expect("spec");
        let init = spec.init_containers.as_ref().expect("init")[0]
            .resources
            .as_ref();
        let init_requests = init.and_then(|r| r.requests.as_ref()).expect("requests");
        assert_eq!(init_requests["cpu"].0, "200m");
        let app = spec.containers[0]
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref());
        assert_eq!(app.map(|r| r.len()), Some(1), "{app:?}");
    }

    #[test]
    fn pull_policy_defaults() {
        assert_eq!(default_pull_policy("busybox"), "Always");
        assert_eq!(default_pull_policy("busybox:latest"), "Always");
        assert_eq!(default_pull_policy("reg:5000/busybox"), "Always");
        assert_eq!(default_pull_policy("reg:5000/busybox:1.0"), "IfNotPresent");
        assert_eq!(default_pull_policy("busybox@sha256:abc"), "IfNotPresent");
        assert_eq!(default_pull_policy("busybox:latest@sha256:abc"), "Always");
    }

    #[test]
    fn uid_is_stable_and_depends_on_content_path_and_node() {
        let text = yaml("web");
        let uid = |text: &str, path: &str, node: &str| {
            let pod = parse(Path::new(path), text.as_bytes(), node).expect("parses");
            pod.metadata.uid.expect("uid")
        };
        let a = uid(&text, "/p/a.yaml", "n1");
        assert_eq!(a, uid(&text, "/p/a.yaml", "n1"));
        assert_eq!(a.len(), 36);
        assert!(a.chars().all(|c| c == '-' || c.is_ascii_hexdigit()));
        assert_ne!(a, uid(&yaml("web2"), "/p/a.yaml", "n1"));
        assert_ne!(a, uid(&text, "/p/b.yaml", "n1"));
        assert_ne!(a, uid(&text, "/p/a.yaml", "n2"));
        // Same pod written as JSON: same parsed content, same UID.
        let json = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web"},
            "spec":{"containers":[{"name":"c","image":"busybox:1.36"}]}}"#;
        assert_eq!(a, uid(json, "/p/a.yaml", "n1"));
    }

    #[test]
    fn a_uid_that_could_escape_its_directory_or_its_cgroup_name_is_refused() {
        let manifest = |uid: &str| {
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: a, uid: {uid:?}}}\n\
                 spec: {{containers: [{{name: c, image: busybox}}]}}\n"
            )
        };
        let long = "u".repeat(MAX_UID + 1);
        for (uid, reason) in [
            ("../../x", "letters, digits and '-'"),
            ("a/b", "letters, digits and '-'"),
            ("..", "letters, digits and '-'"),
            ("a_b", "letters, digits and '-'"),
            ("a.slice", "letters, digits and '-'"),
            (long.as_str(), "longer than 128"),
        ] {
            let e = err(manifest(uid).as_bytes());
            let message = e.to_string();
            assert!(
                message.contains("metadata.uid") && message.contains(reason),
                "{message}"
            );
            assert_eq!(e.reason(), "bad_name", "{message}");
        }
        // A UUID, as the API gives, and a plain name are kept.
        for uid in ["0f8c2a4e-5b1d-4c3a-9e7f-2d6b8a1c3e5f", "my-uid"] {
            assert_eq!(ok(&manifest(uid)).metadata.uid.as_deref(), Some(uid));
        }
    }

    #[test]
    fn explicit_uid_kept_and_annotations_set() {
        let pod = ok(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a, uid: my-uid, \
             annotations: {x: y}}\nspec: {containers: [{name: c, image: x}]}\n",
        );
        assert_eq!(pod.metadata.uid.as_deref(), Some("my-uid"));
        let ann = pod.metadata.annotations.expect("annotations");
        assert_eq!(
            ann.get(CONFIG_HASH_ANNOTATION).map(String::as_str),
            Some("my-uid")
        );
        assert_eq!(
            ann.get(CONFIG_SOURCE_ANNOTATION).map(String::as_str),
            Some("file")
        );
        assert_eq!(ann.get("x").map(String::as_str), Some("y"));
    }

    #[test]
    fn no_execute_toleration_added_once() {
        let pod = ok(&yaml("a"));
        let tol = pod.spec.expect("spec").tolerations.expect("tolerations");
        assert_eq!(tol.len(), 1);
        assert_eq!(tol[0].operator.as_deref(), Some("Exists"));
        assert_eq!(tol[0].effect.as_deref(), Some("NoExecute"));
        assert_eq!(tol[0].key, None);

        let pod = ok(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec:\n  containers: \
             [{name: c, image: x}]\n  tolerations:\n  - {operator: Exists, effect: NoExecute, \
             tolerationSeconds: 5}\n  - {key: k, operator: Exists}\n",
        );
        let tol = pod.spec.expect("spec").tolerations.expect("tolerations");
        assert_eq!(tol.len(), 2);
        assert_eq!(tol[0].toleration_seconds, None, "replaced in place");
        assert_eq!(tol[1].key.as_deref(), Some("k"));
    }

    #[test]
    fn json_with_tabs_accepted() {
        let pod = ok(
            "{\n\t\"apiVersion\": \"v1\",\n\t\"kind\": \"Pod\",\n\t\"metadata\": \
             {\"name\": \"j\"},\n\t\"spec\": {\"containers\": [{\"name\": \"c\", \"image\": \"x\"}]}\n}",
        );
        assert_eq!(pod.metadata.name.as_deref(), Some("j-node-a"));
    }

    #[test]
    fn metadata_over_the_api_limits_is_rejected() {
        let with_meta = |meta: &str| {
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: a, {meta}}}\n\
                 spec: {{containers: [{{name: c, image: x}}]}}\n"
            )
        };
        let big = "v".repeat(MAX_ANNOTATIONS_BYTES);
        match err(with_meta(&format!("annotations: {{k: {big}}}")).as_bytes()) {
            Error::Invalid {
                problem: Problem::AnnotationsTooLarge { size, max },
                ..
            } => assert_eq!(
                (size, max),
                (MAX_ANNOTATIONS_BYTES + 1, MAX_ANNOTATIONS_BYTES)
            ),
            other => panic!("unexpected {other}"),
        }
        // Exactly at the limit is fine.
        let at = "v".repeat(MAX_ANNOTATIONS_BYTES - 1);
        ok(&with_meta(&format!("annotations: {{k: {at}}}")));
        let long = "v".repeat(64);
        let e = err(with_meta(&format!("labels: {{k: {long}}}")).as_bytes());
        assert_eq!(e.reason(), "bad_label");
        assert!(!e.to_string().contains(&long), "{e}");
        let e = err(with_meta(&format!("labels: {{{long}: v}}")).as_bytes());
        assert_eq!(e.reason(), "bad_label");
        ok(&with_meta(&format!(
            "labels: {{example.com/{}: {}}}",
            "k".repeat(63),
            "v".repeat(63)
        )));
    }

    #[test]
    fn active_deadline_must_be_a_positive_int32() {
        let with = |v: &str| format!("{}  activeDeadlineSeconds: {v}\n", yaml("job"));
        let pod = ok(&with("3"));
        assert_eq!(pod.spec.and_then(|s| s.active_deadline_seconds), Some(3));
        ok(&with("2147483647"));
        for bad in ["0", "-5", "2147483648"] {
            let e = err(with(bad).as_bytes());
            assert_eq!(e.reason(), "bad_active_deadline", "{bad}: {e}");
            let text = e.to_string();
            assert!(
                text.contains(&format!("spec.activeDeadlineSeconds {bad} is invalid"))
                    && text.contains("positive integer"),
                "{text}"
            );
        }
    }

    #[test]
    fn errors_do_not_echo_values() {
        // A value of the wrong type (a token pasted in the wrong place): serde would quote it.
        let bad = "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [{name: c, \
                   image: x}], terminationGracePeriodSeconds: s3cr3t-token}\n";
        let e = err(bad.as_bytes()).to_string();
        assert!(!e.contains("s3cr3t-token"), "{e}");
        assert!(e.contains("invalid i64"), "{e}");
        let json = b"{\"apiVersion\": \"v1\", \"kind\": \"Pod\", \"metadata\": {\"name\": \"a\"}, \
            \"spec\": {\"hostNetwork\": \"p4ss\\\"word\", \"containers\": []}}";
        let e = err(json).to_string();
        assert!(!e.contains("p4ss") && !e.contains("word"), "{e}");
        assert_eq!(
            redact_values("invalid type: string \"x\", expected a boolean at `spec.x`"),
            "invalid type: string \"<redacted>\", expected a boolean at `spec.x`"
        );
        assert_eq!(redact_values("cut \"open"), "cut \"<redacted>");
        let long = "a".repeat(10_000);
        assert!(redact_values(&long).len() <= MAX_MESSAGE_CHARS + 3);
    }

    #[test]
    fn syntax_errors_carry_location() {
        match err(b"apiVersion: v1\nkind: Pod\nmetadata: [\n") {
            Error::Syntax { format, line, .. } => {
                assert_eq!(format, "YAML");
                assert!(line.is_some());
            }
            other => panic!("unexpected {other}"),
        }
        match err(b"{\"apiVersion\": \"v1\",\n \"kind\": }") {
            Error::Syntax {
                format,
                line,
                column,
                ..
            } => {
                assert_eq!(format, "JSON");
                assert_eq!(line, Some(2));
                assert!(column.is_some());
            }
            other => panic!("unexpected {other}"),
        }
        // Two documents in one file.
        let two = format!("{}---\n{}", yaml("a"), yaml("b"));
        assert!(matches!(err(two.as_bytes()), Error::Syntax { .. }));
        // Wrong field type.
        let bad = "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [{name: c, \
                   image: x}], terminationGracePeriodSeconds: soon}\n";
        assert!(matches!(err(bad.as_bytes()), Error::Syntax { .. }));
        assert!(matches!(
            err(b""),
            Error::Syntax { .. } | Error::Invalid { .. }
        ));
    }

    #[test]
    fn not_utf8() {
        let mut bytes = yaml("a").into_bytes();
        bytes.insert(5, 0xff);
        assert!(matches!(err(&bytes), Error::NotUtf8 { offset: 5, .. }));
    }

    #[test]
    fn too_large() {
        let mut text = yaml("a");
        text.push('#');
        text.push_str(&"x".repeat(MAX_CONFIG_LENGTH as usize));
        assert!(matches!(err(text.as_bytes()), Error::TooLarge { .. }));
    }

    #[test]
    fn wrong_kind_and_version() {
        assert_eq!(
            problem("apiVersion: v1\nkind: Service\nmetadata: {name: a}\n"),
            Problem::WrongKind {
                found: Some("Service".into())
            }
        );
        assert_eq!(
            problem("apiVersion: v1\nmetadata: {name: a}\n"),
            Problem::WrongKind { found: None }
        );
        assert_eq!(
            problem("apiVersion: apps/v1\nkind: Pod\nmetadata: {name: a}\n"),
            Problem::WrongApiVersion {
                found: Some("apps/v1".into())
            }
        );
        assert_eq!(problem("[1, 2]\n"), Problem::NotAnObject);
        assert_eq!(
            problem("apiVersion: v1\nmetadata: {name: a}\n").to_string(),
            "kind is None, expected \"Pod\""
        );
        // A huge or multi-byte value is quoted only in part, with its length.
        let long = format!("{}é{}", "k".repeat(ECHO_MAX - 1), "x".repeat(100_000));
        let shown = problem(&format!(
            "apiVersion: v1\nkind: {long}\nmetadata: {{name: a}}\n"
        ))
        .to_string();
        assert!(shown.len() < ECHO_MAX + 64, "{} bytes", shown.len());
        assert!(shown.contains("... (100129 bytes)"), "{shown}");
        let image = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: a}}\nspec: {{containers: [{{name: {long}}}]}}\n"
        );
        let shown = problem(&image).to_string();
        assert!(shown.len() < ECHO_MAX + 100, "{shown}");
        assert_eq!(
            problem("apiVersion: v1\nkind: List\nitems: []\n"),
            Problem::WrongKind {
                found: Some("List".into())
            }
        );
    }

    #[test]
    fn bad_names() {
        let spec = "spec: {containers: [{name: c, image: x}]}\n";
        let with_meta = |meta: &str| format!("apiVersion: v1\nkind: Pod\nmetadata: {meta}\n{spec}");
        assert_eq!(problem(&with_meta("{}")), Problem::MissingName);
        assert_eq!(problem(&with_meta("{name: ''}")), Problem::MissingName);
        for (meta, field) in [
            ("{name: a/b}", "metadata.name"),
            ("{name: a..b}", "metadata.name"),
            ("{name: a, namespace: x/y}", "metadata.namespace"),
            ("{name: a, namespace: ..}", "metadata.namespace"),
        ] {
            match problem(&with_meta(meta)) {
                Problem::BadName { field: f, .. } => assert_eq!(f, field, "{meta}"),
                other => panic!("{meta}: unexpected {other}"),
            }
        }
        for meta in [
            "{name: Upper}",
            "{name: -lead}",
            "{name: a_b}",
            "{name: a, namespace: Ns}",
            "{name: a, namespace: a.b}",
        ] {
            assert!(
                matches!(problem(&with_meta(meta)), Problem::BadName { .. }),
                "{meta}"
            );
        }
        let long = format!("{{name: {}}}", "a".repeat(250));
        assert!(matches!(
            problem(&with_meta(&long)),
            Problem::BadName { .. }
        ));
        // Dots are fine in a pod name (a subdomain).
        ok(&with_meta("{name: a.b}"));
    }

    #[test]
    fn bad_containers() {
        let with_spec =
            |spec: &str| format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: a}}\n{spec}\n");
        assert_eq!(problem(&with_spec("")), Problem::NoContainers);
        assert_eq!(
            problem(&with_spec("spec: {containers: []}")),
            Problem::NoContainers
        );
        assert!(matches!(
            problem(&with_spec("spec: {containers: [{name: '', image: x}]}")),
            Problem::ContainerWithoutName { index: 0, .. }
        ));
        // A container without a name at all fails to decode (name is required): still an error
        // naming the file.
        err(with_spec("spec: {containers: [{image: x}]}").as_bytes());
        assert_eq!(
            problem(&with_spec("spec: {containers: [{name: c}]}")),
            Problem::ContainerWithoutImage { name: "c".into() }
        );
        assert_eq!(
            problem(&with_spec("spec: {containers: [{name: c, image: ' '}]}")),
            Problem::ContainerWithoutImage { name: "c".into() }
        );
        assert_eq!(
            problem(&with_spec(
                "spec: {containers: [{name: c, image: x}, {name: c, image: y}]}"
            )),
            Problem::DuplicateContainerName { name: "c".into() }
        );
        assert_eq!(
            problem(&with_spec(
                "spec: {initContainers: [{name: c, image: x}], containers: [{name: c, image: y}]}"
            )),
            Problem::DuplicateContainerName { name: "c".into() }
        );
        assert!(matches!(
            problem(&with_spec("spec: {containers: [{name: C_1, image: x}]}")),
            Problem::BadName { .. }
        ));
    }

    /// A pod manifest in YAML with `env` vars of about 100 bytes each.
    fn pod_with_env(name: &str, vars: usize) -> String {
        let mut m = format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n  \
             - name: c\n    image: busybox\n    env:\n"
        );
        for i in 0..vars {
            m.push_str(&format!(
                "    - name: VAR_{i:08}\n      value: \"{}\"\n",
                "v".repeat(60)
            ));
        }
        m
    }

    #[test]
    fn a_pod_over_the_api_servers_request_limit_is_refused_before_it_is_decoded() {
        let big = pod_with_env("big", 32_000);
        assert!(big.len() as u64 > MAX_POD_BYTES, "{}", big.len());
        let e = err(big.as_bytes());
        assert_eq!(e.reason(), "too_large");
        assert!(
            e.to_string()
                .contains(&format!("{MAX_POD_BYTES} byte limit")),
            "{e}"
        );
        // Just under the limit it is a valid pod.
        let under = pod_with_env("under", 28_000);
        assert!((under.len() as u64) < MAX_POD_BYTES);
        let pod = ok(&under);
        let env = &pod.spec.as_ref().expect("spec").containers[0].env;
        assert_eq!(env.as_ref().map(Vec::len), Some(28_000));

        // From a URL: one pod over the limit is refused whole, though the body limit is larger.
        let url = "http://127.0.0.1:1/pods";
        let Err(e) = parse_url(url, big.as_bytes(), NODE) else {
            panic!("a single pod over the limit was accepted")
        };
        assert_eq!(e.reason(), "too_large");
        // In a PodList, the item over the limit is refused on its own (named, with its size),
        // and the small items beside it parse.
        let item = |yaml: &str| {
            let pod: serde_json::Value = serde_saphyr::from_str(yaml).expect("yaml");
            pod.to_string()
        };
        let bigger = pod_with_env("big", 40_000);
        assert!(item(&bigger).len() as u64 > MAX_POD_BYTES);
        let list = format!(
            r#"{{"kind": "PodList", "apiVersion": "v1", "items": [{}, {}, {}]}}"#,
            item(&yaml("a")),
            item(&bigger),
            item(&yaml("b"))
        );
        assert!((list.len() as u64) < MAX_CONFIG_LENGTH);
        let items = parse_url(url, list.as_bytes(), NODE).expect("list parses");
        assert_eq!(items.len(), 3);
        let Err(e) = &items[1] else {
            panic!("an item over the limit was accepted")
        };
        assert_eq!(e.reason(), "too_large");
        let named = e.to_string();
        assert!(named.contains(&format!("{url} items[1]")), "{named}");
        let Error::TooLarge { size, .. } = e else {
            panic!("{e:?}")
        };
        // The whole item was counted, close to its size as compact JSON.
        let compact = item(&bigger).len() as u64;
        assert!(
            *size > compact * 9 / 10 && *size < compact * 11 / 10,
            "{size} vs {compact}"
        );
        for i in [0, 2] {
            assert!(items[i].is_ok(), "{:?}", items[i].as_ref().err());
        }
    }

    /// A PodList of `n` pods of one container each, with `labels` labels apiece, as JSON.
    fn tiny_list(n: usize, labels: usize) -> String {
        let items: Vec<serde_json::Value> = (0..n)
            .map(|i| {
                let labels: serde_json::Map<String, serde_json::Value> =
                    (0..labels).map(|l| (format!("l{l}"), "v".into())).collect();
                serde_json::json!({"metadata": {"name": format!("p{i}"), "labels": labels},
                    "spec": {"containers": [{"name": "c", "image": "i"}]}})
            })
            .collect();
        serde_json::json!({"kind": "PodList", "apiVersion": "v1", "items": items}).to_string()
    }

    #[test]
    fn the_pods_of_a_list_are_held_to_a_memory_budget_and_the_rest_reported_once() {
        let url = "http://127.0.0.1:1/pods";
        // Small lists are read whole.
        let items = parse_url(url, tiny_list(100, 0).as_bytes(), NODE).expect("parses");
        assert_eq!(items.len(), 100);
        assert!(items.iter().all(Result::is_ok));

        // 8,000 tiny pods (under 1 MiB of JSON) would hold over the budget: the first are kept,
        // the rest are read past and reported as one error naming where it stopped.
        let n = 8_000;
        let body = tiny_list(n, 0);
        assert!((body.len() as u64) < MAX_CONFIG_LENGTH / 8);
        let items = parse_url(url, body.as_bytes(), NODE).expect("parses");
        let (last, kept) = items.split_last().expect("items");
        assert!(kept.iter().all(Result::is_ok));
        let held: usize = kept
            .iter()
            .flatten()
            .map(|p| p.pod().held_bytes().expect("packed"))
            .sum();
        assert!(held <= MAX_LIST_HELD, "{held}");
        // Each tiny pod is estimated at 1-4 KiB: some thousands fit, not all 8,000.
        assert!(kept.len() > 3_000 && kept.len() < n, "{}", kept.len());
        let Err(Error::ListTooLarge { first, count, .. }) = last else {
            panic!("{last:?}")
        };
        assert_eq!((*first, *count), (kept.len(), n - kept.len()));
        let e = last.as_ref().expect_err("error");
        assert_eq!(e.reason(), "list_too_large");
        let msg = e.to_string();
        assert!(
            msg.starts_with(&format!("{url}: {count} items from items[{first}] on")),
            "{msg}"
        );
        // The kept pods are the list's first, in order.
        let name = |p: &Result<StoredPod>| p.as_ref().ok().and_then(|p| p.metadata().name.clone());
        assert_eq!(name(&kept[0]).as_deref(), Some("p0-node-a"));
        let last_kept = format!("p{}-node-a", kept.len() - 1);
        assert_eq!(name(&kept[kept.len() - 1]), Some(last_kept));

        // The estimate follows what a pod's metadata allocates: pods with 200 labels each are
        // estimated at over 100 bytes a label, so far fewer of them fit.
        let labelled = parse_url(url, tiny_list(2_000, 200).as_bytes(), NODE).expect("parses");
        let fit = labelled.iter().filter(|p| p.is_ok()).count();
        assert!(fit < 2_000 * 100 / 200 * 12 / 10, "{fit}");
        let per_pod = labelled[0].as_ref().expect("kept").pod().held_bytes();
        assert!(per_pod > Some(200 * 100), "{per_pod:?}");
        assert!(matches!(
            labelled.last(),
            Some(Err(Error::ListTooLarge { .. }))
        ));
    }

    #[test]
    fn url_pod_and_pod_list() {
        let url = "http://127.0.0.1:1/pods";
        let one = parse_url(url, yaml("web").as_bytes(), NODE).expect("body parses");
        let pod = one.into_iter().next().expect("one pod").expect("valid");
        let pod = pod.pod().whole().expect("whole");
        assert_eq!(pod.metadata.name.as_deref(), Some("web-node-a"));
        let ann = pod.metadata.annotations.as_ref().expect("annotations");
        assert_eq!(
            ann.get(CONFIG_SOURCE_ANNOTATION).map(String::as_str),
            Some("http")
        );
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(
            spec.tolerations, None,
            "the NoExecute toleration is for file pods"
        );
        // The UID comes from the content and the URL.
        let uid = |url: &str| {
            let pods = parse_url(url, yaml("web").as_bytes(), NODE).expect("parses");
            let pod = pods.into_iter().next().expect("one").expect("valid");
            pod.uid().to_owned()
        };
        assert_eq!(uid(url), uid(url));
        assert_ne!(uid(url), uid("http://127.0.0.1:1/other"));
        assert_ne!(uid(url), ok(&yaml("web")).metadata.uid.expect("uid"));

        let list = r#"{"kind": "PodList", "apiVersion": "v1", "items": [
            {"metadata": {"name": "a"}, "spec": {"containers": [{"name": "c", "image": "x"}]}},
            {"metadata": {"name": "b"}, "spec": {"containers": []}},
            {"kind": "Service", "metadata": {"name": "c"}},
            {"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "d", "uid": "fixed"},
             "spec": {"containers": [{"name": "c", "image": "x"}]}}
        ]}"#;
        let items = parse_url(url, list.as_bytes(), NODE).expect("list parses");
        assert_eq!(items.len(), 4);
        assert_eq!(
            items[0]
                .as_ref()
                .ok()
                .and_then(|p| p.metadata().name.clone()),
            Some("a-node-a".to_owned())
        );
        for (i, reason) in [(1, "no_containers"), (2, "wrong_kind")] {
            let e = items[i].as_ref().expect_err("invalid item");
            assert_eq!(e.reason(), reason);
            let named = e.to_string();
            assert!(named.contains(&format!("{url} items[{i}]")), "{named}");
        }
        let d = items[3].as_ref().expect("valid");
        assert_eq!(d.metadata().uid.as_deref(), Some("fixed"));
        // A list's pods come packed, and unpack to the pod a single-pod body gives.
        assert!(d.pod().is_packed());
        let single = r#"{"kind": "Pod", "apiVersion": "v1", "metadata": {"name": "d", "uid": "fixed"},
             "spec": {"containers": [{"name": "c", "image": "x"}]}}"#;
        let single = parse_url(url, single.as_bytes(), NODE).expect("parses");
        let single = single[0].as_ref().expect("valid");
        assert!(!single.pod().is_packed());
        assert_eq!(
            d.pod().whole().expect("unpacks"),
            single.pod().whole().expect("whole")
        );
        assert_eq!(d.fingerprints(), single.fingerprints());
        // An empty list, a list in YAML, and bodies that are neither.
        let empty = parse_url(url, b"kind: PodList\napiVersion: v1\nitems: []\n", NODE);
        assert!(empty.expect("parses").is_empty());
        // A body that is neither a Pod nor a PodList, or a bad single pod, is rejected whole.
        let e = parse_url(url, b"kind: List\napiVersion: v1\n", NODE).expect_err("wrong kind");
        assert_eq!(e.reason(), "wrong_kind");
        let e = parse_url(url, b"[[[[]]]]", NODE).expect_err("not an object");
        assert!(e.to_string().contains("not an object"), "{e}");
        let bad_pod = "kind: Pod\napiVersion: v1\nmetadata: {name: x}\nspec: {containers: []}\n";
        let e = parse_url(url, bad_pod.as_bytes(), NODE).expect_err("no containers");
        assert_eq!(e.reason(), "no_containers");
        let e = parse_url(url, b"kind: PodList\napiVersion: v2\n", NODE).expect_err("bad");
        assert_eq!(e.reason(), "wrong_api_version");
        assert!(e.to_string().contains(url));
        let e = parse_url(url, b"{\"kind\": \"PodList\", \"items\": 3", NODE).expect_err("bad");
        assert_eq!(e.reason(), "syntax");
        // items that are not a list, in either format; items: null is an empty list; the type
        // fields may come after the items.
        for body in [
            &b"{\"kind\": \"PodList\", \"apiVersion\": \"v1\", \"items\": 3}"[..],
            b"kind: PodList\napiVersion: v1\nitems: {a: 1}\n",
        ] {
            let e = parse_url(url, body, NODE).expect_err("items not a list");
            assert_eq!(e.reason(), "syntax");
            assert!(e.to_string().contains("list"), "{e}");
        }
        let none = parse_url(url, b"kind: PodList\napiVersion: v1\nitems: null\n", NODE);
        assert!(none.expect("parses").is_empty());
        let late = "items:\n- metadata: {name: y}\n  spec: {containers: [{name: c, image: x}]}\n\
                    kind: PodList\napiVersion: v1\n";
        let items = parse_url(url, late.as_bytes(), NODE).expect("list parses");
        assert_eq!(items.len(), 1);
        assert!(items[0].is_ok(), "{:?}", items[0]);
    }

    /// `base` after a comment line of `len` bytes, to push it over a size.
    fn padded(base: &str, len: usize) -> String {
        format!("#{}\n{base}", "p".repeat(len))
    }

    #[test]
    fn yaml_aliases_tags_and_several_documents() {
        let alias = "apiVersion: v1\nkind: Pod\nmetadata: {name: &n web}\nspec:\n  \
                     containers: [{name: *n, image: x}]\n";
        let pod = ok(alias);
        assert_eq!(pod.spec.expect("spec").containers[0].name, "web");
        let tagged = "apiVersion: !!str v1\nkind: Pod\nmetadata: {name: a}\nspec:\n  \
                      containers: [{name: c, image: x}]\n";
        assert_eq!(ok(tagged).metadata.name.as_deref(), Some("a-node-a"));
        let two = format!("{}---\n{}", yaml("a"), yaml("b"));
        assert!(matches!(err(two.as_bytes()), Error::Syntax { .. }));
        // An alias bomb (ten levels of ten aliases: 10^10 nodes) is refused by the budget.
        let mut bomb = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
        for (i, prev) in ('b'..='j').zip('a'..) {
            bomb.push_str(&format!(
                "{i}: &{i} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"
            ));
        }
        match decode::<serde_json::Value>(Path::new("bomb.yaml"), &bomb, false) {
            Err(Error::Syntax { message, .. }) => assert!(message.contains("budget"), "{message}"),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn yaml_errors_quote_no_part_of_the_manifest() {
        let bad = "apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec:\n  \
                   containers: [{name: c, image: x, tty: hunter2secret}]\n";
        let e = err(bad.as_bytes());
        assert!(matches!(e, Error::Syntax { .. }), "{e}");
        assert!(!e.to_string().contains("hunter2secret"), "{e}");
    }

    #[test]
    fn a_large_yaml_pod_decodes() {
        let alias = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: &n web\nspec:\n  \
                     containers: [{name: *n, image: x}]\n";
        let big = padded(alias, 2 << 20);
        assert_eq!(ok(&big).spec.expect("spec").containers[0].name, "web");
    }

    #[test]
    fn deep_nesting_is_refused_before_decoding() {
        let deep = |open: &str, close: &str| {
            let mut d = open.repeat(100_000);
            d.push('1');
            d.push_str(&close.repeat(100_000));
            d
        };
        let url = "http://example.test/pods";
        // YAML (a flow sequence is YAML here), from a file and from a URL: refused by the decoder,
        // naming where the limit was crossed.
        let e = parse(Path::new("deep.json"), deep("[", "]").as_bytes(), NODE).expect_err("deep");
        assert_eq!(e.reason(), "too_deep", "{e}");
        assert_eq!(
            e.to_string(),
            "deep.json: YAML nested deeper than 64 levels at line 1 column 65"
        );
        let e = parse_url(url, format!("{}x", "- ".repeat(100_000)).as_bytes(), NODE)
            .expect_err("deep block");
        assert_eq!(e.reason(), "too_deep", "{e}");
        // JSON: its decoder stops at its own recursion limit.
        let e = parse_url(url, deep("{\"kind\":", "}").as_bytes(), NODE).expect_err("deep json");
        assert_eq!(e.reason(), "syntax");
        assert!(e.to_string().contains("recursion limit"), "{e}");
        // A pod's usual depth is far from the limit.
        assert!(parse(Path::new("ok.yaml"), yaml("ok").as_bytes(), NODE).is_ok());
    }
}
