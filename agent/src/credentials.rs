//! Image pull credentials, found as the kubelet finds them: a keyring of registry locations
//! (`host[:port][/path]`, the host's dot-separated parts may be `*` globs) and their credentials,
//! filled from a pod's `imagePullSecrets` and from the node's docker configuration files.
//!
//! - Node files: the first valid `config.json` (`{"auths": {...}}`) in `--root-dir`, the working
//!   directory, `$HOME/.docker`, `/.docker`; when there is none, the first valid `.dockercfg` (the
//!   older format, the bare map) in `--root-dir`, the working directory, `$HOME`, `/`.
//! - Secrets: `kubernetes.io/dockerconfigjson` (key `.dockerconfigjson`, the `config.json` format)
//!   and `kubernetes.io/dockercfg` (key `.dockercfg`); secrets of other types are ignored.
//! - An entry holds `username` and `password`, or `auth` = base64(`username:password`), which wins.
//! - A lookup takes the image's repository (`docker.io/library/busybox` for `busybox:1`) and
//!   returns the credentials of every location that matches it, most specific location first:
//!   same port, same number of host parts, each host part matching its glob, and the location's
//!   path a prefix of the repository's path. Docker Hub images fall back to the credentials of
//!   `index.docker.io` (what `https://index.docker.io/v1/` becomes).
//!
//! Credentials never reach a log line or an error message: [`Auth`]'s `Debug` shows neither part,
//! and parse errors name where the bad entry is, never its content.
use base64::Engine;
use k8s_openapi::api::core::v1::Secret;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// The secret type holding a `config.json` under [`DOCKER_CONFIG_JSON_KEY`].
pub const DOCKER_CONFIG_JSON_TYPE: &str = "kubernetes.io/dockerconfigjson";
pub const DOCKER_CONFIG_JSON_KEY: &str = ".dockerconfigjson";
/// The secret type holding a `.dockercfg` under [`DOCKERCFG_KEY`].
pub const DOCKERCFG_TYPE: &str = "kubernetes.io/dockercfg";
pub const DOCKERCFG_KEY: &str = ".dockercfg";

const CONFIG_JSON: &str = "config.json";
const DOCKERCFG: &str = ".dockercfg";
/// The key Docker Hub's credentials are kept under (`https://index.docker.io/v1/` becomes it).
const DEFAULT_REGISTRY_HOST: &str = "index.docker.io";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The content is not the expected JSON; `problem` says where, never what.
    #[error("{source_name} is not a valid docker config: {problem}")]
    Json {
        source_name: String,
        problem: String,
    },
    #[error("{source_name}: the auth of registry {registry:?} is not base64(username:password)")]
    Auth {
        source_name: String,
        registry: String,
    },
}

/// One credential: what goes into CRI's `AuthConfig`.
#[derive(Clone, PartialEq, Eq)]
pub struct Auth {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Auth { <redacted> }")
    }
}

#[derive(serde::Deserialize)]
struct Entry {
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    auth: Option<String>,
}

#[derive(serde::Deserialize)]
struct ConfigJson {
    #[serde(default)]
    auths: Option<BTreeMap<String, Entry>>,
}

/// Where a serde error is, without its text (which can quote the offending value).
fn json_error(source_name: &str, e: &serde_json::Error) -> Error {
    let kind = match e.classify() {
        serde_json::error::Category::Io => "unreadable",
        serde_json::error::Category::Syntax => "a syntax error",
        serde_json::error::Category::Data => "a value of the wrong type",
        serde_json::error::Category::Eof => "cut short",
    };
    Error::Json {
        source_name: source_name.to_owned(),
        problem: format!("{kind} at line {} column {}", e.line(), e.column()),
    }
}

fn entries(source_name: &str, map: BTreeMap<String, Entry>) -> Result<Vec<(String, Auth)>, Error> {
    map.into_iter()
        .map(|(registry, e)| {
            let auth = match e.auth.filter(|a| !a.is_empty()) {
                Some(a) => decode_auth(&a).ok_or_else(|| Error::Auth {
                    source_name: source_name.to_owned(),
                    registry: registry.clone(),
                })?,
                None => Auth {
                    username: e.username.unwrap_or_default(),
                    password: e.password.unwrap_or_default(),
                },
            };
            Ok((registry, auth))
        })
        .collect()
}

