//! The TLS of the connections the proxy opens to put a secret's value in
//! (swap.rs, exchange.rs): a certificate authority of the sandbox's own,
//! made when its proxy starts, whose key never leaves this process; a
//! leaf for each host it opens, issued on first use; the sandbox's side
//! served with that leaf, the upstream's verified against the system's
//! roots (and the CA files the policy names).
//!
//! Only connections to a host some secret is for come here; every other
//! CONNECT stays a tunnel the proxy cannot read (certificate pinning to
//! other hosts keeps working).
//!
//! Rules, each for a reason:
//! - The server name the client sends (SNI), when it sends one, must be
//!   the CONNECT host: the leaf is for that name only, and the value goes
//!   only to the host the policy checked.
//! - ALPN offers `http/1.1` only, on both sides: an HTTP/2 connection could
//!   carry requests for other authorities (connection coalescing, RFC 9113
//!   §9.1.1), which exchange.rs could not check one by one. A client that
//!   offers only `h2` fails the handshake.
//! - The upstream's certificate is verified before any request is read; a
//!   failure is answered inside the sandbox's TLS with 502 and the reason.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use base64::Engine as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConfig, ServerConnection};
use rustls_pki_types::pem::PemObject;

use crate::exchange::{self, Exchanged, Target};
use crate::http::Host;
use crate::swap::{SwapSecret, Swaps};

/// The protocol both sides speak: HTTP/1.1 only.
const ALPN_HTTP11: &[u8] = b"http/1.1";
/// The system's CA bundle (Debian's `ca-certificates`).
pub const SYSTEM_CA_FILE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// How long the sandbox's CA and its leaves are valid. A sandbox's proxy
/// lives as long as its session; a day past that is slack for clocks.
const VALIDITY: Duration = Duration::from_secs(30 * 24 * 3600);
/// Most leaves kept (one per host a secret is for; a policy names few).
const MAX_LEAVES: usize = 256;

/// Why the TLS side could not be set up or a connection not opened.
#[derive(Debug, thiserror::Error)]
pub enum InterceptError {
    /// Making the CA or a leaf failed.
    #[error("making a certificate failed: {0}")]
    Certificate(String),
    /// A CA file could not be read or holds no certificate.
    #[error("{path}: {detail}")]
    CaFile {
        /// The file.
        path: String,
        /// What was wrong.
        detail: String,
    },
    /// rustls refused a configuration.
    #[error("TLS configuration: {0}")]
    Config(String),
    /// The sandbox's side of the handshake failed.
    #[error("the TLS handshake with the sandbox failed: {0}")]
    ClientHandshake(String),
    /// The client named another server than the CONNECT host.
    #[error("the TLS server name {sni} differs from the host the connection was opened for")]
    SniMismatch {
        /// What the client sent.
        sni: String,
    },
    /// The upstream's handshake or certificate failed.
    #[error("the TLS handshake with the upstream failed: {0}")]
    UpstreamHandshake(String),
    /// The exchanges stopped on a refusal or a failure.
    #[error(transparent)]
    Exchange(#[from] exchange::ExchangeError),
}

/// The sandbox's certificate authority.
pub struct Authority {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    cert: CertificateDer<'static>,
    leaves: Mutex<HashMap<String, Arc<ServerConfig>>>,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority").finish_non_exhaustive()
    }
}

fn cert_err(e: rcgen::Error) -> InterceptError {
    InterceptError::Certificate(e.to_string())
}

fn validity(params: &mut rcgen::CertificateParams) {
    let now = time::OffsetDateTime::now_utc();
    // an hour back: a sandbox clock a little behind still accepts it
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + VALIDITY;
}

