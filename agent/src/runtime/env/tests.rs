use super::*;
use crate::pod::downward::resource_field_ref;
use k8s_openapi::api::core::v1::ResourceFieldSelector;
use serde_json::json;

fn pod(v: serde_json::Value) -> Pod {
    serde_json::from_value(v).expect("pod")
}

fn service(ns: &str, name: &str, ip: &str, ports: serde_json::Value) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {"clusterIP": ip, "ports": ports},
    }))
    .expect("service")
}

/// ConfigMaps and secrets by name; the namespace asked for is checked.
#[derive(Default)]
struct Table {
    namespace: &'static str,
    config_maps: HashMap<&'static str, serde_json::Value>,
    secrets: HashMap<&'static str, serde_json::Value>,
}

impl Objects for Table {
    async fn config_map(&self, namespace: &str, name: &str) -> Result<Option<ConfigMap>, Error> {
        assert_eq!(namespace, self.namespace);
        Ok(self
            .config_maps
            .get(name)
            .map(|d| serde_json::from_value(json!({"data": d})).expect("configMap")))
    }
    async fn secret(&self, namespace: &str, name: &str) -> Result<Option<Secret>, Error> {
        assert_eq!(namespace, self.namespace);
        Ok(self
            .secrets
            .get(name)
            .map(|d| serde_json::from_value(json!({"data": d})).expect("secret")))
    }
}

fn ctx() -> Context {
    Context {
        pod_ips: vec!["10.1.0.5".into(), "fd00::5".into()],
        host_ips: vec!["192.168.1.2".parse().unwrap(), "fd01::2".parse().unwrap()],
        allocatable: Some(Allocatable {
            cpu_millis: 4000,
            memory_bytes: 8 << 30,
            ephemeral_storage_bytes: Some(100_000_000_000),
        }),
    }
}

async fn env_of(
    table: &Table,
    services: Option<&[Service]>,
    p: &Pod,
) -> Result<Vec<(String, String)>, Error> {
    let c = &p.spec.as_ref().unwrap().containers[0];
    build(table, services, &ctx(), p, "uid-1", c).await
}

fn get<'a>(env: &'a [(String, String)], k: &str) -> Option<&'a str> {
    env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
}

#[test]
fn expansion_follows_the_kubelets_rules() {
    let vars = HashMap::from([("A", "a"), ("EMPTY", ""), ("B", "$(A)")]);
    let x = |s: &str| expand(s, |n| vars.get(n).copied());
    assert_eq!(x("$(A)"), "a");
    assert_eq!(x("x$(A)y$(A)"), "xaya");
    assert_eq!(x("$(EMPTY)!"), "!");
    // Unknown names stay as written; values are not expanded again.
    assert_eq!(x("$(NOPE)-$(B)"), "$(NOPE)-$(A)");
    // `$$` is one `$`: `$$(A)` is `$(A)` literally.
    assert_eq!(x("$$(A)"), "$(A)");
    assert_eq!(x("$$$(A)"), "$a");
    assert_eq!(x("$$"), "$");
    // A `$` before anything else, an unclosed reference and a trailing `$` stay.
    assert_eq!(x("$A $"), "$A $");
    assert_eq!(x("$(A"), "$(A");
    assert_eq!(x("é$(A)é"), "éaé");
    assert_eq!(x("$()"), "$()");
}

#[test]
fn unclosed_reference_then_a_closed_one() {
    // The kubelet reads `$(` then scans to the first `)`: `$($(A)` names `$(A`.
    let vars = HashMap::from([("A", "a")]);
    assert_eq!(expand("$($(A)", |n| vars.get(n).copied()), "$($(A)");
    assert_eq!(expand("$( $(A)", |n| vars.get(n).copied()), "$( $(A)");
}

#[test]
fn command_and_args_see_the_whole_environment() {
    let env = vec![("A".into(), "1".into()), ("B".into(), "two words".into())];
    let items = vec!["echo".into(), "$(B)".into(), "$$(A)".into(), "$(Z)".into()];
    assert_eq!(
        expand_all(&items, &env),
        ["echo", "two words", "$(A)", "$(Z)"]
    );
}

