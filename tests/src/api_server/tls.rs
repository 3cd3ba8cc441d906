//! HTTPS for the in-process API server, authenticating its clients as kube-apiserver does: a
//! client certificate signed by the cluster CA names its user (the subject's CN), a bearer token
//! the server knows names the token's user, and a request with neither (or with an unknown
//! token) gets a 401 `Status`. The serving configuration is the agent's own (the kubelet API's
//! rustls set-up: the client certificate is optional at the TLS layer, checked against the CA
//! when one is sent).
use std::path::PathBuf;
use std::sync::Arc;

use axum::http::Request;
use base64::Engine as _;
use hyper_util::rt::TokioIo;

use crate::certs::{Usage, make_ca, make_leaf};

/// The user the client certificate names.
pub const CERT_USER: &str = "system:node:swiftlet";
/// The user the server's bearer token names.
pub const TOKEN_USER: &str = "system:bootstrap:swiftlet";
const TOKEN: &str = "swiftlet.0123456789abcdef";

/// The certificates of an HTTPS API server, made with `openssl` in a temporary directory: the
/// cluster CA (`ca`), the server's certificate for 127.0.0.1 (`server`), a client certificate
/// for [`CERT_USER`] (`client`), and a second CA (`stranger-ca`) with a client certificate of
/// its own (`stranger`) that the server does not trust.
pub struct Material {
    dir: tempfile::TempDir,
}

/// What a kubeconfig for an HTTPS server carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credential {
    /// The cluster CA and the client certificate.
    ClientCertificate,
    /// The cluster CA and the server's bearer token.
    Token,
    /// The cluster CA and a token the server does not know (401).
    WrongToken,
    /// The cluster CA and a client certificate signed by another CA (the handshake fails).
    StrangerCertificate,
    /// Another CA as the cluster's (the server's certificate is not trusted) and the token.
    WrongCa,
}

impl Material {
    pub fn make() -> Result<Material, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
        let d = dir.path();
        make_ca(d, "ca", "/CN=swiftlet test cluster CA")?;
        make_leaf(d, "ca", "server", "/CN=kube-apiserver", Usage::Server)?;
        let subject = format!("/O=system:nodes/CN={CERT_USER}");
        make_leaf(d, "ca", "client", &subject, Usage::Client)?;
        make_ca(d, "stranger-ca", "/CN=someone else's CA")?;
        make_leaf(d, "stranger-ca", "stranger", &subject, Usage::Client)?;
        Ok(Material { dir })
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    fn base64_of(&self, file: &str) -> String {
        let bytes = std::fs::read(self.path(file)).expect("test certificate");
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    /// The kubeconfig's `certificate-authority-data` and `user` for `credential`.
    pub fn kubeconfig_parts(&self, credential: Credential) -> (String, String) {
        let ca = match credential {
            Credential::WrongCa => self.base64_of("stranger-ca.pem"),
            _ => self.base64_of("ca.pem"),
        };
        let cert = |name: &str| {
            format!(
                "{{client-certificate-data: {}, client-key-data: {}}}",
                self.base64_of(&format!("{name}.pem")),
                self.base64_of(&format!("{name}.key"))
            )
        };
        let user = match credential {
            Credential::ClientCertificate => cert("client"),
            Credential::StrangerCertificate => cert("stranger"),
            Credential::Token | Credential::WrongCa => format!("{{token: \"{TOKEN}\"}}"),
            Credential::WrongToken => "{token: \"not-a-token\"}".to_owned(),
        };
        (ca, user)
    }

    /// The user a request authenticates as: its connection's verified client certificate, else
    /// its bearer token; `None`: 401.
    pub(super) fn authenticate(peer: Option<&Peer>, authorization: Option<&str>) -> Option<String> {
        if let Some(Peer(Some(user))) = peer {
            return Some(user.clone());
        }
        (authorization == Some(&format!("Bearer {TOKEN}"))).then(|| TOKEN_USER.to_owned())
    }

    /// Serves `app` over TLS on `listener` until the runtime ends.
    pub(super) fn serve(
        &self,
        listener: tokio::net::TcpListener,
        app: axum::Router,
        numbering: super::ApiServer,
    ) {
        let files = swiftlet::server::tls::Files {
            cert_and_key: Some((self.path("server.pem"), self.path("server.key"))),
            cert_dir: self.dir.path().to_owned(),
            client_ca: Some(self.path("ca.pem")),
        };
        let config = swiftlet::server::tls::server_config(&files, &[]).expect("TLS config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let conn = numbering.connection_opened();
                tokio::spawn(connection(tcp, acceptor.clone(), app.clone(), conn));
            }
        });
    }
}

/// The user a connection's verified client certificate names, put on each of its requests.
#[derive(Debug, Clone)]
pub(super) struct Peer(Option<String>);

async fn connection(
    tcp: tokio::net::TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    app: axum::Router,
    conn: super::Conn,
) {
    // A failed handshake (an untrusted client certificate) just closes the connection.
    let Ok(tls) = acceptor.accept(tcp).await else {
        return;
    };
    let user = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .and_then(|leaf| swiftlet::server::tls::User::from_certificate(leaf))
        .map(|u| u.name);
    let peer = Peer(user);
    let svc = tower::ServiceExt::map_request(app, move |mut r: Request<hyper::body::Incoming>| {
        r.extensions_mut().insert(peer.clone());
        r.extensions_mut().insert(conn);
        r
    });
    let svc = hyper_util::service::TowerToHyperService::new(svc);
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(tls), svc)
        .with_upgrades()
        .await;
}
