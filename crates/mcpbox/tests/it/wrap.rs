//! `mcpbox wrap` through the real binary: a sample config of each of the
//! five hosts wrapped and undone byte for byte, its secrets moved into the
//! 0600 store, the result checked against the host's documented shape (a
//! JSON Schema per host in tests/wrap/, validated by the Python
//! `jsonschema` package of the peers' venv); a wrapped entry run for real;
//! and every refusal leaving the file as it was.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{json, Value};

/// A GitHub-shaped token and a plain key, both only in the samples.
const GH: &str = "ghp_WrapTestToken0123456789abcdefghijABCD";
const KEY: &str = "sk-wrap-test-9f8e7d6c5b4a";

/// A temporary home for one test: the state directory and the host files.
struct Case {
    dir: tempfile::TempDir,
}

impl Case {
    fn new() -> Case {
        let dir = tempfile::Builder::new()
            .prefix("mcpbox-wrap-")
            .tempdir()
            .unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        Case { dir }
    }
    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }
    /// Writes `text` at `rel` (its folders made) with mode 0644.
    fn file(&self, rel: &str, text: &str) -> PathBuf {
        let p = self.dir.path().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        p
    }
    fn wrap(&self, args: &[&str]) -> Output {
        Command::new(common::mcpbox())
            .arg("wrap")
            .args(args)
            .env("MCPBOX_STATE_DIR", self.state())
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }
    /// Every file under the state directory, with its mode.
    fn state_files(&self) -> Vec<(PathBuf, u32)> {
        fn walk(d: &Path, out: &mut Vec<(PathBuf, u32)>) {
            let Ok(rd) = std::fs::read_dir(d) else { return };
            for e in rd {
                let p = e.unwrap().path();
                let m = std::fs::symlink_metadata(&p).unwrap();
                out.push((p.clone(), m.permissions().mode() & 0o7777));
                if m.is_dir() {
                    walk(&p, out);
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.state(), &mut out);
        out
    }
}

fn ok(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "mcpbox wrap failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn refused(out: &Output) -> String {
    assert!(
        !out.status.success(),
        "mcpbox wrap succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Validates `file` (JSON, JSONC or TOML) against the host's schema with
/// the Python `jsonschema` package; panics with its errors. Returns the
/// document as JSON.
fn assert_host_accepts(file: &Path, schema: &str) -> Value {
    const SCRIPT: &str = r#"
import json, re, sys, tomllib, jsonschema
schema = json.loads(sys.argv[1])
path = sys.argv[2]
text = open(path, encoding="utf-8").read()
if path.endswith(".toml"):
    doc = tomllib.loads(text)
else:
    # JSONC (VS Code): drop comments outside strings, then trailing commas
    out, i, s = [], 0, False
    while i < len(text):
        c = text[i]
        if s:
            out.append(c)
            if c == "\\":
                out.append(text[i + 1]); i += 1
            elif c == '"':
                s = False
        elif c == '"':
            s = True; out.append(c)
        elif text.startswith("//", i):
            while i < len(text) and text[i] != "\n": i += 1
            continue
        elif text.startswith("/*", i):
            i = text.index("*/", i) + 2
            continue
        else:
            out.append(c)
        i += 1
    doc = json.loads(re.sub(r",(\s*[}\]])", r"\1", "".join(out)))
errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(doc), key=str)
for e in errors:
    print(f"{list(e.absolute_path)}: {e.message}")
if errors:
    sys.exit(1)
print(json.dumps(doc))
"#;
    let python = common::peers::peer("venv/bin/python");
    let out = Command::new(python)
        .args(["-c", SCRIPT, schema])
        .arg(file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{} is not what the host accepts:\n{}{}",
        file.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Wraps `file`, checks the result (schema, secrets, entries, modes),
/// undoes, and checks the restore is byte for byte. `stdio` names the
/// entries that must now run mcpbox; `secrets` the values that must have
/// left the file for the store.
fn wrap_and_undo(
    case: &Case,
    file: &Path,
    schema: &str,
    stdio: &[&str],
    secrets: &[&str],
) -> String {
    let original = std::fs::read(file).unwrap();
    let out = ok(&case.wrap(&[file.to_str().unwrap()]));
    let wrapped = std::fs::read_to_string(file).unwrap();
    assert_ne!(wrapped.as_bytes(), &original[..]);
    let doc = assert_host_accepts(file, schema);
    assert_eq!(
        std::fs::metadata(file).unwrap().permissions().mode() & 0o777,
        0o644,
        "the file keeps its mode"
    );
    // every stdio entry runs this mcpbox under a policy that mcpbox accepts
    let me = std::fs::canonicalize(common::mcpbox()).unwrap();
    let servers = doc
        .get("mcpServers")
        .or(doc.get("servers"))
        .or(doc.get("mcp_servers"))
        .unwrap();
    for name in stdio {
        let e = &servers[name];
        assert_eq!(
            Path::new(e["command"].as_str().unwrap()),
            me,
            "{name} runs this mcpbox: {e}"
        );
        let args: Vec<&str> = e["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert_eq!(&args[..2], &["run", "--policy"], "{name}: {args:?}");
        assert_eq!(args[3], "--");
        let policy = Path::new(args[2]);
        let check = Command::new(common::mcpbox())
            .args(["check", args[2]])
            .env("MCPBOX_STATE_DIR", case.state())
            .output()
            .unwrap();
        assert!(
            check.status.success(),
            "mcpbox check {}: {}",
            policy.display(),
            String::from_utf8_lossy(&check.stderr)
        );
        assert_eq!(
            std::fs::metadata(policy).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
    // secrets: in no rewritten file and no policy; each in one 0600 file
    // of a 0700 store
    let files = case.state_files();
    for s in secrets {
        assert!(
            !wrapped.contains(s),
            "{s} is still in the host file:\n{wrapped}"
        );
        assert!(!out.contains(s), "{s} was printed");
        let holders: Vec<&(PathBuf, u32)> = files
            .iter()
            .filter(|(p, _)| {
                std::fs::read(p).is_ok_and(|b| String::from_utf8_lossy(&b).contains(s))
            })
            .collect();
        let stored: Vec<_> = holders
            .iter()
            .filter(|(p, _)| p.parent() == Some(&case.state().join("secrets")))
            .collect();
        assert_eq!(stored.len(), 1, "{s} in the store: {holders:?}");
        // the whole value of its variable (a URL around a password, say)
        assert!(std::fs::read_to_string(&stored[0].0).unwrap().contains(s));
        assert_eq!(stored[0].1, 0o600);
        // the only other holder is the backup of the original file
        for (p, mode) in &holders {
            assert!(
                p.parent() == Some(&case.state().join("secrets")) || p.ends_with("original"),
                "{s} leaked into {}",
                p.display()
            );
            assert_eq!(*mode, 0o600);
        }
    }
    if !secrets.is_empty() {
        let store = files
            .iter()
            .find(|(p, _)| *p == case.state().join("secrets"))
            .unwrap();
        assert_eq!(store.1, 0o700);
    }
    // undo: byte for byte, mode included, and the store emptied
    let undone = ok(&case.wrap(&["--undo", file.to_str().unwrap()]));
    assert!(undone.contains("restored"), "{undone}");
    assert_eq!(
        std::fs::read(file).unwrap(),
        original,
        "undo restores byte for byte"
    );
    assert_eq!(
        std::fs::metadata(file).unwrap().permissions().mode() & 0o777,
        0o644
    );
    for (p, _) in case.state_files() {
        assert!(
            std::fs::metadata(&p).unwrap().is_dir(),
            "{} is left after undo",
            p.display()
        );
    }
    out
}

#[test]
fn claude_desktop_config_is_wrapped_with_secrets_moved_and_undone_byte_for_byte() {
    let case = Case::new();
    let data = case.dir.path().join("notes");
    std::fs::create_dir(&data).unwrap();
    let file = case.file(
        "Claude/claude_desktop_config.json",
        &format!(
            r#"{{
  "globalShortcut": "Ctrl+Space",
  "mcpServers": {{
    "notes": {{
      "command": "npx",
      "args": ["-y", "@modelcontextprotocol/server-filesystem", "{}"]
    }},
    "github": {{
      "command": "npx",
      "args": ["-y", "@modelcontextprotocol/server-github"],
      "env": {{
        "GITHUB_PERSONAL_ACCESS_TOKEN": "{GH}",
        "LOG_LEVEL": "debug"
      }}
    }}
  }}
}}
"#,
            data.display()
        ),
    );
    let out = wrap_and_undo(
        &case,
        &file,
        include_str!("../wrap/claude-desktop.schema.json"),
        &["notes", "github"],
        &[GH],
    );
    assert!(
        out.contains("secrets moved: GITHUB_PERSONAL_ACCESS_TOKEN"),
        "{out}"
    );
    assert!(
        out.contains(&format!("mounts {} ro", data.display())),
        "{out}"
    );
}

#[test]
fn claude_code_mcp_json_is_wrapped_keeping_references_and_remote_entries() {
    let case = Case::new();
    let file = case.file(
        "project/.mcp.json",
        &format!(
            r#"{{
  "mcpServers": {{
    "api": {{
      "type": "stdio",
      "command": "/usr/bin/python3",
      "args": ["-m", "api_server"],
      "env": {{"API_KEY": "{KEY}", "GH_TOKEN": "${{GH_TOKEN}}", "MODE": "ro"}}
    }},
    "docs": {{"type": "http", "url": "https://docs.example.com/mcp", "headers": {{"X-Team": "a"}}}}
  }}
}}
"#
        ),
    );
    let original = std::fs::read_to_string(&file).unwrap();
    let out = case.wrap(&["--dry-run", file.to_str().unwrap()]);
    let diff = ok(&out);
    assert!(
        diff.contains("docs: left alone: remote server https://docs.example.com/mcp"),
        "{diff}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), original);
    let out = wrap_and_undo(
        &case,
        &file,
        include_str!("../wrap/claude-code.schema.json"),
        &["api"],
        &[KEY],
    );
    assert!(out.contains("secrets moved: API_KEY"), "{out}");
}

#[test]
fn cursor_mcp_json_is_wrapped_and_undone() {
    let case = Case::new();
    let file = case.file(
        "project/.cursor/mcp.json",
        &format!(
            r#"{{"mcpServers":{{"db":{{"command":"uvx","args":["mcp-server-postgres","--read-only"],"env":{{"DATABASE_URL":"postgres://app:{KEY}@db.internal/app"}}}},"remote":{{"url":"https://mcp.example.com/sse"}}}}}}"#
        ),
    );
    wrap_and_undo(
        &case,
        &file,
        include_str!("../wrap/cursor.schema.json"),
        &["db"],
        &[KEY],
    );
}

#[test]
fn vscode_mcp_json_with_comments_and_inputs_is_wrapped_and_undone() {
    let case = Case::new();
    let file = case.file(
        "project/.vscode/mcp.json",
        &format!(
            r#"{{
  // prompted once, stored by VS Code
  "inputs": [
    {{"type": "promptString", "id": "perplexity-key", "description": "Perplexity API Key", "password": true}}
  ],
  "servers": {{
    /* the search server */
    "perplexity": {{
      "type": "stdio",
      "command": "npx",
      "args": ["-y", "server-perplexity-ask"],
      "env": {{
        "PERPLEXITY_API_KEY": "${{input:perplexity-key}}",
        "BACKUP_TOKEN": "{GH}",
      }},
    }},
    "github": {{"type": "http", "url": "https://api.githubcopilot.com/mcp/"}},
  }},
}}
"#
        ),
    );
    let out = wrap_and_undo(
        &case,
        &file,
        include_str!("../wrap/vscode.schema.json"),
        &["perplexity"],
        &[GH],
    );
    assert!(out.contains("secrets moved: BACKUP_TOKEN"), "{out}");
}

#[test]
fn codex_config_toml_keeps_its_comments_and_is_undone() {
    let case = Case::new();
    let file = case.file(
        "home/.codex/config.toml",
        &format!(
            r#"# my Codex settings
model = "o4-mini"

[mcp_servers.context7]
# docs lookup
command = "npx"
args = ["-y", "@upstash/context7-mcp"]
env = {{ "CONTEXT7_API_KEY" = "{KEY}", "NODE_ENV" = "production" }}

[mcp_servers.figma]
url = "https://mcp.figma.com/mcp"
"#
        ),
    );
    let original = std::fs::read_to_string(&file).unwrap();
    let out = case.wrap(&["--dry-run", file.to_str().unwrap()]);
    ok(&out);
    let out = case.wrap(&[file.to_str().unwrap()]);
    ok(&out);
    let wrapped = std::fs::read_to_string(&file).unwrap();
    assert!(
        wrapped.starts_with(
            "# my Codex settings\nmodel = \"o4-mini\"\n\n[mcp_servers.context7]\n# docs lookup\n"
        ),
        "{wrapped}"
    );
    assert!(
        wrapped.ends_with("[mcp_servers.figma]\nurl = \"https://mcp.figma.com/mcp\"\n"),
        "{wrapped}"
    );
    ok(&case.wrap(&["--undo", file.to_str().unwrap()]));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), original);
    wrap_and_undo(
        &case,
        &file,
        include_str!("../wrap/codex.schema.json"),
        &["context7"],
        &[KEY],
    );
}

