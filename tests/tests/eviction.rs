//! Eviction under real memory pressure on containerd: pods from the in-process API server (the
//! kubelet never evicts static pods, which are critical). `--system-reserved` leaves the pods
//! 400 MiB of allocatable memory and `--eviction-hard allocatableMemory.available<200Mi` makes
//! the agent evict once the pods' working set passes 200 MiB: a pod filling a memory-backed
//! emptyDir to 300 MiB is evicted (phase Failed, reason Evicted, the kubelet's message) and
//! stopped, while a quiet pod that stays within its request keeps running. The kubepods cgroup
//! carries the 400 MiB as its memory limit (node allocatable enforced).
//!
//! Under real disk pressure: the agent's root dir is a 64 MiB tmpfs and `--eviction-hard
//! nodefs.available<24Mi`; a pod filling an emptyDir on it is evicted for ephemeral-storage
//! after the node-level clean-up ran, and stopped with the hard eviction's 1 s grace although it
//! ignores SIGTERM and asks for 120 s; its emptyDir goes, the pressure ends and the quiet pod
//! keeps running. A pod that finished before the pressure and was not deleted loses its
//! container and sandbox to the reclaim, and keeps its status.
//!
//! A pod over its own local-storage limit is evicted whatever the node's signals, with the
//! kubelet's message: an emptyDir on disk past its `sizeLimit`, and a container whose writable
//! layer (measured by the runtime) passes its own ephemeral-storage limit while the pod stays
//! within its containers' limits together; a pod within its limits stays.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use swiftlet_tests::api_server::ApiServer;
use swiftlet_tests::{Agent, AgentOptions, Runtime};

const TIMEOUT: Duration = Duration::from_secs(120);

fn api_pod(node: &str, name: &str, spec_extra: &str, script: &str, container_extra: &str) -> Pod {
    swiftlet_tests::busybox_api_pod(node, name, "", spec_extra, script, container_extra)
}

#[test]
fn the_pod_over_its_request_is_evicted_under_memory_pressure() {
    let Some(rt) = Runtime::shared() else {
        return;
    };
    let capacity = swiftlet::cm::machine_memory_bytes().expect("the machine's memory");
    let reserved_mib = (capacity >> 20).saturating_sub(400);
    let tokio = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let server = tokio.block_on(ApiServer::start());
    let mut opts = AgentOptions::new("eviction");
    let _dir = server.point_agent(&mut opts);
    opts.extra_args.extend([
        "--system-reserved".to_owned(),
        format!("memory={reserved_mib}Mi"),
        "--eviction-hard".to_owned(),
        "allocatableMemory.available<200Mi".to_owned(),
        "--eviction-monitoring-interval".to_owned(),
        "1s".to_owned(),
    ]);
    let agent = Agent::start(rt, opts);
    let node = agent.node_name().to_owned();
    // Node allocatable is enforced on kubepods (the kernel rounds the limit to pages).
    let limit = std::fs::read_to_string(format!(
        "/sys/fs/cgroup/memory/swiftlet-test-{node}/kubepods/memory.limit_in_bytes"
    ))
    .expect("the kubepods memory limit");
    let limit: u64 = limit.trim().parse().expect("a number");
    let allocatable = capacity - (reserved_mib << 20);
    assert!(
        limit <= allocatable && allocatable - limit < 4096,
        "kubepods limit {limit}, allocatable {allocatable}"
    );
    server.put(api_pod(
        &node,
        "quiet",
        "",
        "sleep 3600 & wait",
        "    resources: {requests: {memory: 64Mi}}\n",
    ));
    server.put(api_pod(
        &node,
        "hog",
        "  volumes:\n  - name: mem\n    emptyDir: {medium: Memory}\n",
        "i=0; while [ $i -lt 30 ]; do dd if=/dev/zero of=/mem/f$i bs=1M count=10 2>/dev/null; \
         i=$((i+1)); sleep 0.2; done; sleep 3600 & wait",
        "    volumeMounts:\n    - {name: mem, mountPath: /mem}\n",
    ));
    let list = agent.wait_for(
        |l| {
            l.get("hog")
                .and_then(|p| p.status.as_ref())
                .is_some_and(|s| s.reason.as_deref() == Some("Evicted"))
        },
        TIMEOUT,
    );
    let hog = list
        .get("hog")
        .and_then(|p| p.status.clone())
        .unwrap_or_default();
    assert_eq!(hog.phase.as_deref(), Some("Failed"));
    let message = hog.message.unwrap_or_default();
    assert!(
        message.starts_with("The node was low on resource: memory."),
        "{message}"
    );
    assert!(list.is_running("quiet"), "{}", list.summary());
    // The evicted pod's containers are stopped, and it stays Failed.
    agent.wait_for(
        |l| {
            l.container("hog", "main")
                .is_some_and(|c| c.state.as_ref().is_some_and(|s| s.terminated.is_some()))
        },
        TIMEOUT,
    );
    std::thread::sleep(Duration::from_secs(3));
    let list = agent.pods();
    assert_eq!(list.phase("hog"), Some("Failed"));
    assert!(list.is_running("quiet"), "{}", list.summary());
    assert!(agent.log().contains("evicting pod"));
    // The server sees Failed with the DisruptionTarget condition (the kubelet's reason, the
    // eviction's message) once the containers are stopped.
    agent.eventually("the eviction on the server", TIMEOUT, || {
        let st = server
            .pod_named("default", "hog")
            .and_then(|p| p.status)
            .ok_or("no status")?;
        let target = st
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "DisruptionTarget");
        match (st.phase.as_deref(), target) {
            (Some("Failed"), Some(t))
                if t.status == "True"
                    && t.reason.as_deref() == Some("TerminationByKubelet")
                    && t.message.as_deref() == Some(message.as_str()) =>
            {
                Ok(())
            }
            _ => Err(format!("{st:?}")),
        }
    });
}

