//! The conformance fixture (`src/bin/conformance.rs`) driven over stdio with
//! the requests the conformance suite's server scenarios send, checked the
//! way the suite checks them. The HTTP half (sessions, SSE, Host/Origin,
//! status codes) belongs to the gateway and is not tested here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

use serde_json::{json, Value};

struct Fixture {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<Value>,
    /// Notifications and server requests seen while waiting for responses.
    seen: Vec<Value>,
}

impl Fixture {
    fn start() -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_conformance"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout: ChildStdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let v: Value = serde_json::from_str(&line).expect("fixture wrote a non-JSON line");
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        Fixture {
            child,
            stdin,
            lines,
            seen: Vec::new(),
        }
    }

    fn legacy() -> Self {
        let mut f = Self::start();
        let r = f.rpc(
            0,
            "initialize",
            json!({"protocolVersion": "2025-11-25",
                "capabilities": {"sampling": {}, "elicitation": {}, "roots": {}},
                "clientInfo": {"name": "test", "version": "1"}}),
        );
        assert_eq!(r["result"]["protocolVersion"], "2025-11-25", "{r}");
        f.write(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        f
    }

    fn write(&mut self, v: &Value) {
        writeln!(self.stdin, "{v}").unwrap();
        self.stdin.flush().unwrap();
    }

    fn next(&mut self) -> Value {
        self.lines
            .recv_timeout(Duration::from_secs(10))
            .expect("fixture went silent")
    }

    /// Reads until the response to `id`, keeping everything else in `seen`.
    fn response(&mut self, id: &Value) -> Value {
        loop {
            let v = self.next();
            if v.get("method").is_none() && v.get("id") == Some(id) {
                return v;
            }
            self.seen.push(v);
        }
    }

    fn rpc(&mut self, id: i64, method: &str, params: Value) -> Value {
        self.write(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        self.response(&json!(id))
    }

    fn call(&mut self, id: i64, name: &str, args: Value) -> Value {
        self.rpc(id, "tools/call", json!({"name": name, "arguments": args}))
    }

    fn seen_method(&self, method: &str) -> Vec<Value> {
        self.seen
            .iter()
            .filter(|v| v["method"] == method)
            .cloned()
            .collect()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn meta(caps: Value) -> Value {
    json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": caps})
}

fn all_caps() -> Value {
    json!({"sampling": {}, "elicitation": {}, "roots": {"listChanged": true}})
}

/// A 2026-07-28 request: `params` plus the per-request `_meta`.
fn stateless(f: &mut Fixture, id: i64, method: &str, mut params: Value) -> Value {
    if params.get("_meta").is_none() {
        params["_meta"] = meta(all_caps());
    }
    f.rpc(id, method, params)
}

fn first_text(r: &Value) -> String {
    r["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn legacy_lists_carry_what_the_suite_checks() {
    let mut f = Fixture::legacy();
    let tools = f.rpc(1, "tools/list", json!({}));
    let tools = tools["result"]["tools"].as_array().unwrap();
    for t in tools {
        assert!(
            t["name"].is_string() && t["description"].is_string() && t["inputSchema"].is_object(),
            "{t}"
        );
    }
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    for n in [
        "test_simple_text",
        "test_image_content",
        "test_audio_content",
        "test_embedded_resource",
        "test_multiple_content_types",
        "test_tool_with_logging",
        "test_error_handling",
        "test_tool_with_progress",
        "test_sampling",
        "test_elicitation",
        "test_elicitation_sep1034_defaults",
        "test_elicitation_sep1330_enums",
        "json_schema_2020_12_tool",
        "test_reconnection",
    ] {
        assert!(names.contains(&n), "missing {n}");
    }
    let schema = &tools
        .iter()
        .find(|t| t["name"] == "json_schema_2020_12_tool")
        .unwrap()["inputSchema"];
    assert_eq!(
        schema["$schema"],
        "https://json-schema.org/draft/2020-12/schema"
    );
    assert!(schema["$defs"]["address"].is_object());
    assert_eq!(schema["additionalProperties"], false);

    let prompts = f.rpc(2, "prompts/list", json!({}));
    for p in prompts["result"]["prompts"].as_array().unwrap() {
        assert!(p["description"].is_string(), "{p}");
    }
    let resources = f.rpc(3, "resources/list", json!({}));
    let uris: Vec<&str> = resources["result"]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["uri"].as_str().unwrap())
        .collect();
    assert!(uris.contains(&"test://static-text") && uris.contains(&"test://static-binary"));
    assert_eq!(f.rpc(4, "ping", json!({}))["result"], json!({}));
}

#[test]
fn legacy_tool_contents() {
    let mut f = Fixture::legacy();
    assert_eq!(
        first_text(&f.call(1, "test_simple_text", json!({}))),
        "This is a simple text response for testing."
    );
    let image = f.call(2, "test_image_content", json!({}));
    assert_eq!(image["result"]["content"][0]["mimeType"], "image/png");
    let audio = f.call(3, "test_audio_content", json!({}));
    assert_eq!(audio["result"]["content"][0]["mimeType"], "audio/wav");
    let embedded = f.call(4, "test_embedded_resource", json!({}));
    let res = &embedded["result"]["content"][0]["resource"];
    assert!(res["uri"].is_string() && res["mimeType"].is_string() && res["text"].is_string());
    let mixed = f.call(5, "test_multiple_content_types", json!({}));
    let types: Vec<&str> = mixed["result"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["text", "image", "resource"]);
    // listed, so callable (the Python SDK client calls every listed tool)
    let schema = f.call(7, "json_schema_2020_12_tool", json!({"name": "x"}));
    assert!(schema["result"]["content"].is_array(), "{schema}");
    let error = f.call(6, "test_error_handling", json!({}));
    assert_eq!(error["result"]["isError"], true);
    assert!(!first_text(&error).is_empty());
}

#[test]
fn legacy_progress_notifications_rise_to_100() {
    let mut f = Fixture::legacy();
    let r = f.rpc(
        1,
        "tools/call",
        json!({"name": "test_tool_with_progress", "arguments": {},
            "_meta": {"progressToken": "progress-test-1"}}),
    );
    assert!(r["result"]["content"].is_array(), "{r}");
    let progress: Vec<f64> = f
        .seen_method("notifications/progress")
        .iter()
        .inspect(|n| assert_eq!(n["params"]["progressToken"], "progress-test-1"))
        .map(|n| n["params"]["progress"].as_f64().unwrap())
        .collect();
    assert_eq!(progress, [0.0, 50.0, 100.0]);
}

#[test]
fn legacy_logging_honours_set_level() {
    let mut f = Fixture::legacy();
    assert_eq!(
        f.rpc(1, "logging/setLevel", json!({"level": "debug"}))["result"],
        json!({})
    );
    f.call(2, "test_tool_with_logging", json!({}));
    assert_eq!(f.seen_method("notifications/message").len(), 3);
    f.seen.clear();
    f.rpc(3, "logging/setLevel", json!({"level": "error"}));
    f.call(4, "test_tool_with_logging", json!({}));
    assert!(f.seen_method("notifications/message").is_empty());
}

#[test]
fn legacy_sampling_round_trip_answers_a_ping_meanwhile() {
    let mut f = Fixture::legacy();
    f.write(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "test_sampling", "arguments": {"prompt": "Test prompt for sampling"}}}));
    let req = f.next();
    assert_eq!(req["method"], "sampling/createMessage", "{req}");
    assert_eq!(
        req["params"]["messages"][0]["content"]["text"],
        "Test prompt for sampling"
    );
    // The client may send other requests before it answers.
    let ping = f.rpc(2, "ping", json!({}));
    assert_eq!(ping["result"], json!({}));
    f.write(
        &json!({"jsonrpc": "2.0", "id": req["id"], "result": {"role": "assistant",
        "content": {"type": "text", "text": "This is a test response from the client"},
        "model": "test-model", "stopReason": "endTurn"}}),
    );
    let r = f.response(&json!(1));
    assert_eq!(
        first_text(&r),
        "LLM response: This is a test response from the client"
    );
}

