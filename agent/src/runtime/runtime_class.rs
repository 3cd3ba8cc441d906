//! `spec.runtimeClassName`: the RuntimeClass of that name, read from the API server, names the
//! CRI runtime handler the pod's sandbox runs with (`RunPodSandboxRequest.runtime_handler`), as
//! the kubelet's runtimeclass manager resolves it.
//!
//! - No name (or an empty one): the runtime's default handler (`""`).
//! - A class that does not exist, or no API server to ask: an error naming the class; the pod's
//!   sandbox is not created, and the pod's worker retries with its error back-off until the class
//!   appears.
//! - The kubelet reads classes through an informer; swiftlet asks the API server and keeps each
//!   answer (found or not found) for [`LOOKUP_TTL`], so pods starting together cost one request
//!   per class, and a class created or changed is seen within that time.
//! - The handler is looked up only when a sandbox is created: a class whose handler changes
//!   leaves running pods as they are (their next sandbox, if any, gets the new handler).
use crate::api_objects::{self, ApiObjects};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long an answer of the API server about a class is used before asking again.
pub const LOOKUP_TTL: Duration = Duration::from_secs(5);

/// The handler of a class, or `None`: the class does not exist.
type Answer = Option<String>;

/// Answers of the API server by class name, each with when it was read.
#[derive(Debug, Default)]
struct Cache {
    entries: HashMap<String, (Instant, Answer)>,
}

impl Cache {
    /// The answer for `name` read within `ttl` before `now`.
    fn get(&self, name: &str, now: Instant, ttl: Duration) -> Option<Answer> {
        let (at, answer) = self.entries.get(name)?;
        (now.saturating_duration_since(*at) < ttl).then(|| answer.clone())
    }

    /// Records an answer and drops every entry older than `ttl` (the map holds at most the
    /// classes asked about within `ttl`).
    fn put(&mut self, name: &str, answer: Answer, now: Instant, ttl: Duration) {
        self.entries
            .retain(|_, (at, _)| now.saturating_duration_since(*at) < ttl);
        self.entries.insert(name.to_owned(), (now, answer));
    }
}

/// Resolves RuntimeClass names to CRI runtime handlers; cheap to clone (clones share the cache).
#[derive(Clone, Debug, Default)]
pub struct RuntimeClasses {
    objects: ApiObjects,
    cache: Arc<Mutex<Cache>>,
}

impl RuntimeClasses {
    pub fn new(objects: ApiObjects) -> Self {
        Self {
            objects,
            cache: Arc::default(),
        }
    }

    /// The runtime handler for `runtime_class_name`: `""` (the runtime's default) for none.
    pub async fn handler(
        &self,
        runtime_class_name: Option<&str>,
    ) -> Result<String, api_objects::Error> {
        let Some(name) = runtime_class_name.filter(|n| !n.is_empty()) else {
            return Ok(String::new());
        };
        let cached = self.cache.lock().unwrap_or_else(|p| p.into_inner()).get(
            name,
            Instant::now(),
            LOOKUP_TTL,
        );
        let answer = match cached {
            Some(answer) => answer,
            None => {
                let answer = match self.objects.runtime_class(name).await {
                    Ok(class) => Some(class.handler),
                    Err(e) if e.is_not_found() => None,
                    // Not an answer about the class (no API server, a failed request): not kept.
                    Err(e) => return Err(e),
                };
                self.cache.lock().unwrap_or_else(|p| p.into_inner()).put(
                    name,
                    answer.clone(),
                    Instant::now(),
                    LOOKUP_TTL,
                );
                answer
            }
        };
        answer.ok_or_else(|| api_objects::Error::NotFound {
            kind: "RuntimeClass",
            name: name.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn no_class_is_the_default_handler_and_a_named_one_needs_an_api_server() {
        let classes = RuntimeClasses::new(ApiObjects::new(None));
        assert_eq!(classes.handler(None).await.unwrap(), "");
        assert_eq!(classes.handler(Some("")).await.unwrap(), "");
        let e = classes.handler(Some("gvisor")).await.unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("RuntimeClass \"gvisor\"") && msg.contains("--kubeconfig"),
            "{msg}"
        );
        // A failed lookup is not kept as an answer.
        assert!(classes.cache.lock().unwrap().entries.is_empty());
    }

    #[tokio::test]
    async fn a_cached_answer_is_used_until_it_expires() {
        let classes = RuntimeClasses::new(ApiObjects::new(None));
        let now = Instant::now();
        {
            let mut c = classes.cache.lock().unwrap();
            c.put("kata", Some("kata-qemu".into()), now, LOOKUP_TTL);
            c.put("gone", None, now, LOOKUP_TTL);
        }
        // Answered from the cache: no API server is needed.
        assert_eq!(classes.handler(Some("kata")).await.unwrap(), "kata-qemu");
        let e = classes.handler(Some("gone")).await.unwrap_err();
        assert!(e.is_not_found(), "{e}");
        assert_eq!(e.to_string(), "RuntimeClass \"gone\" not found");

        let c = classes.cache.lock().unwrap();
        let later = now + LOOKUP_TTL;
        assert_eq!(
            c.get("kata", now + LOOKUP_TTL / 2, LOOKUP_TTL),
            Some(Some("kata-qemu".into()))
        );
        assert_eq!(c.get("kata", later, LOOKUP_TTL), None, "expired");
        assert_eq!(c.get("gone", now, LOOKUP_TTL), Some(None));
        drop(c);
        // Putting a new answer drops the expired ones.
        let mut c = classes.cache.lock().unwrap();
        c.put("new", Some("runc".into()), later, LOOKUP_TTL);
        let mut names: Vec<_> = c.entries.keys().cloned().collect();
        names.sort();
        assert_eq!(names, ["new"]);
    }
}