#[test]
fn each_field_ref() {
    let p = pod(json!({
        "metadata": {"name": "web", "namespace": "ns1", "uid": "ignored",
                     "labels": {"app": "a"}, "annotations": {"team": "t"}},
        "spec": {"nodeName": "n1", "serviceAccountName": "sa", "containers": [{"name": "c"}]},
    }));
    let f = |path: &str| {
        let sel = ObjectFieldSelector {
            field_path: path.into(),
            api_version: Some("v1".into()),
        };
        field_ref(&sel, &p, "uid-1", &ctx())
    };
    let ok = |path: &str| f(path).unwrap();
    assert_eq!(ok("metadata.name"), "web");
    assert_eq!(ok("metadata.namespace"), "ns1");
    assert_eq!(ok("metadata.uid"), "uid-1");
    assert_eq!(ok("metadata.labels['app']"), "a");
    assert_eq!(ok("metadata.labels['none']"), "");
    assert_eq!(ok("metadata.annotations['team']"), "t");
    assert_eq!(ok("spec.nodeName"), "n1");
    assert_eq!(ok("spec.serviceAccountName"), "sa");
    assert_eq!(ok("status.hostIP"), "192.168.1.2");
    assert_eq!(ok("status.hostIPs"), "192.168.1.2,fd01::2");
    assert_eq!(ok("status.podIP"), "10.1.0.5");
    assert_eq!(ok("status.podIPs"), "10.1.0.5,fd00::5");
    assert_eq!(
        f("spec.restartPolicy").unwrap_err().to_string(),
        "unsupported fieldPath: spec.restartPolicy"
    );
    let v2 = ObjectFieldSelector {
        field_path: "metadata.name".into(),
        api_version: Some("v2".into()),
    };
    let e = field_ref(&v2, &p, "u", &ctx()).unwrap_err();
    assert!(e.to_string().contains("v2"));
    let no_route = Context {
        host_ips: vec![],
        ..ctx()
    };
    let sel = ObjectFieldSelector {
        field_path: "status.hostIP".into(),
        api_version: None,
    };
    assert!(
        field_ref(&sel, &p, "u", &no_route)
            .unwrap_err()
            .to_string()
            .contains("default route")
    );
}

fn resource(r: &str, divisor: Option<&str>, container: Option<&str>) -> ResourceFieldSelector {
    ResourceFieldSelector {
        resource: r.into(),
        divisor: divisor.map(|d| k8s_openapi::apimachinery::pkg::api::resource::Quantity(d.into())),
        container_name: container.map(Into::into),
    }
}

#[test]
fn resources_round_up_by_divisor_and_unset_limits_are_the_nodes() {
    let p = pod(json!({"spec": {
        "containers": [
            {"name": "c", "resources": {
                "requests": {"cpu": "250m", "memory": "100Mi"},
                "limits": {"cpu": "1500m", "memory": "1Gi", "ephemeral-storage": "2G"}}},
            {"name": "bare"},
        ],
        "initContainers": [{"name": "init", "resources": {"limits": {"memory": "64Mi"}}}],
    }}));
    let spec = p.spec.as_ref().unwrap();
    let (c, bare) = (&spec.containers[0], &spec.containers[1]);
    let node = ctx().allocatable;
    let v = |c: &Container, r: ResourceFieldSelector| resource_field_ref(&r, &p, c, node.as_ref());
    // cpu: millicores over the divisor's, rounded up (default divisor 1: whole cores).
    assert_eq!(v(c, resource("limits.cpu", None, None)).unwrap(), "2");
    assert_eq!(
        v(c, resource("limits.cpu", Some("1m"), None)).unwrap(),
        "1500"
    );
    assert_eq!(v(c, resource("requests.cpu", None, None)).unwrap(), "1");
    assert_eq!(
        v(c, resource("requests.cpu", Some("100m"), None)).unwrap(),
        "3"
    );
    // A zero divisor is the default.
    assert_eq!(
        v(c, resource("requests.cpu", Some("0"), None)).unwrap(),
        "1"
    );
    // memory: bytes over the divisor's, rounded up.
    assert_eq!(
        v(c, resource("limits.memory", None, None)).unwrap(),
        "1073741824"
    );
    assert_eq!(
        v(c, resource("limits.memory", Some("1Mi"), None)).unwrap(),
        "1024"
    );
    assert_eq!(
        v(c, resource("requests.memory", Some("1G"), None)).unwrap(),
        "1"
    );
    assert_eq!(
        v(c, resource("limits.ephemeral-storage", Some("1M"), None)).unwrap(),
        "2000"
    );
    // Unset limits: the node's allocatable; unset requests: 0.
    assert_eq!(v(bare, resource("limits.cpu", None, None)).unwrap(), "4");
    assert_eq!(
        v(bare, resource("limits.memory", Some("1Gi"), None)).unwrap(),
        "8"
    );
    assert_eq!(
        v(bare, resource("limits.ephemeral-storage", Some("1G"), None)).unwrap(),
        "100"
    );
    assert_eq!(
        v(bare, resource("requests.memory", None, None)).unwrap(),
        "0"
    );
    // containerName: another container (init containers too).
    assert_eq!(
        v(bare, resource("limits.cpu", Some("1m"), Some("c"))).unwrap(),
        "1500"
    );
    assert_eq!(
        v(c, resource("limits.memory", Some("1Mi"), Some("init"))).unwrap(),
        "64"
    );
    assert_eq!(
        v(c, resource("limits.cpu", None, Some("ghost")))
            .unwrap_err()
            .to_string(),
        "container ghost not found"
    );
    assert!(
        v(c, resource("limits.gpu", None, None))
            .unwrap_err()
            .to_string()
            .contains("limits.gpu")
    );
    assert!(
        v(c, resource("cpu", None, None))
            .unwrap_err()
            .to_string()
            .contains("unsupported")
    );
    assert!(
        v(c, resource("limits.cpu", Some("-1"), None))
            .unwrap_err()
            .to_string()
            .contains("divisor")
    );
}

