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

/// Restricts the calling process: read (and, without an allow list,
/// execute) below `readable`, everything below `writable`, device access
/// below /dev, and execute only for `allow_exec` when given.
pub fn restrict(
    readable: &[PathBuf],
    writable: &[PathBuf],
    allow_exec: Option<&[PathBuf]>,
) -> Result<Enforced, String> {
    let all = AccessFs::from_all(TARGET);
    let read_exec = AccessFs::from_read(TARGET);
    let read: BitFlags<AccessFs> = if allow_exec.is_some() {
        read_exec & !AccessFs::Execute
    } else {
        read_exec
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
    // Without an allow list, written files may be executed too (scripts in
    // tmp); with one, nothing writable is executable.
    let write: BitFlags<AccessFs> = if allow_exec.is_some() {
        all & !AccessFs::Execute
    } else {
        all
    };

    let status = Ruleset::default()
        .handle_access(all)
        .map_err(|e| e.to_string())?
        .create()
        .map_err(|e| e.to_string())?
        .add_rules(path_beneath_rules(readable, read))
        .map_err(|e| e.to_string())?
        // Listing directories reveals only what the mount namespace already
        // shows; without it `ls /` fails and confuses programs.
        .add_rules(path_beneath_rules([Path::new("/")], AccessFs::ReadDir))
        .map_err(|e| e.to_string())?
        .add_rules(path_beneath_rules([Path::new("/dev")], dev))
        .map_err(|e| e.to_string())?
        .add_rules(path_beneath_rules(writable, write))
        .map_err(|e| e.to_string())?
        .add_rules(path_beneath_rules(
            &exec_files,
            AccessFs::Execute | AccessFs::ReadFile,
        ))
        .map_err(|e| e.to_string())?
        .restrict_self()
        .map_err(|e| e.to_string())?;
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => Enforced::Fully,
        RulesetStatus::PartiallyEnforced => Enforced::Partially,
        RulesetStatus::NotEnforced => Enforced::Not,
    })
}

/// The degraded tier's ruleset: as [`restrict`] on host paths, plus (where
/// the kernel has them) no TCP bind or connect at all (ABI 4) and no signals
/// or abstract unix sockets outside the sandbox (ABI 6), standing in for the
/// missing network and pid namespaces.
pub fn restrict_degraded(
    readable: &[PathBuf],
    writable: &[PathBuf],
    allow_exec: Option<&[PathBuf]>,
) -> Result<Enforced, String> {
    let all = AccessFs::from_all(TARGET);
    let read_exec = AccessFs::from_read(TARGET);
    let read: BitFlags<AccessFs> = if allow_exec.is_some() {
        read_exec & !AccessFs::Execute
    } else {
        read_exec
    };
    let write: BitFlags<AccessFs> = if allow_exec.is_some() {
        all & !AccessFs::Execute
    } else {
        all
    };
    let dev = AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::ReadDir | AccessFs::IoctlDev;
    let exec_files: Vec<PathBuf> = allow_exec.map(|l| l.to_vec()).unwrap_or_default();
    let status = Ruleset::default()
        .handle_access(all)
        .map_err(|e| e.to_string())?
        .handle_access(AccessNet::from_all(ABI::V4))
        .map_err(|e| e.to_string())?
        .scope(Scope::AbstractUnixSocket | Scope::Signal)
        .map_err(|e| e.to_string())?
        .create()
        .map_err(|e| e.to_string())?
        .add_rules(path_beneath_rules(readable, read))
        .map_err(|e| e.to_string())?
        .add_rules(path_beneath_rules([Path::new("/dev")], dev))
        .map_err(|e| e.to_string())?
        .add_rules(path_beneath_rules(writable, write))
        .map_err(|e| e.to_string())?
        .add_rules(path_beneath_rules(
            &exec_files,
            AccessFs::Execute | AccessFs::ReadFile,
        ))
        .map_err(|e| e.to_string())?
        .restrict_self()
        .map_err(|e| e.to_string())?;
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => Enforced::Fully,
        RulesetStatus::PartiallyEnforced => Enforced::Partially,
        RulesetStatus::NotEnforced => Enforced::Not,
    })
}
