//! The HTTP pod source (`--manifest-url`): fetches one URL every `check_frequency` and sends the
//! mux a SET of the pods it serves.
//!
//! Behaviour (kubelet `config/http.go`, with the differences noted):
//! - The body is one Pod or a PodList, YAML or JSON, at most 10 MiB, one pod at most 3 MiB
//!   ([`manifest::MAX_POD_BYTES`]); pods get the static-pod defaults, with a UID derived from the
//!   content and the URL when `metadata.uid` is not set.
//! - A body identical to the last one fetched sends nothing.
//! - An empty body sends an empty SET (so the source becomes seen) and is counted as an error.
//! - A failed fetch (connection, timeout, non-2xx status, oversized body) or a body that is not a
//!   Pod or PodList keeps the last good set: nothing is sent, the failure is logged with the URL
//!   and counted. Until the first good fetch the source is not seen, as in the kubelet.
//! - Unlike the kubelet, which rejects a whole PodList when one item is invalid, swiftlet rejects
//!   only that item (logged as `<url> items[i]`, counted) and keeps the others; a later item with
//!   a full name an earlier one already has is rejected the same way.
//! - The pods of one PodList are held to [`manifest::MAX_LIST_HELD`] of memory: the items past
//!   it are read past, not decoded, and rejected as one error (logged and counted once).
//! - The source keeps no pods, only the digest of the last body: the mux keeps the one copy of
//!   each pod (the pods of a SET are handed over, not shared), and an unchanged pod in a new SET
//!   merges by its fingerprints and is dropped.
//!
//! `https://` URLs are verified against the system's root certificates, or only against the
//! CA certificates of `--manifest-url-ca-file` when it is given. A plain `http://` URL to a host
//! other than the loopback is fetched with a warning at start: anyone on the path could inject
//! privileged static pods and read the `--manifest-url-header` values.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty};
use hyper::header::{HeaderName, HeaderValue};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::manifest::{self, MAX_CONFIG_LENGTH};
use super::{ErrorCounter, SourceUpdate};

/// The kubelet's default `--http-check-frequency`.
pub const DEFAULT_CHECK_FREQUENCY: Duration = Duration::from_secs(20);
/// How long one fetch may take, like the kubelet's HTTP client timeout.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// Configuration of the HTTP source.
#[derive(Debug, Clone)]
pub struct Config {
    /// The manifest URL (`http://` or `https://`).
    pub url: String,
    /// `--manifest-url-ca-file`: the CA certificates (PEM) an `https://` server's certificate
    /// must chain to, instead of the system's roots.
    pub ca_file: Option<PathBuf>,
    /// Extra request headers, in order (`--manifest-url-header`).
    pub headers: Vec<(String, String)>,
    /// The node name pods are bound to (also part of their names).
    pub node_name: String,
    /// Fetch period (kubelet default 20 s).
    pub check_frequency: Duration,
}

/// Why a fetch failed. Every variant names the URL.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{url}: invalid URL: {source}")]
    Url {
        url: String,
        #[source]
        source: hyper::http::uri::InvalidUri,
    },
    #[error("{url}: only http:// and https:// manifest URLs are supported")]
    Scheme { url: String },
    #[error("{url}: no TLS client: {message}")]
    Tls { url: String, message: String },
    #[error("{url}: invalid header {name:?}")]
    Header { url: String, name: String },
    #[error("{url}: building the request: {source}")]
    Request {
        url: String,
        #[source]
        source: hyper::http::Error,
    },
    #[error("{url}: fetch failed: {source}")]
    Fetch {
        url: String,
        #[source]
        source: hyper_util::client::legacy::Error,
    },
    #[error("{url}: no answer within {timeout:?}")]
    Timeout { url: String, timeout: Duration },
    #[error("{url}: server answered {status}")]
    Status {
        url: String,
        status: hyper::StatusCode,
    },
    #[error("{url}: reading the body: {message}")]
    Body { url: String, message: String },
    #[error("{url}: body is over the {max} byte limit")]
    TooLarge { url: String, max: u64 },
}

impl Error {
    /// The `reason` label of `swiftlet_config_errors_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::TooLarge { .. } => "too_large",
            Error::Url { .. } | Error::Scheme { .. } | Error::Header { .. } | Error::Tls { .. } => {
                "bad_url"
            }
            Error::Request { .. }
            | Error::Fetch { .. }
            | Error::Timeout { .. }
            | Error::Status { .. }
            | Error::Body { .. } => "fetch",
        }
    }
}

