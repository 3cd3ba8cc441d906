//! The API-server pod source against the in-process API server (`swiftlet_tests::api_server`):
//! list then watch, resuming after a dropped connection, bookmarks past compacted history, 410
//! Gone and the relist, and kubeconfig handling; the RuntimeClass lookups pods need. No
//! containerd is needed.
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::Service;
use swiftlet::api_objects::ApiObjects;
use swiftlet::config::api::{Config, MirrorPods, client, run, watch};
use swiftlet::config::{API, ErrorCounter, SourceUpdate, StoredPod};
use swiftlet::runtime::runtime_class::RuntimeClasses;
use swiftlet_tests::api_server::{
    ApiServer, config_map, pod, runtime_class, service, service_account,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const NODE: &str = "node-a";
const WAIT: Duration = Duration::from_secs(10);

struct Harness {
    server: ApiServer,
    rx: mpsc::Receiver<SourceUpdate>,
    errors: ErrorCounter,
    cancel: CancellationToken,
}

impl Harness {
    async fn start(server: ApiServer) -> Harness {
        let (tx, rx) = mpsc::channel(64);
        let errors = ErrorCounter::detached(API);
        let cancel = CancellationToken::new();
        let client = server.client();
        tokio::spawn({
            let (errors, cancel) = (errors.clone(), cancel.clone());
            async move { run(client, NODE, MirrorPods::default(), tx, errors, cancel).await }
        });
        Harness {
            server,
            rx,
            errors,
            cancel,
        }
    }

    /// A source watching a server that holds one pod, `web` (u1), on this node.
    async fn watching_web() -> Harness {
        let server = ApiServer::start().await;
        server.put(pod("u1", "web", NODE, "x:1"));
        let mut h = Harness::start(server).await;
        assert_eq!(names(&h.next_set().await), ["web"]);
        h.server.wait_watchers(1).await;
        h
    }

    async fn next(&mut self) -> SourceUpdate {
        match tokio::time::timeout(WAIT, self.rx.recv()).await {
            Ok(Some(u)) => u,
            Ok(None) => panic!("source stopped"),
            Err(_) => panic!("no update in time"),
        }
    }

    async fn next_set(&mut self) -> Vec<StoredPod> {
        match self.next().await {
            SourceUpdate::Set(pods) => pods,
            other => panic!("expected a SET, got {other:?}"),
        }
    }
}

/// The pods' names, sorted.
fn names(pods: &[StoredPod]) -> Vec<String> {
    let mut n: Vec<String> = pods
        .iter()
        .filter_map(|p| p.metadata().name.clone())
        .collect();
    n.sort();
    n
}

fn one(update: SourceUpdate) -> (&'static str, StoredPod) {
    let (op, pods) = match update {
        SourceUpdate::Update(p) => ("update", p),
        SourceUpdate::Remove(p) => ("remove", p),
        SourceUpdate::Add(p) => ("add", p),
        SourceUpdate::Delete(p) => ("delete", p),
        SourceUpdate::Set(p) => ("set", p),
    };
    assert_eq!(pods.len(), 1, "{op}");
    let pod = pods.into_iter().next().expect("one pod");
    (op, pod)
}

#[tokio::test]
async fn list_then_watch_adds_modifies_deletes_for_this_node_only() {
    let server = ApiServer::start().await;
    server.put(pod("u1", "web", NODE, "x:1"));
    server.put(pod("u2", "other-node-pod", "node-b", "x:1"));
    let mut h = Harness::start(server).await;
    assert_eq!(names(&h.next_set().await), ["web"]);
    assert!(
        h.server
            .requests()
            .iter()
            .any(|q| q.contains("fieldSelector=spec.nodeName%3Dnode-a")),
        "{:?}",
        h.server.requests()
    );

    h.server.put(pod("u3", "db", NODE, "x:1"));
    h.server.put(pod("u4", "elsewhere", "node-b", "x:1"));
    let (op, p) = one(h.next().await);
    assert_eq!((op, p.metadata().name.as_deref()), ("update", Some("db")));

    h.server.put(pod("u1", "web", NODE, "x:2"));
    let (op, p) = one(h.next().await);
    assert_eq!((op, p.uid()), ("update", "u1"));
    let p = p.pod().whole().expect("a whole pod");
    let image = p.spec.as_ref().and_then(|s| s.containers[0].image.clone());
    assert_eq!(image.as_deref(), Some("x:2"));

    h.server.delete("u3");
    let (op, p) = one(h.next().await);
    assert_eq!((op, p.uid()), ("remove", "u3"));
    assert_eq!(h.server.lists(), 1);
    assert_eq!(h.errors.total(), 0);
    h.cancel.cancel();
}

#[tokio::test]
async fn dropped_connection_resumes_without_losing_events_or_relisting() {
    let mut h = Harness::watching_web().await;
    // The connection drops; a pod arrives before the watcher is back.
    h.server.drop_watches();
    h.server.put(pod("u2", "db", NODE, "x:1"));
    let (op, p) = one(h.next().await);
    assert_eq!((op, p.uid()), ("update", "u2"));
    assert_eq!(
        h.server.lists(),
        1,
        "resumed from its resourceVersion, no relist"
    );
    h.cancel.cancel();
}

#[tokio::test]
async fn bookmark_lets_the_watch_resume_past_compacted_history() {
    let mut h = Harness::watching_web().await;
    // Other nodes' pods move the resourceVersion on; this watch sees none of it...
    for i in 0..5 {
        h.server
            .put(pod(&format!("o{i}"), &format!("o{i}"), "node-b", "x:1"));
    }
    // ...until a bookmark tells it where history stands.
    h.server.bookmark();
    h.server.wait_bookmarks_sent(1).await;
    // History up to now is compacted and the connection drops: resuming from the bookmark's
    // resourceVersion works; resuming from the last pod event would be 410.
    h.server.compact();
    h.server.drop_watches();
    h.server.put(pod("u2", "db", NODE, "x:1"));
    let (op, p) = one(h.next().await);
    assert_eq!((op, p.uid()), ("update", "u2"));
    assert_eq!(h.server.lists(), 1, "no relist: the bookmark was used");
    assert_eq!(h.errors.get("watch_expired"), 0);
    h.cancel.cancel();
}

#[tokio::test]
async fn gone_410_relists_and_resends_unchanged_pods_as_the_same_stored_pod() {
    let server = ApiServer::start().await;
    server.put(pod("u1", "web", NODE, "x:1"));
    server.put(pod("u2", "db", NODE, "x:1"));
    let mut h = Harness::start(server).await;
    let first = h.next_set().await;
    assert_eq!(names(&first), ["db", "web"]);
    h.server.wait_watchers(1).await;
    // Disconnected, the client misses db's deletion and an added pod; history is compacted.
    h.server.drop_watches_and_hold();
    h.server.delete("u2");
    h.server.put(pod("u3", "cache", NODE, "x:1"));
    h.server.compact();
    h.server.release();
    // The resumed watch gets 410 Gone; the watcher relists: one SET with the current state.
    let set = h.next_set().await;
    assert_eq!(names(&set), ["cache", "web"]);
    assert_eq!(h.server.lists(), 2);
    assert!(h.errors.get("watch_expired") >= 1);
    let web = |pods: &[StoredPod]| {
        pods.iter()
            .find(|p| p.uid() == "u1")
            .map(|p| p.pod().clone())
            .expect("web listed")
    };
    assert!(
        web(&first).ptr_eq(&web(&set)),
        "unchanged pod re-sent as is"
    );
    h.cancel.cancel();
}

#[tokio::test]
async fn kubeconfig_is_read_and_a_bad_one_is_counted_not_fatal() {
    let server = ApiServer::start().await;
    server.put(pod("u1", "web", NODE, "x:1"));
    let dir = tempfile::tempdir().expect("tempdir");
    let good = dir.path().join("kubeconfig");
    std::fs::write(&good, server.kubeconfig()).expect("write");
    let (tx, mut rx) = mpsc::channel(8);
    let errors = ErrorCounter::detached(API);
    let cancel = CancellationToken::new();
    let requests = swiftlet::metrics::rest_client::Requests::default();
    let cfg = Config {
        kubeconfig: good,
        node_name: NODE.to_owned(),
        mirrors: MirrorPods::default(),
        requests: requests.clone(),
    };
    tokio::spawn(watch(cfg, tx, errors.clone(), cancel.clone()));
    match tokio::time::timeout(WAIT, rx.recv()).await {
        Ok(Some(SourceUpdate::Set(pods))) => assert_eq!(names(&pods), ["web"]),
        other => panic!("expected a SET, got {other:?}"),
    }
    cancel.cancel();
    // The watcher's list was counted as rest_client_requests_total counts it.
    let host = server.addr().to_string();
    let listed = requests
        .get_or_create(&swiftlet::metrics::rest_client::RequestLabels {
            code: "200".into(),
            host,
            method: "GET".into(),
        })
        .get();
    assert!(listed >= 1, "the list and watch requests were not counted");

    let bad = dir.path().join("bad");
    std::fs::write(&bad, "apiVersion: v1\nclusters: [").expect("write");
    let Err(e) = client(&bad, &Default::default()).await else {
        panic!("a bad kubeconfig gave a client");
    };
    assert!(e.to_string().contains("bad"), "{e}");
    let (tx, _rx) = mpsc::channel(8);
    let errors = ErrorCounter::detached(API);
    let cancel = CancellationToken::new();
    let cfg = Config {
        kubeconfig: bad,
        node_name: NODE.to_owned(),
        mirrors: MirrorPods::default(),
        requests: Default::default(),
    };
    let task = tokio::spawn(watch(cfg, tx, errors.clone(), cancel.clone()));
    let deadline = tokio::time::Instant::now() + WAIT;
    while errors.get("kubeconfig") < 1 {
        assert!(tokio::time::Instant::now() < deadline, "not counted");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    cancel.cancel();
    tokio::time::timeout(WAIT, task)
        .await
        .expect("stops on cancel")
        .expect("no panic");
}

#[tokio::test]
async fn runtime_classes_are_read_from_the_api_server_and_cached_briefly() {
    let server = ApiServer::start().await;
    server.put_runtime_class(runtime_class("sandboxed", "swiftlet-alt"));
    let objects = ApiObjects::with_client(server.client());
    let class = objects.runtime_class("sandboxed").await.expect("found");
    assert_eq!(class.handler, "swiftlet-alt");
    let e = objects.runtime_class("nope").await.expect_err("missing");
    assert!(e.is_not_found(), "{e}");
    assert_eq!(e.to_string(), "RuntimeClass \"nope\" not found");
    assert_eq!(server.runtime_class_gets(), 2);

    // The resolver asks once per class and keeps the answer, found or not, for a few seconds.
    let classes = RuntimeClasses::new(objects);
    for _ in 0..3 {
        assert_eq!(
            classes.handler(Some("sandboxed")).await.expect("found"),
            "swiftlet-alt"
        );
        let e = classes.handler(Some("late")).await.expect_err("missing");
        assert_eq!(e.to_string(), "RuntimeClass \"late\" not found");
    }
    assert_eq!(server.runtime_class_gets(), 4);
    // No class: the runtime's default handler, without asking.
    assert_eq!(classes.handler(None).await.expect("default"), "");
    assert_eq!(server.runtime_class_gets(), 4);
}

/// The objects a pod's volumes and environment name come through `ApiObjects`: a configMap and
/// its update (a new resourceVersion), a 404 as NotFound, every service, and a TokenRequest.
#[tokio::test]
async fn config_maps_services_and_tokens_are_read_through_api_objects() {
    let server = ApiServer::start().await;
    let objects = ApiObjects::with_client(server.client());
    server.put_object(config_map("settings", &[("mode", "fast")]));
    let cm = objects
        .config_map("default", "settings")
        .await
        .expect("get");
    let data = cm.data.expect("data");
    assert_eq!(data["mode"], "fast");
    let first_rv = cm.metadata.resource_version.expect("rv");
    server.put_object(config_map("settings", &[("mode", "slow")]));
    let cm = objects
        .config_map("default", "settings")
        .await
        .expect("get");
    assert_eq!(cm.data.expect("data")["mode"], "slow");
    assert_ne!(cm.metadata.resource_version.expect("rv"), first_rv);
    let e = objects.config_map("default", "nope").await.unwrap_err();
    assert!(e.is_not_found(), "{e}");

    server.put_object(service("kubernetes", "default", "10.96.0.1", 443));
    server.put_object(service("web", "shop", "10.96.0.7", 8080));
    assert_eq!(
        service_names(&objects).await.expect("listed"),
        ["default/kubernetes", "shop/web"]
    );

    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec!["api".to_owned()],
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    let e = objects
        .create_token("default", "builder", &request)
        .await
        .unwrap_err();
    assert!(e.is_not_found(), "{e}");
    server.put_object(service_account("builder"));
    let t = objects
        .create_token("default", "builder", &request)
        .await
        .expect("token");
    let status = t.status.expect("status");
    assert_eq!(status.token.split('.').count(), 3);
    let left =
        status.expiration_timestamp.0.as_second() - k8s_openapi::jiff::Timestamp::now().as_second();
    assert!((3500..=3600).contains(&left), "{left}");
    let short = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(60),
            ..request.spec.clone()
        },
        ..Default::default()
    };
    let e = objects
        .create_token("default", "builder", &short)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("10 minutes"), "{e}");
}

