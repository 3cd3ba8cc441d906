//! The actions probes and lifecycle hooks run against a container (the API's handlers): exec
//! (CRI `ExecSync`), an HTTP or HTTPS GET (HTTP/1.1 on fresh connections, no keep-alive,
//! redirects followed on the same host name only), a TCP connect, a gRPC health check
//! (`grpc.health.v1.Health/Check`) and a pause (`sleep`). Each is given a timeout and answers
//! with a [`ProbeResult`] and a short message saying why.
//!
//! HTTPS is TLS without verifying the server's certificate, as the kubelet's prober does: any
//! certificate is accepted, but the handshake's signatures are still checked against it. The
//! server name sent (SNI) is the probe's host, or none when that is an IP address.
use crate::cri::Cri;
use crate::pod::probe_results::ProbeResult;
use http_body_util::Empty;
use hyper::header::{HeaderName, HeaderValue};
use k8s_openapi::api::core::v1::{ContainerPort, ExecAction, GRPCAction, HTTPGetAction};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::sync::{Arc, LazyLock};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

#[cfg(any(test, feature = "test-servers"))]
pub mod test_servers;

/// How much longer than its timeout an exec may take before swiftlet stops waiting for the
/// runtime (ExecSync itself is given the timeout).
const EXEC_MARGIN: Duration = Duration::from_secs(1);
/// Output kept in a failure message.
const MESSAGE_MAX: usize = 256;
/// Redirects followed on the same host, as Go's HTTP client the kubelet uses.
const MAX_REDIRECTS: usize = 10;
/// What the kubelet sends; some applications look for it.
const USER_AGENT: &str = "kube-probe/1.31";

/// What a probe or hook does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handler {
    Exec(Vec<String>),
    Http(HttpGet),
    Tcp {
        host: Option<String>,
        port: IntOrString,
    },
    Grpc(Grpc),
    /// A lifecycle hook's pause.
    Sleep(Duration),
}

/// Why a probe's or lifecycle hook's handler is refused, in the API server's validation words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("port {0} is not between 1 and 65535")]
    Port(i32),
    #[error("port name is empty")]
    EmptyPortName,
    #[error("httpGet.scheme must be HTTP or HTTPS (got {0:?})")]
    Scheme(String),
    #[error("grpc.port {0} is not between 1 and 65535")]
    GrpcPort(i32),
    #[error("exec.command is empty")]
    EmptyCommand,
    /// None of the handlers it may have (named).
    #[error("no handler ({0})")]
    NoHandler(&'static str),
    #[error("more than one handler")]
    MoreThanOne,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpGet {
    pub host: Option<String>,
    pub port: IntOrString,
    pub path: String,
    pub scheme: String,
    pub headers: Vec<(String, String)>,
}

impl HttpGet {
    /// Validates an API httpGet action and applies its defaults (scheme HTTP, path `/`).
    pub fn parse(h: &HTTPGetAction) -> Result<HttpGet, Invalid> {
        check_port(&h.port)?;
        let scheme = h.scheme.clone().unwrap_or_else(|| "HTTP".into());
        if !matches!(scheme.as_str(), "HTTP" | "HTTPS") {
            return Err(Invalid::Scheme(scheme));
        }
        let path = match h.path.as_deref() {
            None | Some("") => "/".to_owned(),
            Some(p) if p.starts_with('/') => p.to_owned(),
            Some(p) => format!("/{p}"),
        };
        Ok(HttpGet {
            host: h.host.clone().filter(|h| !h.is_empty()),
            port: h.port.clone(),
            path,
            scheme,
            headers: h
                .http_headers
                .iter()
                .flatten()
                .map(|h| (h.name.clone(), h.value.clone()))
                .collect(),
        })
    }
}

/// A gRPC probe: `grpc.health.v1.Health/Check` for `service` on the pod IP and `port`,
/// plain-text HTTP/2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grpc {
    pub port: u16,
    pub service: String,
}

impl Grpc {
    /// Validates an API grpc action and applies its default (service "").
    pub fn parse(g: &GRPCAction) -> Result<Grpc, Invalid> {
        let port = u16::try_from(g.port)
            .ok()
            .filter(|&p| p != 0)
            .ok_or(Invalid::GrpcPort(g.port))?;
        Ok(Grpc {
            port,
            service: g.service.clone().unwrap_or_default(),
        })
    }
}