#[test]
fn service_variables_are_named_as_the_kubelet_names_them() {
    let services = [
        service(
            "ns1",
            "my-db",
            "10.0.0.7",
            json!([
                {"name": "sql", "port": 5432},
                {"name": "metrics-port", "port": 9100, "protocol": "UDP"},
            ]),
        ),
        service("ns1", "headless", "None", json!([{"port": 80}])),
        service("ns1", "no-ip", "", json!([{"port": 80}])),
        service("other", "elsewhere", "10.0.0.9", json!([{"port": 80}])),
        service(
            "default",
            "kubernetes",
            "10.0.0.1",
            json!([{"name": "https", "port": 443}]),
        ),
        service("ns1", "v6", "fd00::10", json!([{"port": 8080}])),
    ];
    let env = service_env("ns1", true, &services);
    let want = [
        ("MY_DB_SERVICE_HOST", "10.0.0.7"),
        ("MY_DB_SERVICE_PORT", "5432"),
        ("MY_DB_SERVICE_PORT_SQL", "5432"),
        ("MY_DB_SERVICE_PORT_METRICS_PORT", "9100"),
        ("MY_DB_PORT", "tcp://10.0.0.7:5432"),
        ("MY_DB_PORT_5432_TCP", "tcp://10.0.0.7:5432"),
        ("MY_DB_PORT_5432_TCP_PROTO", "tcp"),
        ("MY_DB_PORT_5432_TCP_PORT", "5432"),
        ("MY_DB_PORT_5432_TCP_ADDR", "10.0.0.7"),
        ("MY_DB_PORT_9100_UDP", "udp://10.0.0.7:9100"),
        ("MY_DB_PORT_9100_UDP_PROTO", "udp"),
        ("MY_DB_PORT_9100_UDP_PORT", "9100"),
        ("MY_DB_PORT_9100_UDP_ADDR", "10.0.0.7"),
        ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
        ("KUBERNETES_SERVICE_PORT", "443"),
        ("KUBERNETES_SERVICE_PORT_HTTPS", "443"),
        ("KUBERNETES_PORT", "tcp://10.0.0.1:443"),
        ("KUBERNETES_PORT_443_TCP", "tcp://10.0.0.1:443"),
        ("KUBERNETES_PORT_443_TCP_PROTO", "tcp"),
        ("KUBERNETES_PORT_443_TCP_PORT", "443"),
        ("KUBERNETES_PORT_443_TCP_ADDR", "10.0.0.1"),
        ("V6_SERVICE_HOST", "fd00::10"),
        ("V6_SERVICE_PORT", "8080"),
        ("V6_PORT", "tcp://[fd00::10]:8080"),
        ("V6_PORT_8080_TCP", "tcp://[fd00::10]:8080"),
        ("V6_PORT_8080_TCP_PROTO", "tcp"),
        ("V6_PORT_8080_TCP_PORT", "8080"),
        ("V6_PORT_8080_TCP_ADDR", "fd00::10"),
    ];
    let want: BTreeMap<String, String> = want
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert_eq!(env, want);
    // Without links only the master service; it is there for every namespace.
    let env = service_env("ns1", false, &services);
    assert!(env.keys().all(|k| k.starts_with("KUBERNETES_")), "{env:?}");
    assert_eq!(env.len(), 8);
    let env = service_env("other", true, &services);
    assert_eq!(
        env.get("ELSEWHERE_SERVICE_HOST").map(String::as_str),
        Some("10.0.0.9")
    );
    assert!(!env.contains_key("MY_DB_SERVICE_HOST"));
}

