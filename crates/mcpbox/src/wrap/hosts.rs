//! The five host formats: which one a file is, its server entries, and the
//! file with some entries rewritten and every other byte left as it was
//! (JSON: the entry's own object is rebuilt from its members' original
//! text; TOML: `toml_edit`, which keeps comments and order).

use std::path::Path;

use super::jsonc::{self, Kind, Node};
use super::policygen::{EnvValue, Stdio};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Host {
    /// `claude_desktop_config.json`: `{"mcpServers": {...}}`.
    ClaudeDesktop,
    /// Claude Code's `.mcp.json`: `mcpServers`, `type` stdio/http/sse.
    ClaudeCode,
    /// Cursor's `.cursor/mcp.json`: `mcpServers`, remote entries with `url`.
    Cursor,
    /// VS Code's `mcp.json` (JSONC): `servers`, `inputs`.
    Vscode,
    /// Codex's `config.toml`: `[mcp_servers.NAME]`.
    Codex,
}

impl Host {
    pub fn label(self) -> &'static str {
        match self {
            Host::ClaudeDesktop => "claude-desktop",
            Host::ClaudeCode => "claude-code",
            Host::Cursor => "cursor",
            Host::Vscode => "vscode",
            Host::Codex => "codex",
        }
    }
    fn servers_key(self) -> &'static str {
        match self {
            Host::Vscode => "servers",
            Host::Codex => "mcp_servers",
            _ => "mcpServers",
        }
    }
}

const HOSTS_HINT: &str = "pass --host claude-desktop, claude-code, cursor, vscode or codex";

/// Which host `path` belongs to: by its name and folder, else by content.
pub fn detect(path: &Path, text: &str) -> Result<Host, String> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let parent = path
        .parent()
        .and_then(Path::file_name)
        .and_then(|n| n.to_str())
        .unwrap_or("");
    match (name, parent) {
        ("claude_desktop_config.json", _) => return Ok(Host::ClaudeDesktop),
        (".mcp.json", _) => return Ok(Host::ClaudeCode),
        ("mcp.json", ".cursor") => return Ok(Host::Cursor),
        ("mcp.json", ".vscode") => return Ok(Host::Vscode),
        ("config.toml", ".codex") => return Ok(Host::Codex),
        _ => {}
    }
    if name.ends_with(".toml") {
        return Ok(Host::Codex);
    }
    // by content: VS Code's files say `servers`, the others `mcpServers`
    match jsonc::parse(text, true) {
        Ok(n) if n.get("servers").is_some() => Ok(Host::Vscode),
        Ok(n) if n.get("mcpServers").is_some() => Ok(Host::ClaudeCode),
        _ => Err(format!(
            "cannot tell which host {} is for: {HOSTS_HINT}",
            path.display()
        )),
    }
}

/// One server entry of the file.
#[derive(Debug, Clone)]
pub struct Entry {
    pub name: String,
    pub kind: EntryKind,
}

#[derive(Debug, Clone)]
pub enum EntryKind {
    Stdio(Stdio),
    /// A remote server (`url`); `headers` is whether it sends any.
    Remote {
        url: String,
        headers: bool,
    },
    /// Already runs mcpbox.
    Wrapped,
    /// Left alone, and why.
    Other(String),
}

/// What to change in one entry.
#[derive(Debug, Clone)]
pub enum Change {
    /// Run `command args`, keeping only `env` (references) of its env.
    Stdio {
        name: String,
        command: String,
        args: Vec<String>,
        env: Vec<(String, String)>,
    },
    /// Point a remote entry at `url`.
    Url { name: String, url: String },
}

/// `file:line:col: message`, the way a parse error is reported.
fn at(path: &Path, line: usize, column: usize, message: &str) -> String {
    format!(
        "{}:{line}:{column}: {message} (the file was left untouched; fix it and run mcpbox wrap again)",
        path.display()
    )
}

/// Whether an entry running `command args` already runs its server in
/// mcpbox's sandbox: mcpbox itself (`ours`, or a program named `mcpbox`)
/// with `run` and a policy, as wrap writes it. A name alone is not
/// enough: a project's own `./node_modules/.bin/mcpbox`, or `mcpbox
/// serve`, would be reported as sandboxed while the host runs it as it
/// is, and a file of such entries refused as already wrapped.
fn runs_mcpbox(command: &str, args: &[String], ours: &str) -> bool {
    let mcpbox = command == ours
        || Path::new(command)
            .file_name()
            .is_some_and(|n| n == "mcpbox");
    mcpbox
        && args.first().is_some_and(|a| a == "run")
        && args
            .iter()
            .take_while(|a| *a != "--")
            .any(|a| a == "--policy" || a.starts_with("--policy=") || a == "--preset")
}

