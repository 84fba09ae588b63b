//! The aggregation core of `/mcp`, pure (no session, no lock, no I/O):
//! which member a request goes to and under what name ([`pick`]), who
//! owns a resource URI ([`Owners`]), how the members' answers merge
//! ([`merge_initialize`], [`merge_discover`], [`prefix_names`]), and the
//! ids the aggregate forwards under ([`IdMap`]). [`crate::aggregate`]
//! asks the members and performs what this decides; everything here is
//! tested as tables.

use std::collections::{BTreeMap, HashMap, HashSet};

use mcpbox_gateway::message::{id_key, IdKey};
use mcpbox_policy::mcp::{self, IdPair};
use mcpbox_policy::serve::{split_tool_name, tool_name};
use serde_json::{json, Map, Value};

/// Where a request on `/mcp` goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Pick {
    /// To this member (its name, if it had one, without the prefix).
    Member(usize),
    /// To whoever owns the URI or name, but none is known (yet).
    Nobody,
    /// The method is not served on `/mcp`.
    NotHere,
}

/// The member a prefixed name (`<server>__<name>`) belongs to, and the
/// name without the prefix.
pub(crate) fn member_of_name<'a, S: AsRef<str>>(
    servers: &[S],
    name: &'a str,
) -> Option<(usize, &'a str)> {
    let (server, rest) = split_tool_name(name)?;
    let i = servers.iter().position(|s| s.as_ref() == server)?;
    Some((i, rest))
}

/// The member that owns `uri`; with one member, that one.
pub(crate) fn member_of_uri(owners: &Owners, members: usize, uri: &str) -> Option<usize> {
    owners.owner(uri).or((members == 1).then_some(0))
}

/// The URI a request names (`params.uri`, or a completion's `params.ref.uri`).
pub(crate) fn request_uri(request: &Value) -> Option<&str> {
    request
        .pointer("/params/uri")
        .or_else(|| request.pointer("/params/ref/uri"))
        .and_then(Value::as_str)
}

/// Where the client's request `method` goes among `servers` (the
/// members, in order), its name's prefix taken off in `request`:
/// `tools/call`, `prompts/get` and a prompt's `completion/complete` by
/// name; `resources/read`, `subscribe`, `unsubscribe` and a resource's
/// `completion/complete` by who owns the URI. (`ping`, the lists and
/// `logging/setLevel` the aggregate answers itself.)
pub(crate) fn pick<S: AsRef<str>>(
    method: &str,
    request: &mut Value,
    servers: &[S],
    owners: &Owners,
) -> Pick {
    let by_name = |request: &mut Value, at: &str| -> Pick {
        let name = request.pointer(at).and_then(Value::as_str).unwrap_or("");
        match member_of_name(servers, name) {
            Some((i, rest)) => {
                let rest = Value::String(rest.to_string());
                if let Some(slot) = request.pointer_mut(at) {
                    *slot = rest;
                }
                Pick::Member(i)
            }
            None => Pick::Nobody,
        }
    };
    let by_uri = |request: &Value| -> Pick {
        request_uri(request)
            .and_then(|u| member_of_uri(owners, servers.len(), u))
            .map_or(Pick::Nobody, Pick::Member)
    };
    match method {
        "tools/call" | "prompts/get" => by_name(request, "/params/name"),
        "completion/complete" => {
            let prompt =
                request.pointer("/params/ref/type").and_then(Value::as_str) == Some("ref/prompt");
            if prompt {
                by_name(request, "/params/ref/name")
            } else {
                by_uri(request)
            }
        }
        "resources/read" | "resources/subscribe" | "resources/unsubscribe" => by_uri(request),
        _ => Pick::NotHere,
    }
}

/// Every item's `name` prefixed with its server's (`<server>__<name>`).
pub(crate) fn prefix_names(server: &str, items: &mut [Value]) {
    for item in items {
        if let Some(name) = item.get("name").and_then(Value::as_str) {
            item["name"] = Value::String(tool_name(server, name));
        }
    }
}

/// The ids an aggregate forwards under, both ways: the client's requests
/// to a member (its id → the member and our id; a cancellation follows
/// them), and a member's requests to the client (our id → the member and
/// its id; the client's answer goes back to that member only, under its
/// own id). A client can therefore never address a member it was not
/// given, nor answer a question for another.
#[derive(Debug, Default)]
pub(crate) struct IdMap {
    /// Requests members sent the client: ours → (member, theirs).
    asked: HashMap<IdKey, (usize, Value)>,
    /// The client's requests in flight: its id → (member, our id).
    calls: HashMap<IdKey, (usize, Value)>,
}

