//! TLS of the kubelet API port: the serving certificate (given, or self-signed and kept in the
//! certificate directory, as the kubelet does), client certificates checked against
//! `--client-ca-file`, and the user a verified client certificate names.
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {what}")]
    Pem { path: PathBuf, what: String },
    #[error("generating a self-signed serving certificate: {0}")]
    Generate(String),
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// Where the serving certificate and the client CA come from.
#[derive(Debug, Clone, Default)]
pub struct Files {
    /// `--tls-cert-file` and `--tls-private-key-file`; `None`: a self-signed pair in `cert_dir`.
    pub cert_and_key: Option<(PathBuf, PathBuf)>,
    /// `--cert-dir`: where the self-signed pair is written (`kubelet.crt`, `kubelet.key`) and
    /// reused from on the next start.
    pub cert_dir: PathBuf,
    /// `--client-ca-file`: client certificates signed by these CAs authenticate.
    pub client_ca: Option<PathBuf>,
}

fn read(path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|source| Error::Read {
        path: path.to_owned(),
        source,
    })
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, Error> {
    let pem = read(path)?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|e| Error::Pem {
            path: path.to_owned(),
            what: format!("not PEM certificates: {e}"),
        })?;
    if certs.is_empty() {
        return Err(Error::Pem {
            path: path.to_owned(),
            what: "no CERTIFICATE block".into(),
        });
    }
    Ok(certs)
}

fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, Error> {
    let pem = read(path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| Error::Pem {
        path: path.to_owned(),
        what: format!("no PEM private key: {e}"),
    })
}

/// The self-signed pair in `dir`, made (for `names`: DNS names and IP addresses) when absent.
fn self_signed(dir: &Path, names: &[String]) -> Result<(PathBuf, PathBuf), Error> {
    let cert = dir.join("kubelet.crt");
    let key = dir.join("kubelet.key");
    if cert.exists() && key.exists() {
        return Ok((cert, key));
    }
    let made = rcgen::generate_simple_self_signed(names.to_vec())
        .map_err(|e| Error::Generate(e.to_string()))?;
    let write = |path: &Path, contents: &str, mode: u32| {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::create_dir_all(dir)
            .and_then(|()| {
                std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(mode)
                    .open(path)
            })
            .and_then(|mut f| {
                // An existing file keeps its mode through open(2): set it.
                f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode))?;
                f.write_all(contents.as_bytes())
            })
            .map_err(|source| Error::Write {
                path: path.to_owned(),
                source,
            })
    };
    write(&key, &made.key_pair.serialize_pem(), 0o600)?;
    write(&cert, &made.cert.pem(), 0o644)?;
    tracing::info!(cert = %cert.display(), "wrote a self-signed serving certificate");
    Ok((cert, key))
}

/// The server's TLS configuration: HTTP/1.1 only (the streaming upgrades are HTTP/1.1);
/// client certificates are asked for and, when one is sent, must chain to the client CA (a
/// request without one is then authenticated otherwise or refused, above TLS).
pub fn server_config(files: &Files, names: &[String]) -> Result<rustls::ServerConfig, Error> {
    let (cert_path, key_path) = match &files.cert_and_key {
        Some(pair) => pair.clone(),
        None => self_signed(&files.cert_dir, names)?,
    };
    let chain = certificates(&cert_path)?;
    let key = private_key(&key_path)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Config(e.to_string()))?;
    let builder = match &files.client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in certificates(ca)? {
                roots.add(c).map_err(|e| Error::Pem {
                    path: ca.clone(),
                    what: format!("not a CA certificate: {e}"),
                })?;
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .allow_unauthenticated()
                    .build()
                    .map_err(|e| Error::Config(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| Error::Config(format!("{}: {e}", cert_path.display())))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Who made a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
    /// The user's UID and extra attributes, when a TokenReview named them (a certificate names
    /// neither); passed on in the access review.
    pub uid: Option<String>,
    pub extra: std::collections::BTreeMap<String, Vec<String>>,
}

impl User {
    /// The user of a request no credential authenticated (with `--anonymous-auth`).
    pub fn anonymous() -> Self {
        Self {
            name: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
            uid: None,
            extra: Default::default(),
        }
    }

    /// The user a verified client certificate names, by the API server's rule: the subject's
    /// common name is the user, each organization a group. `None` for a certificate that cannot
    /// be read or names no user.
    pub fn from_certificate(der: &[u8]) -> Option<Self> {
        let subject = subject(der)?;
        let mut name = None;
        let mut groups = vec!["system:authenticated".to_owned()];
        for (oid, value) in subject {
            match oid {
                OID_COMMON_NAME => name = Some(value),
                OID_ORGANIZATION => groups.push(value),
                _ => {}
            }
        }
        Some(Self {
            name: name.filter(|n| !n.is_empty())?,
            groups,
            uid: None,
            extra: Default::default(),
        })
    }
}

const OID_COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];
const OID_ORGANIZATION: &[u8] = &[0x55, 0x04, 0x0a];

