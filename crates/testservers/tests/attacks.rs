//! The relay against hostile servers and hostile hosts, named after the
//! attack each test tries.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod harness;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use harness::*;
use mcpbox_audit::Kind;
use mcpbox_gateway::{
    digest::json_digest, Config, Decision, EndReason, Reason, Secrets, ToolHints, ToolPolicy,
    Verdict, CODE_CALL_TIMEOUT, CODE_SERVER_EXITED,
};
use serde_json::{json, Value};

fn rules(
    r: Vec<(&'static str, Verdict)>,
) -> impl FnOnce(mcpbox_gateway::Relay) -> mcpbox_gateway::Relay {
    move |relay| relay.policy(Arc::new(Rules(r)))
}

#[test]
fn denied_tool_never_reaches_server() {
    let mut host = start(
        "plain",
        &[],
        rules(vec![("delete_*", Verdict::Deny)]),
        config(),
    );
    host.init(json!({}));
    let r = host.call(1, "delete_all", json!({"everything": true}));
    assert_eq!(r["result"]["isError"], json!(true));
    let text = r["result"]["content"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("delete_all") && text.contains(RULE_REASON),
        "{text}"
    );
    assert_eq!(decision_meta(&r)["reason"], json!(RULE_REASON));
    assert_eq!(
        decision_meta(&r)["source"],
        json!("policy:tools.\"delete_*\"")
    );
    let calls = history(&mut host, 2);
    assert!(calls.iter().all(|c| c["name"] != "delete_all"), "{calls:?}");
    host.close();
}

#[test]
fn denied_tool_hidden_from_list() {
    let mut host = start(
        "plain",
        &[],
        rules(vec![("delete_*", Verdict::Deny)]),
        config(),
    );
    host.init(json!({}));
    let tools = names(&host.list(1));
    assert!(!tools.contains(&"delete_all".to_string()), "{tools:?}");
    assert!(tools.contains(&"echo".to_string()));
    host.close();
}

/// A naive policy that trusts the server's `readOnlyHint`.
struct TrustsHints;
impl ToolPolicy for TrustsHints {
    fn decide(&self, _tool: &str, hints: &ToolHints) -> Decision {
        if hints.read_only == Some(true) {
            Decision::allow(Reason::ToolRule, "policy:annotations")
        } else {
            Decision::deny(Reason::ToolDefault, "policy:tools.default")
        }
    }
}

#[test]
fn destructive_annotation_cannot_loosen_policy() {
    // plain's delete_all claims readOnlyHint=true, destructiveHint=false
    let mut host = start("plain", &[], |r| r.policy(Arc::new(TrustsHints)), config());
    host.init(json!({}));
    let tools = names(&host.list(1));
    assert!(
        !tools.contains(&"delete_all".to_string()),
        "a lying annotation made the tool visible: {tools:?}"
    );
    let r = host.call(2, "delete_all", json!({}));
    assert_eq!(r["result"]["isError"], json!(true));
    assert_eq!(
        decision_meta(&r)["reason"],
        json!(Reason::ToolDefault.as_str())
    );
    host.close();
    // and the call never reached the server
}

#[test]
fn approve_without_elicitation_is_denied_with_reason() {
    let mut host = start(
        "plain",
        &[],
        rules(vec![("write_*", Verdict::Approve)]),
        config(),
    );
    host.init(json!({}));
    let r = host.call(1, "write_file", json!({"path": "x"}));
    assert_eq!(r["result"]["isError"], json!(true));
    assert_eq!(decision_meta(&r)["reason"], json!("approval.required"));
    assert!(r["result"]["content"][0]["text"]
        .as_str()
        .unwrap()
        .contains("approval"));
    assert!(history(&mut host, 2).is_empty());
    host.close();
}

fn answer_elicitation(host: &mut Host, expect_digest: &str, answer: Value) {
    let req = host.recv();
    assert_eq!(req["method"], json!("elicitation/create"), "{req}");
    let msg = req["params"]["message"].as_str().unwrap();
    assert!(
        msg.contains("write_file") && msg.contains(expect_digest) && msg.contains("expires"),
        "{msg}"
    );
    assert_eq!(
        req["params"]["requestedSchema"]["properties"]["approve"]["type"],
        json!("boolean")
    );
    host.send_value(&json!({"jsonrpc": "2.0", "id": req["id"], "result": answer}));
}

#[test]
fn approve_via_elicitation_forwards_only_that_call() {
    let mut host = start(
        "plain",
        &[],
        rules(vec![("write_*", Verdict::Approve)]),
        config(),
    );
    host.init(json!({"elicitation": {}}));
    let args_a = json!({"path": "a", "text": "A"});
    host.send_value(&json!({"jsonrpc": "2.0", "id": 10, "method": "tools/call", "params": {"name": "write_file", "arguments": args_a}}));
    answer_elicitation(
        &mut host,
        &json_digest(&args_a),
        json!({"action": "accept", "content": {"approve": true}}),
    );
    let r = host.wait_for(&json!(10));
    assert_eq!(r["result"]["content"][0]["text"], json!("A"), "{r}");

    let args_b = json!({"path": "b"});
    host.send_value(&json!({"jsonrpc": "2.0", "id": 11, "method": "tools/call", "params": {"name": "write_file", "arguments": args_b}}));
    answer_elicitation(
        &mut host,
        &json_digest(&args_b),
        json!({"action": "decline"}),
    );
    let r = host.wait_for(&json!(11));
    assert_eq!(decision_meta(&r)["reason"], json!("approval.declined"));

    host.send_value(&json!({"jsonrpc": "2.0", "id": 12, "method": "tools/call", "params": {"name": "write_file", "arguments": args_b}}));
    answer_elicitation(
        &mut host,
        &json_digest(&args_b),
        json!({"action": "accept", "content": {"approve": false}}),
    );
    let r = host.wait_for(&json!(12));
    assert_eq!(r["result"]["isError"], json!(true));

    let calls = history(&mut host, 13);
    assert_eq!(
        calls,
        vec![json!({"name": "write_file", "arguments": args_a})]
    );
    host.close();
}

fn pin_config(dir: &std::path::Path) -> Config {
    Config {
        pin_file: Some(dir.join("pins.json")),
        ..config()
    }
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("mcpbox-ts-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn rug_pull_changed_description_is_withheld() {
    let dir = temp_dir("rugpull");
    let mut host = plain_start("rugpull", pin_config(&dir));
    host.init(json!({}));
    assert_eq!(names(&host.list(1)), vec!["add", "echo"]);
    let second = host.list(2);
    assert_eq!(
        names(&second),
        vec!["echo"],
        "changed and new tools must be withheld"
    );
    let r = host.call(3, "add", json!({"a": 1, "b": 2}));
    assert_eq!(r["result"]["isError"], json!(true));
    assert_eq!(decision_meta(&r)["reason"], json!("pin.changed"));
    let r = host.call(4, "echo", json!({"text": "still fine"}));
    assert_eq!(r["result"]["content"][0]["text"], json!("still fine"));
    host.close();
    let pending = mcpbox_gateway::pending_path(&dir.join("pins.json"));
    assert!(
        pending.exists(),
        "pending pins written for `mcpbox pin accept`"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn new_tool_after_pin_is_withheld() {
    let dir = temp_dir("newtool");
    let mut host = plain_start("rugpull", pin_config(&dir));
    host.init(json!({}));
    host.list(1);
    host.list(2);
    let r = host.call(3, "exfil", json!({"data": "x"}));
    assert_eq!(decision_meta(&r)["reason"], json!("pin.new"));
    let audit = host.audit.clone();
    host.close();
    let changes = audit.of(Kind::PinChange);
    let add = changes
        .iter()
        .find(|e| e.tool.as_deref() == Some("add"))
        .expect("pin change for add");
    assert_eq!(add.reason.as_deref(), Some("pin.changed"));
    assert!(
        add.detail["old"].is_string()
            && add.detail["new"].is_string()
            && add.detail["old"] != add.detail["new"]
    );
    let exfil = changes
        .iter()
        .find(|e| e.tool.as_deref() == Some("exfil"))
        .expect("pin change for exfil");
    assert_eq!(exfil.reason.as_deref(), Some("pin.new"));

    // accepted by configuration: the same change passes and is audited as allowed
    let mut host = plain_start(
        "rugpull",
        Config {
            accept_pin_changes: true,
            ..pin_config(&dir)
        },
    );
    host.init(json!({}));
    host.list(1);
    assert_eq!(names(&host.list(2)), vec!["add", "echo", "exfil"]);
    host.close();
    let _ = std::fs::remove_dir_all(&dir);
}

const SECRET: &str = "tok-Secret_Value+42/xyz";

fn b64(data: &[u8], url: bool, pad: bool) -> String {
    let alphabet = if url {
        &base64::alphabet::URL_SAFE
    } else {
        &base64::alphabet::STANDARD
    };
    mcpbox_gateway::redact::base64(data, alphabet, pad)
}

fn encodings() -> Vec<String> {
    let v = SECRET.as_bytes();
    let hex = mcpbox_policy::hex::encode(v);
    vec![
        SECRET.to_string(),
        b64(v, false, true),
        b64(v, true, false),
        "tok-Secret_Value%2B42%2Fxyz".to_string(),
        hex.clone(),
        hex.to_uppercase(),
        SECRET[..SECRET.len() / 2].to_string(),
        SECRET[SECRET.len() / 2..].to_string(),
    ]
}

fn secret_host() -> Host {
    start(
        "echo_secrets",
        &[],
        |r| r.secrets(Secrets::from_pairs([("SECRET_TOKEN", SECRET)])),
        config(),
    )
}

#[test]
fn secret_in_a_duplicate_result_key_never_reaches_the_host() {
    let mut host = secret_host();
    host.init(json!({}));
    host.send_value(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "leak_duplicate", "arguments": {"var": "SECRET_TOKEN"}}}));
    // the raw line: a parser that keeps the last duplicate would hide it
    let raw = host.recv_line();
    let r: Value = serde_json::from_str(&raw).unwrap();
    for e in encodings() {
        assert!(!raw.contains(&e), "{e:?} leaked in {raw}");
    }
    assert_eq!(
        r["error"]["code"],
        json!(mcpbox_gateway::CODE_INVALID_RESPONSE)
    );
    assert_eq!(r["error"]["data"]["reason"], json!("server.invalid_json"));
    host.close();
}

#[test]
fn secret_is_redacted_in_every_encoding() {
    let mut host = secret_host();
    host.init(json!({}));
    host.send_value(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "leak", "arguments": {"var": "SECRET_TOKEN"}}}));
    let raw = host.recv_line();
    for e in encodings() {
        assert!(!raw.contains(&e), "{e:?} leaked in {raw}");
    }
    let v: Value = serde_json::from_str(&raw).unwrap();
    let decoded = v.to_string();
    for e in encodings() {
        assert!(!decoded.contains(&e), "{e:?} leaked after decoding");
    }
    let texts: Vec<&str> = v["result"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts[0], "plain [REDACTED:SECRET_TOKEN]");
    assert!(texts.iter().all(|t| !t.contains("tok-")), "{texts:?}");
    assert!(
        texts[5].starts_with("stream ") && texts[5].contains("[REDACTED:SECRET_TOKEN]"),
        "{}",
        texts[5]
    );
    assert_eq!(texts[6], "split-start [REDACTED:SECRET_TOKEN]");
    assert_eq!(v["escaped"], json!("[REDACTED:SECRET_TOKEN]"));
    assert_eq!(
        v["result"]["structuredContent"]["token"],
        json!("[REDACTED:SECRET_TOKEN]")
    );

    let r = host.call(2, "leak_error", json!({"var": "SECRET_TOKEN"}));
    let msg = r["error"]["message"].as_str().unwrap();
    assert_eq!(msg, "backend refused credential [REDACTED:SECRET_TOKEN]");
    let audit = host.audit.clone();
    host.close();
    let redactions = audit.of(Kind::Redaction);
    assert!(redactions
        .iter()
        .any(|e| e.detail["secret"] == json!("SECRET_TOKEN")));
    let all = serde_json::to_string(&audit.events()).unwrap();
    for e in encodings() {
        assert!(!all.contains(&e), "audit holds {e:?}");
    }
}

