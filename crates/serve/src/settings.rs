//! What the gateway runs with: the serve config, resolved (tokens loaded,
//! the accepted `Host` and `Origin` values worked out).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

pub use crate::gate::{constant_time_eq, digest};

/// One client of the gateway.
#[derive(Clone)]
pub struct ClientSettings {
    /// Its name: the audit's `caller`.
    pub name: String,
    /// SHA-256 of its bearer token; `None` for the anonymous client.
    pub token_digest: Option<[u8; 32]>,
    /// The servers it may use.
    pub servers: Vec<String>,
}

impl std::fmt::Debug for ClientSettings {
    // the digest stays out of logs too
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientSettings")
            .field("name", &self.name)
            .field("anonymous", &self.token_digest.is_none())
            .field("servers", &self.servers)
            .finish()
    }
}

impl ClientSettings {
    /// A client with a bearer token.
    pub fn with_token(name: &str, token: &str, servers: Vec<String>) -> ClientSettings {
        ClientSettings {
            name: name.to_string(),
            token_digest: Some(digest(token.as_bytes())),
            servers,
        }
    }

    /// The client requests without a token are (only on loopback).
    pub fn anonymous(name: &str, servers: Vec<String>) -> ClientSettings {
        ClientSettings {
            name: name.to_string(),
            token_digest: None,
            servers,
        }
    }

    /// Whether it may use `server`.
    pub fn may_use(&self, server: &str) -> bool {
        self.servers.iter().any(|s| s == server)
    }
}

/// Per-client limits (the config's `[limits]`).
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest request body, in bytes.
    pub max_body: usize,
    /// Requests in flight per client.
    pub max_concurrent: u32,
    /// Token-bucket refill per second, per client.
    pub rate_per_second: u32,
    /// Token-bucket size.
    pub burst: u32,
    /// Time a client has to send a request's head.
    pub header_timeout: Duration,
    /// Time a client has to send a request's body.
    pub body_timeout: Duration,
    /// Live sessions per client.
    pub max_sessions_per_client: u32,
    /// Open event streams per client.
    pub max_streams_per_client: u32,
    /// Bytes one session may hold for its client ([`crate::budget`]).
    pub max_buffered_per_session: usize,
    /// Bytes all sessions together may hold for their clients.
    pub max_buffered_total: usize,
    /// How long a stop waits for the requests in flight (their last byte
    /// written) before it ends them with an `http.stopped` error.
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_body: 4 * 1024 * 1024,
            max_concurrent: 32,
            rate_per_second: 200,
            burst: 400,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_sessions_per_client: 64,
            max_streams_per_client: 1024,
            max_buffered_per_session: 32 * 1024 * 1024,
            max_buffered_total: 512 * 1024 * 1024,
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// Everything the gateway needs to answer requests.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The address it listens on.
    pub listen: SocketAddr,
    /// `Host` header values accepted, lowercase (DNS-rebinding defence).
    pub allowed_hosts: Vec<String>,
    /// `Origin` header values accepted, lowercase, without a trailing `/`.
    pub allowed_origins: Vec<String>,
    /// Per-client limits.
    pub limits: Limits,
    /// The clients.
    pub clients: Vec<ClientSettings>,
    /// The servers' names, in config order.
    pub servers: Vec<String>,
    /// Whether the gateway speaks TLS (for its own origins).
    pub tls: bool,
    extra_hosts: Vec<String>,
    extra_origins: Vec<String>,
}

impl Settings {
    /// Settings for `listen` with no clients or servers yet: the `Host`
    /// and `Origin` values of the address itself (and, on loopback,
    /// `localhost`) plus `extra_hosts` and `extra_origins`.
    pub fn new(
        listen: SocketAddr,
        tls: bool,
        extra_hosts: &[String],
        extra_origins: &[String],
    ) -> Settings {
        let port = listen.port();
        let mut names: Vec<String> = Vec::new();
        let ip = listen.ip();
        if ip.is_loopback() {
            names.extend(["localhost".into(), "127.0.0.1".into(), "[::1]".into()]);
        }
        if !ip.is_unspecified() {
            names.push(match ip {
                IpAddr::V4(v4) => v4.to_string(),
                IpAddr::V6(v6) => format!("[{v6}]"),
            });
        }
        let mut hosts = Vec::new();
        for n in &names {
            hosts.push(format!("{n}:{port}"));
        }
        let scheme = if tls { "https" } else { "http" };
        let default_port = if tls { 443 } else { 80 };
        if port == default_port {
            hosts.extend(names.iter().cloned());
        }
        hosts.extend(extra_hosts.iter().map(|h| h.to_ascii_lowercase()));
        hosts.sort();
        hosts.dedup();
        let mut origins: Vec<String> = hosts.iter().map(|h| format!("{scheme}://{h}")).collect();
        origins.extend(
            extra_origins
                .iter()
                .map(|o| o.trim_end_matches('/').to_ascii_lowercase()),
        );
        origins.sort();
        origins.dedup();
        Settings {
            listen,
            allowed_hosts: hosts,
            allowed_origins: origins,
            limits: Limits::default(),
            clients: Vec::new(),
            servers: Vec::new(),
            tls,
            extra_hosts: extra_hosts.to_vec(),
            extra_origins: extra_origins.to_vec(),
        }
    }

