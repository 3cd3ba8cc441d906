//! Delegated authentication and authorization of kubelet API callers, as the kubelet does it
//! with `--authentication-token-webhook` and `--authorization-mode=Webhook`: a bearer token is
//! sent to the API server in a `TokenReview` (authentication.k8s.io/v1), whose answer names the
//! caller; each request is then checked with a `SubjectAccessReview` (authorization.k8s.io/v1)
//! on the resource `nodes/<subresource>` named after this node, the verb from the HTTP method.
//! Answers are cached: token reviews for `--authentication-token-webhook-cache-ttl` (2m), access
//! decisions for `--authorization-webhook-cache-authorized-ttl` (5m) when allowed and
//! `--authorization-webhook-cache-unauthorized-ttl` (30s) when not. A review that fails (the API
//! server unreachable) is not cached and refuses the request.
use super::tls::User;
use axum::http::Method;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use sha2::Digest as _;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Cached answers kept at most; beyond it expired ones are dropped, then the oldest.
const CACHE_ENTRIES: usize = 4096;

/// What the webhooks do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Token reviews on, with this cache TTL.
    pub token_ttl: Option<Duration>,
    /// Access reviews on, with the TTLs of allowed and denied decisions.
    pub access_ttls: Option<(Duration, Duration)>,
}

impl Settings {
    pub fn any(&self) -> bool {
        self.token_ttl.is_some() || self.access_ttls.is_some()
    }
}

/// What a request asks for, as the kubelet names it for authorization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributes {
    pub verb: &'static str,
    pub subresource: &'static str,
}

/// The kubelet's request attributes: `GET` get, `POST` create, `PUT` update, `PATCH` patch,
/// `DELETE` delete, any other method (`HEAD` included) the empty verb, which no rule but a
/// wildcard grants; the subresource `stats` for `/stats`, `metrics` for `/metrics`, `log`
/// for `/logs`, `spec` for `/spec`, `checkpoint` for `/checkpoint`, else `proxy` (exec, logs of
/// containers, port forwarding, `/pods`, `/healthz`).
pub fn attributes(method: &Method, path: &str) -> Attributes {
    let verb = match *method {
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        Method::GET => "get",
        _ => "",
    };
    let under = |prefix: &str| {
        path == prefix
            || path
                .strip_prefix(prefix)
                .is_some_and(|rest| rest.starts_with('/'))
    };
    let subresource = [
        ("/stats", "stats"),
        ("/metrics", "metrics"),
        ("/logs", "log"),
        ("/spec", "spec"),
        ("/checkpoint", "checkpoint"),
    ]
    .into_iter()
    .find(|(prefix, _)| under(prefix))
    .map_or("proxy", |(_, s)| s);
    Attributes { verb, subresource }
}

/// A cache of answers with their expiry.
#[derive(Debug)]
struct Cache<V>(Mutex<HashMap<[u8; 32], (Instant, V)>>);

impl<V: Clone> Cache<V> {
    fn new() -> Self {
        Self(Mutex::new(HashMap::new()))
    }

    fn get(&self, key: &[u8; 32]) -> Option<V> {
        let map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.get(key)
            .filter(|(until, _)| *until > Instant::now())
            .map(|(_, v)| v.clone())
    }

    fn put(&self, key: [u8; 32], value: V, ttl: Duration) {
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = Instant::now();
        if map.len() >= CACHE_ENTRIES {
            map.retain(|_, (until, _)| *until > now);
        }
        if map.len() >= CACHE_ENTRIES
            && let Some(oldest) = map
                .iter()
                .min_by_key(|(_, (until, _))| *until)
                .map(|(k, _)| *k)
        {
            map.remove(&oldest);
        }
        map.insert(key, (now + ttl, value));
    }
}

/// The key of a cached answer: a digest, so tokens are not kept in memory as they are. Each
/// part goes in with its length first, so no two lists of parts share a key.
fn key(parts: &[&str]) -> [u8; 32] {
    let mut h = sha2::Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p.as_bytes());
    }
    h.finalize().into()
}