#[test]
fn legacy_tool_call_during_elicitation_is_queued_not_lost() {
    let mut f = Fixture::legacy();
    f.write(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "test_elicitation", "arguments": {"message": "Please provide your information"}}}));
    let req = f.next();
    assert_eq!(req["method"], "elicitation/create");
    let props = &req["params"]["requestedSchema"]["properties"];
    assert!(props["username"].is_object() && props["email"].is_object());
    f.write(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "test_simple_text", "arguments": {}}}));
    f.write(
        &json!({"jsonrpc": "2.0", "id": req["id"], "result": {"action": "accept",
        "content": {"username": "testuser", "email": "test@example.com"}}}),
    );
    let r = f.response(&json!(1));
    assert!(first_text(&r).contains("testuser"), "{r}");
    let queued = f.response(&json!(2));
    assert!(queued["result"]["content"].is_array(), "{queued}");
}

#[test]
fn legacy_elicitation_schemas_sep1034_and_sep1330() {
    let mut f = Fixture::legacy();
    f.write(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "test_elicitation_sep1034_defaults", "arguments": {}}}));
    let req = f.next();
    let p = &req["params"]["requestedSchema"]["properties"];
    assert_eq!(p["name"]["default"], "John Doe");
    assert_eq!(p["age"]["type"], "integer");
    assert_eq!(p["age"]["default"], 30);
    assert_eq!(p["score"]["default"], 95.5);
    assert_eq!(p["status"]["default"], "active");
    assert_eq!(p["verified"]["default"], true);
    f.write(&json!({"jsonrpc": "2.0", "id": req["id"], "result": {"action": "decline"}}));
    assert!(first_text(&f.response(&json!(1))).contains("action=decline"));

    f.write(&json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "test_elicitation_sep1330_enums", "arguments": {}}}));
    let req = f.next();
    let p = &req["params"]["requestedSchema"]["properties"];
    assert!(p["untitledSingle"]["enum"].is_array() && p["untitledSingle"].get("oneOf").is_none());
    assert!(p["titledSingle"]["oneOf"][0]["title"].is_string());
    assert_eq!(
        p["legacyEnum"]["enumNames"].as_array().unwrap().len(),
        p["legacyEnum"]["enum"].as_array().unwrap().len()
    );
    assert!(p["untitledMulti"]["items"]["enum"].is_array());
    assert!(p["titledMulti"]["items"]["anyOf"][0]["const"].is_string());
    f.write(&json!({"jsonrpc": "2.0", "id": req["id"], "result": {"action": "cancel"}}));
    f.response(&json!(2));
}

