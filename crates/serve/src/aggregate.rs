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
//!   template whose fixed start it begins with (`members::Owners`). A later
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

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};

use hyper::Response;
use hyper::StatusCode;
use mcpbox_gateway::message::{to_line, Message, Shape};
use mcpbox_policy::mcp::code::{
    INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, TRANSPORT_ERROR,
};
use mcpbox_policy::mcp::{IdPair, META_PROTOCOL_VERSION};
use mcpbox_policy::Reason;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::body::Body;
use crate::budget::{Budget, Held};
use crate::limits::Slot;
use crate::members::{
    list_kind, member_of_uri, merge_discover, merge_initialize, pick, prefix_names, request_uri,
    template_start, IdMap, Owners, Pick, Uri,
};
use crate::reply::{
    accepted, initialize_task, is_cacheable, is_stateless_request, one_line, open_refusal,
    request_stream, restore, send_refusal, single, Ctx, Refusal,
};
use crate::session::{McpSession, Out, Outbox, StreamError, Waiting};

/// Pages asked of one member for one list, at most.
const MAX_PAGES: usize = 64;

/// One server of an aggregate.
struct Member {
    server: String,
    session: Arc<McpSession>,
}

#[derive(Default)]
struct State {
    /// The ids requests travel under, both ways.
    ids: IdMap,
    /// Who owns which resource URI.
    owners: Owners,
    /// (member, URI or template) pairs already flagged as taken.
    flagged: HashSet<(usize, String)>,
    /// The GET stream (one at a time) and its backlog.
    outbox: Outbox,
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

    fn servers(&self) -> Vec<&str> {
        self.members.iter().map(|m| m.server.as_str()).collect()
    }

    fn member_of_uri(&self, uri: &str) -> Option<usize> {
        member_of_uri(&self.lock().owners, self.members.len(), uri)
    }

    /// Opens the GET stream: one at a time.
    pub(crate) fn open_stream(&self) -> Result<mpsc::Receiver<Held>, StreamError> {
        self.lock().outbox.open(true)
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
        let mut v = msg.value;
        self.lock().ids.asked(member, &mut v, gw.our_id());
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
    /// aggregate's byte budget (as a session's: [`Outbox`]).
    fn unsolicited(&self, message: Vec<u8>) {
        self.lock().outbox.push(&self.budget, message);
    }
}

fn refusal(status: StatusCode, code: i64, reason: Reason, message: impl Into<String>) -> Refusal {
    Refusal::new(status, code, reason, message)
}

/// POST on `/mcp` of a message of the aggregate `agg` (the lookup, the
/// version check and `initialize` are [`crate::http`]'s).
pub(crate) async fn post(
    ctx: &Ctx,
    agg: Arc<Aggregate>,
    msg: Message,
    bytes: &[u8],
    slot: Slot,
) -> Result<Response<Body>, Refusal> {
    match msg.shape {
        Shape::Request => request(ctx, agg, msg, slot).await,
        Shape::Notification => {
            notification(&agg, msg, bytes);
            Ok(accepted())
        }
        _ => {
            // the client's answer to a member's request
            let mut v = msg.value;
            let member = agg.lock().ids.answered(&mut v);
            if let Some(i) = member {
                let _ = agg.members[i].session.send(to_line(&v));
            }
            Ok(accepted())
        }
    }
}

/// A request of the stateless revision (2026-07-28) on `/mcp`: it is
/// answered from the client's stateless session on each server it may use
/// (as on `/servers/<name>/mcp`), merged and routed as for a session.
pub(crate) async fn stateless(
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

fn notification(agg: &Aggregate, msg: Message, bytes: &[u8]) {
    if msg.method() == Some("notifications/cancelled") {
        let mut v = msg.value;
        let member = agg.lock().ids.cancelled(&mut v);
        if let Some(i) = member {
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
    let ours = ctx.gw.our_id();
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
                    _ => Err(json!({"code": INTERNAL_ERROR, "message": "invalid answer"})),
                };
            }
        }
    }
}

