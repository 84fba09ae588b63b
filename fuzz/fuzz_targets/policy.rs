//! The policy parser and the decision engines on what it returns:
//! `mcpbox_policy::parse` on arbitrary UTF-8 (convention 4: policy never
//! panics on input), then `tools.decide`, `network.decide`,
//! `network.mapped_address` and the `to_toml` round trip on every policy
//! that parses.
//!
//! Input layout: the policy text, optionally followed by a NUL and probes
//! separated by NULs. Each probe is asked as a tool name (its first byte
//! also picks the tool hints) and as a host (`host` or `host:port`). The
//! policy's own patterns and host rules are asked too, so interesting
//! names need not be guessed.
//!
//! Invariants:
//! - nothing panics;
//! - a tool decision is at least as strict as every rule matching the name
//!   (the strictest match wins), and every decision names its source;
//! - the effective policy (`to_toml`) parses again, to the same effective
//!   policy (what `mcpbox check` prints is a policy mcpbox accepts).
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use mcpbox_policy::{Decision, Policy, ToolHints};

const FILE: &str = "/fuzz/policy.toml";

fn hints(b: u8) -> ToolHints {
    let tri = |v: u8| match v & 3 {
        0 => None,
        1 => Some(false),
        _ => Some(true),
    };
    ToolHints {
        read_only: tri(b),
        destructive: tri(b >> 2),
        idempotent: tri(b >> 4),
        open_world: tri(b >> 6),
    }
}

fn check(d: &Decision) {
    assert!(!d.source.is_empty(), "a decision without a source: {d:?}");
}

fn probe(policy: &Policy, name: &str) {
    let h = hints(name.bytes().next().unwrap_or(0));
    let d = policy.tools.decide(name, &h);
    check(&d);
    // the strictest matching rule wins: no matching rule is stricter
    for r in policy.tools.rules.iter() {
        if mcpbox_policy::glob_match(&r.pattern, name) {
            assert!(
                d.verdict >= r.action,
                "{d:?} looser than {r:?} for {name:?}"
            );
        }
    }
    let _ = policy.tools.visible_in_list(name, &h);
    let (host, port) = match name.rsplit_once(':') {
        Some((h, p)) => (h, p.parse().unwrap_or(443)),
        None => (name, 443),
    };
    check(&policy.network.decide(host, port));
    let _ = policy.network.mapped_address(host);
}

fuzz_target!(|input: &[u8]| {
    let Ok(text) = std::str::from_utf8(input) else {
        return;
    };
    let (text, probes) = text.split_once('\0').unwrap_or((text, ""));
    let Ok(policy) = mcpbox_policy::parse(text, Path::new(FILE)) else {
        return;
    };
    for p in probes.split('\0') {
        probe(&policy, p);
    }
    for r in &policy.tools.rules {
        probe(&policy, &r.pattern);
    }
    for r in policy.network.allow.iter().chain(&policy.network.deny) {
        probe(&policy, &r.canonical());
    }
    let _ = policy.name();
    let _ = policy.location("tools.default");

    let printed = policy.to_toml();
    let again = match mcpbox_policy::parse(&printed, Path::new(FILE)) {
        Ok(p) => p,
        Err(e) => panic!("the effective policy does not parse again: {e}\n{printed}"),
    };
    assert_eq!(
        again.to_toml(),
        printed,
        "the effective policy is not a fixed point"
    );
});