#[test]
fn legacy_client_without_sampling_gets_a_tool_error() {
    let mut f = Fixture::start();
    f.rpc(
        0,
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}),
    );
    let r = f.call(1, "test_sampling", json!({"prompt": "x"}));
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert!(f.seen_method("sampling/createMessage").is_empty());
}

#[test]
fn legacy_resources_templates_prompts_completion() {
    let mut f = Fixture::legacy();
    let text = f.rpc(1, "resources/read", json!({"uri": "test://static-text"}));
    assert_eq!(text["result"]["contents"][0]["mimeType"], "text/plain");
    let bin = f.rpc(2, "resources/read", json!({"uri": "test://static-binary"}));
    assert!(bin["result"]["contents"][0]["blob"].is_string());
    let tpl = f.rpc(
        3,
        "resources/read",
        json!({"uri": "test://template/123/data"}),
    );
    assert!(tpl["result"]["contents"][0]["text"]
        .as_str()
        .unwrap()
        .contains("123"));
    let missing = f.rpc(4, "resources/read", json!({"uri": "test://nope"}));
    assert_eq!(missing["error"]["code"], -32602);
    assert_eq!(missing["error"]["data"]["uri"], "test://nope");

    assert_eq!(
        f.rpc(
            5,
            "resources/subscribe",
            json!({"uri": "test://watched-resource"})
        )["result"],
        json!({})
    );
    f.call(6, "test_update_resource", json!({}));
    let updated = f.seen_method("notifications/resources/updated");
    assert_eq!(updated.len(), 1);
    assert_eq!(updated[0]["params"]["uri"], "test://watched-resource");
    f.rpc(
        7,
        "resources/unsubscribe",
        json!({"uri": "test://watched-resource"}),
    );
    f.seen.clear();
    f.call(8, "test_update_resource", json!({}));
    assert!(f.seen_method("notifications/resources/updated").is_empty());

    let args = f.rpc(
        9,
        "prompts/get",
        json!({"name": "test_prompt_with_arguments",
            "arguments": {"arg1": "testValue1", "arg2": "testValue2"}}),
    );
    let s = args["result"]["messages"].to_string();
    assert!(s.contains("testValue1") && s.contains("testValue2"));
    let embedded = f.rpc(
        10,
        "prompts/get",
        json!({"name": "test_prompt_with_embedded_resource",
            "arguments": {"resourceUri": "test://example-resource"}}),
    );
    assert_eq!(
        embedded["result"]["messages"][0]["content"]["type"],
        "resource"
    );
    let image = f.rpc(11, "prompts/get", json!({"name": "test_prompt_with_image"}));
    assert_eq!(image["result"]["messages"][0]["content"]["type"], "image");
    let c = f.rpc(
        12,
        "completion/complete",
        json!({"ref": {"type": "ref/prompt", "name": "test_prompt_with_arguments"},
            "argument": {"name": "arg1", "value": "par"}}),
    );
    assert_eq!(
        c["result"]["completion"]["values"],
        json!(["paris", "park", "party"])
    );
}