/// An `exec` handler's command; the API requires one.
pub fn exec_command(e: &ExecAction) -> Result<Vec<String>, Invalid> {
    match e.command.as_deref() {
        Some(cmd) if !cmd.is_empty() => Ok(cmd.to_vec()),
        _ => Err(Invalid::EmptyCommand),
    }
}

/// The one handler a probe or hook declares: none (`kinds` says which it may have) or more than
/// one is an error, as the API's validation has it.
pub fn exactly_one<T>(mut handlers: Vec<T>, kinds: &'static str) -> Result<T, Invalid> {
    match handlers.len() {
        1 => Ok(handlers.remove(0)),
        0 => Err(Invalid::NoHandler(kinds)),
        _ => Err(Invalid::MoreThanOne),
    }
}

/// A port given by number (1 to 65535) or by a non-empty name.
pub fn check_port(p: &IntOrString) -> Result<(), Invalid> {
    match p {
        IntOrString::Int(n) if !(1..=65535).contains(n) => Err(Invalid::Port(*n)),
        IntOrString::String(s) if s.is_empty() => Err(Invalid::EmptyPortName),
        _ => Ok(()),
    }
}

/// Where a handler goes: the container, its pod's IP and its declared ports.
#[derive(Debug, Clone, Default)]
pub struct Target {
    pub container_id: String,
    pub pod_ip: Option<String>,
    pub ports: Vec<ContainerPort>,
}

/// Runs `handler` against `target` within `timeout`.
pub async fn run(
    cri: &Cri,
    handler: &Handler,
    target: &Target,
    timeout: Duration,
) -> (ProbeResult, String) {
    match handler {
        Handler::Exec(cmd) => exec(cri, &target.container_id, cmd, timeout).await,
        Handler::Http(h) => http_get(h, target, timeout).await,
        Handler::Tcp { host, port } => tcp(host.as_deref(), port, target, timeout).await,
        Handler::Grpc(g) => grpc(g, target, timeout).await,
        Handler::Sleep(d) => {
            tokio::time::sleep((*d).min(timeout)).await;
            (ProbeResult::Success, String::new())
        }
    }
}

/// Runs `cmd` in container `id` (CRI `ExecSync`); success is exit code 0.
pub async fn exec(cri: &Cri, id: &str, cmd: &[String], timeout: Duration) -> (ProbeResult, String) {
    let secs = i64::try_from(timeout.as_secs().max(1)).unwrap_or(i64::MAX);
    let call = cri.exec_sync(id, cmd.to_vec(), secs);
    match tokio::time::timeout(timeout + EXEC_MARGIN, call).await {
        Ok(Ok(r)) if r.exit_code == 0 => (ProbeResult::Success, String::new()),
        Ok(Ok(r)) => {
            let out = if r.stderr.is_empty() {
                r.stdout
            } else {
                r.stderr
            };
            (
                ProbeResult::Failure,
                format!(
                    "command exited with {}: {}",
                    r.exit_code,
                    short(&String::from_utf8_lossy(&out))
                ),
            )
        }
        // containerd reports a command that outlived its timeout as an error.
        Ok(Err(e)) => (ProbeResult::Failure, format!("exec: {e}")),
        Err(_) => (
            ProbeResult::Failure,
            format!("command timed out after {timeout:?}"),
        ),
    }
}

fn short(s: &str) -> String {
    let s = s.trim();
    match s.char_indices().nth(MESSAGE_MAX) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_owned(),
    }
}

/// Why a port names no port to connect to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnknownPort {
    #[error("invalid port {0}")]
    Number(i32),
    #[error("the container has no port named {0:?}")]
    Name(String),
}

/// The port number: a number, or the name of one of the container's ports.
pub fn resolve_port(port: &IntOrString, ports: &[ContainerPort]) -> Result<u16, UnknownPort> {
    match port {
        IntOrString::Int(n) => u16::try_from(*n)
            .ok()
            .filter(|&p| p != 0)
            .ok_or(UnknownPort::Number(*n)),
        IntOrString::String(name) => ports
            .iter()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok())
            .ok_or_else(|| UnknownPort::Name(name.clone())),
    }
}

