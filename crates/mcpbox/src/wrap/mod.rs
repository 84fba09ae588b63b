//! `mcpbox wrap HOST_CONFIG`: rewrites a host's MCP config (Claude
//! Desktop, Claude Code, Cursor, VS Code, Codex) so that every stdio
//! server runs under `mcpbox run` with a generated policy, moves inline
//! secrets into a 0600 store, keeps a backup for `--undo`, and prints a
//! diff instead with `--dry-run`. See docs/wrap.md.

mod hosts;
mod jsonc;
mod policygen;
mod store;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};

use hosts::{Change, EntryKind, Host};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The host's config file (claude_desktop_config.json, .mcp.json,
    /// .cursor/mcp.json, .vscode/mcp.json, ~/.codex/config.toml).
    config: PathBuf,
    /// Restore the file as it was before `mcpbox wrap`, byte for byte.
    #[arg(long, conflicts_with_all = ["dry_run", "host", "mcpbox", "serve"])]
    undo: bool,
    /// With --undo: restore even though the file, or a generated policy,
    /// changed since the wrap (those later changes are lost).
    #[arg(long, requires = "undo")]
    force: bool,
    /// Print the diff of what would change; write nothing.
    #[arg(long)]
    dry_run: bool,
    /// The host format, when the file's name does not tell.
    #[arg(long, value_enum)]
    host: Option<Host>,
    /// The mcpbox the wrapped entries run (default: this binary's absolute
    /// path; `mcpbox` to find it on the host's PATH).
    #[arg(long, value_name = "PATH")]
    mcpbox: Option<String>,
    /// Point remote (url) entries at this `mcpbox serve` base URL
    /// (`URL/servers/NAME/mcp`) and print the serve config they need.
    #[arg(long, value_name = "URL")]
    serve: Option<String>,
}

/// The variable that moves mcpbox's state directory (crate::state).
const STATE_VAR: &str = "MCPBOX_STATE_DIR";

pub fn run(args: Args) -> ExitCode {
    let result = if args.undo {
        undo(&args.config, args.force)
    } else {
        wrap(&args)
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mcpbox: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// The file itself (a symlinked config is rewritten where it lives, and
/// its state is found whichever name it is given by).
/// Never a file of mcpbox's own state (a pin file, the secrets store, a
/// backup of another wrap): wrap would rewrite it in place.
fn real_path(config: &Path) -> anyhow::Result<PathBuf> {
    let real = std::fs::canonicalize(config)
        .with_context(|| format!("cannot read {}", config.display()))?;
    let private = crate::state::private_locations(std::iter::empty());
    if let Some((kind, at)) = crate::state::touches_private(&real, &private) {
        anyhow::bail!(
            "{} is inside {kind} ({}): mcpbox wraps a host's config, never its own state",
            config.display(),
            at.display()
        );
    }
    Ok(real)
}

/// The most a host's config may hold: far above any real one, and a
/// bound on what is read into memory.
const MAX_CONFIG: u64 = 16 << 20;

/// A host config's bytes: a regular file (checked on the open
/// descriptor), opened without waiting (a fifo planted or linked at its
/// name would hang the read), at most [`MAX_CONFIG`] bytes (a link to
/// `/dev/zero` would fill the memory).
pub(super) fn read_config(path: &Path) -> anyhow::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let meta = file
        .metadata()
        .with_context(|| format!("cannot read {}", path.display()))?;
    if !meta.is_file() {
        anyhow::bail!(
            "{} is not a regular file; the file was left untouched",
            path.display()
        );
    }
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("cannot read {}", path.display()))?;
    if bytes.len() as u64 > MAX_CONFIG {
        anyhow::bail!(
            "{} is larger than {} MiB, more than any host's config; the file was left untouched",
            path.display(),
            MAX_CONFIG >> 20
        );
    }
    Ok(bytes)
}

