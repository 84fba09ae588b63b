//! `/mcp`: one MCP session over every server the client may use.
//!
//! An aggregate session holds one member session per server (each its own
//! relay and sandbox, exactly as on `/servers/<name>/mcp`, so policy,
//! pinning, redaction and the audit apply per server). The gateway speaks
//! for them as one server:
//!
//! - `initialize` opens every member and initializes each with the
//!   client's parameters; the answer merges their capabilities (a feature
//!   is on when any member has it), takes the oldest protocol revision any
//!   member agreed to, and joins their instructions, each under its
//!   server's name;
//! - `tools/list`, `prompts/list`, `resources/list` and
//!   `resources/templates/list` are asked of every member (all pages) and
//!   answered in one page, every tool, prompt, resource and template name
//!   prefixed `<server>__` ([`mcpbox_policy::serve::NAME_SEPARATOR`]).
//!   Server names cannot hold `_`, so the first `__` of a name always ends
//!   the server's part, whatever the member named its tool: no collision is
//!   possible;
//! - `tools/call`, `prompts/get` and `completion/complete` (for a prompt)
//!   go to the member the prefix names, with the prefix taken off;
//!   `resources/read`, `subscribe`, `unsubscribe` and `completion/complete`
//!   (for a resource) go to the member that owns the URI, since URIs are
//!   the servers' own and are not renamed: every URI belongs to exactly one
//!   server, the first in the config's order that lists it or has a
//!   template whose fixed start it begins with ([`Owners`]). A later
//!   server's resource or template whose every URI an earlier one owns is
//!   withheld from the lists, named in the list's
//!   `_meta["mcpbox/withheld"]`, logged and audited
//!   (`aggregate.name_taken`): a server added later never takes reads
//!   meant for another, whoever lists first or has the longer prefix;
//! - `ping` is answered by the gateway, `logging/setLevel` and the client's
//!   notifications go to every member, `notifications/cancelled` to the
//!   member working on that request;
//! - every request is forwarded under an id of the gateway's own, and
//!   requests a member sends the client (sampling, elicitation, roots,
//!   mcpbox's approval questions) go out under one too; the client's answer
//!   is mapped back to the member that asked, under its own id. A client
//!   can therefore never address a member it was not given, nor answer a
//!   question for another.
//!
//! Stateless requests (2026-07-28) are answered from the client's stateless
//! session on each server (`Gateway::stateless_session`), merged
//! and routed the same way; `server/discover` is merged too.
//! `subscriptions/listen` is not merged (it goes to a server's own
//! endpoint).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderValue};
use hyper::{Request, Response, StatusCode};
use mcpbox_gateway::message::{id_key, to_line, IdKey, Message, Shape};
use mcpbox_policy::serve::{split_tool_name, tool_name};
use mcpbox_policy::Reason;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use crate::body::Chunk;
use crate::body::{sse_event, Body};
use crate::budget::{Budget, Held};
use crate::http::{
    accepts, check_version, event_stream, header, one_line, open_refusal, plain, request_stream,
    send_refusal, sse_response, Ctx, Refusal, INVALID_REQUEST, SESSION_HEADER, SESSION_NOT_FOUND,
    TRANSPORT_ERROR,
};
use crate::limits::Slot;
use crate::session::{charge_making_room, push_backlog, McpSession, Out, Waiting, STREAM_QUEUE};

/// JSON-RPC: no such method.
const METHOD_NOT_FOUND: i64 = -32601;
/// JSON-RPC: invalid params.
const INVALID_PARAMS: i64 = -32602;
/// Pages asked of one member for one list, at most.
const MAX_PAGES: usize = 64;

/// One server of an aggregate.
struct Member {
    server: String,
    session: Arc<McpSession>,
}

#[derive(Default)]
struct State {
    /// Requests members sent the client, under our ids: ours → (member,
    /// theirs).
    asked: HashMap<IdKey, (usize, Value)>,
    /// The client's requests in flight: its id → (member, our id).
    calls: HashMap<IdKey, (usize, Value)>,
    /// Who owns which resource URI.
    owners: Owners,
    /// (member, URI or template) pairs already flagged as taken.
    flagged: HashSet<(usize, String)>,
    stream: Option<mpsc::Sender<Held>>,
    backlog: VecDeque<Held>,
}

/// A client's session on `/mcp`.
pub struct Aggregate {
    /// Its `Mcp-Session-Id`.
    pub id: String,
    /// The client it belongs to.
    pub client: String,
    members: Vec<Member>,
    state: Mutex<State>,
    /// What it holds for the client (its GET stream and backlog), in
    /// bytes; each member session has its own budget besides.
    budget: Budget,
}

impl std::fmt::Debug for Aggregate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Aggregate")
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

impl Aggregate {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether every member has ended.
    pub fn ended(&self) -> bool {
        self.members.iter().all(|m| m.session.ended())
    }

    /// Ends every member (their relays stop their sandboxes).
    pub fn close(&self, gw: &crate::Gateway) {
        for m in &self.members {
            gw.close_session(&m.session);
        }
    }