#[test]
fn the_pod_filling_the_disk_is_evicted_at_once_under_disk_pressure() {
    let Some(rt) = Runtime::shared() else {
        return;
    };
    let tokio = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let server = tokio.block_on(ApiServer::start());
    let mut opts = AgentOptions::new("eviction-disk");
    opts.tmpfs_kib = Some(64 << 10);
    let _dir = server.point_agent(&mut opts);
    opts.extra_args.extend([
        "--eviction-hard".to_owned(),
        "nodefs.available<24Mi".to_owned(),
        "--eviction-monitoring-interval".to_owned(),
        "1s".to_owned(),
        "--eviction-pressure-transition-period".to_owned(),
        "2s".to_owned(),
    ]);
    let agent = Agent::start(rt, opts);
    let node = agent.node_name().to_owned();
    server.put(api_pod(&node, "quiet", "", "sleep 3600 & wait", ""));
    // A pod that finished and was not deleted: the reclaim takes its containers.
    server.put(api_pod(
        &node,
        "done",
        "  restartPolicy: Never\n",
        "true",
        "",
    ));
    let list = agent.wait_for(|l| l.phase("done") == Some("Succeeded"), TIMEOUT);
    let done_uid = list.uid("done").expect("its uid").to_owned();
    let (_, done_containers) =
        swiftlet_tests::pod_cri_objects(agent.endpoint(), &done_uid).expect("CRI answers");
    assert_eq!(done_containers.len(), 1, "kept for its status and logs");
    // 48 MiB in 4 MiB steps: the disk passes the threshold half-way; SIGTERM is ignored.
    server.put(api_pod(
        &node,
        "filler",
        "  terminationGracePeriodSeconds: 120\n  volumes:\n  - name: scratch\n    emptyDir: {}\n",
        "trap '' TERM; i=0; while [ $i -lt 12 ]; do \
         dd if=/dev/zero of=/scratch/f$i bs=1M count=4 2>/dev/null; i=$((i+1)); sleep 0.2; done; \
         sleep 3600 & wait",
        "    volumeMounts:\n    - {name: scratch, mountPath: /scratch}\n",
    ));
    let list = agent.wait_for(
        |l| {
            l.get("filler")
                .and_then(|p| p.status.as_ref())
                .is_some_and(|s| s.reason.as_deref() == Some("Evicted"))
        },
        TIMEOUT,
    );
    let filler = list
        .get("filler")
        .and_then(|p| p.status.clone())
        .unwrap_or_default();
    assert_eq!(filler.phase.as_deref(), Some("Failed"));
    let message = filler.message.unwrap_or_default();
    assert!(
        message.starts_with(
            "The node was low on resource: ephemeral-storage. Threshold quantity: 24576Ki"
        ) && message.contains("Pod was using"),
        "{message}"
    );
    assert!(list.is_running("quiet"), "{}", list.summary());
    // Stopped with the hard eviction's grace (SIGKILL after the runtime's 2 s minimum), not the
    // pod's 120 s.
    agent.wait_for(
        |l| {
            l.container("filler", "main")
                .is_some_and(|c| c.state.as_ref().is_some_and(|s| s.terminated.is_some()))
        },
        Duration::from_secs(30),
    );
    // The emptyDir is gone with the pod's volumes, so the pressure ends and nothing else goes.
    std::thread::sleep(Duration::from_secs(5));
    let list = agent.pods();
    assert_eq!(list.phase("filler"), Some("Failed"));
    assert!(list.is_running("quiet"), "{}", list.summary());
    let log = agent.log();
    let reclaimed = log
        .find("eviction manager: reclaimed node-level resources")
        .expect("the node-level clean-up ran");
    let evicted = log.find("evicting pod").expect("an eviction");
    assert!(reclaimed < evicted, "the clean-up comes first");
    assert!(
        !log[reclaimed..evicted].contains("what=\"images\"")
            && !log[reclaimed..evicted].contains("what=images"),
        "the images are on a file system of their own: pressure on the node's does not collect them"
    );
    assert_eq!(
        log.matches("evicting pod").count(),
        1,
        "one eviction ended the pressure"
    );
    let (sandboxes, containers) =
        swiftlet_tests::pod_cri_objects(agent.endpoint(), &done_uid).expect("CRI answers");
    assert!(
        sandboxes.is_empty() && containers.is_empty(),
        "the finished pod's sandbox and container were reclaimed: {sandboxes:?} {containers:?}"
    );
    assert_eq!(
        agent.pods().phase("done"),
        Some("Succeeded"),
        "its status stays"
    );
}

