//! Where mcpbox keeps its state (audit log, tool pins), and ids; the
//! state directory kept private (0700, nothing in it readable by another
//! user); mcpbox's own locations, which no sandbox may mount.

use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use anyhow::{bail, Context};
use mcpbox_audit::SqliteStore;
use mcpbox_policy::Policy;

/// Where the state directory is: [`configured_state_dir`], absolute and
/// with every symlink and `..` resolved (as far as it exists: one not
/// made yet is where it will be made); once [`ensure_private`] has
/// checked it, that directory, for the rest of the process.
///
/// Resolved because the kernel's names are: /proc/self/mountinfo names a
/// mount point by its resolved path, and a workspace's volume
/// (`<state>/sandboxes/<id>/volume`) is recognized by comparing the two:
/// reused when it is mounted, unmounted before its workspace is removed.
/// A state directory named through a symlink, a relative path or `..`
/// never matched, and as root the same image was mounted a second time
/// over the first, and a workspace was emptied through its live mount.
pub fn state_dir() -> PathBuf {
    if let Some(dir) = CHECKED.get() {
        return dir.clone();
    }
    resolve(&configured_state_dir())
}

/// The state directory as [`ensure_private`] checked it (canonical).
/// Kept, not resolved again: a symlink on the way to it, changed later by
/// whoever can write where that symlink lives, cannot move mcpbox's pins,
/// audit log and workspaces to a directory that was never checked.
static CHECKED: OnceLock<PathBuf> = OnceLock::new();

/// `$MCPBOX_STATE_DIR`, else `$XDG_STATE_HOME/mcpbox`, else
/// `$HOME/.local/state/mcpbox`, else `/var/lib/mcpbox`, as given.
fn configured_state_dir() -> PathBuf {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(d) = var("MCPBOX_STATE_DIR") {
        return d;
    }
    if let Some(d) = var("XDG_STATE_HOME") {
        return d.join("mcpbox");
    }
    if let Some(h) = var("HOME") {
        return h.join(".local/state/mcpbox");
    }
    PathBuf::from("/var/lib/mcpbox")
}

/// Makes the state directory private before anything is written in it
/// (docs/threat-model.md, "Local users"): created 0700 when missing; when
/// it exists it must be this user's, and it is tightened: the directory
/// and everything in it lose every group and other permission bit (a
/// 0755 directory becomes 0700, a 0644 pin file 0600). A state directory
/// given through a symlink is the directory it names: that directory is
/// the one checked, and the one used from then on ([`state_dir`]).
/// Symlinks inside it are not followed. Below a sandbox's workspace
/// (`sandboxes/<id>/`, and `builtin/<id>/` of `run --builtin`) and a
/// runner's cache (`cache/<policy>/<runner>/`) only that folder itself is
/// tightened: what is in it is the sandbox's, with the modes its user
/// needs, and the 0700 folders above keep every other user out.
/// Returns the directory, canonical.
pub fn ensure_private() -> anyhow::Result<PathBuf> {
    let dir = checked_state_dir(&configured_state_dir())?;
    let kept = CHECKED.get_or_init(|| dir.clone());
    if *kept != dir {
        bail!(
            "the state directory is {} now, and was {} when this mcpbox checked it: a symlink \
             on its path was changed meanwhile; nothing was written in it, run mcpbox again",
            dir.display(),
            kept.display()
        );
    }
    Ok(dir)
}

/// The state directory given as `given` (a symlink, relative, with
/// `..`), resolved, made private by [`make_private`] and returned
/// canonical. Resolved first, so that the ownership check and the
/// tightening are of the directory itself, found through no link; and
/// canonicalized after, as it exists now, to say that it is still that
/// directory (a symlink on the way changed between the two is refused,
/// not followed to wherever it points now).
fn checked_state_dir(given: &Path) -> anyhow::Result<PathBuf> {
    let dir = resolve(given);
    make_private(&dir)?;
    let real = std::fs::canonicalize(&dir).with_context(|| {
        format!(
            "resolving the state directory {} (given as {})",
            dir.display(),
            given.display()
        )
    })?;
    if real != dir {
        bail!(
            "the state directory {} resolves to {} since it was checked: a symlink on its path \
             was changed meanwhile; nothing was written in it, run mcpbox again",
            dir.display(),
            real.display()
        );
    }
    Ok(real)
}