/// `namespace/name` of every service `objects` holds, sorted.
async fn service_names(objects: &ApiObjects) -> Result<Vec<String>, swiftlet::api_objects::Error> {
    let mut names: Vec<String> = objects
        .services(|_| true)
        .await?
        .iter()
        .map(|s| {
            let m = &s.metadata;
            format!(
                "{}/{}",
                m.namespace.as_deref().unwrap_or_default(),
                m.name.as_deref().unwrap_or_default()
            )
        })
        .collect();
    names.sort();
    Ok(names)
}

/// Waits until `objects` holds the services `want` (`namespace/name`, sorted) and `check` holds.
async fn until_services(
    objects: &ApiObjects,
    want: &[&str],
    check: impl Fn(&[std::sync::Arc<Service>]) -> bool,
) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let names = service_names(objects).await;
        let all = objects.services(|_| true).await;
        if names.as_deref().is_ok_and(|n| n == want) && all.as_deref().is_ok_and(&check) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "services {names:?}, wanted {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn cluster_ip_of(services: &[std::sync::Arc<Service>], name: &str) -> Option<String> {
    services
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some(name))
        .and_then(|s| s.spec.as_ref()?.cluster_ip.clone())
}

/// The services store of `ApiObjects` lists every service once, then follows the watch of all
/// namespaces: additions, changes and deletions; a dropped watch resumes without a list; a watch
/// whose version was compacted away (410) lists again and the store recovers.
#[tokio::test]
async fn services_are_listed_once_then_watched_through_drops_and_410() {
    let server = ApiServer::start().await;
    server.put_object(service("kubernetes", "default", "10.96.0.1", 443));
    let objects = ApiObjects::with_client(server.client());
    assert_eq!(
        service_names(&objects).await.expect("listed"),
        ["default/kubernetes"]
    );
    let reads = server.object_reads("services");
    assert_eq!((reads.gets, reads.lists), (0, 1), "{reads:?}");

    server.put_object(service("web", "shop", "10.96.0.7", 8080));
    until_services(&objects, &["default/kubernetes", "shop/web"], |_| true).await;
    // A read picks what it asks for.
    let shop = objects
        .services(|s| s.metadata.namespace.as_deref() == Some("shop"))
        .await
        .expect("read");
    assert_eq!(shop.len(), 1);
    server.put_object(service("web", "shop", "10.96.0.8", 8080));
    until_services(&objects, &["default/kubernetes", "shop/web"], |all| {
        cluster_ip_of(all, "web").as_deref() == Some("10.96.0.8")
    })
    .await;
    server.delete_object::<Service>("shop", "web");
    until_services(&objects, &["default/kubernetes"], |_| true).await;
    assert_eq!(
        server.object_reads("services").lists,
        1,
        "changes come by the watch"
    );
    assert_eq!(server.open_cluster_wide_watches(), 1);

    // A dropped watch is made again from the last version seen: nothing is lost, no list.
    server.drop_watches();
    server.put_object(service("db", "shop", "10.96.0.9", 5432));
    until_services(&objects, &["default/kubernetes", "shop/db"], |_| true).await;
    assert_eq!(server.object_reads("services").lists, 1);

    // A change made while the watch is away, then the history compacted: the new watch gets
    // 410 Gone, and a new list brings the store up to date.
    server.drop_watches_and_hold();
    server.put_object(service("cache", "shop", "10.96.0.10", 6379));
    server.delete_object::<Service>("shop", "db");
    server.compact();
    server.release();
    until_services(&objects, &["default/kubernetes", "shop/cache"], |_| true).await;
    assert_eq!(
        server.object_reads("services").lists,
        2,
        "one list after the 410"
    );
}

