//! From a policy to a sandbox [`Spec`]: the checks that need the host
//! (paths exist, symlinks resolved, credential locations refused, limits
//! enforceable here). The policy crate is pure; this is where I/O happens.
//! Every error names the policy file, line and key, and says what to do.

use std::ffi::OsString;
use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use mcpbox_policy::{credential_kind, Diagnostic, Policy};
use mcpbox_sandbox::{BindMount, Limits, Spec, Stdio};

/// A policy and where it came from.
pub struct Loaded {
    pub policy: Policy,
    /// The policy file; None for the embedded default.
    pub file: Option<PathBuf>,
    /// What runtime discovery mounted for the command (`runtime.rs`), for
    /// the `session_start` record; empty until it ran.
    pub runtime: serde_json::Value,
    /// The command as given, when runtime discovery ran it by another path
    /// (a bare name found on the caller's PATH): the server's identity for
    /// its pins stays the command the user wrote, whatever PATH held.
    pub argv: Option<Vec<OsString>>,
}

/// A preflight failure: a policy diagnostic, or a plain message.
#[derive(Debug)]
pub enum Error {
    Policy(Box<Diagnostic>),
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Policy(d) => write!(f, "{d}"),
            Error::Io { path, source } => {
                write!(f, "cannot read policy {}: {source}", path.display())
            }
        }
    }
}

impl std::error::Error for Error {}

/// Reads and parses the policy file, or returns the embedded default. A
/// path `preset:NAME` is a preset shipped in mcpbox, its relative paths
/// relative to the current directory; `DIR/preset:NAME` (a serve config's
/// `policy = "preset:NAME"`, resolved against the config's directory) has
/// them relative to DIR. A policy's `extends` is followed here, the one
/// place that reads policy files.
pub fn load(file: Option<&Path>) -> Result<Loaded, Error> {
    let Some(file) = file else {
        return Ok(Loaded {
            policy: mcpbox_policy::default_policy(),
            file: None,
            runtime: serde_json::Value::Null,
            argv: None,
        });
    };
    // Absolute, so relative paths in the policy resolve to absolute paths.
    let abs = std::path::absolute(file).unwrap_or_else(|_| file.to_path_buf());
    if let Some(name) = preset_name(file) {
        let base = abs.parent().map(Path::to_path_buf).unwrap_or_default();
        return load_preset(name, &base);
    }
    let text = std::fs::read_to_string(file).map_err(|source| Error::Io {
        path: file.to_path_buf(),
        source,
    })?;
    let policy = mcpbox_policy::parse_with(&text, &abs, &mut |p: &Path| std::fs::read_to_string(p))
        .map_err(|d| Error::Policy(Box::new(d)))?;
    Ok(Loaded {
        policy,
        file: Some(abs),
        runtime: serde_json::Value::Null,
        argv: None,
    })
}

/// The preset a policy path names: `preset:NAME`, or a last component
/// `preset:NAME` (no file is read for it).
fn preset_name(file: &Path) -> Option<&str> {
    let prefix = mcpbox_policy::preset::PREFIX;
    let whole = file.to_str().and_then(|s| s.strip_prefix(prefix));
    whole.or_else(|| {
        file.file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix(prefix))
    })
}

fn load_preset(name: &str, base: &Path) -> Result<Loaded, Error> {
    use mcpbox_policy::preset;
    let label = PathBuf::from(format!("{}{name}", preset::PREFIX));
    let Some(p) = preset::get(name) else {
        return Err(Error::Policy(Box::new(
            Diagnostic::new(
                &label,
                None,
                "",
                format!("unknown preset \"{}\"", name.escape_debug()),
            )
            .with_hint(format!(
                "known presets: {} (`mcpbox init --list` describes them)",
                preset::names()
            )),
        )));
    };
    let policy = p.parse(base).map_err(|d| Error::Policy(Box::new(d)))?;
    Ok(Loaded {
        policy,
        file: Some(label),
        runtime: serde_json::Value::Null,
        argv: None,
    })
}

impl Loaded {
    fn diag(&self, key: &str, message: impl Into<String>, hint: impl Into<String>) -> Error {
        let file = self
            .file
            .clone()
            .unwrap_or_else(|| PathBuf::from("<default policy>"));
        let location = self.policy.location(key);
        let mut message = message.into();
        // a key this file does not write came from what it extends
        if let (None, Some(base)) = (location, &self.policy.extends) {
            message = format!("{message} (inherited from extends = \"{base}\")");
        }
        Error::Policy(Box::new(
            Diagnostic::new(file, location, key, message).with_hint(hint),
        ))
    }