/// The `reason` label of an empty body.
pub const EMPTY_BODY: &str = "empty";

type HttpClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Empty<Bytes>>;

/// The client of every fetch: `http://` as is, `https://` verified against `ca_file`'s
/// certificates or, without one, the system's roots. HTTP/1.1 only.
fn client(ca_file: Option<&std::path::Path>) -> Result<HttpClient, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = hyper_rustls::HttpsConnectorBuilder::new();
    let builder = match ca_file {
        None => builder
            .with_provider_and_native_roots(provider)
            .map_err(|e| format!("the system's root certificates: {e}"))?,
        Some(path) => {
            use rustls::pki_types::{CertificateDer, pem::PemObject};
            let about = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
            let pem = std::fs::read(path).map_err(|e| about(&e))?;
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(&pem) {
                roots
                    .add(cert.map_err(|e| about(&e))?)
                    .map_err(|e| about(&e))?;
            }
            if roots.is_empty() {
                return Err(about(&"no CA certificate in the file"));
            }
            let tls = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .with_root_certificates(roots)
                .with_no_client_auth();
            builder.with_tls_config(tls)
        }
    };
    let https = builder.https_or_http().enable_http1().build();
    Ok(Client::builder(TokioExecutor::new()).build(https))
}

/// `url` is plain `http://` to a host other than the loopback (`localhost`, 127.0.0.0/8, ::1).
fn plain_to_remote(url: &str) -> bool {
    let Ok(uri) = url.parse::<hyper::Uri>() else {
        return false;
    };
    let host = uri.host().unwrap_or_default();
    let loopback = host.eq_ignore_ascii_case("localhost") || loopback_ip(host);
    uri.scheme_str() == Some("http") && !loopback
}

/// A URL's host is a loopback IP address (127.0.0.0/8, or `::1` in brackets or not); a name,
/// even `localhost`, is not (it resolves as the resolver says).
pub fn loopback_ip(host: &str) -> bool {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback())
}

/// Runs the HTTP source until `cancel` fires or the mux's receiver is gone.
pub async fn watch(
    cfg: Config,
    tx: mpsc::Sender<SourceUpdate>,
    errors: ErrorCounter,
    cancel: CancellationToken,
) {
    if plain_to_remote(&cfg.url) {
        tracing::warn!(
            url = %cfg.url,
            "--manifest-url is plain http:// to another host: anyone on the path can inject \
             privileged static pods and read the --manifest-url-header values; use https://"
        );
    }
    let client = client(cfg.ca_file.as_deref());
    let mut tick = tokio::time::interval(cfg.check_frequency.max(Duration::from_millis(1)));
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut source = Source {
        cfg,
        errors,
        last_body: None,
        last_fetch_error: None,
    };
    loop {
        tokio::select! {
            biased;
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let fetched = tokio::select! {
            biased;
            _ = cancel.cancelled() => return,
            fetched = async {
                match &client {
                    Ok(client) => fetch(client, &source.cfg).await,
                    Err(message) => Err(Error::Tls { url: source.cfg.url.clone(), message: message.clone() }),
                }
            } => fetched,
        };
        // Parsing a body of up to 10 MiB (YAML, many pods) blocks: a blocking thread does it and
        // hands the source back with what to send.
        let Some((back, update)) =
            super::off_thread(source, "http", move |source| source.ingest(fetched)).await
        else {
            return;
        };
        source = back;
        let Some(update) = update else {
            continue;
        };
        if !super::send(&tx, update, &cancel).await {
            return;
        }
    }
}

/// One GET of the manifest URL, with the configured headers, a timeout and the size limit.
async fn fetch(client: &HttpClient, cfg: &Config) -> Result<Bytes, Error> {
    let url = || cfg.url.clone();
    let uri: hyper::Uri = cfg
        .url
        .parse()
        .map_err(|source| Error::Url { url: url(), source })?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(Error::Scheme { url: url() });
    }
    let mut req = hyper::Request::get(uri);
    for (name, value) in &cfg.headers {
        let bad = || Error::Header {
            url: url(),
            name: name.clone(),
        };
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| bad())?;
        let value = HeaderValue::from_str(value).map_err(|_| bad())?;
        req = req.header(name, value);
    }
    let req = req
        .body(Empty::new())
        .map_err(|source| Error::Request { url: url(), source })?;
    let fetch = async {
        let resp = client
            .request(req)
            .await
            .map_err(|source| Error::Fetch { url: url(), source })?;
        if !resp.status().is_success() {
            return Err(Error::Status {
                url: url(),
                status: resp.status(),
            });
        }
        read_body(resp.into_body(), MAX_CONFIG_LENGTH)
            .await
            .map_err(|e| e.at(url()))
    };
    tokio::time::timeout(FETCH_TIMEOUT, fetch)
        .await
        .unwrap_or_else(|_| {
            Err(Error::Timeout {
                url: url(),
                timeout: FETCH_TIMEOUT,
            })
        })
}