    fn member_of_name<'a>(&self, name: &'a str) -> Option<(usize, &'a str)> {
        let (server, rest) = split_tool_name(name)?;
        let i = self.members.iter().position(|m| m.server == server)?;
        Some((i, rest))
    }

    fn member_of_uri(&self, uri: &str) -> Option<usize> {
        let st = self.lock();
        st.owners
            .owner(uri)
            .or((self.members.len() == 1).then_some(0))
    }

    /// A message a member sends the client: a request gets an id of ours
    /// (the client answers that one), anything else passes as it is.
    fn outgoing(&self, member: usize, line: &[u8], gw: &crate::Gateway) -> Vec<u8> {
        let Ok(msg) = Message::parse(line) else {
            return line.to_vec();
        };
        if msg.shape != Shape::Request {
            return line.to_vec();
        }
        let theirs = msg.value.get("id").cloned().unwrap_or(Value::Null);
        let ours = json!(format!("mcpbox-{}", gw.next_id()));
        let mut v = msg.value;
        v["id"] = ours.clone();
        self.lock().asked.insert(id_key(&ours), (member, theirs));
        to_line(&v)
    }

    /// Whether `line` is a `notifications/resources/updated` from `member`
    /// for a URI another member owns: a server must not make the client
    /// re-read (or believe changed) what another server serves. Dropped and
    /// logged; a URI nobody is known to own yet passes.
    fn foreign_update(&self, member: usize, line: &[u8]) -> bool {
        let Ok(msg) = Message::parse(line) else {
            return false;
        };
        if msg.method() != Some("notifications/resources/updated") {
            return false;
        }
        let Some(uri) = msg.value.pointer("/params/uri").and_then(Value::as_str) else {
            return false;
        };
        let owner = self.lock().owners.owner(uri);
        match owner {
            Some(o) if o != member => {
                tracing::warn!(client = %self.client, server = %self.members[member].server, owner = %self.members[o].server, "a resource update for another server's URI dropped");
                true
            }
            _ => false,
        }
    }

    /// A message for the GET stream (or its backlog), within the
    /// aggregate's byte budget (as a session's: [`crate::session`]).
    fn unsolicited(&self, message: Vec<u8>) {
        let mut guard = self.lock();
        let st = &mut *guard;
        let Ok(mut held) = charge_making_room(&self.budget, &mut st.backlog, message) else {
            return;
        };
        if let Some(s) = &st.stream {
            match s.try_send(held) {
                Ok(()) => return,
                Err(mpsc::error::TrySendError::Full(h)) => {
                    tracing::warn!("a slow client's event stream is full: message dropped");
                    self.budget.dropped("stream", h.len());
                    return;
                }
                Err(mpsc::error::TrySendError::Closed(h)) => {
                    st.stream = None;
                    held = h;
                }
            }
        }
        push_backlog(&self.budget, &mut st.backlog, held);
    }
}

/// Who owns each resource URI on `/mcp`: what each member (by its index,
/// the config's order) listed last, resources and templates' fixed starts
/// (the text before the first `{`). A URI belongs to the first member
/// that lists it or has a template it begins with, never to the last one
/// to list it nor to the longest prefix: a server cannot take another's
/// URIs by listing them later or by a template narrower than the owner's.
/// (Tools and prompts need none of this: they are renamed
/// `<server>__<name>`, so each name is one server's by construction.)
#[derive(Debug, Default)]
struct Owners {
    uris: BTreeMap<usize, HashSet<String>>,
    templates: BTreeMap<usize, Vec<String>>,
}

impl Owners {
    /// Whether `member` lists `uri` or has a template it begins with. A
    /// template with no fixed start (`{+uri}`) routes nothing.
    fn covers(&self, member: usize, uri: &str) -> bool {
        self.uris.get(&member).is_some_and(|u| u.contains(uri))
            || self.templates.get(&member).is_some_and(|ts| {
                ts.iter()
                    .any(|t| !t.is_empty() && uri.starts_with(t.as_str()))
            })
    }

    /// The member that owns `uri`: the first in order that covers it.
    fn owner(&self, uri: &str) -> Option<usize> {
        let members: std::collections::BTreeSet<usize> = self
            .uris
            .keys()
            .chain(self.templates.keys())
            .copied()
            .collect();
        members.into_iter().find(|&m| self.covers(m, uri))
    }

    /// The earlier member that owns `uri`, which `member` listed too: its
    /// entry is withheld.
    fn uri_taken(&self, member: usize, uri: &str) -> Option<usize> {
        self.owner(uri).filter(|&o| o < member)
    }

    /// The earlier member whose template covers every URI of `member`'s
    /// template with fixed start `start`: that template is withheld. (A
    /// template only partly covered stays listed; the URIs an earlier
    /// member covers still go to it.)
    fn template_taken(&self, member: usize, start: &str) -> Option<usize> {
        self.templates
            .range(..member)
            .find(|(_, ts)| {
                ts.iter()
                    .any(|t| !t.is_empty() && start.starts_with(t.as_str()))
            })
            .map(|(m, _)| *m)
    }
}

/// A template's fixed start: the text before its first expression.
fn template_start(template: &str) -> &str {
    template.split('{').next().unwrap_or("")
}

fn refusal(status: StatusCode, code: i64, reason: Reason, message: impl Into<String>) -> Refusal {
    Refusal::new(status, code, reason, message)
}

