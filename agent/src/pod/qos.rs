//! A pod's QoS class, by the kubelet's rules (`ComputePodQOS`).
//!
//! The cpu and memory requests and limits set above zero are summed over every container, init
//! containers included. BestEffort: none is set. Guaranteed: every container sets non-zero cpu
//! and memory limits, and the summed requests equal the summed limits for each resource (compared
//! exactly, below the millicore too). Burstable: anything else.

use k8s_openapi::api::core::v1::{Container, Pod};

use super::resources::{self, CpuMemory, requests_and_limits};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl QosClass {
    pub fn as_str(self) -> &'static str {
        match self {
            QosClass::Guaranteed => "Guaranteed",
            QosClass::Burstable => "Burstable",
            QosClass::BestEffort => "BestEffort",
        }
    }
}

/// The pod's QoS class; an amount that does not parse (or is negative) is an error.
pub fn pod_qos(pod: &Pod) -> resources::Result<QosClass> {
    let spec = pod.spec.as_ref();
    let apps = spec.map(|s| s.containers.iter()).into_iter().flatten();
    let init = spec
        .and_then(|s| s.init_containers.as_ref())
        .into_iter()
        .flatten();
    let (mut requests, mut limits) = (CpuMemory::default(), CpuMemory::default());
    let mut guaranteed = true;
    for c in apps.chain(init) {
        let r = requests_and_limits(c)?;
        let l = r.limits.positive();
        requests = requests.plus(r.requests.positive());
        limits = limits.plus(l);
        guaranteed &= l.cpu.is_some() && l.memory.is_some();
    }
    let set = |a: CpuMemory| [a.cpu, a.memory].into_iter().flatten().count();
    if set(requests) == 0 && set(limits) == 0 {
        return Ok(QosClass::BestEffort);
    }
    // Every request has an equal limit, and no limit lacks its request.
    let matched = |r: Option<_>, l: Option<_>| r.is_none() || r == l;
    if guaranteed
        && matched(requests.cpu, limits.cpu)
        && matched(requests.memory, limits.memory)
        && set(requests) == set(limits)
    {
        return Ok(QosClass::Guaranteed);
    }
    Ok(QosClass::Burstable)
}

/// `oom_score_adj` of the containers of Guaranteed and node-critical pods.
pub const GUARANTEED_OOM_SCORE_ADJ: i64 = -997;
/// `oom_score_adj` of the containers of BestEffort pods.
pub const BEST_EFFORT_OOM_SCORE_ADJ: i64 = 1000;
/// Priority from which a pod is critical (`system-cluster-critical` and above).
const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// A node-critical pod: critical (static, mirror, or of system-critical priority) and of
/// priority class `system-node-critical`.
fn is_node_critical(pod: &Pod) -> bool {
    let spec = pod.spec.as_ref();
    let critical = super::is_static(pod)
        || super::is_mirror(pod)
        || spec
            .and_then(|s| s.priority)
            .is_some_and(|p| p >= SYSTEM_CRITICAL_PRIORITY);
    critical && spec.and_then(|s| s.priority_class_name.as_deref()) == Some("system-node-critical")
}

