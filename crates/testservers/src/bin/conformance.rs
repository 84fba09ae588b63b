//! The conformance fixture: a stdio MCP server that implements exactly what
//! the server scenarios of `@modelcontextprotocol/conformance` call and check
//! (0.1.16 for 2025-11-25, 0.2.0-alpha.12 for `--requirements 2026-07-28`), so
//! the suite can be run through `mcpbox serve` against a server we control.
//! The suite's own example server ships in no registry package.
//!
//! Newline-delimited JSON-RPC on stdin/stdout; diagnostics on stderr only.
//!
//! # Two eras, chosen per request
//!
//! * 2025-11-25 (and 2025-06-18): `initialize` opens a session; the fixture
//!   echoes a protocol version it knows or answers `2025-11-25`. Sampling and
//!   elicitation are real server-to-client requests sent in the middle of the
//!   tool call: the fixture writes `sampling/createMessage` /
//!   `elicitation/create` with its own id (`fixture-N`) and reads stdin until
//!   the answer with that id arrives. Requests read meanwhile are answered at
//!   once, except `tools/call`, `prompts/get` and `resources/read` (which may
//!   need a round trip of their own): those are queued and served after.
//! * 2026-07-28 (stateless): a request whose `params._meta` carries
//!   `io.modelcontextprotocol/protocolVersion` or `.../clientCapabilities`,
//!   every `server/discover`, and any request before an `initialize`. `_meta`
//!   must carry both keys (else -32602); an unknown version gets -32022 with
//!   `{requested, supported}`; removed methods (`initialize`, `ping`,
//!   `logging/setLevel`, `resources/subscribe`, `resources/unsubscribe`) get
//!   -32601. Every result carries `resultType` and
//!   `_meta["io.modelcontextprotocol/serverInfo"]`; list results and
//!   `resources/read` carry `ttlMs` and `cacheScope`. Input from the client
//!   is asked for with an `InputRequiredResult` (`resultType:
//!   "input_required"`, `inputRequests`, a signed `requestState`), never with
//!   a server-to-client request; a request that would need a capability the
//!   client did not declare gets -32021 with `requiredCapabilities`. Logging
//!   happens only when the request sets `_meta["io.modelcontextprotocol/logLevel"]`.
//!   `subscriptions/listen` is acknowledged with
//!   `notifications/subscriptions/acknowledged` and then stays open (no
//!   response) until `notifications/cancelled` names it; notifications on it
//!   carry `_meta["io.modelcontextprotocol/subscriptionId"]` (the listen id).
//!
//! The same tool code serves both eras: a tool returns either a result or the
//! input it still needs; the legacy driver turns that into real requests, the
//! stateless driver into an `InputRequiredResult`.
//!
//! # Scenario → what the fixture does
//!
//! | scenario | fixture |
//! |---|---|
//! | server-initialize | `initialize` → protocolVersion, capabilities (tools, resources{subscribe,listChanged}, prompts, logging, completions), serverInfo |
//! | ping | `{}` |
//! | logging-set-level | `logging/setLevel` → `{}`; later `notifications/message` below that level are dropped |
//! | completion-complete | `completion/complete` for `ref/prompt test_prompt_with_arguments` (arg1/arg2) and `ref/resource test://template/{id}/data` (id): values with the given prefix |
//! | tools-list | every tool has name, description, inputSchema; same order every time |
//! | tools-call-simple-text | `test_simple_text` → text "This is a simple text response for testing." |
//! | tools-call-image | `test_image_content` → 1x1 red PNG, image/png |
//! | tools-call-audio | `test_audio_content` → 8-sample WAV, audio/wav |
//! | tools-call-embedded-resource | `test_embedded_resource` → resource test://embedded-resource, text/plain |
//! | tools-call-mixed-content | `test_multiple_content_types` → text + image + resource |
//! | tools-call-with-logging | `test_tool_with_logging` → 3 `notifications/message` (info) 50 ms apart |
//! | tools-call-error | `test_error_handling` → `isError: true` with a text |
//! | tools-call-with-progress | `test_tool_with_progress` → progress 0, 50, 100 of 100, 50 ms apart, when `_meta.progressToken` is set |
//! | tools-call-sampling | `test_sampling {prompt}` → `sampling/createMessage` to the client, returns "LLM response: …" |
//! | tools-call-elicitation | `test_elicitation {message}` → `elicitation/create` (username, email), returns "User response: …" |
//! | elicitation-sep1034-defaults | `test_elicitation_sep1034_defaults` → schema with defaults "John Doe", 30, 95.5, "active", true |
//! | elicitation-sep1330-enums | `test_elicitation_sep1330_enums` → untitledSingle, titledSingle (oneOf), legacyEnum (enumNames), untitledMulti, titledMulti (anyOf) |
//! | json-schema-2020-12 (pending) | `json_schema_2020_12_tool` with `$schema`, `$defs`, `additionalProperties: false` |
//! | server-sse-polling (pending) | `test_reconnection` → text after 100 ms (closing the SSE stream mid-call is the gateway's part) |
//! | server-sse-multiple-streams | only `tools/list` (the streams are the gateway's) |
//! | resources-list | test://static-text, test://static-binary, test://watched-resource |
//! | resources-read-text / -binary | text/plain text; image/png blob |
//! | resources-templates-read | `test://template/{id}/data` → JSON text naming the id |
//! | resources-subscribe / -unsubscribe | `{}`; `test_update_resource` then sends `notifications/resources/updated` to subscribers |
//! | prompts-list | 5 prompts, each with a description |
//! | prompts-get-simple / -with-args / -embedded-resource / -with-image | `test_simple_prompt`, `test_prompt_with_arguments {arg1,arg2}`, `test_prompt_with_embedded_resource {resourceUri}`, `test_prompt_with_image` |
//! | dns-rebinding-protection | nothing: Host/Origin are HTTP (the gateway's) |
//! | server-stateless (2026) | `_meta` validation, `server/discover`, -32022, -32021 (`test_missing_capability` needs sampling), -32601 for removed methods, `test_streaming_elicitation`, `test_logging_tool`, `subscriptions/listen`, `test_trigger_tool_change` / `test_trigger_prompt_change` (toggle `test_dynamic_tool` / `test_dynamic_prompt` and notify listeners) |
//! | caching (2026) | ttlMs 0 + cacheScope "public" on the lists and `resources/read` |
//! | sep-2164-resource-not-found | unknown URI → -32602 with `data.uri` |
//! | input-required-result-* (2026) | `test_input_required_result_{elicitation,sampling,list_roots,request_state,multiple_inputs,multi_round,tampered_state,capabilities}`, prompt `test_input_required_result_prompt`; missing keys are asked again, extra keys ignored, a non-object or null `inputResponses` and a tampered `requestState` get -32602 |
//!
//! Not the fixture's job (HTTP transport, the gateway must do it): session
//! ids, SSE streams and priming events, Host/Origin validation, the
//! `MCP-Protocol-Version` header versus `_meta` (-32020), and the HTTP status
//! codes (400/404) that go with the JSON-RPC errors above.
#![forbid(unsafe_code)]

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::io::{self, BufRead, BufReader, Stdin, Stdout, Write};
use std::time::Duration;

