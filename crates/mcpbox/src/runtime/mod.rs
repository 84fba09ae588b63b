//! Runtime discovery: what the command needs to run, found as the host
//! would find it, and mounted read-only at the same path in the sandbox.
//!
//! A server under `node_modules`, in a Python virtual environment whose
//! `python` links into `~/.pyenv`, or a script whose `#!` line names an
//! interpreter outside /usr, starts on the host and is "not found" in a
//! sandbox that shows only the system directories. Here the command is
//! resolved the host's way: the caller's PATH (a pyenv shim resolved to
//! the version it would run), each symlink of the way (every hop must be
//! visible under its own name), the `#!` line (`#!/usr/bin/env node`
//! looked up on the caller's PATH too) or the ELF loader, a virtual
//! environment's `pyvenv.cfg` (`home`, `executable`) and the `.pth` paths
//! of its site-packages, the enclosing `node_modules` tree or package
//! directory, and an interpreter's own prefix (`X` of `X/bin/python`,
//! which holds its standard library).
//!
//! For each file the narrowest sensible directory is mounted: the venv,
//! the outermost `node_modules`, the prefix, else the file's directory,
//! else the file alone. A directory that is a home (the caller's `$HOME`
//! included), holds one, sits at the top of the tree (`/opt`, `/tmp`) or
//! holds a credential location is never chosen: the next narrower one is.
//! A file that lies inside a credential location is refused outright, as
//! a policy mount would be. Nothing here widens what the policy says: the
//! mounts are read-only, a path under a policy mount's target is the
//! policy's, `process.allow_exec` is not extended (a discovered
//! interpreter it does not list is reported), and `[runtime] discover =
//! false` turns it all off. `runners.rs` handles `npx -y`, `uvx` and
//! `pipx run`.

mod runners;
mod script;

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use mcpbox_sandbox::{BindMount, Interpreter, Spec};

pub use runners::prepare as prepare_runner;
pub use script::{ran, Ran};

/// One directory or file mounted for the command, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mounted {
    pub path: PathBuf,
    pub reason: String,
}

/// What discovery did to a spec, for the report (stderr, audit).
#[derive(Debug, Default)]
pub struct Found {
    pub mounts: Vec<Mounted>,
    /// Other lines for stderr: the command found on PATH, PATH entries
    /// added, an interpreter `process.allow_exec` does not list.
    pub notes: Vec<String>,
}

impl Found {
    /// The `session_start` record's `detail.runtime`.
    pub fn audit_detail(&self) -> serde_json::Value {
        serde_json::Value::Array(
            self.mounts
                .iter()
                .map(|m| serde_json::json!({"path": m.path.display().to_string(), "reason": m.reason}))
                .collect(),
        )
    }
}

/// A refusal: a runtime file inside a credential location.
#[derive(Debug)]
pub struct Refused {
    pub path: PathBuf,
    pub kind: &'static str,
    pub why: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = self.path.display();
        write!(
            f,
            "refusing to mount {p} ({}): it is inside the credential location {}; move the \
             runtime out of it, or mount it yourself after review ([[filesystem.mounts]] \
             host = \"{p}\", at = \"{p}\", dangerously_allow_credentials = true) and set \
             [runtime] discover = false",
            self.why, self.kind
        )
    }
}

impl std::error::Error for Refused {}

/// How many files (hops, interpreters) one discovery follows at most: a
/// real command needs a handful; a loop of links or `#!` lines ends here.
const MAX_FILES: usize = 64;

/// Links followed per file (path_resolution(7) allows 40).
const MAX_LINKS: usize = 40;

/// The files that mark a package's directory: what a script's imports
/// are resolved against (node's `package.json`, Python's project files,
/// deno's and bun's configuration).
const PACKAGE_FILES: &[&str] = &[
    "package.json",
    "pyproject.toml",
    "setup.py",
    "setup.cfg",
    "deno.json",
    "deno.jsonc",
    "bunfig.toml",
];

