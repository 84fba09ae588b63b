//! The programs a learning session's sandboxes execute
//! (`mcpbox_sandbox::exec_watch`), gathered for the generator: only
//! `learn` turns it on ([`enable`]), so `run` and `serve` never place the
//! marks. Each sandbox start (the first, and a restart after a secret's
//! TTL) gets a watch and a thread that drains it into the one log of the
//! session, each program with the time it was first seen (the generator
//! gives it to the tool call whose span holds that time).
//!
//! Which mounts: as root, the system directories (`/usr`, and `/bin` etc.
//! where they are directories of their own), `/workspace/input` and every
//! read-only mount (the runtime's and the policy's), through
//! `/proc/INIT/root`. Rootless: the directories of the sandbox's `PATH`
//! and the tops of the same mounts. Writable mounts are not watched: a
//! program there is never proposed (`allow_exec` makes them `noexec`).

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use mcpbox_sandbox::exec_watch::{path_dirs, ExecDir, ExecWatch};
use mcpbox_sandbox::Spec;

/// Most distinct programs kept; past it the list is cut (and said so).
pub const MAX_PROGRAMS: usize = 256;

/// What the session's watches saw.
#[derive(Debug, Default, Clone)]
pub struct Seen {
    /// Each program (sandbox path) and the Unix time in ms it was first seen.
    pub programs: BTreeMap<String, i64>,
    /// Programs or events were lost (a bound, the kernel's queue).
    pub cut: bool,
    /// How the sandboxes were watched: `mounts` (as root) or `dirs`
    /// (rootless); `None` when no watch was placed.
    pub mode: Option<&'static str>,
    /// Why a watch could not be placed, when one could not.
    pub refused: Option<String>,
    /// The sandbox directories the rootless watch marks.
    pub dirs: Vec<String>,
}

/// The session's log and its draining threads.
#[derive(Debug, Default)]
pub struct Log {
    seen: Mutex<Seen>,
    stop: AtomicBool,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

static LOG: OnceLock<Arc<Log>> = OnceLock::new();

/// Turns the watch on for this process (`learn` only).
pub fn enable() -> Arc<Log> {
    LOG.get_or_init(|| Arc::new(Log::default())).clone()
}

impl Log {
    /// Stops the threads once they drained what is queued (the sandbox
    /// has ended), and returns what was seen.
    pub fn finish(&self) -> Seen {
        self.stop.store(true, Ordering::SeqCst);
        let threads: Vec<_> = self
            .threads
            .lock()
            .map(|mut t| t.drain(..).collect())
            .unwrap_or_default();
        for t in threads {
            let _ = t.join();
        }
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }

    fn with(&self, f: impl FnOnce(&mut Seen)) {
        if let Ok(mut s) = self.seen.lock() {
            f(&mut s);
        }
    }
}

/// The host path of a sandbox path, through the spec's mounts (system
/// directories and the runtime's are at the same path).
pub fn host_of(spec: &Spec, at: &Path) -> PathBuf {
    let mut best: Option<(&Path, &Path)> = None;
    let ws = [
        (Path::new("/workspace/input"), spec.input.as_deref()),
        (Path::new("/workspace/output"), spec.output.as_deref()),
    ];
    let mounts = spec
        .mounts
        .iter()
        .map(|m| (m.at.as_path(), Some(m.host.as_path())));
    for (sandbox, host) in ws.into_iter().chain(mounts) {
        let Some(host) = host else { continue };
        if at.starts_with(sandbox)
            && best.is_none_or(|(b, _)| sandbox.as_os_str().len() > b.as_os_str().len())
        {
            best = Some((sandbox, host));
        }
    }
    match best {
        Some((sandbox, host)) => match at.strip_prefix(sandbox) {
            Ok(rest) if rest.as_os_str().is_empty() => host.to_path_buf(),
            Ok(rest) => host.join(rest),
            Err(_) => at.to_path_buf(),
        },
        None => at.to_path_buf(),
    }
}

fn path_var(spec: &Spec) -> Option<&OsStr> {
    spec.env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_os_str())
}

/// A command name as the sandbox resolves it: absolute as it is, else the
/// first `PATH` directory holding a file of that name.
fn resolve(spec: &Spec, name: &OsStr) -> Option<PathBuf> {
    let p = Path::new(name);
    if p.is_absolute() {
        return Some(p.to_path_buf());
    }
    if name.as_encoded_bytes().contains(&b'/') {
        return None;
    }
    path_dirs(path_var(spec)?)
        .into_iter()
        .map(|d| d.join(p))
        .find(|c| host_of(spec, c).is_file())
}

