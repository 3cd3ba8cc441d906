//! Proxying exec, attach and port-forward to the runtime's streaming server, as the kubelet does:
//! the client's upgrade request (SPDY or WebSocket, whichever it speaks) is replayed to the URL
//! the runtime's `Exec`, `Attach` or `PortForward` returned, and once the runtime switches
//! protocols the two connections are joined byte for byte. swiftlet never decodes the stream.
//! A joined stream that passes no byte either way for `--streaming-connection-idle-timeout` is
//! closed (both connections dropped), as the kubelet closes an idle stream.
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, Request, Response, StatusCode, header};
use hyper_util::rt::TokioIo;

/// A plain-text answer.
pub fn text(status: StatusCode, body: impl Into<String>) -> Response<Body> {
    let mut r = Response::new(Body::from(body.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Whether the request asks to switch protocols (`Connection: Upgrade` and an `Upgrade`).
pub fn is_upgrade(req: &Request<Body>) -> bool {
    let connection_upgrade = req
        .headers()
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    connection_upgrade && req.headers().contains_key(header::UPGRADE)
}

/// Replays `req` to the runtime's streaming `url` and joins the connections when it upgrades;
/// any other answer of the runtime is passed back as it came. The joined stream is closed once
/// no byte has passed either way for `idle` (when given).
pub async fn proxy(mut req: Request<Body>, url: &str, idle: Option<Duration>) -> Response<Body> {
    if !is_upgrade(&req) {
        return text(
            StatusCode::BAD_REQUEST,
            "this endpoint streams: send an upgrade request (SPDY/3.1 or WebSocket)\n",
        );
    }
    let Some(client_upgrade) = req.extensions_mut().remove::<hyper::upgrade::OnUpgrade>() else {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "this connection cannot be upgraded\n",
        );
    };
    let backend = match backend_request(&req, url) {
        Ok(b) => b,
        Err(why) => return text(StatusCode::BAD_GATEWAY, why),
    };
    let (addr, outgoing) = backend;
    let stream = match tokio::net::TcpStream::connect(&addr).await {
        Ok(s) => s,
        Err(e) => {
            return text(
                StatusCode::BAD_GATEWAY,
                format!("connecting to the runtime's streaming server {addr}: {e}\n"),
            );
        }
    };
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    {
        Ok(pair) => pair,
        Err(e) => {
            return text(
                StatusCode::BAD_GATEWAY,
                format!("the runtime's streaming server {addr}: {e}\n"),
            );
        }
    };
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(%e, "streaming connection to the runtime");
        }
    });
    let mut answer = match sender.send_request(outgoing).await {
        Ok(a) => a,
        Err(e) => {
            return text(
                StatusCode::BAD_GATEWAY,
                format!("the runtime's streaming server {addr}: {e}\n"),
            );
        }
    };
    if answer.status() != StatusCode::SWITCHING_PROTOCOLS {
        let (parts, body) = answer.into_parts();
        return Response::from_parts(parts, Body::new(body));
    }
    let backend_upgrade = hyper::upgrade::on(&mut answer);
    tokio::spawn(async move {
        let (client, backend) = match tokio::try_join!(client_upgrade, backend_upgrade) {
            Ok(pair) => pair,
            Err(e) => {
                tracing::debug!(%e, "stream upgrade");
                return;
            }
        };
        match join(TokioIo::new(client), TokioIo::new(backend), idle).await {
            Ok(Some((up, down))) => tracing::debug!(up, down, "stream closed"),
            Ok(None) => tracing::info!(
                idle = ?idle.unwrap_or_default(),
                "stream closed: no byte passed either way for --streaming-connection-idle-timeout"
            ),
            Err(e) => tracing::debug!(%e, "stream ended"),
        }
    });
    let mut reply = Response::new(Body::empty());
    *reply.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    *reply.headers_mut() = answer.headers().clone();
    reply
}

/// Copies bytes both ways between `client` and `backend` until either ends (the bytes sent up
/// and down), or, with `idle`, until no byte has passed either way for that long (`None`); both
/// connections are dropped, so closed, when it returns.
async fn join<C, B>(
    mut client: C,
    mut backend: B,
    idle: Option<Duration>,
) -> std::io::Result<Option<(u64, u64)>>
where
    C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    B: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let Some(limit) = idle else {
        return tokio::io::copy_bidirectional(&mut client, &mut backend)
            .await
            .map(Some);
    };
    let start = tokio::time::Instant::now();
    let last = Arc::new(AtomicU64::new(0));
    let mut client = Watched {
        inner: client,
        start,
        last: last.clone(),
    };
    let copy = tokio::io::copy_bidirectional(&mut client, &mut backend);
    tokio::pin!(copy);
    loop {
        let quiet_since = start + Duration::from_millis(last.load(Ordering::Relaxed));
        let deadline = quiet_since + limit;
        if tokio::time::Instant::now() >= deadline {
            return Ok(None);
        }
        tokio::select! {
            done = &mut copy => return done.map(Some),
            () = tokio::time::sleep_until(deadline) => {}
        }
    }
}

/// One side of a joined stream, noting when a byte last passed through it (in either
/// direction: what is read from it goes one way, what is written to it the other).
struct Watched<S> {
    inner: S,
    start: tokio::time::Instant,
    /// Milliseconds from `start` to the last byte.
    last: Arc<AtomicU64>,
}

