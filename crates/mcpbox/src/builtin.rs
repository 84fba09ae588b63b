//! The built-in sandbox server (`mcpbox run --builtin sandbox`,
//! `builtin = "sandbox"` under `mcpbox serve`): how it is started inside a
//! sandbox, and the gateway's checks of its tools' arguments.
//!
//! The server is this binary (crates/builtin), bound read-only into the
//! sandbox at [`BIN_AT`] and run there as `mcpbox __builtin-sandbox CONFIG`.
//! Everything else is as for any server: the policy's sandbox, the relay,
//! the audit. The gateway adds what only it can check honestly:
//! - a `path` or `cwd` argument outside /workspace is refused before the
//!   server sees it (reason `argument.path_outside`; the server resolves
//!   paths with RESOLVE_BENEATH besides, which catches the symlinks);
//! - `exec` and `start_job` are declared command tools (`command` a shell
//!   line, `argv` a vector), so `[commands]` classifies every call, and
//!   `run_code` is classified as its interpreter;
//! - `export_artifact`'s file is measured on the host, through
//!   descriptors that never follow a link: over `artifacts.max_size` the
//!   call needs a human, and the size allowed is set in the call's `_meta`
//!   by the gateway, so the server copies no more than was approved.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use anyhow::Context;
use mcpbox_gateway::ArgumentCheck;
use mcpbox_policy::{CommandRules, Decision, Policy, Reason, Verdict};
use mcpbox_sandbox::{BindMount, Spec};
use rustix::fs::{Mode, OFlags, ResolveFlags};
use serde_json::{json, Value};

/// Where the binary is inside the sandbox.
pub const BIN_AT: &str = "/opt/mcpbox/bin/mcpbox";
/// The workspace inside the sandbox.
const ROOT: &str = "/workspace";

/// The tools whose `command`/`argv` arguments are command lines.
const COMMAND_TOOLS: &[&str] = &["exec", "start_job"];
/// The tools with a `cwd` argument.
const CWD_TOOLS: &[&str] = &["exec", "run_code", "start_job"];

/// The identity of the built-in server's pins (its argv carries its
/// limits, which must not re-pin it when they change).
pub const PIN_IDENTITY: &str = "builtin:sandbox";

/// The server's command line inside the sandbox, with its limits.
pub fn argv(policy: &Policy) -> anyhow::Result<Vec<OsString>> {
    let j = &policy.jobs;
    let config = mcpbox_builtin::Config {
        max_running: j.max_running,
        max_time_ms: ms(j.max_time),
        max_memory: j.max_memory,
        exec_timeout_ms: ms(j.exec_timeout),
        max_output: j.max_output,
        job_output: j.job_output,
        artifact_max_size: policy.artifacts.max_size,
        root: ROOT.into(),
    };
    let json = serde_json::to_string(&config).context("the built-in server's config")?;
    Ok(vec![BIN_AT.into(), mcpbox_builtin::ARG.into(), json.into()])
}

fn ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Binds this binary into `spec`'s sandbox, read-only, and lets it run
/// under an `allow_exec` list.
pub fn add_binary(spec: &mut Spec) -> anyhow::Result<()> {
    let exe = std::env::current_exe()
        .and_then(|p| p.canonicalize())
        .context("finding the mcpbox binary to run the built-in server")?;
    spec.mounts.push(BindMount {
        host: exe,
        at: PathBuf::from(BIN_AT),
        writable: false,
    });
    if let Some(list) = spec.allow_exec.as_mut() {
        list.push(PathBuf::from(BIN_AT));
    }
    Ok(())
}

/// Declares the server's command arguments in the policy's `[commands]`.
pub fn declare_commands(commands: &mut CommandRules) {
    for t in COMMAND_TOOLS {
        commands.declare_line(t, "command");
        commands.declare_argv(t, "argv");
    }
}

/// The host directories behind the sandbox's /workspace, for measuring
/// an artifact before it is exported.
#[derive(Debug, Clone, Default)]
pub struct HostWorkspace {
    pub input: Option<PathBuf>,
    pub output: Option<PathBuf>,
    pub tmp: Option<PathBuf>,
}

/// The gateway's checks of the built-in server's arguments.
pub struct Checks {
    pub workspace: HostWorkspace,
    pub max_size: u64,
}

impl Checks {
    /// The checks for a sandbox started from `spec` under `policy`.
    pub fn for_spec(spec: &Spec, policy: &Policy) -> Checks {
        Checks {
            workspace: HostWorkspace {
                input: spec.input.clone(),
                output: spec.output.clone(),
                tmp: spec.tmp_dir.clone(),
            },
            max_size: policy.artifacts.max_size,
        }
    }

