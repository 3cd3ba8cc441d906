//! The kubelet API (`--port`, 10250): HTTPS; callers authenticate with a client certificate
//! signed by `--client-ca-file`, else with a bearer token the API server vouches for
//! (`--authentication-token-webhook`), else are anonymous with `--anonymous-auth`; an invalid
//! token is refused even then. Every authenticated caller is allowed
//! (`--authorization-mode=AlwaysAllow`), or the API server decides each request
//! (`--authorization-mode=Webhook`; see `webhook`). Serves `/containerLogs`, `/exec`,
//! `/attach`, `/portForward` (proxied to the runtime's streaming server), `/run`, and the
//! read-only port's `/pods`, `/metrics` and `/healthz`.
use super::AppState;
use super::container_logs::{self, Options as LogOptions};
use super::streaming::{proxy, text};
use super::tls::{self, User};
use crate::cri::Cri;
use crate::pod::labels;
use axum::body::Body;
use axum::extract::{FromRef, Path, State};
use axum::http::{Request, Response, StatusCode, header};
use axum::middleware::Next;
use axum::routing::{any, get, post};
use hyper_util::rt::TokioIo;
use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{ContainerStatus, PodStatus};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubelet API TLS: {0}")]
    Tls(#[from] tls::Error),
    #[error("binding the kubelet API on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// How the server is set up.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `--address` and `--port`.
    pub addr: SocketAddr,
    pub tls: tls::Files,
    /// `--anonymous-auth`: requests without a client certificate are served as
    /// `system:anonymous` instead of refused.
    pub anonymous: bool,
    /// The names (host names, IP addresses) a self-signed serving certificate is made for.
    pub names: Vec<String>,
    /// Token and access reviews through the API server, when asked for.
    pub webhook: Option<super::webhook::Webhook>,
    /// How long an exec, attach or port-forward stream may be idle (`None`: no limit).
    pub stream_idle_timeout: Option<std::time::Duration>,
}

#[derive(Clone)]
struct ApiState {
    app: AppState,
    cri: Cri,
    anonymous: bool,
    webhook: Option<super::webhook::Webhook>,
    stream_idle_timeout: Option<std::time::Duration>,
}

impl FromRef<ApiState> for AppState {
    fn from_ref(s: &ApiState) -> Self {
        s.app.clone()
    }
}

/// A request answered with an error: its status and a one-line reason.
#[derive(Debug)]
struct Refusal(StatusCode, String);

impl Refusal {
    fn new(status: StatusCode, why: impl Into<String>) -> Self {
        Self(status, why.into())
    }
}

impl axum::response::IntoResponse for Refusal {
    fn into_response(self) -> axum::response::Response {
        text(self.0, format!("{}\n", self.1.trim_end()))
    }
}

type Answer = Result<Response<Body>, Refusal>;

/// The verified client certificate's user, put on each request of its connection.
#[derive(Clone)]
struct Peer(Option<User>);

/// How long a client has to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a connection may go without sending a whole request head: the first one after the
/// handshake, and each next one on a kept-alive connection (an idle client's connection and its
/// task end then).
pub const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The most kubelet API connections served at once (each holds TLS and HTTP buffers, some tens
/// of KiB); a connection past it is closed at once and counted
/// (`swiftlet_kubelet_api_connections_refused_total`).
pub const MAX_CONNECTIONS: usize = 512;

/// How long a `/run` command may run: the runtime stops it then (the kubelet sets none).
pub const RUN_TIMEOUT_SECS: i64 = 120;

/// Binds the port and serves until `cancel` (open streams are dropped then).
pub async fn start(
    settings: Settings,
    app: AppState,
    cri: Cri,
    tracker: &tokio_util::task::TaskTracker,
    cancel: CancellationToken,
) -> Result<(), Error> {
    let config = tls::server_config(&settings.tls, &settings.names)?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let addr = settings.addr;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })?;
    let state_metrics = app.metrics.clone();
    let state = ApiState {
        app,
        cri,
        anonymous: settings.anonymous,
        webhook: settings.webhook,
        stream_idle_timeout: settings.stream_idle_timeout,
    };
    let router = routes(state);
    if settings.anonymous {
        tracing::warn!(%addr, "--anonymous-auth: the kubelet API serves callers without a client certificate (exec and logs included)");
    }
    if settings.tls.client_ca.is_none() && !settings.anonymous {
        tracing::warn!(%addr, "no --client-ca-file and no --anonymous-auth: every kubelet API request is refused");
    }
    tracing::info!(%addr, "kubelet API listening (TLS)");
    let connections = tracker.clone();
    let refused = state_metrics.kubelet_api_connections_refused_total.clone();
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    tracker.spawn(async move {
        let mut last_warning: Option<std::time::Instant> = None;
        loop {
            let (tcp, remote) = tokio::select! {
                () = cancel.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(%e, "kubelet API accept");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                drop(tcp);
                refused.inc();
                if last_warning.is_none_or(|at| at.elapsed() >= std::time::Duration::from_secs(60)) {
                    last_warning = Some(std::time::Instant::now());
                    tracing::warn!(%remote, max = MAX_CONNECTIONS, "kubelet API: too many connections open; closing new ones unserved");
                }
                continue;
            };
            let (acceptor, router, cancel) = (acceptor.clone(), router.clone(), cancel.clone());
            connections.spawn(async move {
                let _slot = slot;
                tokio::select! {
                    () = serve_connection(tcp, remote, acceptor, router) => {}
                    () = cancel.cancelled() => {}
                }
            });
        }
    });
    Ok(())
}