use mcpbox_testservers::VERSIONS;
use serde_json::{json, Map, Value};

const NAME: &str = "mcpbox-conformance";
/// Versions a legacy `initialize` may negotiate.
const LEGACY_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];
const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
const META_CAPS: &str = "io.modelcontextprotocol/clientCapabilities";
const META_LOG: &str = "io.modelcontextprotocol/logLevel";
const META_SERVER: &str = "io.modelcontextprotocol/serverInfo";
const META_SUB: &str = "io.modelcontextprotocol/subscriptionId";
/// Methods the 2026-07-28 revision removed.
const REMOVED: &[&str] = &[
    "initialize",
    "ping",
    "logging/setLevel",
    "resources/subscribe",
    "resources/unsubscribe",
];
const LEVELS: &[&str] = &[
    "debug",
    "info",
    "notice",
    "warning",
    "error",
    "critical",
    "alert",
    "emergency",
];
/// 1x1 red PNG.
const PNG: &str =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
/// 8 silent samples, 8 kHz mono 8-bit PCM.
const WAV: &str = "UklGRiwAAABXQVZFZm10IBAAAAABAAEAQB8AAEAfAAABAAgAZGF0YQgAAACAgICAgICAgA==";
const WATCHED: &str = "test://watched-resource";
/// Mixed into the `requestState` MAC. A test fixture: the point is that a
/// changed state is detected, not that the key is secret; it is fixed so a
/// gateway may restart the fixture between the rounds of one request.
const STATE_KEY: &str = "mcpbox-conformance-fixture-state";

/// A JSON-RPC error.
struct RpcError {
    code: i64,
    message: String,
    data: Option<Value>,
}

fn err(code: i64, message: impl Into<String>) -> RpcError {
    RpcError {
        code,
        message: message.into(),
        data: None,
    }
}

type Outcome = Result<Value, RpcError>;

/// What a tool or prompt produced: its result, or the input it still needs
/// (keyed requests to the client, and the state to resume from).
enum Step {
    Done(Outcome),
    Need {
        requests: Map<String, Value>,
        state: Option<String>,
    },
}

/// What one request carries besides its arguments.
struct Ctx {
    stateless: bool,
    /// The client's declared capabilities (initialize or `_meta`).
    caps: Value,
    /// Lowest level to send; `None`: send no log messages.
    log_min: Option<usize>,
    progress: Option<Value>,
}

struct Session {
    caps: Value,
    level: usize,
}

struct Listener {
    id: Value,
    filter: Value,
}

struct Fixture {
    reader: BufReader<Stdin>,
    out: Stdout,
    next_id: u64,
    session: Option<Session>,
    /// Requests read while waiting for a client's answer, served after.
    queue: VecDeque<Value>,
    listeners: Vec<Listener>,
    subscribed: BTreeSet<String>,
    dynamic_tool: bool,
    dynamic_prompt: bool,
    watched_version: u64,
}

fn text(s: impl Into<String>) -> Value {
    json!({"content": [{"type": "text", "text": s.into()}]})
}

fn tool(name: &str, description: &str, properties: Value, required: &[&str]) -> Value {
    let mut schema = json!({"type": "object", "properties": properties});
    if !required.is_empty() {
        schema["required"] = json!(required);
    }
    json!({"name": name, "description": description, "inputSchema": schema})
}

fn no_args(name: &str, description: &str) -> Value {
    tool(name, description, json!({}), &[])
}

fn str_arg<'a>(args: &'a Value, key: &str) -> &'a str {
    args.get(key).and_then(Value::as_str).unwrap_or_default()
}

fn elicit(message: &str, properties: Value, required: &[&str]) -> Value {
    json!({"method": "elicitation/create", "params": {"message": message,
        "requestedSchema": {"type": "object", "properties": properties, "required": required}}})
}

fn sample(prompt: &str, max_tokens: u64) -> Value {
    json!({"method": "sampling/createMessage", "params": {
        "messages": [{"role": "user", "content": {"type": "text", "text": prompt}}],
        "maxTokens": max_tokens}})
}

fn need(pairs: Vec<(&str, Value)>, state: Option<String>) -> Step {
    Step::Need {
        requests: pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        state,
    }
}

/// The capability a server-to-client method needs.
fn capability_for(method: &str) -> Option<&'static str> {
    match method {
        "sampling/createMessage" => Some("sampling"),
        "elicitation/create" => Some("elicitation"),
        "roots/list" => Some("roots"),
        _ => None,
    }
}

fn mac(payload: &str) -> u64 {
    let mut h = DefaultHasher::new();
    STATE_KEY.hash(&mut h);
    payload.hash(&mut h);
    h.finish()
}

fn sign(payload: &str) -> String {
    format!("{payload}.{:016x}", mac(payload))
}

fn verify(state: &str) -> Option<&str> {
    let (payload, tag) = state.rsplit_once('.')?;
    (format!("{:016x}", mac(payload)) == tag).then_some(payload)
}

impl Fixture {
    fn send(&mut self, v: &Value) -> io::Result<()> {
        let mut line = serde_json::to_vec(v).map_err(io::Error::other)?;
        line.push(b'\n');
        let mut lock = self.out.lock();
        lock.write_all(&line)?;
        lock.flush()
    }

