//! Static pods end to end: manifests in a directory -> swiftlet -> a real containerd.
//! Each test runs its own agent (own node name, ports, manifest dir and cgroup root).

use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use swiftlet_tests::{
    Agent, CONTAINER_NAME_LABEL, POD_NAME_LABEL, POD_NAMESPACE_LABEL, POD_UID_LABEL,
    looping_pod_manifest, pod_cgroup_uids, pod_cri_objects, start_agent,
};

const RUNNING_TIMEOUT: Duration = Duration::from_secs(90);
const GONE_TIMEOUT: Duration = Duration::from_secs(60);

fn manifest(name: &str) -> String {
    looping_pod_manifest(name, &[])
}

fn wait_all_running(agent: &Agent, pods: &[String]) -> swiftlet_tests::PodList {
    agent.wait_for(|l| pods.iter().all(|p| l.is_running(p)), RUNNING_TIMEOUT)
}

fn label<'a>(labels: &'a std::collections::HashMap<String, String>, key: &str) -> &'a str {
    labels.get(key).map(String::as_str).unwrap_or("")
}

#[test]
fn three_manifests_become_three_running_pods() {
    let Some(agent) = start_agent("three-pods") else {
        return;
    };
    let names = ["alpha", "beta", "gamma"];
    for n in names {
        agent.write_manifest(&format!("{n}.yaml"), &manifest(n));
    }
    let pod_names: Vec<String> = names.iter().map(|n| agent.static_pod_name(n)).collect();
    let list = wait_all_running(&agent, &pod_names);
    assert_eq!(list.items.len(), 3, "{}", list.summary());
    agent.eventually("swiftlet_running_pods 3", Duration::from_secs(5), || {
        let body = agent.get("/metrics").1;
        body.contains("\nswiftlet_running_pods 3\n")
            .then_some(())
            .ok_or(body)
    });

    for pod in &pod_names {
        let uid = list.uid(pod).expect("a static pod has a UID");
        let (sandboxes, containers) = pod_cri_objects(agent.endpoint(), uid).unwrap();
        assert_eq!(sandboxes.len(), 1, "sandboxes of {pod}: {sandboxes:?}");
        let sb = &sandboxes[0];
        assert_eq!(sb.state, cri::PodSandboxState::SandboxReady as i32, "{pod}");
        assert_eq!(label(&sb.labels, POD_NAME_LABEL), pod);
        assert_eq!(label(&sb.labels, POD_NAMESPACE_LABEL), "default");
        assert_eq!(label(&sb.labels, POD_UID_LABEL), uid);
        assert_eq!(containers.len(), 1, "containers of {pod}: {containers:?}");
        let c = &containers[0];
        assert_eq!(
            c.state,
            cri::ContainerState::ContainerRunning as i32,
            "{pod}"
        );
        assert_eq!(c.pod_sandbox_id, sb.id);
        assert_eq!(label(&c.labels, CONTAINER_NAME_LABEL), "main");
        assert_eq!(label(&c.labels, POD_NAME_LABEL), pod);
        assert_eq!(label(&c.labels, POD_NAMESPACE_LABEL), "default");
    }
}

