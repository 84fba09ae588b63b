//! The generator of `mcpbox learn`, beside the policy it generates (the
//! binary keeps the command line and the I/O: reading the audit records,
//! writing the file): what one observed session did, in; a
//! least-privilege policy as TOML text, with a comment per rule saying
//! what was seen, out. Pure: no I/O, no clock (the caller reads the audit
//! records into [`Observed`] and writes the text).
//!
//! What it never proposes, whatever the records say (a hostile server
//! chooses the names it touches and the hosts it asks for): a path outside
//! the mounts the base policy declared (the records are the kernel's word
//! on the sandbox's own mounts, so such a path is a forged or foreign
//! record), a credential location, a host pattern that is not one exact
//! name or address, more than [`MAX_HOSTS`] hosts or [`MAX_TOOLS`] tools.
//! Each of those is a comment instead.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

use crate::{MountMode, Policy, Verdict};

use crate::toml_text::{toml_key as key, toml_str as string};

/// At most this many hosts are proposed; the rest are a comment.
pub const MAX_HOSTS: usize = 32;
/// At most this many tool rules are proposed; the rest are a comment.
pub const MAX_TOOLS: usize = 256;
/// Paths named in one comment, at most.
const NAMED: usize = 3;
/// A name from the records is cut to this many characters in a comment.
const SHOWN: usize = 120;

/// Keys of `[tools]` that are settings, not patterns.
const TOOL_SETTINGS: &[&str] = &[
    "default",
    "show_denied",
    "destructive",
    "outside_paths",
    "arguments",
];

/// Sections of the base policy copied as they are (limits, environment,
/// commands, output, artifacts, audit): learning observes none of them.
const COPIED: &[&str] = &[
    "env",
    "sandbox",
    "commands",
    "jobs",
    "output",
    "artifacts",
    "audit",
    "upstream",
];

/// One session, as the audit records told it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observed {
    /// The server's command line, for the header.
    pub command: String,
    /// The program it started (the command's first word): the directory
    /// holding it is kept, though its execution precedes every call.
    pub program: Option<String>,
    /// How files were watched (`session_start`'s `files`: `kernel`,
    /// `kernel-dirs`, `times`), `None` when unknown.
    pub files_mode: Option<String>,
    /// The tool calls, in order.
    pub calls: Vec<Call>,
    /// The egress connections, in order.
    pub connections: Vec<Connection>,
    /// The tool names of the pinned tool list, when one was pinned.
    pub listed: Option<Vec<String>>,
    /// Where those pins are kept.
    pub pin_file: Option<String>,
    /// The server's exit statuses.
    pub exits: Vec<i32>,
    /// The programs executed, `None` when not watched at all.
    pub programs: Option<Programs>,
}

/// The programs the session's sandboxes executed (the kernel's
/// `FAN_OPEN_EXEC`), for `process.allow_exec`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Programs {
    /// `mounts` (as root: everything executed from the read-only mounts)
    /// or `dirs` (rootless: only what is directly in [`Programs::dirs`]).
    pub mode: Option<String>,
    /// Why the watch could not be placed, when it could not.
    pub refused: Option<String>,
    /// Each program (sandbox path) and the Unix time in ms it was first seen.
    pub seen: Vec<(String, i64)>,
    /// The list is incomplete (a bound, the kernel's queue).
    pub cut: bool,
    /// The server's own program and its interpreter, as the sandbox
    /// resolves them (they start before the watch is placed); empty when
    /// they could not be resolved.
    pub own: Vec<String>,
    /// The directories a rootless watch marks.
    pub dirs: Vec<String>,
    /// The sandbox's read-only mounts below the tree's writable places
    /// (a runtime under the host's `/tmp`, shown at the same path inside
    /// the sandbox's writable `/tmp`): a program there is on the read-only
    /// mount, which the innermost mount decides, not the path's prefix.
    pub read_only: Vec<String>,
}

/// One `tools/call` record.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Call {
    pub tool: String,
    /// The relay let it through (`allow`).
    pub allowed: bool,
    pub files: Vec<FileSeen>,
    /// The list of files is incomplete (`files_truncated`).
    pub truncated: bool,
    /// (start, end) in Unix ms: the record's time less its duration, and
    /// its time.
    pub span: Option<(i64, i64)>,
}

/// One entry of a call's `detail.files`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileSeen {
    /// The sandbox's path.
    pub path: String,
    pub read: bool,
    /// Written, created by a rename, or removed.
    pub written: bool,
}