#[test]
fn secret_split_across_stderr_reads_is_redacted() {
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink = lines.clone();
    let mut host = start(
        "echo_secrets",
        &[],
        move |r| {
            r.secrets(Secrets::from_pairs([("SECRET_TOKEN", SECRET)]))
                .stderr_handler(Arc::new(move |_server: &str, line: &str| {
                    sink.lock().unwrap().push(line.to_string())
                }))
        },
        config(),
    );
    host.init(json!({}));
    host.call(1, "leak", json!({"var": "SECRET_TOKEN"}));
    host.close();
    let lines = lines.lock().unwrap().clone();
    assert!(
        lines.contains(&"debug: token=[REDACTED:SECRET_TOKEN] end".to_string()),
        "{lines:?}"
    );
    for l in &lines {
        for e in encodings() {
            assert!(!l.contains(&e), "{e:?} leaked to stderr log: {l}");
        }
    }
}

#[test]
fn flood_result_is_truncated_at_char_boundary() {
    let cfg = Config {
        max_result: 1001,
        ..config()
    };
    let mut host = plain_start("flood", cfg);
    host.init(json!({}));
    let r = host.call(1, "big", json!({"mib": 2, "char": "é"}));
    let text = r["result"]["content"][0]["text"].as_str().unwrap();
    let (kept, marker) = text.rsplit_once('\n').unwrap();
    assert_eq!(
        kept.len(),
        1000,
        "cut lands on the char boundary below the limit"
    );
    assert!(kept.chars().all(|c| c == 'é'));
    assert_eq!(
        marker,
        format!("[mcpbox: truncated {} bytes]", 2 * 1024 * 1024 - 1000)
    );
    let audit = host.audit.clone();
    host.close();
    let call = audit.of(Kind::ToolCall).into_iter().next().unwrap();
    assert!(
        call.result_bytes.unwrap() > 2 * 1024 * 1024,
        "audit records the size the server sent"
    );
}

