//! `mcpbox pin list|diff|accept|reject|reset --policy FILE`: the tool pins
//! of a policy's servers (`run::pin_file`: one file per server, its pending
//! change beside it, the server's command line inside). Pin
//! files keep each tool's definition beside its digest, so `diff` shows
//! what changed in a description as a unified line diff and how the input
//! schema changed (`mcpbox_gateway::pin_review`); for tools pinned by an
//! older mcpbox it says the pinned text is unknown. Everything the server
//! wrote is printed with terminal escapes and invisible characters
//! stripped. `accept` and `reject` take one tool (or `--instructions`) or
//! everything, and write a `pin_change` record to the policy's audit log
//! (`source` `cli:pin accept` / `cli:pin reject`).

use std::path::Path;
use std::process::ExitCode;

use mcpbox_gateway::pin_review::{self, ChangeKind, PendingChange, Pick, Shown};
use mcpbox_gateway::screen::sanitize;
use mcpbox_gateway::{pending_path, read_pins};

use crate::preflight;
use crate::run;
use crate::state;

/// What `mcpbox pin` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op<'a> {
    List,
    Diff,
    Accept(Pick<'a>),
    Reject(Pick<'a>),
    Reset,
}

/// The pick of `accept`/`reject` from their arguments.
pub fn pick(tool: Option<&str>, instructions: bool) -> Pick<'_> {
    match (tool, instructions) {
        (_, true) => Pick::Instructions,
        (Some(t), false) => Pick::Tool(t),
        (None, false) => Pick::All,
    }
}

/// Server text made safe for a terminal: escapes, controls (but `\n` and
/// `\t`) and invisible characters removed.
fn clean(s: &str) -> String {
    sanitize(s).0.into_owned()
}

pub fn run(op: Op<'_>, policy: &Path) -> ExitCode {
    let loaded = match preflight::load(Some(policy)) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("mcpbox: {e}");
            return ExitCode::from(1);
        }
    };
    let name = loaded.policy.name().to_string();
    let dir = run::pin_dir(&loaded);
    let files = match pin_review::pin_files_in(&dir) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("mcpbox: {e}");
            return ExitCode::from(1);
        }
    };
    if files.is_empty() {
        println!(
            "no pins for {name} yet ({}): the first tool list of each server is pinned",
            dir.display()
        );
        return ExitCode::SUCCESS;
    }
    let mut pending_seen = 0;
    let mut decided: Vec<(PendingChange, bool)> = Vec::new();
    for file in &files {
        let label = file
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let current = match read_pins(file) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("mcpbox: {e}");
                return ExitCode::from(1);
            }
        };
        let review = match pin_review::review(file) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("mcpbox: {e}");
                return ExitCode::from(1);
            }
        };
        let pending = pending_path(file).exists();
        let server = current.as_ref().and_then(|p| p.server.clone());
        pending_seen += usize::from(pending);
        match op {
            Op::List => {
                println!("server {label} ({})", file.display());
                if let Some(s) = &server {
                    println!("  runs {}", clean(s));
                }
                match &current {
                    Some(p) if p.tools_pinned => {
                        for (tool, digest) in &p.tools {
                            let rejected = p.rejected.get(tool).map_or(0, |r| r.len());
                            let note = if rejected > 0 {
                                format!("  ({rejected} rejected change(s) stay withheld)")
                            } else {
                                String::new()
                            };
                            println!(
                                "  {}  {}{note}",
                                clean(tool),
                                &digest[..digest.len().min(16)]
                            );
                        }
                    }
                    _ => println!("  (no tool list pinned yet)"),
                }
                if pending {
                    println!(
                        "  a change is pending: `mcpbox pin diff --policy {}`",
                        policy.display()
                    );
                }
            }
            Op::Diff => {
                if !pending {
                    continue;
                }
                print_server(&label, server.as_deref());
                for c in &review.changes {
                    print_change(c);
                }
            }
            Op::Accept(pick) | Op::Reject(pick) => {
                if !pending {
                    continue;
                }
                let accept = matches!(op, Op::Accept(_));
                let result = if accept {
                    pin_review::accept(file, pick)
                } else {
                    pin_review::reject(file, pick)
                };
                let done = match result {
                    Ok(d) => d,
                    Err(e) => {
                        eprintln!("mcpbox: {e}");
                        return ExitCode::from(1);
                    }
                };
                if done.is_empty() {
                    continue;
                }
                print_server(&label, server.as_deref());
                for c in &done {
                    print_change(c);
                }
                println!(
                    "  {}",
                    if accept {
                        "accepted"
                    } else {
                        "rejected: the pins stay; the server's changed definition stays withheld"
                    }
                );
                decided.extend(done.into_iter().map(|c| (c, accept)));
            }
            Op::Reset => {
                for f in [file.clone(), pending_path(file)] {
                    match std::fs::remove_file(&f) {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => {
                            eprintln!("mcpbox: removing {}: {e}", f.display());
                            return ExitCode::from(1);
                        }
                    }
                }
                println!("reset server {label}: its next tool list is pinned as it comes");
            }
        }
    }
    match op {
        Op::Diff if pending_seen == 0 => {
            println!("nothing pending for {name} ({})", dir.display());
        }
        Op::Accept(pick) | Op::Reject(pick) if decided.is_empty() => {
            let what = match pick {
                Pick::All => String::new(),
                Pick::Tool(t) => format!(" for tool {}", clean(t)),
                Pick::Instructions => " for the instructions".into(),
            };
            println!("nothing pending{what} for {name} ({})", dir.display());
        }
        Op::Accept(_) | Op::Reject(_) => {
            let verb = if matches!(op, Op::Accept(_)) {
                "accept"
            } else {
                "reject"
            };
            if let Err(e) = audit(&loaded, &decided, verb) {
                // the pin files are consistent either way
                eprintln!(
                    "mcpbox: the pins were updated but the decision is not in the audit log: {e:#}"
                );
            }
        }
        _ => {}
    }
    ExitCode::SUCCESS
}