/// The host (the probe's own, else the pod IP) and port a network probe connects to; `Err` is an
/// Unknown result (nothing to connect to yet).
fn endpoint(
    host: Option<&str>,
    port: &IntOrString,
    target: &Target,
) -> Result<(String, u16), (ProbeResult, String)> {
    let host = host
        .map(str::to_owned)
        .or_else(|| target.pod_ip.clone())
        .ok_or((ProbeResult::Unknown, "the pod has no IP yet".to_owned()))?;
    let port =
        resolve_port(port, &target.ports).map_err(|e| (ProbeResult::Unknown, e.to_string()))?;
    Ok((host, port))
}

async fn tcp(
    host: Option<&str>,
    port: &IntOrString,
    target: &Target,
    timeout: Duration,
) -> (ProbeResult, String) {
    let (host, port) = match endpoint(host, port, target) {
        Ok(e) => e,
        Err(r) => return r,
    };
    match tokio::time::timeout(timeout, TcpStream::connect((host.as_str(), port))).await {
        Ok(Ok(_)) => (ProbeResult::Success, String::new()),
        Ok(Err(e)) => (ProbeResult::Failure, format!("dial tcp {host}:{port}: {e}")),
        Err(_) => (
            ProbeResult::Failure,
            format!("dial tcp {host}:{port}: timed out after {timeout:?}"),
        ),
    }
}

/// `host:port`, with an IPv6 address in brackets.
fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Where one GET goes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Url {
    tls: bool,
    /// The host name or IP address, without brackets.
    host: String,
    port: u16,
    /// The Host header: the URL's authority as written.
    authority: String,
    /// Path and query.
    path: String,
}

impl Url {
    fn new(tls: bool, host: &str, port: u16, path: &str) -> Url {
        Url {
            tls,
            host: host.to_owned(),
            port,
            authority: join_host_port(host, port),
            path: path.to_owned(),
        }
    }
}

impl std::fmt::Display for Url {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.tls { "https" } else { "http" };
        write!(f, "{scheme}://{}{}", self.authority, self.path)
    }
}

async fn http_get(h: &HttpGet, target: &Target, timeout: Duration) -> (ProbeResult, String) {
    match http_status(h, target, timeout).await {
        Ok(status) if (200..400).contains(&status) => {
            (ProbeResult::Success, format!("HTTP {status}"))
        }
        Ok(status) => (
            ProbeResult::Failure,
            format!("HTTP probe failed with statuscode: {status}"),
        ),
        Err(r) => r,
    }
}

/// GETs `h` within `timeout` and answers the final response's status, whatever it is (a
/// lifecycle hook succeeds on any answer, a probe only on 2xx and 3xx); `Err` when there was no
/// answer, with the result and message saying why.
pub async fn http_status(
    h: &HttpGet,
    target: &Target,
    timeout: Duration,
) -> Result<u16, (ProbeResult, String)> {
    let (host, port) = endpoint(h.host.as_deref(), &h.port, target)?;
    let url = Url::new(h.scheme == "HTTPS", &host, port, &h.path);
    let shown = url.to_string();
    match tokio::time::timeout(timeout, follow(url, h)).await {
        Ok(Ok(status)) => Ok(status),
        Ok(Err(e)) => Err((ProbeResult::Failure, e)),
        Err(_) => Err((
            ProbeResult::Failure,
            format!("Get {shown:?}: no answer within {timeout:?}"),
        )),
    }
}

