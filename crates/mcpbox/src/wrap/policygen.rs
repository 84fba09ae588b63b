//! The policy `wrap` writes for one stdio entry: the preset of a known
//! server, otherwise the strictest policy its command line implies (the
//! host paths it names, read-only, at the same path; no network; only the
//! entry's own environment), plus where its environment went: secrets to
//! files of the store, the rest to `[env] set`.

use mcpbox_policy::toml_text::{toml_key, toml_str};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// One variable of the entry's `env`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvValue {
    /// A value written in the host file.
    Literal(String),
    /// A value the host fills in when it starts the server (`${VAR}`,
    /// `${env:VAR}`, `${input:ID}`): no secret is in the file, so the entry
    /// keeps it and the policy reads it from mcpbox's environment.
    Reference(String),
}

/// A stdio server as the host starts it.
#[derive(Debug, Clone)]
pub struct Stdio {
    pub command: String,
    pub args: Vec<String>,
    pub env: Vec<(String, EnvValue)>,
    /// Variables the host passes through by name (Codex's `env_vars`).
    pub pass: Vec<String>,
}

/// What [`generate`] made.
#[derive(Debug, Clone)]
pub struct Generated {
    pub text: String,
    /// The preset it started from, if the server is known.
    pub preset: Option<&'static str>,
    /// Secrets to store: (variable, value, file).
    pub secrets: Vec<(String, String, PathBuf)>,
    /// What the host entry keeps of its env (references only).
    pub kept_env: Vec<(String, String)>,
    /// Host paths mounted, with their mode, for the summary.
    pub mounts: Vec<(PathBuf, &'static str)>,
    /// What was not carried over, and why.
    pub notes: Vec<String>,
    /// What `mcpbox run` will mount for the server's runtime when the host
    /// starts it (runtime discovery, docs/runtime.md), for the summary.
    pub runtime: Vec<String>,
    /// Why the entry cannot be wrapped: its runtime lies inside a
    /// credential location, which `run` would refuse to mount.
    pub refused: Option<String>,
    /// A folder the server writes (its output), to be made by the wrap so
    /// that the wrapped entry starts.
    pub output_dir: Option<PathBuf>,
}

/// What `wrap` needs to know of a preset.
#[derive(Debug, Clone, Copy)]
struct PresetUse {
    name: &'static str,
    /// The preset's policy file.
    text: &'static str,
    /// The preset reads the directory it is used from (`input = "."`):
    /// here that would be the state folder, so the entry must name one.
    reads_cwd: bool,
    /// The preset writes a folder beside its policy (`output =
    /// "./playwright-output"`): here that would be inside the state folder,
    /// which is never mounted, so the entry gets a folder of its own.
    writes_relative: bool,
}

/// The preset of a known server, by its command line. The one place
/// `wrap` asks about presets.
fn preset_for(argv: &[String]) -> Option<PresetUse> {
    let p = mcpbox_policy::preset::for_command(argv)?;
    // a preset that cannot be read is taken to read its directory (the
    // safer guess: it then needs a directory the entry names)
    let parsed = p.parse(Path::new("/")).ok();
    let reads_cwd = parsed
        .as_ref()
        .is_none_or(|policy| policy.filesystem.input.is_some());
    // parsed against "/": a relative output resolves to "/<folder>"
    let writes_relative = parsed
        .as_ref()
        .and_then(|policy| policy.filesystem.output.as_ref())
        .is_some_and(|o| o.parent() == Some(Path::new("/")));
    Some(PresetUse {
        name: p.name,
        text: p.text,
        reads_cwd,
        writes_relative,
    })
}

/// Variable names whose value is a credential whatever it looks like:
/// one `_`-separated part of the name (`GITHUB_TOKEN`, `API_KEY`) ...
const SECRET_PARTS: &[&str] = &[
    "TOKEN",
    "KEY",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "PASS",
    "PWD",
    "AUTH",
    "CREDENTIAL",
    "CREDENTIALS",
    "COOKIE",
    "PAT",
    "SESSION",
    "PRIVATE",
    "DSN",
];
/// ... or anywhere in it (`APIKEY`, `ACCESSTOKEN`).
const SECRET_WORDS: &[&str] = &[
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "APIKEY",
    "CREDENTIAL",
    "AUTH",
];

/// Whether an env value is to be moved into the secret store: by its name,
/// or by its shape (a provider token, a private key, a URL carrying a
/// password). Everything else stays a plain `[env] set` value.
pub fn is_secret(name: &str, value: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    if upper.split('_').any(|p| SECRET_PARTS.contains(&p))
        || SECRET_WORDS.iter().any(|w| upper.contains(w))
    {
        return true;
    }
    if !mcpbox_gateway::redact::find_credentials(value).is_empty() {
        return true;
    }
    // scheme://user:password@host
    if let Some((_, rest)) = value.split_once("://") {
        let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
        if let Some((userinfo, _)) = authority.rsplit_once('@') {
            return userinfo.contains(':');
        }
    }
    false
}

/// Directories the sandbox shows already (read-only): a path under them
/// needs no mount.
const SYSTEM: &[&str] = &["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc"];
/// Where a mount may not go (`[[filesystem.mounts]] at` refuses these).
const NO_TARGET: &[&str] = &["/proc", "/dev", "/sys", "/workspace"];
/// Option names that evidently name a place the server writes.
const WRITE_FLAGS: &[&str] = &["out", "output", "write", "dest", "save"];

fn under(p: &Path, roots: &[&str]) -> bool {
    roots.iter().any(|r| p.starts_with(r))
}

/// The policy for entry `name` of `config`. `secret_file(var)` is where
/// the store keeps the entry's secret `var`.
pub fn generate(
    name: &str,
    config: &Path,
    host: &str,
    entry: &Stdio,
    secret_file: &dyn Fn(&str) -> PathBuf,
) -> Generated {
    let mut g = Generated {
        text: String::new(),
        preset: None,
        secrets: Vec::new(),
        kept_env: Vec::new(),
        mounts: Vec::new(),
        notes: Vec::new(),
        runtime: Vec::new(),
        refused: None,
        output_dir: None,
    };
    let mut argv = vec![entry.command.clone()];
    argv.extend(entry.args.iter().cloned());
    runtime(entry, &argv, &mut g);
    let _ = writeln!(
        g.text,
        "# Generated by `mcpbox wrap` for the server {} of\n# {} ({host}).",
        toml_str(name),
        config.display()
    );
    let _ = writeln!(g.text, "# Command: {}", argv.join(" ").replace('\n', " "));
    let (mounts, first_dir) = mounts(entry, &mut g.mounts, &mut g.notes);
    let preset = preset_for(&argv).filter(|p| {
        let usable = !p.reads_cwd || first_dir.is_some();
        if !usable {
            g.notes.push(format!(
                "the preset {} reads a directory and the entry names none: a generated policy instead",
                p.name
            ));
        }
        usable
    });
    let env = environment(entry, secret_file, &mut g);
    let server = format!("[server]\nname = {}\n", toml_str(name));
    if let Some(p) = preset {
        let mut ours = server.clone();
        let input = first_dir.filter(|_| p.reads_cwd);
        // beside the host's config file, named after the entry: where a
        // user looks for a wrapped server's screenshots and files
        let output = p.writes_relative.then(|| {
            config
                .parent()
                .unwrap_or(Path::new("/"))
                .join(format!("{name}-output"))
        });
        if input.is_some() || output.is_some() {
            ours.push_str("\n[filesystem]\n");
        }
        if let Some(dir) = input {
            let _ = write!(
                ours,
                "# the preset's directory: the first one the entry names\ninput = {}\n",
                toml_str(&dir.to_string_lossy())
            );
        }
        if let Some(dir) = &output {
            let _ = write!(
                ours,
                "# the preset's output folder, made by the wrap beside the host's config\noutput = {}\n",
                toml_str(&dir.to_string_lossy())
            );
            g.mounts.push((dir.clone(), "rw"));
            g.output_dir = Some(dir.clone());
        }
        ours.push_str(&mounts);
        ours.push_str(&env);
        match merged(p.text, &ours) {
            Ok(text) => {
                g.preset = Some(p.name);
                let _ = writeln!(
                    g.text,
                    "# mcpbox's preset {0:?} as shipped (`mcpbox init --preset {0}`), with the\n\
                     # entry's own merged in: its name, the directory it names as the preset's\n\
                     # input, the host paths it names (read-only, at the same path), its\n\
                     # environment and secrets.\n",
                    p.name
                );
                g.text.push_str(&text);
                return g;
            }
            Err(e) => g.notes.push(format!(
                "the preset {} could not take the entry's settings ({e}): a generated policy instead",
                p.name
            )),
        }
    }
    let _ = writeln!(
        g.text,
        "# No preset knows this server: the strictest policy its command line\n\
         # implies. No network; the host paths it names, read-only at the same\n\
         # path (read-write only after an output option); nothing else of the host.\n"
    );
    g.text.push_str(&server);
    g.text.push_str(&mounts);
    g.text.push_str(&registry(entry));
    g.text.push_str(&env);
    g
}

/// `[network]` for a package runner: `npx` fetches the package from npm's
/// registry, `uvx` and `pipx run` from PyPI, at every start (mcpbox stops
/// at once when the registry is not allowed, docs/runtime.md). Nothing for
/// any other command: the server itself gets no network.
fn registry(entry: &Stdio) -> String {
    let program = Path::new(&entry.command)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("");
    let hosts = match program {
        "npx" => "\"registry.npmjs.org\"",
        "uvx" => "\"pypi.org\", \"files.pythonhosted.org\"",
        "pipx" if entry.args.first().is_some_and(|a| a == "run") => {
            "\"pypi.org\", \"files.pythonhosted.org\""
        }
        _ => return String::new(),
    };
    format!(
        "\n# {program} fetches the package at every start: its registry only (install the\n\
         # package and run it from its folder to drop this)\n[network]\nallow = [{hosts}]\n"
    )
}

/// What `mcpbox run` will mount for `entry`'s runtime, found by the same
/// discovery (`crate::runtime`) from here: the command through this PATH,
/// links, `#!` lines, venvs, and the script an interpreter runs with its
/// package tree. The policy needs none of it (run discovers it at every
/// start, from wherever the runtime then is); a refusal (a runtime inside a
/// credential location) leaves the entry alone.
fn runtime(entry: &Stdio, argv: &[String], g: &mut Generated) {
    let mut env: Vec<(std::ffi::OsString, std::ffi::OsString)> =
        vec![("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into())];
    for (var, value) in &entry.env {
        if let EnvValue::Literal(v) = value {
            if var == "PYTHONPATH" || var == "NODE_PATH" {
                env.push((var.into(), v.into()));
            }
        }
    }
    let mut spec = mcpbox_sandbox::Spec {
        argv: argv.iter().map(Into::into).collect(),
        env,
        input: None,
        output: None,
        tmp_size: 0,
        tmp_dir: None,
        mounts: Vec::new(),
        limits: Default::default(),
        allow_exec: None,
        allow_degraded: false,
        stdio: mcpbox_sandbox::Stdio::Piped,
        egress: None,
        cgroup_parent: None,
    };
    let path = std::env::var_os("PATH").unwrap_or_default();
    match crate::runtime::discover(&mut spec, &path) {
        Ok(found) => {
            for m in &found.mounts {
                g.runtime
                    .push(format!("{} read-only ({})", m.path.display(), m.reason));
            }
            g.notes.extend(
                found
                    .notes
                    .into_iter()
                    .filter(|n| !n.starts_with("the sandbox's PATH") && !n.starts_with("running ")),
            );
        }
        Err(refused) => g.refused = Some(refused.to_string()),
    }
}

/// The mounts of the strictest policy for `entry` (as TOML), and the
/// first directory among its arguments. The runtime (the command, and the
/// script or module an interpreter runs) is not mounted here: `run`
/// discovers it (see [`runtime`]).
fn mounts(
    entry: &Stdio,
    mounts: &mut Vec<(PathBuf, &'static str)>,
    notes: &mut Vec<String>,
) -> (String, Option<PathBuf>) {
    let mut t = String::new();
    let mut first_dir = None;
    // (path as the server names it, mode, why)
    let mut wanted: Vec<(PathBuf, &'static str, String)> = Vec::new();
    // the words that are the runtime's (argv index: args index + 1)
    let mut argv: Vec<std::ffi::OsString> = vec![entry.command.clone().into()];
    argv.extend(entry.args.iter().map(Into::into));
    let runtime_words: Vec<usize> = crate::runtime::ran(&argv)
        .iter()
        .map(|r| r.index())
        .collect();
    let mut previous: Option<&str> = None;
    for (i, arg) in entry.args.iter().enumerate() {
        if runtime_words.contains(&(i + 1)) {
            previous = Some(arg);
            continue;
        }
        // `--flag=/path` names the path too
        let (flag, value) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with('-') => (Some(f), v),
            _ => (previous.filter(|p| p.starts_with('-')), arg.as_str()),
        };
        previous = Some(arg);
        let p = Path::new(value);
        if !p.is_absolute() {
            continue;
        }
        // `/etc/../home/u` is not under /etc, and a mount target may not
        // hold `..`: such a path is named, not guessed at
        if p.components().any(|c| c == std::path::Component::ParentDir) {
            notes.push(format!("{} has a `..`: not mounted", p.display()));
            continue;
        }
        if under(p, SYSTEM) {
            continue;
        }
        let write = flag.is_some_and(|f| {
            let f = f.trim_start_matches('-').to_ascii_lowercase();
            WRITE_FLAGS
                .iter()
                .any(|w| f == *w || f.ends_with(&format!("-{w}")))
        });
        let mode = if write { "rw" } else { "ro" };
        if p.is_dir() {
            if first_dir.is_none() {
                first_dir = Some(std::fs::canonicalize(p).unwrap_or_else(|_| p.into()));
            }
            wanted.push((p.into(), mode, format!("named by the argument {arg}")));
        } else if p.is_file() {
            if let Some(dir) = p.parent() {
                wanted.push((dir.into(), mode, format!("holds {arg}, an argument")));
            }
        } else {
            notes.push(format!("{} does not exist here: not mounted", p.display()));
        }
    }
    let mut done: Vec<PathBuf> = Vec::new();
    for (p, mode, why) in wanted {
        if done.iter().any(|d| p.starts_with(d)) {
            continue;
        }
        if p == Path::new("/") || under(&p, NO_TARGET) {
            notes.push(format!(
                "{} cannot be mounted at its own path: not mounted",
                p.display()
            ));
            continue;
        }
        let host = std::fs::canonicalize(&p).unwrap_or_else(|_| p.clone());
        if let Some(kind) =
            mcpbox_policy::credential_kind(&host).or_else(|| mcpbox_policy::credential_kind(&p))
        {
            notes.push(format!(
                "{} is or holds the credential location {kind}: not mounted",
                p.display()
            ));
            continue;
        }
        // mcpbox's own state, which `run` would refuse to mount
        let private = crate::state::private_locations(std::iter::empty());
        if let Some((kind, _)) = crate::state::touches_private(&host, &private) {
            notes.push(format!(
                "{} is, is inside, or holds {kind}: not mounted",
                p.display()
            ));
            continue;
        }
        let _ = write!(
            t,
            "\n# {why}\n[[filesystem.mounts]]\nhost = {}\nat = {}\nmode = \"{mode}\"\n",
            toml_str(&host.to_string_lossy()),
            toml_str(&p.to_string_lossy()),
        );
        mounts.push((p.clone(), mode));
        done.push(p);
    }
    (t, first_dir)
}

/// `[env]` and `[secrets]`: literal values by kind, references from
/// mcpbox's environment (which the host still fills in).
fn environment(entry: &Stdio, secret_file: &dyn Fn(&str) -> PathBuf, g: &mut Generated) -> String {
    let mut set = Vec::new();
    let mut pass = Vec::new();
    let mut from_env = Vec::new();
    for (var, value) in &entry.env {
        match value {
            // an empty value is no secret, and mcpbox refuses to start
            // with an empty secret source: it stays a plain variable
            EnvValue::Literal(v) if !v.is_empty() && is_secret(var, v) => {
                g.secrets.push((var.clone(), v.clone(), secret_file(var)));
            }
            EnvValue::Literal(v) => set.push((var.clone(), v.clone())),
            EnvValue::Reference(v) => {
                g.kept_env.push((var.clone(), v.clone()));
                if is_secret(var, "") {
                    from_env.push(var.clone());
                } else {
                    pass.push(var.clone());
                }
            }
        }
    }
    for var in &entry.pass {
        if is_secret(var, "") {
            from_env.push(var.clone());
        } else {
            pass.push(var.clone());
        }
    }
    let mut text = String::new();
    let t = &mut text;
    if !set.is_empty() || !pass.is_empty() {
        t.push_str("\n# the entry's environment\n[env]\n");
        if !set.is_empty() {
            let items: Vec<String> = set
                .iter()
                .map(|(k, v)| format!("{} = {}", toml_key(k), toml_str(v)))
                .collect();
            let _ = writeln!(t, "set = {{ {} }}", items.join(", "));
        }
        if !pass.is_empty() {
            let items: Vec<String> = pass.iter().map(|k| toml_str(k)).collect();
            let _ = writeln!(t, "pass = [{}]", items.join(", "));
        }
    }
    for (var, _, file) in &g.secrets {
        let _ = write!(
            t,
            "\n# moved out of the host config into mcpbox's secret store\n[secrets.{}]\nfrom_file = {}\n",
            toml_key(var),
            toml_str(&file.to_string_lossy())
        );
    }
    for var in from_env {
        let _ = write!(
            t,
            "\n# filled in by the host from its own environment or prompt\n[secrets.{}]\nfrom_env = {}\n",
            toml_key(&var),
            toml_str(&var)
        );
    }
    text
}

/// `preset` with the TOML `ours` merged in, comments of both kept: tables
/// merge key by key, a list of tables (`[[filesystem.mounts]]`) and a list
/// (`[env] pass`) grow, any other value of ours replaces the preset's, and a
/// secret of ours replaces the preset's secret of that name whole (one
/// source each). The tables of ours are laid out after the preset's.
fn merged(preset: &str, ours: &str) -> Result<String, String> {
    let mut base: toml_edit::DocumentMut = preset.parse().map_err(|e| format!("{e}"))?;
    let mut add: toml_edit::DocumentMut = ours.parse().map_err(|e| format!("{e}"))?;
    let after = last_position(base.as_item()).map_or(0, |p| p + 1);
    shift_positions(add.as_item_mut(), after);
    merge(base.as_table_mut(), add.as_table(), "");
    Ok(base.to_string())
}

fn last_position(item: &toml_edit::Item) -> Option<usize> {
    let mut last = None;
    let mut see = |t: &toml_edit::Table| {
        let inner = t.iter().filter_map(|(_, i)| last_position(i)).max();
        t.position().max(inner)
    };
    match item {
        toml_edit::Item::Table(t) => last = see(t),
        toml_edit::Item::ArrayOfTables(a) => last = a.iter().filter_map(&mut see).max(),
        _ => {}
    }
    last
}

fn shift_positions(item: &mut toml_edit::Item, by: usize) {
    let shift = |t: &mut toml_edit::Table| {
        if let Some(p) = t.position() {
            t.set_position(p + by);
        }
        for (_, i) in t.iter_mut() {
            shift_positions(i, by);
        }
    };
    match item {
        toml_edit::Item::Table(t) => shift(t),
        toml_edit::Item::ArrayOfTables(a) => a.iter_mut().for_each(shift),
        _ => {}
    }
}

fn merge(base: &mut dyn toml_edit::TableLike, add: &dyn toml_edit::TableLike, path: &str) {
    use toml_edit::{Item, Value};
    for (key, item) in add.iter() {
        let replace_whole = path == "secrets";
        match (base.get_mut(key), item) {
            (Some(Item::ArrayOfTables(b)), Item::ArrayOfTables(a)) => {
                a.iter().for_each(|t| b.push(t.clone()));
            }
            (Some(Item::Value(Value::Array(b))), Item::Value(Value::Array(a))) => {
                a.iter().for_each(|v| b.push_formatted(v.clone()));
                b.fmt();
            }
            (Some(b), a) if !replace_whole && b.is_table_like() && a.is_table_like() => {
                if let (Some(bt), Some(a)) = (b.as_table_like_mut(), a.as_table_like()) {
                    merge(bt, a, key);
                }
                if let Some(t) = b.as_inline_table_mut() {
                    t.fmt();
                }
            }
            (Some(b), Item::Value(a)) if b.is_value() => {
                let mut a = a.clone();
                if let Some(old) = b.as_value() {
                    *a.decor_mut() = old.decor().clone();
                }
                *b = Item::Value(a);
            }
            // a different kind (a secret's inline table by a [secrets.X]
            // table): the old key goes with its decoration, which would
            // otherwise land inside the new table's header
            (Some(_), a) => {
                base.remove(key);
                base.insert(key, a.clone());
            }
            (None, a) => {
                base.insert(key, a.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_told_by_name_and_by_shape() {
        assert!(is_secret("GITHUB_PERSONAL_ACCESS_TOKEN", "x"));
        assert!(is_secret("API_KEY", "x"));
        assert!(is_secret("OPENAI_APIKEY", "x"));
        assert!(is_secret("DATABASE_URL", "postgres://u:hunter2@db/x"));
        assert!(is_secret("X", "ghp_0123456789abcdefghijklmnopqrstuvwxyzAB"));
        assert!(!is_secret("NODE_ENV", "production"));
        assert!(!is_secret("PATH", "/usr/bin"));
        assert!(!is_secret("NODE_PATH", "/opt/lib"));
        assert!(!is_secret("BASE_URL", "https://example.com/x"));
    }

    #[test]
    fn a_preset_takes_the_entry_settings_and_keeps_its_comments() {
        let preset = "# top\n[server]\nname = \"p\"\n\n[filesystem]\n# read here\ninput = \".\"\n\n\
                      [env]\nset = { A = \"1\" }\npass = [\"TZ\"]\n\n[secrets]\n# from the host\nTOKEN = { from_env = \"TOKEN\" }\n\n\
                      [[tests]]\ntool = \"x\"\nexpect = \"allow\"\n";
        let ours = "[server]\nname = \"mine\"\n[filesystem]\ninput = \"/d\"\n\
                    [[filesystem.mounts]]\nhost = \"/m\"\nat = \"/m\"\n[env]\nset = { B = \"2\" }\npass = [\"LANGUAGE\"]\n\
                    # moved\n[secrets.TOKEN]\nfrom_file = \"/s/t\"\n";
        let text = merged(preset, ours).unwrap();
        let p = mcpbox_policy::parse(&text, Path::new("/p/x.toml")).unwrap();
        assert_eq!(p.name(), "mine");
        assert_eq!(p.filesystem.input.as_deref(), Some(Path::new("/d")));
        assert_eq!(p.filesystem.mounts.len(), 1);
        assert!(
            text.contains("# top") && text.contains("# read here"),
            "{text}"
        );
        assert!(text.contains("[secrets.TOKEN]\nfrom_file"), "{text}");
        assert!(!text.contains("from_env"), "{text}");
        assert!(text.contains("set = { A = \"1\", B = \"2\" }"), "{text}");
        assert!(text.contains("pass = [\"TZ\", \"LANGUAGE\"]"), "{text}");
    }

    #[test]
    fn a_package_runner_gets_its_registry_and_nothing_else() {
        let text = |cmd: &str, args: &[&str]| {
            let e = Stdio {
                command: cmd.into(),
                args: args.iter().map(|a| a.to_string()).collect(),
                env: vec![],
                pass: vec![],
            };
            let g = generate("x", Path::new("/c"), "h", &e, &|v| PathBuf::from(v));
            let policy = mcpbox_policy::parse(&g.text, Path::new("/p/x.toml")).unwrap();
            (g.text, policy.network.is_closed())
        };
        let (t, closed) = text("npx", &["-y", "an-unknown-server"]);
        assert!(
            !closed && t.contains("allow = [\"registry.npmjs.org\"]"),
            "{t}"
        );
        let (t, _) = text("/usr/local/bin/uvx", &["an-unknown-server"]);
        assert!(
            t.contains("allow = [\"pypi.org\", \"files.pythonhosted.org\"]"),
            "{t}"
        );
        assert!(!text("pipx", &["run", "x"]).1);
        assert!(text("pipx", &["install", "x"]).1);
        assert!(text("node", &["server.js"]).1);
    }

    /// Issue 32: the runtime is `run`'s to discover, not the policy's: an
    /// interpreter's script is no mount of the policy (its package tree is
    /// mounted at each start), a data directory still is, and a runtime
    /// inside a credential location is refused here, before the host
    /// starts it.
    #[test]
    fn the_runtime_is_reported_not_mounted_and_a_credential_runtime_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let proj = dir.path().join("proj");
        std::fs::create_dir_all(proj.join("build")).unwrap();
        std::fs::write(proj.join("package.json"), "{}").unwrap();
        std::fs::write(proj.join("build/index.js"), "").unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        let entry = |command: &str, args: Vec<String>| Stdio {
            command: command.into(),
            args,
            env: vec![],
            pass: vec![],
        };
        let e = entry(
            "node",
            vec![
                proj.join("build/index.js").display().to_string(),
                data.display().to_string(),
            ],
        );
        let g = generate("x", Path::new("/c.json"), "h", &e, &|v| PathBuf::from(v));
        assert_eq!(g.mounts, vec![(data.clone(), "ro")], "{}", g.text);
        assert!(
            g.runtime.iter().any(|r| r.starts_with(&format!(
                "{} read-only (the package directory",
                proj.display()
            ))),
            "{:?}",
            g.runtime
        );
        assert!(g.refused.is_none());
        let hidden = dir.path().join("u/.ssh/bin/server");
        std::fs::create_dir_all(hidden.parent().unwrap()).unwrap();
        std::fs::write(&hidden, "#!/bin/sh\n").unwrap();
        let g = generate(
            "x",
            Path::new("/c.json"),
            "h",
            &entry(hidden.to_str().unwrap(), vec![]),
            &|v| PathBuf::from(v),
        );
        assert!(
            g.refused.as_deref().is_some_and(|r| r.contains(".ssh")),
            "{:?}",
            g.refused
        );
    }

    #[test]
    fn toml_strings_are_quoted_and_escaped() {
        assert_eq!(toml_str("a\"b"), "\"a\\\"b\"");
        assert_eq!(toml_str("plain"), "\"plain\"");
        assert!(!toml_str("a\nb").contains('\n'));
        let v: toml_edit::DocumentMut = format!("x = {}", toml_str("\u{7f}\n'\"")).parse().unwrap();
        assert_eq!(v["x"].as_str(), Some("\u{7f}\n'\""));
    }

    #[test]
    fn a_directory_argument_is_mounted_read_only_and_an_output_one_writable() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(&b).unwrap();
        let entry = Stdio {
            command: "node".into(),
            args: vec![
                "server.js".into(),
                a.display().to_string(),
                format!("--output={}", b.display()),
                "/nonexistent/x".into(),
            ],
            env: vec![
                ("NODE_ENV".into(), EnvValue::Literal("production".into())),
                ("API_KEY".into(), EnvValue::Literal("s3cret".into())),
                ("GH_TOKEN".into(), EnvValue::Reference("${GH_TOKEN}".into())),
            ],
            pass: vec![],
        };
        let g = generate("x", Path::new("/c.json"), "claude-code", &entry, &|v| {
            PathBuf::from(format!("/store/{v}"))
        });
        assert_eq!(g.mounts, vec![(a.clone(), "ro"), (b.clone(), "rw")]);
        assert_eq!(g.secrets.len(), 1);
        assert_eq!(g.kept_env, vec![("GH_TOKEN".into(), "${GH_TOKEN}".into())]);
        assert!(!g.text.contains("s3cret"), "{}", g.text);
        assert!(g.notes.iter().any(|n| n.contains("/nonexistent/x")));
        let policy = mcpbox_policy::parse(&g.text, Path::new("/p/x.toml")).unwrap();
        assert!(policy.network.is_closed());
    }
}
