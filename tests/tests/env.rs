//! Container environments on the real containerd, read from inside the containers (CRI
//! ExecSync `cat /proc/1/environ`): `envFrom` and `valueFrom` of every kind through the
//! in-process API server, `$(VAR)` expansion in values and in the command, service link
//! variables (from one list and then a watch of the services, however many pods start), and a
//! pod whose configMap key is missing: it waits with `CreateContainerConfigError` and starts
//! once the configMap has the key.
use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, ContainerStateWaiting, Pod, Secret, Service};
use swiftlet_tests::api_server::{ApiServer, config_map, service};
use swiftlet_tests::{Agent, AgentOptions, PodList, Runtime, exec};

const RUNNING_TIMEOUT: Duration = Duration::from_secs(60);
/// A container that could not be configured is tried again after 10 s.
const RETRY_TIMEOUT: Duration = Duration::from_secs(60);

/// A pod for the agent's node from the API server, in `default`: one busybox container `main`
/// running `script`, with `spec_extra` spec lines and `container_extra` container lines.
fn api_pod(node: &str, name: &str, spec_extra: &str, script: &str, container_extra: &str) -> Pod {
    swiftlet_tests::busybox_api_pod(
        node,
        name,
        ", labels: {app: web}, annotations: {team: blue}",
        spec_extra,
        script,
        container_extra,
    )
}

/// The environment of pod `pod`'s container `main`'s first process.
fn environ(agent: &Agent, list: &PodList, pod: &str) -> BTreeMap<String, String> {
    let id = list
        .container(pod, "main")
        .and_then(|c| c.container_id.clone())
        .unwrap_or_else(|| panic!("no container in {pod}: {}", list.summary()));
    let (code, out) = exec(
        agent.endpoint(),
        &id,
        &["sh", "-c", "tr '\\0' '\\n' </proc/1/environ"],
    )
    .expect("ExecSync");
    assert_eq!(code, 0, "{out}");
    out.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn sh_out(agent: &Agent, list: &PodList, pod: &str, script: &str) -> String {
    let id = list
        .container(pod, "main")
        .and_then(|c| c.container_id.clone())
        .expect("a container");
    let (code, out) = exec(agent.endpoint(), &id, &["sh", "-c", script]).expect("ExecSync");
    assert_eq!(code, 0, "{script}: {out}");
    out
}

fn secret(name: &str, data: &[(&str, &str)]) -> Secret {
    use base64::Engine;
    let data: serde_json::Map<String, serde_json::Value> = data
        .iter()
        .map(|(k, v)| {
            let b64 = base64::engine::general_purpose::STANDARD.encode(v);
            ((*k).to_owned(), b64.into())
        })
        .collect();
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "default"},
        "data": data,
    }))
    .expect("secret")
}

fn named_port_service(name: &str, ns: &str, ip: &str, port: i32, port_name: &str) -> Service {
    let mut s = service(name, ns, ip, port);
    if let Some(p) = s.spec.as_mut().and_then(|s| s.ports.as_mut()) {
        p[0].name = Some(port_name.to_owned());
    }
    s
}

fn agent_with(server: &ApiServer, rt: &'static Runtime, name: &str) -> (Agent, tempfile::TempDir) {
    let mut opts = AgentOptions::new(name);
    let dir = server.point_agent(&mut opts);
    (Agent::start(rt, opts), dir)
}

/// A new API server holding the master service `default/kubernetes` (10.96.0.1, port 443
/// named `https`) and `default/db` (10.96.0.10:5432).
fn server_with_services(tokio: &tokio::runtime::Runtime) -> ApiServer {
    let server = tokio.block_on(ApiServer::start());
    let master = named_port_service("kubernetes", "default", "10.96.0.1", 443, "https");
    server.put_object(master);
    server.put_object(service("db", "default", "10.96.0.10", 5432));
    server
}