#[tokio::test]
async fn every_source_with_precedence_and_expansion() {
    let table = Table {
        namespace: "ns1",
        config_maps: HashMap::from([
            (
                "settings",
                json!({"MODE": "fast", "LEVEL": "3", "bad=key": "x"}),
            ),
            ("more", json!({"MODE": "slow"})),
        ]),
        secrets: HashMap::from([("creds", json!({"PASSWORD": "c2VjcmV0"}))]), // "secret"
    };
    let services = [
        service("ns1", "db", "10.0.0.7", json!([{"port": 5432}])),
        service("default", "kubernetes", "10.0.0.1", json!([{"port": 443}])),
    ];
    let p = pod(json!({
        "metadata": {"name": "web", "namespace": "ns1"},
        "spec": {"containers": [{
            "name": "c",
            "envFrom": [
                {"configMapRef": {"name": "settings"}},
                {"configMapRef": {"name": "more"}, "prefix": "MORE_"},
                {"configMapRef": {"name": "absent", "optional": true}},
                {"secretRef": {"name": "creds"}},
            ],
            "env": [
                {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "URL", "value": "$(NAME):$(DB_SERVICE_PORT)/$(LATER)/$$(NAME)"},
                {"name": "LATER", "value": "l"},
                {"name": "LEVEL", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "LEVEL"}}},
                {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "PASSWORD"}}},
                {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "nope", "optional": true}}},
                {"name": "NOT_EXPANDED", "valueFrom": {"configMapKeyRef": {"name": "more", "key": "MODE"}}},
                {"name": "DB_SERVICE_HOST", "value": "mine"},
                {"name": "EMPTY"},
            ],
        }]},
    }));
    let env = env_of(&table, Some(&services), &p).await.unwrap();
    assert_eq!(get(&env, "MODE"), Some("fast"));
    assert_eq!(get(&env, "MORE_MODE"), Some("slow"));
    assert_eq!(get(&env, "PASSWORD"), Some("secret"));
    assert_eq!(get(&env, "NAME"), Some("web"));
    // Earlier variables and services expand; later ones do not yet; `$$` escapes.
    assert_eq!(get(&env, "URL"), Some("web:5432/$(LATER)/$(NAME)"));
    assert_eq!(get(&env, "PW"), Some("secret"));
    assert_eq!(get(&env, "OPT"), None);
    assert_eq!(get(&env, "EMPTY"), Some(""));
    // Explicit env wins over service variables, which otherwise come after.
    assert_eq!(get(&env, "DB_SERVICE_HOST"), Some("mine"));
    assert_eq!(
        env.iter().filter(|(k, _)| k == "DB_SERVICE_HOST").count(),
        1
    );
    assert_eq!(get(&env, "KUBERNETES_SERVICE_HOST"), Some("10.0.0.1"));
    // A key that cannot be a variable name is skipped.
    assert_eq!(get(&env, "bad=key"), None);
    // First definition order: envFrom's keys, then env's new names, then services.
    let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
    let pos = |k: &str| names.iter().position(|n| *n == k).unwrap();
    assert!(pos("LEVEL") < pos("NAME") && pos("NAME") < pos("URL"));
    assert!(pos("EMPTY") < pos("KUBERNETES_SERVICE_HOST"));
    // Without an API server: no service variables at all.
    let env = env_of(&table, None, &p).await.unwrap();
    assert_eq!(
        get(&env, "URL"),
        Some("web:$(DB_SERVICE_PORT)/$(LATER)/$(NAME)")
    );
    assert!(env.iter().all(|(k, _)| !k.starts_with("KUBERNETES_")));
}

