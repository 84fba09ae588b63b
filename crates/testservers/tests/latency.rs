//! Relay overhead, measured (not asserted): run with
//! `cargo test --release -p mcpbox-testservers --test latency -- --ignored --nocapture`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use harness::*;
use mcpbox_gateway::Secrets;
use serde_json::json;

const CALLS: usize = 3000;

fn report(label: &str, mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    let median = samples[samples.len() / 2];
    let p99 = samples[samples.len() * 99 / 100];
    let total: Duration = samples.iter().sum();
    println!(
        "{label:>8}: median {:>7.1} µs  p99 {:>7.1} µs  {:>8.0} calls/s",
        median.as_secs_f64() * 1e6,
        p99.as_secs_f64() * 1e6,
        samples.len() as f64 / total.as_secs_f64()
    );
    median
}

fn call_line(i: usize) -> String {
    json!({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": "echo", "arguments": {"text": "hello world"}}}).to_string()
}

#[test]
#[ignore = "measurement, not a test"]
fn relay_latency_report() {
    // direct
    let mut child = Command::new(bin("plain"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let mut direct = Vec::with_capacity(CALLS);
    for i in 0..CALLS {
        let msg = call_line(i);
        let t = Instant::now();
        stdin.write_all(msg.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
        line.clear();
        stdout.read_line(&mut line).unwrap();
        direct.push(t.elapsed());
    }
    drop(stdin);
    child.wait().unwrap();
    let d = report("direct", direct);

    // through the relay, with a policy, a secret to redact and an audit sink
    let mut host = start(
        "plain",
        &[],
        |r| {
            r.policy(Arc::new(Rules(vec![(
                "delete_*",
                mcpbox_gateway::Verdict::Deny,
            )])))
            .secrets(Secrets::from_pairs([("TOKEN", "a-secret-value-123456")]))
        },
        config(),
    );
    host.init(json!({}));
    let mut relayed = Vec::with_capacity(CALLS);
    for i in 0..CALLS {
        let msg = call_line(i + 1);
        let t = Instant::now();
        host.send(&msg);
        host.recv_line();
        relayed.push(t.elapsed());
    }
    host.close();
    let r = report("relay", relayed);
    println!(
        "   added: {:.1} µs at the median",
        (r.as_secs_f64() - d.as_secs_f64()) * 1e6
    );
}

fn vm_hwm_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
#[ignore = "measurement, not a test"]
fn relay_memory_report() {
    let before = vm_hwm_kib();
    let mut host = start("flood", &[], |r| r, config());
    host.init(json!({}));
    let r = host.call(1, "big", json!({"mib": 64, "char": "a"}));
    let len = r["result"]["content"][0]["text"].as_str().unwrap().len();
    host.close();
    println!(
        "64 MiB result -> {len} bytes to the host; peak RSS of the test process {} MiB (before {} MiB)",
        vm_hwm_kib() / 1024,
        before / 1024
    );
}
