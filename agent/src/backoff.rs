//! Per-key exponential back-off (crash loops, image pulls), as the kubelet's flow-control back-off:
//! a key has a current delay and the time it was last bumped. Pure: every call takes "now" and the
//! event time in wall-clock nanoseconds (the CRI's clock), so it is tested without sleeping.
use std::collections::HashMap;
use std::time::Duration;

/// Now, in wall-clock nanoseconds since the Unix epoch (the CRI's clock), for the callers' "now".
pub fn now_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or_default()
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    delay: Duration,
    last_update: i64,
}

#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    entries: HashMap<String, Entry>,
}

fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            entries: HashMap::new(),
        }
    }

    /// An entry untouched for more than twice the maximum delay is forgotten (the kubelet's rule:
    /// with a 300 s cap, ten minutes without a failure reset the back-off).
    fn expired(&self, event: i64, e: &Entry) -> bool {
        event.saturating_sub(e.last_update) > nanos(self.max.saturating_mul(2))
    }

    /// When `key` is still backing off from an event at `event` (for a crash: the container's
    /// finish time): the time left.
    pub fn remaining(&self, key: &str, event: i64, now: i64) -> Option<Duration> {
        let e = self.entries.get(key)?;
        if self.expired(event, e) {
            return None;
        }
        let since = now.saturating_sub(event).max(0);
        let left = nanos(e.delay).saturating_sub(since);
        (left > 0).then(|| Duration::from_nanos(left.unsigned_abs()))
    }

    /// When `key` failed less than its delay before `now` (image pulls: counted from the last
    /// failure itself): the time left.
    pub fn remaining_since_update(&self, key: &str, now: i64) -> Option<Duration> {
        let e = self.entries.get(key)?;
        self.remaining(key, e.last_update, now)
    }

    /// Forgets `key` (it succeeded).
    pub fn forget(&mut self, key: &str) {
        self.entries.remove(key);
    }

    /// Records one more failure of `key` (event time `event`, now `now`): the first sets the initial
    /// delay, each later one doubles it up to the maximum. Returns the new delay.
    pub fn next(&mut self, key: &str, event: i64, now: i64) -> Duration {
        let fresh = match self.entries.get(key) {
            None => true,
            Some(e) => self.expired(event, e),
        };
        let delay = if fresh {
            self.initial
        } else {
            self.entries
                .get(key)
                .map_or(self.initial, |e| e.delay.saturating_mul(2).min(self.max))
        };
        self.entries.insert(
            key.to_owned(),
            Entry {
                delay,
                last_update: now,
            },
        );
        delay
    }

    /// The current delay of `key` (for messages), if it has one.
    pub fn delay(&self, key: &str) -> Option<Duration> {
        self.entries.get(key).map(|e| e.delay)
    }

    /// Forgets every key starting with `prefix` (a pod's keys when it is gone).
    pub fn forget_prefix(&mut self, prefix: &str) {
        self.entries.retain(|k, _| !k.starts_with(prefix));
    }

    /// Forgets entries untouched for more than twice the maximum delay.
    pub fn gc(&mut self, now: i64) {
        let horizon = nanos(self.max.saturating_mul(2));
        self.entries
            .retain(|_, e| now.saturating_sub(e.last_update) <= horizon);
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000_000;

    fn crash() -> Backoff {
        Backoff::new(Duration::from_secs(10), Duration::from_secs(300))
    }

    #[test]
    fn unknown_key_is_not_backing_off() {
        assert_eq!(crash().remaining("k", 0, 5 * S), None);
    }

    #[test]
    fn doubles_from_ten_seconds_to_the_cap() {
        let mut b = crash();
        let mut t = 1000 * S;
        let mut seen = Vec::new();
        for _ in 0..8 {
            // The container crashes at t; the back-off is bumped when it is restarted.
            let d = b.next("k", t, t);
            seen.push(d.as_secs());
            t += d.as_secs() as i64 * S + S;
        }
        assert_eq!(seen, [10, 20, 40, 80, 160, 300, 300, 300]);
    }

    #[test]
    fn remaining_counts_from_the_event() {
        let mut b = crash();
        b.next("k", 0, 0);
        b.next("k", 5 * S, 5 * S); // 20 s now
        // Crashed at 100 s, asked at 104 s: 16 s left; at 120 s: none.
        assert_eq!(
            b.remaining("k", 100 * S, 104 * S),
            Some(Duration::from_secs(16))
        );
        assert_eq!(b.remaining("k", 100 * S, 120 * S), None);
    }

    #[test]
    fn ten_minutes_without_failure_resets() {
        let mut b = crash();
        let mut t = 0;
        for _ in 0..6 {
            b.next("k", t, t);
            t += 400 * S;
        }
        // 400 s between failures is under the 600 s reset horizon: it keeps growing.
        assert_eq!(b.delay("k"), Some(Duration::from_secs(300)));
        let mut b = crash();
        b.next("k", 0, 0);
        b.next("k", 100 * S, 100 * S);
        assert_eq!(b.delay("k"), Some(Duration::from_secs(20)));
        // It ran for more than 10 minutes after the last restart, then crashed.
        assert_eq!(b.remaining("k", 701 * S, 702 * S), None);
        assert_eq!(b.next("k", 701 * S, 702 * S), Duration::from_secs(10));
    }

    #[test]
    fn gc_and_forget() {
        let mut b = crash();
        b.next("uid1_a", 0, 0);
        b.next("uid2_a", 500 * S, 500 * S);
        b.gc(700 * S);
        assert_eq!(b.len(), 1);
        b.forget_prefix("uid2_");
        assert!(b.is_empty());
    }
}
