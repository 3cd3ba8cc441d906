//! Image pull credentials end to end: a private registry (TLS with a test CA, htpasswd auth;
//! `swiftlet_tests::registry`) holds the busybox image; pods from the in-process API server pull
//! it with their `imagePullSecrets`, or are refused (`ErrImagePull` with the registry's
//! `unauthorized`, then `ImagePullBackOff`); a static pod pulls it with the node's `config.json`
//! in `--root-dir`, and a pod whose secret the registry refuses falls through to the node's. Each
//! test pushes its own repository and removes it from containerd first, so
//! every start really pulls. Credentials must appear in no log, status or metric.

use std::time::Duration;

use base64::Engine;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod, Secret};
use swiftlet_tests::api_server::ApiServer;
use swiftlet_tests::registry::Registry;
use swiftlet_tests::{Agent, AgentOptions, PodList, Runtime, image_present};

const TIMEOUT: Duration = Duration::from_secs(90);

/// An agent taking pods from its own in-process API server, and the registry.
struct Setup {
    agent: Agent,
    server: ApiServer,
    registry: &'static Registry,
    /// Serves the API server.
    _tokio: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
}

fn setup(name: &str) -> Option<Setup> {
    let runtime = Runtime::shared()?;
    let registry = Registry::shared(runtime)?;
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let server = tokio.block_on(ApiServer::start());
    let mut opts = AgentOptions::new(name);
    let dir = server.point_agent(&mut opts);
    let agent = Agent::start(runtime, opts);
    Some(Setup {
        agent,
        server,
        registry,
        _tokio: tokio,
        _dir: dir,
    })
}

impl Setup {
    /// A `kubernetes.io/dockerconfigjson` secret `name` for the registry's user with `password`
    /// (the `auth` form).
    fn put_login_secret(&self, name: &str, password: &str) {
        let login = b64(&format!("{}:{password}", self.registry.username));
        let body = serde_json::json!({"auths": {self.registry.host.clone(): {"auth": login}}});
        self.server.put_secret(secret(
            name,
            "kubernetes.io/dockerconfigjson",
            ".dockerconfigjson",
            &body,
        ));
    }

    /// Pod `pod` running `repository` (pushed, absent from containerd) with one pull secret,
    /// `<pod>-login`, for the registry's user with `password`; returns the image.
    fn pod_with_login_secret(&self, pod: &str, repository: &str, password: &str) -> String {
        let image = self.registry.fresh_image(self.agent.endpoint(), repository);
        let secret = format!("{pod}-login");
        self.put_login_secret(&secret, password);
        self.server
            .put(api_pod(&self.agent, pod, &image, &[&secret]));
        image
    }
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// A pod bound to the agent's node, one looping container `main` running `image`.
fn api_pod(agent: &Agent, name: &str, image: &str, secrets: &[&str]) -> Pod {
    let refs: Vec<_> = secrets
        .iter()
        .map(|s| serde_json::json!({"name": s}))
        .collect();
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("{name}-{}", agent.node_name())},
        "spec": {
            "nodeName": agent.node_name(),
            "imagePullSecrets": refs,
            "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": "main", "image": image,
                "command": ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"],
            }],
        },
    }))
    .expect("pod")
}

fn secret(name: &str, type_: &str, key: &str, body: &serde_json::Value) -> Secret {
    // As the API serves it: `data` values in base64.
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "default"},
        "type": type_,
        "data": {key: b64(&body.to_string())},
    }))
    .expect("secret")
}

fn main_status<'a>(l: &'a PodList, pod: &str) -> Option<&'a ContainerStatus> {
    l.container(pod, "main")
}

fn waiting(c: &ContainerStatus) -> Option<(&str, &str)> {
    let w = c.state.as_ref()?.waiting.as_ref()?;
    Some((w.reason.as_deref()?, w.message.as_deref().unwrap_or("")))
}

/// Asserts `secret_text` is nowhere the agent shows or writes: its log, `/pods`, `/metrics`.
fn assert_never_shown(agent: &Agent, secret_text: &str) {
    assert!(
        !agent.log().contains(secret_text),
        "a credential is in the agent log {}",
        agent.log_path().display()
    );
    for path in ["/pods", "/metrics", "/debug/manifests", "/debug/trace/pods"] {
        let (_, body) = agent.get(path);
        assert!(!body.contains(secret_text), "a credential is in {path}");
    }
}