impl IdMap {
    /// A member's request to the client, given our id `ours`.
    pub(crate) fn asked(&mut self, member: usize, request: &mut Value, ours: Value) {
        let theirs = request.get("id").cloned().unwrap_or(Value::Null);
        mcp::set_id(request, ours.clone());
        self.asked.insert(id_key(&ours), (member, theirs));
    }

    /// The client's answer to a member's request: the member it goes to,
    /// with the member's own id on it (once; an unknown id goes nowhere).
    pub(crate) fn answered(&mut self, answer: &mut Value) -> Option<usize> {
        let key = answer.get("id").map(id_key).unwrap_or_default();
        let (member, theirs) = self.asked.remove(&key)?;
        mcp::set_id(answer, theirs);
        Some(member)
    }

    /// The client's request `ids` went to `member`.
    pub(crate) fn call(&mut self, member: usize, ids: &IdPair) {
        self.calls
            .insert(id_key(&ids.theirs), (member, ids.ours.clone()));
    }

    /// The client's request `theirs` is done (answered, or it left).
    pub(crate) fn done(&mut self, theirs: &Value) {
        self.calls.remove(&id_key(theirs));
    }

    /// The client cancels one of its requests: the member working on it,
    /// with our id on the cancellation.
    pub(crate) fn cancelled(&self, cancel: &mut Value) -> Option<usize> {
        let key = mcp::cancelled_request(cancel).map(id_key)?;
        let (member, ours) = self.calls.get(&key)?.clone();
        mcp::set_cancelled_request(cancel, ours);
        Some(member)
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
pub(crate) struct Owners {
    pub(crate) uris: BTreeMap<usize, HashSet<String>>,
    pub(crate) templates: BTreeMap<usize, Vec<String>>,
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
    pub(crate) fn owner(&self, uri: &str) -> Option<usize> {
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
    pub(crate) fn uri_taken(&self, member: usize, uri: &str) -> Option<usize> {
        self.owner(uri).filter(|&o| o < member)
    }

    /// The earlier member whose template covers every URI of `member`'s
    /// template with fixed start `start`: that template is withheld. (A
    /// template only partly covered stays listed; the URIs an earlier
    /// member covers still go to it.)
    pub(crate) fn template_taken(&self, member: usize, start: &str) -> Option<usize> {
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
pub(crate) fn template_start(template: &str) -> &str {
    template.split('{').next().unwrap_or("")
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
pub(crate) fn merge_initialize(params: &Value, answers: &[(String, Value)]) -> Value {
    let requested = params
        .get("protocolVersion")
        .and_then(Value::as_str)
        .unwrap_or(mcp::LATEST_SESSION_REVISION);
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
pub(crate) fn merge_discover(answers: &[(String, Value)]) -> Value {
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
        "_meta": {mcp::META_SERVER_INFO: server_info()},
    });
    merge_instructions(answers, &mut out);
    out
}

/// The list methods: (method, the result's array, whether its entries
/// have a URI to remember, or a URI template).
pub(crate) fn list_kind(method: &str) -> Option<(&'static str, Uri)> {
    match method {
        "tools/list" => Some(("tools", Uri::None)),
        "prompts/list" => Some(("prompts", Uri::None)),
        "resources/list" => Some(("resources", Uri::Plain)),
        "resources/templates/list" => Some(("resourceTemplates", Uri::Template)),
        _ => None,
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Uri {
    None,
    Plain,
    Template,
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

    #[test]
    fn each_request_goes_to_the_member_its_name_or_uri_names() {
        let servers = ["fs", "web"];
        let o = owners(&[(1, &["web://page"])], &[(0, &["file:///{path}"])]);
        // (method, params, where it goes, the params after)
        let cases = [
            (
                "tools/call",
                json!({"name": "fs__read"}),
                Pick::Member(0),
                json!({"name": "read"}),
            ),
            // only the first `__` ends the server's part
            (
                "tools/call",
                json!({"name": "web__a__b"}),
                Pick::Member(1),
                json!({"name": "a__b"}),
            ),
            (
                "prompts/get",
                json!({"name": "web__p"}),
                Pick::Member(1),
                json!({"name": "p"}),
            ),
            (
                "tools/call",
                json!({"name": "other__x"}),
                Pick::Nobody,
                json!({"name": "other__x"}),
            ),
            (
                "tools/call",
                json!({"name": "read"}),
                Pick::Nobody,
                json!({"name": "read"}),
            ),
            ("tools/call", json!({}), Pick::Nobody, json!({})),
            (
                "resources/read",
                json!({"uri": "web://page"}),
                Pick::Member(1),
                json!({"uri": "web://page"}),
            ),
            (
                "resources/subscribe",
                json!({"uri": "file:///etc/x"}),
                Pick::Member(0),
                json!({"uri": "file:///etc/x"}),
            ),
            (
                "resources/read",
                json!({"uri": "nobody://x"}),
                Pick::Nobody,
                json!({"uri": "nobody://x"}),
            ),
            (
                "completion/complete",
                json!({"ref": {"type": "ref/prompt", "name": "fs__p"}}),
                Pick::Member(0),
                json!({"ref": {"type": "ref/prompt", "name": "p"}}),
            ),
            (
                "completion/complete",
                json!({"ref": {"type": "ref/resource", "uri": "web://page"}}),
                Pick::Member(1),
                json!({"ref": {"type": "ref/resource", "uri": "web://page"}}),
            ),
            (
                "sampling/createMessage",
                json!({}),
                Pick::NotHere,
                json!({}),
            ),
            ("initialize", json!({}), Pick::NotHere, json!({})),
        ];
        for (method, params, want, after) in cases {
            let mut req = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
            assert_eq!(
                pick(method, &mut req, &servers, &o),
                want,
                "{method} {params}"
            );
            assert_eq!(req["params"], after, "{method}");
        }
        // with one member, every URI is its own
        let one = ["fs"];
        let mut req = json!({"method": "resources/read", "params": {"uri": "any://x"}});
        assert_eq!(
            pick("resources/read", &mut req, &one, &Owners::default()),
            Pick::Member(0)
        );
    }

    #[test]
    fn a_members_question_is_answered_to_that_member_only_once() {
        let mut ids = IdMap::default();
        let mut q = json!({"jsonrpc": "2.0", "id": 5, "method": "elicitation/create"});
        ids.asked(1, &mut q, json!("mcpbox-9"));
        assert_eq!(q["id"], "mcpbox-9");
        // (the client's answer's id, the member it goes to, its id after)
        let cases = [
            (json!(5), None, json!(5)),
            (json!("mcpbox-8"), None, json!("mcpbox-8")),
            (json!("mcpbox-9"), Some(1), json!(5)),
            (json!("mcpbox-9"), None, json!("mcpbox-9")),
        ];
        for (id, member, after) in cases {
            let mut a = json!({"jsonrpc": "2.0", "id": id, "result": {}});
            assert_eq!(ids.answered(&mut a), member, "{id}");
            assert_eq!(a["id"], after);
        }
    }

    #[test]
    fn a_cancellation_follows_the_clients_request_to_its_member() {
        let mut ids = IdMap::default();
        let pair = IdPair {
            theirs: json!("c1"),
            ours: json!("mcpbox-3"),
        };
        ids.call(2, &pair);
        let mut c = mcp::cancellation(&json!("c1"), "r");
        assert_eq!(ids.cancelled(&mut c), Some(2));
        assert_eq!(c["params"]["requestId"], "mcpbox-3");
        let mut other = mcp::cancellation(&json!("c2"), "r");
        assert_eq!(ids.cancelled(&mut other), None);
        ids.done(&json!("c1"));
        let mut late = mcp::cancellation(&json!("c1"), "r");
        assert_eq!(ids.cancelled(&mut late), None);
        assert_eq!(late["params"]["requestId"], "c1");
    }

    #[test]
    fn list_items_are_named_after_their_server() {
        let mut items = vec![
            json!({"name": "read"}),
            json!({"uri": "x://"}),
            json!({"name": "a__b"}),
        ];
        prefix_names("fs", &mut items);
        assert_eq!(
            items,
            vec![
                json!({"name": "fs__read"}),
                json!({"uri": "x://"}),
                json!({"name": "fs__a__b"})
            ]
        );
    }
}