/// One DER element: its tag, its contents, and what follows it.
fn der(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;

/// The (attribute OID, value) pairs of a certificate's subject.
fn subject(cert: &[u8]) -> Option<Vec<(&[u8], String)>> {
    let (SEQUENCE, cert, _) = der(cert)? else {
        return None;
    };
    let (SEQUENCE, tbs, _) = der(cert)? else {
        return None;
    };
    let mut rest = tbs;
    // [0] version (optional), serial, signature algorithm, issuer, validity, then the subject.
    let (tag, _, after) = der(rest)?;
    if tag == 0xa0 {
        rest = after;
    }
    for _ in 0..4 {
        rest = der(rest)?.2;
    }
    let (SEQUENCE, mut rdns, _) = der(rest)? else {
        return None;
    };
    let mut out = Vec::new();
    while !rdns.is_empty() {
        let (SET, mut set, next) = der(rdns)? else {
            return None;
        };
        rdns = next;
        while !set.is_empty() {
            let (SEQUENCE, attr, next) = der(set)? else {
                return None;
            };
            set = next;
            let (0x06, oid, value) = der(attr)? else {
                return None;
            };
            let (_, value, _) = der(value)?;
            out.push((oid, String::from_utf8_lossy(value).into_owned()));
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_certificate_names_its_user_and_groups() {
        let dir = tempfile::tempdir().unwrap();
        crate::handler::test_servers::self_signed_certificate_of(
            dir.path(),
            "/O=system:masters/O=ops/CN=alice",
            &[],
        )
        .unwrap();
        let cert = dir.path().join("cert.pem");
        let der = certificates(&cert).unwrap().remove(0);
        assert_eq!(
            User::from_certificate(&der),
            Some(User {
                name: "alice".into(),
                groups: vec![
                    "system:authenticated".into(),
                    "system:masters".into(),
                    "ops".into()
                ],
                uid: None,
                extra: Default::default(),
            })
        );
        // Truncated or garbage input names nobody and does not panic.
        for end in 0..der.len() {
            let _ = User::from_certificate(&der[..end]);
        }
        assert_eq!(User::from_certificate(b"\x30\x84\xff\xff\xff\xff"), None);
    }

    #[test]
    fn the_self_signed_pair_is_made_once_and_loads() {
        let dir = tempfile::tempdir().unwrap();
        let files = Files {
            cert_and_key: None,
            cert_dir: dir.path().join("pki"),
            client_ca: None,
        };
        let names = ["node-a".to_owned(), "127.0.0.1".to_owned()];
        server_config(&files, &names).unwrap();
        let crt = dir.path().join("pki/kubelet.crt");
        let first = std::fs::read(&crt).unwrap();
        server_config(&files, &names).unwrap();
        assert_eq!(std::fs::read(&crt).unwrap(), first, "reused, not remade");
        let key_mode = std::fs::metadata(dir.path().join("pki/kubelet.key"))
            .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777)
            .unwrap();
        assert_eq!(key_mode, 0o600);
        // A pair remade over a key file another mode left: the new key is 0600 all the same.
        let key = dir.path().join("pki/kubelet.key");
        std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        std::fs::remove_file(&crt).unwrap();
        server_config(&files, &names).unwrap();
        let key_mode = std::fs::metadata(&key)
            .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777)
            .unwrap();
        assert_eq!(key_mode, 0o600, "remade with the key's own mode");
        // A bad file is named.
        std::fs::write(&crt, "not pem").unwrap();
        let err = server_config(&files, &names).unwrap_err().to_string();
        assert!(err.contains("kubelet.crt"), "{err}");
    }
}