#[test]
fn over_long_line_is_refused_without_growing_memory() {
    let cfg = Config {
        max_line: 1024 * 1024,
        ..config()
    };
    let mut host = plain_start("plain", cfg);
    host.init(json!({}));
    let mut writer = host.sock.try_clone().unwrap();
    let feeder = std::thread::spawn(move || {
        let chunk = vec![b'x'; 1024 * 1024];
        writer.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":99,\"method\":\"tools/call\",\"params\":{\"name\":\"echo\",\"arguments\":{\"text\":\"").unwrap();
        for _ in 0..100 {
            writer.write_all(&chunk).unwrap();
        }
        writer.write_all(b"\"}}}\n").unwrap();
    });
    let r = host.recv();
    feeder.join().unwrap();
    assert_eq!(r["error"]["code"], json!(-32600), "{r}");
    assert_eq!(r["id"], Value::Null);
    // the relay still works, and the server never saw the line
    let r = host.call(1, "echo", json!({"text": "after"}));
    assert_eq!(r["result"]["content"][0]["text"], json!("after"));
    assert!(history(&mut host, 2)
        .iter()
        .all(|c| c["arguments"]["text"] != json!("x")));
    host.close();
}

#[test]
fn garbage_stdout_is_not_forwarded() {
    let cfg = Config {
        max_line: 1024 * 1024,
        ..config()
    };
    let mut host = plain_start("garbage", cfg);
    let init = host.init(json!({}));
    assert!(init["result"]["serverInfo"].is_object());
    assert_eq!(names(&host.list(1)), vec!["echo"]);
    let r = host.call(2, "echo", json!({"text": "hi"}));
    assert_eq!(r["result"]["content"][0]["text"], json!("hi"));
    assert!(
        host.others.is_empty(),
        "garbage reached the host: {:?}",
        host.others
    );
    let audit = host.audit.clone();
    host.close();
    let flags: Vec<_> = audit
        .of(Kind::Flag)
        .into_iter()
        .filter_map(|e| e.reason)
        .collect();
    assert!(
        flags.contains(&"server.invalid_json".to_string())
            && flags.contains(&"server.line_too_long".to_string()),
        "{flags:?}"
    );
}