/// Waits for `ErrImagePull` carrying the registry's refusal, then for `ImagePullBackOff`; nothing
/// runs meanwhile.
fn assert_refused_unauthorized(agent: &Agent, pod: &str, image: &str) {
    let list = agent.wait_for(
        |l| {
            main_status(l, pod).and_then(waiting).is_some_and(|(r, m)| {
                r == "ErrImagePull" && m.to_lowercase().contains("unauthorized")
            })
        },
        TIMEOUT,
    );
    let (_, message) = main_status(&list, pod).and_then(waiting).expect("waiting");
    assert!(message.contains(image), "{message}");
    agent.wait_for(
        |l| {
            main_status(l, pod)
                .and_then(waiting)
                .is_some_and(|(r, _)| r == "ImagePullBackOff")
        },
        TIMEOUT,
    );
    assert_eq!(agent.pods().phase(pod), Some("Pending"));
    assert!(!image_present(agent.endpoint(), image).expect("ImageStatus"));
}

#[test]
fn a_private_image_is_pulled_with_the_pods_pull_secrets_of_either_format() {
    let Some(s) = setup("pull-secret") else {
        return;
    };
    let reg = s.registry;
    let json_image = reg.fresh_image(s.agent.endpoint(), "private/secret-json");
    let cfg_image = reg.fresh_image(s.agent.endpoint(), "private/secret-cfg");
    s.put_login_secret("regcred", &reg.password);
    // The older format, with the scheme and username/password fields.
    let cfg = serde_json::json!({format!("https://{}", reg.host):
        {"username": reg.username, "password": reg.password}});
    s.server.put_secret(secret(
        "oldcred",
        "kubernetes.io/dockercfg",
        ".dockercfg",
        &cfg,
    ));
    // A secret that does not exist is skipped; the next one is used.
    s.server.put(api_pod(
        &s.agent,
        "json",
        &json_image,
        &["missing", "regcred"],
    ));
    s.server
        .put(api_pod(&s.agent, "cfg", &cfg_image, &["oldcred"]));
    s.agent
        .wait_for(|l| l.is_running("json") && l.is_running("cfg"), TIMEOUT);
    for image in [&json_image, &cfg_image] {
        assert!(image_present(s.agent.endpoint(), image).expect("ImageStatus"));
    }
    let log = s.agent.log();
    assert!(
        log.contains("unable to retrieve pull secret") && log.contains("missing"),
        "the missing secret is logged"
    );
    assert_never_shown(&s.agent, &reg.password);
    assert_never_shown(
        &s.agent,
        &b64(&format!("{}:{}", reg.username, reg.password)),
    );
}

#[test]
fn without_a_pull_secret_the_registry_refuses_the_pull() {
    let Some(s) = setup("no-pull-secret") else {
        return;
    };
    let image = s
        .registry
        .fresh_image(s.agent.endpoint(), "private/no-secret");
    s.server.put(api_pod(&s.agent, "anon", &image, &[]));
    assert_refused_unauthorized(&s.agent, "anon", &image);
}

#[test]
fn a_pull_secret_with_a_wrong_password_is_refused() {
    let Some(s) = setup("wrong-password") else {
        return;
    };
    let wrong = "not-the-password-4711";
    let image = s.pod_with_login_secret("wrong", "private/wrong-password", wrong);
    assert_refused_unauthorized(&s.agent, "wrong", &image);
    assert_never_shown(&s.agent, wrong);
}

#[test]
fn a_config_json_in_the_root_dir_lets_a_pod_without_secrets_pull() {
    let Some(runtime) = Runtime::shared() else {
        return;
    };
    let Some(reg) = Registry::shared(runtime) else {
        return;
    };
    let agent = Agent::start(runtime, AgentOptions::new("node-config-json"));
    let image = reg.fresh_image(agent.endpoint(), "private/node-config");
    let auth = reg.write_node_config(agent.root_dir());
    let manifest = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: nodecfg, namespace: default}}\nspec:\n  \
         terminationGracePeriodSeconds: 2\n  containers:\n  - name: main\n    image: {image}\n    \
         command: [\"sh\", \"-c\", \"trap 'exit 0' TERM; while true; do sleep 1; done\"]\n"
    );
    agent.write_manifest("nodecfg.yaml", &manifest);
    let pod = agent.static_pod_name("nodecfg");
    agent.wait_for(|l| l.is_running(&pod), TIMEOUT);
    assert!(image_present(agent.endpoint(), &image).expect("ImageStatus"));
    assert_never_shown(&agent, &reg.password);
    assert_never_shown(&agent, &auth);
}

#[test]
fn a_pull_secret_the_registry_refuses_is_followed_by_the_nodes_credentials() {
    let Some(s) = setup("secret-then-node") else {
        return;
    };
    let auth = s.registry.write_node_config(s.agent.root_dir());
    let stale = "a-stale-password-1234";
    let image = s.pod_with_login_secret("fallthrough", "private/secret-then-node", stale);
    s.agent.wait_for(|l| l.is_running("fallthrough"), TIMEOUT);
    assert!(image_present(s.agent.endpoint(), &image).expect("ImageStatus"));
    for text in [stale, &auth, &s.registry.password] {
        assert_never_shown(&s.agent, text);
    }
}
