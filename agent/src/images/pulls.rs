//! Image pulls shared between the pods of the node: one pull of an image (with one set of
//! credentials) at a time, which every pod asking for the same image meanwhile waits for instead
//! of pulling again, and at most `--max-parallel-image-pulls` pulls of distinct images at once
//! (one with `--serialize-image-pulls`, the kubelet's default; no limit by default here).
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{Semaphore, watch};

/// What a finished pull gives those that waited for it: the image reference, or why it failed.
type Shared = Option<Result<String, String>>;

/// The pulls under way, by key (the image and the credentials tried).
#[derive(Default)]
pub struct Pulls {
    /// Pulls of distinct images at once; `None`: no limit.
    limit: Option<Arc<Semaphore>>,
    in_flight: Arc<Mutex<HashMap<String, watch::Receiver<Shared>>>>,
}

impl std::fmt::Debug for Pulls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pulls")
            .field("limit", &self.limit.as_ref().map(|s| s.available_permits()))
            .finish_non_exhaustive()
    }
}

/// Removes a leader's entry when its pull ends, or when it is dropped half-way (then those
/// waiting see the channel close and pull themselves).
struct Entry {
    in_flight: Arc<Mutex<HashMap<String, watch::Receiver<Shared>>>>,
    key: String,
}

impl Drop for Entry {
    fn drop(&mut self) {
        self.in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.key);
    }
}

/// How a caller took part in a pull.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome<E> {
    /// It pulled (it was the first to ask).
    Pulled(Result<String, E>),
    /// It waited for another caller's pull of the same key: the reference, or that pull's error.
    Joined(Result<String, String>),
}

impl Pulls {
    /// At most `max_parallel` pulls of distinct images at once (`None`: no limit).
    pub fn new(max_parallel: Option<usize>) -> Self {
        Self {
            limit: max_parallel.map(|n| Arc::new(Semaphore::new(n.max(1)))),
            in_flight: Arc::default(),
        }
    }

    /// Runs `pull` for `key`, unless a pull of the same key is under way: then waits for that one
    /// and answers its outcome. A pull waits for a free slot under the limit; one that waits for
    /// another's holds none.
    pub async fn run<F, E>(&self, key: &str, pull: F) -> Outcome<E>
    where
        F: Future<Output = Result<String, E>>,
        E: std::fmt::Display,
    {
        loop {
            // Either the pull under way to wait for, or this caller's own channel to lead with.
            let waiting_or_leading = {
                let mut map = self
                    .in_flight
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                if let Some(rx) = map.get(key) {
                    Ok(rx.clone())
                } else {
                    let (tx, rx) = watch::channel(None);
                    map.insert(key.to_owned(), rx);
                    Err(tx)
                }
            };
            match waiting_or_leading {
                Err(tx) => return Outcome::Pulled(self.lead(key, tx, pull).await),
                Ok(mut rx) => {
                    let done = rx
                        .wait_for(Option::is_some)
                        .await
                        .ok()
                        .and_then(|v| v.clone());
                    if let Some(result) = done {
                        return Outcome::Joined(result);
                    }
                    // The puller went away without an outcome: try again (perhaps as the
                    // puller).
                }
            }
        }
    }

    async fn lead<F, E>(&self, key: &str, tx: watch::Sender<Shared>, pull: F) -> Result<String, E>
    where
        F: Future<Output = Result<String, E>>,
        E: std::fmt::Display,
    {
        let _entry = Entry {
            in_flight: self.in_flight.clone(),
            key: key.to_owned(),
        };
        let _permit = match &self.limit {
            Some(limit) => limit.clone().acquire_owned().await.ok(),
            None => None,
        };
        let result = pull.await;
        let shared = match &result {
            Ok(reference) => Ok(reference.clone()),
            Err(e) => Err(e.to_string()),
        };
        tx.send_replace(Some(shared));
        result
    }

    /// Pulls under way now.
    pub fn in_flight(&self) -> usize {
        self.in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    /// A pull that takes `ms`, counting the pulls running at once and the most seen.
    async fn slow(
        ms: u64,
        running: &AtomicUsize,
        most: &AtomicUsize,
        result: Result<&str, &str>,
    ) -> Result<String, String> {
        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
        most.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        running.fetch_sub(1, Ordering::SeqCst);
        result.map(str::to_owned).map_err(str::to_owned)
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_requests_for_one_image_wait_for_one_pull() {
        let pulls = Pulls::new(None);
        let (running, most, calls) = (
            AtomicUsize::new(0),
            AtomicUsize::new(0),
            AtomicUsize::new(0),
        );
        let (running, most, calls) = (&running, &most, &calls);
        let pulls = &pulls;
        let ask = |r: Result<&'static str, &'static str>| {
            pulls.run("busybox", async move {
                calls.fetch_add(1, Ordering::SeqCst);
                slow(100, running, most, r).await
            })
        };
        let (a, b, c) = tokio::join!(ask(Ok("sha256:1")), ask(Ok("x")), ask(Ok("y")));
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "one pull for three requests"
        );
        assert_eq!(a, Outcome::Pulled(Ok("sha256:1".to_owned())));
        assert_eq!(b, Outcome::Joined(Ok("sha256:1".to_owned())));
        assert_eq!(c, Outcome::Joined(Ok("sha256:1".to_owned())));
        assert_eq!(pulls.in_flight(), 0);
        // A failure reaches those that waited, and the next request pulls again.
        let (a, b) = tokio::join!(ask(Err("denied")), ask(Ok("z")));
        assert_eq!(a, Outcome::Pulled(Err("denied".to_owned())));
        assert_eq!(b, Outcome::Joined(Err("denied".to_owned())));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        assert!(matches!(ask(Ok("w")).await, Outcome::Pulled(Ok(_))));
    }

    #[tokio::test(start_paused = true)]
    async fn distinct_images_pull_in_parallel_up_to_the_limit() {
        for (limit, expected) in [(None, 4), (Some(2), 2), (Some(1), 1)] {
            let pulls = Pulls::new(limit);
            let (running, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
            let ask = |image: &'static str| pulls.run(image, slow(100, &running, &most, Ok("ref")));
            let started = tokio::time::Instant::now();
            let _ = tokio::join!(ask("a"), ask("b"), ask("c"), ask("d"));
            assert_eq!(most.load(Ordering::SeqCst), expected, "limit {limit:?}");
            let rounds = 4 / expected as u32;
            assert_eq!(started.elapsed(), Duration::from_millis(100) * rounds);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_puller_dropped_half_way_leaves_the_waiting_one_to_pull() {
        let pulls = Pulls::new(None);
        let (running, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let first = pulls.run("img", slow(1000, &running, &most, Ok("never")));
        let second = async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            pulls
                .run("img", slow(100, &running, &most, Ok("second")))
                .await
        };
        // The first pull is abandoned (its future dropped) after 50 ms.
        let (_, b) = tokio::join!(
            tokio::time::timeout(Duration::from_millis(50), first),
            second
        );
        assert_eq!(b, Outcome::Pulled(Ok("second".to_owned())));
        assert_eq!(pulls.in_flight(), 0);
    }
}
