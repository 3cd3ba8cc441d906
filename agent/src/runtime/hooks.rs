//! Lifecycle hooks: postStart (run right after StartContainer, before the pod's sync goes on to
//! the next container) and preStop (run inside the grace period before StopContainer), with the
//! kubelet's semantics:
//! - exec runs through CRI `ExecSync`, for postStart without a timeout (the kubelet passes
//!   none), for preStop within what is left of the grace period; it fails on a non-zero exit,
//!   with the command's output in the message;
//! - httpGet goes to the hook's host, else the pod's IP (from the runtime's sandbox status), on a
//!   port given by number or by the name of one of the container's ports; any answer, whatever
//!   its status code, is a success (only a request that gets no answer fails);
//! - sleep pauses for its seconds;
//! - tcpSocket is accepted by the API for compatibility only and fails when run.
use super::*;
use crate::handler::{self, HttpGet};
use crate::pod::RestartPolicy;
use k8s_openapi::api::core::v1::ContainerPort;

/// Output of a failed exec hook kept in its message.
const OUTPUT_MAX: usize = 4096;

/// Which hook runs (the kubelet's names, used in messages and logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HookKind {
    PostStart,
    PreStop,
}

impl HookKind {
    fn field(self) -> &'static str {
        match self {
            HookKind::PostStart => "lifecycle.postStart",
            HookKind::PreStop => "lifecycle.preStop",
        }
    }
}

/// Why a lifecycle handler is refused, in the API server's validation words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidHandler {
    #[error(transparent)]
    Handler(#[from] handler::Invalid),
    #[error("httpGet: {0}")]
    HttpGet(handler::Invalid),
    #[error("tcpSocket: {0}")]
    TcpSocket(handler::Invalid),
    #[error(
        "sleep.seconds must be between 0 and terminationGracePeriodSeconds ({grace}) (got {seconds})"
    )]
    Sleep { seconds: i64, grace: i64 },
}

/// A lifecycle hook that failed, as the kubelet words it: `hook` is the handler's description
/// (`Exec lifecycle hook ([cmd])` ...), `error` what went wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{hook} for Container {container:?} in Pod {pod:?} failed - error: {error}")]
pub struct HookFailed {
    pub hook: String,
    pub container: String,
    pub pod: String,
    pub error: String,
}

/// A validated lifecycle handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Hook {
    Exec(Vec<String>),
    Http(HttpGet),
    Sleep(Duration),
    /// Deprecated in the API, never run: fails when its turn comes.
    TcpSocket,
}

impl Hook {
    /// Validates a lifecycle handler as the API server does: exactly one handler, a non-empty
    /// exec command, a valid httpGet port and scheme, and a sleep of 0 to
    /// `termination_grace_secs` seconds (the API's bound; zero is allowed, as with the
    /// `PodLifecycleSleepActionAllowZero` feature that current releases enable).
    pub(super) fn parse(
        h: &LifecycleHandler,
        termination_grace_secs: i64,
    ) -> Result<Hook, InvalidHandler> {
        let mut hooks = Vec::new();
        if let Some(e) = &h.exec {
            hooks.push(Hook::Exec(handler::exec_command(e)?));
        }
        if let Some(g) = &h.http_get {
            hooks.push(Hook::Http(
                HttpGet::parse(g).map_err(InvalidHandler::HttpGet)?,
            ));
        }
        if let Some(t) = &h.tcp_socket {
            handler::check_port(&t.port).map_err(InvalidHandler::TcpSocket)?;
            hooks.push(Hook::TcpSocket);
        }
        if let Some(s) = &h.sleep {
            if s.seconds < 0 || s.seconds > termination_grace_secs {
                return Err(InvalidHandler::Sleep {
                    seconds: s.seconds,
                    grace: termination_grace_secs,
                });
            }
            hooks.push(Hook::Sleep(Duration::from_secs(s.seconds.unsigned_abs())));
        }
        Ok(handler::exactly_one(hooks, "exec, httpGet or sleep")?)
    }

    /// The kubelet's name of the handler in messages.
    fn describe(&self) -> String {
        match self {
            Hook::Exec(cmd) => format!("Exec lifecycle hook ([{}])", cmd.join(" ")),
            Hook::Http(h) => format!("HTTP lifecycle hook ({})", h.path),
            Hook::Sleep(d) => format!("Sleep lifecycle hook ({})", d.as_secs()),
            Hook::TcpSocket => "TCPSocket lifecycle hook".to_owned(),
        }
    }
}