/// One `network` record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Connection {
    pub host: String,
    pub port: u16,
    /// The proxy connected it (decision allow and an address).
    pub connected: bool,
    /// Why it was refused, when it was.
    pub refused: Option<String>,
    /// The tools of the calls in flight when it opened.
    pub tools: Vec<String>,
}

/// What was seen under one directory of the sandbox.
#[derive(Default)]
struct Use {
    read: BTreeSet<String>,
    written: BTreeSet<String>,
    tools: BTreeSet<String>,
    truncated: bool,
}

impl Use {
    fn seen(&self) -> bool {
        !self.read.is_empty() || !self.written.is_empty()
    }

    /// "read 3 files, wrote 1 file under here during tools/call a, b
    /// (first: /workspace/input/x)".
    fn describe(&self) -> String {
        let mut parts = Vec::new();
        if !self.read.is_empty() {
            parts.push(format!("read {}", count(self.read.len(), "file")));
        }
        if !self.written.is_empty() {
            parts.push(format!("wrote {}", count(self.written.len(), "file")));
        }
        let first: Vec<String> = self
            .written
            .iter()
            .chain(self.read.iter())
            .take(NAMED)
            .map(|p| shown(p))
            .collect();
        let mut s = format!(
            "{} under here during tools/call {} (first: {})",
            parts.join(", "),
            list(&self.tools),
            first.join(", ")
        );
        if self.truncated {
            s.push_str("; the kernel's list was cut short, so there were more");
        }
        s
    }
}

fn count(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// A name from the records made safe for a one-line comment.
fn shown(s: &str) -> String {
    let e: String = s.escape_debug().collect();
    if e.chars().count() > SHOWN {
        let cut: String = e.chars().take(SHOWN).collect();
        format!("{cut}...")
    } else {
        e
    }
}

fn list(items: &BTreeSet<String>) -> String {
    let mut out: Vec<String> = items.iter().take(8).map(|t| shown(t)).collect();
    if items.len() > 8 {
        out.push(format!("and {} more", items.len() - 8));
    }
    out.join(", ")
}

/// The sandbox directory a path is under: input, output, or a mount.
fn under<'a>(path: &str, dirs: &'a [String]) -> Option<&'a str> {
    dirs.iter()
        .filter(|d| {
            path.strip_prefix(d.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
        })
        .max_by_key(|d| d.len())
        .map(String::as_str)
}

/// Whether `path` names a credential location (or has `..` in it, which
/// the kernel never reports).
fn suspicious(path: &str) -> bool {
    crate::credential_kind(Path::new(path)).is_some() || path.split('/').any(|c| c == "..")
}

/// Whether a host from the records may be proposed as a rule: one exact
/// name or address (no wildcard, no CIDR) that the policy syntax accepts.
fn exact_host(host: &str, port: u16) -> Option<String> {
    if host.is_empty() || host.contains(['*', '/']) || port == 0 {
        return None;
    }
    let rule = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    crate::HostRule::parse(&rule).ok().map(|_| rule)
}

/// Writes the proposed policy for `base` (effective, paths absolute) as
/// observed in `seen`, named `name`. The text passes `mcpbox check`.
pub fn propose(base: &Policy, name: &str, seen: &Observed) -> Result<String, String> {
    let base_table: toml::Table =
        toml::from_str(&base.to_toml()).map_err(|e| format!("reading the base policy: {e}"))?;
    let mut out = String::new();
    header(&mut out, name, seen);
    filesystem(&mut out, base, seen)?;
    network(&mut out, base, &base_table, seen);
    secrets(&mut out, &base_table);
    tools(&mut out, &base_table, seen);
    let defaults: toml::Table = toml::from_str(&crate::default_policy().to_toml())
        .map_err(|e| format!("reading the default policy: {e}"))?;
    let mut unchanged = Vec::new();
    if !process(&mut out, base, &base_table, &defaults, seen)? {
        unchanged.push("process");
    }
    for section in COPIED {
        if let Some(v) = base_table.get(*section) {
            // a section the base leaves at its defaults says nothing: the
            // proposal leaves it out too, and so gets the same defaults
            if defaults.get(*section) == Some(v) {
                unchanged.push(*section);
                continue;
            }
            let mut one = toml::Table::new();
            one.insert((*section).to_string(), v.clone());
            let text = toml::to_string(&one).map_err(|e| format!("writing [{section}]: {e}"))?;
            if text.trim().is_empty() {
                continue;
            }
            let _ = writeln!(
                out,
                "\n# [{section}]: as in the base policy (learning does not observe it)"
            );
            out.push_str(&text);
        }
    }
    if !unchanged.is_empty() {
        let _ = writeln!(
            out,
            "\n# [{}]: left at their defaults, as in the base policy",
            unchanged.join("], [")
        );
    }
    if !base.tests.is_empty() {
        let _ = writeln!(
            out,
            "\n# not copied: the base policy's {} [[tests]] (they were written for its [tools])",
            base.tests.len()
        );
    }
    Ok(out)
}

