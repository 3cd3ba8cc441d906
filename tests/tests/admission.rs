//! Admission on the real agent: pods the kubelet's predicates refuse fail at once (phase
//! Failed, the kubelet's reason and message, never a container) while the others run: more
//! cpu than the node has (OutOfcpu), a node selector the node's labels do not match
//! (NodeAffinity), a host port another pod holds (NodePorts), and an API pod that does not
//! tolerate the node's NoExecute taint (TaintToleration, written back to the API server too).

use std::time::Duration;

use swiftlet_tests::api_server::Cluster;
use swiftlet_tests::{
    AgentOptions, PodList, Runtime, busybox_api_pod, has_running_container, pod_cri_objects,
};

const TIMEOUT: Duration = Duration::from_secs(90);

fn rejected(list: &PodList, name: &str) -> Option<(String, String)> {
    let st = list.get(name)?.status.as_ref()?;
    (st.phase.as_deref() == Some("Failed")).then(|| {
        (
            st.reason.clone().unwrap_or_default(),
            st.message.clone().unwrap_or_default(),
        )
    })
}

#[test]
fn pods_the_predicates_refuse_fail_with_the_kubelets_reasons() {
    let Some(rt) = Runtime::shared() else {
        return;
    };
    let mut opts = AgentOptions::new("admission");
    opts.extra_args.extend([
        "--node-labels".to_owned(),
        "zone=a".to_owned(),
        "--register-with-taints".to_owned(),
        "dedicated=db:NoExecute".to_owned(),
    ]);
    let Cluster { server, agent, .. } = &Cluster::start(rt, opts, |_| {});
    let node = agent.node_name().to_owned();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());

    let write = |file: &str, name: &str, spec: &str, container: &str| {
        agent.write_manifest(
            file,
            &agent.busybox_pod(name, spec, "sleep 3600 & wait", container),
        );
    };
    write("fits.yaml", "fits", "  nodeSelector: {zone: a}\n", "");
    write(
        "greedy.yaml",
        "greedy",
        "",
        &format!("    resources: {{requests: {{cpu: '{}'}}}}\n", cpus + 1),
    );
    write(
        "elsewhere.yaml",
        "elsewhere",
        "  nodeSelector: {zone: b}\n",
        "",
    );
    let port = "    ports: [{containerPort: 80, hostPort: 18080}]\n";
    write("port-a.yaml", "port-a", "", port);
    let fits = agent.static_pod_name("fits");
    let greedy = agent.static_pod_name("greedy");
    let elsewhere = agent.static_pod_name("elsewhere");
    let port_a = agent.static_pod_name("port-a");
    let list = agent.wait_for(
        |l| {
            l.is_running(&fits)
                && rejected(l, &greedy).is_some()
                && rejected(l, &elsewhere).is_some()
                && l.get(&port_a).is_some()
        },
        TIMEOUT,
    );
    // A static pod is critical: refused for cpu, it would preempt others, but even all of
    // them would not free enough (the kubelet's UnexpectedAdmissionError).
    let (reason, message) = rejected(&list, &greedy).expect("rejected");
    assert_eq!(reason, "UnexpectedAdmissionError");
    assert!(
        message.ends_with(
            "preemption: error finding a set of pods to preempt: no set of running pods found \
             to reclaim resources: [(res: cpu, q: 1000)]"
        ),
        "{message}"
    );
    assert_eq!(
        rejected(&list, &elsewhere),
        Some((
            "NodeAffinity".to_owned(),
            "Pod was rejected: Predicate NodeAffinity failed".to_owned()
        ))
    );
    // A second pod on the same host port, once the first is admitted.
    write("port-b.yaml", "port-b", "", port);
    let port_b = agent.static_pod_name("port-b");
    let list = agent.wait_for(|l| rejected(l, &port_b).is_some(), TIMEOUT);
    assert_eq!(
        rejected(&list, &port_b).map(|r| r.0).as_deref(),
        Some("NodePorts")
    );
    // Rejected pods never reach the runtime.
    for name in ["greedy", "elsewhere", "port-b"] {
        let uid = format!("{name}-{node}");
        let (sandboxes, containers) = pod_cri_objects(agent.endpoint(), &uid).expect("CRI");
        assert!(sandboxes.is_empty() && containers.is_empty(), "{name} ran");
    }

    // API pods: the node's NoExecute taint (static pods are exempt) must be tolerated.
    server.put(busybox_api_pod(
        &node,
        "intolerant",
        "",
        "",
        "sleep 3600",
        "",
    ));
    server.put(busybox_api_pod(
        &node,
        "tolerant",
        "",
        "  tolerations: [{key: dedicated, operator: Equal, value: db, effect: NoExecute}]\n",
        "sleep 3600",
        "",
    ));
    server.put(busybox_api_pod(
        &node,
        "greedy-api",
        "",
        "  tolerations: [{key: dedicated, operator: Exists}]\n",
        "sleep 3600",
        &format!("    resources: {{requests: {{cpu: '{}'}}}}\n", cpus + 1),
    ));
    let list = agent.wait_for(
        |l| {
            l.is_running("tolerant")
                && rejected(l, "intolerant").is_some()
                && rejected(l, "greedy-api").is_some()
        },
        TIMEOUT,
    );
    assert_eq!(
        rejected(&list, "intolerant").map(|r| r.0).as_deref(),
        Some("TaintToleration")
    );
    let (reason, message) = rejected(&list, "greedy-api").expect("rejected");
    assert_eq!(reason, "OutOfcpu");
    assert_eq!(
        message,
        format!(
            "Pod was rejected: Node didn't have enough resource: cpu, requested: {}, used: 0, \
             capacity: {}",
            (cpus + 1) * 1000,
            cpus * 1000
        )
    );
    // The rejection is written back to the API server.
    agent.eventually("the rejection on the server", TIMEOUT, || {
        let st = server
            .pod_named("default", "intolerant")
            .and_then(|p| p.status)
            .ok_or("no status")?;
        (st.reason.as_deref() == Some("TaintToleration") && st.phase.as_deref() == Some("Failed"))
            .then_some(())
            .ok_or(format!("{st:?}"))
    });
    let metrics = agent.get("/metrics").1;
    for reason in [
        "UnexpectedAdmissionError",
        "OutOfcpu",
        "NodeAffinity",
        "NodePorts",
        "TaintToleration",
    ] {
        assert!(
            metrics.contains(&format!(
                "swiftlet_admission_rejections_total{{reason=\"{reason}\"}} 1"
            )),
            "{reason}: {metrics}"
        );
    }
}