    /// Canonical host path for a directory or file the policy names: it must
    /// exist, and neither it nor anything below it may be a credential
    /// location unless `allow_credentials`; nor may it be, be inside or
    /// hold one of mcpbox's own locations (`private`), whatever the flag.
    fn host_path(
        &self,
        key: &str,
        path: &Path,
        want_dir: bool,
        allow_credentials: bool,
        private: &[(&'static str, PathBuf)],
    ) -> Result<PathBuf, Error> {
        let real = std::fs::canonicalize(path).map_err(|e| {
            self.diag(
                key,
                format!("{} does not exist or cannot be resolved: {e}", path.display()),
                if want_dir { "create the directory, or fix the path (relative paths are relative to the policy file)" } else { "fix the path (relative paths are relative to the policy file)" },
            )
        })?;
        if want_dir && !real.is_dir() {
            return Err(self.diag(
                key,
                format!("{} is not a directory", real.display()),
                "point it at a directory",
            ));
        }
        // mcpbox's own state (pins, audit key and log, secrets, sandbox
        // registry): a sandbox that sees it can read the audit key and
        // forge the log's head, read other sandboxes' workspaces, or
        // rewrite its own pins. Compared canonical to canonical, so a
        // symlink or `..` in either path changes nothing. Not overridable:
        // `dangerously_allow_credentials` is for the user's credentials.
        // the path as given, and what it resolves to when that differs
        let shown = if real == path {
            real.display().to_string()
        } else {
            format!("{} (resolves to {})", path.display(), real.display())
        };
        if let Some((kind, at)) = crate::state::touches_private(&real, private) {
            return Err(self.diag(
                key,
                format!(
                    "{shown} is, is inside, or holds {kind} ({}); refusing to give it to a sandbox",
                    at.display()
                ),
                "mount a directory that neither holds nor is inside mcpbox's state (move the \
                 state with MCPBOX_STATE_DIR, or the audit log with [audit] path, if they are \
                 under the directory you need)",
            ));
        }
        let found = credential_kind(&real)
            .map(|k| (k, real.clone()))
            .or_else(|| find_credentials_below(&real));
        if let Some((kind, at)) = found {
            if !allow_credentials {
                return Err(self.diag(
                    key,
                    format!("{shown} is or contains the credential location {kind} ({}); refusing to mount it", at.display()),
                    "mount a narrower directory that holds no credentials (for an extra mount, \
                     `dangerously_allow_credentials = true` overrides this after review)",
                ));
            }
            tracing::warn!(path = %real.display(), kind, "mounting a credential location: dangerously_allow_credentials is set");
        }
        Ok(real)
    }

    /// As root, the sandbox user is host uid 65534: it must be able to use
    /// the directories it is given, or the server fails in confusing ways.
    /// A directory of the caller (uid 0) is exempt: the launch shows it
    /// through an idmapped mount, where root's files are the sandbox
    /// user's, and gives this same error itself where the filesystem
    /// refuses one (`mcpbox_sandbox::idmapped_when_root`).
    fn check_root_access(&self, key: &str, path: &Path, write: bool) -> Result<(), Error> {
        if !is_root() || mcpbox_sandbox::idmapped_when_root(path) {
            return Ok(());
        }
        match mcpbox_sandbox::root_run_access_problem(path, write) {
            None => Ok(()),
            Some((problem, hint)) => Err(self.diag(key, problem, hint)),
        }
    }
}

/// How deep and how wide the search for credential locations below a
/// mount source goes: deep enough for a home directory copied elsewhere
/// (`u/.ssh`, `u/.config/gcloud`), bounded so a huge tree stays cheap.
const CREDENTIAL_SCAN_DEPTH: usize = 3;
const CREDENTIAL_SCAN_ENTRIES: usize = 20_000;

/// Looks below `dir` for a credential location (a `.ssh` folder, a
/// `.netrc` file...), breadth first, without following symlinks.
pub(crate) fn find_credentials_below(dir: &Path) -> Option<(&'static str, PathBuf)> {
    if !dir.is_dir() {
        return None;
    }
    let mut queue = std::collections::VecDeque::from([(dir.to_path_buf(), 0usize)]);
    let mut seen = 0usize;
    while let Some((d, depth)) = queue.pop_front() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            seen += 1;
            if seen > CREDENTIAL_SCAN_ENTRIES {
                return None;
            }
            let path = entry.path();
            // Only the names below `dir` count: `dir` itself was checked
            // with its full path already.
            let rel = path.strip_prefix(dir).unwrap_or(&path);
            if let Some(kind) = names_credential_location(rel) {
                return Some((kind, path));
            }
            let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
            if is_dir && depth + 1 < CREDENTIAL_SCAN_DEPTH {
                queue.push_back((path, depth + 1));
            }
        }
    }
    None
}

