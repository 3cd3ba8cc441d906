//! The kubelet's admission predicates a node agent owns, as pure functions of the pod, the pods
//! already admitted and the node: resources fit allocatable, the node name, host ports, node
//! selector and required node affinity against the node's labels, and `NoExecute` taints. The
//! first failure, in the kubelet's order, is the rejection (its reason and message in the
//! kubelet's words).
use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::{
    NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod, Taint,
};

use super::resources::pod_resources;

/// What admission knows of the node.
#[derive(Debug, Clone, Default)]
pub struct Node {
    /// Empty: not checked.
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    /// Allocatable cpu in millicores; `None`: not checked.
    pub cpu_millis: Option<u64>,
    /// Allocatable memory in bytes; `None`: not checked.
    pub memory_bytes: Option<u64>,
}

/// Why a pod is not admitted: the status reason (`OutOfcpu`, `NodeAffinity`, ...) and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub reason: &'static str,
    pub message: String,
}

fn predicate(name: &'static str) -> Rejection {
    Rejection {
        reason: name,
        message: format!("Predicate {name} failed"),
    }
}

/// The cpu (millicores) and memory (bytes) `pod` requests; a pod whose resources do not parse
/// requests nothing here (it fails later with the reason).
fn requests(pod: &Pod) -> (u64, u64) {
    pod_resources(pod).map_or((0, 0), |r| {
        (r.requests.cpu_millis(), r.requests.memory_bytes())
    })
}

/// The summed cpu (millicores) and memory (bytes) requests of `pods`, each pod's resources read
/// once.
fn used_requests<'a>(pods: impl Iterator<Item = &'a Pod>) -> (u64, u64) {
    pods.map(requests).fold((0, 0), |(c, m), (pc, pm)| {
        (c.saturating_add(pc), m.saturating_add(pm))
    })
}

/// `(protocol, hostIP, hostPort)` of every container port with a host port.
fn host_ports(pod: &Pod) -> Vec<(String, String, i32)> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let port = p.host_port.filter(|p| *p > 0)?;
            let ip = p
                .host_ip
                .clone()
                .filter(|ip| !ip.is_empty())
                .unwrap_or_else(|| "0.0.0.0".to_owned());
            Some((
                p.protocol.clone().unwrap_or_else(|| "TCP".to_owned()),
                ip,
                port,
            ))
        })
        .collect()
}

/// Whether two host ports collide: same protocol and port, and the same IP or either one the
/// wildcard.
fn collide(a: &(String, String, i32), b: &(String, String, i32)) -> bool {
    a.0 == b.0 && a.2 == b.2 && (a.1 == b.1 || a.1 == "0.0.0.0" || b.1 == "0.0.0.0")
}

/// One requirement of a node selector term against the node's labels.
fn requirement_matches(r: &NodeSelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    let value = labels.get(&r.key);
    let values = r.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(have), Some(bound)) = (
                value.and_then(|v| number(v)),
                values.first().and_then(|v| number(v)),
            ) else {
                return false;
            };
            if r.operator == "Gt" {
                have > bound
            } else {
                have < bound
            }
        }
        _ => false,
    }
}

/// A node selector term: every expression on labels and every field (only `metadata.name`)
/// holds; an empty term matches nothing.
fn term_matches(t: &NodeSelectorTerm, node: &Node) -> bool {
    let exprs = t.match_expressions.as_deref().unwrap_or_default();
    let fields = t.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    let name = BTreeMap::from([("metadata.name".to_owned(), node.name.clone())]);
    exprs.iter().all(|r| requirement_matches(r, &node.labels))
        && fields.iter().all(|r| requirement_matches(r, &name))
}

/// A node selector (any of its terms) against the node.
pub fn node_selector_matches(selector: &NodeSelector, node: &Node) -> bool {
    selector
        .node_selector_terms
        .iter()
        .any(|t| term_matches(t, node))
}