#[test]
fn deleting_a_manifest_removes_only_its_pod() {
    let Some(agent) = start_agent("delete-one") else {
        return;
    };
    let names = ["keep-a", "doomed", "keep-b"];
    for n in names {
        agent.write_manifest(&format!("{n}.yaml"), &manifest(n));
    }
    let pod_names: Vec<String> = names.iter().map(|n| agent.static_pod_name(n)).collect();
    let list = wait_all_running(&agent, &pod_names);
    let uids: Vec<String> = pod_names
        .iter()
        .map(|p| list.uid(p).expect("a static pod has a UID").to_owned())
        .collect();

    agent.remove_manifest("doomed.yaml");
    let doomed = &pod_names[1];
    agent.wait_for(|l| l.get(doomed).is_none(), GONE_TIMEOUT);

    // Its sandbox and container leave the runtime.
    let deadline = Instant::now() + GONE_TIMEOUT;
    loop {
        let (sandboxes, containers) = pod_cri_objects(agent.endpoint(), &uids[1]).unwrap();
        if sandboxes.is_empty() && containers.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{doomed} still in the runtime after {GONE_TIMEOUT:?}: {sandboxes:?} {containers:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // Its pod cgroup is gone from every hierarchy, including the ones runc populated itself.
    let leftover = pod_cgroup_uids(agent.cgroup_root());
    assert!(
        !leftover.contains(&uids[1]),
        "pod cgroup left behind: {leftover:?}"
    );

    // The others are untouched: still listed Running, same sandbox READY, container RUNNING.
    let now = agent.pods();
    for i in [0, 2] {
        assert!(now.is_running(&pod_names[i]), "{}", now.summary());
        assert_eq!(now.uid(&pod_names[i]), Some(uids[i].as_str()));
        let (sandboxes, containers) = pod_cri_objects(agent.endpoint(), &uids[i]).unwrap();
        assert_eq!(sandboxes.len(), 1, "{sandboxes:?}");
        assert_eq!(
            sandboxes[0].state,
            cri::PodSandboxState::SandboxReady as i32
        );
        assert_eq!(containers.len(), 1, "{containers:?}");
        assert_eq!(
            containers[0].state,
            cri::ContainerState::ContainerRunning as i32
        );
    }
}

#[test]
fn a_malformed_manifest_is_reported_and_the_good_ones_run() {
    let Some(agent) = start_agent("malformed") else {
        return;
    };
    agent.write_manifest("good-one.yaml", &manifest("good-one"));
    agent.write_manifest(
        "broken.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: [this is: not a mapping\nspec: {\n",
    );
    agent.write_manifest("good-two.yaml", &manifest("good-two"));
    let good = [
        agent.static_pod_name("good-one"),
        agent.static_pod_name("good-two"),
    ];
    let list = wait_all_running(&agent, &good);
    assert_eq!(
        list.items.len(),
        2,
        "only the good pods run: {}",
        list.summary()
    );

    // Reported by file name in the log ...
    let deadline = Instant::now() + Duration::from_secs(10);
    while !agent.log().contains("broken.yaml") {
        assert!(
            Instant::now() < deadline,
            "the log never names broken.yaml: {}",
            agent.log_path().display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // ... on /debug/manifests ...
    let (status, body) = agent.get("/debug/manifests");
    assert_eq!(status, 200, "{body}");
    let errors: serde_json::Value = serde_json::from_str(&body).unwrap();
    let errors = errors.as_array().expect("a JSON array");
    assert_eq!(errors.len(), 1, "{body}");
    assert!(
        errors[0]["path"]
            .as_str()
            .is_some_and(|p| p.ends_with("broken.yaml")),
        "{body}"
    );
    assert!(
        errors[0]["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{body}"
    );
    // ... and counted in /metrics.
    let (status, metrics) = agent.get("/metrics");
    assert_eq!(status, 200);
    let count: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("swiftlet_config_errors_total"))
        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .sum();
    assert!(
        count >= 1.0,
        "swiftlet_config_errors_total not counted:\n{metrics}"
    );
}

#[test]
fn ebpf_probe_sees_the_pod_cgroup_created() {
    let Some(agent) = start_agent("ebpf-cgroup") else {
        return;
    };
    agent.write_manifest("traced.yaml", &manifest("traced"));
    let pod = agent.static_pod_name("traced");
    let list = wait_all_running(&agent, std::slice::from_ref(&pod));
    let uid = list.uid(&pod).expect("a static pod has a UID").to_owned();
    let needle = format!("pod{uid}");

    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = agent.get("/debug/ebpf/cgroups");
        assert_eq!(
            status,
            200,
            "GET /debug/ebpf/cgroups answered {status} (are the probes loaded? see {})",
            agent.log_path().display()
        );
        let events: serde_json::Value = serde_json::from_str(&body).unwrap();
        let seen = events.as_array().is_some_and(|events| {
            events.iter().any(|e| {
                e["kind"] == "cgroup_mkdir"
                    && e["path"].as_str().is_some_and(|p| p.contains(&needle))
            })
        });
        if seen {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no cgroup_mkdir of {needle} among the eBPF events: {body}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn rewriting_a_manifest_in_place_never_restarts_its_pod() {
    let Some(agent) = start_agent("in-place-writes") else {
        return;
    };
    let content = manifest("inplace");
    agent.write_manifest("inplace.yaml", &content);
    let pod = agent.static_pod_name("inplace");
    let list = wait_all_running(&agent, std::slice::from_ref(&pod));
    let id = |list: &swiftlet_tests::PodList| {
        list.container(&pod, "main")
            .and_then(|c| c.container_id.clone())
            .expect("a container id")
    };
    let first = id(&list);
    // As `cat > file` writes: truncate, then the content in two pieces, with pauses long enough
    // for the agent to read the empty and the half-written file in between.
    let path = agent.manifest_dir().join("inplace.yaml");
    let (head, tail) = content.split_at(content.len() / 2);
    for _ in 0..10 {
        let mut f = std::fs::File::create(&path).expect("truncate");
        std::thread::sleep(Duration::from_millis(30));
        std::io::Write::write_all(&mut f, head.as_bytes()).expect("write");
        f.sync_all().expect("sync");
        std::thread::sleep(Duration::from_millis(30));
        std::io::Write::write_all(&mut f, tail.as_bytes()).expect("write");
        drop(f);
        std::thread::sleep(Duration::from_millis(30));
    }
    std::thread::sleep(Duration::from_secs(2));
    let list = agent.pods();
    assert!(list.is_running(&pod), "{}", list.summary());
    assert_eq!(id(&list), first, "the same container still runs");
    let log = agent.log();
    assert!(
        log.contains("keeping the pod of the manifest's last good content"),
        "the broken reads were seen (else this test proves nothing)"
    );
    assert!(!log.contains("pod terminated"), "nothing was terminated");
}

#[test]
fn pods_over_max_pods_are_rejected_and_bad_input_is_not_echoed() {
    let Some(rt) = swiftlet_tests::Runtime::shared() else {
        return;
    };
    let mut opts = swiftlet_tests::AgentOptions::new("max-pods");
    opts.extra_args = vec!["--max-pods".into(), "1".into()];
    let agent = Agent::start(rt, opts);
    agent.write_manifest("first.yaml", &manifest("first"));
    let first = agent.static_pod_name("first");
    wait_all_running(&agent, std::slice::from_ref(&first));
    agent.write_manifest("second.yaml", &manifest("second"));
    let second = agent.static_pod_name("second");
    let list = agent.wait_for(|l| l.phase(&second) == Some("Failed"), RUNNING_TIMEOUT);
    let status = list
        .get(&second)
        .and_then(|p| p.status.as_ref())
        .expect("status");
    // Static pods are critical: the second would preempt a pod that is not, but the first is
    // critical too, so it is refused as the kubelet refuses it.
    assert_eq!(
        status.reason.as_deref(),
        Some("UnexpectedAdmissionError"),
        "{status:?}"
    );
    assert!(
        status.message.as_deref().is_some_and(|m| m
            .contains("no set of running pods found to reclaim resources: [(res: pods, q: 1)]")),
        "{status:?}"
    );
    let uid = list.uid(&second).expect("uid").to_owned();
    let (sandboxes, _) = pod_cri_objects(agent.endpoint(), &uid).expect("list");
    assert!(
        sandboxes.is_empty(),
        "a rejected pod never runs: {sandboxes:?}"
    );
    assert!(list.is_running(&first));

    // A value in a rejected manifest (a token in the wrong field) and oversized annotations.
    agent.write_manifest(
        "leaky.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: leaky}\nspec: {containers: [{name: c, \
         image: x}], terminationGracePeriodSeconds: tok-5ecr3t-value}\n",
    );
    let big = "v".repeat(300 * 1024);
    agent.write_manifest(
        "big.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: big, annotations: {{a: {big}}}}}\n\
             spec: {{containers: [{{name: c, image: x}}]}}\n"
        ),
    );
    let body = agent.eventually("both manifests reported", RUNNING_TIMEOUT, || {
        let (_, body) = agent.get("/debug/manifests");
        if body.contains("leaky.yaml") && body.contains("big.yaml") {
            Ok(body)
        } else {
            Err(body)
        }
    });
    assert!(!body.contains("5ecr3t"), "{body}");
    assert!(body.contains("annotations"), "{body}");
    assert!(!agent.log().contains("5ecr3t"), "the log echoes the value");
    let (_, metrics) = agent.get("/metrics");
    assert!(
        metrics
            .contains("swiftlet_admission_rejections_total{reason=\"UnexpectedAdmissionError\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("reason=\"annotations_too_large\""),
        "{metrics}"
    );
}

#[test]
fn a_field_swiftlet_cannot_honour_holds_the_pod_with_a_reason_naming_it() {
    let Some(agent) = start_agent("refused-field") else {
        return;
    };
    agent.write_manifest(
        "aliases.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: aliases}}\nspec:\n  \
             setHostnameAsFQDN: true\n  subdomain: s\n  containers:\n  - name: c\n    image: {}\n    \
             imagePullPolicy: Never\n    command: [sleep, '3600']\n",
            swiftlet_tests::BUSYBOX_IMAGE
        ),
    );
    let name = agent.static_pod_name("aliases");
    let list = agent.wait_for(
        |l| {
            l.container(&name, "c")
                .and_then(|c| c.state.as_ref()?.waiting.as_ref()?.message.clone())
                .is_some()
        },
        RUNNING_TIMEOUT,
    );
    let waiting = list
        .container(&name, "c")
        .and_then(|c| c.state.as_ref()?.waiting.clone())
        .expect("waiting");
    assert_eq!(
        waiting.reason.as_deref(),
        Some("CreateContainerConfigError")
    );
    let message = waiting.message.unwrap_or_default();
    assert!(message.contains("spec.setHostnameAsFQDN"), "{message}");
    assert_eq!(list.phase(&name), Some("Pending"));
    let uid = list.uid(&name).expect("uid").to_owned();
    let (sandboxes, _) = pod_cri_objects(agent.endpoint(), &uid).expect("list");
    assert!(sandboxes.is_empty(), "nothing is created: {sandboxes:?}");
}

#[test]
fn healthz_says_ok_and_lists_its_checks_when_asked() {
    let Some(agent) = swiftlet_tests::start_agent("healthz") else {
        return;
    };
    assert_eq!(agent.get("/healthz"), (200, "ok".to_owned()));
    // The sync loop has turned and the runtime answered a relist.
    let (code, body) = agent.get("/healthz?verbose");
    assert_eq!(code, 200);
    assert_eq!(
        body,
        "[+]ping ok\n[+]syncloop ok\n[+]runtime ok\nhealthz check passed\n"
    );
}