/// Where and how to look: the caller's view and the sandbox's.
struct Look<'a> {
    /// The caller's PATH entries (absolute ones only).
    host_path: Vec<PathBuf>,
    /// The sandbox's PATH entries.
    sandbox_path: Vec<PathBuf>,
    /// The caller's home directory: never mounted, nor anything above it.
    home: Option<PathBuf>,
    /// The spec's existing mounts, by target: (sandbox path, host path).
    views: Vec<(PathBuf, PathBuf)>,
    allow_exec: Option<&'a [PathBuf]>,
    /// Candidate mounts: sandbox path (also the host path) -> reason.
    wanted: BTreeMap<PathBuf, String>,
    /// Files already followed.
    seen: Vec<PathBuf>,
    found: Found,
    /// PATH entries to put in front of the sandbox's.
    prepend: Vec<PathBuf>,
}

/// Discovers what `spec`'s command needs and adds it to `spec` (mounts,
/// argv[0] when it was found on the caller's PATH, PATH entries for `#!`
/// lines that use env). `caller_path` is the caller's PATH; `cwd` the
/// caller's working directory (for pyenv's `.python-version`).
pub fn discover(spec: &mut Spec, caller_path: &OsStr) -> Result<Found, Refused> {
    let sandbox_path = env_of(&spec.env, "PATH").unwrap_or_default();
    let mut views: Vec<(PathBuf, PathBuf)> = spec
        .mounts
        .iter()
        .map(|m| (m.at.clone(), m.host.clone()))
        .collect();
    if let Some(i) = &spec.input {
        views.push((PathBuf::from(mcpbox_sandbox::INPUT), i.clone()));
    }
    if let Some(o) = &spec.output {
        views.push((PathBuf::from(mcpbox_sandbox::OUTPUT), o.clone()));
    }
    let mut look = Look {
        host_path: split_path(caller_path),
        sandbox_path: split_path(&sandbox_path),
        home: std::env::var_os("HOME")
            .map(PathBuf::from)
            .filter(|h| h.is_absolute()),
        views,
        allow_exec: spec.allow_exec.as_deref(),
        wanted: BTreeMap::new(),
        seen: Vec::new(),
        found: Found::default(),
        prepend: Vec::new(),
    };
    let Some(argv0) = spec.argv.first().cloned() else {
        return Ok(Found::default());
    };
    let name = PathBuf::from(&argv0);
    if argv0.as_bytes().contains(&b'/') {
        // relative to the sandbox's working directory, /workspace
        let inside = if name.is_absolute() {
            name
        } else {
            Path::new(mcpbox_sandbox::WORKSPACE).join(name)
        };
        look.follow(&inside, "the command", true)?;
    } else if let Some(found) = look.on_host_path(&argv0) {
        if !look.sandbox_finds(&argv0, &found) {
            look.found.notes.push(format!(
                "running {} as {} (found on PATH)",
                argv0.to_string_lossy(),
                found.display()
            ));
            if let Some(first) = spec.argv.first_mut() {
                *first = found.clone().into_os_string();
            }
        }
        look.follow(&found, "the command", true)?;
    }
    // what an interpreter on the command line runs (`node FILE`, `python
    // -m MOD`, `uv run --directory DIR ...`): its tree, without its `#!`
    // line (the interpreter named on the command line runs it)
    for ran in script::ran(&spec.argv) {
        let word = PathBuf::from(&spec.argv[ran.index()]);
        match ran {
            Ran::File(_) if word.is_absolute() => look.follow(&word, "the script", false)?,
            Ran::Project(_) if word.is_absolute() => {
                look.need_dir(&word, "the project directory on the command line")?;
                // the project's environment (`uv sync` made it), whose
                // python links to the interpreter it was made with
                let python = word.join(".venv/bin/python");
                if python.exists() {
                    look.follow(&python, "the project's virtual environment", true)?;
                }
            }
            Ran::File(_) | Ran::Project(_) => look.found.notes.push(format!(
                "{} is a relative path: the sandbox reads it from its working directory {} \
                 (name it by its absolute path to have its tree mounted)",
                word.display(),
                mcpbox_sandbox::WORKSPACE
            )),
            // found on sys.path: the venv (followed with the interpreter)
            // or PYTHONPATH (below)
            Ran::Module(_) => {}
        }
    }
    // the module search paths the policy sets: where `python -m MOD` and
    // node's bare `require` look besides the interpreter's own
    for var in ["PYTHONPATH", "NODE_PATH"] {
        let dirs = env_of(&spec.env, var).unwrap_or_default();
        for dir in split_path(&dirs) {
            if dir.is_dir() {
                look.need_dir(&dir, &format!("a directory of {var}"))?;
            }
        }
    }
    let Look {
        wanted,
        mut found,
        prepend,
        ..
    } = look;
    // the outermost directory of each nested group is enough
    let mut kept: Vec<(PathBuf, String)> = Vec::new();
    for (path, reason) in wanted {
        if kept.iter().any(|(k, _)| path.starts_with(k)) {
            continue;
        }
        kept.push((path, reason));
    }
    // before the policy's own mounts, so that one below a discovered tree
    // is mounted over it, not under it
    let mut mounts: Vec<BindMount> = Vec::new();
    for (path, reason) in kept {
        let host = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
        mounts.push(BindMount {
            host,
            at: path.clone(),
            writable: false,
        });
        found.mounts.push(Mounted { path, reason });
    }
    mounts.append(&mut spec.mounts);
    spec.mounts = mounts;
    if !prepend.is_empty() {
        let mut dirs: Vec<OsString> = prepend.into_iter().map(PathBuf::into_os_string).collect();
        dirs.push(sandbox_path);
        let joined = dirs.join(OsStr::new(":"));
        found.notes.push(format!(
            "the sandbox's PATH is {}",
            joined.to_string_lossy()
        ));
        spec.env.retain(|(k, _)| k != "PATH");
        spec.env.push(("PATH".into(), joined));
    }
    Ok(found)
}

