//! `mcpbox sandboxes ...` and `mcpbox artifacts ...`: the lifecycle of a
//! running `mcpbox serve`, over its control socket
//! (`<state>/control.sock`, 0600, the peer's uid checked by the server).
//! Paths given here are made absolute before they are sent: the gateway
//! resolves nothing against its own working directory.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand};
use mcpbox_lifecycle::artifacts::Approved;
use mcpbox_lifecycle::control::{self, Request};
use mcpbox_lifecycle::{render, Artifact, Exported, SandboxInfo, SnapshotInfo, Teardown};

use crate::state;

/// Options every lifecycle command takes.
#[derive(Debug, Args)]
pub struct Common {
    /// Print the result as JSON (`list`: an array of sandboxes with id,
    /// agent, server, task, state, workspace, idle_seconds, ...).
    #[arg(long, global = true)]
    json: bool,
    /// The state directory of the `mcpbox serve` to talk to (default:
    /// $MCPBOX_STATE_DIR, else the usual state directory).
    #[arg(long, global = true, value_name = "DIR")]
    state_dir: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum SandboxAction {
    /// Every sandbox, live or kept: id, agent, server, task, state, idle time.
    List,
    /// One sandbox in detail.
    Show { id: String },
    /// Freeze its processes (cgroup freezer); the next call thaws them.
    Pause { id: String },
    /// Thaw a paused sandbox, or start the servers of a stopped one.
    Resume { id: String },
    /// Write its workspace (output; with --tmp also tmp) to an archive
    /// with a manifest of digests.
    Snapshot {
        id: String,
        /// The archive to write (a .tar.gz).
        #[arg(long, short)]
        out: PathBuf,
        /// Include /workspace/tmp.
        #[arg(long)]
        tmp: bool,
        /// Also keep the memory of its running servers (the gVisor tier:
        /// `runsc checkpoint`); a sandbox restored from the archive
        /// resumes each of them where it was, on its first start.
        #[arg(long)]
        memory: bool,
    },
    /// Create the sandbox of AGENT on SERVER (and TASK) from an archive;
    /// refused when it exists, or when any entry of the archive is unsafe
    /// or does not match its manifest (nothing is written then).
    Restore {
        archive: PathBuf,
        #[arg(long)]
        agent: String,
        #[arg(long)]
        server: String,
        #[arg(long)]
        task: Option<String>,
    },
    /// Tear it down: sessions ended, artifacts exported, secrets revoked,
    /// processes, cgroups and workspace removed, checked from the host.
    Destroy {
        id: String,
        /// Export an artifact over `[artifacts] max_size` too: you, a
        /// human, approve PATH at the BYTES it was listed at (`artifacts
        /// list`, or the teardown's message); repeat for each. A file that
        /// grew since stays, as does any other: they keep the workspace.
        #[arg(long, value_name = "PATH=BYTES")]
        approve_large: Vec<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum ArtifactAction {
    /// The files of its output that match the policy's artifact patterns,
    /// and why any would not be exported.
    List { id: String },
    /// Copy out the exportable artifacts into DEST (new or empty).
    Export {
        id: String,
        /// Where to copy them.
        #[arg(long, short)]
        dest: PathBuf,
        /// Also export an artifact over `[artifacts] max_size`: you, a
        /// human, approve PATH at the BYTES `artifacts list` showed;
        /// repeat for each. A file that grew since is left out.
        #[arg(long, value_name = "PATH=BYTES")]
        approve_large: Vec<String>,
    },
}

fn socket(common: &Common) -> PathBuf {
    common
        .state_dir
        .clone()
        .unwrap_or_else(state::state_dir)
        .join("control.sock")
}

fn absolute(p: &Path) -> Result<PathBuf, String> {
    std::path::absolute(p).map_err(|e| format!("{}: {e}", p.display()))
}

/// Sends `req`; prints the result as JSON or with `human`.
fn call<T: serde::de::DeserializeOwned + serde::Serialize>(
    common: &Common,
    req: Request,
    human: impl Fn(&T) -> String,
) -> ExitCode {
    call_judged(common, req, human, |_| true)
}

/// [`call`], with the exit status 1 when `ok` says the result is a
/// failure (a teardown that left something behind).
fn call_judged<T: serde::de::DeserializeOwned + serde::Serialize>(
    common: &Common,
    req: Request,
    human: impl Fn(&T) -> String,
    ok: impl Fn(&T) -> bool,
) -> ExitCode {
    match control::call_as::<T>(&socket(common), &req) {
        Ok(v) => {
            if common.json {
                match serde_json::to_string_pretty(&v) {
                    Ok(s) => println!("{s}"),
                    Err(e) => {
                        eprintln!("mcpbox: {e}");
                        return ExitCode::from(1);
                    }
                }
            } else {
                print!("{}", human(&v));
            }
            if ok(&v) {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("mcpbox: {e}");
            ExitCode::from(1)
        }
    }
}

/// `--approve-large PATH=BYTES`, each.
fn approvals(args: &[String]) -> Result<Approved, String> {
    args.iter()
        .map(|a| mcpbox_lifecycle::artifacts::parse_approval(a))
        .map(|r| r.map_err(|e| format!("--approve-large {e}")))
        .collect()
}

fn bad(e: String) -> ExitCode {
    eprintln!("mcpbox: {e}");
    ExitCode::from(2)
}

pub fn sandboxes(action: SandboxAction, common: &Common) -> ExitCode {
    match action {
        SandboxAction::List => call(common, Request::List {}, |v: &Vec<SandboxInfo>| {
            render::sandboxes_table(v)
        }),
        SandboxAction::Show { id } => call(common, Request::Show { id }, render::sandbox_detail),
        // exit 1 when the sandbox is not paused at the answer (a call
        // woke it): `note` says why
        SandboxAction::Pause { id } => call_judged(
            common,
            Request::Pause { id },
            render::sandbox_detail,
            |s: &SandboxInfo| s.state == mcpbox_lifecycle::State::Paused,
        ),
        SandboxAction::Resume { id } => {
            call(common, Request::Resume { id }, render::sandbox_detail)
        }
        SandboxAction::Snapshot {
            id,
            out,
            tmp,
            memory,
        } => {
            let archive = match absolute(&out) {
                Ok(p) => p,
                Err(e) => return bad(e),
            };
            call(
                common,
                Request::Snapshot {
                    id,
                    archive,
                    include_tmp: tmp,
                    memory,
                },
                |s: &SnapshotInfo| render::snapshot(s),
            )
        }
        SandboxAction::Restore {
            archive,
            agent,
            server,
            task,
        } => {
            let archive = match absolute(&archive) {
                Ok(p) => p,
                Err(e) => return bad(e),
            };
            call(
                common,
                Request::Restore {
                    archive,
                    agent,
                    server,
                    task,
                },
                render::sandbox_detail,
            )
        }
        SandboxAction::Destroy { id, approve_large } => {
            let approve_large = match approvals(&approve_large) {
                Ok(a) => a,
                Err(e) => return bad(e),
            };
            call_judged(
                common,
                Request::Destroy { id, approve_large },
                render::teardown,
                Teardown::clean,
            )
        }
    }
}

pub fn artifacts(action: ArtifactAction, common: &Common) -> ExitCode {
    match action {
        ArtifactAction::List { id } => {
            call(common, Request::Artifacts { id }, |v: &Vec<Artifact>| {
                render::artifacts_table(v)
            })
        }
        ArtifactAction::Export {
            id,
            dest,
            approve_large,
        } => {
            let dest = match absolute(&dest) {
                Ok(p) => p,
                Err(e) => return bad(e),
            };
            let approve_large = match approvals(&approve_large) {
                Ok(a) => a,
                Err(e) => return bad(e),
            };
            call(
                common,
                Request::Export {
                    id,
                    dest,
                    approve_large,
                },
                |v: &Vec<Exported>| render::exported(v),
            )
        }
    }
}
