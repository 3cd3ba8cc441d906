//! The actions probes and lifecycle hooks run against a container (the API's handlers): exec
//! (CRI `ExecSync`), an HTTP GET (HTTP/1.1 on fresh connections, no keep-alive, redirects
//! followed on the same host only), a TCP connect, and a pause (`sleep`). Each is given a timeout
//! and answers with a [`ProbeResult`] and a short message saying why.
use crate::cri::Cri;
use crate::pod::probe_results::ProbeResult;
use http_body_util::Empty;
use hyper::header::{HeaderName, HeaderValue};
use k8s_openapi::api::core::v1::{ContainerPort, HTTPGetAction};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::time::Duration;
use tokio::net::TcpStream;

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
    Grpc,
    /// A lifecycle hook's pause.
    Sleep(Duration),
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
    pub fn parse(h: &HTTPGetAction) -> Result<HttpGet, String> {
        check_port(&h.port)?;
        let scheme = h.scheme.clone().unwrap_or_else(|| "HTTP".into());
        if !matches!(scheme.as_str(), "HTTP" | "HTTPS") {
            return Err(format!(
                "httpGet.scheme must be HTTP or HTTPS (got {scheme:?})"
            ));
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

/// A port given by number (1 to 65535) or by a non-empty name.
pub fn check_port(p: &IntOrString) -> Result<(), String> {
    match p {
        IntOrString::Int(n) if !(1..=65535).contains(n) => {
            Err(format!("port {n} is not between 1 and 65535"))
        }
        IntOrString::String(s) if s.is_empty() => Err("port name is empty".into()),
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
        Handler::Grpc => (
            ProbeResult::Failure,
            "gRPC probes are not supported yet".into(),
        ),
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

/// The port number: a number, or the name of one of the container's ports.
pub fn resolve_port(port: &IntOrString, ports: &[ContainerPort]) -> Result<u16, String> {
    match port {
        IntOrString::Int(n) => u16::try_from(*n)
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| format!("invalid port {n}")),
        IntOrString::String(name) => ports
            .iter()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok())
            .ok_or_else(|| format!("the container has no port named {name:?}")),
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
    let port = resolve_port(port, &target.ports).map_err(|e| (ProbeResult::Unknown, e))?;
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
    if h.scheme != "HTTP" {
        return Err((
            ProbeResult::Failure,
            format!("{} probes are not supported yet", h.scheme),
        ));
    }
    let (host, port) = endpoint(h.host.as_deref(), &h.port, target)?;
    let authority = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let url = format!("http://{authority}{}", h.path);
    match tokio::time::timeout(timeout, follow(&host, port, &authority, h)).await {
        Ok(Ok(status)) => Ok(status),
        Ok(Err(e)) => Err((ProbeResult::Failure, format!("Get {url:?}: {e}"))),
        Err(_) => Err((
            ProbeResult::Failure,
            format!("Get {url:?}: no answer within {timeout:?}"),
        )),
    }
}

/// The path a redirect to `location` leads to when it stays on `authority`; `None` when it
/// leaves the host.
fn same_host_path(location: &str, authority: &str, current: &str) -> Option<String> {
    if location.starts_with('/') && !location.starts_with("//") {
        return Some(location.to_owned());
    }
    if location.contains("://") || location.starts_with("//") {
        let uri = location.parse::<hyper::Uri>().ok()?;
        let a = uri.authority()?;
        let port = a.port_u16().unwrap_or(80);
        let same = uri.scheme_str() == Some("http")
            && format!("{}:{port}", a.host()) == authority.replace(['[', ']'], "");
        return same.then(|| uri.path_and_query().map_or("/", |p| p.as_str()).to_owned());
    }
    // Relative to the current path's directory.
    let dir = current.rsplit_once('/').map_or("", |(d, _)| d);
    Some(format!("{dir}/{location}"))
}

/// GETs, following redirects that stay on the same host (at most [`MAX_REDIRECTS`]). A redirect
/// to another host is not followed: its 3xx status is the answer (the kubelet counts it as a
/// success with a warning).
async fn follow(host: &str, port: u16, authority: &str, h: &HttpGet) -> Result<u16, String> {
    let mut path = h.path.clone();
    for _ in 0..=MAX_REDIRECTS {
        let (status, location) = get(host, port, authority, &path, h).await?;
        let next = location
            .filter(|_| (300..400).contains(&status))
            .and_then(|l| same_host_path(&l, authority, &path));
        match next {
            Some(p) => path = p,
            None => return Ok(status),
        }
    }
    Err(format!("stopped after {MAX_REDIRECTS} redirects"))
}

/// One GET of `path` on a new connection: the response status and its Location header.
async fn get(
    host: &str,
    port: u16,
    authority: &str,
    path: &str,
    h: &HttpGet,
) -> Result<(u16, Option<String>), String> {
    let stream = TcpStream::connect((host, port))
        .await
        .map_err(|e| format!("dial tcp: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake::<_, Empty<bytes::Bytes>>(
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .map_err(|e| e.to_string())?;
    let conn = tokio::spawn(conn);
    let mut req = hyper::Request::get(path)
        .header(hyper::header::HOST, authority)
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
        let auth = "127.0.0.1:8080";
        assert_eq!(same_host_path("http://10.0.0.9/x", auth, "/a"), None);
        assert_eq!(
            same_host_path("http://127.0.0.1:8080/x?y", auth, "/a").as_deref(),
            Some("/x?y")
        );
        assert_eq!(same_host_path("b", auth, "/a/c").as_deref(), Some("/a/b"));
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

    #[tokio::test]
    async fn https_is_a_clear_failure() {
        let mut h = http(1);
        h.scheme = "HTTPS".into();
        let (got, msg) = http_get(&h, &target(), Duration::from_secs(1)).await;
        assert_eq!(got, ProbeResult::Failure);
        assert_eq!(msg, "HTTPS probes are not supported yet");
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