    fn notify(&mut self, method: &str, params: Value) -> io::Result<()> {
        self.send(&json!({"jsonrpc": "2.0", "method": method, "params": params}))
    }

    fn read(&mut self) -> io::Result<Option<Value>> {
        loop {
            let mut line = Vec::new();
            if self.reader.read_until(b'\n', &mut line)? == 0 {
                return Ok(None);
            }
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            match serde_json::from_slice::<Value>(&line) {
                Ok(v) => return Ok(Some(v)),
                Err(e) => {
                    eprintln!("{NAME}: unparsable line: {e}");
                    self.send(&json!({"jsonrpc": "2.0", "id": null,
                        "error": {"code": -32700, "message": "parse error"}}))?;
                }
            }
        }
    }

    fn run(&mut self) -> io::Result<()> {
        loop {
            let msg = match self.queue.pop_front() {
                Some(m) => m,
                None => match self.read()? {
                    Some(m) => m,
                    None => return Ok(()),
                },
            };
            self.dispatch(msg)?;
        }
    }

    fn dispatch(&mut self, msg: Value) -> io::Result<()> {
        let Some(method) = msg.get("method").and_then(Value::as_str) else {
            return Ok(()); // a response nobody waits for
        };
        let params = msg.get("params").cloned().unwrap_or(json!({}));
        let Some(id) = msg.get("id").cloned() else {
            if method == "notifications/cancelled" {
                let target = params.get("requestId");
                self.listeners.retain(|l| Some(&l.id) != target);
            }
            return Ok(());
        };
        let method = method.to_string();
        if let Some(response) = self.request(&id, &method, &params)? {
            self.send(&response)?;
        }
        Ok(())
    }

    /// Answers one request; `None` when the answer is deferred
    /// (`subscriptions/listen` stays open).
    fn request(&mut self, id: &Value, method: &str, params: &Value) -> io::Result<Option<Value>> {
        let meta = params.get("_meta");
        let new_meta =
            meta.is_some_and(|m| m.get(META_VERSION).is_some() || m.get(META_CAPS).is_some());
        let stateless = method == "server/discover"
            || new_meta
            || (self.session.is_none() && method != "initialize");
        let outcome = if stateless {
            self.stateless(id, method, params)?
        } else {
            let ctx = Ctx {
                stateless: false,
                caps: self.session.as_ref().map_or(json!({}), |s| s.caps.clone()),
                log_min: Some(self.session.as_ref().map_or(0, |s| s.level)),
                progress: meta.and_then(|m| m.get("progressToken")).cloned(),
            };
            Some(self.legacy(&ctx, method, params)?)
        };
        Ok(outcome.map(|o| match o {
            Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
            Err(e) => {
                let mut error = json!({"code": e.code, "message": e.message});
                if let Some(d) = e.data {
                    error["data"] = d;
                }
                json!({"jsonrpc": "2.0", "id": id, "error": error})
            }
        }))
    }

    fn capabilities(&self) -> Value {
        json!({
            "tools": {"listChanged": true},
            "resources": {"subscribe": true, "listChanged": true},
            "prompts": {"listChanged": true},
            "logging": {},
            "completions": {},
        })
    }

    fn info() -> Value {
        json!({"name": NAME, "version": env!("CARGO_PKG_VERSION")})
    }

    fn legacy(&mut self, ctx: &Ctx, method: &str, params: &Value) -> io::Result<Outcome> {
        Ok(match method {
            "initialize" => {
                let asked = params
                    .get("protocolVersion")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let version = if LEGACY_VERSIONS.contains(&asked) {
                    asked
                } else {
                    LEGACY_VERSIONS[0]
                };
                self.session = Some(Session {
                    caps: params.get("capabilities").cloned().unwrap_or(json!({})),
                    level: 0,
                });
                Ok(
                    json!({"protocolVersion": version, "capabilities": self.capabilities(),
                    "serverInfo": Self::info(),
                    "instructions": "The mcpbox conformance fixture."}),
                )
            }
            "ping" => Ok(json!({})),
            "logging/setLevel" => {
                let level = params.get("level").and_then(Value::as_str).unwrap_or("");
                match LEVELS.iter().position(|l| *l == level) {
                    Some(i) => {
                        if let Some(s) = self.session.as_mut() {
                            s.level = i;
                        }
                        Ok(json!({}))
                    }
                    None => Err(err(-32602, format!("unknown log level {level:?}"))),
                }
            }
            "resources/subscribe" | "resources/unsubscribe" => {
                let uri = str_arg(params, "uri").to_string();
                if method == "resources/subscribe" {
                    self.subscribed.insert(uri);
                } else {
                    self.subscribed.remove(&uri);
                }
                Ok(json!({}))
            }
            _ => self.common(ctx, method, params)?,
        })
    }

    fn stateless(
        &mut self,
        id: &Value,
        method: &str,
        params: &Value,
    ) -> io::Result<Option<Outcome>> {
        let meta = params.get("_meta");
        let version = meta
            .and_then(|m| m.get(META_VERSION))
            .and_then(Value::as_str);
        let caps = meta.and_then(|m| m.get(META_CAPS));
        let (Some(version), Some(caps)) = (version, caps) else {
            return Ok(Some(Err(err(
                -32602,
                format!("invalid params: _meta must carry {META_VERSION} and {META_CAPS}"),
            ))));
        };
        if !VERSIONS.contains(&version) {
            return Ok(Some(Err(RpcError {
                code: -32022,
                message: format!("unsupported protocol version {version:?}"),
                data: Some(json!({"requested": version, "supported": VERSIONS})),
            })));
        }
        if REMOVED.contains(&method) {
            return Ok(Some(Err(err(
                -32601,
                format!("method not found: {method}"),
            ))));
        }
        let ctx = Ctx {
            stateless: true,
            caps: caps.clone(),
            log_min: meta
                .and_then(|m| m.get(META_LOG))
                .and_then(Value::as_str)
                .and_then(|l| LEVELS.iter().position(|x| *x == l)),
            progress: meta.and_then(|m| m.get("progressToken")).cloned(),
        };
        let outcome = match method {
            "server/discover" => Ok(json!({
                "supportedVersions": VERSIONS, "capabilities": self.capabilities(),
                "instructions": "The mcpbox conformance fixture.",
                "ttlMs": 0, "cacheScope": "public"})),
            "subscriptions/listen" => {
                let filter = params.get("notifications").cloned().unwrap_or(json!({}));
                let mut honored = Map::new();
                for key in [
                    "toolsListChanged",
                    "promptsListChanged",
                    "resourcesListChanged",
                ] {
                    if filter.get(key) == Some(&json!(true)) {
                        honored.insert(key.into(), json!(true));
                    }
                }
                if let Some(uris) = filter.get("resourceSubscriptions") {
                    honored.insert("resourceSubscriptions".into(), uris.clone());
                }
                self.notify(
                    "notifications/subscriptions/acknowledged",
                    json!({"_meta": {META_SUB: id}, "notifications": honored}),
                )?;
                self.listeners.push(Listener {
                    id: id.clone(),
                    filter,
                });
                return Ok(None);
            }
            _ => self.common(&ctx, method, params)?,
        };
        Ok(Some(outcome.map(|mut r| {
            if r.get("resultType").is_none() {
                r["resultType"] = json!("complete");
            }
            if matches!(
                method,
                "tools/list"
                    | "prompts/list"
                    | "resources/list"
                    | "resources/templates/list"
                    | "resources/read"
            ) {
                r["ttlMs"] = json!(0);
                r["cacheScope"] = json!("public");
            }
            let mut m = r.get("_meta").cloned().unwrap_or(json!({}));
            m[META_SERVER] = Self::info();
            r["_meta"] = m;
            r
        })))
    }