/// Reads before any list of the services succeeded fail naming why; once the API server
/// lets the list through, the store's next list makes them succeed.
#[tokio::test]
async fn services_reads_fail_until_a_first_list_succeeds() {
    let server = ApiServer::start().await;
    server.put_object(service("kubernetes", "default", "10.96.0.1", 443));
    // Refused with 403, which the client does not retry (it retries a 503 for minutes).
    server.forbid("/api/v1/services");
    let objects = ApiObjects::with_client(server.client());
    let e = service_names(&objects).await.unwrap_err();
    assert!(
        e.to_string()
            .starts_with("listing every Service from the API server: "),
        "{e}"
    );
    assert!(e.to_string().contains("forbidden"), "{e}");
    server.unforbid("/api/v1/services");
    until_services(&objects, &["default/kubernetes"], |_| true).await;
}

/// The sorted names of a list's items.
fn item_names(list: &serde_json::Value) -> Vec<&str> {
    let mut names: Vec<&str> = list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|o| o["metadata"]["name"].as_str())
        .collect();
    names.sort_unstable();
    names
}

/// kubectl, or None (said on stderr) when it is not installed: the check is then skipped, unless
/// `SWIFTLET_REQUIRE_RUNTIME=1`, where a missing kubectl fails the test.
fn kubectl() -> Option<std::path::PathBuf> {
    swiftlet_tests::find_tool("kubectl", "apt-get install kubectl")
}

