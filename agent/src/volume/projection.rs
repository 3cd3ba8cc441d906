//! The volumes whose files the agent writes: `configMap`, `secret`, `downwardAPI` and `projected`
//! (of configMap, secret, downwardAPI and serviceAccountToken sources), as the kubelet's plugins
//! of those names make them. Each is planned into a [`Projection`] (checked as the API server
//! checks it), its objects are read from the API server ([`fetch`]), and its files are computed
//! ([`payload`]) and written by the atomic writer (`atomic.rs`).
use super::atomic::{self, FileProjection, Payload};
use crate::api_objects::ApiObjects;
use crate::pod::quantity::Quantity;
use k8s_openapi::api::core::v1::{
    ConfigMap, DownwardAPIVolumeFile, KeyToPath, Pod, ResourceFieldSelector, Secret,
    Volume as ApiVolume,
};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Why a volume's spec is refused ([`plan`], the API server's words where it has them), or why
/// its files cannot be computed ([`payload`], the kubelet's words).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what} {mode} (0{mode:o}) must be a number between 0 and 0777 (octal)")]
    Mode { what: &'static str, mode: i32 },
    #[error("items[].key must not be empty")]
    EmptyKey,
    /// A path the atomic writer would refuse; `at` names it (`items[].path`, `key "k"` ...).
    #[error("{at}: {source}")]
    Path { at: String, source: atomic::Error },
    #[error("items[{path:?}].fieldRef.apiVersion {api_version:?}: only \"v1\" is supported")]
    ApiVersion {
        path: String,
        api_version: Option<String>,
    },
    #[error(
        "items[{path:?}].fieldRef.fieldPath {field_path:?} is not supported in a volume (metadata.name, metadata.namespace, metadata.uid, metadata.labels, metadata.annotations, metadata.labels['<key>'], metadata.annotations['<key>'])"
    )]
    FieldPath { path: String, field_path: String },
    #[error(
        "items[{path:?}].resourceFieldRef.resource {resource:?} is not supported ({})",
        RESOURCES.join(", ")
    )]
    Resource { path: String, resource: String },
    #[error("items[{0:?}].resourceFieldRef.containerName must be set in a volume")]
    NoContainerName(String),
    #[error("items[{path:?}].resourceFieldRef.divisor: {source}")]
    Divisor { path: String, source: DivisorError },
    #[error("items[{0:?}]: one of fieldRef and resourceFieldRef must be set")]
    NoField(String),
    #[error("items[{0:?}]: fieldRef and resourceFieldRef are mutually exclusive")]
    BothFields(String),
    #[error(
        "each projected source must set exactly one of configMap, secret, downwardAPI, serviceAccountToken, clusterTrustBundle"
    )]
    SourceCount,
    #[error(
        "serviceAccountToken.expirationSeconds may not specify a duration less than 10 minutes"
    )]
    TokenTooShort,
    #[error(
        "serviceAccountToken.expirationSeconds may not specify a duration larger than 2^32 seconds"
    )]
    TokenTooLong,
    #[error("projected source clusterTrustBundle is not supported yet")]
    ClusterTrustBundle,
    #[error("conflicting duplicate paths: {0:?}")]
    DuplicatePath(String),
    /// `field`: `configMap`, `secret.secretName` ...
    #[error("{field} name must be set")]
    NoName { field: &'static str },
    /// `kind`: `configmap` or `secret`.
    #[error("{kind} {name:?} not found")]
    NotFound { kind: &'static str, name: String },
    /// `kind`: `configmap` or `secret`; `key_word`: `config` or `secret`.
    #[error("{kind} references non-existent {key_word} key: {key}")]
    MissingKey {
        kind: &'static str,
        key_word: &'static str,
        key: String,
    },
    #[error(transparent)]
    Read(Arc<crate::api_objects::Error>),
    #[error(transparent)]
    Token(Arc<super::token::Error>),
    #[error("no token was requested")]
    NoToken,
    #[error("fieldPath {0:?} is not supported")]
    UnsupportedFieldPath(String),
    #[error("the pod has no containers")]
    NoContainers,
    #[error(transparent)]
    ResourceValue(#[from] crate::pod::downward::Error),
}

/// Why a resourceFieldRef's divisor is refused.
#[derive(Debug, thiserror::Error)]
pub enum DivisorError {
    #[error("{text:?}: {source}")]
    Quantity {
        text: String,
        source: crate::pod::quantity::Error,
    },
    #[error("{text:?} is not one of {} for {resource}", allowed.join(", "))]
    NotAllowed {
        text: String,
        allowed: &'static [&'static str],
        resource: String,
    },
}

/// The API default of `defaultMode` (and of a downwardAPI item's mode).
pub const DEFAULT_MODE: u32 = 0o644;

/// Which plugin makes the volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    ConfigMap,
    Secret,
    DownwardApi,
    Projected,
}

