//! What `wrap` keeps in the state directory, and how it writes: the
//! backup and manifest of each wrapped file (`<state>/wrap/<id>/`, 0700),
//! its generated policies (0600), its secrets (`<state>/secrets/`, one
//! 0600 file each, the directory 0700), and the host file itself, always
//! replaced atomically (a temporary file beside it, then rename) with its
//! own mode.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use sha2::{Digest, Sha256};

/// What one wrap writes besides the host file.
#[derive(Debug, Default)]
pub struct Plan {
    /// (file, policy text)
    pub policies: Vec<(PathBuf, String)>,
    /// (file, secret value)
    pub secrets: Vec<(PathBuf, String)>,
    /// Folders the wrapped servers write (a preset's output), made if
    /// missing and never removed (they hold the user's files).
    pub output_dirs: Vec<PathBuf>,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Manifest {
    /// The wrapped file (its real path).
    config: PathBuf,
    host: String,
    /// The file's permission bits before the wrap.
    mode: u32,
    /// SHA-256 of the file as `wrap` wrote it: `--undo` restores only over
    /// exactly that, unless forced.
    wrapped_sha256: String,
    /// Policies and secrets written, removed again by `--undo`.
    files: Vec<PathBuf>,
    /// SHA-256 of each generated policy as `wrap` wrote it: `--undo`
    /// deletes only a policy that is exactly that, unless forced (a policy
    /// the user edited is their work). Absent in a manifest of an older
    /// mcpbox: then nothing is compared.
    #[serde(default)]
    policies: Vec<(PathBuf, String)>,
}

#[derive(Debug)]
pub struct Store {
    /// `<state>/wrap/<id>`: the backup, the manifest, the policies.
    pub dir: PathBuf,
    secrets: PathBuf,
    id: String,
}

fn sha256_hex(bytes: &[u8]) -> String {
    mcpbox_policy::hex::encode(&Sha256::digest(bytes))
}

impl Store {
    /// The state of the host file at `real` (its canonical path).
    pub fn for_config(real: &Path) -> Store {
        use std::os::unix::ffi::OsStrExt;
        let id = sha256_hex(real.as_os_str().as_bytes())[..16].to_string();
        let state = crate::state::state_dir();
        Store {
            dir: state.join("wrap").join(&id),
            secrets: state.join("secrets"),
            id,
        }
    }

    pub fn manifest_path(&self) -> PathBuf {
        self.dir.join("manifest.json")
    }
    fn backup_path(&self) -> PathBuf {
        self.dir.join("original")
    }

    /// Where the secret `var` of the entry `entry` is kept.
    pub fn secret_path(&self, entry: &str, var: &str) -> PathBuf {
        // the policy refuses a variable that is not a valid env name, but
        // the path is made before that check: never a separator in it
        let var: String = var
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        self.secrets.join(format!("wrap-{}-{entry}-{var}", self.id))
    }

    /// Writes the backup, the policies, the secrets and the manifest, then
    /// replaces the host file. On any failure what was written is removed
    /// again and the host file is untouched.
    pub fn commit(
        &self,
        config: &Path,
        old: &str,
        new: &str,
        host: &str,
        plan: Plan,
    ) -> anyhow::Result<()> {
        let mode = std::fs::metadata(config)
            .with_context(|| format!("cannot read {}", config.display()))?
            .permissions()
            .mode()
            & 0o7777;
        let mut written: Vec<PathBuf> = Vec::new();
        let result = self.commit_steps(config, old, new, host, mode, plan, &mut written);
        if result.is_err() {
            for f in written.iter().rev() {
                let _ = std::fs::remove_file(f);
            }
            let _ = std::fs::remove_dir(&self.dir);
        }
        result
    }