/// Why reading a body failed, before the URL is known to name it.
#[derive(Debug)]
enum BodyError {
    TooLarge { max: u64 },
    Read(String),
}

impl BodyError {
    fn at(self, url: String) -> Error {
        match self {
            BodyError::TooLarge { max } => Error::TooLarge { url, max },
            BodyError::Read(message) => Error::Body { url, message },
        }
    }
}

/// Reads `body` into one buffer of at most `max` bytes. A declared length over `max` fails before
/// a byte is read; a body that runs past `max` (no length, or a wrong one) fails as soon as it
/// does. Each frame is copied into the buffer and dropped, so the body costs at most `max` bytes
/// and one frame, never a list of frames and a copy of them.
async fn read_body<B>(body: B, max: u64) -> Result<Bytes, BodyError>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let too_large = || BodyError::TooLarge { max };
    let cap = usize::try_from(max).unwrap_or(usize::MAX);
    let declared = body.size_hint().exact();
    if declared.is_some_and(|n| n > max) {
        return Err(too_large());
    }
    // A declared length sizes the buffer once; else it grows by doubling, capped at `max`.
    let first = declared.map_or(64 * 1024, |n| usize::try_from(n).unwrap_or(cap));
    let mut buf: Vec<u8> = Vec::with_capacity(first.min(cap));
    let mut body = body;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| BodyError::Read(e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        let len = buf.len().saturating_add(data.len());
        if len > cap {
            return Err(too_large());
        }
        if len > buf.capacity() {
            let grown = buf.capacity().saturating_mul(2).max(len).min(cap);
            buf.reserve_exact(grown - buf.len());
        }
        buf.extend_from_slice(&data);
    }
    Ok(Bytes::from(buf))
}

struct Source {
    cfg: Config,
    errors: ErrorCounter,
    /// SHA-256 of the last body fetched (good or bad), so an unchanged body is not re-parsed.
    last_body: Option<[u8; 32]>,
    /// The last fetch error logged, so a failing URL is logged when the failure changes.
    last_fetch_error: Option<String>,
}