impl Kind {
    /// The kubelet's directory of the plugin below `<pod>/volumes`.
    pub fn plugin_dir(self) -> &'static str {
        match self {
            Kind::ConfigMap => "kubernetes.io~configmap",
            Kind::Secret => "kubernetes.io~secret",
            Kind::DownwardApi => "kubernetes.io~downward-api",
            Kind::Projected => "kubernetes.io~projected",
        }
    }

    /// The kubelet's plugin name (`kubernetes.io/configmap` ...).
    pub fn plugin(self) -> &'static str {
        match self {
            Kind::ConfigMap => "kubernetes.io/configmap",
            Kind::Secret => "kubernetes.io/secret",
            Kind::DownwardApi => "kubernetes.io/downward-api",
            Kind::Projected => "kubernetes.io/projected",
        }
    }

    /// Whether the volume is a tmpfs (the kubelet wraps all but configMap in a Memory
    /// emptyDir: a secret never reaches the node's disk).
    pub fn memory(self) -> bool {
        self != Kind::ConfigMap
    }

    /// Every kind, for tear-down and orphan passes.
    pub const ALL: [Kind; 4] = [
        Kind::ConfigMap,
        Kind::Secret,
        Kind::DownwardApi,
        Kind::Projected,
    ];
}

/// `items[]` of a configMap or secret source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    pub key: String,
    pub path: String,
    pub mode: Option<u32>,
}

/// What a downwardAPI item shows.
#[derive(Debug, Clone, PartialEq)]
pub enum Field {
    /// `fieldRef.fieldPath`: `metadata.name`, `metadata.labels['k']` ...
    Path(String),
    /// `resourceFieldRef` (its `containerName` set, its divisor checked).
    Resource(ResourceFieldSelector),
}

#[derive(Debug, Clone, PartialEq)]
pub struct DownwardItem {
    pub path: String,
    pub mode: Option<u32>,
    pub field: Field,
}

/// One source of a projection.
#[derive(Debug, Clone, PartialEq)]
pub enum Projected {
    ConfigMap {
        name: String,
        items: Option<Vec<Item>>,
        optional: bool,
    },
    Secret {
        name: String,
        items: Option<Vec<Item>>,
        optional: bool,
    },
    DownwardApi(Vec<DownwardItem>),
    Token {
        audience: String,
        expiration_seconds: i64,
        path: String,
    },
}

/// A configMap, secret, downwardAPI or projected volume, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Projection {
    pub kind: Kind,
    pub default_mode: u32,
    pub sources: Vec<Projected>,
}

impl Projection {
    /// Whether the volume shows API objects that can change while the pod runs (configMaps,
    /// secrets, tokens), so that each sync rewrites it. A downwardAPI volume is rewritten too
    /// (labels and annotations of an API pod can change).
    pub fn names_objects(&self) -> bool {
        self.sources
            .iter()
            .any(|s| !matches!(s, Projected::DownwardApi(_)))
    }
}

fn mode(what: &'static str, m: Option<i32>) -> Result<Option<u32>, Error> {
    match m {
        None => Ok(None),
        Some(m) if (0..=0o777).contains(&m) => Ok(Some(m as u32)),
        Some(mode) => Err(Error::Mode { what, mode }),
    }
}

/// `path` checked as the atomic writer checks it; `at` names it in the error.
fn check_path(at: impl Into<String>, path: &str) -> Result<(), Error> {
    atomic::check_path(path).map_err(|source| Error::Path {
        at: at.into(),
        source,
    })
}

