//! What a hostile server writes on the wire, through `mcpbox serve` over
//! real HTTP, both endpoints and both protocol eras: secrets of digits as
//! JSON numbers and as request ids, `_meta` in mcpbox's own names, and, on
//! `/mcp`, names another server owns. Named after the attack each tries.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use common::http::Conn;
use common::mcp::holds_reserved_meta;
use common::serve::{text_of, Gateway, Mcp, Server, ALICE};
use serde_json::{json, Value};

const PIN: &str = "9071553018";
const ACCOUNT: &str = "4929123456789012345678901";
const MODERN: &str = "2026-07-28";

/// `a` and `b` are the same forger in two roles, in this order.
fn gateway() -> Gateway {
    let secrets =
        "[secrets]\nPIN = { from_env = \"T_PIN\" }\nACCOUNT = { from_env = \"T_ACCOUNT\" }\n\
                   [tools]\ndefault = \"allow\"\n";
    let a = Server {
        name: "a",
        command: vec!["@forger".into(), "a".into()],
        policy: secrets,
    };
    let b = Server {
        name: "b",
        command: vec!["@forger".into(), "b".into()],
        policy: secrets,
    };
    Gateway::start_env("", &[a, b], &[("T_PIN", PIN), ("T_ACCOUNT", ACCOUNT)])
}

/// A client of `/mcp`.
fn aggregate(gw: &Gateway) -> Mcp {
    let mut m = gw.mcp("a", Some(ALICE));
    m.path = "/mcp".into();
    m
}

/// A request of the stateless revision (2026-07-28): every message of its
/// answer.
fn modern(m: &Mcp, method: &str, mut params: Value) -> Vec<Value> {
    params["_meta"] = json!({"io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {}});
    let name = params
        .get("name")
        .or_else(|| params.get("uri"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params});
    let r = m.send_with("POST", body.to_string().as_bytes(), |h| {
        h.retain(|(k, _)| k != "Mcp-Session-Id" && k != "MCP-Protocol-Version");
        h.push(("MCP-Protocol-Version".into(), MODERN.into()));
        h.push(("Mcp-Method".into(), method.into()));
        if let Some(n) = name {
            h.push(("Mcp-Name".into(), n));
        }
    });
    assert_eq!(r.status, 200, "{method}: {}", r.text());
    r.messages()
}

/// A request of a legacy session: every message of its answer.
fn legacy(m: &mut Mcp, method: &str, params: Value) -> Vec<Value> {
    let msg = m.message(method, params);
    let r = m.post(&msg);
    assert_eq!(r.status, 200, "{method}: {}", r.text());
    r.messages()
}

#[test]
fn a_secret_of_digits_sent_as_a_json_number_never_reaches_an_http_client() {
    let gw = gateway();
    let number = json!({"name": "number", "arguments": {"var": "PIN"}});
    let long = json!({"name": "number", "arguments": {"var": "ACCOUNT"}});
    let mut m = gw.mcp("a", Some(ALICE));
    m.initialize();
    let mut agg = aggregate(&gw);
    agg.initialize();
    let mut answers = vec![
        legacy(&mut m, "tools/call", number.clone()),
        modern(&gw.mcp("a", Some(ALICE)), "tools/call", number),
        legacy(
            &mut agg,
            "tools/call",
            json!({"name": "a__number", "arguments": {"var": "PIN"}}),
        ),
    ];
    for a in &answers {
        let last = a.last().unwrap();
        assert_eq!(
            last["result"]["structuredContent"]["pin"], "[REDACTED:PIN]",
            "{a:?}"
        );
    }
    answers.push(legacy(&mut m, "tools/call", long.clone()));
    answers.push(modern(&gw.mcp("a", Some(ALICE)), "tools/call", long));
    for a in &answers {
        let text = serde_json::to_string(a).unwrap();
        assert!(!text.contains(PIN), "the PIN reached the client: {text}");
        assert!(
            !text.contains(&ACCOUNT[..12]),
            "account digits reached the client: {text}"
        );
    }
    assert_eq!(
        answers[3].last().unwrap()["error"]["data"]["reason"],
        "redaction.refused"
    );
    // as the id of the server's request, which the client answers
    let call = m.message(
        "tools/call",
        json!({"name": "ask_number_id", "arguments": {"var": "PIN"}}),
    );
    let mut c = Conn::open(gw.port);
    c.write(&m.bytes_with(call.to_string().as_bytes(), |_| {}))
        .unwrap();
    let head = c.head().unwrap();
    assert_eq!(head.status, 200);
    let ask = c.event().unwrap().expect("the server's request");
    assert_eq!(ask["method"], "sampling/createMessage", "{ask}");
    assert!(!ask.to_string().contains(PIN), "the PIN as an id: {ask}");
    let reply = json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"role": "assistant",
        "content": {"type": "text", "text": "ok"}, "model": "m"}});
    assert_eq!(m.post(&reply).status, 202);
    let answer = c.event().unwrap().expect("the answer");
    assert_eq!(text_of(&answer), "answered under my own id", "{answer}");
    assert!(!gw.stderr().contains(PIN));
}

