//! What a pod leaves on the node outside the runtime goes when the pod is gone, even when it went
//! while the agent was down.

use std::time::Duration;

use swiftlet_tests::{Agent, looping_pod_manifest, start_agent};

const TIMEOUT: Duration = Duration::from_secs(60);

/// The pod log directories (`<namespace>_<name>_<uid>`) below the agent's pod logs dir.
fn log_dirs(agent: &Agent) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(agent.root_dir().join("pod-logs"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn the_log_directory_of_a_pod_deleted_while_the_agent_was_down_is_removed() {
    let Some(mut agent) = start_agent("orphan-logs") else {
        return;
    };
    agent.write_manifest("gone.yaml", &looping_pod_manifest("gone", &[]));
    agent.write_manifest("kept.yaml", &looping_pod_manifest("kept", &[]));
    let (gone, kept) = (agent.static_pod_name("gone"), agent.static_pod_name("kept"));
    let list = agent.wait_for(|l| l.is_running(&gone) && l.is_running(&kept), TIMEOUT);
    let gone_uid = list.uid(&gone).expect("uid").to_owned();
    let kept_uid = list.uid(&kept).expect("uid").to_owned();
    assert_eq!(log_dirs(&agent).len(), 2, "{:?}", log_dirs(&agent));

    // While the agent is down the pod is deleted, and the runtime loses everything of it (as
    // after `crictl rmp`): nothing in the runtime tells the restarted agent about it.
    agent.stop(Duration::from_secs(20));
    agent.remove_manifest("gone.yaml");
    let endpoint = agent.endpoint().to_owned();
    let uid = gone_uid.clone();
    swiftlet_tests::block_on(async move {
        let mut client = swiftlet_tests::runtime_client(&endpoint)?;
        let sandboxes = swiftlet_tests::sandboxes_with_labels(
            &mut client,
            &[(swiftlet_tests::POD_UID_LABEL, uid.as_str())],
        )
        .await?;
        assert!(!sandboxes.is_empty(), "the pod has a sandbox");
        for s in sandboxes {
            let id = s.id;
            client
                .stop_pod_sandbox(k8s_cri::v1::StopPodSandboxRequest {
                    pod_sandbox_id: id.clone(),
                })
                .await
                .expect("StopPodSandbox");
            client
                .remove_pod_sandbox(k8s_cri::v1::RemovePodSandboxRequest { pod_sandbox_id: id })
                .await
                .expect("RemovePodSandbox");
        }
        Ok::<_, swiftlet_tests::Error>(())
    })
    .expect("runtime")
    .expect("removing the sandbox");
    agent.restart_after_sigkill();

    agent.eventually("the orphaned log directory to go", TIMEOUT, || {
        let dirs = log_dirs(&agent);
        if dirs.iter().any(|d| d.ends_with(&gone_uid)) {
            Err(format!("still there: {dirs:?}"))
        } else {
            Ok(())
        }
    });
    // The live pod kept its logs and keeps running.
    assert!(
        log_dirs(&agent).iter().any(|d| d.ends_with(&kept_uid)),
        "{:?}",
        log_dirs(&agent)
    );
    assert!(agent.pods().is_running(&kept));
    assert!(
        agent
            .log()
            .contains("removed the log directory of a pod that is gone")
    );
}

/// The mount points of this machine that mention `needle` (a sandbox id: its `/dev/shm`).
fn mounts_with(needle: &str) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(needle))
        .map(str::to_owned)
        .collect()
}

#[test]
fn a_dead_sandbox_of_a_live_pod_is_stopped_and_removed() {
    let Some(agent) = start_agent("stale-sandbox") else {
        return;
    };
    agent.write_manifest("p.yaml", &looping_pod_manifest("p", &[]));
    let name = agent.static_pod_name("p");
    let list = agent.wait_for(|l| l.is_running(&name), TIMEOUT);
    let uid = list.uid(&name).expect("uid").to_owned();
    let (sandboxes, _) = swiftlet_tests::pod_cri_objects(agent.endpoint(), &uid).expect("list");
    assert_eq!(sandboxes.len(), 1, "{sandboxes:?}");
    let old = sandboxes[0].id.clone();
    assert!(
        !mounts_with(&old).is_empty(),
        "a live sandbox has its shm mount"
    );

    // The pause process dies as in a runtime crash: nobody stops the sandbox, so its network
    // namespace and shm mount stay until someone does.
    let pid = swiftlet_tests::sandbox_pid(agent.endpoint(), &old).expect("pause pid");
    let pid = i32::try_from(pid).expect("pid");
    // SAFETY: kill(2) on a pid this test just read; no memory is shared.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);

    // The pod comes back in a new sandbox, and the dead one goes with the container it held.
    agent.eventually("one ready sandbox and one container", TIMEOUT, || {
        let (sandboxes, containers) =
            swiftlet_tests::pod_cri_objects(agent.endpoint(), &uid).map_err(|e| e.to_string())?;
        let ready = k8s_cri::v1::PodSandboxState::SandboxReady as i32;
        if sandboxes.len() == 1
            && sandboxes[0].state == ready
            && sandboxes[0].id != old
            && containers.len() == 1
        {
            Ok(())
        } else {
            Err(format!(
                "sandboxes {sandboxes:?}, containers {containers:?}"
            ))
        }
    });
    assert!(agent.pods().is_running(&name));
    let left = mounts_with(&old);
    assert!(left.is_empty(), "the dead sandbox's mounts stay: {left:?}");
    let log = agent.log();
    assert!(
        log.contains("removed a stale sandbox"),
        "{}",
        agent.log_tail(30)
    );
}
