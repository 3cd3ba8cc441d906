//! A pod's cpu and memory requests and limits, computed as the kubelet's `PodRequests` and
//! `PodLimits` do.
//!
//! App containers add up. A restartable init container (a sidecar: an init container with
//! `restartPolicy: Always`) keeps running, so it adds to that sum and also runs beside every init
//! container started after it: an init container needs its own amount plus the sidecars started
//! before it. The pod needs the larger of the two, per resource:
//! `max(sum(apps) + sum(sidecars), max over init containers of their need)`. `spec.overhead` is
//! added to the requests, and to the limits that are set and non-zero. Limits take the same shape
//! over the containers that set one.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

use super::quantity::{self, Quantity};

/// A resource amount that does not parse, named by its field
/// (`container "app" resources.limits.memory`, `spec.overhead.cpu`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {source}")]
pub struct Error {
    pub field: String,
    #[source]
    pub source: quantity::Error,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The cpu and memory of a resource list; `None` where the list does not name the resource.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CpuMemory {
    pub cpu: Option<Quantity>,
    pub memory: Option<Quantity>,
}

/// Both fields by `f`, so each rule is written once for the two resources.
fn each(
    a: CpuMemory,
    b: CpuMemory,
    f: impl Fn(Option<Quantity>, Option<Quantity>) -> Option<Quantity>,
) -> CpuMemory {
    CpuMemory {
        cpu: f(a.cpu, b.cpu),
        memory: f(a.memory, b.memory),
    }
}

/// A non-negative value as a u64, saturating.
fn to_u64(v: i128) -> u64 {
    u64::try_from(v.max(0)).unwrap_or(u64::MAX)
}

impl CpuMemory {
    /// The cpu and memory of a resource list; `field` is the list's path, for errors. Negative
    /// amounts are refused.
    pub fn of(
        list: Option<&BTreeMap<String, ApiQuantity>>,
        field: &dyn Fn() -> String,
    ) -> Result<Self> {
        let get = |name: &str| {
            list.and_then(|l| l.get(name))
                .map(|q| {
                    Quantity::parse_amount(&q.0).map_err(|source| Error {
                        field: format!("{}.{name}", field()),
                        source,
                    })
                })
                .transpose()
        };
        Ok(CpuMemory {
            cpu: get("cpu")?,
            memory: get("memory")?,
        })
    }

    /// The sum per resource; absent only where both are absent.
    pub fn plus(self, other: CpuMemory) -> CpuMemory {
        each(self, other, |a, b| match (a, b) {
            (Some(a), Some(b)) => Some(a.saturating_add(b)),
            (a, b) => a.or(b),
        })
    }

    /// The larger per resource (a named resource beats an absent one, even at zero).
    pub fn max(self, other: CpuMemory) -> CpuMemory {
        each(self, other, Ord::max)
    }

    /// Only the resources set above zero.
    pub fn positive(self) -> CpuMemory {
        each(self, self, |a, _| a.filter(|q| !q.is_zero()))
    }

    /// The cpu in millicores, rounded up (0 when absent).
    pub fn cpu_millis(&self) -> u64 {
        to_u64(self.cpu.map_or(0, Quantity::milli_value))
    }

    /// The memory in bytes, rounded up (0 when absent).
    pub fn memory_bytes(&self) -> u64 {
        to_u64(self.memory.map_or(0, Quantity::value))
    }
}

/// One container's requests and limits.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ContainerResources {
    pub requests: CpuMemory,
    pub limits: CpuMemory,
}

/// The requests and limits of container `c` (its name is unique in the pod: errors name it).
pub fn requests_and_limits(c: &Container) -> Result<ContainerResources> {
    let r = c.resources.as_ref();
    let field = |which: &str| format!("container {:?} resources.{which}", c.name);
    Ok(ContainerResources {
        requests: CpuMemory::of(r.and_then(|r| r.requests.as_ref()), &|| field("requests"))?,
        limits: CpuMemory::of(r.and_then(|r| r.limits.as_ref()), &|| field("limits"))?,
    })
}

/// A restartable init container: it starts in order with the init containers and keeps running.
fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// The pod's requests and limits (see the module docs), and whether every container declares a
/// non-zero cpu (memory) limit, an init container counting the sidecars started before it: the
/// pod cgroup gets a cfs quota (memory limit) only then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodResources {
    pub requests: CpuMemory,
    pub limits: CpuMemory,
    pub cpu_limits_declared: bool,
    pub memory_limits_declared: bool,
}

