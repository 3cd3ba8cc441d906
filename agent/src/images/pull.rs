//! Image pulls with credentials, as the kubelet pulls: the credentials of the pod's pull secrets
//! that match the image, then the node's ([`crate::credentials`]), each tried in turn until one
//! pull succeeds; anonymously only when no credential matches the image.
use super::Images;
use crate::credentials::{self, Auth, Keyring};
use crate::cri;
use k8s_cri::v1 as api;
use k8s_openapi::api::core::v1::{Container, Pod, Secret};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Pulls begun before the sandbox existed ([`Images::prefetch`]), by image: each is
/// awaited by the first container that pulls its image.
#[derive(Debug, Default)]
pub struct Prefetched(Mutex<HashMap<String, PrefetchHandle>>);

/// A prefetch's task: `None` when it could not tell (the container's start looks itself).
type PrefetchHandle = tokio::task::JoinHandle<Option<Prefetch>>;

/// What a prefetch found.
#[derive(Debug)]
pub(super) enum Prefetch {
    /// The image is present (a policy other than `Always`): its status.
    Present(api::Image),
    /// It pulled the image: the reference, or why not.
    Pulled(Result<String, PullError>),
}

impl Prefetched {
    /// The pull of `image` begun for this sync, if one was (taken: awaited once).
    pub(super) fn take(&self, image: &str) -> Option<PrefetchHandle> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(image)
    }
}

/// A container's image pull policy (default `IfNotPresent`).
pub fn image_pull_policy(c: &Container) -> &str {
    c.image_pull_policy.as_deref().unwrap_or("IfNotPresent")
}

/// Why a pull failed.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    /// The anonymous pull (no credential matched the image) failed.
    #[error(transparent)]
    Cri(cri::Error),
    /// The pull failed with every matching credential: the runtime's error for each, in order.
    #[error("{}", each_credential(.0))]
    EachCredential(Vec<cri::Error>),
    /// A pull secret could not be read as a docker config.
    #[error(transparent)]
    Secret(#[from] credentials::Error),
    /// The pull of the same image another pod started, which this one waited for, failed.
    #[error("{0}")]
    Joined(String),
}

fn each_credential(errors: &[cri::Error]) -> String {
    match errors {
        [one] => one.to_string(),
        _ => {
            let all: Vec<String> = errors.iter().map(ToString::to_string).collect();
            format!(
                "with each of {} credentials: [{}]",
                errors.len(),
                all.join("; ")
            )
        }
    }
}

