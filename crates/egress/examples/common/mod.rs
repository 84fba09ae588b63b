//! What the egress benchmarks share: a policy that allows `bench.test`
//! (mapped to 127.0.0.1, so the address guard lets it through), an audit
//! sink that keeps nothing, the proxy made of them, and the upstreams'
//! bulk body.

use std::io::Write;
use std::net::IpAddr;
use std::sync::Arc;

use mcpbox_audit::{Event, Sink};
use mcpbox_egress::{DenyAllApprover, EgressPolicy, Ids, Proxy, SystemConnector, SystemResolver};
use mcpbox_policy::{Decision, Reason};

/// Allows `bench.test` only, mapped to 127.0.0.1.
pub struct Bench;

impl EgressPolicy for Bench {
    fn decide(&self, host: &str, _port: u16) -> Decision {
        if host == "bench.test" {
            Decision::allow(Reason::NetworkAllow, "bench")
        } else {
            Decision::deny(Reason::NetworkUnlisted, "bench")
        }
    }
    fn mapped_address(&self, host: &str) -> Option<IpAddr> {
        (host == "bench.test").then(|| IpAddr::from([127, 0, 0, 1]))
    }
}

/// Drops every record (the benchmarks measure the proxy, not the audit).
pub struct NullSink;

impl Sink for NullSink {
    fn record(&self, event: Event) {
        std::hint::black_box(event);
    }
}

/// Writes `total` bytes of 0xa5 to `w` in pieces of `piece` bytes; stops
/// at the first error (the client went away).
pub fn send_bulk(w: &mut impl Write, total: u64, piece: usize) -> std::io::Result<()> {
    let chunk = vec![0xa5u8; piece];
    let mut left = total;
    while left > 0 {
        let n = left.min(piece as u64) as usize;
        w.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    Ok(())
}

/// The proxy both benchmarks measure: [`Bench`]'s policy, the system's
/// resolver and connector, no approver, [`NullSink`].
pub fn proxy() -> Proxy {
    Proxy::new(
        Arc::new(Bench),
        Arc::new(SystemResolver),
        Arc::new(SystemConnector::default()),
        Arc::new(DenyAllApprover),
        Arc::new(NullSink),
        Ids::default(),
    )
}