#[test]
fn labels_and_taints_set_through_the_api_reach_admission() {
    let Some(rt) = Runtime::shared() else {
        return;
    };
    // Status writes every minute: a re-registration within seconds comes from the Node watch.
    let mut opts = AgentOptions::new("admission-api-labels");
    opts.extra_args
        .extend(["--node-status-update-frequency".to_owned(), "1m".to_owned()]);
    let c = Cluster::start(rt, opts, |_| {});
    let (server, agent) = (&c.server, &c.agent);
    let node = agent.node_name().to_owned();
    agent.eventually("the node registered", TIMEOUT, || {
        server
            .node(&node)
            .map(drop)
            .ok_or_else(|| "not yet".to_owned())
    });
    let ssd = "  nodeSelector: {disk: ssd}\n";
    server.put(busybox_api_pod(&node, "ssd-1", "", ssd, "sleep 3600", ""));
    let list = agent.wait_for(|l| rejected(l, "ssd-1").is_some(), TIMEOUT);
    assert_eq!(
        rejected(&list, "ssd-1").map(|r| r.0).as_deref(),
        Some("NodeAffinity")
    );

    // An administrator labels the node (kubectl label node); the next pod fits.
    let client = c.tokio.block_on(async { server.client() });
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client);
    let patch = |body: serde_json::Value| {
        c.tokio
            .block_on(nodes.patch(
                &node,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&body),
            ))
            .expect("patch the node")
    };
    patch(serde_json::json!({"metadata": {"labels": {"disk": "ssd"}}}));
    agent.eventually("admission sees the label", TIMEOUT, || {
        agent
            .log()
            .contains("admission follows the Node's labels and taints")
            .then_some(())
            .ok_or_else(|| "not yet".to_owned())
    });
    server.put(busybox_api_pod(&node, "ssd-2", "", ssd, "sleep 3600", ""));
    agent.wait_for(|l| l.is_running("ssd-2"), TIMEOUT);

    // A NoExecute taint set through the API refuses the next pod that does not tolerate it.
    patch(serde_json::json!({"spec": {"taints": [{"key": "maintenance", "effect": "NoExecute"}]}}));
    agent.eventually("admission sees the taint", TIMEOUT, || {
        let n = agent
            .log()
            .matches("admission follows the Node's labels and taints")
            .count();
        (n >= 2).then_some(()).ok_or_else(|| "not yet".to_owned())
    });
    server.put(busybox_api_pod(&node, "plain", "", "", "sleep 3600", ""));
    let list = agent.wait_for(|l| rejected(l, "plain").is_some(), TIMEOUT);
    assert_eq!(
        rejected(&list, "plain").map(|r| r.0).as_deref(),
        Some("TaintToleration")
    );
    assert!(list.is_running("ssd-2"), "admitted pods are not re-judged");

    // The Node deleted: the watch sees it and the agent registers again at once (its status
    // loop alone would wait a minute).
    let old_uid = server.node(&node).and_then(|n| n.metadata.uid);
    server.delete_node(&node);
    let started = std::time::Instant::now();
    agent.eventually("the node registered again", TIMEOUT, || {
        let uid = server.node(&node).and_then(|n| n.metadata.uid);
        (uid.is_some() && uid != old_uid)
            .then_some(())
            .ok_or_else(|| "not yet".to_owned())
    });
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "re-registered after {:?}",
        started.elapsed()
    );
}

