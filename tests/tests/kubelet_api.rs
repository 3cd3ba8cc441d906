//! The kubelet API (`--port`, TLS) on the real containerd, through a TLS client of the test's
//! own: with a client certificate signed by `--client-ca-file`, exec runs `echo` in a container
//! over WebSocket (the runtime's streaming server behind the agent's proxy) and a failing
//! command reports its exit code; without a certificate every endpoint answers 401 (exec
//! included), and a certificate of another CA does not get through the handshake.
//! `/containerLogs` serves the CRI log as the container wrote it, with `tailLines`,
//! `limitBytes`, `timestamps`, `previous` (a crash-looping container's last instance) and
//! `follow` (ends when the container exits). `/run` answers a command's output. A connection
//! that sends no request is closed after the header-read timeout.
//!
//! With the webhooks (`--authentication-token-webhook`, `--authorization-mode=Webhook`) against
//! the in-process HTTPS API server: a bearer token is reviewed there (an unknown one is 401),
//! and every request is allowed or refused (403, the kubelet's message) by a
//! SubjectAccessReview on `nodes/<subresource>` of the node; answers are cached, a denial only
//! for its shorter TTL.
//!
//! And the reliability suite's `security` scenario, its attacks made against one agent.

use std::net::SocketAddr;
use std::time::Duration;

use futures::StreamExt;
use swiftlet_tests::certs::{Usage, make_ca, make_leaf};
use swiftlet_tests::kubelet_client::{
    client, connect, current_thread, kubelet_api_options, request, request_as, websocket,
};
use swiftlet_tests::{Agent, AgentOptions, Runtime, busybox_pod_manifest, script_pod_manifest};
use tokio_tungstenite::tungstenite::Message;

const TIMEOUT: Duration = Duration::from_secs(60);

/// What an exec over WebSocket (`v4.channel.k8s.io`) brought back: stdout, stderr and the
/// status document of channel 3.
#[derive(Debug, Default)]
struct Exec {
    stdout: String,
    stderr: String,
    status: String,
}

async fn exec(
    tls: &tokio_rustls::TlsConnector,
    addr: SocketAddr,
    path: &str,
) -> Result<Exec, String> {
    let mut ws = websocket(tls, addr, path).await?;
    let mut out = Exec::default();
    while let Some(msg) = tokio::time::timeout(TIMEOUT, ws.next())
        .await
        .map_err(|_| "no end of the exec stream in time")?
    {
        match msg.map_err(|e| format!("reading the stream: {e}"))? {
            Message::Binary(b) if !b.is_empty() => {
                let text = String::from_utf8_lossy(&b[1..]);
                match b[0] {
                    1 => out.stdout.push_str(&text),
                    2 => out.stderr.push_str(&text),
                    3 => out.status.push_str(&text),
                    _ => {}
                }
            }
            Message::Close(_) => break,
            _ => {}
        }
    }
    let _ = ws.close(None).await;
    Ok(out)
}

/// Port-forwards to `port` of the pod through `/portForward` over WebSocket and reads what the
/// pod's listener sends: the bytes of the data channel after its port header.
async fn port_forward(
    tls: &tokio_rustls::TlsConnector,
    addr: SocketAddr,
    pod: &str,
    port: u16,
) -> Result<String, String> {
    let mut ws = websocket(
        tls,
        addr,
        &format!("/portForward/default/{pod}?ports={port}"),
    )
    .await?;
    // Each channel starts with the port, little-endian; then data (channel 0) or errors (1).
    let mut data: Vec<u8> = Vec::new();
    let mut headers = 0;
    while !String::from_utf8_lossy(&data).contains('\n') {
        let msg = tokio::time::timeout(TIMEOUT, ws.next())
            .await
            .map_err(|_| "no data from the forwarded port in time")?
            .ok_or("the port-forward stream ended")?
            .map_err(|e| format!("reading the stream: {e}"))?;
        let Message::Binary(b) = msg else { continue };
        let Some((&channel, rest)) = b.split_first() else {
            continue;
        };
        let rest = if headers < 2 && rest.len() >= 2 && rest[..2] == port.to_le_bytes() {
            headers += 1;
            &rest[2..]
        } else {
            rest
        };
        match channel {
            0 => data.extend_from_slice(rest),
            1 if !rest.is_empty() => {
                return Err(format!("error channel: {}", String::from_utf8_lossy(rest)));
            }
            _ => {}
        }
    }
    let _ = ws.close(None).await;
    Ok(String::from_utf8_lossy(&data).into_owned())
}