#[test]
fn batch_is_refused() {
    let mut host = plain_start("plain", config());
    host.init(json!({}));
    host.send(r#"[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"batched"}}}]"#);
    let r = host.recv();
    assert_eq!(r["error"]["code"], json!(-32600));
    assert_eq!(r["id"], Value::Null);
    host.send("{not json");
    let r = host.recv();
    assert_eq!(r["error"]["code"], json!(-32700));
    assert!(
        history(&mut host, 2).is_empty(),
        "the batch never reached the server"
    );
    host.close();
}

#[test]
fn crash_mid_call_answers_in_flight_requests() {
    let mut host = plain_start("crasher", config());
    host.init(json!({}));
    host.send(r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"crash","arguments":{}}}"#);
    host.send(
        r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"echo","arguments":{}}}"#,
    );
    let mut answered = Vec::new();
    for _ in 0..2 {
        let r = host.recv();
        assert_eq!(r["error"]["code"], json!(CODE_SERVER_EXITED), "{r}");
        assert!(r["error"]["message"].as_str().unwrap().contains("status 3"));
        answered.push(r["id"].clone());
    }
    answered.sort_by_key(|v| v.as_i64());
    assert_eq!(answered, vec![json!(7), json!(8)]);
    let audit = host.audit.clone();
    let outcome = host.join();
    assert_eq!(outcome.reason, EndReason::ServerExited);
    assert_eq!(outcome.server_exit.unwrap().code, Some(3));
    assert!(audit
        .of(Kind::ServerExit)
        .iter()
        .any(|e| e.exit_status == Some(3)));
}

