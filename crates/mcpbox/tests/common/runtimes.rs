//! Servers installed the ways users install them, for the runtime
//! discovery, `wrap`, `serve` and `learn` tests (issue 32): tiny stdio MCP
//! servers on the language's standard library only, laid out as a venv of
//! a pyenv Python, a global npm package reached through its `bin` link, a
//! node project run as `node FILE`, a Python project run as `python FILE`,
//! and a package run as `python -m MODULE`.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// A stdio MCP server in JavaScript on node's builtins only; its one tool
/// answers `GREETING, NAME`, where `greeting` is a JavaScript expression.
pub fn tiny_server_js(greeting: &str) -> String {
    format!(
        r#"#!/usr/bin/env node
const greeting = {greeting};
const rl = require('readline').createInterface({{ input: process.stdin }});
const send = (m) => process.stdout.write(JSON.stringify(m) + '\n');
rl.on('line', (line) => {{
  let m; try {{ m = JSON.parse(line); }} catch (e) {{ return; }}
  if (m.id === undefined) return;
  if (m.method === 'initialize') send({{ jsonrpc: '2.0', id: m.id, result: {{ protocolVersion: m.params.protocolVersion, capabilities: {{ tools: {{}} }}, serverInfo: {{ name: 'tiny', version: '1.0.0' }} }} }});
  else if (m.method === 'tools/list') send({{ jsonrpc: '2.0', id: m.id, result: {{ tools: [{{ name: 'greet', description: 'Greets someone.', inputSchema: {{ type: 'object', properties: {{ name: {{ type: 'string' }} }} }} }}] }} }});
  else if (m.method === 'tools/call') send({{ jsonrpc: '2.0', id: m.id, result: {{ content: [{{ type: 'text', text: greeting + ', ' + (m.params.arguments || {{}}).name }}] }} }});
  else send({{ jsonrpc: '2.0', id: m.id, error: {{ code: -32601, message: 'no such method' }} }});
}});
rl.on('close', () => process.exit(0));
"#
    )
}

/// A stdio MCP server in Python (standard library only), as the `main()`
/// of a package's module; its one tool answers `GREETING, NAME`, where
/// `greeting` is a Python expression (`os` and `sys` are imported).
pub fn tiny_server_py(greeting: &str) -> String {
    format!(
        r#"import json, os, sys

def main():
    for line in sys.stdin:
        try:
            m = json.loads(line)
        except ValueError:
            continue
        if "id" not in m:
            continue
        method = m.get("method")
        if method == "initialize":
            result = {{"protocolVersion": m["params"]["protocolVersion"],
                      "capabilities": {{"tools": {{}}}},
                      "serverInfo": {{"name": "tiny-py", "version": "1.0.0"}}}}
        elif method == "tools/list":
            result = {{"tools": [{{"name": "greet", "description": "Greets someone.",
                                 "inputSchema": {{"type": "object",
                                                 "properties": {{"name": {{"type": "string"}}}}}}}}]}}
        elif method == "tools/call":
            name = (m["params"].get("arguments") or {{}}).get("name", "")
            result = {{"content": [{{"type": "text", "text": {greeting} + ", " + name}}]}}
        else:
            sys.stdout.write(json.dumps({{"jsonrpc": "2.0", "id": m["id"],
                "error": {{"code": -32601, "message": "no such method"}}}}) + "\n")
            sys.stdout.flush()
            continue
        sys.stdout.write(json.dumps({{"jsonrpc": "2.0", "id": m["id"], "result": result}}) + "\n")
        sys.stdout.flush()
"#
    )
}

/// The pyenv Python the venv shapes are made with: pyenv's 3.11.7 where
/// this user can run it (`MCPBOX_TEST_PYENV_PYTHON` names another), else
/// (the rootless pass: /root is closed to its user) a pyenv-like prefix
/// made under `dir`, `.pyenv/versions/V/bin/pythonV` a copy of the system
/// interpreter with `lib/pythonV` linking to its standard library, which
/// is the same layout to discovery: an interpreter outside /usr whose
/// prefix holds its library. Returns the interpreter and its version.
pub fn pyenv_python(dir: &Path) -> (PathBuf, String) {
    let given = std::env::var_os("MCPBOX_TEST_PYENV_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root/.pyenv/versions/3.11.7/bin/python3.11"));
    let version_of = |python: &Path| -> Option<String> {
        let out = std::process::Command::new(python)
            .args(["-c", "import sys; print(sys.version.split()[0])"])
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    if let Some(v) = version_of(&given) {
        return (given, v);
    }
    let real = std::fs::canonicalize("/usr/bin/python3").unwrap();
    let name = real.file_name().unwrap().to_str().unwrap().to_string();
    let version = version_of(&real).expect("the system's python3 runs");
    let prefix = dir.join(".pyenv/versions").join(&version);
    let python = prefix.join("bin").join(&name);
    if !python.exists() {
        std::fs::create_dir_all(prefix.join("bin")).unwrap();
        std::fs::create_dir_all(prefix.join("lib")).unwrap();
        std::fs::copy(&real, &python).unwrap();
        std::os::unix::fs::symlink(
            Path::new("/usr/lib").join(&name),
            prefix.join("lib").join(&name),
        )
        .unwrap();
    }
    assert_eq!(version_of(&python).as_deref(), Some(version.as_str()));
    (python, version)
}