    #[allow(clippy::too_many_arguments)]
    fn commit_steps(
        &self,
        config: &Path,
        old: &str,
        new: &str,
        host: &str,
        mode: u32,
        plan: Plan,
        written: &mut Vec<PathBuf>,
    ) -> anyhow::Result<()> {
        private_dir(self.dir.parent().unwrap_or(&self.dir))?;
        // create_dir, not _all: a second wrap racing this one fails here
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&self.dir)
            .with_context(|| format!("cannot create {}", self.dir.display()))?;
        // the backup holds the secrets the file held: 0600 like them
        write_new(&self.backup_path(), old.as_bytes(), 0o600, written)?;
        let mut files = Vec::new();
        if !plan.secrets.is_empty() {
            private_dir(&self.secrets)?;
        }
        for (path, value) in &plan.secrets {
            replace(path, value.as_bytes(), 0o600)?;
            written.push(path.clone());
            files.push(path.clone());
        }
        for dir in &plan.output_dirs {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create the output folder {}", dir.display()))?;
        }
        let mut policies = Vec::new();
        for (path, text) in &plan.policies {
            write_new(path, text.as_bytes(), 0o600, written)?;
            files.push(path.clone());
            policies.push((path.clone(), sha256_hex(text.as_bytes())));
        }
        let manifest = Manifest {
            config: config.to_path_buf(),
            host: host.to_string(),
            mode,
            wrapped_sha256: sha256_hex(new.as_bytes()),
            files,
            policies,
        };
        let json = serde_json::to_vec_pretty(&manifest)?;
        write_new(&self.manifest_path(), &json, 0o600, written)?;
        replace_unchanged(config, old.as_bytes(), new.as_bytes(), mode)
    }

    /// Restores the backup over `config` and removes what the wrap wrote;
    /// returns how many generated files were removed.
    pub fn undo(&self, config: &Path, force: bool) -> anyhow::Result<usize> {
        let manifest_path = self.manifest_path();
        let json = match std::fs::read(&manifest_path) {
            Ok(j) => j,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
                "no backup of {} from mcpbox wrap (looked in {}): nothing to undo",
                config.display(),
                self.dir.display()
            ),
            Err(e) => return Err(e).context(format!("cannot read {}", manifest_path.display())),
        };
        let manifest: Manifest = serde_json::from_slice(&json)
            .with_context(|| format!("{} is damaged", manifest_path.display()))?;
        let current = super::read_config(config)?;
        if sha256_hex(&current) != manifest.wrapped_sha256 && !force {
            bail!(
                "{} changed since mcpbox wrap wrote it, so restoring the original would lose \
                 those changes: the file was left as it is; undo them by hand, or pass --force \
                 to restore the original anyway",
                config.display()
            );
        }
        // a generated policy changed since (edited by hand, or replaced):
        // deleting it would lose that work, so nothing is done unless forced
        let edited: Vec<&PathBuf> = manifest
            .policies
            .iter()
            .filter(|(p, digest)| std::fs::read(p).is_ok_and(|b| sha256_hex(&b) != *digest))
            .map(|(p, _)| p)
            .collect();
        if !edited.is_empty() && !force {
            let names: Vec<String> = edited.iter().map(|p| p.display().to_string()).collect();
            bail!(
                "the generated {} {} changed since mcpbox wrap wrote {}, and undo would \
                 delete {}: nothing was restored or removed; copy what you want to keep, \
                 then run mcpbox wrap --undo --force {}",
                if names.len() == 1 {
                    "policy"
                } else {
                    "policies"
                },
                names.join(", "),
                if names.len() == 1 { "it" } else { "them" },
                if names.len() == 1 { "it" } else { "them" },
                config.display()
            );
        }
        for p in &edited {
            eprintln!(
                "mcpbox: removing {}, changed since the wrap (--force)",
                p.display()
            );
        }
        let original = std::fs::read(self.backup_path())
            .with_context(|| format!("cannot read the backup {}", self.backup_path().display()))?;
        replace_unchanged(config, &current, &original, manifest.mode)?;
        let mut removed = 0;
        for f in &manifest.files {
            if std::fs::remove_file(f).is_ok() {
                removed += 1;
            }
        }
        let _ = std::fs::remove_file(self.backup_path());
        let _ = std::fs::remove_file(&manifest_path);
        let _ = std::fs::remove_dir(&self.dir);
        Ok(removed)
    }
}

