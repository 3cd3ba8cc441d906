//! A client of the kubelet API of the tests' own (TLS with and without a client certificate,
//! HTTP/1.1 and WebSocket over it), and the certificates and flags of an agent serving it: used
//! by the kubelet API tests and the `security` scenario of the reliability suite.
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use http_body_util::BodyExt as _;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;

use crate::AgentOptions;
use crate::certs::{Usage, make_ca, make_leaf};

/// A TLS client trusting `dir/ca.pem`, presenting `dir/<cert>.pem` when given.
pub fn client(dir: &Path, cert: Option<&str>) -> tokio_rustls::TlsConnector {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = |name: &str| -> Vec<CertificateDer<'static>> {
        CertificateDer::pem_file_iter(dir.join(format!("{name}.pem")))
            .and_then(Iterator::collect)
            .expect("reading a test certificate")
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in certs("ca") {
        roots.add(c).expect("the test CA is a CA certificate");
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots);
    let config = match cert {
        Some(name) => {
            let key = PrivateKeyDer::from_pem_file(dir.join(format!("{name}.key")))
                .expect("reading a test key");
            builder
                .with_client_auth_cert(certs(name), key)
                .expect("a client certificate and its key")
        }
        None => builder.with_no_client_auth(),
    };
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// A TLS connection to the kubelet API.
pub type Tls = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

/// A TLS connection to `addr` (its IP address the server name).
pub async fn connect(tls: &tokio_rustls::TlsConnector, addr: SocketAddr) -> Result<Tls, String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connecting: {e}"))?;
    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
    tls.connect(name, tcp)
        .await
        .map_err(|e| format!("TLS handshake: {e}"))
}

/// One request over a new connection: the status and the whole body.
pub async fn request(
    tls: &tokio_rustls::TlsConnector,
    addr: SocketAddr,
    method: &str,
    path: &str,
) -> Result<(u16, String), String> {
    request_as(tls, addr, method, path, None).await
}

/// [`request`] with `Authorization: Bearer <token>` when a token is given.
pub async fn request_as(
    tls: &tokio_rustls::TlsConnector,
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> Result<(u16, String), String> {
    let stream = connect(tls, addr).await?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| format!("HTTP handshake: {e}"))?;
    tokio::spawn(conn);
    let req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string());
    let req = match token {
        Some(t) => req.header("authorization", format!("Bearer {t}")),
        None => req,
    };
    let req = req
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .map_err(|e| e.to_string())?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| format!("request: {e}"))?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("reading the body: {e}"))?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// A WebSocket (`v4.channel.k8s.io`) to `path` over a new TLS connection.
pub async fn websocket(
    tls: &tokio_rustls::TlsConnector,
    addr: SocketAddr,
    path: &str,
) -> Result<tokio_tungstenite::WebSocketStream<Tls>, String> {
    let stream = connect(tls, addr).await?;
    let mut req = format!("wss://{addr}{path}")
        .into_client_request()
        .map_err(|e| e.to_string())?;
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        "v4.channel.k8s.io".parse().map_err(|_| "header")?,
    );
    let (ws, _) = tokio_tungstenite::client_async(req, stream)
        .await
        .map_err(|e| format!("WebSocket handshake: {e}"))?;
    Ok(ws)
}

/// A current-thread tokio runtime for a test's client side.
pub fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Certificates in `d` (the CA `ca`, the server's for 127.0.0.1, a client certificate for
/// `alice` in group `ops`) and options for an agent serving the kubelet API with them on a free
/// port (also returned).
pub fn kubelet_api_options(d: &Path, name: &str) -> (AgentOptions, u16) {
    make_ca(d, "ca", "/CN=swiftlet test CA").expect("a test CA");
    make_leaf(d, "ca", "server", "/CN=127.0.0.1", Usage::Server).expect("a server certificate");
    make_leaf(d, "ca", "alice", "/O=ops/CN=alice", Usage::Client).expect("a client certificate");
    let port = xtask::free_loopback_port().expect("a free port");
    let mut opts = AgentOptions::new(name);
    opts.kubelet_port = Some(port);
    for (flag, file) in [
        ("--tls-cert-file", "server.pem"),
        ("--tls-private-key-file", "server.key"),
        ("--client-ca-file", "ca.pem"),
    ] {
        opts.extra_args.push(flag.into());
        opts.extra_args.push(d.join(file).display().to_string());
    }
    (opts, port)
}