/// One server as a host config names it.
#[derive(Debug, Clone)]
pub struct Shape {
    /// The entry's name.
    pub name: &'static str,
    pub command: String,
    pub args: Vec<String>,
    /// The entry's env (literal values).
    pub env: Vec<(String, String)>,
    /// What its tool answers to `{"name": "sandbox"}`.
    pub answer: String,
}

impl Shape {
    /// The entry as JSON (`command`, `args`, `env`).
    pub fn entry(&self) -> serde_json::Value {
        let mut e = serde_json::json!({"command": self.command, "args": self.args});
        if !self.env.is_empty() {
            let env: serde_json::Map<String, serde_json::Value> = self
                .env
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::from(v.as_str())))
                .collect();
            e["env"] = serde_json::Value::Object(env);
        }
        e
    }
}

/// `3.11` of `3.11.7`.
fn short(version: &str) -> String {
    version.split('.').take(2).collect::<Vec<_>>().join(".")
}

fn write(p: &Path, body: &str, mode: u32) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, body).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A venv made by the pyenv Python (`python -m venv`, no pip) under
/// `dir/venv`, with the server installed as pip installs one: a module in
/// site-packages and a `bin/` script whose `#!` names the venv's python
/// (a link to the pyenv prefix, outside /usr).
pub fn venv_server(dir: &Path) -> Shape {
    let venv = dir.join("venv");
    let (python, version) = pyenv_python(dir);
    let out = std::process::Command::new(&python)
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let site = venv.join(format!("lib/python{}/site-packages", short(&version)));
    write(
        &site.join("echo_venv.py"),
        &tiny_server_py("'venv python ' + sys.version.split()[0]"),
        0o644,
    );
    let script = venv.join("bin/echo-venv");
    write(
        &script,
        &format!(
            "#!{}\nfrom echo_venv import main\nmain()\n",
            venv.join("bin/python").display()
        ),
        0o755,
    );
    Shape {
        name: "pyenv-venv",
        command: script.display().to_string(),
        args: vec![],
        env: vec![],
        answer: format!("venv python {version}, sandbox"),
    }
}

/// A global npm install under `dir/npm-global` (a prefix as `npm install
/// -g` makes it): the package in `lib/node_modules/echo-npm`, and
/// `bin/echo-npm`, a link to its `#!/usr/bin/env node` script, named by
/// its absolute path.
pub fn global_npm_server(dir: &Path) -> Shape {
    let prefix = dir.join("npm-global");
    let pkg = prefix.join("lib/node_modules/echo-npm");
    write(
        &pkg.join("package.json"),
        r#"{"name":"echo-npm","version":"1.0.0","bin":{"echo-npm":"server.js"}}"#,
        0o644,
    );
    write(
        &pkg.join("lib/greeting.js"),
        "exports.text = 'global npm';\n",
        0o644,
    );
    write(
        &pkg.join("server.js"),
        &tiny_server_js("require('./lib/greeting.js').text"),
        0o755,
    );
    std::fs::create_dir_all(prefix.join("bin")).unwrap();
    std::os::unix::fs::symlink(
        "../lib/node_modules/echo-npm/server.js",
        prefix.join("bin/echo-npm"),
    )
    .unwrap();
    Shape {
        name: "global-npm",
        command: prefix.join("bin/echo-npm").display().to_string(),
        args: vec![],
        env: vec![],
        answer: "global npm, sandbox".into(),
    }
}

