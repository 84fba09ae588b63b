//! `mcpbox pin list|diff|accept|reset --policy FILE`: the tool pins of a
//! policy's servers (`run::pin_file`: one file per server, its pending
//! change beside it). Pin files hold a digest per tool, not the
//! definitions: a diff names the tools added, removed and changed; the
//! audit (`mcpbox audit --kind pin_change`) has when and which digests.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use mcpbox_gateway::{pending_path, read_pins, Pins};

use crate::preflight;
use crate::run;

/// What `mcpbox pin` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    List,
    Diff,
    Accept,
    Reset,
}

pub fn run(op: Op, policy: &Path) -> ExitCode {
    let loaded = match preflight::load(Some(policy)) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("mcpbox: {e}");
            return ExitCode::from(1);
        }
    };
    let name = loaded.policy.name().to_string();
    let dir = run::pin_dir(&loaded);
    let files = match pin_files(&dir) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("mcpbox: {}: {e}", dir.display());
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
        let pending = match read_pins(&pending_path(file)) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("mcpbox: {e}");
                return ExitCode::from(1);
            }
        };
        pending_seen += usize::from(pending.is_some());
        match op {
            Op::List => {
                println!("server {label} ({})", file.display());
                match &current {
                    Some(p) if p.tools_pinned => {
                        for (tool, digest) in &p.tools {
                            println!("  {tool}  {}", &digest[..digest.len().min(16)]);
                        }
                    }
                    _ => println!("  (no tool list pinned yet)"),
                }
                if pending.is_some() {
                    println!(
                        "  a change is pending: `mcpbox pin diff --policy {}`",
                        policy.display()
                    );
                }
            }
            Op::Diff | Op::Accept => {
                let Some(new) = &pending else { continue };
                println!("server {label}:");
                print_diff(current.as_ref(), new);
                if op == Op::Accept {
                    if let Err(e) = mcpbox_gateway::accept_pins(file) {
                        eprintln!("mcpbox: {e}");
                        return ExitCode::from(1);
                    }
                    println!("  accepted");
                }
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
    if matches!(op, Op::Diff | Op::Accept) && pending_seen == 0 {
        println!("nothing pending for {name} ({})", dir.display());
    }
    ExitCode::SUCCESS
}

/// The pin files (not their pending twins) under `dir`, also those that
/// exist only as a pending change.
fn pin_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for e in entries {
        let name = e?.file_name().to_string_lossy().into_owned();
        let base = name.strip_suffix(".pending").unwrap_or(&name);
        if base.ends_with(".json") {
            let p = dir.join(base);
            if !out.contains(&p) {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Added, removed and changed tools, and the instructions.
fn print_diff(old: Option<&Pins>, new: &Pins) {
    let empty = Pins::default();
    let old = old.unwrap_or(&empty);
    for (tool, digest) in &new.tools {
        match old.tools.get(tool) {
            None => println!("  + {tool} (new tool)"),
            Some(d) if d != digest => println!("  ~ {tool} (definition changed)"),
            Some(_) => {}
        }
    }
    for tool in old.tools.keys() {
        if !new.tools.contains_key(tool) {
            println!("  - {tool} (gone)");
        }
    }
    if old.instructions != new.instructions {
        println!("  ~ the server's instructions changed");
    }
}
