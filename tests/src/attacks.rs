//! The `security` scenario of the reliability suite: attacks on a running agent (the kubelet API
//! from the network, a static pod's spec, another local user), each checked for its safe
//! outcome, on the real containerd. docs/security.md lists them with what each would have done
//! to a build without its fix; `cargo xtask chaos -- --scenario security` runs them and prints
//! how many of each held, and `tests/tests/kubelet_api.rs` runs them in CI.
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use tokio_tungstenite::tungstenite::Message;

use crate::certs::{Usage, make_ca, make_leaf};
use crate::chaos::{Outcome, metric_by_label, peak_kib, reset_peak};
use crate::kubelet_client::{client, current_thread, kubelet_api_options, request, websocket};
use crate::rng::Rng;
use crate::{Agent, Runtime, busybox_pod_manifest};

/// How long each wait of the scenario may take.
const TIMEOUT: Duration = Duration::from_secs(120);

/// The exec streams' idle limit the scenario's agent is given.
pub const STREAM_IDLE: Duration = Duration::from_secs(4);

/// The most a log request on a 40 MB log may raise the agent's peak RSS, in KiB (a read of the
/// whole log raised it by about 40 MiB).
const LOG_REQUEST_KIB: u64 = 16 << 10;

/// One kind of attack: how many times it was made and how many times the outcome was the safe
/// one, and what happened when it was not.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Attack {
    pub name: &'static str,
    pub tried: usize,
    pub held: usize,
    pub failures: Vec<String>,
}

impl Attack {
    fn new(name: &'static str) -> Self {
        Self {
            name,
            tried: 0,
            held: 0,
            failures: Vec::new(),
        }
    }

    /// One try: held when `outcome` is `Ok`, else its reason is kept.
    fn check(&mut self, outcome: Result<(), String>) {
        self.tried += 1;
        match outcome {
            Ok(()) => self.held += 1,
            Err(why) => self.failures.push(why),
        }
    }
}

/// Runs every attack once against one agent; `seed` orders the unauthenticated requests.
pub fn security(runtime: &Runtime, seed: u64) -> (Outcome, Vec<Attack>) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let d = dir.path();
    let (mut opts, port) = kubelet_api_options(d, "chaos-security");
    opts.extra_args.extend([
        "--container-log-max-size".into(),
        "1Gi".into(),
        "--streaming-connection-idle-timeout".into(),
        format!("{}s", STREAM_IDLE.as_secs()),
    ]);
    make_ca(d, "rogue", "/CN=another CA").expect("a second CA");
    make_leaf(d, "rogue", "mallory", "/CN=mallory", Usage::Client).expect("its certificate");
    let agent = Agent::start(runtime, opts);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let node = agent.node_name().to_owned();
    // A container that writes some 40 MB of log (lines of 1,000 bytes), then says so.
    let line = "a".repeat(1000);
    agent.write_manifest(
        "writer.yaml",
        &busybox_pod_manifest(
            &format!("name: writer, namespace: default, uid: writer-{node}"),
            "",
            &format!("yes {line} | head -n 40000; echo written; sleep 3600 & wait"),
            "",
        ),
    );
    let writer = agent.static_pod_name("writer");
    agent.wait_for(|p| p.is_running(&writer), TIMEOUT);
    let peers = Peers {
        alice: client(d, Some("alice")),
        nobody: client(d, None),
        server_as_client: client(d, Some("server")),
        mallory: client(d, Some("mallory")),
    };
    let mut rng = Rng::new(seed);
    let attacks = vec![
        unauthenticated(&peers, addr, &writer, &mut rng),
        refused_certificates(&peers, addr),
        log_requests(&agent, &peers, addr, &writer),
        idle_stream(&peers, addr, &writer),
        connections_past_the_cap(&agent, &peers, addr),
        uid_escape(&agent),
        local_user(&agent, &format!("writer-{node}")),
    ];
    let mut outcome = Outcome::new("security", seed);
    for a in &attacks {
        outcome.faults += a.tried;
        for f in &a.failures {
            outcome.violations.push(format!("{}: {f}", a.name));
        }
    }
    (outcome, attacks)
}

/// The scenario's TLS clients.
struct Peers {
    /// A client certificate of the cluster CA.
    alice: tokio_rustls::TlsConnector,
    /// No certificate.
    nobody: tokio_rustls::TlsConnector,
    /// The cluster CA's certificate made for a server (no `clientAuth`).
    server_as_client: tokio_rustls::TlsConnector,
    /// Another CA's client certificate.
    mallory: tokio_rustls::TlsConnector,
}