    /// Methods both eras share.
    fn common(&mut self, ctx: &Ctx, method: &str, params: &Value) -> io::Result<Outcome> {
        Ok(match method {
            "tools/list" => Ok(json!({"tools": self.tools()})),
            "tools/call" => {
                let name = str_arg(params, "name").to_string();
                let args = params.get("arguments").cloned().unwrap_or(json!({}));
                self.resolve(ctx, &name, params, |f, ctx, inputs, state| {
                    f.tool(ctx, &name, &args, inputs, state)
                })?
            }
            "prompts/list" => Ok(json!({"prompts": self.prompts()})),
            "prompts/get" => {
                let name = str_arg(params, "name").to_string();
                let args = params.get("arguments").cloned().unwrap_or(json!({}));
                self.resolve(ctx, &name, params, |_, _, inputs, state| {
                    prompt(&name, &args, inputs, state)
                })?
            }
            "resources/list" => Ok(json!({"resources": [
                {"uri": "test://static-text", "name": "static-text", "description": "A static text resource", "mimeType": "text/plain"},
                {"uri": "test://static-binary", "name": "static-binary", "description": "A static binary resource (PNG)", "mimeType": "image/png"},
                {"uri": WATCHED, "name": "watched-resource", "description": "A resource test_update_resource changes", "mimeType": "text/plain"},
            ]})),
            "resources/templates/list" => Ok(json!({"resourceTemplates": [
                {"uriTemplate": "test://template/{id}/data", "name": "template-data",
                 "description": "Data for an id", "mimeType": "application/json"}]})),
            "resources/read" => self.read_resource(str_arg(params, "uri")),
            "completion/complete" => Ok(complete(params)),
            _ => Err(err(-32601, format!("method not found: {method}"))),
        })
    }

    fn read_resource(&self, uri: &str) -> Outcome {
        let content = match uri {
            "test://static-text" => {
                json!({"uri": uri, "mimeType": "text/plain", "text": "This is the content of the static text resource."})
            }
            "test://static-binary" => json!({"uri": uri, "mimeType": "image/png", "blob": PNG}),
            WATCHED => json!({"uri": uri, "mimeType": "text/plain",
                "text": format!("Watched resource, version {}", self.watched_version)}),
            _ => match uri
                .strip_prefix("test://template/")
                .and_then(|r| r.strip_suffix("/data"))
                .filter(|id| !id.is_empty() && !id.contains('/'))
            {
                Some(id) => json!({"uri": uri, "mimeType": "application/json",
                    "text": json!({"id": id, "templateTest": true, "data": format!("Data for ID: {id}")}).to_string()}),
                None => {
                    return Err(RpcError {
                        code: -32602,
                        message: "Resource not found".into(),
                        data: Some(json!({"uri": uri})),
                    })
                }
            },
        };
        Ok(json!({"contents": [content]}))
    }

    fn tools(&self) -> Vec<Value> {
        let mut tools = vec![
            no_args("test_simple_text", "Returns a simple text."),
            no_args("test_image_content", "Returns a 1x1 PNG image."),
            no_args("test_audio_content", "Returns a short WAV clip."),
            no_args(
                "test_embedded_resource",
                "Returns an embedded text resource.",
            ),
            no_args(
                "test_multiple_content_types",
                "Returns text, an image and a resource.",
            ),
            no_args(
                "test_tool_with_logging",
                "Sends three log messages while it runs.",
            ),
            no_args("test_error_handling", "Always returns a tool error."),
            no_args(
                "test_tool_with_progress",
                "Reports progress 0, 50 and 100 of 100.",
            ),
            tool(
                "test_sampling",
                "Asks the client's LLM (sampling/createMessage).",
                json!({"prompt": {"type": "string", "description": "The prompt to send"}}),
                &["prompt"],
            ),
            tool(
                "test_elicitation",
                "Asks the user (elicitation/create).",
                json!({"message": {"type": "string", "description": "The message to show"}}),
                &["message"],
            ),
            no_args(
                "test_elicitation_sep1034_defaults",
                "Elicits with defaults for every primitive type (SEP-1034).",
            ),
            no_args(
                "test_elicitation_sep1330_enums",
                "Elicits with the five enum shapes (SEP-1330).",
            ),
            json!({"name": "json_schema_2020_12_tool", "description": "Tool with JSON Schema 2020-12 features",
                "inputSchema": {
                    "$schema": "https://json-schema.org/draft/2020-12/schema",
                    "type": "object",
                    "$defs": {"address": {"type": "object", "properties": {
                        "street": {"type": "string"}, "city": {"type": "string"}}}},
                    "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
                    "additionalProperties": false}}),
            no_args(
                "test_reconnection",
                "Answers after 100 ms (the gateway may close the SSE stream meanwhile).",
            ),
            no_args(
                "test_update_resource",
                "Changes test://watched-resource and notifies subscribers.",
            ),
            no_args(
                "test_missing_capability",
                "Needs the client's sampling capability.",
            ),
            no_args("test_streaming_elicitation", "Needs input from the user."),
            no_args(
                "test_logging_tool",
                "Logs at info when the request asks for logs.",
            ),
            no_args(
                "test_trigger_tool_change",
                "Adds or removes test_dynamic_tool.",
            ),
            no_args(
                "test_trigger_prompt_change",
                "Adds or removes test_dynamic_prompt.",
            ),
            no_args(
                "test_input_required_result_elicitation",
                "Asks for the user's name.",
            ),
            no_args(
                "test_input_required_result_sampling",
                "Asks the client's LLM a question.",
            ),
            no_args(
                "test_input_required_result_list_roots",
                "Asks for the client's roots.",
            ),
            no_args(
                "test_input_required_result_request_state",
                "Asks for a confirmation, with requestState.",
            ),
            no_args(
                "test_input_required_result_multiple_inputs",
                "Asks for a name, a greeting and the roots at once.",
            ),
            no_args(
                "test_input_required_result_multi_round",
                "Asks twice, in two rounds.",
            ),
            no_args(
                "test_input_required_result_tampered_state",
                "Rejects a changed requestState.",
            ),
            no_args(
                "test_input_required_result_capabilities",
                "Asks only what the client declared it can answer.",
            ),
        ];
        if self.dynamic_tool {
            tools.push(no_args(
                "test_dynamic_tool",
                "Present after an odd number of test_trigger_tool_change calls.",
            ));
        }
        tools
    }