/// The server's own program (its first word as the sandbox resolves it)
/// and its `#!` interpreter (through `env NAME`, the program `env` runs):
/// they start before any watch is placed, so they are added, not seen.
/// The dynamic loader is left out (the sandbox allows it to every listed
/// program).
pub fn own_programs(spec: &Spec) -> Vec<String> {
    let mut out = Vec::new();
    let Some(first) = spec.argv.first() else {
        return out;
    };
    let Some(program) = resolve(spec, first) else {
        return out;
    };
    out.push(program.to_string_lossy().into_owned());
    if let Some(mcpbox_sandbox::Interpreter::Script { path, args }) =
        mcpbox_sandbox::interpreter(&host_of(spec, &program))
    {
        out.push(path.to_string_lossy().into_owned());
        let is_env = path.file_name() == Some(OsStr::new("env"));
        if let Some(word) = args
            .first()
            .filter(|w| is_env && !w.as_encoded_bytes().starts_with(b"-"))
        {
            if let Some(p) = resolve(spec, word) {
                out.push(p.to_string_lossy().into_owned());
            }
        }
    }
    out
}

/// The sandbox directories of read-only mounts that hold programs.
fn program_mounts(spec: &Spec) -> Vec<PathBuf> {
    let mut at: Vec<PathBuf> = mcpbox_sandbox::plan::SYSTEM_DIRS
        .iter()
        .filter(|d| std::fs::symlink_metadata(d).is_ok_and(|m| m.is_dir()))
        .map(PathBuf::from)
        .collect();
    if spec.input.is_some() {
        at.push("/workspace/input".into());
    }
    at.extend(
        spec.mounts
            .iter()
            .filter(|m| !m.writable)
            .map(|m| m.at.clone()),
    );
    at
}

/// Places the watch on a sandbox just started (its init `init`) and a
/// thread draining it into the session's log, when `learn` enabled it.
pub fn watch(spec: &Spec, init: libc::pid_t) {
    let Some(log) = LOG.get().cloned() else {
        return;
    };
    if init <= 0 {
        log.with(|s| {
            s.refused.get_or_insert_with(|| {
                "the sandbox has no mounts of its own (degraded tier)".into()
            });
        });
        return;
    }
    let mounts = program_mounts(spec);
    let mut refusal = None;
    let mut watch = None;
    if mcpbox_sandbox::is_host_root() {
        let root = PathBuf::from(format!("/proc/{init}/root"));
        let paths: Vec<PathBuf> = mounts
            .iter()
            .map(|at| root.join(at.strip_prefix("/").unwrap_or(at)))
            .collect();
        match ExecWatch::on_mounts(&paths) {
            Ok(w) => watch = Some(w),
            Err(e) => refusal = Some(format!("the watch was refused: {e}")),
        }
    }
    let mut dirs_named = Vec::new();
    if watch.is_none() {
        let mut dirs: Vec<PathBuf> = path_var(spec).map(path_dirs).unwrap_or_default();
        dirs.extend(mounts);
        let mut list = Vec::new();
        for d in dirs {
            if !list.iter().any(|e: &ExecDir| e.sandbox == d) {
                list.push(ExecDir {
                    host: host_of(spec, &d),
                    sandbox: d,
                });
            }
        }
        match ExecWatch::on_dirs(&list) {
            Ok(w) => {
                let skipped = w.skipped();
                dirs_named = list
                    .iter()
                    .filter(|d| !skipped.contains(&d.sandbox))
                    .take(mcpbox_sandbox::exec_watch::MAX_DIRS)
                    .map(|d| d.sandbox.to_string_lossy().into_owned())
                    .collect();
                refusal = None;
                watch = Some(w)
            }
            Err(e) => {
                refusal.get_or_insert(format!("the watch was refused: {e}"));
            }
        }
    }
    let Some(w) = watch else {
        let why = refusal.unwrap_or_else(|| "the watch was refused".into());
        tracing::warn!("programs started are not observed: {why}");
        log.with(|s| {
            s.refused.get_or_insert(why);
        });
        return;
    };
    let mode = if w.on_whole_mounts() {
        "mounts"
    } else {
        "dirs"
    };
    let unwatched = w.unwatched() > 0;
    log.with(|s| {
        // a restart watched another way: the weaker one holds
        if s.mode != Some("dirs") {
            s.mode = Some(mode);
        }
        s.cut |= unwatched;
        for d in dirs_named {
            if !s.dirs.contains(&d) {
                s.dirs.push(d);
            }
        }
    });
    let drainer = log.clone();
    let thread = std::thread::Builder::new()
        .name("mcpbox-execs".into())
        .spawn(move || drain_until_stopped(&w, &drainer));
    match thread {
        Ok(t) => {
            if let Ok(mut ts) = log.threads.lock() {
                ts.push(t);
            }
        }
        Err(e) => log.with(|s| {
            s.refused
                .get_or_insert(format!("the watch's thread could not start: {e}"));
        }),
    }
}

fn drain_until_stopped(w: &ExecWatch, log: &Log) {
    loop {
        let stopping = log.stop.load(Ordering::SeqCst);
        if w.wait(if stopping { 0 } else { 200 }).is_err() {
            log.with(|s| s.cut = true);
            return;
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let mut got = Vec::new();
        let lost = w.drain(|p| got.push(p));
        log.with(|s| {
            s.cut |= lost;
            for p in got {
                let p = p.to_string_lossy().into_owned();
                if s.programs.contains_key(&p) {
                    continue;
                }
                if s.programs.len() >= MAX_PROGRAMS {
                    s.cut = true;
                    continue;
                }
                s.programs.insert(p, now);
            }
        });
        if stopping {
            return;
        }
    }
}
