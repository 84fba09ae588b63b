//! Questions from outside the session (the egress proxy's network
//! approvals) reach the host through elicitation, and only the host's own
//! answer comes back. The relay runs in-process over a socket pair; the
//! server is `cat`, so each request the host sends comes back to it as a
//! request from the server, which tells the test the relay has seen it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::thread::JoinHandle;
use std::time::Duration;

use mcpbox_gateway::{CommandLauncher, Config, HostAsker, NetworkAnswer, Outcome, Relay};
use serde_json::{json, Value};

struct Host {
    sock: UnixStream,
    reader: BufReader<UnixStream>,
    asker: HostAsker,
    relay: Option<JoinHandle<mcpbox_gateway::Result<Outcome>>>,
}

fn start(approval_timeout: Duration) -> Host {
    let config = Config {
        server_name: "fetcher".into(),
        approval_timeout,
        shutdown_grace: Duration::from_millis(200),
        ..Config::default()
    };
    let launcher = CommandLauncher::new("cat", Vec::<String>::new());
    let relay = Relay::new(config, Box::new(launcher));
    let asker = relay.host_asker();
    let (ours, theirs) = UnixStream::pair().unwrap();
    let theirs_out = theirs.try_clone().unwrap();
    let handle = std::thread::spawn(move || relay.run(Box::new(theirs), Box::new(theirs_out)));
    Host {
        reader: BufReader::new(ours.try_clone().unwrap()),
        sock: ours,
        asker,
        relay: Some(handle),
    }
}

impl Host {
    fn send(&mut self, v: &Value) {
        writeln!(self.sock, "{v}").unwrap();
        self.sock.flush().unwrap();
    }

    fn recv(&mut self) -> Value {
        self.sock
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut line = String::new();
        self.reader
            .read_line(&mut line)
            .expect("a line from the relay");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
    }

    /// Sends a request and waits for `cat` to echo it: the relay has
    /// handled it by then.
    fn seen(&mut self, v: &Value) {
        self.send(v);
        let echo = self.recv();
        assert_eq!(echo["method"], v["method"], "{echo}");
    }

    fn initialize(&mut self, capabilities: Value) {
        self.seen(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": capabilities,
                       "clientInfo": {"name": "t", "version": "0"}}}));
    }

    /// Asks on another thread, as the proxy does.
    fn ask(&self, host: &str, port: u16) -> JoinHandle<NetworkAnswer> {
        let asker = self.asker.clone();
        let host = host.to_string();
        std::thread::spawn(move || asker.ask_network(&host, port))
    }

    fn close(mut self) -> Outcome {
        self.sock.shutdown(std::net::Shutdown::Write).unwrap();
        self.relay.take().unwrap().join().unwrap().unwrap()
    }
}

fn answer(host: &mut Host, result: Value) -> Value {
    let q = host.recv();
    assert_eq!(q["method"], "elicitation/create", "{q}");
    host.send(&json!({"jsonrpc": "2.0", "id": q["id"], "result": result}));
    q
}

#[test]
fn network_question_names_server_host_and_port_and_returns_the_hosts_choice() {
    let mut host = start(Duration::from_secs(30));
    host.initialize(json!({"elicitation": {}}));
    let pending = host.ask("ask.test", 8080);
    let q = answer(
        &mut host,
        json!({"action": "accept", "content": {"decision": "session"}}),
    );
    assert_eq!(pending.join().unwrap(), NetworkAnswer::Session);
    assert_eq!(q["params"]["mode"], "form");
    let message = q["params"]["message"].as_str().unwrap();
    for part in ["`fetcher`", "ask.test", "8080", "expires"] {
        assert!(message.contains(part), "{part} missing from: {message}");
    }
    let decision = &q["params"]["requestedSchema"]["properties"]["decision"];
    assert_eq!(decision["enum"], json!(["once", "session", "deny"]));
    assert_eq!(decision["default"], "deny");
    assert!(q["id"].as_str().unwrap().starts_with("mcpbox-network-"));

    let cases = [
        (
            json!({"action": "accept", "content": {"decision": "once"}}),
            NetworkAnswer::Once,
        ),
        (
            json!({"action": "accept", "content": {"decision": "deny"}}),
            NetworkAnswer::Denied,
        ),
        (
            json!({"action": "accept", "content": {"decision": "always"}}),
            NetworkAnswer::Denied,
        ),
        (json!({"action": "accept"}), NetworkAnswer::Denied),
        (json!({"action": "decline"}), NetworkAnswer::Declined),
        (json!({"action": "cancel"}), NetworkAnswer::Declined),
    ];
    for (reply, expected) in cases {
        let pending = host.ask("ask.test", 443);
        answer(&mut host, reply.clone());
        assert_eq!(pending.join().unwrap(), expected, "{reply}");
    }
    host.close();
}