/// Why an entry with both a command and a url is left alone: which of the
/// two the host runs is the host's choice (Claude Desktop knows only
/// commands, others read `type`), so it is neither wrapped nor pointed at
/// `serve`, and said.
const BOTH_COMMAND_AND_URL: &str =
    "it has both a command and a url, and which one the host uses is \
     the host's choice: remove the one it does not need and run mcpbox wrap again";

/// A value the host fills in itself: Claude Code's `${VAR}` and
/// `${VAR:-default}`, VS Code's and Cursor's `${env:VAR}` and `${input:ID}`.
fn env_value(v: &str) -> EnvValue {
    if v.contains("${") {
        EnvValue::Reference(v.to_string())
    } else {
        EnvValue::Literal(v.to_string())
    }
}

/// The entries of `text`, in file order. `ours` is the mcpbox command the
/// wrapped entries will run (an entry that already runs it is `Wrapped`).
pub fn entries(host: Host, path: &Path, text: &str, ours: &str) -> Result<Vec<Entry>, String> {
    if host == Host::Codex {
        return toml_entries(path, text, ours);
    }
    let root = jsonc::parse(text, host == Host::Vscode)
        .map_err(|e| at(path, e.line, e.column, &e.message))?;
    if root.members().is_none() {
        return Err(at(path, 1, 1, "expected a JSON object at the top"));
    }
    let key = host.servers_key();
    let Some(servers) = root.get(key) else {
        return Ok(Vec::new());
    };
    let Some(members) = servers.members() else {
        return Err(format!("{}: {key} is not an object", path.display()));
    };
    Ok(members
        .iter()
        .map(|m| Entry {
            name: m.key.clone(),
            kind: json_entry(&m.value, ours),
        })
        .collect())
}

fn json_entry(node: &Node, ours: &str) -> EntryKind {
    if node.members().is_none() {
        return EntryKind::Other("not an object".into());
    }
    let ty = node.get("type").and_then(Node::as_str);
    if node.get("url").is_some() && node.get("command").is_some() {
        return EntryKind::Other(BOTH_COMMAND_AND_URL.into());
    }
    if let Some(url) = node.get("url").and_then(Node::as_str) {
        return EntryKind::Remote {
            url: url.to_string(),
            headers: node.get("headers").is_some(),
        };
    }
    if matches!(ty, Some(t) if t != "stdio") {
        return EntryKind::Other(format!("type {:?} without a url", ty.unwrap_or("")));
    }
    let Some(command) = node.get("command").and_then(Node::as_str) else {
        return EntryKind::Other("no command".into());
    };
    let mut args = Vec::new();
    if let Some(a) = node.get("args") {
        let Kind::Array(items) = &a.kind else {
            return EntryKind::Other("args is not a list".into());
        };
        for i in items {
            match i.as_str() {
                Some(s) => args.push(s.to_string()),
                None => return EntryKind::Other("an argument is not a string".into()),
            }
        }
    }
    if runs_mcpbox(command, &args, ours) {
        return EntryKind::Wrapped;
    }
    let mut env = Vec::new();
    if let Some(e) = node.get("env") {
        let Some(members) = e.members() else {
            return EntryKind::Other("env is not an object".into());
        };
        for m in members {
            match m.value.as_str() {
                Some(v) => env.push((m.key.clone(), env_value(v))),
                None => return EntryKind::Other(format!("env {} is not a string", m.key)),
            }
        }
    }
    EntryKind::Stdio(Stdio {
        command: command.to_string(),
        args,
        env,
        pass: Vec::new(),
    })
}

fn toml_entries(path: &Path, text: &str, ours: &str) -> Result<Vec<Entry>, String> {
    let doc: toml_edit::DocumentMut = text.parse().map_err(|e: toml_edit::TomlError| {
        let (line, column) = e
            .span()
            .map(|s| jsonc::line_col(text.as_bytes(), s.start))
            .unwrap_or((1, 1));
        at(path, line, column, e.message())
    })?;
    let Some(servers) = doc.get("mcp_servers") else {
        return Ok(Vec::new());
    };
    let Some(servers) = servers.as_table_like() else {
        return Err(format!("{}: mcp_servers is not a table", path.display()));
    };
    Ok(servers
        .iter()
        .map(|(name, item)| Entry {
            name: name.to_string(),
            kind: toml_entry(item, ours),
        })
        .collect())
}

