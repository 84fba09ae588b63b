//! CPU cost of the session core per tools/call round trip, measured (not
//! asserted): `cargo test --release -p mcpbox-gateway --test core_cost --
//! --ignored --nocapture`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use mcpbox_gateway::lines::Line;
use mcpbox_gateway::session::{Event, Now, Session};
use mcpbox_gateway::{AllowAll, Config, Secrets};

#[test]
#[ignore = "measurement, not a test"]
fn session_core_cost_per_call() {
    let secrets = Secrets::from_pairs([("TOKEN", "a-secret-value-123456")]);
    let now = || Now {
        mono: Instant::now(),
        wall: SystemTime::now(),
    };
    let mut s = Session::new(
        Config::default(),
        Arc::new(AllowAll),
        secrets.clone(),
        None,
        false,
        "nonce".into(),
        now(),
    );
    s.start(now());
    s.on(
        Event::ServerStarted {
            gen: 1,
            secrets,
            facts: serde_json::Value::Null,
        },
        now(),
    );
    const N: usize = 20_000;
    let t = Instant::now();
    for i in 0..N {
        let call = format!(
            r#"{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"name":"echo","arguments":{{"message":"x"}}}}}}"#
        );
        let answer = format!(
            r#"{{"jsonrpc":"2.0","id":{i},"result":{{"content":[{{"type":"text","text":"Echo: x"}}]}}}}"#
        );
        let a = s.on(Event::Host(Line::Data(call.into_bytes())), now());
        let b = s.on(
            Event::Server {
                gen: 1,
                line: Line::Data(answer.into_bytes()),
            },
            now(),
        );
        assert!(!a.is_empty() && !b.is_empty());
    }
    let per = t.elapsed() / N as u32;
    println!(
        "session core: {:.2} µs per tools/call round trip",
        per.as_secs_f64() * 1e6
    );
}