/// The aggregate the request names, if it is this client's.
fn find(ctx: &Ctx, headers: &HeaderMap) -> Result<Arc<Aggregate>, Refusal> {
    let Some(sid) = header(headers, SESSION_HEADER) else {
        return Err(refusal(
            StatusCode::BAD_REQUEST,
            TRANSPORT_ERROR,
            Reason::HttpSessionRequired,
            "Bad Request: Mcp-Session-Id header is required (send initialize first)",
        ));
    };
    match ctx.gw.aggregate(sid) {
        Some(a) if a.client == ctx.client.name && !a.ended() => Ok(a),
        other => {
            if let Some(a) = &other {
                if a.client != ctx.client.name {
                    ctx.gw.audit_access(
                        &ctx.client.name,
                        "",
                        Reason::HttpSessionUnknown,
                        json!({"session_of_other_client": true, "endpoint": "/mcp"}),
                    );
                }
                if a.ended() {
                    ctx.gw.forget_aggregate(&a.id);
                }
            }
            Err(refusal(
                StatusCode::NOT_FOUND,
                SESSION_NOT_FOUND,
                Reason::HttpSessionUnknown,
                "Session not found",
            ))
        }
    }
}

/// POST on `/mcp`.
pub(crate) async fn post(
    ctx: &Ctx,
    headers: &HeaderMap,
    msg: Message,
    bytes: &[u8],
    slot: Slot,
) -> Result<Response<Body>, Refusal> {
    let id = msg.id().cloned().unwrap_or(Value::Null);
    if crate::modern::is_modern(&msg, headers)? {
        return stateless(ctx, msg, bytes, slot).await;
    }
    check_version(headers).map_err(|r| r.id(id.clone()))?;
    let method = msg.method().unwrap_or("").to_string();
    if msg.shape == Shape::Request && method == "initialize" {
        if header(headers, SESSION_HEADER).is_some() {
            return Err(refusal(
                StatusCode::BAD_REQUEST,
                INVALID_REQUEST,
                Reason::RequestInvalid,
                "initialize opens a new session: send it without Mcp-Session-Id",
            )
            .id(id));
        }
        return initialize(ctx, msg, slot).await;
    }
    let agg = find(ctx, headers)?;
    match msg.shape {
        Shape::Request => request(ctx, agg, msg, slot).await,
        Shape::Notification => {
            notification(&agg, msg, bytes);
            Ok(accepted())
        }
        _ => {
            // the client's answer to a member's request
            let key = id_key(&id);
            let route = agg.lock().asked.remove(&key);
            if let Some((i, theirs)) = route {
                let mut v = msg.value;
                v["id"] = theirs;
                let _ = agg.members[i].session.send(to_line(&v));
            }
            Ok(accepted())
        }
    }
}

/// A request of the stateless revision (2026-07-28) on `/mcp`: it is
/// answered from the client's stateless session on each server it may use
/// (as on `/servers/<name>/mcp`), merged and routed as for a session.
async fn stateless(
    ctx: &Ctx,
    msg: Message,
    bytes: &[u8],
    slot: Slot,
) -> Result<Response<Body>, Refusal> {
    let id = msg.id().cloned().unwrap_or(Value::Null);
    let mut members = Vec::new();
    for server in ctx
        .gw
        .settings
        .servers
        .iter()
        .filter(|s| ctx.client.may_use(s))
    {
        let session = ctx
            .gw
            .stateless_session(&ctx.client.name, server, ctx.task.as_deref())
            .await
            .map_err(|r| open_refusal(r).id(id.clone()))?;
        members.push(Member {
            server: server.clone(),
            session,
        });
    }
    let agg = Arc::new(Aggregate {
        id: String::new(),
        client: ctx.client.name.clone(),
        members,
        state: Mutex::new(State::default()),
        budget: ctx.gw.session_budget(&ctx.client.name, ""),
    });
    match msg.shape {
        Shape::Notification => {
            notification(&agg, msg, bytes);
            Ok(accepted())
        }
        Shape::Request if msg.method() == Some("server/discover") => {
            let params = msg.value.get("params").cloned().unwrap_or(json!({}));
            let mut answers = Vec::new();
            for (i, m) in agg.members.iter().enumerate() {
                if let Ok(r) = ask(ctx, &agg, i, "server/discover", params.clone()).await {
                    answers.push((m.server.clone(), r));
                }
            }
            Ok(single(&result(&id, merge_discover(&answers)), None))
        }
        Shape::Request => request(ctx, agg, msg, slot).await,
        _ => Err(refusal(
            StatusCode::BAD_REQUEST,
            INVALID_REQUEST,
            Reason::RequestInvalid,
            "responses cannot be posted without a session",
        )
        .id(id)),
    }
}

fn accepted() -> Response<Body> {
    Response::builder()
        .status(StatusCode::ACCEPTED)
        .body(Body::empty())
        .unwrap_or_else(|_| plain(StatusCode::ACCEPTED, ""))
}

