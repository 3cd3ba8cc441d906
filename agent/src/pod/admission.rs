//! The kubelet's admission predicates a node agent owns, as pure functions of the pod, the pods
//! already admitted and the node: resources fit allocatable, the node name, host ports, node
//! selector and required node affinity against the node's labels, and `NoExecute` taints. The
//! first failure, in the kubelet's order, is the rejection (its reason and message in the
//! kubelet's words).
use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, Pod, Taint};

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
    let affinity_ok =
        required.is_none_or(|r| r.node_selector_terms.iter().any(|t| term_matches(t, node)));
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
    let checks = [
        ("cpu", "OutOfcpu", cpu, node.cpu_millis, 0),
        ("memory", "OutOfmemory", memory, node.memory_bytes, 1),
    ];
    for (resource, reason, requested, capacity, i) in checks {
        let Some(capacity) = capacity else { continue };
        if requested == 0 {
            continue;
        }
        let used: u64 = admitted
            .clone()
            .map(|p| {
                let (c, m) = requests(p);
                if i == 0 { c } else { m }
            })
            .fold(0, u64::saturating_add);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        serde_yaml_ng::from_str(yaml).expect("a pod")
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
}