impl Images {
    /// The pod's pull secrets that could be read. A secret that cannot be (missing, no API
    /// server) is logged and skipped: the pull may still succeed without it.
    async fn pull_secrets(&self, pod: &Pod, name: &str) -> Vec<Secret> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let refs = pod
            .spec
            .as_ref()
            .and_then(|s| s.image_pull_secrets.as_ref());
        let mut secrets = Vec::new();
        for r in refs.into_iter().flatten().filter(|r| !r.name.is_empty()) {
            match self.api.secret(namespace, &r.name).await {
                Ok(s) => secrets.push(s),
                Err(e) => tracing::warn!(
                    pod = %name, secret = %r.name, error = %e,
                    "unable to retrieve pull secret, the image pull may not succeed"
                ),
            }
        }
        secrets
    }

    /// Every credential for `image`, in the order they are tried: the pod's secrets', then the
    /// node's.
    async fn pull_credentials(
        &self,
        pod: &Pod,
        name: &str,
        image: &str,
    ) -> Result<Vec<Auth>, credentials::Error> {
        let repository = credentials::repository(image);
        let secrets = self.pull_secrets(pod, name).await;
        let mut found = Keyring::from_secrets(&secrets)?.lookup(&repository);
        let node = self.node_credentials.clone();
        let node = tokio::task::spawn_blocking(move || node.read())
            .await
            .unwrap_or_default();
        found.extend(node.lookup(&repository));
        Ok(found)
    }

    /// Begins, each on a task of its own, the pulls the pod's containers (`containers`, in start
    /// order) will need, so that they run while the sandbox is created (the kubelet pulls only
    /// after the sandbox, one container at a time). A container's own start awaits its image's
    /// pull (or the image status it read) instead of pulling ([`Self::ensure`]), so the
    /// pull policy and the back-off are applied there exactly as without this. An image is begun
    /// here only when the container would pull it: not for `Never`, not when present (unless
    /// `Always`), not while its pull backs off.
    pub fn prefetch(
        &self,
        pod: &Pod,
        name: &str,
        uid: &str,
        containers: &[&Container],
    ) -> Prefetched {
        let mut handles = HashMap::new();
        let mut shared_pod: Option<Arc<Pod>> = None;
        for c in containers {
            let image = c.image.clone().unwrap_or_default();
            let policy = image_pull_policy(c);
            if image.is_empty() || policy == "Never" || handles.contains_key(&image) {
                continue;
            }
            if self.backoff_left(uid, &image).is_some() {
                continue;
            }
            let pod = shared_pod
                .get_or_insert_with(|| Arc::new(pod.clone()))
                .clone();
            let (this, name, always) = (self.clone(), name.to_owned(), policy == "Always");
            let img = image.clone();
            let handle = tokio::spawn(async move {
                if !always {
                    match this.cri.image_status(&img).await {
                        Ok(Some(found)) => return Some(Prefetch::Present(found)),
                        Ok(None) => {}
                        // Left to the container's own start, which reports it.
                        Err(_) => return None,
                    }
                }
                Some(Prefetch::Pulled(this.pull(&pod, &name, &img).await))
            });
            handles.insert(image, handle);
        }
        Prefetched(Mutex::new(handles))
    }

    /// Pulls `image` for pod `pod` (`name`): with each matching credential in turn until one
    /// succeeds, or anonymously when none matches. Returns the image's reference. While a pull of
    /// the same image with the same credentials is under way (another pod's), waits for that
    /// one instead ([`super::pulls`]).
    pub(super) async fn pull(
        &self,
        pod: &Pod,
        name: &str,
        image: &str,
    ) -> Result<String, PullError> {
        let creds = self.pull_credentials(pod, name, image).await?;
        let key = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            for c in &creds {
                (&c.username, &c.password).hash(&mut h);
            }
            format!("{image} {:x}", h.finish())
        };
        let pull = async {
            if creds.is_empty() {
                return self
                    .cri
                    .pull_image(image, None)
                    .await
                    .map_err(PullError::Cri);
            }
            tracing::debug!(pod = %name, image = %image, credentials = creds.len(), "pulling with credentials");
            let mut errors = Vec::with_capacity(creds.len());
            for auth in &creds {
                let auth = api::AuthConfig {
                    username: auth.username.clone(),
                    password: auth.password.clone(),
                    ..Default::default()
                };
                match self.cri.pull_image(image, Some(auth)).await {
                    Ok(image_ref) => return Ok(image_ref),
                    Err(e) => errors.push(e),
                }
            }
            Err(PullError::EachCredential(errors))
        };
        match self.pulls.run(&key, pull).await {
            super::pulls::Outcome::Pulled(result) => result,
            super::pulls::Outcome::Joined(result) => {
                tracing::debug!(pod = %name, image = %image, "waited for another pod's pull of the image");
                result.map_err(PullError::Joined)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(n: u32) -> cri::Error {
        cri::Error::Call {
            method: "PullImage",
            status: tonic::Status::unknown(format!("401 Unauthorized ({n})")),
        }
    }

    #[test]
    fn a_pull_failing_with_every_credential_reports_each_error() {
        let one = PullError::EachCredential(vec![refused(1)]).to_string();
        assert!(
            one.starts_with("CRI PullImage:") && one.contains("(1)"),
            "{one}"
        );
        let two = PullError::EachCredential(vec![refused(1), refused(2)]).to_string();
        assert!(two.starts_with("with each of 2 credentials: ["), "{two}");
        assert!(two.contains("(1)") && two.contains("(2)"), "{two}");
    }
}