/// Whether the relative path contains a credential location's components.
pub(crate) fn names_credential_location(rel: &Path) -> Option<&'static str> {
    let parts: Vec<&str> = rel.iter().filter_map(|c| c.to_str()).collect();
    mcpbox_policy::CREDENTIAL_LOCATIONS
        .iter()
        .copied()
        .find(|loc| {
            let seq: Vec<&str> = loc.split('/').collect();
            parts.windows(seq.len()).any(|w| w == seq.as_slice())
        })
}

/// This process's effective uid, read without unsafe.
pub fn uid() -> u32 {
    std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(u32::MAX)
}

pub fn is_root() -> bool {
    mcpbox_sandbox::is_host_root()
}

/// The sandbox's environment: PATH, HOME, LANG, TERM, then the policy's
/// `env.pass` and `env.set` (set wins). Nothing else of ours leaks in.
pub fn environment(policy: &Policy) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = vec![
        ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
        ("HOME".into(), mcpbox_sandbox::HOME.into()),
        (
            "LANG".into(),
            std::env::var_os("LANG").unwrap_or_else(|| "C.UTF-8".into()),
        ),
    ];
    if let Some(term) = std::env::var_os("TERM") {
        env.push(("TERM".into(), term));
    }
    let mut put = |k: OsString, v: OsString| {
        env.retain(|(key, _)| *key != k);
        env.push((k, v));
    };
    for name in &policy.env.pass {
        if let Some(v) = std::env::var_os(name) {
            put(name.into(), v);
        }
    }
    for (k, v) in &policy.env.set {
        put(k.into(), v.into());
    }
    env
}

/// Checks the policy against the host and builds the sandbox spec.
pub fn spec(loaded: &Loaded, argv: Vec<OsString>, stdio: Stdio) -> Result<Spec, Error> {
    let private = crate::state::private_locations([&loaded.policy]);
    spec_among(loaded, argv, stdio, &private)
}