#[test]
fn a_pod_over_its_emptydir_size_limit_is_evicted() {
    let Some(rt) = Runtime::shared() else {
        return;
    };
    let tokio = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let server = tokio.block_on(ApiServer::start());
    let mut opts = AgentOptions::new("eviction-local");
    let _dir = server.point_agent(&mut opts);
    opts.extra_args
        .extend(["--eviction-monitoring-interval".to_owned(), "1s".to_owned()]);
    let agent = Agent::start(rt, opts);
    let node = agent.node_name().to_owned();
    let volume = "  volumes:\n  - name: scratch\n    emptyDir: {sizeLimit: 4Mi}\n";
    let mount = "    volumeMounts:\n    - {name: scratch, mountPath: /scratch}\n";
    server.put(api_pod(
        &node,
        "within",
        volume,
        "dd if=/dev/zero of=/scratch/f bs=1M count=2 2>/dev/null; sleep 3600 & wait",
        mount,
    ));
    server.put(api_pod(
        &node,
        "over",
        volume,
        "dd if=/dev/zero of=/scratch/f bs=1M count=8 2>/dev/null; sleep 3600 & wait",
        mount,
    ));
    // `main` writes 8 MiB into its root file system (its writable layer), over its own 4 MiB
    // though far within the pod's 104 MiB.
    server.put(api_pod(
        &node,
        "layer",
        "",
        "dd if=/dev/zero of=/tmp/f bs=1M count=8 2>/dev/null; sleep 3600 & wait",
        &format!(
            "    resources: {{limits: {{ephemeral-storage: 4Mi}}}}\n  \
             - name: roomy\n    image: {}\n    imagePullPolicy: Never\n    \
             command: [sleep, \"3600\"]\n    \
             resources: {{limits: {{ephemeral-storage: 100Mi}}}}\n",
            swiftlet_tests::BUSYBOX_IMAGE
        ),
    ));
    let evicted = |l: &swiftlet_tests::PodList, name: &str| {
        l.get(name)
            .and_then(|p| p.status.as_ref())
            .is_some_and(|s| s.reason.as_deref() == Some("Evicted"))
    };
    let list = agent.wait_for(|l| evicted(l, "over") && evicted(l, "layer"), TIMEOUT);
    let layer = list
        .get("layer")
        .and_then(|p| p.status.clone())
        .unwrap_or_default();
    assert_eq!(layer.phase.as_deref(), Some("Failed"));
    assert_eq!(
        layer.message.as_deref(),
        Some("Container main exceeded its local ephemeral storage limit \"4Mi\". ")
    );
    let over = list
        .get("over")
        .and_then(|p| p.status.clone())
        .unwrap_or_default();
    assert_eq!(over.phase.as_deref(), Some("Failed"));
    assert_eq!(
        over.message.as_deref(),
        Some("Usage of EmptyDir volume \"scratch\" exceeds the limit \"4Mi\". ")
    );
    std::thread::sleep(Duration::from_secs(3));
    let list = agent.pods();
    assert!(list.is_running("within"), "{}", list.summary());
}