    fn prompts(&self) -> Vec<Value> {
        let arg = |name: &str, d: &str| json!({"name": name, "description": d, "required": true});
        let mut prompts = vec![
            json!({"name": "test_simple_prompt", "description": "A prompt without arguments"}),
            json!({"name": "test_prompt_with_arguments", "description": "A prompt with two arguments",
                "arguments": [arg("arg1", "First test argument"), arg("arg2", "Second test argument")]}),
            json!({"name": "test_prompt_with_embedded_resource", "description": "A prompt embedding a resource",
                "arguments": [arg("resourceUri", "URI of the resource to embed")]}),
            json!({"name": "test_prompt_with_image", "description": "A prompt with an image"}),
            json!({"name": "test_input_required_result_prompt", "description": "A prompt that asks the user for context"}),
        ];
        if self.dynamic_prompt {
            prompts.push(json!({"name": "test_dynamic_prompt", "description": "Present after an odd number of test_trigger_prompt_change calls"}));
        }
        prompts
    }

    fn log(&mut self, ctx: &Ctx, level: usize, message: &str) -> io::Result<()> {
        if ctx.log_min.is_some_and(|min| level >= min) {
            self.notify(
                "notifications/message",
                json!({"level": LEVELS[level], "logger": NAME, "data": message}),
            )?;
        }
        Ok(())
    }

    fn progress(&mut self, ctx: &Ctx, progress: u64, total: u64, message: &str) -> io::Result<()> {
        if let Some(token) = &ctx.progress {
            let p = json!({"progressToken": token, "progress": progress, "total": total, "message": message});
            self.notify("notifications/progress", p)?;
        }
        Ok(())
    }

    /// Sends a notification to the legacy session (when `ctx` is one) and to
    /// every listen stream that asked for `filter_key`.
    fn broadcast(
        &mut self,
        ctx: &Ctx,
        method: &str,
        params: Value,
        filter_key: &str,
        uri: Option<&str>,
    ) -> io::Result<()> {
        if !ctx.stateless && (uri.is_none() || uri.is_some_and(|u| self.subscribed.contains(u))) {
            self.notify(method, params.clone())?;
        }
        let targets: Vec<Value> = self
            .listeners
            .iter()
            .filter(|l| match uri {
                None => l.filter.get(filter_key) == Some(&json!(true)),
                Some(u) => l
                    .filter
                    .get(filter_key)
                    .and_then(Value::as_array)
                    .is_some_and(|a| a.contains(&json!(u))),
            })
            .map(|l| l.id.clone())
            .collect();
        for id in targets {
            let mut p = params.clone();
            p["_meta"] = json!({META_SUB: id});
            self.notify(method, p)?;
        }
        Ok(())
    }

    /// Runs a tool or prompt to completion. Legacy: each needed input is a
    /// real request to the client. Stateless: the input comes from
    /// `inputResponses`/`requestState`, or an `InputRequiredResult` asks for it.
    fn resolve(
        &mut self,
        ctx: &Ctx,
        name: &str,
        params: &Value,
        mut step: impl FnMut(&mut Self, &Ctx, &Map<String, Value>, Option<&str>) -> io::Result<Step>,
    ) -> io::Result<Outcome> {
        if ctx.stateless {
            let inputs = match params.get("inputResponses") {
                None => Map::new(),
                Some(Value::Object(m)) if m.values().all(Value::is_object) => m.clone(),
                Some(_) => {
                    return Ok(Err(err(
                        -32602,
                        "inputResponses must be an object of result objects",
                    )))
                }
            };
            let state = match params.get("requestState").and_then(Value::as_str) {
                None => None,
                Some(s) => match verify(s)
                    .and_then(|p| p.strip_prefix(name))
                    .and_then(|p| p.strip_prefix('|'))
                {
                    Some(p) => Some(p.to_string()),
                    None => return Ok(Err(err(-32602, "requestState failed its integrity check"))),
                },
            };
            return Ok(match step(self, ctx, &inputs, state.as_deref())? {
                Step::Done(o) => o,
                Step::Need { requests, state } => {
                    let mut missing = Map::new();
                    for r in requests.values() {
                        let cap = r
                            .get("method")
                            .and_then(Value::as_str)
                            .and_then(capability_for);
                        if let Some(cap) = cap.filter(|c| ctx.caps.get(*c).is_none()) {
                            missing.insert(cap.into(), json!({}));
                        }
                    }
                    if !missing.is_empty() {
                        return Ok(Err(RpcError {
                            code: -32021,
                            message: "the client did not declare a capability this request needs"
                                .into(),
                            data: Some(json!({"requiredCapabilities": missing})),
                        }));
                    }
                    let mut r = json!({"resultType": "input_required", "inputRequests": requests});
                    if let Some(s) = state {
                        r["requestState"] = json!(sign(&format!("{name}|{s}")));
                    }
                    Ok(r)
                }
            });
        }
        let mut inputs = Map::new();
        let mut state: Option<String> = None;
        for _round in 0..8 {
            match step(self, ctx, &inputs, state.as_deref())? {
                Step::Done(o) => return Ok(o),
                Step::Need {
                    requests,
                    state: next,
                } => {
                    for (key, r) in requests {
                        let method = r
                            .get("method")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_string();
                        if let Some(cap) =
                            capability_for(&method).filter(|c| ctx.caps.get(*c).is_none())
                        {
                            return Ok(Ok(tool_error(format!(
                                "the client does not support {cap}"
                            ))));
                        }
                        let answer =
                            self.ask(&method, r.get("params").cloned().unwrap_or(json!({})))?;
                        match answer {
                            Ok(result) => {
                                inputs.insert(key, result);
                            }
                            Err(e) => {
                                return Ok(Ok(tool_error(format!(
                                    "the client refused {method}: {e}"
                                ))))
                            }
                        }
                    }
                    state = next;
                }
            }
        }
        Ok(Err(err(-32603, "too many rounds of input")))
    }