impl Authority {
    /// A new CA (ECDSA P-256, its key in this process only), named after
    /// `label` (the sandbox's id) so that a user who meets it knows it.
    pub fn new(label: &str) -> Result<Authority, InterceptError> {
        let key = rcgen::KeyPair::generate().map_err(cert_err)?;
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(cert_err)?;
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        params.distinguished_name.push(
            rcgen::DnType::CommonName,
            format!("mcpbox sandbox {label} (secrets kept outside)"),
        );
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "mcpbox");
        validity(&mut params);
        let cert = params.self_signed(&key).map_err(cert_err)?;
        Ok(Authority {
            issuer: rcgen::Issuer::new(params, key),
            cert: cert.der().clone(),
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> String {
        pem("CERTIFICATE", &self.cert)
    }

    /// The server configuration for `host`: its leaf, issued once (a
    /// test's upstream serves with one of these from a CA of its own).
    pub fn server_config(&self, host: &Host) -> Result<Arc<ServerConfig>, InterceptError> {
        let name = host.policy_form();
        let mut leaves = self.leaves.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = leaves.get(&name) {
            return Ok(c.clone());
        }
        let key = rcgen::KeyPair::generate().map_err(cert_err)?;
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(cert_err)?;
        params.subject_alt_names = vec![match host {
            Host::Name(n) => rcgen::SanType::DnsName(
                n.clone()
                    .try_into()
                    .map_err(|e: rcgen::Error| cert_err(e))?,
            ),
            Host::Ip(ip) => rcgen::SanType::IpAddress(*ip),
        }];
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name.clone());
        params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        validity(&mut params);
        let leaf = params.signed_by(&key, &self.issuer).map_err(cert_err)?;
        let chain = vec![leaf.der().clone(), self.cert.clone()];
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| InterceptError::Config(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(chain, key_der)
            .map_err(|e| InterceptError::Config(e.to_string()))?;
        config.alpn_protocols = vec![ALPN_HTTP11.to_vec()];
        // our order of suites (the cheaper AEAD first, see provider())
        config.ignore_client_order = true;
        let config = Arc::new(config);
        if leaves.len() >= MAX_LEAVES {
            leaves.clear();
        }
        leaves.insert(name, config.clone());
        Ok(config)
    }
}

/// ring's provider with AES-128-GCM preferred: both legs of an opened
/// connection are encrypted here, on one thread each way, so the cheaper of
/// TLS 1.3's mandatory AEADs (10 AES rounds to 14, RFC 8446 §9.1) is asked
/// for first; every suite ring offers is still accepted.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites.sort_by_key(|s| {
        use rustls::CipherSuite::*;
        match s.suite() {
            TLS13_AES_128_GCM_SHA256 => 0,
            TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256 | TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 => 1,
            _ => 2,
        }
    });
    Arc::new(p)
}

/// `der` as a PEM section (RFC 7468: base64 lines of 64 characters).
fn pem(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// The roots the proxy verifies upstreams against: the system bundle and
/// each of `extra` (the policy's `ca_file`s). A missing system bundle is
/// no error when `extra` has roots; a named file that cannot be read is.
pub fn client_config(system: &Path, extra: &[&Path]) -> Result<Arc<ClientConfig>, InterceptError> {
    let mut roots = RootCertStore::empty();
    let mut files: Vec<(&Path, bool)> = vec![(system, false)];
    files.extend(extra.iter().map(|p| (*p, true)));
    for (path, required) in files {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(_) if !required => continue,
            Err(e) => {
                return Err(InterceptError::CaFile {
                    path: path.display().to_string(),
                    detail: e.to_string(),
                })
            }
        };
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&bytes)
            .collect::<Result<_, _>>()
            .map_err(|e| InterceptError::CaFile {
                path: path.display().to_string(),
                detail: e.to_string(),
            })?;
        let (added, _) = roots.add_parsable_certificates(certs);
        if added == 0 && required {
            return Err(InterceptError::CaFile {
                path: path.display().to_string(),
                detail: "holds no usable CA certificate".into(),
            });
        }
    }
    if roots.is_empty() {
        return Err(InterceptError::CaFile {
            path: system.display().to_string(),
            detail: "no CA certificates to verify upstreams with".into(),
        });
    }
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| InterceptError::Config(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![ALPN_HTTP11.to_vec()];
    Ok(Arc::new(config))
}