/// Starts a host entry as a host would (its command and args, no env of
/// its own: none is left in the entry, and the test's API_KEY is removed)
/// and initializes the MCP session.
fn start_entry(case: &Case, entry: &Value) -> common::mcp::Session {
    let mut cmd = Command::new(entry["command"].as_str().unwrap());
    for a in entry["args"].as_array().unwrap() {
        cmd.arg(a.as_str().unwrap());
    }
    cmd.env("MCPBOX_STATE_DIR", case.state())
        .env_remove("API_KEY");
    let mut s = common::mcp::Session::start_command(cmd);
    let init = s.initialize();
    assert!(
        init.get("result").is_some(),
        "initialize: {init} {}",
        s.stderr()
    );
    s
}

#[test]
fn a_wrapped_claude_code_entry_runs_its_server_with_the_moved_secret() {
    let case = Case::new();
    // the server where a user keeps it: its directory is what the
    // generated policy mounts (read-only, at the same path)
    let bin = case.dir.path().join("servers");
    std::fs::create_dir(&bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let server = bin.join("echo_secrets");
    std::fs::copy(common::mcp::testserver("echo_secrets"), &server).unwrap();
    std::fs::set_permissions(&server, std::fs::Permissions::from_mode(0o755)).unwrap();
    let file = case.file(
        "project/.mcp.json",
        &format!(
            r#"{{"mcpServers": {{"leaky": {{"command": "{}", "env": {{"API_KEY": "{KEY}"}}}}}}}}"#,
            server.display()
        ),
    );
    ok(&case.wrap(&[file.to_str().unwrap()]));
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let entry = &doc["mcpServers"]["leaky"];
    // the secret left the entry; what wrap adds is where its state is
    // (MCPBOX_STATE_DIR was set for the wrap, issue 32)
    assert_eq!(
        entry["env"],
        json!({"MCPBOX_STATE_DIR": case.state().display().to_string()}),
        "{entry}"
    );
    // start it as Claude Code would: the entry's command and args, nothing else
    let mut s = start_entry(&case, entry);
    let resp = s.call("leak", json!({"var": "API_KEY"}));
    let text = common::mcp::result_text(&resp);
    // the server read the secret (the relay redacted it by name on the way
    // back), and its value never reached the host
    assert!(
        text.contains("plain [REDACTED:API_KEY]"),
        "{resp} {}",
        s.stderr()
    );
    assert!(!resp.to_string().contains(KEY), "{resp}");
    drop(s);
}

#[test]
fn dry_run_prints_the_diff_and_writes_nothing() {
    let case = Case::new();
    let text = format!(
        "{{\n  \"mcpServers\": {{\n    \"gh\": {{\n      \"command\": \"npx\",\n      \"env\": {{\"GITHUB_TOKEN\": \"{GH}\"}}\n    }}\n  }}\n}}\n"
    );
    let file = case.file("p/.mcp.json", &text);
    let out = ok(&case.wrap(&["--dry-run", file.to_str().unwrap()]));
    assert!(out.contains(&format!("--- a/{}", file.display())), "{out}");
    assert!(out.contains("-      \"command\": \"npx\","), "{out}");
    assert!(
        out.contains("+      \"args\": [\"run\", \"--policy\""),
        "{out}"
    );
    assert!(out.contains("nothing was written"), "{out}");
    assert!(!out.contains(GH), "the diff shows no secret value: {out}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), text);
    assert!(case.state_files().is_empty(), "{:?}", case.state_files());
}

#[test]
fn malformed_json_is_refused_with_its_position_and_left_untouched() {
    let case = Case::new();
    let text = "{\n  \"mcpServers\": {\n    \"a\": {\"command\": \"x\",}\n  }\n}\n";
    let file = case.file("p/.mcp.json", text);
    let err = refused(&case.wrap(&[file.to_str().unwrap()]));
    assert!(err.contains(&format!("{}:3:", file.display())), "{err}");
    assert!(err.contains("left untouched"), "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), text);
    assert!(case.state_files().is_empty());
}

#[test]
fn malformed_toml_is_refused_with_its_position_and_left_untouched() {
    let case = Case::new();
    let text = "model = \"m\"\n[mcp_servers.a]\ncommand = \"x\nargs = []\n";
    let file = case.file("h/.codex/config.toml", text);
    let err = refused(&case.wrap(&[file.to_str().unwrap()]));
    assert!(err.contains(&format!("{}:3:", file.display())), "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), text);
    assert!(case.state_files().is_empty());
}

#[test]
fn a_config_whose_servers_all_run_mcpbox_is_refused_as_already_wrapped() {
    let case = Case::new();
    let text = r#"{"mcpServers": {"fs": {"command": "mcpbox", "args": ["run", "--policy", "fs.toml", "--", "npx", "x"]}}}"#;
    let file = case.file("p/.mcp.json", text);
    let err = refused(&case.wrap(&[file.to_str().unwrap()]));
    assert!(err.contains("already wrapped"), "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), text);
    // beside a new entry, the wrapped one is left alone
    let text = r#"{"mcpServers": {"fs": {"command": "mcpbox", "args": ["run", "--policy", "fs.toml", "--", "npx"]}, "new": {"command": "npx"}}}"#;
    let file = case.file("q/.mcp.json", text);
    let out = ok(&case.wrap(&[file.to_str().unwrap()]));
    assert!(out.contains("fs: left alone: already runs mcpbox"), "{out}");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(
        doc["mcpServers"]["fs"],
        json!({"command": "mcpbox", "args": ["run", "--policy", "fs.toml", "--", "npx"]})
    );
}

/// A wrap killed after it made its folder in the state directory and
/// before it wrote its manifest leaves the folder (and the config as it
/// was): the next wrap says what happened and what to do, instead of a
/// bare "File exists", and changes nothing.
#[test]
fn a_wrap_killed_before_its_manifest_leaves_a_clear_refusal_not_file_exists() {
    let case = Case::new();
    let text = r#"{"mcpServers": {"a": {"command": "npx", "args": ["srv"]}}}"#;
    let file = case.file("p/.mcp.json", text);
    // the store's folder: <state>/wrap/<first 16 hex of sha256(real path)>
    let real = std::fs::canonicalize(&file).unwrap();
    let sum = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin
                .take()
                .unwrap()
                .write_all(real.as_os_str().as_encoded_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    let id = String::from_utf8(sum.stdout).unwrap()[..16].to_string();
    // what the killed wrap left: its folder and the backup, no manifest
    let dir = case.state().join("wrap").join(&id);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("original"), text).unwrap();
    let err = refused(&case.wrap(&[file.to_str().unwrap()]));
    assert!(err.contains("did not finish"), "{err}");
    assert!(err.contains(&dir.display().to_string()), "{err}");
    assert!(!err.contains("File exists"), "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), text);
    // once the folder is removed, the wrap goes through
    std::fs::remove_dir_all(&dir).unwrap();
    ok(&case.wrap(&[file.to_str().unwrap()]));
}

/// A config linked to a fifo or to `/dev/zero` (a checkout can carry such
/// a link): reading it would hang, or fill the memory. Refused at once,
/// nothing written.
#[test]
fn a_config_linked_to_a_fifo_or_dev_zero_is_refused_at_once() {
    let case = Case::new();
    let fifo = case.dir.path().join("fifo");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    for (rel, target) in [
        ("a/.mcp.json", fifo.as_path()),
        ("b/.mcp.json", Path::new("/dev/zero")),
    ] {
        let link = case.dir.path().join(rel);
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(target, &link).unwrap();
        let mut child = Command::new(common::mcpbox())
            .arg("wrap")
            .arg(&link)
            .env("MCPBOX_STATE_DIR", case.state())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > until {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "mcpbox wrap {rel} (a link to {}) did not end",
                    target.display()
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let err = refused(&child.wait_with_output().unwrap());
        assert!(err.contains("not a regular file"), "{rel}: {err}");
    }
    assert!(case
        .state_files()
        .iter()
        .all(|(p, _)| !p.ends_with("original")));
}

#[test]
fn wrapping_twice_is_refused_until_undone() {
    let case = Case::new();
    let file = case.file(
        "p/.mcp.json",
        r#"{"mcpServers": {"a": {"command": "npx"}, "b": {"command": "uvx"}}}"#,
    );
    ok(&case.wrap(&[file.to_str().unwrap()]));
    let wrapped = std::fs::read(&file).unwrap();
    // a server added by hand since: wrapping again would replace the backup
    let added = String::from_utf8(wrapped.clone())
        .unwrap()
        .replacen("{", "{\"extra\": 1, ", 1);
    std::fs::write(&file, &added).unwrap();
    let err = refused(&case.wrap(&[file.to_str().unwrap()]));
    assert!(
        err.contains("wrapped by mcpbox already") && err.contains("--undo"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), added);
}

#[test]
fn undo_after_a_later_hand_edit_is_refused_and_force_restores() {
    let case = Case::new();
    let text = r#"{"mcpServers": {"a": {"command": "npx", "env": {"API_KEY": "k-123456"}}}}"#;
    let file = case.file("p/.mcp.json", text);
    ok(&case.wrap(&[file.to_str().unwrap()]));
    let edited = std::fs::read_to_string(&file).unwrap() + "\n";
    std::fs::write(&file, &edited).unwrap();
    let err = refused(&case.wrap(&["--undo", file.to_str().unwrap()]));
    assert!(
        err.contains("changed since mcpbox wrap") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), edited);
    ok(&case.wrap(&["--undo", "--force", file.to_str().unwrap()]));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), text);
}

#[test]
fn undo_without_a_backup_is_refused() {
    let case = Case::new();
    let text = r#"{"mcpServers": {"a": {"command": "npx"}}}"#;
    let file = case.file("p/.mcp.json", text);
    let err = refused(&case.wrap(&["--undo", file.to_str().unwrap()]));
    assert!(
        err.contains("no backup") && err.contains("nothing to undo"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), text);
}

#[test]
fn serve_points_remote_entries_at_the_gateway_and_prints_its_config() {
    let case = Case::new();
    let file = case.file(
        "p/.cursor/mcp.json",
        r#"{"mcpServers": {"tickets": {"url": "https://tickets.example.com/mcp"}, "local": {"command": "npx"}}}"#,
    );
    let out = ok(&case.wrap(&["--serve", "http://127.0.0.1:8787/", file.to_str().unwrap()]));
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(
        doc["mcpServers"]["tickets"]["url"],
        "http://127.0.0.1:8787/servers/tickets/mcp"
    );
    assert!(
        out.contains("[[servers]]\nname = \"tickets\"\nurl = \"https://tickets.example.com/mcp\""),
        "{out}"
    );
    assert_host_accepts(&file, include_str!("../wrap/cursor.schema.json"));
}

#[test]
fn a_credential_folder_argument_is_not_mounted_and_a_loader_variable_leaves_the_entry_alone() {
    let case = Case::new();
    let ssh = case.dir.path().join("home/u/.ssh");
    std::fs::create_dir_all(&ssh).unwrap();
    let text = format!(
        r#"{{"mcpServers": {{
  "keys": {{"command": "npx", "args": ["-y", "some-server", "{}"]}},
  "inject": {{"command": "npx", "env": {{"LD_PRELOAD": "/tmp/evil.so"}}}}
}}}}"#,
        ssh.display()
    );
    let file = case.file("p/.mcp.json", &text);
    let out = ok(&case.wrap(&[file.to_str().unwrap()]));
    assert!(
        out.contains(&format!(
            "note: {} is or holds the credential location .ssh: not mounted",
            ssh.display()
        )),
        "{out}"
    );
    assert!(
        out.contains("inject: left alone: its generated policy is refused"),
        "{out}"
    );
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(
        doc["mcpServers"]["inject"],
        json!({"command": "npx", "env": {"LD_PRELOAD": "/tmp/evil.so"}})
    );
    let args = doc["mcpServers"]["keys"]["args"].as_array().unwrap();
    let policy = std::fs::read_to_string(args[2].as_str().unwrap()).unwrap();
    assert!(!policy.contains("[[filesystem.mounts]]"), "{policy}");
}