/// What [`prepare`] did to a spec, for its caller to report.
#[derive(Debug)]
pub struct Prepared {
    /// One line each for the user (`mcpbox: runtime: LINE` on stderr):
    /// the runner's cache, the notes, each mount and why.
    pub lines: Vec<String>,
    /// The `session_start` record's `detail.runtime`; null when discovery
    /// is off.
    pub audit: serde_json::Value,
}

/// The one runtime preparation of every command that starts a server from
/// its command line: `exec`, `run` and `learn` (main.rs), `serve` (once per
/// server, serve.rs), and `wrap`'s report of what a wrapped entry will get
/// (policygen.rs). A package runner's registry is checked (always: it
/// mounts nothing); with `discover`, the runner gets its cache and the
/// command what it needs, mounted read-only. `asks`: an unlisted registry
/// can be put to a human (`run`, `learn`, `serve`). `cache`: a runner may
/// get its writable cache (not under `serve`, where one cache would be
/// written by every client's sandbox). `caller_path` is the PATH the
/// command would be looked up on by the host (mcpbox's own).
pub fn prepare(
    policy: &mcpbox_policy::Policy,
    spec: &mut Spec,
    asks: bool,
    discover: bool,
    cache: bool,
    caller_path: &OsStr,
) -> anyhow::Result<Prepared> {
    let state = crate::state::state_dir();
    let runner = prepare_runner(spec, policy, &state, asks, discover && cache)?;
    let mut lines = Vec::new();
    if !discover {
        return Ok(Prepared {
            lines,
            audit: serde_json::Value::Null,
        });
    }
    if let Some((r, Some(dir))) = &runner {
        lines.push(format!(
            "mounted {} read-write ({}'s cache for this server)",
            dir.display(),
            r.tool
        ));
    }
    let found = self::discover(spec, caller_path)?;
    lines.extend(found.notes.iter().cloned());
    for m in &found.mounts {
        lines.push(format!(
            "mounted {} read-only ({})",
            m.path.display(),
            m.reason
        ));
    }
    Ok(Prepared {
        lines,
        audit: found.audit_detail(),
    })
}

