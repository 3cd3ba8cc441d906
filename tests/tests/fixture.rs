//! The fixture itself, without the agent: the private runtime runs a pod over CRI (pod network
//! through the CNI bridge, a container from the local busybox image in a `swiftlet-test-*`
//! cgroup), and the clean-up helpers remove the sandbox and the cgroup root again.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use swiftlet_tests::{
    BUSYBOX_IMAGE, CONTAINER_NAME_LABEL, NODE_NAME_LABEL, POD_UID_LABEL, Runtime,
    containers_with_labels, remove_node_sandboxes, sandboxes_with_labels,
};

fn labels(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_runs_a_pod_over_cri_and_cleanup_removes_it() {
    let Some(rt) = Runtime::shared() else { return };
    let node = format!("fixture-smoke-{}", std::process::id());
    let uid = format!("uid-{}", std::process::id());
    let cgroup_root = format!("/swiftlet-test-{node}");
    let mut client = rt.client().unwrap();

    let sandbox_config = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: "smoke".into(),
            uid: uid.clone(),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: "smoke".into(),
        labels: labels(&[(NODE_NAME_LABEL, &node), (POD_UID_LABEL, &uid)]),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: format!("{cgroup_root}/pod{uid}"),
            ..Default::default()
        }),
        ..Default::default()
    };
    let sandbox_id = client
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(sandbox_config.clone()),
            runtime_handler: String::new(),
        })
        .await
        .expect("RunPodSandbox with the local pause image")
        .into_inner()
        .pod_sandbox_id;

    // Pod network: an address from the CNI bridge's range.
    let status = client
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: sandbox_id.clone(),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner()
        .status
        .unwrap();
    let ip = status.network.map(|n| n.ip).unwrap_or_default();
    assert!(
        ip.starts_with("10.99."),
        "pod IP {ip:?} is not from 10.99.0.0/16"
    );

    let container_id = client
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.clone(),
            config: Some(cri::ContainerConfig {
                metadata: Some(cri::ContainerMetadata {
                    name: "sleeper".into(),
                    attempt: 0,
                }),
                image: Some(cri::ImageSpec {
                    image: BUSYBOX_IMAGE.into(),
                    ..Default::default()
                }),
                command: vec!["sleep".into(), "3600".into()],
                labels: labels(&[
                    (NODE_NAME_LABEL, &node),
                    (POD_UID_LABEL, &uid),
                    (CONTAINER_NAME_LABEL, "sleeper"),
                ]),
                ..Default::default()
            }),
            sandbox_config: Some(sandbox_config),
        })
        .await
        .expect("CreateContainer from the local busybox image")
        .into_inner()
        .container_id;
    client
        .start_container(cri::StartContainerRequest {
            container_id: container_id.clone(),
        })
        .await
        .expect("StartContainer");

    let sandboxes = sandboxes_with_labels(&mut client, &[(NODE_NAME_LABEL, &node)])
        .await
        .unwrap();
    assert_eq!(sandboxes.len(), 1);
    assert_eq!(
        sandboxes[0].state,
        cri::PodSandboxState::SandboxReady as i32
    );
    let containers = containers_with_labels(&mut client, &[(POD_UID_LABEL, &uid)])
        .await
        .unwrap();
    assert_eq!(containers.len(), 1);
    assert_eq!(containers[0].id, container_id);
    assert_eq!(
        containers[0].state,
        cri::ContainerState::ContainerRunning as i32
    );

    // The container's process lives in a cgroup under our cgroup root.
    let pids_dir = Path::new("/sys/fs/cgroup/pids").join(cgroup_root.trim_start_matches('/'));
    let procs = std::fs::read_to_string(
        pids_dir
            .join(format!("pod{uid}"))
            .join(&container_id)
            .join("cgroup.procs"),
    )
    .unwrap_or_default();
    assert!(
        !procs.trim().is_empty() || !Path::new("/sys/fs/cgroup/pids").exists(),
        "no process in the container's cgroup under {}",
        pids_dir.display()
    );

    // Clean-up as an Agent's Drop does it: sandboxes by node label, then the cgroup root.
    let removed = remove_node_sandboxes(&rt.endpoint, &node).await.unwrap();
    assert_eq!(removed, 1);
    assert!(
        sandboxes_with_labels(&mut client, &[(NODE_NAME_LABEL, &node)])
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        containers_with_labels(&mut client, &[(POD_UID_LABEL, &uid)])
            .await
            .unwrap()
            .is_empty()
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        xtask::runtime::remove_cgroup_root(&cgroup_root);
        let left: Vec<_> = xtask::runtime::cgroup_hierarchies()
            .into_iter()
            .map(|h| h.join(cgroup_root.trim_start_matches('/')))
            .filter(|p| p.exists())
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "cgroups left behind: {left:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