pub fn pod_resources(pod: &Pod) -> Result<PodResources> {
    let mut out = PodResources {
        requests: CpuMemory::default(),
        limits: CpuMemory::default(),
        cpu_limits_declared: true,
        memory_limits_declared: true,
    };
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(out);
    };
    let mut declare = |limits: &CpuMemory| {
        let set = |q: Option<Quantity>| q.is_some_and(|q| !q.is_zero());
        out.cpu_limits_declared &= set(limits.cpu);
        out.memory_limits_declared &= set(limits.memory);
    };
    let (mut requests, mut limits) = (CpuMemory::default(), CpuMemory::default());
    for c in &spec.containers {
        let r = requests_and_limits(c)?;
        requests = requests.plus(r.requests);
        limits = limits.plus(r.limits);
        declare(&r.limits);
    }
    // What the sidecars started so far hold, and the largest need of any init container.
    let mut sidecars = ContainerResources::default();
    let mut peak = ContainerResources::default();
    for c in spec.init_containers.iter().flatten() {
        let r = requests_and_limits(c)?;
        let need = if is_sidecar(c) {
            requests = requests.plus(r.requests);
            limits = limits.plus(r.limits);
            sidecars.requests = sidecars.requests.plus(r.requests);
            sidecars.limits = sidecars.limits.plus(r.limits);
            sidecars
        } else {
            ContainerResources {
                requests: r.requests.plus(sidecars.requests),
                limits: r.limits.plus(sidecars.limits),
            }
        };
        declare(&need.limits);
        peak.requests = peak.requests.max(need.requests);
        peak.limits = peak.limits.max(need.limits);
    }
    requests = requests.max(peak.requests);
    limits = limits.max(peak.limits);
    if let Some(overhead) = spec.overhead.as_ref() {
        let overhead = CpuMemory::of(Some(overhead), &|| "spec.overhead".to_owned())?;
        requests = requests.plus(overhead);
        // Only onto limits that are set: an unlimited resource stays unlimited.
        limits = each(limits, overhead, |l, o| match (l, o) {
            (Some(l), Some(o)) if !l.is_zero() => Some(l.saturating_add(o)),
            (l, _) => l,
        });
    }
    out.requests = requests;
    out.limits = limits;
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, ResourceRequirements};

    /// A resource list from `(name, quantity)` pairs; None when empty.
    pub(crate) fn list(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, ApiQuantity>> {
        (!pairs.is_empty()).then(|| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), ApiQuantity(v.to_string())))
                .collect()
        })
    }

    pub(crate) type Res<'a> = &'a [(&'a str, &'a str)];

    /// A container with these requests and limits.
    pub(crate) fn container(name: &str, requests: Res<'_>, limits: Res<'_>) -> Container {
        Container {
            name: name.to_owned(),
            resources: Some(ResourceRequirements {
                requests: list(requests),
                limits: list(limits),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// A pod of app containers `c0`, `c1`, ... with these requests and limits.
    pub(crate) fn app_pod(containers: &[(Res<'_>, Res<'_>)]) -> Pod {
        let cs = containers
            .iter()
            .enumerate()
            .map(|(i, (r, l))| container(&format!("c{i}"), r, l))
            .collect();
        pod_of(vec![], cs)
    }

    pub(crate) fn sidecar(name: &str, requests: Res<'_>, limits: Res<'_>) -> Container {
        Container {
            restart_policy: Some("Always".to_owned()),
            ..container(name, requests, limits)
        }
    }

    pub(crate) fn pod_of(init: Vec<Container>, containers: Vec<Container>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                init_containers: (!init.is_empty()).then_some(init),
                containers,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The sidecar + init + app pod whose numbers the kubelet's formulas give, worked by hand in
    /// [`sidecar_init_and_app_pod`].
    pub(crate) fn sidecar_pod() -> Pod {
        pod_of(
            vec![
                container(
                    "setup",
                    &[("cpu", "500m"), ("memory", "300Mi")],
                    &[("cpu", "1"), ("memory", "400Mi")],
                ),
                sidecar(
                    "proxy",
                    &[("cpu", "100m"), ("memory", "64Mi")],
                    &[("cpu", "200m"), ("memory", "128Mi")],
                ),
                container(
                    "migrate",
                    &[("cpu", "300m"), ("memory", "200Mi")],
                    &[("cpu", "600m"), ("memory", "300Mi")],
                ),
            ],
            vec![container(
                "web",
                &[("cpu", "250m"), ("memory", "128Mi")],
                &[("cpu", "500m"), ("memory", "256Mi")],
            )],
        )
    }

    const MI: u64 = 1 << 20;

    fn millis_and_bytes(a: CpuMemory) -> (u64, u64) {
        (a.cpu_millis(), a.memory_bytes())
    }

    #[test]
    fn sidecar_init_and_app_pod() {
        let r = pod_resources(&sidecar_pod()).unwrap();
        // Requests. Running together: web 250m/128Mi + proxy 100m/64Mi = 350m/192Mi.
        // Init needs: setup 500m/300Mi (no sidecar yet), proxy 100m/64Mi (the sidecars so far,
        // itself included), migrate 300m/200Mi + proxy = 400m/264Mi; peak 500m/300Mi.
        // Pod: max(350m, 500m) = 500m, max(192Mi, 300Mi) = 300Mi.
        assert_eq!(millis_and_bytes(r.requests), (500, 300 * MI));
        // Limits. Running together: 500m/256Mi + 200m/128Mi = 700m/384Mi.
        // Init needs: setup 1000m/400Mi, proxy 200m/128Mi, migrate 600m/300Mi + proxy =
        // 800m/428Mi; peak 1000m/428Mi. Pod: max(700m, 1000m) = 1000m, max(384Mi, 428Mi) =
        // 428Mi (the plain max over init containers would say 400Mi).
        assert_eq!(millis_and_bytes(r.limits), (1000, 428 * MI));
        assert!(r.cpu_limits_declared && r.memory_limits_declared);
    }

    #[test]
    fn a_sidecar_adds_to_the_app_containers() {
        let limits = &[("cpu", "100m"), ("memory", "128Mi")];
        let with = |init: Container| {
            let app = container("app", &[], &[("cpu", "200m"), ("memory", "256Mi")]);
            pod_resources(&pod_of(vec![init], vec![app])).unwrap()
        };
        // The pod limit is what runs together: 256Mi + 128Mi, not max(256Mi, 128Mi).
        let r = with(sidecar("proxy", &[], limits));
        assert_eq!(millis_and_bytes(r.limits), (300, 384 * MI));
        assert_eq!(r.requests, CpuMemory::default());
        // A plain init container runs alone: the max rule.
        let r = with(container("init", &[], limits));
        assert_eq!(millis_and_bytes(r.limits), (200, 256 * MI));
    }

    #[test]
    fn overhead_adds_to_requests_and_to_set_limits() {
        let mut pod = pod_of(
            vec![],
            vec![container(
                "app",
                &[("cpu", "100m"), ("memory", "64Mi")],
                &[("cpu", "200m")],
            )],
        );
        if let Some(spec) = pod.spec.as_mut() {
            spec.overhead = list(&[("cpu", "50m"), ("memory", "32Mi")]);
        }
        let r = pod_resources(&pod).unwrap();
        assert_eq!(millis_and_bytes(r.requests), (150, 96 * MI));
        // cpu limit 200m + 50m; no memory limit, and overhead does not create one.
        assert_eq!(r.limits.cpu_millis(), 250);
        assert_eq!(r.limits.memory, None);
        assert!(r.cpu_limits_declared);
        assert!(!r.memory_limits_declared);
    }

    #[test]
    fn declared_limits_count_the_sidecars_before_an_init_container() {
        // `init` sets no cpu limit of its own, but runs beside `proxy`, which does.
        let pod = pod_of(
            vec![
                sidecar("proxy", &[], &[("cpu", "100m"), ("memory", "64Mi")]),
                container("init", &[], &[("memory", "32Mi")]),
            ],
            vec![container("app", &[], &[("cpu", "1"), ("memory", "1Gi")])],
        );
        let r = pod_resources(&pod).unwrap();
        assert!(r.cpu_limits_declared && r.memory_limits_declared);
        // An app container without a memory limit leaves the pod without one.
        let pod = pod_of(
            vec![],
            vec![container("app", &[], &[("cpu", "1"), ("memory", "0")])],
        );
        let r = pod_resources(&pod).unwrap();
        assert!(r.cpu_limits_declared && !r.memory_limits_declared);
    }

    #[test]
    fn exact_sums_and_errors_that_name_the_field() {
        // 2.007 cpu is 2007m (a float parser said 2008m). Amounts add up exactly and are rounded
        // once: 2.007 + 0.0004 + 0.0006 = 2.008 (rounding each first would give 2009m).
        let a = container("a", &[("cpu", "2.007")], &[]);
        let pod = pod_of(vec![], vec![a.clone()]);
        assert_eq!(pod_resources(&pod).unwrap().requests.cpu_millis(), 2007);
        let pod = pod_of(
            vec![],
            vec![
                a,
                container("b", &[("cpu", "0.0004")], &[]),
                container("c", &[("cpu", "0.0006")], &[]),
            ],
        );
        assert_eq!(pod_resources(&pod).unwrap().requests.cpu_millis(), 2008);
        let pod = pod_of(vec![], vec![container("a", &[("memory", "1 Gi")], &[])]);
        let e = pod_resources(&pod).unwrap_err();
        assert_eq!(e.field, "container \"a\" resources.requests.memory");
        assert!(e.to_string().contains("\"1 Gi\""), "{e}");
        let pod = pod_of(vec![sidecar("s", &[], &[("cpu", "-1")])], vec![]);
        let e = pod_resources(&pod).unwrap_err();
        assert_eq!(e.field, "container \"s\" resources.limits.cpu");
        assert!(matches!(e.source, quantity::Error::Negative { .. }));
    }
}