/// `auth` is base64(`username:password`), padded or not.
fn decode_auth(field: &str) -> Option<Auth> {
    let engine = if field.trim().ends_with('=') {
        &base64::engine::general_purpose::STANDARD
    } else {
        &base64::engine::general_purpose::STANDARD_NO_PAD
    };
    let decoded = String::from_utf8(engine.decode(field).ok()?).ok()?;
    let (username, password) = decoded.split_once(':')?;
    Some(Auth {
        username: username.to_owned(),
        password: password.to_owned(),
    })
}

/// The registries of a `config.json` (`{"auths": {...}}`); `source_name` names it in errors.
pub fn parse_config_json(source_name: &str, data: &[u8]) -> Result<Vec<(String, Auth)>, Error> {
    let cfg: ConfigJson = serde_json::from_slice(data).map_err(|e| json_error(source_name, &e))?;
    entries(source_name, cfg.auths.unwrap_or_default())
}

/// The registries of a `.dockercfg` (the bare map of registry to entry).
pub fn parse_dockercfg(source_name: &str, data: &[u8]) -> Result<Vec<(String, Auth)>, Error> {
    let map: BTreeMap<String, Entry> =
        serde_json::from_slice(data).map_err(|e| json_error(source_name, &e))?;
    entries(source_name, map)
}

/// Registry locations and their credentials, looked up by image repository.
#[derive(Debug, Clone, Default)]
pub struct Keyring {
    /// Every key once, in reverse lexical order: a more specific path comes first.
    index: Vec<String>,
    creds: HashMap<String, Vec<Auth>>,
}

/// A location or repository written without a scheme, split like a URL: (host with port, path).
fn host_and_path(schemeless: &str) -> (&str, &str) {
    let end = schemeless.find(['?', '#']).unwrap_or(schemeless.len());
    let s = &schemeless[..end];
    match s.find('/') {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, ""),
    }
}

/// The keyring key of a config location: scheme dropped, `/v1/` and `/v2/` path prefixes
/// dropped, a bare `/` path dropped. `None` when it names no host.
fn location_key(location: &str) -> Option<String> {
    let schemeless = location
        .strip_prefix("https://")
        .or_else(|| location.strip_prefix("http://"))
        .unwrap_or(location);
    let (host, path) = host_and_path(schemeless);
    if host.is_empty() || host.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return None;
    }
    let path = if path.starts_with("/v1/") || path.starts_with("/v2/") {
        &path[3..]
    } else {
        path
    };
    Some(if path.is_empty() || path == "/" {
        host.to_owned()
    } else {
        format!("{host}{path}")
    })
}

fn split_host_port(host: &str) -> (&str, &str) {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split_once("]:").unwrap_or((host, ""));
    }
    match host.split_once(':') {
        Some((h, port)) if !port.contains(':') => (h, port),
        _ => (host, ""),
    }
}

/// Whether keyring key `glob` matches repository `target`.
fn location_matches(glob: &str, target: &str) -> bool {
    let (glob_host, glob_path) = host_and_path(glob);
    let (target_host, target_path) = host_and_path(target);
    let (glob_host, glob_port) = split_host_port(glob_host);
    let (target_host, target_port) = split_host_port(target_host);
    if glob_port != target_port || !target_path.starts_with(glob_path) {
        return false;
    }
    let glob_parts: Vec<&str> = glob_host.split('.').collect();
    let target_parts: Vec<&str> = target_host.split('.').collect();
    glob_parts.len() == target_parts.len()
        && glob_parts
            .iter()
            .zip(&target_parts)
            .all(|(g, t)| glob_match(g.as_bytes(), t.as_bytes()) == Some(true))
}