fn wrap(args: &Args) -> anyhow::Result<()> {
    let path = real_path(&args.config)?;
    let bytes = read_config(&path)?;
    let text = String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "{}: not UTF-8 text (byte {}); the file was left untouched",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })?;
    let host = match args.host {
        Some(h) => h,
        None => hosts::detect(&path, &text).map_err(anyhow::Error::msg)?,
    };
    let ours = match &args.mcpbox {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .context("cannot tell where this mcpbox is: pass --mcpbox PATH")?
            .to_string_lossy()
            .into_owned(),
    };
    let st = store::Store::for_config(&path);
    if st.manifest_path().exists() {
        bail!(
            "{} was wrapped by mcpbox already (its backup is in {}): run `mcpbox wrap --undo {}` first",
            path.display(),
            st.dir.display(),
            args.config.display()
        );
    }
    if st.dir.exists() {
        // its manifest is written after everything but the config, and a
        // failure removes the folder: it is left from a wrap that was
        // killed before it wrote the manifest, so the config was not
        // replaced, and the folder's `original` holds it as it was
        bail!(
            "{} is left from a wrap of {} that did not finish (it was stopped before it wrote \
             its manifest; the config itself was not replaced): its `original` holds the config \
             as it was, secrets included. Check that the config is as you want it, remove {} \
             and run mcpbox wrap again",
            st.dir.display(),
            path.display(),
            st.dir.display()
        );
    }
    let entries = hosts::entries(host, &path, &text, &ours).map_err(anyhow::Error::msg)?;
    let stdio = entries
        .iter()
        .filter(|e| matches!(e.kind, EntryKind::Stdio(_)))
        .count();
    let remote = entries
        .iter()
        .filter(|e| matches!(e.kind, EntryKind::Remote { .. }))
        .count();
    if stdio == 0 && entries.iter().any(|e| matches!(e.kind, EntryKind::Wrapped)) {
        bail!(
            "{} is already wrapped: every stdio server in it runs mcpbox (nothing was changed)",
            path.display()
        );
    }
    if stdio == 0 && (remote == 0 || args.serve.is_none()) {
        bail!(
            "{} has no stdio server to wrap ({} entries; nothing was changed)",
            path.display(),
            entries.len()
        );
    }

    // Hosts start servers with an environment of their own (a minimal
    // one: Claude Desktop's is not the shell's), so a MCPBOX_STATE_DIR the
    // user set reaches the wrapped server only if the entry says it: then
    // the policies, secrets and audit this wrap points at are the ones
    // `run` uses. Unset, `run` takes its default, as this wrap did.
    let state_env = std::env::var_os(STATE_VAR)
        .filter(|v| !v.is_empty())
        .map(|v| {
            let dir = PathBuf::from(v);
            std::path::absolute(&dir)
                .unwrap_or(dir)
                .to_string_lossy()
                .into_owned()
        });
    let mut plan = store::Plan::default();
    let mut changes = Vec::new();
    let mut lines = Vec::new();
    let mut snippets = Vec::new();
    let mut names = store::Names::default();
    for entry in &entries {
        let name = &entry.name;
        match &entry.kind {
            EntryKind::Stdio(s) => {
                let file_name = names.unique(name);
                let policy = st.dir.join(format!("{file_name}.toml"));
                let g = policygen::generate(&file_name, &path, host.label(), s, &|var| {
                    st.secret_path(&file_name, var)
                });
                if let Some(why) = &g.refused {
                    lines.push(format!("  {name}: left alone: {why}"));
                    continue;
                }
                if let Err(e) = mcpbox_policy::parse(&g.text, &policy) {
                    lines.push(format!(
                        "  {name}: left alone: its generated policy is refused: {}",
                        e.to_string().replace('\n', " ")
                    ));
                    continue;
                }
                let mut argv = vec![
                    "run".to_string(),
                    "--policy".into(),
                    policy.to_string_lossy().into_owned(),
                    "--".into(),
                    s.command.clone(),
                ];
                argv.extend(s.args.iter().cloned());
                let mut env = g.kept_env.clone();
                if let Some(dir) = &state_env {
                    env.retain(|(k, _)| k != STATE_VAR);
                    env.push((STATE_VAR.to_string(), dir.clone()));
                }
                changes.push(Change::Stdio {
                    name: name.clone(),
                    command: ours.clone(),
                    args: argv,
                    env,
                });
                lines.push(summary(name, &policy, &g));
                for (_, value, file) in &g.secrets {
                    plan.secrets.push((file.clone(), value.clone()));
                }
                plan.output_dirs.extend(g.output_dir.clone());
                plan.policies.push((policy, g.text));
            }
            EntryKind::Remote { url, headers } => match &args.serve {
                None => lines.push(format!(
                    "  {name}: left alone: remote server {url} (--serve URL points it at mcpbox serve)"
                )),
                Some(_) if *headers => lines.push(format!(
                    "  {name}: left alone: remote server {url} sends headers; move its credential \
                     into a policy's [upstream] by hand (docs/wrap.md)"
                )),
                Some(base) => {
                    let file_name = names.unique(name);
                    let policy = st.dir.join(format!("{file_name}.toml"));
                    let new_url = format!("{}/servers/{file_name}/mcp", base.trim_end_matches('/'));
                    plan.policies.push((policy.clone(), remote_policy(&file_name, url)));
                    changes.push(Change::Url {
                        name: name.clone(),
                        url: new_url.clone(),
                    });
                    lines.push(format!("  {name}: now {new_url} (mcpbox serve, policy {})", policy.display()));
                    snippets.push(format!(
                        "[[servers]]\nname = {}\nurl = {}\npolicy = {}\n",
                        mcpbox_policy::toml_text::toml_str(&file_name),
                        mcpbox_policy::toml_text::toml_str(url),
                        mcpbox_policy::toml_text::toml_str(&policy.to_string_lossy())
                    ));
                }
            },
            EntryKind::Wrapped => lines.push(format!("  {name}: left alone: already runs mcpbox")),
            EntryKind::Other(why) => lines.push(format!("  {name}: left alone: {why}")),
        }
    }
    if changes.is_empty() {
        eprintln!("{}", lines.join("\n"));
        bail!(
            "nothing in {} could be wrapped (nothing was changed)",
            path.display()
        );
    }
    let new_text = hosts::rewrite(host, &text, &changes)
        .map_err(|e| anyhow::anyhow!("rewriting {}: {e} (nothing was changed)", path.display()))?;
    // what the host reads back must still be its format
    hosts::entries(host, &path, &new_text, &ours).map_err(|e| {
        anyhow::anyhow!(
            "the rewritten file would not parse ({e}): nothing was changed; please report this"
        )
    })?;

    let shown = args.config.display().to_string();
    if args.dry_run {
        // the removed lines hold the secrets: the terminal (and whatever
        // logs it) gets their names only
        let mut shown_diff = mcpbox_gateway::diff::unified(&text, &new_text, Some(&shown));
        for (file, value) in &plan.secrets {
            let label = file
                .file_name()
                .map(|n| n.to_string_lossy())
                .unwrap_or_default();
            let escaped = serde_json::Value::from(value.as_str()).to_string();
            let escaped = escaped.trim_matches('"');
            for form in [value.as_str(), escaped] {
                if !form.is_empty() {
                    shown_diff = shown_diff.replace(form, &format!("<secret moved to {label}>"));
                }
            }
        }
        print!("{shown_diff}");
        println!("{} ({}), dry run: nothing was written", shown, host.label());
        println!("{}", lines.join("\n"));
        for (p, _) in &plan.policies {
            println!("would write the policy {}", p.display());
        }
        print_snippets(&snippets);
        return Ok(());
    }
    st.commit(&path, &text, &new_text, host.label(), plan)?;
    println!("{} ({}): wrapped", shown, host.label());
    println!("{}", lines.join("\n"));
    println!(
        "the original is kept in {}; restore it with: mcpbox wrap --undo {shown}",
        st.dir.display()
    );
    print_snippets(&snippets);
    Ok(())
}