#[test]
fn a_server_cannot_forge_mcpbox_meta_through_either_endpoint_in_either_era() {
    let gw = gateway();
    let mut m = gw.mcp("a", Some(ALICE));
    m.initialize();
    let mut agg = aggregate(&gw);
    agg.initialize();
    let s = gw.mcp("a", Some(ALICE));
    let a = aggregate(&gw);
    let forge = |n: &str| json!({"name": n, "arguments": {}});
    let answers = vec![
        (
            "legacy /servers",
            legacy(&mut m, "tools/call", forge("forge_meta")),
        ),
        (
            "legacy /servers error",
            legacy(&mut m, "tools/call", forge("forge_meta_error")),
        ),
        (
            "legacy /mcp",
            legacy(&mut agg, "tools/call", forge("a__forge_meta")),
        ),
        (
            "legacy /mcp error",
            legacy(&mut agg, "tools/call", forge("a__forge_meta_error")),
        ),
        (
            "stateless /servers",
            modern(&s, "tools/call", forge("forge_meta")),
        ),
        (
            "stateless /servers error",
            modern(&s, "tools/call", forge("forge_meta_error")),
        ),
        (
            "stateless /mcp",
            modern(&a, "tools/call", forge("a__forge_meta")),
        ),
        (
            "stateless /mcp error",
            modern(&a, "tools/call", forge("a__forge_meta_error")),
        ),
    ];
    for (how, messages) in &answers {
        for msg in messages {
            assert!(
                !holds_reserved_meta(msg),
                "{how}: forged _meta reached the client: {msg}"
            );
            assert!(!msg.to_string().contains("ap-forged"), "{how}: {msg}");
        }
        let last = messages.last().unwrap();
        if how.ends_with("error") {
            assert!(last.get("error").is_some(), "{how}: {last}");
        } else {
            assert_eq!(
                last["result"]["_meta"]["vendor/kept"], "kept",
                "{how}: {last}"
            );
        }
    }
    // the legacy answer also carried the notification and the request
    assert!(answers[0].1.len() >= 3, "{:?}", answers[0].1);
    let audit = gw.audit_until("server.reserved_meta", |e| {
        e["reason"] == "server.reserved_meta"
    });
    assert!(!audit.is_empty());
}

/// Who answered a `resources/read` or `prompts/get`.
fn read_text(messages: &[Value]) -> String {
    let last = messages.last().unwrap();
    let r = &last["result"];
    r["contents"][0]["text"]
        .as_str()
        .or_else(|| r["messages"][0]["content"]["text"].as_str())
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no text in {last}"))
}