#[test]
fn a_symlinked_config_is_rewritten_where_it_lives_and_the_link_stays() {
    let case = Case::new();
    let text = r#"{"mcpServers": {"a": {"command": "npx"}}}"#;
    let real = case.file("dotfiles/claude_desktop_config.json", text);
    let link = case.dir.path().join("Claude/claude_desktop_config.json");
    std::fs::create_dir_all(link.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&real, &link).unwrap();
    ok(&case.wrap(&[link.to_str().unwrap()]));
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_ne!(std::fs::read_to_string(&real).unwrap(), text);
    ok(&case.wrap(&["--undo", link.to_str().unwrap()]));
    assert_eq!(std::fs::read_to_string(&real).unwrap(), text);
}

#[test]
fn the_mcpbox_override_is_written_as_given_and_an_empty_secret_stays_plain() {
    let case = Case::new();
    let file = case.file(
        "p/.mcp.json",
        r#"{"mcpServers": {"a": {"command": "npx", "env": {"API_KEY": ""}}}}"#,
    );
    ok(&case.wrap(&["--mcpbox", "mcpbox", file.to_str().unwrap()]));
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(doc["mcpServers"]["a"]["command"], "mcpbox");
    let policy =
        std::fs::read_to_string(doc["mcpServers"]["a"]["args"][2].as_str().unwrap()).unwrap();
    assert!(policy.contains("set = { API_KEY = \"\" }"), "{policy}");
    assert!(!policy.contains("[secrets"), "{policy}");
}

