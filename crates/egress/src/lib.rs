//! The mcpbox egress proxy: the only way out of a sandbox's network
//! namespace.
//!
//! A sandbox has loopback only. Where policy allows egress, mcpbox runs a
//! [`Proxy`] outside the sandbox on a Unix socket, and a [`bridge`] inside
//! the sandbox's network namespace listens on `127.0.0.1:PORT` and carries
//! each connection over that socket; [`proxy_env`] points programs at the
//! bridge. The proxy speaks HTTP `CONNECT` (TLS and any TCP) and plain HTTP
//! forwarding (absolute-form, one request per upstream connection), decides
//! each target through an [`EgressPolicy`], resolves names itself, refuses
//! non-public addresses after resolution (DNS rebinding, metadata services),
//! connects to exactly the address it checked, checks TLS SNI against the
//! CONNECT host, relays through fixed 64 KiB buffers, and writes one audit
//! record per connection, with package names for known registries.
//!
//! Request heads are parsed by `httparse` (the HTTP/1 parser under hyper,
//! fuzzed and maintained there, no dependencies of its own) rather than by
//! hand; the proxy adds the rules it needs on top (CRLF only, nothing
//! before the request line, at most 128 fields, one numeric
//! `Content-Length` and never with `Transfer-Encoding`), see `http.rs`.
//!
//! Limitations (what this does not stop): classic domain fronting by the
//! HTTP `Host` header inside TLS (the proxy cannot see inside TLS; it only
//! checks SNI); a client that uses Encrypted Client Hello with an outer name
//! different from the CONNECT host is refused rather than checked; data
//! exfiltration to an allowed host is allowed traffic.
#![forbid(unsafe_code)]

mod addr;
mod bridge;
pub mod dns;
mod env;
pub mod exchange;
mod http;
pub mod intercept;
pub mod nflog;

/// For the byte parsers' tests: every prefix of `base`, then `n` copies of
/// it with three bytes changed each (a fixed xorshift sequence, so a
/// failure repeats), handed to `check`.
#[cfg(test)]
pub(crate) fn mutations(base: &[u8], n: usize, mut check: impl FnMut(&[u8])) {
    for len in 0..=base.len() {
        check(&base[..len]);
    }
    let mut seed = 0x2545_f491_u32;
    for _ in 0..n {
        let mut m = base.to_vec();
        for _ in 0..3 {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            let i = (seed as usize) % m.len();
            m[i] = (seed >> 8) as u8;
        }
        check(&m);
    }
}
mod package;
mod pool;
mod proxy;
mod stream;
pub mod swap;
mod tls;
mod traits;

pub use addr::{classify, is_metadata_name, AddressClass};
pub use bridge::{bridge, Sockets as BridgeSockets, REFUSED_METHOD, RESOLVE_METHOD};
pub use env::{merge_git_config, proxy_env};
pub use http::Fault;
pub use intercept::{Authority, SecretsOut};
pub use package::{parse_package, registry_for_host, Ecosystem, Package};
pub use proxy::{CallContext, Ids, Proxy, Shutdown, HEAD_TIMEOUT, RESOLVED_HEADER};
pub use stream::{relay_tcp, ClientStream, Listener, RELAY_BUFFER};
pub use swap::{placeholder_for, PlaceholderError, SwapSecret};
pub use tls::{client_hello, inspect as inspect_client_hello, Hello, ALERT_ACCESS_DENIED};
pub use traits::{
    Approver, Connector, DenyAllApprover, EgressPolicy, Resolver, SystemConnector, SystemResolver,
};

use std::io;

/// Stack size of the proxy's per-connection threads; the relay buffers are
/// on the heap, so a small stack is plenty.
pub(crate) const THREAD_STACK: usize = 256 * 1024;

/// Errors that stop [`Proxy::serve`]. Per-connection failures never stop the
/// proxy: they become responses and audit records.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The listener's own address could not be read.
    #[error("reading the proxy listener address failed: {0}")]
    Listener(#[source] io::Error),
    /// `accept` failed with a non-transient error.
    #[error("accepting a connection on the proxy listener failed: {0}")]
    Accept(#[source] io::Error),
}

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