fn header(out: &mut String, name: &str, seen: &Observed) {
    let _ = writeln!(
        out,
        "# Proposed by `mcpbox learn` from one observed session of:"
    );
    let _ = writeln!(out, "#   {}", shown(&seen.command));
    let _ = writeln!(
        out,
        "# It grants what that session used and nothing else: review it, then run the server"
    );
    let _ = writeln!(out, "# with `mcpbox run --policy THIS_FILE -- COMMAND`.");
    let mode = match seen.files_mode.as_deref() {
        Some("kernel") => "files: the kernel's fanotify mount marks on the sandbox's own mounts",
        Some("kernel-dirs") => "files: the kernel's fanotify marks on every workspace directory",
        Some(_) => {
            "files: not watched by the kernel here (mtime walk only); mounts kept from the base"
        }
        None => "files: no session record; mounts kept from the base",
    };
    let _ = writeln!(
        out,
        "# Observed: {mode}; hosts: the egress proxy's records;"
    );
    let _ = writeln!(
        out,
        "# tools: the pinned tool list; programs: {}.",
        match seen.programs.as_ref().and_then(|p| p.mode.as_deref()) {
            Some("mounts") => "the kernel's FAN_OPEN_EXEC on the sandbox's read-only mounts",
            Some("dirs") => "the kernel's FAN_OPEN_EXEC on the PATH and mount directories",
            _ => "not watched",
        }
    );
    let _ = writeln!(
        out,
        "# Not observed: environment reads, read-only mounts' files, and what the server did"
    );
    let _ = writeln!(out, "# before its first call.");
    let calls = seen.calls.len();
    let _ = write!(out, "# Seen: {}", count(calls, "tool call"));
    let _ = write!(out, ", {}", count(seen.connections.len(), "connection"));
    if !seen.exits.is_empty() {
        let codes: Vec<String> = seen.exits.iter().map(i32::to_string).collect();
        let _ = write!(out, ", server exit status {}", codes.join(", "));
    }
    let _ = writeln!(out, ".\n\n[server]\nname = {}", string(name));
}