/// [`spec`], refusing every one of `private` (mcpbox's own locations, of
/// this policy and of any other the same process serves) as a mount.
pub fn spec_among(
    loaded: &Loaded,
    argv: Vec<OsString>,
    stdio: Stdio,
    private: &[(&'static str, PathBuf)],
) -> Result<Spec, Error> {
    let p = &loaded.policy;
    let fs = &p.filesystem;
    let input = match &fs.input {
        Some(dir) => {
            let real = loaded.host_path("filesystem.input", dir, true, false, private)?;
            loaded.check_root_access("filesystem.input", &real, false)?;
            Some(real)
        }
        None => None,
    };
    let output = match &fs.output {
        Some(dir) => {
            let real = loaded.host_path("filesystem.output", dir, true, false, private)?;
            loaded.check_root_access("filesystem.output", &real, true)?;
            Some(real)
        }
        None => None,
    };
    let mut mounts = Vec::new();
    for (i, m) in fs.mounts.iter().enumerate() {
        let key = format!("filesystem.mounts[{i}].host");
        let real = loaded.host_path(
            &key,
            &m.host,
            false,
            m.dangerously_allow_credentials,
            private,
        )?;
        let writable = m.mode == mcpbox_policy::MountMode::Rw;
        if real.is_dir() {
            loaded.check_root_access(&key, &real, writable)?;
        }
        mounts.push(BindMount {
            host: real,
            at: m.at.clone(),
            writable,
        });
    }
    let limits = Limits {
        memory: p.process.memory,
        pids: Some(u64::from(p.process.pids)),
        cpu: p.process.cpu,
        timeout: p.process.timeout,
    };
    // the gVisor tier's limits are runsc's cgroups, or rootless its
    // rlimits: check_gvisor says which
    if p.sandbox.isolation != mcpbox_policy::Isolation::Gvisor {
        check_limits(loaded, &limits)?;
    }
    let spec = Spec {
        argv,
        env: environment(p),
        input,
        output,
        tmp_size: fs.tmp,
        mounts,
        limits,
        allow_exec: p.process.allow_exec.clone(),
        allow_degraded: p.sandbox.dangerously_allow_degraded,
        stdio,
        egress: None,
        tmp_dir: None,
        cgroup_parent: None,
    };
    if p.sandbox.isolation == mcpbox_policy::Isolation::Gvisor {
        check_gvisor(loaded, &spec)?;
    }
    Ok(spec)
}

/// What the gVisor tier (crate::gvisor) cannot do as the namespaces tier
/// does, refused with the reason rather than run weaker (egress it does:
/// through the namespaces tier's own capture, `gvisor::network_holder`); and whether it
/// can run here at all (runsc found, root). `mcpbox check` also starts a
/// trivial gVisor sandbox (`gvisor::probe`).
fn check_gvisor(loaded: &Loaded, spec: &Spec) -> Result<(), Error> {
    let p = &loaded.policy;
    let other_tier = "or use isolation = \"namespaces\" (docs/isolation.md)";
    // Whether it can run here at all comes first.
    let runsc = match crate::gvisor::usable() {
        Ok(r) => r,
        Err(why) => {
            return Err(loaded.diag(
                "sandbox.isolation",
                format!("the gVisor tier cannot run here: {why}"),
                format!("install runsc, {other_tier}; `mcpbox doctor` says more"),
            ))
        }
    };
    if p.process.allow_exec.is_some() {
        return Err(loaded.diag(
            "process.allow_exec",
            "the gVisor tier does not enforce an exec allowlist: the namespaces tier does it \
             with Landlock and noexec mounts, which gVisor's kernel does not offer",
            format!("remove process.allow_exec, {other_tier}"),
        ));
    }
    if runsc.rootless {
        // runsc --rootless: no way into the egress namespace, no cgroup
        if !p.network.is_closed() {
            return Err(loaded.diag(
                "network",
                crate::gvisor::ROOTLESS_EGRESS,
                format!("run mcpbox as root, or remove the [network] rules, {other_tier}"),
            ));
        }
        let unbounded = [
            ("process.memory", p.process.memory.is_some()),
            ("process.cpu", p.process.cpu.is_some()),
        ];
        if let Some((key, _)) = unbounded.iter().find(|(_, set)| *set) {
            if !p.sandbox.dangerously_allow_degraded {
                return Err(loaded.diag(
                    key,
                    "rootless, runsc runs without cgroups (--ignore-cgroups): the sandbox's memory \
                     and CPU have no bound as a whole. With sandbox.dangerously_allow_degraded, \
                     memory becomes each process's address-space limit (RLIMIT_AS, counted by \
                     gVisor's kernel) and CPU has none",
                    format!(
                        "run mcpbox as root, or set sandbox.dangerously_allow_degraded = true, \
                         {other_tier}"
                    ),
                ));
            }
        }
        // the server is the caller inside (uid 0 of runsc's user
        // namespace): the caller's own access is the server's
        return Ok(());
    }
    // The server runs as nobody inside gVisor, and gVisor's checks see the
    // host's owners: no idmapped mount makes root's directories its own
    // (the namespaces tier's way), so every directory given must be usable
    // by nobody, root's too: readable, and writable where it is written.
    let given = spec
        .input
        .iter()
        .map(|i| ("filesystem.input".to_string(), i, false))
        .chain(
            spec.output
                .iter()
                .map(|o| ("filesystem.output".to_string(), o, true)),
        )
        .chain(
            spec.mounts
                .iter()
                .enumerate()
                .filter(|(_, m)| m.host.is_dir())
                .map(|(i, m)| (format!("filesystem.mounts[{i}].host"), &m.host, m.writable)),
        );
    for (key, dir, write) in given {
        if let Some((problem, hint)) = mcpbox_sandbox::root_run_access_problem(dir, write) {
            return Err(loaded.diag(&key, problem, hint));
        }
    }
    Ok(())
}

/// Refuses limits this host cannot enforce, before anything runs.
fn check_limits(loaded: &Loaded, limits: &Limits) -> Result<(), Error> {
    if loaded.policy.sandbox.dangerously_allow_degraded
        || (limits.memory.is_none() && limits.cpu.is_none())
    {
        return Ok(());
    }
    let layout = mcpbox_sandbox::cgroup::Layout::read();
    for (key, ctrl, set) in [
        (
            "process.memory",
            mcpbox_sandbox::cgroup::Controller::Memory,
            limits.memory.is_some(),
        ),
        (
            "process.cpu",
            mcpbox_sandbox::cgroup::Controller::Cpu,
            limits.cpu.is_some(),
        ),
    ] {
        if !set {
            continue;
        }
        if let Err(why) = layout.usable(ctrl) {
            return Err(loaded.diag(
                key,
                format!("this limit cannot be enforced here: {why}"),
                "run mcpbox as root or in a delegated cgroup v2 scope \
                 (`systemd-run --user --scope -p Delegate=yes mcpbox ...`), remove the limit, or set \
                 sandbox.dangerously_allow_degraded = true to accept rlimits instead (see `mcpbox doctor`)",
            ));
        }
    }
    Ok(())
}