#[test]
fn a_static_pod_preempts_an_api_pod_on_a_full_node() {
    let Some(rt) = Runtime::shared() else {
        return;
    };
    let mut opts = AgentOptions::new("admission-preempt");
    opts.extra_args
        .extend(["--max-pods".to_owned(), "2".to_owned()]);
    let c = Cluster::start(rt, opts, |_| {});
    let (server, agent) = (&c.server, &c.agent);
    let node = agent.node_name().to_owned();
    for name in ["low-a", "low-b"] {
        server.put(busybox_api_pod(&node, name, "", "", "sleep 3600", ""));
    }
    agent.wait_for(|l| l.is_running("low-a") && l.is_running("low-b"), TIMEOUT);

    // The node is full; a static pod is critical: one of the API pods makes room.
    let manifest = agent.busybox_pod("critical", "", "sleep 3600", "");
    agent.write_manifest("critical.yaml", &manifest);
    let critical = agent.static_pod_name("critical");
    let preempted = |l: &PodList| {
        ["low-a", "low-b"].into_iter().find(|n| {
            l.get(n)
                .and_then(|p| p.status.as_ref())
                .is_some_and(|s| s.reason.as_deref() == Some("Preempting"))
        })
    };
    let list = agent.wait_for(
        |l| l.is_running(&critical) && preempted(l).is_some(),
        TIMEOUT,
    );
    let victim = preempted(&list).expect("a preempted pod");
    let spared = if victim == "low-a" { "low-b" } else { "low-a" };
    assert!(list.is_running(spared), "one pod is enough");
    let st = list
        .get(victim)
        .and_then(|p| p.status.clone())
        .expect("status");
    assert_eq!(st.phase.as_deref(), Some("Failed"));
    assert_eq!(
        st.message.as_deref(),
        Some("Preempted in order to admit critical pod")
    );
    // Its containers are stopped, and the server shows why.
    agent.eventually("the preempted pod's containers gone", TIMEOUT, || {
        let uid = server
            .pod_named("default", victim)
            .and_then(|p| p.metadata.uid)
            .ok_or("no pod")?;
        let (_, containers) = pod_cri_objects(agent.endpoint(), &uid).map_err(|e| e.to_string())?;
        let running = containers.iter().filter(|c| c.state == 1).count();
        (running == 0)
            .then_some(())
            .ok_or(format!("{running} running containers"))
    });
    agent.eventually("the preemption on the server", TIMEOUT, || {
        let st = server
            .pod_named("default", victim)
            .and_then(|p| p.status)
            .ok_or("no status")?;
        (st.reason.as_deref() == Some("Preempting"))
            .then_some(())
            .ok_or(format!("{st:?}"))
    });
    // With the DisruptionTarget condition a Job's pod failure policy reads.
    let st = server
        .pod_named("default", victim)
        .and_then(|p| p.status)
        .unwrap_or_default();
    let target = st
        .conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "DisruptionTarget")
        .expect("a DisruptionTarget condition on the server");
    assert_eq!(
        (
            target.status.as_str(),
            target.reason.as_deref(),
            target.message.as_deref()
        ),
        (
            "True",
            Some("TerminationByKubelet"),
            Some("Pod was preempted by Kubelet to accommodate a critical pod.")
        )
    );
    // An ordinary pod does not preempt: the node is full for it.
    server.put(busybox_api_pod(&node, "late", "", "", "sleep 3600", ""));
    let list = agent.wait_for(|l| rejected(l, "late").is_some(), TIMEOUT);
    assert_eq!(
        rejected(&list, "late").map(|r| r.0).as_deref(),
        Some("OutOfpods")
    );
    assert!(list.is_running(spared) && list.is_running(&critical));
}