fn filesystem(out: &mut String, base: &Policy, seen: &Observed) -> Result<(), String> {
    let fs = &base.filesystem;
    let watched = matches!(seen.files_mode.as_deref(), Some("kernel" | "kernel-dirs"));
    let mut dirs = vec![
        "/workspace/input".to_string(),
        "/workspace/output".to_string(),
    ];
    for m in &fs.mounts {
        dirs.push(path_text(&m.at)?);
    }
    let mut uses: BTreeMap<String, Use> = BTreeMap::new();
    let mut refused: BTreeSet<String> = BTreeSet::new();
    for call in &seen.calls {
        for f in &call.files {
            if suspicious(&f.path) {
                refused.insert(f.path.clone());
                continue;
            }
            let Some(dir) = under(&f.path, &dirs) else {
                refused.insert(f.path.clone());
                continue;
            };
            let u = uses.entry(dir.to_string()).or_default();
            if f.read {
                u.read.insert(f.path.clone());
            }
            if f.written {
                u.written.insert(f.path.clone());
            }
            if f.read || f.written {
                u.tools.insert(call.tool.clone());
            }
            u.truncated |= call.truncated;
        }
    }
    let program = seen.program.as_deref().filter(|p| !suspicious(p));
    let program_dir = program.and_then(|p| under(p, &dirs));
    let program_note = |at: &str| {
        (program_dir == Some(at)).then(|| {
            format!(
                "the server's program is here ({}): kept, though it runs before any call",
                shown(program.unwrap_or_default())
            )
        })
    };
    let none = Use::default();
    let _ = writeln!(out, "\n[filesystem]");
    let _ = writeln!(out, "tmp = {}", string(&crate::format_size(fs.tmp)));
    let mut dropped = Vec::new();
    for (key, at, host) in [
        ("input", "/workspace/input", fs.input.as_ref()),
        ("output", "/workspace/output", fs.output.as_ref()),
    ] {
        let Some(host) = host else { continue };
        let host = path_text(host)?;
        let u = uses.get(at).unwrap_or(&none);
        if !watched {
            let _ = writeln!(
                out,
                "# kept from the base: files were not watched by the kernel in this session"
            );
        } else if let (false, Some(note)) = (u.seen(), program_note(at)) {
            let _ = writeln!(out, "# {note}");
        } else if !u.seen() {
            dropped.push(format!(
                "{key} = {} (no file under {at} was touched during a call)",
                string(&host)
            ));
            continue;
        } else if key == "output" && u.written.is_empty() {
            let _ = writeln!(
                out,
                "# only reads were seen here, and /workspace/output cannot be mounted read-only: \
                 if the server only reads it, give this directory as `input` instead"
            );
            let _ = writeln!(out, "# {}", u.describe());
        } else {
            let _ = writeln!(out, "# {}", u.describe());
        }
        let _ = writeln!(out, "{key} = {}", string(&host));
    }
    for d in &dropped {
        let _ = writeln!(out, "# not proposed: {d}");
    }
    for m in &fs.mounts {
        let at = path_text(&m.at)?;
        let host = path_text(&m.host)?;
        let u = uses.get(&at).unwrap_or(&none);
        let (mode, why) = match m.mode {
            // the kernel watches only writable mounts: a read-only one
            // (mostly the server's runtime) is kept as it was
            MountMode::Ro => (
                "ro",
                "kept from the base: read-only mounts are not watched (mostly the server's \
                 runtime), so whether it was used is not known"
                    .to_string(),
            ),
            MountMode::Rw if !watched => (
                "rw",
                "kept from the base: files were not watched by the kernel in this session".into(),
            ),
            MountMode::Rw if !u.written.is_empty() => ("rw", u.describe()),
            MountMode::Rw if u.seen() => ("ro", format!("{} (no write: read-only)", u.describe())),
            MountMode::Rw if program_dir == Some(at.as_str()) => (
                "ro",
                format!(
                    "{} (no write: read-only)",
                    program_note(&at).unwrap_or_default()
                ),
            ),
            MountMode::Rw => {
                let _ = writeln!(
                    out,
                    "# not proposed: the writable mount {} at {} (nothing under it was touched \
                     during a call)",
                    string(&host),
                    string(&at)
                );
                continue;
            }
        };
        let _ = writeln!(out, "\n# {why}");
        let _ = writeln!(out, "[[filesystem.mounts]]");
        let _ = writeln!(out, "host = {}", string(&host));
        let _ = writeln!(out, "at = {}", string(&at));
        let _ = writeln!(out, "mode = {}", string(mode));
        if m.dangerously_allow_credentials {
            let _ = writeln!(
                out,
                "# the base overrode the credential refusal for this mount: kept, review it"
            );
            let _ = writeln!(out, "dangerously_allow_credentials = true");
        }
    }
    if !refused.is_empty() {
        let first: Vec<String> = refused.iter().take(NAMED).map(|p| shown(p)).collect();
        let _ = writeln!(
            out,
            "# not proposed: {} outside the base's mounts or at a credential location \
             (first: {}); never granted by learning",
            count(refused.len(), "path"),
            first.join(", ")
        );
    }
    Ok(())
}