fn items(list: Option<&Vec<KeyToPath>>) -> Result<Option<Vec<Item>>, Error> {
    let Some(list) = list else { return Ok(None) };
    list.iter()
        .map(|i| {
            if i.key.is_empty() {
                return Err(Error::EmptyKey);
            }
            check_path("items[].path", &i.path)?;
            Ok(Item {
                key: i.key.clone(),
                path: i.path.clone(),
                mode: mode("items[].mode", i.mode)?,
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// The downwardAPI field paths a volume may show (the API server's list for volumes).
fn volume_field_path(p: &str) -> bool {
    matches!(
        p,
        "metadata.name"
            | "metadata.namespace"
            | "metadata.uid"
            | "metadata.labels"
            | "metadata.annotations"
    ) || subscript(p, "metadata.labels").is_some()
        || subscript(p, "metadata.annotations").is_some()
}

/// `metadata.labels['k']` -> `k`.
fn subscript<'a>(p: &'a str, prefix: &str) -> Option<&'a str> {
    p.strip_prefix(prefix)?
        .strip_prefix("['")?
        .strip_suffix("']")
        .filter(|k| !k.is_empty())
}

const RESOURCES: [&str; 6] = [
    "limits.cpu",
    "limits.memory",
    "limits.ephemeral-storage",
    "requests.cpu",
    "requests.memory",
    "requests.ephemeral-storage",
];

fn downward_items(list: &[DownwardAPIVolumeFile]) -> Result<Vec<DownwardItem>, Error> {
    list.iter()
        .map(|i| {
            check_path("items[].path", &i.path)?;
            let field = match (&i.field_ref, &i.resource_field_ref) {
                (Some(f), None) => {
                    if f.api_version.as_deref().is_some_and(|v| v != "v1") {
                        return Err(Error::ApiVersion {
                            path: i.path.clone(),
                            api_version: f.api_version.clone(),
                        });
                    }
                    if !volume_field_path(&f.field_path) {
                        return Err(Error::FieldPath {
                            path: i.path.clone(),
                            field_path: f.field_path.clone(),
                        });
                    }
                    Field::Path(f.field_path.clone())
                }
                (None, Some(r)) => {
                    if !RESOURCES.contains(&r.resource.as_str()) {
                        return Err(Error::Resource {
                            path: i.path.clone(),
                            resource: r.resource.clone(),
                        });
                    }
                    let container = r
                        .container_name
                        .clone()
                        .filter(|c| !c.is_empty())
                        .ok_or_else(|| Error::NoContainerName(i.path.clone()))?;
                    divisor(&r.resource, r.divisor.as_ref().map(|q| q.0.as_str())).map_err(
                        |source| Error::Divisor {
                            path: i.path.clone(),
                            source,
                        },
                    )?;
                    Field::Resource(ResourceFieldSelector {
                        container_name: Some(container),
                        ..r.clone()
                    })
                }
                (None, None) => return Err(Error::NoField(i.path.clone())),
                (Some(_), Some(_)) => return Err(Error::BothFields(i.path.clone())),
            };
            Ok(DownwardItem {
                path: i.path.clone(),
                mode: mode("items[].mode", i.mode)?,
                field,
            })
        })
        .collect()
}

/// A resourceFieldRef's divisor, as the API server allows it: for cpu `1m` or `1`, for memory
/// and ephemeral storage `1`, or 1 of a decimal or binary suffix.
fn divisor(resource: &str, text: Option<&str>) -> Result<Quantity, DivisorError> {
    let text = text.unwrap_or("1");
    let q = Quantity::parse(text).map_err(|source| DivisorError::Quantity {
        text: text.to_owned(),
        source,
    })?;
    let allowed: &'static [&'static str] = if resource.ends_with(".cpu") {
        &["1m", "1"]
    } else {
        &[
            "1", "1k", "1M", "1G", "1T", "1P", "1E", "1Ki", "1Mi", "1Gi", "1Ti", "1Pi", "1Ei",
        ]
    };
    let ok = allowed
        .iter()
        .any(|a| Quantity::parse(a).is_ok_and(|a| a == q));
    if ok {
        Ok(q)
    } else {
        Err(DivisorError::NotAllowed {
            text: text.to_owned(),
            allowed,
            resource: resource.to_owned(),
        })
    }
}

/// The projection of `v` when it is a configMap, secret, downwardAPI or projected volume;
/// `Ok(None)` for other types. Errors name what is wrong (the volume is named by the caller).
pub fn plan(v: &ApiVolume) -> Result<Option<Projection>, Error> {
    let default = |m: Option<i32>| mode("defaultMode", m).map(|m| m.unwrap_or(DEFAULT_MODE));
    let p = if let Some(c) = &v.config_map {
        Projection {
            kind: Kind::ConfigMap,
            default_mode: default(c.default_mode)?,
            sources: vec![Projected::ConfigMap {
                name: object_name("configMap", Some(&c.name))?,
                items: items(c.items.as_ref())?,
                optional: c.optional.unwrap_or(false),
            }],
        }
    } else if let Some(s) = &v.secret {
        Projection {
            kind: Kind::Secret,
            default_mode: default(s.default_mode)?,
            sources: vec![Projected::Secret {
                name: object_name("secret.secretName", s.secret_name.as_ref())?,
                items: items(s.items.as_ref())?,
                optional: s.optional.unwrap_or(false),
            }],
        }
    } else if let Some(d) = &v.downward_api {
        Projection {
            kind: Kind::DownwardApi,
            default_mode: default(d.default_mode)?,
            sources: vec![Projected::DownwardApi(downward_items(
                d.items.as_deref().unwrap_or_default(),
            )?)],
        }
    } else if let Some(p) = &v.projected {
        let mut sources = Vec::new();
        for s in p.sources.iter().flatten() {
            let set = [
                s.config_map.is_some(),
                s.secret.is_some(),
                s.downward_api.is_some(),
                s.service_account_token.is_some(),
                s.cluster_trust_bundle.is_some(),
            ];
            if set.iter().filter(|s| **s).count() != 1 {
                return Err(Error::SourceCount);
            }
            sources.push(if let Some(c) = &s.config_map {
                Projected::ConfigMap {
                    name: object_name("configMap", Some(&c.name))?,
                    items: items(c.items.as_ref())?,
                    optional: c.optional.unwrap_or(false),
                }
            } else if let Some(c) = &s.secret {
                Projected::Secret {
                    name: object_name("secret", Some(&c.name))?,
                    items: items(c.items.as_ref())?,
                    optional: c.optional.unwrap_or(false),
                }
            } else if let Some(d) = &s.downward_api {
                Projected::DownwardApi(downward_items(d.items.as_deref().unwrap_or_default())?)
            } else if let Some(t) = &s.service_account_token {
                let expiration_seconds = t.expiration_seconds.unwrap_or(3600);
                if expiration_seconds < 600 {
                    return Err(Error::TokenTooShort);
                }
                if expiration_seconds > 1 << 32 {
                    return Err(Error::TokenTooLong);
                }
                check_path("serviceAccountToken.path", &t.path)?;
                Projected::Token {
                    audience: t.audience.clone().unwrap_or_default(),
                    expiration_seconds,
                    path: t.path.clone(),
                }
            } else {
                return Err(Error::ClusterTrustBundle);
            });
        }
        Projection {
            kind: Kind::Projected,
            default_mode: default(p.default_mode)?,
            sources,
        }
    } else {
        return Ok(None);
    };
    // Paths named twice (the API server's "conflicting duplicate paths").
    let mut seen = std::collections::HashSet::new();
    for path in p.sources.iter().flat_map(named_paths) {
        if !seen.insert(atomic::clean(&path)) {
            return Err(Error::DuplicatePath(path));
        }
    }
    Ok(Some(p))
}

fn object_name(field: &'static str, name: Option<&String>) -> Result<String, Error> {
    name.filter(|n| !n.is_empty())
        .cloned()
        .ok_or(Error::NoName { field })
}

/// The paths a source names in its spec (its `items`, a token's path).
fn named_paths(s: &Projected) -> Vec<String> {
    match s {
        Projected::ConfigMap { items, .. } | Projected::Secret { items, .. } => {
            items.iter().flatten().map(|i| i.path.clone()).collect()
        }
        Projected::DownwardApi(items) => items.iter().map(|i| i.path.clone()).collect(),
        Projected::Token { path, .. } => vec![path.clone()],
    }
}

/// The API objects of a pod's projections, as read: `None` for one that does not exist, `Err`
/// for one that could not be read (shared: several volumes may name it). Tokens by (audience,
/// expirationSeconds).
#[derive(Debug, Default)]
pub struct Objects {
    pub config_maps: HashMap<String, Result<Option<ConfigMap>, Arc<crate::api_objects::Error>>>,
    pub secrets: HashMap<String, Result<Option<Secret>, Arc<crate::api_objects::Error>>>,
    pub tokens: HashMap<(String, i64), Result<String, Arc<super::token::Error>>>,
}

/// What the payload needs of the node and the pod beyond the pod itself.
#[derive(Debug, Clone, Copy)]
pub struct NodeContext {
    /// What the node offers a container without a limit.
    pub allocatable: crate::pod::downward::Allocatable,
    /// The owner of token files (the pod's common `runAsUser`) and the pod's `fsGroup`.
    pub fs_user: Option<u32>,
    pub fs_group: Option<u32>,
}

/// Reads every object the projections name, once each.
pub async fn fetch(
    api: &ApiObjects,
    tokens: &super::token::Tokens,
    pod: &Pod,
    projections: &[&Projection],
) -> Objects {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let mut out = Objects::default();
    for s in projections.iter().flat_map(|p| &p.sources) {
        match s {
            Projected::ConfigMap { name, .. } if !out.config_maps.contains_key(name) => {
                let got = lookup(api.config_map(ns, name).await);
                out.config_maps.insert(name.clone(), got);
            }
            Projected::Secret { name, .. } if !out.secrets.contains_key(name) => {
                let got = lookup(api.secret(ns, name).await);
                out.secrets.insert(name.clone(), got);
            }
            Projected::Token {
                audience,
                expiration_seconds,
                ..
            } => {
                let key = (audience.clone(), *expiration_seconds);
                if let std::collections::hash_map::Entry::Vacant(slot) = out.tokens.entry(key) {
                    let got = tokens.get(api, pod, audience, *expiration_seconds).await;
                    slot.insert(got.map_err(Arc::new));
                }
            }
            _ => {}
        }
    }
    out
}

fn lookup<T>(
    r: Result<T, crate::api_objects::Error>,
) -> Result<Option<T>, Arc<crate::api_objects::Error>> {
    match r {
        Ok(o) => Ok(Some(o)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(Arc::new(e)),
    }
}

/// The files of projection `p` of `pod`, as the kubelet computes them: a missing non-optional
/// object or key is an error naming it (the kubelet's words), a missing optional one gives
/// nothing.
pub fn payload(
    pod: &Pod,
    p: &Projection,
    objects: &Objects,
    node: &NodeContext,
) -> Result<Payload, Error> {
    let mut out = Payload::new();
    for s in &p.sources {
        match s {
            Projected::ConfigMap {
                name,
                items,
                optional,
            }
            | Projected::Secret {
                name,
                items,
                optional,
            } => {
                let (kind, key_word, got) = if matches!(s, Projected::ConfigMap { .. }) {
                    let got = objects.config_maps.get(name).cloned().unwrap_or(Ok(None));
                    let got = got.map_err(Error::Read)?;
                    let data = got.map(|c| keys_of(c.data.as_ref(), c.binary_data.as_ref()));
                    ("configmap", "config", data)
                } else {
                    let got = objects.secrets.get(name).cloned().unwrap_or(Ok(None));
                    let got = got.map_err(Error::Read)?;
                    let data = got.map(|s| keys_of(s.string_data.as_ref(), s.data.as_ref()));
                    ("secret", "secret", data)
                };
                let Some(data) = got else {
                    if *optional {
                        continue;
                    }
                    return Err(Error::NotFound {
                        kind,
                        name: name.clone(),
                    });
                };
                let missing = |k: &str| Error::MissingKey {
                    kind,
                    key_word,
                    key: k.to_owned(),
                };
                add_keys(
                    &mut out,
                    &data,
                    items.as_deref(),
                    *optional,
                    p.default_mode,
                    missing,
                )?;
            }
            Projected::DownwardApi(items) => {
                for i in items {
                    let data = field_value(pod, &i.field, node)?;
                    out.insert(
                        atomic::clean(&i.path),
                        FileProjection {
                            data: data.into_bytes(),
                            mode: i.mode.unwrap_or(p.default_mode),
                            owner: None,
                        },
                    );
                }
            }
            Projected::Token {
                audience,
                expiration_seconds,
                path,
            } => {
                let token = match objects.tokens.get(&(audience.clone(), *expiration_seconds)) {
                    Some(Ok(token)) => token.clone(),
                    Some(Err(e)) => return Err(Error::Token(e.clone())),
                    None => return Err(Error::NoToken),
                };
                // The kubelet's rule: defaultMode, but 0600 (and the file given to the pod's
                // user) when the pod has an fsUser or fsGroup; fsGroup ownership then adds
                // group read.
                let shared = node.fs_user.is_some() || node.fs_group.is_some();
                out.insert(
                    atomic::clean(path),
                    FileProjection {
                        data: token.into_bytes(),
                        mode: if shared { 0o600 } else { p.default_mode },
                        owner: node.fs_user,
                    },
                );
            }
        }
    }
    Ok(out)
}

/// An object's keys and their bytes: the text map, then the bytes map (a configMap's `data`
/// and `binaryData`, a secret's `stringData` and `data`).
fn keys_of(
    text: Option<&BTreeMap<String, String>>,
    bytes: Option<&BTreeMap<String, k8s_openapi::ByteString>>,
) -> BTreeMap<String, Vec<u8>> {
    let text = text.into_iter().flatten();
    let text = text.map(|(k, v)| (k.clone(), v.clone().into_bytes()));
    let bytes = bytes
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()));
    text.chain(bytes).collect()
}

fn add_keys(
    out: &mut Payload,
    data: &BTreeMap<String, Vec<u8>>,
    items: Option<&[Item]>,
    optional: bool,
    default_mode: u32,
    missing: impl Fn(&str) -> Error,
) -> Result<(), Error> {
    match items {
        None => {
            for (k, v) in data {
                check_path(format!("key {k:?}"), k)?;
                out.insert(
                    atomic::clean(k),
                    FileProjection {
                        data: v.clone(),
                        mode: default_mode,
                        owner: None,
                    },
                );
            }
        }
        Some(items) => {
            for i in items {
                let Some(v) = data.get(&i.key) else {
                    if optional {
                        continue;
                    }
                    return Err(missing(&i.key));
                };
                out.insert(
                    atomic::clean(&i.path),
                    FileProjection {
                        data: v.clone(),
                        mode: i.mode.unwrap_or(default_mode),
                        owner: None,
                    },
                );
            }
        }
    }
    Ok(())
}

/// A map as the kubelet writes labels and annotations: `key="value"` lines sorted by key, the
/// value quoted as Go quotes strings, no newline after the last.
pub fn format_map(m: &BTreeMap<String, String>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k}={}", go_quote(v)))
        .collect::<Vec<_>>()
        .join("\n")
}

fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn field_value(pod: &Pod, field: &Field, node: &NodeContext) -> Result<String, Error> {
    let meta = &pod.metadata;
    let empty = BTreeMap::new();
    let labels = meta.labels.as_ref().unwrap_or(&empty);
    let annotations = meta.annotations.as_ref().unwrap_or(&empty);
    match field {
        Field::Path(p) => Ok(match p.as_str() {
            "metadata.name" => meta.name.clone().unwrap_or_default(),
            "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
            "metadata.uid" => meta.uid.clone().unwrap_or_default(),
            "metadata.labels" => format_map(labels),
            "metadata.annotations" => format_map(annotations),
            p => {
                if let Some(k) = subscript(p, "metadata.labels") {
                    labels.get(k).cloned().unwrap_or_default()
                } else if let Some(k) = subscript(p, "metadata.annotations") {
                    annotations.get(k).cloned().unwrap_or_default()
                } else {
                    return Err(Error::UnsupportedFieldPath(p.to_owned()));
                }
            }
        }),
        Field::Resource(r) => {
            let first = pod.spec.as_ref().and_then(|s| s.containers.first());
            let own = first.ok_or(Error::NoContainers)?;
            Ok(crate::pod::downward::resource_field_ref(
                r,
                pod,
                own,
                Some(&node.allocatable),
            )?)
        }
    }
}

