//! A pod's QoS class, by the kubelet's rules (`ComputePodQOS`).
//!
//! The cpu and memory requests and limits set above zero are summed over every container, init
//! containers included. BestEffort: none is set. Guaranteed: every container sets non-zero cpu
//! and memory limits, and the summed requests equal the summed limits for each resource (compared
//! exactly, below the millicore too). Burstable: anything else.

use k8s_openapi::api::core::v1::Pod;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::resources::tests::{Res, app_pod, container, pod_of, sidecar, sidecar_pod};

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
    fn init_containers_and_sidecars_count() {
        assert_eq!(pod_qos(&sidecar_pod()).unwrap(), QosClass::Burstable);
        let pod = pod_of(vec![sidecar("s", G, G)], vec![container("a", G, G)]);
        assert_eq!(pod_qos(&pod).unwrap(), QosClass::Guaranteed);
        let pod = pod_of(vec![container("i", &[], &[])], vec![container("a", G, G)]);
        assert_eq!(pod_qos(&pod).unwrap(), QosClass::Burstable);
        let pod = pod_of(vec![container("i", &[("memory", "1 Gi")], &[])], vec![]);
        assert!(pod_qos(&pod).is_err());
    }
}