async fn serve_connection(
    tcp: tokio::net::TcpStream,
    remote: SocketAddr,
    acceptor: tokio_rustls::TlsAcceptor,
    router: axum::Router,
) {
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::debug!(%remote, %e, "kubelet API TLS handshake");
            return;
        }
        Err(_) => {
            tracing::debug!(%remote, "kubelet API TLS handshake timed out");
            return;
        }
    };
    let user = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .and_then(|leaf| User::from_certificate(leaf));
    let peer = Peer(user);
    let svc =
        tower::ServiceExt::map_request(router, move |mut r: Request<hyper::body::Incoming>| {
            r.extensions_mut().insert(peer.clone());
            r
        });
    let svc = hyper_util::service::TowerToHyperService::new(svc);
    if let Err(e) = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(tls), svc)
        .with_upgrades()
        .await
    {
        tracing::debug!(%remote, %e, "kubelet API connection");
    }
}

fn routes(state: ApiState) -> axum::Router {
    axum::Router::new()
        .route("/healthz", get(super::healthz))
        .route("/pods", get(super::pods))
        .route("/metrics", get(super::metrics))
        .route("/stats/summary", get(super::stats_summary))
        .route("/metrics/resource", get(super::resource_metrics))
        .route("/metrics/cadvisor", get(super::cadvisor_metrics))
        .route("/metrics/probes", get(super::probe_metrics))
        .route(
            "/containerLogs/{namespace}/{pod}/{container}",
            get(container_logs),
        )
        .route("/exec/{namespace}/{pod}/{container}", any(exec))
        .route("/exec/{namespace}/{pod}/{uid}/{container}", any(exec_uid))
        .route("/attach/{namespace}/{pod}/{container}", any(attach))
        .route(
            "/attach/{namespace}/{pod}/{uid}/{container}",
            any(attach_uid),
        )
        .route("/portForward/{namespace}/{pod}", any(port_forward))
        .route(
            "/portForward/{namespace}/{pod}/{uid}",
            any(port_forward_uid),
        )
        .route("/run/{namespace}/{pod}/{container}", post(run))
        .route("/run/{namespace}/{pod}/{uid}/{container}", post(run_uid))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            authenticate,
        ))
        .with_state(state)
}

/// The bearer token of an `Authorization: Bearer <token>` header.
fn bearer_token(headers: &axum::http::HeaderMap) -> Option<String> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then(|| token.to_owned())
}

