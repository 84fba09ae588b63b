//! Landlock: the second filesystem layer, enforced by the kernel on the
//! command itself (landlock(7)). The mount namespace decides what exists;
//! Landlock decides, for what exists, what may be read, written and
//! executed, so a mistake in one layer is not an escape.

use std::path::{Path, PathBuf};

use landlock::{
    path_beneath_rules, Access, AccessFs, AccessNet, BitFlags, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};

/// The highest ABI whose rights we ask for; older kernels get best effort
/// and the status says what was enforced.
const TARGET: ABI = ABI::V5;

/// Dynamic loaders that an allow-listed executable needs to start.
const LOADERS: &[&str] = &["/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1"];

/// How much of the ruleset the kernel enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enforced {
    Fully,
    Partially,
    Not,
}

/// Which tier a ruleset is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// Inside the full sandbox: the mount namespace already hides the host,
    /// so directory listing is allowed everywhere (it reveals only what the
    /// new root shows) and the network namespace does the network.
    Full,
    /// The degraded tier (no namespaces): no listing of the host's
    /// directories, no TCP bind or connect at all (ABI 4), and no signals
    /// or abstract unix sockets outside the sandbox (ABI 6), standing in for
    /// the missing network and pid namespaces.
    Degraded,
}

/// Restricts the calling process: read (and, without an allow list,
/// execute) below `readable`, everything below `writable`, device access
/// below /dev, and execute only for `allow_exec` (plus the dynamic loader)
/// when given. Older kernels get what their ABI has; the status says how
/// much was enforced.
pub fn restrict(
    tier: Tier,
    readable: &[PathBuf],
    writable: &[PathBuf],
    allow_exec: Option<&[PathBuf]>,
) -> Result<Enforced, String> {
    let all = AccessFs::from_all(TARGET);
    let read_exec = AccessFs::from_read(TARGET);
    let (read, write): (BitFlags<AccessFs>, BitFlags<AccessFs>) = match allow_exec {
        // With an allow list nothing else, and nothing writable, executes.
        Some(_) => (read_exec & !AccessFs::Execute, all & !AccessFs::Execute),
        // Without one, written files may be executed too (scripts in tmp).
        None => (read_exec, all),
    };
    let dev = AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::ReadDir | AccessFs::IoctlDev;
    let mut exec_files: Vec<PathBuf> = Vec::new();
    if let Some(list) = allow_exec {
        exec_files.extend(list.iter().cloned());
        for loader in LOADERS {
            if let Ok(real) = std::fs::canonicalize(loader) {
                exec_files.push(real);
            }
        }
    }
    let err = |e: landlock::RulesetError| e.to_string();
    let mut ruleset = Ruleset::default().handle_access(all).map_err(err)?;
    if tier == Tier::Degraded {
        ruleset = ruleset
            .handle_access(AccessNet::from_all(ABI::V4))
            .map_err(err)?
            .scope(Scope::AbstractUnixSocket | Scope::Signal)
            .map_err(err)?;
    }
    let mut created = ruleset.create().map_err(err)?;
    if tier == Tier::Full {
        created = created
            .add_rules(path_beneath_rules([Path::new("/")], AccessFs::ReadDir))
            .map_err(err)?;
    }
    let status = created
        .add_rules(path_beneath_rules(readable, read))
        .map_err(err)?
        .add_rules(path_beneath_rules([Path::new("/dev")], dev))
        .map_err(err)?
        .add_rules(path_beneath_rules(writable, write))
        .map_err(err)?
        .add_rules(path_beneath_rules(
            &exec_files,
            AccessFs::Execute | AccessFs::ReadFile,
        ))
        .map_err(err)?
        .restrict_self()
        .map_err(err)?;
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => Enforced::Fully,
        RulesetStatus::PartiallyEnforced => Enforced::Partially,
        RulesetStatus::NotEnforced => Enforced::Not,
    })
}