/// The key of an access decision: everything the review is asked about, the user's groups and
/// extra attributes each counted, so two users that differ anywhere never share a decision.
fn decision_key(user: &User, attrs: &Attributes) -> [u8; 32] {
    let (groups, extras) = (user.groups.len().to_string(), user.extra.len().to_string());
    let mut parts: Vec<&str> = vec![&user.name, user.uid.as_deref().unwrap_or_default(), &groups];
    parts.extend(user.groups.iter().map(String::as_str));
    parts.push(&extras);
    let counts: Vec<String> = user.extra.values().map(|v| v.len().to_string()).collect();
    for ((name, values), count) in user.extra.iter().zip(&counts) {
        parts.extend([name.as_str(), count.as_str()]);
        parts.extend(values.iter().map(String::as_str));
    }
    parts.extend([attrs.verb, attrs.subresource]);
    key(&parts)
}

/// The SubjectAccessReview of `user` doing `attrs` on node `node`, as the kubelet asks it.
fn access_review(node: &str, user: &User, attrs: &Attributes) -> SubjectAccessReview {
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.name.clone()),
            groups: Some(user.groups.clone()),
            uid: user.uid.clone(),
            extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(attrs.verb.to_owned()),
                group: Some(String::new()),
                version: Some("v1".to_owned()),
                resource: Some("nodes".to_owned()),
                subresource: Some(attrs.subresource.to_owned()),
                name: Some(node.to_owned()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The webhooks of one kubelet API server.
#[derive(Clone)]
pub struct Webhook {
    client: kube::Client,
    node: String,
    settings: Settings,
    tokens: Arc<Cache<Option<User>>>,
    decisions: Arc<Cache<Decision>>,
}

/// An access review's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allowed,
    /// Denied, with the reviewer's reason (may be empty).
    Denied(String),
}