#[test]
fn a_pod_being_stopped_still_counts_for_admission() {
    let Some(rt) = Runtime::shared() else {
        return;
    };
    let Cluster { server, agent, .. } =
        &Cluster::start(rt, AgentOptions::new("admission-stopping"), |_| {});
    let node = agent.node_name().to_owned();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Each asks for 60 % of the node's cpu: two do not fit together.
    let request = format!("    resources: {{requests: {{cpu: '{}m'}}}}\n", cpus * 600);
    let mut hog = busybox_api_pod(
        &node,
        "hog",
        "",
        "  activeDeadlineSeconds: 3\n",
        "trap '' TERM; while true; do sleep 1; done",
        &request,
    );
    if let Some(spec) = hog.spec.as_mut() {
        spec.termination_grace_period_seconds = Some(15);
    }
    server.put(hog);
    // Past its deadline it is Failed on the node while its container runs out its grace period.
    agent.wait_for(|l| l.phase("hog") == Some("Failed"), TIMEOUT);
    let hog_uid = format!("hog-{node}");
    assert!(
        has_running_container(agent.endpoint(), &hog_uid),
        "the container ignores SIGTERM for 15 s"
    );
    server.put(busybox_api_pod(
        &node,
        "next",
        "",
        "",
        "sleep 3600",
        &request,
    ));
    let list = agent.wait_for(|l| rejected(l, "next").is_some(), TIMEOUT);
    let (reason, message) = rejected(&list, "next").unwrap_or_default();
    assert_eq!(reason, "OutOfcpu", "{message}");
    assert!(
        has_running_container(agent.endpoint(), &hog_uid),
        "judged while the first pod still ran"
    );
    // Once it is gone its cpu is free again.
    agent.eventually("the stopped pod's container gone", TIMEOUT, || {
        (!has_running_container(agent.endpoint(), &hog_uid))
            .then_some(())
            .ok_or_else(|| "still running".to_owned())
    });
    agent.eventually("the first pod terminated on the server", TIMEOUT, || {
        let phase = server
            .pod_named("default", "hog")
            .and_then(|p| p.status?.phase);
        (phase.as_deref() == Some("Failed"))
            .then_some(())
            .ok_or(format!("{phase:?}"))
    });
    server.put(busybox_api_pod(
        &node,
        "after",
        "",
        "",
        "sleep 3600",
        &request,
    ));
    agent.wait_for(|l| l.is_running("after"), TIMEOUT);
}