/// Every endpoint, odd and unknown paths, with every method, without a certificate: 401 each.
fn unauthenticated(peers: &Peers, addr: SocketAddr, pod: &str, rng: &mut Rng) -> Attack {
    let mut a = Attack::new("requests without a certificate (every path and method)");
    let paths = [
        "/pods".to_owned(),
        "/stats/summary".into(),
        "/metrics".into(),
        "/metrics/resource".into(),
        "/metrics/cadvisor".into(),
        "/metrics/probes".into(),
        "/healthz".into(),
        "/debug/pprof/".into(),
        "/configz".into(),
        "/logs/".into(),
        format!("/exec/default/{pod}/main?command=id&output=1"),
        format!("/attach/default/{pod}/main?output=1"),
        format!("/run/default/{pod}/main?cmd=id"),
        format!("/containerLogs/default/{pod}/main"),
        format!("/portForward/default/{pod}?port=80"),
        "/no-such-path".into(),
        "/stats/../pods".into(),
        "//pods".into(),
        "/%2e%2e/pods".into(),
        "/stats/%2e%2e/pods".into(),
        "/logs/../../etc/passwd".into(),
    ];
    let mut tries: Vec<(&str, &String)> = ["GET", "POST", "PUT", "DELETE", "HEAD", "PROPFIND"]
        .into_iter()
        .flat_map(|m| paths.iter().map(move |p| (m, p)))
        .collect();
    // In an order of the seed's, so that no request relies on the one before.
    for i in (1..tries.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        tries.swap(i, j);
    }
    let rt = current_thread();
    for (method, path) in tries {
        a.check(
            match rt.block_on(request(&peers.nobody, addr, method, path)) {
                Ok((401, _)) => Ok(()),
                other => Err(format!("{method} {path}: {other:?}")),
            },
        );
    }
    a
}

/// A certificate of the cluster CA made for a server, and another CA's client certificate:
/// neither gets through the handshake.
fn refused_certificates(peers: &Peers, addr: SocketAddr) -> Attack {
    let mut a = Attack::new("certificates without clientAuth or of another CA");
    let rt = current_thread();
    for (who, tls) in [
        ("the server's certificate", &peers.server_as_client),
        ("another CA's certificate", &peers.mallory),
    ] {
        a.check(match rt.block_on(request(tls, addr, "GET", "/pods")) {
            Err(_) => Ok(()),
            Ok(answer) => Err(format!("{who} was served: {answer:?}")),
        });
    }
    a
}

/// `tailLines=10` and `limitBytes=100` on a 40 MB log: the agent's peak RSS grows by less than
/// [`LOG_REQUEST_KIB`].
fn log_requests(agent: &Agent, peers: &Peers, addr: SocketAddr, pod: &str) -> Attack {
    let mut a = Attack::new("tailLines and limitBytes on a 40 MB log (agent memory)");
    let rt = current_thread();
    let base = format!("/containerLogs/default/{pod}/main");
    agent.eventually("the log written", TIMEOUT, || {
        match rt.block_on(request(
            &peers.alice,
            addr,
            "GET",
            &format!("{base}?tailLines=1"),
        ))? {
            (200, body) if body == "written\n" => Ok(()),
            (code, body) => Err(format!("{code}: {:?}", &body[..body.len().min(80)])),
        }
    });
    let pid = agent.pid().expect("the agent runs");
    for query in ["tailLines=10", "limitBytes=100"] {
        reset_peak(pid);
        let before = peak_kib(pid);
        let answer = rt.block_on(request(
            &peers.alice,
            addr,
            "GET",
            &format!("{base}?{query}"),
        ));
        let grew = peak_kib(pid).saturating_sub(before);
        a.check(match answer {
            Ok((200, body)) if body.len() <= 10 * 1001 && grew < LOG_REQUEST_KIB => Ok(()),
            Ok((code, body)) => Err(format!(
                "{query}: {code}, {} bytes, peak RSS up {grew} KiB",
                body.len()
            )),
            Err(e) => Err(format!("{query}: {e}")),
        });
    }
    a
}

/// An exec stream that writes a line a second for 8 s, then sleeps with the stream open: it is
/// not closed while it writes, and is closed about [`STREAM_IDLE`] after its last byte.
fn idle_stream(peers: &Peers, addr: SocketAddr, pod: &str) -> Attack {
    let mut a = Attack::new("an exec stream left idle");
    let script = "for i in 1 2 3 4 5 6 7 8; do echo $i; sleep 1; done; sleep 3600";
    let path = format!(
        "/exec/default/{pod}/main?command=sh&command=-c&command={}&output=1",
        script
            .replace(' ', "%20")
            .replace(';', "%3B")
            .replace('$', "%24")
    );
    let rt = current_thread();
    a.check(rt.block_on(async {
        let mut ws = websocket(&peers.alice, addr, &path).await?;
        let mut out = String::new();
        let mut last = Instant::now();
        loop {
            let msg = tokio::time::timeout(TIMEOUT, ws.next())
                .await
                .map_err(|_| format!("still open {TIMEOUT:?} after its last byte ({out:?})"))?;
            match msg {
                Some(Ok(Message::Binary(b))) if b.first() == Some(&1) => {
                    out.push_str(&String::from_utf8_lossy(&b[1..]));
                    last = Instant::now();
                }
                Some(Ok(Message::Close(_)) | Err(_)) | None => break,
                Some(Ok(_)) => {}
            }
        }
        let quiet = last.elapsed();
        if out != "1\n2\n3\n4\n5\n6\n7\n8\n" {
            return Err(format!("closed while it passed bytes: {out:?}"));
        }
        if quiet < STREAM_IDLE - Duration::from_secs(1) {
            return Err(format!("closed {quiet:?} after its last byte"));
        }
        Ok(())
    }));
    a
}

