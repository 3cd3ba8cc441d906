//! The image manager: everything the node does with images, owned in one place.
//!
//! - [`Images`] gives a container its image as the kubelet's image puller does: by the
//!   container's pull policy, with the pod's pull secrets and the node's credentials
//!   ([`pull`]), one pull per image at a time shared by every pod ([`pulls`]), and a back-off
//!   per pod and image after a failed pull (10 s doubling to 300 s: ErrImagePull, then
//!   ImagePullBackOff). The runtime manager asks it for images and holds no pull state.
//! - [`gc`] removes unused images when the image file system fills (a task of its own).
use crate::backoff::{Backoff, now_nanos};
use crate::cri::{self, Cri};
use k8s_cri::v1 as api;
use k8s_openapi::api::core::v1::{Container, Pod};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

pub mod gc;
pub mod pull;
pub mod pulls;

pub use pull::{Prefetched, PullError, image_pull_policy};

/// The first delay after a failed pull, doubled at each failure up to [`PULL_BACKOFF_MAX`].
pub const PULL_BACKOFF_INITIAL: Duration = Duration::from_secs(10);
pub const PULL_BACKOFF_MAX: Duration = Duration::from_secs(300);

/// Why a container has no image to start from.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "pod {pod} container {container}: image {image:?} is not present and imagePullPolicy is Never"
    )]
    NeverPull {
        pod: String,
        container: String,
        image: String,
    },
    #[error(
        "pod {pod} container {container}: back-off pulling image {image:?} ({}s left)",
        left.as_secs()
    )]
    BackOff {
        pod: String,
        container: String,
        image: String,
        left: Duration,
    },
    #[error("pod {pod} container {container}: pulling image {image:?}: {source}")]
    Pull {
        pod: String,
        container: String,
        image: String,
        #[source]
        source: Box<PullError>,
    },
    /// The runtime could not say whether the image is present.
    #[error("pod {pod}: {source}")]
    Status {
        pod: String,
        #[source]
        source: cri::Error,
    },
}

impl Error {
    /// The waiting reason the status shows for a container without its image.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::NeverPull { .. } => "ErrImageNeverPull",
            Error::Pull { .. } => "ErrImagePull",
            Error::BackOff { .. } => "ImagePullBackOff",
            Error::Status { .. } => "CreateContainerError",
        }
    }

    /// When to look again, where the image manager knows better than the caller's default: at
    /// the end of a back-off, or soon after a failed pull (so the status shows the back-off that
    /// follows).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::BackOff { left, .. } => Some(*left),
            Error::Pull { .. } => Some(Duration::from_secs(1)),
            Error::NeverPull { .. } | Error::Status { .. } => None,
        }
    }
}

/// The user an image runs as when the pod does not say (CRI `ImageStatus`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageUser {
    /// A numeric user.
    pub uid: Option<i64>,
    /// A user name (when the image's user is not numeric).
    pub username: String,
}

impl ImageUser {
    /// From the runtime's image record.
    pub fn of(image: &api::Image) -> Self {
        ImageUser {
            uid: image.uid.as_ref().map(|u| u.value),
            username: image.username.clone(),
        }
    }
}

/// The container to give an image to, and the pod it belongs to.
#[derive(Clone, Copy)]
pub struct For<'a> {
    pub pod: &'a Pod,
    /// The pod's full name, for messages.
    pub name: &'a str,
    pub uid: &'a str,
    pub container: &'a Container,
}

/// The image manager's pull side (cheap to clone: every clone shares the pulls and back-offs).
#[derive(Clone)]
pub struct Images {
    cri: Cri,
    /// Where pods' image pull secrets are read.
    api: crate::api_objects::ApiObjects,
    /// The node's docker config files (pull credentials for every pod).
    node_credentials: crate::credentials::NodeFiles,
    /// The image pulls under way, shared by every pod (one pull per image at a time).
    pulls: Arc<pulls::Pulls>,
    /// Pull back-offs, keyed by pod UID and image.
    backoff: Arc<Mutex<Backoff>>,
}

impl Images {
    /// `max_parallel_pulls`: how many distinct images are pulled at once (`None`: no limit).
    pub fn new(
        cri: Cri,
        api: crate::api_objects::ApiObjects,
        node_credentials: crate::credentials::NodeFiles,
        max_parallel_pulls: Option<usize>,
    ) -> Self {
        Self {
            cri,
            api,
            node_credentials,
            pulls: Arc::new(pulls::Pulls::new(max_parallel_pulls)),
            backoff: Arc::new(Mutex::new(Backoff::new(
                PULL_BACKOFF_INITIAL,
                PULL_BACKOFF_MAX,
            ))),
        }
    }

    fn backoffs(&self) -> MutexGuard<'_, Backoff> {
        self.backoff.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What is left of the pull back-off of pod `uid`'s `image`, if it backs off.
    pub fn backoff_left(&self, uid: &str, image: &str) -> Option<Duration> {
        self.backoffs()
            .remaining_since_update(&backoff_key(uid, image), now_nanos())
    }

    /// Forgets pod `uid`'s pull back-offs (the pod is gone).
    pub fn forget_pod(&self, uid: &str) {
        self.backoffs().forget_prefix(&format!("{uid}_"));
    }