/// `spec.nodeSelector` and the required node affinity (any of its terms) against the node.
pub fn matches_node_selector_and_affinity(pod: &Pod, node: &Node) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return true;
    };
    let selector_ok = spec
        .node_selector
        .iter()
        .flatten()
        .all(|(k, v)| node.labels.get(k) == Some(v));
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    let affinity_ok = required.is_none_or(|r| node_selector_matches(r, node));
    selector_ok && affinity_ok
}

/// Whether `pod` tolerates taint `t` (a toleration with an empty key and `Exists` tolerates
/// every taint; an empty effect matches every effect).
fn tolerates(pod: &Pod, t: &Taint) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.tolerations.as_ref())
        .into_iter()
        .flatten()
        .any(|tol| {
            let effect_ok = tol
                .effect
                .as_deref()
                .is_none_or(|e| e.is_empty() || e == t.effect);
            let op = tol.operator.as_deref().unwrap_or("Equal");
            let key = tol.key.as_deref().unwrap_or("");
            let key_ok = if key.is_empty() {
                op == "Exists"
            } else {
                key == t.key
            };
            let value_ok = op == "Exists"
                || tol.value.as_deref().unwrap_or("") == t.value.as_deref().unwrap_or("");
            effect_ok && key_ok && value_ok
        })
}

/// Admits `pod` on `node` beside the `admitted` pods, or says why not, as the kubelet's
/// predicate admission does (first failure wins): insufficient cpu, then memory
/// (`OutOfcpu`/`OutOfmemory`: "Node didn't have enough resource: cpu, requested: R, used: U,
/// capacity: C", millicores and bytes), `NodeAffinity`, `NodeName`, `NodePorts`, and for other
/// than static pods an untolerated `NoExecute` taint (`TaintToleration`).
pub fn admit<'a>(
    pod: &Pod,
    admitted: impl Iterator<Item = &'a Pod> + Clone,
    node: &Node,
) -> Result<(), Rejection> {
    let (cpu, memory) = requests(pod);
    // The admitted pods' requests are read once, and only when the pod requests something.
    let used = (cpu > 0 || memory > 0).then(|| used_requests(admitted.clone()));
    let (used_cpu, used_memory) = used.unwrap_or_default();
    let checks = [
        ("cpu", "OutOfcpu", cpu, node.cpu_millis, used_cpu),
        (
            "memory",
            "OutOfmemory",
            memory,
            node.memory_bytes,
            used_memory,
        ),
    ];
    for (resource, reason, requested, capacity, used) in checks {
        let Some(capacity) = capacity else { continue };
        if requested == 0 {
            continue;
        }
        if used.saturating_add(requested) > capacity {
            return Err(Rejection {
                reason,
                message: format!(
                    "Node didn't have enough resource: {resource}, requested: {requested}, \
                     used: {used}, capacity: {capacity}"
                ),
            });
        }
    }
    if !matches_node_selector_and_affinity(pod, node) {
        return Err(predicate("NodeAffinity"));
    }
    let bound = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
    if !node.name.is_empty() && bound.is_some_and(|n| !n.is_empty() && n != node.name) {
        return Err(predicate("NodeName"));
    }
    let wanted = host_ports(pod);
    if !wanted.is_empty() {
        let mut taken: HashSet<(String, String, i32)> = HashSet::new();
        for p in admitted.clone() {
            taken.extend(host_ports(p));
        }
        if wanted.iter().any(|w| taken.iter().any(|t| collide(w, t))) {
            return Err(predicate("NodePorts"));
        }
    }
    if !super::is_static(pod)
        && node
            .taints
            .iter()
            .any(|t| t.effect == "NoExecute" && !tolerates(pod, t))
    {
        return Err(predicate("TaintToleration"));
    }
    Ok(())
}

/// The taint a BestEffort pod tolerates to be admitted under memory pressure.
pub const MEMORY_PRESSURE_TAINT: &str = "node.kubernetes.io/memory-pressure";

