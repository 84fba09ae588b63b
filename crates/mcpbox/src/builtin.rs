//! The built-in sandbox server (`mcpbox run --builtin sandbox`,
//! `builtin = "sandbox"` under `mcpbox serve`): how it is started inside a
//! sandbox, and the host side of the gateway's checks of its tools'
//! arguments.
//!
//! The server is this binary (crates/builtin), bound read-only into the
//! sandbox at [`BIN_AT`] and run there as `mcpbox __builtin-sandbox CONFIG`.
//! Everything else is as for any server: the policy's sandbox, the relay,
//! the audit. The gateway adds what only it can check honestly; the rules
//! are the policy crate's ([`mcpbox_policy::BuiltinRules`], part of the one
//! call decision, `mcpbox_policy::call`): paths outside /workspace refused,
//! `exec`, `start_job` and `run_code` classified by `[commands]`,
//! `export_artifact` over `artifacts.max_size` held for a human. What they
//! need from the host is here: [`Checks::measure`] measures an artifact
//! through descriptors that never follow a link.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use anyhow::Context;
use mcpbox_policy::call::BUILTIN_ROOT as ROOT;
use mcpbox_policy::{BuiltinRules, Policy};
use mcpbox_sandbox::{BindMount, Spec};
use rustix::fs::{Mode, OFlags, ResolveFlags};

/// Where the binary is inside the sandbox.
pub const BIN_AT: &str = "/opt/mcpbox/bin/mcpbox";

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

    /// The policy crate's rules for the server.
    pub fn rules(&self) -> BuiltinRules {
        BuiltinRules {
            max_size: self.max_size,
        }
    }

    /// The size of the artifact at sandbox path `abs` (absolute and
    /// normalised, under /workspace) as the host sees it: a regular file
    /// under /workspace/input, output or tmp, no link followed.
    pub fn measure(&self, abs: &str) -> Result<u64, String> {
        let rel = abs.strip_prefix(ROOT).unwrap_or("").trim_start_matches('/');
        let (top, rest) = rel.split_once('/').unwrap_or((rel, ""));
        let dir = match top {
            "input" => self.workspace.input.as_deref(),
            "output" => self.workspace.output.as_deref(),
            "tmp" => self.workspace.tmp.as_deref(),
            _ => None,
        };
        let Some(dir) = dir.filter(|_| !rest.is_empty()) else {
            return Err(
                "not a file under /workspace/input, output or tmp that the host can see".into(),
            );
        };
        host_size(dir, rest)
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