/// A node project under `dir/node-project` run as `node FILE`: its built
/// script in `build/` requires a package of its own `node_modules`; the
/// entry holds an inline key, `API_KEY = key`, which the server echoes
/// (the relay redacts it on the way back).
pub fn node_file_server(dir: &Path, key: &str) -> Shape {
    let proj = dir.join("node-project");
    write(
        &proj.join("package.json"),
        r#"{"name":"node-project","version":"1.0.0"}"#,
        0o644,
    );
    write(
        &proj.join("node_modules/echo-dep/index.js"),
        "exports.text = 'node file';\n",
        0o644,
    );
    write(
        &proj.join("build/index.js"),
        &tiny_server_js("require('echo-dep').text + ' key ' + (process.env.API_KEY || 'unset')"),
        0o644,
    );
    Shape {
        name: "node-file",
        command: "node".into(),
        args: vec![proj.join("build/index.js").display().to_string()],
        env: vec![("API_KEY".into(), key.into())],
        answer: "node file key [REDACTED:API_KEY], sandbox".into(),
    }
}

/// A Python project under `dir/py-project` run as `python3 FILE`: the
/// script in `scripts/` imports the project's module from the project's
/// root (its `pyproject.toml`).
pub fn python_file_server(dir: &Path) -> Shape {
    let proj = dir.join("py-project");
    write(
        &proj.join("pyproject.toml"),
        "[project]\nname = \"echo-py\"\nversion = \"1.0\"\n",
        0o644,
    );
    write(
        &proj.join("echo_lib.py"),
        &tiny_server_py("'python file'"),
        0o644,
    );
    write(
        &proj.join("scripts/serve.py"),
        "import os, sys\n\
         sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))\n\
         import echo_lib\n\
         echo_lib.main()\n",
        0o644,
    );
    Shape {
        name: "python-file",
        command: "python3".into(),
        args: vec![proj.join("scripts/serve.py").display().to_string()],
        env: vec![],
        answer: "python file, sandbox".into(),
    }
}

/// A package under `dir/py-module` run as `python3 -m echo_mod`, found
/// through the entry's `PYTHONPATH`.
pub fn python_module_server(dir: &Path) -> Shape {
    let root = dir.join("py-module");
    write(
        &root.join("echo_mod/__init__.py"),
        &tiny_server_py("'python module'"),
        0o644,
    );
    write(
        &root.join("echo_mod/__main__.py"),
        "from echo_mod import main\nmain()\n",
        0o644,
    );
    Shape {
        name: "python-module",
        command: "python3".into(),
        args: vec!["-m".into(), "echo_mod".into()],
        env: vec![("PYTHONPATH".into(), root.display().to_string())],
        answer: "python module, sandbox".into(),
    }
}

/// A uv project under `dir/uv-project` run as `uv run --directory DIR
/// --no-sync --offline python -m echo_uv` with uv by its absolute path (the
/// peers' pinned uv): its `.venv`, made by `uv venv` with the pyenv Python,
/// holds the module.
pub fn uv_run_server(dir: &Path) -> Shape {
    let proj = dir.join("uv-project");
    write(
        &proj.join("pyproject.toml"),
        "[project]\nname = \"echo-uv\"\nversion = \"1.0\"\nrequires-python = \">=3.11\"\n\
         dependencies = []\n",
        0o644,
    );
    let uv = super::peers::peer("venv/bin/uv");
    let (python, version) = pyenv_python(dir);
    let out = std::process::Command::new(&uv)
        .args(["venv", "--python"])
        .arg(&python)
        .arg(proj.join(".venv"))
        .env("UV_PYTHON_DOWNLOADS", "never")
        .env("UV_CACHE_DIR", dir.join("uv-cache"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    write(
        &proj.join(format!(
            ".venv/lib/python{}/site-packages/echo_uv.py",
            short(&version)
        )),
        &format!(
            "{}\nif __name__ == \"__main__\":\n    main()\n",
            tiny_server_py("'uv run python ' + sys.version.split()[0]")
        ),
        0o644,
    );
    Shape {
        name: "uv-run",
        command: uv.display().to_string(),
        args: [
            "run",
            "--directory",
            &proj.display().to_string(),
            "--no-sync",
            "--offline",
            "python",
            "-m",
            "echo_uv",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect(),
        env: vec![],
        answer: format!("uv run python {version}, sandbox"),
    }
}

/// Every shape, under `dir` (made readable by the sandbox's user).
pub fn all(dir: &Path, key: &str) -> Vec<Shape> {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    vec![
        venv_server(dir),
        global_npm_server(dir),
        node_file_server(dir, key),
        python_file_server(dir),
        python_module_server(dir),
        uv_run_server(dir),
    ]
}