    /// Sends a request to the client and reads until its answer arrives.
    /// Requests read meanwhile are answered, or queued when they may need a
    /// round trip themselves.
    fn ask(&mut self, method: &str, params: Value) -> io::Result<Result<Value, Value>> {
        self.next_id += 1;
        let id = json!(format!("fixture-{}", self.next_id));
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))?;
        loop {
            let Some(msg) = self.read()? else {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "client closed",
                ));
            };
            match msg.get("method").and_then(Value::as_str) {
                None if msg.get("id") == Some(&id) => {
                    return Ok(match msg.get("result") {
                        Some(r) => Ok(r.clone()),
                        None => Err(msg.get("error").cloned().unwrap_or(Value::Null)),
                    });
                }
                None => {} // an answer to nothing we wait for
                Some("tools/call" | "prompts/get" | "resources/read")
                    if msg.get("id").is_some() =>
                {
                    self.queue.push_back(msg);
                }
                Some(_) => self.dispatch(msg)?,
            }
        }
    }

    fn tool(
        &mut self,
        ctx: &Ctx,
        name: &str,
        args: &Value,
        inputs: &Map<String, Value>,
        state: Option<&str>,
    ) -> io::Result<Step> {
        let done = |v: Value| Ok(Step::Done(Ok(v)));
        let name_schema = || json!({"name": {"type": "string"}});
        match name {
            "test_simple_text" => done(text("This is a simple text response for testing.")),
            "test_image_content" => {
                done(json!({"content": [{"type": "image", "data": PNG, "mimeType": "image/png"}]}))
            }
            "test_audio_content" => {
                done(json!({"content": [{"type": "audio", "data": WAV, "mimeType": "audio/wav"}]}))
            }
            "test_embedded_resource" => done(json!({"content": [{"type": "resource", "resource": {
                "uri": "test://embedded-resource", "mimeType": "text/plain",
                "text": "This is an embedded resource content."}}]})),
            "test_multiple_content_types" => done(json!({"content": [
                {"type": "text", "text": "Multiple content types test:"},
                {"type": "image", "data": PNG, "mimeType": "image/png"},
                {"type": "resource", "resource": {"uri": "test://mixed-content-resource",
                    "mimeType": "application/json", "text": "{\"test\":\"data\",\"value\":123}"}}]})),
            "test_tool_with_logging" => {
                for (i, m) in [
                    "Tool execution started",
                    "Tool processing data",
                    "Tool execution completed",
                ]
                .iter()
                .enumerate()
                {
                    if i > 0 {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    self.log(ctx, 1, m)?;
                }
                done(text("Tool with logging executed successfully"))
            }
            "test_logging_tool" => {
                self.log(ctx, 1, "test_logging_tool ran")?;
                done(text("Logged (if the request asked for a log level)"))
            }
            "test_error_handling" => done(tool_error(
                "This tool intentionally returns an error for testing",
            )),
            "test_tool_with_progress" => {
                for (i, p) in [0, 50, 100].iter().enumerate() {
                    if i > 0 {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    self.progress(ctx, *p, 100, &format!("{p}% done"))?;
                }
                done(text("Progress tool completed"))
            }
            "json_schema_2020_12_tool" => done(text(format!("Received: {args}"))),
            "test_reconnection" => {
                std::thread::sleep(Duration::from_millis(100));
                done(text("Reconnection test completed"))
            }
            "test_update_resource" => {
                self.watched_version += 1;
                self.broadcast(
                    ctx,
                    "notifications/resources/updated",
                    json!({"uri": WATCHED}),
                    "resourceSubscriptions",
                    Some(WATCHED),
                )?;
                done(text(format!(
                    "{WATCHED} is now version {}",
                    self.watched_version
                )))
            }
            "test_trigger_tool_change" => {
                self.dynamic_tool = !self.dynamic_tool;
                self.broadcast(
                    ctx,
                    "notifications/tools/list_changed",
                    json!({}),
                    "toolsListChanged",
                    None,
                )?;
                done(text(format!(
                    "test_dynamic_tool present: {}",
                    self.dynamic_tool
                )))
            }
            "test_trigger_prompt_change" => {
                self.dynamic_prompt = !self.dynamic_prompt;
                self.broadcast(
                    ctx,
                    "notifications/prompts/list_changed",
                    json!({}),
                    "promptsListChanged",
                    None,
                )?;
                done(text(format!(
                    "test_dynamic_prompt present: {}",
                    self.dynamic_prompt
                )))
            }
            "test_dynamic_tool" if self.dynamic_tool => done(text("dynamic tool")),
            "test_sampling" => Ok(match inputs.get("sampling") {
                Some(r) => Step::Done(Ok(text(format!("LLM response: {}", sampled_text(r))))),
                None => need(
                    vec![("sampling", sample(str_arg(args, "prompt"), 100))],
                    None,
                ),
            }),
            "test_missing_capability" => Ok(match inputs.get("sampling") {
                Some(r) => Step::Done(Ok(text(format!("LLM response: {}", sampled_text(r))))),
                None => need(vec![("sampling", sample("Say something", 20))], None),
            }),
            "test_elicitation" => Ok(match inputs.get("elicitation") {
                Some(r) => Step::Done(Ok(text(format!("User response: {}", elicited(r))))),
                None => need(
                    vec![(
                        "elicitation",
                        elicit(
                            str_arg(args, "message"),
                            json!({
                    "username": {"type": "string", "description": "User's response"},
                    "email": {"type": "string", "description": "User's email address"}}),
                            &["username", "email"],
                        ),
                    )],
                    None,
                ),
            }),
            "test_elicitation_sep1034_defaults" => Ok(match inputs.get("defaults") {
                Some(r) => Step::Done(Ok(text(format!("Elicitation completed: {}", elicited(r))))),
                None => need(
                    vec![(
                        "defaults",
                        elicit(
                            "Please review and update the form fields with defaults",
                            json!({
                    "name": {"type": "string", "description": "User name", "default": "John Doe"},
                    "age": {"type": "integer", "description": "User age", "default": 30},
                    "score": {"type": "number", "description": "User score", "default": 95.5},
                    "status": {"type": "string", "description": "User status", "enum": ["active", "inactive", "pending"], "default": "active"},
                    "verified": {"type": "boolean", "description": "Verification status", "default": true}}),
                            &[],
                        ),
                    )],
                    None,
                ),
            }),
            "test_elicitation_sep1330_enums" => Ok(match inputs.get("enums") {
                Some(r) => Step::Done(Ok(text(format!("Elicitation completed: {}", elicited(r))))),
                None => need(
                    vec![(
                        "enums",
                        elicit(
                            "Please select options from the enum fields",
                            json!({
                    "untitledSingle": {"type": "string", "description": "Untitled single-select", "enum": ["option1", "option2", "option3"]},
                    "titledSingle": {"type": "string", "description": "Titled single-select", "oneOf": [
                        {"const": "value1", "title": "First Option"}, {"const": "value2", "title": "Second Option"},
                        {"const": "value3", "title": "Third Option"}]},
                    "legacyEnum": {"type": "string", "description": "Legacy titled enum", "enum": ["opt1", "opt2", "opt3"],
                        "enumNames": ["Option One", "Option Two", "Option Three"]},
                    "untitledMulti": {"type": "array", "description": "Untitled multi-select",
                        "items": {"type": "string", "enum": ["option1", "option2", "option3"]}},
                    "titledMulti": {"type": "array", "description": "Titled multi-select", "items": {"anyOf": [
                        {"const": "value1", "title": "First Choice"}, {"const": "value2", "title": "Second Choice"},
                        {"const": "value3", "title": "Third Choice"}]}}}),
                            &[],
                        ),
                    )],
                    None,
                ),
            }),
            "test_streaming_elicitation" => Ok(match inputs.get("answer") {
                Some(r) => Step::Done(Ok(text(format!("User response: {}", elicited(r))))),
                None => need(
                    vec![(
                        "answer",
                        elicit(
                            "Anything to add?",
                            json!({"answer": {"type": "string"}}),
                            &["answer"],
                        ),
                    )],
                    None,
                ),
            }),
            "test_input_required_result_elicitation" => Ok(match inputs.get("user_name") {
                Some(r) => Step::Done(Ok(text(format!("Hello, {}!", content_str(r, "name"))))),
                None => need(
                    vec![(
                        "user_name",
                        elicit("What is your name?", name_schema(), &["name"]),
                    )],
                    None,
                ),
            }),
            "test_input_required_result_sampling" => Ok(match inputs.get("capital_question") {
                Some(r) => Step::Done(Ok(text(format!("The model said: {}", sampled_text(r))))),
                None => need(
                    vec![(
                        "capital_question",
                        sample("What is the capital of France?", 100),
                    )],
                    None,
                ),
            }),
            "test_input_required_result_list_roots" => Ok(match inputs.get("client_roots") {
                Some(r) => Step::Done(Ok(text(format!("Roots: {}", root_uris(r))))),
                None => need(
                    vec![(
                        "client_roots",
                        json!({"method": "roots/list", "params": {}}),
                    )],
                    None,
                ),
            }),
            "test_input_required_result_request_state"
            | "test_input_required_result_tampered_state" => {
                Ok(match (inputs.get("confirm"), state) {
                    (Some(r), Some("confirm")) => {
                        Step::Done(Ok(text(format!("state-ok: confirmed ({})", elicited(r)))))
                    }
                    _ => need(
                        vec![(
                            "confirm",
                            elicit(
                                "Please confirm",
                                json!({"ok": {"type": "boolean"}}),
                                &["ok"],
                            ),
                        )],
                        Some("confirm".into()),
                    ),
                })
            }
            "test_input_required_result_multiple_inputs" => {
                let asks = [
                    (
                        "user_name",
                        elicit("What is your name?", name_schema(), &["name"]),
                    ),
                    ("greeting", sample("Generate a greeting", 50)),
                    (
                        "client_roots",
                        json!({"method": "roots/list", "params": {}}),
                    ),
                ];
                let missing: Vec<(&str, Value)> = asks
                    .into_iter()
                    .filter(|(k, _)| !inputs.contains_key(*k))
                    .collect();
                Ok(if missing.is_empty() && state == Some("all") {
                    Step::Done(Ok(text(format!(
                        "{} says hello to {}; roots: {}",
                        sampled_text(&inputs["greeting"]),
                        content_str(&inputs["user_name"], "name"),
                        root_uris(&inputs["client_roots"])
                    ))))
                } else if missing.is_empty() {
                    // all answers but no state: ask again for everything
                    self.tool(ctx, name, args, &Map::new(), None)?
                } else {
                    need(missing, Some("all".into()))
                })
            }
            "test_input_required_result_multi_round" => Ok(match state {
                Some(s) if s.starts_with("2:") && inputs.contains_key("step2") => {
                    Step::Done(Ok(text(format!(
                        "{} likes {}",
                        &s[2..],
                        content_str(&inputs["step2"], "color")
                    ))))
                }
                Some(s) if s.starts_with("2:") => need(
                    vec![(
                        "step2",
                        elicit(
                            "Step 2: What is your favorite color?",
                            json!({"color": {"type": "string"}}),
                            &["color"],
                        ),
                    )],
                    Some(s.into()),
                ),
                Some("1") if inputs.contains_key("step1") => need(
                    vec![(
                        "step2",
                        elicit(
                            "Step 2: What is your favorite color?",
                            json!({"color": {"type": "string"}}),
                            &["color"],
                        ),
                    )],
                    Some(format!("2:{}", content_str(&inputs["step1"], "name"))),
                ),
                _ => need(
                    vec![(
                        "step1",
                        elicit("Step 1: What is your name?", name_schema(), &["name"]),
                    )],
                    Some("1".into()),
                ),
            }),
            "test_input_required_result_capabilities" => {
                let mut asks = Vec::new();
                if ctx.caps.get("elicitation").is_some() {
                    asks.push((
                        "user_name",
                        elicit("What is your name?", name_schema(), &["name"]),
                    ));
                }
                if ctx.caps.get("sampling").is_some() {
                    asks.push(("greeting", sample("Generate a greeting", 50)));
                }
                if ctx.caps.get("roots").is_some() {
                    asks.push((
                        "client_roots",
                        json!({"method": "roots/list", "params": {}}),
                    ));
                }
                if asks.is_empty() {
                    return done(text("The client declared no capability to ask with"));
                }
                let missing: Vec<(&str, Value)> = asks
                    .into_iter()
                    .filter(|(k, _)| !inputs.contains_key(*k))
                    .collect();
                Ok(if missing.is_empty() {
                    Step::Done(Ok(text(format!("Got {} answer(s)", inputs.len()))))
                } else {
                    need(missing, None)
                })
            }
            _ => Ok(Step::Done(Err(err(
                -32602,
                format!("unknown tool: {name}"),
            )))),
        }
    }
}

fn tool_error(message: impl Into<String>) -> Value {
    let mut r = text(message);
    r["isError"] = json!(true);
    r
}

fn sampled_text(r: &Value) -> String {
    r.pointer("/content/text")
        .and_then(Value::as_str)
        .unwrap_or("(no text)")
        .to_string()
}

fn content_str(r: &Value, key: &str) -> String {
    r.get("content")
        .and_then(|c| c.get(key))
        .and_then(Value::as_str)
        .unwrap_or("(none)")
        .to_string()
}

fn elicited(r: &Value) -> String {
    format!(
        "action={}, content={}",
        r.get("action").and_then(Value::as_str).unwrap_or("(none)"),
        r.get("content").cloned().unwrap_or(json!({}))
    )
}

fn root_uris(r: &Value) -> String {
    let uris: Vec<&str> = r
        .get("roots")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.get("uri").and_then(Value::as_str))
                .collect()
        })
        .unwrap_or_default();
    uris.join(", ")
}

