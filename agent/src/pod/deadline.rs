//! `spec.activeDeadlineSeconds`: how long a pod may be active on the node, counted from its
//! `status.startTime`, before it fails with reason `DeadlineExceeded` (the kubelet's active
//! deadline handler). Pure arithmetic: the status and the pod worker decide what to do with it.
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use std::time::Duration;

/// The pod status reason of a pod that outlived its active deadline (the kubelet's).
pub const REASON: &str = "DeadlineExceeded";
/// The pod status message that goes with [`REASON`] (the kubelet's).
pub const MESSAGE: &str = "Pod was active on the node longer than the specified deadline";
/// The API's range of `spec.activeDeadlineSeconds`.
pub const MIN_SECONDS: i64 = 1;
pub const MAX_SECONDS: i64 = i32::MAX as i64;

/// Where a pod stands against its active deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deadline {
    /// The pod sets no `activeDeadlineSeconds`.
    Unset,
    /// The pod has no start time yet, so its deadline is not counting (the kubelet's
    /// `StartTime.IsZero()`).
    NotStarted,
    /// The deadline passes this long from now.
    In(Duration),
    /// `startTime + activeDeadlineSeconds` is now or has passed.
    Exceeded,
}

/// The pod's `spec.activeDeadlineSeconds`, when set.
pub fn seconds(pod: &Pod) -> Option<i64> {
    pod.spec.as_ref()?.active_deadline_seconds
}

/// Where `pod`, started at `start`, stands against its deadline at `now`. Exceeded once the
/// time since the start is at least the allowed duration, as the kubelet compares them; a value
/// below [`MIN_SECONDS`], which the API (and the manifest check) never lets through, counts as
/// exceeded, as the kubelet's arithmetic makes it.
pub fn check(pod: &Pod, start: Option<Timestamp>, now: Timestamp) -> Deadline {
    let Some(allowed) = seconds(pod) else {
        return Deadline::Unset;
    };
    let Some(start) = start else {
        return Deadline::NotStarted;
    };
    let allowed_ns = i128::from(allowed.max(0)) * 1_000_000_000;
    let elapsed_ns = now.as_nanosecond() - start.as_nanosecond();
    let left_ns = allowed_ns - elapsed_ns;
    if allowed < MIN_SECONDS || left_ns <= 0 {
        return Deadline::Exceeded;
    }
    // At most i32::MAX seconds plus the time a start lies in the future: fits u64 nanoseconds
    // for any clock this side of the year 2500.
    Deadline::In(Duration::from_nanos(
        u64::try_from(left_ns).unwrap_or(u64::MAX),
    ))
}

/// Why `value` is not an acceptable `activeDeadlineSeconds` (the API's validation), if it is not.
pub fn invalid(value: i64) -> Option<String> {
    (!(MIN_SECONDS..=MAX_SECONDS).contains(&value)).then(|| {
        format!("must be a positive integer of seconds, between {MIN_SECONDS} and {MAX_SECONDS}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;

    fn pod(deadline: Option<i64>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                active_deadline_seconds: deadline,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn at(secs: i64, ms: i64) -> Timestamp {
        Timestamp::from_millisecond(secs * 1000 + ms).expect("a valid time")
    }

    #[test]
    fn the_remaining_time_counts_from_the_start_time() {
        let start = Some(at(1_000, 0));
        assert_eq!(
            check(&pod(Some(3)), start, at(1_001, 250)),
            Deadline::In(Duration::from_millis(1_750))
        );
        assert_eq!(
            check(&pod(Some(3)), start, at(1_000, 0)),
            Deadline::In(Duration::from_secs(3))
        );
        // A start time ahead of this clock (another node's, or the clock stepped back) only
        // lengthens the wait; it never makes the pod fail.
        assert_eq!(
            check(&pod(Some(3)), Some(at(1_010, 0)), at(1_000, 0)),
            Deadline::In(Duration::from_secs(13))
        );
        assert_eq!(
            check(&pod(Some(MAX_SECONDS)), start, at(1_000, 0)),
            Deadline::In(Duration::from_secs(MAX_SECONDS as u64))
        );
    }

    #[test]
    fn the_deadline_is_exceeded_at_and_after_start_plus_the_seconds() {
        let start = Some(at(1_000, 0));
        assert_eq!(
            check(&pod(Some(3)), start, at(1_003, 0)),
            Deadline::Exceeded
        );
        assert_eq!(
            check(&pod(Some(3)), start, at(1_002, 999)),
            Deadline::In(Duration::from_millis(1))
        );
        assert_eq!(
            check(&pod(Some(3)), start, at(5_000, 0)),
            Deadline::Exceeded
        );
        // Values the API refuses count as exceeded, as in the kubelet's arithmetic.
        assert_eq!(check(&pod(Some(0)), start, at(999, 0)), Deadline::Exceeded);
        assert_eq!(check(&pod(Some(-5)), start, at(999, 0)), Deadline::Exceeded);
    }

    #[test]
    fn without_a_start_time_or_a_deadline_nothing_counts() {
        assert_eq!(
            check(&pod(Some(3)), None, at(5_000, 0)),
            Deadline::NotStarted
        );
        assert_eq!(
            check(&pod(None), Some(at(1_000, 0)), at(5_000, 0)),
            Deadline::Unset
        );
        assert_eq!(check(&Pod::default(), None, at(5_000, 0)), Deadline::Unset);
    }

    #[test]
    fn only_positive_int32_seconds_are_valid() {
        assert_eq!(invalid(1), None);
        assert_eq!(invalid(MAX_SECONDS), None);
        for bad in [0, -1, MAX_SECONDS + 1, i64::MIN] {
            let why = invalid(bad).unwrap_or_else(|| panic!("{bad} was accepted"));
            assert!(why.contains("positive integer"), "{why}");
        }
    }
}