/// The pod's `terminationGracePeriodSeconds` as the API defaults it (what sleep is bounded by).
fn termination_grace_secs(pod: &Pod) -> i64 {
    pod.spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(crate::pod::DEFAULT_GRACE_SECS)
}

/// Checks every container's hooks before anything of the pod is created: a bad one is an error
/// naming the container, the hook and what is wrong.
pub(super) fn check_pod(pod: &Pod) -> Result<()> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(());
    };
    let grace = termination_grace_secs(pod);
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers);
    for c in containers {
        let Some(l) = &c.lifecycle else { continue };
        for (kind, h) in [
            (HookKind::PostStart, &l.post_start),
            (HookKind::PreStop, &l.pre_stop),
        ] {
            if let Some(h) = h {
                Hook::parse(h, grace).map_err(|reason| Error::InvalidHook {
                    pod: full_name(pod),
                    container: c.name.clone(),
                    hook: kind.field(),
                    reason,
                })?;
            }
        }
    }
    Ok(())
}

/// Whether a container killed for its failed postStart hook, ending with `exit_code`, is started
/// again (the kubelet's rule for a container that is not running): a sidecar always, an init
/// container that failed unless the pod's policy is Never, an app container by the policy.
fn restarts_after_kill(policy: RestartPolicy, kind: ContainerKind, exit_code: i32) -> bool {
    match kind {
        ContainerKind::Sidecar => true,
        ContainerKind::Init => exit_code != 0 && policy != RestartPolicy::Never,
        ContainerKind::App => policy.restarts_after(exit_code),
    }
}

/// The container's ports as kept in its annotation (so a preStop hook without the spec still
/// resolves a named port): `None` when it has none.
pub(super) fn ports_annotation(c: &Container) -> Option<String> {
    c.ports
        .as_ref()
        .filter(|p| !p.is_empty())
        .and_then(|p| serde_json::to_string(p).ok())
}

/// The ports a container was created with (from its annotation).
pub(super) fn ports_of(st: &api::ContainerStatus) -> Vec<ContainerPort> {
    st.annotations
        .get(labels::CONTAINER_PORTS)
        .and_then(|j| serde_json::from_str(j).ok())
        .unwrap_or_default()
}

/// The pod's IP in a sandbox status, when the runtime reports one (a host-network sandbox has
/// none: a hook there needs its own host, as in the kubelet).
pub(super) fn sandbox_ip(status: Option<&api::PodSandboxStatus>) -> Option<String> {
    status
        .filter(|s| s.state == api::PodSandboxState::SandboxReady as i32)
        .and_then(|s| s.network.as_ref())
        .map(|n| n.ip.clone())
        .filter(|ip| !ip.is_empty())
}

/// Every IP of a ready sandbox, the primary first.
pub(super) fn sandbox_ips(status: Option<&api::PodSandboxStatus>) -> Vec<String> {
    let Some(primary) = sandbox_ip(status) else {
        return Vec::new();
    };
    let additional = status
        .and_then(|s| s.network.as_ref())
        .map(|n| n.additional_ips.iter().map(|a| a.ip.clone()))
        .into_iter()
        .flatten()
        .filter(|ip| !ip.is_empty());
    std::iter::once(primary).chain(additional).collect()
}

/// What one hook runs against.
pub(super) struct HookRun<'a> {
    /// The pod as the kubelet names it in messages: `name_namespace(uid)`.
    pub pod: String,
    pub container: &'a str,
    pub target: handler::Target,
    /// The timeout an exec hook is given in ExecSync, in seconds (0: none). A preStop hook gets
    /// its grace period's seconds, so the runtime ends a command the agent stopped waiting for.
    pub exec_timeout_secs: i64,
}