fn print_snippets(snippets: &[String]) {
    if !snippets.is_empty() {
        println!("\nadd to your mcpbox serve config (docs/serve.md):\n");
        println!("{}", snippets.join("\n"));
    }
}

fn summary(name: &str, policy: &Path, g: &policygen::Generated) -> String {
    let mut s = match g.preset {
        Some(p) => format!(
            "  {name}: wrapped with the preset {p} ({})",
            policy.display()
        ),
        None => format!(
            "  {name}: wrapped with a generated policy {}",
            policy.display()
        ),
    };
    if !g.mounts.is_empty() {
        let m: Vec<String> = g
            .mounts
            .iter()
            .map(|(p, mode)| format!("{} {mode}", p.display()))
            .collect();
        s.push_str(&format!("; mounts {}", m.join(", ")));
    }
    if !g.secrets.is_empty() {
        let n: Vec<&str> = g.secrets.iter().map(|(v, _, _)| v.as_str()).collect();
        s.push_str(&format!("; secrets moved: {}", n.join(", ")));
    }
    for r in &g.runtime {
        s.push_str(&format!(
            "\n    runtime (mcpbox run mounts it at each start): {r}"
        ));
    }
    for note in &g.notes {
        s.push_str(&format!("\n    note: {note}"));
    }
    s
}

/// The policy of a remote server behind `mcpbox serve`.
fn remote_policy(name: &str, url: &str) -> String {
    format!(
        "# Generated by `mcpbox wrap --serve` for the remote server {url}.\n\
         # Its tools pass the gateway's checks; add [upstream] for a credential.\n\
         [server]\nname = {}\n",
        mcpbox_policy::toml_text::toml_str(name)
    )
}

fn undo(config: &Path, force: bool) -> anyhow::Result<()> {
    let path = real_path(config)?;
    let st = store::Store::for_config(&path);
    let restored = st.undo(&path, force)?;
    println!(
        "{}: restored as it was before mcpbox wrap ({} generated files removed)",
        config.display(),
        restored
    );
    Ok(())
}
