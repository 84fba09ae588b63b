//! The seams the proxy is built on: policy, name resolution, connecting and
//! asking a human. The binary wires the real ones; tests use fakes, so that a
//! refusal test never sends a packet anywhere.

use std::io;
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

/// What the policy says about a host name (or IP literal) and port, before
/// any resolution. Every variant carries a machine-readable `reason` and the
/// `source` rule, so that the audit record says which rule let a connection
/// through as well as which one refused it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The host and port are allowed.
    Allow {
        /// Machine-readable reason code, e.g. `network.allow_rule`.
        reason: String,
        /// The rule that allowed it, e.g. `policy:network.allow[0]`.
        source: String,
    },
    /// The host and port are refused; the proxy answers 403.
    Deny {
        /// Machine-readable reason code, e.g. `network.unlisted`.
        reason: String,
        /// The rule that refused it, e.g. `policy:network.unlisted`.
        source: String,
    },
    /// The host is unlisted and the policy says to ask a human
    /// (`network.unlisted = "approve"`).
    Ask {
        /// Machine-readable reason code, e.g. `network.unlisted`.
        reason: String,
        /// The rule that asked for approval, e.g. `policy:network.unlisted`.
        source: String,
    },
}

/// The network policy, as the proxy sees it.
pub trait EgressPolicy: Send + Sync {
    /// Decision for a host name or IP literal and port, before resolution.
    /// Names arrive lowercased without a trailing dot; IPv6 literals arrive
    /// without brackets in their canonical text form.
    fn decide(&self, host: &str, port: u16) -> Verdict;
    /// Explicit `[network.hosts]` mapping: bypasses DNS and the
    /// private-address refusal for that name only.
    fn mapped_address(&self, host: &str) -> Option<IpAddr>;
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

/// A human's answer for an unlisted host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalAnswer {
    /// Allow this one connection.
    Once,
    /// Allow this host and port for the lifetime of the proxy.
    Session,
    /// Refuse (also the answer on timeout).
    Deny,
}

/// Asks a human whether an unlisted host may be reached
/// (`network.unlisted = "approve"`). The connection is held while this runs;
/// the implementation owns the timeout and answers `Deny` when it expires.
pub trait Approver: Send + Sync {
    /// Asks about `host:port` and blocks until answered.
    fn ask(&self, host: &str, port: u16) -> ApprovalAnswer;
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
    fn ask(&self, _host: &str, _port: u16) -> ApprovalAnswer {
        ApprovalAnswer::Deny
    }
}
