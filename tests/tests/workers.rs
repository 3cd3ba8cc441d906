//! Pod workers against a real containerd: coalescing of rapid edits, a superseded spec never
//! started, and clean bursts.
//! Each test runs its own agent (own node name, ports, manifest dir and cgroup root).

use std::time::Duration;

use k8s_cri::v1 as cri;
use swiftlet_tests::{
    Agent, NODE_NAME_LABEL, POD_NAME_LABEL, POD_UID_LABEL, block_on, containers_with_labels,
    looping_pod_manifest, pod_cgroup_uids, runtime_client, sandboxes_with_labels,
    script_pod_manifest, start_agent,
};

const TIMEOUT: Duration = Duration::from_secs(90);

fn manifest(name: &str, version: usize) -> String {
    looping_pod_manifest(name, &[("version", &format!("v{version}"))])
}

/// The agent's sandboxes and containers in the runtime (by its node label).
fn node_objects(agent: &Agent) -> (Vec<cri::PodSandbox>, Vec<cri::Container>) {
    let endpoint = agent.endpoint().to_owned();
    let node = agent.node_name().to_owned();
    block_on(async move {
        let mut client = runtime_client(&endpoint)?;
        let s = sandboxes_with_labels(&mut client, &[(NODE_NAME_LABEL, &node)]).await?;
        let c = containers_with_labels(&mut client, &[(NODE_NAME_LABEL, &node)]).await?;
        Ok::<_, swiftlet_tests::Error>((s, c))
    })
    .and_then(|r| r)
    .unwrap_or_else(|e| panic!("listing the runtime: {e}"))
}

#[test]
fn rapid_edits_of_one_manifest_end_with_one_sandbox_running_the_newest_spec() {
    let Some(agent) = start_agent("rapid-edits") else {
        return;
    };
    const EDITS: usize = 12;
    let pod = agent.static_pod_name("edited");
    // Each edit gives the pod a new UID; the versions share one full name, so they run one at a
    // time and the ones replaced before their turn never start.
    for v in 1..=EDITS {
        agent.write_manifest("edited.yaml", &manifest("edited", v));
        std::thread::sleep(Duration::from_millis(if v % 3 == 0 { 400 } else { 40 }));
    }
    let newest = format!("v{EDITS}");
    let list = agent.wait_for(
        |l| {
            l.is_running(&pod)
                && l.get(&pod)
                    .and_then(|p| p.metadata.labels.as_ref())
                    .and_then(|m| m.get("version"))
                    == Some(&newest)
        },
        TIMEOUT,
    );
    let uid = list.uid(&pod).expect("a static pod has a UID").to_owned();

    let (sandbox, container) =
        agent.eventually("one sandbox with the newest spec", TIMEOUT, || {
            let (sandboxes, containers) = node_objects(&agent);
            if sandboxes.len() != 1 || containers.len() != 1 {
                return Err(format!(
                    "{} sandboxes, {} containers",
                    sandboxes.len(),
                    containers.len()
                ));
            }
            Ok((sandboxes[0].clone(), containers[0].clone()))
        });
    assert_eq!(
        sandbox.labels.get(POD_UID_LABEL).map(String::as_str),
        Some(uid.as_str())
    );
    assert_eq!(
        sandbox.labels.get(POD_NAME_LABEL).map(String::as_str),
        Some(pod.as_str())
    );
    assert_eq!(
        sandbox.labels.get("version").map(String::as_str),
        Some(newest.as_str())
    );
    assert_eq!(sandbox.state, cri::PodSandboxState::SandboxReady as i32);
    assert_eq!(container.pod_sandbox_id, sandbox.id);
    assert_eq!(
        container.state,
        cri::ContainerState::ContainerRunning as i32
    );
    // Only the newest pod's cgroup is left.
    agent.eventually("only the newest pod cgroup", TIMEOUT, || {
        let uids = pod_cgroup_uids(agent.cgroup_root());
        if uids.len() == 1 && uids.contains(&uid) {
            Ok(())
        } else {
            Err(format!("pod cgroups {uids:?}, newest {uid}"))
        }
    });
    let now = agent.pods();
    assert_eq!(now.items.len(), 1, "{}", now.summary());
}