/// [`ensure_private`] for the state directory `dir`.
pub fn make_private(dir: &Path) -> anyhow::Result<()> {
    // the parents (`~/.local/state`) are the user's, made as usual
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
    }
    // a state directory given as a symlink is the directory it names
    let meta = std::fs::metadata(dir)
        .with_context(|| format!("checking the state directory {}", dir.display()))?;
    if !meta.is_dir() {
        bail!(
            "the state directory {} is not a directory: move it aside, or set MCPBOX_STATE_DIR",
            dir.display()
        );
    }
    let me = crate::preflight::uid();
    if meta.uid() != me {
        bail!(
            "the state directory {dir} belongs to uid {owner}, not to you (uid {me}): whoever owns \
             it can read and change mcpbox's pins, audit log and keys. Fix it with \
             `sudo chown -R {me} {dir} && chmod -R go-rwx {dir}`, or set MCPBOX_STATE_DIR to a \
             directory of your own",
            dir = dir.display(),
            owner = meta.uid(),
        );
    }
    let mut seen = 0usize;
    tighten(dir, dir, &mut seen)
}

/// How deep and how wide [`tighten`] walks: the state directory's own
/// files are a few levels deep (`pins/<policy>/<server>.json`,
/// `wrap/<id>/…`); a tree past these bounds is not mcpbox's.
const TIGHTEN_DEPTH: usize = 6;
const TIGHTEN_ENTRIES: usize = 100_000;

/// Removes group and other bits from `path` and, for a directory, from
/// everything below it (see [`ensure_private`] for where it stops).
///
/// Another mcpbox may be writing meanwhile (SQLite's `-journal`, a pin
/// file's `.tmp`, a workspace being removed): what vanishes is skipped.
/// What belongs to another user was put there by someone else (the folder
/// was open to them) and is refused with the command that fixes it; the
/// chmod is of a path (there is no lchmod), which only ever removes bits.
fn tighten(root: &Path, path: &Path, seen: &mut usize) -> anyhow::Result<()> {
    let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if gone(&e) => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("checking {}", path.display())),
    };
    if meta.file_type().is_symlink() && path != root {
        return Ok(());
    }
    // the root may be a symlink to the directory: chmod follows it
    let meta = if path == root {
        std::fs::metadata(path).with_context(|| format!("checking {}", path.display()))?
    } else {
        meta
    };
    let me = crate::preflight::uid();
    if meta.uid() != me {
        bail!(
            "{} in the state directory belongs to uid {}, not to you (uid {me}): fix it with \
             `sudo chown -R {me} {root} && chmod -R go-rwx {root}` after checking what it is",
            path.display(),
            meta.uid(),
            root = root.display(),
        );
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 || (meta.is_dir() && mode & 0o700 != 0o700) {
        // a directory stays usable by its owner; a file keeps its owner
        // bits (an executable in a cache stays executable); set-id bits go
        let tight = if meta.is_dir() { 0o700 } else { mode & 0o700 };
        match std::fs::set_permissions(path, std::fs::Permissions::from_mode(tight)) {
            Ok(()) => {}
            Err(e) if gone(&e) => return Ok(()),
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "{} is readable by other users and cannot be made private: fix it with \
                         `chmod -R go-rwx {}`",
                        path.display(),
                        root.display(),
                    )
                })
            }
        }
    }
    if !meta.is_dir() {
        return Ok(());
    }
    let rel = path.strip_prefix(root).unwrap_or(Path::new(""));
    let depth = rel.components().count();
    let first = rel.components().next().map(|c| c.as_os_str());
    // a workspace (`sandboxes/<id>`), a `run --builtin` working space
    // (`builtin/<id>`) or a runner's cache (`cache/<policy>/<runner>`):
    // the folder, not what the sandbox put in it
    let sandbox_owned = match first.and_then(|f| f.to_str()) {
        Some("sandboxes" | "builtin") => depth >= 2,
        Some("cache") => depth >= 3,
        _ => false,
    };
    if sandbox_owned || depth >= TIGHTEN_DEPTH {
        return Ok(());
    }
    let entries = match std::fs::read_dir(path) {
        Ok(e) => e,
        Err(e) if gone(&e) => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    for entry in entries {
        let entry = entry.with_context(|| format!("reading {}", path.display()))?;
        *seen += 1;
        if *seen > TIGHTEN_ENTRIES {
            return Ok(());
        }
        tighten(root, &entry.path(), seen)?;
    }
    Ok(())
}

