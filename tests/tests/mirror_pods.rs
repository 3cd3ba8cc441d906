//! Mirror pods against the in-process API server: a static pod gets a mirror pod (its spec,
//! `kubernetes.io/config.mirror`, owned by the Node) that carries its status; the mirror pod is
//! never run itself; deleted, it is made again; the static pod gone, it is deleted; a stale one
//! (another version of the pod) is replaced.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use swiftlet_tests::api_server::Cluster;
use swiftlet_tests::{AgentOptions, Runtime, pod_cri_objects};

const TIMEOUT: Duration = Duration::from_secs(90);

fn mirror_annotation(p: &Pod) -> Option<String> {
    p.metadata
        .annotations
        .as_ref()?
        .get("kubernetes.io/config.mirror")
        .cloned()
}

#[test]
fn a_static_pod_is_mirrored_with_its_status_and_the_mirror_follows_it() {
    let Some(rt) = Runtime::shared() else {
        return;
    };
    let Cluster { server, agent, .. } = &Cluster::start(rt, AgentOptions::new("mirror"), |_| {});
    let node = agent.node_name().to_owned();
    agent.write_manifest(
        "web.yaml",
        &agent.busybox_pod("web", "", "sleep 3600 & wait", ""),
    );
    let name = agent.static_pod_name("web");
    let static_uid = agent
        .wait_for(|l| l.is_running(&name), TIMEOUT)
        .uid(&name)
        .expect("a UID")
        .to_owned();
    let mirror = agent.eventually("a Running mirror pod", TIMEOUT, || {
        let p = server
            .pod_named("default", &name)
            .ok_or_else(|| "no mirror pod".to_owned())?;
        let phase = p.status.as_ref().and_then(|s| s.phase.clone());
        (phase.as_deref() == Some("Running"))
            .then_some(p.clone())
            .ok_or(format!("phase {phase:?}"))
    });
    assert_eq!(
        mirror_annotation(&mirror).as_deref(),
        Some(static_uid.as_str())
    );
    let owner = &mirror.metadata.owner_references.clone().unwrap_or_default()[0];
    let node_uid = server
        .node(&node)
        .and_then(|n| n.metadata.uid)
        .expect("the Node");
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("Node", node_uid.as_str())
    );
    let mirror_uid = mirror.metadata.uid.clone().expect("a UID");
    assert_ne!(mirror_uid, static_uid);
    // The mirror pod is not run: nothing in the runtime carries its UID, and /pods shows the
    // static pod alone.
    std::thread::sleep(Duration::from_secs(2));
    let (sandboxes, _) = pod_cri_objects(agent.endpoint(), &mirror_uid).expect("CRI");
    assert!(sandboxes.is_empty(), "the mirror pod ran");
    let list = agent.pods();
    assert_eq!(
        list.items
            .iter()
            .filter(|p| p.metadata.name.as_deref() == Some(name.as_str()))
            .count(),
        1
    );

    // Deleted through the API: made again.
    server.delete(&mirror_uid);
    let again = agent.eventually("a new mirror pod", TIMEOUT, || {
        server
            .pod_named("default", &name)
            .filter(|p| p.metadata.uid.as_deref() != Some(mirror_uid.as_str()))
            .ok_or_else(|| "not yet".to_owned())
    });
    assert_eq!(
        mirror_annotation(&again).as_deref(),
        Some(static_uid.as_str())
    );

    // A stale mirror (another version of the static pod): replaced.
    let again_uid = again.metadata.uid.clone().expect("a UID");
    let mut stale = again.clone();
    stale
        .metadata
        .annotations
        .get_or_insert_default()
        .insert("kubernetes.io/config.mirror".into(), "an-old-hash".into());
    server.put(stale);
    agent.eventually("the stale mirror replaced", TIMEOUT, || {
        server
            .pod_named("default", &name)
            .filter(|p| {
                p.metadata.uid.as_deref() != Some(again_uid.as_str())
                    && mirror_annotation(p).as_deref() == Some(static_uid.as_str())
            })
            .ok_or_else(|| "not yet".to_owned())
    });

    // The static pod removed: its mirror goes too.
    agent.remove_manifest("web.yaml");
    agent.eventually("the mirror pod deleted", TIMEOUT, || {
        match server.pod_named("default", &name) {
            Some(p) => Err(format!("still there: {:?}", p.metadata.uid)),
            None => Ok(()),
        }
    });
}