/// The eviction manager's admission, which the kubelet runs before the predicates: while the
/// node holds pressure `conditions` (the eviction manager's, sorted), a critical pod is
/// admitted; under `MemoryPressure` alone, a pod that is not BestEffort, or a BestEffort pod
/// tolerating the `node.kubernetes.io/memory-pressure:NoSchedule` taint, is admitted; any
/// other pod is rejected with reason `Evicted` and "The node had condition: [C ...]. " (a
/// node short of disk or pids takes no new pod, one short of memory none that could be the
/// first evicted).
pub fn admit_under_pressure(pod: &Pod, conditions: &[&str]) -> Result<(), Rejection> {
    if conditions.is_empty() || super::is_critical(pod) {
        return Ok(());
    }
    if conditions == ["MemoryPressure"] {
        let best_effort = matches!(
            super::qos::pod_qos(pod),
            Ok(super::qos::QosClass::BestEffort)
        );
        let taint = Taint {
            key: MEMORY_PRESSURE_TAINT.to_owned(),
            effect: "NoSchedule".to_owned(),
            ..Taint::default()
        };
        if !best_effort || tolerates(pod, &taint) {
            return Ok(());
        }
    }
    Err(Rejection {
        reason: "Evicted",
        message: format!("The node had condition: [{}]. ", conditions.join(" ")),
    })
}

/// A resource a critical pod lacks, and how much of it: cpu (millicores), memory (bytes) or
/// pods (count).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shortfall {
    pub resource: &'static str,
    pub amount: u64,
}

/// What `pod` lacks to fit beside the `admitted` pods: cpu and memory beyond allocatable, and a
/// pod slot when `admitted` already holds `max_pods`. Empty: it fits.
pub fn shortfalls(pod: &Pod, admitted: &[&Pod], node: &Node, max_pods: usize) -> Vec<Shortfall> {
    let (cpu, memory) = requests(pod);
    let (used_cpu, used_memory) = used_requests(admitted.iter().copied());
    let mut out = Vec::new();
    let mut short = |resource, requested: u64, used: u64, capacity: Option<u64>| {
        let over = capacity.map_or(0, |c| used.saturating_add(requested).saturating_sub(c));
        if requested > 0 && over > 0 {
            out.push(Shortfall {
                resource,
                amount: over,
            });
        }
    };
    short("cpu", cpu, used_cpu, node.cpu_millis);
    short("memory", memory, used_memory, node.memory_bytes);
    let max = u64::try_from(max_pods).unwrap_or(u64::MAX);
    short("pods", 1, admitted.len() as u64, Some(max));
    out
}

/// How much of `resource` preempting `pod` frees.
fn frees(pod: &Pod, resource: &str) -> u64 {
    let (cpu, memory) = requests(pod);
    match resource {
        "cpu" => cpu,
        "memory" => memory,
        _ => 1,
    }
}

/// What remains of `needs` once `pods` are preempted.
fn remaining(needs: &[Shortfall], pods: &[&Pod]) -> Vec<Shortfall> {
    needs
        .iter()
        .filter_map(|n| {
            let freed = pods
                .iter()
                .map(|p| frees(p, n.resource))
                .fold(0, u64::saturating_add);
            let amount = n.amount.saturating_sub(freed);
            (amount > 0).then_some(Shortfall { amount, ..*n })
        })
        .collect()
}

/// How far preempting `pod` leaves `needs` from met: the sum over the needs of the squared
/// fraction still missing (each need weighs the same whatever its unit).
fn distance(needs: &[Shortfall], pod: &Pod) -> f64 {
    needs
        .iter()
        .map(|n| {
            let left = n.amount.saturating_sub(frees(pod, n.resource)) as f64;
            (left / n.amount as f64).powi(2)
        })
        .sum()
}