#[test]
fn a_known_server_is_wrapped_with_its_preset_and_its_directory_as_input() {
    let case = Case::new();
    let notes = case.dir.path().join("notes");
    std::fs::create_dir(&notes).unwrap();
    let file = case.file(
        "Claude/claude_desktop_config.json",
        &format!(
            r#"{{"mcpServers": {{
  "fs": {{"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "{}"]}},
  "git": {{"command": "uvx", "args": ["mcp-server-git"]}}
}}}}"#,
            notes.display()
        ),
    );
    let out = ok(&case.wrap(&[file.to_str().unwrap()]));
    assert!(
        out.contains("fs: wrapped with the preset filesystem"),
        "{out}"
    );
    // the git preset reads its own directory, and this entry names none:
    // that directory would be the state folder, so no preset
    assert!(
        out.contains("git: wrapped with a generated policy"),
        "{out}"
    );
    assert!(
        out.contains("the preset git reads a directory and the entry names none"),
        "{out}"
    );
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let policy_path = doc["mcpServers"]["fs"]["args"][2]
        .as_str()
        .unwrap()
        .to_string();
    let policy = std::fs::read_to_string(&policy_path).unwrap();
    // the preset as shipped (its rules and comments) under the entry's name
    assert!(
        policy.contains("# mcpbox's preset \"filesystem\" as shipped"),
        "{policy}"
    );
    assert!(policy.contains("\nname = \"fs\"\n"), "{policy}");
    assert!(
        policy
            .lines()
            .any(|l| l.starts_with("\"write_file\"") && l.contains("\"deny\"")),
        "{policy}"
    );
    let check = Command::new(common::mcpbox())
        .args(["check", &policy_path])
        .output()
        .unwrap();
    let effective = String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let real = std::fs::canonicalize(&notes).unwrap();
    assert!(
        effective.contains(&format!("input = \"{}\"", real.display())),
        "the preset's input is the entry's directory, not the state folder:\n{effective}"
    );
}