fn strings(item: Option<&toml_edit::Item>) -> Option<Vec<String>> {
    match item {
        None => Some(Vec::new()),
        Some(i) => i
            .as_array()?
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect(),
    }
}

fn toml_entry(item: &toml_edit::Item, ours: &str) -> EntryKind {
    let Some(t) = item.as_table_like() else {
        return EntryKind::Other("not a table".into());
    };
    if t.contains_key("url") && t.contains_key("command") {
        return EntryKind::Other(BOTH_COMMAND_AND_URL.into());
    }
    if let Some(url) = t.get("url").and_then(|u| u.as_str()) {
        return EntryKind::Remote {
            url: url.to_string(),
            headers: t.contains_key("http_headers") || t.contains_key("bearer_token_env_var"),
        };
    }
    let Some(command) = t.get("command").and_then(|c| c.as_str()) else {
        return EntryKind::Other("no command".into());
    };
    let Some(args) = strings(t.get("args")) else {
        return EntryKind::Other("args is not a list of strings".into());
    };
    if runs_mcpbox(command, &args, ours) {
        return EntryKind::Wrapped;
    }
    let Some(pass) = strings(t.get("env_vars")) else {
        return EntryKind::Other("env_vars is not a list of strings".into());
    };
    let mut env = Vec::new();
    if let Some(e) = t.get("env") {
        let Some(e) = e.as_table_like() else {
            return EntryKind::Other("env is not a table".into());
        };
        for (k, v) in e.iter() {
            match v.as_str() {
                // Codex does not expand `${...}`: every value is literal
                Some(v) => env.push((k.to_string(), EnvValue::Literal(v.to_string()))),
                None => return EntryKind::Other(format!("env {k} is not a string")),
            }
        }
    }
    EntryKind::Stdio(Stdio {
        command: command.to_string(),
        args,
        env,
        pass,
    })
}

/// `text` with `changes` applied (every entry they name was found by
/// [`entries`] in this same text).
pub fn rewrite(host: Host, text: &str, changes: &[Change]) -> Result<String, String> {
    if host == Host::Codex {
        return toml_rewrite(text, changes);
    }
    let root = jsonc::parse(text, host == Host::Vscode).map_err(|e| e.message)?;
    let servers = root.get(host.servers_key()).ok_or("the servers are gone")?;
    let mut edits: Vec<(usize, usize, String)> = Vec::new();
    for change in changes {
        let name = match change {
            Change::Stdio { name, .. } | Change::Url { name, .. } => name,
        };
        let node = servers.get(name).ok_or("an entry is gone")?;
        edits.push((node.start, node.end, json_object(text, node, change)));
    }
    edits.sort_by_key(|e| std::cmp::Reverse(e.0));
    let mut out = text.to_string();
    for (start, end, new) in edits {
        out.replace_range(start..end, &new);
    }
    Ok(out)
}