impl<S> Watched<S> {
    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(ms, Ordering::Relaxed);
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.touch();
        }
        polled
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The runtime's `host:port` and the request to send it: the client's method and headers (its
/// credentials left out) for the URL's path.
fn backend_request(
    req: &Request<Body>,
    url: &str,
) -> Result<(String, Request<http_body_util::Empty<bytes::Bytes>>), String> {
    let uri: axum::http::Uri = url
        .parse()
        .map_err(|e| format!("the runtime's streaming URL {url:?}: {e}\n"))?;
    if uri.scheme_str() != Some("http") {
        return Err(format!(
            "the runtime's streaming URL {url:?} is not http:// (TLS streaming is not supported)\n"
        ));
    }
    let authority = uri
        .authority()
        .ok_or_else(|| format!("the runtime's streaming URL {url:?} has no host\n"))?
        .clone();
    if !crate::config::http::loopback_ip(authority.host()) {
        return Err(format!(
            "the runtime's streaming URL {url:?} is not a loopback address: swiftlet proxies \
             streams only to a runtime listening on this node's loopback\n"
        ));
    }
    let port = authority.port_u16().unwrap_or(80);
    let addr = format!("{}:{port}", authority.host());
    let path = uri
        .path_and_query()
        .map_or("/", axum::http::uri::PathAndQuery::as_str);
    let mut out = Request::builder()
        .method(req.method().clone())
        .uri(path)
        .body(http_body_util::Empty::new())
        .map_err(|e| format!("building the request to the runtime: {e}\n"))?;
    for (name, value) in req.headers() {
        if name == header::HOST || name == header::AUTHORIZATION || name == header::CONTENT_LENGTH {
            continue;
        }
        out.headers_mut().append(name.clone(), value.clone());
    }
    let host = HeaderValue::from_str(authority.as_str())
        .map_err(|e| format!("the runtime's streaming URL {url:?}: {e}\n"))?;
    out.headers_mut().insert(header::HOST, host);
    Ok((addr, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtime_gets_the_clients_upgrade_headers_without_its_credentials() {
        let req = Request::builder()
            .method("POST")
            .uri("/exec/ns/pod/c?command=ls")
            .header(header::HOST, "node:10250")
            .header(header::AUTHORIZATION, "Bearer secret")
            .header(header::CONNECTION, "Upgrade")
            .header(header::UPGRADE, "SPDY/3.1")
            .header("X-Stream-Protocol-Version", "v4.channel.k8s.io")
            .body(Body::empty())
            .unwrap();
        assert!(is_upgrade(&req));
        let (addr, out) = backend_request(&req, "http://127.0.0.1:4321/exec/TOKEN").unwrap();
        assert_eq!(addr, "127.0.0.1:4321");
        assert_eq!(out.method(), "POST");
        assert_eq!(out.uri(), "/exec/TOKEN");
        assert_eq!(out.headers()[header::HOST], "127.0.0.1:4321");
        assert_eq!(out.headers()[header::UPGRADE], "SPDY/3.1");
        assert_eq!(
            out.headers()["X-Stream-Protocol-Version"],
            "v4.channel.k8s.io"
        );
        assert!(!out.headers().contains_key(header::AUTHORIZATION));
        assert!(backend_request(&req, "https://127.0.0.1:1/x").is_err());
        let (addr, _) = backend_request(&req, "http://[::1]:4321/exec/T").unwrap();
        assert_eq!(addr, "[::1]:4321");
        for away in [
            "http://10.0.0.5:4321/exec/T",
            "http://runtime.example:4321/exec/T",
            "http://localhost.example/exec/T",
        ] {
            let e = backend_request(&req, away).unwrap_err();
            assert!(e.contains("not a loopback address"), "{away}: {e}");
        }
        assert!(backend_request(&req, "not a url").is_err());
        let plain = Request::builder().uri("/").body(Body::empty()).unwrap();
        assert!(!is_upgrade(&plain));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_is_closed_after_its_idle_time_and_not_while_bytes_pass() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let limit = Duration::from_secs(10);
        let (client, mut user) = tokio::io::duplex(64);
        let (backend, mut runtime) = tokio::io::duplex(64);
        let start = tokio::time::Instant::now();
        let joined = tokio::spawn(join(client, backend, Some(limit)));
        // Six seconds between bytes, each way in turn, for 36 s: past the limit, never idle
        // for it.
        let mut byte = [0u8; 1];
        for round in 0..6u8 {
            tokio::time::sleep(Duration::from_secs(6)).await;
            if round % 2 == 0 {
                runtime.write_all(&[round]).await.unwrap();
                user.read_exact(&mut byte).await.unwrap();
            } else {
                user.write_all(&[round]).await.unwrap();
                runtime.read_exact(&mut byte).await.unwrap();
            }
            assert_eq!(byte[0], round);
            assert!(!joined.is_finished(), "closed after round {round}");
        }
        let last = tokio::time::Instant::now();
        let closed = tokio::time::timeout(limit * 3, joined)
            .await
            .expect("the idle stream is closed");
        assert_eq!(closed.unwrap().unwrap(), None, "closed as idle");
        let quiet = last.elapsed();
        assert!(
            quiet >= limit && quiet < limit + Duration::from_secs(1),
            "{quiet:?}"
        );
        assert!(start.elapsed() > Duration::from_secs(36));
        // Both connections are closed.
        assert_eq!(user.read(&mut byte).await.unwrap(), 0);
        assert_eq!(runtime.read(&mut byte).await.unwrap(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn without_an_idle_limit_a_stream_ends_only_with_a_side() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let (client, mut user) = tokio::io::duplex(64);
        let (backend, mut runtime) = tokio::io::duplex(64);
        let joined = tokio::spawn(join(client, backend, None));
        tokio::time::sleep(Duration::from_secs(24 * 3600)).await;
        assert!(!joined.is_finished());
        user.write_all(b"ab").await.unwrap();
        drop(user);
        let mut got = Vec::new();
        runtime.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"ab");
        drop(runtime);
        assert_eq!(joined.await.unwrap().unwrap(), Some((2, 0)));
    }
}