/// Shell-style matching of one host part: `*` any run, `?` one character, `[a-z]` / `[^a-z]`
/// classes, `\` escapes. `None`: a malformed pattern (which matches nothing).
fn glob_match(p: &[u8], t: &[u8]) -> Option<bool> {
    match p.first() {
        None => Some(t.is_empty()),
        Some(b'*') => {
            let rest = &p[1..];
            for i in 0..=t.len() {
                if glob_match(rest, &t[i..])? {
                    return Some(true);
                }
            }
            Some(false)
        }
        Some(b'?') => match t.split_first() {
            Some((_, t)) => glob_match(&p[1..], t),
            None => Some(false),
        },
        Some(b'[') => {
            let (matched, rest) = class_match(&p[1..], t.first().copied())?;
            match t.split_first() {
                Some((_, t)) if matched => glob_match(rest, t),
                _ => Some(false),
            }
        }
        Some(b'\\') => {
            let (&c, rest) = p[1..].split_first()?;
            match t.split_first() {
                Some((&tc, t)) if tc == c => glob_match(rest, t),
                _ => Some(false),
            }
        }
        Some(&c) => match t.split_first() {
            Some((&tc, t)) if tc == c => glob_match(&p[1..], t),
            _ => Some(false),
        },
    }
}

/// A `[...]` class (after the `[`) against `c`: whether it matched and the pattern after `]`.
fn class_match(p: &[u8], c: Option<u8>) -> Option<(bool, &[u8])> {
    let (negated, mut p) = match p.split_first() {
        Some((b'^', rest)) => (true, rest),
        _ => (false, p),
    };
    let mut matched = false;
    let mut first = true;
    loop {
        match p.split_first() {
            None => return None,
            Some((b']', rest)) if !first => {
                return Some((c.is_some() && matched != negated, rest));
            }
            _ => {}
        }
        first = false;
        let (lo, rest) = class_char(p)?;
        let (hi, rest) = match rest.split_first() {
            Some((b'-', r)) if r.first() != Some(&b']') => class_char(r)?,
            _ => (lo, rest),
        };
        if lo > hi {
            return None;
        }
        if c.is_some_and(|c| lo <= c && c <= hi) {
            matched = true;
        }
        p = rest;
    }
}

fn class_char(p: &[u8]) -> Option<(u8, &[u8])> {
    match p.split_first()? {
        (b'\\', rest) => rest.split_first().map(|(&c, r)| (c, r)),
        (&c, rest) => Some((c, rest)),
    }
}

/// Whether `repository` is on Docker Hub, judged by its name as the kubelet judges it.
fn is_default_registry(repository: &str) -> bool {
    match repository.split_once('/') {
        _ if repository.is_empty() => false,
        None => true,
        Some((first, _)) => {
            first == "docker.io" || first == "index.docker.io" || !first.contains(['.', ':'])
        }
    }
}

/// The repository an image reference pulls from, normalized as the runtime normalizes it: tag
/// and digest dropped, `docker.io` for a name without a registry, `library/` for an official
/// image (`busybox:1` -> `docker.io/library/busybox`).
pub fn repository(image: &str) -> String {
    let name = image.split('@').next().unwrap_or(image);
    let name = match name.rfind(':') {
        Some(i) if !name[i..].contains('/') => &name[..i],
        _ => name,
    };
    let (domain, rest) = match name.split_once('/') {
        Some((d, r)) if d.contains(['.', ':']) || d == "localhost" || d.to_lowercase() != d => {
            (d, r)
        }
        _ => ("docker.io", name),
    };
    let domain = if domain == DEFAULT_REGISTRY_HOST {
        "docker.io"
    } else {
        domain
    };
    if domain == "docker.io" && !rest.contains('/') {
        format!("{domain}/library/{rest}")
    } else {
        format!("{domain}/{rest}")
    }
}