/// Where a redirect from `current` to `location` leads: `Ok(None)` when it leaves the host name
/// (not followed). As the kubelet, only the host name counts: a redirect may change the scheme
/// (HTTP to HTTPS and back) and the port.
fn redirect(location: &str, current: &Url) -> Result<Option<Url>, String> {
    let absolute = if location.starts_with("//") {
        let scheme = if current.tls { "https" } else { "http" };
        Some(format!("{scheme}:{location}"))
    } else if location.contains("://") {
        Some(location.to_owned())
    } else {
        None
    };
    let Some(absolute) = absolute else {
        let here = current.path.split(['?', '#']).next().unwrap_or("");
        let path = if location.starts_with('/') {
            location.to_owned()
        } else if location.starts_with('?') {
            format!("{here}{location}")
        } else {
            // Relative to the current path's directory.
            let dir = here.rsplit_once('/').map_or("", |(d, _)| d);
            format!("{dir}/{location}")
        };
        return Ok(Some(Url {
            path,
            ..current.clone()
        }));
    };
    let uri = absolute
        .parse::<hyper::Uri>()
        .map_err(|e| format!("redirect to {location:?}: {e}"))?;
    let Some(authority) = uri.authority() else {
        return Err(format!("redirect to {location:?}: no host"));
    };
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    if host != current.host {
        return Ok(None);
    }
    let tls = match uri.scheme_str().map(str::to_ascii_lowercase).as_deref() {
        Some("http") => false,
        Some("https") => true,
        other => {
            return Err(format!(
                "redirect to {location:?}: unsupported protocol scheme {:?}",
                other.unwrap_or("")
            ));
        }
    };
    Ok(Some(Url {
        tls,
        host: host.to_owned(),
        port: authority.port_u16().unwrap_or(if tls { 443 } else { 80 }),
        authority: authority.as_str().to_owned(),
        path: uri.path_and_query().map_or("/", |p| p.as_str()).to_owned(),
    }))
}

/// GETs, following redirects that stay on the same host name (at most [`MAX_REDIRECTS`]). A
/// redirect to another host is not followed: its 3xx status is the answer (the kubelet counts it
/// as a success with a warning). An error names the URL that failed.
async fn follow(first: Url, h: &HttpGet) -> Result<u16, String> {
    let mut url = first;
    for _ in 0..=MAX_REDIRECTS {
        let (status, location) = get(&url, h)
            .await
            .map_err(|e| format!("Get {:?}: {e}", url.to_string()))?;
        let next = match location.filter(|_| (300..400).contains(&status)) {
            Some(l) => redirect(&l, &url).map_err(|e| format!("Get {:?}: {e}", url.to_string()))?,
            None => None,
        };
        match next {
            Some(u) => url = u,
            None => return Ok(status),
        }
    }
    Err(format!("stopped after {MAX_REDIRECTS} redirects"))
}

/// One GET of `url` on a new connection (TLS for https): the response status and its Location
/// header.
async fn get(url: &Url, h: &HttpGet) -> Result<(u16, Option<String>), String> {
    let tcp = TcpStream::connect((url.host.as_str(), url.port))
        .await
        .map_err(|e| format!("dial tcp {}: {e}", url.authority))?;
    if !url.tls {
        return request(tcp, url, h).await;
    }
    let connector = TLS.as_ref().map_err(Clone::clone)?;
    let name = rustls::pki_types::ServerName::try_from(url.host.clone())
        .map_err(|e| format!("TLS server name {:?}: {e}", url.host))?;
    let tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS handshake with {}: {e}", url.authority))?;
    request(tls, url, h).await
}

/// The GET itself, over `stream`.
async fn request<S>(stream: S, url: &Url, h: &HttpGet) -> Result<(u16, Option<String>), String>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake::<_, Empty<bytes::Bytes>>(
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .map_err(|e| e.to_string())?;
    let conn = tokio::spawn(conn);
    let mut req = hyper::Request::get(url.path.as_str())
        .header(hyper::header::HOST, url.authority.as_str())
        .header(hyper::header::USER_AGENT, USER_AGENT)
        .header(hyper::header::ACCEPT, "*/*")
        .header(hyper::header::CONNECTION, "close");
    for (name, value) in &h.headers {
        let name = HeaderName::try_from(name.as_str())
            .map_err(|e| format!("header name {name:?}: {e}"))?;
        let value = HeaderValue::try_from(value.as_str())
            .map_err(|e| format!("header {name} value: {e}"))?;
        // A header given in the probe replaces the default of the same name.
        if let Some(headers) = req.headers_mut() {
            headers.insert(name, value);
        }
    }
    let req = req
        .body(Empty::new())
        .map_err(|e| format!("request: {e}"))?;
    let result = sender
        .send_request(req)
        .await
        .map(|resp| {
            let location = resp
                .headers()
                .get(hyper::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            (resp.status().as_u16(), location)
        })
        .map_err(|e| e.to_string());
    conn.abort();
    result
}

/// The TLS client of HTTPS probes and hooks (ring, TLS 1.2 and 1.3, ALPN `http/1.1`), built once.
static TLS: LazyLock<Result<tokio_rustls::TlsConnector, String>> = LazyLock::new(|| {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS client configuration: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
});

/// Accepts any server certificate (the kubelet's prober does not verify it either) but checks
/// that the server holds its key: the handshake's signatures are verified against it.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// An error with its causes (tonic's transport errors say little on their own).
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s = format!("{s}: {c}");
        cause = c.source();
    }
    s
}

