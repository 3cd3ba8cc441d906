//! Servers for the tests of HTTPS and gRPC probes (unit tests here, integration tests through the
//! `test-servers` feature): an HTTPS server with a self-signed certificate made by `openssl` and
//! a gRPC health server, each answering with a health the test flips. Both run until dropped.
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use swiftlet_proto::health::health_check_response::ServingStatus;
use swiftlet_proto::health::health_server::{Health, HealthServer};
use swiftlet_proto::health::{HealthCheckRequest, HealthCheckResponse};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// Writes `cert.pem` and `key.pem` (a self-signed P-256 certificate for `localhost` and
/// 127.0.0.1) into `dir` with `openssl req -x509`.
pub fn self_signed_certificate(dir: &Path) -> Result<(), String> {
    self_signed_certificate_of(
        dir,
        "/CN=localhost",
        &["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
    )
}

/// Writes `cert.pem` and `key.pem` (a self-signed P-256 certificate of `subject`, e.g.
/// `/O=ops/CN=alice`, with `more` options of `openssl req`) into `dir`.
pub fn self_signed_certificate_of(dir: &Path, subject: &str, more: &[&str]) -> Result<(), String> {
    let out = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            subject,
        ])
        .args(more)
        .arg("-keyout")
        .arg(dir.join("key.pem"))
        .arg("-out")
        .arg(dir.join("cert.pem"))
        .output()
        .map_err(|e| format!("running openssl: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "openssl req failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

/// What an HTTPS server saw of one request.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The server name the client sent (SNI), if any.
    pub sni: Option<String>,
    /// The request line and headers.
    pub head: String,
}

/// An HTTPS server answering every GET with 200 while healthy, 503 otherwise.
pub struct HttpsServer {
    pub port: u16,
    healthy: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: JoinHandle<()>,
}

impl HttpsServer {
    /// Listens on `ip` (a free port), with the certificate made in `dir` by
    /// [`self_signed_certificate`]; healthy at first.
    pub async fn start(ip: &str, dir: &Path) -> Result<HttpsServer, String> {
        self_signed_certificate(dir)?;
        let cert = CertificateDer::from_pem_file(dir.join("cert.pem"))
            .map_err(|e| format!("cert.pem: {e}"))?;
        let key = PrivateKeyDer::from_pem_file(dir.join("key.pem"))
            .map_err(|e| format!("key.pem: {e}"))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_single_cert(vec![cert], key)
            .map_err(|e| format!("server certificate: {e}"))?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind((ip, 0))
            .await
            .map_err(|e| format!("bind {ip}: {e}"))?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let healthy = Arc::new(AtomicBool::new(true));
        let seen = Arc::<Mutex<Vec<Seen>>>::default();
        let (h, s) = (healthy.clone(), seen.clone());
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, h, s) = (acceptor.clone(), h.clone(), s.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let sni = tls.get_ref().1.server_name().map(str::to_owned);
                    let mut buf = vec![0; 4096];
                    let Ok(n) = tls.read(&mut buf).await else {
                        return;
                    };
                    let head = String::from_utf8_lossy(&buf[..n]).into_owned();
                    s.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(Seen { sni, head });
                    let status = if h.load(Ordering::SeqCst) {
                        "200 OK"
                    } else {
                        "503 Service Unavailable"
                    };
                    let reply = format!(
                        "HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                    );
                    let _ = tls.write_all(reply.as_bytes()).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        Ok(HttpsServer {
            port,
            healthy,
            seen,
            task,
        })
    }

    pub fn set_healthy(&self, healthy: bool) {
        self.healthy.store(healthy, Ordering::SeqCst);
    }

    /// The requests answered so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for HttpsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Answers `Check` for "" and `service` with SERVING or NOT_SERVING; other services are
/// NOT_FOUND, as the protocol asks.
#[derive(Clone)]
struct Checker {
    service: String,
    serving: Arc<AtomicBool>,
}

#[tonic::async_trait]
impl Health for Checker {
    async fn check(
        &self,
        request: tonic::Request<HealthCheckRequest>,
    ) -> Result<tonic::Response<HealthCheckResponse>, tonic::Status> {
        let asked = request.into_inner().service;
        if !asked.is_empty() && asked != self.service {
            return Err(tonic::Status::not_found("unknown service"));
        }
        let status = if self.serving.load(Ordering::SeqCst) {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        Ok(tonic::Response::new(HealthCheckResponse {
            status: status as i32,
        }))
    }
}

/// A plain-text gRPC server: with `Some(service)` the health service (serving at first), with
/// `None` no service at all (every call is UNIMPLEMENTED).
pub struct GrpcServer {
    pub port: u16,
    serving: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl GrpcServer {
    pub async fn start(ip: &str, service: Option<&str>) -> Result<GrpcServer, String> {
        let listener = TcpListener::bind((ip, 0))
            .await
            .map_err(|e| format!("bind {ip}: {e}"))?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let serving = Arc::new(AtomicBool::new(true));
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let mut builder = tonic::transport::Server::builder();
        let router = match service {
            Some(s) => builder.add_service(HealthServer::new(Checker {
                service: s.to_owned(),
                serving: serving.clone(),
            })),
            None => builder.add_routes(tonic::service::Routes::default()),
        };
        let task = tokio::spawn(async move {
            if let Err(e) = router.serve_with_incoming(incoming).await {
                tracing::error!(error = %e, "test gRPC server stopped");
            }
        });
        Ok(GrpcServer {
            port,
            serving,
            task,
        })
    }

    pub fn set_serving(&self, serving: bool) {
        self.serving.store(serving, Ordering::SeqCst);
    }
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
