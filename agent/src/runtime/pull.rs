//! Image pulls with credentials, as the kubelet pulls: the credentials of the pod's pull secrets
//! that match the image, then the node's ([`crate::credentials`]), each tried in turn until one
//! pull succeeds; anonymously only when no credential matches the image.
use super::*;
use crate::credentials::{self, Auth, Keyring};
use k8s_openapi::api::core::v1::Secret;

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

impl Manager {
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

    /// Pulls `image` for pod `pod` (`name`): with each matching credential in turn until one
    /// succeeds, or anonymously when none matches. Returns the image's reference.
    pub(super) async fn pull(
        &self,
        pod: &Pod,
        name: &str,
        image: &str,
    ) -> Result<String, PullError> {
        let creds = self.pull_credentials(pod, name, image).await?;
        if creds.is_empty() {
            return self
                .cri
                .pull_image(image, None)
                .await
                .map_err(PullError::Cri);
        }
        tracing::debug!(pod = %name, image = %image, credentials = creds.len(), "pulling with credentials");
        let mut errors = Vec::with_capacity(creds.len());
        for auth in creds {
            let auth = api::AuthConfig {
                username: auth.username,
                password: auth.password,
                ..Default::default()
            };
            match self.cri.pull_image(image, Some(auth)).await {
                Ok(image_ref) => return Ok(image_ref),
                Err(e) => errors.push(e),
            }
        }
        Err(PullError::EachCredential(errors))
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