/// A client certificate's user, else a reviewed bearer token's, else the anonymous user when
/// allowed, else 401; then, with the access webhook, the API server's decision (403 when
/// denied, 500 when it cannot be asked).
async fn authenticate(
    State(s): State<ApiState>,
    mut req: Request<Body>,
    next: Next,
) -> Response<Body> {
    let unauthorized = || text(StatusCode::UNAUTHORIZED, "Unauthorized\n");
    let certified = req.extensions().get::<Peer>().and_then(|p| p.0.clone());
    let token = bearer_token(req.headers());
    let reviewer = s.webhook.as_ref().filter(|w| w.reviews_tokens());
    let user = match (certified, token, reviewer) {
        (Some(u), _, _) => u,
        (None, Some(token), Some(w)) => match w.review_token(&token).await {
            Ok(Some(u)) => u,
            Ok(None) => return unauthorized(),
            Err(e) => {
                tracing::warn!(error = %e, "kubelet API: reviewing a bearer token failed");
                return unauthorized();
            }
        },
        (None, _, _) if s.anonymous => User::anonymous(),
        (None, _, _) => return unauthorized(),
    };
    if let Some(w) = s.webhook.as_ref().filter(|w| w.reviews_access()) {
        let attrs = super::webhook::attributes(req.method(), req.uri().path());
        let named = format!(
            "(user={}, verb={}, resource=nodes, subresource={})",
            user.name, attrs.verb, attrs.subresource
        );
        match w.review_access(&user, &attrs).await {
            Ok(super::webhook::Decision::Allowed) => {}
            Ok(super::webhook::Decision::Denied(reason)) => {
                tracing::debug!(user = %user.name, path = %req.uri().path(), %reason, "kubelet API request denied");
                return text(StatusCode::FORBIDDEN, format!("Forbidden {named}\n"));
            }
            Err(e) => {
                tracing::warn!(error = %e, "kubelet API: reviewing a request's access failed");
                return text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("Authorization error {named}\n"),
                );
            }
        }
    }
    tracing::debug!(user = %user.name, method = %req.method(), path = %req.uri().path(), "kubelet API request");
    req.extensions_mut().insert(user);
    next.run(req).await
}

/// The pod a request names, and its last status; 404 when the agent runs no such pod (or its
/// UID differs from the one in the path).
fn find_pod(
    s: &ApiState,
    namespace: &str,
    pod: &str,
    uid: Option<&str>,
) -> Result<(String, PodStatus), Refusal> {
    match s.app.status.find(namespace, pod) {
        Some((found, status)) if uid.is_none_or(|u| u == found) => Ok((found, status)),
        _ => Err(Refusal::new(
            StatusCode::NOT_FOUND,
            format!("pod \"{namespace}/{pod}\" not found"),
        )),
    }
}

fn container_status<'a>(status: &'a PodStatus, name: &str) -> Option<&'a ContainerStatus> {
    [
        &status.container_statuses,
        &status.init_container_statuses,
        &status.ephemeral_container_statuses,
    ]
    .into_iter()
    .flatten()
    .flatten()
    .find(|c| c.name == name)
}

/// The runtime's ID in a status's `containerID` (`containerd://<id>`).
fn runtime_id(container_id: &str) -> &str {
    container_id
        .split_once("://")
        .map_or(container_id, |(_, id)| id)
}

/// The runtime ID of the instance of the pod's container `name` whose log a request reads, by
/// the kubelet's rule: with `previous` the last terminated instance; else the running one, the
/// terminated one, or (waiting to restart) the last terminated one.
fn container_id(
    status: &PodStatus,
    pod: &str,
    name: &str,
    previous: bool,
) -> Result<String, Refusal> {
    let Some(c) = container_status(status, name) else {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            format!("container \"{name}\" in pod \"{pod}\" is not valid"),
        ));
    };
    let last = c
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .and_then(|t| t.container_id.as_deref());
    let state = c.state.clone().unwrap_or_default();
    let id = if previous {
        last.ok_or_else(|| {
            Refusal::new(
                StatusCode::BAD_REQUEST,
                format!("previous terminated container \"{name}\" in pod \"{pod}\" not found"),
            )
        })?
    } else if state.running.is_some() {
        c.container_id.as_deref().unwrap_or_default()
    } else if let Some(t) = &state.terminated {
        t.container_id.as_deref().or(last).unwrap_or_default()
    } else if let Some(last) = last {
        last
    } else {
        let why = state
            .waiting
            .and_then(|w| w.reason)
            .unwrap_or_else(|| "no instance yet".into());
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            format!("container \"{name}\" in pod \"{pod}\" is waiting to start: {why}"),
        ));
    };
    if id.is_empty() {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            format!("container \"{name}\" in pod \"{pod}\" has no instance"),
        ));
    }
    Ok(runtime_id(id).to_owned())
}

/// The ID of the instance exec, attach and `/run` go to: the running one.
fn running_container_id(status: &PodStatus, pod: &str, name: &str) -> Result<String, Refusal> {
    match container_status(status, name) {
        Some(c) if c.state.as_ref().is_some_and(|s| s.running.is_some()) => c
            .container_id
            .as_deref()
            .map(|id| runtime_id(id).to_owned())
            .ok_or_else(|| {
                Refusal::new(
                    StatusCode::BAD_REQUEST,
                    format!("container \"{name}\" in pod \"{pod}\" has no instance"),
                )
            }),
        Some(_) => Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            format!("container \"{name}\" in pod \"{pod}\" is not running"),
        )),
        None => Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            format!("container \"{name}\" in pod \"{pod}\" is not valid"),
        )),
    }
}

