//! The work queue: when each pod is next due for a sync nobody asked for (the kubelet's
//! `queue.WorkQueue`).
//!
//! Pod workers `enqueue` a UID with a delay when they finish a piece of work (a jittered resync
//! after success, a jittered back-off after an error); the sync loop's 1 s tick takes every UID
//! whose time has come (`get_work`) and sends those pods a Sync. One timer for all pods instead of
//! one per worker. Enqueueing a UID again replaces its time, as in the kubelet.
//!
//! Times are `tokio::time::Instant`, so tests run it under paused time.
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::time::Instant;

/// The kubelet's default `syncFrequency`.
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(60);

/// Cheap to clone; every clone is the same queue.
#[derive(Clone, Debug)]
pub struct WorkQueue {
    due: Arc<Mutex<HashMap<String, Instant>>>,
    rng: Arc<AtomicU64>,
    /// The periodic resync of a healthy pod (`--sync-frequency`).
    resync: Duration,
}

impl Default for WorkQueue {
    fn default() -> Self {
        Self::new()
    }
}

impl WorkQueue {
    pub fn new() -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x9E37_79B9_7F4A_7C15);
        Self {
            due: Arc::default(),
            rng: Arc::new(AtomicU64::new(seed)),
            resync: DEFAULT_RESYNC,
        }
    }

    /// The same queue with another periodic resync.
    pub fn with_resync(mut self, resync: Duration) -> Self {
        self.resync = resync;
        self
    }

    /// The periodic resync of a healthy pod.
    pub fn resync(&self) -> Duration {
        self.resync
    }

    /// Makes `uid` due `delay` from now (replacing any earlier time).
    pub fn enqueue(&self, uid: &str, delay: Duration) {
        let at = Instant::now() + delay;
        let mut due = self.due.lock().unwrap_or_else(PoisonError::into_inner);
        match due.get_mut(uid) {
            Some(t) => *t = at,
            None => {
                due.insert(uid.to_owned(), at);
            }
        }
    }

    /// Removes and returns every UID whose time has come.
    pub fn get_work(&self) -> Vec<String> {
        let now = Instant::now();
        let mut due = self.due.lock().unwrap_or_else(PoisonError::into_inner);
        let ready: Vec<String> = due
            .iter()
            .filter(|(_, t)| **t <= now)
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in &ready {
            due.remove(uid);
        }
        ready
    }

    /// Forgets `uid` (its worker is gone).
    pub fn forget(&self, uid: &str) {
        self.due
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(uid);
    }

    /// When `uid` is due, if queued.
    pub fn due_at(&self, uid: &str) -> Option<Instant> {
        self.due
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(uid)
            .copied()
    }

    /// `d` plus a random 0..`factor`×`d` (the kubelet's `wait.Jitter`).
    pub fn jitter(&self, d: Duration, factor: f64) -> Duration {
        jitter(d, factor, self.next_unit())
    }

    /// A pseudo-random number in [0, 1) (splitmix64; spreading resyncs needs no more).
    fn next_unit(&self) -> f64 {
        let mut z = self
            .rng
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// `d + unit × factor × d`, `unit` in [0, 1).
pub fn jitter(d: Duration, factor: f64, unit: f64) -> Duration {
    d + d.mul_f64((factor * unit).clamp(0.0, f64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn hands_out_only_due_work_once() {
        let q = WorkQueue::new();
        q.enqueue("a", Duration::from_secs(1));
        q.enqueue("b", Duration::from_secs(3));
        assert!(q.get_work().is_empty());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(q.get_work(), vec!["a"]);
        assert!(q.get_work().is_empty(), "handed out once");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(q.get_work(), vec!["b"]);
    }

    #[tokio::test(start_paused = true)]
    async fn enqueue_replaces_the_time_and_forget_drops_it() {
        let q = WorkQueue::new();
        q.enqueue("a", Duration::from_secs(60));
        q.enqueue("a", Duration::from_secs(1));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(q.get_work(), vec!["a"]);
        q.enqueue("b", Duration::ZERO);
        q.forget("b");
        assert!(q.get_work().is_empty());
    }

    #[test]
    fn jitter_stays_within_its_band() {
        let q = WorkQueue::new();
        let d = Duration::from_secs(60);
        let mut seen_above = false;
        for _ in 0..1000 {
            let j = q.jitter(d, 0.5);
            assert!(j >= d && j < Duration::from_secs(90), "{j:?}");
            seen_above |= j > Duration::from_secs(61);
        }
        assert!(seen_above, "jitter never spread the delay");
        assert_eq!(jitter(d, 0.5, 0.0), d);
        assert_eq!(jitter(d, 0.5, 0.5), Duration::from_secs(75));
    }
}