fn env_of(env: &[(OsString, OsString)], key: &str) -> Option<OsString> {
    env.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
}

fn split_path(path: &OsStr) -> Vec<PathBuf> {
    path.as_bytes()
        .split(|b| *b == b':')
        .map(|d| PathBuf::from(OsStr::from_bytes(d)))
        .filter(|d| d.is_absolute())
        .collect()
}

fn is_executable_file(p: &Path) -> bool {
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// `path` (absolute) free of `.` and `..`, lexically, as the sandbox's
/// root sees it.
fn normalize(path: &Path) -> PathBuf {
    mcpbox_sandbox::normalize(path).unwrap_or_else(|| path.to_path_buf())
}

/// Directories never mounted by discovery, whatever they hold: the root
/// and the top of the tree (`/opt`, `/tmp`), home directories and what
/// holds them, the caller's `$HOME` and its ancestors, and mcpbox's own
/// state (`state::private_locations`).
fn too_broad(dir: &Path, home: Option<&Path>) -> bool {
    let depth = dir
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .count();
    depth < 2
        || home.is_some_and(|h| h.starts_with(dir))
        || matches!(
            dir.components().nth(1),
            Some(Component::Normal(n)) if n == "home" || n == "Users"
        ) && depth < 3
        || mcpbox_policy::credential_kind(dir).is_some()
        // mcpbox's own state is never a sandbox's, found or not (a
        // runner's cache in it is mounted by `runners.rs`, not found here)
        || crate::state::touches_private(
            &crate::state::resolve(dir),
            &crate::state::private_locations(std::iter::empty()),
        )
        .is_some()
}

impl Look<'_> {
    /// The first executable `name` on the caller's PATH, a pyenv shim
    /// replaced by what it would run.
    fn on_host_path(&self, name: &OsStr) -> Option<PathBuf> {
        for dir in &self.host_path {
            let cand = dir.join(name);
            if !is_executable_file(&cand) {
                continue;
            }
            match pyenv_shim(dir, name) {
                None => return Some(cand),
                Some(Some(real)) => return Some(real),
                // "system": pyenv goes on down the PATH
                Some(None) => continue,
            }
        }
        None
    }

    /// Whether the sandbox's own PATH search finds `found` for `name`.
    fn sandbox_finds(&self, name: &OsStr, found: &Path) -> bool {
        self.sandbox_path
            .iter()
            .map(|d| d.join(name))
            .find(|c| self.visible(c) && c.exists())
            .is_some_and(|c| c == found)
    }

    /// Whether `path` (inside) is already there: under a system directory,
    /// or under one of the spec's mounts (the policy's: never mounted over).
    fn visible(&self, path: &Path) -> bool {
        mcpbox_sandbox::plan::SYSTEM_DIRS
            .iter()
            .any(|d| path.starts_with(d))
            || path.starts_with("/etc")
            || self.views.iter().any(|(at, _)| path.starts_with(at))
    }

    /// The host path showing sandbox path `inside` through a spec mount.
    fn through_view(&self, inside: &Path) -> Option<PathBuf> {
        self.views
            .iter()
            .filter(|(at, _)| inside.starts_with(at))
            .max_by_key(|(at, _)| at.as_os_str().len())
            .map(|(at, host)| host.join(inside.strip_prefix(at).unwrap_or(Path::new(""))))
    }

    /// Follows the program file `file` (a path the sandbox will use): its
    /// links, its directory and, with `interpreter`, what runs it. A hop
    /// under a policy mount (or the workspace) is shown already: its link
    /// is read through the mount's host path but resolved in the sandbox's
    /// tree, where the kernel will resolve it, so a venv the policy mounts
    /// whose `python` links out of it still gets its interpreter mounted.
    fn follow(&mut self, file: &Path, what: &str, interpreter: bool) -> Result<(), Refused> {
        let file = normalize(file);
        if self.seen.contains(&file) || self.seen.len() >= MAX_FILES {
            return Ok(());
        }
        self.seen.push(file.clone());
        let mut hop = file.clone();
        for _ in 0..MAX_LINKS {
            let shown = self.through_view(&hop);
            let host = match &shown {
                Some(h) => h.clone(),
                // the sandbox's own tmp: nothing of the host
                None if hop.starts_with(mcpbox_sandbox::WORKSPACE) => return Ok(()),
                None => hop.clone(),
            };
            if std::fs::symlink_metadata(&host).is_err() {
                return Ok(());
            }
            let target = std::fs::read_link(&host).ok();
            if shown.is_none() {
                self.need(&hop, what, target.is_some())?;
            }
            let Some(target) = target else {
                break;
            };
            // relative to the link's directory as the kernel sees it: the
            // host's own path resolved, a view's path as the sandbox has it
            let parent = hop.parent().unwrap_or(Path::new("/")).to_path_buf();
            let base = if shown.is_none() {
                std::fs::canonicalize(&parent).unwrap_or(parent)
            } else {
                parent
            };
            hop = normalize(&base.join(target));
        }
        if !interpreter {
            return Ok(());
        }
        let host = self.through_view(&hop).unwrap_or_else(|| hop.clone());
        let real = std::fs::canonicalize(&host).unwrap_or(host);
        self.interpreter_of(&real, &file)
    }

    /// Follows what runs `host` (the program `inside` names): a `#!` line
    /// or an ELF loader.
    fn interpreter_of(&mut self, host: &Path, inside: &Path) -> Result<(), Refused> {
        let shown = inside.display().to_string();
        match mcpbox_sandbox::interpreter(host) {
            Some(Interpreter::Script { path, args })
                if path.file_name() == Some(OsStr::new("env")) =>
            {
                // `env [-S] [-i] [NAME=V] prog`: the first word that is
                // neither an option nor an assignment
                let Some(prog) = args
                    .iter()
                    .find(|a| !a.as_bytes().starts_with(b"-") && !a.as_bytes().contains(&b'='))
                else {
                    return Ok(());
                };
                let Some(found) = self.on_host_path(prog) else {
                    return Ok(());
                };
                if !self.sandbox_finds(prog, &found) {
                    if let Some(dir) = found.parent() {
                        if !self.prepend.iter().any(|d| d == dir) {
                            self.prepend.push(dir.to_path_buf());
                        }
                    }
                }
                self.check_exec(&found);
                self.follow(&found, &format!("the interpreter of {shown}"), true)
            }
            Some(Interpreter::Script { path, .. }) => {
                self.check_exec(&path);
                self.follow(&path, &format!("the interpreter of {shown}"), true)
            }
            Some(Interpreter::Loader(path)) => {
                self.follow(&path, &format!("the ELF loader of {shown}"), true)
            }
            None => Ok(()),
        }
    }

    /// An interpreter discovery found that `process.allow_exec` does not
    /// list: reported, never added (the list is the policy's).
    fn check_exec(&mut self, program: &Path) {
        if let Some(list) = self.allow_exec {
            if !list.iter().any(|p| p == program) {
                self.found.notes.push(format!(
                    "{} is needed to run the command but process.allow_exec does not list it",
                    program.display()
                ));
            }
        }
    }

    /// Makes `file` (a path the sandbox will use) visible: chooses the
    /// directory to mount for it, and follows a venv's base interpreter.
    fn need(&mut self, file: &Path, what: &str, link: bool) -> Result<(), Refused> {
        if self.visible(file) || file.starts_with(mcpbox_sandbox::WORKSPACE) {
            return Ok(());
        }
        for bad in ["/proc", "/dev", "/sys"] {
            if file.starts_with(bad) {
                return Ok(());
            }
        }
        let real = std::fs::canonicalize(file).unwrap_or_else(|_| file.to_path_buf());
        for p in [file, real.as_path()] {
            if let Some(kind) = credential_inside(p) {
                return Err(Refused {
                    path: p.to_path_buf(),
                    kind,
                    why: what.to_string(),
                });
            }
        }
        let name = file.display().to_string();
        let home = self.home.clone();
        let ok = |d: &Path| {
            !too_broad(d, home.as_deref())
                && crate::preflight::find_credentials_below(d).is_none()
                && mcpbox_policy::credential_kind(
                    &std::fs::canonicalize(d).unwrap_or(d.to_path_buf()),
                )
                .is_none()
        };
        // the broadest sensible candidate that is acceptable; one passed
        // over for being a home, the top of the tree or a credential
        // location is said, with what was mounted instead
        let mut passed: Vec<(PathBuf, String)> = Vec::new();
        let mut chosen = None;
        for (d, r) in self.candidates(file, link) {
            if ok(&d) {
                chosen = Some((d, r));
                break;
            }
            passed.push((d, r));
        }
        let (dir, reason) =
            chosen.unwrap_or_else(|| (file.to_path_buf(), format!("{what} {name}")));
        for (d, r) in passed {
            let note = format!(
                "{} ({r}) is not mounted whole: it is, holds or is above a home directory, \
                 is at the top of the tree, or is or holds a credential location; {} is \
                 mounted instead",
                d.display(),
                dir.display()
            );
            if !self.found.notes.contains(&note) {
                self.found.notes.push(note);
            }
        }
        if dir.is_dir() && dir.join("pyvenv.cfg").is_file() && !self.wanted.contains_key(&dir) {
            self.wanted.insert(dir.clone(), reason);
            self.venv(&dir)?;
        } else {
            self.wanted.entry(dir).or_insert(reason);
        }
        Ok(())
    }

    /// The directories that could be mounted for `file`, from broadest to
    /// narrowest sensible: its venv, its outermost node_modules, its
    /// package directory (`package.json`, `pyproject.toml`, ...), its
    /// interpreter prefix, its directory. A `link` (a hop on the way, such
    /// as `~/.local/bin/tool` or an npm prefix's `bin/pkg`) is no
    /// interpreter: its prefix is not offered (it would show every other
    /// install beside it); its directory is, since a link cannot be
    /// mounted as a link alone.
    fn candidates(&self, file: &Path, link: bool) -> Vec<(PathBuf, String)> {
        let name = file.display();
        let ancestors: Vec<&Path> = file.ancestors().skip(1).collect();
        let mut cands: Vec<(PathBuf, String)> = Vec::new();
        if let Some(v) = ancestors.iter().find(|a| a.join("pyvenv.cfg").is_file()) {
            cands.push((
                v.to_path_buf(),
                format!("the virtual environment of {name}"),
            ));
        }
        if let Some(n) = ancestors
            .iter()
            .rev()
            .find(|a| a.file_name() == Some(OsStr::new("node_modules")))
        {
            cands.push((n.to_path_buf(), format!("the node_modules tree of {name}")));
        }
        if let Some(p) = ancestors
            .iter()
            .take(6)
            .find(|a| PACKAGE_FILES.iter().any(|f| a.join(f).is_file()))
        {
            cands.push((p.to_path_buf(), format!("the package directory of {name}")));
        }
        let Some(dir) = file.parent() else {
            return cands;
        };
        if !link
            && matches!(
                dir.file_name().and_then(OsStr::to_str),
                Some("bin" | "sbin")
            )
        {
            if let Some(prefix) = dir.parent().filter(|p| p.join("lib").is_dir()) {
                cands.push((prefix.to_path_buf(), format!("the prefix of {name}")));
            }
        }
        cands.push((dir.to_path_buf(), format!("the directory of {name}")));
        cands
    }

    /// A virtual environment: its base interpreter (`pyvenv.cfg`'s `home`
    /// and `executable`) and the directories its `.pth` files add.
    fn venv(&mut self, dir: &Path) -> Result<(), Refused> {
        let cfg = std::fs::read_to_string(dir.join("pyvenv.cfg")).unwrap_or_default();
        let shown = dir.display().to_string();
        for line in cfg.lines() {
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            let value = Path::new(value.trim());
            if !value.is_absolute() {
                continue;
            }
            match key.trim() {
                "home" => {
                    // the base interpreter's bin: its prefix holds the stdlib
                    for exe in ["python3", "python"] {
                        if value.join(exe).exists() {
                            self.follow(
                                &value.join(exe),
                                &format!("the base interpreter of {shown}"),
                                true,
                            )?;
                            break;
                        }
                    }
                }
                "executable" => {
                    self.follow(value, &format!("the base interpreter of {shown}"), true)?
                }
                _ => {}
            }
        }
        // editable installs and path hooks: absolute directories in .pth
        let lib = dir.join("lib");
        let Ok(pythons) = std::fs::read_dir(&lib) else {
            return Ok(());
        };
        for py in pythons.flatten() {
            let site = py.path().join("site-packages");
            let Ok(entries) = std::fs::read_dir(&site) else {
                continue;
            };
            for e in entries.flatten() {
                let p = e.path();
                if p.extension() != Some(OsStr::new("pth")) {
                    continue;
                }
                let text = std::fs::read_to_string(&p).unwrap_or_default();
                for l in text.lines().map(str::trim) {
                    let added = Path::new(l);
                    if added.is_absolute() && added.is_dir() {
                        self.need_dir(added, &format!("a path of {}", p.display()))?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Makes the directory `dir` visible as it is (a `.pth` entry).
    fn need_dir(&mut self, dir: &Path, why: &str) -> Result<(), Refused> {
        let dir = normalize(dir);
        if self.visible(&dir) {
            return Ok(());
        }
        if let Some(kind) = credential_inside(&dir) {
            return Err(Refused {
                path: dir,
                kind,
                why: why.to_string(),
            });
        }
        if !too_broad(&dir, self.home.as_deref())
            && crate::preflight::find_credentials_below(&dir).is_none()
        {
            self.wanted.entry(dir).or_insert_with(|| why.to_string());
        } else {
            self.found.notes.push(format!(
                "{} ({why}) is not mounted: it is or holds a home directory or a credential \
                 location; mount a narrower directory in the policy",
                dir.display()
            ));
        }
        Ok(())
    }
}

/// The credential location `path` lies in (not merely contains).
fn credential_inside(path: &Path) -> Option<&'static str> {
    crate::preflight::names_credential_location(path)
}

/// For a pyenv shim `dir/name`: None when it is no shim; Some(None) for
/// the "system" version (pyenv goes on down the PATH); Some(Some(path))
/// for `$PYENV_ROOT/versions/V/bin/name`. The version comes as pyenv
/// takes it: PYENV_VERSION, a `.python-version` in the working directory
/// or above, `$PYENV_ROOT/version`.
fn pyenv_shim(dir: &Path, name: &OsStr) -> Option<Option<PathBuf>> {
    if dir.file_name() != Some(OsStr::new("shims")) {
        return None;
    }
    let head = std::fs::read(dir.join(name)).ok()?;
    if !head.starts_with(b"#!") || !head.windows(5).any(|w| w == b"pyenv") {
        return None;
    }
    let root = dir.parent()?;
    let from_file = |f: PathBuf| {
        std::fs::read_to_string(f)
            .ok()
            .and_then(|t| t.split_whitespace().next().map(str::to_string))
    };
    let version = std::env::var("PYENV_VERSION")
        .ok()
        .and_then(|v| v.split(':').next().map(str::to_string))
        .filter(|v| !v.is_empty())
        .or_else(|| {
            let cwd = std::env::current_dir().ok()?;
            cwd.ancestors()
                .find_map(|d| from_file(d.join(".python-version")))
        })
        .or_else(|| from_file(root.join("version")))?;
    if version == "system" {
        return Some(None);
    }
    let real = root.join("versions").join(version).join("bin").join(name);
    Some(is_executable_file(&real).then_some(real))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