fn notification(agg: &Aggregate, msg: Message, bytes: &[u8]) {
    if msg.method() == Some("notifications/cancelled") {
        let key = msg
            .value
            .pointer("/params/requestId")
            .map(id_key)
            .unwrap_or_default();
        let route = agg.lock().calls.get(&key).cloned();
        if let Some((i, ours)) = route {
            let mut v = msg.value;
            v["params"]["requestId"] = ours;
            let _ = agg.members[i].session.send(to_line(&v));
        }
        return;
    }
    let line = one_line(bytes, &msg);
    for m in &agg.members {
        let _ = m.session.send(line.clone());
    }
}

/// Asks one member `method` with `params` under our own id and waits for
/// its answer; what the member sends the client meanwhile goes to the GET
/// stream. `Err` holds the JSON-RPC error object.
async fn ask(
    ctx: &Ctx,
    agg: &Aggregate,
    member: usize,
    method: &str,
    params: Value,
) -> Result<Value, Value> {
    let ours = json!(format!("mcpbox-{}", ctx.gw.next_id()));
    let line = to_line(&json!({"jsonrpc": "2.0", "id": ours, "method": method, "params": params}));
    let session = &agg.members[member].session;
    let mut waiting = session
        .request(&ours, None, line)
        .map_err(|e| json!({"code": mcpbox_gateway::CODE_SERVER_EXITED, "message": format!("server {} is not available ({e:?})", agg.members[member].server)}))?;
    loop {
        match waiting.rx.recv().await {
            None => {
                return Err(
                    json!({"code": mcpbox_gateway::CODE_SERVER_EXITED, "message": "the server ended"}),
                )
            }
            Some(Out::Message(m)) => {
                waiting.took();
                if !agg.foreign_update(member, &m.bytes) {
                    agg.unsolicited(agg.outgoing(member, &m.bytes, &ctx.gw));
                }
            }
            Some(Out::Final(m)) => {
                let v: Value = serde_json::from_slice(&m.bytes).unwrap_or(Value::Null);
                return match (v.get("result"), v.get("error")) {
                    (Some(r), _) => Ok(r.clone()),
                    (_, Some(e)) => Err(e.clone()),
                    _ => Err(json!({"code": -32603, "message": "invalid answer"})),
                };
            }
        }
    }
}

/// One event stream with one answer.
fn single(answer: &Value, sid: Option<&str>) -> Response<Body> {
    let (tx, rx) = mpsc::channel::<Chunk>(1);
    let _ = tx.try_send(Chunk::own(sse_event(&to_line(answer))));
    let mut r = sse_response(rx);
    if let Some(v) = sid.and_then(|s| HeaderValue::from_str(s).ok()) {
        r.headers_mut().insert(SESSION_HEADER, v);
    }
    r
}