impl Source {
    /// Turns one fetch into the SET to send, if any.
    fn ingest(&mut self, fetched: Result<Bytes, Error>) -> Option<SourceUpdate> {
        let url = self.cfg.url.as_str();
        let body = match fetched {
            Ok(body) => {
                if self.last_fetch_error.take().is_some() {
                    tracing::info!(url, "manifest URL answers again");
                }
                body
            }
            Err(e) => {
                let msg = e.to_string();
                if self.last_fetch_error.as_ref() != Some(&msg) {
                    tracing::warn!(url, reason = %msg, "fetching pod manifests failed; keeping the last good set");
                } else {
                    tracing::debug!(url, reason = %msg, "fetching pod manifests failed again");
                }
                self.errors.inc(e.reason());
                self.last_fetch_error = Some(msg);
                return None;
            }
        };
        let digest: [u8; 32] = Sha256::digest(&body).into();
        if self.last_body == Some(digest) {
            return None;
        }
        self.last_body = Some(digest);
        if body.is_empty() {
            tracing::warn!(url, "manifest URL served an empty body; no pods from it");
            self.errors.inc(EMPTY_BODY);
            return Some(SourceUpdate::Set(Vec::new()));
        }
        let items = match manifest::parse_url(url, &body, &self.cfg.node_name) {
            Ok(items) => items,
            Err(e) => {
                tracing::warn!(url, reason = %e, "rejected pod manifests from URL; keeping the last good set");
                self.errors.inc(e.reason());
                return None;
            }
        };
        let mut names = HashSet::new();
        let mut set = Vec::with_capacity(items.len());
        for (i, item) in items.into_iter().enumerate() {
            let pod = match item {
                Ok(pod) => pod,
                Err(e) => {
                    tracing::warn!(url, reason = %e, "rejected pod manifest from URL");
                    self.errors.inc(e.reason());
                    continue;
                }
            };
            let full = (
                pod.metadata().namespace.clone().unwrap_or_default(),
                pod.metadata().name.clone().unwrap_or_default(),
            );
            if !names.insert(full.clone()) {
                tracing::warn!(url, item = i, pod = %format!("{}/{}", full.0, full.1), "rejected pod manifest from URL: duplicate pod name");
                self.errors.inc(super::file::DUPLICATE_NAME);
                continue;
            }
            set.push(pod);
        }
        Some(SourceUpdate::Set(set))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::StoredPod;
    use std::sync::{Arc, Mutex};

    const NODE: &str = "node1";
    const WAIT: Duration = Duration::from_secs(5);

    use crate::config::test_manifest as pod_yaml;

    fn list_json(items: &[(&str, &str)]) -> String {
        let items: Vec<String> = items
            .iter()
            .map(|(name, image)| {
                format!(
                    r#"{{"metadata": {{"name": "{name}"}}, "spec": {{"containers": [{{"name": "c", "image": "{image}"}}]}}}}"#
                )
            })
            .collect();
        format!(
            r#"{{"kind": "PodList", "apiVersion": "v1", "items": [{}]}}"#,
            items.join(",")
        )
    }

    /// What the loopback server answers, and the headers it saw.
    #[derive(Default)]
    struct Served {
        status: u16,
        body: String,
        headers: Vec<(String, String)>,
        requests: usize,
    }

    /// A loopback HTTP server answering every GET with the current `Served`.
    async fn server(served: Arc<Mutex<Served>>) -> (String, CancellationToken) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        serve_on(listener, "http", served)
    }

    /// A TCP listener whose connections are TLS with one certificate; a failed handshake is
    /// dropped and the next connection taken.
    struct TlsListener {
        tcp: tokio::net::TcpListener,
        tls: tokio_rustls::TlsAcceptor,
    }

    impl axum::serve::Listener for TlsListener {
        type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
        type Addr = std::net::SocketAddr;

        async fn accept(&mut self) -> (Self::Io, Self::Addr) {
            loop {
                let Ok((tcp, addr)) = self.tcp.accept().await else {
                    continue;
                };
                if let Ok(tls) = self.tls.accept(tcp).await {
                    return (tls, addr);
                }
            }
        }

        fn local_addr(&self) -> std::io::Result<Self::Addr> {
            self.tcp.local_addr()
        }
    }