#[test]
fn a_wrapped_pypi_server_from_a_venv_runs_under_its_preset() {
    let case = Case::new();
    // mcp-server-time as pip installs it: a venv script whose #! names the
    // venv's python, a symlink out of the venv
    let server = common::peers::peer("venv/bin/mcp-server-time");
    let file = case.file(
        "p/.mcp.json",
        &format!(
            r#"{{"mcpServers": {{"time": {{"command": "{}", "args": ["--local-timezone", "UTC"]}}}}}}"#,
            server.display()
        ),
    );
    let out = ok(&case.wrap(&[file.to_str().unwrap()]));
    assert!(out.contains("time: wrapped with the preset time"), "{out}");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let entry = &doc["mcpServers"]["time"];
    let mut s = start_entry(&case, entry);
    let resp = s.call("get_current_time", json!({"timezone": "UTC"}));
    let text = common::mcp::result_text(&resp);
    assert!(
        text.contains("\"timezone\": \"UTC\""),
        "{resp} {}",
        s.stderr()
    );
}

/// Starts a rewritten entry exactly as a host does: its command, args and
/// env from the file, in a minimal environment (PATH=/usr/bin:/bin and
/// HOME, as Claude Desktop gives), nothing of the test's own.
fn start_as_host(entry: &Value) -> common::mcp::Session {
    let mut cmd = Command::new(entry["command"].as_str().unwrap());
    for a in entry["args"].as_array().unwrap() {
        cmd.arg(a.as_str().unwrap());
    }
    cmd.env_clear().env("PATH", "/usr/bin:/bin").env(
        "HOME",
        std::env::var_os("HOME").unwrap_or_else(|| "/root".into()),
    );
    if let Some(env) = entry["env"].as_object() {
        for (k, v) in env {
            cmd.env(k, v.as_str().unwrap());
        }
    }
    common::mcp::Session::start_command(cmd)
}

