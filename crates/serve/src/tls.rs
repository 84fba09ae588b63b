//! TLS: the listener's server side (`[listen] tls`) and the client side of
//! remote upstreams ([`crate::upstream`]).
//!
//! rustls with the ring provider only, TLS 1.2 and 1.3, ALPN `http/1.1`
//! (the gateway speaks HTTP/1.1 alone; offering h2 would make a client
//! pick a protocol nobody answers). Certificates and keys are PEM files
//! read once at start, so a missing file, a file that holds no
//! certificate or key, or a key that does not belong to the certificate
//! stops `mcpbox serve` before it listens, with the config key in the
//! message.
//!
//! The handshake runs on the connection's own task with the header
//! timeout (see [`crate::serve_with`]): a client that opens a connection
//! and never finishes its hello holds a task and a socket for that long,
//! no more, and never the accept loop.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::ring;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// The one application protocol the gateway speaks.
const ALPN_HTTP11: &[u8] = b"http/1.1";

/// The system's CA bundle (Debian's `ca-certificates`), the roots that
/// verify an upstream's certificate.
pub const SYSTEM_CA_FILE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Why a TLS configuration could not be built. Each names the config key
/// and the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("{key}: cannot read {}: {source}", path.display())]
    Read {
        /// The config key (`listen.tls.cert`, `listen.tls.key`).
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
    /// The file holds no PEM certificate, or no PEM private key, or a
    /// malformed one.
    #[error("{key}: {} holds no valid PEM {what}: {detail}", path.display())]
    Pem {
        /// The config key.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// "certificate" or "private key".
        what: &'static str,
        /// The parser's word.
        detail: String,
    },
    /// rustls refused the pair (most often: the key does not belong to the
    /// certificate).
    #[error("{key}: {} and {} do not make a usable certificate: {detail}", cert.display(), key_path.display())]
    Config {
        /// The config key.
        key: &'static str,
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key_path: PathBuf,
        /// rustls' word.
        detail: String,
    },
    /// The root store for upstreams could not be built.
    #[error("upstream tls: {0}")]
    Roots(String),
}

/// The crate's TLS result.
pub type Result<T, E = TlsError> = std::result::Result<T, E>;

/// The listener's TLS side: a rustls acceptor, cheap to clone.
#[derive(Clone)]
pub struct Acceptor(tokio_rustls::TlsAcceptor);

impl std::fmt::Debug for Acceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Acceptor")
    }
}

impl Acceptor {
    /// Loads `cert` (a PEM chain, leaf first) and `key` (a PEM private
    /// key: PKCS#8, PKCS#1 or SEC1) and checks they belong together.
    pub fn load(cert: &Path, key: &Path) -> Result<Acceptor> {
        let chain = load_certs("listen.tls.cert", cert)?;
        let key_der = load_key("listen.tls.key", key)?;
        let mut config = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| config_err(cert, key, e))?
            .with_no_client_auth()
            .with_single_cert(chain, key_der)
            .map_err(|e| config_err(cert, key, e))?;
        config.alpn_protocols = vec![ALPN_HTTP11.to_vec()];
        Ok(Acceptor(tokio_rustls::TlsAcceptor::from(Arc::new(config))))
    }

    /// The rustls acceptor.
    pub fn inner(&self) -> &tokio_rustls::TlsAcceptor {
        &self.0
    }
}

fn config_err(cert: &Path, key: &Path, e: rustls::Error) -> TlsError {
    TlsError::Config {
        key: "listen.tls",
        cert: cert.to_path_buf(),
        key_path: key.to_path_buf(),
        detail: e.to_string(),
    }
}

fn read(key: &'static str, path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        key,
        path: path.to_path_buf(),
        source,
    })
}

/// Every certificate in a PEM file; at least one.
pub fn load_certs(key: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let bytes = read(key, path)?;
    let pem_err = |detail: String| TlsError::Pem {
        key,
        path: path.to_path_buf(),
        what: "certificate",
        detail,
    };
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| pem_err(e.to_string()))?;
    if certs.is_empty() {
        return Err(pem_err("no CERTIFICATE section".into()));
    }
    Ok(certs)
}

fn load_key(key: &'static str, path: &Path) -> Result<PrivateKeyDer<'static>> {
    let bytes = read(key, path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| TlsError::Pem {
        key,
        path: path.to_path_buf(),
        what: "private key",
        detail: e.to_string(),
    })
}

/// A client configuration for upstreams: the roots in `ca_file` (the
/// system bundle, or a test's own CA), TLS 1.2 and 1.3, ALPN `http/1.1`.
pub fn client_config(ca_file: &Path) -> Result<Arc<ClientConfig>> {
    let certs = load_certs("upstream ca file", ca_file)?;
    let mut roots = RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(TlsError::Roots(format!(
            "{} holds no usable CA certificate",
            ca_file.display()
        )));
    }
    let mut config = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| TlsError::Roots(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![ALPN_HTTP11.to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_cert_names_the_config_key_and_the_file() {
        let e = Acceptor::load(
            Path::new("/nonexistent/c.pem"),
            Path::new("/nonexistent/k.pem"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("listen.tls.cert: cannot read /nonexistent/c.pem"),
            "{e}"
        );
    }

    #[test]
    fn a_file_without_pem_is_refused_with_its_key() {
        let dir = tempfile::tempdir().unwrap();
        let c = dir.path().join("c.pem");
        std::fs::write(&c, "not a certificate\n").unwrap();
        let e = Acceptor::load(&c, &c).unwrap_err().to_string();
        assert!(e.starts_with("listen.tls.cert: "), "{e}");
        assert!(e.contains("no valid PEM certificate"), "{e}");
    }
}