const EVERY_SOURCE: &str = r#"    resources: {limits: {cpu: 500m, memory: 64Mi}}
    envFrom:
    - configMapRef: {name: env-extra}
      prefix: X_
    - secretRef: {name: env-creds}
    - configMapRef: {name: env-absent, optional: true}
    env:
    - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
    - {name: POD_NS, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}
    - {name: POD_UID, valueFrom: {fieldRef: {fieldPath: metadata.uid}}}
    - {name: APP, valueFrom: {fieldRef: {fieldPath: "metadata.labels['app']"}}}
    - {name: TEAM, valueFrom: {fieldRef: {fieldPath: "metadata.annotations['team']"}}}
    - {name: NODE, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
    - {name: SA, valueFrom: {fieldRef: {fieldPath: spec.serviceAccountName}}}
    - {name: HOST_IP, valueFrom: {fieldRef: {fieldPath: status.hostIP}}}
    - {name: HOST_IPS, valueFrom: {fieldRef: {fieldPath: status.hostIPs}}}
    - {name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}
    - {name: POD_IPS, valueFrom: {fieldRef: {fieldPath: status.podIPs}}}
    - {name: CPU_MILLIS, valueFrom: {resourceFieldRef: {resource: limits.cpu, divisor: 1m}}}
    - {name: CPU_CORES, valueFrom: {resourceFieldRef: {resource: limits.cpu}}}
    - {name: MEM_MI, valueFrom: {resourceFieldRef: {resource: limits.memory, divisor: 1Mi}}}
    - {name: LEVEL, valueFrom: {configMapKeyRef: {name: env-settings, key: LEVEL}}}
    - {name: MISSING_OK, valueFrom: {configMapKeyRef: {name: env-settings, key: NOPE, optional: true}}}
    - {name: PW, valueFrom: {secretKeyRef: {name: env-creds, key: PASSWORD}}}
    - {name: URL, value: "$(POD_NAME).$(DB_SERVICE_HOST):$(DB_SERVICE_PORT)/$(LEVEL)"}
    - {name: LITERAL, value: "$$(POD_NAME)"}
    - {name: UNKNOWN, value: "$(NOPE)"}
    - {name: X_K, value: "explicit wins"}
"#;

#[test]
fn every_source_with_expansion_and_service_links_is_seen_inside_the_container() {
    let Some(rt) = Runtime::shared() else {
        return;
    };
    let tokio = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let server = server_with_services(&tokio);
    server.put_object(config_map("env-settings", &[("LEVEL", "3")]));
    server.put_object(config_map("env-extra", &[("K", "v"), ("OTHER", "o")]));
    server.put_secret(secret("env-creds", &[("PASSWORD", "s3cret")]));
    server.put_object(service("headless", "default", "None", 80));
    server.put_object(service("elsewhere", "other", "10.96.0.20", 80));
    let (agent, _dir) = agent_with(&server, rt, "env-all");
    let node = agent.node_name().to_owned();

    server.put(api_pod(
        &node,
        "env-all",
        "  serviceAccountName: builder\n",
        // `$$(POD_NAME)` reaches the shell as `$(POD_NAME)`, kept literal by the single quotes.
        "echo \"$(POD_NAME) $(LEVEL)\" '$$(POD_NAME)' > /tmp/cmd; sleep 3600 & wait",
        EVERY_SOURCE,
    ));
    server.put(api_pod(
        &node,
        "env-nolinks",
        "  enableServiceLinks: false\n",
        "sleep 3600 & wait",
        "",
    ));
    let list = agent.wait_for(
        |l| l.is_running("env-all") && l.is_running("env-nolinks"),
        RUNNING_TIMEOUT,
    );
    let env = environ(&agent, &list, "env-all");
    let get = |k: &str| env.get(k).map(String::as_str);
    let status = list
        .get("env-all")
        .and_then(|p| p.status.clone())
        .expect("status");
    assert_eq!(get("POD_NAME"), Some("env-all"));
    assert_eq!(get("POD_NS"), Some("default"));
    assert_eq!(get("POD_UID"), Some(format!("env-all-{node}").as_str()));
    assert_eq!((get("APP"), get("TEAM")), (Some("web"), Some("blue")));
    assert_eq!(get("NODE"), Some(node.as_str()));
    assert_eq!(get("SA"), Some("builder"));
    // The pod's IP is the sandbox's, as the status shows it; the host's is the node's.
    let pod_ip = status.pod_ip.clone().expect("a pod IP");
    assert_eq!(get("POD_IP"), Some(pod_ip.as_str()));
    assert!(get("POD_IPS").is_some_and(|ips| ips.split(',').next() == Some(&pod_ip)));
    let host_ip = status.host_ip.clone().expect("a host IP");
    assert_eq!(get("HOST_IP"), Some(host_ip.as_str()));
    assert!(get("HOST_IPS").is_some_and(|ips| ips.starts_with(&host_ip)));
    // Resources: divided and rounded up.
    assert_eq!(get("CPU_MILLIS"), Some("500"));
    assert_eq!(get("CPU_CORES"), Some("1"));
    assert_eq!(get("MEM_MI"), Some("64"));
    // configMaps and secrets, envFrom with a prefix; explicit env wins over envFrom.
    assert_eq!(get("LEVEL"), Some("3"));
    assert_eq!(get("PW"), Some("s3cret"));
    assert_eq!(get("PASSWORD"), Some("s3cret"));
    assert_eq!(get("X_OTHER"), Some("o"));
    assert_eq!(get("X_K"), Some("explicit wins"));
    assert_eq!(get("MISSING_OK"), None);
    // Expansion: earlier variables and service variables; `$$` escapes; unknown names stay.
    assert_eq!(get("URL"), Some("env-all.10.96.0.10:5432/3"));
    assert_eq!(get("LITERAL"), Some("$(POD_NAME)"));
    assert_eq!(get("UNKNOWN"), Some("$(NOPE)"));
    // Service links: the namespace's services and the master service; no headless service,
    // nothing of another namespace.
    assert_eq!(get("DB_SERVICE_HOST"), Some("10.96.0.10"));
    assert_eq!(get("DB_PORT"), Some("tcp://10.96.0.10:5432"));
    assert_eq!(get("DB_PORT_5432_TCP_ADDR"), Some("10.96.0.10"));
    assert_eq!(get("KUBERNETES_SERVICE_HOST"), Some("10.96.0.1"));
    assert_eq!(get("KUBERNETES_SERVICE_PORT_HTTPS"), Some("443"));
    assert_eq!(get("KUBERNETES_PORT_443_TCP"), Some("tcp://10.96.0.1:443"));
    assert!(
        !env.keys()
            .any(|k| k.starts_with("HEADLESS_") || k.starts_with("ELSEWHERE_"))
    );
    // The command was expanded with the container's environment before the shell ran it.
    let cmd = sh_out(&agent, &list, "env-all", "cat /tmp/cmd");
    assert_eq!(cmd.trim(), "env-all 3 $(POD_NAME)");

    // enableServiceLinks false: only the master service's variables.
    let env = environ(&agent, &list, "env-nolinks");
    assert_eq!(
        env.get("KUBERNETES_SERVICE_HOST").map(String::as_str),
        Some("10.96.0.1")
    );
    assert!(!env.keys().any(|k| k.starts_with("DB_")), "{env:?}");
    drop(agent);
    drop(tokio);
}

/// Service link variables come from a store the agent keeps by one list and then a watch of
/// every service: a burst of five pod starts and, a few seconds later, three more list the
/// services once in all, every container gets the variables, and a service created after the
/// agent started reaches the later pods' environments through the watch.
#[test]
fn service_variables_come_from_one_list_then_a_watch() {
    let Some(rt) = Runtime::shared() else {
        return;
    };
    let tokio = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let server = server_with_services(&tokio);
    let (agent, _dir) = agent_with(&server, rt, "env-svc-watch");
    let node = agent.node_name().to_owned();
    // Starts the pods `names` at once; each container's environment must hold `want`.
    let burst = |names: &[String], want: &[(&str, Option<&str>)]| {
        for name in names {
            server.put(api_pod(&node, name, "", "sleep 3600 & wait", ""));
        }
        let list = agent.wait_for(|l| names.iter().all(|p| l.is_running(p)), RUNNING_TIMEOUT);
        for pod in names {
            let env = environ(&agent, &list, pod);
            for (k, v) in want {
                assert_eq!(env.get(*k).map(String::as_str), *v, "{pod}: {k}");
            }
        }
    };

    let first: Vec<String> = (0..5).map(|i| format!("env-burst-{i}")).collect();
    burst(
        &first,
        &[
            ("DB_SERVICE_HOST", Some("10.96.0.10")),
            ("KUBERNETES_SERVICE_PORT_HTTPS", Some("443")),
            ("LATE_SERVICE_HOST", None),
        ],
    );
    // A service created while the agent runs, then, a few seconds on, a second burst.
    server.put_object(service("late", "default", "10.96.0.30", 8080));
    std::thread::sleep(Duration::from_secs(3));
    let later: Vec<String> = (0..3).map(|i| format!("env-later-{i}")).collect();
    burst(
        &later,
        &[
            ("DB_SERVICE_HOST", Some("10.96.0.10")),
            ("LATE_SERVICE_HOST", Some("10.96.0.30")),
            ("LATE_PORT", Some("tcp://10.96.0.30:8080")),
        ],
    );
    // Eight container starts in two bursts: one list of the services (the store's first),
    // the rest came by the watch.
    let reads = server.object_reads("services");
    assert!(
        reads.lists <= 1,
        "services listed {} times: {reads:?}",
        reads.lists
    );
    assert!(reads.watches >= 1, "the services are watched: {reads:?}");
    assert_eq!(reads.gets, 0, "{reads:?}");
    drop(agent);
    drop(tokio);
}

fn waiting(list: &PodList, pod: &str) -> Option<ContainerStateWaiting> {
    list.container(pod, "main")?.state.as_ref()?.waiting.clone()
}

#[test]
fn a_missing_key_waits_with_create_container_config_error_until_the_config_map_has_it() {
    let Some(rt) = Runtime::shared() else {
        return;
    };
    let tokio = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let server = tokio.block_on(ApiServer::start());
    server.put_object(config_map("env-late", &[("OTHER", "x")]));
    let (agent, _dir) = agent_with(&server, rt, "env-late");
    let node = agent.node_name().to_owned();
    server.put(api_pod(
        &node,
        "env-late",
        "",
        "sleep 3600 & wait",
        "    env:\n    - {name: FOO, valueFrom: {configMapKeyRef: {name: env-late, key: FOO}}}\n    \
         - {name: BAR, valueFrom: {secretKeyRef: {name: env-late-secret, key: BAR, optional: true}}}\n",
    ));
    let list = agent.wait_for(
        |l| waiting(l, "env-late").is_some_and(|w| w.reason.is_some()),
        RETRY_TIMEOUT,
    );
    let w = waiting(&list, "env-late").expect("waiting");
    assert_eq!(
        w.reason.as_deref(),
        Some("CreateContainerConfigError"),
        "{w:?}"
    );
    assert_eq!(
        w.message.as_deref(),
        Some("couldn't find key FOO in ConfigMap default/env-late")
    );
    assert_eq!(list.phase("env-late"), Some("Pending"));

    // The configMap goes: the message says so.
    server.delete_object::<ConfigMap>("default", "env-late");
    agent.wait_for(
        |l| {
            waiting(l, "env-late")
                .and_then(|w| w.message)
                .is_some_and(|m| m == "configmap \"env-late\" not found")
        },
        RETRY_TIMEOUT,
    );
    // It comes back with the key: the container starts at the next retry and sees it.
    server.put_object(config_map("env-late", &[("FOO", "bar")]));
    let list = agent.wait_for(|l| l.is_running("env-late"), RETRY_TIMEOUT);
    let env = environ(&agent, &list, "env-late");
    assert_eq!(env.get("FOO").map(String::as_str), Some("bar"));
    assert!(!env.contains_key("BAR"));
    drop(agent);
    drop(tokio);
}

/// `--node-ip` is the node's address everywhere the node's address shows: the Node's
/// InternalIP, the pods' `status.hostIP(s)`, the `status.hostIP` environment source and a
/// host-network pod's IP (never the default route's address the agent would detect).
#[test]
fn the_node_ip_flag_is_the_pods_host_ip() {
    let Some(rt) = Runtime::shared() else {
        return;
    };
    // A documentation address: no interface of this machine has it, so it cannot be detected.
    const NODE_IP: &str = "192.0.2.77";
    let tokio = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let server = tokio.block_on(ApiServer::start());
    let mut opts = AgentOptions::new("env-node-ip");
    opts.extra_args = vec!["--node-ip".into(), NODE_IP.into()];
    let _dir = server.point_agent(&mut opts);
    let agent = Agent::start(rt, opts);
    let node = agent.node_name().to_owned();
    let host_env = "    env:\n    - {name: HOST_IP, valueFrom: {fieldRef: {fieldPath: status.hostIP}}}\n    \
                    - {name: HOST_IPS, valueFrom: {fieldRef: {fieldPath: status.hostIPs}}}\n    \
                    - {name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}\n";
    server.put(api_pod(&node, "env-ip", "", "sleep 3600 & wait", host_env));
    server.put(api_pod(
        &node,
        "env-ip-host",
        "  hostNetwork: true\n",
        "sleep 3600 & wait",
        host_env,
    ));
    let list = agent.wait_for(
        |l| l.is_running("env-ip") && l.is_running("env-ip-host"),
        RUNNING_TIMEOUT,
    );
    for pod in ["env-ip", "env-ip-host"] {
        let status = list
            .get(pod)
            .and_then(|p| p.status.clone())
            .expect("status");
        assert_eq!(status.host_ip.as_deref(), Some(NODE_IP), "{pod}");
        let host_ips: Vec<String> = status
            .host_ips
            .iter()
            .flatten()
            .map(|h| h.ip.clone())
            .collect();
        assert_eq!(host_ips, [NODE_IP], "{pod}");
        let env = environ(&agent, &list, pod);
        assert_eq!(
            env.get("HOST_IP").map(String::as_str),
            Some(NODE_IP),
            "{pod}"
        );
        assert_eq!(
            env.get("HOST_IPS").map(String::as_str),
            Some(NODE_IP),
            "{pod}"
        );
        // The API server holds what the agent reports (its status write follows shortly).
        let stored = || {
            server
                .pod_named("default", pod)
                .and_then(|p| p.status)
                .and_then(|s| s.host_ip)
        };
        let deadline = std::time::Instant::now() + RETRY_TIMEOUT;
        while stored().is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(stored().as_deref(), Some(NODE_IP), "{pod} in the API");
    }
    let host = list
        .get("env-ip-host")
        .and_then(|p| p.status.clone())
        .expect("status");
    assert_eq!(
        host.pod_ip.as_deref(),
        Some(NODE_IP),
        "a host-network pod's IP"
    );
    let env = environ(&agent, &list, "env-ip-host");
    assert_eq!(env.get("POD_IP").map(String::as_str), Some(NODE_IP));
    let internal: Vec<String> = server
        .node(&node)
        .and_then(|n| n.status)
        .and_then(|s| s.addresses)
        .unwrap_or_default()
        .into_iter()
        .filter(|a| a.type_ == "InternalIP")
        .map(|a| a.address)
        .collect();
    assert_eq!(internal, [NODE_IP], "the Node's InternalIP");
    drop(agent);
    drop(tokio);
}