/// The `oom_score_adj` of container `c` of `pod` on a node with `memory_capacity` bytes, as the
/// kubelet computes it: -997 for Guaranteed and node-critical pods, 1000 for BestEffort, and for
/// Burstable `1000 - 1000 * request / capacity` kept within 3..=999 (a sidecar counts at least
/// the smallest request of the pod's regular containers, so it is killed after them). `qos` is
/// the pod's class ([`pod_qos`]), computed once for all of its containers: a pod of n containers
/// would otherwise parse n x n resource lists on its start.
pub fn container_oom_score_adj(
    pod: &Pod,
    qos: QosClass,
    c: &Container,
    memory_capacity: u64,
) -> resources::Result<i64> {
    if is_node_critical(pod) {
        return Ok(GUARANTEED_OOM_SCORE_ADJ);
    }
    match qos {
        QosClass::Guaranteed => return Ok(GUARANTEED_OOM_SCORE_ADJ),
        QosClass::BestEffort => return Ok(BEST_EFFORT_OOM_SCORE_ADJ),
        QosClass::Burstable => {}
    }
    let request = |c: &Container| -> resources::Result<u64> {
        Ok(requests_and_limits(c)?.requests.memory_bytes())
    };
    let mut memory_request = request(c)?;
    if super::is_sidecar(c) {
        let mut smallest: Option<u64> = None;
        for regular in pod.spec.iter().flat_map(|s| &s.containers) {
            let r = request(regular)?;
            smallest = Some(smallest.map_or(r, |s| s.min(r)));
        }
        memory_request = memory_request.max(smallest.unwrap_or(0));
    }
    let capacity = u128::from(memory_capacity.max(1));
    let share = (1000 * u128::from(memory_request) / capacity).min(1000);
    let adj = 1000 - i64::try_from(share).unwrap_or(1000);
    Ok(if adj < 1000 + GUARANTEED_OOM_SCORE_ADJ {
        1000 + GUARANTEED_OOM_SCORE_ADJ
    } else if adj == BEST_EFFORT_OOM_SCORE_ADJ {
        adj - 1
    } else {
        adj
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::resources::tests::{
        Res, app_pod, container, list, pod_of, sidecar, sidecar_pod,
    };

    fn qos(containers: &[(Res<'_>, Res<'_>)]) -> QosClass {
        pod_qos(&app_pod(containers)).unwrap()
    }

    const G: Res<'static> = &[("cpu", "1"), ("memory", "1Gi")];

    #[test]
    fn classes() {
        assert_eq!(qos(&[(&[], &[])]), QosClass::BestEffort);
        assert_eq!(qos(&[(G, G)]), QosClass::Guaranteed);
        assert_eq!(qos(&[(G, G), (G, G)]), QosClass::Guaranteed);
        assert_eq!(qos(&[(G, G), (&[], &[])]), QosClass::Burstable);
        assert_eq!(qos(&[(&[("cpu", "100m")], &[])]), QosClass::Burstable);
        // Limits alone (not defaulted into requests): no request matches them.
        assert_eq!(qos(&[(&[], G)]), QosClass::Burstable);
        // Zero amounts count as unset.
        assert_eq!(
            qos(&[(&[("cpu", "0")], &[("memory", "0")])]),
            QosClass::BestEffort
        );
        assert_eq!(
            qos(&[(&[("cpu", "1"), ("memory", "0")], G)]),
            QosClass::Burstable
        );
        // The same amount written two ways is equal; 0.0001 cpu is not 1m, though both are 1m
        // once rounded to millicores.
        let m: Res<'_> = &[("cpu", "100m"), ("memory", "1Mi")];
        let d: Res<'_> = &[("cpu", "0.1"), ("memory", "1048576")];
        assert_eq!(qos(&[(m, d)]), QosClass::Guaranteed);
        let tiny: Res<'_> = &[("cpu", "0.0001"), ("memory", "1Mi")];
        let one: Res<'_> = &[("cpu", "1m"), ("memory", "1Mi")];
        assert_eq!(qos(&[(tiny, one)]), QosClass::Burstable);
        // The kubelet compares sums, not each container.
        let a: Res<'_> = &[("cpu", "1"), ("memory", "1Gi")];
        let b: Res<'_> = &[("cpu", "2"), ("memory", "1Gi")];
        assert_eq!(qos(&[(a, b), (b, a)]), QosClass::Guaranteed);
    }

    #[test]
    fn overhead_does_not_change_the_class() {
        // The kubelet's ComputePodQOS reads the containers only: overhead added to the requests
        // (and to set limits) neither makes a BestEffort pod Burstable nor breaks Guaranteed.
        let with_overhead = |containers: &[(Res<'_>, Res<'_>)]| {
            let mut pod = app_pod(containers);
            if let Some(spec) = pod.spec.as_mut() {
                spec.overhead = list(&[("cpu", "100m"), ("memory", "32Mi")]);
            }
            pod_qos(&pod).unwrap()
        };
        assert_eq!(with_overhead(&[(&[], &[])]), QosClass::BestEffort);
        assert_eq!(with_overhead(&[(G, G)]), QosClass::Guaranteed);
        assert_eq!(
            with_overhead(&[(&[("cpu", "100m")], &[])]),
            QosClass::Burstable
        );
    }

    #[test]
    fn init_containers_and_sidecars_count() {
        assert_eq!(pod_qos(&sidecar_pod()).unwrap(), QosClass::Burstable);
        let pod = pod_of(vec![sidecar("s", G, G)], vec![container("a", G, G)]);
        assert_eq!(pod_qos(&pod).unwrap(), QosClass::Guaranteed);
        let pod = pod_of(vec![container("i", &[], &[])], vec![container("a", G, G)]);
        assert_eq!(pod_qos(&pod).unwrap(), QosClass::Burstable);
        let pod = pod_of(vec![container("i", &[("memory", "1 Gi")], &[])], vec![]);
        assert!(pod_qos(&pod).is_err());
    }

    #[test]
    fn oom_score_adj_follows_the_class_and_the_memory_request() {
        const GI: u64 = 1 << 30;
        let cap = 4 * GI;
        let adj = |pod: &Pod, i: usize| {
            let c = &pod.spec.as_ref().unwrap().containers[i];
            container_oom_score_adj(pod, pod_qos(pod).unwrap(), c, cap).unwrap()
        };
        assert_eq!(adj(&app_pod(&[(G, G)]), 0), -997);
        assert_eq!(adj(&app_pod(&[(&[], &[])]), 0), 1000);
        // Burstable: 1000 - 1000 * 1Gi / 4Gi.
        let pod = app_pod(&[(&[("memory", "1Gi")], &[]), (&[("cpu", "1")], &[])]);
        assert_eq!(adj(&pod, 0), 750);
        // No memory request: 1000 would equal BestEffort, so 999.
        assert_eq!(adj(&pod, 1), 999);
        // A request at or above the capacity: at least 3 (above any Guaranteed container).
        let big = app_pod(&[(&[("memory", "5Gi")], &[])]);
        assert_eq!(adj(&big, 0), 3);
        // A sidecar counts at least the smallest regular request.
        let small: Res<'_> = &[("memory", "128Mi")];
        let pod = pod_of(
            vec![sidecar("s", small, &[])],
            vec![
                container("a", &[("memory", "1Gi")], &[]),
                container("b", &[("memory", "2Gi")], &[]),
            ],
        );
        let s = &pod.spec.as_ref().unwrap().init_containers.as_ref().unwrap()[0];
        assert_eq!(
            container_oom_score_adj(&pod, pod_qos(&pod).unwrap(), s, cap).unwrap(),
            750
        );
        // A static pod of priority class system-node-critical is node-critical.
        let mut critical = app_pod(&[(&[("memory", "1Gi")], &[])]);
        critical.metadata.annotations = Some(
            [(
                crate::pod::annotations::CONFIG_SOURCE.to_owned(),
                crate::pod::annotations::FILE_SOURCE.to_owned(),
            )]
            .into(),
        );
        assert_eq!(adj(&critical, 0), 750, "static alone is not enough");
        critical.spec.as_mut().unwrap().priority_class_name = Some("system-node-critical".into());
        assert_eq!(adj(&critical, 0), -997);
    }
}