fn result(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

fn error(id: &Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// `initialize` on `/mcp`: a session on every server the client may use.
pub(crate) async fn initialize(ctx: &Ctx, msg: Message) -> Result<Response<Body>, Refusal> {
    let id = msg.id().cloned().unwrap_or(Value::Null);
    let task = initialize_task(ctx, &msg).map_err(|r| r.id(id.clone()))?;
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
            .unwrap_or_else(|_| Err(json!({"code": INTERNAL_ERROR, "message": "internal error"})));
        match answer {
            Ok(r) => answers.push((agg.members[i].server.clone(), r)),
            Err(e) => {
                agg.close(&ctx.gw);
                let text = format!(
                    "server {} refused initialize: {}",
                    agg.members[i].server,
                    e.get("message").and_then(Value::as_str).unwrap_or("error")
                );
                let code = e
                    .get("code")
                    .and_then(Value::as_i64)
                    .unwrap_or(INTERNAL_ERROR);
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
        let mut items = items.unwrap_or_default();
        prefix_names(&agg.members[i].server, &mut items);
        all.extend(items);
    }
    let mut out = json!({ key: all });
    if !withheld.is_empty() {
        out["_meta"] = json!({ "mcpbox/withheld": withheld });
    }
    // a stateless (2026-07-28) list says it is whole, and how to cache it:
    // not at all, and for this client only (it merges the client's servers)
    if meta
        .as_ref()
        .is_some_and(|m| m.get(META_PROTOCOL_VERSION).is_some())
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
    let stamp = is_stateless_request(&msg).then(|| is_cacheable(&method));
    let mut value = msg.value;
    let picked = {
        let owners = &agg.lock().owners;
        pick(&method, &mut value, &agg.servers(), owners)
    };
    let target = match picked {
        Pick::Member(i) => Some(i),
        Pick::NotHere => {
            return Ok(single(
                &error(&id, METHOD_NOT_FOUND, &format!("method {method} is not available on the aggregated endpoint; use /servers/<name>/mcp")),
                None,
            ))
        }
        // a URI nobody listed yet: learn the members' resources, then look again
        Pick::Nobody if request_uri(&value).is_some() => {
            learn_uris(ctx, &agg, value.pointer("/params/_meta")).await;
            request_uri(&value).and_then(|u| agg.member_of_uri(u))
        }
        Pick::Nobody => None,
    };
    let Some(member) = target else {
        let text = "no server of this session has that name or URI (names are `<server>__<name>`; list first)";
        return Ok(single(&error(&id, INVALID_PARAMS, text), None));
    };
    let ids = IdPair {
        theirs: id,
        ours: ctx.gw.our_id(),
    };
    ids.forward(&mut value);
    let progress = value.pointer("/params/_meta/progressToken").cloned();
    let session = agg.members[member].session.clone();
    let waiting = session
        .request(&ids.ours, progress.as_ref(), to_line(&value))
        .map_err(|e| send_refusal(e).id(ids.theirs.clone()))?;
    agg.lock().ids.call(member, &ids);
    Ok(stream(ctx, agg, member, waiting, ids, stamp, slot))
}

/// A request's event stream on `/mcp`: what the member sends before the
/// answer, with the client's id back where it names the request
/// ([`restore`]) and the member's own requests under ids of ours; then
/// the answer, given back the same way.
fn stream(
    ctx: &Ctx,
    agg: Arc<Aggregate>,
    member: usize,
    waiting: Waiting,
    ids: IdPair,
    stamp: Option<bool>,
    slot: Slot,
) -> Response<Body> {
    let gw = ctx.gw.clone();
    let (a1, a2, a3) = (agg.clone(), agg.clone(), agg);
    let (i1, i2, i3) = (ids.clone(), ids.clone(), ids.clone());
    request_stream(
        waiting,
        slot,
        ids.theirs,
        None,
        move |m: Vec<u8>| a1.outgoing(member, &restore(&m, &i1, None), &gw),
        move |m: Vec<u8>| {
            a2.lock().ids.done(&i2.theirs);
            restore(&m, &i2, stamp)
        },
        move || {
            a3.lock().ids.done(&i3.theirs);
        },
    )
}