    /// `served` over HTTPS on the loopback, with a certificate for 127.0.0.1 signed by a CA
    /// made here; the CA's certificate is written to `ca_pem`.
    async fn https_server(
        served: Arc<Mutex<Served>>,
        ca_pem: &std::path::Path,
    ) -> (String, CancellationToken) {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = ca.self_signed(&ca_key).expect("CA");
        std::fs::write(ca_pem, ca.pem()).expect("write the CA");
        let key = KeyPair::generate().expect("key");
        let cert = CertificateParams::new(vec!["127.0.0.1".to_owned()])
            .expect("params")
            .signed_by(&key, &ca, &ca_key)
            .expect("certificate");
        let der = rustls::pki_types::PrivatePkcs8KeyDer::from(key.serialize_der());
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], der.into())
        .expect("server config");
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let tls = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        serve_on(TlsListener { tcp, tls }, "https", served)
    }

    /// Serves `served` at `/pods` on `listener` until the token is cancelled.
    fn serve_on<L: axum::serve::Listener<Addr = std::net::SocketAddr>>(
        listener: L,
        scheme: &str,
        served: Arc<Mutex<Served>>,
    ) -> (String, CancellationToken) {
        use axum::http::{HeaderMap, StatusCode};
        let addr = listener.local_addr().expect("local addr");
        let app = axum::Router::new().route(
            "/pods",
            axum::routing::get(move |headers: HeaderMap| {
                let served = served.clone();
                async move {
                    let mut s = served.lock().expect("lock");
                    s.requests += 1;
                    for (k, v) in &headers {
                        s.headers
                            .push((k.to_string(), v.to_str().unwrap_or_default().to_owned()));
                    }
                    let status = StatusCode::from_u16(s.status).expect("status");
                    (status, s.body.clone())
                }
            }),
        );
        let stop = CancellationToken::new();
        let done = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(done.cancelled_owned())
                .await;
        });
        (format!("{scheme}://{addr}/pods"), stop)
    }

    struct Harness {
        rx: mpsc::Receiver<SourceUpdate>,
        served: Arc<Mutex<Served>>,
        errors: ErrorCounter,
        cancel: CancellationToken,
        stop_server: CancellationToken,
    }

    impl Harness {
        async fn start(status: u16, body: String) -> Harness {
            let served = Arc::new(Mutex::new(Served {
                status,
                body,
                ..Default::default()
            }));
            let (url, stop_server) = server(served.clone()).await;
            let (tx, rx) = mpsc::channel(16);
            let errors = ErrorCounter::detached(crate::config::HTTP);
            let cancel = CancellationToken::new();
            let cfg = Config {
                url,
                headers: vec![
                    ("Authorization".to_owned(), "Bearer t0ken".to_owned()),
                    ("X-Node".to_owned(), NODE.to_owned()),
                ],
                node_name: NODE.to_owned(),
                check_frequency: Duration::from_millis(10),
                ca_file: None,
            };
            tokio::spawn(watch(cfg, tx, errors.clone(), cancel.clone()));
            Harness {
                rx,
                served,
                errors,
                cancel,
                stop_server,
            }
        }

        fn serve(&self, status: u16, body: String) {
            let mut s = self.served.lock().expect("lock");
            s.status = status;
            s.body = body;
        }

        async fn next(&mut self) -> Vec<StoredPod> {
            match tokio::time::timeout(WAIT, self.rx.recv()).await {
                Ok(Some(SourceUpdate::Set(pods))) => pods,
                Ok(Some(other)) => panic!("http source sends only SETs, got {other:?}"),
                Ok(None) => panic!("source stopped"),
                Err(_) => panic!("no SET in time"),
            }
        }

        /// Waits until the server has answered `n` more requests.
        async fn requests(&self, n: usize) {
            let start = self.served.lock().expect("lock").requests;
            let deadline = tokio::time::Instant::now() + WAIT;
            while self.served.lock().expect("lock").requests < start + n {
                assert!(tokio::time::Instant::now() < deadline, "no fetches");
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }

        fn stop(self) {
            self.cancel.cancel();
            self.stop_server.cancel();
        }
    }

    use crate::config::test_names as names;

    #[tokio::test]
    async fn pod_list_fetched_with_headers_and_resent_only_on_change() {
        let mut h = Harness::start(200, list_json(&[("a", "x:1"), ("b", "x:1")])).await;
        let first = h.next().await;
        assert_eq!(names(&first), ["a-node1", "b-node1"]);
        {
            let s = h.served.lock().expect("lock");
            assert!(
                s.headers
                    .iter()
                    .any(|(k, v)| k == "authorization" && v == "Bearer t0ken"),
                "{:?}",
                s.headers
            );
            assert!(s.headers.iter().any(|(k, v)| k == "x-node" && v == NODE));
        }
        // The same body, fetched again and again: no SET.
        h.requests(3).await;
        assert!(h.rx.try_recv().is_err(), "unchanged body sent a SET");

        // b changes: a SET where a has the same fingerprints (the mux drops it as unchanged) and
        // b new ones.
        h.serve(200, list_json(&[("a", "x:1"), ("b", "x:2")]));
        let second = h.next().await;
        assert_eq!(names(&second), ["a-node1", "b-node1"]);
        let find = |pods: &[StoredPod], name: &str| {
            pods.iter()
                .find(|p| p.metadata().name.as_deref() == Some(name))
                .cloned()
                .expect("pod present")
        };
        let fp = |pods: &[StoredPod], name: &str| find(pods, name).fingerprints();
        assert_eq!(fp(&first, "a-node1"), fp(&second, "a-node1"));
        assert_ne!(fp(&first, "b-node1"), fp(&second, "b-node1"));
        // The source kept no reference: the mux can keep each pod without a copy.
        for p in first.iter().chain(&second) {
            assert_eq!(p.pod().holders(), 1, "the source holds {}", p.uid());
        }
        assert_eq!(h.errors.total(), 0);
        h.stop();
    }

    #[tokio::test]
    async fn failed_fetch_keeps_last_good_set_and_is_counted() {
        let mut h = Harness::start(200, pod_yaml("web", "x:1")).await;
        assert_eq!(names(&h.next().await), ["web-node1"]);
        h.serve(500, "boom".to_owned());
        h.requests(2).await;
        assert!(
            h.rx.try_recv().is_err(),
            "a failed fetch must not send a SET"
        );
        assert!(h.errors.get("fetch") >= 1);
        // Garbage: rejected as a whole, last good set kept, counted once per distinct body.
        h.serve(200, "kind: Pod\nmetadata: [".to_owned());
        h.requests(3).await;
        assert!(h.rx.try_recv().is_err());
        assert_eq!(h.errors.get("syntax"), 1);
        // Recovery.
        h.serve(200, pod_yaml("web", "x:2"));
        assert_eq!(names(&h.next().await), ["web-node1"]);
        h.stop();
    }

    #[tokio::test]
    async fn bad_and_duplicate_items_rejected_alone_and_empty_body_is_an_empty_set() {
        let body = list_json(&[("a", "x"), ("Bad_Name", "x"), ("a", "y"), ("c", "x")]);
        let mut h = Harness::start(200, body).await;
        assert_eq!(names(&h.next().await), ["a-node1", "c-node1"]);
        assert_eq!(h.errors.get("bad_name"), 1);
        assert_eq!(h.errors.get(crate::config::file::DUPLICATE_NAME), 1);
        h.serve(200, String::new());
        assert!(h.next().await.is_empty());
        assert_eq!(h.errors.get(EMPTY_BODY), 1);
        h.stop();
    }

    #[tokio::test]
    async fn unreachable_url_sends_nothing_and_counts() {
        // A port nothing listens on (bound, then closed).
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}/pods", listener.local_addr().expect("addr"));
        drop(listener);
        let (mut rx, errors, cancel, task) = watching(&url, None);
        until_counted(&errors, "fetch").await;
        assert!(rx.try_recv().is_err());
        cancel.cancel();
        tokio::time::timeout(WAIT, task)
            .await
            .expect("stops on cancel")
            .expect("no panic");
    }

    /// The http source watching `url` with `ca_file`, fetching every 5 ms.
    fn watching(
        url: &str,
        ca_file: Option<PathBuf>,
    ) -> (
        mpsc::Receiver<SourceUpdate>,
        ErrorCounter,
        CancellationToken,
        tokio::task::JoinHandle<()>,
    ) {
        let (tx, rx) = mpsc::channel(4);
        let errors = ErrorCounter::detached(crate::config::HTTP);
        let cancel = CancellationToken::new();
        let cfg = Config {
            url: url.to_owned(),
            headers: Vec::new(),
            node_name: NODE.to_owned(),
            check_frequency: Duration::from_millis(5),
            ca_file,
        };
        let task = tokio::spawn(watch(cfg, tx, errors.clone(), cancel.clone()));
        (rx, errors, cancel, task)
    }

    /// Waits until `errors` counted `reason` at least once.
    async fn until_counted(errors: &ErrorCounter, reason: &'static str) {
        let deadline = tokio::time::Instant::now() + WAIT;
        while errors.get(reason) < 1 {
            assert!(tokio::time::Instant::now() < deadline, "no {reason} error");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    #[tokio::test]
    async fn https_is_verified_against_the_ca_file_or_the_system_roots() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = dir.path().join("ca.pem");
        let served = Arc::new(Mutex::new(Served {
            status: 200,
            body: list_json(&[("a", "x")]),
            ..Default::default()
        }));
        let (url, stop) = https_server(served.clone(), &ca).await;
        // With the server's CA: the pods arrive.
        let (mut rx, errors, cancel, task) = watching(&url, Some(ca.clone()));
        match tokio::time::timeout(WAIT, rx.recv()).await {
            Ok(Some(SourceUpdate::Set(pods))) => assert_eq!(names(&pods), ["a-node1"]),
            other => panic!("no SET over https: {other:?}"),
        }
        assert_eq!(errors.get("fetch"), 0);
        cancel.cancel();
        let _ = tokio::time::timeout(WAIT, task).await;
        let served_before = served.lock().expect("lock").requests;
        // With the system's roots, which do not know that CA: every fetch fails, nothing is
        // sent and the server never answers a request.
        let (mut rx, errors, cancel, _) = watching(&url, None);
        until_counted(&errors, "fetch").await;
        assert!(rx.try_recv().is_err());
        assert_eq!(served.lock().expect("lock").requests, served_before);
        cancel.cancel();
        // A CA file that holds no certificate: a clear error naming it, counted.
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").expect("write");
        let (mut rx, errors, cancel, _) = watching(&url, Some(empty));
        until_counted(&errors, "bad_url").await;
        assert!(rx.try_recv().is_err());
        cancel.cancel();
        stop.cancel();
        assert!(plain_to_remote("http://10.0.0.1/pods"));
        assert!(plain_to_remote("http://pods.example/pods"));
        for quiet in [
            "http://127.0.0.1:8080/pods",
            "http://localhost/pods",
            "http://[::1]/pods",
            "https://10.0.0.1/pods",
        ] {
            assert!(!plain_to_remote(quiet), "{quiet}");
        }
    }

    /// A body declaring `declared` bytes (size hint) that serves `frames` frames of `chunk`
    /// bytes, counting the frames read.
    struct Counted {
        declared: Option<u64>,
        frames: Option<usize>,
        chunk: usize,
        polled: Arc<Mutex<usize>>,
    }

    impl hyper::body::Body for Counted {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
            let mut polled = self.polled.lock().expect("lock");
            if self.frames.is_some_and(|n| *polled >= n) {
                return std::task::Poll::Ready(None);
            }
            *polled += 1;
            drop(polled);
            let data = Bytes::from(vec![b' '; self.chunk]);
            std::task::Poll::Ready(Some(Ok(hyper::body::Frame::data(data))))
        }

        fn size_hint(&self) -> hyper::body::SizeHint {
            self.declared.map_or_else(
                hyper::body::SizeHint::default,
                hyper::body::SizeHint::with_exact,
            )
        }
    }

    fn counted(
        declared: Option<u64>,
        frames: Option<usize>,
        chunk: usize,
    ) -> (Counted, Arc<Mutex<usize>>) {
        let polled = Arc::new(Mutex::new(0));
        let body = Counted {
            declared,
            frames,
            chunk,
            polled: polled.clone(),
        };
        (body, polled)
    }

    #[tokio::test]
    async fn bodies_over_the_limit_fail_without_being_buffered() {
        const MAX: u64 = 1 << 20;
        // A declared length over the limit: nothing is read.
        let (body, polled) = counted(Some(64 << 20), None, 64 * 1024);
        let e = read_body(body, MAX).await.expect_err("declared too large");
        assert!(matches!(e, BodyError::TooLarge { max: MAX }), "{e:?}");
        assert_eq!(*polled.lock().expect("lock"), 0);
        // An endless body: fails on the frame that crosses the limit, not later.
        let (body, polled) = counted(None, None, 64 * 1024);
        let e = read_body(body, MAX).await.expect_err("endless");
        assert!(matches!(e, BodyError::TooLarge { .. }), "{e:?}");
        assert_eq!(
            *polled.lock().expect("lock"),
            17,
            "16 frames fill 1 MiB, the 17th crosses"
        );
        // Exactly at the limit, in frames, with and without a declared length: the whole body.
        for declared in [Some(MAX), None] {
            let (body, _) = counted(declared, Some(16), 64 * 1024);
            let got = read_body(body, MAX).await.expect("at the limit");
            assert_eq!(got.len() as u64, MAX);
        }
        // An empty body.
        let (body, _) = counted(Some(0), Some(0), 1);
        assert!(read_body(body, MAX).await.expect("empty").is_empty());
    }

    #[tokio::test]
    async fn other_schemes_and_bad_headers_are_errors_not_panics() {
        let client = client(None).expect("a client");
        let mut cfg = Config {
            url: "ftp://127.0.0.1:1/pods".to_owned(),
            headers: Vec::new(),
            node_name: NODE.to_owned(),
            check_frequency: DEFAULT_CHECK_FREQUENCY,
            ca_file: None,
        };
        let e = fetch(&client, &cfg).await.expect_err("ftp");
        assert!(matches!(e, Error::Scheme { .. }), "{e}");
        assert_eq!(e.reason(), "bad_url");
        cfg.url = "http://127.0.0.1:1/pods".to_owned();
        cfg.headers = vec![("bad header".to_owned(), "v".to_owned())];
        let e = fetch(&client, &cfg).await.expect_err("header");
        assert!(matches!(e, Error::Header { .. }), "{e}");
        cfg.url = "not a url".to_owned();
        assert_eq!(
            fetch(&client, &cfg).await.expect_err("url").reason(),
            "bad_url"
        );
    }
}