#[tokio::test]
async fn missing_objects_and_keys_say_what_is_missing() {
    fn table_ref() -> Table {
        Table {
            namespace: "default",
            config_maps: HashMap::from([("settings", json!({"A": "1"}))]),
            ..Default::default()
        }
    }
    let with_env =
        |env: serde_json::Value| pod(json!({"spec": {"containers": [{"name": "c", "env": env}]}}));
    let err = |env| async move {
        env_of(&table_ref(), None, &with_env(env))
            .await
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        err(json!([{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "FOO"}}}])).await,
        "couldn't find key FOO in ConfigMap default/settings"
    );
    assert_eq!(
        err(
            json!([{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "gone", "key": "FOO"}}}])
        )
        .await,
        "configmap \"gone\" not found"
    );
    assert_eq!(
        err(json!([{"name": "X", "valueFrom": {"secretKeyRef": {"name": "gone", "key": "FOO"}}}]))
            .await,
        "secret \"gone\" not found"
    );
    let from = pod(json!({"spec": {"containers": [{"name": "c",
        "envFrom": [{"secretRef": {"name": "s"}}]}]}}));
    assert_eq!(
        env_of(&table_ref(), None, &from)
            .await
            .unwrap_err()
            .to_string(),
        "secret \"s\" not found"
    );
    // An optional reference to a missing object sets nothing.
    let optional = with_env(json!([
        {"name": "X", "valueFrom": {"secretKeyRef": {"name": "gone", "key": "K", "optional": true}}}
    ]));
    assert!(
        env_of(&table_ref(), None, &optional)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn without_an_api_server_a_reference_says_so() {
    let objects = ApiObjects::new(None);
    let p = pod(
        json!({"metadata": {"namespace": "ns1"}, "spec": {"containers": [{"name": "c",
        "envFrom": [{"configMapRef": {"name": "settings"}}]}]}}),
    );
    let c = &p.spec.as_ref().unwrap().containers[0];
    let e = build(&objects, None::<&[Service]>, &ctx(), &p, "u", c)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::NoApiServer { .. }), "{e}");
    assert!(
        e.to_string()
            .starts_with("couldn't get configMap ns1/settings")
            && e.to_string().contains("--kubeconfig"),
        "{e}"
    );
}

/// API objects read through the API server at `addr` (keep the directory).
fn api_at(addr: &str) -> (tempfile::TempDir, ApiObjects) {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: 'http://{addr}'}}}}]\n\
             users: [{{name: u, user: {{}}}}]\ncontexts: [{{name: x, context: {{cluster: c, user: u}}}}]\n\
             current-context: x\n"
        ),
    )
    .unwrap();
    (dir, ApiObjects::new(Some(kubeconfig)))
}

/// API objects read through an API server that refuses connections (keep the directory).
fn unreachable_api() -> (tempfile::TempDir, ApiObjects) {
    api_at("127.0.0.1:9")
}

fn api_pod_in(ns: &str) -> Pod {
    pod(json!({"metadata": {"name": "p", "namespace": ns}, "spec": {"containers": []}}))
}

#[tokio::test]
async fn before_the_services_are_read_a_pods_environment_fails_naming_why() {
    // An API server that refuses connections: the first list fails, and every read says so
    // (the list is retried in the background) in the kubelet's words.
    let (_dir, objects) = unreachable_api();
    for _ in 0..2 {
        let e = services(&objects, &api_pod_in("ns1")).await.unwrap_err();
        assert!(
            e.to_string().starts_with(
                "services have not yet been read at least once, cannot construct envvars: \
                 listing every Service from the API server: "
            ),
            "{e}"
        );
    }
}

#[tokio::test]
async fn a_static_pod_gets_no_services_but_a_reason_before_they_are_read() {
    let (_dir, objects) = unreachable_api();
    let (services, why) = services_for_static_pod(&objects, &api_pod_in("ns1")).await;
    assert!(services.is_none(), "nothing was ever read");
    let why = why.unwrap_or_default();
    assert!(
        why.starts_with("services have not yet been read at least once"),
        "{why}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_static_pod_waits_for_an_api_server_that_does_not_answer_only_so_long() {
    // A server that takes connections and never answers: the list stays in flight.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (_dir, objects) = api_at(&silent.local_addr().unwrap().to_string());
    let started = tokio::time::Instant::now();
    let (services, why) = services_for_static_pod(&objects, &api_pod_in("ns1")).await;
    assert!(services.is_none());
    assert_eq!(
        why.as_deref(),
        Some("the services have not been read within 2s")
    );
    assert!(started.elapsed() >= STATIC_POD_SERVICE_WAIT);
}