/// The CA bundle a sandbox trusts: the system's roots, then its own CA,
/// so that other HTTPS keeps working where a runtime reads one file.
pub fn bundle(authority: &Authority, system: &Path) -> String {
    let mut out = std::fs::read_to_string(system).unwrap_or_default();
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&authority.cert_pem());
    out
}

/// What one sandbox's proxy needs to keep its secrets outside: the swaps
/// (replaced whole when a secret's value rotates), its CA and the client
/// configuration for upstreams.
pub struct SecretsOut {
    swaps: RwLock<Arc<Swaps>>,
    authority: Authority,
    client: Arc<ClientConfig>,
}

impl std::fmt::Debug for SecretsOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretsOut").finish_non_exhaustive()
    }
}

impl SecretsOut {
    /// The proxy's state for `secrets`.
    pub fn new(
        secrets: Vec<SwapSecret>,
        authority: Authority,
        client: Arc<ClientConfig>,
    ) -> Result<SecretsOut, InterceptError> {
        let swaps = Swaps::new(secrets).map_err(|e| InterceptError::Config(e.to_string()))?;
        Ok(SecretsOut {
            swaps: RwLock::new(Arc::new(swaps)),
            authority,
            client,
        })
    }

    /// The swaps as they are now.
    pub fn swaps(&self) -> Arc<Swaps> {
        self.swaps.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// A rotated value for secret `name`: connections opened from now on
    /// use it; the sandbox keeps its placeholder.
    pub fn set_value(&self, name: &str, value: &str) -> Result<(), InterceptError> {
        let mut slot = self.swaps.write().unwrap_or_else(|p| p.into_inner());
        let mut secrets = slot.secrets().to_vec();
        for s in &mut secrets {
            if s.name == name {
                s.value = value.to_string();
            }
        }
        *slot = Arc::new(Swaps::new(secrets).map_err(|e| InterceptError::Config(e.to_string()))?);
        Ok(())
    }

    /// The sandbox's CA.
    pub fn authority(&self) -> &Authority {
        &self.authority
    }
}

/// The sandbox's side of the connection: what it sent after its CONNECT
/// head (`first`, often the ClientHello already; for plain HTTP the
/// rewritten head and what followed it), then the socket.
pub(crate) struct Prefixed<'a, C> {
    first: std::io::Cursor<Vec<u8>>,
    inner: &'a mut C,
}

impl<'a, C> Prefixed<'a, C> {
    pub(crate) fn new(first: Vec<u8>, inner: &'a mut C) -> Self {
        Prefixed {
            first: std::io::Cursor::new(first),
            inner,
        }
    }
}

impl<C: Read> Read for Prefixed<'_, C> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if (self.first.position() as usize) < self.first.get_ref().len() {
            return self.first.read(buf);
        }
        self.inner.read(buf)
    }
}