/// Writes `[process]`: BASE's limits, and `allow_exec` from the programs
/// seen when the observation is whole, else BASE's with why. False when
/// nothing was written (BASE's section at its defaults, nothing learned).
fn process(
    out: &mut String,
    base: &Policy,
    base_table: &toml::Table,
    defaults: &toml::Table,
    seen: &Observed,
) -> Result<bool, String> {
    let strip = |t: Option<&toml::Value>| {
        let mut t = t.and_then(|v| v.as_table()).cloned().unwrap_or_default();
        t.remove("allow_exec");
        t
    };
    let rest = strip(base_table.get("process"));
    let (proposed, notes) = allow_exec(base, seen);
    let kept = base.process.allow_exec.as_ref();
    if proposed.is_none() && kept.is_none() && rest == strip(defaults.get("process")) {
        // nothing to say but why nothing was learned
        for n in &notes {
            let _ = writeln!(out, "\n# [process] allow_exec: {n}");
        }
        return Ok(false);
    }
    let _ = writeln!(out, "\n[process]");
    let mut one = toml::Table::new();
    one.insert("process".into(), toml::Value::Table(rest.clone()));
    if !rest.is_empty() {
        let text = toml::to_string(&one).map_err(|e| format!("writing [process]: {e}"))?;
        let _ = writeln!(
            out,
            "# limits as in the base policy (learning does not observe them)"
        );
        out.push_str(text.trim_start_matches("[process]\n"));
    }
    for n in &notes {
        let _ = writeln!(out, "# {n}");
    }
    match (proposed, kept) {
        (Some(entries), _) => {
            let _ = writeln!(out, "allow_exec = [");
            for (path, why) in entries {
                let _ = writeln!(out, "  # {why}\n  {},", string(&path));
            }
            let _ = writeln!(out, "]");
        }
        (None, Some(list)) => {
            let _ = writeln!(out, "# as in the base policy");
            let items: Result<Vec<String>, String> = list
                .iter()
                .map(|p| path_text(p).map(|t| string(&t)))
                .collect();
            let _ = writeln!(out, "allow_exec = [{}]", items?.join(", "));
        }
        (None, None) => {
            let _ = writeln!(
                out,
                "# allow_exec left out, as in the base policy: any program the sandbox can see may run"
            );
        }
    }
    Ok(true)
}

/// The `allow_exec` entries (path, comment) when the programs were seen
/// whole, and the notes to write (why not, what was left out).
#[allow(clippy::type_complexity)]
fn allow_exec(base: &Policy, seen: &Observed) -> (Option<Vec<(String, String)>>, Vec<String>) {
    let mut notes = Vec::new();
    let Some(p) = &seen.programs else {
        notes.push("programs started were not observed: kept from the base".into());
        return (None, notes);
    };
    if let Some(why) = &p.refused {
        notes.push(format!(
            "programs started were not observed ({}): kept from the base",
            shown(why)
        ));
        return (None, notes);
    }
    if p.cut {
        notes.push(
            "programs started were not observed whole (the list was cut short, or directories \
             were past the watch's bound): kept from the base"
                .into(),
        );
        return (None, notes);
    }
    if p.own.is_empty() {
        notes.push(
            "the server's program could not be resolved as the sandbox sees it: kept from the base"
                .into(),
        );
        return (None, notes);
    }
    if p.mode.as_deref() != Some("mounts") {
        // rootless: only programs directly in the marked directories are
        // seen; one of the server's own elsewhere says the list is partial
        let outside: Vec<&String> = p
            .own
            .iter()
            .filter(|o| {
                let dir = Path::new(o.as_str()).parent().and_then(Path::to_str);
                !dir.is_some_and(|d| p.dirs.iter().any(|w| w == d))
            })
            .collect();
        if let Some(o) = outside.first() {
            notes.push(format!(
                "not observed: rootless, and a program outside the watched directories ({}): \
                 kept from the base",
                shown(o)
            ));
            return (None, notes);
        }
        notes.push(
            "rootless: only programs directly in the PATH and mount directories were seen (any \
             process's of this user)"
                .into(),
        );
    }
    let mut writable = vec![
        "/workspace/output".to_string(),
        "/workspace/tmp".into(),
        "/tmp".into(),
        "/dev/shm".into(),
    ];
    for m in base
        .filesystem
        .mounts
        .iter()
        .filter(|m| m.mode == MountMode::Rw)
    {
        if let Some(t) = m.at.to_str() {
            writable.push(t.to_string());
        }
    }
    let mut entries: Vec<(String, String)> = Vec::new();
    let mut refused: BTreeSet<String> = BTreeSet::new();
    let mut add = |path: &str, why: String, entries: &mut Vec<(String, String)>| {
        if entries.iter().any(|(e, _)| e == path) {
            return;
        }
        if !path.starts_with('/') || suspicious(path) || path.contains(['\n', '\r']) {
            refused.insert(format!("{} (not a plain absolute path)", shown(path)));
        } else if under(path, &writable)
            .is_some_and(|w| under(path, &p.read_only).is_none_or(|r| r.len() < w.len()))
        {
            refused.insert(format!(
                "{} (on a writable mount: allow_exec makes every writable mount noexec; put the \
                 program on a read-only mount)",
                shown(path)
            ));
        } else {
            entries.push((path.to_string(), why));
        }
    };
    for o in &p.own {
        add(
            o,
            "the server's program or its interpreter (it starts before any call)".into(),
            &mut entries,
        );
    }
    if entries.len() < p.own.len() {
        // a list without the server's own program would not let it start
        notes.push(
            "the server's program or its interpreter is on a writable mount or not a plain path, \
             so no list could let it start: kept from the base"
                .into(),
        );
        return (None, notes);
    }
    let mut seen_progs = p.seen.clone();
    seen_progs.sort_by_key(|(_, t)| *t);
    for (path, at) in &seen_progs {
        let call = seen
            .calls
            .iter()
            .find(|c| c.span.is_some_and(|(s, e)| s - 2 <= *at && *at <= e + 2));
        let why = match call {
            Some(c) => format!("first executed during tools/call {}", shown(&c.tool)),
            None => "executed outside any call".into(),
        };
        add(path, why, &mut entries);
    }
    for r in refused {
        notes.push(format!("not proposed: {r}"));
    }
    if entries.is_empty() {
        notes.push("no program could be proposed: kept from the base".into());
        return (None, notes);
    }
    (Some(entries), notes)
}