#[test]
fn host_eof_terminates_server() {
    // a well-behaved server exits when its stdin closes
    let mut host = plain_start("plain", config());
    host.init(json!({}));
    let outcome = host.close();
    assert_eq!(outcome.reason, EndReason::HostClosed);
    assert_eq!(outcome.server_exit.unwrap().code, Some(0));

    // a stubborn one that ignores stdin EOF and SIGTERM is killed
    let dir = temp_dir("stubborn");
    let pidfile = dir.join("pid");
    let script = format!(
        "echo $$ > {}; trap '' TERM; while :; do sleep 0.05; done",
        pidfile.display()
    );
    let host = start("sh", &["-c", &script], |r| r, config());
    let t0 = std::time::Instant::now();
    while !pidfile.exists() && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(50));
    let pid = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .to_string();
    let outcome = host.close();
    assert_eq!(outcome.server_exit.unwrap().signal, Some(9), "{outcome:?}");
    let group: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("stat")).ok())
        .filter(|stat| {
            let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
            let fields: Vec<&str> = rest.split_whitespace().collect();
            // a zombie is dead already, only waiting for init to reap it
            fields.first() != Some(&"Z") && fields.get(2) == Some(&pid.as_str())
        })
        .collect();
    assert!(
        group.is_empty(),
        "processes of the server's group survive: {group:?}"
    );
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "server process {pid} still exists"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unknown_methods_pass_through_unchanged() {
    let mut host = plain_start("plain", config());
    host.init(json!({}));
    let params = json!({"_meta": {"progressToken": "p1", "vendor/k": {"z": 1, "a": [true, null]}}, "x": [1, 2.5, {"y": "z"}]});
    host.send_value(
        &json!({"jsonrpc": "2.0", "id": "u1", "method": "vendor/custom", "params": params}),
    );
    let progress = host.recv_line();
    let expected = json!({"jsonrpc": "2.0", "method": "notifications/progress",
        "params": {"progressToken": "p1", "progress": 1, "total": 2, "_meta": {"vendor/x": [1, "two"]}}});
    assert_eq!(
        progress,
        serde_json::to_string(&expected).unwrap(),
        "notification bytes changed"
    );
    let r = host.wait_for(&json!("u1"));
    assert_eq!(
        r["result"],
        json!({"method": "vendor/custom", "params": params})
    );
    // an unknown notification from the host reaches the server without breaking anything
    host.send(r#"{"jsonrpc":"2.0","method":"notifications/vendor","params":{"k":1}}"#);
    let r = host.request(json!(2), "ping", json!({}));
    assert_eq!(r["result"], json!({}));
    host.close();
}

#[test]
fn server_to_client_request_is_relayed() {
    let mut host = plain_start("plain", config());
    host.init(json!({"roots": {}}));
    host.send(r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"ask_client","arguments":{}}}"#);
    let req = host.recv();
    assert_eq!(req["method"], json!("roots/list"));
    assert_eq!(req["params"]["_meta"]["x-test"], json!(1));
    host.send_value(&json!({"jsonrpc": "2.0", "id": req["id"], "result": {"roots": [{"uri": "file:///w", "name": "w"}]}}));
    let r = host.wait_for(&json!(3));
    assert!(
        r["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("file:///w"),
        "{r}"
    );
    host.close();
}

#[test]
fn poisoned_description_is_stripped_and_flagged() {
    let mut host = plain_start("poisoned", config());
    let init = host.init(json!({}));
    let instructions = init["result"]["instructions"].as_str().unwrap();
    assert!(!instructions.contains('\u{1b}'), "{instructions:?}");
    let tools = host.list(1);
    let weather = &tools[0];
    let desc = weather["description"].as_str().unwrap();
    let bad = |c: char| {
        c == '\u{1b}'
            || c == '\u{7}'
            || ('\u{200b}'..='\u{200f}').contains(&c)
            || ('\u{202a}'..='\u{202e}').contains(&c)
            || ('\u{2066}'..='\u{2069}').contains(&c)
            || c == '\u{feff}'
            || ('\u{e0000}'..='\u{e007f}').contains(&c)
    };
    assert!(!desc.chars().any(bad), "{desc:?}");
    assert!(desc.starts_with("Gets the weather."));
    let prop = weather["inputSchema"]["properties"]["city"]["description"]
        .as_str()
        .unwrap();
    assert_eq!(prop, "City name");
    let r = host.call(2, "colors", json!({}));
    assert_eq!(r["result"]["content"][0]["text"], json!("red link done"));
    let audit = host.audit.clone();
    host.close();
    let flags = audit.of(Kind::Flag);
    let weather_rules: Vec<String> = flags
        .iter()
        .filter(|e| e.tool.as_deref() == Some("weather"))
        .filter_map(|e| e.reason.clone())
        .collect();
    for rule in [
        "instruction.override",
        "instruction.credential_access",
        "text.terminal_escape",
        "text.invisible_unicode",
    ] {
        assert!(
            weather_rules.contains(&rule.to_string()),
            "missing {rule}: {weather_rules:?}"
        );
    }
    assert!(flags
        .iter()
        .any(|e| e.tool.is_none() && e.reason.as_deref() == Some("instruction.conceal")));
    let all = serde_json::to_string(&audit.events()).unwrap();
    assert!(
        !all.contains("id_rsa"),
        "flags carry rule names, not the text"
    );
}

#[test]
fn look_alike_tool_names_are_withheld_and_a_call_to_one_never_reaches_the_server() {
    let mut host = start(
        "poisoned",
        &[],
        rules(vec![("deploy", Verdict::Deny)]),
        config(),
    );
    host.init(json!({}));
    let listed = names(&host.list(1));
    assert_eq!(
        listed,
        vec!["weather", "colors"],
        "only the plain names: {listed:?}"
    );
    for (i, look_alike) in [
        "d\u{435}ploy",
        "\u{ff44}\u{ff45}\u{ff50}\u{ff4c}\u{ff4f}\u{ff59}",
        "deploy\u{200b}",
    ]
    .into_iter()
    .enumerate()
    {
        let r = host.call(10 + i as i64, look_alike, json!({}));
        let text = r.to_string();
        assert!(
            !text.contains("deployed"),
            "{look_alike:?} reached the server: {r}"
        );
        assert_eq!(
            decision_meta(&r)["reason"],
            json!("tool.name_invalid"),
            "{r}"
        );
    }
    let r = host.call(20, "deploy", json!({}));
    assert_eq!(decision_meta(&r)["reason"], json!(RULE_REASON), "{r}");
    let audit = host.audit.clone();
    host.close();
    let flagged = audit
        .of(Kind::Flag)
        .iter()
        .filter(|e| e.reason.as_deref() == Some("tool.name_invalid"))
        .count();
    assert_eq!(flagged, 3, "each look-alike flagged once");
}

#[test]
fn discover_era_request_meta_capabilities_are_honoured() {
    let mut host = start(
        "plain",
        &[],
        rules(vec![("write_*", Verdict::Approve)]),
        config(),
    );
    let meta = |caps: Value| json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": caps});
    let d = host.request(
        json!(1),
        "server/discover",
        json!({"_meta": meta(json!({}))}),
    );
    assert!(d["result"]["supportedVersions"]
        .as_array()
        .unwrap()
        .contains(&json!("2026-07-28")));
    let args = json!({"path": "p", "text": "T"});
    // a host of this revision takes no request of ours: the approval's form
    // comes back as an input-required result, answered in the retry
    let caps = json!({"elicitation": {"form": {}}});
    let r = host.request(
        json!(2),
        "tools/call",
        json!({"name": "write_file", "arguments": args, "_meta": meta(caps.clone())}),
    );
    assert_eq!(r["result"]["resultType"], "input_required", "{r}");
    let state = r["result"]["requestState"].as_str().unwrap().to_string();
    let form = &r["result"]["inputRequests"][&state];
    assert_eq!(form["method"], "elicitation/create", "{r}");
    assert!(form["params"]["message"]
        .as_str()
        .unwrap()
        .contains(&json_digest(&args)));
    let r = host.request(
        json!(22),
        "tools/call",
        json!({"name": "write_file", "arguments": args, "_meta": meta(caps),
               "requestState": state,
               "inputResponses": {&state: {"action": "accept", "content": {"approve": true}}}}),
    );
    assert_eq!(r["result"]["content"][0]["text"], json!("T"));
    // the next request declares no elicitation: nothing carries over
    let r = host.request(
        json!(3),
        "tools/call",
        json!({"name": "write_file", "arguments": args, "_meta": meta(json!({}))}),
    );
    assert_eq!(decision_meta(&r)["reason"], json!("approval.required"));
    host.close();
}

#[test]
fn audit_records_call_without_arguments() {
    let mut host = plain_start("plain", config());
    host.init(json!({}));
    let args = json!({"text": "very-private-argument-xyz"});
    host.call(1, "echo", args.clone());
    let audit = host.audit.clone();
    host.close();
    let call = audit.of(Kind::ToolCall).into_iter().next().unwrap();
    assert_eq!(call.tool.as_deref(), Some("echo"));
    assert_eq!(call.decision, Some(mcpbox_gateway::Verdict::Allow));
    assert_eq!(
        call.args_digest.as_deref(),
        Some(json_digest(&args).as_str())
    );
    assert!(call.result_bytes.unwrap() > 0 && call.duration_ms.is_some());
    assert_eq!(
        (
            call.sandbox_id.as_str(),
            call.workspace_id.as_str(),
            call.server.as_str()
        ),
        ("sb-1", "ws-1", "test")
    );
    assert!(!audit.of(Kind::SessionStart).is_empty() && !audit.of(Kind::SessionEnd).is_empty());
    assert!(audit
        .of(Kind::ServerExit)
        .iter()
        .any(|e| e.exit_status == Some(0)));
    let all = serde_json::to_string(&audit.events()).unwrap();
    assert!(!all.contains("very-private-argument-xyz"));
}

#[test]
fn slow_call_times_out_and_server_is_told_to_cancel() {
    let cfg = Config {
        call_timeout: Some(Duration::from_millis(150)),
        ..config()
    };
    let mut host = plain_start("plain", cfg);
    host.init(json!({}));
    let r = host.call(1, "sleep", json!({"ms": 400}));
    assert_eq!(r["error"]["code"], json!(CODE_CALL_TIMEOUT), "{r}");
    // the late answer is dropped, the session goes on (the test server is
    // single-threaded: let it finish sleeping first)
    std::thread::sleep(Duration::from_millis(400));
    let r = host.call(2, "echo", json!({"text": "next"}));
    assert_eq!(r["result"]["content"][0]["text"], json!("next"), "{r}");
    assert!(host.others.is_empty(), "{:?}", host.others);
    host.close();
}

#[test]
fn credential_shaped_result_is_flagged_and_redacted() {
    let mut host = plain_start("plain", config());
    host.init(json!({}));
    let token = format!("ghp_{}", "A1b2".repeat(9));
    let r = host.call(1, "echo", json!({"text": format!("here: {token}")}));
    assert_eq!(
        r["result"]["content"][0]["text"],
        json!("here: [REDACTED:credential]")
    );
    let audit = host.audit.clone();
    host.close();
    assert!(audit
        .of(Kind::Flag)
        .iter()
        .any(|e| e.reason.as_deref() == Some("credential.github")));
}

#[test]
fn expired_secret_restarts_server_between_calls_with_fresh_value() {
    use mcpbox_gateway::{Secret, SecretSource};
    let source =
        SecretSource::Command(vec!["sh".into(), "-c".into(), "echo fresh-$$-value".into()]);
    let secrets = Secrets(vec![Secret {
        name: "ROTATING".into(),
        value: "first-rotating-value".into(),
        ttl: Some(Duration::from_millis(150)),
        source: Some(source),
        placeholder: None,
    }]);
    let mut host = start("echo_secrets", &[], move |r| r.secrets(secrets), config());
    host.init(json!({}));
    let r = host.call(1, "leak", json!({"var": "ROTATING"}));
    assert_eq!(
        r["result"]["content"][0]["text"],
        json!("plain [REDACTED:ROTATING]")
    );
    std::thread::sleep(Duration::from_millis(400));
    let r = host.call(2, "leak", json!({"var": "ROTATING"}));
    let text = r["result"]["content"][0]["text"].as_str().unwrap();
    assert_eq!(
        text, "plain [REDACTED:ROTATING]",
        "the fresh value is injected and redacted too"
    );
    assert!(
        host.others.is_empty(),
        "replayed handshake leaked to the host: {:?}",
        host.others
    );
    let audit = host.audit.clone();
    let outcome = host.close();
    assert!(outcome.launches >= 2, "{outcome:?}");
    assert!(audit
        .of(Kind::ServerExit)
        .iter()
        .any(|e| e.reason.as_deref() == Some("secret.ttl_restart")));
}

#[test]
fn result_over_max_line_is_cut_while_streaming() {
    let cfg = Config {
        max_line: 1024 * 1024,
        max_result: 4096,
        ..config()
    };
    let mut host = plain_start("flood", cfg);
    host.init(json!({}));
    let r = host.call(1, "big", json!({"mib": 8, "char": "é"}));
    let text = r["result"]["content"][0]["text"].as_str().unwrap();
    let (kept, marker) = text.split_once('\n').unwrap();
    assert!(
        kept.len() <= 4096 && kept.chars().all(|c| c == 'é'),
        "{}",
        kept.len()
    );
    assert!(marker.starts_with("[mcpbox: truncated "), "{marker}");
    let audit = host.audit.clone();
    host.close();
    let call = audit.of(Kind::ToolCall).into_iter().next().unwrap();
    assert!(call.result_bytes.unwrap() > 8 * 1024 * 1024);
}

/// The driver writes to the server's stdin itself while the pipe has room
/// and queues the rest for its writer thread: a burst far larger than the
/// pipe, sent while the server is busy and not reading, must arrive whole
/// and in order (partial writes split lines mid-way here).
#[test]
fn burst_to_a_server_that_stopped_reading_arrives_whole_and_in_order() {
    let mut host = plain_start("plain", config());
    host.init(json!({}));
    host.send_value(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "sleep", "arguments": {"ms": 300}}}));
    // 160 calls of ~3 KiB (odd sizes): several times what a pipe holds
    const CALLS: i64 = 160;
    let text = |i: i64| format!("{i}:{}", "y".repeat(3001 + i as usize % 7));
    let mut sock = host.sock.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        for i in 0..CALLS {
            let call = json!({"jsonrpc": "2.0", "id": 100 + i, "method": "tools/call",
                "params": {"name": "echo", "arguments": {"text": text(i)}}});
            writeln!(sock, "{call}").unwrap();
        }
    });
    assert_eq!(
        host.wait_for(&json!(1))["result"]["content"][0]["text"],
        "slept"
    );
    for i in 0..CALLS {
        let r = host.wait_for(&json!(100 + i));
        assert_eq!(
            r["result"]["content"][0]["text"],
            json!(text(i)),
            "call {i}"
        );
    }
    sender.join().unwrap();
    let seen: Vec<String> = history(&mut host, 9999)
        .iter()
        .filter(|c| c["name"] == "echo")
        .map(|c| c["arguments"]["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(seen, (0..CALLS).map(text).collect::<Vec<_>>());
    host.close();
}