/// The test API server answers a real client the way the API does: kubectl discovers the core
/// group, lists every pod, gets one, gets a 404 for a missing one, and watches; it reads
/// RuntimeClasses, configMaps, services, claims and PersistentVolumes, and requests tokens.
#[tokio::test(flavor = "multi_thread")]
async fn kubectl_reads_the_test_servers_pods() {
    let Some(kubectl) = kubectl() else {
        return;
    };
    let server = ApiServer::start().await;
    server.put(pod("u1", "web", NODE, "x:1"));
    server.put(pod("u2", "db", "node-b", "x:1"));
    let (_dir, kubeconfig) = server.kubeconfig_file();
    let run = |args: &[&str]| {
        let (kubectl, kubeconfig) = (kubectl.clone(), kubeconfig.clone());
        let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
        tokio::task::spawn_blocking(move || {
            swiftlet_tests::kubectl_output(&kubectl, &kubeconfig, &args)
        })
    };
    let json = |args: &'static [&'static str]| {
        let out = run(args);
        async move {
            let out = out.await.expect("join");
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            assert!(out.status.success(), "kubectl {args:?}: {err}");
            serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("JSON")
        }
    };
    let list = json(&["get", "pods", "-A", "-o", "json"]).await;
    assert_eq!(item_names(&list), ["db", "web"]);

    let one = json(&["get", "pod", "web", "-n", "default", "-o", "json"]).await;
    assert_eq!(one["metadata"]["uid"], "u1");
    assert_eq!(one["spec"]["nodeName"], NODE);

    let out = run(&["get", "pod", "nope", "-n", "default"])
        .await
        .expect("join");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("NotFound") || err.contains("not found"),
        "{err}"
    );

    // RuntimeClasses: discovered in node.k8s.io/v1 and read by name; a missing one is NotFound.
    server.put_runtime_class(runtime_class("sandboxed", "swiftlet-alt"));
    let rc = json(&["get", "runtimeclass", "sandboxed", "-o", "json"]).await;
    assert_eq!(rc["handler"], "swiftlet-alt");
    assert_eq!(rc["apiVersion"], "node.k8s.io/v1");
    let out = run(&["get", "runtimeclass", "nope"]).await.expect("join");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("runtimeclasses.node.k8s.io \"nope\" not found"),
        "{err}"
    );

    // ConfigMaps, services and service accounts: read by name and listed; TokenRequest through
    // `kubectl create token` gets a token and the server records the request.
    server.put_object(config_map("settings", &[("mode", "fast")]));
    let cm = json(&[
        "get",
        "configmap",
        "settings",
        "-n",
        "default",
        "-o",
        "json",
    ])
    .await;
    assert_eq!(cm["data"]["mode"], "fast");
    assert_eq!(cm["kind"], "ConfigMap");
    server.put_object(service("kubernetes", "default", "10.96.0.1", 443));
    server.put_object(service("web", "shop", "10.96.0.7", 8080));
    let svcs = json(&["get", "services", "-A", "-o", "json"]).await;
    assert_eq!(item_names(&svcs), ["kubernetes", "web"]);
    let out = run(&["create", "token", "builder", "-n", "default"])
        .await
        .expect("join");
    assert!(!out.status.success(), "no such service account yet");
    server.put_object(service_account("builder"));
    let out = run(&[
        "create",
        "token",
        "builder",
        "-n",
        "default",
        "--duration",
        "20m",
    ])
    .await
    .expect("join");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).split('.').count(), 3);
    let reqs = server.token_requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].2["expirationSeconds"], 1200);

    // Claims (namespaced) and PersistentVolumes (cluster-scoped): discovered, read by name and
    // listed; a missing volume is NotFound.
    let claim: k8s_openapi::api::core::v1::PersistentVolumeClaim =
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "db-data"}, "spec": {"volumeName": "pv-1"},
            "status": {"phase": "Bound"},
        }))
        .expect("a claim");
    server.put_object(claim);
    let volume: k8s_openapi::api::core::v1::PersistentVolume =
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pv-1"}, "spec": {"local": {"path": "/mnt/disks/one"}},
        }))
        .expect("a volume");
    server.put_cluster_object(volume);
    let pvc = json(&["get", "pvc", "db-data", "-n", "default", "-o", "json"]).await;
    assert_eq!(pvc["status"]["phase"], "Bound");
    assert_eq!(pvc["kind"], "PersistentVolumeClaim");
    let pvs = json(&["get", "pv", "-o", "json"]).await;
    assert_eq!(item_names(&pvs), ["pv-1"]);
    let pv = json(&["get", "pv", "pv-1", "-o", "json"]).await;
    assert_eq!(pv["spec"]["local"]["path"], "/mnt/disks/one");
    assert!(pv["metadata"]["namespace"].is_null(), "{pv}");
    let out = run(&["get", "pv", "nope"]).await.expect("join");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("persistentvolumes \"nope\" not found"),
        "{err}"
    );

    // A watch sees the listed pods, then a pod added while it runs.
    let mut child = tokio::process::Command::new(&kubectl)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args([
            "get",
            "pods",
            "-A",
            "--watch",
            "--output-watch-events",
            "-o",
            "json",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("kubectl watch runs");
    let stdout = child.stdout.take().expect("stdout");
    let seen = tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        let mut stdout = stdout;
        let mut text = String::new();
        let mut buf = [0u8; 4096];
        while !text.contains("\"cache\"") {
            let n = stdout.read(&mut buf).await.unwrap_or(0);
            if n == 0 {
                break;
            }
            text.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        text
    });
    server.wait_watchers(1).await;
    server.put(pod("u3", "cache", NODE, "x:1"));
    let text = tokio::time::timeout(WAIT, seen)
        .await
        .expect("the watch showed the new pod in time")
        .expect("join");
    child.kill().await.ok();
    assert!(text.contains("\"ADDED\""), "{text}");
    assert!(
        text.contains("\"web\"") && text.contains("\"cache\""),
        "{text}"
    );
}