/// Creates `dir` and its missing parents 0700 (the umask cannot loosen
/// it: the mode is set again), for folders under the state directory.
pub fn private_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

/// mcpbox's own locations, as credential locations: what no sandbox may
/// mount, be given as input or output, start from as a template, or
/// have generated for it by `wrap` (as, inside, or above any of them).
/// The state directory holds the pins, the secrets store, the audit key,
/// the sandbox registry, the workspaces and the caches; the audit
/// database of each policy given may be anywhere (`[audit] path`), with
/// SQLite's files beside it. Each path is resolved as far as it exists
/// (symlinks, `..`), so a comparison with a canonical path holds.
pub fn private_locations<'a>(
    policies: impl IntoIterator<Item = &'a Policy>,
) -> Vec<(&'static str, PathBuf)> {
    let state = resolve(&state_dir());
    let mut out = vec![("mcpbox's state directory", state.clone())];
    for policy in policies {
        let db = resolve(&audit_path(policy));
        if db.starts_with(&state) {
            continue;
        }
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let mut p = db.clone().into_os_string();
            p.push(suffix);
            let p = ("mcpbox's audit database", PathBuf::from(p));
            if !out.contains(&p) {
                out.push(p);
            }
        }
    }
    out
}

/// The first of `locations` that `real` (a canonical path) is, is inside
/// of, or holds.
pub fn touches_private<'a>(
    real: &Path,
    locations: &'a [(&'static str, PathBuf)],
) -> Option<&'a (&'static str, PathBuf)> {
    locations
        .iter()
        .find(|(_, at)| real.starts_with(at) || at.starts_with(real))
}