fn truncated(s: &str) -> &str {
    match s.char_indices().nth(OUTPUT_MAX) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

impl Manager {
    /// Runs `hook` to its end (callers bound it: the grace period for preStop, the pod's
    /// termination for postStart). `Err` is the kubelet's message for a failed hook.
    pub(super) async fn run_hook(
        &self,
        hook: &Hook,
        run: &HookRun<'_>,
    ) -> std::result::Result<(), HookFailed> {
        let error = match hook {
            Hook::Exec(cmd) => {
                match self
                    .cri
                    .exec_sync(&run.target.container_id, cmd.clone(), run.exec_timeout_secs)
                    .await
                {
                    Ok(r) if r.exit_code == 0 => return Ok(()),
                    Ok(r) => {
                        let stderr = String::from_utf8_lossy(&r.stderr);
                        let mut output = r.stdout.clone();
                        output.extend_from_slice(&r.stderr);
                        let output = String::from_utf8_lossy(&output);
                        format!(
                            "command '{}' exited with {}: {}, message: {:?}",
                            cmd.join(" "),
                            r.exit_code,
                            truncated(&stderr),
                            truncated(&output)
                        )
                    }
                    Err(e) => format!("{e}, message: \"\""),
                }
            }
            Hook::Http(h) => match handler::http_status(h, &run.target, Duration::MAX).await {
                Ok(_) => return Ok(()),
                Err((_, e)) => e,
            },
            Hook::Sleep(d) => {
                tokio::time::sleep(*d).await;
                return Ok(());
            }
            Hook::TcpSocket => {
                "invalid handler: tcpSocket is not supported as a lifecycle hook (the API keeps \
                 the field for compatibility only)"
                    .to_owned()
            }
        };
        Err(HookFailed {
            hook: hook.describe(),
            container: run.container.to_owned(),
            pod: run.pod.clone(),
            error,
        })
    }

    /// Runs a container's postStart hook right after it started. The hook runs until it ends
    /// or the pod starts terminating (`cancel`). On failure the container is killed (its preStop
    /// hook inside the pod's grace period, as any kill) and the error carries the hook's message:
    /// the status shows it as the waiting reason `PostStartHookError`, and the restart policy and
    /// back-off decide what comes next.
    pub(super) async fn post_start(
        &self,
        t: &StartTarget<'_>,
        c: &Container,
        kind: ContainerKind,
        started: &api::ContainerStatus,
    ) -> Result<()> {
        let Some(h) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) else {
            return Ok(());
        };
        // Checked before the sandbox (`check_pod`); parsed again here, cheaply.
        let hook =
            Hook::parse(h, termination_grace_secs(t.pod)).map_err(|reason| Error::InvalidHook {
                pod: t.name.to_owned(),
                container: c.name.clone(),
                hook: HookKind::PostStart.field(),
                reason,
            })?;
        let pod_ip = match &hook {
            Hook::Http(g) if g.host.is_none() => self.sandbox_ip_now(t.sandbox_id).await,
            _ => None,
        };
        let run = HookRun {
            pod: format!("{}({})", t.name, t.uid),
            container: &c.name,
            target: handler::Target {
                container_id: started.id.clone(),
                pod_ip: pod_ip.clone(),
                ports: c.ports.clone().unwrap_or_default(),
            },
            exec_timeout_secs: 0,
        };
        let begun = Instant::now();
        let result = tokio::select! {
            r = self.run_hook(&hook, &run) => r,
            () = t.cancel.cancelled() => {
                tracing::info!(pod = %t.name, container = %c.name, "pod terminating: postStart hook abandoned");
                return Err(Error::PostStartHook {
                    pod: t.name.to_owned(),
                    container: c.name.clone(),
                    message: "the pod started terminating before its postStart hook finished".into(),
                    restarts: false,
                });
            }
        };
        let Err(failed) = result else {
            tracing::debug!(pod = %t.name, container = %c.name, elapsed = ?begun.elapsed(), "postStart hook done");
            return Ok(());
        };
        tracing::warn!(pod = %t.name, container = %c.name, reason = "FailedPostStartHook", message = %failed, "PostStartHook failed; killing the container");
        let _stopping = self.mutating(t.uid, false, Some(&started.id));
        if let Err(e) = self
            .kill_container(
                t.name,
                started,
                grace_period_secs(t.pod),
                Instant::now(),
                pod_ip.as_deref(),
            )
            .await
        {
            tracing::warn!(pod = %t.name, container = %c.name, error = %e, "killing the container whose postStart hook failed");
        }
        // How it ended decides whether it runs again (unknown: as a kill ends, non-zero).
        let exit_code = match self.cri.container_status(&started.id).await {
            Ok(Some(s)) if s.state == api::ContainerState::ContainerExited as i32 => s.exit_code,
            _ => 1,
        };
        Err(Error::PostStartHook {
            pod: t.name.to_owned(),
            container: c.name.clone(),
            message: failed.to_string(),
            restarts: restarts_after_kill(RestartPolicy::of(t.pod), kind, exit_code),
        })
    }

    /// The pod IP of sandbox `id` as the runtime reports it now.
    pub(super) async fn sandbox_ip_now(&self, id: &str) -> Option<String> {
        match self.cri.pod_sandbox_status(id).await {
            Ok(s) => sandbox_ip(s.as_ref()),
            Err(e) => {
                tracing::warn!(sandbox = id, error = %e, "reading the sandbox's IP for a hook");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use serde_json::json;

    fn hook(v: serde_json::Value) -> Result<Hook, InvalidHandler> {
        Hook::parse(&serde_json::from_value(v).expect("handler"), 30)
    }

    #[test]
    fn each_handler_is_chosen_and_validated() {
        assert_eq!(
            hook(json!({"exec": {"command": ["touch", "/tmp/x"]}})),
            Ok(Hook::Exec(vec!["touch".into(), "/tmp/x".into()]))
        );
        let Ok(Hook::Http(h)) = hook(json!({"httpGet": {"port": "web", "path": "hook"}})) else {
            panic!("httpGet");
        };
        assert_eq!((h.path.as_str(), h.scheme.as_str()), ("/hook", "HTTP"));
        assert_eq!(
            hook(json!({"sleep": {"seconds": 5}})),
            Ok(Hook::Sleep(Duration::from_secs(5)))
        );
        assert_eq!(
            hook(json!({"sleep": {"seconds": 0}})),
            Ok(Hook::Sleep(Duration::ZERO)),
            "zero is allowed, as the API allows it"
        );
        assert_eq!(
            hook(json!({"tcpSocket": {"port": 80}})),
            Ok(Hook::TcpSocket),
            "accepted as the API accepts it; fails when run"
        );
        let bad = |v| hook(v).unwrap_err().to_string();
        assert!(bad(json!({"sleep": {"seconds": -1}})).contains("between 0 and"));
        assert!(bad(json!({"sleep": {"seconds": 31}})).contains("(30) (got 31)"));
        assert_eq!(bad(json!({"exec": {}})), "exec.command is empty");
        assert!(bad(json!({"httpGet": {"port": 0}})).starts_with("httpGet: port 0"));
        assert!(bad(json!({"httpGet": {"port": 1, "scheme": "FTP"}})).contains("scheme"));
        assert_eq!(
            bad(json!({"exec": {"command": ["true"]}, "sleep": {"seconds": 1}})),
            "more than one handler"
        );
        assert!(bad(json!({})).starts_with("no handler"));
    }

    #[test]
    fn a_bad_hook_is_an_error_naming_container_and_hook() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {
                "terminationGracePeriodSeconds": 10,
                "initContainers": [{"name": "i", "image": "x",
                    "lifecycle": {"postStart": {"sleep": {"seconds": 1}}}}],
                "containers": [{"name": "c", "image": "x",
                    "lifecycle": {"preStop": {"sleep": {"seconds": 11}}}}]
            }
        }))
        .expect("pod");
        let e = check_pod(&pod).unwrap_err();
        assert_eq!(e.reason(), "CreateContainerConfigError");
        assert_eq!(
            e.to_string(),
            "pod p_ns container c: lifecycle.preStop: sleep.seconds must be between 0 and \
             terminationGracePeriodSeconds (10) (got 11)"
        );
    }

    #[test]
    fn ports_survive_in_the_annotation() {
        let c: Container = serde_json::from_value(json!({
            "name": "c", "ports": [{"name": "web", "containerPort": 8080}]
        }))
        .expect("container");
        let mut st = api::ContainerStatus::default();
        assert!(ports_of(&st).is_empty());
        st.annotations.insert(
            labels::CONTAINER_PORTS.to_owned(),
            ports_annotation(&c).expect("ports"),
        );
        let ports = ports_of(&st);
        assert_eq!(
            handler::resolve_port(&IntOrString::String("web".into()), &ports),
            Ok(8080)
        );
        let none: Container = serde_json::from_value(json!({"name": "c"})).expect("container");
        assert_eq!(ports_annotation(&none), None);
    }

    #[test]
    fn the_sandbox_ip_is_the_ready_sandboxs() {
        let mut s = api::PodSandboxStatus {
            state: api::PodSandboxState::SandboxReady as i32,
            network: Some(api::PodSandboxNetworkStatus {
                ip: "10.1.0.4".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(sandbox_ip(Some(&s)).as_deref(), Some("10.1.0.4"));
        s.network = Some(Default::default());
        assert_eq!(sandbox_ip(Some(&s)), None, "host network: no IP");
        assert_eq!(sandbox_ip(None), None);
    }

    fn run(port: u16) -> HookRun<'static> {
        HookRun {
            pod: "p_ns(u1)".into(),
            container: "c",
            target: handler::Target {
                container_id: "id".into(),
                pod_ip: Some("127.0.0.1".into()),
                ports: vec![ContainerPort {
                    name: Some("web".into()),
                    container_port: i32::from(port),
                    ..Default::default()
                }],
            },
            exec_timeout_secs: 0,
        }
    }

    #[tokio::test]
    async fn an_http_hook_succeeds_on_any_answer_and_fails_without_one() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mount = tempfile::tempdir().expect("tempdir");
        let m = super::super::tests::manager(mount.path());
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = l.local_addr().expect("addr").port();
        let server = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.expect("accept");
            let mut buf = vec![0; 4096];
            let n = s.read(&mut buf).await.expect("read");
            s.write_all(b"HTTP/1.1 500 Oops\r\ncontent-length: 0\r\n\r\n")
                .await
                .expect("write");
            String::from_utf8_lossy(&buf[..n]).into_owned()
        });
        // A named port resolved from the container's ports.
        let h = hook(json!({"httpGet": {"port": "web", "path": "/stop"}})).expect("hook");
        assert_eq!(m.run_hook(&h, &run(port)).await, Ok(()), "500 is an answer");
        let req = server.await.expect("server");
        assert!(req.starts_with("GET /stop HTTP/1.1"), "{req}");
        // Nothing listens any more.
        let e = m.run_hook(&h, &run(port)).await.unwrap_err().to_string();
        assert!(
            e.starts_with(
                "HTTP lifecycle hook (/stop) for Container \"c\" in Pod \"p_ns(u1)\" failed - error: \
                 Get \"http://127.0.0.1:"
            ),
            "{e}"
        );
        let mut no_ip = run(port);
        no_ip.target.pod_ip = None;
        let e = m.run_hook(&h, &no_ip).await.unwrap_err().to_string();
        assert!(e.ends_with("error: the pod has no IP yet"), "{e}");
    }

    #[tokio::test]
    async fn tcp_socket_hooks_fail_and_sleep_hooks_sleep() {
        let mount = tempfile::tempdir().expect("tempdir");
        let m = super::super::tests::manager(mount.path());
        let e = m
            .run_hook(&Hook::TcpSocket, &run(80))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("TCPSocket lifecycle hook for Container \"c\" in Pod \"p_ns(u1)\" failed - error: invalid handler"),
            "{e}"
        );
        let begun = Instant::now();
        let sleep = Hook::Sleep(Duration::from_millis(300));
        assert_eq!(m.run_hook(&sleep, &run(80)).await, Ok(()));
        assert!(begun.elapsed() >= Duration::from_millis(300));
    }

    #[test]
    fn a_killed_container_restarts_by_kind_policy_and_exit_code() {
        use ContainerKind::{App, Init, Sidecar};
        use RestartPolicy::{Always, Never, OnFailure};
        for (policy, kind, code, want) in [
            (Always, App, 0, true),
            (OnFailure, App, 143, true),
            (OnFailure, App, 0, false),
            (Never, App, 143, false),
            (Never, Sidecar, 0, true),
            (Always, Init, 143, true),
            (Always, Init, 0, false),
            (Never, Init, 137, false),
        ] {
            assert_eq!(
                restarts_after_kill(policy, kind, code),
                want,
                "{policy:?} {kind:?} {code}"
            );
        }
    }
}