/// Makes `dir` (and its parents) with mode 0700, and checks an existing
/// one is a directory nobody else may read.
fn private_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() || meta.permissions().mode() & 0o077 != 0 {
        bail!(
            "{} must be a directory only its owner can use (chmod 700 it)",
            dir.display()
        );
    }
    Ok(())
}

/// Creates `path` (it must not exist) with `mode` and `bytes`.
fn write_new(
    path: &Path,
    bytes: &[u8],
    mode: u32,
    written: &mut Vec<PathBuf>,
) -> anyhow::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    written.push(path.to_path_buf());
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("cannot write {}", path.display()))
}

/// Replaces `path` with `bytes` atomically: a new file beside it with
/// `mode` (set explicitly: the umask does not apply), then rename. A reader
/// sees the old file or the new one, never a part.
fn replace(path: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    replace_if(path, None, bytes, mode)
}

/// [`replace`] of a host's config, which must still hold `expected` (what
/// was read and decided on) when the new file is ready to be renamed over
/// it: a host rewrites its own config (a settings screen; Claude Code's
/// `~/.claude.json` all the time), and a write of its between our read and
/// our rename would be lost without a word. Then nothing is replaced, and
/// the error says to run the command again. (A write in the microseconds
/// between this last look and the rename is still lost: the hosts share
/// no lock with us.)
fn replace_unchanged(path: &Path, expected: &[u8], bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    replace_if(path, Some(expected), bytes, mode)
}

fn replace_if(path: &Path, expected: Option<&[u8]>, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.mcpbox-wrap.{}", std::process::id()));
    let result = (|| -> anyhow::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.sync_all()?;
        if let Some(expected) = expected {
            if super::read_config(path)? != expected {
                bail!(
                    "{} changed while mcpbox wrap was working on it (its host wrote it?): \
                     nothing was replaced; run the same command again",
                    path.display()
                );
            }
        }
        std::fs::rename(&tmp, path)?;
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.with_context(|| format!("cannot write {}", path.display()))
}

/// File names for entries: `A-Z a-z 0-9 . _ -` (the rest `-`), not
/// starting with `.`, at most 64, and each used once.
#[derive(Debug, Default)]
pub struct Names(Vec<String>);

impl Names {
    pub fn unique(&mut self, name: &str) -> String {
        let mut base: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "._-".contains(c) {
                    c
                } else {
                    '-'
                }
            })
            .take(60)
            .collect();
        if base.is_empty() || base.starts_with('.') {
            base.insert(0, 's');
        }
        let mut candidate = base.clone();
        let mut n = 2;
        while self.0.contains(&candidate) {
            candidate = format!("{base}-{n}");
            n += 1;
        }
        self.0.push(candidate.clone());
        candidate
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host wrote its config after wrap read it: the new file is not
    /// renamed over the host's write, nothing is left beside it, and the
    /// error says to run the command again.
    #[test]
    fn a_host_write_during_wrap_is_not_overwritten() {
        let t = tempfile::tempdir().unwrap();
        let config = t.path().join("mcp.json");
        std::fs::write(&config, "read by wrap").unwrap();
        // the host writes between wrap's read and its rename
        std::fs::write(&config, "written by the host").unwrap();
        let err = replace_unchanged(&config, b"read by wrap", b"wrapped", 0o644).unwrap_err();
        assert!(
            format!("{err:#}").contains("run the same command again"),
            "{err:#}"
        );
        assert_eq!(std::fs::read(&config).unwrap(), b"written by the host");
        let left: Vec<_> = std::fs::read_dir(t.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "a temporary file was left: {left:?}");
        // unchanged since the read: replaced
        replace_unchanged(&config, b"written by the host", b"wrapped", 0o644).unwrap();
        assert_eq!(std::fs::read(&config).unwrap(), b"wrapped");
    }

    #[test]
    fn names_are_safe_and_unique() {
        let mut n = Names::default();
        assert_eq!(n.unique("fs"), "fs");
        assert_eq!(n.unique("f/s"), "f-s");
        assert_eq!(n.unique("f s"), "f-s-2");
        assert_eq!(n.unique("../x"), "s..-x");
        assert_eq!(n.unique(""), "s");
    }
}