    /// Forgets back-off entries untouched for ten minutes (for housekeeping).
    pub fn gc_backoffs(&self) {
        self.backoffs().gc(now_nanos());
    }

    /// The image `image` of `target.container`, present in the runtime when this returns `Ok`:
    /// its reference and the user it runs as. By the pull policy: `Never` only looks, `Always`
    /// pulls, `IfNotPresent` (the default) pulls when the runtime lacks it. A pull begun with
    /// the sandbox ([`Self::prefetch`]) is awaited instead of pulling again. While the pod's
    /// pull of the image backs off, nothing is pulled.
    pub async fn ensure(
        &self,
        target: For<'_>,
        image: &str,
        prefetched: &Prefetched,
    ) -> Result<(String, ImageUser), Error> {
        let For {
            pod,
            name,
            uid,
            container,
        } = target;
        let policy = image_pull_policy(container);
        let status_err = |source| Error::Status {
            pod: name.to_owned(),
            source,
        };
        let pulled = match prefetched.take(image) {
            Some(handle) => match handle.await.ok().flatten() {
                Some(pull::Prefetch::Present(found)) => {
                    return Ok((found.id.clone(), ImageUser::of(&found)));
                }
                Some(pull::Prefetch::Pulled(res)) => Some(res),
                None => None,
            },
            None => None,
        };
        if policy != "Always" && pulled.is_none() {
            let found = self.cri.image_status(image).await.map_err(status_err)?;
            if let Some(found) = found {
                return Ok((found.id.clone(), ImageUser::of(&found)));
            }
        }
        if policy == "Never" {
            return Err(Error::NeverPull {
                pod: name.to_owned(),
                container: container.name.clone(),
                image: image.to_owned(),
            });
        }
        let key = backoff_key(uid, image);
        let began = now_nanos();
        if pulled.is_none()
            && let Some(left) = self.backoff_left(uid, image)
        {
            return Err(Error::BackOff {
                pod: name.to_owned(),
                container: container.name.clone(),
                image: image.to_owned(),
                left,
            });
        }
        // The pull begun while the sandbox was created, else one now.
        let res = match pulled {
            Some(res) => res,
            None => self.pull(pod, name, image).await,
        };
        let image_ref = match res {
            Ok(image_ref) => {
                self.backoffs().forget(&key);
                image_ref
            }
            Err(source) => {
                self.backoffs().next(&key, began, now_nanos());
                return Err(Error::Pull {
                    pod: name.to_owned(),
                    container: container.name.clone(),
                    image: image.to_owned(),
                    source: Box::new(source),
                });
            }
        };
        // Who the pulled image runs as (the pull does not say).
        let user = self
            .cri
            .image_status(image)
            .await
            .map_err(status_err)?
            .map(|i| ImageUser::of(&i))
            .unwrap_or_default();
        Ok((image_ref, user))
    }
}

/// The key of pod `uid`'s pull back-off for `image`: one back-off per pod and image, as the
/// kubelet keys it.
fn backoff_key(uid: &str, image: &str) -> String {
    format!("{uid}_{image}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    fn images() -> Images {
        let cri = Cri::new("unix:///nonexistent/cri.sock", Metrics::new()).expect("lazy client");
        Images::new(cri, Default::default(), Default::default(), None)
    }

    fn pod(policy: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u1"},
            "spec": {"containers": [{"name": "c", "image": "img:1", "imagePullPolicy": policy}]}
        }))
        .expect("pod")
    }

    async fn ensure(images: &Images, pod: &Pod, uid: &str) -> Error {
        let target = For {
            pod,
            name: "ns/web",
            uid,
            container: &pod.spec.as_ref().expect("spec").containers[0],
        };
        images
            .ensure(target, "img:1", &Prefetched::default())
            .await
            .expect_err("no runtime to pull from")
    }

    #[tokio::test]
    async fn a_failed_pull_backs_off_per_pod_until_the_pod_is_forgotten() {
        let images = images();
        let always = pod("Always");
        // No runtime: the pull fails and starts the pod's back-off for the image.
        let first = ensure(&images, &always, "u1").await;
        assert_eq!(first.reason(), "ErrImagePull", "{first}");
        assert_eq!(first.retry_after(), Some(Duration::from_secs(1)));
        let second = ensure(&images, &always, "u1").await;
        assert_eq!(second.reason(), "ImagePullBackOff", "{second}");
        let left = second.retry_after().expect("a back-off has an end");
        assert!(
            left > Duration::from_secs(8) && left <= PULL_BACKOFF_INITIAL,
            "{left:?}"
        );
        // Another pod pulling the same image does not inherit the back-off.
        assert_eq!(
            ensure(&images, &always, "u2").await.reason(),
            "ErrImagePull"
        );
        images.forget_pod("u1");
        assert_eq!(
            ensure(&images, &always, "u1").await.reason(),
            "ErrImagePull"
        );
    }

    #[tokio::test]
    async fn never_and_if_not_present_ask_the_runtime_first() {
        let images = images();
        // The image's status cannot be read: no pull is tried, whatever the policy.
        for policy in ["Never", "IfNotPresent"] {
            let e = ensure(&images, &pod(policy), "u1").await;
            assert!(matches!(e, Error::Status { .. }), "{policy}: {e}");
            assert_eq!(e.retry_after(), None);
        }
        assert_eq!(images.backoff_left("u1", "img:1"), None);
    }
}