    /// The same settings for the address really bound (the config's port
    /// 0 becomes the kernel's choice): the accepted `Host` and `Origin`
    /// values are worked out again for it.
    pub fn rebind(&mut self, bound: SocketAddr) {
        if bound == self.listen {
            return;
        }
        let fresh = Settings::new(bound, self.tls, &self.extra_hosts, &self.extra_origins);
        self.listen = fresh.listen;
        self.allowed_hosts = fresh.allowed_hosts;
        self.allowed_origins = fresh.allowed_origins;
    }

    /// Whether `host` (a `Host` header) is one the gateway serves.
    pub fn host_allowed(&self, host: &str) -> bool {
        crate::gate::host_allowed(&self.allowed_hosts, host)
    }

    /// Whether `origin` (an `Origin` header) may talk to the gateway.
    pub fn origin_allowed(&self, origin: &str) -> bool {
        crate::gate::origin_allowed(&self.allowed_origins, origin)
    }

    /// The client whose token digest is `presented` (`None`: no token:
    /// the anonymous client, if any). Every token is compared, each in
    /// constant time, so the time taken says nothing about which client
    /// nor how much of a token matched.
    pub fn client_for(&self, presented: Option<&[u8; 32]>) -> Option<&ClientSettings> {
        match presented {
            None => self.clients.iter().find(|c| c.token_digest.is_none()),
            Some(p) => {
                let mut found = None;
                for c in &self.clients {
                    if let Some(d) = &c.token_digest {
                        if constant_time_eq(d, p) && found.is_none() {
                            found = Some(c);
                        }
                    }
                }
                found
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loopback() -> Settings {
        Settings::new("127.0.0.1:8787".parse().unwrap(), false, &[], &[])
    }

    #[test]
    fn loopback_accepts_its_own_names_with_the_port() {
        let s = loopback();
        for h in [
            "127.0.0.1:8787",
            "localhost:8787",
            "LOCALHOST:8787",
            "[::1]:8787",
        ] {
            assert!(s.host_allowed(h), "{h}");
        }
    }

    #[test]
    fn port_zero_rebound_accepts_the_kernels_port_only() {
        let mut s = Settings::new("127.0.0.1:0".parse().unwrap(), false, &[], &[]);
        s.rebind("127.0.0.1:40123".parse().unwrap());
        assert!(s.host_allowed("127.0.0.1:40123"));
        assert!(s.origin_allowed("http://localhost:40123"));
        assert!(!s.host_allowed("127.0.0.1:0"));
    }

    #[test]
    fn a_rebinding_host_is_refused() {
        let s = loopback();
        for h in [
            "evil.example:8787",
            "evil.example",
            "127.0.0.1:9999",
            "localhost",
            "",
        ] {
            assert!(!s.host_allowed(h), "{h}");
        }
    }

    #[test]
    fn a_foreign_origin_is_refused_and_the_own_origin_accepted() {
        let s = loopback();
        assert!(s.origin_allowed("http://localhost:8787"));
        assert!(s.origin_allowed("http://127.0.0.1:8787/"));
        assert!(!s.origin_allowed("http://evil.example"));
        assert!(!s.origin_allowed("https://localhost:8787"));
        assert!(!s.origin_allowed("null"));
    }

    #[test]
    fn a_wrong_token_matches_no_client_and_no_token_only_the_anonymous_one() {
        let mut s = loopback();
        s.clients
            .push(ClientSettings::with_token("alice", "a-secret", vec![]));
        assert!(s.client_for(Some(&digest(b"a-secret"))).is_some());
        assert!(s.client_for(Some(&digest(b"a-secreT"))).is_none());
        assert!(s.client_for(None).is_none());
        s.clients.push(ClientSettings::anonymous("anon", vec![]));
        assert_eq!(s.client_for(None).unwrap().name, "anon");
        assert!(s.client_for(Some(&digest(b"wrong"))).is_none());
    }
}