/// One `pin_change` record per decision in the policy's audit log.
fn audit(
    loaded: &preflight::Loaded,
    decided: &[(PendingChange, bool)],
    verb: &str,
) -> anyhow::Result<()> {
    let store = state::open_audit(&loaded.policy)?;
    for (change, accepted) in decided {
        let mut e = pin_review::change_event(change, *accepted, &format!("cli:pin {verb}"));
        e.server = loaded.policy.name().to_string();
        store.append(e)?;
    }
    Ok(())
}

fn print_server(label: &str, server: Option<&str>) {
    println!("server {label}:");
    if let Some(s) = server {
        println!("  runs {}", clean(s));
    }
}

/// One change: its line (`+ tool (new tool)`, `~ tool (definition
/// changed)`, `- tool (gone)`, `~ the server's instructions changed`, as
/// before definitions were kept), then what changed.
fn print_change(c: &PendingChange) {
    let tool = clean(c.subject());
    match c.kind {
        ChangeKind::Added => println!("  + {tool} (new tool)"),
        ChangeKind::Changed => println!("  ~ {tool} (definition changed)"),
        ChangeKind::Removed => println!("  - {tool} (gone)"),
        ChangeKind::InstructionsChanged => println!("  ~ the server's instructions changed"),
    }
    const IN: &str = "      ";
    for (side, shown) in [("pinned", &c.pinned), ("proposed", &c.proposed)] {
        if let Some(s) = shown {
            if s.known().is_none() {
                println!("    {side} definition: {}", s.why_not());
            }
        }
    }
    let (old, new) = (
        c.pinned.as_ref().and_then(Shown::known),
        c.proposed.as_ref().and_then(Shown::known),
    );
    let old_title = old.and_then(|d| d.title.as_deref());
    let new_title = new.and_then(|d| d.title.as_deref());
    let titles_known = new.is_some() && (old.is_some() || c.kind == ChangeKind::Added);
    if titles_known && old_title != new_title {
        println!(
            "    title: {} -> {}",
            old_title.map_or("(none)".into(), |t| format!("{:?}", clean(t))),
            new_title.map_or("(none)".into(), |t| format!("{:?}", clean(t)))
        );
    }
    let mut stripped = false;
    let mut shown = |line: &str| {
        let (c, s) = sanitize(line);
        stripped |= !s.rules().is_empty();
        c.into_owned()
    };
    match &c.description_diff {
        Some(d) if !d.is_empty() => {
            println!("    description:");
            for line in d.lines() {
                println!("{IN}{}", shown(line));
            }
        }
        Some(_) => println!("    description: unchanged"),
        None => {
            // one side unknown: show the side that is known, whole
            for (side, def) in [("pinned", old), ("proposed", new)] {
                if let Some(text) = def.and_then(|d| d.description.as_deref()) {
                    println!("    {side} description:");
                    for line in text.split('\n') {
                        println!("{IN}{}", shown(line));
                    }
                }
            }
        }
    }
    if stripped {
        println!(
            "    (the server's text held terminal escape sequences or invisible characters: \
             removed above, and the relay strips them from what the host sees)"
        );
    }
    if c.kind == ChangeKind::Changed {
        match &c.schema {
            Some(s) if s.is_empty() => {}
            Some(s) => {
                let list = |v: &[String]| {
                    v.iter()
                        .map(|p| {
                            if p.is_empty() {
                                "(whole)".into()
                            } else {
                                clean(p)
                            }
                        })
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                println!("    input schema changed:");
                for (what, v) in [
                    ("added", &s.added),
                    ("removed", &s.removed),
                    ("changed", &s.changed),
                ] {
                    if !v.is_empty() {
                        println!("{IN}{what}: {}", list(v));
                    }
                }
            }
            None => println!("    input schema: not comparable (a side is not kept)"),
        }
    }
}
