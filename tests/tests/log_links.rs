//! The container log links on the real containerd: every container the agent starts gets a link
//! `<pod>_<namespace>_<container>-<container id>.log` in the containers directory (the pod logs
//! dir's sibling `containers`) to its log file, through which its output reads; a restarted
//! container (a new ID) gets a link of its own; the links go with the pod.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_cri::v1::{ContainerState, ContainerStatus};
use swiftlet_tests::{Agent, container_statuses, script_pod_manifest, start_agent};

const TIMEOUT: Duration = Duration::from_secs(90);
const LINE: &str = "a line of the linked container";

/// The names in the containers directory that start with `prefix`.
fn links(dir: &Path, prefix: &str) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// Waits for the link of container `c` (of static pod `pod`): named after the pod, the container
/// and its ID, leading to the container's log file, which holds its output.
fn linked(agent: &Agent, dir: &Path, pod: &str, c: &ContainerStatus) -> PathBuf {
    let link = dir.join(format!("{pod}_default_main-{}.log", c.id));
    agent.eventually("the container's log link", TIMEOUT, || {
        let target = std::fs::read_link(&link).map_err(|e| format!("{}: {e}", link.display()))?;
        assert_eq!(target, Path::new(&c.log_path), "the link leads elsewhere");
        let text = std::fs::read_to_string(&link).map_err(|e| e.to_string())?;
        if text.contains(LINE) {
            Ok(())
        } else {
            Err(format!("the log read through the link: {text:?}"))
        }
    });
    link
}

#[test]
fn each_started_container_is_linked_into_the_containers_dir_until_its_pod_goes() {
    let Some(agent) = start_agent("log-links") else {
        return;
    };
    let name = "loglink";
    // Each instance writes its line, lives a moment and fails: restarted after a back-off.
    let script = format!("echo \"{LINE}\"; sleep 2; exit 1");
    agent.write_manifest(
        &format!("{name}.yaml"),
        &script_pod_manifest(agent.node_name(), name, "Always", &script, ""),
    );
    let pod = agent.static_pod_name(name);
    let uid = format!("{name}-{}", agent.node_name());
    let dir = agent.root_dir().join("containers");
    let pod_logs = agent
        .root_dir()
        .join("pod-logs")
        .join(format!("default_{pod}_{uid}"))
        .join("main");

    let instance = |attempt: u32| {
        agent.eventually(&format!("instance {attempt} started"), TIMEOUT, || {
            container_statuses(agent.endpoint(), &uid)
                .map_err(|e| e.to_string())?
                .into_iter()
                .find(|c| {
                    c.metadata.as_ref().is_some_and(|m| m.attempt == attempt)
                        && c.state != ContainerState::ContainerCreated as i32
                })
                .ok_or_else(|| "not yet".to_owned())
        })
    };
    let first = instance(0);
    assert_eq!(Path::new(&first.log_path), pod_logs.join("0.log"));
    linked(&agent, &dir, &pod, &first);

    // Restarted: the new instance (a new ID) has a link of its own, to its own log.
    let second = instance(1);
    assert_ne!(second.id, first.id);
    assert_eq!(Path::new(&second.log_path), pod_logs.join("1.log"));
    linked(&agent, &dir, &pod, &second);
    // Only the instances the runtime still holds are linked.
    agent.eventually("one link per instance held", TIMEOUT, || {
        let held: BTreeSet<String> = container_statuses(agent.endpoint(), &uid)
            .map_err(|e| e.to_string())?
            .iter()
            .map(|c| format!("{pod}_default_main-{}.log", c.id))
            .collect();
        let now = links(&dir, &format!("{pod}_"));
        if now == held {
            Ok(())
        } else {
            Err(format!("links {now:?}, instances {held:?}"))
        }
    });

    // The pod goes: its links go with it.
    agent.remove_manifest(&format!("{name}.yaml"));
    agent.eventually("the pod's links removed", TIMEOUT, || {
        let held = container_statuses(agent.endpoint(), &uid).map_err(|e| e.to_string())?;
        let now = links(&dir, &format!("{pod}_"));
        if held.is_empty() && now.is_empty() {
            Ok(())
        } else {
            Err(format!("links {now:?}, {} instances held", held.len()))
        }
    });
}
