//! CRI labels and annotations the kubelet puts on sandboxes and containers, so that a restarted
//! agent and crictl-style tools can find what belongs to which pod.
pub const POD_NAME: &str = "io.kubernetes.pod.name";
pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const POD_UID: &str = "io.kubernetes.pod.uid";
pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// Which agent created the object. swiftlet only manages (and kills as orphans) sandboxes carrying
/// its own node name, so several agents (the integration tests) can share one runtime.
pub const NODE_NAME: &str = "swiftlet.io/node-name";
/// Annotations (not labels: they are not selectors).
pub const CONTAINER_HASH: &str = "io.kubernetes.container.hash";
pub const CONTAINER_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
pub const POD_TERMINATION_GRACE_PERIOD: &str = "io.kubernetes.pod.terminationGracePeriod";
pub const TERMINATION_MESSAGE_PATH: &str = "io.kubernetes.container.terminationMessagePath";
/// The container's preStop handler (`LifecycleHandler` as JSON), so a kill without the spec
/// (orphans, after an agent restart) still runs it.
pub const PRE_STOP_HANDLER: &str = "io.kubernetes.container.preStopHandler";
/// The container's ports (`[ContainerPort]` as JSON), so a preStop httpGet hook without the spec
/// still resolves a named port.
pub const CONTAINER_PORTS: &str = "io.kubernetes.container.ports";
/// `init`, `sidecar` or `app`: the container's turn when the pod is killed.
pub const CONTAINER_TYPE: &str = "swiftlet.io/container-type";
/// Sandbox annotation: the pod's QoS class when its sandbox was created (a change recreates the
/// pod under the new QoS cgroup).
pub const POD_QOS_CLASS: &str = "swiftlet.io/qos-class";
/// Container annotation: the cgroup resources the container was created with ("shares quota
/// period memory"); after an in-place resize the agent remembers the applied ones.
pub const CONTAINER_RESOURCES: &str = "swiftlet.io/resources";

/// The CRI list filters of the sandboxes and containers agent `node` created (its
/// [`NODE_NAME`] label), matching the `extra` label too when given.
pub fn node_filters(
    node: &str,
    extra: Option<(&str, &str)>,
) -> (k8s_cri::v1::PodSandboxFilter, k8s_cri::v1::ContainerFilter) {
    let mut selector = std::collections::HashMap::from([(NODE_NAME.to_owned(), node.to_owned())]);
    if let Some((k, v)) = extra {
        selector.insert(k.to_owned(), v.to_owned());
    }
    let sandboxes = k8s_cri::v1::PodSandboxFilter {
        label_selector: selector.clone(),
        ..Default::default()
    };
    let containers = k8s_cri::v1::ContainerFilter {
        label_selector: selector,
        ..Default::default()
    };
    (sandboxes, containers)
}