/// A gRPC health check of the pod IP, with the kubelet's messages. `timeout` bounds the
/// connection and the call together (the call's deadline is what is left of it). Unlike the
/// kubelet, whose blocking dial retries until the timeout, a refused connection fails at once.
async fn grpc(g: &Grpc, target: &Target, timeout: Duration) -> (ProbeResult, String) {
    use swiftlet_proto::health::health_check_response::ServingStatus;
    use swiftlet_proto::health::{HealthCheckRequest, health_client::HealthClient};
    let Some(host) = target.pod_ip.as_deref() else {
        return (ProbeResult::Unknown, "the pod has no IP yet".to_owned());
    };
    let addr = join_host_port(host, g.port);
    let started = tokio::time::Instant::now();
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .and_then(|e| e.user_agent(USER_AGENT));
    let connect = async { endpoint?.connect().await };
    let channel = match tokio::time::timeout(timeout, connect).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            return (
                ProbeResult::Failure,
                format!(
                    "error: failed to connect service at {addr:?}: {}",
                    with_causes(&e)
                ),
            );
        }
        Err(_) => {
            return (
                ProbeResult::Failure,
                format!(
                    "timeout: failed to connect service {addr:?} within {timeout:?}: context deadline exceeded"
                ),
            );
        }
    };
    let left = timeout.saturating_sub(started.elapsed());
    let mut req = tonic::Request::new(HealthCheckRequest {
        service: g.service.clone(),
    });
    req.set_timeout(left);
    let rpc_timeout = || {
        (
            ProbeResult::Failure,
            format!("timeout: health rpc did not complete within {timeout:?}"),
        )
    };
    let resp = match tokio::time::timeout(left, HealthClient::new(channel).check(req)).await {
        Ok(Ok(r)) => r.into_inner(),
        Ok(Err(s)) => {
            // tonic ends a call whose deadline passed as CANCELLED on the client side.
            let expired = started.elapsed() >= timeout;
            return match s.code() {
                tonic::Code::DeadlineExceeded | tonic::Code::Cancelled if expired => rpc_timeout(),
                tonic::Code::Unimplemented => (
                    ProbeResult::Failure,
                    format!(
                        "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): {}",
                        s.message()
                    ),
                ),
                tonic::Code::DeadlineExceeded => rpc_timeout(),
                code => (
                    ProbeResult::Failure,
                    format!(
                        "error: health rpc probe failed: rpc error: code = {code:?} desc = {}",
                        s.message()
                    ),
                ),
            };
        }
        Err(_) => return rpc_timeout(),
    };
    if resp.status == ServingStatus::Serving as i32 {
        return (ProbeResult::Success, "service healthy".to_owned());
    }
    let status = ServingStatus::try_from(resp.status)
        .map_or_else(|_| resp.status.to_string(), |s| s.as_str_name().to_owned());
    (
        ProbeResult::Failure,
        format!("service unhealthy (responded with {status:?})"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    fn target() -> Target {
        Target {
            container_id: "c".into(),
            pod_ip: Some("127.0.0.1".into()),
            ports: vec![ContainerPort {
                name: Some("web".into()),
                container_port: 8080,
                ..Default::default()
            }],
        }
    }

    #[test]
    fn ports_by_number_or_name() {
        let t = target();
        assert_eq!(resolve_port(&IntOrString::Int(80), &t.ports), Ok(80));
        assert_eq!(
            resolve_port(&IntOrString::String("web".into()), &t.ports),
            Ok(8080)
        );
        assert!(
            resolve_port(&IntOrString::String("db".into()), &t.ports)
                .unwrap_err()
                .to_string()
                .contains("no port named \"db\"")
        );
    }

    /// A one-shot HTTP server answering `status`; returns its port and the request it read.
    async fn serve(status: u16) -> (u16, tokio::task::JoinHandle<String>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let task = tokio::spawn(async move { answer(&l, status, "").await });
        (port, task)
    }

    /// Answers one request on `l` with `status` and extra header lines; the request read.
    async fn answer(l: &TcpListener, status: u16, headers: &str) -> String {
        let (mut s, _) = l.accept().await.unwrap();
        let mut buf = vec![0; 4096];
        let n = s.read(&mut buf).await.unwrap();
        let reply = format!("HTTP/1.1 {status} X\r\n{headers}content-length: 0\r\n\r\n");
        s.write_all(reply.as_bytes()).await.unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[tokio::test]
    async fn same_host_redirects_are_followed_others_are_not() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let a = answer(&l, 302, "location: /moved\r\n").await;
            let b = answer(&l, 500, "").await;
            (a, b)
        });
        let (got, msg) = http_get(&http(port), &target(), Duration::from_secs(5)).await;
        assert_eq!(
            got,
            ProbeResult::Failure,
            "the redirect's target failed: {msg}"
        );
        let (a, b) = server.await.unwrap();
        assert!(a.starts_with("GET /healthz "), "{a}");
        assert!(b.starts_with("GET /moved "), "{b}");
    }

    #[test]
    fn redirects_keep_to_the_host_name_only() {
        let cur = Url::new(false, "127.0.0.1", 8080, "/a/c?q");
        let to = |l: &str| redirect(l, &cur).unwrap().map(|u| u.to_string());
        assert_eq!(to("http://10.0.0.9/x"), None);
        assert_eq!(to("https://localhost:8080/x"), None);
        assert_eq!(
            to("http://127.0.0.1:8080/x?y").as_deref(),
            Some("http://127.0.0.1:8080/x?y")
        );
        // The scheme and the port may change on the same host.
        assert_eq!(
            to("https://127.0.0.1:8443/s").as_deref(),
            Some("https://127.0.0.1:8443/s")
        );
        let https = redirect("https://127.0.0.1/", &cur).unwrap().unwrap();
        assert_eq!((https.tls, https.port), (true, 443));
        assert_eq!(
            to("//127.0.0.1:9/p").as_deref(),
            Some("http://127.0.0.1:9/p")
        );
        assert_eq!(to("/p").as_deref(), Some("http://127.0.0.1:8080/p"));
        assert_eq!(to("b").as_deref(), Some("http://127.0.0.1:8080/a/b"));
        assert_eq!(to("?r").as_deref(), Some("http://127.0.0.1:8080/a/c?r"));
        let v6 = Url::new(false, "::1", 80, "/");
        assert_eq!(
            redirect("http://[::1]:81/x", &v6)
                .unwrap()
                .map(|u| (u.port, u.authority)),
            Some((81, "[::1]:81".to_owned()))
        );
        assert!(
            redirect("ftp://127.0.0.1/x", &cur)
                .unwrap_err()
                .contains("unsupported protocol scheme \"ftp\"")
        );
    }

    fn http(port: u16) -> HttpGet {
        HttpGet {
            host: None,
            port: IntOrString::Int(i32::from(port)),
            path: "/healthz".into(),
            scheme: "HTTP".into(),
            headers: vec![("X-Probe".into(), "yes".into())],
        }
    }

    #[tokio::test]
    async fn http_status_decides() {
        for (status, want) in [
            (200, ProbeResult::Success),
            (302, ProbeResult::Success),
            (404, ProbeResult::Failure),
            (500, ProbeResult::Failure),
        ] {
            let (port, server) = serve(status).await;
            let (got, msg) = http_get(&http(port), &target(), Duration::from_secs(5)).await;
            assert_eq!(got, want, "{status}: {msg}");
            let req = server.await.unwrap();
            assert!(req.starts_with("GET /healthz HTTP/1.1"), "{req}");
            assert!(req.to_lowercase().contains("x-probe: yes"), "{req}");
        }
    }

    #[tokio::test]
    async fn http_that_never_answers_times_out() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let (got, msg) = http_get(&http(port), &target(), Duration::from_millis(200)).await;
        assert_eq!(got, ProbeResult::Failure);
        assert!(msg.contains("no answer within"), "{msg}");
        drop(l);
    }

    fn https(port: u16) -> Handler {
        let mut h = http(port);
        h.scheme = "HTTPS".into();
        Handler::Http(h)
    }

    /// `run` as probes and hooks call it (no exec here: the CRI endpoint is never dialled).
    async fn run_here(
        handler: &Handler,
        target: &Target,
        timeout: Duration,
    ) -> (ProbeResult, String) {
        let metrics = crate::metrics::Metrics::new();
        let cri = Cri::new("unix:///nonexistent/swiftlet-handler-test.sock", metrics).unwrap();
        run(&cri, handler, target, timeout).await
    }

    #[tokio::test]
    async fn https_accepts_a_self_signed_certificate_and_reads_the_status() {
        let dir = tempfile::tempdir().unwrap();
        let server = test_servers::HttpsServer::start("127.0.0.1", dir.path())
            .await
            .unwrap();
        let timeout = Duration::from_secs(5);
        let (got, msg) = run_here(&https(server.port), &target(), timeout).await;
        assert_eq!((got, msg.as_str()), (ProbeResult::Success, "HTTP 200"));
        server.set_healthy(false);
        let (got, msg) = run_here(&https(server.port), &target(), timeout).await;
        assert_eq!(got, ProbeResult::Failure);
        assert_eq!(msg, "HTTP probe failed with statuscode: 503");
        // A host name is sent as the server name; an IP address is not.
        let Handler::Http(mut named) = https(server.port) else {
            unreachable!()
        };
        named.host = Some("localhost".into());
        run_here(&Handler::Http(named), &target(), timeout).await;
        let seen = server.seen();
        assert_eq!(seen.len(), 3, "{seen:?}");
        assert_eq!(seen[0].sni, None);
        let head = seen[0].head.to_lowercase();
        assert!(head.starts_with("get /healthz http/1.1"), "{head}");
        assert!(
            head.contains(&format!("host: 127.0.0.1:{}", server.port)),
            "{head}"
        );
        assert!(head.contains("x-probe: yes"), "{head}");
        assert!(head.contains("user-agent: kube-probe/"), "{head}");
        assert_eq!(seen[2].sni.as_deref(), Some("localhost"));
        assert!(
            seen[2]
                .head
                .to_lowercase()
                .contains(&format!("host: localhost:{}", server.port))
        );
    }

    #[tokio::test]
    async fn https_to_a_server_without_tls_fails_the_handshake() {
        let (port, _server) = serve(200).await;
        let (got, msg) = run_here(&https(port), &target(), Duration::from_secs(5)).await;
        assert_eq!(got, ProbeResult::Failure);
        assert!(
            msg.starts_with(&format!(
                "Get \"https://127.0.0.1:{port}/healthz\": TLS handshake"
            )),
            "{msg}"
        );
    }

    #[tokio::test]
    async fn a_redirect_may_go_from_http_to_https_on_the_same_host() {
        let dir = tempfile::tempdir().unwrap();
        let tls = test_servers::HttpsServer::start("127.0.0.1", dir.path())
            .await
            .unwrap();
        tls.set_healthy(false);
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let location = format!("location: https://127.0.0.1:{}/secure\r\n", tls.port);
        let other = format!("location: https://localhost:{}/secure\r\n", tls.port);
        let server = tokio::spawn(async move {
            answer(&l, 301, &location).await;
            answer(&l, 301, &other).await;
        });
        let timeout = Duration::from_secs(5);
        let (got, msg) = http_get(&http(port), &target(), timeout).await;
        assert_eq!(
            got,
            ProbeResult::Failure,
            "followed to the failing HTTPS server: {msg}"
        );
        // To another host name: not followed, the 301 is the answer.
        let (got, msg) = http_get(&http(port), &target(), timeout).await;
        assert_eq!((got, msg.as_str()), (ProbeResult::Success, "HTTP 301"));
        server.await.unwrap();
        let seen = tls.seen();
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert!(seen[0].head.starts_with("GET /secure "), "{seen:?}");
    }

    fn grpc_probe(port: u16, service: &str) -> Handler {
        Handler::Grpc(Grpc {
            port,
            service: service.into(),
        })
    }

    #[tokio::test]
    async fn grpc_succeeds_only_while_serving() {
        let server = test_servers::GrpcServer::start("127.0.0.1", Some("app"))
            .await
            .unwrap();
        let t = target();
        let timeout = Duration::from_secs(5);
        for service in ["", "app"] {
            let (got, msg) = run_here(&grpc_probe(server.port, service), &t, timeout).await;
            assert_eq!(
                (got, msg.as_str()),
                (ProbeResult::Success, "service healthy")
            );
        }
        server.set_serving(false);
        let (got, msg) = run_here(&grpc_probe(server.port, "app"), &t, timeout).await;
        assert_eq!(got, ProbeResult::Failure);
        assert_eq!(msg, "service unhealthy (responded with \"NOT_SERVING\")");
        let (got, msg) = run_here(&grpc_probe(server.port, "other"), &t, timeout).await;
        assert_eq!(got, ProbeResult::Failure);
        assert_eq!(
            msg,
            "error: health rpc probe failed: rpc error: code = NotFound desc = unknown service"
        );
        server.set_serving(true);
        let (got, _) = run_here(&grpc_probe(server.port, "app"), &t, timeout).await;
        assert_eq!(got, ProbeResult::Success);
        let no_ip = Target::default();
        assert_eq!(
            run_here(&grpc_probe(server.port, ""), &no_ip, timeout)
                .await
                .0,
            ProbeResult::Unknown
        );
    }

    #[tokio::test]
    async fn grpc_without_the_health_service_says_so() {
        let server = test_servers::GrpcServer::start("127.0.0.1", None)
            .await
            .unwrap();
        let (got, msg) = grpc(
            &Grpc {
                port: server.port,
                service: String::new(),
            },
            &target(),
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(got, ProbeResult::Failure);
        assert!(
            msg.starts_with(
                "error: this server does not implement the grpc health protocol (grpc.health.v1.Health)"
            ),
            "{msg}"
        );
    }

    #[tokio::test]
    async fn grpc_connection_refused_and_timeout() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let g = Grpc {
            port,
            service: String::new(),
        };
        // Nobody answers on the accepted connection: the call's deadline passes.
        let started = std::time::Instant::now();
        let (got, msg) = grpc(&g, &target(), Duration::from_millis(300)).await;
        assert_eq!(got, ProbeResult::Failure);
        assert!(msg.starts_with("timeout: "), "{msg}");
        assert!(msg.contains("within 300ms"), "{msg}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the timeout bounds the probe"
        );
        drop(l);
        let (got, msg) = grpc(&g, &target(), Duration::from_secs(5)).await;
        assert_eq!(got, ProbeResult::Failure);
        assert!(
            msg.starts_with(&format!(
                "error: failed to connect service at \"127.0.0.1:{port}\": "
            )),
            "{msg}"
        );
        assert!(msg.to_lowercase().contains("refused"), "{msg}");
    }

    #[test]
    fn grpc_port_and_service_are_checked_and_defaulted() {
        let g = Grpc::parse(&GRPCAction {
            port: 9090,
            service: None,
        })
        .unwrap();
        assert_eq!((g.port, g.service.as_str()), (9090, ""));
        let bad = Grpc::parse(&GRPCAction {
            port: 0,
            service: None,
        });
        assert_eq!(bad, Err(Invalid::GrpcPort(0)));
        assert_eq!(
            Invalid::GrpcPort(0).to_string(),
            "grpc.port 0 is not between 1 and 65535"
        );
    }

    #[tokio::test]
    async fn tcp_connects_or_fails() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = IntOrString::Int(i32::from(l.local_addr().unwrap().port()));
        let t = target();
        let timeout = Duration::from_secs(5);
        assert_eq!(tcp(None, &port, &t, timeout).await.0, ProbeResult::Success);
        drop(l);
        let (got, msg) = tcp(Some("127.0.0.1"), &port, &t, timeout).await;
        assert_eq!(got, ProbeResult::Failure, "{msg}");
        let no_ip = Target::default();
        assert_eq!(
            tcp(None, &port, &no_ip, timeout).await.0,
            ProbeResult::Unknown
        );
    }
}