/// The words of each line of kubectl's table output (at least a header and a row).
fn table_rows(table: &str) -> Vec<Vec<&str>> {
    let rows: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert!(rows.len() >= 2, "{table}");
    rows
}

/// Nodes through kubectl: listed with the STATUS column the Ready condition gives, labelled (a
/// patch), read as JSON and deleted; a stale update is refused with a conflict. Pods are
/// listed with their phase, readiness, IP and node.
#[tokio::test(flavor = "multi_thread")]
async fn kubectl_reads_labels_and_deletes_the_test_servers_nodes() {
    let Some(kubectl) = kubectl() else {
        return;
    };
    let server = ApiServer::start().await;
    let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "n1"},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]},
    }))
    .expect("a node");
    let uid = server.create_node(&node);
    let (_dir, kubeconfig) = server.kubeconfig_file();
    let run = |args: &[&str]| {
        let (kubectl, kubeconfig) = (kubectl.clone(), kubeconfig.clone());
        let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
        async move {
            let out = tokio::task::spawn_blocking(move || {
                swiftlet_tests::kubectl_output(&kubectl, &kubeconfig, &args)
            })
            .await
            .expect("join");
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            (
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                err,
            )
        }
    };
    let (ok, table, err) = run(&["get", "nodes"]).await;
    assert!(ok, "{err}");
    let rows = table_rows(&table);
    let header = &rows[0][..];
    assert_eq!(
        header,
        ["NAME", "STATUS", "ROLES", "AGE", "VERSION"],
        "{table}"
    );
    let row = &rows[1];
    assert_eq!(row[..3], ["n1", "Ready", "<none>"], "{table}");
    let (ok, _, err) = run(&["label", "node", "n1", "team=infra"]).await;
    assert!(ok, "{err}");
    let (ok, json, err) = run(&["get", "node", "n1", "-o", "json"]).await;
    assert!(ok, "{err}");
    let json: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(json["metadata"]["labels"]["team"], "infra");
    assert_eq!(json["metadata"]["uid"], uid.as_str());
    assert_eq!(
        json["status"]["conditions"][0]["type"], "Ready",
        "a label keeps the status"
    );

    // A stale resourceVersion: 409.
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(server.client());
    let mut stale = node.clone();
    stale.metadata.resource_version = Some("1".into());
    let e = nodes
        .replace("n1", &Default::default(), &stale)
        .await
        .expect_err("a stale update");
    assert!(matches!(&e, kube::Error::Api(s) if s.code == 409), "{e}");

    let (ok, _, err) = run(&["delete", "node", "n1"]).await;
    assert!(ok, "{err}");
    assert!(server.node("n1").is_none());

    // Pods as `kubectl get pods -A -o wide` shows them: the phase, readiness, IP and node.
    let mut running = pod("u1", "web", NODE, "x:1");
    running.status = Some(
        serde_json::from_value(serde_json::json!({
            "phase": "Running", "podIP": "10.1.2.3",
            "containerStatuses": [{"name": "c", "ready": true, "restartCount": 2, "image": "x:1",
                "imageID": "", "state": {"running": {}}}],
        }))
        .expect("a status"),
    );
    server.put(running);
    let (ok, table, err) = run(&["get", "pods", "-A", "-o", "wide"]).await;
    assert!(ok, "{err}");
    let rows = table_rows(&table);
    let header = &rows[0][..];
    assert_eq!(
        header,
        [
            "NAMESPACE",
            "NAME",
            "READY",
            "STATUS",
            "RESTARTS",
            "AGE",
            "IP",
            "NODE"
        ],
        "{table}"
    );
    let row = &rows[1];
    assert_eq!(
        [row[0], row[1], row[2], row[3], row[4], row[6], row[7]],
        ["default", "web", "1/1", "Running", "2", "10.1.2.3", NODE],
        "{table}"
    );
}