/// Picks from `pods`, one at a time, the one that leaves `needs` closest to met (on a tie the
/// one requesting less memory, then less cpu) until nothing is missing; `None` when `pods` run
/// out first.
fn closest_first(mut pods: Vec<&Pod>, mut needs: Vec<Shortfall>) -> Option<Vec<&Pod>> {
    let mut out = Vec::new();
    while !needs.is_empty() {
        let best = pods
            .iter()
            .enumerate()
            .min_by(|(_, a), (_, b)| {
                let (da, db) = (distance(&needs, a), distance(&needs, b));
                let (ca, ma) = requests(a);
                let (cb, mb) = requests(b);
                da.total_cmp(&db).then(ma.cmp(&mb)).then(ca.cmp(&cb))
            })
            .map(|(i, _)| i)?;
        let pod = pods.swap_remove(best);
        needs = remaining(&needs, &[pod]);
        out.push(pod);
    }
    Some(out)
}

/// Whether `preemptor` may preempt `preemptee` (the kubelet's rule): a critical pod may preempt
/// any pod that is not, and otherwise only a higher priority a lower one when both are set.
fn may_preempt(preemptor: &Pod, preemptee: &Pod) -> bool {
    if super::is_critical(preemptor) && !super::is_critical(preemptee) {
        return true;
    }
    let prio = |p: &Pod| p.spec.as_ref().and_then(|s| s.priority);
    matches!((prio(preemptor), prio(preemptee)), (Some(a), Some(b)) if a > b)
}