fn path_text(p: &Path) -> Result<String, String> {
    p.to_str()
        .map(str::to_string)
        .ok_or_else(|| format!("the path {} is not UTF-8", p.display()))
}

fn network(out: &mut String, base: &Policy, base_table: &toml::Table, seen: &Observed) {
    let mut contacted: BTreeMap<String, (usize, BTreeSet<String>)> = BTreeMap::new();
    let mut refused: BTreeMap<String, String> = BTreeMap::new();
    let mut invalid = 0usize;
    for c in &seen.connections {
        let shown_host = format!("{}:{}", shown(&c.host), c.port);
        if !c.connected {
            let why = c.refused.clone().unwrap_or_else(|| "not connected".into());
            refused.entry(shown_host).or_insert(why);
            continue;
        }
        let Some(rule) = exact_host(&c.host.to_ascii_lowercase(), c.port) else {
            invalid += 1;
            continue;
        };
        let e = contacted.entry(rule).or_default();
        e.0 += 1;
        e.1.extend(c.tools.iter().cloned());
    }
    let _ = writeln!(out, "\n[network]");
    if contacted.is_empty() {
        let _ = writeln!(out, "# no connection was made: no egress");
    }
    let mut allow = Vec::new();
    for (rule, (n, tools)) in contacted.iter().take(MAX_HOSTS) {
        let during = if tools.is_empty() {
            "outside any tool call".to_string()
        } else {
            format!("during tools/call {}", list(tools))
        };
        allow.push(format!(
            "  # contacted {} {during}\n  {},",
            count(*n, "time"),
            string(rule)
        ));
    }
    if allow.is_empty() {
        let _ = writeln!(out, "allow = []");
    } else {
        let _ = writeln!(out, "allow = [\n{}\n]", allow.join("\n"));
    }
    if contacted.len() > MAX_HOSTS {
        let _ = writeln!(
            out,
            "# not proposed: {} more hosts (at most {MAX_HOSTS} are proposed; a server that \
             contacts this many needs a hand-written rule)",
            contacted.len() - MAX_HOSTS
        );
    }
    if invalid > 0 {
        let _ = writeln!(
            out,
            "# not proposed: {} to names that are not one exact host",
            count(invalid, "connection")
        );
    }
    for (host, why) in refused.iter().take(MAX_HOSTS) {
        let _ = writeln!(
            out,
            "# not proposed: {host} was refused while learning ({})",
            shown(why)
        );
    }
    if refused.len() > MAX_HOSTS {
        let _ = writeln!(
            out,
            "# and {} more refused hosts",
            refused.len() - MAX_HOSTS
        );
    }
    if let Some(deny) = base_table
        .get("network")
        .and_then(|n| n.get("deny"))
        .filter(|d| d.as_array().is_some_and(|a| !a.is_empty()))
    {
        let _ = writeln!(out, "# as in the base policy");
        let _ = writeln!(out, "deny = {deny}");
    }
    let mapped: Vec<(&String, &std::net::IpAddr)> = base
        .network
        .hosts
        .iter()
        .filter(|(name, _)| {
            contacted.keys().any(|r| {
                r.rsplit_once(':')
                    .is_some_and(|(h, _)| h.eq_ignore_ascii_case(name))
            })
        })
        .collect();
    if !mapped.is_empty() {
        let _ = writeln!(
            out,
            "\n# the base's mappings of the hosts contacted\n[network.hosts]"
        );
        for (name, ip) in mapped {
            let _ = writeln!(out, "{} = {}", key(name), string(&ip.to_string()));
        }
    }
}