/// Issue 32: the install shapes of real host configs (a pyenv venv, a
/// global npm command by the absolute path of its link, `node FILE` with
/// an inline key, `python FILE`, `python -m MODULE`, `uv run` of a uv
/// project whose venv has a pyenv Python), in a Claude Desktop
/// config and a Claude Code `.mcp.json`: after the wrap every rewritten
/// entry, started as the host starts it, answers initialize, tools/list
/// and a real call, with no mount written by hand; its state is where the
/// wrap put it, and the inline key reached the server and not the host.
#[test]
fn every_install_shape_of_a_host_config_answers_a_call_after_the_wrap() {
    let case = Case::new();
    let shapes = common::runtimes::all(&case.dir.path().join("installs"), KEY);
    for rel in ["Claude/claude_desktop_config.json", "project/.mcp.json"] {
        let servers: serde_json::Map<String, Value> = shapes
            .iter()
            .map(|s| (s.name.to_string(), s.entry()))
            .collect();
        let file = case.file(
            rel,
            &serde_json::to_string_pretty(&json!({ "mcpServers": servers })).unwrap(),
        );
        let out = ok(&case.wrap(&[file.to_str().unwrap()]));
        assert!(!out.contains("left alone"), "{out}");
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(!text.contains(KEY), "the key left the file: {text}");
        let doc: Value = serde_json::from_str(&text).unwrap();
        for shape in &shapes {
            let entry = &doc["mcpServers"][shape.name];
            assert_eq!(
                entry["env"]["MCPBOX_STATE_DIR"].as_str(),
                Some(case.state().to_str().unwrap()),
                "{entry}"
            );
            let mut s = start_as_host(entry);
            let init = s.initialize();
            assert!(
                init.get("result").is_some(),
                "{}: {init}\n{}",
                shape.name,
                s.stderr()
            );
            assert_eq!(s.tool_names(), vec!["greet".to_string()], "{}", shape.name);
            let r = s.call("greet", json!({"name": "sandbox"}));
            assert_eq!(
                common::mcp::result_text(&r),
                shape.answer,
                "{}: {r}\n{}",
                shape.name,
                s.stderr()
            );
            assert!(!r.to_string().contains(KEY), "{r}");
            let (status, stderr) = s.finish();
            assert!(status.success(), "{}: {stderr}", shape.name);
        }
        // the audit went where the entries say (the wrap's state dir)
        assert!(case.state().join("audit.db").exists());
        ok(&case.wrap(&["--undo", file.to_str().unwrap()]));
    }
}

