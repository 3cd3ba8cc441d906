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