/// The aggregate's answers as a client of either era sees them.
fn check_ownership(how: &str, mut ask: impl FnMut(&str, Value) -> Vec<Value>) {
    let list = ask("resources/list", json!({}));
    let result = &list.last().unwrap()["result"];
    let uris: Vec<&str> = result["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["uri"].as_str().unwrap())
        .collect();
    assert_eq!(
        uris.iter().filter(|u| **u == "shared://doc").count(),
        1,
        "{how}: {result}"
    );
    assert!(uris.contains(&"b://only"), "{how}: {result}");
    assert_eq!(
        result["_meta"]["mcpbox/withheld"],
        json!([{"server": "b", "uri": "shared://doc", "owner": "a"}]),
        "{how}: {result}"
    );
    let list = ask("resources/templates/list", json!({}));
    let result = &list.last().unwrap()["result"];
    let templates: Vec<&str> = result["resourceTemplates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["uriTemplate"].as_str().unwrap())
        .collect();
    assert!(
        templates.contains(&"shared://files/{path}"),
        "{how}: {result}"
    );
    assert!(templates.contains(&"b://t/{x}"), "{how}: {result}");
    assert!(
        !templates.contains(&"shared://files/secret/{name}"),
        "{how}: {result}"
    );
    assert_eq!(
        result["_meta"]["mcpbox/withheld"][0]["uriTemplate"], "shared://files/secret/{name}",
        "{how}: {result}"
    );
    // reads go to the owner: the later server's narrower template and its
    // copy of the URI take nothing
    for (uri, who) in [
        ("shared://doc", "read by a"),
        ("shared://files/secret/key", "read by a"),
        ("b://only", "read by b"),
        ("b://t/1", "read by b"),
    ] {
        let r = ask("resources/read", json!({"uri": uri}));
        assert_eq!(read_text(&r), who, "{how}: {uri}");
    }
    // subscriptions and completions of a resource go to its owner too
    let r = ask("resources/subscribe", json!({"uri": "shared://doc"}));
    assert_eq!(
        r.last().unwrap()["result"]["_meta"]["vendor/by"],
        "a",
        "{how}: {r:?}"
    );
    let r = ask(
        "completion/complete",
        json!({"ref": {"type": "ref/resource", "uri": "shared://files/secret/{name}"},
               "argument": {"name": "name", "value": ""}}),
    );
    assert_eq!(
        r.last().unwrap()["result"]["completion"]["values"][0],
        "completed by a",
        "{how}: {r:?}"
    );
    // tools and prompts of the same name are each their server's
    for (tool, who) in [("a__whoami", "tool of a"), ("b__whoami", "tool of b")] {
        let r = ask("tools/call", json!({"name": tool, "arguments": {}}));
        assert_eq!(text_of(r.last().unwrap()), who, "{how}");
    }
    for (prompt, who) in [("a__greet", "prompt of a"), ("b__greet", "prompt of b")] {
        let r = ask("prompts/get", json!({"name": prompt}));
        assert_eq!(read_text(&r), who, "{how}");
    }
}

#[test]
fn a_later_server_cannot_take_another_servers_uris_on_the_aggregate_in_either_era() {
    let gw = gateway();
    let mut agg = aggregate(&gw);
    agg.initialize();
    check_ownership("legacy", |method, params| legacy(&mut agg, method, params));
    let a = aggregate(&gw);
    check_ownership("stateless", |method, params| modern(&a, method, params));
    let audit = gw.audit_until("aggregate.name_taken", |e| {
        e["reason"] == "aggregate.name_taken"
    });
    assert!(audit.iter().any(|e| e["server"] == "b"), "{audit:?}");
}

#[test]
fn a_server_cannot_announce_changes_to_another_servers_resource_on_the_aggregate() {
    let gw = gateway();
    let mut agg = aggregate(&gw);
    agg.initialize();
    legacy(&mut agg, "resources/list", json!({}));
    let (mut c, head) = agg.open_stream();
    assert_eq!(head.status, 200);
    let update = |uri: &str| json!({"name": "b__update", "arguments": {"uri": uri}});
    legacy(&mut agg, "tools/call", update("shared://doc"));
    legacy(&mut agg, "tools/call", update("b://only"));
    let first = c.event().unwrap().expect("an update");
    assert_eq!(
        first["method"], "notifications/resources/updated",
        "{first}"
    );
    assert_eq!(
        first["params"]["uri"], "b://only",
        "b announced a's resource: {first}"
    );
}

#[test]
fn a_server_cannot_show_a_client_the_gateways_own_ids_through_either_endpoint_in_either_era() {
    // The gateway forwards a client's request under an id of its own on
    // /mcp and in the stateless revision. A server that names that id back
    // (as a listen stream's subscription id) must not make the client see
    // the gateway's id: the client gets its own back, on every endpoint.
    let gw = gateway();
    let mut m = gw.mcp("a", Some(ALICE));
    m.initialize();
    let mut agg = aggregate(&gw);
    agg.initialize();
    let s = gw.mcp("a", Some(ALICE));
    let a = aggregate(&gw);
    let call = |n: &str| json!({"name": n, "arguments": {}});
    let answers = vec![
        (
            "legacy /servers",
            legacy(&mut m, "tools/call", call("name_my_call")),
        ),
        (
            "legacy /mcp",
            legacy(&mut agg, "tools/call", call("a__name_my_call")),
        ),
        (
            "stateless /servers",
            modern(&s, "tools/call", call("name_my_call")),
        ),
        (
            "stateless /mcp",
            modern(&a, "tools/call", call("a__name_my_call")),
        ),
    ];
    for (how, messages) in &answers {
        let last = messages.last().unwrap();
        assert_eq!(text_of(last), "named", "{how}: {messages:?}");
        let id = &last["id"];
        let named: Vec<&Value> = messages
            .iter()
            .filter_map(|msg| msg.pointer("/params/_meta/io.modelcontextprotocol~1subscriptionId"))
            .collect();
        assert_eq!(named, [id], "{how}: {messages:?}");
        for msg in messages {
            assert!(
                !msg.to_string().contains("mcpbox-"),
                "{how}: the gateway's id reached the client: {msg}"
            );
        }
    }
}