impl<C: Write> Write for Prefixed<'_, C> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.inner.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Opens the connection (the CONNECT was answered 200 already): TLS with
/// the sandbox under a leaf for `target`, TLS with `upstream` verified,
/// then the exchanges. `done` says what went through, whatever the result.
pub fn intercept<C: Read + Write>(
    client: &mut C,
    first: Vec<u8>,
    upstream: TcpStream,
    target: &Target,
    out: &SecretsOut,
    done: &mut Exchanged,
) -> Result<(), InterceptError> {
    // A CONNECT (or the transparent capture's) tunnel may carry plain
    // HTTP (a program's `http://host:80`): its first byte says. A TLS
    // record starts with 0x16 (handshake, RFC 8446 §5.1); anything else
    // is taken as HTTP/1.1 and checked the same way, without TLS.
    let mut first = first;
    if first.is_empty() {
        let mut b = [0u8; 1];
        loop {
            match client.read(&mut b) {
                Ok(0) => return Ok(()),
                Ok(_) => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(exchange::ExchangeError::Client(e).into()),
            }
        }
        first.push(b[0]);
    }
    if first[0] != 0x16 {
        let mut plain = Prefixed::new(first, client);
        return exchange::relay(&mut plain, &upstream, target, &out.swaps(), done)
            .map_err(InterceptError::from);
    }
    done.tls = true;
    let config = out.authority.server_config(&target.host)?;
    let conn = ServerConnection::new(config).map_err(|e| InterceptError::Config(e.to_string()))?;
    let mut inside = rustls::StreamOwned::new(conn, Prefixed::new(first, client));
    while inside.conn.is_handshaking() {
        inside
            .conn
            .complete_io(&mut inside.sock)
            .map_err(|e| InterceptError::ClientHandshake(e.to_string()))?;
    }
    if let Some(sni) = inside.conn.server_name() {
        let matches = match &target.host {
            Host::Name(n) => sni.eq_ignore_ascii_case(n),
            // an IP literal is never a server name (RFC 6066 §3)
            Host::Ip(_) => false,
        };
        if !matches {
            return Err(InterceptError::SniMismatch {
                sni: sni.chars().take(253).collect(),
            });
        }
    }

    let name = match &target.host {
        Host::Name(n) => ServerName::try_from(n.clone())
            .map_err(|e| InterceptError::UpstreamHandshake(e.to_string()))?,
        Host::Ip(ip) => ServerName::IpAddress((*ip).into()),
    };
    let conn = ClientConnection::new(out.client.clone(), name)
        .map_err(|e| InterceptError::Config(e.to_string()))?;
    let mut up = rustls::StreamOwned::new(conn, upstream);
    while up.conn.is_handshaking() {
        if let Err(e) = up.conn.complete_io(&mut up.sock) {
            let why = format!("the TLS handshake with the upstream failed: {e}");
            let body = format!("{why}\n");
            let reply = format!(
                "HTTP/1.1 502 Bad Gateway\r\nX-Mcpbox-Source: egress.secrets\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = inside.write_all(reply.as_bytes());
            let _ = inside.flush();
            close(&mut inside);
            return Err(InterceptError::UpstreamHandshake(e.to_string()));
        }
    }
    let swaps = out.swaps();
    let result = exchange::relay(&mut inside, &mut up, target, &swaps, done);
    close(&mut inside);
    up.conn.send_close_notify();
    let _ = up.conn.complete_io(&mut up.sock);
    result.map_err(InterceptError::from)
}

fn close<S: Read + Write>(s: &mut rustls::StreamOwned<ServerConnection, S>) {
    s.conn.send_close_notify();
    let _ = s.conn.complete_io(&mut s.sock);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use mcpbox_policy::HostRule;
    use std::net::TcpListener;
    use std::os::unix::net::UnixStream;
    use std::thread;

    const PH: &str = "ghp_PLACEHOLDERplaceholder0123456789ab";
    const VALUE: &str = "ghp_REALVALUErealvalue9876543210zyxwvu";

    /// A TLS upstream on loopback with a certificate for `name` from a CA
    /// of its own (written to a file the proxy is told to trust), that
    /// answers one request with what it received.
    fn upstream(
        name: &str,
    ) -> (
        std::net::SocketAddr,
        tempfile::NamedTempFile,
        thread::JoinHandle<String>,
    ) {
        let ca = Authority::new("test upstream").unwrap();
        let mut ca_file = tempfile::NamedTempFile::new().unwrap();
        ca_file.write_all(ca.cert_pem().as_bytes()).unwrap();
        let config = ca.server_config(&Host::Name(name.into())).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let t = thread::spawn(move || {
            let Ok((sock, _)) = listener.accept() else {
                return String::new();
            };
            let mut tls = rustls::StreamOwned::new(ServerConnection::new(config).unwrap(), sock);
            let mut seen = Vec::new();
            let mut b = [0u8; 1];
            while !seen.ends_with(b"\r\n\r\n") {
                match tls.read(&mut b) {
                    Ok(1) => seen.push(b[0]),
                    _ => return String::from_utf8_lossy(&seen).into_owned(),
                }
            }
            let seen = String::from_utf8_lossy(&seen).into_owned();
            let body = format!("you sent: {seen}");
            let _ = write!(
                tls,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            tls.conn.send_close_notify();
            let _ = tls.conn.complete_io(&mut tls.sock);
            seen
        });
        (addr, ca_file, t)
    }

    fn secrets_out(ca_file: &Path) -> SecretsOut {
        SecretsOut::new(
            vec![SwapSecret {
                name: "GITHUB_TOKEN".into(),
                placeholder: PH.into(),
                value: VALUE.into(),
                hosts: vec![HostRule::parse("api.github.com").unwrap()],
                bodies: false,
            }],
            Authority::new("sb-test").unwrap(),
            client_config(Path::new("/nonexistent"), &[ca_file]).unwrap(),
        )
        .unwrap()
    }

    /// A client in the sandbox: trusts the sandbox's CA only, says `sni`
    /// and `alpn`, sends `request`, returns what it read (or the error).
    fn sandbox_client(
        out: &SecretsOut,
        sni: &str,
        alpn: &[&[u8]],
        request: String,
    ) -> (UnixStream, thread::JoinHandle<Result<String, String>>) {
        let mut roots = RootCertStore::empty();
        roots.add(out.authority.cert.clone()).unwrap();
        let mut config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
        let (mine, theirs) = UnixStream::pair().unwrap();
        let name = ServerName::try_from(sni.to_string()).unwrap();
        let t = thread::spawn(move || {
            let conn = ClientConnection::new(Arc::new(config), name).unwrap();
            let mut tls = rustls::StreamOwned::new(conn, theirs);
            tls.write_all(request.as_bytes())
                .map_err(|e| e.to_string())?;
            let mut got = Vec::new();
            match tls.read_to_end(&mut got) {
                Ok(_) => Ok(String::from_utf8_lossy(&got).into_owned()),
                Err(e) if got.is_empty() => Err(e.to_string()),
                Err(_) => Ok(String::from_utf8_lossy(&got).into_owned()),
            }
        });
        (mine, t)
    }

    fn target() -> Target {
        Target {
            host: Host::Name("api.github.com".into()),
            port: 443,
        }
    }

    /// The proxy's side of one opened connection: `mine` is the sandbox's
    /// end, `addr` the upstream; closes the sandbox's end after.
    fn open_with(
        mut mine: UnixStream,
        addr: std::net::SocketAddr,
        out: &SecretsOut,
    ) -> (Result<(), InterceptError>, Exchanged) {
        let mut done = Exchanged::default();
        let upstream = TcpStream::connect(addr).unwrap();
        let r = intercept(&mut mine, Vec::new(), upstream, &target(), out, &mut done);
        drop(mine);
        (r, done)
    }

    #[test]
    fn the_sandbox_sends_its_placeholder_and_the_upstream_gets_the_value() {
        let (addr, ca_file, up) = upstream("api.github.com");
        let out = secrets_out(ca_file.path());
        let req = format!("GET /user HTTP/1.1\r\nHost: api.github.com\r\nAuthorization: token {PH}\r\nConnection: close\r\n\r\n");
        let (mine, client) = sandbox_client(&out, "api.github.com", &[b"http/1.1"], req);
        let (r, done) = open_with(mine, addr, &out);
        r.unwrap();
        let seen = up.join().unwrap();
        assert!(
            seen.contains(&format!("Authorization: token {VALUE}")),
            "{seen}"
        );
        let got = client.join().unwrap().unwrap();
        assert!(got.starts_with("HTTP/1.1 200 OK"), "{got}");
        // the upstream echoed the value: the sandbox reads its placeholder
        assert!(!got.contains(VALUE), "{got}");
        assert!(got.contains(&format!("Authorization: token {PH}")), "{got}");
        assert_eq!(done.added.iter().collect::<Vec<_>>(), ["GITHUB_TOKEN"]);
        assert_eq!(done.scrubbed.iter().collect::<Vec<_>>(), ["GITHUB_TOKEN"]);
    }

    #[test]
    fn a_server_name_other_than_the_connect_host_is_refused_before_any_request() {
        let (addr, ca_file, up) = upstream("api.github.com");
        let out = secrets_out(ca_file.path());
        let req = format!("GET / HTTP/1.1\r\nHost: evil.test\r\nX: {PH}\r\n\r\n");
        let (mine, client) = sandbox_client(&out, "evil.test", &[b"http/1.1"], req);
        let (r, done) = open_with(mine, addr, &out);
        // the leaf is for api.github.com: the client's own check may fail
        // first, or the proxy's SNI check; either way nothing goes up
        assert!(r.is_err());
        assert!(client.join().unwrap().is_err() || done.requests == 0);
        assert_eq!(done.requests, 0);
        drop(out);
        let seen = up.join().unwrap();
        assert!(!seen.contains(VALUE), "{seen}");
    }

    #[test]
    fn a_client_that_speaks_only_http2_fails_the_handshake() {
        let (addr, ca_file, _up) = upstream("api.github.com");
        let out = secrets_out(ca_file.path());
        let (mine, client) = sandbox_client(&out, "api.github.com", &[b"h2"], String::new());
        let (r, _) = open_with(mine, addr, &out);
        assert!(
            matches!(r, Err(InterceptError::ClientHandshake(_))),
            "{r:?}"
        );
        assert!(client.join().unwrap().is_err());
    }

    #[test]
    fn an_upstream_whose_certificate_is_not_trusted_gets_nothing_and_the_sandbox_a_502() {
        let (addr, _their_ca, up) = upstream("api.github.com");
        // trusts another CA than the upstream's
        let other = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(other.path(), Authority::new("other").unwrap().cert_pem()).unwrap();
        let out = secrets_out(other.path());
        let req = format!("GET / HTTP/1.1\r\nHost: api.github.com\r\nX: {PH}\r\n\r\n");
        let (mine, client) = sandbox_client(&out, "api.github.com", &[b"http/1.1"], req);
        let (r, _) = open_with(mine, addr, &out);
        assert!(
            matches!(r, Err(InterceptError::UpstreamHandshake(_))),
            "{r:?}"
        );
        let got = client.join().unwrap().unwrap();
        assert!(got.starts_with("HTTP/1.1 502"), "{got}");
        assert!(!up.join().unwrap().contains(VALUE));
    }

    #[test]
    fn a_rotated_value_is_what_the_next_connection_sends() {
        let (addr, ca_file, up) = upstream("api.github.com");
        let out = secrets_out(ca_file.path());
        out.set_value("GITHUB_TOKEN", "ghp_ROTATEDrotated0123456789abcdefghijk")
            .unwrap();
        let req = format!(
            "GET / HTTP/1.1\r\nHost: api.github.com\r\nX: {PH}\r\nConnection: close\r\n\r\n"
        );
        let (mine, client) = sandbox_client(&out, "api.github.com", &[b"http/1.1"], req);
        let (r, _) = open_with(mine, addr, &out);
        r.unwrap();
        assert!(up
            .join()
            .unwrap()
            .contains("X: ghp_ROTATEDrotated0123456789abcdefghijk"));
        assert!(client
            .join()
            .unwrap()
            .unwrap()
            .contains(&format!("X: {PH}")));
    }

    #[test]
    fn the_bundle_holds_the_system_roots_and_the_sandbox_ca() {
        let a = Authority::new("sb-1").unwrap();
        let sys = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            sys.path(),
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----",
        )
        .unwrap();
        let b = bundle(&a, sys.path());
        assert_eq!(b.matches("BEGIN CERTIFICATE").count(), 2);
        assert!(b.ends_with(&a.cert_pem()));
        // parses as PEM and holds the CA
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(a.cert_pem().as_bytes())
                .collect::<Result<_, _>>()
                .unwrap();
        assert_eq!(certs, vec![a.cert.clone()]);
    }
}