#[test]
fn stateless_requests_need_no_initialize_and_carry_result_type() {
    let mut f = Fixture::start();
    let d = stateless(&mut f, 1, "server/discover", json!({}));
    let r = &d["result"];
    assert!(r["supportedVersions"]
        .as_array()
        .unwrap()
        .contains(&json!("2026-07-28")));
    assert!(r["capabilities"]["tools"].is_object() && r["capabilities"]["prompts"].is_object());
    assert_eq!(
        r["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        "mcpbox-conformance"
    );
    for (i, m) in [
        "tools/list",
        "prompts/list",
        "resources/list",
        "resources/templates/list",
    ]
    .iter()
    .enumerate()
    {
        let l = stateless(&mut f, 10 + i as i64, m, json!({}));
        assert_eq!(l["result"]["resultType"], "complete", "{m}");
        assert_eq!(l["result"]["ttlMs"], 0, "{m}");
        assert_eq!(l["result"]["cacheScope"], "public", "{m}");
    }
    let read = stateless(
        &mut f,
        20,
        "resources/read",
        json!({"uri": "test://static-text"}),
    );
    assert_eq!(read["result"]["cacheScope"], "public");
    let call = stateless(
        &mut f,
        21,
        "tools/call",
        json!({"name": "test_simple_text", "arguments": {}}),
    );
    assert_eq!(call["result"]["resultType"], "complete");
    assert!(f.seen.is_empty(), "{:?}", f.seen);
}

#[test]
fn stateless_meta_and_version_errors() {
    let mut f = Fixture::start();
    let missing = f.rpc(101, "server/discover", json!({}));
    assert_eq!(missing["error"]["code"], -32602);
    assert_eq!(missing["id"], 101);
    let no_caps = f.rpc(
        104,
        "server/discover",
        json!({"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}),
    );
    assert_eq!(no_caps["error"]["code"], -32602);
    let no_info = f.rpc(
        105,
        "server/discover",
        json!({"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}}}),
    );
    assert!(no_info["result"].is_object(), "{no_info}");
    let mut m = meta(json!({}));
    m["io.modelcontextprotocol/protocolVersion"] = json!("v999.0.0");
    let v = f.rpc(301, "server/discover", json!({"_meta": m}));
    assert_eq!(v["error"]["code"], -32022);
    assert_eq!(v["error"]["data"]["requested"], "v999.0.0");
    assert!(v["error"]["data"]["supported"]
        .as_array()
        .unwrap()
        .contains(&json!("2026-07-28")));
    for (i, removed) in [
        "initialize",
        "ping",
        "logging/setLevel",
        "resources/subscribe",
        "resources/unsubscribe",
        "unknown/method",
    ]
    .iter()
    .enumerate()
    {
        let r = stateless(&mut f, 500 + i as i64, removed, json!({}));
        assert_eq!(r["error"]["code"], -32601, "{removed}: {r}");
    }
    let cap = f.rpc(
        401,
        "tools/call",
        json!({"name": "test_missing_capability", "arguments": {}, "_meta": meta(json!({}))}),
    );
    assert_eq!(cap["error"]["code"], -32021);
    assert_eq!(
        cap["error"]["data"]["requiredCapabilities"],
        json!({"sampling": {}})
    );
}

#[test]
fn stateless_logs_and_progress_only_when_asked() {
    let mut f = Fixture::start();
    stateless(
        &mut f,
        1,
        "tools/call",
        json!({"name": "test_logging_tool", "arguments": {}}),
    );
    assert!(f.seen_method("notifications/message").is_empty());
    let mut m = meta(all_caps());
    m["io.modelcontextprotocol/logLevel"] = json!("debug");
    m["progressToken"] = json!("p1");
    f.rpc(
        2,
        "tools/call",
        json!({"name": "test_tool_with_logging", "arguments": {}, "_meta": m.clone()}),
    );
    assert_eq!(f.seen_method("notifications/message").len(), 3);
    f.rpc(
        3,
        "tools/call",
        json!({"name": "test_tool_with_progress", "arguments": {}, "_meta": m}),
    );
    assert_eq!(f.seen_method("notifications/progress").len(), 3);
}

#[test]
fn stateless_input_required_round_trips() {
    let mut f = Fixture::start();
    let tool = "test_input_required_result_elicitation";
    let r1 = stateless(
        &mut f,
        1,
        "tools/call",
        json!({"name": tool, "arguments": {}}),
    );
    assert_eq!(r1["result"]["resultType"], "input_required");
    assert_eq!(
        r1["result"]["inputRequests"]["user_name"]["method"],
        "elicitation/create"
    );
    let answer = json!({"action": "accept", "content": {"name": "Alice"}});
    let r2 = stateless(
        &mut f,
        2,
        "tools/call",
        json!({"name": tool, "arguments": {}, "inputResponses": {"user_name": answer,
            "unknown_extra_key": {"action": "accept", "content": {"foo": "bar"}}}}),
    );
    assert_eq!(first_text(&r2), "Hello, Alice!");
    // a wrong key: asked again, not an error
    let again = stateless(
        &mut f,
        3,
        "tools/call",
        json!({"name": tool, "arguments": {}, "inputResponses": {"wrong_key": answer}}),
    );
    assert_eq!(again["result"]["resultType"], "input_required");
    // malformed input: an error
    for (i, bad) in [json!({"user_name": 12345}), Value::Null]
        .into_iter()
        .enumerate()
    {
        let r = stateless(
            &mut f,
            4 + i as i64,
            "tools/call",
            json!({"name": tool, "arguments": {}, "inputResponses": bad}),
        );
        assert_eq!(r["error"]["code"], -32602, "{r}");
    }
    // no server-to-client request was ever written
    assert!(f.seen.iter().all(|v| v.get("id").is_none()), "{:?}", f.seen);
}

#[test]
fn stateless_request_state_multi_round_and_tampering() {
    let mut f = Fixture::start();
    let ok = json!({"action": "accept", "content": {"ok": true}});
    let t = "test_input_required_result_request_state";
    let r1 = stateless(&mut f, 1, "tools/call", json!({"name": t, "arguments": {}}));
    let state = r1["result"]["requestState"].as_str().unwrap().to_string();
    let r2 = stateless(
        &mut f,
        2,
        "tools/call",
        json!({"name": t, "arguments": {}, "inputResponses": {"confirm": ok}, "requestState": state}),
    );
    assert!(first_text(&r2).contains("state-ok"), "{r2}");

    let t = "test_input_required_result_tampered_state";
    let r1 = stateless(&mut f, 3, "tools/call", json!({"name": t, "arguments": {}}));
    let tampered = format!(
        "{}-TAMPERED",
        r1["result"]["requestState"].as_str().unwrap()
    );
    let r2 = stateless(
        &mut f,
        4,
        "tools/call",
        json!({"name": t, "arguments": {}, "inputResponses": {"confirm": ok}, "requestState": tampered}),
    );
    assert_eq!(r2["error"]["code"], -32602, "{r2}");
    // a state minted for one tool does not open another
    let other = stateless(
        &mut f,
        5,
        "tools/call",
        json!({"name": "test_input_required_result_request_state",
        "arguments": {}, "inputResponses": {"confirm": ok}, "requestState": r1["result"]["requestState"]}),
    );
    assert_eq!(other["error"]["code"], -32602, "{other}");

    let t = "test_input_required_result_multi_round";
    let r1 = stateless(&mut f, 6, "tools/call", json!({"name": t, "arguments": {}}));
    let s1 = r1["result"]["requestState"].clone();
    let r2 = stateless(
        &mut f,
        7,
        "tools/call",
        json!({"name": t, "arguments": {},
        "inputResponses": {"step1": {"action": "accept", "content": {"name": "Alice"}}}, "requestState": s1}),
    );
    assert_eq!(r2["result"]["resultType"], "input_required");
    assert!(r2["result"]["inputRequests"]["step2"].is_object());
    assert_ne!(r2["result"]["requestState"], s1);
    let r3 = stateless(
        &mut f,
        8,
        "tools/call",
        json!({"name": t, "arguments": {},
        "inputResponses": {"step2": {"action": "accept", "content": {"color": "blue"}}},
        "requestState": r2["result"]["requestState"]}),
    );
    assert_eq!(first_text(&r3), "Alice likes blue");
}

#[test]
fn stateless_multiple_inputs_capabilities_and_prompt() {
    let mut f = Fixture::start();
    let t = "test_input_required_result_multiple_inputs";
    let r1 = stateless(&mut f, 1, "tools/call", json!({"name": t, "arguments": {}}));
    let reqs = r1["result"]["inputRequests"].as_object().unwrap();
    let methods: Vec<&str> = reqs
        .values()
        .map(|r| r["method"].as_str().unwrap())
        .collect();
    assert_eq!(methods.len(), 3, "{methods:?}");
    let r2 = stateless(
        &mut f,
        2,
        "tools/call",
        json!({"name": t, "arguments": {},
        "requestState": r1["result"]["requestState"], "inputResponses": {
            "user_name": {"action": "accept", "content": {"name": "Alice"}},
            "greeting": {"role": "assistant", "content": {"type": "text", "text": "Hello there!"}, "model": "m"},
            "client_roots": {"roots": [{"uri": "file:///test/root", "name": "Test Root"}]}}}),
    );
    assert_eq!(
        first_text(&r2),
        "Hello there! says hello to Alice; roots: file:///test/root"
    );

    let caps = f.rpc(
        3,
        "tools/call",
        json!({"name": "test_input_required_result_capabilities",
        "arguments": {}, "_meta": meta(json!({"sampling": {}}))}),
    );
    let reqs = caps["result"]["inputRequests"].as_object().unwrap();
    assert!(
        reqs.values()
            .all(|r| r["method"] == "sampling/createMessage"),
        "{caps}"
    );

    let p = "test_input_required_result_prompt";
    let r1 = stateless(&mut f, 4, "prompts/get", json!({"name": p}));
    assert_eq!(r1["result"]["resultType"], "input_required");
    let r2 = stateless(
        &mut f,
        5,
        "prompts/get",
        json!({"name": p,
        "inputResponses": {"user_context": {"action": "accept", "content": {"context": "test context"}}}}),
    );
    assert!(r2["result"]["messages"].is_array(), "{r2}");
    for (i, m) in ["tools/list", "prompts/list"].iter().enumerate() {
        let r = stateless(&mut f, 10 + i as i64, m, json!({}));
        assert_eq!(r["result"]["resultType"], "complete");
    }
}

#[test]
fn stateless_listen_stream_acknowledges_filters_and_tags() {
    let mut f = Fixture::start();
    f.write(
        &json!({"jsonrpc": "2.0", "id": "listen-1", "method": "subscriptions/listen",
        "params": {"_meta": meta(json!({})), "notifications": {"toolsListChanged": true}}}),
    );
    let ack = f.next();
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
    assert_eq!(
        ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        "listen-1"
    );
    assert_eq!(
        ack["params"]["notifications"],
        json!({"toolsListChanged": true})
    );

    stateless(
        &mut f,
        1,
        "tools/call",
        json!({"name": "test_trigger_prompt_change", "arguments": {}}),
    );
    assert!(
        f.seen_method("notifications/prompts/list_changed")
            .is_empty(),
        "filter leaked"
    );
    stateless(
        &mut f,
        2,
        "tools/call",
        json!({"name": "test_trigger_tool_change", "arguments": {}}),
    );
    let changed = f.seen_method("notifications/tools/list_changed");
    assert_eq!(changed.len(), 1);
    assert_eq!(
        changed[0]["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"],
        "listen-1"
    );
    let tools = stateless(&mut f, 3, "tools/list", json!({}));
    assert!(tools["result"]["tools"]
        .to_string()
        .contains("test_dynamic_tool"));

    // cancelled: the stream is gone, nothing more is sent on it
    f.write(
        &json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": "listen-1"}}),
    );
    f.seen.clear();
    stateless(
        &mut f,
        4,
        "tools/call",
        json!({"name": "test_trigger_tool_change", "arguments": {}}),
    );
    assert!(f.seen.is_empty(), "{:?}", f.seen);
}