/// Issue 32: `--undo` deletes the policies the wrap generated, but never
/// one the user edited since without `--force`; it says which.
#[test]
fn undo_keeps_a_generated_policy_edited_since_unless_forced() {
    let case = Case::new();
    let text = r#"{"mcpServers": {"a": {"command": "npx", "args": ["-y", "x"]}}}"#;
    let file = case.file("p/.mcp.json", text);
    ok(&case.wrap(&[file.to_str().unwrap()]));
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let policy = PathBuf::from(doc["mcpServers"]["a"]["args"][2].as_str().unwrap());
    let edited = std::fs::read_to_string(&policy).unwrap() + "\n# mine\n";
    std::fs::write(&policy, &edited).unwrap();
    let wrapped = std::fs::read_to_string(&file).unwrap();
    let err = refused(&case.wrap(&["--undo", file.to_str().unwrap()]));
    assert!(
        err.contains(&policy.display().to_string())
            && err.contains("changed since mcpbox wrap")
            && err.contains("--force"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&policy).unwrap(), edited);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), wrapped);
    let out = case.wrap(&["--undo", "--force", file.to_str().unwrap()]);
    ok(&out);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&format!(
            "removing {}, changed since the wrap",
            policy.display()
        )),
        "{out:?}"
    );
    assert!(!policy.exists());
    assert_eq!(std::fs::read_to_string(&file).unwrap(), text);
}