impl Keyring {
    /// Adds the credentials of config `entries` (a location that names no host is skipped).
    pub fn add(&mut self, entries: impl IntoIterator<Item = (String, Auth)>) {
        for (location, auth) in entries {
            let Some(key) = location_key(&location) else {
                tracing::warn!(location = %location, "docker config entry names no registry host: ignored");
                continue;
            };
            let creds = self.creds.entry(key.clone()).or_default();
            if creds.is_empty() {
                self.index.push(key);
            }
            creds.push(auth);
        }
        self.index.sort_unstable_by(|a, b| b.cmp(a));
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The credentials for `repository` ([`repository`] of the image), most specific first.
    pub fn lookup(&self, repository: &str) -> Vec<Auth> {
        let found: Vec<Auth> = self
            .index
            .iter()
            .filter(|k| location_matches(k, repository))
            .flat_map(|k| self.creds[k].iter().cloned())
            .collect();
        if found.is_empty() && is_default_registry(repository) {
            return self
                .creds
                .get(DEFAULT_REGISTRY_HOST)
                .cloned()
                .unwrap_or_default();
        }
        found
    }

    /// The keyring of a pod's pull secrets. Secrets of other types (or without their key) are
    /// ignored; a malformed one is an error naming it.
    pub fn from_secrets(secrets: &[Secret]) -> Result<Keyring, Error> {
        let mut keyring = Keyring::default();
        for s in secrets {
            let name = format!(
                "secret {}/{}",
                s.metadata.namespace.as_deref().unwrap_or_default(),
                s.metadata.name.as_deref().unwrap_or_default()
            );
            let data = |key: &str| {
                s.data
                    .as_ref()
                    .and_then(|d| d.get(key))
                    .map(|b| b.0.as_slice())
                    .filter(|b| !b.is_empty())
            };
            let entries = match s.type_.as_deref() {
                Some(DOCKER_CONFIG_JSON_TYPE) => match data(DOCKER_CONFIG_JSON_KEY) {
                    Some(d) => parse_config_json(&format!("{name} ({DOCKER_CONFIG_JSON_KEY})"), d)?,
                    None => continue,
                },
                Some(DOCKERCFG_TYPE) => match data(DOCKERCFG_KEY) {
                    Some(d) => parse_dockercfg(&format!("{name} ({DOCKERCFG_KEY})"), d)?,
                    None => continue,
                },
                _ => continue,
            };
            keyring.add(entries);
        }
        Ok(keyring)
    }
}

/// The node's docker configuration files, searched in the kubelet's order and read on every
/// use (a changed file counts at the next pull).
#[derive(Debug, Clone, Default)]
pub struct NodeFiles {
    /// Directories holding `config.json`, in order; an empty path is the working directory.
    config_json_dirs: Vec<PathBuf>,
    /// Directories holding `.dockercfg`, in order.
    dockercfg_dirs: Vec<PathBuf>,
}

impl NodeFiles {
    /// The kubelet's search: `root_dir`, the working directory, then `$HOME/.docker` and
    /// `/.docker` for `config.json`, `$HOME` and `/` for `.dockercfg`.
    pub fn kubelet_search(root_dir: &Path) -> Self {
        let home = std::env::var_os("HOME")
            .filter(|h| !h.is_empty())
            .map(PathBuf::from);
        let mut config_json_dirs = vec![root_dir.to_owned(), PathBuf::new()];
        let mut dockercfg_dirs = config_json_dirs.clone();
        if let Some(home) = home {
            config_json_dirs.push(home.join(".docker"));
            dockercfg_dirs.push(home);
        }
        config_json_dirs.push(PathBuf::from("/.docker"));
        dockercfg_dirs.push(PathBuf::from("/"));
        Self {
            config_json_dirs,
            dockercfg_dirs,
        }
    }

    /// Reads the first valid `config.json`, else the first valid `.dockercfg`; empty when there
    /// is neither. Unreadable or invalid files are logged (path and error) and skipped. Blocking.
    pub fn read(&self) -> Keyring {
        let mut keyring = Keyring::default();
        let found = first_valid(&self.config_json_dirs, CONFIG_JSON, parse_config_json)
            .or_else(|| first_valid(&self.dockercfg_dirs, DOCKERCFG, parse_dockercfg));
        if let Some(entries) = found {
            keyring.add(entries);
        }
        keyring
    }
}

type Parser = fn(&str, &[u8]) -> Result<Vec<(String, Auth)>, Error>;

fn first_valid(dirs: &[PathBuf], file: &str, parse: Parser) -> Option<Vec<(String, Auth)>> {
    for dir in dirs {
        let path = if dir.as_os_str().is_empty() {
            match std::env::current_dir() {
                Ok(cwd) => cwd.join(file),
                Err(_) => continue,
            }
        } else {
            dir.join(file)
        };
        let data = match std::fs::read(&path) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "reading a docker config file: skipped");
                continue;
            }
        };
        match parse(&path.display().to_string(), &data) {
            Ok(entries) => {
                tracing::debug!(path = %path.display(), registries = entries.len(), "node pull credentials");
                return Some(entries);
            }
            Err(e) => tracing::warn!(error = %e, "invalid docker config file: skipped"),
        }
    }
    None
}

#[cfg(test)]
mod tests;
