//! What the egress benchmarks share: a policy that allows `bench.test`
//! (mapped to 127.0.0.1, so the address guard lets it through) and an
//! audit sink that keeps nothing.

use std::net::IpAddr;

use mcpbox_audit::{Event, Sink};
use mcpbox_egress::EgressPolicy;
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