/// The kubelet's critical pod admission: the admitted pods to preempt so that `pod` gets what
/// it lacks (`needs`, from [`shortfalls`]). The candidates are the pods it may preempt, taken
/// BestEffort first, then Burstable, then Guaranteed, and within each class closest to the need
/// first, so that as few and as low a class as possible go: the Guaranteed pods needed even if
/// every other went, then the Burstable ones needed beside those, then the BestEffort ones.
/// `Err` names what even all of them would not free.
pub fn preemption_victims<'a>(
    pod: &Pod,
    admitted: &[&'a Pod],
    needs: &[Shortfall],
) -> Result<Vec<&'a Pod>, String> {
    use super::qos::{QosClass, pod_qos};
    let (mut best_effort, mut burstable, mut guaranteed) = (Vec::new(), Vec::new(), Vec::new());
    for p in admitted.iter().copied().filter(|p| may_preempt(pod, p)) {
        match pod_qos(p) {
            Ok(QosClass::BestEffort) => best_effort.push(p),
            Ok(QosClass::Burstable) => burstable.push(p),
            Ok(QosClass::Guaranteed) => guaranteed.push(p),
            Err(_) => {}
        }
    }
    let all: Vec<&Pod> = best_effort
        .iter()
        .chain(&burstable)
        .chain(&guaranteed)
        .copied()
        .collect();
    let unmet = remaining(needs, &all);
    if !unmet.is_empty() {
        let what: Vec<String> = unmet
            .iter()
            .map(|n| format!("(res: {}, q: {})", n.resource, n.amount))
            .collect();
        return Err(format!(
            "no set of running pods found to reclaim resources: [{}]",
            what.join(", ")
        ));
    }
    let lower: Vec<&Pod> = best_effort.iter().chain(&burstable).copied().collect();
    let missing = "every need is met by the candidates together";
    let from_guaranteed = closest_first(guaranteed, remaining(needs, &lower)).ok_or(missing)?;
    let beside: Vec<&Pod> = best_effort
        .iter()
        .chain(&from_guaranteed)
        .copied()
        .collect();
    let from_burstable = closest_first(burstable, remaining(needs, &beside)).ok_or(missing)?;
    let beside: Vec<&Pod> = from_burstable
        .iter()
        .chain(&from_guaranteed)
        .copied()
        .collect();
    let from_best_effort = closest_first(best_effort, remaining(needs, &beside)).ok_or(missing)?;
    Ok(from_best_effort
        .into_iter()
        .chain(from_burstable)
        .chain(from_guaranteed)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        serde_saphyr::from_str(yaml).expect("a pod")
    }

    fn node() -> Node {
        Node {
            name: "n1".into(),
            labels: BTreeMap::from([("zone".into(), "a".into()), ("gen".into(), "5".into())]),
            taints: vec![],
            cpu_millis: Some(2000),
            memory_bytes: Some(1 << 30),
        }
    }

    fn requesting(cpu: &str, memory: &str) -> Pod {
        pod(&format!(
            "metadata: {{name: p}}\nspec:\n  containers:\n  - name: c\n    resources: {{requests: \
             {{cpu: {cpu}, memory: {memory}}}}}\n"
        ))
    }

    #[test]
    fn node_pressure_admits_critical_pods_and_under_memory_pressure_all_but_best_effort() {
        let best_effort = pod("metadata: {name: p}\nspec:\n  containers:\n  - name: c\n");
        let burstable = requesting("100m", "10Mi");
        let tolerating = pod(&format!(
            "metadata: {{name: p}}\nspec:\n  tolerations: [{{key: {MEMORY_PRESSURE_TAINT}, \
             operator: Exists, effect: NoSchedule}}]\n  containers:\n  - name: c\n"
        ));
        let mut critical = best_effort.clone();
        critical.spec.as_mut().expect("spec").priority = Some(2_000_001_000);
        assert_eq!(admit_under_pressure(&best_effort, &[]), Ok(()));
        let memory = ["MemoryPressure"];
        assert_eq!(admit_under_pressure(&burstable, &memory), Ok(()));
        assert_eq!(admit_under_pressure(&tolerating, &memory), Ok(()));
        assert_eq!(admit_under_pressure(&critical, &memory), Ok(()));
        assert_eq!(
            admit_under_pressure(&best_effort, &memory),
            Err(Rejection {
                reason: "Evicted",
                message: "The node had condition: [MemoryPressure]. ".into()
            })
        );
        // Disk or pid pressure refuses every pod but the critical ones, tolerations or not.
        let both = ["DiskPressure", "MemoryPressure"];
        for p in [&burstable, &tolerating, &best_effort] {
            let e = admit_under_pressure(p, &both).unwrap_err();
            assert_eq!(
                e.message,
                "The node had condition: [DiskPressure MemoryPressure]. "
            );
            assert!(admit_under_pressure(p, &["PIDPressure"]).is_err());
        }
        assert_eq!(admit_under_pressure(&critical, &both), Ok(()));
    }

    #[test]
    fn resources_must_fit_allocatable_with_the_kubelets_message() {
        let big = requesting("1500m", "100Mi");
        let more = requesting("600m", "100Mi");
        assert_eq!(admit(&more, std::iter::empty(), &node()), Ok(()));
        let e = admit(&more, [&big].into_iter(), &node()).unwrap_err();
        assert_eq!(e.reason, "OutOfcpu");
        assert_eq!(
            e.message,
            "Node didn't have enough resource: cpu, requested: 600, used: 1500, capacity: 2000"
        );
        let hog = requesting("100m", "2Gi");
        assert_eq!(
            admit(&hog, std::iter::empty(), &node()).unwrap_err().reason,
            "OutOfmemory"
        );
        // A pod that requests nothing always fits.
        let none = pod("metadata: {name: p}\nspec:\n  containers:\n  - name: c\n");
        assert_eq!(admit(&none, [&big, &big].into_iter(), &node()), Ok(()));
    }

    #[test]
    fn node_selector_and_required_affinity_match_the_labels() {
        let sel = pod("spec:\n  nodeSelector: {zone: a}\n  containers: [{name: c}]\n");
        assert_eq!(admit(&sel, std::iter::empty(), &node()), Ok(()));
        let other = pod("spec:\n  nodeSelector: {zone: b}\n  containers: [{name: c}]\n");
        let e = admit(&other, std::iter::empty(), &node()).unwrap_err();
        assert_eq!(
            (e.reason, e.message.as_str()),
            ("NodeAffinity", "Predicate NodeAffinity failed")
        );
        let affinity = |expr: &str| {
            pod(&format!(
                "spec:\n  containers: [{{name: c}}]\n  affinity:\n    nodeAffinity:\n      \
                 requiredDuringSchedulingIgnoredDuringExecution:\n        nodeSelectorTerms:\n        \
                 - matchExpressions: [{expr}]\n"
            ))
        };
        let ok = |p: &Pod| admit(p, std::iter::empty(), &node()).is_ok();
        assert!(ok(&affinity("{key: zone, operator: In, values: [a, b]}")));
        assert!(!ok(&affinity("{key: zone, operator: NotIn, values: [a]}")));
        assert!(ok(&affinity("{key: gen, operator: Gt, values: ['4']}")));
        assert!(!ok(&affinity("{key: gen, operator: Lt, values: ['4']}")));
        assert!(ok(&affinity("{key: gpu, operator: DoesNotExist}")));
        assert!(!ok(&affinity("{key: gpu, operator: Exists}")));
    }

    #[test]
    fn host_ports_node_name_and_no_execute_taints() {
        let web = pod(
            "spec:\n  containers:\n  - name: c\n    ports: [{containerPort: 80, hostPort: 8080}]\n",
        );
        let e = admit(&web, [&web].into_iter(), &node()).unwrap_err();
        assert_eq!(e.reason, "NodePorts");
        let udp = pod(
            "spec:\n  containers:\n  - name: c\n    ports: [{containerPort: 80, hostPort: 8080, \
             protocol: UDP}]\n",
        );
        assert_eq!(admit(&udp, [&web].into_iter(), &node()), Ok(()));

        let elsewhere = pod("spec:\n  nodeName: n2\n  containers: [{name: c}]\n");
        assert_eq!(
            admit(&elsewhere, std::iter::empty(), &node())
                .unwrap_err()
                .reason,
            "NodeName"
        );

        let mut tainted = node();
        tainted.taints = vec![Taint {
            key: "dedicated".into(),
            value: Some("db".into()),
            effect: "NoExecute".into(),
            time_added: None,
        }];
        let plain = pod("spec:\n  containers: [{name: c}]\n");
        assert_eq!(
            admit(&plain, std::iter::empty(), &tainted)
                .unwrap_err()
                .reason,
            "TaintToleration"
        );
        let tolerant = pod(
            "spec:\n  containers: [{name: c}]\n  tolerations: [{key: dedicated, operator: Equal, \
             value: db, effect: NoExecute}]\n",
        );
        assert_eq!(admit(&tolerant, std::iter::empty(), &tainted), Ok(()));
        let static_pod = pod(
            "metadata: {annotations: {kubernetes.io/config.source: file}}\nspec:\n  containers: \
             [{name: c}]\n",
        );
        assert_eq!(
            admit(&static_pod, std::iter::empty(), &tainted),
            Ok(()),
            "static pods are exempt from taints"
        );
    }

    /// A pod named `name` with cpu and memory requests (and the same limits when `guaranteed`;
    /// none at all for "0"/"0": BestEffort).
    fn sized(name: &str, cpu: &str, memory: &str, guaranteed: bool) -> Pod {
        let resources = match (cpu, memory, guaranteed) {
            ("0", "0", _) => "{}".to_owned(),
            (c, m, true) => format!(
                "{{requests: {{cpu: {c}, memory: {m}}}, limits: {{cpu: {c}, memory: {m}}}}}"
            ),
            (c, m, false) => format!("{{requests: {{cpu: {c}, memory: {m}}}}}"),
        };
        pod(&format!(
            "metadata: {{name: {name}}}\nspec:\n  containers:\n  - name: c\n    resources: {resources}\n"
        ))
    }

    fn critical(cpu: &str, memory: &str) -> Pod {
        let mut p = sized("critical", cpu, memory, false);
        p.spec.as_mut().unwrap().priority = Some(crate::pod::SYSTEM_CRITICAL_PRIORITY);
        p
    }

    fn names(pods: &[&Pod]) -> Vec<String> {
        pods.iter()
            .map(|p| p.metadata.name.clone().unwrap_or_default())
            .collect()
    }

    #[test]
    fn shortfalls_name_what_a_pod_lacks() {
        let a = sized("a", "1500m", "100Mi", false);
        let n = node();
        let want = critical("1", "1Gi");
        assert_eq!(
            shortfalls(&want, &[&a], &n, 110),
            [
                Shortfall {
                    resource: "cpu",
                    amount: 500
                },
                Shortfall {
                    resource: "memory",
                    amount: 100 << 20
                },
            ]
        );
        assert_eq!(
            shortfalls(&critical("0", "0"), &[&a], &n, 1),
            [Shortfall {
                resource: "pods",
                amount: 1
            }]
        );
        assert!(shortfalls(&critical("100m", "1Mi"), &[&a], &n, 110).is_empty());
    }

    #[test]
    fn preemption_takes_the_lowest_class_and_the_closest_pods_first() {
        let best_effort = sized("best-effort", "0", "0", false);
        let small = sized("small-burstable", "100m", "64Mi", false);
        let big = sized("big-burstable", "1", "256Mi", false);
        let guaranteed = sized("guaranteed", "500m", "128Mi", true);
        let admitted = [&guaranteed, &big, &small, &best_effort];
        let want = critical("900m", "0");
        // 2000m allocatable, 1600m used: 500m short. The big burstable pod alone meets it; the
        // BestEffort pod frees no cpu and is spared; the Guaranteed one is not needed.
        let needs = shortfalls(&want, &admitted, &node(), 110);
        assert_eq!(
            needs,
            [Shortfall {
                resource: "cpu",
                amount: 500
            }]
        );
        let victims = preemption_victims(&want, &admitted, &needs).unwrap();
        assert_eq!(names(&victims), ["big-burstable"]);
        // A pod slot: the BestEffort pod goes first.
        let needs = [Shortfall {
            resource: "pods",
            amount: 1,
        }];
        let victims = preemption_victims(&want, &admitted, &needs).unwrap();
        assert_eq!(names(&victims), ["best-effort"]);
        // More than every Burstable pod frees: a Guaranteed pod goes, and only the Burstable
        // ones still needed beside it.
        let needs = [Shortfall {
            resource: "cpu",
            amount: 1200,
        }];
        let victims = preemption_victims(&want, &admitted, &needs).unwrap();
        assert_eq!(names(&victims), ["big-burstable", "guaranteed"]);
        // More than all of them hold: an error naming what is missing, and nobody preempted.
        let needs = [Shortfall {
            resource: "cpu",
            amount: 5000,
        }];
        assert_eq!(
            preemption_victims(&want, &admitted, &needs).unwrap_err(),
            "no set of running pods found to reclaim resources: [(res: cpu, q: 3400)]"
        );
    }

    #[test]
    fn only_critical_or_higher_priority_pods_preempt_and_critical_pods_are_never_victims() {
        let other_critical = critical("1", "0");
        let plain = sized("plain", "1", "0", false);
        let needs = [Shortfall {
            resource: "cpu",
            amount: 500,
        }];
        let want = critical("1", "0");
        let victims = preemption_victims(&want, &[&other_critical, &plain], &needs).unwrap();
        assert_eq!(names(&victims), ["plain"]);
        assert!(preemption_victims(&want, &[&other_critical], &needs).is_err());
        // Without priorities a pod that is not critical preempts nobody.
        assert!(preemption_victims(&plain, &[&sized("x", "1", "0", false)], &needs).is_err());
    }
}