/// The node authorizer's rule for storage objects, as the test server enforces it on a node's
/// credentials: a claim is readable only while a pod bound to the node uses it (by name, or as
/// a generic ephemeral volume's `<pod>-<volume>`), a PersistentVolume only while such a claim
/// is bound to it; anything else is 403 with the authorizer's reason.
#[tokio::test(flavor = "multi_thread")]
async fn a_nodes_credentials_read_only_the_claims_and_volumes_its_pods_use() {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    let server = ApiServer::start_tls().await;
    let node = swiftlet_tests::api_server::CERT_USER
        .strip_prefix("system:node:")
        .expect("a node's user");
    let with_volumes = |uid: &str, name: &str, on: &str, volumes: serde_json::Value| {
        let mut p = pod(uid, name, on, "x:1");
        p.spec.as_mut().expect("spec").volumes =
            Some(serde_json::from_value(volumes).expect("volumes"));
        p
    };
    server.put(with_volumes(
        "u1",
        "db",
        node,
        serde_json::json!([
            {"name": "data", "persistentVolumeClaim": {"claimName": "db-data"}},
            {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
        ]),
    ));
    server.put(with_volumes(
        "u2",
        "other",
        "node-b",
        serde_json::json!([{"name": "data", "persistentVolumeClaim": {"claimName": "b-data"}}]),
    ));
    for (claim, pv) in [
        ("db-data", "pv-1"),
        ("db-scratch", "pv-2"),
        ("b-data", "pv-3"),
    ] {
        let c: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": claim}, "spec": {"volumeName": pv}, "status": {"phase": "Bound"},
        }))
        .expect("a claim");
        server.put_object(c);
        let v: PersistentVolume =
            serde_json::from_value(serde_json::json!({"metadata": {"name": pv}, "spec": {}}))
                .expect("a volume");
        server.put_cluster_object(v);
    }
    let (_dir, kubeconfig) =
        server.kubeconfig_file_as(swiftlet_tests::api_server::Credential::ClientCertificate);
    let client = swiftlet::config::api::client(&kubeconfig, &Default::default())
        .await
        .expect("a client");
    let objects = ApiObjects::with_client(client);
    for (claim, pv) in [("db-data", "pv-1"), ("db-scratch", "pv-2")] {
        let got = objects.persistent_volume_claim("default", claim).await;
        assert!(got.is_ok(), "{claim}: {got:?}");
        let got = objects.persistent_volume(pv).await;
        assert!(got.is_ok(), "{pv}: {got:?}");
    }
    let e = objects
        .persistent_volume_claim("default", "b-data")
        .await
        .expect_err("another node's claim");
    let text = format!("{e:?}");
    assert!(
        text.contains("no relationship found between node 'swiftlet' and this object")
            && text.contains("403"),
        "{text}"
    );
    assert!(objects.persistent_volume("pv-3").await.is_err());
    // The claim's pod gone: its claim and volume are no longer the node's to read.
    server.delete("u1");
    assert!(
        objects
            .persistent_volume_claim("default", "db-data")
            .await
            .is_err()
    );
    assert!(objects.persistent_volume("pv-1").await.is_err());
}