fn result(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

fn error(id: &Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

async fn initialize(ctx: &Ctx, msg: Message, _slot: Slot) -> Result<Response<Body>, Refusal> {
    let id = msg.id().cloned().unwrap_or(Value::Null);
    let task = crate::http::initialize_task(ctx, &msg).map_err(|r| r.id(id.clone()))?;
    let params = msg.value.get("params").cloned().unwrap_or(json!({}));
    let servers: Vec<String> = ctx
        .gw
        .settings
        .servers
        .iter()
        .filter(|s| ctx.client.may_use(s))
        .cloned()
        .collect();
    if servers.is_empty() {
        return Err(refusal(
            StatusCode::FORBIDDEN,
            TRANSPORT_ERROR,
            Reason::HttpServerForbidden,
            "this client may use no server",
        )
        .id(id));
    }
    let mut members = Vec::new();
    for server in &servers {
        match ctx
            .gw
            .open_session(&ctx.client.name, server, task.as_deref(), false)
            .await
        {
            Ok(session) => members.push(Member {
                server: server.clone(),
                session,
            }),
            Err(reason) => {
                for m in &members {
                    ctx.gw.close_session(&m.session);
                }
                return Err(open_refusal(reason).id(id));
            }
        }
    }
    let agg = Arc::new(Aggregate {
        id: crate::session_id(),
        client: ctx.client.name.clone(),
        members,
        state: Mutex::new(State::default()),
        budget: ctx.gw.session_budget(&ctx.client.name, ""),
    });
    // every member starts at once; the answers are awaited in turn
    let mut pending = Vec::new();
    for i in 0..agg.members.len() {
        let (ctx2, agg2, params2) = (ctx.clone(), agg.clone(), params.clone());
        pending.push(tokio::spawn(async move {
            ask(&ctx2, &agg2, i, "initialize", params2).await
        }));
    }
    let mut answers = Vec::new();
    for (i, p) in pending.into_iter().enumerate() {
        let answer = p
            .await
            .unwrap_or_else(|_| Err(json!({"code": -32603, "message": "internal error"})));
        match answer {
            Ok(r) => answers.push((agg.members[i].server.clone(), r)),
            Err(e) => {
                agg.close(&ctx.gw);
                let text = format!(
                    "server {} refused initialize: {}",
                    agg.members[i].server,
                    e.get("message").and_then(Value::as_str).unwrap_or("error")
                );
                let code = e.get("code").and_then(Value::as_i64).unwrap_or(-32603);
                return Ok(single(&error(&id, code, &text), None));
            }
        }
    }
    let merged = merge_initialize(&params, &answers);
    // what members send the client on their own goes to our GET stream
    for (i, m) in agg.members.iter().enumerate() {
        let Ok(mut rx) = m.session.open_stream() else {
            continue;
        };
        let (agg2, gw) = (agg.clone(), ctx.gw.clone());
        tokio::spawn(async move {
            while let Some(line) = rx.recv().await {
                if !agg2.foreign_update(i, &line.bytes) {
                    agg2.unsolicited(agg2.outgoing(i, &line.bytes, &gw));
                }
            }
        });
    }
    ctx.gw.insert_aggregate(agg.clone());
    Ok(single(&result(&id, merged), Some(&agg.id)))
}

/// The members' capabilities as one: a feature is on when any member has it.
fn merge_capabilities(answers: &[(String, Value)]) -> Map<String, Value> {
    let mut caps = Map::new();
    for (_, r) in answers {
        let Some(Value::Object(c)) = r.get("capabilities") else {
            continue;
        };
        for (k, v) in c {
            let entry = caps.entry(k.clone()).or_insert_with(|| json!({}));
            if let (Value::Object(into), Value::Object(from)) = (entry, v) {
                for (fk, fv) in from {
                    let on = fv.as_bool().unwrap_or(false)
                        || into.get(fk).and_then(Value::as_bool).unwrap_or(false);
                    if fv.is_boolean() {
                        into.insert(fk.clone(), Value::Bool(on));
                    } else {
                        into.entry(fk.clone()).or_insert_with(|| fv.clone());
                    }
                }
            }
        }
    }
    caps
}

/// The members' instructions, each under its server's name.
fn merge_instructions(answers: &[(String, Value)], into: &mut Value) {
    let instructions: Vec<String> = answers
        .iter()
        .filter_map(|(s, r)| {
            r.get("instructions")
                .and_then(Value::as_str)
                .filter(|t| !t.trim().is_empty())
                .map(|t| format!("[{s}] {t}"))
        })
        .collect();
    if !instructions.is_empty() {
        into["instructions"] = Value::String(instructions.join("\n\n"));
    }
}

/// The gateway's name in merged answers.
fn server_info() -> Value {
    json!({"name": "mcpbox", "version": env!("CARGO_PKG_VERSION")})
}

/// The members' `initialize` results as one.
fn merge_initialize(params: &Value, answers: &[(String, Value)]) -> Value {
    let requested = params
        .get("protocolVersion")
        .and_then(Value::as_str)
        .unwrap_or("2025-11-25");
    let version = answers
        .iter()
        .filter_map(|(_, r)| r.get("protocolVersion").and_then(Value::as_str))
        .min()
        .unwrap_or(requested)
        .to_string();
    let mut out = json!({
        "protocolVersion": version,
        "capabilities": merge_capabilities(answers),
        "serverInfo": server_info(),
    });
    merge_instructions(answers, &mut out);
    out
}

/// The members' `server/discover` results (2026-07-28) as one: the
/// revisions every member speaks, the union of their capabilities.
fn merge_discover(answers: &[(String, Value)]) -> Value {
    let versions = |r: &Value| -> Vec<String> {
        r.get("supportedVersions")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut common = answers
        .first()
        .map(|(_, r)| versions(r))
        .unwrap_or_default();
    for (_, r) in answers.iter().skip(1) {
        let theirs = versions(r);
        common.retain(|v| theirs.contains(v));
    }
    let mut out = json!({
        "supportedVersions": common,
        "capabilities": merge_capabilities(answers),
        "resultType": "complete",
        "_meta": {"io.modelcontextprotocol/serverInfo": server_info()},
    });
    merge_instructions(answers, &mut out);
    out
}

/// The list methods: (method, the result's array, whether its entries
/// have a URI to remember, or a URI template).
fn list_kind(method: &str) -> Option<(&'static str, Uri)> {
    match method {
        "tools/list" => Some(("tools", Uri::None)),
        "prompts/list" => Some(("prompts", Uri::None)),
        "resources/list" => Some(("resources", Uri::Plain)),
        "resources/templates/list" => Some(("resourceTemplates", Uri::Template)),
        _ => None,
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Uri {
    None,
    Plain,
    Template,
}

/// Every page of `method` from every member: (member, its items), or
/// `None` for a member that failed or has no such feature.
async fn fetch(
    ctx: &Ctx,
    agg: &Arc<Aggregate>,
    method: &str,
    key: &str,
    meta: Option<&Value>,
) -> Vec<(usize, Option<Vec<Value>>)> {
    let mut out = Vec::new();
    for i in 0..agg.members.len() {
        let mut items: Option<Vec<Value>> = None;
        let mut cursor: Option<Value> = None;
        for _ in 0..MAX_PAGES {
            let mut params = json!({});
            if let Some(c) = &cursor {
                params["cursor"] = c.clone();
            }
            if let Some(meta) = meta {
                params["_meta"] = meta.clone();
            }
            let Ok(page) = ask(ctx, agg, i, method, params).await else {
                // a member without this feature (or that failed) adds nothing
                break;
            };
            items.get_or_insert_with(Vec::new).extend(
                page.get(key)
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default(),
            );
            cursor = page.get("nextCursor").filter(|c| !c.is_null()).cloned();
            if cursor.is_none() {
                break;
            }
        }
        out.push((i, items));
    }
    out
}

async fn list(ctx: &Ctx, agg: &Arc<Aggregate>, msg: &Message, key: &str, uri: Uri) -> Value {
    let id = msg.id().cloned().unwrap_or(Value::Null);
    let method = msg.method().unwrap_or("");
    let meta = msg.value.pointer("/params/_meta").cloned();
    let (lists, withheld) = match uri {
        Uri::None => (
            fetch(ctx, agg, method, key, meta.as_ref()).await,
            Vec::new(),
        ),
        Uri::Plain | Uri::Template => {
            // both kinds, so that who owns what is decided on everything
            // the members list, whichever list the client asked for
            let (resources, templates) = learn_uris(ctx, agg, meta.as_ref()).await;
            let lists = if uri == Uri::Plain {
                resources
            } else {
                templates
            };
            owned_only(ctx, agg, lists, uri)
        }
    };
    let mut all = Vec::new();
    for (i, items) in lists {
        let server = &agg.members[i].server;
        for mut item in items.unwrap_or_default() {
            if let Some(name) = item.get("name").and_then(Value::as_str) {
                item["name"] = Value::String(tool_name(server, name));
            }
            all.push(item);
        }
    }
    let mut out = json!({ key: all });
    if !withheld.is_empty() {
        out["_meta"] = json!({ "mcpbox/withheld": withheld });
    }
    // a stateless (2026-07-28) list says it is whole, and how to cache it:
    // not at all, and for this client only (it merges the client's servers)
    if meta
        .as_ref()
        .is_some_and(|m| m.get(crate::modern::META_VERSION).is_some())
    {
        out["resultType"] = json!("complete");
        out["ttlMs"] = json!(0);
        out["cacheScope"] = json!("private");
    }
    result(&id, out)
}

/// The members' resources or templates without the entries an earlier
/// member owns ([`Owners`]), and what was withheld: each flagged once per
/// aggregate (log and audit).
#[allow(clippy::type_complexity)]
fn owned_only(
    ctx: &Ctx,
    agg: &Arc<Aggregate>,
    lists: Vec<(usize, Option<Vec<Value>>)>,
    uri: Uri,
) -> (Vec<(usize, Option<Vec<Value>>)>, Vec<Value>) {
    let field = if uri == Uri::Plain {
        "uri"
    } else {
        "uriTemplate"
    };
    let mut withheld = Vec::new();
    let mut kept = Vec::new();
    let mut st = agg.lock();
    for (i, items) in lists {
        let Some(items) = items else {
            kept.push((i, None));
            continue;
        };
        let mut mine = Vec::new();
        for item in items {
            let Some(name) = item.get(field).and_then(Value::as_str) else {
                mine.push(item);
                continue;
            };
            let taken = if uri == Uri::Plain {
                st.owners.uri_taken(i, name)
            } else {
                st.owners.template_taken(i, template_start(name))
            };
            let Some(owner) = taken else {
                mine.push(item);
                continue;
            };
            let (server, owner) = (&agg.members[i].server, &agg.members[owner].server);
            withheld.push(json!({"server": server, field: name, "owner": owner}));
            if st.flagged.insert((i, name.to_string())) {
                tracing::warn!(client = %agg.client, server, owner, field, name, "a server listed a resource another server owns on /mcp; withheld");
                ctx.gw.backend.audit(mcpbox_audit::Event {
                    kind: Some(mcpbox_audit::Kind::Flag),
                    caller: agg.client.clone(),
                    server: server.clone(),
                    reason: Some(Reason::AggregateNameTaken.as_str().to_string()),
                    source: Some(mcpbox_policy::Source::ServeAggregate.to_string()),
                    detail: json!({ field: name, "owner": owner }),
                    ..mcpbox_audit::Event::default()
                });
            }
        }
        kept.push((i, Some(mine)));
    }
    (kept, withheld)
}

/// Asks every member for its resources and templates (all pages) and
/// records who owns what; returns both lists. A member that failed keeps
/// what it listed before.
#[allow(clippy::type_complexity)]
async fn learn_uris(
    ctx: &Ctx,
    agg: &Arc<Aggregate>,
    meta: Option<&Value>,
) -> (
    Vec<(usize, Option<Vec<Value>>)>,
    Vec<(usize, Option<Vec<Value>>)>,
) {
    // a request's own progress token is not the lists'
    let meta = meta.cloned().map(|mut m| {
        if let Some(o) = m.as_object_mut() {
            o.remove("progressToken");
        }
        m
    });
    let resources = fetch(ctx, agg, "resources/list", "resources", meta.as_ref()).await;
    let templates = fetch(
        ctx,
        agg,
        "resources/templates/list",
        "resourceTemplates",
        meta.as_ref(),
    )
    .await;
    let mut st = agg.lock();
    for (i, items) in &resources {
        if let Some(items) = items {
            let uris = items
                .iter()
                .filter_map(|it| it.get("uri").and_then(Value::as_str))
                .map(str::to_string)
                .collect();
            st.owners.uris.insert(*i, uris);
        }
    }
    for (i, items) in &templates {
        if let Some(items) = items {
            let starts = items
                .iter()
                .filter_map(|it| it.get("uriTemplate").and_then(Value::as_str))
                .map(|t| template_start(t).to_string())
                .collect();
            st.owners.templates.insert(*i, starts);
        }
    }
    drop(st);
    (resources, templates)
}

async fn request(
    ctx: &Ctx,
    agg: Arc<Aggregate>,
    msg: Message,
    slot: Slot,
) -> Result<Response<Body>, Refusal> {
    let id = msg.id().cloned().unwrap_or(Value::Null);
    let method = msg.method().unwrap_or("").to_string();
    if method == "ping" {
        return Ok(single(&result(&id, json!({})), None));
    }
    if let Some((key, uri)) = list_kind(&method) {
        let answer = list(ctx, &agg, &msg, key, uri).await;
        return Ok(single(&answer, None));
    }
    if method == "logging/setLevel" {
        let params = msg.value.get("params").cloned().unwrap_or(json!({}));
        for i in 0..agg.members.len() {
            let _ = ask(ctx, &agg, i, &method, params.clone()).await;
        }
        return Ok(single(&result(&id, json!({})), None));
    }
    // a request of the stateless revision: its answer must carry what
    // that revision requires, which an older member leaves out
    let stamp = msg
        .value
        .pointer("/params/_meta")
        .is_some_and(|m| m.get(crate::modern::META_VERSION).is_some())
        .then(|| crate::modern::is_cacheable(&method));
    let mut value = msg.value;
    let target = match method.as_str() {
        "tools/call" | "prompts/get" => {
            let name = value.pointer("/params/name").and_then(Value::as_str).unwrap_or("");
            agg.member_of_name(name).map(|(i, rest)| (i, rest.to_string())).map(|(i, rest)| {
                value["params"]["name"] = Value::String(rest);
                i
            })
        }
        "completion/complete" => {
            let reference = value.pointer("/params/ref").cloned().unwrap_or(Value::Null);
            match reference.get("type").and_then(Value::as_str) {
                Some("ref/prompt") => {
                    let name = reference.get("name").and_then(Value::as_str).unwrap_or("");
                    agg.member_of_name(name).map(|(i, rest)| (i, rest.to_string())).map(|(i, rest)| {
                        value["params"]["ref"]["name"] = Value::String(rest);
                        i
                    })
                }
                _ => reference
                    .get("uri")
                    .and_then(Value::as_str)
                    .and_then(|u| agg.member_of_uri(u)),
            }
        }
        "resources/read" | "resources/subscribe" | "resources/unsubscribe" => value
            .pointer("/params/uri")
            .and_then(Value::as_str)
            .and_then(|u| agg.member_of_uri(u)),
        _ => {
            return Ok(single(
                &error(&id, METHOD_NOT_FOUND, &format!("method {method} is not available on the aggregated endpoint; use /servers/<name>/mcp")),
                None,
            ))
        }
    };
    // a URI nobody listed yet: learn the members' resources, then look again
    let target = match target {
        None if value.pointer("/params/uri").is_some()
            || value.pointer("/params/ref/uri").is_some() =>
        {
            learn_uris(ctx, &agg, value.pointer("/params/_meta")).await;
            value
                .pointer("/params/uri")
                .or_else(|| value.pointer("/params/ref/uri"))
                .and_then(Value::as_str)
                .and_then(|u| agg.member_of_uri(u))
        }
        t => t,
    };
    let Some(member) = target else {
        let text = "no server of this session has that name or URI (names are `<server>__<name>`; list first)";
        return Ok(single(&error(&id, INVALID_PARAMS, text), None));
    };
    let ours = json!(format!("mcpbox-{}", ctx.gw.next_id()));
    value["id"] = ours.clone();
    let progress = value.pointer("/params/_meta/progressToken").cloned();
    let session = agg.members[member].session.clone();
    let waiting = session
        .request(&ours, progress.as_ref(), to_line(&value))
        .map_err(|e| send_refusal(e).id(id.clone()))?;
    agg.lock().calls.insert(id_key(&id), (member, ours));
    Ok(stream(ctx, agg, member, waiting, (id, stamp), slot))
}

/// The client's id back on the member's answer; for a request of the
/// stateless revision (`stamp`: whether its result is cacheable), the
/// result completed as that revision requires.
fn restore(line: &[u8], theirs: &Value, stamp: Option<bool>) -> Vec<u8> {
    match serde_json::from_slice::<Value>(line) {
        Ok(mut v) => {
            v["id"] = theirs.clone();
            if let Some(cacheable) = stamp {
                crate::modern::complete_result(&mut v, cacheable);
            }
            to_line(&v)
        }
        Err(_) => line.to_vec(),
    }
}

fn stream(
    ctx: &Ctx,
    agg: Arc<Aggregate>,
    member: usize,
    waiting: Waiting,
    (theirs, stamp): (Value, Option<bool>),
    slot: Slot,
) -> Response<Body> {
    let gw = ctx.gw.clone();
    let key = id_key(&theirs);
    let (a1, a2, a3) = (agg.clone(), agg.clone(), agg);
    let (k2, k3) = (key.clone(), key);
    let back = theirs.clone();
    request_stream(
        waiting,
        slot,
        theirs,
        None,
        move |m: Vec<u8>| a1.outgoing(member, &m, &gw),
        move |m: Vec<u8>| {
            a2.lock().calls.remove(&k2);
            restore(&m, &back, stamp)
        },
        move || {
            a3.lock().calls.remove(&k3);
        },
    )
}

/// GET on `/mcp`: what the members send the client on their own.
pub(crate) fn get(ctx: &Ctx, req: &Request<Incoming>) -> Result<Response<Body>, Refusal> {
    let headers = req.headers();
    if !accepts(headers, "text/event-stream") {
        return Err(refusal(
            StatusCode::NOT_ACCEPTABLE,
            TRANSPORT_ERROR,
            Reason::HttpAccept,
            "Not Acceptable: Accept must list text/event-stream",
        ));
    }
    check_version(headers)?;
    let agg = find(ctx, headers)?;
    let Some(slot) = ctx.gw.limits_of(&ctx.client.name).stream() else {
        return Err(refusal(
            StatusCode::TOO_MANY_REQUESTS,
            TRANSPORT_ERROR,
            Reason::HttpStreamLimit,
            "this client has too many open streams",
        ));
    };
    let (tx, events) = mpsc::channel::<Held>(STREAM_QUEUE);
    {
        let mut st = agg.lock();
        if st.stream.as_ref().is_some_and(|s| !s.is_closed()) {
            return Err(refusal(
                StatusCode::CONFLICT,
                TRANSPORT_ERROR,
                Reason::HttpStreamLimit,
                "Conflict: this session has an open stream already",
            ));
        }
        while let Some(m) = st.backlog.pop_front() {
            if let Err(mpsc::error::TrySendError::Full(m)) = tx.try_send(m) {
                st.backlog.push_front(m);
                break;
            }
        }
        st.stream = Some(tx);
    }
    Ok(event_stream(events, slot))
}

/// DELETE on `/mcp`: every member's sandbox is torn down.
pub(crate) fn delete(ctx: &Ctx, req: &Request<Incoming>) -> Result<Response<Body>, Refusal> {
    let agg = find(ctx, req.headers())?;
    ctx.gw.forget_aggregate(&agg.id);
    agg.close(&ctx.gw);
    Ok(plain(StatusCode::OK, ""))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owners(uris: &[(usize, &[&str])], templates: &[(usize, &[&str])]) -> Owners {
        let mut o = Owners::default();
        for (i, u) in uris {
            o.uris.insert(*i, u.iter().map(|s| s.to_string()).collect());
        }
        for (i, t) in templates {
            let starts = t.iter().map(|s| template_start(s).to_string()).collect();
            o.templates.insert(*i, starts);
        }
        o
    }

    #[test]
    fn a_later_server_never_owns_a_uri_an_earlier_one_lists() {
        // 1 lists what 0 lists, and has a narrower template: longest
        // prefix or last lister would route to 1
        let o = owners(
            &[(0, &["shared://doc"]), (1, &["shared://doc", "b://own"])],
            &[
                (0, &["shared://files/{path}"]),
                (1, &["shared://files/secret/{name}", "b://t/{x}"]),
            ],
        );
        assert_eq!(o.owner("shared://doc"), Some(0));
        assert_eq!(o.owner("shared://files/secret/k"), Some(0));
        assert_eq!(o.owner("b://own"), Some(1));
        assert_eq!(o.owner("b://t/1"), Some(1));
        assert_eq!(o.owner("nobody://x"), None);
        assert_eq!(o.uri_taken(1, "shared://doc"), Some(0));
        assert_eq!(o.uri_taken(0, "shared://doc"), None);
        assert_eq!(o.uri_taken(1, "b://own"), None);
        assert_eq!(o.template_taken(1, "shared://files/secret/"), Some(0));
        assert_eq!(o.template_taken(1, "b://t/"), None);
        // a broader later template stays, but what the earlier one
        // covers is still the earlier one's
        let o = owners(&[], &[(0, &["x://a/{n}"]), (1, &["x://{p}"])]);
        assert_eq!(o.template_taken(1, "x://"), None);
        assert_eq!(o.owner("x://a/1"), Some(0));
        assert_eq!(o.owner("x://b/1"), Some(1));
        // a template with no fixed start routes nothing
        let o = owners(&[], &[(0, &["{+uri}"])]);
        assert_eq!(o.owner("file:///etc/passwd"), None);
    }

    #[test]
    fn merged_capabilities_are_the_union_and_the_version_the_oldest() {
        let answers = vec![
            (
                "a".to_string(),
                json!({"protocolVersion": "2025-11-25", "capabilities": {"tools": {"listChanged": false}}, "instructions": "use a"}),
            ),
            (
                "b".to_string(),
                json!({"protocolVersion": "2025-06-18", "capabilities": {"tools": {"listChanged": true}, "prompts": {}}}),
            ),
        ];
        let m = merge_initialize(&json!({"protocolVersion": "2025-11-25"}), &answers);
        assert_eq!(m["protocolVersion"], "2025-06-18");
        assert_eq!(m["capabilities"]["tools"]["listChanged"], true);
        assert!(m["capabilities"]["prompts"].is_object());
        assert_eq!(m["instructions"], "[a] use a");
        assert_eq!(m["serverInfo"]["name"], "mcpbox");
    }
}