    /// Adds the built-in server's own rules to what `[commands]` found.
    pub fn check(
        &self,
        tool: &str,
        args: Option<&Value>,
        commands: &CommandRules,
        prior: Option<ArgumentCheck>,
    ) -> Option<ArgumentCheck> {
        let mut out = prior;
        let args = args.unwrap_or(&Value::Null);
        let mut keys: Vec<&str> = Vec::new();
        if mcpbox_builtin::PATH_TOOLS.contains(&tool) {
            keys.push("path");
        }
        if CWD_TOOLS.contains(&tool) {
            keys.push("cwd");
        }
        for key in keys {
            match args.get(key) {
                None => {}
                Some(Value::String(p)) => {
                    if let Err(why) = mcpbox_policy::confine_path(p, ROOT) {
                        let d = Decision::deny(
                            Reason::ArgumentPathOutside,
                            format!("builtin.{tool}.{key}"),
                        );
                        return Some(merge(
                            out,
                            d,
                            json!({"argument": key, "why": why}),
                            Vec::new(),
                        ));
                    }
                }
                Some(_) => {
                    let d =
                        Decision::deny(Reason::ArgumentInvalid, format!("builtin.{tool}.{key}"));
                    return Some(merge(out, d, json!({"argument": key}), Vec::new()));
                }
            }
        }
        if tool == "run_code" && !commands.is_empty() {
            // a shell snippet is a command line like exec's: its commands
            // are classified, or `sudo` denied in exec would pass here;
            // Python and Node code is its interpreter's category (`build`)
            let code = args.get("code").and_then(Value::as_str).unwrap_or("");
            let input = match args.get("language").and_then(Value::as_str) {
                Some("sh") => mcpbox_policy::Input::Line(code.to_string()),
                Some("python") => mcpbox_policy::Input::Argv(vec!["python3".into()]),
                _ => mcpbox_policy::Input::Argv(vec!["node".into()]),
            };
            let cd = commands.decide(mcpbox_policy::Classifier::classify(
                &crate::classify::Child,
                &input,
            ));
            out = Some(merge(
                out,
                cd.decision.clone(),
                cd.audit_detail(),
                Vec::new(),
            ));
        }
        if tool == "export_artifact" {
            let (d, detail, size) =
                self.measure(args.get("path").and_then(Value::as_str).unwrap_or(""));
            let mut c = merge(out, d, detail, Vec::new());
            // A human who approves this export (over the limit, or under
            // an `approve` rule) approves this size: the broker binds the
            // approval to it, so a retry after the file grew is a new
            // question, and the server copies no more than it
            // (META_MAX_BYTES), however the file grows meanwhile.
            let allowed = match size {
                None => 0,
                Some(n) if c.decision.verdict == Verdict::Approve => n,
                Some(n) => n.max(self.max_size),
            };
            c.meta
                .push((mcpbox_builtin::META_MAX_BYTES.to_string(), json!(allowed)));
            c.measured = size;
            out = Some(c);
        }
        out
    }

    /// Measures an artifact on the host: (decision, detail, its size when
    /// it could be measured).
    fn measure(&self, path: &str) -> (Decision, Value, Option<u64>) {
        let source = "builtin.export_artifact";
        let refuse = |why: String| {
            (
                Decision::deny(Reason::ArtifactRefused, source),
                json!({"artifact": path, "why": why}),
                None,
            )
        };
        let abs = match mcpbox_policy::confine_path(path, ROOT) {
            Ok(a) => a,
            Err(why) => return refuse(why),
        };
        let rel = abs.strip_prefix(ROOT).unwrap_or("").trim_start_matches('/');
        let (top, rest) = rel.split_once('/').unwrap_or((rel, ""));
        let dir = match top {
            "input" => self.workspace.input.as_deref(),
            "output" => self.workspace.output.as_deref(),
            "tmp" => self.workspace.tmp.as_deref(),
            _ => None,
        };
        let Some(dir) = dir.filter(|_| !rest.is_empty()) else {
            return refuse(
                "not a file under /workspace/input, output or tmp that the host can see".into(),
            );
        };
        let size = match host_size(dir, rest) {
            Ok(s) => s,
            Err(why) => return refuse(why),
        };
        let detail = json!({"artifact": path, "bytes": size, "max_size": self.max_size});
        if size > self.max_size {
            // the human approves this size; the server copies no more
            (
                Decision::approve(Reason::ArtifactLarge, "artifacts.max_size"),
                detail,
                Some(size),
            )
        } else {
            (
                Decision::allow(Reason::ToolDefault, source),
                detail,
                Some(size),
            )
        }
    }
}

/// The stricter of `prior` and `d`, with both details and every meta entry.
pub(crate) fn merge(
    prior: Option<ArgumentCheck>,
    d: Decision,
    detail: Value,
    meta: Vec<(String, Value)>,
) -> ArgumentCheck {
    match prior {
        None => ArgumentCheck {
            decision: d,
            detail,
            meta,
            arguments: None,
            measured: None,
        },
        Some(mut p) => {
            p.decision = p.decision.stricter(d);
            if let (Some(a), Some(b)) = (p.detail.as_object_mut(), detail.as_object()) {
                for (k, v) in b {
                    a.insert(k.clone(), v.clone());
                }
            } else if p.detail.is_null() {
                p.detail = detail;
            }
            p.meta.extend(meta);
            p
        }
    }
}

/// The size of regular file `rel` under host directory `dir`, resolved
/// beneath it without following any link (openat2(2): RESOLVE_BENEATH |
/// RESOLVE_NO_SYMLINKS): the sandbox made this tree, and a link in it may
/// point anywhere on the host.
fn host_size(dir: &Path, rel: &str) -> Result<u64, String> {
    let root: OwnedFd = rustix::fs::open(
        dir,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("{}: {e}", dir.display()))?;
    let fd = rustix::fs::openat2(
        &root,
        rel,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|e| format!("{rel}: {e} (links are not followed)"))?;
    let st = rustix::fs::fstat(&fd).map_err(|e| format!("{rel}: {e}"))?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(format!("{rel}: not a regular file"));
    }
    Ok(u64::try_from(st.st_size).unwrap_or(u64::MAX))
}

/// Checks a `--builtin` name.
pub fn check_name(name: &str) -> anyhow::Result<()> {
    // the names `builtin =` in a serve config accepts, too
    let names = mcpbox_policy::serve::BUILTINS;
    if names.contains(&name) {
        Ok(())
    } else {
        anyhow::bail!(
            "--builtin {name}: no such built-in server (there is: {})",
            names.join(", ")
        )
    }
}