fn secrets(out: &mut String, base: &toml::Table) {
    let Some(toml::Value::Table(secrets)) = base.get("secrets") else {
        return;
    };
    if secrets.is_empty() {
        return;
    }
    let _ = writeln!(out, "\n[secrets]");
    for (name, v) in secrets {
        let _ = writeln!(
            out,
            "# declared in the base: whether the server read it cannot be observed (environment \
             reads are not); remove it if the server does not need it"
        );
        let _ = writeln!(out, "{} = {v}", key(name));
    }
}

fn tools(out: &mut String, base: &toml::Table, seen: &Observed) {
    let empty = toml::Table::new();
    let rules = match base.get("tools") {
        Some(toml::Value::Table(t)) => t,
        _ => &empty,
    };
    let _ = writeln!(out, "\n[tools]");
    let listed = seen.listed.clone().unwrap_or_default();
    let mut called: BTreeMap<&str, usize> = BTreeMap::new();
    let mut refused: BTreeMap<&str, usize> = BTreeMap::new();
    for c in &seen.calls {
        let into = if c.allowed { &mut called } else { &mut refused };
        *into.entry(c.tool.as_str()).or_default() += 1;
    }
    let unused: Vec<&String> = listed
        .iter()
        .filter(|t| !called.contains_key(t.as_str()))
        .collect();
    let _ = writeln!(
        out,
        "# tools listed but not called ({}) ask a human first{}",
        unused.len(),
        if unused.is_empty() {
            String::new()
        } else {
            let names: BTreeSet<String> = unused.iter().map(|s| s.to_string()).collect();
            format!(": {}", list(&names))
        }
    );
    let _ = writeln!(out, "default = \"approve\"");
    for (k, v) in rules {
        if TOOL_SETTINGS.contains(&k.as_str()) && k != "default" {
            let _ = writeln!(out, "{} = {v}", key(k));
        }
    }
    // the base's stricter rules stay: the strictest match wins, so a
    // `"write_*" = "approve"` still holds over an observed allow below
    for (k, v) in rules {
        if TOOL_SETTINGS.contains(&k.as_str()) || v.as_str() == Some(Verdict::Allow.as_str()) {
            continue;
        }
        let _ = writeln!(out, "# as in the base policy");
        let _ = writeln!(out, "{} = {v}", key(k));
    }
    // a name outside the MCP characters would be a pattern (`*`, `?`) or
    // a key the policy refuses; the relay refuses such calls anyway
    let (called, odd): (BTreeMap<&str, usize>, BTreeMap<&str, usize>) = called
        .into_iter()
        .partition(|(t, _)| crate::valid_tool_name(t));
    for tool in odd.keys() {
        let _ = writeln!(
            out,
            "# not proposed: {} (not a valid MCP tool name)",
            shown(tool)
        );
    }
    for (tool, n) in called.iter().take(MAX_TOOLS) {
        let _ = writeln!(out, "# called {} while learning", count(*n, "time"));
        let _ = writeln!(out, "{} = \"allow\"", key(tool));
    }
    if called.len() > MAX_TOOLS {
        let _ = writeln!(
            out,
            "# not proposed: {} more tools called (at most {MAX_TOOLS} rules are proposed)",
            called.len() - MAX_TOOLS
        );
    }
    for (tool, n) in refused.iter().take(MAX_TOOLS) {
        let _ = writeln!(
            out,
            "# not proposed: {} (refused {} while learning)",
            shown(tool),
            count(*n, "time")
        );
    }
    match (&seen.listed, &seen.pin_file) {
        (Some(l), Some(file)) => {
            let _ = writeln!(
                out,
                "# the tool list is pinned ({}, as listed while learning) in {}: a changed or new \
                 tool is withheld until `mcpbox pin accept`",
                count(l.len(), "tool"),
                shown(file)
            );
        }
        _ => {
            let _ = writeln!(
                out,
                "# no tool list was seen while learning: the first one under this policy is pinned"
            );
        }
    }
}

#[cfg(test)]
mod tests;