fn pod_running(agent: &Agent, pod: &str) {
    agent.wait_for(|p| p.is_running(pod), TIMEOUT);
}

#[test]
fn the_kubelet_api_serves_exec_and_logs_to_certified_callers_only() {
    let Some(rt) = Runtime::shared() else { return };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (opts, port) = kubelet_api_options(d, "kubelet-api");
    make_ca(d, "rogue", "/CN=another CA").unwrap();
    make_leaf(d, "rogue", "mallory", "/CN=mallory", Usage::Client).unwrap();
    let agent = Agent::start(rt, opts);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let node = agent.node_name().to_owned();
    agent.write_manifest(
        "talker.yaml",
        &busybox_pod_manifest(
            &format!("name: talker, namespace: default, uid: talker-{node}"),
            "",
            "echo oops >&2; sleep 0.5; for i in 1 2 3 4 5; do echo line $i; done; sleep 3600 & wait",
            "",
        ),
    );
    agent.write_manifest(
        "crasher.yaml",
        &script_pod_manifest(
            &node,
            "crasher",
            "Always",
            "echo run $(cat /proc/sys/kernel/random/uuid); sleep 6; exit 1",
            "",
        ),
    );
    agent.write_manifest(
        "listener.yaml",
        &busybox_pod_manifest(
            &format!("name: listener, namespace: default, uid: listener-{node}"),
            "",
            "nc -ll -p 8080 -e echo forwarded & wait",
            "",
        ),
    );
    let talker = agent.static_pod_name("talker");
    let crasher = agent.static_pod_name("crasher");
    let listener = agent.static_pod_name("listener");
    pod_running(&agent, &talker);
    pod_running(&agent, &listener);
    let alice = client(d, Some("alice"));
    let nobody = client(d, None);
    let mallory = client(d, Some("mallory"));
    let rt = current_thread();
    // A connection that sends no request after its handshake, checked at the end.
    let idle_since = std::time::Instant::now();
    let mut idle = rt
        .block_on(connect(&alice, addr))
        .expect("an idle connection");

    rt.block_on(async {
        // Exec with a certificate: echo's output and a Success status.
        let ok = exec(
            &alice,
            addr,
            &format!("/exec/default/{talker}/main?command=echo&command=hello%20there&output=1&error=1"),
        )
        .await
        .unwrap();
        assert_eq!(ok.stdout, "hello there\n", "{ok:?}");
        assert!(ok.status.contains("Success"), "{ok:?}");
        let failed = exec(
            &alice,
            addr,
            &format!(
                "/exec/default/{talker}/main?command=sh&command=-c&command=echo%20bad%20%3E%262%3B%20exit%203&output=1&error=1"
            ),
        )
        .await
        .unwrap();
        assert_eq!(failed.stderr, "bad\n", "{failed:?}");
        assert!(
            failed.status.contains("NonZeroExitCode") && failed.status.contains("\"3\""),
            "{failed:?}"
        );

        // No certificate: refused, exec included; another CA's certificate: no handshake.
        let (code, body) = request(&nobody, addr, "GET", "/pods").await.unwrap();
        assert_eq!((code, body.trim()), (401, "Unauthorized"));
        let refused = exec(
            &nobody,
            addr,
            &format!("/exec/default/{talker}/main?command=echo&command=hi&output=1"),
        )
        .await
        .unwrap_err();
        assert!(refused.contains("401"), "{refused}");
        let rogue = request(&mallory, addr, "GET", "/pods").await;
        assert!(rogue.is_err(), "a foreign CA's certificate got through: {rogue:?}");

        // What the agent runs, to a certified caller.
        let (code, body) = request(&alice, addr, "GET", "/pods").await.unwrap();
        assert_eq!(code, 200, "{body}");
        assert!(body.contains(&talker), "{body}");
        let (code, body) = request(&alice, addr, "GET", "/containerLogs/default/nope/main")
            .await
            .unwrap();
        assert_eq!(code, 404, "{body}");

        // Logs and their options.
        let logs = |q: String| {
            let alice = alice.clone();
            async move {
                request(&alice, addr, "GET", &q).await.unwrap()
            }
        };
        let base = format!("/containerLogs/default/{talker}/main");
        // The whole log once the container has written it (stderr, then stdout half a second
        // later: the two pipes are copied apart, so only a gap orders them).
        let want = "oops\nline 1\nline 2\nline 3\nline 4\nline 5\n";
        let mut all = (0, String::new());
        for _ in 0..100 {
            all = logs(base.clone()).await;
            if all.1 == want {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(all, (200, want.to_owned()));
        assert_eq!(logs(format!("{base}?tailLines=2")).await.1, "line 4\nline 5\n");
        assert_eq!(logs(format!("{base}?limitBytes=10")).await.1, "oops\nline ");
        let stamped = logs(format!("{base}?timestamps=true&tailLines=1")).await.1;
        let (at, text) = stamped.split_once(' ').unwrap();
        assert_eq!(text, "line 5\n");
        assert!(at.starts_with("20") && at.ends_with('Z') && at.contains('T'), "{stamped}");
        let (code, body) = logs(format!("{base}?previous=true")).await;
        assert_eq!(code, 400, "{body}");
        assert!(body.contains("previous terminated container"), "{body}");
        let (code, body) = logs(format!("{base}?tailLines=-1")).await;
        assert_eq!(code, 400, "{body}");

        // /run: a command's output.
        let (code, body) = request(
            &alice,
            addr,
            "POST",
            &format!("/run/default/{talker}/main?cmd=echo%20ran"),
        )
        .await
        .unwrap();
        assert_eq!((code, body.as_str()), (200, "ran\n"));

        // Port-forward: what the pod's listener on 8080 says, in its network namespace.
        let mut said = Err(String::new());
        for _ in 0..50 {
            said = port_forward(&alice, addr, &listener, 8080).await;
            if said.is_ok() {
                break;
            }
            // The listener may not be up yet.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_eq!(said.as_deref(), Ok("forwarded\n"));
        let refused = port_forward(&nobody, addr, &listener, 8080).await.unwrap_err();
        assert!(refused.contains("401"), "{refused}");
    });

    // previous: the crash-looping container's last instance, not its running one.
    agent.wait_for(
        |p| {
            p.container(&crasher, "main").is_some_and(|c| {
                c.restart_count >= 1 && c.state.as_ref().is_some_and(|s| s.running.is_some())
            })
        },
        TIMEOUT,
    );
    rt.block_on(async {
        let base = format!("/containerLogs/default/{crasher}/main");
        // Read within the instance's 6 s: the running one first.
        let (code, current) = request(&alice, addr, "GET", &base).await.unwrap();
        assert_eq!(code, 200, "{current}");
        let (code, previous) = request(&alice, addr, "GET", &format!("{base}?previous=true"))
            .await
            .unwrap();
        assert_eq!(code, 200, "{previous}");
        assert!(
            previous.starts_with("run ") && current.starts_with("run "),
            "{previous:?} {current:?}"
        );
        assert_ne!(previous, current, "previous must be another instance's log");
    });

    // follow: the log as it is written, ending when the container exits.
    agent.write_manifest(
        "ticker.yaml",
        &script_pod_manifest(
            &node,
            "ticker",
            "Never",
            "sleep 1; for i in 1 2 3 4 5; do echo tick $i; sleep 0.3; done",
            "",
        ),
    );
    let ticker = agent.static_pod_name("ticker");
    pod_running(&agent, &ticker);
    rt.block_on(async {
        let path = format!("/containerLogs/default/{ticker}/main?follow=true");
        let followed = tokio::time::timeout(TIMEOUT, request(&alice, addr, "GET", &path))
            .await
            .expect("a followed log ends when its container exits")
            .unwrap();
        assert_eq!(
            followed,
            (200, "tick 1\ntick 2\ntick 3\ntick 4\ntick 5\n".to_owned())
        );
    });

    // The idle connection is closed once the header-read timeout has passed.
    let limit = swiftlet::server::kubelet_api::HEADER_READ_TIMEOUT + Duration::from_secs(3);
    if let Some(left) = limit.checked_sub(idle_since.elapsed()) {
        std::thread::sleep(left);
    }
    rt.block_on(async {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 64];
        let read = tokio::time::timeout(Duration::from_secs(5), idle.read(&mut buf))
            .await
            .expect("the server closed the idle connection rather than leaving it open");
        assert!(
            matches!(read, Ok(0) | Err(_)),
            "an idle connection got {read:?}"
        );
    });
}

/// `/stats/summary` (read-only port; the kubelet API serves the same handler): the node's cpu,
/// memory, file systems, network and process limits, and a pod's cgroup usage (32 MiB held in a
/// memory-backed emptyDir counts in its working set and in the volume's entry), network,
/// processes and container stats.
#[test]
fn the_stats_summary_reports_the_node_its_pods_and_their_containers() {
    let Some(rt) = Runtime::shared() else {
        return;
    };
    let mut opts = AgentOptions::new("stats-summary");
    // Volumes measured every second rather than every minute, so the test need not wait.
    opts.extra_args = vec!["--volume-stats-agg-period".into(), "1s".into()];
    let agent = Agent::start(rt, opts);
    let node = agent.node_name().to_owned();
    agent.write_manifest(
        "holder.yaml",
        &busybox_pod_manifest(
            &format!("name: holder, namespace: default, uid: holder-{node}"),
            "  volumes:\n  - name: mem\n    emptyDir: {medium: Memory}\n",
            "dd if=/dev/zero of=/mem/f bs=1M count=32 2>/dev/null; i=0; \
             while [ $i -lt 20000 ]; do i=$((i+1)); done; sleep 3600 & wait",
            "    volumeMounts:\n    - {name: mem, mountPath: /mem}\n",
        ),
    );
    let holder = agent.static_pod_name("holder");
    pod_running(&agent, &holder);
    let summary = || -> serde_json::Value {
        let (code, body) = agent.get("/stats/summary");
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
    };
    let pod_of = |s: &serde_json::Value| -> Option<serde_json::Value> {
        s["pods"]
            .as_array()?
            .iter()
            .find(|p| p["podRef"]["name"] == holder.as_str())
            .cloned()
    };
    let held = 32 << 20;
    let mut pod = serde_json::Value::Null;
    for _ in 0..150 {
        if let Some(p) = pod_of(&summary())
            && p["memory"]["workingSetBytes"].as_u64().unwrap_or(0) >= held
            && p["containers"][0]["cpu"]["usageCoreNanoSeconds"]
                .as_u64()
                .unwrap_or(0)
                > 0
            // The writable layer is read off the request path, at most every 10 s.
            && p["containers"][0]["rootfs"]["usedBytes"].is_u64()
            // So are the volumes, here every second.
            && p["volume"][0]["usedBytes"].as_u64().unwrap_or(0) >= held
        {
            pod = p;
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(
        pod.is_object(),
        "no summary of the pod with its memory: {}",
        summary()
    );
    assert_eq!(pod["podRef"]["namespace"], "default");
    assert_eq!(pod["podRef"]["uid"], format!("holder-{node}"));
    assert!(
        pod["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap_or(0) > 0,
        "{pod}"
    );
    assert!(
        pod["processStats"]["processCount"].as_u64().unwrap_or(0) >= 1,
        "{pod}"
    );
    assert_eq!(pod["network"]["name"], "eth0", "{pod}");
    assert!(pod["network"]["rxBytes"].is_u64(), "{pod}");
    let c = &pod["containers"][0];
    assert_eq!(c["name"], "main");
    assert!(
        c["memory"]["workingSetBytes"].as_u64().unwrap_or(0) > 0,
        "{c}"
    );
    assert!(c["rootfs"]["usedBytes"].is_u64(), "{c}");
    let v = &pod["volume"][0];
    assert_eq!(v["name"], "mem", "{pod}");
    assert!(
        v["capacityBytes"].as_u64().unwrap_or(0) >= v["availableBytes"].as_u64().unwrap_or(0)
            && v["capacityBytes"].as_u64().unwrap_or(0) >= held,
        "{v}"
    );
    assert!(
        v["inodesUsed"].as_u64().unwrap_or(0) >= 2,
        "the directory and f: {v}"
    );
    assert!(
        v["time"].as_str().is_some_and(|t| t.starts_with("20")),
        "{v}"
    );
    // A second read has a cpu rate.
    let again = pod_of(&summary()).unwrap_or_default();
    assert!(again["cpu"]["usageNanoCores"].is_u64(), "{again}");

    let s = summary();
    let n = &s["node"];
    assert_eq!(n["nodeName"], node.as_str());
    assert!(
        n["startTime"].as_str().is_some_and(|t| t.starts_with("20")),
        "{n}"
    );
    assert!(
        n["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap_or(0) > 0,
        "{n}"
    );
    let mem = &n["memory"];
    assert!(
        mem["availableBytes"].as_u64().unwrap_or(0) > 0
            && mem["workingSetBytes"].as_u64().unwrap_or(0) > held,
        "{mem}"
    );
    for fs in [&n["fs"], &n["runtime"]["imageFs"]] {
        let (cap, avail) = (fs["capacityBytes"].as_u64(), fs["availableBytes"].as_u64());
        assert!(cap.is_some_and(|c| c > 0) && avail <= cap, "{fs}");
        assert!(fs["inodes"].as_u64().unwrap_or(0) > 0, "{fs}");
    }
    assert!(n["rlimit"]["maxpid"].as_u64().unwrap_or(0) > 0, "{n}");
    assert!(n["rlimit"]["curproc"].as_u64().unwrap_or(0) > 0, "{n}");
    assert!(
        n["network"]["interfaces"]
            .as_array()
            .is_some_and(|i| !i.is_empty()),
        "{n}"
    );

    // The running containers are listed again only after a change the agent or the kernel saw:
    // a pod started after the summaries above shows its container.
    agent.write_manifest(
        "late.yaml",
        &busybox_pod_manifest(
            &format!("name: late, namespace: default, uid: late-{node}"),
            "",
            "sleep 3600",
            "",
        ),
    );
    let late = agent.static_pod_name("late");
    pod_running(&agent, &late);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let s = summary();
        let shown = s["pods"].as_array().and_then(|pods| {
            pods.iter()
                .find(|p| p["podRef"]["name"] == late.as_str())
                .map(|p| p["containers"][0]["name"] == "main")
        });
        if shown == Some(true) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the late pod's container never showed: {s}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }

    // The metric paths share one reading up to 10 s old (two scrapes in a row give the same
    // node sample, value and time), while the summary reads anew and refreshes it.
    let node_sample = || -> String {
        let (code, body) = agent.get("/metrics/resource");
        assert_eq!(code, 200, "{body}");
        body.lines()
            .find(|l| l.starts_with("node_cpu_usage_seconds_total "))
            .unwrap_or_else(|| panic!("no node cpu sample: {body}"))
            .to_owned()
    };
    let first = node_sample();
    assert_eq!(
        node_sample(),
        first,
        "a second scrape read the cgroups again"
    );
    std::thread::sleep(Duration::from_millis(20));
    summary();
    assert_ne!(
        node_sample(),
        first,
        "the summary read nothing new, or the metrics did not take its reading"
    );
}

/// The webhooks: who may use the kubelet API is the API server's decision.
#[test]
fn the_api_server_decides_who_may_use_the_kubelet_api() {
    use swiftlet_tests::api_server::{ApiServer, Credential};
    let Some(rt) = Runtime::shared() else { return };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let tokio = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let server = tokio.block_on(ApiServer::start_tls());
    server.add_review_token("bob-token", "bob", &["devs"]);
    server.allow("bob", "proxy");
    server.allow("alice", "stats");
    let (mut opts, port) = kubelet_api_options(d, "kubelet-api-webhook");
    let _kubeconfig = server.point_agent_as(&mut opts, Credential::ClientCertificate);
    opts.extra_args.extend(
        [
            "--authentication-token-webhook",
            "--authorization-mode",
            "Webhook",
            "--authorization-webhook-cache-unauthorized-ttl",
            "1s",
        ]
        .map(String::from),
    );
    let agent = Agent::start(rt, opts);
    let node = agent.node_name().to_owned();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let (anyone, alice) = (client(d, None), client(d, Some("alice")));
    let call = |tls: &tokio_rustls::TlsConnector, path: &str, token: Option<&str>| {
        tokio
            .block_on(request_as(tls, addr, "GET", path, token))
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
    };
    // A reviewed token: bob may use the proxy subresource (/pods), not stats.
    let (status, body) = call(&anyone, "/pods", Some("bob-token"));
    assert_eq!(status, 200, "{body}");
    let (status, body) = call(&anyone, "/stats/summary", Some("bob-token"));
    assert_eq!(status, 403, "{body}");
    assert_eq!(
        body.trim(),
        "Forbidden (user=bob, verb=get, resource=nodes, subresource=stats)"
    );
    // Unknown tokens and no credential at all: 401.
    assert_eq!(call(&anyone, "/pods", Some("not-a-token")).0, 401);
    assert_eq!(call(&anyone, "/pods", None).0, 401);
    // A client certificate's user is reviewed too.
    assert_eq!(call(&alice, "/stats/summary", None).0, 200);
    assert_eq!(call(&alice, "/pods", None).0, 403);
    // What the API server was asked.
    let reviews = server.access_reviews();
    let bob_proxy = reviews
        .iter()
        .find(|r| r["user"] == "bob" && r["resourceAttributes"]["subresource"] == "proxy")
        .unwrap_or_else(|| panic!("bob's review: {reviews:?}"));
    assert_eq!(bob_proxy["groups"], serde_json::json!(["devs"]));
    let attrs = &bob_proxy["resourceAttributes"];
    assert_eq!(
        (&attrs["verb"], &attrs["resource"], &attrs["name"]),
        (
            &serde_json::json!("get"),
            &serde_json::json!("nodes"),
            &serde_json::json!(node)
        )
    );
    let alice_review = reviews
        .iter()
        .find(|r| r["user"] == "alice")
        .expect("alice's review");
    assert_eq!(
        alice_review["groups"],
        serde_json::json!(["system:authenticated", "ops"])
    );
    // Answers are cached: the same token and request again ask nothing more.
    let (tokens, access) = (server.token_reviews(), server.access_reviews().len());
    assert_eq!(call(&anyone, "/pods", Some("bob-token")).0, 200);
    assert_eq!(server.token_reviews(), tokens);
    assert_eq!(server.access_reviews().len(), access);
    // A denial is cached for its TTL only (1 s here): granted later, the request goes through.
    server.allow("bob", "stats");
    std::thread::sleep(Duration::from_millis(1500));
    let (status, body) = call(&anyone, "/stats/summary", Some("bob-token"));
    assert_eq!(status, 200, "{body}");
}

/// The `security` scenario of the reliability suite (`tests/src/attacks.rs`): every attack on a
/// running agent that docs/security.md lists for it, and each ends safely. It runs here rather
/// than with the other scenarios' quick forms in `chaos.rs`: its load (TLS handshakes by the
/// hundred, a 40 MB log) beside the hostile-input scenario there pushed that scenario's 9.7 MB
/// manifest fetch past its 10 s deadline.
#[test]
fn every_attack_on_a_running_agent_fails_safely() {
    let Some(rt) = Runtime::shared() else { return };
    let (outcome, attacks) = swiftlet_tests::attacks::security(rt, 20261207);
    outcome.assert_passed();
    assert_eq!(attacks.len(), 7, "{attacks:#?}");
    for a in &attacks {
        assert!(a.tried > 0 && a.held == a.tried, "{a:#?}");
    }
}