/// The most connections the API serves held open (handshakes never started), then one more:
/// closed unserved and counted; once they go, a certified caller is served again.
fn connections_past_the_cap(agent: &Agent, peers: &Peers, addr: SocketAddr) -> Attack {
    use std::io::Read as _;
    let mut a = Attack::new("connections past the cap");
    let refused = "swiftlet_kubelet_api_connections_refused_total";
    let before = agent.metric(refused);
    // Each holds a slot until its handshake's 10 s run out: the probes below run well within.
    let held: Vec<std::net::TcpStream> = (0..swiftlet::server::kubelet_api::MAX_CONNECTIONS)
        .filter_map(|_| std::net::TcpStream::connect(addr).ok())
        .collect();
    let extra = || -> Result<(), String> {
        let mut extra = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
        extra
            .set_read_timeout(Some(Duration::from_secs(1)))
            .map_err(|e| e.to_string())?;
        match extra.read(&mut [0; 1]) {
            Ok(0) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Ok(()),
            other => Err(format!("served: {other:?}")),
        }
    };
    let closed = agent.try_eventually(Duration::from_secs(5), extra);
    a.check(closed.and_then(|()| {
        let counted = agent.metric(refused) - before;
        (counted >= 1.0)
            .then_some(())
            .ok_or_else(|| format!("{refused} up by {counted}"))
    }));
    drop(held);
    let rt = current_thread();
    a.check(agent.try_eventually(Duration::from_secs(15), || {
        match rt.block_on(request(&peers.alice, addr, "GET", "/healthz")) {
            Ok((200, _)) => Ok(()),
            other => Err(format!("not served: {other:?}")),
        }
    }));
    a
}

/// A static pod whose `metadata.uid` climbs out of the root directory: refused as a bad name
/// and counted, nothing made where it points.
fn uid_escape(agent: &Agent) -> Attack {
    let mut a = Attack::new("a static pod UID with '..'");
    let node = agent.node_name().to_owned();
    let bad_names = || -> u64 {
        metric_by_label(agent, "swiftlet_config_errors_total")
            .iter()
            .filter(|(labels, _)| labels.contains("reason=\"bad_name\""))
            .map(|(_, n)| n)
            .sum()
    };
    let before = bad_names();
    let escape = format!("escape-{node}");
    agent.write_manifest(
        "escape.yaml",
        &busybox_pod_manifest(
            &format!("name: escape, namespace: default, uid: ../../{escape}"),
            "",
            "sleep 3600",
            "",
        ),
    );
    let counted = agent.try_eventually(TIMEOUT, || {
        (bad_names() > before)
            .then_some(())
            .ok_or_else(|| "not counted as bad_name".to_owned())
    });
    let root = agent.root_dir();
    let made: Vec<PathBuf> = [root.join("pods"), root.to_owned(), root.join("..")]
        .iter()
        .map(|d| d.join(&escape))
        .filter(|p| p.exists())
        .collect();
    a.check(if let Err(why) = counted {
        Err(why)
    } else if !made.is_empty() {
        Err(format!("made {made:?}"))
    } else if agent.pods().get(&agent.static_pod_name("escape")).is_some() {
        Err("the pod was admitted".into())
    } else {
        Ok(())
    });
    agent.remove_manifest("escape.yaml");
    a
}

/// Another local user (nobody) lists a pod's directory and appends to every file in it (the
/// termination-message file is 0666): each refused.
fn local_user(agent: &Agent, uid: &str) -> Attack {
    let mut a = Attack::new("another local user in a pod's directory");
    let pod_dir = agent.root_dir().join("pods").join(uid);
    let as_nobody = |script: &str, arg: &Path| -> Result<(), String> {
        let out = std::process::Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "sh",
                "-c",
            ])
            .arg(script)
            .arg("sh")
            .arg(arg)
            .output()
            .map_err(|e| format!("setpriv: {e}"))?;
        if out.status.success() {
            Err(format!("{script} {} succeeded", arg.display()))
        } else {
            Ok(())
        }
    };
    a.check(as_nobody("ls \"$1\"", &pod_dir));
    let mut files = Vec::new();
    walk(&pod_dir, &mut files);
    if files.is_empty() {
        a.check(Err(format!("no file in {}", pod_dir.display())));
    }
    for f in files {
        a.check(as_nobody("echo written >> \"$1\"", &f));
    }
    a
}

/// Every regular file below `dir` (symlinks are not followed).
fn walk(dir: &Path, files: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        match e.file_type() {
            Ok(t) if t.is_dir() => walk(&e.path(), files),
            Ok(t) if t.is_file() => files.push(e.path()),
            _ => {}
        }
    }
}