fn runtime_error(what: &str, e: &crate::cri::Error) -> Refusal {
    let status = if e.is_not_found() {
        StatusCode::NOT_FOUND
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    };
    Refusal::new(status, format!("{what}: {e}"))
}

struct Running {
    cri: Cri,
    id: String,
}

impl container_logs::Liveness for Running {
    async fn running(&self) -> bool {
        matches!(
            self.cri.container_status(&self.id).await,
            Ok(Some(s)) if s.state == cri::ContainerState::ContainerRunning as i32
        )
    }
}

async fn container_logs(
    State(s): State<ApiState>,
    Path((namespace, pod, container)): Path<(String, String, String)>,
    uri: axum::http::Uri,
) -> Answer {
    let opts = LogOptions::parse(uri.query().unwrap_or(""), jiff::Timestamp::now())
        .map_err(|why| Refusal::new(StatusCode::BAD_REQUEST, why.to_string()))?;
    let (_, status) = find_pod(&s, &namespace, &pod, None)?;
    let id = container_id(&status, &pod, &container, opts.previous)?;
    let path = match s.cri.container_status(&id).await {
        Ok(Some(st)) if !st.log_path.is_empty() => std::path::PathBuf::from(st.log_path),
        Ok(_) => {
            return Err(Refusal::new(
                StatusCode::NOT_FOUND,
                format!("container \"{container}\" in pod \"{pod}\" has no log file"),
            ));
        }
        Err(e) => return Err(runtime_error("reading the container's status", &e)),
    };
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    // A previous instance has stopped: nothing more is written to its log.
    let opts = LogOptions {
        follow: opts.follow && !opts.previous,
        ..opts
    };
    let alive = Running {
        cri: s.cri.clone(),
        id,
    };
    tokio::spawn(container_logs::stream(path, opts, alive, tx));
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    let mut r = Response::new(body);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("text/plain"),
    );
    Ok(r)
}