fn prompt(
    name: &str,
    args: &Value,
    inputs: &Map<String, Value>,
    _state: Option<&str>,
) -> io::Result<Step> {
    let user = |content: Value| json!({"role": "user", "content": content});
    let done = |description: &str, messages: Vec<Value>| {
        Ok(Step::Done(Ok(
            json!({"description": description, "messages": messages}),
        )))
    };
    match name {
        "test_simple_prompt" => done(
            "A simple prompt",
            vec![user(
                json!({"type": "text", "text": "This is a simple prompt for testing."}),
            )],
        ),
        "test_prompt_with_arguments" => done(
            "A prompt with arguments",
            vec![user(json!({"type": "text", "text": format!(
                "Prompt with arguments: arg1='{}', arg2='{}'", str_arg(args, "arg1"), str_arg(args, "arg2"))}))],
        ),
        "test_prompt_with_embedded_resource" => done(
            "A prompt with an embedded resource",
            vec![
                user(
                    json!({"type": "resource", "resource": {"uri": str_arg(args, "resourceUri"),
                    "mimeType": "text/plain", "text": "Embedded resource content for testing."}}),
                ),
                user(
                    json!({"type": "text", "text": "Please process the embedded resource above."}),
                ),
            ],
        ),
        "test_prompt_with_image" => done(
            "A prompt with an image",
            vec![
                user(json!({"type": "image", "data": PNG, "mimeType": "image/png"})),
                user(json!({"type": "text", "text": "Please analyze the image above."})),
            ],
        ),
        "test_input_required_result_prompt" => match inputs.get("user_context") {
            Some(r) => done(
                "A prompt built from the user's context",
                vec![user(
                    json!({"type": "text", "text": format!("Use this context: {}", content_str(r, "context"))}),
                )],
            ),
            None => Ok(need(
                vec![(
                    "user_context",
                    elicit(
                        "What context should the prompt use?",
                        json!({"context": {"type": "string"}}),
                        &["context"],
                    ),
                )],
                None,
            )),
        },
        _ => Ok(Step::Done(Err(err(
            -32602,
            format!("unknown prompt: {name}"),
        )))),
    }
}