/// The playwright preset writes `./playwright-output` beside its policy;
/// wrapped, that would be inside the state folder, which mcpbox never
/// mounts, and the entry failed at its first start. The wrap gives the
/// entry an output folder of its own beside the host's config, makes it,
/// and the generated policy passes `check`.
#[test]
fn a_wrapped_playwright_entry_gets_an_output_folder_beside_the_config() {
    let case = Case::new();
    let file = case.file(
        "project/.mcp.json",
        r#"{"mcpServers": {"browser": {"command": "npx", "args": ["-y", "@playwright/mcp@0.0.83"]}}}"#,
    );
    let out = ok(&case.wrap(&[file.to_str().unwrap()]));
    assert!(out.contains("preset playwright"), "{out}");
    let folder = case.dir.path().join("project/browser-output");
    assert!(folder.is_dir(), "{out}");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let args = doc["mcpServers"]["browser"]["args"]
        .as_array()
        .unwrap()
        .clone();
    let policy = PathBuf::from(args[2].as_str().unwrap());
    let text = std::fs::read_to_string(&policy).unwrap();
    assert!(
        text.contains(&format!("output = \"{}\"", folder.display())),
        "{text}"
    );
    let check = Command::new(common::mcpbox())
        .arg("check")
        .arg(&policy)
        .env("MCPBOX_STATE_DIR", case.state())
        .output()
        .unwrap();
    ok(&check);
}

#[test]
fn wrap_never_mounts_mcpbox_state_nor_rewrites_a_file_in_it() {
    let case = Case::new();
    std::fs::create_dir_all(case.state().join("pins")).unwrap();
    // an argument naming the state directory (through a symlink): the
    // generated policy does not mount it
    let link = case.dir.path().join("data");
    std::os::unix::fs::symlink(case.state(), &link).unwrap();
    let text = format!(
        r#"{{"mcpServers": {{"peek": {{"command": "npx", "args": ["-y", "some-server", "{}"]}}}}}}"#,
        link.display()
    );
    let file = case.file("p/.mcp.json", &text);
    let out = ok(&case.wrap(&[file.to_str().unwrap()]));
    assert!(
        out.contains(&format!(
            "note: {} is, is inside, or holds mcpbox's state directory: not mounted",
            link.display()
        )),
        "{out}"
    );
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let args = doc["mcpServers"]["peek"]["args"].as_array().unwrap();
    let policy = std::fs::read_to_string(args[2].as_str().unwrap()).unwrap();
    assert!(!policy.contains("[[filesystem.mounts]]"), "{policy}");
    // a "host config" inside the state directory is not wrapped
    let inside = case.state().join("pins/.mcp.json");
    std::fs::write(&inside, r#"{"mcpServers": {"a": {"command": "npx"}}}"#).unwrap();
    let err = refused(&case.wrap(&[inside.to_str().unwrap()]));
    assert!(err.contains("mcpbox's state directory"), "{err}");
    assert_eq!(
        std::fs::read_to_string(&inside).unwrap(),
        r#"{"mcpServers": {"a": {"command": "npx"}}}"#
    );
}
