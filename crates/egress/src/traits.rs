//! The seams the proxy is built on: policy, name resolution, connecting and
//! asking a human. The binary wires the real ones; tests use fakes, so that a
//! refusal test never sends a packet anywhere.

use std::io;
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use mcpbox_policy::{Decision, NetworkAnswer};

/// The network policy, as the proxy sees it.
pub trait EgressPolicy: Send + Sync {
    /// Decision for a host name or IP literal and port, before resolution:
    /// `Allow` connects, `Deny` refuses with 403, `Approve` asks the
    /// [`Approver`]. The reason and source reach the audit record, so it
    /// says which rule let a connection through as well as which refused it.
    /// Names arrive lowercased without a trailing dot; IPv6 literals arrive
    /// without brackets in their canonical text form.
    fn decide(&self, host: &str, port: u16) -> Decision;
    /// Explicit `[network.hosts]` mapping: bypasses DNS and the
    /// private-address refusal for that name only.
    fn mapped_address(&self, host: &str) -> Option<IpAddr>;
    /// Decision for resolving `host` in the sandbox (the bridge's resolver
    /// asks before it gives the name a synthetic address): `Allow` or
    /// `Approve` when some port of it can be allowed or asked about,
    /// `Deny` (with the reason a connection would get) otherwise. The
    /// connection is decided again, with its port, when it is made.
    fn decide_name(&self, host: &str) -> Decision {
        self.decide(host, 443)
    }
    /// The host's own loopback addresses `network.local` opens for
    /// `host:port` (a loopback spelling on a listed port), tried in order;
    /// `None` when no entry opens it. Only loopback addresses are used.
    fn local_addresses(&self, _host: &str, _port: u16) -> Option<Vec<IpAddr>> {
        None
    }
}

/// Resolves a host name to addresses. Called at most once per connection;
/// the proxy connects only to an address it got from this call and checked.
pub trait Resolver: Send + Sync {
    /// All addresses for `host`, each with `port`.
    fn resolve(&self, host: &str, port: u16) -> io::Result<Vec<SocketAddr>>;
}

/// Opens the upstream TCP connection to one checked address.
pub trait Connector: Send + Sync {
    /// Connects to exactly `addr` (never a fresh lookup).
    fn connect(&self, addr: SocketAddr) -> io::Result<TcpStream>;
}

/// Asks a human whether an unlisted host may be reached
/// (`network.unlisted = "approve"`). The connection is held while this runs;
/// the implementation owns the timeout and answers [`NetworkAnswer::Timeout`]
/// when it expires. Only `Once` and `Session` let the connection through.
pub trait Approver: Send + Sync {
    /// Asks about `host:port` and blocks until answered.
    fn ask(&self, host: &str, port: u16) -> NetworkAnswer;
}

/// The system resolver (`getaddrinfo` through `ToSocketAddrs`).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolver for SystemResolver {
    fn resolve(&self, host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
        Ok((host, port).to_socket_addrs()?.collect())
    }
}

/// Connects with `TcpStream::connect_timeout` and sets `TCP_NODELAY`.
#[derive(Debug, Clone, Copy)]
pub struct SystemConnector {
    /// How long one connection attempt may take.
    pub timeout: Duration,
}

impl Default for SystemConnector {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(10),
        }
    }
}

impl Connector for SystemConnector {
    fn connect(&self, addr: SocketAddr) -> io::Result<TcpStream> {
        let stream = TcpStream::connect_timeout(&addr, self.timeout)?;
        stream.set_nodelay(true)?;
        Ok(stream)
    }
}

/// An approver that refuses everything: the right one when
/// `network.unlisted = "deny"`, where it is never asked anyway.
#[derive(Debug, Clone, Copy, Default)]
pub struct DenyAllApprover;

impl Approver for DenyAllApprover {
    fn ask(&self, _host: &str, _port: u16) -> NetworkAnswer {
        NetworkAnswer::Unavailable
    }
}