#[test]
fn pods_under_node_pressure_are_refused_as_the_eviction_manager_refuses_them() {
    let Some(rt) = Runtime::shared() else {
        return;
    };
    // Thresholds the machine always meets: the node holds PIDPressure from the first observation.
    let mut opts = AgentOptions::new("admission-pressure");
    opts.extra_args.extend([
        "--eviction-hard".to_owned(),
        "pid.available<100%".to_owned(),
        "--eviction-monitoring-interval".to_owned(),
        "1s".to_owned(),
    ]);
    let mut c = Cluster::start(rt, opts, |_| {});
    let node = c.agent.node_name().to_owned();
    let condition_true = |c: &Cluster, type_: &str| {
        c.server
            .node(&node)
            .and_then(|n| n.status?.conditions)
            .is_some_and(|cs| cs.iter().any(|x| x.type_ == type_ && x.status == "True"))
    };
    c.agent.eventually("PIDPressure on the Node", TIMEOUT, || {
        condition_true(&c, "PIDPressure")
            .then_some(())
            .ok_or_else(|| "not yet".to_owned())
    });
    let burstable = "    resources: {requests: {cpu: 10m}}\n";
    let tolerant = "  tolerations: [{key: node.kubernetes.io/memory-pressure, operator: Exists, \
                    effect: NoSchedule}]\n";
    c.server.put(busybox_api_pod(
        &node,
        "burst",
        "",
        "",
        "sleep 3600",
        burstable,
    ));
    // A static pod is critical: admitted whatever the pressure.
    let manifest = c.agent.busybox_pod("critical", "", "sleep 3600", "");
    c.agent.write_manifest("critical.yaml", &manifest);
    let critical = c.agent.static_pod_name("critical");
    let list = c.agent.wait_for(
        |l| rejected(l, "burst").is_some() && l.is_running(&critical),
        TIMEOUT,
    );
    assert_eq!(
        rejected(&list, "burst"),
        Some((
            "Evicted".to_owned(),
            "Pod was rejected: The node had condition: [PIDPressure]. ".to_owned()
        ))
    );

    // Under memory pressure alone only BestEffort pods that do not tolerate it are refused.
    c.agent
        .restart_with_flag("--eviction-hard", "memory.available<100%");
    c.agent
        .eventually("MemoryPressure alone on the Node", TIMEOUT, || {
            (condition_true(&c, "MemoryPressure") && !condition_true(&c, "PIDPressure"))
                .then_some(())
                .ok_or_else(|| "not yet".to_owned())
        });
    for (name, spec, container) in [
        ("best-effort", "", ""),
        ("tolerant", tolerant, ""),
        ("burst-2", "", burstable),
    ] {
        c.server.put(busybox_api_pod(
            &node,
            name,
            "",
            spec,
            "sleep 3600",
            container,
        ));
    }
    let list = c.agent.wait_for(
        |l| {
            rejected(l, "best-effort").is_some()
                && l.get("tolerant").is_some()
                && l.get("burst-2").is_some()
        },
        TIMEOUT,
    );
    assert_eq!(
        rejected(&list, "best-effort"),
        Some((
            "Evicted".to_owned(),
            "Pod was rejected: The node had condition: [MemoryPressure]. ".to_owned()
        ))
    );
    for admitted in ["tolerant", "burst-2"] {
        // The eviction manager may evict it afterwards (its memory is short), but it was admitted.
        let message = rejected(&list, admitted).map(|r| r.1).unwrap_or_default();
        assert!(
            !message.starts_with("Pod was rejected"),
            "{admitted}: {message}"
        );
    }
}