/// The query's values of `name`, in order.
fn values(query: &str, name: &str) -> Vec<String> {
    form_urlencoded::parse(query.as_bytes())
        .filter(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
        .collect()
}

/// Whether a stream option is on (`1` or `true`).
fn on(query: &str, name: &str) -> bool {
    values(query, name)
        .last()
        .is_some_and(|v| v == "1" || v == "true")
}

/// The exec and attach options, by the kubelet's query names: `command` (exec), `input`,
/// `output`, `error`, `tty`.
#[derive(Debug)]
struct StreamOptions {
    command: Vec<String>,
    stdin: bool,
    stdout: bool,
    stderr: bool,
    tty: bool,
}

impl StreamOptions {
    fn parse(query: &str) -> Result<Self, Refusal> {
        let tty = on(query, "tty");
        let o = Self {
            command: values(query, "command"),
            stdin: on(query, "input"),
            stdout: on(query, "output"),
            // The kubelet drops stderr with a TTY: a terminal has one output stream.
            stderr: on(query, "error") && !tty,
            tty,
        };
        if !o.stdin && !o.stdout && !o.stderr {
            return Err(Refusal::new(
                StatusCode::BAD_REQUEST,
                "you must specify at least 1 of stdin, stdout, stderr",
            ));
        }
        Ok(o)
    }
}

enum Stream {
    Exec,
    Attach,
}

/// What a path names: namespace, pod, the pod's UID (when the path has one), container.
type ContainerPath = (String, String, Option<String>, String);

async fn exec_or_attach(
    s: ApiState,
    kind: Stream,
    (namespace, pod, uid, container): ContainerPath,
    req: Request<Body>,
) -> Answer {
    let o = StreamOptions::parse(req.uri().query().unwrap_or(""))?;
    let (_, status) = find_pod(&s, &namespace, &pod, uid.as_deref())?;
    let container_id = running_container_id(&status, &pod, &container)?;
    let url = match kind {
        Stream::Exec => {
            if o.command.is_empty() {
                return Err(Refusal::new(
                    StatusCode::BAD_REQUEST,
                    "exec needs a command",
                ));
            }
            s.cri
                .exec(cri::ExecRequest {
                    container_id,
                    cmd: o.command,
                    tty: o.tty,
                    stdin: o.stdin,
                    stdout: o.stdout,
                    stderr: o.stderr,
                })
                .await
        }
        Stream::Attach => {
            s.cri
                .attach(cri::AttachRequest {
                    container_id,
                    stdin: o.stdin,
                    tty: o.tty,
                    stdout: o.stdout,
                    stderr: o.stderr,
                })
                .await
        }
    };
    match url {
        Ok(url) => Ok(proxy(req, &url, s.stream_idle_timeout).await),
        Err(e) => Err(runtime_error("asking the runtime for a stream", &e)),
    }
}

async fn exec(
    State(s): State<ApiState>,
    Path((ns, pod, c)): Path<(String, String, String)>,
    req: Request<Body>,
) -> Answer {
    exec_or_attach(s, Stream::Exec, (ns, pod, None, c), req).await
}

async fn exec_uid(
    State(s): State<ApiState>,
    Path((ns, pod, uid, c)): Path<(String, String, String, String)>,
    req: Request<Body>,
) -> Answer {
    exec_or_attach(s, Stream::Exec, (ns, pod, Some(uid), c), req).await
}

async fn attach(
    State(s): State<ApiState>,
    Path((ns, pod, c)): Path<(String, String, String)>,
    req: Request<Body>,
) -> Answer {
    exec_or_attach(s, Stream::Attach, (ns, pod, None, c), req).await
}

async fn attach_uid(
    State(s): State<ApiState>,
    Path((ns, pod, uid, c)): Path<(String, String, String, String)>,
    req: Request<Body>,
) -> Answer {
    exec_or_attach(s, Stream::Attach, (ns, pod, Some(uid), c), req).await
}

/// The `ports` of a WebSocket port-forward (SPDY clients name theirs per stream, in headers).
fn forwarded_ports(query: &str) -> Result<Vec<i32>, Refusal> {
    let mut ports = Vec::new();
    for v in values(query, "ports") {
        for p in v.split(',').filter(|p| !p.is_empty()) {
            match p.trim().parse::<u16>() {
                Ok(n) if n > 0 => ports.push(i32::from(n)),
                _ => {
                    return Err(Refusal::new(
                        StatusCode::BAD_REQUEST,
                        format!("port {p:?} must be an integer from 1 to 65535"),
                    ));
                }
            }
        }
    }
    Ok(ports)
}

async fn port_forward_to(
    s: ApiState,
    (namespace, pod, uid): (String, String, Option<String>),
    req: Request<Body>,
) -> Answer {
    let ports = forwarded_ports(req.uri().query().unwrap_or(""))?;
    let (pod_uid, _) = find_pod(&s, &namespace, &pod, uid.as_deref())?;
    let filter = cri::PodSandboxFilter {
        state: Some(cri::PodSandboxStateValue {
            state: cri::PodSandboxState::SandboxReady as i32,
        }),
        label_selector: [(labels::POD_UID.to_owned(), pod_uid)]
            .into_iter()
            .collect(),
        ..Default::default()
    };
    let sandbox = s
        .cri
        .list_pod_sandbox(Some(filter))
        .await
        .map_err(|e| runtime_error("listing the pod's sandboxes", &e))?
        .into_iter()
        .max_by_key(|sb| sb.created_at)
        .ok_or_else(|| {
            Refusal::new(
                StatusCode::BAD_REQUEST,
                format!("pod \"{namespace}/{pod}\" has no ready sandbox"),
            )
        })?;
    let url = s
        .cri
        .port_forward(cri::PortForwardRequest {
            pod_sandbox_id: sandbox.id,
            port: ports,
        })
        .await
        .map_err(|e| runtime_error("asking the runtime for a port-forward stream", &e))?;
    Ok(proxy(req, &url, s.stream_idle_timeout).await)
}

async fn port_forward(
    State(s): State<ApiState>,
    Path((ns, pod)): Path<(String, String)>,
    req: Request<Body>,
) -> Answer {
    port_forward_to(s, (ns, pod, None), req).await
}

async fn port_forward_uid(
    State(s): State<ApiState>,
    Path((ns, pod, uid)): Path<(String, String, String)>,
    req: Request<Body>,
) -> Answer {
    port_forward_to(s, (ns, pod, Some(uid)), req).await
}

/// `POST /run`: runs `cmd` (split at white space, from the query or a form body) in the
/// container and answers its output (stdout, then stderr).
async fn run_in(
    s: ApiState,
    (namespace, pod, uid, container): ContainerPath,
    req: Request<Body>,
) -> Answer {
    let mut cmd = values(req.uri().query().unwrap_or(""), "cmd");
    if cmd.is_empty() {
        let body = axum::body::to_bytes(req.into_body(), 64 << 10)
            .await
            .map_err(|e| Refusal::new(StatusCode::BAD_REQUEST, format!("reading the body: {e}")))?;
        cmd = form_urlencoded::parse(&body)
            .filter(|(k, _)| k == "cmd")
            .map(|(_, v)| v.into_owned())
            .collect();
    }
    let cmd: Vec<String> = cmd
        .last()
        .map(|c| c.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default();
    if cmd.is_empty() {
        return Err(Refusal::new(StatusCode::BAD_REQUEST, "run needs a cmd"));
    }
    let (_, status) = find_pod(&s, &namespace, &pod, uid.as_deref())?;
    let id = running_container_id(&status, &pod, &container)?;
    let out = s
        .cri
        .exec_sync(&id, cmd.clone(), RUN_TIMEOUT_SECS)
        .await
        .map_err(|e| runtime_error("running the command", &e))?;
    if out.exit_code != 0 {
        return Err(Refusal::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "command {cmd:?} exited with {}: {}",
                out.exit_code,
                String::from_utf8_lossy(&out.stderr)
            ),
        ));
    }
    let mut body = out.stdout;
    body.extend_from_slice(&out.stderr);
    let mut r = Response::new(Body::from(body));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("text/plain"),
    );
    Ok(r)
}