fn complete(params: &Value) -> Value {
    let value = params
        .pointer("/argument/value")
        .and_then(Value::as_str)
        .unwrap_or("");
    let arg = params
        .pointer("/argument/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let pool: &[&str] = match (params.pointer("/ref/type").and_then(Value::as_str), arg) {
        (Some("ref/prompt"), "arg1" | "arg2") => {
            &["paris", "park", "party", "test", "testValue1", "testValue2"]
        }
        (Some("ref/resource"), "id") => &["1", "2", "3", "123"],
        _ => &[],
    };
    let values: Vec<&str> = pool
        .iter()
        .copied()
        .filter(|v| v.starts_with(value))
        .collect();
    json!({"completion": {"values": values, "total": values.len(), "hasMore": false}})
}

fn main() {
    let mut f = Fixture {
        reader: BufReader::new(io::stdin()),
        out: io::stdout(),
        next_id: 0,
        session: None,
        queue: VecDeque::new(),
        listeners: Vec::new(),
        subscribed: BTreeSet::new(),
        dynamic_tool: false,
        dynamic_prompt: false,
        watched_version: 1,
    };
    if let Err(e) = f.run() {
        if e.kind() != io::ErrorKind::BrokenPipe {
            eprintln!("{NAME}: {e}");
            std::process::exit(1);
        }
    }
}
