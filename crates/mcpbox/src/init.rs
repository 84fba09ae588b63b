//! `mcpbox init [--preset NAME] [--output FILE] [--force]`, `mcpbox init
//! --list`: a commented starter policy (every section commented out with its
//! safe default), or a preset's text to adapt, on stdout or into a file that
//! is never overwritten without `--force`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use mcpbox_policy::preset;

/// Every section, commented out, with its safe default.
const STARTER: &str = include_str!("init/starter.toml");

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Start from a preset shipped in mcpbox (see `--list`).
    #[arg(long, value_name = "NAME")]
    preset: Option<String>,
    /// Write the policy to FILE instead of stdout; an existing FILE is kept
    /// unless --force.
    #[arg(long, short, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Overwrite an existing --output file.
    #[arg(long, requires = "output")]
    force: bool,
    /// List the presets with a line on each, and write nothing.
    #[arg(long, conflicts_with_all = ["preset", "output", "force"])]
    list: bool,
}

pub fn run(args: &Args) -> ExitCode {
    match init(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mcpbox: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn init(args: &Args) -> anyhow::Result<()> {
    if args.list {
        let width = preset::all()
            .iter()
            .map(|p| p.name.len())
            .max()
            .unwrap_or(0);
        let mut out = std::io::stdout().lock();
        for p in preset::all() {
            writeln!(out, "{:width$}  {}", p.name, p.summary)?;
        }
        return Ok(());
    }
    let text = match &args.preset {
        None => STARTER.to_string(),
        Some(name) => {
            let p = preset::get(name).with_context(|| {
                format!(
                    "unknown preset \"{}\": known presets are {} (`mcpbox init --list` describes them)",
                    name.escape_debug(),
                    preset::names()
                )
            })?;
            format!(
                "# Written by `mcpbox init --preset {0}` (mcpbox {1}): a copy of the preset\n\
                 # to adapt. To follow the preset shipped with mcpbox instead, replace this\n\
                 # file's contents with `extends = \"preset:{0}\"` and your changes.\n\
                 # Relative paths are relative to this file's directory.\n#\n{2}",
                p.name,
                env!("CARGO_PKG_VERSION"),
                p.text
            )
        }
    };
    match &args.output {
        None => {
            std::io::stdout().lock().write_all(text.as_bytes())?;
        }
        Some(path) => {
            write_policy(path, &text, args.force)?;
            eprintln!(
                "mcpbox: wrote {0}; check it with `mcpbox check {0}`",
                path.display()
            );
        }
    }
    Ok(())
}

/// Writes `text` to `path`: a new file, or with `force` a complete
/// replacement (a temporary file renamed over it, so an interrupted write
/// never leaves half a policy).
fn write_policy(path: &Path, text: &str, force: bool) -> anyhow::Result<()> {
    if !force {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => anyhow::anyhow!(
                    "{} exists and was left as it is: pass --force to overwrite it, or choose another --output",
                    path.display()
                ),
                _ => anyhow::anyhow!("cannot create {}: {e}", path.display()),
            })?;
        return f
            .write_all(text.as_bytes())
            .with_context(|| format!("writing {}", path.display()));
    }
    if path.is_dir() {
        anyhow::bail!("{} is a directory: give a file name", path.display());
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("cannot create a file in {}", dir.display()))?;
    // The replacement keeps the old file's permissions (a temporary file is
    // created 0600, which a policy read by another user would lose).
    if let Ok(meta) = std::fs::metadata(path) {
        tmp.as_file()
            .set_permissions(meta.permissions())
            .with_context(|| format!("cannot set the permissions of {}", path.display()))?;
    }
    tmp.write_all(text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))?;
    tmp.persist(path)
        .map_err(|e| anyhow::anyhow!("cannot replace {}: {}", path.display(), e.error))?;
    Ok(())
}
