//! Pod sources end to end: a manifest URL served from a loopback HTTP server -> swiftlet -> a real
//! containerd. (The API-server source has no real kube-apiserver to run against on this machine;
//! it is tested in-process, see `agent/src/config/api.rs`.)

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use swiftlet_tests::{Agent, AgentOptions, Runtime};

const RUNNING_TIMEOUT: Duration = Duration::from_secs(90);
const GONE_TIMEOUT: Duration = Duration::from_secs(60);

/// A pod list item whose one container loops until SIGTERM.
fn item(name: &str) -> String {
    format!(
        r#"{{"metadata": {{"name": "{name}", "namespace": "default"}},
  "spec": {{"terminationGracePeriodSeconds": 5, "containers": [{{"name": "main",
    "image": "localhost/swiftlet/busybox:v1", "imagePullPolicy": "Never",
    "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]}}]}}}}"#
    )
}

fn pod_list(items: &[String]) -> String {
    format!(
        r#"{{"kind": "PodList", "apiVersion": "v1", "items": [{}]}}"#,
        items.join(",")
    )
}

/// What the loopback server answers, and the request heads it received.
#[derive(Default)]
struct Served {
    body: String,
    requests: Vec<String>,
}

/// A minimal HTTP/1.1 server on 127.0.0.1 answering every request with `Served::body`
/// (one request per connection). Runs on a thread until the process ends.
fn serve(served: Arc<Mutex<Served>>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let body = {
                let mut s = served.lock().expect("lock");
                s.requests.push(String::from_utf8_lossy(&head).into_owned());
                s.body.clone()
            };
            let resp = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(resp.as_bytes());
        }
    });
    addr
}

fn metric(agent: &Agent, prefix: &str) -> f64 {
    let (status, metrics) = agent.get("/metrics");
    assert_eq!(status, 200);
    metrics
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn manifest_url_pods_run_update_and_go() {
    let Some(rt) = Runtime::shared() else {
        return;
    };
    let served = Arc::new(Mutex::new(Served {
        body: pod_list(&[item("web"), item("worker"), item("Bad_Name")]),
        ..Default::default()
    }));
    let addr = serve(served.clone());
    let mut opts = AgentOptions::new("http-source");
    opts.extra_args = vec![
        "--manifest-url".into(),
        format!("http://{addr}/pods"),
        "--manifest-url-header".into(),
        "Authorization:Bearer t0ken,X-Test:one".into(),
        "--http-check-frequency".into(),
        "200ms".into(),
    ];
    let agent = Agent::start(rt, opts);
    let web = agent.static_pod_name("web");
    let worker = agent.static_pod_name("worker");

    let list = agent.wait_for(
        |l| l.is_running(&web) && l.is_running(&worker),
        RUNNING_TIMEOUT,
    );
    let web_uid = list.uid(&web).expect("uid").to_owned();
    {
        let s = served.lock().expect("lock");
        let first = s.requests.first().expect("a request").to_ascii_lowercase();
        assert!(first.starts_with("get /pods "), "{first}");
        assert!(first.contains("authorization: bearer t0ken"), "{first}");
        assert!(first.contains("x-test: one"), "{first}");
    }
    // The invalid item is rejected alone, counted with its reason.
    assert!(
        metric(
            &agent,
            r#"swiftlet_config_errors_total{source="http",reason="bad_name"}"#
        ) >= 1.0,
        "bad item not counted"
    );
    assert!(
        agent.log().contains("items[2]"),
        "the log names the bad item"
    );

    // worker leaves the list: it is stopped and removed; web is untouched (same UID, still running).
    served.lock().expect("lock").body = pod_list(&[item("web")]);
    let list = agent.wait_for(|l| l.get(&worker).is_none(), GONE_TIMEOUT);
    assert!(list.is_running(&web), "{}", list.summary());
    assert_eq!(list.uid(&web), Some(web_uid.as_str()));

    // The server goes bad: the last good set stays.
    served.lock().expect("lock").body = "{not json".into();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while metric(
        &agent,
        r#"swiftlet_config_errors_total{source="http",reason="syntax"}"#,
    ) < 1.0
    {
        assert!(
            std::time::Instant::now() < deadline,
            "syntax error not counted"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        agent.pods().is_running(&web),
        "a bad body must not remove pods"
    );
}