/// Refuses a template base directory that is, is inside, or holds one of
/// mcpbox's own locations: it is copied whole into every workspace.
pub fn refuse_private_base(base: &Path, private: &[(&'static str, PathBuf)]) -> anyhow::Result<()> {
    let real = resolve(base);
    if let Some((kind, at)) = touches_private(&real, private) {
        bail!(
            "{} is, is inside, or holds {kind} ({}); refusing to copy it into sandboxes: \
             use a directory that neither holds nor is inside mcpbox's state",
            base.display(),
            at.display()
        );
    }
    Ok(())
}

/// `path` made absolute with its longest existing prefix canonicalized
/// and the rest (which does not exist yet) appended: where it is or will
/// be, whatever symlinks or `..` it was written with.
pub fn resolve(path: &Path) -> PathBuf {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let parts: Vec<std::path::Component<'_>> = abs.components().collect();
    // the longest prefix that exists, canonicalized; then the rest
    for split in (1..=parts.len()).rev() {
        let prefix: PathBuf = parts[..split].iter().collect();
        let Ok(mut out) = std::fs::canonicalize(&prefix) else {
            continue;
        };
        for part in &parts[split..] {
            match part {
                std::path::Component::ParentDir => {
                    out.pop();
                }
                std::path::Component::Normal(n) => out.push(n),
                _ => {}
            }
        }
        return out;
    }
    abs
}

/// The audit database for `policy`: its `[audit] path`, else the state dir's.
pub fn audit_path(policy: &Policy) -> PathBuf {
    policy
        .audit
        .path
        .clone()
        .unwrap_or_else(|| state_dir().join("audit.db"))
}

/// Opens (creating) the audit store of `policy`, with its durability, and
/// applies its retention.
pub fn open_audit(policy: &Policy) -> anyhow::Result<Arc<SqliteStore>> {
    let store = open_store(policy)?;
    retain(&store, &policy.audit);
    Ok(Arc::new(store))
}

/// `mcpbox audit --prune`: opens the policy's log and applies its
/// retention, saying what went (a failure is an error here, not a warning).
pub fn prune_audit(policy: &Policy) -> anyhow::Result<Option<mcpbox_audit::Pruned>> {
    let store = open_store(policy)?;
    retained(&store, &policy.audit)
        .with_context(|| format!("pruning {}", audit_path(policy).display()))
}

/// The policy's audit store, with its durability and the head's key.
fn open_store(policy: &Policy) -> anyhow::Result<SqliteStore> {
    let path = audit_path(policy);
    let durability = match policy.audit.durability {
        mcpbox_policy::Durability::Process => mcpbox_audit::Durability::Process,
        mcpbox_policy::Durability::Machine => mcpbox_audit::Durability::Machine,
    };
    let store = SqliteStore::open_with(&path, durability).with_context(|| {
        format!(
            "opening the audit log {} (nothing was started; if the file is damaged, move it \
             aside and keep it for inspection, and the next run starts a new log: mcpbox \
             never recreates one itself)",
            path.display()
        )
    })?;
    Ok(store.with_head_key(audit_key()?))
}

/// The policy's retention (`[audit] keep`, `max_size`), applied as a
/// session opens the log (and by [`keep_retaining`] while it stays open);
/// what it removed is itself a record. A failure is logged, never fatal:
/// retention must not stop a session that the log can still record.
fn retain(store: &SqliteStore, audit: &mcpbox_policy::Audit) {
    if let Err(e) = retained(store, audit) {
        tracing::warn!("audit retention: {e}");
    }
}

/// [`retain`], saying what it removed.
fn retained(
    store: &SqliteStore,
    audit: &mcpbox_policy::Audit,
) -> anyhow::Result<Option<mcpbox_audit::Pruned>> {
    if !audit.retains() {
        return Ok(None);
    }
    let keep_ms = audit
        .keep
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let older_than = keep_ms.map(|k| mcpbox_audit::now_ms().saturating_sub(k));
    let pruned = store.prune(older_than, audit.max_size)?;
    if let Some(p) = &pruned {
        use mcpbox_audit::Sink;
        store.record(mcpbox_audit::Event {
            kind: Some(mcpbox_audit::Kind::Retention),
            detail: serde_json::json!({
                "records": p.records,
                "through_seq": p.through_seq,
                "older_than_ms": older_than,
                "max_bytes": audit.max_size,
            }),
            ..mcpbox_audit::Event::default()
        });
    }
    Ok(pruned)
}

/// Applies the policy's retention again and again while a long-lived
/// process (`run`, `serve`) holds the log open, not only as it opened it:
/// every half of `keep`, between a second and ten minutes (ten minutes for
/// a size alone). A thread of its own, so never for `exec`, which forks
/// its sandbox itself and must stay single-threaded; nothing to do without
/// a retention.
pub fn keep_retaining(store: &Arc<SqliteStore>, audit: &mcpbox_policy::Audit) {
    if !audit.retains() {
        return;
    }
    let every = audit.keep.map_or(RETAIN_MAX, |k| {
        (k / 2).clamp(std::time::Duration::from_secs(1), RETAIN_MAX)
    });
    let store = Arc::downgrade(store);
    let audit = audit.clone();
    let spawned = std::thread::Builder::new()
        .name("audit-retention".into())
        .spawn(move || loop {
            std::thread::sleep(every);
            // the log closed (its last holder gone): nothing left to keep
            let Some(store) = store.upgrade() else { return };
            retain(&store, &audit);
        });
    if let Err(e) = spawned {
        tracing::warn!("audit retention is applied only as sessions open the log: {e}");
    }
}

/// The longest wait between two retentions of an open log.
const RETAIN_MAX: std::time::Duration = std::time::Duration::from_secs(600);

/// Where the key of the audit log's signed head is kept: in the state
/// directory, beside nothing the sandbox sees, whatever `[audit] path` says.
pub fn audit_key_path() -> PathBuf {
    state_dir().join("audit.key")
}

/// The key that signs every audit log's head (created on first use, 0600):
/// with it `mcpbox audit --verify` catches a log whose newest records were
/// deleted and whose head was rewritten to match.
fn audit_key() -> anyhow::Result<mcpbox_audit::HeadKey> {
    let path = audit_key_path();
    mcpbox_audit::HeadKey::load_or_create(&path)
        .with_context(|| format!("the audit log's key {}", path.display()))
}

/// Opens (creating) the state directory's audit store, for records that
/// belong to no one policy (the HTTP gateway's refused requests).
pub fn open_default_audit() -> anyhow::Result<Arc<SqliteStore>> {
    let path = state_dir().join("audit.db");
    let store = SqliteStore::open_with(&path, mcpbox_audit::Durability::Process)
        .with_context(|| format!("opening the audit log {}", path.display()))?;
    Ok(Arc::new(store.with_head_key(audit_key()?)))
}

/// A fresh random id (12 hex digits) for a sandbox.
pub fn new_id() -> String {
    let mut bytes = [0u8; 6];
    let filled = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    if filled.is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        bytes.copy_from_slice(&(t as u64 ^ u64::from(std::process::id())).to_le_bytes()[..6]);
    }
    mcpbox_policy::hex::encode(&bytes)
}

/// The workspace's id: a stable digest of the host directories it exposes
/// (input, output, mounts), so records of the same workspace group
/// together across sandboxes. 12 hex digits of FNV-1a; an id, not a secret.
pub fn workspace_id(spec: &mcpbox_sandbox::Spec) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |bytes: &[u8]| {
        for b in bytes.iter().chain(b"\0") {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    use std::os::unix::ffi::OsStrExt;
    for p in spec
        .input
        .iter()
        .chain(spec.output.iter())
        .chain(spec.mounts.iter().map(|m| &m.host))
    {
        feed(p.as_os_str().as_bytes());
    }
    format!("{:012x}", h & 0xffff_ffff_ffff)
}

/// Creates lock file `path` (new, 0600, never through a link) and holds an
/// exclusive flock(2) on it for as long as the returned file lives: how a
/// proxy directory or a gVisor container says "my mcpbox runs". Liveness
/// is never read from a pid: mcpbox may run in a pid namespace of its own
/// (a container, a test's `unshare --pid --mount-proc`), where another
/// namespace's pids mean nothing (a live gateway's proxy socket was once
/// removed that way).
pub fn hold_lock(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive)?;
    Ok(file)
}

/// Whether nobody holds lock file `path` ([`hold_lock`]), or it does not
/// exist; a lock that cannot be opened is taken as held.
pub fn lock_is_free(path: &std::path::Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
    {
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
        Ok(lock) => {
            rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_ok()
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    fn chmod(p: &Path, m: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    }

    #[test]
    fn a_path_is_resolved_through_symlinks_and_dotdot_as_far_as_it_exists() {
        let t = tempfile::tempdir().unwrap();
        let real = std::fs::canonicalize(t.path()).unwrap();
        std::fs::create_dir(real.join("state")).unwrap();
        std::os::unix::fs::symlink(real.join("state"), real.join("link")).unwrap();
        assert_eq!(resolve(&real.join("link")), real.join("state"));
        assert_eq!(resolve(&real.join("link/../state/x")), real.join("state/x"));
        // not there yet: the rest is appended, `..` taken lexically
        assert_eq!(
            resolve(&real.join("link/new/../audit.db")),
            real.join("state/audit.db")
        );
    }

    /// A state directory named through a symlink or `..` is used by the
    /// path /proc/self/mountinfo would show for it: a workspace volume's
    /// mount point under it is then recognized, never mounted twice.
    #[test]
    fn a_state_directory_given_through_a_symlink_or_dotdot_is_used_by_its_resolved_path() {
        let t = tempfile::tempdir().unwrap();
        let real = std::fs::canonicalize(t.path()).unwrap();
        std::fs::create_dir(real.join("state")).unwrap();
        chmod(&real.join("state"), 0o755);
        std::os::unix::fs::symlink(real.join("state"), real.join("link")).unwrap();
        assert_eq!(
            checked_state_dir(&real.join("link")).unwrap(),
            real.join("state")
        );
        // checked and tightened is the directory, not the link
        assert_eq!(mode(&real.join("state")), 0o700);
        assert!(std::fs::symlink_metadata(real.join("link"))
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(
            checked_state_dir(&real.join("link/../state")).unwrap(),
            real.join("state")
        );
        // one not made yet is made where it resolves to, 0700
        let fresh = checked_state_dir(&real.join("link/new/../fresh")).unwrap();
        assert_eq!(fresh, real.join("state/fresh"));
        assert_eq!(mode(&fresh), 0o700);
        assert!(!real.join("state/new").exists());
    }

    /// A symlink must not let mcpbox keep its state in a directory of
    /// another user: the check is of the directory the link names.
    #[test]
    fn a_symlink_to_a_directory_of_another_user_is_refused_as_the_state_directory() {
        let t = tempfile::tempdir().unwrap();
        let theirs = if crate::preflight::is_root() {
            let d = t.path().join("theirs");
            std::fs::create_dir(&d).unwrap();
            std::os::unix::fs::chown(&d, Some(65534), None).unwrap();
            d
        } else {
            // rootless: a directory root owns, which this user cannot
            // change whatever the check says
            let d = std::env::temp_dir();
            if std::fs::metadata(&d).unwrap().uid() == crate::preflight::uid() {
                eprintln!("skipped: {} is this user's own", d.display());
                return;
            }
            d
        };
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&theirs, &link).unwrap();
        let e = format!("{:#}", checked_state_dir(&link).unwrap_err());
        assert!(e.contains("belongs to uid") && e.contains("chown"), "{e}");
    }

    #[test]
    fn a_location_is_touched_by_itself_what_is_inside_and_what_is_above_never_beside() {
        let locs = vec![("s", PathBuf::from("/a/state"))];
        for hit in ["/a/state", "/a/state/pins", "/a", "/"] {
            assert!(touches_private(Path::new(hit), &locs).is_some(), "{hit}");
        }
        for miss in ["/a/states", "/a/stat", "/b", "/a/input"] {
            assert!(touches_private(Path::new(miss), &locs).is_none(), "{miss}");
        }
    }

    #[test]
    fn a_loose_state_directory_is_tightened_but_a_sandboxs_folders_are_left_alone() {
        let t = tempfile::tempdir().unwrap();
        let state = t.path().join("state");
        let pins = state.join("pins/p");
        let input = state.join("sandboxes/abc/input");
        let cache = state.join("cache/p/npm/bin");
        for d in [&pins, &input, &cache] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(pins.join("x.json"), "{}").unwrap();
        std::fs::write(input.join("f"), "").unwrap();
        std::fs::write(cache.join("tool"), "").unwrap();
        for (p, m) in [
            (state.clone(), 0o755),
            (pins.clone(), 0o777),
            (pins.join("x.json"), 0o644),
            (input.clone(), 0o755),
            (input.join("f"), 0o644),
            (state.join("sandboxes/abc"), 0o755),
            (cache.join("tool"), 0o755),
        ] {
            chmod(&p, m);
        }
        make_private(&state).unwrap();
        assert_eq!(mode(&state), 0o700);
        assert_eq!(mode(&pins), 0o700);
        assert_eq!(mode(&pins.join("x.json")), 0o600);
        assert_eq!(mode(&state.join("sandboxes")), 0o700);
        assert_eq!(mode(&state.join("sandboxes/abc")), 0o700);
        // what the sandbox's user needs stays, behind the 0700 folders
        assert_eq!(mode(&input), 0o755);
        assert_eq!(mode(&input.join("f")), 0o644);
        assert_eq!(mode(&cache.join("tool")), 0o755);
        // a new one is made 0700
        let fresh = t.path().join("fresh/state");
        make_private(&fresh).unwrap();
        assert_eq!(mode(&fresh), 0o700);
    }

    #[test]
    fn something_of_another_user_in_the_state_directory_is_refused() {
        if !crate::preflight::is_root() {
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let state = t.path().join("state");
        std::fs::create_dir_all(state.join("pins")).unwrap();
        std::fs::write(state.join("pins/planted.json"), "{}").unwrap();
        chmod(&state.join("pins/planted.json"), 0o600);
        std::os::unix::fs::chown(state.join("pins/planted.json"), Some(65534), None).unwrap();
        let e = make_private(&state).unwrap_err().to_string();
        assert!(
            e.contains("belongs to uid 65534") && e.contains("chown"),
            "{e}"
        );
    }
}
