//! The agent against an HTTPS API server (the in-process one, serving TLS with `openssl`-made
//! certificates and authenticating as kube-apiserver does): a kubeconfig with the cluster CA and
//! a client certificate, or a bearer token, joins the cluster and runs its pods; refused
//! credentials (401, 403) and TLS failures (an untrusted server certificate, a client
//! certificate from another CA) are logged as errors an operator must fix and counted, while
//! static pods keep running.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use swiftlet_tests::api_server::{CERT_USER, Cluster, Credential, TOKEN_USER};
use swiftlet_tests::{AgentOptions, Runtime, busybox_api_pod};

const TIMEOUT: Duration = Duration::from_secs(90);

fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// An agent named `name` joined to a new HTTPS server with `credential`; `None` without a
/// runtime (the test then skips, or fails with `SWIFTLET_REQUIRE_RUNTIME=1`).
fn start(name: &str, credential: Credential) -> Option<Cluster> {
    let rt = Runtime::shared()?;
    Some(Cluster::start_with(
        rt,
        AgentOptions::new(name),
        Some(credential),
        |_| {},
    ))
}

/// Waits for the node to be registered and Ready on the server.
fn ready(c: &Cluster) {
    let name = c.agent.node_name();
    c.agent
        .eventually("the node registered and Ready", TIMEOUT, || {
            c.server
                .node(name)
                .filter(is_ready)
                .ok_or_else(|| format!("requests by user: {:?}", c.server.users()))
        });
}

/// [`ready`], and the node's lease.
fn joined(c: &Cluster) {
    ready(c);
    let name = c.agent.node_name();
    c.agent.eventually("the lease", TIMEOUT, || {
        c.server
            .lease("kube-node-lease", name)
            .ok_or_else(|| "no lease".to_owned())
    });
}

/// Waits until the agent's `/metrics` has `series` with a value of at least 1.
fn counted(c: &Cluster, series: &str) {
    c.agent.eventually(series, TIMEOUT, || {
        let metrics = c.agent.get("/metrics").1;
        let value = metrics
            .lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok());
        match value {
            Some(v) if v >= 1.0 => Ok(()),
            _ => Err(format!("not counted yet:\n{metrics}")),
        }
    });
}

/// Asserts that every request the server saw authenticated as `user` (`""`: was refused with
/// 401); how many there were.
fn only_user(c: &Cluster, user: &str) -> usize {
    let users = c.server.users();
    assert_eq!(users.keys().collect::<Vec<_>>(), vec![user], "{users:?}");
    users[user]
}

/// Waits until registration and the pod watch both counted a failure as `result`, and checks
/// that the log says `words`.
fn refused(c: &Cluster, result: &str, words: &str) {
    counted(
        c,
        &format!("swiftlet_node_api_requests_total{{operation=\"register\",result=\"{result}\"}}"),
    );
    counted(
        c,
        &format!("swiftlet_config_errors_total{{source=\"api\",reason=\"{result}\"}}"),
    );
    let log = c.agent.log();
    assert!(log.contains(words), "{}: {log}", c.agent.node_name());
}

#[test]
fn a_client_certificate_joins_over_https_and_runs_api_pods() {
    let Some(c) = start("tls-cert", Credential::ClientCertificate) else {
        return;
    };
    let node = c.agent.node_name().to_owned();
    c.server
        .put(busybox_api_pod(&node, "web", "", "", "sleep 3600", ""));
    joined(&c);
    c.agent
        .eventually("the API pod Running on the server", TIMEOUT, || {
            let pod = c.server.pod_named("default", "web").ok_or("no pod")?;
            match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
                Some("Running") => Ok(()),
                other => Err(format!("phase {other:?}")),
            }
        });
    only_user(&c, CERT_USER);
}

#[test]
fn a_bearer_token_joins_over_https() {
    let Some(c) = start("tls-token", Credential::Token) else {
        return;
    };
    joined(&c);
    only_user(&c, TOKEN_USER);
}

#[test]
fn a_refused_token_is_an_error_counted_while_static_pods_keep_running() {
    let Some(c) = start("tls-wrong-token", Credential::WrongToken) else {
        return;
    };
    let manifest = c.agent.busybox_pod("web", "", "sleep 3600", "");
    c.agent.write_manifest("web.yaml", &manifest);
    let pod = c.agent.static_pod_name("web");
    c.agent.wait_for(|l| l.is_running(&pod), TIMEOUT);
    refused(
        &c,
        "unauthorized",
        "the API server refused the kubeconfig's credentials",
    );
    assert!(c.server.node(c.agent.node_name()).is_none());
    let refused = only_user(&c, "");
    // Refused requests are retried with backoff, not in a tight loop.
    assert!(refused < 60, "{refused} refused requests");
}

#[test]
fn a_forbidden_lease_is_counted_while_the_node_registers() {
    let Some(rt) = Runtime::shared() else {
        return;
    };
    let c = Cluster::start_with(
        rt,
        AgentOptions::new("tls-forbidden"),
        Some(Credential::ClientCertificate),
        |server| server.forbid("/leases"),
    );
    ready(&c);
    let name = c.agent.node_name().to_owned();
    counted(
        &c,
        "swiftlet_node_api_requests_total{operation=\"lease\",result=\"forbidden\"}",
    );
    assert!(c.server.lease("kube-node-lease", &name).is_none());
    let log = c.agent.log();
    assert!(
        log.contains("forbidden: User"),
        "the server's reason is logged: {log}"
    );
}

#[test]
fn tls_failures_are_errors_counted_as_tls() {
    for (name, credential) in [
        ("tls-wrong-ca", Credential::WrongCa),
        ("tls-stranger", Credential::StrangerCertificate),
    ] {
        let Some(c) = start(name, credential) else {
            return;
        };
        refused(&c, "tls", "TLS with the API server failed");
        assert!(
            c.server.users().is_empty(),
            "{name}: no request got past the handshake: {:?}",
            c.server.users()
        );
        assert!(c.server.node(c.agent.node_name()).is_none());
    }
}