/// Edits of a pod that keeps its UID (the manifest names it) whose container ignores SIGTERM:
/// the sync for the first edit kills the old container (its whole 5 s grace); the edits that
/// arrive meanwhile replace that sync's spec, so it starts nothing, and the next sync starts
/// the newest spec. Each version appends its name to a file in the pod's emptyDir, which
/// outlives the containers: only the first and the newest version ever ran.
#[test]
fn a_spec_replaced_while_its_sync_kills_the_old_container_is_never_started() {
    let Some(agent) = start_agent("superseded") else {
        return;
    };
    let version = |v: usize| {
        format!(
            "{}    volumeMounts:\n    - {{name: data, mountPath: /data}}\n",
            script_pod_manifest(
                agent.node_name(),
                "edited",
                "Always",
                &format!("echo v{v} >> /data/started; trap '' TERM; sleep 3600 & wait"),
                "  volumes:\n  - {name: data, emptyDir: {}}\n",
            )
        )
    };
    let pod = agent.static_pod_name("edited");
    let started = || {
        let uid = format!("edited-{}", agent.node_name());
        let file = agent
            .root_dir()
            .join("pods")
            .join(uid)
            .join("volumes/kubernetes.io~empty-dir/data/started");
        std::fs::read_to_string(file).unwrap_or_default()
    };
    agent.write_manifest("edited.yaml", &version(1));
    agent.wait_for(|l| l.is_running(&pod), TIMEOUT);
    assert_eq!(started(), "v1\n");
    agent.write_manifest("edited.yaml", &version(2));
    agent.eventually("the sync for v2 kills v1's container", TIMEOUT, || {
        if agent.log().contains("killing container") {
            Ok(())
        } else {
            Err("no kill yet".to_owned())
        }
    });
    // v1 ignores SIGTERM: its kill takes the 5 s grace, while these arrive.
    for v in 3..=6 {
        agent.write_manifest("edited.yaml", &version(v));
        std::thread::sleep(Duration::from_millis(200));
    }
    agent.eventually("v6 runs", TIMEOUT, || {
        let s = started();
        if s.ends_with("v6\n") {
            Ok(())
        } else {
            Err(format!("started: {s:?}"))
        }
    });
    assert_eq!(started(), "v1\nv6\n", "no intermediate version ever ran");
    assert!(
        agent
            .log()
            .contains("a newer spec is waiting: nothing started for this one"),
        "the sync for v2 stopped at its safe point"
    );
    let list = agent.wait_for(|l| l.is_running(&pod), TIMEOUT);
    let (_, containers) = node_objects(&agent);
    let running: Vec<_> = containers
        .iter()
        .filter(|c| c.state == cri::ContainerState::ContainerRunning as i32)
        .collect();
    assert_eq!(running.len(), 1, "{}", list.summary());
}

fn burst(agent: &Agent, n: usize, wait_running: bool) {
    let names: Vec<String> = (0..n).map(|i| format!("burst-{i}")).collect();
    for name in &names {
        agent.write_manifest(&format!("{name}.yaml"), &manifest(name, 1));
    }
    if wait_running {
        let pods: Vec<String> = names.iter().map(|n| agent.static_pod_name(n)).collect();
        agent.wait_for(|l| pods.iter().all(|p| l.is_running(p)), TIMEOUT);
    }
    for name in &names {
        agent.remove_manifest(&format!("{name}.yaml"));
    }
    agent.eventually("nothing left behind", TIMEOUT, || {
        let listed = agent.pods();
        let (sandboxes, containers) = node_objects(agent);
        let cgroups = pod_cgroup_uids(agent.cgroup_root());
        if listed.items.is_empty()
            && sandboxes.is_empty()
            && containers.is_empty()
            && cgroups.is_empty()
        {
            Ok(())
        } else {
            Err(format!(
                "/pods {}, {} sandboxes, {} containers, pod cgroups {cgroups:?}",
                listed.summary(),
                sandboxes.len(),
                containers.len()
            ))
        }
    });
}

#[test]
fn a_burst_of_pods_created_and_deleted_at_once_leaves_nothing_behind() {
    let Some(agent) = start_agent("burst-at-once") else {
        return;
    };
    // Deleted while their workers are still starting them ...
    burst(&agent, 10, false);
    // ... and deleted all at once once they run.
    burst(&agent, 10, true);
}