fn json(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

/// The entry `node` rebuilt with `change`: its members in their order,
/// each as its original text but the ones the change replaces, laid out
/// with the object's own indentation.
fn json_object(text: &str, node: &Node, change: &Change) -> String {
    let members = node.members().unwrap_or(&[]);
    let mut out: Vec<String> = Vec::new();
    let replaced = |key: &str| -> Option<Option<String>> {
        match change {
            Change::Stdio {
                command, args, env, ..
            } => match key {
                "command" => Some(Some(json(command))),
                "args" => Some(Some(format!(
                    "[{}]",
                    args.iter().map(|a| json(a)).collect::<Vec<_>>().join(", ")
                ))),
                "env" if env.is_empty() => Some(None),
                "env" => Some(Some(format!(
                    "{{{}}}",
                    env.iter()
                        .map(|(k, v)| format!("{}: {}", json(k), json(v)))
                        .collect::<Vec<_>>()
                        .join(", ")
                ))),
                _ => None,
            },
            Change::Url { url, .. } => (key == "url").then(|| Some(json(url))),
        }
    };
    for m in members {
        let value = match replaced(&m.key) {
            Some(Some(v)) => v,
            Some(None) => continue,
            None => text[m.value.start..m.value.end].to_string(),
        };
        out.push(format!("{}: {value}", json(&m.key)));
        if m.key == "command" && node.get("args").is_none() {
            if let Some(Some(args)) = replaced("args") {
                out.push(format!("\"args\": {args}"));
            }
        }
    }
    // an env the entry did not have (MCPBOX_STATE_DIR, written by wrap)
    if node.get("env").is_none() {
        if let Some(Some(env)) = replaced("env") {
            out.push(format!("\"env\": {env}"));
        }
    }
    // the layout: the whitespace before the first key and before `}`
    let inner = &text[node.start + 1..node.end - 1];
    let first = members
        .first()
        .map_or(inner.len(), |m| m.key_start - node.start - 1);
    let lead = &inner[..first];
    match lead.rfind('\n') {
        Some(nl) => {
            let indent = &lead[nl + 1..];
            let close = inner
                .rfind('\n')
                .map(|n| &inner[n + 1..])
                .filter(|s| s.chars().all(char::is_whitespace))
                .unwrap_or("");
            // a file written on Windows keeps its line ends
            let nl = if lead.ends_with(&format!("\r\n{indent}")) {
                "\r\n"
            } else {
                "\n"
            };
            let sep = format!(",{nl}{indent}");
            format!("{{{nl}{indent}{}{nl}{close}}}", out.join(&sep))
        }
        None => format!("{{ {} }}", out.join(", ")),
    }
}

fn toml_rewrite(text: &str, changes: &[Change]) -> Result<String, String> {
    let mut doc: toml_edit::DocumentMut = text
        .parse()
        .map_err(|e: toml_edit::TomlError| e.to_string())?;
    let servers = doc
        .get_mut("mcp_servers")
        .and_then(|s| s.as_table_like_mut())
        .ok_or("the servers are gone")?;
    for change in changes {
        match change {
            Change::Stdio {
                name,
                command,
                args,
                env,
            } => {
                let t = servers
                    .get_mut(name)
                    .and_then(|e| e.as_table_like_mut())
                    .ok_or("an entry is gone")?;
                set(t, "command", command.as_str().into());
                let arr: toml_edit::Array = args.iter().map(String::as_str).collect();
                set(t, "args", arr.into());
                // every literal value moved to the policy or the store;
                // what wrap adds (MCPBOX_STATE_DIR) is the new env
                t.remove("env");
                if !env.is_empty() {
                    let table: toml_edit::InlineTable = env
                        .iter()
                        .map(|(k, v)| (k.as_str(), toml_edit::Value::from(v.as_str())))
                        .collect();
                    t.insert("env", toml_edit::Item::Value(table.into()));
                }
            }
            Change::Url { name, url } => {
                let t = servers
                    .get_mut(name)
                    .and_then(|e| e.as_table_like_mut())
                    .ok_or("an entry is gone")?;
                set(t, "url", url.as_str().into());
            }
        }
    }
    Ok(doc.to_string())
}

/// Sets `key` to `value`, in place when it exists, keeping the comments
/// and spacing around the old value (`insert` would drop the key's).
fn set(t: &mut dyn toml_edit::TableLike, key: &str, mut value: toml_edit::Value) {
    match t.get_mut(key) {
        Some(item) => {
            if let Some(old) = item.as_value() {
                *value.decor_mut() = old.decor().clone();
            }
            *item = toml_edit::Item::Value(value);
        }
        None => {
            t.insert(key, toml_edit::Item::Value(value));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change() -> Change {
        Change::Stdio {
            name: "a".into(),
            command: "/bin/mcpbox".into(),
            args: vec!["run".into(), "--".into(), "x".into()],
            env: vec![],
        }
    }

    #[test]
    fn a_json_entry_is_rebuilt_in_its_own_layout_and_nothing_else_moves() {
        let text = "{\n  \"z\": 1,\n  \"mcpServers\": {\n    \"a\": {\n      \"command\": \"x\",\n      \"env\": {\"K\": \"v\"},\n      \"note\": [1, 2]\n    }\n  },\n  \"b\": 2\n}\n";
        let out = rewrite(Host::ClaudeDesktop, text, &[change()]).unwrap();
        assert_eq!(
            out,
            "{\n  \"z\": 1,\n  \"mcpServers\": {\n    \"a\": {\n      \"command\": \"/bin/mcpbox\",\n      \"args\": [\"run\", \"--\", \"x\"],\n      \"note\": [1, 2]\n    }\n  },\n  \"b\": 2\n}\n"
        );
        let one = rewrite(
            Host::ClaudeCode,
            "{\"mcpServers\": {\"a\": {\"command\": \"x\", \"args\": []}}}",
            &[change()],
        )
        .unwrap();
        assert_eq!(
            one,
            "{\"mcpServers\": {\"a\": { \"command\": \"/bin/mcpbox\", \"args\": [\"run\", \"--\", \"x\"] }}}"
        );
    }

    #[test]
    fn crlf_line_ends_are_kept() {
        let text = "{\r\n  \"mcpServers\": {\r\n    \"a\": {\r\n      \"command\": \"x\"\r\n    }\r\n  }\r\n}\r\n";
        let out = rewrite(Host::ClaudeDesktop, text, &[change()]).unwrap();
        assert!(!out.replace("\r\n", "").contains('\n'), "{out:?}");
    }

    #[test]
    fn codex_keeps_its_comments() {
        let text = "# mine\nmodel = \"m\"\n\n[mcp_servers.a]\n# the server\ncommand = \"x\"\nenv = { K = \"v\" }\n";
        let out = rewrite(Host::Codex, text, &[change()]).unwrap();
        assert!(out.starts_with("# mine\nmodel = \"m\"\n\n[mcp_servers.a]\n# the server\ncommand = \"/bin/mcpbox\"\n"), "{out}");
        assert!(!out.contains("K ="), "{out}");
    }

    fn kind_of(host: Host, text: &str) -> EntryKind {
        entries(host, Path::new("/x/c"), text, "/opt/mcpbox")
            .unwrap()
            .remove(0)
            .kind
    }

    /// An entry with both a command and a url: a host that runs the
    /// command (Claude Desktop knows only commands) would run it outside
    /// any sandbox while wrap said it was left alone as a remote server,
    /// or pointed it at `serve`. It is left alone, and says why.
    #[test]
    fn an_entry_with_command_and_url_is_not_taken_as_remote() {
        for (host, text) in [
            (
                Host::ClaudeDesktop,
                r#"{"mcpServers": {"a": {"type": "stdio", "command": "npx", "args": ["srv"], "url": "https://x.example/mcp"}}}"#,
            ),
            (
                Host::Codex,
                "[mcp_servers.a]\ncommand = \"npx\"\nurl = \"https://x.example/mcp\"\n",
            ),
        ] {
            match kind_of(host, text) {
                EntryKind::Other(why) => assert!(why.contains("both a command and a url"), "{why}"),
                k => panic!("{host:?}: {k:?}"),
            }
        }
    }

    /// A program merely named mcpbox is not mcpbox's sandbox: only `run`
    /// with a policy, as wrap writes it, counts as already wrapped.
    #[test]
    fn a_command_merely_named_mcpbox_is_not_taken_as_wrapped() {
        let json = |cmd: &str, args: &str| {
            format!(r#"{{"mcpServers": {{"a": {{"command": "{cmd}", "args": {args}}}}}}}"#)
        };
        for (cmd, args) in [
            ("./node_modules/.bin/mcpbox", r#"["start"]"#),
            ("/opt/mcpbox", r#"["serve", "--config", "x"]"#),
            ("mcpbox", r#"["run", "--", "srv", "--policy", "p"]"#),
            ("mcpbox", "[]"),
        ] {
            assert!(
                matches!(
                    kind_of(Host::ClaudeCode, &json(cmd, args)),
                    EntryKind::Stdio(_)
                ),
                "{cmd} {args}"
            );
        }
        for (cmd, args) in [
            (
                "/opt/mcpbox",
                r#"["run", "--policy", "/s/a.toml", "--", "srv"]"#,
            ),
            (
                "/usr/bin/mcpbox",
                r#"["run", "--preset", "fs", "--", "srv"]"#,
            ),
        ] {
            assert!(
                matches!(
                    kind_of(Host::ClaudeCode, &json(cmd, args)),
                    EntryKind::Wrapped
                ),
                "{cmd} {args}"
            );
        }
    }

    #[test]
    fn hosts_are_told_by_name_and_content() {
        let d = |p: &str, t: &str| detect(Path::new(p), t);
        assert_eq!(
            d("/x/claude_desktop_config.json", ""),
            Ok(Host::ClaudeDesktop)
        );
        assert_eq!(d("/x/.mcp.json", ""), Ok(Host::ClaudeCode));
        assert_eq!(d("/p/.cursor/mcp.json", ""), Ok(Host::Cursor));
        assert_eq!(d("/p/.vscode/mcp.json", ""), Ok(Host::Vscode));
        assert_eq!(d("/h/.codex/config.toml", ""), Ok(Host::Codex));
        assert_eq!(d("/h/User/mcp.json", "{\"servers\": {}}"), Ok(Host::Vscode));
        assert!(d("/h/other.json", "{}").unwrap_err().contains("--host"));
    }
}