async fn run(
    State(s): State<ApiState>,
    Path((ns, pod, c)): Path<(String, String, String)>,
    req: Request<Body>,
) -> Answer {
    run_in(s, (ns, pod, None, c), req).await
}

async fn run_uid(
    State(s): State<ApiState>,
    Path((ns, pod, uid, c)): Path<(String, String, String, String)>,
    req: Request<Body>,
) -> Answer {
    run_in(s, (ns, pod, Some(uid), c), req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_options_follow_the_kubelets_names_and_rules() {
        let o = StreamOptions::parse("command=echo&command=a%20b&output=1&error=1").unwrap();
        assert_eq!(o.command, ["echo", "a b"]);
        assert_eq!(
            (o.stdin, o.stdout, o.stderr, o.tty),
            (false, true, true, false)
        );
        let o = StreamOptions::parse("command=sh&input=1&error=1&tty=1").unwrap();
        assert!(o.tty && !o.stderr, "a TTY has no separate stderr");
        assert!(StreamOptions::parse("command=ls").is_err());
        assert_eq!(
            forwarded_ports("ports=80,8080&ports=9").ok(),
            Some(vec![80, 8080, 9])
        );
        assert!(forwarded_ports("ports=0").is_err());
        assert!(forwarded_ports("ports=70000").is_err());
    }

    #[test]
    fn logs_read_the_instance_the_kubelet_would() {
        use k8s_openapi::api::core::v1::{
            ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
        };
        let terminated = |id: &str| ContainerState {
            terminated: Some(ContainerStateTerminated {
                container_id: Some(format!("containerd://{id}")),
                ..Default::default()
            }),
            ..Default::default()
        };
        let with = |state: ContainerState, last: Option<ContainerState>| PodStatus {
            container_statuses: Some(vec![ContainerStatus {
                name: "app".into(),
                container_id: Some("containerd://new".into()),
                state: Some(state),
                last_state: last,
                ..Default::default()
            }]),
            ..Default::default()
        };
        let running = ContainerState {
            running: Some(ContainerStateRunning::default()),
            ..Default::default()
        };
        let waiting = ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some("CrashLoopBackOff".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let id = |st: &PodStatus, previous| container_id(st, "p", "app", previous).ok();
        let up = with(running.clone(), Some(terminated("old")));
        assert_eq!(id(&up, false).as_deref(), Some("new"));
        assert_eq!(id(&up, true).as_deref(), Some("old"));
        assert_eq!(
            running_container_id(&up, "p", "app").ok().as_deref(),
            Some("new")
        );
        let backoff = with(waiting.clone(), Some(terminated("old")));
        assert_eq!(id(&backoff, false).as_deref(), Some("old"));
        assert!(running_container_id(&backoff, "p", "app").is_err());
        let done = with(terminated("new"), None);
        assert_eq!(id(&done, false).as_deref(), Some("new"));
        assert!(id(&done, true).is_none());
        let e = container_id(&with(waiting, None), "p", "app", false).unwrap_err();
        assert!(e.1.contains("waiting to start: CrashLoopBackOff"), "{e:?}");
        assert!(id(&up, false).is_some() && container_id(&up, "p", "nope", false).is_err());
    }
}