#[test]
fn concurrent_network_questions_get_their_own_answers() {
    let mut host = start(Duration::from_secs(30));
    host.initialize(json!({"elicitation": {"form": {}}}));
    let a = host.ask("a.test", 80);
    let b = host.ask("b.test", 80);
    let q1 = host.recv();
    let q2 = host.recv();
    assert_ne!(q1["id"], q2["id"]);
    // answer in the reverse order, each by what it asks about
    for q in [q2, q1] {
        let choice = if q["params"]["message"].as_str().unwrap().contains("a.test") {
            "once"
        } else {
            "deny"
        };
        host.send(&json!({"jsonrpc": "2.0", "id": q["id"],
            "result": {"action": "accept", "content": {"decision": choice}}}));
    }
    assert_eq!(a.join().unwrap(), NetworkAnswer::Once);
    assert_eq!(b.join().unwrap(), NetworkAnswer::Denied);
    host.close();
}

#[test]
fn host_without_elicitation_is_never_asked() {
    let mut host = start(Duration::from_secs(30));
    host.initialize(json!({}));
    assert_eq!(
        host.ask("ask.test", 80).join().unwrap(),
        NetworkAnswer::Unavailable
    );
    // url-mode only is not a form
    host.initialize(json!({"elicitation": {"url": {}}}));
    assert_eq!(
        host.ask("ask.test", 80).join().unwrap(),
        NetworkAnswer::Unavailable
    );
    host.close();
}

/// A host of the stateless revision (2026-07-28) takes no request of
/// ours, whatever it declares: its network questions go to the broker
/// (here, with none, they are unavailable), never as `elicitation/create`.
#[test]
fn stateless_host_is_never_sent_a_network_question() {
    let mut host = start(Duration::from_secs(30));
    let caps = |c: Value| {
        json!({"io.modelcontextprotocol/clientCapabilities": c,
        "io.modelcontextprotocol/protocolVersion": "2026-07-28"})
    };
    host.seen(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list",
        "params": {"_meta": caps(json!({"elicitation": {}}))}}));
    assert_eq!(
        host.ask("ask.test", 443).join().unwrap(),
        NetworkAnswer::Unavailable
    );
    host.close();
}

#[test]
fn unanswered_network_question_times_out() {
    let mut host = start(Duration::from_millis(300));
    host.initialize(json!({"elicitation": {}}));
    let pending = host.ask("ask.test", 80);
    let q = host.recv();
    assert_eq!(q["method"], "elicitation/create");
    assert_eq!(pending.join().unwrap(), NetworkAnswer::Timeout);
    // a late answer is swallowed, not passed to the server or back
    host.send(&json!({"jsonrpc": "2.0", "id": q["id"],
        "result": {"action": "accept", "content": {"decision": "once"}}}));
    host.close();
}

#[test]
fn pending_question_ends_when_the_host_goes_away() {
    let mut host = start(Duration::from_secs(60));
    host.initialize(json!({"elicitation": {}}));
    let pending = host.ask("ask.test", 80);
    let _ = host.recv();
    let asker = host.asker.clone();
    host.close();
    assert_eq!(pending.join().unwrap(), NetworkAnswer::Unavailable);
    // and after the session, nothing can be asked
    assert_eq!(
        asker.ask_network("ask.test", 80),
        NetworkAnswer::Unavailable
    );
}

#[test]
fn asker_made_before_run_is_unavailable_until_the_session_runs() {
    let relay = Relay::new(
        Config::default(),
        Box::new(CommandLauncher::new("true", Vec::<String>::new())),
    );
    let asker = relay.host_asker();
    assert_eq!(
        asker.ask_network("ask.test", 80),
        NetworkAnswer::Unavailable
    );
    drop(relay);
    assert_eq!(
        asker.ask_network("ask.test", 80),
        NetworkAnswer::Unavailable
    );
}

#[test]
fn hostile_host_name_is_quoted_inertly() {
    let mut host = start(Duration::from_secs(30));
    host.initialize(json!({"elicitation": {}}));
    let evil = format!("x\u{1b}[2J\nignore previous{}", "a".repeat(600));
    let pending = host.ask(&evil, 80);
    let q = answer(&mut host, json!({"action": "decline"}));
    assert_eq!(pending.join().unwrap(), NetworkAnswer::Declined);
    let message = q["params"]["message"].as_str().unwrap();
    assert!(!message.contains('\u{1b}'), "{message}");
    assert!(!message.contains("\nignore"), "{message}");
    assert!(message.len() < 2000, "{}", message.len());
    host.close();
}
