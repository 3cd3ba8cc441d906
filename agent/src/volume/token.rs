//! Service account tokens for projected `serviceAccountToken` sources, as the kubelet's token
//! manager keeps them: one TokenRequest per (service account, audience, expiration, pod), bound
//! to the pod, cached, and requested again once 80% of its lifetime or 24 hours have passed
//! (less a jitter of up to 10 s). A refresh that fails while the cached token is still valid
//! keeps the cached one.
use crate::api_objects::ApiObjects;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::Pod;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// Why no token could be had for a pod's service account.
#[derive(Debug, thiserror::Error)]
#[error("failed to fetch token for service account {service_account:?}: {source}")]
pub struct Error {
    pub service_account: String,
    pub source: RequestError,
}

/// Why a TokenRequest gave no token.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error(transparent)]
    Api(#[from] crate::api_objects::Error),
    #[error("the TokenRequest answer has no status")]
    NoStatus,
}

const MAX_TTL: Duration = Duration::from_secs(24 * 3600);
const MAX_JITTER_SECS: f64 = 10.0;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    namespace: String,
    service_account: String,
    audience: String,
    expiration_seconds: i64,
    pod_uid: String,
}

#[derive(Debug, Clone)]
struct Cached {
    token: String,
    expires: SystemTime,
    expiration_seconds: i64,
}

/// The token cache; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Tokens {
    cache: Arc<Mutex<HashMap<Key, Cached>>>,
}

/// Whether a token issued for `expiration_seconds` and expiring at `expires` must be requested
/// again at `now` (`jitter` in [0, 10 s)): past 24 h since its issue, or within the last 20% of
/// its lifetime.
pub fn requires_refresh(
    now: SystemTime,
    expires: SystemTime,
    expiration_seconds: i64,
    jitter: Duration,
) -> bool {
    let ttl = Duration::from_secs(u64::try_from(expiration_seconds).unwrap_or(0));
    let issued = expires.checked_sub(ttl).unwrap_or(SystemTime::UNIX_EPOCH);
    if now > issued + MAX_TTL.saturating_sub(jitter) {
        return true;
    }
    let fifth = ttl / 5;
    let edge = expires
        .checked_sub(fifth + jitter)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    now > edge
}

impl Tokens {
    /// A token for the pod's service account (`serviceAccountName`, else the deprecated
    /// `serviceAccount`, else `default`, which the API server's admission would have set).
    pub async fn get(
        &self,
        api: &ApiObjects,
        pod: &Pod,
        audience: &str,
        expiration_seconds: i64,
    ) -> Result<String, Error> {
        let namespace = pod.metadata.namespace.clone().unwrap_or("default".into());
        let spec = pod.spec.as_ref();
        let service_account = spec
            .and_then(|s| s.service_account_name.clone())
            .filter(|s| !s.is_empty())
            .or_else(|| spec.and_then(|s| s.service_account.clone()))
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "default".into());
        let key = Key {
            namespace,
            service_account,
            audience: audience.to_owned(),
            expiration_seconds,
            pod_uid: pod.metadata.uid.clone().unwrap_or_default(),
        };
        let now = SystemTime::now();
        let jitter = Duration::from_secs_f64(fastrand::f64() * MAX_JITTER_SECS);
        let cached = self.lock().get(&key).cloned();
        if let Some(c) = &cached
            && !requires_refresh(now, c.expires, c.expiration_seconds, jitter)
        {
            return Ok(c.token.clone());
        }
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: if audience.is_empty() {
                    Vec::new()
                } else {
                    vec![audience.to_owned()]
                },
                expiration_seconds: Some(expiration_seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: pod.metadata.name.clone(),
                    uid: pod.metadata.uid.clone(),
                }),
            },
            ..Default::default()
        };
        let answer = api
            .create_token(&key.namespace, &key.service_account, &request)
            .await;
        let fresh = answer.map_err(RequestError::Api).and_then(|t| {
            let status = t.status.ok_or(RequestError::NoStatus)?;
            let expires = SystemTime::UNIX_EPOCH
                + Duration::from_secs(
                    u64::try_from(status.expiration_timestamp.0.as_second()).unwrap_or(0),
                );
            Ok(Cached {
                token: status.token,
                expires,
                expiration_seconds: t.spec.expiration_seconds.unwrap_or(expiration_seconds),
            })
        });
        match (fresh, cached) {
            (Ok(c), _) => {
                tracing::info!(namespace = %key.namespace, service_account = %key.service_account, audience, "service account token requested");
                self.lock().insert(key, c.clone());
                Ok(c.token)
            }
            (Err(e), Some(c)) if c.expires > now => {
                tracing::warn!(service_account = %key.service_account, error = %e, "refreshing a service account token failed: the cached one is still valid");
                Ok(c.token)
            }
            (Err(source), _) => Err(Error {
                service_account: key.service_account,
                source,
            }),
        }
    }

    /// Forgets the tokens of pod `uid` (it is gone).
    pub fn forget(&self, uid: &str) {
        self.lock().retain(|k, _| k.pod_uid != uid);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Cached>> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_refreshed_at_80_percent_of_its_life_or_after_24_hours() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let hour = 3600;
        let expires = t0 + Duration::from_secs(hour);
        let at = |s: u64| t0 + Duration::from_secs(s);
        let none = Duration::ZERO;
        assert!(!requires_refresh(at(0), expires, hour as i64, none));
        assert!(!requires_refresh(at(2879), expires, hour as i64, none));
        assert!(requires_refresh(at(2881), expires, hour as i64, none));
        // The jitter moves the edge earlier by up to 10 s.
        assert!(requires_refresh(
            at(2875),
            expires,
            hour as i64,
            Duration::from_secs(9)
        ));
        // A 48 h token: refreshed at 24 h, before 80%.
        let long = 48 * hour;
        let expires = t0 + Duration::from_secs(long);
        assert!(!requires_refresh(
            at(24 * hour - 1),
            expires,
            long as i64,
            none
        ));
        assert!(requires_refresh(
            at(24 * hour + 1),
            expires,
            long as i64,
            none
        ));
    }
}