/// The pod's `fsUser`, as the kubelet derives it for token files: the `runAsUser` every
/// container runs as (the container's, else the pod's), when all agree and one is set.
pub fn fs_user(pod: &Pod) -> Option<u32> {
    let spec = pod.spec.as_ref()?;
    let pod_user = spec.security_context.as_ref().and_then(|s| s.run_as_user);
    let mut users = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .map(|c| {
            c.security_context
                .as_ref()
                .and_then(|s| s.run_as_user)
                .or(pod_user)
        });
    let first = users.next()??;
    if users.all(|u| u == Some(first)) {
        u32::try_from(first).ok()
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn volume(v: serde_json::Value) -> ApiVolume {
        serde_json::from_value(v).expect("a volume")
    }

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u-1",
                "labels": {"app": "web", "tier": "a\"b"}, "annotations": {"note": "x"}},
            "spec": {"containers": [{"name": "c", "image": "i",
                "resources": {"limits": {"memory": "64Mi"}, "requests": {"cpu": "250m"}}}]}
        }))
        .expect("pod")
    }

    const NODE: NodeContext = NodeContext {
        allocatable: crate::pod::downward::Allocatable {
            cpu_millis: 2000,
            memory_bytes: 8 << 30,
            ephemeral_storage_bytes: None,
        },
        fs_user: None,
        fs_group: None,
    };

    fn cm(name: &str, data: serde_json::Value, binary: serde_json::Value) -> ConfigMap {
        serde_json::from_value(
            json!({"metadata": {"name": name}, "data": data, "binaryData": binary}),
        )
        .expect("configmap")
    }

    fn files(p: &Payload) -> Vec<(String, String, u32)> {
        p.iter()
            .map(|(k, f)| {
                (
                    k.clone(),
                    String::from_utf8_lossy(&f.data).into_owned(),
                    f.mode,
                )
            })
            .collect()
    }

    #[test]
    fn a_config_map_shows_data_and_binary_data_with_the_default_mode() {
        let v =
            volume(json!({"name": "cfg", "configMap": {"name": "settings", "defaultMode": 0o440}}));
        let p = plan(&v).expect("plan").expect("a projection");
        assert_eq!(p.kind, Kind::ConfigMap);
        let mut objects = Objects::default();
        objects.config_maps.insert(
            "settings".into(),
            Ok(Some(cm(
                "settings",
                json!({"a": "1"}),
                json!({"b": "aGk="}),
            ))),
        );
        let got = payload(&pod(), &p, &objects, &NODE).expect("payload");
        assert_eq!(
            files(&got),
            [
                ("a".into(), "1".into(), 0o440),
                ("b".into(), "hi".into(), 0o440)
            ]
        );
    }

    #[test]
    fn items_pick_keys_to_paths_with_their_modes() {
        let v = volume(
            json!({"name": "cfg", "configMap": {"name": "settings", "items": [
            {"key": "a", "path": "dir/first"}, {"key": "b", "path": "second", "mode": 0o400}]}}),
        );
        let p = plan(&v).expect("plan").expect("a projection");
        let mut objects = Objects::default();
        objects.config_maps.insert(
            "settings".into(),
            Ok(Some(cm(
                "settings",
                json!({"a": "1", "b": "2", "c": "3"}),
                json!({}),
            ))),
        );
        let got = payload(&pod(), &p, &objects, &NODE).expect("payload");
        assert_eq!(
            files(&got),
            [
                ("dir/first".into(), "1".into(), 0o644),
                ("second".into(), "2".into(), 0o400)
            ]
        );
        // A key that is not there: the kubelet's error, unless optional.
        objects.config_maps.insert(
            "settings".into(),
            Ok(Some(cm("settings", json!({"a": "1"}), json!({})))),
        );
        let e = payload(&pod(), &p, &objects, &NODE).expect_err("missing key");
        assert_eq!(
            e.to_string(),
            "configmap references non-existent config key: b"
        );
    }

    #[test]
    fn a_missing_object_is_an_error_unless_optional() {
        let v = volume(json!({"name": "s", "secret": {"secretName": "creds"}}));
        let p = plan(&v).expect("plan").expect("a projection");
        let mut objects = Objects::default();
        objects.secrets.insert("creds".into(), Ok(None));
        let e = payload(&pod(), &p, &objects, &NODE).expect_err("missing");
        assert_eq!(e.to_string(), "secret \"creds\" not found");
        let v = volume(
            json!({"name": "s", "secret": {"secretName": "creds", "optional": true,
            "items": [{"key": "k", "path": "k"}]}}),
        );
        let p = plan(&v).expect("plan").expect("a projection");
        assert!(
            payload(&pod(), &p, &objects, &NODE)
                .expect("empty")
                .is_empty()
        );
        // Optional object present, optional key missing: skipped.
        let secret: Secret = serde_json::from_value(
            json!({"metadata": {"name": "creds"}, "data": {"other": "eA=="}}),
        )
        .expect("secret");
        objects.secrets.insert("creds".into(), Ok(Some(secret)));
        assert!(
            payload(&pod(), &p, &objects, &NODE)
                .expect("empty")
                .is_empty()
        );
        // An unreadable object is an error even when optional.
        let refused = crate::api_objects::Error::Watch {
            kind: "Secret",
            name: "creds".into(),
            message: "connection refused".into(),
        };
        objects
            .secrets
            .insert("creds".into(), Err(Arc::new(refused)));
        assert!(payload(&pod(), &p, &objects, &NODE).is_err());
        let v = volume(json!({"name": "c", "configMap": {"name": "nope"}}));
        let p = plan(&v).expect("plan").expect("a projection");
        let e = payload(&pod(), &p, &Objects::default(), &NODE).expect_err("missing");
        assert_eq!(e.to_string(), "configmap \"nope\" not found");
    }

    #[test]
    fn downward_api_fields_and_resources() {
        let v = volume(json!({"name": "info", "downwardAPI": {"items": [
            {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
            {"path": "ns", "fieldRef": {"fieldPath": "metadata.namespace"}},
            {"path": "uid", "fieldRef": {"fieldPath": "metadata.uid"}},
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
            {"path": "app", "fieldRef": {"fieldPath": "metadata.labels['app']"}},
            {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}, "mode": 0o600},
            {"path": "mem", "resourceFieldRef": {"containerName": "c", "resource": "limits.memory", "divisor": "1Mi"}},
            {"path": "cpu", "resourceFieldRef": {"containerName": "c", "resource": "requests.cpu", "divisor": "1m"}},
            {"path": "cpu-limit", "resourceFieldRef": {"containerName": "c", "resource": "limits.cpu"}},
        ]}}));
        let p = plan(&v).expect("plan").expect("a projection");
        assert!(p.kind.memory());
        let got = payload(&pod(), &p, &Objects::default(), &NODE).expect("payload");
        let get = |k: &str| {
            let f = &got[k];
            (String::from_utf8_lossy(&f.data).into_owned(), f.mode)
        };
        assert_eq!(get("name"), ("web".into(), 0o644));
        assert_eq!(get("ns").0, "ns");
        assert_eq!(get("uid").0, "u-1");
        assert_eq!(get("labels").0, "app=\"web\"\ntier=\"a\\\"b\"");
        assert_eq!(get("app").0, "web");
        assert_eq!(get("annotations"), ("note=\"x\"".into(), 0o600));
        assert_eq!(get("mem").0, "64");
        assert_eq!(get("cpu").0, "250");
        // No CPU limit: the node's allocatable CPU, in whole cores rounded up.
        assert_eq!(get("cpu-limit").0, "2");
    }

    #[test]
    fn bad_specs_are_refused_naming_what_is_wrong() {
        let cases = [
            (
                json!({"configMap": {"name": "x", "items": [{"key": "a", "path": "../a"}]}}),
                "'..'",
            ),
            (
                json!({"configMap": {"name": "x", "items": [{"key": "a", "path": "/a"}]}}),
                "relative",
            ),
            (
                json!({"configMap": {"name": "x", "defaultMode": 0o1777}}),
                "defaultMode",
            ),
            (json!({"secret": {}}), "secretName"),
            (
                json!({"downwardAPI": {"items": [{"path": "n", "fieldRef": {"fieldPath": "spec.nodeName"}}]}}),
                "spec.nodeName",
            ),
            (
                json!({"downwardAPI": {"items": [{"path": "n", "resourceFieldRef": {"resource": "limits.cpu"}}]}}),
                "containerName",
            ),
            (
                json!({"downwardAPI": {"items": [{"path": "n", "resourceFieldRef": {"containerName": "c", "resource": "limits.cpu", "divisor": "2"}}]}}),
                "divisor",
            ),
            (
                json!({"projected": {"sources": [{"serviceAccountToken": {"path": "t", "expirationSeconds": 60}}]}}),
                "10 minutes",
            ),
            (
                json!({"projected": {"sources": [
                {"configMap": {"name": "a", "items": [{"key": "k", "path": "same"}]}},
                {"secret": {"name": "b", "items": [{"key": "k", "path": "same"}]}}]}}),
                "duplicate",
            ),
            (
                json!({"projected": {"sources": [{"clusterTrustBundle": {"path": "b", "name": "x"}}]}}),
                "not supported yet",
            ),
        ];
        for (mut v, want) in cases {
            v["name"] = json!("v");
            let e = plan(&volume(v.clone())).expect_err(&v.to_string());
            let e = e.to_string();
            assert!(e.contains(want), "{v}: {e}");
        }
    }

    #[test]
    fn projected_tokens_use_the_default_mode_unless_the_pod_has_an_fs_user_or_group() {
        let v = volume(json!({"name": "p", "projected": {"sources": [
            {"serviceAccountToken": {"path": "token", "audience": "vault"}},
            {"downwardAPI": {"items": [{"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]}},
        ]}}));
        let p = plan(&v).expect("plan").expect("a projection");
        assert_eq!(
            p.sources[0],
            Projected::Token {
                audience: "vault".into(),
                expiration_seconds: 3600,
                path: "token".into()
            }
        );
        let mut objects = Objects::default();
        objects
            .tokens
            .insert(("vault".into(), 3600), Ok("jwt".into()));
        let got = payload(&pod(), &p, &objects, &NODE).expect("payload");
        assert_eq!(
            files(&got),
            [
                ("name".into(), "web".into(), 0o644),
                ("token".into(), "jwt".into(), 0o644)
            ]
        );
        let node = NodeContext {
            fs_group: Some(2000),
            ..NODE
        };
        let got = payload(&pod(), &p, &objects, &node).expect("payload");
        assert_eq!(got["token"].mode, 0o600);
    }

    #[test]
    fn fs_user_is_the_run_as_user_all_containers_share() {
        let mut p = pod();
        assert_eq!(fs_user(&p), None);
        p.spec.as_mut().expect("spec").security_context =
            Some(serde_json::from_value(json!({"runAsUser": 1000})).expect("sc"));
        assert_eq!(fs_user(&p), Some(1000));
        p.spec.as_mut().expect("spec").containers[0].security_context =
            Some(serde_json::from_value(json!({"runAsUser": 7})).expect("sc"));
        assert_eq!(fs_user(&p), Some(7));
    }
}