impl std::fmt::Debug for Webhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhook")
            .field("node", &self.node)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Webhook {
    pub fn new(client: kube::Client, node: String, settings: Settings) -> Self {
        Self {
            client,
            node,
            settings,
            tokens: Arc::new(Cache::new()),
            decisions: Arc::new(Cache::new()),
        }
    }

    pub fn reviews_tokens(&self) -> bool {
        self.settings.token_ttl.is_some()
    }

    pub fn reviews_access(&self) -> bool {
        self.settings.access_ttls.is_some()
    }

    /// The user a bearer token names (`None`: the API server does not know it).
    pub async fn review_token(&self, token: &str) -> Result<Option<User>, kube::Error> {
        let ttl = self.settings.token_ttl.unwrap_or_default();
        let k = key(&[token]);
        if let Some(cached) = self.tokens.get(&k) {
            return Ok(cached);
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                ..Default::default()
            },
            ..Default::default()
        };
        let api: kube::Api<TokenReview> = kube::Api::all(self.client.clone());
        let answer = api
            .create(&kube::api::PostParams::default(), &review)
            .await?;
        let user = answer
            .status
            .filter(|s| s.authenticated == Some(true))
            .and_then(|s| s.user)
            .and_then(|u| {
                Some(User {
                    name: u.username.filter(|n| !n.is_empty())?,
                    groups: u.groups.unwrap_or_default(),
                    uid: u.uid.filter(|uid| !uid.is_empty()),
                    extra: u.extra.unwrap_or_default(),
                })
            });
        self.tokens.put(k, user.clone(), ttl);
        Ok(user)
    }

    /// Whether `user` may do what `attrs` name on this node.
    pub async fn review_access(
        &self,
        user: &User,
        attrs: &Attributes,
    ) -> Result<Decision, kube::Error> {
        let (allowed_ttl, denied_ttl) = self.settings.access_ttls.unwrap_or_default();
        let k = decision_key(user, attrs);
        if let Some(cached) = self.decisions.get(&k) {
            return Ok(cached);
        }
        let review = access_review(&self.node, user, attrs);
        let api: kube::Api<SubjectAccessReview> = kube::Api::all(self.client.clone());
        let answer = api
            .create(&kube::api::PostParams::default(), &review)
            .await?;
        let status = answer.status.unwrap_or_default();
        let decision = if status.allowed && status.denied != Some(true) {
            Decision::Allowed
        } else {
            Decision::Denied(status.reason.unwrap_or_default())
        };
        let ttl = match decision {
            Decision::Allowed => allowed_ttl,
            Decision::Denied(_) => denied_ttl,
        };
        self.decisions.put(k, decision.clone(), ttl);
        Ok(decision)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_named_as_the_kubelet_names_them() {
        let a = |m: Method, p: &str| {
            let a = attributes(&m, p);
            (a.verb, a.subresource)
        };
        assert_eq!(a(Method::GET, "/stats/summary"), ("get", "stats"));
        assert_eq!(a(Method::GET, "/stats"), ("get", "stats"));
        assert_eq!(a(Method::GET, "/statsz"), ("get", "proxy"));
        assert_eq!(a(Method::GET, "/metrics/resource"), ("get", "metrics"));
        assert_eq!(a(Method::GET, "/logs/syslog"), ("get", "log"));
        assert_eq!(a(Method::GET, "/spec/"), ("get", "spec"));
        assert_eq!(
            a(Method::POST, "/checkpoint/ns/p/c"),
            ("create", "checkpoint")
        );
        assert_eq!(a(Method::POST, "/exec/ns/p/c"), ("create", "proxy"));
        assert_eq!(a(Method::GET, "/containerLogs/ns/p/c"), ("get", "proxy"));
        assert_eq!(a(Method::HEAD, "/pods"), ("", "proxy"));
        let odd = Method::from_bytes(b"PROPFIND").unwrap();
        assert_eq!(a(odd, "/stats/summary"), ("", "stats"));
        assert_eq!(a(Method::OPTIONS, "/exec/ns/p/c"), ("", "proxy"));
        assert_eq!(a(Method::PUT, "/x"), ("update", "proxy"));
        assert_eq!(a(Method::PATCH, "/x"), ("patch", "proxy"));
        assert_eq!(a(Method::DELETE, "/x"), ("delete", "proxy"));
    }

    /// Users that differ in any attribute never share a cached decision (groups were once
    /// joined with ',', so `a,b` and `a`+`b` did), and the review carries the UID and extras.
    #[test]
    fn decisions_are_keyed_by_every_attribute_of_the_user() {
        let attrs = attributes(&Method::GET, "/pods");
        let user = |groups: &[&str], uid: Option<&str>, extra: &[(&str, &[&str])]| User {
            name: "u".into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            uid: uid.map(str::to_owned),
            extra: extra
                .iter()
                .map(|(k, v)| (k.to_string(), v.iter().map(|s| s.to_string()).collect()))
                .collect(),
        };
        let users = [
            user(&["a,b"], None, &[]),
            user(&["a", "b"], None, &[]),
            user(&["a"], Some("b"), &[]),
            user(&["a"], None, &[("b", &[])]),
            user(&["a"], None, &[("b", &["c"])]),
            user(&["a"], None, &[("b", &["c", "d"])]),
            user(&["a"], None, &[("b", &["c"]), ("d", &[])]),
        ];
        let keys: std::collections::HashSet<_> =
            users.iter().map(|u| decision_key(u, &attrs)).collect();
        assert_eq!(keys.len(), users.len(), "every user has its own key");
        let review = access_review("n1", &users[5], &attrs).spec;
        assert_eq!(review.uid, None);
        assert_eq!(
            review.extra.expect("extra")["b"],
            ["c".to_owned(), "d".to_owned()]
        );
        let review = access_review("n1", &users[2], &attrs).spec;
        assert_eq!(review.uid.as_deref(), Some("b"));
        assert_eq!(review.extra, None);
        let resource = review.resource_attributes.expect("attributes");
        assert_eq!(resource.name.as_deref(), Some("n1"));
        assert_eq!(resource.subresource.as_deref(), Some("proxy"));
    }

    #[test]
    fn the_cache_expires_and_stays_bounded() {
        let c: Cache<u32> = Cache::new();
        let k = key(&["a", "b"]);
        assert_ne!(k, key(&["ab"]), "parts are kept apart");
        c.put(k, 7, Duration::from_secs(60));
        assert_eq!(c.get(&k), Some(7));
        c.put(k, 8, Duration::ZERO);
        assert_eq!(c.get(&k), None, "expired");
        for i in 0..CACHE_ENTRIES + 10 {
            c.put(key(&[&i.to_string()]), 1, Duration::from_secs(60));
        }
        assert!(c.0.lock().unwrap().len() <= CACHE_ENTRIES);
    }
}
